"""The pristine base: the official torch 2.13.0 wheel and the files in it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from . import BASE_TORCH_VERSION


class BaseVersionError(Exception):
    """The torch offered as a base is not the version the stack is written for."""


def wheel_version(wheel: Path) -> str:
    """The ``Version:`` of a wheel's METADATA, e.g. ``2.13.0+cpu``."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        if len(metadata) != 1:
            raise BaseVersionError(f"{wheel} is not a wheel (no single dist-info/METADATA)")
        for line in archive.read(metadata[0]).decode().splitlines():
            if line.startswith("Version: "):
                return line[len("Version: ") :].strip()
    raise BaseVersionError(f"{wheel}: METADATA has no Version field")


def require_base_version(version: str, what: str) -> None:
    """Refuse, before anything is written, any torch other than the base."""
    if version.split("+", 1)[0] != BASE_TORCH_VERSION:
        raise BaseVersionError(
            f"{what} is torch {version}, but this patch stack is written against "
            f"PyTorch v{BASE_TORCH_VERSION}; refusing to patch it (nothing was changed). "
            f"Use the {BASE_TORCH_VERSION} wheel, or rebase the series onto the other "
            "version first (CONTRIBUTING.md, 'Rebasing the stack')."
        )


def find_official_wheel(build_dir: Path, explicit: str | None = None) -> Path:
    """Locate the official wheel: an explicit path, $TORCH_PATCH_STACK_WHEEL,
    a wheel already in ``build/wheels``, or ``pip download torch==2.13.0``."""
    explicit = explicit or os.environ.get("TORCH_PATCH_STACK_WHEEL")
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise FileNotFoundError(f"torch wheel {path} does not exist")
        return path
    wheel_dir = build_dir / "wheels"
    found = sorted(wheel_dir.glob(f"torch-{BASE_TORCH_VERSION}*.whl"))
    if found:
        return found[-1]
    wheel_dir.mkdir(parents=True, exist_ok=True)
    print(f"patchstack: fetching the official torch=={BASE_TORCH_VERSION} wheel", file=sys.stderr)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
         "--only-binary=:all:", "-d", str(wheel_dir), f"torch=={BASE_TORCH_VERSION}"],
        check=True,
    )
    found = sorted(wheel_dir.glob(f"torch-{BASE_TORCH_VERSION}*.whl"))
    if not found:
        raise FileNotFoundError(f"pip download left no torch {BASE_TORCH_VERSION} wheel in {wheel_dir}")
    return found[-1]


def extract_python_tree(wheel: Path, dest: Path) -> Path:
    """Extract the wheel's ``torch/**.py`` files into ``dest`` (cached)."""
    require_base_version(wheel_version(wheel), str(wheel))
    stamp = dest / ".extracted-from"
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
