"""Rank-consistent benchmarking of autotuning choices that contain collectives.

Every rank of an op's process group benchmarks the candidates in lock-step,
leaves with the same timings and picks the same winner; a failure on any
rank is agreed by every rank, and no rank decides alone.
:class:`CollectiveBenchmarker` runs a *session* over one group: the join
(``join.py``), compiling the candidates, the runs (``session.py``) and the
decision (``rules.py``).  The protocol, its history and its counters:
``docs/modules.md``, "benchmarker.py".
Why a candidate that keeps two collectives in flight never runs on gloo:
``docs/modules.md``, "Memory safety on gloo".
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch._dynamo.utils import counters

from . import decision_cache
from .channels import BenchmarkChannel
from .decisions import CandidateStatus
from .failures import agree_after_compiling
from .groups import process_group_topology, resolve_group
from .join import join, Joined
from .reporting import DecisionSource, report_decision
from .rules import agreed_decision
from .session import SessionRun
from .timing import timed, timer_name
from .types import (
    Candidate,
    CollectiveBenchmarkConfig,
    CollectiveBenchmarkError,
    OpToTune,
)


if TYPE_CHECKING:
    from collections.abc import Sequence

    from .decisions import CandidateResult, CollectiveDecision


__all__ = ["CollectiveBenchmarker"]

log = logging.getLogger(__name__)
decision_log = torch._logging.getArtifactLogger(__name__, "collective_autotuning")


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
        self.channel = BenchmarkChannel(self.group, device, config)
        # What times the runs, as each decision says it.
        self.timer = f"{timer_name(device)}, {config.nruns} runs per candidate"

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
        qualified, or when the op's default failed: then nothing is tuned).
        Raises :class:`CollectiveBenchmarkError` on every member when some
        members do not come to a step that needs every member within its
        bound (naming them), or the members' ops differ; never returns a
        decision that another member does not share.
        When nothing is tuned, the group's rank 0 warns, saying why; under
        the config's ``strict``, every member raises instead.

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
            for op, agreed in zip(ops, replayed, strict=True):
                report_decision(
                    self, op, agreed, DecisionSource.REPLAYED, decision_log, log
                )
            return replayed
        with timed(
            "session",
            "session_total",  # session_s is the session besides compiling
            compile_metric="collective_autotuning_time_us",
            group=self.group_name,
            candidates=sum(len(op.candidates) for op in ops),
        ):
            return self._run_session(ops, known)

    def _run_session(
        self, ops: Sequence[OpToTune], known: Sequence[CollectiveDecision] | None
    ) -> list[CollectiveDecision]:
        started = time.perf_counter()
        remembered: list[CollectiveDecision | None] = (
            list(known)
            if known is not None
            else [decision_cache.recall(self, op) for op in ops]
        )
        self.channel.start_session()
        ordered = [sorted(op.candidates, key=lambda c: not c.is_default) for op in ops]
        joined = join(self, self.channel, ops, ordered, remembered)
        results, twins, compile_s = self._benchmark(ops, ordered, joined)
        counters["collective_autotuning"]["ops"] += len(joined.to_run)
        counters["collective_autotuning"]["recalled"] += len(ops) - len(joined.to_run)
        decisions = []
        sources = []
        # Why each op that tuned nothing, or whose candidates all computed
        # something else, did: a warning, or strict's error.
        untuned: list[str] = []
        positions = {op: position for position, op in enumerate(joined.to_run)}
        for i, op in enumerate(ops):
            if i in positions:
                decision = agreed_decision(
                    self.group_name,
                    results[positions[i]],
                    ordered[i][0].is_default,
                    self.config,
                    self.timer,
                    twins[positions[i]],
                )
                source = DecisionSource.BENCHMARKED
            else:
                decision = decision_cache.adopt(joined.adopted[i], op)
                source = _source_of(joined.adopted[i], remembered[i], known)
            # Kept even when the default had no result, so that a recompile
            # in this process neither reruns the session nor warns again.
            decision_cache.remember(self, op, decision)
            message = report_decision(self, op, decision, source, decision_log, log)
            if message is not None:
                untuned.append(message)
            decisions.append(decision)
            sources.append(source)
        _count_decisions(decisions, sources)
        if untuned and self.config.strict:
            # Every member holds the same decisions: all raise together.
            raise CollectiveBenchmarkError(
                "\n".join(untuned)
                + "\n(torch._inductor.config.collective_benchmark_strict is set)"
            )
        decision_cache.record(self, ops, decisions, same_code=joined.same_code)
        _count_session(time.perf_counter() - started - compile_s)
        return decisions

    def _benchmark(
        self,
        ops: Sequence[OpToTune],
        ordered: Sequence[Sequence[Candidate]],
        joined: Joined,
    ) -> tuple[list[list[CandidateResult]], list[CandidateResult | None], float]:
        # Compiles and runs the candidates of the ops that the join left to
        # benchmark.  Returns each such op's results and its default twin's,
        # and the seconds spent compiling.
        plans = [ordered[i] for i in joined.to_run]
        run = SessionRun(
            self.config,
            self.device,
            self.channel,
            [(ops[i].key, ordered[i]) for i in joined.to_run],
            joined.excluded,
            [_twin(candidates[0]) for candidates in plans],
        )
        # Compiled only now, and only what the group benchmarks and can run:
        # no candidate disqualified before it runs (run.excluded, on every member)
        # (at the join, or, in this fork, as unsafe on gloo)
        to_prepare = [
            ((position, index), candidate.name, candidate.prepare)
            for position, candidates in enumerate(plans)
            for index, candidate in enumerate(candidates)
            if candidate.prepare is not None and (position, index) not in run.excluded
        ]
        # Keyed by position, as agree_after_compiling reads them.
        prepare_errors: dict[tuple[int, int], BaseException] = {}
        prepared = time.perf_counter()
        with timed("compile", "prepare", **run.metadata):
            for position, name, prepare in to_prepare:
                try:
                    prepare()
                except Exception as error:
                    log.warning(
                        "collective autotuning: preparing %s failed",
                        name,
                        exc_info=True,
                    )
                    prepare_errors[position] = error
        compile_s = time.perf_counter() - prepared
        if to_prepare:
            # Members compile for different times: the first warmup's
            # collective, bounded by the timeout, must not wait for them.
            # What failed to compile on any member is out before it runs.
            with timed("ready", "presync", **run.metadata):
                run.excluded.update(
                    agree_after_compiling(
                        self.channel, run.plans, prepare_errors, self.config.max_wait
                    )
                )
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
        topology = process_group_topology(self.group)
        group = (*topology, dist.get_backend(self.group), self.device.type)
        return repr(group), repr(settings)


def _twin(first: Candidate) -> Candidate | None:
    # The default timed a second time in every iteration: the noise floor
    # of do-no-harm (rules.noise_floor).
    if not first.is_default:
        return None
    return Candidate(f"{first.name} (again)", first.fn, signature=first.signature)


def _source_of(
    adopted: CollectiveDecision,
    remembered: CollectiveDecision | None,
    known: Sequence[CollectiveDecision] | None,
) -> DecisionSource:
    # The join hands back this member's own decision object where the group
    # adopted it; ``known`` are a cached program's.
    if adopted is not remembered:
        return DecisionSource.ADOPTED
    return DecisionSource.REMEMBERED if known is None else DecisionSource.CACHE_HIT


def _count_decisions(
    decisions: Sequence[CollectiveDecision], sources: Sequence[DecisionSource]
) -> None:
    """Add a session's decisions to ``counters["inductor"]``: adopted, or disqualified by status."""
    inductor_stats = counters["inductor"]
    for decision, source in zip(decisions, sources, strict=True):
        if source is not DecisionSource.BENCHMARKED:
            inductor_stats["collective_autotuning_decisions_adopted"] += 1
            continue
        for result in decision.results:
            if result.status is not CandidateStatus.OK:
                inductor_stats[
                    "collective_autotuning_disqualified_" + result.status.name.lower()
                ] += 1


def _count_session(session_s: float) -> None:
    """Add one session, and its seconds besides compiling, to the counters."""
    counters["inductor"]["collective_autotuning_sessions"] += 1
    # The session besides compiling: joins, runs and agreements (float
    # seconds in Dynamo's int-typed counters: see timing.timed).
    counters["collective_autotuning"]["session_s"] += session_s  # type: ignore[assignment]
