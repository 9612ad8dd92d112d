#!/usr/bin/env python3
"""What collective autotuning adds to the compile of a tensor-parallel transformer, and takes off its step.

The program: a Llama-style decoder stack (``--layers`` blocks of RMSNorm,
causal multi-head attention with 64-wide heads and a SwiGLU MLP, residual
adds, a final RMSNorm), ``--batch`` x ``--seq`` tokens flattened into dim 0,
``--hidden`` wide, tensor-parallel over ``--nproc`` gloo ranks (one process
each, env:// rendezvous), in each of ``--dtypes``, in one of two layouts:

* ``megatron``: QKV and gate/up column-parallel (this rank's heads and
  columns), O and down row-parallel, each followed by an all_reduce;
* ``sequence_parallel``: the activations between blocks sharded on the
  tokens; each block (attention, MLP) normalizes its shard, all_gathers
  it, and reduce_scatters its row-parallel output.

The collectives are the demo's custom ops (``all_reduce_op``,
``all_gather_op``, ``reduce_scatter_op`` of
``scripts/demo_collective_autotuning.py``: ``(x, group_name)``, eager
``torch.distributed`` code), compiled three ways: ``untuned`` (nothing
registered), ``V1`` (the library's implementations registered,
``register_collective_implementations``; tuned while lowering) and ``V2``
(``defer_collective_autotuning``: tuned in the scheduler).  The weights and
the input are drawn from seeds, the full tensors the same on every rank,
each rank taking its shard; every compiled program's output is checked on
every rank against the eager program's (the ops' own code) within a
tolerance per dtype (float32 1e-3, bfloat16 5e-2, relative and absolute),
and a launch whose check fails names the path, rank and error.

Measured, per layout, dtype and world size:

* **Compile**: the slowest rank's first call, in fresh processes with
  Inductor's caches on (its defaults) in a fresh cache directory per rank
  (``private_cache_dir``), after the eager reference and the vector-ISA
  probe that every first compile pays; ``--repeats`` launches per path,
  interleaved, their median (and range).  Overhead: tuned - untuned, and
  its share of the untuned compile.
* **Where the tuning goes** (``counters["collective_autotuning"]``, the
  slowest rank's, median over the launches): the sessions in all
  (``session_total_s``), compiling the candidates (``prepare_s``), warmup
  and timed runs, and synchronization (joins, the ready rendezvous,
  exchanges: ``presync_s + sync_s``); the joins and the ops benchmarked.
* **Step time**: one more launch compiles the untuned, V1 and V2 programs
  side by side (each its own Dynamo frame, each compile in a fresh cache
  directory, so V2 recalls nothing of V1's), then runs them and the eager
  program in ``--rounds`` interleaved rounds (each once per round, in an
  order shuffled per round and shared by the ranks, a barrier before
  each); a program's time in a round is its slowest rank's.  Medians with
  distribution-free 95% CIs, and the per-round ratios to the untuned
  program, paired (``bench_collective_regret.py``'s statistics).
* **Decisions** of that launch, per distinct decision (the ops sharing it
  counted): the winner, the rule and reason, and why each candidate won or
  lost, from the ``collective_autotuning_decision`` payloads; and the
  winners of the compile launches.

Usage:
  python scripts/bench_collective_tp.py [--nproc 2,4] [--dtypes float32,bfloat16]
      [--layouts megatron,sequence_parallel] [--layers 2] [--hidden 512] [--seq 128]
      [--batch 2] [--repeats 3] [--rounds 100]
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import random
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

from torch.testing._internal.distributed.collective_autotuning_jobs import (
    launch_ranks,
    private_cache_dir,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_collective_regret import median_ci, MIN_ROUNDS, paired_ratio, percent

PATHS = ("untuned", "V1", "V2")
PROGRAMS = ("eager", *PATHS)
# layout -> the collectives it issues (the demo's ops of these kinds)
LAYOUTS = {
    "megatron": ("all_reduce",),
    "sequence_parallel": ("all_gather", "reduce_scatter"),
}
TOLERANCE = {"float32": 1e-3, "bfloat16": 5e-2}
HEAD_DIM = 64
# counters["collective_autotuning"] read per compile (seconds, then counts)
PHASES = ("session_total_s", "prepare_s", "warmup_s", "timed_s", "presync_s", "sync_s")
COUNTS = ("presync", "ops")


# --- worker (one process per rank) --------------------------------------------------
def worker(mode: str, args: argparse.Namespace, out_dir: Path) -> None:
    root = private_cache_dir("bench-tp-")
    import torch
    import torch._inductor.config as inductor_config
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch._dynamo.utils import counters
    from torch._inductor.cpu_vec_isa import pick_vec_isa
    from torch._inductor.kernel.collective_implementations import (
        IMPLEMENTATIONS,
        register_collective_implementations,
    )
    from torch._inductor.runtime.collective_benchmarking import reporting
    from torch._inductor.utils import fresh_cache

    from demo_collective_autotuning import (
        all_gather_op,
        all_reduce_op,
        reduce_scatter_op,
    )

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD.group_name
    dtype = getattr(torch, args.dtype)
    megatron = args.layout == "megatron"
    inductor_config.collective_benchmark_strict = False
    ops = {
        "all_reduce": all_reduce_op,
        "all_gather": all_gather_op,
        "reduce_scatter": reduce_scatter_op,
    }
    # implementation function -> its name in the library, for the payloads' candidates
    names = {
        fn.__name__: name
        for kind in LAYOUTS[args.layout]
        for name, (fn, _) in IMPLEMENTATIONS[kind].items()
    }

    # Full weights from seeds, the same on every rank; this rank keeps its shard.
    hidden, tokens = args.hidden, args.batch * args.seq
    heads = hidden // HEAD_DIM // world  # this rank's
    width = heads * HEAD_DIM
    inter = 128 * math.ceil(8 * hidden / 3 / 128) // world  # this rank's MLP columns

    def full(seed: int, *shape: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed)
        return torch.randn(*shape, generator=generator)

    def cols(w: torch.Tensor, n: int) -> torch.Tensor:
        return w[:, rank * n : (rank + 1) * n]

    layers = []
    for layer in range(args.layers):
        seed = 100 * (layer + 1)
        qkv = [full(seed + i, hidden, hidden) / hidden**0.5 for i in range(3)]
        gate, up = (full(seed + i, hidden, inter * world) / hidden**0.5 for i in (3, 4))
        o = full(seed + 5, hidden, hidden) / hidden**0.5
        down = full(seed + 6, inter * world, hidden) / (inter * world) ** 0.5
        weights = {
            "qkv": torch.cat([cols(w, width) for w in qkv], dim=1),
            "o": o[rank * width : (rank + 1) * width],
            "gate_up": torch.cat([cols(gate, inter), cols(up, inter)], dim=1),
            "down": down[rank * inter : (rank + 1) * inter],
            "attention_norm": 1 + 0.1 * full(seed + 7, hidden),
            "mlp_norm": 1 + 0.1 * full(seed + 8, hidden),
        }
        layers.append({k: w.to(dtype) for k, w in weights.items()})
    final_norm = (1 + 0.1 * full(1, hidden)).to(dtype)
    x = full(2, tokens, hidden).to(dtype)
    if not megatron:
        x = x.chunk(world)[rank].contiguous()

    def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(
            x.dtype
        ) * w

    def attention(h: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
        qkv = h @ p["qkv"]  # this rank's heads
        q, k, v = qkv.view(args.batch, args.seq, 3, heads, HEAD_DIM).permute(
            2, 0, 3, 1, 4
        )
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(1, 2).reshape(tokens, width) @ p["o"]  # partial sums

    def mlp(h: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
        gate, up = (h @ p["gate_up"]).chunk(2, dim=-1)
        return (F.silu(gate) * up) @ p["down"]  # partial sums

    def decoder(x: torch.Tensor) -> torch.Tensor:
        for p in layers:
            for block, norm in ((attention, "attention_norm"), (mlp, "mlp_norm")):
                h = rms_norm(x, p[norm])
                if megatron:
                    x = x + all_reduce_op(block(h, p), group)
                else:
                    h = all_gather_op(h, group)
                    x = x + reduce_scatter_op(block(h, p), group)
        return rms_norm(x, final_norm)

    def register() -> None:
        for kind in LAYOUTS[args.layout]:
            register_collective_implementations(ops[kind], kind)

    def check(path: str, out: torch.Tensor) -> None:
        tolerance = TOLERANCE[args.dtype]
        if not torch.allclose(out, expected, rtol=tolerance, atol=tolerance):
            error = (out.float() - expected.float()).abs().max().item()
            raise AssertionError(
                f"{args.layout} {args.dtype}: the {path} program's output differs from "
                f"eager on rank {rank}: max abs error {error:.3g} > {tolerance:g}"
            )

    def first_call(path: str, fn: Any, payloads: list[dict]) -> float:
        # The first call (the compile), with the decision payloads it reports.
        def keep(*_: Any, **kwargs: Any) -> None:
            payloads.append(json.loads(kwargs["payload_fn"]()))

        with mock.patch.object(reporting, "trace_structured", side_effect=keep):
            dist.barrier()
            counters.clear()
            start = time.perf_counter()
            out = fn(x)
            seconds = time.perf_counter() - start
        check(path, out)
        return seconds

    expected = decoder(x)  # eager: the ops' own code
    pick_vec_isa()  # paid by every process's first C++ kernel: not the tuning's
    report: dict[str, Any] = {}
    if mode != "steps":
        if mode != "untuned":
            register()
        inductor_config.defer_collective_autotuning = mode == "V2"
        compiled = torch.compile(decoder)
        payloads: list[dict] = []
        report["first_call_s"] = first_call(mode, compiled, payloads)
        stats = counters["collective_autotuning"]
        report.update({name: stats[name] for name in (*PHASES, *COUNTS)})
        report["decisions"] = decisions(payloads, names)
    else:
        # Three Dynamo frames of their own (three lambdas), each compiled in a
        # fresh cache directory: nothing of one compile serves another.
        programs = {
            "eager": decoder,
            "untuned": torch.compile(lambda x: decoder(x)),
            "V1": torch.compile(lambda x: decoder(x)),
            "V2": torch.compile(lambda x: decoder(x)),
        }
        for path in PATHS:
            if path == "V1":
                register()
            payloads = []
            with (
                fresh_cache(dir=root, delete=False),
                inductor_config.patch(defer_collective_autotuning=path == "V2"),
            ):
                first_call(path, programs[path], payloads)
            report[f"{path} decisions"] = decisions(payloads, names)
        for fn in programs.values():
            for _ in range(3):
                fn(x)
        times = torch.zeros(args.rounds, len(PROGRAMS), dtype=torch.float64)
        for round_ in range(args.rounds):
            order = list(enumerate(PROGRAMS))
            random.Random(round_).shuffle(order)
            for i, name in order:
                dist.barrier()
                start = time.perf_counter()
                programs[name](x)
                times[round_, i] = time.perf_counter() - start
        dist.all_reduce(times, op=dist.ReduceOp.MAX)  # the slowest rank's, per round
        report["rounds_ms"] = {
            name: (times[:, i] * 1e3).tolist() for i, name in enumerate(PROGRAMS)
        }
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


def decisions(payloads: list[dict], names: dict[str, str]) -> list[dict[str, Any]]:
    """Per distinct decision (its tuning key): the op, how many ops took it, the winner and why."""

    def label(candidate: str | None, payload: dict) -> str:
        if candidate is None or candidate == payload["default"]:
            return "default"
        return next((names[f] for f in names if f"_autotuned_{f}_" in candidate), "?")

    distinct: dict[str, dict[str, Any]] = {}
    for payload in payloads:
        entry = distinct.setdefault(payload["tuning_key"] or payload["op"], {"ops": 0})
        entry["ops"] += 1
        if "winner" in entry and payload["source"] != "benchmarked":
            continue
        # The op's kind, from its candidates' names ("1:<namespace>::<op>_autotuned_<fn>...").
        names_of = " ".join(c["name"] for c in payload["candidates"])
        kind = re.search(
            r"::(all_reduce|all_gather|reduce_scatter)_autotuned_", names_of
        )
        entry.update(
            kind=kind.group(1) if kind else "?",
            winner=label(payload["winner"], payload),
            rule=payload["rule"],
            reason=payload["reason"],
            source=payload["source"],
            why={label(c["name"], payload): c["why"] for c in payload["candidates"]},
        )
    return list(distinct.values())


# --- driver ----------------------------------------------------------------------
def slowest(reports: list[dict], field: str) -> float:
    return max(report[field] for report in reports)


def cell(args: argparse.Namespace, nproc: int, layout: str, dtype: str) -> None:
    common = [
        "--layout", layout, "--dtype", dtype, "--layers", str(args.layers), "--hidden", str(args.hidden),
        "--seq", str(args.seq), "--batch", str(args.batch), "--rounds", str(args.rounds),
    ]  # fmt: skip
    compiles: dict[str, list[list[dict]]] = {path: [] for path in PATHS}
    for repeat in range(args.repeats):
        for path in PATHS:  # interleaved: each repeat visits every path
            ranks = launch_ranks(__file__, nproc, ["--mode", path, *common])
            compiles[path].append(ranks)
            print(
                f"# {layout} {dtype} {nproc} ranks, repeat {repeat + 1}/{args.repeats}: "
                f"{path} {slowest(ranks, 'first_call_s'):.1f} s",
                file=sys.stderr,
                flush=True,
            )
    steps = launch_ranks(__file__, nproc, ["--mode", "steps", *common])[0]

    def median(path: str, field: str) -> float:
        return statistics.median(slowest(ranks, field) for ranks in compiles[path])

    walls = {p: [slowest(r, "first_call_s") for r in compiles[p]] for p in PATHS}
    untuned = statistics.median(walls["untuned"])
    rounds = steps["rounds_ms"]
    print(
        f"\n### {layout}, {dtype}, {nproc} ranks\n\n"
        "Compile: first call, slowest rank, median (range) of "
        f"{args.repeats} launches per path; tuning: seconds of its sessions; step: "
        f"{args.rounds} interleaved rounds, slowest rank, median [95% CI], and the "
        "paired ratio to the untuned program\n"
    )
    print(
        "| program | compile (s) | overhead | tuning | compiling candidates | warmups "
        "| timed runs | sync | joins, ops tuned | step (ms) | vs untuned (paired) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in PROGRAMS:
        step = "{:.2f} [{:.2f}, {:.2f}]".format(*median_ci(rounds[name]))
        versus = (
            "-"
            if name == "untuned"
            else percent(paired_ratio(rounds[name], rounds["untuned"]))
        )
        if name == "eager":
            print(f"| eager | - | - | - | - | - | - | - | - | {step} | {versus} |")
            continue
        wall = statistics.median(walls[name])
        spread = f"{wall:.1f} ({min(walls[name]):.1f}-{max(walls[name]):.1f})"
        if name == "untuned":
            print(f"| untuned | {spread} | - | - | - | - | - | - | - | {step} | - |")
            continue
        phases = [median(name, field) for field in PHASES]
        sync = phases[4] + phases[5]
        counts = ", ".join(f"{median(name, field):.0f}" for field in COUNTS)
        print(
            f"| {name} | {spread} | {wall - untuned:+.1f} s ({(wall - untuned) / untuned:.0%}) "
            + "".join(f"| {seconds:.2f} " for seconds in phases[:4])
            + f"| {sync:.2f} | {counts} | {step} | {versus} |",
            flush=True,
        )
    print(
        "\n| path | op (ops sharing the decision) | winner | rule: reason | each candidate: why "
        "| winners in the compile launches |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for path in PATHS[1:]:
        won = collections.Counter(
            (decision["kind"], decision["winner"])
            for ranks in compiles[path]
            for decision in ranks[0]["decisions"]
        )
        for decision in steps[f"{path} decisions"]:
            why = "; ".join(f"{name}: {note}" for name, note in decision["why"].items())
            others = ", ".join(
                f"{winner} {count}"
                for (kind, winner), count in won.most_common()
                if kind == decision["kind"]
            )
            print(
                f"| {path} | {decision['kind']} ({decision['ops']}) | {decision['winner']} "
                f"| {decision['rule']}: {decision['reason']} | {why} | {others} |",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nproc", default="2,4", help="comma-separated world sizes")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument(
        "--repeats", type=int, default=3, help="compile launches per path"
    )
    parser.add_argument(
        "--rounds", type=int, default=100, help="interleaved step rounds"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--layout", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.mode, args, Path(args.out))
        return
    nprocs = [int(n) for n in args.nproc.split(",")]
    for n in nprocs:
        if args.hidden % (HEAD_DIM * n) or (args.batch * args.seq) % n:
            parser.error(
                f"{n} ranks: --hidden must divide into 64-wide heads per rank and the tokens into shards"
            )
    if args.rounds < MIN_ROUNDS:
        parser.error(f"--rounds: at least {MIN_ROUNDS} for a 95% CI of the median")
    import torch

    print(
        f"torch {torch.__version__}, gloo, {os.cpu_count()} CPUs; {args.layers} layers, hidden "
        f"{args.hidden}, {args.batch} x {args.seq} tokens; Inductor's caches on, a fresh cache "
        "directory per rank and launch"
    )
    failed = []
    for nproc in nprocs:
        for layout in args.layouts.split(","):
            for dtype in args.dtypes.split(","):
                try:
                    cell(args, nproc, layout, dtype)
                except RuntimeError as error:  # a rank failed: its last lines
                    failed.append(f"{layout} {dtype} {nproc} ranks")
                    print(
                        f"\n### {layout}, {dtype}, {nproc} ranks: FAILED: {error}",
                        flush=True,
                    )
    if failed:
        sys.exit(f"failed: {'; '.join(failed)}")


if __name__ == "__main__":
    main()
