"""Build (once, cached) and load the native CPU kernels.

The extension is compiled with ninja through ``torch.utils.cpp_extension.load``
into a build directory keyed by the torch version, the Python version and a
hash of the sources and flags (``$TORCH_EXTENSIONS_DIR`` or
``~/.cache/bie/torch_extensions``). A finished build leaves a stamp file; later
processes load the library straight away (no compiler, no ninja run). A build
that failed leaves a failure stamp so that every later process does not pay for
the same failing build again: ``bie build cpu`` (or
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
import hashlib
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Optional

from bie_core.native_build import link_flags

NAME = "bie_cpu_native"
CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = ("binding.cpp", "isa_portable.cpp", "isa_avx2.cpp", "isa_avx512.cpp", "isa_avx512icl.cpp",
           "wq_entry.cpp", "wq_portable.cpp", "wq_avx2.cpp", "wq_avx512.cpp", "wq_avx512bf16.cpp")
HEADERS = ("bie_native.h", "scalar_util.h", "drivers.h", "prim_avx512.h", "wq_kernels.h")
#: the fused binary_linear entry (a pybind11 module; kernels from the library above)
FUSED_NAME = "bie_cpu_fused"
FUSED_SOURCES = ("fused.cpp",)
FUSED_HEADERS = ("bie_native.h", "scalar_util.h")
ABI_VERSION = 6  # BIE_NATIVE_ABI in bie_native.h

#: -ffp-contract=off: the epilogue must round float32(acc) * scale and + bias
#: separately, exactly as the reference does (no fused multiply-add).
BASE_CFLAGS = ["-O3", "-ffp-contract=off", "-fno-strict-aliasing"]

LEVEL_NAMES = ("portable", "avx2", "avx512", "avx512icl")

FEATURE_BITS = {"avx2": 1, "fma": 2, "f16c": 4, "popcnt": 8, "avx512(f,bw,vl,dq)": 16, "avx512_vpopcntdq": 32,
                "avx512_vnni": 64, "os-avx": 128, "os-avx512": 256, "bmi2": 512}


class BuildError(RuntimeError):
    pass


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


def cflags() -> list:
    return variants()[0]


def _compiler() -> str:
    return os.environ.get("CXX", "c++")


def build_root() -> Path:
    env = os.environ.get("TORCH_EXTENSIONS_DIR")
    return Path(env) if env else Path.home() / ".cache" / "bie" / "torch_extensions"


def source_hash(flags=None, files=SOURCES + HEADERS) -> str:
    h = hashlib.sha256()
    for name in files:
        h.update(name.encode())
        h.update((CSRC / name).read_bytes())
    h.update(" ".join(cflags() if flags is None else flags).encode())
    h.update(" ".join(link_flags()).encode())
    h.update(_compiler().encode())
    return h.hexdigest()[:16]


def build_dir(flags=None) -> Path:
    import torch
    tag = f"torch{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}"
    return build_root() / tag / f"{NAME}-{source_hash(flags)}"


def fused_build_dir() -> Path:
    import torch
    tag = f"torch{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}"
    return build_root() / tag / f"{FUSED_NAME}-{source_hash(BASE_CFLAGS, FUSED_SOURCES + FUSED_HEADERS)}"


def _ext_name(d: Path) -> str:
    # one extension name per build directory: torch's in-process versioning
    # renames a second build of the same name (name_v1), which would not be found
    return d.name.replace("-", "_")


def _lib_path(d: Path) -> Path:
    suffix = ".pyd" if sys.platform == "win32" else ".so"
    return d / f"{_ext_name(d)}{suffix}"


def precheck() -> Optional[str]:
    """A reason the native kernels cannot be built here, or None."""
    if sys.byteorder != "little":
        return "big-endian platform (the bit layouts assume little-endian)"
    if ctypes.sizeof(ctypes.c_void_p) != 8:
        return "not a 64-bit platform"
    cxx = _compiler()
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
               "bie_wq_gemm", "bie_wq_dequant", "bie_dquant"):
        getattr(lib, fn).restype = c_int
        getattr(lib, fn).argtypes = [vp]
    lib.bie_bconv.restype = c_int
    lib.bie_bconv.argtypes = [vp, vp]
    return lib


def load(force_rebuild: bool = False, verbose: bool = False) -> tuple:
    """Build if needed and load. Returns ``(ctypes library, build dir, seconds
    spent building or None, threaded)``; raises :class:`BuildError` with a clear message."""
    reason = precheck()
    if reason:
        raise BuildError(reason)
    force_rebuild = force_rebuild or os.environ.get("BIE_CPU_NATIVE_REBUILD", "") not in ("", "0")
    vs = variants()
    if not force_rebuild:
        for flags in vs:                       # a finished build: load it, no compiler involved
            d = build_dir(flags)
            if (d / "bie_build_ok").exists() and _lib_path(d).exists():
                return _open(d) + (None, "-fopenmp" in flags or len(vs) == 1)
    errors = []
    for flags in vs:
        d = build_dir(flags)
        fail_stamp = d / "bie_build_failed"
        if fail_stamp.exists() and not force_rebuild:
            errors.append(f"an earlier build failed (log: {fail_stamp})")
            continue
        try:
            seconds = _compile(d, flags, verbose)
        except BuildError as exc:
            errors.append(str(exc))
            continue
        return _open(d) + (seconds, "-fopenmp" in flags or len(vs) == 1)
    msg = errors[0]
    if len(errors) > 1:
        msg += f"; without OpenMP too: {errors[1]}"
    if all(e.startswith("an earlier build failed") for e in errors):
        msg += "; run `bie build cpu` or set BIE_CPU_NATIVE_REBUILD=1 to retry"
    raise BuildError(msg)


def _open(d: Path) -> tuple:
    so = _lib_path(d)
    try:
        lib = _declare(ctypes.CDLL(str(so)))
    except OSError as exc:
        raise BuildError(f"cannot load {so}: {exc}") from exc
    if lib.bie_abi_version() != ABI_VERSION:
        raise BuildError(f"{so} has ABI {lib.bie_abi_version()}, expected {ABI_VERSION}")
    return lib, d


def _compile(d: Path, flags: list, verbose: bool, sources=SOURCES, what: str = "the native CPU kernels",
             python_module: bool = False) -> float:
    from torch.utils import cpp_extension
    d.mkdir(parents=True, exist_ok=True)
    fail_stamp = d / "bie_build_failed"
    omp = "" if "-fopenmp" in flags or not _uses_openmp() or python_module else " without OpenMP"
    sys.stderr.write(f"bie-backend-cpu: compiling {what}{omp} (first use, once per torch "
                     f"version; ~{15 if python_module else 20} s on 2 cores) into {d} ...\n")
    sys.stderr.flush()
    t0 = time.perf_counter()
    try:
        built = cpp_extension.load(
            name=_ext_name(d),
            sources=[str(CSRC / s) for s in sources],
            extra_cflags=flags,
            extra_ldflags=link_flags(),
            extra_include_paths=[str(CSRC)],
            build_directory=str(d),
            is_python_module=python_module,
            verbose=verbose,
        )
    except BaseException as exc:  # noqa: BLE001 - a build failure must never escape as anything else
        if isinstance(exc, KeyboardInterrupt):
            raise
        msg = str(exc).strip() or type(exc).__name__
        try:
            fail_stamp.write_text(f"{type(exc).__name__}: {msg}\n")
        except OSError:
            pass
        first = next((ln for ln in msg.splitlines() if "error" in ln.lower()), msg.splitlines()[0] if msg else "")
        raise BuildError(f"native build failed ({type(exc).__name__}): {first[:300]} "
                         f"(full log: {fail_stamp})") from exc
    seconds = time.perf_counter() - t0
    if python_module:
        if not _lib_path(d).exists():
            raise BuildError(f"the build did not produce {_lib_path(d)}")
    elif not isinstance(built, str) or Path(built).resolve() != _lib_path(d).resolve():
        raise BuildError(f"the build produced {built!r}, expected {_lib_path(d)}")
    try:
        fail_stamp.unlink(missing_ok=True)
        (d / "bie_build_ok").write_text(f"built in {seconds:.1f} s\n")
    except OSError:
        pass
    sys.stderr.write(f"bie-backend-cpu: {what} built in {seconds:.1f} s\n")
    return seconds


def load_fused(force_rebuild: bool = False, verbose: bool = False) -> tuple:
    """Build if needed and import the fused binary_linear module (``csrc/fused.cpp``).
    Returns ``(module, build dir, seconds spent building or None)``; raises
    :class:`BuildError`. Called only once the library of :func:`load` is loaded
    (the module calls its entry points)."""
    reason = precheck()
    if reason:
        raise BuildError(reason)
    force_rebuild = force_rebuild or os.environ.get("BIE_CPU_NATIVE_REBUILD", "") not in ("", "0")
    d = fused_build_dir()
    seconds = None
    if force_rebuild or not ((d / "bie_build_ok").exists() and _lib_path(d).exists()):
        fail_stamp = d / "bie_build_failed"
        if fail_stamp.exists() and not force_rebuild:
            raise BuildError(f"an earlier build failed (log: {fail_stamp}); run `bie build cpu` or set "
                             "BIE_CPU_NATIVE_REBUILD=1 to retry")
        seconds = _compile(d, list(BASE_CFLAGS), verbose, FUSED_SOURCES,
                           "the fused binary_linear entry (pybind11)", python_module=True)
    return _import(d), d, seconds


def _import(d: Path):
    """Import the built module straight from its file (no compiler or ninja run)."""
    import importlib.util
    name, so = _ext_name(d), _lib_path(d)
    mod = sys.modules.get(name)
    if mod is not None:
        return mod
    try:
        spec = importlib.util.spec_from_file_location(name, str(so))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    except Exception as exc:  # noqa: BLE001 - any import failure is a reason, not a crash
        raise BuildError(f"cannot import {so}: {exc}") from exc
    sys.modules[name] = mod
    if getattr(mod, "abi", None) != ABI_VERSION:
        raise BuildError(f"{so} has ABI {getattr(mod, 'abi', None)}, expected {ABI_VERSION}")
    return mod


def feature_names(bits: int) -> list:
    return [name for name, b in FEATURE_BITS.items() if bits & b and not name.startswith("os-")]
