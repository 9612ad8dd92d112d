"""Demo: Inductor autotunes custom ops whose implementations are collectives.

Each of four custom ops -- one per collective kind (all_reduce, all_gather,
reduce_scatter, all_to_all) -- has an eager implementation written with the
``torch.distributed`` APIs (the op's own code, which Inductor keeps as the
default candidate) and two or more alternative decompositions built from
functional collectives, registered with ``register_custom_op_autotuning``.
Every alternative computes the same result through a genuinely different
communication pattern, e.g. an all_reduce as reduce_scatter + all_gather.

When ``torch.compile`` lowers an op, the autotuner benchmarks every candidate
on every rank in lock-step and ranks them by the slowest rank's median time,
so all ranks pick the same winner.  This script

* captures the per-candidate timings with
  ``torch._inductor.select_algorithm.add_feedback_saver``,
* records the candidate each rank's autotuner selected (through the
  ``InductorChoices.override_best_choice`` hook, without changing it),
* checks the compiled op's result against a closed-form expectation and
  that every rank selected the same candidate (exit status 1 otherwise),
* prints, on rank 0, a table of the timings and the speedup of every
  candidate over the default.

Run it on CPU with gloo (``scripts/demo.sh`` wraps this)::

    torchrun --standalone --nproc-per-node 2 scripts/demo_collective_autotuning.py
    torchrun --standalone --nproc-per-node 3 scripts/demo_collective_autotuning.py --ops all_reduce

Timings on a shared CPU are noisy: the winner can change from run to run when
candidates are within a few percent of each other.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist


funcol = torch.ops._c10d_functional


def _world() -> int:
    return dist.get_world_size()


def _group() -> str:
    return dist.group.WORLD.group_name


def _wait(tensor: torch.Tensor) -> torch.Tensor:
    return funcol.wait_tensor(tensor)


def _all_to_all(x: torch.Tensor) -> torch.Tensor:
    """Exchange equal contiguous shards of a 1-D tensor with every rank."""
    splits = [x.numel() // _world()] * _world()
    return _wait(funcol.all_to_all_single(x, splits, splits, _group()))


# --- all_reduce (sum) ----------------------------------------------------------
@torch.library.custom_op("collective_demo::all_reduce", mutates_args=())
def all_reduce_op(x: torch.Tensor) -> torch.Tensor:
    out = x.clone()
    dist.all_reduce(out)
    return out


@all_reduce_op.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def all_reduce_direct(x: torch.Tensor) -> torch.Tensor:
    return _wait(funcol.all_reduce(x, "sum", _group()))


def all_reduce_via_rs_ag(x: torch.Tensor) -> torch.Tensor:
    # Each rank reduces one shard, then the reduced shards are gathered.
    shard = _wait(funcol.reduce_scatter_tensor(x, "sum", _world(), _group()))
    return _wait(funcol.all_gather_into_tensor(shard, _world(), _group()))


def all_reduce_via_ag_sum(x: torch.Tensor) -> torch.Tensor:
    # Every rank receives every input and reduces locally.
    gathered = _wait(funcol.all_gather_into_tensor(x, _world(), _group()))
    return gathered.view(_world(), -1).sum(0)


# --- all_gather ----------------------------------------------------------------
@torch.library.custom_op("collective_demo::all_gather", mutates_args=())
def all_gather_op(x: torch.Tensor) -> torch.Tensor:
    out = x.new_empty(x.numel() * dist.get_world_size())
    dist.all_gather_into_tensor(out, x)
    return out


@all_gather_op.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.numel() * dist.get_world_size())


def all_gather_direct(x: torch.Tensor) -> torch.Tensor:
    return _wait(funcol.all_gather_into_tensor(x, _world(), _group()))


def all_gather_via_all_to_all(x: torch.Tensor) -> torch.Tensor:
    # Sending every peer a full copy of x makes all_to_all an all_gather.
    return _all_to_all(x.repeat(_world()))


def all_gather_via_all_reduce(x: torch.Tensor) -> torch.Tensor:
    # Every rank contributes x in its own slot of a zero buffer; the sum of
    # the buffers is the concatenation of the inputs.
    n, rank = x.numel(), dist.get_rank()
    padded = torch.nn.functional.pad(x, (rank * n, (_world() - 1 - rank) * n))
    return _wait(funcol.all_reduce(padded, "sum", _group()))


# --- reduce_scatter (sum) ------------------------------------------------------
@torch.library.custom_op("collective_demo::reduce_scatter", mutates_args=())
def reduce_scatter_op(x: torch.Tensor) -> torch.Tensor:
    out = x.new_empty(x.numel() // dist.get_world_size())
    dist.reduce_scatter_tensor(out, x)
    return out


@reduce_scatter_op.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.numel() // dist.get_world_size())


def reduce_scatter_direct(x: torch.Tensor) -> torch.Tensor:
    return _wait(funcol.reduce_scatter_tensor(x, "sum", _world(), _group()))


def reduce_scatter_via_all_to_all(x: torch.Tensor) -> torch.Tensor:
    # all_to_all hands this rank every peer's shard; their sum is the result.
    return _all_to_all(x).view(_world(), -1).sum(0)


def reduce_scatter_via_all_reduce(x: torch.Tensor) -> torch.Tensor:
    # Reduce everything, keep this rank's shard.
    reduced = _wait(funcol.all_reduce(x, "sum", _group()))
    return reduced.view(_world(), -1)[dist.get_rank()].clone()


# --- all_to_all ----------------------------------------------------------------
@torch.library.custom_op("collective_demo::all_to_all", mutates_args=())
def all_to_all_op(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x)
    return out


@all_to_all_op.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def all_to_all_direct(x: torch.Tensor) -> torch.Tensor:
    return _all_to_all(x)


def all_to_all_two_halves(x: torch.Tensor) -> torch.Tensor:
    # Exchange the first and the second half of every shard in two all_to_alls.
    shards = x.view(_world(), 2, -1)
    first = _all_to_all(shards[:, 0].contiguous()).view(_world(), 1, -1)
    second = _all_to_all(shards[:, 1].contiguous()).view(_world(), 1, -1)
    return torch.cat([first, second], dim=1).view(-1)


# --- the demo ------------------------------------------------------------------
DEFAULT = "default (eager)"


@dataclass
class Case:
    op: Callable[[torch.Tensor], torch.Tensor]
    decompositions: list[Callable[[torch.Tensor], torch.Tensor]]
    # The result on ``rank`` given the inputs of all ranks.
    expected: Callable[[list[torch.Tensor], int], torch.Tensor]


CASES = {
    "all_reduce": Case(
        all_reduce_op,
        [all_reduce_direct, all_reduce_via_rs_ag, all_reduce_via_ag_sum],
        lambda inputs, rank: torch.stack(inputs).sum(0),
    ),
    "all_gather": Case(
        all_gather_op,
        [all_gather_direct, all_gather_via_all_to_all, all_gather_via_all_reduce],
        lambda inputs, rank: torch.cat(inputs),
    ),
    "reduce_scatter": Case(
        reduce_scatter_op,
        [reduce_scatter_direct, reduce_scatter_via_all_to_all, reduce_scatter_via_all_reduce],
        lambda inputs, rank: torch.stack(inputs).sum(0).chunk(len(inputs))[rank],
    ),
    "all_to_all": Case(
        all_to_all_op,
        [all_to_all_direct, all_to_all_two_halves],
        lambda inputs, rank: torch.cat([x.chunk(len(inputs))[rank] for x in inputs]),
    ),
}


class AutotuneRecorder(InductorChoices):
    """Records what the autotuner measured and selected, changing nothing.

    ``feedback`` is registered with ``add_feedback_saver``; the timings it gets
    are already the slowest rank's median in ms, the same on every rank.
    ``override_best_choice`` is the hook the autotuner calls with its pick.
    """

    def __init__(self) -> None:
        super().__init__()
        self.timings: list[dict[ChoiceCaller, float]] = []
        self.selected: list[ChoiceCaller] = []

    def feedback(self, timings, name, input_nodes, choices, profiled_time_fn, precompile_times) -> None:
        self.timings.append(dict(timings))

    def override_best_choice(self, best_choice, timings):
        self.selected.append(best_choice)
        return best_choice


def candidate_label(choice: ChoiceCaller, kind: str) -> str:
    """Short name of a candidate: the default, or its decomposition's name."""
    if choice.gm is None:  # the op's own eager implementation
        return DEFAULT
    name = choice.name.split(f"{kind}_", 1)[-1] if hasattr(choice, "decomposition") else choice.name
    return name


def make_input(numel: int, rank: int) -> torch.Tensor:
    # Small integers: every sum is exact in float32, whatever the order.
    return (torch.arange(numel) % 251 + 1000 * rank).to(torch.float32)
