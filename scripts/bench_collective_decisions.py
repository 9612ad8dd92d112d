#!/usr/bin/env python3
"""Cost and speed of collective autotuning decisions: patched vs stock torch, side by side.

For each scenario the script launches the same worker on N local ranks (one
process each, rendezvous over env://; not torchrun, whose agent would stop
the healthy ranks as soon as one dies), once in this project's environment
(patched torch) and once in a stock torch environment of the stack's base
release (`patches/series`), and prints the
results side by side.  Every worker compiles a custom op whose
implementations contain an all_reduce, with one fault injected through an
implementation (the same way the tests inject them):

  happy      no fault: counts the synchronizing collectives the autotuner
             issues besides the candidates' own (and their time), per candidate
  exception  one implementation raises on the last rank at its first timed run
  stall      one implementation sleeps past the timeout once on the last rank
  straggler  the same, for 3 timeouts: the rank is alive and returns late
  dead       the last rank is SIGKILLed inside an implementation
  wedged     the last rank blocks inside an implementation for 4 timeouts in a
             C call that holds the GIL (no thread of it runs), then exits

and reports the time from the fault to every rank having decided (for a dead
or wedged peer: to every healthy rank having raised; for a straggler: from
its return), the winner and whether all ranks agree.  Stock torch (2.13.0
and 2.15.0 alike) cannot time anything on CPU (its collective benchmark
calls torch.cuda), which the table shows as it happens.

Usage:
  python scripts/bench_collective_decisions.py [--nproc 2] [--timeout 5]
      [--scenarios happy,exception,stall,straggler,dead,wedged] [--stock-python PATH]

Upstream's design (read from select_algorithm.py, 2.13.0 to 2.15.0) issues 3
synchronizing collectives per candidate (2 barriers and 1 all_reduce); on CPU
it never gets that far.

Without --stock-python, a stock environment is created once under
build/stock-venv-<release> from the official wheel the bootstrap uses.
"""

import argparse
import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ("happy", "exception", "stall", "straggler", "dead", "wedged")
NWARMUP, NRUNS = 3, 10


# --- worker (one process per rank) --------------------------------------------------
def worker(scenario: str, timeout: float, out_dir: Path) -> None:
    import torch
    import torch.distributed as dist
    import torch._inductor.config as inductor_config
    from torch._inductor.kernel.custom_op import (
        CustomOpConfig,
        register_custom_op_autotuning,
    )

    # A fresh cache directory: every run compiles and benchmarks (the ranks
    # may run stock torch, without the stack's test helpers).
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-decisions-")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    group_name = dist.group.WORLD.group_name
    funcol = torch.ops._c10d_functional
    patched = hasattr(inductor_config, "collective_benchmark_retries")
    ran: list[str] = []
    report: dict = {"rank": rank, "patched": patched, "torch": torch.__version__}

    class FirstAutotuneWarning(logging.Handler):
        # Stock torch logs why each collective choice failed; keep the first.
        def emit(self, record):
            if "autotune_warning" not in report and record.levelno >= logging.WARNING:
                cause = f": {record.exc_info[1]}" if record.exc_info else ""
                report["autotune_warning"] = (record.getMessage() + cause).splitlines()[
                    0
                ][:200]

    logging.getLogger("torch._inductor").addHandler(FirstAutotuneWarning())

    @torch.library.custom_op("bench_decisions::probe", mutates_args=())
    def probe(x: torch.Tensor, impl: str) -> torch.Tensor:
        ran.append(impl)
        if (
            scenario != "happy"
            and impl == "faulty"
            and rank == world - 1
            and ran.count(impl) == NWARMUP + 1
        ):
            report["fault_at"] = time.time()
            if scenario == "exception":
                raise RuntimeError("fault injected by the benchmark")
            if scenario == "stall":
                time.sleep(timeout + 1)
            if scenario == "straggler":
                time.sleep(3 * timeout)
                report["returned_at"] = time.time()
            if scenario in ("dead", "wedged"):
                Path(out_dir, "lost.json").write_text(
                    json.dumps({"fault_at": time.time()})
                )
            if scenario == "dead":
                os.kill(os.getpid(), signal.SIGKILL)
            if scenario == "wedged":
                ctypes.PyDLL(None).sleep(
                    int(4 * timeout)
                )  # libc sleep(), the GIL held throughout
                os._exit(0)
        time.sleep({"default": 0.008, "faulty": 0.0, "good": 0.003}[impl])
        return x.clone()

    @probe.register_fake
    def _(x, impl):
        return torch.empty_like(x)

    def all_reduce(x, impl):
        return funcol.wait_tensor(funcol.all_reduce(probe(x, impl), "sum", group_name))

    @torch.library.custom_op("bench_decisions::all_reduce", mutates_args=())
    def op(x: torch.Tensor) -> torch.Tensor:
        return all_reduce(x, "default")

    @op.register_fake
    def _(x):
        return torch.empty_like(x)

    def faulty(x):
        return all_reduce(x, "faulty")

    def good(x):
        return all_reduce(x, "good")

    register_custom_op_autotuning(
        op, configs=[CustomOpConfig(faulty), CustomOpConfig(good)]
    )

    # Count the synchronizing collectives issued outside the candidates: the
    # candidates' own collectives go through the _c10d_functional C++ ops and
    # are not seen here.
    sync_calls = {"count": 0, "seconds": 0.0}
    for method in ("allreduce", "allgather", "barrier", "broadcast"):
        original = getattr(dist.ProcessGroup, method)

        def counted(self, *args, _original=original, **kwargs):
            sync_calls["count"] += 1
            start = time.perf_counter()
            work = _original(self, *args, **kwargs)
            sync_calls["seconds"] += time.perf_counter() - start
            return work

        setattr(dist.ProcessGroup, method, counted)
    if patched:
        from torch._inductor.runtime.collective_benchmarking import control, session

        # Wall time of the protocol's sync steps (issue + wait), on this rank.

        for name in ("_exchange", "_commit"):
            original = getattr(session.SessionRun, name)

            def timed(self, *args, _original=original, **kwargs):
                start = time.perf_counter()
                try:
                    return _original(self, *args, **kwargs)
                finally:
                    report["sync_wall_s"] = (
                        report.get("sync_wall_s", 0.0) + time.perf_counter() - start
                    )

            setattr(session.SessionRun, name, timed)
        original_gather = control.ControlStore.gather

        def gather(self, tag, *args, **kwargs):
            result = original_gather(self, tag, *args, **kwargs)
            if tag.startswith("failure"):
                report.setdefault("agreed_at", time.time())
            return result

        control.ControlStore.gather = gather

    x = torch.ones(1 << 14)
    start = time.time()
    patches = dict(
        collective_benchmark_nruns=NRUNS,
        collective_benchmark_nwarmup=NWARMUP,
        collective_benchmark_timeout=timeout,
        fx_graph_cache=False,
        autotune_local_cache=False,
    )
    try:
        with inductor_config.patch(**patches):
            compiled = torch.compile(lambda x: op(x) + 1)
            dist.barrier()
            counted_before = sync_calls["count"]
            start = time.time()
            compiled(x)
            report["compile_s"] = time.time() - start
            report["sync_collectives"] = sync_calls["count"] - counted_before
            ran_while_compiling = list(ran)
            ran.clear()
            result = compiled(x)
        report["winner"] = ran[0] if ran else None
        report["result_ok"] = bool((result == world + 1).all())
        report["candidate_runs"] = {
            impl: ran_while_compiling.count(impl)
            for impl in ("default", "faulty", "good")
        }
    except Exception as error:  # a dead peer: the expected outcome on healthy ranks
        report["error_at"] = time.time()
        lines = str(error).strip().splitlines()
        report["error"] = next(
            (line for line in lines if "collective autotuning" in line), lines[-1]
        )[:300]
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(report))
    os._exit(0)  # a dead peer must not make the teardown wait


# --- driver ----------------------------------------------------------------------
def stock_python(explicit: str | None) -> str:
    if explicit:
        return explicit
    sys.path.insert(0, str(ROOT))
    from torch_patch_stack import pristine, series

    base = series.read_base(ROOT / "patches")
    venv = ROOT / "build" / f"stock-venv-{base}"
    python = venv / "bin" / "python"
    if not python.exists():
        print(
            f"creating a stock torch {base} environment in {venv} ...", file=sys.stderr
        )
        wheel = pristine.find_official_wheel(ROOT / "build", base)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", str(wheel), "numpy"], check=True
        )
    return str(python)


def run_scenario(python: str, scenario: str, nproc: int, timeout: float) -> list[dict]:
    # The ranks run this file too, possibly on a torch without the stack.
    from torch.testing._internal.distributed.collective_autotuning_jobs import rank_env

    with tempfile.TemporaryDirectory(prefix="bench-decisions-") as out_dir:
        command = [
            python,
            __file__,
            "--worker",
            scenario,
            "--timeout",
            str(timeout),
            "--out",
            out_dir,
        ]
        env = rank_env(nproc)
        ranks = [
            subprocess.Popen(
                command,
                env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for rank in range(nproc)
        ]
        for process in ranks:
            try:
                process.wait(timeout=600)
            except subprocess.TimeoutExpired:
                process.kill()
        reports = [
            json.loads(path.read_text())
            for path in sorted(Path(out_dir).glob("rank*.json"))
        ]
        lost = Path(out_dir, "lost.json")
        if lost.exists():
            for report in reports:
                report["fault_at"] = json.loads(lost.read_text())["fault_at"]
        return reports


def summarize(
    scenario: str, reports: list[dict], nproc: int, timeout: float
) -> dict[str, str]:
    if not reports:
        return {"outcome": "no rank reported"}
    winners = {report.get("winner") for report in reports}
    errors = [report["error"] for report in reports if "error" in report]
    row = {
        "ranks": f"{len(reports)}/{nproc}",
        "winner": ",".join(sorted(str(w) for w in winners))
        + (" (agreed)" if len(winners) == 1 else " (DISAGREE)"),
    }
    first = reports[0]
    if "candidate_runs" in first:
        runs = first["candidate_runs"]
        row["candidate runs (default/faulty/good)"] = (
            f"{runs['default']}/{runs['faulty']}/{runs['good']}"
        )
        row["result"] = (
            "correct" if all(r.get("result_ok") for r in reports) else "WRONG"
        )
    if scenario == "happy" and "sync_collectives" in first:
        # 3 candidates in every scenario (the default and two registered).
        row["sync collectives / candidate"] = f"{first['sync_collectives'] / 3:.2f}"
        if "sync_wall_s" in first:
            row["sync ms / candidate"] = (
                f"{1e3 * max(r['sync_wall_s'] for r in reports) / 3:.2f}"
            )
    fault_at = next((r["fault_at"] for r in reports if "fault_at" in r), None)
    returned_at = next((r["returned_at"] for r in reports if "returned_at" in r), None)
    if scenario in ("dead", "wedged") and errors:
        row["fault -> every healthy rank raised"] = (
            f"{max(r['error_at'] for r in reports) - fault_at:.2f} s"
        )
        row["error"] = errors[0]
    elif returned_at is not None and all("agreed_at" in r for r in reports):
        row["return -> every rank agreed"] = (
            f"{max(r['agreed_at'] for r in reports) - returned_at:.2f} s"
        )
    elif fault_at is not None and all("agreed_at" in r for r in reports):
        row["fault -> every rank agreed"] = (
            f"{max(r['agreed_at'] for r in reports) - fault_at:.2f} s"
        )
    elif errors:
        row["error"] = errors[0][-140:]
    if scenario != "happy" and fault_at is None and "candidate_runs" in first:
        row["note"] = "the fault never ran: no candidate was benchmarked"
    if not first.get("patched") and "autotune_warning" in first:
        row["why"] = first["autotune_warning"]
    if "compile_s" in first:
        row["compile s"] = f"{max(r.get('compile_s', 0) for r in reports):.1f}"
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        help="collective_benchmark_timeout, seconds",
    )
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument(
        "--stock-python",
        help="python of an environment with stock torch of the stack's base release",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.timeout, Path(args.out))
        return
    environments = {
        "patched": str(ROOT / ".venv" / "bin" / "python"),
        "stock": stock_python(args.stock_python),
    }
    print(f"# {args.nproc} gloo ranks, collective_benchmark_timeout={args.timeout:g}s, "
          f"{NWARMUP} warmup + {NRUNS} timed runs, 3 candidates (default, faulty, good)\n")  # fmt: skip
    for scenario in args.scenarios.split(","):
        print(f"## {scenario}")
        for label, python in environments.items():
            started = time.monotonic()
            row = summarize(
                scenario,
                run_scenario(python, scenario, args.nproc, args.timeout),
                args.nproc,
                args.timeout,
            )
            row["wall s"] = f"{time.monotonic() - started:.1f}"
            print(
                f"- {label}: "
                + "; ".join(f"{key}: {value}" for key, value in row.items())
            )
        print()


if __name__ == "__main__":
    main()
