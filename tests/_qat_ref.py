"""Plain-PyTorch straight-through re-implementations of the QAT layers' math
(docs/spec.md §3), written independently of bie's autograd Functions: values come
from float ops, gradients from autograd through detach() tricks.

Each function takes leaf tensors and returns the output; calling
``.backward()`` on it gives the gradients the bie layers must reproduce.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def sgn(t):
    return torch.where(t >= 0, 1.0, -1.0).to(torch.float32)


def ste_sign_act(xs, sa):
    """+-1 with d/dxs = mask and d/dsa = mask * sgn / sqrt(numel) (the binary sa gradient of docs/spec.md §3)."""
    xs = xs.float()
    m = ((xs / sa.detach().float()).abs() <= 1).float()
    s = sgn(xs)
    return s + (xs - xs.detach()) * m + (sa - sa.detach()).float() * m * s / math.sqrt(xs.numel())


def ste_sign_weight(w):
    """+-1 with identity gradient to the latent weight."""
    w = w.float()
    return sgn(w) + (w - w.detach())


def w_scale(w, per_channel):
    a = w.detach().abs().float()
    return a.flatten(1).mean(1) if per_channel else a.mean()


def binary_linear(x, w, ba, sa, bias=None, per_channel=False):
    xs = x.float() + ba.float()
    a = ste_sign_act(xs, sa)
    sw = w_scale(w, per_channel)
    y = (a @ ste_sign_weight(w).t()) * (sa.detach().float() * sw)
    if bias is not None:
        y = y + bias.float()
    return y


def binary_conv2d(x, w, ba, sa, bias=None, *, stride=1, padding=(0, 0), dilation=1, groups=1, pad_value=-1.0,
                  per_channel=False):
    xs = x.float() + ba.float().view(1, -1, 1, 1)
    a = ste_sign_act(xs, sa)
    a = F.pad(a, (padding[1], padding[1], padding[0], padding[0]), value=float(pad_value))
    sw = w_scale(w, per_channel)
    y = F.conv2d(a, ste_sign_weight(w), stride=stride, dilation=dilation, groups=groups)
    y = y * (sa.detach().float() * (sw.view(1, -1, 1, 1) if per_channel else sw))
    if bias is not None:
        y = y + bias.float().view(1, -1, 1, 1)
    return y


def lsq(v, s, bits, n=None):
    """LSQ fake quantizer: value s * clamp(round(v/s)); STE for v inside the
    clip range; d s = sum(G * (Q - q * inside)) / sqrt(n * Qp)."""
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    v = v.float()
    s = s.float()
    n = v.numel() if n is None else n
    q = v / s.detach()
    inside = ((q >= lo) & (q <= hi)).float()
    qq = torch.clamp(torch.round(q), lo, hi).detach()
    return (qq + (v - v.detach()) * inside / s.detach()) * s.detach() + \
        (s - s.detach()) * (qq - q.detach() * inside) / math.sqrt(n * hi)


def q_linear(x, w, ba, sa, sw, bias=None, *, w_bits=8, a_bits=8, per_channel=False):
    xh = lsq(x.float() + ba.float(), sa, a_bits)
    wh = lsq(w, sw.view(-1, 1), w_bits, w.shape[1]) if per_channel else lsq(w, sw, w_bits)
    y = xh @ wh.t()
    return y + bias.float() if bias is not None else y


def q_conv2d(x, w, ba, sa, sw, bias=None, *, w_bits=8, a_bits=8, stride=1, padding=0, dilation=1, groups=1,
             per_channel=False):
    xh = lsq(x.float() + ba.float().view(1, -1, 1, 1), sa, a_bits)
    wh = lsq(w, sw.view(-1, 1, 1, 1), w_bits, w[0].numel()) if per_channel else lsq(w, sw, w_bits)
    return F.conv2d(xh, wh, bias.float() if bias is not None else None, stride=stride, padding=padding,
                    dilation=dilation, groups=groups)


def binary_matmul(x, y, cx, cy):
    return (ste_sign_act(x, cx) @ ste_sign_act(y, cy)) * (cx.detach().float() * cy.detach().float())


def q_matmul(x, y, cx, cy, bits):
    return lsq(x, cx, bits) @ lsq(y, cy, bits)


def leaves(*ts):
    return [t.detach().clone().requires_grad_(t.is_floating_point()) for t in ts]
