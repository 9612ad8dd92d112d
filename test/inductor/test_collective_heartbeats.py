"""Heartbeats of collective benchmarking, on one process and one store.

Imports only ``store`` and ``liveness`` of the package, so that it runs on
the earliest prefixes of the patch series.  What this checks:

* The pure rules: ``beat_interval`` is an eighth of the timeout, clamped to
  [0.05 s, 5 s]; a ``MemberStatus`` survives its encoding; an
  ``Observation`` (on a fake clock) knows since when a member's counter has
  not advanced and since when it has been idle.
* A ``Liveness`` writes ``idle`` once when started, then beats (its counter
  advances) while a session is open or the process compiles, saying
  which sessions and frames; once idle again it writes ``idle`` once and
  asks nothing more of the store.
* While a session observes a member, the thread reads that member's status
  (here its own); while the main thread waits in a ``Watch``, the thread
  applies the watch's check to it, and stops once the watch ends.
* One thread per process.  Idle, it waits in the store on its wake key: a
  peer that sets the key makes it beat; it consumes the key, and logs a
  verdict on the job sent that way.  While it waits there it does not see a
  compile start; a session opening ends the wait (one request), without
  the two timeouts of beats a peer's wake brings.  In a session open for
  half a timeout, it reads its wake key without blocking.
* ``shutdown`` stops and joins the thread with three store requests, and
  is idempotent; the thread also stops when the store it serves is
  released, and starting on another store replaces it.
* The default probe of compiling sees a Dynamo compile from another thread
  (it holds Dynamo's ``compile_lock``), and nothing before or after it.
* ``pending_collective`` names the gloo collective a thread waits in, read
  from c10d's FlightRecorder (two gloo ranks of one process), and nothing
  once it completed; of the recorder's entries it takes the newest one the
  thread issued that has not retired and is younger than its own timeout.
"""

from __future__ import annotations

import gc
import json
import os
import tempfile
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._inductor.runtime.collective_benchmarking import (
    beats as bt,
    liveness as lv,
    store as cs,
)
from torch.testing._internal.common_utils import run_tests, TestCase
from unittest import mock

TIMEOUT = timedelta(seconds=0.4)  # a beat every 0.05 s


def liveness_threads():
    return [t for t in threading.enumerate() if t.name.startswith("collective-")]


class TestRules(TestCase):
    def test_beat_interval(self):
        self.assertEqual(bt.beat_interval(timedelta(seconds=30)), 3.75)
        self.assertEqual(bt.beat_interval(timedelta(seconds=0.1)), 0.05)
        self.assertEqual(bt.beat_interval(timedelta(minutes=10)), 5.0)

    def test_member_status_round_trips(self):
        status = bt.MemberStatus(7, "session", ("a", "b"), "c10d.all_reduce", 1.5)
        self.assertEqual(bt.MemberStatus.decode(status.encode()), status)

    def test_observation_on_a_fake_clock(self):
        seen = bt.Observation(None, first_read=10.0)
        self.assertEqual(seen.silent_for(14.0), 4.0)  # never seen: since the first read
        seen.update(bt.MemberStatus(1, "session"), 11.0)
        seen.update(bt.MemberStatus(1, "session"), 15.0)  # no beat since 11
        self.assertEqual((seen.advanced_at, seen.silent_for(16.0)), (11.0, 5.0))
        seen.update(bt.MemberStatus(2, "idle"), 17.0)
        seen.update(bt.MemberStatus(3, "idle"), 18.0)
        self.assertEqual((seen.advanced_at, seen.idle_since), (18.0, 17.0))
        seen.update(None, 19.0)  # unreadable: no advance, not idle
        self.assertEqual(
            (seen.status, seen.advanced_at, seen.idle_since), (None, 18.0, None)
        )


class _LivenessCase(TestCase):
    def setUp(self):
        super().setUp()
        self.server = dist.TCPStore(
            "127.0.0.1", 0, 1, True, timeout=timedelta(seconds=10)
        )
        self.reader = cs.StoreClient(self.server)
        self.stores = [self.server]  # the last one is the job's store
        self.compiling = False
        self.liveness = self.start(listen=False)

    def tearDown(self):
        self.liveness.shutdown()
        super().tearDown()

    def start(self, listen, timeout=TIMEOUT):
        liveness = lv.Liveness(
            lambda: self.stores[-1],
            lambda: 0,
            compiling=lambda: self.compiling,
            listen=listen,
        )
        liveness.ensure_running(timeout)
        return liveness

    def status(self):
        text = self.reader.read_if_set(cs.status_key(0))
        return None if text is None else bt.MemberStatus.decode(text)

    def wait_for(self, predicate):
        deadline = time.monotonic() + 10
        while not predicate():
            self.assertLess(time.monotonic(), deadline, "condition never held")
            time.sleep(0.01)

    def wait_for_beats(self, beats):
        counter = self.status().counter
        self.wait_for(lambda: self.status().counter >= counter + beats)


class TestHeartbeat(_LivenessCase):
    def test_beats_only_while_busy(self):
        self.assertEqual(self.liveness.interval, 0.05)
        self.wait_for(lambda: self.status() is not None)
        self.assertEqual(self.status(), bt.MemberStatus(1, "idle"))
        with self.liveness.session("s", (7, 2)):
            self.wait_for(lambda: self.status().activity == "session")
            first = self.status()
            self.assertEqual((first.sessions, first.frames), (("s",), {"7": 2}))
            self.wait_for(lambda: self.status().counter > first.counter)
        self.wait_for(lambda: self.status().activity == "idle")
        self.compiling = True
        self.wait_for(lambda: self.status().activity == "compiling")
        self.compiling = False
        self.wait_for(lambda: self.status().activity == "idle")
        settled = (self.status(), sum(self.liveness.client.requests.values()))
        time.sleep(5 * self.liveness.interval)
        self.assertEqual(
            (self.status(), sum(self.liveness.client.requests.values())), settled
        )

    def test_observes_and_checks_the_watched_member(self):
        checks = []
        watch = bt.Watch(
            lambda client, w: checks.append((client, w)), "tag", "rendezvous", 0, False
        )
        with self.liveness.session("s", None, observe=0):
            self.wait_for(
                lambda: self.liveness.seen(0) is not None
                and self.liveness.seen(0).status is not None
            )
            self.assertEqual(self.liveness.seen(0).status.sessions, ("s",))
            with self.liveness.watching(watch):
                self.wait_for(lambda: len(checks) >= 2)
            self.assertTrue(all(c == (self.liveness.client, watch) for c in checks))
            self.wait_for_beats(2)  # a beat that began before the watch ended
            count = len(checks)
            self.wait_for_beats(3)
            self.assertEqual(len(checks), count)
        self.assertIsNone(self.liveness.seen(0))

    def test_threads_stop_with_their_store(self):
        (first,) = liveness_threads()
        self.stores.append(dist.TCPStore("127.0.0.1", self.server.port, 1, False))
        self.liveness.ensure_running(TIMEOUT)  # on the new store: new threads
        (second,) = liveness_threads()
        self.assertIsNot(second, first)
        self.assertFalse(first.is_alive())
        self.stores.pop()
        gc.collect()
        self.assertEqual(liveness_threads(), [])
        self.assertFalse(second.is_alive())


class TestWakes(_LivenessCase):
    """One thread: idle, it waits in the store on its wake key."""

    def start_listening(self, timeout=TIMEOUT):
        self.liveness.shutdown()
        waits = cs.store_requests["wait"]
        self.liveness = self.start(listen=True, timeout=timeout)
        self.wait_for(lambda: self.liveness.client.requests["set"] == 1)  # idle
        self.wait_for(lambda: cs.store_requests["wait"] > waits)  # waits for a wake
        self.assertEqual(len(liveness_threads()), 1)

    def test_a_wake_makes_an_idle_process_beat(self):
        self.start_listening()
        idle = self.status()
        with self.assertLogs(lv.log, "ERROR") as logs:
            self.reader.set(cs.wake_key(0), cs.wake_value("rank 1 is lost"))
            self.wait_for(lambda: self.status().counter > idle.counter + 1)
        self.assertEqual(self.status().activity, "idle")
        self.assertIn("a peer gave up on this job: rank 1 is lost", logs.output[0])
        self.wait_for(lambda: self.reader.read_if_set(cs.wake_key(0)) is None)

    def test_an_idle_process_sees_a_compile_once_woken(self):
        self.start_listening()
        idle = self.status()
        self.compiling = True
        time.sleep(5 * self.liveness.interval)
        self.assertEqual(self.status(), idle)  # waiting in the store
        self.reader.set(cs.wake_key(0), cs.wake_value())
        self.wait_for(lambda: self.status().activity == "compiling")

    def test_a_session_ends_the_wait_without_waking_the_process(self):
        self.start_listening()
        before = cs.store_requests.copy()
        with self.liveness.session("s", None):
            self.wait_for(lambda: self.status().activity == "session")
        self.wait_for(lambda: self.status().activity == "idle")
        settled = self.status()
        time.sleep(5 * self.liveness.interval)  # no beats for two timeouts
        self.assertEqual(self.status(), settled)
        spent = cs.store_requests - before
        self.assertEqual((spent["get"], spent["delete_key"]), (1, 1), spent)
        self.assertIsNone(self.reader.read_if_set(cs.wake_key(0)))

    def test_a_long_session_reads_its_wake_key(self):
        self.start_listening(timedelta(seconds=4))  # a beat every 0.5 s
        with self.liveness.session("s", None):
            opened = time.monotonic()
            self.wait_for(lambda: self.status().activity == "session")
            self.reader.set(cs.wake_key(0), cs.wake_value())
            time.sleep(2 * self.liveness.interval)
            if time.monotonic() - opened < 1.5:  # under half a timeout
                self.assertIsNotNone(self.reader.read_if_set(cs.wake_key(0)))
            self.wait_for(lambda: self.reader.read_if_set(cs.wake_key(0)) is None)
            self.assertGreater(time.monotonic() - opened, 2.0)
            self.assertGreater(self.liveness._awake_until, time.monotonic())

    def test_a_value_no_waker_writes_ends_the_waits_in_the_store(self):
        # The "fake" backend's store answers every wait at once, with an empty
        # value: the thread neither dies of it (a JSON error) nor spins.
        self.start_listening()
        failures = []
        self.addCleanup(setattr, threading, "excepthook", threading.excepthook)
        threading.excepthook = failures.append
        self.reader.set(cs.wake_key(0), "")
        self.wait_for(lambda: self.reader.read_if_set(cs.wake_key(0)) is None)
        waits = cs.store_requests["wait"]
        self.compiling = True  # now probed once per beat interval
        self.wait_for(lambda: self.status().activity == "compiling")
        self.assertEqual(cs.store_requests["wait"], waits)
        self.assertEqual(len(liveness_threads()), 1)
        self.assertEqual(failures, [])
        self.assertEqual(cs.wake_verdict(cs.wake_value("lost")), "lost")
        self.assertIsNone(cs.wake_verdict("not json"))

    def test_shutdown_joins_the_threads(self):
        self.start_listening()
        before = cs.store_requests.copy()
        self.liveness.shutdown()
        self.assertEqual(liveness_threads(), [])
        self.assertEqual(
            dict(cs.store_requests - before), {"set": 1, "get": 1, "delete_key": 1}
        )
        self.assertIsNone(self.reader.read_if_set(cs.wake_key(0)))
        self.liveness.shutdown()


class TestCompilingProbe(TestCase):
    """The default probe: a Dynamo compile on another thread of the process."""

    def test_a_compile_is_seen_from_another_thread(self):
        liveness = lv.Liveness(lambda: self.fail("no store"), lambda: 0, listen=False)
        seen: list[bool] = []

        def probe_from_another_thread() -> None:
            # As the liveness thread probes: not the compiling thread.
            probe = threading.Thread(target=lambda: seen.append(liveness._compiling()))
            probe.start()
            probe.join()

        def backend(gm, example_inputs):
            probe_from_another_thread()
            return gm.forward

        torch._dynamo.reset()
        probe_from_another_thread()
        torch.compile(lambda x: x + 1, backend=backend)(torch.ones(2))
        probe_from_another_thread()
        self.assertEqual(seen, [False, True, False])


class TestPendingCollective(TestCase):
    """The collective a thread waits in, from c10d's FlightRecorder."""

    def test_names_the_collective_a_thread_waits_in(self):
        # Two gloo ranks in one process: rank 0's all_reduce waits on a thread
        # of its own until rank 1 issues its part.
        directory = tempfile.TemporaryDirectory()
        self.addCleanup(directory.cleanup)
        store = dist.FileStore(os.path.join(directory.name, "store"), 2)
        ranks: list = [None, None]

        def make(rank: int) -> None:
            ranks[rank] = dist.ProcessGroupGloo(store, rank, 2, timedelta(seconds=30))

        makers = [threading.Thread(target=make, args=(rank,)) for rank in (0, 1)]
        for maker in makers:
            maker.start()
        for maker in makers:
            maker.join()
        waiter = threading.Thread(
            target=lambda: ranks[0].allreduce([torch.ones(4)]).wait()
        )
        started = time.monotonic()
        waiter.start()
        try:
            # Polled, not slept on: on a loaded machine the thread issues its
            # call late, and the recorder retires it a moment after the wait.
            call, blocked_for = self.poll(
                lambda: bt.pending_collective(waiter.ident), lambda read: read[0] != ""
            )
            self.assertTrue(call.startswith("gloo:all_reduce on process group"), call)
            self.assertGreater(blocked_for, 0.0)
            self.assertLess(blocked_for, time.monotonic() - started + 0.1)
            self.assertEqual(bt.pending_collective(threading.get_ident()), ("", 0.0))
        finally:
            # Rank 1's part, also when a check failed: the waiter must not
            # time out in a later test.
            ranks[1].allreduce([torch.ones(4)]).wait()
            waiter.join()
        self.poll(
            lambda: bt.pending_collective(waiter.ident),
            lambda read: read == ("", 0.0),
        )

    def poll(self, read, done):
        deadline = time.monotonic() + 20
        while not done(value := read()):
            self.assertLess(time.monotonic(), deadline, f"still {value!r}")
            time.sleep(0.02)
        return value

    def test_takes_the_newest_live_entry_of_the_thread(self):
        now_ns = time.time_ns()

        def entry(name, ago_s, thread=7, retired=False, timeout_ms=60_000):
            return {
                "profiling_name": name,
                "process_group": ["3", "tp"],
                "thread_id": str(thread),
                "retired": retired,
                "time_created_ns": now_ns - int(ago_s * 1e9),
                "timeout_ms": timeout_ms,
            }

        entries = [
            entry("gloo:broadcast", 50),
            entry("gloo:all_reduce", 40),
            entry("gloo:all_gather", 5, retired=True),
            entry("gloo:barrier", 4, thread=8),
            entry("gloo:send", 3, timeout_ms=2_000),  # past its own timeout
        ]
        dump = json.dumps({"entries": entries}).encode()
        with mock.patch.object(bt, "_dump_fr_trace_json", return_value=dump):
            call, blocked_for = bt.pending_collective(7)
            self.assertEqual(call, "gloo:all_reduce on process group '3' (tp)")
            self.assertAlmostEqual(blocked_for, 40, delta=5)
            self.assertEqual(bt.pending_collective(9), ("", 0.0))
        with mock.patch.object(bt, "_dump_fr_trace_json", side_effect=RuntimeError):
            self.assertEqual(bt.pending_collective(7), ("", 0.0))


if __name__ == "__main__":
    run_tests()
