"""Apply the stack to a PyTorch git checkout, one commit per patch.

Each commit carries the patch header as its message, the upstream files the
patch changes and the overlay modules it introduces or changes as of that
patch, so the branch is ready for ``ghstack`` (one commit, one upstream PR,
each one standing alone).  The checkout must be clean and at the series' base
release (``patches/series``); every patch is checked to apply exactly before
the first commit is made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import overlay, unified_diff
from . import series as series_mod
from .pristine import require_base_version, version_in_version_py
from .queue import git, tree_reader, write_files


if TYPE_CHECKING:
    from pathlib import Path


def checkout_version(checkout: Path) -> str:
    """The torch version of a source checkout (``version.txt``), or of a tree
    made from a wheel (``torch/version.py``)."""
    version_txt = checkout / "version.txt"
    if version_txt.is_file():
        return version_txt.read_text().strip()
    version_py = checkout / "torch" / "version.py"
    if version_py.is_file():
        version = version_in_version_py(version_py.read_text())
        if version:
            return version
    raise unified_diff.PatchError(
        f"{checkout} has neither version.txt nor torch/version.py"
    )


def apply_to_checkout(checkout: Path, patch_dir: Path, overlay_dir: Path) -> list[str]:
    """Commit the series onto ``checkout``'s current branch; return the subjects.

    The checkout must be a clean git tree at the series' base release
    (``patches/series``); nothing is committed unless every patch applies.
    Each commit holds the files its patch writes: the upstream files it
    changes and the overlay modules it introduces or changes, as of that
    patch (``overlay.py``), so that each one stands alone.
    """
    if not (checkout / ".git").exists():
        raise unified_diff.PatchError(f"{checkout} is not a git checkout")
    require_base_version(
        checkout_version(checkout), series_mod.read_base(patch_dir), str(checkout)
    )
    if git(checkout, "status", "--porcelain", "--untracked-files=no").strip():
        raise unified_diff.PatchError(
            f"{checkout} has uncommitted changes; commit or stash them first"
        )
    patches = series_mod.read_series(patch_dir)
    # Planned in full first, so that a drifted patch leaves the checkout untouched.
    planned = list(
        overlay.changes_by_patch(patches, tree_reader(checkout), overlay_dir)
    )
    for module in (name for patch in patches for name in patch.overlay_modules):
        if (checkout / module).exists():
            raise unified_diff.PatchError(f"{module} already exists in {checkout}")
    for patch, written in planned:
        git(checkout, "add", "--", *write_files(checkout, written))
        git(checkout, "commit", "-q", "-m", patch.commit_message())
    return [patch.subject for patch in patches]
