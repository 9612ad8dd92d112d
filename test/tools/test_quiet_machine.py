"""A ``quiet_machine`` test runs alone under CI's two streams (``test/conftest.py``).

Two pytest processes share a lock directory, as the suite and the prefixes'
tests do under ``.ci/run``: one runs short tests back to back, the other an
ordinary test beside them and then a quiet one.  Each test records when it
ran.  The quiet test overlaps none of the other stream's, which ran tests
before and after it, and the ordinary tests of the two streams do overlap
(the streams still run side by side).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path


CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

RECORDER = """
import os, time

def ran(name, seconds):
    start = time.time()
    time.sleep(seconds)
    with open(os.environ["RAN_LOG"], "a") as log:
        log.write(f"{name} {start} {time.time()}\\n")
"""

BUSY_STREAM = """
import pytest
from recorder import ran

@pytest.mark.parametrize("index", range(16))
def test_busy(index):
    ran(f"busy{index}", 0.4)
"""

QUIET_STREAM = """
import pytest
from recorder import ran

def test_ordinary():
    ran("ordinary", 2.0)

@pytest.mark.quiet_machine
def test_quiet():
    ran("quiet", 1.0)
"""


def test_a_quiet_test_overlaps_no_test_of_the_other_stream(tmp_path: Path) -> None:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    for name, text in (
        ("recorder.py", RECORDER),
        ("test_busy.py", BUSY_STREAM),
        ("test_quiet.py", QUIET_STREAM),
    ):
        (tmp_path / name).write_text(textwrap.dedent(text))
    (tmp_path / "locks").mkdir()
    env = {
        **os.environ,
        "COLLECTIVE_TESTS_LOCK_DIR": str(tmp_path / "locks"),
        "RAN_LOG": str(tmp_path / "ran.log"),
    }
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    busy = subprocess.Popen(
        [*command, "test_busy.py"], cwd=tmp_path, env=env, stdout=subprocess.PIPE
    )
    quiet = subprocess.run(
        [*command, "test_quiet.py"], cwd=tmp_path, env=env, capture_output=True
    )
    busy.communicate(timeout=120)
    assert (busy.returncode, quiet.returncode) == (0, 0), quiet.stdout
    spans = {}
    for line in (tmp_path / "ran.log").read_text().splitlines():
        name, start, end = line.split()
        spans[name] = (float(start), float(end))
    assert len(spans) == 18

    def overlaps(first: str, second: str) -> bool:
        return spans[first][0] < spans[second][1] and spans[second][0] < spans[first][1]

    busy_tests = [name for name in spans if name.startswith("busy")]
    assert not [name for name in busy_tests if overlaps("quiet", name)]
    # ... while the other stream ran tests before it and after it.
    assert min(spans[name][0] for name in busy_tests) < spans["quiet"][0]
    assert max(spans[name][1] for name in busy_tests) > spans["quiet"][1]
    assert [name for name in busy_tests if overlaps("ordinary", name)]
