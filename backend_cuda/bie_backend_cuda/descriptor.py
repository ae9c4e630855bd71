"""Entry point of bie-backend-cuda: a light descriptor (imports nothing heavy, compiles nothing)."""
from bie_core.backend_api import cuda_backend_descriptor

from . import __version__

backend = cuda_backend_descriptor(
    "cuda", __package__, __version__, api_version="1.0",
    description="CUDA C++ kernels: 1-bit tensor-core binary GEMM (AND+popc), sign packing, "
                "binary embeddings, weight-only GPTQ/GBA GEMV/GEMM")
