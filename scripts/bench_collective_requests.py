#!/usr/bin/env python3
"""Store requests per rank of real compiles: this stack beside a prefix of it.

``bench_collective_control.py`` simulates sessions without compiles; this
script counts what real ones ask of the job's store.  A job of ``--nproc``
ranks (``srun`` style, gloo, CPU) compiles ``--compiles`` programs one after
another, each with one autotuned all_reduce op (defined here, as the series'
first patches have no implementation library; two implementations from
functional collectives) and so one session (V2; Dynamo
reset and remembered decisions forgotten between compiles; caches on).
Every rank counts the control plane's requests (``store.store_requests``)
from the start of each compile to ``--gap-s`` seconds after it (more than a
beat interval at the default 30 s timeout, so that the "idle" the liveness
thread writes after the compile counts).  A rank that a peer woke beats for
two timeouts after the wake; such beats count where they fall.

With ``--baseline-upto N``, the same job also runs on the series' first N
patches (``patchstack prefix``, a tree hard-linked from ``.venv``'s torch),
the two alternating ``--repeats`` times, and the table puts them side by
side: ``--baseline-upto 26`` compares the liveness of one thread (0027) with
the two threads before it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from collective_jobs import launch_ranks, private_cache_dir

ROOT = Path(__file__).resolve().parent.parent


# --- worker (one process per rank) --------------------------------------------------
def worker(args: argparse.Namespace) -> None:
    private_cache_dir("bench-requests-")
    import torch
    import torch._inductor.config as inductor_config
    import torch.distributed as dist
    from torch._inductor.kernel.custom_op import (
        CustomOpConfig,
        register_custom_op_autotuning,
    )
    from torch._inductor.runtime.collective_benchmarking import decision_cache, store
    from torch.distributed.distributed_c10d import _resolve_process_group

    funcol = torch.ops._c10d_functional

    # The schema is given: this module's annotations are strings, and torch
    # is imported here, after the rank's cache directory is set.
    @torch.library.custom_op(
        "bench_requests::all_reduce",
        mutates_args=(),
        schema="(Tensor x, str group_name) -> Tensor",
    )
    def all_reduce_op(x: torch.Tensor, group_name: str) -> torch.Tensor:
        out = x.clone()
        dist.all_reduce(out, group=_resolve_process_group(group_name))
        return out

    @all_reduce_op.register_fake
    def _(x: torch.Tensor, group_name: str) -> torch.Tensor:
        return torch.empty_like(x)

    def direct(x: torch.Tensor, group_name: str) -> torch.Tensor:
        return funcol.wait_tensor(funcol.all_reduce(x, "sum", group_name))

    def rs_ag(x: torch.Tensor, group_name: str) -> torch.Tensor:
        size = dist.get_world_size()
        shard = funcol.reduce_scatter_tensor(x.flatten(), "sum", size, group_name)
        full = funcol.all_gather_into_tensor(
            funcol.wait_tensor(shard), size, group_name
        )
        return funcol.wait_tensor(full).view_as(x)

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    group_name = dist.group.WORLD.group_name
    register_custom_op_autotuning(
        all_reduce_op, configs=[CustomOpConfig(direct), CustomOpConfig(rs_ag)]
    )
    inductor_config.defer_collective_autotuning = True
    x = torch.full((12 * world, 64), float(rank + 1))
    per_compile = []
    for scale in range(1, args.compiles + 1):
        torch._dynamo.reset()
        decision_cache._remembered.clear()
        before = store.store_requests.total()
        result = torch.compile(lambda x: all_reduce_op(x, group_name) * scale)(x)
        expected = torch.full_like(x, world * (world + 1) / 2 * scale)
        torch.testing.assert_close(result, expected, rtol=0, atol=0)
        dist.barrier()
        time.sleep(args.gap_s)
        per_compile.append(store.store_requests.total() - before)
    report = {"per_compile": per_compile}
    Path(args.out, f"rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


# --- driver ----------------------------------------------------------------------
def prefix_tree(upto: int, dest: str) -> str:
    """A torch tree of the series' first ``upto`` patches, for PYTHONPATH."""
    probe = "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('torch').origin))"
    torch_dir = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.strip()
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "patchstack.py"), "prefix",
         "--upto", str(upto), "--torch-dir", torch_dir, "--dest", dest],
        check=True, capture_output=True,
    )  # fmt: skip
    return dest


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nproc", default="2", help="world sizes, comma-separated")
    parser.add_argument("--compiles", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--gap-s", type=float, default=4.0)
    parser.add_argument("--baseline-upto", type=int, help="also run on this prefix")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    import torch

    stacks: dict[str, dict[str, str]] = {"this stack": {}}
    tree = tempfile.TemporaryDirectory(prefix="bench-requests-prefix-")
    if args.baseline_upto is not None:
        path = prefix_tree(args.baseline_upto, os.path.join(tree.name, "torch"))
        stacks[f"first {args.baseline_upto} patches"] = {"PYTHONPATH": path}
    job = ["--compiles", str(args.compiles), "--gap-s", str(args.gap_s)]
    # (world size, stack) -> every rank's requests per compile
    counts: dict[tuple[int, str], list[int]] = {}
    for nproc in (int(n) for n in args.nproc.split(",")):
        for repeat in range(args.repeats):
            for stack, env in stacks.items():  # alternating, repeat by repeat
                reports = launch_ranks(__file__, nproc, job, env=env)
                compiles = counts.setdefault((nproc, stack), [])
                for report in reports:
                    compiles.extend(report["per_compile"])
                print(f"# {nproc} ranks, {stack}, repeat {repeat + 1}", file=sys.stderr)
    tree.cleanup()
    print(
        f"torch {torch.__version__}, gloo, {os.cpu_count()} CPUs; {args.compiles} "
        f"compiles per job, one session each; {args.repeats} jobs per cell\n"
    )
    print(
        "| ranks | torch | requests per rank per compile: mean (min-max) "
        "| ratio to this stack |"
    )
    print("| --- | --- | --- | --- |")
    for (nproc, stack), compiles in counts.items():
        mean = statistics.mean(compiles)
        ours = statistics.mean(counts[(nproc, "this stack")])
        print(
            f"| {nproc} | {stack} | {mean:.1f} ({min(compiles)}-{max(compiles)}) "
            f"| {mean / ours:.2f} |"
        )


if __name__ == "__main__":
    main()
