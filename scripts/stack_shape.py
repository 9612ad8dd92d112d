#!/usr/bin/env python3
"""The stack's shape as issue 46 measures it: one table, from the tree alone.

Reads ``torch_overlay/`` with ``ast`` and ``patches/`` as text (no torch is
imported), and prints, for each measure of issue 46's targets, today's value
and where it comes from:

* overlay lines, the largest module and the longest function;
* reads of other threads' frames (``_current_frames``, ``f_locals``,
  ``f_back``) and the places that start a thread;
* uses of ``_world`` and the distinct private c10d names the overlay uses;
* the longest patch header (the lines before the first diff).

Ruff's findings under upstream's configuration are ``scripts/lint.sh``'s
(``ruff.toml`` is upstream's ``[tool.ruff]``), and CI's time is CI's.

  python scripts/stack_shape.py
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
OVERLAY = ROOT / "torch_overlay"
FRAME_READS = re.compile(r"\b(_current_frames|f_locals|f_back)\b")
# A private name reached through c10d's Python or C++ module.
PRIVATE_C10D = re.compile(
    r"\b(?:distributed_c10d|_distributed_c10d|c10d|Backend)\.(_[A-Za-z]\w*)"
)
C10D_MODULES = ("torch.distributed.distributed_c10d", "torch._C._distributed_c10d")


def _modules() -> list[Path]:
    return sorted(OVERLAY.rglob("*.py"))


def _relative(path: Path) -> str:
    # The file name alone: the overlay's module names are unique.
    return path.name


def _private_c10d_names(tree: ast.Module, text: str) -> set[str]:
    names = set(PRIVATE_C10D.findall(text))
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


def measure() -> list[tuple[str, str, str]]:
    """(measure, value, where) rows."""
    total = 0
    largest = (0, "")
    longest = (0, "")
    frame_reads: list[str] = []
    thread_starts: list[str] = []
    world: list[str] = []
    private: dict[str, set[str]] = {}
    for path in _modules():
        text = path.read_text()
        lines = text.splitlines()
        total += len(lines)
        largest = max(largest, (len(lines), _relative(path)))
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                longest = max(longest, (length, f"{_relative(path)}:{node.name}"))
            if _is_thread_start(node):
                thread_starts.append(f"{_relative(path)}:{node.lineno}")
        for number, line in enumerate(lines, 1):
            where = f"{_relative(path)}:{number}"
            frame_reads.extend(where for _ in FRAME_READS.findall(line))
            world.extend(where for _ in re.findall(r"\b_world\b", line))
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
    return [
        ("overlay lines (torch_overlay/**/*.py)", f"{total:,}", f"{len(_modules())} files"),
        ("largest overlay module", str(largest[0]), largest[1]),
        ("longest function", str(longest[0]), longest[1]),
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
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    print("| measure | value | where |")
    print("| --- | --- | --- |")
    for row in measure():
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
