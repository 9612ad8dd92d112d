"""Liveness of the members of collective benchmarking: heartbeats over the store.

Every process that tunes runs one thread: it beats a key of its own while
the process has a session open, compiles, or was woken by a peer, reads the
key of the member it watches, and otherwise waits in the store for a wake.
A process that stops beating is dead or wedged.  ``docs/modules.md``,
"liveness.py", says more.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import threading
import time
import weakref
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING

import torch.distributed as dist

from .beats import beat_interval, MemberStatus, Observation, pending_collective, Watch
from .store import (
    _default_store,
    status_key,
    StoreClient,
    wake_key,
    wake_value,
    wake_verdict,
)


if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


__all__ = [
    "Liveness",
    "ensure_heartbeat",
]

log = logging.getLogger(__name__)

# A store wait meant to end by an event; its timeout is a backstop (a timed-out
# store request logs a c10d warning, which the protocol must not cause).
_BACKSTOP = timedelta(days=1)

# Beat intervals an idle thread goes on probing Dynamo's lock before it waits
# in the store: a compile that follows soon (the next graph, the backward) is
# then seen without the three requests that end the wait, and a peer's wake
# waits at most a quarter timeout.
_LINGER_BEATS = 2


# How long shutdown waits for a thread to leave its store request: one to a
# live store takes milliseconds, and one to a store that went away fails.
_JOIN_TIMEOUT_S = 5.0


@dataclasses.dataclass
class _Threads:
    """The liveness thread started on one store, and what stops and wakes it."""

    stop: threading.Event
    rank: int
    waker: StoreClient  # ends the thread's wait in the store, which holds its own
    heartbeat: threading.Thread


def _join(thread: threading.Thread) -> None:
    if thread is threading.current_thread():
        return
    thread.join(_JOIN_TIMEOUT_S)
    if thread.is_alive():
        log.warning(
            "collective autotuning: thread %s is still inside a store request "
            "%gs after it was told to stop",
            thread.name,
            _JOIN_TIMEOUT_S,
        )


class Liveness:
    """A process's heartbeat, and its watch over the members its main thread waits for.

    See ``docs/modules.md``, "liveness.py".  ``compiling`` says whether the process
    compiles (the default probes Dynamo's ``compile_lock``); the store, the rank and
    the main thread are injectable, and with ``listen=False`` the idle thread
    probes ``compiling`` once per beat interval instead of waiting in the store
    for a wake, so that one process can simulate many ranks
    (``scripts/bench_collective_control.py``).
    """

    def __init__(
        self,
        store: Callable[[], dist.Store] = _default_store,
        global_rank: Callable[[], int] = dist.get_rank,
        main_thread: threading.Thread | None = None,
        compiling: Callable[[], bool] | None = None,
        listen: bool = True,
    ) -> None:
        self._store_factory = store
        self._listen = listen
        self._global_rank = global_rank
        self._main_thread = main_thread or threading.main_thread()
        self._compiling = compiling or self._dynamo_compiling
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._threads: _Threads | None = None
        self._store: weakref.ref[dist.Store] | None = None  # what they serve
        self.client: StoreClient | None = None  # the thread's connection
        self._rank = -1
        self._counter = 0
        self._published = ""  # the activity last written
        self._sessions: dict[str, int] = {}  # open sessions -> how many
        self._sessions_since = 0.0  # since when one has been open
        self._frames: dict[str, int] = {}  # frame id -> highest compile index
        self._watches: list[Watch] = []
        # Members observed while a session is open (global rank -> how many
        # sessions observe it), and what was seen of them.
        self._observed: dict[int, int] = {}
        self._seen: dict[int, Observation] = {}
        self._interval = beat_interval(timedelta(seconds=30))
        self._timeout = 30.0
        self._awake_until = 0.0  # beats while idle until then, when a peer woke it
        self._in_store_wait = False  # the thread waits in the store for a wake
        self._roused = False  # ... and this process set its wake key to end it

    # The main thread's side -----------------------------------------------------
    def ensure_running(self, timeout: timedelta | None = None) -> None:
        """Start the thread on the current default store (again after it changed).

        A thread started on a previous store is stopped and joined first.  The
        thread stops by itself, joined, when the store is released (see
        :meth:`shutdown`).
        """
        if timeout is not None:
            self._interval = beat_interval(timeout)
            self._timeout = timeout.total_seconds()
        store = self._store_factory()
        with self._lock:
            threads = self._threads
            if threads is not None and threads.heartbeat.is_alive():
                if self._store is not None and self._store() is store:
                    return
        self.shutdown()
        with self._lock:
            self._store = weakref.ref(store)
            self._rank, self._published = self._global_rank(), ""
            self.client = StoreClient(store.clone())
            stop = threading.Event()
            heartbeat = threading.Thread(
                target=self._run,
                args=(self.client, stop),
                name="collective-benchmark-liveness",
                daemon=True,
            )
            waker = StoreClient(store.clone())
            threads = _Threads(stop, self._rank, waker, heartbeat)
            self._threads = threads
            heartbeat.start()
        # destroy_process_group() releases the default store: the thread must
        # not outlive it (see "Shutdown" in docs/modules.md).
        weakref.finalize(store, self._stop_threads, threads)

    def shutdown(self) -> None:
        """Stop this process's liveness thread and join it (idempotent).

        Runs at exit and when the store the thread serves is released; callable
        from any thread.  Costs three store requests when the thread waits in
        the store (this process sets its wake key, which the thread reads and
        deletes), none when the store is gone.  A thread still inside a store
        request after a few seconds is logged and left behind.
        """
        threads = self._threads
        if threads is not None:
            self._stop_threads(threads)

    def _stop_threads(self, threads: _Threads) -> None:
        with self._lock:
            if self._threads is threads:
                self._threads = None
        threads.stop.set()
        self._rouse(threads)
        _join(threads.heartbeat)

    def _rouse(self, threads: _Threads | None) -> None:
        # Make the thread act now: it waits on the event, or in the store,
        # ended by setting this process's wake key (the thread deletes it).
        with self._lock:
            in_store_wait = self._in_store_wait and not self._roused
            self._roused = self._roused or in_store_wait
        self._wake.set()
        if threads is None or not in_store_wait:
            return
        try:
            threads.waker.set(wake_key(threads.rank), wake_value())
        except Exception:  # the store went away, and so did the thread's wait
            log.debug("collective autotuning: could not wake the thread", exc_info=True)

    @contextmanager
    def session(
        self, name: str, frame: tuple[int, int] | None, observe: int | None = None
    ) -> Iterator[None]:
        """Beat for the duration of a session, and observe the member ``observe``.

        ``frame`` is the session's (frame id, compile index).  The observed
        member (the session's ring successor, a global rank) is read once per
        beat interval from the start, so that when a rendezvous waits for it,
        how long it has been silent is already known.
        """
        with self._lock:
            if not self._sessions:
                self._sessions_since = time.monotonic()
            self._sessions[name] = self._sessions.get(name, 0) + 1
            if frame is not None:
                key = str(frame[0])
                self._frames[key] = max(self._frames.get(key, -1), frame[1])
            if observe is not None:
                self._observed[observe] = self._observed.get(observe, 0) + 1
        self._rouse(self._threads)
        try:
            yield
        finally:
            with self._lock:
                self._sessions[name] -= 1
                if not self._sessions[name]:
                    del self._sessions[name]
                if observe is not None:
                    self._observed[observe] -= 1
                    if not self._observed[observe]:
                        del self._observed[observe]
                        self._seen.pop(observe, None)
            self._wake.set()

    @property
    def interval(self) -> float:
        """Seconds between two beats (and two observations)."""
        return self._interval

    def seen(self, global_rank: int) -> Observation | None:
        """What this thread has seen of an observed member, if it read it yet."""
        with self._lock:
            return self._seen.get(global_rank)

    @contextmanager
    def watching(self, watch: Watch) -> Iterator[None]:
        """Watch ``watch.successor`` while the main thread waits in ``watch.tag``."""
        with self._lock:
            self._watches.append(watch)
        self._wake.set()
        try:
            yield
        finally:
            with self._lock:
                self._watches.remove(watch)

    # The thread's side --------------------------------------------------------------
    def _dynamo_compiling(self) -> bool:
        # Whether Dynamo compiles a frame in this process: tracing and
        # Inductor both run under its compile_lock, which this probes without
        # waiting.  (Dynamo's callbacks would not do: torch._dynamo.reset()
        # clears them.)  Imported here: the runtime does not import Dynamo.
        from torch._dynamo.convert_frame import compile_lock

        if not compile_lock.acquire(blocking=False):
            return True
        compile_lock.release()
        return False

    def _await_wake(self, client: StoreClient, stop: threading.Event) -> str | None:
        # Idle: one blocked request until a peer that waits for this process
        # wakes it; it then beats for two timeouts, so alive is told apart
        # from dead.  A verdict on the job wakes it too, and is logged: a rank
        # blocked in a collective of its compiled code cannot raise.  The
        # verdict ("" for a plain wake), None for a value no waker writes.
        with self._lock:  # see _rouse
            if self._sessions or stop.is_set():
                return ""
            self._in_store_wait = True
        key = wake_key(self._rank)
        try:
            client.wait(key, _BACKSTOP)
            value = client.get(key)
            client.delete(key)
        finally:
            with self._lock:
                roused, self._in_store_wait, self._roused = self._roused, False, False
        return self._woken(value, roused)

    def _poll_wake(self, client: StoreClient) -> str | None:
        # Read without blocking while woken (its waker may give a verdict on
        # the job), and in a session open for half a timeout whose main thread
        # waits in no rendezvous: a peer in a failure agreement wakes it to
        # learn which collective it waits in, which counts after a timeout.
        with self._lock:
            waits = bool(self._sessions) and not self._watches
            since = self._sessions_since
        now = time.monotonic()
        long_wait = waits and now - since >= self._timeout / 2
        if now >= self._awake_until and not long_wait:
            return ""
        key = wake_key(self._rank)
        value = client.read_if_set(key)
        if value is None:
            return ""
        client.delete(key)
        return self._woken(value, roused=False)

    def _woken(self, value: str, roused: bool) -> str | None:
        verdict = wake_verdict(value)
        if verdict or (verdict == "" and not roused):
            self._awake_until = time.monotonic() + 2 * self._timeout
        return verdict

    def _observe(self, client: StoreClient, member: int) -> None:
        text = client.read_if_set(status_key(member))
        status = MemberStatus.decode(text) if text is not None else None
        now = time.monotonic()
        with self._lock:
            if member not in self._observed:
                return
            seen = self._seen.setdefault(member, Observation(None, now))
            seen.update(status, now)

    def _run(self, client: StoreClient, stop: threading.Event) -> None:
        listening, logged, idle_beats = self._listen, False, 0
        while not stop.is_set():
            try:
                idle_beats = idle_beats + 1 if self._beat(client) else 0
                if listening and idle_beats > _LINGER_BEATS:
                    verdict = self._await_wake(client, stop)
                else:
                    verdict = self._poll_wake(client) if listening else ""
                    self._wake.wait(self._interval)
                    self._wake.clear()
            except Exception:  # the store went away: the process group was destroyed
                log.debug("collective benchmarking liveness stopped", exc_info=True)
                return
            if verdict is None:
                # The store is no job's (the "fake" backend's answers every
                # wait at once, with nothing): waiting in it would spin.
                listening = False
            elif verdict and not logged:
                logged = True
                log.error(
                    "collective autotuning: a peer gave up on this job: %s", verdict
                )

    def _beat(self, client: StoreClient) -> bool:
        # One beat interval's work; whether the process is idle, and said so.
        with self._lock:
            sessions = tuple(sorted(self._sessions))
            frames = dict(self._frames)
            watches = list(self._watches)
            observed = list(self._observed)
        if sessions:
            activity = "session"
        else:
            activity = "compiling" if self._compiling() else "idle"
        awake = time.monotonic() < self._awake_until
        if activity != "idle" or self._published != "idle" or awake:
            # Peers in a failure agreement keep a member of the
            # session awake to learn whether it waits in a collective.
            blocked, blocked_for = (
                pending_collective(self._main_thread.ident)
                if sessions and awake
                else ("", 0.0)
            )
            self._counter += 1
            status = MemberStatus(
                self._counter, activity, sessions, blocked, blocked_for, frames
            )
            client.set(status_key(self._rank), status.encode())
            self._published = activity
        for member in observed:
            self._observe(client, member)
        for watch in watches:
            watch.check(client, watch)
        return activity == "idle" and not awake


_liveness = Liveness()
atexit.register(_liveness.shutdown)


def ensure_heartbeat(timeout: timedelta) -> None:
    """Start this process's liveness thread (idempotent), beating for ``timeout``.

    From then on the process beats while it has a session open, compiles
    (seen once a session opens or a waiting peer wakes it), or was woken,
    so that waiting peers know it is alive; ``timeout`` (the sessions'
    :attr:`CollectiveBenchmarkConfig.timeout`) sets how often.  Any rank
    may call it, alone; before ``init_process_group`` it does nothing (the
    session that follows reports the missing process group).
    """
    if dist.is_available() and dist.is_initialized():
        _liveness.ensure_running(timeout)
