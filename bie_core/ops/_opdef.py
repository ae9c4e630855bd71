"""How an op is defined: once, in core, as a ``torch.library`` custom op.

Each op is declared with :func:`define_op`. That

* defines the schema ``bie::NAME(...)`` with a trailing ``str backend=""``
  argument (the per-layer override, passed as a constant so it is
  ``torch.compile`` friendly),
* registers one *router* implementation on ``CompositeExplicitAutograd``
  (every real device) that hands the call to the bie dispatcher, which picks
  a kernel from the plugin registry (``torch.library`` alone keeps one kernel
  per device key and cannot express several backends, priorities or reasons),
* registers the fake (meta) implementation, so layers trace under
  ``torch.compile(fullgraph=True)`` and ``torch.library.opcheck`` passes.

The :class:`OpDef` also carries what the dispatcher and the conformance kit
need: how to describe a call as a :class:`~bie_core.kernels.Problem`, which
arguments are weights (prepared and cached per backend), how to generate
test cases, and how to compare results.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Sequence

import torch

from .. import dispatch
from ..kernels import Problem
from ..optable import LIB_NAME, add_op, all_ops, get_op, has_op  # noqa: F401 - the op table, re-exported
from ._memo import memoized

_lib = torch.library.Library(LIB_NAME, "DEF")

#: Argument names that carry indices or codes whose values validation checks.
VALUE_ARG_NAMES = ("indices", "g_idx", "q_perm", "codes")

_grad_enabled = torch.is_grad_enabled
_compiling = torch.compiler.is_compiling
_dispatch_stack_len = torch._C._len_torch_dispatch_stack
_function_mode = torch._C._is_torch_function_mode_enabled


def eager_fast_path() -> bool:
    """True when a call may bypass torch.library (and autograd): grad mode off,
    not compiling or tracing, no torch dispatch or function mode active. Then
    the router (or a kernel it resolved) computes exactly what the registered
    op would."""
    return not _grad_enabled() and not _compiling() and not _dispatch_stack_len() and not _function_mode()


@dataclass
class Case:
    """One conformance test case: the op's arguments (without ``backend``)."""

    args: tuple
    label: str
    #: Comparison: "exact" (bitwise equal) or (rtol, atol) for float outputs.
    tol: Any = "exact"
    #: Set when the reference computation itself should raise (bad input).
    expect_error: Optional[type] = None


@dataclass
class OpDef:
    name: str
    schema: str
    fake: Callable
    problem: Callable[..., Problem]
    doc: str = ""
    #: Positions of the arguments that are weights: a kernel's ``prepare``
    #: receives them and its result is cached per tensor version.
    weight_args: Sequence[int] = ()
    #: ``cases(device, generator) -> iterable of Case`` for the conformance kit.
    cases: Optional[Callable[[torch.device, torch.Generator], Iterable[Case]]] = None
    #: Extra checks done before dispatch (bad input gets a clear Python error
    #: whichever backend is chosen). Raises ValueError/TypeError.
    validate: Optional[Callable[..., None]] = None
    #: For a fused op: the same function written with other ops,
    #: ``decompose(*args, backend="")``. A backend that implements the parts
    #: but not the fused op then still serves it (see bie_core.dispatch).
    decompose: Optional[Callable] = None
    #: Arguments whose *values* ``validate`` checks (index ranges,
    #: permutations, code ranges). Decisions are cached by shapes, so these are
    #: re-validated whenever a new tensor (or a new version of one) arrives on
    #: the CPU. Default: the arguments named like the index/code tensors below.
    value_arg_names: Optional[Sequence[str]] = None
    #: The op's contract fixes its output's memory format (channels_last or contiguous) as the fake kernel does:
    #: the conformance kit then checks every kernel's output against the fake's (compiled graphs rely on it).
    memory_format_checked: bool = False
    #: Names of the arguments, in schema order (filled from the schema).
    arg_names: tuple = field(default=(), init=False)
    value_args: tuple = field(default=(), init=False)
    #: Schema defaults of the arguments (``None`` where there is none), to complete calls that omit
    #: trailing optional arguments.
    defaults: tuple = field(default=(), init=False)
    #: Positions of the ``int`` arguments and of the ``int[]`` ones (filled from the schema): the eager fast path
    #: hands kernels a bool given there as the int it stands for, as a call through torch.ops does.
    int_args: tuple = field(default=(), init=False)
    int_list_args: tuple = field(default=(), init=False)
    _route: Optional[Callable] = field(default=None, init=False, repr=False)
    family: str = ""

    @property
    def qualname(self) -> str:
        return f"{LIB_NAME}::{self.name}"

    @property
    def overload(self):
        return getattr(getattr(torch.ops, LIB_NAME), self.name).default

    def __call__(self, *args, backend: Optional[str] = None):
        # Eager fast path: with no autograd recording, no tracing and no
        # dispatch or function mode active, calling the router directly gives
        # exactly what the torch.library op would (the op's only real-device
        # implementation *is* the router), minus the boxing of a custom-op call
        # (about 2 µs, which dominates tiny inference layers). Anything else -
        # torch.compile, FakeTensor, autograd with grad enabled - goes through
        # the registered op.
        if len(args) < len(self.arg_names):
            args = tuple(args) + self.defaults[len(args):]
        if (not _grad_enabled() and not _compiling() and not _dispatch_stack_len()
                and not _function_mode()):
            if _has_bool_int(args, self.int_args, self.int_list_args):
                args = _bools_as_ints(args, self.int_args, self.int_list_args)
            try:
                return self._route(*args, backend) if backend else self._route(*args)
            except (AttributeError, TypeError):
                # an argument of the wrong type can fail before validation (while the
                # router builds its cache key): say which one
                if self.validate is not None:
                    self.validate.check_types(args)
                raise
            except RuntimeError as e:
                named = allocation_error(e, self.name)
                if named is None:
                    raise
                raise named from e
        return self.overload(*args, backend or "")


def _has_bool_int(args, int_args, int_list_args) -> bool:
    """Whether a bool stands where the schema has an int (True is 1 to Python and to torch.ops, whose schema
    matching converts it; a kernel handed the bool itself may build a size from it, which torch refuses)."""
    for i in int_args:
        if args[i].__class__ is bool:
            return True
    for i in int_list_args:
        v = args[i]
        if isinstance(v, (list, tuple)):
            for x in v:
                if x.__class__ is bool:
                    return True
    return False


def _bools_as_ints(args, int_args, int_list_args) -> tuple:
    args = list(args)
    for i in int_args:
        if args[i].__class__ is bool:
            args[i] = int(args[i])
    for i in int_list_args:
        if isinstance(args[i], (list, tuple)):
            args[i] = [int(x) if x.__class__ is bool else x for x in args[i]]
    return tuple(args)


def _arg_types(schema: str) -> tuple:
    """The type of each argument as the schema text writes it (``Tensor?``, ``int[2]``, ``ScalarType?``)."""
    return tuple(a.strip().split("=")[0].strip().rsplit(None, 1)[0] for a in _split_args(schema))


def _split_args(schema: str) -> list:
    inner = schema[schema.index("(") + 1: schema.rindex(")")] if "->" not in schema else \
        schema[schema.index("(") + 1: schema.rsplit("->", 1)[0].rindex(")")]
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def _arg_names(schema: str) -> tuple:
    """The name of each argument, in schema order."""
    return tuple(a.strip().split("=")[0].strip().split()[-1] for a in _split_args(schema))


def define_op(op: OpDef) -> OpDef:
    """Define ``bie::<op.name>`` and register router and fake implementations."""
    if has_op(op.name):
        raise ValueError(f"op {op.name!r} is defined twice")
    schema = op.schema.strip()
    args_part, ret = schema.rsplit("->", 1)
    args_part = args_part.strip()
    assert args_part.startswith("(") and args_part.endswith(")"), schema
    full = f"{op.name}{args_part[:-1]}, str backend=\"\") -> {ret.strip()}"
    _lib.define(full)
    op.arg_names = _arg_names(args_part)
    op.defaults = tuple(a.default_value if a.has_default_value() else None
                        for a in op.overload._schema.arguments[:len(op.arg_names)])
    types = _arg_types(args_part)
    op.int_args = tuple(i for i, t in enumerate(types) if t.rstrip("?") in ("int", "SymInt"))
    op.int_list_args = tuple(i for i, t in enumerate(types) if t.rstrip("?").startswith(("int[", "SymInt[")))
    if op.validate is not None:
        op.validate = _with_type_checks(op, op.validate)
    names = VALUE_ARG_NAMES if op.value_arg_names is None else op.value_arg_names
    op.value_args = tuple(i for i, n in enumerate(op.arg_names) if n in names)
    route = dispatch.make_router(op)
    op._route = route
    # (calls through torch.ops: a compiled graph's keep their bound calls per weight tensor, _memo.py)
    _lib.impl(op.name, _naming_allocation_errors(memoized(op, route), op.name), "CompositeExplicitAutograd")
    torch.library.register_fake(op.qualname, _fake_impl(op), lib=_lib)
    add_op(op)
    return op


_ALLOC_ERRORS = ("can't allocate memory", "Storage size calculation overflowed", "out of memory")


def allocation_error(e: BaseException, op_name: str) -> Optional[BaseException]:
    """A MemoryError naming the op for torch's bare allocator errors (sizes
    beyond memory), else None."""
    msg = str(e)
    if isinstance(e, RuntimeError) and any(s in msg for s in _ALLOC_ERRORS):
        return MemoryError(f"bie::{op_name}: the call needs more memory than can be allocated "
                           f"({(msg.splitlines() or [type(e).__name__])[0][:200]})")
    return None


def _naming_allocation_errors(route: Callable, op_name: str) -> Callable:
    def route_naming_allocation_errors(*args):
        try:
            return route(*args)
        except RuntimeError as e:
            named = allocation_error(e, op_name)
            if named is None:
                raise
            raise named from e
    route_naming_allocation_errors.__name__ = route.__name__
    return route_naming_allocation_errors


def _type_checker(op: "OpDef") -> Callable:
    """Checks that every argument has the Python type the op's schema names
    (``bie::OP: k must be an int, got '3'``), so that op validation never
    meets a list where it expects a tensor. torch.library does this for calls
    through ``torch.ops.bie``; the eager fast path calls the router directly."""
    checks = []
    # types as the schema text writes them (torch's parsed schema shows ScalarType as int)
    for i, (name, t) in enumerate(zip(op.arg_names, _arg_types(op.schema))):
        optional = t.endswith("?")
        base = t.rstrip("?")
        if base.endswith("]"):   # int[2], int[]
            base = f"List[{base[:base.index('[')]}]"
        checks.append((i, name, base, optional))

    def ok(v, base) -> bool:
        if base == "Tensor":
            return isinstance(v, torch.Tensor)
        # (a bool is an int, in Python and in torch's schema matching; cached
        # decisions cannot tell True from 1 either)
        if base in ("int", "SymInt"):
            return isinstance(v, int)
        if base == "float":
            return isinstance(v, (int, float))
        if base == "bool":
            return isinstance(v, bool)
        if base == "str":
            return isinstance(v, str)
        if base == "ScalarType":
            return isinstance(v, torch.dtype)
        if base.startswith("List[") or base.endswith("]"):
            inner = base[5:-1] if base.startswith("List[") else base[:base.index("[")]
            return isinstance(v, (list, tuple)) and all(ok(x, inner) for x in v)
        return True

    def describe(base) -> str:
        return {"Tensor": "a tensor", "int": "an int", "SymInt": "an int", "float": "a number", "bool": "a bool",
                "str": "a string", "ScalarType": "a torch.dtype"}.get(base, f"a {base}")

    def check_types(args) -> None:
        for i, name, base, optional in checks:
            v = args[i] if i < len(args) else None
            if v is None and optional:
                continue
            if not ok(v, base):
                want = describe(base) + (" or None" if optional else "")
                if base.startswith("List[") or base.endswith("]"):
                    want = "a list of ints"
                raise TypeError(f"bie::{op.name}: {name} must be {want}, got {v!r} ({type(v).__name__})")
    return check_types


def _with_type_checks(op: "OpDef", validate: Callable) -> Callable:
    check_types = _type_checker(op)

    def validate_with_types(*args):
        check_types(args)
        validate(*args)
    validate_with_types.check_types = check_types
    return validate_with_types


def _symbolic(args) -> bool:
    """Whether a call carries symbolic sizes (tracing with dynamic shapes)."""
    for a in args:
        if isinstance(a, torch.SymInt) or (isinstance(a, torch.Tensor) and
                                           any(isinstance(s, torch.SymInt) for s in a.shape)):
            return True
        if isinstance(a, (list, tuple)) and any(isinstance(v, torch.SymInt) for v in a):
            return True
    return False


def _fake_impl(op: "OpDef") -> Callable:
    """The fake (meta) kernel: the op's validation, then the output's shape.

    torch runs the fake kernel instead of the router whenever one argument is
    a meta or fake tensor (``binary_gemm(a_cpu, b_meta)``, tracing), so it
    validates exactly like a real call: mixed devices and wrong shapes raise
    instead of producing an output of a made-up shape. Value checks are skipped
    (fake tensors have no values; see ``_common.has_values``), and so is all of
    validation when sizes are symbolic (dynamic-shape tracing: a check would
    specialise them; the real call validates)."""
    fake, validate, nargs = op.fake, op.validate, len(op.arg_names)

    def fake_impl(*args):
        args = args[:nargs]
        if len(args) < nargs:   # torch drops trailing arguments equal to their defaults
            args = tuple(args) + op.defaults[len(args):]
        if validate is not None and not _symbolic(args):
            validate(*args)
        return fake(*args)
    fake_impl.__name__ = getattr(fake, "__name__", "fake")
    return fake_impl
