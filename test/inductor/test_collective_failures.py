"""How a collective autotuning session's members agree on a failure, without a session.

What this checks (``failures.py``, on no process group):

* ``classify``: a timeout is told by its type or by its message, in any case,
  also when a backend error carries it; a lost connection to a peer is
  ``PEER_FAILED``; both are retried, and anything else (a protocol error
  included) is ``RAISED``, never retried.
* ``earliest_failure``: the rule every rank applies to the failure reports
  of its peers blames the same round with the same statuses, whatever order
  the reports come in.
* ``agreed_results``: a run's time is its slowest member's, of the runs
  that every member timed; each member keeps its status and its median.
* ``FailureAgreements`` on a stand-in channel that records its calls: every
  agreement rebuilds the channel and gathers every member's report on the
  new one; the earliest failed step is blamed (retried while retries
  remain); a step in which members issued different numbers of collectives
  is blamed before it, the candidate out as desynchronized, even when the
  failure it caused showed steps later; a failed commit ends the session.
"""

from __future__ import annotations

import collections
import math
from datetime import timedelta

import torch.distributed as dist
from hypothesis import given, settings, strategies as st
from torch._inductor.runtime.collective_benchmarking import (
    decisions as cd,
    failures,
    types as ct,
)
from torch._inductor.runtime.collective_benchmarking.failures import (
    classify,
    FailureAgreements,
    Step,
)
from torch.testing._internal.common_utils import TestCase, run_tests

Status = cd.CandidateStatus
OK, PEER, TIMEOUT, WRONG, RAISED = (
    Status.OK,
    Status.PEER_FAILED,
    Status.TIMED_OUT,
    Status.WRONG_RESULT,
    Status.RAISED,
)


class TestClassify(TestCase):
    def test_timeouts_by_type_or_message_even_from_a_backend(self):
        for error in (
            ct.CollectiveBenchmarkTimeout("a benchmark collective did not complete"),
            TimeoutError("x"),
            RuntimeError("recv: Operation TIMED OUT"),
            RuntimeError("Timed out waiting 3000ms for recv operation"),
            dist.DistBackendError("Connection closed by peer: timed out after 5s"),
        ):
            self.assertIs(classify(error), Status.TIMED_OUT, error)
            self.assertTrue(classify(error).retryable)

    def test_lost_peers_are_retried_and_everything_else_is_raised(self):
        for error in (
            dist.DistNetworkError("gloo"),
            OSError("Connection reset by peer"),
            dist.DistBackendError("Connection closed by peer [::1]:1"),
        ):
            self.assertIs(classify(error), Status.PEER_FAILED, error)
            self.assertTrue(classify(error).retryable)
        for error in (
            ct.CollectiveBenchmarkError("ops differ"),
            ValueError("timeout=0"),
        ):
            self.assertIs(classify(error), Status.RAISED, error)
            self.assertFalse(classify(error).retryable)


class RecordingChannel:
    """Stands in for a ``BenchmarkChannel`` in a failure agreement: records its
    calls and gathers the reports it was given, one per member."""

    def __init__(self, posts):
        self.posts = posts
        self.calls: list[str] = []
        self.group_name = "g"
        self.group = self
        self.timeout = timedelta(seconds=1)

    def rebuild(self, what):
        self.calls.append(f"rebuild {what}")

    def everyone(self, what, step, bound):
        return step()

    def gather_objects(self, value, wait):
        self.calls.append("gather")
        return [post.to_json() for post in self.posts]


def report(step, status=Status.OK, issued=()):
    return failures.FailureReport(step, status, f"stage of {step}", tuple(issued))


class TestFailureRules(TestCase):
    def test_earliest_round_takes_the_worst_status_reported_for_it(self):
        # Rank 1 raised in round 2; rank 0 saw its channel fail there; rank 2
        # had finished round 2 and failed in round 3 when rank 1 left.
        posts = [
            failures.FailureReport(2, PEER, "warmup"),
            failures.FailureReport(2, RAISED, "warmup"),
            failures.FailureReport(3, PEER, "warmup"),
        ]
        round_index, reports, stage = failures.earliest_failure(posts)
        self.assertEqual(round_index, 2)
        self.assertEqual([r.status for r in reports], [PEER, RAISED, OK])
        self.assertEqual(stage, "warmup")

    def test_the_stage_carries_the_error_of_the_worst_report(self):
        # A post's stage names the error, so that every member can say why a
        # candidate lost, not only where.
        posts = [
            failures.FailureReport(
                1, PEER, "warmup: DistError: Connection closed by peer"
            ),
            failures.FailureReport(1, RAISED, "warmup: RuntimeError: a: b"),
        ]
        _, _, stage = failures.earliest_failure(posts)
        self.assertEqual(stage, "warmup: RuntimeError: a: b")

    def test_timeout_is_retryable_and_a_real_failure_is_not(self):
        self.assertTrue(TIMEOUT.retryable and PEER.retryable)
        self.assertFalse(RAISED.retryable or WRONG.retryable or OK.retryable)
        _, reports, _ = failures.earliest_failure(
            [
                failures.FailureReport(1, TIMEOUT, "timed runs"),
                failures.FailureReport(1, PEER, "timed runs"),
            ]
        )
        self.assertTrue(max(r.status for r in reports).retryable)

    @settings(max_examples=200, deadline=None)
    @given(
        posts=st.lists(
            st.tuples(
                st.integers(0, 1), st.sampled_from([PEER, TIMEOUT, WRONG, RAISED])
            ),
            min_size=1,
            max_size=6,
        ),
        data=st.data(),
    )
    def test_every_rank_derives_the_same_verdict_in_any_order(self, posts, data):
        reports = [failures.FailureReport(r + 4, s, f"stage{int(s)}") for r, s in posts]
        shuffled = data.draw(st.permutations(reports))
        first, second = (
            failures.earliest_failure(reports),
            failures.earliest_failure(shuffled),
        )
        self.assertEqual(first[0], second[0])
        self.assertEqual(
            max(r.status for r in first[1]), max(r.status for r in second[1])
        )
        self.assertEqual(first[2], second[2])


class TestAgreedResults(TestCase):
    def test_a_run_takes_its_slowest_member_and_a_member_keeps_its_median(self):
        plans = [("op", [ct.Candidate("a", print, True), ct.Candidate("b", print)])]
        nan = math.nan
        exchanged = [  # per member: each candidate's status, then its runs
            [OK, 1.0, 5.0, 2.0, RAISED, nan, nan, nan],
            [OK, 3.0, 1.0, 2.5, OK, 1.0, 1.0, 1.0],
        ]
        ((a, b),) = failures.agreed_results(
            plans, 3, exchanged, {}, collections.defaultdict(lambda: 1)
        )
        self.assertEqual((a.runs_ms, a.time_ms), ((3.0, 5.0, 2.5), 3.0))
        self.assertEqual(a.reports, (cd.RankReport(OK, 2.0), cd.RankReport(OK, 2.5)))
        # Timed on one member only: no run is agreed.
        self.assertEqual(b.reports, (cd.RankReport(RAISED), cd.RankReport(OK, 1.0)))
        self.assertEqual((b.runs_ms, b.time_ms), ((), math.inf))


class TestFailureAgreements(TestCase):
    # One op: warmups of candidates 0 and 1 (steps 0, 1), then two timed
    # iterations (steps 2-5); the exchange is step 6, the commit step 7.
    SCHEDULE = [
        Step(0, 0, timed=False),
        Step(0, 1, timed=False),
        *[Step(0, c, timed=True) for _ in range(2) for c in (0, 1)],
    ]
    PLANS = [("op", [ct.Candidate("default", print, True), ct.Candidate("c1", print)])]

    def agree(self, posts, retries=0):
        channel = RecordingChannel(posts)
        agreements = FailureAgreements(self.PLANS, {}, retries, channel, {})
        op = agreements.agree(self.SCHEDULE, posts[0])
        self.assertEqual(channel.calls, ["rebuild failure agreement", "gather"])
        return agreements, op

    def test_the_earliest_step_is_blamed_and_retried_while_retries_remain(self):
        posts = [report(3, Status.TIMED_OUT), report(4, Status.PEER_FAILED)]
        agreements, op = self.agree(posts, retries=1)
        self.assertEqual(op, 0)  # the op runs again
        self.assertEqual(agreements.failed, {})
        self.assertEqual(agreements.attempts[(0, 1)], 2)
        agreements, _ = self.agree(posts, retries=0)
        self.assertEqual(agreements.failed[(0, 1)].status, Status.TIMED_OUT)
        self.assertEqual(agreements.competing, [[True, False]])

    def test_a_step_that_issued_other_collectives_is_blamed_before_it(self):
        # Candidate 1's warmup (step 1) issued 2 collectives on rank 1 and 1
        # on rank 0; the failure it caused showed only in the timed runs.
        posts = [
            report(5, Status.TIMED_OUT, issued=[0, 3, 4, 5, 6, 7]),
            report(4, Status.TIMED_OUT, issued=[0, 3, 5, 6, 7]),
        ]
        agreements, op = self.agree(posts)
        self.assertEqual(op, 0)
        failed = agreements.failed[(0, 1)]
        self.assertEqual(
            [r.status for r in failed.reports], [Status.OK, Status.DESYNCHRONIZED]
        )
        self.assertIn("more collectives on some ranks", failed.stage)

    def test_uncounted_steps_blame_the_earliest_failure(self):
        posts = [
            report(4, Status.RAISED),
            report(5, Status.PEER_FAILED, issued=range(6)),
        ]
        agreements, op = self.agree(posts)
        self.assertEqual(agreements.failed[(0, 0)].status, Status.RAISED)
        self.assertEqual(op, 0)

    def test_a_failed_checkpoint_blames_no_candidate_and_runs_the_op_again(self):
        # A checkpoint after the first timed iteration (step 4): the op runs
        # again, whole, and the exchanges' bound counts it.
        schedule = [
            *self.SCHEDULE[:4],
            Step(0, -1, timed=False, checkpoint=True),
            *self.SCHEDULE[4:],
        ]
        posts = [report(4, Status.TIMED_OUT), report(5, Status.PEER_FAILED)]
        channel = RecordingChannel(posts)
        agreements = FailureAgreements(self.PLANS, {}, 0, channel, {})
        self.assertEqual(agreements.agree(schedule, posts[0]), 0)
        self.assertEqual(
            (agreements.failed, agreements.competing), ({}, [[True, True]])
        )
        with self.assertRaisesRegex(ct.CollectiveBenchmarkError, "failed 2 times"):
            agreements.agree(schedule, posts[0])

    def test_a_failed_commit_ends_the_session(self):
        _, op = self.agree([report(7, Status.TIMED_OUT), report(7, Status.OK)])
        self.assertIsNone(op)


if __name__ == "__main__":
    run_tests()
