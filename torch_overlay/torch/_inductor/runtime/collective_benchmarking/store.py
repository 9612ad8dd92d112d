"""The job's store as the control plane of collective benchmarking sees it.

Liveness (``liveness.py``) and agreement (``control.py``)
both talk to the one ``TCPStore`` that serves every rank of a torchrun job,
so what they ask of it is kept near zero and counted in one place
(:data:`store_requests`), and blocking waits happen on connections of their
own, never on the one that process groups use.  This module holds that
connection (:class:`StoreClient`) and the layout of the keys that both sides
read and write, and the errors that both sides raise; it depends on neither
side, so that they can depend on it.
"""

from __future__ import annotations

import collections
import json
import time
import weakref
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch.distributed as dist


if TYPE_CHECKING:
    from collections.abc import Iterator
    from datetime import timedelta


__all__ = [
    "CollectiveBenchmarkError",
    "CollectiveBenchmarkTimeout",
    "StoreClient",
    "main_store_client",
    "store_requests",
]


class CollectiveBenchmarkError(RuntimeError):
    """Benchmarking cannot reach a decision every rank shares.

    Raised on every healthy rank of the group, at the same protocol step, when
    a member is lost (dead, wedged, stuck, or late past the cap) or when the
    members are not tuning the same op; and on a rank whose connection to the
    job's store fails during a session (the store's host went away).
    """


class CollectiveBenchmarkTimeout(CollectiveBenchmarkError, TimeoutError):
    """A collective step did not complete within the timeout."""


# Every key the control plane writes lives under this prefix of the default store.
STORE_PREFIX = "collective_benchmarking"


def status_key(global_rank: int) -> str:
    return f"{STORE_PREFIX}/status/{global_rank}"


def wake_key(global_rank: int) -> str:
    """The key a process's listener blocks on: set to wake it (see ``Liveness``)."""
    return f"{STORE_PREFIX}/wake/{global_rank}"


def wake_value(verdict: str = "") -> str:
    """What a waker sets on a wake key: a JSON object with the verdict on the
    job it gives every member ("" when it only wakes the process)."""
    return json.dumps({"verdict": verdict})


def wake_verdict(value: str) -> str | None:
    """The verdict carried by a wake key's value (see :func:`wake_value`).

    ``None`` for a value that no waker writes.
    """
    try:
        verdict = json.loads(value)["verdict"]
    except (ValueError, TypeError, KeyError):
        return None
    return verdict if isinstance(verdict, str) else None


# Every request the control plane made to the store, by kind.
store_requests: collections.Counter[str] = collections.Counter()

# A value that no writer uses (see read_if_set).
_UNSET = "\x00unset"


def describe_store(store: dist.Store) -> str:
    """``store`` in an error message: its server's address when it has one."""
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    if isinstance(store, dist.TCPStore):
        return f"the job's store at {store.host}:{store.port}"
    return f"the job's store ({type(store).__name__})"


class StoreClient:
    """A connection of the control plane's own to the job's store, counting its requests.

    Blocking waits happen on connections of the control plane's own (``clone``), so
    that they never hold up the connection that process groups use.  Every
    request is counted in :data:`store_requests` and in ``requests``; when
    ``times`` is a list, each request's ``time.monotonic()`` is appended to it.
    A request whose connection fails (the store's host exited or crashed)
    raises :class:`CollectiveBenchmarkError` naming the store.
    """

    def __init__(self, store: dist.Store) -> None:
        self._store = store
        self.requests: collections.Counter[str] = collections.Counter()
        self.times: list[float] | None = None

    @contextmanager
    def _request(self, kind: str) -> Iterator[None]:
        store_requests[kind] += 1
        self.requests[kind] += 1
        if self.times is not None:
            self.times.append(time.monotonic())
        try:
            yield
        except dist.DistNetworkError as error:
            raise CollectiveBenchmarkError(
                f"collective autotuning: lost the connection to "
                f"{describe_store(self._store)} ({kind}): its host exited or "
                f"crashed. {str(error).splitlines()[0]}"
            ) from error

    def set(self, key: str, value: str) -> None:
        with self._request("set"):
            self._store.set(key, value)

    def get(self, key: str) -> str:
        with self._request("get"):
            return self._store.get(key).decode()

    def add(self, key: str, amount: int) -> int:
        with self._request("add"):
            return self._store.add(key, amount)

    def append(self, key: str, value: str) -> None:
        with self._request("append"):
            # Missing from Store's stubs; every c10d store implements it.
            self._store.append(key, value)  # type: ignore[attr-defined]

    def compare_set(self, key: str, expected: str, desired: str) -> str:
        """Set ``key`` to ``desired`` if it holds ``expected`` ("" for unset); its value."""
        with self._request("compare_set"):
            return self._store.compare_set(key, expected, desired).decode()

    def wait(self, key: str, timeout: timedelta) -> None:
        with self._request("wait"):
            self._store.wait([key], timeout)

    def delete(self, key: str) -> None:
        with self._request("delete_key"):
            self._store.delete_key(key)

    def multi_set(self, keys: list[str], values: list[str]) -> None:
        with self._request("multi_set"):
            # Missing from Store's stubs; every c10d store implements it.
            self._store.multi_set(keys, values)  # type: ignore[attr-defined]

    def read_if_set(self, key: str) -> str | None:
        """The value of ``key``, or None when it is not set; one request, never blocks."""
        # A compare-and-set whose expected value no writer uses never sets,
        # and answers the value, or the expected one when the key is unset.
        value = self.compare_set(key, _UNSET, _UNSET)
        return None if value == _UNSET else value


def _default_store() -> dist.Store:
    return dist.distributed_c10d._get_default_store()


# The store the connection was made to is held weakly: destroy_process_group()
# releases the default store, and with it the connection.
_main_clients: dict[int, tuple[weakref.ref[dist.Store], StoreClient]] = {}


def main_store_client() -> StoreClient:
    """The calling process's connection for the control plane's requests, made once per store."""
    store = _default_store()
    known = _main_clients.get(id(store))
    if known is None or known[0]() is not store:
        _main_clients.clear()
        key = id(store)
        released = weakref.ref(store, lambda _: _main_clients.pop(key, None))
        known = _main_clients[key] = (released, StoreClient(store.clone()))
    return known[1]
