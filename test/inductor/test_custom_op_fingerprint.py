"""Fingerprints of custom-op autotuning registrations, and the cache keys that use them.

What this checks (no ranks):

* ``callable_fingerprint`` changes with what a callable would run and only
  with that: a function's code and defaults, the values its closure
  captured, a helper of its own module that it calls, a ``functools.partial``'s
  bound arguments, a lambda's body; two equal definitions have equal
  fingerprints, and a fingerprint is the same in a new process.
* ``registration_fingerprint`` changes with the configs' order, parameters
  and ``config_patches``, and with the op's own implementation.
* The FX graph cache key of a graph that calls a registered op changes when
  its registration changes, and is the same for the same registration made
  again; a graph without such an op has the key it had before registration.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import textwrap

import torch
from torch._inductor.kernel.custom_op import (
    CustomOpConfig,
    register_custom_op_autotuning,
)
from torch._inductor.kernel.custom_op_fingerprint import (
    callable_fingerprint,
    registration_fingerprint,
)
from torch.testing._internal.common_utils import TestCase, run_tests

fp = callable_fingerprint


def helper(x):
    return x + 1


def uses_helper(x):
    return helper(x) * 2


def make_scaled(scale):
    def scaled(x):
        return x * scale

    return scaled


def add(x, y=1):
    return x + y


@torch.library.custom_op("fingerprint_test::op", mutates_args=())
def op(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@op.register_fake
def _(x):
    return torch.empty_like(x)


class TestCallableFingerprint(TestCase):
    def test_equal_definitions_are_equal(self):
        def first(x):
            return x + 1

        def second(x):
            return x + 1

        self.assertEqual(fp(first), fp(first))
        self.assertNotEqual(fp(first), fp(second))  # another qualified name
        self.assertEqual(fp(make_scaled(2)), fp(make_scaled(2)))

    def test_code_and_defaults(self):
        def plus_one(x):
            return x + 1

        plus_one_a = plus_one

        def plus_one(x):
            return x + 2

        self.assertNotEqual(fp(plus_one_a), fp(plus_one))
        self.assertNotEqual(fp(add), fp(functools.partial(add, y=1)))

    def test_closures(self):
        self.assertNotEqual(fp(make_scaled(2)), fp(make_scaled(3)))
        self.assertNotEqual(
            fp(make_scaled(torch.ones(3))), fp(make_scaled(torch.zeros(3)))
        )
        self.assertEqual(fp(make_scaled(torch.ones(3))), fp(make_scaled(torch.ones(3))))

    def test_captured_tensors_of_every_dtype(self):
        # numpy has no bfloat16 or float8: the content is hashed as bytes.
        for dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.bool, torch.cfloat):
            one, other = torch.ones(3, dtype=dtype), torch.zeros(3, dtype=dtype)
            self.assertEqual(fp(make_scaled(one)), fp(make_scaled(one.clone())))
            self.assertNotEqual(fp(make_scaled(one)), fp(make_scaled(other)))
        scalar = torch.tensor(2.0, dtype=torch.bfloat16)
        self.assertEqual(fp(make_scaled(scalar)), fp(make_scaled(scalar.clone())))

    def test_partials(self):
        self.assertEqual(
            fp(functools.partial(add, y=2)), fp(functools.partial(add, y=2))
        )
        self.assertNotEqual(
            fp(functools.partial(add, y=2)), fp(functools.partial(add, y=3))
        )
        self.assertNotEqual(
            fp(functools.partial(add, 1)), fp(functools.partial(add, y=1))
        )

    def test_lambdas(self):
        self.assertEqual(fp(lambda x: x * 2), fp(lambda x: x * 2))
        self.assertNotEqual(fp(lambda x: x * 2), fp(lambda x: x * 3))
        self.assertNotEqual(fp(lambda x: x * 2), fp(lambda x: x + 2))

    def test_helpers_of_the_same_module(self):
        before = fp(uses_helper)
        global helper
        original = helper

        def helper(x):
            return x + 5

        try:
            self.assertNotEqual(fp(uses_helper), before)
        finally:
            helper = original
        self.assertEqual(fp(uses_helper), before)

    def test_stable_across_processes(self):
        script = textwrap.dedent(
            """
            import functools, sys
            sys.path.insert(0, sys.argv[1])
            from test_custom_op_fingerprint import add, make_scaled, uses_helper
            from torch._inductor.kernel.custom_op_fingerprint import callable_fingerprint as fp
            print(fp(uses_helper), fp(make_scaled(2.5)), fp(functools.partial(add, y=4)))
            """
        )
        here = str(__import__("pathlib").Path(__file__).parent)
        runs = [
            subprocess.run(
                [sys.executable, "-c", script, here],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            for _ in range(2)
        ]
        self.assertEqual(runs[0], runs[1])
        self.assertEqual(
            runs[0].split(),
            [fp(uses_helper), fp(make_scaled(2.5)), fp(functools.partial(add, y=4))],
        )


class TestRegistrationFingerprint(TestCase):
    def fingerprint(self, configs, default_impl=None, **options):
        return registration_fingerprint(
            op._opoverload,
            configs=configs,
            config_generator=None,
            default_impl=default_impl,
            **options,
        )

    def test_configs(self):
        a, b = CustomOpConfig(helper), CustomOpConfig(uses_helper)
        self.assertEqual(
            self.fingerprint([a, b]),
            self.fingerprint([CustomOpConfig(helper), CustomOpConfig(uses_helper)]),
        )
        self.assertNotEqual(self.fingerprint([a, b]), self.fingerprint([b, a]))
        self.assertNotEqual(
            self.fingerprint([CustomOpConfig(add, y=1)]),
            self.fingerprint([CustomOpConfig(add, y=2)]),
        )
        patched = CustomOpConfig(helper, config_patches={"max_autotune": True})
        self.assertNotEqual(self.fingerprint([a]), self.fingerprint([patched]))
        self.assertNotEqual(
            self.fingerprint([a], min_speedup_threshold=1.0),
            self.fingerprint([a], min_speedup_threshold=1.1),
        )
        self.assertNotEqual(
            self.fingerprint([a], default_impl=helper),
            self.fingerprint([a], default_impl=uses_helper),
        )


class TestFxGraphCacheKey(TestCase):
    def key(self, gm):
        from torch._inductor.codecache import FxGraphHashDetails

        details = FxGraphHashDetails(gm, [torch.ones(4)], {}, [])
        return details.custom_op_autotuning

    def test_key_follows_the_registration(self):
        graph = torch.fx.Graph()
        x = graph.placeholder("x")
        graph.output(graph.call_function(torch.ops.fingerprint_test.op.default, (x,)))
        gm = torch.fx.GraphModule(torch.nn.Module(), graph)
        plain = torch.fx.symbolic_trace(lambda x: x + 1)

        register_custom_op_autotuning(op, configs=[CustomOpConfig(helper)])
        first = self.key(gm)
        register_custom_op_autotuning(op, configs=[CustomOpConfig(helper)])
        self.assertEqual(self.key(gm), first)  # the same registration, made again
        register_custom_op_autotuning(op, configs=[CustomOpConfig(uses_helper)])
        self.assertNotEqual(self.key(gm), first)
        self.assertEqual(self.key(plain), ())  # graphs without the op are not affected


if __name__ == "__main__":
    run_tests()
