"""What the weight-only layers (MPQLinear, MBWQLinear) share: the gradient
handle (see ``_wq_fn``), keeping it out of ``state_dict`` and off the memory
bill across ``.to()`` / ``deepcopy``, input checks that name the layer, and
the memory report.
"""
from __future__ import annotations

import weakref
from typing import Optional

import torch
from torch import nn

from ._base import FLOAT_DTYPES, NamedAllocationErrors, _dt, backend_string, check_positive_ints
from ._tracked import TracksBufferWrites
from ._lean import forget, keep, kept, on_input
from ..ops._opdef import _compiling, _dispatch_stack_len, _function_mode, _grad_enabled

_Tensor = torch.Tensor

HANDLE = "weight_handle"
# where the layer keeps its handle object, registered or not (``weight_handle``)
_HELD = "_bie_handle"


def _handle_tensor(k: int, n: int, device) -> torch.Tensor:
    # one float32 scalar seen as (K, N): the gradient it receives is a real
    # (K, N) float32 tensor, the value itself is never used
    return torch.zeros((), dtype=torch.float32, device=device).expand(k, n)


class GradientHandle(nn.Parameter):
    """The (K, N) float32 parameter of a weight-only layer whose *gradient* is
    the weight gradient and whose *value* is one scalar seen as (K, N) (stride
    0, 4 bytes; see ``_wq_fn``).

    ``detach()`` returns an empty tensor: the handle has no value to read or
    to overwrite. That is what lets a stock
    ``torch.nn.parallel.DistributedDataParallel(model)`` wrap these layers:
    its initial broadcast writes every parameter's ``detach()`` in place,
    which PyTorch refuses for a stride-0 tensor, while its reducer all-reduces
    the handle's (K, N) gradient like any other. Autograd, optimizers and
    ``.grad`` use the Parameter itself, not ``detach()``.
    """

    def __new__(cls, data: torch.Tensor, requires_grad: bool = True):
        return torch.Tensor._make_subclass(cls, data, requires_grad)

    def detach(self) -> torch.Tensor:
        return torch.empty(0, dtype=self.dtype, device=self.device)

    def __deepcopy__(self, memo):
        # copied as a fresh 4-byte view, not densely as nn.Parameter would;
        # the layer's copy re-attaches its optimizer hook (__setstate__)
        if id(self) not in memo:
            memo[id(self)] = GradientHandle(_handle_tensor(*self.shape, self.device), self.requires_grad)
        return memo[id(self)]

    def __reduce_ex__(self, proto):
        return (_rebuild_handle, (tuple(self.shape), self.requires_grad))

    def __repr__(self):
        return f"GradientHandle(shape={tuple(self.shape)}, requires_grad={self.requires_grad})"


def _rebuild_handle(shape, requires_grad) -> GradientHandle:
    return GradientHandle(_handle_tensor(*shape, "cpu"), requires_grad)


class WeightOnlyLinear(NamedAllocationErrors, TracksBufferWrites, nn.Module):
    """Base of MPQLinear and MBWQLinear (not used directly)."""

    #: buffers that make up the canonical packed weight (state_dict keys)
    _weight_keys: tuple = ()

    def _setup_common(self, in_features, out_features, dtype, bias, device, backend, trainable):
        name = type(self).__name__
        check_positive_ints(name, in_features=in_features, out_features=out_features)
        if dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name}: dtype must be float16, bfloat16 or float32 (the dtype of scales, zeros and "
                            f"bias), got {dtype}")
        self.in_features, self.out_features, self.dtype = in_features, out_features, dtype
        self.backend = backend_string(backend, f"{name}(backend={backend!r})")
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device)) if bias else None
        self.__dict__[_HELD] = GradientHandle(_handle_tensor(in_features, out_features, device),
                                              requires_grad=bool(trainable))
        self._register_handle()
        self._attach_hook()

    # ------------------------------------------------------- inference path
    _lean = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # eager inference (eager_inference() written out: this runs on every call)
        if (type(x) is _Tensor and not _grad_enabled() and not _compiling() and not _dispatch_stack_len()
                and not _function_mode()):
            if x.dim() >= 1 and x.shape[-1] == self.in_features:
                fixed = self._lean_fixed()
                backend = self.backend or ""
                lc = self._lean
                if lc is None or not lc.holds(x, backend, *fixed):
                    lc = self._rebind(x, fixed, backend)
                return lc.call(x)
        return self._forward(x)

    def _rebind(self, x, fixed, backend):
        """Resolve the kernel for this input signature (the full input checks,
        which raise on bad input, then the dispatcher's whole contract) and keep
        it bound to the prepared weights (see ``_lean``), as a call on inputs of
        ``x``'s shape (``on_input``). The call it makes is the op ``_forward``
        calls without grad, with the same arguments."""
        lc = kept(self, x, backend, fixed)
        if lc is not None:
            return lc
        self._check_input(x)
        self._lean = None
        x2 = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        lc = self._lean = on_input(self._lean_bind(x2, fixed, backend), x, self.out_features, backend, fixed)
        keep(self, x, fixed, lc)   # generation switches back and forth: neither signature resolves again
        return lc

    def _drop_lean(self) -> None:
        """Forget the bound calls (they hold the layer's tensors and their prepared layouts)."""
        forget(self)

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_lean", None)  # bound calls of this process (closures, prepared layouts)
        state.pop("_lean_shapes", None)
        return state

    # ------------------------------------------------------------- the handle
    # Only a trainable layer registers its handle as a parameter. A frozen
    # layer's handle takes no part in autograd, and a registered stride-0
    # parameter is what torch.distributed.fsdp.fully_shard refuses ("FSDP does
    # not support non-contiguous parameters"): unregistered, a frozen packed
    # base needs nothing from stock DDP or FSDP2 (docs/distributed.md).
    @property
    def weight_handle(self) -> GradientHandle:
        """The gradient handle, registered as the parameter ``weight_handle``
        while the layer is trainable."""
        return self.__dict__[_HELD]

    def _register_handle(self) -> None:
        h = self.__dict__[_HELD]
        if h.requires_grad:
            self._parameters[HANDLE] = h
        else:
            self._parameters.pop(HANDLE, None)

    def _attach_hook(self) -> None:
        from ..optim.packed import PackedWeightHook  # late: optim imports nothing from layers
        h = self.__dict__[_HELD]
        h.bie_optimizer_hook = PackedWeightHook(weakref.ref(self))
        h.bie_packed_layer = weakref.ref(self)

    @property
    def trainable(self) -> bool:
        """Whether the packed weight is fine-tuned (its handle requires grad)."""
        return self.__dict__[_HELD].requires_grad

    @trainable.setter
    def trainable(self, value: bool) -> None:
        self.__dict__[_HELD].requires_grad_(bool(value))
        self._register_handle()

    def _apply(self, fn, recurse=True):
        # .to()/.cuda()/.half() would materialise the expanded handle as a dense
        # (K, N) tensor (and cast it): take it out, convert the rest, put back a
        # fresh float32 scalar view on the new device (same Parameter object, so
        # optimizers that hold it keep working).
        h = self.__dict__[_HELD]
        registered = self._parameters.pop(HANDLE, None) is not None
        try:
            super()._apply(fn, recurse)
        finally:
            if registered:
                self._parameters[HANDLE] = h
        self._drop_lean()   # they hold the tensors converted away (and their prepared layouts)
        dev = self.qweight.device
        if h.device != dev or h.stride() != (0, 0):
            h.data = _handle_tensor(self.in_features, self.out_features, dev)
            h.grad = None
        return self

    def __setstate__(self, state):
        # deepcopy/pickle rebuild the handle without its attributes (and, from
        # objects saved as a plain Parameter, densely): a 4-byte view on the
        # layer's device again, same object where it is already a handle
        super().__setstate__(state)
        self._drop_lean()
        h = self.__dict__.get(_HELD)
        if h is None:   # saved with the handle registered only
            h = self._parameters.get(HANDLE)
        if h is not None:
            fresh = _handle_tensor(self.in_features, self.out_features, self.qweight.device)
            if isinstance(h, GradientHandle):
                h.data = fresh
            else:
                h = GradientHandle(fresh, h.requires_grad)
            self.__dict__[_HELD] = h
            self._register_handle()
            self._attach_hook()

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination.pop(prefix + HANDLE, None)   # not part of the canonical format

    # (nn.Module.requires_grad_ reaches a registered handle like any parameter:
    # model.requires_grad_(False) freezes packed weights; only
    # ``trainable = True`` makes them trainable.)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # all or nothing (see _load): the subclass adopts the incoming format and
        # checks every tensor before anything is copied
        from ._load import load_atomically
        if load_atomically(self, self._check_load, state_dict, prefix, local_metadata, strict, missing_keys,
                           unexpected_keys, error_msgs, skip=(HANDLE,)):
            if prefix + HANDLE in missing_keys:   # not part of the canonical format
                missing_keys.remove(prefix + HANDLE)
            self._after_load()

    def _check_load(self, state_dict, prefix) -> list:  # pragma: no cover - abstract
        """Adopt the incoming format; return what is wrong with the incoming tensors."""
        raise NotImplementedError

    def _after_load(self) -> None:
        pass

    # ---------------------------------------------------------------- checks
    def layer_name(self) -> str:
        return f"{type(self).__name__}({self.extra_repr()})"

    def _fail(self, msg: str, exc=ValueError):
        raise exc(f"{self.layer_name()}: {msg}")

    def _check_input(self, x) -> None:
        if not isinstance(x, torch.Tensor):
            self._fail(f"input must be a tensor, got {type(x).__name__}", TypeError)
        if x.dtype not in FLOAT_DTYPES:
            self._fail(f"input has dtype {_dt(x.dtype)}; allowed: float32, float16, bfloat16", TypeError)
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            self._fail(f"input must have shape (..., {self.in_features}), got {tuple(x.shape)}")
        dev = self.qweight.device
        if x.device != dev:
            self._fail(f"input is on {x.device} but the layer's tensors are on {dev}; move one of them "
                       f"(layer.to({str(x.device)!r}) or input.to({str(dev)!r}))")

    def _grad_path(self, x) -> bool:
        if not torch.is_grad_enabled():
            return False
        b = self.bias
        return x.requires_grad or self.trainable or (b is not None and b.requires_grad)

    # ---------------------------------------------------------------- memory
    def nbytes(self) -> int:
        """Bytes held by the layer between steps: packed weight, statistics,
        indices, bias and the 4-byte gradient handle (its storage)."""
        n = 0
        held = [] if HANDLE in self._parameters else [self.__dict__[_HELD]]
        for t in list(self._buffers.values()) + list(self._parameters.values()) + held:
            if t is not None:
                n += t.untyped_storage().nbytes() if t.stride() == (0, 0) and t.dim() == 2 else \
                    t.numel() * t.element_size()
        return n

    def bits_per_weight(self, include_bias: bool = True) -> float:
        """Average storage per weight, in bits (what ``nbytes`` counts)."""
        n = self.nbytes()
        if not include_bias and self.bias is not None:
            n -= self.bias.numel() * self.bias.element_size()
        return 8.0 * n / (self.in_features * self.out_features)

    def _check_weight_state(self, state_dict, prefix, error_msgs, expected: dict) -> bool:
        """Shape/dtype checks of incoming canonical tensors, with messages that
        name the layer, the key, what came and what is expected."""
        ok = True
        for key, (shape, dtypes) in expected.items():
            t = state_dict.get(prefix + key)
            if t is None:
                continue
            if not isinstance(t, torch.Tensor):
                error_msgs.append(f"{self.layer_name()}: {prefix + key} is a {type(t).__name__}, not a tensor")
                ok = False
                continue
            if dtypes is not None and t.dtype not in dtypes:
                error_msgs.append(f"{self.layer_name()}: {prefix + key} has dtype {_dt(t.dtype)}, expected "
                                  f"{' or '.join(_dt(d) for d in dtypes)}")
                ok = False
            if shape is not None and tuple(t.shape) != tuple(shape):
                error_msgs.append(f"{self.layer_name()}: {prefix + key} has shape {tuple(t.shape)}, expected "
                                  f"{tuple(shape)}")
                ok = False
        return ok


def check_finite(layer: WeightOnlyLinear, name: str, t: Optional[torch.Tensor]) -> Optional[str]:
    if t is not None and t.is_floating_point() and not bool(torch.isfinite(t).all()):
        bad = t[~torch.isfinite(t)].flatten()[:4].tolist()
        return f"{layer.layer_name()}: {name} has non-finite values (e.g. {bad}); scales and zeros must be finite"
    return None
