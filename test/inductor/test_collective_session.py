"""The benchmarking part of a collective autotuning session, on one rank and on two.

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
* At 2 ranks, over 3 sessions of ``CollectiveBenchmarker``: a candidate whose
  compile (its ``prepare``) fails on rank 1 only is out on every rank before
  any warmup, naming the rank and the error, with no failure agreement and no
  channel rebuilt; the known winner wins, every rank runs it, exactly.
"""

from __future__ import annotations

import math
import time
from datetime import timedelta
from unittest import mock

import torch
import torch.distributed as dist
from torch._dynamo.utils import counters
from torch._inductor.runtime.collective_benchmarking import (
    channels,
    decisions as cd,
    rules as cr,
    types as ct,
)
from torch._inductor.runtime.collective_benchmarking.benchmarker import (
    CollectiveBenchmarker,
)
from torch._inductor.runtime.collective_benchmarking.session import SessionRun
from torch.testing._internal.common_utils import TestCase, run_tests
from torch.testing._internal.distributed.collective_autotuning_utils import (
    one_rank_file_store,
    RankProcessesTestCase,
)

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
        run = SessionRun(self.config, cpu, channel, plans, excluded, [twin])
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


class TestCompileFailureOn2Ranks(RankProcessesTestCase):
    """What a candidate that fails to compile on one rank costs: itself only."""

    def test_a_candidate_that_fails_to_compile_on_one_rank_costs_no_channel(self):
        group_name = dist.group.WORLD.group_name
        x = torch.full((4,), float(self.rank + 1))
        ran: list[str] = []

        def candidate(name, delay_s, is_default=False, fails_on=None):
            def fn():
                ran.append(name)
                time.sleep(delay_s)  # the designed margin between candidates
                return c10d.wait_tensor(c10d.all_reduce(x, "sum", group_name))

            def prepare():
                if self.rank == fails_on:
                    raise RuntimeError(f"{name} did not compile on this rank")

            return ct.Candidate(name, fn, is_default=is_default, prepare=prepare)

        candidates = [
            candidate("default", 0.05, is_default=True),
            candidate("broken", 0.0, fails_on=1),  # the fastest, had it compiled
            candidate("good", 0.005),
        ]
        config = ct.CollectiveBenchmarkConfig(
            timeout=timedelta(seconds=10), nwarmup=1, nruns=5
        )
        benchmarker = CollectiveBenchmarker(None, config)
        with mock.patch.object(
            channels.BenchmarkChannel,
            "rebuild",
            autospec=True,
            side_effect=channels.BenchmarkChannel.rebuild,
        ) as rebuilds:
            decisions = [benchmarker.run(candidates, key="op") for _ in range(3)]
        ran_in_sessions = list(ran)
        # The program runs the agreed winner.
        ran.clear()
        result = {c.name: c for c in candidates}[decisions[-1].winner].fn()
        everywhere: list = [None] * self.world_size
        dist.all_gather_object(everywhere, (ran_in_sessions, list(ran), decisions))

        self.assertEqual([d.winner for d in decisions], ["good"] * 3)
        for decision in decisions:
            broken = decision.results[1]
            self.assertEqual(broken.name, "broken")
            self.assertEqual(
                [r.status for r in broken.reports], [Status.OK, Status.RAISED]
            )
            self.assertEqual(
                broken.stage,
                "prepare: RuntimeError: broken did not compile on this rank",
            )
        # Out on every rank before any warmup: it never ran, and the others
        # ran in lock-step; the same decisions and winner everywhere.
        self.assertNotIn("broken", ran_in_sessions)
        self.assertEqual(
            [e[0] for e in everywhere], [ran_in_sessions] * self.world_size
        )
        self.assertEqual([e[1] for e in everywhere], [["good"]] * self.world_size)
        self.assertEqual(len({repr(e[2]) for e in everywhere}), 1)
        torch.testing.assert_close(result, torch.full((4,), 3.0), rtol=0, atol=0)
        # At no channel's cost: no failure agreement, no rebuild.
        agreements = counters["collective_autotuning"]["failure_agreements"]
        self.assertEqual((agreements, rebuilds.call_count), (0, 0))


if __name__ == "__main__":
    run_tests()
