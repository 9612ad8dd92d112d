"""One rank of test_collective_multinode.py: compile an autotuned all_reduce, report what happened.

Launched by torchrun (two launches, one per "node"); writes
``<out>/rank<r>.json`` with the node's tag, the implementation that ran
after compiling, whether the result was exact, the first call's seconds and
the collective autotuning counters.
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
    COLS,
    DELAY_MS,
    NRUNS,
    NWARMUP,
    RAN,
    ROWS,
    SLOW_MS,
    all_reduce_direct,
    all_reduce_op,
    all_reduce_rs_ag,
)

TIMEOUT_S = 10.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    register_custom_op_autotuning(
        all_reduce_op,
        configs=[CustomOpConfig(all_reduce_direct), CustomOpConfig(all_reduce_rs_ag)],
    )
    DELAY_MS.update(
        {"default": SLOW_MS, "direct": SLOW_MS}
    )  # rs_ag wins when benchmarked
    x = (torch.arange(ROWS * COLS, dtype=torch.float32) + 1000 * rank).view(ROWS, COLS)
    expected = sum(
        (torch.arange(ROWS * COLS, dtype=torch.float32) + 1000 * r).view(ROWS, COLS)
        for r in range(world)
    )
    report: dict = {"rank": rank, "node": os.environ["NODE_TAG"]}
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
    except Exception as error:  # reported, for the test to show
        report["error"] = str(error)[-500:]
    Path(args.out, f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
