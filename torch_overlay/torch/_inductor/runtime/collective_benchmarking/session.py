"""The benchmarking part of a session: warmups, interleaved timed runs, exchange, commit.

:class:`SessionRun` runs the same schedule of steps on every member of a
group; a failing member drops the benchmark channel and every member agrees
on the failure on a new one (``failures.py``).  The schedule, the commit,
failures and measurement: ``docs/modules.md``, "session.py".
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import time
from typing import Any, TYPE_CHECKING

from torch._dispatch.python import no_python_dispatcher
from torch._dynamo.utils import counters

from .decisions import CandidateResult, CandidateStatus
from .failures import (
    agreed_results,
    classify,
    FailureAgreements,
    FailureReport,
    Resume,
    Step,
    StepFailed,
)
from .gloo_hazards import disqualified_before_running
from .rules import first_tensor, interleaved_order, outputs_match
from .timing import CallFailed, time_calls, timed, wait_device
from .types import CollectiveBenchmarkError


if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch

    from .channels import BenchmarkChannel
    from .types import Candidate, CollectiveBenchmarkConfig


__all__ = ["SessionRun"]

log = logging.getLogger(__name__)


class SessionRun:
    """The benchmarking part of one session, the same on every member of the group.

    ``plans`` holds each benchmarked op's key and its candidates in preference
    order (the default first).  ``excluded`` maps (op, candidate) positions
    to results already agreed at the join (a candidate that is not the same
    on every member never runs).
    On gloo, a candidate that keeps several collectives in flight never runs
    either (unless the config allows it).
    A run is built before its candidates are compiled, so that no candidate
    in :attr:`excluded` (which never runs) is compiled; what failed to
    compile on any member is added to it then (``agree_after_compiling``
    in ``failures.py``).  ``twins`` gives,
    per op, the *twin* of its default (the same implementation, or None):
    timed in every interleaved iteration like a candidate, never warmed up
    nor chosen, it measures the session's noise (``noise_floor``); its
    result per op is in :attr:`twin_results` after :meth:`run`.
    """

    def __init__(
        self,
        config: CollectiveBenchmarkConfig,
        device: torch.device,
        channel: BenchmarkChannel,
        plans: Sequence[tuple[str, Sequence[Candidate]]],
        excluded: dict[tuple[int, int], CandidateResult],
        twins: Sequence[Candidate | None] | None = None,
    ) -> None:
        self.config = config
        self.device = device
        self.channel = channel
        self.excluded = {
            **excluded,
            **disqualified_before_running(
                config, device, channel, plans, excluded, log
            ),
        }
        twins = twins or [None] * len(plans)
        # The twin, when there is one, is an op's last candidate here.
        self.plans = [
            (key, [*candidates, *([twin] if twin is not None else [])])
            for (key, candidates), twin in zip(plans, twins, strict=True)
        ]
        self._has_twin = [twin is not None for twin in twins]
        self.twin_results: list[CandidateResult | None] = [None] * len(plans)
        # What each phase's compile event names: the group, and how many
        # candidates the session benchmarks (the ops' own, without twins).
        self.metadata: dict[str, Any] = {
            "group": channel.group.group_name,
            "candidates": sum(len(candidates) for _, candidates in plans),
        }
        self._issued = IssuedCounts(channel)

    def run(self) -> list[list[CandidateResult]]:
        """Every candidate's agreed result, per op; the same on every member.

        Raises :class:`CollectiveBenchmarkError` when a member is lost.
        """
        # Inductor lowers graphs under enable_python_dispatcher(), and that
        # thread-local state leaks into autotuning.  Under it, gloo
        # collectives are issued (ProcessGroupGloo::enqueue) and waited for
        # with the GIL held, while gloo's runloop thread can hold workMutex_
        # and need the GIL to free a finished work's tensors: a lock-order
        # inversion that stops the member for good, its peers waiting for it
        # alive (docs/upstream/gloo-python-dispatcher-deadlock.md).  Compiled
        # candidates need none of the lowering-time dispatch state.
        try:
            with no_python_dispatcher():
                results = self._run()
        except CollectiveBenchmarkError:
            self.channel.drop()  # a peer is gone; a later session must not reuse it
            raise
        for op, has_twin in enumerate(self._has_twin):
            if has_twin:
                self.twin_results[op] = results[op].pop()
        return results

    def _run(self) -> list[list[CandidateResult]]:
        # The schedule is rebuilt after every failure agreement, from where the
        # session resumes, alike on every member; step len(schedule) is the
        # exchange, the next the commit (a member whose commit completed keeps
        # no record of it: docs/modules.md, "session.py").
        agreements = FailureAgreements(
            self.plans, self.excluded, self.config.retries, self.channel, self.metadata
        )
        local = LocalOutcomes()
        gathered: list[list[float]] | None = None
        resume: Resume | None = Resume(op=0, warmup_from=0)
        while resume is not None:
            schedule = self._schedule(agreements.competing, resume)
            exchange, commit = len(schedule), len(schedule) + 1
            step = 0
            self._issued.clear()
            try:
                while step < exchange:
                    step = self._run_op(schedule, step, local)
                if gathered is None:
                    step = exchange
                    self._issued.mark(exchange)
                    gathered = self._exchange(local)
                step = commit
                self._issued.mark(commit)
                self._commit()
                break
            except StepFailed as error:
                failed_at = step if error.step is None else error.step
                failure = FailureReport(
                    failed_at, error.status, error.stage, self._issued.before(failed_at)
                )
                # No traceback: a failed candidate step is expected here.
                log.info(
                    "collective autotuning: step %d failed on this rank: %s in %s",
                    failed_at,
                    error.status.name,
                    error.stage,
                )
            # Only now, with the exception and its frames gone, is this rank's
            # last reference to the channel the one dropped here: its peers'
            # pending collectives on it fail at once.
            self.channel.drop()
            resume = agreements.agree(schedule, failure)
            if resume is not None:
                local.forget_from(resume)
                gathered = None
        # The loop ends after this rank's exchange (a failure at the commit
        # comes after every member exchanged).
        assert gathered is not None
        return agreed_results(
            self.plans,
            self.config.nruns,
            gathered,
            agreements.failed,
            agreements.attempts,
        )

    def _schedule(self, competing: list[list[bool]], resume: Resume) -> list[Step]:
        return schedule_steps(
            self.plans, self._has_twin, competing, resume, self.config.nruns
        )

    def _run_op(self, schedule: list[Step], start: int, local: LocalOutcomes) -> int:
        # Runs the steps of one op from schedule[start]; returns where the next
        # op starts.
        op = schedule[start].op
        end = next(
            (i for i in range(start, len(schedule)) if schedule[i].op != op),
            len(schedule),
        )
        candidates = self.plans[op][1]
        timed_steps = [i for i in range(start, end) if schedule[i].timed]
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(self.channel.registered())
            except Exception as error:
                raise StepFailed(
                    classify(error), "channel setup", error, step=start
                ) from error
            for i in range(start, timed_steps[0] if timed_steps else end):
                self._issued.mark(i)
                self._warm_up(i, schedule[i], candidates[schedule[i].candidate], local)
            if timed_steps:
                calls = [candidates[schedule[i].candidate].fn for i in timed_steps]
                try:
                    with timed("timed", **self.metadata):
                        times = time_calls(
                            calls,
                            self.device,
                            self.config.timeout.total_seconds(),
                            before_each=lambda call: self._issued.mark(
                                timed_steps[call]
                            ),
                        )
                except CallFailed as failure:
                    raise StepFailed(
                        classify(failure.error),
                        "timed runs",
                        failure.error,
                        step=timed_steps[failure.index],
                    ) from failure.error
                local.record_runs(
                    op, [schedule[i].candidate for i in timed_steps], times
                )
        return end

    def _warm_up(
        self, index: int, step: Step, candidate: Candidate, local: LocalOutcomes
    ) -> None:
        counters["collective_autotuning"]["rounds"] += 1
        status = CandidateStatus.OK
        try:
            with timed("warmup", **self.metadata):
                for run in range(max(1, self.config.nwarmup)):
                    value = candidate.fn()
                    if run > 0:
                        continue
                    # The default's first output is the reference of its op;
                    # another candidate's must match it.  A mismatch is still
                    # timed on this member, so that its collectives stay matched.
                    output = first_tensor(value)
                    wait_device(self.device, self._deadline())
                    if candidate.is_default and output is not None:
                        local.references[step.op] = output.clone()
                    elif self.config.screen and not outputs_match(
                        output, local.references.get(step.op)
                    ):
                        status = CandidateStatus.WRONG_RESULT
                wait_device(self.device, self._deadline())
        except Exception as error:
            raise StepFailed(classify(error), "warmup", error, step=index) from error
        local.statuses[(step.op, step.candidate)] = status

    def _exchange(self, local: LocalOutcomes) -> list[list[float]]:
        # Every candidate's status and timed runs on every member, in one collective.
        flat = [
            value
            for op, (_, candidates) in enumerate(self.plans)
            for index in range(len(candidates))
            for value in local.flatten(op, index, self.config.nruns)
        ]
        try:
            with timed("exchange", "sync", **self.metadata):
                gathered = self.channel.all_gather(flat)
        except Exception as error:
            raise StepFailed(classify(error), "exchange", error) from error
        counters["collective_autotuning"]["exchanges"] += 1
        return gathered

    def _commit(self) -> None:
        try:
            with timed("commit", "sync", **self.metadata):
                self.channel.all_reduce_max(0.0)
        except Exception as error:
            raise StepFailed(classify(error), "commit", error) from error

    def _deadline(self) -> float:
        return time.monotonic() + self.config.timeout.total_seconds()


def schedule_steps(
    plans: Sequence[tuple[str, Sequence[Candidate]]],
    has_twin: Sequence[bool],
    competing: list[list[bool]],
    resume: Resume,
    nruns: int,
) -> list[Step]:
    """The steps of a session from ``resume`` on, the same on every member.

    Per op: its competing candidates' warmups (not the twin's), then ``nruns``
    timed iterations, each in its own shuffled order."""
    steps: list[Step] = []
    for op in range(resume.op, len(plans)):
        active = [index for index, on in enumerate(competing[op]) if on]
        warmup_from = resume.warmup_from if op == resume.op else 0
        if warmup_from is not None:
            twin = len(plans[op][1]) - 1 if has_twin[op] else None
            steps += [
                Step(op, index, timed=False)
                for index in active
                if index >= warmup_from and index != twin
            ]
        for run in range(nruns):
            order = interleaved_order(len(active), f"{plans[op][0]}|{run}")
            steps += [
                Step(op, active[position], timed=True, run=run) for position in order
            ]
    return steps


class IssuedCounts:
    """How many collectives this member had issued on the channel at each step's start.

    Failure reports carry them, to blame a step that issued more on some
    members than on others (``first_desynchronized``).
    """

    def __init__(self, channel: BenchmarkChannel) -> None:
        self.channel = channel
        self._at: dict[int, int] = {}

    def clear(self) -> None:
        self._at.clear()

    def mark(self, step: int) -> None:
        issued = self.channel.collectives_issued()
        if issued is not None:
            self._at[step] = issued

    def before(self, failed_at: int) -> tuple[int, ...]:
        """Collectives issued in each step up to ``failed_at``; () when a start was not counted."""
        try:
            counted = [self._at[step] for step in range(failed_at + 1)]
        except KeyError:
            return ()
        return tuple(after - before for before, after in itertools.pairwise(counted))


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
