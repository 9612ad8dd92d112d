"""The bottom of collective benchmarking: timing, groups, channels.

Imports only ``types``, ``timing``, ``groups``, ``channel_builder`` and
``channels`` of the package (the earliest prefixes of the patch series have
no more).  What this checks, on one process (a one-rank gloo group where one
is needed):

* Timing on CPU: positive host times, in call order, ``before_each`` run
  before each call; a raising call is ``CallFailed`` naming its index;
  ``device_of`` is the first tensor's device, else CPU; ``timed`` is a
  ``dynamo_timed`` event (in ``compile_times()``) and counts its seconds; a
  ``CollectiveBenchmarkTimeout`` is also a ``TimeoutError``.  On a device
  (a stand-in for its event API), each call is waited for by a deadline of
  its own: a call that overruns is blamed, not the last one, and no later
  call is enqueued.
* ``resolve_group``: ``None`` and the group's name give the default group, an
  unknown name is an error naming it, no process group a
  ``CollectiveBenchmarkError``.
* ``BenchmarkChannel``: a private one-rank group named after the group and
  the session, one per group and reused while healthy; its collectives
  (floats, ints, JSON objects) and functional collectives by the group's
  name (while ``registered``, then the name is the user's group again) are
  right, issued outside the Python dispatcher, and it counts the
  collectives issued on it; a dropped channel, or
  one of another timeout, is never handed out again.
* A step that needs every member and fails drops the channel and raises
  ``CollectiveBenchmarkError``; a member that comes to a rebuild after the
  others gave up on it raises at once, saying so.
"""

from __future__ import annotations

import types
from datetime import timedelta
from unittest import mock

import torch
import torch.distributed as dist
from torch._dispatch.python import enable_python_dispatcher
from torch._dynamo.utils import compilation_time_metrics, compile_times, counters
from torch._inductor.runtime.collective_benchmarking import (
    channels as cc,
    groups as cg,
    timing as ctm,
    types as ct,
)
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed.collective_autotuning_utils import (
    one_rank_file_store,
)

CPU = torch.device("cpu")


class OneRankGroupTestCase(TestCase):
    def setUp(self):
        super().setUp()
        self.file_store = one_rank_file_store(self)
        dist.init_process_group("gloo", store=self.file_store, rank=0, world_size=1)
        self.world = dist.group.WORLD

    def tearDown(self):
        dist.destroy_process_group()
        super().tearDown()


class TestTiming(TestCase):
    def test_cpu_calls_are_timed_in_order(self):
        ran = []
        calls = [lambda i=i: ran.append(i) for i in range(3)]
        times = ctm.time_calls(
            calls, CPU, timeout_s=5.0, before_each=lambda i: ran.append(-i - 1)
        )
        self.assertEqual(ran, [-1, 0, -2, 1, -3, 2])
        self.assertEqual(len(times), 3)
        self.assertTrue(all(t > 0 for t in times), times)

    def test_a_raising_call_is_named(self):
        def boom():
            raise ValueError("boom")

        with self.assertRaises(ctm.CallFailed) as caught:
            ctm.time_calls([lambda: None, boom, lambda: None], CPU, 5.0)
        self.assertEqual(caught.exception.index, 1)
        self.assertIsInstance(caught.exception.error, ValueError)

    def test_device_of(self):
        meta = torch.empty(1, device="meta")
        self.assertEqual(ctm.device_of([1, meta, torch.ones(1)]), meta.device)
        self.assertEqual(ctm.device_of([torch.ones(1)]), CPU)
        self.assertEqual(ctm.device_of(["x", 2]), CPU)
        ctm.wait_device(CPU, deadline=0.0)  # nothing to wait for on CPU
        self.assertIsInstance(ct.CollectiveBenchmarkTimeout("x"), TimeoutError)

    def test_a_device_call_that_overruns_is_blamed_not_the_last(self):
        # A stand-in for a device's event API: one in-order stream, whose
        # events complete unless a call enqueued a kernel that never ends
        # before them (as a collective whose peer left).
        stream = types.SimpleNamespace(stuck=False)

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                self.done = False

            def record(self, on) -> None:
                self.done = not on.stuck

            def query(self) -> bool:
                return self.done

            def elapsed_time(self, end) -> float:
                return 2.0

        module = types.SimpleNamespace(Event=Event, current_stream=lambda _: stream)
        ran = []

        def call(name, hangs=False):
            def fn():
                ran.append(name)
                stream.stuck = stream.stuck or hangs

            return fn

        device = torch.device("cuda", 0)
        calls = [call("a"), call("b"), call("hangs", hangs=True), call("d")]
        with mock.patch.object(torch, "get_device_module", lambda _: module):
            self.assertEqual(ctm.time_calls(calls[:2], device, 5.0), [2.0, 2.0])
            with self.assertRaises(ctm.CallFailed) as caught:
                ctm.time_calls(calls, device, timeout_s=0.2)
        # The call that overran is blamed, with a timeout, and the calls
        # after it were never enqueued.
        self.assertEqual(caught.exception.index, 2)
        self.assertIsInstance(caught.exception.error, ct.CollectiveBenchmarkTimeout)
        self.assertEqual(ran, ["a", "b", "a", "b", "hangs"])

    def test_timed_is_a_compile_event_and_counts(self):
        counters.clear()
        compilation_time_metrics.pop("collective_autotuning.probe", None)
        with ctm.timed("probe"):
            pass
        with self.assertRaisesRegex(ValueError, "inside"):
            with ctm.timed("probe"):
                raise ValueError("inside")
        self.assertGreater(counters["collective_autotuning"]["probe_s"], 0)
        # dynamo_timed's record: in compile_times(), once per phase entered.
        self.assertEqual(
            len(compilation_time_metrics["collective_autotuning.probe"]), 2
        )
        self.assertIn("collective_autotuning.probe", compile_times())


class TestResolveGroup(OneRankGroupTestCase):
    def test_default_and_named_groups(self):
        self.assertIs(cg.resolve_group(None), self.world)
        self.assertIs(cg.resolve_group(self.world.group_name), self.world)
        self.assertIs(cg.resolve_group(self.world), self.world)

    def test_bad_group_is_an_error(self):
        with self.assertRaisesRegex(RuntimeError, "no-such-group"):
            cg.resolve_group("no-such-group")
        dist.destroy_process_group()
        with self.assertRaisesRegex(ct.CollectiveBenchmarkError, "init_process_group"):
            cg.resolve_group(None)
        store = one_rank_file_store(self)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)


class TestBenchmarkChannel(OneRankGroupTestCase):
    def channel(self, seconds=5.0):
        config = ct.CollectiveBenchmarkConfig(timeout=timedelta(seconds=seconds))
        channel = cc.BenchmarkChannel(self.world, CPU, config)
        channel.start_session()
        return channel

    def test_channel_runs_collectives(self):
        channel = self.channel()
        group = channel.get()
        self.assertIsNot(group, self.world)
        self.assertEqual((group.size(), group.rank()), (1, 0))
        self.assertRegex(group.group_name, rf"^{self.world.group_name}:benchmark\d+$")
        self.assertIs(channel.get(), group)
        self.assertIs(self.channel().get(), group)  # one channel per group
        self.assertEqual(channel.all_gather([1.0, 2.0]), [[1.0, 2.0]])
        wait = timedelta(seconds=1)
        self.assertEqual(channel.gather_ints([2**59, -3], wait), [[2**59, -3]])
        value = {"stage": "warmup: a|b:c\nd \u2028 e", "steps": [1, [2, 3]]}
        self.assertEqual(channel.gather_objects(value, wait), [value])
        self.assertEqual(channel.broadcast_object(value, 0, wait), value)
        issued = channel.collectives_issued()
        tensor = torch.arange(4.0)
        group.allreduce([tensor]).wait()
        self.assertEqual(tensor, torch.arange(4.0))
        self.assertEqual(channel.collectives_issued(), issued + 1)

    def test_collectives_are_issued_outside_the_python_dispatcher(self):
        # Inductor's lowering enables it; a gloo collective issued under it
        # can deadlock (docs/upstream/gloo-python-dispatcher-deadlock.md).
        channel = self.channel()
        group = channel.get()
        enabled = []

        class Recording:
            def __getattr__(self, name):
                def call(*args):
                    enabled.append(
                        torch._C._dispatch_tls_is_dispatch_key_included(
                            torch._C.DispatchKey.PythonDispatcher
                        )
                    )
                    return getattr(group, name)(*args)

                return call

        with (
            mock.patch.object(channel, "get", return_value=Recording()),
            enable_python_dispatcher(),
        ):
            self.assertEqual(channel.gather_ints([3], timedelta(seconds=1)), [[3]])
            self.assertEqual(channel.all_gather([1.0]), [[1.0]])
            wait = timedelta(seconds=1)
            self.assertEqual(channel.broadcast_object([1], 0, wait), [1])
        self.assertEqual(enabled, [False] * 4)  # the broadcast's size, then payload

    def test_functional_collectives_run_on_the_registered_channel(self):
        channel, name = self.channel(), self.world.group_name
        resolve = dist.distributed_c10d._resolve_process_group
        functional = torch.ops._c10d_functional
        with channel.registered() as group:
            self.assertIs(resolve(name), group)
            out = functional.all_reduce(torch.full((3,), 2.0), "sum", name)
            self.assertEqual(functional.wait_tensor(out), torch.full((3,), 2.0))
        self.assertIs(resolve(name), self.world)

    def test_dropped_channel_is_not_reused(self):
        channel = self.channel()
        first = channel.get()
        channel.drop()
        second = channel.get()
        self.assertIsNot(second, first)
        self.assertIsNot(self.channel().get(), first)
        self.assertEqual(channel.all_gather([-1.0]), [[-1.0]])
        self.assertIsNot(self.channel(seconds=6.0).get(), second)  # new timeout

    def test_a_failed_step_drops_the_channel_and_raises(self):
        channel = self.channel()
        first = channel.get()

        def fails():
            raise RuntimeError("Connection closed by peer")

        with self.assertRaisesRegex(
            ct.CollectiveBenchmarkError, "the step failed on group '0'.*closed by peer"
        ):
            channel.everyone("the step", fails, timedelta(seconds=1))
        self.assertIsNot(channel.get(), first)

    def test_a_member_late_for_a_rebuild_raises_at_once(self):
        # The others gave up on this step: they checked in under its key.
        channel = self.channel()
        store = self.world.get_group_store()
        store.append(
            f"collective_autotuning/{self.world.group_name}/session"
            f"{channel._state.sessions}/step1/present",
            "1,",
        )
        with self.assertRaisesRegex(
            ct.CollectiveBenchmarkError, "gave up waiting for this rank at the rebuild"
        ):
            channel.rebuild("the rebuild")


if __name__ == "__main__":
    run_tests()
