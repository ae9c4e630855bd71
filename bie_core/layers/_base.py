"""What every QAT layer shares: backend choice, input checks that name the
layer, scales initialised from the first batch, and the float <-> packed
state switch used by ``pack()`` and ``load_state_dict``.

Design notes (why it looks like this):

* Scales initialised "from the first batch" must not cost a host sync on every
  forward, so whether a scale is initialised is a *Python* flag on the module
  (``_<name>_ready``), not a tensor test. The flag is set on the first forward
  and by ``load_state_dict`` (a loaded non-zero scale counts as initialised;
  zero is the "not yet initialised" placeholder, and a zero scale could never
  be used anyway since activations are divided by it).
* Non-finite scales are rejected at the only moments a scale changes outside
  an optimizer step: initialisation, loading and packing (one sync each).
* Layers run every forward op through the bie dispatcher
  (``bie_core.ops.<op>(..., backend=self.backend)``); backward passes are plain
  PyTorch on +-1 / integer-valued float tensors, which every device runs.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence, Union

import torch
from torch import nn

from .. import dispatch

from ..ops._common import FLOAT_DTYPES
from ..ops.binary import conv_out_size
from ._tracked import TracksBufferWrites

#: Floor of every initialised scale: an all-zero first batch must not give a
#: zero scale (activations are divided by it). Small enough never to matter for
#: real data, large enough to stay normal in float32.
SCALE_EPS = 1e-8


def _dt(d: torch.dtype) -> str:
    return str(d).replace("torch.", "")


def backend_string(spec: Union[str, Sequence[str], None], source: str) -> Optional[str]:
    """Validate a per-layer ``backend=`` at construction and return the
    comma-joined string the ops take (None: no per-layer choice)."""
    if spec is None or spec == "":
        return None
    if source.endswith("(backend=)"):      # "BinaryLinear(backend=)" -> "BinaryLinear(backend='nope')"
        source = f"{source[:-1]}{spec!r})"
    pref = dispatch.validate_choice(spec, source)
    return ",".join(pref[0])


class NamedAllocationErrors:
    """Mixin: a constructor whose sizes cannot be allocated (``in_features=2**40``)
    raises a ValueError naming the layer and its arguments, not torch's bare
    allocator error."""

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        init = cls.__dict__.get("__init__")
        if init is None or getattr(init, "_names_allocation_errors", False):
            return

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            try:
                init(self, *args, **kwargs)
            except (RuntimeError, MemoryError, OverflowError, ValueError) as e:
                msg = str(e)
                if isinstance(e, RuntimeError) and not any(s in msg for s in _ALLOC_ERRORS):
                    raise
                if isinstance(e, ValueError) and (msg.startswith(cls.__name__) or _TOO_BIG not in msg):
                    raise   # a clear error of this layer, or of another kind
                given = ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()])
                raise ValueError(f"{cls.__name__}({given}): these sizes {_TOO_BIG} "
                                 f"({(msg.splitlines() or [type(e).__name__])[0][:200]})") from e
        __init__._names_allocation_errors = True
        cls.__init__ = __init__


_TOO_BIG = "need more memory than can be allocated"
_ALLOC_ERRORS = ("can't allocate memory", "Storage size calculation overflowed", "out of memory",
                 "exceeds the maximum", "numel")


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def check_dtype(layer: str, dtype) -> None:
    """Layer parameters are floating (latent weights, scales, shifts)."""
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise TypeError(f"{layer}: dtype must be float32, float16 or bfloat16, got {dtype}")


def sgn(t: torch.Tensor) -> torch.Tensor:
    """The sign of docs/spec.md §2, for backward passes: +1 where t >= 0 (so sgn(0) = sgn(-0.0) = +1), else -1.

    Returns float32. Computed as sign(sign(t) + 0.5): three vectorised float
    passes, several times faster on CPU than ``torch.where(t >= 0, 1., -1.)``
    (comparison -> bool -> select). NaN maps to +1 here (the packing ops map it
    to -1); a NaN input poisons the gradient either way.
    """
    return torch.sign(t if t.dtype == torch.float32 else t.float()).add_(0.5).sign_()


def pair(v, name: str, layer: str) -> tuple:
    """nn.Conv2d-style int-or-pair argument -> (a, b) of ints."""
    if isinstance(v, int) and not isinstance(v, bool):
        return (v, v)
    try:
        a, b = v
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in (a, b)):
            raise TypeError
        return (a, b)
    except (TypeError, ValueError):
        raise TypeError(f"{layer}: {name} must be an int or a pair of ints, got {v!r}") from None


def check_positive_ints(layer: str, **sizes) -> None:
    """Raise ValueError naming ``layer`` unless every size given is a positive int (a bool is not one)."""
    for nm, v in sizes.items():
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"{layer}: {nm} must be a positive int, got {v!r}")


def conv2d_geometry(layer: str, in_channels, out_channels, kernel_size, stride, padding, dilation,
                    groups) -> tuple:
    """Check a 2-D convolution's sizes and return ``(kernel_size, stride, padding, dilation)`` as pairs.

    The channel counts and ``groups`` must already be checked positive ints (``check_positive_ints``).
    """
    kernel_size = pair(kernel_size, "kernel_size", layer)
    stride = pair(stride, "stride", layer)
    padding = pair(padding, "padding", layer)
    dilation = pair(dilation, "dilation", layer)
    if min(kernel_size + stride + dilation) <= 0 or min(padding) < 0:
        raise ValueError(f"{layer}: kernel_size, stride and dilation must be > 0 and padding >= 0; got "
                         f"kernel_size={kernel_size}, stride={stride}, padding={padding}, "
                         f"dilation={dilation}")
    if in_channels % groups or out_channels % groups:
        raise ValueError(f"{layer}: groups={groups} must divide in_channels={in_channels} and "
                         f"out_channels={out_channels}")
    return kernel_size, stride, padding, dilation


def layer_constant(name: str, check) -> property:
    """A layer constant that the layer's bound inference calls and derived weights are made from (a conv's stride, a
    bit width): kept in the instance dict as ``_<name>``. Setting it checks the value (``check(layer, value)``
    returns it normalised, or raises naming the layer) and drops those calls and derived forms, so that the next
    call binds with the new value: ``nn.Conv2d`` reads its stride on every call, and a call bound before the change
    would go on computing with the old one. A class lists its constants in ``_constants``."""
    slot = "_" + name

    def get(layer):
        return layer.__dict__[slot]

    def set_(layer, value):
        value = check(layer, value)
        d = layer.__dict__
        changed = slot in d and d[slot] != value
        d[slot] = value
        if changed:
            layer._forget_derived()

    return property(get, set_, doc=f"``{name}`` (setting it drops what was bound or derived with the old value)")


def conv_pair(name: str, least: int):
    """The check of a conv geometry constant: an int or a pair of ints, each at least ``least``."""
    def check(layer, value):
        try:
            v = pair(value, name, "")
        except TypeError:
            layer._fail(f"{name} must be an int or a pair of ints, got {value!r}", TypeError)
        if min(v) < least:
            layer._fail(f"{name} must be {'>= 0' if least == 0 else '> 0'}, got {v}")
        return v
    return check


def _per_channel(layer, value):
    """``per_channel`` may change only with a weight scale of the new shape (``fold_batchnorm`` makes a packed conv's
    scale per channel, then sets it); a layer that derives its scale from the latent weight has none stored."""
    v = bool(value)
    if "_per_channel" in layer.__dict__ and v != layer.per_channel:
        ws = layer._parameters.get("weight_scale")
        if ws is None:
            ws = layer._buffers.get("weight_scale")
        want = (layer._weight_shape[0],) if v else ()
        if ws is not None and tuple(ws.shape) != want:
            layer._fail(f"per_channel={value!r} needs a weight_scale of shape {want}, and it has shape "
                        f"{tuple(ws.shape)}")
    return v


#: per-tensor or per-channel weight scale, a layer constant (a binary layer derives it from the latent weight with the
#: new choice on the next call)
per_channel_constant = layer_constant("per_channel", _per_channel)


class ConvGeometry:
    """A conv QAT layer's stride, padding and dilation as layer constants (``layer_constant``): set after
    construction, they take effect on the next call, as ``nn.Conv2d``'s do."""

    stride = layer_constant("stride", conv_pair("stride", 1))
    padding = layer_constant("padding", conv_pair("padding", 0))
    dilation = layer_constant("dilation", conv_pair("dilation", 1))


@dataclass
class PackReport:
    """What ``pack()`` did: bytes of the layer's tensors before and after."""

    layer: str
    bytes_before: int
    bytes_after: int

    @property
    def bytes_saved(self) -> int:
        return self.bytes_before - self.bytes_after

    def __add__(self, other: "PackReport") -> "PackReport":
        return PackReport("total", self.bytes_before + other.bytes_before, self.bytes_after + other.bytes_after)

    def __str__(self):
        return (f"{self.layer}: {self.bytes_before} -> {self.bytes_after} bytes "
                f"(saved {self.bytes_saved}, {self.bytes_before / max(1, self.bytes_after):.1f}x smaller)")


def tensor_bytes(module: nn.Module) -> int:
    """Bytes of the module's own parameters and buffers (no children) that it saves: a non-persistent buffer (a
    packed layer's unpacked codes, derived from its packed ones) is not counted."""
    skip = module._non_persistent_buffers_set
    n = 0
    for t in list(module._parameters.values()) + [t for k, t in module._buffers.items() if k not in skip]:
        if t is not None:
            n += t.numel() * t.element_size()
    return n


class TorchInit:
    """``reset_parameters`` of the weighted QAT layers: the latent weight and the bias
    initialised as ``nn.Linear`` / ``nn.Conv2d`` do (fan-in from ``_weight_shape``),
    the activation shift zeroed, the scales re-initialised on the next forward."""

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(math.prod(self._weight_shape[1:]))
            nn.init.uniform_(self.bias, -bound, bound)
        with torch.no_grad():
            self.act_shift.zero_()
        self.reset_scales()


class QATLayer(NamedAllocationErrors, TracksBufferWrites, nn.Module):
    """Base of the bie QAT layers (not used directly)."""

    #: Parameters that are latent float weights of binary layers: DiodeMix
    #: updates them by sign flips (tagged ``p.bie_binary = True``).
    _binary_params: tuple = ()
    #: Lazily initialised scale parameters.
    _lazy_scales: tuple = ()
    #: (packed key, allowed dtypes) of the packed form; empty if the layer has none.
    _packed_keys: tuple = ()
    #: the layer constants (``layer_constant``) of the class
    _constants: tuple = ()

    def _setup(self, backend) -> None:
        self.backend = backend_string(backend, f"{type(self).__name__}(backend={backend!r})")
        for name in self._lazy_scales:
            setattr(self, f"_{name}_ready", False)

    # ------------------------------------------------------------------ naming
    def layer_name(self) -> str:
        return f"{type(self).__name__}({self.extra_repr()})"

    def _fail(self, msg: str, exc=ValueError):
        raise exc(f"{self.layer_name()}: {msg}")

    # ------------------------------------------------------------ input checks
    def _check_float_input(self, x, what: str = "input") -> None:
        if not isinstance(x, torch.Tensor):
            self._fail(f"{what} must be a tensor, got {type(x).__name__}", TypeError)
        if x.dtype not in FLOAT_DTYPES:
            self._fail(f"{what} has dtype {_dt(x.dtype)}; allowed: float32, float16, bfloat16", TypeError)
        dev = self._device()
        if dev is not None and x.device != dev:
            self._fail(f"{what} is on {x.device} but the layer's tensors are on {dev}; "
                       f"move one of them (layer.to({str(x.device)!r}) or {what}.to({str(dev)!r}))")

    def _conv2d_geometry_repr(self) -> str:
        """A conv layer's channels, kernel and stride, then padding, dilation and groups where not the default."""
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0, 0):
            s += f", padding={self.padding}"
        if self.dilation != (1, 1):
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        return s

    def _batched_conv2d_input(self, x) -> tuple:
        """Check a conv layer's input (C, H, W) or (N, C, H, W); return it 4-D and whether it was unbatched."""
        self._check_float_input(x)
        if x.dim() not in (3, 4):
            self._fail(f"input must be 4-D (N, C, H, W) or 3-D (C, H, W), got shape {tuple(x.shape)}")
        unbatched = x.dim() == 3
        if unbatched:
            x = x.unsqueeze(0)
        if x.shape[1] != self.in_channels:
            self._fail(f"input of shape {tuple(x.shape)} has {x.shape[1]} channels; expected {self.in_channels} "
                       "(NCHW layout; channels_last memory format is accepted)")
        ho = conv_out_size(x.shape[2], self.kernel_size[0], self.stride[0], self.padding[0], self.dilation[0])
        wo = conv_out_size(x.shape[3], self.kernel_size[1], self.stride[1], self.padding[1], self.dilation[1])
        if ho <= 0 or wo <= 0:
            self._fail(f"input of spatial size {tuple(x.shape[2:])} is too small for the kernel "
                       f"(output would be {ho}x{wo})")
        return x, unbatched

    def _device(self) -> Optional[torch.device]:
        t = self._parameters.get("act_shift")  # every layer with an input shift: one lookup on the hot path
        if t is not None:
            return t.device
        for t in self._parameters.values():
            if t is not None:
                return t.device
        for t in self._buffers.values():
            if t is not None:
                return t.device
        return None

    # ------------------------------------------------------------ lazy scales
    def _init_scale(self, name: str, value: torch.Tensor, source: str) -> None:
        """Set scale ``name`` to ``value`` (first forward only)."""
        p = getattr(self, name)
        with torch.no_grad():
            v = value.detach().to(torch.float32)
            if not torch.compiler.is_compiling() and _distributed():
                # Under DDP every rank sees a different first batch, and DDP only
                # broadcasts parameters at wrap time: average the initial scale so
                # that the replicas stay identical (one collective, first forward only).
                v = v.clone()
                torch.distributed.all_reduce(v)
                v /= torch.distributed.get_world_size()
            if not torch.compiler.is_compiling() and not bool(torch.isfinite(v).all()):
                self._fail(f"{name} initialised from {source} is not finite ({v.flatten()[:4].tolist()}); "
                           f"{source} is empty or contains inf or NaN", ValueError)
            p.copy_(v.clamp_min(SCALE_EPS).to(p.dtype).reshape(p.shape))
        setattr(self, f"_{name}_ready", True)

    def reset_scales(self) -> None:
        """Forget the learned/initialised scales: the next forward initialises
        them again from its batch (and, for weight scales, from the weight)."""
        with torch.no_grad():
            for name in self._lazy_scales:
                getattr(self, name).zero_()
                setattr(self, f"_{name}_ready", False)

    def _check_scales_finite(self) -> None:
        for name in self._lazy_scales + ("weight_scale",):
            t = getattr(self, name, None)
            if isinstance(t, torch.Tensor) and not bool(torch.isfinite(t).all()):
                self._fail(f"{name} is not finite ({t.flatten()[:4].tolist()}); scales must be finite and > 0")

    # -------------------------------------------------------------- packing
    @property
    def packed(self) -> bool:
        """True once the float weight has been replaced by its packed form."""
        return bool(self._packed_keys) and self._packed_keys[0][0] in self._buffers

    def pack(self) -> PackReport:
        """Replace the latent float weight by the canonical packed form (docs/spec.md §2).

        Inference gives exactly the same outputs before and after; the layer can
        no longer train its weight (activation scales/shifts stay parameters).
        Idempotent: packing a packed layer changes nothing and saves 0 bytes.
        """
        name, before = self.layer_name(), tensor_bytes(self)
        if self._packed_keys and not self.packed:  # layers without weights have nothing to pack
            w = self.weight.detach()
            if not bool(torch.isfinite(w).all()):
                bad = w[~torch.isfinite(w)]
                self._fail(f"the latent weight has {bad.numel()} non-finite values (e.g. {bad[:4].tolist()}); "
                           "packing stores signs and scales of finite weights only (fix or re-initialise the "
                           "weight first)")
            self._check_scales_finite()
            self._do_pack()
        return PackReport(name, before, tensor_bytes(self))

    def packed_nbytes(self) -> int:
        """Bytes this layer's tensors take once packed (without packing it)."""
        if self.packed or not self._packed_keys:
            return tensor_bytes(self)
        return tensor_bytes(self) - self.weight.numel() * self.weight.element_size() + self._packed_weight_nbytes()

    def _do_pack(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _packed_weight_nbytes(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def _empty_packed(self, device) -> None:  # pragma: no cover - abstract
        """Switch to the packed form with uninitialised buffers (for loading)."""
        raise NotImplementedError

    def _empty_float(self, device) -> None:  # pragma: no cover - abstract
        """Switch back to the float form with an uninitialised weight (for loading)."""
        raise NotImplementedError

    def _drop_weight(self) -> None:
        # Keep the attribute (as None, like nn.Linear(bias=False).bias) so code
        # that reads layer.weight sees "no float weight" instead of AttributeError.
        del self._parameters["weight"]
        self.register_parameter("weight", None)
        self._forget_derived()

    def _drop_packed(self) -> None:
        for key, _ in self._packed_keys:
            self._buffers.pop(key, None)
        self._forget_derived()

    def _forget_derived(self) -> None:
        """Drop the per-call caches (bound calls, signs or codes derived from the weight): they hold the tensors
        they were made from, so after a ``pack()``, a switch of form on load or a move they would keep the replaced
        weight alive (the float weight a ``pack()`` is meant to free)."""
        for name in self._transient:
            self.__dict__[name] = None

    # --------------------------------------------------------------- loading
    def adopt_format(self, state_dict, prefix: str = "") -> list:
        """Switch this layer to the form (float or packed) that ``state_dict``
        holds for it, so loading works whichever form either side is in.
        Returns problems found (dtype of packed tensors), as messages."""
        if not self._packed_keys:
            return []
        first = prefix + self._packed_keys[0][0]
        dev = self._device() or torch.device("cpu")
        if first in state_dict and not self.packed:
            self._empty_packed(dev)
        elif prefix + "weight" in state_dict and first not in state_dict and self.packed:
            self._empty_float(dev)
        errors = []
        for key, dtypes in self._packed_keys:
            t = state_dict.get(prefix + key)
            if isinstance(t, torch.Tensor) and t.dtype not in dtypes:
                errors.append(f"{self.layer_name()}: {prefix + key} has dtype {_dt(t.dtype)}, "
                              f"expected {' or '.join(_dt(d) for d in dtypes)}")
        return errors

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        # Order-free preparation: a checkpoint in packed form loads into a float
        # layer (and the reverse) by switching this layer's form first; all or
        # nothing (see _load): a refused load leaves the layer as it was.
        from ._load import load_atomically
        if load_atomically(self, self._check_load, state_dict, prefix, local_metadata, strict, missing_keys,
                           unexpected_keys, error_msgs):
            for name in self._lazy_scales:
                t = state_dict.get(prefix + name)
                if isinstance(t, torch.Tensor):
                    # zero is the "not initialised yet" placeholder (see module doc)
                    setattr(self, f"_{name}_ready", bool((t != 0).all()))

    def _check_load(self, state_dict, prefix) -> list:
        errors = self.adopt_format(state_dict, prefix)
        if errors:
            return errors
        for name in self._lazy_scales + ("weight_scale",):
            t = state_dict.get(prefix + name)
            if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
                return [f"{self.layer_name()}: {prefix + name} is not finite "
                        f"({t.flatten()[:4].tolist()}); scales must be finite"]
        return []

    #: attributes holding per-call caches (resolved kernels, derived weights):
    #: never pickled or deep-copied (they hold locks and tensors of this process)
    _transient: tuple = ()

    def _derived(self, slot: str, sources: tuple, build):
        """``build()``, a value derived from the layer tensors ``sources`` (the
        codes or sign bits of a latent weight), computed once per version of
        them: kept while every source is the same object on the same storage at
        the same version counter, so an in-place update, an optimizer step,
        ``load_state_dict``, ``.to()`` or a dtype change derives it again.
        An inference tensor has no version counter and cannot be changed in
        place outside inference mode: it is followed by its storage alone (as
        the dispatcher's prepared layouts are)."""
        state = []
        for t in sources:
            if t is None:
                state.append(None)
                continue
            try:
                state.append((t.data_ptr(), t._version))
            except RuntimeError:
                state.append((t.data_ptr(), None))
        c = self.__dict__.get(slot)
        if c is not None and c[1] == state and all(a is b for a, b in zip(c[0], sources)):
            return c[2]
        v = build()
        self.__dict__[slot] = (tuple(sources), state, v)
        return v

    def _apply(self, fn, recurse=True):
        # .to()/.half()/.cuda() replace the tensors: drop what was bound to or derived from the
        # old ones now, rather than keep them alive until the next forward notices
        super()._apply(fn, recurse)
        self._forget_derived()
        return self

    def __getstate__(self):
        state = super().__getstate__()
        for name in self._transient:
            if name in state:
                state[name] = None
        return state

    # ----------------------------------------------------------------- tags
    def _tag_params(self) -> None:
        for name in self._binary_params:
            p = self._parameters.get(name)
            if p is not None:
                p.bie_binary = True

    def __setstate__(self, state):
        # copy.deepcopy and pickle rebuild Parameters without their attributes:
        # put the binary tag back.
        super().__setstate__(state)
        for name in self._transient:  # (pickles from before these caches existed)
            self.__dict__.setdefault(name, None)
        for name in self._constants:  # (pickles from before these were layer constants: the plain attribute)
            if name in self.__dict__:
                self.__dict__["_" + name] = self.__dict__.pop(name)
        self._tag_params()


def lsq_init(mean_abs: torch.Tensor, bits: int) -> torch.Tensor:
    """LSQ step-size initialisation ``2 * mean|v| / sqrt(Qp)``, ``Qp = 2^(b-1) - 1``
    (Esser et al. 2020). For 8 bits: 2/sqrt(127) = 0.1775; 4 bits: 2/sqrt(7) = 0.7559."""
    return 2.0 * mean_abs / math.sqrt((1 << (bits - 1)) - 1)


def binary_init(mean_abs: torch.Tensor) -> torch.Tensor:
    """Binary activation clip scale ``2 * mean|v|`` (docs/spec.md §3)."""
    return 2.0 * mean_abs


def iter_qat_layers(model: nn.Module) -> Iterable[tuple[str, QATLayer]]:
    for name, m in model.named_modules():
        if isinstance(m, QATLayer):
            yield name, m
