"""What a custom op's autotuning registration is, as a digest that survives the process.

Caches of compiled programs and of decisions must miss when an op's
registered implementations change and hit when the same registration is made
again in a new process.  This module describes a registration by what it
would run: each implementation's code, defaults, captured values and bound
arguments, what its code names in its module (functions, described the same
way, modules and values), the source files of all of these (hashed with
``custom_graph_pass.get_hash_for_files``, as custom passes are), and its
configs.
It describes a program by the topology of the groups its candidates can
reach (:func:`autotuning_process_groups`).
What the digest sees and what it does not: ``docs/modules.md``,
"custom_op_fingerprint.py".  A registration that holds a value that a
digest could not tell from others like it has none: programs that call its
op bypass the FX graph cache.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import inspect
import logging
import os
import re
import sys
import types
from typing import Any, TYPE_CHECKING

import torch
from torch._inductor.codecache import BypassFxGraphCache
from torch._inductor.custom_graph_pass import get_hash_for_files
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

log = logging.getLogger(__name__)

# The registration of each op, as its digest: what register_custom_op_autotuning
# recorded last (empty: it has none, see registration_fingerprint).
_registrations: dict[torch._ops.OpOverload, str] = {}

# Per registration in _registrations whose implementations may issue
# collectives, the strings its description holds (names, configs'
# parameters, captured values, defaults, constants): the process group names
# among them are groups its implementations may reach by name.
_strings_of_registration: dict[str, frozenset[str]] = {}

# A string of a registration's description that says it may issue
# collectives: torch.distributed (a module, function, type or object of it,
# or the name in torch.distributed.x), the c10d, _c10d_functional(_autograd)
# op namespaces, or a name like a process group's (group_name, tp_group, pg,
# device_mesh: a parameter, a variable).
_MAY_ISSUE_COLLECTIVES = re.compile(
    r"c10d|^(torch\.|torch\._C\._)?distributed\b|(^|_)(group|pg|mesh)(_name)?$"
)

# Tensors captured by an implementation are described by their content up to
# this many elements, by their metadata beyond.
_TENSOR_CONTENT_LIMIT = 4096

_SCALARS = (type(None), bool, int, float, complex, str, bytes)
_TORCH_VALUES = (torch.dtype, torch.device, torch.layout, torch.memory_format)
# Values that a module may hold as configuration, never as state.
_CONSTANTS = (*_SCALARS, *_TORCH_VALUES, enum.Enum, tuple, frozenset, types.ModuleType)

# torch's own sources are part of every cache key already (codecache.torch_key).
_TORCH_DIR = os.path.join(os.path.dirname(torch.__file__), "")


class _Walk:
    """What describing a callable or a registration has met so far.

    A function, module, list or dict (an object's attributes too) is
    described in full where the walk first meets it, and by name after: the
    description is linear in the code and values reached, cycles end, and,
    the walk's order being fixed, it is the same in every process.
    """

    def __init__(self) -> None:
        self.seen: set[int] = set()  # alive while the walk runs
        self.files: dict[str, None] = {}  # source files outside torch, in order met
        self.sourceless: list[str] = []  # functions without a readable source file
        self.in_module_state = False  # within what a module's names reach, see _named
        # The registration argument being described, and the values met that
        # the description cannot tell from others like them, where they are.
        self.where = ""
        self.unkeyed: list[str] = []

    def unkeyed_value(self, what: str) -> None:
        """Note ``what``, a value met that the description cannot tell from others."""
        if not self.in_module_state:
            self.unkeyed.append(f"{self.where} ({what})")

    def source(self, path: str | None) -> bool:
        """Record the source file ``path``; False when there is no file to read."""
        if path is None or not (os.path.isfile(path) and os.access(path, os.R_OK)):
            return False
        if not path.startswith(_TORCH_DIR):
            self.files[path] = None
        return True

    def first(self, obj: object) -> bool:
        """Whether ``obj`` is met for the first time (it then counts as met)."""
        if id(obj) in self.seen:
            return False
        self.seen.add(id(obj))
        return True

    def digest(self, description: Any) -> str:
        """The digest of ``description`` and of the files met, by content only."""
        files = get_hash_for_files(tuple(self.files))
        return hashlib.sha256(repr((description, files)).encode()).hexdigest()


def _module_file(module: types.ModuleType | None) -> str | None:
    try:
        return inspect.getsourcefile(module)  # type: ignore[arg-type]
    except TypeError:  # None, or a module built into the interpreter
        return None


def _value(value: Any, walk: _Walk) -> Any:
    """A description of ``value`` that is equal in every process where the value is."""
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, _TORCH_VALUES):
        return str(value)
    if isinstance(value, enum.Enum):
        return ("enum", _value(type(value), walk), value.name)
    if isinstance(value, (list, dict)) and not walk.first(value):
        return ("met", type(value).__name__)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_value(item, walk) for item in value))
    if isinstance(value, (set, frozenset)):
        return ("set", tuple(sorted(repr(_value(item, walk)) for item in value)))
    if isinstance(value, dict):
        items = ((repr(_value(k, walk)), _value(v, walk)) for k, v in value.items())
        return ("dict", tuple(sorted(items)))
    if isinstance(value, torch.Tensor):
        metadata = (str(value.dtype), tuple(value.shape), str(value.device))
        if (
            value.device.type == "cpu"
            and value.numel() <= _TENSOR_CONTENT_LIMIT
            and not value.is_sparse
            and not value.is_quantized
        ):
            flat = value.detach().resolve_conj().resolve_neg().contiguous().reshape(-1)
            # Bytes, not .numpy(): numpy has no bfloat16 or float8.
            content = hashlib.sha256(flat.view(torch.uint8).numpy().tobytes())
            return ("tensor", metadata, content.digest())
        walk.unkeyed_value(f"a tensor of {value.numel()} elements, {value.device}")
        return ("tensor", metadata)
    if isinstance(value, types.ModuleType):
        walk.source(_module_file(value))
        return ("module", value.__name__)
    if isinstance(value, type):
        walk.source(_module_file(sys.modules.get(value.__module__)))
        return ("type", f"{value.__module__}.{value.__qualname__}")
    if callable(value):
        return _callable(value, walk)
    if walk.in_module_state:
        return ("object", _value(type(value), walk))
    return _object(value, walk)


def _object(value: object, walk: _Walk) -> Any:
    # What an object does is its class's code (its source file) run on its
    # attributes.  These are all of its state when its class is a plain Python
    # one: no __slots__, no __new__ of its own or of a base written in C.
    cls = type(value)
    attributes = getattr(value, "__dict__", None)
    slots = any("__slots__" in vars(base) for base in cls.__mro__)
    if attributes is None or slots or cls.__new__ is not object.__new__:
        walk.unkeyed_value(f"a {cls.__module__}.{cls.__qualname__} object")
    return ("object", _value(cls, walk), _value(attributes, walk))


def _code(code: types.CodeType, walk: _Walk) -> Any:
    consts = tuple(
        _code(c, walk) if isinstance(c, types.CodeType) else _value(c, walk)
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


def _code_names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_names(const)


def _named(namespace: dict[str, Any], names: list[str], walk: _Walk) -> Any:
    # What the names a function's code uses are in its module: its helpers
    # (described the same way, their own modules walked in turn), modules,
    # and constants (one computed from the environment at import time).
    # Other values (lists, dicts, tensors, objects) are as often state that
    # changes at run time (a logger, a lock, a cache) as configuration: by
    # their type only, and so is an object anywhere these names reach.  None
    # of it leaves a registration without a digest, or nearly none would have
    # one; configuration written in a module is in its source file.
    # In a module the code names, the same names again (helpers.combine).
    outer, walk.in_module_state = walk.in_module_state, True
    described = []
    for name in names:
        if name not in namespace:
            continue
        value = namespace[name]
        if callable(value) or isinstance(value, _CONSTANTS):
            described.append((name, _value(value, walk)))
        else:
            described.append((name, ("state", _value(type(value), walk))))
        if (
            isinstance(value, types.ModuleType)
            and value.__name__.partition(".")[0] != "torch"
            and walk.first(value)
        ):
            described.append((name, _named(vars(value), names, walk)))
    walk.in_module_state = outer
    return tuple(described)


def _function(fn: types.FunctionType, walk: _Walk) -> Any:
    code = fn.__code__
    named: Any = ()
    if not code.co_filename.startswith(_TORCH_DIR):
        if not walk.source(code.co_filename):
            walk.sourceless.append(f"{fn.__module__}.{fn.__qualname__}")
        named = _named(fn.__globals__, sorted(set(_code_names(code))), walk)
    return (
        "function",
        f"{fn.__module__}.{fn.__qualname__}",
        _code(code, walk),
        _value(fn.__defaults__, walk),
        _value(fn.__kwdefaults__, walk),
        tuple(_value(cell.cell_contents, walk) for cell in fn.__closure__ or ()),
        named,
    )


def _callable(fn: Any, walk: _Walk) -> Any:
    if isinstance(fn, functools.partial):
        return (
            "partial",
            _value(fn.func, walk),
            _value(fn.args, walk),
            _value(fn.keywords, walk),
        )
    if isinstance(fn, types.MethodType):
        return ("method", _value(fn.__func__, walk), _value(fn.__self__, walk))
    if isinstance(fn, torch._ops.OpOverload):
        return ("op", fn.name())
    if isinstance(fn, torch._ops.OpOverloadPacket):
        return ("op", fn._qualified_op_name)
    if isinstance(fn, types.FunctionType):
        return _function(fn, walk) if walk.first(fn) else ("met", fn.__qualname__)
    if inspect.isroutine(fn):
        return (
            "builtin",
            getattr(fn, "__module__", None),
            getattr(fn, "__qualname__", repr(type(fn))),
        )
    # A callable object: its class's __call__, on the object.
    return ("callable", _callable(type(fn).__call__, walk), _object(fn, walk))


def callable_fingerprint(fn: Callable[..., Any]) -> str:
    """A digest of what ``fn`` runs (see ``docs/modules.md``); equal across processes."""
    walk = _Walk()
    return walk.digest(_value(fn, walk))


def registration_fingerprint(
    op_overload: torch._ops.OpOverload,
    *,
    configs: Any,
    config_generator: Callable[..., Any] | None,
    default_impl: Callable[..., Any] | None,
    **options: Any,
) -> str:
    """A digest of one ``register_custom_op_autotuning`` call (its arguments as named there).

    Empty when the call holds a value that a digest could not tell from
    others like it (see ``docs/modules.md``): programs that call the op then
    bypass the FX graph cache (:func:`registered_autotuning_fingerprint`),
    and a warning names each such value and where it is.  Logs a warning
    naming the functions it reaches that have no readable source file
    (defined by ``exec``, in a REPL): what only a file would show is not
    covered for them.
    """
    walk = _Walk()
    # Each argument under the name that a warning gives it.
    arguments: dict[str, Any] = {}
    for i, config in enumerate(configs or ()):
        arguments[f"config {i}'s implementation"] = config.decomposition
        for name, value in config.params.items():
            arguments[f"config {i}'s parameter {name!r}"] = value
        arguments[f"config {i}'s config_patches"] = config.config_patches
    arguments |= dict(config_generator=config_generator, default_impl=default_impl)
    arguments |= options
    described = []
    for where, value in arguments.items():
        walk.where = where
        described.append((where, _value(value, walk)))
    description = (op_overload.name(), tuple(described))
    if walk.unkeyed:
        log.warning(
            "Custom op autotuning of %s: programs that call it are not cached, "
            "as Inductor's cache key cannot describe the content of %s. See "
            "docs/modules.md, custom_op_fingerprint.py.",
            op_overload.name(),
            "; ".join(walk.unkeyed),
        )
        return ""
    if walk.sourceless:
        log.warning(
            "Custom op autotuning of %s: no source file for %s. Inductor's caches "
            "key on their code, not on what only a file would show: define them "
            "in a file, or clear the cache after such a change. See "
            "docs/modules.md, custom_op_fingerprint.py.",
            op_overload.name(),
            ", ".join(walk.sourceless),
        )
    fingerprint = walk.digest(description)
    strings = frozenset(_strings(description))
    if any(_MAY_ISSUE_COLLECTIVES.search(string) for string in strings):
        _strings_of_registration[fingerprint] = strings
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
    # Only the registrations in force are looked up: the state stays bounded.
    for stale in _strings_of_registration.keys() - set(_registrations.values()):
        del _strings_of_registration[stale]


def registered_autotuning_fingerprint(
    gm: torch.fx.GraphModule | None,
) -> tuple[tuple[str, str], ...]:
    """``(op, registration digest)`` of every op of ``gm`` (and its subgraphs) registered for autotuning.

    Empty when the graph calls no such op: a cache key that includes it
    changes only for the programs that the registrations reach.  Raises
    ``BypassFxGraphCache`` when one of the registrations has no digest (see
    :func:`registration_fingerprint`), as the cache does for a custom pass
    without a ``uuid``: the graph is compiled every time.
    """
    found = {op.name(): _registrations[op] for op, _ in _registered_calls(gm)}
    for name, fingerprint in found.items():
        if not fingerprint:
            raise BypassFxGraphCache(
                f"the autotuning registration of {name} holds a value the key cannot "
                "describe by its content (named in a warning at registration)"
            )
    return tuple(sorted(found.items()))


def _registered_calls(
    gm: torch.fx.GraphModule | None,
) -> Iterator[tuple[torch._ops.OpOverload, torch.fx.Node]]:
    # The calls of ops registered for autotuning in gm and its subgraphs.
    if gm is None:
        return
    for module in gm.modules():
        if isinstance(module, torch.fx.GraphModule):
            for op in _registrations:
                for node in module.graph.find_nodes(op="call_function", target=op):
                    yield op, node


def autotuning_process_groups(
    gm: torch.fx.GraphModule | None,
) -> tuple[tuple[str, int, str], ...]:
    """The topology of every process group that the autotuned ops of ``gm`` may run collectives on.

    :func:`process_group_topology` of the default group and of every existing
    group whose name a call of a registered op passes as an argument, or that
    the op's registration names (a config's parameter, a default, a value an
    implementation captured or a constant of its code), sorted.  Only the
    ops that may issue collectives count: those whose registration's
    description names ``torch.distributed``, a c10d op namespace or a
    process-group-like name (``_MAY_ISSUE_COLLECTIVES``), or whose call
    passes the name of an existing group.  Empty when no op of ``gm`` (or of
    a subgraph) counts, or when no default process group exists: a program
    without them is the same at every world size.

    Which group an implementation's collectives run on is only known once it
    is traced, during lowering, after the cache key was computed.  Before
    tracing, the groups it can reach by name are these.  A registration
    that holds a ``ProcessGroup`` object has no digest, and its programs are
    not cached; a group that an implementation reaches otherwise (in its
    module's state) is not covered.  The caller's rank is not part of it: one
    program serves every rank of a job.
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
        passed: set[str] = set()
        torch.fx.node.map_aggregate(
            (node.args, node.kwargs),
            lambda value: passed.add(value) if isinstance(value, str) else None,
        )
        strings = _strings_of_registration.get(_registrations[op])
        if strings is not None or any(
            registered_group(name) is not None for name in passed
        ):
            # Not empty: strings holds what made the op count, or passed does.
            named |= passed | (strings or frozenset())
    if not named:
        return ()
    groups = {default, *filter(None, map(registered_group, named))}
    return tuple(sorted(process_group_topology(group) for group in groups))
