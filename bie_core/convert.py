"""``bie_core.convert(model, policy)``: swap ``nn.Linear`` / ``nn.Conv2d`` /
``nn.Embedding`` for their low-bit counterparts, copying weights.

A *policy* says what each candidate layer becomes:

* a spec name for every candidate: ``"binary"`` (w1a1), ``"w8a8"`` (alias
  ``"int8"``), ``"w4a4"`` (``"int4"``), ``"w4a8"``, ``"w8a4"``, or ``"float"``
  (keep);
* a dict of rules ``{pattern_or_type: spec}``; a pattern is an ``fnmatch``
  glob on the layer's qualified name (``"features.*"``, ``"*attn*"``), a type
  matches ``type(layer) is T``; the first matching rule wins and layers that
  match no rule stay float;
* a :class:`Policy` (rules, default, first/last handling, backend).

Dynamic int8 (``DynamicQLinear``, docs/dynamic.md): ``"dynamic"`` (alias ``"dynamic_int8"``: per-tensor
affine activations, torch's rule) or ``"dynamic_per_token"`` (per-token symmetric activations); the weight is
quantized per output channel when the spec says ``per_channel``. torch's own dynamic Linear
(``torch.ao.nn.quantized.dynamic.Linear``) is a candidate too: a dynamic spec converts it exactly
(``DynamicQLinear.from_torch``), any other spec keeps it.

A spec may also be a dict, e.g. ``{"kind": "w4a4", "per_channel": True}`` or
``{"kind": "binary", "pad_value": 0.0}``.

Candidates are modules whose type is exactly ``nn.Linear``, ``nn.Conv2d`` or
``nn.Embedding`` (subclasses, e.g. the projection inside
``nn.MultiheadAttention`` that reads its weight directly, are left alone).
By default the first and the last candidate (in ``named_modules`` order, i.e.
registration order) stay float: they see raw inputs and produce logits, where
low-bit costs most accuracy. Embeddings convert only to binary (there is no
4/8-bit embedding). The returned :class:`ConversionReport` prints a summary
table (layer, type, bits, backend, bytes before, bytes after packing).
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import torch
from torch import nn

from .layers import BinaryConv2d, BinaryEmbedding, BinaryLinear, QConv2d, QLinear
from .layers._base import backend_string, tensor_bytes
from .layers.dynamic import DynamicQLinear, _is_torch_dynamic_linear

CANDIDATE_TYPES = (nn.Linear, nn.Conv2d, nn.Embedding)

_KINDS = {
    "binary": (1, 1), "w1a1": (1, 1),
    "w8a8": (8, 8), "int8": (8, 8),
    "w4a4": (4, 4), "int4": (4, 4),
    "w4a8": (4, 8), "w8a4": (8, 4),
    "dynamic": (8, 8), "dynamic_int8": (8, 8), "dynamic_per_token": (8, 8),
    "float": None, "fp": None, "none": None,
}
#: the dynamic kinds and their activation scheme
_DYNAMIC = {"dynamic": "per_tensor_affine", "dynamic_int8": "per_tensor_affine",
            "dynamic_per_token": "per_token_symmetric"}


def _torch_dynamic_bytes(m) -> int:
    w, b = m._packed_params._weight_bias()
    return w.numel() + (b.numel() * b.element_size() if b is not None else 0)


def _is_candidate(m) -> bool:
    return type(m) in CANDIDATE_TYPES or _is_torch_dynamic_linear(m)


@dataclass
class LayerSpec:
    """What one layer becomes."""

    kind: str = "binary"
    per_channel: bool = False
    pad_value: float = -1.0          # binary conv only
    backend: Optional[str] = None

    @property
    def bits(self) -> Optional[tuple]:
        return _KINDS[self.kind]

    @classmethod
    def parse(cls, spec: Any) -> "LayerSpec":
        if isinstance(spec, LayerSpec):
            return spec
        if spec is None:
            return cls("float")
        if isinstance(spec, str):
            spec = {"kind": spec}
        if not isinstance(spec, dict):
            raise TypeError(f"convert: a layer spec is a name ({sorted(_KINDS)}), a dict or a LayerSpec; "
                            f"got {spec!r}")
        spec = dict(spec)
        kind = str(spec.pop("kind", "binary")).lower()
        if kind not in _KINDS:
            raise ValueError(f"convert: unknown layer kind {kind!r}; allowed: {sorted(_KINDS)}")
        unknown = set(spec) - {"per_channel", "pad_value", "backend"}
        if unknown:
            raise ValueError(f"convert: unknown spec keys {sorted(unknown)}; allowed: kind, per_channel, "
                             "pad_value, backend")
        return cls(kind, **spec)


@dataclass
class Policy:
    """Conversion policy. ``rules`` are tried in order (first match wins);
    ``default`` applies to candidates matching no rule."""

    default: Any = "binary"
    rules: dict = field(default_factory=dict)
    keep_first: bool = True
    keep_last: bool = True
    backend: Optional[str] = None

    @classmethod
    def parse(cls, policy: Any) -> "Policy":
        if isinstance(policy, Policy):
            return policy
        if isinstance(policy, (str, LayerSpec)):
            return cls(default=policy)
        if isinstance(policy, dict):
            if "kind" in policy:  # a single spec dict
                return cls(default=policy)
            return cls(default="float", rules=dict(policy))
        raise TypeError(f"convert: policy must be a spec name, a dict of rules or a Policy, got {policy!r}")

    def spec_for(self, name: str, module: nn.Module) -> tuple:
        for key, spec in self.rules.items():
            if isinstance(key, type):
                if type(module) is key:
                    return LayerSpec.parse(spec), f"type {key.__name__}"
            elif isinstance(key, str):
                if fnmatch.fnmatchcase(name, key):
                    return LayerSpec.parse(spec), f"rule {key!r}"
            else:
                raise TypeError(f"convert: a rule key is a name pattern (str) or a type, got {key!r}")
        return LayerSpec.parse(self.default), "default"


@dataclass
class ConversionRow:
    name: str
    before: str
    after: str
    bits: str
    backend: str
    bytes_before: int
    bytes_after: int
    note: str = ""


@dataclass
class ConversionReport:
    """Result of :func:`convert`: one row per candidate layer (printable table)."""

    rows: list
    model: nn.Module

    @property
    def converted(self) -> list:
        return [r for r in self.rows if r.before != r.after]

    @property
    def bytes_before(self) -> int:
        return sum(r.bytes_before for r in self.rows)

    @property
    def bytes_after(self) -> int:
        return sum(r.bytes_after for r in self.rows)

    def table(self) -> str:
        head = ("layer", "type", "bits", "backend", "bytes before", "bytes after (packed)", "note")
        body = [(r.name, r.before if r.before == r.after else f"{r.before} -> {r.after}", r.bits, r.backend,
                 f"{r.bytes_before:,}", f"{r.bytes_after:,}", r.note) for r in self.rows]
        ratio = self.bytes_before / max(1, self.bytes_after)
        body.append(("total", f"{len(self.converted)} of {len(self.rows)} converted", "", "",
                     f"{self.bytes_before:,}", f"{self.bytes_after:,}", f"{ratio:.1f}x smaller"))
        widths = [max(len(str(row[i])) for row in [head] + body) for i in range(len(head))]

        def line(row):
            return "  ".join(str(c).ljust(w) if i in (0, 1, 2, 3, 6) else str(c).rjust(w)
                             for i, (c, w) in enumerate(zip(row, widths))).rstrip()
        sep = "  ".join("-" * w for w in widths)
        return "\n".join([line(head), sep] + [line(r) for r in body[:-1]] + [sep, line(body[-1])])

    __str__ = table

    def __repr__(self):
        return f"ConversionReport({len(self.converted)} of {len(self.rows)} layers converted)"


def _conv_padding(conv: nn.Conv2d) -> Optional[tuple]:
    p = conv.padding
    if isinstance(p, str):
        if p == "valid":
            return (0, 0)
        # "same" with stride 1: total padding d*(k-1) per dim, symmetric only if even
        tot = [d * (k - 1) for d, k in zip(conv.dilation, conv.kernel_size)]
        if any(t % 2 for t in tot):
            return None
        return tuple(t // 2 for t in tot)
    return tuple(p)


def _float_bits(m: nn.Module) -> str:
    if _is_torch_dynamic_linear(m):
        return "w8a8 dynamic (torch)"
    w = getattr(m, "weight", None)
    return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}.get(
        getattr(w, "dtype", None), str(getattr(w, "dtype", "-")).replace("torch.", ""))


def _build(m: nn.Module, spec: LayerSpec, backend: Optional[str]) -> tuple:
    """(new layer, None) or (None, reason it stays float)."""
    if _is_torch_dynamic_linear(m):
        if spec.kind not in _DYNAMIC:
            return None, f"torch dynamic Linear converts only to a dynamic kind ({', '.join(_DYNAMIC)}): kept"
        if spec.kind == "dynamic_per_token":
            new = DynamicQLinear.from_torch(m, backend=backend)
            new.act_scheme, new.reduce_range = "per_token_symmetric", False
            return new, None
        return DynamicQLinear.from_torch(m, backend=backend), None
    if spec.kind in _DYNAMIC:
        if not isinstance(m, nn.Linear):
            return None, f"{spec.kind} applies to linear layers only: kept float"
        return DynamicQLinear.from_float(m, per_channel=spec.per_channel, act_scheme=_DYNAMIC[spec.kind],
                                         backend=backend), None
    w = m.weight
    fk = {"device": w.device, "dtype": w.dtype, "backend": backend}
    bits = spec.bits
    if isinstance(m, nn.Embedding):
        if bits != (1, 1):
            return None, "no 4/8-bit embedding: kept float"
        if m.max_norm is not None or m.sparse or m.scale_grad_by_freq:
            return None, "max_norm/sparse/scale_grad_by_freq not supported: kept float"
        new = BinaryEmbedding(m.num_embeddings, m.embedding_dim, m.padding_idx, **fk)
        with torch.no_grad():
            new.weight.copy_(w.detach())
        return new, None
    bias = m.bias is not None
    if isinstance(m, nn.Linear):
        if bits == (1, 1):
            new = BinaryLinear(m.in_features, m.out_features, bias, per_channel=spec.per_channel, **fk)
        else:
            new = QLinear(m.in_features, m.out_features, bits[0], bits[1], bias, per_channel=spec.per_channel, **fk)
    else:
        if m.padding_mode != "zeros":
            return None, f"padding_mode={m.padding_mode!r} not supported: kept float"
        padding = _conv_padding(m)
        if padding is None:
            return None, "asymmetric 'same' padding not supported: kept float"
        args = (m.in_channels, m.out_channels, m.kernel_size, m.stride, padding, m.dilation, m.groups, bias)
        if bits == (1, 1):
            new = BinaryConv2d(*args, pad_value=spec.pad_value, per_channel=spec.per_channel, **fk)
        else:
            new = QConv2d(*args, w_bits=bits[0], a_bits=bits[1], per_channel=spec.per_channel, **fk)
    with torch.no_grad():
        new.weight.copy_(w.detach())
        if bias:
            new.bias.copy_(m.bias.detach())
    return new, None


def _finish(new: nn.Module, old: nn.Module) -> nn.Module:
    new.train(old.training)
    return new


def _bits_label(new: nn.Module) -> str:
    if isinstance(new, (BinaryLinear, BinaryConv2d)):
        return "w1a1"
    if isinstance(new, BinaryEmbedding):
        return "w1"
    if isinstance(new, DynamicQLinear):
        return "w8a8 dynamic"
    return f"w{new.w_bits}a{new.a_bits}"


def convert(model: nn.Module, policy: Union[str, dict, Policy, LayerSpec] = "binary", *,
            keep_first_last: Optional[bool] = None, backend=None,
            progress: Optional[bool] = None) -> ConversionReport:
    """Convert ``model`` in place (see module doc); returns a :class:`ConversionReport`.

    ``keep_first_last`` overrides the policy's ``keep_first``/``keep_last``;
    ``backend`` (validated now) is given to every new layer unless its spec
    names one. ``progress``: tqdm bar (default: only for 50+ candidate layers).
    """
    pol = Policy.parse(policy)
    keep_first, keep_last = pol.keep_first, pol.keep_last
    if keep_first_last is not None:
        keep_first = keep_last = bool(keep_first_last)
    default_backend = backend_string(backend if backend is not None else pol.backend, "convert")
    if _is_candidate(model):
        raise ValueError(f"convert: the model itself is a {type(model).__name__}; convert a module that contains it "
                         "(e.g. nn.Sequential(layer)) so it can be replaced in place")
    # every (parent, attribute) under which each candidate is reachable (a shared module is replaced everywhere)
    where: dict = {}
    for pname, parent in model.named_modules(remove_duplicate=False):
        for cname, child in parent._modules.items():
            if child is not None and _is_candidate(child):
                where.setdefault(id(child), []).append((parent, cname))
    # candidates in named_modules order (depth first, registration order), each under its first name: a model's
    # classifier registered after nested blocks is the last candidate, not the second
    names: dict = {}
    for full, m in model.named_modules(remove_duplicate=False):
        if id(m) in where:
            names.setdefault(id(m), (full, m))
    candidates = list(names.values())
    show = progress if progress is not None else len(candidates) >= 50
    try:
        from tqdm.auto import tqdm
        it = tqdm(candidates, desc="bie convert", unit="layer", disable=not show)
    except ImportError:  # tqdm is optional for conversion
        it = candidates
    rows = []
    last = len(candidates) - 1
    for i, (name, m) in enumerate(it):
        spec, why = pol.spec_for(name, m)
        before = _torch_dynamic_bytes(m) if _is_torch_dynamic_linear(m) else tensor_bytes(m)
        row = ConversionRow(name, type(m).__name__, type(m).__name__, _float_bits(m), "-", before, before)
        if spec.bits is None:
            row.note = f"float ({why})"
        elif (i == 0 and keep_first) or (i == last and keep_last):
            row.note = "kept float (first layer)" if i == 0 else "kept float (last layer)"
        else:
            layer_backend = backend_string(spec.backend, f"convert: spec for {name}") or default_backend
            new, reason = _build(m, spec, layer_backend)
            if new is None:
                row.note = reason
            else:
                _finish(new, m)
                for parent, attr in where[id(m)]:
                    setattr(parent, attr, new)
                row.after, row.bits = type(new).__name__, _bits_label(new)
                row.backend = layer_backend or "auto"
                row.bytes_after = new.packed_nbytes()
        rows.append(row)
    return ConversionReport(rows, model)
