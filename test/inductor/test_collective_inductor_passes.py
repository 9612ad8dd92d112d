"""Collective autotuning beside Inductor's own passes that issue collectives.

A collective autotuning candidate's compile is a nested Inductor
compilation that runs on the members of the op's group only, and not on all
of them alike (a compile that raises stops early).  An Inductor pass that
issues a collective over the job's ranks while it compiles a graph
(distributed GEMM tuning's all-gather, runtime estimations aligned across
ranks, the SPMD check) would wait there for ranks that never issue it, or
pair with another graph's collective by accident.
What this checks:

* Without ranks: every file of the installed Inductor that issues a
  collective while compiling is one whose pass
  ``candidate_compile_settings`` switches off, and it does switch each off.
  A torch that gains such a pass fails here until its switch is added.
* Max-autotune with ``distributed_max_autotune_gemm`` beside collective
  autotuning, a GEMM before the autotuned op, at 2 ranks on V2 and 3 on V1
  (``TestCollectiveInductorPasses2RanksV2``, ``...3RanksV1``): the known winner
  wins, every rank runs it, the result is exact, and distributed
  autotune's all-gather ran once on every rank (the program's graph), never
  in a candidate's compile.
"""

from __future__ import annotations

import collections
import re
from pathlib import Path
from unittest import mock

import torch
import torch._inductor.config as inductor_config
import torch._inductor.config_comms as inductor_config_comms
from torch._dispatch.python import no_python_dispatcher
from torch._inductor import distributed_autotune
from torch._inductor.collective_autotuning.settings import candidate_compile_settings
from torch._inductor.kernel.custom_op import (
    CustomOpConfig,
    register_custom_op_autotuning,
)
from torch.testing._internal.common_utils import run_tests, TestCase

from test_collective_autotuning_ranks import (
    all_reduce_direct,
    all_reduce_op,
    all_reduce_rs_ag,
    AutotuningTestMixin,
    COLS,
    DELAY_MS,
    RAN,
    SLOW_MS,
    StrictRankProcessesTestCase,
    tuning_config,
)


# A c10d collective, or a group's creation (a collective of its own), called
# from Python.
_COLLECTIVE_CALL = re.compile(
    r"\b(?:dist|distributed|distributed_c10d)\.(?:all_gather_object|"
    r"broadcast_object_list|gather_object|scatter_object_list|all_gather|"
    r"all_reduce|broadcast|barrier|monitored_barrier|all_gather_into_tensor|"
    r"reduce_scatter_tensor|all_to_all_single|new_group|split_group|"
    r"_new_group_with_tag)\("
)
# Where collective autotuning itself issues collectives: on its own channel,
# or inside the candidates it runs.
_OWN = (
    "collective_autotuning/",
    "runtime/collective_benchmarking/",
    "kernel/collective_implementations.py",
)
# Each Inductor file that issues a collective while compiling, and the switch
# of its pass: (config module, knob).
_PASSES = {
    "comms.py": (
        inductor_config_comms,
        "runtime_estimations_align_across_all_distributed_ranks",
    ),
    "distributed_autotune.py": (inductor_config, "distributed_max_autotune_gemm"),
    "fx_passes/overlap_scheduling.py": (
        inductor_config,
        "aten_distributed_optimizations.enable_overlap_scheduling",
    ),
    "fx_passes/spmd_check.py": (
        inductor_config,
        "aten_distributed_optimizations.spmd_check",
    ),
}


def _read(module, knob: str):
    value = module
    for part in knob.split("."):
        value = getattr(value, part)
    return value


class TestCandidateCompileSettings(TestCase):
    def test_every_compile_time_collective_of_inductor_is_switched_off(self):
        root = Path(inductor_config.__file__).parent
        issuing = sorted(
            path.relative_to(root).as_posix()
            for path in root.rglob("*.py")
            if not path.relative_to(root).as_posix().startswith(_OWN)
            and _COLLECTIVE_CALL.search(path.read_text())
        )
        self.assertEqual(issuing, sorted(_PASSES))
        switched_on = {
            knob: True for module, knob in _PASSES.values() if module is inductor_config
        }
        with (
            inductor_config.patch(switched_on),
            inductor_config_comms.patch(
                runtime_estimations_align_across_all_distributed_ranks=True
            ),
        ):
            with candidate_compile_settings():
                self.assertEqual(
                    {knob: _read(module, knob) for module, knob in _PASSES.values()},
                    {knob: False for _, knob in _PASSES.values()},
                )
            # The program's own compile keeps them.
            self.assertTrue(inductor_config.distributed_max_autotune_gemm)


class InductorPassesTests(AutotuningTestMixin):
    """Distributed GEMM tuning beside collective autotuning, per path and world size."""

    def test_distributed_gemm_tuning_beside_collective_autotuning(self):
        device = self._init_rank()
        winner = "rs_ag"
        DELAY_MS.update({"default": SLOW_MS, "direct": SLOW_MS})
        register_custom_op_autotuning(
            all_reduce_op,
            configs=[
                CustomOpConfig(all_reduce_direct),
                CustomOpConfig(all_reduce_rs_ag),
            ],
        )
        weight = 2 * torch.eye(COLS, device=device)  # exact in any GEMM

        def program(x):
            return all_reduce_op(x @ weight) + 1

        original_sync = distributed_autotune._sync

        def sync_without_python_dispatcher(*args, **kwargs):
            # Upstream's _sync gathers over gloo inside compile_fx's
            # enable_python_dispatcher(), where a gloo collective can deadlock
            # (docs/upstream/gloo-python-dispatcher-deadlock.md; CI hung twice
            # here at 3 ranks, every rank in its all_gather_object).  Not this
            # stack's collective: run it as the stack runs its candidates.
            with no_python_dispatcher():
                return original_sync(*args, **kwargs)

        syncs = mock.patch.object(
            distributed_autotune, "_sync", wraps=sync_without_python_dispatcher
        )
        with (
            tuning_config(
                self.DEFER,
                max_autotune=True,
                distributed_max_autotune_gemm=True,
                # On a stack whose candidate compiles issue collectives, a
                # rank waits this long for a peer's compile, not 10 minutes.
                collective_benchmark_max_wait=60,
            ),
            syncs as sync,
        ):
            compiled = torch.compile(program)
            RAN.clear()
            compiled(self._input(self.rank, device))
            ran_while_compiling = collections.Counter(RAN)
            RAN.clear()
            result = compiled(self._input(self.rank, device))
        # Every rank gathers before any asserts: a rank that failed first
        # would leave its peers in the gather (a hang on CI, not a failure).
        self._assert_agreed_winner(list(RAN), winner)
        # The program's graph took part in distributed GEMM tuning, once on
        # every rank; no candidate's compile did.
        self.assertEqual(sync.call_count, 1)
        self.assertGreater(ran_while_compiling[winner], 1)  # it was benchmarked
        inputs = [self._input(r, device) for r in range(self.world_size)]
        expected = sum(2 * peer for peer in inputs) + 1
        torch.testing.assert_close(result, expected, rtol=0, atol=0)


# Each path once, at 2 and 3 ranks: the passes run in the compile, before
# and around the session, whichever path holds it.
for _world_size, _path, _defer in ((2, "V2", True), (3, "V1", False)):
    _name = f"TestCollectiveInductorPasses{_world_size}Ranks{_path}"
    globals()[_name] = type(
        _name,
        (InductorPassesTests, StrictRankProcessesTestCase),
        {"WORLD_SIZE": _world_size, "DEFER": _defer, "__module__": __name__},
    )


if __name__ == "__main__":
    run_tests()
