"""Each collective autotuning candidate compiled once per host, not once per rank.

Why
---
Every rank of a group that tunes an op compiles every one of its candidates
(lowering, code generation, the kernels' builds) before the session times
them: on a host of 8 ranks, the same work 8 times over, and nearly all that
collective autotuning adds to a compile.  The ranks of a host share
Inductor's cache directory (``/tmp/torchinductor_<user>`` by default), and a
candidate's compiled module is a file in it (``PyCodeCache``) that any
process can load, as upstream's subgraph benchmark requests do
(``SubgraphCPUBenchmarkRequest``).  So the ranks split the candidates: each
compiles some, publishes them there, and loads the others.

How
---
A candidate's *share key* digests what its code depends on: its graph and
input layouts (the choice's ``hash_key``), input dtypes and devices, output
layout and config patches, Inductor's config and torch's source
(``torch_key``), and whether the graph is an inference or backward one.
Ranks whose candidate has the same key would compile the same module.

In the candidate's ``prepare`` (see ``choices.compile_in_background``), a
rank takes the key's file lock without waiting.  The rank that gets it
compiles the candidate, and, once the module's kernels are built, writes the
module's cache key and path to ``<share key>.json`` (``write_atomic``) and
releases the lock.  A rank that finds the lock taken moves on to the next
candidate, and waits for that lock only in the candidate's ``finish``, after
its own share is prepared: the ranks split the candidates in the order they
reach them, without a message over the job's store.  A rank that finds the
record loads the module.  Finishing in prepare order cannot deadlock: a rank
releases each lock it holds before it waits for a later one.

No rank waits beyond the liveness rules, and every rank runs the same code:

* a publisher whose compile or kernel build raises releases the lock without
  a record: its ``prepare`` raises, which disqualifies the candidate on every
  rank (the session agrees on every rank's status), and a waiting rank
  compiles the candidate itself, and publishes it for the others;
* a publisher that dies releases the lock with its process (``flock``);
  a waiting rank compiles the candidate itself;
* a publisher alive but late is waited for up to
  ``collective_benchmark_max_wait``, the bound on a live member that is
  late; then the waiting rank compiles its own copy, without publishing it.

A record is a cache entry like the module it names: one that cannot be read,
or whose module does not load, is a miss, and the rank compiles.

What every rank compiles for itself
-----------------------------------
* A candidate whose graph differs between ranks (one that reads
  ``dist.get_rank()`` while traced): its key differs.
* A candidate with symbolic sizes: compiling it may add guards to the
  program's shape environment, which a rank that loaded it would lack.
* A graph with tensor constants (``get_attr``) or a module holding any: a
  module file does not carry them.
* cpp_wrapper and AOT compiles, whose modules are not plain Python modules.

``counters["collective_autotuning"]`` counts ``candidates_compiled`` (by this
rank) and ``candidates_loaded`` (compiled by another process), and
``compile_wait_s`` holds the seconds spent waiting for another's; each such
wait is a compile event, ``collective_autotuning.compile_wait``, naming the
candidate.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, TYPE_CHECKING

import torch
from filelock import Timeout
from torch._dynamo.utils import counters
from torch._inductor import config
from torch._inductor.codecache import PyCodeCache, torch_key, write_atomic
from torch._inductor.cpu_vec_isa import pick_vec_isa
from torch._inductor.runtime.collective_benchmarking.timing import timed
from torch._inductor.runtime.collective_benchmarking.types import digest
from torch._inductor.utils import has_free_symbols
from torch._inductor.virtualized import V
from torch.utils._filelock import FileLock

from .settings import candidate_compile_settings


if TYPE_CHECKING:
    from datetime import timedelta


__all__ = ["compile_here", "HostCompile", "share_key"]

log = logging.getLogger(__name__)

# Bumped when what a record holds, or what the key covers, changes.
_RECORD_FORMAT = 1


def share_key(choice: Any) -> str | None:
    """The key under which ``choice``'s compiled module is shared; ``None``: not shared.

    Local: read from the choice and the graph being compiled, equal on every
    rank whose choice would compile to the same module (see the module
    docstring for what it covers and what is never shared).  Must be called
    while the graph that holds ``choice`` is being compiled (``V.graph``).
    """
    gm = getattr(choice, "gm", None)
    graph = V.graph
    if (
        gm is None
        or getattr(choice, "sym_inputs", None)
        or graph.cpp_wrapper
        or graph.aot_mode
        or any(node.op == "get_attr" for node in gm.graph.nodes)
    ):
        return None
    inputs = []
    for node in choice.input_nodes:
        if has_free_symbols(node.get_size()) or has_free_symbols(node.get_stride()):
            return None
        inputs.append((str(node.get_dtype()), str(node.get_device())))
    parts = [
        str(_RECORD_FORMAT),
        choice.hash_key(),
        repr(inputs),
        str(choice.layout),
        repr(sorted(getattr(choice, "config_patches", {}).items())),
        repr((graph.is_inference, graph.is_backward)),
        repr(sorted(config.save_config_portable().items())),
        torch_key().hex(),
    ]
    return digest("\n".join(parts))


def compile_here(choice: Any) -> None:
    """Compile ``choice`` in this process, unless it holds a module already (counted).

    Under :func:`~.settings.candidate_compile_settings`: the compile issues
    no collective, whichever ranks compile which candidates.
    """
    if choice._compiled_module is None:
        counters["collective_autotuning"]["candidates_compiled"] += 1
        with candidate_compile_settings():
            choice._ensure_compiled()


class HostCompile:
    """The compilation of one candidate, shared by the processes of one cache directory.

    ``key`` is the candidate's :func:`share_key` (``None``: this rank
    compiles it alone); ``directory`` holds the published records and their
    locks; ``max_wait`` bounds the wait for another process's compile.
    :meth:`start` in the candidate's ``prepare`` (with kernel builds left
    running), :meth:`finish` once this rank's kernel builds are done, or
    :meth:`abandon` when they failed.  Every rank that benchmarks the
    candidate calls them, each on its own object.  After :meth:`finish`,
    the choice holds a compiled module (``choice._compiled_module``), the
    same code on every rank; :meth:`start` and :meth:`finish` raise what the
    compile raised on this rank.
    """

    def __init__(
        self, choice: Any, key: str | None, directory: str, max_wait: timedelta
    ) -> None:
        self.choice = choice
        self.max_wait = max_wait
        self.record = os.path.join(directory, f"{key}.json") if key else None
        self._held: FileLock | None = None  # ours to publish
        self._theirs = False  # another process holds the lock: wait in finish

    def start(self) -> None:
        """Compile the candidate, load it, or leave it to the process compiling it."""
        if self.choice._compiled_module is not None:
            return
        if self.record is None:
            compile_here(self.choice)
            return
        if self._load():
            return
        layout = getattr(self.choice, "layout", None)
        if layout is not None and layout.device.type == "cpu":
            # Inductor probes the CPU's vector ISA once per process, at the
            # first C++ kernel it generates (seconds: a build and a load per
            # ISA).  Probed before the split, as every rank would in its own
            # first compile: a rank left to wait for a peer's compile would
            # otherwise idle through the peer's probe, then run its own.
            pick_vec_isa()
        os.makedirs(os.path.dirname(self.record), exist_ok=True)
        lock = FileLock(f"{self.record}.lock")
        try:
            lock.acquire(blocking=False)
        except Timeout:  # filelock's word for "held by another process"
            self._theirs = True
            return
        try:
            if self._load():  # published between the look and the lock
                lock.release()
                return
            self._held = lock
            compile_here(self.choice)
        except BaseException:
            self.abandon()
            raise

    def finish(self) -> None:
        """Publish what :meth:`start` compiled, or wait for the rank that compiles it."""
        if self._held is not None:
            try:
                self._publish()
            finally:
                self.abandon()
        elif self._theirs and self.choice._compiled_module is None:
            self._wait_for_publisher()

    def abandon(self) -> None:
        """Release this rank's claim without publishing (its compile or builds failed)."""
        held, self._held = self._held, None
        if held is not None:
            held.release()

    def _load(self) -> bool:
        # True when the record names a module that loaded into the choice.
        assert self.record is not None
        try:
            with open(self.record) as f:
                published = json.load(f)
        except FileNotFoundError:
            return False
        except (OSError, ValueError):
            # write_atomic leaves no torn record; another writer might.
            log.warning(
                "collective autotuning: ignoring %s", self.record, exc_info=True
            )
            return False
        if not isinstance(published, dict) or published.get("format") != _RECORD_FORMAT:
            return False
        try:
            module = PyCodeCache.load_by_key_path(published["key"], published["path"])
        except Exception:
            log.warning(
                "collective autotuning: the compiled candidate %s named by %s did not "
                "load; compiling it again",
                self.choice.name,
                self.record,
                exc_info=True,
            )
            return False
        self.choice._compiled_module = module
        counters["collective_autotuning"]["candidates_loaded"] += 1
        return True

    def _publish(self) -> None:
        assert self.record is not None
        module = self.choice._compiled_module
        if any(
            isinstance(value, (torch.Tensor, torch.ScriptObject))
            for value in vars(module).values()
        ):
            return  # constants are attributes that the module's file lacks
        # Written under the key's lock, one writer at a time: write_atomic's
        # temporary name (process and thread id) cannot meet another's.
        write_atomic(
            self.record,
            json.dumps(
                {"format": _RECORD_FORMAT, "key": module.key, "path": module.__file__}
            ),
        )

    def _wait_for_publisher(self) -> None:
        assert self.record is not None
        lock = FileLock(f"{self.record}.lock")
        try:
            with timed("compile_wait", candidate=self.choice.name):
                lock.acquire(timeout=self.max_wait.total_seconds())
        except Timeout:
            log.warning(
                "collective autotuning: another process has been compiling %s for "
                "collective_benchmark_max_wait (%s); this rank compiles its own copy",
                self.choice.name,
                self.max_wait,
            )
            compile_here(self.choice)
            return
        self._held = lock
        try:
            if not self._load():
                # The publisher failed or died, or its module holds constants
                # (which are not published: the next rank compiles too).
                compile_here(self.choice)
                self._publish()
        finally:
            self.abandon()
