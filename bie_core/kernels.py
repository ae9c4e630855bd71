"""Kernel declarations: what a kernel is, what it can serve, and why not.

A *kernel* is one implementation of one op by one backend. It declares a
:class:`Capability`; the dispatcher turns each call into a :class:`Problem`
and asks every candidate kernel ``capability.reasons(problem)``. An empty list
means the kernel can serve the call; otherwise every reason is kept so that an
error or ``bie_core.explain`` can show all of them (never just the last one).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import torch

ANY_DEVICE = "*"


@dataclass(frozen=True)
class Problem:
    """One call of one op, described by what capabilities can depend on.

    ``dims`` holds the op's named sizes (for GEMMs ``M``, ``N``, ``K``; for
    convs also ``C``, ``H``, ``W``...), ``attrs`` the op's discrete options
    (``bits``, ``group_size``, ``pad_value``, ``act_order``...).
    """

    op: str
    device_type: str
    device_index: Optional[int] = None
    dtype: Optional[torch.dtype] = None
    dims: Mapping[str, int] = field(default_factory=dict)
    attrs: Mapping[str, Any] = field(default_factory=dict)
    training: bool = False
    contiguous: bool = True

    @property
    def compute_capability(self) -> Optional[tuple]:
        if self.device_type != "cuda" or not torch.cuda.is_available():
            return None
        idx = self.device_index if self.device_index is not None else torch.cuda.current_device()
        return tuple(torch.cuda.get_device_capability(idx))

    def describe(self) -> str:
        dims = ", ".join(f"{k}={v}" for k, v in self.dims.items())
        attrs = ", ".join(f"{k}={v}" for k, v in self.attrs.items())
        dt = str(self.dtype).replace("torch.", "") if self.dtype is not None else "-"
        dev = self.device_type + (f":{self.device_index}" if self.device_index is not None else "")
        parts = [f"device={dev}", f"dtype={dt}"]
        if dims:
            parts.append(dims)
        if attrs:
            parts.append(attrs)
        if self.training:
            parts.append("training")
        return f"{self.op}({'; '.join(parts)})"


def _fmt_dtypes(dts) -> str:
    return "{" + ", ".join(str(d).replace("torch.", "") for d in dts) + "}"


@dataclass(frozen=True)
class Capability:
    """What a kernel declares it can compute.

    Every field left at its default means "no restriction".

    devices
        Device types served (``"cpu"``, ``"cuda"``, ``"mps"``), or ``"*"`` for
        any device (the pure-PyTorch reference).
    dtypes
        Activation dtypes served (``Problem.dtype``).
    attrs
        Allowed values per op attribute, e.g. ``{"bits": (2, 4, 8),
        "group_size": (32, 64, 128)}``. An attribute the problem does not
        carry is not checked.
    divisibility
        Required multiples per dimension, e.g. ``{"K": 128, "N": 8}``.
    min_dims / max_dims
        Inclusive bounds per dimension.
    compute_capability
        ``(min, max)`` CUDA compute capability as tuples, either may be None.
    training / inference
        Whether the kernel may be used when inputs require grad / when not.
    contiguous_only
        Rejects problems whose tensor inputs are not contiguous.
    check
        Extra predicate ``check(problem) -> str | None`` returning a reason
        for anything the fields above cannot say.
    defer
        ``defer(problem) -> str | None``: a case the kernel computes correctly
        but leaves to the next kernel under automatic selection because that
        one is faster (a GEMM that hands small M to another backend's GEMV).
        Unlike a rejection this is no fallback (no warning). An explicit choice
        of the backend (``set_backend("cutlass")``) still runs the kernel
        unless another kernel of that backend accepts the call; an explicit
        choice of the kernel (``"cutlass:wq_gemm_sm90"``) always runs it.
    """

    devices: Sequence[str] = (ANY_DEVICE,)
    dtypes: Optional[Sequence[torch.dtype]] = None
    attrs: Mapping[str, Sequence[Any]] = field(default_factory=dict)
    divisibility: Mapping[str, int] = field(default_factory=dict)
    min_dims: Mapping[str, int] = field(default_factory=dict)
    max_dims: Mapping[str, int] = field(default_factory=dict)
    compute_capability: tuple = (None, None)
    training: bool = True
    inference: bool = True
    contiguous_only: bool = False
    check: Optional[Callable[[Problem], Optional[str]]] = None
    defer: Optional[Callable[[Problem], Optional[str]]] = None

    def serves_device(self, device_type: str) -> bool:
        return ANY_DEVICE in self.devices or device_type in self.devices

    def reasons(self, p: Problem) -> list[str]:
        """Every reason this capability rejects ``p`` (empty list: accepted)."""
        out: list[str] = []
        if not self.serves_device(p.device_type):
            out.append(f"device {p.device_type} not served (serves {', '.join(self.devices)})")
            return out  # nothing else is meaningful on the wrong device
        if self.dtypes is not None and p.dtype is not None and p.dtype not in self.dtypes:
            out.append(f"dtype {str(p.dtype).replace('torch.', '')} not in {_fmt_dtypes(self.dtypes)}")
        for name, allowed in self.attrs.items():
            if name in p.attrs and p.attrs[name] not in allowed:
                out.append(f"{name}={p.attrs[name]!r} not in {list(allowed)!r}")
        for name, mult in self.divisibility.items():
            v = p.dims.get(name)
            if v is not None and v % mult != 0:
                out.append(f"{name}={v} is not a multiple of {mult}")
        for name, lo in self.min_dims.items():
            v = p.dims.get(name)
            if v is not None and v < lo:
                out.append(f"{name}={v} < minimum {lo}")
        for name, hi in self.max_dims.items():
            v = p.dims.get(name)
            if v is not None and v > hi:
                out.append(f"{name}={v} > maximum {hi}")
        lo, hi = self.compute_capability
        if (lo is not None or hi is not None) and p.device_type == "cuda":
            cc = p.compute_capability
            if cc is None:
                out.append("CUDA compute capability unknown (no CUDA device)")
            else:
                if lo is not None and cc < tuple(lo):
                    out.append(f"compute capability sm_{cc[0]}{cc[1]} < required sm_{lo[0]}{lo[1]}")
                if hi is not None and cc > tuple(hi):
                    out.append(f"compute capability sm_{cc[0]}{cc[1]} > supported sm_{hi[0]}{hi[1]}")
        if p.training and not self.training:
            out.append("inference-only kernel, but inputs require grad")
        if not p.training and not self.inference:
            out.append("training-only kernel, but no input requires grad")
        if self.contiguous_only and not p.contiguous:
            out.append("needs contiguous inputs")
        if self.check is not None and not out:
            r = self.check(p)
            if r:
                out.append(r)
        return out


@dataclass
class Kernel:
    """One implementation of one op by one backend.

    ``fn`` is called with the op's arguments (same order and names as the op
    schema, without the trailing ``backend`` argument). If ``prepare`` is
    given, the op's weight arguments are first turned into a backend layout by
    ``prepare(*weights, **static)`` (``static``: the op arguments named in
    ``prepare_static``; cached by the dispatcher per weight tensor version,
    never stored in ``state_dict``) and ``fn`` receives that object as the
    keyword argument ``prepared``.
    """

    backend: str
    op: str
    fn: Callable
    capability: Capability = field(default_factory=Capability)
    priority: int = 0
    name: str = ""
    prepare: Optional[Callable] = None
    unprepare: Optional[Callable] = None
    #: Names of non-weight op arguments that ``prepare`` also needs (``bits``,
    #: ``group_size``...): passed to it as keyword arguments and part of the
    #: cache key.
    prepare_static: Sequence[str] = ()
    #: Optional ``bind(*args, prepared=...) -> callable or None``: the kernel's
    #: plan for one call signature (the dispatcher's decision key: shapes,
    #: dtypes, devices, every non-tensor argument) and one prepared layout,
    #: made once by :func:`bie_core.dispatch.resolve`. The callable takes the
    #: op's arguments and must compute exactly what ``fn`` does for any
    #: arguments of that signature with the same weight tensors; None means
    #: "no faster call here" (``fn`` is used).
    bind: Optional[Callable] = None
    description: str = ""
    #: The reference kernel of an op is the executable definition that the
    #: conformance kit compares every other kernel with.
    reference: bool = False

    def __post_init__(self):
        if not self.name:
            self.name = getattr(self.fn, "__name__", self.op)

    @property
    def qualname(self) -> str:
        return f"{self.backend}:{self.name}"

    def prepare_inputs(self, op, args: tuple) -> tuple:
        """(weights, static kwargs) that ``prepare`` receives for a call of ``op``."""
        weights = tuple(args[i] for i in op.weight_args)
        if not self.prepare_static:
            return weights, {}
        return weights, {n: args[op.arg_names.index(n)] for n in self.prepare_static}

    def reasons(self, problem: Problem) -> list[str]:
        return self.capability.reasons(problem)

    def deferral(self, problem: Problem) -> Optional[str]:
        """Why automatic selection should pass an accepted ``problem`` on (Capability.defer), or None."""
        return self.capability.defer(problem) if self.capability.defer is not None else None

    def replace(self, **kw) -> "Kernel":
        return dataclasses.replace(self, **kw)
