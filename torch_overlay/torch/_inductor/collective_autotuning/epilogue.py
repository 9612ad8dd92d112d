"""The pointwise epilogue a deferred collective choice is timed with.

Under the scheduler path (``deferred_tuning.py``), the candidates of a
collective custom op can be timed together with the op's *epilogue*: the
chain of pointwise single users that follows the op in the post-grad graph.
A candidate whose tail may fuse with it (generated code: a pointwise op, a
reduction, ...) is compiled together with the epilogue, so its tail is timed
fused with it, as it will run once inlined; a candidate whose output comes
from an op Inductor generates no code for (a collective's wait, the eager
default) keeps its own compilation, the one V1 times, and is followed by the
epilogue compiled alone, a kernel of its own, as it will run too.

The epilogue can only change the candidates' order when their tails meet it
differently: some fuse with it, others do not (:class:`TailFusion`, read
from each candidate's last op).  When every candidate's tail is alike in
that respect (none can fuse, or each is pointwise code that the epilogue
fuses into), the epilogue adds the same work to every candidate: the
candidates are then timed alone, with no epilogue compilation, measuring
what V1 measures, under V1's key (so that the two paths share decisions).

Sizes may be symbolic (a dynamic-shape graph): the epilogue's layout is the
graph's, and candidates compiled with it are benchmarked at the size hints,
like every deferred candidate.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from typing import Any, TYPE_CHECKING

import torch
from torch._inductor import config, ir
from torch._inductor.collective_autotuning.choices import compile_as_candidate
from torch._inductor.collective_autotuning.collective_graphs import is_collective
from torch._inductor.runtime.collective_benchmarking.rules import first_tensor
from torch._inductor.utils import convert_shape_to_inductor
from torch._inductor.virtualized import V


if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from torch._inductor.runtime.collective_benchmarking.types import Candidate


__all__ = [
    "Epilogue",
    "epilogue_to_time_with",
    "tail_fusion",
    "TailFusion",
    "time_with_epilogue",
]


# Pointwise arithmetic whose generated code does not depend on the value of a
# scalar operand (one instruction whatever the constant), so that nodes whose
# epilogues differ only in such constants measure the same thing.  Any other
# constant (an exponent, a rounding mode, a clamp bound that may fold) stays
# in the key.  Value-dependent simplifications (x + 0, x * 1) are made by the
# post-grad passes, before the epilogue is read.
_VALUE_FREE_SCALAR_OPS = frozenset(
    {
        torch.ops.aten.add,
        torch.ops.aten.sub,
        torch.ops.aten.mul,
        torch.ops.aten.div,
        torch.ops.aten.rsub,
    }
)


@dataclasses.dataclass
class Epilogue:
    """The pointwise single-user chain after a collective node, as a graph of its own."""

    gm: torch.fx.GraphModule  # (node output, *extra inputs) -> epilogue output
    extra_inputs: list[ir.IRNode]
    layout: ir.FixedLayout
    key: str  # its ops, for names and logs

    @staticmethod
    def find(node: ir.CollectiveMultiTemplateBuffer) -> Epilogue | None:
        """The epilogue of ``node`` in the graph being lowered; None when it has none."""
        fx_node = node.fx_node
        if fx_node is None:
            return None
        chain: list[torch.fx.Node] = []
        extras: dict[torch.fx.Node, ir.IRNode] = {}
        current = fx_node
        while len(current.users) == 1:
            (user,) = current.users
            if not (
                user.op == "call_function"
                and isinstance(user.target, torch._ops.OpOverload)
                and torch.Tag.pointwise in user.target.tags
                and isinstance(user.meta.get("val"), torch.Tensor)
            ):
                break
            lowered = {
                arg: _lowered_input(arg)
                for arg in user.all_input_nodes
                if arg is not current and arg not in extras
            }
            if any(value is None for value in lowered.values()):
                break
            extras.update((arg, v) for arg, v in lowered.items() if v is not None)
            chain.append(user)
            current = user
        if not chain:
            return None
        # Its nodes are named after their ops, in order (not after the nodes
        # they copy): nodes followed by equal chains get equal graphs.
        graph = torch.fx.Graph()
        env = {fx_node: graph.placeholder("collective_output")}
        for i, arg in enumerate(extras):
            env[arg] = graph.placeholder(f"epilogue_input_{i}")
        for user in chain:
            args, kwargs = torch.fx.map_arg((user.args, user.kwargs), env.__getitem__)
            env[user] = graph.create_node("call_function", user.target, args, kwargs)
        graph.output(env[current])
        value = current.meta["val"]
        layout = ir.FixedLayout(
            device=value.device,
            dtype=value.dtype,
            size=convert_shape_to_inductor(value.shape),
            stride=convert_shape_to_inductor(value.stride()),
        )
        return Epilogue(
            torch.fx.GraphModule(torch.nn.Module(), graph),
            list(extras.values()),
            layout,
            "+".join(str(user.target) for user in chain),
        )

    @property
    def structure(self) -> str:
        """What timing with the epilogue can depend on: its ops, their
        arguments and the layouts of its other inputs.

        Equal for nodes whose epilogues differ only in scalar operands of
        arithmetic whose generated code does the same work whatever their
        value (``y * 0.5 + i``), and the same on every rank.
        """
        parts = [
            f"in{i}:{value.get_size()},{value.get_stride()},{value.get_dtype()}"
            for i, value in enumerate(self.extra_inputs)
        ]
        for node in self.gm.graph.nodes:
            if node.op != "call_function":
                continue
            operands = (node.args, node.kwargs)
            if getattr(node.target, "overloadpacket", None) in _VALUE_FREE_SCALAR_OPS:
                operands = torch.fx.node.map_aggregate(operands, _type_of_scalar)
            parts.append(f"{node.name}={node.target}{operands}")
        return "; ".join(parts)


def _type_of_scalar(value: Any) -> Any:
    # A scalar operand by its type alone (a bool is no arithmetic operand).
    return type(value).__name__ if type(value) in (int, float) else value


class TailFusion(enum.Enum):
    """How a candidate's last op meets a pointwise epilogue once the candidate is inlined."""

    # Pointwise code that Inductor generates: the epilogue fuses into its kernel.
    FUSES = "fuses"
    # A buffer written by an op Inductor generates no code for (a collective
    # or its wait, an extern or fallback kernel, the eager default), or by
    # copies into one buffer (a concatenation on CPU): the epilogue runs as a
    # kernel of its own after it.
    SEPARATE = "separate"
    # Anything else (a reduction, a template, a concatenation on GPU): whether
    # it fuses depends on the backend's scheduling.
    MAYBE = "maybe"


_VIEW_LIKE_OPS = frozenset({torch.ops.aten._unsafe_view.default})


def tail_fusion(choice: Any, device: torch.device | None) -> TailFusion:
    """How ``choice``'s output meets a pointwise epilogue on ``device``.

    Read from the last op of the choice's graph (views are followed back to
    the op that wrote the data), from its target alone: the same on every
    rank for graphs of the same structure, and free of any compilation.
    """
    gm = getattr(choice, "gm", None)
    if gm is None:
        return TailFusion.SEPARATE
    value = gm.graph.output_node().args[0]
    value = value[0] if isinstance(value, (list, tuple)) else value
    while (
        isinstance(value, torch.fx.Node)
        and value.op == "call_function"
        and isinstance(value.target, torch._ops.OpOverload)
        and (value.target.is_view or value.target in _VIEW_LIKE_OPS)
    ):
        value = value.args[0]
    if not isinstance(value, torch.fx.Node) or value.op != "call_function":
        # The candidate returns (a view of) one of its inputs.
        return TailFusion.SEPARATE
    target = value.target
    if is_collective(value):
        return TailFusion.SEPARATE
    if not isinstance(target, torch._ops.OpOverload):
        return TailFusion.MAYBE
    from torch._inductor.lowering import fallbacks, lowerings

    if target not in lowerings or target in fallbacks:
        # No generated code: a custom op (the op itself, for a config without
        # a decomposition), a fallback kernel.
        return TailFusion.SEPARATE
    if torch.Tag.pointwise in target.tags:
        return TailFusion.FUSES
    if (
        target is torch.ops.aten.cat.default
        and device is not None
        and device.type == "cpu"
        and not config.force_pointwise_cat
    ):
        # Lowered to copies into one buffer on CPU (lowering.cat).
        return TailFusion.SEPARATE
    return TailFusion.MAYBE


def epilogue_to_time_with(
    choices: Sequence[Any], epilogue: Epilogue | None, device: torch.device | None
) -> Epilogue | None:
    """The epilogue ``choices`` are timed with; None: each is timed alone.

    ``epilogue`` is ``Epilogue.find`` of their node, ``device`` its device.
    The epilogue is kept only where it can change the ranking: where some
    choice's tail may fuse with it and another's does not, or where whether
    they fuse depends on the backend (see :class:`TailFusion`).
    """
    if epilogue is None:
        return None
    tails = {tail_fusion(choice, device) for choice in choices}
    # Alike tails: the epilogue adds the same kernel to every choice (none
    # fuses), or the same work to each one's last kernel (all fuse).
    if tails in ({TailFusion.SEPARATE}, {TailFusion.FUSES}):
        return None
    return epilogue


def _lowered_input(arg: torch.fx.Node) -> ir.IRNode | None:
    # An epilogue's other inputs become benchmark inputs, so they must be
    # buffers that exist before the op: graph inputs, or values the lowering
    # still holds (the FX interpreter frees a value after its last use).
    if arg.op == "placeholder":
        value = V.graph.graph_inputs.get(str(arg.target))
    else:
        value = V.graph.env.get(arg)
    return value if value is not None and ir.is_storage_and_layout(value) else None


def _trace(fn: Callable[..., Any], *args: Any) -> torch.fx.GraphModule:
    from torch.fx.experimental.proxy_tensor import make_fx

    from torch._inductor.decomposition import select_decomp_table

    return make_fx(
        fn, decomposition_table=select_decomp_table(), tracing_mode="symbolic"
    )(*args)


def _with_epilogue_caller(
    choice: Any, node: ir.CollectiveMultiTemplateBuffer, epilogue: Epilogue
) -> Any:
    """A subgraph choice that runs ``choice`` (``None``: nothing) and then the epilogue."""
    from torch._inductor.codegen.subgraph import SubgraphChoiceCaller

    if choice is None:
        inputs: list[Any] = [ir.TensorBox.create(node)]
        name = f"{node.op_name}_epilogue"
    else:
        inputs = list(choice.input_nodes)
        name = f"{choice.name}_with_epilogue"
    count = len(inputs)

    def run(*args: torch.Tensor) -> Any:
        if choice is not None:  # its output takes the place of its inputs
            args = (torch.fx.Interpreter(choice.gm).run(*args[:count]), *args[count:])
        return torch.fx.Interpreter(epilogue.gm).run(*args)

    # The epilogue's inputs are IRNodes that its lowering held (TensorBoxes).
    input_nodes: list[Any] = [*inputs, *epilogue.extra_inputs]
    return SubgraphChoiceCaller(
        name=name,
        input_nodes=input_nodes,
        layout=epilogue.layout,
        description=f"{name} ({epilogue.key})",
        make_fx_graph=functools.partial(_trace, run),
    )


def time_with_epilogue(
    node: ir.CollectiveMultiTemplateBuffer,
    choices: Sequence[Any],
    candidates: list[Candidate],
    args: Any,
    epilogue: Epilogue,
) -> list[Candidate]:
    """``candidates`` (one per choice, on the inputs ``args``) each followed by ``epilogue``.

    A choice whose tail may fuse with the epilogue is compiled together with
    it; any other keeps its own compilation (the one V1 times) and is
    followed by the epilogue compiled alone, one module for all of them.
    """
    from torch._inductor.select_algorithm import AlgorithmSelectorCache

    inputs, _ = args.get_benchmark_tensors(True).unpack()
    extras = [
        AlgorithmSelectorCache.benchmark_example_value(value)
        for value in epilogue.extra_inputs
    ]
    epilogue_out = AlgorithmSelectorCache.benchmark_example_value(epilogue.layout)
    epilogue_only = None
    timed = []
    fn: Callable[[], Any]
    device = node.get_device()
    for choice, candidate in zip(choices, candidates, strict=True):
        if tail_fusion(choice, device) is not TailFusion.SEPARATE:
            # Compiled together: the candidate's tail fuses with the epilogue
            # exactly as it will once the winner is inlined.
            fused = _with_epilogue_caller(choice, node, epilogue)

            def fn(fused: Any = fused) -> Any:
                return fused.benchmark_collective(*inputs, *extras, out=epilogue_out)

            prepare = compile_as_candidate(fused._ensure_compiled)
        else:
            if epilogue_only is None:
                epilogue_only = _with_epilogue_caller(None, node, epilogue)
            alone = epilogue_only

            def fn(run: Callable[[], Any] = candidate.fn, alone: Any = alone) -> Any:
                return alone.benchmark_collective(
                    first_tensor(run()), *extras, out=epilogue_out
                )

            prepare = _then(
                candidate.prepare, compile_as_candidate(alone._ensure_compiled)
            )
        timed.append(
            dataclasses.replace(
                candidate,
                fn=fn,
                prepare=prepare,
                magnitude=_magnitude_then(
                    epilogue_only, candidate.magnitude, extras, epilogue_out
                ),
            )
        )
    return timed


def _magnitude_then(
    epilogue: Any,
    magnitude: Callable[[], Any] | None,
    extras: Sequence[torch.Tensor],
    like: torch.Tensor,
) -> Callable[[], Any] | None:
    # The default's magnitude (Candidate.magnitude) carried through the
    # epilogue on absolute values: the magnitude of the sums and products
    # that epilogues are made of.
    if epilogue is None or magnitude is None:
        return None

    def run() -> Any:
        absolute = [
            extra.abs() if extra.is_floating_point() else extra for extra in extras
        ]
        return epilogue.benchmark_collective(
            first_tensor(magnitude()), *absolute, out=torch.empty_like(like)
        )

    return run


def _then(
    first: Callable[[], object] | None, second: Callable[[], object]
) -> Callable[[], None]:
    # Both preparations, in order.
    def prepare() -> None:
        if first is not None:
            first()
        second()

    return prepare
