"""Where one backend's kernel hands a call to another backend's faster kernel: the one table of them.

A kernel computes every call its Capability accepts. Where another backend's kernel was measured faster, the
slower kernel *defers* under automatic selection (``Capability.defer``): the dispatcher moves on to the next
kernel, and comes back to the deferring one when nothing faster than the plain-PyTorch reference accepts the call
(the other backend is not installed, or its kernel refuses the shape). An explicit choice (``backend="cutlass"``)
still runs the deferring kernel.

Each row names the deferring kernel, the region of calls it hands on (inclusive bounds on the problem's dims,
``weights`` = N x K, and exact attribute values), who is faster there, and the results page that measured it.
A backend consults the table through ``bie_core.backend_api.handoff("<backend>:<kernel>")``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

from .kernels import Problem

#: 2**26 weights: the layer size the weight-only measurements split "small" (4096 x 4096 and below) from "big"
#: (28672 x 8192, 8192 x 28672)
SMALL_LAYER = 1 << 26


@dataclass(frozen=True)
class Handoff:
    kernel: str
    faster: str
    source: str
    #: inclusive (low, high) bounds per dim; None = unbounded on that side. ``weights`` is N * K.
    dims: Mapping[str, tuple] = field(default_factory=dict)
    attrs: Mapping[str, object] = field(default_factory=dict)

    def covers(self, p: Problem) -> bool:
        for name, value in self.attrs.items():
            if p.attrs.get(name) != value:
                return False
        for name, (lo, hi) in self.dims.items():
            v = p.dims.get("N", 0) * p.dims.get("K", 0) if name == "weights" else p.dims.get(name)
            if v is None or (lo is not None and v < lo) or (hi is not None and v > hi):
                return False
        return True

    def reason(self, p: Problem) -> str:
        return f"{self.faster} is faster here ({self.source})"


_WQ = "cutlass:wq_gemm_sm90"
_DYN = "cutlass:dynamic_int8_linear_sm90"
_DYN_PAGE = "benchmarks/results/dynamic_cuda.md"
_WQ_PAGE = "benchmarks/results/cutlass_h100_wq.md"
_PREFILL_PAGE = "benchmarks/results/wq_prefill_cuda.md"

HANDOFFS: tuple = (
    # few rows are memory-bound: bie-backend-cuda's GEMV and small-M kernels are faster
    Handoff(_WQ, "bie-backend-cuda's small-M weight-only kernels", _WQ_PAGE,
            dims={"M": (None, 64), "weights": (None, SMALL_LAYER)}),
    Handoff(_WQ, "bie-backend-cuda's GEMV", _WQ_PAGE,
            dims={"M": (None, 4), "weights": (SMALL_LAYER + 1, None)}),
    # 4-bit codes on big layers: the thin GEMV stages x in K slices and stays ahead longer (longer still with
    # K above 16384)
    Handoff(_WQ, "bie-backend-cuda's thin GEMV", _WQ_PAGE,
            dims={"M": (None, 8), "weights": (SMALL_LAYER + 1, None), "K": (None, 16384)}, attrs={"bits": 4}),
    Handoff(_WQ, "bie-backend-cuda's thin GEMV", _WQ_PAGE,
            dims={"M": (None, 16), "weights": (SMALL_LAYER + 1, None), "K": (16385, None)}, attrs={"bits": 4}),
    # 4-bit codes with K of 14336 or more at 129-256 rows: bie-backend-cuda's many-row wgmma kernel (H100, 8192 x
    # 28672 at 129 / 256 rows: 187.0 / 195.5 us against 202.6 / 237.7; H200, 14336 x 4096 at 192-256 rows: 50.8-53.4
    # against 61.5-64.5)
    Handoff(_WQ, "bie-backend-cuda's many-row wgmma kernel (wq_gemm_wgmma_rows)", f"{_WQ_PAGE}, {_PREFILL_PAGE}",
            dims={"M": (129, 256), "K": (14336, None)}, attrs={"bits": 4}),
    # 4-bit codes on narrow layers (N <= 1024, K <= 8192: a GQA model's k/v projections) at 65-256 rows: a 128 x 128
    # tile grid has too few column tiles there; bie-backend-cuda's wgmma kernel is faster (10.5-12.0 us against
    # 14.2-19.1 on 4096 x 1024, H200) and its bound call is one launch too. Dequantize + cuBLAS is faster still on
    # the GPU at 384-512 rows (13.9-14.2 us against 19.0-19.2) but is not handed these: it is two launches and a
    # weight-sized temporary, and a prefill at those rows waits on the host (unbound it cost 108 us of host time a
    # call; bound, 31.9-34.7 against the CUTLASS call's 11.4-11.6, and a 32-layer model's time to first token was
    # 0.85x bf16 with it on k/v, 0.93x without)
    Handoff(_WQ, "bie-backend-cuda's wgmma kernel", _PREFILL_PAGE,
            dims={"M": (65, 256), "N": (None, 1024), "K": (None, 8192)}, attrs={"bits": 4}),
    # dynamic int8 linear, per token: up to 8 rows the fused GEMV (one launch: quantization, products, epilogue) is
    # the fastest kernel on small and big layers (H200, 4096^2: 7.9-13.0 us against 19.8-20.1 us for the _int_mm
    # path; 8192 x 28672: 56.7-80.3 us against 88.5-91.1 us); from 9 rows the int8 GEMMs are (16 rows: the GEMV
    # 27.8 us, the _int_mm path 20.5 us). The affine scheme's zero-point correction and
    # epilogue run as one compiled pass after torch._int_mm, here as separate passes after the int32 GEMM (expected
    # from the kernels' designs, docs/dynamic.md).
    Handoff(_DYN, "bie-backend-cuda's fused GEMV (dynamic_int8_gemv)", _DYN_PAGE, dims={"M": (None, 8)},
            attrs={"scheme": "per_token_symmetric"}),
    Handoff("cuda:dynamic_int8_gemv", "an int8 GEMM (bie-backend-cutlass's dynamic_int8_linear_sm90, or "
            "bie-backend-cuda's torch._int_mm path)", _DYN_PAGE, dims={"M": (9, None)}),
    Handoff(_DYN, "bie-backend-cuda's torch._int_mm path with its compiled epilogue", "docs/dynamic.md",
            attrs={"scheme": "per_tensor_affine"}),
    # integer GEMM, few rows: bie-backend-cuda's GEMV runs the layers' activation quantization inside its one launch
    # (int_gemm_gemv with fuse_quantized_input), where this kernel's call is a quantization launch and the GEMM
    # launch. An eager QLinear call at 8-32 rows of 4096 costs 14-23 us of host time through the GEMV (0.68-0.82x
    # nn.Linear's), 1.19-1.31x through this pair. On the GPU alone (graph replay, H200) the GEMV is 1.08x faster at
    # 9 rows, 1.1x slower at 16 and 1.7-2.1x slower at 17-32, where the int8 wgmma GEMM's larger tiles pay: up to 16
    # rows the host time it saves outweighs that (benchmarks/results/int_gemv_cuda.md).
    Handoff("cutlass:int_gemm_sm90", "bie-backend-cuda's fused GEMV (int_gemm_gemv)",
            "benchmarks/results/int_gemv_cuda.md", dims={"M": (None, 16)}),
    # up to 256 rows an eager call is bound by host time, where bie-backend-cuda's bound call cost 29-32 us against
    # 169 us for this kernel's unbound call (bench_host.py, 64x64 layer); on the GPU alone this kernel is 1.5-4.6 us
    # faster there (4096^2, graph replay). This kernel's own bound call (bind_binary_linear) is not yet timed: the
    # row stays until it is.
    Handoff("cutlass:binary_linear", "bie-backend-cuda's binary_linear_tc", "benchmarks/results/gpu_h200_tables.md",
            dims={"M": (None, 256)}),
    # the direct conv reads each window straight from packed sign words, without an im2col buffer
    Handoff("cutlass:binary_conv2d", "bie-backend-cuda's direct conv (binary_conv2d_direct)",
            "benchmarks/results/cuda_h100_conv.md"),
)


def handoffs(kernel: str) -> tuple:
    return tuple(h for h in HANDOFFS if h.kernel == kernel)


def handoff(kernel: str) -> Optional[Callable[[Problem], Optional[str]]]:
    """The ``defer`` function of the kernel named ``"<backend>:<kernel>"`` from the table, or None when the table
    has no row for it."""
    rows = handoffs(kernel)
    if not rows:
        return None

    def defer(p: Problem) -> Optional[str]:
        for h in rows:
            if h.covers(p):
                return h.reason(p)
        return None
    defer.__qualname__ = f"handoff[{kernel}]"
    return defer
