"""Entry point of bie-backend-cuda: a light descriptor (imports nothing heavy,
compiles nothing)."""
from bie_core.plugins import BackendDescriptor

from . import __version__


def _probe():
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device"
    if torch.version.cuda is None:
        return "this torch build has no CUDA support"
    from . import _build

    return _build.probe_reason()


def _load():
    from . import plugin
    return plugin


backend = BackendDescriptor(
    name="cuda",
    api_version="1.0",
    device_types=("cuda",),
    load=_load,
    probe=_probe,
    description="CUDA C++ kernels: 1-bit tensor-core binary GEMM (AND+popc), sign packing, "
                "binary embeddings, weight-only GPTQ/GBA GEMV/GEMM",
    install_hint="pip install bie-backend-cuda (needs an NVIDIA GPU and the CUDA toolkit's nvcc "
                 "to build its kernels on first use, or `bie build cuda`)",
    distribution="bie-backend-cuda",
    version=__version__,
)
