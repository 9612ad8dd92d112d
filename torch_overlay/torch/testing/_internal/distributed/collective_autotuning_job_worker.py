"""A user's job with an autotuned collective op: one rank of it, under any launcher.

Run as ``python -m torch.testing._internal.distributed.collective_autotuning_job_worker``
(``collective_autotuning_jobs.WORKER``), launched as users launch jobs
(``collective_autotuning_jobs.launch``: torchrun, torchrun as two nodes,
``torch.multiprocessing.spawn``, or processes started directly with
``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` set, as ``srun``
does).  Joins the process group from the environment (``env://``), compiles
an autotuned all_reduce with Inductor's caches at their defaults
(``TORCHINDUCTOR_CACHE_DIR`` is the job's), and writes ``<out>/rank<r>.json``:
the implementation that ran after compiling, whether the result was exact,
the first call's seconds, the FX graph and AOTAutograd caches' hits and
misses (local and remote alike), and the collective autotuning counters.
Every implementation but ``rs_ag`` is slowed down, so ``rs_ag`` wins whenever
the op is benchmarked.  ``--rank-dependent`` adds ``own_shard`` and makes it
the winner: it traces this rank's index and the world size into the program
(``dist.get_rank()`` and ``dist.get_world_size()`` read while traced), so a
program compiled on another rank gathers the wrong shard and one compiled at
another world size fails.  Inductor's settings other than the benchmark's
runs and timeout come from the environment (``TORCHINDUCTOR_*``), as in a
user's job.

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
called without an active exception"), whatever the job compiled, and the
launch tests check the job's exit, not that race.  ``--stall-s S`` makes the
winner's first run stall for S seconds on every rank.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch._inductor.config as inductor_config
import torch.distributed as dist
import torch.multiprocessing as mp
from torch._dynamo.utils import compilation_time_metrics, counters
from torch._inductor.kernel.custom_op import (
    CustomOpConfig,
    register_custom_op_autotuning,
)
from torch.distributed.distributed_c10d import _resolve_process_group, GroupName
from torch.testing._internal.distributed.collective_autotuning_jobs import (
    WORKER_TIMEOUT_S,
)


funcol = torch.ops._c10d_functional

NWARMUP = 2
# The winner must win the sign test at 95% even when a stall on a busy
# machine (CI runs two streams on two cores) costs it one paired run:
# 8 wins of 9 give p = 0.02, 4 of 5 only p = 0.19 (the default stays).
NRUNS = 9
ROWS = 24  # divisible by every world size a job runs at
COLS = 8
SLOW_MS = 50.0  # far above a gloo collective, even with 4 ranks on 2 busy cores
LINGER_S = 3.0
SETTLE_S = 0.5  # for gloo's worker threads to release the last collective

# The implementations that ran on this rank, in order; the delay that slows
# each down; implementation -> (its run that stalls, for how many seconds).
RAN: list[str] = []
DELAY_MS: dict[str, float] = {}
STALLS: dict[str, tuple[int, float]] = {}


@torch.library.custom_op("collective_autotuning_job::probe", mutates_args=())
def probe(x: torch.Tensor, impl: str) -> torch.Tensor:
    """``x``, after recording that ``impl`` ran and slowing it down as asked."""
    RAN.append(impl)
    stall = STALLS.get(impl)
    if stall is not None and stall[0] == RAN.count(impl):
        time.sleep(stall[1])
    delay = DELAY_MS.get(impl, 0.0)
    if delay:
        time.sleep(delay / 1e3)
    return x.clone()


@probe.register_fake
def _(x: torch.Tensor, impl: str) -> torch.Tensor:
    return torch.empty_like(x)


def _group_name() -> str:
    group = dist.group.WORLD
    if group is None:
        raise RuntimeError("the job's process group is not initialized")
    return group.group_name


def _wait(tensor: torch.Tensor) -> torch.Tensor:
    return funcol.wait_tensor(tensor)


@torch.library.custom_op("collective_autotuning_job::all_reduce", mutates_args=())
def all_reduce_op(x: torch.Tensor) -> torch.Tensor:
    """The op the job autotunes: an eager all_reduce over the default group."""
    out = probe(x, "default")
    # Resolved by name, as functional collectives do, so that autotuning
    # benchmarks it on its own channel.
    dist.all_reduce(out, group=_resolve_process_group(GroupName(_group_name())))
    return out


@all_reduce_op.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def all_reduce_direct(x: torch.Tensor) -> torch.Tensor:
    """A functional all_reduce."""
    return _wait(funcol.all_reduce(probe(x, "direct"), "sum", _group_name()))


def all_reduce_rs_ag(x: torch.Tensor) -> torch.Tensor:
    """A reduce_scatter, then an all_gather."""
    world = dist.get_world_size()
    shard = _wait(
        funcol.reduce_scatter_tensor(probe(x, "rs_ag"), "sum", world, _group_name())
    )
    return _wait(funcol.all_gather_into_tensor(shard, world, _group_name()))


def all_reduce_own_shard(x: torch.Tensor) -> torch.Tensor:
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
        STALLS["rs_ag"] = (1, args.stall_s)
    x = (torch.arange(ROWS * COLS, dtype=torch.float32) + 1000 * rank).view(ROWS, COLS)
    expected = torch.stack(
        [
            (torch.arange(ROWS * COLS, dtype=torch.float32) + 1000 * r).view(ROWS, COLS)
            for r in range(world)
        ]
    ).sum(0)
    report: dict[str, Any] = {
        "rank": rank,
        "world_size": world,
        "node": os.environ.get("NODE_TAG", ""),
    }
    try:
        with inductor_config.patch(
            collective_benchmark_nruns=NRUNS,
            collective_benchmark_nwarmup=NWARMUP,
            collective_benchmark_timeout=WORKER_TIMEOUT_S,
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
    """``mp.spawn``'s entry point: rank 0 hosts the store (env://, MASTER_ADDR/PORT)."""
    dist.init_process_group(
        backend(args), init_method="env://", rank=local_rank, world_size=args.spawn
    )
    run(args)


def main() -> None:
    """Parse the arguments (see the module docstring), then run this rank or spawn the job."""
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
