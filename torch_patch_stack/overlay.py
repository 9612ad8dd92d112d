"""New files through the series: which patch introduces each, and its text after every patch.

``torch_overlay/`` holds every module the stack adds to torch, in its state
after the last patch: what the stack ships, what developers read and edit.
The test files the patches carry (``test/inductor/``, ``test/distributed/``,
at upstream's paths) are the repository's own ``test/`` files, likewise in
their state after the last patch (:func:`new_file_path`).  Modules and tests
are handled alike; this docstring says "module" for both.
A module is introduced by the patch that names it in its ``Overlay:`` field;
a later patch changes it with an ordinary diff in its ``.patch`` file, like
any upstream file.  The module's text as of an earlier patch is derived
backwards from ``torch_overlay/``: each later patch's hunks to it, reversed.
So every prefix of the series is a complete tree (``build --upto``,
``apply-source``, the queue), and an upstream PR of a patch carries the
modules as of that patch, not as the final stack has them.

An edit to ``torch_overlay/`` lands in the patch that introduced the module:
a later patch's hunks still undo from the edited text, at whatever lines
they now sit (``queue`` then ``export`` rewrite their line numbers, which
``check`` asks for).  An edit to lines that a later patch changes, or to
their context, is refused (:func:`states` says so): it belongs in the queue
(see CONTRIBUTING.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import series as series_mod
from . import unified_diff


if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path


def new_file_path(overlay_dir: Path, name: str) -> Path:
    """Where the final text of ``name``, a file the series adds, lives.

    A carried test file is the repository's own (``<repo>/test/...``, next to
    ``torch_overlay/``); a module is under ``overlay_dir``.
    """
    if series_mod.is_test_file(name):
        return overlay_dir.parent / name
    return overlay_dir / name


def _shown(name: str) -> str:
    return name if series_mod.is_test_file(name) else f"torch_overlay/{name}"


def claims(patches: list[series_mod.Patch], overlay_dir: Path) -> dict[str, int]:
    """Each overlay module (a wheel path) and the index of the patch that introduces it.

    Every file under ``overlay_dir`` must be named in the ``Overlay:`` field
    of exactly one patch; raises :class:`series_mod.SeriesError` otherwise.
    """
    owner: dict[str, int] = {}
    for index, patch in enumerate(patches):
        for name in patch.overlay_modules:
            if name in owner:
                raise series_mod.SeriesError(
                    f"{name} is claimed by {patches[owner[name]].file_name} and "
                    f"{patch.file_name}"
                )
            if not new_file_path(overlay_dir, name).is_file():
                raise series_mod.SeriesError(
                    f"{patch.file_name} names {name}, not in "
                    f"{'the repository' if series_mod.is_test_file(name) else 'torch_overlay/'}"
                )
            owner[name] = index
    unclaimed = [
        str(path)
        for path in [
            *series_mod.overlay_files(overlay_dir),
            *series_mod.carried_test_files(overlay_dir.parent),
        ]
        if path.as_posix() not in owner
    ]
    if unclaimed:
        raise series_mod.SeriesError(
            f"no patch names these modules or test files in 'Overlay:': {unclaimed}"
        )
    return owner


def states(patches: list[series_mod.Patch], overlay_dir: Path) -> list[dict[str, str]]:
    """The overlay modules after each patch: ``result[k]`` maps every module
    introduced by ``patches[0..k]`` to its text after patch ``k``.

    Raises :class:`unified_diff.PatchError` when a patch changes a module
    that no earlier patch introduced, or when its hunks do not undo exactly
    from the module's later text.
    """
    owner = claims(patches, overlay_dir)
    current = {path: new_file_path(overlay_dir, path).read_text() for path in owner}
    result: list[dict[str, str]] = [{} for _ in patches]
    for index in reversed(range(len(patches))):
        result[index] = dict(current)
        patch = patches[index]
        for file_diff in unified_diff.parse(patch.diff):
            if file_diff.path not in owner:
                continue
            if owner[file_diff.path] >= index:
                raise unified_diff.PatchError(
                    f"{patch.file_name} changes {file_diff.path}, which "
                    f"{patches[owner[file_diff.path]].file_name} introduces: a "
                    "patch may change an overlay module that an earlier patch "
                    "introduces, and the introducing patch carries it whole"
                )
            try:
                # At any offset: an edit to torch_overlay/ above the hunk
                # shifts it; export then writes the hunk at its new lines.
                current[file_diff.path] = unified_diff.apply_at_any_offset(
                    current[file_diff.path], unified_diff.reverse(file_diff)
                )
            except unified_diff.PatchError as error:
                raise unified_diff.PatchError(
                    f"{patch.file_name}: its changes to {file_diff.path} do not undo "
                    f"from {_shown(file_diff.path)} ({error}).  torch_overlay/ and "
                    "test/ hold the files after the last patch; an edit to lines that a "
                    "later patch changes, or to their context, is made in the patch "
                    "queue instead (CONTRIBUTING.md, 'The patch queue')"
                ) from None
        for path in [path for path, claimed in owner.items() if claimed == index]:
            del current[path]
    return result


def changes_by_patch(
    patches: list[series_mod.Patch],
    read_original: Callable[[str], str | None],
    overlay_dir: Path,
) -> Iterator[tuple[series_mod.Patch, dict[str, str]]]:
    """Each patch, with the texts of the files it writes: the upstream files
    it changes and the overlay modules it introduces or changes.

    ``read_original(path)`` returns an upstream file's text in the base, or
    None when the base lacks it.  Everything is checked before the first
    patch is yielded: a drifted series raises
    :class:`unified_diff.PatchError` before the caller writes anything.
    """
    after = states(patches, overlay_dir)
    upstream: dict[str, str] = {}
    planned = []
    for index, patch in enumerate(patches):
        written: dict[str, str] = {}
        for file_diff in unified_diff.parse(patch.diff):
            if file_diff.path in after[index]:
                continue  # an overlay module: its state after this patch, below
            if file_diff.path not in upstream:
                original = read_original(file_diff.path)
                if original is None:
                    raise unified_diff.PatchError(
                        f"{patch.file_name}: {file_diff.path} is not in the base"
                    )
                upstream[file_diff.path] = original
            try:
                upstream[file_diff.path] = unified_diff.apply_exact(
                    upstream[file_diff.path], file_diff
                )
            except unified_diff.PatchError as error:
                raise unified_diff.PatchError(f"{patch.file_name}: {error}") from None
            written[file_diff.path] = upstream[file_diff.path]
        before = after[index - 1] if index else {}
        written.update(
            {
                path: text
                for path, text in after[index].items()
                if before.get(path) != text
            }
        )
        planned.append((patch, written))
    yield from planned


def tree_after(
    patches: list[series_mod.Patch],
    read_original: Callable[[str], str | None],
    overlay_dir: Path,
    upto: int | None = None,
) -> tuple[dict[str, str], dict[str, str]]:
    """The files of the stack after its first ``upto`` patches (default: all).

    Returns the upstream files those patches change, and the overlay modules
    they introduce, each with its text then.
    """
    count = len(patches) if upto is None else upto
    upstream: dict[str, str] = {}
    modules: dict[str, str] = {}
    for index, (_, written) in enumerate(
        changes_by_patch(patches, read_original, overlay_dir)
    ):
        if index >= count:
            break
        for path, text in written.items():
            target = modules if path in _introduced(patches[: index + 1]) else upstream
            target[path] = text
    return upstream, modules


def _introduced(patches: list[series_mod.Patch]) -> set[str]:
    return {name for patch in patches for name in patch.overlay_modules}


def resolve_upto(patches: list[series_mod.Patch], upto: str) -> int:
    """The number of patches a prefix ``upto`` names: a count, ``NNNN``, or a file name."""
    for index, patch in enumerate(patches):
        if upto in (patch.file_name, patch.file_name.split("-")[0]):
            return index + 1
    if upto.isdigit() and 0 <= int(upto) <= len(patches):
        return int(upto)
    raise series_mod.SeriesError(
        f"--upto {upto!r} names no patch of the series (0 to {len(patches)}, "
        "NNNN or a patch file name)"
    )
