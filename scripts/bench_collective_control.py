#!/usr/bin/env python3
"""What collective autotuning asks of a job's TCPStore, at 8 to 4,096 ranks.

One TCPStore server (as torchrun starts for a job) and N simulated ranks:
lightweight clients, threads spread over a few processes, each running the
real control-plane code of a session with store connections of its own:
its ``Liveness`` (heartbeat, watch, and the idle thread's blocked wait),
a ``ControlStore`` session, and the real join (``join.join``)
(digest count, rendezvous, claims).
No process group is built: what a session does between its join and its end
(the candidates' runs, the exchange and the commit) is collectives, which
this replaces by a short sleep.  Ranks arrive at each session with a random
skew (``--skew-ms``), and one rank arrives ``--late-s`` seconds late in the
last session, so that waiters watch it while it is alive.

Printed per size:

* requests per rank per session: every store request of a rank's session
  (its main connection and its liveness thread's), divided by sessions;
* peak requests/s at the server: all ranks' requests, in 100 ms bins;
* agreement latency: from the last member's arrival at the join to each
  member leaving it, p50 and p99 over members and sessions;
* keys left: keys under the control plane's prefix after the sessions,
  besides the one status key per rank;
* idle requests/s: every request made in the ``--idle-s`` seconds that
  follow the last session's tail (four beat intervals, in which the liveness
  thread writes "idle" once and starts its wait in the store), every
  liveness thread still running (target 0).

Above ``--listen-max`` ranks the simulated ranks' idle threads probe
locally instead of waiting in the store for a wake (one connection and one
blocked wait each, no request rate), to
keep the client processes' connections and threads within this machine.

The figures of time (latency, peak rate) are those of thousands of Python
threads sharing the machine's cores: an upper bound on what real ranks, each
with a process of its own, would see.

Usage:
  python scripts/bench_collective_control.py [--ranks 8,64,512,1024,4096]
      [--sessions 3] [--processes 4] [--timeout 30] [--idle-s 5]
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import statistics
import threading
import time
from datetime import timedelta


def _simulated_ranks(
    port: int,
    size: int,
    ranks: list[int],
    sessions: int,
    timeout_s: float,
    skew_ms: float,
    late_s: float,
    idle_s: float,
    listen: bool,
    results: multiprocessing.Queue,
) -> None:
    import torch.distributed as dist
    from torch._inductor.runtime.collective_benchmarking.benchmarker import (
        CollectiveBenchmarker,
    )
    from torch._inductor.runtime.collective_benchmarking.control import ControlStore
    from torch._inductor.runtime.collective_benchmarking.beats import beat_interval
    from torch._inductor.runtime.collective_benchmarking.liveness import Liveness
    from torch._inductor.runtime.collective_benchmarking.store import (
        STORE_PREFIX,
        StoreClient,
    )
    from torch._inductor.runtime.collective_benchmarking.types import (
        Candidate,
        CollectiveBenchmarkConfig,
        OpToTune,
    )
    from torch._inductor.runtime.collective_benchmarking.join import join

    threading.stack_size(512 * 1024)
    config = CollectiveBenchmarkConfig(
        timeout=timedelta(seconds=timeout_s), nwarmup=1, nruns=1
    )

    class SimulatedBenchmarker(CollectiveBenchmarker):
        # The real join, without a process group behind it.
        def __init__(self, rank: int) -> None:
            self.group_name, self.config, self.rank, self.size = (
                "sim",
                config,
                rank,
                size,
            )

        def decision_context(self) -> tuple[str, str]:
            return repr(("sim", size, "gloo", "cpu")), repr(config)

    op = OpToTune(
        "sim_op [((1024,), torch.float32)]",
        [Candidate("default", lambda: None, True), Candidate("other", lambda: None)],
    )
    outcome: dict[int, dict] = {}

    def run_rank(rank: int) -> None:
        store = dist.TCPStore(
            "127.0.0.1", port, size, False, timeout=timedelta(seconds=3600)
        )
        liveness = Liveness(
            store=lambda: store,
            global_rank=lambda: rank,
            main_thread=threading.current_thread(),
            compiling=lambda: False,
            listen=listen,
        )
        # The rank's own connection serves its protocol requests, as the
        # main thread's clone does in a real process.
        client = StoreClient(store)
        client.times = []
        liveness.ensure_running(config.timeout)
        beats = liveness.client
        if beats is None:
            raise RuntimeError("the liveness thread did not start")
        beats.times = []
        benchmarker = SimulatedBenchmarker(rank)
        arrivals, returns = [], []
        store.add("bench/ready", 1)
        for session in range(sessions):
            store.wait([f"bench/start{session}"])
            delay = random.uniform(0, skew_ms / 1e3)
            if rank == size - 1 and session == sessions - 1:
                delay += late_s
            time.sleep(delay)
            control = ControlStore(
                f"{STORE_PREFIX}/sim/session{session}/",
                rank,
                range(size),
                "sim",
                config.timeout,
                config.max_wait,
                client=client,
                liveness=liveness,
            )
            with control.session():
                arrivals.append(time.monotonic())
                join(benchmarker, control, [op], [list(op.candidates)], [None])
                returns.append(time.monotonic())
                time.sleep(0.05)  # the candidates' runs, exchange and commit
                control.count("committed")
            store.add(f"bench/done{session}", 1)
        # The liveness thread writes "idle" once when the session ends, and
        # after two idle beats waits in the store (one request); a watcher
        # may read a status one beat late: the session's tail (four beats: a
        # thousand simulated ranks share two cores).
        time.sleep(4 * beat_interval(config.timeout))
        in_sessions = client.requests.total() + beats.requests.total()
        idle_from = time.monotonic()
        time.sleep(idle_s)
        idle = [t for t in client.times + beats.times if t >= idle_from]
        outcome[rank] = {
            "requests": in_sessions,
            "times": [t for t in client.times + beats.times if t < idle_from],
            "arrivals": arrivals,
            "returns": returns,
            "idle_requests": len(idle),
        }
        liveness.shutdown()

    threads = [threading.Thread(target=run_rank, args=(rank,)) for rank in ranks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results.put(outcome)


def measure(size: int, args: argparse.Namespace) -> dict:
    import torch.distributed as dist
    from torch._inductor.runtime.collective_benchmarking.store import STORE_PREFIX

    server = dist.TCPStore(
        "127.0.0.1",
        0,
        size,
        True,
        timeout=timedelta(seconds=600),
        wait_for_workers=False,
    )
    processes = min(args.processes, size)
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue = context.Queue()
    workers = [
        context.Process(
            target=_simulated_ranks,
            args=(
                server.port,
                size,
                list(range(p, size, processes)),
                args.sessions,
                args.timeout,
                args.skew_ms,
                args.late_s,
                args.idle_s,
                size <= args.listen_max,
                results,
            ),
        )
        for p in range(processes)
    ]
    for worker in workers:
        worker.start()
    while server.add("bench/ready", 0) < size:  # every rank connected
        time.sleep(0.05)
    for session in range(args.sessions):
        server.set(f"bench/start{session}", "")
        while server.add(f"bench/done{session}", 0) < size:
            time.sleep(0.05)
    outcome: dict[int, dict] = {}
    for _ in workers:
        outcome.update(results.get())
    for worker in workers:
        worker.join()
    keys = [key for key in server.list_keys() if key.startswith(STORE_PREFIX)]
    left = [key for key in keys if "/status/" not in key]
    if left and args.verbose:
        print("keys left:", sorted(left)[:20])
    times = sorted(t for rank in outcome.values() for t in rank["times"])
    bins: dict[int, int] = {}
    for t in times:
        bins[int(t * 10)] = bins.get(int(t * 10), 0) + 1
    latencies = []
    for session in range(args.sessions):
        last = max(rank["arrivals"][session] for rank in outcome.values())
        latencies += [rank["returns"][session] - last for rank in outcome.values()]
    latencies.sort()
    return {
        "ranks": size,
        "per_rank_session": sum(r["requests"] for r in outcome.values())
        / size
        / args.sessions,
        "peak_rps": max(bins.values()) * 10 if bins else 0,
        "p50_ms": 1e3 * statistics.median(latencies),
        "p99_ms": 1e3 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "keys_left": len(left),
        "status_keys": len(keys) - len(left),
        "idle_rps": sum(r["idle_requests"] for r in outcome.values()) / args.idle_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="8,64,512,1024,4096")
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--skew-ms", type=float, default=20.0)
    parser.add_argument("--late-s", type=float, default=2.0)
    parser.add_argument("--idle-s", type=float, default=5.0)
    parser.add_argument("--verbose", action="store_true", help="name the keys left")
    parser.add_argument(
        "--listen-max",
        type=int,
        default=1024,
        help="let each simulated rank's idle thread wait in the store for a wake "
        "(one blocked wait, on a connection of its own) up to this many ranks",
    )
    args = parser.parse_args()
    print(
        f"{args.sessions} sessions per size, arrival skew up to {args.skew_ms:g} ms, "
        f"the last rank {args.late_s:g} s late in the last session, timeout "
        f"{args.timeout:g} s, {args.processes} client processes\n"
    )
    print(
        "| ranks | requests / rank / session | peak requests/s at the server "
        "| agreement latency p50 / p99 (ms) | keys left (besides status keys) "
        "| status keys | idle requests/s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for size in [int(n) for n in args.ranks.split(",")]:
        row = measure(size, args)
        print(
            f"| {row['ranks']} | {row['per_rank_session']:.1f} | {row['peak_rps']:,} "
            f"| {row['p50_ms']:.1f} / {row['p99_ms']:.1f} | {row['keys_left']} "
            f"| {row['status_keys']} | {row['idle_rps']:g} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
