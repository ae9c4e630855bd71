// bie-backend-cutlass, binary_conv family: the padded sign operand of the implicit-GEMM 1-bit conv, and the table
// of conv instantiations.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "binary_conv_launch.h"

namespace bie_bconv {

#define BIE_BCONV_DECLARE(cfg)                                             \
  std::string bconv_##cfg##_i32(const BConvArgs&, int, size_t*);           \
  std::string bconv_##cfg##_f32(const BConvArgs&, int, size_t*);           \
  std::string bconv_##cfg##_bf16(const BConvArgs&, int, size_t*);          \
  std::string bconv_##cfg##_f16(const BConvArgs&, int, size_t*);
BIE_BCONV_DECLARE(t128x128)
BIE_BCONV_DECLARE(t128x128k32)
BIE_BCONV_DECLARE(w128x128k128)

BConvFn conv_fn(int config, int out_code) {
  static const BConvFn table[kNumConfigs][kNumOutCodes] = {
      {bconv_t128x128_i32, bconv_t128x128_f32, bconv_t128x128_bf16, bconv_t128x128_f16},
      {bconv_t128x128k32_i32, bconv_t128x128k32_f32, bconv_t128x128k32_bf16, bconv_t128x128k32_f16},
      {bconv_w128x128k128_i32, bconv_w128x128k128_f32, bconv_w128x128k128_bf16, bconv_w128x128k128_f16},
  };
  if (config < 0 || config >= kNumConfigs || out_code < 0 || out_code >= kNumOutCodes) return nullptr;
  return table[config][out_code];
}

namespace {

__device__ __forceinline__ float value(int8_t v) { return float(v); }
__device__ __forceinline__ float value(float v) { return v; }
__device__ __forceinline__ float value(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float value(__half v) { return __half2float(v); }

// One thread per (pixel of the padded image, 32 channels): the word of their signs and its complement. Threads of
// one pixel are adjacent, so a channels_last x is read in contiguous runs: with kVec (channels of unit stride, every
// pixel's channels 16-byte aligned) as 16-byte loads, else element by element; the loads of a thread are issued
// before its compares.
template <class T, bool kVec>
__global__ void pack_padded(const T* __restrict__ x, int64_t sn, int64_t sc, int64_t sh, int64_t sw, int c, int h,
                            int w, int ph, int pw, int hp, int wp, uint32_t pad_word,
                            const float* __restrict__ shift, int64_t total, uint32_t* __restrict__ out) {
  constexpr int kChunks = 32 * int(sizeof(T)) / 16;   // 16-byte loads a word takes
  const int words = c / 32;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int word = int(i % words);
    const int64_t pix = i / words;
    const int xq = int(pix % wp) - pw;
    const int64_t rest = pix / wp;
    const int y = int(rest % hp) - ph;
    const int64_t img = rest / hp;
    uint32_t bits = pad_word;
    if (y >= 0 && y < h && xq >= 0 && xq < w) {
      const T* p = x + img * sn + int64_t(y) * sh + int64_t(xq) * sw + int64_t(word) * 32 * sc;
      union {
        uint4 chunk[kChunks > 0 ? kChunks : 1];
        T v[32];
      } u;
      if constexpr (kVec) {
#pragma unroll
        for (int j = 0; j < kChunks; ++j) u.chunk[j] = __ldg(reinterpret_cast<const uint4*>(p) + j);
      } else {
#pragma unroll
        for (int j = 0; j < 32; ++j) u.v[j] = p[j * sc];
      }
      bits = 0;
      // v >= 0 is false for NaN: it packs as -1
      if (shift != nullptr) {
        // the word's 32 shifts as eight 16-byte loads (the bindings hand over a 16-byte aligned shift)
        union {
          float4 q[8];
          float f[32];
        } s;
        const float4* s4 = reinterpret_cast<const float4*>(shift) + word * 8;
#pragma unroll
        for (int j = 0; j < 8; ++j) s.q[j] = __ldg(s4 + j);
#pragma unroll
        for (int j = 0; j < 32; ++j) bits |= uint32_t(value(u.v[j]) + s.f[j] >= 0.0f) << j;
      } else {
#pragma unroll
        for (int j = 0; j < 32; ++j) bits |= uint32_t(value(u.v[j]) >= 0.0f) << j;
      }
    }
    uint32_t* o = out + pix * 2 * words;
    o[word] = bits;
    o[words + word] = ~bits;
  }
}

template <class T>
std::string launch_typed(const void* x, int64_t sn, int64_t sc, int64_t sh, int64_t sw, int n, int c, int h, int w,
                         int ph, int pw, bool pad_plus, const float* shift, uint32_t* out, cudaStream_t stream) {
  const int hp = h + 2 * ph, wp = w + 2 * pw;
  const int64_t total = int64_t(n) * hp * wp * (c / 32);
  if (total == 0) return "";
  const int threads = 256;
  const int64_t blocks = (total + threads - 1) / threads;
  const int grid = int(blocks < 65535 * 16 ? blocks : 65535 * 16);
  const uint32_t pad_word = pad_plus ? 0xffffffffu : 0u;
  const int64_t align = 16 / int64_t(sizeof(T));
  const bool vec = sc == 1 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && sn % align == 0 && sh % align == 0 &&
                   sw % align == 0;   // (c % 32 == 0: every word's 32 channels start 16-byte aligned then)
  if (vec)
    pack_padded<T, true><<<grid, threads, 0, stream>>>(static_cast<const T*>(x), sn, sc, sh, sw, c, h, w, ph, pw, hp,
                                                       wp, pad_word, shift, total, out);
  else
    pack_padded<T, false><<<grid, threads, 0, stream>>>(static_cast<const T*>(x), sn, sc, sh, sw, c, h, w, ph, pw, hp,
                                                        wp, pad_word, shift, total, out);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : std::string("binary_conv pack launch: ") + cudaGetErrorString(e);
}

// One thread per 16 bytes of a window row: consecutive threads write consecutive bytes of the rows.
__global__ void gather_windows(const uint4* __restrict__ xp, int hp, int wp, int chunks, int r, int s, int sh,
                               int sw, int dh, int dw, int ho, int wo, int64_t total, uint4* __restrict__ windows) {
  const int per_row = r * s * chunks;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / per_row;
    const int in_row = int(i - row * per_row);
    const int tap = in_row / chunks, chunk = in_row - tap * chunks;
    const int ox = int(row % wo);
    const int64_t rest = row / wo;
    const int oy = int(rest % ho);
    const int64_t img = rest / ho;
    const int y = oy * sh + (tap / s) * dh, x = ox * sw + (tap % s) * dw;
    windows[i] = __ldg(xp + ((img * hp + y) * wp + x) * chunks + chunk);
  }
}

}  // namespace

std::string launch_windows(const int8_t* xp, int n, int hp, int wp, int c_bytes, int r, int s, int sh, int sw,
                           int dh, int dw, int ho, int wo, int8_t* windows, cudaStream_t stream) {
  if (c_bytes % 16 != 0) return "binary_conv windows: a pixel's bytes must be a multiple of 16";
  const int chunks = c_bytes / 16;
  const int64_t total = int64_t(n) * ho * wo * r * s * chunks;
  if (total == 0) return "";
  const int threads = 256;
  const int64_t blocks = (total + threads - 1) / threads;
  const int grid = int(blocks < 65535 * 16 ? blocks : 65535 * 16);
  gather_windows<<<grid, threads, 0, stream>>>(reinterpret_cast<const uint4*>(xp), hp, wp, chunks, r, s, sh, sw, dh,
                                               dw, ho, wo, total, reinterpret_cast<uint4*>(windows));
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : std::string("binary_conv windows launch: ") + cudaGetErrorString(e);
}

std::string launch_pack(const void* x, int dtype_code, int64_t sn, int64_t sc, int64_t sh, int64_t sw, int n, int c,
                        int h, int w, int ph, int pw, bool pad_plus, const float* shift, uint32_t* out,
                        cudaStream_t stream) {
  if (c % 32 != 0) return "binary_conv pack: channels must be a multiple of 32";
  switch (dtype_code) {
    case 0: return launch_typed<int8_t>(x, sn, sc, sh, sw, n, c, h, w, ph, pw, pad_plus, shift, out, stream);
    case 1: return launch_typed<float>(x, sn, sc, sh, sw, n, c, h, w, ph, pw, pad_plus, shift, out, stream);
    case 2: return launch_typed<__nv_bfloat16>(x, sn, sc, sh, sw, n, c, h, w, ph, pw, pad_plus, shift, out, stream);
    case 3: return launch_typed<__half>(x, sn, sc, sh, sw, n, c, h, w, ph, pw, pad_plus, shift, out, stream);
    default: return "binary_conv pack: x must be int8, float32, bfloat16 or float16";
  }
}

}  // namespace bie_bconv
