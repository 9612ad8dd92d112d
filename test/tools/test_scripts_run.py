"""The benchmark and soak scripts run end to end at their smallest size.

``test_scripts_start.py`` only checks that each script parses its arguments.
The benchmarks and the soak also call the demo's and the tests' helpers in
their rank processes, where a changed helper fails only when the script
runs (``make_input`` gained a device argument, and two scripts died at their
first input).  Each runs here once, at 2 ranks and the fewest compiles,
runs and sizes it takes, and must
exit 0 and print its table.  The figures they print are not checked:
``docs/measurements.md`` quotes full runs.

Eight scripts are only started (``--help``), not run: each launches its
jobs through helpers that a run here or a test module of ``test/inductor``
already runs (``COVERED_BY`` names them), and their runs would cost CI's
two cores some eight minutes.  Their own code past argument parsing is
checked by their full runs (``docs/measurements.md``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"

# script -> (its arguments at its smallest size, a line of the table it prints)
SMALLEST = {
    "bench_collective_autotuning.py": (
        ["--nproc", "2", "--ops", "1", "--runs", "3", "--tables", "block"],
        "| 2 | V2 |",
    ),
    "bench_collective_buffers.py": (
        ["--ops", "2", "--numel", "1024"],
        "| released when the session ends (0023) |",
    ),
    "bench_collective_regret.py": (
        ["--nproc", "2", "--ops", "all_reduce", "--sizes", "240", "--compiles", "1",
         "--oracle-runs", "6"],
        "| 2 | all_reduce | 0.9375 |",
    ),
    "soak_collective_autotuning.py": (
        ["--nproc", "2", "--sessions", "2", "--kinds", "all_reduce,all_gather",
         "--sizes", "240"],
        "| 2 | 2/2 | 0 | 0 | 0 |",
    ),
}  # fmt: skip

# script -> where the helpers it launches its jobs through run in the suite
COVERED_BY = {
    "bench_collective_caches.py": "launch_ranks and the demo's ops: regret's run",
    "bench_collective_decisions.py": "rank_env, via launch: test_collective_launchers.py",
    "bench_collective_epilogues.py": "bench_collective_regret's helpers: its run",
    "bench_collective_launchers.py": "launch: test_collective_launchers.py",
    "bench_collective_programs.py": "launch_ranks and the demo's ops: regret's run",
    "bench_collective_requests.py": "launch_ranks: regret's run",
    "bench_collective_tp.py": (
        "launch_ranks, private_cache_dir, the demo's ops and regret's statistics: regret's run"
    ),
    "bench_collective_shared_caches.py": (
        "launch, busy_machine, redis_server: test_collective_shared_caches.py"
    ),
}


def test_every_benchmark_and_soak_script_has_a_smoke_run():
    scripts = {
        path.name
        for pattern in ("bench_collective_*.py", "soak_*.py")
        for path in SCRIPTS.glob(pattern)
    }
    assert scripts == set(SMALLEST) | set(COVERED_BY)
    assert not set(SMALLEST) & set(COVERED_BY)


@pytest.mark.parametrize("script", sorted(SMALLEST))
def test_script_runs_at_its_smallest_size(script: str) -> None:
    arguments, table_line = SMALLEST[script]
    result = subprocess.run(
        [sys.executable, str(SCRIPTS / script), *arguments],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert table_line in result.stdout, result.stdout[-3000:]
