"""What a choice's graph says of its collectives: which, and on which group.

Read alike on every rank from the same graph, so that the join can compare
the collectives of each candidate across ranks (a choice whose collectives
differ between ranks is disqualified instead of desynchronizing the others).
On gloo, also how many collectives it keeps in flight at once
(:func:`collectives_in_flight`).
"""

from __future__ import annotations

import operator
from typing import Any, cast, TYPE_CHECKING

import torch
from torch._inductor.runtime.collective_benchmarking.types import (
    CollectiveBenchmarkError,
    digest,
)


if TYPE_CHECKING:
    from collections.abc import Sequence


__all__ = [
    "collective_group_name",
    "collective_ops",
    "collective_signature",
    "collectives_in_flight",
    "is_collective",
]


# symm_mem: symmetric-memory collectives (one_shot_all_reduce, ...) and the
# puts, gets and signals that pair up across ranks.
_COLLECTIVE_NAMESPACES = (
    "_c10d_functional",
    "_c10d_functional_autograd",
    "c10d",
    "symm_mem",
)


def is_collective(node: torch.fx.Node) -> bool:
    """Whether ``node`` calls a collective or waits for one (c10d, functional or not).

    The one detector of collective autotuning: custom_op's gate and the
    protocol both read a choice's graph through it.
    """
    # Not torch._inductor.utils.is_collective, which reads IR nodes, nor
    # is_collective_op, a fixed list of functional ops without their
    # coalesced, broadcast and _out variants, the waits or c10d's own ops:
    # any of these in a candidate's graph must keep the ranks in lock-step.
    return (
        node.op == "call_function"
        and getattr(node.target, "namespace", None) in _COLLECTIVE_NAMESPACES
    )


def _collective_nodes(choice: Any) -> list[torch.fx.Node]:
    gm = getattr(choice, "gm", None)
    return [] if gm is None else [n for n in gm.graph.nodes if is_collective(n)]


def _group_of(node: torch.fx.Node) -> str | None:
    # The group_name argument of a collective node, positional or by keyword.
    if "group_name" in node.kwargs:
        return str(node.kwargs["group_name"])
    schema = cast("torch._ops.OpOverload", node.target)._schema
    # node.args omits trailing defaulted arguments: pairs up to its end.
    for argument, value in zip(schema.arguments, node.args, strict=False):
        if argument.name == "group_name":
            return str(value)
    return None


def collective_group_name(choices: Sequence[Any]) -> str | None:
    """The process group the collectives of ``choices`` run on, read from their graphs.

    ``None`` when no graph names a group.  Raises :class:`CollectiveBenchmarkError`
    (on every rank alike: the graphs are the same everywhere) when candidates
    use different groups, since one benchmark cannot hold them in lock-step.
    """
    names: dict[str, str] = {}
    for choice in choices:
        for node in _collective_nodes(choice):
            group = _group_of(node)
            if group is not None:
                names.setdefault(group, getattr(choice, "name", "?"))
    if len(names) > 1:
        raise CollectiveBenchmarkError(
            "collective autotuning: the candidates of one op must use one process "
            f"group, found {sorted(names)} (first seen in {sorted(names.values())})"
        )
    return next(iter(names), None)


def collective_signature(choice: Any) -> str:
    """A digest of the collectives ``choice`` issues, in order, with their operands' shapes.

    Equal on every rank for a choice that keeps the ranks in lock-step;
    rank-dependent values that do not change the collectives (which slot is
    this rank's) leave it equal.  "" for a choice without a graph (the op's
    eager implementation, which the program runs anyway).
    """

    def describe(value: Any) -> str:
        if isinstance(value, torch.fx.Node):
            meta = value.meta.get("val")
            if isinstance(meta, torch.Tensor):
                return f"T{tuple(meta.shape)}:{meta.dtype}"
            return "node"
        return repr(value)

    calls = [
        f"{node.target}{torch.fx.node.map_aggregate(node.args, describe)}"
        for node in _collective_nodes(choice)
        if "wait_tensor" not in str(node.target)
    ]
    # How many collectives it keeps in flight decides, on gloo, whether it may
    # run (see collectives_in_flight): the join compares it with the rest.
    in_flight = collectives_in_flight(choice)
    if in_flight > 1:
        calls.append(f"{in_flight} in flight")
    return digest("\n".join(calls)) if calls else ""


def collective_ops(choice: Any) -> frozenset[str]:
    """The collective ops ``choice``'s graph calls, as ``namespace::name``.

    Empty for a choice without a graph (the op's eager implementation).
    The same on every rank for the same graph: the join compares the
    collectives through :func:`collective_signature`.
    """
    return frozenset(
        cast("torch._ops.OpOverload", node.target)._schema.name
        for node in _collective_nodes(choice)
    )


def collectives_in_flight(choice: Any) -> int:
    """The most functional collectives ``choice``'s graph keeps in flight at once on one group.

    A collective is in flight from the node that issues it to the first
    ``wait_tensor`` of its output (of any of its outputs, for a coalesced
    one).  0 for a choice without a graph (the op's eager implementation).
    The same on every rank for the same graph; the join compares it (it is
    part of :func:`collective_signature`).

    Two on one gloo group can corrupt the heap: ProcessGroupGloo's worker
    threads each store the name of the work they finished into a status
    string shared by the group, without a lock, and two that finish together
    free the same buffer (torch 2.15.0; see ``docs/modules.md``,
    "Memory safety on gloo").
    """
    gm = getattr(choice, "gm", None)
    if gm is None:
        return 0
    functional = torch.ops._c10d_functional
    issued_by: dict[torch.fx.Node, torch.fx.Node] = {}  # an output -> its collective
    pending: dict[str | None, set[torch.fx.Node]] = {}  # group -> collectives
    group_of: dict[torch.fx.Node, str | None] = {}
    most = 0
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is operator.getitem and node.args[0] in issued_by:
            issued_by[node] = issued_by[node.args[0]]
        elif node.target in (functional.wait_tensor, functional.wait_tensor.default):
            collective = issued_by.get(node.args[0])
            if collective is not None:
                pending[group_of[collective]].discard(collective)
        elif getattr(node.target, "namespace", None) == "_c10d_functional":
            group = group_of[node] = _group_of(node)
            issued_by[node] = node
            in_flight = pending.setdefault(group, set())
            in_flight.add(node)
            most = max(most, len(in_flight))
    return most
