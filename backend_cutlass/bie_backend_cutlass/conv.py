"""Conv-family kernels (binary_conv2d, int_conv2d) — IN PROGRESS."""
from __future__ import annotations

from ._build import Extension

EXTENSION = Extension(family="conv", sources=("conv_bindings.cpp",))


def register(registry, priority: int) -> None:
    pass
