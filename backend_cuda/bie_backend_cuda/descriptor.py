"""Entry point of bie-backend-cuda: a light descriptor (imports nothing heavy,
compiles nothing)."""
from bie_core.backend_api import BackendDescriptor, cuda_probe, plugin_loader

from . import __version__


def _build_reason():
    from . import _build  # (imports torch only; builds nothing)
    return _build.probe_reason()


backend = BackendDescriptor(
    name="cuda",
    api_version="1.0",
    device_types=("cuda",),
    load=plugin_loader(__package__ + ".plugin"),
    probe=cuda_probe(_build_reason),
    description="CUDA C++ kernels: 1-bit tensor-core binary GEMM (AND+popc), sign packing, "
                "binary embeddings, weight-only GPTQ/GBA GEMV/GEMM",
    install_hint="pip install bie-backend-cuda (needs an NVIDIA GPU and the CUDA toolkit's nvcc "
                 "to build its kernels on first use, or `bie build cuda`)",
    distribution="bie-backend-cuda",
    version=__version__,
)
