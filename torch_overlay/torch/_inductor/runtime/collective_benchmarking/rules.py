"""The decision rules of collective benchmarking: pure functions of what the ranks agreed on.

Every rank of a group applies these rules to the same inputs (the exchanged
reports) and so takes the same decision without further communication.
Nothing here touches a process group or the store, which is what makes the
rules testable without ranks.
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from typing import Any, NamedTuple, TYPE_CHECKING

import torch
from torch.testing._comparison import default_tolerances

from .decisions import (
    CandidateResult,
    CandidateStatus,
    CollectiveDecision,
    DecisionRule,
    worth_storing,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .types import CollectiveBenchmarkConfig


__all__ = [
    "agreed_decision",
    "apply_speedup_threshold",
    "beats_default",
    "compare_with_default",
    "decide",
    "every_candidate_wrong",
    "first_tensor",
    "interleaved_order",
    "is_default_choice",
    "noise_floor",
    "outputs_match",
    "PairedComparison",
    "pick_winner",
    "racing",
    "relative_advantages",
    "screening_tolerance",
    "sign_test_p_value",
    "tuned_nothing",
    "Verdict",
]


# --- choosing -------------------------------------------------------------------
def pick_winner(times_ms: Sequence[float], tie_tolerance: float) -> int | None:
    """Index of the winner among ``times_ms``, listed in preference order.

    Disqualified candidates have an infinite time.  Every candidate within
    ``tie_tolerance`` (relative) of the fastest is tied with it, and the first
    tied candidate wins: the result depends only on the agreed times and the
    order, never on noise below the tolerance.  ``None`` when all are infinite.
    """
    qualified = [i for i, t in enumerate(times_ms) if math.isfinite(t)]
    if not qualified:
        return None
    fastest = min(times_ms[i] for i in qualified)
    return next(i for i in qualified if times_ms[i] <= fastest * (1.0 + tie_tolerance))


def sign_test_p_value(advantages: Sequence[float]) -> float:
    """One-sided sign test: the chance of at least this many positive ``advantages`` if each were a coin flip.

    Ties (zero) are dropped.  Distribution-free: it uses only which of two
    paired runs was faster, so a few outliers cannot move it.
    """
    signs = [a for a in advantages if a != 0]
    return _coin_flips_tail(len(signs), sum(a > 0 for a in signs))


def _coin_flips_tail(n: int, wins: int) -> float:
    # The chance of at least ``wins`` heads in ``n`` fair coin flips (1 when n is 0).
    return sum(math.comb(n, k) for k in range(wins, n + 1)) / 2**n


def relative_advantages(
    candidate: CandidateResult, default: CandidateResult
) -> list[float]:
    """Per timed run, how much faster ``candidate`` was than ``default``, as a
    fraction of the default's time (negative: slower).

    The two ran interleaved, so run ``i`` of each saw the same moment of the
    machine: their difference in that run is free of drift.  Only the runs
    that both had count: a candidate that :func:`racing` stopped has fewer.
    """
    return [
        (d - c) / d if d > 0 else 0.0
        for d, c in zip(default.runs_ms, candidate.runs_ms, strict=False)
    ]


def noise_floor(default: CandidateResult, twin: CandidateResult | None) -> float:
    """The session's noise: the median relative difference, run by run, between
    the default and its *twin* (the same implementation, timed again in every
    interleaved iteration).  0 without a twin."""
    if twin is None or twin.status is not CandidateStatus.OK:
        return 0.0
    differences = [abs(a) for a in relative_advantages(twin, default)]
    return statistics.median(differences) if differences else 0.0


@dataclasses.dataclass(frozen=True)
class PairedComparison:
    """A candidate against the default, run by run (they ran interleaved).

    ``wins`` of ``runs`` paired runs were faster than the default's;
    ``p_value`` is their one-sided :func:`sign_test_p_value`, and
    ``advantage`` the median relative advantage (negative: slower).
    """

    wins: int
    runs: int
    p_value: float
    advantage: float

    def summary(self, floor: float) -> str:
        return (
            f"faster than the default in {self.wins} of {self.runs} runs (sign test "
            f"p={self.p_value:.3g}), by {self.advantage:.1%} at the median against "
            f"a noise floor of {floor:.1%}"
        )


def compare_with_default(
    candidate: CandidateResult, default: CandidateResult
) -> PairedComparison:
    """How ``candidate`` did against ``default`` in their paired timed runs."""
    advantages = relative_advantages(candidate, default)
    return PairedComparison(
        wins=sum(a > 0 for a in advantages),
        runs=len(advantages),
        p_value=sign_test_p_value(advantages),
        advantage=statistics.median(advantages) if advantages else 0.0,
    )


def beats_default(
    candidate: CandidateResult,
    default: CandidateResult,
    confidence: float,
    twin: CandidateResult | None = None,
) -> tuple[bool, str]:
    """Whether ``candidate`` beats ``default`` by more than the session's noise, and why.

    Two conditions, on the paired runs: the candidate was faster in
    significantly more runs than chance (:func:`sign_test_p_value` at most
    ``1 - confidence``), and by more than the noise floor: its median
    relative advantage exceeds the median relative difference between the
    default and its ``twin`` (:func:`noise_floor`), so that a difference of
    the size that two runs of one program show is never taken for a speedup.
    """
    comparison = compare_with_default(candidate, default)
    floor = noise_floor(default, twin)
    beats = comparison.p_value <= 1.0 - confidence and comparison.advantage > floor
    return beats, comparison.summary(floor)


class Verdict(NamedTuple):
    """What :func:`decide` chose: the index of the winner (``None``: nothing
    qualified), the rule that chose it, the reason in words, and the
    session's :func:`noise_floor` (0 without a default and its twin)."""

    winner: int | None
    rule: DecisionRule
    reason: str
    noise_floor: float = 0.0


def decide(
    results: Sequence[CandidateResult],
    has_default: bool,
    tie_tolerance: float,
    confidence: float,
    twin: CandidateResult | None = None,
) -> Verdict:
    """The winner among ``results`` (in preference order, the default first when
    ``has_default``), the rule that chose it and the reason.

    The fastest qualified candidate wins, near-ties going to the earlier
    (:func:`pick_winner`), of those timed in as many runs as the default (one
    that stopped racing cannot win); a winner other than the default must also beat the
    default beyond noise (:func:`beats_default`, with the default's ``twin``
    when it was timed), or the default stays.  A default without a result
    decides nothing (no winner): one that raised (``DEFAULT_FAILED``) is the
    op's own code, which the program runs untuned anyway; one that timed out, lost a peer or was not run
    (``NO_REFERENCE``) leaves the others screened against no reference.
    """
    if has_default and results[0].status is not CandidateStatus.OK:
        return _without_default_result(results[0])
    # A candidate that stopped racing (fewer runs than the default's) could
    # no longer win: its median over its first rounds must not make it the
    # fastest, which would keep the default against a candidate that beat it.
    rounds = len(results[0].runs_ms) if has_default else 0
    times = [
        result.time_ms if len(result.runs_ms) >= rounds else math.inf
        for result in results
    ]
    index = pick_winner(times, tie_tolerance)
    if index is None:
        return Verdict(
            None,
            DecisionRule.ALL_FAILED,
            "no candidate qualified: every rank uses the default",
        )
    fastest = min(times)
    rule, reason = (
        (DecisionRule.FASTEST, "fastest")
        if times[index] == fastest
        else (
            DecisionRule.NEAR_TIE,
            f"within {tie_tolerance:.0%} of the fastest ({fastest:.4f} ms); ties go "
            "to the default, then to registration order",
        )
    )
    if not has_default:
        return Verdict(index, rule, reason)
    floor = noise_floor(results[0], twin)
    if index == 0:
        return Verdict(index, rule, reason, floor)
    beats, summary = beats_default(results[index], results[0], confidence, twin)
    if beats:
        return Verdict(index, DecisionRule.SIGNIFICANT, f"{reason}; {summary}", floor)
    return Verdict(
        0,
        DecisionRule.DO_NO_HARM,
        f"the default stays: {results[index].name} was {summary}: within the "
        f"session's noise at {confidence:.0%} confidence",
        floor,
    )


# A candidate whose chance to pass the sign test by the last round is below
# this stops being timed.  Checked first after 10 rounds, where the rate won
# so far is rough: a candidate that wins 70% of its rounds, and would pass
# after 50, is out early in about 4% of sessions at 1% (12% at 5%), while a
# tie is out after 25 rounds on average (20 at 5%).
_OUT_OF_THE_RACE = 0.01


def racing(
    results: Sequence[CandidateResult],
    twin: CandidateResult | None,
    nruns: int,
    confidence: float,
) -> list[int]:
    """The candidates a session goes on timing after a checkpoint of an op's timed runs.

    ``results`` are the op's candidates, the default first, as agreed after
    the rounds timed so far of ``nruns`` (``twin`` is its default's twin).
    Returns the indices of the candidates other than the default that still
    race; the default and its twin run while any does, and an empty list
    means that the op is decided.  A candidate stops when it was out on a
    rank, or when it can no longer win: the chance that :func:`beats_default`'s
    sign test passes after ``nruns`` rounds, with the remaining rounds won at
    the rate the candidate won so far, is below 1%.  The last
    candidate left decides the op when its sign test passes whatever the
    remaining rounds show and it is faster beyond the noise floor so far.
    The rules of :func:`decide` are then applied to the rounds timed.  A pure
    function of agreed data: every member stops at the same round.
    """
    default = results[0]
    outlooks = {
        index: _sign_test_outlook(
            relative_advantages(result, default), nruns, confidence
        )
        for index, result in enumerate(results[1:], start=1)
        if result.status is CandidateStatus.OK
    }
    left = [i for i, (_, chance) in outlooks.items() if chance >= _OUT_OF_THE_RACE]
    if (
        len(left) == 1
        and outlooks[left[0]][0]
        and compare_with_default(results[left[0]], default).advantage
        > noise_floor(default, twin)
    ):
        return []
    return left


def _sign_test_outlook(
    advantages: Sequence[float], nruns: int, confidence: float
) -> tuple[bool, float]:
    # Whether the sign test over all ``nruns`` rounds passes at ``confidence``
    # whatever the remaining rounds show (a tie drops out of the test, and a
    # loss is counted here already), and the chance that it passes when
    # each remaining round is won at the rate so far.
    wins, losses = sum(a > 0 for a in advantages), sum(a < 0 for a in advantages)
    remaining = nruns - len(advantages)
    n = wins + losses + remaining
    needed = next(w for w in range(n + 2) if _coin_flips_tail(n, w) <= 1.0 - confidence)
    if wins >= needed:
        return True, 1.0
    rate = wins / (wins + losses) if wins + losses else 0.5
    return False, sum(
        math.comb(remaining, j) * rate**j * (1.0 - rate) ** (remaining - j)
        for j in range(needed - wins, remaining + 1)
    )


def agreed_decision(
    group_name: str,
    results: Sequence[CandidateResult],
    has_default: bool,
    config: CollectiveBenchmarkConfig,
    timer: str,
    twin: CandidateResult | None = None,
) -> CollectiveDecision:
    """The decision of one op over group ``group_name``, from its agreed ``results``.

    :func:`decide` under ``config``'s tie tolerance and confidence, its
    winner by name; ``timer`` says what timed the runs.  The same on every
    member, which holds the same results.
    """
    verdict = decide(
        results, has_default, config.tie_tolerance, config.confidence, twin
    )
    winner = None if verdict.winner is None else results[verdict.winner].name
    return CollectiveDecision(
        group_name,
        tuple(results),
        winner,
        verdict.reason,
        verdict.rule,
        verdict.noise_floor,
        timer,
    )


def _without_default_result(default: CandidateResult) -> Verdict:
    what = f"the default {default.name} {default.status.description}" + (
        f" in {default.stage}" if default.stage else ""
    )
    if default.status is CandidateStatus.RAISED:
        return Verdict(
            None,
            DecisionRule.DEFAULT_FAILED,
            f"{what}: the op's own code, which the program runs untuned, "
            "failed while benchmarked, so no candidate can be judged against "
            "it; nothing is tuned and every rank uses the default",
        )
    return Verdict(
        None,
        DecisionRule.NO_REFERENCE,
        f"{what}: no candidate can be screened or timed against it; nothing "
        "is tuned and every rank uses the default",
    )


def tuned_nothing(decision: CollectiveDecision) -> bool:
    """Whether ``decision`` kept the default because nothing could be measured."""
    return decision.rule is DecisionRule.ALL_FAILED or not worth_storing(decision)


def every_candidate_wrong(decision: CollectiveDecision, has_default: bool) -> bool:
    """Whether every candidate but the default was disqualified for a wrong result.

    The op's own code (the default, first in ``decision.results``) is the
    reference its candidates are screened against; when they all differ
    from it, the decision is the default's, though nothing was slower.
    """
    others = decision.results[1:] if has_default else ()
    return bool(others) and all(
        result.status is CandidateStatus.WRONG_RESULT for result in others
    )


def interleaved_order(count: int, seed: str) -> list[int]:
    """The order of one interleaved iteration over ``count`` candidates: a shuffle that every
    rank draws alike from ``seed`` (the op and the iteration)."""
    order = list(range(count))
    random.Random(seed).shuffle(order)
    return order


def is_default_choice(choice: Any) -> bool:
    """Whether an Inductor choice is the op's own eager implementation (it has no subgraph)."""
    return getattr(choice, "gm", None) is None


def apply_speedup_threshold(
    decision: CollectiveDecision, default: str | None, threshold: float
) -> CollectiveDecision:
    """``decision`` under ``min_speedup_threshold``: a winner other than the default
    (named ``default``; ``None`` when the op has none) must be at least
    ``threshold`` times faster than it at the agreed medians, or the default
    stays.  A pure function of agreed data, like :func:`decide`, so every rank
    of the group takes the same decision.
    """
    winner = decision.winner
    if default is None or winner is None or winner == default or threshold <= 1.0:
        return decision
    default_ms, winner_ms = decision.time_ms(default), decision.time_ms(winner)
    if not math.isfinite(default_ms):
        return decision  # the default was disqualified: nothing to fall back to
    speedup = default_ms / winner_ms if winner_ms > 0 else 0.0
    if speedup >= threshold:
        return decision
    return dataclasses.replace(
        decision,
        winner=default,
        rule=DecisionRule.MIN_SPEEDUP,
        reason=(
            f"the default stays: {winner} ({decision.reason}) is {speedup:.2f}x "
            f"faster, below min_speedup_threshold={threshold:g}"
        ),
    )


# --- screening ------------------------------------------------------------------
def first_tensor(value: Any) -> torch.Tensor | None:
    """The output tensor of a candidate's result: itself, or the first tensor of a sequence."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)):
        return next((item for item in value if isinstance(item, torch.Tensor)), None)
    return None


def screening_tolerance(
    reference: torch.Tensor, magnitude: torch.Tensor | None, terms: int
) -> torch.Tensor:
    """How far, per element, an output may be from the default's ``reference``
    and still be the same reduction of ``terms`` values in another order.

    Each element of either output is ``terms`` values summed in some order,
    every addition rounded to ``reference.dtype`` (or summed wider and
    rounded once): it is within ``gamma(terms) * M`` of the exact sum, where
    ``gamma(n) = n*u / (1 - n*u)``, ``u`` is the dtype's unit roundoff and
    ``M`` the sum of the values' magnitudes (Higham, *Accuracy and Stability
    of Numerical Algorithms*, 2nd ed., (4.4); the ``n``-th rounding covers a
    final scaling or cast).  Two such outputs are within twice that.  ``M``
    is ``magnitude``, the default run on the absolute values of its inputs
    (itself rounded, hence the ``1 - gamma``), or where larger, or missing,
    ``|reference|``.  On top, ``torch.testing``'s tolerances for the dtype:
    what kernels that evaluate the same elementwise code differently may
    differ by.  See ``docs/design.md``, "Screening".
    """
    rtol, atol = default_tolerances(reference.dtype)
    unit_roundoff = torch.finfo(reference.dtype).eps / 2
    rounding = terms * unit_roundoff
    gamma = rounding / (1 - rounding) if rounding < 1 else math.inf
    factor = 2 * gamma / (1 - gamma) if gamma < 1 else math.inf
    size = reference.abs().double()
    scale = size if magnitude is None else torch.maximum(size, magnitude.abs().double())
    return atol + rtol * size + factor * scale


def outputs_match(
    output: torch.Tensor | None,
    reference: torch.Tensor | None,
    magnitude: torch.Tensor | None = None,
    terms: int = 1,
) -> bool:
    """Whether a candidate's output is the default's ``reference``, up to
    :func:`screening_tolerance` for floating types and exactly otherwise.

    Non-finite elements must be equal (NaN to NaN).
    """
    if reference is None:
        return (
            True  # the default did not produce a reference: nothing to screen against
        )
    if (
        output is None
        or output.shape != reference.shape
        or output.dtype != reference.dtype
    ):
        return False
    if not reference.is_floating_point():
        return torch.equal(output, reference)
    difference = (output.double() - reference.double()).abs()
    within = (difference <= screening_tolerance(reference, magnitude, terms)) & (
        output.isfinite() & reference.isfinite()
    )
    same = (output == reference) | (output.isnan() & reference.isnan())
    return bool((within | same).all())
