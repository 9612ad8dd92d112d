"""Inductor's autotuning choices as collective benchmarking candidates.

``select_algorithm`` (V1, at lowering) and ``deferred_tuning.py`` (V2, in
the scheduler) hand ``ChoiceCaller``s to the protocol through this module: it
names them alike on every rank, gives each what its graph says of its
collectives (``collective_graphs.py``: their group, and the signature by
which a choice whose collectives differ between ranks is disqualified at
the join instead of desynchronizing the others), and builds the runner of
each choice on fixed benchmark inputs.

A choice compiles on its first use; as a candidate, it compiles in its
``prepare`` (:func:`compile_as_candidate`), which the benchmarker runs after
the join, and only for a candidate that the group benchmarks.
"""

from __future__ import annotations

import logging
from typing import Any, TYPE_CHECKING

import torch
import torch.distributed as dist
from torch._inductor.runtime.collective_benchmarking.benchmarker import (
    CollectiveBenchmarker,
)
from torch._inductor.runtime.collective_benchmarking.decisions import (
    CollectiveDecision,
    DecisionRule,
)
from torch._inductor.runtime.collective_benchmarking.groups import resolve_group
from torch._inductor.runtime.collective_benchmarking.reporting import (
    DecisionSource,
    publish,
)
from torch._inductor.runtime.collective_benchmarking.rules import (
    apply_speedup_threshold,
    is_default_choice,
)
from torch._inductor.runtime.collective_benchmarking.timing import device_of
from torch._inductor.runtime.collective_benchmarking.types import (
    Candidate,
    CollectiveBenchmarkError,
    digest,
)
from torch._inductor.select_algorithm import AlgorithmSelectorCache

from .collective_graphs import (
    collective_group_name,
    collective_ops,
    collective_signature,
    collectives_in_flight,
)
from .settings import benchmark_config, candidate_compile_settings


if TYPE_CHECKING:
    from collections.abc import Callable, Sequence


__all__ = [
    "AgreedTimings",
    "benchmark_collective_choices",
    "candidate_names",
    "choices_identity",
    "collective_candidates",
    "compile_as_candidate",
    "report_untimed",
]

log = logging.getLogger(__name__)
decision_log = torch._logging.getArtifactLogger(__name__, "collective_autotuning")


def candidate_names(choices: Sequence[Any]) -> list[tuple[str, bool]]:
    """``(name, is_default)`` of each choice's :class:`Candidate`, without building it.

    Names are ``"{index}:{choice name}"``; the first choice without a graph
    (the op's eager implementation) is the default.
    """
    names: list[tuple[str, bool]] = []
    for index, choice in enumerate(choices):
        is_default = is_default_choice(choice) and not any(
            default for _, default in names
        )
        names.append(
            (f"{index}:{getattr(choice, 'name', type(choice).__name__)}", is_default)
        )
    return names


def collective_candidates(
    choices: Sequence[Any], autotune_args: Any
) -> list[Candidate]:
    """The :class:`Candidate` of each Inductor ``ChoiceCaller``, on ``autotune_args``' tensors.

    Candidates are named by :func:`candidate_names`, in ``choices`` order.
    Local work only: no rank waits for another.
    """
    candidates: list[Candidate] = []
    for choice, (name, is_default) in zip(
        choices, candidate_names(choices), strict=True
    ):
        inputs, output = autotune_args.get_benchmark_tensors(
            AlgorithmSelectorCache._uses_layout_preserving_inputs(choice)
        ).unpack()
        output.zero_()
        candidates.append(
            Candidate(
                name,
                _choice_runner(choice, inputs, output),
                is_default=is_default,
                # Subgraph choices compile lazily on their first run.
                prepare=compile_as_candidate(choice._ensure_compiled)
                if hasattr(choice, "_ensure_compiled")
                else None,
                magnitude=_choice_runner(choice, inputs, output, absolute=True)
                if is_default
                else None,
                signature=collective_signature(choice),
                in_flight=collectives_in_flight(choice),
                collectives=collective_ops(choice),
            )
        )
    return candidates


def compile_as_candidate(compile: Callable[[], object]) -> Callable[[], None]:
    """A candidate's ``prepare``: ``compile``, under :func:`~.settings.candidate_compile_settings`.

    Any rank may call it, alone: under those settings ``compile`` issues no
    collective over the job's ranks.  Raises what ``compile`` raises.
    """

    def prepare() -> None:
        with candidate_compile_settings():
            compile()

    return prepare


def benchmark_collective_choices(
    choices: Sequence[Any], autotune_args: Any
) -> dict[Any, float]:
    """Benchmark Inductor ``ChoiceCaller``s that contain collectives; agreed ms per choice.

    Every rank of the choices' group must call it with the same choices in the
    same order.  Returns :class:`AgreedTimings` in ``choices`` order, identical
    on every rank, with inf for a disqualified choice; its
    :meth:`~AgreedTimings.agreed_choice` is the winner.  Raises
    :class:`CollectiveBenchmarkError` when a member is lost or the members are
    not tuning the same op.
    """
    candidates = collective_candidates(choices, autotune_args)
    inputs, output = autotune_args.get_benchmark_tensors().unpack()
    shapes = [(tuple(t.shape), t.dtype) for t in inputs if isinstance(t, torch.Tensor)]
    benchmarker = CollectiveBenchmarker(
        collective_group_name(choices), benchmark_config(), device_of([*inputs, output])
    )
    # Each candidate timed alone: what V2 measures for an op without an epilogue.
    decision = benchmarker.run(
        candidates, key=f"{shapes}", memo_key=f"{choices_identity(choices)}|alone"
    )
    return AgreedTimings(choices, candidate_names(choices), decision)


class AgreedTimings(dict[Any, float]):
    """The agreed time of each choice in ms (inf: disqualified), and the group's decision.

    Identical on every rank of the group.  The timings feed the autotuner's
    logs and feedback hooks; the winner comes from the decision only
    (:meth:`agreed_choice`), never from a rank re-picking on the medians:
    the decision applies the do-no-harm rules (``rules.decide``)
    that the medians alone do not show.
    """

    def __init__(
        self,
        choices: Sequence[Any],
        names: Sequence[tuple[str, bool]],
        decision: CollectiveDecision,
    ) -> None:
        super().__init__(
            (choice, decision.time_ms(name))
            for choice, (name, _) in zip(choices, names, strict=True)
        )
        self.decision = decision
        self._choice_named = {
            name: choice for choice, (name, _) in zip(choices, names, strict=True)
        }
        self._default = next((name for name, is_default in names if is_default), None)

    def agreed_choice(self, min_speedup_threshold: float = 1.0) -> Any:
        """The choice every rank of the group runs.

        The decision's winner after ``min_speedup_threshold``
        (``rules.apply_speedup_threshold``); the op's default
        when nothing qualified.  Raises :class:`CollectiveBenchmarkError`,
        on every rank alike, when nothing qualified and there is no default
        (``include_fallback=False``): a choice that failed never runs.
        ``InductorChoices.override_best_choice`` is called, as after any
        autotuning, but it is rank-local: an answer other than the agreed
        choice is logged and ignored, since ranks running different choices
        issue mismatched collectives.
        """
        from torch._inductor.virtualized import V

        decision = apply_speedup_threshold(
            self.decision, self._default, min_speedup_threshold
        )
        if decision is not self.decision:
            decision_log.debug(
                "collective autotuning over group %r: %s",
                decision.group_name,
                decision.reason,
            )
        name = decision.winner if decision.winner is not None else self._default
        if name is None:
            # Nothing qualified and include_fallback=False left no default:
            # every rank raises alike rather than run a choice that failed.
            raise CollectiveBenchmarkError(
                f"collective autotuning over group {decision.group_name!r}: no "
                "choice qualified, and without the op's default "
                f"(include_fallback=False) nothing can run: {decision.reason}"
            )
        agreed = self._choice_named[name]
        overridden = V.choices.override_best_choice(agreed, dict(self))
        if overridden is not agreed:
            log.warning(
                "collective autotuning: InductorChoices.override_best_choice chose %s "
                "on this rank instead of %s, which every rank of group %r agreed on; "
                "a collective choice cannot change on one rank alone, so %s runs",
                getattr(overridden, "name", overridden),
                getattr(agreed, "name", agreed),
                decision.group_name,
                getattr(agreed, "name", agreed),
            )
        return agreed


def report_untimed(name: str, choices: Sequence[Any], chosen: Any) -> None:
    """Report a collective choice taken without a session, in the trace and TORCH_LOGS.

    In deterministic mode Inductor benchmarks nothing and takes ``chosen``
    (``pick_deterministic_choice``: the op's eager default).  Local and
    never raising: every rank takes the same choice from the same graphs
    and reports it alike.
    """
    names = candidate_names(choices)
    try:
        group_name = collective_group_name(choices)
        group = resolve_group(group_name) if group_name is not None else None
    except (CollectiveBenchmarkError, KeyError, RuntimeError, ValueError):
        group_name, group = None, None
    decision = CollectiveDecision(
        group_name or "",
        (),
        names[choices.index(chosen)][0],
        "deterministic mode benchmarks nothing: the op's default runs",
        DecisionRule.DETERMINISTIC,
    )
    publish(
        decision,
        name,
        DecisionSource.UNTIMED,
        default=next((n for n, is_default in names if is_default), None),
        candidates=[],  # nothing was timed: no candidate to explain
        ranks=dist.get_process_group_ranks(group) if group is not None else [],
        logger=decision_log,
    )


def choices_identity(choices: Sequence[Any]) -> str:
    """A digest of what an op's choices compute, and on which input layouts.

    Two call sites of an op with the same identity measure the same thing,
    so they can share a decision.  Made of each choice's ``hash_key`` (its
    graph, or its kernel and arguments), its input layouts and its config
    patches, in order; equal on every rank for the same program.
    """
    parts = []
    for choice in choices:
        try:
            code = choice.hash_key()
        except (AttributeError, NotImplementedError):
            code = getattr(choice, "name", type(choice).__name__)
        layouts = [
            (str(node.get_size()), str(node.get_stride()), str(node.get_dtype()))
            for node in getattr(choice, "input_nodes", ())
        ]
        patches = sorted(getattr(choice, "config_patches", {}).items())
        parts.append(f"{code}|{layouts}|{patches!r}")
    return digest("\n".join(parts))


def _choice_runner(
    choice: Any, inputs: Sequence[Any], output: torch.Tensor, absolute: bool = False
) -> Callable[[], Any]:
    # ``absolute``: on the absolute values of the floating-point inputs, into
    # an output of its own (see Candidate.magnitude).
    def run() -> Any:
        out = torch.empty_like(output) if absolute else output
        args = [_absolute(value) if absolute else value for value in inputs]
        result = choice.benchmark_collective(*args, out=out)
        return out if result is None else result

    return run


def _absolute(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.abs()
    return value
