"""DistributedDataParallel with packed weight-only layers.

The gradient handles of trainable MPQLinear/MBWQLinear layers are stride-0
views of one scalar (``bie_core.layers._wq_fn``). DDP's reducer all-reduces
their (K, N) gradients like any other, but DDP's *initial* broadcast of
parameters writes into every parameter in place, which PyTorch refuses for a
tensor whose elements share memory. :func:`ddp` therefore broadcasts the
module state itself (every parameter and buffer from rank 0, handles
skipped: they hold no value) and builds a stock
``torch.nn.parallel.DistributedDataParallel`` with ``init_sync=False``.
Equivalent by hand: ``DistributedDataParallel(model, init_sync=False)`` after
making sure every rank holds the same weights (e.g. all loaded the same
checkpoint). Buffers (the packed codes) are still broadcast from rank 0 at
each forward unless ``forward_sync_buffers=False``; after identical optimizer
steps they are identical anyway.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def _is_handle(p: torch.Tensor) -> bool:
    return callable(getattr(p, "bie_optimizer_hook", None)) and p.dim() == 2 and p.stride() == (0, 0)


@torch.no_grad()
def broadcast_module_state(module: nn.Module, src: int = 0, group=None) -> None:
    """Broadcast every parameter and buffer of ``module`` from rank ``src``
    (gradient handles skipped)."""
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
    """``DistributedDataParallel(module, init_sync=False, **kwargs)`` after
    syncing the module state from rank 0 (see module doc)."""
    if kwargs.pop("init_sync", False):
        raise ValueError("bie_core.parallel.ddp: init_sync=True cannot broadcast packed layers' gradient handles; "
                         "ddp() syncs the module state itself")
    broadcast_module_state(module, 0, kwargs.get("process_group"))
    return nn.parallel.DistributedDataParallel(module, init_sync=False, **kwargs)


__all__ = ["ddp", "broadcast_module_state"]
