#!/usr/bin/env python3
"""Reproduction: heap corruption when one gloo group has two collectives in flight.

No Inductor, no Dynamo, no module of this stack: NPROC gloo ranks (spawned
processes, env:// on loopback) each run ITERS iterations of a functional
collective on one group, and the parent reports how every trial ended: ok,
a rank killed by a signal (SIGABRT from glibc's heap checks, SIGSEGV), a rank
that raised, or a hang (no rank returned within the limit).

What each iteration does (--pattern):
  overlap   a = op(x); b = op(x); wait(a); wait(b)   two collectives in flight
  serial    a = op(x); wait(a); b = op(x); wait(b)   one at a time (the control)

The collective (--op), with the name gloo's worker thread records for it:
  all_gather      all_gather_into_tensor   ALLGATHER_COALESCED (19 chars: on the heap)
  all_reduce      all_reduce               ALLREDUCE (inline, short-string optimization)
  reduce_scatter  reduce_scatter_tensor    see the RESULT lines
  all_to_all      all_to_all_single        ALLTOALL_BASE (inline)

The group (--threads): 0 (default) is the default group as
init_process_group builds it (gloo's two worker threads); N > 0 builds a
gloo group with N worker threads (``ProcessGroupGloo._Options._threads``).

With --gdb, rank 0 runs under gdb in non-stop mode with a breakpoint at the
store of the status string in ``ProcessGroupGloo::runLoop`` (the address
comes from the installed libtorch_cpu.so, see --store-offset): the first
worker thread that reaches it is held there; when the second one arrives,
both threads' registers are printed (the old buffer each will free) and both
are resumed.  This forces the interleaving deterministically, whatever the
pattern; iterations are few (--iters 50).

Usage:
  python scripts/repro_gloo_status_race.py --nproc 4 --op all_gather --pattern overlap --trials 5
  python scripts/repro_gloo_status_race.py --nproc 2 --pattern serial --gdb --iters 50

See docs/upstream/gloo-status-string-race.md for the diagnosis.
"""

from __future__ import annotations

import argparse
import collections
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
from repro_gloo_dispatcher_deadlock import launch_trial
from soak_collective_autotuning import cpu_load


# In torch 2.15.0's libtorch_cpu.so (git d0f2af8b), runLoop+0x212 is
# `mov %rax,0x58(%rbp)`: the status string's new buffer pointer is stored,
# after the old one was loaded into %rdi (runLoop+0x1f8) and before it is
# freed (runLoop+0x25a).  Reached only when both buffers are on the heap.
STORE_OFFSET = 0x212


def rank_main(args: argparse.Namespace) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.threads:
        group = gloo_group(args.threads, timedelta(seconds=args.limit))
    else:
        group = dist.group.WORLD
    name = group.group_name
    funcol = torch.ops._c10d_functional
    splits = [args.numel // world] * world
    issue = {
        "all_gather": lambda x: funcol.all_gather_into_tensor(x, world, name),
        "all_reduce": lambda x: funcol.all_reduce(x, "sum", name),
        "reduce_scatter": lambda x: funcol.reduce_scatter_tensor(x, "sum", world, name),
        "all_to_all": lambda x: funcol.all_to_all_single(x, splits, splits, name),
    }[args.op]
    x = torch.full((args.numel,), float(rank + 1))
    expected = expected_output(args.op, x, rank, world)
    wait = funcol.wait_tensor
    for i in range(args.iters):
        if args.pattern == "overlap":
            a = issue(x)
            b = issue(x)
            a, b = wait(a), wait(b)
        else:
            a = wait(issue(x))
            b = wait(issue(x))
        if i % 100 == 0 and not (torch.equal(a, expected) and torch.equal(b, expected)):
            raise AssertionError(f"rank {rank}: wrong result at iteration {i}")
    print(f"rank {rank}: {args.iters} iterations done", flush=True)
    dist.barrier()
    if args.threads:
        torch._C._distributed_c10d._unregister_process_group(name)
    dist.destroy_process_group()


def gloo_group(threads: int, timeout):  # -> dist.ProcessGroup
    """A gloo group over every rank with ``threads`` worker threads, registered by name."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    store = dist.PrefixStore(
        f"threads{threads}/", dist.distributed_c10d._get_default_store()
    )
    options = dist.ProcessGroupGloo._Options()
    options._devices = [dist.ProcessGroupGloo.create_default_device()]
    options._threads = threads
    options._timeout = timeout
    backend = dist.ProcessGroupGloo(store, rank, world, options)
    group = dist.ProcessGroup(store, rank, world)
    group._register_backend(
        torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend
    )
    group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    name = f"gloo_threads{threads}"
    group._set_group_name(name)
    torch._C._distributed_c10d._register_process_group(name, group)
    return group


def expected_output(op: str, x, rank: int, world: int):  # -> torch.Tensor
    import torch

    inputs = [torch.full_like(x, float(r + 1)) for r in range(world)]
    if op == "all_gather":
        return torch.cat(inputs)
    if op == "all_reduce":
        return sum(inputs)
    if op == "reduce_scatter":
        return sum(inputs).tensor_split(world)[rank]
    return torch.cat([t.tensor_split(world)[rank] for t in inputs])


GDB_SCRIPT = r"""
set pagination off
set non-stop on
set confirm off
python
import gdb

held = {}


class StatusStore(gdb.Breakpoint):
    def stop(self):
        thread = gdb.selected_thread()
        registers = {r: int(gdb.parse_and_eval("$" + r)) for r in ("rdi", "rax", "rdx")}
        name = gdb.selected_inferior().read_memory(registers["rax"], registers["rdx"])
        held[thread.num] = (registers, bytes(name).decode())
        print(
            f"REPRO: thread {thread.num} ({thread.name}) at the store: old buffer "
            f"{registers['rdi']:#x}, new buffer {registers['rax']:#x} "
            f"({held[thread.num][1]!r})",
            flush=True,
        )
        if len(held) < 2:
            return True  # hold this worker thread; the others run on
        olds = {registers["rdi"] for registers, _ in held.values()}
        print(
            "REPRO: two worker threads inside the store, old buffers "
            + ", ".join(f"{old:#x}" for old in sorted(olds))
            + (": the same buffer, both will free it" if len(olds) == 1 else ""),
            flush=True,
        )
        self.enabled = False
        gdb.post_event(lambda: gdb.execute("continue -a &"))
        return True


def on_stop(event):
    if isinstance(event, gdb.SignalEvent):
        print(f"REPRO: the rank received {event.stop_signal}", flush=True)
        gdb.execute("bt 12")  # the thread that received it
        code = 128 + int(gdb.parse_and_eval("$_siginfo.si_signo"))
        gdb.post_event(lambda: gdb.execute(f"quit {code}"))  # kills the rank


def on_exit(event):
    code = getattr(event, "exit_code", 0)
    gdb.post_event(lambda: gdb.execute(f"quit {code}"))


class RunLoopStarts(gdb.Breakpoint):
    # libtorch_cpu.so is loaded by now: place the breakpoint at the store.
    def stop(self):
        address = int(gdb.parse_and_eval("(long) &'c10d::ProcessGroupGloo::runLoop(int)'"))
        StatusStore(f"*{address + {OFFSET}:#x}")
        self.enabled = False
        return False


gdb.events.stop.connect(on_stop)
gdb.events.exited.connect(on_exit)
RunLoopStarts("c10d::ProcessGroupGloo::runLoop(int)")
end
run &
"""


def gdb_command(
    args: argparse.Namespace, python_args: list[str], directory: str
) -> list[str]:
    """Rank 0's command line under gdb (the breakpoint of GDB_SCRIPT)."""
    script = Path(directory, "status_store.gdb")
    script.write_text(GDB_SCRIPT.replace("{OFFSET}", str(args.store_offset)))
    # The program runs in the background (non-stop mode holds one thread
    # while the others run), so gdb must keep reading commands: its stdin is
    # a pipe that stays open for the trial's time; it quits when the rank exits.
    gdb = [
        "gdb",
        "-q",
        "-ex",
        "set breakpoint pending on",
        "-x",
        str(script),
        "--args",
        sys.executable,
        *python_args,
    ]
    # (sleep's stderr is not the trial's output pipe, which must close with gdb.)
    return [
        "bash",
        "-c",
        f"exec {shlex.join(gdb)} < <(exec sleep {args.limit:.0f} 2>/dev/null)",
    ]


def outcome_of(trial) -> str:
    """How the first rank that crashed ended ("ok" when none did).

    glibc's message when its heap checks aborted the rank, else the signal
    (under gdb, the one gdb's handler reports); a rank whose peer crashed
    only raises.
    """
    if trial.hung:
        return "HUNG"
    for code, output in zip(trial.returncodes, trial.outputs, strict=True):
        lines = [line.strip() for line in output.splitlines()]
        glibc = [
            line
            for line in lines
            if line.startswith(("malloc", "free", "double free", "corrupted"))
        ]
        under_gdb = [
            line.rsplit(" ", 1)[-1]
            for line in lines
            if line.startswith("REPRO: the rank received")
        ]
        if glibc:
            return glibc[0]
        if under_gdb:
            return under_gdb[0]
        if code is not None and code < 0:
            return signal.Signals(-code).name
    failed = trial.failed()
    return f"ranks {failed} raised" if failed else "ok"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument(
        "--op",
        choices=["all_gather", "all_reduce", "reduce_scatter", "all_to_all"],
        default="all_gather",
    )
    parser.add_argument("--pattern", choices=["overlap", "serial"], default="overlap")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--iters", type=int, default=20000)
    parser.add_argument("--numel", type=int, default=120)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument(
        "--limit",
        type=float,
        default=300.0,
        help="seconds per trial before it counts as hung",
    )
    parser.add_argument(
        "--gdb", action="store_true", help="rank 0 under gdb (see above)"
    )
    parser.add_argument(
        "--store-offset", type=lambda s: int(s, 0), default=STORE_OFFSET
    )
    parser.add_argument(
        "--dump-dir", default="", help="where to write stacks of hung ranks"
    )
    parser.add_argument(
        "--verbose", action="store_true", help="print every rank's output"
    )
    parser.add_argument(
        "--stress",
        type=int,
        default=0,
        help="CPU-bound processes running beside the ranks",
    )
    args = parser.parse_args()
    if args.rank_main:
        rank_main(args)
        return
    import torch

    python_args = [
        "-X",
        "faulthandler",
        __file__,
        "--rank-main",
        *[
            f"--{k.replace('_', '-')}={v}"
            for k, v in vars(args).items()
            if k in ("op", "pattern", "threads", "iters", "numel", "limit")
        ],
    ]
    print(
        f"torch {torch.__version__} (git {torch.version.git_version[:8]}), python "
        f"{sys.version.split()[0]}, {args.nproc} gloo ranks, op={args.op} "
        f"pattern={args.pattern} threads={args.threads or 'default (2)'} "
        f"iters={args.iters} numel={args.numel}{' gdb' if args.gdb else ''}",
        flush=True,
    )
    outcomes: collections.Counter[str] = collections.Counter()
    with cpu_load(args.stress) as load:
        print(f"CPU load beside the ranks: {load}", flush=True)
        for index in range(args.trials):
            run_trial(args, python_args, index, outcomes)
    print(
        f"RESULT op={args.op} pattern={args.pattern} threads={args.threads or 2} "
        f"nproc={args.nproc} iters={args.iters} load={args.stress}: "
        + ", ".join(f"{outcome} x{count}" for outcome, count in outcomes.most_common()),
        flush=True,
    )


def run_trial(
    args: argparse.Namespace,
    python_args: list[str],
    index: int,
    outcomes: collections.Counter[str],
) -> None:
    with tempfile.TemporaryDirectory(prefix="repro-status-race-") as directory:
        command = [sys.executable, *python_args]
        if args.gdb:
            # Only rank 0 runs under gdb: launch_trial gives every rank the
            # same command, so rank 0 is picked by its RANK inside a shell.
            under_gdb = shlex.join(gdb_command(args, python_args, directory))
            command = [
                "sh",
                "-c",
                f'if [ "$RANK" = 0 ]; then exec {under_gdb}; '
                f"else exec {shlex.join(command)}; fi",
            ]
        started = time.monotonic()
        trial = launch_trial(
            command,
            args.nproc,
            args.limit,
            args.dump_dir,
            f"{args.op}-{args.pattern}-trial{index}",
            cwd=directory,
        )
    outcome = outcome_of(trial)
    outcomes[outcome] += 1
    print(f"  trial {index}: {outcome} ({time.monotonic() - started:.1f}s)", flush=True)
    if args.verbose or args.gdb:
        for rank, output in enumerate(trial.outputs):
            lines = [
                line
                for line in output.splitlines()
                if args.verbose
                or line.startswith(("REPRO", "#"))
                or "free" in line
                or "malloc" in line
            ]
            if lines:
                print(f"    rank {rank}:\n      " + "\n      ".join(lines[-60:]))


if __name__ == "__main__":
    main()
