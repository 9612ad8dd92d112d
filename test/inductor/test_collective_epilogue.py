"""When V2 times collective candidates together with their epilogue, read from their graphs (no ranks).

What this checks (``torch/_inductor/collective_autotuning/epilogue.py``):

* Each candidate's tail is read from its graph's last op (``TailFusion``: a
  collective, its wait, a view of it, a custom op or the eager default end in
  a buffer of their own; a pointwise op fuses; a reduction may; a
  concatenation does not on CPU and may on GPU).
* The candidates are timed with the epilogue only when their tails differ:
  where they are alike, the epilogue adds the same work to every candidate.
* The epilogue's structure (in the tuning key) leaves out the scalar
  operands of arithmetic, not those of other ops (an exponent).

The multi-rank case (a candidate that is slower alone wins once timed with
the epilogue it fuses with) is ``test_choice_weighs_the_fused_epilogue`` in
``test_collective_autotuning_deferred.py``.
"""

from __future__ import annotations

import functools
import types
from unittest import mock

import torch
from torch._inductor.collective_autotuning import epilogue
from torch._inductor.collective_autotuning.epilogue import (
    Epilogue,
    epilogue_to_time_with,
    tail_fusion,
    TailFusion,
)
from torch._inductor.decomposition import select_decomp_table
from torch.fx.experimental.proxy_tensor import make_fx
from torch.testing._internal.common_utils import run_tests, TestCase

from test_collective_autotuning_ranks import _wait, funcol, probe


class TailFusionTest(TestCase):
    """Which candidates are timed with the epilogue, read from their graphs (no ranks)."""

    @staticmethod
    def choice(fn, *shape: int) -> types.SimpleNamespace:
        # A candidate's graph as the autotuner traces it; functional
        # collectives trace on fake tensors without a process group.
        gm = make_fx(
            fn, decomposition_table=select_decomp_table(), tracing_mode="fake"
        )(torch.ones(*shape))
        return types.SimpleNamespace(gm=gm)

    def tails(self, device: str) -> dict[str, TailFusion]:
        def all_reduce(x):
            return _wait(funcol.all_reduce(x, "sum", "0"))

        def gather_sum(x):
            gathered = _wait(funcol.all_gather_into_tensor(x.reshape(1, -1), 2, "0"))
            return gathered.sum(0).view_as(x)

        def chunked(x):
            pieces = [all_reduce(piece) for piece in x.reshape(-1).tensor_split(2)]
            return torch.cat(pieces).view_as(x)

        choices = {
            "default": types.SimpleNamespace(),  # the eager op: no graph
            "wait": self.choice(all_reduce, 8, 4),
            "view of wait": self.choice(lambda x: all_reduce(x).view(4, 8)[1:], 8, 4),
            "custom op": self.choice(lambda x: probe(all_reduce(x), "p"), 8, 4),
            "pointwise": self.choice(lambda x: all_reduce(x) * 2, 8, 4),
            "pointwise, viewed": self.choice(lambda x: (all_reduce(x) + 1).t(), 8, 4),
            "reduction": self.choice(gather_sum, 8, 4),
            "concatenation": self.choice(chunked, 8, 4),
        }
        return {
            name: tail_fusion(choice, torch.device(device))
            for name, choice in choices.items()
        }

    def test_tails(self):
        separate, fuses, maybe = TailFusion.SEPARATE, TailFusion.FUSES, TailFusion.MAYBE
        common = {
            "default": separate,
            "wait": separate,
            "view of wait": separate,
            "custom op": separate,
            "pointwise": fuses,
            "pointwise, viewed": fuses,
            "reduction": maybe,
        }
        self.assertEqual(self.tails("cpu"), {**common, "concatenation": separate})
        self.assertEqual(self.tails("cuda"), {**common, "concatenation": maybe})

    def test_timed_with_the_epilogue_only_where_tails_differ(self):
        epilogue = object()  # stands for Epilogue.find's result
        choices = {
            "wait": self.choice(lambda x: _wait(funcol.all_reduce(x, "sum", "0")), 8),
            "pointwise": self.choice(
                lambda x: _wait(funcol.all_reduce(x, "sum", "0")) + 1, 8
            ),
            "reduction": self.choice(lambda x: x.view(2, 4).sum(0), 8),
        }
        default = types.SimpleNamespace()
        timed_with = functools.partial(
            epilogue_to_time_with, epilogue=epilogue, device=torch.device("cpu")
        )
        cases = {
            # Alike: the epilogue adds the same to every candidate.
            ("default", "wait"): None,
            ("pointwise",): None,
            ("pointwise", "pointwise"): None,
            # Different, or unknown: timed with the epilogue.
            ("default", "pointwise"): epilogue,
            ("wait", "reduction"): epilogue,
            ("reduction",): epilogue,
        }
        for names, expected in cases.items():
            candidates = [default if n == "default" else choices[n] for n in names]
            self.assertIs(timed_with(candidates), expected, names)
        self.assertIsNone(
            epilogue_to_time_with([default, choices["pointwise"]], None, None)
        )


class StructureTest(TestCase):
    """What of an epilogue enters the tuning key, read from the graph (no ranks)."""

    @staticmethod
    def structure(scale: float, shift: int, exponent: float) -> str:
        def program(x, bias):
            y = x.clone()  # stands for the collective node
            return torch.relu(torch.pow(y * scale + shift, exponent) + bias)

        gm = make_fx(program, tracing_mode="fake")(torch.ones(4, 8), torch.ones(8))
        (node,) = gm.graph.find_nodes(
            op="call_function", target=torch.ops.aten.clone.default
        )
        bias = types.SimpleNamespace(
            get_size=lambda: [8], get_stride=lambda: [1], get_dtype=lambda: torch.float
        )
        with mock.patch.object(epilogue, "_lowered_input", lambda arg: bias):
            found = Epilogue.find(types.SimpleNamespace(fx_node=node))
        return found.structure

    def test_scalars_of_arithmetic_are_left_out(self):
        self.assertEqual(self.structure(0.5, 1, 2.0), self.structure(0.25, 3, 2.0))
        self.assertNotEqual(self.structure(0.5, 1, 2.0), self.structure(0.5, 1, 3.0))


if __name__ == "__main__":
    run_tests()
