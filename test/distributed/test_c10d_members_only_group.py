# Owner(s): ["oncall: distributed"]
"""c10d: a group that only its members create, under a name of their choosing.

``new_group(ranks, use_local_synchronization=True, group_name=...)`` (and
``_new_group_with_tag``, which it calls) is how a library builds a private
group on a subset of ranks, on its own schedule.  What this checks:

* Only the members call it: in a job of three ranks, two create a group over
  themselves while the third does nothing, and its collectives are exact.
* An explicit name leaves ``_world.group_count`` alone on the members, so a
  group every rank creates afterwards gets the same name on every rank.
* Its communicators are not split from the default group's, even with a bound
  device (a split is collective over every rank of the default group).
* It is a group as c10d makes them: in every table ``_get_group_tag``,
  ``get_rank`` and ``get_process_group_ranks`` read, destroyed by
  ``destroy_process_group``, and a second group under the same name is an
  error.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import (
    _get_group_tag,
    _new_group_with_tag,
    _world,
    Backend,
    GroupName,
)
from torch.testing._internal.common_distributed import (
    MultiProcessTestCase,
    requires_nccl,
    skip_if_lt_x_gpu,
)
from torch.testing._internal.common_utils import run_tests


class MembersOnlyGroupTest(MultiProcessTestCase):
    @property
    def world_size(self) -> int:
        return 3

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    def _init(self, backend: str, device: torch.device) -> None:
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group(
            backend,
            store=store,
            rank=self.rank,
            world_size=self.world_size,
            device_id=device,
        )

    def _members_only_then_everyone(self, device: torch.device) -> None:
        count = _world.group_count
        if self.rank in (0, 1):
            private = dist.new_group(
                [0, 1], use_local_synchronization=True, group_name="private"
            )
            self.assertEqual(private.group_name, "private")
            tensor = torch.full((4,), float(self.rank + 1), device=device)
            dist.all_reduce(tensor, group=private)
            self.assertEqual(tensor, torch.full((4,), 3.0, device=device))
        self.assertEqual(_world.group_count, count)
        # Named from group_count, which every rank advanced alike: the names
        # agree, and so do the collectives on the group.
        everyone = dist.new_group()
        names: list[str | None] = [None] * self.world_size
        dist.all_gather_object(names, everyone.group_name)
        self.assertEqual(len(set(names)), 1)
        tensor = torch.ones(2, device=device)
        dist.all_reduce(tensor, group=everyone)
        self.assertEqual(tensor, torch.full((2,), 3.0, device=device))
        dist.destroy_process_group()

    def test_only_members_call_it_and_later_names_agree(self) -> None:
        device = torch.device("cpu:0")
        self._init("gloo", device)
        self._members_only_then_everyone(device)

    @requires_nccl()
    @skip_if_lt_x_gpu(3)
    def test_only_members_call_it_and_later_names_agree_nccl(self) -> None:
        device = torch.device("cuda", self.rank)
        self._init("nccl", device)
        self._members_only_then_everyone(device)

    def test_not_split_from_the_default_group(self) -> None:
        splits: list[object] = []
        Backend._ensure_backend_registered("gloo")
        gloo = Backend._plugins["GLOO"]

        def recording(options, backend_options):
            splits.append(options.split_from)
            return gloo.creator_fn(options, backend_options)

        Backend._plugins["GLOO"] = Backend._BackendPlugin(recording, True)
        try:
            self._init("gloo", torch.device("cpu:0"))
            if self.rank in (0, 1):
                _new_group_with_tag(
                    [0, 1], use_local_synchronization=True, group_name="pair"
                )
                self.assertIsNone(splits[-1])
            dist.new_group()  # every rank calls new_group: it may split
            self.assertIsNotNone(splits[-1])
        finally:
            Backend._plugins["GLOO"] = gloo
        dist.destroy_process_group()

    def test_a_group_as_c10d_makes_them(self) -> None:
        self._init("gloo", torch.device("cpu:0"))
        count = _world.group_count
        group = _new_group_with_tag(
            [self.rank],
            use_local_synchronization=True,
            group_name=GroupName(f"mine{self.rank}"),
            pg_tag="mine",
            group_desc="a library's own group",
        )
        self.assertEqual(_world.group_count, count)
        self.assertEqual(group.group_name, f"mine{self.rank}")
        self.assertEqual(group.group_desc, "a library's own group")
        self.assertEqual(_get_group_tag(group), "mine")
        self.assertEqual(dist.get_rank(group), 0)
        self.assertEqual(dist.get_process_group_ranks(group), [self.rank])
        self.assertIs(
            dist.distributed_c10d._resolve_process_group(f"mine{self.rank}"), group
        )
        with self.assertRaisesRegex(ValueError, "already been created"):
            dist.new_group(
                [self.rank],
                use_local_synchronization=True,
                group_name=f"mine{self.rank}",
            )
        dist.destroy_process_group(group)
        self.assertNotIn(group, _world.pg_map)
        # Destroyed, its name is free again.
        again = dist.new_group(
            [self.rank], use_local_synchronization=True, group_name=f"mine{self.rank}"
        )
        self.assertIsNot(again, group)
        # Nothing here ran on the default group: without a collective a rank
        # could exit, closing its sockets, while a peer still connects its full
        # mesh in init_process_group.
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    run_tests()
