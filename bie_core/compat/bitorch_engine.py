"""BITorch Engine's layer names, constructor arguments and lifecycle
methods, served by bie's layers and dispatcher.

Code written for BITorch Engine switches by changing its import::

    # from bitorch_engine.layers.qlinear.binary.cuda import BinaryLinearCuda
    from bie_core.compat.bitorch_engine import BinaryLinearCuda

Every class here *is* the corresponding bie layer (a subclass), built from
BITorch Engine's constructor arguments:

=====================================  =========================================
BITorch Engine                         bie layer
=====================================  =========================================
BinaryLinearCPP / Cuda / Cutlass       BinaryLinear
BinaryConv2dCPP / Cutlass              BinaryConv2d (padding value -1)
BinaryEmbeddingCuda                    BinaryEmbedding
Q4LinearCutlass / Q8LinearCutlass      QLinear (w4a4 / w8a8)
Q4Conv2dCutlass                        QConv2d (w4a4)
Q4MatMul / BinaryMatMul                QMatMul(bits=4) / BinaryMatMul, on ``x @ y.T``
MPQLinearCuda / MPQLinearMlx           MPQLinear (GPTQ or GreenBit groups)
MBWQLinearCuda                         MBWQLinear
=====================================  =========================================

**The backend in a class name is a preference, not a requirement.** BITorch
Engine users named a backend because that library had no dispatcher; here
bie's automatic selection serves every layer (the best kernel for the tensors'
device), and when the named backend cannot serve the call (not installed, not
loaded, or not serving that device) a ``BieFallbackWarning`` says so, once per
class and device. ``BIE_STRICT=1`` does not turn it into an error: pass
``backend=`` to a bie layer for a strict choice.

Lifecycle methods are kept with bie's meaning: ``prepare_params()`` has nothing
to do (bie prepares kernel layouts lazily, idempotently, in any order of load /
``.to()`` / call); ``generate_quantized_weight(qweight_only=True)`` packs the
layer (``layer.pack()``), ``qweight_only=False`` leaves the float weight (the
inference path needs no separate copy); ``set_weight_data(w)`` copies into the
float weight (trainable, unlike BITorch Engine's frozen n-bit weight);
``set_quantized_weight_data`` is refused (BITorch Engine's packed layouts are
kernel-specific; load a bie checkpoint instead). Helpers
``prepare_bie_layers``, ``pack_bie_layers``, ``save_checkpoint`` and
``load_checkpoint`` keep their signatures. ``docs/integrations.md`` lists what
else differs.
"""
from __future__ import annotations

import enum
import warnings
from typing import Optional

import torch
from torch import nn

from ..errors import BieFallbackWarning
from ..layers import BinaryConv2d, BinaryEmbedding, BinaryLinear, QConv2d, QLinear, pack
from ..layers import BinaryMatMul as _BieBinaryMatMul
from ..layers import QMatMul as _BieQMatMul
from ..layers.weight_only import MBWQLinear, MPQLinear

_warned: set = set()


def _preference_problem(backend: str, device: torch.device) -> Optional[str]:
    from .. import backends
    rec = {r.name: r for r in backends()}.get(backend)
    if rec is None:
        return f"backend '{backend}' is not installed"
    if rec.status != "loaded":
        return f"backend '{backend}' is {rec.status}" + (f" ({rec.cause})" if rec.cause else "")
    if "*" not in rec.devices and device.type not in rec.devices:
        return f"backend '{backend}' does not serve {device.type} tensors (it serves {', '.join(rec.devices)})"
    return None


class _Preference:
    """The backend named in a BITorch Engine class name, as a preference."""

    _prefer = ""

    def _note_preference(self, t: torch.Tensor) -> None:
        key = (type(self).__name__, t.device.type)
        if key in _warned:
            return
        _warned.add(key)
        problem = _preference_problem(self._prefer, t.device)
        if problem:
            warnings.warn(f"bie: {type(self).__name__}: {problem}; bie's automatic backend selection serves "
                          "this layer instead", BieFallbackWarning, stacklevel=3)

    # ------------------------------------------------ BITorch Engine lifecycle
    def prepare_params(self) -> None:
        """Nothing to do: bie prepares kernel layouts lazily (idempotent)."""

    def generate_quantized_weight(self, qweight_only: bool = False) -> None:
        """``qweight_only=True`` packs the layer (drops the float weight)."""
        if qweight_only and hasattr(self, "pack"):
            self.pack()

    def set_weight_data(self, x: torch.Tensor) -> None:
        w = getattr(self, "weight", None)
        if not isinstance(w, torch.Tensor):
            raise RuntimeError(f"{type(self).__name__}.set_weight_data: the layer is packed (no float weight)")
        if tuple(x.shape) != tuple(w.shape):
            raise ValueError(f"{type(self).__name__}.set_weight_data: got shape {tuple(x.shape)}, expected "
                             f"{tuple(w.shape)}")
        with torch.no_grad():
            w.copy_(x)

    def set_quantized_weight_data(self, x: torch.Tensor) -> None:
        raise NotImplementedError(f"{type(self).__name__}.set_quantized_weight_data: BITorch Engine's packed "
                                  "layouts are kernel-specific and are not read; set the float weight "
                                  "(set_weight_data) or load a bie checkpoint (load_checkpoint)")

    @property
    def opt_weight(self) -> torch.Tensor:
        """The float weight while there is one, else the packed weight."""
        w = getattr(self, "weight", None)
        return w if isinstance(w, torch.Tensor) else getattr(self, "qweight", None)


def _forward_with_preference(cls):
    base_forward = cls.forward

    def forward(self, x, *args, **kwargs):
        self._note_preference(x)
        return base_forward(self, x)

    forward.__doc__ = base_forward.__doc__
    cls.forward = forward
    return cls


# ------------------------------------------------------------------ binary linear
class BMM(enum.Enum):
    """BITorch Engine's binary GEMM kernel names (accepted, not used: bie's
    dispatcher chooses the kernel)."""
    BSTC32 = 1
    BTC32 = 2
    ADAPTIVE = 3


class _BinaryLinear(_Preference, BinaryLinear):
    def __init__(self, input_features: int, out_features: int, device=None, dtype=torch.float,
                 symmetric: bool = True, **kwargs):
        super().__init__(input_features, out_features, bias=False, device=device, dtype=dtype)
        self.symmetric = bool(symmetric)
        self.bmm_type = kwargs.pop("bmm_type", BMM.ADAPTIVE)
        if kwargs:
            raise TypeError(f"{type(self).__name__}: unexpected arguments {sorted(kwargs)}")

    def forward(self, x: torch.Tensor, bmm_type=None) -> torch.Tensor:
        self._note_preference(x)
        return BinaryLinear.forward(self, x)


class BinaryLinearCPP(_BinaryLinear):
    """BITorch Engine's ``BinaryLinearCPP(input_features, out_features, device=None)``."""
    _prefer = "cpu"


class BinaryLinearCuda(_BinaryLinear):
    """``BinaryLinearCuda(input_features, out_features, device=None, dtype=torch.float, symmetric=True, *,
    bmm_type=BMM.ADAPTIVE)``."""
    _prefer = "cuda"


class BinaryLinearCutlass(_BinaryLinear):
    """``BinaryLinearCutlass(input_features, out_features, device=None, dtype=torch.float, symmetric=True)``."""
    _prefer = "cutlass"

    def select_gemm_kernel(self, x: torch.Tensor) -> None:
        """Nothing to do: bie's dispatcher picks the kernel for each call."""


# ------------------------------------------------------------------ binary conv
class _BinaryConv2d(_Preference, BinaryConv2d):
    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 device=None, dtype=torch.float, symmetric: bool = True):
        super().__init__(in_channels, out_channels, kernel_size, stride=stride, padding=padding, dilation=dilation,
                         bias=False, pad_value=-1.0, device=device, dtype=dtype)
        self.symmetric = bool(symmetric)


@_forward_with_preference
class BinaryConv2dCPP(_BinaryConv2d):
    """``BinaryConv2dCPP(in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, device=None,
    dtype=torch.float)``."""
    _prefer = "cpu"


@_forward_with_preference
class BinaryConv2dCutlass(_BinaryConv2d):
    """``BinaryConv2dCutlass(in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, device=None,
    dtype=torch.float)``."""
    _prefer = "cutlass"


# ------------------------------------------------------------------ embedding
@_forward_with_preference
class BinaryEmbeddingCuda(_Preference, BinaryEmbedding):
    """``BinaryEmbeddingCuda(*, num_embeddings, embedding_dim, padding_idx=None, dtype=torch.float)``
    (keyword-only, as there; ``padding_idx`` works)."""
    _prefer = "cuda"

    def __init__(self, *, num_embeddings: int, embedding_dim: int, padding_idx=None, dtype=torch.float,
                 device=None):
        super().__init__(num_embeddings, embedding_dim, padding_idx=padding_idx, dtype=dtype, device=device)


# ------------------------------------------------------------------ n-bit QAT
class _QLinear(_Preference, QLinear):
    _bits = 4

    def __init__(self, in_channels: int, out_channels: int, a_bit: int = None, w_bit: int = None, device=None,
                 dtype=torch.float):
        a_bit = self._bits if a_bit is None else a_bit
        w_bit = self._bits if w_bit is None else w_bit
        super().__init__(in_channels, out_channels, w_bits=w_bit, a_bits=a_bit, bias=False, device=device,
                         dtype=dtype)


@_forward_with_preference
class Q4LinearCutlass(_QLinear):
    """``Q4LinearCutlass(in_channels, out_channels, a_bit=4, w_bit=4, device=None, dtype=torch.float)``."""
    _prefer, _bits = "cutlass", 4


@_forward_with_preference
class Q8LinearCutlass(_QLinear):
    """``Q8LinearCutlass(in_channels, out_channels, a_bit=8, w_bit=8, device=None, dtype=torch.float)``
    (output in the input's dtype)."""
    _prefer, _bits = "cutlass", 8


@_forward_with_preference
class Q4Conv2dCutlass(_Preference, QConv2d):
    """``Q4Conv2dCutlass(in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, a_bit=4, w_bit=4,
    device=None, dtype=torch.float)``."""
    _prefer = "cutlass"

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 a_bit: int = 4, w_bit: int = 4, device=None, dtype=torch.float):
        super().__init__(in_channels, out_channels, kernel_size, stride=stride, padding=padding, dilation=dilation,
                         bias=False, w_bits=w_bit, a_bits=a_bit, device=device, dtype=dtype)


# ------------------------------------------------------------------ matmuls
class _TransposedMatMul(_Preference):
    """BITorch Engine's matmuls take ``y (..., n, k)`` and compute ``x @ y.T``."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self._note_preference(x)
        return super().forward(x, y.transpose(-1, -2))


class Q4MatMul(_TransposedMatMul, _BieQMatMul):
    """``Q4MatMul(dtype=torch.float, device=None)``: ``x (..., m, k)``, ``y (..., n, k)`` -> ``(..., m, n)``."""
    _prefer = "cutlass"

    def __init__(self, dtype=torch.float, device=None):
        super().__init__(bits=4, dtype=dtype, device=device)


class BinaryMatMul(_TransposedMatMul, _BieBinaryMatMul):
    """``BinaryMatMul(dtype=torch.float)``: ``x (..., m, k)``, ``y (..., n, k)`` -> ``(..., m, n)``."""
    _prefer = "cutlass"

    def __init__(self, dtype=torch.float, device=None):
        super().__init__(dtype=dtype, device=device)


# ------------------------------------------------------------------ weight-only
def _mpq_group_size(group_size: int, in_channels: int) -> int:
    return -1 if group_size in (-1, in_channels) else group_size


class _MPQLinear(_Preference, MPQLinear):
    def __init__(self, in_channels: int, out_channels: int, a_bit: int = 16, w_bit: int = 4, dtype=torch.half,
                 group_size: int = -1, use_gba_quant: bool = True, dq_group_size: int = -1, dq_mode: int = 2,
                 disable_bias: bool = True, asym: bool = False, requires_grad: bool = True):
        name = type(self).__name__
        if a_bit != 16:
            raise ValueError(f"{name}: a_bit={a_bit!r}; weight-only layers keep 16-bit activations (a_bit=16)")
        if use_gba_quant and asym:
            raise ValueError(f"{name}: use_gba_quant=True with asym=True (GreenBit asymmetric statistics) is not "
                             "supported; use asym=False (GreenBit) or use_gba_quant=False (GPTQ)")
        super().__init__(in_channels, out_channels, bits=w_bit, group_size=_mpq_group_size(group_size, in_channels),
                         sym=not asym, bias=not disable_bias, dtype=dtype,
                         format="gba" if use_gba_quant else "gptq", trainable=requires_grad)
        self.use_gba_quant, self.asym = bool(use_gba_quant), bool(asym)
        self.dq_group_size, self.dq_mode = dq_group_size, dq_mode

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        """Reads BITorch Engine's MPQ state dicts too: GPTQ ``qzeros`` (v1) and
        GreenBit ``qstatistic`` are converted to bie's canonical tensors."""
        if prefix + "qzeros" in state_dict or prefix + "qstatistic" in state_dict:
            try:
                self._convert_bitorch_state(state_dict, prefix)
            except (ValueError, TypeError) as e:
                error_msgs.append(str(e))
                return
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def _convert_bitorch_state(self, sd, prefix) -> None:
        from ..checkpoint.loader import GBA_KEYS, GPTQ_KEYS
        keys = [k for k in dict.fromkeys(GPTQ_KEYS + GBA_KEYS) if prefix + k in sd]
        t = {k: sd.pop(prefix + k) for k in keys}
        bias = t.get("bias") if self.bias is not None else None
        what = f"{type(self).__name__} '{prefix[:-1] or '<root>'}'"
        if "qzeros" in t:
            new = MPQLinear.from_gptq(t["qweight"], t["qzeros"], t["scales"], t.get("g_idx"), bias, bits=self.bits,
                                      group_size=self.group_size, in_features=self.in_features,
                                      checkpoint_format="v1", sym=self.sym, dtype=self.dtype, name=what)
        else:
            gs = self.group_size
            # BITorch Engine decodes qstatistic only for groups of fewer than
            # 256 rows; larger groups keep the float statistics of the file
            decode = gs == -1 or gs < 256 or "scales" not in t
            new = MPQLinear.from_gba(
                t["qweight"], bits=self.bits, group_size=gs, in_features=self.in_features,
                scales=None if decode else t["scales"], zeros=None if decode else t["zeros"],
                qstatistic=t["qstatistic"] if decode else None, qscales_scales=t.get("qscales_scales"),
                qscales_zeros=t.get("qscales_zeros"), qzeros_scales=t.get("qzeros_scales"),
                qzeros_zeros=t.get("qzeros_zeros"), g_idx=t.get("g_idx"), bias=bias, dtype=self.dtype, name=what)
        for k, v in new.state_dict().items():
            sd[prefix + k] = v


@_forward_with_preference
class MPQLinearCuda(_MPQLinear):
    """``MPQLinearCuda(in_channels, out_channels, a_bit=16, w_bit=4, dtype=torch.half, group_size=-1,
    use_gba_quant=True, dq_group_size=-1, dq_mode=2, disable_bias=True, asym=False, requires_grad=True)``."""
    _prefer = "cuda"


@_forward_with_preference
class MPQLinearMlx(_MPQLinear):
    """``MPQLinearMlx``: the MPQLinearCuda arguments, MLX preferred."""
    _prefer = "mlx"


@_forward_with_preference
class MBWQLinearCuda(_Preference, MBWQLinear):
    """``MBWQLinearCuda(in_channels, out_channels, a_bit=16, w_bit=4, dtype=torch.half, group_size=32, ...,
    use_mbw=True, groups=64, rows_packed=64, requires_grad=True)``: one width ``w_bit`` in groups of
    ``group_size`` rows (load a bie MBWQ checkpoint for mixed widths: its ``q_groups`` are adopted)."""
    _prefer = "cuda"

    def __init__(self, in_channels: int, out_channels: int, a_bit: int = 16, w_bit: int = 4, dtype=torch.half,
                 group_size: int = 32, use_gba_quant: bool = True, dq_group_size: int = -1, dq_mode: int = 2,
                 disable_bias: bool = True, asym: bool = False, requires_grad: bool = True, use_mbw: bool = True,
                 groups: int = 64, rows_packed: int = 64):
        if a_bit != 16:
            raise ValueError(f"MBWQLinearCuda: a_bit={a_bit!r}; weight-only layers keep 16-bit activations")
        gs = in_channels if group_size == -1 else group_size
        super().__init__(in_channels, out_channels, bits=w_bit, group_size=gs, bias=not disable_bias, dtype=dtype,
                         trainable=requires_grad)
        self.use_mbw = bool(use_mbw)


# ------------------------------------------------------------------ helpers
def _compat_layers(model: nn.Module):
    return [m for m in model.modules() if isinstance(m, _Preference) and m is not model]


def prepare_bie_layers(model: nn.Module, layers=None) -> None:
    """Call ``prepare_params`` on every compat layer (bie needs no preparation;
    kept so that BITorch Engine code runs unchanged)."""
    for m in _compat_layers(model):
        if layers is None or isinstance(m, tuple(layers)):
            m.prepare_params()


def pack_bie_layers(model: nn.Module, qweight_only: bool = True) -> None:
    """Pack every bie layer for inference (``qweight_only=False``: nothing to do)."""
    if qweight_only:
        pack(model)


def save_checkpoint(model: nn.Module, name: str, qweight_only: bool = True) -> None:
    """``torch.save({'state_dict': model.state_dict()}, name)``, packing first
    when ``qweight_only`` (weight-only layers included)."""
    pack_bie_layers(model, qweight_only)
    torch.save({"state_dict": model.state_dict()}, name)


def load_checkpoint(model: nn.Module, checkpoint_path: str, qweight_only: bool = True) -> nn.Module:
    """Load a checkpoint written by :func:`save_checkpoint` (packing the model
    first when ``qweight_only``). Strict: a missing or unexpected tensor is an
    error naming it."""
    pack_bie_layers(model, qweight_only)
    obj = torch.load(checkpoint_path, map_location="cpu", weights_only=True)
    sd = obj["state_dict"] if isinstance(obj, dict) and "state_dict" in obj else obj
    model.load_state_dict(sd, strict=True)
    return model


__all__ = ["BMM", "BinaryLinearCPP", "BinaryLinearCuda", "BinaryLinearCutlass", "BinaryConv2dCPP",
           "BinaryConv2dCutlass", "BinaryEmbeddingCuda", "Q4LinearCutlass", "Q8LinearCutlass", "Q4Conv2dCutlass",
           "Q4MatMul", "BinaryMatMul", "MPQLinearCuda", "MPQLinearMlx", "MBWQLinearCuda", "prepare_bie_layers",
           "pack_bie_layers", "save_checkpoint", "load_checkpoint"]
