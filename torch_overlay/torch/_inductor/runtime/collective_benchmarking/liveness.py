"""Liveness of the members of collective benchmarking: heartbeats over the store.

Every process that tunes beats one key of its own while it has a session
open, compiles, or was woken by a peer, and reads the key of the member it
watches; a process that stops beating is dead or wedged.  What a beat
carries, waking an idle peer, and shutdown: ``docs/modules.md``,
"liveness.py".
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

# A store wait that is meant to end by an event, not by its timeout: the
# timeout is only a backstop (a timed-out store request logs a c10d warning,
# which the protocol must not cause routinely).
_BACKSTOP = timedelta(days=1)


# How long shutdown waits for a thread to leave its store request: one request
# to a live store takes milliseconds, and one to a store that went away fails
# at once.
_JOIN_TIMEOUT_S = 5.0


@dataclasses.dataclass
class _Threads:
    """The liveness threads started on one store, and what stops them."""

    stop: threading.Event
    rank: int
    client: StoreClient  # the heartbeat's connection
    heartbeat: threading.Thread
    listener: threading.Thread | None


def _join(thread: threading.Thread) -> bool:
    if thread is threading.current_thread():
        return False
    thread.join(_JOIN_TIMEOUT_S)
    if thread.is_alive():
        log.warning(
            "collective autotuning: thread %s is still inside a store request "
            "%gs after it was told to stop",
            thread.name,
            _JOIN_TIMEOUT_S,
        )
        return False
    return True


class Liveness:
    """A process's heartbeat, and its watch over the members its main thread waits for.

    See ``docs/modules.md``, "liveness.py".  ``compiling`` says whether the process
    compiles (the default probes Dynamo's ``compile_lock``); the store, the rank and
    the main thread are injectable, and the wake listener can be left out,
    so that one process can simulate many ranks
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
        self._frames: dict[str, int] = {}  # frame id -> highest compile index
        self._watches: list[Watch] = []
        # Members observed while a session is open (global rank -> how many
        # sessions observe it), and what was seen of them.
        self._observed: dict[int, int] = {}
        self._seen: dict[int, Observation] = {}
        self._interval = beat_interval(timedelta(seconds=30))
        self._timeout = 30.0
        self._awake_until = 0.0  # beats while idle until then, when a peer woke it

    # The main thread's side -----------------------------------------------------
    def ensure_running(self, timeout: timedelta | None = None) -> None:
        """Start the threads on the current default store (again after it changed).

        Threads started on a previous store are stopped and joined first.  The
        threads stop by themselves, joined, when the store is released (see
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
            self._store, self._rank, self._published = (
                weakref.ref(store),
                self._global_rank(),
                "",
            )
            self.client = StoreClient(store.clone())
            stop = threading.Event()
            heartbeat = threading.Thread(
                target=self._run,
                args=(self.client, stop),
                name="collective-benchmark-liveness",
                daemon=True,
            )
            listener = None
            if self._listen:
                listener = threading.Thread(
                    target=self._listen_for_wakes,
                    args=(StoreClient(store.clone()), self._rank, stop),
                    name="collective-benchmark-wakes",
                    daemon=True,
                )
            threads = _Threads(stop, self._rank, self.client, heartbeat, listener)
            self._threads = threads
            heartbeat.start()
            if listener is not None:
                listener.start()
        # destroy_process_group() releases the default store: the threads must
        # not outlive it (see "Shutdown" in docs/modules.md).
        weakref.finalize(store, self._stop_threads, threads)

    def shutdown(self) -> None:
        """Stop this process's liveness threads and join them (idempotent).

        Runs at exit and when the store the threads serve is released; callable
        from any thread.  Costs three store requests when the wake listener
        runs (this process wakes its own listener, which reads and deletes the
        key), none when the store is gone.  A thread still inside a store
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
        self._wake.set()
        listener = threads.listener
        if not _join(threads.heartbeat) or listener is None or not listener.is_alive():
            return
        try:
            # The listener blocks in the store's wait on this key; the
            # heartbeat's connection is free now.
            threads.client.set(wake_key(threads.rank), wake_value())
        except Exception:  # the store went away, and so did the listener's wait
            log.debug(
                "collective autotuning: could not wake the listener", exc_info=True
            )
        _join(listener)

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
            self._sessions[name] = self._sessions.get(name, 0) + 1
            if frame is not None:
                key = str(frame[0])
                self._frames[key] = max(self._frames.get(key, -1), frame[1])
            if observe is not None:
                self._observed[observe] = self._observed.get(observe, 0) + 1
        self._wake.set()
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

    def _listen_for_wakes(
        self, client: StoreClient, rank: int, stop: threading.Event
    ) -> None:
        # One blocked request per process, on a connection of its own.  A
        # peer that waits for this process while it is idle wakes it, and it
        # beats for two timeouts: alive (running compiled code, or eager code
        # on its way to a compile) is then told apart from dead.  A verdict
        # on the job wakes it too, and is logged: a rank blocked in a
        # collective of its compiled code cannot raise, but its log says why.
        key = wake_key(rank)
        logged = False
        while True:
            try:
                client.wait(key, _BACKSTOP)
                value = client.get(key)
                client.delete(key)
            except Exception:  # the store went away, or a day passed
                log.debug("collective autotuning wake listener stopped", exc_info=True)
                return
            if stop.is_set():  # woken by shutdown(), which set the key
                return
            verdict = wake_verdict(value)
            if verdict is None:
                # No waker wrote it: the store is no job's (the "fake"
                # backend's answers every wait at once, with nothing), and
                # listening on would spin.
                log.debug("collective autotuning: %r is no wake value", value)
                return
            if verdict and not logged:
                logged = True
                log.error(
                    "collective autotuning: a peer gave up on this job: %s", verdict
                )
            self._awake_until = time.monotonic() + 2 * self._timeout
            self._wake.set()

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
        key = status_key(self._rank)
        while not stop.is_set():
            try:
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
                    client.set(key, status.encode())
                    self._published = activity
                for member in observed:
                    self._observe(client, member)
                for watch in watches:
                    watch.check(client, watch)
            except Exception:  # the store went away: the process group was destroyed
                log.debug("collective benchmarking liveness stopped", exc_info=True)
                return
            self._wake.wait(self._interval)
            self._wake.clear()


_liveness = Liveness()
atexit.register(_liveness.shutdown)


def ensure_heartbeat(timeout: timedelta) -> None:
    """Start this process's liveness thread (idempotent), beating for ``timeout``.

    From then on the process beats while it compiles or has a session open,
    so that peers waiting for it know it is alive; ``timeout`` (the
    sessions' :attr:`CollectiveBenchmarkConfig.timeout`) sets how often.
    Any rank may call it, alone.  Does nothing before
    ``init_process_group``: the session that follows reports the missing
    process group.
    """
    if dist.is_available() and dist.is_initialized():
        _liveness.ensure_running(timeout)
