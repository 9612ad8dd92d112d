"""Jobs launched as users launch them: every process exits 0, relaunches reuse or retune.

The other multi-rank tests run under a harness that hosts the store in a
process of its own and gives every test a cache directory; users' jobs do
neither.  Here ``collective_autotuning_jobs.WORKER`` (an autotuned all_reduce
whose winner is known, ``rs_ag``; ``collective_benchmark_strict`` on) runs as
a job under each launcher of ``collective_autotuning_jobs.launch``, its
process group initialized as torchrun's examples do, without naming a backend (c10d picks gloo for CPU tensors), with
one Inductor cache directory for the job, as on one machine:

* ``torchrun`` (``--standalone``: its agent hosts the store), ``torchrun_nodes``
  (two nodes on loopback, static rendezvous), ``mp_spawn`` (``env://``, rank 0
  hosts the store) and ``srun`` (processes started directly with RANK,
  WORLD_SIZE, LOCAL_RANK and MASTER_ADDR/PORT set; rank 0 hosts the store).
  Each launcher runs at 2 and 3 ranks: ``torchrun`` and ``srun`` start at 2,
  the others at 3 (``torchrun_nodes`` only there: its relaunch at another
  size would repeat ``torchrun``'s, which has the same agent).  A first launch on a cold cache tunes: every rank
  benchmarks the op once and runs ``rs_ag``, the result is exact, every
  process exits 0 (once per size and program key: ``torchrun`` tunes for
  ``srun`` too, whose program has the same key);
* relaunched at the same size on the warm cache: every rank takes the program
  from the FX graph cache, benchmarks nothing, runs ``rs_ag``, exits 0; under
  ``srun`` the store's host (rank 0) exits 3 s before its peers, under
  ``mp_spawn`` 3 s after them, both without ``destroy_process_group``;
* relaunched at the other size (each launcher but ``torchrun_nodes``): every rank compiles and benchmarks again and
  the result is exact (the program compiled for the first size must not be
  replayed: its collectives are sized for it);
* a rank whose own code raises after tuning (the store's host under ``srun``,
  another rank under ``torchrun``) exits with that error; no process aborts
  (no signal but the launcher's SIGTERM), none outlives the launch's bound.

A thread of the stack's own once made a rank abort at exit ("terminate
called without an active exception"); the stack starts none now, and
``scripts/bench_collective_launchers.py`` repeats these launches many times
and counts non-zero exits.  A gloo job without ``destroy_process_group`` can
abort so at exit without the stack too (pytorch/pytorch#190489,
``scripts/repro_gloo_exit_abort.py``): a rank of the worker that leaves its
group to the exit waits half a second first, so that these tests check the
stack's exit, not that race.  Compiled kernels are shared between the cache
directories of the class (the parts holding compiled programs and decisions
are not), which keeps it to a few minutes.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed.collective_autotuning_jobs import (
    Job,
    launch,
    WORKER,
)
from torch.testing._internal.distributed.collective_autotuning_utils import (
    DECISION_CACHES,
)


# The launched jobs' Inductor setting (their processes are not this one's):
# a job that tuned nothing fails, and cannot pass by running the default.
STRICT = {"TORCHINDUCTOR_COLLECTIVE_BENCHMARK_STRICT": "1"}
WINNER = "rs_ag"
# Only a hang comes near it.
LAUNCH_TIMEOUT_S = 300.0
# Each launcher's first size; it is relaunched at the other one.
FIRST_SIZE = {"torchrun": 2, "torchrun_nodes": 3, "mp_spawn": 3, "srun": 2}


def other_size(world_size: int) -> int:
    return 5 - world_size


class LaunchedJobsTest(TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.root = Path(tempfile.mkdtemp(prefix="collective-launchers-"))
        cls.kernels = cls.root / "kernels"  # compiled kernels, shared
        cls.kernels.mkdir()
        cls.tuned: dict[tuple[bool, int], Path] = {}

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.root, ignore_errors=True)
        super().tearDownClass()

    def _launch(self, launcher: str, world_size: int, cache: Path, *args: str) -> Job:
        job = launch(
            launcher,
            world_size,
            [*WORKER, "--bare-init", *args],
            self.root / "out",
            env={"TORCHINDUCTOR_CACHE_DIR": str(cache), **STRICT},
            timeout=LAUNCH_TIMEOUT_S,
        )
        self.assertFalse(job.timed_out, job.log_tail())
        self.assertNotIn("terminate called", "".join(job.outputs), job.log_tail())
        return job

    def _check(self, job: Job, benchmarked: bool) -> None:
        """Every process exited 0; every rank ran the winner, exactly; it benchmarked, or took the cached program."""
        self.assertTrue(job.ok, (job.failures(), job.log_tail()))
        self.assertEqual(len(job.reports), job.world_size, job.log_tail())
        for report in job.reports:
            self.assertNotIn("error", report, report)
            self.assertEqual(report["world_size"], job.world_size, report)
            self.assertEqual(report["ran"], [WINNER], report)
            self.assertTrue(report["exact"], report)
            self.assertEqual(report["counters"].get("failure_agreements", 0), 0)
            if benchmarked:
                self.assertEqual(report["counters"].get("ops"), 1, report)
            else:
                self.assertGreater(report["fxgraph"]["hit"], 0, report)
                self.assertEqual(report["counters"].get("ops", 0), 0, report)

    def _tuned_cache(self, launcher: str) -> Path:
        """A cache directory of this test's, holding the program tuned at the launcher's first size.

        Tuned once per class and program key by the first launcher to ask
        (a cold launch, checked), then copied: under mp.spawn the program's
        main module is ``__mp_main__``, which its FX graph cache key reflects;
        the other launchers run the same program as ``__main__`` and share it.
        """
        key = (launcher == "mp_spawn", FIRST_SIZE[launcher])
        if key not in self.tuned:
            cache = self.root / f"tuned-{launcher}"
            shutil.copytree(self.kernels, cache)
            job = self._launch(launcher, FIRST_SIZE[launcher], cache)
            self._check(job, benchmarked=True)
            shutil.copytree(
                cache,
                self.kernels,
                dirs_exist_ok=True,
                ignore=shutil.ignore_patterns(*DECISION_CACHES),
            )
            self.tuned[key] = cache
        mine = self.root / self.id().rsplit(".", 1)[-1]
        shutil.copytree(self.tuned[key], mine)
        return mine

    def _relaunch_at_the_same_size(self, launcher: str, *args: str) -> None:
        cache = self._tuned_cache(launcher)
        job = self._launch(launcher, FIRST_SIZE[launcher], cache, *args)
        self._check(job, benchmarked=False)

    def _relaunch_at_the_other_size(self, launcher: str) -> None:
        cache = self._tuned_cache(launcher)
        job = self._launch(launcher, other_size(FIRST_SIZE[launcher]), cache)
        self._check(job, benchmarked=True)

    # Same size: the program from the FX graph cache, no benchmarking.  Under
    # srun and mp.spawn, rank 0 hosts the store: it exits 3 s before its
    # peers, then 3 s after them, leaving the process group to the exit.
    def test_torchrun_relaunch_at_the_same_size(self):
        self._relaunch_at_the_same_size("torchrun")

    def test_torchrun_nodes_relaunch_at_the_same_size(self):
        self._relaunch_at_the_same_size("torchrun_nodes")

    def test_srun_relaunch_at_the_same_size_store_host_exits_first(self):
        self._relaunch_at_the_same_size(
            "srun", "--no-destroy", "--last-to-exit", "peers"
        )

    def test_mp_spawn_relaunch_at_the_same_size_store_host_exits_last(self):
        self._relaunch_at_the_same_size(
            "mp_spawn", "--no-destroy", "--last-to-exit", "host"
        )

    # Another size: compiled and tuned again (needs the process group's
    # topology in the cache keys).
    def test_torchrun_relaunch_at_another_size(self):
        self._relaunch_at_the_other_size("torchrun")

    def test_mp_spawn_relaunch_at_another_size(self):
        self._relaunch_at_the_other_size("mp_spawn")

    def test_srun_relaunch_at_another_size(self):
        self._relaunch_at_the_other_size("srun")

    # A rank's own error after tuning.
    def test_store_host_raises_after_tuning(self):
        cache = self._tuned_cache("srun")
        job = self._launch("srun", FIRST_SIZE["srun"], cache, "--raise-on-rank", "0")
        self.assertEqual(job.exits[0], 1, job.log_tail())
        self.assertIn("raised on rank 0 after tuning", job.outputs[0])
        self.assertEqual(job.exits[1:], [0] * (job.world_size - 1), job.log_tail())
        self.assertEqual(len(job.reports), job.world_size, job.log_tail())
        self._check_reports(job, raised_on=0)

    def test_rank_raises_after_tuning_under_torchrun(self):
        cache = self._tuned_cache("torchrun")
        job = self._launch(
            "torchrun", FIRST_SIZE["torchrun"], cache, "--raise-on-rank", "1"
        )
        self.assertEqual(job.exits, [1], job.log_tail())
        self.assertIn("raised on rank 1 after tuning", job.outputs[0])
        # The agent stops the other ranks (SIGTERM) once one failed.
        self.assertEqual(
            set(job.failures()) - {"exit 1", "SIGTERM"}, set(), job.log_tail()
        )
        self._check_reports(job, raised_on=1)

    def _check_reports(self, job: Job, raised_on: int) -> None:
        # The raising rank, and every other that reported before the
        # launcher stopped it, ran the cached winner, exactly.
        self.assertIn(raised_on, [report["rank"] for report in job.reports])
        for report in job.reports:
            self.assertEqual(report["ran"], [WINNER], report)
            self.assertTrue(report["exact"], report)


if __name__ == "__main__":
    run_tests()
