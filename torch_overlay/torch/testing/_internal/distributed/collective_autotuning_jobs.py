"""Launch a rank program as users launch jobs, and see how every process ended.

Launchers (``LAUNCHERS``), each on this machine, gloo:

  torchrun        ``torchrun --standalone``: its agent hosts the job's store
  torchrun_nodes  two torchrun "nodes" on loopback (``--nnodes 2 --node-rank``),
                  static rendezvous through ``--master-addr/--master-port``
                  (``rendezvous="c10d"``: through ``--rdzv-endpoint``); an agent
                  hosts the store; node 0 takes the odd rank
  mp_spawn        ``python PROGRAM ... --spawn N``: the program calls
                  ``torch.multiprocessing.spawn`` and its ranks join through
                  ``env://``; rank 0 hosts the store
  srun            one process per rank, started directly with ``RANK``,
                  ``WORLD_SIZE``, ``LOCAL_RANK`` and ``MASTER_ADDR/PORT`` set (what
                  ``srun`` gives a job), no agent; rank 0 hosts the store

A program is what follows ``python`` (a script and its arguments, or ``-m``
and a module, as :data:`WORKER`); it takes ``--out DIR``, where each rank
writes ``rank<r>.json``, and, for ``mp_spawn``, ``--spawn N``.
:data:`WORKER` is a job with an autotuned collective op
(``collective_autotuning_job_worker``).  ``launch_ranks`` runs a script's
ranks ``srun`` style; ``busy_machine`` runs a job beside processes that spin
on the CPUs.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TYPE_CHECKING


if TYPE_CHECKING:
    from collections.abc import Iterator


__all__ = [
    "Job",
    "LAUNCHERS",
    "WORKER",
    "WORKER_TIMEOUT_S",
    "busy_machine",
    "free_port",
    "launch",
    "launch_ranks",
    "private_cache_dir",
    "rank_env",
]


LAUNCHERS = ("torchrun", "torchrun_nodes", "mp_spawn", "srun")
# The program of a job whose ranks autotune a collective op (the arguments
# it takes: collective_autotuning_job_worker's docstring).
WORKER = ("-m", "torch.testing._internal.distributed.collective_autotuning_job_worker")
# collective_benchmark_timeout in WORKER's ranks.
WORKER_TIMEOUT_S = 10.0

# How a launcher reports a rank that failed: torchrun's summary ("exitcode :
# -6"), mp.spawn's exception ("terminated with signal SIGABRT").
_TORCHRUN_RANK = re.compile(r"exitcode\s*:\s*(-?\d+)")
_SPAWN_RANK = re.compile(r"terminated with (?:signal (SIG\w+)|exit code (\d+))")


def free_port() -> int:
    """A TCP port of the loopback interface that is free now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def private_cache_dir(prefix: str) -> str:
    """A fresh Inductor cache directory for this process, removed when it exits.

    Sets ``TORCHINDUCTOR_CACHE_DIR``; a rank that must compile and benchmark
    on every run (nothing cached by an earlier one) calls it before compiling.
    """
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    return path


def rank_env(nproc: int) -> dict[str, str]:
    """The environment of a job's ranks without an agent (each adds its RANK): env:// on a free local port."""
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": str(nproc),
    }


def _ended(code: int) -> str:
    return signal.Signals(-code).name if code < 0 else f"exit {code}"


@dataclasses.dataclass
class Job:
    """How one launch ended."""

    launcher: str
    world_size: int
    # each launched process's status (an agent, the spawn parent, or a rank)
    exits: list[int]
    outputs: list[str]  # each launched process's stdout and stderr
    reports: list[dict[str, Any]]  # every rank<r>.json written, in rank order
    seconds: float
    timed_out: bool

    @property
    def ok(self) -> bool:
        return not self.timed_out and not any(self.exits)

    def failures(self) -> list[str]:
        """How the processes that failed ended: "SIGABRT", "exit 1", "timeout".

        A launcher that reports a rank's end (torchrun, mp.spawn) is read for
        it, so that a rank killed by a signal is named, not its launcher's exit.
        """
        if self.timed_out:
            return ["timeout"]
        ended = []
        for code, output in zip(self.exits, self.outputs, strict=True):
            if code:
                ranks = [_ended(int(m[1])) for m in _TORCHRUN_RANK.finditer(output)]
                ranks += [m[1] or f"exit {m[2]}" for m in _SPAWN_RANK.finditer(output)]
                ended.extend(ranks or [_ended(code)])
        return ended

    def log_tail(self, chars: int = 3000) -> str:
        """The last ``chars`` characters of each launched process's output."""
        return "\n".join(output[-chars:] for output in self.outputs)


def _commands(
    launcher: str,
    world_size: int,
    program: list[str],
    env: dict[str, str],
    rendezvous: str,
    python: str,
) -> list[tuple[list[str], dict[str, str]]]:
    torchrun = str(Path(python).parent / "torchrun")
    if launcher == "torchrun":
        return [
            (
                [
                    torchrun,
                    "--standalone",
                    "--nproc-per-node",
                    str(world_size),
                    *program,
                ],
                env,
            )
        ]
    if launcher == "torchrun_nodes":
        port = str(free_port())
        sizes = [world_size - world_size // 2, world_size // 2]
        if rendezvous == "static":
            meeting = ["--master-addr", "127.0.0.1", "--master-port", port]
        else:
            meeting = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]
            meeting += ["--rdzv-id", "collective-jobs"]
        return [
            (
                [
                    torchrun,
                    "--nnodes",
                    "2",
                    "--node-rank",
                    str(node),
                    "--nproc-per-node",
                    str(size),
                    *meeting,
                    *program,
                ],  # fmt: skip
                env,
            )
            for node, size in enumerate(sizes)
        ]
    job_env = {**rank_env(world_size), **env}
    if launcher == "mp_spawn":
        return [([python, *program, "--spawn", str(world_size)], job_env)]
    if launcher == "srun":
        return [
            (
                [python, *program],
                {**job_env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            )
            for rank in range(world_size)
        ]
    raise ValueError(f"unknown launcher {launcher!r}; one of {LAUNCHERS}")


def launch(
    launcher: str,
    world_size: int,
    program: list[str],
    out: Path | str,
    env: dict[str, str] | None = None,
    node_envs: list[dict[str, str]] | None = None,
    rendezvous: str = "static",
    timeout: float = 600,
    python: str = sys.executable,
) -> Job:
    """Run ``python PROGRAM --out OUT`` as a job of ``world_size`` ranks under ``launcher``.

    ``python`` is the interpreter (``torchrun`` is taken from its directory).
    ``env`` is added to every process's environment, ``node_envs[i]`` to node
    i's (``torchrun_nodes``).  ``out`` is emptied first.  A job still running
    after ``timeout`` seconds is killed (every process group it started) and
    reported as timed out.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("rank*.json"):
        stale.unlink()
    base = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    commands = _commands(
        launcher, world_size, [*program, "--out", str(out)], base, rendezvous, python
    )
    started = time.monotonic()
    processes = []
    for index, (command, process_env) in enumerate(commands):
        if node_envs is not None:
            process_env = {**process_env, **node_envs[index]}
        processes.append(
            subprocess.Popen(
                command,
                env=process_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        )
    outputs, timed_out = [], False
    for process in processes:
        remaining = max(timeout - (time.monotonic() - started), 1)
        try:
            outputs.append(process.communicate(timeout=remaining)[0])
        except subprocess.TimeoutExpired:
            timed_out = True
            for other in processes:
                if other.poll() is None:
                    os.killpg(other.pid, signal.SIGKILL)
            outputs.append(process.communicate()[0])
    return Job(
        launcher,
        world_size,
        [process.returncode for process in processes],
        outputs,
        [json.loads(path.read_text()) for path in sorted(out.glob("rank*.json"))],
        time.monotonic() - started,
        timed_out,
    )


def launch_ranks(
    script: str,
    nproc: int,
    args: list[str],
    timeout: float = 1200,
    env: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Run ``script --worker ARGS`` as ``nproc`` ranks (``srun`` style); each rank's report, in rank order.

    ``env`` is added to every rank's environment.  Raises RuntimeError, with
    the end of a failing rank's output, unless every rank reported.
    """
    with tempfile.TemporaryDirectory(prefix="bench-ranks-") as out_dir:
        job = launch(
            "srun",
            nproc,
            [script, "--worker", *args],
            out_dir,
            env={"PYTHONWARNINGS": "ignore", **(env or {})},
            timeout=timeout,
        )
    if len(job.reports) != nproc:
        tail = next((o for o in job.outputs if o.strip()), "").strip().splitlines()
        raise RuntimeError(
            f"{args}: {nproc - len(job.reports)} ranks failed: " + " | ".join(tail[-5:])
        )
    return job.reports


@contextlib.contextmanager
def busy_machine(processes: int) -> Iterator[None]:
    """``processes`` Python processes spinning on the CPUs for the duration (a loaded host)."""
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(processes)
    ]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
