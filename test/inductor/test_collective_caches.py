"""Caches and recompiles that every rank of a group agrees on, on 2 gloo ranks.

Inductor's caches are at their defaults (FX graph cache, AOTAutograd cache,
autotuning's local cache); each rank has a cache directory of its own, as on
separate nodes, which survives the test's restarts (a restart: Dynamo reset
and this process's remembered decisions forgotten, what a new process starts
with).  What this checks:

* Changed implementations miss: a program tuned with an implementation that
  won is compiled again after that implementation is removed from the
  registration; the removed one never runs, and the remaining ones are
  benchmarked.  The same registration made again after a restart hits.
* Warm restart on every rank: the program comes from the cache on every
  rank, its session is replayed (one join, nothing compiled or benchmarked),
  and every rank runs the same winner, exactly.  Its code is the same on
  every rank, so one program serves them all: rank 1, given rank 0's cached
  programs only, takes rank 0's.
* Skew: one rank's cache is emptied.  The warm rank replays, the cold rank
  compiles and adopts the warm rank's decision (no benchmarking anywhere),
  and both run the same winner; no failure agreement, no timeout.
* Conflicting decisions, both ways: one rank remembers (in its decision
  cache) another decision than the other rank's cached program holds.  The
  lower rank's decision is adopted by both; when that is not the cached
  program's, its rank compiles again with the agreed decision, without
  meeting its group a second time.
* A rank that recompiles alone (a guard that fails on it only): once the
  max wait (two timeouts here) runs out at the join, it raises a clear error
  naming its peer, saying that it may have recompiled alone and how to fix
  it; its peer, blocked in a collective of its compiled code, fails when the
  lone rank drops its process group; with
  ``torch.compiler.set_enable_guard_collectives(True)`` both ranks recompile
  together and agree.

Without ranks: remembered decisions are stored in ``collective_decisions/``
of Inductor's cache directory, under the system's hash
(``CacheBase.get_system()``), while ``autotune_local_cache`` is set, and
nowhere on disk otherwise; the directory is not compared between members.
With a fake process group per "rank": a decision's key holds the
group's topology (name, size, global ranks), the same on every member; a
cached program with collective choices serves the groups it was compiled for,
and, when its code depends on the rank, that rank only.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import torch
import torch.distributed as dist
import torch._inductor.config as inductor_config
from torch._dynamo.utils import counters
from torch._inductor import config
from torch._inductor.kernel.custom_op import (
    CustomOpConfig,
    register_custom_op_autotuning,
)
from torch._inductor.collective_autotuning import cache_hits
from torch._inductor.collective_autotuning.settings import benchmark_config
from torch._inductor.runtime.cache_dir_utils import cache_dir
from torch._inductor.runtime.collective_benchmarking import decision_cache
from torch._inductor.runtime.collective_benchmarking.benchmarker import (
    CollectiveBenchmarker,
)
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.testing._internal.distributed.collective_autotuning_utils import (
    DECISION_CACHES,
    SpawnedRanksTestCase,
)

from test_collective_autotuning_ranks import (
    COLS,
    DELAY_MS,
    HANG_BOUND_S,
    NRUNS,
    NWARMUP,
    RAN,
    ROWS,
    SLOW_MS,
    all_reduce_direct,
    all_reduce_op,
    all_reduce_rs_ag,
)

TIMEOUT_S = 5.0
WINNER_DELAYS = {
    "direct": {"default": SLOW_MS, "rs_ag": SLOW_MS},
    "rs_ag": {"default": SLOW_MS, "direct": SLOW_MS},
}


def settings(**patches):
    # Caches at their defaults: only the benchmark's size and bound are set.
    return inductor_config.patch(
        collective_benchmark_nruns=NRUNS,
        collective_benchmark_nwarmup=NWARMUP,
        collective_benchmark_timeout=TIMEOUT_S,
        **patches,
    )


def restart() -> None:
    """What a new process starts with: no compiled frame, no decision in memory."""
    torch._dynamo.reset()
    decision_cache._remembered.clear()
    decision_cache._pre_agreed.clear()
    counters.clear()


@config.patch(collective_benchmark_strict=True)
class CollectiveCachesTest(SpawnedRanksTestCase):
    WORLD_SIZE = 2

    def _init_process_group(self) -> None:
        super()._init_process_group()
        # One cache directory per rank for the whole test, as on separate nodes.
        self.cache_dir = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])

    def _x(self) -> torch.Tensor:
        return (torch.arange(ROWS * COLS, dtype=torch.float32) + 1000 * self.rank).view(
            ROWS, COLS
        )

    def _expected(self) -> torch.Tensor:
        total = sum(
            (torch.arange(ROWS * COLS, dtype=torch.float32) + 1000 * r).view(ROWS, COLS)
            for r in range(self.world_size)
        )
        return total + 1

    def _compile_and_run(
        self,
        winner_delays: str | None = None,
        configs=(all_reduce_direct, all_reduce_rs_ag),
    ):
        """Register, compile, run twice; what ran while compiling and after, and the counters."""
        register_custom_op_autotuning(
            all_reduce_op, configs=[CustomOpConfig(fn) for fn in configs]
        )
        DELAY_MS.clear()
        DELAY_MS.update(WINNER_DELAYS.get(winner_delays, {}))
        with settings():
            compiled = torch.compile(lambda x: all_reduce_op(x) + 1)
            RAN.clear()
            start = time.monotonic()
            compiled(self._x())
            seconds = time.monotonic() - start
            while_compiling = list(RAN)
            RAN.clear()
            result = compiled(self._x())
        torch.testing.assert_close(result, self._expected(), rtol=0, atol=0)
        everywhere: list = [None] * self.world_size
        dist.all_gather_object(everywhere, list(RAN))
        self.assertEqual(
            len({tuple(ran) for ran in everywhere}), 1, f"ranks ran {everywhere}"
        )
        self.assertLess(seconds, HANG_BOUND_S)
        return while_compiling, list(RAN), dict(counters["collective_autotuning"])

    def _forget_programs_and_remember(self, decisions: Path, on_rank: int) -> None:
        """A restart after which rank ``on_rank`` has no compiled program and remembers ``decisions``."""
        restart()
        if self.rank == on_rank:
            for part in DECISION_CACHES:
                shutil.rmtree(self.cache_dir / part, ignore_errors=True)
            shutil.copytree(decisions, self.cache_dir / "collective_decisions")

    def test_changed_implementations_miss_and_the_same_registration_hits(self):
        self._init_process_group()
        while_compiling, ran, _ = self._compile_and_run("rs_ag")
        self.assertEqual(ran, ["rs_ag"])
        restart()
        while_compiling, ran, stats = self._compile_and_run(
            "direct", configs=(all_reduce_direct,)
        )
        self.assertNotIn(
            "rs_ag", while_compiling + ran
        )  # the removed implementation never runs
        self.assertGreaterEqual(
            while_compiling.count("direct"), NWARMUP + NRUNS
        )  # benchmarked again
        self.assertEqual(ran, ["direct"])
        restart()
        while_compiling, ran, stats = self._compile_and_run(
            "direct", configs=(all_reduce_direct,)
        )
        self.assertEqual(
            while_compiling, ["direct"]
        )  # taken from the cache: nothing benchmarked
        self.assertEqual(stats.get("replayed_sessions"), 1)
        dist.destroy_process_group()

    def test_warm_restart_replays_without_benchmarking(self):
        self._init_process_group()
        _, ran, _ = self._compile_and_run("rs_ag")
        restart()
        while_compiling, ran_again, stats = self._compile_and_run(
            "direct"
        )  # other delays: a cache hit ignores them
        self.assertEqual((while_compiling, ran_again), (["rs_ag"], ["rs_ag"]))
        self.assertEqual((stats.get("replayed_sessions"), stats.get("ops", 0)), (1, 0))
        # Rank 1 with rank 0's programs in place of its own: they serve it.
        restart()
        if self.rank == 1:
            for part in DECISION_CACHES:
                shutil.rmtree(self.cache_dir / part, ignore_errors=True)
                shutil.copytree(
                    self.cache_dir.with_name("rank0") / part, self.cache_dir / part
                )
        while_compiling, ran_again, stats = self._compile_and_run("direct")
        self.assertEqual((while_compiling, ran_again), (["rs_ag"], ["rs_ag"]))
        self.assertEqual((stats.get("replayed_sessions"), stats.get("ops", 0)), (1, 0))
        dist.destroy_process_group()

    def test_a_cold_rank_adopts_the_warm_ranks_decision(self):
        self._init_process_group()
        self._compile_and_run("rs_ag")
        restart()
        if self.rank == 1:
            shutil.rmtree(self.cache_dir)
            self.cache_dir.mkdir()
        while_compiling, ran, stats = self._compile_and_run("direct")
        self.assertEqual(ran, ["rs_ag"])
        self.assertEqual(stats.get("ops", 0), 0)  # nobody benchmarked
        self.assertEqual(stats.get("failure_agreements", 0), 0)  # nobody timed out
        if self.rank == 0:
            self.assertEqual(stats.get("replayed_sessions"), 1)
        else:
            self.assertEqual((stats.get("recalled"), while_compiling), (1, ["rs_ag"]))
        dist.destroy_process_group()

    def test_conflicting_decisions_go_to_the_lower_rank(self):
        self._init_process_group()
        self._compile_and_run("direct")  # every rank decides "direct"
        decided_direct = self.cache_dir.with_name(f"{self.cache_dir.name}-direct")
        shutil.copytree(self.cache_dir / "collective_decisions", decided_direct)
        restart()
        shutil.rmtree(self.cache_dir)
        self.cache_dir.mkdir()
        self._compile_and_run("rs_ag")  # every rank's caches hold "rs_ag" now
        # Rank 1 forgets its programs and remembers "direct": rank 0's cached
        # program holds "rs_ag", and the lower rank's decision is adopted.
        self._forget_programs_and_remember(decided_direct, on_rank=1)
        _, ran, stats = self._compile_and_run(None)
        self.assertEqual((ran, stats.get("ops", 0)), (["rs_ag"], 0))
        # Rank 0 does: its "direct" is adopted, and rank 1, whose cached
        # program holds "rs_ag", compiles it again without meeting rank 0.
        self._forget_programs_and_remember(decided_direct, on_rank=0)
        _, ran, stats = self._compile_and_run(None)
        self.assertEqual((ran, stats.get("ops", 0)), (["direct"], 0))
        if self.rank == 1:
            # Its program was replayed (by the AOTAutograd cache, then by the FX
            # graph cache, the second time from the agreed decisions, without a
            # join), and compiled again.
            self.assertGreaterEqual(stats.get("replayed_sessions", 0), 1)
        dist.destroy_process_group()


@config.patch(collective_benchmark_strict=True)
class RecompileTest(SpawnedRanksTestCase):
    WORLD_SIZE = 2

    def _program(self):
        register_custom_op_autotuning(
            all_reduce_op,
            configs=[
                CustomOpConfig(all_reduce_direct),
                CustomOpConfig(all_reduce_rs_ag),
            ],
        )
        DELAY_MS.clear()
        DELAY_MS.update(WINNER_DELAYS["rs_ag"])
        return torch.compile(lambda x, n: all_reduce_op(x) * n)

    def test_a_rank_that_recompiles_alone_gets_a_clear_error(self):
        self._init_process_group()
        x = torch.ones(ROWS, COLS)
        # The peer is waited for up to the max wait: two timeouts here.
        with settings(collective_benchmark_max_wait=2 * TIMEOUT_S):
            compiled = self._program()
            compiled(x, 1)
            # The guard on n fails on rank 0 only: it alone compiles again.
            if self.rank == 0:
                start = time.monotonic()
                with self.assertRaisesRegex(
                    Exception,
                    r"ranks \[1\] .*did not reach the start of autotuning.*"
                    r"if this rank recompiled alone .*set_enable_guard_collectives",
                ):
                    compiled(x, 2)
                # The recompile, then the max wait: far below the process
                # group's timeout, which a hang would reach.
                self.assertLess(time.monotonic() - start, 2 * TIMEOUT_S + 60)
                dist.destroy_process_group()  # frees the peer, blocked in the compiled all_reduce
            else:
                with self.assertRaises(RuntimeError):
                    compiled(x, 1)

    def test_guard_collectives_make_every_rank_recompile(self):
        self._init_process_group()
        torch.compiler.set_enable_guard_collectives(True)
        x = torch.ones(ROWS, COLS)
        world = self.world_size
        with settings():
            compiled = self._program()
            compiled(x, 1)
            RAN.clear()
            result = compiled(x, 2 if self.rank == 0 else 1)  # recompiled on every rank
            ran_here = list(RAN)
        everywhere: list = [None] * world
        dist.all_gather_object(everywhere, ran_here[-1:])
        self.assertEqual(everywhere, [["rs_ag"]] * world)
        self.assertEqual(
            result,
            torch.full((ROWS, COLS), float(world * (2 if self.rank == 0 else 1))),
        )
        torch.compiler.set_enable_guard_collectives(False)
        dist.destroy_process_group()


class DecisionDirectoryTest(TestCase):
    def test_decisions_are_stored_with_autotuning_results(self):
        with inductor_config.patch(autotune_local_cache=True):
            stored = benchmark_config()
            # Per system, as upstream's: another device, CUDA or Triton
            # stores and reads other files.
            get_system = "torch._inductor.codecache.CacheBase.get_system"
            other = {"hash": "another system"}
            with mock.patch(get_system, return_value=other):
                elsewhere = benchmark_config()
        decisions = os.path.join(cache_dir(), "collective_decisions")
        self.assertEqual(os.path.dirname(stored.decision_dir), decisions)
        self.assertEqual(
            elsewhere.decision_dir, os.path.join(decisions, "another system")
        )
        with inductor_config.patch(autotune_local_cache=False):
            in_memory = benchmark_config()
        self.assertIsNone(in_memory.decision_dir)
        # Each host has its own: members that differ only there agree.
        self.assertEqual(stored, in_memory)
        self.assertEqual(repr(stored), repr(in_memory))


class ProgramsServeTheirGroupsTest(TestCase):
    """Decision keys and cached programs against the job's topology, without ranks."""

    def tearDown(self):
        if dist.is_initialized():
            dist.destroy_process_group()
        super().tearDown()

    @staticmethod
    def join_job(rank: int, world_size: int) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group(
            "fake", store=FakeStore(), rank=rank, world_size=world_size
        )

    def decision_context(self, rank: int, world_size: int, members=None):
        self.join_job(rank, world_size)
        group = dist.group.WORLD if members is None else dist.new_group(members)
        member = SimpleNamespace(
            group=group,
            config=benchmark_config(),
            device=torch.device("cpu"),
        )
        return CollectiveBenchmarker.decision_context(member)  # type: ignore[arg-type]

    def test_decision_keys_hold_the_topology_not_the_rank(self):
        self.assertEqual(self.decision_context(0, 3), self.decision_context(2, 3))
        self.assertIn("'0-2'", self.decision_context(0, 3)[0])
        self.assertNotEqual(self.decision_context(0, 3), self.decision_context(0, 2))
        # One name and size, other members.
        self.assertNotEqual(
            self.decision_context(0, 4, [0, 1]), self.decision_context(0, 4, [0, 2])
        )

    def session(self, topology, rank=None):
        return decision_cache.RecordedSession("0", "cpu", (), (), topology, rank)

    def test_a_program_serves_the_topology_it_was_compiled_for(self):
        serves = cache_hits.serves_this_process
        compiled_at_3 = [self.session(("0", 3, "0-2"))]
        self.assertFalse(serves(compiled_at_3))  # no process group
        for rank in range(3):
            self.join_job(rank, 3)
            self.assertTrue(serves(compiled_at_3))  # on every rank
        self.join_job(0, 2)
        self.assertFalse(serves(compiled_at_3))
        unknown_group = [
            decision_cache.RecordedSession("7", "cpu", (), (), ("7", 2, "0-1"), None)
        ]
        self.assertFalse(serves(unknown_group))

    def test_a_program_whose_code_depends_on_the_rank_serves_that_rank(self):
        compiled_on_1 = [self.session(("0", 3, "0-2"), rank=1)]
        for rank in range(3):
            self.join_job(rank, 3)
            self.assertEqual(
                cache_hits.serves_this_process(compiled_on_1),
                rank == 1,
            )


if __name__ == "__main__":
    run_tests()
