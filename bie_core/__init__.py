"""bie: a plugin-based, multi-backend engine for low-bit (1/2/4/8-bit) PyTorch layers.

``bie_core`` holds the layers, the op definitions, the dispatcher and the
plugin interface; kernels come from backend distributions (``bie-backend-cpu``,
``-cuda``, ``-cutlass``, ``-mlx``) found through the ``bie.backends`` entry
points on first use. Importing bie_core never imports a backend.
"""
from __future__ import annotations

from . import ops
from .dispatch import get_backend, set_backend, use_backend
from .errors import (BackendUnavailableError, BieError, BieFallbackWarning, NoKernelError,
                     PluginValidationError, UnknownBackendError)
from .explain import Explanation, explain
from .kernels import Capability, Kernel, Problem
from .plugins import BackendDescriptor, BackendRecord, hookimpl
from .plugins.registry import get_registry
from .version import API_VERSION, __version__


def backends() -> list[BackendRecord]:
    """Every discovered backend: name, distribution, version, status
    (loaded / unavailable / broken / incompatible / disabled), cause, devices, kernels."""
    return get_registry().records()


def register_backend(descriptor: BackendDescriptor, plugin: object | None = None) -> BackendRecord:
    """Register a backend from code, without packaging (tests, notebooks,
    experiments). ``plugin`` is the object ``descriptor.load()`` would return."""
    from . import dispatch
    rec = get_registry().register_backend(descriptor, plugin)
    dispatch.clear_caches()
    return rec


__all__ = [
    "ops", "set_backend", "get_backend", "use_backend", "backends", "register_backend", "explain",
    "Explanation", "Capability", "Kernel", "Problem", "BackendDescriptor", "BackendRecord", "hookimpl",
    "BieError", "BackendUnavailableError", "NoKernelError", "UnknownBackendError",
    "PluginValidationError", "BieFallbackWarning", "API_VERSION", "__version__",
]

# QAT layers (binary, 4/8-bit), packing for inference
from .layers import (BinaryConv2d, BinaryEmbedding, BinaryEmbeddingBag, BinaryLinear,  # noqa: E402
                     BinaryMatMul, BinaryMultiheadAttention, PackReport, QConv2d, QLinear, QMatMul, invalidate,
                     pack)

__all__ += ["BinaryLinear", "BinaryConv2d", "BinaryEmbedding", "BinaryEmbeddingBag", "QLinear", "QConv2d",
            "BinaryMatMul", "QMatMul", "BinaryMultiheadAttention", "PackReport", "pack", "invalidate"]

# model conversion, checkpoints, optimizers
from . import optim  # noqa: E402
from .serialize import CheckpointError, load_checkpoint, save_checkpoint  # noqa: E402
from .convert import ConversionReport, LayerSpec, Policy, convert  # noqa: E402

__all__ += ["convert", "Policy", "LayerSpec", "ConversionReport", "save_checkpoint", "load_checkpoint",
            "CheckpointError", "optim"]

# weight-only layers (GPTQ / GBA / mixed widths) and their checkpoints
from .checkpoint import load_quantized, quantize_model, save_quantized  # noqa: E402
from .layers.weight_only import MBWQLinear, MPQLinear  # noqa: E402

__all__ += ["MPQLinear", "MBWQLinear", "load_quantized", "save_quantized", "quantize_model"]

# one call for sibling weight-only linears that share their input (q/k/v, gate/up)
from .layers.shared_input import fuse_shared_input_linears, unfuse_shared_input_linears  # noqa: E402

__all__ += ["fuse_shared_input_linears", "unfuse_shared_input_linears"]

# dynamically quantized int8 linear layers and interoperation with torch's dynamic quantization
from . import interop  # noqa: E402
from .layers.dynamic import DynamicQLinear  # noqa: E402
from .fold import FoldReport, fold_batchnorm  # noqa: E402

__all__ += ["DynamicQLinear", "interop", "fold_batchnorm", "FoldReport"]
