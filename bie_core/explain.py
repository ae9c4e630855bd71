"""``bie_core.explain``: which kernel serves each op of a call, and why not the others."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from . import dispatch
from .ops import OpDef, get_op


@dataclass
class Explanation:
    """The dispatch decisions of one op call or one module forward (printable)."""

    target: str
    entries: list = field(default_factory=list)  # (layer name, Decision)

    @property
    def decisions(self):
        return [d for _, d in self.entries]

    def chosen(self) -> dict:
        """``{op: kernel qualname}`` (the last decision per op wins)."""
        return {d.op: d.kernel.qualname for _, d in self.entries}

    def __str__(self):
        lines = [f"bie dispatch for {self.target}:"]
        if not self.entries:
            lines.append("  (no bie op was called)")
        for layer, d in self.entries:
            head = f"[{layer}] " if layer else ""
            body = str(d).splitlines()
            lines.append(f"  {head}{body[0]}")
            lines.extend("  " + b for b in body[1:])
        return "\n".join(lines)

    __repr__ = __str__


def _as_opdef(target) -> OpDef | None:
    if isinstance(target, OpDef):
        return target
    if isinstance(target, str):
        return get_op(target)
    name = getattr(target, "__name__", "") or ""
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        name = str(target).split("::")[-1].split(".")[0]
        return get_op(name)
    return None


def explain(target: Any, *example_inputs, backend: str | None = None, backward: bool = False,
            **kwargs) -> Explanation:
    """Explain dispatch for an op or a module.

    * ``explain(bie_core.ops.binary_gemm, a, b, k, None, None, None)`` (or the op's
      name) decides for those inputs without running the kernel.
    * ``explain(layer_or_model, *inputs)`` runs the forward (``backward=True``:
      also a backward of ``output.sum()``) and records every bie op call, with
      the name of the submodule that made it.

    Each entry prints the chosen kernel, the kernels that could also serve, and
    every rejected kernel with all its reasons.
    """
    op = _as_opdef(target)
    if op is not None:
        pref = dispatch.validate_choice(backend, f"explain(backend={backend!r})") if backend else dispatch.current_preference()
        from .plugins.registry import get_registry
        get_registry().ensure_discovered()
        # a call may omit trailing arguments that have schema defaults, as it may when calling the op
        example_inputs = tuple(example_inputs) + tuple(op.defaults[len(example_inputs):])
        if op.validate is not None:
            op.validate(*example_inputs)
        d = dispatch.decide(op, tuple(example_inputs), pref)
        return Explanation(f"bie::{op.name}", [("", d)])
    if isinstance(target, torch.nn.Module):
        return _explain_module(target, example_inputs, kwargs, backward)
    raise TypeError(f"explain() takes an op (OpDef, name or torch.ops.bie.*) or an nn.Module, "
                    f"got {type(target).__name__}")


def _explain_module(module: torch.nn.Module, inputs, kwargs, backward: bool) -> Explanation:
    rec: list = []
    handles = []
    stack: list = []

    def pre(name):
        def hook(mod, args):
            stack.append(dispatch._layer_name.set(name))
        return hook

    def post(mod, args, out):
        if stack:
            dispatch._layer_name.reset(stack.pop())

    for name, sub in module.named_modules():
        handles.append(sub.register_forward_pre_hook(pre(name or type(module).__name__)))
        handles.append(sub.register_forward_hook(post))
    token = dispatch._recorder.set(rec)
    try:
        if backward:
            out = module(*inputs, **kwargs)
            t = out[0] if isinstance(out, (tuple, list)) else out
            t.float().sum().backward()
        else:
            with torch.no_grad():
                module(*inputs, **kwargs)
    finally:
        dispatch._recorder.reset(token)
        for h in handles:
            h.remove()
    seen, entries = set(), []
    for layer, d in rec:
        key = (layer, d.op, d.kernel.qualname, d.problem.describe())
        if key not in seen:
            seen.add(key)
            entries.append((layer, d))
    return Explanation(type(module).__name__, entries)
