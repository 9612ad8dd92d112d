"""How a benchmark channel is built: a c10d group over the group's ranks, with its backends.

:func:`build_channel` asks c10d for a members-only group under the channel's
own name (``_new_group_with_tag`` with ``use_local_synchronization`` and
``group_name``), with the backend of every device type the group serves
(:func:`served_backends`) and a CPU side for the protocol's own collectives;
``channels.py`` keeps one channel per group and lets it stand in for the
group while candidates run.
"""

from __future__ import annotations

from typing import Any, TYPE_CHECKING

import torch
import torch.distributed as dist

from .types import CollectiveBenchmarkError


if TYPE_CHECKING:
    from datetime import timedelta


__all__ = ["build_channel", "served_backends"]


def served_backends(group: dist.ProcessGroup) -> dict[str, str]:
    """Each device type ``group`` serves, and the name of the c10d backend serving it.

    As c10d recorded them when it built the group (``"undefined"``, a bare
    ``init_process_group()``, resolved to what it built).  Raises
    :class:`CollectiveBenchmarkError` for a group c10d did not build.
    """
    try:
        config = dist.get_backend_config(group)
    except TypeError as error:  # c10d holds no config for the group
        raise CollectiveBenchmarkError(
            "collective autotuning: the op's process group was not created by "
            "torch.distributed (init_process_group, new_group, split_group), so "
            "its backends are unknown"
        ) from error
    return dist.distributed_c10d.BackendConfig(config).get_device_backend_map()


def _channel_backend(group: dist.ProcessGroup, served: dict[str, str]) -> str:
    # The name c10d recorded for the group (what get_backend() answers), which
    # c10d resolves to the same backends in this process; a group without a
    # CPU side (NCCL alone) gets gloo for it, as Inductor's distributed
    # autotuning does for its objects: the protocol exchanges on the host.
    if "cpu" in served:
        return dist.get_backend(group)
    return ",".join(
        f"{device}:{name}" for device, name in {"cpu": "gloo", **served}.items()
    )


def _backend_options(group: dist.ProcessGroup, served: dict[str, str]) -> Any:
    # NCCL: a copy of the group's options (the creator writes its timeout,
    # ranks and name into them), so that candidates are timed on streams and
    # a communicator configured as the program's.  gloo takes none.
    if "nccl" not in served.values():
        return None
    options = dist.ProcessGroupNCCL.Options()
    theirs = group._get_backend(torch.device("cuda")).options
    if isinstance(theirs, dist.ProcessGroupNCCL.Options):
        options.is_high_priority_stream = theirs.is_high_priority_stream
        options.lazy_init = theirs.lazy_init
        options.config = theirs.config
    return options


def build_channel(
    group: dist.ProcessGroup,
    served: dict[str, str],
    name: str,
    timeout: timedelta,
    max_wait: timedelta,
) -> dist.ProcessGroup:
    """A new c10d group named ``name`` over ``group``'s ranks, with its backends ``served``.

    Built by c10d's own constructor, so it is in c10d's tables, its
    FlightRecorder and its ``destroy_process_group()``; only the members of
    ``group`` call it (with the same ``name``, unique in the process), it
    leaves the names of groups created later alone, and its communicators
    are fresh (a split is collective over ranks that may not take part).
    Its members meet within ``max_wait`` (a member may come late); then
    each collective on it is bounded by ``timeout``, but NCCL's, whose
    watchdog would end the process at its own timeout: NCCL's is twice
    ``timeout``, so that the protocol aborts the channel first.  Raises
    :class:`CollectiveBenchmarkError` for a group c10d did not build,
    ``ValueError`` for a name in use, and what the backend raises when the
    members do not meet within ``max_wait``.
    """
    channel = dist.distributed_c10d._new_group_with_tag(
        dist.get_process_group_ranks(group),
        timeout=max_wait,
        backend=_channel_backend(group, served),
        backend_options=_backend_options(group, served),
        # Its own tag, so that functional collectives that look groups up by
        # (tag, ranks) never find the channel in place of the user's group,
        # which has the empty tag and the same ranks.
        pg_tag=name,
        use_local_synchronization=True,
        group_desc=f"collective autotuning channel of {group.group_name}",
        device_id=group.bound_device_id,
        sort_ranks=False,  # group ranks as the group's
        group_name=dist.distributed_c10d.GroupName(name),
    )
    if not isinstance(channel, dist.ProcessGroup):
        raise CollectiveBenchmarkError(
            f"collective autotuning: this rank is not a member of group "
            f"{group.group_name!r}, so it cannot build its channel"
        )
    channel.set_timeout(timeout)
    if "nccl" in served.values():
        channel._get_backend(torch.device("cuda")).set_timeout(2 * timeout)
    return channel
