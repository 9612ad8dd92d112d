"""Fingerprints of custom-op autotuning registrations, and the cache keys that use them.

What this checks (no ranks):

* ``callable_fingerprint`` changes with what a callable would run and only
  with that: a function's code and defaults, the values its closure
  captured, a helper of its own module that it calls, a constant of its
  module (not a list it fills as it runs), a ``functools.partial``'s bound
  arguments, a lambda's body; two equal definitions have equal
  fingerprints, and a fingerprint is the same in a new process.
* ``registration_fingerprint`` changes with the configs' order, parameters
  (an enum's member, the attributes of the object behind a bound method)
  and ``config_patches``, and with the op's own implementation; it warns
  about an implementation without a source file (``exec``).  A registration
  that holds a value it could describe by its type only has no digest, and
  a warning names the value.
* The FX graph cache key of a graph that calls a registered op changes when
  its registration changes, and is the same for the same registration made
  again; a graph without such an op has the key it had before registration;
  a graph that calls an op without a digest bypasses the cache.
* Across processes on one cache directory, with Inductor's caches on: a
  change of a constant of the implementation's module, then of a helper it
  calls in another module, of an enum member or of the object behind a
  bound method that the registration holds, compiles again (a registration
  without a digest, every time), and the program computes with
  the new code; an unchanged relaunch takes the program from the cache.
* The same key covers the topology of the process groups the op may run
  collectives on (one process, a fake process group per "rank"): the same
  on every rank of a job; another world size, or a group named by the
  graph or by the registration with other members, is another key; a group
  nobody names, and the caller's rank, are not part of it.  An op whose
  implementations cannot issue collectives has the same key at every world
  size; the strings kept per registration are those of the registrations
  in force only.
"""

from __future__ import annotations

import enum
import functools
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import torch
import torch.distributed as dist
from torch._inductor.kernel.custom_op import (
    CustomOpConfig,
    register_custom_op_autotuning,
)
from torch._inductor.kernel import custom_op_fingerprint as fingerprints
from torch._inductor.kernel.custom_op_fingerprint import (
    callable_fingerprint,
    registration_fingerprint,
)
from torch.testing._internal.common_utils import TestCase, run_tests
from torch.testing._internal.distributed.fake_pg import FakeStore

fp = callable_fingerprint


def helper(x):
    return x + 1


def uses_helper(x):
    return helper(x) * 2


SCALE = 2  # a constant of this module that uses_constant reads
RECORDED: list[int] = []  # state that uses_constant changes as it runs


def uses_constant(x):
    RECORDED.append(1)
    return x * SCALE


def _all_reduced(x):
    return torch.ops._c10d_functional.all_reduce(x, "sum", "0")


def reduces(x):
    """An implementation that issues a collective, through a helper."""
    return _all_reduced(x)


def make_scaled(scale):
    def scaled(x):
        return x * scale

    return scaled


def add(x, y=1):
    return x + y


class Algo(enum.Enum):
    RING = 1
    TREE = 2


def by_algo(x, algo):
    return x * algo.value


class Chunked:
    def __init__(self, chunks):
        self.chunks = chunks

    def run(self, x):
        return x * self.chunks


class Counting:
    """A callable object that counts its calls in an object it holds: state."""

    def __init__(self):
        self.calls = Chunked(0)

    def __call__(self, x):
        self.calls.chunks += 1
        return x


COUNTING = Counting()


def uses_counting(x):
    return COUNTING(x)


class Packed:
    """Its state is not in a ``__dict__``: a digest could describe it by its type only."""

    __slots__ = ("chunks",)

    def __init__(self, chunks):
        self.chunks = chunks

    def run(self, x):
        return x * self.chunks


@torch.library.custom_op("fingerprint_test::op", mutates_args=())
def op(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@op.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("fingerprint_test::grouped_op", mutates_args=())
def grouped_op(x: torch.Tensor, group_name: str) -> torch.Tensor:
    return x.clone()


@grouped_op.register_fake
def _(x, group_name):
    return torch.empty_like(x)


def grouped_impl(x, group_name):
    return x * 1


def impl_of_group(x, group_name, tp_group):
    return x * 1


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

    def test_module_constants_not_state(self):
        global SCALE
        before = fp(uses_constant)
        RECORDED.append(1)
        self.assertEqual(fp(uses_constant), before)
        SCALE = 3
        try:
            self.assertNotEqual(fp(uses_constant), before)
        finally:
            SCALE = 2
        self.assertEqual(fp(uses_constant), before)

    def test_state_that_module_objects_hold(self):
        before = fp(uses_counting)
        uses_counting(torch.ones(1))
        self.assertEqual(fp(uses_counting), before)

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

    def test_code_without_a_source_file(self):
        # Its code is covered; what only a file would show is not, and the
        # registration says so.
        typed_in: dict[str, object] = {}
        exec("def typed_in(x):\n    return x * 3\n", typed_in)
        logger = fingerprints.__name__
        with self.assertLogs(logger, "WARNING") as logs:
            first = self.fingerprint([CustomOpConfig(typed_in["typed_in"])])
        self.assertEqual(len(logs.records), 1)
        self.assertIn("no source file for None.typed_in", logs.output[0])
        exec("def typed_in(x):\n    return x * 4\n", typed_in)
        with self.assertLogs(logger, "WARNING"):
            self.assertNotEqual(
                self.fingerprint([CustomOpConfig(typed_in["typed_in"])]), first
            )
        with self.assertNoLogs(logger, "WARNING"):
            self.fingerprint([CustomOpConfig(uses_helper)])

    def test_enum_members(self):
        def algo(member):
            return self.fingerprint([CustomOpConfig(by_algo, algo=member)])

        self.assertEqual(algo(Algo.RING), algo(Algo.RING))
        self.assertNotEqual(algo(Algo.RING), algo(Algo.TREE))

    def test_objects_behind_bound_methods(self):
        def chunked(chunks):
            return self.fingerprint([CustomOpConfig(Chunked(chunks).run)])

        self.assertEqual(chunked(4), chunked(4))
        self.assertNotEqual(chunked(4), chunked(8))
        self.assertNotEqual(fp(Chunked(4).run), fp(Chunked(8).run))

    def test_values_a_digest_cannot_describe(self):
        # Packed(4) and Packed(8) would share a digest: there is none.
        logger = fingerprints.__name__
        with self.assertLogs(logger, "WARNING") as logs:
            self.assertEqual(
                self.fingerprint([CustomOpConfig(by_algo, algo=Packed(4))]), ""
            )
        self.assertIn("fingerprint_test::op", logs.output[0])
        self.assertIn("config 0's parameter 'algo'", logs.output[0])
        self.assertIn("Packed", logs.output[0])
        with self.assertLogs(logger, "WARNING") as logs:
            self.assertEqual(self.fingerprint([CustomOpConfig(Packed(4).run)]), "")
        self.assertIn("config 0's implementation", logs.output[0])


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

    def test_registration_without_a_digest_bypasses_the_cache(self):
        from torch._inductor.codecache import BypassFxGraphCache, compiled_fx_graph_hash

        graph = torch.fx.Graph()
        x = graph.placeholder("x")
        graph.output(graph.call_function(torch.ops.fingerprint_test.op.default, (x,)))
        gm = torch.fx.GraphModule(torch.nn.Module(), graph)
        plain = torch.fx.symbolic_trace(lambda x: x + 1)
        with self.assertLogs(fingerprints.__name__, "WARNING"):
            register_custom_op_autotuning(
                op, configs=[CustomOpConfig(by_algo, algo=Packed(4))]
            )
        try:
            with self.assertRaisesRegex(BypassFxGraphCache, "fingerprint_test::op"):
                compiled_fx_graph_hash(gm, [torch.ones(4)], {}, [])
            self.assertEqual(self.key(plain), ())
        finally:
            register_custom_op_autotuning(op, configs=[CustomOpConfig(helper)])


class TestCacheAcrossProcesses(TestCase):
    """What runs after the implementation's sources or values change, one process per step."""

    # Registers the configs that chunked.impl.configs(name) returns, for each
    # name, and prints what a program with the op computes and how Inductor's
    # FX graph cache served it.
    DRIVER = textwrap.dedent(
        """
        import json, sys
        sys.path.insert(0, sys.argv[1])
        import torch
        from torch._dynamo.utils import counters
        from torch._inductor.kernel.custom_op import register_custom_op_autotuning
        from chunked.impl import configs

        @torch.library.custom_op("fingerprint_procs::op", mutates_args=())
        def op(x: torch.Tensor) -> torch.Tensor:
            return x.clone()

        @op.register_fake
        def _(x):
            return torch.empty_like(x)

        served = []
        for name in sys.argv[2:]:
            # The implementation is the only candidate: it is what runs.
            register_custom_op_autotuning(
                op, configs=configs(name), include_fallback=False
            )
            torch._dynamo.reset()
            counters.clear()
            out = torch.compile(lambda x: op(x))(torch.ones(4))
            fx = counters["inductor"]
            served.append(
                [out.tolist()]
                + [fx[f"fxgraph_cache_{how}"] for how in ("miss", "hit", "bypass")]
            )
        print(json.dumps(served))
        """
    )

    def processes(self, impl_source):
        """A package ``chunked`` whose ``impl`` module has ``impl_source``, and a runner.

        The runner runs a fresh process on one cache directory and returns,
        per name it is given, ``(result, FX graph cache misses, hits,
        bypasses)``.
        """
        root = tempfile.TemporaryDirectory()
        self.addCleanup(root.cleanup)
        package = Path(root.name, "chunked")
        package.mkdir()
        (package / "__init__.py").write_text("")
        (package / "impl.py").write_text(impl_source)
        driver = Path(root.name, "driver.py")
        driver.write_text(self.DRIVER)
        # Inductor's caches at their defaults (on), one directory.
        env = dict(os.environ)
        env.pop("TORCHINDUCTOR_FORCE_DISABLE_CACHES", None)
        env.pop("TORCHINDUCTOR_FX_GRAPH_CACHE", None)
        env.update(
            TORCHINDUCTOR_CACHE_DIR=str(Path(root.name, "cache")),
            # Each process reads the sources as edited, never a stale .pyc.
            PYTHONDONTWRITEBYTECODE="1",
        )

        def run(*names):
            done = subprocess.run(
                [sys.executable, str(driver), root.name, *names],
                env=env,
                capture_output=True,
                text=True,
            )
            self.assertEqual(done.returncode, 0, done.stderr[-3000:])
            served = json.loads(done.stdout.splitlines()[-1])
            for values, *_ in served:
                self.assertEqual(len(set(values)), 1)
            return [(int(values[0]), *counts) for values, *counts in served]

        return package, run

    def test_values_of_the_registration(self):
        # The registration's values change from one process to the next, the
        # sources do not.
        _, run = self.processes(
            textwrap.dedent(
                """
                import enum
                from torch._inductor.kernel.custom_op import CustomOpConfig


                class Mode(enum.Enum):
                    DOUBLE = 2
                    TRIPLE = 3


                def by_mode(x, mode):
                    return x * mode.value


                class Chunked:
                    def __init__(self, chunks):
                        self.chunks = chunks

                    def run(self, x):
                        return x * self.chunks


                class Packed:
                    __slots__ = ("chunks",)

                    def __init__(self, chunks):
                        self.chunks = chunks

                    def run(self, x):
                        return x * self.chunks


                def configs(name):
                    kind, value = name.split("=")
                    if kind == "mode":
                        return [CustomOpConfig(by_mode, mode=Mode[value])]
                    chunked = {"chunked": Chunked, "packed": Packed}[kind]
                    return [CustomOpConfig(chunked(int(value)).run)]
                """
            )
        )
        first = run("mode=DOUBLE", "chunked=4", "packed=4")
        second = run("mode=TRIPLE", "chunked=8", "packed=8")
        again = run("mode=TRIPLE", "chunked=8", "packed=8")
        # (result, FX graph cache misses, hits, bypasses) per registration.
        self.assertEqual(first, [(2, 1, 0, 0), (4, 1, 0, 0), (4, 0, 0, 1)])
        self.assertEqual(second, [(3, 1, 0, 0), (8, 1, 0, 0), (8, 0, 0, 1)])
        self.assertEqual(again, [(3, 0, 1, 0), (8, 0, 1, 0), (8, 0, 0, 1)])

    def test_constants_and_helpers_of_other_modules(self):
        package, run = self.processes(
            "from torch._inductor.kernel.custom_op import CustomOpConfig\n"
            "from chunked.helpers import combine\n\nCHUNKS = 4\n\n\n"
            "def impl(x):\n    return combine(x) + CHUNKS\n\n\n"
            "def configs(name):\n    return [CustomOpConfig(impl)]\n"
        )
        helpers, impl = package / "helpers.py", package / "impl.py"
        helpers.write_text("def combine(x):\n    return x * 8\n")
        first = run("impl")
        impl.write_text(impl.read_text().replace("CHUNKS = 4", "CHUNKS = 5"))
        second = run("impl")
        helpers.write_text(helpers.read_text().replace("x * 8", "x * 18"))
        third = run("impl")
        again = run("impl")
        # (result, FX graph cache misses, hits, bypasses) per process.
        self.assertEqual(
            [first, second, third, again],
            [[(12, 1, 0, 0)], [(13, 1, 0, 0)], [(23, 1, 0, 0)], [(23, 0, 1, 0)]],
        )


class TestProcessGroupsInTheKey(TestCase):
    """The topology part of the FX graph cache key, per rank of fake jobs."""

    def setUp(self):
        super().setUp()
        register_custom_op_autotuning(
            grouped_op, configs=[CustomOpConfig(grouped_impl)]
        )

    def tearDown(self):
        if dist.is_initialized():
            dist.destroy_process_group()
        super().tearDown()

    @staticmethod
    def graph(group_name):
        graph = torch.fx.Graph()
        x = graph.placeholder("x")
        call = graph.call_function(
            torch.ops.fingerprint_test.grouped_op.default, (x, group_name)
        )
        graph.output(call)
        return torch.fx.GraphModule(torch.nn.Module(), graph)

    def key_on(self, rank, world_size, subgroups=(), named=None):
        """The FX graph cache key's topology part on ``rank`` of a job of ``world_size``.

        ``subgroups`` are created in order, as every rank of a job creates
        them; ``named`` is the position of the one the graph names (None:
        the default group's name).
        """
        dist.init_process_group(
            "fake", store=FakeStore(), rank=rank, world_size=world_size
        )
        try:
            groups = [dist.new_group(list(ranks)) for ranks in subgroups]
            name = "0" if named is None else groups[named].group_name
            return self.details(self.graph(name)).custom_op_autotuning_groups
        finally:
            dist.destroy_process_group()

    @staticmethod
    def details(gm):
        from torch._inductor.codecache import FxGraphHashDetails

        return FxGraphHashDetails(gm, [torch.ones(4)], {}, [])

    def test_same_job_same_key_on_every_rank(self):
        keys = {self.key_on(rank, 3) for rank in range(3)}
        self.assertEqual(keys, {(("0", 3, "0-2"),)})

    def test_another_world_size_is_another_key(self):
        self.assertNotEqual(self.key_on(0, 3), self.key_on(0, 2))

    def test_groups_the_graph_names(self):
        # A tensor-parallel group of ranks 0-1 against one of ranks 0 and 2:
        # the same name and size, other members.
        pairs = self.key_on(0, 4, [(0, 1)], named=0)
        self.assertEqual(pairs, (("0", 4, "0-3"), ("1", 2, "0-1")))
        self.assertEqual(self.key_on(1, 4, [(0, 1)], named=0), pairs)
        self.assertEqual(
            self.key_on(0, 4, [(0, 2)], named=0), (("0", 4, "0-3"), ("1", 2, "0,2"))
        )
        # A group nobody names is not part of the key.
        self.assertEqual(self.key_on(0, 4, [(0, 1)]), (("0", 4, "0-3"),))

    def test_groups_the_registration_names(self):
        # The op is called with the default group's name; its implementation
        # is given another group's name at registration.
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
        tp = dist.new_group([0, 1])
        register_custom_op_autotuning(
            grouped_op,
            configs=[CustomOpConfig(impl_of_group, tp_group=tp.group_name)],
        )
        self.assertEqual(
            self.details(self.graph("0")).custom_op_autotuning_groups,
            (("0", 4, "0-3"), (tp.group_name, 2, "0-1")),
        )

    def test_without_a_process_group_or_a_registered_op(self):
        self.assertEqual(self.details(self.graph("0")).custom_op_autotuning_groups, ())
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
        plain = torch.fx.symbolic_trace(lambda x: x + 1)
        self.assertEqual(self.details(plain).custom_op_autotuning_groups, ())

    @staticmethod
    def whole_key(gm, rank, world_size):
        """The FX graph cache key of ``gm`` on ``rank`` of a job of ``world_size``."""
        from torch._inductor.codecache import compiled_fx_graph_hash

        dist.init_process_group(
            "fake", store=FakeStore(), rank=rank, world_size=world_size
        )
        try:
            key, _ = compiled_fx_graph_hash(gm, [torch.ones(4)], {}, [])
            return key
        finally:
            dist.destroy_process_group()

    def test_the_whole_key(self):
        # The topology reaches the key itself: the same job, the same key on
        # every rank; another world size, another key.
        def whole_key(rank, world_size):
            return self.whole_key(self.graph("0"), rank, world_size)

        self.assertEqual(whole_key(0, 3), whole_key(2, 3))
        self.assertNotEqual(whole_key(0, 3), whole_key(0, 2))

    def test_only_ops_that_may_issue_collectives(self):
        # An op whose implementations issue no collective is compiled alike
        # at every world size: tuned at 2 ranks, its program is taken from
        # the cache at 3.  One that issues one (through a helper) is not.
        graph = torch.fx.Graph()
        x = graph.placeholder("x")
        graph.output(graph.call_function(torch.ops.fingerprint_test.op.default, (x,)))
        gm = torch.fx.GraphModule(torch.nn.Module(), graph)
        register_custom_op_autotuning(op, configs=[CustomOpConfig(uses_helper)])
        self.assertEqual(self.whole_key(gm, 0, 2), self.whole_key(gm, 0, 3))
        self.assertEqual(self.details(gm).custom_op_autotuning_groups, ())
        register_custom_op_autotuning(op, configs=[CustomOpConfig(reduces)])
        self.assertNotEqual(self.whole_key(gm, 0, 2), self.whole_key(gm, 0, 3))

    def test_only_registrations_in_force_are_kept(self):
        for tp_group in ("1", "2", "3"):
            register_custom_op_autotuning(
                grouped_op,
                configs=[CustomOpConfig(impl_of_group, tp_group=tp_group)],
            )
        self.assertLessEqual(
            set(fingerprints._strings_of_registration),
            set(fingerprints._registrations.values()),
        )
        self.assertIn(
            fingerprints._registrations[grouped_op._opoverload],
            fingerprints._strings_of_registration,
        )


if __name__ == "__main__":
    run_tests()
