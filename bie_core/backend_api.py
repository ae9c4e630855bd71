"""Everything a backend imports from bie: the one door between the core and its plugins.

A backend distribution imports ``bie_core.backend_api`` (and nothing else of ``bie_core`` but its
public top-level names); ``tests/test_import_rules.py`` checks it. What is here:

* declaring kernels: :class:`Capability`, :class:`Problem`, ``hookimpl``, :class:`BackendDescriptor` and
  the descriptor helpers :func:`plugin_loader`, :func:`cuda_probe` and :func:`cuda_backend_descriptor`;
* :func:`handoff`: a kernel's ``defer`` from the one table of cross-backend preferences
  (``bie_core/preferences.py``);
* dtype sets: :data:`FLOAT_DTYPES`, :data:`HALF_DTYPES`, :data:`PACKABLE_DTYPES`, :data:`WQ_BITS`;
* the prepared-layout memo :class:`LayoutMemo` and :data:`tensor_state`;
* the math a backend shares with the reference: geometry (:func:`conv_out_size`, :func:`packed_len`,
  :func:`mbwq_segments`), epilogue and layout steps (:func:`linear_scale`, :func:`scaled_epilogue`,
  :func:`mm_bias_once`, :func:`conv_memory_format`, :func:`conv_weight_tap_bits`, :func:`shifted_input`,
  :func:`lsq_backward_math`,
  :func:`lsq_sums`), the dynamic activation quantization's parameters and epilogue (:func:`affine_qparams`,
  :func:`dynamic_epilogue`...);
* the op table: :func:`get_op`, :func:`has_op`, :func:`all_ops`; :func:`reference_kernel`, the registered
  reference of an op (for a case a backend must compute in the reference's own order of arithmetic);
* native code: :class:`NativeExtension` (one JIT build helper, cache keyed by every source and included
  header, flags, torch/CUDA versions and GPU architecture) and its helpers;
* :func:`capabilities_changed`, for a backend whose capabilities change at run time (a kernel family
  whose build failed): the dispatcher then decides again.
"""
from __future__ import annotations

import threading
import weakref
from typing import Callable, Optional

import torch

from .dispatch import _tensor_state
from .graph_pool import outside_graph_pool
from .kernels import Capability, Problem
from .native_build import (NativeBuildError, NativeExtension, cache_root, cuda_arch, gencode, have_nvcc,
                           included_files, link_flags)
from .ops._common import FLOAT_DTYPES, conv_memory_format, mm_bias_once, scaled_epilogue
from .ops.binary import conv_out_size, conv_weight_tap_bits, linear_scale, packed_len, shifted_input
from .ops.dynamic import MAX_K as DYNAMIC_MAX_K
from .ops.dynamic import act_qmax, affine_codes, affine_qparams, affine_qparams_host, dynamic_epilogue, token_scales
from .ops.integer import lsq_backward_math, lsq_sums, scale_runs
from .ops.weight_only import WQ_BITS, mbwq_segments
from .optable import all_ops, get_op, has_op
from .plugins.descriptor import BackendDescriptor
from .plugins.hookspecs import hookimpl
from .preferences import handoff

__all__ = [
    # declaring a backend and its kernels
    "BackendDescriptor", "Capability", "Problem", "hookimpl", "plugin_loader", "cuda_probe",
    "cuda_backend_descriptor",
    # where another backend's kernel is faster (the one table: bie_core/preferences.py)
    "handoff",
    # dtype sets
    "FLOAT_DTYPES", "HALF_DTYPES", "PACKABLE_DTYPES", "WQ_BITS",
    # geometry of the formats
    "mbwq_segments",
    # prepared layouts; state kept past a call (out of CUDA-graph warm-up pools)
    "LayoutMemo", "tensor_state", "outside_graph_pool", "weak_view",
    # math shared with the reference
    "conv_out_size", "packed_len", "linear_scale", "scaled_epilogue", "conv_weight_tap_bits", "lsq_backward_math",
    "lsq_sums", "scale_runs", "conv_memory_format", "mm_bias_once", "shifted_input",
    "DYNAMIC_MAX_K", "act_qmax", "affine_codes", "affine_qparams", "affine_qparams_host", "dynamic_epilogue",
    "token_scales",
    # the op table
    "get_op", "has_op", "all_ops", "call_key_fn", "arg_types", "reference_kernel",
    # native code
    "NativeExtension", "NativeBuildError", "cache_root", "cuda_arch", "gencode", "have_nvcc", "included_files",
    "link_flags",
    # run-time changes
    "capabilities_changed", "caches_generation",
]

#: 16-bit float activations (tensor-core compute dtypes).
HALF_DTYPES = (torch.float16, torch.bfloat16)
#: What pack_signs accepts: the float dtypes and int8.
PACKABLE_DTYPES = FLOAT_DTYPES + (torch.int8,)


class LayoutMemo:
    """The object a kernel's ``prepare`` returns when its layout depends on call arguments ``prepare``
    does not see (K, bits, the compute dtype, the conv geometry): the dispatcher keeps one memo per weight
    version, and the kernel builds each layout on first use with :meth:`get` (thread-safe, built once).

    ``rebuilds``: how many versions of this weight tensor were prepared, this one included (a backend may
    stop building layouts for a weight an optimizer rewrites in place)."""

    __slots__ = ("layouts", "_lock", "rebuilds")

    def __init__(self, rebuilds: int = 1):
        self.layouts: dict = {}
        self._lock = threading.Lock()
        self.rebuilds = rebuilds

    def get(self, key, build: Callable[[], object]):
        lay = self.layouts.get(key)
        if lay is None:
            with self._lock:
                lay = self.layouts.get(key)
                if lay is None:
                    # kept for later calls: never in a CUDA graph's warm-up pool
                    lay = self.layouts[key] = outside_graph_pool(build)
        return lay

    def __len__(self) -> int:
        return len(self.layouts)


#: What identifies one version of a tensor's contents, as the dispatcher's prepared-layout cache keys it:
#: (storage pointer, version counter (-1 for inference tensors), device, dtype, shape); other values as they
#: are. A backend keeping layouts of its own rebuilds them when this changes.
tensor_state = _tensor_state


def weak_view(t: torch.Tensor) -> Callable[[], torch.Tensor]:
    """A function giving ``t``'s view of its memory again, without keeping that memory alive.

    For layouts built lazily from a weight (a ``LayoutMemo`` entry made on first use): a prepared object must not
    hold its weight, or the dispatcher's cache entry for the weight would never be freed (it is freed when the
    weight's storage dies). The function raises once the storage is gone, which cannot happen while the entry,
    and so the layout, is in use."""
    ref = weakref.ref(t.untyped_storage())
    offset, shape, stride, dtype, device = t.storage_offset(), tuple(t.shape), t.stride(), t.dtype, t.device

    def view() -> torch.Tensor:
        storage = ref()
        if storage is None:
            raise RuntimeError("bie: the weight this layout was prepared from no longer exists")
        return torch.empty(0, dtype=dtype, device=device).set_(storage, offset, shape, stride)
    return view


def call_key_fn(op):
    """The function mapping a call's arguments of ``op`` to the key the dispatcher caches decisions by (shapes,
    dtypes, devices, requires_grad and contiguity of the tensors, the other arguments' values)."""
    from .dispatch import make_key_fn
    return make_key_fn(op, True, True)


def arg_types(op) -> tuple:
    """The type of each argument of ``op`` as its schema writes it (``Tensor?``, ``int[2]``, ``ScalarType?``)."""
    from .ops._opdef import _arg_types
    return _arg_types(op.schema)


def reference_kernel(op: str) -> Callable:
    """The registered reference kernel of ``op`` (the plain-PyTorch executable spec), called with the op's arguments.
    Near the float32 range whether a sum overflows depends on its order: a backend whose own order gives inf or NaN
    computes such a call with this to give them where the reference does. LookupError when none is registered."""
    from .plugins.registry import get_registry
    k = get_registry().reference_kernel(op)
    if k is None:
        raise LookupError(f"bie: no reference kernel is registered for {op!r} (is bie-backend-cpu installed?)")
    return k.fn


def plugin_loader(module: str) -> Callable[[], object]:
    """A descriptor's ``load``: imports ``module`` (the backend's plugin module, with its hook
    implementations) only when bie first needs kernels."""
    def load():
        import importlib
        return importlib.import_module(module)
    load.__qualname__ = f"load[{module}]"
    return load


def cuda_probe(reason: Callable[[], Optional[str]]) -> Callable[[], Optional[str]]:
    """A descriptor's ``probe`` for a CUDA backend: None where a CUDA device and a CUDA build of torch
    exist and ``reason()`` (say, "no compiler and nothing built") returns None."""
    def probe():
        if not torch.cuda.is_available():
            return "no CUDA device"
        if torch.version.cuda is None:
            return "this torch build has no CUDA support"
        return reason()
    return probe


def cuda_backend_descriptor(name: str, package: str, version: str, api_version: str, description: str,
                            also_needs: str = "") -> BackendDescriptor:
    """The descriptor of a CUDA backend distribution ``bie-backend-<name>`` whose package ``package`` holds a
    ``plugin`` module (its hook implementations, imported when bie first needs kernels) and a ``_build`` module
    whose ``probe_reason()`` says why its kernels can be neither built nor loaded here (None when they can;
    importing it imports torch only and builds nothing). Its kernels build with the CUDA toolkit's nvcc on first
    use or with ``bie build <name>``; ``also_needs`` names what else the build needs (the install hint says it)."""
    def build_reason():
        import importlib
        return importlib.import_module(package + "._build").probe_reason()
    needs = ["an NVIDIA GPU", "the CUDA toolkit's nvcc"] + ([also_needs] if also_needs else [])
    needs = ", ".join(needs[:-1]) + " and " + needs[-1]
    return BackendDescriptor(name=name, api_version=api_version, device_types=("cuda",),
                             load=plugin_loader(package + ".plugin"), probe=cuda_probe(build_reason),
                             description=description,
                             install_hint=f"pip install bie-backend-{name} (needs {needs}; kernels build on first "
                                          f"use, or `bie build {name}`)",
                             distribution=f"bie-backend-{name}", version=version)


def caches_generation() -> int:
    """A number that changes whenever bie drops its cached decisions and prepared layouts (``clear_caches``,
    ``invalidate``, a backend registered or removed): a backend that keeps layouts of its own keys them on it."""
    from .plugins.registry import get_registry
    return get_registry().generation


def capabilities_changed() -> None:
    """Tell the dispatcher that this backend's capabilities answer differently from now on (a kernel
    family failed to build): cached decisions are dropped and every call is decided again."""
    from . import dispatch
    dispatch.clear_caches()
