// Lab (sessions 12-13): variants of bie-backend-cutlass's Hopper 1-bit GEMM (csrc/binary_wgmma.cuh),
// built without torch into one shared library that benchmarks/lab/bwc/bwc_lab.py drives with ctypes,
// so the device only times them (the build runs on the workstation). bf16 output only.
#pragma once
#include "binary_wgmma.cuh"

// one exported entry point bwc_run_<idx> for the GEMM type given after idx
#define BWC_DEFINE(idx, ...)                                                                         \
  extern "C" int bwc_run_##idx(const bie_cutlass_bin::WgArgs* p, size_t* ws, void* st, int pdl,   \
                               char* err, int errlen) {                                           \
    std::string e = __VA_ARGS__::run(*p, ws, (cudaStream_t)st, pdl != 0);                        \
    if (!e.empty() && err) { snprintf(err, errlen, "%s", e.c_str()); return 1; }                  \
    return 0;                                                                                      \
  }
// the product's kernel templates: visitor-tree epilogue / lean epilogue
#define BWC_VARIANT(idx, ...) BWC_DEFINE(idx, bie_cutlass_bin::BGemmSm90<__VA_ARGS__>)
#define BWC_LEAN_VARIANT(idx, ...) BWC_DEFINE(idx, bie_cutlass_bin::BGemmSm90Lean<__VA_ARGS__>)
// the lean epilogue with the row terms counted in the mainloop (binary_gemm's K - 2 popc(a row))
#define BWC_COUNTED_VARIANT(idx, ...) BWC_DEFINE(idx, bie_cutlass_bin::BGemmSm90LeanCounted<__VA_ARGS__>)
