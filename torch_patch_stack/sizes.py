"""Each patch's size, as a reviewer reads it: ``patchstack sizes``.

A patch changes, in the queue (``patchstack queue``, one commit per patch),
the lines of the overlay modules it introduces (its ``Overlay:`` field),
added whole as the module stands after that patch (derived backwards from
``torch_overlay/`` as :func:`overlay.states` does), plus the added and
removed lines of its diff, to upstream files and to overlay modules that
earlier patches introduced.  Context lines do not count.  The test files a
patch carries (``test/``) and the helpers it adds for them
(``torch/testing/``) are counted the same way, apart: the ``tests`` column.
So a patch's code and tests together are what ``git show --stat`` of its
queue commit counts, without building the queue (no wheel is needed).

A patch whose code is over the limit (:data:`LIMIT`, 800 lines: issue 32,
one upstream PR a maintainer can review) fails ``sizes``; its tests do not
count toward it.  There are no exemptions: cut the patch.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from . import overlay, unified_diff
from . import series as series_mod

if TYPE_CHECKING:
    from pathlib import Path


LIMIT = 800


@dataclasses.dataclass(frozen=True)
class PatchSize:
    file_name: str
    subject: str
    introduced: int  # lines of the overlay modules it introduces, as of this patch
    added: int  # "+" lines of its diff
    removed: int  # "-" lines of its diff
    tests: int = 0  # the same three counts, for its tests and their helpers

    @property
    def number(self) -> str:
        return self.file_name.split("-", 1)[0]

    @property
    def total(self) -> int:
        return self.introduced + self.added + self.removed


def _lines(text: str) -> int:
    return len(text.splitlines())


def is_test_code(path: str) -> bool:
    """A carried test file, or a helper module for tests (``torch/testing/``)."""
    return series_mod.is_test_file(path) or path.startswith("torch/testing/")


def measure(patches: list[series_mod.Patch], overlay_dir: Path) -> list[PatchSize]:
    """The size of every patch of the series, in order."""
    after = overlay.states(patches, overlay_dir)
    sizes = []
    for index, patch in enumerate(patches):
        counts = {False: [0, 0, 0], True: [0, 0, 0]}
        for name in patch.overlay_modules:
            counts[is_test_code(name)][0] += _lines(after[index][name])
        for file_diff in unified_diff.parse(patch.diff):
            for hunk in file_diff.hunks:
                counts[is_test_code(file_diff.path)][1] += len(hunk.added)
                counts[is_test_code(file_diff.path)][2] += len(hunk.removed)
        sizes.append(
            PatchSize(patch.file_name, patch.subject, *counts[False], sum(counts[True]))
        )
    return sizes


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def report(sizes: list[PatchSize], limit: int = LIMIT) -> tuple[list[str], list[str]]:
    """The table (its lines) and the problems that fail the check."""
    lines = [
        f"{'patch':<5}  {'subject':<52}  {'modules':>7}  {'+':>5}  {'-':>5}  "
        f"{'total':>6}  {'tests':>6}"
    ]
    over = []
    for size in sizes:
        mark = ""
        if size.total > limit:
            over.append(size)
            mark = f"  > {limit} FAILED"
        lines.append(
            f"{size.number:<5}  {_shorten(size.subject, 52):<52}  "
            f"{size.introduced:>7}  {size.added:>5}  {size.removed:>5}  "
            f"{size.total:>6}  {size.tests:>6}{mark}"
        )
    lines.append(
        f"{'all':<5}  {'':<52}  {sum(s.introduced for s in sizes):>7}  "
        f"{sum(s.added for s in sizes):>5}  {sum(s.removed for s in sizes):>5}  "
        f"{sum(s.total for s in sizes):>6}  {sum(s.tests for s in sizes):>6}"
    )
    problems = [
        f"{size.file_name} changes {size.total} lines, over the limit of {limit}: "
        "cut it into patches of at most that"
        for size in over
    ]
    lines.append(
        f"patchstack sizes: {len(sizes)} patches, {len(over)} over {limit} lines"
    )
    return lines, problems
