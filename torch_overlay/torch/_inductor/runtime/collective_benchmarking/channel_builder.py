"""How a benchmark channel is built: the group's own backends, on a prefix of the job's store.

:func:`build_channel` makes the c10d backend of every device type the group
serves (:func:`served_backends`), with the group's backend options;
``channels.py`` keeps one channel per group and registers it while
candidates run.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, TYPE_CHECKING

import torch
import torch.distributed as dist

from .store import CollectiveBenchmarkError, main_store_client


if TYPE_CHECKING:
    from datetime import timedelta


__all__ = [
    "build_channel",
    "BuiltChannel",
    "served_backends",
]


class _RecordingStore(dist.Store):
    """A store that remembers every key a process group asked it about."""

    def __init__(self, inner: dist.Store) -> None:
        super().__init__()
        self.inner = inner
        self.keys: set[str] = set()

    def set(self, key: str, value: Any) -> None:
        self.keys.add(key)
        self.inner.set(key, value)

    def get(self, key: str) -> bytes:
        self.keys.add(key)
        return self.inner.get(key)

    def add(self, key: str, value: int) -> int:
        self.keys.add(key)
        return self.inner.add(key, value)

    def compare_set(self, key: str, expected_value: Any, desired_value: Any) -> bytes:
        self.keys.add(key)
        return self.inner.compare_set(key, expected_value, desired_value)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self.keys.update(keys)
        if timeout is None:
            self.inner.wait(keys)
        else:
            self.inner.wait(keys, timeout)

    def check(self, keys: list[str]) -> bool:
        self.keys.update(keys)
        return self.inner.check(keys)

    def delete_key(self, key: str) -> bool:
        return self.inner.delete_key(key)

    def num_keys(self) -> int:
        return self.inner.num_keys()

    def set_timeout(self, timeout: timedelta) -> None:
        self.inner.set_timeout(timeout)


def served_backends(group: dist.ProcessGroup) -> dict[str, str]:
    """Each device type ``group`` serves, and the name of the c10d backend serving it.

    As c10d recorded them when it built the group (``"undefined"``, a bare
    ``init_process_group()``, resolved to what it built).  Raises
    :class:`CollectiveBenchmarkError` for a group c10d did not build.
    """
    return _backend_config(group).get_device_backend_map()


def _backend_config(group: dist.ProcessGroup) -> dist.distributed_c10d.BackendConfig:
    try:
        config = dist.get_backend_config(group)
    except TypeError as error:  # c10d holds no config for the group
        raise CollectiveBenchmarkError(
            "collective autotuning: the op's process group was not created by "
            "torch.distributed (init_process_group, new_group, split_group), so "
            "its backends are unknown"
        ) from error
    return dist.distributed_c10d.BackendConfig(config)


@dataclasses.dataclass(frozen=True)
class BuiltChannel:
    """A channel, and the store its gloo backend rendezvoused on, which must live as long."""

    group: dist.ProcessGroup
    store: dist.Store
    only_gloo: bool


def _make_backend(
    name: str,
    store: dist.Store,
    group: dist.ProcessGroup,
    channel: dist.ProcessGroup,
    channel_name: dist.distributed_c10d.GroupName,
    timeout: timedelta,
) -> Any:
    # One backend of the channel, as _new_process_group_helper makes the
    # group's: by the creator c10d registered for its name, never split from
    # a parent (a split is a collective over the parent's ranks).
    dist.Backend._ensure_backend_registered(name)
    plugin = dist.Backend._plugins.get(name.upper())
    if plugin is None:
        raise CollectiveBenchmarkError(
            f"collective autotuning: c10d has no backend {name!r} to build the "
            f"benchmark channel of group {group.group_name!r} with"
        )
    # gloo's timeout is what ends a collective that a peer left; other
    # backends' watchdogs end the process at theirs, after the protocol has
    # aborted the channel.
    deadline = timeout if name == "gloo" else 2 * timeout
    if not plugin.extended_api:
        return plugin.creator_fn(store, group.rank(), group.size(), deadline)
    options = dist.distributed_c10d._DistributedBackendOptions()
    options.store = store
    options.group_rank = group.rank()
    options.group_size = group.size()
    options.timeout = deadline
    options.group_id = channel_name
    options.global_ranks_in_group = dist.get_process_group_ranks(group)
    options.process_group = channel
    options.split_from = None
    return plugin.creator_fn(options, _backend_options(group, name))


def _backend_options(group: dist.ProcessGroup, name: str) -> Any:
    # NCCL: the group's stream priority, so that candidates are timed on the
    # streams the program runs on; the creator sets timeout, ranks and name.
    if name != "nccl":
        return None
    options = dist.ProcessGroupNCCL.Options()
    theirs = getattr(group._get_backend(torch.device("cuda")), "options", None)
    options.is_high_priority_stream = bool(
        getattr(theirs, "is_high_priority_stream", False)
    )
    return options


def build_channel(
    group: dist.ProcessGroup, prefix: str, timeout: timedelta
) -> BuiltChannel:
    """A private process group over ``group``'s ranks, on a fresh ``prefix`` of the default store.

    It serves each device type ``group`` serves with the same backend
    (:func:`served_backends`), bound to the group's device; it is not in
    c10d's tables.  Every member of ``group`` must call it with the same
    ``prefix``.  Raises :class:`CollectiveBenchmarkError` for a backend
    c10d cannot build, and what the backend raises when the ranks cannot
    connect.
    """
    config = _backend_config(group)
    served = config.get_device_backend_map()
    root = dist.distributed_c10d._get_default_store()
    # gloo's keys are recorded, to be deleted once every member connected;
    # the others' go to C++ stores (NCCL's may be used from its own threads,
    # long after the build).
    plain = dist.PrefixStore(prefix, root)
    recording = _RecordingStore(dist.PrefixStore(prefix, root))
    channel = dist.ProcessGroup(plain, group.rank(), group.size())
    channel._set_default_backend(
        dist.distributed_c10d._get_default_backend_type_for_backend_config(
            config, group.bound_device_id
        )
    )
    if group.bound_device_id is not None:
        channel.bound_device_id = group.bound_device_id
    channel_name = dist.distributed_c10d.GroupName(f"{group.group_name}:benchmark")
    for name in dict.fromkeys(served.values()):
        store = dist.PrefixStore(f"{name}/", recording if name == "gloo" else plain)
        impl = _make_backend(name, store, group, channel, channel_name, timeout)
        if isinstance(impl, dist.ProcessGroup):
            raise CollectiveBenchmarkError(
                f"collective autotuning: backend {name!r} of group "
                f"{group.group_name!r} builds a whole process group; its "
                "benchmark channel cannot mirror it"
            )
        backend_type = dist.Backend.backend_type_map.get(
            name, dist.ProcessGroup.BackendType.CUSTOM
        )
        for device, served_by in served.items():
            if served_by == name:
                channel._register_backend(torch.device(device), backend_type, impl)
    # Named once its backends exist, which take the name too (as c10d does).
    channel._set_group_name(channel_name)
    channel._set_group_desc(f"collective autotuning channel of {group.group_name}")
    if "gloo" in served.values() and not _gloo_connects_lazily():
        # Connected: the member that finishes last removes what they used
        # (under the names PrefixStore gives them: prefix, "/", key).
        client = main_store_client()
        if client.add(f"{prefix}/built", 1) == group.size():
            for key in [*sorted(recording.keys), "built"]:
                client.delete(f"{prefix}/{key}")
    return BuiltChannel(channel, recording, set(served.values()) == {"gloo"})


def _gloo_connects_lazily() -> bool:
    # TORCH_GLOO_LAZY_INIT makes gloo connect at its first collective, after
    # the build: its keys must stay (c10d reads the variable as a bool).
    value = os.environ.get("TORCH_GLOO_LAZY_INIT", "0").strip().lower()
    return value in ("1", "true", "yes", "y", "on")
