"""Rank-consistent benchmarking of autotuning choices that contain collectives.

Why this module exists
----------------------
Inductor can autotune a custom op among several user-registered implementations
(``register_custom_op_autotuning``).  When those implementations contain
collectives (all_reduce, all_gather, reduce_scatter, all_to_all), benchmarking
them is a distributed protocol: every rank of the group must run each candidate
the same number of times, in the same order, and leave with the same timings,
or the ranks pick different winners and the compiled program issues mismatched
collectives (a hang, or silently wrong results).

History
-------
The first version lived in ``select_algorithm.py`` and was CUDA-only: it timed
with ``torch.cuda.Event``, built its reduction tensor on ``cuda:{rank}`` (wrong
whenever the local device index is not the global rank) and averaged per-rank
means.  On CPU/gloo every candidate failed with "Torch not compiled with CUDA
enabled", so the autotuner always fell back to the eager op.

Design
------
* Timing uses the clock of the device the candidate's inputs live on: host
  timers for CPU (the collectives of a CPU candidate complete before it
  returns), device events for accelerators that expose ``Event`` and
  ``synchronize`` through ``torch.get_device_module`` (CUDA, XPU).
* Every rank runs warmup and timed runs in lock-step, separated by barriers.
* The per-rank statistic is the median of the timed runs (robust to the
  occasional scheduler hiccup); the value every rank uses is the slowest
  rank's median (MAX reduction), because a collective finishes when its
  slowest participant does.  The reduction returns the same value on every
  rank, so every rank ranks the candidates identically.
* Candidates run with the Python dispatcher disabled.  Inductor lowers graphs
  under ``enable_python_dispatcher()``, and that thread-local state leaks into
  autotuning.  Under the Python dispatcher an op called from Python re-enters
  Python and runs its kernel *with the GIL held*; ``_c10d_functional.wait_tensor``
  then blocks in ``c10d::Work::wait`` holding the GIL.  Meanwhile the gloo
  worker thread that completes the collective can drop the last reference to a
  tensor whose ``PyObject`` is owned by C++ (tensors that crossed into Python
  through the dispatcher are), and that decref needs the GIL.  The worker
  blocks, the collective never completes on this rank, and its peers wait for
  it forever.  Compiled candidates are ordinary compiled code and need none of
  the lowering-time dispatch state, so disabling it is both correct and scoped.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._dispatch.python import no_python_dispatcher


__all__ = [
    "CollectiveBenchmarkTimeout",
    "benchmark_collective",
    "device_of",
    "reduce_max_across_ranks",
    "sync_with_timeout",
    "time_runs",
]


class CollectiveBenchmarkTimeout(TimeoutError):
    """A collective step of the benchmark did not complete within the timeout."""


def device_of(tensors: Any) -> torch.device:
    """The device of the first tensor in ``tensors`` (CPU when there is none).

    This is the local device the candidate runs on; it is deliberately not
    derived from the rank, which need not equal the local device index.
    """
    for value in tensors:
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")


def _reduction_device(device: torch.device, group: dist.ProcessGroup | None) -> torch.device:
    # gloo reduces host tensors; device backends (NCCL, XCCL) reduce on the device.
    if device.type == "cpu" or dist.get_backend(group) == "gloo":
        return torch.device("cpu")
    return device


def _wait(work: dist.Work, timeout: timedelta, what: str) -> None:
    try:
        completed = work.wait(timeout)
    except RuntimeError as error:  # gloo reports a timed-out wait by raising
        raise CollectiveBenchmarkTimeout(f"{what} did not complete within {timeout}: {error}") from error
    if completed is False:
        raise CollectiveBenchmarkTimeout(f"{what} did not complete within {timeout}")


def sync_with_timeout(group: dist.ProcessGroup | None, timeout: timedelta) -> None:
    """Barrier over ``group`` bounded by ``timeout``.

    Every rank of ``group`` must call it.  Returns once all ranks arrived;
    raises :class:`CollectiveBenchmarkTimeout` when they did not within
    ``timeout``.
    """
    _wait(dist.barrier(group=group, async_op=True), timeout, "barrier before benchmarking")


def time_runs(fn: Callable[[], Any], nruns: int, device: torch.device) -> list[float]:
    """Run ``fn`` ``nruns`` times and return each run's time in milliseconds.

    Host timers on CPU; device events (with a synchronize before the first
    run) on accelerators.  Runs on the calling rank only: collectives inside
    ``fn`` are what keeps ranks in step.
    """
    if device.type == "cpu":
        times = []
        for _ in range(nruns):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return times
    module = torch.get_device_module(device)
    module.synchronize(device)
    events = [
        (module.Event(enable_timing=True), module.Event(enable_timing=True)) for _ in range(nruns)
    ]
    for start, end in events:
        start.record()
        fn()
        end.record()
    module.synchronize(device)
    return [start.elapsed_time(end) for start, end in events]


def reduce_max_across_ranks(
    value: float,
    group: dist.ProcessGroup | None,
    device: torch.device,
    timeout: timedelta,
) -> float:
    """MAX of ``value`` over ``group``, identical on every rank.

    Every rank of ``group`` must call it.  Raises
    :class:`CollectiveBenchmarkTimeout` when the reduction does not complete
    within ``timeout``.
    """
    tensor = torch.tensor([value], dtype=torch.float64, device=_reduction_device(device, group))
    _wait(
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group, async_op=True),
        timeout,
        "reduction of benchmark timings",
    )
    return float(tensor.item())


def benchmark_collective(
    fn: Callable[[], Any],
    *,
    device: torch.device,
    nwarmup: int,
    nruns: int,
    timeout: timedelta,
    group: dist.ProcessGroup | None = None,
) -> float:
    """Benchmark one collective candidate in lock-step; return milliseconds.

    Every rank of ``group`` must call this with the same ``nwarmup`` and
    ``nruns`` for the same candidate, in the same order of candidates.  The
    result is the slowest rank's median run time, the same float on every rank.

    Raises :class:`CollectiveBenchmarkTimeout` when a barrier or the timing
    reduction times out, and re-raises whatever ``fn`` raises.
    """
    if nruns < 1:
        raise ValueError(f"nruns must be >= 1, got {nruns}")
    with no_python_dispatcher():
        sync_with_timeout(group, timeout)
        time_runs(fn, nwarmup, device)
        sync_with_timeout(group, timeout)
        local_median = statistics.median(time_runs(fn, nruns, device))
        return reduce_max_across_ranks(local_median, group, device, timeout)
