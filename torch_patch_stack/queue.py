"""The patch queue: a disposable git tree with one commit per patch.

``materialize`` builds it (pristine files, tag ``pristine``, then one commit per
patch, applied strictly); developers edit it with plain git (``commit --fixup``,
``rebase -i --autosquash``, new commits for new patches); ``export`` writes the
commits after ``pristine`` back to ``patches/`` deterministically.  The queue is
never merged anywhere: like ``gbp pq`` it is rebuilt from the files at will.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import TYPE_CHECKING

from . import overlay
from . import series as series_mod
from . import unified_diff
from .pristine import PRISTINE_STAMP, release, version_in_version_py

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

_GIT_IDENTITY = [
    "-c",
    "user.name=patchstack",
    "-c",
    "user.email=patchstack@localhost",
    "-c",
    "commit.gpgsign=false",
    "-c",
    "core.autocrlf=false",
]
# Stable diff settings so that export is byte-for-byte reproducible.
_DIFF_ARGS = [
    "--no-color",
    "--no-ext-diff",
    "--no-renames",
    "--diff-algorithm=myers",
    "-U3",
    "--src-prefix=a/",
    "--dst-prefix=b/",
]


def run_git(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run git in ``cwd`` with the queue's identity; the caller reads the exit status."""
    return subprocess.run(
        ["git", *_GIT_IDENTITY, *args],
        cwd=cwd,
        check=False,
        text=True,
        capture_output=True,
        env=None if env is None else {**os.environ, **env},
    )


def git(cwd: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """Run git in ``cwd``; its stdout, or RuntimeError with its stderr."""
    result = run_git(cwd, *args, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {cwd}:\n{result.stderr}")
    return result.stdout


def tree_reader(tree: Path) -> Callable[[str], str | None]:
    """``read_original`` for :func:`overlay.changes_by_patch` over a directory."""
    return lambda path: (tree / path).read_text() if (tree / path).is_file() else None


def write_files(tree: Path, files: dict[str, str]) -> list[str]:
    """Write ``files`` (path -> text) under ``tree``; their paths."""
    for path, text in files.items():
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_text(text)
    return list(files)


def pristine_message(base: str) -> str:
    return f"pristine torch {base} python files (base of the series)"


def materialize(
    dest: Path,
    pristine: Path,
    patches: list[series_mod.Patch],
    base: str,
    overlay_dir: Path,
) -> None:
    """Create the queue at ``dest`` (replacing any previous queue) on release ``base``.

    Each patch's commit holds the upstream files it changes and the overlay
    modules it introduces or changes, as of that patch (see ``overlay.py``).
    """
    planned = list(
        overlay.changes_by_patch(patches, tree_reader(pristine), overlay_dir)
    )
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(pristine, dest, ignore=shutil.ignore_patterns(PRISTINE_STAMP))
    git(dest, "init", "-q", "-b", "queue")
    # Conflicts of a rebase show the base text too, which a person resolving
    # them needs to see what upstream changed.
    git(dest, "config", "merge.conflictStyle", "diff3")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", pristine_message(base))
    git(dest, "tag", "pristine")
    for patch, written in planned:
        git(dest, "add", "--", *write_files(dest, written))
        git(dest, "commit", "-q", "-m", patch.commit_message())


def queue_base(queue_dir: Path) -> str:
    """The torch release the queue's ``pristine`` commit holds (its ``torch/version.py``)."""
    version = version_in_version_py(git(queue_dir, "show", "pristine:torch/version.py"))
    if version is None:
        raise RuntimeError(
            f"{queue_dir}: pristine:torch/version.py names no __version__"
        )
    return release(version)


def export(queue_dir: Path) -> tuple[list[series_mod.Patch], dict[str, str]]:
    """Read the commits after ``pristine`` as patches, with stable file names,
    and the overlay modules as the last commit has them (path -> text).

    A file that a commit adds is an overlay module and must be named in that
    commit's ``Overlay:`` field; it stays out of the patch's diff (the patch
    carries it whole, from ``torch_overlay/``).  Later commits' changes to it
    are ordinary diffs of their patches.
    """
    commits = git(queue_dir, "rev-list", "--reverse", "pristine..HEAD").split()
    patches = []
    modules: list[str] = []
    for index, commit in enumerate(commits, start=1):
        message = git(queue_dir, "log", "-1", "--format=%B", commit)
        subject = message.strip().splitlines()[0]
        status = git(
            queue_dir, "diff", "--name-status", "--no-renames", f"{commit}^", commit
        )
        added = sorted(
            line.split("\t", 1)[1]
            for line in status.splitlines()
            if line.startswith("A")
        )
        deleted = [
            line.split("\t", 1)[1]
            for line in status.splitlines()
            if line.startswith("D")
        ]
        diff = git(
            queue_dir, "diff", *_DIFF_ARGS, "--diff-filter=M", f"{commit}^", commit
        )
        # Blob hashes churn whenever an earlier patch touches the same file.
        diff = "".join(
            line
            for line in diff.splitlines(keepends=True)
            if not line.startswith("index ")
        )
        patch = series_mod.patch_from_commit(
            series_mod.file_name_for(index, subject), message, diff
        )
        patch.validate()
        if deleted:
            raise unified_diff.PatchError(
                f"{patch.file_name} ({commit[:12]}) deletes {deleted}: patches may only "
                "modify files and add overlay modules"
            )
        if added != sorted(patch.overlay_modules):
            raise unified_diff.PatchError(
                f"{patch.file_name} ({commit[:12]}) adds {added} but its Overlay: field "
                f"names {sorted(patch.overlay_modules)}: every module a patch adds is "
                "named there, and only those"
            )
        patches.append(patch)
        modules += added
    texts = {path: git(queue_dir, "show", f"HEAD:{path}") for path in modules}
    return patches, texts


def write_new_files(overlay_dir: Path, files: dict[str, str]) -> None:
    """Make ``overlay_dir`` and the carried test directories next to it hold
    exactly ``files`` (path -> text), the files the series adds."""
    existing = [
        *(series_mod.overlay_files(overlay_dir) if overlay_dir.exists() else []),
        *series_mod.carried_test_files(overlay_dir.parent),
    ]
    for stale in existing:
        if stale.as_posix() not in files:
            overlay.new_file_path(overlay_dir, stale.as_posix()).unlink()
    for path, text in files.items():
        target = overlay.new_file_path(overlay_dir, path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def write_patches(patch_dir: Path, patches: list[series_mod.Patch], base: str) -> None:
    """Replace the series in ``patch_dir`` by ``patches``, applying to release ``base``."""
    patch_dir.mkdir(parents=True, exist_ok=True)
    keep = {patch.file_name for patch in patches}
    for stale in patch_dir.glob("*.patch"):
        if stale.name not in keep:
            stale.unlink()
    for patch in patches:
        (patch_dir / patch.file_name).write_text(patch.render())
    (patch_dir / "series").write_text(series_mod.render_series(patches, base))
