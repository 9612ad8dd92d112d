"""Caches that a cluster shares: Inductor's remote caches on a real Redis server, and one cache directory for two nodes.

What this checks.  ``collective_autotuning_jobs.WORKER`` (an autotuned
all_reduce whose winner, ``rs_ag``, is known; ``collective_benchmark_timeout``
of 10 s; ``collective_benchmark_strict`` on)
runs as jobs of two torchrun "nodes" on loopback, with a fresh local cache
directory per node in every job, as on new nodes.  Nodes that use the remote
caches turn on both of Inductor's (``TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE`` and
``TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE``) against Debian's ``redis-server`` on
a loopback port (``torch.testing._internal.distributed.redis_server``); a node that does not stands
for a node without the variable set, a remote ``get`` that failed, or an
entry written between two ranks' lookups.  At 2 and 3 ranks:

* first job on an empty server: every rank benchmarks; at 3 ranks the server
  already holds the 2-rank program, which must not serve (another topology):
  the 3-rank job tunes again;
* second job: every rank takes the program from the server, benchmarks
  nothing and replays its session;
* skew (2 ranks; the 3-rank job of ``bench_collective_shared_caches.py``
  shows the same): one node on the server, the other compiling, the machine busy, and
  the server's answers held for three timeouts from the first lookup on
  (``FaultyProxy``'s ``delay``): the compiling ranks wait
  at their join, longer than the timeout (a late member is waited for up to
  the max wait), adopt its decision without benchmarking, and every rank
  runs the same winner, exactly.

Then faults of the server, each costing at most a compile on the ranks that
meet them: the server killed halfway through its first reply of the job (3
ranks), and every entry replaced by garbage (2 ranks).

``SharedCacheDirectoryTest``: two nodes point ``TORCHINDUCTOR_CACHE_DIR`` at
one directory (shared storage); the first job tunes with every rank writing
the same entries, the second takes everything from it, and after every file
of its compiled programs and decisions is torn in half, the third compiles
and tunes again: a torn file is a miss.

Every job: every process exits 0, no rank reports an error, every rank runs
``rs_ag`` and the result is exact.  The compiled kernels of a node's first
job are copied into the next jobs' fresh directories (not the compiled
programs nor the decisions, ``DECISION_CACHES``), which keeps the class to a
few minutes; the slow way to a cached program that reloading kernels takes
on a new node is stood for by the held answer.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import unittest
from pathlib import Path

from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed.collective_autotuning_jobs import (
    busy_machine,
    Job,
    launch,
    WORKER,
    WORKER_TIMEOUT_S as TIMEOUT_S,
)
from torch.testing._internal.distributed.collective_autotuning_utils import (
    DECISION_CACHES,
)
from torch.testing._internal.distributed.redis_server import (
    FaultyProxy,
    missing,
    RedisServer,
)


# The launched jobs' Inductor setting (their processes are not this one's):
# a job that tuned nothing fails, and cannot pass by running the default.
STRICT = {"TORCHINDUCTOR_COLLECTIVE_BENCHMARK_STRICT": "1"}
WINNER = "rs_ag"
# Only a hang comes near it.
LAUNCH_TIMEOUT_S = 300.0
# How long the server's answers are held in the skewed jobs: several
# timeouts, so that the compiling ranks wait at their join longer than one.
HELD_S = 3 * TIMEOUT_S
# Processes that spin beside the ranks in the skewed jobs (2 CPUs in CI).
BUSY_PROCESSES = 2
NODES = ("A", "B")


class _JobsTestCase(TestCase):
    """Launches of the worker as two torchrun nodes, each on a fresh cache directory."""

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.root = Path(tempfile.mkdtemp(prefix="collective-shared-caches-"))
        cls.kernels = cls.root / "kernels"  # compiled kernels, no programs
        cls.kernels.mkdir()
        cls.launches = 0

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.root, ignore_errors=True)
        super().tearDownClass()

    def fresh_cache(self) -> Path:
        """A new node's cache directory: no compiled program, no decision."""
        type(self).launches += 1
        cache = self.root / f"cache-{self.launches}"
        shutil.copytree(self.kernels, cache)
        return cache

    def keep_kernels(self, cache: Path) -> None:
        shutil.copytree(
            cache,
            self.kernels,
            dirs_exist_ok=True,
            ignore=shutil.ignore_patterns(*DECISION_CACHES),
        )

    def launch_nodes(self, world_size: int, node_envs: list[dict[str, str]]) -> Job:
        """``world_size`` ranks as nodes A and B (A takes the larger half), each with its environment."""
        type(self).launches += 1
        job = launch(
            "torchrun_nodes",
            world_size,
            [*WORKER],
            self.root / f"out-{self.launches}",
            env=STRICT,
            node_envs=[
                {"NODE_TAG": node, **env}
                for node, env in zip(NODES, node_envs, strict=True)
            ],
            timeout=LAUNCH_TIMEOUT_S,
        )
        self.assertFalse(job.timed_out, job.log_tail())
        self.assertTrue(job.ok, (job.failures(), job.log_tail()))
        self.assertEqual(len(job.reports), world_size, job.log_tail())
        for report in job.reports:
            self.assertNotIn("error", report, report)
            self.assertEqual(report["world_size"], world_size, report)
            self.assertEqual(report["ran"], [WINNER], report)  # one winner, everywhere
            self.assertTrue(report["exact"], report)
            self.assertEqual(report["counters"].get("failure_agreements", 0), 0)
        print(self.job_line(job), file=sys.stderr, flush=True)
        return job

    def job_line(self, job: Job) -> str:
        """One line per job, for the log: exits, and per rank its node, winner, and what it did."""

        def rank(report: dict) -> str:
            counted = report["counters"]
            source = "cached" if report["aotautograd"]["hit"] else "compiled"
            return (
                f"r{report['rank']}@{report['node']} {'+'.join(report['ran'])} "
                f"{source} benchmarked={counted.get('ops', 0)} "
                f"replayed={counted.get('replayed_sessions', 0)} "
                f"join_wait={counted.get('presync_s', 0.0):.1f}s"
            )

        name = self.id().rsplit(".", 1)[-1]
        ranks = "; ".join(rank(report) for report in job.reports)
        return f"[{name}] {job.world_size} ranks, exits {job.exits}: {ranks}"

    def assert_benchmarked(self, report: dict) -> None:
        """The rank compiled the program and benchmarked the op."""
        self.assertEqual(report["counters"].get("ops"), 1, report)
        self.assertEqual(report["aotautograd"]["hit"], 0, report)

    def assert_served(self, report: dict) -> None:
        """The rank took the program from a cache and replayed its session: no benchmark."""
        self.assertEqual(report["aotautograd"]["hit"], 1, report)
        self.assertEqual(report["counters"].get("replayed_sessions"), 1, report)
        self.assertEqual(report["counters"].get("ops", 0), 0, report)

    def assert_adopted(self, report: dict) -> None:
        """The rank compiled the program and adopted its peers' decision: no benchmark."""
        self.assertEqual(report["aotautograd"]["hit"], 0, report)
        self.assertEqual(report["counters"].get("ops", 0), 0, report)
        self.assertEqual(report["counters"].get("recalled"), 1, report)


@unittest.skipIf(missing(), f"needs {missing()}")
class RemoteCacheJobsTest(_JobsTestCase):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.server = RedisServer().start()
        cls.tuned: set[int] = set()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.stop()
        super().tearDownClass()

    def node_env(
        self, remote: bool, port: int | None = None, server: RedisServer | None = None
    ) -> dict[str, str]:
        """A new node's: a fresh cache directory, on this class's server (or ``server``) or not."""
        return {
            "TORCHINDUCTOR_CACHE_DIR": str(self.fresh_cache()),
            **(server or self.server).env(remote, port),
        }

    def tuned_on_the_server(self, world_size: int) -> None:
        """The first job at ``world_size`` (once per class): every rank tunes; the server keeps the program."""
        if world_size in self.tuned:
            return
        for size in range(2, world_size):  # a smaller job's program is there first
            self.tuned_on_the_server(size)
        envs = [self.node_env(remote=True) for _ in NODES]
        job = self.launch_nodes(world_size, envs)
        for report in job.reports:
            self.assert_benchmarked(report)
        for env in envs:
            self.keep_kernels(Path(env["TORCHINDUCTOR_CACHE_DIR"]))
        self.tuned.add(world_size)

    def served_by_the_server(self, world_size: int) -> None:
        self.tuned_on_the_server(world_size)
        job = self.launch_nodes(world_size, [self.node_env(remote=True) for _ in NODES])
        for report in job.reports:
            self.assert_served(report)

    def skewed_on_a_busy_machine(self, world_size: int) -> None:
        self.tuned_on_the_server(world_size)
        with FaultyProxy(self.server, "delay", HELD_S) as proxy:
            with busy_machine(BUSY_PROCESSES):
                job = self.launch_nodes(
                    world_size,
                    [self.node_env(True, proxy.port), self.node_env(False)],
                )
            self.assertEqual(proxy.faults, 1)
        for report in job.reports:
            if report["node"] == "A":
                self.assert_served(report)
            else:
                self.assert_adopted(report)
        # The compiling ranks waited for a live peer longer than the timeout.
        waited = max(report["counters"]["presync_s"] for report in job.reports)
        self.assertGreater(waited, TIMEOUT_S, job.reports)

    def test_first_and_second_job_2ranks(self):
        self.served_by_the_server(2)

    def test_another_world_size_retunes_then_is_served_3ranks(self):
        self.served_by_the_server(3)

    def test_remote_hit_beside_a_compile_on_a_busy_machine_2ranks(self):
        self.skewed_on_a_busy_machine(2)

    def _copy_of_the_server(self, garbage: bool = False) -> RedisServer:
        """Another server holding every entry of this class's server, or garbage under each key.

        The garbage: AOTAutograd entries that are not JSON; FX graph entries
        that are, with their program cut short.
        """
        copy = RedisServer().start()
        source, target = self.server.client(), copy.client()
        for key in source.scan_iter():
            value = source.get(key)
            if garbage and b"fx-graph" in key:
                value = value[: len(value) // 2] + b'"}'
            elif garbage:
                value = b"\x80 not an entry"
            target.set(key, value)
        self.assertGreater(target.dbsize(), 0)
        return copy

    def test_server_dies_halfway_through_a_reply_3ranks(self):
        self.tuned_on_the_server(3)
        copy = self._copy_of_the_server()
        try:
            with FaultyProxy(copy, "die") as proxy:
                job = self.launch_nodes(
                    3, [self.node_env(True, proxy.port) for _ in NODES]
                )
                self.assertEqual(proxy.faults, 1)
            self.assertIsNotNone(copy.process.poll())  # killed
            for report in job.reports:  # every lookup failed: every rank tuned
                self.assert_benchmarked(report)
        finally:
            copy.stop()

    def test_garbage_entries_2ranks(self):
        self.tuned_on_the_server(2)
        copy = self._copy_of_the_server(garbage=True)
        try:
            job = self.launch_nodes(
                2, [self.node_env(True, server=copy) for _ in NODES]
            )
            for report in job.reports:
                self.assert_benchmarked(report)
        finally:
            copy.stop()


class SharedCacheDirectoryTest(_JobsTestCase):
    def test_two_nodes_on_one_directory_then_torn_files(self):
        shared = self.fresh_cache()
        envs = [{"TORCHINDUCTOR_CACHE_DIR": str(shared)} for _ in NODES]
        first = self.launch_nodes(2, envs)
        for report in first.reports:
            self.assert_benchmarked(report)
        stored = [
            path
            for part in DECISION_CACHES
            for path in (shared / part).rglob("*")
            if path.is_file() and not path.name.startswith(".")
        ]
        # Both nodes wrote programs and decisions there; no temporary file is left.
        self.assertEqual(
            {path.relative_to(shared).parts[0] for path in stored},
            set(DECISION_CACHES),
        )
        self.assertEqual(list(shared.rglob(".*.tmp")), [])

        second = self.launch_nodes(2, envs)
        for report in second.reports:
            self.assert_served(report)

        for path in stored:
            content = path.read_bytes()
            path.write_bytes(content[: len(content) // 2])
        torn = self.launch_nodes(2, envs)
        for report in torn.reports:
            self.assert_benchmarked(report)


if __name__ == "__main__":
    run_tests()
