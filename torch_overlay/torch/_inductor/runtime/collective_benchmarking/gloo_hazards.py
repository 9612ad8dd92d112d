"""Candidates that could crash a gloo process, disqualified before they run.

Fork only: workarounds for bugs in gloo, carried by patches that are not
meant for upstream (``Forwarded: not-needed``), each with its report in
``docs/upstream/``; a rebase onto a release with the fix drops them.  A
crash is no exception, so no failure rule can disqualify the candidate that
causes it: it must not run.  Every member of a group decides alike: what a
candidate calls is read from its graph (the join compared its signature),
the backend is the group's, and ``allow_gloo_overlap`` is in the join's
digest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .decisions import CandidateResult, CandidateStatus, RankReport
from .groups import warn_from_group_rank0
from .known_crashes import known_crash


if TYPE_CHECKING:
    import logging
    from collections.abc import Sequence

    import torch

    from .channels import BenchmarkChannel
    from .types import Candidate, CollectiveBenchmarkConfig


__all__ = ["disqualified_before_running"]


def disqualified_before_running(
    config: CollectiveBenchmarkConfig,
    device: torch.device,
    channel: BenchmarkChannel,
    plans: Sequence[tuple[str, Sequence[Candidate]]],
    excluded: dict[tuple[int, int], CandidateResult],
    log: logging.Logger,
) -> dict[tuple[int, int], CandidateResult]:
    """The candidates of ``plans`` that could crash this process, and their results.

    Every member of ``channel``'s group calls it alike, when a session is
    built; it runs nothing and needs no collective.  Each (op, candidate)
    position returned is out on every member (``UNSAFE``, the reason in its
    stage), and the group's rank 0 warns on ``log`` (the session's).
    Positions in ``excluded`` are already out and are not looked at.
    """
    unsafe: dict[tuple[int, int], CandidateResult] = {}
    for op, (_, candidates) in enumerate(plans):
        for index, candidate in enumerate(candidates):
            if (op, index) in excluded:
                continue
            reason = _hazard(config, device, channel.backend, candidate)
            if reason is None:
                continue
            unsafe[(op, index)] = CandidateResult(
                candidate.name,
                (RankReport(CandidateStatus.UNSAFE),) * channel.group.size(),
                stage=f"screening: {reason}",
            )
            warn_from_group_rank0(
                log,
                channel.group.rank(),
                "collective autotuning: %s is disqualified on every rank of "
                "group %r: %s",
                candidate.name,
                channel.group.group_name,
                reason,
            )
    return unsafe


def _hazard(
    config: CollectiveBenchmarkConfig,
    device: torch.device,
    backend: str | None,
    candidate: Candidate,
) -> str | None:
    crash = known_crash(backend, device.type, candidate.collectives)
    if crash is not None:
        op, entry = crash
        return entry.reason(op)
    # See docs/modules.md, "Memory safety on gloo".
    if backend == "gloo" and not config.allow_gloo_overlap and candidate.in_flight > 1:
        return (
            f"{candidate.in_flight} collectives in flight on gloo (two gloo "
            "works that finish together can corrupt the heap: "
            "ProcessGroupGloo::runLoop stores the finished work's name into a "
            "status string shared by its worker threads without a lock); set "
            "torch._inductor.config.collective_benchmark_allow_gloo_overlap "
            "to let it compete"
        )
    return None
