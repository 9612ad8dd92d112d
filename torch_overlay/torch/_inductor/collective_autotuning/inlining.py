"""Replacing a deferred collective node by the operations of its agreed winner.

Under the scheduler path (``deferral.py``), a collective custom
op is lowered to an :class:`~torch._inductor.ir.CollectiveMultiTemplateBuffer`
holding every choice; once its group has agreed on a winner, the node must
become the winner's operations, as if the op had been lowered to them in the
first place.  This module does that, in two steps that the caller keeps
apart:

* :func:`inline_winners` lowers the winner (a choice's graph, inlined with
  ``inline_subgraph_to_ir_nodes`` as V1 does at lowering; an extern kernel;
  or a range dispatch's ``lower`` with the winner of each range) and
  registers its operations at the end of ``V.graph.operations``.  It runs in
  the state the op was lowered in (:func:`_lowering_of`): lowering code reads
  the FX node being lowered and the origins, and a call of the op itself
  inside a winner (the graph of a config without a decomposition, a range
  won by the eager default) must lower as the op, not be deferred again
  after its group's session is over.
* :func:`splice` moves those operations to the node's place in program order
  (comm ordering depends on it) and gives their output the node's buffer and
  operation names (its users, the graph's outputs and the wrapper refer to
  the node by name); that output is the winner's own result buffer where it
  can be, as V1 hands it to the op's users, with no copy.

Every winner of a graph is inlined before any is spliced: operation names
come from the length of ``V.graph.operations``, which must not shrink while
operations are still being registered.
"""

from __future__ import annotations

import contextlib
from typing import Any, TYPE_CHECKING

from torch._inductor import ir
from torch._inductor.codegen.subgraph import inline_subgraph_to_ir_nodes
from torch._inductor.scheduler import _replace_operation_buffer
from torch._inductor.virtualized import V
from torch.utils._ordered_set import OrderedSet


if TYPE_CHECKING:
    from collections.abc import Iterator

    from torch._inductor.codegen.wrapper import PythonWrapperCodegen


__all__ = ["inline_winners", "splice"]


@contextlib.contextmanager
def _lowering_of(node: ir.CollectiveMultiTemplateBuffer) -> Iterator[None]:
    # The state the op's lowering ran in.  Lowering code reads the FX node
    # being lowered; outside of lowering it is the node's own.  And while the
    # op's autotuning lowering runs, a call of the op itself (the graph of a
    # config without a decomposition, a range won by the eager default)
    # lowers as the op, not through that lowering again (graph.py's recursion
    # guard), which would defer it anew, past its group's session.
    target = node.fx_node.target if node.fx_node is not None else None
    guarded = OrderedSet([*V.active_user_lowering_ops, target])
    with (
        ir.IRNode.current_origins(node.origins),
        # None when the node was made outside lowering: as there, no FX node.
        V.set_current_node(node.fx_node),  # type: ignore[arg-type]
        V.set_active_user_lowering_ops(guarded),
    ):
        yield


def inline_winners(
    node: ir.CollectiveMultiTemplateBuffer, winners: list[Any]
) -> tuple[list[ir.Operation], ir.OperationBuffer]:
    """Lower ``node``'s winners and register their operations in ``V.graph``.

    ``winners`` holds the agreed winning choice, or the winner of each range
    of a range-dispatched node in its ranges' order.  Returns the operations
    registered, and the buffer among them that is to take the node's place
    (see :func:`splice`).  Raises ``RuntimeError`` when a range dispatch
    cannot be lowered without adding guards.
    """
    registered = len(V.graph.operations)
    layout = node.layout
    assert isinstance(layout, ir.Layout)  # it is constructed with one
    winner = winners[0]
    with _lowering_of(node):
        if node.range_dispatch is not None:
            result = node.range_dispatch.lower(winners)
        elif getattr(winner, "gm", None) is None:
            # The op's eager default, an extern kernel, whose buffer takes the
            # node's layout as in upstream's finalize_multi_template_buffers.
            out_buffer = winner.output_node().data.data
            out_buffer.layout = layout
            return V.graph.operations[registered:], out_buffer
        else:
            result = inline_subgraph_to_ir_nodes(
                winner.gm, list(node.original_inputs), node.op_name
            )
        if result is None:
            # Every rank traces the same dispatch: all raise alike.
            raise RuntimeError(
                f"the range dispatch of {node.op_name} adds guards; "
                "it cannot be lowered once its ranges are decided"
            )
        out_buffer = _materialize(result, layout, registered)
    if node.range_dispatch is None and winner.config_patches:
        # As V1 inlines a choice: under its config patches.
        for op in V.graph.operations[registered:]:
            op.set_config_patches(winner.config_patches.copy())
    return V.graph.operations[registered:], out_buffer


def _materialize(
    result: ir.TensorBox, layout: ir.Layout, registered: int
) -> ir.OperationBuffer:
    # No copy where the winner's own operations (from ``registered`` on) made
    # its result buffer, laid out as the node or free to be, or a view of it
    # that indexes like the node: a graph input or an earlier buffer keeps
    # its name.
    new = V.graph.operations[registered:]
    data = result.data
    buffer = data.data if isinstance(data, ir.StorageBox) else None
    if isinstance(buffer, ir.OperationBuffer) and any(op is buffer for op in new):
        own = buffer.layout
        if isinstance(own, ir.FlexibleLayout):
            own = ir.FixedLayout(own.device, own.dtype, own.size, layout.stride)
        if isinstance(own, ir.FixedLayout) and _key(own) == _key(layout):
            buffer.layout = own
            return buffer
    if (
        isinstance(data, ir.ReinterpretView)
        and isinstance(data.data, ir.StorageBox)
        and any(op is data.data.data for op in new)
        and _key(data.layout)[:4] == _key(layout)[:4]
    ):
        # The users of the node index it by its layout, which the view has at
        # an offset of its own: the node's name can be that view.
        return _ViewOfWinner(data)
    # Otherwise a pointwise copy into the node's layout.  When the winner ends
    # in a pointwise op (not yet realized), the copy *is* that op, and it fuses
    # with the epilogue like any pointwise node.
    copy = ir.Pointwise(
        device=layout.device,
        dtype=layout.dtype,
        inner_fn=result.make_loader(),
        ranges=list(layout.size),
    )
    buffer = ir.ComputedBuffer(name=None, layout=layout, data=copy)
    buffer.name = V.graph.register_buffer(buffer)
    V.graph.register_operation(buffer)
    return buffer


class _ViewOfWinner(ir.ExternKernel):
    """The node's buffer made a view of a buffer that its winner made.

    V1 hands such a view (a reshape, a slice) to the op's users, which read
    through it with no kernel; here the users read the node's buffer, which
    is that view (``reinterpret_tensor``) where a copy would be a kernel.
    Its ``NonOwningLayout`` keeps the winner's buffer alive as long as the
    view is used and tells kernels whether the view is aligned.
    """

    def __init__(self, view: ir.ReinterpretView) -> None:
        super().__init__(None, ir.NonOwningLayout(view), [view.unwrap_view()])
        self.view = view
        self.name = V.graph.register_buffer(self)
        V.graph.register_operation(self)

    def codegen(self, wrapper: PythonWrapperCodegen) -> None:
        # A line of its own, not an allocation: the wrapper drops allocations
        # that end its code, and this view may be the program's output.
        wrapper.codegen_deferred_allocation(self.get_name(), self.view)


def _key(layout: ir.Layout) -> tuple[Any, ...]:
    # What Layout.__eq__ compares; sizes and strides may be lists or tuples.
    return layout.device, layout.dtype, [*layout.size], [*layout.stride], layout.offset


def splice(
    node: ir.CollectiveMultiTemplateBuffer,
    new_ops: list[ir.Operation],
    out_buffer: ir.OperationBuffer,
) -> None:
    """Put ``new_ops`` in ``node``'s place, ``out_buffer`` under its names.

    ``new_ops`` and ``out_buffer`` are what :func:`inline_winners` returned
    for ``node``; the node leaves ``V.graph``'s operations and buffers.
    """
    # Program order matters to comm ordering; the names to the node's users,
    # the graph's outputs and the wrapper.  The scheduler's own swap of a
    # MultiTemplateBuffer for its winner moves the buffer and the names; the
    # winner's other operations go in before it.
    _rename(new_ops, out_buffer.get_name(), node.get_name())
    operations = V.graph.operations
    for op in new_ops:
        if op is not out_buffer:
            operations.remove(op)
    _replace_operation_buffer(node, out_buffer)
    position = operations.index(out_buffer)
    operations[position : position + 1] = new_ops


# The graph's records of buffers by name that are read after lowering.
_RECORDS = ["mutated_buffers", "unaligned_buffers", "no_fuse_buffer_names"]
_RECORDS += ["never_reuse_buffers", "never_reuse_but_free_buffers"]
_RECORDS += ["buffer_to_padded_size", "buffer_layout_constraints"]


def _rename(new_ops: list[ir.Operation], old: str, new: str) -> None:
    # Where the winner's buffer is named by string: its operations (an in-place
    # all_reduce_ and its wait_tensor) and the graph's records, none else.
    for op in new_ops:
        lists = [op.alias_names] if isinstance(op, ir.FallbackKernel) else []
        for buffer in op.get_outputs():
            if isinstance(buffer, (ir.MutationOutput, ir.OrderingBarrier)):
                lists.append(buffer.mutation_names)
        for names in lists:
            names[:] = [new if name == old else name for name in names]
    for attribute in _RECORDS:
        records = getattr(V.graph, attribute)
        if isinstance(records, dict) and old in records:
            records[new] = records.pop(old)
        elif old in records:
            records.discard(old)
            records.add(new)
