"""Shared by the bie-backend-cutlass test files of the sm_90-only families (integer, weight-only): why their
kernel checks cannot run here, or None."""
from __future__ import annotations

import importlib.util

import torch


def sm90_kernels_reason(family: str):
    """None where the sm_90 kernels of ``family`` can be built and run, else the reason they cannot."""
    if importlib.util.find_spec("bie_backend_cutlass") is None:
        return "not installed"
    if not torch.cuda.is_available():
        return "no CUDA device"
    if torch.cuda.get_device_capability() != (9, 0):
        return f"the {family} kernels are built for sm_90"
    from bie_backend_cutlass import descriptor
    return descriptor.backend.probe()
