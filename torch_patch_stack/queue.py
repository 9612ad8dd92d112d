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


def apply_series_in_memory(
    patches: list[series_mod.Patch], read_original: Callable[[str], str | None]
) -> dict[str, str]:
    """Apply the whole series to in-memory copies of the files it touches.

    ``read_original(path)`` returns a file's base text, or None when the base
    lacks it.  Raises before the caller writes anything, so a drifted series
    never leaves a half-patched tree.
    """
    current: dict[str, str] = {}
    for patch in patches:
        for file_diff in unified_diff.parse(patch.diff):
            if file_diff.path not in current:
                original = read_original(file_diff.path)
                if original is None:
                    raise unified_diff.PatchError(
                        f"{patch.file_name}: {file_diff.path} is not in the base"
                    )
                current[file_diff.path] = original
            try:
                current[file_diff.path] = unified_diff.apply_exact(
                    current[file_diff.path], file_diff
                )
            except unified_diff.PatchError as error:
                raise unified_diff.PatchError(f"{patch.file_name}: {error}") from None
    return current


def tree_reader(tree: Path) -> Callable[[str], str | None]:
    """``read_original`` for :func:`apply_series_in_memory` over a directory."""
    return lambda path: (tree / path).read_text() if (tree / path).is_file() else None


def apply_patch_to_tree(tree: Path, patch: series_mod.Patch) -> list[str]:
    """Apply ``patch`` to the files under ``tree``: all files or none."""
    updated = apply_series_in_memory([patch], tree_reader(tree))
    for path, text in updated.items():
        (tree / path).write_text(text)
    return list(updated)


def pristine_message(base: str) -> str:
    return f"pristine torch {base} python files (base of the series)"


def materialize(
    dest: Path, pristine: Path, patches: list[series_mod.Patch], base: str
) -> None:
    """Create the queue at ``dest`` (replacing any previous queue) on release ``base``."""
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
    for patch in patches:
        touched = apply_patch_to_tree(dest, patch)
        git(dest, "add", "--", *touched)
        git(dest, "commit", "-q", "-m", patch.commit_message())


def queue_base(queue_dir: Path) -> str:
    """The torch release the queue's ``pristine`` commit holds (its ``torch/version.py``)."""
    version = version_in_version_py(git(queue_dir, "show", "pristine:torch/version.py"))
    if version is None:
        raise RuntimeError(
            f"{queue_dir}: pristine:torch/version.py names no __version__"
        )
    return release(version)


def export(queue_dir: Path) -> list[series_mod.Patch]:
    """Read the commits after ``pristine`` as patches, with stable file names."""
    commits = git(queue_dir, "rev-list", "--reverse", "pristine..HEAD").split()
    patches = []
    for index, commit in enumerate(commits, start=1):
        message = git(queue_dir, "log", "-1", "--format=%B", commit)
        diff = git(queue_dir, "diff", *_DIFF_ARGS, f"{commit}^", commit)
        # Blob hashes churn whenever an earlier patch touches the same file.
        diff = "".join(
            line
            for line in diff.splitlines(keepends=True)
            if not line.startswith("index ")
        )
        subject = message.strip().splitlines()[0]
        patch = series_mod.patch_from_commit(
            series_mod.file_name_for(index, subject), message, diff
        )
        patch.validate()
        patches.append(patch)
    return patches


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
