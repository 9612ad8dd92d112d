#!/usr/bin/env python3
"""Decision quality of V2 against V1 on programs whose epilogue fuses differently with the candidates.

V1 times each candidate of a collective custom op alone; V2 times it with the
pointwise ops that follow the op (its *epilogue*) where the candidates' tails
meet them differently (``torch/_inductor/collective_autotuning/epilogue.py``).  This
script measures what that buys on real programs, with no injected delays.
The programs, as serving and training code write them (the demo's ops,
``scripts/demo_collective_autotuning.py``, with the library's
implementations, ``register_collective_implementations``):

* ``all_reduce_norm``: an all_reduce, a residual add and the pointwise part
  of a normalization (statistics given): ``((all_reduce(x) + residual) - mu)
  * rstd * gamma + beta``;
* ``reduce_scatter_gelu``: a reduce_scatter, a bias and an activation:
  ``gelu(reduce_scatter(x) + bias)``;
* ``all_gather_cast``: an all_gather and a dtype cast:
  ``all_gather(x).to(bfloat16)``;
* ``all_reduce_unfusable``: ``all_reduce_norm`` with only the
  implementations that end in their collective (``direct``,
  ``reduce_scatter_all_gather``): fusion cannot change the ranking, V2 times
  the candidates alone.

Per world size (``--nproc``), program and shape (``--shapes``, rows x
hidden, float32 per rank):

* **V1's and V2's choices**, each over ``--compiles`` compiles of the whole
  program (V1 and V2 interleaved; Dynamo reset, remembered decisions
  forgotten, caches off; the autotuner's default settings), and whether V2
  timed the candidates with the epilogue or alone (from its decision key).
* **The oracle**: the whole program compiled with each candidate forced
  (the implementation traced in place of the op; the default: the op's
  eager implementation, ``force_custom_op_decomposition=False``), run in
  ``--oracle-runs`` interleaved rounds (every program once per round, in an
  order shuffled per round and shared by every rank); a program's time in a
  round is its slowest rank's.  Medians with distribution-free 95%
  confidence intervals, and paired per-round ratios, as in
  ``scripts/bench_collective_regret.py`` (whose statistics this reuses).

For each compile where V2's choice differs from V1's, the paired ratio of
V2's program to V1's says whether V2 **wins** (CI below 1), **loses** (CI
above 1) or **ties** with it.  Every forced program's result is checked
against the default's.

Usage:
  python scripts/bench_collective_epilogues.py [--nproc 2,3,4] [--shapes 48x256,768x1024]
      [--programs all_reduce_norm,reduce_scatter_gelu,all_gather_cast,all_reduce_unfusable]
      [--compiles 3] [--oracle-runs 60]
"""

import argparse
import collections
import functools
import json
import os
import random
import sys
import time
from pathlib import Path

from torch.testing._internal.distributed.collective_autotuning_jobs import (
    launch_ranks,
    private_cache_dir,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_collective_regret import (
    median_ci,
    MIN_ROUNDS,
    ms,
    paired_ratio,
    percent,
    verdict,
)

# program -> (collective kind, the library's implementations registered; None: all)
PROGRAMS = {
    "all_reduce_norm": ("all_reduce", None),
    "reduce_scatter_gelu": ("reduce_scatter", None),
    "all_gather_cast": ("all_gather", None),
    "all_reduce_unfusable": ("all_reduce", ["direct", "reduce_scatter_all_gather"]),
}


def program_and_inputs(name: str, rows: int, hidden: int, rank: int):
    """``(program, inputs)``: ``program(collective, *inputs)`` with ``collective(x)`` the op."""
    import torch

    generator = torch.Generator().manual_seed(rank)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    x = randn(rows, hidden)
    if name in ("all_reduce_norm", "all_reduce_unfusable"):

        def program(collective, x, residual, mu, rstd, gamma, beta):
            return ((collective(x) + residual) - mu) * rstd * gamma + beta

        stats = (randn(rows, 1), randn(rows, 1).abs() + 0.5)
        return program, (x, randn(rows, hidden), *stats, randn(hidden), randn(hidden))
    if name == "reduce_scatter_gelu":

        def program(collective, x, bias):
            return torch.nn.functional.gelu(collective(x) + bias)

        return program, (x, randn(hidden))
    if name == "all_gather_cast":

        def program(collective, x):
            return collective(x).to(torch.bfloat16)

        return program, (x,)
    raise ValueError(f"unknown program {name!r}")


def compiled_variant(program, collective):
    """``program`` with ``collective`` bound, compiled, with a code object of its own.

    Each variant then has its own Dynamo cache entry, so that calling one
    never evaluates another's guards.
    """
    import torch

    code = program.__code__.replace()
    fn = type(program)(
        code, program.__globals__, program.__name__, None, program.__closure__
    )
    return torch.compile(functools.partial(fn, collective))


# --- worker (one process per rank) --------------------------------------------------
def worker(args: argparse.Namespace, out_dir: Path) -> None:
    private_cache_dir("bench-epilogues-")
    import torch
    import torch._inductor.config as inductor_config
    import torch.distributed as dist
    from torch._inductor.kernel.collective_implementations import (
        IMPLEMENTATIONS,
        register_collective_implementations,
    )
    from torch._inductor.runtime.collective_benchmarking import decision_cache
    from torch._inductor.virtualized import V

    from demo_collective_autotuning import (
        CASES,
        DEFAULT,
        AutotuneRecorder,
        candidate_label,
    )

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    group_name = dist.group.WORLD.group_name
    recorder = AutotuneRecorder()
    cells = []
    for name in args.programs.split(","):
        kind, names = PROGRAMS[name]
        op = CASES[kind].op
        for shape in args.shapes.split(","):
            rows, hidden = (int(n) for n in shape.split("x"))
            program, inputs = program_and_inputs(name, rows, hidden, rank)
            tuned = functools.partial(program, lambda x: op(x, group_name))
            registered = register_collective_implementations(op, kind, names)
            choices: dict[str, list[str]] = {"V1": [], "V2": []}
            v2_timed = set()
            for _ in range(args.compiles):
                for path in choices:
                    torch._dynamo.reset()
                    decision_cache._remembered.clear()
                    recorder.selected.clear()
                    with (
                        V.set_choices_handler(recorder),
                        inductor_config.patch(
                            fx_graph_cache=False,
                            autotune_local_cache=False,
                            defer_collective_autotuning=path == "V2",
                        ),
                    ):
                        torch.compile(tuned)(*inputs)
                    choices[path].append(candidate_label(recorder.selected[-1], kind))
                    if path == "V2":
                        # The decision key says what the candidates were timed with.
                        (key,) = decision_cache._remembered
                        v2_timed.add("alone" if "|alone|" in key[-1] else "epilogue")
            # The oracle: the whole program with each candidate forced.
            torch._dynamo.reset()
            programs = {}
            with inductor_config.patch(
                {"test_configs.force_custom_op_decomposition": False}
            ):
                programs[DEFAULT] = compiled_variant(
                    program, lambda x: op(x, group_name)
                )
                reference = programs[DEFAULT](*inputs)
            for implementation in registered:
                fn, params = IMPLEMENTATIONS[kind][implementation]
                programs[implementation] = compiled_variant(
                    program, functools.partial(fn, group_name=group_name, **params)
                )
                torch.testing.assert_close(
                    programs[implementation](*inputs),
                    reference,
                    **({"rtol": 1.6e-2, "atol": 1e-2} if kind == "all_gather" else {}),
                )
            labels = list(programs)
            samples = {label: [] for label in labels}
            dist.barrier()
            for run in range(args.oracle_runs):
                order = labels[:]
                random.Random(f"{name}|{shape}|{run}").shuffle(order)
                for label in order:
                    start = time.perf_counter()
                    programs[label](*inputs)
                    samples[label].append((time.perf_counter() - start) * 1e3)
            everywhere: list = [None] * world
            dist.all_gather_object(everywhere, samples)
            rounds = {
                label: [
                    max(runs)
                    for runs in zip(*(peer[label] for peer in everywhere), strict=True)
                ]
                for label in labels
            }
            cells.append(
                {
                    "program": name,
                    "shape": shape,
                    "choices": choices,
                    "v2_timed": sorted(v2_timed),
                    "rounds_ms": rounds,
                }
            )
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(cells if rank == 0 else []))
    dist.destroy_process_group()


# --- summary ---------------------------------------------------------------------
def summarize(nproc: int, cell: dict) -> dict:
    rounds = cell["rounds_ms"]
    times = {label: median_ci(rounds[label]) for label in rounds}
    best = min(times, key=lambda label: times[label][0])
    pairs = list(zip(cell["choices"]["V1"], cell["choices"]["V2"], strict=True))
    # Per compile where the two paths chose differently: V2's program against V1's.
    differing = [
        (v1, v2, paired_ratio(rounds[v2], rounds[v1])) for v1, v2 in pairs if v1 != v2
    ]
    outcomes = collections.Counter(
        {"faster": "win", "slower": "loss", "tie": "tie"}[verdict(ratio)]
        for _, _, ratio in differing
    )
    return {
        "nproc": nproc,
        "program": cell["program"],
        "shape": cell["shape"],
        "v2_timed": "/".join(cell["v2_timed"]),
        "times": times,
        "best": best,
        "choices": {
            path: collections.Counter(values)
            for path, values in cell["choices"].items()
        },
        "vs_best": {
            path: {
                choice: paired_ratio(rounds[choice], rounds[best])
                for choice in set(values)
            }
            for path, values in cell["choices"].items()
        },
        "compiles": len(pairs),
        "differing": differing,
        "outcomes": outcomes,
    }


def counted(counter: collections.Counter) -> str:
    return ", ".join(f"{name} {count}" for name, count in counter.most_common())


def print_cells(rows: list[dict]) -> None:
    print(
        "| ranks | program | rows x hidden | V2 timed | oracle best: ms [95% CI] | V1 choices | V2 choices "
        "| V1 vs best (paired) | V2 vs best (paired) | where V2 differs: V2's / V1's (paired) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:

        def against_best(path: str) -> str:
            return "; ".join(
                f"{choice}: best"
                if choice == row["best"]
                else f"{choice} {percent(ratio)}"
                + ("" if verdict(ratio) == "slower" else " tie")
                for choice, ratio in row["vs_best"][path].items()
            )

        differs = (
            "; ".join(
                f"{v2} / {v1} {percent(ratio)} "
                + {"faster": "win", "slower": "loss", "tie": "tie"}[verdict(ratio)]
                for v1, v2, ratio in row["differing"]
            )
            or "never"
        )
        print(
            f"| {row['nproc']} | {row['program']} | {row['shape']} | {row['v2_timed']} "
            f"| {row['best']} {ms(row['times'][row['best']])} | {counted(row['choices']['V1'])} "
            f"| {counted(row['choices']['V2'])} | {against_best('V1')} | {against_best('V2')} | {differs} |",
            flush=True,
        )


def print_oracle(rows: list[dict]) -> None:
    print(
        "\n| ranks | program | rows x hidden | every program's time: median [95% CI] (ms), fastest first |"
    )
    print("| --- | --- | --- | --- |")
    for row in rows:
        ranked = sorted(row["times"], key=lambda label: row["times"][label][0])
        programs = "; ".join(f"{label} {ms(row['times'][label])}" for label in ranked)
        print(f"| {row['nproc']} | {row['program']} | {row['shape']} | {programs} |")


def print_summary(rows: list[dict]) -> None:
    compiles = sum(row["compiles"] for row in rows)
    differing = sum(len(row["differing"]) for row in rows)
    outcomes = sum((row["outcomes"] for row in rows), collections.Counter())
    timed = collections.Counter(row["v2_timed"] for row in rows)
    print(
        f"\n- V2 timed the candidates with the epilogue in {timed.get('epilogue', 0)} of {len(rows)} cells, "
        f"alone in {timed.get('alone', 0)}"
    )
    print(
        f"- V2's choice differs from V1's in {differing} of {compiles} paired compiles: "
        f"{outcomes.get('win', 0)} wins, {outcomes.get('tie', 0)} ties, {outcomes.get('loss', 0)} losses "
        "(V2's program against V1's, paired 95% CI)"
    )
    for row in rows:
        for v1, v2, ratio in row["differing"]:
            print(
                f"  - {row['nproc']} ranks, {row['program']} {row['shape']}: {v2} (V2) / {v1} (V1) "
                f"{percent(ratio)}, {verdict(ratio)}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nproc", default="2,3,4")
    parser.add_argument(
        "--shapes", default="48x256,768x1024", help="rows x hidden per rank"
    )
    parser.add_argument("--programs", default=",".join(PROGRAMS))
    parser.add_argument("--compiles", type=int, default=3)
    parser.add_argument("--oracle-runs", type=int, default=60)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args, Path(args.out))
        return
    if args.oracle_runs < MIN_ROUNDS:
        parser.error(
            f"--oracle-runs must be at least {MIN_ROUNDS} for a 95% CI of a median"
        )
    import torch

    print(
        f"torch {torch.__version__}, gloo, {os.cpu_count()} CPUs; autotuner defaults; {args.compiles} compiles "
        f"per path and cell (V1, V2 interleaved); oracle: {args.oracle_runs} interleaved rounds of the whole "
        "program with each candidate forced, slowest rank per round; 95% CIs of medians from order statistics; "
        "comparisons are medians of per-round (paired) ratios\n"
    )
    worker_args = [
        "--shapes", args.shapes, "--programs", args.programs,
        "--compiles", str(args.compiles), "--oracle-runs", str(args.oracle_runs),
    ]  # fmt: skip
    rows = []
    for nproc in [int(n) for n in args.nproc.split(",")]:
        print(f"## {nproc} ranks\n")
        cells = launch_ranks(__file__, nproc, worker_args, timeout=7200)[0]
        ranks_rows = [summarize(nproc, cell) for cell in cells]
        rows += ranks_rows
        print_cells(ranks_rows)
        print_oracle(ranks_rows)
        print(flush=True)
    print("## Summary")
    print_summary(rows)


if __name__ == "__main__":
    main()
