"""``patchstack sizes``: each patch's changed lines, and the limit of 800.

On the small synthetic series of ``test_patchstack.py`` (the ``stack``
fixture) plus a second patch that changes the first one's overlay module and
removes an upstream line, and adds a test file: a patch counts its
introduced modules as of that patch, not as ``torch_overlay/`` has them
after the last one, plus its diff's added and removed lines, and its tests
apart, which together is what ``git`` counts in the queue's commit of the
patch.  Then the limit: a patch over it fails, with no
exemptions.  The last test runs ``sizes`` on this repository, as ``.ci/run``
does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from torch_patch_stack import cli, queue

REPO = Path(__file__).resolve().parents[2]
LATER_HEADER = """[inductor] Extend the new module, drop line 30

Description: Add a second value and remove a line upstream
Overlay: test/inductor/test_new_module.py
Forwarded: no
Last-Update: 2026-11-25
"""
HEAD = (
    "patch  subject                                               modules      +"
    "      -   total   tests"
)


@pytest.fixture
def two_patches(stack, tmp_path):
    """The ``stack`` fixture plus a second patch; its queue directory."""
    repo, wheel, run = stack
    queue_dir = tmp_path / "queue"
    (queue_dir / "torch" / "_new_module.py").write_text("VALUE = 1\nOTHER = 2\n")
    foo = queue_dir / "torch" / "foo.py"
    foo.write_text(foo.read_text().replace("line 30\n", ""))
    test = queue_dir / "test" / "inductor" / "test_new_module.py"
    test.parent.mkdir(parents=True)
    test.write_text("def test_value():\n    assert True\n")
    queue.git(queue_dir, "add", "test")
    queue.git(queue_dir, "commit", "-qam", LATER_HEADER)
    assert run("export", "--dir", str(queue_dir)) == 0
    return repo, run, queue_dir


def test_sizes_count_what_the_queue_commits(two_patches, capsys):
    repo, run, queue_dir = two_patches
    assert run("sizes") == 0
    assert capsys.readouterr().out.splitlines() == [
        HEAD,
        "0001   [inductor] Change line twenty                               1      1      1       3       0",
        "0002   [inductor] Extend the new module, drop line 30              0      1      1       2       2",
        "all                                                                1      2      2       5       2",
        "patchstack sizes: 2 patches, 0 over 800 lines",
    ]
    # The test file is the repository's own, where tests live.
    assert (repo / "test" / "inductor" / "test_new_module.py").is_file()
    # The same count as git's, commit by commit, in the queue.
    commits = queue.git(queue_dir, "rev-list", "--reverse", "pristine..HEAD").split()
    changed = [
        sum(
            int(added) + int(removed)
            for added, removed, _ in (
                line.split("\t")
                for line in queue.git(
                    queue_dir, "diff", "--numstat", f"{commit}~1", commit
                ).splitlines()
            )
        )
        for commit in commits
    ]
    assert changed == [3, 4]


def test_a_patch_over_the_limit_fails(two_patches, capsys):
    _, run, _ = two_patches
    assert run("sizes", "--limit", "2") == 1
    out, err = capsys.readouterr()
    assert out.splitlines()[1:] == [
        "0001   [inductor] Change line twenty                               1      1      1       3       0  > 2 FAILED",
        "0002   [inductor] Extend the new module, drop line 30              0      1      1       2       2",
        "all                                                                1      2      2       5       2",
        "patchstack sizes: 2 patches, 1 over 2 lines",
    ]
    assert err.splitlines() == [
        "patchstack sizes: FAILED",
        "0001-change-line-twenty.patch changes 3 lines, over the limit of 2: "
        "cut it into patches of at most that",
    ]


def test_real_series_sizes_pass(capsys):
    assert cli.main(["--repo", str(REPO), "sizes"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == HEAD
