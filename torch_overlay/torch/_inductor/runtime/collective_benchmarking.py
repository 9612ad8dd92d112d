"""Rank-consistent benchmarking of autotuning choices that contain collectives.

Why this module exists
----------------------
Inductor can autotune a custom op among several user-registered implementations
(``register_custom_op_autotuning``).  When those implementations contain
collectives (all_reduce, all_gather, reduce_scatter, all_to_all), benchmarking
them is a distributed protocol: every rank of the op's process group must run
each candidate the same number of times, in the same order, leave with the same
timings and pick the same winner.  Ranks that disagree compile programs that
issue different collectives: a hang, or silently wrong results.  The governing
rule is the one Dynamo's compiler collectives follow: a compile-time decision
that changes which collectives run is taken collectively, never by one rank.

History
-------
The first version lived in ``select_algorithm.py``.  It was CUDA-only (CUDA
events, a reduction tensor on ``cuda:{rank}``), used the default process group
whatever group the op ran on, averaged per-rank means, and on any failure made
the failing rank alone stop benchmarking and fall back, while its peers waited
for it in a collective.  On CPU/gloo every candidate failed and nothing was
tuned.  The second version (this module, until the session exchange) synchronized
every candidate twice, with a status all-reduce before its timed runs and an
all-gather of its result after them, and declared a member lost one timeout
after it stopped reporting, whether it was dead or only slow.

The module is split by responsibility: this one runs the protocol and times
candidates; ``collective_control.py`` holds the control plane (heartbeats,
liveness-aware agreement over the store, benchmark channels);
``collective_decisions.py`` holds the decision rules, pure functions of what
the ranks agreed on.

The protocol
------------
:class:`CollectiveBenchmarker` runs *sessions* over a group: one per op when
ops are tuned while they are lowered (V1, :meth:`~CollectiveBenchmarker.run`),
one per group and graph when the scheduler tunes a graph's collective ops
together (V2, :meth:`~CollectiveBenchmarker.run_batch`; see
``torch/_inductor/collective_autotuning.py``).  A session:

1. **Join (the pre-sync).**  Every rank compiles the candidates (local work
   whose duration differs between ranks), then posts a key describing the ops
   and their candidates in the control store and waits for every member.  A
   member still compiling keeps the others waiting as long as its heartbeat
   advances (see *Liveness*).  A different key is an error on every rank that
   joined; the key lists a compact digest per op, so the error names the
   first op at which the ranks differ.  Each member also posts the decision
   it remembers per op (see *Remembered decisions and caches*): an op that
   any member remembers is adopted by all, neither compiled nor benchmarked;
   the ops that nobody remembers are benchmarked by all.
2. **Warmups and interleaved timed runs.**  Op by op, each candidate warms
   up in turn (the op's default first, then in registration order; the first
   output of each is screened against the default's on the same inputs),
   then the op's candidates are timed *interleaved*: ``nruns`` iterations,
   in each of which every candidate runs once, in an order shuffled per
   iteration from the op's key, the same on every rank.  No collective is
   issued besides the candidates' own: those keep the ranks in lock-step (a
   rank cannot finish a candidate's collective before every member has
   issued it), and a rank that fails wakes its peers by dropping the channel
   (below).  A candidate whose output is wrong on a rank still runs its
   timed runs there, so that its collectives stay matched.
3. **Exchange and commit.**  One all-gather of every candidate's status and
   timed runs, then one all-reduce (the commit), for the whole session.  The
   commit exists because a collective can complete on some members and fail
   on others: a member that completed the exchange while a peer failed it
   would otherwise leave the session with a decision while the peer, which
   lacks the exchanged data, waits for it in the failure agreement.  With
   the commit, that member fails the commit instead, the agreement sees that
   the exchange failed, and every member runs it again.  A member that
   completed the commit posts so in the store, so that a peer failing the
   commit (which can only happen once every member exchanged) decides with
   the data it has instead of waiting.  Seconds spent per step are added to
   ``torch._dynamo.utils.counters["collective_autotuning"]``: ``presync_s``
   in joins (mostly waiting for the slowest member to finish compiling),
   ``sync_s`` in the exchange, the commit and failure agreements,
   ``warmup_s`` and ``timed_s`` in the candidates' runs; ``presync`` counts
   joins, ``exchanges`` exchanges and ``sync_collectives`` the collectives
   the protocol issued itself.
4. **Failures.**  Any exception or timeout on a rank ends its step: it tears
   down the benchmark channel (below), which makes the peers' pending
   collectives fail at once instead of at their timeout, and reports
   ``(step, status)`` in the control store, a step being one candidate's
   warmup or one timed run.  Every rank then waits for every member's report
   and applies the same rule to the same reports (the earliest reported step
   takes the worst status reported for it: a rank already past it only saw
   it succeed).  That step's candidate is retried when the cause was a
   timeout and retries remain, or disqualified otherwise.  A failure in a
   warmup resumes at that candidate's warmup; a failure in the timed runs
   restarts the op's timed runs, which must all see the same stretch of
   time.  A failed exchange runs again (at most ``retries + 1`` times).
5. **Decision.**  A candidate qualifies when every rank ran it without error
   and with a correct result.  Its time in a run is the slowest rank's (a
   collective completes when its slowest participant does) and its time is
   the median over the runs.  Among the qualified, candidates within
   ``tie_tolerance`` of the fastest are tied and the first of them in
   preference order wins, so a near-tie cannot flip between compiles.  *Do
   no harm*: a winner other than the default must also beat the default
   beyond the session's noise, or the default stays: paired run by run, it
   must have been faster in significantly more runs than chance (a one-sided
   sign test at ``confidence``, 95% by default; with fewer than 5 timed runs
   no candidate can replace the default at 95%).  ``min_speedup_threshold``
   applies on top of this.  When nothing qualifies every rank uses the
   default.

What the measurement assumes.  The machine's speed may drift during a session
(a peer still compiling, clocks ramping up, caches warming): interleaving
puts every candidate's runs in the same stretch of time, so a slow stretch
hits every candidate alike and, paired run by run, cancels out; timing
candidates one after the other would favour whichever ran in the quiet part.
It assumes that the drift within one iteration is small next to the
differences worth measuring, and that a candidate's run does not change the
cost of the next one (a cache or buffer it leaves behind); the shuffled
order spreads whatever effect remains over every candidate.  The sign test
uses only which of two paired runs was faster, so a few outliers (a page
fault, a preempted rank) cannot decide it.

Remembered decisions and caches
-------------------------------
A decision is remembered under its op's ``memo_key`` (what is measured: the
candidates' code and input layouts), the group's name, size and backend, and
the settings that change a decision: in the process, and on disk in
Inductor's cache directory (``collective_decisions/``, under
``autotune_local_cache``), so that a restarted job does not tune again.  Each
rank has a cache of its own (one per node, or per rank), so ranks can
remember different things: one node's cache emptied, a decision made when
only some ranks' files survived.  Two designs keep the group together:

* *re-tune when anyone forgets*: simple, but every rank pays a full session
  for one replaced node, and the new decision may differ from the one the
  warm ranks' cached programs were compiled with, which then have to be
  thrown away too;
* *adopt an agreed decision*: what this module does.  At the join, an op
  that any member remembers takes the decision of the lowest-ranked member
  that remembers one, posted in the control store; the others fetch it.
  Every remembered decision was agreed by a whole group when it was made,
  so adopting it is as rank-consistent as re-deciding, costs one store
  round trip instead of a compile and a benchmark, and leaves the warm
  ranks' programs valid.  It is verified first: every member's digest of
  the op (its key, its candidates and their roles, the group and the
  settings) must be the same, so a decision is only adopted for the same
  measurement.  The memo key itself is compared by no one: it may hold
  rank-dependent constants of a candidate's traced code, so each rank
  remembers under its own.

A program that Inductor's FX graph or AOTAutograd cache returns carries the
sessions its compile took part in (:class:`RecordedSession`, recorded by
:func:`recorded_sessions`).  Before it runs, its rank takes part in the same
sessions again (:func:`replay_sessions`) with the program's decisions, so
that a rank that misses the cache and compiles meets, in the same join,
every rank that hit it.  When the group agrees on the program's decisions it
runs; when it agrees on others (a lower rank remembered another decision),
the rank compiles the graph again and that compile adopts the agreed
decisions without meeting the group a second time.  Graphs whose compile
tuned no collective choice record no session and replay nothing: they pay
no exchange.  A rank that recompiles a frame alone (its guards failed, its
peers' did not) would wait at a join nobody else reaches; the heartbeat
thread tells its peers which frame each rank is compiling, and both sides
raise an error naming the ranks within the timeout (see
``collective_control.py``).

Liveness
--------
A member that has not reported is waited for as long as it shows it is
alive: every process beats a counter in the store from a thread of its own,
and a waiting rank reads its peers' counters (``collective_control.py``).  A
member is *lost* when its heartbeat has not advanced for
``collective_benchmark_timeout`` (its process is gone, or its main thread
holds the GIL in a call that does not return: *wedged*), or when it is alive
but still absent after ``collective_benchmark_max_wait``.  Every healthy rank
then raises :class:`CollectiveBenchmarkError` naming it.  What this bounds:

* an exception reaches every rank within milliseconds (the channel drop);
* a *straggler* (alive, returning late from a candidate) is waited for up to
  the cap; when it returns its round fails on it too, the members agree on a
  timed-out round, and the candidate is retried or disqualified;
* a killed rank is declared lost about one timeout after its death (its
  sockets close at once, its heartbeat stops);
* a wedged rank is declared lost about one timeout after it wedged: its
  peers' collective times out then, and by that time its heartbeat has been
  silent for as long.

Channels and why a failed channel is never reused
-------------------------------------------------
Candidates run on a *benchmark channel*: a private process group over the same
ranks, built on a fresh prefix of the default store and registered under the
op group's name for the duration of a round, so that the candidates'
functional collectives (which name their group) run on it.  The user's group
is never used while a candidate can fail.  This matters because neither
backend can take part in another collective after one did not complete:

* gloo: a rank that times out closes its connections to the late peer (the
  late peer then fails with "Connection closed by peer"), and a rank that
  skipped a collective leaves its peers' tags out of step; the channel is dead
  either way.  Dropping a gloo group closes its sockets, which is how a failing
  rank wakes its peers within milliseconds.
* NCCL: a collective that does not complete leaves a kernel spinning on the
  device; the communicator must be aborted (``ncclCommAbort``) and rebuilt.
  Device work is waited for by polling events against the deadline, so the
  host never blocks in ``synchronize`` on a wedged kernel.  The channel's own
  timeout is twice the benchmark timeout so that this module aborts first and
  the NCCL watchdog does not tear the process down.

Agreement after a failure therefore goes over the control store (the
``TCPStore`` the job was initialized with), which does not depend on any
collective channel; a new channel is built once every member has reported.

Collectives an implementation issues through a ``ProcessGroup`` object it
captured (rather than through a group name) run on that group, not on the
benchmark channel.  The eager default of a custom op often does this; it is
benchmarked first, while nothing has failed.

The dispatcher
--------------
Candidates run with the Python dispatcher disabled.  Inductor lowers graphs
under ``enable_python_dispatcher()``, and that thread-local state leaks into
autotuning.  Under the Python dispatcher ``_c10d_functional.wait_tensor`` runs
its kernel from Python with the GIL held and blocks in ``c10d::Work::wait``,
while the gloo worker thread that completes the collective needs the GIL to
drop a tensor whose ``PyObject`` is owned by C++: the rank stops progressing and
its peers wait forever.  Compiled candidates need none of the lowering-time
dispatch state, so disabling it is both correct and scoped.
"""

from __future__ import annotations

import collections
import contextvars
import dataclasses
import hashlib
import itertools
import logging
import math
import os
import re
import time
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, TYPE_CHECKING

import torch
import torch.distributed as dist
from torch._dispatch.python import no_python_dispatcher
from torch._dynamo.utils import counters

from .collective_control import (
    build_channel,
    CollectiveBenchmarkError,
    CollectiveBenchmarkTimeout,
    ControlStore,
    ensure_heartbeat,
    group_state,
    registered_as,
    resolve_group,
    STORE_PREFIX,
)
from .collective_decisions import (
    CandidateResult,
    CandidateStatus,
    CollectiveDecision,
    decide,
    decision_from_json,
    decision_to_json,
    earliest_failure,
    first_tensor,
    interleaved_order,
    is_default_choice,
    outputs_match,
    pick_winner,
    RankReport,
    SCREENING_TOLERANCES,
    select_winner,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence


__all__ = [
    "Candidate",
    "CandidateResult",
    "CandidateStatus",
    "CollectiveBenchmarkConfig",
    "CollectiveBenchmarkError",
    "CollectiveBenchmarkTimeout",
    "CollectiveBenchmarker",
    "CollectiveDecision",
    "OpToTune",
    "RankReport",
    "RecordedSession",
    "SCREENING_TOLERANCES",
    "benchmark_collective_choices",
    "candidate_names",
    "choices_identity",
    "collective_candidates",
    "collective_group_name",
    "device_of",
    "pick_winner",
    "recorded_sessions",
    "replay_sessions",
    "resolve_group",
    "select_winner",
    "sync_with_timeout",
    "time_runs",
    "try_collective_benchmark_with_timeout",
]

log = logging.getLogger(__name__)
decision_log = torch._logging.getArtifactLogger(__name__, "collective_autotuning")


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
        )


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One implementation to benchmark.

    ``fn`` runs the implementation once on fixed inputs and returns its output
    (a tensor, or a sequence whose first tensor is the output).  ``prepare``
    does the candidate's local one-time work (compilation) and runs on every
    rank before the ranks join, so that its duration, which differs between
    ranks, is not charged to a bounded collective step.
    """

    name: str
    fn: Callable[[], Any]
    is_default: bool = False
    prepare: Callable[[], Any] | None = None


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


# --- timing -------------------------------------------------------------------------
def device_of(tensors: Any) -> torch.device:
    """The device of the first tensor in ``tensors`` (CPU when there is none).

    This is the local device the candidate runs on; it is deliberately not
    derived from the rank, which need not equal the local device index.
    """
    for value in tensors:
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")


def _wait_device(device: torch.device, deadline: float) -> None:
    # Poll an event instead of synchronize(): a wedged collective kernel must
    # not block the host past the deadline.
    if device.type == "cpu":
        return
    event = torch.get_device_module(device).Event()
    event.record()
    while not event.query():
        if time.monotonic() > deadline:
            raise CollectiveBenchmarkTimeout(
                f"device work on {device} did not complete in time"
            )
        time.sleep(1e-4)


def time_runs(
    fn: Callable[[], Any], nruns: int, device: torch.device, deadline: float = math.inf
) -> list[float]:
    """Run ``fn`` ``nruns`` times on the calling rank; each run's time in milliseconds.

    Host timers on CPU (a CPU candidate's collectives complete before it
    returns), device events elsewhere.  Raises what ``fn`` raises, or
    :class:`CollectiveBenchmarkTimeout` when device work is still pending at
    ``deadline`` (a ``time.monotonic()`` value).
    """
    try:
        return _time_calls([fn] * nruns, device, deadline - time.monotonic())
    except _CallFailed as failure:
        raise failure.error from None


class _CallFailed(Exception):
    def __init__(self, index: int, error: BaseException) -> None:
        super().__init__(f"call {index} failed: {error!r}")
        self.index, self.error = index, error


def _time_calls(
    calls: Sequence[Callable[[], Any]], device: torch.device, timeout_s: float
) -> list[float]:
    # Each call once, in order; its time in ms.  A failure names the call
    # (_CallFailed); device work still pending timeout_s after the last call
    # is a timeout of the last call.
    if device.type == "cpu":
        times = []
        for index, fn in enumerate(calls):
            start = time.perf_counter()
            try:
                fn()
            except Exception as error:
                raise _CallFailed(index, error) from error
            times.append((time.perf_counter() - start) * 1e3)
        return times
    module = torch.get_device_module(device)
    _wait_device(device, time.monotonic() + timeout_s)
    events = [
        (module.Event(enable_timing=True), module.Event(enable_timing=True))
        for _ in calls
    ]
    for index, (fn, (start, end)) in enumerate(zip(calls, events, strict=True)):
        start.record()
        try:
            fn()
        except Exception as error:
            raise _CallFailed(index, error) from error
        end.record()
    try:
        _wait_device(device, time.monotonic() + timeout_s)
    except CollectiveBenchmarkTimeout as error:
        raise _CallFailed(len(calls) - 1, error) from error
    return [start.elapsed_time(end) for start, end in events]


def _classify(error: BaseException) -> CandidateStatus:
    # Backends report a timed-out collective with their own error types and
    # messages; gloo says "Timed out waiting ...", NCCL "... timed out".
    message = str(error).lower()
    if isinstance(error, TimeoutError) or "timed out" in message:
        return CandidateStatus.TIMED_OUT
    if (
        isinstance(error, dist.DistError)
        or "connection closed" in message
        or "connection reset" in message
    ):
        return CandidateStatus.PEER_FAILED
    return CandidateStatus.RAISED


class _StepFailed(Exception):
    def __init__(
        self,
        status: CandidateStatus,
        stage: str,
        error: BaseException | None = None,
        step: int | None = None,
    ) -> None:
        super().__init__(f"{status.name} during {stage}: {error!r}")
        self.status = status
        self.stage = stage
        self.step = step  # in the session's schedule; None: the step the caller is at


@dataclasses.dataclass(frozen=True)
class _Step:
    """One step of a session's schedule: the unit in which failures are reported."""

    op: int  # position among the session's benchmarked ops
    candidate: int  # index among the op's candidates, in preference order
    timed: bool  # False: the candidate's warmup; True: one of its timed runs
    run: int = 0


@dataclasses.dataclass(frozen=True)
class _Resume:
    """Where a session's schedule resumes after a failure agreement."""

    op: int
    # The first candidate to warm up again; None: the op's timed runs.
    warmup_from: int | None


class _LocalOutcomes:
    """This rank's outcomes in a session, which its exchange sends."""

    def __init__(self) -> None:
        self.statuses: dict[tuple[int, int], CandidateStatus] = {}
        self.samples: dict[tuple[int, int], list[float]] = {}
        # per op: its default's first output
        self.references: dict[int, torch.Tensor] = {}

    def record_runs(
        self, op: int, candidates: Sequence[int], times: Sequence[float]
    ) -> None:
        for index in set(candidates):
            self.samples[(op, index)] = []
        for index, ms in zip(candidates, times, strict=True):
            self.samples[(op, index)].append(ms)

    def forget_from(self, resume: _Resume) -> None:
        # What runs again after the resume point is measured again.
        def runs_again(op: int, index: int) -> bool:
            if op != resume.op:
                return op > resume.op
            return resume.warmup_from is not None and index >= resume.warmup_from

        for key in [key for key in self.samples if key[0] >= resume.op]:
            del self.samples[key]
        for key in [key for key in self.statuses if runs_again(*key)]:
            del self.statuses[key]
        for op in [op for op in self.references if runs_again(op, 0)]:
            del self.references[op]

    def flatten(self, op: int, index: int, nruns: int) -> list[float]:
        samples = self.samples.get((op, index), [])
        status = self.statuses.get((op, index), CandidateStatus.OK)
        return [float(status), *samples, *[math.nan] * (nruns - len(samples))]


@contextmanager
def _timed(counter: str) -> Iterator[None]:
    # Seconds spent per protocol step, in counters["collective_autotuning"]:
    # what scripts/bench_collective_autotuning.py reports.
    started = time.perf_counter()
    try:
        yield
    finally:
        # Dynamo's counters are typed Counter[str] (int values); a Counter holds
        # float seconds as well, which the benchmark scripts read back.
        counters["collective_autotuning"][counter] += time.perf_counter() - started  # type: ignore[assignment]


# Inductor numbers the subgraph choices it creates over the whole process
# (SubgraphTemplate.index_counter): "..._direct_7".  The number depends on what
# the process compiled before, so it differs between ranks.
_COMPILE_COUNTER = re.compile(r"_\d+$")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --- the benchmarker ----------------------------------------------------------------
class CollectiveBenchmarker:
    """Benchmarks collective candidates in lock-step over one process group.

    Every member of ``group`` must construct it with the same configuration
    and call :meth:`run` with the same candidates in the same order, from the
    same point of the program; ranks outside the group must not call it.
    """

    def __init__(
        self,
        group: dist.ProcessGroup | str | None,
        config: CollectiveBenchmarkConfig,
        device: torch.device = torch.device("cpu"),
    ) -> None:
        self.group = resolve_group(group)
        self.group_name = self.group.group_name
        self.config = config
        self.device = device
        self.rank = self.group.rank()
        self.size = self.group.size()
        self._state = group_state(self.group)
        # (id of the op, candidate name) -> error
        self._prepare_errors: dict[tuple[int, str], str] = {}

    # The public entry points --------------------------------------------------
    def run(
        self,
        candidates: Sequence[Candidate],
        key: str = "",
        memo_key: str | None = None,
    ) -> CollectiveDecision:
        """Benchmark the candidates of one op; the decision every member shares.

        The same as :meth:`run_batch` with one op: see there.
        """
        return self.run_batch([OpToTune(key, candidates, memo_key)])[0]

    def run_batch(
        self, ops: Sequence[OpToTune], known: Sequence[CollectiveDecision] | None = None
    ) -> list[CollectiveDecision]:
        """Benchmark the candidates of several ops in one session; one decision per op.

        Every member of the group must call it with the same ops in the same
        order.  The session has one join (the *pre-sync*), which also checks
        that every member holds the same ops: the keys and candidate names of
        all ops go into the join digest.  Each op's candidates are then
        benchmarked in preference order (its default first, then the given
        order); at most one candidate per op may be the default, and its first
        output is the reference against which the op's other candidates are
        screened.  One exchange and one commit end the session.

        Decisions are remembered (see :class:`OpToTune`'s ``memo_key``), in
        the process and in Inductor's cache directory.  At the join every
        member posts what it remembers; an op that any member remembers is
        neither compiled nor benchmarked: every member adopts the decision of
        the lowest-ranked member that remembers one (it was agreed by the
        whole group when it was made), after checking that every member
        tunes the same op (its key, its candidates and their roles).  When every op is adopted, the session is
        its join alone.  ``known`` gives a decision per op that this member
        holds already (a compiled program's, replayed from a cache): it takes
        part in the join with them, compiles and benchmarks nothing, and
        returns what the group agreed, which may be another member's.

        Returns the decisions in ``ops`` order (a disqualified candidate has an
        infinite time; ``winner`` is ``None`` when none of an op's candidates
        qualified).  Raises :class:`CollectiveBenchmarkError` on every healthy
        member when a member is lost or the members' ops differ; never returns
        a decision that a healthy member does not share.
        """
        ensure_heartbeat()
        started = time.perf_counter()
        for op in ops:
            if sum(candidate.is_default for candidate in op.candidates) > 1:
                raise ValueError(
                    f"at most one candidate can be the default (op {op.key!r})"
                )
        agreed = [_pre_agreed.pop((self.group_name, op.key), None) for op in ops]
        pre_agreed = [decision for decision in agreed if decision is not None]
        if ops and len(pre_agreed) == len(ops):
            # Agreed already, in the join of a cached program's replay that this
            # compile replaces: the group met for it, it must not meet again.
            replayed = [
                _adopt(decision, op)
                for decision, op in zip(pre_agreed, ops, strict=True)
            ]
            _record(self, ops, replayed)
            return replayed
        remembered: list[CollectiveDecision | None] = (
            list(known) if known is not None else [self._recall(op) for op in ops]
        )
        self._state.sessions += 1
        control = ControlStore(
            f"{STORE_PREFIX}/{self.group_name}/session{self._state.sessions}/",
            self.group,
            self.config.timeout,
            self.config.max_wait,
        )
        with control.session():
            self._prepare_errors = {}
            self._prepare(
                ops, [i for i, decision in enumerate(remembered) if decision is None]
            )
            prepared = time.perf_counter()
            to_run, adopted = self._join(control, ops, remembered)
            plans = [
                (ops[i], sorted(ops[i].candidates, key=lambda c: not c.is_default))
                for i in to_run
            ]
            try:
                with no_python_dispatcher():
                    results = self._run_session(plans, control) if plans else []
            except CollectiveBenchmarkError:
                self._drop_channel()  # a peer is gone; a later session must not reuse the channel
                raise
        decisions = []
        positions = {op_index: position for position, op_index in enumerate(to_run)}
        for op_index, op in enumerate(ops):
            if op_index in positions:
                position = positions[op_index]
                decision = self._decide(
                    results[position], has_default=plans[position][1][0].is_default
                )
            else:
                decision = _adopt(adopted[op_index], op)
            self._remember(op, decision)
            self._log(decision, op.key)
            decisions.append(decision)
        _record(self, ops, decisions)
        stats = counters["collective_autotuning"]
        stats["ops"] += len(to_run)
        stats["recalled"] += len(ops) - len(to_run)
        # float seconds in Dynamo's int-typed counters: see _timed
        stats["prepare_s"] += prepared - started  # type: ignore[assignment]
        stats["session_s"] += time.perf_counter() - prepared  # type: ignore[assignment]
        return decisions

    # Remembered decisions -----------------------------------------------------
    def _group_and_settings(self) -> tuple[str, str]:
        # What a decision depends on besides the candidates: the group (its
        # name, size and backend) and the settings that change a decision;
        # the timeouts only change when a member is given up on.
        config = self.config
        settings = (
            config.nwarmup,
            config.nruns,
            config.retries,
            config.tie_tolerance,
            config.screen,
            config.confidence,
        )
        group = (
            self.group_name,
            self.size,
            dist.get_backend(self.group),
            self.device.type,
        )
        return repr(group), repr(settings)

    def _memo_key(self, op: OpToTune) -> tuple[str, ...] | None:
        if op.memo_key is None:
            return None
        # Names carry per-compile counters; the candidates' order and roles do not.
        return (
            *self._group_and_settings(),
            f"{op.memo_key}|{[c.is_default for c in op.candidates]}",
        )

    def _recall(self, op: OpToTune) -> CollectiveDecision | None:
        key = self._memo_key(op)
        if key is None:
            return None
        if key not in _remembered:
            stored = _stored_decision(key)
            if stored is not None:
                _remembered[key] = stored
        return _remembered.get(key)

    def _remember(self, op: OpToTune, decision: CollectiveDecision) -> None:
        key = self._memo_key(op)
        if key is not None and _remembered.get(key) != decision:
            _remembered[key] = decision
            _store_decision(key, decision)

    def _prepare(self, ops: Sequence[OpToTune], op_indices: Sequence[int]) -> None:
        # Local work before the join (compilation): its duration, which
        # differs between ranks, must not count against a bounded step.
        for op_index in op_indices:
            for candidate in ops[op_index].candidates:
                try:
                    if candidate.prepare is not None:
                        candidate.prepare()
                except (
                    Exception
                ) as error:  # the candidate is disqualified in its round, on every rank
                    log.warning(
                        "collective autotuning: preparing %s failed",
                        candidate.name,
                        exc_info=True,
                    )
                    self._prepare_errors[(id(ops[op_index]), candidate.name)] = repr(
                        error
                    )

    def _join(
        self,
        control: ControlStore,
        ops: Sequence[OpToTune],
        remembered: Sequence[CollectiveDecision | None],
    ) -> tuple[list[int], dict[int, CollectiveDecision]]:
        # The pre-sync: one store rendezvous per session.  Posting the per-op
        # digests (not only their combined digest) lets every member name the
        # first op at which the members differ; a digest covers what the op
        # measures, so a decision is only ever adopted for the same
        # measurement.  Each member also posts, per op, what it remembers.
        # Returns the ops that nobody remembers (the group benchmarks them)
        # and the decision adopted for every other op.
        op_digests = [_digest(f"{op.key}|{self._identity(op)}") for op in ops]
        memos = [
            _decision_digest(decision) if decision is not None else "-"
            for decision in remembered
        ]
        digest = _digest(f"{op_digests}|{self.config}")
        with _timed("presync_s"):
            posts = control.rendezvous(
                "join",
                f"{digest}|{','.join(op_digests)}|{','.join(memos)}",
                "the start of autotuning",
            )
        counters["collective_autotuning"]["presync"] += 1
        if len({post.split("|")[0] for post in posts}) != 1:
            self._raise_different_ops(posts, ops)
        by_member = [post.split("|")[2].split(",") for post in posts]
        to_run, adopted = [], {}
        for i in range(len(ops)):
            holders = [rank for rank, memo in enumerate(by_member) if memo[i] != "-"]
            if not holders:
                to_run.append(i)
                continue
            source = holders[0]
            chosen = by_member[source][i]
            if any(memo[i] != chosen for memo in by_member):
                if self.rank == source:
                    # this rank is a holder: it remembers a decision
                    mine = remembered[i]
                    assert mine is not None
                    control.post(f"adopt{i}", decision_to_json(mine))
                if memos[i] != chosen:
                    with _timed("presync_s"):
                        remembered_by_source = control.fetch(
                            f"adopt{i}", source, "sharing a remembered decision"
                        )
                    adopted[i] = decision_from_json(remembered_by_source)
                    continue
            # this rank's memo is `chosen`, not "-": it remembers a decision
            mine = remembered[i]
            assert mine is not None
            adopted[i] = mine
        return to_run, adopted

    def _identity(self, op: OpToTune) -> str:
        # What every member's op must share for one decision to serve them
        # all: the candidates (by name, without the per-process counter that
        # Inductor appends to a choice's name) and their roles, the group and
        # the settings.  Not the memo key: a candidate's traced graph may hold
        # rank-dependent constants (which slot is this rank's), so the memo
        # key, and the decisions a rank remembers by it, are the rank's own.
        candidates = [
            (_COMPILE_COUNTER.sub("", candidate.name), candidate.is_default)
            for candidate in op.candidates
        ]
        return f"{self._group_and_settings()}|{candidates}"

    def _raise_different_ops(self, posts: list[str], ops: Sequence[OpToTune]) -> None:
        lists = [[d for d in post.split("|")[1].split(",") if d] for post in posts]
        mine = lists[self.rank]
        # The first op index at which two members differ (one may have no op there).
        position = next(
            (
                i
                for i in range(max(map(len, lists)))
                if len({tuple(ranks[i : i + 1]) for ranks in lists}) > 1
            ),
            None,
        )
        if position is None:
            where = "every member holds the same ops; the benchmark settings differ"
        elif position < len(mine):
            where = f"they first differ at op {position}; on this rank it is {ops[position].key!r}"
        else:
            where = f"they first differ at op {position}, which this rank does not have"
        raise CollectiveBenchmarkError(
            f"collective autotuning: the ranks of group {self.group_name!r} are not tuning the same ops "
            f"(op counts by rank: {[len(ranks) for ranks in lists]}; {where}; "
            f"candidates on this rank: {[[c.name for c in op.candidates] for op in ops]})"
        )

    def _run_session(
        self, plans: Sequence[tuple[OpToTune, list[Candidate]]], control: ControlStore
    ) -> list[list[CandidateResult]]:
        # plans: each benchmarked op and its candidates in preference order.
        # The schedule is rebuilt after every failure agreement, from where the
        # session resumes, the same way on every member; step len(schedule) is
        # the exchange, the next one the commit, and a member that committed
        # counts as past every step.
        competing = [[True] * len(candidates) for _, candidates in plans]
        # disqualified by a failure agreement
        failed: dict[tuple[int, int], CandidateResult] = {}
        attempts: dict[tuple[int, int], int] = collections.defaultdict(lambda: 1)
        local = _LocalOutcomes()
        exchange_attempts = 1
        gathered: list[list[float]] | None = None
        resume = _Resume(op=0, warmup_from=0)
        epoch = 0
        while True:
            schedule = self._schedule(plans, competing, resume)
            exchange, commit = len(schedule), len(schedule) + 1
            step = 0
            try:
                while step < exchange:
                    step = self._run_op(plans, schedule, step, local)
                if gathered is None:
                    step = exchange
                    gathered = self._exchange(plans, local)
                step = commit
                self._commit()
                control.post("committed", "")
                break
            except _StepFailed as error:
                failed_at = step if error.step is None else error.step
                failure = f"{failed_at}:{int(error.status)}:{error.stage}"
                # The failure's description, without the traceback that G200
                # asks for (exc_info): a failed candidate step is expected here.
                log.info(  # noqa: G200
                    "collective autotuning: step %d failed on this rank: %s",
                    failed_at,
                    error,
                )
            # Only now, with the exception and its frames gone, is this rank's
            # last reference to the channel the one dropped here.
            self._drop_channel()
            epoch += 1
            counters["collective_autotuning"]["failure_agreements"] += 1
            with _timed("sync_s"):
                posts = control.rendezvous(
                    f"failure{epoch}", failure, "failure agreement", also=["committed"]
                )
            posts = [
                f"{commit + 1}:0:committed" if post.startswith("committed:") else post
                for post in posts
            ]
            failed_step, reports, stage = earliest_failure(posts)
            if failed_step >= commit:
                break  # every member exchanged; the commit failed somewhere: decide with the exchange
            if failed_step == exchange:
                if exchange_attempts > self.config.retries + 1:
                    raise CollectiveBenchmarkError(
                        f"collective autotuning: the exchange of group {self.group_name!r} failed "
                        f"{exchange_attempts} times ({stage}); its channel cannot carry a collective"
                    )
                exchange_attempts += 1
                resume = _Resume(op=len(plans), warmup_from=0)
                gathered = None
                continue
            blamed = schedule[failed_step]
            key = (blamed.op, blamed.candidate)
            status = max(report.status for report in reports)
            if status.retryable and attempts[key] <= self.config.retries:
                attempts[key] += 1
            else:
                failed[key] = CandidateResult(
                    plans[blamed.op][1][blamed.candidate].name,
                    reports,
                    attempts[key],
                    stage,
                )
                competing[blamed.op][blamed.candidate] = False
            # A failure in a warmup resumes at that candidate's warmup; one in
            # the timed runs restarts the op's timed runs, which must all see
            # the same stretch of time.
            resume = _Resume(
                op=blamed.op, warmup_from=None if blamed.timed else blamed.candidate
            )
            local.forget_from(resume)
            gathered = None
        # a candidate's status and timed runs, in the exchange
        width = 1 + self.config.nruns
        offsets = list(
            itertools.accumulate(
                [len(candidates) * width for _, candidates in plans], initial=0
            )
        )

        # The loop ends after this rank's exchange (a failure at the commit
        # comes after every member exchanged).
        assert gathered is not None

        def rank_reports(op: int, index: int) -> tuple[RankReport, ...]:
            start = offsets[op] + index * width
            return tuple(
                RankReport(
                    CandidateStatus(int(row[start])),
                    tuple(row[start + 1 : start + width]),
                )
                for row in gathered
            )

        return [
            [
                failed.get((op, index))
                or CandidateResult(
                    candidate.name, rank_reports(op, index), attempts[(op, index)]
                )
                for index, candidate in enumerate(candidates)
            ]
            for op, (_, candidates) in enumerate(plans)
        ]

    def _schedule(
        self,
        plans: Sequence[tuple[OpToTune, list[Candidate]]],
        competing: list[list[bool]],
        resume: _Resume,
    ) -> list[_Step]:
        # Per op: each competing candidate's warmup in preference order, then
        # nruns iterations in each of which every competing candidate runs
        # once, in an order that every member draws alike from the op's key.
        steps: list[_Step] = []
        for op in range(resume.op, len(plans)):
            active = [index for index, on in enumerate(competing[op]) if on]
            warmup_from = resume.warmup_from if op == resume.op else 0
            if warmup_from is not None:
                steps += [
                    _Step(op, index, timed=False)
                    for index in active
                    if index >= warmup_from
                ]
            for run in range(self.config.nruns):
                order = interleaved_order(len(active), f"{plans[op][0].key}|{run}")
                steps += [
                    _Step(op, active[position], timed=True, run=run)
                    for position in order
                ]
        return steps

    def _run_op(
        self,
        plans: Sequence[tuple[OpToTune, list[Candidate]]],
        schedule: list[_Step],
        start: int,
        local: _LocalOutcomes,
    ) -> int:
        # Runs the steps of one op from schedule[start]; returns where the next op starts.
        op = schedule[start].op
        end = next(
            (i for i in range(start, len(schedule)) if schedule[i].op != op),
            len(schedule),
        )
        op_to_tune, candidates = plans[op]
        timed = [i for i in range(start, end) if schedule[i].timed]
        try:
            channel = self._channel()
        except _StepFailed as error:
            raise _StepFailed(error.status, error.stage, step=start) from error
        with registered_as(self.group_name, channel):
            for i in range(start, timed[0] if timed else end):
                self._warm_up(
                    i, schedule[i], op_to_tune, candidates[schedule[i].candidate], local
                )
            if timed:
                calls = [candidates[schedule[i].candidate].fn for i in timed]
                try:
                    with _timed("timed_s"):
                        times = _time_calls(
                            calls, self.device, self.config.timeout.total_seconds()
                        )
                except _CallFailed as failure:
                    raise _StepFailed(
                        _classify(failure.error),
                        "timed runs",
                        failure.error,
                        step=timed[failure.index],
                    ) from failure.error
                local.record_runs(op, [schedule[i].candidate for i in timed], times)
        return end

    def _warm_up(
        self,
        index: int,
        step: _Step,
        op: OpToTune,
        candidate: Candidate,
        local: _LocalOutcomes,
    ) -> None:
        if (id(op), candidate.name) in self._prepare_errors:
            raise _StepFailed(CandidateStatus.RAISED, "prepare", step=index)
        counters["collective_autotuning"]["rounds"] += 1
        status = CandidateStatus.OK
        try:
            with _timed("warmup_s"):
                for run in range(max(1, self.config.nwarmup)):
                    value = candidate.fn()
                    if run == 0:
                        output = first_tensor(value)
                        _wait_device(self.device, self._step_deadline())
                        if candidate.is_default and output is not None:
                            local.references[step.op] = output.clone()
                        elif self.config.screen and not outputs_match(
                            output, local.references.get(step.op)
                        ):
                            # Still timed on this rank, so that its collectives
                            # stay matched; disqualified at the exchange.
                            status = CandidateStatus.WRONG_RESULT
                _wait_device(self.device, self._step_deadline())
        except Exception as error:
            raise _StepFailed(_classify(error), "warmup", error, step=index) from error
        local.statuses[(step.op, step.candidate)] = status

    def _exchange(
        self, plans: Sequence[tuple[OpToTune, list[Candidate]]], local: _LocalOutcomes
    ) -> list[list[float]]:
        # Every candidate's status and timed runs on every member, in one collective.
        flat = [
            value
            for op, (_, candidates) in enumerate(plans)
            for index in range(len(candidates))
            for value in local.flatten(op, index, self.config.nruns)
        ]
        channel = self._channel()
        try:
            with _timed("sync_s"):
                gathered = self._all_gather(channel, flat)
        except Exception as error:
            raise _StepFailed(_classify(error), "exchange", error) from error
        counters["collective_autotuning"]["exchanges"] += 1
        return gathered

    def _commit(self) -> None:
        channel = self._channel()
        try:
            with _timed("sync_s"):
                self._all_reduce_max(channel, 0.0)
        except Exception as error:
            raise _StepFailed(_classify(error), "commit", error) from error

    # Channel operations --------------------------------------------------------
    def _channel(self) -> dist.ProcessGroup:
        if (
            self._state.channel is not None
            and self._state.channel_timeout != self.config.timeout
        ):
            self._drop_channel()  # every member sees the same config (it is part of the join key)
        if self._state.channel is None:
            self._state.channels += 1
            self._state.channel_timeout = self.config.timeout
            prefix = f"{STORE_PREFIX}/{self.group_name}/channel{self._state.channels}/"
            try:
                self._state.channel = build_channel(
                    self.group, prefix, self.config.timeout
                )
            except Exception as error:
                raise _StepFailed(_classify(error), "channel setup", error) from error
        return self._state.channel

    def _drop_channel(self) -> None:
        # Dropping the last reference closes a gloo channel's sockets, which
        # fails the peers' pending collectives at once; NCCL needs an abort.
        channel, self._state.channel = self._state.channel, None
        if channel is not None and dist.get_backend(self.group) == "nccl":
            channel.abort()

    def _reduction_tensor(self, values: list[float]) -> torch.Tensor:
        device = (
            torch.device("cpu")
            if dist.get_backend(self.group) == "gloo"
            else self.device
        )
        return torch.tensor(values, dtype=torch.float64, device=device)

    def _step_deadline(self) -> float:
        return time.monotonic() + self.config.timeout.total_seconds()

    def _wait(self, work: dist.Work) -> None:
        if work.wait(self.config.timeout) is False:
            raise CollectiveBenchmarkTimeout(
                "a benchmark collective did not complete in time"
            )

    def _all_reduce_max(self, channel: dist.ProcessGroup, value: float) -> float:
        counters["collective_autotuning"]["sync_collectives"] += 1
        tensor = self._reduction_tensor([value])
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp.MAX
        self._wait(channel.allreduce([tensor], options))
        return float(tensor.item())

    def _all_gather(
        self, channel: dist.ProcessGroup, values: list[float]
    ) -> list[list[float]]:
        counters["collective_autotuning"]["sync_collectives"] += 1
        tensor = self._reduction_tensor(values)
        gathered = [torch.empty_like(tensor) for _ in range(self.size)]
        self._wait(channel.allgather([gathered], [tensor]))
        return [row.tolist() for row in gathered]

    # Decision and logging ------------------------------------------------------
    def _decide(
        self, results: list[CandidateResult], has_default: bool
    ) -> CollectiveDecision:
        index, reason = decide(
            results, has_default, self.config.tie_tolerance, self.config.confidence
        )
        winner = None if index is None else results[index].name
        return CollectiveDecision(self.group_name, tuple(results), winner, reason)

    def _log(self, decision: CollectiveDecision, key: str) -> None:
        if not decision_log.isEnabledFor(logging.DEBUG):
            return
        lines = [
            f"collective autotuning of {key} over group {decision.group_name!r} ({self.size} ranks, "
            f"{self.config.nruns} timed runs, timeout {self.config.timeout.total_seconds():g}s), "
            f"on rank {self.rank}: winner {decision.winner} ({decision.reason})"
        ]
        for result in decision.results:
            per_rank = "  ".join(
                f"r{rank}:{report.status.name.lower()}"
                + ("" if math.isnan(report.median_ms) else f" {report.median_ms:.4f}ms")
                for rank, report in enumerate(result.reports)
            )
            verdict = (
                f"{result.time_ms:.4f} ms"
                if result.status is CandidateStatus.OK
                else f"disqualified ({result.status.name.lower()} in {result.stage})"
            )
            lines.append(
                f"  {result.name:<40} {verdict:<40} attempts={result.attempts}  {per_rank}"
            )
        decision_log.debug("\n".join(lines))


# Agreed decisions of this process: memo key (see CollectiveBenchmarker._memo_key) -> decision.
_remembered: dict[tuple[str, ...], CollectiveDecision] = {}

# Decisions a group agreed on in a cached program's replay that this rank must
# compile anew: (group name, op key) -> decision; taken by the compile's run_batch.
_pre_agreed: dict[tuple[str, str], CollectiveDecision] = {}

# Bumped when what a stored decision means changes.
_STORED_DECISION_FORMAT = 1


def _decision_file(key: tuple[str, ...]) -> Path | None:
    # Decisions are autotuning results: stored with them, under the same switch.
    from torch._inductor import config
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    if not config.autotune_local_cache:
        return None
    name = hashlib.sha256(
        repr((key, torch.__version__, _STORED_DECISION_FORMAT)).encode()
    ).hexdigest()[:40]
    return Path(cache_dir()) / "collective_decisions" / f"{name}.json"


def _stored_decision(key: tuple[str, ...]) -> CollectiveDecision | None:
    path = _decision_file(key)
    if path is None or not path.is_file():
        return None
    try:
        return decision_from_json(path.read_text())
    except (OSError, ValueError, KeyError, TypeError):
        log.warning(
            "collective autotuning: ignoring an unreadable stored decision %s",
            path,
            exc_info=True,
        )
        return None


def _store_decision(key: tuple[str, ...], decision: CollectiveDecision) -> None:
    path = _decision_file(key)
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    partial.write_text(decision_to_json(decision))
    os.replace(partial, path)  # ranks of one node write the same file: whole files only


@dataclasses.dataclass(frozen=True)
class RecordedSession:
    """A session that a compile took part in, kept with the compiled program.

    A program taken from a cache is only used after its ranks have taken part
    again in the agreements that compiling it took part in
    (:func:`replay_sessions`), so that a rank that compiles meets every rank
    that does not.
    """

    group_name: str
    device_type: str
    # Per op: its key, its candidates (name, is the default), its memo key.
    ops: tuple[tuple[str, tuple[tuple[str, bool], ...], str | None], ...]
    decisions: tuple[CollectiveDecision, ...]


_recording: contextvars.ContextVar[list[RecordedSession] | None] = (
    contextvars.ContextVar("collective_sessions_recording", default=None)
)


@contextmanager
def recorded_sessions() -> Iterator[list[RecordedSession]]:
    """Collect the sessions that this thread takes part in for the duration (one compile)."""
    sessions: list[RecordedSession] = []
    token = _recording.set(sessions)
    try:
        yield sessions
    finally:
        _recording.reset(token)


def _record(
    benchmarker: CollectiveBenchmarker,
    ops: Sequence[OpToTune],
    decisions: Sequence[CollectiveDecision],
) -> None:
    sessions = _recording.get()
    if sessions is not None:
        described = tuple(
            (op.key, tuple((c.name, c.is_default) for c in op.candidates), op.memo_key)
            for op in ops
        )
        sessions.append(
            RecordedSession(
                benchmarker.group_name,
                benchmarker.device.type,
                described,
                tuple(decisions),
            )
        )


def _never_run() -> Any:
    raise AssertionError("a replayed session does not run candidates")


def replay_sessions(sessions: Sequence[RecordedSession]) -> bool:
    """Take part, with a cached program's decisions, in the agreements its compile took part in.

    Every rank of each recorded session's group must reach the same session:
    the ranks that compile the program again reach it while compiling, the
    ranks that take it from a cache reach it here.  Returns True when every
    group agreed on the program's decisions (the cached program can run);
    False when a group agreed on other decisions (remembered by a lower rank):
    this rank must then compile the program again, and that compile adopts
    the agreed decisions without meeting its group again.  Raises
    :class:`CollectiveBenchmarkError` as a session does.
    """
    config = CollectiveBenchmarkConfig.from_inductor_config()
    agreed: list[tuple[str, list[OpToTune], list[CollectiveDecision]]] = []
    consistent = True
    for session in sessions:
        ops = [
            OpToTune(
                key,
                [
                    Candidate(name, _never_run, is_default)
                    for name, is_default in candidates
                ],
                memo_key,
            )
            for key, candidates, memo_key in session.ops
        ]
        benchmarker = CollectiveBenchmarker(
            session.group_name, config, torch.device(session.device_type)
        )
        decisions = benchmarker.run_batch(ops, known=session.decisions)
        consistent = consistent and all(
            _decision_digest(mine) == _decision_digest(group)
            for mine, group in zip(session.decisions, decisions, strict=True)
        )
        agreed.append((session.group_name, ops, decisions))
    if not consistent:
        for group_name, ops, decisions in agreed:
            for op, decision in zip(ops, decisions, strict=True):
                _pre_agreed[(group_name, op.key)] = decision
    counters["collective_autotuning"]["replayed_sessions"] += len(sessions)
    return consistent


def _decision_digest(decision: CollectiveDecision) -> str:
    # Members that took part in the same session hold equal decisions: the
    # agreed times are the same floats everywhere.  By position, not name:
    # candidate names carry per-compile counters.
    names = [result.name for result in decision.results]
    winner = names.index(decision.winner) if decision.winner is not None else None
    return _digest(
        repr(
            (
                winner,
                [(result.status.name, result.time_ms) for result in decision.results],
            )
        )
    )


def _adopt(remembered: CollectiveDecision, op: OpToTune) -> CollectiveDecision:
    # The remembered results, in preference order (the default first), under
    # this op's candidate names: the same candidates, named by another compile.
    names = [
        candidate.name
        for candidate in sorted(
            op.candidates, key=lambda candidate: not candidate.is_default
        )
    ]
    renamed = {
        result.name: name
        for result, name in zip(remembered.results, names, strict=True)
    }
    return CollectiveDecision(
        remembered.group_name,
        tuple(
            dataclasses.replace(result, name=renamed[result.name])
            for result in remembered.results
        ),
        None if remembered.winner is None else renamed[remembered.winner],
        f"{remembered.reason}; remembered from an earlier session, adopted by every rank",
    )


# --- conveniences ---------------------------------------------------------------
def sync_with_timeout(group: dist.ProcessGroup | None, timeout: timedelta) -> None:
    """Barrier over ``group`` bounded by ``timeout``.

    Every rank of ``group`` must call it.  Returns once all ranks arrived;
    raises :class:`CollectiveBenchmarkTimeout` when they did not within
    ``timeout`` (after which a gloo group cannot be used again; see the
    module docstring).
    """
    work = dist.barrier(group=group, async_op=True)
    try:
        completed = work.wait(timeout)
    except RuntimeError as error:  # gloo reports a timed-out wait by raising
        raise CollectiveBenchmarkTimeout(
            f"barrier did not complete within {timeout}: {error}"
        ) from error
    if completed is False:
        raise CollectiveBenchmarkTimeout(f"barrier did not complete within {timeout}")


def try_collective_benchmark_with_timeout(
    fn: Callable[[], Any],
    *,
    group: dist.ProcessGroup | str | None = None,
    config: CollectiveBenchmarkConfig | None = None,
    device: torch.device = torch.device("cpu"),
    name: str = "candidate",
) -> float:
    """Benchmark one collective callable in lock-step; the agreed time in ms.

    Every member of ``group`` must call it with equal arguments.  Returns the
    slowest rank's median run time, the same float on every member, or inf on
    every member when ``fn`` raised or timed out on any of them.  Raises
    :class:`CollectiveBenchmarkError` when a member is lost.
    """
    benchmarker = CollectiveBenchmarker(
        group, config or CollectiveBenchmarkConfig(), device
    )
    decision = benchmarker.run([Candidate(name, fn)], key=name)
    return decision.time_ms(name)


# --- Inductor choices ---------------------------------------------------------
def collective_group_name(choices: Sequence[Any]) -> str | None:
    """The process group the collectives of ``choices`` run on, read from their graphs.

    ``None`` when no graph names a group.  Raises :class:`CollectiveBenchmarkError`
    (on every rank alike: the graphs are the same everywhere) when candidates
    use different groups, since one benchmark cannot hold them in lock-step.
    """
    names: dict[str, str] = {}
    for choice in choices:
        gm = getattr(choice, "gm", None)
        if gm is None:
            continue
        for node in gm.graph.nodes:
            if (
                node.op != "call_function"
                or getattr(node.target, "namespace", None) != "_c10d_functional"
            ):
                continue
            schema = node.target._schema
            # node.args omits trailing defaulted arguments: pairs up to its end.
            for argument, value in zip(schema.arguments, node.args, strict=False):
                if argument.name == "group_name":
                    names.setdefault(str(value), getattr(choice, "name", "?"))
            if "group_name" in node.kwargs:
                names.setdefault(
                    str(node.kwargs["group_name"]), getattr(choice, "name", "?")
                )
    if len(names) > 1:
        raise CollectiveBenchmarkError(
            "collective autotuning: the candidates of one op must use one process group, "
            f"found {sorted(names)} (first seen in {sorted(names.values())})"
        )
    return next(iter(names), None)


def collective_candidates(
    choices: Sequence[Any],
    autotune_args: Any,
    *,
    uses_layout_preserving_inputs: Callable[[Any], bool],
) -> tuple[list[Candidate], str]:
    """The :class:`Candidate` of each Inductor ``ChoiceCaller``, and a key of their inputs.

    Candidates are named by :func:`candidate_names`, in ``choices`` order.
    Local work only: no rank waits for another.
    """
    candidates: list[Candidate] = []
    for choice, (name, is_default) in zip(
        choices, candidate_names(choices), strict=True
    ):
        inputs, output = autotune_args.get_benchmark_tensors(
            uses_layout_preserving_inputs(choice)
        ).unpack()
        output.zero_()
        candidates.append(
            Candidate(
                name,
                _choice_runner(choice, inputs, output),
                is_default=is_default,
                # Subgraph choices compile lazily on their first run.
                prepare=getattr(choice, "_ensure_compiled", None),
            )
        )
    # choices always holds the op's default: the last choice's inputs exist.
    shapes = [
        (tuple(t.shape), t.dtype)
        for t in inputs  # type: ignore[possibly-undefined]
        if isinstance(t, torch.Tensor)
    ]
    return candidates, f"{shapes}"


def candidate_names(choices: Sequence[Any]) -> list[tuple[str, bool]]:
    """``(name, is_default)`` of each choice's :class:`Candidate`, without building it.

    Names are ``"{index}:{choice name}"``; the first choice without a graph
    (the op's eager implementation) is the default.
    """
    names: list[tuple[str, bool]] = []
    for index, choice in enumerate(choices):
        is_default = is_default_choice(choice) and not any(
            default for _, default in names
        )
        names.append(
            (f"{index}:{getattr(choice, 'name', type(choice).__name__)}", is_default)
        )
    return names


def benchmark_collective_choices(
    choices: Sequence[Any],
    autotune_args: Any,
    *,
    uses_layout_preserving_inputs: Callable[[Any], bool],
    config: CollectiveBenchmarkConfig | None = None,
) -> dict[Any, float]:
    """Benchmark Inductor ``ChoiceCaller``s that contain collectives; agreed ms per choice.

    Every rank of the choices' group must call it with the same choices in the
    same order.  Returns a dict in ``choices`` order, identical on every rank,
    with inf for a disqualified choice; use :func:`select_winner` on it.
    Raises :class:`CollectiveBenchmarkError` when a member is lost or the
    members are not tuning the same op.
    """
    config = config or CollectiveBenchmarkConfig.from_inductor_config()
    group_name = collective_group_name(choices)
    candidates, key = collective_candidates(
        choices,
        autotune_args,
        uses_layout_preserving_inputs=uses_layout_preserving_inputs,
    )
    inputs, output = autotune_args.get_benchmark_tensors(
        uses_layout_preserving_inputs(choices[0])
    ).unpack()
    benchmarker = CollectiveBenchmarker(
        group_name, config, device_of([*inputs, output])
    )
    # Each candidate timed alone: what V2 measures for an op without an epilogue.
    decision = benchmarker.run(
        candidates, key=key, memo_key=f"{choices_identity(choices)}|alone"
    )
    return {
        choice: decision.time_ms(candidate.name)
        for choice, candidate in zip(choices, candidates, strict=True)
    }


def choices_identity(choices: Sequence[Any]) -> str:
    """A digest of what an op's choices compute, and on which input layouts.

    Two call sites of an op with the same identity measure the same thing,
    so they can share a decision.  Made of each choice's ``hash_key`` (its
    graph, or its kernel and arguments), its input layouts and its config
    patches, in order; equal on every rank for the same program.
    """
    parts = []
    for choice in choices:
        try:
            code = choice.hash_key()
        except (AttributeError, NotImplementedError):
            code = getattr(choice, "name", type(choice).__name__)
        layouts = [
            (str(node.get_size()), str(node.get_stride()), str(node.get_dtype()))
            for node in getattr(choice, "input_nodes", ())
        ]
        patches = sorted(getattr(choice, "config_patches", {}).items())
        parts.append(f"{code}|{layouts}|{patches!r}")
    return _digest("\n".join(parts))


def _choice_runner(
    choice: Any, inputs: Sequence[Any], output: torch.Tensor
) -> Callable[[], Any]:
    def run() -> Any:
        result = choice.benchmark_collective(*inputs, out=output)
        return output if result is None else result

    return run
