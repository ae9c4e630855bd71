// The thin weight-only GEMV: what its host plan (wq_thin.cu) and its kernels (wq_thin_kernel.cuh) share.
// The kernels are instantiated per code width, compute type and group in wq_thin_w{2,4,8}_{f16,bf16}{,_wide,_deep}.cu,
// so that the sixteen sets compile in parallel (one unit of a width's kernels took about 110 s, the build's longest).
#pragma once
#include <algorithm>
#include <cuda_runtime.h>

#include "launchers.h"
#include "wq_fragments.cuh"

namespace bie {
namespace thin {

// k per ring stage: 128, and 256 for 2-bit codes (two 512-byte vectors per stage, as 4-bit: the per-stage wait, copy
// and address work is paid once per 1 KiB of codes)
template <int BITS, int MR = 1> struct Stage {
  static constexpr int K = BITS == 2 ? 256 : 128;
};
inline int stage_k(int bits, int mr = 1) { return bits == 2 ? 256 : 128; }
// bytes per x row of a stage in the ring: the stage's k * 2 + 16, so that ldmatrix's 8 rows hit 8 distinct bank quads
template <int BITS, int MR = 1> struct XPitch { static constexpr int v = Stage<BITS, MR>::K * 2 + 16; };

// Ring stages per warp: deeper for a single row of x (smaller slots), so that about 100 KiB of codes per SM
// stay in flight at 16-24 resident warps; 8-bit stages carry 2 KiB of codes, so fewer of them; 2-bit stages carry
// up to 512 bytes of statistics (groups of 32), so 6 (16 warps with K = 28672 still fit).
// Two row tiles (MR = 2, 9-16 rows): 4 stages, enough in flight at 16 warps per SM, and a loop body unrolled over half
// as many slots (with 8 slots instruction fetch stalled the kernel).
// One row tile of 4-bit codes with x staged (one row, and 2-8 rows sliced or whole): 4 stages, or 8 (DEEP) where the
// plan measured that better (wq_thin_plan: mostly big layers).
// 8-bit codes, one row tile, x staged: 3 stages, 4 (DEEP) on layers of at most 2^26 weights (wq_thin_plan); 6 stages
// were slower everywhere.
template <int BITS, int MX, int MR = 1, bool DEEP = false> struct Thin {
  static constexpr int S = MR == 2 ? 4
                           : BITS == 8 ? (MX == 1 ? (DEEP ? 4 : 3) : 3)
                                       : (MX == 1 ? (BITS == 4 ? (DEEP ? 8 : 4) : 6) : (BITS == 4 ? 4 : 3));
};

// Ring slot of one stage: codes (VPS vectors of 512 bytes) | MX rows of x (none for MX == 1: the block stages its
// rows of x once, shared by all warps and items) | GPS statistics rows of 64 bytes.
template <int BITS, int MX, int FS, int MR = 1, bool DEEP = false> struct Slot {
  static constexpr int KS = Stage<BITS, MR>::K;
  static constexpr int VPS = KS / (16 * Layout<BITS>::J);      // vectors per stage: 4 / 2 / 2 (8 / 4 / 2-bit)
  static constexpr int GPS = FS > 0 ? KS / (16 * FS) : 1;      // statistics rows per stage
  static constexpr int XO = VPS * 512, SO = XO + (MX == 1 ? 0 : MX * XPitch<BITS, MR>::v), BYTES = SO + GPS * 64;
  static constexpr int WARP_BYTES = Thin<BITS, MX, MR, DEEP>::S * BYTES + 16;   // + a 16-byte zero row for ldmatrix
};

// The rows of x staged once per block (MX = 1) when they fit in 128 KiB, for one row, or for several rows on layers
// of more than 2^26 weights; else per-stage copies (MX = 8). Staging several rows speeds up the big layers but slows
// the small ones, where the block's wait for all of x before it starts is a larger part of the call.
// From 5 rows, and for rows of a big layer that do not fit whole, x is staged per K slice instead (wq_thin_plan): each
// block then covers one slice of K, and the slices' partials are summed by a second kernel.
// (+ the block's table of sum(x) per group or stage and row pair: units * ceil(M / 2) * 8 bytes; one row: 16 bytes
// per unit, {sum(x), sum(magic * x) of each column half} for the kernel's one-row variant)
inline int thin_fs(int gs_shift);
// How a block stages x (MX = 1; WqThinArgs::xpre, the kernel's prologue), given the blocks of a K slice: copied with
// cp.async after the first stage (two when K > 8192) where every block (every warp, when the warps split the
// columns) covers at most one 16-column item, so that its whole run is the ring's first stages and one pass over K:
// there x early is worth more than the first stages overlapping the previous kernel's tail. Elsewhere, and at 9-16
// rows, and for 8-bit codes (-1): every first stage is issued before the wait, then x is loaded. Where blocks loop
// over several items, -1 measures best on the H100 on all but a few layers at one row, and at 16 rows.
// K slices of 4-bit codes in groups of 128 on layers of more than 2^27 weights (sm_90): in chunks (-3), a few percent
// faster than -1 there at 5-16 rows. Not on smaller layers (the first chunks' wait is a larger part of a shorter
// call), nor for 2-bit codes or groups of 32 (slower there).
inline int thin_xpre(const WqThinArgs& p, int bits, int blocks_per_slice) {
  if (p.mx == 1 && p.cols && p.bulk && bits == 4 && thin_fs(p.gs_shift) == 8 && p.M > 1 &&
      (int64_t)p.N * p.K > (1ll << 27))
    return -3;
  if (p.mx != 1 || bits == 8 || p.M > 8) return -1;
  const int64_t items = (p.N + 15) / 16, takers = (int64_t)blocks_per_slice * (p.cols ? p.warps : 1);
  if (items > takers) return -1;
  return p.K > 8192 ? 2 : 1;
}

// x in chunks (xpre = -3): at most this many, each with two mbarriers (its bytes landed; its sum(x) entries written)
constexpr int THIN_XCHUNKS = 8;
// bytes of `stages` stages of the block's rows of x and their sum(x) table (+ the chunks' mbarriers)
inline int64_t thin_xbytes(const WqThinArgs& p, int stages) {
  const int fs = thin_fs(p.gs_shift);
  const int64_t units = fs > 0 ? (int64_t)stages * (p.kstage / (16 * fs)) : stages;
  return (int64_t)p.M * ((int64_t)stages * p.kstage * 2 + 16) + units * (p.M == 1 ? 16 : ((p.M + 1) / 2) * 8) +
         2 * THIN_XCHUNKS * 8;
}
// stages per chunk of x (xpre = -3): a multiple of the ring's slots `ring` (the kernel tests for a new chunk in its
// first slot only) and even (a chunk's 16-byte pieces of a row are then a multiple of 32 for every stage k), at most
// THIN_XCHUNKS chunks per slice
__host__ __device__ inline int thin_chunk_stages(int slice_stages, int ring) {
  const int c = (slice_stages + THIN_XCHUNKS - 1) / THIN_XCHUNKS, q = ring % 2 == 0 ? ring : 2 * ring;
  return (c + q - 1) / q * q;
}
// all of the rows of x fit the block's staging: at most 128 KiB, leaving at least 64 KiB of the device's shared memory
// for the rings (sm_80 / sm_86 have 163 / 99 KiB per block)
inline bool thin_fits(const WqThinArgs& p) {
  return thin_xbytes(p, p.nstages) <= std::min(128 * 1024, p.smem_limit - 64 * 1024);
}
inline int thin_mx(const WqThinArgs& p) {
  const bool big = (int64_t)p.N * p.K > (1ll << 26);
  return (p.M == 1 || big || p.M > 8) && thin_fits(p) ? 1 : 8;
}

// warps per block a kernel allows (its register budget: wq_thin_kernel.cuh BIE_WQT_BOUNDS)
constexpr int THIN_MAX_WARPS = 16;
__host__ __device__ constexpr int thin_max_warps(int bits, int fs, int mr) {
  return mr == 2 && bits == 2 && fs == 2 ? 8 : THIN_MAX_WARPS;
}

template <int BITS, int MX, int FS, int MR, bool DEEP> constexpr int warp_bytes() {
  return Slot<BITS, MX, FS, MR, DEEP>::WARP_BYTES;
}

// FS of a group size (2/4/8 k16 steps for 32/64/128, else 0)
inline int thin_fs(int gs_shift) { return (gs_shift >= 5 && gs_shift <= 7) ? 1 << (gs_shift - 4) : 0; }

template <int BITS, int MX, int MR = 1, bool DEEP = false>
int thin_warp_bytes(int fs) {
  switch (fs) {
    case 2: return warp_bytes<BITS, MX, 2, MR, DEEP>();
    case 4: return warp_bytes<BITS, MX, 4, MR, DEEP>();
    case 8: return warp_bytes<BITS, MX, 8, MR, DEEP>();
    default: return warp_bytes<BITS, MX, 0, MR, DEEP>();
  }
}

// One width and compute type (every statistics type, format, x staging and group size): wq_thin_kernel.cuh,
// instantiated in wq_thin_w{2,4,8}_{f16,bf16}.cu; its kernel groups (wide, deep) in the units of those names.
template <int BITS, typename T>
cudaError_t launch(const WqThinArgs& p, cudaStream_t st);
template <int BITS, typename T>
cudaError_t launch_wide(const WqThinArgs& p, cudaStream_t st);
template <int BITS, typename T>
cudaError_t launch_deep(const WqThinArgs& p, cudaStream_t st);

}  // namespace thin
}  // namespace bie
