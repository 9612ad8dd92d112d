"""The values that the layers of collective benchmarking pass to one another.

What a session benchmarks (:class:`OpToTune`, whose :class:`Candidate` s run on
every member) and how (:class:`CollectiveBenchmarkConfig`).  They sit below
every other module of the protocol, so that the join, the session and the
choices can name them without importing the orchestrator that runs them
(``benchmarker.py``).
"""

from __future__ import annotations

import dataclasses
import hashlib
from datetime import timedelta
from typing import Any, Protocol, TYPE_CHECKING


if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import torch
    import torch.distributed as dist


__all__ = ["Candidate", "CollectiveBenchmarkConfig", "Member", "OpToTune", "digest"]


def digest(text: str) -> str:
    """A short, stable digest of ``text`` (the same in every process)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class CollectiveBenchmarkConfig:
    """How a session benchmarks; every rank of the group must use equal values."""

    timeout: timedelta = timedelta(seconds=30)
    """Bound of every collective step, and how long a member may show no heartbeat."""

    nwarmup: int = 5
    """Untimed runs per candidate (at least one: its output is screened)."""

    nruns: int = 50
    """Timed runs per candidate, interleaved with the op's other candidates."""

    retries: int = 0
    """How many times a candidate whose round timed out is run again."""

    tie_tolerance: float = 0.02
    """Relative gap to the fastest within which candidates count as tied."""

    screen: bool = True
    """Compare each candidate's first output with the default's."""

    max_wait: timedelta = timedelta(minutes=10)
    """How long a member that is alive (its heartbeat advances) is waited for."""

    confidence: float = 0.95
    """How sure a session must be that a candidate beats the default before replacing it."""

    allow_gloo_overlap: bool = False
    """Let candidates that keep several collectives in flight on one gloo group compete."""

    def __post_init__(self) -> None:
        if self.nruns < 1:
            raise ValueError(f"nruns must be >= 1, got {self.nruns}")
        if self.nwarmup < 0 or self.retries < 0 or self.tie_tolerance < 0:
            raise ValueError(f"nwarmup, retries and tie_tolerance must be >= 0: {self}")
        if self.timeout <= timedelta(0):
            raise ValueError(f"timeout must be positive, got {self.timeout}")
        if self.max_wait < self.timeout:
            raise ValueError(
                f"max_wait ({self.max_wait}) must be at least the timeout ({self.timeout})"
            )
        if not 0.5 <= self.confidence < 1.0:
            raise ValueError(f"confidence must be in [0.5, 1), got {self.confidence}")

    @classmethod
    def from_inductor_config(cls) -> CollectiveBenchmarkConfig:
        """The values set in ``torch._inductor.config``."""
        from torch._inductor import config

        timeout = timedelta(seconds=config.collective_benchmark_timeout)
        return cls(
            timeout=timeout,
            nwarmup=config.inductor_default_autotune_warmup,
            nruns=config.collective_benchmark_nruns,
            retries=config.collective_benchmark_retries,
            tie_tolerance=config.collective_benchmark_tie_tolerance,
            screen=config.collective_benchmark_screen_results,
            max_wait=max(
                timedelta(seconds=config.collective_benchmark_max_wait), timeout
            ),
            confidence=config.collective_benchmark_confidence,
            allow_gloo_overlap=config.collective_benchmark_allow_gloo_overlap,
        )


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One implementation to benchmark.

    ``fn`` runs the implementation once on fixed inputs and returns its output
    (a tensor, or a sequence whose first tensor is the output).  ``prepare``
    does the candidate's local one-time work (compilation): it runs on every
    rank after the join, only when the group benchmarks the op, and before a
    rendezvous, so that its duration, which differs between ranks, is not
    charged to a bounded collective step.  It may leave work running (kernel
    builds) and return a callable that waits for it: every candidate's
    ``prepare`` is called before any of these callables, so that the work
    of all candidates overlaps.  ``signature``
    describes the collectives ``fn`` issues (see ``collective_signature``):
    a candidate whose signature is not the same on every member is
    disqualified at the join, without running.  ``in_flight`` is the most
    collectives ``fn`` keeps in flight at once on one group (part of the
    signature; see "Memory safety on gloo" in ``benchmarker.py``).
    """

    name: str
    fn: Callable[[], Any]
    is_default: bool = False
    prepare: Callable[[], Any] | None = None
    signature: str = ""
    in_flight: int = 0


@dataclasses.dataclass(frozen=True)
class OpToTune:
    """The candidates of one autotuned op, and keys that identify the op.

    ``key`` describes the op (its name and input shapes) compactly; members
    of the group whose keys or candidate names differ are not tuning the same
    op, and the session fails on every member instead of pairing the wrong
    rounds.

    ``memo_key`` says what makes two ops' measurements interchangeable (what
    the candidates compute, on which input layouts, and what each is timed
    with); it may differ between ranks (a rank-dependent constant in a
    candidate's code).  Agreed decisions are remembered by it, in the
    process and in Inductor's cache directory; an op that any member of the
    group remembers is adopted by every member without benchmarking (see
    :meth:`CollectiveBenchmarker.run_batch`).  ``None``: never remembered.
    """

    key: str
    candidates: Sequence[Candidate]
    memo_key: str | None = None


class Member(Protocol):
    """What the layers under the orchestrator read of a session's member.

    The orchestrator (``benchmarker.CollectiveBenchmarker``) is one; the join
    takes any member, so that a stand-in runs the real join without a
    process group (``scripts/bench_collective_control.py``).
    """

    # Read-only (properties), so that a member may narrow their types.
    @property
    def group(self) -> dist.ProcessGroup: ...

    @property
    def group_name(self) -> str: ...

    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    @property
    def config(self) -> CollectiveBenchmarkConfig: ...

    @property
    def device(self) -> torch.device: ...

    def decision_context(self) -> tuple[str, str]:
        """What a decision depends on besides the candidates; the same on every member."""
        ...
