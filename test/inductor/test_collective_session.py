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
* At 2 ranks, a candidate that issues one more collective on rank 1 than on
  rank 0 where no graph shows it (an opaque op: the join cannot see it) is
  blamed for the failure it causes steps later, ``DESYNCHRONIZED`` on rank
  1, and the healthy candidate still wins on every rank.
"""

from __future__ import annotations

import collections
import dataclasses
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

    def candidate(
        self, name, offset=0.0, fails=False, delay_s=0.0, fails_at_call=0, **kwargs
    ):
        name_of_group = self.group.group_name

        def fn():
            self.calls.append(name)
            time.sleep(delay_s)
            if self.calls.count(name) == fails_at_call:
                raise RuntimeError(f"{name} failed at call {fails_at_call}")
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
        self.assertEqual(len(results[3].runs_ms), 4)  # still timed
        self.assertEqual((twin.status, len(twin.runs_ms)), (Status.OK, 4))
        # On the group's channels (a new one after the failure), never the group.
        for name in self.groups:
            self.assertRegex(name, rf"^{self.group.group_name}:benchmark[\d.]+$")
        # After the failure agreement the op runs again without "raises".
        warmups, timed = self.calls[:9], self.calls[9:]
        self.assertEqual(
            warmups,
            ["default"] * 2
            + ["raises"]
            + ["default", "default", "good", "good"]
            + ["wrong"] * 2,
        )
        competing = ["default", "good", "wrong", "twin"]
        self.assertEqual(len(timed), 4 * len(competing))
        iterations = [timed[i : i + 4] for i in range(0, len(timed), 4)]
        for run, iteration in enumerate(iterations):  # the order every member shares
            order = cr.interleaved_order(len(competing), f"op|{run}")
            self.assertEqual(iteration, [competing[i] for i in order])
        self.assertGreater(len({tuple(i) for i in iterations}), 1)  # shuffled

    def test_a_race_stops_timing_a_candidate_once_it_can_no_longer_win(self):
        # Checkpoints every 5 of 20 iterations.  "slow" loses every paired run
        # to the default: after 5 it could no longer pass the sign test, and
        # stops.  "fast" wins every one: after 15 it passes whatever the other
        # 5 show, and, the last candidate left, decides the op.
        def run(race_every):
            self.config = dataclasses.replace(
                self.config, nwarmup=1, nruns=20, race_every=race_every
            )
            self.calls.clear()
            counters.clear()
            results, twin = self.run_session(
                [
                    self.candidate("default", delay_s=0.01, is_default=True),
                    self.candidate("slow", delay_s=0.03),
                    self.candidate("fast"),
                ],
                twin=self.candidate("twin", delay_s=0.01),
            )
            timed = collections.Counter(self.calls[3:])
            return results, twin, timed

        results, twin, timed = run(race_every=5)
        self.assertEqual(timed, {"default": 15, "twin": 15, "fast": 15, "slow": 5})
        self.assertEqual([len(r.runs_ms) for r in [*results, twin]], [15, 5, 15, 15])
        self.assertEqual(counters["collective_autotuning"]["checkpoints"], 3)
        verdict = cr.decide(results, True, 0.02, 0.95, twin)
        self.assertEqual(
            (verdict.winner, verdict.rule), (2, cd.DecisionRule.SIGNIFICANT)
        )
        # Without checkpoints, each runs 20 times, and the decision is the same.
        results, twin, timed = run(race_every=0)
        self.assertEqual(set(timed.values()), {20})
        self.assertEqual(cr.decide(results, True, 0.02, 0.95, twin).winner, 2)

    def test_a_failure_after_a_checkpoint_runs_the_op_again(self):
        # "flaky" raises in its 8th call (a timed run after the first
        # checkpoint): it is out, and the op runs again from its warmups,
        # raced anew, to the same decision.
        self.config = dataclasses.replace(
            self.config, nwarmup=1, nruns=20, race_every=5
        )
        results, twin = self.run_session(
            [
                self.candidate("default", delay_s=0.01, is_default=True),
                self.candidate("flaky", fails_at_call=8),
                self.candidate("fast"),
            ],
            twin=self.candidate("twin", delay_s=0.01),
        )
        self.assertEqual(
            [r.status for r in results], [Status.OK, Status.RAISED, Status.OK]
        )
        self.assertIn("timed runs", results[1].stage)
        self.assertEqual(
            [len(r.runs_ms) for r in (results[0], results[2], twin)], [15] * 3
        )
        self.assertEqual(cr.decide(results, True, 0.02, 0.95, twin).winner, 2)

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


class TestSessionRunOn2Ranks(RankProcessesTestCase):
    """What a collective on one rank only that no graph shows costs: its candidate."""

    def test_a_collective_issued_on_one_rank_only_is_blamed_on_its_candidate(self):
        group_name = dist.group.WORLD.group_name
        x = torch.full((4,), float(self.rank + 1))
        runs: collections.Counter[str] = collections.Counter()

        def candidate(name, delay_s, is_default=False):
            def fn():
                runs[name] += 1
                time.sleep(delay_s)  # the designed margin between candidates
                y = c10d.wait_tensor(c10d.all_reduce(x, "sum", group_name))
                if name == "hidden" and self.rank == 1 and runs[name] == 1:
                    # As an opaque op's own collective would: it pairs with
                    # rank 0's next one, and nothing fails until steps later.
                    c10d.wait_tensor(c10d.all_reduce(y.clone(), "sum", group_name))
                return y

            return ct.Candidate(name, fn, is_default=is_default)

        candidates = [
            candidate("default", 0.05, is_default=True),
            candidate("hidden", 0.0),  # the fastest
            candidate("good", 0.005),
        ]
        config = ct.CollectiveBenchmarkConfig(
            timeout=timedelta(seconds=5), nwarmup=1, nruns=5
        )
        decision = CollectiveBenchmarker(None, config).run(candidates, key="op")
        everywhere: list = [None] * self.world_size
        dist.all_gather_object(everywhere, repr(decision))  # the group is clean

        self.assertEqual(everywhere, [repr(decision)] * self.world_size)
        self.assertEqual(decision.winner, "good")
        hidden = decision.results[1]
        self.assertEqual(
            [r.status for r in hidden.reports], [Status.OK, Status.DESYNCHRONIZED]
        )
        self.assertIn("more collectives on some ranks", hidden.stage)

    def test_every_rank_stops_timing_a_candidate_at_the_same_round(self):
        # "slow" is slow on rank 1 only: a run's time is its slowest rank's,
        # so both ranks stop timing it at the first checkpoint, and the rest
        # when "fast" has passed the sign test, in the same round.
        group_name = dist.group.WORLD.group_name
        x = torch.full((4,), float(self.rank + 1))
        ran: list[str] = []

        def candidate(name, delay_s, is_default=False):
            def fn():
                ran.append(name)
                time.sleep(delay_s)
                return c10d.wait_tensor(c10d.all_reduce(x, "sum", group_name))

            return ct.Candidate(name, fn, is_default=is_default)

        candidates = [
            candidate("default", 0.01, is_default=True),
            candidate("slow", 0.03 if self.rank == 1 else 0.0),
            candidate("fast", 0.0),
        ]
        config = ct.CollectiveBenchmarkConfig(
            timeout=timedelta(seconds=5), nwarmup=1, nruns=20, race_every=5
        )
        decision = CollectiveBenchmarker(None, config).run(candidates, key="op")
        result = {c.name: c for c in candidates}[decision.winner].fn()
        everywhere: list = [None] * self.world_size
        dist.all_gather_object(everywhere, (ran, repr(decision)))

        self.assertEqual(decision.winner, "fast")
        self.assertEqual([len(r.runs_ms) for r in decision.results], [15, 5, 15])
        self.assertEqual(everywhere, [everywhere[0]] * self.world_size)
        torch.testing.assert_close(result, torch.full((4,), 3.0), rtol=0, atol=0)


if __name__ == "__main__":
    run_tests()
