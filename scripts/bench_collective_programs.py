#!/usr/bin/env python3
"""Compile-time cost of dynamic shapes and of range dispatch for collective autotuning.

One program, ``relu(all_reduce(x) * 0.5 + 1)`` on ``x`` of ``--rows`` x
``--cols`` float32, where ``all_reduce`` is the demo's custom op with the
library's implementations registered (``register_collective_implementations``),
compiled as:

* ``static``: ``torch.compile(program)``;
* ``dynamic=True``: ``torch.compile(program, dynamic=True)``;
* ``mark_dynamic``: the rows marked dynamic on the first input;
* ``ranges(k)``: the rows marked dynamic, the op registered with
  ``dispatch_on`` the rows and ``k - 1`` split points (``k`` ranges, the last
  benchmarked at ``--upper`` rows): one decision per range.

Each compile is measured in fresh processes (one per rank, ``--nproc``,
gloo, env:// rendezvous; Inductor's caches off, a private cache directory
per launch), on the slowest rank's first call, after a warm-up compile of an
unrelated program (a process's one-time costs); without autotuning (nothing
registered: the untuned program; range dispatch without autotuning is the
``mark_dynamic`` program), with V1 and with V2.  ``--repeats`` launches per
cell, interleaved, and their median.  The cost of dynamic shapes or ranges is
the difference to the static program on the same path; the sessions column
counts joins (one per decision under V1, one per graph under V2) and the
decisions column the decisions benchmarked, with the candidates each had.

Candidates are benchmarked at the size hint (ranges: at the top of each
range), so the benchmark itself costs about the same at every size; what
dynamic shapes add is the symbolic compilation of every candidate, and what
ranges add is one decision per range and the ``torch.cond`` dispatch.

The last column is the compilation of the candidates (the benchmarker's
``prepare_s``, slowest rank).

Usage:
  python scripts/bench_collective_programs.py [--nproc 2] [--repeats 3] [--rows 256]
      [--cols 256] [--upper 1024] [--programs static,dynamic,mark,ranges2,ranges4]
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from torch.testing._internal.distributed.collective_autotuning_jobs import (
    launch_ranks,
    private_cache_dir,
)

PROGRAMS = {
    "static": "static",
    "dynamic": "dynamic=True",
    "mark": "mark_dynamic",
    "ranges2": "ranges(2)",
    "ranges4": "ranges(4)",
}
PATHS = ("untuned", "V1", "V2")


# --- worker (one process per rank) --------------------------------------------------
def worker(program: str, path: str, args: argparse.Namespace, out_dir: Path) -> None:
    private_cache_dir("bench-programs-")
    import torch
    import torch._inductor.config as inductor_config
    import torch.distributed as dist
    from torch._dynamo.utils import counters
    from torch._inductor.kernel.collective_implementations import (
        register_collective_implementations,
    )
    from torch._inductor.select_algorithm import add_feedback_saver

    from demo_collective_autotuning import all_reduce_op

    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    group_name = dist.group.WORLD.group_name
    inductor_config.fx_graph_cache = False
    inductor_config.autotune_local_cache = False
    inductor_config.defer_collective_autotuning = path == "V2"
    candidates: list[int] = []
    add_feedback_saver(lambda timings, *rest: candidates.append(len(timings)))

    if path != "untuned":
        ranges = {"ranges2": 2, "ranges4": 4}.get(program)
        dispatch = {}
        if ranges is not None:
            # Split points spread over [1, upper]: the first range ends at
            # the rows of the measured input.
            step = args.upper // ranges
            splits = [args.rows, *range(args.rows + step, args.upper, step)]
            dispatch = {
                "dispatch_on": {
                    "tensor_name": "x",
                    "dim": 0,
                    "range_upper_bound": args.upper,
                },
                "split_points": sorted(set(splits))[: ranges - 1],
            }
        register_collective_implementations(all_reduce_op, "all_reduce", **dispatch)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(all_reduce_op(x, group_name) * 0.5 + 1)

    x = (torch.arange(args.rows * args.cols) % 251 + 1000 * rank).to(torch.float32)
    x = x.view(args.rows, args.cols)
    torch.compile(lambda x: torch.sin(x) * 3)(x)  # the process's one-time costs
    compiled = torch.compile(fn, dynamic=True if program == "dynamic" else None)
    if program in ("mark", "ranges2", "ranges4"):
        torch._dynamo.mark_dynamic(x, 0)
    counters.clear()
    dist.barrier()
    start = time.perf_counter()
    result = compiled(x)
    seconds = time.perf_counter() - start
    world = dist.get_world_size()
    expected = sum(
        (torch.arange(args.rows * args.cols) % 251 + 1000 * r).to(torch.float32)
        for r in range(world)
    ).view(args.rows, args.cols)
    torch.testing.assert_close(result, torch.relu(expected * 0.5 + 1), rtol=0, atol=0)
    report = {
        "first_call_s": seconds,
        "sessions": counters["collective_autotuning"]["presync"],
        "decisions": counters["collective_autotuning"]["ops"],
        "candidates": candidates,
        "prepare_s": counters["collective_autotuning"]["prepare_s"],
    }
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


# --- driver ----------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--cols", type=int, default=256)
    parser.add_argument("--upper", type=int, default=1024)
    parser.add_argument("--programs", default=",".join(PROGRAMS))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--program", help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.program, args.path, args, Path(args.out))
        return
    import torch

    programs = args.programs.split(",")
    sizes = [
        "--rows",
        str(args.rows),
        "--cols",
        str(args.cols),
        "--upper",
        str(args.upper),
    ]
    # cell (program, path) -> per launch: the slowest rank's report
    reports: dict[tuple[str, str], list[dict]] = {}
    cells = [
        (program, path)
        for program in programs
        for path in PATHS
        # Range dispatch untuned is the mark_dynamic program.
        if not (path == "untuned" and program.startswith("ranges"))
    ]
    if any(program.startswith("ranges") for program in programs):
        cells = list(dict.fromkeys([*cells, ("mark", "untuned")]))
    if "static" not in programs:
        cells = list(dict.fromkeys([*cells, ("static", "V1"), ("static", "V2")]))
    for repeat in range(args.repeats):
        for program, path in cells:  # interleaved: each repeat visits every cell
            ranks = launch_ranks(
                __file__,
                args.nproc,
                ["--program", program, "--path", path, *sizes],
            )
            slowest = max(ranks, key=lambda report: report["first_call_s"])
            reports.setdefault((program, path), []).append(slowest)
            print(
                f"# repeat {repeat + 1}/{args.repeats}: {program} {path} "
                f"{slowest['first_call_s']:.2f} s",
                file=sys.stderr,
                flush=True,
            )

    def median(program: str, path: str, field: str = "first_call_s") -> float:
        if path == "untuned" and program.startswith("ranges"):
            program = "mark"
        return statistics.median(r[field] for r in reports[(program, path)])

    def compiling(program: str, path: str) -> str:
        return f"{median(program, path, 'prepare_s'):.2f}"

    print(
        f"torch {torch.__version__}, gloo, {args.nproc} ranks, {os.cpu_count()} CPUs, "
        f"caches off; x: {args.rows} x {args.cols} float32, ranges up to {args.upper} rows; "
        f"first call, slowest rank, median of {args.repeats} launches; seconds\n"
    )
    print(
        "| program | untuned | V1 | V2 | V1 vs static | V2 vs static "
        "| sessions V1 / V2 | decisions (candidates) V1 / V2 "
        "| compiling the candidates V1 / V2 |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for program in programs:
        cost = {}
        for path in ("V1", "V2"):
            delta = median(program, path) - median("static", path)
            cost[path] = "-" if program == "static" else f"{delta:+.2f}"
        last = {path: reports[(program, path)][-1] for path in ("V1", "V2")}
        print(
            f"| {PROGRAMS[program]} | {median(program, 'untuned'):.2f} "
            f"| {median(program, 'V1'):.2f} | {median(program, 'V2'):.2f} "
            f"| {cost['V1']} | {cost['V2']} "
            f"| {last['V1']['sessions']} / {last['V2']['sessions']} "
            f"| {last['V1']['decisions']} ({last['V1']['candidates']}) "
            f"/ {last['V2']['decisions']} ({last['V2']['candidates']}) "
            f"| {compiling(program, 'V1')} / {compiling(program, 'V2')} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
