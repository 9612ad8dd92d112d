"""Benchmark channels: private process groups that candidates run their collectives on.

Candidates never run on the user's process group while they can fail.  Each
group that tunes gets a *benchmark channel*: a c10d group of its own name
over the same ranks, built by its members only, and standing in for the
group's name while candidates run (:func:`registered_as`), so that their
functional collectives, which resolve their group by name, run on it.  A
channel on which a collective failed is dropped, never reused.  Why, and
what a candidate that keeps a group object gets:
``docs/modules.md``, "channels.py".
"""

from __future__ import annotations

import atexit
import dataclasses
import time
import weakref
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch._dynamo.utils import counters

from .channel_builder import build_channel, only_gloo, served_backends
from .store import CollectiveBenchmarkTimeout
from .timing import wait_device


if TYPE_CHECKING:
    from collections.abc import Iterator
    from datetime import timedelta


__all__ = [
    "BenchmarkChannel",
    "registered_as",
]


@contextmanager
def registered_as(name: str, channel: dist.ProcessGroup) -> Iterator[None]:
    """Let the group name ``name`` resolve to ``channel`` for the duration.

    Functional collectives resolve their group by name at run time, so the
    candidates' collectives run on ``channel`` (a benchmark channel, a c10d
    group of its own name, on which every c10d lookup works).  The name
    resolves to its group again on exit.  The name is the process's, not
    the thread's: another thread that resolves it meanwhile gets the
    channel too (compiles, which run candidates, hold Dynamo's lock).
    """
    # The candidates are compiled naming the user's group, as the program
    # will run them; re-tracing them for the channel's own name would time
    # other code than the program's.  c10d has no public API to re-point a
    # name, hence its private registry.
    from torch._C._distributed_c10d import (
        _register_process_group,
        _resolve_process_group,
        _unregister_process_group,
    )

    group_name = dist.distributed_c10d.GroupName(name)
    original = _resolve_process_group(group_name)
    _unregister_process_group(group_name)
    _register_process_group(group_name, channel)
    try:
        yield
    finally:
        _unregister_process_group(group_name)
        _register_process_group(group_name, original)


def _release(channel: dist.ProcessGroup | None, abort: bool) -> None:
    # As c10d releases a group: a healthy channel is destroyed (its backends
    # shut down), a failed one other than gloo is aborted (a collective that
    # did not complete leaves NCCL's kernel spinning).  A channel that
    # destroy_process_group() already released is not in c10d's tables.
    if channel is None:
        return
    try:
        if abort:
            dist.distributed_c10d._abort_process_group(channel)
        else:
            dist.destroy_process_group(channel)
    except ValueError:
        pass  # released with every group by destroy_process_group()


@dataclasses.dataclass
class _GroupState:
    """What the protocol keeps per process group between sessions.

    The counters advance at the same protocol steps on every member, so they
    name the same channels everywhere.
    """

    sessions: int = 0
    channels: int = 0
    # c10d's tables hold the channel, so that destroy_process_group() frees
    # it with every group (its gloo threads and sockets included).
    channel_ref: weakref.ref[dist.ProcessGroup] | None = None
    channel_timeout: timedelta | None = None
    # The group the channel mirrors: a group re-created under the same name
    # (destroy_process_group, then init again) must not reuse the old channel.
    group: weakref.ref[dist.ProcessGroup] | None = None

    def take_channel(self) -> dist.ProcessGroup | None:
        """The channel, if c10d still holds it; the state forgets it."""
        channel = self.channel
        self.channel_ref = None
        return channel

    @property
    def channel(self) -> dist.ProcessGroup | None:
        return None if self.channel_ref is None else self.channel_ref()


# Counters survive a new default group: a job that destroys its process
# group and initializes it again may keep the same store server, whose keys
# from the earlier channels must not be read again.
_group_states: dict[str, _GroupState] = {}


def _group_state(group: dist.ProcessGroup) -> _GroupState:
    state = _group_states.setdefault(group.group_name, _GroupState())
    if state.group is None or state.group() is not group:
        _release(state.take_channel(), abort=False)
        state.group = weakref.ref(group)
    return state


@atexit.register
def _release_channels() -> None:
    # A job that never calls destroy_process_group() leaves its groups to the
    # interpreter's exit.  Release the channels while it is still alive: a
    # gloo worker thread that drops a tensor during interpreter finalization
    # needs the GIL and aborts the process (pytorch/pytorch#190489).
    for state in _group_states.values():
        _release(state.take_channel(), abort=False)


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
        self._only_gloo = only_gloo(self.served)
        self._state = _group_state(group)

    def next_session(self) -> int:
        """A number for the group's next session, the same on every member."""
        self._state.sessions += 1
        return self._state.sessions

    def get(self) -> dist.ProcessGroup:
        """The channel, built (a store rendezvous of the members) when there is none."""
        state = self._state
        channel = state.channel
        if channel is not None and state.channel_timeout != self.timeout:
            self.drop()  # every member sees the same timeout (it is in the join)
            channel = None
        if channel is None:
            state.channels += 1
            state.channel_timeout = self.timeout
            name = f"{self.group.group_name}:benchmark{state.channels}"
            channel = build_channel(self.group, self.served, name, self.timeout)
            state.channel_ref = weakref.ref(channel)
        return channel

    def drop(self) -> None:
        """Discard the channel; a peer's pending collective on it fails at once.

        Returns once a gloo channel is destroyed: at once, or, when a
        collective of this rank is still pending on it (its wait timed out),
        when that collective ends, within the channel's own timeout.
        """
        # Destroying a gloo channel closes its sockets with its last
        # reference; other backends (NCCL) need an abort.  ~ProcessGroupGloo
        # first joins its worker threads, and a worker that releases a
        # finished work may need the GIL (to free its tensors' Python
        # objects).  The join runs without the GIL: the reference dropped
        # here is the Python object's, whose holder (c10d's
        # IntrusivePtrNoGilDestructor) releases the GIL first, so the worker
        # finishes and this rank's heartbeat goes on (measured with
        # scripts/repro_gloo_destroy_pending.py).
        _release(self._state.take_channel(), abort=not self._only_gloo)

    @contextmanager
    def registered(self) -> Iterator[dist.ProcessGroup]:
        """The channel, registered under the group's name for the duration."""
        channel = self.get()
        with registered_as(self.group.group_name, channel):
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
