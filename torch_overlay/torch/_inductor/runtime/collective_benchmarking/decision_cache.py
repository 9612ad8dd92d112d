"""Agreed decisions remembered, and the sessions each compiled program took part in.

A decision is remembered, in the process and in the session's
``decision_dir``, under its op's ``memo_key``, the group and the settings;
an op that any member remembers is adopted by every member at the join.
Why adopt rather than re-tune: ``docs/modules.md``, "decision_cache.py".
"""

from __future__ import annotations

import collections
import contextvars
import dataclasses
import hashlib
import logging
import os
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch._inductor.utils import clear_on_fresh_cache

from .decisions import (
    CollectiveDecision,
    decision_from_json,
    decision_to_json,
    worth_storing,
)
from .groups import process_group_topology
from .types import digest


if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from .types import Member, OpToTune


__all__ = [
    "RecordedSession",
    "adopt",
    "decision_digest",
    "recall",
    "record",
    "pre_agree",
    "recorded_sessions",
    "remember",
    "take_pre_agreed",
]

log = logging.getLogger(__name__)


class _Remembered(dict[tuple[str, ...], CollectiveDecision]):
    """Agreed decisions of this process: memo key (see _memo_key) -> decision.

    ``fresh_cache()`` forgets them together with the cache directory it
    replaces (``clear_on_fresh_cache``), or a "fresh" compile would adopt
    them.  Forgetting is safe on some ranks only: the join adopts a decision
    that any member remembers.
    """

    def cache_clear(self) -> None:
        self.clear()


_remembered: _Remembered = clear_on_fresh_cache(_Remembered())

# Decisions a group agreed on in a cached program's replay that this rank must
# compile anew: (group name, op key) -> decision; taken by the compile's
# run_batch.  A replay whose compile never comes leaves its decisions here:
# past _PRE_AGREED_LIMIT, the oldest go.
_pre_agreed: collections.OrderedDict[tuple[str, str], CollectiveDecision] = (
    collections.OrderedDict()
)
_PRE_AGREED_LIMIT = 1024

# Bumped when what a stored decision means changes.
_STORED_DECISION_FORMAT = 3


def _memo_key(member: Member, op: OpToTune) -> tuple[str, ...] | None:
    if op.memo_key is None:
        return None
    # Names carry per-compile counters; the candidates' order and roles do not.
    return (
        *member.decision_context(),
        f"{op.memo_key}|{[c.is_default for c in op.candidates]}",
    )


def _decision_file(member: Member, key: tuple[str, ...]) -> Path | None:
    directory = member.config.decision_dir
    if directory is None:
        return None
    name = hashlib.sha256(
        repr((key, torch.__version__, _STORED_DECISION_FORMAT)).encode()
    ).hexdigest()[:40]
    return Path(directory) / f"{name}.json"


def recall(member: Member, op: OpToTune) -> CollectiveDecision | None:
    """The decision this rank remembers for ``op`` (in memory, then on disk), if any."""
    key = _memo_key(member, op)
    if key is None:
        return None
    path = _decision_file(member, key)
    if key not in _remembered and path is not None and path.is_file():
        try:
            stored = decision_from_json(path.read_text())
            if len(stored.results) != len(op.candidates):
                raise ValueError("not a decision among this op's candidates")
            _remembered[key] = stored
        except (OSError, ValueError, KeyError, TypeError):
            log.warning(
                "collective autotuning: ignoring an unreadable stored decision %s",
                path,
                exc_info=True,
            )
    return _remembered.get(key)


def remember(member: Member, op: OpToTune, decision: CollectiveDecision) -> None:
    """Remember the group's ``decision`` for ``op`` in the process, and on disk
    when it is :func:`worth_storing`."""
    key = _memo_key(member, op)
    if key is None or _remembered.get(key) == decision:
        return
    _remembered[key] = decision
    path = _decision_file(member, key)
    if path is not None and worth_storing(decision):
        path.parent.mkdir(parents=True, exist_ok=True)
        # Whole files only: the ranks of a node, and of every node whose
        # cache directory is on shared storage, write the same file.  Not
        # codecache.write_atomic: its temporary name (process and thread id)
        # is unique on one host only, and two hosts can share it.
        partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        partial.write_text(decision_to_json(decision))
        os.replace(partial, path)


def pre_agree(group_name: str, op_key: str, decision: CollectiveDecision) -> None:
    """Hand ``decision``, agreed by ``group_name`` for ``op_key`` in a replay, to
    the compile that replaces the replayed program (:func:`take_pre_agreed`)."""
    _pre_agreed[(group_name, op_key)] = decision
    while len(_pre_agreed) > _PRE_AGREED_LIMIT:
        _pre_agreed.popitem(last=False)


def take_pre_agreed(
    group_name: str, ops: Sequence[OpToTune]
) -> list[CollectiveDecision] | None:
    """The decisions a replay agreed on for all of ``ops``, if it agreed on all of them."""
    agreed = [_pre_agreed.pop((group_name, op.key), None) for op in ops]
    found = [decision for decision in agreed if decision is not None]
    if not ops or len(found) != len(ops):
        return None
    return [adopt(decision, op) for decision, op in zip(found, ops, strict=True)]


def decision_digest(decision: CollectiveDecision) -> str:
    """Equal for the decisions that the members of one session hold.

    The agreed times are the same floats everywhere.  By position, not name:
    candidate names carry per-compile counters.
    """
    names = [result.name for result in decision.results]
    winner = names.index(decision.winner) if decision.winner is not None else None
    outcomes = [(result.status.name, result.time_ms) for result in decision.results]
    return digest(repr((winner, outcomes)))


def adopt(remembered: CollectiveDecision, op: OpToTune) -> CollectiveDecision:
    """``remembered`` under the names of ``op``'s candidates (the same candidates,
    named by another compile), in preference order (the default first)."""
    ordered = sorted(op.candidates, key=lambda candidate: not candidate.is_default)
    renamed = {
        result.name: candidate.name
        for result, candidate in zip(remembered.results, ordered, strict=True)
    }
    results = [dataclasses.replace(r, name=renamed[r.name]) for r in remembered.results]
    return dataclasses.replace(
        remembered,
        results=tuple(results),
        winner=None if remembered.winner is None else renamed[remembered.winner],
        reason=f"{remembered.reason}; remembered from an earlier session, adopted by every rank",
    )


# --- cache hits ----------------------------------------------------------------------
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
    # Per op: its key, its candidates (name, is the default, collective
    # signature), its memo key.
    ops: tuple[tuple[str, tuple[tuple[str, bool, str], ...], str | None], ...]
    decisions: tuple[CollectiveDecision, ...]
    # The group's (name, size, global ranks) when the program was compiled.
    topology: tuple[str, int, str]
    # The global rank the program was compiled on when a winner it inlines
    # has code that differs between ranks; None when it serves every rank.
    rank: int | None


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


def record(
    member: Member,
    ops: Sequence[OpToTune],
    decisions: Sequence[CollectiveDecision],
    same_code: bool,
) -> None:
    """Keep a session with the program being compiled, when a compile records sessions.

    ``same_code``: whether the join found the candidates' traced code the
    same on every member; when it did not and an op's winner is not its
    default (the op itself, the same code everywhere), the program serves
    this rank only.
    """
    sessions = _recording.get()
    if sessions is None:
        return
    described = tuple(
        (
            op.key,
            tuple((c.name, c.is_default, c.signature) for c in op.candidates),
            op.memo_key,
        )
        for op in ops
    )
    # A winner other than its op's default inlines the candidates' traced code.
    rank_dependent = not same_code and any(
        decision.winner not in (None, *(c.name for c in op.candidates if c.is_default))
        for op, decision in zip(ops, decisions, strict=True)
    )
    sessions.append(
        RecordedSession(
            member.group_name,
            member.device.type,
            described,
            tuple(decisions),
            process_group_topology(member.group),
            dist.get_rank() if rank_dependent else None,
        )
    )
