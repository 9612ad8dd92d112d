"""A quiet machine for the tests that time real work, while CI runs two streams.

``.ci/run`` runs the test suite beside lint and every prefix's tests.  Both
streams mostly wait (spawned ranks importing torch, the store, timeouts), but
a test whose expected winner rests on a measured margin of real work (marked
``quiet_machine``) must not share CI's two cores with the other stream.

When ``COLLECTIVE_TESTS_LOCK_DIR`` names a directory, every test holds a
shared lock on a file there from its setup (spawning a class's ranks
included) to its teardown, and a ``quiet_machine`` test an exclusive one.  A
turnstile, taken before either, keeps the other stream from starting a test
while a quiet one waits for the test already running there to end.  Without
the variable nothing is locked.
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager, ExitStack
from typing import TYPE_CHECKING

import pytest


if TYPE_CHECKING:
    from collections.abc import Iterator


LOCK_DIR_ENV = "COLLECTIVE_TESTS_LOCK_DIR"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "quiet_machine: the test times real work; under CI's two streams it runs alone",
    )


@contextmanager
def _locked(path: str, operation: int) -> Iterator[None]:
    with open(path, "a") as file:
        fcntl.flock(file, operation)
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    lock_dir = os.environ.get(LOCK_DIR_ENV)
    if not lock_dir:
        yield
        return
    quiet = item.get_closest_marker("quiet_machine") is not None
    with ExitStack() as held:
        with _locked(os.path.join(lock_dir, "turnstile"), fcntl.LOCK_EX):
            machine = os.path.join(lock_dir, "machine")
            held.enter_context(
                _locked(machine, fcntl.LOCK_EX if quiet else fcntl.LOCK_SH)
            )
        yield
