"""Checkpoints of bie models: canonical tensors only (docs/spec.md §2), no code.

* ``save_checkpoint(model, path)``: ``*.safetensors`` through safetensors, any
  other suffix through ``torch.save`` of the plain state dict.
* ``load_checkpoint(model, path_or_state_dict)``: safetensors, or
  ``torch.load(weights_only=True)`` (nothing in a file can run code). Each bie
  layer first adopts the form the checkpoint holds (float latent weight or
  packed), so packed checkpoints load into freshly built models and the
  reverse. Then the tensors are compared with the model's before anything is
  copied: missing, unexpected, mis-shaped or wrongly typed tensors raise
  :class:`CheckpointError` naming each of them.

The backend that produced a checkpoint leaves no trace in it: backends derive
their own layouts from these tensors when they first serve a layer.
"""
from __future__ import annotations

import os
from typing import Mapping, Optional, Union

import torch
from torch import nn

from .errors import BieError
from .layers import pack
from .layers._base import _dt
from .layers._load import adopt_all
from .version import __version__

FORMAT = "bie-checkpoint"
_MAX_LISTED = 20


class CheckpointError(BieError, ValueError):
    """A checkpoint that is unreadable or does not match the model."""


def _is_safetensors(path) -> bool:
    return str(path).endswith(".safetensors")


def save_checkpoint(model: nn.Module, path: Union[str, os.PathLike], *, pack_weights: bool = False,
                    metadata: Optional[Mapping[str, str]] = None) -> None:
    """Save ``model.state_dict()``; ``pack_weights=True`` packs every bie layer first
    (inference checkpoint, smallest)."""
    if pack_weights:
        pack(model)
    sd = model.state_dict()
    # never write what load_checkpoint would refuse (a non-finite scale, say)
    problems, undo = adopt_all(model, sd)
    undo()
    if problems:
        raise CheckpointError(f"{type(model).__name__} cannot be saved: load_checkpoint would refuse it:\n"
                              + _listing("layer problems", problems))
    if _is_safetensors(path):
        from safetensors.torch import save_file
        # safetensors refuses views that share storage; clones are cheap next to the disk write
        tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in sd.items()}
        meta = {"format": "pt", "producer": FORMAT, "bie_version": __version__}
        meta.update({str(k): str(v) for k, v in (metadata or {}).items()})
        save_file(tensors, str(path), metadata=meta)
    else:
        torch.save({k: v.detach() for k, v in sd.items()}, path)


def read_checkpoint(path: Union[str, os.PathLike]) -> dict:
    """The tensors of a checkpoint file, on the CPU, without executing anything."""
    if not os.path.exists(path):
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    if os.path.isdir(path):
        raise CheckpointError(f"checkpoint {str(path)!r} is a directory; load_checkpoint reads one file "
                              "(.safetensors or a torch.save state dict); a quantized model directory loads with "
                              "bie_core.load_quantized(model, path)")
    if _is_safetensors(path):
        from safetensors.torch import load_file
        try:
            return load_file(str(path), device="cpu")
        except Exception as e:  # safetensors raises its own error types for corrupt headers/data
            raise CheckpointError(f"checkpoint {str(path)!r} is not a readable safetensors file: {e}") from e
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # pickle, zip and torch errors of a corrupt or foreign file
        raise CheckpointError(f"checkpoint {str(path)!r} cannot be loaded with torch.load(weights_only=True) "
                              f"(corrupt, or it contains objects other than tensors): {e}") from e
    if isinstance(obj, Mapping) and isinstance(obj.get("state_dict"), Mapping):
        obj = obj["state_dict"]
    if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"checkpoint {str(path)!r} does not hold a state dict of tensors "
                              f"(got {type(obj).__name__})")
    return dict(obj)


def _listing(title: str, items: list) -> str:
    shown = items[:_MAX_LISTED]
    more = f"\n    ... and {len(items) - len(shown)} more" if len(items) > len(shown) else ""
    return f"  {title} ({len(items)}):\n" + "\n".join(f"    {s}" for s in shown) + more


def check_state_dict(model: nn.Module, state_dict: Mapping[str, torch.Tensor], *, strict: bool = True,
                     source: str = "state dict") -> None:
    """Adopt the checkpoint's forms in every bie layer, then raise
    :class:`CheckpointError` if tensors are missing, unexpected, mis-shaped or
    of an incompatible dtype (integer vs floating, or a packed dtype)."""
    problems, undo = adopt_all(model, state_dict)
    try:
        _compare(model, state_dict, strict, source, problems)
    except BaseException:
        undo()   # a refused checkpoint leaves every layer as it was
        raise


def _compare(model, state_dict, strict, source, problems) -> None:
    expected = model.state_dict()
    missing = [k for k in expected if k not in state_dict]
    extra = [k for k in state_dict if k not in expected]
    untyped = [f"{k}: checkpoint holds a {type(state_dict[k]).__name__}" for k in expected
               if k in state_dict and not isinstance(state_dict[k], torch.Tensor)]
    shaped = [f"{k}: checkpoint {tuple(state_dict[k].shape)}, model {tuple(v.shape)}"
              for k, v in expected.items() if k in state_dict and isinstance(state_dict[k], torch.Tensor)
              and tuple(state_dict[k].shape) != tuple(v.shape)]
    typed = [f"{k}: checkpoint {_dt(state_dict[k].dtype)}, model {_dt(v.dtype)}"
             for k, v in expected.items() if k in state_dict and isinstance(state_dict[k], torch.Tensor)
             and (state_dict[k].is_floating_point() != v.is_floating_point()
                  or (not v.is_floating_point() and state_dict[k].dtype != v.dtype))]
    parts = []
    if missing and strict:
        parts.append(_listing("missing tensors", missing))
    if extra and strict:
        parts.append(_listing("unexpected tensors", extra))
    if untyped:
        parts.append(_listing("entries that are not tensors", untyped))
    if shaped:
        parts.append(_listing("mis-shaped tensors", shaped))
    if typed:
        parts.append(_listing("tensors of the wrong dtype", typed))
    if problems:
        parts.append(_listing("layer problems", problems))
    if parts:
        raise CheckpointError(f"{source} does not match {type(model).__name__}:\n" + "\n".join(parts))


def load_checkpoint(model: nn.Module, source: Union[str, os.PathLike, Mapping[str, torch.Tensor]], *,
                    strict: bool = True) -> nn.Module:
    """Load a checkpoint file (or a state dict) into ``model``; returns ``model``."""
    if isinstance(source, Mapping):
        sd, what = dict(source), "state dict"
    else:
        sd, what = read_checkpoint(source), f"checkpoint {str(source)!r}"
    check_state_dict(model, sd, strict=strict, source=what)
    try:
        model.load_state_dict(sd, strict=strict)
    except RuntimeError as e:  # e.g. non-finite scales, reported by the layers
        raise CheckpointError(f"{what} could not be loaded: {e}") from e
    return model
