"""What a custom op's autotuning registration is, as a digest that survives the process.

Caches of compiled programs and of decisions must miss when an op's
registered implementations change and hit when the same registration is made
again in a new process.  This module describes a registration by what it
would run (each implementation's code, defaults, captured values and bound
arguments, its configs).
It describes a program by the topology of the groups its candidates can
reach (:func:`autotuning_process_groups`).
What the digest sees and what it does not: ``docs/modules.md``,
"custom_op_fingerprint.py".
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import types
from typing import Any, TYPE_CHECKING

import torch
from torch._inductor.runtime.collective_benchmarking.groups import (
    process_group_topology,
    registered_group,
)


if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


__all__ = [
    "autotuning_process_groups",
    "callable_fingerprint",
    "record_registration",
    "registered_autotuning_fingerprint",
    "registration_fingerprint",
]

# The registration of each op, as its digest: what register_custom_op_autotuning recorded last.
_registrations: dict[torch._ops.OpOverload, str] = {}

# Per registration digest, the strings its description holds (configs'
# parameters, captured values, defaults, constants): the process group names
# among them are groups its implementations may reach by name.
_strings_of_registration: dict[str, frozenset[str]] = {}

# Tensors captured by an implementation are described by their content up to
# this many elements, by their metadata beyond.
_TENSOR_CONTENT_LIMIT = 4096


def _digest(parts: Any) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    flat = tensor.detach().resolve_conj().resolve_neg().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes()


def _value(value: Any, seen: set[int]) -> Any:
    """A description of ``value`` that is equal in every process where the value is."""
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return value
    if isinstance(
        value, (torch.dtype, torch.device, torch.layout, torch.memory_format)
    ):
        return str(value)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_value(item, seen) for item in value))
    if isinstance(value, (set, frozenset)):
        return ("set", tuple(sorted(repr(_value(item, seen)) for item in value)))
    if isinstance(value, dict):
        return (
            "dict",
            tuple(
                sorted(
                    (repr(_value(k, seen)), _value(v, seen)) for k, v in value.items()
                )
            ),
        )
    if isinstance(value, torch.Tensor):
        metadata = (str(value.dtype), tuple(value.shape), str(value.device))
        if (
            value.device.type == "cpu"
            and value.numel() <= _TENSOR_CONTENT_LIMIT
            and not value.is_sparse
            and not value.is_quantized
        ):
            return (
                "tensor",
                metadata,
                # Bytes, not .numpy(): numpy has no bfloat16 or float8.
                hashlib.sha256(_tensor_bytes(value)).hexdigest(),
            )
        return ("tensor", metadata)
    if isinstance(value, types.ModuleType):
        return ("module", value.__name__)
    if isinstance(value, type):
        return ("type", f"{value.__module__}.{value.__qualname__}")
    if callable(value):
        return _callable(value, seen)
    return ("object", f"{type(value).__module__}.{type(value).__qualname__}")


def _code(code: types.CodeType) -> Any:
    consts = tuple(
        _code(c) if isinstance(c, types.CodeType) else _value(c, set())
        for c in code.co_consts
    )
    return (
        code.co_name,
        code.co_code,
        consts,
        code.co_names,
        code.co_varnames,
        code.co_freevars,
    )


def _same_module_functions(fn: types.FunctionType) -> Iterator[types.FunctionType]:
    # Functions of fn's own module that fn's code names: the helpers an
    # implementation is written with.
    def names(code: types.CodeType) -> Iterator[str]:
        yield from code.co_names
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                yield from names(const)

    for name in sorted(set(names(fn.__code__))):
        target = fn.__globals__.get(name)
        if (
            isinstance(target, types.FunctionType)
            and target.__module__ == fn.__module__
        ):
            yield target


def _callable(fn: Any, seen: set[int]) -> Any:
    if id(fn) in seen:
        return ("recursive", getattr(fn, "__qualname__", type(fn).__qualname__))
    seen = seen | {id(fn)}
    if isinstance(fn, functools.partial):
        keywords = tuple(sorted((k, _value(v, seen)) for k, v in fn.keywords.items()))
        return (
            "partial",
            _callable(fn.func, seen),
            tuple(_value(a, seen) for a in fn.args),
            keywords,
        )
    if isinstance(fn, types.MethodType):
        return ("method", _callable(fn.__func__, seen), _value(fn.__self__, seen))
    if isinstance(fn, torch._ops.OpOverload):
        return ("op", fn.name())
    if isinstance(fn, torch._ops.OpOverloadPacket):
        return ("op", fn._qualified_op_name)
    if isinstance(fn, types.FunctionType):
        closure = tuple(
            _value(cell.cell_contents, seen) for cell in fn.__closure__ or ()
        )
        helpers = tuple(
            (helper.__qualname__, _callable(helper, seen))
            for helper in _same_module_functions(fn)
            if helper is not fn
        )
        return (
            "function",
            f"{fn.__module__}.{fn.__qualname__}",
            _code(fn.__code__),
            _value(fn.__defaults__, seen),
            _value(fn.__kwdefaults__, seen),
            closure,
            helpers,
        )
    if inspect.isbuiltin(fn) or inspect.isroutine(fn):
        return (
            "builtin",
            getattr(fn, "__module__", None),
            getattr(fn, "__qualname__", repr(type(fn))),
        )
    # A callable object: its class's __call__ and its attributes.
    call = type(fn).__call__
    return (
        "object",
        _value(type(fn), seen),
        _callable(call, seen),
        _value(getattr(fn, "__dict__", {}), seen),
    )


def callable_fingerprint(fn: Callable[..., Any]) -> str:
    """A digest of what ``fn`` runs (see ``docs/modules.md``); equal across processes."""
    return _digest(_callable(fn, set()))


def registration_fingerprint(
    op_overload: torch._ops.OpOverload,
    *,
    configs: Any,
    config_generator: Callable[..., Any] | None,
    default_impl: Callable[..., Any] | None,
    **options: Any,
) -> str:
    """A digest of one ``register_custom_op_autotuning`` call (its arguments as named there)."""
    seen: set[int] = set()
    described_configs = None
    if configs is not None:
        described_configs = tuple(
            (
                None
                if config.decomposition is None
                else _callable(config.decomposition, seen),
                _value(config.params, seen),
                _value(config.config_patches, seen),
            )
            for config in configs
        )
    description = (
        op_overload.name(),
        described_configs,
        None if config_generator is None else _callable(config_generator, seen),
        None if default_impl is None else _callable(default_impl, seen),
        tuple(sorted((name, _value(value, seen)) for name, value in options.items())),
    )
    fingerprint = _digest(description)
    _strings_of_registration[fingerprint] = frozenset(_strings(description))
    return fingerprint


def _strings(description: Any) -> Iterator[str]:
    if isinstance(description, str):
        yield description
    elif isinstance(description, tuple):
        for part in description:
            yield from _strings(part)


def record_registration(op_overload: torch._ops.OpOverload, fingerprint: str) -> None:
    """Remember the registration of ``op_overload`` (the last one counts, as for the lowering)."""
    _registrations[op_overload] = fingerprint


def registered_autotuning_fingerprint(
    gm: torch.fx.GraphModule | None,
) -> tuple[tuple[str, str], ...]:
    """``(op, registration digest)`` of every op of ``gm`` (and its subgraphs) registered for autotuning.

    Empty when the graph calls no such op: a cache key that includes it
    changes only for the programs that the registrations reach.
    """
    found = {op.name(): _registrations[op] for op, _ in _registered_calls(gm)}
    return tuple(sorted(found.items()))


def _registered_calls(
    gm: torch.fx.GraphModule | None,
) -> Iterator[tuple[torch._ops.OpOverload, torch.fx.Node]]:
    # The calls of ops registered for autotuning in gm and its subgraphs.
    if gm is None or not _registrations:
        return
    for module in gm.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            target = node.target
            if (
                node.op == "call_function"
                and isinstance(target, torch._ops.OpOverload)
                and target in _registrations
            ):
                yield target, node


def autotuning_process_groups(
    gm: torch.fx.GraphModule | None,
) -> tuple[tuple[str, int, str], ...]:
    """The topology of every process group that the autotuned ops of ``gm`` may run collectives on.

    :func:`process_group_topology` of the default group and of every existing
    group whose name a call of a registered op passes as an argument, or that
    the op's registration names (a config's parameter, a default, a value an
    implementation captured or a constant of its code), sorted.  Empty when
    ``gm`` (or a subgraph) calls no op registered for autotuning, or when no
    default process group exists.

    Which group an implementation's collectives run on is only known once it
    is traced, during lowering, after the cache key was computed; and
    whether it issues collectives at all is not known before either, so
    every registered op counts.  Before tracing, the groups it can reach by
    name are these.  A group that an implementation reaches otherwise (a
    ``ProcessGroup`` object it captured) is not covered.  The caller's rank
    is not part of it: one program serves every rank of a job.
    """
    calls = list(_registered_calls(gm))
    if not calls:
        return ()
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return ()
    default = dist.group.WORLD
    if default is None:
        return ()
    named: set[str] = set()
    for op, node in calls:
        named |= _strings_of_registration.get(_registrations[op], frozenset())
        torch.fx.node.map_aggregate(
            (node.args, node.kwargs),
            lambda value: named.add(value) if isinstance(value, str) else None,
        )
    groups: dict[str, dist.ProcessGroup] = {default.group_name: default}
    for name in named:
        group = registered_group(name)
        if group is not None:
            groups[name] = group
    return tuple(sorted(process_group_topology(group) for group in groups.values()))
