#!/usr/bin/env python3
"""What V2's benchmark buffers hold past their session, with and without ``0023``'s release.

One rank (gloo, in this process) compiles a program of ``--ops`` all_reduce
custom ops on inputs of distinct sizes (so that each is benchmarked: equal
ops share one benchmark), with the library's implementations registered, under
V2: one session for the group.  When the winners are inlined, after the
session, it counts the bytes of every live tensor of a benchmarked size other
than the program's inputs (candidates' inputs, outputs and reference copies),
and on CUDA the peak of ``torch.cuda.max_memory_allocated()`` over the
compile.  Twice, side by side: with the group's buffers released when its
session ends (the stack), and kept until the scheduler is done (as before
``0023``: ``_Runners.release`` made a no-op).

Usage:
  python scripts/bench_collective_buffers.py [--ops 8] [--numel 262144] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import gc
import math
import os
from unittest import mock


from torch.testing._internal.distributed.collective_autotuning_jobs import (
    free_port,
    private_cache_dir,
)


def measure(
    ops: int, numel: int, device_kind: str, release: bool
) -> tuple[float, float]:
    """Bytes (MB) of benchmark-sized tensors alive while the winners are inlined; device peak (MB)."""
    import torch
    import torch._inductor.config as inductor_config
    from torch._inductor.collective_autotuning import deferred_tuning
    from torch._inductor.runtime.collective_benchmarking import decision_cache

    from demo_collective_autotuning import CASES

    device = torch.device(device_kind)
    group = torch.distributed.group.WORLD.group_name
    sizes = [numel + 64 * i for i in range(ops)]
    inputs = [torch.ones(size, device=device) for size in sizes]
    op = CASES["all_reduce"].op
    alive_mb: list[float] = []

    def counted(*args, **kwargs):
        gc.collect()
        program_inputs = {id(x) for x in inputs}
        alive = sum(
            o.nbytes
            for o in gc.get_objects()
            # type(), not isinstance(): a deprecated module attribute warns
            # when asked for its __class__.
            if issubclass(type(o), torch.Tensor)
            and not issubclass(type(o), torch._subclasses.FakeTensor)
            and o.dim() == 1
            and o.numel() in sizes
            and id(o) not in program_inputs
        )
        alive_mb.append(alive / 2**20)
        return inline(*args, **kwargs)

    inline = deferred_tuning.inline_winners
    # Nothing remembered, in the process or on disk: the group benchmarks.
    torch._dynamo.reset()
    decision_cache._remembered.clear()
    private_cache_dir("bench-buffers-")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with (
        mock.patch.object(deferred_tuning, "inline_winners", counted),
        mock.patch.object(
            deferred_tuning._Runners,
            "release",
            deferred_tuning._Runners.release if release else lambda self: None,
        ),
        inductor_config.patch(
            defer_collective_autotuning=True,
            fx_graph_cache=False,
            autotune_local_cache=False,
        ),
    ):
        torch.compile(lambda *xs: [op(x, group) for x in xs])(*inputs)
    peak = (
        torch.cuda.max_memory_allocated(device) / 2**20
        if device.type == "cuda"
        else float("nan")
    )
    return sum(alive_mb), peak


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ops", type=int, default=8)
    parser.add_argument(
        "--numel",
        type=int,
        default=1 << 18,
        help="float32 elements of the first op's input",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    import torch
    import torch.distributed as dist
    from torch._inductor.kernel.collective_implementations import (
        register_collective_implementations,
    )

    from demo_collective_autotuning import CASES

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    register_collective_implementations(CASES["all_reduce"].op, "all_reduce")
    print(
        f"torch {torch.__version__}, 1 gloo rank, tensors on {args.device}; V2, one session of "
        f"{args.ops} all_reduce ops, {args.numel}+ float32 elements each\n"
    )
    print(
        "| buffers | MB alive past the session (while inlining) | peak device memory (MB) |"
    )
    print("| --- | --- | --- |")
    for release in (False, True):
        alive, peak = measure(args.ops, args.numel, args.device, release)
        label = (
            "released when the session ends (0023)"
            if release
            else "kept until the scheduler is done"
        )
        device_peak = "-" if math.isnan(peak) else f"{peak:.1f}"  # CPU: no device
        print(f"| {label} | {alive:.1f} | {device_peak} |", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
