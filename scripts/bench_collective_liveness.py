#!/usr/bin/env python3
"""What reading c10d's FlightRecorder costs the main thread of a stalled rank.

``liveness.pending_collective`` dumps and parses the whole FlightRecorder
(``_dump_fr_trace_json``) to name the collective a rank's main thread waits
in.  It runs on the liveness thread, only while a peer in a failure agreement
keeps the rank awake: once per beat interval there.  The dump is C++; this
measures whether it holds the GIL while the main thread runs Python (a
candidate's host code, a compile).

One rank (gloo, in this process) fills the recorder with ``--entries``
all_reduce calls.  The main thread then runs a loop of small Python steps for
``--seconds``, twice, side by side: alone, and with a thread calling
``pending_collective`` every ``--period`` seconds.  The table gives the time of
one dump, the main thread's steps per second, and its longest step (a step
takes microseconds; a longer one waited for the GIL).

Usage:
  python scripts/bench_collective_liveness.py [--entries 2000] [--seconds 3] [--period 0.05]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
from collective_jobs import free_port


def main_thread_steps(seconds: float) -> tuple[float, float]:
    """Steps per second of a Python loop, and its longest step (ms)."""
    steps, longest = 0, 0.0
    end = time.perf_counter() + seconds
    last = time.perf_counter()
    while last < end:
        sum(range(50))
        now = time.perf_counter()
        longest = max(longest, now - last)
        last = now
        steps += 1
    return steps / seconds, longest * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--period", type=float, default=0.05)
    args = parser.parse_args()

    import torch
    import torch.distributed as dist
    from torch._inductor.runtime.collective_benchmarking.beats import pending_collective

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(free_port())
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        tensor = torch.ones(4)
        for _ in range(args.entries):
            dist.all_reduce(tensor)
        dumps = []
        for _ in range(5):
            start = time.perf_counter()
            pending_collective(threading.get_ident())
            dumps.append((time.perf_counter() - start) * 1e3)
        alone = main_thread_steps(args.seconds)

        stop = threading.Event()

        def read_recorder() -> None:
            while not stop.wait(args.period):
                pending_collective(threading.main_thread().ident)

        reader = threading.Thread(target=read_recorder, daemon=True)
        reader.start()
        try:
            beside = main_thread_steps(args.seconds)
        finally:
            stop.set()
            reader.join()
    finally:
        dist.destroy_process_group()

    print(
        f"FlightRecorder with {args.entries} all_reduce entries; one dump and "
        f"parse: median {statistics.median(dumps):.1f} ms of {len(dumps)}\n"
    )
    print("| main thread | steps/s | ratio | longest step (ms) |")
    print("| --- | --- | --- | --- |")
    print(f"| alone | {alone[0]:,.0f} | 1.00 | {alone[1]:.1f} |")
    print(
        f"| a reader every {args.period * 1e3:.0f} ms | {beside[0]:,.0f} | "
        f"{beside[0] / alone[0]:.2f} | {beside[1]:.1f} |"
    )


if __name__ == "__main__":
    main()
