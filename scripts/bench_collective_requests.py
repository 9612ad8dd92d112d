#!/usr/bin/env python3
"""Store requests per rank of real compiles, c10d's included.

A job of ``--nproc`` ranks (``srun`` style, gloo, CPU) compiles
``--compiles`` programs one after another, each with one autotuned
all_reduce op (defined here; two implementations from functional
collectives) and so one session (V2; Dynamo reset and remembered decisions
forgotten between compiles; caches on), then runs the last program
``--runs`` times.  Each rank's process group stands on the job's TCPStore
through a wrapper that counts every request reaching it, whoever makes it:
the protocol, or c10d building the benchmark channel.  The table gives the
requests per rank of the first compile (which builds the channel), of each
later one, and of the runs, the keys under ``collective_autotuning`` left
in the store at the end, and the keys c10d left there building the channel.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
from torch.testing._internal.distributed.collective_autotuning_jobs import (
    launch_ranks,
    private_cache_dir,
)


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
    from torch._inductor.runtime.collective_benchmarking import decision_cache
    from torch.distributed.distributed_c10d import _resolve_process_group
    from torch.testing._internal.distributed.counting_store import CountingStore

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

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    server = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world,
        rank == 0,
        timeout=timedelta(seconds=120),
    )
    store = CountingStore(server)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
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
        dist.barrier()
        before = store.requests.total()
        compiled = torch.compile(lambda x: all_reduce_op(x, group_name) * scale)
        result = compiled(x)
        per_compile.append(store.requests.total() - before)
        expected = torch.full_like(x, world * (world + 1) / 2 * scale)
        torch.testing.assert_close(result, expected, rtol=0, atol=0)
    dist.barrier()
    before = store.requests.total()
    for _ in range(args.runs):
        compiled(x)
    runs = store.requests.total() - before
    dist.barrier()
    keys = server.list_keys()
    ours = [key for key in keys if "collective_autotuning" in key]
    # c10d's own rendezvous keys of the channel groups it built (gloo's
    # address of each rank, "0//<channel>//cpu//0/<rank>"), which stay as
    # every group's do.
    channels = [key for key in keys if ":benchmark" in key]
    report = {
        "per_compile": per_compile,
        "runs": runs,
        "keys": len(ours),
        "channel_keys": len(channels),
    }
    Path(args.out, f"rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


# --- driver ----------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nproc", default="2,4", help="world sizes, comma-separated")
    parser.add_argument("--compiles", type=int, default=4)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    import torch

    job = ["--compiles", str(args.compiles), "--runs", str(args.runs)]
    rows = collections.OrderedDict()
    for nproc in (int(n) for n in args.nproc.split(",")):
        rows[nproc] = launch_ranks(__file__, nproc, job)
    print(
        f"torch {torch.__version__}, gloo, {os.cpu_count()} CPUs; {args.compiles} "
        f"compiles per job, one session each, then {args.runs} runs\n"
    )
    print(
        "| ranks | first compile (builds the channel): requests per rank "
        "| each later compile | the runs | keys left under collective_autotuning "
        "| keys c10d left building the channel |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for nproc, reports in rows.items():
        first = [report["per_compile"][0] for report in reports]
        later = [n for report in reports for n in report["per_compile"][1:]]
        runs = [report["runs"] for report in reports]
        keys = max(report["keys"] for report in reports)
        channel_keys = max(report["channel_keys"] for report in reports)
        print(
            f"| {nproc} | {statistics.mean(first):.1f} ({min(first)}-{max(first)}) "
            f"| {statistics.mean(later) if later else 0:.1f} "
            f"({min(later, default=0)}-{max(later, default=0)}) "
            f"| {max(runs)} | {keys} | {channel_keys} |"
        )


if __name__ == "__main__":
    main()
