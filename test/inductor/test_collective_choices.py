"""Inductor's choices as collective candidates: what select_algorithm reads back.

What this checks:

* ``AgreedTimings.agreed_choice``: the choice that runs is the decision's
  winner (never re-picked on the medians), after ``min_speedup_threshold``;
  a disqualified default is no fallback for the threshold; when nothing
  qualified the default runs, and without a default it is an error, never a
  failed choice; a rank-local ``override_best_choice`` cannot
  change the winner.
* ``collective_group_name``: the process group is read from the candidates'
  graphs, and candidates on different groups are an error.
* One gate: custom_op's ``_detect_collective_ops`` finds every functional
  collective (coalesced, ``_out``, broadcast, all_to_all), the autograd
  variants and traced ``c10d`` ops, and nothing else.
* ``settings.benchmark_config``: the sessions' settings come from
  ``torch._inductor.config``; a value out of range or of the wrong type is an
  error naming the knob and its environment variable, when it is read.  The
  switches are read from the environment as upstream's ``Config`` entries are.

No process group is needed: the choices are stand-ins with a name and a graph.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from datetime import timedelta

import torch
import torch._inductor.config as inductor_config
import torch.distributed._functional_collectives  # registers the autograd variants
from torch._inductor.choices import InductorChoices
from torch._inductor.collective_autotuning import settings
from torch._inductor.collective_autotuning.choices import AgreedTimings
from torch._inductor.collective_autotuning.collective_graphs import (
    collective_group_name,
)
from torch._inductor.kernel.custom_op import _detect_collective_ops
from torch._inductor.runtime.collective_benchmarking import (
    decisions as cd,
    rules as cr,
    types as ct,
)
from torch._inductor.virtualized import V
from torch.testing._internal.common_utils import TestCase, run_tests


OK, RAISED = cd.CandidateStatus.OK, cd.CandidateStatus.RAISED


def result(name: str, runs: list[float], status=OK) -> cd.CandidateResult:
    return cd.CandidateResult(name, (cd.RankReport(status),), tuple(runs))


class FakeChoice:
    """What the collective rules read from a ChoiceCaller: a name, and a graph unless it is the default."""

    def __init__(self, name, gm=None):
        self.name, self.gm = name, gm


class TestAgreedChoice(TestCase):
    """The winner comes from the group's decision only, whatever the medians say."""

    def agreed(
        self, decision_winner, times, reason="fastest", rule=cd.DecisionRule.FASTEST
    ):
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
        decision = cd.CollectiveDecision("0", results, decision_winner, reason, rule)
        return choices, AgreedTimings(choices, names, decision)

    def test_the_decision_not_the_medians_names_the_winner(self):
        # "first" is the fastest at the median, but the decision (the sign
        # test or the noise floor) kept the default: the default runs.
        choices, timings = self.agreed(
            "2:default",
            [1.0, 2.0, 4.0],
            "the default stays",
            cd.DecisionRule.DO_NO_HARM,
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
        threshold = cr.apply_speedup_threshold(timings.decision, "2:default", 1.6)
        self.assertEqual(threshold.winner, "2:default")
        self.assertIs(threshold.rule, cd.DecisionRule.MIN_SPEEDUP)
        self.assertIn("1.50x faster, below min_speedup_threshold=1.6", threshold.reason)

    def test_a_disqualified_default_is_no_fallback_for_the_threshold(self):
        choices, timings = self.agreed("0:first", [2.0, 3.0, math.inf])
        self.assertIs(timings.agreed_choice(min_speedup_threshold=10.0), choices[0])

    def test_nothing_qualified_runs_the_default(self):
        choices, timings = self.agreed(None, [math.inf] * 3)
        self.assertIs(timings.agreed_choice(), choices[2])

    def test_nothing_qualified_without_a_default_is_an_error(self):
        # include_fallback=False: no default to fall back to, and no choice
        # that failed may run in its place.
        choices = [FakeChoice("first"), FakeChoice("second")]
        names = [("0:first", False), ("1:second", False)]
        results = tuple(result(name, [], RAISED) for name, _ in names)
        decision = cd.CollectiveDecision(
            "0", results, None, "every candidate failed", cd.DecisionRule.ALL_FAILED
        )
        timings = AgreedTimings(choices, names, decision)
        with self.assertRaisesRegex(ct.CollectiveBenchmarkError, "nothing can run"):
            timings.agreed_choice()

    def test_a_rank_local_override_is_ignored(self):
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
            ct.CollectiveBenchmarkError, r"one process group.*\['tp0', 'tp1'\]"
        ):
            collective_group_name([graph_choice("tp0"), graph_choice("tp1")])


def one_call_choice(target, *args):
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(target, (x, *args)))
    return FakeChoice(str(target), gm=torch.fx.GraphModule({}, graph))


class TestOneGate(TestCase):
    """An op enters the protocol when any candidate's graph can issue a collective.

    custom_op's gate reads the graphs with the protocol's own detector: an op
    whose candidates call only collectives that upstream's list of twelve
    misses would otherwise be benchmarked on each rank alone.
    """

    def test_every_kind_of_collective_opens_the_gate(self):
        functional = torch.ops._c10d_functional
        autograd = torch.ops._c10d_functional_autograd
        calls = [
            (functional.all_reduce.default, "sum", "g"),
            (functional.all_reduce_coalesced.default, "sum", "g"),
            (functional.all_gather_into_tensor_coalesced.default, 2, "g"),
            (functional.all_gather_into_tensor_out.default, 2, "g"),
            (functional.reduce_scatter_tensor_coalesced.default, "sum", 2, "g"),
            (functional.broadcast.default, 0, "g"),
            (functional.all_to_all_single.default, [1, 1], [1, 1], "g"),
            (autograd.all_gather_into_tensor.default, 2, "g"),
            (autograd.reduce_scatter_tensor.default, "sum", 2, "g"),
            (torch.ops.c10d.allreduce_.default,),
            (torch.ops.c10d.broadcast_.default,),
            (torch.ops.symm_mem.one_shot_all_reduce.default, "sum", "g"),
            (torch.ops.symm_mem.two_shot_all_reduce_.default, "sum", "g"),
            (torch.ops.symm_mem.multimem_all_reduce_.default, "sum", "g"),
        ]
        for target, *args in calls:
            with self.subTest(op=str(target)):
                choices = [FakeChoice("default"), one_call_choice(target, *args)]
                self.assertTrue(_detect_collective_ops(choices))
        self.assertFalse(
            _detect_collective_ops(
                [FakeChoice("default"), one_call_choice(torch.ops.aten.add.Tensor, 1)]
            )
        )


class TestSettings(TestCase):
    """What a session runs with is what torch._inductor.config says, or an error naming the knob."""

    def test_values_come_from_the_config(self):
        with inductor_config.patch(
            collective_benchmark_timeout=7,
            collective_benchmark_nruns=9,
            collective_benchmark_race_every=3,
            collective_benchmark_nwarmup=2,
            collective_benchmark_max_wait=90.5,
            collective_benchmark_confidence=0.9,
            collective_benchmark_screen_results=False,
        ):
            config = settings.benchmark_config()
        self.assertEqual(config.timeout, timedelta(seconds=7))
        self.assertEqual((config.nruns, config.race_every, config.nwarmup), (9, 3, 2))
        self.assertEqual(config.max_wait, timedelta(seconds=90.5))
        self.assertEqual((config.confidence, config.screen), (0.9, False))

    def test_a_max_wait_under_the_timeout_is_the_timeout(self):
        with inductor_config.patch(
            collective_benchmark_timeout=60, collective_benchmark_max_wait=5
        ):
            self.assertEqual(
                settings.benchmark_config().max_wait, timedelta(seconds=60)
            )

    def test_out_of_range_names_the_knob_and_its_variable(self):
        for knob, value, expected in (
            ("collective_benchmark_nruns", 0, "must be >= 1, got 0"),
            ("collective_benchmark_race_every", -1, "must be >= 0, got -1"),
            ("collective_benchmark_timeout", -1.0, "must be positive, got -1.0"),
            ("collective_benchmark_confidence", 1.0, r"must be in \[0.5, 1\), got 1.0"),
            ("collective_benchmark_nwarmup", -3, "must be >= 0, got -3"),
        ):
            with self.subTest(knob=knob), inductor_config.patch({knob: value}):
                with self.assertRaisesRegex(
                    ValueError,
                    rf"^torch\._inductor\.config\.{knob} \(environment variable "
                    rf"TORCHINDUCTOR_{knob.upper()}\) {expected}$",
                ):
                    settings.benchmark_config()

    def test_wrong_type_names_the_knob(self):
        for knob, value in (
            ("collective_benchmark_nruns", "50"),
            ("collective_benchmark_nruns", True),
            ("collective_benchmark_nruns", 2.5),
            ("collective_benchmark_screen_results", 1),
        ):
            with (
                self.subTest(knob=knob, value=value),
                inductor_config.patch({knob: value}),
            ):
                with self.assertRaisesRegex(ValueError, rf"\.{knob} .* must be "):
                    settings.benchmark_config()

    def test_switches_are_read_from_the_environment_as_config_entries(self):
        # The switches are Config entries with an env_name_default: "0" and "1"
        # are bools, other text reaches the check as a string and is an error
        # naming the knob and its variable.  Read at import: a fresh process.
        script = (
            "from torch._inductor import config\n"
            "from torch._inductor.collective_autotuning import settings\n"
            "assert settings.deferral_requested() is True\n"
            "assert config.collective_benchmark_allow_gloo_overlap is True\n"
            "try:\n"
            "    settings.benchmark_config()\n"
            "except ValueError as error:\n"
            "    print(error)\n"
        )
        env = {
            **os.environ,
            "TORCHINDUCTOR_DEFER_COLLECTIVE_AUTOTUNING": "1",
            "TORCHINDUCTOR_COLLECTIVE_BENCHMARK_ALLOW_GLOO_OVERLAP": "1",
            "TORCHINDUCTOR_COLLECTIVE_BENCHMARK_STRICT": "yes",
        }
        printed = subprocess.run(
            [sys.executable, "-c", script],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        self.assertEqual(
            printed.strip(),
            "torch._inductor.config.collective_benchmark_strict (environment "
            "variable TORCHINDUCTOR_COLLECTIVE_BENCHMARK_STRICT) must be bool, "
            "got 'yes' (str)",
        )


if __name__ == "__main__":
    run_tests()
