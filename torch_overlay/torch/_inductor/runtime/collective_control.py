"""The control plane of collective benchmarking: liveness and agreement over the store.

``collective_benchmarking.py`` runs the protocol; this module holds what it
stands on when the data plane cannot be trusted, and everything it asks of
the job's store.  One ``TCPStore`` serves every rank of a torchrun job, so
what a rank asks of it is kept near zero: nothing while no session or compile
that may tune is in flight, a handful of requests per session, and requests
that grow neither with the number of members nor with the time spent waiting
for one of them.

Liveness
--------
Every process that tunes runs one daemon thread (:class:`Liveness`).  It
*beats*, i.e. rewrites one key of its own, ``status/<rank>``, every
:func:`beat_interval` seconds, but only while the process has a session open,
its main thread compiles (Dynamo's frame compilation, which holds the
lowering and the scheduler where sessions start), or a peer woke it (below).
The key carries a counter that advances with every beat, what the process
does (``compiling``, ``session`` or ``idle``), the frames it opened sessions
for, and, when its main thread is inside a collective call, which one and
for how long.  When the process stops, the thread writes ``idle`` once and
then asks nothing of the store.  The thread runs Python code, so a process
whose main thread holds the GIL in a C call that never returns (*wedged*)
stops beating, as does a dead one; a process that is only busy (a long
kernel, a sleep, a slow host, a compile) keeps beating.

A process that beats on its own cannot tell a peer that is idle (it runs
compiled or eager code, on its way to a compile or not) from one that is
dead.  So every process also keeps one request blocked in the store, on its
``wake/<rank>`` key: a peer that waits for it sets the key, and the process
then beats for two timeouts (its peer keeps waking it while it waits).  A
member that was woken and does not beat within a timeout is dead or wedged.

Agreement
---------
:class:`ControlStore` gives a session bounded rendezvous over the store.  Each
member counts itself in with one ``add``; the member that completes the count
sets the rendezvous' ``done`` key; every other member blocks in one ``wait``
on it.  Values travel in one append-only log per rendezvous (read once, when
complete), in counters, or in compare-and-set claims: no member reads the
others one by one in the happy path.

Each member's liveness thread reads the status of *one* other member, its
successor in the group's ring (the next rank), once per beat interval while
its session is open; while the member waits in a rendezvous it applies the
rules below to what it read.  Any member that does not arrive is the
successor of a member that did, or of one that did not, and so on back to
the first member that waits: some member watches it.  When a rule fires, the
watcher gives the rendezvous its *verdict*, by compare-and-set on the
rendezvous' ``verdict`` and ``done`` keys: the first verdict is the one every
member raises, and a member arriving later raises it at once.  A member is
given up on when

* it compiles or has a session open, but its counter has not advanced for
  ``collective_benchmark_timeout`` (dead, or wedged);
* it was woken and has not beaten within a timeout (dead, or wedged);
* it has been inside the same collective call for longer than the timeout
  while its peers wait in a *failure agreement* of the session it is in:
  they have left the step that collective belongs to, so it cannot complete
  (it is not on the session's channel, whose failure would have failed it);
* it runs compiled code (``idle``) and compiled the waiting member's frame
  before, fewer times: the waiting member recompiled alone (a guard failed on
  it only).  This verdict is also sent to every member's ``wake`` key, where
  its listener logs it: a rank blocked in a collective of its compiled code
  cannot raise, but its log says why;
* it is alive but still absent after ``collective_benchmark_max_wait``.

Requests
--------
A member arriving at a rendezvous makes one ``add``, one ``wait`` (or, when it
completes the count, one ``compare_set``) and one ``get``; a value costs one
``append`` or ``add`` more and one read of the log.  During a session a member
beats and reads one status per beat interval; a member that waits for an
idle peer wakes it once per half timeout.  A session deletes its keys when
every member has left it (the member that leaves last deletes them); what
stays in the store is one status key per process, and after a failure the
keys of the failed session.  Outside sessions and compiles a process makes
no request; its one blocked ``wait`` is re-issued once a day.
:data:`store_requests` counts every request this module makes, by kind.

Nothing here is a collective: every call on the store is a point-to-point
request to the store's server, which does not depend on any channel.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import json
import logging
import sys
import threading
import time
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist


if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence


__all__ = [
    "CollectiveBenchmarkError",
    "CollectiveBenchmarkTimeout",
    "ControlStore",
    "Liveness",
    "MemberStatus",
    "StoreClient",
    "beat_interval",
    "ensure_heartbeat",
    "main_store_client",
    "resolve_group",
    "store_requests",
]

log = logging.getLogger(__name__)

# Every key this module writes lives under this prefix of the default store.
STORE_PREFIX = "collective_benchmarking"


def status_key(global_rank: int) -> str:
    return f"{STORE_PREFIX}/status/{global_rank}"


def wake_key(global_rank: int) -> str:
    """The key a process's listener blocks on: set to wake it (see :class:`Liveness`)."""
    return f"{STORE_PREFIX}/wake/{global_rank}"


_VERDICT_PREFIX = "verdict|"

# A store wait that is meant to end by an event, not by its timeout: the
# timeout is only a backstop (a timed-out store request logs a c10d warning,
# which the protocol must not cause routinely).
_BACKSTOP = timedelta(days=1)

# Every request this module made to the store, by kind.
store_requests: collections.Counter[str] = collections.Counter()


class CollectiveBenchmarkError(RuntimeError):
    """Benchmarking cannot reach a decision every rank shares.

    Raised on every healthy rank of the group, at the same protocol step, when
    a member is lost (dead, wedged, stuck, or late past the cap) or when the
    members are not tuning the same op.
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
        if world is None:
            raise CollectiveBenchmarkError("the default process group was destroyed")
        return world
    if isinstance(group, str):
        return dist.distributed_c10d._resolve_process_group(
            dist.distributed_c10d.GroupName(group)
        )
    return group


def beat_interval(timeout: timedelta) -> float:
    """Seconds between two beats, and between two reads of a watched member.

    An eighth of the timeout: a lost member is named within the timeout plus
    one interval, and a beating process asks little of the store (one request
    every 3.75 s at the default timeout of 30 s).
    """
    return min(max(timeout.total_seconds() / 8, 0.05), 5.0)


# --- the store ---------------------------------------------------------------------
_UNSET = "\x00unset"


class StoreClient:
    """A connection of this module's own to the job's store, counting its requests.

    Blocking waits happen on connections of this module's own (``clone``), so
    that they never hold up the connection that process groups use.  Every
    request is counted in :data:`store_requests` and in ``requests``; when
    ``times`` is a list, each request's ``time.monotonic()`` is appended to it.
    """

    def __init__(self, store: dist.Store) -> None:
        self._store = store
        self.requests: collections.Counter[str] = collections.Counter()
        self.times: list[float] | None = None

    def _count(self, kind: str) -> None:
        store_requests[kind] += 1
        self.requests[kind] += 1
        if self.times is not None:
            self.times.append(time.monotonic())

    def set(self, key: str, value: str) -> None:
        self._count("set")
        self._store.set(key, value)

    def get(self, key: str) -> str:
        self._count("get")
        return self._store.get(key).decode()

    def add(self, key: str, amount: int) -> int:
        self._count("add")
        return self._store.add(key, amount)

    def append(self, key: str, value: str) -> None:
        self._count("append")
        # Missing from Store's stubs; every c10d store implements it.
        self._store.append(key, value)  # type: ignore[attr-defined]

    def compare_set(self, key: str, expected: str, desired: str) -> str:
        """Set ``key`` to ``desired`` if it holds ``expected`` ("" for unset); its value."""
        self._count("compare_set")
        return self._store.compare_set(key, expected, desired).decode()

    def wait(self, key: str, timeout: timedelta) -> None:
        self._count("wait")
        self._store.wait([key], timeout)

    def delete(self, key: str) -> None:
        self._count("delete_key")
        self._store.delete_key(key)

    def multi_set(self, keys: list[str], values: list[str]) -> None:
        self._count("multi_set")
        # Missing from Store's stubs; every c10d store implements it.
        self._store.multi_set(keys, values)  # type: ignore[attr-defined]

    def read_if_set(self, key: str) -> str | None:
        """The value of ``key``, or None when it is not set; one request, never blocks."""
        # A compare-and-set whose expected value no writer uses never sets,
        # and answers the value, or the expected one when the key is unset.
        value = self.compare_set(key, _UNSET, _UNSET)
        return None if value == _UNSET else value


def _default_store() -> dist.Store:
    return dist.distributed_c10d._get_default_store()


_main_clients: dict[int, tuple[dist.Store, StoreClient]] = {}


def main_store_client() -> StoreClient:
    """The calling process's connection for this module's requests, made once per store."""
    store = _default_store()
    known = _main_clients.get(id(store))
    if known is None or known[0] is not store:
        _main_clients.clear()
        known = _main_clients[id(store)] = (store, StoreClient(store.clone()))
    return known[1]


# --- liveness ------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class MemberStatus:
    """What a process's ``status/<rank>`` key says about it."""

    counter: int
    activity: str  # "compiling", "session" or "idle"
    sessions: tuple[str, ...] = ()  # the sessions it has open
    blocked_in: str = ""  # the collective call its main thread is in ...
    blocked_for: float = 0.0  # ... and for how many seconds, when it beat
    frames: dict[str, int] = dataclasses.field(default_factory=dict)

    def encode(self) -> str:
        return json.dumps(
            [
                self.counter,
                self.activity,
                self.sessions,
                self.blocked_in,
                round(self.blocked_for, 3),
                self.frames,
            ]
        )

    @staticmethod
    def decode(text: str) -> MemberStatus:
        counter, activity, sessions, blocked_in, blocked_for, frames = json.loads(text)
        return MemberStatus(
            counter, activity, tuple(sessions), blocked_in, blocked_for, frames
        )


def _collective_call(frame: object) -> str:
    # The collective that a thread whose innermost Python frame is ``frame``
    # is inside, or "": an op of torch's c10d namespaces called through
    # OpOverload.__call__ (compiled code, functional collectives), or a
    # function of torch.distributed.distributed_c10d (eager collectives).
    code = getattr(frame, "f_code", None)
    if code is None:
        return ""
    if code.co_filename.endswith("distributed_c10d.py"):
        return f"torch.distributed.{code.co_name}"
    if code.co_name == "__call__" and code.co_filename.endswith("_ops.py"):
        op = getattr(frame, "f_locals", {}).get("self")
        if getattr(op, "namespace", "") in ("_c10d_functional", "c10d"):
            return str(op)
    return ""


@dataclasses.dataclass
class Observation:
    """What a liveness thread saw of one member, from its first read of the member's status."""

    status: MemberStatus | None
    first_read: float
    advanced_at: float | None = None  # when its counter was last seen to change
    idle_since: float | None = None  # since when it has been seen idle

    def update(self, status: MemberStatus | None, now: float) -> None:
        if status is not None and (
            self.status is None or status.counter != self.status.counter
        ):
            self.advanced_at = now
        if status is not None and status.activity == "idle":
            self.idle_since = self.idle_since or now
        else:
            self.idle_since = None
        self.status = status

    def silent_for(self, now: float) -> float:
        """Seconds since the counter was last seen to change (or since the first read)."""
        return now - (self.advanced_at or self.first_read)


@dataclasses.dataclass
class Watch:
    """A rendezvous that the main thread waits in, and the member its liveness thread watches."""

    control: ControlStore
    tag: str
    what: str
    successor: int  # group rank of the watched member
    failure_agreement: bool
    also: str | None = None  # a counter of members that count as arrived
    started: float = dataclasses.field(default_factory=time.monotonic)
    first_woke_at: float | None = None  # when the watcher first woke the member
    woke_at: float | None = None  # ... and last


class Liveness:
    """A process's heartbeat, and its watch over the members its main thread waits for.

    See the module docstring.  ``compiling`` says whether the watched main
    thread compiles (the default reads its stack); the store, the rank and
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
        self._compiling = compiling or self._main_thread_compiling
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._store: dist.Store | None = None
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
        self._blocked: tuple[int, int, str] | None = None
        self._blocked_since = 0.0

    # The main thread's side -----------------------------------------------------
    def ensure_running(self, timeout: timedelta | None = None) -> None:
        """Start the thread on the current default store (again after it changed)."""
        if timeout is not None:
            self._interval = beat_interval(timeout)
            self._timeout = timeout.total_seconds()
        store = self._store_factory()
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                if self._store is store:
                    return
            self._stop.set()
            self._stop = threading.Event()
            self._store, self._rank, self._published = store, self._global_rank(), ""
            self.client = StoreClient(store.clone())
            self._thread = threading.Thread(
                target=self._run,
                args=(self.client, self._stop),
                name="collective-benchmark-liveness",
                daemon=True,
            )
            self._thread.start()
            if self._listen:
                threading.Thread(
                    target=self._listen_for_wakes,
                    args=(StoreClient(store.clone()), self._rank, self._stop),
                    name="collective-benchmark-wakes",
                    daemon=True,
                ).start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

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
    def _main_thread_compiling(self) -> bool:
        # Whether the main thread is inside Dynamo's frame compilation (tracing
        # and Inductor both run there), read from its stack: Dynamo's
        # callbacks are cleared by torch._dynamo.reset().
        from torch._dynamo.convert_frame import _compile

        frame = sys._current_frames().get(self._main_thread.ident or -1)
        while frame is not None:
            if frame.f_code is _compile.__code__:
                return True
            frame = frame.f_back
        return False

    def _blocked_call(self, now: float) -> tuple[str, float]:
        frame = sys._current_frames().get(self._main_thread.ident or -1)
        call = _collective_call(frame)
        if not call or frame is None:
            self._blocked = None
            return "", 0.0
        identity = (id(frame), frame.f_lasti, call)
        if self._blocked != identity:
            self._blocked, self._blocked_since = identity, now
        return call, now - self._blocked_since

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
        while not stop.is_set():
            try:
                client.wait(key, _BACKSTOP)
                value = client.get(key)
                client.delete(key)
            except Exception:  # the store went away, or a day passed
                log.debug("collective autotuning wake listener stopped", exc_info=True)
                return
            if value.startswith(_VERDICT_PREFIX) and not logged:
                logged = True
                log.error(
                    "collective autotuning: a peer gave up on this job: %s",
                    value[len(_VERDICT_PREFIX) :],
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
                    blocked, blocked_for = self._blocked_call(time.monotonic())
                    self._counter += 1
                    status = MemberStatus(
                        self._counter, activity, sessions, blocked, blocked_for, frames
                    )
                    client.set(key, status.encode())
                    self._published = activity
                for member in observed:
                    self._observe(client, member)
                for watch in watches:
                    watch.control.check(client, watch)
            except Exception:  # the store went away: the process group was destroyed
                log.debug("collective benchmarking liveness stopped", exc_info=True)
                return
            self._wake.wait(self._interval)
            self._wake.clear()


_liveness = Liveness()
atexit.register(_liveness.stop)


def ensure_heartbeat(timeout: timedelta | None = None) -> None:
    """Start this process's liveness thread (idempotent).

    From then on the process beats while it compiles or has a session open,
    so that peers waiting for it know it is alive; ``timeout`` (default:
    ``torch._inductor.config.collective_benchmark_timeout``) sets how often.
    Does nothing before ``init_process_group``: the session that follows
    reports the missing process group.
    """
    if dist.is_available() and dist.is_initialized():
        if timeout is None:
            from torch._inductor import config

            timeout = timedelta(seconds=config.collective_benchmark_timeout)
        _liveness.ensure_running(timeout)


# --- agreement ----------------------------------------------------------------------
class ControlStore:
    """Bounded, liveness-aware rendezvous of one session over the job's store.

    Every member of the session's group constructs it with the same
    ``prefix`` (unique to the session) and makes the same calls in the same
    order.  See the module docstring for the keys and the requests.
    """

    def __init__(
        self,
        prefix: str,
        rank: int,
        global_ranks: Sequence[int],
        group_name: str,
        timeout: timedelta,
        max_wait: timedelta,
        client: StoreClient | None = None,
        liveness: Liveness = _liveness,
    ) -> None:
        self.prefix = prefix
        self.rank = rank
        self.global_ranks = list(global_ranks)
        self.size = len(self.global_ranks)
        self.group_name = group_name
        self.timeout = timeout.total_seconds()
        self.max_wait = max(max_wait.total_seconds(), self.timeout)
        self.client = client or main_store_client()
        self.liveness = liveness
        self.frame: tuple[int, int] | None = None
        self._keys: set[str] = set()  # shared keys, deleted by the last to leave

    @classmethod
    def for_group(
        cls,
        prefix: str,
        group: dist.ProcessGroup,
        timeout: timedelta,
        max_wait: timedelta,
    ) -> ControlStore:
        return cls(
            prefix,
            group.rank(),
            dist.get_process_group_ranks(group),
            group.group_name,
            timeout,
            max_wait,
        )

    def _key(self, name: str) -> str:
        key = f"{self.prefix}{name}"
        self._keys.add(key)
        return key

    @contextmanager
    def session(self) -> Iterator[None]:
        """Beat, and watch peers while waiting, for the duration.

        On a normal exit the member counts itself out; the member that leaves
        last deletes the session's keys.  After an exception the keys stay.
        """
        compile_id = torch._guards.CompileContext.current_compile_id()
        if compile_id is not None and compile_id.frame_id is not None:
            self.frame = (compile_id.frame_id, compile_id.frame_compile_id or 0)
        self.liveness.ensure_running(timedelta(seconds=self.timeout))
        successor = self.global_ranks[(self.rank + 1) % self.size]
        observe = successor if self.size > 1 else None
        with self.liveness.session(self.prefix, self.frame, observe):
            yield
        if self.client.add(self._key("left"), 1) == self.size:
            for key in sorted(self._keys):
                self.client.delete(key)

    # Rendezvous -------------------------------------------------------------------
    def barrier(self, tag: str, what: str, also: str | None = None) -> None:
        """Return once every member arrived at ``tag``; raise the verdict otherwise.

        Members counted under the counter ``also`` (they went past this step)
        count as arrived.  ``what`` names the step in errors.
        """
        arrived = self.client.add(self._key(f"{tag}/count"), 1)
        if also is not None:
            arrived += self.client.add(self._key(also), 0)
        done = self._key(f"{tag}/done")
        if arrived >= self.size:
            self._finish(self.client, tag, "complete")
        else:
            watch = Watch(
                self,
                tag,
                what,
                (self.rank + 1) % self.size,
                failure_agreement=tag.startswith("failure"),
                also=also,
            )
            with self.liveness.watching(watch):
                self._wait(done, what)
        if self.client.get(done) != "complete":
            giver, _, message = self.client.get(
                f"{self.prefix}{tag}/verdict"
            ).partition("|")
            if int(giver) != self.rank:
                message += " (the verdict of a peer that gave up waiting)"
            raise CollectiveBenchmarkError(message)

    def _wait(self, key: str, what: str) -> None:
        # The liveness thread ends the wait with a verdict when a rule fires;
        # this deadline only matters when that thread is gone.
        deadline = timedelta(seconds=self.max_wait + 2 * self.timeout)
        try:
            self.client.wait(key, deadline)
        except Exception as error:
            raise CollectiveBenchmarkError(
                f"collective autotuning: {what} did not complete within "
                f"{deadline.total_seconds():g}s on group {self.group_name!r}: {error}"
            ) from error

    def gather(
        self, tag: str, value: str, what: str, also: str | None = None
    ) -> list[str | None]:
        """Post ``value`` under ``tag``; every member's value, in rank order.

        A member counted under ``also`` posted nothing: its entry is None.
        """
        log_key = self._key(f"{tag}/log")
        self.client.append(log_key, f"{self.rank}:{len(value)}:{value}")
        self.barrier(tag, what, also)
        return self._parse_log(self.client.get(log_key))

    def _parse_log(self, text: str) -> list[str | None]:
        posts: list[str | None] = [None] * self.size
        position = 0
        while position < len(text):
            rank, length, _ = text[position:].split(":", 2)
            start = position + len(rank) + len(length) + 2
            posts[int(rank)] = text[start : start + int(length)]
            position = start + int(length)
        return posts

    def count(self, name: str, amount: int = 1) -> int:
        """Add ``amount`` to the session's counter ``name``; its new value."""
        return self.client.add(self._key(name), amount)

    def claim(self, name: str, value: str) -> str:
        """Claim ``name`` for this member with ``value``; the claim that holds so far.

        The claim of the lowest-ranked member that claims holds, whatever the
        order in which members claim (a compare-and-set loop, which retries
        only when another member claims at the same moment).  Claims are read
        (:meth:`read_claim`) after a rendezvous that every claimer claimed
        before.  A claim is ``"<rank>|<value>"``.
        """
        key, mine = self._key(name), f"{self.rank}|{value}"
        current = self.client.read_if_set(key)
        while current is None or int(current.partition("|")[0]) > self.rank:
            current_or_unset = "" if current is None else current
            current = self.client.compare_set(key, current_or_unset, mine)
            if current == mine:
                break
        return current

    def read_claim(self, name: str) -> str | None:
        """The claim on ``name`` (``"<rank>|<value>"``), or None when nobody claimed it."""
        return self.client.read_if_set(self._key(name))

    def post(self, name: str, value: str) -> None:
        self.client.set(self._key(name), value)

    def delete_on_leave(self, name: str) -> None:
        """Have the member that leaves last delete ``name`` (posted by another member)."""
        self._key(name)

    def fetch(self, name: str) -> str:
        """A value posted under ``name`` before a rendezvous that this member completed."""
        return self.client.get(self._key(name))

    # The watcher's side (called from the liveness thread) --------------------------
    def check(self, client: StoreClient, watch: Watch) -> None:
        """Apply the liveness rules to the member that ``watch`` watches; maybe give the verdict."""
        if watch.also is not None and self._completed_by_others(client, watch):
            return
        now = time.monotonic()
        member = self.global_ranks[watch.successor]
        seen = self.liveness.seen(member)
        status = seen.status if seen is not None else None
        waited = now - watch.started
        reason = None
        if seen is None or status is None or status.activity == "idle":
            # Not beating on its own: wake it, again every half timeout while
            # it is waited for (a woken process beats for two timeouts), and
            # judge it by whether it beats.
            if watch.woke_at is None:
                if waited > self.liveness.interval:
                    self._wake(client, watch, member, now)
            elif now - watch.woke_at > self.timeout / 2:
                self._wake(client, watch, member, now)
            last_beat = seen.advanced_at if seen is not None else None
            if (
                watch.first_woke_at is not None
                and now - watch.first_woke_at > self.timeout
                and (last_beat is None or now - last_beat > self.timeout)
            ):
                reason = (
                    f"{watch.what}: no heartbeat from them within "
                    f"{now - watch.first_woke_at:.1f}s of waking them "
                    f"(collective_benchmark_timeout is {self.timeout:g}s); dead, or "
                    "wedged in a call that holds the GIL"
                )
            elif (
                status is not None
                and seen is not None
                and now - (seen.idle_since or now) > self.timeout
                and self._recompiled_alone(status)
            ):
                self.give_up(client, watch, self._alone_reason(watch), job=True)
                return
        elif seen.silent_for(now) > self.timeout:
            reason = (
                f"{watch.what}: no heartbeat from them for {seen.silent_for(now):.1f}s "
                f"(collective_benchmark_timeout is {self.timeout:g}s); dead, or "
                "wedged in a call that holds the GIL"
            )
        elif (
            watch.failure_agreement
            and self.prefix in status.sessions
            and status.blocked_for > self.timeout
        ):
            reason = (
                f"{watch.what}: blocked in {status.blocked_in} for "
                f"{status.blocked_for:.1f}s, a collective that its peers have "
                "left, which is not on the session's benchmark channel (an "
                "implementation that captured a process group?)"
            )
        if reason is None and waited > self.max_wait:
            reason = (
                f"{watch.what} within {self.max_wait:g}s "
                "(collective_benchmark_max_wait) although alive: stalled, or "
                "compiling a different program"
            )
        if reason is not None:
            self.give_up(client, watch, reason)

    def _wake(self, client: StoreClient, watch: Watch, member: int, now: float) -> None:
        client.set(wake_key(member), "wake")
        watch.woke_at = now
        if watch.first_woke_at is None:
            watch.first_woke_at = now

    def _completed_by_others(self, client: StoreClient, watch: Watch) -> bool:
        # A member may go past the step (count itself under ``also``) after
        # the last member arrived here: then nobody completed the count.
        arrived = client.add(f"{self.prefix}{watch.tag}/count", 0)
        arrived += client.add(f"{self.prefix}{watch.also}", 0)
        if arrived >= self.size:
            self._finish(client, watch.tag, "complete")
            return True
        return False

    def _finish(self, client: StoreClient, tag: str, outcome: str) -> None:
        client.compare_set(f"{self.prefix}{tag}/done", "", outcome)

    def give_up(
        self, client: StoreClient, watch: Watch, reason: str, job: bool = False
    ) -> None:
        """Give ``watch``'s rendezvous the verdict that its watched member did not reach it."""
        lost = self.global_ranks[watch.successor]
        message = (
            f"collective autotuning: ranks [{lost}] of group {self.group_name!r} "
            f"did not reach {reason}"
        )
        client.compare_set(
            f"{self.prefix}{watch.tag}/verdict", "", f"{self.rank}|{message}"
        )
        self._finish(client, watch.tag, "verdict")
        if job:
            # Members that run compiled code log it (see Liveness).
            keys = [wake_key(rank) for rank in self.global_ranks]
            client.multi_set(keys, [f"{_VERDICT_PREFIX}{message}"] * len(keys))

    def _recompiled_alone(self, status: MemberStatus) -> bool:
        # A member that compiled this frame before, fewer times than this one,
        # and now runs compiled code, is not on its way to this compile.
        if self.frame is None:
            return False
        theirs = status.frames.get(str(self.frame[0]), -1)
        return 0 <= theirs < self.frame[1]

    def _alone_reason(self, watch: Watch) -> str:
        frame = self.frame or (-1, -1)
        return (
            f"{watch.what}: they run compiled code instead of compiling, and "
            f"compiled this frame fewer times than this rank (compile {frame[1]} "
            f"of frame {frame[0]}): this rank recompiled alone (a guard failed on "
            "it only), and its peers wait for it in a collective of the code they "
            "run. Call torch.compiler.set_enable_guard_collectives(True) on every "
            "rank so that all ranks recompile together, or make the guard the "
            "same on every rank"
        )
