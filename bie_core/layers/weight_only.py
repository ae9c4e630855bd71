"""Weight-only quantized linear layers: MPQLinear (GPTQ / GBA groups) and
MBWQLinear (exl2-style mixed bit widths). docs/spec.md §2-4.

Math layout: ``y = x @ W (+ bias)`` with ``W`` (in_features K, out_features N),
as GPTQ stores it (an ``nn.Linear`` weight is ``W.T``).

Canonical state_dict of MPQLinear (the same whichever backend runs it):

* ``qweight`` int32 ``(ceil(K*b/32), N)``: codes packed along K (``bie_core.ops.weight_only``);
* ``scales`` ``(G, N)`` in the layer dtype;
* ``zeros``: int32 ``(G, ceil(N*b/32))`` packed integer zero points for GPTQ
  (``W = s*(q - z)``), or float ``(G, N)`` for GBA (``W = q*s - z``); the
  dtype says which, so a GBA checkpoint loads into a GPTQ layer and back;
* ``g_idx`` int32 ``(K,)`` (group of each input row; act-order when not
  ``k // group_size``); ``bias`` ``(N,)`` if any.

**Zero-point convention: "v2" (the stored value is the zero point).**
Published GPTQ checkpoints mostly store ``z - 1`` ("v1"), which cannot
represent ``z = 0`` (it wraps to ``2^b - 1``, which v1 kernels read as
``2^b``), and every kernel pays a ``+1``. v2 represents every zero in
``[0, 2^b - 1]`` and is the formula itself. Ecosystem checkpoints are
converted once, at load (``from_gptq(checkpoint_format=...)``,
``bie_core.load_quantized``), and exported back with ``to_gptq()``. To make a
silent off-by-one impossible, the canonical key is ``zeros``, never
``qzeros``: a raw ecosystem state_dict given to ``load_state_dict`` is
refused with a message pointing to the converting loaders.

Training (docs/spec.md §4): with ``trainable=True`` the layer's ``weight_handle`` (a
4-byte float32 parameter seen as (K, N)) receives ``x.T @ g`` as its
gradient, and its ``bie_optimizer_hook`` (``bie_core.optim.packed``) applies
Adam to the dequantized weight and writes new codes in place. See
``_wq_fn`` for why, and ``docs/weight-only.md``.
"""
from __future__ import annotations

import warnings
from typing import Mapping, Optional, Sequence, Union

import torch
from torch import nn

from .. import ops
from ..ops.weight_only import FORMATS, MBWQ_BITS, WQ_BITS, mbwq_packed_rows, num_groups, packed_rows
from ..quantize.rtn import group_index, rtn_stats, stats_from_range
from ._base import FLOAT_DTYPES, _dt
from ._lean import bind_one
from ._wq_base import WeightOnlyLinear, check_finite
from ._wq_fn import MBWQLinearFn, WQLinearFn

#: Group sizes MPQLinear accepts (-1: one group per output column).
GROUP_SIZES = (-1, 16, 32, 64, 128, 256, 512, 1024)
CHECKPOINT_FORMATS = ("v1", "v2")


def _check_choice(layer: str, name: str, v, allowed) -> None:
    if isinstance(v, bool) or v not in allowed:
        raise ValueError(f"{layer}: {name}={v!r} is not supported; allowed: {list(allowed)}")


#: what to do with v1 zero points that overflow (see v1_to_v2_zeros)
ON_OVERFLOW = ("wrap", "error")


def v1_to_v2_zeros(z_stored: torch.Tensor, bits: int, on_overflow: str = "wrap", what: str = "qzeros") -> torch.Tensor:
    """Zero points from v1 stored values (``z - 1``), unpacked int codes.

    A v1 writer stores ``(z - 1) & mask``, so ``z = 0`` is stored as
    ``2^b - 1``, which reads back as ``2^b``, a value no b-bit zero can hold
    (v1 kernels compute with it, shifting that whole group by one step). We
    take ``z = (stored + 1) mod 2^b`` (= 0, what the quantizer that wrote
    the file computed) and warn; ``on_overflow="error"`` raises instead.
    """
    if on_overflow not in ON_OVERFLOW:
        raise ValueError(f"{what}: on_overflow={on_overflow!r}; allowed: {list(ON_OVERFLOW)}")
    maxq = (1 << bits) - 1
    over = z_stored == maxq
    n_over = int(over.sum())
    if n_over:
        msg = (f"{what}: {n_over} zero point(s) are stored as {maxq} in a v1 checkpoint, i.e. z = {maxq + 1}, which "
               f"a {bits}-bit zero cannot hold (a v1 writer's z = 0 wraps this way); reading them as z = 0")
        if on_overflow == "error":
            raise ValueError(msg.replace("; reading them as z = 0", "") + " (pass on_overflow='wrap' to accept)")
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
    return (z_stored + 1) & maxq


def _float_source(linear, name: str, dtype) -> tuple:
    """What from_float quantizes: (the layer dtype: ``dtype``, else the linear's float dtype, else float16;
    the linear's weight as (K, N) float32), after checking it is an ``nn.Linear`` with a finite weight."""
    if not isinstance(linear, nn.Linear):
        raise TypeError(f"{name}: expects an nn.Linear, got {type(linear).__name__}")
    dtype = dtype or (linear.weight.dtype if linear.weight.dtype in FLOAT_DTYPES else torch.float16)
    w = linear.weight.detach().t().to(torch.float32)
    if not bool(torch.isfinite(w).all()):
        raise ValueError(f"{name}: the weight has non-finite values")
    return dtype, w


def _copy_bias(layer, linear) -> None:
    if linear.bias is not None:
        layer.bias.copy_(linear.bias.detach())


def _load_tensors(layer, qweight, scales, zeros, g_idx, bias):
    """``layer`` with checkpoint tensors loaded (no g_idx: the layer's own, the identity order)."""
    sd = {"qweight": qweight, "scales": scales, "zeros": zeros,
          "g_idx": g_idx if g_idx is not None else layer.g_idx}
    if bias is not None:
        sd["bias"] = bias
    layer.load_state_dict(sd)
    return layer


class MPQLinear(WeightOnlyLinear):
    """Weight-only quantized linear layer, GPTQ or GreenBit (GBA) groups.

    Args:
        in_features, out_features: K and N.
        bits: 1, 2, 3, 4 or 8.
        group_size: rows per group: 16 ... 1024 (powers of two) or -1 (one group).
        sym: symmetric quantization (used by ``from_float`` and recorded for export).
        act_order: expect a non-trivial ``g_idx`` (act-order); the loaded
            ``g_idx`` decides in the end (``layer.act_order``).
        bias: whether the layer has a bias (in ``dtype``).
        dtype: dtype of scales, float zeros and bias (float16, bfloat16, float32).
            Activations may be any of the three whatever this is.
        format: "gptq" (integer zeros) or "gba" (float zeros).
        backend: per-layer backend choice (docs/spec.md §1).
        trainable: fine-tune the packed weight (see module doc).

    A freshly constructed layer has all codes, zeros and bias 0 (W = 0); fill
    it with ``load_state_dict``, ``from_gptq``, ``from_gba`` or ``from_float``.
    """

    def __init__(self, in_features: int, out_features: int, bits: int = 4, group_size: int = 128,
                 sym: bool = False, act_order: bool = False, bias: bool = False, dtype=torch.float16,
                 format: str = "gptq", device=None, backend=None, trainable: bool = False):
        super().__init__()
        name = type(self).__name__
        _check_choice(name, "bits", bits, WQ_BITS)
        _check_choice(name, "group_size", group_size, GROUP_SIZES)
        _check_choice(name, "format", format, FORMATS)
        self.bits, self.group_size, self.sym, self.format = bits, group_size, bool(sym), format
        self.act_order = bool(act_order)
        self._setup_common(in_features, out_features, dtype, bias, device, backend, trainable)
        k, n = in_features, out_features
        g = num_groups(k, group_size)
        self.register_buffer("qweight", torch.zeros((packed_rows(k, bits), n), dtype=torch.int32, device=device))
        self.register_buffer("scales", torch.ones((g, n), dtype=dtype, device=device))
        self.register_buffer("zeros", self._empty_zeros(format, device))
        self.register_buffer("g_idx", group_index(k, group_size, None, device).to(torch.int32))

    def _empty_zeros(self, fmt: str, device) -> torch.Tensor:
        g, n = num_groups(self.in_features, self.group_size), self.out_features
        if fmt == "gptq":
            return torch.zeros((g, packed_rows(n, self.bits)), dtype=torch.int32, device=device)
        return torch.zeros((g, n), dtype=self.dtype, device=device)

    def extra_repr(self) -> str:
        s = (f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}, "
             f"group_size={self.group_size}, format={self.format}")
        if self.act_order:
            s += ", act_order=True"
        if self.sym:
            s += ", sym=True"
        if self.bias is not None:
            s += ", bias=True"
        if self.trainable:
            s += ", trainable=True"
        return s

    @property
    def num_groups(self) -> int:
        return num_groups(self.in_features, self.group_size)

    def _g_idx_arg(self) -> Optional[torch.Tensor]:
        return self.g_idx if self.act_order else None

    def _refresh_act_order(self) -> None:
        trivial = group_index(self.in_features, self.group_size, None, self.g_idx.device)
        self.act_order = not torch.equal(self.g_idx.to(torch.long), trivial)

    # ---------------------------------------------------------------- forward
    def _lean_fixed(self) -> tuple:
        b = self._buffers
        return (b["qweight"], b["scales"], b["zeros"], b["g_idx"] if self.act_order else None,
                self._parameters.get("bias"))

    def _lean_bind(self, x2, fixed, backend):
        qw, s, z, gi, bias = fixed
        return bind_one(ops.wq_gemm, (x2, qw, s, z, gi, bias, self.bits, self.group_size, self.format), backend,
                        fixed)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        x2 = x.reshape(-1, self.in_features)
        args = (self.qweight, self.scales, self.zeros, self._g_idx_arg())
        if self._grad_path(x):
            y = WQLinearFn.apply(x2, self.weight_handle, self.bias, *args, self.bits, self.group_size,
                                 self.format, self.backend or "")
        else:
            y = ops.wq_gemm(x2, *args, self.bias, self.bits, self.group_size, self.format, backend=self.backend)
        return y.reshape(tuple(x.shape[:-1]) + (self.out_features,))

    # ------------------------------------------- weight access (optimizer, export)
    def dequantize(self, dtype=torch.float32) -> torch.Tensor:
        """The (K, N) weight ``W`` (``y = x @ W``), computed on demand."""
        return ops.wq_dequantize(self.qweight, self.scales, self.zeros, self._g_idx_arg(), self.bits,
                                 self.group_size, self.in_features, self.format, dtype, backend=self.backend)

    def _row_groups(self) -> torch.Tensor:
        return self.g_idx.to(torch.long)

    def quant_step(self) -> torch.Tensor:
        """(K, N) float32: the weight change of one code step at each position."""
        return self.scales.to(torch.float32)[self._row_groups()]

    @torch.no_grad()
    def requantize_(self, w: torch.Tensor) -> None:
        """Write the nearest codes of ``w`` (K, N) into ``qweight`` in place (statistics unchanged)."""
        new = ops.wq_quantize(w, self.scales, self.zeros, self._g_idx_arg(), self.bits, self.group_size,
                              self.format, backend=self.backend)
        self.qweight.copy_(new)

    @torch.no_grad()
    def shift_zeros_(self, delta: torch.Tensor) -> torch.Tensor:
        """Move the per-group mean of a desired weight change ``delta`` (K, N)
        into the zero points; return the part left for the codes."""
        gi = self._row_groups()
        g = self.num_groups
        count = torch.zeros(g, dtype=torch.float32, device=delta.device).index_add_(
            0, gi, torch.ones_like(gi, dtype=torch.float32))
        mean = torch.zeros((g, delta.shape[1]), dtype=torch.float32, device=delta.device).index_add_(
            0, gi, delta.to(torch.float32)) / count.clamp_min(1).unsqueeze(1)
        if self.format == "gba":       # W = q*s - z: shifting W by m is z -= m
            old = self.zeros.to(torch.float32)
            self.zeros.copy_(old - mean)
            applied = old - self.zeros.to(torch.float32)
        else:                          # W = s*(q - z): only whole steps of z
            maxq = (1 << self.bits) - 1
            s = self.scales.to(torch.float32)
            z = ops.wq_unpack(self.zeros, self.bits, self.out_features, 1, backend=self.backend).to(torch.float32)
            z_new = torch.clamp(z - torch.round(mean / s), 0, maxq)
            self.zeros.copy_(ops.wq_pack(z_new.to(torch.int32), self.bits, 1, backend=self.backend))
            applied = s * (z - z_new)
        return delta - applied[gi]

    def to_gptq(self, checkpoint_format: str = "v1") -> dict:
        """This layer in the ecosystem's GPTQ layout: ``qweight``, ``qzeros``
        (v1: ``z - 1``; v2: ``z``), ``scales``, ``g_idx`` and ``bias``. v1 cannot
        hold ``z = 0``: exporting such a layer to v1 raises (use v2)."""
        _check_choice(self.layer_name() + ".to_gptq", "checkpoint_format", checkpoint_format, CHECKPOINT_FORMATS)
        if self.format != "gptq":
            self._fail("to_gptq() needs integer zeros (format='gptq'); this layer has GBA float zeros")
        z = ops.wq_unpack(self.zeros, self.bits, self.out_features, 1, backend=self.backend)
        if checkpoint_format == "v1":
            if bool((z == 0).any()):
                self._fail(f"{int((z == 0).sum())} zero point(s) are 0, which the v1 convention (stored z - 1) "
                           "cannot represent; export with checkpoint_format='v2'")
            z = z - 1
        out = {"qweight": self.qweight.clone(), "qzeros": ops.wq_pack(z, self.bits, 1, backend=self.backend),
               "scales": self.scales.clone(), "g_idx": self.g_idx.clone()}
        if self.bias is not None:
            out["bias"] = self.bias.detach().clone()
        return out

    # ----------------------------------------------------------- constructors
    @classmethod
    def from_gptq(cls, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                  g_idx: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None, *,
                  bits: Optional[int] = None, group_size: Optional[int] = None, in_features: Optional[int] = None,
                  checkpoint_format: str = "v1", sym: bool = False, dtype=None, on_overflow: str = "wrap",
                  backend=None, trainable: bool = False, name: str = "") -> "MPQLinear":
        """A layer from ecosystem GPTQ tensors (AutoGPTQ / GPTQModel / HF layout).

        ``bits``, ``group_size`` and ``in_features`` are inferred from the shapes
        when not given (and checked against them when given). ``checkpoint_format``
        is "v1" (stored ``z - 1``, most published checkpoints) or "v2".
        """
        from ..checkpoint.gptq_layout import infer_gptq_geometry
        what = name or "MPQLinear.from_gptq"
        _check_choice(what, "checkpoint_format", checkpoint_format, CHECKPOINT_FORMATS)
        _check_choice(what, "on_overflow", on_overflow, ON_OVERFLOW)
        k, n, bits, group_size = infer_gptq_geometry(qweight, qzeros, scales, g_idx, bits, group_size,
                                                     in_features, what)
        z = ops.wq_unpack(qzeros.to(torch.int32), bits, n, 1)
        if checkpoint_format == "v1":
            z = v1_to_v2_zeros(z, bits, on_overflow, f"{what}: qzeros")
        dtype = dtype or scales.dtype
        layer = cls(k, n, bits=bits, group_size=group_size, sym=sym, bias=bias is not None, dtype=dtype,
                    format="gptq", device=qweight.device, backend=backend, trainable=trainable)
        return _load_tensors(layer, qweight, scales, ops.wq_pack(z, bits, 1), g_idx, bias)

    @classmethod
    def from_gba(cls, qweight: torch.Tensor, *, bits: int, group_size: Optional[int] = None,
                 scales: Optional[torch.Tensor] = None, zeros: Optional[torch.Tensor] = None,
                 qstatistic: Optional[torch.Tensor] = None, qscales_scales=None, qscales_zeros=None,
                 qzeros_scales=None, qzeros_zeros=None, g_idx: Optional[torch.Tensor] = None,
                 bias: Optional[torch.Tensor] = None, in_features: Optional[int] = None, dtype=torch.float16,
                 backend=None, trainable: bool = False, name: str = "") -> "MPQLinear":
        """A layer from GreenBit tensors: float ``scales``/``zeros`` (G, N), or
        double-quantized ``qstatistic`` (G, D, dq) uint8 with its four (G, D, 1)
        affine tensors (decoded once here; the layer keeps float statistics)."""
        from ..checkpoint.gba_layout import decode_gba_statistics
        what = name or "MPQLinear.from_gba"
        _check_choice(what, "bits", bits, WQ_BITS)
        n = qweight.shape[1]
        if qstatistic is not None:
            scales, zeros = decode_gba_statistics(qstatistic, qscales_scales, qscales_zeros, qzeros_scales,
                                                  qzeros_zeros, n, dtype, what)
        elif scales is None or zeros is None:
            raise ValueError(f"{what}: needs float scales and zeros (G, N), or qstatistic with qscales_scales, "
                             "qscales_zeros, qzeros_scales and qzeros_zeros")
        k = in_features if in_features is not None else (
            g_idx.shape[0] if g_idx is not None else qweight.shape[0] * 32 // bits)
        g = scales.shape[0]
        if group_size is None:
            group_size = -1 if g == 1 else k // g
        layer = cls(k, n, bits=bits, group_size=group_size, bias=bias is not None, dtype=dtype, format="gba",
                    device=qweight.device, backend=backend, trainable=trainable)
        return _load_tensors(layer, qweight, scales, zeros, g_idx, bias)

    @classmethod
    def from_float(cls, linear: nn.Linear, bits: int = 4, group_size: int = 128, sym: bool = False,
                   act_order: bool = False, format: str = "gptq", dtype=None, calibration: Optional[torch.Tensor] = None,
                   hessian: Optional[torch.Tensor] = None, damp: float = 0.01, backend=None,
                   trainable: bool = False) -> "MPQLinear":
        """Quantize an ``nn.Linear``: round-to-nearest, or GPTQ when
        ``calibration`` inputs (S, in_features) or their ``hessian`` are given.
        ``act_order`` needs calibration (it orders rows by the Hessian)."""
        from ..quantize.gptq import HessianAccumulator, gptq_quantize
        name = f"MPQLinear.from_float({type(linear).__name__})"
        dtype, w = _float_source(linear, name, dtype)
        k, n = linear.in_features, linear.out_features
        layer = cls(k, n, bits=bits, group_size=group_size, sym=sym, act_order=act_order,
                    bias=linear.bias is not None, dtype=dtype, format=format, device=linear.weight.device,
                    backend=backend, trainable=trainable)
        if calibration is not None and hessian is None:
            acc = HessianAccumulator(k, device=w.device, name=name)
            acc.add(calibration)
            hessian = acc.h
        with torch.no_grad():
            if hessian is not None:
                r = gptq_quantize(w, hessian, bits, group_size, sym=sym, act_order=act_order, fmt=format,
                                  dtype=dtype, damp=damp)
                layer.scales.copy_(r["scales"])
                layer.zeros.copy_(ops.wq_pack(r["zeros"], bits, 1) if format == "gptq" else r["zeros"])
                layer.g_idx.copy_(r["g_idx"])
                layer._refresh_act_order()
                layer.qweight.copy_(ops.wq_pack(r["codes"], bits, 0))
            else:
                if act_order:
                    raise ValueError(f"{name}: act_order=True orders rows by calibration statistics; pass "
                                     "calibration=<inputs> (or hessian=) or use act_order=False")
                s, z = rtn_stats(w, bits, group_size, sym, format, dtype)
                layer.scales.copy_(s)
                layer.zeros.copy_(ops.wq_pack(z, bits, 1) if format == "gptq" else z)
                layer.requantize_(w)
            _copy_bias(layer, linear)
        return layer

    # --------------------------------------------------------------- loading
    def _check_load(self, state_dict, prefix) -> list:
        error_msgs: list = []
        if prefix + "qzeros" in state_dict:
            error_msgs.append(
                f"{self.layer_name()}: {prefix}qzeros is the GPTQ ecosystem layout (stored z-1 'v1' or z 'v2', "
                "which a state dict cannot tell apart); bie layers hold v2 zero points under 'zeros'. Load the "
                "checkpoint with bie_core.load_quantized(model, path) or MPQLinear.from_gptq(..., "
                "checkpoint_format='v1'|'v2')")
            return error_msgs
        z = state_dict.get(prefix + "zeros")
        if isinstance(z, torch.Tensor):
            fmt = "gptq" if z.dtype == torch.int32 else "gba" if z.is_floating_point() else None
            if fmt is None:
                error_msgs.append(f"{self.layer_name()}: {prefix}zeros has dtype {_dt(z.dtype)}; expected int32 "
                                  "(packed GPTQ zero points) or float (GBA zeros)")
                return error_msgs
            if fmt != self.format:   # order-free: a GBA checkpoint switches a GPTQ layer and back
                self.format = fmt
                self.zeros = self._empty_zeros(fmt, self.qweight.device)
        k, n, b = self.in_features, self.out_features, self.bits
        g = self.num_groups
        qw = state_dict.get(prefix + "qweight")
        if isinstance(qw, torch.Tensor) and qw.dim() == 2 and qw.shape[0] != packed_rows(k, b) and k > 0:
            rows = qw.shape[0]
            guess = [bb for bb in WQ_BITS if packed_rows(k, bb) == rows]
            hint = f" (that is the size for bits={guess[0]})" if guess else ""
            error_msgs.append(f"{self.layer_name()}: {prefix}qweight has shape {tuple(qw.shape)}, expected "
                              f"({packed_rows(k, b)}, {n}) for K={k}, bits={b}{hint}")
            return error_msgs
        expected = {
            "qweight": ((packed_rows(k, b), n), (torch.int32,)),
            "scales": ((g, n), FLOAT_DTYPES),
            "zeros": (tuple(self.zeros.shape), (torch.int32,) if self.format == "gptq" else FLOAT_DTYPES),
            "g_idx": ((k,), (torch.int32, torch.int64, torch.int16)),
        }
        if self.bias is not None:
            expected["bias"] = ((n,), FLOAT_DTYPES)
        if not self._check_weight_state(state_dict, prefix, error_msgs, expected):
            return error_msgs
        for key in ("scales", "zeros", "bias"):
            msg = check_finite(self, prefix + key, state_dict.get(prefix + key))
            if msg:
                error_msgs.append(msg)
                return error_msgs
        gi = state_dict.get(prefix + "g_idx")
        if isinstance(gi, torch.Tensor) and gi.numel():
            lo, hi = int(gi.min()), int(gi.max())
            if lo < 0 or hi >= g:
                error_msgs.append(f"{self.layer_name()}: {prefix}g_idx values must be in [0, {g}) (G = "
                                  f"ceil({k}/{self.group_size})), got values in [{lo}, {hi}]")
                return error_msgs
        return error_msgs

    def _after_load(self) -> None:
        self._refresh_act_order()


# =========================================================== mixed bit widths
def allocate_group_bits(k: int, group_size: int, bits: Union[int, Sequence[int], Mapping[int, float]]) -> tuple:
    """(group_bits, group_rows) for K rows in groups of ``group_size``.

    ``bits`` is one width, a list with one width per group, or proportions
    ``{width: fraction}`` (e.g. ``{4: 0.75, 2: 0.25}``): groups get widths in
    descending order (the first rows, the most important after ``q_perm``,
    get the most bits), counts rounded so that they sum to the group count.
    """
    gcount = (k + group_size - 1) // group_size
    rows = [group_size] * (gcount - 1) + [k - group_size * (gcount - 1)]
    if isinstance(bits, int):
        return [bits] * gcount, rows
    if isinstance(bits, Mapping):
        widths = sorted(bits, reverse=True)
        total = float(sum(bits.values()))
        counts = [int(round(gcount * bits[w] / total)) for w in widths]
        counts[-1] = gcount - sum(counts[:-1])
        if counts[-1] < 0:
            counts = [max(0, c) for c in counts]
            counts[0] += gcount - sum(counts)
        out = [w for w, c in zip(widths, counts) for _ in range(c)]
        return out, rows
    out = list(bits)
    if len(out) != gcount:
        raise ValueError(f"MBWQLinear: {len(out)} group widths given for {gcount} groups of {group_size} rows "
                         f"(K={k})")
    return out, rows


class MBWQLinear(WeightOnlyLinear):
    """Mixed bit-width weight-only linear layer (exl2-style).

    Input rows are stored permuted (``q_perm``: packed row j is input row
    ``q_perm[j]``) and split into groups, each with its own width (any of
    2, 3, 4, 5, 6, 8), scale and float zero per output column;
    ``y = (x * channel_scale) @ W (+ bias)``.

    Args:
        in_features, out_features: K and N.
        bits: one width for all groups, a list (one per group), or proportions
            ``{4: 0.75, 2: 0.25}`` (see :func:`allocate_group_bits`).
        group_size: rows per group (the last one takes the rest), unless
            ``group_rows`` lists every group's row count.

    State dict: ``qweight`` int32 (sum of ceil(rows*bits/32), N), ``scales`` and
    ``zeros`` (G, N), ``q_perm`` int32 (K,), ``channel_scale`` (K,),
    ``q_groups`` int32 (G, 2) = (bits, rows) per group, ``bias``. Loading a
    checkpoint with other groups adopts them (shapes follow ``q_groups``).
    """

    def __init__(self, in_features: int, out_features: int, bits=4, group_size: int = 32,
                 group_rows: Optional[Sequence[int]] = None, bias: bool = False, dtype=torch.float16, device=None,
                 backend=None, trainable: bool = False):
        super().__init__()
        name = type(self).__name__
        self._setup_common(in_features, out_features, dtype, bias, device, backend, trainable)
        if not (isinstance(bits, (int, Mapping)) or (isinstance(bits, (list, tuple))
                                                     and all(isinstance(b, int) for b in bits))):
            raise TypeError(f"{name}: bits must be a width (int), a list of widths or proportions such as "
                            f"{{4: 0.5, 2: 0.5}}, got {bits!r}")
        if group_rows is None:
            if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
                raise ValueError(f"{name}: group_size must be a positive int, got {group_size!r}")
            gb, gr = allocate_group_bits(in_features, group_size, bits)
        else:
            gr = [int(r) for r in group_rows]
            gb = [bits] * len(gr) if isinstance(bits, int) else list(bits)
        self._set_groups(gb, gr, device)

    def _set_groups(self, group_bits, group_rows, device) -> None:
        name = type(self).__name__
        bad = sorted({b for b in group_bits if isinstance(b, bool) or b not in MBWQ_BITS})
        if bad:
            raise ValueError(f"{name}: bit widths {bad} are not supported; allowed: {list(MBWQ_BITS)}")
        if len(group_bits) != len(group_rows) or not group_rows or any(r < 1 for r in group_rows) \
                or sum(group_rows) != self.in_features:
            raise ValueError(f"{name}: group_rows {list(group_rows)} must be positive, one per group "
                             f"({len(group_bits)} widths), and sum to in_features={self.in_features}")
        self.group_bits, self.group_rows = [int(b) for b in group_bits], [int(r) for r in group_rows]
        k, n, g = self.in_features, self.out_features, len(group_bits)
        self.register_buffer("qweight", torch.zeros((mbwq_packed_rows(self.group_bits, self.group_rows), n),
                                                    dtype=torch.int32, device=device))
        self.register_buffer("scales", torch.ones((g, n), dtype=self.dtype, device=device))
        self.register_buffer("zeros", torch.zeros((g, n), dtype=self.dtype, device=device))
        self.register_buffer("q_perm", torch.arange(k, dtype=torch.int32, device=device))
        self.register_buffer("channel_scale", torch.ones(k, dtype=self.dtype, device=device))
        self.register_buffer("q_groups", torch.tensor([self.group_bits, self.group_rows], dtype=torch.int32,
                                                      device=device).t().contiguous())

    def extra_repr(self) -> str:
        widths = sorted(set(self.group_bits), reverse=True)
        s = (f"in_features={self.in_features}, out_features={self.out_features}, bits={widths}, "
             f"groups={len(self.group_bits)}")
        if self.bias is not None:
            s += ", bias=True"
        if self.trainable:
            s += ", trainable=True"
        return s

    def _lean_fixed(self) -> tuple:
        b = self._buffers
        return (b["qweight"], b["scales"], b["zeros"], b["q_perm"], b["channel_scale"], self._parameters.get("bias"))

    def _lean_bind(self, x2, fixed, backend):
        return bind_one(ops.mbwq_gemm, (x2,) + fixed + (list(self.group_bits), list(self.group_rows)), backend,
                        fixed)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        x2 = x.reshape(-1, self.in_features)
        args = (self.qweight, self.scales, self.zeros, self.q_perm, self.channel_scale)
        if self._grad_path(x):
            y = MBWQLinearFn.apply(x2, self.weight_handle, self.bias, *args, self.group_bits,
                                   self.group_rows, self.backend or "")
        else:
            y = ops.mbwq_gemm(x2, *args, self.bias, self.group_bits, self.group_rows, backend=self.backend)
        return y.reshape(tuple(x.shape[:-1]) + (self.out_features,))

    # ------------------------------------------------------------ weight access
    def dequantize(self, dtype=torch.float32) -> torch.Tensor:
        """The (K, N) weight in original row order (without channel_scale)."""
        return ops.mbwq_dequantize(self.qweight, self.scales, self.zeros, self.q_perm, self.group_bits,
                                   self.group_rows, dtype, backend=self.backend)

    def _row_groups(self) -> torch.Tensor:
        """Group of each *original* input row."""
        dev = self.qweight.device
        grp_perm = torch.repeat_interleave(torch.arange(len(self.group_rows), device=dev),
                                           torch.tensor(self.group_rows, device=dev))
        out = torch.empty_like(grp_perm)
        out[self.q_perm.long()] = grp_perm
        return out

    def quant_step(self) -> torch.Tensor:
        return self.scales.to(torch.float32)[self._row_groups()]

    @torch.no_grad()
    def requantize_(self, w: torch.Tensor) -> None:
        self.qweight.copy_(ops.mbwq_quantize(w, self.scales, self.zeros, self.q_perm, self.group_bits,
                                             self.group_rows, backend=self.backend))

    @torch.no_grad()
    def shift_zeros_(self, delta: torch.Tensor) -> torch.Tensor:
        gi = self._row_groups()
        g = len(self.group_rows)
        count = torch.tensor(self.group_rows, dtype=torch.float32, device=delta.device)
        mean = torch.zeros((g, delta.shape[1]), dtype=torch.float32, device=delta.device).index_add_(
            0, gi, delta.to(torch.float32)) / count.unsqueeze(1)
        old = self.zeros.to(torch.float32)
        self.zeros.copy_(old - mean)
        return delta - (old - self.zeros.to(torch.float32))[gi]

    @classmethod
    def from_float(cls, linear: nn.Linear, bits=None, group_size: int = 32, importance: Optional[torch.Tensor] = None,
                   channel_scale: Optional[torch.Tensor] = None, sym: bool = False, dtype=None, backend=None,
                   trainable: bool = False) -> "MBWQLinear":
        """Round-to-nearest mixed-width quantization of an ``nn.Linear``.

        Rows are ordered by ``importance`` (K,) (default: the L2 norm of each
        input row of W; activation norms from calibration are better) so the
        widest groups hold the most important rows; ``bits`` as in the
        constructor (default ``{4: 0.5, 2: 0.5}``). With ``channel_scale`` the
        quantized weight is ``W / channel_scale`` so that the layer computes
        ``(x * channel_scale) @ (W / channel_scale) = x @ W``.
        """
        name = f"MBWQLinear.from_float({type(linear).__name__})"
        dtype, w = _float_source(linear, name, dtype)
        bits = {4: 0.5, 2: 0.5} if bits is None else bits
        k, n = linear.in_features, linear.out_features
        layer = cls(k, n, bits=bits, group_size=group_size, bias=linear.bias is not None, dtype=dtype,
                    device=linear.weight.device, backend=backend, trainable=trainable)
        if channel_scale is not None:
            if not isinstance(channel_scale, torch.Tensor) or channel_scale.shape != (k,):
                raise ValueError(f"{name}: channel_scale must be a ({k},) tensor, got "
                                 f"{tuple(channel_scale.shape) if isinstance(channel_scale, torch.Tensor) else channel_scale!r}")
            if not bool((torch.isfinite(channel_scale) & (channel_scale != 0)).all()):
                bad = channel_scale[~(torch.isfinite(channel_scale) & (channel_scale != 0))]
                raise ValueError(f"{name}: channel_scale must be finite and non-zero, got {bad[:4].tolist()}")
            layer.channel_scale.copy_(channel_scale)
            w = w / layer.channel_scale.to(torch.float32).unsqueeze(1)
        imp = importance if importance is not None else w.norm(dim=1)
        if imp.shape != (k,):
            raise ValueError(f"{name}: importance must have shape ({k},), got {tuple(imp.shape)}")
        perm = torch.argsort(imp.to(torch.float32), descending=True, stable=True).to(torch.int32)
        with torch.no_grad():
            layer.q_perm.copy_(perm)
            gi = layer._row_groups()
            lo = torch.zeros((len(layer.group_rows), n), device=w.device).scatter_reduce(
                0, gi.unsqueeze(1).expand_as(w), w, "amin", include_self=True)
            hi = torch.zeros_like(lo).scatter_reduce(0, gi.unsqueeze(1).expand_as(w), w, "amax", include_self=True)
            for b in set(layer.group_bits):
                rows = torch.tensor([gb == b for gb in layer.group_bits], device=w.device)
                s, z = stats_from_range(lo[rows], hi[rows], b, sym, "gba", dtype)
                layer.scales[rows] = s
                layer.zeros[rows] = z
            layer.requantize_(w)
            _copy_bias(layer, linear)
        return layer

    # ------------------------------------------------------------------ loading
    def _check_load(self, state_dict, prefix) -> list:
        error_msgs: list = []
        qg = state_dict.get(prefix + "q_groups")
        if isinstance(qg, torch.Tensor):
            if qg.dim() != 2 or qg.shape[1] != 2 or qg.dtype not in (torch.int32, torch.int64, torch.int16):
                error_msgs.append(f"{self.layer_name()}: {prefix}q_groups must be an int (groups, 2) tensor of "
                                  f"(bits, rows), got {_dt(qg.dtype)} {tuple(qg.shape)}")
                return error_msgs
            gb, gr = qg[:, 0].tolist(), qg[:, 1].tolist()
            if (gb, gr) != (self.group_bits, self.group_rows):
                try:   # adopt the checkpoint's groups (shapes follow)
                    self._set_groups(gb, gr, self.qweight.device)
                except ValueError as e:
                    error_msgs.append(f"{self.layer_name()}: {prefix}q_groups: {e}")
                    return error_msgs
        k, n, g = self.in_features, self.out_features, len(self.group_bits)
        expected = {
            "qweight": ((mbwq_packed_rows(self.group_bits, self.group_rows), n), (torch.int32,)),
            "scales": ((g, n), FLOAT_DTYPES), "zeros": ((g, n), FLOAT_DTYPES),
            "q_perm": ((k,), (torch.int32, torch.int64, torch.int16)),
            "channel_scale": ((k,), FLOAT_DTYPES),
        }
        if self.bias is not None:
            expected["bias"] = ((n,), FLOAT_DTYPES)
        if not self._check_weight_state(state_dict, prefix, error_msgs, expected):
            return error_msgs
        for key in ("scales", "zeros", "channel_scale", "bias"):
            msg = check_finite(self, prefix + key, state_dict.get(prefix + key))
            if msg:
                error_msgs.append(msg)
                return error_msgs
        qp = state_dict.get(prefix + "q_perm")
        if isinstance(qp, torch.Tensor):
            ok = bool(((qp >= 0) & (qp < k)).all()) and torch.unique(qp).numel() == k
            if not ok:
                error_msgs.append(f"{self.layer_name()}: {prefix}q_perm must be a permutation of 0..{k - 1}")
                return error_msgs
        return error_msgs


__all__ = ["MPQLinear", "MBWQLinear", "allocate_group_bits", "v1_to_v2_zeros", "GROUP_SIZES"]
