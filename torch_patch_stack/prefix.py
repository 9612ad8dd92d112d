"""A torch package tree for a prefix of the series: ``patchstack prefix``.

Every prefix of the series must stand alone, as the upstream PR of its last
patch would: import, and pass the tests of its patches.  Building and
installing a wheel per prefix costs minutes; a prefix's tree is cheaper.  It
is the installed (fully patched) torch package, hard-linked file by file,
with every file that some patch writes replaced by its text after the
prefix: upstream files as the prefix leaves them (pristine where only later
patches change them), the overlay modules of the prefix's patches as they
stand after it, and the others removed.  The test files the prefix carries
are written beside the package, under ``dest/test/``, as they stand after it.  Files are replaced by unlinking the
link first, so the installed torch is never written through.  Put the tree
first on ``PYTHONPATH`` and ``import torch`` imports the prefix; torch's own
dependencies (CUDA libraries, triton) still come from the environment.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from . import overlay
from . import series as series_mod
from .queue import tree_reader
from .wheel import STACK_INFO_PATH


def _link_tree(source: Path, dest: Path) -> None:
    for directory, _, files in os.walk(source):
        target = dest / Path(directory).relative_to(source)
        target.mkdir(parents=True, exist_ok=True)
        for name in files:
            os.link(Path(directory, name), target / name)


def _replace(path: Path, text: str | None) -> None:
    # Unlink first: the file is a hard link to the installed torch's.
    if path.exists() or path.is_symlink():
        path.unlink()
    if text is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def make_tree(
    patches: list[series_mod.Patch],
    count: int,
    pristine: Path,
    overlay_dir: Path,
    torch_dir: Path,
    dest: Path,
) -> Path:
    """Create ``dest/torch``: the package of the series' first ``count`` patches.

    ``torch_dir`` is an installed torch package of the series' base release
    (any stack of it); ``pristine`` holds the release's Python files.
    Returns ``dest``.  Raises what the series raises when it does not apply.
    """
    upstream, modules = overlay.tree_after(
        patches, tree_reader(pristine), overlay_dir, count
    )
    written_by_series = {
        path
        for _, written in overlay.changes_by_patch(
            patches, tree_reader(pristine), overlay_dir
        )
        for path in written
    }
    if dest.exists():
        shutil.rmtree(dest)
    _link_tree(torch_dir, dest / "torch")
    for path in sorted(written_by_series):
        if path in modules:
            text: str | None = modules[path]
        elif path in upstream:
            text = upstream[path]
        else:  # pristine, or an overlay module of a later patch
            original = pristine / path
            text = original.read_text() if original.is_file() else None
        _replace(dest / path, text)
    info = {
        "stack": "prefix",
        "patches": [patch.file_name for patch in patches[:count]],
        "overlay": sorted(modules),
    }
    _replace(dest / STACK_INFO_PATH, json.dumps(info, indent=2) + "\n")
    return dest
