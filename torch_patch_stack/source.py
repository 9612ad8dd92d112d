"""Apply the stack to a PyTorch git checkout, one commit per patch.

Each commit carries the patch header as its message and the overlay modules the
patch names in ``Overlay:``, so the branch is ready for ``ghstack`` (one commit,
one upstream PR).  The checkout must be clean and at the series' base release
(``patches/series``); every patch is checked to apply exactly before the first
commit is made.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from . import series as series_mod
from . import unified_diff
from .pristine import require_base_version, version_in_version_py
from .queue import apply_patch_to_tree, apply_series_in_memory, git, tree_reader


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


def overlay_by_patch(
    patches: list[series_mod.Patch], overlay_dir: Path
) -> dict[str, list[Path]]:
    """Map each patch to the overlay modules it introduces; every overlay file
    must be claimed by exactly one patch."""
    claimed: dict[str, list[Path]] = {}
    owner: dict[Path, str] = {}
    for patch in patches:
        names = [
            n.strip() for n in patch.fields.get("Overlay", "").split(",") if n.strip()
        ]
        claimed[patch.file_name] = []
        for name in names:
            path = Path(name)
            if path in owner:
                raise series_mod.SeriesError(
                    f"{name} is claimed by {owner[path]} and {patch.file_name}"
                )
            if not (overlay_dir / path).is_file():
                raise series_mod.SeriesError(
                    f"{patch.file_name} names {name}, not in torch_overlay/"
                )
            owner[path] = patch.file_name
            claimed[patch.file_name].append(path)
    unclaimed = [
        str(p) for p in series_mod.overlay_files(overlay_dir) if p not in owner
    ]
    if unclaimed:
        raise series_mod.SeriesError(
            f"no patch names these overlay modules in 'Overlay:': {unclaimed}"
        )
    return claimed


def apply_to_checkout(checkout: Path, patch_dir: Path, overlay_dir: Path) -> list[str]:
    """Commit the series onto ``checkout``'s current branch; return the subjects.

    The checkout must be a clean git tree at the series' base release
    (``patches/series``); nothing is committed unless every patch applies.
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
    overlay = overlay_by_patch(patches, overlay_dir)
    # Dry run in memory so that a drifted patch leaves the checkout untouched.
    apply_series_in_memory(patches, tree_reader(checkout))
    for module in (module for modules in overlay.values() for module in modules):
        if (checkout / module).exists():
            raise unified_diff.PatchError(f"{module} already exists in {checkout}")
    for patch in patches:
        touched = apply_patch_to_tree(checkout, patch)
        for module in overlay[patch.file_name]:
            (checkout / module).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(overlay_dir / module, checkout / module)
            touched.append(str(module))
        git(checkout, "add", "--", *touched)
        git(checkout, "commit", "-q", "-m", patch.commit_message())
    return [patch.subject for patch in patches]
