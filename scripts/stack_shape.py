#!/usr/bin/env python3
"""The stack's shape as issues 46 and 55 measure it: one table, from the tree alone.

Reads ``torch_overlay/`` with ``ast`` and ``patches/`` as text (no torch is
imported), and prints, for each measure of the issues' targets, today's
value and where it comes from:

* overlay lines, and those of them that are code (no docstring, comment or
  blank line), for the whole stack and for the upstream series alone (the
  modules as the last ``Forwarded: no`` patch leaves them); helpers for tests
  (``torch/testing/``) are tests, not counted; the largest module, class and
  function;
* the patches that carry their tests (write a file under ``test/``);
* the store connections the overlay opens (``TCPStore(``, ``PrefixStore(``,
  ``.clone()`` of a store);
* the lines that later patches remove from modules that earlier patches of
  the series introduced (rework), and the series' first patch;
* reads of other threads' frames (``_current_frames``, ``f_locals``,
  ``f_back``) and the places that start a thread;
* uses of ``_world`` and the distinct private c10d names the overlay uses;
* the longest patch header (the lines before the first diff).

``--by-guarantee`` prints instead where the overlay's lines go: its modules
grouped by the guarantee of ``docs/design.md`` they carry, each group's code,
prose (docstrings and comments) and blank lines.

Ruff's findings under upstream's configuration are ``scripts/lint.sh``'s
(``ruff.toml`` is upstream's ``[tool.ruff]``), and CI's time is CI's.

  python scripts/stack_shape.py [--by-guarantee]
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from torch_patch_stack import overlay, series, unified_diff

OVERLAY = ROOT / "torch_overlay"
FRAME_READS = re.compile(r"\b(_current_frames|f_locals|f_back)\b")
# A private name reached through c10d's Python or C++ module.
PRIVATE_C10D = re.compile(
    r"\b(?:distributed_c10d|_distributed_c10d|c10d|Backend)\.(_[A-Za-z]\w*)"
)
C10D_MODULES = ("torch.distributed.distributed_c10d", "torch._C._distributed_c10d")
# Private methods of c10d's ProcessGroup and Backend objects, reached through
# a group or backend the overlay holds (no module name to match).
PRIVATE_GROUP_METHODS = re.compile(
    r"\.(_get_backend|_get_sequence_number_for_group|_set_default_timeout)\("
)
STORE_CONNECTIONS = re.compile(r"\b(?:TCPStore|PrefixStore)\(|\bstore\w*\.clone\(\)")


# What each module is there for: a guarantee of docs/design.md ("What every
# rank agrees on") or the Inductor side that serves them.
GUARANTEES = {
    "one decision on every rank: screening, interleaved timing, the rules": (
        "types.py", "decisions.py", "rules.py", "timing.py", "groups.py",
        "session.py", "benchmarker.py",
    ),
    "nothing hangs: the join and agreement on failures, on the channel": (
        "join.py", "failures.py",
    ),
    "a candidate costs only itself: benchmark channels, known crashes": (
        "channels.py", "channel_builder.py", "known_crashes.py", "gloo_hazards.py",
    ),
    "caches: agreed decisions kept, cache hits and keys": (
        "decision_cache.py", "cache_hits.py", "custom_op_fingerprint.py",
    ),
    "observable: traces, TORCH_LOGS, warnings": ("reporting.py",),
    "V1: Inductor's choices as candidates, the settings, both packages": (
        "choices.py", "collective_graphs.py", "settings.py", "__init__.py",
    ),
    "V2: deferred to the scheduler, timed with the epilogue": (
        "deferral.py", "deferred_tuning.py", "epilogue.py", "inlining.py",
    ),
    "the implementation library (0019, optional)": ("collective_implementations.py",),
}  # fmt: skip


def _kinds_of_lines(text: str) -> dict[str, int]:
    """How many of ``text``'s lines are code, prose (docstrings, comments) and blank."""
    lines = text.splitlines()
    kinds = ["blank" if not line.strip() else "code" for line in lines]
    for number, line in enumerate(lines):
        if line.lstrip().startswith("#"):
            kinds[number] = "prose"
    documented = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, documented) and ast.get_docstring(node) is not None:
            first = node.body[0]
            for number in range(first.lineno - 1, first.end_lineno or first.lineno):
                kinds[number] = "prose"
    return {kind: kinds.count(kind) for kind in ("code", "prose", "blank")}


def by_guarantee() -> list[tuple[str, str, int, int, int]]:
    """(guarantee, modules, code, prose, blank) rows, every overlay module in one."""
    placed = {name for names in GUARANTEES.values() for name in names}
    unplaced = sorted({path.name for path in _modules()} - placed)
    if unplaced:
        raise SystemExit(f"modules in no group of GUARANTEES: {unplaced}")
    rows = []
    for guarantee, names in GUARANTEES.items():
        total = {"code": 0, "prose": 0, "blank": 0}
        for path in _modules():
            if path.name in names:
                for kind, count in _kinds_of_lines(path.read_text()).items():
                    total[kind] += count
        rows.append((guarantee, ", ".join(names), *total.values()))
    return rows


def _modules() -> list[Path]:
    # Helpers for tests (torch/testing/) are tests, counted with them.
    return sorted(path for path in OVERLAY.rglob("*.py") if "testing" not in path.parts)


def upstream_series() -> tuple[int, int, int, int]:
    """Overlay lines and code lines as the last ``Forwarded: no`` patch leaves
    them, its patch count, and how many patches of the series carry tests."""
    patches = series.read_series(ROOT / "patches")
    upstream = [patch.fields["Forwarded"] == "no" for patch in patches]
    last = max(index for index, is_upstream in enumerate(upstream) if is_upstream)
    modules = {
        name: text
        for name, text in overlay.states(patches, OVERLAY)[last].items()
        if name.endswith(".py")
        and name.startswith("torch/")
        and "/testing/" not in name
    }
    with_tests = sum(
        any(series.is_test_file(name) for name in patch.overlay_modules)
        or any(
            series.is_test_file(file_diff.path)
            for file_diff in unified_diff.parse(patch.diff)
        )
        for patch in patches
    )
    return (
        sum(len(text.splitlines()) for text in modules.values()),
        sum(_kinds_of_lines(text)["code"] for text in modules.values()),
        last + 1,
        with_tests,
    )


def _relative(path: Path) -> str:
    # The file name alone: the overlay's module names are unique.
    return path.name


def _private_c10d_names(tree: ast.Module, text: str) -> set[str]:
    names = set(PRIVATE_C10D.findall(text)) | set(PRIVATE_GROUP_METHODS.findall(text))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in C10D_MODULES:
            names.update(a.name for a in node.names if a.name.startswith("_"))
    return names


def _is_thread_start(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name in ("Thread", "Timer")


def rework() -> tuple[int, dict[str, int]]:
    """Lines that patches remove from overlay modules an earlier patch introduced.

    The total, and the count per patch (by number).
    """
    introduced: set[str] = set()
    removed: dict[str, int] = {}
    for patch in sorted((ROOT / "patches").glob("*.patch")):
        text = patch.read_text()
        current = None
        for line in text.splitlines():
            if line.startswith("diff --git a/"):
                current = line.split(" b/", 1)[1]
            elif line.startswith("-") and not line.startswith("---"):
                # Code only: a test file's diffs are its tests growing.
                if current in introduced and not series.is_test_file(current):
                    removed[patch.name[:4]] = removed.get(patch.name[:4], 0) + 1
        # The field, with its continuation lines (indented by one space).
        overlay = re.search(r"^Overlay: (.*(?:\n .*)*)", text, re.MULTILINE)
        if overlay:
            introduced.update(
                name.strip() for name in overlay.group(1).split(",") if name.strip()
            )
    return sum(removed.values()), removed


def measure() -> list[tuple[str, str, str]]:
    """(measure, value, where) rows."""
    total = 0
    code = 0
    largest = (0, "")
    largest_class = (0, "")
    longest = (0, "")
    connections: list[str] = []
    frame_reads: list[str] = []
    thread_starts: list[str] = []
    world: list[str] = []
    private: dict[str, set[str]] = {}
    for path in _modules():
        text = path.read_text()
        lines = text.splitlines()
        total += len(lines)
        code += _kinds_of_lines(text)["code"]
        largest = max(largest, (len(lines), _relative(path)))
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                largest_class = max(largest_class, (length, node.name))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                longest = max(longest, (length, f"{_relative(path)}:{node.name}"))
            if _is_thread_start(node):
                thread_starts.append(f"{_relative(path)}:{node.lineno}")
        for number, line in enumerate(lines, 1):
            where = f"{_relative(path)}:{number}"
            frame_reads.extend(where for _ in FRAME_READS.findall(line))
            world.extend(where for _ in re.findall(r"\b_world\b", line))
            connections.extend(where for _ in STORE_CONNECTIONS.findall(line))
        for name in _private_c10d_names(tree, text):
            private.setdefault(name, set()).add(path.name)
    headers = []
    for patch in sorted((ROOT / "patches").glob("*.patch")):
        lines = patch.read_text().splitlines()
        before = next(
            (i for i, line in enumerate(lines) if line.startswith("diff --git")),
            len(lines),
        )
        headers.append((before, patch.name[:4]))
    header, header_patch = max(headers)
    reworked, by_patch = rework()
    upstream_total, upstream_code, upstream_count, with_tests = upstream_series()
    patch_count = len(series.read_series(ROOT / "patches"))
    first = sorted((ROOT / "patches").glob("*.patch"))[0]
    subject = first.read_text().splitlines()[0].removeprefix("Subject: ")
    return [
        ("overlay lines (torch_overlay/**/*.py)", f"{total:,}", f"{len(_modules())} files"),
        ("overlay code lines (no docstring, comment or blank line)", f"{code:,}", "-"),
        (
            "overlay lines / code lines of the upstream series",
            f"{upstream_total:,} / {upstream_code:,}",
            f"after its last Forwarded: no patch, {upstream_count:04d}",
        ),
        ("patches that carry their tests", f"{with_tests} of {patch_count}", "-"),
        ("largest overlay module", str(largest[0]), largest[1]),
        ("largest class", str(largest_class[0]), largest_class[1]),
        ("longest function", str(longest[0]), longest[1]),
        (
            "store connections the overlay opens",
            str(len(connections)),
            ", ".join(connections) or "-",
        ),
        (
            "lines later patches remove from modules the series introduced",
            str(reworked),
            ", ".join(f"{n}: {count}" for n, count in sorted(by_patch.items())) or "-",
        ),
        ("the series' first patch", first.name[:4], subject),
        (
            "reads of other threads' frames",
            str(len(frame_reads)),
            ", ".join(frame_reads) or "-",
        ),
        (
            "places that start a thread",
            str(len(thread_starts)),
            ", ".join(thread_starts) or "-",
        ),
        ("`_world` in the overlay", str(len(world)), ", ".join(world) or "-"),
        (
            "private c10d names used",
            f"{len(private)} distinct",
            ", ".join(sorted(private)) or "-",
        ),
        ("longest patch header (lines before the diff)", str(header), header_patch),
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--by-guarantee", action="store_true")
    if parser.parse_args().by_guarantee:
        rows = by_guarantee()
        sums = [sum(row[column] for row in rows) for column in (2, 3, 4)]
        print("| guarantee | modules | code | prose | blank | lines |")
        print("| --- | --- | --- | --- | --- | --- |")
        for guarantee, names, *counts in [*rows, ("all", "", *sums)]:
            cells = [f"{count:,}" for count in (*counts, sum(counts))]
            print(f"| {guarantee} | {names} | " + " | ".join(cells) + " |")
        return
    print("| measure | value | where |")
    print("| --- | --- | --- |")
    for row in measure():
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
