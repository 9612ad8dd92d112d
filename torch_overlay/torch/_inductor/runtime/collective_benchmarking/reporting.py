"""What a collective autotuning decision says about itself, in the tools people read.

Each decision is reported on every rank of its group as one structured
payload, which names the op and its tuning key, the group (name, size,
global ranks), each candidate's status per rank, agreed time, paired
comparison with the default and why it won or lost (:func:`explain`), the
session's noise floor, the winner, the rule that chose it
(:class:`DecisionRule`) and how this compile came by it
(:class:`DecisionSource`).  It is shown in two places:

* the artifact ``collective_autotuning_decision``, through
  ``trace_structured``: with ``TORCH_TRACE`` set, tlparse lists it under the
  compile that made it;
* a table in the ``collective_autotuning`` TORCH_LOGS artifact.

Decisions taken without benchmarking (remembered, adopted from a peer, a
cached program's, agreed at its replay, or the default that deterministic
mode takes) are reported too, saying so: a trace shows every collective
choice of a compile, not only the ones it measured.
"""

from __future__ import annotations

import collections
import enum
import functools
import json
import logging
import math
from typing import Any, TYPE_CHECKING

import torch.distributed as dist
from torch._logging import trace_structured

from .decisions import (
    CandidateResult,
    CandidateStatus,
    CollectiveDecision,
    worth_storing,
)
from .groups import warn_from_group_rank0
from .rules import compare_with_default, every_candidate_wrong, tuned_nothing


if TYPE_CHECKING:
    from collections.abc import Sequence

    from .rules import PairedComparison
    from .types import Member, OpToTune


__all__ = [
    "ARTIFACT_NAME",
    "DecisionSource",
    "explain",
    "publish",
    "report_decision",
    "say_once",
    "untuned_warning",
    "warn_untuned",
]

# The name tlparse lists the artifact under (``<name>_<n>.json`` in a compile's folder).
ARTIFACT_NAME = "collective_autotuning_decision"


class DecisionSource(enum.Enum):
    """How a compile came by a decision; its value is the name reports give it."""

    BENCHMARKED = "benchmarked"  # by this session's group
    REMEMBERED = "remembered"  # this rank remembered it; every rank adopted it
    ADOPTED = "adopted from a peer"  # another rank remembered it
    CACHE_HIT = "cache hit"  # a cached program's, confirmed at its replay
    REPLAYED = "agreed at a cached program's replay"  # this rank compiles anew
    UNTIMED = "taken without a session"  # deterministic mode: nothing timed


def untuned_warning(
    op: str,
    decision: CollectiveDecision,
    notes: Sequence[str],
    has_default: bool,
    benchmarked: bool,
) -> str | None:
    """What a decision that no user wants says, in the words of the trace; else None.

    Such a decision tuned nothing (its default had no result, or nothing
    qualified), or kept the op's own code because every implementation
    computed something else.  A decision taken from memory was said when
    it was benchmarked, but one that tuned nothing for want of a default
    is never stored, and is said again by each process.
    """
    where = f"collective autotuning of {op} over group {decision.group_name!r}"
    if tuned_nothing(decision) and (benchmarked or not worth_storing(decision)):
        each = "; ".join(
            f"{result.name}: {note}"
            for result, note in zip(decision.results, notes, strict=True)
        )
        return f"{where} tuned nothing: {decision.reason}. Each candidate: {each}"
    if benchmarked and every_candidate_wrong(decision, has_default):
        wrong = "; ".join(
            f"{result.name} on ranks {_ranks_with(result, CandidateStatus.WRONG_RESULT)}"
            for result in decision.results[1:]
        )
        return (
            f"{where}: every registered implementation was disqualified for a "
            f"wrong result (by group rank: {wrong}). Their first output differs "
            "from the op's own code, which is the reference they are screened "
            "against, so the program runs the op's own code; register them with "
            "include_fallback=False if they are not meant to compute what it "
            "computes"
        )
    return None


# What say_once said in this process: (group name, op), the latest
# _SAID_LIMIT of them: a job that tunes ever new ops may hear an old one again.
_said: collections.OrderedDict[tuple[str, str], None] = collections.OrderedDict()
_SAID_LIMIT = 1024


def say_once(
    logger: logging.Logger,
    group_rank: int,
    key: tuple[str, str],
    message: str,
    strict: bool,
) -> None:
    """Warn ``message`` on the group's rank 0, once per ``key`` and process.

    Nothing under ``strict``, whose error says it every time instead.
    """
    if strict or key in _said:
        return
    _said[key] = None
    while len(_said) > _SAID_LIMIT:
        _said.popitem(last=False)
    warn_from_group_rank0(
        logger,
        group_rank,
        "%s. Set torch._inductor.config.collective_benchmark_strict to make this "
        "an error.",
        message,
    )


def warn_untuned(
    member: Member,
    op: OpToTune,
    decision: CollectiveDecision,
    notes: Sequence[str],
    has_default: bool,
    source: DecisionSource,
    logger: logging.Logger,
) -> str | None:
    """Why ``op`` tuned nothing (:func:`untuned_warning`), or None.

    Said once per op and process by the group's rank 0, on ``logger``
    (:func:`say_once`); under the config's strict, every member raises it
    instead.
    """
    message = untuned_warning(
        op.key,
        decision,
        notes,
        has_default=has_default,
        benchmarked=source is DecisionSource.BENCHMARKED,
    )
    if message is not None:
        key = (member.group_name, op.memo_key or op.key)
        say_once(logger, member.rank, key, message, member.config.strict)
    return message


def explain(
    decision: CollectiveDecision, default: str | None, confidence: float
) -> list[str]:
    """Why each candidate of ``decision`` won or lost, in ``decision.results`` order.

    ``default`` names the op's default candidate (``None``: it has none).
    Every other qualified candidate is compared with it run by run, as
    :func:`~.rules.beats_default` compares them (``confidence`` is the
    session's).  A pure function of agreed data: the same on every rank.
    """
    notes = []
    compared = _paired(decision, default)
    for result, paired in zip(decision.results, compared, strict=True):
        if result.status is not CandidateStatus.OK:
            ranks = _ranks_with(result, result.status)
            where = f" in {result.stage}" if result.stage else ""
            notes.append(
                f"disqualified: {result.status.description} on "
                f"rank{'s' if len(ranks) > 1 else ''} "
                f"{', '.join(map(str, ranks))}{where}"
            )
        elif result.name == default:
            notes.append("the default")
        elif paired is None:
            notes.append("no default to beat")
        else:
            runs = f"{paired.wins}/{paired.runs} paired runs"
            if paired.advantage <= 0:
                notes.append(
                    f"slower: {-paired.advantage:.1%} at the median, faster in {runs}"
                )
            elif paired.p_value > 1.0 - confidence:
                notes.append(
                    f"not significant: faster in {runs}, p={paired.p_value:.2g}"
                )
            elif paired.advantage <= decision.noise_floor:
                notes.append(
                    f"within the noise floor: {paired.advantage:.1%} faster at the "
                    f"median, floor {decision.noise_floor:.1%}"
                )
            else:
                notes.append(f"faster in {runs}, p={paired.p_value:.2g}")
    return notes


def publish(
    decision: CollectiveDecision,
    op: str,
    *,
    header: str,
    logger: logging.Logger,
    tuning_key: str | None,
    ranks: Sequence[int],
    source: DecisionSource,
    default: str | None,
    notes: Sequence[str],
) -> None:
    """Put ``decision`` for ``op`` into the trace (``TORCH_TRACE``) and, as a
    table headed ``header``, into ``logger``'s DEBUG log (TORCH_LOGS).

    Called on every rank of the group with the same decision; ``ranks`` are
    the group's global ranks, ``default`` names the op's default candidate
    (``None`` when it has none), ``notes`` are :func:`explain`'s.  The
    payload is only built when a trace is written or the log is on.
    """

    @functools.cache
    def payload() -> dict[str, Any]:
        compared = _paired(decision, default)
        return {
            "op": op,
            "tuning_key": tuning_key,
            "group": {
                "name": decision.group_name,
                "size": len(ranks),
                "ranks": list(ranks),
            },
            "default": default,
            "winner": decision.winner,
            "rule": decision.rule.value,
            "source": source.value,
            "reason": decision.reason,
            "noise_floor": decision.noise_floor,
            "timer": decision.timer or None,
            "candidates": [
                _candidate_payload(result, note, paired)
                for result, note, paired in zip(
                    decision.results, notes, compared, strict=True
                )
            ],
        }

    trace_structured(
        "artifact",
        metadata_fn=lambda: {"name": ARTIFACT_NAME, "encoding": "json"},
        payload_fn=lambda: json.dumps(payload()),
    )
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(_table(header, payload()))


def report_decision(
    member: Member,
    op: OpToTune,
    decision: CollectiveDecision,
    source: DecisionSource,
    logger: logging.Logger,
) -> list[str]:
    """:func:`publish` ``decision`` for ``op``, as ``member`` of its group took it.

    Returns why each candidate won or lost (:func:`explain`).
    """
    config = member.config
    default = next((c.name for c in op.candidates if c.is_default), None)
    notes = explain(decision, default, config.confidence)
    publish(
        decision,
        op.key,
        header=(
            f"collective autotuning of {op.key} over group {decision.group_name!r} "
            f"({member.size} ranks, {config.nruns} timed runs, timeout "
            f"{config.timeout.total_seconds():g}s), on rank {member.rank}"
        ),
        logger=logger,
        tuning_key=op.memo_key,
        ranks=dist.get_process_group_ranks(member.group),
        source=source,
        default=default,
        notes=notes,
    )
    return notes


def _table(header: str, payload: dict[str, Any]) -> str:
    # The payload as a table: a line per candidate, with why it won or lost.
    timer = f" ({payload['timer']})" if payload["timer"] else ""
    lines = [
        f"{header}: winner {payload['winner']} ({payload['reason']}); "
        f"rule: {payload['rule']}; {payload['source']}{timer}",
        f"  {'candidate':<40} {'agreed time':<40} {'why':<56} attempts and per rank",
    ]
    for entry in payload["candidates"]:
        per_rank = "  ".join(
            f"r{rank}:{status}" + ("" if median is None else f" {median:.4f}ms")
            for rank, (status, median) in enumerate(
                zip(entry["status_per_rank"], entry["median_ms_per_rank"], strict=True)
            )
        )
        # Where and why a disqualified candidate failed is its note's to say.
        time_ms = entry["time_ms"]
        verdict = (
            "disqualified"
            if entry["status"] != "ok"
            else "untimed"
            if time_ms is None
            else f"{time_ms:.4f} ms"
        )
        lines.append(
            f"  {entry['name']:<40} {verdict:<40} {entry['why']:<56} "
            f"attempts={entry['attempts']}  {per_rank}"
        )
    return "\n".join(lines)


def _reference(
    decision: CollectiveDecision, default: str | None
) -> CandidateResult | None:
    # The default's result, when it completed: what the others are paired with.
    return next(
        (
            result
            for result in decision.results
            if result.name == default and result.status is CandidateStatus.OK
        ),
        None,
    )


def _paired(
    decision: CollectiveDecision, default: str | None
) -> list[PairedComparison | None]:
    # Each candidate against the default, run by run, in decision.results
    # order: None for the default itself, and where either has no result.
    reference = _reference(decision, default)
    return [
        compare_with_default(result, reference)
        if reference is not None
        and result is not reference
        and result.status is CandidateStatus.OK
        else None
        for result in decision.results
    ]


def _ranks_with(result: CandidateResult, status: CandidateStatus) -> list[int]:
    return [
        rank for rank, report in enumerate(result.reports) if report.status is status
    ]


def _finite(value: float) -> float | None:
    # JSON has no infinity: a candidate without a time has none.
    return value if math.isfinite(value) else None


def _candidate_payload(
    result: CandidateResult, note: str, comparison: PairedComparison | None
) -> dict[str, object]:
    entry: dict[str, object] = {
        "name": result.name,
        "status": result.status.name.lower(),
        "status_per_rank": [report.status.name.lower() for report in result.reports],
        "time_ms": _finite(result.time_ms),
        "median_ms_per_rank": [_finite(report.median_ms) for report in result.reports],
        "attempts": result.attempts,
        "why": note,
    }
    # Against the default, for each other candidate that both completed.
    if comparison is not None:
        entry.update(
            wins_against_default=comparison.wins,
            paired_runs=comparison.runs,
            p_value=comparison.p_value,
            median_advantage=comparison.advantage,
        )
    return entry
