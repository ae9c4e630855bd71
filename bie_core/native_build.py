"""Compiling and caching a backend's native extension: the one build helper every backend uses.

A :class:`NativeExtension` names its sources; :meth:`NativeExtension.build_dir` is keyed by everything
the library depends on, so that a cached build is reused only when it is the build these inputs make:

* the bytes of every source and of every header they include, transitively (``#include "..."`` and
  ``#include <...>`` resolved in the sources' folder and the extension's own include folders),
* the compiler and linker flags and the C++ compiler named by ``$CXX``,
* the torch, CUDA and Python versions, the GPU architecture (for CUDA builds),
* the versions of header-only toolkits found outside the extension (``versions``: CUTLASS).

Sources are compiled with ninja through ``torch.utils.cpp_extension.load``. A finished build leaves a
stamp, so that later processes load the library without running ninja; a failed build leaves a failure
stamp with the compiler's message, so that later processes do not pay for the same failing build
(``retry=True`` tries again). Nothing here runs on import.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

OK_STAMP = "bie_build_ok"
FAILED_STAMP = "bie_build_failed"
_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]', re.M)


class NativeBuildError(RuntimeError):
    """A native build failed or its result cannot be loaded; the message says why."""


#: torch's own build lock in a build directory (``torch.utils.cpp_extension`` waits while the file exists)
TORCH_LOCK = "lock"
#: bie's build lock: an advisory lock that the operating system drops when its process ends, however it ends
BUILD_LOCK = "bie_build.lock"


class _BuildLock:
    """One build at a time per build directory, without ever waiting on a dead process.

    torch's build lock is a file that exists while a build runs: a build that is interrupted (Ctrl-C in the first
    import, a killed job, a machine reset) leaves it behind, and every later process then waits on it forever,
    silently. bie holds an OS lock (``flock``) around torch's build instead: the OS releases it when the holder
    dies, so while bie holds it, no other bie build of the directory is running, and a torch lock file found then
    is left over from an interrupted one and is removed. A process that finds the lock held says so on stderr and
    waits for that build (a live one). Where ``fcntl`` is missing (Windows) torch's lock alone serves."""

    def __init__(self, d: Path):
        self.d = d
        self.fh = None

    def __enter__(self):
        try:
            import fcntl
        except ImportError:   # (no advisory locks here)
            return self
        self.fh = open(self.d / BUILD_LOCK, "a+")
        try:
            fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"bie: waiting for another process that is building in {self.d} ...", file=sys.stderr,
                  flush=True)
            fcntl.flock(self.fh, fcntl.LOCK_EX)
        stale = self.d / TORCH_LOCK
        if stale.exists():
            print(f"bie: removing {stale}, left by an interrupted build", file=sys.stderr, flush=True)
            stale.unlink(missing_ok=True)
        return self

    def __exit__(self, *exc):
        if self.fh is not None:
            import fcntl
            fcntl.flock(self.fh, fcntl.LOCK_UN)
            self.fh.close()
            self.fh = None
        return False


def link_flags() -> list[str]:
    """Linker flags for a native extension.

    Some toolchains link libstdc++ statically into shared objects (a GCC that has only
    ``libstdc++.a``, e.g. behind a ``CXX`` wrapper). The extension then carries its own copy of
    libstdc++ and, by default, exports it: the process's libstdc++ (loaded by torch) wins some
    symbols and the copy keeps others, so a stream built by one is formatted with the other's
    locale facets, and the first ``TORCH_CHECK`` message with a number in it crashes the process
    instead of raising. Keeping the symbols of static archives local makes the copy
    self-consistent; with a shared libstdc++ (the usual case) the flag changes nothing.
    """
    return ["-Wl,--exclude-libs,ALL"] if sys.platform.startswith("linux") else []


def cxx() -> str:
    return os.environ.get("CXX", "c++")


def cuda_arch() -> tuple[int, int]:
    """Compute capability of the current CUDA device."""
    import torch
    return tuple(torch.cuda.get_device_capability())


def gencode(cc: Sequence[int]) -> str:
    """The nvcc target for compute capability ``cc``. Hopper's own instructions (wgmma, setmaxnreg)
    need the arch-specific target sm_90a; other GPUs get their own SASS."""
    a = "90a" if tuple(cc) == (9, 0) else f"{cc[0]}{cc[1]}"
    return f"-gencode=arch=compute_{a},code=sm_{a}"


def have_nvcc() -> bool:
    from torch.utils.cpp_extension import CUDA_HOME
    return (bool(CUDA_HOME) and (Path(CUDA_HOME) / "bin" / "nvcc").exists()) or shutil.which("nvcc") is not None


def cache_root(env_var: str, subdir: str) -> Path:
    """``$env_var`` if set, else ``$XDG_CACHE_HOME/bie/<subdir>`` (default ``~/.cache/bie/<subdir>``)."""
    root = os.environ.get(env_var)
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "bie" / subdir


def included_files(sources: Sequence[Path], include_dirs: Sequence[Path]) -> list[Path]:
    """``sources`` and every file they include, transitively, that is found next to the including file
    or in ``include_dirs`` (system, torch and toolkit headers are not found there and are keyed by
    version instead). Sorted, without repeats."""
    seen: dict[Path, None] = {}
    todo = [Path(s).resolve() for s in sources]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen[p] = None
        try:
            text = p.read_text(errors="replace")
        except OSError as exc:
            raise NativeBuildError(f"cannot read {p}: {exc}") from exc
        for inc in _INCLUDE.findall(text):
            for d in (p.parent, *include_dirs):
                q = Path(d) / inc
                if q.is_file():
                    todo.append(q.resolve())
                    break
    return sorted(seen)


@dataclass(frozen=True)
class NativeExtension:
    """One native library of a backend.

    name
        Base name of the library (``bie_cuda``, ``bie_cutlass_binary``); the build directory and the
        library file carry it with the cache key.
    csrc
        The folder holding ``sources`` (and the headers they include).
    include_dirs
        Extra include folders passed to the compiler; headers found there are hashed only if they lie
        below ``csrc`` (toolkit headers are keyed by ``versions``).
    cache_env, cache_subdir
        Where builds are cached: ``$cache_env`` or ``~/.cache/bie/<cache_subdir>``.
    arch
        CUDA compute capability the build targets (part of the key), None for host code only.
    python_module
        A pybind11 module (imported from its file) rather than a library of ``TORCH_LIBRARY`` ops or C
        functions.
    """

    name: str
    csrc: Path
    sources: tuple
    cflags: tuple = ()
    cuda_cflags: tuple = ()
    include_dirs: tuple = ()
    cache_env: str = "BIE_NATIVE_CACHE"
    cache_subdir: str = "native"
    versions: tuple = ()
    arch: Optional[tuple] = None
    python_module: bool = False

    # ------------------------------------------------------------------ the key
    def files(self) -> list[Path]:
        """Every file whose bytes the build depends on."""
        local = [d for d in self.include_dirs if Path(d).resolve().is_relative_to(Path(self.csrc).resolve())]
        return included_files([Path(self.csrc) / s for s in self.sources], [Path(self.csrc), *local])

    def key(self) -> str:
        import torch
        h = hashlib.sha256()
        root = Path(self.csrc).resolve()
        for p in self.files():
            h.update(str(p.relative_to(root) if p.is_relative_to(root) else p.name).encode())
            h.update(p.read_bytes())
        h.update(repr((self.cflags, self.cuda_cflags, link_flags(), cxx(), self.versions,
                       self.python_module)).encode())
        parts = [self.name, "torch" + torch.__version__.replace("+", "_"),
                 f"py{sys.version_info[0]}{sys.version_info[1]}"]
        if self.arch is not None:
            parts += [f"cu{torch.version.cuda}", f"sm{self.arch[0]}{self.arch[1]}"]
        return "-".join(parts + [h.hexdigest()[:16]])

    def build_dir(self) -> Path:
        return cache_root(self.cache_env, self.cache_subdir) / self.key()

    def library(self) -> Path:
        # one module name per build directory: torch's in-process versioning renames a second build of the
        # same name (name_v1), which would then not be found
        d = self.build_dir()
        return d / (re.sub(r"[^0-9A-Za-z_]", "_", d.name) + (".pyd" if sys.platform == "win32" else ".so"))

    # ------------------------------------------------------------------ state
    def is_built(self) -> bool:
        try:
            d = self.build_dir()
            return (d / OK_STAMP).exists() and self.library().exists()
        except Exception:  # noqa: BLE001 - a probe never raises for this
            return False

    def failure(self) -> Optional[str]:
        """The message an earlier failed build left, or None."""
        stamp = self.build_dir() / FAILED_STAMP
        try:
            return stamp.read_text().strip() or "failed" if stamp.exists() else None
        except OSError:
            return None

    # ------------------------------------------------------------------ building
    def build(self, verbose: bool = False, retry: bool = False, what: str = "") -> Optional[float]:
        """Build unless a finished build is cached; return the seconds spent compiling (None when the
        cached build was used). Raises :class:`NativeBuildError` with the compiler's first error line
        and the path of the full log."""
        if self.is_built() and not retry:
            return None
        d = self.build_dir()
        fail_stamp = d / FAILED_STAMP
        if fail_stamp.exists() and not retry:
            raise NativeBuildError(f"an earlier build failed (log: {fail_stamp})")
        from torch.utils import cpp_extension
        d.mkdir(parents=True, exist_ok=True)
        with _BuildLock(d):
            if self.is_built() and not retry:   # another process finished it while this one waited
                return None
            return self._compile(cpp_extension, d, fail_stamp, verbose, what)

    def _compile(self, cpp_extension, d: Path, fail_stamp: Path, verbose: bool, what: str) -> float:
        what = what or f"the {self.name} kernels"
        target = f" for sm_{self.arch[0]}{self.arch[1]}" if self.arch is not None else ""
        print(f"bie: compiling {what}{target} (first use; cached in {d}) ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        kw = dict(extra_cflags=list(self.cflags), extra_ldflags=link_flags(),
                  extra_include_paths=[str(self.csrc), *map(str, self.include_dirs)])
        if self.cuda_cflags:
            kw["extra_cuda_cflags"] = list(self.cuda_cflags)
        try:
            cpp_extension.load(name=self.library().stem, sources=[str(Path(self.csrc) / s) for s in self.sources],
                               build_directory=str(d), is_python_module=self.python_module, verbose=verbose, **kw)
        except BaseException as exc:  # noqa: BLE001 - a build failure must never escape as anything else
            if isinstance(exc, KeyboardInterrupt):
                raise
            msg = str(exc).strip() or type(exc).__name__
            try:
                fail_stamp.write_text(f"{type(exc).__name__}: {msg}\n")
            except OSError:
                pass
            first = next((ln for ln in msg.splitlines() if "error" in ln.lower()), msg.splitlines()[0] if msg else "")
            raise NativeBuildError(f"native build failed ({type(exc).__name__}): {first[:300]} "
                                   f"(full log: {fail_stamp})") from exc
        seconds = time.perf_counter() - t0
        if not self.library().exists():
            raise NativeBuildError(f"the build did not produce {self.library()}")
        try:
            fail_stamp.unlink(missing_ok=True)
            (d / OK_STAMP).write_text(f"built in {seconds:.1f} s\n")
        except OSError:
            pass
        print(f"bie: {what} built in {seconds:.1f} s", file=sys.stderr, flush=True)
        return seconds

    def load_ops(self, verbose: bool = False, retry: bool = False) -> str:
        """Build if needed and load a library of ``TORCH_LIBRARY`` ops into ``torch.ops``; returns its path."""
        import torch
        self.build(verbose=verbose, retry=retry)
        path = str(self.library())
        torch.ops.load_library(path)
        return path

    def import_module(self):
        """Import a built pybind11 module straight from its file (no compiler or ninja run)."""
        import importlib.util
        name, so = self.library().stem, self.library()
        mod = sys.modules.get(name)
        if mod is not None:
            return mod
        try:
            spec = importlib.util.spec_from_file_location(name, str(so))
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
        except Exception as exc:  # noqa: BLE001 - any import failure is a reason, not a crash
            raise NativeBuildError(f"cannot import {so}: {exc}") from exc
        sys.modules[name] = mod
        return mod
