"""Fine-tuning packed weight-only layers (docs/spec.md §4): Adam on the dequantized
weight, written back as codes.

A trainable ``MPQLinear`` / ``MBWQLinear`` exposes one parameter for its
weight, the 4-byte *gradient handle* (see ``bie_core.layers._wq_fn``), whose
``.grad`` is ``x.T @ g`` (K, N) float32 after backward (all-reduced by DDP
like any gradient). The handle carries ``bie_optimizer_hook``; DiodeMix (or
:class:`PackedAdam` here) calls ``hook(p, state, group)`` instead of updating
``p``. One step, for the layer's weight ``W`` (K, N):

1. ``g = p.grad`` (optionally projected by GaLore when the group sets
   ``galore_rank``: the moments then live in the rank-r subspace);
2. Adam moments with bias correction (``betas``, ``eps``), update
   ``u = m_hat / (sqrt(v_hat) + eps)`` (projected back with GaLore);
3. ``delta = -lr * u - lr * weight_decay * W`` (decoupled weight decay on the
   dequantized value);
4. every ``zero_update_every`` steps (group key, 0 = never) the per-group
   mean of ``delta`` moves into the zero points (float zeros exactly, integer
   zeros by whole steps) and only the rest goes to the codes;
5. new codes ``= quantize(W + delta)`` in place, with the layer's statistics.
   ``rounding="stochastic"`` (group key; default) rounds up with probability
   equal to the fractional part, so updates smaller than one quantization
   step still move the weight in expectation (round-to-nearest would undo
   them); ``"nearest"`` is deterministic. The random numbers come from a
   generator seeded by (group ``seed``, step, K, N), so every DDP rank draws
   the same ones and ranks stay bit-identical.

No float copy of W persists: the dequantized W exists only inside the step.
The optimizer states (``exp_avg``, ``exp_avg_sq``: (K, N) float32, or
rank-r with GaLore, or ``state_dtype`` bfloat16 via the group key) are the
optimizer's own, saved with ``optimizer.state_dict()``.
"""
from __future__ import annotations

import weakref
from typing import Iterable, Optional

import torch
from torch.optim import Optimizer

ROUNDINGS = ("stochastic", "nearest")


class PackedWeightHook:
    """The ``bie_optimizer_hook`` of a weight-only layer's gradient handle."""

    def __init__(self, layer_ref: "weakref.ref"):
        self._ref = layer_ref

    def __call__(self, p: torch.Tensor, state: dict, group: dict) -> None:
        layer = self._ref()
        if layer is None or p.grad is None:
            return
        packed_adam_step(layer, p.grad, state, group)

    def __deepcopy__(self, memo):  # the copy's layer re-attaches its own hook
        return self


def closure_loss_checked(closure, param_groups):
    """The loss of an optimizer step's closure (run with gradients on; None without one), after
    ``check_packed_grads`` has passed on the gradients it left."""
    loss = None
    if closure is not None:
        with torch.enable_grad():
            loss = closure()
    check_packed_grads(param_groups)
    return loss


def check_packed_grads(param_groups) -> None:
    """Refuse a step whose packed-weight gradients hold inf or NaN, before any
    parameter is updated (docs/bad-input.md: non-finite values raise).

    A packed weight has no NaN to hold: an Adam update from a NaN gradient
    would move codes by whole quantization steps in a direction that means
    nothing. One host synchronisation per step for all layers together.
    ``torch.amp.GradScaler`` skips steps with non-finite gradients before
    calling ``step``, so mixed-precision training never gets here."""
    handles = [p for g in param_groups for p in g["params"]
               if callable(getattr(p, "bie_optimizer_hook", None)) and p.grad is not None]
    if not handles:
        return
    finite = torch.stack([torch.isfinite(p.grad).all() for p in handles])
    if bool(finite.all()):
        return
    names = []
    for p, ok in zip(handles, finite.tolist()):
        if not ok:
            ref = getattr(p, "bie_packed_layer", None)
            layer = ref() if ref is not None else None
            n_bad = int((~torch.isfinite(p.grad)).sum())
            names.append(f"{layer.layer_name() if layer is not None else 'a packed layer'} ({n_bad} values)")
    raise ValueError("packed weight gradients are not finite in " + ", ".join(names) + "; no parameter was "
                     "updated. Skip this step (torch.amp.GradScaler does so automatically) or find the inf/NaN "
                     "in the batch or the loss")


def _projector(group: dict):
    rank = group.get("galore_rank")
    if rank is None:
        return None
    from .galore import GaLoreProjector
    return GaLoreProjector(rank, group.get("galore_update_proj_gap", 200), group.get("galore_scale", 0.25),
                           group.get("galore_proj_type", "std"))


def _seed(group: dict, step: int, k: int, n: int) -> int:
    # Python's hash of a tuple of ints is the same in every process (no hash
    # randomisation for ints), so all DDP ranks get the same stream.
    return hash((int(group.get("seed", 0)), step, k, n)) & 0x7FFF_FFFF_FFFF_FFFF


@torch.no_grad()
def packed_adam_step(layer, grad: torch.Tensor, state: dict, group: dict) -> None:
    """One Adam step on a weight-only layer's packed weight (module doc)."""
    rounding = group.get("rounding", "stochastic")
    if rounding not in ROUNDINGS:
        raise ValueError(f"{layer.layer_name()}: optimizer group rounding={rounding!r}; allowed: {list(ROUNDINGS)}")
    k, n = layer.in_features, layer.out_features
    if tuple(grad.shape) != (k, n):
        raise ValueError(f"{layer.layer_name()}: weight gradient has shape {tuple(grad.shape)}, expected ({k}, {n})")
    lr, (b1, b2), eps = group["lr"], group["betas"], group["eps"]
    wd = group.get("weight_decay", 0.0)
    state_dtype = group.get("state_dtype", torch.float32)
    g = grad.to(torch.float32)
    if "step" not in state:
        state["step"] = 0
    proj = _projector(group)
    if proj is not None:
        g = proj.project(g, state["step"], state)
    if "exp_avg" not in state or state["exp_avg"].shape != g.shape:
        state["exp_avg"] = torch.zeros_like(g, dtype=state_dtype)
        state["exp_avg_sq"] = torch.zeros_like(g, dtype=state_dtype)
    state["step"] += 1
    t = state["step"]
    m = state["exp_avg"].to(torch.float32).lerp_(g, 1 - b1)
    v = state["exp_avg_sq"].to(torch.float32).mul_(b2).addcmul_(g, g, value=1 - b2)
    state["exp_avg"].copy_(m)
    state["exp_avg_sq"].copy_(v)
    update = (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt_().add_(eps))
    del m, v, g
    if proj is not None:
        update = proj.project_back(update, state, (k, n))
    w = layer.dequantize(torch.float32)
    delta = update.mul_(-lr)
    if wd:
        delta.add_(w, alpha=-lr * wd)
    every = int(group.get("zero_update_every", 0) or 0)
    if every and t % every == 0:
        delta = layer.shift_zeros_(delta)
    w.add_(delta)
    del delta
    if rounding == "stochastic":
        gen = torch.Generator(device=w.device)
        gen.manual_seed(_seed(group, t, k, n))
        noise = torch.rand(w.shape, generator=gen, device=w.device, dtype=torch.float32).sub_(0.5)
        w.addcmul_(noise, layer.quant_step())
    layer.requantize_(w)


class PackedAdam(Optimizer):
    """Adam for models with packed weight-only layers, without DiodeMix.

    Parameters with a ``bie_optimizer_hook`` (the handles of trainable
    MPQLinear/MBWQLinear) get :func:`packed_adam_step`; every other
    parameter gets AdamW (decoupled weight decay, float32 moments). Group keys
    beyond torch's: ``rounding``, ``zero_update_every``, ``seed``,
    ``state_dtype``, ``galore_rank`` (+ ``galore_update_proj_gap``,
    ``galore_scale``, ``galore_proj_type``; packed weights only).
    """

    def __init__(self, params, lr: float = 1e-4, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 *, rounding: str = "stochastic", zero_update_every: int = 0, seed: int = 0,
                 state_dtype=torch.float32, galore_rank: Optional[int] = None, galore_update_proj_gap: int = 200,
                 galore_scale: float = 0.25, galore_proj_type: str = "std"):
        if not lr >= 0:
            raise ValueError(f"PackedAdam: lr must be >= 0, got {lr}")
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"PackedAdam: betas must be in [0, 1), got {betas}")
        if rounding not in ROUNDINGS:
            raise ValueError(f"PackedAdam: rounding must be one of {list(ROUNDINGS)}, got {rounding!r}")
        if state_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"PackedAdam: state_dtype must be float32 or bfloat16, got {state_dtype}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, rounding=rounding,
                        zero_update_every=zero_update_every, seed=seed, state_dtype=state_dtype,
                        galore_rank=galore_rank, galore_update_proj_gap=galore_update_proj_gap,
                        galore_scale=galore_scale, galore_proj_type=galore_proj_type)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure_loss_checked(closure, self.param_groups)
        for group in self.param_groups:
            for p in group["params"]:
                hook = getattr(p, "bie_optimizer_hook", None)
                if callable(hook):
                    hook(p, self.state[p], group)
                elif p.grad is not None:
                    _adamw(p, self.state[p], group)
        return loss


def _adamw(p, state, group) -> None:
    if not state:
        state["step"] = 0
        state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
        state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
    b1, b2 = group["betas"]
    state["step"] += 1
    t = state["step"]
    g = p.grad.to(torch.float32)
    m, v = state["exp_avg"], state["exp_avg_sq"]
    m.lerp_(g, 1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    u = (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt_().add_(group["eps"]))
    if group["weight_decay"]:
        p.mul_(1 - group["lr"] * group["weight_decay"])
    p.add_(u.to(p.dtype), alpha=-group["lr"])


def packed_parameters(model: torch.nn.Module) -> Iterable[torch.nn.Parameter]:
    """The gradient handles of the model's trainable weight-only layers."""
    return [p for p in model.parameters() if callable(getattr(p, "bie_optimizer_hook", None))]


__all__ = ["PackedAdam", "PackedWeightHook", "check_packed_grads", "packed_adam_step", "packed_parameters", "ROUNDINGS"]
