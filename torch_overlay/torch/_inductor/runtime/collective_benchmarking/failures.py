"""How a session's members agree on what failed, and on each candidate's result.

A session is a schedule of steps (:class:`Step`), the same on every
member.  A member whose step fails drops the channel (so that its peers'
pending collectives fail too), and every member meets on a new channel,
gathers every member's :class:`FailureReport` there, and applies the same
rule to them (:class:`FailureAgreements`), so that they all start again
at the same op.  :func:`classify` says what a step's error was, and
:func:`agree_after_compiling` what failed to compile (``docs/modules.md``, "session.py").
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
import statistics
from collections import Counter
from typing import Any, NamedTuple, TYPE_CHECKING

import torch.distributed as dist
from torch._dynamo.utils import counters

from .decisions import CandidateResult, CandidateStatus, RankReport
from .timing import timed
from .types import CollectiveBenchmarkError


if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import timedelta

    from .channels import BenchmarkChannel
    from .types import Candidate


__all__ = [
    "agree_after_compiling",
    "agreed_results",
    "classify",
    "earliest_failure",
    "FailureReport",
    "first_desynchronized",
    "FailureAgreements",
    "Step",
    "StepFailed",
]


class FailureReport(NamedTuple):
    """A member's post to a failure agreement: the step it failed at, its
    status there, where (the stage and the error), and how many collectives
    it had issued on the channel at the start of each step it reached, in
    schedule order (the same constant where the backend does not count them;
    the start of a step whose channel could not be set up is missing)."""

    step: int  # a round, or a later step of the session (exchange, commit)
    status: CandidateStatus
    stage: str
    issued: tuple[int, ...] = ()

    def to_json(self) -> list[Any]:
        return [self.step, int(self.status), self.stage, list(self.issued)]

    @staticmethod
    def from_json(post: Sequence[Any]) -> FailureReport:
        step, status, stage, issued = post
        return FailureReport(step, CandidateStatus(status), stage, tuple(issued))


def earliest_failure(
    posts: Sequence[FailureReport],
) -> tuple[int, tuple[RankReport, ...], str]:
    """The step every member blames for a failure, from the members' reports.

    The earliest reported step is the one that failed: a member that
    reported a later step had finished it and saw it succeed (status OK).
    Pure and order-independent, so every member derives the same result
    from the same reports.
    """
    earliest = min(post.step for post in posts)
    reports = tuple(
        RankReport(post.status if post.step == earliest else CandidateStatus.OK)
        for post in posts
    )
    worst = max(reports, key=lambda report: report.status)
    stage = next(
        post.stage
        for post in posts
        if post.step == earliest and post.status == worst.status
    )
    return earliest, reports, stage


def first_desynchronized(
    posts: Sequence[FailureReport],
) -> tuple[int, tuple[RankReport, ...]] | None:
    """The first step in which members issued different numbers of collectives.

    Among the steps that every member completed (those before the earliest
    reported one), when every member counted them: that step's candidate
    issues a collective on some ranks that it does not issue on others, and
    pairs with another step's on its peers, so the failure it causes shows
    later.  The members whose count is not the most common one report
    ``DESYNCHRONIZED``.  ``None`` when no completed step differs.  Pure, as
    :func:`earliest_failure`.
    """
    completed = min(post.step for post in posts)
    if any(len(post.issued) <= completed for post in posts):
        return None
    for step in range(completed):
        counts = [post.issued[step + 1] - post.issued[step] for post in posts]
        if len(set(counts)) > 1:
            usual = Counter(counts).most_common(1)[0][0]
            return step, tuple(
                RankReport(
                    CandidateStatus.OK
                    if count == usual
                    else CandidateStatus.DESYNCHRONIZED
                )
                for count in counts
            )
    return None


def classify(error: BaseException) -> CandidateStatus:
    """The status of a step that raised ``error`` on this member."""
    # c10d has no exception type for a timed-out collective, and gloo raises
    # a bare RuntimeError both for one ("Timed out waiting 2000ms for recv
    # operation to complete") and for a peer that left ("Connection closed
    # by peer"): for those, the message is all there is.  Everything else
    # goes by type (DistError: DistBackendError, DistNetworkError,
    # DistStoreError).
    message = str(error).lower()
    if isinstance(error, TimeoutError) or "timed out" in message:
        return CandidateStatus.TIMED_OUT
    if (
        isinstance(error, dist.DistError)
        or "connection closed" in message
        or "connection reset" in message
    ):
        return CandidateStatus.PEER_FAILED
    return CandidateStatus.RAISED


# How much of an error's first line a failure post carries to the others.
_ERROR_CHARS = 160


class StepFailed(Exception):
    def __init__(
        self,
        status: CandidateStatus,
        stage: str,
        error: BaseException | None = None,
        step: int | None = None,
    ) -> None:
        super().__init__(f"{status.name} during {stage}: {error!r}")
        self.status = status
        # Where, and the error: what every member's report of the step names.
        self.stage = stage if error is None else f"{stage}: {_first_line(error)}"
        self.step = step  # in the session's schedule; None: the step the caller is at


def _first_line(error: BaseException) -> str:
    text = f"{type(error).__name__}: {str(error).strip()}".splitlines()[0]
    return text if len(text) <= _ERROR_CHARS else text[: _ERROR_CHARS - 3] + "..."


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of a session's schedule: the unit in which failures are reported."""

    op: int  # position among the session's benchmarked ops
    candidate: int  # index among the op's candidates, in preference order
    timed: bool  # False: the candidate's warmup; True: one of its timed runs
    # The op's checkpoint: every member's runs so far, gathered (candidate -1).
    checkpoint: bool = False


def agree_after_compiling(
    channel: BenchmarkChannel,
    plans: Sequence[tuple[str, Sequence[Candidate]]],
    prepare_errors: dict[tuple[int, int], BaseException],
    wait: timedelta,
) -> dict[tuple[int, int], CandidateResult]:
    """Meet every member at the end of compiling, within ``wait``; what is out.

    ``prepare_errors`` holds the (op, candidate) positions of ``plans`` (the
    session's, twins included) whose compilation failed on this member.  A
    candidate that failed on any member is out on every member before any
    warmup (``RAISED`` where it failed, its stage "prepare" and the first
    such member's error), with no failure agreement and no new channel: its
    result is returned by position, the same on every member.  Raises
    :class:`CollectiveBenchmarkError` naming the members that do not come.
    """
    positions = [
        (op, index)
        for op, (_, candidates) in enumerate(plans)
        for index in range(len(candidates))
    ]
    failed = [int(position in prepare_errors) for position in positions]
    rows = channel.everyone(
        "the end of compiling the candidates",
        lambda: channel.gather_ints(failed, wait),
        wait,
    )
    unprepared = [i for i in range(len(positions)) if any(r[i] for r in rows)]
    if not unprepared:
        return {}
    # Only when some failed: each member's errors, worded as a step's report.
    stages = [
        StepFailed(CandidateStatus.RAISED, "prepare", prepare_errors[at]).stage
        if at in prepare_errors
        else None
        for at in (positions[i] for i in unprepared)
    ]
    timeout = channel.timeout
    posts = channel.everyone(
        "the exchange of compile errors",
        lambda: channel.gather_objects(stages, timeout),
        timeout,
    )
    out: dict[tuple[int, int], CandidateResult] = {}
    for column, i in enumerate(unprepared):
        op, index = positions[i]
        statuses = [
            CandidateStatus.RAISED if r[i] else CandidateStatus.OK for r in rows
        ]
        out[(op, index)] = CandidateResult(
            plans[op][1][index].name,
            tuple(RankReport(status) for status in statuses),
            stage=next(post[column] for post in posts if post[column]),
        )
    return out


class FailureAgreements:
    """A session's failure agreements, and what they decided so far.

    Every member gathers every member's report of the step it failed at,
    and applies the same rules to them (``first_desynchronized``, then
    ``earliest_failure``), so that this state stays the same on every member:
    it is what the session starts again from.
    """

    def __init__(
        self,
        plans: Sequence[tuple[str, Sequence[Candidate]]],
        excluded: dict[tuple[int, int], CandidateResult],
        retries: int,
        channel: BenchmarkChannel,
        metadata: dict[str, Any],
    ) -> None:
        self.plans = plans
        self.retries = retries
        self.channel = channel
        self.metadata = metadata  # what the agreements' compile events name
        self.competing = [
            [(op, index) not in excluded for index in range(len(candidates))]
            for op, (_, candidates) in enumerate(plans)
        ]
        self.failed = dict(excluded)
        self.attempts: dict[tuple[int, int], int] = collections.defaultdict(lambda: 1)
        self.exchange_attempts = 1

    def agree(self, schedule: list[Step], failure: FailureReport) -> int | None:
        """Agree with every member on the step that failed; the op to start again at.

        ``failure`` is this member's report.  The members meet on a new
        channel within ``max_wait``.  The session starts again at the blamed
        step's op, whose competing candidates all warm up and are timed
        again (an op's timed runs must all see the same stretch of time,
        and a checkpoint that failed blames none of them), or at the
        exchange (``len(plans)``) when that failed.  Returns None when every
        member exchanged (the commit failed: the session is over).  Raises
        :class:`CollectiveBenchmarkError` when the exchange and the
        checkpoints failed more than ``retries + 1`` times, and, naming them,
        when some members do not come within ``max_wait``.
        """
        exchange, commit = len(schedule), len(schedule) + 1
        reports = self._gather_reports(failure)
        desynchronized = first_desynchronized(reports)
        if desynchronized is not None:
            step, ranks = desynchronized
            where = "timed runs" if schedule[step].timed else "warmup"
            self._disqualify(
                schedule[step],
                ranks,
                f"{where}: it issued more collectives on some ranks than on others",
            )
            return schedule[step].op
        failed_step, ranks, stage = earliest_failure(reports)
        if failed_step >= commit:
            return None
        if failed_step == exchange or schedule[failed_step].checkpoint:
            if self.exchange_attempts > self.retries + 1:
                raise CollectiveBenchmarkError(
                    "collective autotuning: the exchanges of group "
                    f"{self.channel.group.group_name!r} failed "
                    f"{self.exchange_attempts} times ({stage}); its channel "
                    "cannot carry a collective"
                )
            self.exchange_attempts += 1
            return (
                len(self.plans) if failed_step == exchange else schedule[failed_step].op
            )
        blamed = schedule[failed_step]
        key = (blamed.op, blamed.candidate)
        status = max(report.status for report in ranks)
        if status.retryable and self.attempts[key] <= self.retries:
            self.attempts[key] += 1
        else:
            self._disqualify(blamed, ranks, stage)
        return blamed.op

    def _gather_reports(self, failure: FailureReport) -> list[FailureReport]:
        # Every member's report, gathered on a new channel: the agreement.
        counters["collective_autotuning"]["failure_agreements"] += 1
        what = "failure agreement"
        with timed("failure_agreement", "sync", **self.metadata):
            self.channel.rebuild(what)
            timeout = self.channel.timeout
            posts = self.channel.everyone(
                what,
                lambda: self.channel.gather_objects(failure.to_json(), timeout),
                timeout,
            )
        return [FailureReport.from_json(post) for post in posts]

    def _disqualify(
        self, blamed: Step, ranks: tuple[RankReport, ...], stage: str
    ) -> None:
        key = (blamed.op, blamed.candidate)
        self.failed[key] = CandidateResult(
            self.plans[blamed.op][1][blamed.candidate].name,
            ranks,
            attempts=self.attempts[key],
            stage=stage,
        )
        self.competing[blamed.op][blamed.candidate] = False


def agreed_results(
    plans: Sequence[tuple[str, Sequence[Candidate]]],
    nruns: int,
    gathered: list[list[float]],
    failed: dict[tuple[int, int], CandidateResult],
    attempts: dict[tuple[int, int], int],
) -> list[list[CandidateResult]]:
    # A candidate's result is the failure agreed for it, or else what every
    # member sent for it in the exchange (LocalOutcomes.flatten's layout, session.py).
    width = 1 + nruns  # a candidate's status and timed runs
    offsets = list(
        itertools.accumulate(
            [len(candidates) * width for _, candidates in plans], initial=0
        )
    )

    def result(op: int, index: int, name: str) -> CandidateResult:
        start = offsets[op] + index * width
        rows = [row[start : start + width] for row in gathered]
        # A member sends NaN for each run it did not time; a run's time is
        # the slowest member's, of the runs that every member timed.
        timed = [[ms for ms in row[1:] if not math.isnan(ms)] for row in rows]
        return CandidateResult(
            name,
            tuple(
                RankReport(
                    CandidateStatus(int(row[0])),
                    statistics.median(runs) if runs else math.inf,
                )
                for row, runs in zip(rows, timed, strict=True)
            ),
            tuple(max(run) for run in zip(*timed, strict=False)),
            attempts.get((op, index), 1),
        )

    return [
        [
            failed.get((op, index)) or result(op, index, candidate.name)
            for index, candidate in enumerate(candidates)
        ]
        for op, (_, candidates) in enumerate(plans)
    ]
