"""Finding the CUTLASS headers, and building/loading the kernel extensions.

Each kernel family (``binary``, ``integer``, ``weight_only``) is its own extension: a family that
fails to build leaves the others usable, and a change to one source rebuilds
only its family. An extension registers its ops with ``TORCH_LIBRARY`` under
its own namespace (``bie_cutlass_<family>``) and is loaded with
``torch.ops.load_library``; a family built as a Python module (``python_module``) is imported
instead, which registers the same ops and also gives its launch functions as plain Python callables
(:func:`direct`) for the layers' bound inference calls.

The CUTLASS headers come from the ``nvidia-cutlass`` wheel, found with
``importlib.util.find_spec`` (nothing of it is imported). ``BIE_CUTLASS_INCLUDE``
may name another CUTLASS ``include`` directory (for a source checkout).

Builds go through the shared helper (``bie_core.backend_api.NativeExtension``) and are cached under
``$BIE_CUTLASS_CACHE`` (default ``~/.cache/bie/cutlass``), keyed by the torch and CUDA versions, the GPU
architecture, the CUTLASS version, the flags and every source and included header. Nothing here runs on
import.
"""
from __future__ import annotations

import importlib.util
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bie_core.backend_api import NativeExtension, cache_root as _cache_root, capabilities_changed, cuda_arch, \
    gencode, have_nvcc

CSRC = Path(__file__).resolve().parent / "csrc"
_lock = threading.Lock()
_loaded: dict[str, str] = {}
_modules: dict = {}
_errors: dict[str, BaseException] = {}


class CutlassHeadersNotFound(RuntimeError):
    pass


@dataclass(frozen=True)
class Extension:
    """One kernel family: its sources (in csrc/; the headers they include key its cache too); python_module:
    the library is also a pybind11 module (a ``PYBIND11_MODULE`` in its sources) and is imported as one."""
    family: str
    sources: tuple[str, ...]
    extra_cuda_cflags: tuple[str, ...] = field(default_factory=tuple)
    python_module: bool = False

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
    return cuda_arch()


def flags(ext: Extension, cc) -> tuple[list[str], list[str]]:
    cflags = ["-O3", "-std=c++17"]
    cuda = ["-O3", "-std=c++17", gencode(cc), "-lineinfo", "--expt-relaxed-constexpr",
            "--expt-extended-lambda", "-DNDEBUG", "-DCUTLASS_ENABLE_TENSOR_CORE_MMA=1",
            "-Xcompiler=-fno-strict-aliasing", *ext.extra_cuda_cflags]
    return cflags, cuda


def native(ext: Extension, cc=None) -> NativeExtension:
    """The shared helper's description of ``ext`` built for compute capability ``cc``."""
    cc = tuple(cc or arch())
    cflags, cuda = flags(ext, cc)
    try:
        incs = tuple(include_dirs())
    except CutlassHeadersNotFound:
        incs = ()
    return NativeExtension(name=f"bie_cutlass_{ext.family}", csrc=CSRC, sources=ext.sources, cflags=tuple(cflags),
                           cuda_cflags=tuple(cuda), include_dirs=incs, cache_env="BIE_CUTLASS_CACHE",
                           cache_subdir="cutlass", versions=(f"cutlass {cutlass_version()}",), arch=cc,
                           python_module=ext.python_module)


def cache_root() -> Path:
    return _cache_root("BIE_CUTLASS_CACHE", "cutlass")


def build_dir(ext: Extension, cc=None) -> Path:
    return native(ext, cc).build_dir()


def lib_path(ext: Extension, cc=None) -> Path:
    return native(ext, cc).library()


# ------------------------------------------------------------------ probing
def is_built(ext: Extension) -> bool:
    try:
        return native(ext).is_built()
    except Exception:  # noqa: BLE001 - a probe never raises for this
        return False


def probe_reason():
    """None if kernels can be built (or are built) here, else the reason."""
    try:
        cutlass_root()
    except CutlassHeadersNotFound as exc:
        return str(exc)
    if not have_nvcc():
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
        nat = native(ext)
        try:
            if ext.python_module:   # importing the module registers its ops too
                nat.build(verbose=verbose, retry=force)
                _modules[ext.family] = nat.import_module()
                _loaded[ext.family] = str(nat.library())
            else:
                _loaded[ext.family] = nat.load_ops(verbose=verbose, retry=force)
        except Exception as exc:
            _errors[ext.family] = exc
            capabilities_changed()  # the family's capabilities now refuse: let the dispatcher decide again
            raise RuntimeError(f"bie-backend-cutlass: building the '{ext.family}' kernels failed ({exc}); "
                               f"build directory {nat.build_dir()}") from exc
        return _loaded[ext.family]


def failure(ext: Extension):
    """Why ``ext`` cannot run in this process (its build failed), or None."""
    exc = _errors.get(ext.family)
    if exc is None:
        return None
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"the '{ext.family}' CUTLASS kernels failed to build ({first[:200]}); `bie build cutlass` shows the compiler output"


def ops(ext: Extension):
    """``torch.ops.bie_cutlass_<family>`` with the extension loaded."""
    if ext.family not in _loaded:
        load(ext)
    return getattr(torch.ops, ext.namespace)


def direct(ext: Extension):
    """The Python module of a ``python_module`` family, loaded: its launch functions with the same arguments and
    checks as the ops of the same names, called without the op schema matching (the bound inference calls)."""
    if ext.family not in _loaded:
        load(ext)
    return _modules[ext.family]
