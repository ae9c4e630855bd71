// Binary GEMM on Hopper's 1-bit wgmma (sm_90a), ping-pong schedule: the two math warpgroups work on
// different output tiles and take turns, so that one converts and stores its tile while the other's wgmmas
// keep the tensor cores busy.
//
//   out[m, n] = epilogue(4 popc(a_m & w_n) - 2 popc(a_m) - 2 popc(w_n) + K)
//
// Why. The cooperative kernel (binary_wgmma.cu: both math warpgroups on one 128x256 tile) converts its
// accumulators at the end of every tile while the tensor cores idle, ~3 µs a tile against ~5 µs of stages at
// K = 8192 (cuda_h100_binary_wgmma.md). Here each math warpgroup owns whole 128x128 tiles (two m64n128k256
// wgmmas per 256 bits of K, sharing the weight operand; 128 accumulators per thread), and the ring of stages
// runs through the block's tiles in order, tile i for warpgroup i % 2, the warpgroups taking turns (a "turn"
// mbarrier each): while one warpgroup works through its epilogue, the other consumes the next tile's stages. The price: a
// stage now serves 128x128 outputs instead of 128x256 (32 KB of operands per 2^25 bit operations against
// 48 KB per 2^26), and the A operand comes from shared memory (the accumulators leave no registers for A
// fragments), so popc(a) per row comes from a short pass over a before the GEMM (a_popc_kernel).
//
// Block: 3 warpgroups. Warpgroup 0: one producer thread fills a 4-slot ring (16 KB of weights + 16 KB of
// activations per stage, by a bulk copy of the prepared image's half 256-row block and a 2-D tensor map); a
// column warp stages each tile's row terms (K - 2 popc(a)) and column terms (-2 popc(w), scale, bias as float32);
// two store warps, one per math warpgroup, copy its staged outputs to global memory with bulk copies.
//
// Uses the prepared weight image of binary_wgmma.cu ([N/256][K/1024][256 rows][128 bytes], 128-byte
// swizzle): the 128 rows of a 128-column tile are one contiguous half of a 256-row block. Requirements as
// binary_wgmma.cu; p.pa is scratch for M int32.
#include <type_traits>

#include "b1_wgmma_common.cuh"
#include "common.cuh"
#include "hopper.cuh"
#include "wgmma_b1_ss.cuh"

namespace bie {
namespace bpp {

using namespace hop;
using bwg::pack2;
using bwg::stmatrix_x4;

constexpr int BM = 128, BN = 128;          // a math warpgroup's tile
constexpr int KSB = 128;                   // bytes of K per stage (1024 bits)
constexpr int B_BYTES = BN * KSB;          // 16 KB of weights per stage
constexpr int A_BYTES = BM * KSB;          // 16 KB of activations per stage
constexpr int SLOT_BYTES = B_BYTES + A_BYTES;
constexpr int STAGES = 4;
constexpr int EPI_LD = 272;                // bytes per staged output row (256 + 16: conflict-free rows)
constexpr int EPI_BYTES = BM * EPI_LD;     // per math warpgroup
// per-tile terms, 2 buffers per math warpgroup: 64 records of a column pair
// {-2 popc(w_c), -2 popc(w_c+1), scale_c, scale_c+1, bias_c, bias_c+1, -, -}, then the 128 row terms (int32)
constexpr int COL_BYTES = BN / 2 * 32;
constexpr int REC_BYTES = COL_BYTES + BM * 4;
constexpr int THREADS = 384;
constexpr int OFF_EPI = STAGES * SLOT_BYTES;
constexpr int OFF_REC = OFF_EPI + 2 * EPI_BYTES;
constexpr int OFF_BAR = OFF_REC + 4 * REC_BYTES;
constexpr int NBAR = 2 * STAGES + 4 + 4 + 2 + 2 + 2;
constexpr int SMEM_BYTES = OFF_BAR + NBAR * 8 + 1024;   // + alignment of the ring (swizzle atoms)

// popc of every row of a (KB bytes, 16-byte aligned rows, KB % 16 == 0): one warp per row
__global__ void a_popc_kernel(const uint8_t* __restrict__ a, int64_t lda, int M, int KB, int32_t* __restrict__ out) {
  const int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (r >= M) return;
  const int lane = threadIdx.x & 31;
  const uint4* row = reinterpret_cast<const uint4*>(a + (int64_t)r * lda);
  int s = 0;
  for (int i = lane; i < KB / 16; i += 32) {
    const uint4 v = __ldg(row + i);
    s += __popc(v.x) + __popc(v.y) + __popc(v.z) + __popc(v.w);
  }
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) s += __shfl_xor_sync(0xffffffffu, s, d);
  if (lane == 0) out[r] = s;
}

// INFLIGHT: stages whose wgmmas may still run while the next stage's are issued (1 or 2; lab A/B)
template <typename OT, int INFLIGHT>
__global__ void __launch_bounds__(THREADS, 1) bgemm_pp_kernel(const BinGemmArgs p,
                                                               const __grid_constant__ CUtensorMap tmap_a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  uint8_t* smem = smem_raw + (base - raw);
  const uint32_t bar_full = base + OFF_BAR, bar_empty = bar_full + STAGES * 8;
  const uint32_t bar_rec_full = bar_empty + STAGES * 8;    // [math warpgroup][buffer]
  const uint32_t bar_rec_empty = bar_rec_full + 4 * 8;
  const uint32_t bar_epi_full = bar_rec_empty + 4 * 8;     // per math warpgroup
  const uint32_t bar_epi_empty = bar_epi_full + 2 * 8;
  const uint32_t bar_turn = bar_epi_empty + 2 * 8;         // per math warpgroup: its turn at the ring
  constexpr int PASSES = sizeof(OT) == 2 ? 1 : 2;   // 4-byte outputs are staged in two halves of 64 columns
  constexpr int CP = BN / PASSES;

  const int ns = (p.KB + KSB - 1) / KSB;
  const int ntc = (p.N + BN - 1) / BN;                   // 128-column tiles
  const int units = ((p.M + BM - 1) / BM) * ntc;
  const int nu = (units - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x;   // this block's tiles
  // the block's k-th tile: unit blockIdx.x + k gridDim.x, rows (u / ntc) BM.., columns (u % ntc) BN..
  auto unit_of = [&](int k) { return (int)blockIdx.x + k * (int)gridDim.x; };

  const int tid = threadIdx.x, wg = tid >> 7;
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(bar_full + 8 * s, 1);
      mbar_init(bar_empty + 8 * s, 4);        // the four warps of the warpgroup that consumed the slot
    }
    for (int b = 0; b < 4; ++b) {
      mbar_init(bar_rec_full + 8 * b, 32);    // the lanes of the column warp
      mbar_init(bar_rec_empty + 8 * b, 4);    // the warps of the math warpgroup
    }
    for (int w = 0; w < 2; ++w) {
      mbar_init(bar_epi_full + 8 * w, 1);     // math warpgroup w: its staged outputs are complete
      mbar_init(bar_epi_empty + 8 * w, 1);    // its store warp: the staged outputs have been read
      mbar_init(bar_turn + 8 * w, 4);         // the other math warpgroup's warps: past their tile's stages
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {
    regs_dec<40>();
    if (tid == 0) {
      // ---------------------------------------------------------------- producer: stages in tile order
      int slot = 0, phase = 0;
      for (int k = 0; k < nu; ++k) {
        const int u = unit_of(k), mt = u / ntc, nc = u - mt * ntc;
        // the 128 image rows of column tile nc: half (nc % 2) of 256-row block nc / 2, stage ks
        const uint8_t* img = p.b + ((int64_t)(nc >> 1) * ns * 256 + (nc & 1) * 128) * KSB;
        for (int ks = 0; ks < ns; ++ks) {
          mbar_wait(bar_empty + 8 * slot, phase ^ 1);
          mbar_arrive_expect_tx(bar_full + 8 * slot, SLOT_BYTES);
          const uint32_t dst = base + slot * SLOT_BYTES;
          bulk_g2s(dst, img + (int64_t)ks * 256 * KSB, B_BYTES, bar_full + 8 * slot);
          tma_load_2d(dst + B_BYTES, &tmap_a, ks * KSB, mt * BM, bar_full + 8 * slot);
          if (++slot == STAGES) { slot = 0; phase ^= 1; }
        }
      }
    }
    if (tid >= 32 && tid < 64) {
      // Column warp: each tile's row and column terms, ahead of its epilogue (buffer (k / 2) % 2 of warpgroup
      // k % 2). Its loads may wait for memory; the math warps' must not.
      const int lane = tid - 32;
      for (int k = 0; k < nu; ++k) {
        const int w = k & 1, b = (k >> 1) & 1, use = k >> 2;
        const uint32_t bar = 8 * (2 * w + b);
        mbar_wait(bar_rec_empty + bar, (use & 1) ^ 1);
        uint8_t* buf = smem + OFF_REC + (2 * w + b) * REC_BYTES;
        const int u = unit_of(k), mt = u / ntc, n0 = (u - mt * ntc) * BN, m0 = mt * BM;
#pragma unroll
        for (int e = 0; e < BN / 32; ++e) {
          const int c = e * 32 + lane, n = n0 + c;
          const bool ok = n < p.N;
          int* r = reinterpret_cast<int*>(buf) + 8 * (c >> 1) + (c & 1);
          r[0] = ok ? -2 * p.pw[n] : 0;
          r[2] = __float_as_int((ok && p.scale) ? load_f32(p.scale, p.scale_dtype, p.scale_stride * n) : 1.f);
          r[4] = __float_as_int((ok && p.bias) ? load_f32(p.bias, p.bias_dtype, n) : 0.f);
        }
#pragma unroll
        for (int e = 0; e < BM / 32; ++e) {
          const int r = e * 32 + lane, m = m0 + r;
          reinterpret_cast<int*>(buf + COL_BYTES)[r] = m < p.M ? p.K - 2 * p.pa[m] : 0;
        }
        mbar_arrive(bar_rec_full + bar);
      }
    }
    if (tid >= 64 && tid < 128) {
      // Store warps, one per math warpgroup: its staged outputs to global memory, one bulk copy per row.
      const int sw = (tid - 64) >> 5, lane = tid & 31;
      const uint32_t staged = base + OFF_EPI + sw * EPI_BYTES;
      int j = 0;
      for (int k = sw; k < nu; k += 2) {
        const int u = unit_of(k), mt = u / ntc;
        const int m0 = mt * BM, n0 = (u - mt * ntc) * BN;
        for (int ps = 0; ps < PASSES; ++ps, ++j) {
          mbar_wait(bar_epi_full + 8 * sw, j & 1);
          const int cols = min(CP, p.N - (n0 + ps * CP));   // a multiple of 8: whole 16-byte chunks
          if (cols > 0) {
            for (int r = lane; r < BM; r += 32)
              if (m0 + r < p.M)
                bulk_s2g(static_cast<OT*>(p.out) + (int64_t)(m0 + r) * p.N + n0 + ps * CP, staged + r * EPI_LD,
                         (uint32_t)(cols * (int)sizeof(OT)));
          }
          bulk_commit();
          bulk_wait_read_all();
          __syncwarp();
          if (lane == 0) mbar_arrive(bar_epi_empty + 8 * sw);
        }
      }
      bulk_wait_all();   // the block's shared memory stays allocated until the copies are done
    }
    return;
  }

  // ------------------------------------------------------------------- math
  regs_inc<232>();
  const int cw = wg - 1;                        // this warpgroup takes the block's tiles cw, cw + 2, ...
  const int t = tid & 127, warp = t >> 5, lane = tid & 31;
  const int g = lane >> 2, q = lane & 3;
  uint8_t* epi = smem + OFF_EPI + cw * EPI_BYTES;
  // stmatrix (2-byte outputs): lane l names row l % 8 of matrix l / 8 = {(j, rows 0-7), (j, rows 8-15),
  // (j + 1, rows 0-7), (j + 1, rows 8-15)} of this warp's 16 rows (of each 64-row half)
  const uint32_t stm = (uint32_t)__cvta_generic_to_shared(epi) +
                       (uint32_t)((warp * 16 + (lane & 7) + 8 * ((lane >> 3) & 1)) * EPI_LD + (lane >> 4) * 16);

  uint32_t acc[128];                            // rows 0-63 of the tile in acc[0..63], rows 64-127 in acc[64..127]
  int done = 0;                                 // tiles of this warpgroup so far
  for (int k = cw; k < nu; k += 2, ++done) {
    // Turns: a warpgroup starts tile k once the other has waited for every stage of tile k - 1. Besides
    // alternating the main loops, this keeps every waiter of a "full" barrier within one phase of it (a
    // parity wait cannot tell phase p from p + 2: without turns, the second warpgroup's wait for the first
    // stage of its tile could pass on an earlier phase of the same slot).
    if (k > 0) mbar_wait(bar_turn + 8 * cw, (done - 1 + cw) & 1);
    int pos = k * ns;                           // the tile's first stage in the block's ring order
    int prev_slot = -1, prev2_slot = -1;
    for (int ks = 0; ks < ns; ++ks, ++pos) {
      const int slot = pos % STAGES, phase = (pos / STAGES) & 1;
      mbar_wait(bar_full + 8 * slot, phase);
      if (ks == ns - 1 && lane == 0) mbar_arrive(bar_turn + 8 * (1 - cw));   // the other warpgroup's turn
      const uint32_t sb = base + slot * SLOT_BYTES;
      const uint64_t db = desc_sw128(sb), da0 = desc_sw128(sb + B_BYTES), da1 = desc_sw128(sb + B_BYTES + 64 * KSB);
      wgmma_fence();
#pragma unroll
      for (int j = 0; j < 4; ++j) {   // 256 bits of K each: 32 bytes further along both operands' rows
        wgmma_b1_n128_ss(acc, da0 + (uint64_t)(2 * j), db + (uint64_t)(2 * j), (ks > 0 || j > 0) ? 1 : 0);
        wgmma_b1_n128_ss(acc + 64, da1 + (uint64_t)(2 * j), db + (uint64_t)(2 * j), (ks > 0 || j > 0) ? 1 : 0);
      }
      wgmma_commit();
      if constexpr (INFLIGHT == 1) {
        wgmma_wait<1>();   // the previous stage's wgmmas have retired: release its slot
        if (prev_slot >= 0 && lane == 0) mbar_arrive(bar_empty + 8 * prev_slot);
      } else {
        wgmma_wait<2>();   // the stage before the previous one has retired
        if (prev2_slot >= 0 && lane == 0) mbar_arrive(bar_empty + 8 * prev2_slot);
        prev2_slot = prev_slot;
      }
      prev_slot = slot;
    }
    wgmma_wait<0>();
    if (lane == 0) {   // the last slots: the other warpgroup goes on
      if (INFLIGHT == 2 && prev2_slot >= 0) mbar_arrive(bar_empty + 8 * prev2_slot);
      mbar_arrive(bar_empty + 8 * prev_slot);
    }

    // ------------------------------------------------------------ epilogue
    const int rb = (done & 1), ruse = done >> 1;
    const uint8_t* buf = smem + OFF_REC + (2 * cw + rb) * REC_BYTES;
    mbar_wait(bar_rec_full + 8 * (2 * cw + rb), ruse & 1);
    const int* rowt = reinterpret_cast<const int*>(buf + COL_BYTES);
#pragma unroll
    for (int ps = 0; ps < PASSES; ++ps) {
      mbar_wait(bar_epi_empty + 8 * cw, ((done * PASSES + ps) & 1) ^ 1);   // the store warp read the last block
      auto convert = [&](auto has_bias) {
        constexpr bool HB = decltype(has_bias)::value;
#pragma unroll
        for (int h = 0; h < 2; ++h) {   // rows 64 h + 16 warp + g, + 8
          const int row_lo = 64 * h + warp * 16 + g;
          const int ka0 = rowt[row_lo], ka1 = rowt[row_lo + 8];
          const uint32_t* ac = acc + 64 * h;
          uint32_t packed[4];
          (void)packed;
#pragma unroll
          for (int jb = 0; jb < CP / 8; ++jb) {
            const int j = ps * (CP / 8) + jb;
            const uint8_t* rec = buf + (4 * j + q) * 32;   // columns 8j + 2q, 8j + 2q + 1
            const int4 cs = *reinterpret_cast<const int4*>(rec);
            const int d00 = 4 * (int)ac[4 * j] + ka0 + cs.x, d01 = 4 * (int)ac[4 * j + 1] + ka0 + cs.y;
            const int d10 = 4 * (int)ac[4 * j + 2] + ka1 + cs.x, d11 = 4 * (int)ac[4 * j + 3] + ka1 + cs.y;
            uint8_t* dst0 = epi + row_lo * EPI_LD + (8 * jb + 2 * q) * (int)sizeof(OT);
            uint8_t* dst1 = dst0 + 8 * EPI_LD;
            (void)dst1;
            if constexpr (std::is_same<OT, int32_t>::value) {
              (void)HB;
              *reinterpret_cast<int2*>(dst0) = make_int2(d00, d01);
              *reinterpret_cast<int2*>(dst1) = make_int2(d10, d11);
            } else {
              // the reference's roundings: float32(dot) * scale, then + bias, each rounded (no FMA)
              const float s0 = __int_as_float(cs.z), s1 = __int_as_float(cs.w);
              float y00 = __fmul_rn((float)d00, s0), y01 = __fmul_rn((float)d01, s1);
              float y10 = __fmul_rn((float)d10, s0), y11 = __fmul_rn((float)d11, s1);
              if constexpr (HB) {
                const float2 bi = *reinterpret_cast<const float2*>(rec + 16);
                y00 = __fadd_rn(y00, bi.x);
                y01 = __fadd_rn(y01, bi.y);
                y10 = __fadd_rn(y10, bi.x);
                y11 = __fadd_rn(y11, bi.y);
              }
              if constexpr (std::is_same<OT, float>::value) {
                *reinterpret_cast<float2*>(dst0) = make_float2(y00, y01);
                *reinterpret_cast<float2*>(dst1) = make_float2(y10, y11);
              } else {
                packed[2 * (jb & 1)] = pack2<OT>(y00, y01);
                packed[2 * (jb & 1) + 1] = pack2<OT>(y10, y11);
                if (jb & 1) stmatrix_x4(stm + (uint32_t)(64 * h * EPI_LD + (jb - 1) * 16), packed);
              }
            }
          }
        }
      };
      if (p.bias != nullptr && !std::is_same<OT, int32_t>::value)
        convert(std::true_type{});
      else
        convert(std::false_type{});
      fence_proxy_async();                       // the bulk copies (async proxy) read what was written here
      named_barrier(1 + cw, 128);                // the staged rows are complete
      if (t == 0) mbar_arrive(bar_epi_full + 8 * cw);
    }
    if (lane == 0) mbar_arrive(bar_rec_empty + 8 * (2 * cw + rb));   // this warp has read the tile's terms
  }
#endif
}

template <typename OT, int INFLIGHT>
static cudaError_t launch_t(const BinGemmArgs& p, int num_sms, cudaStream_t st) {
  auto kernel = bgemm_pp_kernel<OT, INFLIGHT>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES);
  if (e != cudaSuccess) return e;
  const int units = ceil_div(p.M, BM) * ceil_div(p.N, BN);
  CUtensorMap tmap_a;
  e = bwg::make_tmap_a(p, KSB, BM, &tmap_a);
  if (e != cudaSuccess) return e;
  a_popc_kernel<<<(unsigned)ceil_div(p.M, 8), 256, 0, st>>>(p.a, p.lda, p.M, p.KB, p.pa);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  kernel<<<(unsigned)std::min(units, num_sms), THREADS, SMEM_BYTES, st>>>(p, tmap_a);
  BIE_LAUNCH_CHECK();
}

}  // namespace bpp

// The ping-pong schedule of the 1-bit wgmma GEMM: p as launch_binary_gemm_wgmma, plus p.pa (M int32 scratch).
cudaError_t launch_binary_gemm_wgmma_pp(const BinGemmArgs& p, int inflight, int num_sms, cudaStream_t st) {
  if (p.M == 0 || p.N == 0) return cudaSuccess;
  if (p.pa == nullptr || (inflight != 1 && inflight != 2)) return cudaErrorInvalidValue;
  switch (p.out_dtype) {
    case kI32: return inflight == 1 ? bpp::launch_t<int32_t, 1>(p, num_sms, st) : bpp::launch_t<int32_t, 2>(p, num_sms, st);
    case kF32: return inflight == 1 ? bpp::launch_t<float, 1>(p, num_sms, st) : bpp::launch_t<float, 2>(p, num_sms, st);
    case kF16: return inflight == 1 ? bpp::launch_t<__half, 1>(p, num_sms, st) : bpp::launch_t<__half, 2>(p, num_sms, st);
    case kBF16:
      return inflight == 1 ? bpp::launch_t<__nv_bfloat16, 1>(p, num_sms, st) : bpp::launch_t<__nv_bfloat16, 2>(p, num_sms, st);
  }
  return cudaErrorInvalidValue;
}

}  // namespace bie
