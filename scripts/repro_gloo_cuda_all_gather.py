#!/usr/bin/env python3
"""Reproduction: the functional all_gather on gloo with CUDA tensors crashes the process.

Stock torch API, no Inductor, no module of this stack (pytorch/pytorch#152645,
open in 2.15.0).  ``--nproc`` gloo ranks (2 by default) share cuda:0; each
runs one collective on ``--numel`` float32 elements (64K by default) and
prints its result.  The parent prints each collective's fate on every rank.

  all_gather_functional  torch.ops._c10d_functional.all_gather_into_tensor:
                         SIGSEGV in gloo's worker thread (a host memmove on
                         device pointers, in allgather_into_tensor_coalesced)
  all_gather_eager       dist.all_gather_into_tensor (_allgather_base): works
  all_reduce_functional  torch.ops._c10d_functional.all_reduce: works
  all_to_all_functional  torch.ops._c10d_functional.all_to_all_single: works

Collective autotuning disqualifies, before it runs, every candidate whose graph
calls the first on a group whose CUDA backend is gloo
(``torch/_inductor/runtime/collective_benchmarking/known_crashes.py``).

Usage (needs a GPU):
  python scripts/repro_gloo_cuda_all_gather.py [--nproc 2] [--numel 65536]
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys


COLLECTIVES = (
    "all_gather_functional",
    "all_gather_eager",
    "all_reduce_functional",
    "all_to_all_functional",
)


def rank_main(collective: str, numel: int) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    world, name = dist.get_world_size(), dist.group.WORLD.group_name
    funcol = torch.ops._c10d_functional
    x = torch.ones(numel, device="cuda:0")
    if collective == "all_gather_functional":
        out = funcol.wait_tensor(funcol.all_gather_into_tensor(x, world, name))
    elif collective == "all_gather_eager":
        out = x.new_empty(world * numel)
        dist.all_gather_into_tensor(out, x)
    elif collective == "all_reduce_functional":
        out = funcol.wait_tensor(funcol.all_reduce(x, "sum", name))
    else:
        out = funcol.wait_tensor(funcol.all_to_all_single(x, None, None, name))
    torch.cuda.synchronize()
    print(f"sum {out.sum().item():g}", flush=True)
    dist.destroy_process_group()


def fate(returncode: int, stdout: str) -> str:
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    if returncode:
        return f"exit {returncode}"
    return stdout.strip() or "ok"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--numel", type=int, default=65536)
    parser.add_argument("--rank-of", choices=COLLECTIVES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_of:
        rank_main(args.rank_of, args.numel)
        return
    import torch

    # The ranks run this file too, possibly on a torch without the stack.
    from torch.testing._internal.distributed.collective_autotuning_jobs import rank_env

    if not torch.cuda.is_available():
        raise SystemExit("this reproduction needs a GPU (CUDA tensors on gloo)")
    print(
        f"torch {torch.__version__}, {args.nproc} gloo ranks on cuda:0, {args.numel} float32"
    )
    print("| collective | " + " | ".join(f"rank {r}" for r in range(args.nproc)) + " |")
    print("| --- |" + " --- |" * args.nproc)
    for collective in COLLECTIVES:
        env = rank_env(args.nproc)
        command = [
            sys.executable,
            __file__,
            "--rank-of",
            collective,
            "--numel",
            str(args.numel),
        ]
        ranks = [
            subprocess.Popen(command, env={**env, "RANK": str(r)}, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
            for r in range(args.nproc)
        ]  # fmt: skip
        fates = []
        for process in ranks:
            try:
                stdout, _ = process.communicate(timeout=120)
                fates.append(fate(process.returncode, stdout))
            except subprocess.TimeoutExpired:
                process.kill()
                fates.append("hung (a peer died)")
        print(f"| {collective} | " + " | ".join(fates) + " |", flush=True)


if __name__ == "__main__":
    main()
