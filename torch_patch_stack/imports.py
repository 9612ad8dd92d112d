"""The import graph of the overlay modules: no cycles, no imports inside functions.

``python scripts/check_imports.py`` (run by ``scripts/lint.sh``) parses every
``.py`` file under ``torch_overlay/torch/`` with :mod:`ast` (nothing is
imported, torch is not needed) and builds the graph of imports among the
overlay modules.  A module is *ours* when its dotted name is a file under
``torch_overlay/``: ``torch._inductor.runtime.collective_store`` is
``torch_overlay/torch/_inductor/runtime/collective_store.py`` (a package,
``pkg/__init__.py``).  ``import a.b.c`` imports each of ``a``, ``a.b`` and
``a.b.c`` that is ours; ``from X import n`` (``X`` absolute or relative to
the importing module's package) imports ``X`` when it is ours and ``X.n``
when that is ours (a submodule); a module importing itself is no edge.
Imports made through ``importlib`` or ``__import__`` are not seen.

It reports two kinds of violation, both of which issue 32's layered design
removes:

- an *import cycle*: a chain of imports among overlay modules that comes
  back to where it started, printed ``a -> b -> a`` from the cycle's least
  module name, every elementary cycle once.  An import executed at run time
  is an edge, whether at module level or inside a function (an import
  deferred into a function to dodge a cycle still closes it); an import
  under ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``) is *not*: it
  never runs, and annotations may name a module that depends on this one.
- a *function-local import*: an import of an overlay module inside the body
  of a function (``def`` or ``async def``, at any depth: methods, nested
  functions, classes within functions), printed ``path:line: module``.  One
  under ``if TYPE_CHECKING:`` inside a function is not one (it never runs).

Violations known when the check was introduced are listed in a baseline
file (``scripts/import-baseline.txt``), one per line, ``#`` comments and
blank lines ignored::

    cycle: a -> b -> a
    local: torch_overlay/torch/x.py: torch.y

A ``local:`` line names the file and the module, not the line number, so
that edits elsewhere in the file do not disturb it; one line stands for one
import (a file importing the same module in two functions has two equal
lines).  The check fails (exit status 1) on any violation that the baseline
does not list, and on any baseline line that no longer occurs: the baseline
only shrinks, as the code is fixed.  Exit status 2: a file does not parse,
or the baseline has a malformed line.
"""

from __future__ import annotations

import argparse
import ast
import collections
import dataclasses
import sys
from pathlib import Path


REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BASELINE = "scripts/import-baseline.txt"


class ImportCheckError(Exception):
    """A source file or the baseline cannot be read."""


@dataclasses.dataclass(frozen=True)
class Import:
    """One import of an overlay module by an overlay module."""

    importer: str  # dotted name
    imported: str  # dotted name
    path: str  # the importer's file, relative to the repository root
    line: int
    type_checking: bool  # under ``if TYPE_CHECKING:``: no edge for cycles
    in_function: bool  # inside a function body

    def location(self) -> str:
        return f"{self.path}:{self.line}: {self.imported}"

    def baseline_line(self) -> str:
        return f"local: {self.path}: {self.imported}"


@dataclasses.dataclass
class Graph:
    modules: dict[str, Path]  # dotted name -> file
    imports: list[Import]

    @property
    def edges(self) -> set[tuple[str, str]]:
        """The (importer, imported) pairs of imports that run: the graph of cycles."""
        return {
            (item.importer, item.imported)
            for item in self.imports
            if not item.type_checking
        }

    @property
    def type_checking_edges(self) -> set[tuple[str, str]]:
        """Pairs imported only under ``if TYPE_CHECKING:``."""
        every = {(item.importer, item.imported) for item in self.imports}
        return every - self.edges

    @property
    def local_imports(self) -> list[Import]:
        """Function-local imports that run, in file and line order."""
        return sorted(
            (
                item
                for item in self.imports
                if item.in_function and not item.type_checking
            ),
            key=lambda item: (item.path, item.line, item.imported),
        )


def module_name(relative: Path) -> str:
    """The dotted name of a file relative to the overlay root (``torch/a/b.py``: ``torch.a.b``)."""
    parts = list(relative.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def overlay_modules(overlay_root: Path) -> dict[str, Path]:
    """Every ``.py`` file under ``overlay_root/torch``, by dotted name."""
    return {
        module_name(path.relative_to(overlay_root)): path
        for path in sorted((overlay_root / "torch").rglob("*.py"))
        if "__pycache__" not in path.parts
    }


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _imported_names(
    node: ast.Import | ast.ImportFrom, name: str, path: Path
) -> list[str]:
    """The dotted names an import statement may import (ours or not)."""
    if isinstance(node, ast.Import):
        names = []
        for alias in node.names:
            parts = alias.name.split(".")
            names += [".".join(parts[: end + 1]) for end in range(len(parts))]
        return names
    base = node.module or ""
    if node.level:
        package = _package_of(name, path).split(".")
        if node.level - 1 >= len(package):
            raise ImportCheckError(
                f"{path}:{node.lineno}: relative import beyond the top-level package"
            )
        anchor = ".".join(package[: len(package) - (node.level - 1)])
        base = f"{anchor}.{base}" if base else anchor
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def _walk(
    node: ast.AST, in_function: bool, type_checking: bool
) -> list[tuple[ast.Import | ast.ImportFrom, bool, bool]]:
    """Every import statement under ``node`` with its context."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool, bool]] = []
    if isinstance(node, ast.Import | ast.ImportFrom):
        return [(node, in_function, type_checking)]
    if isinstance(node, ast.If) and _is_type_checking(node.test):
        for statement in node.body:
            found += _walk(statement, in_function, True)
        for statement in node.orelse:
            found += _walk(statement, in_function, type_checking)
        return found
    inner = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    for child in ast.iter_child_nodes(node):
        found += _walk(child, inner, type_checking)
    return found


def build_graph(overlay_root: Path, repo_root: Path) -> Graph:
    """Parse every overlay module and collect its imports of overlay modules."""
    modules = overlay_modules(overlay_root)
    imports = []
    for name, path in modules.items():
        try:
            tree = ast.parse(path.read_text(), filename=str(path))
        except SyntaxError as error:
            raise ImportCheckError(f"{path}: does not parse: {error}") from None
        shown = (
            path.relative_to(repo_root).as_posix()
            if path.is_relative_to(repo_root)
            else path.as_posix()
        )
        for node, in_function, type_checking in _walk(tree, False, False):
            for target in dict.fromkeys(_imported_names(node, name, path)):
                if target in modules and target != name:
                    imports.append(
                        Import(
                            name, target, shown, node.lineno, type_checking, in_function
                        )
                    )
    return Graph(modules, imports)


def cycles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """Every elementary cycle of the graph, each from its least node, sorted.

    A cycle ``[a, b, a]`` starts and ends at its least node, so each is
    found once: from each start, paths go only through greater nodes.
    """
    successors: dict[str, list[str]] = collections.defaultdict(list)
    for source, target in sorted(edges):
        successors[source].append(target)
    found = []
    for start in sorted(successors):
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for target in successors[node]:
                if target == start:
                    found.append([*path, start])
                elif target > start and target not in path:
                    stack.append((target, [*path, target]))
    return sorted(found)


def cyclic_groups(edges: set[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, each sorted.

    Every cycle lies within one; issue 32 counts its "circles" this way.
    """
    successors: dict[str, set[str]] = collections.defaultdict(set)
    for source, target in edges:
        successors[source].add(target)

    def reachable(start: str) -> set[str]:
        seen: set[str] = set()
        todo = [start]
        while todo:
            for target in successors[todo.pop()]:
                if target not in seen:
                    seen.add(target)
                    todo.append(target)
        return seen

    reach = {node: reachable(node) for node in sorted(successors)}
    groups = {
        tuple(
            sorted(
                other
                for other in reach
                if node in reach[other] and other in reach[node]
            )
        )
        for node in reach
        if node in reach[node]
    }
    return sorted(list(group) for group in groups if len(group) > 1)


def render_cycle(cycle: list[str]) -> str:
    return " -> ".join(cycle)


def read_baseline(path: Path) -> list[str]:
    """The baseline's violation lines, comments and blank lines left out."""
    if not path.is_file():
        raise ImportCheckError(f"{path}: no such baseline file")
    lines = []
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if not line.startswith(("cycle: ", "local: ")):
            raise ImportCheckError(
                f"{path}:{number}: expected 'cycle: a -> b -> a' or "
                f"'local: PATH: MODULE', got {raw!r}"
            )
        lines.append(line)
    return lines


@dataclasses.dataclass
class Report:
    lines: list[str]
    failed: bool


def check(graph: Graph, baseline: list[str], baseline_name: str) -> Report:
    """Compare the graph's violations with the baseline; the report to print."""
    remaining = collections.Counter(baseline)
    lines = []
    new = 0

    def known(key: str) -> bool:
        if remaining[key] > 0:
            remaining[key] -= 1
            return True
        return False

    found_cycles = cycles(graph.edges)
    for cycle in found_cycles:
        key = f"cycle: {render_cycle(cycle)}"
        is_known = known(key)
        new += not is_known
        lines.append(key + ("  [baselined]" if is_known else "  [NEW]"))
    local = graph.local_imports
    for item in local:
        is_known = known(item.baseline_line())
        new += not is_known
        lines.append(
            f"local import: {item.location()}"
            + ("  [baselined]" if is_known else "  [NEW]")
        )
    stale = [line for line, count in remaining.items() for _ in range(count)]
    lines += [
        f"error: {baseline_name} lists a violation that no longer occurs; "
        f"delete its line: {line}"
        for line in stale
    ]
    if new:
        lines.append(
            f"error: {new} import-graph violation(s) marked [NEW]: "
            "break the cycle or move the import to module level; "
            f"{baseline_name} may only shrink"
        )
    tc_only = len(graph.type_checking_edges)
    lines.append(
        f"import graph: {len(graph.modules)} overlay modules, "
        f"{len(graph.edges)} import edges (+{tc_only} under TYPE_CHECKING only), "
        f"{len(found_cycles)} cycles "
        f"(strongly connected components: {len(cyclic_groups(graph.edges))}), "
        f"{len(local)} function-local imports; "
        f"{len(baseline) - len(stale)} of the {len(found_cycles) + len(local)} "
        "violations baselined"
    )
    return Report(lines, failed=bool(new or stale))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="check_imports",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--repo",
        default=str(REPO_ROOT),
        help="repository root (default: this checkout)",
    )
    parser.add_argument(
        "--baseline",
        help=f"the known violations (default: {DEFAULT_BASELINE} under --repo)",
    )
    args = parser.parse_args(argv)
    repo = Path(args.repo).resolve()
    baseline_path = Path(args.baseline) if args.baseline else repo / DEFAULT_BASELINE
    try:
        graph = build_graph(repo / "torch_overlay", repo)
        baseline = read_baseline(baseline_path)
    except ImportCheckError as error:
        print(f"check_imports: error: {error}", file=sys.stderr)
        return 2
    shown = (
        baseline_path.relative_to(repo).as_posix()
        if baseline_path.is_absolute() and baseline_path.is_relative_to(repo)
        else str(baseline_path)
    )
    report = check(graph, baseline, shown)
    print("\n".join(report.lines))
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
