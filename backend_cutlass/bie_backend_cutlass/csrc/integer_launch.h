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
  // dynamic epilogue (dyn_gemm_fn): D = float(acc) * (row_scale[m] * scale) + bias, each operation rounded once
  const float* row_scale = nullptr;   // nullptr: 1
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
// The GEMM of dynamic_int8_linear (per-token activation scales, integer_dyn_gemm_sm90.cuh): out_code 1..3 (float
// outputs only), L == 1.
GemmFn dyn_gemm_fn(int config, int out_code);

// One implicit-GEMM convolution (forward, one group; integer_conv_sm90.cuh): x (N, H, W, C) int8 codes, channels
// contiguous, the other strides given in elements (multiples of 16, 16-byte aligned start); wt (K, R, S, C) int8
// contiguous; d (N, P, Q, K) contiguous, P and Q as torch's conv2d computes them from the symmetric padding. Float
// epilogue as GemmArgs (scale scalar or K values, bias K values; float32).
struct ConvArgs {
  const int8_t* x = nullptr;
  const int8_t* wt = nullptr;
  void* d = nullptr;
  int n = 0, h = 0, w = 0, c = 0, k = 0, r = 0, s = 0;
  int64_t x_stride_n = 0, x_stride_h = 0, x_stride_w = 0;
  int pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1, dil_h = 1, dil_w = 1;
  const float* scale = nullptr;
  bool scale_vec = false;
  const float* bias = nullptr;
  int device = 0;
  void* workspace = nullptr;
  cudaStream_t stream = nullptr;
};

// A convolution instantiation. mode 0: "" when CUTLASS can implement the problem (its TMA im2col limits on padding,
// corners and filter offsets, its alignment), else why not; 1: the workspace size into *ws; 2: launch. Returns ""
// on success, else what failed (never launches on a case it cannot implement).
using ConvFn = std::string (*)(const ConvArgs&, int mode, size_t* ws);
constexpr int kNumConvConfigs = 4;
ConvFn conv_fn(int config, int out_code);

// x: contiguous float tensor data of `n` elements (dtype code 1 f32, 2 bf16, 3 f16);
// scale: float32, scale[i / inner] when per_row, else scale[0]; shift: nullptr, or `cols` values of x's
// dtype, element i quantizing x[i] + shift[i % cols] (the add rounded in x's dtype); out: the codes as
// int8 (out_code 0) or as float32 / bfloat16 / float16 values (1 / 2 / 3).
std::string launch_quantize(const void* x, int dtype_code, int64_t n, const float* scale, bool per_row,
                            int64_t inner, const void* shift, int64_t cols, int bits, void* out, int out_code,
                            cudaStream_t stream);

// The LSQ quantizer's backward (the lsq_backward op) over v (R, C), C % 8 == 0, every pointer 16-byte
// aligned; dtype codes 1 f32, 2 bf16, 3 f16 (codes_code 0: no codes output).
// Column mode (one scale): grid (ceil(C / 1024), row_chunks); writes grad_v, codes, part_ds[row_chunks *
// gridDim.x] (partial sums of g * (Q - q inside)) and, with a shift, part_shift[row_chunks][C] (partial
// column sums of grad_v as rounded to v's dtype); then a second launch reduces them into grad_scale[0]
// (divided by denom) and grad_shift[C].
// Row mode (one scale per row, no shift): one block per row, grad_scale[r] = its sum / denom.
struct LsqArgs {
  const void* v;
  const void* prod;
  const void* shift;     // v's dtype, C values, or nullptr
  const float* scale;    // 1 value, or R values (rowwise)
  const float* factor;   // 1 value or nullptr
  void* grad_v;          // v's dtype
  void* codes;           // codes_code's dtype, or nullptr
  float* part_ds;        // column mode
  float* part_shift;     // column mode with a shift
  float* grad_scale;     // 1 value (column mode) or R values (row mode)
  float* grad_shift;     // column mode with a shift: C values
  int64_t rows, cols;
  int v_code, prod_code, codes_code, bits;
  bool rowwise;
  int row_chunks;        // column mode
  float denom;           // sqrt(n * Qp): n = all of v (column mode) or one row
};
std::string launch_lsq_backward(const LsqArgs& a, cudaStream_t stream);

// x (N, H, W, C) int8 contiguous (NHWC) -> out (G, N*Ho*Wo, Kgp) int8, k = (kh*KW + kw)*Cg + c, zero padded.
std::string launch_im2col(const int8_t* x, int8_t* out, int64_t N, int64_t C, int64_t H, int64_t W, int64_t G,
                          int64_t KH, int64_t KW, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh,
                          int64_t dw, int64_t Ho, int64_t Wo, int64_t Kgp, cudaStream_t stream);

}  // namespace bie_int
