"""Collective autotuning's settings, read from ``torch._inductor.config``.

The protocol takes its settings as a :class:`CollectiveBenchmarkConfig` and
never reads Inductor's config; this module is the one place that does.  A
value out of its range is reported when it is read, at the start of the
compile step that needs it, naming the knob and its environment variable,
rather than as a dataclass field deep inside a session.  It also holds the
settings a rank compiles a candidate under (:func:`candidate_compile_settings`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from datetime import timedelta
from typing import Any, TYPE_CHECKING

from torch._inductor import config, config_comms
from torch._inductor.codecache import CacheBase
from torch._inductor.runtime.cache_dir_utils import cache_dir
from torch._inductor.runtime.collective_benchmarking.types import (
    CollectiveBenchmarkConfig,
    InvalidBenchmarkSetting,
)


if TYPE_CHECKING:
    from collections.abc import Iterator


__all__ = [
    "benchmark_config",
    "candidate_compile_settings",
    "deferral_requested",
]

# CollectiveBenchmarkConfig field -> the knob it is read from.  A knob's
# type is its field's (a number of seconds for a timedelta), and its
# environment variable, which the messages name, is TORCHINDUCTOR_ and its
# name in capitals.  The switches
# are ``Config`` entries, whose ``env_name_default`` reads "1" and "0" as
# bools and any other text as a string, reported by _read; the numeric knobs
# are plain module values (``Config`` reads no numbers).
_FIELDS = {
    "timeout": "collective_benchmark_timeout",
    "nwarmup": "collective_benchmark_nwarmup",
    "nruns": "collective_benchmark_nruns",
    "race_every": "collective_benchmark_race_every",
    "retries": "collective_benchmark_retries",
    "tie_tolerance": "collective_benchmark_tie_tolerance",
    "screen": "collective_benchmark_screen_results",
    "max_wait": "collective_benchmark_max_wait",
    "confidence": "collective_benchmark_confidence",
    "allow_gloo_overlap": "collective_benchmark_allow_gloo_overlap",
    "strict": "collective_benchmark_strict",
}


def _knob(name: str) -> str:
    variable = "TORCHINDUCTOR_" + name.upper()
    return f"torch._inductor.config.{name} (environment variable {variable})"


def _read(name: str, kind: type) -> Any:
    value = getattr(config, name)
    kinds = (kind,) if kind in (int, bool) else (int, float)
    # bool is an int: a switch set where a count belongs is a mistake too.
    if isinstance(value, bool) != (kind is bool) or not isinstance(value, kinds):
        expected = " or ".join(t.__name__ for t in kinds)
        raise ValueError(
            f"{_knob(name)} must be {expected}, got {value!r} ({type(value).__name__})"
        )
    return timedelta(seconds=value) if kind is timedelta else value


def benchmark_config() -> CollectiveBenchmarkConfig:
    """The settings of the sessions that this compile runs, from ``torch._inductor.config``.

    Any rank may call it, alone; every rank of a group must have equal
    settings (the join checks it).  A ``collective_benchmark_max_wait``
    shorter than the timeout is taken as the timeout: a live member is
    always waited for at least that long.  Raises ``ValueError`` naming the
    knob and its environment variable when a value has the wrong type or is
    out of range.
    Agreed decisions are stored in ``collective_decisions/<system hash>/`` of
    Inductor's cache directory while ``autotune_local_cache`` is set.
    """
    kinds = {
        f.name: type(f.default) for f in dataclasses.fields(CollectiveBenchmarkConfig)
    }
    read = {field: _read(knob, kinds[field]) for field, knob in _FIELDS.items()}
    read["max_wait"] = max(read["max_wait"], read["timeout"])
    # Agreed decisions are autotuning results: stored with them, under the
    # same switch, and per system as upstream's (get_local_cache_path), so
    # that a decision timed on one kind of machine (device, CUDA or HIP,
    # Triton) is never adopted on another that shares the cache directory.
    read["decision_dir"] = (
        os.path.join(
            cache_dir(), "collective_decisions", CacheBase.get_system()["hash"]
        )
        if config.autotune_local_cache
        else None
    )
    try:
        # The ranges are the config's own checks, reported here as the knob's.
        return CollectiveBenchmarkConfig(**read)
    except InvalidBenchmarkSetting as error:
        knob = _FIELDS[error.field]
        raise ValueError(
            f"{_knob(knob)} must be {error.expected}, got {getattr(config, knob)!r}"
        ) from None


def deferral_requested() -> bool:
    """``defer_collective_autotuning``, checked: ``ValueError`` unless a bool."""
    return bool(_read("defer_collective_autotuning", bool))


# Inductor's passes that issue a collective over the job's ranks while they
# compile a graph, and the switches that turn them off.  A candidate is
# compiled only by the members of its op's group, and not by all of them
# alike (a compile that raises stops before the Scheduler), so such a
# collective, distributed_max_autotune_gemm's all_gather_object over every
# rank of the job in the nested Scheduler, say, waits for ranks that never
# issue it or pairs with another graph's by accident.  The program's own
# graph keeps them: every rank compiles it.  test_collective_inductor_passes.py
# fails when torch gains a compile-time collective that this list does not
# switch off.
_CROSS_RANK_PASSES = {
    "distributed_max_autotune_gemm": False,
    "aten_distributed_optimizations.spmd_check": False,
    "aten_distributed_optimizations.enable_overlap_scheduling": False,
}
_CROSS_RANK_COMMS_PASSES = {
    "runtime_estimations_align_across_all_distributed_ranks": False,
}


@contextlib.contextmanager
def candidate_compile_settings() -> Iterator[None]:
    """Inductor's settings while a rank compiles a collective autotuning candidate.

    Those of the compile, with every pass that issues a collective over the
    job's ranks switched off (``_CROSS_RANK_PASSES``): what a candidate's
    compile runs is this rank's alone.  The candidate is timed without them;
    the winner, inlined into the program's graph, is compiled with them.
    Any rank may enter it, alone.
    """
    with (
        config.patch(_CROSS_RANK_PASSES),
        # install_config_module adds patch(); config_comms, unlike config,
        # has no TYPE_CHECKING import of its typing stub.
        config_comms.patch(_CROSS_RANK_COMMS_PASSES),  # type: ignore[attr-defined]
    ):
        yield
