"""Custom-op autotuning of ordinary (non-collective) ops, one process, on CPU.

The patch stack must not change what ``register_custom_op_autotuning`` does for
ops without collectives.  ``UpstreamFeaturesTest`` checks the documented
features as a user calls them, and runs unchanged on stock torch 2.15.0 (the
prefix check runs it there, see CONTRIBUTING.md): configs with parameters,
``config_generator``, ``input_gen_fns``, range dispatch (``dispatch_on`` +
``split_points``), ``min_speedup_threshold`` and ``include_fallback=False``.

``SchemaBindingTest`` checks what patch 0014 fixes: an op whose non-tensor
parameters stand before a tensor (``scaled_add(x, scale, bias)``) is called
with every argument in its place, by its implementations, by its eager
fallback, and for ``input_gen_fns``, ``config_generator`` and ``dispatch_on``.
On stock torch 2.15.0 its tests fail ("got multiple values for argument").

Which implementation ran is made known by the ``trace`` op: each
implementation calls it with its own name, and it can be made slow, so the
winner of a benchmark is known in advance.  Every test asserts the winner
(what ran in the compiled program) and the exact result.
"""

from __future__ import annotations

import time

import torch
from torch._inductor import config as inductor_config
from torch._inductor.kernel.custom_op import (
    CustomOpConfig,
    register_custom_op_autotuning,
)
from torch.testing._internal.common_utils import run_tests, TestCase


RAN: list[str] = []
DELAY_MS: dict[str, float] = {}
# rows -> {impl: delay}: a delay that depends on the benchmark's size.
DELAY_BY_ROWS: dict[int, dict[str, float]] = {}
SLOW_MS = 20.0


@torch.library.custom_op("autotune_features_test::trace", mutates_args=())
def trace(x: torch.Tensor, impl: str) -> torch.Tensor:
    RAN.append(impl)
    delay = DELAY_BY_ROWS.get(x.shape[0], DELAY_MS).get(impl, 0.0)
    if delay:
        time.sleep(delay / 1e3)
    return x.clone()


@trace.register_fake
def _(x: torch.Tensor, impl: str) -> torch.Tensor:
    return torch.empty_like(x)


# --- an op whose tensors come first --------------------------------------------------
# ``chunks`` is a tuning knob of the implementations (configs set it), which
# the op itself ignores, as upstream's documentation has it.
@torch.library.custom_op("autotune_features_test::scale_rows", mutates_args=())
def scale_rows(x: torch.Tensor, factor: float = 2.0, chunks: int = 1) -> torch.Tensor:
    return trace(x, "default") * factor


@scale_rows.register_fake
def _(x: torch.Tensor, factor: float = 2.0, chunks: int = 1) -> torch.Tensor:
    return torch.empty_like(x)


def scale_rows_mul(x, factor=2.0, chunks=1):
    return trace(x, "mul") * factor


def scale_rows_add(x, factor=2.0, chunks=1):
    y = trace(x, "add")
    return y + y * (factor - 1)


def scale_rows_chunked(x, factor=2.0, chunks=1):
    y = trace(x, f"chunked{chunks}")
    return torch.cat([part * factor for part in y.chunk(chunks)])


# --- an op whose non-tensor parameter stands between its tensors --------------------
@torch.library.custom_op("autotune_features_test::scaled_add", mutates_args=())
def scaled_add(x: torch.Tensor, scale: float, bias: torch.Tensor) -> torch.Tensor:
    return trace(x, "default") * scale + bias


@scaled_add.register_fake
def _(x: torch.Tensor, scale: float, bias: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def scaled_add_mul(x, scale, bias):
    return trace(x, "mul") * scale + bias


def scaled_add_addcmul(x, scale, bias):
    return torch.addcmul(bias, trace(x, "addcmul"), torch.full_like(x, scale))


class AutotuningTestCase(TestCase):
    def setUp(self) -> None:
        super().setUp()
        torch._dynamo.reset()
        RAN.clear()
        DELAY_MS.clear()
        DELAY_BY_ROWS.clear()
        self._patches = inductor_config.patch(
            fx_graph_cache=False, autotune_local_cache=False
        )
        self._patches.__enter__()

    def tearDown(self) -> None:
        self._patches.__exit__(None, None, None)
        super().tearDown()

    def slow_all_but(self, winner: str, names: list[str]) -> None:
        DELAY_MS.update({name: SLOW_MS for name in names if name != winner})

    def run_compiled(self, fn, *args):
        """Compile ``fn`` and call it twice; what ran in the second call and its result."""
        compiled = torch.compile(fn)
        compiled(*args)
        RAN.clear()
        result = compiled(*args)
        return list(RAN), result


class UpstreamFeaturesTest(AutotuningTestCase):
    def test_configs_with_parameters(self):
        register_custom_op_autotuning(
            scale_rows,
            configs=[
                CustomOpConfig(scale_rows_chunked, chunks=1),
                CustomOpConfig(scale_rows_chunked, chunks=4),
            ],
        )
        self.slow_all_but("chunked4", ["default", "chunked1", "chunked4"])
        x = torch.arange(64.0).view(16, 4)
        ran, result = self.run_compiled(lambda x: scale_rows(x, 3.0), x)
        self.assertEqual(ran, ["chunked4"])
        self.assertEqual(result, x * 3.0, atol=0, rtol=0)

    def test_config_generator_sees_the_inputs(self):
        seen = []

        def generate(fake_tensors):
            seen.append({name: tuple(t.shape) for name, t in fake_tensors.items()})
            rows = fake_tensors["x"].shape[0]
            return [
                CustomOpConfig(scale_rows_chunked, chunks=c) for c in (1, rows // 4)
            ]

        register_custom_op_autotuning(scale_rows, config_generator=generate)
        self.slow_all_but("chunked4", ["default", "chunked1", "chunked4"])
        x = torch.arange(64.0).view(16, 4)
        ran, result = self.run_compiled(lambda x: scale_rows(x), x)
        self.assertEqual(seen, [{"x": (16, 4)}])
        self.assertEqual(ran, ["chunked4"])
        self.assertEqual(result, x * 2.0, atol=0, rtol=0)

    def test_input_gen_fns_make_the_benchmark_inputs(self):
        generated = []

        def positive(fake):
            generated.append(tuple(fake.shape))
            return torch.rand(fake.shape) + 1

        register_custom_op_autotuning(
            scale_rows,
            configs=[CustomOpConfig(scale_rows_mul), CustomOpConfig(scale_rows_add)],
            input_gen_fns={"x": positive},
        )
        self.slow_all_but("add", ["default", "mul", "add"])
        x = torch.arange(32.0).view(8, 4)
        ran, result = self.run_compiled(lambda x: scale_rows(x), x)
        self.assertIn((8, 4), generated)
        self.assertEqual(ran, ["add"])
        self.assertEqual(result, x * 2.0, atol=0, rtol=0)

    def test_range_dispatch_picks_a_winner_per_range(self):
        register_custom_op_autotuning(
            scale_rows,
            configs=[CustomOpConfig(scale_rows_mul), CustomOpConfig(scale_rows_add)],
            dispatch_on={"tensor_name": "x", "dim": 0, "range_upper_bound": 32},
            split_points=[8],
        )
        # The range [1, 8] is benchmarked at 8 rows, [9, inf) at 32: "mul"
        # is made the faster at 8 rows, "add" at 32.
        DELAY_BY_ROWS.update({8: {"default": SLOW_MS, "add": SLOW_MS}})
        DELAY_BY_ROWS.update({32: {"default": SLOW_MS, "mul": SLOW_MS}})
        compiled = torch.compile(lambda x: scale_rows(x))
        first = torch.ones(4, 5)
        torch._dynamo.mark_dynamic(first, 0)
        compiled(first)
        DELAY_BY_ROWS.clear()
        for rows, expected in ((4, "mul"), (8, "mul"), (9, "add"), (24, "add")):
            x = torch.arange(rows * 5.0).view(rows, 5)
            RAN.clear()
            result = compiled(x)
            self.assertEqual(RAN, [expected], f"{rows} rows")
            self.assertEqual(result, x * 2.0, atol=0, rtol=0)

    def test_min_speedup_threshold_keeps_the_fallback(self):
        register_custom_op_autotuning(
            scale_rows,
            configs=[CustomOpConfig(scale_rows_mul)],
            min_speedup_threshold=1000.0,
        )
        DELAY_MS["default"] = SLOW_MS / 4  # slower, but not 1000 times slower
        x = torch.arange(32.0).view(8, 4)
        ran, result = self.run_compiled(lambda x: scale_rows(x), x)
        self.assertEqual(ran, ["default"])
        self.assertEqual(result, x * 2.0, atol=0, rtol=0)

    def test_without_the_fallback_only_implementations_compete(self):
        register_custom_op_autotuning(
            scale_rows,
            configs=[CustomOpConfig(scale_rows_mul), CustomOpConfig(scale_rows_add)],
            include_fallback=False,
        )
        self.slow_all_but("mul", ["mul", "add"])
        x = torch.arange(32.0).view(8, 4)
        RAN.clear()
        compiled = torch.compile(lambda x: scale_rows(x))
        compiled(x)
        self.assertNotIn("default", RAN)
        RAN.clear()
        self.assertEqual(compiled(x), x * 2.0, atol=0, rtol=0)
        self.assertEqual(RAN, ["mul"])


class SchemaBindingTest(AutotuningTestCase):
    """``scaled_add(x, scale, bias)``: a non-tensor parameter before a tensor."""

    def _register(self, **kwargs) -> None:
        register_custom_op_autotuning(
            scaled_add,
            configs=[
                CustomOpConfig(scaled_add_mul),
                CustomOpConfig(scaled_add_addcmul),
            ],
            **kwargs,
        )

    def _inputs(self, rows: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.arange(rows * 4.0).view(rows, 4)
        return x, torch.full((rows, 4), 0.5)

    def test_implementations_receive_each_argument_in_its_place(self):
        self._register()
        self.slow_all_but("addcmul", ["default", "mul", "addcmul"])
        x, bias = self._inputs()
        ran, result = self.run_compiled(lambda x, b: scaled_add(x, 3.0, b), x, bias)
        self.assertEqual(ran, ["addcmul"])
        self.assertEqual(result, x * 3.0 + bias, atol=0, rtol=0)

    def test_the_eager_fallback_receives_each_argument_in_its_place(self):
        self._register()
        self.slow_all_but("default", ["default", "mul", "addcmul"])
        x, bias = self._inputs()
        ran, result = self.run_compiled(lambda x, b: scaled_add(x, 3.0, b), x, bias)
        self.assertEqual(ran, ["default"])
        self.assertEqual(result, x * 3.0 + bias, atol=0, rtol=0)

    def test_keyword_arguments_bind_too(self):
        self._register()
        self.slow_all_but("mul", ["default", "mul", "addcmul"])
        x, bias = self._inputs()
        ran, result = self.run_compiled(
            lambda x, b: scaled_add(x, bias=b, scale=3.0), x, bias
        )
        self.assertEqual(ran, ["mul"])
        self.assertEqual(result, x * 3.0 + bias, atol=0, rtol=0)

    def test_input_gen_fns_for_a_tensor_after_a_scalar(self):
        generated = []

        def bias_gen(fake):
            generated.append(tuple(fake.shape))
            return torch.zeros(fake.shape)

        self._register(input_gen_fns={"bias": bias_gen})
        self.slow_all_but("mul", ["default", "mul", "addcmul"])
        x, bias = self._inputs()
        ran, result = self.run_compiled(lambda x, b: scaled_add(x, 3.0, b), x, bias)
        self.assertIn((8, 4), generated)
        self.assertEqual(ran, ["mul"])
        self.assertEqual(result, x * 3.0 + bias, atol=0, rtol=0)

    def test_config_generator_names_the_tensors(self):
        seen = []

        def generate(fake_tensors):
            seen.append(sorted(fake_tensors))
            return [CustomOpConfig(scaled_add_mul), CustomOpConfig(scaled_add_addcmul)]

        register_custom_op_autotuning(scaled_add, config_generator=generate)
        self.slow_all_but("mul", ["default", "mul", "addcmul"])
        x, bias = self._inputs()
        ran, result = self.run_compiled(lambda x, b: scaled_add(x, 3.0, b), x, bias)
        self.assertEqual(seen, [["bias", "x"]])
        self.assertEqual(ran, ["mul"])
        self.assertEqual(result, x * 3.0 + bias, atol=0, rtol=0)


if __name__ == "__main__":
    run_tests()
