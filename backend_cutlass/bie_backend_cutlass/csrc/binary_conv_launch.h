// bie-backend-cutlass, binary_conv family: what the bindings and the kernels share.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace bie_bconv {

// One implicit-GEMM 1-bit conv: x the padded (n, h, w, c_bytes) operand of binary_conv_pack.cu, wt the prepared
// (o, r, s, c_bytes) weight, d the (n, ho, wo, o) output; k_bits = r * s * (c_bytes * 4), the +-1 values a window
// holds (each c_bytes row holds c_bytes * 4 signs and their complements). The window GEMMs read windows, the
// (m = n * ho * wo, r * s * c_bytes) rows of launch_windows, instead of x, on a device of sm_count SMs.
struct BConvArgs {
  const int8_t* x = nullptr;
  const int8_t* windows = nullptr;
  const int8_t* wt = nullptr;
  void* d = nullptr;
  int n = 0, h = 0, w = 0, c_bytes = 0, o = 0, r = 0, s = 0, m = 0;
  int device = 0, sm_count = 0;
  int stride_h = 1, stride_w = 1, dil_h = 1, dil_w = 1;
  int32_t k_bits = 0;
  const float* scale = nullptr;
  bool scale_vec = false;
  const float* bias = nullptr;
  void* workspace = nullptr;
  cudaStream_t stream = nullptr;
};

// mode 0: "" when CUTLASS can implement the problem (its TMA im2col limits), else why not; 1: the workspace size
// into *ws; 2: launch. Returns "" on success, else what failed (never launches on a case it cannot implement).
using BConvFn = std::string (*)(const BConvArgs&, int mode, size_t* ws);
constexpr int kNumConfigs = 3;
constexpr int kFirstWindowConfig = 2;   // configurations from here are window GEMMs
constexpr int kNumOutCodes = 4;   // int32, float32, bfloat16, float16
BConvFn conv_fn(int config, int out_code);

// The padded operand: out (n, h + 2 ph, w + 2 pw, c / 4) bytes: per pixel the sign bits of the c channels
// (bit 1 = v >= 0; NaN packs as -1), channel i at byte i / 8 bit i % 8, then their complements; pixels of the
// ring hold the pad value's bits (pad_plus: +1, else -1). x: (n, c, h, w) of dtype code 0 int8, 1 float32,
// 2 bfloat16, 3 float16 with element strides sn, sc, sh, sw; c % 32 == 0. shift: nullptr, or c float32 values (of
// x's dtype) whose signs are those of x + shift: the float32 sum of two values of a float x's dtype is nonzero
// exactly when the sum rounded to that dtype is, with its sign, so the sign needs no rounding step; 16-byte aligned.
std::string launch_pack(const void* x, int dtype_code, int64_t sn, int64_t sc, int64_t sh, int64_t sw, int n, int c,
                        int h, int w, int ph, int pw, bool pad_plus, const float* shift, uint32_t* out,
                        cudaStream_t stream);

// The window rows of the padded operand xp (n, hp, wp, c_bytes): row (img, y, x) of windows holds the r * s taps
// of output pixel (y, x), tap (i, j) = xp pixel (y * sh + i * dh, x * sw + j * dw), c_bytes each (a multiple of 16),
// in the prepared weight's (i, j, byte) order.
std::string launch_windows(const int8_t* xp, int n, int hp, int wp, int c_bytes, int r, int s, int sh, int sw,
                           int dh, int dw, int ho, int wo, int8_t* windows, cudaStream_t stream);

}  // namespace bie_bconv
