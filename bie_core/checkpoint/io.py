"""Reading and writing checkpoint files: safetensors (single or sharded) and
``torch.load(weights_only=True)``; nothing from a file is ever executed."""
from __future__ import annotations

import json
import os
import stat
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


#: Largest JSON file read (quantize_config.json, config.json): far above any
#: real config, far below what would exhaust memory.
MAX_CONFIG_BYTES = 4 << 20
#: Largest shard index read (one entry per tensor: a few MB for the largest models).
MAX_INDEX_BYTES = 64 << 20
INDEX_FILE = "model.safetensors.index.json"


def read_json(path: str, limit: int = MAX_CONFIG_BYTES) -> dict:
    """A JSON object from a regular file of at most ``limit`` bytes; every
    problem is a :class:`CheckpointError` naming the file."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e}") from e
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointError(f"{path} is not a regular file (a device, pipe or directory, or a link to one); "
                              "a checkpoint's JSON files must be plain files")
    if st.st_size > limit:
        raise CheckpointError(f"{path} has {st.st_size} bytes; at most {limit} are read from a checkpoint's JSON file")
    try:
        with open(path, "rb") as f:
            raw = f.read(limit + 1)
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e}") from e
    if len(raw) > limit:
        raise CheckpointError(f"{path} has more than {limit} bytes; at most {limit} are read from a checkpoint's "
                              "JSON file")
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path} holds a JSON {type(obj).__name__}, expected an object")
    return obj


def _inside(root: str, name, index: str) -> str:
    """The path of shard ``name`` of ``index``, which must stay in ``root``."""
    if not isinstance(name, str) or not name or os.path.isabs(name) or ".." in name.replace("\\", "/").split("/"):
        raise CheckpointError(f"{index}: weight_map names shard {name!r}; shards must be file names relative to the "
                              "checkpoint directory (no absolute paths, no '..')")
    p = os.path.join(root, name)
    real_root = os.path.realpath(root)
    if os.path.commonpath([os.path.realpath(p), real_root]) != real_root:
        raise CheckpointError(f"{index}: shard {name!r} resolves to {os.path.realpath(p)}, outside the checkpoint "
                              f"directory {real_root}")
    return p


def _merge(out: dict, part: dict, where: str) -> None:
    dup = sorted(set(out) & set(part))
    if dup:
        raise CheckpointError(f"{where} repeats tensors another file of the checkpoint holds: {dup[:5]}")
    out.update(part)


def read_tensors(path: str) -> dict:
    """All tensors of a checkpoint file or directory (sharded safetensors included)."""
    if os.path.isdir(path):
        index = os.path.join(path, INDEX_FILE)
        if os.path.exists(index):
            wm = read_json(index, MAX_INDEX_BYTES).get("weight_map", {})
            if not isinstance(wm, dict):
                raise CheckpointError(f"{index}: weight_map must be an object of tensor name -> shard file")
            shards = sorted(set(_inside(path, s, index) for s in wm.values()))
            if not shards:
                raise CheckpointError(f"{index} has an empty weight_map")
            out: dict = {}
            for s in shards:
                _merge(out, _load_safetensors(s), s)
            return out
        files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
        if not files:
            files = sorted(f for f in os.listdir(path) if f.endswith((".bin", ".pt", ".pth")))
            if not files:
                raise CheckpointError(f"{path} holds no .safetensors (or .bin/.pt) file")
        if len(files) > 1:
            raise CheckpointError(f"{path} holds {len(files)} weight files ({files[:5]}) and no {INDEX_FILE}: "
                                  "which of them form the checkpoint is ambiguous; add the index (what sharded "
                                  "checkpoints ship) or pass one file")
        f = _inside(path, files[0], path)
        return _load_safetensors(f) if f.endswith(".safetensors") else _load_torch(f)
    if not os.path.exists(path):
        raise CheckpointError(f"checkpoint {path} does not exist")
    if path.endswith(".safetensors"):
        return _load_safetensors(path)
    return _load_torch(path)


def read_quant_config(path: Optional[str]) -> Optional[dict]:
    """quantize_config.json / quant_config.json, or config.json's
    ``quantization_config``, next to (or inside) ``path``. The returned dict
    names its file under ``"__file__"`` (for error messages)."""
    if path is None:
        return None
    d = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    for name in QUANT_CONFIG_FILES:
        p = os.path.join(d, name)
        if os.path.lexists(p):
            return dict(read_json(p), __file__=p)
    p = os.path.join(d, "config.json")
    if os.path.lexists(p):
        q = read_json(p).get("quantization_config")
        if isinstance(q, dict):
            return dict(q, __file__=f"{p} (quantization_config)")
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
