"""The patch series on disk: ``patches/series`` plus one file per patch.

``series`` names the patches in the order they apply and, on a line
``# base: torch==X.Y.Z``, the PyTorch release they apply to: every command
(``check``, ``build``, ``apply-source``, ``queue``) takes its base from there,
and ``rebase`` followed by ``export`` is what changes it.

A patch file is a header in the spirit of DEP-3, a line ``---``, then the diff::

    Subject: [inductor] One line that becomes the upstream PR title
    Description: What the patch does, in one line.
     Why it exists, on continuation lines indented by one space (DEP-3),
     with " ." for an empty line.
    Forwarded: no
    Last-Update: 2026-11-21
    ---
    diff --git a/torch/... b/torch/...

``Subject``, ``Description``, ``Forwarded`` and ``Last-Update`` are required.
``Forwarded`` is ``no``, ``not-needed`` or the URL of the upstream PR.  In the
patch queue the header becomes the commit message: the subject is its first
line, the other fields follow a blank line, verbatim.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

REQUIRED_FIELDS = ("Subject", "Description", "Forwarded", "Last-Update")
_FIELD = re.compile(r"^([A-Za-z-]+): ?(.*)$")
_BASE_LINE = re.compile(r"^#\s*base:\s*torch==(\S+)\s*$")


class SeriesError(Exception):
    """The series or a patch header is malformed."""


@dataclasses.dataclass
class Patch:
    file_name: str
    subject: str
    header_body: str  # every header line after Subject, newline-terminated
    diff: str

    @property
    def fields(self) -> dict[str, str]:
        """The header's fields; a folded field (continuation lines) is joined with spaces."""
        fields = {"Subject": self.subject}
        name = None
        for line in self.header_body.splitlines():
            match = _FIELD.match(line)
            if match and not line.startswith(" "):
                name = match.group(1)
                fields[name] = match.group(2)
            elif name is not None and line.startswith(" ") and line.strip() != ".":
                fields[name] = f"{fields[name]} {line.strip()}".strip()
        return fields

    @property
    def overlay_modules(self) -> list[str]:
        """The overlay modules this patch introduces (its ``Overlay:`` field)."""
        return [
            name.strip()
            for name in self.fields.get("Overlay", "").split(",")
            if name.strip()
        ]

    def commit_message(self) -> str:
        return f"{self.subject}\n\n{self.header_body}"

    def render(self) -> str:
        return f"Subject: {self.subject}\n{self.header_body}---\n{self.diff}"

    def validate(self) -> None:
        missing = [name for name in REQUIRED_FIELDS if not self.fields.get(name)]
        if missing:
            raise SeriesError(f"{self.file_name}: header lacks {', '.join(missing)}")
        forwarded = self.fields["Forwarded"]
        if forwarded not in ("no", "not-needed") and not forwarded.startswith(
            "https://"
        ):
            raise SeriesError(
                f"{self.file_name}: Forwarded must be 'no', 'not-needed' or a URL, got {forwarded!r}"
            )
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", self.fields["Last-Update"]):
            raise SeriesError(f"{self.file_name}: Last-Update must be YYYY-MM-DD")


def parse_patch(file_name: str, text: str) -> Patch:
    header, separator, diff = text.partition("\n---\n")
    if not separator:
        raise SeriesError(f"{file_name}: no '---' line between header and diff")
    first, _, rest = header.partition("\n")
    if not first.startswith("Subject: "):
        raise SeriesError(f"{file_name}: the header must start with 'Subject: '")
    body = rest + "\n" if rest else ""
    return Patch(file_name, first[len("Subject: ") :], body, diff)


def patch_from_commit(file_name: str, message: str, diff: str) -> Patch:
    subject, _, body = message.strip("\n").partition("\n")
    body = body.strip("\n")
    return Patch(file_name, subject.strip(), body + "\n" if body else "", diff)


def file_name_for(index: int, subject: str) -> str:
    """Stable name from position and subject; no hashes, no dates."""
    title = re.sub(r"^\[[^\]]*\]\s*", "", subject)
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:60].rstrip("-")
    return f"{index:04d}-{slug}.patch"


def read_series(patch_dir: Path) -> list[Patch]:
    """Read ``series`` and every patch it names, in order; validate headers."""
    series_file = patch_dir / "series"
    if not series_file.is_file():
        raise SeriesError(f"{series_file} does not exist")
    patches = []
    for line in series_file.read_text().splitlines():
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        path = patch_dir / name
        if not path.is_file():
            raise SeriesError(f"series names {name}, which does not exist")
        patch = parse_patch(name, path.read_text())
        patch.validate()
        patches.append(patch)
    return patches


def read_base(patch_dir: Path) -> str:
    """The torch release the series applies to (``# base: torch==X.Y.Z`` in ``series``)."""
    series_file = patch_dir / "series"
    if not series_file.is_file():
        raise SeriesError(f"{series_file} does not exist")
    for line in series_file.read_text().splitlines():
        match = _BASE_LINE.match(line.strip())
        if match:
            return match.group(1)
    raise SeriesError(
        f"{series_file} has no '# base: torch==X.Y.Z' line naming the release it applies to"
    )


def render_series(patches: list[Patch], base: str) -> str:
    header = (
        f"# Applied in this order to pristine PyTorch v{base} files.\n"
        "# Written by `python scripts/patchstack.py export`; see CONTRIBUTING.md.\n"
        f"# base: torch=={base}\n"
    )
    return header + "".join(f"{patch.file_name}\n" for patch in patches)


# Where tools look for the torch release a project needs: written by export
# from the series' base, checked against it by check.
REQUIREMENTS_FILE = "requirements.txt"


def render_requirements(base: str) -> str:
    """``requirements.txt``: the torch release ``base`` the series applies to, for tools to find."""
    return (
        "# The PyTorch release the patch stack in patches/ is based on.  Written\n"
        "# by `python scripts/patchstack.py export` from the '# base:' line of\n"
        "# patches/series, which every patchstack command reads; `patchstack\n"
        "# check` fails when the two differ.  scripts/bootstrap.sh installs a\n"
        "# patched build of this release (from its official wheel) into .venv/;\n"
        "# `pip install -r` of this file installs the unpatched release and its\n"
        "# dependencies.\n"
        f"torch=={base}\n"
    )


# Where the test files that patches carry live: the repository's own test
# directories, at upstream's paths.  Everything else under test/ (the tooling's
# tests, the conftest.py files) is this repository's and never carried.
CARRIED_TEST_DIRS = ("test/inductor", "test/distributed")
_NEVER_CARRIED = ("conftest.py",)


def is_test_file(path: str) -> bool:
    """Whether ``path`` (a repository path) is a test file that patches carry."""
    parent, _, name = path.rpartition("/")
    return (
        parent in CARRIED_TEST_DIRS
        and name.endswith(".py")
        and name not in _NEVER_CARRIED
    )


def carried_test_files(root: Path) -> list[Path]:
    """The test files under ``root`` that patches carry, relative to ``root``, sorted."""
    return sorted(
        path.relative_to(root)
        for directory in CARRIED_TEST_DIRS
        for path in (root / directory).glob("*.py")
        if is_test_file(path.relative_to(root).as_posix())
    )


def overlay_files(overlay_dir: Path) -> list[Path]:
    """Overlay modules relative to ``overlay_dir``, sorted, caches excluded."""
    return sorted(
        path.relative_to(overlay_dir)
        for path in overlay_dir.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    )


def stack_digest(patch_dir: Path, overlay_dir: Path) -> str:
    """Digest of everything a build depends on: series, patches, overlay."""
    digest = hashlib.sha256()
    for path in [patch_dir / "series", *sorted(patch_dir.glob("*.patch"))]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    for relative in overlay_files(overlay_dir):
        digest.update(
            str(relative).encode()
            + b"\0"
            + (overlay_dir / relative).read_bytes()
            + b"\0"
        )
    return digest.hexdigest()
