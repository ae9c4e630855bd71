"""The eager inference path of the bie layers: the layer's kernel calls
resolved once, bound to their prepared weights, and reused while nothing they
were chosen from has changed.

A layer's forward in inference (grad mode off, not compiling or tracing, no
torch dispatch or function mode, a plain tensor input) asks its
:class:`LeanCall` whether it still holds. It holds while

* the registry generation is the same (no backend registered, no
  ``clear_caches``),
* the backend preference is the same object (per-layer ``backend=``,
  ``use_backend``, ``set_backend``, ``BIE_BACKEND``),
* the input has the same shape, dtype, device, contiguity and requires_grad
  (the part of the dispatcher's decision key that varies from call to call),
* every tensor of the layer that the call reads is the same object, on the
  same storage, at the same version counter (an in-place update, an
  optimizer step, ``load_state_dict``, ``.to()``, ``.half()``, a write
  through a buffer's ``.data`` or a replaced tensor all fail this; a
  buffer, a ``TrackedTensor``, is followed by its version counter alone:
  every change of its storage bumps it).

Every other argument of the layer's ops is a constant of the layer. When it
holds, the forward is the bound kernel call and nothing else; otherwise the
layer resolves again through :func:`bie_core.dispatch.resolve`, which applies
the full contract (validation, strict explicit choices, fallback warnings).
``explain`` still records each decision on every call.

Inference tensors (made under ``torch.inference_mode``) have no version
counter: they are followed by storage alone (they cannot be modified in
place outside inference mode), as the dispatcher's prepared-layout cache does.

A layer may be called from several threads at once: a forward reads its
``LeanCall`` once and makes the call it checked (another thread may rebind the
layer for another input shape meanwhile), and the per-shape caches of bound
calls change by single dict operations.
"""
from __future__ import annotations

import math

import torch

from .. import dispatch
from ..ops._opdef import _compiling, _dispatch_stack_len, _function_mode, _grad_enabled
from ._tracked import TrackedTensor

_REG = dispatch._REG
_ctx_get = dispatch._context_pref.get
_rec_get = dispatch._recorder.get
_layer_name_get = dispatch._layer_name.get
_Tensor = torch.Tensor


def eager_inference(x) -> bool:
    """Whether a forward with input ``x`` may take the bound path: no autograd
    recording, not compiling or tracing (those must see the registered op),
    no dispatch or function mode, a plain tensor."""
    return (type(x) is _Tensor and not _grad_enabled() and not _compiling() and not _dispatch_stack_len()
            and not _function_mode())


def preference(backend: str):
    """The effective preference object for a call (what the router uses)."""
    if backend:
        return dispatch._layer_pref(backend)
    p = _ctx_get()
    if p is None:
        p = dispatch._global_pref
        if p is None:
            p = dispatch._env_pref if dispatch._env_read else dispatch._read_env()
    return p


def tensor_state(t):
    """(storage address, version) of a tensor; version None for an inference tensor."""
    if t is None:
        return None
    try:
        return (t.data_ptr(), t._version)
    except RuntimeError:
        return (t.data_ptr(), None)


def _holds_source(kinds: tuple) -> str:
    """Source of a validity check for tensors of the given kinds ("none",
    "inference", "tensor"), written out with the bound values as closure
    variables (the check runs on every call; attribute and loop overheads
    would dominate it)."""
    n = len(kinds)
    ts = [f"t{i}" for i in range(n)]
    outer = ["gen0", "pref0", "shape0", "dtype0", "dev0", "contig0", "rg0", "decisions"]
    body = [
        # the input's shape first: a layer that alternates two signatures (a prompt, then one row per step) learns
        # at the first comparison that it must switch
        "    if x.shape != shape0 or x.dtype != dtype0 or x.device != dev0: return False",
        "    if _REG.generation != gen0: return False",
        "    if backend: p = _layer_pref(backend)",
        "    else:",
        "        p = _ctx_get()",
        "        if p is None:",
        "            p = _D._global_pref",
        "            if p is None: p = _pref_global()",
        "    if p is not pref0 and p != pref0: return False",
        "    if x.is_contiguous() != contig0 or x.requires_grad != rg0: return False",
    ]
    for i, kind in enumerate(kinds):
        if kind == "none":
            body.append(f"    if t{i} is not None: return False")
            continue
        if kind == "tracked":
            # a TrackedTensor changes storage only through writes that renew its _alias, and its values only
            # through writes that bump the version counter the alias shares (read there: a plain tensor's
            # attribute is cheaper than the subclass's)
            outer += [f"o{i}", f"c{i}", f"v{i}"]
            body.append(f"    if t{i} is not o{i} or t{i}._alias is not c{i} or c{i}._version != v{i}: return False")
            continue
        outer += [f"o{i}", f"p{i}"]
        cond = f"t{i} is not o{i} or t{i}.data_ptr() != p{i}"
        if kind == "tensor":
            outer.append(f"v{i}")
            cond += f" or t{i}._version != v{i}"
        body.append(f"    if {cond}: return False")
    body += ["    rec = _rec_get()",
             "    if rec is not None:",
             "        name = _layer_name_get()",
             "        for d in decisions: rec.append((name, d))",
             "    return True"]
    return (f"def make({', '.join(outer)}):\n"
            f"  def holds(x, backend{''.join(', ' + t for t in ts)}):\n"
            + "\n".join("  " + line for line in body) + "\n  return holds\n")


def _pref_global():
    p = dispatch._global_pref
    if p is None:
        p = dispatch._env_pref if dispatch._env_read else dispatch._read_env()
    return p


_makers: dict = {}


def _maker(kinds: tuple):
    f = _makers.get(kinds)
    if f is None:
        ns = {"_D": dispatch, "_REG": _REG, "_layer_pref": dispatch._layer_pref, "_ctx_get": _ctx_get, "_pref_global": _pref_global,
              "_rec_get": _rec_get, "_layer_name_get": _layer_name_get}
        exec(compile(_holds_source(kinds), f"<bie lean check {kinds}>", "exec"), ns)  # noqa: S102 - fixed template
        f = _makers[kinds] = ns["make"]
    return f


class LeanCall:
    """One layer's bound inference call and the state it was bound under.

    ``call(x)`` computes the layer's 2-D output from its 2-D input ``x``;
    ``holds(x, backend, *fixed)`` says whether it still computes what the
    dispatcher would for input ``x`` and the layer's current tensors ``fixed``
    (in the bound order), and records the decisions for ``explain`` when it
    does; ``decisions`` are the dispatcher's decisions the call runs."""

    __slots__ = ("call", "decisions", "holds")

    def __init__(self, call, decisions: tuple, x: torch.Tensor, pref, fixed: tuple):
        self.call = call
        self.decisions = decisions
        kinds, vals = [], []
        for t in fixed:
            c = getattr(t, "_alias", None) if type(t) is TrackedTensor else None
            if c is not None and not c.is_inference():   # (an inference tensor has no version counter)
                kinds.append("tracked")
                vals += [t, c, c._version]
                continue
            st = tensor_state(t)
            if st is None:
                kinds.append("none")
            elif st[1] is None:
                kinds.append("inference")
                vals += [t, st[0]]
            else:
                kinds.append("tensor")
                vals += [t, st[0], st[1]]
        self.holds = _maker(tuple(kinds))(_REG.generation, pref, x.shape, x.dtype, x.device, x.is_contiguous(),
                                          x.requires_grad, decisions, *vals)


def on_input(lc: LeanCall, x: torch.Tensor, n: int, backend: str, fixed: tuple) -> LeanCall:
    """``lc``, bound on the 2-D rows of ``x``, as a call on ``x`` itself, whatever its rank (a model's activations
    are (batch, tokens, features)): the rows are viewed in and the output viewed out with shapes fixed here, and the
    call holds for inputs of ``x``'s own shape. Reshaping per call, with the output shape built from the input's,
    costs about 3 µs of host time (a CPU core here): half of ``nn.Linear``'s whole call, which does this in C++."""
    if x.dim() == 2:
        return lc
    if getattr(lc.call, "any_rank", False) and x.is_contiguous():   # the kernel's bound call takes x as it is
        return LeanCall(lc.call, lc.decisions, x, preference(backend), fixed)
    k = x.shape[-1]
    m = math.prod(x.shape[:-1])
    oshape = tuple(x.shape[:-1]) + (n,)
    inner = lc.call

    def call(x):   # (reshape: a view wherever one exists)
        return inner(x.reshape(m, k)).reshape(oshape)
    call.rows = inner   # the call on the rows (what explain-like checks and tests look at)
    return LeanCall(call, lc.decisions, x, preference(backend), fixed)


#: input shapes whose bound calls a layer keeps: generation alternates two (the prompt's rows, then one row per
#: sequence every step), and a data loader's last batch adds one
LEAN_SHAPES = 4


def keep_by_shape(shapes: dict, shape, lc: LeanCall, most: int) -> None:
    """Keep ``lc`` as the bound call for inputs of ``shape``, dropping the oldest shapes past ``most``. (list()
    copies the keys in one step: threads rebinding a layer at once never iterate a dict that changes under them.)"""
    shapes.pop(shape, None)
    for old in list(shapes)[:max(0, len(shapes) - most + 1)]:
        shapes.pop(old, None)
    shapes[shape] = lc


def kept(layer, x: torch.Tensor, backend: str, fixed: tuple):
    """A bound call ``layer`` keeps for ``x``'s shape that still holds, made the layer's current call; else None.
    (Written straight into the instance dict: nn.Module.__setattr__ costs about a microsecond of a switch between
    signatures.)"""
    k = layer.__dict__.get("_lean_shapes")
    lc = k[1].get(x.shape) if k else None
    if lc is not None and lc.holds(x, backend, *fixed):
        layer.__dict__["_lean"] = lc
        return lc
    return None


def forget(layer) -> None:
    """Drop ``layer``'s bound calls, the current one and those kept by shape: for a change their checks cannot see
    (a layer constant that is not a tensor, such as an activation scheme)."""
    layer.__dict__["_lean"] = None
    layer.__dict__.pop("_lean_shapes", None)


def keep(layer, x: torch.Tensor, fixed: tuple, lc: LeanCall) -> None:
    """Keep ``lc`` as ``layer``'s bound call for ``x``'s shape (``layer._lean_shapes``: the state of ``fixed`` the
    calls were bound under, and the calls by input shape). The calls kept for other shapes go when the layer's
    tensors have changed since: they would not hold again, and they keep the old weights' derived forms alive."""
    state = tuple((t, tensor_state(t)) for t in fixed)
    k = layer.__dict__.get("_lean_shapes")
    if not k or len(k[0]) != len(state) or any(a[0] is not b[0] or a[1] != b[1] for a, b in zip(k[0], state)):
        k = layer.__dict__["_lean_shapes"] = (state, {})
    keep_by_shape(k[1], x.shape, lc, LEAN_SHAPES)


def bind_one(op, args: tuple, backend: str, fixed: tuple, before=None, x=None) -> LeanCall:
    """A :class:`LeanCall` for one op whose first argument is the layer input
    and whose other arguments are layer constants (``fixed`` lists the layer
    tensors among them). With ``before``, the layer input is ``x`` and the op's
    first argument is ``before(x)`` (an element-wise prologue of layer
    constants: the same shape, dtype, device and layout as ``x``)."""
    r = dispatch.resolve(op, *args, backend=backend)
    fn, rest = r.fn, args[1:]
    if getattr(fn, "input_only", False):   # a kernel's bound call that needs nothing but the input (Kernel.bind)
        call = fn
    else:
        def call(x):
            return fn(x, *rest)
        # a bound call taking inputs of any rank (the rows of the last dim; the output in the input's shape), or
        # the kernel itself with its prepared layout (functools.partial)
        call.any_rank = getattr(fn, "any_rank", False) or getattr(getattr(fn, "func", None), "any_rank", False)
    if before is not None:
        inner = call

        def call(x):
            return inner(before(x))
    return LeanCall(call, (r.decision,), args[0] if x is None else x, r._pref, fixed)
