"""Folding an inference model's BatchNorm2d layers into the convolutions that feed them.

In eval mode a ``BatchNorm2d`` is a per-channel affine map of its input, ``z = a * y + b`` with
``a = gamma / sqrt(running_var + eps)`` and ``b = beta - a * running_mean``. When ``y`` is a convolution's output
and nothing else reads it, the map folds into that convolution and the BatchNorm becomes ``nn.Identity``: one pass
over the activations fewer per block (a read and a write of every activation, the cost of a memory-bound
element-wise kernel), and one rounding fewer.

* ``nn.Conv2d``: each output channel's filter is scaled by ``a`` and its bias becomes ``a * bias + b``.
* A packed ``QConv2d`` / ``BinaryConv2d``: the output is ``float32(acc) * (sa * sw) + bias`` with integer
  ``acc`` (the op's epilogue), so ``a`` folds into the weight scale ``sw`` (which becomes per channel) and the bias
  becomes ``a * bias + b``; the codes do not change. An unpacked layer is left alone: during training its ``sw``
  also sets the weight's quantization grid, which folding would move.

A BatchNorm whose output only a packed ``BinaryConv2d`` reads folds forward instead: that layer binarizes
``sgn(x + ba)`` of its input, and ``sgn(a * z + b + ba) = sgn(a) * sgn(z + (b + ba) / a)``, so its shift becomes
``(b + ba) / a`` and, for a channel with ``a < 0``, the signs of that input channel's weights flip (not where the
layer pads with a non-zero value: the padding would flip with them). A binary network's BatchNorm before each
binarization then costs nothing.

The folded model computes the same function up to the rounding of the folded scale and bias in the layer's dtype
(float32: a few units in the last place; bf16: the dtype's own rounding, and the BatchNorm's own rounding of its
input disappears). Pairs are found in the model's ``torch.fx`` graph (convolution, BatchNorm and bie layers kept as
leaves); a model fx cannot trace is searched for consecutive children of its ``nn.Sequential`` containers.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from . import ops
from .layers._base import QATLayer
from .layers.binary import BinaryConv2d
from .layers.integer import QConv2d

__all__ = ["fold_batchnorm", "FoldReport"]

_BIE_CONVS = (QConv2d, BinaryConv2d)


@dataclass
class FoldReport:
    """What :func:`fold_batchnorm` did: the (conv, BatchNorm) module names it folded into the conv before, the
    (BatchNorm, binary conv) names it folded into the binary conv after, those it left with the reason, and how the
    pairs were found ("fx graph" or "nn.Sequential order")."""

    folded: list = field(default_factory=list)
    folded_forward: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    found_by: str = ""

    def __str__(self) -> str:
        lines = [f"fold_batchnorm: {len(self.folded) + len(self.folded_forward)} folded, {len(self.skipped)} left "
                 f"(pairs found by {self.found_by})"]
        lines += [f"  folded  {c} <- {b}" for c, b in self.folded]
        lines += [f"  folded  {b} -> {c} (its input shift)" for b, c in self.folded_forward]
        lines += [f"  left    {c} / {b}: {why}" for c, b, why in self.skipped]
        return "\n".join(lines)


def _is_conv(m: nn.Module) -> bool:
    return isinstance(m, _BIE_CONVS) or (isinstance(m, nn.Conv2d) and not isinstance(m, QATLayer))


class _Tracer(torch.fx.Tracer):
    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return _is_conv(m) or isinstance(m, (nn.BatchNorm2d, QATLayer)) or super().is_leaf_module(m, qualname)


def _pairs_from_graph(model: nn.Module) -> tuple:
    """(conv -> BatchNorm pairs, BatchNorm -> BinaryConv2d pairs) of the model's fx graph: the first module's
    output read by the second alone, each module called once."""
    graph = _Tracer().trace(model)
    modules = dict(model.named_modules())
    calls: dict = {}
    for node in graph.nodes:
        if node.op == "call_module":
            calls[node.target] = calls.get(node.target, 0) + 1
    back, forward = [], []
    for node in graph.nodes:
        if node.op != "call_module" or not isinstance(modules.get(node.target), nn.BatchNorm2d) or not node.args:
            continue
        if len(node.args) != 1 or node.kwargs or calls[node.target] != 1:
            continue
        src = node.args[0]
        # the conv's output must reach nothing but this BatchNorm, and neither module may be called elsewhere
        if isinstance(src, torch.fx.Node) and src.op == "call_module" and _is_conv(modules.get(src.target)) \
                and len(src.users) == 1 and calls[src.target] == 1:
            back.append((src.target, node.target))
            continue
        users = list(node.users)
        if len(users) == 1 and users[0].op == "call_module" and isinstance(modules.get(users[0].target), BinaryConv2d) \
                and users[0].args[:1] == (node,) and calls[users[0].target] == 1:
            forward.append((node.target, users[0].target))
    return back, forward


def _pairs_from_sequentials(model: nn.Module) -> tuple:
    back, forward = [], []
    for name, m in model.named_modules():
        if isinstance(m, nn.Sequential):
            kids = list(m.named_children())
            prefix = f"{name}." if name else ""
            for (n1, m1), (n2, m2) in zip(kids, kids[1:]):
                if _is_conv(m1) and isinstance(m2, nn.BatchNorm2d):
                    back.append((prefix + n1, prefix + n2))
                elif isinstance(m1, nn.BatchNorm2d) and isinstance(m2, BinaryConv2d):
                    forward.append((prefix + n1, prefix + n2))
    done = {b for _, b in back}
    return back, [(b, c) for b, c in forward if b not in done]


def _bn_problem(bn: nn.BatchNorm2d):
    if bn.training:
        return "the BatchNorm is in training mode (its batch statistics are not a fixed map): call .eval() first"
    if bn.running_mean is None or bn.running_var is None:
        return "the BatchNorm keeps no running statistics"
    return None


def _why_not(conv: nn.Module, bn: nn.BatchNorm2d):
    why = _bn_problem(bn)
    if why is not None:
        return why
    out = conv.out_channels
    if bn.num_features != out:
        return f"the BatchNorm has {bn.num_features} features, the convolution {out} output channels"
    if isinstance(conv, _BIE_CONVS) and not conv.packed:
        return ("the layer is not packed (while it trains, its weight scale also sets the weight's quantization "
                "grid): pack() it first")
    return None


def _why_not_forward(bn: nn.BatchNorm2d, conv: BinaryConv2d):
    why = _bn_problem(bn)
    if why is not None:
        return why
    if bn.num_features != conv.in_channels:
        return f"the BatchNorm has {bn.num_features} features, the binary convolution {conv.in_channels} input channels"
    if not conv.packed:
        return "the binary layer is not packed: pack() it first"
    a = _affine(bn)[0]
    if bool((a == 0).any()):
        return "a BatchNorm channel has a zero scale (its output is constant: nothing to binarize)"
    if bool((a < 0).any()) and any(conv.padding) and conv.pad_value != 0:
        return ("a BatchNorm channel has a negative scale and the layer pads with a non-zero value: flipping that "
                "channel's weight signs would flip its padding too")
    return None


def _fold_forward(conv: BinaryConv2d, a: torch.Tensor, b: torch.Tensor) -> None:
    """sgn(a z + b + ba) = sgn(a) sgn(z + (b + ba) / a): the new shift, and the weight signs of the input channels
    with a < 0 flipped (the packed bits of each output channel's K = (C / groups) * kh * kw, channel-major)."""
    ba = conv.act_shift
    dev = ba.device
    a, b = a.to(dev), b.to(dev)
    with torch.no_grad():
        ba.copy_(((b + ba.detach().double()) / a).to(ba.dtype))
        neg = a < 0
        if bool(neg.any()):
            o, cg = conv.out_channels, conv.in_channels // conv.groups
            kk = conv.kernel_size[0] * conv.kernel_size[1]
            # per output channel: its group's input channels, each repeated over the kernel's positions
            group_of = torch.arange(o, device=dev) // (o // conv.groups)
            chans = group_of.view(-1, 1) * cg + torch.arange(cg, device=dev).view(1, -1)       # (O, Cg)
            flip = neg[chans].repeat_interleave(kk, dim=1)                                     # (O, K)
            # the flips in the weight bits' own packing (bit 1 where +1): XOR turns those signs over
            mask = ops.pack_signs(torch.where(flip, 1.0, -1.0), backend=conv.backend or "")
            bits = conv.weight_bits
            bits.copy_(bits ^ mask.to(bits.device))


def _affine(bn: nn.BatchNorm2d) -> tuple:
    """(a, b) of the BatchNorm's eval map z = a * y + b, in float64."""
    var, mean = bn.running_var.detach().double(), bn.running_mean.detach().double()
    a = torch.rsqrt(var + bn.eps)
    b = -mean * a
    if bn.weight is not None:
        a = a * bn.weight.detach().double()
        b = b * bn.weight.detach().double()
    if bn.bias is not None:
        b = b + bn.bias.detach().double()
    return a, b


def _set_tensor(m: nn.Module, name: str, value: torch.Tensor) -> None:
    """Replace parameter or buffer ``name`` by ``value`` (a parameter keeps its requires_grad)."""
    old = getattr(m, name)
    if name in m._parameters:
        setattr(m, name, nn.Parameter(value, requires_grad=old is not None and old.requires_grad))
    else:
        m.register_buffer(name, value)


def _fold(conv: nn.Module, a: torch.Tensor, b: torch.Tensor) -> None:
    bias = conv.bias
    dev = a.device if bias is None else bias.device
    dtype = (bias.dtype if bias is not None else
             conv.weight.dtype if isinstance(conv, nn.Conv2d) else conv.act_shift.dtype)
    new_bias = b.to(dev) if bias is None else a.to(dev) * bias.detach().double() + b.to(dev)
    with torch.no_grad():
        if isinstance(conv, _BIE_CONVS):
            sw = conv.weight_scale
            s = sw.detach().double().reshape(-1).expand(a.numel()) * a.to(sw.device)
            _set_tensor(conv, "weight_scale", s.to(sw.dtype).contiguous())
            conv.per_channel = True          # (the packed form's weight_scale is now one value per channel)
        else:
            w = conv.weight
            w.copy_((w.detach().double() * a.to(w.device).reshape(-1, 1, 1, 1)).to(w.dtype))
        if bias is None:
            conv.bias = nn.Parameter(new_bias.to(dtype))
        else:
            bias.copy_(new_bias.to(bias.dtype))


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, leaf, new)


def fold_batchnorm(model: nn.Module) -> FoldReport:
    """Fold every eval-mode ``BatchNorm2d`` that reads nothing but the output of an ``nn.Conv2d`` or a packed
    ``QConv2d`` / ``BinaryConv2d`` into that convolution, in place; the BatchNorm becomes ``nn.Identity``. A
    BatchNorm read by a packed ``BinaryConv2d`` alone folds into that layer's input shift instead.

    For inference only: call ``model.eval()`` (and ``bie_core.pack(model)`` for the QAT layers) first. Returns a
    :class:`FoldReport` naming the folded pairs and those left, with the reason. Pairs are found in the model's
    ``torch.fx`` graph; a model fx cannot trace is searched for consecutive children of ``nn.Sequential``
    containers."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"bie: fold_batchnorm takes an nn.Module, not {type(model).__name__}")
    if model.training:
        raise ValueError("bie: fold_batchnorm folds a BatchNorm's running statistics, which only an eval-mode model "
                         "uses: call model.eval() first (fold for inference, keep the unfolded model to train)")
    report = FoldReport()
    try:
        (pairs, forward), report.found_by = _pairs_from_graph(model), "fx graph"
    except Exception:  # noqa: BLE001 - any model fx cannot trace: the containers' order instead
        (pairs, forward), report.found_by = _pairs_from_sequentials(model), "nn.Sequential order"
    for bn_name, conv_name in forward:
        bn, conv = model.get_submodule(bn_name), model.get_submodule(conv_name)
        why = _why_not_forward(bn, conv)
        if why is not None:
            report.skipped.append((conv_name, bn_name, why))
            continue
        _fold_forward(conv, *_affine(bn))
        _replace(model, bn_name, nn.Identity())
        report.folded_forward.append((bn_name, conv_name))
    for conv_name, bn_name in pairs:
        conv, bn = model.get_submodule(conv_name), model.get_submodule(bn_name)
        why = _why_not(conv, bn)
        if why is not None:
            report.skipped.append((conv_name, bn_name, why))
            continue
        a, b = _affine(bn)
        _fold(conv, a, b)
        _replace(model, bn_name, nn.Identity())
        report.folded.append((conv_name, bn_name))
    return report
