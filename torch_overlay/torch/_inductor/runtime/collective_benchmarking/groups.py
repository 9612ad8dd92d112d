"""The process groups that collective autotuning benchmarks over.

What the protocol's layers need to know of a group, and nothing of the
protocol itself: which group an op names, and what identifies a group on
every member (:func:`process_group_topology`, which cache keys cover too).
"""

from __future__ import annotations

import torch.distributed as dist

from .store import CollectiveBenchmarkError


__all__ = ["process_group_topology", "registered_group", "resolve_group"]


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
    # Global ranks in order, runs of consecutive ranks as "a-b": compact at
    # thousands of ranks.
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
