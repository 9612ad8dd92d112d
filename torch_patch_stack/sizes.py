"""Each patch's size, as a reviewer reads it: ``patchstack sizes``.

A patch changes, in the queue (``patchstack queue``, one commit per patch),
the lines of the overlay modules it introduces (its ``Overlay:`` field),
added whole as the module stands after that patch (derived backwards from
``torch_overlay/`` as :func:`overlay.states` does), plus the added and
removed lines of its diff, to upstream files and to overlay modules that
earlier patches introduced.  Context lines do not count; test files are not
part of patches.  So the size of a patch is what ``git show --stat`` of its
queue commit counts, without building the queue (no wheel is needed).

A patch over the limit (:data:`LIMIT`, 800 lines: issue 32, one upstream PR
a maintainer can review) fails ``sizes`` unless the exemption file
(:data:`EXEMPT_FILE`) names it, one patch file name per line, ``#``
comments and blank lines ignored.  The file lists the patches that were over
the limit when the check came in; issue 32's re-cut removes it (a missing
file exempts nothing).  It can only shrink: an entry that names no patch of
the series, or a patch now within the limit, fails the check too.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from . import overlay, unified_diff

if TYPE_CHECKING:
    from pathlib import Path

    from . import series as series_mod

LIMIT = 800
EXEMPT_FILE = "scripts/patch-size-exempt.txt"


@dataclasses.dataclass(frozen=True)
class PatchSize:
    file_name: str
    subject: str
    introduced: int  # lines of the overlay modules it introduces, as of this patch
    added: int  # "+" lines of its diff
    removed: int  # "-" lines of its diff

    @property
    def number(self) -> str:
        return self.file_name.split("-", 1)[0]

    @property
    def total(self) -> int:
        return self.introduced + self.added + self.removed


def _lines(text: str) -> int:
    return len(text.splitlines())


def measure(patches: list[series_mod.Patch], overlay_dir: Path) -> list[PatchSize]:
    """The size of every patch of the series, in order."""
    after = overlay.states(patches, overlay_dir)
    sizes = []
    for index, patch in enumerate(patches):
        hunks = [
            hunk
            for file_diff in unified_diff.parse(patch.diff)
            for hunk in file_diff.hunks
        ]
        sizes.append(
            PatchSize(
                patch.file_name,
                patch.subject,
                sum(_lines(after[index][name]) for name in patch.overlay_modules),
                sum(len(hunk.added) for hunk in hunks),
                sum(len(hunk.removed) for hunk in hunks),
            )
        )
    return sizes


def read_exempt(path: Path) -> list[str]:
    """The patch file names the exemption file lists (none when it does not exist)."""
    if not path.is_file():
        return []
    return [
        entry
        for line in path.read_text().splitlines()
        if (entry := line.split("#", 1)[0].strip())
    ]


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def report(
    sizes: list[PatchSize], exempt: list[str], exempt_name: str, limit: int = LIMIT
) -> tuple[list[str], list[str]]:
    """The table (its lines) and the problems that fail the check."""
    by_name = {size.file_name: size for size in sizes}
    lines = [
        f"{'patch':<5}  {'subject':<52}  {'modules':>7}  {'+':>5}  {'-':>5}  "
        f"{'total':>6}"
    ]
    over = []
    for size in sizes:
        mark = ""
        if size.total > limit:
            over.append(size)
            mark = (
                f"  > {limit} (exempt)"
                if size.file_name in exempt
                else f"  > {limit} FAILED"
            )
        lines.append(
            f"{size.number:<5}  {_shorten(size.subject, 52):<52}  "
            f"{size.introduced:>7}  {size.added:>5}  {size.removed:>5}  "
            f"{size.total:>6}{mark}"
        )
    lines.append(
        f"{'all':<5}  {'':<52}  {sum(s.introduced for s in sizes):>7}  "
        f"{sum(s.added for s in sizes):>5}  {sum(s.removed for s in sizes):>5}  "
        f"{sum(s.total for s in sizes):>6}"
    )
    problems = [
        f"{size.file_name} changes {size.total} lines, over the limit of {limit}: "
        "cut it into patches of at most that"
        for size in over
        if size.file_name not in exempt
    ]
    for entry in exempt:
        if entry not in by_name:
            problems.append(
                f"{exempt_name} names {entry}, which is no patch of the series: "
                "delete the line"
            )
        elif by_name[entry].total <= limit:
            problems.append(
                f"{exempt_name} exempts {entry}, which changes "
                f"{by_name[entry].total} lines, within the limit of {limit}: "
                "delete the line"
            )
    exempted = [size.number for size in over if size.file_name in exempt]
    lines.append(
        f"patchstack sizes: {len(sizes)} patches, {len(over)} over {limit} lines"
        + (f" ({', '.join(exempted)} exempt in {exempt_name})" if exempted else "")
    )
    return lines, problems
