"""Strict parsing and application of unified diffs.

Patches in the series must apply exactly: every hunk at the line its header
names, every context line identical.  GNU patch and ``git apply`` both accept
drifted patches (offsets, fuzz) silently or with a warning that is easy to miss;
a drifted patch means the series no longer describes the base it claims, so
here drift is an error.
"""

from __future__ import annotations

import dataclasses
import re

_HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchError(Exception):
    """A patch is malformed or does not apply exactly."""


@dataclasses.dataclass
class Hunk:
    old_start: int
    old_lines: list[str]
    new_lines: list[str]
    header: str = ""  # the "@@ ... @@" line, for reports
    new_start: int = 0
    removed: list[str] = dataclasses.field(default_factory=list)  # the "-" lines
    added: list[str] = dataclasses.field(default_factory=list)  # the "+" lines


@dataclasses.dataclass
class FileDiff:
    path: str
    hunks: list[Hunk]


def _strip_prefix(name: str, prefix: str) -> str:
    if not name.startswith(prefix):
        raise PatchError(f"expected path starting with {prefix!r}, got {name!r}")
    return name[len(prefix) :]


def parse(diff_text: str) -> list[FileDiff]:
    """Parse ``git diff`` output that only modifies existing files.

    New, deleted, renamed or binary files are rejected: new modules belong in
    ``torch_overlay/`` so that patches stay small diffs of upstream files.
    """
    lines = diff_text.splitlines(keepends=True)
    files: list[FileDiff] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("diff --git "):
            i += 1
            continue
        if line.startswith(("new file mode", "deleted file mode", "rename ", "Binary")):
            raise PatchError(
                f"unsupported change ({line.strip()}): patches may only modify "
                "existing upstream files; add new modules under torch_overlay/"
            )
        if line.startswith(("index ", "old mode", "new mode", "similarity")):
            i += 1
            continue
        if line.startswith("--- "):
            old = line[4:].rstrip("\n")
            if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
                raise PatchError(f"'---' line without '+++' line: {old}")
            new = lines[i + 1][4:].rstrip("\n")
            path = _strip_prefix(old, "a/")
            if _strip_prefix(new, "b/") != path:
                raise PatchError(f"renames are not supported: {old} -> {new}")
            files.append(FileDiff(path, []))
            i += 2
            continue
        match = _HUNK_HEADER.match(line)
        if match:
            if not files:
                raise PatchError("hunk before any file header")
            old_count = int(match.group(2) or "1")
            new_count = int(match.group(4) or "1")
            hunk = Hunk(
                int(match.group(1)),
                [],
                [],
                header=line.rstrip("\n"),
                new_start=int(match.group(3)),
            )
            i += 1
            while (
                len(hunk.old_lines) < old_count or len(hunk.new_lines) < new_count
            ) and i < len(lines):
                body = lines[i]
                tag, text = body[:1], body[1:]
                if tag == " ":
                    hunk.old_lines.append(text)
                    hunk.new_lines.append(text)
                elif tag == "-":
                    hunk.old_lines.append(text)
                    hunk.removed.append(text)
                elif tag == "+":
                    hunk.new_lines.append(text)
                    hunk.added.append(text)
                elif body.startswith("\\"):
                    pass
                else:
                    raise PatchError(f"unexpected line in hunk: {body!r}")
                i += 1
                if i < len(lines) and lines[i].startswith(
                    "\\ No newline at end of file"
                ):
                    target = hunk.new_lines if tag == "+" else hunk.old_lines
                    target[-1] = target[-1].rstrip("\n")
                    if tag == " ":
                        hunk.new_lines[-1] = hunk.new_lines[-1].rstrip("\n")
                    i += 1
            if len(hunk.old_lines) != old_count or len(hunk.new_lines) != new_count:
                raise PatchError(
                    f"truncated hunk in {files[-1].path} at line {hunk.old_start}"
                )
            files[-1].hunks.append(hunk)
            continue
        if line.strip() == "":
            i += 1
            continue
        raise PatchError(f"unexpected line outside a hunk: {line!r}")
    return files


def reverse(file_diff: FileDiff) -> FileDiff:
    """The diff that undoes ``file_diff``: applied to its result, it gives its original."""
    return FileDiff(
        file_diff.path,
        [
            Hunk(
                hunk.new_start,
                hunk.new_lines,
                hunk.old_lines,
                header=hunk.header,
                removed=hunk.added,
                added=hunk.removed,
                new_start=hunk.old_start,
            )
            for hunk in file_diff.hunks
        ],
    )


def apply_exact(original: str, file_diff: FileDiff) -> str:
    """Return ``original`` with ``file_diff`` applied; raise on any drift.

    Every hunk must match at exactly the line its header names: no offset and no
    fuzz.  The error names the file, the hunk and the first differing line.
    """
    source = original.splitlines(keepends=True)
    result: list[str] = []
    cursor = 0
    for number, hunk in enumerate(file_diff.hunks, start=1):
        # A pure insertion at line 0 has old_start 0; otherwise it is 1-based.
        start = hunk.old_start - 1 if hunk.old_lines else hunk.old_start
        actual = source[start : start + len(hunk.old_lines)]
        if start < cursor or actual != hunk.old_lines:
            detail = "hunk overlaps the previous one"
            for offset, (want, got) in enumerate(
                zip(hunk.old_lines, actual + [""] * len(hunk.old_lines), strict=False)
            ):
                if want != got:
                    detail = (
                        f"line {start + offset + 1}: expected {want!r}, found {got!r}"
                    )
                    break
            raise PatchError(
                f"{file_diff.path}: hunk #{number} (@@ -{hunk.old_start}) does not apply "
                f"exactly ({detail}); refresh the patch against the pristine base"
            )
        result.extend(source[cursor:start])
        result.extend(hunk.new_lines)
        cursor = start + len(hunk.old_lines)
    result.extend(source[cursor:])
    return "".join(result)


def apply_at_any_offset(original: str, file_diff: FileDiff) -> str:
    """Like :func:`apply_exact`, but a hunk may sit at another line than its header names.

    Every line of every hunk must still match exactly (no fuzz); a hunk is
    taken at the matching place nearest to the line its header names, after
    the previous hunk.  For text whose earlier lines were edited since the
    diff was made (an overlay module, see ``overlay.py``).
    """
    source = original.splitlines(keepends=True)
    hunks = []
    cursor = 0
    for number, hunk in enumerate(file_diff.hunks, start=1):
        expected = hunk.old_start - 1 if hunk.old_lines else hunk.old_start
        size = len(hunk.old_lines)
        places = [
            start
            for start in range(cursor, len(source) - size + 1)
            if source[start : start + size] == hunk.old_lines
        ]
        if not places:
            raise PatchError(
                f"{file_diff.path}: hunk #{number} ({hunk.header}) matches nowhere "
                "after the previous one"
            )
        start = min(places, key=lambda place: abs(place - expected))
        hunks.append(
            dataclasses.replace(hunk, old_start=start + 1 if hunk.old_lines else start)
        )
        cursor = start + size
    return apply_exact(original, FileDiff(file_diff.path, hunks))
