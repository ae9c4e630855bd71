"""The call-time memo of the compiled QAT ops (``_eval_ops``): per layer weight, the bound calls it was last run with.

A compiled graph hands an op the layer's own tensor objects on every call. Kept on the weight argument itself (the
latent weight or the packed codes), an op finds the value derived from it and its bound call with two dict lookups
and one validity check, where the general path rebuilds a storage-and-view key of each weight tensor
(``dispatch.prepared_cache.derive``) on every call. A memo holds while

* it was made for this weight state: the same storage at the same version (an in-place edit, ``load_state_dict``,
  ``.to()`` or a replaced tensor fail this; an inference tensor is followed by its storage),
* no cache was cleared since (``bie_core.invalidate``, ``dispatch.clear_caches``),
* and the bound call's own check holds (``LeanCall.holds``: the registry generation, the backend preference, the
  input's signature, every other tensor the call reads).

Otherwise the op takes the general path, which derives and binds again and renews the memo.

Why on the tensor: a packed layer's bound call must hold its codes, which are the weight argument. In a global
table keyed by the weight, the entry would keep its own key alive, and a deleted model's codes would never be freed.
On the tensor, the memo and the tensor form a reference cycle that the garbage collector frees with the model. The
memos are not copied with the tensor (``copy.deepcopy``, pickling): they hold the original's bound calls.
"""
from __future__ import annotations

import torch

from .. import dispatch
from ._lean import tensor_state

#: input shapes whose bound calls a memo keeps (batch sizes alternate a few)
SHAPES = 4

#: the tensor attribute the memos live in
ATTR = "_bie_eval_memos"

#: bumped by dispatch.clear_caches: memos made before it no longer hold
_generation = [0]


class Memos(dict):
    """A tensor's memos, by op key; empty in a copy of the tensor (a pickled ``nn.Parameter`` carries its
    ``__dict__``: this class is allowed for ``torch.load(weights_only=True)``)."""

    __slots__ = ()

    def __deepcopy__(self, memo):
        return Memos()

    def __reduce__(self):
        return (Memos, ())


torch.serialization.add_safe_globals([Memos])


class Memo:
    """``derived``: what the op computes with in place of the weight (its codes, or (sign bits, sw));
    ``calls``: input shape -> bound call; ``extra``: the op's constant arguments it was made for."""

    __slots__ = ("generation", "state", "derived", "calls", "extra")

    def __init__(self, state, derived, extra):
        self.generation, self.state, self.derived, self.extra, self.calls = _generation[0], state, derived, extra, {}


def find(key: tuple, w, extra=None):
    """The memo kept under ``key`` on weight ``w``, if it still holds for it (and was made for ``extra``)."""
    d = w.__dict__.get(ATTR)
    m = d.get(key) if d is not None else None
    if (m is not None and m.generation == _generation[0] and m.extra == extra and m.state == tensor_state(w)):
        return m
    return None


def keep(key: tuple, w, derived, shape, lc, extra=None) -> None:
    """Keep the bound call ``lc`` for input ``shape`` in the memo of ``w`` under ``key`` (a new memo where the one
    kept there is not for this weight state). Nothing is kept while a CUDA graph is being captured: what a call
    derives then lives in the graph's memory (dispatch.prepared_cache keeps nothing then either)."""
    if dispatch._capturing(w.device):
        return
    m = find(key, w, extra)
    if m is None or m.derived is not derived:
        d = w.__dict__.get(ATTR)
        if d is None:
            d = w.__dict__[ATTR] = Memos()
        m = d[key] = Memo(tensor_state(w), derived, extra)
    calls = m.calls
    calls.pop(shape, None)
    if len(calls) >= SHAPES:
        calls.pop(next(iter(calls)))
    calls[shape] = lc


def calls_on(t, op: str) -> dict:
    """The bound calls (input signature -> call) an op keeps for the packed weight ``t``, on ``t`` itself (the calls
    hold ``t``: see the module doc)."""
    d = t.__dict__.get(ATTR)
    if d is None:
        d = t.__dict__[ATTR] = Memos()
    key = ("calls", op, _generation[0])
    calls = d.get(key)
    if calls is None:
        for k in [k for k in d if k[0] == "calls" and k[1] == op]:   # (those of a cleared generation)
            del d[k]
        calls = d[key] = {}
    return calls


def clear() -> None:
    _generation[0] += 1


dispatch.clear_hooks.append(clear)
