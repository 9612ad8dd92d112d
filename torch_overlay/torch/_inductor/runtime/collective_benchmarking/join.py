"""The join of a collective autotuning session: the pre-sync.

The one step of a session whose outcome is not a timing: which ops are
benchmarked, which are adopted from a member's memory, which candidates are
disqualified before running, and whether the session may go on at all.  The
functions take the session's member (:class:`~.types.Member`), so a stand-in
runs the real join.  What it agrees on: ``docs/modules.md``, "join.py".
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections import Counter
from typing import Any, TYPE_CHECKING

from torch._dynamo.utils import counters

from . import decision_cache
from .decisions import (
    CandidateResult,
    CandidateStatus,
    CollectiveDecision,
    decision_from_json,
    decision_to_json,
    RankReport,
)
from .store import CollectiveBenchmarkError
from .timing import timed
from .types import digest


if TYPE_CHECKING:
    from collections.abc import Sequence

    from .control import ControlStore
    from .types import Candidate, Member, OpToTune


__all__ = ["Joined", "join", "op_identity"]

log = logging.getLogger(__name__)


# Inductor numbers the subgraph choices it creates over the whole process
# (SubgraphTemplate.index_counter): "..._direct_7".  The number depends on what
# the process compiled before, so it differs between ranks.
_COMPILE_COUNTER = re.compile(r"_\d+$")


@dataclasses.dataclass
class Joined:
    """What the members agreed on at the join."""

    to_run: list[int]  # the ops that nobody remembers: benchmarked
    adopted: dict[int, CollectiveDecision]  # every other op's remembered decision
    # (op position among to_run, candidate index in preference order) ->
    # result of a candidate disqualified at the join
    excluded: dict[tuple[int, int], CandidateResult]
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
    control: ControlStore,
    ops: Sequence[OpToTune],
    ordered: Sequence[Sequence[Candidate]],
    remembered: Sequence[CollectiveDecision | None],
) -> Joined:
    """The pre-sync of a session over ``ops``: what the members agreed on.

    Every member of the group calls it in the session of ``control``, with
    its ops, their candidates in preference order (``ordered``) and the
    decision it remembers per op (or ``None``).  Returns the ops to
    benchmark, the decisions adopted for the others, and the candidates
    disqualified at the join, and whether the candidates' traced code is
    the same on every member (``Joined.same_code``).  Raises
    :class:`~torch._inductor.runtime.collective_benchmarking.store.CollectiveBenchmarkError`
    on every member when the members' ops or settings differ.
    """
    op_digests = [digest(f"{op.key}|{op_identity(member, op)}") for op in ops]
    signatures = [[c.signature for c in candidates] for candidates in ordered]
    tuned = digest(f"{op_digests}|{member.config}|{signatures}")
    posted = _offer_remembered(member, control, remembered)
    code = digest(repr([op.memo_key for op in ops]))
    control.count(f"code/{code}")
    control.count(f"digest/{tuned}")
    with timed(
        "join",
        "presync",
        group=member.group_name,
        candidates=sum(len(candidates) for candidates in ordered),
    ):
        control.barrier("join", "the start of autotuning")
    counters["collective_autotuning"]["presync"] += 1
    excluded: dict[tuple[int, int], CandidateResult] = {}
    if control.count(f"digest/{tuned}", 0) != member.size:
        excluded = _reconcile(member, control, ops, ordered, op_digests, signatures)
    same_code = control.count(f"code/{code}", 0) == member.size
    joined = Joined([], {}, {}, same_code)
    for i in range(len(ops)):
        adopted = _adopt_claimed(member, control, i, remembered[i], i in posted)
        if adopted is None:
            joined.to_run.append(i)
        else:
            joined.adopted[i] = adopted
    for position, i in enumerate(joined.to_run):
        for index in range(len(ordered[i])):
            if (i, index) in excluded:
                joined.excluded[(position, index)] = excluded[(i, index)]
    return joined


def _offer_remembered(
    member: Member,
    control: ControlStore,
    remembered: Sequence[CollectiveDecision | None],
) -> list[int]:
    # Claims each op this member remembers a decision for; the lowest rank
    # holding one posts it for the others.  Returns the ops it posted.
    posted = []
    for i, decision in enumerate(remembered):
        if decision is None:
            continue
        held_by = control.claim(f"holder{i}", decision_cache.decision_digest(decision))
        if held_by.rank == member.rank:
            control.post(f"adopt{i}/{member.rank}", decision_to_json(decision))
            posted.append(i)
    return posted


def _adopt_claimed(
    member: Member,
    control: ControlStore,
    i: int,
    held: CollectiveDecision | None,
    posted: bool,
) -> CollectiveDecision | None:
    # The decision the group adopts for op i, or None when no member holds one.
    # Read after the join: a lower rank may have claimed after this one.
    claim = control.read_claim(f"holder{i}")
    if claim is None:
        return None
    holder, memo = claim
    if posted and holder != member.rank:
        # A lower rank claimed after this one: its post is not read.
        control.client.delete(f"{control.prefix}adopt{i}/{member.rank}")
    control.delete_on_leave(f"adopt{i}/{holder}")
    if held is not None and memo == decision_cache.decision_digest(held):
        return held
    return decision_from_json(control.fetch(f"adopt{i}/{holder}"))


def _reconcile(
    member: Member,
    control: ControlStore,
    ops: Sequence[OpToTune],
    ordered: Sequence[Sequence[Candidate]],
    op_digests: list[str],
    signatures: list[list[str]],
) -> dict[tuple[int, int], CandidateResult]:
    # The members' digests differ: every member posts its details and
    # reads everyone's.  Different ops or settings are an error on every
    # member; a candidate whose collectives differ between members is
    # disqualified everywhere (keyed by op and candidate index in
    # preference order), and the rest compete.
    detail = [op_digests, str(member.config), signatures]
    posts = control.gather("join-detail", detail, "the start of autotuning")
    details = [post for post in posts if post is not None]
    if len(details) != member.size or any(
        other[:2] != details[member.rank][:2] for other in details
    ):
        _raise_different_ops(member, details, ops)
    excluded = {}
    for i, candidates in enumerate(ordered):
        for index, candidate in enumerate(candidates):
            seen = [rank_detail[2][i][index] for rank_detail in details]
            if len(set(seen)) == 1:
                continue
            usual = Counter(seen).most_common(1)[0][0]
            excluded[(i, index)] = CandidateResult(
                candidate.name,
                tuple(
                    RankReport(
                        CandidateStatus.DESYNCHRONIZED
                        if signature != usual
                        else CandidateStatus.OK
                    )
                    for signature in seen
                ),
                stage="join: its collectives differ between ranks",
            )
            log.warning(
                "collective autotuning: %s issues different collectives on "
                "ranks %s of group %r; disqualified on every rank",
                candidate.name,
                [rank for rank, signature in enumerate(seen) if signature != usual],
                member.group_name,
            )
    return excluded


def _raise_different_ops(
    member: Member, details: list[list[Any]], ops: Sequence[OpToTune]
) -> None:
    lists = [rank_detail[0] for rank_detail in details]
    mine = lists[member.rank]
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
