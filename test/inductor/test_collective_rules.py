"""The decision rules of collective autotuning: pure functions, no process group.

What this checks:

* ``pick_winner``: the fastest qualified candidate wins; near-ties go to
  the default, then to registration order; all-failed gives no winner (every
  rank then uses the default).  Property-based: the winner only depends on
  the agreed times and the order.
* The noise rules: the sign test, a candidate replaces the default only
  when faster in significantly more interleaved runs than chance, drift
  over a session favours no candidate once runs are interleaved, and every
  rank draws the same interleaved order.
* Statuses, result reduction, screening tolerances and configuration
  validation.

These are the bottom layer of ``torch/_inductor/runtime/collective_benchmarking/``
(``types.py``, ``decisions.py`` and ``rules.py``); the tests import nothing above it, so
they run on the first prefix of the series that has it.
"""

from __future__ import annotations

import dataclasses

import math
from datetime import timedelta

import torch
from hypothesis import given, settings, strategies as st
from torch._inductor.runtime.collective_benchmarking import (
    decisions as cd,
    rules as cr,
    types as ct,
)
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
        self.assertEqual(cr.pick_winner([3.0, 1.0, 2.0], tie_tolerance=0.0), 1)

    def test_near_tie_goes_to_the_earlier_candidate(self):
        self.assertEqual(cr.pick_winner([1.01, 1.0, 0.5], tie_tolerance=0.05), 2)
        self.assertEqual(cr.pick_winner([1.01, 1.0, 5.0], tie_tolerance=0.05), 0)
        self.assertEqual(cr.pick_winner([1.01, 1.0], tie_tolerance=0.0), 1)

    def test_exact_tie_without_tolerance_goes_to_the_earlier_candidate(self):
        self.assertEqual(cr.pick_winner([2.0, 1.0, 1.0], tie_tolerance=0.0), 1)

    def test_all_failed_has_no_winner(self):
        self.assertIsNone(cr.pick_winner([math.inf, math.inf], tie_tolerance=0.02))
        self.assertIsNone(cr.pick_winner([], tie_tolerance=0.02))

    def test_disqualified_candidates_never_win(self):
        self.assertEqual(
            cr.pick_winner([math.inf, 9.0, math.inf], tie_tolerance=0.02), 1
        )

    @settings(max_examples=300, deadline=None)
    @given(times=times_strategy, tolerance=st.floats(min_value=0.0, max_value=0.5))
    def test_winner_is_the_first_within_tolerance_of_the_fastest(
        self, times, tolerance
    ):
        winner = cr.pick_winner(times, tolerance)
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
            cr.pick_winner(times, 0.02),
            cr.pick_winner([t * scale for t in times], 0.02),
        )


def result(name: str, runs: list[float], status=OK) -> cd.CandidateResult:
    return cd.CandidateResult(name, (cd.RankReport(status, tuple(runs)),))


class TestNoiseRules(TestCase):
    def test_sign_test(self):
        self.assertEqual(cr.sign_test_p_value([1.0] * 5), 1 / 32)
        self.assertEqual(cr.sign_test_p_value([1.0] * 4 + [-1.0]), 6 / 32)
        self.assertEqual(
            cr.sign_test_p_value([1.0] * 5 + [0.0] * 3), 1 / 32
        )  # ties dropped
        self.assertEqual(cr.sign_test_p_value([]), 1.0)

    @settings(max_examples=100, deadline=None)
    @given(n=st.integers(1, 60), wins=st.data())
    def test_more_wins_is_more_significant(self, n, wins):
        k = wins.draw(st.integers(0, n - 1))
        fewer = cr.sign_test_p_value([1.0] * k + [-1.0] * (n - k))
        more = cr.sign_test_p_value([1.0] * (k + 1) + [-1.0] * (n - k - 1))
        self.assertLessEqual(
            more, fewer
        )  # strictly less in exact arithmetic; floats round 1 - 2**-54 to 1

    def test_a_decision_reads_back_from_json_with_its_rule(self):
        # Remembered decisions and adopted ones travel as JSON: the rule and
        # the noise floor that explain them must survive.
        decision = cd.CollectiveDecision(
            "0",
            (result("default", [1.0, 2.0]), result("other", [0.5, 0.5])),
            "other",
            "fastest; faster than the default in 2 of 2 runs",
            cd.DecisionRule.SIGNIFICANT,
            0.03,
        )
        self.assertEqual(cd.decision_from_json(cd.decision_to_json(decision)), decision)

    def test_nothing_qualified_is_its_own_rule(self):
        failed = cd.CandidateResult("a", (cd.RankReport(cd.CandidateStatus.RAISED),))
        self.assertEqual(
            cr.decide([failed], False, 0.02, 0.95)[:2],
            (None, cd.DecisionRule.ALL_FAILED),
        )

    def test_a_failed_default_tunes_nothing_whatever_the_others_did(self):
        # The default is the op's own code, which the program runs anyway: its
        # failure is the harness's, and "faster" has nothing to be checked
        # against.  The fast candidate must not win.
        default = cd.CandidateResult(
            "default",
            (cd.RankReport(cd.CandidateStatus.RAISED),),
            stage="warmup: RuntimeError: No backend type associated with device type cuda",
        )
        fast = result("fast", [1.0, 1.0, 1.0])
        verdict = cr.decide([default, fast], True, 0.02, 0.95)
        self.assertEqual(verdict[:2], (None, cd.DecisionRule.DEFAULT_FAILED))
        self.assertIn(
            "No backend type associated with device type cuda", verdict.reason
        )
        self.assertIn("nothing is tuned", verdict.reason)
        decision = cd.CollectiveDecision("0", (default, fast), None, "", verdict.rule)
        self.assertTrue(cr.tuned_nothing(decision))
        ok = cr.decide([result("default", [2.0] * 3), fast], True, 0.02, 0.95)
        self.assertFalse(
            cr.tuned_nothing(dataclasses.replace(decision, rule=ok.rule)), ok
        )
        self.assertFalse(cd.worth_storing(decision))
        self.assertTrue(cd.worth_storing(dataclasses.replace(decision, rule=ok.rule)))

    def test_unmeasured_failed_default_tunes_nothing_and_blames_no_one(self):
        # A default that timed out, lost a peer or was not run did not fail
        # where the program runs it: nothing is tuned (there is no reference),
        # and the reason does not blame the harness.
        fast = result("fast", [1.0, 1.0, 1.0])
        for status in (
            cd.CandidateStatus.TIMED_OUT,
            cd.CandidateStatus.PEER_FAILED,
            cd.CandidateStatus.UNSAFE,
        ):
            default = cd.CandidateResult(
                "default", (cd.RankReport(status),), stage="timed"
            )
            verdict = cr.decide([default, fast], True, 0.02, 0.95)
            self.assertEqual(verdict[:2], (None, cd.DecisionRule.NO_REFERENCE))
            self.assertIn(f"{status.description} in timed", verdict.reason)
            self.assertNotIn("at fault", verdict.reason)
            decision = cd.CollectiveDecision(
                "0", (default, fast), None, "", verdict.rule
            )
            self.assertTrue(cr.tuned_nothing(decision))
            self.assertFalse(cd.worth_storing(decision))

    def test_a_faster_candidate_replaces_the_default(self):
        default = result("default", [10.0, 11.0, 10.5, 10.2, 10.8, 10.1])
        faster = result("faster", [8.0, 9.0, 8.5, 8.2, 8.8, 8.1])
        index, rule, reason, _ = cr.decide([default, faster], True, 0.02, 0.95)
        self.assertEqual(index, 1)
        self.assertIs(rule, cd.DecisionRule.SIGNIFICANT)
        self.assertIn("faster than the default in 6 of 6 runs", reason)

    def test_an_advantage_within_the_noise_keeps_the_default(self):
        # A lower median, but faster in only 4 of 6 runs: noise.
        default = result("default", [10.0, 30.0, 10.0, 30.0, 10.0, 30.0])
        candidate = result("noisy", [5.0, 5.0, 12.0, 5.0, 12.0, 5.0])
        self.assertLess(candidate.time_ms, default.time_ms)
        index, rule, reason, _ = cr.decide([default, candidate], True, 0.02, 0.95)
        self.assertEqual(index, 0)
        self.assertIs(rule, cd.DecisionRule.DO_NO_HARM)
        self.assertIn(
            "the default stays: noisy was faster than the default in 4 of 6 runs",
            reason,
        )
        # Without a default there is nothing to protect: the fastest wins.
        self.assertEqual(
            cr.decide([candidate, default], False, 0.02, 0.95)[:2],
            (0, cd.DecisionRule.FASTEST),
        )

    def test_an_advantage_below_the_noise_floor_keeps_the_default(self):
        # Faster in every run, but by 3%, where two runs of the default
        # itself differ by 8%: not a speedup this session can tell.
        default = result("default", [10.0] * 12)
        twin = result("default (again)", [10.8, 9.2] * 6)
        candidate = result("slightly", [9.7] * 12)
        index, rule, reason, _ = cr.decide([default, candidate], True, 0.02, 0.95, twin)
        self.assertEqual((index, rule), (0, cd.DecisionRule.DO_NO_HARM))
        self.assertIn("by 3.0% at the median against a noise floor of 8.0%", reason)
        self.assertAlmostEqual(cr.noise_floor(default, twin), 0.08)
        # The same candidate, in a quiet session, replaces the default.
        quiet = result("default (again)", [10.1, 9.9] * 6)
        self.assertEqual(cr.decide([default, candidate], True, 0.02, 0.95, quiet)[0], 1)

    def test_a_large_advantage_clears_the_noise_floor(self):
        default = result("default", [10.0, 12.0] * 6)
        twin = result("default (again)", [11.0, 11.0] * 6)
        candidate = result("much", [6.0, 7.0] * 6)
        index, _, reason, _ = cr.decide([default, candidate], True, 0.02, 0.95, twin)
        self.assertEqual(index, 1, reason)

    def test_a_failed_twin_leaves_the_sign_test(self):
        default = result("default", [10.0] * 8)
        twin = cd.CandidateResult(
            "default (again)", (cd.RankReport(cd.CandidateStatus.RAISED),)
        )
        self.assertEqual(cr.noise_floor(default, twin), 0.0)
        candidate = result("faster", [9.0] * 8)
        self.assertEqual(cr.decide([default, candidate], True, 0.02, 0.95, twin)[0], 1)

    def test_drift_does_not_favour_the_candidates_timed_later(self):
        # Three equally fast candidates, interleaved as the protocol does, on
        # a machine that gets 1% slower with every call: a sequential order
        # would make the first candidate look 20% faster than the last.
        for seed in ("op-a", "op-b", "op-c"):
            runs: dict[int, list[float]] = {0: [], 1: [], 2: []}
            clock = 0
            for run in range(20):
                for index in cr.interleaved_order(3, f"{seed}|{run}"):
                    runs[index].append(1.0 * 1.01**clock)
                    clock += 1
            results = [result(str(index), runs[index]) for index in range(3)]
            winner, rule, *_ = cr.decide(results, True, 0.02, 0.95)
            self.assertEqual(winner, 0, seed)
            self.assertIn(rule, (cd.DecisionRule.FASTEST, cd.DecisionRule.NEAR_TIE))
            times = [r.time_ms for r in results]
            self.assertLess(max(times) / min(times), 1.1, seed)

    def test_interleaved_order_is_shared_and_varies(self):
        orders = [cr.interleaved_order(4, f"op|{run}") for run in range(8)]
        self.assertEqual(
            orders, [cr.interleaved_order(4, f"op|{run}") for run in range(8)]
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
        self.assertTrue(cr.outputs_match(reference + 5e-6, reference))
        self.assertFalse(cr.outputs_match(reference + 1e-3, reference))
        self.assertFalse(cr.outputs_match(torch.ones(4), reference))
        self.assertFalse(cr.outputs_match(None, reference))
        self.assertTrue(
            cr.outputs_match(torch.ones(8), None)
        )  # nothing to screen against
        self.assertTrue(
            cr.outputs_match(
                torch.ones(8, dtype=torch.bfloat16) * 1.01,
                torch.ones(8, dtype=torch.bfloat16),
            )
        )
        self.assertFalse(cr.outputs_match(torch.arange(4) + 1, torch.arange(4)))

    def test_config_validation(self):
        with self.assertRaisesRegex(ValueError, "nruns"):
            ct.CollectiveBenchmarkConfig(nruns=0)
        with self.assertRaisesRegex(ValueError, "timeout"):
            ct.CollectiveBenchmarkConfig(timeout=timedelta(0))
        with self.assertRaisesRegex(ValueError, ">= 0"):
            ct.CollectiveBenchmarkConfig(retries=-1)
        # The field is named apart, for callers that read it from elsewhere.
        with self.assertRaises(ct.InvalidBenchmarkSetting) as caught:
            ct.CollectiveBenchmarkConfig(confidence=1.0)
        self.assertEqual(
            (caught.exception.field, caught.exception.expected),
            ("confidence", "in [0.5, 1)"),
        )


if __name__ == "__main__":
    run_tests()
