"""Collectives known to crash their process on some backend and device.

A candidate that raises is disqualified like any other failure; one that
crashes its process (a segfault in a backend's worker thread) ends the job,
and no rule can disqualify it afterwards.  So a candidate whose graph holds a
collective listed here for the backend that serves the tensors' device is
disqualified before it runs, on every rank alike (``session.py``).

An entry stays while the crash is in the base release the series applies
to; the rebase onto a release with the upstream fix removes it, with its
test.  See docs/design.md, "Collectives known to crash".
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING


if TYPE_CHECKING:
    from collections.abc import Iterable


__all__ = ["KNOWN_CRASHES", "KnownCrash", "known_crash"]


@dataclasses.dataclass(frozen=True)
class KnownCrash:
    """Collectives (``namespace::name``) that crash ``backend`` with tensors on ``device_type``."""

    backend: str
    device_type: str
    ops: frozenset[str]
    issue: str  # the upstream issue that tracks the crash
    cause: str

    def reason(self, op: str) -> str:
        """Why a candidate calling ``op`` does not run, in the words of reports."""
        return (
            f"{op} crashes {self.backend} with {self.device_type} tensors "
            f"({self.cause}; {self.issue})"
        )


KNOWN_CRASHES: tuple[KnownCrash, ...] = (
    # Every functional all_gather reaches allgather_into_tensor_coalesced;
    # eager dist.all_gather_into_tensor (_allgather_base) does not, and works.
    KnownCrash(
        backend="gloo",
        device_type="cuda",
        ops=frozenset(
            {
                "_c10d_functional::all_gather_into_tensor",
                "_c10d_functional::all_gather_into_tensor_out",
                "_c10d_functional::all_gather_into_tensor_coalesced",
                "c10d::allgather_into_tensor_coalesced_",
            }
        ),
        issue="pytorch/pytorch#152645",
        cause="ProcessGroupGloo::allgather_into_tensor_coalesced copies device "
        "memory with a host memmove",
    ),
)


def known_crash(
    backend: str | None, device_type: str, ops: Iterable[str]
) -> tuple[str, KnownCrash] | None:
    """The first of ``ops`` known to crash ``backend`` on ``device_type``, and its entry.

    ``None`` when none is, or when no backend serves the device.  A pure
    function of its arguments: every rank that passes the same ones gets
    the same answer.
    """
    for entry in KNOWN_CRASHES:
        if entry.backend != backend or entry.device_type != device_type:
            continue
        for op in sorted(ops):
            if op in entry.ops:
                return op, entry
    return None
