"""What only the deferred path (V2) of collective autotuning does, on CPU/gloo.

``test_collective_autotuning_ranks.py`` runs every per-op test under both paths;
this file checks the scheduler-level behaviour
(torch/_inductor/collective_autotuning/deferred_tuning.py):

* One pre-sync per process group per graph: a graph with four collective
  autotuned ops, three over the world and one over a second group, joins
  twice under V2 and four times under V1, counted by the benchmarker
  (``counters["collective_autotuning"]["presync"]``); the three identical
  world ops are benchmarked once under both paths.  Every op's winner is
  asserted on every rank, and the result exactly.
* Fusion-aware choice: a candidate that is slower alone (it sleeps a third of
  what one pass over the tensor costs on the machine) but whose pointwise
  tail fuses with the op's epilogue, saving that pass.  V1 times it alone
  and keeps the default; V2 times every candidate with the epilogue and
  picks it; the generated code shows the tail and the epilogue in one
  kernel, and both results are correct.  Only that candidate is compiled
  with the epilogue: the default and a candidate ending in a custom op keep
  their own compilation and share one compiled epilogue.
* When the epilogue is timed is checked without ranks in
  ``test_collective_epilogue.py``.
* Mismatched node lists: ranks that compiled different graphs (here one more
  collective op on rank 0, identical to the other) raise the same
  ``CollectiveBenchmarkError`` at the pre-sync, on every rank, within the
  timeout; none falls back alone.
* An op registered with ``include_fallback=False`` (no eager default among
  its choices, since torch 2.15.0): under both paths the decompositions alone
  compete, the eager implementation never runs, and the fastest wins.
* Identical nodes are tuned once: three nodes of one op on equal inputs,
  each followed by ``relu(y * 0.5 + (i + 1))`` (constants differ; an
  ``+ 0`` would be removed before lowering, a different epilogue), share one
  benchmark; a fourth on another input size gets its own.  Counted by the
  benchmarker (2 ops benchmarked, 2 nodes sharing), every candidate ran
  exactly the warmup and timed runs of 2 ops, and all four nodes run the
  expected winner on every rank with the exact result.
* Decisions are shared within a process: an op tuned under V1, then the same
  op in a new graph under V2, followed by an epilogue that no candidate's
  tail can fuse with (so V2 times them alone, under V1's key), and the
  reverse: the second compile benchmarks nothing (every rank remembers the
  decision), runs no candidate while compiling, and runs the same winner.
* The inlined winner adds no kernel: with ``include_fallback=False`` and,
  in turn, the in-place all_reduce, one whose result is a reshape of its
  all_gather's buffer, and one whose result is a slice of its buffer at an
  offset winning, ``ar(x) @ w`` and ``ar(x) + 1`` launch as many generated
  kernels under V2 as under V1 (the collective's buffer, or the view of it,
  becomes the op's; no copy of it follows), the winner asserted on every
  rank and the results exact.
* A group's benchmark inputs and outputs are freed when its session ends
  (one rank): none is alive while the winners are inlined.
"""

from __future__ import annotations

import gc
import os
import re
import time
from unittest import mock

import pytest

import torch
import torch.distributed as dist
from torch._dynamo.utils import counters
from torch._inductor import config
from torch._inductor.kernel.custom_op import (
    CustomOpConfig,
    register_custom_op_autotuning,
)
from torch._inductor.runtime.benchmarking import benchmarker
from torch._inductor.utils import run_and_get_code
from torch.testing import FileCheck
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed.collective_autotuning_utils import (
    forget_remembered_decisions,
    OneRankGlooTestCase,
    RankProcessesTestCase,
)

from test_collective_autotuning_ranks import (
    DELAY_MS,
    HANG_BOUND_S,
    NRUNS,
    NWARMUP,
    RAN,
    SLOW_MS,
    _group,
    _group_name,
    _wait,
    all_reduce_op,
    all_reduce_direct,
    all_reduce_rs_ag,
    funcol,
    probe,
    tuning_config,
    tp_all_reduce_direct,
    tp_all_reduce_op,
    tp_all_reduce_rs_ag,
)

# The fusion case: an all_reduce of a column, broadcast to WIDTH columns
# (64 MB).  Unfused, the broadcast is written, then read and written again by
# the epilogue; fused, the output is written once.  The fusing candidate is
# slowed by a third of what that saved pass costs on this machine (measured by
# one_memory_pass_ms, not assumed): alone it is a third of a pass slower than
# the default, with the epilogue two thirds faster, margins of about a third of
# either side's time, whatever the machine's memory bandwidth.
ROWS = 4096
WIDTH = 4096


@torch.library.custom_op("collective_autotune_test::broadcast_sum", mutates_args=())
def broadcast_sum_op(x: torch.Tensor, width: int) -> torch.Tensor:
    out = probe(x, "default")
    dist.all_reduce(out, group=_group())
    return out.expand(x.shape[0], width).clone()


@broadcast_sum_op.register_fake
def _(x: torch.Tensor, width: int) -> torch.Tensor:
    return x.new_empty((x.shape[0], width))


def broadcast_sum_fused_tail(x, width):
    # The broadcast is a pointwise op of the compiled graph: once inlined, it
    # fuses with a pointwise epilogue, and the output is written once.
    total = _wait(funcol.all_reduce(probe(x, "fused_tail"), "sum", _group_name()))
    return total.expand(x.shape[0], width).clone()


def broadcast_sum_direct(x, width):
    # Ends in a custom op (the probe copies the broadcast): nothing for the
    # epilogue to fuse with, so it keeps its own compilation under V2.
    total = _wait(funcol.all_reduce(x, "sum", _group_name()))
    return probe(total.expand(x.shape[0], width), "direct")


def one_memory_pass_ms(rows: int, width: int) -> float:
    """This rank's median time, in ms, of the pass that fusion saves: read a
    ``rows x width`` float tensor and write a new one (the epilogue's add)."""
    y = torch.ones(rows, width)
    bias = torch.zeros(width)
    return benchmarker.benchmark_cpu(lambda: y + bias)


def register_direct_and_rs_ag(**kwargs) -> None:
    """Register all_reduce_op's two implementations, direct and reduce_scatter + all_gather."""
    register_custom_op_autotuning(
        all_reduce_op,
        configs=[CustomOpConfig(all_reduce_direct), CustomOpConfig(all_reduce_rs_ag)],
        **kwargs,
    )


def all_reduce_reshaped(x):
    """An all_reduce whose result is a view (a reshape) of its all_gather's buffer."""
    world = dist.get_world_size()
    flat = probe(x, "reshaped").reshape(-1)
    shard = _wait(funcol.reduce_scatter_tensor(flat, "sum", world, _group_name()))
    gathered = _wait(funcol.all_gather_into_tensor(shard, world, _group_name()))
    return gathered.view_as(x)


def all_reduce_sliced(x):
    """An all_reduce whose result is a view at an offset: the second of two
    copies of ``x``, reduced together."""
    pair = torch.stack([x, probe(x, "sliced")])
    return _wait(funcol.all_reduce(pair, "sum", _group_name()))[1]


def kernel_launches(code: str) -> int:
    """How many generated (C++) kernels the ``call`` of a program's module launches."""
    call = code[code.index("def call") :]
    return len(re.findall(r"cpp_fused_\w+\(", call[: call.index("return")]))


def forget_decisions() -> None:
    """A fresh start for the next compile: no compiled frame, no collective decision
    remembered in this process or stored in this rank's cache directory."""
    import shutil

    from torch._inductor.runtime.cache_dir_utils import cache_dir

    torch._dynamo.reset()
    forget_remembered_decisions()
    shutil.rmtree(os.path.join(cache_dir(), "collective_decisions"), ignore_errors=True)


@config.patch(collective_benchmark_strict=True)
class DeferredCollectiveAutotuningTest(RankProcessesTestCase):
    WORLD_SIZE = 2
    TIMEOUT_S = 10.0

    def _config(self, defer: bool, **patches):
        return tuning_config(
            defer, collective_benchmark_timeout=self.TIMEOUT_S, **patches
        )

    def _ran_everywhere(self, ran_here: list[str]) -> list[list[str]]:
        gathered: list = [None] * self.world_size
        dist.all_gather_object(gathered, ran_here)
        return gathered

    def test_one_presync_per_group_per_graph(self):
        # Same ranks, another group: its ops form a session of their own.
        tp_group = dist.new_group(list(range(self.world_size)))
        register_direct_and_rs_ag()
        register_custom_op_autotuning(
            tp_all_reduce_op,
            configs=[
                CustomOpConfig(tp_all_reduce_direct),
                CustomOpConfig(tp_all_reduce_rs_ag),
            ],
        )
        DELAY_MS.clear()
        DELAY_MS.update(
            {"default": SLOW_MS, "direct": SLOW_MS}
        )  # rs_ag wins everywhere

        def program(x):
            a = all_reduce_op(x) + 1
            b = all_reduce_op(a * 2)
            c = tp_all_reduce_op(b, tp_group.group_name)
            return all_reduce_op(c - 3)

        x = torch.full((24, 8), float(self.rank + 1))
        world = self.world_size
        a = sum(r + 1 for r in range(world)) + 1
        expected = torch.full((24, 8), float(world * (world * world * 2 * a - 3)))
        presyncs, how = {}, {}
        for defer in (False, True):
            forget_decisions()
            counters.clear()
            with self._config(defer):
                compiled = torch.compile(program)
                compiled(x)
                stats = counters["collective_autotuning"]
                presyncs[defer] = stats["presync"]
                # The three world ops are identical: benchmarked once.  V1
                # adopts the remembered decision at the later ops' joins, V2
                # shares it within its one session.
                how[defer] = (stats["ops"], stats["recalled"], stats["shared"])
                RAN.clear()
                result = compiled(x)
            self.assertEqual(self._ran_everywhere(list(RAN)), [["rs_ag"] * 4] * world)
            torch.testing.assert_close(result, expected, rtol=0, atol=0)
        self.assertEqual(presyncs, {False: 4, True: 2})
        self.assertEqual(how, {False: (2, 2, 0), True: (2, 0, 2)})

    # Its winner rests on a third of a memory pass: under CI's two streams it
    # runs alone (test/conftest.py).
    @pytest.mark.quiet_machine
    def test_choice_weighs_the_fused_epilogue(self):
        torch.set_num_threads(
            1
        )  # two ranks on two cores: timings without oversubscription
        register_custom_op_autotuning(
            broadcast_sum_op,
            configs=[
                CustomOpConfig(broadcast_sum_direct),
                CustomOpConfig(broadcast_sum_fused_tail),
            ],
        )
        DELAY_MS.clear()
        DELAY_MS.update(
            {"fused_tail": one_memory_pass_ms(ROWS, WIDTH) / 3, "direct": SLOW_MS}
        )
        bias = torch.linspace(-3 * self.world_size, 3 * self.world_size, WIDTH)

        def program(x):
            return torch.relu(broadcast_sum_op(x, WIDTH) + bias)

        x = (
            torch.arange(ROWS, dtype=torch.float32).view(ROWS, 1)
            * (self.rank + 1)
            / ROWS
        )
        expected = torch.relu(
            x / (self.rank + 1) * sum(r + 1 for r in range(self.world_size)) + bias
        )
        # At the default confidence (0.95) the sign test forgives no lost
        # paired run out of NRUNS, and 6 out of 4 * NRUNS + 1: a few runs that
        # a busy machine disturbs must not keep the default.
        nruns = 4 * NRUNS + 1
        winners, codes, ran_while_compiling = {}, {}, {}
        for defer in (False, True):
            forget_decisions()
            # Not raced: the run counts below say that no candidate failed.
            with self._config(
                defer,
                collective_benchmark_nruns=nruns,
                collective_benchmark_race_every=0,
            ):
                compiled = torch.compile(program)
                RAN.clear()
                result, codes[defer] = run_and_get_code(compiled, x)
                ran_while_compiling[defer] = {
                    name: RAN.count(name) for name in ("direct", "fused_tail")
                }
                RAN.clear()
                compiled(x)
            torch.testing.assert_close(result, expected)
            (winners[defer],) = RAN
            self.assertEqual(
                self._ran_everywhere(list(RAN)), [[winners[defer]]] * self.world_size
            )
        self.assertEqual(winners, {False: "default", True: "fused_tail"})
        # Every candidate timed in every run: none failed.
        per_op = NWARMUP + nruns
        self.assertEqual(
            ran_while_compiling,
            {
                False: {"direct": per_op, "fused_tail": per_op},
                True: {"direct": per_op, "fused_tail": per_op + 1},
            },
        )
        # V2's benchmark modules: the fusing candidate compiled with the
        # epilogue; the other one alone, as V1 compiles it; one epilogue
        # module that it and the default share.
        names = [
            name
            for code in codes[True][:-1]
            for name in set(re.findall(r"benchmark_(\w+?)_arg\d+_\d+", code))
        ]
        fused = [name for name in names if name.endswith("_with_epilogue")]
        shared = [n for n in names if n.endswith("_epilogue") and n not in fused]
        alone = [name for name in names if not name.endswith("_epilogue")]
        self.assertEqual((len(fused), len(shared), len(alone)), (1, 1, 1), names)
        self.assertIn("fused_tail", fused[0])
        self.assertIn("direct", alone[0])
        # The program's own module is compiled last, after the candidates'
        # benchmark modules.  V2: after the candidate's all_reduce, one kernel
        # computes the broadcast (the candidate's tail), the add and the relu
        # (the epilogue).  V1: the eager op, then the epilogue's own kernel.
        v2_program, v1_program = codes[True][-1], codes[False][-1]
        FileCheck().check("def call").check("_c10d_functional.all_reduce_").check(
            "_c10d_functional.wait_tensor"
        ).check_regex(r"cpp_fused_add_broadcast_sum_relu_\d+\(").check("return").run(
            v2_program
        )
        call = v2_program[v2_program.index("def call") :]
        after_collective = call[call.index("wait_tensor") : call.index("return")]
        self.assertEqual(
            len(re.findall(r"cpp_fused_\w+\(", after_collective)), 1, after_collective
        )
        FileCheck().check("def call").check(
            "collective_autotune_test.broadcast_sum.default("
        ).check_regex(r"cpp_fused_add_relu_\d+\(").run(v1_program)

    def test_choices_without_the_eager_fallback(self):
        register_direct_and_rs_ag(include_fallback=False)
        DELAY_MS.clear()
        DELAY_MS["direct"] = SLOW_MS
        x = torch.full((24, 8), float(self.rank + 1))
        expected = torch.full(
            (24, 8), float(sum(r + 1 for r in range(self.world_size)) + 1)
        )
        for defer in (False, True):
            forget_decisions()
            with self._config(defer):
                compiled = torch.compile(lambda x: all_reduce_op(x) + 1)
                RAN.clear()
                compiled(x)
                self.assertEqual(
                    sorted(set(RAN)), ["direct", "rs_ag"]
                )  # the eager op is no candidate
                RAN.clear()
                result = compiled(x)
            self.assertEqual(
                self._ran_everywhere(list(RAN)), [["rs_ag"]] * self.world_size
            )
            torch.testing.assert_close(result, expected, rtol=0, atol=0)

    def test_inlined_winner_adds_no_kernel(self):
        # The winner's result is a buffer its collective made in the op's
        # layout (direct: the all_reduce_ of a copy of its input), or a view
        # of one (reshaped; sliced, at an offset): V2 makes that buffer, or
        # that view, the op's, as V1 hands it to the op's users, and copies
        # nothing.  A copy would be a kernel of its own before the matmul,
        # and fuse into the add.
        w = torch.arange(32, dtype=torch.float32).view(8, 4)
        programs = {
            "matmul": lambda x: all_reduce_op(x) @ w,
            "add": lambda x: all_reduce_op(x) + 1,
        }
        x = torch.full((24, 8), float(self.rank + 1))
        total = torch.full((24, 8), float(sum(r + 1 for r in range(self.world_size))))
        expected = {"matmul": total @ w, "add": total + 1}
        kernels = {}
        winners = [
            ("direct", all_reduce_direct),
            ("reshaped", all_reduce_reshaped),
            ("sliced", all_reduce_sliced),
        ]
        for winner, implementation in winners:
            register_custom_op_autotuning(
                all_reduce_op,
                configs=[
                    CustomOpConfig(implementation),
                    CustomOpConfig(all_reduce_rs_ag),
                ],
                include_fallback=False,
            )
            DELAY_MS.clear()
            DELAY_MS["rs_ag"] = SLOW_MS  # the winner wins
            for name, program in programs.items():
                for defer in (False, True):
                    forget_decisions()
                    # No FX graph cache: each compile generates its program here.
                    with self._config(defer, fx_graph_cache=False):
                        compiled = torch.compile(program)
                        _, codes = run_and_get_code(compiled, x)
                        RAN.clear()
                        result = compiled(x)
                    self.assertEqual(
                        self._ran_everywhere(list(RAN)), [[winner]] * self.world_size
                    )
                    torch.testing.assert_close(result, expected[name], rtol=0, atol=0)
                    # The program's own module is compiled last.
                    kernels[winner, name, defer] = kernel_launches(codes[-1])
        # V1: the copy that the all_reduce_ reduces in place (of the stacked
        # pair, sliced), then the add's kernel (none for the matmul, an extern
        # kernel); reshaped: the add's kernel only.  V2: the same.
        self.assertEqual(
            kernels,
            {
                (winner, name, defer): count
                for winner, counts in (
                    ("direct", {"matmul": 1, "add": 2}),
                    ("reshaped", {"matmul": 0, "add": 1}),
                    ("sliced", {"matmul": 1, "add": 2}),
                )
                for name, count in counts.items()
                for defer in (False, True)
            },
        )

    def test_identical_nodes_are_tuned_once(self):
        register_direct_and_rs_ag()
        DELAY_MS.clear()
        DELAY_MS.update({"default": SLOW_MS, "direct": SLOW_MS})  # rs_ag wins

        def program(x, small):
            for i in range(3):
                x = torch.relu(all_reduce_op(x) * 0.5 + (i + 1))
            return x, all_reduce_op(small)

        x = torch.full((24, 8), float(self.rank + 1))
        small = torch.full((12, 8), float(self.rank + 1))
        world = self.world_size
        expected = torch.full((24, 8), float(sum(r + 1 for r in range(world))))
        for i in range(3):
            expected = torch.relu((expected * world if i else expected) * 0.5 + (i + 1))
        counters.clear()
        with self._config(True):
            compiled = torch.compile(program)
            RAN.clear()
            compiled(x, small)
            self.assertEqual(counters["collective_autotuning"]["ops"], 2)
            self.assertEqual(counters["collective_autotuning"]["shared"], 2)
            ran_while_compiling = {
                name: RAN.count(name) for name in ("default", "direct", "rs_ag")
            }
            RAN.clear()
            result, small_result = compiled(x, small)
        per_op = NWARMUP + NRUNS
        # Two ops benchmarked (the default's timed runs twice: its twin
        # measures the noise floor; and once more on the absolute values of
        # its inputs, for the screening bound); the compiling call then runs
        # rs_ag for all four nodes.
        self.assertEqual(
            ran_while_compiling,
            {
                "default": 2 * (per_op + NRUNS + 1),
                "direct": 2 * per_op,
                "rs_ag": 2 * per_op + 4,
            },
        )
        self.assertEqual(self._ran_everywhere(list(RAN)), [["rs_ag"] * 4] * world)
        torch.testing.assert_close(result, expected, rtol=0, atol=0)
        torch.testing.assert_close(
            small_result, torch.full((12, 8), float(sum(r + 1 for r in range(world))))
        )

    def test_decisions_are_shared_within_a_process(self):
        register_direct_and_rs_ag()
        DELAY_MS.clear()
        DELAY_MS.update({"default": SLOW_MS, "rs_ag": SLOW_MS})  # direct wins
        expected = torch.full(
            (24, 8), float(sum(r + 1 for r in range(self.world_size)))
        )
        for first, second, shape in ((False, True, (24, 8)), (True, False, (16, 8))):
            x = torch.full(shape, float(self.rank + 1))
            ran = {}
            for defer in (first, second):
                torch._dynamo.reset()
                counters.clear()
                with self._config(defer):
                    # A fresh function each time: its own graph.  Every
                    # candidate ends in its collective: V2 times them alone.
                    compiled = torch.compile(lambda x: all_reduce_op(x) * 2)
                    RAN.clear()
                    compiled(x)
                    ran[defer] = (list(RAN), dict(counters["collective_autotuning"]))
                    RAN.clear()
                    result = compiled(x)
                self.assertEqual(
                    self._ran_everywhere(list(RAN)), [["direct"]] * self.world_size
                )
                torch.testing.assert_close(
                    result, 2 * expected[: shape[0]], rtol=0, atol=0
                )
            first_ran, first_counts = ran[first]
            second_ran, second_counts = ran[second]
            self.assertEqual(
                (first_counts["ops"], first_counts.get("recalled", 0)), (1, 0)
            )
            self.assertGreater(len(first_ran), 3 * NWARMUP)
            self.assertEqual(
                (second_counts.get("ops", 0), second_counts["recalled"]), (0, 1)
            )
            self.assertEqual(
                second_ran, ["direct"]
            )  # only the compiling call's own run

    def test_mismatched_node_lists_fail_on_every_rank(self):
        register_direct_and_rs_ag()
        DELAY_MS.clear()

        def two_ops(x):
            return all_reduce_op(all_reduce_op(x) + 1)

        def one_op(x):
            return all_reduce_op(x) + 1

        start = time.monotonic()
        with (
            self._config(True),
            self.assertRaisesRegex(
                Exception,
                r"not tuning the same ops \(op counts by rank: \[1, 1\]; they first differ at op 0; on this rank it is "
                r".*the group's collective nodes \[0(, 1)?\]",
            ),
        ):
            torch.compile(two_ops if self.rank == 0 else one_op)(torch.ones(24, 8))
        self.assertLess(time.monotonic() - start, HANG_BOUND_S)


@config.patch(collective_benchmark_strict=True)
class BenchmarkBuffersTest(OneRankGlooTestCase):
    """V2 frees a group's benchmark buffers when its session ends, on one gloo rank."""

    def test_no_benchmark_buffer_outlives_its_session(self):
        from torch._inductor.collective_autotuning import deferred_tuning

        rows, cols = 37, 53  # a shape no other tensor of the test has

        def alive() -> int:
            gc.collect()
            # type(), not isinstance(): a deprecated module attribute among the
            # objects warns when asked for its __class__.
            return sum(
                issubclass(type(o), torch.Tensor)
                and not issubclass(type(o), torch._subclasses.FakeTensor)
                and tuple(o.shape) == (rows, cols)
                for o in gc.get_objects()
            )

        inlined = deferred_tuning.inline_winners
        alive_while_inlining = []

        def inline_winners(*args, **kwargs):
            alive_while_inlining.append(alive())
            return inlined(*args, **kwargs)

        forget_decisions()
        register_direct_and_rs_ag()
        x = torch.ones(rows, cols)
        exchanges = counters["collective_autotuning"]["exchanges"]
        with (
            mock.patch.object(deferred_tuning, "inline_winners", inline_winners),
            tuning_config(True, fx_graph_cache=False),
        ):
            result = torch.compile(lambda x: all_reduce_op(x) + 1)(x)
        # One session benchmarked the op (its exchange ran).
        self.assertEqual(counters["collective_autotuning"]["exchanges"], exchanges + 1)
        # Only the program's input is left: no candidate's input, output or
        # reference copy of the session.
        self.assertEqual(alive_while_inlining, [1])
        torch.testing.assert_close(result, x + 1, rtol=0, atol=0)


if __name__ == "__main__":
    run_tests()
