"""Collective autotuning's settings, read from ``torch._inductor.config``.

The protocol takes its settings as a :class:`CollectiveBenchmarkConfig` and
never reads Inductor's config; this module is the one place that does.  A
value out of its range is reported when it is read, at the start of the
compile step that needs it, naming the knob and its environment variable,
rather than as a dataclass field deep inside a session.
"""

from __future__ import annotations

import os
from datetime import timedelta

from torch._inductor import config
from torch._inductor.runtime.cache_dir_utils import cache_dir
from torch._inductor.runtime.collective_benchmarking.liveness import ensure_heartbeat
from torch._inductor.runtime.collective_benchmarking.types import (
    CollectiveBenchmarkConfig,
    InvalidBenchmarkSetting,
)


__all__ = ["benchmark_config", "start_heartbeat"]

# CollectiveBenchmarkConfig field -> (knob in torch._inductor.config, its
# environment variable, the Python types it may hold).
_KNOBS: dict[str, tuple[str, str, tuple[type, ...]]] = {
    "timeout": (
        "collective_benchmark_timeout",
        "TORCHINDUCTOR_COLLECTIVE_BENCHMARK_TIMEOUT",
        (int, float),
    ),
    "nwarmup": (
        "inductor_default_autotune_warmup",
        "TORCHINDUCTOR_DEFAULT_AUTOTUNE_WARMUP",
        (int,),
    ),
    "nruns": (
        "collective_benchmark_nruns",
        "TORCHINDUCTOR_COLLECTIVE_BENCHMARK_NRUNS",
        (int,),
    ),
    "retries": (
        "collective_benchmark_retries",
        "TORCHINDUCTOR_COLLECTIVE_BENCHMARK_RETRIES",
        (int,),
    ),
    "tie_tolerance": (
        "collective_benchmark_tie_tolerance",
        "TORCHINDUCTOR_COLLECTIVE_BENCHMARK_TIE_TOLERANCE",
        (int, float),
    ),
    "screen": (
        "collective_benchmark_screen_results",
        "TORCHINDUCTOR_COLLECTIVE_BENCHMARK_SCREEN_RESULTS",
        (bool,),
    ),
    "max_wait": (
        "collective_benchmark_max_wait",
        "TORCHINDUCTOR_COLLECTIVE_BENCHMARK_MAX_WAIT",
        (int, float),
    ),
    "confidence": (
        "collective_benchmark_confidence",
        "TORCHINDUCTOR_COLLECTIVE_BENCHMARK_CONFIDENCE",
        (int, float),
    ),
    "allow_gloo_overlap": (
        "collective_benchmark_allow_gloo_overlap",
        "TORCHINDUCTOR_COLLECTIVE_BENCHMARK_ALLOW_GLOO_OVERLAP",
        (bool,),
    ),
}


def _knob(field: str) -> str:
    name, env, _ = _KNOBS[field]
    return f"torch._inductor.config.{name} (environment variable {env})"


def _read(field: str) -> object:
    name, _, types = _KNOBS[field]
    value = getattr(config, name)
    # bool is an int: a switch set where a count belongs is a mistake too.
    if isinstance(value, bool) != (bool in types) or not isinstance(value, types):
        expected = " or ".join(t.__name__ for t in types)
        raise ValueError(
            f"{_knob(field)} must be {expected}, got {value!r} ({type(value).__name__})"
        )
    return value


def benchmark_config() -> CollectiveBenchmarkConfig:
    """The settings of the sessions that this compile runs, from ``torch._inductor.config``.

    Any rank may call it, alone; every rank of a group must have equal
    settings (the join checks it).  A ``collective_benchmark_max_wait``
    shorter than the timeout is taken as the timeout: a live member is
    always waited for at least that long.  Raises ``ValueError`` naming the
    knob and its environment variable when a value has the wrong type or is
    out of range.  Agreed decisions are stored in ``collective_decisions/``
    of Inductor's cache directory while ``autotune_local_cache`` is set.
    """
    read = {field: _read(field) for field in _KNOBS}
    values = dict(read)
    timeout = timedelta(seconds=values.pop("timeout"))  # type: ignore[arg-type]
    max_wait = timedelta(seconds=values.pop("max_wait"))  # type: ignore[arg-type]
    # Agreed decisions are autotuning results: stored with them, under the
    # same switch.
    decision_dir = (
        os.path.join(cache_dir(), "collective_decisions")
        if config.autotune_local_cache
        else None
    )
    try:
        return CollectiveBenchmarkConfig(
            timeout=timeout,
            max_wait=max(max_wait, timeout),
            decision_dir=decision_dir,
            **values,  # type: ignore[arg-type]
        )
    except InvalidBenchmarkSetting as error:
        raise ValueError(
            f"{_knob(error.field)} must be {error.expected}, got {read[error.field]!r}"
        ) from None


def start_heartbeat() -> None:
    """Start this process's heartbeat with the configured timeout (idempotent).

    Any rank may call it, alone, as soon as it may be waited for by peers
    (see :func:`~torch._inductor.runtime.collective_benchmarking.liveness.ensure_heartbeat`).
    Raises ``ValueError`` as :func:`benchmark_config` does.
    """
    ensure_heartbeat(benchmark_config().timeout)
