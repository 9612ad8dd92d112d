"""The control plane of collective benchmarking: agreement over the store.

:class:`ControlStore` gives a session bounded rendezvous over the job's
store, and the rules by which a watching member gives up on the member a
rendezvous waits for.  Nothing here is a collective: every call is a
point-to-point request to the store's server.  The rules, the keys and the
requests per session: ``docs/modules.md``, "control.py".
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, NamedTuple, TYPE_CHECKING

import torch
import torch.distributed as dist

from .beats import MemberStatus, Observation, Watch
from .liveness import _liveness, Liveness
from .store import (
    CollectiveBenchmarkError,
    main_store_client,
    StoreClient,
    wake_key,
    wake_value,
)


if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence


__all__ = ["Claim", "ControlStore"]


class Claim(NamedTuple):
    """A claim on a session key (:meth:`ControlStore.claim`): who holds it, with what."""

    rank: int  # in the session's group
    value: str

    def encode(self) -> str:
        return json.dumps([self.rank, self.value])

    @staticmethod
    def decode(text: str) -> Claim:
        rank, value = json.loads(text)
        return Claim(rank, value)


# --- agreement ----------------------------------------------------------------------
class ControlStore:
    """Bounded, liveness-aware rendezvous of one session over the job's store.

    Every member of the session's group constructs it with the same
    ``prefix`` (unique to the session) and makes the same calls in the same
    order.  The keys and the requests: ``docs/modules.md``, "control.py".
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
        self._watcher = _Watcher(self)

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
        self._keys.add(key := f"{self.prefix}{name}")
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
            _finish(self.client, self.prefix, tag, "complete")
        else:
            watch = Watch(
                self._watcher.check,
                tag,
                what,
                (self.rank + 1) % self.size,
                failure_agreement=tag.startswith("failure"),
                also=also,
            )
            with self.liveness.watching(watch):
                self._wait(done, what)
        if self.client.get(done) != "complete":
            giver, message = json.loads(self.client.get(f"{self.prefix}{tag}/verdict"))
            if giver != self.rank:
                message += " (the verdict of a peer that gave up waiting)"
            raise CollectiveBenchmarkError(message)

    def _wait(self, key: str, what: str) -> None:
        # The liveness thread ends the wait with a verdict when a rule fires;
        # this deadline only matters when that thread is gone.
        deadline = timedelta(seconds=self.max_wait + 2 * self.timeout)
        try:
            self.client.wait(key, deadline)
        except CollectiveBenchmarkError:
            raise  # the store went away
        except Exception as error:
            raise CollectiveBenchmarkError(
                f"collective autotuning: {what} did not complete within "
                f"{deadline.total_seconds():g}s on group {self.group_name!r}: {error}"
            ) from error

    def gather(
        self, tag: str, value: Any, what: str, also: str | None = None
    ) -> list[Any]:
        """Post ``value`` (JSON-serializable) under ``tag``; every member's value, in rank order.

        A member counted under ``also`` posted nothing: its entry is None.
        """
        log_key = self._key(f"{tag}/log")
        # JSON Lines: one append per member, one read of the whole log.
        self.client.append(log_key, json.dumps([self.rank, value]) + "\n")
        self.barrier(tag, what, also)
        posts: list[Any] = [None] * self.size
        for line in self.client.get(log_key).splitlines():
            rank, posted = json.loads(line)
            posts[rank] = posted
        return posts

    def count(self, name: str, amount: int = 1) -> int:
        """Add ``amount`` to the session's counter ``name``; its new value."""
        return self.client.add(self._key(name), amount)

    def claim(self, name: str, value: str) -> Claim:
        """Claim ``name`` for this member with ``value``; the claim that holds so far.

        The claim of the lowest-ranked member that claims holds, whatever the
        order in which members claim (a compare-and-set loop, which retries
        only when another member claims at the same moment).  Claims are read
        (:meth:`read_claim`) after a rendezvous that every claimer claimed
        before.
        """
        key, mine = self._key(name), Claim(self.rank, value).encode()
        current = self.client.read_if_set(key)
        while current is None or Claim.decode(current).rank > self.rank:
            current = self.client.compare_set(key, current or "", mine)
            if current == mine:
                break
        return Claim.decode(current)

    def read_claim(self, name: str) -> Claim | None:
        """The claim on ``name``, or None when nobody claimed it."""
        text = self.client.read_if_set(self._key(name))
        return None if text is None else Claim.decode(text)

    def post(self, name: str, value: str) -> None:
        self.client.set(self._key(name), value)

    def delete_on_leave(self, name: str) -> None:
        """Have the member that leaves last delete ``name`` (posted by another member)."""
        self._key(name)

    def fetch(self, name: str) -> str:
        """A value posted under ``name`` before a rendezvous that this member completed."""
        return self.client.get(self._key(name))


def _finish(client: StoreClient, prefix: str, tag: str, outcome: str) -> None:
    # The first outcome holds: a verdict given after the count completed (or
    # the reverse) changes nothing.
    client.compare_set(f"{prefix}{tag}/done", "", outcome)


class _Watcher:
    """The liveness rules of one session's rendezvous, applied by a waiting member.

    Kept apart from :class:`ControlStore`, whose calls the main thread makes:
    these run on the liveness thread, once per beat interval while a
    rendezvous is waited in, and read only what that thread observed of the
    watched member.  The rules: ``docs/modules.md``, "control.py".
    """

    def __init__(self, control: ControlStore) -> None:
        self.control = control

    def check(self, client: StoreClient, watch: Watch) -> None:
        control = self.control
        if watch.also is not None and self._completed_by_others(client, watch):
            return
        now = time.monotonic()
        member = control.global_ranks[watch.successor]
        seen = control.liveness.seen(member)
        if seen is None or seen.status is None or seen.status.activity == "idle":
            verdict = self._judge_idle(client, watch, member, seen, now)
        else:
            verdict = self._judge_busy(client, watch, member, seen, seen.status, now)
        if verdict is None and now - watch.started > control.max_wait:
            verdict = (
                f"{watch.what} within {control.max_wait:g}s "
                "(collective_benchmark_max_wait) although alive: stalled, or "
                "compiling a different program",
                False,
            )
        if verdict is not None:
            self.give_up(client, watch, *verdict)

    def _judge_idle(
        self,
        client: StoreClient,
        watch: Watch,
        member: int,
        seen: Observation | None,
        now: float,
    ) -> tuple[str, bool] | None:
        # Not beating on its own: woken, and judged by whether it beats.  The
        # verdict and whether it is the job's, or None.
        timeout = self.control.timeout
        self._keep_awake(client, watch, member, now)
        last_beat = seen.advanced_at if seen is not None else None
        if (
            watch.first_woke_at is not None
            and now - watch.first_woke_at > timeout
            and (last_beat is None or now - last_beat > timeout)
        ):
            return (
                f"{watch.what}: no heartbeat from them within "
                f"{now - watch.first_woke_at:.1f}s of waking them "
                f"(collective_benchmark_timeout is {timeout:g}s); dead, or "
                "wedged in a call that holds the GIL",
                False,
            )
        if (
            seen is not None
            and seen.status is not None
            and now - (seen.idle_since or now) > timeout
            and self._recompiled_alone(seen.status)
        ):
            return self._alone_reason(watch), True
        return None

    def _judge_busy(
        self,
        client: StoreClient,
        watch: Watch,
        member: int,
        seen: Observation,
        status: MemberStatus,
        now: float,
    ) -> tuple[str, bool] | None:
        # Beating on its own (compiling, or in a session): judged by its
        # counter, and in a failure agreement of its session by the collective
        # it waits in, which it reads from c10d's FlightRecorder while woken.
        timeout = self.control.timeout
        if seen.silent_for(now) > timeout:
            return (
                f"{watch.what}: no heartbeat from them for {seen.silent_for(now):.1f}s "
                f"(collective_benchmark_timeout is {timeout:g}s); dead, or "
                "wedged in a call that holds the GIL",
                False,
            )
        if not watch.failure_agreement or self.control.prefix not in status.sessions:
            return None
        self._keep_awake(client, watch, member, now)
        if status.blocked_for > timeout:
            return (
                f"{watch.what}: blocked in {status.blocked_in} for "
                f"{status.blocked_for:.1f}s, a collective that its peers have "
                "left, which is not on the session's benchmark channel (an "
                "implementation that captured a process group?)",
                False,
            )
        return None

    def _keep_awake(
        self, client: StoreClient, watch: Watch, member: int, now: float
    ) -> None:
        # Wake the member once it is waited for, and again every half timeout
        # (a woken process beats, and says what it waits in, for two timeouts).
        if watch.woke_at is None:
            if now - watch.started > self.control.liveness.interval:
                self._wake(client, watch, member, now)
        elif now - watch.woke_at > self.control.timeout / 2:
            self._wake(client, watch, member, now)

    def _wake(self, client: StoreClient, watch: Watch, member: int, now: float) -> None:
        client.set(wake_key(member), wake_value())
        watch.woke_at = now
        if watch.first_woke_at is None:
            watch.first_woke_at = now

    def _completed_by_others(self, client: StoreClient, watch: Watch) -> bool:
        # A member may go past the step (count itself under ``also``) after
        # the last member arrived here: then nobody completed the count.
        prefix = self.control.prefix
        arrived = client.add(f"{prefix}{watch.tag}/count", 0)
        arrived += client.add(f"{prefix}{watch.also}", 0)
        if arrived >= self.control.size:
            _finish(client, prefix, watch.tag, "complete")
            return True
        return False

    def give_up(
        self, client: StoreClient, watch: Watch, reason: str, job: bool = False
    ) -> None:
        control = self.control
        lost = control.global_ranks[watch.successor]
        message = (
            f"collective autotuning: ranks [{lost}] of group {control.group_name!r} "
            f"did not reach {reason}"
        )
        if job:
            # Members in compiled code log it (see Liveness); the judged one,
            # woken, polls its key: wait until read, as the store may go next.
            keys = [wake_key(rank) for rank in control.global_ranks]
            client.multi_set(keys, [wake_value(message)] * len(keys))
            read_by = time.monotonic() + 2 * control.liveness.interval
            while time.monotonic() < read_by and client.read_if_set(wake_key(lost)):
                time.sleep(control.liveness.interval / 8)
        verdict = json.dumps([control.rank, message])
        client.compare_set(f"{control.prefix}{watch.tag}/verdict", "", verdict)
        _finish(client, control.prefix, watch.tag, "verdict")

    def _recompiled_alone(self, status: MemberStatus) -> bool:
        # A member that compiled this frame before, fewer times than this one,
        # and now runs compiled code, is not on its way to this compile.
        frame = self.control.frame
        if frame is None:
            return False
        theirs = status.frames.get(str(frame[0]), -1)
        return 0 <= theirs < frame[1]

    def _alone_reason(self, watch: Watch) -> str:
        frame = self.control.frame or (-1, -1)
        return (
            f"{watch.what}: they run compiled code instead of compiling, and "
            f"compiled this frame fewer times than this rank (compile {frame[1]} "
            f"of frame {frame[0]}): this rank recompiled alone (a guard failed on "
            "it only), and its peers wait for it in a collective of the code they "
            "run. Call torch.compiler.set_enable_guard_collectives(True) on every "
            "rank so that all ranks recompile together, or make the guard the "
            "same on every rank"
        )
