// Mixed-width (exl2-style) weight-only GEMM for up to MBWQ_SKINNY_MAX_M rows of fp16 / bf16 x on the tensor cores,
// in one cooperative launch (bie_backend_cuda/mbwq.py mbwq_gemm_skinny; the format and the chunk table: mbwq.cu).
//
// Why two phases. Packed row j of the weight multiplies input column perm[j], a permutation that is random in
// practice (act-order). A block that gathered x[:, perm[j]] for its own K range straight from x would touch about
// every 32-byte sector of x's rows (a sector per element at the densities of a K split) and make an L1 request per
// element: at 32 rows of 4096 inputs and one block per multiprocessor that is more L2 traffic than the weight itself.
// So the launch first builds x once in the order the tensor cores read it, and every block then reads that copy
// contiguously:
//   phase 1, every block: tiles of 32 input columns of x (coalesced loads), times channel_scale (float32, then
//     rounded to x's dtype), transposed in shared memory and written as whole rows of MP = 8 * NT values to the slot
//     xslot[k] of the scratch xp (prepared: the chunk and the k slot of the mma that row k feeds);
//   one grid-wide barrier (a cooperative launch: every block is resident, so the barrier cannot wait for a block
//     that never starts);
//   phase 2: the GEMM. A block owns 128 columns (four strips of 32, one per warp of each of its two k-groups) and a
//     K split of the chunk table; tiles (column block, split) are dealt to the blocks, column blocks fastest.
// The weights are the A operand of mma.m16n8k16 (16 output columns x 16 k), xp the B operand (8 rows of x per n8
// tile, NT tiles), float32 accumulation. A warp decodes the A fragments of its 32 columns straight from the chunk's
// int32 words in registers; the k slots of the mma are assigned to the chunk's rows so that every lane's codes are
// consecutive in the bit stream: lane (g = lane / 4, t = lane % 4) holds for each of its columns the codes of chunk
// rows 8t .. 8t+7, which are 8 * b consecutive bits (b / 4 words at bit 8tb). Its register R (0..3) carries rows
// 8t + R (low half) and 8t + R + 4 (high half): two codes that sit 4b bits apart, brought 16 bits apart by one
// byte permutation, then masked and given the magic exponent in one LOP3 (q + 1024 in fp16, q + 128 in bf16: exact),
// as the weight-only skinny kernel does (wq_skinny.cu). Register R is the A register of k16 step R / 2, k half R % 2,
// so mma k slot  kappa = 16 s + 8 h + 2 t + e  (step s, half h, pair element e)  holds chunk row
//   row_of_slot(kappa) = 8 t + 2 s + h + 4 e;
// xp stores row kappa of each chunk in that order (mbwq.py prepare computes xslot from the same formula), and B is
// read with ldmatrix.trans (rows of xp are k, their MP values the n of the mma).
// The A values are the dequantized weights in x's dtype, q * s - z with one rounding (the magic taken off exactly,
// then one fused multiply-add with s and -z rounded to x's dtype), as the dense path's weight (which rounds the
// float32 q * s - z once to x's dtype); channel_scale goes with x (the dense path folds it into the weight): both
// within the op's tolerance (wq_tolerance), which is set by the 16-bit rounding of the products' operands.
// Streaming: a ring of `stages` shared-memory stages filled by cp.async, each holding one chunk for each k-group:
// its b rows of 128 weight words (16-byte copies when N % 4 == 0), the chunk group's scales and zeros for the 128
// columns (float32) and its 32 rows of xp (16-byte copies; rows of the mma beyond the chunk's rows zero-filled, so
// that a partial chunk's unused codes, decoded to finite values, add nothing). The weight and statistics copies of
// the first stages are issued before phase 1 (they do not depend on it), the xp copies after the barrier. One
// barrier per stage: the slot refilled is the one every warp finished in the previous step.
// K splits: the two k-groups of a block meet in shared memory (group 0 + group 1); with more than one split per
// column block every split of it is resident at once (the plan keeps tiles <= the resident blocks), each writes
// float32 partials, arrives at the column block's counter, waits for the others and then sums its share of the
// column block's outputs over the splits in split order (deterministic, and the sums spread over the splits'
// blocks instead of one), adds the bias and casts. The counters live in the call's own scratch and are zeroed in
// phase 1 (the grid barrier orders that before every arrival): no state is carried from one launch to the next, so
// launches on other streams, or CUDA graphs replayed in any order or at once, cannot share or inherit a count.
#include <cooperative_groups.h>

#include "common.cuh"
#include "wq_fragments.cuh"

namespace bie {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = MBWQ_SKINNY_WARPS * 32;
constexpr int kBN = MBWQ_SKINNY_BN;              // columns per block
constexpr int kStrips = kBN / 32;                // strips of 32 columns, one warp each per k-group
constexpr int kKG = MBWQ_SKINNY_WARPS / kStrips; // k-groups: the warps of a strip take alternate chunks
constexpr int kRS = kBN + 8;                     // words between weight rows of a slot: the lanes' rows fall on
                                                 // banks 8 apart (conflict-free up to 5 bits, 2-way for 6 and 8)
constexpr int kXT = 32;                          // input columns per phase-1 tile
constexpr int kMaxStages = 8;
static_assert(kKG == 2 && kStrips * 32 == kBN, "two k-groups of 32-column strips");

struct SkChunk {
  int bits, rows, group, nwords;
  int64_t w0;
};

// Chunk c of the table, checked against the shapes and the slot's rows (p.sr): false for an entry not to follow.
__device__ __forceinline__ bool sk_chunk(const MbwqSkinnyArgs& p, int c, SkChunk& ch) {
  const int4 e = __ldg(p.chunks + c);
  ch.bits = e.x & 0xff;
  ch.rows = e.x >> 8;
  ch.group = e.y;
  ch.w0 = e.w;
  ch.nwords = (ch.rows * ch.bits + 31) >> 5;
  const bool width = ch.bits >= 2 && ch.bits <= 8 && ch.bits != 7 && ch.bits <= p.sr;
  return width && ch.rows >= 1 && ch.rows <= 32 && ch.group >= 0 && ch.group < p.G && e.z >= 0 &&
         e.z <= p.K - ch.rows && ch.w0 >= 0 && ch.w0 + ch.nwords <= p.KW;
}

// The chunk row that mma k slot kappa (0..31) multiplies (the fragment order described at the top).
__device__ __forceinline__ int row_of_slot(int kappa) {
  return 8 * ((kappa >> 1) & 3) + 2 * (kappa >> 4) + ((kappa >> 3) & 1) + 4 * (kappa & 1);
}

__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// The four A registers' codes of one column for lane t: q[R] = (code of row 8t+R, code of row 8t+R+4) as a 16-bit
// pair with the magic exponent (exact q + MAGIC), or for 8-bit codes in bf16 the exact integers themselves.
// wc: the column's word of row 0 of the slot (rows kRS words apart).
template <int B, typename T>
__device__ __forceinline__ void decode_codes(const uint32_t* wc, int t, uint32_t (&q)[4]) {
  constexpr uint32_t MAG = Magic<T>::v;
  if constexpr (B == 8) {
    // words 2t and 2t+1: rows 8t..8t+3 and 8t+4..8t+7, a byte each
    const uint32_t w0 = wc[(2 * t) * kRS], w1 = wc[(2 * t + 1) * kRS];
    if constexpr (std::is_same<T, __half>::value) {
      q[0] = and_or<0x00FF00FFu, MAG>(__byte_perm(w0, w1, 0x0400));
      q[1] = and_or<0x00FF00FFu, MAG>(__byte_perm(w0, w1, 0x0501));
      q[2] = and_or<0x00FF00FFu, MAG>(__byte_perm(w0, w1, 0x0602));
      q[3] = and_or<0x00FF00FFu, MAG>(__byte_perm(w0, w1, 0x0703));
    } else {   // codes up to 255 do not fit bf16's magic (q + 128 is exact only below 128): through float32
      q[0] = frag::bf16x2_of_bytes(__byte_perm(w0, w1, 0x40), 0x5440, 0x5441);
      q[1] = frag::bf16x2_of_bytes(__byte_perm(w0, w1, 0x51), 0x5440, 0x5441);
      q[2] = frag::bf16x2_of_bytes(__byte_perm(w0, w1, 0x62), 0x5440, 0x5441);
      q[3] = frag::bf16x2_of_bytes(__byte_perm(w0, w1, 0x73), 0x5440, 0x5441);
    }
  } else if constexpr (B == 4) {
    // word t holds rows 8t..8t+7: nibble R and nibble R+4 are already 16 bits apart
    const uint32_t w = wc[t * kRS];
    q[0] = and_or<0x000F000Fu, MAG>(w);
    q[1] = and_or<0x000F000Fu, MAG>(w >> 4);
    q[2] = and_or<0x000F000Fu, MAG>(w >> 8);
    q[3] = and_or<0x000F000Fu, MAG>(w >> 12);
  } else {
    // the lane's 8b bits start at bit 8tb of the chunk's stream; lo: rows 8t..8t+3 (4b bits), hi: rows 8t+4..8t+7
    const int bit = t * 8 * B, wi = bit >> 5, off = bit & 31;
    const uint32_t w0 = wc[wi * kRS];
    uint32_t lo, hi;
    if constexpr (B == 2) {
      lo = w0 >> off;                      // (16 bits, off 0 or 16)
      hi = lo >> 8;
    } else if constexpr (B == 3) {
      // (24 bits; the lane with off 8 ends inside its word: the next one, past the chunk's 3 words, is not read)
      const uint32_t w1 = wc[min(wi + 1, 2) * kRS];
      lo = __funnelshift_r(w0, w1, off);
      hi = lo >> 12;
    } else {   // 5 or 6: 40 or 48 bits over two words
      const uint64_t v = ((uint64_t)wc[(wi + 1) * kRS] << 32 | w0) >> off;
      lo = (uint32_t)v;
      hi = (uint32_t)(v >> (4 * B));
    }
    // y0: lo bits 0..15 | hi bits 0..15 << 16; y1: the same from bit 8 (for codes that end past bit 16)
    const uint32_t y0 = __byte_perm(lo, hi, 0x5410), y1 = __byte_perm(lo, hi, 0x6521);
    constexpr uint32_t M2 = ((1u << B) - 1u) * 0x10001u;
    q[0] = and_or<M2, MAG>(y0);
    q[1] = and_or<M2, MAG>(y0 >> B);
    q[2] = and_or<M2, MAG>(3 * B <= 16 ? y0 >> (2 * B) : y1 >> (2 * B - 8));
    q[3] = and_or<M2, MAG>(4 * B <= 16 ? y0 >> (3 * B) : y1 >> (3 * B - 8));
  }
}

// q (code pairs as decode_codes left them) -> the weights q * s - z in T, one rounding each.
template <int B, typename T>
__device__ __forceinline__ void dequant_pairs(uint32_t (&q)[4], float s, float z) {
  using P = typename V2<T>::t;
  const P s2 = V2<T>::dup(from_f32<T>(s)), nz2 = V2<T>::dup(from_f32<T>(-z));
  const P mag = V2<T>::from_bits(Magic<T>::v);
  constexpr bool plain = std::is_same<T, __nv_bfloat16>::value && B == 8;   // the codes themselves, no magic
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    P v = V2<T>::from_bits(q[r]);
    if constexpr (!plain) v = __hsub2(v, mag);   // exact: q + MAGIC - MAGIC
    v = __hfma2(v, s2, nz2);
    q[r] = *reinterpret_cast<const uint32_t*>(&v);
  }
}

// One chunk of a warp's 32 columns (c0 = the lane's first column in the block) against the chunk's NT row tiles.
template <int B, typename T, int NT>
__device__ __forceinline__ void chunk_mma(const uint32_t* w, const float* sz, uint32_t xrow, int c0, int t,
                                          float (&acc)[2][NT][4]) {
  uint32_t a[2][2][4];   // [16-column tile][k16 step][A register]
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int cl = c0 + 16 * h, chi = cl + 8;
    uint32_t lo[4], hi[4];
    decode_codes<B, T>(w + cl, t, lo);
    decode_codes<B, T>(w + chi, t, hi);
    dequant_pairs<B, T>(lo, sz[cl], sz[kBN + cl]);
    dequant_pairs<B, T>(hi, sz[chi], sz[kBN + chi]);
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      a[h][s][0] = lo[2 * s];       // column g, k 2t..2t+1
      a[h][s][1] = hi[2 * s];       // column g + 8
      a[h][s][2] = lo[2 * s + 1];   // column g, k 2t+8..2t+9
      a[h][s][3] = hi[2 * s + 1];
    }
  }
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    uint32_t b[4];   // matrices: xp rows 0-7, 8-15 (step 0), 16-23, 24-31 (step 1); lane L addresses row L
    ldsm_x4_trans(xrow + 16 * n, b);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      frag::mma<T>(acc[h][n], a[h][0], b[0], b[1]);
      frag::mma<T>(acc[h][n], a[h][1], b[2], b[3]);
    }
  }
}

// (registers: 126-128 at NT = 1-2, 158 at 4, 188 at 6, 220 at 8 when unbounded. Up to 32 rows the bound of two
// blocks per multiprocessor holds NT = 3-4 to 128 with a spill of a few bytes, outside the chunk loop: two blocks
// hide each other's barrier and copy waits, and on an H200 that made the 24- and 32-row forms 1.5-1.7x faster than
// one block with the whole shared memory. 48 and 64 rows keep one block)
template <typename T, int NT>
__global__ void __launch_bounds__(kThreads, NT >= 6 ? 1 : 2) mbwq_skinny_kernel(const MbwqSkinnyArgs p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using namespace frag;
  constexpr int MP = 8 * NT;                        // rows of x per xp row (zero past M)
  constexpr int XS = 16 * ((NT & 1) ? NT : NT + 1); // bytes between the 32 xp rows of a slot: an odd number of
                                                    // 16-byte units, so ldmatrix's 8 rows hit distinct banks
  constexpr int NACC = 2 * NT * 4;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int s_bits[kMaxStages][kKG];           // width of each slot's chunks (0: none)

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int strip = warp % kStrips, kg = warp / kStrips;
  const int g = lane >> 2, t = lane & 3;
  const int S = p.stages;
  const int wbytes = p.sr * kRS * 4;
  const T* X = static_cast<const T*>(p.x);
  T* xp = static_cast<T*>(p.xp);
  T* out = static_cast<T*>(p.out);

  int n0 = 0, sp = 0, cbeg = 0, cend = 0, nst = 0;
  auto set_tile = [&](int tile) {
    n0 = (tile % p.colblocks) * kBN;
    sp = tile / p.colblocks;
    cbeg = sp * p.cps;
    cend = min(p.nchunks, cbeg + p.cps);
    nst = (cend - cbeg + kKG - 1) / kKG;
  };
  // weight rows and statistics of stage i into slot
  auto issue_w = [&](int i, int slot) {
#pragma unroll
    for (int kgi = 0; kgi < kKG; ++kgi) {
      const int c = cbeg + i * kKG + kgi;
      SkChunk ch;
      const bool ok = c < cend && sk_chunk(p, c, ch);
      if (tid == 0) s_bits[slot][kgi] = ok ? ch.bits : 0;
      if (!ok) continue;
      uint8_t* sub = smem + slot * p.stage_bytes + kgi * p.chunk_bytes;
      const uint32_t w_s = smem_u32(sub), sz_s = smem_u32(sub + wbytes);
      const int32_t* wsrc = p.qweight + ch.w0 * p.N + n0;
      const int64_t goff = (int64_t)ch.group * p.N + n0;
      if (p.vec) {
        // rows past the chunk's words (a partial chunk) are zero-filled: never read from qweight
        for (int e = tid; e < ch.bits * (kBN / 4); e += kThreads) {
          const int r = e / (kBN / 4), v = e % (kBN / 4);
          const bool in = r < ch.nwords && n0 + 4 * v < p.N;
          cp_async16(w_s + (r * kRS + 4 * v) * 4, in ? (const void*)(wsrc + (int64_t)r * p.N + 4 * v) : p.qweight,
                     in ? 16 : 0);
        }
        for (int e = tid; e < 2 * (kBN / 4); e += kThreads) {
          const int which = e / (kBN / 4), v = e % (kBN / 4);
          const bool in = n0 + 4 * v < p.N;
          const float* src = (which ? p.zeros : p.scales) + goff + 4 * v;
          cp_async16(sz_s + (which * kBN + 4 * v) * 4, in ? (const void*)src : p.scales, in ? 16 : 0);
        }
      } else {   // rows of N words not 16-byte aligned: word copies
        for (int e = tid; e < ch.bits * kBN; e += kThreads) {
          const int r = e / kBN, cc = e % kBN;
          const bool in = r < ch.nwords && n0 + cc < p.N;
          cp_async4(w_s + (r * kRS + cc) * 4, in ? (const void*)(wsrc + (int64_t)r * p.N + cc) : p.qweight,
                    in ? 4 : 0);
        }
        for (int e = tid; e < 2 * kBN; e += kThreads) {
          const int which = e / kBN, cc = e % kBN;
          const bool in = n0 + cc < p.N;
          const float* src = (which ? p.zeros : p.scales) + goff + cc;
          cp_async4(sz_s + (which * kBN + cc) * 4, in ? (const void*)src : p.scales, in ? 4 : 0);
        }
      }
    }
  };
  // the 32 xp rows of stage i's chunks into slot (after the barrier: phase 1 writes xp)
  auto issue_x = [&](int i, int slot) {
#pragma unroll
    for (int kgi = 0; kgi < kKG; ++kgi) {
      const int c = cbeg + i * kKG + kgi;
      SkChunk ch;
      if (c >= cend || !sk_chunk(p, c, ch)) continue;
      const uint32_t x_s = smem_u32(smem + slot * p.stage_bytes + kgi * p.chunk_bytes + wbytes + 2 * kBN * 4);
      const T* src = xp + (int64_t)c * 32 * MP;
      for (int e = tid; e < 32 * NT; e += kThreads) {
        const int kappa = e / NT, v = e % NT;
        const bool in = row_of_slot(kappa) < ch.rows;
        cp_async16(x_s + kappa * XS + 16 * v, in ? (const void*)(src + kappa * MP + 8 * v) : p.xp, in ? 16 : 0);
      }
    }
  };

  // the split counters of this launch (in its scratch): zeroed before the grid barrier, counted only after it
  if (p.splits > 1 && blockIdx.x == 0)
    for (int i = tid; i < p.colblocks; i += kThreads) p.counters[i] = 0;

  int tile = blockIdx.x;
  if (tile < p.tiles) {   // (always: the grid has at most one block per tile)
    set_tile(tile);
    for (int i = 0; i < S - 1; ++i) {
      if (i < nst) issue_w(i, i);
      cp_commit();
    }
  }

  // ---- phase 1: xp[xslot[k]] = x[:, k] * cscale[k] in T, MP values per row (zero past M)
  {
    constexpr int LD1 = MP + 2;   // an odd number of words per row: the transposing stores hit distinct banks
    T* tx = reinterpret_cast<T*>(smem + p.ring_bytes);
    const uint32_t* tx32 = reinterpret_cast<const uint32_t*>(tx);
    uint32_t* xp32 = reinterpret_cast<uint32_t*>(xp);
    const int64_t nslots = (int64_t)p.nchunks * 32;
    const int ktiles = (p.K + kXT - 1) / kXT;
    for (int kt = blockIdx.x; kt < ktiles; kt += gridDim.x) {
      const int k0 = kt * kXT;
      for (int e = tid; e < MP * kXT; e += kThreads) {
        const int m = e / kXT, kk = e % kXT, k = k0 + kk;
        float v = 0.0f;
        if (m < p.M && k < p.K) {
          v = to_f32(X[(int64_t)m * p.ldx + k]);
          if (p.cscale != nullptr) v *= __ldg(p.cscale + k);
        }
        tx[kk * LD1 + m] = from_f32<T>(v);
      }
      __syncthreads();
      for (int e = tid; e < kXT * (MP / 2); e += kThreads) {
        const int kk = e / (MP / 2), w = e % (MP / 2), k = k0 + kk;
        if (k >= p.K) continue;
        const int dst = __ldg(p.xslot + k);
        if (dst >= 0 && dst < nslots) xp32[(int64_t)dst * (MP / 2) + w] = tx32[kk * (LD1 / 2) + w];
      }
      __syncthreads();
    }
  }
  cg::this_grid().sync();

  // ---- phase 2
  float acc[2][NT][4];
  float* accf = &acc[0][0][0];
  for (; tile < p.tiles; tile += gridDim.x) {
    if (tile != (int)blockIdx.x) {
      set_tile(tile);
      for (int i = 0; i < S - 1; ++i) {
        if (i < nst) issue_w(i, i);
        cp_commit();
      }
    }
    for (int i = 0; i < S - 1; ++i) {
      if (i < nst) issue_x(i, i);
      cp_commit();
    }
#pragma unroll
    for (int i = 0; i < NACC; ++i) accf[i] = 0.0f;

    const int c0 = strip * 32 + g;
    for (int i = 0; i < nst; ++i) {
      // groups issued after stage i's: S - 2 (the prologue's later xp groups and the loop's, one per step)
      cp_wait_n(S - 2);
      __syncthreads();   // stage i visible to all; every warp done with the slot refilled now
      const int nx = i + S - 1;
      if (nx < nst) {
        issue_w(nx, nx % S);
        issue_x(nx, nx % S);
      }
      cp_commit();
      const int slot = i % S;
      const int bits = s_bits[slot][kg];
      if (bits == 0) continue;
      const uint8_t* sub = smem + slot * p.stage_bytes + kg * p.chunk_bytes;
      const uint32_t* w = reinterpret_cast<const uint32_t*>(sub);
      const float* sz = reinterpret_cast<const float*>(sub + wbytes);
      const uint32_t xrow = smem_u32(sub + wbytes + 2 * kBN * 4) + lane * XS;
      switch (bits) {
        case 2: chunk_mma<2, T, NT>(w, sz, xrow, c0, t, acc); break;
        case 3: chunk_mma<3, T, NT>(w, sz, xrow, c0, t, acc); break;
        case 4: chunk_mma<4, T, NT>(w, sz, xrow, c0, t, acc); break;
        case 5: chunk_mma<5, T, NT>(w, sz, xrow, c0, t, acc); break;
        case 6: chunk_mma<6, T, NT>(w, sz, xrow, c0, t, acc); break;
        default: chunk_mma<8, T, NT>(w, sz, xrow, c0, t, acc); break;
      }
    }
    cp_wait<0>();
    __syncthreads();   // the ring is free: the k-groups' sums meet in it

    float* red = reinterpret_cast<float*>(smem);
    if (kg > 0) {
#pragma unroll
      for (int i = 0; i < NACC; ++i) red[(((kg - 1) * kStrips + strip) * NACC + i) * 32 + lane] = accf[i];
    }
    __syncthreads();
    if (kg == 0) {
#pragma unroll
      for (int k2 = 1; k2 < kKG; ++k2)
#pragma unroll
        for (int i = 0; i < NACC; ++i) accf[i] += red[(((k2 - 1) * kStrips + strip) * NACC + i) * 32 + lane];
    }

    // C fragment e of tile (h, n): column c0 + 16h + 8(e >> 1), row 8n + 2t + (e & 1)
    if (p.splits == 1) {
      if (kg == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = n0 + c0 + 16 * h + 8 * (e >> 1);
            if (col >= p.N) continue;
            const float b = p.bias != nullptr ? load_f32(p.bias, p.bias_dtype, col) : 0.0f;
#pragma unroll
            for (int n = 0; n < NT; ++n) {
              const int m = 8 * n + 2 * t + (e & 1);
              if (m < p.M) out[(int64_t)m * p.N + col] = from_f32<T>(acc[h][n][e] + b);
            }
          }
      }
    } else {
      if (kg == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = n0 + c0 + 16 * h + 8 * (e >> 1);
            if (col >= p.N) continue;
#pragma unroll
            for (int n = 0; n < NT; ++n) {
              const int m = 8 * n + 2 * t + (e & 1);
              if (m < p.M) p.ws[((int64_t)sp * p.M + m) * p.N + col] = acc[h][n][e];
            }
          }
      }
      __threadfence();
      __syncthreads();
      const int cb = n0 / kBN;
      int* arrive = p.counters + cb;
      if (tid == 0) {
        atomicAdd(arrive, 1);
        // every split of this column block is resident (plan: tiles <= blocks of the cooperative grid)
        while (ld_acquire(arrive) < p.splits) __nanosleep(64);
      }
      __syncthreads();
      // this split's share of the column block's outputs, each the splits' partials summed in split order
      const int ncols = min(kBN, p.N - n0);
      const int total = p.M * ncols, per = (total + p.splits - 1) / p.splits;
      const int e0 = sp * per, e1 = min(total, e0 + per);
      const int64_t stride = (int64_t)p.M * p.N;
      for (int e = e0 + tid; e < e1; e += kThreads) {
        const int m = e / ncols, col = n0 + e % ncols;
        const float* src = p.ws + (int64_t)m * p.N + col;
        float sum = 0.0f;
        int s = 0;
        for (; s + 4 <= p.splits; s += 4) {
          float v4[4];
#pragma unroll
          for (int u = 0; u < 4; ++u) v4[u] = __ldcg(src + (s + u) * stride);
#pragma unroll
          for (int u = 0; u < 4; ++u) sum += v4[u];
        }
        for (; s < p.splits; ++s) sum += __ldcg(src + s * stride);
        if (p.bias != nullptr) sum += load_f32(p.bias, p.bias_dtype, col);
        out[(int64_t)m * p.N + col] = from_f32<T>(sum);
      }
      __syncthreads();   // (redundant with the next one; without it ptxas spills 8 bytes at 2 row tiles on sm_80)
    }
    __syncthreads();   // before the next tile's copies overwrite the ring
  }
#endif
}

using SkinnyKernel = void (*)(MbwqSkinnyArgs);

SkinnyKernel kernel_for(int x_dtype, int nt) {
  if (x_dtype == kF16) {
    switch (nt) {
      case 1: return mbwq_skinny_kernel<__half, 1>;
      case 2: return mbwq_skinny_kernel<__half, 2>;
      case 3: return mbwq_skinny_kernel<__half, 3>;
      case 4: return mbwq_skinny_kernel<__half, 4>;
      case 6: return mbwq_skinny_kernel<__half, 6>;
      case 8: return mbwq_skinny_kernel<__half, 8>;
    }
  } else if (x_dtype == kBF16) {
    switch (nt) {
      case 1: return mbwq_skinny_kernel<__nv_bfloat16, 1>;
      case 2: return mbwq_skinny_kernel<__nv_bfloat16, 2>;
      case 3: return mbwq_skinny_kernel<__nv_bfloat16, 3>;
      case 4: return mbwq_skinny_kernel<__nv_bfloat16, 4>;
      case 6: return mbwq_skinny_kernel<__nv_bfloat16, 6>;
      case 8: return mbwq_skinny_kernel<__nv_bfloat16, 8>;
    }
  }
  return nullptr;
}

int row_tiles(int m) { return m <= 8 ? 1 : m <= 16 ? 2 : m <= 24 ? 3 : m <= 32 ? 4 : m <= 48 ? 6 : 8; }

// Sets the shared-memory geometry of p for `stages`; returns the dynamic shared memory.
int geometry(MbwqSkinnyArgs& p, int stages) {
  const int nt = p.nt, xs = 16 * ((nt & 1) ? nt : nt + 1);
  p.stages = stages;
  p.chunk_bytes = p.sr * kRS * 4 + 2 * kBN * 4 + 32 * xs;
  p.stage_bytes = kKG * p.chunk_bytes;
  const int red = (kKG - 1) * kStrips * 32 * (2 * nt * 4) * 4;   // the other k-groups' sums (over the ring)
  p.ring_bytes = std::max(stages * p.stage_bytes, red);
  const int scratch = (kXT * (8 * nt + 2) * 2 + 15) / 16 * 16;     // phase 1's transposing tile
  return p.ring_bytes + scratch;
}

}  // namespace

int mbwq_skinny_plan(MbwqSkinnyArgs& p, int x_dtype, int num_sms, int smem_limit, int splits_force,
                     int stages_force) {
  p.nt = row_tiles(p.M);
  p.colblocks = ceil_div(p.N, kBN);
  const SkinnyKernel k = kernel_for(x_dtype, p.nt);
  if (k == nullptr || p.sr < 2 || p.sr > 8) return -1;
  // the opt-in limit covers static + dynamic shared memory (the kernel's s_bits)
  smem_limit -= (int)sizeof(int) * kMaxStages * kKG;
  // the deepest ring (up to 8 stages, at least 3) within a budget that leaves room for two blocks per multiprocessor
  // where their registers allow it (up to 32 rows; H100 / H200: 228 KiB per SM), else the device's whole limit (one
  // block per multiprocessor: the ring's depth is all the bytes in flight); a forced depth as far as the device allows
  int stages = stages_force > 0 ? std::min(std::max(stages_force, 2), kMaxStages) : kMaxStages;
  const int budget = stages_force > 0 || p.nt >= 6 ? smem_limit : std::min(smem_limit, 110 * 1024);
  int smem = geometry(p, stages);
  while (stages > (stages_force > 0 ? 2 : 3) && smem > budget) smem = geometry(p, --stages);
  if (smem > smem_limit) return -1;
  if (set_smem_limit(reinterpret_cast<const void*>(k), smem) != cudaSuccess) return -1;
  int bps = 0;
  if (blocks_per_sm(&bps, reinterpret_cast<const void*>(k), kThreads, smem) != cudaSuccess || bps < 1) return -1;
  const int64_t capacity = (int64_t)bps * num_sms;
  int s;
  if (splits_force > 0) {
    s = splits_force;
  } else {
    // about as many tiles as blocks are resident (at most two per multiprocessor: 16 warps), at least 8 chunks
    // (4 ring steps) per split: shorter splits cost more in partials and prologues than they gain
    s = std::max(1, num_sms * std::min(bps, 2) / p.colblocks);
    s = std::min(s, std::max(1, p.nchunks / 8));
  }
  // more than one split needs every tile resident at once (the splits of a column block wait for each other)
  s = (int)std::min<int64_t>(s, std::max<int64_t>(1, capacity / p.colblocks));
  s = std::max(1, std::min(s, p.nchunks));
  p.cps = ceil_div(p.nchunks, s);
  p.splits = ceil_div(p.nchunks, p.cps);   // no empty split
  const int64_t tiles = (int64_t)p.colblocks * p.splits;
  if (tiles > (1ll << 30)) return -1;
  p.tiles = (int)tiles;
  p.grid = p.splits > 1 ? p.tiles : (int)std::min<int64_t>(tiles, capacity);
  return smem;
}

cudaError_t launch_mbwq_skinny(const MbwqSkinnyArgs& p, int x_dtype, int smem, cudaStream_t st) {
  const SkinnyKernel k = kernel_for(x_dtype, p.nt);
  if (k == nullptr || p.grid < 1) return cudaErrorInvalidValue;
  cudaError_t e = set_smem_limit(reinterpret_cast<const void*>(k), smem);
  if (e != cudaSuccess) return e;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)p.grid);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = (size_t)smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;   // every block resident: the grid barrier and the splits' waits
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  e = cudaLaunchKernelEx(&cfg, k, p);
  if (e != cudaSuccess) return e;
  return cudaGetLastError();
}

}  // namespace bie
