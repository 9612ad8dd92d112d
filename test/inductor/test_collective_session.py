"""The benchmarking part of a collective autotuning session, on one rank.

What this checks:

* ``SessionRun`` on a one-rank gloo group, with candidates that are plain
  callables all-reducing over the group by its name: their collectives run on
  the benchmark channel, never on the group; a candidate that raises is
  disqualified and never runs again, one whose output differs from the
  default's is screened out (and still timed), the others and the default's
  twin (never warmed up) get finite times; each timed iteration runs every
  competing candidate once, in the shared interleaved order.
* Candidates disqualified before the session (at the join, or keeping several
  collectives in flight on gloo) never run, and keep their result.
"""

from __future__ import annotations

import math
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._inductor.runtime.collective_benchmarking import (
    channels,
    decisions as cd,
    rules as cr,
    types as ct,
)
from torch._inductor.runtime.collective_benchmarking.session import SessionRun
from torch.testing._internal.common_utils import TestCase, run_tests

from rank_processes import one_rank_file_store

Status = cd.CandidateStatus
c10d = torch.ops._c10d_functional


class TestSessionRunOnOneRank(TestCase):
    def setUp(self):
        super().setUp()
        store = one_rank_file_store(self)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        self.group = dist.group.WORLD
        self.config = ct.CollectiveBenchmarkConfig(
            timeout=timedelta(seconds=5), nwarmup=2, nruns=4
        )
        self.calls: list[str] = []
        self.groups: set[str] = set()

    def tearDown(self):
        dist.destroy_process_group()
        super().tearDown()

    def candidate(self, name, offset=0.0, fails=False, **kwargs):
        name_of_group = self.group.group_name

        def fn():
            self.calls.append(name)
            resolved = dist.distributed_c10d._resolve_process_group(name_of_group)
            self.groups.add(resolved.group_name)
            if fails:
                raise RuntimeError(f"{name} failed")
            out = c10d.all_reduce(torch.ones(4), "sum", name_of_group)
            return c10d.wait_tensor(out) + offset

        return ct.Candidate(name, fn, **kwargs)

    def run_session(self, candidates, excluded=None, twin=None):
        channel = channels.BenchmarkChannel(
            self.group, torch.device("cpu"), self.config
        )
        channel.start_session()
        plans = [("op", candidates)]
        cpu, excluded = torch.device("cpu"), excluded or {}
        run = SessionRun(self.config, cpu, channel, plans, excluded, {}, [twin])
        results = run.run()
        return results[0], run.twin_results[0]

    def test_failures_are_disqualified_and_the_rest_timed_interleaved(self):
        names = ["default", "raises", "good", "wrong"]
        results, twin = self.run_session(
            [
                self.candidate("default", is_default=True),
                self.candidate("raises", fails=True),
                self.candidate("good"),
                self.candidate("wrong", offset=1.0),
            ],
            twin=self.candidate("twin"),
        )
        self.assertEqual([r.name for r in results], names)
        self.assertEqual(
            [r.status for r in results],
            [Status.OK, Status.RAISED, Status.OK, Status.WRONG_RESULT],
        )
        self.assertIn("warmup", results[1].stage)
        finite = [math.isfinite(r.time_ms) for r in results]
        self.assertEqual(finite, [True, False, True, False])
        self.assertEqual(len(results[3].reports[0].samples), 4)  # still timed
        self.assertEqual((twin.status, len(twin.runs_ms)), (Status.OK, 4))
        # On the group's channels (a new one after the failure), never the group.
        for name in self.groups:
            self.assertRegex(name, rf"^{self.group.group_name}:benchmark[\d.]+$")
        warmups, timed = self.calls[:7], self.calls[7:]
        self.assertEqual(
            warmups, ["default"] * 2 + ["raises", "good", "good"] + ["wrong"] * 2
        )
        competing = ["default", "good", "wrong", "twin"]
        self.assertEqual(len(timed), 4 * len(competing))
        iterations = [timed[i : i + 4] for i in range(0, len(timed), 4)]
        for run, iteration in enumerate(iterations):  # the order every member shares
            order = cr.interleaved_order(len(competing), f"op|{run}")
            self.assertEqual(iteration, [competing[i] for i in order])
        self.assertGreater(len({tuple(i) for i in iterations}), 1)  # shuffled

    def test_candidates_disqualified_before_the_session_never_run(self):
        at_join = cd.CandidateResult(
            "desync", (cd.RankReport(Status.DESYNCHRONIZED),), stage="join"
        )
        results, _ = self.run_session(
            [
                self.candidate("default", is_default=True),
                self.candidate("desync"),
                self.candidate("overlaps", in_flight=2),
            ],
            excluded={(0, 1): at_join},
        )
        self.assertEqual(results[1], at_join)
        self.assertEqual(results[2].status, Status.UNSAFE)
        self.assertEqual(set(self.calls), {"default"})


if __name__ == "__main__":
    run_tests()
