"""The decision logic of collective autotuning, without spawning ranks.

What this checks:

* ``pick_winner``: the fastest qualified candidate wins; near-ties go to
  the default, then to registration order; all-failed gives no winner (every
  rank then uses the default).  Property-based: the winner only depends on
  the agreed times and the order.
* ``AgreedTimings.agreed_choice``: the choice that runs is the decision's
  winner (never re-picked on the medians), after ``min_speedup_threshold``;
  a rank-local ``override_best_choice`` cannot change it.
* ``earliest_failure``: the rule every rank applies to the failure reports
  of its peers blames the same round with the same statuses, whatever order
  the reports come in.
* The noise rules: the sign test, a candidate replaces the default only
  when faster in significantly more interleaved runs than chance, drift
  over a session favours no candidate once runs are interleaved, and every
  rank draws the same interleaved order.
* Statuses, result reduction, screening tolerances, error classification,
  configuration validation and reading the process group from the graphs.
* ``CollectiveBenchmarker`` end to end on a one-rank gloo group: a raising
  candidate and a wrong one are disqualified and the others compete, a timed
  out round is retried when retries are configured, timed runs are
  interleaved in the shared order, the decision log shows
  every rank's status and the reason, and misuse (no process group, two
  defaults) is a clear error.  Every candidate's preparation starts before
  any is waited for (their kernel builds overlap), and a candidate whose
  build fails is disqualified.  A batch of ops (the scheduler path) has one
  join and screens each op's candidates against that op's own default.
* The control plane's threads are joined when the process group is
  destroyed, and a store whose host goes away during a session is a
  ``CollectiveBenchmarkError`` naming it.
"""

from __future__ import annotations

import math
import tempfile
import threading
from datetime import timedelta

import torch
import torch.distributed as dist
from hypothesis import given, settings, strategies as st
from torch._inductor.runtime.collective_benchmarking import (
    benchmarker as cb,
    decisions as cd,
    store as cs,
    types as ct,
)
from torch._inductor.collective_autotuning.choices import (
    AgreedTimings,
    collective_group_name,
)
from torch._inductor.runtime.collective_benchmarking.session import classify
from torch.testing._internal.common_utils import TestCase, run_tests

OK, PEER, TIMEOUT, WRONG, RAISED = (
    cd.CandidateStatus.OK,
    cd.CandidateStatus.PEER_FAILED,
    cd.CandidateStatus.TIMED_OUT,
    cd.CandidateStatus.WRONG_RESULT,
    cd.CandidateStatus.RAISED,
)
times_strategy = st.lists(
    st.one_of(st.floats(min_value=1e-3, max_value=1e3), st.just(math.inf)),
    min_size=1,
    max_size=8,
)


class TestPickWinner(TestCase):
    def test_fastest_wins(self):
        self.assertEqual(cd.pick_winner([3.0, 1.0, 2.0], tie_tolerance=0.0), 1)

    def test_near_tie_goes_to_the_earlier_candidate(self):
        self.assertEqual(cd.pick_winner([1.01, 1.0, 0.5], tie_tolerance=0.05), 2)
        self.assertEqual(cd.pick_winner([1.01, 1.0, 5.0], tie_tolerance=0.05), 0)
        self.assertEqual(cd.pick_winner([1.01, 1.0], tie_tolerance=0.0), 1)

    def test_exact_tie_without_tolerance_goes_to_the_earlier_candidate(self):
        self.assertEqual(cd.pick_winner([2.0, 1.0, 1.0], tie_tolerance=0.0), 1)

    def test_all_failed_has_no_winner(self):
        self.assertIsNone(cd.pick_winner([math.inf, math.inf], tie_tolerance=0.02))
        self.assertIsNone(cd.pick_winner([], tie_tolerance=0.02))

    def test_disqualified_candidates_never_win(self):
        self.assertEqual(
            cd.pick_winner([math.inf, 9.0, math.inf], tie_tolerance=0.02), 1
        )

    @settings(max_examples=300, deadline=None)
    @given(times=times_strategy, tolerance=st.floats(min_value=0.0, max_value=0.5))
    def test_winner_is_the_first_within_tolerance_of_the_fastest(
        self, times, tolerance
    ):
        winner = cd.pick_winner(times, tolerance)
        finite = [t for t in times if math.isfinite(t)]
        if not finite:
            self.assertIsNone(winner)
            return
        fastest = min(finite)
        self.assertLessEqual(times[winner], fastest * (1 + tolerance))
        for earlier in times[:winner]:
            self.assertFalse(
                math.isfinite(earlier) and earlier <= fastest * (1 + tolerance)
            )

    @settings(max_examples=200, deadline=None)
    @given(times=times_strategy, scale=st.floats(min_value=0.5, max_value=2.0))
    def test_winner_does_not_depend_on_the_unit(self, times, scale):
        # Ranks agree on the times, so only their ratios may decide.
        self.assertEqual(
            cd.pick_winner(times, 0.02),
            cd.pick_winner([t * scale for t in times], 0.02),
        )


def result(name: str, runs: list[float], status=OK) -> cd.CandidateResult:
    return cd.CandidateResult(name, (cd.RankReport(status, tuple(runs)),))


class FakeChoice:
    """What the collective rules read from a ChoiceCaller: a name, and a graph unless it is the default."""

    def __init__(self, name, gm=None):
        self.name, self.gm = name, gm


class TestAgreedChoice(TestCase):
    """The winner comes from the group's decision only, whatever the medians say."""

    def agreed(self, decision_winner, times, reason="fastest"):
        # Choices in registration order, the default (the eager op) last, as
        # Inductor lists them; the decision's results put the default first.
        choices = [FakeChoice("first"), FakeChoice("second"), FakeChoice("default")]
        names = [("0:first", False), ("1:second", False), ("2:default", True)]
        results = tuple(
            result(name, [time] * 5)
            if math.isfinite(time)
            else result(name, [], RAISED)
            for (name, _), time in zip(names, times, strict=True)
        )
        decision = cd.CollectiveDecision("0", results, decision_winner, reason)
        return choices, AgreedTimings(choices, names, decision)

    def test_the_decision_not_the_medians_names_the_winner(self):
        # "first" is the fastest at the median, but the decision (the sign
        # test or the noise floor) kept the default: the default runs.
        choices, timings = self.agreed(
            "2:default", [1.0, 2.0, 4.0], "the default stays"
        )
        self.assertIs(timings.agreed_choice(), choices[2])
        self.assertEqual(
            dict(timings), dict(zip(choices, [1.0, 2.0, 4.0], strict=True))
        )

    def test_min_speedup_threshold_applies_to_the_agreed_medians(self):
        choices, timings = self.agreed("0:first", [2.0, 3.0, 3.0])
        self.assertIs(timings.agreed_choice(), choices[0])
        self.assertIs(timings.agreed_choice(min_speedup_threshold=1.4), choices[0])
        self.assertIs(timings.agreed_choice(min_speedup_threshold=1.6), choices[2])
        threshold = cd.apply_speedup_threshold(timings.decision, "2:default", 1.6)
        self.assertEqual(threshold.winner, "2:default")
        self.assertIn("1.50x faster, below min_speedup_threshold=1.6", threshold.reason)

    def test_a_disqualified_default_is_no_fallback_for_the_threshold(self):
        choices, timings = self.agreed("0:first", [2.0, 3.0, math.inf])
        self.assertIs(timings.agreed_choice(min_speedup_threshold=10.0), choices[0])

    def test_nothing_qualified_runs_the_default(self):
        choices, timings = self.agreed(None, [math.inf] * 3)
        self.assertIs(timings.agreed_choice(), choices[2])

    def test_a_rank_local_override_is_ignored(self):
        from torch._inductor.choices import InductorChoices
        from torch._inductor.virtualized import V

        class Slowest(InductorChoices):
            def override_best_choice(self, best_choice, timings):
                return max(timings, key=timings.__getitem__)

        choices, timings = self.agreed("0:first", [1.0, 2.0, 4.0])
        with (
            V.set_choices_handler(Slowest()),
            self.assertLogs("torch._inductor.collective_autotuning.choices") as logs,
        ):
            self.assertIs(timings.agreed_choice(), choices[0])
        self.assertIn("cannot change on one rank alone", logs.output[0])


class TestFailureAgreement(TestCase):
    def test_earliest_round_takes_the_worst_status_reported_for_it(self):
        # Rank 1 raised in round 2; rank 0 saw its channel fail there; rank 2
        # had finished round 2 and failed in round 3 when rank 1 left.
        posts = ["2:1:warmup", "2:4:warmup", "3:1:warmup"]
        round_index, reports, stage = cd.earliest_failure(posts)
        self.assertEqual(round_index, 2)
        self.assertEqual([r.status for r in reports], [PEER, RAISED, OK])
        self.assertEqual(stage, "warmup")

    def test_timeout_is_retryable_and_a_real_failure_is_not(self):
        self.assertTrue(TIMEOUT.retryable and PEER.retryable)
        self.assertFalse(RAISED.retryable or WRONG.retryable or OK.retryable)
        _, reports, _ = cd.earliest_failure(["1:2:timed runs", "1:1:timed runs"])
        self.assertTrue(max(r.status for r in reports).retryable)

    @settings(max_examples=200, deadline=None)
    @given(
        posts=st.lists(
            st.tuples(
                st.integers(0, 1), st.sampled_from([PEER, TIMEOUT, WRONG, RAISED])
            ),
            min_size=1,
            max_size=6,
        ),
        data=st.data(),
    )
    def test_every_rank_derives_the_same_verdict_in_any_order(self, posts, data):
        texts = [f"{r + 4}:{int(s)}:stage{int(s)}" for r, s in posts]
        shuffled = data.draw(st.permutations(texts))
        first, second = cd.earliest_failure(texts), cd.earliest_failure(shuffled)
        self.assertEqual(first[0], second[0])
        self.assertEqual(
            max(r.status for r in first[1]), max(r.status for r in second[1])
        )
        self.assertEqual(first[2], second[2])


class TestNoiseRules(TestCase):
    def test_sign_test(self):
        self.assertEqual(cd.sign_test_p_value([1.0] * 5), 1 / 32)
        self.assertEqual(cd.sign_test_p_value([1.0] * 4 + [-1.0]), 6 / 32)
        self.assertEqual(
            cd.sign_test_p_value([1.0] * 5 + [0.0] * 3), 1 / 32
        )  # ties dropped
        self.assertEqual(cd.sign_test_p_value([]), 1.0)

    @settings(max_examples=100, deadline=None)
    @given(n=st.integers(1, 60), wins=st.data())
    def test_more_wins_is_more_significant(self, n, wins):
        k = wins.draw(st.integers(0, n - 1))
        fewer = cd.sign_test_p_value([1.0] * k + [-1.0] * (n - k))
        more = cd.sign_test_p_value([1.0] * (k + 1) + [-1.0] * (n - k - 1))
        self.assertLessEqual(
            more, fewer
        )  # strictly less in exact arithmetic; floats round 1 - 2**-54 to 1

    def test_a_faster_candidate_replaces_the_default(self):
        default = result("default", [10.0, 11.0, 10.5, 10.2, 10.8, 10.1])
        faster = result("faster", [8.0, 9.0, 8.5, 8.2, 8.8, 8.1])
        index, reason = cd.decide([default, faster], True, 0.02, 0.95)
        self.assertEqual(index, 1)
        self.assertIn("faster than the default in 6 of 6 runs", reason)

    def test_an_advantage_within_the_noise_keeps_the_default(self):
        # A lower median, but faster in only 4 of 6 runs: noise.
        default = result("default", [10.0, 30.0, 10.0, 30.0, 10.0, 30.0])
        candidate = result("noisy", [5.0, 5.0, 12.0, 5.0, 12.0, 5.0])
        self.assertLess(candidate.time_ms, default.time_ms)
        index, reason = cd.decide([default, candidate], True, 0.02, 0.95)
        self.assertEqual(index, 0)
        self.assertIn(
            "the default stays: noisy was faster than the default in 4 of 6 runs",
            reason,
        )
        # Without a default there is nothing to protect: the fastest wins.
        self.assertEqual(cd.decide([candidate, default], False, 0.02, 0.95)[0], 0)

    def test_an_advantage_below_the_noise_floor_keeps_the_default(self):
        # Faster in every run, but by 3%, where two runs of the default
        # itself differ by 8%: not a speedup this session can tell.
        default = result("default", [10.0] * 12)
        twin = result("default (again)", [10.8, 9.2] * 6)
        candidate = result("slightly", [9.7] * 12)
        index, reason = cd.decide([default, candidate], True, 0.02, 0.95, twin)
        self.assertEqual(index, 0)
        self.assertIn("by 3.0% at the median against a noise floor of 8.0%", reason)
        self.assertAlmostEqual(cd.noise_floor(default, twin), 0.08)
        # The same candidate, in a quiet session, replaces the default.
        quiet = result("default (again)", [10.1, 9.9] * 6)
        self.assertEqual(cd.decide([default, candidate], True, 0.02, 0.95, quiet)[0], 1)

    def test_a_large_advantage_clears_the_noise_floor(self):
        default = result("default", [10.0, 12.0] * 6)
        twin = result("default (again)", [11.0, 11.0] * 6)
        candidate = result("much", [6.0, 7.0] * 6)
        index, reason = cd.decide([default, candidate], True, 0.02, 0.95, twin)
        self.assertEqual(index, 1, reason)

    def test_a_failed_twin_leaves_the_sign_test(self):
        default = result("default", [10.0] * 8)
        twin = cd.CandidateResult(
            "default (again)", (cd.RankReport(cd.CandidateStatus.RAISED),)
        )
        self.assertEqual(cd.noise_floor(default, twin), 0.0)
        candidate = result("faster", [9.0] * 8)
        self.assertEqual(cd.decide([default, candidate], True, 0.02, 0.95, twin)[0], 1)

    def test_drift_does_not_favour_the_candidates_timed_later(self):
        # Three equally fast candidates, interleaved as the protocol does, on
        # a machine that gets 1% slower with every call: a sequential order
        # would make the first candidate look 20% faster than the last.
        for seed in ("op-a", "op-b", "op-c"):
            runs: dict[int, list[float]] = {0: [], 1: [], 2: []}
            clock = 0
            for run in range(20):
                for index in cd.interleaved_order(3, f"{seed}|{run}"):
                    runs[index].append(1.0 * 1.01**clock)
                    clock += 1
            results = [result(str(index), runs[index]) for index in range(3)]
            winner, _ = cd.decide(results, True, 0.02, 0.95)
            self.assertEqual(winner, 0, seed)
            times = [r.time_ms for r in results]
            self.assertLess(max(times) / min(times), 1.1, seed)

    def test_interleaved_order_is_shared_and_varies(self):
        orders = [cd.interleaved_order(4, f"op|{run}") for run in range(8)]
        self.assertEqual(
            orders, [cd.interleaved_order(4, f"op|{run}") for run in range(8)]
        )
        self.assertTrue(all(sorted(order) == [0, 1, 2, 3] for order in orders))
        self.assertGreater(len({tuple(order) for order in orders}), 1)


class TestResultsAndScreening(TestCase):
    def test_candidate_result_is_the_median_of_each_runs_slowest_rank(self):
        reports = (
            cd.RankReport(OK, (1.0, 5.0, 2.0)),
            cd.RankReport(OK, (3.0, 1.0, 2.5)),
        )
        combined = cd.CandidateResult("c", reports)
        self.assertEqual(
            (combined.status, combined.runs_ms, combined.time_ms),
            (OK, [3.0, 5.0, 2.5], 3.0),
        )
        failed = cd.CandidateResult(
            "c", (cd.RankReport(OK, (1.0,)), cd.RankReport(WRONG, (0.5,)))
        )
        self.assertEqual((failed.status, failed.time_ms), (WRONG, math.inf))

    def test_screening_tolerances(self):
        reference = torch.ones(8)
        self.assertTrue(cd.outputs_match(reference + 5e-6, reference))
        self.assertFalse(cd.outputs_match(reference + 1e-3, reference))
        self.assertFalse(cd.outputs_match(torch.ones(4), reference))
        self.assertFalse(cd.outputs_match(None, reference))
        self.assertTrue(
            cd.outputs_match(torch.ones(8), None)
        )  # nothing to screen against
        self.assertTrue(
            cd.outputs_match(
                torch.ones(8, dtype=torch.bfloat16) * 1.01,
                torch.ones(8, dtype=torch.bfloat16),
            )
        )
        self.assertFalse(cd.outputs_match(torch.arange(4) + 1, torch.arange(4)))

    def test_error_classification(self):
        self.assertIs(classify(TimeoutError("x")), TIMEOUT)
        self.assertIs(
            classify(RuntimeError("Timed out waiting 3000ms for recv operation")),
            TIMEOUT,
        )
        self.assertIs(
            classify(dist.DistBackendError("Connection closed by peer [::1]:1")),
            PEER,
        )
        self.assertIs(classify(ValueError("bad shape")), RAISED)

    def test_config_validation(self):
        with self.assertRaisesRegex(ValueError, "nruns"):
            ct.CollectiveBenchmarkConfig(nruns=0)
        with self.assertRaisesRegex(ValueError, "timeout"):
            ct.CollectiveBenchmarkConfig(timeout=timedelta(0))
        with self.assertRaisesRegex(ValueError, ">= 0"):
            ct.CollectiveBenchmarkConfig(retries=-1)


def graph_choice(*group_names: str):
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    for name in group_names:
        x = graph.call_function(
            torch.ops._c10d_functional.all_reduce.default, (x, "sum", name)
        )
        x = graph.call_function(torch.ops._c10d_functional.wait_tensor.default, (x,))
    graph.output(x)
    return FakeChoice(
        f"choice_{'_'.join(group_names)}", gm=torch.fx.GraphModule({}, graph)
    )


class TestGroupFromGraphs(TestCase):
    def test_group_is_read_from_the_candidates(self):
        default = FakeChoice("default")
        self.assertEqual(
            collective_group_name(
                [graph_choice("tp0"), graph_choice("tp0", "tp0"), default]
            ),
            "tp0",
        )
        self.assertIsNone(collective_group_name([default]))

    def test_candidates_on_different_groups_are_an_error(self):
        with self.assertRaisesRegex(
            cs.CollectiveBenchmarkError, r"one process group.*\['tp0', 'tp1'\]"
        ):
            collective_group_name([graph_choice("tp0"), graph_choice("tp1")])


class OneRankGroupTestCase(TestCase):
    """A one-rank gloo group for each test, and a small benchmark configuration."""

    def setUp(self):
        super().setUp()
        store = dist.FileStore(tempfile.mktemp(prefix="collective-decisions-"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        self.config = ct.CollectiveBenchmarkConfig(
            timeout=timedelta(seconds=5), nwarmup=1, nruns=3
        )

    def tearDown(self):
        dist.destroy_process_group()
        super().tearDown()


class TestBenchmarkerOnOneRank(OneRankGroupTestCase):
    """The whole protocol on a one-rank gloo group: decisions without peers."""

    def candidate(self, name, output, is_default=False, raise_on=(), calls=None):
        calls = calls if calls is not None else {}

        def fn():
            calls[name] = calls.get(name, 0) + 1
            if calls[name] in raise_on:
                raise raise_on[calls[name]]
            return output

        return ct.Candidate(name, fn, is_default=is_default)

    def test_failed_candidates_are_disqualified_and_the_rest_compete(self):
        good = torch.ones(4)
        candidates = [
            self.candidate("raises", good, raise_on={1: RuntimeError("boom")}),
            self.candidate("wrong", good + 1),
            self.candidate("good", good),
            self.candidate("default", good, is_default=True),
        ]
        decision = cb.CollectiveBenchmarker(None, self.config).run(candidates, key="op")
        statuses = {result.name: result.status for result in decision.results}
        self.assertEqual(
            statuses, {"default": OK, "raises": RAISED, "wrong": WRONG, "good": OK}
        )
        self.assertEqual(decision.results[0].name, "default")  # benchmarked first
        self.assertIn(decision.winner, {"default", "good"})
        self.assertTrue(math.isinf(decision.time_ms("raises")))

    def test_decision_log_shows_every_rank_and_the_reason(self):
        candidates = [
            self.candidate("raises", None, raise_on={1: RuntimeError("boom")}),
            self.candidate("default", torch.ones(2), is_default=True),
        ]
        with self.assertLogs(cb.decision_log, "DEBUG") as logs:
            cb.CollectiveBenchmarker(None, self.config).run(candidates)
        text = "\n".join(logs.output)
        self.assertIn("winner default (fastest)", text)
        self.assertRegex(
            text, r"raises +disqualified \(raised in warmup\) +attempts=1 +r0:raised"
        )
        self.assertRegex(text, r"default +[0-9.]+ ms +attempts=1 +r0:ok [0-9.]+ms")

    def test_timed_out_round_is_retried_when_configured(self):
        calls: dict = {}
        flaky = self.candidate(
            "flaky", torch.ones(2), raise_on={2: TimeoutError("stalled")}, calls=calls
        )
        default = self.candidate("default", torch.ones(2), is_default=True)
        once = cb.CollectiveBenchmarker(None, self.config).run([default, flaky])
        self.assertEqual(once.results[1].status, TIMEOUT)
        calls.clear()
        config = ct.CollectiveBenchmarkConfig(
            timeout=timedelta(seconds=5), nwarmup=1, nruns=3, retries=1
        )
        retried = cb.CollectiveBenchmarker(None, config).run([default, flaky])
        self.assertEqual(
            (retried.results[1].status, retried.results[1].attempts), (OK, 2)
        )

    def test_nothing_qualified_means_no_winner(self):
        candidates = [
            self.candidate("a", None, is_default=True, raise_on={1: RuntimeError("x")})
        ]
        decision = cb.CollectiveBenchmarker(None, self.config).run(candidates)
        self.assertIsNone(decision.winner)

    def test_batch_has_one_join_and_screens_each_op_against_its_own_default(self):
        from torch._dynamo.utils import counters

        counters.clear()
        calls: dict = {}
        first = [
            self.candidate("first.default", torch.ones(3), is_default=True),
            self.candidate("first.same", torch.ones(3)),
        ]
        second = [
            # Right for the second op, wrong for the first: screening must use
            # the second op's default.
            self.candidate(
                "second.same",
                torch.zeros(3),
                raise_on={2: TimeoutError("stalled")},
                calls=calls,
            ),
            self.candidate("second.default", torch.zeros(3), is_default=True),
        ]
        config = ct.CollectiveBenchmarkConfig(
            timeout=timedelta(seconds=5), nwarmup=1, nruns=3, retries=1
        )
        decisions = cb.CollectiveBenchmarker(None, config).run_batch(
            [ct.OpToTune("first", first), ct.OpToTune("second", second)]
        )
        self.assertEqual(counters["collective_autotuning"]["presync"], 1)
        self.assertEqual(counters["collective_autotuning"]["ops"], 2)
        self.assertEqual(
            [[r.name for r in d.results] for d in decisions],
            [["first.default", "first.same"], ["second.default", "second.same"]],
        )
        self.assertEqual(
            [[r.status for r in d.results] for d in decisions], [[OK, OK], [OK, OK]]
        )
        self.assertEqual(
            decisions[1].results[1].attempts, 2
        )  # the timed-out round ran again
        self.assertGreater(counters["collective_autotuning"]["timed_s"], 0)

    def test_timed_runs_are_interleaved(self):
        order: list[str] = []

        def candidate(name, is_default=False):
            return ct.Candidate(
                name, lambda: order.append(name) or torch.ones(2), is_default=is_default
            )

        config = ct.CollectiveBenchmarkConfig(
            timeout=timedelta(seconds=5), nwarmup=1, nruns=6
        )
        cb.CollectiveBenchmarker(None, config).run(
            [candidate("a", True), candidate("b"), candidate("c")], key="op"
        )
        warmups, timed = order[:3], order[3:]
        self.assertEqual(warmups, ["a", "b", "c"])
        # The default's twin (its second "a" per iteration) measures the noise.
        self.assertEqual(sorted(timed), ["a"] * 12 + ["b"] * 6 + ["c"] * 6)
        for run in range(6):  # every candidate once per iteration, in the shared order
            iteration = timed[4 * run : 4 * run + 4]
            self.assertEqual(
                iteration,
                [["a", "b", "c", "a"][i] for i in cd.interleaved_order(4, f"op|{run}")],
            )

    def test_deterministic_mode_benchmarks_nothing(self):
        # As for every op in deterministic mode (may_ban_benchmarking), the
        # eager default is taken without a session, on both paths.
        from torch._dynamo.utils import counters
        from torch._inductor import config
        from torch._inductor.kernel.collective_implementations import (
            register_collective_implementations,
        )

        ran = []

        @torch.library.custom_op(
            "collective_decisions_test::all_reduce", mutates_args=()
        )
        def all_reduce(x: torch.Tensor, group_name: str) -> torch.Tensor:
            ran.append("default")
            out = x.clone()
            dist.all_reduce(out)
            return out

        @all_reduce.register_fake
        def _(x, group_name):
            return torch.empty_like(x)

        register_collective_implementations(all_reduce, "all_reduce")
        group_name = dist.group.WORLD.group_name
        for defer in (False, True):
            torch._dynamo.reset()
            counters.clear()
            ran.clear()
            with config.patch(
                deterministic=True,
                defer_collective_autotuning=defer,
                fx_graph_cache=False,
            ):
                compiled = torch.compile(lambda x: all_reduce(x, group_name) * 2)
                self.assertEqual(compiled(torch.ones(4)), torch.full((4,), 2.0))
            self.assertEqual(dict(counters["collective_autotuning"]), {})
            self.assertEqual(ran, ["default"])

    def test_sync_with_timeout_returns_when_every_rank_arrived(self):
        self.assertIsNone(cb.sync_with_timeout(None, timedelta(seconds=5)))

    def test_two_defaults_are_rejected(self):
        a = self.candidate("a", torch.ones(1), is_default=True)
        with self.assertRaisesRegex(ValueError, "at most one"):
            cb.CollectiveBenchmarker(None, self.config).run([a, a])

    def test_single_candidate_helper_returns_inf_on_failure(self):
        self.assertTrue(
            math.isfinite(
                cb.try_collective_benchmark_with_timeout(
                    lambda: torch.ones(1), config=self.config
                )
            )
        )

        def boom():
            raise RuntimeError("boom")

        self.assertTrue(
            math.isinf(
                cb.try_collective_benchmark_with_timeout(boom, config=self.config)
            )
        )


class TestStoreLifetime(TestCase):
    """The control plane's threads and requests against a store whose host goes away.

    The store's server is a TCPStore of this process that the process group
    reaches as a client, as every rank but the host does in a job.
    """

    def setUp(self):
        super().setUp()
        self.server = dist.TCPStore(
            "127.0.0.1", 0, 1, True, timeout=timedelta(seconds=10)
        )
        self.port = self.server.port
        client = dist.TCPStore(
            "127.0.0.1", self.port, 1, False, timeout=timedelta(seconds=10)
        )
        dist.init_process_group("gloo", store=client, rank=0, world_size=1)
        self.config = ct.CollectiveBenchmarkConfig(
            timeout=timedelta(seconds=5), nwarmup=1, nruns=3
        )

    def tearDown(self):
        dist.destroy_process_group()
        self.server = None
        super().tearDown()

    def candidate(self, name, is_default=False, before=None):
        def fn():
            if before is not None:
                before()
            return torch.ones(2)

        return ct.Candidate(name, fn, is_default=is_default)

    def liveness_threads(self):
        return [t for t in threading.enumerate() if t.name.startswith("collective-")]

    def test_threads_are_joined_when_the_process_group_is_destroyed(self):
        candidates = [self.candidate("default", is_default=True), self.candidate("b")]
        cb.CollectiveBenchmarker(None, self.config).run(candidates, key="op")
        self.assertEqual(len(self.liveness_threads()), 2)  # heartbeat, wake listener
        dist.destroy_process_group()
        self.assertEqual(self.liveness_threads(), [])
        # The listener was woken through its own key, which it deleted.
        self.assertFalse(
            self.server.check(["default_pg/collective_benchmarking/wake/0"])
        )
        dist.init_process_group(
            "gloo",
            store=dist.TCPStore("127.0.0.1", self.port, 1, False),
            rank=0,
            world_size=1,
        )

    def test_a_store_lost_during_a_session_is_an_error_naming_it(self):
        def lose_the_store():
            self.server = None  # its server stops with it

        candidates = [
            self.candidate("default", is_default=True),
            self.candidate("b", before=lose_the_store),
        ]
        with self.assertRaisesRegex(
            cs.CollectiveBenchmarkError,
            f"lost the connection to the job's store at 127.0.0.1:{self.port}",
        ):
            cb.CollectiveBenchmarker(None, self.config).run(candidates, key="op")


class TestPreparation(OneRankGroupTestCase):
    """Candidates' compilations overlap: every one starts before any is waited for."""

    def test_every_preparation_starts_before_any_is_finished(self):
        events = []

        def prepare(name, finish_raises=False):
            def finish():
                events.append(("finish", name))
                if finish_raises:
                    raise RuntimeError(f"build of {name} failed")

            def start():
                events.append(("start", name))
                return finish

            return start

        out = torch.ones(2)
        candidates = [
            ct.Candidate("default", lambda: out, is_default=True),
            ct.Candidate("a", lambda: out, prepare=prepare("a")),
            ct.Candidate("b", lambda: out, prepare=prepare("b", finish_raises=True)),
            # A preparation that finishes at once returns no callable.
            ct.Candidate("c", lambda: out, prepare=lambda: events.append(("c",))),
        ]
        decision = cb.CollectiveBenchmarker(None, self.config).run(candidates, key="op")
        self.assertEqual(
            events,
            [("start", "a"), ("start", "b"), ("c",), ("finish", "a"), ("finish", "b")],
        )
        statuses = {result.name: result.status for result in decision.results}
        self.assertEqual(statuses, {"default": OK, "a": OK, "b": RAISED, "c": OK})

    def test_compile_in_background_leaves_the_kernel_builds_running(self):
        from concurrent.futures import Future

        from torch._inductor.async_compile import AsyncCompile
        from torch._inductor.collective_autotuning.choices import compile_in_background

        build = Future()  # a kernel's build, handed to the compile workers
        build.set_result("built kernel")
        scope = {"kernel": build}

        def compile():
            # What a compiled module's load does: wait for its kernels.
            AsyncCompile().wait(scope)

        with torch._inductor.config.patch(compile_threads=2):
            finish = compile_in_background(compile)()
            self.assertIs(scope["kernel"], build)  # not waited for yet
            finish()
            self.assertEqual(scope["kernel"], "built kernel")
            # Outside a candidate's preparation, a module's load waits as before.
            scope["kernel"] = build
            compile()
            self.assertEqual(scope["kernel"], "built kernel")


class TestMisuse(TestCase):
    def test_uninitialized_process_group_is_a_clear_error(self):
        self.assertFalse(dist.is_initialized())
        with self.assertRaisesRegex(cs.CollectiveBenchmarkError, "init_process_group"):
            cb.CollectiveBenchmarker(None, ct.CollectiveBenchmarkConfig())


if __name__ == "__main__":
    run_tests()
