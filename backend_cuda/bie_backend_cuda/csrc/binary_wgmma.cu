// Binary GEMM on Hopper's 1-bit wgmma (sm_90a): persistent, warp-specialised,
// for prepared weights and M >= a few hundred rows.
//
//   out[m, n] = epilogue(4 popc(a_m & w_n) - 2 popc(a_m) - 2 popc(w_n) + K)
//
// Why this shape. Per 1024-bit stage a block needs 32 KB of weights and 16 KB of activations; both arrive in
// shared memory through the TMA engine (weights by one bulk copy of a prepared, pre-swizzled image; activations
// by a 2-D tensor map that swizzles and zero-fills rows past M and bytes past K), and the wgmmas read both
// from there, so the math warps issue no loads in the main loop. The row popcounts popc(a_m) come from a small
// pass over a before the GEMM (a_popc_kernel; a few µs at 8192 rows of 8192 bits); a column warp stages them
// with the weights' column terms for each tile.
//
// Block: 3 warpgroups. Warpgroup 0: one producer thread fills a 3-slot ring (weights + activations of a
// stage per slot, counted on "full" mbarriers); a column warp stages each tile's row terms (K - 2 popc(a)) and
// column terms (-2 popc(w), scale, bias as float32) in shared memory ahead of its epilogue; two store warps copy
// the staged outputs to global memory with bulk copies. Warpgroups 1 and 2 each own 64 rows of the 128x256
// tile: per stage four m64n256k256 wgmmas; a slot is released (per warp, on an "empty" mbarrier) once the
// wgmmas that read it have retired.
//
// The epilogue. Converting a tile's 128 accumulators per thread with the reference's roundings takes ~850
// instructions per thread (a quarter-rate I2FP and half an F2FP per output); done at the end of a tile, as
// the "inline" epilogue does, both math warpgroups convert together while the tensor cores idle, ~3 µs a tile
// against ~5 µs of stages at K = 8192 (cuda_h100_binary_wgmma.md). The "deferred" epilogue (2-byte outputs,
// K < 65536) instead stages the raw popcounts popc(a & w) as 16-bit integers (exact) where the outputs go
// (stmatrix, ~50 instructions per thread), starts the next tile at once, and converts the staged block in
// place a few rows per stage in the shadow of the next tile's wgmmas; the store warp copies it when all four
// warps of the warpgroup are done. (Two accumulator sets per warpgroup would be the other way to overlap, but
// ptxas serialises the wgmmas then: benchmarks/lab/b1_dual_acc_probe.cu. The math threads have 168 registers
// at compile time, 128 of them accumulators, which is why the A operand comes from shared memory and not from
// registers: the conversion needs the registers that A fragments took before.)
//
// Clusters sharing the weight stages by multicast (template CL, forced with tile="wgmma2" / "wgmma4") cut
// the L2 traffic but measured slower, so the default is CL = 1.
//
// The prepared weight image (bie_backend_cuda.binary.wgmma_image builds it):
// [N/256 column tiles][K/1024 stages][256 rows][128 bytes], each row in the
// wgmma's 128-byte swizzle (16-byte chunk c stored at c ^ (row % 8)), zero
// past N and K, so one bulk copy of 32 KB fills a stage.
//
// Requirements (checked by the binding): sm_90, K % 128 == 0 (whole 16-byte
// chunks), N % 8 == 0 (whole 16-byte output chunks), rows of a 16-byte
// aligned (the tensor map's rule too), p.pa scratch for M int32.
#include <cuda.h>   // CUtensorMap and its enums (the encoder is fetched from the driver at run time)

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
// Per-tile terms (x2 buffers): column terms, then the row terms K - 2 popc(a) of the tile's 128 rows (int32).
// Inline epilogue: one 32-byte record per pair of columns c, c+1:
//   {-2 popc(w_c), -2 popc(w_c+1), scale_c, scale_c+1, bias_c, bias_c+1, -, -}
// (one 16-byte load gives a thread what it needs of a column pair without bias, two with).
// Deferred epilogue: three arrays of 256 (-2 popc(w) as int32, scale, bias as float32), so that the lanes
// converting 4 consecutive columns each read them with conflict-free 16-byte loads.
constexpr int COL_BYTES = BN / 2 * 32;
constexpr int REC_BYTES = COL_BYTES + BM * 4;
constexpr int THREADS = 384;
constexpr int OFF_EPI = STAGES * SLOT_BYTES;
constexpr int OFF_COL = OFF_EPI + 2 * EPI_BYTES;
constexpr int OFF_BAR = OFF_COL + 2 * REC_BYTES;
constexpr int SMEM_BYTES = OFF_BAR + (2 * STAGES + 8) * 8 + 1024;   // + alignment of the ring (swizzle atoms)

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

// The reference's roundings for one output: float32(dot) * scale, then + bias, each rounded (no FMA). (The
// conversion I2FP runs at a quarter of the FP32 rate on sm_90; exact integer-only replacements measured 7-15 %
// slower over the inline epilogue: cuda_h100_binary_wgmma.md, session 21.)
template <bool HB> __device__ __forceinline__ float finish(int dot, float scale, float bias) {
  const float y = __fmul_rn((float)dot, scale);
  return HB ? __fadd_rn(y, bias) : y;
}

// CL: blocks per cluster along M. The CL blocks of a cluster work on CL vertically adjacent tiles of the
// same weight columns: each block's producer fetches 1/CL of every weight stage and multicasts it to all of
// them, which divides the weights' L2 -> SM traffic by CL. A slot is refilled only when the math warps of
// every block have released it, so the blocks run in lockstep; on the H100 that cost more than the traffic
// saved (L2 ran at ~35% of its peak at CL = 1), hence the default CL = 1.
// DEFER: the deferred epilogue (2-byte outputs, K < 65536; see the top of the file).
template <typename OT, int CL, bool DEFER>
__global__ void __launch_bounds__(THREADS, 1) bgemm_wgmma_kernel(const BinGemmArgs p,
                                                                  const __grid_constant__ CUtensorMap tmap_a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(!DEFER || sizeof(OT) == 2, "the deferred epilogue converts 16-bit popcounts into 2-byte outputs");
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
      // math warpgroup b: its staged outputs are complete (deferred: each of its warps has converted its share)
      mbar_init(bar_epi_full + 8 * b, DEFER ? 4 : 1);
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
      // Column warp: the epilogue's per-tile terms (row terms K - 2 popc(a), and -2 popc(w), scale, bias as
      // float32 per column), staged in shared memory ahead of time in two buffers. Its loads may wait for
      // memory; the math warps' own loads must not (a load followed by anything that uses it stalls a warp that
      // has no other work).
      const int lane = tid - 32;
      const int ntl = total / ns;
      int group = cid;
      for (int i = 0; i < ntl; ++i, group += ncl) {
        const int b = i & 1;
        mbar_wait(bar_col_empty + 8 * b, ((i >> 1) & 1) ^ 1);
        uint8_t* buf = smem + OFF_COL + b * REC_BYTES;
        const int mg = group / nt;
        const int n0 = (group - mg * nt) * BN, m0 = (mg * CL + rank) * BM;
#pragma unroll
        for (int e = 0; e < BN / 32; ++e) {
          const int c = e * 32 + lane, n = n0 + c;
          const bool ok = n < p.N;
          const int pw = ok ? -2 * p.pw[n] : 0;
          const float sc = (ok && p.scale) ? load_f32(p.scale, p.scale_dtype, p.scale_stride * n) : 1.f;
          const float bi = (ok && p.bias) ? load_f32(p.bias, p.bias_dtype, n) : 0.f;
          if constexpr (DEFER) {
            reinterpret_cast<int*>(buf)[c] = pw;
            reinterpret_cast<float*>(buf + 1024)[c] = sc;
            reinterpret_cast<float*>(buf + 2048)[c] = bi;
          } else {
            int* r = reinterpret_cast<int*>(buf) + 8 * (c >> 1) + (c & 1);
            r[0] = pw;
            r[2] = __float_as_int(sc);
            r[4] = __float_as_int(bi);
          }
        }
#pragma unroll
        for (int e = 0; e < BM / 32; ++e) {
          const int r = e * 32 + lane, m = m0 + r;
          reinterpret_cast<int*>(buf + COL_BYTES)[r] = m < p.M ? p.K - 2 * p.pa[m] : 0;
        }
        mbar_arrive(bar_col_full + 8 * b);
      }
    }
    if (tid >= 64 && tid < 128) {
      // Store warps, one per math warpgroup: each staged block of outputs goes to global memory by bulk
      // copies (one per row, issued by the TMA engine), so the math warps go on while the stores drain.
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
  const int row_lo = warp * 16 + g;             // staging rows of this thread's accumulators: row_lo, row_lo + 8
  // stmatrix (2-byte values): lane l names row l % 8 of matrix l / 8 = {(j, rows 0-7), (j, rows 8-15),
  // (j + 1, rows 0-7), (j + 1, rows 8-15)} of this warp's 16 rows
  const uint32_t stm = (uint32_t)__cvta_generic_to_shared(epi) +
                       (uint32_t)((warp * 16 + (lane & 7) + 8 * ((lane >> 3) & 1)) * EPI_LD + (lane >> 4) * 16);

  uint32_t acc[128];
  int tiles_done = 0;                           // epilogues so far (term buffer and phase)
  int c_ks = 0, slot = 0, phase = 0, prev_slot = -1;

  // Deferred conversion of a staged block: lane l of warp w converts columns 4 cg .. 4 cg + 3 (cg = l + 32 (w % 2))
  // of rows 32 (w / 2) .. 32 (w / 2) + 31, a few rows per stage of the next tile (all of them by its
  // second-to-last stage when it has two or more), in place: 16-bit popcounts in, 2-byte outputs out.
  const int cg = lane + 32 * (warp & 1), rh = warp >> 1;
  const int dq_step = (32 + max(1, ns - 1) - 1) / max(1, ns - 1);   // rows per stage
  int dq_row = 32, dq_tile = 0;                 // next row to convert (32: none staged), the staged tile's index
  auto convert_to = [&](int upto) {
    if constexpr (DEFER) {
      if (dq_row >= upto) return;
      const int b = dq_tile & 1;
      const uint8_t* buf = smem + OFF_COL + b * REC_BYTES;
      if (dq_row == 0) mbar_wait(bar_col_full + 8 * b, (dq_tile >> 1) & 1);
      const int4 pw = *reinterpret_cast<const int4*>(buf + 16 * cg);
      const float4 sc = *reinterpret_cast<const float4*>(buf + 1024 + 16 * cg);
      const int* rowt = reinterpret_cast<const int*>(buf + COL_BYTES) + cw * 64 + rh * 32;
      auto rows = [&](auto has_bias) {
        constexpr bool HB = decltype(has_bias)::value;
        float4 bi = make_float4(0.f, 0.f, 0.f, 0.f);
        if constexpr (HB) bi = *reinterpret_cast<const float4*>(buf + 2048 + 16 * cg);
        for (; dq_row < upto; ++dq_row) {
          uint2* at = reinterpret_cast<uint2*>(epi + (rh * 32 + dq_row) * EPI_LD + 8 * cg);
          const int ka = rowt[dq_row];
          const uint2 v = *at;
          const int d0 = 4 * (int)(v.x & 0xffffu) + ka + pw.x, d1 = 4 * (int)(v.x >> 16) + ka + pw.y;
          const int d2 = 4 * (int)(v.y & 0xffffu) + ka + pw.z, d3 = 4 * (int)(v.y >> 16) + ka + pw.w;
          *at = make_uint2(pack2<OT>(finish<HB>(d0, sc.x, bi.x), finish<HB>(d1, sc.y, bi.y)),
                           pack2<OT>(finish<HB>(d2, sc.z, bi.z), finish<HB>(d3, sc.w, bi.w)));
        }
      };
      if (p.bias != nullptr)
        rows(std::true_type{});
      else
        rows(std::false_type{});
      if (dq_row == 32) {
        fence_proxy_async();                     // the bulk copies (async proxy) read what was written here
        __syncwarp();
        if (lane == 0) {
          mbar_arrive(bar_epi_full + 8 * cw);
          mbar_arrive(bar_col_empty + 8 * b);   // this warp has read the tile's terms
        }
      }
    } else {
      (void)upto;
    }
  };

  auto step = [&]() {
    mbar_wait(bar_full + 8 * slot, phase);
    const uint32_t sb = base + slot * SLOT_BYTES;
    const uint64_t db = desc_sw128(sb), da = desc_sw128(sb + STAGE_BYTES + cw * 64 * KSB);
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < 4; ++j)   // 256 bits of K each: 32 bytes further along both operands' rows
      wgmma_b1_n256_ss(acc, da + (uint64_t)(2 * j), db + (uint64_t)(2 * j), (c_ks > 0 || j > 0) ? 1 : 0);
    wgmma_commit();
    convert_to(min(32, (c_ks + 1) * dq_step));   // the previous tile's staged block, while the wgmmas run
    wgmma_wait<1>();   // the previous stage's wgmmas have retired: release its slot
    if (prev_slot >= 0 && lane == 0) {
      if (CL > 1) {
#pragma unroll
        for (int r = 0; r < CL; ++r) mbar_arrive_cluster(bar_empty + 8 * prev_slot, r);
      } else {
        mbar_arrive(bar_empty + 8 * prev_slot);
      }
    }
    prev_slot = slot;
    if (++slot == STAGES) { slot = 0; phase ^= 1; }
    if (c_ks == ns - 1) {
      // ------------------------------------------------------------ epilogue
      wgmma_wait<0>();
      const int cbuf = tiles_done & 1;
      if constexpr (DEFER) {
        // stage the raw popcounts (< 2^16 as K < 65536) where the outputs go; the store warp has read the
        // previous block (its conversion ended at the latest in this tile's last stage)
        mbar_wait(bar_epi_empty + 8 * cw, (tiles_done & 1) ^ 1);
        uint32_t packed[4];
#pragma unroll
        for (int jb = 0; jb < BN / 8; ++jb) {
          packed[2 * (jb & 1)] = __byte_perm(acc[4 * jb], acc[4 * jb + 1], 0x5410);
          packed[2 * (jb & 1) + 1] = __byte_perm(acc[4 * jb + 2], acc[4 * jb + 3], 0x5410);
          if (jb & 1) stmatrix_x4(stm + (uint32_t)((jb - 1) * 16), packed);
        }
        named_barrier(1 + cw, 128);   // the warpgroup's 64 rows are staged before any lane converts them
        dq_row = 0;
        dq_tile = tiles_done;
        (void)cbuf;
      } else {
        const uint8_t* buf = smem + OFF_COL + cbuf * REC_BYTES;
        mbar_wait(bar_col_full + 8 * cbuf, (tiles_done >> 1) & 1);
        const int* rowt = reinterpret_cast<const int*>(buf + COL_BYTES) + cw * 64;
        const int ka0 = rowt[row_lo], ka1 = rowt[row_lo + 8];
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
              const uint8_t* rec = buf + (4 * j + q) * 32;   // columns 8j + 2q, 8j + 2q + 1
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
                float2 bi = make_float2(0.f, 0.f);
                if constexpr (HB) bi = *reinterpret_cast<const float2*>(rec + 16);
                const float y00 = finish<HB>(d00, s0, bi.x), y01 = finish<HB>(d01, s1, bi.y);
                const float y10 = finish<HB>(d10, s0, bi.x), y11 = finish<HB>(d11, s1, bi.y);
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
          if (ps == PASSES - 1 && lane == 0) mbar_arrive(bar_col_empty + 8 * cbuf);   // terms read
        }
      }
    }
    if (++c_ks == ns) {
      c_ks = 0;
      ++tiles_done;
    }
  };

  for (int it = 0; it < total; ++it) step();
  convert_to(32);   // the last tile's staged block (deferred epilogue)
  if (CL > 1) cluster_sync();
#endif
}

// cuTensorMapEncodeTiled through the runtime's driver entry point (no link against libcuda)
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
static EncodeTiledFn encode_tiled() {
  static const EncodeTiledFn fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
#if CUDART_VERSION >= 12050
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q);
#else
    const cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &f, cudaEnableDefault, &q);
#endif
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess)
      return (EncodeTiledFn) nullptr;
    return reinterpret_cast<EncodeTiledFn>(f);
  }();
  return fn;
}

// The tensor map of A: rows of KB bytes, lda apart; boxes of 128 rows x 128 bytes in the 128-byte swizzle
// (the layout the ldmatrix addressing above expects); rows past M and bytes past KB read as zeros.
static cudaError_t make_tmap_a(const BinGemmArgs& p, CUtensorMap* map) {
  const EncodeTiledFn enc = encode_tiled();
  if (!enc) return cudaErrorNotSupported;
  const cuuint64_t dims[2] = {(cuuint64_t)p.KB, (cuuint64_t)p.M};
  const cuuint64_t strides[1] = {(cuuint64_t)p.lda};
  const cuuint32_t box[2] = {(cuuint32_t)KSB, (cuuint32_t)BM};
  const cuuint32_t estr[2] = {1, 1};
  const CUresult r = enc(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(p.a), dims, strides, box, estr,
                         CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

template <typename OT, int CL, bool DEFER>
static cudaError_t launch_cl(const BinGemmArgs& p, int num_sms, cudaStream_t st) {
  auto kernel = bgemm_wgmma_kernel<OT, CL, DEFER>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES);
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
static cudaError_t launch_t(const BinGemmArgs& p, int cluster, bool defer, int num_sms, cudaStream_t st) {
  if constexpr (sizeof(OT) == 2) {
    if (defer) return cluster == 1 ? launch_cl<OT, 1, true>(p, num_sms, st) : cudaErrorInvalidValue;
  } else {
    if (defer) return cudaErrorInvalidValue;
  }
  switch (cluster) {
    case 1: return launch_cl<OT, 1, false>(p, num_sms, st);
    case 2: return launch_cl<OT, 2, false>(p, num_sms, st);
    case 4: return launch_cl<OT, 4, false>(p, num_sms, st);
  }
  return cudaErrorInvalidValue;
}

}  // namespace bwg

bool binary_gemm_wgmma_can_defer(int K, int out_dtype, int cluster) {
  return (out_dtype == kF16 || out_dtype == kBF16) && K < 65536 && cluster <= 1;
}

// p.b is the prepared weight image (see the top of this file), p.pw the popcount of every weight row, p.pa
// scratch for the popcount of every row of a (written here). cluster: blocks per cluster along M (1, 2 or 4);
// 0 chooses. epilogue: 0 chooses, 1 inline, 2 deferred (binary_gemm_wgmma_can_defer).
cudaError_t launch_binary_gemm_wgmma(const BinGemmArgs& p, int cluster, int epilogue, int num_sms, cudaStream_t st) {
  if (p.M == 0 || p.N == 0) return cudaSuccess;
  if (cluster == 0) cluster = 1;   // clusters measured slower on the H100 (cuda_h100_binary_wgmma.md)
  const bool can_defer = binary_gemm_wgmma_can_defer(p.K, p.out_dtype, cluster);
  if (epilogue == 2 && !can_defer) return cudaErrorInvalidValue;
  const bool defer = epilogue == 2 || (epilogue == 0 && can_defer);
  bwg::a_popc_kernel<<<(unsigned)((p.M + 7) / 8), 256, 0, st>>>(p.a, p.lda, p.M, p.KB, p.pa);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  switch (p.out_dtype) {
    case kI32: return bwg::launch_t<int32_t>(p, cluster, defer, num_sms, st);
    case kF32: return bwg::launch_t<float>(p, cluster, defer, num_sms, st);
    case kF16: return bwg::launch_t<__half>(p, cluster, defer, num_sms, st);
    case kBF16: return bwg::launch_t<__nv_bfloat16>(p, cluster, defer, num_sms, st);
  }
  return cudaErrorInvalidValue;
}

}  // namespace bie
