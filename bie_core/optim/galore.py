"""Low-rank gradient projection (GaLore: Zhao et al. 2024, "GaLore: Memory-Efficient
LLM Training by Gradient Low-Rank Projection"), for optimizer states.

A gradient matrix ``G (m, n)`` is projected onto the top-``rank`` singular
subspace of a recent gradient; the optimizer keeps its moments in that small
space and maps its update back. The subspace is recomputed (fp32 SVD) every
``update_proj_gap`` steps.

Sides (``proj_type``):

=============  ==============================================  ===========  =============
proj_type      matrix kept                                      project      project_back
=============  ==============================================  ===========  =============
``std``        right ``P = Vh[:r]`` if m >= n, else left        ``G P^T``    ``L P``
               ``Q = U[:, :r]`` (the smaller state)             ``Q^T G``    ``Q L``
``reverse_std`` the other side than ``std``
``right``      ``P``                                            ``G P^T``    ``L P``
``left``       ``Q``                                            ``Q^T G``    ``Q L``
``full``       both                                             ``Q^T G P^T`` ``Q L P``
=============  ==============================================  ===========  =============

``project_back`` multiplies by ``scale``. Tensors with more than 2 dims are
treated as ``(shape[0], -1)`` matrices. The projection matrices live in the
``state`` dict passed in (the optimizer's per-parameter state), so they are
saved and restored with ``optimizer.state_dict()``; without one, the projector
keeps its own.
"""
from __future__ import annotations

from typing import Optional

import torch

PROJ_TYPES = ("std", "reverse_std", "left", "right", "full")
_LEFT, _RIGHT = "galore_left", "galore_right"


class GaLoreProjector:
    def __init__(self, rank: int, update_proj_gap: int = 200, scale: float = 1.0, proj_type: str = "std"):
        if not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0:
            raise ValueError(f"GaLoreProjector: rank must be a positive int, got {rank!r}")
        if not isinstance(update_proj_gap, int) or update_proj_gap <= 0:
            raise ValueError(f"GaLoreProjector: update_proj_gap must be a positive int, got {update_proj_gap!r}")
        if proj_type not in PROJ_TYPES:
            raise ValueError(f"GaLoreProjector: proj_type must be one of {PROJ_TYPES}, got {proj_type!r}")
        self.rank, self.update_proj_gap, self.scale, self.proj_type = rank, update_proj_gap, float(scale), proj_type
        self._own_state: dict = {}

    def __repr__(self):
        return (f"GaLoreProjector(rank={self.rank}, update_proj_gap={self.update_proj_gap}, "
                f"scale={self.scale}, proj_type={self.proj_type!r})")

    def _sides(self, m: int, n: int) -> tuple:
        t = self.proj_type
        if t == "full":
            return (True, True)
        if t == "left":
            return (True, False)
        if t == "right":
            return (False, True)
        right = m >= n  # std keeps the smaller state: (m, r) when m >= n
        if t == "reverse_std":
            right = not right
        return (not right, right)

    def project(self, grad: torch.Tensor, step: int, state: Optional[dict] = None) -> torch.Tensor:
        """Low-rank image of ``grad`` (recomputing the subspace when due).
        ``step`` counts optimizer steps from 0."""
        state = self._own_state if state is None else state
        g = grad.reshape(grad.shape[0], -1) if grad.dim() != 2 else grad
        if g.dim() != 2:
            raise ValueError(f"GaLoreProjector: needs a tensor with at least 2 dims, got shape {tuple(grad.shape)}")
        m, n = g.shape
        left, right = self._sides(m, n)
        stale = (left and _LEFT not in state) or (right and _RIGHT not in state) or step % self.update_proj_gap == 0
        if stale:
            u, _, vh = torch.linalg.svd(g.detach().to(torch.float32), full_matrices=False)
            r = min(self.rank, u.shape[1])
            if left:
                state[_LEFT] = u[:, :r].contiguous()
            if right:
                state[_RIGHT] = vh[:r].contiguous()
        gf = g.to(torch.float32)
        if left:
            gf = state[_LEFT].t() @ gf
        if right:
            gf = gf @ state[_RIGHT].t()
        return gf

    def project_back(self, low: torch.Tensor, state: Optional[dict] = None,
                     shape: Optional[torch.Size] = None) -> torch.Tensor:
        """Full-size update from a low-rank one, times ``scale`` (reshaped to ``shape`` if given)."""
        state = self._own_state if state is None else state
        # a parameter's shape fixes its sides, so the matrices present say which apply
        out = low
        if _LEFT in state:
            out = state[_LEFT] @ out
        if _RIGHT in state:
            out = out @ state[_RIGHT]
        out = out * self.scale
        return out.reshape(shape) if shape is not None else out
