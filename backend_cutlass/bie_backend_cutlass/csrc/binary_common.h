// Plain declarations shared by the binary kernels' host binding (binary_bindings.cpp,
// compiled by the host compiler) and the CUDA sources. No CUTLASS or torch here.
#pragma once
#include <cstdint>
#include <string>
#include <cuda_runtime.h>

namespace bie_cutlass_bin {

enum : int { kF32 = 0, kF16 = 1, kBF16 = 2, kI32 = 3, kI8 = 4 };

// Fused epilogue of the binary GEMM: for output element (m, n) of batch l
//   d = 4 * popc(a_m & b_n) + row_term[l*row_bs + m] + col_term[l*col_bs + n]   (>> 1 if halve)
//   count output: d;  float output: (float(d) * scale[ch] + bias[ch]) rounded to the out dtype,
//   scale = float32(s1) * float32(s2) (either may be absent), ch = m or n (chan_row) + l*chan_bs.
// The output element (m, n, l) is written at
//   l*out_bs + m*out_ldm + (out_p ? (n / out_p) * out_sq + n % out_p : n)
// (out_p > 0 scatters GEMM columns to NCHW: n = image * out_p + pixel).
struct EpiArgs {
  const int* row_term; int64_t row_bs;
  const int* col_term; int64_t col_bs;
  const void* s1; int s1_dt; int s1_per;
  const void* s2; int s2_dt; int s2_per;
  const void* bias; int bias_dt;
  int chan_row; int64_t chan_bs;
  int has_scale; int halve;
  void* out; int64_t out_bs, out_ldm, out_p, out_sq; int vec_ok;
};

// A: M rows of K bits (row-major, row stride lda bits), B: N rows of K bits (column-major K x N).
// K (bits) is a multiple of 128, both operands' rows and bases 16-byte aligned, bits past the
// true K zero on both sides. Batch strides are in BYTES.
struct GemmArgs {
  const void* a; const void* b;
  int M, N, K, batch;
  int64_t lda, ldb, a_bs, b_bs;
  EpiArgs epi;
};

constexpr int kNumConfigs = 3;   // 0: 128x256x512 (8 warps, 3 stages), 1: 128x256x1024 (8 warps, 3 stages),
                                 // 2: 64x128x512 (4 warps, 4 stages)
cudaError_t run_gemm(const GemmArgs& g, int cfg, int out_dt, cudaStream_t st);

// x (rows, K) floating, optional shift (K,) of x's dtype: words (rows, ldw) of sgn bits (LSB first,
// zero past K up to KW words), term[r] = K - 2 popc(row r).
cudaError_t launch_pack_act(const void* x, int dt, int64_t sxm, int64_t sxk, const void* shift, int64_t ssk,
                            uint32_t* words, int64_t ldw, int KW, int* term, int rows, int K, int vec,
                            cudaStream_t st);
// Packed rows (nb batches of rows_per rows, KB bytes): term[r] = c0 + c1 * popc(row r masked to K bits);
// with out: copies of the masked row, zero-padded to KBo bytes, at out + r*ldo + c*KBo. vec (no out, byte
// stride 1, 16-byte aligned rows, KB % 16 == 0, K % 8 == 0): 16-byte loads, one warp per row.
cudaError_t launch_rows(const uint8_t* a, int64_t sb, int64_t sm, int64_t sk, int nb, int rows_per, int KB, int K,
                        uint8_t* out, int64_t ldo, int KBo, int copies, int* term, int c0, int c1, int vec,
                        cudaStream_t st);
// x (N, C, H, W) with element strides -> words (N*H*W, G*Cgw): sgn bits along each group's channels,
// and ppop (N*H*W, G*Cgw): the popcount of each word.
cudaError_t launch_pack_channels(const void* x, int dt, int N, int C, int H, int W, int64_t sn, int64_t sc,
                                 int64_t sh, int64_t sw, int G, int Cgw, uint32_t* xb, int* ppop, cudaStream_t st);
// im2col from channel-packed words: row (g, n, ho, wo) = [taps (r, s) x Cgw words], zero to KWh words;
// pad_mode 0: padding bits 0 (-1), 1: padding bits 1 (+1), 2: two halves (0 then 1).
// term[row] = c0 - 2 popc(row).
struct GatherArgs {
  int N, H, W, G, Cg, Cgw, kh, kw, sh, sw, ph, pw, dh, dw, Ho, Wo;
  int KWh, copies, pad_mode, c0;
};
cudaError_t launch_gather(const uint32_t* xb, const int* ppop, const GatherArgs& g, uint32_t* cols, int* term,
                          cudaStream_t st);

// ---- Hopper (sm_90a) wgmma path: binary_wgmma.cuh, binary_wgmma_<cfg>_<out>.cu ----
// D[l] (M x N, row-major, ldd elements) = epilogue(popc(A[l] & B[l])) with the packed bits read as
// int8 "elements": A (M x Kb bytes, row stride lda bytes), B (N x Kb bytes, row stride ldb bytes),
// Kb a multiple of 16, rows and bases 16-byte aligned, bits past the true K zero on both sides.
//   dot = 4 * popc + row_term[l*row_bs + m] + col_term[l*col_bs + n]
//   int32 out: dot;  float out: (float(dot) * (s1 * s2) + bias[n]) with separate roundings,
//   s1, s2 float32 scalars (vec 0) or per column n (vec 1), absent = 1; bias absent = 0.
struct WgArgs {
  const void* a; const void* b; void* d;
  int M, N, Kb, L;
  int64_t lda, ldb, a_bs, b_bs, ldd, d_bs;
  const int* row_term; int64_t row_bs;
  const int* col_term; int64_t col_bs;
  const float* s1; int s1_vec;
  const float* s2; int s2_vec;
  const float* bias;
  int device, sm_count;
  void* workspace;
};
constexpr int kNumWgConfigs = 6;  // 0: 128x256 (x 1024 bits), cooperative, cluster 2x1; 1: 64x128, ping-pong;
                                  // 2: 64x256, ping-pong, cluster 2x1; 3: 128x256, cooperative, no cluster;
                                  // 4, 5: 0 and 3 counting popc(A row) in the mainloop (kWgCountedFirst)
constexpr int kWgCountedFirst = 4;  // configurations from here: 16-bit outputs, row term K - 2 popc(A row)
// With ws != nullptr only writes the workspace size. Returns "" on success, else the failure.
std::string run_wgmma(const WgArgs& g, int cfg, int out_dt, size_t* ws, cudaStream_t st);

}  // namespace bie_cutlass_bin
