"""The import graph of the overlay modules (``scripts/check_imports.py``).

Small synthetic ``torch_overlay/`` trees made for each case: a cycle
(relative and absolute imports), an import under ``if TYPE_CHECKING:``
(no edge for cycles), a function-local import, imports of modules that are
not ours, and a clean tree; then the baseline: what it lists passes, a
violation it does not list fails, and a line that no longer occurs fails.
The last test runs the check on this repository, as ``scripts/lint.sh`` does.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from torch_patch_stack import imports

if TYPE_CHECKING:
    import pytest

REPO = Path(__file__).resolve().parents[2]
RUNTIME = "torch_overlay/torch/_inductor/runtime"
A = "torch._inductor.runtime.a"
B = "torch._inductor.runtime.b"
C = "torch._inductor.c"


def _tree(root: Path, files: dict[str, str], baseline: str = "") -> Path:
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    (root / "baseline.txt").write_text(baseline)
    return root


def _check(root: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    status = imports.main(
        ["--repo", str(root), "--baseline", str(root / "baseline.txt")]
    )
    return status, capsys.readouterr().out.splitlines()


def test_a_clean_tree_passes(tmp_path, capsys):
    root = _tree(
        tmp_path,
        {
            f"{RUNTIME}/a.py": "import os\n\nimport torch\nfrom torch._inductor import config\n",
            f"{RUNTIME}/b.py": "from . import a\nfrom .a import VALUE\n",
            "torch_overlay/torch/_inductor/c.py": (
                "import torch._inductor.runtime.b\n"
                "from torch._inductor.runtime import a, b\n"
                "from .runtime.a import VALUE\n"
            ),
        },
    )
    assert _check(root, capsys) == (
        0,
        [
            "import graph: 3 overlay modules, 3 import edges (+0 under TYPE_CHECKING "
            "only), 0 cycles (strongly connected components: 0), 0 function-local "
            "imports; 0 of the 0 violations baselined"
        ],
    )


def test_a_cycle_fails_and_is_printed_from_its_least_module(tmp_path, capsys):
    root = _tree(
        tmp_path,
        {
            f"{RUNTIME}/a.py": "from torch._inductor.runtime.b import VALUE\n",
            f"{RUNTIME}/b.py": "import torch._inductor.c\n\nVALUE = 1\n",
            "torch_overlay/torch/_inductor/c.py": "from .runtime import a\n",
        },
    )
    assert _check(root, capsys) == (
        1,
        [
            f"cycle: {C} -> {A} -> {B} -> {C}  [NEW]",
            "error: 1 import-graph violation(s) marked [NEW]: break the cycle or "
            "move the import to module level; baseline.txt may only shrink",
            "import graph: 3 overlay modules, 3 import edges (+0 under TYPE_CHECKING "
            "only), 1 cycles (strongly connected components: 1), 0 function-local "
            "imports; 0 of the 1 violations baselined",
        ],
    )


def test_an_import_under_type_checking_is_no_edge_for_cycles(tmp_path, capsys):
    root = _tree(
        tmp_path,
        {
            f"{RUNTIME}/a.py": "from . import b\n",
            f"{RUNTIME}/b.py": (
                "import typing\n"
                "from typing import TYPE_CHECKING\n\n"
                "if TYPE_CHECKING:\n"
                "    from .a import Thing\n"
                "if typing.TYPE_CHECKING:\n"
                "    from torch._inductor.runtime import a\n"
                "else:\n"
                "    import os\n\n\n"
                "def f(x: Thing) -> None:\n"
                "    if TYPE_CHECKING:\n"
                "        from . import a\n"
            ),
        },
    )
    assert _check(root, capsys) == (
        0,
        [
            "import graph: 2 overlay modules, 1 import edges (+1 under TYPE_CHECKING "
            "only), 0 cycles (strongly connected components: 0), 0 function-local "
            "imports; 0 of the 0 violations baselined"
        ],
    )


def test_an_import_in_the_else_of_type_checking_is_an_edge(tmp_path, capsys):
    root = _tree(
        tmp_path,
        {
            f"{RUNTIME}/a.py": "from . import b\n",
            f"{RUNTIME}/b.py": (
                "from typing import TYPE_CHECKING\n\n"
                "if TYPE_CHECKING:\n"
                "    pass\n"
                "else:\n"
                "    from . import a\n"
            ),
        },
    )
    status, out = _check(root, capsys)
    assert status == 1
    assert out[0] == f"cycle: {A} -> {B} -> {A}  [NEW]"


def test_a_function_local_import_fails_and_closes_a_cycle(tmp_path, capsys):
    root = _tree(
        tmp_path,
        {
            f"{RUNTIME}/a.py": "from . import b\n",
            f"{RUNTIME}/b.py": (
                "class Runner:\n"
                "    async def run(self) -> None:\n"
                "        def inner() -> None:\n"
                "            from torch._inductor.runtime.a import VALUE\n"
                "\n"
                "        import os\n"
            ),
            "torch_overlay/torch/_inductor/c.py": (
                "def helper() -> None:\n    from .runtime import b\n"
            ),
        },
    )
    assert _check(root, capsys) == (
        1,
        [
            f"cycle: {A} -> {B} -> {A}  [NEW]",
            f"local import: torch_overlay/torch/_inductor/c.py:2: {B}  [NEW]",
            f"local import: {RUNTIME}/b.py:4: {A}  [NEW]",
            "error: 3 import-graph violation(s) marked [NEW]: break the cycle or "
            "move the import to module level; baseline.txt may only shrink",
            "import graph: 3 overlay modules, 3 import edges (+0 under TYPE_CHECKING "
            "only), 1 cycles (strongly connected components: 1), 2 function-local "
            "imports; 0 of the 3 violations baselined",
        ],
    )


CYCLIC = {
    f"{RUNTIME}/a.py": "from . import b\n",
    f"{RUNTIME}/b.py": (
        "def f() -> None:\n"
        "    from . import a\n\n\n"
        "def g() -> None:\n"
        "    from . import a\n"
    ),
}
BASELINE = f"""# known violations
cycle: {A} -> {B} -> {A}
local: {RUNTIME}/b.py: {A}  # f
local: {RUNTIME}/b.py: {A}  # g
"""


def test_baselined_violations_pass(tmp_path, capsys):
    root = _tree(tmp_path, CYCLIC, BASELINE)
    assert _check(root, capsys) == (
        0,
        [
            f"cycle: {A} -> {B} -> {A}  [baselined]",
            f"local import: {RUNTIME}/b.py:2: {A}  [baselined]",
            f"local import: {RUNTIME}/b.py:6: {A}  [baselined]",
            "import graph: 2 overlay modules, 2 import edges (+0 under TYPE_CHECKING "
            "only), 1 cycles (strongly connected components: 1), 2 function-local "
            "imports; 3 of the 3 violations baselined",
        ],
    )


def test_a_violation_beyond_the_baseline_fails(tmp_path, capsys):
    # A third import of the same module in the same file: one more than listed.
    files = dict(CYCLIC)
    files[f"{RUNTIME}/b.py"] += "\n\ndef h() -> None:\n    from . import a\n"
    root = _tree(tmp_path, files, BASELINE)
    status, out = _check(root, capsys)
    assert status == 1
    assert out[1:4] == [
        f"local import: {RUNTIME}/b.py:2: {A}  [baselined]",
        f"local import: {RUNTIME}/b.py:6: {A}  [baselined]",
        f"local import: {RUNTIME}/b.py:10: {A}  [NEW]",
    ]
    assert out[-1].endswith("3 of the 4 violations baselined")


def test_a_baseline_line_that_no_longer_occurs_fails(tmp_path, capsys):
    files = {
        f"{RUNTIME}/a.py": "from . import b\n",
        f"{RUNTIME}/b.py": "def f() -> None:\n    from . import a\n",
    }
    root = _tree(tmp_path, files, BASELINE)
    assert _check(root, capsys) == (
        1,
        [
            f"cycle: {A} -> {B} -> {A}  [baselined]",
            f"local import: {RUNTIME}/b.py:2: {A}  [baselined]",
            "error: baseline.txt lists a violation that no longer occurs; delete "
            f"its line: local: {RUNTIME}/b.py: {A}",
            "import graph: 2 overlay modules, 2 import edges (+0 under TYPE_CHECKING "
            "only), 1 cycles (strongly connected components: 1), 1 function-local "
            "imports; 2 of the 2 violations baselined",
        ],
    )


def test_a_malformed_baseline_line_is_an_error(tmp_path, capsys):
    root = _tree(tmp_path, CYCLIC, f"{RUNTIME}/b.py:2: {A}\n")
    assert (
        imports.main(["--repo", str(root), "--baseline", str(root / "baseline.txt")])
        == 2
    )
    assert "baseline.txt:1: expected 'cycle: a -> b -> a' or 'local: PATH: MODULE'" in (
        capsys.readouterr().err
    )


def test_every_elementary_cycle_once():
    edges = {("a", "b"), ("b", "a"), ("b", "c"), ("c", "a"), ("c", "d")}
    assert imports.cycles(edges) == [["a", "b", "a"], ["a", "b", "c", "a"]]
    assert imports.cyclic_groups(edges) == [["a", "b", "c"]]


def test_this_repository_passes_with_its_baseline(capsys):
    assert imports.main(["--repo", str(REPO)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("import graph: ")
