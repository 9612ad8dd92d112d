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
    registered_group,
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
    return all(
        (group := registered_group(session.group_name)) is not None
        and session.rank in (None, dist.get_rank())
        and process_group_topology(group) == session.topology
        for session in sessions
    )


def _never_run() -> Any:
    raise AssertionError("a replayed session does not run candidates")


def _replayed(name: str, is_default: bool, signature: str) -> Candidate:
    # A recorded candidate, as the join compares it: a replay runs none.
    return Candidate(name, _never_run, is_default, signature=signature)


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
    agreed: list[tuple[str, str, CollectiveDecision]] = []
    consistent = True
    for session in sessions:
        ops = [
            OpToTune(key, [_replayed(*candidate) for candidate in candidates], memo_key)
            for key, candidates, memo_key in session.ops
        ]
        decisions = CollectiveBenchmarker(
            session.group_name, config, torch.device(session.device_type)
        ).run_batch(ops, known=session.decisions)
        for op, mine, group in zip(ops, session.decisions, decisions, strict=True):
            consistent = consistent and decision_digest(mine) == decision_digest(group)
            agreed.append((session.group_name, op.key, group))
    if not consistent:
        for group_name, op_key, decision in agreed:
            pre_agree(group_name, op_key, decision)
    counters["collective_autotuning"]["replayed_sessions"] += len(sessions)
    return consistent
