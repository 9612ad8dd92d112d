"""Rank-consistent benchmarking of autotuning choices that contain collectives.

Every rank of an op's process group benchmarks the candidates in lock-step,
leaves with the same timings and picks the same winner; a failure on any
rank is agreed by every rank, and no rank decides alone.
:class:`CollectiveBenchmarker` runs a *session* over one group: the join
(``join.py``), compiling the candidates, the runs (``session.py``) and the
decision (``rules.py``).  The protocol, its history and its counters:
``docs/modules.md``, "benchmarker.py" (and "Memory safety on gloo": why a
candidate that keeps two collectives in flight never runs on gloo).
"""

from __future__ import annotations

import logging
import time
from typing import Any, TYPE_CHECKING

import torch
import torch.distributed as dist

from . import decision_cache
from .channels import BenchmarkChannel
from .control import ControlStore
from .decisions import CandidateResult, CollectiveDecision
from .groups import process_group_topology, resolve_group
from .join import join, Joined
from .liveness import ensure_heartbeat
from .reporting import (
    adopted_source,
    count_decisions,
    count_session,
    DecisionSource,
    describe,
    explain,
    publish,
)
from .rules import decide, tuned_nothing, worth_storing
from .session import SessionRun
from .store import CollectiveBenchmarkError, STORE_PREFIX
from .timing import timed, timer_name
from .types import Candidate, CollectiveBenchmarkConfig, OpToTune


if TYPE_CHECKING:
    from collections.abc import Callable, Sequence


__all__ = ["CollectiveBenchmarker"]

log = logging.getLogger(__name__)
decision_log = torch._logging.getArtifactLogger(__name__, "collective_autotuning")

# (group name, op) of the sessions that tuned nothing and said so in this process.
_warned_untuned: set[tuple[str, str]] = set()


class CollectiveBenchmarker:
    """Benchmarks collective candidates in lock-step over one process group.

    Every member of ``group`` must construct it with the same configuration
    and call :meth:`run` with the same candidates in the same order, from the
    same point of the program; ranks outside the group must not call it.
    """

    def __init__(
        self,
        group: dist.ProcessGroup | str | None,
        config: CollectiveBenchmarkConfig,
        device: torch.device = torch.device("cpu"),
    ) -> None:
        self.group = resolve_group(group)
        self.group_name = self.group.group_name
        self.config = config
        self.device = device
        self.rank = self.group.rank()
        self.size = self.group.size()
        self.channel = BenchmarkChannel(self.group, device, config.timeout)

    def run(
        self,
        candidates: Sequence[Candidate],
        key: str = "",
        memo_key: str | None = None,
    ) -> CollectiveDecision:
        """Benchmark the candidates of one op; the decision every member shares.

        The same as :meth:`run_batch` with one op: see there.
        """
        return self.run_batch([OpToTune(key, candidates, memo_key)])[0]

    def run_batch(
        self, ops: Sequence[OpToTune], known: Sequence[CollectiveDecision] | None = None
    ) -> list[CollectiveDecision]:
        """Benchmark the candidates of several ops in one session; one decision per op.

        Every member of the group must call it with the same ops in the same
        order.  The session has one join (the *pre-sync*, see
        ``join.py``), which checks that every member holds the same ops and
        candidates.  Each op's candidates are benchmarked in preference order
        (its default first, then the given order); at most one candidate per
        op may be the default, and its first output is the reference against
        which the op's other candidates are screened.

        Decisions are remembered (see :class:`OpToTune`'s ``memo_key``): an op
        that any member remembers is neither compiled nor benchmarked, every
        member adopts the remembered decision; when every op is adopted, the
        session is its join alone.  ``known`` gives a decision per op that
        this member holds already (a compiled program's, replayed from a
        cache): it takes part in the join with them, compiles and benchmarks
        nothing, and returns what the group agreed, which may be another
        member's.

        Returns the decisions in ``ops`` order (a disqualified candidate has an
        infinite time; ``winner`` is ``None`` when none of an op's candidates
        qualified, or when the op's default failed: then nothing is tuned,
        and every member warns, saying why).  Raises
        :class:`CollectiveBenchmarkError` on every healthy member when a member
        is lost or the members' ops differ, and, under the config's
        ``strict``, when an op tuned nothing; never returns a decision that a
        healthy member does not share.

        Each decision is reported in the trace and in TORCH_LOGS
        (``reporting.py``), and the session is a compile event,
        ``collective_autotuning.session``, whose time the compile's metrics
        hold as ``collective_autotuning_time_us``.
        """
        for op in ops:
            if sum(candidate.is_default for candidate in op.candidates) > 1:
                raise ValueError(
                    f"at most one candidate can be the default (op {op.key!r})"
                )
        replayed = decision_cache.take_pre_agreed(self.group_name, ops)
        if replayed is not None:
            # Agreed already, in the join of a cached program's replay that this
            # compile replaces: the group met for it, it must not meet again
            # (nor compared code: the program counts as this rank's own).
            decision_cache.record(self, ops, replayed, same_code=False)
            for op, decision in zip(ops, replayed, strict=True):
                self._publish(op, decision, DecisionSource.REPLAYED)
            return replayed
        with timed(
            "session",
            compile_metric="collective_autotuning_time_us",
            group=self.group_name,
            candidates=sum(len(op.candidates) for op in ops),
        ):
            return self._run_session(ops, known)

    def _run_session(
        self, ops: Sequence[OpToTune], known: Sequence[CollectiveDecision] | None
    ) -> list[CollectiveDecision]:
        ensure_heartbeat(self.config.timeout)
        started = time.perf_counter()
        remembered: list[CollectiveDecision | None] = (
            list(known)
            if known is not None
            else [decision_cache.recall(self, op) for op in ops]
        )
        control = ControlStore.for_group(
            f"{STORE_PREFIX}/{self.group_name}/session{self.channel.next_session()}/",
            self.group,
            self.config.timeout,
            self.config.max_wait,
        )
        with control.session():
            ordered = [
                sorted(op.candidates, key=lambda c: not c.is_default) for op in ops
            ]
            joined = join(self, control, ops, ordered, remembered)
            results, twins, compile_s = self._benchmark(control, ops, ordered, joined)
        decisions, sources = [], []
        untuned: list[str] = []  # why each op that tuned nothing did
        positions = {op: position for position, op in enumerate(joined.to_run)}
        for i, op in enumerate(ops):
            if i in positions:
                decision = self._decide(
                    results[positions[i]],
                    has_default=ordered[i][0].is_default,
                    twin=twins[positions[i]],
                )
                source = DecisionSource.BENCHMARKED
            else:
                decision = decision_cache.adopt(joined.adopted[i], op)
                source = adopted_source(joined.adopted[i], remembered[i], known)
            # Kept even when the default had no result, so that a recompile
            # in this process neither reruns the session nor warns again.
            decision_cache.remember(self, op, decision)
            notes = self._publish(op, decision, source)
            if tuned_nothing(decision) and (
                source is DecisionSource.BENCHMARKED or not worth_storing(decision)
            ):
                untuned.append(self._tuned_nothing(op, decision, notes))
            decisions.append(decision)
            sources.append(source)
        count_decisions(decisions, sources)
        if untuned and self.config.strict:
            # Every member holds the same decisions: all raise together.
            raise CollectiveBenchmarkError(
                "\n".join(untuned)
                + "\n(torch._inductor.config.collective_benchmark_strict is set)"
            )
        decision_cache.record(self, ops, decisions, same_code=joined.same_code)
        count_session(sources, time.perf_counter() - started - compile_s)
        return decisions

    def _benchmark(
        self,
        control: ControlStore,
        ops: Sequence[OpToTune],
        ordered: Sequence[Sequence[Candidate]],
        joined: Joined,
    ) -> tuple[list[list[CandidateResult]], list[CandidateResult | None], float]:
        # Compiles and runs, in control's session, the candidates of the ops
        # that the join left to benchmark.  Returns each such op's results and
        # its default twin's, and the seconds spent compiling.
        plans = [ordered[i] for i in joined.to_run]
        prepare_errors: dict[tuple[int, int], BaseException] = {}  # filled below
        run = SessionRun(
            self.config,
            self.device,
            self.channel,
            control,
            [(ops[i].key, ordered[i]) for i in joined.to_run],
            joined.excluded,
            prepare_errors,
            [_twin(candidates[0]) for candidates in plans],
        )
        # Compiled only now, and only what the group benchmarks and can run:
        # an op that some member remembers is compiled by nobody, nor is a
        # candidate disqualified before it runs (at the join, or unsafe on
        # gloo: run.excluded, the same on every member).
        to_prepare = [
            ((position, index), candidate.name, candidate.prepare)
            for position, candidates in enumerate(plans)
            for index, candidate in enumerate(candidates)
            if candidate.prepare is not None and (position, index) not in run.excluded
        ]
        metadata: dict[str, Any] = {
            "group": self.group_name,
            "candidates": sum(len(candidates) for candidates in plans),
        }
        prepared = time.perf_counter()
        with timed("compile", "prepare", **metadata):
            prepare_errors.update(self._prepare(to_prepare))
        compile_s = time.perf_counter() - prepared
        if to_prepare:
            # Members compile for different times: the first warmup's
            # collective, bounded by the timeout, must not wait for them.
            with timed("ready", "presync", **metadata):
                control.barrier("ready", "the end of compiling the candidates")
        results = run.run() if plans else []
        return results, run.twin_results, compile_s

    def decision_context(self) -> tuple[str, str]:
        """What a decision depends on besides the candidates: the group and the settings.

        The group by its name, size, global ranks, backend and device type
        (not by this member's rank: the context is the same on every
        member); the settings that change a decision (the timeouts only
        change when a member is given up on).
        """
        config = self.config
        settings = (
            config.nwarmup,
            config.nruns,
            config.retries,
            config.tie_tolerance,
            config.screen,
            config.confidence,
            config.allow_gloo_overlap,
        )
        group = (
            *process_group_topology(self.group),
            dist.get_backend(self.group),
            self.device.type,
        )
        return repr(group), repr(settings)

    def _prepare(
        self, to_prepare: Sequence[tuple[tuple[int, int], str, Callable[[], Any]]]
    ) -> dict[tuple[int, int], BaseException]:
        # Run the given preparations, keyed by their candidate's (op, candidate)
        # position in the session: start every candidate's compilation, then
        # wait for what each left running (kernel builds, which overlap each
        # other and the next candidates' lowering).  A candidate whose
        # preparation fails is disqualified in its warmup, on every member.
        # Returns the positions that failed, with their errors.
        failed: dict[tuple[int, int], BaseException] = {}

        def attempt(
            position: tuple[int, int], name: str, step: Callable[[], Any]
        ) -> Any:
            try:
                return step()
            except Exception as error:
                log.warning(
                    "collective autotuning: preparing %s failed", name, exc_info=True
                )
                failed[position] = error
                return None

        running = []
        for position, name, prepare in to_prepare:
            finish = attempt(position, name, prepare)
            if callable(finish):
                running.append((position, name, finish))
        with timed("build_wait", group=self.group_name, candidates=len(running)):
            for position, name, finish in running:
                attempt(position, name, finish)
        return failed

    def _decide(
        self,
        results: list[CandidateResult],
        has_default: bool,
        twin: CandidateResult | None = None,
    ) -> CollectiveDecision:
        verdict = decide(
            results,
            has_default,
            self.config.tie_tolerance,
            self.config.confidence,
            twin,
        )
        winner = None if verdict.winner is None else results[verdict.winner].name
        return CollectiveDecision(
            self.group_name,
            tuple(results),
            winner,
            verdict.reason,
            verdict.rule,
            verdict.noise_floor,
            f"{timer_name(self.device)}, {self.config.nruns} runs per candidate",
        )

    def _tuned_nothing(
        self, op: OpToTune, decision: CollectiveDecision, notes: Sequence[str]
    ) -> str:
        # Warned on every member, once per op and process, in the words of
        # the trace and TORCH_LOGS; returned for strict to raise every time.
        message = (
            f"collective autotuning of {op.key} over group {self.group_name!r} "
            f"tuned nothing: {decision.reason}. Each candidate: "
            + "; ".join(
                f"{result.name}: {note}"
                for result, note in zip(decision.results, notes, strict=True)
            )
        )
        warned = (self.group_name, op.memo_key or op.key)
        if not self.config.strict and warned not in _warned_untuned:
            _warned_untuned.add(warned)
            log.warning(
                "%s. Set torch._inductor.config.collective_benchmark_strict to "
                "make this an error.",
                message,
            )
        return message

    def _publish(
        self, op: OpToTune, decision: CollectiveDecision, source: DecisionSource
    ) -> list[str]:
        # Into the trace and TORCH_LOGS; returns why each candidate won or lost.
        default = next((c.name for c in op.candidates if c.is_default), None)
        notes = explain(decision, default, self.config.confidence)
        publish(
            decision,
            op.key,
            tuning_key=op.memo_key,
            ranks=dist.get_process_group_ranks(self.group),
            source=source,
            default=default,
            notes=notes,
        )
        if decision_log.isEnabledFor(logging.DEBUG):
            header = (
                f"collective autotuning of {op.key} over group {decision.group_name!r} "
                f"({self.size} ranks, {self.config.nruns} timed runs, timeout "
                f"{self.config.timeout.total_seconds():g}s), on rank {self.rank}"
            )
            decision_log.debug(describe(decision, header, source, notes))
        return notes


def _twin(first: Candidate) -> Candidate | None:
    # The default timed a second time in every iteration: the noise floor
    # of do-no-harm (rules.noise_floor).
    if not first.is_default:
        return None
    return Candidate(f"{first.name} (again)", first.fn, signature=first.signature)
