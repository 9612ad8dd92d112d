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
* a table of the same payload in the ``collective_autotuning`` TORCH_LOGS
  artifact.

Decisions taken without benchmarking (remembered, adopted from a peer, a
cached program's, agreed at its replay, or the default that deterministic
mode takes) are reported too, saying so: a trace shows every collective
choice of a compile, not only the ones it measured.  A decision that tuned
nothing is also a warning, said once (:func:`report_decision`).
"""

from __future__ import annotations

import collections
import enum
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

    from .types import Member, OpToTune


__all__ = [
    "ARTIFACT_NAME",
    "DecisionSource",
    "explain",
    "publish",
    "report_decision",
    "say_once",
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


def explain(
    decision: CollectiveDecision, default: str | None, confidence: float
) -> list[str]:
    """Why each candidate of ``decision`` won or lost, in ``decision.results`` order.

    ``default`` names the op's default candidate (``None``: it has none).
    Every other qualified candidate is compared with it run by run, as
    :func:`~.rules.beats_default` compares them (``confidence`` is the
    session's).  A pure function of agreed data: the same on every rank.
    """
    return [entry["why"] for entry in _candidates(decision, default, confidence)]


def publish(
    decision: CollectiveDecision,
    op: str,
    source: DecisionSource,
    *,
    default: str | None,
    candidates: Sequence[dict[str, Any]],
    ranks: Sequence[int],
    logger: logging.Logger,
    tuning_key: str | None = None,
    timeout_s: float | None = None,
) -> None:
    """Put ``decision`` for ``op`` into the trace (``TORCH_TRACE``) and, as a
    table, into ``logger``'s DEBUG log (TORCH_LOGS).

    Called on every rank of the group with the same decision; ``ranks`` are
    the group's global ranks, ``default`` names the op's default candidate
    (``None`` when it has none), ``candidates`` are the entries that
    :func:`report_decision` builds (none for a decision that timed nothing)
    and ``timeout_s`` the bound on each collective step of the session that
    took it.
    """
    payload = {
        "op": op,
        "tuning_key": tuning_key,
        "group": {"name": decision.group_name, "size": len(ranks), "ranks": [*ranks]},
        "default": default,
        "winner": decision.winner,
        "rule": decision.rule.value,
        "source": source.value,
        "reason": decision.reason,
        "noise_floor": decision.noise_floor,
        "timer": decision.timer or None,
        "timeout_s": timeout_s,
        "candidates": candidates,
    }
    trace_structured(
        "artifact",
        metadata_fn=lambda: {"name": ARTIFACT_NAME, "encoding": "json"},
        payload_fn=lambda: json.dumps(payload),
    )
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(_table(payload))


def report_decision(
    member: Member,
    op: OpToTune,
    decision: CollectiveDecision,
    source: DecisionSource,
    decision_log: logging.Logger,
    log: logging.Logger,
) -> str | None:
    """:func:`publish` ``decision`` for ``op`` on ``decision_log``, as ``member`` took it.

    Returns what a decision that no user wants says, in the words of the
    trace, or None.  Such a decision tuned nothing (its default had no
    result, or nothing qualified), or kept the op's own code because every
    implementation computed something else.  It is said once per op and
    process by the group's rank 0, on ``log`` (:func:`say_once`); under the
    config's strict, the caller raises it on every member instead.
    """
    default = next((c.name for c in op.candidates if c.is_default), None)
    candidates = _candidates(decision, default, member.config.confidence)
    publish(
        decision,
        op.key,
        source,
        default=default,
        candidates=candidates,
        ranks=dist.get_process_group_ranks(member.group),
        logger=decision_log,
        tuning_key=op.memo_key,
        timeout_s=member.config.timeout.total_seconds(),
    )
    # A decision taken from memory was said when it was benchmarked, but one
    # that tuned nothing for want of a default is never stored: each process
    # says it again.
    benchmarked = source is DecisionSource.BENCHMARKED
    if tuned_nothing(decision) and (benchmarked or not worth_storing(decision)):
        what = f"tuned nothing: {decision.reason}"
    elif benchmarked and every_candidate_wrong(decision, default is not None):
        what = (
            "kept the op's own code: every registered implementation was "
            "disqualified for a wrong result. Their first output differs from the "
            "op's own code, which is the reference they are screened against; "
            "register them with include_fallback=False if they are not meant to "
            "compute what it computes"
        )
    else:
        return None
    each = "; ".join(f"{entry['name']}: {entry['why']}" for entry in candidates)
    message = (
        f"collective autotuning of {op.key} over group {member.group_name!r} "
        f"{what}. Each candidate: {each}"
    )
    key = (member.group_name, op.memo_key or op.key)
    say_once(log, member.rank, key, message, member.config.strict)
    return message


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
    hint = "Set torch._inductor.config.collective_benchmark_strict to make it an error."
    warn_from_group_rank0(logger, group_rank, "%s. %s", message, hint)


def _candidates(
    decision: CollectiveDecision, default: str | None, confidence: float
) -> list[dict[str, Any]]:
    # Each candidate's entry in the payload, in decision.results order: its
    # status and times per rank, why it won or lost and, when it is compared
    # with the default (explain), their paired runs.
    qualified = {r.name: r for r in decision.results if r.status is CandidateStatus.OK}
    reference: CandidateResult | None = qualified.get(default) if default else None
    entries = []
    for result in decision.results:
        entry: dict[str, Any] = {
            "name": result.name,
            "status": result.status.name.lower(),
            "status_per_rank": [r.status.name.lower() for r in result.reports],
            "time_ms": _finite(result.time_ms),
            "median_ms_per_rank": [_finite(r.median_ms) for r in result.reports],
            "attempts": result.attempts,
        }
        entries.append(entry)
        if result.status is not CandidateStatus.OK:
            ranks = [
                rank
                for rank, report in enumerate(result.reports)
                if report.status is result.status
            ]
            where = f" in {result.stage}" if result.stage else ""
            entry["why"] = (
                f"disqualified: {result.status.description} on "
                f"rank{'s' if len(ranks) > 1 else ''} "
                f"{', '.join(map(str, ranks))}{where}"
            )
            continue
        if result is reference or reference is None:
            entry["why"] = "no default to beat" if reference is None else "the default"
            continue
        paired = compare_with_default(result, reference)
        entry.update(
            wins_against_default=paired.wins,
            paired_runs=paired.runs,
            p_value=paired.p_value,
            median_advantage=paired.advantage,
        )
        runs = f"{paired.wins}/{paired.runs} paired runs"
        if paired.advantage <= 0:
            why = f"slower: {-paired.advantage:.1%} at the median, faster in {runs}"
        elif paired.p_value > 1.0 - confidence:
            why = f"not significant: faster in {runs}, p={paired.p_value:.2g}"
        elif paired.advantage <= decision.noise_floor:
            why = (
                f"within the noise floor: {paired.advantage:.1%} faster at the "
                f"median, floor {decision.noise_floor:.1%}"
            )
        else:
            why = f"faster in {runs}, p={paired.p_value:.2g}"
        entry["why"] = why
    return entries


def _table(payload: dict[str, Any]) -> str:
    # The payload for a reader: the decision, then a line per candidate with
    # its agreed time, why it won or lost (where a disqualified one failed),
    # its attempts and its status and median on each rank of the group.
    group, timer = payload["group"], payload["timer"]
    timeout = f", timeout {payload['timeout_s']:g}s" if payload["timeout_s"] else ""
    lines = [
        f"collective autotuning of {payload['op']} over group {group['name']!r} "
        f"(ranks {group['ranks']}{timeout}): winner {payload['winner']} "
        f"({payload['reason']}); rule: {payload['rule']}; {payload['source']}"
        + (f" ({timer})" if timer else ""),
        f"  {'candidate':<40} {'agreed time':<16} {'why':<56} attempts and per rank",
    ]
    for entry in payload["candidates"]:
        per_rank = "  ".join(
            f"r{rank}:{status}" + ("" if median is None else f" {median:.4f}ms")
            for rank, (status, median) in enumerate(
                zip(entry["status_per_rank"], entry["median_ms_per_rank"], strict=True)
            )
        )
        time_ms = "" if entry["time_ms"] is None else f"{entry['time_ms']:.4f} ms"
        lines.append(
            f"  {entry['name']:<40} {time_ms:<16} {entry['why']:<56} "
            f"attempts={entry['attempts']}  {per_rank}"
        )
    return "\n".join(lines)


def _finite(value: float) -> float | None:
    # JSON has no infinity: a candidate without a time has none.
    return value if math.isfinite(value) else None
