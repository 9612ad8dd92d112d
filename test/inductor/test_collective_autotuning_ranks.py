"""Collective custom-op autotuning across ranks, on CPU/gloo (CI) and CUDA/NCCL.

What this checks, at 2 ranks per tuning path (V1: each op tuned while it is
lowered; V2, the default: the choice deferred to the scheduler, see
torch/_inductor/collective_autotuning/deferred_tuning.py) and at 4 ranks on V2, one
class each, and per collective kind (all_reduce, all_gather, reduce_scatter,
all_to_all):

* The implementation that runs after compilation is the expected winner.  Every
  op has three real implementations (the op's own eager code and two
  decompositions built from functional collectives); all but the expected
  winner are made slower on purpose through a ``probe`` op that sleeps, so the
  winner is known.  The expected winner rotates over the default, the first and
  the last registered candidate, so a selection that ignores timings fails.
* Every rank ran that same implementation (gathered and compared on each rank).
* The numerical result equals the closed-form expectation on every rank.

Faults, injected through the registered candidates themselves (the ``probe``
raises, stalls, kills its process or corrupts its output on chosen ranks at a
chosen call), in each class: an exception on one rank during warmup and
during timed runs, an exception on every rank, a wrong result on one rank (all
in one op, next to a healthy candidate that must win); every candidate
failing; one rank stalling once past the timeout, without and with a retry;
and a rank killed mid-benchmark (at 2 ranks on V1, 4 on V2).  Each
asserts on every surviving rank the winner, that every rank ran it, the
numerical result and a generous wall-time bound that only a hang would break.  A 4-rank class per path runs two tensor-parallel
groups, one of which starts compiling later than the timeout, and a 2 x 2
device mesh whose tp and dp groups tune one program, with a candidate that
fails on one rank.

A default that fails tunes nothing: every rank runs the default, and the
group's rank 0 warns, naming each candidate's error; with
``collective_benchmark_strict`` (on in every class that asserts a winner,
``@config.patch``, in its rank processes too) the compile fails on every
rank, the group still in step.  No log names
another winner than the one taken.  ``TestCollectiveBareInit2RanksV1`` and
``...3RanksV2`` run jobs whose group was made by ``init_process_group()``
without a backend: the known winner, and a candidate raising on one rank
disqualified everywhere.

Memory safety on gloo, at 2 and 4 ranks: a user's candidate that keeps two
collectives in flight on the group (the fastest by far) is found from its
graph, disqualified on every rank without running, with a warning, and the
healthy winner runs; with ``collective_benchmark_allow_gloo_overlap`` (at 2
ranks) it competes and wins.
A candidate calling a collective known to crash the job's backend (a
stand-in entry of ``known_crashes.KNOWN_CRASHES`` for this job's backend and
device; at 2 ranks) is out on every rank before it is compiled or run, with a
warning naming the upstream issue, and the healthy winner runs.

The NCCL classes run the same tests when enough GPUs are present and are
skipped otherwise.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import dataclasses
import datetime
import logging
import os
import shutil
import signal
import time
import unittest
from unittest import mock

import torch
import torch.distributed as dist
import torch._inductor.config as inductor_config
from torch._dynamo.utils import counters
from torch._inductor import config
from torch._inductor.kernel.custom_op import (
    CustomOpConfig,
    register_custom_op_autotuning,
)
from torch._inductor.runtime.cache_dir_utils import cache_dir
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.distributed_c10d import _resolve_process_group
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed.collective_autotuning_utils import (
    RankProcessesTestCase,
    SpawnedRanksTestCase,
)

funcol = torch.ops._c10d_functional

# Implementations that ran on this rank, in order, and the artificial delay of
# each: the probe is how a test makes a candidate slow and sees what ran.
RAN: list[str] = []
DELAY_MS: dict[str, float] = {}
# (implementation, call) -> delay of that one call, in place of DELAY_MS's.
DELAY_AT_CALL_MS: dict[tuple[str, int], float] = {}
SLOW_MS = 50.0  # far above a gloo collective, even with 4 ranks on 2 busy cores
# The default's delay where a faster candidate must replace it: with NRUNS
# paired runs the do-no-harm sign test forgives no lost run, so the margin
# must hold against the worst of NRUNS runs of every rank on busy cores.
SLOW_DEFAULT_MS = 2 * SLOW_MS
NWARMUP = 2
NRUNS = 5
ROWS = 24  # divisible by every tested world size
COLS = 8
# Fault tests bound every collective step by this.  Skew between ranks
# compiling the same candidates does not count against it (the join and the
# end of compiling wait for a late rank up to collective_benchmark_max_wait);
# it only has to be well above a small collective on 2 busy cores.
FAULT_TIMEOUT_S = 5.0
# Wall-time bound of one faulty compile: only a hang comes near it.
HANG_BOUND_S = 240.0
# collective_benchmark_max_wait where a rank dies: how long the others wait
# for it at the failure agreement before they name it.
KILLED_MAX_WAIT_S = 4 * FAULT_TIMEOUT_S
# What a stated bound on naming a lost rank (docs/design.md, "Bounds, and the
# trade") leaves out: dropping the channel, the roll call's store requests
# and the wakeups of processes on CI's two busy cores.
BOUND_SLACK_S = 5.0
# What warns, on every rank, when a session tunes nothing.
BENCHMARKER_LOG = "torch._inductor.runtime.collective_benchmarking.benchmarker"


class Fault:
    """What the probe does for one implementation on ``ranks`` at its ``call``-th run.

    ``call`` counts this rank's runs of the implementation while compiling
    (0 = every run); kinds: raise, wrong (output + 1), stall (sleep for
    ``seconds``, past the timeout by default), wedge (block for ``seconds``
    in a C call that holds the GIL, so that no other thread of the process
    runs), kill (SIGKILL this process).
    """

    def __init__(
        self,
        kind: str,
        ranks: str | list[int],
        call: int = 0,
        seconds: float | None = None,
    ) -> None:
        self.kind, self.ranks, self.call = kind, ranks, call
        # Past the timeout by more than the ranks' skew on busy cores: a peer
        # that enters the round late still waits a whole timeout.
        self.seconds = FAULT_TIMEOUT_S + 3 if seconds is None else seconds

    def fires(self, rank: int, call: int) -> bool:
        return (self.ranks == "all" or rank in self.ranks) and self.call in (0, call)


FAULTS: dict[str, Fault] = {}
# (implementation, call) -> time.monotonic() when this rank started that call.
CALLED_AT: dict[tuple[str, int], float] = {}


def clear_probes() -> None:
    """Forget what candidates ran and the delays and faults injected into them."""
    RAN.clear()
    DELAY_MS.clear()
    DELAY_AT_CALL_MS.clear()
    FAULTS.clear()
    CALLED_AT.clear()


@torch.library.custom_op("collective_autotune_test::probe", mutates_args=())
def probe(x: torch.Tensor, impl: str) -> torch.Tensor:
    RAN.append(impl)
    call = RAN.count(impl)
    CALLED_AT[(impl, call)] = time.monotonic()
    fault = FAULTS.get(impl)
    if fault is not None and fault.fires(dist.get_rank(), call):
        if fault.kind == "raise":
            raise RuntimeError(f"fault injected into {impl}")
        if fault.kind == "wrong":
            return x + 1
        if fault.kind == "stall":
            time.sleep(fault.seconds)
        if fault.kind == "wedge":
            ctypes.PyDLL(None).sleep(
                int(fault.seconds)
            )  # libc sleep(), the GIL held throughout
        if fault.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
    delay = DELAY_AT_CALL_MS.get((impl, call), DELAY_MS.get(impl, 0.0))
    if delay:
        time.sleep(delay / 1e3)
    return x.clone()


@probe.register_fake
def _(x: torch.Tensor, impl: str) -> torch.Tensor:
    return torch.empty_like(x)


def _group_name() -> str:
    return dist.group.WORLD.group_name


def _group() -> dist.ProcessGroup:
    # The eager defaults resolve their group by name, as functional collectives
    # do, so that autotuning benchmarks them on its own channel (see
    # torch/_inductor/runtime/collective_benchmarking/benchmarker.py).
    return _resolve_process_group(_group_name())


def _wait(tensor: torch.Tensor) -> torch.Tensor:
    return funcol.wait_tensor(tensor)


def _all_to_all(x: torch.Tensor) -> torch.Tensor:
    splits = [x.shape[0] // dist.get_world_size()] * dist.get_world_size()
    return _wait(funcol.all_to_all_single(x, splits, splits, _group_name()))


# --- all_reduce ----------------------------------------------------------------
@torch.library.custom_op("collective_autotune_test::all_reduce", mutates_args=())
def all_reduce_op(x: torch.Tensor) -> torch.Tensor:
    out = probe(x, "default")
    dist.all_reduce(out, group=_group())
    return out


@all_reduce_op.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def all_reduce_direct(x):
    return _wait(funcol.all_reduce(probe(x, "direct"), "sum", _group_name()))


def all_reduce_rs_ag(x):
    world = dist.get_world_size()
    shard = _wait(
        funcol.reduce_scatter_tensor(probe(x, "rs_ag"), "sum", world, _group_name())
    )
    return _wait(funcol.all_gather_into_tensor(shard, world, _group_name()))


# --- all_gather ----------------------------------------------------------------
@torch.library.custom_op("collective_autotune_test::all_gather", mutates_args=())
def all_gather_op(x: torch.Tensor) -> torch.Tensor:
    x = probe(x, "default")
    out = x.new_empty((x.shape[0] * dist.get_world_size(), *x.shape[1:]))
    dist.all_gather_into_tensor(out, x, group=_group())
    return out


@all_gather_op.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0] * dist.get_world_size(), *x.shape[1:]))


def all_gather_direct(x):
    return _wait(
        funcol.all_gather_into_tensor(
            probe(x, "direct"), dist.get_world_size(), _group_name()
        )
    )


def all_gather_via_all_to_all(x):
    # Sending every peer a full copy of x makes all_to_all an all_gather.
    world = dist.get_world_size()
    replicated = probe(x, "a2a").repeat(world, *([1] * (x.dim() - 1)))
    return _all_to_all(replicated)


# --- reduce_scatter ------------------------------------------------------------
@torch.library.custom_op("collective_autotune_test::reduce_scatter", mutates_args=())
def reduce_scatter_op(x: torch.Tensor) -> torch.Tensor:
    x = probe(x, "default")
    out = x.new_empty((x.shape[0] // dist.get_world_size(), *x.shape[1:]))
    dist.reduce_scatter_tensor(out, x, group=_group())
    return out


@reduce_scatter_op.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0] // dist.get_world_size(), *x.shape[1:]))


def reduce_scatter_direct(x):
    world = dist.get_world_size()
    return _wait(
        funcol.reduce_scatter_tensor(probe(x, "direct"), "sum", world, _group_name())
    )


def reduce_scatter_via_all_to_all(x):
    # all_to_all hands this rank every peer's shard of x; their sum is the result.
    world = dist.get_world_size()
    shards = _all_to_all(probe(x, "a2a_sum"))
    return shards.view(world, x.shape[0] // world, *x.shape[1:]).sum(0)


# --- all_to_all ----------------------------------------------------------------
@torch.library.custom_op("collective_autotune_test::all_to_all", mutates_args=())
def all_to_all_op(x: torch.Tensor) -> torch.Tensor:
    x = probe(x, "default")
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=_group())
    return out


@all_to_all_op.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def all_to_all_direct(x):
    return _all_to_all(probe(x, "direct"))


def all_to_all_two_halves(x):
    # Exchange the first and second half of every shard in two all_to_alls.
    world = dist.get_world_size()
    x = probe(x, "halves")
    shards = x.view(world, 2, x.shape[0] // (2 * world), *x.shape[1:])
    first = _all_to_all(shards[:, 0].contiguous())
    second = _all_to_all(shards[:, 1].contiguous())
    return torch.stack(
        [first.view_as(shards[:, 0]), second.view_as(shards[:, 1])], dim=1
    ).view_as(x)


def _expected(kind: str, inputs: list[torch.Tensor], rank: int) -> torch.Tensor:
    world = len(inputs)
    if kind == "all_reduce":
        return torch.stack(inputs).sum(0)
    if kind == "all_gather":
        return torch.cat(inputs)
    if kind == "reduce_scatter":
        return torch.stack(inputs).sum(0).chunk(world)[rank]
    return torch.cat([peer.chunk(world)[rank] for peer in inputs])


# kind -> (op, [(impl name, decomposition)], expected winner)
CASES = {
    "all_reduce": (
        all_reduce_op,
        [("direct", all_reduce_direct), ("rs_ag", all_reduce_rs_ag)],
        "rs_ag",
    ),
    "all_gather": (
        all_gather_op,
        [("direct", all_gather_direct), ("a2a", all_gather_via_all_to_all)],
        "default",
    ),
    "reduce_scatter": (
        reduce_scatter_op,
        [("direct", reduce_scatter_direct), ("a2a_sum", reduce_scatter_via_all_to_all)],
        "a2a_sum",
    ),
    "all_to_all": (
        all_to_all_op,
        [("direct", all_to_all_direct), ("halves", all_to_all_two_halves)],
        "direct",
    ),
}


# --- all_reduce over a tensor-parallel group named by the caller -----------------
@torch.library.custom_op("collective_autotune_test::tp_all_reduce", mutates_args=())
def tp_all_reduce_op(x: torch.Tensor, group_name: str) -> torch.Tensor:
    out = probe(x, "default")
    dist.all_reduce(out, group=_resolve_process_group(group_name))
    return out


@tp_all_reduce_op.register_fake
def _(x: torch.Tensor, group_name: str) -> torch.Tensor:
    return torch.empty_like(x)


def tp_all_reduce_direct(x, group_name):
    return _wait(funcol.all_reduce(probe(x, "direct"), "sum", group_name))


def tp_all_reduce_rs_ag(x, group_name):
    size = _resolve_process_group(group_name).size()
    shard = _wait(
        funcol.reduce_scatter_tensor(probe(x, "rs_ag"), "sum", size, group_name)
    )
    return _wait(funcol.all_gather_into_tensor(shard, size, group_name))


def all_reduce_candidate(impl: str, probe_after: bool = False):
    """A direct all_reduce whose probe runs before the collective, or after it.

    Probing after the collective corrupts only the faulty rank's output.
    """

    def candidate(x):
        if probe_after:
            return probe(_wait(funcol.all_reduce(x, "sum", _group_name())), impl)
        return _wait(funcol.all_reduce(probe(x, impl), "sum", _group_name()))

    candidate.__name__ = f"all_reduce_{impl}"
    return candidate


def all_reduce_two_in_flight(x):
    """An all_reduce in two halves whose collectives are both in flight before either is waited for.

    On a gloo group, two works that finish together can corrupt the heap
    (docs/upstream/gloo-status-string-race.md), so the autotuner must not
    pick this.  all_reduce records a name short enough to stay inline in
    gloo's status string: running it (with the knob that allows it) cannot
    corrupt the heap, which keeps the test that lets it compete safe.
    """
    first, second = probe(x, "two_in_flight").chunk(2)
    first = funcol.all_reduce(first, "sum", _group_name())
    second = funcol.all_reduce(second, "sum", _group_name())
    return torch.cat([_wait(first), _wait(second)])


def all_reduce_through_all_gather(x):
    """An all_reduce as a functional all_gather and a local sum: on gloo with CUDA tensors, it would crash."""
    world = dist.get_world_size()
    gathered = _wait(
        funcol.all_gather_into_tensor(probe(x, "gathers"), world, _group_name())
    )
    return gathered.view(world, *x.shape).sum(0)


def tuning_config(defer: bool, **patches):
    """Inductor settings of a multi-rank autotuning test: few runs, the path under test.

    Inductor's caches stay at their defaults (on), as users run them.  On a
    prefix of the series without V2 (scripts/check_prefixes.py), V1 is the
    only path, and a V2 test is skipped.
    """
    if hasattr(inductor_config, "defer_collective_autotuning"):
        patches["defer_collective_autotuning"] = defer
    elif defer:
        raise unittest.SkipTest("this build has no deferred collective autotuning")
    return inductor_config.patch(
        {
            "collective_benchmark_nruns": NRUNS,
            "collective_benchmark_nwarmup": NWARMUP,
            **patches,
        }
    )


@config.patch(collective_benchmark_strict=True)
class StrictRankProcessesTestCase(RankProcessesTestCase):
    """Rank processes in which an op that tunes nothing fails its compile.

    For the classes that assert a winner: none passes by running the default
    because no candidate could be tuned.  Not a test class of its own.
    """


@config.patch(collective_benchmark_strict=True)
class StrictSpawnedRanksTestCase(SpawnedRanksTestCase):
    """Per-test rank processes in which an op that tunes nothing fails its compile."""


class AutotuningTestMixin:
    """What the tests of a tuning path share; mixed into a rank-processes base.

    ``_init_rank`` (from the base) returns this rank's device, with the
    process group up.
    """

    # torch._inductor.config.defer_collective_autotuning: V2 (True) or V1.
    DEFER = True
    rank: int
    world_size: int

    def reset_rank(self) -> None:
        super().reset_rank()  # type: ignore[misc]
        clear_probes()

    def _input(self, rank: int, device: torch.device) -> torch.Tensor:
        values = torch.arange(ROWS * COLS, dtype=torch.float32) + 1000 * rank
        return values.view(ROWS, COLS).to(device)

    def _autotune(self, op, decompositions, device, **config_patches):
        """Compile ``op(x) + 1`` with ``decompositions`` registered, then run it again.

        Returns what ran on this rank while compiling (a Counter), what ran in
        the second call, its result and how long the compiling call took.
        Faults apply to the compiling call only.
        """
        register_custom_op_autotuning(
            op, configs=[CustomOpConfig(fn) for _, fn in decompositions]
        )

        def program(x):
            return op(x) + 1

        with tuning_config(self.DEFER, **config_patches):
            compiled = torch.compile(program)
            RAN.clear()
            start = time.monotonic()
            try:
                compiled(self._input(self.rank, device))  # compiles, autotunes, runs
            finally:
                compile_seconds = time.monotonic() - start
                FAULTS.clear()
            ran_while_compiling = collections.Counter(RAN)
            RAN.clear()
            result = compiled(self._input(self.rank, device))
        return ran_while_compiling, list(RAN), result, compile_seconds

    def _assert_agreed_winner(self, ran_here: list[str], winner: str) -> None:
        ran_everywhere: list = [None] * self.world_size
        dist.all_gather_object(ran_everywhere, ran_here)
        self.assertEqual(
            ran_here,
            [winner],
            f"rank {self.rank} ran {ran_here}, expected [{winner!r}]",
        )
        self.assertEqual(ran_everywhere, [[winner]] * self.world_size)

    def _check_autotuned(self, kind: str) -> None:
        device = self._init_rank()
        op, decompositions, winner = CASES[kind]
        DELAY_MS.clear()
        DELAY_MS.update(
            {
                name: SLOW_MS
                for name in ["default", *dict(decompositions)]
                if name != winner
            }
        )
        ran_while_compiling, ran_here, result, _ = self._autotune(
            op, decompositions, device
        )

        # Lock-step: every candidate ran warmup + timed runs on this rank (the
        # default's timed runs twice: its twin measures the noise floor, and
        # once more on the absolute values of its inputs, the screening
        # bound's magnitude; the winner once more, as the first call's
        # result); on every rank.
        self.assertEqual(
            dict(ran_while_compiling),
            {
                name: NWARMUP
                + NRUNS * (1 + (name == "default"))
                + (name == "default")
                + (name == winner)
                for name in ["default", *dict(decompositions)]
            },
        )
        self._assert_agreed_winner(ran_here, winner)
        inputs = [self._input(r, device) for r in range(self.world_size)]
        torch.testing.assert_close(
            result, _expected(kind, inputs, self.rank) + 1, rtol=0, atol=0
        )

    def _check_faulty(
        self, faults: dict[str, Fault], fast: list[str], winner: str, **config_patches
    ):
        """Autotune all_reduce among faulty candidates and healthy ones; ``winner`` must win.

        Candidates in ``fast`` (the faulty ones, typically) have no delay, so
        they would win if a fault went unnoticed; the winner is slowed a
        little and every other candidate a lot.
        """
        device = self._init_rank()
        names = [name for name in faults if name != "default"]
        if "good" not in names:
            names.append("good")
        wrong = {name for name, fault in faults.items() if fault.kind == "wrong"}
        decompositions = [
            (name, all_reduce_candidate(name, probe_after=name in wrong))
            for name in names
        ]
        DELAY_MS.clear()
        DELAY_MS.update({name: SLOW_MS for name in names if name not in fast})
        if "default" not in fast:
            DELAY_MS["default"] = SLOW_DEFAULT_MS
        DELAY_MS[winner] = SLOW_MS / 5
        FAULTS.clear()
        FAULTS.update(faults)
        ran_while_compiling, ran_here, result, seconds = self._autotune(
            all_reduce_op,
            decompositions,
            device,
            collective_benchmark_timeout=FAULT_TIMEOUT_S,
            **config_patches,
        )
        self.assertLess(seconds, HANG_BOUND_S)
        self._assert_agreed_winner(ran_here, winner)
        inputs = [self._input(r, device) for r in range(self.world_size)]
        torch.testing.assert_close(
            result, _expected("all_reduce", inputs, self.rank) + 1, rtol=0, atol=0
        )
        return ran_while_compiling

    def _autotune_beside_good(
        self, name, candidate, device, warnings_from=None, **patches
    ):
        """Autotune all_reduce with ``candidate`` (undelayed: the fastest) beside a healthy one.

        "good" is slowed a little, the default a lot.  Returns what
        ``_autotune`` returns, with, in place of the compile time, the
        warnings that the logger ``warnings_from`` gave while compiling (it
        must give one).
        """
        DELAY_MS.clear()
        DELAY_MS.update({"default": SLOW_DEFAULT_MS, "good": SLOW_MS / 5})
        decompositions = [(name, candidate), ("good", all_reduce_candidate("good"))]
        with contextlib.ExitStack() as stack:
            logs = (
                stack.enter_context(self.assertLogs(warnings_from, "DEBUG"))
                if warnings_from
                else None
            )
            ran_while_compiling, ran_here, result, _ = self._autotune(
                all_reduce_op, decompositions, device, **patches
            )
        return (
            ran_while_compiling,
            ran_here,
            result,
            self._warned_by_group_rank0(logs) if logs else [],
        )

    def _warned_by_group_rank0(self, logs) -> list[str]:
        """The messages ``logs`` captured that rank 0 warns and every other rank
        logs at debug level (one copy per job, not per rank); on every rank."""
        warned = [r.getMessage() for r in logs.records if r.levelno >= logging.WARNING]
        if self.rank != 0:
            self.assertEqual(warned, [], "only the group's rank 0 warns")
            return [r.getMessage() for r in logs.records]
        return warned


class CollectiveAutotuningTests(AutotuningTestMixin):
    """Every collective kind, faults, and a desynchronizing candidate, per path and world size."""

    def test_all_reduce(self):
        self._check_autotuned("all_reduce")

    def test_all_gather(self):
        self._check_autotuned("all_gather")

    def test_reduce_scatter(self):
        self._check_autotuned("reduce_scatter")

    def test_all_to_all(self):
        self._check_autotuned("all_to_all")

    def test_faulty_candidates_are_disqualified_and_the_rest_compete(self):
        last = self.world_size - 1
        faults = {
            "raises_in_warmup": Fault("raise", [last], call=1),
            "raises_everywhere": Fault("raise", "all", call=1),
            # Warmed up once, after the two above are out: its fault strikes
            # in the timed runs.
            "raises_in_timed_runs": Fault("raise", [0], call=NWARMUP + 2),
            "wrong_on_one_rank": Fault("wrong", [1]),
        }
        ran = self._check_faulty(faults, fast=list(faults), winner="good")
        # Every rank left each faulty candidate where the fault struck,
        # together: a peer's collective fails as soon as the faulty rank leaves.
        self.assertEqual(ran["raises_in_warmup"], 1)
        self.assertEqual(ran["raises_everywhere"], 1)
        self.assertEqual(ran["raises_in_timed_runs"], NWARMUP + 2)
        # After each failure the op runs again without the candidate that
        # failed, so the others ran more than once.  The wrong one is
        # screened on the rank that saw it and disqualified at the exchange:
        # its timed runs ran everywhere, keeping the ranks matched.
        self.assertGreaterEqual(ran["wrong_on_one_rank"], NWARMUP + NRUNS)
        self.assertGreaterEqual(ran["good"], NWARMUP + NRUNS + 1)

    def test_faster_at_the_median_but_not_significantly_keeps_the_default(self):
        # "lucky" is several times faster than the default at the median of
        # its timed runs, but it was faster in only NRUNS - 1 of the paired
        # runs: at 95% the sign test cannot tell that from chance, so the
        # agreed decision keeps the default, and every rank must run it.
        device = self._init_rank()
        decompositions = [
            ("lucky", all_reduce_candidate("lucky")),
            ("slow", all_reduce_candidate("slow")),
        ]
        DELAY_MS.update({"default": SLOW_MS / 5, "slow": SLOW_MS})
        # Its first timed run, lost by far more than the default's noise.
        DELAY_AT_CALL_MS[("lucky", NWARMUP + 1)] = 4 * SLOW_MS
        # No log may name another winner than the one taken: select_algorithm's
        # own table marked the lowest median "SELECTED" at WARNING on rank 0.
        with self.assertNoLogs("torch._inductor.select_algorithm", "WARNING"):
            ran_while_compiling, ran_here, result, _ = self._autotune(
                all_reduce_op, decompositions, device
            )
        self._assert_agreed_winner(ran_here, "default")
        self.assertEqual(ran_while_compiling["lucky"], NWARMUP + NRUNS)
        inputs = [self._input(r, device) for r in range(self.world_size)]
        torch.testing.assert_close(
            result, _expected("all_reduce", inputs, self.rank) + 1, rtol=0, atol=0
        )

    def test_rank_local_override_cannot_change_the_agreed_choice(self):
        # InductorChoices.override_best_choice is rank-local: on rank 0 it
        # would swap the agreed winner for the slowest candidate.  Every rank
        # must still run the agreed winner (the warning says why).
        from torch._inductor.choices import InductorChoices
        from torch._inductor.virtualized import V

        class SlowestOnRankZero(InductorChoices):
            def override_best_choice(self, best_choice, timings):
                if dist.get_rank() != 0:
                    return best_choice
                return max(timings, key=timings.__getitem__)

        device = self._init_rank()
        decompositions = [
            ("direct", all_reduce_direct),
            ("rs_ag", all_reduce_rs_ag),
        ]
        DELAY_MS.update({"default": SLOW_MS, "rs_ag": SLOW_MS})
        with (
            V.set_choices_handler(SlowestOnRankZero()),
            self.assertLogs("torch._inductor.collective_autotuning.choices") as logs,
        ):
            _, ran_here, result, _ = self._autotune(
                all_reduce_op, decompositions, device
            )
            if self.rank != 0:  # assertLogs needs a record on every rank
                logging.getLogger("torch._inductor.collective_autotuning.choices").info(
                    "no override on this rank"
                )
        self._assert_agreed_winner(ran_here, "direct")
        self.assertEqual(
            any("cannot change on one rank alone" in line for line in logs.output),
            self.rank == 0,
            logs.output,
        )
        inputs = [self._input(r, device) for r in range(self.world_size)]
        torch.testing.assert_close(
            result, _expected("all_reduce", inputs, self.rank) + 1, rtol=0, atol=0
        )

    def test_stall_past_timeout_disqualifies_candidate(self):
        faults = {"stalls": Fault("stall", [self.world_size - 1], call=NWARMUP + 2)}
        self._check_faulty(faults, fast=["stalls"], winner="good")

    def test_stall_past_timeout_is_retried(self):
        faults = {"stalls": Fault("stall", [self.world_size - 1], call=NWARMUP + 2)}
        ran = self._check_faulty(
            faults, fast=["stalls"], winner="stalls", collective_benchmark_retries=1
        )
        self.assertGreater(ran["stalls"], NWARMUP + NRUNS + 1)  # a second round ran

    def test_every_candidate_failing_falls_back_to_default(self):
        # The default failing leaves nothing to judge the candidates against:
        # nothing is tuned, every rank runs the default, and the group's rank 0
        # warns that nothing was tuned, naming each candidate's error (the
        # others log it at debug level).  With
        # collective_benchmark_strict (on in these tests) it is an error.
        faults = {
            name: Fault("raise", [0], call=1) for name in ("default", "first", "good")
        }
        with self.assertLogs(BENCHMARKER_LOG, "DEBUG") as logs:
            self._check_faulty(
                faults,
                fast=["first", "good"],
                winner="default",
                collective_benchmark_strict=False,
            )
        text = "\n".join(self._warned_by_group_rank0(logs))
        self.assertIn("tuned nothing: the default", text)
        for name in faults:
            self.assertRegex(
                text,
                rf"{name}[^;]*: disqualified: raised on rank 0 in warmup: "
                rf"RuntimeError: fault injected into {name}",
            )

    def test_a_failing_default_is_an_error_in_strict_mode(self):
        if self.world_size != 2:
            raise unittest.SkipTest("run at 2 ranks; the switch is the same at any")
        device = self._init_rank()
        last = self.world_size - 1
        FAULTS["default"] = Fault("raise", [last], call=1)
        with self.assertRaisesRegex(
            Exception, r"(?s)tuned nothing: the default.*fault injected into default"
        ):
            self._autotune(
                all_reduce_op,
                [("direct", all_reduce_direct), ("rs_ag", all_reduce_rs_ag)],
                device,
                collective_benchmark_strict=True,
            )
        # Every rank raised at the same point: the group is still in step.
        check = torch.ones(1)
        dist.all_reduce(check)
        self.assertEqual(check.item(), float(self.world_size))

    def test_candidate_whose_collectives_differ_between_ranks_costs_only_itself(self):
        device = self._init_rank()
        last = self.world_size - 1

        def desynchronizing(x):
            # One more all_reduce on the last rank: traced on each rank, its
            # graph issues different collectives on different ranks (a user
            # bug that, run, would pair the next candidates' collectives
            # wrongly).  Numerically it equals the others.
            y = _wait(funcol.all_reduce(probe(x, "desync"), "sum", _group_name()))
            if dist.get_rank() == last:
                y = _wait(funcol.all_reduce(y, "sum", _group_name())) / self.world_size
            return y

        ran_while_compiling, ran_here, result, warnings = self._autotune_beside_good(
            "desync",
            desynchronizing,
            device,
            "torch._inductor.runtime.collective_benchmarking.join",
        )
        # Disqualified at the join, on every rank, without running; the
        # others competed on a channel it never touched.
        self.assertEqual(ran_while_compiling["desync"], 0)
        self.assertEqual(ran_while_compiling["good"], NWARMUP + NRUNS + 1)
        self.assertTrue(
            any(
                "desync" in line and "different collectives" in line
                for line in warnings
            ),
            warnings,
        )
        self._assert_agreed_winner(ran_here, "good")
        inputs = [self._input(r, device) for r in range(self.world_size)]
        torch.testing.assert_close(
            result, _expected("all_reduce", inputs, self.rank) + 1, rtol=0, atol=0
        )
        # The program's own process group is clean: a collective on it pairs.
        check = torch.ones(1)
        dist.all_reduce(check)
        self.assertEqual(check.item(), float(self.world_size))

    def _assert_out_before_running(self, name, words, ran_while_compiling, warnings):
        """``name`` never ran on this rank, and a warning holds every one of ``words``."""
        self.assertEqual(ran_while_compiling[name], 0)
        self.assertTrue(
            any(all(word in line for word in words) for line in warnings), warnings
        )

    def _assert_good_won(self, ran_here, result, device) -> None:
        """Every rank ran "good", and this rank's all_reduce(x) + 1 is exact."""
        self._assert_agreed_winner(ran_here, "good")
        inputs = [self._input(r, device) for r in range(self.world_size)]
        expected = _expected("all_reduce", inputs, self.rank) + 1
        torch.testing.assert_close(result, expected, rtol=0, atol=0)

    def test_candidate_calling_a_collective_known_to_crash_is_not_run(self):
        if self.world_size != 2:
            raise unittest.SkipTest("every rank decides alike; 2 ranks show it")
        # Imported here: the prefixes of the series before 0021 have no such list.
        from torch._inductor.runtime.collective_benchmarking import known_crashes
        from torch._inductor.runtime.collective_benchmarking.channel_builder import (
            served_backends,
        )

        device = self._init_rank()
        # The functional all_gather crashes gloo with CUDA tensors only: a
        # stand-in entry lists this job's backend and device, so that the rule
        # acts where the crash cannot happen.
        backend = served_backends(dist.group.WORLD)[device.type]
        stand_in = dataclasses.replace(
            known_crashes.KNOWN_CRASHES[0], backend=backend, device_type=device.type
        )
        with mock.patch.object(known_crashes, "KNOWN_CRASHES", (stand_in,)):
            ran_while_compiling, ran_here, result, warnings = (
                self._autotune_beside_good(
                    "gathers",
                    all_reduce_through_all_gather,
                    device,
                    "torch._inductor.runtime.collective_benchmarking.session",
                )
            )
        # The fastest, yet out on every rank before it was compiled or run;
        # the warning names the collective and the upstream issue.
        self._assert_out_before_running(
            "gathers",
            [
                "all_reduce_through_all_gather",
                "_c10d_functional::all_gather_into_tensor crashes",
                "pytorch/pytorch#152645",
            ],
            ran_while_compiling,
            warnings,
        )
        self._assert_good_won(ran_here, result, device)

    def test_candidate_keeping_two_collectives_in_flight_is_not_chosen_on_gloo(self):
        if self.backend_str() != "gloo":
            raise unittest.SkipTest("a gloo hazard")
        device = self._init_rank()
        ran_while_compiling, ran_here, result, warnings = self._autotune_beside_good(
            "two_in_flight",
            all_reduce_two_in_flight,
            device,
            "torch._inductor.runtime.collective_benchmarking.session",
        )
        # The fastest by far, yet read from its graph and disqualified on
        # every rank before it ran, in benchmarking as in the program.
        self._assert_out_before_running(
            "two_in_flight",
            ["two_in_flight", "2 collectives in flight", "ProcessGroupGloo::runLoop"],
            ran_while_compiling,
            warnings,
        )
        self._assert_good_won(ran_here, result, device)
        inputs = [self._input(r, device) for r in range(self.world_size)]
        expected = _expected("all_reduce", inputs, self.rank) + 1

        if self.world_size != 2:
            return  # the knob's effect does not depend on the world size
        # With the knob, it competes, and wins (the knob is in the keys of
        # Inductor's caches and of remembered decisions: the op is tuned anew).
        torch._dynamo.reset()
        clear_probes()
        ran_while_compiling, ran_here, result, _ = self._autotune_beside_good(
            "two_in_flight",
            all_reduce_two_in_flight,
            device,
            collective_benchmark_allow_gloo_overlap=True,
        )
        self.assertGreaterEqual(ran_while_compiling["two_in_flight"], NWARMUP + NRUNS)
        self._assert_agreed_winner(ran_here, "two_in_flight")
        torch.testing.assert_close(result, expected, rtol=0, atol=0)


class KilledRankTests(AutotuningTestMixin):
    """A rank killed inside a candidate: every healthy rank names it, within the timeout.

    In processes of its own per test (``SpawnedRanksTestCase``): the dead
    rank's exit code is not checked, the healthy ranks' assertions are.
    """

    KILLS_A_RANK = ("test_killed_rank_is_reported_by_every_healthy_rank",)

    def test_killed_rank_is_reported_by_every_healthy_rank(self):
        device = self._init_rank()
        last = self.world_size - 1
        FAULTS["doomed"] = Fault("kill", [last], call=NWARMUP + 1)
        register_custom_op_autotuning(
            all_reduce_op,
            configs=[
                CustomOpConfig(all_reduce_candidate("doomed")),
                CustomOpConfig(all_reduce_direct),
            ],
        )
        # A dead rank is waited for up to collective_benchmark_max_wait at the
        # failure agreement (it could be a straggler): set here to a few
        # timeouts, so that the test reads the bound, not the default's 10
        # minutes.
        with tuning_config(
            self.DEFER,
            collective_benchmark_timeout=FAULT_TIMEOUT_S,
            collective_benchmark_max_wait=KILLED_MAX_WAIT_S,
        ):
            compiled = torch.compile(lambda x: all_reduce_op(x) + 1)
            with self.assertRaisesRegex(
                Exception, rf"ranks \[{last}\] .*did not reach failure agreement"
            ):
                compiled(self._input(self.rank, device))
        # Named within the stated bound from the call its peer died in (the
        # step fails at once or at the timeout, the failure agreement waits
        # the max wait, the roll call a timeout), not after the group's own
        # (30 minute) timeout.
        named_after = time.monotonic() - CALLED_AT[("doomed", NWARMUP + 1)]
        bound = 2 * FAULT_TIMEOUT_S + KILLED_MAX_WAIT_S
        self.assertLess(
            named_after,
            bound + BOUND_SLACK_S,
            f"named after {named_after:.1f}s, bound {bound:g}s",
        )


class CollectiveAutotuningGroupsTests(AutotuningTestMixin):
    """Two tensor-parallel groups of 2 in a world of 4, tuning independently.

    Group {2, 3} starts compiling two timeouts after group {0, 1}: a protocol
    that synchronized over the world (as upstream's did) would time out.
    Each group has its own expected winner, so a group cannot borrow the
    other's decision.  On a 2 x 2 device mesh, a candidate that fails on
    one rank is out in that rank's two groups only.
    """

    WORLD_SIZE = 4
    TIMEOUT_S = 5.0
    WINNERS = {0: "direct", 1: "rs_ag"}  # by group index

    def _register_candidates(self) -> None:
        register_custom_op_autotuning(
            tp_all_reduce_op,
            configs=[
                CustomOpConfig(tp_all_reduce_direct),
                CustomOpConfig(tp_all_reduce_rs_ag),
            ],
        )

    def _ran_on_every_rank(self) -> list:
        """What each rank ran since RAN was last cleared, in rank order."""
        ran_everywhere: list = [None] * self.world_size
        dist.all_gather_object(ran_everywhere, list(RAN))
        return ran_everywhere

    def test_groups_tune_independently(self):
        groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        index = self.rank // 2
        group = groups[index]
        winner = self.WINNERS[index]
        DELAY_MS.clear()
        DELAY_MS.update(
            {name: SLOW_MS for name in ("default", "direct", "rs_ag") if name != winner}
        )
        self._register_candidates()
        x = torch.full((ROWS, COLS), float(self.rank + 1))
        if index == 1:
            time.sleep(2 * self.TIMEOUT_S)
        with tuning_config(self.DEFER, collective_benchmark_timeout=self.TIMEOUT_S):
            compiled = torch.compile(
                lambda x: tp_all_reduce_op(x, group.group_name) + 1
            )
            compiled(x)
            RAN.clear()
            result = compiled(x)
        ran_everywhere = self._ran_on_every_rank()
        self.assertEqual(
            ran_everywhere, [[self.WINNERS[r // 2]] for r in range(self.world_size)]
        )
        members = (0, 1) if index == 0 else (2, 3)
        torch.testing.assert_close(
            result, torch.full((ROWS, COLS), float(sum(r + 1 for r in members) + 1))
        )

    def test_a_failing_candidate_on_a_2d_mesh_is_out_in_its_groups_only(self):
        # A 2 x 2 mesh: tp groups {0, 1} and {2, 3}, dp groups {0, 2} and
        # {1, 3}; one program all-reduces over tp, then over dp, so every
        # rank takes part in two sessions, each on one group of the mesh.
        # "direct" is the fastest, then rs_ag, and "direct" raises on rank 3
        # at every run: it is out in the two groups of rank 3 (rs_ag wins
        # there, on both of its members), and wins in the two without it.
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        tp, dp = mesh["tp"].get_group(), mesh["dp"].get_group()
        DELAY_MS.update({"default": SLOW_MS, "rs_ag": SLOW_MS / 4})
        FAULTS["direct"] = Fault("raise", [3])
        self._register_candidates()
        x = torch.full((ROWS, COLS), float(self.rank + 1))
        with tuning_config(self.DEFER, collective_benchmark_timeout=self.TIMEOUT_S):
            compiled = torch.compile(
                lambda x: tp_all_reduce_op(
                    tp_all_reduce_op(x, tp.group_name), dp.group_name
                )
                + 1
            )
            compiled(x)
            FAULTS.clear()
            RAN.clear()
            result = compiled(x)
        ran_everywhere = self._ran_on_every_rank()

        def winner(members: tuple[int, ...]) -> str:
            return "rs_ag" if 3 in members else "direct"

        expected = [
            [winner((r - r % 2, r - r % 2 + 1)), winner((r % 2, r % 2 + 2))]
            for r in range(self.world_size)
        ]
        self.assertEqual(ran_everywhere, expected)
        torch.testing.assert_close(
            result, torch.full((ROWS, COLS), float(1 + 2 + 3 + 4 + 1))
        )


@config.patch(collective_benchmark_strict=True)
class CollectiveAutotuningGroupsTestV1(
    CollectiveAutotuningGroupsTests, RankProcessesTestCase
):
    DEFER = False


@config.patch(collective_benchmark_strict=True)
class CollectiveAutotuningGroupsTestV2(
    CollectiveAutotuningGroupsTests, RankProcessesTestCase
):
    DEFER = True


class BareInitTests(AutotuningTestMixin):
    """Jobs that call ``init_process_group()`` without a backend, as torchrun's examples do.

    c10d then serves each device type with its default backend (``cpu:gloo``
    here, ``cpu:gloo,cuda:nccl`` on a GPU machine) and ``get_backend()``
    says ``"undefined"``; the benchmark channel must serve what the group
    serves.  The known winner wins and every rank runs it, exactly; a
    candidate that raises on one rank is disqualified on every rank.
    """

    bare_init = True

    def test_known_winner_when_no_backend_was_named(self):
        self.assertEqual(dist.get_backend(), "undefined")
        self._check_autotuned("all_reduce")

    def test_candidate_raising_on_one_rank_is_disqualified_everywhere(self):
        faults = {"raises": Fault("raise", [self.world_size - 1], call=1)}
        ran = self._check_faulty(faults, fast=["raises"], winner="good")
        self.assertEqual(ran["raises"], 1)


# TestCollectiveAutotuning2Ranks{Gloo,NCCL}{V1,V2} and ...4Ranks{Gloo,NCCL}V2:
# each backend and tuning path (V1: while lowering, V2: in the scheduler, the
# default) at 2 ranks, and V2 at 4, one set of rank processes per class.  Not
# at 3 ranks, nor V1 at 4: the protocol is the same on both paths, an odd
# world size runs in TestCollectiveBareInit3Ranks*, TestCollectivePrograms3Ranks*,
# the store's and the Inductor passes' 3-rank classes, and CI's two
# cores would spend some three minutes more; TestCollectiveKilledRank2Ranks...V1
# and ...4Ranks...V2: the killed-rank test, in processes of its own, one path
# per size (not at 3 ranks: spawning them only to skip would cost CI as much
# as the test; 2 and 4 ranks name the killed rank alike, and both paths
# agree on a failure in the same session code); TestCollectiveBareInit2RanksV1
# and ...3RanksV2: a process group initialized without a backend (gloo is
# what c10d picks on CPU), each path once.
for _world_size in (2, 3, 4):
    for _backend, _label in (("gloo", "Gloo"), ("nccl", "NCCL")):
        for _path, _defer in (("V1", False), ("V2", True)):
            _attributes = {
                "WORLD_SIZE": _world_size,
                "backend": _backend,
                "DEFER": _defer,
                "__module__": __name__,
            }
            if _world_size == 2 or (_world_size == 4 and _defer):
                _name = f"TestCollectiveAutotuning{_world_size}Ranks{_label}{_path}"
                globals()[_name] = type(
                    _name,
                    (CollectiveAutotuningTests, StrictRankProcessesTestCase),
                    _attributes,
                )
            if _backend == "gloo" and (_world_size, _defer) in ((2, False), (3, True)):
                _name = f"TestCollectiveBareInit{_world_size}Ranks{_path}"
                globals()[_name] = type(
                    _name, (BareInitTests, StrictRankProcessesTestCase), _attributes
                )
            if (_world_size, _defer) not in ((2, False), (4, True)):
                continue
            _name = f"TestCollectiveKilledRank{_world_size}Ranks{_label}{_path}"
            globals()[_name] = type(
                _name, (KilledRankTests, StrictSpawnedRanksTestCase), _attributes
            )


class CollectiveBenchmarkerMisuseTest(SpawnedRanksTestCase):
    """Ranks that do not run the same session get a clear error, on every rank, within the timeout;
    a decision that only some ranks remember is adopted by all."""

    TIMEOUT = datetime.timedelta(seconds=3)

    def _benchmarker(self, remember_decisions: bool = False):
        """This rank's benchmarker; with ``remember_decisions``, decisions go to
        this rank's own cache directory, which exists only once the group is up."""
        from torch._inductor.runtime.collective_benchmarking.benchmarker import (
            CollectiveBenchmarker,
        )
        from torch._inductor.runtime.collective_benchmarking.types import (
            CollectiveBenchmarkConfig,
        )

        self._init_process_group()
        # decision_dir only where asked: early prefixes of the series lack it.
        remembering = (
            {"decision_dir": os.path.join(cache_dir(), "collective_decisions")}
            if remember_decisions
            else {}
        )
        # A late rank is waited for up to max_wait: a few timeouts here.
        config = CollectiveBenchmarkConfig(
            timeout=self.TIMEOUT,
            max_wait=2 * self.TIMEOUT,
            nwarmup=1,
            nruns=1,
            **remembering,
        )
        return CollectiveBenchmarker(None, config)

    def test_ranks_tuning_different_ops_fail_together(self):
        from torch._inductor.runtime.collective_benchmarking.types import (
            Candidate,
            CollectiveBenchmarkError,
        )

        benchmarker = self._benchmarker()
        candidate = Candidate(
            "c", lambda: _wait(funcol.all_reduce(torch.ones(2), "sum", _group_name()))
        )
        with self.assertRaisesRegex(CollectiveBenchmarkError, "not tuning the same op"):
            benchmarker.run([candidate], key=f"op shapes on rank {self.rank}")
        dist.destroy_process_group()

    def test_decision_remembered_by_one_rank_only_is_adopted_by_all(self):
        from torch._inductor.runtime.collective_benchmarking import (
            decision_cache,
            types as ct,
        )

        # Each rank remembers in its own directory, as ranks on different hosts do.
        benchmarker = self._benchmarker(remember_decisions=True)
        stored = str(benchmarker.config.decision_dir)
        ran = collections.Counter()

        def candidate(name: str, is_default: bool = False) -> ct.Candidate:
            def fn():
                ran[name] += 1
                return _wait(funcol.all_reduce(torch.ones(2), "sum", _group_name()))

            return ct.Candidate(name, fn, is_default)

        op = ct.OpToTune(
            "op",
            [candidate("default", True), candidate("other")],
            memo_key="op measured alone",
        )
        first = benchmarker.run_batch([op])[0]
        if self.rank == 1:  # as after a restart with an empty cache: nothing remembered
            decision_cache._remembered.clear()
            shutil.rmtree(stored)
        dist.barrier()
        if self.rank == 0:  # the premise: rank 1 forgot, rank 0 did not
            self.assertTrue(os.listdir(stored))
        ran.clear()
        counters.clear()
        second = benchmarker.run_batch([op])[0]
        # Rank 0's decision was agreed by the whole group: rank 1 adopts it,
        # nobody benchmarks.
        self.assertEqual(dict(ran), {})
        self.assertEqual(
            (
                counters["collective_autotuning"]["ops"],
                counters["collective_autotuning"]["recalled"],
            ),
            (0, 1),
        )
        self.assertEqual((second.winner, second.results), (first.winner, first.results))
        self.assertIn("adopted by every rank", second.reason)
        decisions: list = [None] * self.world_size
        dist.all_gather_object(
            decisions, (second.winner, [r.time_ms for r in second.results])
        )
        self.assertEqual(len({repr(d) for d in decisions}), 1)
        dist.destroy_process_group()

    def test_rank_that_never_joins_is_named(self):
        from torch._inductor.runtime.collective_benchmarking.types import (
            Candidate,
            CollectiveBenchmarkError,
        )

        benchmarker = self._benchmarker()
        if self.rank == 1:
            time.sleep(
                2 * self.TIMEOUT.total_seconds()
            )  # "compiling something else" past the timeout
            return
        start = time.monotonic()
        with self.assertRaisesRegex(
            CollectiveBenchmarkError, r"ranks \[1\] of group .* did not reach the start"
        ):
            benchmarker.run([Candidate("c", lambda: torch.ones(1))], key="op")
        self.assertLess(time.monotonic() - start, HANG_BOUND_S)


if __name__ == "__main__":
    run_tests()
