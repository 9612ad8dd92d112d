#!/usr/bin/env python3
"""Compile time with Inductor's caches cold, warm and skewed, and what agreeing on them costs.

Each rank has a cache directory of its own (as on separate nodes) that
survives from one launch to the next.  Three launches in a row, each of
fresh rank processes with Inductor's caches at their defaults:

* cold: every cache directory empty;
* warm: every cache directory as the cold launch left it;
* skewed: rank 1's directory emptied, the others warm.

Each launch compiles and runs a program that is not measured (the
process's one-time compile costs), then two programs, side by side (the one
without collective choices first, so that its cold compile shares no kernel
with the other's):

* **with collective choices**: an all_reduce custom op with the library's
  implementations registered (``register_collective_implementations``),
  followed by a pointwise op;
* **without**: the same computation with the all_reduce written as a plain
  functional collective, nothing autotuned.

Per launch and program: the slowest rank's first call (compile, tune or
agree, run), the joins each rank took part in, the sessions replayed from a
cache, the ops benchmarked, and the longest a rank waited in a join.  The
program without collective choices must show no join and no replay at all:
graphs without collective choices pay nothing.

Usage:
  python scripts/bench_collective_caches.py [--nproc 2] [--numel 65536]
"""

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from torch.testing._internal.distributed.collective_autotuning_jobs import launch_ranks

COUNTERS = ("presync", "replayed_sessions", "ops", "recalled", "presync_s")


# --- worker (one process per rank) --------------------------------------------------
def worker(numel: int, cache_root: Path, out_dir: Path) -> None:
    import torch
    import torch.distributed as dist
    from torch._dynamo.utils import counters
    from torch._inductor.kernel.collective_implementations import (
        register_collective_implementations,
    )

    from demo_collective_autotuning import all_reduce_op

    rank = int(os.environ["RANK"])
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_root / f"rank{rank}")
    dist.init_process_group("gloo")
    group_name = dist.group.WORLD.group_name
    register_collective_implementations(all_reduce_op, "all_reduce")
    funcol = torch.ops._c10d_functional
    x = torch.ones(numel) * (rank + 1)

    def with_choices(x):
        return torch.relu(all_reduce_op(x, group_name) * 0.5 + 1)

    def without(x):
        return torch.relu(
            funcol.wait_tensor(funcol.all_reduce(x, "sum", group_name)) * 0.5 + 1
        )

    # A process's first compile pays one-time costs (imports, Inductor's
    # precompiled header): paid here, by a program that is neither measured.
    torch.compile(lambda x: torch.sin(x) * 3)(x)
    report = {}
    for name, program in (
        ("without", without),
        ("with collective choices", with_choices),
    ):
        counters.clear()
        compiled = torch.compile(program)
        dist.barrier()
        start = time.perf_counter()
        compiled(x)
        report[name] = {"first_call_s": time.perf_counter() - start}
        report[name].update(
            {key: counters["collective_autotuning"][key] for key in COUNTERS}
        )
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


# --- driver ----------------------------------------------------------------------
def launch(nproc: int, numel: int, cache_root: Path) -> list[dict]:
    return launch_ranks(
        __file__, nproc, ["--numel", str(numel), "--cache-root", str(cache_root)]
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--numel", type=int, default=1 << 16)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cache-root", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.numel, Path(args.cache_root), Path(args.out))
        return
    import torch

    print(
        f"torch {torch.__version__}, gloo, {args.nproc} ranks, {os.cpu_count()} CPUs, caches at their defaults, "
        f"one cache directory per rank; {args.numel} float32 elements\n"
    )
    print(
        "| launch | program | first call, slowest rank (s) | joins per rank | sessions replayed per rank "
        "| ops benchmarked per rank | longest join wait (s) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory(prefix="bench-caches-root-") as root:
        cache_root = Path(root)
        for launch_name in ("cold", "warm", "skewed"):
            if launch_name == "skewed":
                shutil.rmtree(cache_root / "rank1", ignore_errors=True)
            reports = launch(args.nproc, args.numel, cache_root)
            for program in ("without", "with collective choices"):
                rows = [report[program] for report in reports]

                def per_rank(key: str) -> str:
                    return "/".join(f"{row[key]:g}" for row in rows)

                print(
                    f"| {launch_name} | {program} | {max(row['first_call_s'] for row in rows):.2f} "
                    f"| {per_rank('presync')} | {per_rank('replayed_sessions')} | {per_rank('ops')} "
                    f"| {max(row['presync_s'] for row in rows):.2f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
