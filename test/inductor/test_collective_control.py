"""What collective autotuning asks of the job's store, on CPU/gloo, through a TCPStore.

One TCPStore serves every rank of a torchrun job; these tests hold the control
plane (``collective_benchmarking/control.py``, ``collective_benchmarking/liveness.py`` and
``collective_benchmarking/store.py`` in ``torch/_inductor/runtime/``) to what it promises
it asks of it, per world size (2 and 3 ranks, one set of rank processes per
class):

* Nothing outside sessions and compiles: once a program with an autotuned
  collective op is compiled (one session), running it 20 times, and waiting
  for 4 beat intervals, makes no store request at all from any rank (the
  liveness thread beats only while a session is open or the process
  compiles, and otherwise holds one blocked wait for a wake).
* Waiting costs requests per beat, not per poll: with rank 0 three timeouts
  late, a session costs each rank at most ``MAIN_REQUEST_BOUND`` protocol
  requests (its waits block in the store), and its liveness thread at most a
  beat and a read per beat interval, and a wake per half timeout.
* Sessions leave no keys: after 4 sessions (4 compiles, each benchmarking),
  the keys under the control plane's prefix are the one status key per
  rank, on every rank; decisions stay on disk.
* A benchmark channel dropped while a collective of this rank is pending on
  it (its wait timed out) is destroyed without hanging, and the next one
  works (the store rendezvous that builds it included); at 2 ranks.

Every test also asserts the winner, that every rank ran it, and the exact
result of the compiled program.
"""

from __future__ import annotations

import time
import unittest
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._inductor.kernel.custom_op import (
    CustomOpConfig,
    register_custom_op_autotuning,
)
from torch._inductor.runtime.collective_benchmarking import (
    beats as bt,
    liveness,
    store,
)
from torch.testing._internal.common_utils import run_tests

from rank_processes import RankProcessesTestCase
from test_collective_autotuning import (
    all_reduce_direct,
    all_reduce_op,
    all_reduce_rs_ag,
    COLS,
    DELAY_MS,
    RAN,
    ROWS,
    SLOW_MS,
    tuning_config,
)


TIMEOUT_S = 2.0
# A session's protocol requests, whatever the time spent waiting: the join
# (counts, wait, outcome, digest, claims), the commit count and leaving (the
# member that leaves last deletes the session's keys), and a channel built
# in the first session of the class.
MAIN_REQUEST_BOUND = 25


class ControlPlaneTests:
    WORLD_SIZE = 2

    def reset_rank(self) -> None:
        super().reset_rank()  # type: ignore[misc]
        RAN.clear()
        DELAY_MS.clear()
        DELAY_MS.update({"default": SLOW_MS, "direct": SLOW_MS})

    def _compile_and_check(self, scale: float):
        """Compile ``all_reduce(x) * scale`` (one session), check it, return it compiled."""
        register_custom_op_autotuning(
            all_reduce_op,
            configs=[
                CustomOpConfig(all_reduce_direct),
                CustomOpConfig(all_reduce_rs_ag),
            ],
        )
        compiled = torch.compile(lambda x: all_reduce_op(x) * scale)
        x = torch.full((ROWS, COLS), float(self.rank + 1))
        compiled(x)
        RAN.clear()
        result = compiled(x)
        ran: list = [None] * self.world_size
        dist.all_gather_object(ran, list(RAN))
        self.assertEqual(ran, [["rs_ag"]] * self.world_size)
        total = sum(range(1, self.world_size + 1))
        torch.testing.assert_close(
            result, torch.full((ROWS, COLS), total * scale), rtol=0, atol=0
        )
        return compiled, x

    def test_no_request_outside_sessions_and_compiles(self):
        interval = bt.beat_interval(timedelta(seconds=TIMEOUT_S))
        with tuning_config(True, collective_benchmark_timeout=TIMEOUT_S):
            compiled, x = self._compile_and_check(2.0)
            # A rank that a peer woke in the session (it joined late) beats
            # for two timeouts after the wake; then its liveness thread
            # writes "idle" once.
            time.sleep(2 * TIMEOUT_S + 2 * interval)
            before = store.store_requests.total()
            for _ in range(20):
                compiled(x)
            time.sleep(4 * interval)
            after = store.store_requests.total()
        self.assertEqual(after - before, 0, dict(store.store_requests))

    def test_waiting_costs_requests_per_beat_not_per_poll(self):
        # Rank 0 arrives three timeouts late: its peers wait for it in the
        # join, and wake it (it is idle: neither compiling nor in a session).
        liveness.ensure_heartbeat(timedelta(seconds=TIMEOUT_S))
        main = store.main_store_client()
        beats = liveness._liveness.client
        self.assertIsNotNone(beats)
        interval = bt.beat_interval(timedelta(seconds=TIMEOUT_S))
        with tuning_config(True, collective_benchmark_timeout=TIMEOUT_S):
            main_before, beats_before = main.requests.total(), beats.requests.total()
            started = time.monotonic()
            if self.rank == 0:
                time.sleep(3 * TIMEOUT_S)
            self._compile_and_check(3.0)
            seconds = time.monotonic() - started
            spent_main = main.requests.total() - main_before
            spent_beats = beats.requests.total() - beats_before
        # The protocol's own requests do not grow with the wait: no polling.
        self.assertLessEqual(spent_main, MAIN_REQUEST_BOUND, dict(main.requests))
        # The liveness thread: a beat and one read per interval, a wake per
        # half timeout, whatever the world size.
        self.assertLessEqual(
            spent_beats,
            2 * seconds / interval + seconds / (TIMEOUT_S / 2) + 10,
            dict(beats.requests),
        )

    def test_sessions_leave_no_keys(self):
        with tuning_config(True, collective_benchmark_timeout=TIMEOUT_S):
            for scale in (1.0, 2.0, 3.0, 4.0):
                torch._dynamo.reset()
                from torch._inductor.runtime.collective_benchmarking import (
                    decision_cache,
                )

                decision_cache._remembered.clear()
                self._compile_and_check(scale)
        dist.barrier()
        keys = [
            key
            for key in dist.distributed_c10d._get_default_store().list_keys()
            if store.STORE_PREFIX in key
        ]
        status = [key for key in keys if "/status/" in key]
        self.assertEqual(len(status), self.world_size, keys)
        self.assertEqual(sorted(set(keys) - set(status)), [])

    def test_channel_dropped_while_its_collective_is_pending(self):
        # The last rank never joins an exchange on the benchmark channel: its
        # peers' waits time out with their gloo work still pending, and they
        # drop the channel.  ~ProcessGroupGloo joins the worker running that
        # work, which may need the GIL to free the work's tensors: dropping
        # must not hold the GIL meanwhile (docs/upstream/gloo-status-string-race.md).
        # Then every member builds a new channel, which works.
        if self.world_size != 2:
            raise unittest.SkipTest("one late rank is enough; keeps CI short")
        from torch._inductor.runtime.collective_benchmarking.channels import (
            BenchmarkChannel,
        )

        channel = BenchmarkChannel(
            dist.group.WORLD, torch.device("cpu"), timedelta(seconds=TIMEOUT_S)
        )
        channel.get()
        started = time.monotonic()
        if self.rank == self.world_size - 1:
            time.sleep(2 * TIMEOUT_S)
        else:
            with self.assertRaises(Exception):
                channel.all_gather([float(self.rank)])
        channel.drop()
        self.assertLess(time.monotonic() - started, 60 * TIMEOUT_S)  # not a hang
        self.assertEqual(
            channel.all_gather([float(self.rank), 1.0]),
            [[float(rank), 1.0] for rank in range(self.world_size)],
        )


for _world_size in (2, 3):
    _name = f"CollectiveControlPlane{_world_size}RanksTest"
    globals()[_name] = type(
        _name,
        (ControlPlaneTests, RankProcessesTestCase),
        {"WORLD_SIZE": _world_size, "__module__": __name__},
    )


if __name__ == "__main__":
    run_tests()
