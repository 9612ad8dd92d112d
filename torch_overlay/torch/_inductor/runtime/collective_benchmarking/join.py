"""The join of a collective autotuning session: the pre-sync.

The one step of a session whose outcome is not a timing: which ops are
benchmarked, which are adopted from a member's memory, which candidates are
disqualified before running, and whether the session may go on at all.  It
is one gather of fixed-size digests on the benchmark channel, which waits
for a late member up to ``max_wait``; more only when the digests differ.
What it agrees on: ``docs/modules.md``, "join.py".
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
from collections import Counter
from itertools import zip_longest
from typing import Any, TYPE_CHECKING

from torch._dynamo.utils import counters

from . import decision_cache
from .channels import JOIN
from .groups import warn_from_group_rank0
from .decisions import (
    CandidateResult,
    CandidateStatus,
    CollectiveDecision,
    decision_from_json,
    decision_to_json,
    RankReport,
)
from .timing import timed
from .types import CollectiveBenchmarkError, digest


if TYPE_CHECKING:
    from collections.abc import Sequence

    from .channels import BenchmarkChannel
    from .types import Candidate, Member, OpToTune


__all__ = ["Joined", "join", "op_identity"]

log = logging.getLogger(__name__)


# Inductor numbers the subgraph choices it creates over the whole process
# (SubgraphTemplate.index_counter): "..._direct_7".  The number depends on what
# the process compiled before, so it differs between ranks.
_COMPILE_COUNTER = re.compile(r"_\d+$")


def _digest_int(text: str) -> int:
    # A digest that travels in an int64 tensor: 60 bits of it.
    return int(digest(text)[:15], 16)


@dataclasses.dataclass
class Joined:
    """What the members agreed on at the join."""

    to_run: list[int]  # the ops that are benchmarked
    # (op position among to_run, candidate index in preference order) ->
    # result of a candidate disqualified at the join
    excluded: dict[tuple[int, int], CandidateResult] = dataclasses.field(
        default_factory=dict
    )
    # Every other op's remembered decision, adopted.
    adopted: dict[int, CollectiveDecision] = dataclasses.field(default_factory=dict)
    # Whether every member's ops have the same memo keys, which hold the
    # candidates' traced code: whether a program that inlines the winners is
    # the same on every member.
    same_code: bool = False


def op_identity(member: Member, op: OpToTune) -> str:
    """What every member's op must share for one decision to serve them all.

    The candidates (by name, without the per-process counter that Inductor
    appends to a choice's name) and their roles, the group and the settings.
    """
    # Not the memo key: a candidate's traced graph may hold rank-dependent
    # constants (which slot is this rank's), so the memo key, and the
    # decisions a rank remembers by it, are the rank's own.
    candidates = [
        (_COMPILE_COUNTER.sub("", candidate.name), candidate.is_default)
        for candidate in op.candidates
    ]
    return f"{member.decision_context()}|{candidates}"


def join(
    member: Member,
    channel: BenchmarkChannel,
    ops: Sequence[OpToTune],
    ordered: Sequence[Sequence[Candidate]],
    remembered: Sequence[CollectiveDecision | None],
) -> Joined:
    """The pre-sync of a session over ``ops``: what the members agreed on.

    Every member of the group calls it at the start of a session, with its
    ops and their candidates in preference order (``ordered``); a member
    that comes late is waited for up to ``max_wait``.  Returns the ops to
    benchmark and the candidates disqualified at the join.  Raises
    :class:`~torch._inductor.runtime.collective_benchmarking.types.CollectiveBenchmarkError`
    on every member when the members' ops or settings differ, and, naming
    them, when some members do not come within ``max_wait``.

    ``remembered`` holds the decision this member remembers per op (or
    ``None``): an op that any member remembers is adopted by every member
    (``Joined.adopted``) instead of benchmarked; ``Joined.same_code`` says
    whether the candidates' traced code is the same on every member.
    """
    op_digests = [digest(f"{op.key}|{op_identity(member, op)}") for op in ops]
    signatures = [[c.signature for c in candidates] for candidates in ordered]
    row = [_digest_int(f"{op_digests}|{member.config}|{signatures}")]
    held = [
        0 if decision is None else _digest_int(decision_cache.decision_digest(decision))
        for decision in remembered
    ]
    row += [_digest_int(repr([op.memo_key for op in ops])), _digest_int(repr(held))]
    max_wait = member.config.max_wait
    candidates = sum(len(candidates) for candidates in ordered)
    with timed("join", "presync", group=member.group_name, candidates=candidates):
        rows = channel.everyone(
            JOIN, lambda: channel.gather_ints(row, max_wait), max_wait
        )
    counters["collective_autotuning"]["presync"] += 1
    excluded: dict[tuple[int, int], CandidateResult] = {}
    if len({digests[0] for digests in rows}) > 1:
        excluded = _reconcile(member, channel, ops, ordered, op_digests, signatures)
    # Held alike (or by nobody) on every member: each adopts its own.
    adopted = (
        {i: decision for i, decision in enumerate(remembered) if decision is not None}
        if len({digests[2] for digests in rows}) == 1
        else _adopt(member, channel, remembered, held)
    )
    to_run = [i for i in range(len(ops)) if i not in adopted]
    same_code = len({digests[1] for digests in rows}) == 1
    joined = Joined(to_run, adopted=adopted, same_code=same_code)
    for position, i in enumerate(joined.to_run):
        for index in range(len(ordered[i])):
            if (i, index) in excluded:
                joined.excluded[(position, index)] = excluded[(i, index)]
    return joined


def _adopt(
    member: Member,
    channel: BenchmarkChannel,
    remembered: Sequence[CollectiveDecision | None],
    held: list[int],
) -> dict[int, CollectiveDecision]:
    # The members remember different decisions: per op, the lowest-ranked
    # member that holds one gives it to the members that hold another or
    # none.  Each such member broadcasts the decisions it gives: a gather
    # would bring every member's payload to every member.  The members hold
    # the same ops here (the join checked it).
    timeout = member.config.timeout
    rows = channel.everyone(JOIN, lambda: channel.gather_ints(held, timeout), timeout)
    # Per op that any member holds: the lowest-ranked member that holds it.
    holders = {
        i: next(rank for rank, row in enumerate(rows) if row[i])
        for i in range(len(held))
        if any(row[i] for row in rows)
    }
    # Where this member holds the holder's decision, its own object: reports
    # tell it from a peer's.
    adopted = {
        i: decision
        for i, holder in holders.items()
        if (decision := remembered[i]) is not None and held[i] == rows[holder][i]
    }
    needed = [i for i in holders if len({row[i] for row in rows}) > 1]
    for holder in sorted({holders[i] for i in needed}):
        gives = [i for i in needed if holders[i] == holder]
        # What the holder gives is its own, adopted above; the others send nothing.
        mine = [decision_to_json(adopted[i]) for i in gives if holder == member.rank]
        sent = functools.partial(channel.broadcast_object, mine, holder, timeout)
        for i, given in zip(gives, channel.everyone(JOIN, sent, timeout), strict=True):
            if i not in adopted:
                adopted[i] = decision_from_json(given)
    return adopted


def _reconcile(
    member: Member,
    channel: BenchmarkChannel,
    ops: Sequence[OpToTune],
    ordered: Sequence[Sequence[Candidate]],
    op_digests: list[str],
    signatures: list[list[str]],
) -> dict[tuple[int, int], CandidateResult]:
    # The members' digests differ: every member gathers everyone's details.
    # Different ops or settings are an error on every member; a candidate
    # whose collectives differ between members is disqualified everywhere
    # (keyed by op and candidate index in preference order), and the rest
    # compete.
    detail = [op_digests, str(member.config), signatures]
    timeout = member.config.timeout
    details = channel.everyone(
        JOIN, lambda: channel.gather_objects(detail, timeout), timeout
    )
    if any(other[:2] != details[member.rank][:2] for other in details):
        _raise_different_ops(member, details, ops)
    excluded = {}
    for i, candidates in enumerate(ordered):
        for index, candidate in enumerate(candidates):
            seen = [rank_detail[2][i][index] for rank_detail in details]
            usual = Counter(seen).most_common(1)[0][0]
            differ = [rank for rank, signature in enumerate(seen) if signature != usual]
            if not differ:
                continue
            statuses = [CandidateStatus.OK] * len(seen)
            for rank in differ:
                statuses[rank] = CandidateStatus.DESYNCHRONIZED
            excluded[(i, index)] = CandidateResult(
                candidate.name,
                tuple(map(RankReport, statuses)),
                stage="join: its collectives differ between ranks",
            )
            warn_from_group_rank0(
                log,
                member.rank,
                "collective autotuning: %s issues different collectives on "
                "ranks %s of group %r; disqualified on every rank",
                candidate.name,
                differ,
                member.group_name,
            )
    return excluded


def _raise_different_ops(
    member: Member, details: list[list[Any]], ops: Sequence[OpToTune]
) -> None:
    lists = [rank_detail[0] for rank_detail in details]
    # The first op index at which two members differ (one may have no op there).
    columns = enumerate(zip_longest(*lists))
    position = next((i for i, column in columns if len(set(column)) > 1), None)
    if position is None:
        where = "every member holds the same ops; the benchmark settings differ"
    elif position < len(ops):
        where = (
            f"they first differ at op {position}; on this rank it is "
            f"{ops[position].key!r}"
        )
    else:
        where = f"they first differ at op {position}, which this rank does not have"
    raise CollectiveBenchmarkError(
        f"collective autotuning: the ranks of group {member.group_name!r} are not "
        f"tuning the same ops (op counts by rank: {[len(ranks) for ranks in lists]}"
        f"; {where}; candidates on this rank: "
        f"{[[c.name for c in op.candidates] for op in ops]})"
    )
