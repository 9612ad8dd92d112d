"""V2 in the scheduler: each group's deferred nodes tuned in one session per graph.

:func:`finalize_collective_multi_template_buffers`, the first step of
building the scheduler, runs one session per process group over the graph's
:class:`~torch._inductor.ir.CollectiveMultiTemplateBuffer` nodes, in
group-name order, and inlines each agreed winner before fusion, so that its
tail fuses with the epilogue it was timed with.  See ``docs/modules.md``,
"deferral.py".
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, TYPE_CHECKING

import torch
from torch._dynamo.utils import counters
from torch._inductor import ir
from torch._inductor.collective_autotuning.choices import (
    AgreedTimings,
    candidate_names,
    choices_identity,
    collective_candidates,
)
from torch._inductor.collective_autotuning.collective_graphs import (
    collective_group_name,
    collective_ops,
    collective_signature,
    collectives_in_flight,
)
from torch._inductor.collective_autotuning.epilogue import (
    Epilogue,
    epilogue_to_time_with,
    time_with_epilogue,
)
from torch._inductor.collective_autotuning.inlining import inline_winners, splice
from torch._inductor.collective_autotuning.settings import benchmark_config
from torch._inductor.runtime.collective_benchmarking.benchmarker import (
    CollectiveBenchmarker,
)
from torch._inductor.runtime.collective_benchmarking.groups import resolve_group
from torch._inductor.runtime.collective_benchmarking.types import Candidate, OpToTune
from torch._inductor.select_algorithm import (
    AlgorithmSelectorCache,
    get_algorithm_selector_cache,
)
from torch._inductor.virtualized import V


if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from torch._inductor.collective_autotuning.deferral import CollectiveRange
    from torch._inductor.runtime.collective_benchmarking.decisions import (
        CollectiveDecision,
    )


__all__ = [
    "finalize_collective_multi_template_buffers",
]


@dataclasses.dataclass(frozen=True, eq=False)
class _Tunable:
    """What a group decides on: a node's choice, or one range's of a range-dispatched node."""

    node: ir.CollectiveMultiTemplateBuffer
    choices: Sequence[Any]
    input_gen_fns: dict[int, Callable[[Any], torch.Tensor]]
    # What the candidates are timed with (see ``epilogue_to_time_with``), and
    # what follows the node in the graph.  The op's key at the join names
    # the latter: it is the same on every rank, while whether a candidate's
    # tail may fuse is not for a candidate whose graph differs between ranks
    # (which the join must tell apart from ranks tuning different ops).  The
    # tuning key names the former, so that nodes timed alone share one
    # benchmark (and V1's remembered decisions) whatever follows them.
    epilogue: Epilogue | None
    follows: Epilogue | None
    range: CollectiveRange | None = None

    @property
    def op_name(self) -> str:
        # As V1 names the autotuning of one range.
        return self.node.op_name if self.range is None else self.range.name

    def describe_range(self) -> str:
        if self.range is None or (dispatch := self.node.range_dispatch) is None:
            return ""
        return f" for {dispatch.on} in {self.range.bounds}"


def _tunables(node: ir.CollectiveMultiTemplateBuffer) -> list[_Tunable]:
    dispatch = node.range_dispatch
    if dispatch is None:
        follows = Epilogue.find(node)
        timed_with = epilogue_to_time_with(node.choices, follows, node.get_device())
        return [_Tunable(node, node.choices, node.input_gen_fns, timed_with, follows)]
    # A range's winner runs inside the dispatch (a torch.cond branch when the
    # ranges' winners differ), where it cannot fuse with what follows the
    # node: each range is timed alone.
    return [
        _Tunable(node, r.choices, r.input_gen_fns, None, None, r)
        for r in dispatch.ranges
    ]


def finalize_collective_multi_template_buffers(
    operations: list[ir.Operation],
) -> list[ir.Operation]:
    """Pick and inline the agreed winner of every collective node of the graph.

    Every rank of each node's process group must call it, when it builds the
    scheduler for the same program.  Returns the graph's operations with each
    :class:`~torch._inductor.ir.CollectiveMultiTemplateBuffer` replaced, in
    place, by the operations of its winner (the eager default when no
    candidate qualified on every rank), or of the dispatch to the winners of
    its ranges.  Raises ``CollectiveBenchmarkError`` on every healthy rank of
    a group when a member is lost or the members hold different nodes.
    """
    nodes = [
        op for op in operations if isinstance(op, ir.CollectiveMultiTemplateBuffer)
    ]
    if not nodes:
        return operations
    tunables = [_tunables(node) for node in nodes]
    by_group: dict[str, list[_Tunable]] = {}
    for node, of_node in zip(nodes, tunables, strict=True):
        # A node whose candidates name no group (only the eager default
        # communicates) runs on the default group.
        group = collective_group_name(node.choices) or resolve_group(None).group_name
        by_group.setdefault(group, []).extend(of_node)
    winners: dict[_Tunable, Any] = {}
    for group in sorted(by_group):
        winners.update(_agree_on_group(group, by_group[group]))
    # Inline every winner first and splice afterwards: operation names come
    # from the length of V.graph.operations, which must not shrink while ops
    # are still being registered.
    inlined = [
        inline_winners(node, [winners[t] for t in of_node])
        for node, of_node in zip(nodes, tunables, strict=True)
    ]
    for node, (new_ops, out_buffer) in zip(nodes, inlined, strict=True):
        splice(node, new_ops, out_buffer)
    return V.graph.operations


def _agree_on_group(group_name: str, tunables: list[_Tunable]) -> dict[_Tunable, Any]:
    # One session of the group over its tunables: the agreed winner of each.
    # Identical tunables (equal tuning keys) share one benchmark and decision.
    sharing: dict[str, list[_Tunable]] = {}
    for tunable in tunables:
        sharing.setdefault(_tuning_key(tunable), []).append(tunable)
    # The key of each benchmarked op names the nodes it stands for (and its
    # range), so the join also checks that every rank holds the same list of
    # them.
    names = dict.fromkeys(tunable.node.get_name() for tunable in tunables)
    position = {name: i for i, name in enumerate(names)}
    runners = [_Runners(members[0]) for members in sharing.values()]
    ops = [
        _op_to_tune(
            runner, key, [position[member.node.get_name()] for member in members]
        )
        for runner, (key, members) in zip(runners, sharing.items(), strict=True)
    ]
    device = tunables[0].node.get_device()
    assert device is not None  # a collective node's output has a device
    benchmarker = CollectiveBenchmarker(group_name, benchmark_config(), device)
    try:
        agreed = benchmarker.run_batch(ops)
    finally:
        # The session is over: its inputs and outputs are not kept through
        # the next group's session and the rest of the compile.
        for runner in runners:
            runner.release()
    counters["collective_autotuning"]["shared"] += len(tunables) - len(sharing)
    return {
        member: _agreed_winner(member, op, outcome)
        for members, op, outcome in zip(sharing.values(), ops, agreed, strict=True)
        for member in members
    }


# --- what is benchmarked ------------------------------------------------------------
def _tuning_key(tunable: _Tunable) -> str:
    # What the tunable's candidates compute, on which layouts, and what they
    # are timed with: tunables with equal keys measure the same thing.  A
    # node timed alone
    # (no epilogue, or one that cannot change the order)
    # and without a range measures what V1 measures (see
    # benchmark_collective_choices), so the two share remembered decisions;
    # a range is measured at sizes of its own.
    epilogue = tunable.epilogue
    timed_with = epilogue.structure if epilogue is not None else "alone"
    return f"{choices_identity(tunable.choices)}|{timed_with}{tunable.describe_range()}"


def _op_to_tune(runners: _Runners, tuning_key: str, positions: list[int]) -> OpToTune:
    tunable = runners.tunable
    node, follows = tunable.node, tunable.follows
    candidates = [
        Candidate(
            name,
            functools.partial(runners.call, index, "fn"),
            is_default,
            functools.partial(runners.call, index, "prepare"),
            magnitude=functools.partial(runners.call, index, "magnitude")
            if is_default
            else None,
            signature=collective_signature(choice),
            in_flight=collectives_in_flight(choice),
            collectives=collective_ops(choice),
        )
        for index, (choice, (name, is_default)) in enumerate(
            zip(tunable.choices, candidate_names(tunable.choices), strict=True)
        )
    ]
    shapes = [(tuple(inp.get_size()), inp.get_dtype()) for inp in node.original_inputs]
    # The concrete shapes the candidates are benchmarked at: the size hints,
    # or what the input generators make (a range's top size).  A subgraph
    # choice holds its benchmark inputs; every deferred tunable has one
    # (its collectives are found in the choices' graphs).
    inputs = next(
        c.benchmark_inputs for c in tunable.choices if hasattr(c, "benchmark_inputs")
    )
    at = [tuple(t.shape) for t in inputs if isinstance(t, torch.Tensor)]
    # Symbolic shapes are benchmarked at their hints, which every rank must
    # share: the key says which, so that ranks that differ fail at the join.
    benchmarked = (
        "" if at == [shape for shape, _ in shapes] else f" benchmarked at {at}"
    )
    then = f" then {follows.key}" if follows is not None else ""
    return OpToTune(
        f"{tunable.op_name} {shapes}{tunable.describe_range()}{benchmarked}{then} "
        f"(the group's collective nodes {positions})",
        candidates,
        memo_key=tuning_key,
    )


class _Runners:
    """What times a tunable's candidates, built on first use.

    Benchmark inputs are allocated and candidates traced and compiled only
    for a tunable the group benchmarks: one that a rank remembers, or that
    shares its tuning key with an earlier one, costs none of it.
    """

    def __init__(self, tunable: _Tunable) -> None:
        self.tunable = tunable

    @functools.cached_property
    def candidates(self) -> list[Candidate]:
        tunable = self.tunable
        node = tunable.node
        # The first choice's layout, as V1 benchmarks: concrete, at the size
        # hints or the range's size (the node's own may be symbolic).
        args = AlgorithmSelectorCache.get_inputs(
            tunable.choices,
            list(node.original_inputs),
            tunable.choices[0].layout,
            tunable.input_gen_fns,
        )
        candidates = collective_candidates(
            tunable.choices,
            args,
        )
        if tunable.epilogue is not None:
            candidates = time_with_epilogue(
                node, tunable.choices, candidates, args, tunable.epilogue
            )
        return candidates

    def release(self) -> None:
        """Drop the benchmark inputs and outputs, once the session is over."""
        self.__dict__.pop("candidates", None)

    def call(self, index: int, runner: str) -> Any:
        """Call candidate ``index``'s ``runner`` (``fn``, ``prepare`` or ``magnitude``)."""
        run = getattr(self.candidates[index], runner)
        return run() if run is not None else None


# --- the agreed winner ---------------------------------------------------------------
def _agreed_winner(tunable: _Tunable, op: OpToTune, outcome: CollectiveDecision) -> Any:
    # Identical tunables list the same choices in the same order, so the
    # candidates of the one benchmarked stand for each member's choices.
    timings = AgreedTimings(
        tunable.choices, [(c.name, c.is_default) for c in op.candidates], outcome
    )
    # The hooks autotune_select_algorithm calls after benchmarking, so that
    # tools built on them see both paths alike.  The timings are the agreed
    # ones, the same on every rank.
    for feedback in get_algorithm_selector_cache().feedback_saver_fns:
        feedback(
            timings,
            tunable.op_name,
            list(tunable.node.original_inputs),
            list(tunable.choices),
            _profiled_time_fn,
            {},
        )
    return timings.agreed_choice(tunable.node.min_speedup_threshold)


def _profiled_time_fn(choices_override: Any = None) -> dict[Any, float]:
    # What a feedback saver calls to re-time choices under the profiler: one
    # rank cannot run collective choices alone.
    raise NotImplementedError(
        "collective choices are only timed by their whole group, in lock-step"
    )
