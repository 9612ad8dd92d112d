"""Deferred autotuning (V2) of custom ops whose implementations contain collectives.

The lowering returns a :class:`~torch._inductor.ir.CollectiveMultiTemplateBuffer`
holding every candidate (:func:`defer_collective_choices`, of every range
for a range-dispatched op); the scheduler tunes it (``deferred_tuning.py``).  Why before fusion, dynamic
shapes, range dispatch and identical nodes: ``docs/modules.md``,
"deferral.py".
"""

from __future__ import annotations

import dataclasses
from typing import Any, TYPE_CHECKING

from torch._inductor import config, ir
from torch._inductor.collective_autotuning.settings import deferral_requested
from torch._inductor.virtualized import V


if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import torch
    from torch._inductor.kernel.custom_op import RangeBounds


__all__ = [
    "CollectiveRange",
    "defer_collective_choices",
    "deferral_enabled",
    "RangeDispatch",
]


def deferral_enabled() -> bool:
    """Whether collective choices are left to the scheduler (V2) in this compile.

    Not in deterministic mode: Inductor then benchmarks nothing whose outcome
    can differ between runs (``runtime.benchmarking.may_ban_benchmarking``),
    and the lowering path takes the op's eager default without a session,
    as ``autotune_select_algorithm`` does for every op.
    """
    return (
        deferral_requested()
        and not config.deterministic
        and config.test_configs.force_custom_op_decomposition is None
    )


@dataclasses.dataclass(frozen=True)
class CollectiveRange:
    """One range of sizes of a range-dispatched op, and the choices benchmarked for it.

    ``input_gen_fns`` (by tensor-input index) make benchmark inputs whose
    dispatched dimension is the top of the range; ``name`` is the range's
    autotuning name (the op's, with the range).
    """

    bounds: RangeBounds
    name: str
    choices: list[Any]
    input_gen_fns: dict[int, Callable[[Any], torch.Tensor]]


@dataclasses.dataclass(frozen=True)
class RangeDispatch:
    """How a range-dispatched collective node is lowered once its ranges are decided.

    ``lower`` takes the winning choice of each range, in ``ranges`` order,
    and lowers the dispatch to them (registering its operations in
    ``V.graph``); it returns None when tracing the dispatch adds guards.
    ``on`` names the dispatched size, e.g. ``x.size(0)``.
    """

    on: str
    ranges: list[CollectiveRange]
    lower: Callable[[list[Any]], ir.TensorBox | None]


def defer_collective_choices(
    name: str,
    choices: Sequence[Any],
    inputs: Sequence[ir.IRNode],
    layout: ir.Layout,
    *,
    input_gen_fns: dict[int, Callable[[Any], torch.Tensor]] | None = None,
    min_speedup_threshold: float = 1.0,
    range_dispatch: RangeDispatch | None = None,
) -> ir.TensorBox:
    """The lowering of a collective custom op under V2: a node holding every choice.

    Called while lowering the op's FX node (``V.graph.current_node``), which
    the scheduler uses to find the op's pointwise epilogue.  ``choices`` are
    the op's ``ChoiceCaller``s, the eager default included; of a
    ``range_dispatch``, every range's, whose winners the group agrees on in
    its one session.  ``layout`` is the op's output layout on ``inputs``
    (symbolic where their sizes are).
    """
    buffer = ir.CollectiveMultiTemplateBuffer(
        layout,
        list(inputs),
        list(choices),
        op_name=name,
        input_gen_fns=input_gen_fns or {},
        fx_node=V.graph.current_node,
        min_speedup_threshold=min_speedup_threshold,
        range_dispatch=range_dispatch,
    )
    return ir.TensorBox.create(buffer)
