"""What a collective benchmarking decision is made of: statuses, results, decisions.

The values every member builds from what the members agreed on, and their
JSON form (decisions travel between members and to the decision cache).
The rules that choose a winner are in ``rules.py``.  Nothing here touches a
process group.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import statistics
from typing import NamedTuple

__all__ = [
    "CandidateResult",
    "CandidateStatus",
    "CollectiveDecision",
    "DecisionRule",
    "RankReport",
    "decision_from_json",
    "decision_to_json",
    "worth_storing",
]


class CandidateStatus(enum.IntEnum):
    """Outcome of one candidate on one rank; a larger value is a worse outcome.

    The worst status over the ranks is the candidate's status, so the order
    matters: a rank that only saw the channel fail under it reports
    ``PEER_FAILED`` and the rank that caused it reports the cause.
    """

    OK = 0
    PEER_FAILED = 1  # a collective failed because another rank left the round
    TIMED_OUT = 2  # a collective step did not complete within the timeout
    WRONG_RESULT = 3  # output differs from the default's beyond tolerance
    RAISED = 4  # the candidate raised on this rank
    # its collectives differ between ranks: it would desynchronize the others
    DESYNCHRONIZED = 5
    # the backend cannot run its collectives safely (several in flight on gloo)
    UNSAFE = 6

    @property
    def retryable(self) -> bool:
        return self in (CandidateStatus.PEER_FAILED, CandidateStatus.TIMED_OUT)

    @property
    def description(self) -> str:
        """The status in the words of reports and reasons: ``"timed out"``."""
        return self.name.lower().replace("_", " ")


class RankReport(NamedTuple):
    """What one rank reported for one candidate: its status, and the median of its timed runs in ms (inf when it timed none)."""

    status: CandidateStatus
    median_ms: float = math.inf


@dataclasses.dataclass(frozen=True)
class CandidateResult:
    """The agreed outcome of one candidate: identical on every rank.

    ``runs_ms`` holds each timed run's time: the slowest rank's in that run
    (a collective ends when its last rank does).  Not every rank's runs: a
    decision, which is stored and handed between ranks, grows with the
    group's size by a report per rank only.
    """

    name: str
    reports: tuple[RankReport, ...]
    runs_ms: tuple[float, ...] = ()
    attempts: int = 1
    stage: str = ""  # where the worst status arose, for the log

    @property
    def status(self) -> CandidateStatus:
        return max(report.status for report in self.reports)

    @property
    def time_ms(self) -> float:
        """The median of :attr:`runs_ms`, or inf when the candidate is disqualified."""
        runs = self.runs_ms
        if self.status is not CandidateStatus.OK or not runs:
            return math.inf
        return statistics.median(runs)


class DecisionRule(enum.Enum):
    """The rule that chose an op's winner; its value is the name reports give it."""

    FASTEST = "fastest"  # the fastest qualified candidate, nothing to beat
    NEAR_TIE = "near-tie"  # within tie_tolerance of the fastest, and earlier
    SIGNIFICANT = "faster and significant"  # beat the default beyond noise
    DO_NO_HARM = "do-no-harm"  # the default stays: the others did not beat it
    ALL_FAILED = "every candidate failed"  # nothing qualified: the default runs
    # The op's own default raised while benchmarked, where the program runs
    # it anyway: no candidate can be judged against it; nothing is tuned.
    DEFAULT_FAILED = "the default failed: nothing tuned"
    # The default timed out, lost a peer, or was not run: there is no
    # reference to screen or time the others against; nothing is tuned.
    NO_REFERENCE = "the default was not measured: nothing tuned"
    MIN_SPEEDUP = "below min_speedup_threshold"  # the default stays
    # No session: Inductor's deterministic mode benchmarks nothing and takes
    # the op's default (reporting.py reports it all the same).
    DETERMINISTIC = "deterministic mode"


@dataclasses.dataclass(frozen=True)
class CollectiveDecision:
    """The outcome of a session for one op, identical on every rank of the group.

    ``rule`` is the rule of :func:`decide` (or :func:`apply_speedup_threshold`)
    that chose ``winner``, and ``reason`` says it in words;
    ``noise_floor`` is the session's (:func:`noise_floor`), 0 when the
    default had no twin; ``timer`` says what timed the runs and how many
    ("host clock, 50 runs per candidate"; empty when nothing was timed).
    """

    group_name: str
    results: tuple[CandidateResult, ...]
    winner: str | None
    reason: str
    rule: DecisionRule
    noise_floor: float = 0.0
    timer: str = ""

    def time_ms(self, name: str) -> float:
        return next(result.time_ms for result in self.results if result.name == name)


def decision_to_json(decision: CollectiveDecision) -> str:
    """``decision`` as JSON, which :func:`decision_from_json` reads back equal."""
    # The rule by its name; statuses are ints (IntEnum), tuples lists.
    return json.dumps(dataclasses.asdict(decision), default=lambda rule: rule.name)


def decision_from_json(text: str) -> CollectiveDecision:
    raw = json.loads(text)
    results = tuple(
        CandidateResult(
            **{
                **result,
                "reports": tuple(
                    RankReport(CandidateStatus(status), median_ms)
                    for status, median_ms in result["reports"]
                ),
                "runs_ms": tuple(result["runs_ms"]),
            }
        )
        for result in raw.pop("results")
    )
    rule = DecisionRule[raw.pop("rule")]
    return CollectiveDecision(results=results, rule=rule, **raw)


# The rules of a default without a result: decisions that say nothing of the
# candidates.
_DEFAULT_UNMEASURED = frozenset(
    {DecisionRule.DEFAULT_FAILED, DecisionRule.NO_REFERENCE}
)


def worth_storing(decision: CollectiveDecision) -> bool:
    """Whether ``decision`` says something about the candidates that outlives the process.

    Not when the default had no result: the process keeps such a decision,
    so that a recompile neither reruns the session nor warns again, but
    stores none, so that the next process tries again.
    """
    return decision.rule not in _DEFAULT_UNMEASURED
