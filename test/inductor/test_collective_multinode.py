"""Two nodes on loopback under torchrun, one Inductor cache directory per node.

What this checks: two torchrun launches (``--nnodes 2``, 2 ranks each, c10d
rendezvous) run ``collective_autotuning_jobs.WORKER``, which compiles an
autotuned all_reduce with Inductor's caches at their defaults
(``collective_benchmark_strict`` on), three times, then one
node alone:

* cold start: both caches empty; the four ranks benchmark together;
* warm restart: both caches warm; every rank takes the program from its
  cache and replays its session: nothing is compiled or benchmarked.  The
  winner's code depends on the rank and the node's two ranks share their
  cache directory: each takes the program it compiled;
* skewed restart: one node's cache emptied; its ranks compile and adopt the
  decision the other node's ranks replay: nothing is benchmarked;
* relaunch at another world size: one node, 2 ranks, on the cache that the
  4-rank job left (its program has the world size 4 traced in): every rank
  compiles and benchmarks again, and the result is exact.

Every time, every rank runs the same implementation and the result is
exact; no rank takes part in a failure agreement (nobody waited for a
timeout), and a rank waits at a join no longer than the slowest rank's
first call (the only thing it waits for is another rank's compilation).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from torch.testing._internal.common_utils import TestCase, run_tests
from torch.testing._internal.distributed.collective_autotuning_jobs import (
    launch,
    WORKER,
)


# The launched jobs' Inductor setting (their processes are not this one's):
# a job that tuned nothing fails, and cannot pass by running the default.
STRICT = {"TORCHINDUCTOR_COLLECTIVE_BENCHMARK_STRICT": "1"}


class TwoNodeCachesTest(TestCase):
    def _launch(self, caches: dict[str, Path], out: Path) -> list[dict]:
        # Two nodes of 2 ranks each, or one torchrun of 2 ranks for one cache.
        job = launch(
            "torchrun_nodes" if len(caches) == 2 else "torchrun",
            2 * len(caches),
            [*WORKER, "--rank-dependent"],
            out,
            env=STRICT,
            node_envs=[
                {"NODE_TAG": node, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
                for node, cache in caches.items()
            ],
            rendezvous="c10d",
        )
        self.assertEqual(len(job.reports), 2 * len(caches), job.log_tail())
        for report in job.reports:
            self.assertNotIn("error", report, report)
        return job.reports

    def _check_agreement(self, reports: list[dict]) -> str:
        self.assertEqual(len({tuple(report["ran"]) for report in reports}), 1, reports)
        self.assertTrue(all(report["exact"] for report in reports), reports)
        slowest = max(report["first_call_s"] for report in reports)
        for report in reports:
            self.assertEqual(
                report["counters"].get("failure_agreements", 0), 0, report
            )  # nobody timed out
            self.assertLessEqual(
                report["counters"].get("presync_s", 0.0), slowest, report
            )
        return reports[0]["ran"][0]

    def test_cold_warm_and_skewed_restarts(self):
        with tempfile.TemporaryDirectory(prefix="collective-multinode-") as tmp:
            caches = {"A": Path(tmp, "cache-A"), "B": Path(tmp, "cache-B")}
            for cache in caches.values():
                cache.mkdir()
            cold = self._launch(caches, Path(tmp, "cold"))
            winner = self._check_agreement(cold)
            self.assertEqual(winner, "own_shard")
            self.assertTrue(
                all(report["counters"].get("ops", 0) == 1 for report in cold), cold
            )

            warm = self._launch(caches, Path(tmp, "warm"))
            self.assertEqual(self._check_agreement(warm), winner)
            for report in warm:
                self.assertEqual(
                    (
                        report["counters"].get("replayed_sessions"),
                        report["counters"].get("ops", 0),
                    ),
                    (1, 0),
                    report,
                )

            shutil.rmtree(caches["B"])
            caches["B"].mkdir()
            skewed = self._launch(caches, Path(tmp, "skewed"))
            self.assertEqual(self._check_agreement(skewed), winner)
            for report in skewed:
                counted = report["counters"]
                self.assertEqual(
                    counted.get("ops", 0), 0, report
                )  # adopted, never benchmarked
                if report["node"] == "A":
                    self.assertEqual(counted.get("replayed_sessions"), 1, report)
                else:
                    self.assertEqual(counted.get("recalled"), 1, report)

            resized = self._launch({"A": caches["A"]}, Path(tmp, "resized"))
            self.assertEqual(self._check_agreement(resized), winner)
            for report in resized:
                self.assertEqual(report["world_size"], 2, report)
                # compiled again, not taken from the cache
                self.assertEqual(report["fxgraph"]["hit"], 0, report)
                self.assertGreaterEqual(report["fxgraph"]["miss"], 1, report)
                self.assertEqual(report["counters"].get("ops"), 1, report)  # retuned


if __name__ == "__main__":
    run_tests()
