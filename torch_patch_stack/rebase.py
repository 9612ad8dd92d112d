"""Carry the patch queue onto another torch release: ``patchstack rebase``.

The queue (``queue.py``) is a git tree: a ``pristine`` commit holding one
release's Python files, then one commit per patch.  Rebasing it onto release
``V`` adds a commit holding ``V``'s files as a child of the old ``pristine``
(so ``git diff pristine@{old} <new>`` is exactly what upstream changed) and
replays the patch commits onto it with ``git rebase``: a three-way merge per
patch, with the file as the patch found it as the merge base.  Unlike the
strict application used by ``check`` and ``build``, a three-way merge carries
a hunk across upstream edits that do not touch its lines, and stops only
where upstream and the patch changed the same lines.

As with ``git rebase`` and ``gbp pq rebase``, a conflict stops the replay and
leaves the queue as a git state that a person resolves (edit, ``git add``),
then :func:`resume` (``--continue``) or :func:`abort` (``--abort``).  The
report of a stop names the patch, and per file the patch's hunks: merged, or
in conflict at which lines of the working file.  A patch that is empty after
the replay (upstream absorbed it) is dropped and reported.  Nothing under
``patches/`` changes: ``export`` writes the rebased queue back, and with it
the new base in ``patches/series``.

What a rebase in progress needs across invocations lives in
``.git/patchstack-rebase.json`` in the queue.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tempfile
from pathlib import Path

from . import series as series_mod
from . import unified_diff
from .pristine import PRISTINE_STAMP
from .queue import _DIFF_ARGS, export, git, pristine_message, queue_base, run_git

_STATE_FILE = "patchstack-rebase.json"
_MARKER = re.compile(r"^(<{7}|\|{7}|={7}|>{7})( |$)")


class RebaseError(Exception):
    """The rebase cannot start or go on; the message says why and what to do."""


@dataclasses.dataclass
class _State:
    base: str  # the release the queue was on
    onto: str  # the release it is rebased onto
    old_pristine: str
    new_pristine: str
    orig_head: str
    # The queue's patches before the rebase, in order: (commit, file name, subject).
    patches: list[tuple[str, str, str]]
    # File names of the patches a person resolved by hand, and how.
    resolved: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class HunkReport:
    header: str
    conflict_lines: list[tuple[int, int]]  # empty: merged


@dataclasses.dataclass
class FileReport:
    path: str
    state: str  # "merged", "conflict", or "deleted upstream"
    hunks: list[HunkReport]
    unmatched_conflicts: list[
        tuple[int, int]
    ]  # conflict regions no hunk of the patch explains


@dataclasses.dataclass
class Outcome:
    """Where a rebase stands after :func:`start` or :func:`resume`."""

    base: str
    onto: str
    finished: bool
    # Per patch of the queue before the rebase: "clean", "resolved by hand",
    # "dropped: ...", "conflict" (the one it stopped at) or "pending".
    patches: list[tuple[str, str]]
    stopped_at: str | None = None
    files: list[FileReport] = dataclasses.field(default_factory=list)

    def render(self, queue_dir: Path) -> str:
        lines = []
        if self.finished:
            lines.append(
                f"rebased the queue from torch {self.base} onto torch {self.onto}:"
            )
        else:
            lines.append(
                f"rebase of the queue from torch {self.base} onto torch {self.onto} stopped at "
                f"{self.stopped_at}: conflicts"
            )
        for name, status in self.patches:
            lines.append(f"  {name}: {status}")
            if name == self.stopped_at:
                lines.extend(_render_files(self.files))
        if self.finished:
            lines.append(
                "next: python scripts/patchstack.py export (writes patches/, torch_overlay/ and "
                "the new base into patches/series); then run the tests on the new base"
            )
        else:
            lines.append(
                f"resolve the conflicts in {queue_dir} (edit, then git add), then "
                "python scripts/patchstack.py rebase --continue (or --abort)"
            )
        return "\n".join(lines)


def _render_files(files: list[FileReport]) -> list[str]:
    lines = []
    for report in files:
        lines.append(f"    {report.path}: {report.state}")
        for number, hunk in enumerate(report.hunks, start=1):
            where = (
                "conflict at lines "
                + ", ".join(f"{a}-{b}" for a, b in hunk.conflict_lines)
                if hunk.conflict_lines
                else "merged"
            )
            lines.append(f"      hunk #{number} {hunk.header}: {where}")
        for a, b in report.unmatched_conflicts:
            lines.append(f"      conflict at lines {a}-{b}")
    return lines


# --- state ----------------------------------------------------------------------
def _git_dir(queue_dir: Path) -> Path:
    return Path(git(queue_dir, "rev-parse", "--absolute-git-dir").strip())


def _state_path(queue_dir: Path) -> Path:
    return _git_dir(queue_dir) / _STATE_FILE


def in_progress(queue_dir: Path) -> bool:
    """Whether a ``patchstack rebase`` of ``queue_dir`` waits for --continue or --abort."""
    return (queue_dir / ".git").exists() and _state_path(queue_dir).is_file()


def _load(queue_dir: Path) -> _State:
    if not in_progress(queue_dir):
        raise RebaseError(f"no patchstack rebase is in progress in {queue_dir}")
    raw = json.loads(_state_path(queue_dir).read_text())
    raw["patches"] = [tuple(entry) for entry in raw["patches"]]
    return _State(**raw)


def _save(queue_dir: Path, state: _State) -> None:
    _state_path(queue_dir).write_text(
        json.dumps(dataclasses.asdict(state), indent=2) + "\n"
    )


def _git_rebase_in_progress(queue_dir: Path) -> bool:
    git_dir = _git_dir(queue_dir)
    return (git_dir / "rebase-merge").exists() or (git_dir / "rebase-apply").exists()


# --- the three entry points -------------------------------------------------------
def start(queue_dir: Path, onto: str, pristine_tree: Path) -> Outcome:
    """Replay the queue in ``queue_dir`` onto release ``onto`` (its files in ``pristine_tree``).

    The queue must be clean (no uncommitted change) and hold no rebase in
    progress; the caller also checks that it matches ``patches/``.  Raises
    :class:`RebaseError` before changing anything otherwise.  Returns the
    outcome: finished, or stopped at a conflict for a person to resolve.
    """
    if in_progress(queue_dir) or _git_rebase_in_progress(queue_dir):
        raise RebaseError(
            f"a rebase is already in progress in {queue_dir}: use --continue or --abort"
        )
    if git(queue_dir, "status", "--porcelain", "--untracked-files=no").strip():
        raise RebaseError(
            f"{queue_dir} has uncommitted changes; commit or discard them first (nothing was changed)"
        )
    base = queue_base(queue_dir)
    if base == onto:
        raise RebaseError(f"the queue is already on torch {onto} (nothing was changed)")
    old_pristine = git(queue_dir, "rev-parse", "pristine^{commit}").strip()
    commits = git(queue_dir, "rev-list", "--reverse", "pristine..queue").split()
    patches = [
        (commit, patch.file_name, patch.subject)
        # export() reads HEAD, which is the queue branch in a queue made by
        # `patchstack queue`; pairing stops at the shorter list as it always has.
        for commit, patch in zip(commits, export(queue_dir)[0], strict=False)
    ]
    state = _State(
        base=base,
        onto=onto,
        old_pristine=old_pristine,
        new_pristine=_commit_tree(queue_dir, pristine_tree, old_pristine, onto),
        orig_head=git(queue_dir, "rev-parse", "queue").strip(),
        patches=patches,
    )
    git(queue_dir, "checkout", "-q", "queue")
    _save(queue_dir, state)
    result = run_git(
        queue_dir,
        "rebase",
        "--empty=drop",
        "--onto",
        state.new_pristine,
        old_pristine,
        "queue",
        env={"GIT_EDITOR": "true"},
    )
    return _after_git(queue_dir, state, result.returncode, result.stderr)


def resume(queue_dir: Path) -> Outcome:
    """Go on after a person resolved the conflicts of the patch the rebase stopped at.

    Refuses while files are unmerged or still hold conflict markers.  A
    resolution that leaves the patch empty drops it (reported).
    """
    state = _load(queue_dir)
    if not _git_rebase_in_progress(queue_dir):
        # The person finished the git rebase by hand: only the bookkeeping is left.
        if (
            run_git(
                queue_dir, "merge-base", "--is-ancestor", state.new_pristine, "HEAD"
            ).returncode
            == 0
        ):
            return _finish(queue_dir, state)
        raise RebaseError(
            f"the git rebase in {queue_dir} was ended by hand; use --abort to restore the queue"
        )
    unmerged = git(queue_dir, "diff", "--name-only", "--diff-filter=U").split()
    if unmerged:
        raise RebaseError(
            f"unresolved files in {queue_dir}: {unmerged}; edit them, then git add them"
        )
    stopped = git(queue_dir, "rev-parse", "REBASE_HEAD").strip()
    touched = git(queue_dir, "diff", "--name-only", f"{stopped}^", stopped).split()
    marked = [
        path
        for path in touched
        if (queue_dir / path).is_file() and _conflict_regions(queue_dir / path)
    ]
    if marked:
        raise RebaseError(
            f"conflict markers remain in {marked}; resolve them, then git add them"
        )
    name = _patch_name(state, stopped)
    if run_git(queue_dir, "diff", "--cached", "--quiet", "HEAD").returncode == 0:
        state.resolved[name] = "dropped: resolved to no change"
        _save(queue_dir, state)
        result = run_git(queue_dir, "rebase", "--skip", env={"GIT_EDITOR": "true"})
    else:
        state.resolved[name] = "resolved by hand"
        _save(queue_dir, state)
        result = run_git(queue_dir, "rebase", "--continue", env={"GIT_EDITOR": "true"})
    return _after_git(queue_dir, state, result.returncode, result.stderr)


def abort(queue_dir: Path) -> str:
    """Stop the rebase and restore the queue exactly as it was before it; the release it is on."""
    state = _load(queue_dir)
    if _git_rebase_in_progress(queue_dir):
        git(queue_dir, "rebase", "--abort")
    git(queue_dir, "checkout", "-q", "-f", "queue")
    git(queue_dir, "reset", "-q", "--hard", state.orig_head)
    git(queue_dir, "tag", "-f", "pristine", state.old_pristine)
    _state_path(queue_dir).unlink()
    return state.base


# --- internals ------------------------------------------------------------------
def _commit_tree(queue_dir: Path, files: Path, parent: str, release: str) -> str:
    # A commit of exactly the files under ``files``, built in a private index
    # so that the queue's work tree and index stay as they are.
    with tempfile.TemporaryDirectory(prefix="patchstack-index-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index"), "GIT_WORK_TREE": str(files)}
        git(queue_dir, "add", "-A", "--", ".", f":(exclude){PRISTINE_STAMP}", env=env)
        tree = git(queue_dir, "write-tree", env=env).strip()
    return git(
        queue_dir, "commit-tree", tree, "-p", parent, "-m", pristine_message(release)
    ).strip()


def _patch_name(state: _State, commit: str) -> str:
    return next((name for sha, name, _ in state.patches if sha == commit), commit[:12])


def _after_git(queue_dir: Path, state: _State, returncode: int, stderr: str) -> Outcome:
    if returncode == 0 and not _git_rebase_in_progress(queue_dir):
        return _finish(queue_dir, state)
    if not _git_rebase_in_progress(queue_dir):
        abort(queue_dir)
        raise RebaseError(
            f"git rebase failed without stopping at a conflict; the queue is restored:\n{stderr}"
        )
    stopped = git(queue_dir, "rev-parse", "REBASE_HEAD").strip()
    name = _patch_name(state, stopped)
    statuses = _statuses(queue_dir, state, stopped_at=name)
    return Outcome(
        state.base,
        state.onto,
        False,
        statuses,
        name,
        _conflict_report(queue_dir, stopped),
    )


def _statuses(
    queue_dir: Path, state: _State, stopped_at: str | None
) -> list[tuple[str, str]]:
    # Rebased patches keep their subjects; a patch the rebase went past whose
    # subject is not among the new commits was dropped because it became empty.
    done = {
        git(queue_dir, "log", "-1", "--format=%s", commit).strip()
        for commit in git(queue_dir, "rev-list", f"{state.new_pristine}..HEAD").split()
    }
    statuses = []
    reached_stop = False
    for _, name, subject in state.patches:
        if name == stopped_at:
            reached_stop = True
            statuses.append((name, "conflict"))
        elif reached_stop:
            statuses.append((name, "pending"))
        elif name in state.resolved:
            statuses.append((name, state.resolved[name]))
        elif subject in done:
            statuses.append((name, "clean"))
        else:
            statuses.append(
                (name, "dropped: empty after the rebase (upstream absorbed it)")
            )
    return statuses


def _finish(queue_dir: Path, state: _State) -> Outcome:
    git(queue_dir, "tag", "-f", "pristine", state.new_pristine)
    statuses = _statuses(queue_dir, state, stopped_at=None)
    _state_path(queue_dir).unlink()
    return Outcome(state.base, state.onto, True, statuses)


def _conflict_regions(path: Path) -> list[tuple[int, int, str]]:
    """``(first line, last line, text)`` of each conflict in a file (1-based, markers included)."""
    regions = []
    start = None
    lines = path.read_text(errors="replace").splitlines()
    for number, line in enumerate(lines, start=1):
        match = _MARKER.match(line)
        if not match:
            continue
        if match.group(1).startswith("<") and start is None:
            start = number
        elif match.group(1).startswith(">") and start is not None:
            regions.append((start, number, "\n".join(lines[start - 1 : number])))
            start = None
    return regions


def _distinctive(line: str) -> bool:
    return sum(character.isalnum() for character in line) >= 3


def _conflict_report(queue_dir: Path, stopped: str) -> list[FileReport]:
    # The patch's diffs; overlay modules that it adds are not merged with
    # anything upstream has.
    diff = git(
        queue_dir, "diff", *_DIFF_ARGS, "--diff-filter=M", f"{stopped}^", stopped
    )
    unmerged = set(git(queue_dir, "diff", "--name-only", "--diff-filter=U").split())
    reports = []
    for file_diff in unified_diff.parse(diff):
        path = queue_dir / file_diff.path
        if file_diff.path not in unmerged:
            reports.append(
                FileReport(
                    file_diff.path,
                    "merged",
                    [HunkReport(h.header, []) for h in file_diff.hunks],
                    [],
                )
            )
            continue
        if not path.is_file():
            reports.append(
                FileReport(
                    file_diff.path,
                    "deleted upstream",
                    [HunkReport(h.header, []) for h in file_diff.hunks],
                    [],
                )
            )
            continue
        regions = _conflict_regions(path)
        region_lines = [
            {line.strip() for line in text.splitlines()} for _, _, text in regions
        ]
        explained: set[int] = set()
        hunks = []
        for hunk in file_diff.hunks:
            # A hunk is in a conflict when most of its distinctive changed
            # lines are: lines like ")" occur everywhere, and a diff3 region
            # quotes the base text, which may share a line or two with a
            # hunk that merged elsewhere.
            changed = {
                line.strip() for line in hunk.removed + hunk.added if _distinctive(line)
            }
            hit = [
                index
                for index, lines in enumerate(region_lines)
                if changed and len(changed & lines) * 2 > len(changed)
            ]
            explained.update(hit)
            hunks.append(HunkReport(hunk.header, [regions[i][:2] for i in hit]))
        unmatched = [
            region[:2] for index, region in enumerate(regions) if index not in explained
        ]
        reports.append(FileReport(file_diff.path, "conflict", hunks, unmatched))
    return reports


def check_series_matches_queue(queue_dir: Path, patch_dir: Path) -> None:
    """Raise :class:`RebaseError` unless the queue holds exactly ``patches/`` on its base."""
    exported = [patch.render() for patch in export(queue_dir)[0]]
    if exported != [patch.render() for patch in series_mod.read_series(patch_dir)]:
        raise RebaseError(
            f"{queue_dir} holds commits that patches/ does not (or the reverse); export them "
            "(python scripts/patchstack.py export) or rebuild the queue (queue --force) first; "
            "nothing was changed"
        )
    if queue_base(queue_dir) != series_mod.read_base(patch_dir):
        raise RebaseError(
            f"{queue_dir} is on torch {queue_base(queue_dir)}, patches/series on "
            f"torch {series_mod.read_base(patch_dir)}; rebuild the queue (queue --force) first"
        )
