"""Binary kernels (binary_gemm, binary_linear, binary_bmm, binary_conv2d) — IN PROGRESS."""
from __future__ import annotations

from ._build import Extension

EXTENSION = Extension(family="binary", sources=("binary_bindings.cpp",))


def register(registry, priority: int) -> None:
    pass
