"""The pristine base: the official torch wheel of the series' base release and the files in it."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator


# Written by extract_python_tree beside the files it extracted; not a torch file.
PRISTINE_STAMP = ".extracted-from"


class BaseVersionError(Exception):
    """The torch offered as a base is not the release the stack is written for,
    or cannot be found."""


def release(version: str) -> str:
    """``2.15.0`` for ``2.15.0+cu132`` (the local label names a build, not the sources)."""
    return version.split("+", 1)[0]


def require_release_version(version: str) -> None:
    """Refuse anything but a final release ``X.Y.Z``: the stack is kept against releases."""
    if not re.fullmatch(r"\d+\.\d+\.\d+", version):
        raise BaseVersionError(
            f"{version!r} is not a PyTorch release version (X.Y.Z, e.g. 2.15.0); nothing was changed"
        )


def version_in_version_py(text: str) -> str | None:
    """The ``__version__`` that a ``torch/version.py`` assigns, e.g. ``2.15.0+cu132``."""
    match = re.search(r"^__version__ = '([^']+)'", text, flags=re.MULTILINE)
    return match.group(1) if match else None


def wheel_version(wheel: Path) -> str:
    """The ``Version:`` of a wheel's METADATA, e.g. ``2.13.0+cpu``."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        if len(metadata) != 1:
            raise BaseVersionError(
                f"{wheel} is not a wheel (no single dist-info/METADATA)"
            )
        for line in archive.read(metadata[0]).decode().splitlines():
            if line.startswith("Version: "):
                return line[len("Version: ") :].strip()
    raise BaseVersionError(f"{wheel}: METADATA has no Version field")


def require_base_version(version: str, base: str, what: str) -> None:
    """Refuse, before anything is written, any torch other than ``base``."""
    if release(version) != base:
        raise BaseVersionError(
            f"{what} is torch {version}, but this patch stack is written against "
            f"PyTorch v{base} (patches/series); refusing to patch it (nothing was changed). "
            f"Use the {base} wheel, or rebase the series onto the other version first: "
            "python scripts/patchstack.py rebase --onto VERSION"
        )


def _wheels_of(wheel_dir: Path, base: str) -> list[Path]:
    # File names are torch-<version>-<tags>.whl; compare the release exactly
    # (a glob on "torch-2.1.0*" would also take 2.1.0's neighbours).
    return sorted(
        path
        for path in wheel_dir.glob("torch-*.whl")
        if release(path.name.split("-")[1]) == base
    )


def find_official_wheel(
    build_dir: Path, base: str, explicit: str | None = None
) -> Path:
    """Locate the official wheel of release ``base``.

    In order: ``explicit`` (a path), ``$TORCH_PATCH_STACK_WHEEL`` when it is
    that release, a wheel already in ``build/wheels``, or ``pip download
    torch==base`` into ``build/wheels``.  Raises :class:`BaseVersionError`
    when none can be had; nothing else is written then.
    """
    require_release_version(base)
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise FileNotFoundError(f"torch wheel {path} does not exist")
        return path
    from_env = os.environ.get("TORCH_PATCH_STACK_WHEEL")
    if (
        from_env
        and Path(from_env).is_file()
        and release(wheel_version(Path(from_env))) == base
    ):
        return Path(from_env)
    wheel_dir = build_dir / "wheels"
    found = _wheels_of(wheel_dir, base)
    if found:
        return found[-1]
    print(f"patchstack: fetching the official torch=={base} wheel", file=sys.stderr)
    with _scratch_dir(wheel_dir) as download_dir:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--only-binary=:all:",
                "-d",
                str(download_dir),
                f"torch=={base}",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        downloaded = _wheels_of(download_dir, base)
        if result.returncode != 0 or not downloaded:
            from .pip_constraints import explain_refusal

            raise BaseVersionError(
                f"no official torch=={base} wheel for this Python could be fetched "
                "(nothing was changed):\n"
                + explain_refusal(
                    sys.executable, base, "download", pip_error=result.stderr
                )
                + "\nOr give the wheel: --wheel PATH, or TORCH_PATCH_STACK_WHEEL=PATH"
            )
        wheel_dir.mkdir(parents=True, exist_ok=True)
        target = wheel_dir / downloaded[-1].name
        os.replace(downloaded[-1], target)
    return target


@contextlib.contextmanager
def _scratch_dir(wheel_dir: Path) -> Iterator[Path]:
    # A failed or interrupted download must leave no partial wheel where
    # lookups would find it.
    path = wheel_dir.parent / f".{wheel_dir.name}.download"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def extract_python_tree(wheel: Path, base: str, dest: Path) -> Path:
    """Extract the wheel's ``torch/**.py`` files into ``dest`` (cached)."""
    require_base_version(wheel_version(wheel), base, str(wheel))
    stamp = dest / PRISTINE_STAMP
    stat = wheel.resolve().stat()
    identity = f"{wheel.resolve()} {stat.st_size} {stat.st_mtime_ns}"
    if stamp.is_file() and stamp.read_text() == identity:
        return dest
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.startswith("torch/") and name.endswith(".py"):
                target = dest / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(archive.read(name))
    stamp.write_text(identity)
    return dest
