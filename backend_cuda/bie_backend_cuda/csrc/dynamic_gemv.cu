// Fused per-token W8A8-dynamic GEMV: dynamic_int8_linear with scheme per_token_symmetric for up to 16 rows, in one
// launch (docs/dynamic.md gives the definition this reproduces bit for bit).
//
// Every block first quantizes the whole of x (M <= 16 rows: a few KiB to a few hundred KiB, read from L2) into shared
// memory, redundantly: no block waits for another, so any grid is free of deadlock and the launch needs no
// workspace. The per-row scale is float32(amax|x_row|) / 127 by an IEEE division (1 where it is 0); the codes are
// round_half_even(x / scale). The division is computed as x * (1 / scale) rounded to an integer by a magic-number
// add, and the true division is redone only where that product lies within 2^-12 of a half-integer (there the two
// may round differently) or for a row whose scale is not a normal finite float: the codes are those of the
// reference's division everywhere.
//
// The weight codes arrive in a fragment-ordered layout (bie_backend_cuda/dynamic.py prepare_gemv): tiles of 16
// output channels x 32 k, 512 bytes each, one 16-byte A fragment of mma.m16n8k32 per lane, the tiles of a block of 16
// channels consecutive along K. Each block takes a contiguous run of channel blocks, its warps split the run's tiles
// evenly (split-K inside the block), each warp streams its tiles through a ring of 16-byte loads, and the partial
// sums meet in shared memory by integer atomics: exact int32, so the result does not depend on their order. The
// epilogue is the reference's, operation by operation: float32(acc) * (scale_x * weight_scale) + bias, each step
// rounded to float32 (no fused multiply-add), then cast to x's dtype.
//
// The same kernel serves int_gemm for up to 32 rows (p.mode, launchers.h): mode 1 quantizes x with one given scale
// (quantize_int: x + shift rounded to x's dtype, clamp(round_half_even(v / scale)) by the true division, computed as
// for the per-token codes: through the reciprocal, the division redone near ties and for scales that are not normal
// finite floats), mode 2 takes int8 codes as they are; both end in int_gemm's epilogue, float32(acc) * scale + bias,
// or the int32 sums. Their codes of x are made in units of 16 elements of one row (the 16 bytes one row has in two
// lanes of a B fragment), spread over all the block's threads whatever the rows. Every block needs all of them, and
// made by every block they cost more than the products from about 9 rows (the per-token form at 16 rows of 4096 x
// 4096: 27.8 us, against 15.6 for CUTLASS's quantization launch and int8 GEMM; most of it the quantization that
// every one of the ~132 blocks repeats). So on sm_90 the blocks run in clusters of up to 8 (the launcher's choice
// from 9 rows): each block makes 1/cluster of the units and stores each into the shared memory of every block of its
// cluster (distributed shared memory), then one cluster barrier; a cluster makes the codes once where each of its
// blocks did (binary.cu's fused GEMM does the same with signs). Bulk copies of each block's share instead (the copy
// engine moving a contiguous range of k tiles into the other blocks, an mbarrier counting them) measured slower at
// 9-24 rows (4096 x 4096: 14.3 against 12.5 us at 9 rows, 17.1 against 16.0 at 17) and faster only at 32 (19.7
// against 21.5). Without clusters (a cluster of 1: other GPUs, or 1-8 rows) each block makes all the units itself.
//
// Launched as a programmatic dependent (p.pdl, sm_90), a block prefetches its first weight tiles while the previous
// kernel in the stream finishes, and reads x (perhaps that kernel's output) and writes its output only after waiting
// for it; the caller launches a freshly prepared layout without (the kernels that wrote it ran just before).
#include "common.cuh"
#include "wq_fragments.cuh"
#include "dynamic_codes.cuh"
#include "hopper.cuh"

namespace bie {
namespace {

constexpr int kWarps = 16;
constexpr int kThreads = kWarps * 32;
constexpr int kRing = 8;             // 512-byte tiles in flight per warp, held in registers
// The alternative staging (launch option ring = 1): 16 tiles in flight per warp through cp.async into the warp's
// own slots of shared memory (no registers held: twice the bytes in flight of the register ring), 8 where 16 do not
// fit beside 17-32 rows of codes of x. Each lane copies its own 16-byte fragment of a tile and later reads back only
// that fragment, so a lane's waits on its own copy groups order everything; no barrier is needed.
__host__ __device__ constexpr size_t ring_bytes(int slots) { return (size_t)kWarps * slots * 512; }
constexpr int kKeep = 2;             // 8-element chunks of x a thread keeps in registers between its two passes

// The largest |x| bits over 8 elements of a row starting at k0 (0 past K).
template <typename T>
__device__ __forceinline__ uint32_t amax8(const T* row, int k0, int K, bool vec) {
  if (vec && k0 + 8 <= K) {
    if constexpr (std::is_same<T, float>::value) {
      const uint4 a = *reinterpret_cast<const uint4*>(row + k0);
      const uint4 b = *reinterpret_cast<const uint4*>(row + k0 + 4);
      const uint32_t m = 0x7fffffffu;
      return max(max(max(a.x & m, a.y & m), max(a.z & m, a.w & m)), max(max(b.x & m, b.y & m), max(b.z & m, b.w & m)));
    } else {
      const uint4 a = *reinterpret_cast<const uint4*>(row + k0);
      const uint32_t m = 0x7fff7fffu;
      const uint32_t h = __vmaxu2(__vmaxu2(a.x & m, a.y & m), __vmaxu2(a.z & m, a.w & m));
      return max(h & 0xffffu, h >> 16);
    }
  }
  uint32_t r = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i)
    if (k0 + i < K) r = max(r, dyn_abs_bits<T>(row[k0 + i]));
  return r;
}

__device__ __forceinline__ uint32_t pack4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  return __byte_perm(__byte_perm(a, b, 0x0040), __byte_perm(c, d, 0x0040), 0x5410);
}

// The code of v for quantize_int with one scale s (inv = 1 / s rounded, fast = dyn_fast_scale(s)): clamp(round_half
// _even(v / s), lo, hi), NaN -> 0. A product of magnitude 256 or more lies beyond every code (the true quotient then
// exceeds 255.9), so only its sign matters; below that the reciprocal's error stays under 2^-15, and the rounding is
// kept unless the product lies within 2^-12 of a half-integer.
__device__ __forceinline__ uint32_t static_code_of(float v, float s, float inv, bool fast, int lo, int hi) {
  if (fast) {
    const float pr = __fmul_rn(v, inv);
    if (!(fabsf(pr) < 256.0f)) {
      if (pr == pr) return (uint32_t)(pr > 0.0f ? hi : lo);
    } else {
      const float n = rintf(pr);
      if (fabsf(fmaf(v, inv, -n)) < kDynTieGuard) return (uint32_t)min(max((int)n, lo), hi);
    }
  }
  const float q = __fdiv_rn(v, s);
  if (q != q) return 0u;
  return (uint32_t)min(max(__float2int_rn(q), lo), hi);
}

// A unit of the codes of x (modes 1 and 2): row m, k tile kt, half h, the 16 elements k0 = 32 kt + 8 h .. + 7 and
// k0 + 16 .. + 23. In the B-fragment order they are the 16 consecutive bytes of lanes (m & 7) * 4 + 2h and + 1 of
// tile (kt, m / 8), {k0 .. + 3, k0 + 16 .. + 19} then {k0 + 4 .. + 7, k0 + 20 .. + 23}: one 16-byte store. The byte
// offset of that store in the codes:
template <int MT>
__device__ __forceinline__ uint32_t unit_offset(int m, int kt, int h) {
  return (uint32_t)((((kt * MT + (m >> 3)) * 32 + (m & 7) * 4 + h * 2)) * 8);
}

// The unit's 16 codes of quantize_int (mode 1): x + shift rounded to T (where there is a shift), then static_code_of;
// 0 past K.
template <typename T>
__device__ __forceinline__ uint4 quantized_unit(const DynGemvArgs& p, const T* xrow, int k0, bool vec, float s,
                                                float inv, bool fast) {
  const T* sh = static_cast<const T*>(p.shift);
  uint32_t w[4];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int k = k0 + half * 16;
    float v[8];
    dyn_load8<T>(xrow, k, p.K, vec, v);
    if (sh != nullptr) {
      float a[8];
      dyn_load8<T>(sh, k, p.K, p.shift_vec != 0, a);
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = to_f32(from_f32<T>(__fadd_rn(v[e], a[e])));   // the add rounds in T
    }
    uint32_t q[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) q[e] = k + e < p.K ? static_code_of(v[e], s, inv, fast, p.qlo, p.qhi) : 0u;
    w[half] = pack4(q[0], q[1], q[2], q[3]);        // lane 2h's words: k .. + 3 of both halves
    w[2 + half] = pack4(q[4], q[5], q[6], q[7]);    // lane 2h + 1's: k + 4 .. + 7
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// The unit's 16 given codes (mode 2): 8-byte loads where the row allows them (vec: 8-byte aligned rows), else byte
// by byte; 0 past K.
__device__ __forceinline__ uint4 given_unit(const DynGemvArgs& p, const int8_t* row, int k0, bool vec) {
  uint2 u[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int k = k0 + half * 16;
    if (vec && k + 8 <= p.K) {
      u[half] = *reinterpret_cast<const uint2*>(row + k);
    } else {
      uint32_t b[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) b[e] = k + e < p.K ? (uint32_t)(uint8_t)row[k + e] : 0u;
      u[half] = make_uint2(pack4(b[0], b[1], b[2], b[3]), pack4(b[4], b[5], b[6], b[7]));
    }
  }
  return make_uint4(u[0].x, u[1].x, u[0].y, u[1].y);
}

__device__ __forceinline__ void store_out_f32(void* out, int dtype, int64_t i, float y) {
  switch (dtype) {
    case kF32: static_cast<float*>(out)[i] = y; break;
    case kF16: static_cast<__half*>(out)[i] = __float2half_rn(y); break;
    default: static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(y); break;
  }
}

__device__ __forceinline__ void mma_s8(int (&c)[4], const uint4& a, const uint2& b) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
               : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b.x), "r"(b.y));
}

// Shared memory: the codes of x in B-fragment order ([KT][MT][32 lanes][2 words]: lane g * 4 + t holds k = t * 4 ..
// + 3 and 16 + t * 4 .. + 3 of row mt * 8 + g), then the int32 sums of the block's channel blocks ([blocks][16 * MT
// rows][16 channels]), the row scales and their abs-max bits, then the staging slots.
template <int MT>
__host__ __device__ constexpr size_t codes_bytes(int KT) { return (size_t)KT * MT * 256; }
template <int MT>
__host__ __device__ constexpr size_t sums_bytes(int blocks) { return (size_t)blocks * MT * 8 * 16 * 4; }
constexpr size_t kTailBytes = 16 * 4 * 2;

// SLOTS: the weight tiles staged through shared memory (SLOTS a warp, after the sums and scales) instead of the
// register ring (0).
template <typename T, int MT, int SLOTS, int MODE>
__global__ void __launch_bounds__(kThreads, 1) dynamic_gemv_kernel(const DynGemvArgs p) {
  constexpr bool SMEM_RING = SLOTS > 0;
  extern __shared__ __align__(16) uint8_t smem[];
  const int KT = (p.K + 31) >> 5;
  uint32_t* codes = reinterpret_cast<uint32_t*>(smem);
  int* sums = reinterpret_cast<int*>(smem + codes_bytes<MT>(KT));
  const int b0 = (int)((int64_t)blockIdx.x * p.nblocks / p.grid), b1 = (int)((int64_t)(blockIdx.x + 1) * p.nblocks / p.grid);
  float* scales = reinterpret_cast<float*>(smem + codes_bytes<MT>(KT) + sums_bytes<MT>(b1 - b0));
  uint32_t* amax = reinterpret_cast<uint32_t*>(scales + 16);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // (modes 1 and 2) the block's cluster: 1 without a cluster launch, and on every target but sm_90a (hopper.cuh)
  const int cl = MODE == 0 ? 1 : (int)hop::cluster_size();
  if (cl > 1) hop::cluster_arrive_relaxed();   // waited on before the first store into another block

  // this warp's tiles (block-local flat index blk * KT + kt), their loads issued before the quantization
  const int64_t tiles = (int64_t)(b1 - b0) * KT;
  const int64_t u0 = tiles * warp / kWarps, u1 = tiles * (warp + 1) / kWarps;
  const uint4* wp = reinterpret_cast<const uint4*>(p.w) + (int64_t)b0 * KT * 32 + lane;
  frag::griddep_launch_dependents();   // the next kernel's blocks take the SMs ours leave
  uint4 ring[SMEM_RING ? 1 : kRing];
  constexpr int kSlots = SMEM_RING ? SLOTS : 1;
  // (the staging slots: 16-byte aligned, after the sums and the 128 bytes of scales and abs-maxes)
  uint4* sring = reinterpret_cast<uint4*>(smem + codes_bytes<MT>(KT) + sums_bytes<MT>(b1 - b0) + kTailBytes) +
                 (size_t)warp * kSlots * 32 + lane;
  if constexpr (SMEM_RING) {
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      if (u0 + i < u1) frag::cp_async16(frag::smem_u32(sring + i * 32), wp + (u0 + i) * 32, 16);
      frag::cp_commit();   // (one group per slot, empty past the warp's tiles: the waits count groups)
    }
  } else {
#pragma unroll
    for (int i = 0; i < kRing; ++i)
      if (u0 + i < u1) ring[i] = frag::ld_stream(wp + (u0 + i) * 32);
  }
  // shared memory set up meanwhile: the sums, the abs-maxes, the codes 0 of the padding rows of the last 8-row tile
  const int nsums = (b1 - b0) * MT * 8 * 16;
  for (int i = threadIdx.x; i < nsums; i += kThreads) sums[i] = 0;
  if (threadIdx.x < 16) amax[threadIdx.x] = 0u;
  for (int i = threadIdx.x; i < (MT * 8 - p.M) * KT; i += kThreads) {
    const int pm = p.M + i / KT, pkt = i % KT;   // a row's 32 codes of one tile: 32 consecutive bytes
    uint4* dst = reinterpret_cast<uint4*>(codes + (((size_t)pkt * MT + (pm >> 3)) * 32 + (pm & 7) * 4) * 2);
    dst[0] = make_uint4(0u, 0u, 0u, 0u);
    dst[1] = make_uint4(0u, 0u, 0u, 0u);
  }
  frag::griddep_wait();   // x and the output only now (a no-op without a programmatic launch)
  __syncthreads();

  const bool vec = p.x_vec != 0;
  if constexpr (MODE == 0) {
    // ---- quantize x. Row m belongs to the warps w with w % M == m (M <= 16), so that every warp has a row and the
    // loads of all rows are issued at once: row abs-max, scale, codes.
    const int K8 = (p.K + 7) >> 3, KP8 = KT * 4;   // 8-element chunks of a row, of a padded row
    const int qm = warp % p.M;
    const int gsize = ((kWarps - 1 - qm) / p.M + 1) * 32, gj = (warp / p.M) * 32 + lane;
    const T* xrow = static_cast<const T*>(p.x) + (int64_t)qm * p.ldx;
    // a thread with at most kKeep chunks of its row keeps them in registers for the codes (one read of x); the
    // others read them again (from L1 where they stayed)
    const bool keep = gj >= K8 || (K8 - 1 - gj) / gsize < kKeep;
    float kept[kKeep][8];
    {
      uint32_t r = 0;   // the row's abs-max as float32 bits (integer order = float order, NaN above infinity)
      if (keep) {
#pragma unroll
        for (int j = 0; j < kKeep; ++j) {
          const int c = gj + j * gsize;
          if (c < K8) {
            dyn_load8<T>(xrow, c * 8, p.K, vec, kept[j]);
#pragma unroll
            for (int e = 0; e < 8; ++e) r = max(r, __float_as_uint(kept[j][e]) & 0x7fffffffu);
          }
        }
      } else {
        uint32_t rt = 0;
        // the whole 16-byte chunks without a branch (their loads issued together), then the rest
        int c = gj;
        if (vec) {
          constexpr int kUnroll = sizeof(T) == 4 ? 4 : 8;   // eight 16-byte loads in flight a thread
#pragma unroll kUnroll
          for (; c < (p.K >> 3); c += gsize) rt = max(rt, amax8<T>(xrow, c * 8, c * 8 + 8, true));
        }
        for (; c < K8; c += gsize) rt = max(rt, amax8<T>(xrow, c * 8, p.K, vec));
        r = __float_as_uint(dyn_abs_bits_to_f32<T>(rt)) & 0x7fffffffu;
      }
      r = __reduce_max_sync(0xffffffffu, r);
      if (lane == 0 && r != 0u) atomicMax(&amax[qm], r);
    }
    __syncthreads();
    if (threadIdx.x < 16) {
      scales[threadIdx.x] = dyn_token_scale(__uint_as_float(amax[threadIdx.x]));
    }
    __syncthreads();
    {
      const float s = scales[qm];
      const float inv = __frcp_rn(s);
      const bool fast = dyn_fast_scale(s);
      const int mt = qm >> 3, g = qm & 7;
      // chunk c (k = 8c .. 8c + 7): tile c / 4, the words of t = 2 (c & 1) and + 1, fragment half (c >> 1) & 1
      auto store = [&](int c, const float (&v)[8], bool real) {
        uint32_t w0 = 0u, w1 = 0u;
        if (real) {
          w0 = pack4(dyn_code_of(v[0], s, inv, fast), dyn_code_of(v[1], s, inv, fast), dyn_code_of(v[2], s, inv, fast),
                     dyn_code_of(v[3], s, inv, fast));
          w1 = pack4(dyn_code_of(v[4], s, inv, fast), dyn_code_of(v[5], s, inv, fast), dyn_code_of(v[6], s, inv, fast),
                     dyn_code_of(v[7], s, inv, fast));
        }
        const int kt = c >> 2, t0 = (c & 1) * 2, h = (c >> 1) & 1;
        uint32_t* dst = codes + (((size_t)kt * MT + mt) * 32 + g * 4 + t0) * 2 + h;
        dst[0] = w0;
        dst[2] = w1;
      };
      if (keep) {
        // the kept chunks, then the padding chunks past K (fewer than 4 in a row: at most one more per thread)
#pragma unroll
        for (int j = 0; j <= kKeep; ++j) {
          const int c = gj + j * gsize;
          if (c < KP8) store(c, kept[j < kKeep ? j : 0], c < K8);
        }
      } else {
        int c = gj;
        if (vec) {
#pragma unroll 4
          for (; c < (p.K >> 3); c += gsize) {
            float v[8];
            dyn_load8<T>(xrow, c * 8, c * 8 + 8, true, v);
            store(c, v, true);
          }
        }
        for (; c < KP8; c += gsize) {
          float v[8];
          if (c < K8) dyn_load8<T>(xrow, c * 8, p.K, vec, v);
          store(c, v, c < K8);
        }
      }
    }
  } else {
    // ---- modes 1 and 2: the codes of one given scale, or the codes themselves, by units (unit_offset): unit
    // v = (m * KT + kt) * 2 + h, so that consecutive threads read consecutive 16-element pieces of a row. This
    // block makes units [v0, v1), its share of the cluster's, two a thread in flight (their loads issued before
    // either's codes are made), and stores each into every block of the cluster.
    const int units = p.M * KT * 2;
    const int rank = cl > 1 ? (int)hop::cluster_rank() : 0;
    const int v0 = (int)((int64_t)units * rank / cl), v1 = (int)((int64_t)units * (rank + 1) / cl);
    float s = 1.0f, inv = 1.0f;
    bool fast = false;
    if constexpr (MODE == 1) {
      s = *p.act_scale;
      inv = __frcp_rn(s);
      fast = dyn_fast_scale(s);
    }
    if (cl > 1) hop::cluster_wait();   // every block of the cluster has started: its shared memory may be written
    for (int v = v0 + (int)threadIdx.x; v < v1; v += 2 * kThreads) {
      uint4 q[2];
      uint32_t off[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int u = v + j * kThreads;
        if (u < v1) {
          const int m = u / (2 * KT), r = u - m * 2 * KT, kt = r >> 1, h = r & 1;
          const int k0 = kt * 32 + h * 8;
          if constexpr (MODE == 1) {
            q[j] = quantized_unit<T>(p, static_cast<const T*>(p.x) + (int64_t)m * p.ldx, k0, vec, s, inv, fast);
          } else {
            q[j] = given_unit(p, reinterpret_cast<const int8_t*>(p.x) + (int64_t)m * p.ldx, k0, vec);
          }
          off[j] = unit_offset<MT>(m, kt, h);
        }
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        if (v + j * kThreads >= v1) continue;
        if (cl == 1) {
          *reinterpret_cast<uint4*>(smem + off[j]) = q[j];
        } else {
          const uint32_t a = frag::smem_u32(smem + off[j]);
          for (int b = 0; b < cl; ++b) hop::st_shared_cluster_v4(a, (uint32_t)b, q[j]);
        }
      }
    }
    // every block's stores into every other's are done (and visible) before any block reads its codes, or leaves
    if (cl > 1) hop::cluster_sync();
  }
  __syncthreads();

  // the weight scale and bias of this thread's first output, loaded now: their latency hides under the tiles
  const int per_block = p.M * 16;
  const int outs = (b1 - b0) * per_block;
  float sw0 = 0.0f, bias0 = 0.0f;
  if (threadIdx.x < outs) {
    const int b = threadIdx.x / per_block, n = (b0 + b) * 16 + (threadIdx.x & 15);
    if (n < p.N) {
      sw0 = p.wscale != nullptr ? load_f32(p.wscale, p.wscale_dtype, p.per_channel ? n : 0) : 1.0f;
      if (p.bias != nullptr) bias0 = load_f32(p.bias, p.bias_dtype, n);
    }
  }

  // ---- the warp's tiles: k tiles of one channel block after another, partial sums into shared memory at each
  // block's end (or the warp's)
  int blk = (int)(u0 / KT), kt = (int)(u0 % KT);
  int acc[MT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0;
  bool pending = false;
  const uint2* xb = reinterpret_cast<const uint2*>(codes) + lane;
  const int g = lane >> 2, t = lane & 3;
  auto flush = [&](int b) {
    int* dst = sums + (size_t)b * MT * 8 * 16;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int m = mt * 8 + t * 2;   // acc: channel g (0, 1) and g + 8 (2, 3), rows m and m + 1
      atomicAdd(dst + m * 16 + g, acc[mt][0]);
      atomicAdd(dst + (m + 1) * 16 + g, acc[mt][1]);
      atomicAdd(dst + m * 16 + g + 8, acc[mt][2]);
      atomicAdd(dst + (m + 1) * 16 + g + 8, acc[mt][3]);
      acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0;
    }
  };
  // one weight tile's products, and the channel block's sums flushed at its end
  auto product = [&](const uint4& a) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) mma_s8(acc[mt], a, xb[((size_t)kt * MT + mt) * 32]);
    pending = true;
    if (++kt == KT) {
      flush(blk);
      pending = false;
      kt = 0;
      ++blk;
    }
  };
  if constexpr (SMEM_RING) {
    for (int64_t u = u0; u < u1; u += kSlots) {
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {
        if (u + i < u1) {
          frag::cp_wait<kSlots - 1>();   // this lane's copy of tile u + i (the oldest of its groups) landed
          product(sring[i * 32]);
          // the slot's refill is issued after the product that read it (the read has completed by then)
          if (u + i + kSlots < u1)
            frag::cp_async16(frag::smem_u32(sring + i * 32), wp + (u + i + kSlots) * 32, 16);
          frag::cp_commit();
        }
      }
    }
    frag::cp_wait<0>();
  } else {
    for (int64_t u = u0; u < u1; u += kRing) {
#pragma unroll
      for (int i = 0; i < kRing; ++i) {
        if (u + i < u1) {
          const uint4 a = ring[i];
          if (u + i + kRing < u1) ring[i] = frag::ld_stream(wp + (u + i + kRing) * 32);
          product(a);
        }
      }
    }
  }
  if (pending) flush(blk);
  __syncthreads();

  // ---- epilogue (mode 0): float32(acc) * (scale_x * weight_scale) + bias, each rounded to float32, cast to T
  for (int i = threadIdx.x; i < outs; i += kThreads) {
    const int b = i / per_block, r = i - b * per_block, m = r >> 4, c = r & 15;
    const int n = (b0 + b) * 16 + c;
    if (n >= p.N) continue;
    const int a = sums[((size_t)b * MT * 8 + m) * 16 + c];
    const bool first = i == (int)threadIdx.x;
    if constexpr (MODE == 0) {
      const float sw = first ? sw0 : load_f32(p.wscale, p.wscale_dtype, p.per_channel ? n : 0);
      float y = __fmul_rn(__int2float_rn(a), __fmul_rn(scales[m], sw));
      if (p.bias != nullptr) y = __fadd_rn(y, first ? bias0 : load_f32(p.bias, p.bias_dtype, n));
      static_cast<T*>(p.out)[(int64_t)m * p.N + n] = from_f32<T>(y);
    } else {
      // int_gemm's epilogue: the int32 sums, or float32(acc) * float32(scale) + float32(bias), each rounded
      if (p.out_dtype == kI32) {
        static_cast<int32_t*>(p.out)[(int64_t)m * p.N + n] = a;
        continue;
      }
      float y = __int2float_rn(a);
      if (p.wscale != nullptr) y = __fmul_rn(y, first ? sw0 : load_f32(p.wscale, p.wscale_dtype, p.per_channel ? n : 0));
      if (p.bias != nullptr) y = __fadd_rn(y, first ? bias0 : load_f32(p.bias, p.bias_dtype, n));
      store_out_f32(p.out, p.out_dtype, (int64_t)m * p.N + n, y);
    }
  }
}

template <typename T, int MT, int SLOTS, int MODE>
cudaError_t launch_typed(DynGemvArgs p, int grid_force, int num_sms, int smem_optin, cudaStream_t st, int cluster) {
  const int KT = (p.K + 31) >> 5, nblocks = (p.N + 15) >> 4;
  const size_t fixed = codes_bytes<MT>(KT) + kTailBytes + ring_bytes(SLOTS);
  if (fixed + sums_bytes<MT>(1) > (size_t)smem_optin) return cudaErrorInvalidValue;
  // one block per SM (the codes of x fill much of its shared memory): as many blocks as SMs, each a contiguous run of
  // channel blocks (runs differ by at most one block), more blocks where the runs' sums would not fit
  int grid = grid_force > 0 ? grid_force : num_sms;
  grid = std::max(1, std::min(grid, nblocks));
  const int cap = (int)(((size_t)smem_optin - fixed) / sums_bytes<MT>(1));
  const int least = (nblocks + cap - 1) / cap;
  grid = std::max(grid, least);
  const auto smem_of = [&](int g) { return (int)(fixed + sums_bytes<MT>((nblocks + g - 1) / g)); };
  const void* k = reinterpret_cast<const void*>(&dynamic_gemv_kernel<T, MT, SLOTS, MODE>);
  if (cluster > 1) {
    // clusters: the grid a whole number of them (blocks past the channel blocks only make their share of the codes
    // of x), and no more clusters than the device holds at once unless the runs' sums need more blocks (a second
    // wave of a few clusters would take as long as the first). Smaller clusters where none of this size fits (a
    // partitioned device).
    const auto round_up = [](int a, int b) { return (a + b - 1) / b * b; };
    int resident = 0;
    for (; cluster > 1; cluster /= 2) {
      const int smem = smem_of(round_up(grid, cluster));
      cudaError_t e = set_smem_limit(k, smem);
      if (e != cudaSuccess) return e;
      // (a device that cannot answer is taken as one that holds no such clusters: the launch then has smaller ones,
      // at worst none, and stays correct)
      if (active_clusters(&resident, k, kThreads, smem, cluster) != cudaSuccess) {
        (void)cudaGetLastError();
        resident = 0;
      }
      if (resident > 0) break;
    }
    if (cluster > 1) {
      int g = round_up(grid, cluster);
      if (grid_force == 0 && g > resident * cluster) g = std::max(resident * cluster, round_up(least, cluster));
      grid = g;
    }
  }
  const int smem = smem_of(grid);
  if (smem > 48 * 1024) {
    const cudaError_t e = set_smem_limit(k, smem);
    if (e != cudaSuccess) return e;
  }
  p.nblocks = nblocks;
  p.grid = grid;
  return launch_kernel(dynamic_gemv_kernel<T, MT, SLOTS, MODE>, dim3(grid), dim3(kThreads), smem, st, p.pdl != 0, p,
                       std::max(cluster, 1));
}

// The 8-row tiles (of the mma's n = 8) that hold M rows, and the shared memory a launch needs at the least.
int row_tiles(int M) { return (M + 7) >> 3; }
size_t min_smem(int MT, int KT) { return (size_t)KT * MT * 256 + (size_t)MT * 8 * 16 * 4 + kTailBytes; }

// One instantiation of the kernel per (dtype, row tiles, staging, mode): MODE 0 takes 1 or 2 row tiles, MODE 1 and 2
// take 1-4; the 8-slot staging only with 3 or 4 (the only row tiles whose codes leave no room for 16 at K = 4096).
template <typename T, int MODE, int MT>
cudaError_t launch_ring(const DynGemvArgs& p, int slots, int grid, int num_sms, int smem_optin, cudaStream_t st,
                        int cluster) {
  if (slots == 16) return launch_typed<T, MT, 16, MODE>(p, grid, num_sms, smem_optin, st, cluster);
  if constexpr (MODE != 0 && MT >= 3) {
    if (slots == 8) return launch_typed<T, MT, 8, MODE>(p, grid, num_sms, smem_optin, st, cluster);
  }
  return launch_typed<T, MT, 0, MODE>(p, grid, num_sms, smem_optin, st, cluster);
}
template <typename T, int MODE>
cudaError_t launch_mode(const DynGemvArgs& p, int MT, int slots, int grid, int num_sms, int smem_optin,
                        cudaStream_t st, int cluster) {
  switch (MT) {
    case 1: return launch_ring<T, MODE, 1>(p, slots, grid, num_sms, smem_optin, st, cluster);
    case 2: return launch_ring<T, MODE, 2>(p, slots, grid, num_sms, smem_optin, st, cluster);
  }
  if constexpr (MODE != 0) {
    switch (MT) {
      case 3: return launch_ring<T, MODE, 3>(p, slots, grid, num_sms, smem_optin, st, cluster);
      case 4: return launch_ring<T, MODE, 4>(p, slots, grid, num_sms, smem_optin, st, cluster);
    }
  }
  return cudaErrorInvalidValue;
}
template <typename T>
cudaError_t launch_float(const DynGemvArgs& p, int MT, int slots, int grid, int num_sms, int smem_optin,
                         cudaStream_t st, int cluster) {
  return p.mode == 0 ? launch_mode<T, 0>(p, MT, slots, grid, num_sms, smem_optin, st, cluster)
                     : launch_mode<T, 1>(p, MT, slots, grid, num_sms, smem_optin, st, cluster);
}

}  // namespace

size_t dynamic_gemv_min_smem(int M, int K) { return min_smem(row_tiles(M), (K + 31) >> 5); }

cudaError_t launch_dynamic_gemv(const DynGemvArgs& p, int dtype, int grid, int num_sms, int smem_optin,
                                cudaStream_t st, int ring, int cc_major, int cluster) {
  if (p.M < 1 || p.K < 1 || p.N < 1 || p.mode < 0 || p.mode > 2) return cudaErrorInvalidValue;
  if (p.M > (p.mode == 0 ? DYN_GEMV_MAX_M : INT_GEMV_MAX_M) || (p.mode == 1 && p.act_scale == nullptr))
    return cudaErrorInvalidValue;
  if (cluster != 0 && cluster != 1 && cluster != 2 && cluster != 4 && cluster != 8) return cudaErrorInvalidValue;
  // clusters (modes 1 and 2, sm_90 only: the distributed shared memory the codes are shared through): from 9 rows
  // where not asked for, the portable most of 8 (the codes' work once per 8 blocks). At 1-8 rows the codes cost
  // little next to the products and the launch keeps its grid of one block per SM.
  if (cluster > 1 && (p.mode == 0 || cc_major != 9)) return cudaErrorInvalidValue;
  if (cluster == 0) cluster = p.mode != 0 && cc_major == 9 && p.M > 8 ? 8 : 1;
  const int MT = row_tiles(p.M);
  // the shared-memory staging where asked for and where it fits next to the codes of x and the sums of a block's run
  // of channel blocks at one block per SM, else the register ring. The ring's room is taken from the sums: where
  // only a shorter run's sums fit, the launch takes more blocks than SMs, each making the codes of x again (24 rows
  // of K = 4096: 96 KiB of codes and the 128 KiB ring left room for one channel block's sums, and 4096 channels
  // took 256 blocks where 132 serve, 1.7x the time of 32 rows on the register ring).
  const int nblocks = (p.N + 15) >> 4;
  const int blocks = std::max(1, std::min(grid > 0 ? grid : num_sms, nblocks));
  const int run = (nblocks + blocks - 1) / blocks;
  const size_t need = min_smem(MT, (p.K + 31) >> 5) + (size_t)(run - 1) * MT * 8 * 16 * 4;
  int slots = 0;
  if (ring == 1 && need + ring_bytes(16) <= (size_t)smem_optin) slots = 16;
  else if (ring == 1 && p.mode != 0 && MT >= 3 && need + ring_bytes(8) <= (size_t)smem_optin) slots = 8;
  if (p.mode == 2) {
    return dtype == kI8 ? launch_mode<int8_t, 2>(p, MT, slots, grid, num_sms, smem_optin, st, cluster)
                        : cudaErrorInvalidValue;
  }
  switch (dtype) {
    case kF32: return launch_float<float>(p, MT, slots, grid, num_sms, smem_optin, st, cluster);
    case kF16: return launch_float<__half>(p, MT, slots, grid, num_sms, smem_optin, st, cluster);
    case kBF16: return launch_float<__nv_bfloat16>(p, MT, slots, grid, num_sms, smem_optin, st, cluster);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace bie
