#!/usr/bin/env python3
"""What screening decides, per dtype and world size, for the library's implementations and wrong ones.

Each launch (``--nproc`` ranks, gloo, fresh processes, Inductor's caches
off) compiles one program with two of the demo's custom ops, an all_reduce
and a reduce_scatter of an input of ``--rows`` times the world size rows and
``--cols`` columns per rank, in
float32, float16 and bfloat16 in turn, with the library's implementations
of each registered (``collective_implementations.IMPLEMENTATIONS``) and
wrong ones beside them:

* ``off_by_an_eighth`` (all_reduce): the sum plus an eighth of this rank's
  input;
* ``wrong_shard`` (reduce_scatter): the next rank's shard of the sum, the
  ranks in the wrong order;
* ``unscaled`` (reduce_scatter): the inputs divided by the world size and
  not multiplied back, a scale missing.

The inputs the candidates are screened on are Inductor's random benchmark
inputs. For each op it prints every candidate's status, the same on every
rank or not, the agreed winner, and whether the compiled program's result
is the float64 sum within the screening bound (``rules.outputs_match``).
The library's all_reduce and reduce_scatter implementations sum in other
orders than the backend (an all_gather or all_to_all then a float32 sum,
chunks, a reduce_scatter then an all_gather): under fixed per-dtype
tolerances they were disqualified as wrong in float16 and bfloat16 from 3
ranks on.

Usage:
  python scripts/screening_outcomes.py [--nproc 2,3,4] [--rows 256] [--cols 1024]
      [--dtypes float32,float16,bfloat16]
"""

import argparse
import json
import os
import sys
from pathlib import Path
from unittest import mock

from torch.testing._internal.distributed.collective_autotuning_jobs import (
    launch_ranks,
    private_cache_dir,
)


# --- worker (one process per rank) --------------------------------------------------
def worker(args: argparse.Namespace, out_dir: Path) -> None:
    private_cache_dir("screening-")
    import torch
    import torch._inductor.config as inductor_config
    import torch.distributed as dist
    from torch._inductor.kernel.collective_implementations import IMPLEMENTATIONS
    from torch._inductor.kernel.custom_op import (
        CustomOpConfig,
        register_custom_op_autotuning,
    )
    from torch._inductor.runtime.collective_benchmarking import reporting
    from torch._inductor.runtime.collective_benchmarking.rules import outputs_match

    from demo_collective_autotuning import all_reduce_op, reduce_scatter_op

    funcol = torch.ops._c10d_functional
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    world, group_name = dist.get_world_size(), dist.group.WORLD.group_name
    inductor_config.fx_graph_cache = False

    def off_by_an_eighth(x: torch.Tensor, group_name: str) -> torch.Tensor:
        return funcol.wait_tensor(funcol.all_reduce(x, "sum", group_name)) + x / 8

    def wrong_shard(x: torch.Tensor, group_name: str) -> torch.Tensor:
        summed = funcol.wait_tensor(funcol.all_reduce(x, "sum", group_name))
        return summed.chunk(world)[(rank + 1) % world].clone()

    def unscaled(x: torch.Tensor, group_name: str) -> torch.Tensor:
        return funcol.wait_tensor(
            funcol.reduce_scatter_tensor(x / world, "sum", world, group_name)
        )

    ops = {
        "all_reduce": (all_reduce_op, [off_by_an_eighth]),
        "reduce_scatter": (reduce_scatter_op, [wrong_shard, unscaled]),
    }
    names = {}
    for kind, (op, wrong) in ops.items():
        implementations = IMPLEMENTATIONS[kind]
        register_custom_op_autotuning(
            op,
            configs=[
                CustomOpConfig(fn, **params) for fn, params in implementations.values()
            ]
            + [CustomOpConfig(fn) for fn in wrong],
        )
        for name, (fn, _) in implementations.items():
            names[fn.__name__] = name
        names.update({fn.__name__: fn.__name__ for fn in wrong})

    def implementation(candidate: str) -> str:
        # "3:collective_demo::all_reduce_autotuned_all_reduce_chunked_chunks__4_..."
        return next(
            (names[fn] for fn in names if f"_autotuned_{fn}_" in candidate), "default"
        )

    report = {}
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        inputs = [
            torch.randn(
                args.rows * world, args.cols, generator=torch.Generator().manual_seed(r)
            ).to(dtype)
            for r in range(world)
        ]
        payloads: list = []
        torch._dynamo.reset()
        with mock.patch.object(
            reporting,
            "trace_structured",
            side_effect=lambda *a, **k: payloads.append(json.loads(k["payload_fn"]())),
        ):
            results = torch.compile(
                lambda x: [op(x, group_name) for op, _ in ops.values()]
            )(inputs[rank])
        summed = torch.stack(inputs).double().sum(0)
        magnitude = torch.stack(inputs).double().abs().sum(0)
        expected = {
            "all_reduce": (summed, magnitude),
            "reduce_scatter": (summed.chunk(world)[rank], magnitude.chunk(world)[rank]),
        }
        for kind, payload, result in zip(ops, payloads, results, strict=True):
            total, size = expected[kind]
            report[f"{dtype_name} {kind}"] = {
                "statuses": {
                    implementation(c["name"]): c["status_per_rank"]
                    for c in payload["candidates"]
                },
                "winner": implementation(payload["winner"] or "default"),
                "within_bound": outputs_match(result, total.to(dtype), size, world),
            }
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


# --- driver ----------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nproc", default="2,3,4")
    parser.add_argument("--rows", type=int, default=256, help="rows per rank")
    parser.add_argument("--cols", type=int, default=1024)
    parser.add_argument("--dtypes", default="float32,float16,bfloat16")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args, Path(args.out))
        return
    import torch

    print(
        f"torch {torch.__version__}, gloo, V1; each rank's input {args.rows} x the "
        f"world size rows, {args.cols} columns; a candidate's status is the same on "
        "every rank unless the row says otherwise\n"
    )
    print(
        "| ranks | dtype | op | passed screening | disqualified: wrong result | winner | result within the bound |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for nproc in map(int, args.nproc.split(",")):
        ranks = launch_ranks(
            __file__,
            nproc,
            [
                "--rows",
                str(args.rows),
                "--cols",
                str(args.cols),
                "--dtypes",
                args.dtypes,
            ],
        )
        for cell, outcome in ranks[0].items():
            dtype, op = cell.split()
            agreed = all(
                rank[cell]["statuses"] == outcome["statuses"] for rank in ranks
            )
            by_status: dict[str, list[str]] = {}
            for name, statuses in outcome["statuses"].items():
                status = statuses[0] if len(set(statuses)) == 1 else "/".join(statuses)
                by_status.setdefault(status, []).append(name)
            passed = ", ".join(by_status.pop("ok", [])) or "-"
            wrong = ", ".join(by_status.pop("wrong_result", [])) or "-"
            other = "; ".join(f"{s}: {', '.join(n)}" for s, n in by_status.items())
            within = all(rank[cell]["within_bound"] for rank in ranks)
            print(
                f"| {nproc} | {dtype} | {op} | {passed} | {wrong}{'; ' + other if other else ''}"
                f"{'' if agreed else ' (NOT the same on every rank)'} | {outcome['winner']} | "
                f"{'yes' if within else 'NO'} |",
                flush=True,
            )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
