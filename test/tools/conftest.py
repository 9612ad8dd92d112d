"""Fixtures shared by the patch tooling tests (``stack``: one patch, exported)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from torch_patch_stack import cli, queue

from test_patchstack import HEADER, make_wheel

if TYPE_CHECKING:
    from pathlib import Path


@pytest.fixture
def stack(tmp_path: Path):
    """A repo layout with one patch made through the queue workflow."""
    repo = tmp_path / "repo"
    (repo / "patches").mkdir(parents=True)
    (repo / "patches" / "series").write_text("# base: torch==2.13.0\n")
    (repo / "torch_overlay").mkdir()
    wheel = make_wheel(tmp_path / "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl")

    def run(*args):
        return cli.main(["--repo", str(repo), *args])

    queue_dir = tmp_path / "queue"
    assert run("queue", "--dir", str(queue_dir), "--wheel", str(wheel)) == 0
    foo = queue_dir / "torch" / "foo.py"
    foo.write_text(foo.read_text().replace("line 20\n", "line twenty\n"))
    # A new module is added in the queue, by the commit whose Overlay: names it.
    (queue_dir / "torch" / "_new_module.py").write_text("VALUE = 1\n")
    queue.git(queue_dir, "add", "torch/_new_module.py")
    queue.git(queue_dir, "commit", "-qam", HEADER)
    assert run("export", "--dir", str(queue_dir)) == 0
    return repo, wheel, run
