"""Collective custom ops in real programs: dynamic shapes, range dispatch, any signature.

At 2 ranks on V1 (tuned while lowering) and 3 ranks on V2 (the default: in
the scheduler), an even and an odd world size (4 ranks are run by the per-op
and straggler tests), one class of rank processes
(``RankProcessesTestCase``: one set of processes for the class) compiles
programs around an all_reduce custom op with autotuned implementations:

* dynamic shapes: ``torch.compile(dynamic=True)``, ``mark_dynamic`` and
  automatic dynamic (a second size recompiles with a symbolic dimension);
  under V2 the deferred node must keep the graph's symbolic sizes;
* range dispatch (``dispatch_on`` + ``split_points``), two ranges with
  different winners, tuned in one session under V2;
* candidates made only of collectives outside upstream's list of twelve
  (the coalesced variants), timed so that each rank alone would pick
  another winner: tuned in lock-step, one winner everywhere;
* ``config_generator``, ``input_gen_fns``, ``include_fallback=False`` (and
  every candidate failing with it: an error on every rank, never a failed
  candidate inlined) and ``min_speedup_threshold``;
* an op with a scalar between its tensors, ``all_reduce_scaled(x, scale, bias)``;
* ranks whose size hints differ, which must fail together at the join
  instead of benchmarking collectives of different sizes.

Each test asserts which implementation ran after compilation (the expected
winner, made known by slowing the others through ``test_collective_autotuning_ranks``'s
``probe``), that every rank ran the same one, and the exact result, at three
sizes or more: the one compiled for and others, in each range for the range
test.  One compiled program serves every size of a test, except where a
recompile is the point.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch._inductor import config
from torch.testing._internal.distributed.collective_autotuning_utils import (
    RankProcessesTestCase,
)

from test_collective_autotuning_ranks import (
    _group,
    _group_name,
    _wait,
    DELAY_MS,
    Fault,
    FAULTS,
    probe,
    RAN,
    SLOW_MS,
    tuning_config,
)
from torch._dynamo.utils import counters
from torch._inductor.kernel.custom_op import (
    CustomOpConfig,
    register_custom_op_autotuning,
)
from torch._inductor.runtime.collective_benchmarking.types import (
    CollectiveBenchmarkError,
)
from torch.testing._internal.common_utils import run_tests


if TYPE_CHECKING:
    from collections.abc import Callable

funcol = torch.ops._c10d_functional

COLS = 8
# rows -> {implementation: delay in ms}: slows an implementation when it
# runs on inputs of that many rows (what a range is benchmarked at).
DELAY_BY_ROWS: dict[int, dict[str, float]] = {}


@torch.library.custom_op("collective_programs_test::probe_rows", mutates_args=())
def probe_rows(x: torch.Tensor, impl: str) -> torch.Tensor:
    """``probe`` (records ``impl`` in RAN, applies DELAY_MS), slowed per row count too."""
    delay = DELAY_BY_ROWS.get(x.shape[0], {}).get(impl, 0.0)
    if delay:
        time.sleep(delay / 1e3)
    return probe(x, impl)


@probe_rows.register_fake
def _(x: torch.Tensor, impl: str) -> torch.Tensor:
    return torch.empty_like(x)


# --- all_reduce(x, chunks) ----------------------------------------------------------
# ``chunks`` is a tuning knob of one implementation, which the op ignores.
@torch.library.custom_op("collective_programs_test::all_reduce", mutates_args=())
def all_reduce(x: torch.Tensor, chunks: int = 1) -> torch.Tensor:
    out = probe_rows(x, "default")
    dist.all_reduce(out, group=_group())
    return out


@all_reduce.register_fake
def _(x: torch.Tensor, chunks: int = 1) -> torch.Tensor:
    return torch.empty_like(x)


def all_reduce_direct(x, chunks=1):
    return _wait(funcol.all_reduce(probe_rows(x, "direct"), "sum", _group_name()))


def all_reduce_negated(x, chunks=1):
    # -sum(-x): exact, and free of guards on any symbolic dimension.
    y = probe_rows(x, "negated")
    return -_wait(funcol.all_reduce(-y, "sum", _group_name()))


def all_reduce_gather_sum(x, chunks=1):
    # Resolves its group in Python, as the library's implementations do: a
    # call that make_fx traces but Dynamo (torch.cond's branches) cannot.
    y = probe_rows(x, "gather_sum")
    world = _group().size()
    gathered = _wait(funcol.all_gather_into_tensor(y, world, _group_name()))
    return gathered.view(world, *y.shape).sum(0)


def all_reduce_abs(x, chunks=1):
    # Right on nonnegative inputs only: screened out unless the benchmark
    # inputs are made nonnegative (input_gen_fns).
    y = probe_rows(x, "abs")
    return _wait(funcol.all_reduce(y.abs(), "sum", _group_name()))


def all_reduce_chunked(x, chunks=1):
    # One all_reduce per group of columns (a static dimension in these tests).
    y = probe_rows(x, f"chunks{chunks}")
    parts = [
        _wait(funcol.all_reduce(part.contiguous(), "sum", _group_name()))
        for part in y.chunk(chunks, dim=1)
    ]
    return torch.cat(parts, dim=1)


# Collectives outside upstream's list of twelve (``is_collective_op``) only.
# The probe runs after the collective: its delay on one rank does not hold
# the others inside the collective, so each rank times a different winner.
def all_reduce_coalesced(x, chunks=1):
    (reduced,) = funcol.all_reduce_coalesced([x], "sum", _group_name())
    return probe_rows(_wait(reduced), "coalesced")


def all_reduce_gather_coalesced(x, chunks=1):
    world = dist.get_world_size()
    (gathered,) = funcol.all_gather_into_tensor_coalesced([x], world, _group_name())
    return probe_rows(_wait(gathered).view(world, *x.shape).sum(0), "gather_coalesced")


# --- a scalar between tensors: all_reduce(x) * scale + bias --------------------------
@torch.library.custom_op("collective_programs_test::all_reduce_scaled", mutates_args=())
def all_reduce_scaled(
    x: torch.Tensor, scale: float, bias: torch.Tensor
) -> torch.Tensor:
    out = probe_rows(x, "default")
    dist.all_reduce(out, group=_group())
    return out * scale + bias


@all_reduce_scaled.register_fake
def _(x: torch.Tensor, scale: float, bias: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def all_reduce_scaled_direct(x, scale, bias):
    return all_reduce_direct(x) * scale + bias


def all_reduce_scaled_negated(x, scale, bias):
    return all_reduce_negated(x) * scale + bias


def _input(rank: int, rows: int) -> torch.Tensor:
    # Integers in float32: every summation order is exact.
    values = torch.arange(rows * COLS, dtype=torch.float32) + 1000 * rank
    return values.view(rows, COLS)


@config.patch(collective_benchmark_strict=True)
class CollectiveProgramsTestBase(RankProcessesTestCase):
    # torch._inductor.config.defer_collective_autotuning: V2 (True) or V1.
    DEFER = True

    def reset_rank(self) -> None:
        super().reset_rank()
        RAN.clear()
        DELAY_MS.clear()
        DELAY_BY_ROWS.clear()
        FAULTS.clear()

    # --- helpers ---------------------------------------------------------------------
    def _slow_all_but(self, winner: str, names: list[str]) -> None:
        DELAY_MS.update({name: SLOW_MS for name in names if name != winner})

    def _sum_of_inputs(self, rows: int) -> torch.Tensor:
        return torch.stack([_input(r, rows) for r in range(self.world_size)]).sum(0)

    def _assert_ran_everywhere(self, winner: str, what: str) -> None:
        """This call ran ``winner`` alone, and so did every rank's."""
        ran_here = list(RAN)
        ran_everywhere: list = [None] * self.world_size
        dist.all_gather_object(ran_everywhere, ran_here)
        self.assertEqual(ran_here, [winner], f"rank {self.rank}, {what}")
        self.assertEqual(ran_everywhere, [[winner]] * self.world_size, what)

    def _check_sizes(
        self,
        compiled: Callable[..., torch.Tensor],
        winners: dict[int, str],
        args: Callable[[int], tuple[torch.Tensor, ...]],
        expected: Callable[[int], torch.Tensor],
    ) -> None:
        """Call ``compiled`` at each size (rows): the winner ran alone on every rank, exactly."""
        for rows, winner in winners.items():
            RAN.clear()
            result = compiled(*args(rows))
            self._assert_ran_everywhere(winner, f"{rows} rows")
            torch.testing.assert_close(
                result, expected(rows), rtol=0, atol=0, msg=f"{rows} rows"
            )

    def _plus_one(self, rows: int) -> torch.Tensor:
        return self._sum_of_inputs(rows) + 1

    def _compile_all_reduce_plus_one(
        self, first_rows: int, mark_dynamic: bool = True, **compile_kwargs
    ) -> Callable[..., torch.Tensor]:
        """``all_reduce(x) + 1`` compiled (and tuned) by a first call at ``first_rows``."""
        compiled = torch.compile(lambda x: all_reduce(x) + 1, **compile_kwargs)
        x = _input(self.rank, first_rows)
        if mark_dynamic:
            torch._dynamo.mark_dynamic(x, 0)
        torch.testing.assert_close(
            compiled(x), self._plus_one(first_rows), rtol=0, atol=0
        )
        return compiled

    def _register(self, *decompositions, **kwargs) -> None:
        register_custom_op_autotuning(
            all_reduce,
            configs=[CustomOpConfig(fn) for fn in decompositions],
            **kwargs,
        )

    # --- dynamic shapes --------------------------------------------------------------
    def test_dynamic_true(self):
        self._register(all_reduce_direct, all_reduce_negated)
        self._slow_all_but("negated", ["default", "direct", "negated"])
        with tuning_config(self.DEFER):
            compiled = self._compile_all_reduce_plus_one(
                16, mark_dynamic=False, dynamic=True
            )
            DELAY_MS.clear()
            self._check_sizes(
                compiled,
                {16: "negated", 40: "negated", 7: "negated"},
                lambda rows: (_input(self.rank, rows),),
                self._plus_one,
            )
        # One program and one agreed decision for every size.
        self.assertEqual(counters["stats"]["unique_graphs"], 1)
        self.assertEqual(counters["collective_autotuning"]["presync"], 1)

    def test_automatic_dynamic(self):
        self._register(all_reduce_direct, all_reduce_negated)
        self._slow_all_but("direct", ["default", "direct", "negated"])
        with tuning_config(self.DEFER):
            # The first size compiles a static program, the second recompiles
            # with a symbolic dimension: both are tuned, by every rank.
            compiled = self._compile_all_reduce_plus_one(16, mark_dynamic=False)
            compiled(_input(self.rank, 24))
            DELAY_MS.clear()
            self._check_sizes(
                compiled,
                {24: "direct", 40: "direct", 5: "direct", 16: "direct"},
                lambda rows: (_input(self.rank, rows),),
                self._plus_one,
            )
        self.assertEqual(counters["stats"]["unique_graphs"], 2)
        self.assertEqual(counters["collective_autotuning"]["presync"], 2)

    def test_mark_dynamic_with_a_scalar_between_tensors(self):
        register_custom_op_autotuning(
            all_reduce_scaled,
            configs=[
                CustomOpConfig(all_reduce_scaled_direct),
                CustomOpConfig(all_reduce_scaled_negated),
            ],
        )
        self._slow_all_but("negated", ["default", "direct", "negated"])

        def args(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
            # A bias per column: only the rows are dynamic.
            return _input(self.rank, rows), torch.full((COLS,), 0.25)

        def expected(rows: int) -> torch.Tensor:
            return self._sum_of_inputs(rows) * 0.5 + 0.25

        with tuning_config(self.DEFER):
            compiled = torch.compile(lambda x, b: all_reduce_scaled(x, 0.5, b))
            x, bias = args(12)
            torch._dynamo.mark_dynamic(x, 0)
            compiled(x, bias)
            DELAY_MS.clear()
            self._check_sizes(
                compiled, {12: "negated", 30: "negated", 3: "negated"}, args, expected
            )
        self.assertEqual(counters["stats"]["unique_graphs"], 1)

    def test_ranks_with_different_size_hints_fail_together(self):
        # Each rank compiles for a size of its own: they would benchmark
        # collectives of different sizes.  Every rank fails at the join.
        self._register(all_reduce_direct, all_reduce_negated)
        failed = ""
        with tuning_config(self.DEFER):
            try:
                torch.compile(lambda x: all_reduce(x) + 1, dynamic=True)(
                    _input(self.rank, 8 + 4 * self.rank)
                )
            except Exception as error:  # wrapped by Dynamo's compiler errors
                failed = str(error)
        self.assertIn(CollectiveBenchmarkError.__name__, failed)
        self.assertIn("not tuning the same op", failed)
        failures: list = [None] * self.world_size
        dist.all_gather_object(failures, bool(failed))
        self.assertEqual(failures, [True] * self.world_size)
        self.assertEqual(RAN, [])  # nothing was benchmarked

    # --- range dispatch --------------------------------------------------------------
    def test_range_dispatch(self):
        self._register(
            all_reduce_direct,
            all_reduce_gather_sum,
            dispatch_on={"tensor_name": "x", "dim": 0, "range_upper_bound": 64},
            split_points=[16],
        )
        # [1, 16] is benchmarked at 16 rows, [17, inf) at 64: "direct" is
        # made the faster at 16 rows, "gather_sum" at 64.
        DELAY_MS["default"] = SLOW_MS
        DELAY_BY_ROWS.update({16: {"gather_sum": SLOW_MS}, 64: {"direct": SLOW_MS}})
        with tuning_config(self.DEFER):
            compiled = self._compile_all_reduce_plus_one(8)
            DELAY_MS.clear()
            DELAY_BY_ROWS.clear()
            self._check_sizes(
                compiled,
                {
                    4: "direct",
                    16: "direct",
                    17: "gather_sum",
                    40: "gather_sum",
                    100: "gather_sum",
                },
                lambda rows: (_input(self.rank, rows),),
                self._plus_one,
            )
        # Both ranges tuned once (no recompile), under V2 in the graph's one
        # session.  (unique_graphs would count the graphs Dynamo traces for
        # torch.cond's branches.)
        sessions = counters["collective_autotuning"]
        self.assertEqual(sessions["ops"], 2)
        self.assertEqual(sessions["presync"], 1 if self.DEFER else 2)

    # --- register_custom_op_autotuning's other parameters ----------------------------
    def test_config_generator(self):
        seen = []

        def generate(fake_tensors):
            x = fake_tensors["x"]
            seen.append((sorted(fake_tensors), x.shape[1]))
            return [
                CustomOpConfig(all_reduce_chunked, chunks=c)
                for c in (1, x.shape[1] // 4)
            ]

        register_custom_op_autotuning(all_reduce, config_generator=generate)
        self._slow_all_but("chunks2", ["default", "chunks1", "chunks2"])
        with tuning_config(self.DEFER):
            compiled = self._compile_all_reduce_plus_one(12)
            DELAY_MS.clear()
            self._check_sizes(
                compiled,
                {12: "chunks2", 20: "chunks2", 2: "chunks2"},
                lambda rows: (_input(self.rank, rows),),
                self._plus_one,
            )
        self.assertEqual(seen, [(["x"], COLS)])

    def test_input_gen_fns(self):
        generated = []

        def nonnegative(fake):
            generated.append(tuple(fake.shape))
            return torch.rand(fake.shape, dtype=fake.dtype)

        # "abs" is right on nonnegative inputs only: it passes the screening,
        # and wins, only if it was benchmarked on the generated inputs.
        self._register(
            all_reduce_direct, all_reduce_abs, input_gen_fns={"x": nonnegative}
        )
        self._slow_all_but("abs", ["default", "direct", "abs"])
        with tuning_config(self.DEFER):
            compiled = self._compile_all_reduce_plus_one(24)
            DELAY_MS.clear()
            self._check_sizes(
                compiled,
                {24: "abs", 36: "abs", 6: "abs"},
                lambda rows: (_input(self.rank, rows),),
                self._plus_one,
            )
        self.assertIn((24, COLS), generated)  # at the size hint

    def test_include_fallback_false(self):
        self._register(all_reduce_direct, all_reduce_negated, include_fallback=False)
        self._slow_all_but("negated", ["direct", "negated"])
        with tuning_config(self.DEFER):
            compiled = self._compile_all_reduce_plus_one(10)
            self.assertNotIn("default", RAN)  # not even benchmarked
            DELAY_MS.clear()
            self._check_sizes(
                compiled,
                {10: "negated", 33: "negated", 4: "negated"},
                lambda rows: (_input(self.rank, rows),),
                self._plus_one,
            )

    # --- which ops are tuned in lock-step -------------------------------------------
    def test_collectives_outside_upstreams_list_are_tuned_in_lock_step(self):
        # Alone, rank 0 would pick "gather_coalesced" and rank 1 "coalesced"
        # (and their programs would issue mismatched collectives).  The
        # group's time of a candidate is its slowest rank's: "coalesced" wins.
        self._register(all_reduce_coalesced, all_reduce_gather_coalesced)
        DELAY_MS["default"] = 2 * SLOW_MS
        slowed_here = {0: ("coalesced", SLOW_MS / 2), 1: ("gather_coalesced", SLOW_MS)}
        if self.rank in slowed_here:
            name, delay = slowed_here[self.rank]
            DELAY_MS[name] = delay
        counters.clear()
        with tuning_config(self.DEFER):
            compiled = self._compile_all_reduce_plus_one(10, mark_dynamic=False)
            self.assertGreater(counters["collective_autotuning"]["ops"], 0)
            DELAY_MS.clear()
            self._check_sizes(
                compiled,
                {10: "coalesced"},
                lambda rows: (_input(self.rank, rows),),
                self._plus_one,
            )

    def test_include_fallback_false_when_every_candidate_fails(self):
        # Every candidate fails on rank 0 and there is no default to run in
        # their place: every rank raises; none runs a candidate that failed.
        self._register(all_reduce_direct, all_reduce_negated, include_fallback=False)
        FAULTS.update(
            {name: Fault("raise", [0], call=1) for name in ("direct", "negated")}
        )
        with tuning_config(self.DEFER, collective_benchmark_strict=False):
            with self.assertRaisesRegex(Exception, "nothing can run"):
                self._compile_all_reduce_plus_one(10, mark_dynamic=False)
        self.assertNotIn("default", RAN)

    def test_min_speedup_threshold(self):
        # "direct" is faster, but not 1000 times faster: the default stays.
        self._register(all_reduce_direct, min_speedup_threshold=1000.0)
        DELAY_MS["default"] = SLOW_MS / 2
        with tuning_config(self.DEFER):
            compiled = self._compile_all_reduce_plus_one(10)
            self.assertIn("direct", RAN)  # it competed
            DELAY_MS.clear()
            self._check_sizes(
                compiled,
                {10: "default", 21: "default", 3: "default"},
                lambda rows: (_input(self.rank, rows),),
                self._plus_one,
            )


# TestCollectivePrograms2RanksV1 and TestCollectivePrograms3RanksV2: each
# tuning path (V1: while lowering, V2: in the scheduler, the default), and an
# even and an odd world size.  A program's features depend on neither pairing:
# the other two classes would add some three minutes on CI's 2 cores.
for _world_size, _path, _defer in ((2, "V1", False), (3, "V2", True)):
    _name = f"TestCollectivePrograms{_world_size}Ranks{_path}"
    globals()[_name] = type(
        _name,
        (CollectiveProgramsTestBase,),
        {"WORLD_SIZE": _world_size, "DEFER": _defer, "__module__": __name__},
    )

del CollectiveProgramsTestBase  # a base, not a test class of its own

if __name__ == "__main__":
    run_tests()
