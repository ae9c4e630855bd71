"""Building and loading the CUDA extension (on first use, cached).

The build goes through the shared helper (``bie_core.backend_api.NativeExtension``): its directory is
keyed by the torch and CUDA versions, the GPU architecture, the flags and every source and included
header, under ``$BIE_CUDA_CACHE`` (default ``~/.cache/bie/cuda``). A cached build is loaded directly;
otherwise the sources are compiled with ninja, with a message on stderr while that happens. Nothing here
runs on import.
"""
from __future__ import annotations

import threading
from pathlib import Path

import torch

from bie_core.backend_api import NativeExtension, cuda_arch, gencode, have_nvcc

CSRC = Path(__file__).resolve().parent / "csrc"
# (the thin GEMV's kernels are split by width, type and group so that ninja compiles them in parallel: csrc/wq_thin.cuh)
THIN_SOURCES = tuple(f"wq_thin_w{bits}_{t}{group}.cu" for bits in (4, 8, 2) for t in ("f16", "bf16")
                     for group in (("", "_wide", "_deep") if bits != 2 else ("", "_wide")))
SOURCES = ("bie_cuda.cpp", "binary.cu", "binary_conv.cu", "binary_wgmma.cu", "weight_only.cu", "wq_skinny.cu",
           "wq_wgmma.cu", "wq_thin.cu", *THIN_SOURCES, "quantize.cu", "transpose.cu", "dynamic_gemv.cu",
           "dynamic_quantize.cu", "dynamic_quantize_cols.cu", "mbwq.cu", "mbwq_skinny.cu")
_lock = threading.Lock()
_loaded: str | None = None
_module = None


def extension(arch=None) -> NativeExtension:
    arch = tuple(arch or cuda_arch())
    return NativeExtension(
        name="bie_cuda", csrc=CSRC, sources=SOURCES, cflags=("-O3", "-std=c++17"),
        cuda_cflags=("-O3", "-std=c++17", gencode(arch), "-lineinfo", "--expt-relaxed-constexpr"),
        cache_env="BIE_CUDA_CACHE", cache_subdir="cuda", arch=arch, python_module=True)


def build_dir(arch=None) -> Path:
    return extension(arch).build_dir()


def is_built() -> bool:
    try:
        return extension().is_built()
    except Exception:  # noqa: BLE001 - a probe never raises for this
        return False


def probe_reason():
    """None if the kernels are built or can be built here, else a reason."""
    if is_built() or have_nvcc():
        return None
    return ("the CUDA kernels are not built and no CUDA compiler (nvcc) was found: install the CUDA "
            "toolkit (or set CUDA_HOME) and run `bie build cuda`")


def load(verbose: bool = False, force: bool = False) -> str:
    """Load the extension, building it first if needed. Returns the library path.

    The library is imported as a Python module: importing it registers its ``torch.ops.bie_cuda`` ops (what the
    registered kernels call) and gives the same functions as plain Python callables (:func:`direct`), which the
    layers' bound inference calls use for their smaller per-call cost."""
    global _loaded, _module
    if _loaded is not None and not force:
        return _loaded
    with _lock:
        if _loaded is None or force:
            ext = extension()
            try:
                ext.build(verbose=verbose, retry=force)
                _module = ext.import_module()
                _loaded = str(ext.library())
            except Exception as exc:
                raise RuntimeError(f"bie-backend-cuda: building the CUDA kernels failed ({exc}); "
                                   f"build directory {ext.build_dir()}") from exc
        return _loaded


def ops():
    """``torch.ops.bie_cuda`` with the library loaded."""
    if _loaded is None:
        load()
    return torch.ops.bie_cuda


def direct():
    """The library's Python module: the launch functions the bound inference calls use (csrc/bie_cuda.cpp
    PYBIND11_MODULE), with the same arguments and checks as the ops of the same names."""
    if _module is None:
        load()
    return _module
