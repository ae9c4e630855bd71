"""Building and loading the CUDA extension (on first use, cached).

The build directory is keyed by torch version, CUDA version, GPU architecture
and a hash of the sources and flags, under ``$BIE_CUDA_CACHE`` (default
``~/.cache/bie/cuda``). A cached build is loaded directly; otherwise the
sources are compiled with ninja through ``torch.utils.cpp_extension.load``,
with a message on stderr while that happens. Nothing here runs on import.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
import threading
from pathlib import Path

import torch

from bie_core.native_build import link_flags

CSRC = Path(__file__).resolve().parent / "csrc"
# (the thin GEMV's kernels are split by width and type so that ninja compiles them in parallel)
SOURCES = ("bie_cuda.cpp", "binary.cu", "binary_conv.cu", "binary_wgmma.cu", "weight_only.cu", "wq_wgmma.cu", "wq_thin.cu",
           "wq_thin_w4_f16.cu", "wq_thin_w4_bf16.cu", "wq_thin_w2_f16.cu", "wq_thin_w2_bf16.cu", "wq_thin_w8_f16.cu",
           "wq_thin_w8_bf16.cu")
HEADERS = ("b1_common.cuh", "common.cuh", "hopper.cuh", "launchers.h", "wgmma_b1.cuh", "wgmma_rs.cuh",
           "wq_fragments.cuh", "wq_thin.cuh", "wq_thin_kernel.cuh")
_lock = threading.Lock()
_loaded: str | None = None
_error: BaseException | None = None


def _arch() -> tuple[int, int]:
    return tuple(torch.cuda.get_device_capability())


def _flags(arch) -> tuple[list, list]:
    a = f"{arch[0]}{arch[1]}"
    # Hopper's own instructions (wgmma) need the arch-specific target sm_90a
    a = "90a" if a == "90" else a
    cflags = ["-O3", "-std=c++17"]
    cuda = ["-O3", "-std=c++17", f"-gencode=arch=compute_{a},code=sm_{a}", "-lineinfo",
            "--expt-relaxed-constexpr"]
    # developers' knob for lab experiments: extra preprocessor definitions (part of the cache key), e.g.
    # BIE_CUDA_DEFINES="BIE_BW_AR=4" to build a variant of a kernel's compile-time constant
    cuda += [f"-D{d}" for d in os.environ.get("BIE_CUDA_DEFINES", "").split()]
    return cflags, cuda


def _key(arch) -> str:
    h = hashlib.sha256()
    for name in SOURCES + HEADERS:
        p = CSRC / name
        if p.exists():
            h.update(name.encode())
            h.update(p.read_bytes())
    h.update(repr((_flags(arch), link_flags())).encode())
    tv = torch.__version__.replace("+", "_")
    return f"torch{tv}-cu{torch.version.cuda}-sm{arch[0]}{arch[1]}-{h.hexdigest()[:12]}"


def cache_root() -> Path:
    root = os.environ.get("BIE_CUDA_CACHE")
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "bie" / "cuda"


def build_dir(arch=None) -> Path:
    arch = arch or _arch()
    return cache_root() / _key(arch)


def _lib_name(arch) -> str:
    return "bie_cuda_" + _key(arch).rsplit("-", 1)[1]


def _lib_path(arch) -> Path:
    return build_dir(arch) / (_lib_name(arch) + ".so")


def have_compiler() -> bool:
    from torch.utils.cpp_extension import CUDA_HOME
    return bool(CUDA_HOME) and (Path(CUDA_HOME) / "bin" / "nvcc").exists() or shutil.which("nvcc") is not None


def is_built() -> bool:
    try:
        return _lib_path(_arch()).exists()
    except Exception:  # noqa: BLE001 - a probe never raises for this
        return False


def probe_reason():
    """None if the kernels are built or can be built here, else a reason."""
    if is_built() or have_compiler():
        return None
    return ("the CUDA kernels are not built and no CUDA compiler (nvcc) was found: install the CUDA "
            "toolkit (or set CUDA_HOME) and run `bie build cuda`")


def load(verbose: bool = False, force: bool = False) -> str:
    """Load the extension, building it first if needed. Returns the library path."""
    global _loaded, _error
    if _loaded is not None and not force:
        return _loaded
    with _lock:
        if _loaded is not None and not force:
            return _loaded
        arch = _arch()
        lib = _lib_path(arch)
        if force or not lib.exists():
            d = build_dir(arch)
            d.mkdir(parents=True, exist_ok=True)
            print(f"bie-backend-cuda: building CUDA kernels for sm_{arch[0]}{arch[1]} "
                  f"(first use; about a minute; cached in {d}) ...", file=sys.stderr, flush=True)
            from torch.utils.cpp_extension import load as _cpp_load
            cflags, cuda = _flags(arch)
            try:
                _cpp_load(name=_lib_name(arch), sources=[str(CSRC / s) for s in SOURCES],
                          extra_cflags=cflags, extra_cuda_cflags=cuda, extra_ldflags=link_flags(),
                          extra_include_paths=[str(CSRC)],
                          build_directory=str(d), is_python_module=False, verbose=verbose)
            except Exception as exc:
                _error = exc
                raise RuntimeError(f"bie-backend-cuda: building the CUDA kernels failed ({exc}); "
                                   f"build directory {d}") from exc
            print("bie-backend-cuda: build finished", file=sys.stderr, flush=True)
            if _loaded is None:
                _loaded = str(lib)
            return _loaded
        torch.ops.load_library(str(lib))
        _loaded = str(lib)
        return _loaded


def ops():
    """``torch.ops.bie_cuda`` with the library loaded."""
    if _loaded is None:
        load()
    return torch.ops.bie_cuda
