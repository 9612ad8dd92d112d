#!/usr/bin/env python3
"""Regret of collective autotuning: its choices against a long interleaved measurement.

For a matrix of collectives (all_reduce, all_gather, reduce_scatter,
all_to_all) x sizes (from latency-bound to bandwidth-bound) x world sizes,
with the implementations of ``torch._inductor.kernel.collective_implementations``
registered for the demo's ops (``scripts/demo_collective_autotuning.py``):

* **The autotuner's choice**, taken over ``--compiles`` separate compiles of
  the op (Dynamo reset, remembered decisions forgotten, caches off), with the
  default settings (``collective_benchmark_nruns``, warmup, tie tolerance,
  confidence).
* **The oracle**: every implementation compiled on its own, and the op's
  eager default, run interleaved for ``--oracle-runs`` rounds (every program
  once per round, in a shuffled order that every rank shares); a program's
  time in a round is its slowest rank's, and its time the median over the
  rounds.  The oracle's best is the fastest program.

Per cell it prints the oracle's best and how far the runner-up is behind it,
the autotuner's choices, the regret of each choice (its oracle time / the
oracle's best - 1, averaged), the choice's time against the default's (the
worst of the compiles), and how often the most frequent choice repeats.
Then the targets: never slower than the default by more than 3% in any cell,
mean regret at most 3%, and, where the oracle's best beats the runner-up by
10% or more, the same choice in at least 4 of 5 compiles.

Usage:
  python scripts/bench_collective_regret.py [--nproc 2,3,4] [--sizes 240,16368,1048560]
      [--ops all_reduce,all_gather,reduce_scatter,all_to_all] [--compiles 5] [--oracle-runs 200]

Sizes are float32 elements per rank (multiples of 48, so that every world
size and chunking divides them): 1 KB, 64 KB and 4 MB by default.
"""

import argparse
import collections
import functools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_collective_decisions import rank_env

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


# --- worker (one process per rank) --------------------------------------------------
def worker(
    kinds: list[str], sizes: list[int], compiles: int, oracle_runs: int, out_dir: Path
) -> None:
    import torch
    import torch._inductor.config as inductor_config
    import torch.distributed as dist
    from torch._inductor.kernel.collective_implementations import (
        IMPLEMENTATIONS,
        register_collective_implementations,
    )
    from torch._inductor.runtime import collective_decision_cache
    from torch._inductor.select_algorithm import add_feedback_saver
    from torch._inductor.virtualized import V

    from demo_collective_autotuning import (
        CASES,
        DEFAULT,
        AutotuneRecorder,
        candidate_label,
        make_input,
    )

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-regret-")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    group_name = dist.group.WORLD.group_name
    recorder = AutotuneRecorder()
    add_feedback_saver(recorder.feedback)
    cells = []
    for kind in kinds:
        op = CASES[kind].op
        for size in sizes:
            x = make_input(size, rank)
            # The autotuner's choice, compile after compile.
            choices = []
            for _ in range(compiles):
                torch._dynamo.reset()
                collective_decision_cache._remembered.clear()
                register_collective_implementations(op, kind)
                recorder.selected.clear()
                with (
                    V.set_choices_handler(recorder),
                    inductor_config.patch(
                        fx_graph_cache=False,
                        autotune_local_cache=False,
                        max_autotune_report_choices_stats=False,
                    ),
                ):
                    torch.compile(lambda x: op(x, group_name))(x)
                choices.append(candidate_label(recorder.selected[-1], kind))
            # The oracle: every implementation compiled alone, and the eager default.
            programs = {DEFAULT: lambda x: op(x, group_name)}
            for name, (fn, params) in IMPLEMENTATIONS[kind].items():
                # Each implementation's own function: a program of its own for Dynamo.
                programs[name] = torch.compile(
                    functools.partial(fn, group_name=group_name, **params)
                )
                programs[name](x)  # compiled now, not in the measurement
            samples = {name: [] for name in programs}
            names = list(programs)
            dist.barrier()
            for run in range(oracle_runs):
                order = names[:]
                random.Random(f"{kind}|{size}|{run}").shuffle(order)
                for name in order:
                    start = time.perf_counter()
                    programs[name](x)
                    samples[name].append((time.perf_counter() - start) * 1e3)
            everywhere: list = [None] * world
            dist.all_gather_object(everywhere, samples)
            oracle = {
                name: statistics.median(
                    max(runs)
                    for runs in zip(*(peer[name] for peer in everywhere), strict=True)
                )
                for name in names
            }
            cells.append(
                {"kind": kind, "size": size, "choices": choices, "oracle_ms": oracle}
            )
    if rank == 0:
        Path(out_dir, "cells.json").write_text(json.dumps(cells))
    dist.destroy_process_group()


# --- driver ----------------------------------------------------------------------
def launch(nproc: int, args: argparse.Namespace) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="bench-regret-") as out_dir:
        command = [
            sys.executable, __file__, "--worker", "--nproc", str(nproc), "--ops", args.ops, "--sizes", args.sizes,
            "--compiles", str(args.compiles), "--oracle-runs", str(args.oracle_runs), "--out", out_dir,
        ]  # fmt: skip
        env = rank_env(nproc)
        ranks = [
            subprocess.Popen(
                command,
                env={**env, "RANK": str(r)},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            for r in range(nproc)
        ]
        errors = [process.communicate(timeout=7200)[1] for process in ranks]
        result = Path(out_dir, "cells.json")
        if not result.exists():
            tail = (
                next((e for e in errors if e), b"")
                .decode(errors="replace")
                .strip()
                .splitlines()[-5:]
            )
            raise RuntimeError(f"{nproc} ranks: no result: " + " | ".join(tail))
        return json.loads(result.read_text())


def summarize(nproc: int, cell: dict, default: str) -> dict:
    oracle = cell["oracle_ms"]
    ranked = sorted(oracle, key=oracle.__getitem__)
    best, runner_up = ranked[0], ranked[1]
    regrets = [oracle[choice] / oracle[best] - 1 for choice in cell["choices"]]
    versus_default = [oracle[choice] / oracle[default] for choice in cell["choices"]]
    counts = collections.Counter(cell["choices"])
    return {
        "nproc": nproc,
        "kind": cell["kind"],
        "size": cell["size"],
        "best": best,
        "best_ms": oracle[best],
        "gap": oracle[runner_up] / oracle[best] - 1,
        "default_ms": oracle[default],
        "choices": counts,
        "regret": statistics.mean(regrets),
        "worst_vs_default": max(versus_default),
        "repeat": counts.most_common(1)[0][1],
        "compiles": len(cell["choices"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nproc", default="2,3,4")
    parser.add_argument(
        "--sizes", default="240,16368,1048560", help="float32 elements per rank"
    )
    parser.add_argument("--ops", default=",".join(KINDS))
    parser.add_argument("--compiles", type=int, default=5)
    parser.add_argument("--oracle-runs", type=int, default=200)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.ops.split(","), [int(s) for s in args.sizes.split(",")], args.compiles, args.oracle_runs,
               Path(args.out))  # fmt: skip
        return
    import torch

    from demo_collective_autotuning import DEFAULT

    print(
        f"torch {torch.__version__}, gloo, {os.cpu_count()} CPUs; autotuner defaults; {args.compiles} compiles per "
        f"cell; oracle: {args.oracle_runs} interleaved rounds, slowest rank per round, median\n"
    )
    print(
        "| ranks | op | KB / rank | oracle best (ms) | runner-up behind | default (ms) | choices | mean regret "
        "| worst vs default | same choice |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    rows = []
    for nproc in [int(n) for n in args.nproc.split(",")]:
        for cell in launch(nproc, args):
            row = summarize(nproc, cell, DEFAULT)
            rows.append(row)
            choices = ", ".join(
                f"{name} {count}" for name, count in row["choices"].most_common()
            )
            print(
                f"| {nproc} | {row['kind']} | {4 * row['size'] / 1024:g} | {row['best']} {row['best_ms']:.3f} "
                f"| {row['gap']:.0%} | {row['default_ms']:.3f} | {choices} | {row['regret']:.1%} "
                f"| {row['worst_vs_default']:.2f}x | {row['repeat']}/{row['compiles']} |",
                flush=True,
            )
    clear = [row for row in rows if row["gap"] >= 0.10]
    stable = [row for row in clear if row["repeat"] >= 4]
    worst = max(rows, key=lambda row: row["worst_vs_default"])
    print()
    print(
        f"- mean regret over every cell: {statistics.mean(row['regret'] for row in rows):.1%} (target <= 3%)"
    )
    print(
        f"- slowest choice against the default: {worst['worst_vs_default']:.2f}x ({worst['kind']}, "
        f"{4 * worst['size'] / 1024:g} KB, {worst['nproc']} ranks) (target <= 1.03x in every cell)"
    )
    print(
        f"- cells where the oracle's best leads by >= 10%: {len(clear)}; the same choice in >= 4 of 5 compiles "
        f"in {len(stable)} of them (target: all)"
    )


if __name__ == "__main__":
    main()
