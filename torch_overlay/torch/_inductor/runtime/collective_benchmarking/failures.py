"""How a session's members agree on what failed, and on each candidate's result.

A session is a schedule of steps (:class:`Step`), the same on every
member.  A member whose step fails posts a :class:`FailureReport` to the
store, and every member applies the same rule to the same posts
(:class:`FailureAgreements`), so that they all resume from the same step
without a collective on the channel that failed.  :func:`classify` says what a step's error was; the
exchange's layout is :class:`LocalOutcomes`'s.  See ``docs/modules.md``,
"session.py".
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
from typing import Any, TYPE_CHECKING

import torch
import torch.distributed as dist
from torch._dynamo.utils import counters

from .decisions import (
    CandidateResult,
    CandidateStatus,
    earliest_failure,
    FailureReport,
    RankReport,
)
from .store import CollectiveBenchmarkError
from .timing import timed


if TYPE_CHECKING:
    from collections.abc import Sequence

    from .control import ControlStore
    from .types import Candidate


__all__ = [
    "agreed_results",
    "classify",
    "FailureAgreements",
    "LocalOutcomes",
    "phase_metadata",
    "Resume",
    "Step",
    "StepFailed",
]


def phase_metadata(
    control: ControlStore, plans: Sequence[tuple[str, Sequence[Candidate]]]
) -> dict[str, Any]:
    # What each phase's compile event names: the group, and how many
    # candidates the session benchmarks (the ops' own, without twins).
    return {
        "group": control.group_name,
        "candidates": sum(len(candidates) for _, candidates in plans),
    }


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


# How much of an error's first line a failure post carries to the other
# members (the store holds it until the session ends).
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
    run: int = 0


@dataclasses.dataclass(frozen=True)
class Resume:
    """Where a session's schedule resumes after a failure agreement."""

    op: int
    # The first candidate to warm up again; None: the op's timed runs.
    warmup_from: int | None


class LocalOutcomes:
    """This member's outcomes in a session, which its exchange sends."""

    def __init__(self) -> None:
        self.statuses: dict[tuple[int, int], CandidateStatus] = {}
        self.samples: dict[tuple[int, int], list[float]] = {}
        # per op: its default's first output
        self.references: dict[int, torch.Tensor] = {}

    def record_runs(
        self, op: int, candidates: Sequence[int], times: Sequence[float]
    ) -> None:
        for index in set(candidates):
            self.samples[(op, index)] = []
        for index, ms in zip(candidates, times, strict=True):
            self.samples[(op, index)].append(ms)

    def forget_from(self, resume: Resume) -> None:
        # What runs again after the resume point is measured again.
        def runs_again(op: int, index: int) -> bool:
            if op != resume.op:
                return op > resume.op
            return resume.warmup_from is not None and index >= resume.warmup_from

        for key in [key for key in self.samples if key[0] >= resume.op]:
            del self.samples[key]
        for key in [key for key in self.statuses if runs_again(*key)]:
            del self.statuses[key]
        for op in [op for op in self.references if runs_again(op, 0)]:
            del self.references[op]

    def flatten(self, op: int, index: int, nruns: int) -> list[float]:
        samples = self.samples.get((op, index), [])
        status = self.statuses.get((op, index), CandidateStatus.OK)
        return [float(status), *samples, *[math.nan] * (nruns - len(samples))]


class FailureAgreements:
    """A session's failure agreements, and what they decided so far.

    Every member posts the step it failed at, and every member applies the
    same rule to the same posts (``earliest_failure``), so that this state
    stays the same on every member without a collective: it is what the
    session resumes from, and it cannot travel on the channel that failed.
    """

    def __init__(
        self,
        plans: Sequence[tuple[str, Sequence[Candidate]]],
        excluded: dict[tuple[int, int], CandidateResult],
        retries: int,
        control: ControlStore,
    ) -> None:
        self.plans = plans
        self.retries = retries
        self.control = control
        self.competing = [
            [(op, index) not in excluded for index in range(len(candidates))]
            for op, (_, candidates) in enumerate(plans)
        ]
        self.failed = dict(excluded)
        self.attempts: dict[tuple[int, int], int] = collections.defaultdict(lambda: 1)
        self.exchange_attempts = 1
        self.epoch = 0

    def agree(self, schedule: list[Step], failure: FailureReport) -> Resume | None:
        """Agree with every member on the step that failed; where the session resumes.

        ``failure`` is this member's report; a member that
        committed posts nothing and counts as past every step.  Returns None
        when every member exchanged (the commit failed somewhere: the session
        is over).  Raises :class:`CollectiveBenchmarkError` when the exchange
        failed more than ``retries + 1`` times.
        """
        exchange, commit = len(schedule), len(schedule) + 1
        self.epoch += 1
        counters["collective_autotuning"]["failure_agreements"] += 1
        with timed(
            "failure_agreement", "sync", **phase_metadata(self.control, self.plans)
        ):
            posts = self.control.gather(
                f"failure{self.epoch}",
                failure.to_json(),
                "failure agreement",
                also="committed",
            )
        past_commit = FailureReport(commit + 1, CandidateStatus.OK, "committed")
        failed_step, reports, stage = earliest_failure(
            [
                past_commit if post is None else FailureReport.from_json(post)
                for post in posts
            ]
        )
        if failed_step >= commit:
            return None
        if failed_step == exchange:
            if self.exchange_attempts > self.retries + 1:
                raise CollectiveBenchmarkError(
                    "collective autotuning: the exchange of group "
                    f"{self.control.group_name!r} failed {self.exchange_attempts} "
                    f"times ({stage}); its channel cannot carry a collective"
                )
            self.exchange_attempts += 1
            return Resume(op=len(self.plans), warmup_from=0)
        blamed = schedule[failed_step]
        key = (blamed.op, blamed.candidate)
        status = max(report.status for report in reports)
        if status.retryable and self.attempts[key] <= self.retries:
            self.attempts[key] += 1
        else:
            self.failed[key] = CandidateResult(
                self.plans[blamed.op][1][blamed.candidate].name,
                reports,
                self.attempts[key],
                stage,
            )
            self.competing[blamed.op][blamed.candidate] = False
        # A failure in a warmup resumes at that candidate's warmup; one in
        # the timed runs restarts the op's timed runs, which must all see
        # the same stretch of time.
        return Resume(
            op=blamed.op, warmup_from=None if blamed.timed else blamed.candidate
        )


def agreed_results(
    plans: Sequence[tuple[str, Sequence[Candidate]]],
    nruns: int,
    gathered: list[list[float]],
    failed: dict[tuple[int, int], CandidateResult],
    attempts: dict[tuple[int, int], int],
) -> list[list[CandidateResult]]:
    # A candidate's result is the failure agreed for it, or else what every
    # member sent for it in the exchange (the layout of LocalOutcomes.flatten).
    width = 1 + nruns  # a candidate's status and timed runs
    offsets = list(
        itertools.accumulate(
            [len(candidates) * width for _, candidates in plans], initial=0
        )
    )

    def rank_reports(op: int, index: int) -> tuple[RankReport, ...]:
        start = offsets[op] + index * width
        return tuple(
            RankReport(
                CandidateStatus(int(row[start])),
                tuple(row[start + 1 : start + width]),
            )
            for row in gathered
        )

    return [
        [
            failed.get((op, index))
            or CandidateResult(
                candidate.name, rank_reports(op, index), attempts[(op, index)]
            )
            for index, candidate in enumerate(candidates)
        ]
        for op, (_, candidates) in enumerate(plans)
    ]
