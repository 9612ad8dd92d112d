"""What a heartbeat carries, how often a process beats, and what a watcher sees.

:class:`MemberStatus` is the value of a process's ``status/<rank>`` key,
:class:`Observation` what a watching thread made of a member's statuses so
far, and :class:`Watch` the rendezvous it watches for.  The threads that
beat and watch are ``liveness.py``'s.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import TYPE_CHECKING

from torch._C._distributed_c10d import _dump_fr_trace_json


if TYPE_CHECKING:
    from collections.abc import Callable
    from datetime import timedelta

    from .store import StoreClient


__all__ = [
    "beat_interval",
    "MemberStatus",
    "Observation",
    "pending_collective",
    "Watch",
]


# The backends whose FlightRecorder pending_collective reads: c10d keeps one
# recorder per backend, and these are the ones that feed theirs.
_RECORDING_BACKENDS = ("gloo", "nccl")


def beat_interval(timeout: timedelta) -> float:
    """Seconds between two beats, and between two reads of a watched member.

    An eighth of the timeout: a lost member is named within the timeout plus
    one interval, and a beating process asks little of the store (one request
    every 3.75 s at the default timeout of 30 s).
    """
    return min(max(timeout.total_seconds() / 8, 0.05), 5.0)


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


def pending_collective(thread_ident: int | None) -> tuple[str, float]:
    """The collective that thread ``thread_ident`` waits in, and for how many seconds.

    Read from c10d's FlightRecorder, which every gloo and NCCL backend
    feeds with the collectives it runs (on by default; ``TORCH_FR_BUFFER_SIZE=0``
    turns it off, and then this finds nothing): the newest entry that the
    thread issued and that has not completed.  A collective older than its
    own timeout is left out: it is failing on its own.  ``("", 0.0)`` when
    there is none.  Any thread may call it; it reads no thread's frames, and
    raises nothing.
    """
    now_ns = time.time_ns()
    pending = []
    for backend in _RECORDING_BACKENDS:
        try:
            dump = json.loads(_dump_fr_trace_json(True, True, backend=backend))
        except Exception:  # the backend records nothing in this build
            continue
        for entry in dump.get("entries", ()):
            created = entry.get("time_created_ns", now_ns)
            if (
                not entry.get("retired", True)
                and entry.get("thread_id") == str(thread_ident)
                and now_ns - created < entry.get("timeout_ms", 0) * 1_000_000
            ):
                pending.append((created, entry))
    if not pending:
        return "", 0.0
    created, newest = max(pending, key=lambda item: item[0])
    name, description = [*newest.get("process_group", ()), "?", "?"][:2]
    return (
        f"{newest.get('profiling_name', 'a collective')} on process group "
        f"{name!r} ({description})",
        (now_ns - created) / 1e9,
    )


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

    check: Callable[[StoreClient, Watch], None]  # the rendezvous's liveness rules
    tag: str
    what: str
    successor: int  # group rank of the watched member
    failure_agreement: bool
    also: str | None = None  # a counter of members that count as arrived
    started: float = dataclasses.field(default_factory=time.monotonic)
    first_woke_at: float | None = None  # when the watcher first woke the member
    woke_at: float | None = None  # ... and last
