"""LoRA-style adapters trained on a frozen, dynamically quantized int8 base (``DynamicQLinear``).

A small MLP regression: a float "teacher" network defines the targets; the student starts from a
perturbed copy of the teacher, its linears converted to ``DynamicQLinear`` (int8 weights, frozen, their
biases frozen too) and wrapped in low-rank adapters ``y = base(x) + (alpha / r) * (x @ A.T) @ B.T``. Only
A and B train. The base passes the straight-through input gradient ``grad_y @ W_deq`` to the adapters of
the layers before it.

    python examples/dynamic_lora.py [--steps 300] [--rank 4] [--scheme per_token_symmetric] [--seed 0]

Prints the loss every 50 steps and the first and last loss.
"""
from __future__ import annotations

import argparse

import torch
from torch import nn

from bie_core import DynamicQLinear


class LoRALinear(nn.Module):
    """A frozen base linear plus a trainable low-rank update (B starts at zero: the start is the base)."""

    def __init__(self, base: nn.Module, rank: int = 4, alpha: float = 8.0, generator=None):
        super().__init__()
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        self.scaling = alpha / rank
        self.lora_A = nn.Parameter(torch.randn(rank, base.in_features, generator=generator) / base.in_features ** 0.5)
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x):
        return self.base(x) + ((x @ self.lora_A.t()) @ self.lora_B.t()) * self.scaling


def build(seed: int = 0, scheme: str = "per_token_symmetric", rank: int = 4, width: int = 64):
    """(teacher, student): the student's linears are DynamicQLinear bases of a perturbed teacher, with adapters."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    teacher = nn.Sequential(nn.Linear(32, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 8))
    student = nn.Sequential()
    for m in teacher:
        if isinstance(m, nn.Linear):
            pert = nn.Linear(m.in_features, m.out_features)
            with torch.no_grad():
                pert.weight.copy_(m.weight + 0.3 * m.weight.std() * torch.randn(m.weight.shape, generator=g))
                pert.bias.copy_(m.bias)
            student.append(LoRALinear(DynamicQLinear.from_float(pert, act_scheme=scheme), rank, generator=g))
        else:
            student.append(type(m)())
    return teacher, student


def train(steps: int = 300, seed: int = 0, scheme: str = "per_token_symmetric", rank: int = 4, lr: float = 1e-2,
          log_every: int = 0) -> list:
    teacher, student = build(seed, scheme, rank)
    params = [p for p in student.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr)
    g = torch.Generator().manual_seed(seed + 1)
    losses = []
    for step in range(steps):
        x = torch.randn(64, 32, generator=g)
        with torch.no_grad():
            target = teacher(x)
        loss = nn.functional.mse_loss(student(x), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if log_every and (step % log_every == 0 or step == steps - 1):
            print(f"step {step:4d}  loss {losses[-1]:.5f}")
    return losses


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rank", type=int, default=4)
    ap.add_argument("--scheme", default="per_token_symmetric", choices=["per_token_symmetric", "per_tensor_affine"])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    losses = train(args.steps, args.seed, args.scheme, args.rank, log_every=50)
    print(f"loss {losses[0]:.5f} -> {losses[-1]:.5f} ({losses[0] / losses[-1]:.1f}x lower) with only the adapters "
          "trained on frozen int8 bases")


if __name__ == "__main__":
    main()
