#!/usr/bin/env python3
"""Minimal reproduction: a gloo collective waited on under a dispatch state that keeps the GIL.

No Inductor, no Dynamo: NPROC gloo ranks (spawned processes, env:// rendezvous on
loopback) each run ITERS iterations of one collective pattern under one
thread-local dispatch state, and the parent reports whether every rank finished
within the time limit (else: a hang, whose stacks it dumps with py-spy/gdb when
asked to).

Patterns (--op):
  funcol          torch.ops._c10d_functional.all_reduce + wait_tensor (what compiled code runs)
  custom_funcol   a torch.library.custom_op whose Python impl does the two calls above
  custom_eager    a torch.library.custom_op whose Python impl does dist.all_reduce (sync)
  pg_allgather    ProcessGroup.allgather + Work.wait from Python (the benchmark channel's
                  own collectives before they left the Python dispatcher)
  channel         BenchmarkChannel.all_gather (the protocol's join and agreements now)

States (--mode):
  none            nothing enabled
  pydispatcher    torch._dispatch.python.enable_python_dispatcher()   (what Inductor lowering enables)
  dispatchmode    a pass-through TorchDispatchMode
  analyze         AOTAutograd's _AnalyzeCustomOpInputOutputMode (first call of every compiled program)

Usage:
  python scripts/repro_gloo_dispatcher_deadlock.py --nproc 3 --op funcol --mode pydispatcher --trials 5

See docs/upstream/gloo-python-dispatcher-deadlock.md for the diagnosis and the
upstream report.
"""

import argparse
import contextlib
import dataclasses
import os
import subprocess
import sys
import time


def rank_main(args) -> None:
    import torch
    import torch._dynamo
    import torch.distributed as dist
    import torch.distributed._functional_collectives
    from torch.utils._python_dispatch import TorchDispatchMode

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    name = dist.group.WORLD.group_name

    @torch.library.custom_op("repro::custom_funcol", mutates_args=())
    def custom_funcol(x: torch.Tensor, group_name: str) -> torch.Tensor:
        y = torch.ops._c10d_functional.all_reduce(x, "sum", group_name)
        return torch.ops._c10d_functional.wait_tensor(y)

    @torch.library.custom_op("repro::custom_eager", mutates_args=())
    def custom_eager(x: torch.Tensor, group_name: str) -> torch.Tensor:
        from torch.distributed.distributed_c10d import _resolve_process_group

        out = x.clone()
        dist.all_reduce(out, group=_resolve_process_group(group_name))
        return out

    def funcol(x, group_name):
        y = torch.ops._c10d_functional.all_reduce(x, "sum", group_name)
        return torch.ops._c10d_functional.wait_tensor(y)

    def pg_allgather(x, group_name):
        gathered = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.group.WORLD.allgather([gathered], [x]).wait()
        return sum(gathered)

    channels = []

    def channel(x, group_name):
        # One benchmark channel of the default group, built on first use.
        from datetime import timedelta

        from torch._inductor.runtime.collective_benchmarking.channels import (
            BenchmarkChannel,
        )
        from torch._inductor.runtime.collective_benchmarking.types import (
            CollectiveBenchmarkConfig,
        )

        if not channels:
            config = CollectiveBenchmarkConfig(timeout=timedelta(seconds=60))
            channels.append(
                BenchmarkChannel(dist.group.WORLD, torch.device("cpu"), config)
            )
            channels[0].start_session()
        rows = channels[0].all_gather(x.tolist())
        return torch.tensor(rows).sum(dim=0)

    class PassThrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    def state():
        if args.mode == "pydispatcher":
            from torch._dispatch.python import enable_python_dispatcher

            return enable_python_dispatcher()
        if args.mode == "dispatchmode":
            return PassThrough()
        if args.mode == "analyze":
            from torch._functorch._aot_autograd.runtime_wrappers import (
                _AnalyzeCustomOpInputOutputMode,
            )

            return _AnalyzeCustomOpInputOutputMode()
        return contextlib.nullcontext()

    fn = {
        "funcol": funcol,
        "custom_funcol": custom_funcol,
        "custom_eager": custom_eager,
        "pg_allgather": pg_allgather,
        "channel": channel,
    }[args.op]
    expected = float(sum(range(dist.get_world_size())))
    with state():
        for i in range(args.iters):
            x = torch.full((args.numel,), float(rank))
            out = fn(x, name)
            if out[0].item() != expected:
                raise AssertionError(f"iteration {i}: {out[0].item()} != {expected}")
    print(f"rank {rank}: {args.iters} iterations done", flush=True)
    dist.destroy_process_group()


@dataclasses.dataclass
class Trial:
    """How one launch of the ranks ended."""

    hung: bool  # some rank was still running at the limit (every rank then killed)
    returncodes: list[int | None]  # per rank; negative: the signal that ended it
    outputs: list[str]  # per rank, stdout and stderr together

    def failed(self) -> list[int]:
        """The ranks that exited with an error (not counting a hang's kills)."""
        return [] if self.hung else [r for r, rc in enumerate(self.returncodes) if rc]


def dump(pid: int, path: str) -> None:
    with open(path, "w") as f:
        f.write(
            subprocess.run(
                ["ps", "-L", "-o", "tid,pcpu,stat,comm", "-p", str(pid)],
                capture_output=True,
                text=True,
            ).stdout
        )
        for cmd in (
            ["py-spy", "dump", "--native", "--pid", str(pid)],
            [
                "gdb",
                "-p",
                str(pid),
                "-batch",
                "-ex",
                "thread apply all bt",
                "-ex",
                "info symbol $pc",
                "-ex",
                "x/6i $pc",
                "-ex",
                "info sharedlibrary",
            ],
        ):
            exe = os.environ.get("PYSPY", "py-spy") if cmd[0] == "py-spy" else cmd[0]
            try:
                f.write(f"\n==== {' '.join(cmd)} ====\n")
                f.write(
                    subprocess.run(
                        [exe, *cmd[1:]], capture_output=True, text=True, timeout=120
                    ).stdout
                )
            except (OSError, subprocess.TimeoutExpired) as error:
                f.write(f"({error})\n")


def launch_trial(
    command: list[str],
    nproc: int,
    limit: float,
    dump_dir: str = "",
    tag: str = "trial",
    cwd: str | None = None,
) -> Trial:
    """Run ``command`` as ``nproc`` gloo ranks (env:// on a free local port) for at most ``limit`` seconds.

    Ranks still running at the limit count as a hang: their stacks go to
    ``dump_dir/{tag}-rank{r}.txt`` when ``dump_dir`` is given, then every rank
    is killed.  ``cwd`` is where the ranks run (and where a crashing rank
    leaves its core file, with ``kernel.core_pattern`` at its default).
    """
    # The ranks run this file too, possibly on a torch without the stack.
    from torch.testing._internal.distributed.collective_autotuning_jobs import rank_env

    env = rank_env(nproc)
    procs = [
        subprocess.Popen(
            command,
            env={**env, "RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=cwd,
        )
        for r in range(nproc)
    ]
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.2)
    hung = any(p.poll() is None for p in procs)
    if hung and dump_dir:
        os.makedirs(dump_dir, exist_ok=True)
        for r, p in enumerate(procs):
            if p.poll() is None:
                dump(p.pid, os.path.join(dump_dir, f"{tag}-rank{r}.txt"))
    for p in procs:
        if p.poll() is None:
            p.kill()
    outputs = [p.communicate()[0] for p in procs]
    return Trial(hung, [p.returncode for p in procs], outputs)


def trial(args, index: int) -> bool:
    cmd = [
        sys.executable,
        __file__,
        "--rank-main",
        "--op",
        args.op,
        "--mode",
        args.mode,
        "--iters",
        str(args.iters),
        "--numel",
        str(args.numel),
    ]
    outcome = launch_trial(
        cmd,
        args.nproc,
        args.limit,
        args.dump_dir,
        f"{args.op}-{args.mode}-trial{index}",
    )
    failed = outcome.failed()
    if failed:
        print(
            f"  trial {index}: ranks {failed} failed:\n"
            + outcome.outputs[failed[0]][-2000:]
        )
    return outcome.hung


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--nproc", type=int, default=3)
    parser.add_argument(
        "--op",
        choices=["funcol", "custom_funcol", "custom_eager", "pg_allgather", "channel"],
        default="funcol",
    )
    parser.add_argument(
        "--mode",
        choices=["none", "pydispatcher", "dispatchmode", "analyze"],
        default="pydispatcher",
    )
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--numel", type=int, default=240)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument(
        "--limit",
        type=float,
        default=60.0,
        help="seconds per trial before it counts as hung",
    )
    parser.add_argument(
        "--dump-dir", default="", help="where to write stacks of hung ranks"
    )
    args = parser.parse_args()
    if args.rank_main:
        rank_main(args)
        return
    import torch

    print(
        f"torch {torch.__version__}, python {sys.version.split()[0]}, {args.nproc} gloo ranks, "
        f"op={args.op} mode={args.mode} iters={args.iters} numel={args.numel}",
        flush=True,
    )
    hangs = 0
    for i in range(args.trials):
        start = time.monotonic()
        hung = trial(args, i)
        hangs += hung
        print(
            f"  trial {i}: {'HUNG' if hung else 'ok'} ({time.monotonic() - start:.1f}s)",
            flush=True,
        )
    print(
        f"RESULT op={args.op} mode={args.mode} nproc={args.nproc}: hung in {hangs}/{args.trials} trials",
        flush=True,
    )


if __name__ == "__main__":
    main()
