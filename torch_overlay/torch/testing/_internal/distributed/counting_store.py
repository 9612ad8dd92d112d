"""A store that counts every request reaching a job's store, whoever makes it.

Wraps the job's store (a ``TCPStore``) for ``init_process_group(store=...)``:
c10d's own requests (building a group) count as collective autotuning's do,
so that a test can bound the requests a compile makes.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING

import torch.distributed as dist


if TYPE_CHECKING:
    from datetime import timedelta


__all__ = ["CountingStore"]


class CountingStore(dist.Store):
    """The job's store, counting every request that reaches it, by kind."""

    def __init__(self, inner: dist.Store) -> None:
        super().__init__()
        self.inner = inner
        self.requests: collections.Counter[str] = collections.Counter()

    def set(self, key: str, value: str) -> None:
        self.requests["set"] += 1
        return self.inner.set(key, value)

    def get(self, key: str) -> bytes:
        self.requests["get"] += 1
        return self.inner.get(key)

    def add(self, key: str, amount: int) -> int:
        self.requests["add"] += 1
        return self.inner.add(key, amount)

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        self.requests["compare_set"] += 1
        return self.inner.compare_set(key, expected, desired)

    def check(self, keys: list[str]) -> bool:
        self.requests["check"] += 1
        return self.inner.check(keys)

    def delete_key(self, key: str) -> bool:
        self.requests["delete_key"] += 1
        return self.inner.delete_key(key)

    def num_keys(self) -> int:
        self.requests["num_keys"] += 1
        return self.inner.num_keys()

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self.requests["wait"] += 1
        if timeout is None:
            return self.inner.wait(keys)
        return self.inner.wait(keys, timeout)

    def append(self, key: str, value: str | bytes) -> None:
        self.requests["append"] += 1
        # Not in torch's stubs of Store; every store has it.
        return self.inner.append(key, value)  # type: ignore[attr-defined]

    def multi_get(self, keys: list[str]) -> list[bytes]:
        self.requests["multi_get"] += 1
        return self.inner.multi_get(keys)

    def multi_set(self, keys: list[str], values: list[str | bytes]) -> None:
        self.requests["multi_set"] += 1
        return self.inner.multi_set(keys, values)  # type: ignore[attr-defined]

    def has_extended_api(self) -> bool:
        return True
