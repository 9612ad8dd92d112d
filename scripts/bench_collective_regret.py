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
  once per round, in a shuffled order that every rank shares).  A program's
  time in a round is its slowest rank's; its time is the median over the
  rounds.  The oracle's best is the program with the lowest median time, the
  runner-up the second lowest.

The oracle's uncertainty (robust statistics only: medians of repeats, as
Triton's autotuner uses, never means of timings):

* **Each program's time**: the median with a distribution-free 95% confidence
  interval from order statistics: ``[x(k), x(n+1-k)]`` of the n sorted
  round times, with k the largest rank such that P(Binomial(n, 1/2) <= k-1)
  <= 2.5%, so the interval covers the true median with probability >= 95%
  whatever the distribution (exact binomial ranks, no bootstrap, no seed; at
  least 6 rounds are needed).
* **Comparisons are paired**: the rounds are interleaved, so for programs A
  and B the script takes the ratio A/B within each round (slowest rank's
  times, same round) and reports the median of these n ratios with the same
  order-statistics 95% CI.  Drift of the machine between rounds cancels in
  each ratio.  The intervals are per comparison (no multiple-comparison
  correction).
* A comparison is **resolvable** where its CI excludes 1; otherwise the
  oracle cannot tell the two programs apart and the cell prints a **tie**.

Per cell it prints the oracle's best (median [CI]), the runner-up's paired
lead over it, the default's time, the autotuner's choices and, per distinct
choice, its paired ratio to the oracle's best (regret: median ratio - 1, with
its CI) and to the default, and how often the most frequent choice repeats;
then each program's time with its CI.  Point estimates are always printed;
the CI decides what counts:

* **regret** of a compile: its choice's median ratio to the best - 1 where
  the CI lies above 1, else 0 (a tie with the best, or the best itself, costs
  nothing).  A cell's regret is the mean over its compiles; the point-estimate
  mean (ties counted at their median ratio) is printed beside it.
* **harm**: a choice whose ratio to the default has its CI above 1 (resolvably
  slower than the default).  A cell violates the default target where a
  harmful choice is more than 3% slower at the median (the number of cells
  whose whole CI lies above 1.03 is printed too).
* **clear cells**: the runner-up's paired ratio to the best is >= 1.10 at the
  median and its CI lies above 1 (the best leads by >= 10%, resolvably).

The targets: no cell violates the default target; the mean of the cells'
regrets (ties as 0) is at most 3%; in every clear cell the most frequent
choice repeats in at least 80% of the compiles (4 of 5 with the default
``--compiles 5``).  Per world size it prints a matrix op x size with each
cell's regret, its worst choice against the default and its repeat count.

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
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

from torch.testing._internal.distributed.collective_autotuning_jobs import (
    private_cache_dir,
    rank_env,
)

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


# --- worker (one process per rank) --------------------------------------------------
def worker(
    kinds: list[str],
    sizes: list[int],
    compiles: int,
    oracle_runs: int,
    out_dir: Path,
    compare: dict[str, int] | None = None,
) -> None:
    import torch
    import torch._inductor.config as inductor_config
    import torch.distributed as dist
    from torch._inductor.kernel.collective_implementations import (
        IMPLEMENTATIONS,
        register_collective_implementations,
    )
    from torch._inductor.runtime.collective_benchmarking import decision_cache
    from torch._inductor.select_algorithm import add_feedback_saver
    from torch._inductor.virtualized import V

    from demo_collective_autotuning import (
        CASES,
        DEFAULT,
        AutotuneRecorder,
        candidate_label,
        make_input,
    )

    private_cache_dir("bench-regret-")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    group_name = dist.group.WORLD.group_name
    recorder = AutotuneRecorder()
    add_feedback_saver(recorder.feedback)
    cells = []
    for kind in kinds:
        op = CASES[kind].op
        for size in sizes:
            x = make_input(size, rank, torch.device("cpu"))
            # The autotuner's choice, compile after compile (and, with
            # --compare, with its setting, interleaved with them).
            choices: dict[str, list[str]] = {"choices": [], "choices_compared": []}
            for _ in range(compiles):
                for field in choices if compare else ["choices"]:
                    torch._dynamo.reset()
                    decision_cache._remembered.clear()
                    register_collective_implementations(op, kind)
                    recorder.selected.clear()
                    setting = compare if field == "choices_compared" else {}
                    with (
                        V.set_choices_handler(recorder),
                        inductor_config.patch(
                            fx_graph_cache=False,
                            autotune_local_cache=False,
                            max_autotune_report_choices_stats=False,
                            **setting,
                        ),
                    ):
                        torch.compile(lambda x: op(x, group_name))(x)
                    choices[field].append(candidate_label(recorder.selected[-1], kind))
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
            # Per program, per round: the slowest rank's time.
            rounds = {
                name: [
                    max(runs)
                    for runs in zip(*(peer[name] for peer in everywhere), strict=True)
                ]
                for name in names
            }
            cells.append({"kind": kind, "size": size, **choices, "rounds_ms": rounds})
    if rank == 0:
        Path(out_dir, "cells.json").write_text(json.dumps(cells))
    dist.destroy_process_group()


# --- driver ----------------------------------------------------------------------
def launch(nproc: int, args: argparse.Namespace) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="bench-regret-") as out_dir:
        command = [
            sys.executable, __file__, "--worker", "--nproc", str(nproc), "--ops", args.ops, "--sizes", args.sizes,
            "--compiles", str(args.compiles), "--oracle-runs", str(args.oracle_runs), "--out", out_dir,
            *(["--compare", args.compare] if args.compare else []),
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


# --- statistics ------------------------------------------------------------------
CONFIDENCE = 0.95
# The fewest rounds whose extreme order statistics give a 95% CI of the median.
MIN_ROUNDS = 6


def median_ci(
    values: list[float], confidence: float = CONFIDENCE
) -> tuple[float, float, float]:
    """``(median, low, high)``: the median and a distribution-free CI of it from order statistics.

    The number of values below the true median is Binomial(n, 1/2), so
    ``[x(k), x(n+1-k)]`` (1-based ranks of the sorted values) covers it with
    probability ``1 - 2 P(B <= k-1)``; k is the largest rank that keeps this
    at least ``confidence`` (exact integer arithmetic).  With too few values
    for any such k, the interval is unbounded (``-inf, inf``).
    """
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        raise ValueError("median_ci of no values")
    # P(B <= k-1) <= alpha/2  <=>  2 * sum_{i<k} C(n, i) * den <= num * 2**n
    alpha = Fraction(1 - confidence).limit_denominator(10**6)
    bound = alpha.numerator * 2**n
    k, below = 0, 0
    while (
        k < (n + 1) // 2 and 2 * (below + math.comb(n, k)) * alpha.denominator <= bound
    ):
        below += math.comb(n, k)
        k += 1
    median = statistics.median(xs)
    if k == 0:
        return median, -math.inf, math.inf
    return median, xs[k - 1], xs[n - k]


def paired_ratio(
    numerator: list[float], denominator: list[float]
) -> tuple[float, float, float]:
    """Median and CI of the per-round ratios numerator/denominator (same rounds, paired)."""
    return median_ci([a / b for a, b in zip(numerator, denominator, strict=True)])


def verdict(ratio: tuple[float, float, float]) -> str:
    """'slower' where the ratio's CI lies above 1, 'faster' where below, else 'tie'."""
    _, low, high = ratio
    return "slower" if low > 1 else "faster" if high < 1 else "tie"


# --- summary ---------------------------------------------------------------------
HARM_LIMIT = 1.03  # a harmful choice (resolvably slower than the default) may be at most this much slower
REGRET_TARGET = 0.03
CLEAR_LEAD = 1.10  # the best leads the runner-up by this factor, resolvably
SAME_CHOICE = 0.8  # of the compiles, in clear cells: 4 of 5


def summarize(nproc: int, cell: dict, default: str) -> dict:
    rounds = cell["rounds_ms"]
    times = {name: median_ci(rounds[name]) for name in rounds}
    ranked = sorted(times, key=lambda name: times[name][0])
    best, runner_up = ranked[0], ranked[1]
    lead = paired_ratio(rounds[runner_up], rounds[best])
    counts = collections.Counter(cell["choices"])
    per_choice = {}
    for choice in counts:
        vs_best = paired_ratio(rounds[choice], rounds[best])
        vs_default = paired_ratio(rounds[choice], rounds[default])
        per_choice[choice] = {
            "vs_best": vs_best,
            "vs_default": vs_default,
            # Ties with the best (the CI includes 1), and the best itself, cost nothing.
            "regret": vs_best[0] - 1 if verdict(vs_best) == "slower" else 0.0,
            "harm": verdict(vs_default) == "slower",
        }
    # The worst choice against the default: a harmful one first, then the slowest at the median.
    worst = max(
        per_choice,
        key=lambda c: (per_choice[c]["harm"], per_choice[c]["vs_default"][0]),
    )
    repeat = counts.most_common(1)[0][1]
    clear = lead[0] >= CLEAR_LEAD and verdict(lead) == "slower"
    return {
        "nproc": nproc,
        "kind": cell["kind"],
        "size": cell["size"],
        "rounds": len(rounds[best]),
        "times": times,
        "ranked": ranked,
        "best": best,
        "runner_up": runner_up,
        "lead": lead,
        "default": default,
        "choices": counts,
        "per_choice": per_choice,
        "regret": statistics.mean(per_choice[c]["regret"] for c in cell["choices"]),
        "regret_point": statistics.mean(
            per_choice[c]["vs_best"][0] - 1 for c in cell["choices"]
        ),
        "worst": worst,
        "worst_vs_default": per_choice[worst]["vs_default"],
        "harm": per_choice[worst]["harm"],
        "violation": any(
            v["harm"] and v["vs_default"][0] > HARM_LIMIT for v in per_choice.values()
        ),
        "ci_above_limit": any(
            v["vs_default"][1] > HARM_LIMIT for v in per_choice.values()
        ),
        "clear": clear,
        "repeat": repeat,
        "compiles": len(cell["choices"]),
        "stable": repeat >= SAME_CHOICE * len(cell["choices"]),
    }


def ms(interval: tuple[float, float, float]) -> str:
    median, low, high = interval
    return f"{median:.3f} [{low:.3f}, {high:.3f}]"


def percent(ratio: tuple[float, float, float]) -> str:
    """A paired ratio as a difference: '+4.1% [+2.0%, +6.3%]'."""
    median, low, high = ratio
    return f"{median - 1:+.1%} [{low - 1:+.1%}, {high - 1:+.1%}]"


def times_x(ratio: tuple[float, float, float]) -> str:
    median, low, high = ratio
    return f"{median:.2f}x [{low:.2f}, {high:.2f}]"


def kb(size: int) -> str:
    return f"{4 * size / 1024:g}"


def print_cells(rows: list[dict]) -> None:
    print(
        "| ranks | op | KB / rank | oracle best: ms [95% CI] | runner-up behind (paired) | default: ms [95% CI] "
        "| choices | vs best per choice (paired; regret) | mean regret: counted (point) "
        "| worst choice vs default (paired) | same choice |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        choices = ", ".join(
            f"{name} {count}" for name, count in row["choices"].most_common()
        )
        regrets = "; ".join(
            f"{name}: best"
            if name == row["best"]
            else f"{name}: {percent(row['per_choice'][name]['vs_best'])}"
            + (
                ""
                if verdict(row["per_choice"][name]["vs_best"]) == "slower"
                else " tie"
            )
            for name, _ in row["choices"].most_common()
        )
        lead_verdict = "" if verdict(row["lead"]) == "slower" else " tie"
        harm = {"slower": " harm", "faster": " faster", "tie": " tie"}[
            verdict(row["worst_vs_default"])
        ] + (f" >{HARM_LIMIT - 1:.0%}" if row["violation"] else "")
        print(
            f"| {row['nproc']} | {row['kind']} | {kb(row['size'])} | {row['best']} {ms(row['times'][row['best']])} "
            f"| {row['runner_up']} {percent(row['lead'])}{lead_verdict} | {ms(row['times'][row['default']])} "
            f"| {choices} | {regrets} | {row['regret']:.1%} ({row['regret_point']:+.1%}) "
            f"| {row['worst']} {times_x(row['worst_vs_default'])}{harm} | {row['repeat']}/{row['compiles']} |",
            flush=True,
        )


def print_oracle(rows: list[dict]) -> None:
    print(
        "\n| ranks | op | KB / rank | rounds | every program's time: median [95% CI] (ms), fastest first |"
    )
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        programs = "; ".join(
            f"{name} {ms(row['times'][name])}" for name in row["ranked"]
        )
        print(
            f"| {row['nproc']} | {row['kind']} | {kb(row['size'])} | {row['rounds']} | {programs} |"
        )


def regret_label(row: dict) -> str:
    """The regret counted: '0' where every choice is the best, '0 (tie)' where some only tie with it."""
    if row["regret"]:
        return f"{row['regret']:.1%}"
    return "0" if set(row["choices"]) == {row["best"]} else "0 (tie)"


def print_matrix(nproc: int, rows: list[dict]) -> None:
    sizes = sorted({row["size"] for row in rows})
    kinds = list(dict.fromkeys(row["kind"] for row in rows))
    cells = {(row["kind"], row["size"]): row for row in rows}
    print(
        f"\n{nproc} ranks: mean regret {statistics.mean(row['regret'] for row in rows):.1%} "
        "(ties 0); per cell: regret counted, worst choice vs default (median; tie/slower/faster "
        "by its CI), same choice (* where the best leads by >= 10%, resolvably); FAILS marks a missed target\n"
    )
    print("| op | " + " | ".join(f"{kb(size)} KB" for size in sizes) + " |")
    print("| --- |" + " --- |" * len(sizes))
    for kind in kinds:
        entries = []
        for size in sizes:
            row = cells.get((kind, size))
            if row is None:
                entries.append("")
                continue
            failed = [
                name
                for name, missed in (
                    ("default", row["violation"]),
                    ("stability", row["clear"] and not row["stable"]),
                )
                if missed
            ]
            entries.append(
                f"{regret_label(row)}, "
                f"{row['worst_vs_default'][0]:.2f}x {verdict(row['worst_vs_default'])}, "
                f"{row['repeat']}/{row['compiles']}{'*' if row['clear'] else ''}"
                + (f" FAILS {'+'.join(failed)}" if failed else "")
            )
        print(f"| {kind} | " + " | ".join(entries) + " |")


def print_targets(rows: list[dict]) -> None:
    harmful = [row for row in rows if row["harm"]]
    violations = [row for row in rows if row["violation"]]
    above = [row for row in rows if row["ci_above_limit"]]
    clear = [row for row in rows if row["clear"]]
    stable = [row for row in clear if row["stable"]]
    worst = max(rows, key=lambda row: (row["harm"], row["worst_vs_default"][0]))
    regret = statistics.mean(row["regret"] for row in rows)
    point = statistics.mean(row["regret_point"] for row in rows)

    def where(row: dict) -> str:
        return f"{row['kind']}, {kb(row['size'])} KB, {row['nproc']} ranks"

    def met(ok: bool) -> str:
        return "met" if ok else "MISSED"

    print()
    print(
        f"- mean regret over {len(rows)} cells: {regret:.1%}, a compile's regret counted only where its "
        f"choice's paired ratio to the best has its 95% CI above 1 (ties and the best itself: 0) "
        f"(target <= {REGRET_TARGET:.0%}: {met(regret <= REGRET_TARGET)}); point estimate, ties included: {point:+.1%}"
    )
    print(
        f"- cells with a choice resolvably slower than the default (paired CI above 1): {len(harmful)}; "
        f"of them more than {HARM_LIMIT - 1:.0%} slower at the median: {len(violations)} "
        f"(target 0: {met(not violations)}); with the whole CI above {HARM_LIMIT:.2f}x: {len(above)}; "
        f"worst: {worst['worst']} {times_x(worst['worst_vs_default'])} ({where(worst)})"
    )
    for row in violations:
        print(f"  - {where(row)}: {row['worst']} {times_x(row['worst_vs_default'])}")
    print(
        f"- cells where the oracle's best leads the runner-up by >= {CLEAR_LEAD - 1:.0%} at the median with "
        f"the paired CI above 1: {len(clear)}; the same choice in >= {SAME_CHOICE:.0%} of the compiles "
        f"in {len(stable)} of them (target: all: {met(len(stable) == len(clear))})"
    )
    for row in clear:
        if not row["stable"]:
            choices = ", ".join(f"{n} {c}" for n, c in row["choices"].most_common())
            print(f"  - {where(row)}: {choices}")
    ties = sum(
        1
        for row in rows
        for name, v in row["per_choice"].items()
        if name != row["best"] and verdict(v["vs_best"]) != "slower"
    )
    print(
        f"- distinct choices other than the best that the oracle cannot tell from it (ties): {ties}; "
        f"runner-ups it cannot tell from the best: {sum(verdict(row['lead']) != 'slower' for row in rows)} "
        f"of {len(rows)} cells"
    )


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
    parser.add_argument(
        "--compare",
        metavar="KNOB=INT",
        help="also take the choice of as many compiles with this integer "
        "torch._inductor.config setting (e.g. collective_benchmark_race_every=0), "
        "interleaved with the defaults' compiles, against the same oracle",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    compare = None
    if args.compare:
        knob, _, value = args.compare.partition("=")
        if not value.lstrip("-").isdigit():
            parser.error(f"--compare takes KNOB=INT, got {args.compare!r}")
        compare = {knob: int(value)}
    if args.worker:
        worker(args.ops.split(","), [int(s) for s in args.sizes.split(",")], args.compiles, args.oracle_runs,
               Path(args.out), compare)  # fmt: skip
        return
    if args.oracle_runs < MIN_ROUNDS:
        parser.error(
            f"--oracle-runs must be at least {MIN_ROUNDS} for a 95% CI of a median"
        )
    import torch
    import torch._inductor.config as inductor_config

    from demo_collective_autotuning import DEFAULT

    if compare and not hasattr(inductor_config, knob):
        parser.error(f"--compare: torch._inductor.config has no {knob!r}")

    print(
        f"torch {torch.__version__}, gloo, {os.cpu_count()} CPUs; autotuner defaults; {args.compiles} compiles per "
        f"cell; oracle: {args.oracle_runs} interleaved rounds, slowest rank per round, median; 95% CIs of "
        "medians from order statistics (binomial ranks); comparisons are medians of per-round (paired) ratios\n"
    )
    rows, rows_compared = [], []
    for nproc in [int(n) for n in args.nproc.split(",")]:
        print(f"## {nproc} ranks\n")
        cells = launch(nproc, args)
        ranks_rows = [summarize(nproc, cell, DEFAULT) for cell in cells]
        rows += ranks_rows
        print_cells(ranks_rows)
        print_oracle(ranks_rows)
        print_matrix(nproc, ranks_rows)
        if compare:
            compared = [
                summarize(nproc, {**cell, "choices": cell["choices_compared"]}, DEFAULT)
                for cell in cells
            ]
            rows_compared += compared
            print(f"\nWith {args.compare}, the same oracle:")
            print_matrix(nproc, compared)
        print(flush=True)
    print("## Targets")
    print_targets(rows)
    if compare:
        print(f"\n## Targets, with {args.compare} (the same oracles)")
        print_targets(rows_compared)


if __name__ == "__main__":
    main()
