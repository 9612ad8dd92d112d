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


__all__ = [
    "Candidate",
    "CollectiveBenchmarkConfig",
    "CollectiveBenchmarkError",
    "CollectiveBenchmarkTimeout",
    "InvalidBenchmarkSetting",
    "Member",
    "OpToTune",
    "digest",
]


class CollectiveBenchmarkError(RuntimeError):
    """Benchmarking cannot reach a decision every rank shares.

    Raised on every member of the group that reaches the step where it
    happens: when a member does not reach a step that needs every member
    within its bound (the message names the absent members), when the
    members are not tuning the same op,
    or when their settings differ.
    Under the config's ``strict``, also when an op tuned nothing.
    """


class CollectiveBenchmarkTimeout(CollectiveBenchmarkError, TimeoutError):
    """A collective step did not complete within its bound."""


def digest(text: str) -> str:
    """A short, stable digest of ``text`` (the same in every process)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class InvalidBenchmarkSetting(ValueError):
    """A :class:`CollectiveBenchmarkConfig` field out of its range.

    ``field`` names it, so that a caller that read the value from somewhere
    else (``torch._inductor.config``) can name that source instead.
    """

    def __init__(self, field: str, expected: str, value: object) -> None:
        super().__init__(f"{field} must be {expected}, got {value!r}")
        self.field, self.expected = field, expected


@dataclasses.dataclass(frozen=True)
class CollectiveBenchmarkConfig:
    """How a session benchmarks; every rank of the group must use equal values."""

    timeout: timedelta = timedelta(seconds=30)
    """Bound of every collective step of a session on the benchmark channel."""

    nwarmup: int = 5
    """Untimed runs per candidate (at least one: its output is screened)."""

    nruns: int = 50
    """Timed runs per candidate, interleaved with the op's other candidates."""

    race_every: int = 10
    """Timed rounds between an op's checkpoints, where every member stops
    timing the candidates that can no longer win (``rules.racing``); 0: none."""

    retries: int = 0
    """How many times a candidate whose round timed out is run again."""

    tie_tolerance: float = 0.02
    """Relative gap to the fastest within which candidates count as tied."""

    screen: bool = True
    """Compare each candidate's first output with the default's."""

    max_wait: timedelta = timedelta(minutes=10)
    """How long a late member (still compiling, or stalled in a candidate) is
    waited for where every member must meet: the join, the end of compiling,
    and a failure agreement."""

    confidence: float = 0.95
    """How sure a session must be that a candidate beats the default before replacing it."""

    allow_gloo_overlap: bool = False
    """Let candidates that keep several collectives in flight on one gloo group compete."""

    strict: bool = False
    """Raise, on every member, when a session tunes nothing because its op's
    default had no result or every candidate failed, instead of warning once
    and keeping the default."""

    decision_dir: str | None = dataclasses.field(
        default=None, compare=False, repr=False
    )
    """Where agreed decisions are stored for later processes (``None``: nowhere).

    Each host has its own, so the members do not compare it.
    """

    def __post_init__(self) -> None:
        for field, valid, expected in (
            ("timeout", self.timeout > timedelta(0), "positive"),
            ("nwarmup", self.nwarmup >= 0, ">= 0"),
            ("nruns", self.nruns >= 1, ">= 1"),
            ("race_every", self.race_every >= 0, ">= 0"),
            ("retries", self.retries >= 0, ">= 0"),
            ("tie_tolerance", self.tie_tolerance >= 0, ">= 0"),
            ("max_wait", self.max_wait >= self.timeout, "at least the timeout"),
            ("confidence", 0.5 <= self.confidence < 1.0, "in [0.5, 1)"),
        ):
            if not valid:
                raise InvalidBenchmarkSetting(field, expected, getattr(self, field))


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One implementation to benchmark.

    ``fn`` runs the implementation once on fixed inputs and returns its output
    (a tensor, or a sequence whose first tensor is the output); ``magnitude``,
    the default's only, runs it once on the absolute values of its
    floating-point inputs: how large the partial sums of its reductions are,
    which screening's tolerance grows with (``rules.screening_tolerance``).
    ``prepare`` does the candidate's local one-time work (compilation): it
    runs on every rank after the join, only when the group benchmarks the op, and before a
    rendezvous, so that its duration, which differs between ranks, is not
    charged to a bounded collective step; a candidate whose ``prepare``
    raises on any rank is disqualified on every rank.  ``signature``
    describes the collectives ``fn`` issues (see ``collective_signature``):
    a candidate whose signature is not the same on every member is
    disqualified at the join, without running.
    ``in_flight`` is the most collectives ``fn`` keeps in flight at once on
    one group (part of the signature; see ``docs/modules.md``, "Memory
    safety on gloo").
    ``collectives`` are the collective ops its graph calls
    (``namespace::name``), which a screen of the backend reads.
    """

    name: str
    fn: Callable[[], Any]
    is_default: bool = False
    prepare: Callable[[], Any] | None = None
    magnitude: Callable[[], Any] | None = None
    signature: str = ""
    in_flight: int = 0
    collectives: frozenset[str] = frozenset()


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
    candidate's code).
    Agreed decisions are remembered by it, in the process and in Inductor's
    cache directory; an op that any member of the group remembers is
    adopted by every member without benchmarking (see
    :meth:`CollectiveBenchmarker.run_batch`).  ``None``: never remembered.
    """

    key: str
    candidates: Sequence[Candidate]
    memo_key: str | None = None


class Member(Protocol):
    """What the layers under the orchestrator read of a session's member.

    The orchestrator (``benchmarker.CollectiveBenchmarker``) is one; the
    join and the decision cache read nothing else of it.
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
