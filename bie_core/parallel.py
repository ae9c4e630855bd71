"""Data-parallel training of models that hold bie layers: DDP and FSDP2.

The weight-only layers (MPQLinear, MBWQLinear) expose their weight to
autograd as a :class:`~bie_core.layers._wq_base.GradientHandle`: a (K, N)
float32 parameter whose value is one scalar (stride 0) and whose gradient is
the real (K, N) weight gradient. Their packed codes, scales and zeros are
buffers.

**DDP.** A stock ``torch.nn.parallel.DistributedDataParallel(model)`` works
as it is, frozen or packed-trainable: the handle's ``detach()`` is empty, so
DDP's initial broadcast skips it (it holds no value), and DDP's reducer
all-reduces its gradient with the others. Buffers, the packed codes among
them, are broadcast from rank 0 at init (and at each forward unless
``broadcast_buffers=False``; after identical optimizer steps they are
identical anyway). :func:`ddp` is the same call, kept as a convenience.

**FSDP2.** ``torch.distributed.fsdp.fully_shard`` shards parameters along
their first dimension, which a stride-0 handle cannot be (torch refuses
non-contiguous parameters), and a dense shard of it would cost K*N*4 bytes.
:func:`fully_shard` calls it with every handle in ``ignored_params``, so it
shards the float parameters (LoRA adapters, norms, embeddings, ...) and leaves
each rank its packed weights, which are buffers and replicated (4-bit weights
are already an eighth of a float32 copy). Trainable handles then get a
post-accumulate-grad hook that averages their gradient over the mesh's process
group, which is what FSDP2 does for the parameters it manages, so every rank
takes the same packed-optimizer step and the codes stay identical.
"""
from __future__ import annotations

from typing import Iterable, List

import torch
import torch.distributed as dist
from torch import nn

from .layers._wq_base import GradientHandle


def gradient_handles(module: nn.Module) -> List[GradientHandle]:
    """The gradient handles of every weight-only layer in ``module``."""
    return [p for p in module.parameters() if isinstance(p, GradientHandle)]


def _is_handle(p: torch.Tensor) -> bool:
    return isinstance(p, GradientHandle)


@torch.no_grad()
def broadcast_module_state(module: nn.Module, src: int = 0, group=None) -> None:
    """Broadcast every parameter and buffer of ``module`` from rank ``src``
    (gradient handles skipped: they hold no value)."""
    for t in list(module.parameters()) + list(module.buffers()):
        if _is_handle(t) or t.numel() == 0:
            continue
        # write through the tensor itself (not ``.data``), under no_grad: that
        # bumps its version counter, so backend layouts prepared from the old
        # values (the dispatcher's prepared-weight cache) are rebuilt
        tmp = t.detach().contiguous().clone() if not t.is_contiguous() else None
        if tmp is None:
            dist.broadcast(t, src, group=group)
            t.mul_(1) if t.is_floating_point() else t.bitwise_or_(0)  # a no-op write: version += 1
        else:
            dist.broadcast(tmp, src, group=group)
            t.copy_(tmp)


def ddp(module: nn.Module, **kwargs) -> nn.parallel.DistributedDataParallel:
    """``torch.nn.parallel.DistributedDataParallel(module, **kwargs)``: stock
    DDP handles bie layers (module doc); kept as a convenience."""
    return nn.parallel.DistributedDataParallel(module, **kwargs)


class _AverageOverGroup:
    """Post-accumulate-grad hook of a trainable handle under FSDP2: averages
    ``handle.grad`` over the process group (divide by its size, then sum)."""

    def __init__(self, group):
        self.group = group

    def __call__(self, p: torch.Tensor) -> None:
        if p.grad is None:
            return
        world = dist.get_world_size(self.group)
        if world > 1:
            p.grad.div_(world)
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=self.group)


def fully_shard(module: nn.Module, *, mesh=None, ignored_params: Iterable[nn.Parameter] | None = None, **kwargs):
    """``torch.distributed.fsdp.fully_shard`` for modules holding bie layers:
    gradient handles go to ``ignored_params`` and trainable ones are averaged
    over ``mesh``'s process group (a 1-D mesh; the default process group when
    ``mesh`` is None). Other arguments are passed on.

    Apply it like ``fully_shard``: to each block, then to the root. A handle
    made trainable after this call has no averaging hook: set ``trainable``
    first.
    """
    from torch.distributed.fsdp import fully_shard as _fully_shard
    handles = gradient_handles(module)
    ignored = set(ignored_params or ()) | set(handles)
    group = mesh.get_group() if mesh is not None else None
    for h in handles:
        if h.requires_grad and not getattr(h, "bie_grad_averaged", False):
            h.register_post_accumulate_grad_hook(_AverageOverGroup(group))
            h.bie_grad_averaged = True
    return _fully_shard(module, mesh=mesh, ignored_params=ignored, **kwargs)


__all__ = ["ddp", "fully_shard", "gradient_handles", "broadcast_module_state"]
