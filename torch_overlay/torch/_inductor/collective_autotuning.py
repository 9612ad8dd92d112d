"""Deferred autotuning of custom ops whose implementations contain collectives.

Two paths
---------
A custom op registered with ``register_custom_op_autotuning`` is tuned when
Inductor lowers it.  When its implementations contain collectives, every rank
of the op's process group must benchmark them together and pick the same one
(see ``torch/_inductor/runtime/collective_benchmarking.py`` for the protocol).
Inductor can do this at two points:

* **At lowering (V1).**  ``select_algorithm`` benchmarks the op on the spot, in
  a session of its own, and the winner's graph is inlined.  A graph with ``n``
  such ops pays ``n`` joins, and each choice is timed alone, blind to the
  pointwise ops that follow it and that it may fuse with.
* **In the scheduler (V2, this module).**  The lowering returns a
  :class:`~torch._inductor.ir.CollectiveMultiTemplateBuffer` holding every
  candidate, the eager default included.  When the scheduler is built, before
  any scheduler node exists, :func:`finalize_collective_multi_template_buffers`
  collects these nodes, runs one session per process group (one pre-sync,
  which also checks that every rank holds the same ordered list of nodes), and
  benchmarks the group's nodes as one batch.  Each candidate is timed together
  with the node's pointwise *epilogue* (``collective_epilogue.py``): the chain
  of pointwise single users that follows it in the graph.  A candidate whose tail fuses with that
  epilogue is timed fused, so the choice is made on what the program will
  run.  When no candidate's tail can fuse (each ends in a collective or
  another op without generated code), the epilogue would add the same kernel
  to every candidate, so they are timed alone, as V1 times them.  The
  winner's graph is then inlined in place of the node, and ordinary fusion
  fuses its tail with the epilogue.

``torch._inductor.config.defer_collective_autotuning`` (env
``TORCHINDUCTOR_DEFER_COLLECTIVE_AUTOTUNING``, on by default) selects V2.  V1
still applies when it is off, to range-based custom op autotuning (whose
dispatch needs a winner per range at lowering), and under
``test_configs.force_custom_op_decomposition``.

Why before fusion, not in ``finalize_multi_template_buffers``
-------------------------------------------------------------
``Scheduler.finalize_multi_template_buffers`` runs after fusion: a template
choice can be swapped in under an already fused kernel because a template
renders its own kernel.  A collective choice is a graph of ops, and its tail
fuses with the epilogue only if those ops exist when fusion runs.  The
collective nodes are therefore finalized at the start of scheduling, from the
graph's operations, which is also the last point where every rank holds the
whole list of them.

Identical nodes are tuned once
------------------------------
A tensor-parallel model repeats the same collective op once or twice per
layer.  Nodes of a group with equal *tuning keys* share one benchmark and one
decision: the key is what timing can depend on, namely each choice's
identity (its graph or kernel, input layouts and config patches, see
``choices_identity``) and the epilogue's structure (its ops, their
arguments, the layouts of its other inputs).  Scalar constants of pointwise
arithmetic (``y * 0.5 + i``) are left out: the generated code does the same
work whatever their value.  The key is computed from the graph alone, so
every rank groups the nodes alike; one node per key is benchmarked, and its
candidates are only traced, compiled and given inputs then.  The benchmarker
also remembers agreed decisions for the rest of the process under the same
key: a later graph (or a V1 op, for a node without an epilogue, which
measures the same thing) adopts one when every rank of the group remembers
the same decision, and the group benchmarks it together otherwise.

Candidates are compiled when the scheduler is built, not while the node is
lowered: a candidate is compiled by a nested Inductor compilation, which
uses the graph-lowering state (``V.graph`` and friends) of the thread that
runs it, so it cannot overlap the lowering of the enclosing graph in another
thread, and compiling at lowering time would compile nodes that the tuning
key later shows to be duplicates.

Agreement
---------
Every rank builds the same list from the same program, so the per-group node
lists agree unless the programs differ (a recompilation on one rank, a
different graph break, cache skew).  The pre-sync compares a compact key per
benchmarked node (the op, its input shapes, its candidates and its
epilogue); when the lists differ, every rank of the group raises
``CollectiveBenchmarkError`` naming the first differing node; none falls back
alone.  Groups are finalized in the order of their names, the same on every
rank, so a rank that is a member of several groups cannot wait for a peer
that waits for it.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, TYPE_CHECKING

from torch._inductor import config, ir
from torch._dynamo.utils import counters
from torch._inductor.collective_epilogue import (
    Epilogue,
    epilogue_to_time_with,
    time_with_epilogue,
)
from torch._inductor.runtime.collective_benchmarking import (
    Candidate,
    candidate_names,
    choices_identity,
    CollectiveBenchmarkConfig,
    CollectiveBenchmarker,
    collective_candidates,
    collective_group_name,
    OpToTune,
    resolve_group,
    select_winner,
)
from torch._inductor.runtime.collective_control import ensure_heartbeat
from torch._inductor.virtualized import V

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import torch


log = logging.getLogger(__name__)

__all__ = [
    "defer_collective_choices",
    "deferral_enabled",
    "finalize_collective_multi_template_buffers",
]


def deferral_enabled() -> bool:
    """Whether collective choices are left to the scheduler (V2) in this compile."""
    return (
        bool(config.defer_collective_autotuning)
        and config.test_configs.force_custom_op_decomposition is None
    )


def defer_collective_choices(
    name: str,
    choices: Sequence[Any],
    inputs: Sequence[ir.IRNode],
    input_gen_fns: dict[int, Callable[[Any], torch.Tensor]] | None,
    min_speedup_threshold: float = 1.0,
) -> ir.TensorBox:
    """The lowering of a collective custom op under V2: a node holding every choice.

    Called while lowering the op's FX node (``V.graph.current_node``), which
    the scheduler uses to find the op's pointwise epilogue.  ``choices`` are
    the op's ``ChoiceCaller``s, the eager default included.
    """
    # Peers wait at the scheduler's join for as long as this rank beats: from
    # now on, the rest of this graph's lowering cannot make it look lost.
    ensure_heartbeat()
    buffer = ir.CollectiveMultiTemplateBuffer(
        choices[0].layout,
        list(inputs),
        list(choices),
        op_name=name,
        input_gen_fns=input_gen_fns or {},
        fx_node=V.graph.current_node,
        min_speedup_threshold=min_speedup_threshold,
    )
    return ir.TensorBox.create(buffer)


def finalize_collective_multi_template_buffers(
    operations: list[ir.Operation],
) -> list[ir.Operation]:
    """Pick and inline the agreed winner of every collective node of the graph.

    Every rank of each node's process group must call it, when it builds the
    scheduler for the same program.  Returns the graph's operations with each
    :class:`~torch._inductor.ir.CollectiveMultiTemplateBuffer` replaced, in
    place, by the operations of its winner (the eager default when no
    candidate qualified on every rank).  Raises ``CollectiveBenchmarkError``
    on every healthy rank of a group when a member is lost or the members hold
    different nodes.
    """
    nodes = [
        op for op in operations if isinstance(op, ir.CollectiveMultiTemplateBuffer)
    ]
    if not nodes:
        return operations
    by_group: dict[str, list[ir.CollectiveMultiTemplateBuffer]] = {}
    for node in nodes:
        # A node whose candidates name no group (only the eager default
        # communicates) runs on the default group.
        group_name = (
            collective_group_name(node.choices) or resolve_group(None).group_name
        )
        by_group.setdefault(group_name, []).append(node)
    benchmark_config = CollectiveBenchmarkConfig.from_inductor_config()
    winners = {}
    for group_name in sorted(by_group):
        group_nodes = by_group[group_name]
        # Identical nodes (equal tuning keys) share one benchmark and decision.
        sharing: dict[
            str, list[tuple[ir.CollectiveMultiTemplateBuffer, Epilogue | None]]
        ] = {}
        for node in group_nodes:
            epilogue = epilogue_to_time_with(node)
            sharing.setdefault(_tuning_key(node, epilogue), []).append((node, epilogue))
        # The key of each benchmarked op names the nodes it stands for, so the
        # join also checks that every rank holds the same list of nodes.
        position = {node.get_name(): i for i, node in enumerate(group_nodes)}
        ops = [
            _op_to_tune(
                *members[0], key, [position[node.get_name()] for node, _ in members]
            )
            for key, members in sharing.items()
        ]
        device = group_nodes[0].get_device()
        assert device is not None  # a collective node's output has a device
        benchmarker = CollectiveBenchmarker(group_name, benchmark_config, device)
        decisions = benchmarker.run_batch(ops)
        counters["collective_autotuning"]["shared"] += len(group_nodes) - len(sharing)
        for members, op, decision in zip(sharing.values(), ops, decisions, strict=True):
            for node, _ in members:
                # Identical nodes list the same choices in the same order.
                timings = {
                    choice: decision.time_ms(c.name)
                    for choice, c in zip(node.choices, op.candidates, strict=True)
                }
                # The op's eager implementation; None when it was registered
                # with include_fallback=False.
                default = next(
                    (
                        choice
                        for choice, c in zip(node.choices, op.candidates, strict=True)
                        if c.is_default
                    ),
                    None,
                )
                winner = select_winner(
                    timings, node.choices, benchmark_config.tie_tolerance
                )
                if winner is None:
                    # nothing qualified on every rank: what V1 falls back to
                    winner = default if default is not None else node.choices[0]
                if default is not None:
                    winner = _apply_speedup_threshold(
                        winner, default, timings, node.min_speedup_threshold
                    )
                winners[node.get_name()] = _report(node, winner, timings)
    # Inline every winner first and splice afterwards: operation names come
    # from the length of V.graph.operations, which must not shrink while ops
    # are still being registered.
    replacements = [
        (node, *_inline_winner(node, winners[node.get_name()])) for node in nodes
    ]
    for node, new_ops, out_buffer in replacements:
        _splice(node, new_ops, out_buffer)
    return V.graph.operations


def _tuning_key(
    node: ir.CollectiveMultiTemplateBuffer, epilogue: Epilogue | None
) -> str:
    # What the node's candidates compute, on which layouts, and what they are
    # timed with: nodes with equal keys measure the same thing.  A node
    # without an epilogue measures what V1 measures (see
    # benchmark_collective_choices), so the two share remembered decisions.
    return f"{choices_identity(node.choices)}|{epilogue.structure if epilogue is not None else 'alone'}"


def _op_to_tune(
    node: ir.CollectiveMultiTemplateBuffer,
    epilogue: Epilogue | None,
    tuning_key: str,
    nodes: list[int],
) -> OpToTune:
    runners = _NodeRunners(node, epilogue)
    candidates = [
        Candidate(
            name,
            functools.partial(runners.run, index),
            is_default,
            functools.partial(runners.prepare, index),
        )
        for index, (name, is_default) in enumerate(candidate_names(node.choices))
    ]
    shapes = [(tuple(inp.get_size()), inp.get_dtype()) for inp in node.original_inputs]
    then = f" then {epilogue.key}" if epilogue is not None else ""
    return OpToTune(
        f"{node.op_name} {shapes}{then} (the group's collective nodes {nodes})",
        candidates,
        memo_key=tuning_key,
    )


class _NodeRunners:
    """What times a node's candidates, built on first use.

    Benchmark inputs are allocated and candidates traced and compiled only
    for a node the group benchmarks: one whose decision every rank remembers,
    or that shares its tuning key with an earlier node, costs none of it.
    """

    def __init__(
        self, node: ir.CollectiveMultiTemplateBuffer, epilogue: Epilogue | None
    ) -> None:
        self.node, self.epilogue = node, epilogue

    @functools.cached_property
    def candidates(self) -> list[Candidate]:
        from torch._inductor.select_algorithm import AlgorithmSelectorCache

        node = self.node
        layout = node.layout
        assert isinstance(layout, ir.Layout)  # it is constructed with one
        args = AlgorithmSelectorCache.get_inputs(
            node.choices, list(node.original_inputs), layout, node.input_gen_fns
        )
        candidates, _ = collective_candidates(
            node.choices,
            args,
            uses_layout_preserving_inputs=AlgorithmSelectorCache._uses_layout_preserving_inputs,
        )
        if self.epilogue is not None:
            candidates = time_with_epilogue(
                node, node.choices, candidates, args, self.epilogue
            )
        return candidates

    def prepare(self, index: int) -> None:
        prepare = self.candidates[index].prepare
        if prepare is not None:
            prepare()

    def run(self, index: int) -> Any:
        return self.candidates[index].fn()


def _apply_speedup_threshold(
    winner: Any, default: Any, timings: dict[Any, float], threshold: float
) -> Any:
    # The rule of autotune_select_algorithm's min_speedup_threshold: a
    # decomposition must beat the eager default by the given factor.
    if (
        winner is default
        or threshold <= 1.0
        or timings[default] / timings[winner] >= threshold
    ):
        return winner
    return default


def _report(
    node: ir.CollectiveMultiTemplateBuffer, winner: Any, timings: dict[Any, float]
) -> Any:
    # The hooks autotune_select_algorithm calls after benchmarking, so that
    # tools built on them see both paths alike.  The timings are the agreed
    # ones (with the epilogue under this path), the same on every rank.
    from torch._inductor.select_algorithm import get_algorithm_selector_cache

    def profiled_time_fn(choices_override: Any = None) -> dict[Any, float]:
        raise NotImplementedError(
            "collective choices are only timed by their whole group, in lock-step"
        )

    for feedback in get_algorithm_selector_cache().feedback_saver_fns:
        feedback(
            timings,
            node.op_name,
            list(node.original_inputs),
            node.choices,
            profiled_time_fn,
            {},
        )
    return V.choices.override_best_choice(winner, timings)


# --- replacing a node with its winner ----------------------------------------------
def _inline_winner(
    node: ir.CollectiveMultiTemplateBuffer, winner: Any
) -> tuple[list[ir.Operation], ir.OperationBuffer]:
    from torch._inductor.codegen.subgraph import inline_subgraph_to_ir_nodes

    registered = len(V.graph.operations)
    # Lowering code reads the FX node being lowered; outside of lowering it is
    # the node's own.
    with (
        ir.IRNode.current_origins(node.origins),
        # None when the node was made outside lowering: as there, no FX node.
        V.set_current_node(node.fx_node),  # type: ignore[arg-type]
    ):
        if getattr(winner, "gm", None) is not None:
            result = inline_subgraph_to_ir_nodes(
                winner.gm, list(node.original_inputs), node.op_name
            )
            layout = node.layout
            assert isinstance(layout, ir.Layout)  # it is constructed with one
            out_buffer = _materialize(result, layout)
            if winner.config_patches:
                for op in V.graph.operations[registered:]:
                    op.set_config_patches(winner.config_patches.copy())
        else:
            out_buffer = winner.output_node().data.data
            out_buffer.layout = node.layout
    log.debug(
        "collective node %s: inlined %s",
        node.get_name(),
        getattr(winner, "name", winner),
    )
    return V.graph.operations[registered:], out_buffer


def _materialize(result: ir.TensorBox, layout: ir.Layout) -> ir.ComputedBuffer:
    # A pointwise copy into the node's layout.  When the winner ends in a
    # pointwise op (not yet realized), the copy *is* that op, and it fuses
    # with the epilogue like any pointwise node.
    buffer = ir.ComputedBuffer(
        name=None,
        layout=layout,
        data=ir.Pointwise(
            device=layout.device,
            dtype=layout.dtype,
            inner_fn=result.make_loader(),
            ranges=list(layout.size),
        ),
    )
    buffer.name = V.graph.register_buffer(buffer)
    V.graph.register_operation(buffer)
    return buffer


def _splice(
    node: ir.CollectiveMultiTemplateBuffer,
    new_ops: list[ir.Operation],
    out_buffer: ir.OperationBuffer,
) -> None:
    # The winner's operations take the node's place in program order (comm
    # ordering depends on it) and its output takes the node's names (users,
    # graph outputs and the wrapper refer to the node by name).
    graph = V.graph
    for op in new_ops:
        graph.operations.remove(op)
    del graph.name_to_buffer[out_buffer.get_name()]
    del graph.name_to_op[out_buffer.get_operation_name()]
    out_buffer.name = node.get_name()
    out_buffer.operation_name = node.get_operation_name()
    graph.name_to_buffer[out_buffer.name] = out_buffer
    graph.name_to_op[out_buffer.operation_name] = out_buffer
    graph.buffers.remove(out_buffer)
    graph.buffers[graph.buffers.index(node)] = out_buffer
    position = graph.operations.index(node)
    graph.operations[position : position + 1] = new_ops
