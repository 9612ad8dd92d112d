"""c10d: a group that only its members create, under a name of their choosing.

``_new_group_with_tag(..., use_local_synchronization=True, group_name=...)``
is how a library builds a private group on a subset of ranks, on its own
schedule.  What this checks, on gloo and CPU:

* Only the members call it: in a job of three ranks, two create a group over
  themselves while the third does nothing, and its collectives are exact.
* An explicit name leaves ``_world.group_count`` alone on the members, so a
  group every rank creates afterwards gets the same name on every rank.
* Its communicators are not split from the default group's, even with a bound
  device (a split is collective over every rank of the default group).
* It is a group as c10d makes them: in every table ``_get_group_tag``,
  ``get_rank`` and ``get_process_group_ranks`` read, and a second group under
  the same name is an error.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import (
    _get_group_tag,
    _new_group_with_tag,
    _world,
    Backend,
    GroupName,
)
from torch.testing._internal.common_utils import run_tests, TestCase

CPU0 = torch.device("cpu:0")


def _members_only_worker(rank: int, world_size: int, init_file: str, results) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world_size,
        device_id=CPU0,
    )
    count = _world.group_count
    private_sum = None
    if rank in (0, 1):
        private = _new_group_with_tag(
            [0, 1],
            use_local_synchronization=True,
            group_name=GroupName("private"),
            pg_tag="private",
        )
        tensor = torch.full((4,), float(rank + 1))
        dist.all_reduce(tensor, group=private)
        private_sum = tensor.tolist()
    unchanged = _world.group_count == count
    everyone = dist.new_group()  # named from group_count, on every rank
    tensor = torch.ones(2)
    dist.all_reduce(tensor, group=everyone)
    results.put((rank, unchanged, everyone.group_name, tensor.tolist(), private_sum))
    dist.barrier()
    dist.destroy_process_group()


class TestMembersOnlyGroup(TestCase):
    def setUp(self):
        super().setUp()
        self.init_file = tempfile.mktemp(prefix="c10d_members_only_")
        self.addCleanup(
            lambda: os.path.exists(self.init_file) and os.remove(self.init_file)
        )

    def init_one_rank(self) -> None:
        dist.init_process_group(
            "gloo",
            init_method=f"file://{self.init_file}",
            rank=0,
            world_size=1,
            device_id=CPU0,
        )
        self.addCleanup(dist.destroy_process_group)

    def test_only_members_call_it_and_later_names_agree(self):
        # Starting a process fixes the process-wide start method (to fork,
        # when unset) for the tests after this one, whose rank processes
        # must not inherit this process's state: restore it.
        method = multiprocessing.get_start_method(allow_none=True)
        self.addCleanup(multiprocessing.set_start_method, method, force=True)
        context = multiprocessing.get_context("spawn")
        results = context.Queue()
        ranks = [
            context.Process(
                target=_members_only_worker, args=(rank, 3, self.init_file, results)
            )
            for rank in range(3)
        ]
        for rank in ranks:
            rank.start()
        seen = sorted(results.get(timeout=60) for _ in range(3))
        for rank in ranks:
            rank.join(timeout=60)
        self.assertEqual([rank.exitcode for rank in ranks], [0, 0, 0])
        self.assertEqual([rank for rank, *_ in seen], [0, 1, 2])
        self.assertEqual([unchanged for _, unchanged, *_ in seen], [True] * 3)
        self.assertEqual(len({name for _, _, name, *_ in seen}), 1)
        self.assertEqual([seen[r][3] for r in range(3)], [[3.0, 3.0]] * 3)
        self.assertEqual([seen[r][4] for r in range(3)], [[3.0] * 4] * 2 + [None])

    def test_not_split_from_the_default_group(self):
        splits: list = []
        Backend._ensure_backend_registered("gloo")
        gloo = Backend._plugins["GLOO"]
        self.addCleanup(Backend._plugins.__setitem__, "GLOO", gloo)

        def recording(options, backend_options):
            splits.append(options.split_from)
            return gloo.creator_fn(options, backend_options)

        Backend._plugins["GLOO"] = Backend._BackendPlugin(recording, True)
        self.init_one_rank()
        _new_group_with_tag([0], use_local_synchronization=True, group_name="a")
        dist.new_group([0])  # every rank calls new_group: it may split
        self.assertIsNone(splits[-2])
        self.assertIsNotNone(splits[-1])

    def test_a_group_as_c10d_makes_them(self):
        self.init_one_rank()
        count = _world.group_count
        group = _new_group_with_tag(
            [0],
            use_local_synchronization=True,
            group_name=GroupName("mine"),
            pg_tag="mine",
            group_desc="a library's own group",
        )
        self.assertEqual(_world.group_count, count)
        self.assertEqual(group.group_name, "mine")
        self.assertEqual(group.group_desc, "a library's own group")
        self.assertEqual(_get_group_tag(group), "mine")
        self.assertEqual(dist.get_rank(group), 0)
        self.assertEqual(dist.get_process_group_ranks(group), [0])
        self.assertIs(dist.distributed_c10d._resolve_process_group("mine"), group)
        with self.assertRaisesRegex(ValueError, "already been created"):
            _new_group_with_tag([0], use_local_synchronization=True, group_name="mine")
        dist.destroy_process_group(group)
        self.assertNotIn(group, _world.pg_map)
        # Destroyed, its name is free again.
        again = _new_group_with_tag(
            [0], use_local_synchronization=True, group_name="mine"
        )
        self.assertIsNot(again, group)


if __name__ == "__main__":
    run_tests()
