"""Collective autotuning with CUDA tensors, as users run it on one GPU (skipped without CUDA).

What this checks, under V1 and V2, in each configuration one GPU allows:

* gloo with CUDA tensors at 2, 3 and 4 ranks, every rank on cuda:0
  (``GlooCuda{2,3,4}Ranks``);
* NCCL at 1 rank (``Nccl1Rank``; NCCL refuses two ranks on one device);
* ``init_process_group()`` without a backend at 1 rank (``BareInit1Rank``:
  ``cpu:gloo,cuda:nccl``).

In each: a known winner, timed with CUDA events (the decision artifact's
``timer``); a candidate that raises on the last rank, disqualified
everywhere while the next best wins; the library's implementations of all
four collectives in one program, every rank running the same ones (on gloo
none calls the functional all_gather, which crashes it with CUDA tensors,
pytorch/pytorch#152645); and, under V2, a winner whose pointwise tail is
fused with the op's epilogue into one Triton kernel.  Every test asserts the
winner, that every rank ran it, and the exact result.

With ``COLLECTIVE_GPU_REPORT`` set, rank 0 appends a JSON line per decision
to that file (``scripts/gpu_check.sh`` prints them as one table).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import unittest
from unittest import mock

import torch
import torch.distributed as dist
from torch._inductor.kernel.collective_implementations import (
    register_collective_implementations,
)
from torch._inductor.kernel.custom_op import (
    CustomOpConfig,
    register_custom_op_autotuning,
)
from torch._inductor.utils import run_and_get_code
from torch.testing._internal.common_utils import run_tests

from test_collective_autotuning_ranks import (
    _expected,
    _group_name,
    _wait,
    all_reduce_candidate,
    all_reduce_op,
    AutotuningTestMixin,
    DELAY_MS,
    Fault,
    funcol,
    NRUNS,
    probe,
    SLOW_DEFAULT_MS,
    SLOW_MS,
    StrictRankProcessesTestCase,
    tuning_config,
)

from test_collective_implementations import (
    _expected as _library_expected,
    _inputs as _library_inputs,
    OPS,
)


def all_reduce_fused_tail(x):
    """An all_reduce whose last op is pointwise (exact: a power-of-two scale)."""
    reduced = _wait(
        funcol.all_reduce(probe(x, "fused_tail") * 0.5, "sum", _group_name())
    )
    return reduced * 2


@contextlib.contextmanager
def decisions():
    """The decision artifacts' payloads published meanwhile, instead of tracing them."""
    from torch._inductor.runtime.collective_benchmarking import reporting

    payloads: list[dict] = []
    with mock.patch.object(
        reporting,
        "trace_structured",
        side_effect=lambda *a, **k: payloads.append(json.loads(k["payload_fn"]())),
    ):
        yield payloads


class CudaTests(AutotuningTestMixin):
    """The tests of every configuration; ``CONFIGURATION`` names it in the report."""

    CONFIGURATION = ""

    @classmethod
    def setUpClass(cls) -> None:
        if not torch.cuda.is_available():
            raise unittest.SkipTest("needs a GPU: CUDA tensors")
        super().setUpClass()  # type: ignore[misc]

    def _init_rank(self) -> torch.device:
        device = torch.device("cuda", 0)  # one GPU: every rank shares it
        torch.cuda.set_device(device)
        return device

    def _report(
        self, payloads: list[dict], winner: str, exact: bool, seconds: float
    ) -> None:
        path = os.environ.get("COLLECTIVE_GPU_REPORT")
        if not path or self.rank != 0:
            return
        with open(path, "a") as out:
            for payload in payloads:
                line = {
                    "configuration": self.CONFIGURATION,
                    "ranks": self.world_size,
                    "path": "V2" if self.DEFER else "V1",
                    "test": self._testMethodName,
                    "op": payload["op"],
                    "winner": payload["winner"],
                    "expected": winner,
                    "agreed": True,  # asserted before reporting
                    "exact": exact,
                    "seconds": round(seconds, 2),
                    "timer": payload.get("timer"),
                    "candidates": {
                        c["name"]: c["time_ms"] for c in payload["candidates"]
                    },
                }
                out.write(json.dumps(line) + "\n")

    def test_known_winner_timed_with_cuda_events(self):
        device = self._init_rank()
        with decisions() as payloads:
            start = time.monotonic()
            ran_while_compiling, ran_here, result, _ = self._autotune_beside_good(
                "fast", all_reduce_candidate("fast"), device
            )
            seconds = time.monotonic() - start
        self.assertGreaterEqual(ran_while_compiling["fast"], NRUNS)
        self._assert_agreed_winner(ran_here, "fast")
        inputs = [self._input(r, device) for r in range(self.world_size)]
        expected = _expected("all_reduce", inputs, self.rank) + 1
        torch.testing.assert_close(result, expected, rtol=0, atol=0)
        self.assertEqual(
            {p["timer"] for p in payloads}, {f"cuda events, {NRUNS} runs per candidate"}
        )
        self._report(payloads, "fast", True, seconds)

    def test_candidate_raising_on_the_last_rank_is_out_everywhere(self):
        last = self.world_size - 1
        with decisions() as payloads:
            start = time.monotonic()
            ran = self._check_faulty(
                {"raises": Fault("raise", [last], call=1)},
                fast=["raises"],
                winner="good",
            )
            seconds = time.monotonic() - start
        self.assertEqual(ran["raises"], 1)
        self._report(payloads, "good", True, seconds)

    def test_the_librarys_implementations_of_all_four_collectives(self):
        device = self._init_rank()
        group_name = dist.group.WORLD.group_name
        kinds = list(OPS)
        for kind in kinds:
            register_collective_implementations(OPS[kind], kind)
        inputs = {
            kind: _library_inputs(
                kind, self.world_size, torch.float32, self.world_size * 6, exact=True
            )
            for kind in kinds
        }

        def program(*xs):
            return [OPS[kind](x, group_name) for kind, x in zip(kinds, xs, strict=True)]

        DELAY_MS["default"] = SLOW_MS  # the defaults may not win: the library must run
        with decisions() as payloads, tuning_config(self.DEFER):
            start = time.monotonic()
            results, (*_, code) = run_and_get_code(
                torch.compile(program),
                *[inputs[k][self.rank].to(device) for k in kinds],
            )
            seconds = time.monotonic() - start
        for kind, result in zip(kinds, results, strict=True):
            expected = _library_expected(kind, inputs[kind], self.rank).to(device)
            self.assertTrue(torch.equal(result, expected), kind)
        call = code[code.index("def call") :]
        issued = re.findall(r"torch\.ops\.(\w+)\.(\w+)\.default", call)
        everywhere: list = [None] * self.world_size
        dist.all_gather_object(everywhere, issued)
        self.assertEqual(everywhere, [issued] * self.world_size)
        if self.backend == "gloo":
            self.assertNotIn(("_c10d_functional", "all_gather_into_tensor"), issued)
        self.assertEqual(len(payloads), len(kinds))
        self._report(payloads, "any of the library's", True, seconds)

    def test_the_winners_tail_fuses_with_the_epilogue(self):
        if not self.DEFER:
            raise unittest.SkipTest("V2 weighs and fuses the epilogue")
        device = self._init_rank()
        register_custom_op_autotuning(
            all_reduce_op,
            configs=[
                CustomOpConfig(all_reduce_fused_tail),
                CustomOpConfig(all_reduce_candidate("good")),
            ],
        )
        DELAY_MS.update({"default": SLOW_DEFAULT_MS, "good": SLOW_MS})
        x = self._input(self.rank, device)
        with decisions() as payloads, tuning_config(True):
            start = time.monotonic()
            result, (*_, code) = run_and_get_code(
                torch.compile(lambda x: torch.relu(all_reduce_op(x) + 1)), x
            )
            seconds = time.monotonic() - start
        inputs = [self._input(r, device) for r in range(self.world_size)]
        torch.testing.assert_close(
            result,
            torch.relu(_expected("all_reduce", inputs, self.rank) + 1),
            rtol=0,
            atol=0,
        )
        winners: list = [None] * self.world_size
        dist.all_gather_object(winners, [p["winner"] for p in payloads])
        self.assertEqual(len({repr(w) for w in winners}), 1)
        self.assertIn("fused_tail", payloads[0]["winner"])
        # One Triton kernel holds the tail (* 2) and the epilogue (+ 1, relu).
        kernels = re.findall(
            r"async_compile\.triton\('(\w+)', '''(.*?)'''", code, re.DOTALL
        )
        self.assertTrue(
            any("2.0" in source and "maximum" in source for _, source in kernels),
            code,
        )
        self._report(payloads, "fused_tail", True, seconds)


def _classes() -> None:
    configurations = {
        # name: (base settings, world sizes)
        "GlooCuda": ({"backend": "gloo"}, (2, 3, 4)),
        "Nccl": ({"backend": "nccl"}, (1,)),
        "BareInit": ({"backend": "nccl", "bare_init": True}, (1,)),
    }
    for name, (settings, sizes) in configurations.items():
        for size in sizes:
            for path, defer in (("V1", False), ("V2", True)):
                ranks = f"{size}Rank{'s' if size > 1 else ''}"
                cls_name = f"TestCollectiveCuda{name}{ranks}{path}"
                globals()[cls_name] = type(
                    cls_name,
                    (CudaTests, StrictRankProcessesTestCase),
                    {
                        **settings,
                        "WORLD_SIZE": size,
                        "DEFER": defer,
                        "CONFIGURATION": name,
                        "__module__": __name__,
                    },
                )


_classes()


if __name__ == "__main__":
    run_tests()
