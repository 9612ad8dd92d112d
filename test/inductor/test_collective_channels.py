"""The bottom of collective benchmarking: the store client, timing, groups, channels.

Imports only ``store``, ``timing``, ``groups`` and ``channels`` of the package
(the earliest prefixes of the patch series have no more).  What this checks,
on one process (a one-rank gloo group where one is needed):

* ``StoreClient`` counts every request by kind, in ``requests`` and in the
  process-wide ``store_requests``, with the time of each; ``read_if_set``
  tells an unset key from a set one; the control plane's keys are under
  ``STORE_PREFIX``; a lost connection is a ``CollectiveBenchmarkError``
  naming the store and the request; a ``CollectiveBenchmarkTimeout`` is also
  a ``TimeoutError``.  ``main_store_client`` is one per default store.
* Timing on CPU: positive host times, in call order; a raising call is
  ``CallFailed`` naming its index;
  ``device_of`` is the first tensor's device, else CPU; ``timed`` is a
  ``dynamo_timed`` event (in ``compile_times()``) and counts its seconds.
* ``resolve_group``: ``None`` and the group's name give the default group, an
  unknown name is an error naming it, no process group a
  ``CollectiveBenchmarkError``.
* ``BenchmarkChannel``: a private one-rank group named after the group, one
  per group and reused while healthy, leaving no rendezvous keys; its
  collectives and functional collectives by the group's name (while
  ``registered``, then the name is the user's group again) are right; a
  dropped channel, or one of another timeout, is never handed out again.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch._dynamo.utils import compilation_time_metrics, compile_times, counters
from torch._inductor.runtime.collective_benchmarking import (
    channels as cc,
    groups as cg,
    store as cs,
    timing as ctm,
)
from torch.testing._internal.common_utils import run_tests, TestCase

from rank_processes import one_rank_file_store

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


class BrokenStore(dist.Store):
    def set(self, key, value):
        raise dist.DistNetworkError("Connection reset by peer\nsecond line")


class TestStoreClient(OneRankGroupTestCase):
    def test_requests_are_counted_by_kind(self):
        client = cs.StoreClient(dist.distributed_c10d._get_default_store())
        client.times = []
        before = cs.store_requests.copy()
        self.assertIsNone(client.read_if_set("k"))
        client.set("k", "v")
        self.assertEqual((client.read_if_set("k"), client.get("k")), ("v", "v"))
        self.assertEqual((client.add("n", 2), client.add("n", 3)), (2, 5))
        client.multi_set(["a", "b"], ["1", "2"])
        client.append("b", "3")
        client.delete("a")
        self.assertEqual((client.read_if_set("a"), client.get("b")), (None, "23"))
        expected = {"compare_set": 3, "set": 1, "get": 2, "add": 2, "append": 1}
        expected.update(multi_set=1, delete_key=1)
        self.assertEqual(dict(client.requests), expected)
        self.assertEqual(dict(cs.store_requests - before), expected)
        self.assertEqual(len(client.times), 11)
        self.assertEqual(client.times, sorted(client.times))

    def test_keys_are_under_the_prefix(self):
        self.assertEqual(cs.STORE_PREFIX, "collective_benchmarking")
        self.assertEqual(cs.status_key(3), "collective_benchmarking/status/3")
        self.assertEqual(cs.wake_key(3), "collective_benchmarking/wake/3")

    def test_a_lost_connection_is_an_error_naming_the_store(self):
        with self.assertRaisesRegex(
            cs.CollectiveBenchmarkError,
            r"lost the connection to the job's store \(BrokenStore\) \(set\).*"
            r"Connection reset by peer$",
        ) as caught:
            cs.StoreClient(BrokenStore()).set("k", "v")
        self.assertIsInstance(caught.exception.__cause__, dist.DistNetworkError)
        self.assertTrue(issubclass(cs.CollectiveBenchmarkTimeout, TimeoutError))
        self.assertTrue(
            issubclass(cs.CollectiveBenchmarkTimeout, cs.CollectiveBenchmarkError)
        )

    def test_main_client_is_made_once_per_store(self):
        client = cs.main_store_client()
        self.assertIs(cs.main_store_client(), client)
        dist.destroy_process_group()
        store = one_rank_file_store(self)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        self.assertIsNot(cs.main_store_client(), client)


class TestTiming(TestCase):
    def test_cpu_calls_are_timed_in_order(self):
        ran = []
        calls = [lambda i=i: ran.append(i) for i in range(3)]
        times = ctm.time_calls(calls, CPU, timeout_s=5.0)
        self.assertEqual(ran, [0, 1, 2])
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
        with self.assertRaisesRegex(cs.CollectiveBenchmarkError, "init_process_group"):
            cg.resolve_group(None)
        store = one_rank_file_store(self)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)


class TestBenchmarkChannel(OneRankGroupTestCase):
    def channel(self, seconds=5.0):
        return cc.BenchmarkChannel(self.world, CPU, timedelta(seconds=seconds))

    def test_channel_runs_collectives(self):
        channel = self.channel()
        group = channel.get()
        self.assertIsNot(group, self.world)
        self.assertEqual((group.size(), group.rank()), (1, 0))
        self.assertRegex(group.group_name, rf"^{self.world.group_name}:benchmark\d*$")
        self.assertIs(channel.get(), group)
        self.assertIs(self.channel().get(), group)  # one channel per group
        self.assertEqual(channel.all_reduce_max(3.5), 3.5)
        self.assertEqual(channel.all_gather([1.0, 2.0]), [[1.0, 2.0]])
        tensor = torch.arange(4.0)
        group.allreduce([tensor]).wait()
        self.assertEqual(tensor, torch.arange(4.0))

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
        self.assertEqual(channel.all_reduce_max(-1.0), -1.0)
        self.assertIsNot(self.channel(seconds=6.0).get(), second)  # new timeout
        self.assertEqual(channel.next_session() + 1, self.channel().next_session())


if __name__ == "__main__":
    run_tests()
