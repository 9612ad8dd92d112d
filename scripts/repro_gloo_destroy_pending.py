#!/usr/bin/env python3
"""Reproduction: destroying a gloo group while this rank's own work on it is pending.

No Inductor, no module of this stack: 2 gloo ranks (spawned processes, env://
on loopback).  Each builds a private gloo group, as the benchmark channel is
built.  Rank 0 issues an all_gather on it; rank 1 never does (a late peer),
and destroys its group after ``--peer-delay`` seconds, which fails rank 0's
pending collective ("Connection closed by peer").  Rank 0 waits with a
timeout (``--wait-timeout``, shorter than the group's own ``--op-timeout``),
gives up while its work is still pending, then releases the group's last
reference, as the benchmark channel's ``drop()`` did after a timed-out wait.

Who holds the group's last reference (--holder):
  backend   the ProcessGroupGloo's Python object
  group     a ProcessGroup's Python object around it (as the benchmark
            channel is built; the default)
  registry  c10d's registry of named groups (``_register_process_group``),
            which ``_unregister_process_group`` then empties

How rank 0 lets go (--release):
  drop     the work and its tensors are released first, then the group
           (what a wait that raised leaves behind)
  keep     the work and its tensors stay referenced while the group is
           released, and are released after it
  settle   first wait, sleeping with the GIL released, until the work
           completed (bounded by the group's timeout), keeping the work
           and its tensors; then the group, then them (the stack's fix)

A thread of rank 0 prints a heartbeat every 0.5 s, as the autotuner's
liveness thread did (until issue 55 removed it); it needs the GIL.  The parent reports how each trial ended:
"ok" with the time rank 0 spent releasing the group and the longest gap
between two heartbeats, or "HUNG" (rank 0 did not finish within --limit; with
--dump-dir, its stacks are written there first).

Usage:
  python scripts/repro_gloo_destroy_pending.py --release drop --trials 3
  python scripts/repro_gloo_destroy_pending.py --release settle --trials 3

See docs/upstream/gloo-status-string-race.md ("Second hazard").
"""

from __future__ import annotations

import argparse
import collections
import itertools
import re
import sys
import threading
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
from repro_gloo_dispatcher_deadlock import launch_trial


def rank_main(args: argparse.Namespace) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    options = dist.ProcessGroupGloo._Options()
    options._devices = [dist.ProcessGroupGloo.create_default_device()]
    options._timeout = timedelta(seconds=args.op_timeout)
    store = dist.PrefixStore("private/", dist.distributed_c10d._get_default_store())
    backend = dist.ProcessGroupGloo(store, rank, world, options)
    group: object = backend
    if args.holder != "backend":
        # As the benchmark channel is built: a ProcessGroup around the backend.
        wrapper = dist.ProcessGroup(store, rank, world)
        wrapper._register_backend(
            torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend
        )
        wrapper._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
        wrapper._set_group_name("private")
        group = wrapper
        del wrapper
    del backend
    started = time.monotonic()

    def say(message: str) -> None:
        print(
            f"[{time.monotonic() - started:6.2f}s] rank {rank}: {message}", flush=True
        )

    if rank != 0:
        time.sleep(args.peer_delay)
        say("destroys its group without having issued the collective")
        del group
        say("done")
        dist.destroy_process_group()
        return

    beats: list[float] = []

    def heartbeat() -> None:
        while True:
            beats.append(time.monotonic())
            time.sleep(0.5)

    threading.Thread(target=heartbeat, daemon=True).start()
    x = torch.ones(args.numel)
    outputs = [torch.empty_like(x) for _ in range(world)]
    work = group.allgather([outputs], [x])  # type: ignore[attr-defined]
    try:
        work.wait(timedelta(seconds=args.wait_timeout))
        say("the wait returned")
    except RuntimeError as error:
        say(f"the wait gave up: {str(error).splitlines()[0][:80]}")
    say(f"work completed: {work.is_completed()}")
    held: list[object] = []
    if args.release in ("keep", "settle"):
        held = [work, outputs, x]
    if args.release == "settle":
        deadline = time.monotonic() + args.op_timeout
        while not work.is_completed() and time.monotonic() < deadline:
            time.sleep(0.01)  # the GIL is free: gloo's worker can finish
        say(f"settled: work completed: {work.is_completed()}")
    del work, outputs, x
    if args.holder == "registry":
        # c10d's registry of named groups holds the last reference.
        torch._C._distributed_c10d._register_process_group("private", group)
    say("releases the group")
    before = time.monotonic()
    del group
    if args.holder == "registry":
        torch._C._distributed_c10d._unregister_process_group("private")
    say(f"RELEASED in {time.monotonic() - before:.2f}s")
    held.clear()
    time.sleep(1.0)
    gaps = [b - a for a, b in itertools.pairwise(beats)]
    say(f"LONGEST HEARTBEAT GAP {max(gaps, default=0.0):.2f}s")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--release", choices=["drop", "keep", "settle"], default="drop")
    parser.add_argument(
        "--holder", choices=["backend", "group", "registry"], default="group"
    )
    parser.add_argument("--wait-timeout", type=float, default=2.0)
    parser.add_argument("--op-timeout", type=float, default=10.0)
    parser.add_argument("--peer-delay", type=float, default=5.0)
    parser.add_argument("--numel", type=int, default=240)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--limit", type=float, default=60.0)
    parser.add_argument("--dump-dir", default="")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    if args.rank_main:
        rank_main(args)
        return
    import torch

    command = [
        sys.executable,
        __file__,
        "--rank-main",
        *[
            f"--{k.replace('_', '-')}={v}"
            for k, v in vars(args).items()
            if k
            in (
                "release",
                "holder",
                "wait_timeout",
                "op_timeout",
                "peer_delay",
                "numel",
            )
        ],
    ]
    print(
        f"torch {torch.__version__} (git {torch.version.git_version[:8]}), 2 gloo ranks, "
        f"release={args.release} holder={args.holder} wait timeout {args.wait_timeout:g}s, group timeout "
        f"{args.op_timeout:g}s, peer destroys its group at {args.peer_delay:g}s",
        flush=True,
    )
    outcomes: collections.Counter[str] = collections.Counter()
    for index in range(args.trials):
        trial = launch_trial(
            command, 2, args.limit, args.dump_dir, f"{args.release}-trial{index}"
        )
        output = trial.outputs[0]
        released = re.search(r"RELEASED in ([\d.]+)s", output)
        gap = re.search(r"LONGEST HEARTBEAT GAP ([\d.]+)s", output)
        if trial.hung:
            outcome = "HUNG"
        elif released and gap:
            outcome = "ok"
        else:
            outcome = f"failed (exit codes {trial.returncodes})"
        outcomes[outcome] += 1
        detail = (
            f": group released in {released.group(1)}s, longest heartbeat gap "
            f"{gap.group(1)}s"
            if released and gap
            else ""
        )
        print(f"  trial {index}: {outcome}{detail}", flush=True)
        if args.verbose or trial.hung:
            print("    " + "\n    ".join(output.strip().splitlines()[-8:]))
    print(
        f"RESULT release={args.release} holder={args.holder}: "
        + ", ".join(f"{outcome} x{count}" for outcome, count in outcomes.most_common()),
        flush=True,
    )


if __name__ == "__main__":
    main()
