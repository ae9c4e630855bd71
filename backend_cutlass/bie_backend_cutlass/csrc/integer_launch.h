// bie-backend-cutlass, integer family: host-side declarations shared by the
// binding (compiled by the host compiler) and the CUDA sources (nvcc).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

namespace bie_int {

// One int8 x int8 -> int32 GEMM call, D[l] = epilogue(A[l] (M x K) * B[l] (N x K)^T).
// A, B: K-contiguous rows (row strides lda/ldb, 16-byte aligned), D: row-major with ldd.
struct GemmArgs {
  const int8_t* a = nullptr;
  const int8_t* b = nullptr;
  void* d = nullptr;
  int m = 0, n = 0, k = 0, l = 1;
  int64_t lda = 0, ldb = 0, ldd = 0;
  int64_t batch_a = 0, batch_b = 0, batch_d = 0;
  // float epilogue: D = float(acc) * scale + bias (scale: scalar or per column; bias per column)
  const float* scale = nullptr;   // nullptr: scale 1
  bool scale_vec = false;         // true: scale[n + l * scale_batch]; false: scale[0]
  int64_t scale_batch = 0;
  const float* bias = nullptr;    // nullptr: no bias; else bias[n + l * bias_batch]
  int64_t bias_batch = 0;
  int device = 0;
  int sm_count = 0;
  void* workspace = nullptr;
  cudaStream_t stream = nullptr;
};

// A GEMM instantiation. With ws != nullptr only the workspace size is written
// (and "" returned); otherwise the kernel is launched. Returns "" on success,
// else a description of the failure (never exits, never launches on a bad case).
using GemmFn = std::string (*)(const GemmArgs&, size_t* ws);

// out_code: 0 int32, 1 float32, 2 bfloat16, 3 float16.
constexpr int kNumConfigs = 3;
constexpr int kNumOutCodes = 4;
GemmFn gemm_fn(int config, int out_code);

// x: contiguous float tensor data of `n` elements (dtype code 1 f32, 2 bf16, 3 f16);
// scale: float32, scale[i / inner] when per_row, else scale[0].
std::string launch_quantize(const void* x, int dtype_code, int64_t n, const float* scale, bool per_row,
                            int64_t inner, int bits, int8_t* out, cudaStream_t stream);

// x (N, H, W, C) int8 contiguous (NHWC) -> out (G, N*Ho*Wo, Kgp) int8, k = (kh*KW + kw)*Cg + c, zero padded.
std::string launch_im2col(const int8_t* x, int8_t* out, int64_t N, int64_t C, int64_t H, int64_t W, int64_t G,
                          int64_t KH, int64_t KW, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh,
                          int64_t dw, int64_t Ho, int64_t Wo, int64_t Kgp, cudaStream_t stream);

}  // namespace bie_int
