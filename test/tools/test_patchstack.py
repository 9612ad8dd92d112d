"""The patch stack tooling: strict application, queue round trip, drift, builds.

Most tests run against a small synthetic "torch" wheel so that each failure
mode (drift, offset, fuzz, wrong base version, dirty checkout) is produced on
purpose; two run the real series against the official wheel of its base release:
``check`` must pass, and the source path must commit every patch onto a git
tree made from the wheel's Python files.
"""

from __future__ import annotations

import difflib
import json
import shutil
import zipfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_patch_stack import cli, queue, series, unified_diff
from torch_patch_stack.wheel import STACK_INFO_PATH

REPO = Path(__file__).resolve().parents[2]
BASE_SOURCE = "".join(f"line {i}\n" for i in range(1, 41))
HEADER = """[inductor] Change line twenty

Description: Replace line 20
 Longer reasoning on a continuation line.
Overlay: torch/_new_module.py
Forwarded: no
Last-Update: 2026-11-21
"""


def make_wheel(
    path: Path, version: str = "2.13.0+cpu", source: str = BASE_SOURCE
) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    dist_info = f"torch-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("torch/__init__.py", "")
        archive.writestr("torch/foo.py", source)
        archive.writestr("torch/version.py", f"__version__ = '{version}'\n")
        archive.writestr(
            f"{dist_info}/METADATA",
            f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
        )
        archive.writestr(f"{dist_info}/RECORD", "")
    return path


def test_round_trip_check_passes(stack):
    repo, wheel, run = stack
    patch = (repo / "patches" / "0001-change-line-twenty.patch").read_text()
    assert patch.startswith(
        "Subject: [inductor] Change line twenty\nDescription: Replace line 20\n"
    )
    assert "-line 20\n+line twenty\n" in patch and "\nindex " not in patch
    assert run("check", "--wheel", str(wheel)) == 0


def test_export_is_deterministic(stack, tmp_path):
    repo, wheel, run = stack
    before = {p.name: p.read_bytes() for p in (repo / "patches").iterdir()}
    assert run("queue", "--dir", str(tmp_path / "again"), "--wheel", str(wheel)) == 0
    assert run("export", "--dir", str(tmp_path / "again")) == 0
    assert {p.name: p.read_bytes() for p in (repo / "patches").iterdir()} == before


def test_check_fails_on_drift(stack, capsys):
    repo, wheel, run = stack
    patch = repo / "patches" / "0001-change-line-twenty.patch"
    patch.write_text(
        patch.read_text().replace("@@ -17,7 +17,7 @@", "@@ -17,7 +17,7 @@ hand-edited")
    )
    assert run("check", "--wheel", str(wheel)) == 1
    assert (
        "differs from its export: patches/0001-change-line-twenty.patch"
        in capsys.readouterr().err
    )


def test_check_fails_on_stray_patch(stack, capsys):
    repo, wheel, run = stack
    shutil.copy(
        repo / "patches" / "0001-change-line-twenty.patch",
        repo / "patches" / "0002-stray.patch",
    )
    assert run("check", "--wheel", str(wheel)) == 1
    assert "not produced by export: patches/0002-stray.patch" in capsys.readouterr().err


def test_requirements_declare_the_base_and_check_holds_them_to_it(stack, capsys):
    repo, wheel, run = stack
    requirements = repo / "requirements.txt"
    assert requirements.read_text().splitlines()[-1] == "torch==2.13.0"
    requirements.write_text(requirements.read_text().replace("2.13.0", "2.14.0"))
    assert run("check", "--wheel", str(wheel)) == 1
    assert (
        "requirements.txt declares torch==2.14.0, but patches/series' base is "
        "torch==2.13.0" in capsys.readouterr().err
    )
    requirements.unlink()
    assert run("check", "--wheel", str(wheel)) == 1
    assert "requirements.txt is missing" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("drifted_base", "kind"),
    [
        (
            "line 0a\nline 0b\n" + BASE_SOURCE,
            "offset",
        ),  # the hunk would apply 2 lines lower
        (
            BASE_SOURCE.replace("line 18\n", "line eighteen\n"),
            "fuzz",
        ),  # a context line changed
    ],
)
def test_check_fails_on_offset_and_fuzz(stack, tmp_path, capsys, drifted_base, kind):
    repo, _, run = stack
    drifted = make_wheel(
        tmp_path / f"{kind}" / "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl",
        source=drifted_base,
    )
    assert run("check", "--wheel", str(drifted)) == 1
    assert "hunk #1 (@@ -17) does not apply exactly" in capsys.readouterr().err


def test_build_refuses_other_torch_versions(stack, tmp_path, capsys):
    repo, _, run = stack
    other = make_wheel(
        tmp_path / "old" / "torch-2.12.0+cpu-cp311-cp311-linux_x86_64.whl",
        version="2.12.0+cpu",
    )
    out = tmp_path / "dist"
    assert run("build", "--wheel", str(other), "--out", str(out)) == 1
    error = capsys.readouterr().err
    assert (
        "torch 2.12.0+cpu" in error
        and "refusing to patch it (nothing was changed)" in error
    )
    assert not out.exists() or not any(out.iterdir())


def test_build_writes_patched_wheel_that_identifies_itself(stack, tmp_path, capsys):
    repo, wheel, run = stack
    assert run("build", "--wheel", str(wheel), "--out", str(tmp_path / "dist")) == 0
    built = Path(capsys.readouterr().out.strip())
    with zipfile.ZipFile(built) as archive:
        assert "line twenty\n" in archive.read("torch/foo.py").decode()
        assert archive.read("torch/_new_module.py") == b"VALUE = 1\n"
        info = json.loads(archive.read(STACK_INFO_PATH))
        record = archive.read("torch-2.13.0+cpu.dist-info/RECORD").decode()
    assert [p["file"] for p in info["patches"]] == ["0001-change-line-twenty.patch"]
    assert (
        info["overlay"] == ["torch/_new_module.py"]
        and info["base_torch"] == "2.13.0+cpu"
    )
    assert "torch/_new_module.py,sha256=" in record and "torch/foo.py,sha256=" in record


def _git_tree(path: Path, files_from: Path) -> Path:
    shutil.copytree(files_from, path, ignore=shutil.ignore_patterns(".extracted-from"))
    queue.git(path, "init", "-q")
    queue.git(path, "add", "-A")
    queue.git(path, "commit", "-qm", "base")
    return path


def _pristine_checkout(wheel: Path, tmp_path: Path) -> Path:
    """A git checkout of the wheel's ``torch/`` files: a source tree at the base release."""
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(
            tmp_path / "files",
            [n for n in archive.namelist() if n.startswith("torch/")],
        )
    return _git_tree(tmp_path / "checkout", tmp_path / "files")


def test_apply_source_commits_each_patch_with_its_overlay(stack, tmp_path):
    repo, wheel, run = stack
    checkout = _pristine_checkout(wheel, tmp_path)
    assert run("apply-source", str(checkout)) == 0
    log = queue.git(checkout, "log", "--format=%s", "-2").splitlines()
    assert log == ["[inductor] Change line twenty", "base"]
    changed = queue.git(checkout, "show", "--name-only", "--format=", "HEAD").split()
    assert sorted(changed) == ["torch/_new_module.py", "torch/foo.py"]


def test_apply_source_refuses_dirty_checkout_and_wrong_version(stack, tmp_path, capsys):
    repo, wheel, run = stack
    checkout = _pristine_checkout(wheel, tmp_path)
    (checkout / "torch" / "foo.py").write_text("edited\n")
    assert run("apply-source", str(checkout)) == 1
    assert "uncommitted changes" in capsys.readouterr().err
    queue.git(checkout, "checkout", "--", ".")
    (checkout / "version.txt").write_text("2.12.0a0\n")
    assert run("apply-source", str(checkout)) == 1
    assert "torch 2.12.0a0" in capsys.readouterr().err
    assert queue.git(checkout, "log", "--format=%s").split("\n")[0] == "base"


@settings(max_examples=200, deadline=None)
@given(
    before=st.lists(
        st.sampled_from(["a\n", "b\n", "c\n", "def f():\n", "    pass\n", "\n"]),
        max_size=30,
    ),
    after=st.lists(
        st.sampled_from(["a\n", "b\n", "x\n", "def f():\n", "    return 1\n", "\n"]),
        max_size=30,
    ),
)
def test_strict_apply_inverts_unified_diff(before, after):
    diff = "".join(difflib.unified_diff(before, after, "a/f.py", "b/f.py"))
    if not diff:
        return
    (file_diff,) = unified_diff.parse(diff)
    assert unified_diff.apply_exact("".join(before), file_diff) == "".join(after)


def test_patches_may_not_add_files():
    diff = "diff --git a/torch/x.py b/torch/x.py\nnew file mode 100644\n--- /dev/null\n+++ b/torch/x.py\n"
    with pytest.raises(unified_diff.PatchError, match="torch_overlay"):
        unified_diff.parse(diff)


# --- the real series against the official wheel ---------------------------------


def test_real_series_passes_check():
    assert cli.main(["--repo", str(REPO), "check"]) == 0


def test_real_series_applies_to_git_tree_of_wheel_python_files(tmp_path):
    layout = cli.Layout(REPO)
    checkout = _git_tree(tmp_path / "pytorch", layout.pristine_tree(None))
    assert cli.main(["--repo", str(REPO), "apply-source", str(checkout)]) == 0
    committed = queue.git(
        checkout,
        "log",
        "--reverse",
        "--format=%s",
        f"HEAD~{len(series.read_series(layout.patches))}..HEAD",
    ).splitlines()
    assert committed == [patch.subject for patch in series.read_series(layout.patches)]
    assert queue.git(checkout, "status", "--porcelain") == ""


def test_folded_header_fields_are_joined():
    text = (
        "Subject: [inductor] Two modules\n"
        "Description: One line\n"
        " continued.\n"
        " .\n"
        " Another paragraph.\n"
        "Overlay: torch/_a.py,\n"
        " torch/_b.py\n"
        "Forwarded: no\n"
        "Last-Update: 2026-11-22\n"
        "---\n"
    )
    fields = series.parse_patch("0001-two-modules.patch", text).fields
    assert [name.strip() for name in fields["Overlay"].split(",")] == [
        "torch/_a.py",
        "torch/_b.py",
    ]
    assert fields["Description"] == "One line continued. Another paragraph."
    assert fields["Forwarded"] == "no"
