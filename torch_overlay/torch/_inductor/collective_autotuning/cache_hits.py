"""Cached programs replayed through the sessions their compile took part in.

Before a cached program runs, its rank takes part again in the sessions its
compile recorded (:func:`replay_sessions`), so that a rank that misses the
cache meets every rank that hit it in the same join.  Which programs serve
which process: :func:`serves_this_process`.  The design:
``docs/modules.md``, "cache_hits.py".
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
