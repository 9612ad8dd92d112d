#!/usr/bin/env python3
"""Jobs as users launch them, many times: how often a process exits non-zero, and relaunches.

Repeats the matrix of ``test/inductor/test_collective_launchers.py`` (the same
job, ``collective_autotuning_jobs.WORKER``: an autotuned all_reduce whose
winner is ``rs_ag`` whenever it is benchmarked; the same launchers,
``collective_autotuning_jobs.launch``, both in
``torch/testing/_internal/distributed/``) for each launcher and world size, ``--launches``
times on one cache directory per cell:

* the first launch tunes (cold cache); the others are relaunches at the same
  size, which take the program from the FX graph cache and benchmark nothing;
  every other launch calls ``destroy_process_group()`` before exiting, the
  rest leave it to the interpreter's exit at once (``--no-settle``: a gloo
  job can abort there, stack or not, pytorch/pytorch#190489; see
  ``scripts/repro_gloo_exit_abort.py``);
* then one relaunch at the other world size (2 <-> 3), which must compile and
  benchmark again, and be exact.

Prints one row per cell: non-zero exits among the launches and how the failing
processes ended (a rank's signal, read from torchrun's or mp.spawn's report
when they launched it), what the first launch and the same-size relaunches
benchmarked and which implementation they ran, and whether the other-size
relaunch retuned and was exact.  A launch that failed, or whose ranks ran
another implementation than ``rs_ag``, leaves its ranks' reports and output
in ``build/launcher-reports/<launcher>-<ranks>-<launch>/``.

Usage:
  python scripts/bench_collective_launchers.py [--launches 20] [--nproc 2,3]
      [--launchers torchrun,torchrun_nodes,mp_spawn,srun] [--python PATH]

``--python`` runs the jobs under another interpreter, e.g. an environment of an
earlier version of the stack (one that has the worker module), to compare.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
from torch.testing._internal.distributed.collective_autotuning_jobs import (
    Job,
    launch,
    LAUNCHERS,
    WORKER,
)

# Shared between cells: the rest.
from torch.testing._internal.distributed.collective_autotuning_utils import (
    DECISION_CACHES,
)

WINNER = "rs_ag"  # what the worker's ranks run whenever they benchmark
# Where a launch that failed or ran another implementation leaves its ranks'
# reports and output, which the job's temporary directory does not keep.
KEPT = ROOT / "build" / "launcher-reports"


def ran(job: Job) -> str:
    """The implementations the job's ranks ran, or what went wrong."""
    if len(job.reports) != job.world_size:
        return f"{len(job.reports)}/{job.world_size} ranks reported"
    errors = [report["error"] for report in job.reports if "error" in report]
    if errors:
        # The error's last line, without the c10d log prefix ("[rank0]:[F...] ").
        last = re.sub(r"^(\[[^]]*\]:?\s*)+", "", errors[0].splitlines()[-1])
        return f"error: {last[:80]}"
    return "/".join(sorted({"+".join(report["ran"]) for report in job.reports}))


def benchmarked(job: Job) -> int:
    """Ops benchmarked, summed over the job's ranks (0 when the program came from the cache)."""
    return sum(report.get("counters", {}).get("ops", 0) for report in job.reports)


def exact(job: Job) -> bool:
    return len(job.reports) == job.world_size and all(
        report.get("exact") for report in job.reports
    )


def keep_if_unexpected(job: Job, label: str) -> None:
    """Copy ``job``'s reports and output under ``KEPT/label`` when it failed or ran another winner."""
    if job.ok and ran(job) == WINNER:
        return
    kept = KEPT / label
    kept.mkdir(parents=True, exist_ok=True)
    (kept / "reports.json").write_text(json.dumps(job.reports, indent=1))
    for rank, output in enumerate(job.outputs):
        (kept / f"process{rank}.log").write_text(output)
    print(f"  kept what {label} reported: {kept}", file=sys.stderr, flush=True)


def run_cell(
    launcher: str, nproc: int, launches: int, root: Path, args: argparse.Namespace
) -> dict:
    cache = root / f"{launcher}-{nproc}"
    shutil.copytree(root / "kernels", cache)
    env = {"TORCHINDUCTOR_CACHE_DIR": str(cache)}
    jobs = []
    for index in range(launches):
        extra = [] if index % 2 == 0 else ["--no-destroy", "--no-settle"]
        job = launch(
            launcher,
            nproc,
            [*WORKER, *extra],
            root / "out",
            env=env,
            timeout=args.timeout,
            python=args.python,
        )
        jobs.append(job)
        keep_if_unexpected(job, f"{launcher}-{nproc}-{index + 1}")
        print(
            f"  {launcher} x{nproc} #{index + 1}: "
            f"{'ok' if job.ok else ', '.join(job.failures())}, {job.seconds:.1f}s, "
            f"ran {ran(job)}, benchmarked {benchmarked(job)}",
            file=sys.stderr,
            flush=True,
        )
    other = launch(
        launcher,
        5 - nproc,
        [*WORKER],
        root / "out",
        env=env,
        timeout=args.timeout,
        python=args.python,
    )
    keep_if_unexpected(other, f"{launcher}-{nproc}-other-size-{5 - nproc}")
    print(
        f"  {launcher} x{5 - nproc} (other size): "
        f"{'ok' if other.ok else ', '.join(other.failures())}, ran {ran(other)}, "
        f"benchmarked {benchmarked(other)}",
        file=sys.stderr,
        flush=True,
    )
    shutil.copytree(
        cache,
        root / "kernels",
        dirs_exist_ok=True,
        ignore=shutil.ignore_patterns(*DECISION_CACHES),
    )
    return {"jobs": jobs, "other": other}


def describe(cell: dict, launcher: str, nproc: int) -> str:
    jobs: list[Job] = cell["jobs"]
    failed = [job for job in jobs if not job.ok]
    how = collections.Counter(end for job in failed for end in job.failures())
    ends = ", ".join(f"{name} x{count}" for name, count in sorted(how.items()))
    # Launches 1, 3, ... destroy the process group, 2, 4, ... do not.
    by_destroy = [
        f"{sum(not job.ok for job in jobs[first::2])}/{len(jobs[first::2])}"
        for first in (0, 1)
    ]
    first, relaunches = jobs[0], jobs[1:]
    relaunch_ran = collections.Counter(ran(job) for job in relaunches)
    other: Job = cell["other"]
    return (
        f"| {launcher} | {nproc} | {len(jobs)} | {len(failed)}"
        f"{f' ({ends})' if ends else ''} | {by_destroy[0]} | {by_destroy[1]} "
        f"| {benchmarked(first)} / {ran(first)} "
        f"| {sum(benchmarked(job) for job in relaunches)} / "
        + ", ".join(f"{name} x{count}" for name, count in relaunch_ran.items())
        + f" | {'yes' if benchmarked(other) == 5 - nproc else 'no'} / "
        f"{'yes' if exact(other) else 'no'} / "
        f"{'ok' if other.ok else ', '.join(other.failures())} ({ran(other)}) |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--launches", type=int, default=20)
    parser.add_argument("--nproc", default="2,3")
    parser.add_argument("--launchers", default=",".join(LAUNCHERS))
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    sizes = [int(n) for n in args.nproc.split(",")]
    launchers = args.launchers.split(",")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-launchers-") as tmp:
        root = Path(tmp)
        (root / "kernels").mkdir()
        for nproc in sizes:
            for launcher in launchers:
                cell = run_cell(launcher, nproc, args.launches, root, args)
                rows.append(describe(cell, launcher, nproc))
    print(
        f"{args.python}: gloo, {os.cpu_count()} CPUs; {args.launches} launches per "
        "cell on one cache directory (the first cold, every other one without "
        "destroy_process_group), then one at the other size\n"
    )
    print(
        "| launcher | ranks | launches | non-zero exits (how) "
        "| with destroy_process_group | without "
        "| first launch: ops benchmarked (all ranks) / ran "
        "| same-size relaunches: ops benchmarked / ran "
        "| other size: retuned / exact / exit (ran) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
