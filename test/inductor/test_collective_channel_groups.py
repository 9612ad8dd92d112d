"""Benchmark channels built as c10d builds the user's process group.

Jobs make their groups as torchrun's examples do, ``init_process_group()``
without a backend (``cpu:gloo`` here, ``cpu:gloo,cuda:nccl`` on a GPU
machine), or name one backend for every device type (``gloo`` serves CPU and
CUDA tensors).  What this checks, on one process (one-rank groups):

* A channel serves the device types its group serves, each with the same
  backend, whatever the group was initialized with; a group that c10d did
  not build is an error that says so.
* The channel is a c10d group of its own, unique name: c10d's lookups work
  on it (``get_rank``, ``get_world_size``, ``get_backend``,
  ``get_process_group_ranks``, ``_get_group_tag``), and a collective that
  fails raises the backend's own error, not a lookup's.  The group's name
  resolves to the channel only while the candidates run; a group object
  obtained meanwhile and kept is the channel, under the channel's name.
* The program's groups keep their names: the group's name and
  ``group_count`` are the same after a session, so groups created later are
  named alike on ranks that tuned and ranks that did not;
  ``destroy_process_group()`` destroys and frees the channel with every
  group, and a job that initializes again gets a new one.
* A ``cpu:gloo,cuda:nccl`` group's NCCL part, built by a recording stand-in
  registered as c10d's NCCL backend: the channel's members meet within
  ``max_wait``; its NCCL backend is bound to the group's device, is not
  split from the group's, gets a copy of the group's NCCL options, the
  group's global ranks and the channel's name, and its store still works
  after ``gc.collect()``; then its gloo part is bounded by the protocol's
  timeout and NCCL's watchdog by twice it, so that a step that fails within
  the timeout aborts the channel through c10d (never destroys it) before the
  watchdog fires, and the channel leaves c10d's tables.  A group with no
  CPU side (NCCL alone) gets gloo for the protocol's own collectives.
"""

from __future__ import annotations

import gc
import weakref
from datetime import timedelta
from unittest import mock

import torch
import torch.distributed as dist
from torch._dynamo.utils import counters
from torch._inductor.runtime.collective_benchmarking import (
    channel_builder as cb,
    channels as cc,
)
from torch._inductor.runtime.collective_benchmarking.benchmarker import (
    CollectiveBenchmarker,
)
from torch._inductor.runtime.collective_benchmarking.types import (
    Candidate,
    CollectiveBenchmarkConfig,
    CollectiveBenchmarkError,
    CollectiveBenchmarkTimeout,
)
from torch.distributed.distributed_c10d import (
    _get_group_tag,
    _resolve_process_group,
    _world,
    Backend,
)
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    TestCase,
)
from torch.testing._internal.distributed.collective_autotuning_utils import (
    one_rank_file_store,
)

CPU = torch.device("cpu")
TIMEOUT = timedelta(seconds=5)
CONFIG = CollectiveBenchmarkConfig(timeout=TIMEOUT, max_wait=4 * TIMEOUT)
funcol = torch.ops._c10d_functional


class ChannelGroupTestCase(TestCase):
    def init(self, backend: str | None) -> dist.ProcessGroup:
        store = one_rank_file_store(self)
        dist.init_process_group(backend, store=store, rank=0, world_size=1)
        self.addCleanup(self._destroy)
        return dist.group.WORLD

    def _destroy(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


@instantiate_parametrized_tests
class TestChannelMirrorsItsGroup(ChannelGroupTestCase):
    @parametrize("backend", [None, "gloo", "cpu:gloo"])
    def test_serves_the_device_types_of_its_group(self, backend):
        group = self.init(backend)
        channel = cc.BenchmarkChannel(group, CPU, CONFIG).get()
        self.assertEqual(set(channel._device_types), set(group._device_types))
        for device in group._device_types:
            self.assertEqual(
                channel._get_backend(device).name(), group._get_backend(device).name()
            )
        expected = (
            {"cpu": "gloo"} if backend != "gloo" else {"cpu": "gloo", "cuda": "gloo"}
        )
        self.assertEqual(cb.served_backends(group), expected)

    def test_a_group_c10d_did_not_build_is_an_error_that_says_so(self):
        self.init(None)
        # A ProcessGroup made directly, as a library might: c10d recorded no
        # backend config for it, so the channel cannot mirror it.
        bare = dist.ProcessGroup(dist.distributed_c10d._get_default_store(), 0, 1)
        with self.assertRaisesRegex(
            CollectiveBenchmarkError, "was not created by torch.distributed"
        ):
            cb.served_backends(bare)

    def test_c10d_lookups_work_and_a_failing_collective_raises_its_own_error(self):
        group = self.init(None)
        channel = cc.BenchmarkChannel(group, CPU, CONFIG)
        channel.start_session()
        with channel.registered() as registered:
            self.assertEqual(
                (
                    dist.get_rank(registered),
                    dist.get_world_size(registered),
                    dist.get_backend(registered),
                    dist.get_process_group_ranks(registered),
                ),
                (0, 1, "undefined", [0]),
            )
            self.assertEqual(_get_group_tag(registered), registered.group_name)
            # c10d's logger around a failing collective looks the group up:
            # without the channel in its tables, a ValueError hid this error.
            with self.assertRaisesRegex(RuntimeError, "invalid tensor size"):
                dist.all_gather_into_tensor(
                    torch.empty(3), torch.ones(2), group=registered
                )
        self.assertIs(_resolve_process_group(group.group_name), group)
        self.assertEqual(_world.pg_names[registered], registered.group_name)

    def test_names_are_unique_and_a_kept_group_object_is_the_channel(self):
        group = self.init(None)
        channel = cc.BenchmarkChannel(group, CPU, CONFIG)
        channel.start_session()
        with channel.registered() as first:
            kept = _resolve_process_group(group.group_name)
        # What candidate code kept is the channel, not the user's group: its
        # collectives ran on the channel while it lived (same ranks), and it
        # is out of c10d's tables once the channel is dropped.
        self.assertIs(kept, first)
        self.assertRegex(kept.group_name, rf"^{group.group_name}:benchmark\d+$")
        self.assertIs(_resolve_process_group(group.group_name), group)
        tensor = torch.ones(2)
        dist.all_reduce(tensor, group=kept)
        self.assertEqual(tensor, torch.ones(2))
        channel.drop()
        self.assertNotIn(kept, _world.pg_map)
        channel.start_session()
        second = channel.get()
        self.assertRegex(second.group_name, rf"^{group.group_name}:benchmark\d+$")
        self.assertNotEqual(second.group_name, first.group_name)
        names = list(_world.pg_names.values())
        self.assertEqual(len(names), len(set(names)))
        self.assertEqual(sorted(names), sorted([group.group_name, second.group_name]))

    def test_the_programs_groups_keep_their_names(self):
        group = self.init(None)
        names, count = dict(_world.pg_names), _world.group_count
        name = group.group_name
        candidates = [
            Candidate("default", lambda: torch.ones(2), is_default=True),
            Candidate(
                "direct",
                lambda: funcol.wait_tensor(
                    funcol.all_reduce(torch.ones(2), "sum", name)
                ),
            ),
        ]
        config = CollectiveBenchmarkConfig(timeout=TIMEOUT, nwarmup=1, nruns=3)
        counters.clear()
        decision = CollectiveBenchmarker(None, config).run(candidates, key="op")
        self.assertEqual(counters["collective_autotuning"]["ops"], 1)
        self.assertIn(decision.winner, {"default", "direct"})
        self.assertEqual(_world.group_count, count)
        self.assertEqual(_world.pg_names[group], names[group])
        state = cc._group_states[name]
        self.assertEqual(set(_world.pg_map), {group, state.channel})
        # destroy_process_group() destroys and frees it (its gloo threads and
        # sockets: a process forked later must not inherit them); a new
        # group gets a new channel.
        built = weakref.ref(state.channel)
        dist.destroy_process_group()
        gc.collect()
        self.assertIsNone(built())
        self.assertIsNone(state.channel)
        group = self.init(None)
        self.assertIsNotNone(cc.BenchmarkChannel(group, CPU, CONFIG).get())


class TestNcclPartOfAMixedGroup(ChannelGroupTestCase):
    def setUp(self):
        super().setUp()
        # A recording stand-in for c10d's NCCL backend: a gloo backend
        # underneath (no GPU here), its construction arguments recorded.
        self.built: list = []
        Backend._ensure_backend_registered("nccl")
        real = Backend._plugins["NCCL"]
        self.addCleanup(Backend._plugins.__setitem__, "NCCL", real)

        def recording(options, backend_options):
            self.built.append((options, backend_options))
            return dist.ProcessGroupGloo(
                options.store, options.group_rank, options.group_size, options.timeout
            )

        Backend._plugins["NCCL"] = Backend._BackendPlugin(recording, True)
        # And the stores c10d's gloo creator is given.
        self.gloo_stores: list = []
        Backend._ensure_backend_registered("gloo")
        gloo = Backend._plugins["GLOO"]
        self.addCleanup(Backend._plugins.__setitem__, "GLOO", gloo)

        def gloo_recording(options, backend_options):
            self.gloo_stores.append(options.store)
            return gloo.creator_fn(options, backend_options)

        Backend._plugins["GLOO"] = Backend._BackendPlugin(gloo_recording, True)

    def test_construction_arguments(self):
        group = self.init("cpu:gloo,cuda:nccl")
        group.bound_device_id = torch.device("cuda", 3)  # as device_id= binds it
        channel = cc.BenchmarkChannel(group, CPU, CONFIG)
        channel.start_session()
        built = channel.get()
        self.assertEqual(len(self.built), 2)  # the group's, then the channel's
        options, nccl_options = self.built[-1]
        self.assertIs(options.process_group, built)
        self.assertEqual(built.bound_device_id, torch.device("cuda", 3))
        self.assertEqual(options.timeout, CONFIG.max_wait)  # the members meet
        self.assertEqual(options.global_ranks_in_group, [0])
        self.assertEqual(options.group_id, built.group_name)
        self.assertIsNone(options.split_from)  # a split is a collective
        self.assertIsInstance(nccl_options, dist.ProcessGroupNCCL.Options)
        # Then every collective is bounded by the timeout, gloo's ending one
        # that a peer left, but NCCL's watchdog would end the process at its
        # own: it gets twice the timeout, so that the protocol aborts first.
        self.assertEqual(built._get_backend(CPU).options._timeout, TIMEOUT)
        cuda = torch.device("cuda")
        self.assertEqual(built._get_backend(cuda).options._timeout, 2 * TIMEOUT)
        self.assertEqual(set(built._device_types), set(group._device_types))
        self.assertEqual(channel.backend, "gloo")  # CPU candidates run on gloo
        # NCCL rendezvous at its first collective, long after the build; a
        # store written in Python (gloo's, which records its keys) must live
        # as long as the channel: c10d holds only its C++ half.
        gc.collect()
        for store in (options.store, self.gloo_stores[-1]):
            store.set("unique_id", "x")
            self.assertEqual(store.get("unique_id"), b"x")
        self.assertEqual(channel.all_gather([2.0]), [[2.0]])
        # A step that fails aborts a channel with an NCCL part, through c10d
        # (never destroys it: an NCCL kernel may spin), well within NCCL's
        # timeout: the step's own bound is the timeout.
        abort = dist.distributed_c10d._abort_process_group
        with (
            mock.patch.object(
                dist.distributed_c10d, "_abort_process_group", wraps=abort
            ) as aborted,
            mock.patch.object(dist, "destroy_process_group") as destroyed,
        ):

            def times_out():
                raise CollectiveBenchmarkTimeout("device work did not complete")

            with self.assertRaises(CollectiveBenchmarkError):
                channel.everyone("the step", times_out, TIMEOUT)
        aborted.assert_called_once_with(built)
        destroyed.assert_not_called()
        self.assertNotIn(built, _world.pg_map)

    def test_a_group_without_a_cpu_side_gets_gloo_for_the_protocol(self):
        group = self.init("nccl")
        channel = cc.BenchmarkChannel(group, torch.device("cuda"), CONFIG)
        channel.start_session()
        built = channel.get()
        self.assertEqual(cb.served_backends(built), {"cpu": "gloo", "cuda": "nccl"})
        self.assertEqual(channel.backend, "nccl")
        # The protocol's own collectives run on the gloo side.
        self.assertEqual(channel.gather_objects({"a": 1}, TIMEOUT), [{"a": 1}])


if __name__ == "__main__":
    run_tests()
