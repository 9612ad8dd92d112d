"""The control plane of collective benchmarking: liveness, agreement over the store, channels.

``collective_benchmarking.py`` runs the protocol; this module holds what the
protocol stands on when the data plane cannot be trusted:

* **Heartbeats.**  Every process that takes part in collective autotuning
  runs one daemon thread that increments a counter in the job's store
  (``torch.distributed``'s default store, the ``TCPStore`` of a torchrun job)
  every :data:`HEARTBEAT_INTERVAL_S`, on a connection of its own
  (``Store.clone``: a blocking store call on the main thread's connection
  would stall it).  While a session runs, the same thread reads the counters
  of the session's members, so that a rank knows at any moment how long ago
  each peer last showed a sign of life.  The thread runs Python code, so a
  rank whose main thread holds the GIL in a C call that never returns (a
  *wedged* rank) stops beating, as does a dead one; a rank that is only busy
  (a long kernel, a sleep, a slow host, a compile in a worker) keeps beating.
* **Agreement** (:class:`ControlStore`).  A bounded rendezvous over the same
  store: post a value, wait for every member's.  A member that has not
  posted is waited for as long as its heartbeat advances, up to a hard cap
  (``collective_benchmark_max_wait``); it is *lost* when its heartbeat has
  not advanced for ``collective_benchmark_timeout``, or when it has shown no
  heartbeat at all for that long since the wait began.  A rank that gives up
  leaves its verdict in the store, so that a member arriving later raises the
  same error at once instead of waiting in turn.
* **Benchmark channels.**  Candidates run on a private process group over
  the op group's ranks (see the module docstring of
  ``collective_benchmarking.py`` for why a channel that failed is dropped,
  never reused), registered under the op group's name while a round runs.

Nothing here is a collective: every call on the store is a point-to-point
request to the store's server, which does not depend on any channel.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import sys
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist


if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from datetime import timedelta


__all__ = [
    "CollectiveBenchmarkError",
    "CollectiveBenchmarkTimeout",
    "ControlStore",
    "HEARTBEAT_INTERVAL_S",
    "resolve_group",
]

log = logging.getLogger(__name__)

# Keys of every session live under this prefix of the default store.
STORE_PREFIX = "collective_benchmarking"

# Where a rank that gives up on the whole job says why (see _Heartbeat._announce_verdict).
_JOB_VERDICT = f"{STORE_PREFIX}/job_verdict"

# How often a rank's heartbeat advances.  Small against any sensible timeout
# (seconds), large against a store round trip (tens of microseconds).
HEARTBEAT_INTERVAL_S = 0.5

# The slices in which a rank polls the store while it waits: responsive to a
# verdict or a late post within 50 ms, at most 20 requests a second per member.
_POLL_MAX_S = 0.05


class CollectiveBenchmarkError(RuntimeError):
    """Benchmarking cannot reach a decision every rank shares.

    Raised on every healthy rank of the group, at the same protocol step, when
    a member is lost (dead, wedged, or late past the cap) or when the members
    are not tuning the same op.
    """


class CollectiveBenchmarkTimeout(CollectiveBenchmarkError, TimeoutError):
    """A collective step did not complete within the timeout."""


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
        assert world is not None  # set by init_process_group, checked above
        return world
    if isinstance(group, str):
        return dist.distributed_c10d._resolve_process_group(
            dist.distributed_c10d.GroupName(group)
        )
    return group


def _heartbeat_key(global_rank: int) -> str:
    return f"{STORE_PREFIX}/heartbeat/{global_rank}"


# --- heartbeats ---------------------------------------------------------------------
@dataclasses.dataclass
class _Observation:
    value: int  # the peer's counter when last read
    # When the counter was last seen to advance; None after a single reading,
    # which cannot tell how long the counter had been standing still.
    advanced_at: float | None = None
    # Whether the peer is compiling, and since when (as observed) it is not.
    compiling: bool = True
    running_since: float | None = None


def _activity_key(global_rank: int) -> str:
    return f"{STORE_PREFIX}/activity/{global_rank}"


def _frame_key(global_rank: int, frame: str) -> str:
    return f"{STORE_PREFIX}/frames/{global_rank}/{frame}"


def _main_thread_compiling() -> bool:
    # Whether the main thread is inside Dynamo's frame compilation (tracing
    # and Inductor both run there).  Read from the thread's stack, not from
    # Dynamo's callbacks, which torch._dynamo.reset() clears.
    from torch._dynamo.convert_frame import _compile

    main_ident = threading.main_thread().ident
    assert main_ident is not None  # the main thread is always started
    frame = sys._current_frames().get(main_ident)
    while frame is not None:
        if frame.f_code is _compile.__code__:
            return True
        frame = frame.f_back
    return False


class _Heartbeat:
    """This process's heartbeat and its observations of its peers' (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._store: dist.Store | None = None  # the default store this thread beats on
        self._stop = threading.Event()
        self._watched: dict[int, int] = {}  # global rank -> sessions watching it
        self._seen: dict[int, _Observation] = {}
        self._verdict_announced = False

    def ensure_running(self) -> None:
        """Start beating on the current default store (again after it changed)."""
        store = dist.distributed_c10d._get_default_store()
        with self._lock:
            if (
                self._thread is not None
                and self._thread.is_alive()
                and self._store is store
            ):
                return
            self._stop.set()
            self._stop = threading.Event()
            self._store = store
            self._seen.clear()
            self._thread = threading.Thread(
                target=self._run,
                args=(store.clone(), dist.get_rank(), self._stop),
                name="collective-benchmark-heartbeat",
                daemon=True,
            )
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    @contextmanager
    def watching(self, global_ranks: Sequence[int]) -> Iterator[None]:
        """Observe these ranks' heartbeats for the duration (a session)."""
        with self._lock:
            for rank in global_ranks:
                self._watched[rank] = self._watched.get(rank, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                for rank in global_ranks:
                    self._watched[rank] -= 1
                    if not self._watched[rank]:
                        del self._watched[rank]
                        self._seen.pop(rank, None)

    def silent_for(self, global_rank: int) -> float | None:
        """Seconds since ``global_rank``'s heartbeat last advanced, as observed here.

        ``None`` until it has been seen to advance once while watched.
        """
        with self._lock:
            seen = self._seen.get(global_rank)
        if seen is None or seen.advanced_at is None:
            return None
        return time.monotonic() - seen.advanced_at

    def running_for(self, global_rank: int) -> float:
        """Seconds for which ``global_rank`` has been seen not compiling (0 while it compiles)."""
        with self._lock:
            seen = self._seen.get(global_rank)
        if seen is None or seen.running_since is None:
            return 0.0
        return time.monotonic() - seen.running_since

    def _run(self, store: dist.Store, rank: int, stop: threading.Event) -> None:
        own = _heartbeat_key(rank)
        published = None
        while not stop.is_set():
            try:
                store.add(own, 1)
                compiling = _main_thread_compiling()
                if compiling != published:
                    store.set(
                        _activity_key(rank), "compiling" if compiling else "running"
                    )
                    published = compiling
                with self._lock:
                    watched = list(self._watched)
                for peer in watched:
                    value = store.add(_heartbeat_key(peer), 0)
                    activity = (
                        store.get(_activity_key(peer))
                        if store.check([_activity_key(peer)])
                        else b""
                    )
                    now = time.monotonic()
                    with self._lock:
                        seen = self._seen.setdefault(peer, _Observation(value))
                        if seen.value != value:
                            seen.value, seen.advanced_at = value, now
                        seen.compiling = activity != b"running"
                        if seen.compiling:
                            seen.running_since = None
                        elif seen.running_since is None:
                            seen.running_since = now
                self._announce_verdict(store)
            except Exception:  # the store went away: the process group was destroyed
                log.debug("collective benchmarking heartbeat stopped", exc_info=True)
                return
            stop.wait(HEARTBEAT_INTERVAL_S)

    def _announce_verdict(self, store: dist.Store) -> None:
        # A rank that gave up on the job (its peers are not compiling what it
        # compiles) leaves the reason where every rank's heartbeat sees it: a
        # rank blocked in a collective of its compiled code cannot raise, but
        # its log says why the collective will fail.
        if self._verdict_announced or not store.check([_JOB_VERDICT]):
            return
        self._verdict_announced = True
        log.error(
            "collective autotuning: a peer gave up on this job: %s",
            store.get(_JOB_VERDICT).decode(),
        )


_heartbeat = _Heartbeat()
atexit.register(_heartbeat.stop)


def ensure_heartbeat() -> None:
    """Start this process's heartbeat (idempotent); peers wait for a rank that beats.

    Does nothing before ``init_process_group``: the session that follows
    reports the missing process group.
    """
    if dist.is_available() and dist.is_initialized():
        _heartbeat.ensure_running()


# --- agreement ----------------------------------------------------------------------
class ControlStore:
    """Bounded, liveness-aware rendezvous over the default store, which survives a dead channel."""

    def __init__(
        self,
        prefix: str,
        group: dist.ProcessGroup,
        timeout: timedelta,
        max_wait: timedelta,
    ) -> None:
        self.store = dist.PrefixStore(
            prefix, dist.distributed_c10d._get_default_store()
        )
        self.rank = group.rank()
        self.size = group.size()
        self.global_ranks = dist.get_process_group_ranks(group)
        self.group_name = group.group_name
        self.timeout = timeout.total_seconds()
        self.max_wait = max(max_wait.total_seconds(), self.timeout)
        # (frame id, compile index) of the session's compile
        self.frame: tuple[int, int] | None = None

    @contextmanager
    def session(self) -> Iterator[None]:
        """Heartbeats on, and the members watched, for the duration."""
        ensure_heartbeat()
        # Which compile of which frame this session belongs to, where waiting
        # peers can read it (see _not_compiling_this).
        compile_id = torch._guards.CompileContext.current_compile_id()
        self.frame = None
        if compile_id is not None and compile_id.frame_id is not None:
            self.frame = (compile_id.frame_id, compile_id.frame_compile_id or 0)
            root = dist.distributed_c10d._get_default_store()
            root.set(
                _frame_key(dist.get_rank(), str(self.frame[0])), str(self.frame[1])
            )
        with _heartbeat.watching(self.global_ranks):
            yield

    def post(self, tag: str, value: str) -> None:
        """Post without waiting (a member's waits count it as arrived at ``tag``)."""
        self.store.set(f"{tag}/{self.rank}", value)

    def rendezvous(
        self, tag: str, value: str, what: str, also: Sequence[str] = ()
    ) -> list[str]:
        """Post ``value`` under ``tag`` and return every member's value, in rank order.

        A member's post under one of the ``also`` tags counts too (prefixed
        with that tag and ``":"``): a member that went past this step posts
        where it went.  Raises :class:`CollectiveBenchmarkError` naming the
        members that are lost or late past the cap; a member that finds a
        peer's verdict (it gave up first) raises the same error at once.
        """
        self.post(tag, value)
        posts = self._wait_for(tag, list(range(self.size)), what, also)
        return [posts[rank] for rank in range(self.size)]

    def fetch(self, tag: str, rank: int, what: str) -> str:
        """The value that member ``rank`` posts under ``tag``, waited for as :meth:`rendezvous` waits."""
        return self._wait_for(tag, [rank], what, ())[rank]

    def _wait_for(
        self, tag: str, ranks: list[int], what: str, also: Sequence[str]
    ) -> dict[int, str]:
        started = time.monotonic()
        pending = list(ranks)
        posts: dict[int, str] = {}
        delay = 0.001
        while True:
            for rank in list(pending):
                found = self._find_post(rank, tag, also)
                if found is not None:
                    posts[rank] = found
                    pending.remove(rank)
            verdict = self._verdict(tag)
            if verdict is not None:
                raise CollectiveBenchmarkError(
                    f"{verdict} (the verdict of a peer that gave up waiting)"
                )
            if not pending:
                return posts
            waited = time.monotonic() - started
            alone = [rank for rank in pending if self._not_compiling_this(rank)]
            if alone:
                # _not_compiling_this is False for every rank without a frame.
                assert self.frame is not None
                reason = (
                    f"{what}: they run compiled code instead of compiling, and compiled this frame fewer times "
                    f"than this rank (compile {self.frame[1]} of frame {self.frame[0]}): this rank recompiled alone "
                    "(a guard failed on it only), and its peers wait for it in a collective of the code they run. "
                    "Call torch.compiler.set_enable_guard_collectives(True) on every rank so that all ranks "
                    "recompile together, or make the guard the same on every rank"
                )
                self._give_up(tag, alone, reason, job=True)
            lost = [rank for rank in pending if self._is_lost(rank, waited)]
            if lost:
                self._give_up(
                    tag,
                    lost,
                    f"{what}: {self._silence(lost, waited)}; dead, or wedged in a call that "
                    "holds the GIL",
                )
            if waited > self.max_wait:
                self._give_up(
                    tag,
                    pending,
                    f"{what} within {self.max_wait:g}s (collective_benchmark_max_wait) "
                    "although alive: stalled, or compiling a different program",
                )
            time.sleep(delay)
            delay = min(2 * delay, _POLL_MAX_S)

    def _find_post(self, rank: int, tag: str, also: Sequence[str]) -> str | None:
        for where in (tag, *also):
            key = f"{where}/{rank}"
            if self.store.check([key]):
                value = self.store.get(key).decode()
                return value if where == tag else f"{where}:{value}"
        return None

    def _verdict(self, tag: str) -> str | None:
        key = f"{tag}/abandoned"
        return self.store.get(key).decode() if self.store.check([key]) else None

    def _is_lost(self, rank: int, waited: float) -> bool:
        silent = _heartbeat.silent_for(self.global_ranks[rank])
        if silent is None:  # never seen beating: today's bound, one timeout of waiting
            return waited > self.timeout
        return silent > self.timeout

    def _silence(self, ranks: list[int], waited: float) -> str:
        seconds = [_heartbeat.silent_for(self.global_ranks[rank]) for rank in ranks]
        observed = max((s for s in seconds if s is not None), default=waited)
        return (
            f"no heartbeat from them for {observed:.1f}s "
            f"(collective_benchmark_timeout is {self.timeout:g}s)"
        )

    def _not_compiling_this(self, rank: int) -> bool:
        # A member that is alive but has been running compiled code for longer
        # than the timeout, and has compiled this session's frame fewer times,
        # is not on its way here: it will not compile this frame again.
        if (
            self.frame is None
            or _heartbeat.running_for(self.global_ranks[rank]) <= self.timeout
        ):
            return False
        root = dist.distributed_c10d._get_default_store()
        key = _frame_key(self.global_ranks[rank], str(self.frame[0]))
        theirs = int(root.get(key)) if root.check([key]) else -1
        return theirs < self.frame[1]

    def _give_up(
        self, tag: str, ranks: list[int], reason: str, job: bool = False
    ) -> None:
        # The verdict carries the whole message, so that every member that
        # finds it (the lost one too, if it comes back) raises the same error.
        # A verdict on the job reaches the ranks that run compiled code too.
        missing = [self.global_ranks[rank] for rank in ranks]
        message = f"collective autotuning: ranks {missing} of group {self.group_name!r} did not reach {reason}"
        self.store.set(f"{tag}/abandoned", message)
        if job:
            dist.distributed_c10d._get_default_store().set(_JOB_VERDICT, message)
        raise CollectiveBenchmarkError(message)


# --- benchmark channels -------------------------------------------------------------
def build_channel(
    group: dist.ProcessGroup, prefix: str, timeout: timedelta
) -> dist.ProcessGroup:
    """A private process group over ``group``'s ranks, on a fresh ``prefix`` of the default store."""
    store = dist.PrefixStore(prefix, dist.distributed_c10d._get_default_store())
    rank, size = group.rank(), group.size()
    channel = dist.ProcessGroup(store, rank, size)
    backend = dist.get_backend(group)
    impl: dist.ProcessGroupNCCL | dist.ProcessGroupGloo
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        # the protocol aborts first; see collective_benchmarking.py
        options._timeout = 2 * timeout
        impl = dist.ProcessGroupNCCL(
            dist.PrefixStore("cuda/", store), rank, size, options
        )
        device, backend_type = torch.device("cuda"), dist.ProcessGroup.BackendType.NCCL
    elif backend == "gloo":
        impl = dist.ProcessGroupGloo(
            dist.PrefixStore("cpu/", store), rank, size, timeout
        )
        device, backend_type = torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO
    else:
        raise CollectiveBenchmarkError(
            f"collective autotuning supports gloo and nccl groups, not {backend!r}"
        )
    impl._set_sequence_number_for_group()
    channel._register_backend(device, backend_type, impl)
    channel._set_default_backend(backend_type)
    channel._set_group_name(
        dist.distributed_c10d.GroupName(f"{group.group_name}:benchmark")
    )
    return channel


@contextmanager
def registered_as(name: str, group: dist.ProcessGroup) -> Iterator[None]:
    """Point the process-group name ``name`` at ``group`` for the duration, then restore it.

    Functional collectives resolve their group by name at run time, so the
    candidates' collectives run on ``group`` (a benchmark channel).
    """
    from torch._C._distributed_c10d import (
        _register_process_group,
        _resolve_process_group,
        _unregister_process_group,
    )

    group_name = dist.distributed_c10d.GroupName(name)
    original = _resolve_process_group(group_name)
    _unregister_process_group(group_name)
    _register_process_group(group_name, group)
    try:
        yield
    finally:
        _unregister_process_group(group_name)
        _register_process_group(group_name, original)


@dataclasses.dataclass
class GroupState:
    """What the protocol keeps per process group between sessions.

    The counters advance at the same protocol steps on every member, so they
    name the same store keys everywhere.
    """

    sessions: int = 0
    channels: int = 0
    channel: dist.ProcessGroup | None = None
    channel_timeout: timedelta | None = None
    # The group the channel mirrors: a group re-created under the same name
    # (destroy_process_group, then init again) must not reuse the old channel.
    group: dist.ProcessGroup | None = None


_group_states: dict[str, GroupState] = {}


def group_state(group: dist.ProcessGroup) -> GroupState:
    """The state of ``group`` (by name), reset when the name now means another group."""
    state = _group_states.setdefault(group.group_name, GroupState())
    if state.group is not group:
        state.group, state.channel = group, None
    return state


@atexit.register
def _release_channels() -> None:
    # Benchmark channels are process groups that destroy_process_group() does
    # not know about.  Release them while the interpreter is still alive: a
    # gloo worker thread that drops a tensor during interpreter finalization
    # needs the GIL and aborts the process (pytorch/pytorch#190489).
    _group_states.clear()
