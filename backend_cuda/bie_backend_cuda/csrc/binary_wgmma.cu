// Binary GEMM on Hopper's 1-bit wgmma (sm_90a): persistent, warp-specialised,
// for prepared weights and M >= a few hundred rows.
//
//   out[m, n] = epilogue(4 popc(a_m & w_n) - 2 popc(a_m) - 2 popc(w_n) + K)
//
// Why this shape. Per 1024-bit stage a block needs 32 KB of weights and 16 KB of activations; both arrive in
// shared memory through the TMA engine (weights by one bulk copy of a prepared, pre-swizzled image; activations
// by a 2-D tensor map that swizzles and zero-fills rows past M and bytes past K), so the math warps issue no
// global loads. The activations then go to the wgmma's A registers by ldmatrix.x4, one instruction per
// wgmma (its four registers are exactly four 8x8 b16 matrices of the swizzled tile), and the row popcounts
// of A are summed from those registers. Loading A from global memory straight into the A registers (one 32-bit
// load per register) would touch 8 rows per load, ~2000 L1 line accesses per stage: more time than the stage's
// tensor work.
//
// Block: 3 warpgroups. Warpgroup 0: one producer thread fills a 3-slot ring (weights + activations of a
// stage per slot, counted on "full" mbarriers); a column warp stages each tile's column terms (-2 popc(w),
// scale, bias as float32) in shared memory ahead of its epilogue; two store warps copy the staged outputs to
// global memory with bulk copies, so the math warps go on to the next tile while the stores drain.
// Warpgroups 1 and 2 each own 64 rows of the 128x256 tile: per stage four m64n256k256 wgmmas with A from
// registers; a slot is released (per warp, on an "empty" mbarrier) once the wgmmas that read it have
// retired. The epilogue converts the accumulators with the reference's roundings and stages them in shared
// memory (stmatrix for 2-byte outputs; padded rows, no bank conflicts).
//
// A stage runs at the tensor rate of the two warpgroups' wgmma chains together: two ring slots leave it waiting
// on copies, three do not. Each tile adds its epilogue, while both math warpgroups convert their accumulators and
// the tensor cores idle; at 4096^3 writing the 32 MB of bf16 output at HBM speed is a large part of the time
// (figures: benchmarks/results/cuda_h100.md). Running the warpgroups out of phase (ping-pong on 128x128 tiles,
// staggered) is slower, as each warpgroup's own cycle keeps its epilogue.
// Clusters sharing the weight stages by multicast (template CL, forced with tile="wgmma2" / "wgmma4") cut the
// L2 traffic but are slower, so the default is CL = 1.
//
// The prepared weight image (bie_backend_cuda.binary.wgmma_image builds it):
// [N/256 column tiles][K/1024 stages][256 rows][128 bytes], each row in the
// wgmma's 128-byte swizzle (16-byte chunk c stored at c ^ (row % 8)), zero
// past N and K, so one bulk copy of 32 KB fills a stage.
//
// Requirements (checked by the binding): sm_90, K % 128 == 0 (whole 16-byte
// chunks), N % 8 == 0 (whole 16-byte output chunks), rows of a 16-byte
// aligned (the tensor map's rule too).
#include "tensor_map.h"   // CUtensorMap, its encoder (fetched from the driver at run time)

#include <type_traits>

#include "common.cuh"
#include "hopper.cuh"
#include "wgmma_b1.cuh"

namespace bie {
namespace bwg {

using namespace hop;

constexpr int BM = 128, BN = 256;
constexpr int KSB = 128;                   // bytes of K per stage (1024 bits)
constexpr int STAGE_BYTES = BN * KSB;      // 32 KB of weights per stage
constexpr int A_BYTES = BM * KSB;          // 16 KB of activations per stage
constexpr int SLOT_BYTES = STAGE_BYTES + A_BYTES;
#ifndef BIE_BW_STAGES
#define BIE_BW_STAGES 3
#endif
constexpr int STAGES = BIE_BW_STAGES;      // slots of the ring (what shared memory leaves beside the epilogue)
constexpr int EPI_LD = 528;                // bytes per staged output row (512 + 16: conflict-free rows)
constexpr int EPI_BYTES = 64 * EPI_LD;     // per math warpgroup
// column terms of one tile (x2 buffers), one 32-byte record per pair of columns c, c+1:
// {-2 popc(w_c), -2 popc(w_c+1), scale_c, scale_c+1, bias_c, bias_c+1, -, -}: one 16-byte load gives a thread
// what it needs of a column pair without bias, two with
constexpr int COL_BYTES = BN / 2 * 32;
constexpr int THREADS = 384;
constexpr int OFF_EPI = STAGES * SLOT_BYTES;
constexpr int OFF_COL = OFF_EPI + 2 * EPI_BYTES;
constexpr int OFF_BAR = OFF_COL + 2 * COL_BYTES;
constexpr int SMEM_BYTES = OFF_BAR + (2 * STAGES + 8) * 8 + 1024;   // + alignment of the ring (swizzle atoms)

// four 8x8 matrices of 16-bit elements (here: 8 rows x 16 bytes of bits each) from shared memory; lane l
// gives the row address of row l % 8 of matrix l / 8 and receives row l / 4, bytes 4 (l % 4).. of each
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
#endif
}

__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
#endif
}

template <typename OT> __device__ __forceinline__ uint32_t pack2(float a, float b);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float a, float b) {
  __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float a, float b) {
  __half2 v = __floats2half2_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&v);
}

// CL: blocks per cluster along M. The CL blocks of a cluster work on CL vertically adjacent tiles of the
// same weight columns: each block's producer fetches 1/CL of every weight stage and multicasts it to all of
// them, which divides the weights' L2 -> SM traffic by CL. A slot is refilled only when the math warps of
// every block have released it, so the blocks run in lockstep; on the H100 that cost more than the traffic
// saved (L2 ran at ~35% of its peak at CL = 1), hence the default CL = 1.
template <typename OT, int CL>
__global__ void __launch_bounds__(THREADS, 1) bgemm_wgmma_kernel(const BinGemmArgs p,
                                                                  const __grid_constant__ CUtensorMap tmap_a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  uint8_t* smem = smem_raw + (base - raw);
  const uint32_t bar_full = base + OFF_BAR, bar_empty = bar_full + STAGES * 8;
  const uint32_t bar_col_full = bar_empty + STAGES * 8, bar_col_empty = bar_col_full + 16;   // 2 buffers each
  const uint32_t bar_epi_full = bar_col_empty + 16, bar_epi_empty = bar_epi_full + 16;    // per math warpgroup
  constexpr int PASSES = sizeof(OT) == 2 ? 1 : 2;   // 4-byte outputs are staged in two halves of 128 columns
  constexpr int CP = BN / PASSES;

  const int ns = (p.KB + KSB - 1) / KSB;
  const int nt = (p.N + BN - 1) / BN;
  const int ngroups = (((p.M + BM - 1) / BM + CL - 1) / CL) * nt;   // work units: CL tiles of one column tile
  const int rank = CL > 1 ? (int)cluster_rank() : 0;
  const int cid = CL > 1 ? (int)cluster_id_x() : (int)blockIdx.x;
  const int ncl = CL > 1 ? (int)cluster_count_x() : (int)gridDim.x;
  const int total = ((ngroups - cid + ncl - 1) / ncl) * ns;         // iterations (stages), the same in a cluster

  const int tid = threadIdx.x, wg = tid >> 7;
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(bar_full + 8 * s, 1);
      mbar_init(bar_empty + 8 * s, 8 * CL);   // every math warp of the cluster releases the slot
    }
    for (int b = 0; b < 2; ++b) {
      mbar_init(bar_col_full + 8 * b, 32);     // the lanes of the column warp
      mbar_init(bar_col_empty + 8 * b, 8);     // the math warps of this block
      mbar_init(bar_epi_full + 8 * b, 1);      // math warpgroup b: its staged outputs are complete
      mbar_init(bar_epi_empty + 8 * b, 1);     // its store warp: the staged outputs have been read
    }
    mbar_init_fence();
  }
  if (CL > 1) cluster_sync(); else __syncthreads();

  if (wg == 0) {
    // ---------------------------------------------------------------- producer
    regs_dec<40>();
    if (tid == 0) {
      constexpr int SLICE = STAGE_BYTES / CL;
      int ks = 0, group = cid, slot = 0, phase = 0;
      int64_t img = (int64_t)(group % nt) * ns * STAGE_BYTES + rank * SLICE;
      int m0 = ((group / nt) * CL + rank) * BM;
      for (int it = 0; it < total; ++it) {
        mbar_wait(bar_empty + 8 * slot, phase ^ 1);
        mbar_arrive_expect_tx(bar_full + 8 * slot, SLOT_BYTES);
        const uint32_t dst = base + slot * SLOT_BYTES;
        const uint8_t* src = p.b + img + (int64_t)ks * STAGE_BYTES;
        if (CL > 1)
          bulk_g2s_multicast(dst + rank * SLICE, src, SLICE, bar_full + 8 * slot, (uint16_t)((1u << CL) - 1));
        else
          bulk_g2s(dst, src, STAGE_BYTES, bar_full + 8 * slot);
        // this block's 128 rows of A: the tensor map zero-fills rows past M and bytes past K/8
        tma_load_2d(dst + STAGE_BYTES, &tmap_a, ks * KSB, m0, bar_full + 8 * slot);
        if (++slot == STAGES) { slot = 0; phase ^= 1; }
        if (++ks == ns) {
          ks = 0;
          group += ncl;
          img = (int64_t)(group % nt) * ns * STAGE_BYTES + rank * SLICE;
          m0 = ((group / nt) * CL + rank) * BM;
        }
      }
    }
    if (tid >= 32 && tid < 64) {
      // Column warp: the epilogue's per-column terms of every tile (-2 popc(w), scale, bias as float32),
      // staged in shared memory ahead of time in two buffers. Its loads may wait for memory; the math warps'
      // own loads must not (a load followed by anything that uses it stalls a warp that has no other work).
      const int lane = tid - 32;
      const int ntl = total / ns;
      int group = cid;
      for (int i = 0; i < ntl; ++i, group += ncl) {
        const int b = i & 1;
        mbar_wait(bar_col_empty + 8 * b, ((i >> 1) & 1) ^ 1);
        int* rec = reinterpret_cast<int*>(smem + OFF_COL + b * COL_BYTES);
        const int n0 = (group % nt) * BN;
#pragma unroll
        for (int e = 0; e < BN / 32; ++e) {
          const int c = e * 32 + lane, n = n0 + c;
          const bool ok = n < p.N;
          int* r = rec + 8 * (c >> 1) + (c & 1);
          r[0] = ok ? -2 * p.pw[n] : 0;
          r[2] = __float_as_int((ok && p.scale) ? load_f32(p.scale, p.scale_dtype, p.scale_stride * n) : 1.f);
          r[4] = __float_as_int((ok && p.bias) ? load_f32(p.bias, p.bias_dtype, n) : 0.f);
        }
        mbar_arrive(bar_col_full + 8 * b);
      }
    }
    if (tid >= 64 && tid < 128) {
      // Store warps, one per math warpgroup: each staged block of outputs goes to global memory by bulk
      // copies (one per row, issued by the TMA engine), so the math warps start the next tile while the
      // stores drain instead of writing global memory themselves.
      const int sw = (tid - 64) >> 5, lane = tid & 31;
      const uint32_t staged = base + OFF_EPI + sw * EPI_BYTES;
      const int ntl = total / ns;
      int group = cid, k = 0;
      for (int i = 0; i < ntl; ++i, group += ncl) {
        const int mg = group / nt;
        const int m0 = (mg * CL + rank) * BM + sw * 64, n0 = (group - mg * nt) * BN;
        for (int ps = 0; ps < PASSES; ++ps, ++k) {
          mbar_wait(bar_epi_full + 8 * sw, k & 1);
          const int cols = min(CP, p.N - (n0 + ps * CP));   // a multiple of 8: whole 16-byte chunks
          if (cols > 0) {
            for (int r = lane; r < 64; r += 32)
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
    if (CL > 1) cluster_sync();   // no block leaves while the others may still write to it
    return;
  }

  // ------------------------------------------------------------------- math
  regs_inc<232>();
  const int cw = wg - 1;                        // math warpgroup: rows 64 cw .. 64 cw + 63 of the tile
  const int t = tid & 127, warp = t >> 5, lane = tid & 31;
  const int g = lane >> 2, q = lane & 3;
  uint8_t* epi = smem + OFF_EPI + cw * EPI_BYTES;

  // A registers of one stage, in the order the wgmmas take them: chunk j (256 bits) of the stage is
  // {row r word q, row r+8 word q, row r word 4+q, row r+8 word 4+q} at a[4j..4j+3], which is exactly what
  // ldmatrix.x4 returns for the matrices (rows 0-7 | 8-15 of the warp) x (16-byte chunk 2j | 2j+1). The stage
  // arrived through the tensor map in the 128-byte swizzle: chunk c of row r at c ^ (r % 8).
  const int lrow = warp * 16 + cw * 64 + (lane & 7) + 8 * ((lane >> 3) & 1);   // the row this lane addresses
  const uint32_t a_lane = (uint32_t)(lrow * KSB);
  auto load_a = [&](uint32_t (&dst)[16], uint32_t slot_base) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t r[4];
      ldmatrix_x4(r, slot_base + STAGE_BYTES + a_lane + ((uint32_t)(((2 * j + (lane >> 4)) ^ (lane & 7)) << 4)));
#pragma unroll
      for (int i = 0; i < 4; ++i) dst[4 * j + i] = r[i];
    }
  };

  uint32_t acc[128];
  uint32_t ar[2][16];   // two sets: the wgmmas of a stage read theirs while the next stage's are loaded
  int pa0 = 0, pa1 = 0;                         // popc of this lane's rows g, g + 8 over its words
  int tiles_done = 0;                           // epilogues so far (column buffer and phase)
  int c_ks = 0, slot = 0, phase = 0, prev_slot = -1;

  // a slot whose wgmmas have retired goes back to the producer (of every block of the cluster)
  auto release = [&](int s) {
    if (s < 0 || lane != 0) return;
    if (CL > 1) {
#pragma unroll
      for (int r = 0; r < CL; ++r) mbar_arrive_cluster(bar_empty + 8 * s, r);
    } else {
      mbar_arrive(bar_empty + 8 * s);
    }
  };

  auto step = [&](uint32_t (&a)[16]) {
    if (c_ks == 0) pa0 = pa1 = 0;
    mbar_wait(bar_full + 8 * slot, phase);
    load_a(a, base + slot * SLOT_BYTES);
    const uint64_t d0 = desc_sw128(base + slot * SLOT_BYTES);
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < 4; ++j)
      wgmma_b1_n256(acc, a[4 * j], a[4 * j + 1], a[4 * j + 2], a[4 * j + 3], d0 + (uint64_t)(2 * j),
                    (c_ks > 0 || j > 0) ? 1 : 0);
    wgmma_commit();
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      pa0 += __popc(a[4 * j]) + __popc(a[4 * j + 2]);
      pa1 += __popc(a[4 * j + 1]) + __popc(a[4 * j + 3]);
    }
    wgmma_wait<1>();   // the previous stage's wgmmas have retired: release its slot, refill its registers
    release(prev_slot);
    prev_slot = slot;
    if (++slot == STAGES) { slot = 0; phase ^= 1; }
    if (c_ks == ns - 1) {
      // ------------------------------------------------------------ epilogue
      wgmma_wait<0>();
      // the tile's last slot goes back now, not with the next tile's first stage: the producer refills it during
      // the epilogue (faster at every measured M, 384-8192 rows)
      release(prev_slot);
      prev_slot = -1;
      int r0 = pa0, r1 = pa1;
      r0 += __shfl_xor_sync(0xffffffffu, r0, 1);
      r0 += __shfl_xor_sync(0xffffffffu, r0, 2);
      r1 += __shfl_xor_sync(0xffffffffu, r1, 1);
      r1 += __shfl_xor_sync(0xffffffffu, r1, 2);
      const int ka0 = p.K - 2 * r0, ka1 = p.K - 2 * r1;
      const int cbuf = tiles_done & 1;
      const uint8_t* col_rec = smem + OFF_COL + cbuf * COL_BYTES;
      mbar_wait(bar_col_full + 8 * cbuf, (tiles_done >> 1) & 1);
      const int row_lo = warp * 16 + g;               // staging rows of this thread: row_lo, row_lo + 8
      // stmatrix (2-byte outputs): lane l names row l % 8 of matrix l / 8 = {(j, rows 0-7), (j, rows 8-15),
      // (j + 1, rows 0-7), (j + 1, rows 8-15)} of this warp's 16 rows
      const uint32_t stm = (uint32_t)__cvta_generic_to_shared(epi) +
                           (uint32_t)((warp * 16 + (lane & 7) + 8 * ((lane >> 3) & 1)) * EPI_LD + (lane >> 4) * 16);
#pragma unroll
      for (int ps = 0; ps < PASSES; ++ps) {
        // the store warp has read the previous block of staged outputs
        mbar_wait(bar_epi_empty + 8 * cw, ((tiles_done * PASSES + ps) & 1) ^ 1);
        // without a bias nothing is added (the reference adds none: -0.0 stays -0.0), one load per pair
        auto convert = [&](auto has_bias) {
          constexpr bool HB = decltype(has_bias)::value;
          uint32_t packed[4];
          (void)packed;
#pragma unroll
          for (int jb = 0; jb < CP / 8; ++jb) {
            const int j = ps * (CP / 8) + jb;
            const uint8_t* rec = col_rec + (4 * j + q) * 32;   // columns 8j + 2q, 8j + 2q + 1
            const int4 cs = *reinterpret_cast<const int4*>(rec);
            const int d00 = 4 * (int)acc[4 * j] + ka0 + cs.x, d01 = 4 * (int)acc[4 * j + 1] + ka0 + cs.y;
            const int d10 = 4 * (int)acc[4 * j + 2] + ka1 + cs.x, d11 = 4 * (int)acc[4 * j + 3] + ka1 + cs.y;
            uint8_t* dst0 = epi + row_lo * EPI_LD + (8 * jb + 2 * q) * (int)sizeof(OT);
            uint8_t* dst1 = dst0 + 8 * EPI_LD;
            (void)dst1;
            if constexpr (std::is_same<OT, int32_t>::value) {
              (void)HB;
              *reinterpret_cast<int2*>(dst0) = make_int2(d00, d01);
              *reinterpret_cast<int2*>(dst1) = make_int2(d10, d11);
            } else {
              const float s0 = __int_as_float(cs.z), s1 = __int_as_float(cs.w);
              // the reference's roundings: float32(dot) * scale, then + bias, each rounded (no FMA). (The
              // conversions, I2FP here and F2FP in pack2, run at a quarter of the FP32 rate on sm_90, yet exact
              // integer-only replacements make the whole kernel slower.)
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
                if (jb & 1) stmatrix_x4(stm + (uint32_t)((jb - 1) * 16), packed);
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
        if (ps == PASSES - 1 && lane == 0) mbar_arrive(bar_col_empty + 8 * cbuf);   // column terms read
      }
    }
    if (++c_ks == ns) {
      c_ks = 0;
      ++tiles_done;
    }
  };

  for (int it0 = 0; it0 < total; it0 += 2) {
    step(ar[0]);
    if (it0 + 1 < total) step(ar[1]);
  }
  if (CL > 1) cluster_sync();
#endif
}

// The tensor map of A: rows of KB bytes, lda apart; boxes of 128 rows x 128 bytes in the 128-byte swizzle
// (the layout the ldmatrix addressing above expects); rows past M and bytes past KB read as zeros.
static cudaError_t make_tmap_a(const BinGemmArgs& p, CUtensorMap* map) {
  return make_tmap_rows_sw128(map, p.a, 1, (uint64_t)p.KB, (uint64_t)p.M, (uint64_t)p.lda, KSB, BM);
}

template <typename OT, int CL>
static cudaError_t launch_cl(const BinGemmArgs& p, int num_sms, cudaStream_t st) {
  auto kernel = bgemm_wgmma_kernel<OT, CL>;
  cudaError_t e = bie::set_smem_limit(reinterpret_cast<const void*>(kernel), SMEM_BYTES);
  if (e != cudaSuccess) return e;
  const int groups = ceil_div(ceil_div(p.M, BM), CL) * ceil_div(p.N, BN);
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  cfg.blockDim = dim3(THREADS);
  cfg.dynamicSmemBytes = SMEM_BYTES;
  cfg.stream = st;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = CL;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  // persistent: as many clusters as can be resident at once (clusters must fit in one GPC, so this can be
  // fewer than num_sms / CL), never more than there are work units
  int resident = num_sms / CL;
  if (CL > 1) {
    cfg.gridDim = dim3(CL * resident);
    int n = 0;
    e = cudaOccupancyMaxActiveClusters(&n, kernel, &cfg);
    if (e != cudaSuccess) return e;
    if (n <= 0) return cudaErrorInvalidConfiguration;
    resident = std::min(resident, n);
  }
  cfg.gridDim = dim3(CL * std::min(groups, resident));
  CUtensorMap tmap_a;
  e = make_tmap_a(p, &tmap_a);
  if (e != cudaSuccess) return e;
  e = cudaLaunchKernelEx(&cfg, kernel, p, tmap_a);
  if (e != cudaSuccess) return e;
  BIE_LAUNCH_CHECK();
}

template <typename OT>
static cudaError_t launch_t(const BinGemmArgs& p, int cluster, int num_sms, cudaStream_t st) {
  switch (cluster) {
    case 1: return launch_cl<OT, 1>(p, num_sms, st);
    case 2: return launch_cl<OT, 2>(p, num_sms, st);
    case 4: return launch_cl<OT, 4>(p, num_sms, st);
  }
  return cudaErrorInvalidValue;
}

}  // namespace bwg

// p.b is the prepared weight image (see the top of this file), p.pw the popcount of every weight row.
// cluster: blocks per cluster along M (1, 2 or 4); 0 chooses.
cudaError_t launch_binary_gemm_wgmma(const BinGemmArgs& p, int cluster, int num_sms, cudaStream_t st) {
  if (p.M == 0 || p.N == 0) return cudaSuccess;
  if (cluster == 0) cluster = 1;   // clusters measured slower on the H100 (cuda_h100.md)
  switch (p.out_dtype) {
    case kI32: return bwg::launch_t<int32_t>(p, cluster, num_sms, st);
    case kF32: return bwg::launch_t<float>(p, cluster, num_sms, st);
    case kF16: return bwg::launch_t<__half>(p, cluster, num_sms, st);
    case kBF16: return bwg::launch_t<__nv_bfloat16>(p, cluster, num_sms, st);
  }
  return cudaErrorInvalidValue;
}

}  // namespace bie
