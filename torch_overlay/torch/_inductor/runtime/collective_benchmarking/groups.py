"""The process groups that collective autotuning benchmarks over.

What the protocol's layers need to know of a group, and nothing of the
protocol itself: which group an op names, what identifies a group on every
member (:func:`process_group_topology`, which cache keys cover too), how
its members say once what every member knows, and which members came to a
step that failed (:class:`RollCall`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch.distributed as dist

from .types import CollectiveBenchmarkError


if TYPE_CHECKING:
    from datetime import timedelta


__all__ = [
    "RollCall",
    "process_group_topology",
    "registered_group",
    "resolve_group",
    "warn_from_group_rank0",
]

log = logging.getLogger(__name__)


def resolve_group(group: dist.ProcessGroup | str | None) -> dist.ProcessGroup:
    """``group`` as a ``ProcessGroup`` (``None``: the default group, a str: by name).

    Raises :class:`CollectiveBenchmarkError` when torch.distributed is not
    initialized: collective autotuning needs every rank's process group.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise CollectiveBenchmarkError(
            "collective autotuning needs an initialized default process group "
            "(torch.distributed.init_process_group) on every rank"
        )
    if group is None:
        world = dist.group.WORLD
        if world is None:
            raise CollectiveBenchmarkError("the default process group was destroyed")
        return world
    if isinstance(group, str):
        # c10d has no public lookup by name; functional collectives resolve
        # the names in their graphs with this one, and so must the protocol.
        return dist.distributed_c10d._resolve_process_group(
            dist.distributed_c10d.GroupName(group)
        )
    return group


def registered_group(name: str) -> dist.ProcessGroup | None:
    """The process group that functional collectives resolve ``name`` to, or ``None``.

    Any rank may call it, alone; ``None`` when no group of this process is
    registered under ``name`` (it may be any string of a graph).
    """
    try:
        return resolve_group(name)
    except RuntimeError:  # c10d's lookup raises it for an unknown name
        return None


def _ranks_text(ranks: list[int]) -> str:
    # Runs of consecutive ranks as "a-b": compact at thousands of ranks.
    runs: list[list[int]] = []
    for rank in ranks:
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def process_group_topology(group: dist.ProcessGroup) -> tuple[str, int, str]:
    """``(name, size, global ranks)`` of ``group``: the same on every member.

    What a program traced for the group depends on besides the caller's own
    rank; ranks in group order, runs of consecutive ranks written ``"a-b"``.
    """
    ranks = dist.get_process_group_ranks(group)
    return (group.group_name, group.size(), _ranks_text(ranks))


def warn_from_group_rank0(
    logger: logging.Logger, group_rank: int, message: str, *args: object
) -> None:
    """Log ``message`` as a warning on the group's rank 0, at debug level elsewhere.

    For what every member of a group knows alike (an agreed decision, a
    candidate disqualified everywhere): one copy in the job's logs, not one
    per rank.
    """
    level = logging.WARNING if group_rank == 0 else logging.DEBUG
    logger.log(level, message, *args)


class RollCall:
    """The members that checked in under ``prefix`` of the job's store.

    Only after a step that needs every member failed: its members meet in
    the store, through the group's own connection to it (the channel may be
    what failed), in four requests each and three keys in all, which stay
    (a member that is late may check in after the others left).
    """

    def __init__(self, group: dist.ProcessGroup, prefix: str, wait: timedelta) -> None:
        self.group, self.prefix, self.wait = group, prefix, wait

    def taken(self) -> bool:
        """Whether some member already checked in (it gave up on the step)."""
        try:
            return self.group.get_group_store().check([self.prefix + "present"])
        except RuntimeError:
            return False

    def absent(self) -> list[int] | None:
        """Check in; the group ranks that do not within ``wait`` (None: no store)."""
        store, prefix = self.group.get_group_store(), self.prefix
        try:
            # Missing from Store's stubs; every c10d store implements it.
            store.append(prefix + "present", f"{self.group.rank()},")  # type: ignore[attr-defined]
            if store.add(prefix + "count", 1) == self.group.size():
                store.set(prefix + "all", "")
            try:
                store.wait([prefix + "all"], self.wait)
            except RuntimeError:  # timed out (stores raise no common type)
                pass
            present = store.get(prefix + "present").decode()
        except RuntimeError:  # DistNetworkError, and what other stores raise
            log.debug("collective autotuning: the store is unreachable", exc_info=True)
            return None
        here = {int(rank) for rank in present.split(",") if rank}
        return [rank for rank in range(self.group.size()) if rank not in here]
