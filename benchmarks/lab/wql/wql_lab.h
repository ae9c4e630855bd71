// Lab (session 12): tile variants of bie-backend-cutlass's weight-only GEMM (csrc/wq_gemm_sm90.cuh)
// for few tokens, built without torch into one shared library driven by wql_lab.py (ctypes), so the
// device only times them. W4, bf16 activations only.
#pragma once
#include <cstdio>
#include "wq_gemm_sm90.cuh"

#define WQL_VARIANT(idx, ...)                                                                      \
  extern "C" int wql_run_##idx(const bie_wq::WqArgs* p, size_t* ws, char* err, int errlen) {      \
    std::string e = bie_wq::WqGemmSm90<4, cutlass::bfloat16_t, __VA_ARGS__>::run(*p, ws);        \
    if (!e.empty() && err) { snprintf(err, errlen, "%s", e.c_str()); return 1; }                 \
    return 0;                                                                                     \
  }
#define WQL_SK(M, N, K)                                                                             \
  cute::Shape<cute::Int<M>, cute::Int<N>, cute::Int<K>>, cute::Shape<cute::_1, cute::_1, cute::_1>, \
      cutlass::gemm::KernelTmaWarpSpecializedCooperative, cutlass::epilogue::TmaWarpSpecializedCooperative, \
      cutlass::gemm::StreamKScheduler
