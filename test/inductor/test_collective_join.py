"""The join of a collective autotuning session: one gather on the benchmark channel.

What this checks, on a one-rank gloo group and on members simulated by threads
that gather through a stand-in channel (the join's rules, without processes):

* ``op_identity`` ignores only the counter Inductor appends to a choice's name.
* A member alone agrees on every candidate in one collective (no details
  gathered).
* A candidate whose collectives differ between members is disqualified alike
  on every member, blaming the one that differs, while the others compete;
  members tuning different ops fail on every member.
* Members that remember the same decision each adopt their own, in the one
  gather; a decision that only some members remember is adopted by every
  member from the lowest-ranked holder, in one more gather and a broadcast
  from each such holder.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._dynamo.utils import counters
from torch._inductor.runtime.collective_benchmarking import (
    channels as cc,
    decisions as cd,
    join as cj,
    types as ct,
)
from torch.testing._internal.common_utils import TestCase, run_tests
from torch.testing._internal.distributed.collective_autotuning_utils import (
    OneRankGlooTestCase,
)

CONFIG = ct.CollectiveBenchmarkConfig(timeout=timedelta(seconds=5), nwarmup=1, nruns=3)
OK, DESYNCHRONIZED = cd.CandidateStatus.OK, cd.CandidateStatus.DESYNCHRONIZED


@dataclasses.dataclass(frozen=True)
class FakeMember:
    """What the join reads of a session's member (``types.Member``), and nothing else."""

    rank: int
    size: int
    group_name: str = "sim"
    config: ct.CollectiveBenchmarkConfig = CONFIG

    def decision_context(self) -> tuple[str, str]:
        return repr((self.group_name, self.size)), repr(self.config)


def op(key: str, *signatures: str) -> ct.OpToTune:
    # The default first (preference order), then a candidate per signature.
    impls = [
        ct.Candidate(f"impl{i}", print, signature=s) for i, s in enumerate(signatures)
    ]
    return ct.OpToTune(key, [ct.Candidate("default", print, True, "eager"), *impls])


def decision(winner: str, ms: float) -> cd.CollectiveDecision:
    results = tuple(
        cd.CandidateResult(name, (cd.RankReport(OK, ms),), (ms,))
        for name in ("default", "impl0")
    )
    return cd.CollectiveDecision(
        "sim", results, winner, "fastest", cd.DecisionRule.FASTEST
    )


def run_join(member, channel, ops, remembered=None):
    """``join`` over ``ops``, with each op's remembered decision (none by default).

    An early patch's join remembers nothing: it takes no ``remembered``.
    """
    ordered = [list(o.candidates) for o in ops]
    remembered = remembered or [None] * len(ops)
    if "remembered" not in inspect.signature(cj.join).parameters:
        return cj.join(member, channel, ops, ordered)
    return cj.join(member, channel, ops, ordered, remembered)


class Hub:
    """Where members that are threads meet: counts the gathers they make."""

    def __init__(self, size: int) -> None:
        self.barrier = threading.Barrier(size)
        self.values: list = [None] * size
        self.gathers = 0


@dataclasses.dataclass
class SimulatedChannel:
    """Stands in for a member's ``BenchmarkChannel``: a gather returns every
    member's value, a broadcast the root's (through JSON, as they travel)."""

    hub: Hub
    rank: int

    def everyone(self, what, step, bound):
        return step()

    def gather_objects(self, value, wait):
        self.hub.values[self.rank] = json.loads(json.dumps(value))
        self.hub.barrier.wait()
        gathered = list(self.hub.values)
        if self.rank == 0:
            self.hub.gathers += 1
        self.hub.barrier.wait()
        return gathered

    gather_ints = gather_objects

    def broadcast_object(self, value, root, wait):
        # A gather (counted as one) of which only the root's value travels.
        return self.gather_objects(value if self.rank == root else None, wait)[root]


class TestOneMember(OneRankGlooTestCase):
    def test_op_identity_ignores_only_the_compile_counter(self):
        def identity(name: str, is_default: bool = False) -> str:
            candidate = ct.Candidate(name, print, is_default)
            return cj.op_identity(FakeMember(0, 1), ct.OpToTune("k", [candidate]))

        self.assertEqual(identity("ar_direct_3"), identity("ar_direct_12"))
        others = {identity("ar_3"), identity("rs_3"), identity("ar_3", True)}
        self.assertEqual(len(others), 3)

    def test_a_member_alone_agrees_on_every_candidate_in_one_collective(self):
        counters.clear()
        group = dist.group.WORLD
        channel = cc.BenchmarkChannel(group, torch.device("cpu"), CONFIG)
        channel.start_session()
        member = FakeMember(0, 1, group.group_name)
        ops = [op("a", "ring", "tree"), op("b", "x")]
        joined = run_join(member, channel, ops)
        self.assertEqual((joined.to_run, joined.excluded), ([0, 1], {}))
        self.assertEqual(counters["collective_autotuning"]["presync"], 1)
        self.assertEqual(counters["collective_autotuning"]["sync_collectives"], 1)


class TestSimulatedMembers(TestCase):
    def join_all(self, ops_by_rank, remembered_by_rank=None):
        """Every member's join at once: what each returned, or raised; and the
        number of gathers they made."""
        size = len(ops_by_rank)
        hub = Hub(size)
        remembered_by_rank = remembered_by_rank or [None] * size

        def member(rank):
            return run_join(
                FakeMember(rank, size),
                SimulatedChannel(hub, rank),
                ops_by_rank[rank],
                remembered_by_rank[rank],
            )

        with ThreadPoolExecutor(size) as pool:
            futures = [pool.submit(member, rank) for rank in range(size)]
        return [
            future.exception() or future.result() for future in futures
        ], hub.gathers

    def test_a_candidate_whose_collectives_differ_is_disqualified_on_every_member(self):
        same, differs = [op("a", "ring", "tree")], [op("a", "ring", "tree'")]
        results, gathers = self.join_all([same, differs, same])
        excluded = [result.excluded for result in results]
        self.assertEqual(excluded[1:], [excluded[0]] * 2)
        self.assertEqual(list(excluded[0]), [(0, 2)])  # the default and impl0 compete
        result = excluded[0][(0, 2)]
        self.assertEqual(result.name, "impl1")
        statuses = [report.status for report in result.reports]
        self.assertEqual(statuses, [OK, DESYNCHRONIZED, OK])
        self.assertIn("join", result.stage)
        self.assertEqual(gathers, 2)  # the digests, then the details

    def test_members_tuning_different_ops_fail_on_every_member(self):
        results, _ = self.join_all([[op("a", "ring")], [op("b", "ring")]])
        for error in results:
            self.assertIsInstance(error, ct.CollectiveBenchmarkError)
            self.assertIn("not tuning the same ops", str(error))

    def test_members_that_remember_alike_adopt_their_own_in_one_gather(self):
        ops = [op("a", "ring"), op("b", "ring")]
        mine = [decision("impl0", 1.0) for _ in range(3)]
        results, gathers = self.join_all([ops] * 3, [[held, None] for held in mine])
        for result, held in zip(results, mine, strict=True):
            self.assertEqual(result.to_run, [1])
            self.assertIs(result.adopted[0], held)  # its own object: "remembered"
        self.assertEqual(gathers, 1)

    def test_a_decision_some_members_remember_is_adopted_from_the_lowest_holder(self):
        ops = [op("a", "ring")]
        by_rank1, by_rank2 = decision("impl0", 1.0), decision("default", 2.0)
        results, gathers = self.join_all([ops] * 3, [[None], [by_rank1], [by_rank2]])
        for result in results:
            self.assertEqual(result.to_run, [])
            self.assertEqual(result.adopted[0], by_rank1)
        self.assertIs(results[1].adopted[0], by_rank1)
        self.assertEqual(gathers, 3)  # the digests, per-op digests, the decision

    def test_each_member_giving_remembered_decisions_broadcasts_them(self):
        ops = [op("a", "ring"), op("b", "ring"), op("c", "ring")]
        a, b, c = (decision("impl0", ms) for ms in (1.0, 2.0, 3.0))
        remembered = [[None, None, c], [a, None, c], [None, b, c]]
        results, gathers = self.join_all([ops] * 3, remembered)
        for result, held in zip(results, remembered, strict=True):
            self.assertEqual(result.adopted, {0: a, 1: b, 2: c})
            self.assertIs(result.adopted[2], held[2])  # held alike: its own
        # The digests, per-op digests, then a broadcast from rank 1 (a) and
        # one from rank 2 (b); c, held alike by all, is not sent.
        self.assertEqual(gathers, 4)


if __name__ == "__main__":
    run_tests()
