"""One rank of test_collective_multinode.py: compile an autotuned all_reduce, report what happened.

Launched by torchrun (one launch per "node"); writes ``<out>/rank<r>.json``
with the node's tag, the world size, the implementation that ran after
compiling, whether the result was exact, the first call's seconds, the
collective autotuning counters and the FX graph cache's hits and misses.

The winner, ``own_shard``, traces this rank's index and the world size into
the program (``dist.get_rank()`` and ``dist.get_world_size()`` read while
traced, as upstream's tests do): a program compiled on another rank gathers
the wrong shard, one compiled at another world size fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch._inductor.config as inductor_config
import torch.distributed as dist
from torch._dynamo.utils import counters
from torch._inductor.kernel.custom_op import (
    CustomOpConfig,
    register_custom_op_autotuning,
)

from test_collective_autotuning import (
    _group_name,
    _wait,
    COLS,
    DELAY_MS,
    funcol,
    NRUNS,
    NWARMUP,
    probe,
    RAN,
    ROWS,
    SLOW_MS,
    all_reduce_direct,
    all_reduce_op,
    all_reduce_rs_ag,
)

TIMEOUT_S = 10.0


def all_reduce_own_shard(x):
    """The sum's shard of this rank, gathered from every rank: rank-dependent code."""
    world, rank = dist.get_world_size(), dist.get_rank()
    total = _wait(funcol.all_reduce(probe(x, "own_shard"), "sum", _group_name()))
    shard = total.reshape(world, -1)[rank]
    gathered = _wait(funcol.all_gather_into_tensor(shard, world, _group_name()))
    return gathered.view_as(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    register_custom_op_autotuning(
        all_reduce_op,
        configs=[
            CustomOpConfig(all_reduce_direct),
            CustomOpConfig(all_reduce_rs_ag),
            CustomOpConfig(all_reduce_own_shard),
        ],
    )
    # own_shard wins when benchmarked
    DELAY_MS.update({"default": SLOW_MS, "direct": SLOW_MS, "rs_ag": SLOW_MS})
    x = (torch.arange(ROWS * COLS, dtype=torch.float32) + 1000 * rank).view(ROWS, COLS)
    expected = sum(
        (torch.arange(ROWS * COLS, dtype=torch.float32) + 1000 * r).view(ROWS, COLS)
        for r in range(world)
    )
    report: dict = {"rank": rank, "world": world, "node": os.environ["NODE_TAG"]}
    try:
        with inductor_config.patch(
            collective_benchmark_nruns=NRUNS,
            inductor_default_autotune_warmup=NWARMUP,
            collective_benchmark_timeout=TIMEOUT_S,
        ):
            compiled = torch.compile(lambda x: all_reduce_op(x) + 1)
            start = time.monotonic()
            compiled(x)
            report["first_call_s"] = time.monotonic() - start
            RAN.clear()
            result = compiled(x)
        report["ran"] = list(RAN)
        report["exact"] = bool(torch.equal(result, expected + 1))
        report["counters"] = dict(counters["collective_autotuning"])
        report["fxgraph"] = {
            outcome: counters["inductor"][f"fxgraph_cache_{outcome}"]
            for outcome in ("hit", "miss")
        }
    except Exception as error:  # reported, for the test to show
        report["error"] = str(error)[-500:]
    Path(args.out, f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
