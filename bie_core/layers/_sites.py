"""The call-time memo of the compiled QAT ops (``_eval_ops``): per layer weight, the bound calls it was last run with.

A compiled graph hands an op the layer's own tensor objects on every call. Keyed by the identity of the weight
argument (the latent weight or the packed codes), an op finds the value derived from it and its bound call with two
dict lookups and one validity check, where the general path rebuilds a storage-and-view key of each weight tensor
(``dispatch.prepared_cache.derive``) on every call. A memo holds while

* the weight argument is the same object, on the same storage, at the same version (an in-place edit,
  ``load_state_dict``, ``.to()`` or a replaced tensor fail this; an inference tensor is followed by its storage),
* and the bound call's own check holds (``LeanCall.holds``: the registry generation, the backend preference, the
  input's signature, every other tensor the call reads).

Otherwise the op takes the general path, which derives and binds again and renews the memo. A memo refers to its
weight weakly and is dropped (weak reference callback) when the weight object dies, before its id can be reused; it
holds what its bound calls hold, as the prepared cache's entry of the derived value does (the packed codes, the
latent weight of a binary layer: those stay alive with the entry).
"""
from __future__ import annotations

import weakref

from .. import dispatch
from ._lean import tensor_state

#: input shapes whose bound calls a memo keeps (batch sizes alternate a few)
SHAPES = 4

_memos: dict = {}


class Memo:
    """``derived``: what the op computes with in place of the weight (its codes, or (sign bits, sw));
    ``calls``: input shape -> bound call; ``extra``: the op's constant arguments it was made for."""

    __slots__ = ("ref", "state", "derived", "calls", "extra")

    def __init__(self, ref, state, derived, extra):
        self.ref, self.state, self.derived, self.extra, self.calls = ref, state, derived, extra, {}


def find(key: tuple, w, extra=None):
    """The memo kept under ``key`` for weight ``w``, if it still holds for it (and was made for ``extra``)."""
    m = _memos.get(key)
    if m is not None and m.ref() is w and m.extra == extra and m.state == tensor_state(w):
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
        def drop(ref, key=key, memos=_memos):   # (bound here: module globals are gone at interpreter exit)
            cur = memos.get(key)
            if cur is not None and cur.ref is ref:
                del memos[key]
        m = _memos[key] = Memo(weakref.ref(w, drop), tensor_state(w), derived, extra)
    calls = m.calls
    calls.pop(shape, None)
    if len(calls) >= SHAPES:
        calls.pop(next(iter(calls)))
    calls[shape] = lc


dispatch.clear_hooks.append(_memos.clear)
