"""The ``"bie"`` quantization method of Hugging Face transformers.

Importing this module registers the method (transformers' public
``register_quantization_config`` / ``register_quantizer``)::

    from bie_core.integrations.transformers import BieConfig
    model = AutoModelForCausalLM.from_pretrained(path, quantization_config=BieConfig(bits=4, group_size=128))

What ``from_pretrained`` then does depends on the checkpoint at ``path``:

* **A GPTQ checkpoint** (AutoGPTQ / GPTQModel / transformers layout:
  ``qweight``/``qzeros``/``scales``/``g_idx``, zero points v1 or v2, act-order
  or not) or **a GreenBit (GBA) checkpoint** (float ``scales``/``zeros`` or the
  double-quantized ``qstatistic``): before any weight is read, every
  ``nn.Linear`` that the checkpoint stores quantized is replaced by a
  placeholder holding exactly the packed tensors of the file (shapes read from
  the file headers), so the float weights are never allocated on any device.
  transformers loads the packed tensors into it like any buffer; each
  placeholder then becomes an ``MPQLinear`` through ``bie_core.load_quantized``
  (v1 zero points converted to bie's v2, GBA statistics decoded). The
  checkpoint's quantization config (``bits``, ``group_size``, ``sym``,
  ``desc_act``, ``checkpoint_format``) wins over the ``BieConfig`` fields;
  ``backend`` and ``trainable`` always come from ``BieConfig``.
* **A float checkpoint**: every ``nn.Linear`` except those named in ``skip``
  is quantized by round-to-nearest after loading (``MPQLinear.from_float``:
  ``bits`` 2/3/4/8 (1 too), ``group_size``, ``sym``), one layer at a time.
  With a single-device ``device_map`` on an accelerator the model loads on
  the CPU and each linear visits the accelerator alone to be quantized there,
  so the float model is never on the accelerator as a whole; other device
  maps (``"auto"``, several devices) load the float layers where the map puts
  them and quantize them in place.

``model.save_pretrained(dir)`` writes ``model.safetensors`` in the GPTQ layout
and the ``quantization_config`` of a GPTQ checkpoint into ``config.json``
(``quant_method: "gptq"``; ``checkpoint_format`` ``"gptq"`` = v1 when every
zero point can be stored as ``z - 1``, else ``"gptq_v2"``), which
``bie_core.load_quantized``, GPTQ tools and this integration read back. Layers
with GreenBit float zeros are written in the GBA layout (``quant_method:
"gba"``), which bie reads back. Loading such a checkpoint again needs the
``BieConfig`` argument: without it transformers picks its own GPTQ quantizer.

A GPTQ checkpoint's ``config.json`` names ``quant_method: "gptq"``, and
transformers refuses a ``quantization_config`` argument of another class for
it. This module therefore also wraps ``AutoHfQuantizer.merge_quantization_configs``
so that a ``BieConfig`` argument takes over GPTQ and GreenBit checkpoints (and
only those: any other combination goes to transformers unchanged).
"""
from __future__ import annotations

import os
import sys
from typing import Optional

import torch
from torch import nn

from transformers.quantizers import AutoHfQuantizer, HfQuantizer, register_quantization_config, register_quantizer
from transformers.utils.quantization_config import QuantizationConfigMixin

from ..checkpoint import CheckpointError, load_quantized, quantize_model
from ..checkpoint.io import read_quant_config
from ..checkpoint.loader import LAYER_KEYS
from ..layers.weight_only import GROUP_SIZES, MPQLinear
from ..ops import weight_only as _wq_ops

METHOD = "bie"
#: quant_method values of the checkpoints a BieConfig argument takes over
GPTQ_METHODS = ("gptq",)
GBA_METHODS = ("gba", "greenbit", "bitorch")
_CHECKPOINT_FORMATS = {None: None, "gptq": "gptq", "v1": "gptq", "gptq_v1": "gptq", "gptq_v2": "gptq_v2",
                       "v2": "gptq_v2"}


def _name(v) -> str:
    return getattr(v, "value", v)


class BieConfig(QuantizationConfigMixin):
    """Quantization config of the ``"bie"`` method.

    Args:
        bits: width of the weight codes when quantizing a float checkpoint
            (1, 2, 3, 4 or 8); for a quantized checkpoint, used only when the
            checkpoint's config does not say.
        group_size: rows per group (16 ... 1024, powers of two, or -1: one group).
        sym: symmetric quantization (float checkpoints).
        skip: names (or name suffixes) of linears left in float when
            quantizing a float checkpoint (default: the LM head).
        backend: per-layer bie backend preference (``"cuda"``, ``"cpu"``...;
            None: automatic).
        trainable: make the packed weights trainable (bie's packed-weight
            fine-tuning); LoRA adapters do not need it.
        checkpoint_format: zero-point convention of a GPTQ checkpoint,
            ``"gptq"`` (v1, stored ``z - 1``) or ``"gptq_v2"``; None: the
            checkpoint's config, else v1. Also what ``save_pretrained`` last wrote.
        desc_act: act-order of the checkpoint (recorded; its ``g_idx`` decides).
        source: the checkpoint flavour, ``"gptq"`` or ``"gba"`` (GreenBit);
            filled in from the checkpoint (None: a float checkpoint, or not yet known).
    """

    def __init__(self, bits: int = 4, group_size: int = 128, sym: bool = False, skip=("lm_head",),
                 backend: Optional[str] = None, trainable: bool = False, checkpoint_format: Optional[str] = None,
                 desc_act: Optional[bool] = None, source: Optional[str] = None, **kwargs):
        self.quant_method = METHOD
        self.bits, self.group_size, self.sym = bits, group_size, bool(sym)
        self.skip = (skip,) if isinstance(skip, str) else tuple(skip or ())
        self.backend, self.trainable = backend, bool(trainable)
        self.checkpoint_format, self.desc_act, self.source = checkpoint_format, desc_act, source
        self.checkpoint_says = ()      # the fields a quantized checkpoint's config stated
        self.post_init()

    def post_init(self):
        from ..ops.weight_only import WQ_BITS
        if isinstance(self.bits, bool) or self.bits not in WQ_BITS:
            raise ValueError(f"BieConfig: bits={self.bits!r} is not supported; allowed: {list(WQ_BITS)}")
        if isinstance(self.group_size, bool) or self.group_size not in GROUP_SIZES:
            raise ValueError(f"BieConfig: group_size={self.group_size!r} is not supported; "
                             f"allowed: {list(GROUP_SIZES)}")
        if self.checkpoint_format is not None and str(self.checkpoint_format).lower() not in _CHECKPOINT_FORMATS:
            raise ValueError(f"BieConfig: checkpoint_format={self.checkpoint_format!r} is not a GPTQ zero "
                             "convention; allowed: 'gptq' (v1, stored z - 1), 'gptq_v2' (stored z), None")
        self.checkpoint_format = _CHECKPOINT_FORMATS[None if self.checkpoint_format is None
                                                     else str(self.checkpoint_format).lower()]
        if self.source not in (None, "gptq", "gba"):
            raise ValueError(f"BieConfig: source={self.source!r}; allowed: 'gptq', 'gba', None")
        if not all(isinstance(s, str) for s in self.skip):
            raise TypeError(f"BieConfig: skip must be module names, got {self.skip!r}")

    # ------------------------------------------------------------ (de)serialising
    def to_dict(self) -> dict:
        """The ``quantization_config`` of the checkpoint ``save_pretrained``
        writes: a GPTQ config (GBA for GreenBit layers) that GPTQ tools read,
        with bie's own options under ``"bie"``."""
        out = {"quant_method": "gba" if self.source == "gba" else "gptq", "bits": self.bits,
               "group_size": self.group_size, "sym": self.sym, "desc_act": bool(self.desc_act)}
        if self.source != "gba":
            out["checkpoint_format"] = self.checkpoint_format or "gptq"
        out["bie"] = {"skip": list(self.skip), "backend": self.backend, "trainable": self.trainable}
        return out

    @classmethod
    def from_dict(cls, config_dict, return_unused_kwargs=False, **kwargs):
        d = dict(config_dict)
        extra = d.pop("bie", None) or {}
        method = str(_name(d.pop("quant_method", METHOD))).lower()
        cfg = cls(**{**_config_fields(d, method), **extra})
        for k in [k for k in kwargs if hasattr(cfg, k)]:
            setattr(cfg, k, kwargs.pop(k))
        return (cfg, kwargs) if return_unused_kwargs else cfg

    def adopt_checkpoint(self, checkpoint_config: dict) -> "BieConfig":
        """A copy of this config describing a quantized checkpoint: its
        bits / group size / symmetry / act-order / zero convention, and this
        config's backend, trainable flag and skip list."""
        d = dict(checkpoint_config)
        method = str(_name(d.get("quant_method", "gptq"))).lower()
        fields = {"bits": self.bits, "group_size": self.group_size, "sym": self.sym, "skip": self.skip,
                  "backend": self.backend, "trainable": self.trainable, "checkpoint_format": self.checkpoint_format}
        found = _config_fields(d, method)
        fields.update(found)
        if self.checkpoint_format is not None:     # an explicit argument overrides the file
            fields["checkpoint_format"] = self.checkpoint_format
        out = type(self)(**fields)
        out.checkpoint_says = tuple(sorted(found))
        return out


def _config_fields(d: dict, method: str) -> dict:
    """BieConfig fields from a checkpoint's quantization config."""
    out = {}
    for k in ("bits", "group_size", "sym", "desc_act", "skip", "backend", "trainable", "source"):
        if d.get(k) is not None:
            out[k] = d[k]
    fmt = d.get("checkpoint_format", d.get("format"))
    if fmt is not None and str(fmt).lower() in _CHECKPOINT_FORMATS:
        out["checkpoint_format"] = str(fmt).lower()
    if method in GPTQ_METHODS:
        out.setdefault("source", "gptq")
    elif method in GBA_METHODS:
        out.setdefault("source", "gba")
    return out


# ----------------------------------------------------------------- the placeholder
class PackedCheckpointLinear(nn.Module):
    """Stands where a quantized linear of the checkpoint will be, from model
    construction to the end of weight loading: its buffers have the names,
    shapes and dtypes of that layer's tensors in the file (on the meta device
    until transformers fills them), so no float weight is ever allocated.
    Replaced by an ``MPQLinear`` once loading is done; calling it is an error."""

    def __init__(self, in_features: int, out_features: int, tensors: dict):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        for key, (shape, dtype) in tensors.items():
            self.register_buffer(key, torch.empty(shape, dtype=dtype, device="meta"))

    def forward(self, x):
        raise RuntimeError(f"{type(self).__name__}({self.in_features} -> {self.out_features}): the checkpoint's "
                           "packed tensors were not converted to a bie layer (loading did not finish)")


_ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
              "BOOL": torch.bool}


def tensor_specs(files) -> dict:
    """name -> (shape, dtype) of every tensor in the checkpoint files, read
    from the safetensors headers (or a meta-device ``torch.load``): no data."""
    specs = {}
    for f in files or ():
        f = os.fspath(f)
        if f.endswith(".safetensors"):
            from safetensors import safe_open
            with safe_open(f, framework="pt") as h:
                for k in h.keys():
                    sl = h.get_slice(k)
                    dt = sl.get_dtype()
                    if dt not in _ST_DTYPES:
                        raise CheckpointError(f"bie: {f}: tensor {k!r} has dtype {dt}, which bie does not read")
                    specs[k] = (tuple(sl.get_shape()), _ST_DTYPES[dt])
        else:
            sd = torch.load(f, map_location="meta", weights_only=True)
            specs.update({k: (tuple(v.shape), v.dtype) for k, v in sd.items() if isinstance(v, torch.Tensor)})
    return specs


def _holder(prefix: str, in_features: int, out_features: int, bias: bool) -> nn.Module:
    """A module tree with one meta nn.Linear at ``prefix`` (so that the
    loader's messages name the real layer)."""
    root = nn.Module()
    parent = root
    parts = prefix.split(".")
    for p in parts[:-1]:
        child = nn.Module()
        parent.add_module(p, child)
        parent = child
    parent.add_module(parts[-1], nn.Linear(in_features, out_features, bias=bias, device="meta"))
    return root


def _set(model: nn.Module, name: str, module: nn.Module) -> None:
    if "." in name:
        pname, attr = name.rsplit(".", 1)
        setattr(model.get_submodule(pname), attr, module)
    else:
        setattr(model, name, module)


# ----------------------------------------------------------------- the quantizer
class BieHfQuantizer(HfQuantizer):
    """transformers' side of the ``"bie"`` method (see the module doc)."""

    requires_calibration = False
    required_packages = None

    def __init__(self, quantization_config, **kwargs):
        super().__init__(quantization_config, **kwargs)
        self._dtype = None
        self._target_device = None

    def validate_environment(self, *args, **kwargs):
        return

    def update_dtype(self, dtype):
        self._dtype = dtype
        return dtype

    def update_device_map(self, device_map):
        # A float checkpoint bound for one accelerator loads on the CPU; each
        # linear then visits the accelerator alone to be quantized there, so
        # the float model is never on the accelerator as a whole. (A GreenBit
        # checkpoint whose quant_method transformers does not know comes this
        # way too: its packed tensors move after conversion.)
        self._target_device = None
        if not self.pre_quantized and isinstance(device_map, dict) and set(device_map) == {""}:
            dev = torch.device(device_map[""]) if not isinstance(device_map[""], int) else \
                torch.device("cuda", device_map[""])
            if dev.type not in ("cpu", "meta", "disk"):
                self._target_device = dev
                return {"": torch.device("cpu")}
        return device_map

    def _checkpoint_config(self, files) -> dict:
        found = read_quant_config(os.fspath(files[0])) if files else None
        return dict(found or {})

    def _process_model_before_weight_loading(self, model, **kwargs):
        files = kwargs.get("checkpoint_files") or []
        specs = tensor_specs(files)
        prefixes = sorted(k[: -len(".qweight")] for k in specs if k.endswith(".qweight"))
        self._packed = []
        if not prefixes:
            if self.pre_quantized:
                raise CheckpointError("bie: the model's config says it is quantized but its checkpoint has no "
                                      "'<layer>.qweight' tensor (or transformers did not give the checkpoint files)")
            return model
        # a GPTQ/GBA checkpoint: its own config describes it
        self.pre_quantized = True
        ck = self._checkpoint_config(files)
        if ck:
            self.quantization_config = self.quantization_config.adopt_checkpoint(ck)
        modules = dict(model.named_modules())
        for prefix in prefixes:
            mod = modules.get(prefix)
            if mod is None:
                raise CheckpointError(f"bie: the checkpoint has a quantized layer '{prefix}' but the model has no "
                                      "such module (checkpoint of another model?)")
            if not isinstance(mod, nn.Linear):
                raise CheckpointError(f"bie: '{prefix}' is a {type(mod).__name__} in the model; quantized "
                                      "checkpoints replace nn.Linear layers only")
            tensors = {k: specs[f"{prefix}.{k}"] for k in LAYER_KEYS if f"{prefix}.{k}" in specs}
            _set(model, prefix, PackedCheckpointLinear(mod.in_features, mod.out_features, tensors))
            self._packed.append(prefix)
        return model

    def _loader_config(self) -> dict:
        """What load_quantized is told: the checkpoint's own bits and group
        size where its config states them, else nothing for a GPTQ layer (the
        shapes tell) and BieConfig's bits for a GreenBit one (they cannot)."""
        c = self.quantization_config
        says = set(getattr(c, "checkpoint_says", ()))
        out = {"sym": c.sym}
        if "bits" in says or c.source == "gba":
            out["bits"] = c.bits
        if "group_size" in says:
            out["group_size"] = c.group_size
        if c.source != "gba":
            out["checkpoint_format"] = c.checkpoint_format or "gptq"
        return out

    def _process_model_after_weight_loading(self, model, **kwargs):
        c = self.quantization_config
        if getattr(self, "_packed", None):
            cfg = self._loader_config()
            for prefix in self._packed:
                slot = model.get_submodule(prefix)
                tensors = {k: v for k, v in slot.named_buffers()}
                meta = [k for k, v in tensors.items() if v.is_meta]
                if meta:
                    raise CheckpointError(f"bie: '{prefix}': {meta} were not loaded from the checkpoint")
                holder = _holder(prefix, slot.in_features, slot.out_features, "bias" in tensors)
                sd = {f"{prefix}.{k}": v for k, v in tensors.items()}
                dtype = self._dtype if self._dtype in (torch.float16, torch.bfloat16, torch.float32) else None
                load_quantized(holder, sd, quantize_config=cfg, dtype=dtype, backend=c.backend,
                               trainable=c.trainable)
                _set(model, prefix, holder.get_submodule(prefix))
                del slot, tensors, sd, holder
            layers = [m for m in model.modules() if isinstance(m, MPQLinear)]
            if layers:       # describe what was loaded (the file's config may have said less)
                if c.source is None:
                    c.source = "gba" if all(m.format == "gba" for m in layers) else "gptq"
                c.desc_act = any(m.act_order for m in layers)
                kinds = {(m.bits, m.group_size, m.sym) for m in layers}
                if len(kinds) == 1:
                    c.bits, c.group_size, _ = kinds.pop()
            self._packed = []
        elif not self.pre_quantized:
            self._quantize_float_model(model)
        dev = getattr(self, "_target_device", None)
        if dev is not None:
            model.to(dev)
        if "peft" in sys.modules:            # LoRA on these layers needs bie's PEFT registration
            from . import peft as _peft
            _peft.register()
        return model

    def _quantize_float_model(self, model) -> None:
        """Round-to-nearest quantization of every nn.Linear not in ``skip``,
        one layer at a time on the target device (when loading went through
        the CPU), through ``bie_core.quantize_model``."""
        c = self.quantization_config
        dev = getattr(self, "_target_device", None)
        names = [n for n, m in model.named_modules() if type(m) is nn.Linear
                 and not any(n == s or n.endswith("." + s) for s in c.skip)]
        for n in names:
            holder = nn.Module()
            holder.layer = model.get_submodule(n)
            if dev is not None:
                holder.layer.to(dev)
            quantize_model(holder, bits=c.bits, group_size=c.group_size, sym=c.sym, skip=(), backend=c.backend,
                           trainable=c.trainable)
            _set(model, n, holder.layer)
            del holder
        c.source = "gptq"

    # ----------------------------------------------------------------- saving
    def get_state_dict_and_metadata(self, model, *args, **kwargs):
        """The GPTQ layout (GBA for GreenBit layers) that ``save_pretrained``
        writes, and the matching ``quantization_config``."""
        from ..layers.shared_input import require_unfused
        require_unfused(model, "bie save_pretrained")
        layers = {n: m for n, m in model.named_modules() if isinstance(m, MPQLinear)}
        if not layers:
            return None, {}
        keys = {(m.bits, m.group_size, m.sym, m.format) for m in layers.values()}
        if len(keys) != 1:
            raise ValueError(f"bie save_pretrained: the MPQLinear layers differ in (bits, group_size, sym, format): "
                             f"{sorted(keys)}; one quantization_config cannot describe them")
        bits, gs, sym, fmt = keys.pop()
        c = self.quantization_config
        c.bits, c.group_size, c.sym = bits, gs, sym
        c.desc_act = any(m.act_order for m in layers.values())
        out, covered = {}, set()
        if fmt == "gptq":
            zero_is_zero = any(bool((_wq_ops.wq_unpack(m.zeros, m.bits, m.out_features, 1) == 0).any())
                               for m in layers.values())
            conv = "v2" if zero_is_zero else "v1"
            c.source, c.checkpoint_format = "gptq", ("gptq_v2" if zero_is_zero else "gptq")
            for name, m in layers.items():
                out.update({f"{name}.{k}": v for k, v in m.to_gptq(conv).items()})
                covered.update(f"{name}.{k}" for k in m.state_dict())
        else:
            c.source, c.checkpoint_format = "gba", None
        for k, v in model.state_dict().items():
            if k not in covered:
                out[k] = v
        return out, {}

    # -------------------------------------------------------------- features
    def is_serializable(self, *args, **kwargs):
        return True

    @property
    def is_trainable(self) -> bool:
        # adapters (PEFT LoRA) train on frozen bie layers: gradients flow to
        # the input through every bie layer
        return True

    @property
    def is_qat_trainable(self) -> bool:
        # the packed weights themselves train (bie's packed-weight optimizer
        # hook) when the layers were built trainable
        return bool(self.quantization_config.trainable)

    @property
    def is_compileable(self) -> bool:
        # bie ops are torch.library custom ops with fake kernels: they trace
        # under torch.compile(fullgraph=True)
        return True

    def _dequantize(self, model, dtype=None):
        from ._float import dequantize_model
        return dequantize_model(model, dtype=dtype)


# --------------------------------------------------------------- registration
def _install_merge_rule() -> None:
    """Let a BieConfig argument take over GPTQ / GreenBit checkpoints (whose
    config.json names another quant_method); everything else unchanged."""
    current = AutoHfQuantizer.__dict__.get("merge_quantization_configs")
    if getattr(current, "__func__", None) is not None and getattr(current.__func__, "_bie_rule", False):
        return
    original = AutoHfQuantizer.merge_quantization_configs      # bound classmethod

    def merge_quantization_configs(cls, quantization_config, quantization_config_from_args):
        if isinstance(quantization_config_from_args, BieConfig):
            ck = quantization_config if isinstance(quantization_config, dict) else quantization_config.to_dict()
            method = str(_name(ck.get("quant_method", ""))).lower()
            if method in GPTQ_METHODS + GBA_METHODS:
                return quantization_config_from_args.adopt_checkpoint(ck)
            if method == METHOD:
                return BieConfig.from_dict(ck)
        return original(quantization_config, quantization_config_from_args)

    merge_quantization_configs._bie_rule = True
    AutoHfQuantizer.merge_quantization_configs = classmethod(merge_quantization_configs)


def register() -> None:
    """Register the ``"bie"`` method with transformers (done on import; idempotent)."""
    from transformers.quantizers import auto
    if auto.AUTO_QUANTIZATION_CONFIG_MAPPING.get(METHOD) is not BieConfig:
        auto.AUTO_QUANTIZATION_CONFIG_MAPPING.pop(METHOD, None)   # a stale class from a reloaded module
        register_quantization_config(METHOD)(BieConfig)
    # bie's GreenBit checkpoints say quant_method "gba": no other library
    # claims the name, so they load with or without a BieConfig argument
    if auto.AUTO_QUANTIZATION_CONFIG_MAPPING.get("gba") is not BieConfig:
        auto.AUTO_QUANTIZATION_CONFIG_MAPPING.pop("gba", None)
        register_quantization_config("gba")(BieConfig)
    if auto.AUTO_QUANTIZER_MAPPING.get(METHOD) is not BieHfQuantizer:
        auto.AUTO_QUANTIZER_MAPPING.pop(METHOD, None)
        register_quantizer(METHOD)(BieHfQuantizer)
    _install_merge_rule()


register()

__all__ = ["BieConfig", "BieHfQuantizer", "PackedCheckpointLinear", "register", "tensor_specs", "METHOD"]
