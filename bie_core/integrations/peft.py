"""LoRA adapters on bie layers through PEFT.

Importing this module registers bie's layers with PEFT (``register()``;
idempotent), after which the usual call wraps them::

    import bie_core.integrations.peft  # noqa: F401  (registers bie layers)
    model = peft.get_peft_model(model, peft.LoraConfig(target_modules=["q_proj", "v_proj"]))

Layers wrapped: ``MPQLinear``, ``MBWQLinear``, ``QLinear`` and, when bie
provides it, ``DynamicQLinear`` (looked up by name, so it is picked up as soon
as it exists). The registration goes through PEFT's custom-module mechanism
(``LoraConfig._register_custom_module``): ``register()`` makes every
``LoraConfig`` that meets a bie layer carry the mapping to ``BieLoraLinear``,
so a plain ``LoraConfig`` works. ``register_on(config)`` does the same for one
config only, without the global hook.

``BieLoraLinear`` computes ``base(x) + B(A(dropout(x))) * scaling``: the bie
layer runs its own kernels (frozen, or trainable packed weights if it was
built so), the adapter is float (in the dtype PEFT gives it, float32 unless
the base layer has a float weight). Gradients reach A, B and the input
through the bie layer's backward.

Merging (``merge()``, ``merge_and_unload()``):

* weight-only layers (``MPQLinear``, ``MBWQLinear``): the base layer is
  **dequantized into a float** ``nn.Linear`` holding ``W + scaling * B A``
  (the packed weight cannot absorb a low-rank update without re-rounding it).
  ``merge_and_unload()`` therefore returns a float model at those positions.
  ``unmerge()`` subtracts the updates and, once no adapter is merged, puts
  the original packed layer back (exactly as it was);
* ``QLinear`` / ``DynamicQLinear`` quantize their *input* as well, so no weight
  reproduces "quantized base + float adapter": merging refuses with a
  ``ValueError`` that says so. Keep the adapter unmerged, or dequantize
  yourself.

DoRA and the other LoRA variants are refused (plain LoRA only).
"""
from __future__ import annotations

import inspect
from typing import Optional

import torch
from torch import nn

from peft.tuners.lora import LoraConfig, LoraModel
from peft.tuners.lora.layer import LoraLayer
from peft.tuners.tuners_utils import BaseTunerLayer

from ..layers.integer import QLinear
from ..layers.weight_only import MBWQLinear, MPQLinear
from ._float import WEIGHT_ONLY, effective_weight, to_float_linear


def bie_layer_types() -> tuple:
    """The bie layer classes LoRA wraps (DynamicQLinear when bie has it)."""
    types = [MPQLinear, MBWQLinear, QLinear]
    try:
        from ..layers import dynamic as _dynamic
    except ImportError:
        _dynamic = None
    dyn = getattr(_dynamic, "DynamicQLinear", None) if _dynamic is not None else None
    if dyn is not None:
        types.append(dyn)
    return tuple(types)


def _merge_refusal(base: nn.Module) -> str:
    return (f"{type(base).__name__} quantizes its input as well as its weight, so no single weight reproduces "
            "'quantized layer + float LoRA adapter': merging is refused. Keep the adapter unmerged (it runs "
            "next to the layer), or replace the layer by a float nn.Linear first")


class BieLoraLinear(nn.Module, LoraLayer):
    """A LoRA adapter around a bie linear layer (see the module doc)."""

    adapter_layer_names = ("lora_A", "lora_B")

    def __init__(self, base_layer: nn.Module, adapter_name: str, config: Optional[LoraConfig] = None, r: int = 0,
                 lora_alpha: int = 1, **kwargs):
        super().__init__()
        LoraLayer.__init__(self, base_layer)
        base = self.get_base_layer()
        self.in_features, self.out_features = base.in_features, base.out_features
        self.__dict__["_bie_packed"] = None        # the packed layer while merged (not a submodule)
        self._active_adapter = adapter_name
        self._add_adapter(adapter_name, r, lora_alpha, config, kwargs)

    def _get_in_out_features(self, module):
        return module.in_features, module.out_features

    def resolve_lora_variant(self, *, config, **kwargs):
        for flag in ("use_dora", "use_qalora"):
            if getattr(config, flag, False):
                raise ValueError(f"BieLoraLinear: {flag}=True is not supported on bie layers (plain LoRA only)")
        if getattr(config, "velora_config", None) is not None:
            raise ValueError("BieLoraLinear: VeLoRA is not supported on bie layers (plain LoRA only)")
        return None

    def _add_adapter(self, adapter_name, r, lora_alpha, config, kwargs) -> None:
        # peft >= 0.18 passes the LoraConfig; older versions pass its fields
        params = inspect.signature(LoraLayer.update_layer).parameters
        if "config" in params:
            self.update_layer(adapter_name, r, lora_alpha=lora_alpha, config=config,
                              **{k: v for k, v in kwargs.items() if k in ("target_name", "tied_adapter")})
        else:
            fields = {k: (getattr(config, k) if config is not None else kwargs.get(k)) for k in
                      ("lora_dropout", "init_lora_weights", "use_rslora", "use_dora", "lora_bias") if k in params}
            fields = {k: v for k, v in fields.items() if v is not None}
            self.update_layer(adapter_name, r, lora_alpha=lora_alpha, **fields)

    # ---------------------------------------------------------------- forward
    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if self.disable_adapters:
            if self.merged:
                self.unmerge()
            return self.base_layer(x, *args, **kwargs)
        result = self.base_layer(x, *args, **kwargs)
        if self.merged:
            return result
        for name in self.active_adapters:
            if name not in self.lora_A:
                continue
            a, b = self.lora_A[name], self.lora_B[name]
            xa = x.to(a.weight.dtype)
            delta = b(a(self.lora_dropout[name](xa))) * self.scaling[name]
            result = result + delta.to(result.dtype)
        return result

    # ---------------------------------------------------------------- merging
    def get_delta_weight(self, adapter: str) -> torch.Tensor:
        """``scaling * B @ A``, (out_features, in_features), float32."""
        a = self.lora_A[adapter].weight.to(torch.float32)
        b = self.lora_B[adapter].weight.to(torch.float32)
        return (b @ a) * self.scaling[adapter]

    def merge(self, safe_merge: bool = False, adapter_names=None) -> None:
        base = self.get_base_layer()
        packed = self.__dict__["_bie_packed"]
        if packed is None and not isinstance(base, WEIGHT_ONLY):
            raise ValueError(_merge_refusal(base))
        names = [n for n in (adapter_names if adapter_names is not None else self.active_adapters)
                 if n in self.lora_A and n not in self.merged_adapters]
        if not names:
            return
        if packed is None:     # first merge: dequantize into a float layer
            self.__dict__["_bie_packed"] = base
            base = to_float_linear(base)
            self.base_layer = base
        with torch.no_grad():
            w = base.weight.to(torch.float32)
            for n in names:
                w = w + self.get_delta_weight(n).to(w.device)
            if safe_merge and not bool(torch.isfinite(w).all()):
                raise ValueError(f"BieLoraLinear.merge: merging adapters {names} gives non-finite weights")
            base.weight.copy_(w.to(base.weight.dtype))
        self.merged_adapters.extend(names)

    def unmerge(self) -> None:
        if not self.merged:
            return
        base = self.get_base_layer()
        with torch.no_grad():
            while self.merged_adapters:
                n = self.merged_adapters.pop()
                base.weight.sub_(self.get_delta_weight(n).to(base.weight.device, base.weight.dtype))
        packed = self.__dict__["_bie_packed"]
        if packed is not None:          # no adapter merged any more: the packed layer, exactly as it was
            self.base_layer = packed
            self.__dict__["_bie_packed"] = None

    def __repr__(self) -> str:
        return "lora." + super().__repr__()


# ---------------------------------------------------------------- registration
def register_on(config: LoraConfig) -> LoraConfig:
    """Register bie's layers on one ``LoraConfig`` (PEFT's custom-module API)."""
    config._register_custom_module({t: BieLoraLinear for t in bie_layer_types()})
    return config


def register() -> None:
    """Make every LoraConfig that targets a bie layer wrap it with
    ``BieLoraLinear`` (done on import; idempotent)."""
    current = LoraModel.__dict__.get("_create_new_module")
    fn = current.__func__ if isinstance(current, staticmethod) else current
    if getattr(fn, "_bie_registration", False):
        return

    def _create_new_module(lora_config, adapter_name, target, **kwargs):
        base = target.get_base_layer() if isinstance(target, BaseTunerLayer) else target
        types = bie_layer_types()
        if isinstance(base, types) and type(base) not in (getattr(lora_config, "_custom_modules", None) or {}):
            register_on(lora_config)
        return fn(lora_config, adapter_name, target, **kwargs)

    _create_new_module._bie_registration = True
    LoraModel._create_new_module = staticmethod(_create_new_module)


register()

__all__ = ["BieLoraLinear", "register", "register_on", "bie_layer_types", "effective_weight"]
