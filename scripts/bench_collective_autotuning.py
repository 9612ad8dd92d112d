#!/usr/bin/env python3
"""Compile-time cost and run-time effect of collective autotuning: V1 vs V2, side by side.

V1 tunes each collective custom op while it is lowered (one session per op);
V2 (``torch._inductor.config.defer_collective_autotuning``, off by default) tunes
all of a graph's collective ops in the scheduler, one session per process
group, each candidate timed with its pointwise epilogue.  See
``torch/_inductor/collective_autotuning/deferral.py``.

Five tables, from one run of this script (gloo, ``--nproc`` local ranks
per launch, one process each, rendezvous over env://):

0. **Compile wall time** of a program of n identical all_reduce custom ops
   (the eager default and two registered implementations), each followed by
   ``relu(y * 0.5 + (i + 1))``, for n = 1, 3, 8 and 32, and of 3 or 8
   distinct ones (the same op on inputs of different sizes): the slowest
   rank's first call, in fresh processes with Inductor's caches on (its
   defaults) in fresh cache directories, without autotuning (no
   implementation registered), with V1 and with V2, side by side:
   ``--repeats`` launches per path, interleaved, and their median (C++
   compilation dominates and swings by seconds from one launch to the
   next).  Overhead = tuned - untuned.  With ``--cache-dirs host`` (the
   default) a launch's ranks share one cache directory, as a host's ranks
   share ``/tmp/torchinductor_<user>``, so each kernel is built once per
   launch; with ``--cache-dirs rank`` each rank has its own, so nothing is
   shared (kernels included).

1. **Autotuning overhead** for a graph of 1, 3 and 8 collective ops (each an
   all_reduce custom op with three implementations: the eager default, a
   direct all_reduce, reduce_scatter + all_gather; each op followed by a
   pointwise add), at 2 and 4 ranks, V1 and V2, cache directories as
   ``--cache-dirs`` says, Inductor's caches off.  Each rank first probes the
   CPU's vector ISA (``pick_vec_isa``), which Inductor does once per process
   at its first C++ kernel, so that "compiling the candidates" does not hold
   a cost that every first compile pays.  Per compile, from the benchmarker's
   ``counters["collective_autotuning"]``, the slowest rank's:

   - ``pre-syncs``: joins (one per session);
   - ``total``: autotuning wall time (compiling the candidates + the sessions);
   - ``compile``: compiling the candidates (after the join);
   - ``timed``: inside the timed runs;
   - ``warmup``: inside the warmup runs;
   - ``pre-sync``: inside the joins and the ready rendezvous, which mostly
     wait for the slowest rank;
   - ``exchange sync``: inside the other synchronizing steps (the session's
     exchange and commit, failure agreements), including the wait for
     slower ranks;
   - ``sync V2/V1``: V2's pre-sync + exchange sync as a share of V1's.

2. **The protocol alone**, for the same ops: ``CollectiveBenchmarker`` driven
   directly with the three implementations as candidates (already compiled),
   after a barrier, so that no rank waits for another's compilation: one
   session per op (V1) against one session for all ops (V2).  Median of 5.
   With the collectives the protocol issues per session (besides the
   candidates' own), and synchronization as a share of timed-run time.

3. **Medians and winners against the per-candidate barrier**
   (``--compare-with REV``, default ``a1a8df1``: the protocol before the
   session exchange, which all-reduced a status before each candidate's timed
   runs and all-gathered its result after them).  The same three candidates
   of 3 ops, benchmarked in one launch by both protocols in turn, 15
   sessions each: per candidate the median and inter-quartile range of the
   agreed times, and how often each protocol picked each winner.

4. **Run time of a tensor-parallel block** ``relu(all_reduce(x @ w) + b)``
   compiled three ways in the same processes: the eager default
   implementation of the all_reduce op (no tuning), the V1 choice and the V2
   choice.  The three are called in turn, ``--runs`` times; median per
   program, slowest rank, with the winner each path picked.

Usage:
  python scripts/bench_collective_autotuning.py [--nproc 2,4] [--ops 1,3,8] [--runs 50]
      [--compare-with REV] [--tables compile,overhead,protocol,compare,block] [--compile-ops 1,3d,8d,32]
      [--repeats 3] [--cache-dirs host|rank]
"""

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from torch.testing._internal.distributed.collective_autotuning_jobs import (
    launch_ranks,
    private_cache_dir,
)

NWARMUP, NRUNS = 3, 10
# --settings defaults: the compile table's sessions run with the autotuner's
# own warmups and timed runs, as a user's do, instead of NWARMUP and NRUNS.
SETTINGS_ENV = "BENCH_AUTOTUNING_SETTINGS"
# A compile table's tuned path is V1 or V2, maybe with one integer setting of
# torch._inductor.config: "V2:collective_benchmark_race_every=0".
SETTING_SEP = ":"
# The compile table's phases of tuning, from counters["collective_autotuning"].
PHASES = ("prepare_s", "warmup_s", "timed_s")
# The cache directory a launch's ranks share (the compile and overhead tables).
CACHE_DIR_ENV = "BENCH_AUTOTUNING_CACHE_DIR"
COUNTERS = (
    "presync",
    "prepare_s",
    "session_s",
    "timed_s",
    "warmup_s",
    "presync_s",
    "sync_s",
    "sync_collectives",
)
# The last protocol with a synchronization per candidate (see --compare-with).
PER_CANDIDATE_PROTOCOL = "a1a8df1"
PROTOCOL_PATH = "torch_overlay/torch/_inductor/runtime/collective_benchmarking.py"
COMPARE_SESSIONS = 15


# --- worker (one process per rank) --------------------------------------------------
def worker(mode: str, path: str, nops: int, runs: int, out_dir: Path) -> None:
    import torch
    import torch.distributed as dist
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters
    from torch._inductor.cpu_vec_isa import pick_vec_isa
    from torch._inductor.kernel.custom_op import (
        CustomOpConfig,
        register_custom_op_autotuning,
    )
    from torch.distributed.distributed_c10d import _resolve_process_group

    # The launch's cache directory when the driver gives one (shared by its
    # ranks, as a host's ranks share /tmp/torchinductor_<user>), else one per rank.
    if os.environ.get(CACHE_DIR_ENV):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.environ[CACHE_DIR_ENV]
    else:
        private_cache_dir("bench-autotuning-")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    group_name = dist.group.WORLD.group_name
    funcol = torch.ops._c10d_functional
    ran: list[str] = []

    @torch.library.custom_op("bench_autotuning::mark", mutates_args=())
    def mark(x: torch.Tensor, impl: str) -> torch.Tensor:
        ran.append(impl)
        return x.clone()

    @mark.register_fake
    def _(x, impl):
        return torch.empty_like(x)

    @torch.library.custom_op("bench_autotuning::all_reduce", mutates_args=())
    def all_reduce_op(x: torch.Tensor) -> torch.Tensor:
        out = mark(x, "default")
        dist.all_reduce(out, group=_resolve_process_group(group_name))
        return out

    @all_reduce_op.register_fake
    def _(x):
        return torch.empty_like(x)

    def direct(x):
        return funcol.wait_tensor(
            funcol.all_reduce(mark(x, "direct"), "sum", group_name)
        )

    def rs_ag(x):
        shard = funcol.wait_tensor(
            funcol.reduce_scatter_tensor(mark(x, "rs_ag"), "sum", world, group_name)
        )
        return funcol.wait_tensor(
            funcol.all_gather_into_tensor(shard, world, group_name)
        )

    if path != "none":
        register_custom_op_autotuning(
            all_reduce_op, configs=[CustomOpConfig(direct), CustomOpConfig(rs_ag)]
        )

    def path_patches(path: str, caches: bool = False) -> dict:
        # "V1" or "V2" (or "default": no tuning), maybe with a setting.
        # caches: Inductor's defaults (on), else off.
        path, _, setting = path.partition(SETTING_SEP)
        patches: dict = dict(defer_collective_autotuning=path == "V2")
        if os.environ.get(SETTINGS_ENV) != "defaults":
            patches.update(
                collective_benchmark_nruns=NRUNS,
                collective_benchmark_nwarmup=NWARMUP,
            )
        if setting:
            knob, _, value = setting.partition("=")
            patches[knob] = int(value)
        if not caches:
            patches.update(fx_graph_cache=False, autotune_local_cache=False)
        if path == "default":  # no tuning: the op's eager implementation
            patches["test_configs.force_custom_op_decomposition"] = False
        return patches

    report: dict = {"rank": rank}

    if mode == "protocol":
        from datetime import timedelta

        from torch._inductor.runtime.collective_benchmarking.benchmarker import (
            CollectiveBenchmarker,
        )
        from torch._inductor.runtime.collective_benchmarking.types import (
            Candidate,
            CollectiveBenchmarkConfig,
            OpToTune,
        )

        x = torch.ones(1 << 16)

        def candidates() -> list:
            return [
                Candidate("default", lambda: all_reduce_op(x), is_default=True),
                Candidate("direct", lambda: direct(x)),
                Candidate("rs_ag", lambda: rs_ag(x)),
            ]

        ops = [OpToTune(f"op{i}", candidates()) for i in range(nops)]
        benchmarker = CollectiveBenchmarker(
            None, CollectiveBenchmarkConfig(timedelta(seconds=60), NWARMUP, NRUNS)
        )
        benchmarker.run_batch(ops[:1])  # builds the benchmark channel
        samples = []
        for _ in range(5):
            dist.barrier()
            counters.clear()
            start = time.perf_counter()
            for batch in [ops] if path == "V2" else [[op] for op in ops]:
                benchmarker.run_batch(batch)
            stats = counters["collective_autotuning"]
            samples.append(
                {
                    **{name: stats[name] for name in COUNTERS},
                    "wall_s": time.perf_counter() - start,
                }
            )
        report.update(
            {
                name: statistics.median(sample[name] for sample in samples)
                for name in samples[0]
            }
        )
    elif mode == "compare":
        import importlib.util
        from datetime import timedelta

        import types

        from torch._inductor.runtime.collective_benchmarking import (
            benchmarker as protocol_benchmarker,
            types as protocol_types,
        )

        # The old revision's protocol is one module; today's names live where
        # each is defined.
        current = types.SimpleNamespace(
            CollectiveBenchmarker=protocol_benchmarker.CollectiveBenchmarker,
            CollectiveBenchmarkConfig=protocol_types.CollectiveBenchmarkConfig,
            Candidate=protocol_types.Candidate,
            OpToTune=protocol_types.OpToTune,
        )

        spec = importlib.util.spec_from_file_location("per_candidate_protocol", path)
        previous = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = previous  # its dataclasses look their module up there
        spec.loader.exec_module(previous)
        previous._STORE_PREFIX = (
            "per_candidate_protocol"  # its sessions must not meet this one's keys
        )
        x = torch.ones(1 << 16)
        implementations = {
            "default": lambda: all_reduce_op(x),
            "direct": lambda: direct(x),
            "rs_ag": lambda: rs_ag(x),
        }
        protocols = {}
        for label, module in (("per-candidate", previous), ("session", current)):
            config = module.CollectiveBenchmarkConfig(
                timedelta(seconds=60), NWARMUP, NRUNS
            )
            candidates = [
                module.Candidate(n, f, is_default=n == "default")
                for n, f in implementations.items()
            ]
            ops = [module.OpToTune(f"op{i}", candidates) for i in range(nops)]
            protocols[label] = (module.CollectiveBenchmarker(None, config), ops)
        medians: dict[str, list[float]] = {}
        winners: dict[str, list[str]] = {}
        for _ in range(
            COMPARE_SESSIONS
        ):  # the two protocols in turn, so that both see the same machine
            for label, (benchmarker, ops) in protocols.items():
                dist.barrier()
                for decision in benchmarker.run_batch(ops):
                    for result in decision.results:
                        medians.setdefault(f"{label}|{result.name}", []).append(
                            result.time_ms
                        )
                    winners.setdefault(label, []).append(decision.winner)
        report.update(medians=medians, winners=winners)
    elif mode == "compile":
        distinct = nops < 0  # -n: n distinct ops, the same op on inputs of n sizes
        count = abs(nops)
        sizes = [(1 << 12) + (256 * i if distinct else 0) for i in range(count)]

        def program(*xs):
            return [
                torch.relu(all_reduce_op(x) * 0.5 + (i + 1)) for i, x in enumerate(xs)
            ]

        xs = [torch.ones(size) / world for size in sizes]
        # "none": nothing is registered, so the op compiles as a plain custom op.
        with inductor_config.patch(
            **path_patches("V1" if path == "none" else path, caches=True)
        ):
            compiled = torch.compile(program)
            dist.barrier()
            counters.clear()
            start = time.perf_counter()
            compiled(*xs)
            report["first_call_s"] = time.perf_counter() - start
        report.update(
            {
                name: counters["collective_autotuning"][name]
                for name in ("ops", *COUNTERS)
            }
        )
    elif mode == "overhead":

        def program(x):
            for _ in range(nops):
                x = all_reduce_op(x) + 1
            return x

        x = torch.ones(1 << 16) / world
        # Inductor probes the CPU's vector ISA once per process, at the first
        # C++ kernel it generates (seconds: a build and a load per ISA).  In a
        # compile that tunes, that is a candidate's, so "compiling the
        # candidates" would hold a cost that every first compile pays: paid here.
        pick_vec_isa()
        with inductor_config.patch(**path_patches(path)):
            compiled = torch.compile(program)
            dist.barrier()
            counters.clear()
            compiled(x)
        stats = counters["collective_autotuning"]
        report.update({name: stats[name] for name in COUNTERS})
    else:
        rows, hidden = 256, 1024
        torch.manual_seed(rank)
        x = torch.randn(rows, hidden // world)
        w = torch.randn(hidden // world, hidden)
        b = torch.randn(hidden)

        # Three copies of one block: each its own code object, hence its own
        # compiled graph, compiled with the path's settings.
        def block_default(x, w, b):
            return torch.relu(all_reduce_op(x @ w) + b)

        def block_v1(x, w, b):
            return torch.relu(all_reduce_op(x @ w) + b)

        def block_v2(x, w, b):
            return torch.relu(all_reduce_op(x @ w) + b)

        compiled = {}
        for name, fn in (
            ("default", block_default),
            ("V1", block_v1),
            ("V2", block_v2),
        ):
            with inductor_config.patch(**path_patches(name)):
                compiled[name] = torch.compile(fn)
                compiled[name](x, w, b)
                ran.clear()
                compiled[name](x, w, b)
                report[f"{name}_winner"] = ran[0] if ran else "?"
        # Interleaved, so that the three share the machine's state.
        times: dict[str, list[float]] = {name: [] for name in compiled}
        for _ in range(runs):
            for name, fn in compiled.items():
                dist.barrier()
                start = time.perf_counter()
                fn(x, w, b)
                times[name].append((time.perf_counter() - start) * 1e3)
        report.update(
            {f"{name}_ms": statistics.median(values) for name, values in times.items()}
        )
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


# --- driver ----------------------------------------------------------------------
def launch(
    nproc: int, *worker_args: str, shared_cache: bool = False, settings: str = "bench"
) -> list[dict]:
    """One launch's reports; ``shared_cache``: its ranks share one fresh cache directory."""
    env = {SETTINGS_ENV: settings}
    if not shared_cache:
        return launch_ranks(__file__, nproc, list(worker_args), env=env)
    with tempfile.TemporaryDirectory(prefix="bench-autotuning-host-") as cache:
        return launch_ranks(
            __file__, nproc, list(worker_args), env={**env, CACHE_DIR_ENV: cache}
        )


def cache_dirs_label(shared_cache: bool) -> str:
    return (
        "the launch's ranks sharing one fresh cache directory (as a host's ranks do by default)"
        if shared_cache
        else "each rank with a fresh cache directory of its own (nothing shared)"
    )


def compile_table(
    nprocs: list[int],
    programs: list[str],
    repeats: int,
    shared_cache: bool,
    tuned_paths: list[str],
    settings: str,
) -> None:
    paths = ("none", *tuned_paths)
    runs = (
        "the autotuner's default warmups and timed runs"
        if settings == "defaults"
        else f"{NWARMUP} warmup + {NRUNS} timed runs per candidate"
    )
    print(
        "\nCompile wall time: first call of a program of n collective ops, each followed by relu(y * 0.5 + (i + 1)); "
        f"slowest rank, fresh processes, Inductor's caches on, {cache_dirs_label(shared_cache)}; "
        f"{runs}; median of {repeats} launches per path, interleaved; seconds. "
        "Compiling, warmups, timed runs: the candidates' compilation (with the first compile's "
        "costs of a process, which the untuned path pays in its own compile: more than the "
        "overhead, at times) and the sessions' warmups and timed runs (the slowest rank's, median)\n"
    )
    tuned = " | ".join(tuned_paths)
    print(
        f"| ranks | ops | no autotuning | {tuned} | "
        + " | ".join(f"overhead {p}" for p in tuned_paths)
        + " | "
        + " | ".join(
            f"compiling {p} | warmups {p} | timed runs {p}" for p in tuned_paths
        )
        + " |"
    )
    print("| --- " * (3 + 5 * len(tuned_paths)) + "|")
    for nproc in nprocs:
        for program in programs:
            nops = -int(program[:-1]) if program.endswith("d") else int(program)
            label = f"{abs(nops)} distinct" if nops < 0 else f"{nops} identical"
            # Launches interleaved across the paths, median per path: one
            # launch's compile time swings by seconds on a shared machine.
            walls: dict[str, list[float]] = {path: [] for path in paths}
            phases: dict[str, list[list[float]]] = {path: [] for path in paths}
            for _ in range(repeats):
                for path in paths:
                    rows = launch(
                        nproc,
                        "compile",
                        path,
                        str(nops),
                        "0",
                        shared_cache=shared_cache,
                        settings=settings,
                    )
                    walls[path].append(max(r["first_call_s"] for r in rows))
                    phases[path].append([max(r[name] for r in rows) for name in PHASES])
            wall = {path: statistics.median(values) for path, values in walls.items()}
            overhead = {
                path: f"{wall[path] - wall['none']:+.1f} s ({(wall[path] - wall['none']) / wall['none']:.0%})"
                for path in tuned_paths
            }
            print(
                f"| {nproc} | {label} | "
                + " | ".join(f"{wall[path]:.1f}" for path in paths)
                + " | "
                + " | ".join(overhead[path] for path in tuned_paths)
                + " | "
                + " | ".join(
                    f"{statistics.median(launch[i] for launch in phases[path]):.2f}"
                    for path in tuned_paths
                    for i in range(len(PHASES))
                )
                + " |",
                flush=True,
            )


def overhead_table(nprocs: list[int], op_counts: list[int], shared_cache: bool) -> None:
    print(
        "\nAutotuning overhead per compile (slowest rank; seconds unless noted); "
        f"{cache_dirs_label(shared_cache)}\n"
    )
    print(
        "| ranks | ops | path | pre-syncs | total | compile | timed | warmup | pre-sync | exchange sync "
        "| sync V2/V1 |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for nproc in nprocs:
        for nops in op_counts:
            rows = {}
            for path in ("V1", "V2"):
                reports = launch(
                    nproc, "overhead", path, str(nops), "0", shared_cache=shared_cache
                )
                rows[path] = {
                    name: max(report[name] for report in reports) for name in COUNTERS
                }
            sync = {
                path: row["presync_s"] + row["sync_s"] for path, row in rows.items()
            }
            for path, row in rows.items():
                total = row["prepare_s"] + row["session_s"]
                ratio = "" if path == "V1" else f"{sync[path] / sync['V1']:.0%}"
                print(
                    f"| {nproc} | {nops} | {path} | {row['presync']:.0f} | {total:.2f} | {row['prepare_s']:.2f} "
                    f"| {row['timed_s']:.3f} | {row['warmup_s']:.3f} | {row['presync_s']:.3f} | {row['sync_s']:.3f} "
                    f"| {ratio} |",
                    flush=True,
                )


def protocol_table(nprocs: list[int], op_counts: list[int]) -> None:
    print(
        "\nThe protocol alone: candidates already compiled, ranks entering together (after a barrier); "
        "median of 5, slowest rank, seconds\n"
    )
    print(
        "| ranks | ops | path | pre-syncs | sync collectives / session | wall | timed | pre-sync | exchange sync "
        "| sync / timed | V2/V1: pre-sync, all sync |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for nproc in nprocs:
        for nops in op_counts:
            rows = {
                path: launch(nproc, "protocol", path, str(nops), "0")
                for path in ("V1", "V2")
            }
            rows = {
                path: {name: max(r[name] for r in reports) for name in reports[0]}
                for path, reports in rows.items()
            }
            sync = {
                path: row["presync_s"] + row["sync_s"] for path, row in rows.items()
            }
            presync = rows["V2"]["presync_s"] / rows["V1"]["presync_s"]
            for path, row in rows.items():
                ratio = (
                    ""
                    if path == "V1"
                    else f"{presync:.0%}, {sync['V2'] / sync['V1']:.0%}"
                )
                print(
                    f"| {nproc} | {nops} | {path} | {row['presync']:.0f} | {row['sync_collectives'] / row['presync']:g} "
                    f"| {row['wall_s']:.3f} | {row['timed_s']:.3f} | {row['presync_s']:.4f} | {row['sync_s']:.4f} "
                    f"| {sync[path] / row['timed_s']:.1%} | {ratio} |",
                    flush=True,
                )


def compare_table(nprocs: list[int], revision: str) -> None:
    root = Path(__file__).resolve().parent.parent
    source = subprocess.run(
        ["git", "show", f"{revision}:{PROTOCOL_PATH}"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    print(
        f"\nMedians and winners: the per-candidate barrier ({revision}) against the session exchange, the same "
        f"3 ops x 3 candidates benchmarked by both in turn, {COMPARE_SESSIONS} sessions each; agreed time "
        "(slowest rank's median) per op and session: median [inter-quartile range], ms\n"
    )
    print(
        "| ranks | candidate | per-candidate barrier | session exchange | ratio | winners (per-candidate) | winners (session) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")

    def summary(values: list[float]) -> str:
        q1, median, q3 = statistics.quantiles(values, n=4)
        return f"{median:.3f} [{q1:.3f}, {q3:.3f}]"

    with tempfile.NamedTemporaryFile("w", suffix=".py") as module:
        module.write(source)
        module.flush()
        for nproc in nprocs:
            report = launch(nproc, "compare", module.name, "3", "0")[
                0
            ]  # agreed values: the same on every rank
            winners = {
                label: collections.Counter(report["winners"][label])
                for label in ("per-candidate", "session")
            }
            for name in ("default", "direct", "rs_ag"):
                before, after = (
                    report["medians"][f"{label}|{name}"]
                    for label in ("per-candidate", "session")
                )
                ratio = statistics.median(after) / statistics.median(before)
                cells = [
                    f"{winners[label][name]}/{sum(winners[label].values())}"
                    for label in winners
                ]
                print(
                    f"| {nproc} | {name} | {summary(before)} | {summary(after)} | {ratio:.2f} | {' | '.join(cells)} |",
                    flush=True,
                )


def block_table(nprocs: list[int], runs: int) -> None:
    print(
        f"\nTensor-parallel block relu(all_reduce(x @ w) + b), x 256x(1024/ranks), w (1024/ranks)x1024: "
        f"median of {runs} calls, the three compiled programs interleaved in one launch, slowest rank\n"
    )
    print("| ranks | compiled with | winner | run time (ms) | vs default |")
    print("| --- | --- | --- | --- | --- |")
    for nproc in nprocs:
        reports = launch(nproc, "block", "-", "1", str(runs))
        default_ms = max(report["default_ms"] for report in reports)
        for path in ("default", "V1", "V2"):
            ms = max(report[f"{path}_ms"] for report in reports)
            print(
                f"| {nproc} | {path} | {reports[0][f'{path}_winner']} | {ms:.3f} | {ms / default_ms:.2f}x |",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nproc", default="2,4", help="comma-separated world sizes")
    parser.add_argument(
        "--ops", default="1,3,8", help="comma-separated collective op counts"
    )
    parser.add_argument(
        "--runs", type=int, default=50, help="timed calls of the compiled block"
    )
    parser.add_argument(
        "--compare-with",
        default=PER_CANDIDATE_PROTOCOL,
        help="git revision of the older protocol",
    )
    parser.add_argument(
        "--tables",
        default="compile,overhead,protocol,compare,block",
        help="which tables to print",
    )
    parser.add_argument(
        "--compile-ops",
        default="1,3d,8d,32",
        help="programs of the compile table (Nd: N distinct)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="launches per path and cell of the compile table",
    )
    parser.add_argument(
        "--compile-paths",
        default="V1,V2",
        help="tuned paths of the compile table, beside no autotuning: V1 or V2, "
        f"each maybe with an integer setting (V2{SETTING_SEP}collective_benchmark_race_every=0)",
    )
    parser.add_argument(
        "--settings",
        choices=("bench", "defaults"),
        default="bench",
        help=f"compile table: {NWARMUP} warmup and {NRUNS} timed runs per candidate "
        "(bench), or the autotuner's defaults (defaults)",
    )
    parser.add_argument(
        "--cache-dirs",
        choices=("host", "rank"),
        default="host",
        help="compile and overhead tables: one cache directory per launch, shared by its "
        "ranks as a host's ranks share Inductor's default one (host), or one per rank (rank)",
    )
    parser.add_argument(
        "--worker",
        nargs=4,
        metavar=("MODE", "PATH", "NOPS", "RUNS"),
        help=argparse.SUPPRESS,
    )
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        mode, path, nops, runs = args.worker
        worker(mode, path, int(nops), int(runs), Path(args.out))
        return
    import torch
    import torch._inductor.config as inductor_config

    nprocs = [int(n) for n in args.nproc.split(",")]
    print(
        f"torch {torch.__version__}, gloo, {os.cpu_count()} CPUs, {NWARMUP} warmup + {NRUNS} timed runs per candidate"
        + (" (the compile table: --settings)" if args.settings == "defaults" else "")
    )
    op_counts = [int(n) for n in args.ops.split(",")]
    tables = args.tables.split(",")
    for path in args.compile_paths.split(","):
        base, _, setting = path.partition(SETTING_SEP)
        knob, _, value = setting.partition("=")
        valid_setting = hasattr(inductor_config, knob) and value.lstrip("-").isdigit()
        if base not in ("V1", "V2") or (setting and not valid_setting):
            parser.error(
                f"--compile-paths: {path!r} is not V1 or V2, maybe with "
                f"{SETTING_SEP}KNOB=INT of torch._inductor.config"
            )
    if "compile" in tables:
        compile_table(
            nprocs,
            args.compile_ops.split(","),
            args.repeats,
            args.cache_dirs == "host",
            args.compile_paths.split(","),
            args.settings,
        )
    if "overhead" in tables:
        overhead_table(nprocs, op_counts, args.cache_dirs == "host")
    if "protocol" in tables:
        protocol_table(nprocs, op_counts)
    if "compare" in tables:
        compare_table(nprocs, args.compare_with)
    if "block" in tables:
        block_table(nprocs, args.runs)


if __name__ == "__main__":
    main()
