"""Demo: Inductor autotunes custom ops whose implementations are collectives.

Each of four custom ops -- one per collective kind (all_reduce, all_gather,
reduce_scatter, all_to_all), each taking ``(x, group_name)`` -- has an eager
implementation written with the ``torch.distributed`` APIs (the op's own
code, which Inductor keeps as the default candidate), and the exact
equivalents of the library ``torch._inductor.kernel.collective_implementations``
registered with ``register_collective_implementations``.  Every alternative
computes the same result through a genuinely different communication
pattern, e.g. an all_reduce as reduce_scatter + all_gather, or in chunks.

When ``torch.compile`` compiles the program, the autotuner benchmarks every
candidate on every rank in lock-step (by default while the op is lowered;
``TORCHINDUCTOR_DEFER_COLLECTIVE_AUTOTUNING=1``: in the scheduler, each
candidate timed with the pointwise ops that follow it) and
ranks them by the slowest rank's median time, so all ranks pick the same
winner.  This script

* captures the per-candidate timings with
  ``torch._inductor.select_algorithm.add_feedback_saver``,
* records the candidate each rank's autotuner selected (through the
  ``InductorChoices.override_best_choice`` hook, without changing it),
* checks the compiled op's result exactly against the closed-form
  expectation (every rank's input is known to every rank) and that every
  rank selected the same candidate (exit status 1 otherwise),
* prints, on rank 0, a table of every candidate's time (the slowest rank's
  median) and why it won or lost, which compares it with the default run by
  run, as the decision did (the same words as the decision's trace artifact
  and TORCH_LOGS=+collective_autotuning); the winner's line names the rule
  that chose it.

The job starts as torchrun's examples start: ``init_process_group()``
without a backend, which serves CPU tensors with gloo.  ``--device cuda``
puts each rank's tensors on a GPU: with a GPU per rank, the group is bound
to it (``device_id``) and c10d serves CUDA tensors with NCCL; ranks that
share a GPU (more ranks on the host than GPUs) name gloo, with CUDA
tensors, since NCCL refuses two ranks on one device.  Run it with
``scripts/demo.sh``, which wraps this::

    torchrun --standalone --nproc-per-node 2 scripts/demo_collective_autotuning.py
    torchrun --standalone --nproc-per-node 3 scripts/demo_collective_autotuning.py --ops all_reduce
    torchrun --standalone --nproc-per-node 2 scripts/demo_collective_autotuning.py --device cuda

Timings on a shared CPU are noisy: the winner can change from run to run when
candidates are within a few percent of each other.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch._inductor.config as inductor_config
import torch.distributed as dist
from torch._inductor.choices import InductorChoices
from torch._inductor.collective_autotuning.choices import candidate_names
from torch._inductor.collective_autotuning.settings import benchmark_config
from torch._inductor.kernel.collective_implementations import (
    register_collective_implementations,
)
from torch._inductor.runtime.collective_benchmarking.channel_builder import (
    served_backends,
)
from torch._inductor.runtime.collective_benchmarking.reporting import explain
from torch._inductor.runtime.collective_benchmarking.timing import timer_name
from torch._inductor.select_algorithm import add_feedback_saver
from torch._inductor.virtualized import V
from torch.distributed.distributed_c10d import _resolve_process_group


if TYPE_CHECKING:
    from collections.abc import Callable

    from torch._inductor.ir import ChoiceCaller


def _group(group_name: str) -> dist.ProcessGroup:
    # Resolving the group by name, as functional collectives do, lets the
    # autotuner benchmark the eager op on its own channel too.
    return _resolve_process_group(group_name)


# The ops' own implementations, written with the torch.distributed APIs: the
# default candidates.  The alternatives come from the library
# (torch/_inductor/kernel/collective_implementations.py).
@torch.library.custom_op("collective_demo::all_reduce", mutates_args=())
def all_reduce_op(x: torch.Tensor, group_name: str) -> torch.Tensor:
    out = x.clone()
    dist.all_reduce(out, group=_group(group_name))
    return out


@all_reduce_op.register_fake
def _(x: torch.Tensor, group_name: str) -> torch.Tensor:
    return torch.empty_like(x)


# All_gather and reduce_scatter along dim 0, as the library's implementations.
def _gathered(x: torch.Tensor, group_name: str) -> torch.Tensor:
    return x.new_empty((x.shape[0] * _group(group_name).size(), *x.shape[1:]))


def _scattered(x: torch.Tensor, group_name: str) -> torch.Tensor:
    return x.new_empty((x.shape[0] // _group(group_name).size(), *x.shape[1:]))


@torch.library.custom_op("collective_demo::all_gather", mutates_args=())
def all_gather_op(x: torch.Tensor, group_name: str) -> torch.Tensor:
    out = _gathered(x, group_name)
    dist.all_gather_into_tensor(out, x, group=_group(group_name))
    return out


@all_gather_op.register_fake
def _(x: torch.Tensor, group_name: str) -> torch.Tensor:
    return _gathered(x, group_name)


@torch.library.custom_op("collective_demo::reduce_scatter", mutates_args=())
def reduce_scatter_op(x: torch.Tensor, group_name: str) -> torch.Tensor:
    out = _scattered(x, group_name)
    dist.reduce_scatter_tensor(out, x, group=_group(group_name))
    return out


@reduce_scatter_op.register_fake
def _(x: torch.Tensor, group_name: str) -> torch.Tensor:
    return _scattered(x, group_name)


@torch.library.custom_op("collective_demo::all_to_all", mutates_args=())
def all_to_all_op(x: torch.Tensor, group_name: str) -> torch.Tensor:
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=_group(group_name))
    return out


@all_to_all_op.register_fake
def _(x: torch.Tensor, group_name: str) -> torch.Tensor:
    return torch.empty_like(x)


# --- the demo ------------------------------------------------------------------
DEFAULT = "default (eager)"


@dataclass
class Case:
    op: Callable[[torch.Tensor, str], torch.Tensor]
    # The result on ``rank`` given the inputs of all ranks.
    expected: Callable[[list[torch.Tensor], int], torch.Tensor]


CASES = {
    "all_reduce": Case(all_reduce_op, lambda inputs, rank: torch.stack(inputs).sum(0)),
    "all_gather": Case(all_gather_op, lambda inputs, rank: torch.cat(inputs)),
    "reduce_scatter": Case(
        reduce_scatter_op,
        lambda inputs, rank: torch.stack(inputs).sum(0).chunk(len(inputs))[rank],
    ),
    "all_to_all": Case(
        all_to_all_op,
        lambda inputs, rank: torch.cat([x.chunk(len(inputs))[rank] for x in inputs]),
    ),
}


class AutotuneRecorder(InductorChoices):
    """Records what the autotuner measured and selected, changing nothing.

    ``feedback`` is registered with ``add_feedback_saver``; the timings it gets
    are already the slowest rank's median in ms, the same on every rank.
    ``override_best_choice`` is the hook the autotuner calls with its pick.
    """

    def __init__(self) -> None:
        super().__init__()
        self.timings: list[dict[ChoiceCaller, float]] = []
        self.why: list[dict[ChoiceCaller, str]] = []
        self.rules: list[str] = []
        self.timers: list[str] = []
        self.selected: list[ChoiceCaller] = []

    def feedback(
        self, timings, name, input_nodes, choices, profiled_time_fn, precompile_times
    ) -> None:
        self.timings.append(dict(timings))
        # Collective timings carry the group's decision (AgreedTimings), from
        # which the trace's reasons come: why each candidate won or lost, and
        # the rule that chose the winner.  Timings are in the choices' order.
        names = candidate_names(list(timings))
        default = next((name for name, is_default in names if is_default), None)
        notes = dict(
            zip(
                (result.name for result in timings.decision.results),
                explain(timings.decision, default, benchmark_config().confidence),
                strict=True,
            )
        )
        self.why.append(
            {
                choice: notes[name]
                for choice, (name, _) in zip(timings, names, strict=True)
            }
        )
        self.rules.append(timings.decision.rule.value)
        self.timers.append(timings.decision.timer)

    def override_best_choice(self, best_choice, timings):
        self.selected.append(best_choice)
        return best_choice


def candidate_label(choice: ChoiceCaller, kind: str) -> str:
    """Short name of a candidate: the default, or its decomposition's name."""
    if choice.gm is None:  # the eager fallback: the op's own implementation
        return DEFAULT
    decomposition = getattr(choice, "decomposition", None)
    return (
        decomposition.__name__.removeprefix(f"{kind}_")
        if decomposition
        else choice.name
    )


def make_input(numel: int, rank: int, device: torch.device) -> torch.Tensor:
    # Small integers: every sum is exact in float32, whatever the order.
    return (torch.arange(numel, device=device) % 251 + 1000 * rank).to(torch.float32)


def init_group(device_kind: str) -> torch.device:
    """Join the job's process group as users do; the device of this rank's tensors."""
    if device_kind == "cpu":
        dist.init_process_group()
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if count == 0:
        raise SystemExit("--device cuda: this machine has no GPU")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank % count)
    torch.cuda.set_device(device)
    if int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > count:
        dist.init_process_group("gloo")  # ranks share a GPU: NCCL refuses
    else:
        dist.init_process_group(device_id=device)
    return device


@dataclass
class Outcome:
    kind: str
    timings: dict[str, float]  # candidate -> ms on the slowest rank
    why: dict[str, str]  # candidate -> why it won or lost
    rule: str  # the rule that chose the winner
    timer: str  # what timed the candidates, and how many runs
    winners: list[str]  # the candidate each rank selected, by rank


def autotune(
    kind: str, numel: int, device: torch.device, recorder: AutotuneRecorder
) -> Outcome:
    """Compile ``kind``'s op (autotuning it), run it, and check the result."""
    case = CASES[kind]
    rank, world = dist.get_rank(), dist.get_world_size()
    register_collective_implementations(case.op, kind)
    recorder.timings.clear()
    recorder.why.clear()
    recorder.rules.clear()
    recorder.timers.clear()
    recorder.selected.clear()

    torch._dynamo.reset()
    compiled = torch.compile(case.op, fullgraph=True)
    result = compiled(
        make_input(numel, rank, device), dist.group.WORLD.group_name
    )  # compiles, autotunes, runs

    if len(recorder.timings) != 1 or len(recorder.selected) != 1 or not recorder.why:
        raise RuntimeError(
            f"{kind}: expected one autotuning, saw {len(recorder.timings)} timing tables "
            f"and {len(recorder.selected)} selections"
        )
    timings = {candidate_label(c, kind): ms for c, ms in recorder.timings[0].items()}
    why = {candidate_label(c, kind): note for c, note in recorder.why[0].items()}
    winner = candidate_label(recorder.selected[0], kind)

    expected = case.expected([make_input(numel, r, device) for r in range(world)], rank)
    torch.testing.assert_close(
        result, expected, rtol=0, atol=0, msg=lambda m: f"{kind} on rank {rank}: {m}"
    )

    winners: list = [None] * world
    dist.all_gather_object(winners, winner)
    return Outcome(kind, timings, why, recorder.rules[0], recorder.timers[0], winners)


def print_report(outcomes: list[Outcome]) -> None:
    """One table of every candidate's timing, fastest first, and why it won or lost.

    The one comparison with the default on a line is the why's, from the
    paired runs the decision used; a ratio of the medians beside it could
    say the opposite.
    """
    header = ("op", "candidate", "slowest rank (ms)", "chosen", "why")
    rows = []
    for outcome in outcomes:
        for i, (name, ms) in enumerate(
            sorted(outcome.timings.items(), key=lambda item: item[1])
        ):
            rows.append(
                (
                    outcome.kind if i == 0 else "",
                    name,
                    f"{ms:.3f}",
                    f"winner ({outcome.rule})" if name == outcome.winners[0] else "",
                    outcome.why[name],
                )
            )
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    aligns = [str.ljust, str.ljust, str.rjust, str.ljust, str.ljust]

    def line(row):
        return "  ".join(
            align(cell, width)
            for align, cell, width in zip(aligns, row, widths, strict=True)
        ).rstrip()

    print(line(header))
    print(line(["-" * width for width in widths]))
    for row in rows:
        if row[0] and row is not rows[0]:
            print()
        print(line(row))
    print()
    for outcome in outcomes:
        agreed = outcome.winners.count(outcome.winners[0])
        print(
            f"{outcome.kind}: winner: {outcome.winners[0]}, by the {outcome.rule} rule "
            f"(agreed by {agreed}/{len(outcome.winners)} ranks; timed with {outcome.timer})"
        )
    print(
        "\nRules: a candidate replaces the default only when it is faster in "
        "significantly many paired runs (sign test) and by more than the noise "
        "floor (do-no-harm); near-ties go to the default.  docs/design.md says more."
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--numel",
        type=int,
        default=256 * 1024,
        help="float32 elements in each rank's input, rounded down to a multiple of 2 x world size "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--nruns",
        type=int,
        default=20,
        help="timed runs per candidate (collective_benchmark_nruns; default: %(default)s)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=5,
        help="warmup runs per candidate (collective_benchmark_nwarmup; default: %(default)s)",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where each rank's tensors live (default: %(default)s)",
    )
    parser.add_argument(
        "--ops",
        nargs="+",
        choices=list(CASES),
        default=list(CASES),
        metavar="OP",
        help=f"collectives to autotune (default: all of {' '.join(CASES)})",
    )
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    warnings.filterwarnings(
        "ignore", message="TypedStorage is deprecated", category=UserWarning
    )
    device = init_group(args.device)
    rank, world = dist.get_rank(), dist.get_world_size()
    # Caches on, as users run them, in a fresh directory per rank, so that
    # every run of the demo compiles and benchmarks.
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(
        prefix=f"collective-demo-rank{rank}-"
    )
    numel = args.numel - args.numel % (2 * world)
    if numel <= 0:
        raise SystemExit(f"--numel must be at least {2 * world} with {world} ranks")

    def log(message: str) -> None:
        if rank == 0:
            print(message, flush=True)

    backends = ",".join(
        f"{kind}:{name}" for kind, name in served_backends(dist.group.WORLD).items()
    )
    log(
        f"{world} ranks ({backends}; tensors on {device.type}), {numel} float32 "
        "elements per rank, "
        f"{args.warmup} warmup + {args.nruns} timed runs per candidate, "
        f"timed with {timer_name(device)}"
    )
    recorder = AutotuneRecorder()
    add_feedback_saver(recorder.feedback)
    outcomes = []
    with (
        V.set_choices_handler(recorder),
        inductor_config.patch(
            collective_benchmark_nruns=args.nruns,
            collective_benchmark_nwarmup=args.warmup,
            max_autotune_report_choices_stats=False,  # a JSON line per rank on stderr
        ),
    ):
        for i, kind in enumerate(args.ops, 1):
            log(f"[{i}/{len(args.ops)}] autotuning {kind} ...")
            start = time.perf_counter()
            outcomes.append(autotune(kind, numel, device, recorder))
            log(
                f"[{i}/{len(args.ops)}] {kind}: compiled, autotuned and checked in {time.perf_counter() - start:.1f}s"
            )

    if rank == 0:
        print()
        print_report(outcomes)
    disagree = [o.kind for o in outcomes if len(set(o.winners)) != 1]
    not_finite = [
        o.kind for o in outcomes if not all(map(math.isfinite, o.timings.values()))
    ]
    dist.destroy_process_group()
    if disagree or not_finite:
        if rank == 0:
            print(
                f"FAILED: ranks disagree on {disagree or 'none'}; non-finite timings in {not_finite or 'none'}",
                file=sys.stderr,
            )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
