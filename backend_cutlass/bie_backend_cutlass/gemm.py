"""GEMM-family kernels (binary_gemm, binary_linear, binary_bmm, int_gemm, int_bmm) — IN PROGRESS."""
from __future__ import annotations

from ._build import Extension

EXTENSION = Extension(family="gemm", sources=("gemm_bindings.cpp",))


def register(registry, priority: int) -> None:
    pass
