"""Collective custom-op autotuning across ranks, on CPU/gloo (CI) and CUDA/NCCL.

What this checks, per world size (one class each: 2, 3 and 4 ranks) and per
collective kind (all_reduce, all_gather, reduce_scatter, all_to_all):

* The implementation that runs after compilation is the expected winner.  Every
  op has three real implementations (the op's own eager code and two
  decompositions built from functional collectives); all but the expected
  winner are made slower on purpose through a ``probe`` op that sleeps, so the
  winner is known.  The expected winner rotates over the default, the first and
  the last registered candidate, so a selection that ignores timings fails.
* Every rank ran that same implementation (gathered and compared on each rank).
* The numerical result equals the closed-form expectation on every rank.

The NCCL classes run the same tests when enough GPUs are present and are
skipped otherwise.
"""

from __future__ import annotations

import collections
import os
import tempfile
import time
import unittest

import torch
import torch.distributed as dist
import torch._inductor.config as inductor_config
from torch._inductor.kernel.custom_op import CustomOpConfig, register_custom_op_autotuning
from torch.testing._internal.common_distributed import MultiProcessTestCase
from torch.testing._internal.common_utils import run_tests

funcol = torch.ops._c10d_functional

# Implementations that ran on this rank, in order, and the artificial delay of
# each: the probe is how a test makes a candidate slow and sees what ran.
RAN: list[str] = []
DELAY_MS: dict[str, float] = {}
SLOW_MS = 50.0  # far above a gloo collective, even with 4 ranks on 2 busy cores
NWARMUP = 2
NRUNS = 5
ROWS = 24  # divisible by every tested world size
COLS = 8


@torch.library.custom_op("collective_autotune_test::probe", mutates_args=())
def probe(x: torch.Tensor, impl: str) -> torch.Tensor:
    RAN.append(impl)
    delay = DELAY_MS.get(impl, 0.0)
    if delay:
        time.sleep(delay / 1e3)
    return x.clone()


@probe.register_fake
def _(x: torch.Tensor, impl: str) -> torch.Tensor:
    return torch.empty_like(x)


def _group_name() -> str:
    return dist.group.WORLD.group_name


def _wait(tensor: torch.Tensor) -> torch.Tensor:
    return funcol.wait_tensor(tensor)


def _all_to_all(x: torch.Tensor) -> torch.Tensor:
    splits = [x.shape[0] // dist.get_world_size()] * dist.get_world_size()
    return _wait(funcol.all_to_all_single(x, splits, splits, _group_name()))


# --- all_reduce ----------------------------------------------------------------
@torch.library.custom_op("collective_autotune_test::all_reduce", mutates_args=())
def all_reduce_op(x: torch.Tensor) -> torch.Tensor:
    out = probe(x, "default")
    dist.all_reduce(out)
    return out


@all_reduce_op.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def all_reduce_direct(x):
    return _wait(funcol.all_reduce(probe(x, "direct"), "sum", _group_name()))


def all_reduce_rs_ag(x):
    world = dist.get_world_size()
    shard = _wait(funcol.reduce_scatter_tensor(probe(x, "rs_ag"), "sum", world, _group_name()))
    return _wait(funcol.all_gather_into_tensor(shard, world, _group_name()))


# --- all_gather ----------------------------------------------------------------
@torch.library.custom_op("collective_autotune_test::all_gather", mutates_args=())
def all_gather_op(x: torch.Tensor) -> torch.Tensor:
    x = probe(x, "default")
    out = x.new_empty((x.shape[0] * dist.get_world_size(), *x.shape[1:]))
    dist.all_gather_into_tensor(out, x)
    return out


@all_gather_op.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0] * dist.get_world_size(), *x.shape[1:]))


def all_gather_direct(x):
    return _wait(funcol.all_gather_into_tensor(probe(x, "direct"), dist.get_world_size(), _group_name()))


def all_gather_via_all_to_all(x):
    # Sending every peer a full copy of x makes all_to_all an all_gather.
    world = dist.get_world_size()
    replicated = probe(x, "a2a").repeat(world, *([1] * (x.dim() - 1)))
    return _all_to_all(replicated)


# --- reduce_scatter ------------------------------------------------------------
@torch.library.custom_op("collective_autotune_test::reduce_scatter", mutates_args=())
def reduce_scatter_op(x: torch.Tensor) -> torch.Tensor:
    x = probe(x, "default")
    out = x.new_empty((x.shape[0] // dist.get_world_size(), *x.shape[1:]))
    dist.reduce_scatter_tensor(out, x)
    return out


@reduce_scatter_op.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0] // dist.get_world_size(), *x.shape[1:]))


def reduce_scatter_direct(x):
    world = dist.get_world_size()
    return _wait(funcol.reduce_scatter_tensor(probe(x, "direct"), "sum", world, _group_name()))


def reduce_scatter_via_all_to_all(x):
    # all_to_all hands this rank every peer's shard of x; their sum is the result.
    world = dist.get_world_size()
    shards = _all_to_all(probe(x, "a2a_sum"))
    return shards.view(world, x.shape[0] // world, *x.shape[1:]).sum(0)


# --- all_to_all ----------------------------------------------------------------
@torch.library.custom_op("collective_autotune_test::all_to_all", mutates_args=())
def all_to_all_op(x: torch.Tensor) -> torch.Tensor:
    x = probe(x, "default")
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x)
    return out


@all_to_all_op.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def all_to_all_direct(x):
    return _all_to_all(probe(x, "direct"))


def all_to_all_two_halves(x):
    # Exchange the first and second half of every shard in two all_to_alls.
    world = dist.get_world_size()
    x = probe(x, "halves")
    shards = x.view(world, 2, x.shape[0] // (2 * world), *x.shape[1:])
    first = _all_to_all(shards[:, 0].contiguous())
    second = _all_to_all(shards[:, 1].contiguous())
    return torch.stack([first.view_as(shards[:, 0]), second.view_as(shards[:, 1])], dim=1).view_as(x)


def _expected(kind: str, inputs: list[torch.Tensor], rank: int) -> torch.Tensor:
    world = len(inputs)
    if kind == "all_reduce":
        return torch.stack(inputs).sum(0)
    if kind == "all_gather":
        return torch.cat(inputs)
    if kind == "reduce_scatter":
        return torch.stack(inputs).sum(0).chunk(world)[rank]
    return torch.cat([peer.chunk(world)[rank] for peer in inputs])


# kind -> (op, [(impl name, decomposition)], expected winner)
CASES = {
    "all_reduce": (all_reduce_op, [("direct", all_reduce_direct), ("rs_ag", all_reduce_rs_ag)], "rs_ag"),
    "all_gather": (all_gather_op, [("direct", all_gather_direct), ("a2a", all_gather_via_all_to_all)], "default"),
    "reduce_scatter": (
        reduce_scatter_op,
        [("direct", reduce_scatter_direct), ("a2a_sum", reduce_scatter_via_all_to_all)],
        "a2a_sum",
    ),
    "all_to_all": (all_to_all_op, [("direct", all_to_all_direct), ("halves", all_to_all_two_halves)], "direct"),
}


class CollectiveAutotuningTestBase(MultiProcessTestCase):
    backend = "gloo"

    @classmethod
    def setUpClass(cls):
        if cls.backend == "nccl" and torch.cuda.device_count() < cls.WORLD_SIZE:
            raise unittest.SkipTest(f"NCCL tests need {cls.WORLD_SIZE} GPUs")
        super().setUpClass()

    @property
    def world_size(self) -> int:
        return self.WORLD_SIZE

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def _init_rank(self) -> torch.device:
        device = torch.device("cpu")
        if self.backend == "nccl":
            device = torch.device("cuda", self.rank)
            torch.cuda.set_device(device)
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group(self.backend, store=store, rank=self.rank, world_size=self.world_size)
        # The FX graph cache key does not cover the registered implementations
        # yet; every rank compiles from scratch in its own cache directory.
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"inductor-rank{self.rank}-")
        torch._dynamo.reset()
        return device

    def _input(self, rank: int, device: torch.device) -> torch.Tensor:
        values = torch.arange(ROWS * COLS, dtype=torch.float32) + 1000 * rank
        return values.view(ROWS, COLS).to(device)

    def _check_autotuned(self, kind: str) -> None:
        device = self._init_rank()
        op, decompositions, winner = CASES[kind]
        register_custom_op_autotuning(op, configs=[CustomOpConfig(fn) for _, fn in decompositions])
        DELAY_MS.clear()
        DELAY_MS.update({name: SLOW_MS for name in ["default", *dict(decompositions)] if name != winner})

        def program(x):
            return op(x) + 1

        with inductor_config.patch(
            collective_benchmark_nruns=NRUNS,
            inductor_default_autotune_warmup=NWARMUP,
            fx_graph_cache=False,
            autotune_local_cache=False,
        ):
            compiled = torch.compile(program)
            RAN.clear()
            compiled(self._input(self.rank, device))  # compiles, autotunes, runs
            ran_while_compiling = collections.Counter(RAN)
            RAN.clear()
            result = compiled(self._input(self.rank, device))

        # Lock-step: every candidate ran warmup + timed runs on this rank (the
        # winner once more, as the first call's result); checked on every rank.
        self.assertEqual(
            dict(ran_while_compiling),
            {name: NWARMUP + NRUNS + (name == winner) for name in ["default", *dict(decompositions)]},
        )
        ran_here = list(RAN)
        ran_everywhere: list = [None] * self.world_size
        dist.all_gather_object(ran_everywhere, ran_here)
        self.assertEqual(ran_here, [winner], f"rank {self.rank} ran {ran_here}, expected [{winner!r}]")
        self.assertEqual(ran_everywhere, [[winner]] * self.world_size)
        inputs = [self._input(r, device) for r in range(self.world_size)]
        torch.testing.assert_close(result, _expected(kind, inputs, self.rank) + 1, rtol=0, atol=0)
        dist.destroy_process_group()

    def test_all_reduce(self):
        self._check_autotuned("all_reduce")

    def test_all_gather(self):
        self._check_autotuned("all_gather")

    def test_reduce_scatter(self):
        self._check_autotuned("reduce_scatter")

    def test_all_to_all(self):
        self._check_autotuned("all_to_all")


class TestCollectiveAutotuning2RanksGloo(CollectiveAutotuningTestBase):
    WORLD_SIZE = 2


class TestCollectiveAutotuning3RanksGloo(CollectiveAutotuningTestBase):
    WORLD_SIZE = 3


class TestCollectiveAutotuning4RanksGloo(CollectiveAutotuningTestBase):
    WORLD_SIZE = 4


class TestCollectiveAutotuning2RanksNCCL(CollectiveAutotuningTestBase):
    WORLD_SIZE = 2
    backend = "nccl"


class TestCollectiveAutotuning3RanksNCCL(CollectiveAutotuningTestBase):
    WORLD_SIZE = 3
    backend = "nccl"


class TestCollectiveAutotuning4RanksNCCL(CollectiveAutotuningTestBase):
    WORLD_SIZE = 4
    backend = "nccl"


del CollectiveAutotuningTestBase  # a base, not a test class of its own

if __name__ == "__main__":
    run_tests()
