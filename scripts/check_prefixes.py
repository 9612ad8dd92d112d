#!/usr/bin/env python3
"""Every prefix of the series stands alone: it imports, and passes its patch's tests.

The series goes upstream as a ghstack, one PR per patch, and each PR must
pass upstream CI on its own.  For stock torch (no patch) and for the series
up to each patch but the last (the whole stack is what ``scripts/test.sh``
tests), this script makes the prefix's torch package tree (``patchstack
prefix``: the installed torch, hard-linked, with the files the series writes
as the prefix leaves them, and the test files it carries under ``test/``),
imports Inductor and the prefix's overlay modules from it, and runs the
tests that the prefix's last patch names in its ``Tests:`` header field, in
the files as that prefix carries them, not as the last patch leaves them
(stock torch: ``STOCK_TESTS``, upstream's features for ordinary ops, from
this repository's test/).  The ``Tests:`` field must name every test file
the patch writes.  Prints a line per prefix with its wall time; exits 1 when
any prefix fails.

Run after ``./scripts/bootstrap.sh`` (it reads the installed torch of .venv):
  python scripts/check_prefixes.py [--keep]
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from torch_patch_stack import series, unified_diff


# Upstream's documented features for ordinary custom ops, which must pass on
# stock torch as they do on the stack.
STOCK_TESTS = ["test/inductor/test_custom_op_autotuning_features.py", "-k", "Upstream"]
IMPORTED = [
    "torch._inductor.compile_fx",
    "torch._inductor.select_algorithm",
    "torch._inductor.scheduler",
    "torch._inductor.codecache",
    "torch._inductor.kernel.custom_op",
]


def run(command: list[str], env: dict[str, str], cwd: Path = ROOT) -> tuple[bool, str]:
    result = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    return result.returncode == 0, (result.stdout + result.stderr).strip()


def _unnamed_tests(patch: series.Patch, tests: list[str], dest: Path) -> str:
    """Why ``tests`` (the patch's ``Tests:`` field) are not the patch's own, or ''."""
    named = {arg for arg in tests if arg.startswith("test/")}
    written = {
        file_diff.path
        for file_diff in unified_diff.parse(patch.diff)
        if series.is_test_file(file_diff.path)
    } | {name for name in patch.overlay_modules if series.is_test_file(name)}
    if not written:
        return "the patch carries no test file"
    if written - named:
        return (
            f"Tests: does not name the test files it writes: {sorted(written - named)}"
        )
    missing = sorted(path for path in named if not (dest / path).is_file())
    if missing:
        return f"Tests: names test files the prefix does not carry: {missing}"
    return ""


def installed_torch_dir() -> str:
    """The torch package directory of .venv, which every prefix's tree links from."""
    python = str(ROOT / ".venv" / "bin" / "python")
    probe = "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('torch').origin))"
    return subprocess.run(
        [python, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.strip()


def make_tree(count: int, torch_dir: str) -> tuple[Path, bool, str]:
    """The prefix's torch tree (``patchstack prefix``): its path, whether it was made, the output."""
    python = str(ROOT / ".venv" / "bin" / "python")
    dest = ROOT / "build" / "prefixes" / f"{count:04d}"
    made, output = run(
        [
            python,
            "scripts/patchstack.py",
            "prefix",
            "--upto",
            str(count),
            "--torch-dir",
            torch_dir,
            "--dest",
            str(dest),
        ],
        dict(os.environ),
    )
    return dest, made, output


def check_prefix(
    count: int,
    patches: list[series.Patch],
    keep: bool,
    tree: Future[tuple[Path, bool, str]],
) -> bool:
    python = str(ROOT / ".venv" / "bin" / "python")
    started = time.monotonic()
    dest, made, output = tree.result()
    name = "stock torch" if count == 0 else patches[count - 1].file_name
    if not made:
        print(f"FAILED {name}: the prefix's tree could not be made\n{output}")
        return False
    env = {**os.environ, "PYTHONPATH": str(dest)}
    modules = [
        module.removesuffix(".py").replace("/", ".")
        for patch in patches[:count]
        for module in patch.overlay_modules
        if not series.is_test_file(module)
    ]
    if count == 0:
        tests, test_root = STOCK_TESTS, ROOT
    else:
        tests = shlex.split(patches[count - 1].fields.get("Tests", ""))
        test_root = dest
        problem = _unnamed_tests(patches[count - 1], tests, dest)
        if problem:
            print(f"FAILED {name}: {problem}")
            return False
        # This repository's pytest plugin (the quiet-machine lock), never carried.
        shutil.copy(ROOT / "test" / "conftest.py", dest / "test" / "conftest.py")
    # One interpreter runs the prefix's tests and then imports its modules: a
    # second one would import torch again, some 7 s per prefix on CI.
    imports = "; ".join(f"import {module}" for module in IMPORTED + modules)
    # Every test file the prefix carries must at least be collected there,
    # not only those its last patch's Tests: run.
    collect = (
        f"pytest.main(['--collect-only', '-qq', '-p', 'no:cacheprovider', {str(dest / 'test')!r}])"
        if count
        else "0"
    )
    check = (
        f"import sys, torch; assert torch.__file__.startswith({str(dest)!r}); "
        f"import pytest; collected = {collect}; "
        "print('collect exit', int(collected), flush=True); "
        "status = collected or (pytest.main(sys.argv[1:]) if sys.argv[1:] else 0); "
        f"print('tests exit', int(status), flush=True); {imports}; sys.exit(status)"
    )
    pytest_args = (
        ["-q", "-p", "no:cacheprovider", f"--rootdir={test_root}", *tests]
        if tests
        else []
    )
    ok, output = run([python, "-c", check, *pytest_args], env, cwd=test_root)
    if not ok:
        failed = (
            "importing Inductor and its modules"
            if "tests exit 0" in output
            else shlex.join(tests)
            if "collect exit 0" in output
            else "collecting the test files it carries"
        )
        print(f"FAILED {name}: {failed}\n{output[-5000:]}")
        return False
    lines = output.splitlines()
    summary = lines[-2] if tests and len(lines) > 1 else "no tests named"
    if not keep:
        shutil.rmtree(dest, ignore_errors=True)
    print(
        f"ok     {name}: imports; {shlex.join(tests) or '-'}: {summary} "
        f"({time.monotonic() - started:.0f} s)",
        flush=True,
    )
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="keep build/prefixes/")
    parser.add_argument(
        "--only", type=int, action="append", help="check only this prefix (a count)"
    )
    args = parser.parse_args()
    patches = series.read_series(ROOT / "patches")
    counts = list(args.only or range(len(patches)))
    results = []
    # The next prefix's tree is made while this one's tests run: hard links,
    # which cost the disk, not the CPU the tests time on, and some 3 s a prefix.
    torch_dir = installed_torch_dir()
    with ThreadPoolExecutor(max_workers=1) as maker:
        tree = maker.submit(make_tree, counts[0], torch_dir)
        for position, count in enumerate(counts):
            current = tree
            if position + 1 < len(counts):
                tree = maker.submit(make_tree, counts[position + 1], torch_dir)
            results.append(check_prefix(count, patches, args.keep, current))
    if not all(results):
        sys.exit(1)


if __name__ == "__main__":
    main()
