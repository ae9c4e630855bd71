"""DiodeMix: sign descent with hysteresis for binary latent weights, AdamW for
everything else, optional GaLore projection of the AdamW states per group.

Binary weights (parameters tagged ``p.bie_binary = True`` by the bie binary
layers, or every parameter of a group with ``binary=True``) only matter
through their sign (and a scale derived from magnitudes that this rule keeps).
For each such weight, with gradient ``g``:

    m   <- b1 * m + (1 - b1) * g                  momentum         (binary_betas[0])
    acc <- b2 * acc + lr * sign(m)                leaky sign-descent accumulator (binary_betas[1])
    flip where sgn(p) * acc > flip_threshold      the accumulated steps push p across zero
    p   <- -p at flipped entries; acc <- 0 there  magnitude kept; hysteresis restarts

``acc`` is the sign-descent trajectory of a hidden weight; the binary weight
changes only once that trajectory has moved ``flip_threshold`` against its
sign, and must then move as far back to flip again (the hysteresis that keeps
weights from oscillating on noisy gradients). With a consistent gradient a
weight flips after about ``flip_threshold / lr`` steps, and never once
``lr / (1 - b2) <= flip_threshold``, so decaying ``lr`` anneals flipping. Weight
decay does not apply to binary weights (it would not change a sign).

Everything else gets AdamW (decoupled weight decay, bias-corrected moments,
float32 states; a bf16/fp16 parameter takes the decay and the step in float32,
rounded once). With ``galore_rank`` set in a group, the moments of its
parameters with 2 or more dims live in a rank-``galore_rank`` subspace
(:class:`~bie_core.optim.galore.GaLoreProjector`), and those matrices take the
decay and the projected-back step in their own dtype.

**Protocol for layers with their own update rule** (e.g. weight-only layers
that train packed codes): a parameter ``p`` with a callable attribute
``bie_optimizer_hook`` is never updated by the rules above; ``step()`` calls
``p.bie_optimizer_hook(p, state, group)`` once per step (whether or not
``p.grad`` is set: such layers may deliver their gradient elsewhere), where
``state`` is this optimizer's per-parameter state dict (saved and restored with
``state_dict()``) and ``group`` the parameter's group dict (``lr``, ``betas``,
``eps``, ``weight_decay``, the ``galore_*`` keys; :meth:`DiodeMix.projector`
builds the group's projector).
"""
from __future__ import annotations

import itertools
from typing import Optional

import torch
from torch.optim import Optimizer

from .galore import PROJ_TYPES, GaLoreProjector
from .packed import closure_loss_checked


def is_binary(p: torch.Tensor, group: dict) -> bool:
    return bool(group.get("binary")) or bool(getattr(p, "bie_binary", False))


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.float32 else t.to(torch.float32)


#: elements a multi-tensor update takes at once. Its temporaries span all the parameters it takes (up to three
#: float32 values per element, at the binary rule's peak): 2^23 elements bound them near 100 MB whatever the
#: model's size, and a ResNet-18 still updates in two calls per rule and op.
FOREACH_MAX_ELEMENTS = 1 << 23


def _by_device_and_dtype(params: list) -> list:
    """``params`` split into lists of one device and dtype (what a multi-tensor op takes at once), in order, and
    those into as few runs of about equal size as keep each within FOREACH_MAX_ELEMENTS (a larger parameter
    alone)."""
    out: dict = {}
    for p in params:
        out.setdefault((p.device, p.dtype), []).append(p)
    chunks = []
    for ps in out.values():
        total = sum(p.numel() for p in ps)
        runs = -(-total // FOREACH_MAX_ELEMENTS)
        size = -(-total // max(runs, 1))   # (equal runs: the temporaries' peak is the largest run's)
        chunk, n = [], 0
        for p in ps:
            if chunk and n + p.numel() > FOREACH_MAX_ELEMENTS:
                chunks.append(chunk)
                chunk, n = [], 0
            chunk.append(p)
            n += p.numel()
            if n >= size:
                chunks.append(chunk)
                chunk, n = [], 0
        if chunk:
            chunks.append(chunk)
    return chunks


class DiodeMix(Optimizer):
    """Drop-in torch optimizer (see module docstring for the rules).

    Args:
        params: parameters or param-group dicts (any key below may be set per group).
        lr: step size for AdamW, and the sign-descent step of binary weights.
        betas, eps, weight_decay: AdamW.
        binary_betas: (momentum, accumulator leak) of the binary rule.
        flip_threshold: hysteresis of the binary rule (see above).
        galore_rank: None (off) or the rank of the GaLore subspace for this group's
            >=2-D non-binary parameters; ``galore_update_proj_gap``, ``galore_scale``,
            ``galore_proj_type`` as :class:`GaLoreProjector`.
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 *, binary_betas=(0.9, 0.99), flip_threshold: float = 1e-2, galore_rank: Optional[int] = None,
                 galore_update_proj_gap: int = 200, galore_scale: float = 0.25, galore_proj_type: str = "std"):
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, binary_betas=tuple(binary_betas),
                        flip_threshold=flip_threshold, galore_rank=galore_rank,
                        galore_update_proj_gap=galore_update_proj_gap, galore_scale=galore_scale,
                        galore_proj_type=galore_proj_type, binary=False)
        self._check_group(defaults)
        super().__init__(params, defaults)
        for g in self.param_groups:
            self._check_group(g)

    @staticmethod
    def _check_group(g: dict) -> None:
        def bad(msg):
            raise ValueError(f"DiodeMix: {msg}")
        if not (isinstance(g["lr"], (int, float)) and g["lr"] >= 0):
            bad(f"lr must be a number >= 0, got {g['lr']!r}")
        for key in ("betas", "binary_betas"):
            b = g[key]
            if len(b) != 2 or not all(0.0 <= v < 1.0 for v in b):
                bad(f"{key} must be two values in [0, 1), got {b!r}")
        if g["eps"] < 0 or g["weight_decay"] < 0 or g["flip_threshold"] < 0:
            bad(f"eps, weight_decay and flip_threshold must be >= 0, got {g['eps']!r}, {g['weight_decay']!r}, "
                f"{g['flip_threshold']!r}")
        r = g["galore_rank"]
        if r is not None and (not isinstance(r, int) or isinstance(r, bool) or r <= 0):
            bad(f"galore_rank must be None or a positive int, got {r!r}")
        if g["galore_proj_type"] not in PROJ_TYPES:
            bad(f"galore_proj_type must be one of {PROJ_TYPES}, got {g['galore_proj_type']!r}")

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        self._check_group(self.param_groups[-1])

    @staticmethod
    def projector(group: dict) -> Optional[GaLoreProjector]:
        """The group's GaLore projector, or None when ``galore_rank`` is not set."""
        if group.get("galore_rank") is None:
            return None
        return GaLoreProjector(group["galore_rank"], group["galore_update_proj_gap"], group["galore_scale"],
                               group["galore_proj_type"])

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure_loss_checked(closure, self.param_groups)
        for group in self.param_groups:
            proj = self.projector(group)
            binary, plain = [], []
            for p in group["params"]:
                hook = getattr(p, "bie_optimizer_hook", None)
                if callable(hook):
                    hook(p, self.state[p], group)
                    continue
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("DiodeMix does not support sparse gradients")
                if is_binary(p, group):
                    binary.append(p)
                elif proj is not None and p.dim() >= 2:
                    self._adamw_step(p, self.state[p], group, proj)   # (GaLore projects each matrix on its own)
                else:
                    plain.append(p)
            # The parameters of a rule are updated together, by torch's multi-tensor (_foreach) ops per device and
            # dtype: a few launches a step instead of about ten per parameter, which on a GPU made the optimizer's
            # host time a large part of a small network's training step.
            for ps in _by_device_and_dtype(binary):
                self._binary_steps(ps, [self.state[p] for p in ps], group)
            for ps in _by_device_and_dtype(plain):
                self._adamw_steps(ps, [self.state[p] for p in ps], group)
        return loss

    @staticmethod
    def _binary_steps(params: list, states: list, group: dict) -> None:
        for p, st in zip(params, states):
            if not st:
                st["step"] = 0
                st["exp_avg"] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.preserve_format)
                st["flip_acc"] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.preserve_format)
            st["step"] += 1
        b1, b2 = group["binary_betas"]
        ms = [st["exp_avg"] for st in states]
        accs = [st["flip_acc"] for st in states]
        torch._foreach_lerp_(ms, [_f32(p.grad) for p in params], 1 - b1)
        torch._foreach_mul_(accs, b2)
        torch._foreach_add_(accs, torch._foreach_sign(ms), alpha=group["lr"])
        # The flip in multi-tensor arithmetic, exact: f is 1.0 where sgn(p) * acc > flip_threshold, else 0.0
        # (x - t > 0 exactly when x > t in IEEE arithmetic); p * (1 - 2f) is -p there and p elsewhere.
        # (each temporary spans every parameter of the call: freed as soon as it is used up)
        sgn = torch._foreach_sign(params)
        zero = torch._foreach_abs(sgn)                     # 0 for a zero weight, else 1 (made 1 - that below)
        torch._foreach_add_(sgn, 0.5)
        torch._foreach_sign_(sgn)                          # sgn(p), with sgn(0) = +1
        f = torch._foreach_mul(accs, sgn)
        del sgn
        torch._foreach_sub_(f, group["flip_threshold"])
        torch._foreach_sign_(f)
        torch._foreach_clamp_min_(f, 0.0)
        coef = torch._foreach_mul(f, -2.0)
        torch._foreach_add_(coef, 1.0)
        torch._foreach_mul_(params, coef)
        del coef
        # a zero weight counts as +1; flipped, it becomes the dtype's smallest negative normal value (-0.0 would
        # still count as +1)
        torch._foreach_mul_(zero, -1.0)
        torch._foreach_add_(zero, 1.0)
        torch._foreach_mul_(zero, f)
        torch._foreach_add_(params, zero, alpha=-torch.finfo(params[0].dtype).tiny)
        torch._foreach_mul_(f, -1.0)
        torch._foreach_add_(f, 1.0)
        torch._foreach_mul_(accs, f)                       # a flipped weight's accumulator restarts at 0

    @staticmethod
    def _adamw_steps(params: list, states: list, group: dict) -> None:
        for p, st in zip(params, states):
            if not st:
                st["step"] = 0
            if "exp_avg" not in st:
                st["exp_avg"] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.preserve_format)
            st["step"] += 1
        b1, b2 = group["betas"]
        grads = [_f32(p.grad) for p in params]
        ms = [st["exp_avg"] for st in states]
        vs = [st["exp_avg_sq"] for st in states]
        torch._foreach_lerp_(ms, grads, 1 - b1)
        torch._foreach_mul_(vs, b2)
        torch._foreach_addcmul_(vs, grads, grads, value=1 - b2)
        del grads
        update = torch._foreach_div(ms, [1 - b1 ** st["step"] for st in states])
        den = torch._foreach_div(vs, [1 - b2 ** st["step"] for st in states])
        torch._foreach_sqrt_(den)
        torch._foreach_add_(den, group["eps"])
        torch._foreach_div_(update, den)
        del den
        lr, wd = group["lr"], group["weight_decay"]
        # Low-precision parameters take the decay and the step in float32, rounded once: a multi-tensor op with a
        # scalar would round the scalar to their dtype on the CPU (1 - lr * wd is 1.0 in bfloat16 for small decays)
        # and not on a GPU.
        target = params if params[0].dtype == torch.float32 else [p.float() for p in params]
        if wd:
            torch._foreach_mul_(target, 1 - lr * wd)
        torch._foreach_add_(target, update, alpha=-lr)
        if target is not params:
            torch._foreach_copy_(params, target)

    @staticmethod
    def _adamw_step(p, state, group, proj: GaLoreProjector):
        """AdamW of one matrix whose moments live in its GaLore subspace."""
        grad = p.grad.to(torch.float32)
        if not state:
            state["step"] = 0
        grad = proj.project(grad, state["step"], state)
        if "exp_avg" not in state:
            state["exp_avg"] = torch.zeros_like(grad, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(grad, memory_format=torch.preserve_format)
        b1, b2 = group["betas"]
        state["step"] += 1
        t = state["step"]
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m.lerp_(grad, 1 - b1)
        v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        update = proj.project_back((m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt_().add_(group["eps"])), state,
                                   p.shape)
        lr, wd = group["lr"], group["weight_decay"]
        if wd:
            p.mul_(1 - lr * wd)
        p.add_(update.to(p.dtype), alpha=-lr)

    def load_state_dict(self, state_dict: dict) -> None:
        # torch casts floating state to each parameter's dtype on load; our
        # states are float32 on purpose (bf16/fp16 parameters too), so put the
        # float32 values back after the standard load.
        keep = {pid: {k: v for k, v in st.items() if isinstance(v, torch.Tensor) and v.dtype == torch.float32}
                for pid, st in state_dict["state"].items()}
        super().load_state_dict(state_dict)
        ids = itertools.chain.from_iterable(g["params"] for g in state_dict["param_groups"])
        params = itertools.chain.from_iterable(g["params"] for g in self.param_groups)
        for pid, p in zip(ids, params):
            for k, v in keep.get(pid, {}).items():
                self.state[p][k] = v.detach().clone().to(p.device)
