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

* Screening in half precision: an op of each reducing kind (all_reduce,
  reduce_scatter) with the library's implementations and wrong ones beside
  them (off by an eighth of the input; another rank's shard; a scale
  missing), compiled in float16 and in bfloat16: every library
  implementation passes screening on every rank (they sum in other orders
  than the backend), every wrong one is disqualified on every rank, every
  rank runs the same winner, and the result is the sum within the
  screening bound.

* At 2 ranks, the three implementations whose result is a view of their
  own buffer (a reshape, a slice at the rank's offset) win ``op(x) @ w``
  alone, under V1 and V2: one generated kernel under both, the result
  exact (V2 makes the op's buffer the view, as V1 hands the view on).

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
from torch._inductor.kernel.custom_op import (
    CustomOpConfig,
    register_custom_op_autotuning,
)
from torch._inductor.runtime.collective_benchmarking.rules import outputs_match
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

from test_collective_decisions import decision_artifacts
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

    def test_reorderings_pass_screening_in_half_precision(self):
        # The library's all_reduce and reduce_scatter implementations sum the
        # ranks' inputs in other orders than the backend (all_gather or
        # all_to_all then a sum in float32, chunks, a reduce_scatter then an
        # all_gather).  Screened against the op's default on Inductor's
        # random benchmark inputs, every one of them passes on every rank in
        # float16 and bfloat16, while wrong candidates beside them (off by an
        # eighth of the input; another rank's shard; a scale missing) are
        # disqualified on every rank; every rank runs the same winner, and
        # its result is the sum within the screening bound.
        world, group_name = self.world_size, dist.group.WORLD.group_name
        wrong = {
            "all_reduce": [all_reduce_off_by_an_eighth],
            "reduce_scatter": [reduce_scatter_wrong_shard, reduce_scatter_unscaled],
        }
        for kind, extra in wrong.items():
            register_custom_op_autotuning(
                OPS[kind],
                configs=[
                    CustomOpConfig(fn, **params)
                    for fn, params in IMPLEMENTATIONS[kind].values()
                ]
                + [CustomOpConfig(fn) for fn in extra],
            )
        statuses, winners = {}, {}
        for dtype in (torch.float16, torch.bfloat16):
            inputs = {
                kind: [
                    torch.randn(
                        world * 64, 256, generator=torch.Generator().manual_seed(r)
                    ).to(dtype)
                    for r in range(world)
                ]
                for kind in wrong
            }
            torch._dynamo.reset()
            payloads: list = []
            with decision_artifacts(payloads), tuning_config(False):
                results = torch.compile(
                    lambda ar, rs: [
                        OPS["all_reduce"](ar, group_name),
                        OPS["reduce_scatter"](rs, group_name),
                    ]
                )(*[inputs[kind][self.rank] for kind in wrong])
            for kind, payload, result in zip(wrong, payloads, results, strict=True):
                statuses[dtype, kind] = {
                    _implementation(c["name"]): c["status_per_rank"]
                    for c in payload["candidates"]
                }
                winners[dtype, kind] = payload["winner"]
                summed = torch.stack(inputs[kind]).double().sum(0)
                magnitude = torch.stack(inputs[kind]).double().abs().sum(0)
                if kind == "reduce_scatter":
                    summed = summed.chunk(world)[self.rank]
                    magnitude = magnitude.chunk(world)[self.rank]
                self.assertTrue(
                    outputs_match(result, summed.to(dtype), magnitude, world),
                    f"{dtype} {kind}",
                )
        ok, out = ["ok"] * world, ["wrong_result"] * world
        self.assertEqual(
            statuses,
            {
                (dtype, kind): {
                    "default": ok,
                    **dict.fromkeys(IMPLEMENTATIONS[kind], ok),
                    **{fn.__name__: out for fn in extra},
                }
                for dtype in (torch.float16, torch.bfloat16)
                for kind, extra in wrong.items()
            },
        )
        everywhere: list = [None] * world
        dist.all_gather_object(everywhere, winners)
        self.assertEqual(everywhere, [winners] * world)


def _implementation(candidate: str) -> str:
    # "3:collective_implementations_test::all_reduce_autotuned_all_reduce_chunked_chunks__4..."
    # names the implementation the candidate runs; the op's own code is "default".
    for implementations in IMPLEMENTATIONS.values():
        for name, (fn, _) in implementations.items():
            if f"_autotuned_{fn.__name__}_" in candidate:
                return name
    match = re.search(r"_autotuned_(\w+?)_group_name", candidate)
    return match.group(1) if match else "default"


def all_reduce_off_by_an_eighth(x: torch.Tensor, group_name: str) -> torch.Tensor:
    """Wrong: the sum, plus an eighth of this rank's input."""
    funcol = torch.ops._c10d_functional
    return funcol.wait_tensor(funcol.all_reduce(x, "sum", group_name)) + x / 8


def reduce_scatter_wrong_shard(x: torch.Tensor, group_name: str) -> torch.Tensor:
    """Wrong: the next rank's shard of the sum (the ranks in the wrong order)."""
    funcol = torch.ops._c10d_functional
    world = _resolve_process_group(group_name).size()
    summed = funcol.wait_tensor(funcol.all_reduce(x, "sum", group_name))
    rank = _resolve_process_group(group_name).rank()
    return summed.chunk(world)[(rank + 1) % world].clone()


def reduce_scatter_unscaled(x: torch.Tensor, group_name: str) -> torch.Tensor:
    """Wrong: the inputs scaled down by the world size, and not scaled back."""
    funcol = torch.ops._c10d_functional
    world = _resolve_process_group(group_name).size()
    return funcol.wait_tensor(
        funcol.reduce_scatter_tensor(x / world, "sum", world, group_name)
    )


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

    def test_winners_ending_in_a_view_add_no_kernel_under_v2(self):
        # Three implementations end in a view of a buffer they made (a
        # reshape, a slice at this rank's offset): V2 makes the op's buffer
        # that view, as V1 hands it to the op's users, and copies nothing
        # (a copy would be one more kernel before the matmul).
        group_name, world = dist.group.WORLD.group_name, self.world_size
        w = torch.arange(20, dtype=torch.float32).view(5, 4)
        views = [
            ("all_reduce", "reduce_scatter_all_gather"),
            ("all_gather", "all_reduce"),
            ("reduce_scatter", "all_reduce"),
        ]
        kernels = {}
        for kind, name in views:
            fn, params = IMPLEMENTATIONS[kind][name]
            register_custom_op_autotuning(
                OPS[kind],
                configs=[CustomOpConfig(fn, **params)],
                include_fallback=False,
            )
            inputs = _inputs(kind, world, torch.float32, world * 6, exact=True)
            for defer in (False, True):
                torch._dynamo.reset()
                with tuning_config(defer, fx_graph_cache=False):
                    result, (*_, code) = run_and_get_code(
                        torch.compile(
                            lambda x, kind=kind: OPS[kind](x, group_name) @ w
                        ),
                        inputs[self.rank],
                    )
                expected = _expected(kind, inputs, self.rank) @ w
                self.assertTrue(torch.equal(result, expected), f"{kind}/{name}")
                call = code[code.index("def call") :]
                kernels[kind, name, defer] = len(re.findall(r"cpp_fused_\w+\(", call))
        # V1 and V2: the one kernel that makes the collective's input.
        self.assertEqual(
            kernels,
            {(kind, name, defer): 1 for kind, name in views for defer in (0, 1)},
        )

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
