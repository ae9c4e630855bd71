"""Entry point of bie-backend-cutlass: a light descriptor (imports nothing heavy,
compiles nothing)."""
from bie_core.backend_api import cuda_backend_descriptor

from . import __version__

backend = cuda_backend_descriptor(
    "cutlass", __package__, __version__, api_version="1.0",
    description="CUTLASS kernels: binary GEMM / implicit-GEMM conv (AND+popc), int8/int4 GEMM and conv "
                "for QAT layers, configurations tuned per GPU",
    install_hint="pip install bie-backend-cutlass (needs an NVIDIA GPU, the CUDA toolkit's nvcc and the "
                 "nvidia-cutlass wheel; kernels build on first use, or `bie build cutlass`)",
)
