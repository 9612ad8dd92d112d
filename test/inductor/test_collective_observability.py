"""Collective autotuning in the tools people read: tlparse, chromium events, compile metrics.

What this checks, on a job of 2 gloo ranks launched srun-style (the user's
job of ``collective_autotuning_jobs.WORKER``: an autotuned all_reduce whose
fast implementation is ``rs_ag``), with ``TORCH_TRACE`` set, Inductor's caches
on and ``collective_benchmark_strict``, one cache directory for the job as on one host.  Each rank's trace is
parsed by the real tlparse (installed by ``scripts/bootstrap.sh``):

* the first launch benchmarks.  Each rank's report holds one
  ``collective_autotuning_decision`` artifact under the compile that made it,
  and both name ``rs_ag``, by the rule "faster and significant", with a "why"
  per candidate and the group.  Its ``chromium_events.json`` holds the
  session and its phases (join, compile, warmup, timed runs, exchange,
  commit), each naming the group and the number of candidates; the phase
  keys are in ``compile_times()``; the compile metrics carry the session's
  total; ``counters["inductor"]`` counts the session and its bytes;
* a second launch with the FX graph and AOTAutograd caches off compiles
  again and remembers the decision (``collective_decisions/``): its artifact
  says "remembered", nothing is benchmarked;
* a third launch with the caches on is a cache hit: its artifact says so.

And, without a job, what :func:`reporting.explain` says about each
candidate.  (Deterministic mode, which takes the default without a session,
reports it as such: ``test_collective_decisions.py``.)
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch.distributed as dist
from torch._inductor.runtime.collective_benchmarking import decisions as cd
from torch._inductor.runtime.collective_benchmarking import rules as cr
from torch._inductor.runtime.collective_benchmarking.reporting import (
    ARTIFACT_NAME,
    explain,
)
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed.collective_autotuning_jobs import (
    launch,
    WORKER,
)


# The launched jobs' Inductor setting (their processes are not this one's):
# a job that tuned nothing fails, and cannot pass by running the default.
STRICT = {"TORCHINDUCTOR_COLLECTIVE_BENCHMARK_STRICT": "1"}
TLPARSE = shutil.which(
    "tlparse", path=str(Path(sys.executable).parent)
) or shutil.which("tlparse")
PHASES = ["session", "join", "compile", "warmup", "timed", "exchange", "commit"]


def result(name: str, runs: list[float], status=cd.CandidateStatus.OK, ranks: int = 2):
    return cd.CandidateResult(name, (cd.RankReport(status),) * ranks, tuple(runs))


class ExplainTest(TestCase):
    """The "why" of each candidate: a pure function of the agreed data."""

    def test_the_do_no_harm_case_says_why_the_default_stayed(self):
        # As the demo's all_gather: two candidates 1.4x faster at the median,
        # but not in enough paired runs, or not beyond the noise floor.
        default = result("default", [2.84, 1.0, 2.84, 1.0, 2.84])
        not_significant = result("all_to_all", [2.0, 2.0, 2.0, 2.0, 1.1])
        within_noise = result("direct", [2.7, 0.98, 2.8, 0.99, 2.8])
        raised = cd.CandidateResult(
            "chunked",
            (
                cd.RankReport(cd.CandidateStatus.OK),
                cd.RankReport(cd.CandidateStatus.RAISED),
            ),
            stage="warmup",
        )
        results = [default, not_significant, within_noise, raised]
        verdict = cr.decide(results, True, 0.02, 0.95)
        decision = cd.CollectiveDecision(
            "0", tuple(results), "default", verdict.reason, verdict.rule, 0.05
        )
        self.assertIs(verdict.rule, cd.DecisionRule.DO_NO_HARM)
        self.assertEqual(
            explain(decision, "default", 0.95),
            [
                "the default",
                "not significant: faster in 3/5 paired runs, p=0.5",
                "within the noise floor: 1.4% faster at the median, floor 5.0%",
                "disqualified: raised on rank 1 in warmup",
            ],
        )

    def test_a_significant_winner_and_no_default(self):
        fast = result("fast", [1.0] * 5)
        slow = result("slow", [2.0] * 5)
        decision = cd.CollectiveDecision(
            "0", (slow, fast), "fast", "", cd.DecisionRule.SIGNIFICANT
        )
        self.assertEqual(
            explain(decision, "slow", 0.95),
            ["the default", "faster in 5/5 paired runs, p=0.031"],
        )
        self.assertEqual(explain(decision, None, 0.95), ["no default to beat"] * 2)


class TraceTest(TestCase):
    """A job's decisions in its traces, as tlparse reads them (see the module docstring)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        if TLPARSE is None:
            raise cls.skipTest(
                cls, "tlparse is not installed (scripts/bootstrap.sh installs it)"
            )
        if not dist.is_available() or not dist.is_gloo_available():
            raise cls.skipTest(cls, "needs torch.distributed with gloo")
        cls.root = Path(tempfile.mkdtemp(prefix="collective-trace-"))
        cache = str(cls.root / "cache")
        cls.launches = {}
        for name, env in (
            ("benchmarked", {}),
            (
                "remembered",
                {
                    "TORCHINDUCTOR_FX_GRAPH_CACHE": "0",
                    "TORCHINDUCTOR_AUTOGRAD_CACHE": "0",
                },
            ),
            ("cache hit", {}),
        ):
            trace = cls.root / f"trace-{name.replace(' ', '-')}"
            job = launch(
                "srun",
                2,
                [*WORKER],
                cls.root / f"out-{name.replace(' ', '-')}",
                env={
                    **env,
                    **STRICT,
                    "TORCH_TRACE": str(trace),
                    "TORCHINDUCTOR_CACHE_DIR": cache,
                    "PYTHONWARNINGS": "ignore",
                },
                timeout=300,
            )
            cls.launches[name] = (job, trace)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(getattr(cls, "root", ""), ignore_errors=True)
        super().tearDownClass()

    def parsed(self, name: str) -> list[Path]:
        """Each rank's tlparse report of launch ``name``, in rank order."""
        job, trace = self.launches[name]
        self.assertEqual(job.exits, [0, 0], job.log_tail())
        self.assertEqual(
            [r.get("exact") for r in job.reports], [True, True], job.reports
        )
        reports = []
        for rank in range(2):
            (log,) = trace.glob(f"dedicated_log_torch_trace_rank_{rank}_*.log")
            out = trace / f"tlparse-rank{rank}"
            subprocess.run(
                [TLPARSE, str(log), "-o", str(out), "--overwrite", "--no-browser"],
                check=True,
                capture_output=True,
            )
            reports.append(out)
        return reports

    def artifacts(self, report: Path) -> list[dict]:
        paths = sorted(
            report.glob(f"*/{ARTIFACT_NAME}_*.json"),
            key=lambda path: int(path.stem.rsplit("_", 1)[1]),
        )
        return [json.loads(path.read_text()) for path in paths]

    def test_a_benchmarked_decision_in_the_trace_of_every_rank(self):
        job, _ = self.launches["benchmarked"]
        self.assertEqual([r["ran"] for r in job.reports], [["rs_ag"], ["rs_ag"]])
        decisions = [self.artifacts(report) for report in self.parsed("benchmarked")]
        self.assertEqual([len(found) for found in decisions], [1, 1])
        first, second = decisions[0][0], decisions[1][0]
        for decision in (first, second):
            self.assertEqual(decision["source"], "benchmarked")
            self.assertEqual(decision["rule"], "faster and significant")
            self.assertEqual(decision["group"]["size"], 2)
            self.assertEqual(decision["group"]["ranks"], [0, 1])
            self.assertIn("rs_ag", decision["winner"])
            whys = {c["name"]: c["why"] for c in decision["candidates"]}
            self.assertEqual(whys[decision["default"]], "the default")
            self.assertRegex(whys[decision["winner"]], r"faster in \d+/\d+ paired runs")
            winner = next(
                c for c in decision["candidates"] if c["name"] == decision["winner"]
            )
            self.assertEqual(winner["status_per_rank"], ["ok", "ok"])
            self.assertLess(winner["p_value"], 0.05)
        # The same decision on both ranks: the agreed parts are equal.
        for key in ("winner", "rule", "reason", "noise_floor", "tuning_key"):
            self.assertEqual(first[key], second[key], key)

    def test_phases_are_chromium_events_compile_times_and_metrics(self):
        job, _ = self.launches["benchmarked"]
        for rank, report in enumerate(self.parsed("benchmarked")):
            events = json.loads((report / "chromium_events.json").read_text())
            started = {
                event["name"].removeprefix("collective_autotuning."): event["args"]
                for event in events
                if event["name"].startswith("collective_autotuning.")
                and event["ph"] == "B"
            }
            for phase in PHASES:
                self.assertIn(phase, started, f"rank {rank}")
                self.assertEqual(started[phase]["group"], "0")
                self.assertEqual(started[phase]["candidates"], 3)
            self.assertTrue(
                {f"collective_autotuning.{phase}" for phase in PHASES}
                <= set(job.reports[rank]["compile_events"])
            )
            metrics = [
                json.loads(line)
                for line in (report / "raw.jsonl").read_text().splitlines()
                if '"compilation_metrics"' in line
            ]
            self.assertTrue(
                any(
                    (m["compilation_metrics"].get("collective_autotuning_time_us") or 0)
                    > 0
                    for m in metrics
                ),
                f"rank {rank}",
            )
            inductor = job.reports[rank]["inductor_counters"]
            self.assertEqual(inductor["collective_autotuning_sessions"], 1)
            self.assertGreater(inductor["collective_autotuning_bytes_exchanged"], 0)

    def test_a_remembered_decision_says_so(self):
        job, _ = self.launches["remembered"]
        self.assertEqual([r["ran"] for r in job.reports], [["rs_ag"], ["rs_ag"]])
        self.assertEqual([r["counters"].get("ops", 0) for r in job.reports], [0, 0])
        for report in self.parsed("remembered"):
            (decision,) = self.artifacts(report)
            self.assertEqual(decision["source"], "remembered")
            self.assertEqual(decision["rule"], "faster and significant")
            self.assertIn("rs_ag", decision["winner"])

    def test_a_cache_hit_says_so(self):
        job, _ = self.launches["cache hit"]
        self.assertEqual([r["fxgraph"]["hit"] for r in job.reports], [1, 1])
        for report in self.parsed("cache hit"):
            (decision,) = self.artifacts(report)
            self.assertEqual(decision["source"], "cache hit")
            self.assertIn("rs_ag", decision["winner"])


if __name__ == "__main__":
    run_tests()
