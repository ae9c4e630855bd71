"""Data-parallel training of models that hold bie layers: DDP and FSDP2.

The weight-only layers (MPQLinear, MBWQLinear) expose their weight to
autograd as a :class:`~bie_core.layers._wq_base.GradientHandle`: a (K, N)
float32 parameter whose value is one scalar (stride 0) and whose gradient is
the real (K, N) weight gradient. Their packed codes, scales and zeros are
buffers.

Only a trainable layer registers its handle as a parameter; a frozen one
holds it unregistered, so stock DDP and FSDP2 see no handle at all.

**DDP.** A stock ``torch.nn.parallel.DistributedDataParallel(model)`` works
as it is, frozen or packed-trainable: the handle's ``detach()`` is empty, so
DDP's initial broadcast skips it (it holds no value), and DDP's reducer
all-reduces its gradient with the others. Buffers, the packed codes among
them, are broadcast from rank 0 at init (and at each forward unless
``broadcast_buffers=False``; after identical optimizer steps they are
identical anyway). :func:`ddp` is the same call, kept as a convenience.

**FSDP2.** A stock ``torch.distributed.fsdp.fully_shard`` shards a model
whose weight-only layers are frozen (a packed base under LoRA adapters): it
shards the float parameters and leaves the packed weights, which are buffers,
replicated. It refuses two kinds of parameter that bie layers may hold:

* the handle of a *trainable* weight-only layer: FSDP2 shards parameters
  along their first dimension and refuses a non-contiguous one; a contiguous
  handle would be a dense K*N*4-byte float copy of the weight, which is what
  packing removes;
* the 0-dim scales of the QAT layers (``act_scale``, ``weight_scale``):
  FSDP2 refuses scalar parameters.

:func:`fully_shard` calls it with those in ``ignored_params`` and gives each
of them that requires grad a post-accumulate-grad hook averaging its gradient
over the mesh's process group, which is what FSDP2 does for the parameters it
manages: every rank takes the same step, the packed codes stay identical.
"""
from __future__ import annotations

from typing import Iterable, List

import torch
import torch.distributed as dist
from torch import nn

from .layers._wq_base import GradientHandle


def gradient_handles(module: nn.Module) -> List[GradientHandle]:
    """The registered gradient handles (those of trainable weight-only layers) in ``module``."""
    return [p for p in module.parameters() if isinstance(p, GradientHandle)]


def unshardable_parameters(module: nn.Module) -> List[nn.Parameter]:
    """The parameters of ``module`` that ``torch.distributed.fsdp.fully_shard``
    refuses: gradient handles (stride 0) and 0-dim parameters."""
    return [p for p in module.parameters() if isinstance(p, GradientHandle) or p.dim() == 0]


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
    the parameters it refuses (:func:`unshardable_parameters`: trainable
    layers' gradient handles, the QAT layers' 0-dim scales) go to
    ``ignored_params``, and those that require grad are averaged over
    ``mesh``'s process group (a 1-D mesh; the default process group when
    ``mesh`` is None). Other arguments are passed on.

    Apply it like ``fully_shard``: to each block, then to the root. A
    parameter made trainable after this call has no averaging hook: set
    ``trainable`` first.
    """
    from torch.distributed.fsdp import fully_shard as _fully_shard
    kept = unshardable_parameters(module)
    ignored = set(ignored_params or ()) | set(kept)
    group = mesh.get_group() if mesh is not None else None
    for p in kept:
        if p.requires_grad and not getattr(p, "bie_grad_averaged", False):
            p.register_post_accumulate_grad_hook(_AverageOverGroup(group))
            p.bie_grad_averaged = True
    return _fully_shard(module, mesh=mesh, ignored_params=ignored, **kwargs)


__all__ = ["ddp", "fully_shard", "gradient_handles", "unshardable_parameters", "broadcast_module_state"]
