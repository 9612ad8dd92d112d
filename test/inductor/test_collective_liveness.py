"""Stragglers waited for, wedged ranks named, on CPU/gloo.

What this checks, at 2 and 4 ranks (the stragglers at 4 ranks only), on
the default path (V1; the protocol under test is the same under V2, see
``test_collective_autotuning_ranks.py``).  A rank that does not come to a step
that needs every member is waited for up to ``collective_benchmark_max_wait``
(it may be a straggler), then named:

* Stragglers are waited for.  One op with two faulty candidates and a
  healthy one: one stalls (a Python sleep) for 3x the timeout on the last
  rank, the other for 10x the timeout on rank 0, both at their
  ``NWARMUP + 2``-th run, and both would be the fastest otherwise.  The
  job goes on: the healthy candidate wins on every rank, every rank ran it
  after compiling, the result is exact.
* A wedged rank is named.  At a 2 s timeout and a max wait of
  ``MAX_WAIT_S``, the last rank blocks for ``WEDGE_S`` in a C call that
  holds the GIL: every healthy rank raises ``CollectiveBenchmarkError``
  naming it within the stated bound, 2 x timeout + max wait (plus
  ``BOUND_SLACK_S``), of the wedging candidate's start, long before the
  wedge ends; the wedged rank, once back, finds that its peers gave up on
  it and raises at once.

The killed-rank test stays in ``test_collective_autotuning_ranks.py``.
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

from test_collective_autotuning_ranks import (
    BOUND_SLACK_S,
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
    StrictRankProcessesTestCase,
    _expected,
    all_reduce_candidate,
    all_reduce_op,
    clear_probes,
    tuning_config,
)

TIMEOUT_S = 3.0
# The wedge: its timeout and max wait, and how long it lasts (past the time
# its peers need to name it: a timeout, the max wait, a timeout to check in).
WEDGE_TIMEOUT_S = 2.0
MAX_WAIT_S = 12.0
WEDGE_S = 30
# The stated bound on naming a rank wedged in a timed run (docs/design.md,
# "Bounds, and the trade"): the run's timeout, the failure agreement's max
# wait, the roll call's timeout.
WEDGE_NAMED_WITHIN_S = 2 * WEDGE_TIMEOUT_S + MAX_WAIT_S


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

    def test_wedged_rank_is_named_when_the_max_wait_runs_out(self):
        last = self.world_size - 1
        FAULTS.clear()
        FAULTS["wedges"] = Fault("wedge", [last], call=NWARMUP + 2, seconds=WEDGE_S)
        DELAY_MS.clear()
        CALLED_AT.clear()
        with tuning_config(
            False,
            collective_benchmark_timeout=WEDGE_TIMEOUT_S,
            collective_benchmark_max_wait=MAX_WAIT_S,
        ):
            compiled = self._compile(["wedges", "good"])
            # Inductor wraps the error (InductorError); its message is the
            # benchmarker's.
            if self.rank == last:
                pattern = r"gave up waiting for this rank at failure agreement"
            else:
                pattern = (
                    rf"ranks \[{last}\] of group .* did not reach failure agreement "
                    rf"within {MAX_WAIT_S:g}s"
                )
            with self.assertRaisesRegex(Exception, pattern):
                compiled(self._input())
            named_after = time.monotonic() - CALLED_AT[("wedges", NWARMUP + 2)]
        FAULTS.clear()
        if self.rank != last:
            # Named once the bounds ran out, long before the wedge ends.
            self.assertLess(
                named_after,
                WEDGE_NAMED_WITHIN_S + BOUND_SLACK_S,
                f"named after {named_after:.1f}s, bound {WEDGE_NAMED_WITHIN_S:g}s",
            )

    def _expected(self) -> torch.Tensor:
        inputs = [
            (torch.arange(ROWS * COLS, dtype=torch.float32) + 1000 * r).view(ROWS, COLS)
            for r in range(self.world_size)
        ]
        return _expected("all_reduce", inputs, self.rank)


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
        with tuning_config(False, collective_benchmark_timeout=TIMEOUT_S):
            compiled = self._compile(["stalls_3x", "stalls_10x", "good"])
            RAN.clear()
            start = time.monotonic()
            compiled(self._input())
            self.assertLess(time.monotonic() - start, HANG_BOUND_S)
            # Each stall runs the op again without its candidate.
            self.assertGreaterEqual(RAN.count("good"), NWARMUP + NRUNS + 1)
            FAULTS.clear()
            RAN.clear()
            result = compiled(self._input())
        ran_everywhere: list = [None] * self.world_size
        dist.all_gather_object(ran_everywhere, list(RAN))
        self.assertEqual(ran_everywhere, [["good"]] * self.world_size)
        torch.testing.assert_close(result, self._expected() + 1, rtol=0, atol=0)


for _world_size in (2, 4):
    _name = f"CollectiveLiveness{_world_size}RanksTest"
    _tests = StragglerTests if _world_size == 4 else LivenessTests
    globals()[_name] = type(
        _name,
        (_tests, StrictRankProcessesTestCase),
        {"WORLD_SIZE": _world_size, "__module__": __name__},
    )


if __name__ == "__main__":
    run_tests()
