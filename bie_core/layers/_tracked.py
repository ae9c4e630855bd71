"""Layer buffers whose writes through ``.data`` are seen.

Everything a backend derives from a layer's packed tensors (prepared layouts,
bound inference calls, unpacked codes) is kept while each tensor is the same
object at the same version counter. ``t.data`` of a plain tensor is a new
tensor with a version counter of its own, so ``layer.qweight.data.copy_(new)``
would change the values and leave what the caches are keyed on unchanged.

A bie layer therefore holds its buffers as :class:`TrackedTensor`:

* ``t.data`` is a plain tensor that shares ``t``'s storage *and* version
  counter (``t.detach()``): an in-place write through it bumps ``t._version``;
* ``t.data = new`` swaps the storage as for any tensor and then bumps the
  version counter;
* ``__torch_function__`` is disabled: operations on it run exactly as on a
  plain tensor and return plain tensors (no per-op Python hook, and
  ``torch.compile`` traces it as a plain tensor);
* ``t._alias`` is a plain tensor on ``t``'s storage and version counter
  (renewed by ``t.data = new`` and ``t.set_(...)``, the writes that change
  the storage). The bound inference path reads the version there, since a
  plain tensor's attribute read skips the ``__torch_function__`` lookup that
  every tensor subclass pays; code being compiled reads the buffer as its
  alias, since torch.compile's runtime checks refuse tensor subclasses it
  does not know as graph inputs. Being a slot, it travels with the tensor:
  ``torch.utils.swap_tensors`` exchanges only two tensors of the same slots;
* pickling (``torch.save``, ``copy.deepcopy`` of a module, ``state_dict``)
  stores a plain tensor, so no checkpoint ever names this class and
  weights-only loads need nothing registered; the layers wrap their buffers
  again wherever tensors are put in (:class:`TracksBufferWrites`).

Writes that bypass Python entirely (a NumPy view of the storage, DLPack, a
pointer handed to C) still change nothing that is tracked:
``bie_core.invalidate`` covers those (docs/bad-input.md).
"""
from __future__ import annotations

import copy

import torch
from torch import nn

_set_data = torch._C.TensorBase.data.__set__
_set = torch._C.TensorBase.set_
_compiling = torch.compiler.is_compiling
_module_getattr = nn.Module.__getattr__


class TrackedTensor(torch.Tensor):
    """A layer buffer whose ``.data`` writes bump its version counter (see the module doc)."""

    __slots__ = ("_alias",)
    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def data(self) -> torch.Tensor:
        return self.detach()

    @data.setter
    def data(self, new: torch.Tensor) -> None:
        _set_data(self, new)                # keeps this tensor's version counter
        if not self.is_inference():
            torch.autograd.graph.increment_version(self)
        self._alias = self.detach()

    def set_(self, *args, **kwargs):
        _set(self, *args, **kwargs)        # (bumps the version counter: an in-place op)
        self._alias = self.detach()
        return self

    def __reduce_ex__(self, proto):
        return torch.Tensor.__reduce_ex__(_plain(self), proto)

    def __deepcopy__(self, memo):
        new = memo.get(id(self))
        if new is None:   # (copy.deepcopy keeps the temporary plain alias alive: its id stays unique in memo)
            new = memo[id(self)] = track(copy.deepcopy(_plain(self), memo))
        return new

    def module_load(self, other, assign=False):
        # load_state_dict under torch.__future__.set_swap_module_params_on_conversion(True) swaps the buffer
        # with what this returns: a tracked tensor, whose slot travels with it
        return track(super().module_load(other, assign=assign))


def _plain(t: TrackedTensor) -> torch.Tensor:
    p = t.detach()
    if t.requires_grad:
        p.requires_grad_()
    return p


def track(t):
    """``t`` as a :class:`TrackedTensor` on the same storage and version
    counter; anything but a plain tensor (None, a Parameter, another subclass)
    is returned unchanged."""
    if type(t) is not torch.Tensor:
        return t
    w = torch.Tensor._make_subclass(TrackedTensor, t, t.requires_grad)
    w._alias = w.detach()
    return w


def track_buffers(module: nn.Module) -> None:
    """Wrap every plain buffer of ``module`` itself (not its children)."""
    b = module._buffers
    for k, t in b.items():
        if type(t) is torch.Tensor:
            b[k] = track(t)


class TracksBufferWrites:
    """Mixin of the bie layers (before ``nn.Module``): their buffers are
    :class:`TrackedTensor` s, re-wrapped wherever torch puts new tensors in:
    ``register_buffer``, assignment, ``.to()``/``.half()``/``.cuda()``,
    ``load_state_dict`` and unpickling (deepcopy, ``torch.load``). Code being
    compiled reads a buffer's plain alias instead (see the module doc)."""

    def register_buffer(self, name, tensor, persistent: bool = True) -> None:
        super().register_buffer(name, track(tensor), persistent)

    def __setattr__(self, name, value) -> None:
        if type(value) is torch.Tensor and name in self.__dict__.get("_buffers", ()):
            value = track(value)
        super().__setattr__(name, value)

    def __getattr__(self, name):
        # (buffers first, read through self._buffers: cheaper than nn.Module's lookup, and while compiling
        # dynamo then takes the alias for a module buffer, of static shape)
        if name != "_buffers":
            v = self._buffers.get(name)
            if v is not None:
                if type(v) is TrackedTensor and _compiling():
                    return v._alias
                return v
        return _module_getattr(self, name)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        track_buffers(self)
        return self

    def __setstate__(self, state) -> None:
        super().__setstate__(state)
        track_buffers(self)
