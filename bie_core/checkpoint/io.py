"""Reading and writing checkpoint files: safetensors (single or sharded) and
``torch.load(weights_only=True)``; nothing from a file is ever executed."""
from __future__ import annotations

import json
import os
from typing import Mapping, Optional, Union

import torch

from ..serialize import CheckpointError  # one error type for every bad checkpoint

QUANT_CONFIG_FILES = ("quantize_config.json", "quant_config.json")


def _load_safetensors(path: str) -> dict:
    from safetensors.torch import load_file
    try:
        return load_file(path)
    except Exception as e:  # safetensors raises its own error types
        raise CheckpointError(f"cannot read {path}: {e} (truncated, or not a safetensors file?)") from e


def _load_torch(path: str) -> dict:
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"cannot read {path} with torch.load(weights_only=True): {e}") from e
    if not isinstance(sd, Mapping):
        raise CheckpointError(f"{path} holds a {type(sd).__name__}, not a state dict")
    return dict(sd)


def read_tensors(path: str) -> dict:
    """All tensors of a checkpoint file or directory (sharded safetensors included)."""
    if os.path.isdir(path):
        index = os.path.join(path, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                shards = sorted(set(json.load(f).get("weight_map", {}).values()))
            if not shards:
                raise CheckpointError(f"{index} has an empty weight_map")
            out: dict = {}
            for s in shards:
                out.update(_load_safetensors(os.path.join(path, s)))
            return out
        files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
        if not files:
            pt = [f for f in os.listdir(path) if f.endswith((".bin", ".pt", ".pth"))]
            if not pt:
                raise CheckpointError(f"{path} holds no .safetensors (or .bin/.pt) file")
            out = {}
            for f in sorted(pt):
                out.update(_load_torch(os.path.join(path, f)))
            return out
        out = {}
        for f in files:
            out.update(_load_safetensors(os.path.join(path, f)))
        return out
    if not os.path.exists(path):
        raise CheckpointError(f"checkpoint {path} does not exist")
    if path.endswith(".safetensors"):
        return _load_safetensors(path)
    return _load_torch(path)


def read_quant_config(path: Optional[str]) -> Optional[dict]:
    """quantize_config.json / quant_config.json, or config.json's
    ``quantization_config``, next to (or inside) ``path``."""
    if path is None:
        return None
    d = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    for name in QUANT_CONFIG_FILES:
        p = os.path.join(d, name)
        if os.path.exists(p):
            with open(p) as f:
                return json.load(f)
    p = os.path.join(d, "config.json")
    if os.path.exists(p):
        with open(p) as f:
            cfg = json.load(f)
        q = cfg.get("quantization_config")
        if isinstance(q, dict):
            return q
    return None


def write_safetensors(tensors: Mapping[str, torch.Tensor], path: str, metadata: Optional[dict] = None) -> None:
    """Write tensors (made contiguous; tensors sharing memory written once,
    like tied embeddings) to ``path``."""
    from safetensors.torch import save_file
    seen, out = {}, {}
    for k, t in tensors.items():
        t = t.detach()
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype) if t.numel() else None
        if key is not None and key in seen:
            continue
        if key is not None:
            seen[key] = k
        out[k] = t.contiguous().cpu()
    save_file(out, path, metadata=metadata or {"format": "pt"})


def as_state_dict(source: Union[str, os.PathLike, Mapping[str, torch.Tensor]]) -> tuple:
    """(tensors, path or None) for a path or an in-memory state dict."""
    if isinstance(source, Mapping):
        return dict(source), None
    path = os.fspath(source)
    return read_tensors(path), path
