"""Exact-equivalent implementations of the collectives, to autotune among.

Registers several ways to compute all_reduce, all_gather, reduce_scatter or
all_to_all from the functional collectives for a custom op's autotuning, in
one call::

    @torch.library.custom_op("mylib::all_reduce", mutates_args=())
    def all_reduce(x: torch.Tensor, group_name: str) -> torch.Tensor: ...


    register_collective_implementations(all_reduce, "all_reduce")

An implementation takes ``(x, group_name)`` and returns what the collective
returns along dim 0; sums only.  On a gloo group a chunked implementation
keeps one collective in flight.  Conventions, exactness and chunking:
``docs/modules.md``, "collective_implementations.py".
"""

from __future__ import annotations

from typing import Any, cast, TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch._inductor.runtime.collective_benchmarking.channel_builder import (
    served_backends,
)
from torch._inductor.runtime.collective_benchmarking.known_crashes import known_crash

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from torch.distributed.distributed_c10d import GroupName


__all__ = [
    "IMPLEMENTATIONS",
    "register_collective_implementations",
]

_funcol = torch.ops._c10d_functional
_ALL_GATHER = "_c10d_functional::all_gather_into_tensor"


def _wait(tensor: torch.Tensor) -> torch.Tensor:
    return _funcol.wait_tensor(tensor)


def _size(group_name: str) -> int:
    from torch.distributed.distributed_c10d import _get_group_size_by_name

    # cast, not GroupName(): Dynamo traces this (as _functional_collectives does)
    return _get_group_size_by_name(cast("GroupName", group_name))


def _rank(group_name: str) -> int:
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(cast("GroupName", group_name)).rank()


def _padded_flat(x: torch.Tensor, multiple: int) -> torch.Tensor:
    flat = x.reshape(-1)
    return F.pad(flat, (0, -flat.numel() % multiple))


def _all_to_all(x: torch.Tensor, group_name: str) -> torch.Tensor:
    # Equal slices of dim 0 to every rank.
    splits = [x.shape[0] // _size(group_name)] * _size(group_name)
    return _wait(_funcol.all_to_all_single(x, splits, splits, group_name))


def _backend(group_name: str, device: torch.device) -> str | None:
    # The backend that serves device's tensors on the group, which a
    # "cpu:gloo,cuda:nccl" group's backend name does not say.
    from torch.distributed.distributed_c10d import _resolve_process_group

    group = _resolve_process_group(cast("GroupName", group_name))
    return served_backends(group).get(device.type)


def _all_gather(x: torch.Tensor, world: int, group_name: str) -> torch.Tensor:
    # The functional all_gather, not yet waited for; where the group's backend
    # is known to crash on it for x's device (gloo with CUDA tensors), an
    # all_to_all that sends every peer a full copy of x, which moves the
    # same values into the same places.
    if known_crash(_backend(group_name, x.device), x.device.type, [_ALL_GATHER]):
        return _funcol.all_to_all_single(
            torch.cat([x] * world),
            [x.shape[0]] * world,
            [x.shape[0]] * world,
            group_name,
        )
    return _funcol.all_gather_into_tensor(x, world, group_name)


def _pipelined(
    pieces: Sequence[torch.Tensor],
    issue: Callable[[torch.Tensor], torch.Tensor],
    in_flight: int,
    group_name: str,
) -> list[torch.Tensor]:
    # Issue one collective per piece, waiting for the oldest whenever
    # in_flight of them are outstanding; results in order.  One at a time on
    # gloo (see docs/modules.md, "Memory safety on gloo").
    if pieces and _backend(group_name, pieces[0].device) == "gloo":
        in_flight = 1
    pending: list[torch.Tensor] = []
    done: list[torch.Tensor] = []
    for piece in pieces:
        if len(pending) == max(1, in_flight):
            done.append(_wait(pending.pop(0)))
        pending.append(issue(piece))
    return done + [_wait(tensor) for tensor in pending]


# --- all_reduce (sum) ---------------------------------------------------------------
def all_reduce_direct(x: torch.Tensor, group_name: str) -> torch.Tensor:
    """The backend's all_reduce."""
    return _wait(_funcol.all_reduce(x, "sum", group_name))


def all_reduce_reduce_scatter_all_gather(
    x: torch.Tensor, group_name: str
) -> torch.Tensor:
    """Each rank reduces one shard, then the shards are gathered: bandwidth-bound sizes."""
    world = _size(group_name)
    flat = _padded_flat(x, world)
    shard = _wait(_funcol.reduce_scatter_tensor(flat, "sum", world, group_name))
    full = _wait(_all_gather(shard, world, group_name))
    return full[: x.numel()].view_as(x)


def all_reduce_all_gather_sum(x: torch.Tensor, group_name: str) -> torch.Tensor:
    """Every rank gathers every input and sums locally: one collective, for latency-bound sizes."""
    world = _size(group_name)
    gathered = _wait(_all_gather(x.reshape(1, -1), world, group_name))
    return gathered.sum(0).view_as(x)


def all_reduce_chunked(
    x: torch.Tensor, group_name: str, chunks: int = 4, in_flight: int = 2
) -> torch.Tensor:
    """``chunks`` all_reduces of pieces of ``x``, at most ``in_flight`` outstanding (one on gloo)."""
    pieces = x.reshape(-1).tensor_split(chunks)
    reduced = _pipelined(
        pieces,
        lambda piece: _funcol.all_reduce(piece, "sum", group_name),
        in_flight,
        group_name,
    )
    return torch.cat(reduced).view_as(x)


# --- all_gather ---------------------------------------------------------------------
def all_gather_direct(x: torch.Tensor, group_name: str) -> torch.Tensor:
    """The backend's all_gather."""
    return _wait(_all_gather(x, _size(group_name), group_name))


def all_gather_all_to_all(x: torch.Tensor, group_name: str) -> torch.Tensor:
    """An all_to_all in which every rank sends every peer a full copy of ``x``."""
    world = _size(group_name)
    return _all_to_all(x.repeat(world, *([1] * (x.dim() - 1))), group_name)


def all_gather_all_reduce(x: torch.Tensor, group_name: str) -> torch.Tensor:
    """Every rank puts ``x`` in its own slot of zeros and the slots are summed (``-0.0`` becomes ``+0.0``)."""
    world, rank = _size(group_name), _rank(group_name)
    slots = x.new_zeros((world, *x.shape))
    slots = torch.cat([slots[:rank], x.unsqueeze(0), slots[rank + 1 :]])
    return _wait(_funcol.all_reduce(slots, "sum", group_name)).view(
        world * x.shape[0], *x.shape[1:]
    )


def all_gather_chunked(
    x: torch.Tensor, group_name: str, chunks: int = 2, in_flight: int = 2
) -> torch.Tensor:
    """``chunks`` all_gathers of pieces of dim 0, at most ``in_flight`` outstanding (one on gloo)."""
    world = _size(group_name)
    pieces = x.tensor_split(chunks)
    gathered = _pipelined(
        pieces,
        lambda piece: _all_gather(piece, world, group_name),
        in_flight,
        group_name,
    )
    # Piece j gathered is [rank 0's piece j, rank 1's piece j, ...]: regroup by rank.
    per_rank = [g.view(world, -1, *x.shape[1:]) for g in gathered]
    return torch.cat(per_rank, dim=1).view(world * x.shape[0], *x.shape[1:])


# --- reduce_scatter (sum) -----------------------------------------------------------
def reduce_scatter_direct(x: torch.Tensor, group_name: str) -> torch.Tensor:
    """The backend's reduce_scatter."""
    return _wait(_funcol.reduce_scatter_tensor(x, "sum", _size(group_name), group_name))


def reduce_scatter_all_to_all_sum(x: torch.Tensor, group_name: str) -> torch.Tensor:
    """An all_to_all hands this rank every peer's shard, summed locally."""
    world = _size(group_name)
    shards = _all_to_all(x, group_name)
    return shards.view(world, x.shape[0] // world, *x.shape[1:]).sum(0)


def reduce_scatter_all_reduce(x: torch.Tensor, group_name: str) -> torch.Tensor:
    """All of ``x`` is reduced and this rank keeps its shard."""
    world, rank = _size(group_name), _rank(group_name)
    reduced = _wait(_funcol.all_reduce(x, "sum", group_name))
    return reduced.view(world, x.shape[0] // world, *x.shape[1:])[rank]


# --- all_to_all ---------------------------------------------------------------------
def all_to_all_direct(x: torch.Tensor, group_name: str) -> torch.Tensor:
    """The backend's all_to_all, equal slices of dim 0."""
    return _all_to_all(x, group_name)


def all_to_all_chunked(
    x: torch.Tensor, group_name: str, chunks: int = 2, in_flight: int = 2
) -> torch.Tensor:
    """Every rank's slice cut in ``chunks`` pieces, one all_to_all per piece, at most ``in_flight`` outstanding (one on gloo)."""
    world = _size(group_name)
    slices = x.view(world, x.shape[0] // world, *x.shape[1:])
    pieces = [
        piece.reshape(-1, *x.shape[1:]) for piece in slices.tensor_split(chunks, dim=1)
    ]

    def splits(piece: torch.Tensor) -> list[int]:
        return [piece.shape[0] // world] * world

    exchanged = _pipelined(
        pieces,
        lambda piece: _funcol.all_to_all_single(
            piece, splits(piece), splits(piece), group_name
        ),
        in_flight,
        group_name,
    )
    per_rank = [e.view(world, -1, *x.shape[1:]) for e in exchanged]
    return torch.cat(per_rank, dim=1).view_as(x)


def all_to_all_all_gather(x: torch.Tensor, group_name: str) -> torch.Tensor:
    """Every rank gathers every input and keeps its own slices: one collective, ``world`` times the data."""
    world, rank = _size(group_name), _rank(group_name)
    gathered = _wait(_all_gather(x, world, group_name))
    return gathered.view(world, world, x.shape[0] // world, *x.shape[1:])[
        :, rank
    ].reshape(x.shape)


# kind -> implementation name -> (function, parameters given at registration)
IMPLEMENTATIONS: dict[
    str, dict[str, tuple[Callable[..., torch.Tensor], dict[str, Any]]]
] = {
    "all_reduce": {
        "direct": (all_reduce_direct, {}),
        "reduce_scatter_all_gather": (all_reduce_reduce_scatter_all_gather, {}),
        "all_gather_sum": (all_reduce_all_gather_sum, {}),
        "chunked": (all_reduce_chunked, {"chunks": 4, "in_flight": 2}),
    },
    "all_gather": {
        "direct": (all_gather_direct, {}),
        "all_to_all": (all_gather_all_to_all, {}),
        "all_reduce": (all_gather_all_reduce, {}),
        "chunked": (all_gather_chunked, {"chunks": 2, "in_flight": 2}),
    },
    "reduce_scatter": {
        "direct": (reduce_scatter_direct, {}),
        "all_to_all_sum": (reduce_scatter_all_to_all_sum, {}),
        "all_reduce": (reduce_scatter_all_reduce, {}),
    },
    "all_to_all": {
        "direct": (all_to_all_direct, {}),
        "chunked": (all_to_all_chunked, {"chunks": 2, "in_flight": 2}),
        "all_gather": (all_to_all_all_gather, {}),
    },
}


def register_collective_implementations(
    custom_op: Any,
    kind: str,
    names: Sequence[str] | None = None,
    **autotuning_kwargs: Any,
) -> list[str]:
    """Register the library's implementations of ``kind`` for ``custom_op``'s autotuning.

    ``custom_op`` (a ``torch.library.custom_op`` or an ``OpOverload``) must
    take ``(x: Tensor, group_name: str)`` and compute the collective ``kind``
    (a key of :data:`IMPLEMENTATIONS`) over the named group, following this
    module's conventions; its own implementation stays the default that the
    others must beat.  ``names`` selects implementations (default: all);
    ``autotuning_kwargs`` go to ``register_custom_op_autotuning``.  Returns
    the registered implementations' names, in order.  Every rank must
    register the same implementations: they are compared by name and graph.
    """
    from torch._inductor.kernel.custom_op import (
        CustomOpConfig,
        register_custom_op_autotuning,
    )

    if kind not in IMPLEMENTATIONS:
        raise ValueError(
            f"unknown collective {kind!r}; expected one of {sorted(IMPLEMENTATIONS)}"
        )
    available = IMPLEMENTATIONS[kind]
    names = list(available) if names is None else list(names)
    unknown = [name for name in names if name not in available]
    if unknown:
        raise ValueError(
            f"unknown {kind} implementations {unknown}; expected some of {list(available)}"
        )
    configs = [
        CustomOpConfig(available[name][0], **available[name][1]) for name in names
    ]
    register_custom_op_autotuning(custom_op, configs=configs, **autotuning_kwargs)
    return names
