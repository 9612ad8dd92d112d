"""Why pip refuses the base release: the constraint, where it is configured, the remedy.

``effective_constraints`` reads ``pip config debug`` output as pip resolves
the ``constraint`` option (a later configuration file over an earlier one, a
command's section over ``[global]``, ``PIP_CONSTRAINT`` over every file);
``refusing_lines`` names the lines of a constraints file that exclude a
release (following includes); ``explain_refusal`` runs this Python's pip
under a pip configuration made for the test (``PIP_CONFIG_FILE``) and must
name the constraint, its file and line, the configuration that names the
file, and a remedy that works: with it, pip accepts the release.
"""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from torch_patch_stack.pip_constraints import (
    effective_constraints,
    explain_refusal,
    REMEDY_VARIABLE,
    refusing_lines,
)

if TYPE_CHECKING:
    from pathlib import Path

DEBUG = """\
env_var:
  PIP_FIND_LINKS='/opt/wheels'
env:
global:
  /etc/xdg/pip/pip.conf, exists: True
    global.constraint: /etc/xdg/pip/constraints.txt
  /etc/pip.conf, exists: True
    global.cert: /etc/ssl/certs/ca-certificates.crt
site:
  /repo/.venv/pip.conf, exists: False
user:
  /root/.config/pip/pip.conf, exists: True
    global.find-links: /opt/wheels
"""


def test_a_site_wide_configuration_file():
    source = effective_constraints(DEBUG)
    assert source is not None
    assert source.files == ("/etc/xdg/pip/constraints.txt",)
    assert "'global.constraint' in /etc/xdg/pip/pip.conf" in source.where
    assert "site-wide" in source.where


def test_precedence_of_files_sections_and_the_variable():
    user = DEBUG.replace(
        "    global.find-links: /opt/wheels",
        "    global.find-links: /opt/wheels\n    install.constraint: /home/c.txt",
    )
    # The user's file over the site-wide one, for install; not for download.
    assert effective_constraints(user, "install").files == ("/home/c.txt",)
    assert effective_constraints(user, "download").files == (
        "/etc/xdg/pip/constraints.txt",
    )
    variable = user.replace(
        "env_var:\n", "env_var:\n  PIP_CONSTRAINT='/a.txt /b.txt'\n"
    )
    source = effective_constraints(variable)
    assert source.files == ("/a.txt", "/b.txt")
    assert source.where == "the environment variable PIP_CONSTRAINT"
    # An empty PIP_CONSTRAINT does not replace the files (pip ignores it too).
    empty = user.replace("env_var:\n", "env_var:\n  PIP_CONSTRAINT=''\n")
    assert effective_constraints(empty).files == ("/home/c.txt",)
    assert effective_constraints(DEBUG.replace("constraint", "nothing")) is None


def test_refusing_lines(tmp_path: Path):
    nested = tmp_path / "nested.txt"
    nested.write_text("Torch < 2.15\n")
    caps = tmp_path / "constraints.txt"
    caps.write_text(
        "# a comment naming torch<=1.0\n"
        "torchvision<=0.29.1\n"
        "torch<=2.14.1  # the machine's cap\n"
        "torch>=2.0\n"
        f"-c {nested.name}\n"
        "torch==2.15.0 ; python_version < '3.9'\n"
    )
    found = [
        (line.file, line.number)
        for line in refusing_lines(str(caps), "torch", "2.15.0")
    ]
    assert found == [(str(caps), 3), (str(nested), 1), (str(caps), 6)]
    assert [line.number for line in refusing_lines(str(caps), "torch", "2.14.0")] == [6]
    assert refusing_lines(str(tmp_path / "missing.txt"), "torch", "2.15.0") == []
    assert refusing_lines("https://example.org/c.txt", "torch", "2.15.0") == []


@pytest.fixture
def capped(tmp_path: Path, monkeypatch):
    """This Python's pip configured (PIP_CONFIG_FILE) with a constraints file capping torch."""
    caps = tmp_path / "constraints.txt"
    caps.write_text("# the machine's cap\ntorch<=2.14.1\n")
    config = tmp_path / "pip.conf"
    config.write_text(f"[global]\nconstraint = {caps}\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    monkeypatch.delenv("PIP_CONSTRAINT", raising=False)
    return caps, config


def test_explains_a_cap_in_a_configuration_file(capped):
    caps, config = capped
    message = explain_refusal(
        sys.executable, "2.15.0", pip_error="ResolutionImpossible"
    )
    assert f"'torch<=2.14.1' (line 2 of {caps})" in message
    assert f"'global.constraint' in {config}" in message
    assert "PIP_CONFIG_FILE" in message
    assert f"{REMEDY_VARIABLE} ./scripts/bootstrap.sh" in message
    assert f"{caps}:2" in message
    assert "ResolutionImpossible" not in message  # the cause, not pip's words


def test_explains_a_cap_in_the_variable(capped, monkeypatch):
    caps, _ = capped
    monkeypatch.setenv("PIP_CONSTRAINT", str(caps))
    message = explain_refusal(sys.executable, "2.15.0")
    assert "through the environment variable PIP_CONSTRAINT" in message
    assert f"'torch<=2.14.1' (line 2 of {caps})" in message


def test_no_constraint_to_blame(capped, monkeypatch):
    monkeypatch.setenv("PIP_CONSTRAINT", "/dev/null")
    message = explain_refusal(
        sys.executable,
        "2.15.0",
        pip_error="Looking in links\nERROR: No matching distribution found for torch==2.15.0\n",
    )
    assert "no constraints file that pip reads excludes it" in message
    assert "No matching distribution found" in message


def test_the_remedy_lifts_the_cap(capped, tmp_path: Path, monkeypatch):
    # A wheel that pip can resolve offline: the cap refuses it, the remedy
    # makes pip accept it (a dry run: nothing is installed).
    wheel = tmp_path / "torch-2.15.0-py3-none-any.whl"
    _write_wheel(wheel)

    def dry_run() -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--dry-run",
                "--no-deps",
                "--no-index",
                "--ignore-installed",
                str(wheel),
            ],  # fmt: skip
            capture_output=True,
            text=True,
            check=False,
        )

    refused = dry_run()
    assert refused.returncode != 0
    assert "ResolutionImpossible" in refused.stderr
    monkeypatch.setenv("PIP_CONSTRAINT", "/dev/null")
    accepted = dry_run()
    assert accepted.returncode == 0, accepted.stderr
    assert "Would install torch-2.15.0" in accepted.stdout


def _write_wheel(path: Path) -> None:
    import zipfile

    dist_info = "torch-2.15.0.dist-info"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("torch_stub.py", "")
        archive.writestr(
            f"{dist_info}/METADATA",
            "Metadata-Version: 2.1\nName: torch\nVersion: 2.15.0\n",
        )
        archive.writestr(
            f"{dist_info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        archive.writestr(f"{dist_info}/RECORD", "")
