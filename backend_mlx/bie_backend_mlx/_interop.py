"""Moving tensors between torch and MLX, safely.

What the platforms allow (measured with mlx 0.32.4, torch 2.13; see docs/mlx-backend.md):

torch -> MLX
    * ``cpu`` tensors: MLX refuses to wrap foreign CPU memory
      (``mx.from_dlpack(t, copy=False)`` raises "Cannot import a CPU array
      without a copy"), so activations are **copied** (``copy=True``, explicit:
      should a later MLX learn to alias CPU memory we would not silently start
      sharing a buffer that MLX may donate to an output). Cost: one memcpy of
      the activation (about 16 us for a 32x4096 fp32 tensor on the CI machine).
    * ``mps`` tensors (Apple silicon): zero-copy through Metal DLPack where
      the installed MLX supports it (mlx PR #3531), after
      ``torch.mps.synchronize()`` so that pending PyTorch writes are visible to
      MLX. Older MLX: a copy through host memory.

MLX -> torch
    Results are evaluated (``mx.eval``: MLX is lazy, and on Metal this is also
    the synchronisation PyTorch needs before reading) and handed over through
    DLPack **without a copy**: the DLPack capsule holds a reference to the MLX
    buffer, which therefore lives exactly as long as the torch tensor (no
    ``from_blob`` on memory MLX may free -- the seed system's bug). On ``mps``,
    if torch cannot import the Metal DLPack capsule, the result crosses
    through host memory.

Rules the kernels follow so that sharing stays safe:

* every imported array is referenced from a keep-alive list until the
  kernel returns (after its result is evaluated), so an array that aliases
  torch memory (``mps`` zero-copy import) is never a donation candidate (MLX
  reuses the buffer of an input whose only reference is the graph, e.g. a
  per-channel scale of the output's size) and MLX never writes into a torch
  tensor;
* a result handed to torch is always a freshly computed array, never a
  prepared (cached) weight or a view of one, so writing into the torch result
  cannot corrupt the cache;
* prepared (cached) layouts are built from copies (:class:`owned_copies`),
  never from zero-copy imports, so no cached array aliases a torch buffer.

MLX graph building and evaluation happen under one process-wide lock: MLX does
not document its Python API as thread-safe, and torch may call kernels from
several threads (DataLoader workers, DDP hooks, serving threads).
"""
from __future__ import annotations

import contextlib
import functools
import threading

import mlx.core as mx
import torch

LOCK = threading.RLock()

# Imported arrays of the kernel calls in progress (see the module docstring:
# an extra reference makes them non-donatable). Guarded by LOCK.
_KEEP: list = []
# > 0 while building a prepared (cached) layout: imports are always copies,
# so that no cached array aliases a torch buffer. Guarded by LOCK.
_OWNED = [0]


class owned_copies:
    """Within this block (under LOCK) every ``to_mlx`` import is a copy."""

    def __enter__(self):
        _OWNED[0] += 1

    def __exit__(self, *exc):
        _OWNED[0] -= 1

TORCH_TO_MX = {
    torch.float32: mx.float32, torch.float16: mx.float16, torch.bfloat16: mx.bfloat16,
    torch.int8: mx.int8, torch.uint8: mx.uint8, torch.int16: mx.int16, torch.int32: mx.int32,
    torch.int64: mx.int64, torch.bool: mx.bool_,
}

_HAS_GPU = None


def has_gpu() -> bool:
    global _HAS_GPU
    if _HAS_GPU is None:
        try:
            _HAS_GPU = bool(mx.metal.is_available())
        except Exception:  # pragma: no cover - builds without the metal module
            _HAS_GPU = False
    return _HAS_GPU


def device_for(device: torch.device):
    """The MLX device that computes for tensors on ``device``."""
    if device.type == "mps":
        return mx.gpu
    return mx.cpu


def mx_dtype(dtype: torch.dtype):
    try:
        return TORCH_TO_MX[dtype]
    except KeyError:
        raise TypeError(f"bie-backend-mlx: no MLX dtype for {dtype}") from None


def to_mlx(t: torch.Tensor) -> "mx.array":
    """An MLX array with the values of ``t`` (any strides), safe to read
    until the calling kernel has evaluated its result. MLX holds no float64 or complex128: those arrive
    narrowed to float32 / complex64 (what the kernels that take float64 scales compute in anyway); a kernel
    whose output keeps its input's dtype declares the dtypes it serves instead (transpose_2d)."""
    t = t.detach()
    if t.device.type == "cpu":
        a = mx.from_dlpack(t, copy=True)
    elif t.device.type == "mps":  # pragma: no cover - Apple silicon only
        torch.mps.synchronize()  # PyTorch's pending writes must land before MLX reads
        if not t.is_contiguous():
            t = t.contiguous()
            torch.mps.synchronize()
        try:
            a = mx.from_dlpack(t, copy=True) if _OWNED[0] else mx.from_dlpack(t)
        except Exception:  # MLX without Metal DLPack import: through host memory
            a = mx.from_dlpack(t.cpu(), copy=True)
    else:
        raise ValueError(f"bie-backend-mlx cannot read tensors on {t.device}")
    if _KEEP:
        _KEEP[-1].append(a)
    return a


def maybe_mlx(t):
    return None if t is None else to_mlx(t)


def to_torch(a: "mx.array", device: torch.device, contiguous: bool = True) -> torch.Tensor:
    """Evaluate ``a`` and hand it to torch on ``device`` without a copy where
    the platform allows. ``a`` must be a freshly computed array (never a cached one).

    A strided result (a transposed view, say) crosses as it is and is made
    contiguous by torch, only when needed: asking MLX for ``mx.contiguous``
    costs a scheduled op even when it is a no-op (about 45 us measured).
    """
    mx.eval(a)
    if device.type == "cpu":
        out = torch.from_dlpack(a)
    elif device.type == "mps":  # pragma: no cover - Apple silicon only
        try:
            out = torch.from_dlpack(a)  # Metal DLPack (zero-copy) or unified host memory
        except Exception:
            out = _via_host(a)
        if out.device.type != "mps":
            out = out.to(device)
    else:
        raise ValueError(f"bie-backend-mlx cannot write tensors on {device}")
    return out.contiguous() if contiguous else out


def _via_host(a):  # pragma: no cover - only where DLPack export fails
    import numpy as np
    if a.dtype == mx.bfloat16:
        return torch.from_numpy(np.array(a.view(mx.uint16), copy=True)).view(torch.bfloat16)
    return torch.from_numpy(np.array(a, copy=True))


def first_device(args) -> torch.device:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device
    return torch.device("cpu")


@contextlib.contextmanager
def _mlx_call(args):
    """Hold the MLX lock on the stream of the MLX device matching ``args``' tensors, with a fresh
    keep-alive list for the arrays the call imports."""
    with LOCK, mx.stream(device_for(first_device(args))):
        _KEEP.append([])
        try:
            yield
        finally:
            _KEEP.pop()


def kernel(fn):
    """Run ``fn`` under the MLX lock with the MLX device matching its tensors."""
    @functools.wraps(fn)
    def wrapper(*args, **kw):
        with _mlx_call(args):
            return fn(*args, **kw)   # evaluates its result before returning
    return wrapper


def preparer(fn):
    """As :func:`kernel` for ``prepare`` functions: evaluates what they return
    (prepared layouts are materialised once, not recomputed lazily per call)."""
    @functools.wraps(fn)
    def wrapper(*args, **kw):
        with _mlx_call(args):
            with owned_copies():
                out = fn(*args, **kw)
            arrays = [v for v in _walk(out) if isinstance(v, mx.array)]
            if arrays:
                mx.eval(*arrays)
            return out
    return wrapper


def _walk(obj):
    if isinstance(obj, mx.array):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _walk(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _walk(v)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        for v in vars(obj).values():
            yield from _walk(v)
