"""A store that counts every request reaching the job's store, whoever makes it.

Wraps the job's store (a ``TCPStore``) for ``init_process_group(store=...)``:
c10d's own requests (building a group) count as the protocol's do.  Used by
``test_collective_control.py`` and ``scripts/bench_collective_requests.py``.
"""

from __future__ import annotations

import collections

import torch.distributed as dist


class CountingStore(dist.Store):
    """The job's store, counting every request that reaches it, by kind."""

    def __init__(self, inner: dist.Store) -> None:
        super().__init__()
        self.inner = inner
        self.requests: collections.Counter[str] = collections.Counter()

    def set(self, key, value):
        self.requests["set"] += 1
        return self.inner.set(key, value)

    def get(self, key):
        self.requests["get"] += 1
        return self.inner.get(key)

    def add(self, key, amount):
        self.requests["add"] += 1
        return self.inner.add(key, amount)

    def compare_set(self, key, expected, desired):
        self.requests["compare_set"] += 1
        return self.inner.compare_set(key, expected, desired)

    def check(self, keys):
        self.requests["check"] += 1
        return self.inner.check(keys)

    def delete_key(self, key):
        self.requests["delete_key"] += 1
        return self.inner.delete_key(key)

    def num_keys(self):
        self.requests["num_keys"] += 1
        return self.inner.num_keys()

    def wait(self, keys, timeout=None):
        self.requests["wait"] += 1
        if timeout is None:
            return self.inner.wait(keys)
        return self.inner.wait(keys, timeout)

    def append(self, key, value):
        self.requests["append"] += 1
        return self.inner.append(key, value)

    def multi_get(self, keys):
        self.requests["multi_get"] += 1
        return self.inner.multi_get(keys)

    def multi_set(self, keys, values):
        self.requests["multi_set"] += 1
        return self.inner.multi_set(keys, values)

    def has_extended_api(self):
        return True
