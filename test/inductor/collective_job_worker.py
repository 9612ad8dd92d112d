"""A user's job with an autotuned collective op: one rank of it, under any launcher.

Launched as users launch jobs (``scripts/collective_jobs.py``: torchrun,
torchrun as two nodes, ``torch.multiprocessing.spawn``, or processes started
directly with ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` set, as
``srun`` does); joins the process group from the environment (``env://``),
compiles an autotuned all_reduce with Inductor's caches at their defaults
(``TORCHINDUCTOR_CACHE_DIR`` is the job's), and writes ``<out>/rank<r>.json``:
the implementation that ran after compiling, whether the result was exact,
the first call's seconds, the FX graph and AOTAutograd caches' hits and
misses (local and remote alike), and the collective autotuning counters.
Every implementation but ``rs_ag`` is slowed down, so ``rs_ag`` wins whenever
the op is benchmarked.  ``--rank-dependent`` adds ``own_shard`` and makes it
the winner: it traces this rank's index and the world size into the program
(``dist.get_rank()`` and ``dist.get_world_size()`` read while traced, as
upstream's tests do), so a program compiled on another rank gathers the wrong
shard and one compiled at another world size fails.

``--bare-init`` initializes the process group as torchrun's examples do,
``init_process_group()`` without a backend (c10d picks one per device type);
otherwise it names ``gloo``.

``--spawn N`` makes this process the parent of an ``mp.spawn`` job of N ranks
(rank 0 then hosts the job's store, as under ``srun``).  The exit is what the
launch tests look at: ``--no-destroy`` leaves the process group to the
interpreter's exit, ``--last-to-exit`` makes the store's host (global rank 0)
or its peers leave 3 s after the others, and ``--raise-on-rank R`` makes rank
R's own code raise after tuning (its report written first).  A rank that
leaves its process group to the interpreter's exit waits ``SETTLE_S`` first,
unless ``--no-settle``: a gloo worker thread that releases the job's last
collective once the interpreter finalizes aborts the process ("terminate
called without an active exception", pytorch/pytorch#190489), stack or not
(``scripts/repro_gloo_exit_abort.py``), and the launch tests check the
stack's exit, not that race.
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
import torch.multiprocessing as mp
from torch._dynamo.utils import compilation_time_metrics, counters
from torch._inductor.kernel.custom_op import (
    CustomOpConfig,
    register_custom_op_autotuning,
)

from test_collective_autotuning import (
    _group_name,
    _wait,
    COLS,
    DELAY_MS,
    Fault,
    FAULTS,
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
LINGER_S = 3.0
SETTLE_S = 0.5  # for gloo's worker threads to release the last collective


def all_reduce_own_shard(x):
    """The sum's shard of this rank, gathered from every rank: rank-dependent code."""
    world, rank = dist.get_world_size(), dist.get_rank()
    total = _wait(funcol.all_reduce(probe(x, "own_shard"), "sum", _group_name()))
    shard = total.reshape(world, -1)[rank]
    gathered = _wait(funcol.all_gather_into_tensor(shard, world, _group_name()))
    return gathered.view_as(x)


def run(args: argparse.Namespace) -> None:
    """One rank: tune, run, report, and leave as ``args`` say."""
    rank, world = dist.get_rank(), dist.get_world_size()
    configs = [CustomOpConfig(all_reduce_direct), CustomOpConfig(all_reduce_rs_ag)]
    # The winner when benchmarked: every other implementation is slowed down.
    DELAY_MS.update({"default": SLOW_MS, "direct": SLOW_MS})
    if args.rank_dependent:
        configs.append(CustomOpConfig(all_reduce_own_shard))
        DELAY_MS["rs_ag"] = SLOW_MS
    register_custom_op_autotuning(all_reduce_op, configs=configs)
    if args.stall_s:
        FAULTS["rs_ag"] = Fault("stall", "all", call=1, seconds=args.stall_s)
    x = (torch.arange(ROWS * COLS, dtype=torch.float32) + 1000 * rank).view(ROWS, COLS)
    expected = sum(
        (torch.arange(ROWS * COLS, dtype=torch.float32) + 1000 * r).view(ROWS, COLS)
        for r in range(world)
    )
    report: dict = {
        "rank": rank,
        "world_size": world,
        "node": os.environ.get("NODE_TAG", ""),
    }
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
        report["fxgraph"] = {
            outcome: counters["inductor"][f"fxgraph_cache_{outcome}"]
            for outcome in ("hit", "miss")
        }
        report["aotautograd"] = {
            outcome: counters["aot_autograd"][f"autograd_cache_{outcome}"]
            for outcome in ("hit", "miss")
        }
        report["counters"] = dict(counters["collective_autotuning"])
        report["compile_events"] = sorted(
            key
            for key in compilation_time_metrics
            if key.startswith("collective_autotuning.")
        )
        report["inductor_counters"] = {
            key: value
            for key, value in counters["inductor"].items()
            if key.startswith("collective_autotuning_")
        }
    except Exception as error:  # reported, for the test to show
        report["error"] = str(error)[-500:]
    Path(args.out, f"rank{rank}.json").write_text(json.dumps(report))
    leaves_group_to_exit = not args.destroy or rank == args.raise_on_rank
    if leaves_group_to_exit and args.settle:
        time.sleep(SETTLE_S)
    if rank == args.raise_on_rank:
        raise RuntimeError(f"the job's own code raised on rank {rank} after tuning")
    lingers = {"host": rank == 0, "peers": rank != 0}.get(args.last_to_exit, False)
    if lingers:
        time.sleep(LINGER_S)
    if args.destroy:
        dist.destroy_process_group()


def backend(args: argparse.Namespace) -> str | None:
    """The backend the job names: none under ``--bare-init``."""
    return None if args.bare_init else "gloo"


def spawned_rank(local_rank: int, args: argparse.Namespace) -> None:
    # mp.spawn's entry point: rank 0 hosts the store (env://, MASTER_ADDR/PORT).
    dist.init_process_group(
        backend(args), init_method="env://", rank=local_rank, world_size=args.spawn
    )
    run(args)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--spawn", type=int, default=0, help="mp.spawn this many ranks")
    parser.add_argument("--no-destroy", dest="destroy", action="store_false")
    parser.add_argument("--no-settle", dest="settle", action="store_false")
    parser.add_argument("--last-to-exit", choices=("host", "peers"))
    parser.add_argument("--raise-on-rank", type=int, default=-1)
    parser.add_argument("--stall-s", type=float, default=0.0)
    parser.add_argument("--rank-dependent", action="store_true")
    parser.add_argument("--bare-init", action="store_true")
    args = parser.parse_args()
    if args.spawn:
        mp.spawn(spawned_rank, args=(args,), nprocs=args.spawn)
        return
    dist.init_process_group(backend(args))
    run(args)


if __name__ == "__main__":
    main()
