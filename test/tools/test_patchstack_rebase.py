"""``patchstack rebase``: carrying the queue onto another torch release.

Against small synthetic "torch" wheels (``test_patchstack.make_wheel``) whose
``torch/foo.py`` is 40 numbered lines; the series has one patch that changes
line 20 (and, where a test needs two, a second that changes line 35).  What
this checks:

* A clean rebase onto a release whose file moved the patched lines (a strict
  application would fail with an offset): the queue is rebased, ``export``
  writes the new base into ``patches/series`` and the refreshed hunk, and
  ``check``, ``build`` and ``apply-source`` then follow the new base and
  refuse the old one.
* A conflict (upstream changed the patched line): the rebase stops with exit
  status 2 and a report naming the patch, the file and the hunk's conflict
  lines; ``patches/`` is untouched; ``--continue`` refuses while the file is
  unmerged or holds markers, then finishes after a resolution.
* ``--abort`` restores the queue exactly (commits, ``pristine`` tag, base).
* A patch that upstream absorbed is dropped and reported; the other is kept.
* Refusals that write nothing: a malformed version, the current base, a
  missing wheel, a wheel that cannot be downloaded, a queue with uncommitted
  changes, a queue holding commits that ``patches/`` does not.
"""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest

from torch_patch_stack import pristine, queue, rebase, series

from test_patchstack import BASE_SOURCE, make_wheel

LINE_35_HEADER = """[inductor] Change line thirty-five

Description: Replace line 35
Forwarded: no
Last-Update: 2026-11-22
"""


def _wheel_214(tmp_path: Path, source: str) -> Path:
    return make_wheel(
        tmp_path / "new" / "torch-2.14.0-cp311-cp311-linux_x86_64.whl", "2.14.0", source
    )


def _queue_state(queue_dir: Path) -> tuple[str, str, str]:
    return (
        queue.git(queue_dir, "rev-parse", "queue").strip(),
        queue.git(queue_dir, "rev-parse", "pristine^{commit}").strip(),
        queue.queue_base(queue_dir),
    )


def _patch_files(repo: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in (repo / "patches").iterdir()}


def _add_patch(repo: Path, queue_dir: Path, run) -> None:
    foo = queue_dir / "torch" / "foo.py"
    foo.write_text(foo.read_text().replace("line 35\n", "line thirty-five\n"))
    queue.git(queue_dir, "commit", "-qam", LINE_35_HEADER)
    assert run("export", "--dir", str(queue_dir)) == 0


@pytest.fixture
def queue_dir(stack, tmp_path):
    return tmp_path / "queue"


def test_clean_rebase_moves_the_base_everywhere(stack, queue_dir, tmp_path, capsys):
    repo, old_wheel, run = stack
    new_wheel = _wheel_214(tmp_path, "line 0a\nline 0b\n" + BASE_SOURCE)
    assert (
        run("check", "--wheel", str(new_wheel)) == 1
    )  # the old series does not apply exactly there
    capsys.readouterr()

    assert (
        run(
            "rebase",
            "--onto",
            "2.14.0",
            "--dir",
            str(queue_dir),
            "--wheel",
            str(new_wheel),
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "rebased the queue from torch 2.13.0 onto torch 2.14.0" in out
    assert "0001-change-line-twenty.patch: clean" in out
    assert run("export", "--dir", str(queue_dir)) == 0

    assert series.read_base(repo / "patches") == "2.14.0"
    assert (repo / "requirements.txt").read_text().endswith("\ntorch==2.14.0\n")
    patch = (repo / "patches" / "0001-change-line-twenty.patch").read_text()
    assert "@@ -19,7 +19,7 @@" in patch and "-line 20\n+line twenty\n" in patch
    assert patch.startswith(
        "Subject: [inductor] Change line twenty\nDescription: Replace line 20\n"
    )
    assert run("check", "--wheel", str(new_wheel)) == 0
    assert run("check", "--wheel", str(old_wheel)) == 1
    assert (
        "torch 2.13.0+cpu, but this patch stack is written against PyTorch v2.14.0"
        in capsys.readouterr().err
    )

    out_dir = tmp_path / "dist"
    assert run("build", "--wheel", str(new_wheel), "--out", str(out_dir)) == 0
    built = Path(capsys.readouterr().out.strip())
    with zipfile.ZipFile(built) as archive:
        assert "line twenty\n" in archive.read("torch/foo.py").decode()
    assert (
        run("build", "--wheel", str(old_wheel), "--out", str(tmp_path / "old-dist"))
        == 1
    )

    with zipfile.ZipFile(new_wheel) as archive:
        archive.extractall(
            tmp_path / "files",
            [n for n in archive.namelist() if n.startswith("torch/")],
        )
    checkout = tmp_path / "checkout"
    subprocess.run(["cp", "-r", str(tmp_path / "files"), str(checkout)], check=True)
    (checkout / "version.txt").write_text("2.14.0\n")
    queue.git(checkout, "init", "-q")
    queue.git(checkout, "add", "-A")
    queue.git(checkout, "commit", "-qm", "v2.14.0")
    assert run("apply-source", str(checkout)) == 0
    assert (
        queue.git(checkout, "log", "-1", "--format=%s").strip()
        == "[inductor] Change line twenty"
    )


def test_conflict_stops_with_a_report_then_continue_finishes(
    stack, queue_dir, tmp_path, capsys
):
    repo, _, run = stack
    before = _patch_files(repo)
    new_wheel = _wheel_214(
        tmp_path, BASE_SOURCE.replace("line 20\n", "line 20 (upstream)\n")
    )

    assert (
        run(
            "rebase",
            "--onto",
            "2.14.0",
            "--dir",
            str(queue_dir),
            "--wheel",
            str(new_wheel),
        )
        == 2
    )
    report = capsys.readouterr().out
    assert "stopped at 0001-change-line-twenty.patch: conflicts" in report
    assert "torch/foo.py: conflict" in report
    assert "hunk #1 @@ -17,7 +17,7 @@ line 16: conflict at lines 20-26" in report
    assert "rebase --continue (or --abort)" in report
    assert _patch_files(repo) == before
    assert rebase.in_progress(queue_dir)

    # Not yet resolved: refused, and the queue stays as it is.
    assert run("rebase", "--continue", "--dir", str(queue_dir)) == 1
    assert "unresolved files" in capsys.readouterr().err
    foo = queue_dir / "torch" / "foo.py"
    queue.git(queue_dir, "add", "torch/foo.py")  # staged with its markers
    assert run("rebase", "--continue", "--dir", str(queue_dir)) == 1
    assert "conflict markers remain in ['torch/foo.py']" in capsys.readouterr().err
    assert (
        run("export", "--dir", str(queue_dir)) == 1
    )  # no export halfway through a rebase

    foo.write_text(BASE_SOURCE.replace("line 20\n", "line twenty (upstream)\n"))
    queue.git(queue_dir, "add", "torch/foo.py")
    assert run("rebase", "--continue", "--dir", str(queue_dir)) == 0
    assert "0001-change-line-twenty.patch: resolved by hand" in capsys.readouterr().out
    assert not rebase.in_progress(queue_dir)
    assert run("export", "--dir", str(queue_dir)) == 0
    patch = (repo / "patches" / "0001-change-line-twenty.patch").read_text()
    assert "-line 20 (upstream)\n+line twenty (upstream)\n" in patch
    assert run("check", "--wheel", str(new_wheel)) == 0


def test_abort_restores_the_queue(stack, queue_dir, tmp_path, capsys):
    repo, _, run = stack
    before, files = _queue_state(queue_dir), _patch_files(repo)
    new_wheel = _wheel_214(
        tmp_path, BASE_SOURCE.replace("line 20\n", "line 20 (upstream)\n")
    )
    assert (
        run(
            "rebase",
            "--onto",
            "2.14.0",
            "--dir",
            str(queue_dir),
            "--wheel",
            str(new_wheel),
        )
        == 2
    )
    assert run("rebase", "--abort", "--dir", str(queue_dir)) == 0
    assert "back on torch 2.13.0" in capsys.readouterr().out
    assert _queue_state(queue_dir) == before
    assert queue.git(queue_dir, "status", "--porcelain") == ""
    assert not rebase.in_progress(queue_dir)
    assert _patch_files(repo) == files
    assert run("rebase", "--abort", "--dir", str(queue_dir)) == 1
    assert "no patchstack rebase is in progress" in capsys.readouterr().err


def test_absorbed_patch_is_dropped_and_reported(stack, queue_dir, tmp_path, capsys):
    repo, _, run = stack
    _add_patch(repo, queue_dir, run)
    new_wheel = _wheel_214(
        tmp_path, BASE_SOURCE.replace("line 35\n", "line thirty-five\n")
    )
    assert (
        run(
            "rebase",
            "--onto",
            "2.14.0",
            "--dir",
            str(queue_dir),
            "--wheel",
            str(new_wheel),
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "0001-change-line-twenty.patch: clean" in out
    assert (
        "0002-change-line-thirty-five.patch: dropped: empty after the rebase "
        "(upstream absorbed it)" in out
    )
    assert run("export", "--dir", str(queue_dir)) == 0
    assert [p.subject for p in series.read_series(repo / "patches")] == [
        "[inductor] Change line twenty"
    ]
    # The overlay module of the patch that stays came along in the queue.
    assert (repo / "torch_overlay" / "torch" / "_new_module.py").read_text() == (
        "VALUE = 1\n"
    )
    assert run("check", "--wheel", str(new_wheel)) == 0


@pytest.mark.parametrize("version", ["2.14", "latest", "2.14.0rc1"])
def test_malformed_version_is_refused(stack, queue_dir, capsys, version):
    repo, _, run = stack
    before, files = _queue_state(queue_dir), _patch_files(repo)
    assert run("rebase", "--onto", version, "--dir", str(queue_dir)) == 1
    assert "is not a PyTorch release version" in capsys.readouterr().err
    assert (_queue_state(queue_dir), _patch_files(repo)) == (before, files)


def test_current_base_and_missing_wheels_are_refused(
    stack, queue_dir, tmp_path, capsys, monkeypatch
):
    repo, _, run = stack
    before, files = _queue_state(queue_dir), _patch_files(repo)
    assert run("rebase", "--onto", "2.13.0", "--dir", str(queue_dir)) == 1
    assert "already on torch 2.13.0" in capsys.readouterr().err
    assert (
        run(
            "rebase",
            "--onto",
            "2.14.0",
            "--dir",
            str(queue_dir),
            "--wheel",
            str(tmp_path / "none.whl"),
        )
        == 1
    )
    assert "none.whl does not exist" in capsys.readouterr().err

    class PipFindsNothing:
        @staticmethod
        def run(args, **kwargs):
            return subprocess.CompletedProcess(
                args, 1, "", "ERROR: No matching distribution found for torch==2.14.0"
            )

    monkeypatch.setattr(pristine, "subprocess", PipFindsNothing)
    assert run("rebase", "--onto", "2.14.0", "--dir", str(queue_dir)) == 1
    error = capsys.readouterr().err
    assert (
        "no official torch==2.14.0 wheel" in error
        and "No matching distribution" in error
    )
    assert not any((repo / "build").glob("**/*.whl"))
    assert (_queue_state(queue_dir), _patch_files(repo)) == (before, files)


def test_dirty_or_unexported_queue_is_refused(stack, queue_dir, tmp_path, capsys):
    repo, _, run = stack
    new_wheel = _wheel_214(tmp_path, BASE_SOURCE)
    foo = queue_dir / "torch" / "foo.py"
    foo.write_text(foo.read_text() + "uncommitted\n")
    assert (
        run(
            "rebase",
            "--onto",
            "2.14.0",
            "--dir",
            str(queue_dir),
            "--wheel",
            str(new_wheel),
        )
        == 1
    )
    assert "has uncommitted changes" in capsys.readouterr().err

    queue.git(queue_dir, "commit", "-qam", LINE_35_HEADER)  # committed, not exported
    before, files = _queue_state(queue_dir), _patch_files(repo)
    assert (
        run(
            "rebase",
            "--onto",
            "2.14.0",
            "--dir",
            str(queue_dir),
            "--wheel",
            str(new_wheel),
        )
        == 1
    )
    assert "holds commits that patches/ does not" in capsys.readouterr().err
    assert (_queue_state(queue_dir), _patch_files(repo)) == (before, files)
