"""The library of collective implementations (torch/_inductor/kernel/collective_implementations.py).

What this checks, at 2, 3 and 4 gloo ranks:

* Exactness of every implementation of every collective, run eagerly,
  against the collective's closed form computed from every rank's input
  (each rank derives all inputs from seeds):

  - bitwise for int64 inputs, and for float32 inputs whose sums are exact
    (small integers), on a shape whose dim 0 divides by the world size and,
    for all_reduce (whose implementations may pad), on one that does not;
  - for random positive float32 inputs, within a relative error of
    ``world_size * 2**-24``: every implementation adds the same
    ``world_size`` positive terms in some order, each addition rounding by
    at most half a unit in the last place of its partial sum.

* At 2 ranks, one compiled program with an op of each kind registered through
  ``register_collective_implementations`` and its eager defaults made slow:
  every rank's program issues the same collectives in the same order (the
  same winner of each op everywhere), none of them a default, and the
  results are exact; and the chunked implementations' graphs keep
  one collective in flight on a gloo group.

On one gloo rank, every implementation traced on (fake) CUDA tensors calls
no collective known to crash gloo with them (the functional all_gather,
pytorch/pytorch#152645), while on CPU tensors five of them use it.

And, without ranks: registering an unknown collective or implementation is
a clear error.
"""

from __future__ import annotations

import functools
import re
import types

import torch
import torch.distributed as dist
from torch._inductor import config
from torch._inductor.kernel.collective_implementations import (
    IMPLEMENTATIONS,
    register_collective_implementations,
)
from torch._inductor.collective_autotuning.collective_graphs import (
    collectives_in_flight,
)
from torch.distributed.distributed_c10d import _resolve_process_group
from torch._inductor.utils import run_and_get_code
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.testing._internal.common_utils import TestCase, run_tests
from torch.testing._internal.distributed.collective_autotuning_utils import (
    OneRankGlooTestCase,
    RankProcessesTestCase,
)

from test_collective_autotuning_ranks import (
    DELAY_MS,
    SLOW_MS,
    StrictRankProcessesTestCase,
    clear_probes,
    probe,
    tuning_config,
)


def _inputs(
    kind: str, world: int, dtype: torch.dtype, rows: int, exact: bool
) -> list[torch.Tensor]:
    """Every rank's input, the same on every rank (seeded by rank)."""
    tensors = []
    for rank in range(world):
        generator = torch.Generator().manual_seed(1000 * rank + rows)
        if exact:
            values = torch.randint(-50, 50, (rows, 5), generator=generator).to(dtype)
        else:
            values = torch.rand((rows, 5), generator=generator, dtype=dtype) + 0.5
        tensors.append(values)
    return tensors


def _expected(kind: str, inputs: list[torch.Tensor], rank: int) -> torch.Tensor:
    world = len(inputs)
    if kind == "all_reduce":
        return torch.stack(inputs).double().sum(0).to(inputs[0].dtype)
    if kind == "all_gather":
        return torch.cat(inputs)
    if kind == "reduce_scatter":
        return (
            torch.stack(inputs).double().sum(0).chunk(world)[rank].to(inputs[0].dtype)
        )
    return torch.cat([peer.chunk(world)[rank] for peer in inputs])


def _make_op(kind: str):
    # One custom op per kind, whose eager default is the library's direct implementation.
    direct = IMPLEMENTATIONS[kind]["direct"][0]

    def collective(x: torch.Tensor, group_name: str) -> torch.Tensor:
        # Through the probe: a test can delay the default (DELAY_MS["default"]).
        return direct(probe(x, "default"), group_name).clone()

    def fake(x: torch.Tensor, group_name: str) -> torch.Tensor:
        world = _resolve_process_group(group_name).size()
        if kind == "all_gather":
            return x.new_empty((x.shape[0] * world, *x.shape[1:]))
        if kind == "reduce_scatter":
            return x.new_empty((x.shape[0] // world, *x.shape[1:]))
        return torch.empty_like(x)

    op = torch.library.custom_op(
        f"collective_implementations_test::{kind}", mutates_args=()
    )(collective)
    op.register_fake(fake)
    return op


OPS = {kind: _make_op(kind) for kind in IMPLEMENTATIONS}


class ImplementationTests:
    WORLD_SIZE = 2

    def test_every_implementation_is_exact(self):
        world, group_name = self.world_size, dist.group.WORLD.group_name
        mismatches = []
        for kind, implementations in IMPLEMENTATIONS.items():
            shapes = [world * 6] + ([13] if kind == "all_reduce" else [])
            for rows in shapes:
                for dtype, exact in (
                    (torch.int64, True),
                    (torch.float32, True),
                    (torch.float32, False),
                ):
                    inputs = _inputs(kind, world, dtype, rows, exact)
                    expected = _expected(kind, inputs, self.rank)
                    for name, (fn, params) in implementations.items():
                        actual = fn(inputs[self.rank].clone(), group_name, **params)
                        label = f"{kind}/{name} {dtype} rows={rows} {'exact' if exact else 'random'}"
                        if exact and not torch.equal(actual, expected):
                            mismatches.append(f"{label}: not bitwise equal")
                        elif not exact and not torch.allclose(
                            actual, expected, rtol=world * 2**-24, atol=0
                        ):
                            error = (
                                ((actual - expected).abs() / expected.abs())
                                .max()
                                .item()
                            )
                            mismatches.append(f"{label}: relative error {error:.3g}")
        self.assertEqual(mismatches, [])


for _world_size in (2, 3, 4):
    _name = f"CollectiveImplementations{_world_size}RanksTest"
    globals()[_name] = type(
        _name,
        (ImplementationTests, StrictRankProcessesTestCase),
        {"WORLD_SIZE": _world_size, "__module__": __name__},
    )


@config.patch(collective_benchmark_strict=True)
class CompiledImplementationsTest(RankProcessesTestCase):
    WORLD_SIZE = 2

    def test_one_op_of_each_kind_compiled(self):
        group_name = dist.group.WORLD.group_name
        kinds = list(IMPLEMENTATIONS)
        for kind in kinds:
            register_collective_implementations(OPS[kind], kind)
        world = self.world_size
        inputs = {
            kind: _inputs(kind, world, torch.float32, world * 6, exact=True)
            for kind in kinds
        }

        def program(*xs):
            return [OPS[kind](x, group_name) for kind, x in zip(kinds, xs, strict=True)]

        # The default is as fast as "direct": made slow, it cannot win an op
        # and leave the program without any of the library's implementations.
        DELAY_MS["default"] = SLOW_MS
        try:
            with tuning_config(True):
                results, (*_, code) = run_and_get_code(
                    torch.compile(program), *[inputs[k][self.rank] for k in kinds]
                )
        finally:
            clear_probes()
        for kind, result in zip(kinds, results, strict=True):
            self.assertTrue(
                torch.equal(result, _expected(kind, inputs[kind], self.rank)), kind
            )
        # Every rank's program issues the same collectives in the same order:
        # the same implementation of every op won everywhere, and it is one
        # of the library's (no op's default is called).
        call = code[code.index("def call") :]
        issued = re.findall(
            r"torch\.ops\.(_c10d_functional|collective_implementations_test)\.(\w+)\.default",
            call,
        )
        self.assertEqual(
            [op for namespace, op in issued if namespace != "_c10d_functional"], []
        )
        self.assertTrue(issued)
        everywhere: list = [None] * world
        dist.all_gather_object(everywhere, issued)
        self.assertEqual(everywhere, [issued] * world)

    def test_chunked_implementations_keep_one_collective_in_flight_on_gloo(self):
        # Two collectives finishing together on one gloo group can corrupt
        # the heap (docs/upstream/gloo-status-string-race.md): on gloo, the
        # pipelined implementations wait for each piece before issuing the
        # next, as their graphs show.
        group_name = dist.group.WORLD.group_name
        x = torch.zeros(self.world_size * 6, 5)
        in_flight = {}
        for kind, implementations in IMPLEMENTATIONS.items():
            if "chunked" in implementations:
                fn, params = implementations["chunked"]
                self.assertGreater(params["in_flight"], 1)
                gm = make_fx(
                    functools.partial(fn, group_name=group_name, **params),
                    tracing_mode="fake",
                )(x)
                in_flight[kind] = collectives_in_flight(types.SimpleNamespace(gm=gm))
        self.assertEqual(in_flight, {"all_reduce": 1, "all_gather": 1, "all_to_all": 1})


class KnownCrashesTest(OneRankGlooTestCase):
    """On a group whose CUDA backend is gloo, no implementation calls a collective known to crash it."""

    def _collectives(self, device: str) -> dict[str, frozenset[str]]:
        # Every implementation's graph, traced as autotuning traces it, on
        # (fake) tensors of the device: no GPU is needed.
        from torch._inductor.collective_autotuning.collective_graphs import (
            collective_ops,
        )

        group_name = dist.group.WORLD.group_name
        with FakeTensorMode():
            x = torch.zeros(6, 5, device=device)
        return {
            f"{kind}/{name}": collective_ops(
                types.SimpleNamespace(
                    gm=make_fx(
                        functools.partial(fn, group_name=group_name, **params),
                        tracing_mode="fake",
                    )(x)
                )
            )
            for kind, implementations in IMPLEMENTATIONS.items()
            for name, (fn, params) in implementations.items()
        }

    def test_no_implementation_calls_a_collective_known_to_crash_gloo(self):
        from torch._inductor.runtime.collective_benchmarking.channel_builder import (
            served_backends,
        )
        from torch._inductor.runtime.collective_benchmarking.known_crashes import (
            known_crash,
        )

        self.assertEqual(served_backends(dist.group.WORLD)["cuda"], "gloo")
        on_cuda = self._collectives("cuda")
        crashing = {
            name: known_crash("gloo", "cuda", ops)
            for name, ops in on_cuda.items()
            if known_crash("gloo", "cuda", ops) is not None
        }
        self.assertEqual(crashing, {})
        # The same implementations gather with the functional all_gather on
        # CPU tensors, where gloo runs it: the rule, not the library, decides.
        gather = "_c10d_functional::all_gather_into_tensor"
        on_cpu = self._collectives("cpu")
        self.assertEqual(
            sorted(name for name, ops in on_cpu.items() if gather in ops),
            [
                "all_gather/chunked",
                "all_gather/direct",
                "all_reduce/all_gather_sum",
                "all_reduce/reduce_scatter_all_gather",
                "all_to_all/all_gather",
            ],
        )
        self.assertEqual(set(on_cuda), set(on_cpu))


class RegistrationErrorsTest(TestCase):
    def test_unknown_collective_or_implementation(self):
        with self.assertRaisesRegex(ValueError, "unknown collective 'broadcast'"):
            register_collective_implementations(OPS["all_reduce"], "broadcast")
        with self.assertRaisesRegex(
            ValueError, r"unknown all_reduce implementations \['ring'\]"
        ):
            register_collective_implementations(
                OPS["all_reduce"], "all_reduce", names=["direct", "ring"]
            )


if __name__ == "__main__":
    run_tests()
