"""Bound calls kept per weight tensor for the registered ops: what a compiled graph's call of a bie op costs.

A call through ``torch.ops.bie`` (a compiled graph's, or one made with grad or under a mode) reaches the op's
router, which looks its decision up by the call's key, then the kernel's prepared layout by a storage-and-view key of
every weight tensor, and calls the kernel's general entry point. An eager layer instead resolves once and keeps the
kernel's bound call (``dispatch.resolve``: the kernel's ``bind`` plan, its layout looked up and its argument block
filled once), several times cheaper per call. A graph hands an op the same weight tensor objects on every call, so
the registered op keeps such bound calls too, per weight tensor object:

* a call is bound (``dispatch.resolve``) when its weights are the same objects at the same state (storage,
  version) as on the call before and its input signature was met before with them: tensors made anew on every
  call (a training step's codes), weights edited in place between calls and input shapes that never repeat
  (dynamic shapes) cost no binding;
* a kept call runs while its weights are still those objects at that state and ``Resolved.valid`` holds (registry
  generation, preference, the call's key, validated index values; the decision is recorded for ``explain``): it
  is exactly the call the router would make;
* it is bound to detached aliases of the weights (the same storage and version counter), so what is kept never
  holds the weight objects themselves: it is dropped by a weak reference callback when the first of them dies.
"""
from __future__ import annotations

import weakref
from typing import Callable

import torch

from .. import dispatch
from ..graph_pool import outside_graph_pool

#: bound calls kept per weight (the input signatures of a graph: a few)
CALLS = 4

_state = dispatch._weight_state
_single_use = dispatch._single_use_get
_dispatch_stack_len = torch._C._len_torch_dispatch_stack


class _Entry:
    """The weights of the last call (weak references and states) and the calls bound for them (None: the bound
    call would not serve these weights, such as a kernel that depends on requires_grad)."""

    __slots__ = ("refs", "states", "calls", "missed")

    def __init__(self, refs: tuple, states: tuple):
        self.refs, self.states, self.calls, self.missed = refs, states, [], []


def _same_source(widx: tuple) -> str:
    """Source of the check that a call's weights (positions ``widx`` of its arguments; the first one given as w0)
    are the objects of an entry at the states it recorded, written out per position: it runs on every call of a
    graph's bie op, where a loop and a state tuple built per weight cost as much as the checks themselves."""
    lines = ["def same(e, a, w0):", "    r, s = e.refs, e.states"]
    for j, i in enumerate(widx):
        t = "w0" if j == 0 else f"t{j}"
        if j > 0:
            lines.append(f"    t{j} = a[{i}]")
        # a weight that was None (an optional one) has no reference and must be None again
        lines += [f"    ref = r[{j}]",
                  "    if ref is None:",
                  f"        if {t} is not None: return False",
                  "    else:",
                  # (a dead reference returns None: an argument None where the entry had a tensor differs too)
                  f"        if {t} is None or ref() is not {t}: return False",
                  f"        st = s[{j}]",
                  # (the same object: whether it is an inference tensor, and so has no version, cannot change)
                  f"        if {t}.data_ptr() != st[0] or (st[1] is not None and {t}._version != st[1]): return False"]
    lines.append("    return True")
    return "\n".join(lines) + "\n"


_same_fns: dict = {}


def _same_fn(widx: tuple) -> Callable:
    f = _same_fns.get(widx)
    if f is None:
        ns: dict = {}
        exec(compile(_same_source(widx), f"<bie memo check {widx}>", "exec"), ns)  # noqa: S102 - fixed template
        f = _same_fns[widx] = ns["same"]
    return f


def memoized(op, route: Callable) -> Callable:
    """``route`` (the op's router, as torch.library calls it) with bound calls kept per weight tensor."""
    widx = tuple(op.weight_args)
    if not widx:
        return route
    nargs, defaults, first = len(op.arg_names), op.defaults, widx[0]
    # the other tensor arguments, whose shapes tell input signatures apart
    xidx = tuple(i for i, arg in enumerate(op.overload._schema.arguments[:nargs])
                 if i not in widx and str(arg.type) in ("Tensor", "Optional[Tensor]"))
    entries: dict = {}
    dispatch.clear_hooks.append(entries.clear)

    def forget(ref, key):
        e = entries.get(key)
        if e is not None and e.refs[0] is ref:
            del entries[key]

    same = _same_fn(widx)

    def bind(e: _Entry, a: tuple, backend: str) -> None:
        if dispatch._capturing(a[first].device):   # a layout prepared now would live in the graph's memory
            return
        alias = list(a)
        for i in widx:
            if isinstance(a[i], torch.Tensor):
                alias[i] = a[i].detach()
        tok = dispatch._recorder.set(None)   # the router's call recorded this call's decision
        try:
            # kept past this call: what the kernel's plan allocates never in a CUDA graph's warm-up pool
            r = outside_graph_pool(lambda: dispatch.resolve(op, *alias, backend=backend), a[first].device)
            ok = r.valid(a, backend, False)
        finally:
            dispatch._recorder.reset(tok)
        if not ok:
            e.calls = None
            return
        # (calls bound before a registry change never hold again)
        calls = e.calls = [c for c in e.calls if c._gen == r._gen][-(CALLS - 1):]
        calls.append(r)

    def call(*args):
        n = len(args)
        if n > nargs:
            backend, a = args[nargs], args[:nargs]
        else:
            backend, a = "", (args if n == nargs else args + defaults[n:])
        w0 = a[first]
        if not isinstance(w0, torch.Tensor) or _dispatch_stack_len() or _single_use():
            return route(*args)
        key = id(w0)
        e = entries.get(key)
        if e is not None and same(e, a, w0):
            if e.calls is None:
                return route(*args)
            for r in e.calls:
                if r.valid(a, backend, False):
                    return r.fn(*a)
            y = route(*args)
            sig = tuple(None if a[i] is None else a[i].shape for i in xidx)
            if sig in e.missed:   # a signature met again: worth a bound call
                e.missed.remove(sig)
                bind(e, a, backend)
            else:
                e.missed = e.missed[-(CALLS - 1):] + [sig]
            return y
        y = route(*args)
        refs = tuple(None if a[i] is None else weakref.ref(a[i]) for i in widx[1:])
        entries[key] = _Entry((weakref.ref(w0, lambda ref, key=key: forget(ref, key)),) + refs,
                              tuple(_state(a[i]) for i in widx))
        return y

    call.__name__ = route.__name__
    return call
