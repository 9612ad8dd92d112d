"""Every script of ``scripts/`` starts: ``python SCRIPT --help`` exits 0.

The benchmarks, soaks and repros are not run by the suite (they take minutes
to hours), but they import shared helpers from each other and from
``torch.testing._internal``; a helper moved or renamed must not leave a script that
fails at its first line.  ``--help`` imports the script's modules and parses
its arguments, and runs nothing else.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[2] / "scripts").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_script_starts(script: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(script), "--help"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage" in result.stdout.lower(), result.stdout[-2000:]
