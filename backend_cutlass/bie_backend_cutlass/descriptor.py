"""Entry point of bie-backend-cutlass: a light descriptor (imports nothing heavy,
compiles nothing)."""
from bie_core.backend_api import BackendDescriptor, cuda_probe, plugin_loader

from . import __version__


def _build_reason():
    from . import _build  # (imports torch only; builds nothing)
    return _build.probe_reason()


backend = BackendDescriptor(
    name="cutlass",
    api_version="1.0",
    device_types=("cuda",),
    load=plugin_loader(__package__ + ".plugin"),
    probe=cuda_probe(_build_reason),
    description="CUTLASS kernels: binary GEMM / implicit-GEMM conv (AND+popc), int8/int4 GEMM and conv "
                "for QAT layers, configurations tuned per GPU",
    install_hint="pip install bie-backend-cutlass (needs an NVIDIA GPU, the CUDA toolkit's nvcc and the "
                 "nvidia-cutlass wheel; kernels build on first use, or `bie build cutlass`)",
    distribution="bie-backend-cutlass",
    version=__version__,
)
