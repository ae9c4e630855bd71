"""Loading GPTQ / GBA checkpoints into a float model, and writing them back.

``load_quantized(model, path_or_state_dict)`` finds every quantized linear of
the checkpoint (a prefix with ``<prefix>.qweight``), swaps the model's
``nn.Linear`` at that prefix for an ``MPQLinear`` built from the tensors
(GPTQ: ``qweight``/``qzeros``/``scales``/``g_idx``; GBA: float
``scales``/``zeros`` or double-quantized ``qstatistic``), converting v1 zero
points to the canonical v2, and loads every other tensor into the model.
Anything that does not fit (missing or extra tensors, shapes, a layer the
model does not have) is an error that names it.

quantize_config keys read (``quantize_config.json``, ``quant_config.json`` or
``config.json["quantization_config"]``): ``bits``, ``group_size``,
``desc_act``, ``sym``, ``checkpoint_format`` (or ``format``: "gptq" = v1,
"gptq_v2" = v2), ``quant_method`` (must be gptq if present; GBA checkpoints
are recognised by their tensors).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Mapping, Optional, Union

import torch
from torch import nn

from ..layers.weight_only import ON_OVERFLOW, MPQLinear
from ..ops.weight_only import WQ_BITS
from .io import CheckpointError, as_state_dict, read_quant_config, write_safetensors

GPTQ_KEYS = ("qweight", "qzeros", "scales", "g_idx", "bias")
GBA_KEYS = ("qweight", "scales", "zeros", "qstatistic", "qscales_scales", "qscales_zeros", "qzeros_scales",
            "qzeros_zeros", "g_idx", "bias", "wf")
LAYER_KEYS = tuple(dict.fromkeys(GPTQ_KEYS + GBA_KEYS))
_FORMATS = {"gptq": "v1", "v1": "v1", "gptq_v1": "v1", "gptq_v2": "v2", "v2": "v2"}


@dataclass
class LoadReport:
    """What ``load_quantized`` did."""

    replaced: list = field(default_factory=list)       # module names now MPQLinear
    checkpoint_format: str = "v1"
    bits: dict = field(default_factory=dict)           # module name -> bits
    gba: list = field(default_factory=list)            # module names loaded from GBA tensors
    ignored_missing: list = field(default_factory=list)  # tied parameters the checkpoint omits

    def __str__(self):
        return (f"load_quantized: {len(self.replaced)} linear layers quantized "
                f"({len(self.gba)} GBA), checkpoint_format={self.checkpoint_format}")


def _zero_convention(cfg: Optional[dict], override: Optional[str]) -> str:
    raw = override if override is not None else (cfg or {}).get("checkpoint_format", (cfg or {}).get("format"))
    if raw is None:
        return "v1"   # AutoGPTQ and most published checkpoints
    conv = _FORMATS.get(str(raw).lower())
    if conv is None:
        raise CheckpointError(f"checkpoint_format={raw!r} is not a GPTQ zero convention; expected one of "
                              f"{sorted(_FORMATS)} ('gptq' is v1: stored z-1; 'gptq_v2' is v2: stored z)")
    return conv


def _check_config(cfg: Optional[dict]) -> None:
    """The quantize config's values have the types and ranges they must have."""
    if not cfg:
        return
    src = cfg.get("__file__", "quantize_config")

    def bad(key, allowed):
        raise CheckpointError(f"{src}: {key}={cfg[key]!r} is not supported; allowed: {allowed}")
    b = cfg.get("bits")
    if b is not None and (isinstance(b, bool) or b not in WQ_BITS):
        bad("bits", f"one of {list(WQ_BITS)}")
    g = cfg.get("group_size")
    if g is not None and (isinstance(g, bool) or not isinstance(g, int) or not (g == -1 or g >= 1)):
        bad("group_size", "-1 (one group per column) or a positive integer")
    for key in ("sym", "desc_act"):
        if key in cfg and not isinstance(cfg[key], bool):
            bad(key, "true or false")


def _check_method(cfg: Optional[dict]) -> None:
    m = (cfg or {}).get("quant_method")
    if m is not None and str(m).lower() not in ("gptq", "bitorch", "gba", "greenbit"):
        raise CheckpointError(f"quantization_config has quant_method={m!r}; load_quantized reads GPTQ and GreenBit "
                              "(GBA) checkpoints only")


def _parent(model: nn.Module, name: str) -> tuple:
    if "." in name:
        pname, attr = name.rsplit(".", 1)
        return model.get_submodule(pname), attr
    return model, name


def _tied_groups(model: nn.Module) -> list:
    """Names that refer to one Parameter object (tied weights, e.g. an LM head
    sharing the embedding), as lists of 2 or more names."""
    names_of: dict = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(p), []).append(name)
    return [g for g in names_of.values() if len(g) > 1]


def _retie(model: nn.Module, groups: list, present: set) -> list:
    """Point every tied name the checkpoint lacks at the loaded member of its
    group (``load_state_dict(assign=True)`` replaces objects one name at a
    time, which unties them); returns the names so covered."""
    covered = []
    for g in groups:
        src = next((n for n in g if n in present), None)
        if src is None:
            continue
        p = model.get_parameter(src)
        for n in g:
            if n not in present:
                parent, attr = _parent(model, n)
                if getattr(parent, attr) is not p:
                    setattr(parent, attr, p)
                covered.append(n)
    return covered


def _still_meta(model: nn.Module) -> list:
    return [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]


def load_quantized(model: nn.Module, source: Union[str, os.PathLike, Mapping[str, torch.Tensor]], *,
                   quantize_config: Optional[dict] = None, checkpoint_format: Optional[str] = None,
                   dtype: Optional[torch.dtype] = None, backend=None, trainable: bool = False, strict: bool = True,
                   on_overflow: str = "wrap") -> LoadReport:
    """Swap ``model``'s linears for ``MPQLinear`` from a GPTQ/GBA checkpoint.

    Args:
        model: the float model (e.g. a transformers model built from its config).
        source: a safetensors file, a directory (single or sharded safetensors,
            with quantize_config.json or config.json), or a state dict.
        quantize_config: overrides the one found next to the checkpoint.
        checkpoint_format: "gptq"/"v1" or "gptq_v2"/"v2"; overrides the config.
        dtype: dtype of the layers' scales and bias (default: the checkpoint's).
        trainable: make the packed weights trainable (docs/spec.md §4).
        strict: every model tensor must come from the checkpoint and every
            checkpoint tensor must be used (tied weights excepted).
        on_overflow: v1 zero points stored as 2^b - 1 ("wrap" reads them as 0
            with a warning, "error" raises); see ``v1_to_v2_zeros``.
    """
    if on_overflow not in ON_OVERFLOW:
        raise ValueError(f"load_quantized: on_overflow={on_overflow!r}; allowed: {list(ON_OVERFLOW)}")
    sd, path = as_state_dict(source)
    if quantize_config is not None and not isinstance(quantize_config, Mapping):
        raise TypeError(f"load_quantized: quantize_config must be a dict, got {type(quantize_config).__name__}")
    cfg = dict(quantize_config, __file__="load_quantized(quantize_config=...)") if quantize_config is not None \
        else read_quant_config(path)
    _check_config(cfg)
    _check_method(cfg)
    conv = _zero_convention(cfg, checkpoint_format)
    cfg = cfg or {}
    bits, group_size = cfg.get("bits"), cfg.get("group_size")
    sym = bool(cfg.get("sym", False))
    report = LoadReport(checkpoint_format=conv)
    prefixes = sorted(k[: -len(".qweight")] for k in sd if k.endswith(".qweight"))
    if not prefixes:
        raise CheckpointError("the checkpoint has no '<layer>.qweight' tensor: not a GPTQ/GBA checkpoint "
                              f"(first keys: {sorted(sd)[:5]})")
    used = set()
    for prefix in prefixes:
        try:
            mod = model.get_submodule(prefix)
        except AttributeError:
            raise CheckpointError(f"the checkpoint has a quantized layer '{prefix}' but the model has no such "
                                  "module (checkpoint of another model?)") from None
        if not isinstance(mod, (nn.Linear, MPQLinear)):
            raise CheckpointError(f"'{prefix}' is a {type(mod).__name__} in the model; quantized checkpoints "
                                  "replace nn.Linear layers only")
        t = {k: sd[f"{prefix}.{k}"] for k in LAYER_KEYS if f"{prefix}.{k}" in sd}
        used.update(f"{prefix}.{k}" for k in t)
        k_in, n_out = mod.in_features, mod.out_features
        has_bias = (mod.bias is not None)
        if "bias" in t and not has_bias and strict:
            raise CheckpointError(f"'{prefix}.bias' is in the checkpoint but the model's layer has no bias")
        if "bias" not in t and has_bias and strict:
            raise CheckpointError(f"'{prefix}.bias' is missing from the checkpoint (the model's layer has a bias)")
        what = f"load_quantized: '{prefix}'"
        is_gba = "qstatistic" in t or ("qzeros" not in t and "zeros" in t)
        if is_gba:
            b = bits if bits is not None else None
            if b is None:
                raise CheckpointError(f"{what}: a GBA layer needs bits from the quantize config")
            gs = group_size
            decode = "qstatistic" in t and (gs is None or gs == -1 or gs < 256 or "scales" not in t)
            new = MPQLinear.from_gba(
                t["qweight"], bits=b, group_size=gs, in_features=k_in,
                scales=None if decode else t.get("scales"), zeros=None if decode else t.get("zeros"),
                qstatistic=t.get("qstatistic") if decode else None,
                qscales_scales=t.get("qscales_scales"), qscales_zeros=t.get("qscales_zeros"),
                qzeros_scales=t.get("qzeros_scales"), qzeros_zeros=t.get("qzeros_zeros"),
                g_idx=t.get("g_idx"), bias=t.get("bias"), dtype=dtype or _float_dtype(t), backend=backend,
                trainable=trainable, name=what)
            report.gba.append(prefix)
        else:
            for need in ("qzeros", "scales"):
                if need not in t:
                    raise CheckpointError(f"{what}: '{prefix}.{need}' is missing (a GPTQ layer needs qweight, "
                                          "qzeros and scales)")
            new = MPQLinear.from_gptq(t["qweight"], t["qzeros"], t["scales"], t.get("g_idx"), t.get("bias"),
                                      bits=bits, group_size=group_size, in_features=k_in, checkpoint_format=conv,
                                      sym=sym, dtype=dtype, on_overflow=on_overflow, backend=backend,
                                      trainable=trainable, name=what)
        if new.out_features != n_out:
            raise CheckpointError(f"{what}: the checkpoint layer has {new.out_features} outputs (qweight "
                                  f"{tuple(t['qweight'].shape)}) but the model's layer has {n_out}")
        dev = mod.qweight.device if isinstance(mod, MPQLinear) else mod.weight.device
        parent, attr = _parent(model, prefix)
        # a model built on the meta device (no memory for float weights) gets
        # its quantized layers on the CPU, where the checkpoint was read
        setattr(parent, attr, new if dev.type == "meta" else new.to(dev))
        report.replaced.append(prefix)
        report.bits[prefix] = new.bits
    rest = {k: v for k, v in sd.items() if k not in used}
    on_meta = any(t.is_meta for t in list(model.parameters()) + list(model.buffers()))
    groups = _tied_groups(model)
    result = model.load_state_dict(rest, strict=False, assign=on_meta)
    quant_keys = {f"{p}.{k}" for p in prefixes for k in ("qweight", "scales", "zeros", "g_idx", "bias")}
    missing = [k for k in result.missing_keys if k not in quant_keys]
    unexpected = [k for k in result.unexpected_keys if not k.endswith(".wf")]
    tied = _retie(model, groups, set(rest))
    report.ignored_missing = tied
    missing = [k for k in missing if k not in tied]
    meta = _still_meta(model) if on_meta else []
    if strict and (missing or unexpected or meta):
        parts = []
        if meta:
            parts.append(f"still on the meta device (no value in the checkpoint): {meta[:8]}"
                         f"{' ...' if len(meta) > 8 else ''}")
        if missing:
            parts.append(f"missing from the checkpoint (truncated?): {missing[:8]}{' ...' if len(missing) > 8 else ''}")
        if unexpected:
            parts.append(f"not in the model (checkpoint of another model?): {unexpected[:8]}"
                         f"{' ...' if len(unexpected) > 8 else ''}")
        raise CheckpointError("load_quantized: " + "; ".join(parts))
    return report


def _float_dtype(t: dict) -> torch.dtype:
    for k in ("scales", "qscales_scales", "zeros"):
        if k in t and t[k].is_floating_point():
            return t[k].dtype
    return torch.float16


def gptq_state_dict(model: nn.Module, checkpoint_format: str = "v1") -> dict:
    """The model's state dict in the GPTQ ecosystem layout: every MPQLinear
    as ``qweight``/``qzeros``/``scales``/``g_idx``(/``bias``), the rest as is."""
    from ..layers.shared_input import require_unfused
    require_unfused(model, "gptq_state_dict")
    out = {}
    layers = {name: m for name, m in model.named_modules() if isinstance(m, MPQLinear)}
    skip = set()
    for name, m in layers.items():
        for k, v in m.to_gptq(checkpoint_format).items():
            out[f"{name}.{k}"] = v
        skip.update(f"{name}.{k}" for k in m.state_dict())
    for k, v in model.state_dict().items():
        if k not in skip:
            out[k] = v
    return out


def save_quantized(model: nn.Module, directory: Union[str, os.PathLike], checkpoint_format: str = "v1") -> str:
    """Write ``model.safetensors`` + ``quantize_config.json`` in the layout
    AutoGPTQ / GPTQModel / transformers read. All MPQLinear layers must share
    bits, group size and symmetry (one config)."""
    layers = [m for m in model.modules() if isinstance(m, MPQLinear)]
    if not layers:
        raise ValueError("save_quantized: the model has no MPQLinear layer")
    keys = {(m.bits, m.group_size, m.sym) for m in layers}
    if len(keys) != 1:
        raise ValueError(f"save_quantized: layers differ in (bits, group_size, sym): {sorted(keys)}; "
                         "one quantize_config cannot describe them")
    bits, gs, sym = keys.pop()
    d = os.fspath(directory)
    os.makedirs(d, exist_ok=True)
    write_safetensors(gptq_state_dict(model, checkpoint_format), os.path.join(d, "model.safetensors"))
    cfg = {"bits": bits, "group_size": gs, "desc_act": any(m.act_order for m in layers), "sym": sym,
           "quant_method": "gptq", "checkpoint_format": "gptq" if checkpoint_format == "v1" else "gptq_v2"}
    with open(os.path.join(d, "quantize_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return d


def quantize_model(model: nn.Module, bits: int = 4, group_size: int = 128, sym: bool = False,
                   format: str = "gptq", skip=("lm_head",), dtype=None, backend=None,
                   trainable: bool = False) -> list:
    """Replace every ``nn.Linear`` (except names ending in ``skip``) by a
    round-to-nearest ``MPQLinear``; returns the replaced names."""
    names = [n for n, m in model.named_modules() if type(m) is nn.Linear
             and not any(n == s or n.endswith("." + s) for s in skip)]
    for n in names:
        lin = model.get_submodule(n)
        parent, attr = _parent(model, n)
        setattr(parent, attr, MPQLinear.from_float(lin, bits=bits, group_size=group_size, sym=sym, format=format,
                                                   dtype=dtype, backend=backend, trainable=trainable))
    return names
