"""Benchmark channels: private process groups that candidates run their collectives on.

Candidates never run on the user's process group while they can fail.  Each
group that tunes gets a *benchmark channel*: a process group over the same
ranks, built on a fresh prefix of the job's store and registered under the
group's name while candidates run (:func:`registered_as`), so that their
functional collectives, which resolve their group by name, run on it.

Why a channel that failed is dropped, never reused: neither backend can take
part in another collective after one did not complete.

* gloo: a rank that times out closes its connections to the late peer (the
  late peer then fails with "Connection closed by peer"), and a rank that
  skipped a collective leaves its peers' tags out of step; the channel is
  dead either way.  Dropping a gloo group closes its sockets, which is how a
  failing rank wakes its peers within milliseconds.
* NCCL: a collective that does not complete leaves a kernel spinning on the
  device; the communicator must be aborted (``ncclCommAbort``) and rebuilt.
  The channel's own timeout is twice the benchmark timeout so that the
  protocol aborts first and the NCCL watchdog does not tear the process
  down.

A gloo channel has gloo's two worker threads, as the job's groups have: with
one, a small collective took 2 to 4 times as long here (two ranks, 240
floats), which would time candidates on another footing than the program.
Two threads can run two collectives of the group at once, which is unsafe on
gloo (see "Memory safety on gloo" in ``benchmarker.py``): a
candidate that keeps several in flight never runs on a gloo channel unless
``collective_benchmark_allow_gloo_overlap`` is set, and the protocol issues
its own collectives one at a time.

A gloo channel connects its ranks while it is built; once every member has
built it, the last one deletes the rendezvous keys it used from the store
(an NCCL channel connects at its first collective and keeps them).

Why not ``dist.new_group`` or ``dist.split_group`` (torch 2.15), which build
and register a group, and give it ``abort()`` and ``shutdown()``:

* both name the group through ``_process_group_name``, which advances
  ``_world.group_count`` on the calling ranks only.  The ranks of a group
  that tunes would name the groups the program creates afterwards
  differently from the ranks that do not tune (other groups, or a cache
  hit), and a group's name is in the program's cache keys;
* ``split_group`` is a collective on the user's group (its backend's
  ``split_group``), which can block on a peer that died after the join;
  the store rendezvous below is bounded by the protocol's timeout;
* a group in ``_world`` is the user's to enumerate and destroy
  (``destroy_process_group()`` walks them all); a channel is private to
  the protocol, which drops it when a collective on it fails.

So a channel is constructed from ``ProcessGroupGloo`` / ``ProcessGroupNCCL``
directly, as ``_new_process_group_helper`` constructs them, and dropped as
``destroy_process_group`` would (an NCCL channel is aborted).

Collectives an implementation issues through a ``ProcessGroup`` object it
captured (rather than through a group name) run on that group, not on the
channel: the protocol cannot fail them by dropping the channel (see the
liveness rules in ``control.py``).
"""

from __future__ import annotations

import atexit
import dataclasses
import time
from contextlib import contextmanager
from typing import Any, TYPE_CHECKING

import torch
import torch.distributed as dist
from torch._dynamo.utils import counters

from .store import (
    CollectiveBenchmarkError,
    CollectiveBenchmarkTimeout,
    main_store_client,
    STORE_PREFIX,
)


if TYPE_CHECKING:
    from collections.abc import Iterator
    from datetime import timedelta


__all__ = ["BenchmarkChannel", "build_channel", "registered_as"]


class _RecordingStore(dist.Store):
    """A store that remembers every key a process group asked it about."""

    def __init__(self, inner: dist.Store) -> None:
        super().__init__()
        self.inner = inner
        self.keys: set[str] = set()

    def set(self, key: str, value: Any) -> None:
        self.keys.add(key)
        self.inner.set(key, value)

    def get(self, key: str) -> bytes:
        self.keys.add(key)
        return self.inner.get(key)

    def add(self, key: str, value: int) -> int:
        self.keys.add(key)
        return self.inner.add(key, value)

    def compare_set(self, key: str, expected_value: Any, desired_value: Any) -> bytes:
        self.keys.add(key)
        return self.inner.compare_set(key, expected_value, desired_value)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self.keys.update(keys)
        if timeout is None:
            self.inner.wait(keys)
        else:
            self.inner.wait(keys, timeout)

    def check(self, keys: list[str]) -> bool:
        self.keys.update(keys)
        return self.inner.check(keys)

    def delete_key(self, key: str) -> bool:
        return self.inner.delete_key(key)

    def num_keys(self) -> int:
        return self.inner.num_keys()

    def set_timeout(self, timeout: timedelta) -> None:
        self.inner.set_timeout(timeout)


def build_channel(
    group: dist.ProcessGroup, prefix: str, timeout: timedelta
) -> dist.ProcessGroup:
    """A private process group over ``group``'s ranks, on a fresh ``prefix`` of the default store.

    Every member of ``group`` must call it with the same ``prefix``.  Raises
    what the backend raises when the ranks cannot connect.
    """
    root = dist.distributed_c10d._get_default_store()
    recording = _RecordingStore(dist.PrefixStore(prefix, root))
    rank, size = group.rank(), group.size()
    channel = dist.ProcessGroup(recording, rank, size)
    backend = dist.get_backend(group)
    impl: dist.ProcessGroupNCCL | dist.ProcessGroupGloo
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = 2 * timeout  # the protocol aborts first
        impl = dist.ProcessGroupNCCL(
            dist.PrefixStore("cuda/", recording), rank, size, options
        )
        device, backend_type = torch.device("cuda"), dist.ProcessGroup.BackendType.NCCL
    elif backend == "gloo":
        impl = dist.ProcessGroupGloo(
            dist.PrefixStore("cpu/", recording), rank, size, timeout
        )
        device, backend_type = torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO
    else:
        raise CollectiveBenchmarkError(
            f"collective autotuning supports gloo and nccl groups, not {backend!r}"
        )
    channel._register_backend(device, backend_type, impl)
    channel._set_default_backend(backend_type)
    channel._set_group_name(
        dist.distributed_c10d.GroupName(f"{group.group_name}:benchmark")
    )
    if backend == "gloo":
        # Connected: the member that finishes last removes what they used
        # (under the names PrefixStore gives them: prefix, "/", key).
        client = main_store_client()
        if client.add(f"{prefix}/built", 1) == size:
            for key in [*sorted(recording.keys), "built"]:
                client.delete(f"{prefix}/{key}")
    return channel


@contextmanager
def registered_as(name: str, group: dist.ProcessGroup) -> Iterator[None]:
    """Point the process-group name ``name`` at ``group`` for the duration, then restore it.

    Functional collectives resolve their group by name at run time, so the
    candidates' collectives run on ``group`` (a benchmark channel).
    """
    # The candidates are compiled naming the user's group, as the program
    # will run them; re-tracing them for a channel's own name would time
    # other code than the program's.  c10d has no public API to re-point a
    # name, hence its private registry.
    from torch._C._distributed_c10d import (
        _register_process_group,
        _resolve_process_group,
        _unregister_process_group,
    )

    group_name = dist.distributed_c10d.GroupName(name)
    original = _resolve_process_group(group_name)
    _unregister_process_group(group_name)
    _register_process_group(group_name, group)
    try:
        yield
    finally:
        _unregister_process_group(group_name)
        _register_process_group(group_name, original)


@dataclasses.dataclass
class _GroupState:
    """What the protocol keeps per process group between sessions.

    The counters advance at the same protocol steps on every member, so they
    name the same store keys everywhere.
    """

    sessions: int = 0
    channels: int = 0
    channel: dist.ProcessGroup | None = None
    channel_timeout: timedelta | None = None
    # The group the channel mirrors: a group re-created under the same name
    # (destroy_process_group, then init again) must not reuse the old channel.
    group: dist.ProcessGroup | None = None


_group_states: dict[str, _GroupState] = {}


def _group_state(group: dist.ProcessGroup) -> _GroupState:
    state = _group_states.setdefault(group.group_name, _GroupState())
    if state.group is not group:
        state.group, state.channel = group, None
    return state


@atexit.register
def _release_channels() -> None:
    # Benchmark channels are process groups that destroy_process_group() does
    # not know about.  Release them while the interpreter is still alive: a
    # gloo worker thread that drops a tensor during interpreter finalization
    # needs the GIL and aborts the process (pytorch/pytorch#190489).
    _group_states.clear()


class BenchmarkChannel:
    """The benchmark channel of one process group, kept across its sessions.

    Every member of ``group`` must make the same calls in the same order:
    :meth:`get` builds the channel when there is none, :meth:`drop` discards
    it (after a failure; the next :meth:`get` builds a new one).
    """

    def __init__(
        self, group: dist.ProcessGroup, device: torch.device, timeout: timedelta
    ) -> None:
        self.group = group
        self.device = device
        self.timeout = timeout
        self.backend = dist.get_backend(group)
        self._state = _group_state(group)

    def next_session(self) -> int:
        """A number for the group's next session, the same on every member."""
        self._state.sessions += 1
        return self._state.sessions

    def get(self) -> dist.ProcessGroup:
        """The channel, built (a store rendezvous of the members) when there is none."""
        state = self._state
        if state.channel is not None and state.channel_timeout != self.timeout:
            self.drop()  # every member sees the same timeout (it is in the join)
        if state.channel is None:
            state.channels += 1
            state.channel_timeout = self.timeout
            prefix = f"{STORE_PREFIX}/{self.group.group_name}/channel{state.channels}/"
            state.channel = build_channel(self.group, prefix, self.timeout)
        return state.channel

    def drop(self) -> None:
        """Discard the channel; a peer's pending collective on it fails at once.

        Returns once a gloo channel is destroyed: at once, or, when a
        collective of this rank is still pending on it (its wait timed out),
        when that collective ends, within the channel's own timeout.
        """
        # Dropping the last reference closes a gloo channel's sockets; NCCL
        # needs an abort.  ~ProcessGroupGloo first joins its worker threads,
        # and a worker that releases a finished work may need the GIL (to
        # free its tensors' Python objects).  The join runs without the GIL:
        # the reference dropped here is the Python object's, whose holder
        # (c10d's IntrusivePtrNoGilDestructor) releases the GIL first, so
        # the worker finishes and this rank's heartbeat goes on (measured
        # with scripts/repro_gloo_destroy_pending.py).
        channel, self._state.channel = self._state.channel, None
        if channel is not None and self.backend == "nccl":
            channel.abort()

    @contextmanager
    def registered(self) -> Iterator[dist.ProcessGroup]:
        """The channel, registered under the group's name for the duration."""
        channel = self.get()
        with registered_as(self.group.group_name, channel):
            yield channel

    def all_gather(self, values: list[float]) -> list[list[float]]:
        """Every member's ``values`` (equal lengths), in rank order, bounded by the timeout."""
        counters["collective_autotuning"]["sync_collectives"] += 1
        tensor = self._tensor(values)
        gathered = [torch.empty_like(tensor) for _ in range(self.group.size())]
        self._wait(self.get().allgather([gathered], [tensor]))
        _count_bytes(tensor.nbytes * (1 + len(gathered)))
        return [row.tolist() for row in gathered]

    def all_reduce_max(self, value: float) -> float:
        """The maximum of every member's ``value``, bounded by the timeout."""
        counters["collective_autotuning"]["sync_collectives"] += 1
        tensor = self._tensor([value])
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp.MAX
        self._wait(self.get().allreduce([tensor], options))
        _count_bytes(2 * tensor.nbytes)
        return float(tensor.item())

    def _tensor(self, values: list[float]) -> torch.Tensor:
        device = torch.device("cpu") if self.backend == "gloo" else self.device
        return torch.tensor(values, dtype=torch.float64, device=device)

    def _wait(self, work: dist.Work) -> None:
        started = time.monotonic()
        if work.wait(self.timeout) is False:
            raise CollectiveBenchmarkTimeout(
                "a benchmark collective did not complete within "
                f"{time.monotonic() - started:.1f}s"
            )


def _count_bytes(nbytes: int) -> None:
    # What this member sent and received in the protocol's own collectives
    # (the payload, not the backend's framing).
    counters["inductor"]["collective_autotuning_bytes_exchanged"] += nbytes
