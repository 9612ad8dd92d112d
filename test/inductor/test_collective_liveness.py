"""Stragglers waited for, wedged ranks named, per world size, on CPU/gloo.

What this checks, at 2 and 4 ranks (3 ranks behave as 4 do: one watched
member per watcher; dropped to keep CI short; the stragglers at 4 ranks
only, where a watcher's successor is not also its predecessor), with ``collective_benchmark_timeout``
at ``TIMEOUT_S`` and the default path (V2; the protocol under test is the
same under V1, see ``test_collective_autotuning.py``):

* Stragglers are waited for.  One op with two faulty candidates and a
  healthy one: one stalls (a Python sleep: the rank is alive and its
  heartbeat goes on) for 3x the timeout on the last rank, the other for 10x
  the timeout on rank 0, both in their timed runs, and both would be the
  fastest otherwise.  The job goes on: the healthy candidate wins on every
  rank, every rank ran it after compiling, the result is exact.  Without the
  heartbeat the first stall alone made every rank raise.
* A wedged rank is named.  The last rank blocks for 6x the timeout in a C
  call that holds the GIL (its heartbeat thread cannot run): every healthy
  rank raises ``CollectiveBenchmarkError`` naming it as silent, within 4x
  the timeout of the wedging candidate's start, long before the wedge
  ends; the wedged rank, once back, finds its peers' verdict and raises too.
* A stuck rank is named.  The last rank blocks, inside a candidate's timed
  run, in an all_reduce on the user's WORLD group object that no peer issues
  (alive, its heartbeat going, but blocked in a collective its peers have
  left, which dropping the benchmark channel cannot fail): every healthy
  rank raises ``CollectiveBenchmarkError`` naming it and the collective it is
  blocked in (its op and group, from c10d's FlightRecorder), within the
  timeout plus 15 s of the call that got stuck, not after
  ``collective_benchmark_max_wait`` (20x the timeout).  The healthy ranks then join the
  stuck collective, and the stuck rank, released, raises the same verdict.

The killed-rank test stays in ``test_collective_autotuning.py``.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch._inductor.kernel.custom_op import (
    CustomOpConfig,
    register_custom_op_autotuning,
)
from torch.testing._internal.common_utils import run_tests

from rank_processes import RankProcessesTestCase
from test_collective_autotuning import (
    CALLED_AT,
    DELAY_MS,
    FAULTS,
    Fault,
    HANG_BOUND_S,
    NRUNS,
    NWARMUP,
    RAN,
    ROWS,
    COLS,
    SLOW_DEFAULT_MS,
    SLOW_MS,
    _expected,
    all_reduce_candidate,
    all_reduce_op,
    clear_probes,
    tuning_config,
)

TIMEOUT_S = 3.0


class LivenessTests:
    WORLD_SIZE = 2
    rank: int
    world_size: int

    def reset_rank(self) -> None:
        super().reset_rank()  # type: ignore[misc]
        clear_probes()

    def _input(self) -> torch.Tensor:
        return (torch.arange(ROWS * COLS, dtype=torch.float32) + 1000 * self.rank).view(
            ROWS, COLS
        )

    def _compile(self, names: list[str]):
        register_custom_op_autotuning(
            all_reduce_op,
            configs=[CustomOpConfig(all_reduce_candidate(name)) for name in names],
        )
        return torch.compile(lambda x: all_reduce_op(x) + 1)

    def test_wedged_rank_is_named_within_the_timeout(self):
        last = self.world_size - 1
        FAULTS.clear()
        FAULTS["wedges"] = Fault(
            "wedge", [last], call=NWARMUP + 2, seconds=6 * TIMEOUT_S
        )
        DELAY_MS.clear()
        CALLED_AT.clear()
        with tuning_config(True, collective_benchmark_timeout=TIMEOUT_S):
            compiled = self._compile(["wedges", "good"])
            # Inductor wraps the error (InductorError); its message is the benchmarker's.
            # The first healthy rank to give up names the wedged one; the others,
            # and the wedged one once back, raise its verdict.
            pattern = rf"ranks \[{last}\] of group .* no heartbeat from them for"
            if self.rank == last:
                pattern += ".*the verdict of a peer that gave up waiting"
            with self.assertRaisesRegex(Exception, pattern):
                compiled(self._input())
            named_after = time.monotonic() - CALLED_AT[("wedges", NWARMUP + 2)]
        FAULTS.clear()
        if self.rank != last:
            # The wedge lasts 6 timeouts: naming the rank within 4 means its
            # silence was noticed (after one timeout, some beats and the
            # unwinding, slow on busy cores), not its return.
            self.assertLess(named_after, 4 * TIMEOUT_S)

    def test_stuck_rank_is_named_within_the_timeout(self):
        last = self.world_size - 1
        FAULTS.clear()
        FAULTS["gets_stuck"] = Fault("stuck", [last], call=NWARMUP + 2)
        DELAY_MS.clear()
        CALLED_AT.clear()
        # The collective as c10d's FlightRecorder recorded it: op and group.
        pattern = (
            rf"ranks \[{last}\] of group .* blocked in gloo:all_reduce "
            r"on process group '0' \(default_pg\)"
        )
        # The max wait is far beyond the bound: only the stuck rule names it in time.
        with tuning_config(
            True,
            collective_benchmark_timeout=TIMEOUT_S,
            collective_benchmark_max_wait=20 * TIMEOUT_S,
        ):
            compiled = self._compile(["gets_stuck", "good"])
            if self.rank == last:
                # Released by its peers below, it finds their verdict.
                with self.assertRaisesRegex(Exception, pattern):
                    compiled(self._input())
            else:
                with self.assertRaisesRegex(Exception, pattern):
                    compiled(self._input())
                named_after = time.monotonic() - CALLED_AT[("gets_stuck", NWARMUP + 2)]
                # Slack for busy cores, still far below the max wait.
                self.assertLess(named_after, TIMEOUT_S + 15)
                # Join the collective the stuck rank is blocked in.
                dist.all_reduce(torch.ones(1))
        FAULTS.clear()


class StragglerTests(LivenessTests):
    """At 4 ranks only: 2 ranks wait out the same stalls, some 50 s of CI."""

    def test_stragglers_are_waited_for(self):
        last = self.world_size - 1
        FAULTS.clear()
        FAULTS["stalls_3x"] = Fault(
            "stall", [last], call=NWARMUP + 2, seconds=3 * TIMEOUT_S
        )
        FAULTS["stalls_10x"] = Fault(
            "stall", [0], call=NWARMUP + 2, seconds=10 * TIMEOUT_S
        )
        DELAY_MS.clear()
        DELAY_MS.update({"default": SLOW_DEFAULT_MS, "good": SLOW_MS / 5})
        with tuning_config(True, collective_benchmark_timeout=TIMEOUT_S):
            compiled = self._compile(["stalls_3x", "stalls_10x", "good"])
            RAN.clear()
            start = time.monotonic()
            compiled(self._input())
            self.assertLess(time.monotonic() - start, HANG_BOUND_S)
            # Each stall restarts the op's interleaved timed runs without its candidate.
            self.assertGreaterEqual(RAN.count("good"), NWARMUP + NRUNS + 1)
            FAULTS.clear()
            RAN.clear()
            result = compiled(self._input())
        ran_everywhere: list = [None] * self.world_size
        dist.all_gather_object(ran_everywhere, list(RAN))
        self.assertEqual(ran_everywhere, [["good"]] * self.world_size)
        inputs = [
            (torch.arange(ROWS * COLS, dtype=torch.float32) + 1000 * r).view(ROWS, COLS)
            for r in range(self.world_size)
        ]
        torch.testing.assert_close(
            result, _expected("all_reduce", inputs, self.rank) + 1, rtol=0, atol=0
        )


for _world_size in (2, 4):
    _name = f"CollectiveLiveness{_world_size}RanksTest"
    _tests = StragglerTests if _world_size == 4 else LivenessTests
    globals()[_name] = type(
        _name,
        (_tests, RankProcessesTestCase),
        {"WORLD_SIZE": _world_size, "__module__": __name__},
    )


if __name__ == "__main__":
    run_tests()
