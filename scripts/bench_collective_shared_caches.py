#!/usr/bin/env python3
"""Jobs on Inductor's remote caches (a real Redis server), as a new user runs them: a table of how each ended.

Each job is ``collective_autotuning_jobs.WORKER`` (an autotuned
all_reduce whose winner is ``rs_ag``, ``collective_benchmark_timeout`` 10 s)
launched as two torchrun "nodes" on loopback, each on a fresh local cache
directory (nothing shared between jobs but the server, as on new nodes:
every kernel is compiled again), against Debian's ``redis-server`` on a
loopback port.  A node "on" the server turns on both remote caches
(``TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE``, ``TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE``);
one "off" stands for a node without the variable, or whose lookup failed.
The jobs, in order: the first on an empty server; a second; the skew (node A
on, node B off) on an idle machine and beside ``--busy`` spinning processes,
``--repeats`` times each; then the same at the other world size.

Per row: non-zero exits, whether every rank ran the same implementation and
the result was exact, errors, and per rank where its program came from
(cached or compiled), ops it benchmarked and sessions it replayed, and the
longest wait at a join.  ``python scripts/bench_collective_shared_caches.py
--sizes 2,3 --repeats 3 --busy 4``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from torch.testing._internal.distributed.collective_autotuning_jobs import (
    busy_machine,
    Job,
    launch,
    WORKER,
)
from torch.testing._internal.distributed.redis_server import missing, RedisServer


def run_job(
    root: Path,
    server: RedisServer,
    world_size: int,
    remote: tuple[bool, bool],
    busy: int,
) -> Job:
    root.mkdir(parents=True)
    node_envs = [
        {
            "NODE_TAG": node,
            "TORCHINDUCTOR_CACHE_DIR": str(root / f"cache-{node}"),
            **server.env(remote=on),
        }
        for node, on in zip("AB", remote, strict=True)
    ]
    with busy_machine(busy):
        return launch(
            "torchrun_nodes", world_size, [*WORKER], root / "out", node_envs=node_envs,
            timeout=900,
        )  # fmt: skip


def describe(job: Job) -> dict[str, str]:
    reports = job.reports
    errors = [r["error"].strip().splitlines()[-1][:90] for r in reports if "error" in r]
    ran = {tuple(r["ran"]) for r in reports if "ran" in r}
    agreed = len(reports) == job.world_size and len(ran) == 1 and not errors
    exact = agreed and all(r["exact"] for r in reports)

    def rank(r: dict) -> str:
        if "error" in r:
            return f"r{r['rank']}@{r['node']}: error"
        counted = r["counters"]
        source = (
            "cached" if r["aotautograd"]["hit"] or r["fxgraph"]["hit"] else "compiled"
        )
        return (
            f"r{r['rank']}@{r['node']}: {source}, {counted.get('ops', 0)} benchmarked, "
            f"{counted.get('replayed_sessions', 0)} replayed"
        )

    return {
        "non-zero exits": str(sum(1 for code in job.exits if code)),
        "one winner, exact": (f"yes ({'+'.join(next(iter(ran)))})" if exact else "no"),
        "errors": "; ".join(errors) or "-",
        "ranks": "; ".join(rank(r) for r in reports),
        "longest join wait (s)": f"{max((r.get('counters') or {}).get('presync_s', 0.0) for r in reports):.1f}"
        if reports
        else "-",
        "seconds": f"{job.seconds:.0f}",
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="2,3", help="world sizes, in order")
    parser.add_argument(
        "--repeats", type=int, default=3, help="skewed jobs per size and load"
    )
    parser.add_argument(
        "--busy", type=int, default=4, help="spinning processes beside a busy job"
    )
    args = parser.parse_args()
    if missing():
        print(f"needs {missing()}", file=sys.stderr)
        return 1
    sizes = [int(size) for size in args.sizes.split(",")]
    jobs: list[tuple[str, int, str, tuple[bool, bool], int]] = []
    for size in sizes:
        jobs.append(
            (
                "first" if size == sizes[0] else "other size",
                size,
                "on, on",
                (True, True),
                0,
            )
        )
        jobs.append(("second", size, "on, on", (True, True), 0))
        for load, busy in (("idle", 0), ("busy", args.busy)):
            for _ in range(args.repeats):
                jobs.append(
                    (f"skewed, {load}", size, "A on, B off", (True, False), busy)
                )
    columns = ["job", "ranks", "remote cache", "non-zero exits", "one winner, exact",
               "errors", "longest join wait (s)", "seconds", "ranks"]  # fmt: skip
    print("| " + " | ".join(columns[:-1]) + " | what each rank did |")
    print("|" + " --- |" * len(columns))
    with tempfile.TemporaryDirectory(prefix="bench-shared-caches-") as tmp:
        server = RedisServer().start()
        try:
            for index, (name, size, state, remote, busy) in enumerate(jobs):
                job = run_job(Path(tmp, str(index)), server, size, remote, busy)
                row = describe(job)
                cells = [name, str(size), state] + [row[c] for c in columns[3:-1]]
                print("| " + " | ".join(cells) + f" | {row['ranks']} |", flush=True)
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
