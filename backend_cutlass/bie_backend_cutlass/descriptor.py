"""Entry point of bie-backend-cutlass: a light descriptor (imports nothing heavy, compiles nothing)."""
from bie_core.backend_api import cuda_backend_descriptor

from . import __version__

backend = cuda_backend_descriptor(
    "cutlass", __package__, __version__, api_version="1.0", also_needs="the nvidia-cutlass wheel",
    description="CUTLASS kernels: binary GEMM / implicit-GEMM conv (AND+popc), int8/int4 GEMM and conv "
                "for QAT layers, configurations tuned per GPU")
