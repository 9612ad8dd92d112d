"""Build a patched torch wheel from the official one.

The result is a real wheel whose files on disk are the patched modules: compile
workers are fresh processes, and ``torch._inductor.codecache.torch_key()``
hashes torch's source files into the FX graph cache key, so an import hook or a
monkeypatch would be neither seen by workers nor reflected in cache keys.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import zipfile
from pathlib import Path

from . import STACK_NAME
from . import series as series_mod
from . import overlay, unified_diff
from .pristine import require_base_version, wheel_version

# Written into the patched wheel so that an installed build identifies itself.
STACK_INFO_PATH = "torch/_patch_stack.json"


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def stack_info(
    patches: list[series_mod.Patch], modules: dict[str, str], digest: str, base: str
) -> dict:
    return {
        "stack": STACK_NAME,
        "base_torch": base,
        "digest": digest,
        "patches": [
            {
                "file": p.file_name,
                "subject": p.subject,
                "sha256": hashlib.sha256(p.render().encode()).hexdigest(),
            }
            for p in patches
        ],
        "overlay": sorted(modules),
    }


def build(
    official_wheel: Path,
    patch_dir: Path,
    overlay_dir: Path,
    out_dir: Path,
    upto: int | None = None,
) -> Path:
    """Write ``out_dir/<same name as official_wheel>`` with the stack applied.

    ``upto``: the number of patches of the series to apply (default: all),
    with the overlay modules of those patches as they stand after them.
    """
    base = wheel_version(official_wheel)
    require_base_version(base, series_mod.read_base(patch_dir), str(official_wheel))
    all_patches = series_mod.read_series(patch_dir)
    count = len(all_patches) if upto is None else upto
    patches = all_patches[:count]
    digest = series_mod.stack_digest(patch_dir, overlay_dir)
    if count != len(all_patches):
        digest = f"{digest}:upto{count}"
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / official_wheel.name
    partial = target.with_suffix(".partial")
    with zipfile.ZipFile(official_wheel) as source:
        names = set(source.namelist())
        upstream, modules = overlay.tree_after(
            all_patches,
            lambda path: source.read(path).decode() if path in names else None,
            overlay_dir,
            count,
        )
        # The tests the patches carry are the source tree's, not the wheel's.
        modules = {
            path: text
            for path, text in modules.items()
            if not series_mod.is_test_file(path)
        }
        replaced = {path: text.encode() for path, text in upstream.items()}
        added = {path: text.encode() for path, text in modules.items()}
        clashes = sorted(set(added) & names)
        if clashes:
            raise unified_diff.PatchError(
                f"torch_overlay/ may only add new modules; these exist upstream: {clashes} "
                "(change them with a patch instead)"
            )
        added[STACK_INFO_PATH] = (
            json.dumps(stack_info(patches, modules, digest, base), indent=2) + "\n"
        ).encode()
        record_name = next(
            n for n in source.namelist() if n.endswith(".dist-info/RECORD")
        )
        records = []
        with zipfile.ZipFile(
            partial, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1
        ) as sink:
            for info in source.infolist():
                if info.filename == record_name:
                    continue
                data = replaced.get(info.filename)
                if data is None:
                    data = source.read(info)
                sink.writestr(
                    info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=1
                )
                if not info.is_dir():
                    records.append(f"{info.filename},{_record_hash(data)},{len(data)}")
            for name, data in sorted(added.items()):
                sink.writestr(name, data)
                records.append(f"{name},{_record_hash(data)},{len(data)}")
            records.append(f"{record_name},,")
            sink.writestr(record_name, "\n".join(records) + "\n")
    os.replace(partial, target)
    return target


def installed_stack_info(torch_dir: Path) -> dict | None:
    path = torch_dir / Path(STACK_INFO_PATH).name
    return json.loads(path.read_text()) if path.is_file() else None
