"""The join of a collective autotuning session, and the store rendezvous it stands on.

What this checks, on a one-rank gloo group and on members simulated by threads,
each with store connections and a liveness of its own:

* ``ControlStore``: a rendezvous every member reached returns and costs the
  requests its docstring counts; gathered values and claims are JSON and come
  back whole, whatever delimiters they hold.  The last member to leave a
  session deletes its keys; after an exception they stay.
* A wait is bounded: a member that never arrives nor beats is given up on,
  named in the verdict; a member arriving later raises that verdict at once.
* ``op_identity`` ignores only the counter Inductor appends to a choice's name.
* ``join``: a member alone agrees on every candidate in one rendezvous (no
  details posted); a candidate whose collectives differ between members is
  disqualified alike on every member, blaming the one that differs, while the
  others compete; members tuning different ops fail on every member.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import inspect
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import torch.distributed as dist
from torch._dynamo.utils import counters
from torch._inductor.runtime.collective_benchmarking import (
    control as cc,
    decisions as cd,
    join as cj,
    liveness as cl,
    store as cs,
    types as ct,
)
from torch.testing._internal.common_utils import TestCase, run_tests

from rank_processes import OneRankGlooTestCase

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


def run_join(member, control, ops):
    """``join`` over ``ops``: the candidates it disqualified, by (op, candidate index).

    A later patch passes ``join`` each op's remembered decision and has it
    return a ``Joined``: with none remembered every op runs, and
    ``Joined.excluded`` is what ``join`` returned before.
    """
    ordered = [list(o.candidates) for o in ops]
    if "remembered" not in inspect.signature(cj.join).parameters:
        return cj.join(member, control, ops, ordered)
    return cj.join(member, control, ops, ordered, [None] * len(ops)).excluded


class TestOneMember(OneRankGlooTestCase):
    def control(self, prefix: str) -> cc.ControlStore:
        group = dist.group.WORLD
        return cc.ControlStore.for_group(prefix, group, CONFIG.timeout, CONFIG.max_wait)

    def test_rendezvous_costs_the_counted_requests(self):
        control = self.control("test/counted/")
        with control.session():
            before = collections.Counter(control.client.requests)
            control.barrier("step", "the step")
            barrier = collections.Counter(control.client.requests)
            posts = control.gather("values", "a:1:b", "the gather")
            gather = collections.Counter(control.client.requests)
            self.assertEqual((control.count("n"), control.count("n", 0)), (1, 1))
        self.assertEqual(dict(barrier - before), dict(add=1, compare_set=1, get=1))
        self.assertEqual(
            dict(gather - barrier), dict(append=1, add=1, compare_set=1, get=2)
        )
        self.assertEqual(posts, ["a:1:b"])

    def test_values_travel_as_json_whatever_they_hold(self):
        # Posts and claims are JSON, not delimited strings: delimiters, line
        # breaks and nesting in a value come back as they were posted.
        control = self.control("test/json/")
        with control.session():
            value = {"stage": "warmup: a|b:c\nd \u2028 e", "steps": [1, [2, 3]]}
            self.assertEqual(control.gather("values", value, "the gather"), [value])
            claim = control.claim("holder", "x|y:z")
            self.assertEqual(claim, cc.Claim(0, "x|y:z"))
            self.assertEqual(control.read_claim("holder"), claim)
            self.assertIsNone(control.read_claim("unclaimed"))

    def test_last_member_to_leave_deletes_the_keys_unless_it_failed(self):
        names = ["step/count", "step/done", "values/log", "n"]
        for prefix, failing in (("test/left/", False), ("test/failed/", True)):
            control = self.control(prefix)
            with contextlib.suppress(ValueError), control.session():
                control.barrier("step", "the step")
                control.gather("values", "v", "the gather")
                control.count("n")
                if failing:
                    raise ValueError("a failed session")
            read = control.client.read_if_set
            left = [name for name in names if read(prefix + name) is not None]
            self.assertEqual(left, names if failing else [], prefix)

    def test_an_absent_member_is_given_up_on_and_a_late_one_raises_the_verdict(self):
        pair = ([0, 1], "pair", timedelta(seconds=1), timedelta(seconds=10))
        waiting, late = (cc.ControlStore("test/absent/", r, *pair) for r in (0, 1))
        given_up = r"ranks \[1\] of group 'pair' did not reach the step: no heartbeat"
        with self.assertRaisesRegex(cs.CollectiveBenchmarkError, given_up):
            with waiting.session():
                waiting.barrier("step", "the step")
        peers = given_up + r".*\(the verdict of a peer that gave up waiting\)"
        with self.assertRaisesRegex(cs.CollectiveBenchmarkError, peers):
            late.barrier("step", "the step")

    def test_op_identity_ignores_only_the_compile_counter(self):
        def identity(name: str, is_default: bool = False) -> str:
            candidate = ct.Candidate(name, print, is_default)
            return cj.op_identity(FakeMember(0, 1), ct.OpToTune("k", [candidate]))

        self.assertEqual(identity("ar_direct_3"), identity("ar_direct_12"))
        others = {identity("ar_3"), identity("rs_3"), identity("ar_3", True)}
        self.assertEqual(len(others), 3)

    def test_a_member_alone_agrees_on_every_candidate_in_one_rendezvous(self):
        counters.clear()
        control = self.control("test/join/")
        member = FakeMember(0, 1, dist.group.WORLD.group_name)
        with control.session():
            before = collections.Counter(control.client.requests)
            ops = [op("a", "ring", "tree"), op("b", "x")]
            excluded = run_join(member, control, ops)
            spent = collections.Counter(control.client.requests) - before
        self.assertEqual(excluded, {})
        self.assertEqual(counters["collective_autotuning"]["presync"], 1)
        self.assertEqual(spent["append"], 0)  # the digests agreed: no details posted


class TestSimulatedMembers(TestCase):
    def setUp(self):
        super().setUp()
        self.server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=CONFIG.max_wait)

    def tearDown(self):
        self.server = None
        super().tearDown()

    def join_all(self, ops_by_rank):
        """Every member's join at once: what each returned, or raised."""
        size = len(ops_by_rank)

        def member(rank):
            store = dist.TCPStore("127.0.0.1", self.server.port, 1, False)
            thread = threading.current_thread()
            liveness = cl.Liveness(
                lambda: store, lambda: rank, thread, lambda: False, False
            )
            limits = (CONFIG.timeout, CONFIG.max_wait, cs.StoreClient(store), liveness)
            control = cc.ControlStore("test/join/", rank, range(size), "sim", *limits)
            try:
                with control.session():
                    return run_join(FakeMember(rank, size), control, ops_by_rank[rank])
            finally:
                liveness.shutdown()

        with ThreadPoolExecutor(size) as pool:
            futures = [pool.submit(member, rank) for rank in range(size)]
        return [future.exception() or future.result() for future in futures]

    def test_a_candidate_whose_collectives_differ_is_disqualified_on_every_member(self):
        same, differs = [op("a", "ring", "tree")], [op("a", "ring", "tree'")]
        results = self.join_all([same, differs, same])
        self.assertEqual(results[1:], [results[0]] * 2)
        self.assertEqual(list(results[0]), [(0, 2)])  # the default and impl0 compete
        result = results[0][(0, 2)]
        self.assertEqual(result.name, "impl1")
        statuses = [report.status for report in result.reports]
        self.assertEqual(statuses, [OK, DESYNCHRONIZED, OK])
        self.assertIn("join", result.stage)

    def test_members_tuning_different_ops_fail_on_every_member(self):
        for error in self.join_all([[op("a", "ring")], [op("b", "ring")]]):
            self.assertIsInstance(error, cs.CollectiveBenchmarkError)
            self.assertIn("not tuning the same ops", str(error))


if __name__ == "__main__":
    run_tests()
