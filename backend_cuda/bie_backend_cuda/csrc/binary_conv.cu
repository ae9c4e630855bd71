// Direct binary conv2d on the 1-bit tensor cores (implicit GEMM, sm_80+), for groups == 1.
//
// out[n, o, ho, wo] = sum over (c, r, s) of sgn(xpad[n, c, ho*SH + r*DH, wo*SW + s*DW]) * W[o, c, r, s]
// with xpad = x padded by the pad value (-1, +1 or 0), then float32(dot) * scale + bias in the output dtype.
//
// Two kernels, no im2col buffer:
//  1. packing: x (float32/float16/bfloat16/int8, any strides) -> the sign words of the *padded* input,
//     [N][Hp][Wp][CW] uint32 (bit b of word cw: channel 32*cw + b, 1 = +1; bits past C are 0), the padding ring
//     holding the pad value's bits (pad 0: 0 bits). One read of x, 1/16 of it written back (bf16). Three
//     variants by layout: contiguous channel planes (NCHW: cp.async runs into shared memory, then ballots),
//     contiguous channels (channels_last: a warp ballot per word), any strides (a thread per word).
//  2. bconv_mma: a GEMM whose rows are output pixels and columns output channels; K runs over (tap, channel
//     word). Row p's K word q sits at packed[base(p) + delta[q]] (delta: a per-word table in shared memory); the
//     words a tile's windows read are one contiguous range of packed, staged in shared memory where it fits and
//     the tile asks for it (else read through L1), the weights copied in chunks beside it, so the A fragments of
//     mma.m16n8k256.and.popc are gathered with no im2col buffer (helpers shared with binary.cu in
//     b1_common.cuh). The ±1 dot product comes from AND counts (XOR+popc is emulated on sm_90):
//         dot = 4 popc(a & w) - 2 popc(a) - 2 popc(w over the valid taps) + K_valid
//     popc(a) of a window comes from one more MMA against an all-ones column; with pad 0 the taps that fall in the
//     padding (0 bits) count neither in popc(w) (a per-tap table of weight popcounts) nor in K_valid. The tile is
//     scaled, biased and staged in shared memory as [channel][pixel], then written as NCHW rows.
#include <atomic>
#include <type_traits>

#include "b1_common.cuh"
#include "common.cuh"

namespace bie {
namespace {

constexpr int kConvThreads = 128;

// ------------------------------------------------------------------ packing

__device__ __forceinline__ uint32_t* packed_word(const BinConvArgs& p, int n, int hq, int wq, int cw) {
  return p.packed + ((int64_t)((n * p.Hp + hq) * p.Wp + wq)) * p.CW + cw;
}

// The padding ring of the packed input: `ring` pixels per image, thread per (image, ring pixel, word).
// (32-bit indices throughout: N * Hp * Wp * CW < 2^31 - 1024 is checked on the host; 64-bit division is a
// subroutine call)
__device__ __forceinline__ void write_ring(const BinConvArgs& p, int i) {
  const int ring = p.Hp * p.Wp - p.H * p.W;
  const int cw = i % p.CW;
  const int t = i / p.CW;
  const int n = t / ring;
  int u = t - n * ring, hq, wq;
  if (u < 2 * p.PH * p.Wp) {                 // the PH rows above and below
    hq = u / p.Wp;
    wq = u - hq * p.Wp;
    if (hq >= p.PH) hq += p.H;
  } else {                                   // the PW columns left and right of the H image rows
    u -= 2 * p.PH * p.Wp;
    hq = p.PH + u / (2 * p.PW);
    wq = u % (2 * p.PW);
    if (wq >= p.PW) wq += p.W;
  }
  const int nb = min(32, p.C - cw * 32);
  *packed_word(p, n, hq, wq, cw) = p.pad_mode == 1 ? (nb == 32 ? ~0u : ((1u << nb) - 1u)) : 0u;
}

// Plane mode (each channel's H x W plane contiguous: NCHW and its channel slices). An item is (image, word, run
// of 256 pixels): its 32 channels' runs are copied into shared memory with cp.async (every load in flight at
// once, no registers held: a register load-then-use loop is scheduled a few loads at a time and waits a memory
// latency per batch). Warp w then packs pixels 32w..32w+31 with ballots: one per channel (lane = pixel; lane c
// keeps channel c's 32 pixel bits), then 32 more to transpose those 32 x 32 bits (lane j keeps pixel j's word):
// a few instructions per 32 signs. Blocks loop over items with two buffers, so the next item's copies are in
// flight while this one is packed. Each channel's run is copied from the E-byte boundary at or below its start
// (E = 16, 8 or 4: the largest the channel and image strides and the pointer keep aligned), the last copy cut at
// the run's end. Blocks past the item loop (blockIdx.x >= loop_blocks) write the padding ring.
constexpr int kPackRun = 256;
template <typename T>
constexpr int pack_row_bytes() { return kPackRun * sizeof(T) + 16; }

template <typename T>
__global__ void __launch_bounds__(256) bconv_pack_plane_kernel(BinConvArgs p, int loop_blocks, int runs, int E) {
  constexpr int ROW = pack_row_bytes<T>();
  extern __shared__ __align__(16) unsigned char s_x[];   // [2][32][ROW]
  __shared__ int s_mis[2][32];                           // each channel's offset from its copy's start
  if ((int)blockIdx.x >= loop_blocks) {
    const int ring_words = p.N * (p.Hp * p.Wp - p.H * p.W) * p.CW;
    const int r = ((int)blockIdx.x - loop_blocks) * 256 + threadIdx.x;
    if (r < ring_words) write_ring(p, r);
    return;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int hw = p.H * p.W;
  const int items = runs * p.CW * p.N;
  const int64_t csb = p.sc * (int64_t)sizeof(T);   // channel stride, bytes
  auto issue = [&](int item, int stage) {
    const int run = item % runs, t = item / runs;
    const int cw = t % p.CW, n = t / p.CW;
    const int npx = min(kPackRun, hw - run * kPackRun);
    const int nb = min(32, p.C - cw * 32);
    const unsigned char* x0 = static_cast<const unsigned char*>(p.x) +
                              ((int64_t)n * p.sn + (int64_t)cw * 32 * p.sc + run * kPackRun) * (int64_t)sizeof(T);
    const int chunks = (npx * (int)sizeof(T) + 2 * E - 2) / E;   // the run from its aligned-down start
    unsigned char* buf = s_x + stage * 32 * ROW;
    for (int c = warp; c < nb; c += 8) {
      const unsigned char* start = x0 + c * csb;
      const uintptr_t a0 = reinterpret_cast<uintptr_t>(start) & ~(uintptr_t)(E - 1);
      const uintptr_t end = reinterpret_cast<uintptr_t>(start) + (uintptr_t)npx * sizeof(T);
      if (lane == 0) s_mis[stage][c] = (int)(reinterpret_cast<uintptr_t>(start) - a0);
      for (int k = lane; k < chunks; k += 32) {
        const uintptr_t src = a0 + (uintptr_t)k * E;
        const int bytes = src >= end ? 0 : (end - src < (uintptr_t)E ? (int)(end - src) : E);
        const uint32_t dst = (uint32_t)__cvta_generic_to_shared(buf + c * ROW + k * E);
        const void* from = reinterpret_cast<const void*>(bytes ? src : reinterpret_cast<uintptr_t>(start));
        if (E == 16)   // .cg: streamed once, not kept in L1
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(from), "r"(bytes));
        else if (E == 8)
          asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(from), "r"(bytes));
        else
          asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(from), "r"(bytes));
      }
    }
    asm volatile("cp.async.commit_group;\n" ::);
  };
  int item = blockIdx.x;
  if (item < items) issue(item, 0);
  for (int k = 0; item < items; item += loop_blocks, ++k) {
    const int stage = k & 1;
    const int next = item + loop_blocks;
    if (next < items) {
      issue(next, stage ^ 1);
      asm volatile("cp.async.wait_group 1;\n" ::);
    } else {
      asm volatile("cp.async.wait_group 0;\n" ::);
    }
    __syncthreads();
    const int run = item % runs, t = item / runs;
    const int cw = t % p.CW, n = t / p.CW;
    const int npx = min(kPackRun, hw - run * kPackRun);
    const int nb = min(32, p.C - cw * 32);
    const int px = warp * 32 + lane;
    if (warp * 32 < npx) {   // warp-uniform
      const unsigned char* buf = s_x + stage * 32 * ROW + px * (int)sizeof(T);
      uint32_t mask = 0;     // lane c: channel c's bits of the warp's 32 pixels
#pragma unroll 8
      for (int c = 0; c < nb; ++c) {
        const T v = *reinterpret_cast<const T*>(buf + c * ROW + s_mis[stage][c]);
        const uint32_t m = __ballot_sync(0xffffffffu, nonneg(v));
        if (lane == c) mask = m;
      }
      uint32_t word = 0;     // lane j: pixel j's word (bit c: channel c)
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const uint32_t m = __ballot_sync(0xffffffffu, (mask >> j) & 1u);
        if (lane == j) word = m;
      }
      if (px < npx) {
        const int pix = run * kPackRun + px;
        const int h = pix / p.W, w = pix - h * p.W;
        *packed_word(p, n, h + p.PH, w + p.PW, cw) = word;
      }
    }
    __syncthreads();   // this buffer is refilled two items on
  }
}

// Channel mode (channels contiguous: channels_last and its views): a warp packs 32 consecutive (pixel, word)
// pairs; for each, its lanes read 32 consecutive channels and one ballot makes the word, kept by lane j.
// Threads past the words write the padding ring.
template <typename T>
__global__ void __launch_bounds__(256) bconv_pack_channels_kernel(BinConvArgs p, int words) {
  const int lane = threadIdx.x & 31;
  const int i0 = (blockIdx.x * 256 + threadIdx.x) & ~31;   // this warp's first word
  if (i0 >= words) {
    const int ring_words = p.N * (p.Hp * p.Wp - p.H * p.W) * p.CW;
    const int r = i0 - (words + 31) / 32 * 32 + lane;
    if (r >= 0 && r < ring_words) write_ring(p, r);
    return;
  }
  // lane l locates word i0 + l once (the divisions), the warp then walks the 32 words with shuffles:
  // 32 loads in flight together, then 32 ballots (word j's ballot is kept by lane j)
  const int hw = p.H * p.W;
  const int i = min(i0 + lane, words - 1);
  const int cw = i % p.CW, pix = i / p.CW;
  const int n = pix / hw, rem = pix - n * hw;
  const int h = rem / p.W, w = rem - h * p.W;
  const int64_t off = n * p.sn + h * p.sh + w * p.sw + cw * 32;   // channel stride 1
  const int nbc = min(32, p.C - cw * 32);
  const T* x = static_cast<const T*>(p.x);
  const T* src[32];   // every address first (shuffles), then every load
#pragma unroll
  for (int j = 0; j < 32; ++j)
    src[j] = x + __shfl_sync(0xffffffffu, off, j) + min(lane, __shfl_sync(0xffffffffu, nbc, j) - 1);
  T v[32];
#pragma unroll
  for (int j = 0; j < 32; ++j) v[j] = __ldg(src[j]);
  uint32_t mine = 0;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const int nbj = __shfl_sync(0xffffffffu, nbc, j);
    const uint32_t word = __ballot_sync(0xffffffffu, lane < nbj && nonneg(v[j]));
    if (lane == j) mine = word;
  }
  if (i0 + lane < words) *packed_word(p, n, h + p.PH, w + p.PW, cw) = mine;
}

// Any strides: thread per (padded pixel, word), 32 scalar loads; the ring included.
template <typename T>
__global__ void __launch_bounds__(256) bconv_pack_any_kernel(BinConvArgs p) {
  const int i = blockIdx.x * 256 + threadIdx.x;
  if (i >= p.N * p.Hp * p.Wp * p.CW) return;
  const int cw = i % p.CW;
  const int pix = i / p.CW;
  const int wq = pix % p.Wp, t = pix / p.Wp;
  const int hq = t % p.Hp, n = t / p.Hp;
  const int h = hq - p.PH, w = wq - p.PW;
  const int nb = min(32, p.C - cw * 32);
  uint32_t word = 0;
  if (h >= 0 && h < p.H && w >= 0 && w < p.W) {
    const T* xc = static_cast<const T*>(p.x) + n * p.sn + h * p.sh + w * p.sw + (int64_t)cw * 32 * p.sc;
    T v[32];
#pragma unroll
    for (int b = 0; b < 32; ++b) v[b] = xc[min(b, nb - 1) * p.sc];
#pragma unroll
    for (int b = 0; b < 32; ++b) word |= (uint32_t)nonneg(v[b]) << b;
    word &= nb == 32 ? ~0u : ((1u << nb) - 1u);
  } else if (p.pad_mode == 1) {
    word = nb == 32 ? ~0u : ((1u << nb) - 1u);
  }
  p.packed[i] = word;
}

// --------------------------------------------------------------------- conv

// Output pixel -> (image, offset of the pixel in its NCHW plane, first word of its window in packed)
struct PixelAt {
  int n, rem, ho, wo;
};
__device__ __forceinline__ PixelAt pixel_at(const BinConvArgs& p, int pix) {
  PixelAt r;
  r.n = p.div_plane.div(pix);
  r.rem = pix - r.n * (p.Ho * p.Wo);
  r.ho = p.div_wo.div(r.rem);
  r.wo = r.rem - r.ho * p.Wo;
  return r;
}

// V staged values (floats, 16-byte aligned) -> V outputs at dst (aligned to V outputs)
template <typename OutT, int V>
__device__ __forceinline__ void store_vec(OutT* dst, const float* src) {
  if constexpr (sizeof(OutT) == 4) {
#pragma unroll
    for (int i = 0; i < V; i += 4) *reinterpret_cast<float4*>(dst + i) = *reinterpret_cast<const float4*>(src + i);
  } else {
    uint32_t packed[V / 2];
#pragma unroll
    for (int i = 0; i < V; i += 2) {
      const float2 f = *reinterpret_cast<const float2*>(src + i);
      OutT two[2] = {from_f32<OutT>(f.x), from_f32<OutT>(f.y)};
      packed[i / 2] = *reinterpret_cast<const uint32_t*>(two);
    }
    if constexpr (V == 8) *reinterpret_cast<uint4*>(dst) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    else *reinterpret_cast<uint2*>(dst) = make_uint2(packed[0], packed[1]);
  }
}

// The staged tile [channel][pixel] -> NCHW: V consecutive pixels of one channel per thread, V = 8 or 4 where each
// plane is a multiple of V pixels (then a group never straddles two images and its offset is aligned), else 1.
template <typename OutT, int BM, int LDS>
__device__ __forceinline__ void store_rows(const BinConvArgs& p, const float* s_out, const int64_t* s_obase, int o0,
                                           int ncol) {
  OutT* out = static_cast<OutT*>(p.out);
  const int64_t P = (int64_t)p.Ho * p.Wo;
  auto run = [&](auto vec) {
    constexpr int V = decltype(vec)::value;
    constexpr int G = BM / V;   // groups per channel (a power of two, BM % V == 0)
    constexpr int CSTEP = kConvThreads / G > 0 ? kConvThreads / G : 1;
    // a thread keeps its pixel group and walks the channels (one table read, a pointer step per channel)
    for (int e = threadIdx.x; e < G * CSTEP; e += kConvThreads) {
      const int row = (e % G) * V, c0 = e / G;
      const int64_t ob = s_obase[row];
      if (ob < 0 || c0 >= ncol) continue;
      OutT* dst = out + ob + (int64_t)(o0 + c0) * P;
      const float* src = s_out + c0 * LDS + row;
      for (int col = c0; col < ncol; col += CSTEP, dst += CSTEP * P, src += CSTEP * LDS) {
        if constexpr (V == 1) {
          if constexpr (sizeof(OutT) == 4) *dst = *src;
          else *dst = from_f32<OutT>(*src);
        } else {
          store_vec<OutT, V>(dst, src);
        }
      }
    }
  };
  if (P % 8 == 0) run(std::integral_constant<int, 8>{});
  else if (P % 4 == 0) run(std::integral_constant<int, 4>{});
  else run(std::integral_constant<int, 1>{});
}

// Shared memory (dynamic): delta[KWP] | per channel -2 popc(w), scale, bias [BN] each | per pixel its NCHW
// offset (int64), its window's first word, K_valid, its taps in the padding (pad 0) [BM] each | the windows' words
// [span_cap] | union { two weight chunks [BN][kc] words, staging [BN][BM + 4] floats }.
// The weights come in chunks of kc K words (all of K where it is at most 64 words), two buffers in turn: the MMAs
// of a chunk run while the next one is copied (copied ahead of all the MMAs, the weights' transfer from L2 takes a
// large part of a block's time at C = 256 / 512).
// K slots: in each 8-word k step the MMA's slots tig and tig + 4 (thread tig's two words of a row) take words 2 tig
// and 2 tig + 1 (the sum over K does not depend on the order, as long as A and B agree). So a thread's B fragment
// is one 8-byte load, and with an even number of channel words its two A words of a row are adjacent in the window
// (one tap: PAIR), one table read and one address for both. The weight chunk is stored step-major,
// [kc / 8][BN][8 words]: the B fragments of a step sit at compile-time offsets (one address per step), and a half
// warp's 64-bit loads (4 channels x 4 word pairs) cover the 32 banks once. A staging row of BM + 4 floats puts the
// accumulator writes in distinct banks.
// popc(a) of each window comes from the MMA itself: one more n8 tile whose column 0 is all ones over the K words
// (so pad 0's padding, written as 0 bits, and the bits past C never count), read back from lane 4 gid.
__device__ __forceinline__ uint32_t lds_u32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint2 lds_u64(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}


template <int MT, int NT, bool PAIR>
__global__ void __launch_bounds__(kConvThreads) bconv_mma_kernel(BinConvArgs p, int kc) {
  constexpr int BN = NT * 8, BM = MT * 16 * 4, LDS = BM + 4;
  extern __shared__ __align__(16) unsigned char smem[];
  int* s_delta = reinterpret_cast<int*>(smem);
  int* s_wterm = s_delta + p.KWP;
  float* s_scale = reinterpret_cast<float*>(s_wterm + BN);
  float* s_bias = s_scale + BN;
  int64_t* s_obase = reinterpret_cast<int64_t*>(s_bias + BN);   // 8-byte aligned: KWP % 8 == 0, BN % 32 == 0
  int* s_base = reinterpret_cast<int*>(s_obase + BM);
  int* s_kv = s_base + BM;
  uint32_t* s_inv = reinterpret_cast<uint32_t*>(s_kv + BM);
  uint32_t* s_span = s_inv + BM;                                   // 16-byte aligned (BM % 64 == 0)
  uint32_t* s_w = s_span + p.span_cap;                             // span_cap % 4 == 0; chunk buffers 0, 1
  float* s_out = reinterpret_cast<float*>(s_w);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gid = lane >> 2, tig = lane & 3;
  const int npix = p.N * p.Ho * p.Wo;
  const int p0 = blockIdx.x * BM;
  const int o0 = blockIdx.y * BN;

  // a chunk of weight words [BN][kn] into shared memory, step-major (cp.async: no register round trip; rows past O
  // zero-filled); thread i copies 16-byte pieces i, i + 128, ... of the chunk, its (row, piece) stepped without a
  // division
  // (blocks start at different rows, so that the blocks sharing these weights do not all ask L2 for the same lines
  // at once)
  auto load_chunk = [&](uint32_t* buf, int k0, int kn) {
    const int v4 = kn / 4;
    const int drow = kConvThreads / v4, dc = kConvThreads - drow * v4;
    const int rot = (int)(blockIdx.x * 8u) & (BN - 1);
    int r = tid / v4, c4 = tid - r * v4;
    while (r < BN) {
      const int row = (r + rot) & (BN - 1), o = o0 + row;
      cp_async16(buf + ((c4 >> 1) * BN + row) * 8 + (c4 & 1) * 4, p.wp + (int64_t)(o < p.O ? o : 0) * p.KWP + k0 + c4 * 4,
                 o < p.O ? 16 : 0);
      r += drow;
      c4 += dc;
      if (c4 >= v4) {
        c4 -= v4;
        ++r;
      }
    }
  };
  const int nchunks = (p.KWP + kc - 1) / kc;
  load_chunk(s_w, 0, min(kc, p.KWP));
  cp_async_commit();   // group: chunk 0

  // K word -> offset (words) from a window's first word; the padding words past K read word 0 of the window
  // (their weight bits are 0, and so are those of the ones column)
  for (int q = tid; q < p.KWP; q += kConvThreads) {
    int d = 0;
    if (q < p.KWORDS) {
      const int t = q / p.CW, cw = q - t * p.CW;
      const int r = t / p.KW, s = t - r * p.KW;
      d = (r * p.DH * p.Wp + s * p.DW) * p.CW + cw;
    }
    s_delta[q] = d;
  }
  for (int j = tid; j < BN; j += kConvThreads) {
    const int o = o0 + j;
    s_wterm[j] = o < p.O ? -2 * __ldg(p.wpop + o) : 0;
    s_scale[j] = (p.scale && o < p.O) ? load_f32(p.scale, p.scale_dtype, p.scale_stride * o) : 1.f;
    s_bias[j] = (p.bias && o < p.O) ? load_f32(p.bias, p.bias_dtype, o) : 0.f;
  }
  // per pixel of the tile: NCHW offset, first word of its window, and (pad 0) its taps in the padding
  for (int r = tid; r < BM; r += kConvThreads) {
    const int pix = p0 + r;
    int64_t ob = -1;
    uint32_t inv = 0;
    // rows past the last pixel read the last pixel's window (in range of the staged words; never stored)
    const PixelAt a = pixel_at(p, min(pix, npix - 1));
    const int b = ((a.n * p.Hp + a.ho * p.SH) * p.Wp + a.wo * p.SW) * p.CW;
    if (pix < npix) {
      ob = (int64_t)a.n * p.O * (p.Ho * p.Wo) + a.rem;
      if (p.pad_mode == 2) {
        for (int i = 0; i < p.KH; ++i) {
          const int hh = a.ho * p.SH + i * p.DH - p.PH;
          for (int j = 0; j < p.KW; ++j) {
            const int ww = a.wo * p.SW + j * p.DW - p.PW;
            if (hh < 0 || hh >= p.H || ww < 0 || ww >= p.W) inv |= 1u << (i * p.KW + j);
          }
        }
      }
    }
    s_obase[r] = ob;
    s_base[r] = b;
    s_kv[r] = p.K - __popc(inv) * p.C;
    s_inv[r] = inv;
  }
  __syncthreads();

  // The words the tile's windows read form one contiguous range of packed ([N][Hp][Wp][CW] order, windows start
  // in pixel order). Where it fits the block's share (span_cap words, from the host's bound) it is copied to
  // shared memory with the weights, in one memory round trip: the A fragments are then shared-memory loads,
  // instead of a global round trip per k step. Otherwise (span_cap 0; or, never by the bound, a longer range)
  // they are read from global memory (a second copy of the main loop, not executed otherwise).
  int lo = 0;
  bool staged = false;
  {
    const int last = min(BM, npix - p0) - 1;
    lo = s_base[0] & ~3;
    const int hi = s_base[last] + p.max_delta + p.CW;
    const int span = (hi - lo + 3) & ~3;
    if (span <= p.span_cap) {
      const int total = p.N * p.Hp * p.Wp * p.CW;
      for (int c = tid; c < span / 4; c += kConvThreads) {
        const int w0 = lo + 4 * c;
        const int left = total - w0;
        cp_async16(s_span + 4 * c, p.packed + (left > 0 ? w0 : 0), left >= 4 ? 16 : (left > 0 ? 4 * left : 0));
      }
      staged = true;
    } else {
      lo = 0;
    }
  }
  cp_async_commit();   // group: the windows' range (empty where not staged)
  if (nchunks > 1) load_chunk(s_w + BN * kc, kc, min(kc, p.KWP - kc));
  cp_async_commit();   // group: chunk 1 (empty with one chunk)

  // this thread's A rows (pixels warp*16*MT + mt*16 + gid + 8h): word offset of each window's first word
  int base[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) base[mt][h] = s_base[warp * 16 * MT + mt * 16 + gid + 8 * h] - lo;

  int acc[MT][NT][4], pop[MT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) pop[mt][i] = 0;
  }

  const uint32_t span_addr = (uint32_t)__cvta_generic_to_shared(s_span);
  const uint32_t delta_addr = (uint32_t)__cvta_generic_to_shared(s_delta);
  const uint32_t w_addr = (uint32_t)__cvta_generic_to_shared(s_w) + (uint32_t)(gid * 8 + 2 * tig) * 4u;
  auto mainloop = [&](auto staged_c) {
    constexpr bool STAGED = decltype(staged_c)::value;
    // word `off` of the window range (and the next one)
    auto load_word = [&](int off) -> uint32_t {
      if constexpr (STAGED) return lds_u32(span_addr + 4u * (uint32_t)off);
      else return __ldg(p.packed + off);
    };
    for (int c = 0; c < nchunks; ++c) {
      const int k0 = c * kc, kn = min(kc, p.KWP - k0);
      if (c + 1 < nchunks) cp_async_wait<1>();   // chunk c (and the windows) landed; chunk c + 1 may fly
      else cp_async_wait<0>();
      __syncthreads();
      if (c == 0) {
      }
      const uint32_t wb = w_addr + (uint32_t)((c & 1) * BN * kc) * 4u;
      // A fragments of the k step at K word q = k0 + s (this thread: words q + 2 tig, q + 2 tig + 1 of its rows),
      // one step ahead in registers: the next step's loads are in flight during this step's MMAs
      auto load_a = [&](uint32_t (&f)[MT][4], int q) {
        const int qt = q + 2 * tig;
        if constexpr (PAIR) {   // (two 32-bit loads, not one 64-bit: the MMA wants a0..a3 in consecutive registers)
          const int d = (int)lds_u32(delta_addr + 4u * (uint32_t)qt);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            const int r0 = base[mt][0] + d, r1 = base[mt][1] + d;
            f[mt][0] = load_word(r0);
            f[mt][2] = load_word(r0 + 1);
            f[mt][1] = load_word(r1);
            f[mt][3] = load_word(r1 + 1);
          }
        } else {
          const uint2 d = lds_u64(delta_addr + 4u * (uint32_t)qt);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            f[mt][0] = load_word(base[mt][0] + (int)d.x);
            f[mt][1] = load_word(base[mt][1] + (int)d.x);
            f[mt][2] = load_word(base[mt][0] + (int)d.y);
            f[mt][3] = load_word(base[mt][1] + (int)d.y);
          }
        }
      };
      auto step = [&](const uint32_t (&a)[MT][4], int s) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const uint2 b = lds_u64(wb + (uint32_t)(s * BN + nt * 64) * 4u);   // (step s / 8, rows nt * 8 + gid)
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) mma_b1_and(acc[mt][nt], a[mt], b.x, b.y);
        }
        const int qt = k0 + s + 2 * tig;
        const uint32_t o0b = (gid == 0 && qt < p.KWORDS) ? ~0u : 0u;
        const uint32_t o1b = (gid == 0 && qt + 1 < p.KWORDS) ? ~0u : 0u;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) mma_b1_and(pop[mt], a[mt], o0b, o1b);
      };
      // two register sets in turn (no copies between steps)
      uint32_t a0[MT][4], a1[MT][4];
      load_a(a0, k0);
      for (int s = 0; s < kn; s += 16) {
        if (s + 8 < kn) load_a(a1, k0 + s + 8);
        step(a0, s);
        if (s + 8 >= kn) break;
        if (s + 16 < kn) load_a(a0, k0 + s + 16);
        step(a1, s + 8);
      }
      if (c + 2 < nchunks) {
        __syncthreads();   // every warp is done with this buffer
        load_chunk(s_w + (c & 1) * BN * kc, k0 + 2 * kc, min(kc, p.KWP - k0 - 2 * kc));
      }
      cp_async_commit();   // (one group per chunk, empty past the last)
    }
  };
  if (staged) mainloop(std::true_type{});
  else mainloop(std::false_type{});
  __syncthreads();   // the weight chunk's space becomes the output staging tile

  // epilogue: dot = 4 acc + (K_valid - 2 popc(a)) [per pixel] - 2 popc(w over the valid taps) [per channel],
  // then the value, staged as [channel][pixel]
  const bool scaled = p.out_dtype != kI32;
  int rterm[MT][2];
  uint32_t inv_any = 0;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp * 16 * MT + mt * 16 + gid + 8 * h;
      const int popa = __shfl_sync(0xffffffffu, pop[mt][2 * h], lane & ~3);   // column 0: lane 4 gid
      rterm[mt][h] = s_kv[row] - 2 * popa;
      inv_any |= s_inv[row];
    }
  // (the two branch-free variants without padded taps, and the general one: a per-element test of those
  // conditions costs as much as the arithmetic)
  auto stage = [&](auto scaled_c, auto padded_c) {
    constexpr bool SCALED = decltype(scaled_c)::value, PADDED = decltype(padded_c)::value;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int col = nt * 8 + 2 * tig + j;
        const int wterm = s_wterm[col];
        const float sc = s_scale[col], bi = s_bias[col];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = warp * 16 * MT + mt * 16 + gid + 8 * h;
            int dot = 4 * acc[mt][nt][2 * h + j] + rterm[mt][h] + wterm;
            if constexpr (PADDED) {   // pad 0 near the border: the weight bits of the padded taps do not count
              const uint32_t inv = s_inv[row];
              if (inv && o0 + col < p.O)
                for (uint32_t m = inv; m; m &= m - 1)
                  dot += 2 * __ldg(p.wtap + (int64_t)(o0 + col) * (p.KH * p.KW) + (__ffs(m) - 1));
            }
            // float32(dot) * float32(scale) + float32(bias): two roundings, like the reference
            if constexpr (SCALED) s_out[col * LDS + row] = __fadd_rn(__fmul_rn((float)dot, sc), bi);
            else s_out[col * LDS + row] = __int_as_float(dot);
          }
      }
  };
  using T_ = std::true_type;
  using F_ = std::false_type;
  if (inv_any) {
    if (scaled) stage(T_{}, T_{});
    else stage(F_{}, T_{});
  } else {
    if (scaled) stage(T_{}, F_{});
    else stage(F_{}, F_{});
  }
  __syncthreads();

  // NCHW rows: consecutive threads write consecutive pixels of one channel
  const int ncol = min(BN, p.O - o0);
  switch (p.out_dtype) {
    case kI32:   // the dot's bits, as staged
    case kF32: store_rows<float, BM, LDS>(p, s_out, s_obase, o0, ncol); break;
    case kF16: store_rows<__half, BM, LDS>(p, s_out, s_obase, o0, ncol); break;
    default: store_rows<__nv_bfloat16, BM, LDS>(p, s_out, s_obase, o0, ncol); break;
  }
}

}  // namespace

int conv_chunk_words(int kwp) { return kwp <= 2 * kConvChunk ? kwp : kConvChunk; }

// tile: 1 = 128 pixels x 64 channels, 2 = 128 x 32, 3 = 64 x 64, 4 = 64 x 32
static int tile_bm(int tile) { return tile <= 2 ? 128 : 64; }
static int tile_bn(int tile) { return (tile & 1) ? 64 : 32; }

// Words of packed that one tile's windows can span (a bound): the tile's pixels cover at most R output rows, the
// rows of their windows at most R * SH + (images crossed + 1) * (KH - 1) * DH + 1 input rows, whole padded rows.
int conv_span_bound(const BinConvArgs& p, int tile) {
  const int64_t bm = tile_bm(tile);
  const int64_t R = (bm + p.Wo - 1) / p.Wo + 1;
  const int64_t images = (bm + (int64_t)p.Ho * p.Wo - 1) / ((int64_t)p.Ho * p.Wo) + 1;
  const int64_t rows = std::min<int64_t>(R * p.SH + (images + 1) * (p.KH - 1) * p.DH + 1, (int64_t)images * p.Hp + p.Hp);
  return (int)std::min<int64_t>(rows * p.Wp * p.CW + 8, 1 << 30);
}

size_t conv_smem_bytes(const BinConvArgs& p, int tile) {
  const int bn = tile_bn(tile), bm = tile_bm(tile);
  const int kc = conv_chunk_words(p.KWP);
  const size_t tables = (size_t)p.KWP * 4 + (size_t)bn * 12 + (size_t)bm * 20 + (size_t)p.span_cap * 4;
  const size_t stage = std::max((size_t)bn * kc * 4 * (kc < p.KWP ? 2 : 1), (size_t)bn * (bm + 4) * 4);
  return ((tables + 15) / 16) * 16 + stage;
}

int conv_auto_tile(const BinConvArgs& p, int sms) {
  // 128 x 64 while it gives every SM two blocks, then 64 x 64, then 64 x 32 (H100, ResNet-18 3x3 layers at batch 64:
  // 128 x 64 within 5% of the best tile wherever it has >= 2 blocks per SM; benchmarks/results/cuda_h100_conv.md)
  const int64_t npix = (int64_t)p.N * p.Ho * p.Wo;
  auto blocks = [&](int tile) {
    return ((npix + tile_bm(tile) - 1) / tile_bm(tile)) * ((p.O + tile_bn(tile) - 1) / tile_bn(tile));
  };
  if (blocks(1) >= 2ll * sms) return 1;
  if (blocks(3) >= 1ll * sms) return 3;
  return 4;
}

bool conv_auto_stage(const BinConvArgs& p) {
  // the windows in shared memory from 8 channel words only: with fewer, a k step's words of 8 neighbouring pixels
  // fall in the same banks, and reading them through L1 is faster at C = 64 and level at C = 128
  // (benchmarks/results/cuda_h100_conv.md: tile 1 staged and unstaged)
  return p.CW >= 8;
}

constexpr int kMaxDevices = 64;

template <typename T>
static cudaError_t pack_typed(const BinConvArgs& p, cudaStream_t st) {
  const int hw = p.H * p.W;
  const int64_t ring = (int64_t)p.Hp * p.Wp - hw;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(p.x);
  if (p.sw == 1 && p.sh == p.W) {   // plane mode
    auto fits = [&](int e) {
      return (p.sc * (int64_t)sizeof(T)) % e == 0 && (p.sn * (int64_t)sizeof(T)) % e == 0 && addr % e == 0;
    };
    const int E = fits(16) ? 16 : (fits(8) ? 8 : 4);
    const int runs = (hw + kPackRun - 1) / kPackRun;
    const int64_t items = (int64_t)runs * p.CW * p.N;
    const int smem = 2 * 32 * pack_row_bytes<T>();
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    // resident blocks per SM: asked once per device (the attribute is per device too), not on every call
    static std::atomic<int> per_sm_of[kMaxDevices];
    int per_sm = dev < kMaxDevices ? per_sm_of[dev].load(std::memory_order_relaxed) : 0;
    if (per_sm == 0) {
      cudaError_t e = cudaFuncSetAttribute(bconv_pack_plane_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      if (e != cudaSuccess) return e;
      e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, bconv_pack_plane_kernel<T>, 256, smem);
      if (e != cudaSuccess) return e;
      per_sm = std::max(1, per_sm);
      if (dev < kMaxDevices) per_sm_of[dev].store(per_sm, std::memory_order_relaxed);
    }
    const int loop_blocks = (int)std::min<int64_t>(items, (int64_t)std::max(1, per_sm) * std::max(1, sms));
    const int ring_blocks = (int)((p.N * ring * p.CW + 255) / 256);
    bconv_pack_plane_kernel<T><<<loop_blocks + ring_blocks, 256, smem, st>>>(p, loop_blocks, runs, E);
  } else if (p.sc == 1) {           // channel mode
    const int64_t words = (int64_t)p.N * hw * p.CW;
    const int64_t threads = (words + 31) / 32 * 32 + (int64_t)p.N * ring * p.CW;
    bconv_pack_channels_kernel<T><<<(unsigned)((threads + 255) / 256), 256, 0, st>>>(p, (int)words);
  } else {
    const int64_t words = (int64_t)p.N * p.Hp * p.Wp * p.CW;
    bconv_pack_any_kernel<T><<<(unsigned)((words + 255) / 256), 256, 0, st>>>(p);
  }
  return cudaGetLastError();
}

cudaError_t launch_bconv_pack(const BinConvArgs& p, cudaStream_t st) {
  switch (p.x_dtype) {
    case kF32: return pack_typed<float>(p, st);
    case kF16: return pack_typed<__half>(p, st);
    case kBF16: return pack_typed<__nv_bfloat16>(p, st);
    case kI8: return pack_typed<int8_t>(p, st);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t launch_bconv(const BinConvArgs& args, int tile, bool stage_windows, cudaStream_t st) {
  if (tile < 1 || tile > 4) return cudaErrorInvalidValue;
  BinConvArgs p = args;
  p.div_plane = FastDiv::make((uint32_t)(p.Ho * p.Wo));
  p.div_wo = FastDiv::make((uint32_t)p.Wo);
  p.max_delta = ((p.KH - 1) * p.DH * p.Wp + (p.KW - 1) * p.DW) * p.CW;
  // the windows' words in shared memory where they fit 64 KiB and the GPU's per-block limit
  int dev = 0, optin = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  p.span_cap = (conv_span_bound(p, tile) + 3) & ~3;
  if (!stage_windows || p.span_cap * 4 > 64 * 1024 || conv_smem_bytes(p, tile) > (size_t)optin) p.span_cap = 0;
  const int64_t npix = (int64_t)p.N * p.Ho * p.Wo;
  const int kc = conv_chunk_words(p.KWP);
  const size_t smem = conv_smem_bytes(p, tile);
  const int bm = tile_bm(tile), bn = tile_bn(tile);
  const dim3 grid((unsigned)((npix + bm - 1) / bm), (unsigned)((p.O + bn - 1) / bn));
  auto run = [&](auto kernel) {
    cudaError_t e = bie::set_smem_limit(reinterpret_cast<const void*>(kernel), (int)smem);
    if (e != cudaSuccess) return e;
    kernel<<<grid, kConvThreads, smem, st>>>(p, kc);
    return cudaGetLastError();
  };
  // an even number of channel words: thread tig's two words of a k step are adjacent (see the kernel)
  const bool pair = p.CW % 2 == 0;
  switch (tile) {
    case 1: return pair ? run(bconv_mma_kernel<2, 8, true>) : run(bconv_mma_kernel<2, 8, false>);
    case 2: return pair ? run(bconv_mma_kernel<2, 4, true>) : run(bconv_mma_kernel<2, 4, false>);
    case 3: return pair ? run(bconv_mma_kernel<1, 8, true>) : run(bconv_mma_kernel<1, 8, false>);
    default: return pair ? run(bconv_mma_kernel<1, 4, true>) : run(bconv_mma_kernel<1, 4, false>);
  }
}

}  // namespace bie
