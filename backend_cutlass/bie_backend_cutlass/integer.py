"""4/8-bit integer kernels (int_gemm, int_bmm, int_conv2d) — IN PROGRESS."""
from __future__ import annotations

from ._build import Extension

EXTENSION = Extension(family="integer", sources=("integer_bindings.cpp",))


def register(registry, priority: int) -> None:
    pass
