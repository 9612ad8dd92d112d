"""Benchmark channels: the private process groups a session runs on.

Candidates never run on the user's process group while they can fail.  Each
group that tunes gets a *benchmark channel*: a c10d group of its own name
over the same ranks, built by its members only, and standing in for the
group's name while candidates run (:func:`registered_as`), so that their
functional collectives, which resolve their group by name, run on it.  The
protocol's own collectives (the join, the exchange, a failure agreement)
run on the channel's CPU side, each bounded.  A channel on which a
collective failed is dropped, never reused.  Why, and what a candidate that
keeps a group object gets: ``docs/modules.md``, "channels.py".
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import time
import weakref
from contextlib import contextmanager
from typing import Any, TYPE_CHECKING, TypeVar

import torch
import torch.distributed as dist
from torch._dispatch.python import no_python_dispatcher
from torch._dynamo.utils import counters

from .channel_builder import build_channel, served_backends
from .groups import RollCall
from .types import CollectiveBenchmarkError, CollectiveBenchmarkTimeout


if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from datetime import timedelta

    from .types import CollectiveBenchmarkConfig


__all__ = ["BenchmarkChannel", "registered_as"]

_T = TypeVar("_T")

# The step every member of a session reaches first, in errors.
JOIN = "the start of autotuning"


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
    try:
        _unregister_process_group(group_name)
        _register_process_group(group_name, channel)
        yield
    finally:
        _unregister_process_group(group_name)
        _register_process_group(group_name, original)


def _release(channel: dist.ProcessGroup | None, abort: bool) -> None:
    # As c10d releases a group: a healthy channel is destroyed (its backends
    # shut down), a failed one with a device backend is aborted (a collective
    # that did not complete leaves NCCL's kernel spinning).  A channel that
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

    ``sessions`` advances at the start of every session on every member, so
    channel names derived from it are the same everywhere.
    """

    sessions: int = 0
    channel_timeout: timedelta | None = None
    # c10d's tables hold the channel, so that destroy_process_group() frees
    # it with every group (its gloo threads and sockets included).
    channel_ref: weakref.ref[dist.ProcessGroup] | None = None
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
# group and initializes it again may keep the same store server, under
# whose keys its earlier channels met.
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
    :meth:`start_session` at the start of each session, :meth:`get` builds
    the channel when there is none, :meth:`drop` discards it after a failure
    and :meth:`rebuild` replaces it.  A step that needs every member within
    a bound runs in :meth:`everyone`, which names the members that did not
    come.
    """

    def __init__(
        self,
        group: dist.ProcessGroup,
        device: torch.device,
        config: CollectiveBenchmarkConfig,
    ) -> None:
        self.group = group
        self.device = device
        self.timeout = config.timeout
        self.max_wait = config.max_wait
        self.served = served_backends(group)
        # The backend the candidates' collectives run on (None: the group
        # serves no backend for their device, and they fail as in the program).
        self.backend = self.served.get(device.type)
        self._state = _group_state(group)
        self._builds = 0  # channels built in this session: names the next one
        self._steps = 0  # steps of this session that need every member

    @property
    def name(self) -> str:
        """The name of this session's next (or last) channel, the same on every member."""
        suffix = f".{self._builds}" if self._builds > 1 else ""
        return f"{self.group.group_name}:benchmark{self._state.sessions}{suffix}"

    def start_session(self) -> None:
        """Count a session of the group; the same number on every member."""
        self._state.sessions += 1
        self._builds = self._steps = 0

    def get(self) -> dist.ProcessGroup:
        """The channel; built, its members meeting within ``max_wait``, when there is none."""
        state = self._state
        channel = state.channel
        if channel is not None and state.channel_timeout != self.timeout:
            self.drop()  # every member sees the same timeout (it is in the join)
            channel = None
        if channel is None:
            self._builds += 1
            channel = build_channel(
                self.group, self.served, self.name, self.timeout, self.max_wait
            )
            state.channel_ref = weakref.ref(channel)
            state.channel_timeout = self.timeout
        return channel

    def drop(self) -> None:
        """Discard the channel; a peer's pending collective on it fails at once.

        Returns once a gloo channel is destroyed: at once, or, when a
        collective of this rank is still pending on it (its wait timed out),
        when that collective ends, within its own bound.
        """
        # Gloo closes its sockets with the last reference; other backends
        # (NCCL) need an abort.  ~ProcessGroupGloo joins its workers, which
        # may need the GIL; c10d's IntrusivePtrNoGilDestructor releases it
        # first (scripts/repro_gloo_destroy_pending.py).
        only_gloo = set(self.served.values()) == {"gloo"}
        _release(self._state.take_channel(), abort=not only_gloo)

    def rebuild(self, what: str) -> None:
        """Replace a failed channel by a new one, every member meeting within ``max_wait``.

        Raises :class:`CollectiveBenchmarkError` naming the members that did
        not come to ``what``, or, on a member that comes after the others
        gave up waiting for it, saying so at once.
        """
        self.drop()
        self.everyone(what, self.get, self.max_wait, late_check=True)

    def everyone(
        self,
        what: str,
        step: Callable[[], _T],
        bound: timedelta,
        late_check: bool = False,
    ) -> _T:
        """``step``'s result: a step that needs every member, bounded by ``bound``.

        When it fails (its bound ran out, or a peer left it), the channel is
        dropped and this member raises :class:`CollectiveBenchmarkError`
        naming the members that did not come to ``what``: the members that
        failed it check in over the job's store, within the timeout.  Every
        member that reaches the step raises alike; with ``late_check`` (one
        store request), a member that comes after the others gave up raises
        without waiting for them.
        """
        self._steps += 1
        roll = RollCall(
            self.group,
            f"collective_autotuning/{self.group.group_name}/session"
            f"{self._state.sessions}/step{self._steps}/",
            self.timeout,
        )
        if late_check and roll.taken():
            raise CollectiveBenchmarkError(
                f"collective autotuning: the other members of group "
                f"{self.group.group_name!r} gave up waiting for this rank at {what} "
                f"(after {bound.total_seconds():g}s); it came later"
            )
        try:
            return step()
        except Exception as error:
            self.drop()
            absent = roll.absent()
            ranks = dist.get_process_group_ranks(self.group)
            cause = f"{type(error).__name__}: {str(error).strip().splitlines()[0]}"
            if absent:
                message = (
                    f"ranks {[ranks[rank] for rank in absent]} of group "
                    f"{self.group.group_name!r} did not reach {what} within "
                    f"{bound.total_seconds():g}s{_absent_hint(what)} ({cause})"
                )
            else:
                unknown = " (the job's store is unreachable)" if absent is None else ""
                message = f"{what} failed on group {self.group.group_name!r}{unknown}: {cause}"
            raise CollectiveBenchmarkError(
                "collective autotuning: " + message
            ) from error

    @contextmanager
    def registered(self) -> Iterator[dist.ProcessGroup]:
        """The channel, registered under the group's name for the duration."""
        channel = self.get()
        with registered_as(self.group.group_name, channel):
            yield channel

    def collectives_issued(self) -> int:
        """How many collectives this rank issued on the channel's candidate backend.

        0 where there is no channel, or its backend does not count them: the
        same on every member at the same step of a session.
        """
        channel = self._state.channel
        if channel is None:
            return 0
        try:
            backend = channel._get_backend(self.device)
            # Missing from c10d's stubs; gloo and NCCL count every collective.
            return backend._get_sequence_number_for_group()  # type: ignore[attr-defined]
        except RuntimeError:
            return 0  # the device has no backend, or one that does not count

    # The protocol's own collectives, on the channel's CPU side -----------------
    def gather_ints(self, values: list[int], wait: timedelta) -> list[list[int]]:
        """Every member's ``values`` (equal lengths), in rank order, within ``wait``."""
        tensor = torch.tensor(values, dtype=torch.int64)
        return [row.tolist() for row in self._all_gather(tensor, wait)]

    def gather_objects(self, value: Any, wait: timedelta) -> list[Any]:
        """Every member's ``value`` (JSON-serializable), in rank order, within ``wait``."""
        payload = torch.frombuffer(
            bytearray(json.dumps(value).encode()), dtype=torch.uint8
        )
        sizes = self.gather_ints([payload.numel()], wait)
        padded = torch.zeros(max(size for (size,) in sizes), dtype=torch.uint8)
        padded[: payload.numel()] = payload
        rows = self._all_gather(padded, wait)
        return [
            json.loads(bytes(row[:size].tolist()).decode())
            for row, (size,) in zip(rows, sizes, strict=True)
        ]

    def broadcast_object(self, value: Any, root: int, wait: timedelta) -> Any:
        """Member ``root``'s ``value`` (JSON-serializable), on every member, within ``wait``.

        Every member of the group calls it with the same ``root`` (a rank of
        the group); ``value`` is read on ``root`` only.  Each member moves
        that one payload, where :meth:`gather_objects` moves every member's,
        padded to the largest.  Raises :class:`CollectiveBenchmarkTimeout`
        when a broadcast does not complete within ``wait``, or the backend's
        error when it fails: run it in :meth:`everyone`.
        """
        sent = json.dumps(value).encode() if self.group.rank() == root else b""
        size = torch.tensor([len(sent)], dtype=torch.int64)
        self._broadcast(size, root, wait)
        payload = torch.zeros(int(size.item()), dtype=torch.uint8)
        payload[: len(sent)] = torch.tensor(list(sent), dtype=torch.uint8)
        self._broadcast(payload, root, wait)
        return json.loads(bytes(payload.tolist()).decode())

    def all_gather(self, values: list[float]) -> list[list[float]]:
        """Every member's ``values`` (equal lengths), in rank order, within the timeout."""
        tensor = torch.tensor(values, dtype=torch.float64)
        return [row.tolist() for row in self._all_gather(tensor, self.timeout)]

    def _all_gather(self, tensor: torch.Tensor, wait: timedelta) -> list[torch.Tensor]:
        counters["collective_autotuning"]["sync_collectives"] += 1
        gathered = [torch.empty_like(tensor) for _ in range(self.group.size())]
        options = dist.distributed_c10d.AllgatherOptions()
        options.timeout = wait
        self._complete(self.get().allgather, wait, [gathered], [tensor], options)
        _count_bytes(tensor.nbytes * (1 + len(gathered)))
        return gathered

    def _broadcast(self, tensor: torch.Tensor, root: int, wait: timedelta) -> None:
        counters["collective_autotuning"]["sync_collectives"] += 1
        options = dist.BroadcastOptions()
        options.rootRank = root
        options.timeout = wait
        self._complete(self.get().broadcast, wait, [tensor], options)
        _count_bytes(tensor.nbytes)

    @staticmethod
    def _complete(issue: Callable[..., dist.Work], wait: timedelta, *args: Any) -> None:
        # The option bounds the collective where the backend reads it (gloo),
        # the wait everywhere.  Not under the lowering's Python dispatcher, which
        # deadlocks gloo (docs/upstream/gloo-python-dispatcher-deadlock.md).
        started = time.monotonic()
        with no_python_dispatcher():
            done = issue(*args).wait(wait)
        if done is False:
            raise CollectiveBenchmarkTimeout(
                "a benchmark collective did not complete within "
                f"{time.monotonic() - started:.1f}s"
            )


def _absent_hint(what: str) -> str:
    # What members that did not come may be doing, without claiming a cause
    # that a rendezvous cannot know.
    if what == JOIN:
        return (
            ": they may be dead, stalled, compiling other code, or running "
            "compiled code; if this rank recompiled alone (a guard failed on it "
            "only), call torch.compiler.set_enable_guard_collectives(True) on "
            "every rank so that all ranks recompile together"
        )
    return ": they may be dead, wedged, or stalled past the bound"


def _count_bytes(nbytes: int) -> None:
    # What this member sent and received in the protocol's own collectives
    # (the payload, not the backend's framing).
    counters["inductor"]["collective_autotuning_bytes_exchanged"] += nbytes
