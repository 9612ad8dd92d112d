"""Benchmark channels: private process groups that candidates run their collectives on.

Candidates never run on the user's process group while they can fail.  Each
group that tunes gets a *benchmark channel*: a process group over the same
ranks, built on a fresh prefix of the job's store, and registered under the
group's name while candidates run (:func:`registered_as`), so that their
functional collectives, which resolve their group by name, run on it.  A
channel on which a collective failed is dropped, never reused.  Why, and why
not ``new_group`` or ``split_group``:
``docs/modules.md``, "channels.py".
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import time
import weakref
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch._dynamo.utils import counters

from .channel_builder import build_channel, BuiltChannel, served_backends
from .store import CollectiveBenchmarkTimeout, STORE_PREFIX
from .timing import wait_device


if TYPE_CHECKING:
    from collections.abc import Iterator
    from datetime import timedelta


__all__ = [
    "BenchmarkChannel",
    "registered_as",
]

log = logging.getLogger(__name__)


@contextmanager
def registered_as(
    name: str, channel: dist.ProcessGroup, group: dist.ProcessGroup
) -> Iterator[None]:
    """Let ``channel`` stand in for ``group``, named ``name``, for the duration.

    Functional collectives resolve their group by name at run time, so the
    candidates' collectives run on ``channel`` (a benchmark channel); c10d
    calls that look a group up in its tables (``get_rank(channel)``,
    ``get_backend(channel)``, the logger around a failing collective) find
    ``group``'s entries.  Everything is restored on exit.
    """
    # The candidates are compiled naming the user's group, as the program
    # will run them; re-tracing them for a channel's own name would time
    # other code than the program's.  c10d has no public API to re-point a
    # name, nor to enter a group in its tables without building it, hence
    # its private registry and tables.
    from torch._C._distributed_c10d import (
        _register_process_group,
        _resolve_process_group,
        _unregister_process_group,
    )

    group_name = dist.distributed_c10d.GroupName(name)
    original = _resolve_process_group(group_name)
    world = dist.distributed_c10d._world
    world.pg_map[channel] = world.pg_map[group]
    world.pg_names[channel] = world.pg_names[group]
    world.pg_group_ranks[channel] = world.pg_group_ranks[group]
    world.pg_backend_config[channel] = world.pg_backend_config[group]
    _unregister_process_group(group_name)
    _register_process_group(group_name, channel)
    try:
        yield
    finally:
        _unregister_process_group(group_name)
        _register_process_group(group_name, original)
        for table in (
            world.pg_map,
            world.pg_names,
            world.pg_group_ranks,
            world.pg_backend_config,
        ):
            table.pop(channel, None)


def _release(built: BuiltChannel | None) -> None:
    # Release a healthy channel as destroy_process_group() would: a backend
    # other than gloo is shut down (its communicator freed); a gloo one
    # closes its sockets with its last reference.
    if built is None or built.only_gloo:
        return
    try:
        built.group.shutdown()
    except Exception:
        log.debug(
            "collective autotuning: shutting a channel down failed", exc_info=True
        )


@dataclasses.dataclass
class _GroupState:
    """What the protocol keeps per process group between sessions.

    The counters advance at the same protocol steps on every member, so they
    name the same store keys everywhere.
    """

    sessions: int = 0
    channels: int = 0
    channel: BuiltChannel | None = None
    channel_timeout: timedelta | None = None
    # The group the channel mirrors: a group re-created under the same name
    # (destroy_process_group, then init again) must not reuse the old channel.
    group: weakref.ref[dist.ProcessGroup] | None = None


_group_states: dict[str, _GroupState] = {}
# The default store the channels were built on: released by
# destroy_process_group(), which releases the channels with it.
_released_with: weakref.ref[dist.Store] | None = None


def _group_state(group: dist.ProcessGroup) -> _GroupState:
    global _released_with
    store = dist.distributed_c10d._get_default_store()
    if _released_with is None or _released_with() is not store:
        _release_channels()
        _released_with = weakref.ref(store)
        weakref.finalize(store, _release_channels)
    # Counters survive a new store: a job that destroys its process group and
    # initializes it again may keep the same store server, whose keys from
    # the earlier channels must not be read again.
    state = _group_states.setdefault(group.group_name, _GroupState())
    if state.group is None or state.group() is not group:
        _release(state.channel)
        state.group, state.channel = weakref.ref(group), None
    return state


@atexit.register
def _release_channels() -> None:
    # Benchmark channels are process groups that destroy_process_group() does
    # not know about.  Release them while the interpreter is still alive: a
    # gloo worker thread that drops a tensor during interpreter finalization
    # needs the GIL and aborts the process (pytorch/pytorch#190489).
    for state in _group_states.values():
        built, state.channel = state.channel, None
        _release(built)


class BenchmarkChannel:
    """The benchmark channel of one process group, kept across its sessions.

    Every member of ``group`` must make the same calls in the same order:
    :meth:`get` builds the channel when there is none, :meth:`drop` discards
    it (after a failure; the next :meth:`get` builds a new one).
    """

    def __init__(
        self, group: dist.ProcessGroup, device: torch.device, timeout: timedelta
    ) -> None:
        self.group = group
        self.device = device
        self.timeout = timeout
        self.served = served_backends(group)
        # The backend the candidates' collectives run on (None: the group
        # serves no backend for their device, and they fail as in the program).
        self.backend = self.served.get(device.type)
        self._state = _group_state(group)

    def next_session(self) -> int:
        """A number for the group's next session, the same on every member."""
        self._state.sessions += 1
        return self._state.sessions

    def get(self) -> dist.ProcessGroup:
        """The channel, built (a store rendezvous of the members) when there is none."""
        state = self._state
        if state.channel is not None and state.channel_timeout != self.timeout:
            self.drop()  # every member sees the same timeout (it is in the join)
        if state.channel is None:
            state.channels += 1
            state.channel_timeout = self.timeout
            prefix = f"{STORE_PREFIX}/{self.group.group_name}/channel{state.channels}/"
            state.channel = build_channel(self.group, prefix, self.timeout)
        return state.channel.group

    def drop(self) -> None:
        """Discard the channel; a peer's pending collective on it fails at once.

        Returns once a gloo channel is destroyed: at once, or, when a
        collective of this rank is still pending on it (its wait timed out),
        when that collective ends, within the channel's own timeout.
        """
        # Dropping the last reference closes a gloo channel's sockets; other
        # backends (NCCL) need an abort.  ~ProcessGroupGloo first joins its
        # worker threads, and a worker that releases a finished work may need
        # the GIL (to free its tensors' Python objects).  The join runs
        # without the GIL: the reference dropped here is the Python object's,
        # whose holder (c10d's IntrusivePtrNoGilDestructor) releases the GIL
        # first, so the worker finishes and this rank's heartbeat goes on
        # (measured with scripts/repro_gloo_destroy_pending.py).
        built, self._state.channel = self._state.channel, None
        if built is not None and not built.only_gloo:
            built.group.abort()

    @contextmanager
    def registered(self) -> Iterator[dist.ProcessGroup]:
        """The channel, registered under the group's name for the duration."""
        channel = self.get()
        with registered_as(self.group.group_name, channel, self.group):
            yield channel

    def all_gather(self, values: list[float]) -> list[list[float]]:
        """Every member's ``values`` (equal lengths), in rank order, bounded by the timeout."""
        counters["collective_autotuning"]["sync_collectives"] += 1
        tensor = self._tensor(values)
        gathered = [torch.empty_like(tensor) for _ in range(self.group.size())]
        self._wait(self.get().allgather([gathered], [tensor]), tensor)
        _count_bytes(tensor.nbytes * (1 + len(gathered)))
        return [row.tolist() for row in gathered]

    def all_reduce_max(self, value: float) -> float:
        """The maximum of every member's ``value``, bounded by the timeout."""
        counters["collective_autotuning"]["sync_collectives"] += 1
        tensor = self._tensor([value])
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp.MAX
        self._wait(self.get().allreduce([tensor], options), tensor)
        _count_bytes(2 * tensor.nbytes)
        return float(tensor.item())

    def _tensor(self, values: list[float]) -> torch.Tensor:
        # On the host where the channel serves it (no device sync), else on
        # the candidates' device (an NCCL-only group).
        device = torch.device("cpu") if "cpu" in self.served else self.device
        return torch.tensor(values, dtype=torch.float64, device=device)

    def _wait(self, work: dist.Work, result: torch.Tensor) -> None:
        started = time.monotonic()
        if work.wait(self.timeout) is False:
            raise CollectiveBenchmarkTimeout(
                "a benchmark collective did not complete within "
                f"{time.monotonic() - started:.1f}s"
            )
        # A device backend's wait() only orders the current stream after the
        # collective; reading the result would block the host without bound.
        wait_device(result.device, started + self.timeout.total_seconds())


def _count_bytes(nbytes: int) -> None:
    # What this member sent and received in the protocol's own collectives
    # (the payload, not the backend's framing).
    counters["inductor"]["collective_autotuning_bytes_exchanged"] += nbytes
