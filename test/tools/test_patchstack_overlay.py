"""Overlay modules through the series: every prefix stands alone.

A module is introduced whole by the patch whose ``Overlay:`` names it, and a
later patch may change it with an ordinary diff.  These tests check, on the
small synthetic wheel of ``test_patchstack.py``, that: the later patch's
diff round-trips through the queue and ``check``; ``build --upto``,
``apply-source`` and ``prefix`` give each prefix the module as of that
prefix; an edit to ``torch_overlay/`` lands in the introducing patch, and
one that collides with a later patch's diff is refused with guidance; a
commit that adds a module its header does not name is refused; and a
prefix tree never writes through its hard links into the installed torch.
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from pathlib import Path

import pytest

from torch_patch_stack import queue, series
from torch_patch_stack.wheel import STACK_INFO_PATH

from test_patchstack import _pristine_checkout

MODULE = "torch/_new_module.py"
LATER_HEADER = """[inductor] Extend the new module

Description: Add a second value
 A later patch changes a module that an earlier one introduced.
Forwarded: no
Last-Update: 2026-11-23
"""


@pytest.fixture
def two_patches(stack, tmp_path):
    """The ``stack`` fixture plus a second patch that changes its overlay module."""
    repo, wheel, run = stack
    queue_dir = tmp_path / "queue"
    module = queue_dir / MODULE
    module.write_text("VALUE = 1\nOTHER = 2\n")
    queue.git(queue_dir, "commit", "-qam", LATER_HEADER)
    assert run("export", "--dir", str(queue_dir)) == 0
    return repo, wheel, run


def _module_in(wheel_path: Path) -> str | None:
    with zipfile.ZipFile(wheel_path) as archive:
        names = archive.namelist()
        return archive.read(MODULE).decode() if MODULE in names else None


def test_a_later_patch_changes_a_module_with_a_diff(two_patches):
    repo, wheel, run = two_patches
    later = (repo / "patches" / "0002-extend-the-new-module.patch").read_text()
    assert f"+++ b/{MODULE}\n" in later and "+OTHER = 2\n" in later
    assert "new file mode" not in later
    first = (repo / "patches" / "0001-change-line-twenty.patch").read_text()
    assert MODULE not in first.split("\n---\n", 1)[1]  # carried whole, not as a diff
    assert (repo / "torch_overlay" / MODULE).read_text() == "VALUE = 1\nOTHER = 2\n"
    assert run("check", "--wheel", str(wheel)) == 0


def test_every_prefix_builds_with_its_module(two_patches, tmp_path, capsys):
    repo, wheel, run = two_patches
    built = {}
    for upto in ("0", "0001", "2"):
        out = tmp_path / f"dist{upto}"
        assert (
            run("build", "--wheel", str(wheel), "--out", str(out), "--upto", upto) == 0
        )
        built[upto] = Path(capsys.readouterr().out.strip())
    assert _module_in(built["0"]) is None
    assert _module_in(built["0001"]) == "VALUE = 1\n"
    assert _module_in(built["2"]) == "VALUE = 1\nOTHER = 2\n"
    with zipfile.ZipFile(built["0"]) as archive:
        assert "line 20\n" in archive.read("torch/foo.py").decode()
        assert json.loads(archive.read(STACK_INFO_PATH))["patches"] == []


def test_apply_source_commits_each_module_as_of_its_patch(two_patches, tmp_path):
    repo, wheel, run = two_patches
    checkout = _pristine_checkout(wheel, tmp_path)
    assert run("apply-source", str(checkout)) == 0
    assert queue.git(checkout, "show", f"HEAD~1:{MODULE}") == "VALUE = 1\n"
    assert queue.git(checkout, "show", f"HEAD:{MODULE}") == "VALUE = 1\nOTHER = 2\n"
    assert queue.git(checkout, "show", "--name-only", "--format=", "HEAD").split() == [
        MODULE
    ]


def test_an_overlay_edit_lands_in_the_introducing_patch(two_patches, tmp_path, capsys):
    repo, wheel, run = two_patches
    module = repo / "torch_overlay" / MODULE
    # Above the lines the later patch changes: its hunk moves down 4 lines.
    module.write_text('"""The new module."""\n\n\n\n' + module.read_text())
    assert run("check", "--wheel", str(wheel)) == 1
    assert "differs from its export: patches/0002" in capsys.readouterr().err
    queue_dir = tmp_path / "requeue"
    assert run("queue", "--dir", str(queue_dir), "--wheel", str(wheel)) == 0
    assert run("export", "--dir", str(queue_dir)) == 0
    assert run("check", "--wheel", str(wheel)) == 0
    later = (repo / "patches" / "0002-extend-the-new-module.patch").read_text()
    assert "@@ -3,3 +3,4 @@\n \n \n VALUE = 1\n+OTHER = 2\n" in later
    capsys.readouterr()
    out = tmp_path / "dist1"
    assert run("build", "--wheel", str(wheel), "--out", str(out), "--upto", "1") == 0
    assert _module_in(Path(capsys.readouterr().out.strip())) == (
        '"""The new module."""\n\n\n\nVALUE = 1\n'
    )


def test_an_overlay_edit_in_a_later_patchs_lines_is_refused(two_patches, capsys):
    repo, wheel, run = two_patches
    module = repo / "torch_overlay" / MODULE
    module.write_text(module.read_text().replace("VALUE = 1", "VALUE = 10"))
    assert run("check", "--wheel", str(wheel)) == 1
    err = capsys.readouterr().err
    assert (
        "0002-extend-the-new-module.patch: its changes to torch/_new_module.py" in err
    )
    assert "patch queue" in err


def test_export_refuses_a_module_its_header_does_not_name(stack, tmp_path, capsys):
    repo, wheel, run = stack
    queue_dir = tmp_path / "queue"
    (queue_dir / "torch" / "_unnamed.py").write_text("X = 1\n")
    queue.git(queue_dir, "add", "torch/_unnamed.py")
    queue.git(queue_dir, "commit", "-qm", LATER_HEADER)
    assert run("export", "--dir", str(queue_dir)) == 1
    assert "adds ['torch/_unnamed.py'] but its Overlay: field names []" in (
        capsys.readouterr().err
    )


def test_prefix_tree_replaces_files_without_touching_the_installed_torch(
    two_patches, tmp_path, capsys
):
    repo, wheel, run = two_patches
    installed = tmp_path / "site" / "torch"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(
            tmp_path / "site", [n for n in archive.namelist() if n.startswith("torch/")]
        )
    shutil.copyfile(repo / "torch_overlay" / MODULE, tmp_path / "site" / MODULE)
    before = {
        path: path.read_bytes() for path in installed.rglob("*") if path.is_file()
    }
    dest = tmp_path / "prefix1"
    assert (
        run(
            "prefix",
            "--upto",
            "1",
            "--torch-dir",
            str(installed),
            "--dest",
            str(dest),
            "--wheel",
            str(wheel),
        )
        == 0
    )
    assert (dest / MODULE).read_text() == "VALUE = 1\n"
    assert "line twenty\n" in (dest / "torch" / "foo.py").read_text()
    assert json.loads((dest / STACK_INFO_PATH).read_text())["patches"] == [
        "0001-change-line-twenty.patch"
    ]
    # Untouched files are hard links; the installed files are unchanged.
    assert os.path.samefile(dest / "torch" / "version.py", installed / "version.py")
    after = {path: path.read_bytes() for path in installed.rglob("*") if path.is_file()}
    assert after == before
    assert series.read_series(repo / "patches")[1].overlay_modules == []


TEST_FILE = "test/inductor/test_new_module.py"
TESTS_HEADER = """[inductor] A test file, and its extension

Description: Introduce a test file, whole
Overlay: test/inductor/test_new_module.py
Forwarded: no
Last-Update: 2026-11-29
"""
MORE_TESTS_HEADER = """[inductor] Another test

Description: Extend the test file with a diff
Forwarded: no
Last-Update: 2026-11-29
"""


def test_tests_travel_with_their_patches(two_patches, tmp_path, capsys):
    repo, wheel, run = two_patches
    queue_dir = tmp_path / "queue"
    test = queue_dir / TEST_FILE
    test.parent.mkdir(parents=True)
    test.write_text("def test_one():\n    pass\n")
    queue.git(queue_dir, "add", TEST_FILE)
    queue.git(queue_dir, "commit", "-qm", TESTS_HEADER)
    test.write_text("def test_one():\n    pass\n\n\ndef test_two():\n    pass\n")
    queue.git(queue_dir, "commit", "-qam", MORE_TESTS_HEADER)
    assert run("export", "--dir", str(queue_dir)) == 0
    # The repository's test/ holds the file after the last patch; the later
    # patch carries an ordinary diff of it.
    assert (repo / TEST_FILE).read_text().endswith("def test_two():\n    pass\n")
    later = (repo / "patches" / "0004-another-test.patch").read_text()
    assert f"+++ b/{TEST_FILE}\n" in later and "+def test_two():\n" in later
    assert run("check", "--wheel", str(wheel)) == 0
    # apply-source commits each state with its patch; the wheel carries none.
    checkout = _pristine_checkout(wheel, tmp_path)
    assert run("apply-source", str(checkout)) == 0
    assert queue.git(checkout, "show", f"HEAD~1:{TEST_FILE}") == (
        "def test_one():\n    pass\n"
    )
    capsys.readouterr()
    assert run("build", "--wheel", str(wheel), "--out", str(tmp_path / "dist")) == 0
    with zipfile.ZipFile(Path(capsys.readouterr().out.strip())) as archive:
        assert not [name for name in archive.namelist() if name.startswith("test/")]
    # A carried test file that no patch claims is refused.
    stray = repo / "test" / "inductor" / "test_stray.py"
    stray.write_text("")
    assert run("check", "--wheel", str(wheel)) == 1
    assert "test/inductor/test_stray.py" in capsys.readouterr().err
