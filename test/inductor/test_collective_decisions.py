"""The collective benchmarker on one rank, without spawning ranks.

What this checks (the rules themselves are in ``test_collective_rules.py``,
Inductor's choices in ``test_collective_choices.py``):

* Error classification.
* ``CollectiveBenchmarker`` end to end on a one-rank gloo group: a raising
  candidate and a wrong one are disqualified and the others compete, a timed
  out round is retried when retries are configured, timed runs are
  interleaved in the shared order, the decision log shows
  every rank's status and the reason, and misuse (no process group, two
  defaults) is a clear error.  A candidate whose compile (its preparation)
  fails is disqualified.  A batch of ops (the scheduler path) has one
  join and screens each op's candidates against that op's own default.  A
  candidate disqualified before it runs (unsafe on gloo, or calling a
  collective known to crash the group's backend) is not compiled, nor run.
* The list of collectives known to crash names the functional all_gather on
  gloo with CUDA tensors, and nothing else.
* The state a process keeps across compiles (what it warned once, the
  decisions a cached program's replay hands to its recompile) is bounded.
* A session starts no thread, and ``destroy_process_group()`` frees its
  channel; once the channel is built, a store whose host goes away costs the
  session nothing.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import math
import os
import shutil
import tempfile
import threading
import time
import types
from datetime import timedelta
from typing import TYPE_CHECKING
from unittest import mock

import torch
import torch.distributed as dist
from torch._inductor.runtime.collective_benchmarking import (
    benchmarker as cb,
    decisions as cd,
    rules as cr,
    types as ct,
)
from torch.testing._internal.common_utils import TestCase, run_tests
from torch.testing._internal.distributed.collective_autotuning_utils import (
    OneRankGlooTestCase,
)

if TYPE_CHECKING:
    import contextlib

Status = cd.CandidateStatus


def decision_artifacts(payloads: list) -> contextlib.AbstractContextManager:
    """Collect each decision artifact's JSON payload in ``payloads`` instead of tracing it."""
    # Imported here: the prefixes of the series before 0016 have no reporting.
    from torch._inductor.runtime.collective_benchmarking import reporting

    return mock.patch.object(
        reporting,
        "trace_structured",
        side_effect=lambda *a, **k: payloads.append(json.loads(k["payload_fn"]())),
    )


class OneRankGroupTestCase(OneRankGlooTestCase):
    """A one-rank gloo group for each test, and a small benchmark configuration."""

    def setUp(self):
        super().setUp()
        self.config = ct.CollectiveBenchmarkConfig(
            timeout=timedelta(seconds=5), nwarmup=1, nruns=3
        )


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
            statuses,
            {
                "default": Status.OK,
                "raises": Status.RAISED,
                "wrong": Status.WRONG_RESULT,
                "good": Status.OK,
            },
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
            text, r"raises +disqualified.* in warmup[^\n]*attempts=1 +r0:raised"
        )
        self.assertRegex(text, r"default +[0-9.]+ ms .*attempts=1 +r0:ok [0-9.]+ms")

    def test_timed_out_round_is_retried_when_configured(self):
        calls: dict = {}
        flaky = self.candidate(
            "flaky", torch.ones(2), raise_on={2: TimeoutError("stalled")}, calls=calls
        )
        default = self.candidate("default", torch.ones(2), is_default=True)
        once = cb.CollectiveBenchmarker(None, self.config).run([default, flaky])
        self.assertEqual(once.results[1].status, Status.TIMED_OUT)
        calls.clear()
        config = ct.CollectiveBenchmarkConfig(
            timeout=timedelta(seconds=5), nwarmup=1, nruns=3, retries=1
        )
        retried = cb.CollectiveBenchmarker(None, config).run([default, flaky])
        self.assertEqual(
            (retried.results[1].status, retried.results[1].attempts), (Status.OK, 2)
        )

    def test_nothing_qualified_means_no_winner(self):
        candidates = [
            self.candidate("a", None, is_default=True, raise_on={1: RuntimeError("x")})
        ]
        decision = cb.CollectiveBenchmarker(None, self.config).run(candidates)
        self.assertIsNone(decision.winner)

    def test_a_session_that_tunes_nothing_says_why_everywhere(self):
        # The default failing leaves nothing to judge by: no winner, whatever the
        # others did, and the warning, the trace artifact and TORCH_LOGS name
        # each candidate's error alike; strict raises.  The process keeps the
        # decision, so a recompile reruns nothing and warns no more, but stores
        # none: the next process tries again.
        # (Imported here: earlier prefixes of the series lack it.)
        from torch._inductor.runtime.collective_benchmarking import decision_cache

        error = RuntimeError("No backend type associated with device type cuda")
        calls: dict = {}
        op = ct.OpToTune(
            "op",
            [
                self.candidate(
                    "default", None, is_default=True, raise_on={1: error}, calls=calls
                ),
                self.candidate("fast", torch.ones(2), calls=calls),
            ],
            memo_key="op alone",
        )
        stored = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, stored)
        config = dataclasses.replace(self.config, decision_dir=stored)
        payloads = []
        with (
            decision_artifacts(payloads),
            self.assertLogs(cb.log, "WARNING") as warnings,
            self.assertLogs(cb.decision_log, "DEBUG") as table,
        ):
            benchmarker = cb.CollectiveBenchmarker(None, config)
            (decision,) = benchmarker.run_batch([op])
        self.assertEqual(
            (decision.winner, decision.rule), (None, cd.DecisionRule.DEFAULT_FAILED)
        )
        self.assertEqual(decision_cache.recall(benchmarker, op), decision)
        self.assertEqual(os.listdir(stored), [])
        ran = dict(calls)
        with self.assertNoLogs(cb.log, "WARNING"):
            (again,) = cb.CollectiveBenchmarker(None, config).run_batch([op])
        self.assertEqual((again.winner, again.rule, calls), (None, decision.rule, ran))
        why = "disqualified: raised on rank 0 in warmup: RuntimeError: No backend type"
        (payload,) = payloads
        self.assertEqual(payload["rule"], "the default failed: nothing tuned")
        self.assertIn(why, payload["candidates"][0]["why"])
        for report in ("\n".join(warnings.output), "\n".join(table.output)):
            self.assertIn(why, report)
        self.assertIn("tuned nothing", "\n".join(warnings.output))
        strict = ct.CollectiveBenchmarkConfig(
            timeout=timedelta(seconds=5), nwarmup=1, nruns=3, strict=True
        )
        default = self.candidate("default", None, is_default=True, raise_on={1: error})
        with self.assertRaisesRegex(ct.CollectiveBenchmarkError, "tuned nothing"):
            cb.CollectiveBenchmarker(None, strict).run(
                [default, self.candidate("fast", torch.ones(2))]
            )

    def test_every_implementation_out_for_a_wrong_result_is_said_once(self):
        # The op's own code computes less than its implementations (they add
        # a scale): each is screened out against it, the op's own code stays,
        # and that is said once per op and process, naming the
        # implementations, the ranks and the rule; strict raises.
        good = torch.ones(4)
        candidates = [
            self.candidate("default", good, is_default=True),
            self.candidate("scaled", 2 * good),
            self.candidate("shifted", good + 1),
        ]
        op = ct.OpToTune("op", candidates, memo_key="op wrong")
        with self.assertLogs(cb.log, "WARNING") as warnings:
            (decision,) = cb.CollectiveBenchmarker(None, self.config).run_batch([op])
        self.assertEqual(decision.winner, "default")
        (warning,) = warnings.output
        for words in (
            "every registered implementation was disqualified for a wrong result",
            "scaled: disqualified: wrong result on rank 0; "
            "shifted: disqualified: wrong result on rank 0",
            "the op's own code, which is the reference",
            "include_fallback=False",
        ):
            self.assertIn(words, warning)
        with self.assertNoLogs(cb.log, "WARNING"):
            cb.CollectiveBenchmarker(None, self.config).run_batch([op])
        strict = dataclasses.replace(self.config, strict=True)
        with self.assertRaisesRegex(ct.CollectiveBenchmarkError, "wrong result"):
            cb.CollectiveBenchmarker(None, strict).run(candidates, key="op")

    def test_batch_has_one_join_and_screens_each_op_against_its_own_default(self):
        from torch._dynamo.utils import compilation_time_metrics, counters

        counters.clear()
        phases = ["warmup", "timed", "exchange", "commit"]
        for phase in phases:
            compilation_time_metrics.pop(f"collective_autotuning.{phase}", None)
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
            [[r.status for r in d.results] for d in decisions],
            [[Status.OK, Status.OK], [Status.OK, Status.OK]],
        )
        self.assertEqual(
            decisions[1].results[1].attempts, 2
        )  # the timed-out round ran again
        self.assertGreater(counters["collective_autotuning"]["timed_s"], 0)
        # Each phase is a compile event (dynamo_timed): a warmup per candidate
        # and attempt, and at least one exchange and commit.
        events = {
            phase: len(
                compilation_time_metrics.get(f"collective_autotuning.{phase}", [])
            )
            for phase in phases
        }
        self.assertGreaterEqual(events["warmup"], 4)
        self.assertGreaterEqual(events["timed"], 1)
        self.assertGreaterEqual(events["exchange"], 1)
        self.assertGreaterEqual(events["commit"], 1)

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
                [["a", "b", "c", "a"][i] for i in cr.interleaved_order(4, f"op|{run}")],
            )

    def test_deterministic_mode_benchmarks_nothing(self):
        # As for every op in deterministic mode (may_ban_benchmarking), the
        # eager default is taken without a session, on both paths, and the
        # trace says so (0016's reporting, read through decision_artifacts so
        # that the file runs on the prefixes before it).
        from torch._dynamo.utils import counters
        from torch._inductor import config
        from torch._inductor.kernel.custom_op import (
            CustomOpConfig,
            register_custom_op_autotuning,
        )

        funcol = torch.ops._c10d_functional

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

        def direct(x: torch.Tensor, group_name: str) -> torch.Tensor:
            out = funcol.all_reduce(x, "sum", group_name)
            return funcol.wait_tensor(out)

        def twice_halved(x: torch.Tensor, group_name: str) -> torch.Tensor:
            out = funcol.all_reduce(x * 2, "sum", group_name)
            return funcol.wait_tensor(out) / 2

        register_custom_op_autotuning(
            all_reduce, configs=[CustomOpConfig(direct), CustomOpConfig(twice_halved)]
        )
        group_name = dist.group.WORLD.group_name
        for defer in (False, True):
            torch._dynamo.reset()
            counters.clear()
            ran.clear()
            payloads = []
            with (
                decision_artifacts(payloads),
                config.patch(
                    deterministic=True,
                    defer_collective_autotuning=defer,
                    fx_graph_cache=False,
                ),
            ):
                compiled = torch.compile(lambda x: all_reduce(x, group_name) * 2)
                self.assertEqual(compiled(torch.ones(4)), torch.full((4,), 2.0))
            (payload,) = payloads
            self.assertEqual(
                (payload["rule"], payload["source"]),
                ("deterministic mode", "taken without a session"),
            )
            self.assertEqual(payload["winner"], payload["default"])
            self.assertEqual(
                payload["group"], {"name": group_name, "size": 1, "ranks": [0]}
            )
            self.assertEqual(dict(counters["collective_autotuning"]), {})
            self.assertEqual(ran, ["default"])

    def test_two_defaults_are_rejected(self):
        a = self.candidate("a", torch.ones(1), is_default=True)
        with self.assertRaisesRegex(ValueError, "at most one"):
            cb.CollectiveBenchmarker(None, self.config).run([a, a])


class TestBoundedState(TestCase):
    """Module state that a job tuning ever new ops would grow without end is bounded."""

    def test_warnings_said_once_are_remembered_up_to_a_bound(self):
        from torch._inductor.runtime.collective_benchmarking import reporting

        logger_name = "test_collective_decisions.bounded"
        logger = logging.getLogger(logger_name)

        def say(op: str) -> None:
            reporting.say_once(logger, 0, ("g", op), f"{op} tuned nothing", False)

        with (
            mock.patch.object(reporting, "_SAID_LIMIT", 2),
            mock.patch.object(reporting, "_said", collections.OrderedDict()),
        ):
            for op in ("a", "b", "c"):
                with self.assertLogs(logger_name, "WARNING"):
                    say(op)
            self.assertEqual(list(reporting._said), [("g", "b"), ("g", "c")])
            with self.assertNoLogs(logger_name, "WARNING"):
                say("c")
            with self.assertLogs(logger_name, "WARNING"):
                say("a")  # forgotten: said again

    def test_decisions_of_a_replay_wait_for_their_compile_up_to_a_bound(self):
        from torch._inductor.runtime.collective_benchmarking import decision_cache

        decision = cd.CollectiveDecision(
            "g", (), None, "nothing", cd.DecisionRule.ALL_FAILED
        )
        with (
            mock.patch.object(decision_cache, "_PRE_AGREED_LIMIT", 2),
            mock.patch.object(decision_cache, "_pre_agreed", collections.OrderedDict()),
        ):
            for key in ("a", "b", "c"):
                decision_cache.pre_agree("g", key, decision)
            self.assertEqual(list(decision_cache._pre_agreed), [("g", "b"), ("g", "c")])


class TestStoreLifetime(TestCase):
    """A session's threads, channel and store, against a store whose host goes away.

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

    def test_a_session_starts_no_thread_and_destroy_frees_its_channel(self):
        before = set(threading.enumerate())
        candidates = [self.candidate("default", is_default=True), self.candidate("b")]
        decision = cb.CollectiveBenchmarker(None, self.config).run(candidates, key="op")
        self.assertEqual(decision.winner, "default")
        self.assertEqual(set(threading.enumerate()) - before, set())
        tags = dist.distributed_c10d._world.pg_names.values()
        self.assertTrue(any(":benchmark" in name for name in tags), tags)
        dist.destroy_process_group()
        dist.init_process_group(
            "gloo",
            store=dist.TCPStore("127.0.0.1", self.port, 1, False),
            rank=0,
            world_size=1,
        )
        tags = dist.distributed_c10d._world.pg_names.values()
        self.assertFalse(any(":benchmark" in name for name in tags), tags)

    def test_a_store_lost_during_a_session_costs_it_nothing(self):
        def lose_the_store():
            self.server = None  # its server stops with it

        candidates = [
            self.candidate("default", is_default=True),
            self.candidate("b", before=lose_the_store),
        ]
        decision = cb.CollectiveBenchmarker(None, self.config).run(candidates, key="op")
        self.assertEqual(
            [result.status for result in decision.results],
            [cd.CandidateStatus.OK] * 2,
        )


class TestPreparation(OneRankGroupTestCase):
    """Each candidate is compiled once before it runs; one whose compile fails is out."""

    def test_a_candidate_whose_preparation_fails_is_disqualified(self):
        prepared = []

        def prepare(name, raises=False):
            def compile():
                prepared.append(name)
                if raises:
                    raise RuntimeError(f"compile of {name} failed")

            return compile

        out = torch.ones(2)
        candidates = [
            ct.Candidate("default", lambda: out, is_default=True),
            ct.Candidate("a", lambda: out, prepare=prepare("a")),
            ct.Candidate("b", lambda: out, prepare=prepare("b", raises=True)),
        ]
        decision = cb.CollectiveBenchmarker(None, self.config).run(candidates, key="op")
        self.assertEqual(prepared, ["a", "b"])
        statuses = {result.name: result.status for result in decision.results}
        self.assertEqual(
            statuses, {"default": Status.OK, "a": Status.OK, "b": Status.RAISED}
        )


class TestCompiledOnlyIfItCanRun(OneRankGroupTestCase):
    """No candidate is compiled that the session disqualifies before it runs."""

    def test_a_candidate_unsafe_on_gloo_is_not_prepared(self):
        prepared = []
        out = torch.ones(2)
        candidates = [
            ct.Candidate("default", lambda: out, is_default=True),
            ct.Candidate(
                "two_in_flight",
                lambda: out,
                prepare=lambda: prepared.append("two_in_flight"),
                in_flight=2,
            ),
            ct.Candidate(
                "one_in_flight",
                lambda: out,
                prepare=lambda: prepared.append("one_in_flight"),
                in_flight=1,
            ),
        ]
        decision = cb.CollectiveBenchmarker(None, self.config).run(candidates, key="op")
        self.assertEqual(prepared, ["one_in_flight"])
        statuses = {result.name: result.status for result in decision.results}
        self.assertEqual(
            statuses,
            {
                "default": Status.OK,
                "two_in_flight": Status.UNSAFE,
                "one_in_flight": Status.OK,
            },
        )


class TestKnownCrashOnOneRank(OneRankGroupTestCase):
    """A candidate calling a collective known to crash the group's backend never runs."""

    def test_a_candidate_calling_a_collective_known_to_crash_is_neither_prepared_nor_run(
        self,
    ):
        # Imported here: the prefixes of the series before 0021 have no such list.
        from torch._inductor.runtime.collective_benchmarking import known_crashes

        # The crash needs CUDA tensors on gloo: a stand-in entry lists this
        # group's backend and device, so that the rule acts on the CPU.
        stand_in = dataclasses.replace(
            known_crashes.KNOWN_CRASHES[0], device_type="cpu"
        )
        prepared, issued = [], []  # what was compiled, and what reached the backend
        out = torch.ones(2)

        def candidate(name, collectives, is_default=False):
            return ct.Candidate(
                name,
                lambda: (issued.append(name), out)[1],
                is_default=is_default,
                prepare=lambda: prepared.append(name),
                collectives=frozenset(collectives),
            )

        candidates = [
            candidate("default", [], is_default=True),
            candidate(
                "gathers",
                [
                    "_c10d_functional::all_gather_into_tensor",
                    "_c10d_functional::wait_tensor",
                ],
            ),
            candidate("reduces", ["_c10d_functional::all_reduce"]),
        ]
        payloads: list = []
        with (
            mock.patch.object(known_crashes, "KNOWN_CRASHES", (stand_in,)),
            decision_artifacts(payloads),
            self.assertLogs(
                "torch._inductor.runtime.collective_benchmarking.session", "WARNING"
            ) as logs,
        ):
            decision = cb.CollectiveBenchmarker(None, self.config).run(
                candidates, key="op"
            )
        self.assertEqual(prepared, ["default", "reduces"])
        self.assertNotIn("gathers", issued)
        # The others are still warmed up and timed.
        self.assertEqual(
            issued.count("reduces"), self.config.nwarmup + self.config.nruns
        )
        results = {result.name: result for result in decision.results}
        self.assertEqual(results["gathers"].status, Status.UNSAFE)
        self.assertEqual(len(results["reduces"].runs_ms), self.config.nruns)
        (payload,) = payloads
        why = {c["name"]: c["why"] for c in payload["candidates"]}
        for text in (why["gathers"], *logs.output):
            self.assertIn("_c10d_functional::all_gather_into_tensor crashes gloo", text)
            self.assertIn("pytorch/pytorch#152645", text)


class TestKnownCrashes(TestCase):
    """The list of collectives known to crash: what it names, and what not."""

    def test_the_functional_all_gather_crashes_gloo_with_cuda_tensors_only(self):
        from torch._inductor.runtime.collective_benchmarking.known_crashes import (
            known_crash,
        )

        gathers = {
            "_c10d_functional::all_gather_into_tensor",
            "_c10d_functional::wait_tensor",
        }
        op, entry = known_crash("gloo", "cuda", gathers)
        self.assertEqual(op, "_c10d_functional::all_gather_into_tensor")
        self.assertEqual(entry.issue, "pytorch/pytorch#152645")
        self.assertIsNotNone(
            known_crash(
                "gloo", "cuda", ["_c10d_functional::all_gather_into_tensor_coalesced"]
            )
        )
        for backend, device in (("gloo", "cpu"), ("nccl", "cuda"), (None, "cuda")):
            self.assertIsNone(known_crash(backend, device, gathers), (backend, device))
        self.assertIsNone(
            known_crash(
                "gloo",
                "cuda",
                ["_c10d_functional::all_reduce", "_c10d_functional::all_to_all_single"],
            )
        )


class TestTimingOnDevices(OneRankGroupTestCase):
    """Device events on the tensors' device's stream, bounded waits, and the timer named.

    A stand-in for a device module (``torch.get_device_module``) records the
    streams events go on, and can leave its work pending forever.
    """

    def _device_module(self, recorded: list, pending: bool = False):
        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                pass

            def record(self, stream=None) -> None:
                recorded.append(stream)

            def query(self) -> bool:
                return not pending

            def elapsed_time(self, end) -> float:
                return 1.5

        return types.SimpleNamespace(
            Event=Event, current_stream=lambda device: f"current stream of {device}"
        )

    def test_events_go_on_the_stream_of_the_tensors_device(self):
        from torch._inductor.runtime.collective_benchmarking import timing

        recorded: list = []
        module = self._device_module(recorded)
        device = torch.device("cuda", 1)  # not the current device
        with mock.patch.object(torch, "get_device_module", lambda device: module):
            times = timing.time_calls([lambda: None] * 2, device, timeout_s=5)
        self.assertEqual(times, [1.5, 1.5])
        self.assertEqual(set(recorded), {"current stream of cuda:1"})
        self.assertEqual(timing.timer_name(device), "cuda events")
        self.assertEqual(timing.timer_name(torch.device("cpu")), "host clock")

    def test_device_work_that_never_ends_is_a_timeout_not_a_hang(self):
        from torch._inductor.runtime.collective_benchmarking import timing

        module = self._device_module([], pending=True)
        started = time.monotonic()
        with (
            mock.patch.object(torch, "get_device_module", lambda device: module),
            self.assertRaises(ct.CollectiveBenchmarkTimeout),
        ):
            timing.wait_device(torch.device("cuda", 0), time.monotonic() + 0.2)
        self.assertLess(time.monotonic() - started, 5)

    def test_the_artifact_and_the_log_name_the_timer_and_the_runs(self):
        out = torch.ones(2)
        candidates = [
            ct.Candidate("default", lambda: out, is_default=True),
            ct.Candidate("other", lambda: out),
        ]
        payloads: list = []
        with (
            decision_artifacts(payloads),
            self.assertLogs(cb.decision_log, "DEBUG") as logs,
        ):
            decision = cb.CollectiveBenchmarker(None, self.config).run(
                candidates, key="op"
            )
        timer = "host clock, 3 runs per candidate"
        self.assertEqual(decision.timer, timer)
        self.assertEqual(payloads[0]["timer"], timer)
        self.assertIn(f"({timer})", logs.output[0])
        # Remembered decisions keep it.
        self.assertEqual(cd.decision_from_json(cd.decision_to_json(decision)), decision)


class TestMisuse(TestCase):
    def test_uninitialized_process_group_is_a_clear_error(self):
        self.assertFalse(dist.is_initialized())
        with self.assertRaisesRegex(ct.CollectiveBenchmarkError, "init_process_group"):
            cb.CollectiveBenchmarker(None, ct.CollectiveBenchmarkConfig())


if __name__ == "__main__":
    run_tests()
