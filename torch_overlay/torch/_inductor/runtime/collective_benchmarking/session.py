"""The benchmarking part of a session: warmups, interleaved timed runs, checkpoints, exchange, commit.

:class:`SessionRun` runs the same schedule of steps on every member of a
group; a failing member drops the benchmark channel and every member agrees
on the failure on a new one (``failures.py``).  The schedule, the commit,
failures and measurement: ``docs/modules.md``, "session.py".
"""

from __future__ import annotations

import contextlib
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
    Step,
    StepFailed,
)
from .gloo_hazards import disqualified_before_running
from .rules import first_tensor, interleaved_order, outputs_match, racing
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
        # Collectives this member had issued on the channel at the start of
        # each step of the schedule, in order: failure reports carry them.
        self._issued: list[int] = []

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
        # After a failure agreement the schedule is built again from the op it
        # names, alike on every member; step len(schedule) is the exchange,
        # the next the commit (a member whose commit completed keeps no record
        # of it: docs/modules.md, "session.py").
        agreements = FailureAgreements(
            self.plans, self.excluded, self.config.retries, self.channel, self.metadata
        )
        local = LocalOutcomes()
        gathered: list[list[float]] | None = None
        op: int | None = 0
        while op is not None:
            schedule = self._schedule(agreements.competing, op)
            step = 0
            self._issued.clear()
            try:
                while step < len(schedule):
                    step = self._run_op(schedule, step, local)
                self._mark()
                gathered = self._exchange(local)
                step += 1
                self._mark()
                self._sync("commit", [0.0])
                break
            except StepFailed as error:
                failed_at = step if error.step is None else error.step
                failure = FailureReport(
                    failed_at, error.status, error.stage, tuple(self._issued)
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
            op = agreements.agree(schedule, failure)
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

    def _schedule(self, competing: list[list[bool]], first_op: int) -> list[Step]:
        """The steps of the session from op ``first_op`` on, the same on every member.

        Per op: its competing candidates' warmups (not the twin's), then
        ``nruns`` timed iterations, each in its own shuffled order, with a
        checkpoint after every ``race_every`` of them when the op has a
        default to race against."""
        steps: list[Step] = []
        every = self.config.race_every
        for op in range(first_op, len(self.plans)):
            active = [index for index, on in enumerate(competing[op]) if on]
            twin = len(self.plans[op][1]) - 1 if self._has_twin[op] else None
            races = every > 0 and self.plans[op][1][0].is_default and 0 in active
            steps += [Step(op, i, timed=False) for i in active if i != twin]
            for run in range(self.config.nruns):
                if races and run > 0 and run % every == 0:
                    steps.append(Step(op, -1, timed=False, checkpoint=True))
                order = interleaved_order(len(active), f"{self.plans[op][0]}|{run}")
                steps += [Step(op, active[i], timed=True) for i in order]
        return steps

    def _run_op(self, schedule: list[Step], start: int, local: LocalOutcomes) -> int:
        # Runs the steps of one op from schedule[start]; returns where the next
        # op starts.  A checkpoint may drop the op's later steps (_checkpoint).
        op = schedule[start].op
        candidates = self.plans[op][1]
        local.samples.update({(op, i): [] for i in range(len(candidates))})
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(self.channel.registered())
            except Exception as error:
                raise StepFailed(
                    classify(error), "channel setup", error, step=start
                ) from error
            step = start
            while step < len(schedule) and schedule[step].op == op:
                if schedule[step].checkpoint:
                    self._mark()
                    self._checkpoint(schedule, step, local)
                    step += 1
                elif not schedule[step].timed:
                    self._mark()
                    candidate = candidates[schedule[step].candidate]
                    self._warm_up(step, schedule[step], candidate, local)
                    step += 1
                else:
                    step = self._time(schedule, step, local)
        return step

    def _time(self, schedule: list[Step], start: int, local: LocalOutcomes) -> int:
        # The timed runs from schedule[start] to the op's next checkpoint or
        # end, in one batch; returns where they end.
        op, candidates = schedule[start].op, self.plans[schedule[start].op][1]
        end = next(
            (
                i
                for i in range(start, len(schedule))
                if schedule[i].op != op or not schedule[i].timed
            ),
            len(schedule),
        )
        try:
            with timed("timed", **self.metadata):
                times = time_calls(
                    [candidates[step.candidate].fn for step in schedule[start:end]],
                    self.device,
                    self.config.timeout.total_seconds(),
                    before_each=lambda _: self._mark(),
                )
        except CallFailed as failure:
            raise StepFailed(
                classify(failure.error),
                "timed runs",
                failure.error,
                step=start + failure.index,
            ) from failure.error
        for step, ms in zip(schedule[start:end], times, strict=True):
            local.samples[(op, step.candidate)].append(ms)
        return end

    def _checkpoint(self, schedule: list[Step], at: int, local: LocalOutcomes) -> None:
        # Every member's statuses and runs of the op so far, gathered: the
        # candidates that can no longer win (rules.racing) stop being timed,
        # and the op ends once it is decided.  The later steps change alike
        # on every member; those already run keep their positions.
        op = schedule[at].op
        candidates = self.plans[op][1]
        flat = [
            value
            for index in range(len(candidates))
            for value in local.flatten(op, index, self.config.nruns)
        ]
        gathered = self._sync("checkpoint", flat, step=at)
        counters["collective_autotuning"]["checkpoints"] += 1
        (results,) = agreed_results(
            [self.plans[op]], self.config.nruns, gathered, {}, {}
        )
        twin = results.pop() if self._has_twin[op] else None
        end = next(
            (i for i in range(at + 1, len(schedule)) if schedule[i].op != op),
            len(schedule),
        )
        later = schedule[at + 1 : end]
        # The default, then the other candidates still timed.
        still_timed = sorted(
            {step.candidate for step in later if step.timed} - {0, len(results)}
        )
        left = racing(
            [results[0], *(results[i] for i in still_timed)],
            twin,
            self.config.nruns,
            self.config.confidence,
        )
        keep = {0, len(results), *(still_timed[i - 1] for i in left)} if left else set()
        schedule[at + 1 : end] = [
            step
            for step in later
            if step.candidate in keep or (step.checkpoint and keep)
        ]
        counters["collective_autotuning"]["raced_out_runs"] += sum(
            step.timed and step.candidate not in keep for step in later
        )

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
                    reference, magnitude = local.references.get(step.op, (None, None))
                    if candidate.is_default and output is not None:
                        local.references[step.op] = (
                            output.clone(),
                            self._magnitude(candidate),
                        )
                    elif self.config.screen and not outputs_match(
                        output, reference, magnitude, self.channel.group.size()
                    ):
                        status = CandidateStatus.WRONG_RESULT
                wait_device(self.device, self._deadline())
        except Exception as error:
            raise StepFailed(classify(error), "warmup", error, step=index) from error
        local.statuses[(step.op, step.candidate)] = status

    def _magnitude(self, default: Candidate) -> torch.Tensor | None:
        # Every member runs it, after the default's first run: it issues the
        # default's collectives.
        if not self.config.screen or default.magnitude is None:
            return None
        magnitude = first_tensor(default.magnitude())
        wait_device(self.device, self._deadline())
        return None if magnitude is None else magnitude.clone()

    def _exchange(self, local: LocalOutcomes) -> list[list[float]]:
        # Every candidate's status and timed runs on every member, in one collective.
        flat = [
            value
            for op, (_, candidates) in enumerate(self.plans)
            for index in range(len(candidates))
            for value in local.flatten(op, index, self.config.nruns)
        ]
        gathered = self._sync("exchange", flat)
        counters["collective_autotuning"]["exchanges"] += 1
        return gathered

    def _sync(
        self, phase: str, values: list[float], step: int | None = None
    ) -> list[list[float]]:
        # A checkpoint, the exchange, or the commit (any collective that every
        # member completes would do): one all-gather on the channel.
        try:
            with timed(phase, "sync", **self.metadata):
                return self.channel.all_gather(values)
        except Exception as error:
            raise StepFailed(classify(error), phase, error, step=step) from error

    def _mark(self) -> None:
        # At the start of each step, in schedule order.
        self._issued.append(self.channel.collectives_issued())

    def _deadline(self) -> float:
        return time.monotonic() + self.config.timeout.total_seconds()


class LocalOutcomes:
    """This member's outcomes in a session, which its exchange sends.

    An op that runs again sets them anew for each of its competing
    candidates: its warmup sets the status, the op's timed runs every
    sample (the samples are cleared when the op starts).  What a candidate
    that no longer competes left is never read (its result is the failure
    agreed for it).
    """

    def __init__(self) -> None:
        self.statuses: dict[tuple[int, int], CandidateStatus] = {}
        self.samples: dict[tuple[int, int], list[float]] = {}
        # per op: its default's first output, and its magnitude (``Candidate.magnitude``)
        # (set again whenever the default warms up; without it the op is not tuned)
        self.references: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}

    def flatten(self, op: int, index: int, nruns: int) -> list[float]:
        samples = self.samples.get((op, index), [])
        status = self.statuses.get((op, index), CandidateStatus.OK)
        return [float(status), *samples, *[math.nan] * (nruns - len(samples))]
