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
* Statuses, result reduction and configuration validation.
* Screening: its bound (``screening_tolerance``) holds for sums of 2 to 64
  values in several orders (rings from different ranks, a tree, float32
  accumulation) in float32, float16 and bfloat16, and tells wrong sums
  from them up to 8 values; non-finite values compare exactly.

These are the bottom layer of ``torch/_inductor/runtime/collective_benchmarking/``
(``types.py``, ``decisions.py`` and ``rules.py``); the tests import nothing above it, so
they run on the first prefix of the series that has it.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
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
    return cd.CandidateResult(name, (cd.RankReport(status),), tuple(runs))


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


class TestRacing(TestCase):
    """``racing``: which candidates a session goes on timing after a checkpoint."""

    def test_a_candidate_that_can_no_longer_win_stops(self):
        default = result("default", [10.0] * 10)
        slower = result("slower", [11.0] * 10)
        tied = result("tied", [9.0, 11.0] * 5)
        faster = result("faster", [9.0] * 10)
        self.assertEqual(
            cr.racing([default, slower, tied, faster], None, 50, 0.95), [2, 3]
        )
        # A tie after 20 rounds would have to win 22 of the last 30.
        self.assertEqual(
            cr.racing(
                [result("default", [10.0] * 20), result("tied", [9.0, 11.0] * 10)],
                None,
                50,
                0.95,
            ),
            [],
        )
        # Won at 60% so far: its chance to pass the test by round 50 is
        # about a third, and it races on.
        better = result("better", [9.0] * 6 + [11.0] * 4)
        self.assertEqual(cr.racing([default, slower, better], None, 50, 0.95), [2])
        # A candidate that was out on a rank never races.
        out = result("out", [9.0] * 10, WRONG)
        self.assertEqual(cr.racing([default, out, faster], None, 50, 0.95), [2])

    def test_the_op_is_decided_when_nothing_can_win(self):
        default = result("default", [10.0] * 20)
        self.assertEqual(
            cr.racing([default, result("slower", [11.0] * 20)], None, 50, 0.95), []
        )
        self.assertEqual(cr.racing([default], None, 50, 0.95), [])

    def test_the_last_candidate_decides_once_the_test_has_passed(self):
        default = result("default", [10.0] * 32)
        faster = result("faster", [9.0] * 32)
        # 32 wins of 50 pass the one-sided sign test at 95% (p = 0.032)
        # whatever the other 18 rounds show: the op is decided.
        self.assertEqual(cr.racing([default, faster], None, 50, 0.95), [])
        self.assertEqual(
            cr.decide([default, faster], True, 0.02, 0.95)[:2],
            (1, cd.DecisionRule.SIGNIFICANT),
        )
        # Not yet after 31 wins; nor, after 32, beside another racing
        # candidate, or within the noise floor that the twin shows.
        self.assertEqual(
            cr.racing(
                [result("d", [10.0] * 31), result("f", [9.0] * 31)], None, 50, 0.95
            ),
            [1],
        )
        other = result("other", [9.5] * 32)
        self.assertEqual(cr.racing([default, faster, other], None, 50, 0.95), [1, 2])
        noisy = result("default (again)", [8.0, 12.0] * 16)
        self.assertEqual(cr.racing([default, faster], noisy, 50, 0.95), [1])

    def test_a_candidate_that_stopped_racing_never_wins(self):
        # Out after 10 rounds with a lucky median below everyone's: the
        # fastest of those timed to the end still wins.
        default = result("default", [10.0] * 50)
        stopped = result("stopped", [1.0] * 5 + [11.0] * 5)
        faster = result("faster", [8.0] * 50)
        verdict = cr.decide([default, stopped, faster], True, 0.02, 0.95)
        self.assertEqual(
            (verdict.winner, verdict.rule), (2, cd.DecisionRule.SIGNIFICANT)
        )

    @settings(max_examples=200, deadline=None)
    @given(
        signs=st.lists(st.sampled_from([-1, 0, 1]), min_size=1, max_size=49),
        rest=st.lists(st.sampled_from([-1, 0, 1]), min_size=49, max_size=49),
    )
    def test_a_decided_op_is_decided_whatever_the_rest_shows(self, signs, rest):
        # A candidate that is the last one left and is declared decided
        # passes the sign test over all 50 rounds, however they end.
        default = result("default", [10.0] * len(signs))
        candidate = result("c", [10.0 - s for s in signs])
        if cr.racing([default, candidate], None, 50, 0.95):
            return
        if cr.compare_with_default(candidate, default).advantage <= 0:
            return  # decided because it can no longer win
        full = signs + rest[: 50 - len(signs)]
        self.assertLessEqual(cr.sign_test_p_value(full), 0.05)

    def test_a_tie_stops_early_and_a_real_winner_races_on(self):
        # Candidates that win each round at 50% (a tie) and at 85%, in
        # simulated sessions of 50 rounds with checkpoints every 10: most
        # ties are out by the second checkpoint, and a real winner is almost
        # never out before it has passed the test.
        rng = random.Random(0)

        def out_at(rate: float) -> int:
            signs = [1 if rng.random() < rate else -1 for _ in range(50)]
            for rounds in range(10, 50, 10):
                default = result("default", [10.0] * rounds)
                candidate = result("c", [10.0 - s for s in signs[:rounds]])
                passed = cr.sign_test_p_value(signs[:rounds] + [-1] * (50 - rounds))
                if not cr.racing([default, candidate], None, 50, 0.95):
                    return rounds if passed > 0.05 else 50
            return 50

        ties = [out_at(0.5) for _ in range(500)]
        winners = [out_at(0.85) for _ in range(500)]
        self.assertGreater(sum(r <= 20 for r in ties) / len(ties), 0.6)
        self.assertLess(sum(r < 50 for r in winners) / len(winners), 0.03)


class TestResultsAndScreening(TestCase):
    def test_candidate_time_is_the_median_of_its_agreed_runs(self):
        combined = cd.CandidateResult("c", (cd.RankReport(OK),) * 2, (3.0, 5.0, 2.5))
        self.assertEqual((combined.status, combined.time_ms), (OK, 3.0))
        failed = dataclasses.replace(
            combined, reports=(cd.RankReport(OK), cd.RankReport(WRONG))
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

    def test_screening_bound_holds_for_sums_in_any_order(self):
        # A reduction of n values (one per rank) in several orders, each
        # rounded as backends and Inductor round: every addition in the dtype
        # (a ring from rank 0 and from another rank), pairwise (a tree), or
        # once after summing in float32 (all_gather then sum).  Every pair of
        # orders matches within the bound, up to 64 terms, and wrong results
        # (off by a quarter of one rank's input, one rank's input missing, a
        # missing scale) are told apart where the bound is tighter than
        # they are wrong: up to 8 terms, the sizes of tensor-parallel groups.
        def ring(values, start, dtype):
            total = values[start]
            for step in range(1, len(values)):
                total = (total.float() + values[(start + step) % len(values)]).to(dtype)
            return total

        def tree(values, dtype):
            while len(values) > 1:
                pairs = [values[i : i + 2] for i in range(0, len(values), 2)]
                values = [sum(p[1:], p[0].float()).to(dtype) for p in pairs]
            return values[0]

        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            for terms in (2, 3, 4, 8, 16, 64):
                generator = torch.Generator().manual_seed(terms)
                values = list(torch.randn(terms, 4096, generator=generator).to(dtype))
                magnitude = ring([v.abs() for v in values], 0, dtype)
                orders = {
                    "ring from 0": ring(values, 0, dtype),
                    "ring from 1": ring(values, 1, dtype),
                    "tree": tree(values, dtype),
                    "in float32": torch.stack(values).float().sum(0).to(dtype),
                }
                for (a, x), (b, y) in itertools.product(orders.items(), repeat=2):
                    self.assertTrue(
                        cr.outputs_match(x, y, magnitude, terms),
                        f"{dtype}, {terms} terms: {a} against {b}",
                    )
                if terms > 8:
                    continue
                reference = orders["ring from 0"]
                wrong = {
                    "off by a quarter of an input": reference + values[1] / 4,
                    "an input missing": ring(values[1:], 0, dtype),
                    "a missing scale": reference * 2,
                }
                for name, output in wrong.items():
                    self.assertFalse(
                        cr.outputs_match(output.to(dtype), reference, magnitude, terms),
                        f"{dtype}, {terms} terms: {name}",
                    )

    def test_screening_compares_non_finite_values_exactly(self):
        reference = torch.tensor([1.0, math.inf, -math.inf, math.nan])
        self.assertTrue(cr.outputs_match(reference.clone(), reference))
        for changed in (
            [1.0, 1e30, -math.inf, math.nan],
            [1.0, math.inf, -math.inf, 0.0],
        ):
            self.assertFalse(cr.outputs_match(torch.tensor(changed), reference))

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
