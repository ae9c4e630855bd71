"""Finding the CUTLASS headers, and building/loading the kernel extensions.

Each kernel family (``binary``, ``integer``) is its own extension: a family that
fails to build leaves the others usable, and a change to one source rebuilds
only its family. An extension registers its ops with ``TORCH_LIBRARY`` under
its own namespace (``bie_cutlass_<family>``) and is loaded with
``torch.ops.load_library``.

The CUTLASS headers come from the ``nvidia-cutlass`` wheel, found with
``importlib.util.find_spec`` (nothing of it is imported). ``BIE_CUTLASS_INCLUDE``
may name another CUTLASS ``include`` directory (for a source checkout).

Builds are cached under ``$BIE_CUTLASS_CACHE`` (default ``~/.cache/bie/cutlass``),
keyed by torch version, CUDA version, GPU architecture, the CUTLASS version and
a hash of the sources and flags. Nothing here runs on import.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bie_core.native_build import link_flags

CSRC = Path(__file__).resolve().parent / "csrc"
_lock = threading.Lock()
_loaded: dict[str, str] = {}
_errors: dict[str, BaseException] = {}


class CutlassHeadersNotFound(RuntimeError):
    pass


@dataclass(frozen=True)
class Extension:
    """One kernel family: its sources (in csrc/) and the headers that key its cache."""
    family: str
    sources: tuple[str, ...]
    headers: tuple[str, ...] = ()
    extra_cuda_cflags: tuple[str, ...] = field(default_factory=tuple)

    @property
    def namespace(self) -> str:
        return f"bie_cutlass_{self.family}"


# ------------------------------------------------------------------ headers
def cutlass_root() -> Path:
    """The directory holding ``include/cutlass`` (and ``tools/util/include``)."""
    env = os.environ.get("BIE_CUTLASS_INCLUDE")
    if env:
        inc = Path(env)
        if not (inc / "cutlass" / "cutlass.h").exists():
            raise CutlassHeadersNotFound(f"BIE_CUTLASS_INCLUDE={env} has no cutlass/cutlass.h")
        return inc.parent
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        raise CutlassHeadersNotFound(
            "the CUTLASS headers were not found: install the nvidia-cutlass wheel "
            "(pip install nvidia-cutlass) or set BIE_CUTLASS_INCLUDE to a CUTLASS include directory")
    for loc in spec.submodule_search_locations:
        root = Path(loc) / "source"
        if (root / "include" / "cutlass" / "cutlass.h").exists():
            return root
    raise CutlassHeadersNotFound(
        "the nvidia-cutlass wheel is installed but has no source/include/cutlass/cutlass.h; "
        "reinstall it or set BIE_CUTLASS_INCLUDE")


def include_dirs() -> list[str]:
    root = cutlass_root()
    dirs = [root / "include", root / "tools" / "util" / "include", CSRC]
    return [str(d) for d in dirs if d.exists()]


def cutlass_version() -> str:
    """CUTLASS_MAJOR.MINOR.PATCH read from version.h (part of the cache key)."""
    try:
        text = (cutlass_root() / "include" / "cutlass" / "version.h").read_text()
    except (OSError, CutlassHeadersNotFound):
        return "unknown"
    parts = []
    for key in ("CUTLASS_MAJOR", "CUTLASS_MINOR", "CUTLASS_PATCH"):
        for line in text.splitlines():
            toks = line.split()
            if len(toks) >= 3 and toks[0] == "#define" and toks[1] == key:
                parts.append(toks[2])
                break
    return ".".join(parts) or "unknown"


# ------------------------------------------------------------------ flags and keys
def arch() -> tuple[int, int]:
    return tuple(torch.cuda.get_device_capability())


def gencode(cc: tuple[int, int]) -> str:
    # wgmma and setmaxnreg need the arch-specific target (sm_90a); other GPUs get their own SASS.
    a = f"{cc[0]}{cc[1]}"
    if cc == (9, 0):
        return "-gencode=arch=compute_90a,code=sm_90a"
    return f"-gencode=arch=compute_{a},code=sm_{a}"


def flags(ext: Extension, cc) -> tuple[list[str], list[str]]:
    cflags = ["-O3", "-std=c++17"]
    cuda = ["-O3", "-std=c++17", gencode(cc), "-lineinfo", "--expt-relaxed-constexpr",
            "--expt-extended-lambda", "-DNDEBUG", "-DCUTLASS_ENABLE_TENSOR_CORE_MMA=1",
            "-Xcompiler=-fno-strict-aliasing", *ext.extra_cuda_cflags]
    return cflags, cuda


def _key(ext: Extension, cc) -> str:
    h = hashlib.sha256()
    for name in ext.sources + ext.headers:
        p = CSRC / name
        h.update(name.encode())
        if p.exists():
            h.update(p.read_bytes())
    h.update(repr((flags(ext, cc), link_flags())).encode())
    h.update(cutlass_version().encode())
    tv = torch.__version__.replace("+", "_")
    return f"{ext.family}-torch{tv}-cu{torch.version.cuda}-sm{cc[0]}{cc[1]}-{h.hexdigest()[:12]}"


def cache_root() -> Path:
    root = os.environ.get("BIE_CUTLASS_CACHE")
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "bie" / "cutlass"


def build_dir(ext: Extension, cc=None) -> Path:
    return cache_root() / _key(ext, cc or arch())


def _lib_name(ext: Extension, cc) -> str:
    return f"bie_cutlass_{ext.family}_" + _key(ext, cc).rsplit("-", 1)[1]


def lib_path(ext: Extension, cc=None) -> Path:
    cc = cc or arch()
    return build_dir(ext, cc) / (_lib_name(ext, cc) + ".so")


# ------------------------------------------------------------------ probing
def have_compiler() -> bool:
    from torch.utils.cpp_extension import CUDA_HOME
    return (bool(CUDA_HOME) and (Path(CUDA_HOME) / "bin" / "nvcc").exists()) or shutil.which("nvcc") is not None


def is_built(ext: Extension) -> bool:
    try:
        return lib_path(ext).exists()
    except Exception:  # noqa: BLE001 - a probe never raises for this
        return False


def probe_reason():
    """None if kernels can be built (or are built) here, else the reason."""
    try:
        cutlass_root()
    except CutlassHeadersNotFound as exc:
        return str(exc)
    if not have_compiler():
        from . import plugin_extensions
        if all(is_built(e) for e in plugin_extensions.EXTENSIONS):
            return None
        return ("the CUTLASS kernels are not built and no CUDA compiler (nvcc) was found: install the CUDA "
                "toolkit (or set CUDA_HOME) and run `bie build cutlass`")
    return None


# ------------------------------------------------------------------ loading
def load(ext: Extension, verbose: bool = False, force: bool = False) -> str:
    """Load ``ext``, building it first if needed. Returns the library path.

    A failed build is remembered and re-raised (with the compiler's message)
    on later calls, so a broken toolchain costs one attempt, not one per call.
    """
    if ext.family in _loaded and not force:
        return _loaded[ext.family]
    if ext.family in _errors and not force:
        raise RuntimeError(f"bie-backend-cutlass: the '{ext.family}' kernels failed to build earlier: "
                           f"{_errors[ext.family]}")
    with _lock:
        if ext.family in _loaded and not force:
            return _loaded[ext.family]
        cc = arch()
        lib = lib_path(ext, cc)
        if force or not lib.exists():
            d = build_dir(ext, cc)
            d.mkdir(parents=True, exist_ok=True)
            print(f"bie-backend-cutlass: building the '{ext.family}' CUTLASS kernels for sm_{cc[0]}{cc[1]} "
                  f"(first use; a few minutes; cached in {d}) ...", file=sys.stderr, flush=True)
            from torch.utils.cpp_extension import load as _cpp_load
            cflags, cuda = flags(ext, cc)
            try:
                _cpp_load(name=_lib_name(ext, cc), sources=[str(CSRC / s) for s in ext.sources],
                          extra_cflags=cflags, extra_cuda_cflags=cuda, extra_ldflags=link_flags(),
                          extra_include_paths=include_dirs(),
                          build_directory=str(d), is_python_module=False, verbose=verbose)
            except Exception as exc:
                _errors[ext.family] = exc
                _forget_decisions()  # the family's capabilities now refuse: let the dispatcher decide again
                raise RuntimeError(f"bie-backend-cutlass: building the '{ext.family}' kernels failed ({exc}); "
                                   f"build directory {d}") from exc
            print(f"bie-backend-cutlass: '{ext.family}' build finished", file=sys.stderr, flush=True)
        else:
            torch.ops.load_library(str(lib))
        _loaded[ext.family] = str(lib)
        return _loaded[ext.family]


def failure(ext: Extension):
    """Why ``ext`` cannot run in this process (its build failed), or None."""
    exc = _errors.get(ext.family)
    if exc is None:
        return None
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"the '{ext.family}' CUTLASS kernels failed to build ({first[:200]}); `bie build cutlass` shows the compiler output"


def _forget_decisions() -> None:
    try:
        from bie_core import dispatch
        dispatch.clear_caches()
    except Exception:  # noqa: BLE001 - never hide the build error behind this
        pass


def ops(ext: Extension):
    """``torch.ops.bie_cutlass_<family>`` with the extension loaded."""
    if ext.family not in _loaded:
        load(ext)
    return getattr(torch.ops, ext.namespace)
