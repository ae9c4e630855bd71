"""Entry point of bie-backend-cutlass: a light descriptor (imports nothing heavy,
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
    name="cutlass",
    api_version="1.0",
    device_types=("cuda",),
    load=_load,
    probe=_probe,
    description="CUTLASS kernels: binary GEMM / implicit-GEMM conv (AND+popc), int8/int4 GEMM and conv "
                "for QAT layers, configurations tuned per GPU",
    install_hint="pip install bie-backend-cutlass (needs an NVIDIA GPU, the CUDA toolkit's nvcc and the "
                 "nvidia-cutlass wheel; kernels build on first use, or `bie build cutlass`)",
    distribution="bie-backend-cutlass",
    version=__version__,
)
