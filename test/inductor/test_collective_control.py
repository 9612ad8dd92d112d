"""What collective autotuning asks of the job's store, on CPU/gloo, through a TCPStore.

One TCPStore serves every rank of a torchrun job.  The protocol coordinates
on its benchmark channel, a c10d group, and asks the store for nothing of
its own while sessions succeed: only c10d does, to build a channel.  These
tests count every request that reaches the job's store, c10d's included
(each rank's process group stands on a store that counts its requests), at
2 and 3 ranks, one set of rank processes per class:

* Nothing outside sessions and compiles: once a program with an autotuned
  collective op is compiled (one session), running it 20 times makes no
  store request from any rank.
* A session on a built channel asks nothing, and sessions leave no keys:
  after 4 sessions (4 compiles, each benchmarking) no rank made a request
  in the last 3, and no key under ``collective_autotuning`` exists.
* A benchmark channel dropped while a collective of this rank is pending on
  it (its wait timed out) is destroyed without hanging, and the next one
  works (the store rendezvous that builds it included); at 2 ranks.

Every test also asserts the winner, that every rank ran it, and the exact
result of the compiled program.
"""

from __future__ import annotations

import collections
import time
import unittest
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._inductor.kernel.custom_op import (
    CustomOpConfig,
    register_custom_op_autotuning,
)
from torch._inductor.runtime.collective_benchmarking import channels, types
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed.counting_store import CountingStore
from torch.testing._internal.distributed.collective_autotuning_utils import (
    tcp_store_through,
    use_rank_cache_dir,
)

from test_collective_autotuning_ranks import (
    all_reduce_direct,
    all_reduce_op,
    all_reduce_rs_ag,
    COLS,
    DELAY_MS,
    RAN,
    ROWS,
    SLOW_MS,
    StrictRankProcessesTestCase,
    tuning_config,
)


TIMEOUT_S = 2.0


# This rank's store (set in its process by _init_pg).
STORE: CountingStore | None = None


class ControlPlaneTests:
    WORLD_SIZE = 2

    @classmethod
    def _init_pg(cls, rank, world_size, rdvz_file):
        global STORE
        STORE = CountingStore(tcp_store_through(rdvz_file, rank, world_size))
        dist.init_process_group(
            "gloo", store=STORE, rank=rank, world_size=world_size, timeout=cls.timeout
        )
        use_rank_cache_dir(rank)

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
        with tuning_config(True, collective_benchmark_timeout=TIMEOUT_S):
            compiled, x = self._compile_and_check(2.0)
            before = STORE.requests.total()
            for _ in range(20):
                compiled(x)
            time.sleep(2 * TIMEOUT_S)
            after = STORE.requests.total()
        self.assertEqual(after - before, 0, dict(STORE.requests))

    def test_sessions_on_a_built_channel_ask_nothing_and_leave_no_keys(self):
        from torch._inductor.runtime.collective_benchmarking import decision_cache

        spent = []
        with tuning_config(True, collective_benchmark_timeout=TIMEOUT_S):
            for scale in (1.0, 2.0, 3.0, 4.0):
                torch._dynamo.reset()
                decision_cache._remembered.clear()
                before = collections.Counter(STORE.requests)
                self._compile_and_check(scale)
                spent.append(dict(STORE.requests - before))
        # The first may build the channel (c10d's rendezvous); the rest reuse it.
        self.assertEqual(spent[1:], [{}] * 3, spent)
        dist.barrier()
        keys = [
            key for key in STORE.inner.list_keys() if "collective_autotuning" in key
        ]
        self.assertEqual(keys, [])

    def test_channel_dropped_while_its_collective_is_pending(self):
        # The last rank never joins an exchange on the benchmark channel: its
        # peers' waits time out with their gloo work still pending, and they
        # drop the channel.  ~ProcessGroupGloo joins the worker running that
        # work, which may need the GIL to free the work's tensors: dropping
        # must not hold the GIL meanwhile (docs/upstream/gloo-status-string-race.md).
        # Then every member builds a new channel, which works.
        if self.world_size != 2:
            raise unittest.SkipTest("one late rank is enough; keeps CI short")
        config = types.CollectiveBenchmarkConfig(timeout=timedelta(seconds=TIMEOUT_S))
        channel = channels.BenchmarkChannel(
            dist.group.WORLD, torch.device("cpu"), config
        )
        channel.start_session()
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
        (ControlPlaneTests, StrictRankProcessesTestCase),
        {"WORLD_SIZE": _world_size, "__module__": __name__},
    )


if __name__ == "__main__":
    run_tests()
