"""Build (once, cached) and load the native CPU kernels.

The build goes through the shared helper (``bie_core.backend_api.NativeExtension``): its directory is
keyed by the torch and Python versions, the compiler, the flags and every source and included header,
under ``$TORCH_EXTENSIONS_DIR`` or ``~/.cache/bie/torch_extensions``. A finished build is loaded straight
away by later processes; a failed one is not retried by every process: ``bie build cpu`` (or
``BIE_CPU_NATIVE_REBUILD=1``) retries it.

The library exposes plain C functions (``csrc/binding.cpp``) called through
ctypes, which releases the GIL during each call. Only ``ATen/Parallel.h`` is
included from torch, which keeps the whole build to a few seconds per file.

A second, small extension (``csrc/fused.cpp``, :func:`load_fused`) is a
pybind11 module taking tensors directly: the fused ``binary_linear`` in one
C++ call, using the library's packing and GEMM entry points. It is built and
cached the same way, in its own directory; its failure only costs speed.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import sys
from pathlib import Path
from typing import Optional

from bie_core.backend_api import NativeBuildError, NativeExtension

NAME = "bie_cpu_native"
CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = ("binding.cpp", "isa_portable.cpp", "isa_avx2.cpp", "isa_avx512.cpp", "isa_avx512icl.cpp",
           "wq_entry.cpp", "wq_portable.cpp", "wq_avx2.cpp", "wq_avx512.cpp", "wq_avx512bf16.cpp")
#: the fused binary_linear entry and the bound plans of the integer and weight-only layers (a pybind11
#: module; kernels from the library above)
FUSED_NAME = "bie_cpu_fused"
FUSED_SOURCES = ("fused.cpp", "fused_plans.cpp")
ABI_VERSION = 7  # BIE_NATIVE_ABI in bie_native.h

#: -ffp-contract=off: the epilogue must round float32(acc) * scale and + bias
#: separately, exactly as the reference does (no fused multiply-add).
BASE_CFLAGS = ["-O3", "-ffp-contract=off", "-fno-strict-aliasing"]

LEVEL_NAMES = ("portable", "avx2", "avx512", "avx512icl")

FEATURE_BITS = {"avx2": 1, "fma": 2, "f16c": 4, "popcnt": 8, "avx512(f,bw,vl,dq)": 16, "avx512_vpopcntdq": 32,
                "avx512_vnni": 64, "os-avx": 128, "os-avx512": 256, "bmi2": 512}

BuildError = NativeBuildError


def _uses_openmp() -> bool:
    """at::parallel_for is inline code: with torch's OpenMP backend the
    extension must be compiled with -fopenmp to run in parallel (it then uses
    the OpenMP runtime torch already loaded)."""
    import torch
    try:
        return "parallel backend: OpenMP" in torch.__config__.parallel_info()
    except Exception:  # pragma: no cover - very old or unusual torch builds
        return False


def variants() -> list:
    """Flag sets to try, best first. With torch's OpenMP backend the first one
    adds -fopenmp; the second, without it, is the fallback for a compiler
    without OpenMP support (the kernels then run on the calling thread)."""
    if _uses_openmp():
        return [BASE_CFLAGS + ["-fopenmp"], list(BASE_CFLAGS)]
    return [list(BASE_CFLAGS)]


def _extension(flags) -> NativeExtension:
    return NativeExtension(name=NAME, csrc=CSRC, sources=SOURCES, cflags=tuple(flags),
                           cache_env="TORCH_EXTENSIONS_DIR", cache_subdir="torch_extensions")


def _fused_extension() -> NativeExtension:
    return NativeExtension(name=FUSED_NAME, csrc=CSRC, sources=FUSED_SOURCES, cflags=tuple(BASE_CFLAGS),
                           cache_env="TORCH_EXTENSIONS_DIR", cache_subdir="torch_extensions", python_module=True)


def build_dir(flags=None) -> Path:
    return _extension(variants()[0] if flags is None else flags).build_dir()


def precheck() -> Optional[str]:
    """A reason the native kernels cannot be built here, or None."""
    if sys.byteorder != "little":
        return "big-endian platform (the bit layouts assume little-endian)"
    if ctypes.sizeof(ctypes.c_void_p) != 8:
        return "not a 64-bit platform"
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        return f"no C++ compiler: {cxx!r} not found (install g++ or clang++, or set CXX)"
    from torch.utils import cpp_extension
    if not cpp_extension.is_ninja_available():
        return "ninja not found (pip install ninja)"
    return None


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    c_int, vp, c_uint = ctypes.c_int, ctypes.c_void_p, ctypes.c_uint
    for fn in ("bie_abi_version", "bie_max_level", "bie_get_level", "bie_num_threads", "bie_int_layout",
               "bie_iconv_kstep"):
        getattr(lib, fn).restype = c_int
        getattr(lib, fn).argtypes = []
    lib.bie_set_level.restype = c_int
    lib.bie_set_level.argtypes = [c_int]
    lib.bie_cpu_features.restype = c_uint
    lib.bie_cpu_features.argtypes = []
    for fn in ("bie_pack", "bie_quant", "bie_bgemm", "bie_igemm", "bie_ibmm", "bie_bbmm", "bie_iconv", "bie_semb",
               "bie_wq_gemm", "bie_wq_dequant", "bie_dquant", "bie_lsq"):
        getattr(lib, fn).restype = c_int
        getattr(lib, fn).argtypes = [vp]
    lib.bie_bconv.restype = c_int
    lib.bie_bconv.argtypes = [vp, vp]
    return lib


def _rebuild_asked(force_rebuild: bool) -> bool:
    return force_rebuild or os.environ.get("BIE_CPU_NATIVE_REBUILD", "") not in ("", "0")


def load(force_rebuild: bool = False, verbose: bool = False) -> tuple:
    """Build if needed and load. Returns ``(ctypes library, build dir, seconds
    spent building or None, threaded)``; raises :class:`BuildError` with a clear message."""
    reason = precheck()
    if reason:
        raise BuildError(reason)
    retry = _rebuild_asked(force_rebuild)
    vs = variants()
    exts = [(_extension(flags), "-fopenmp" in flags or len(vs) == 1) for flags in vs]
    if not retry:
        for ext, threaded in exts:            # a finished build: load it, no compiler involved
            if ext.is_built():
                return _open(ext) + (None, threaded)
    errors = []
    for i, (ext, threaded) in enumerate(exts):
        omp = " without OpenMP" if i and len(exts) > 1 else ""
        try:
            seconds = ext.build(verbose=verbose, retry=retry, what=f"the native CPU kernels{omp}")
        except BuildError as exc:
            errors.append(str(exc))
            continue
        return _open(ext) + (seconds, threaded)
    msg = errors[0]
    if len(errors) > 1:
        msg += f"; without OpenMP too: {errors[1]}"
    if all(e.startswith("an earlier build failed") for e in errors):
        msg += "; run `bie build cpu` or set BIE_CPU_NATIVE_REBUILD=1 to retry"
    raise BuildError(msg)


def _open(ext: NativeExtension) -> tuple:
    so = ext.library()
    try:
        lib = _declare(ctypes.CDLL(str(so)))
    except OSError as exc:
        raise BuildError(f"cannot load {so}: {exc}") from exc
    if lib.bie_abi_version() != ABI_VERSION:
        raise BuildError(f"{so} has ABI {lib.bie_abi_version()}, expected {ABI_VERSION}")
    return lib, ext.build_dir()


def load_fused(force_rebuild: bool = False, verbose: bool = False) -> tuple:
    """Build if needed and import the fused binary_linear module (``csrc/fused.cpp``).
    Returns ``(module, build dir, seconds spent building or None)``; raises
    :class:`BuildError`. Called only once the library of :func:`load` is loaded
    (the module calls its entry points)."""
    reason = precheck()
    if reason:
        raise BuildError(reason)
    ext = _fused_extension()
    try:
        seconds = ext.build(verbose=verbose, retry=_rebuild_asked(force_rebuild),
                            what="the fused binary_linear entry (pybind11)")
    except BuildError as exc:
        if str(exc).startswith("an earlier build failed"):
            raise BuildError(f"{exc}; run `bie build cpu` or set BIE_CPU_NATIVE_REBUILD=1 to retry") from None
        raise
    mod = ext.import_module()
    if getattr(mod, "abi", None) != ABI_VERSION:
        raise BuildError(f"{ext.library()} has ABI {getattr(mod, 'abi', None)}, expected {ABI_VERSION}")
    return mod, ext.build_dir(), seconds


def feature_names(bits: int) -> list:
    return [name for name, b in FEATURE_BITS.items() if bits & b and not name.startswith("os-")]
