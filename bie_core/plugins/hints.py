"""What to tell a user about a backend that is not loaded: the real cause
and its fix, rather than an install command for a package that is already
installed."""
from __future__ import annotations

import torch

from .registry import LOADED, UNAVAILABLE


def cuda_cause() -> str:
    """Why torch cannot run CUDA here ('' if it can)."""
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return (f"torch {torch.__version__} is built without CUDA: install a CUDA build of torch "
                f"(https://pytorch.org/get-started/locally/)")
    if not torch.cuda.is_available():
        return (f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no CUDA device: "
                f"check the NVIDIA driver (nvidia-smi) and CUDA_VISIBLE_DEVICES")
    return ""


def mps_cause() -> str:
    mps = getattr(torch.backends, "mps", None)
    if mps is None or not mps.is_built():
        return f"torch {torch.__version__} is built without MPS (Apple silicon's Metal)"
    if not mps.is_available():
        return "torch finds no usable MPS device (needs Apple silicon and macOS 12.3 or later)"
    return ""


def fix_hint(rec) -> str:
    """The fix to show beside a backend record's cause. A CUDA backend that
    is installed and sound but cannot run because this torch has no CUDA (or
    sees no device) gets that reason, not an install command for a package
    that is already installed; any other record not loaded gets its
    descriptor's install hint (which names what is missing, e.g. mlx itself)."""
    if rec.status == LOADED:
        return ""
    if rec.status == UNAVAILABLE and "cuda" in (rec.devices or ()):
        cause = cuda_cause()
        if cause:
            return f"{rec.distribution or f'backend {rec.name}'} is installed, but {cause}"
    return rec.install_hint or ""


__all__ = ["fix_hint", "cuda_cause", "mps_cause"]
