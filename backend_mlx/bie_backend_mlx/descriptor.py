"""Entry point of bie-backend-mlx: a light descriptor (imports neither MLX nor torch)."""
from __future__ import annotations

import importlib.util
import sys

from bie_core.backend_api import BackendDescriptor, plugin_loader

from . import __version__

MIN_MLX = (0, 32)


def _install_hint() -> str:
    if sys.platform == "darwin":
        return "pip install bie-backend-mlx"
    return 'pip install "bie-backend-mlx[cpu]"'


def _dist_version(name: str):
    try:
        from importlib import metadata
        return metadata.version(name)
    except Exception:  # PackageNotFoundError, or broken metadata
        return None


def _parse(v: str) -> tuple:
    out = []
    for part in v.split(".")[:2]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


_PROBED = []


def probe():
    """Cheap check (metadata and module lookup only; MLX is imported by load()).
    Evaluated once per process. The reason says what is wrong; the fix is the
    descriptor's ``install_hint``, which bie prints beside it."""
    if not _PROBED:
        _PROBED.append(_probe())
    return _PROBED[0]


def _probe():
    if importlib.util.find_spec("mlx") is None:
        return "mlx is not installed"
    ver = _dist_version("mlx")
    if ver is not None and _parse(ver) < MIN_MLX:
        return (f"mlx {ver} is too old: bie-backend-mlx needs mlx >= {MIN_MLX[0]}.{MIN_MLX[1]} "
                f"({_install_hint()} --upgrade)")
    if sys.platform == "darwin":
        import platform
        if platform.machine() != "arm64":
            return "MLX needs Apple silicon (this Mac is not arm64)"
    elif not any(_dist_version(d) for d in ("mlx-cpu", "mlx-cuda", "mlx-cuda-12", "mlx-cuda-13")):
        # On Linux the `mlx` wheel alone has no compute backend (the `[cpu]`
        # extra brings it). A source build carries its own: only then is it
        # worth paying for a real import to find out.
        try:
            import mlx.core  # noqa: F401
        except ImportError as exc:
            return f"mlx is installed without a compute backend ({exc})"
    return None



backend = BackendDescriptor(
    name="mlx",
    api_version="1.0",
    # mps always; cpu only where MLX can run. The dispatcher warns about a
    # backend that is *not* loaded on every call for the device types it
    # lists, which is right for mps (MLX is the accelerator there) and wrong
    # for cpu (MLX is never chosen automatically for cpu tensors: its cpu
    # kernels sit below the reference), so an unusable MLX lists mps only.
    device_types=("mps",) if probe() else ("mps", "cpu"),
    load=plugin_loader(__package__ + ".plugin"),
    probe=probe,
    description=("Apple MLX: Metal for mps tensors (automatic); the MLX CPU backend for cpu tensors "
                 "(only when chosen explicitly, e.g. bie_core.set_backend('mlx'))"),
    install_hint=_install_hint(),
    distribution="bie-backend-mlx",
    version=__version__,
)
