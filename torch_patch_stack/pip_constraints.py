"""Why pip refuses the torch release the stack is based on, and what to do about it.

Managed machines often cap packages with a pip *constraints file* (``torch<=2.14.1``)
named in pip's configuration (``constraint = ...`` in a ``pip.conf``) or in
``PIP_CONSTRAINT``.  pip then refuses the base release with
``ResolutionImpossible``, naming neither the constraint nor where it is
configured.  :func:`explain_refusal` finds both, the way pip itself reads them
(``pip config debug``: every configuration file and ``PIP_*`` variable, with
their values), reads each constraints file and names the lines that exclude
the release, and says how to proceed.

Run by ``scripts/bootstrap.sh`` when pip fails to install the patched wheel
(``python -m torch_patch_stack.pip_constraints --version X.Y.Z < pip's
stderr``) and by ``patchstack build`` when ``pip download`` fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

# The configuration files pip reads, in its order of precedence (a later
# file's value of an option replaces an earlier one's), as ``pip config
# debug`` names them; PIP_CONSTRAINT replaces them all.
_FILE_VARIANTS = {
    "global": "pip's site-wide configuration file",
    "user": "the user's pip configuration file",
    "site": "the virtual environment's pip configuration file",
    "env": "the configuration file that PIP_CONFIG_FILE names",
}
# The remedy that lifts the constraints for one command: an explicit
# PIP_CONSTRAINT replaces whatever configuration files name (an empty one
# does not), and /dev/null constrains nothing.
REMEDY_VARIABLE = "PIP_CONSTRAINT=/dev/null"


@dataclasses.dataclass(frozen=True)
class ConstraintSource:
    """Where pip is told which constraints files to read, and which."""

    where: str  # "'global.constraint' in /etc/pip.conf (pip's site-wide ...)"
    files: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class RefusingLine:
    """A line of a constraints file that excludes the release."""

    file: str
    number: int
    text: str


def effective_constraints(
    config_debug: str, command: str = "install"
) -> ConstraintSource | None:
    """The constraints files that ``pip <command>`` reads, from ``pip config debug``'s output.

    The ``constraint`` option as pip resolves it: ``PIP_CONSTRAINT`` when it
    is set and not empty; otherwise the value in the configuration file of
    highest precedence that sets it, its ``[<command>]`` section over its
    ``[global]`` one.  None when nothing sets it.
    """
    candidates: list[tuple[tuple[int, int], ConstraintSource]] = []
    variant = current_file = None
    for line in config_debug.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            variant, current_file = line[:-1], None
            continue
        stripped = line.strip()
        if variant == "env_var":
            name, _, value = stripped.partition("=")
            paths = tuple(value.strip("'\"").split())
            if name == "PIP_CONSTRAINT" and paths:
                return ConstraintSource(
                    "the environment variable PIP_CONSTRAINT", paths
                )
            continue
        if variant not in _FILE_VARIANTS:
            continue
        file_line = re.fullmatch(r"(.+), exists: (True|False)", stripped)
        if file_line and not line.startswith("    "):
            current_file = file_line.group(1)
            continue
        key, _, value = stripped.partition(": ")
        section, _, option = key.partition(".")
        if current_file is None or option != "constraint":
            continue
        if section not in ("global", command):
            continue
        rank = (list(_FILE_VARIANTS).index(variant), section == command)
        where = f"'{key}' in {current_file} ({_FILE_VARIANTS[variant]})"
        candidates.append((rank, ConstraintSource(where, tuple(value.split()))))
    if not candidates:
        return None
    # Files of one variant are listed in increasing precedence too: the last
    # of the highest rank holds.
    best = max(rank for rank, _ in candidates)
    return [source for rank, source in candidates if rank == best][-1]


def _local_path(location: str) -> Path | None:
    if location.startswith("file:"):
        return Path(unquote(urlparse(location).path))
    if re.match(r"^[a-z][a-z0-9+.-]*://", location):
        return None  # http(s): not read here
    return Path(location)


def _specifier_admits(specifier: str, version: str) -> bool | None:
    # packaging is pip's own dependency; None when it cannot be imported.
    try:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet
    except ImportError:
        try:
            from pip._vendor.packaging.specifiers import (  # type: ignore[no-redef]
                InvalidSpecifier,
                SpecifierSet,
            )
        except ImportError:
            return None
    try:
        return SpecifierSet(specifier).contains(version, prereleases=True)
    except InvalidSpecifier:
        return None


def refusing_lines(
    location: str, project: str, version: str, _seen: frozenset[str] = frozenset()
) -> list[RefusingLine]:
    """The lines of constraints file ``location`` that exclude ``project==version``.

    Follows ``-c``/``-r`` includes.  A line naming the project whose
    specifier cannot be evaluated (a URL, a marker, no ``packaging``)
    counts as refusing: it is shown, the reader decides.
    """
    path = _local_path(location)
    if path is None or str(path) in _seen or not path.is_file():
        return []
    found = []
    wanted = re.sub(r"[-_.]+", "-", project).lower()
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        text = raw.split(" #", 1)[0].strip()
        if text.startswith("#") or not text:
            continue
        include = re.match(r"^(-c|-r|--constraint|--requirement)[ =]\s*(\S+)", text)
        if include:
            nested = include.group(2)
            if not Path(nested).is_absolute() and not re.match(r"^[a-z+]+:", nested):
                nested = str(path.parent / nested)  # relative to the including file
            found += refusing_lines(nested, project, version, _seen | {str(path)})
            continue
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)$", text)
        if not match or re.sub(r"[-_.]+", "-", match.group(1)).lower() != wanted:
            continue
        specifier, _, marker = match.group(3).partition(";")
        if marker.strip() or _specifier_admits(specifier.strip(), version) is not True:
            found.append(RefusingLine(str(path), number, raw.strip()))
    return found


def explain_refusal(
    python: str,
    version: str,
    command: str = "install",
    project: str = "torch",
    pip_error: str = "",
    rerun: str = "./scripts/bootstrap.sh",
) -> str:
    """Why ``python -m pip <command>`` refuses ``project==version``, and the remedy.

    Reads pip's configuration as ``python``'s pip sees it (``pip config
    debug``, in this process's environment).  Names each constraints file
    line that excludes the release and where pip is told to read that file;
    when no constraint excludes it, says so and quotes ``pip_error`` (the end
    of pip's own message), since something else refused it (no wheel for
    this Python or platform, an index that cannot be reached).  ``rerun``
    is the command the remedy shows.
    """
    wanted = f"{project}=={version}"
    debug = subprocess.run(
        [python, "-m", "pip", "config", "debug"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    lines = [f"pip refuses {wanted}, the release this patch stack is based on"]
    source = effective_constraints(debug, command)
    refusals = [
        line
        for location in (source.files if source is not None else ())
        for line in refusing_lines(location, project, version)
    ]
    if source is not None and refusals:
        for line in refusals:
            lines.append(
                f"  the constraint '{line.text}' (line {line.number} of {line.file}) "
                "excludes it;"
            )
        replaces = (
            "replaces the one set now"
            if source.where.startswith("the environment variable")
            else "replaces the constraints files that pip's configuration names"
        )
        lines += [
            f"  pip reads that file through {source.where}.",
            "Remedy, for this repository only (its .venv): run it again with "
            f"{REMEDY_VARIABLE} in the environment, e.g.",
            f"  {REMEDY_VARIABLE} {rerun}",
            f"  (a PIP_CONSTRAINT that is set {replaces}; /dev/null constrains nothing).",
            "Or lift the cap where it is set: "
            f"{', '.join(sorted({f'{line.file}:{line.number}' for line in refusals}))}.",
        ]
    else:
        configured = (
            ""
            if source is None
            else f" ({', '.join(source.files)}, through {source.where})"
        )
        lines.append(
            f"  no constraints file that pip reads excludes it{configured}; pip said:"
        )
        tail = [line for line in pip_error.strip().splitlines() if line.strip()][-8:]
        lines += [f"    {line}" for line in tail] or ["    (nothing)"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Explain why pip refuses a torch release (pip's stderr on stdin)."
    )
    parser.add_argument("--version", required=True, help="the torch release, X.Y.Z")
    parser.add_argument(
        "--python", default=sys.executable, help="the Python whose pip refused"
    )
    parser.add_argument("--command", default="install", choices=["install", "download"])
    parser.add_argument(
        "--rerun", default="./scripts/bootstrap.sh", help="the command to run again"
    )
    args = parser.parse_args(argv)
    pip_error = "" if sys.stdin.isatty() else sys.stdin.read()
    print(
        explain_refusal(
            args.python,
            args.version,
            args.command,
            pip_error=pip_error,
            rerun=args.rerun,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
