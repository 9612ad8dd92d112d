"""Cached programs replayed through the sessions their compile took part in.

A program that Inductor's FX graph or AOTAutograd cache returns carries the
sessions its compile took part in (:class:`RecordedSession`, recorded by
:func:`recorded_sessions`).  Before it runs, its rank takes part in the same
sessions again (:func:`replay_sessions`) with the program's decisions, so
that a rank that misses the cache and compiles meets, in the same join,
every rank that hit it.  When the group agrees on the program's decisions it
runs; when it agrees on others (another member's decision was claimed), the
rank compiles the graph again and that compile adopts the agreed decisions
without meeting the group a second time.  Graphs whose compile tuned no
collective choice record no session and replay nothing: they pay no
exchange.

A rank on its way to a replay is waited for like any straggler: its
heartbeat (``collective_benchmarking/liveness.py``) starts when the cache key of a graph
that calls an op registered for autotuning is computed (``codecache``), so
the ranks that compile see it alive while it looks the program up, fetches
it from a remote cache and reloads its kernels.  Caches that a cluster
shares make that skew the normal case: a remote lookup that fails is a
miss on that rank alone, and another job may write an entry between two
ranks' lookups.  A stored decision that cannot be read (torn by a crash, or
by a writer on shared storage) is a miss, never an error.

A cached program serves the process groups it was compiled for and, when
its code depends on the rank, that rank only (:func:`serves_this_process`,
which the FX graph cache applies to every entry under a key before using
it).  The candidates are traced for their group's topology (a world size
read while tracing is a constant of the program) and may read the rank
(which slot or shard is this rank's).  The cache key covers the topology of
the groups the candidates can reach by name
(``custom_op_fingerprint.autotuning_process_groups``), not the rank, so that
one program serves every rank of a job; a program records the topology of
the groups its sessions ran on, and the rank it was compiled on when the
join found the candidates' traced code different between members.  The
ranks of a node sharing a cache directory then each find their own entry
under the key of a program whose code depends on the rank, and share the
entries of any other.
"""

from __future__ import annotations

from typing import Any, TYPE_CHECKING

import torch
import torch.distributed as dist
from torch._dynamo.utils import counters

from torch._inductor.runtime.collective_benchmarking.benchmarker import (
    CollectiveBenchmarker,
)
from torch._inductor.runtime.collective_benchmarking.decision_cache import (
    decision_digest,
    pre_agree,
)
from torch._inductor.runtime.collective_benchmarking.groups import (
    process_group_topology,
    resolve_group,
)
from torch._inductor.runtime.collective_benchmarking.types import Candidate, OpToTune

from .settings import benchmark_config


if TYPE_CHECKING:
    from collections.abc import Sequence

    from torch._inductor.runtime.collective_benchmarking.decision_cache import (
        RecordedSession,
    )
    from torch._inductor.runtime.collective_benchmarking.decisions import (
        CollectiveDecision,
    )


__all__ = ["replay_sessions", "serves_this_process"]


def serves_this_process(sessions: Sequence[RecordedSession]) -> bool:
    """Whether a cached program that took part in ``sessions`` may run in this process.

    True when every session's group exists here with the topology (name,
    size, global ranks) it had when the program was compiled, and the
    program was compiled on this global rank or serves every rank.  Local:
    no rank waits for another; every member of a group answers alike for
    the topology, and a program compiled for another rank is only passed
    over (the rank compiles its own, or finds it under the same key).
    """
    if not dist.is_available() or not dist.is_initialized():
        return False
    for session in sessions:
        if session.rank is not None and session.rank != dist.get_rank():
            return False
        try:
            group = resolve_group(session.group_name)
        except (KeyError, RuntimeError):
            return False  # the group does not exist in this job
        if process_group_topology(group) != session.topology:
            return False
    return True


def _never_run() -> Any:
    raise AssertionError("a replayed session does not run candidates")


def replay_sessions(sessions: Sequence[RecordedSession]) -> bool:
    """Take part, with a cached program's decisions, in the agreements its compile took part in.

    Every rank of each recorded session's group must reach the same session:
    the ranks that compile the program again reach it while compiling, the
    ranks that take it from a cache reach it here.  Returns True when every
    group agreed on the program's decisions (the cached program can run);
    False when a group agreed on other decisions (another member's): this
    rank must then compile the program again, and that compile adopts the
    agreed decisions without meeting its group again.  Raises
    ``CollectiveBenchmarkError`` as a session does.
    """
    config = benchmark_config()
    agreed: list[tuple[str, list[OpToTune], list[CollectiveDecision]]] = []
    consistent = True
    for session in sessions:
        ops = [
            OpToTune(
                key,
                [
                    Candidate(name, _never_run, is_default, signature=signature)
                    for name, is_default, signature in candidates
                ],
                memo_key,
            )
            for key, candidates, memo_key in session.ops
        ]
        benchmarker = CollectiveBenchmarker(
            session.group_name, config, torch.device(session.device_type)
        )
        decisions = benchmarker.run_batch(ops, known=session.decisions)
        consistent = consistent and all(
            decision_digest(mine) == decision_digest(group)
            for mine, group in zip(session.decisions, decisions, strict=True)
        )
        agreed.append((session.group_name, ops, decisions))
    if not consistent:
        for group_name, ops, decisions in agreed:
            for op, decision in zip(ops, decisions, strict=True):
                pre_agree(group_name, op.key, decision)
    counters["collective_autotuning"]["replayed_sessions"] += len(sessions)
    return consistent
