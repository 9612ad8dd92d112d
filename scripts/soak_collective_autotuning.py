#!/usr/bin/env python3
"""Soak: many consecutive autotuning sessions on gloo ranks, no crash or hang allowed.

Each rank runs ``--sessions`` compiles in a row, each one a session of its own:
a collective custom op of the demo (``scripts/demo_collective_autotuning.py``)
with the implementations of ``torch._inductor.kernel.collective_implementations``
registered, the kinds of ``--kinds`` (all_reduce, all_gather, reduce_scatter,
all_to_all; repeat one to weigh it) and the sizes (``--sizes``, float32
elements per rank) taken in turn, each kind under V2 and V1 (the default)
alternately.  Dynamo is reset and remembered decisions are forgotten before
each compile, and the FX graph cache is off, so that every session
benchmarks.  After each session every rank checks the result exactly, and
that every rank took the same decision.

``--stress N`` runs N CPU-bound processes beside the ranks for the whole soak
(stress-ng when installed, else Python busy loops), started and stopped by
the script.  Ranks run with core dumps enabled (``RLIMIT_CORE`` unlimited,
in their log directory); a failed run's logs and cores are kept in
``build/soak-failures/``.

A session that does not end within ``--session-timeout`` seconds is a hang:
the launcher kills the ranks and reports it.  A rank killed by a signal
(SIGABRT from glibc's heap checks, SIGSEGV) is an abort.  Prints per world
size: the sessions run, aborts, hangs, failures, and the wall time of a
session (the compiling call, slowest rank): median, p99 and max, and which
session was the slowest (the first also pays the process's first compile).

Usage:
  python scripts/soak_collective_autotuning.py [--nproc 3,4] [--sessions 50]
      [--kinds all_reduce,all_gather,reduce_scatter,all_to_all]
      [--sizes 240,4080] [--stress 0] [--session-timeout 300]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING


from torch.testing._internal.distributed.collective_autotuning_jobs import (
    private_cache_dir,
    rank_env,
)


if TYPE_CHECKING:
    from collections.abc import Iterator


KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def worker(sessions: int, kinds: list[str], sizes: list[int], out_dir: Path) -> None:
    import torch
    import torch._inductor.config as inductor_config
    import torch.distributed as dist
    from torch._inductor.kernel.collective_implementations import (
        register_collective_implementations,
    )
    from torch._inductor.runtime.collective_benchmarking import decision_cache
    from torch._inductor.select_algorithm import add_feedback_saver
    from torch._inductor.virtualized import V

    from demo_collective_autotuning import (
        AutotuneRecorder,
        candidate_label,
        CASES,
        make_input,
    )

    # A crash leaves a core file (in the rank's working directory).
    hard = resource.getrlimit(resource.RLIMIT_CORE)[1]
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))
    private_cache_dir("soak-")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    group_name = dist.group.WORLD.group_name
    recorder = AutotuneRecorder()
    add_feedback_saver(recorder.feedback)
    progress = Path(out_dir, f"rank{rank}.jsonl")
    for session in range(sessions):
        kind = kinds[session % len(kinds)]
        size = sizes[(session // len(kinds)) % len(sizes)]
        # Each kind under both paths in turn, whatever the length of kinds.
        defer = (session // len(kinds)) % 2 == 0
        case = CASES[kind]
        torch._dynamo.reset()
        decision_cache._remembered.clear()
        register_collective_implementations(case.op, kind)
        recorder.selected.clear()
        x = make_input(size, rank, torch.device("cpu"))
        started = time.monotonic()
        with (
            V.set_choices_handler(recorder),
            inductor_config.patch(
                defer_collective_autotuning=defer,
                autotune_local_cache=False,
                # Every session benchmarks: a program from the FX graph cache
                # would only replay its session's join.
                fx_graph_cache=False,
            ),
        ):
            result = torch.compile(lambda x, op=case.op: op(x, group_name))(x)
        seconds = time.monotonic() - started
        inputs = [make_input(size, r, x.device) for r in range(world)]
        exact = torch.equal(result, case.expected(inputs, rank))
        chosen = (
            candidate_label(recorder.selected[-1], kind) if recorder.selected else "?"
        )
        everyone: list = [None] * world
        dist.all_gather_object(everyone, chosen)
        with progress.open("a") as out:
            out.write(
                json.dumps(
                    {
                        "session": session,
                        "kind": kind,
                        "size": size,
                        "path": "V2" if defer else "V1",
                        "seconds": seconds,
                        "exact": exact,
                        "agreed": len(set(everyone)) == 1,
                        "choice": chosen,
                    }
                )
                + "\n"
            )
    dist.destroy_process_group()


def soak(nproc: int, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="soak-") as out_dir:
        command = [
            sys.executable,
            # A native crash prints every thread's Python stack to the rank's log.
            "-X",
            "faulthandler",
            __file__,
            "--worker",
            "--sessions",
            str(args.sessions),
            "--kinds",
            args.kinds,
            "--sizes",
            args.sizes,
            "--out",
            out_dir,
        ]
        env = rank_env(nproc)
        # stderr to files: a full pipe would stall a rank and look like a hang.
        with contextlib.ExitStack() as files:
            logs = [
                files.enter_context(Path(out_dir, f"rank{r}.log").open("wb"))
                for r in range(nproc)
            ]
            ranks = [
                subprocess.Popen(
                    command,
                    env={**env, "RANK": str(r)},
                    stdout=subprocess.DEVNULL,
                    stderr=logs[r],
                    cwd=out_dir,  # where a crashing rank leaves its core
                )
                for r in range(nproc)
            ]
        hangs = 0
        last_progress, last_count = time.monotonic(), -1
        while any(process.poll() is None for process in ranks):
            done = min(_lines(Path(out_dir, f"rank{r}.jsonl")) for r in range(nproc))
            if done != last_count:
                last_progress, last_count = time.monotonic(), done
            if time.monotonic() - last_progress > args.session_timeout:
                hangs = 1
                for process in ranks:
                    process.kill()
                break
            time.sleep(1)
        errors = [
            Path(out_dir, f"rank{r}.log").read_text(errors="replace")
            if ranks[r].returncode
            else ""
            for r in range(nproc)
        ]
        if hangs or any(ranks[r].returncode for r in range(nproc)):
            kept = Path("build", "soak-failures", f"{nproc}ranks-{int(time.time())}")
            shutil.copytree(out_dir, kept)
            print(f"# {nproc} ranks: the ranks' logs are kept in {kept}", flush=True)
        records = [
            [
                json.loads(line)
                for line in Path(out_dir, f"rank{r}.jsonl").read_text().splitlines()
            ]
            if Path(out_dir, f"rank{r}.jsonl").exists()
            else []
            for r in range(nproc)
        ]
    completed = min(len(rank) for rank in records)
    by_session = [
        max(records[r][s]["seconds"] for r in range(nproc)) for s in range(completed)
    ]
    seconds = sorted(by_session)
    failures = sum(
        not (records[r][s]["exact"] and records[r][s]["agreed"])
        for r in range(nproc)
        for s in range(completed)
    )
    failed_ranks = [
        r for r, process in enumerate(ranks) if process.returncode not in (0, None)
    ]
    # Killed by a signal (negative return code), not by the launcher.
    aborts = [] if hangs else [r for r in failed_ranks if ranks[r].returncode < 0]
    return {
        "nproc": nproc,
        "completed": completed,
        "hangs": hangs,
        "aborts": aborts,
        "signals": [signal.Signals(-ranks[r].returncode).name for r in aborts],
        "failures": failures,
        "crashed_ranks": [] if hangs else failed_ranks,
        "median": statistics.median(seconds) if seconds else float("nan"),
        "p99": seconds[min(len(seconds) - 1, int(0.99 * len(seconds)))]
        if seconds
        else float("nan"),
        "max": seconds[-1] if seconds else float("nan"),
        # 1-based; the first session also pays the process's first compile.
        "slowest": by_session.index(seconds[-1]) + 1 if seconds else 0,
        "error_tail": next(
            (e.strip().splitlines()[-3:] for e in errors if e.strip()), []
        ),
    }


@contextlib.contextmanager
def cpu_load(workers: int) -> Iterator[str]:
    """``workers`` processes that keep a CPU busy each for the duration (none for 0).

    stress-ng when it is installed (``apt-get install stress-ng``), else
    Python busy loops.  Yields a description of the load.
    """
    if workers <= 0:
        yield "none"
        return
    if shutil.which("stress-ng"):
        processes = [
            subprocess.Popen(
                ["stress-ng", "--cpu", str(workers), "--quiet"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        ]
        description = f"stress-ng --cpu {workers}"
    else:
        processes = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(workers)
        ]
        description = f"{workers} Python busy loops"
    try:
        yield description
    finally:
        for process in processes:
            process.terminate()  # stress-ng stops its workers on SIGTERM
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", default="3,4")
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--sizes", default="240,4080")
    parser.add_argument(
        "--stress", type=int, default=0, help="CPU-bound processes beside the ranks"
    )
    parser.add_argument("--session-timeout", type=float, default=300.0)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        parser.error(f"unknown kinds {unknown}; expected some of {list(KINDS)}")
    if args.worker:
        worker(
            args.sessions,
            kinds,
            [int(s) for s in args.sizes.split(",")],
            Path(args.out),
        )
        return
    import torch

    with cpu_load(args.stress) as load:
        print(
            f"torch {torch.__version__}; {args.sessions} sessions per world size "
            f"(kinds {args.kinds} in turn, sizes {args.sizes}, each kind under V2 and "
            f"V1 alternately); CPU load beside the ranks: {load}; a session that "
            f"makes no progress for {args.session_timeout:g}s counts as a hang\n"
        )
        print(
            "| ranks | sessions completed | aborts | hangs | wrong or disagreeing | "
            "session wall time median / p99 / max (s) (slowest: session #) |"
        )
        print("| --- | --- | --- | --- | --- | --- |")
        clean = True
        for nproc in [int(n) for n in args.nproc.split(",")]:
            row = soak(nproc, args)
            clean &= (
                row["completed"] == args.sessions
                and not row["aborts"]
                and not row["hangs"]
                and not row["failures"]
            )
            print(
                f"| {row['nproc']} | {row['completed']}/{args.sessions} "
                f"| {len(row['aborts'])} | {row['hangs']} | {row['failures']} "
                f"| {row['median']:.2f} / {row['p99']:.2f} / {row['max']:.2f} "
                f"(#{row['slowest']}) |",
                flush=True,
            )
            if row["crashed_ranks"] or row["hangs"]:
                print(
                    f"  ranks that failed: {row['crashed_ranks']} (signals: "
                    f"{row['signals']}); {row['error_tail']}"
                )
    if not clean:
        sys.exit(1)


if __name__ == "__main__":
    main()
