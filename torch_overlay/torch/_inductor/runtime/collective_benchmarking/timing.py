"""Timing collective candidates on the calling rank, device-agnostically.

Host timers on CPU: a CPU candidate's collectives (gloo) complete before it
returns.  Device events elsewhere (CUDA, XPU): the host only enqueues work,
and device work is waited for by polling an event against a deadline rather
than by ``synchronize()``, so that a collective kernel that never completes
(a peer left) cannot block the host past the protocol's timeout.

Not ``torch._inductor.runtime.benchmarking``: its benchmarkers choose how
many times to run a function from its estimated duration on the calling
process, so the members of a group would issue different numbers of
collectives and deadlock; they also wait with ``synchronize()``, without a
deadline, and time each function alone, where a session interleaves its
candidates' runs so that they share the machine's noise.

Each protocol step is a ``dynamo_timed`` event (:func:`timed`) that names
its group and its number of candidates, and its seconds are added to
``torch._dynamo.utils.counters["collective_autotuning"]``, which
``scripts/bench_collective_autotuning.py`` reports.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, TYPE_CHECKING

import torch
from torch._dynamo.utils import counters, dynamo_timed

from .types import CollectiveBenchmarkTimeout


if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence


__all__ = [
    "CallFailed",
    "device_of",
    "time_calls",
    "timed",
    "timer_name",
    "wait_device",
]


def device_of(tensors: Any) -> torch.device:
    """The device of the first tensor in ``tensors`` (CPU when there is none).

    This is the local device the candidate runs on; it is deliberately not
    derived from the rank, which need not equal the local device index.
    """
    for value in tensors:
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")


def timer_name(device: torch.device) -> str:
    """What :func:`time_calls` times with on ``device``: ``"host clock"`` or ``"cuda events"``."""
    return "host clock" if device.type == "cpu" else f"{device.type} events"


def _stream(device: torch.device) -> Any:
    # The current stream of the tensors' device, which need not be the
    # current device (a rank bound to cuda:1 may run with cuda:0 current).
    return torch.get_device_module(device).current_stream(device)


def wait_device(device: torch.device, deadline: float, event: Any = None) -> None:
    """Wait for ``event``, or all work enqueued on ``device``, until ``deadline`` (``time.monotonic()``).

    Raises :class:`CollectiveBenchmarkTimeout` when it is still pending then.
    """
    if device.type == "cpu":
        return
    if event is None:
        event = torch.get_device_module(device).Event()
        event.record(_stream(device))
    # Event.synchronize() has no deadline, and a collective kernel whose peer
    # left never completes: query(), which cannot block, is polled instead.
    while not event.query():
        if time.monotonic() > deadline:
            raise CollectiveBenchmarkTimeout(
                f"device work on {device} did not complete in time"
            )
        time.sleep(1e-4)


class CallFailed(Exception):
    """Call ``index`` of :func:`time_calls` raised ``error``."""

    def __init__(self, index: int, error: BaseException) -> None:
        super().__init__(f"call {index} failed: {error!r}")
        self.index, self.error = index, error


def time_calls(
    calls: Sequence[Callable[[], Any]],
    device: torch.device,
    timeout_s: float,
    before_each: Callable[[int], None] | None = None,
) -> list[float]:
    """Each call once, in order; each one's time in milliseconds.

    ``before_each(index)``, when given, runs before each call, outside its
    time.  Raises :class:`CallFailed` naming the call that raised, or, on a
    device, the call whose work is still pending ``timeout_s`` after it was
    enqueued (the next call is enqueued once it completed).
    """
    module = None if device.type == "cpu" else torch.get_device_module(device)
    wait_device(device, time.monotonic() + timeout_s)
    times = []
    for index, fn in enumerate(calls):
        if before_each is not None:
            before_each(index)
        try:
            if module is None:
                start = time.perf_counter()
                fn()
                times.append((time.perf_counter() - start) * 1e3)
            else:
                times.append(_device_time(fn, module, device, timeout_s))
        except Exception as error:
            raise CallFailed(index, error) from error
    return times


def _device_time(
    fn: Callable[[], Any], module: Any, device: torch.device, timeout_s: float
) -> float:
    # Waited for as upstream's collective benchmark waits for each run
    # (end_evt.synchronize()), with its own deadline: an overrun blames it.
    start, end = (module.Event(enable_timing=True) for _ in range(2))
    start.record(_stream(device))
    fn()
    end.record(_stream(device))
    wait_device(device, time.monotonic() + timeout_s, end)
    return start.elapsed_time(end)


@contextmanager
def timed(
    phase: str,
    counter: str | None = None,
    *,
    compile_metric: str | None = None,
    **metadata: object,
) -> Iterator[None]:
    """Time one phase of a session (``"join"``, ``"warmup"``, ``"exchange"``, ...).

    A ``dynamo_timed`` event ``collective_autotuning.<phase>``, carrying
    ``metadata`` (the group, the number of candidates) as its chromium
    event's arguments, so that the phase shows in
    ``torch._dynamo.utils.compile_times()`` and in the trace's chromium
    events; and its seconds added to
    ``counters["collective_autotuning"]["<counter>_s"]`` (``counter``
    defaults to ``phase``), which the benchmark scripts read.
    ``compile_metric`` names a field of Dynamo's ``CompilationMetrics``
    that the phase's time, in microseconds, is added to.
    """
    started = time.perf_counter()
    try:
        with dynamo_timed(
            f"collective_autotuning.{phase}",
            metadata=metadata,
            dynamo_compile_column_us=compile_metric,
        ):
            yield
    finally:
        # Dynamo's counters are typed Counter[str] (int values); a Counter holds
        # float seconds as well, which the benchmark scripts read back.
        counters["collective_autotuning"][f"{counter or phase}_s"] += (  # type: ignore[assignment]
            time.perf_counter() - started
        )
