"""A gloo job that exits without ``destroy_process_group()`` can abort: upstream's, stack or not.

Launches a minimal job many times, ``srun`` style (``collective_autotuning_jobs.launch``:
one process per rank, rank 0 hosts the store): each rank joins a gloo process
group from the environment, runs one functional collective twice
(``torch.ops._c10d_functional``, waited for, checked) and ends.  Nothing of
Inductor is imported.

Prints, per collective and way to end, how many launches had a rank abort
with "terminate called without an active exception": with
``destroy_process_group()``, at the interpreter's exit right after the last
collective, and at that exit 0.5 s later (``--exits``).

Why (a rank's core dump, 2.15.0): a gloo worker thread
(``ProcessGroupGloo::runLoop``) destroys the collective's ``AsyncWork``, whose
tensors hold a Python object, after the main thread began to finalize the
interpreter; the decref needs the GIL, CPython ends the thread with
``pthread_exit``, and the unwind through a ``noexcept`` destructor terminates
the process (pytorch/pytorch#190489).  ``destroy_process_group()`` joins the
worker threads before the exit.

Usage:
  python scripts/repro_gloo_exit_abort.py [--launches 20] [--nproc 3]
      [--pythonpath DIR] [--exits destroy,exit,settle]

``--pythonpath DIR`` puts DIR first on the ranks' ``PYTHONPATH``: a torch tree
of the official wheel (``python scripts/patchstack.py prefix --upto 0
--torch-dir .venv/lib/python3.11/site-packages/torch --dest DIR``) runs the job
on stock torch.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist


COLLECTIVES = ("all_reduce", "all_gather_into_tensor")
# How a rank ends: destroy_process_group(), the interpreter's exit at once, or
# that exit SETTLE_S after the last collective (collective_autotuning_job_worker's
# SETTLE_S, which its launch tests use).
EXITS = {
    "destroy": "destroy_process_group()",
    "exit": "the interpreter's exit",
    "settle": "the interpreter's exit, 0.5 s later",
}
SETTLE_S = 0.5
ABORT = "terminate called without an active exception"


def rank_program(collective: str, how: str) -> None:
    """One rank of the job: the collective twice on the default group, then end as ``how`` says."""
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    functional = torch.ops._c10d_functional
    shards = [torch.arange(4096, dtype=torch.float32) + r for r in range(world)]
    x = shards[rank]
    for _ in range(2):
        if collective == "all_reduce":
            out = functional.wait_tensor(functional.all_reduce(x, "sum", "0"))
            expected = torch.stack(shards).sum(0)
        else:
            gathered = functional.all_gather_into_tensor(x, world, "0")
            out, expected = functional.wait_tensor(gathered), torch.cat(shards)
        if not torch.equal(out, expected):
            raise SystemExit(f"rank {rank}: wrong {collective} result")
    if how == "destroy":
        dist.destroy_process_group()
    elif how == "settle":
        time.sleep(SETTLE_S)


def cell(collective: str, how: str, args: argparse.Namespace, out: str) -> str:
    """``args.launches`` launches of one program; its row of the table."""
    # The ranks run this file too, possibly on a torch without the stack.
    from torch.testing._internal.distributed.collective_autotuning_jobs import launch

    paths = (args.pythonpath, os.environ.get("PYTHONPATH", ""))
    env = {"PYTHONPATH": os.pathsep.join(path for path in paths if path)}
    program = [__file__, "--rank", collective, "--how", how]
    failed = aborted = ranks = 0
    for index in range(args.launches):
        job = launch("srun", args.nproc, program, out, env=env, timeout=120)
        hit = sum(ABORT in output for output in job.outputs)
        failed, aborted, ranks = failed + (not job.ok), aborted + bool(hit), ranks + hit
        print(
            f"  {collective}, {how} #{index + 1}: "
            f"{'ok' if job.ok else ', '.join(job.failures())}",
            file=sys.stderr,
            flush=True,
        )
    return (
        f"| {collective} | {EXITS[how]} | {args.launches} | {failed} | {aborted} "
        f"| {ranks} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--launches", type=int, default=20)
    parser.add_argument("--nproc", type=int, default=3)
    parser.add_argument("--pythonpath", default="")
    parser.add_argument("--exits", default=",".join(EXITS))
    parser.add_argument("--rank", choices=COLLECTIVES, help=argparse.SUPPRESS)
    parser.add_argument("--how", choices=EXITS, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)  # launch passes it
    args = parser.parse_args()
    if args.rank:
        rank_program(args.rank, args.how)
        return
    with tempfile.TemporaryDirectory(prefix="gloo-exit-") as out:
        rows = [
            cell(collective, how, args, out)
            for collective in COLLECTIVES
            for how in args.exits.split(",")
        ]
    print(
        f"{sys.executable}, PYTHONPATH={args.pythonpath or '-'}: gloo, "
        f"{args.nproc} ranks (srun style), {os.cpu_count()} CPUs; an abort: "
        f'"{ABORT}"\n'
    )
    print(
        "| collective | a rank ends by | launches | failed launches "
        "| launches with an abort | ranks that aborted |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
