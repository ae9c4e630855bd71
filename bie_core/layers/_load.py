"""All-or-nothing ``load_state_dict`` for bie layers.

torch copies a state dict tensor by tensor and reports problems at the end, so
a refused load can leave a module half-written; bie layers also switch form
(float / packed, GPTQ / GBA zeros, group layout) to match what comes in. A
bie layer therefore loads in two steps: first it adopts the incoming form and
checks every tensor it would copy (presence when ``strict``, type, shape,
values) without copying anything; only when all of that passed does torch copy.
When a check fails the layer is put back exactly as it was (:class:`Snapshot`
restores the form switch; nothing was copied yet) and the problems are
reported through torch's usual lists, so ``load_state_dict`` raises as usual.
"""
from __future__ import annotations

import copy

import torch
from torch import nn


class Snapshot:
    """The structure of a module (which parameters and buffers it has, and its
    plain attributes such as a format name or group layout), not the values:
    enough to undo a form switch, which replaces tensors and never writes into
    them."""

    def __init__(self, module: nn.Module):
        self.module = module
        self.params = dict(module._parameters)
        self.buffers = dict(module._buffers)
        self.non_persistent = set(module._non_persistent_buffers_set)
        self.attrs = {k: copy.copy(v) if isinstance(v, (list, dict, set)) else v
                      for k, v in module.__dict__.items()
                      if k not in ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set")}

    def restore(self) -> None:
        m = self.module
        m._parameters.clear()
        m._parameters.update(self.params)
        m._buffers.clear()
        m._buffers.update(self.buffers)
        m._non_persistent_buffers_set.clear()
        m._non_persistent_buffers_set.update(self.non_persistent)
        for k in [k for k in m.__dict__ if k not in self.attrs and
                  k not in ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set")]:
            del m.__dict__[k]
        m.__dict__.update(self.attrs)


def dry_run(module: nn.Module, state_dict, prefix: str, strict: bool, missing_keys: list, unexpected_keys: list,
            skip: tuple = ()) -> list:
    """What ``nn.Module._load_from_state_dict`` would refuse, without copying.

    Returns the error messages (shape or type mismatches); when ``strict``, the
    keys this module lacks or does not know are added to ``missing_keys`` and
    ``unexpected_keys`` (torch raises for them at the end). The load must not
    proceed when this returns messages or added keys.
    """
    errors = []
    local = {k: v for k, v in list(module._parameters.items()) + list(module._buffers.items())
             if v is not None and k not in module._non_persistent_buffers_set and k not in skip}
    missing = []
    for name, param in local.items():
        key = prefix + name
        if key not in state_dict:
            if strict:
                missing.append(key)
            continue
        t = state_dict[key]
        if not isinstance(t, torch.Tensor):
            errors.append(f"While copying the parameter named {key!r}, expected a tensor from the checkpoint but "
                          f"received {type(t).__name__}")
            continue
        shape = t.shape
        if param.dim() == 0 and t.dim() == 1 and t.numel() == 1:
            shape = torch.Size(())   # torch accepts a (1,) tensor for a 0-d one
        if shape != param.shape:
            errors.append(f"size mismatch for {key}: copying a param with shape {tuple(t.shape)} from checkpoint, "
                          f"the shape in current model is {tuple(param.shape)}.")
        elif t.is_complex() and not param.is_complex():
            errors.append(f"{key} is complex ({str(t.dtype)[6:]}); the layer holds {str(param.dtype)[6:]}")
    unexpected = []
    if strict:
        for key in state_dict:
            if not key.startswith(prefix) or key == prefix + "_extra_state":
                continue
            head = key[len(prefix):].split(".", 1)[0]
            if head not in module._modules and head not in local and head not in skip:
                unexpected.append(key)
    missing_keys.extend(missing)
    unexpected_keys.extend(unexpected)
    if missing or unexpected:
        errors.append("")   # the keys themselves are torch's message
    return errors


def load_atomically(module: nn.Module, check, state_dict, prefix, local_metadata, strict, missing_keys,
                    unexpected_keys, error_msgs, skip: tuple = ()) -> bool:
    """Adopt the incoming form and check it (``check(state_dict, prefix)``
    returns messages), dry-run torch's copy, then copy; or, on any problem,
    restore the module and report. Returns whether the tensors were copied."""
    snap = Snapshot(module)
    try:
        errors = list(check(state_dict, prefix))
        if not errors:
            errors = dry_run(module, state_dict, prefix, strict, missing_keys, unexpected_keys, skip)
    except BaseException:
        snap.restore()
        raise
    if errors:
        snap.restore()
        error_msgs.extend(e for e in errors if e)
        return False
    nn.Module._load_from_state_dict(module, state_dict, prefix, local_metadata, strict, missing_keys,
                                    unexpected_keys, error_msgs)
    return True


def bie_layers(model: nn.Module):
    """(name, layer) of every bie layer in ``model`` that loads through
    :func:`load_atomically` (it has a ``_check_load``)."""
    for name, m in model.named_modules():
        if callable(getattr(m, "_check_load", None)):
            yield name, m


def adopt_all(model: nn.Module, state_dict) -> tuple:
    """Let every bie layer of ``model`` adopt the incoming forms and check its
    tensors. Returns (problems, undo): ``undo()`` puts every layer back."""
    snaps = []
    problems = []
    try:
        for name, layer in bie_layers(model):
            snaps.append(Snapshot(layer))
            problems += [p for p in layer._check_load(state_dict, f"{name}." if name else "") if p]
    except BaseException:
        for s in reversed(snaps):
            s.restore()
        raise

    def undo():
        for s in reversed(snaps):
            s.restore()
    return problems, undo
