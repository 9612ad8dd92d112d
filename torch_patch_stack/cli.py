"""``python scripts/patchstack.py <command>``: the patch stack's command line.

The base release is the one ``patches/series`` names (``# base: torch==X.Y.Z``).

Commands (run ``--help`` on each for options):

  check         patches/ is exactly what export would write, and every patch
                applies exactly (no offset, no fuzz) to the pristine base
  queue         materialize the patch queue (git, one commit per patch)
  export        write the queue's commits back to patches/ (and its base to series
                and requirements.txt)
  sizes         each patch's changed lines as the queue has them; fails on a
                patch over 800 lines
  rebase        replay the queue onto another torch release (three-way merges;
                --continue / --abort after a conflict)
  build         build the patched wheel from the official wheel (--upto: a prefix)
  prefix        a hard-linked torch tree of a prefix of the series, for its tests
  status        which patch stack the installed torch carries
  apply-source  commit the stack onto a PyTorch git checkout at the base release
"""

from __future__ import annotations

import argparse
import difflib
import filecmp
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from . import STACK_NAME
from . import (
    overlay,
    prefix,
    pristine,
    queue,
    rebase,
    series,
    sizes,
    source,
    unified_diff,
    wheel,
)

REPO_ROOT = Path(__file__).resolve().parent.parent


class Layout:
    def __init__(self, root: Path):
        self.root = root
        self.patches = root / "patches"
        self.overlay = root / "torch_overlay"
        self.build = root / "build"

    @property
    def base(self) -> str:
        """The torch release patches/series applies to."""
        return series.read_base(self.patches)

    def pristine_tree(self, wheel_path: str | None, base: str | None = None) -> Path:
        """The Python files of release ``base`` (default: the series' base), extracted once."""
        base = base or self.base
        official = pristine.find_official_wheel(self.build, base, wheel_path)
        return pristine.extract_python_tree(
            official, base, self.build / f"pristine-{base}"
        )


def _drift_report(expected: Path, actual: Path) -> list[str]:
    problems = []
    expected_names = {p.name for p in expected.iterdir()}
    actual_names = {
        p.name for p in actual.iterdir() if p.name == "series" or p.suffix == ".patch"
    }
    for name in sorted(expected_names - actual_names):
        problems.append(f"missing from patches/: {name}")
    for name in sorted(actual_names - expected_names):
        problems.append(f"not produced by export: patches/{name}")
    for name in sorted(expected_names & actual_names):
        if not filecmp.cmp(expected / name, actual / name, shallow=False):
            diff = difflib.unified_diff(
                (actual / name).read_text().splitlines(),
                (expected / name).read_text().splitlines(),
                f"patches/{name}",
                f"exported/{name}",
                lineterm="",
                n=1,
            )
            problems.append(
                f"differs from its export: patches/{name}\n"
                + "\n".join(list(diff)[:20])
            )
    return problems


def _overlay_drift(expected: dict[str, str], overlay_dir: Path) -> list[str]:
    names = [
        *series.overlay_files(overlay_dir),
        *series.carried_test_files(overlay_dir.parent),
    ]
    actual = {
        name.as_posix(): overlay.new_file_path(overlay_dir, name.as_posix()).read_text()
        for name in names
    }
    return [
        f"{'' if series.is_test_file(path) else 'torch_overlay/'}{path} differs "
        "from the queue's"
        for path in sorted(set(expected) | set(actual))
        if expected.get(path) != actual.get(path)
    ]


def _requirements_drift(layout: Layout, base: str) -> list[str]:
    path = layout.root / series.REQUIREMENTS_FILE
    if path.is_file() and path.read_text() == series.render_requirements(base):
        return []
    declared = (
        re.findall(r"^torch\S*", path.read_text(), flags=re.MULTILINE)
        if path.is_file()
        else []
    )
    return [
        f"{series.REQUIREMENTS_FILE} "
        + (
            f"declares {', '.join(declared) or 'no torch'}"
            if path.is_file()
            else "is missing"
        )
        + f", but patches/series' base is torch=={base}: export writes it from the series"
    ]


def cmd_check(args, layout: Layout) -> int:
    patches = series.read_series(layout.patches)
    base = layout.base
    pristine_tree = layout.pristine_tree(args.wheel, base)
    with tempfile.TemporaryDirectory(prefix="patchstack-check-") as tmp:
        queue_dir, exported = Path(tmp) / "queue", Path(tmp) / "exported"
        queue.materialize(queue_dir, pristine_tree, patches, base, layout.overlay)
        exported_patches, modules = queue.export(queue_dir)
        queue.write_patches(exported, exported_patches, queue.queue_base(queue_dir))
        problems = _drift_report(exported, layout.patches)
        problems += _overlay_drift(modules, layout.overlay)
        problems += _requirements_drift(layout, base)
    if problems:
        print("patchstack check: FAILED\n" + "\n".join(problems), file=sys.stderr)
        print(
            "Re-export from the queue: python scripts/patchstack.py queue && "
            "python scripts/patchstack.py export",
            file=sys.stderr,
        )
        return 1
    print(
        f"patchstack check: OK ({len(patches)} patches apply exactly to pristine torch {base}, "
        "every prefix with its overlay modules and tests; patches/, torch_overlay/ and the "
        "carried tests match their export)"
    )
    return 0


def cmd_sizes(args, layout: Layout) -> int:
    table, problems = sizes.report(
        sizes.measure(series.read_series(layout.patches), layout.overlay),
        args.limit,
    )
    print("\n".join(table))
    if problems:
        print(
            "patchstack sizes: FAILED\n" + "\n".join(problems),
            file=sys.stderr,
        )
        return 1
    return 0


def cmd_queue(args, layout: Layout) -> int:
    queue_dir = Path(args.dir)
    if queue_dir.exists() and not args.force:
        if rebase.in_progress(queue_dir):
            print(
                f"a rebase is in progress in {queue_dir}: rebase --continue or --abort, or pass --force",
                file=sys.stderr,
            )
            return 1
        ahead = queue.git(queue_dir, "status", "--porcelain").strip()
        exported, modules = (
            queue.export(queue_dir) if (queue_dir / ".git").exists() else ([], {})
        )
        if (
            ahead
            or [p.render() for p in exported]
            != [p.render() for p in series.read_series(layout.patches)]
            or _overlay_drift(modules, layout.overlay)
        ):
            print(
                f"{queue_dir} holds changes not exported to patches/; export them or pass --force",
                file=sys.stderr,
            )
            return 1
    base = layout.base
    queue.materialize(
        queue_dir,
        layout.pristine_tree(args.wheel, base),
        series.read_series(layout.patches),
        base,
        layout.overlay,
    )
    print(
        f"patch queue ready in {queue_dir} (branch 'queue', base tag 'pristine'); "
        "edit with git, then: python scripts/patchstack.py export"
    )
    return 0


def cmd_export(args, layout: Layout) -> int:
    queue_dir = Path(args.dir)
    if rebase.in_progress(queue_dir):
        print(
            f"a rebase is in progress in {queue_dir}: rebase --continue or --abort first",
            file=sys.stderr,
        )
        return 1
    if queue.git(queue_dir, "status", "--porcelain", "--untracked-files=no").strip():
        print(
            f"{queue_dir} has uncommitted changes; commit them first", file=sys.stderr
        )
        return 1
    patches, modules = queue.export(queue_dir)
    base = queue.queue_base(queue_dir)
    queue.write_patches(layout.patches, patches, base)
    queue.write_new_files(layout.overlay, modules)
    (layout.root / series.REQUIREMENTS_FILE).write_text(
        series.render_requirements(base)
    )
    print(
        f"exported {len(patches)} patches onto torch {base} to {layout.patches}, "
        f"{len(modules)} overlay modules and test files to {layout.overlay} and test/, "
        f"and torch=={base} to {series.REQUIREMENTS_FILE}"
    )
    return 0


def cmd_rebase(args, layout: Layout) -> int:
    queue_dir = Path(args.dir)
    if args.abort:
        restored = rebase.abort(queue_dir)
        print(f"rebase aborted; {queue_dir} is back on torch {restored} as it was")
        return 0
    if args.resume:
        outcome = rebase.resume(queue_dir)
    else:
        # Everything that can refuse is checked before the queue is touched.
        pristine.require_release_version(args.onto)
        if rebase.in_progress(queue_dir):
            raise rebase.RebaseError(
                f"a rebase is already in progress in {queue_dir}: use --continue or --abort"
            )
        if (queue_dir / ".git").exists():
            if queue.git(
                queue_dir, "status", "--porcelain", "--untracked-files=no"
            ).strip():
                raise rebase.RebaseError(
                    f"{queue_dir} has uncommitted changes; commit and export them, or discard them "
                    "(queue --force), first; nothing was changed"
                )
            rebase.check_series_matches_queue(queue_dir, layout.patches)
        if args.onto == layout.base:
            raise rebase.RebaseError(
                f"patches/series is already on torch {args.onto}; nothing was changed"
            )
        target = layout.pristine_tree(args.wheel, args.onto)
        if not (queue_dir / ".git").exists():
            base = layout.base
            queue.materialize(
                queue_dir,
                layout.pristine_tree(None, base),
                series.read_series(layout.patches),
                base,
                layout.overlay,
            )
        outcome = rebase.start(queue_dir, args.onto, target)
    print(outcome.render(queue_dir))
    if outcome.finished:
        dropped = {
            name for name, status in outcome.patches if status.startswith("dropped")
        }
        for patch in series.read_series(layout.patches):
            if patch.file_name not in dropped:
                continue
            for module in patch.overlay_modules:
                print(
                    f"note: torch_overlay/{module} is no longer claimed ({patch.file_name} "
                    "was dropped): "
                    "delete it if upstream ships it now, or name it in another patch's Overlay:"
                )
    return 0 if outcome.finished else 2


def cmd_build(args, layout: Layout) -> int:
    official = pristine.find_official_wheel(layout.build, layout.base, args.wheel)
    upto = None
    if args.upto is not None:
        upto = overlay.resolve_upto(series.read_series(layout.patches), args.upto)
    built = wheel.build(official, layout.patches, layout.overlay, Path(args.out), upto)
    print(built)
    return 0


def cmd_prefix(args, layout: Layout) -> int:
    """A torch package tree for the first patches of the series, made from an installed one."""
    patches = series.read_series(layout.patches)
    count = overlay.resolve_upto(patches, args.upto)
    built = prefix.make_tree(
        patches,
        count,
        layout.pristine_tree(args.wheel, layout.base),
        layout.overlay,
        Path(args.torch_dir),
        Path(args.dest),
    )
    print(built)
    return 0


def _torch_dir(python: str) -> Path | None:
    probe = (
        "import importlib.util, os; s = importlib.util.find_spec('torch'); "
        "print(os.path.dirname(s.origin) if s else '')"
    )
    result = subprocess.run(
        [python, "-c", probe], capture_output=True, text=True, check=False
    )
    location = result.stdout.strip()
    return Path(location) if result.returncode == 0 and location else None


def cmd_status(args, layout: Layout) -> int:
    python = args.python or (
        str(layout.root / ".venv/bin/python")
        if (layout.root / ".venv/bin/python").exists()
        else sys.executable
    )
    torch_dir = _torch_dir(python)
    if torch_dir is None:
        print(f"no torch installed for {python}; run ./scripts/bootstrap.sh")
        return 1
    info = wheel.installed_stack_info(torch_dir)
    if info is None:
        print(f"torch at {torch_dir} is stock: it carries no patch stack")
        return 1
    current = series.stack_digest(layout.patches, layout.overlay)
    if args.json:
        print(
            json.dumps(
                {
                    **info,
                    "torch_dir": str(torch_dir),
                    "up_to_date": info["digest"] == current,
                }
            )
        )
    else:
        print(f"torch {info['base_torch']} at {torch_dir}")
        print(f"patch stack: {info['stack']}  digest {info['digest'][:16]}")
        for patch in info["patches"]:
            print(f"  {patch['file']}  {patch['subject']}")
        for module in info["overlay"]:
            print(f"  + {module}")
        if info["digest"] == current:
            print("up to date with patches/ and torch_overlay/")
        else:
            print(
                "STALE: patches/ or torch_overlay/ changed since this build; run ./scripts/bootstrap.sh"
            )
    return 0 if info["stack"] == STACK_NAME and info["digest"] == current else 2


def cmd_apply_source(args, layout: Layout) -> int:
    subjects = source.apply_to_checkout(
        Path(args.checkout), layout.patches, layout.overlay
    )
    print(f"committed {len(subjects)} patches onto {args.checkout}:")
    for subject in subjects:
        print(f"  {subject}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="patchstack",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--repo",
        default=str(REPO_ROOT),
        help="repository root (default: this checkout)",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    wheel_help = (
        "official torch wheel of the series' base release (default: $TORCH_PATCH_STACK_WHEEL, "
        "build/wheels, pip download)"
    )

    check = commands.add_parser(
        "check", help="verify patches/ against the pristine base release"
    )
    check.add_argument("--wheel", help=wheel_help)
    check.set_defaults(run=cmd_check)

    sizes_cmd = commands.add_parser(
        "sizes",
        help="each patch's changed lines (introduced modules, diff +/-); "
        f"fails on a patch over {sizes.LIMIT} lines",
        description=sizes.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sizes_cmd.add_argument("--limit", type=int, default=sizes.LIMIT)
    sizes_cmd.set_defaults(run=cmd_sizes)

    queue_cmd = commands.add_parser("queue", help="materialize the patch queue")
    queue_cmd.add_argument("--dir", default=str(REPO_ROOT / "build/queue"))
    queue_cmd.add_argument("--wheel", help=wheel_help)
    queue_cmd.add_argument(
        "--force", action="store_true", help="discard an unexported queue"
    )
    queue_cmd.set_defaults(run=cmd_queue)

    export = commands.add_parser("export", help="write the queue back to patches/")
    export.add_argument("--dir", default=str(REPO_ROOT / "build/queue"))
    export.set_defaults(run=cmd_export)

    rebase_cmd = commands.add_parser(
        "rebase",
        help="replay the queue onto another torch release",
        description="Replay the patch queue onto the pristine files of another torch release with "
        "three-way merges.  Exit status 0: done (then export); 2: stopped at a conflict "
        "that a person resolves in the queue (edit, git add), then --continue; 1: error, "
        "nothing changed.",
    )
    action = rebase_cmd.add_mutually_exclusive_group(required=True)
    action.add_argument(
        "--onto", metavar="VERSION", help="the release to move to, e.g. 2.15.0"
    )
    action.add_argument(
        "--continue",
        dest="resume",
        action="store_true",
        help="go on after resolving the conflicts of the patch it stopped at",
    )
    action.add_argument(
        "--abort",
        action="store_true",
        help="restore the queue as it was before the rebase",
    )
    rebase_cmd.add_argument("--dir", default=str(REPO_ROOT / "build/queue"))
    rebase_cmd.add_argument(
        "--wheel",
        help="official torch wheel of VERSION (default: build/wheels, pip download)",
    )
    rebase_cmd.set_defaults(run=cmd_rebase)

    build = commands.add_parser("build", help="build the patched wheel")
    build.add_argument("--wheel", help=wheel_help)
    build.add_argument("--out", default=str(REPO_ROOT / "build/dist"))
    build.add_argument(
        "--upto",
        metavar="PATCH",
        help="apply only the series up to PATCH (NNNN, its file name, or a count; "
        "0 builds stock torch)",
    )
    build.set_defaults(run=cmd_build)

    prefix_cmd = commands.add_parser(
        "prefix",
        help="a torch package tree of a prefix of the series, hard-linked from an "
        "installed torch (for testing a prefix)",
    )
    prefix_cmd.add_argument("--upto", metavar="PATCH", required=True)
    prefix_cmd.add_argument(
        "--torch-dir",
        required=True,
        help="an installed torch package of the base release (its torch/ directory)",
    )
    prefix_cmd.add_argument(
        "--dest",
        required=True,
        help="directory to create; put it first on PYTHONPATH to import the prefix",
    )
    prefix_cmd.add_argument("--wheel", help=wheel_help)
    prefix_cmd.set_defaults(run=cmd_prefix)

    status = commands.add_parser(
        "status", help="show the patch stack of the installed torch"
    )
    status.add_argument(
        "--python", help="interpreter to inspect (default: .venv/bin/python)"
    )
    status.add_argument("--json", action="store_true")
    status.set_defaults(run=cmd_status)

    apply_source = commands.add_parser(
        "apply-source", help="commit the stack onto a PyTorch checkout"
    )
    apply_source.add_argument(
        "checkout", help="clean PyTorch git checkout at the series' base release"
    )
    apply_source.set_defaults(run=cmd_apply_source)

    args = parser.parse_args(argv)
    layout = Layout(Path(args.repo).resolve())
    try:
        return args.run(args, layout)
    except (
        pristine.BaseVersionError,
        rebase.RebaseError,
        series.SeriesError,
        unified_diff.PatchError,
        FileNotFoundError,
        RuntimeError,
    ) as error:
        print(f"patchstack {args.command}: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
