"""Every patch carries its tests, at upstream's paths, as an upstream PR would.

``apply-source`` commits the real series onto a git tree of the base wheel's
Python files, and each commit is read as a reviewer reads its PR: it changes
or adds test files under ``test/`` and names them in its ``Tests:`` field;
its tests import nothing that only this repository has (the helpers they
share are carried by the series, under ``torch/testing/_internal``); and the
tests of the last commit are this repository's tests, byte for byte.  A
pure test file of the series runs as upstream runs it, as a script.
"""

from __future__ import annotations

import ast
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torch_patch_stack import cli, queue, series

REPO = Path(__file__).resolve().parents[2]
# What tests may import besides the series' own tree: the standard library,
# and the packages a PyTorch test environment has.
THIRD_PARTY = {"torch", "pytest", "expecttest", "hypothesis", "numpy", "redis"}


@pytest.fixture(scope="module")
def applied(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A checkout at the base release with the series committed; its commits, oldest first."""
    layout = cli.Layout(REPO)
    tmp = tmp_path_factory.mktemp("source")
    checkout = tmp / "pytorch"
    shutil.copytree(
        layout.pristine_tree(None),
        checkout,
        ignore=shutil.ignore_patterns(".extracted-from"),
    )
    queue.git(checkout, "init", "-q")
    queue.git(checkout, "add", "-A")
    queue.git(checkout, "commit", "-qm", "base")
    assert cli.main(["--repo", str(REPO), "apply-source", str(checkout)]) == 0
    commits = queue.git(
        checkout,
        "rev-list",
        "--reverse",
        "HEAD~" + str(len(series.read_series(layout.patches))) + "..HEAD",
    ).split()
    return checkout, commits


def _changed(checkout: Path, commit: str) -> list[str]:
    return queue.git(checkout, "show", "--name-only", "--format=", commit).split()


def _tests_field(checkout: Path, commit: str) -> list[str]:
    message = queue.git(checkout, "log", "-1", "--format=%B", commit)
    patch = series.patch_from_commit("x.patch", message, "")
    return shlex.split(patch.fields.get("Tests", ""))


def test_every_commit_carries_tests_it_names(applied):
    checkout, commits = applied
    for commit in commits:
        tests = [
            path for path in _changed(checkout, commit) if series.is_test_file(path)
        ]
        subject = queue.git(checkout, "log", "-1", "--format=%s", commit).strip()
        assert tests, f"{subject!r} carries no test"
        assert set(tests) <= set(_tests_field(checkout, commit)), subject


def _is_stdlib(name: str) -> bool:
    return name in sys.stdlib_module_names or name == "__future__"


def _unresolved_imports(checkout: Path, commit: str, path: str) -> list[str]:
    text = queue.git(checkout, "show", f"{commit}:{path}")
    tree_files = set(
        queue.git(checkout, "ls-tree", "-r", "--name-only", commit).split()
    )
    problems = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if _is_stdlib(top) or (top in THIRD_PARTY and top != "torch"):
                continue
            # A test module beside it, in the same commit, as upstream's
            # test files import each other.
            if f"{path.rpartition('/')[0]}/{name.replace('.', '/')}.py" in tree_files:
                continue
            module = name.replace(".", "/")
            if top == "torch" and (
                f"{module}.py" in tree_files
                or f"{module}/__init__.py" in tree_files
                or not _ours(module)
            ):
                continue
            problems.append(f"{path}: import {name}")
    return problems


def _ours(module: str) -> bool:
    """Whether ``module`` (a path without .py) is one this repository adds to torch."""
    overlay = REPO / "torch_overlay"
    return (overlay / f"{module}.py").is_file() or (overlay / module).is_dir()


def test_tests_import_only_what_their_commit_carries(applied):
    checkout, commits = applied
    problems = []
    for commit in commits:
        files = queue.git(checkout, "ls-tree", "-r", "--name-only", commit).split()
        for path in files:
            if series.is_test_file(path):
                problems += _unresolved_imports(checkout, commit, path)
    assert problems == []


def test_last_commit_holds_this_repositorys_tests_byte_for_byte(applied):
    checkout, _ = applied
    carried = [path.as_posix() for path in series.carried_test_files(checkout)]
    assert carried == [path.as_posix() for path in series.carried_test_files(REPO)]
    for path in carried:
        assert (checkout / path).read_bytes() == (REPO / path).read_bytes(), path


def test_a_test_file_runs_as_upstream_runs_it(applied):
    checkout, _ = applied
    # Pure unit tests: the installed (whole) stack runs the file as a script,
    # from the checkout, with neither this repository nor a conftest.py on its path.
    # Without CI: under it, run_tests writes XML reports through xmlrunner,
    # which upstream's CI installs and this repository's does not.
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in ("PYTHONPATH", "CI")
    }
    result = subprocess.run(
        [sys.executable, "test/inductor/test_collective_rules.py", "-k", "Noise"],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Ran " in result.stderr and "OK" in result.stderr
