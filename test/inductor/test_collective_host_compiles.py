"""Collective autotuning compiles each candidate once per host (host_compiles.py).

What this checks:

* ``HostCompileTest``, in one process, two or three ``HostCompile``s of the
  same candidate standing for the ranks of a host (file locks conflict
  between a process's own file descriptors as between processes):

  - one compiles, publishes after its kernels are built, the other loads;
  - a publisher whose compile raises, or whose kernel build failed, leaves
    the candidate to a waiting rank, which compiles and publishes it;
  - a slow publisher is waited for; one slower than
    ``collective_benchmark_max_wait`` is not, and the waiting rank compiles
    its own copy without publishing it;
  - a record whose module is gone is a miss.

* ``HostJobTest``, on jobs launched srun-style with one cache directory
  shared by their ranks (a host's), Inductor's caches on, the user's job of
  ``collective_job_worker.py``, each rank counting the candidates it
  compiled:

  - at 4 ranks (V1) and at 2 ranks (V2), each candidate is compiled once on
    the host and loaded by the other ranks; a rank-dependent candidate is
    compiled by every rank; the winner, the implementation every rank runs
    and its result are what they are without sharing;
  - a rank whose share raises disqualifies the candidate on every rank; a
    rank slow to publish is waited for.
"""

from __future__ import annotations

import collections
import shutil
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist
from torch._dynamo.utils import counters
from torch._inductor.codecache import PyCodeCache
from torch._inductor.collective_autotuning.host_compiles import HostCompile
from torch.testing._internal.common_utils import run_tests, TestCase


sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from collective_jobs import launch


WORKER = str(Path(__file__).with_name("collective_job_worker.py"))


class _Choice:
    """What HostCompile needs of a SubgraphChoiceCaller: a module compiled on demand."""

    def __init__(self, name: str = "candidate", source: str = "", raises: bool = False):
        self.name = name
        self._compiled_module = None
        self.source = source or f"def call(args):\n    return {name!r}\n"
        self.raises = raises
        self.compiles = 0

    def _ensure_compiled(self) -> None:
        self.compiles += 1
        if self.raises:
            raise RuntimeError(f"compiling {self.name} failed")
        key, path = PyCodeCache.write(self.source)
        self._compiled_module = PyCodeCache.load_by_key_path(key, path)


class HostCompileTest(TestCase):
    def setUp(self):
        super().setUp()
        counters.clear()
        self.directory = tempfile.mkdtemp(prefix="host-compiles-")
        self.addCleanup(shutil.rmtree, self.directory, ignore_errors=True)

    def rank(self, choice: _Choice, max_wait: float = 60.0) -> HostCompile:
        return HostCompile(
            choice, "k" * 16, self.directory, timedelta(seconds=max_wait)
        )

    def finish_in_thread(self, compile: HostCompile) -> threading.Thread:
        thread = threading.Thread(target=compile.finish, daemon=True)
        thread.start()
        return thread

    def test_one_compiles_the_other_loads(self):
        publisher, peer = _Choice(), _Choice()
        mine, theirs = self.rank(publisher), self.rank(peer)
        mine.start()
        theirs.start()  # the lock is taken: left to the publisher
        self.assertIsNone(peer._compiled_module)
        waiting = self.finish_in_thread(theirs)
        time.sleep(0.3)
        self.assertTrue(waiting.is_alive())  # no record before the kernels are built
        mine.finish()
        waiting.join(timeout=30)
        self.assertFalse(waiting.is_alive())
        self.assertEqual((publisher.compiles, peer.compiles), (1, 0))
        self.assertEqual(
            peer._compiled_module.__file__, publisher._compiled_module.__file__
        )
        self.assertEqual(peer._compiled_module.call([]), "candidate")
        stats = counters["collective_autotuning"]
        self.assertEqual(
            (stats["candidates_compiled"], stats["candidates_loaded"]), (1, 1)
        )
        # A rank that comes later loads the record, without the lock.
        late = _Choice()
        self.rank(late).start()
        self.assertEqual(
            (late.compiles, late._compiled_module.call([])), (0, "candidate")
        )

    def test_a_publisher_that_raises_leaves_it_to_the_waiting_rank(self):
        publisher, peer = _Choice(raises=True), _Choice()
        mine, theirs = self.rank(publisher), self.rank(peer)
        with self.assertRaisesRegex(RuntimeError, "compiling candidate failed"):
            mine.start()
        theirs.start()  # the failed publisher released the lock: compiled here
        theirs.finish()
        self.assertEqual((publisher.compiles, peer.compiles), (1, 1))
        late = _Choice()
        self.rank(late).start()
        self.assertEqual(late.compiles, 0)

    def test_a_failed_kernel_build_is_not_published(self):
        publisher, peer, late = _Choice(), _Choice(), _Choice()
        mine, theirs = self.rank(publisher), self.rank(peer)
        mine.start()
        theirs.start()
        waiting = self.finish_in_thread(theirs)
        mine.abandon()  # its kernels failed to build
        waiting.join(timeout=30)
        self.assertEqual((publisher.compiles, peer.compiles), (1, 1))
        self.rank(late).start()  # the waiting rank published its own
        self.assertEqual(late.compiles, 0)

    def test_a_slow_publisher_is_waited_for(self):
        publisher, peer = _Choice(), _Choice()
        mine, theirs = self.rank(publisher), self.rank(peer)
        mine.start()
        theirs.start()
        waiting = self.finish_in_thread(theirs)
        time.sleep(1.5)
        mine.finish()
        waiting.join(timeout=30)
        self.assertEqual(peer.compiles, 0)
        self.assertGreater(counters["collective_autotuning"]["compile_wait_s"], 1.0)

    def test_a_publisher_late_beyond_max_wait_is_not_waited_for(self):
        publisher, peer = _Choice(), _Choice()
        mine, theirs = self.rank(publisher), self.rank(peer, max_wait=0.5)
        mine.start()
        theirs.start()
        with self.assertLogs(
            "torch._inductor.collective_autotuning.host_compiles", "WARNING"
        ) as logs:
            theirs.finish()
        self.assertIn("compiles its own copy", logs.output[0])
        self.assertEqual((publisher.compiles, peer.compiles), (1, 1))
        mine.abandon()
        late = _Choice()
        self.rank(late).start()  # the late copy was not published
        self.assertEqual(late.compiles, 1)

    def test_a_record_whose_module_is_gone_is_a_miss(self):
        publisher = _Choice(source="def call(args):\n    return 'gone'\n")
        mine = self.rank(publisher)
        mine.start()
        mine.finish()
        Path(publisher._compiled_module.__file__).unlink()
        PyCodeCache.modules_no_attr.clear()
        late = _Choice()
        with self.assertLogs(
            "torch._inductor.collective_autotuning.host_compiles", "WARNING"
        ):
            self.rank(late).start()
        self.assertEqual(late.compiles, 1)

    def test_an_unshared_candidate_compiles_alone(self):
        choice = _Choice()
        alone = HostCompile(choice, None, self.directory, timedelta(seconds=1))
        alone.start()
        alone.finish()
        self.assertEqual(choice.compiles, 1)
        self.assertEqual(list(Path(self.directory).iterdir()), [])


class HostJobTest(TestCase):
    """Jobs whose ranks share a cache directory (see the module docstring)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        if not dist.is_available() or not dist.is_gloo_available():
            raise cls.skipTest(cls, "needs torch.distributed with gloo")
        cls.root = Path(tempfile.mkdtemp(prefix="collective-host-compiles-"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(getattr(cls, "root", ""), ignore_errors=True)
        super().tearDownClass()

    def job(self, name: str, world_size: int, *args: str, env: dict | None = None):
        job = launch(
            "srun",
            world_size,
            [WORKER, "--fault-dir", str(self.root / f"faults-{name}"), *args],
            self.root / f"out-{name}",
            env={
                "TORCHINDUCTOR_CACHE_DIR": str(self.root / f"cache-{name}"),
                "PYTHONWARNINGS": "ignore",
                **(env or {}),
            },
            timeout=300,
        )
        self.assertEqual(job.exits, [0] * world_size, job.log_tail())
        reports = job.reports
        self.assertEqual(len(reports), world_size, job.log_tail())
        for report in reports:
            self.assertNotIn("error", report, report.get("error"))
        return reports

    def assert_once_per_host(
        self, reports: list[dict], per_rank: set[str] = frozenset()
    ):
        compiled = collections.Counter(
            name for report in reports for name in report["compiled"]
        )
        shared = set(compiled) - per_rank
        self.assertTrue(shared, compiled)
        for name in shared:
            self.assertEqual(
                compiled[name], 1, f"{name} compiled {compiled[name]} times"
            )
        for name in per_rank:
            self.assertEqual(compiled[name], len(reports), compiled)
        for report in reports:
            stats = report["counters"]
            self.assertEqual(
                stats.get("candidates_compiled", 0) + stats.get("candidates_loaded", 0),
                len(compiled),
                report,
            )

    def test_once_per_host_at_4_ranks_v1(self):
        reports = self.job(
            "v1-4", 4, env={"TORCHINDUCTOR_DEFER_COLLECTIVE_AUTOTUNING": "0"}
        )
        self.assert_once_per_host(reports)
        self.assertEqual([r["ran"] for r in reports], [["rs_ag"]] * 4)
        self.assertEqual([r["exact"] for r in reports], [True] * 4)

    def test_rank_dependent_candidates_compile_on_every_rank_v2(self):
        reports = self.job("v2-rank-dependent", 2, "--rank-dependent")
        self.assert_once_per_host(reports, per_rank={"own_shard"})
        self.assertEqual([r["ran"] for r in reports], [["own_shard"]] * 2)
        self.assertEqual([r["exact"] for r in reports], [True, True])

    def test_a_share_that_raises_and_a_slow_publisher_v2(self):
        reports = self.job(
            "v2-faults",
            2,
            "--compile-raises-once",
            "rs_ag",
            "--slow-compile",
            "direct:6",
        )
        compiled = collections.Counter(n for r in reports for n in r["compiled"])
        # rs_ag: the publisher's compile raised, the other rank compiled it.
        self.assertEqual(compiled["rs_ag"], 2, compiled)
        for report in reports:
            disqualified = report["inductor_counters"]
            self.assertEqual(
                disqualified.get("collective_autotuning_disqualified_raised"), 1, report
            )
        ran = [r["ran"] for r in reports]
        self.assertEqual(ran[0], ran[1])
        self.assertNotEqual(ran[0], ["rs_ag"])
        self.assertEqual([r["exact"] for r in reports], [True, True])
        # direct: compiled once, in 6 s, and loaded by the rank that waited.
        self.assertEqual(compiled["direct"], 1, compiled)
        waited = [r for r in reports if "direct" not in r["compiled"]]
        self.assertEqual(len(waited), 1)
        self.assertGreater(waited[0]["counters"]["compile_wait_s"], 1.0, waited)


if __name__ == "__main__":
    run_tests()
