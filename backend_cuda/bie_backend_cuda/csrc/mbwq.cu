// Mixed-width (exl2-style) weight-only kernels: mbwq_gemm for few rows, and the dequantization that serves more
// rows (with cuBLAS), the input gradient and mbwq_dequantize (bie_backend_cuda/mbwq.py).
//
// Format (bie_core/ops/weight_only.py, "Mixed widths"): packed row j of the (K, N) weight is input row perm[j];
// groups of consecutive packed rows share a width (2, 3, 4, 5, 6, 8 bits) and a scale / zero row; each group is its
// own little-endian bit stream along K (code i of a column at stream bits i*b .. i*b+b-1), the streams concatenated
// into qweight. The kernels walk the weight in chunks of at most 32 rows of one group (the chunk table): 32 codes of
// b bits fill exactly b words, so within a chunk the word and bit offset of every code are compile-time constants
// once the width is (one instantiation per width).
//
// GEMV (M <= MBWQ_GEMV_MAX_M, rows padded to MP = 1, 2, 4 or 8): a block owns 128 columns and a run of cps chunks
// (a K split). It first stages x[m, perm[j]] * rscale[j] for its chunks in shared memory as float32, each chunk in its
// own 32-row slot (zero past the chunk's rows and past M: a padded code then adds 0), and the sum of each slot's x per
// row. Its 512 threads are four groups of one thread per column (the int32 words of one packed row are consecutive
// across columns, so a warp's loads are coalesced 128-byte rows); the groups take the split's chunks in turn. A
// thread decodes each chunk's codes in registers and accumulates sum_t q_t * x_t; the chunk adds s * that - z *
// sum_t x_t (= sum_t (q_t s - z) x_t). Codes become floats by the exponent trick (2^23 + q as bits, minus 2^23:
// exact), which keeps the integer-to-float conversion (a fraction of the FMA rate) out of the loop. Accumulation is
// float32 throughout. The groups' sums meet in shared memory; splits write float32 partials, and the last block of a
// column block to finish (a semaphore per column block, reset by that block) sums them in split order (the result
// does not depend on the blocks' timing), adds the bias and stores x's dtype: one launch.
//
// Dequantization: a block per (chunk, 128 columns), each thread decodes one column of the chunk and writes
// (q * s - z) (two float32 roundings, as the reference), times rscale[j] if given, in the output dtype at row
// perm[j] (or j), coalesced across the block's columns.
#include "common.cuh"

namespace bie {
namespace {

constexpr int kThreads = MBWQ_THREADS;           // columns per block
constexpr int kGroups = 4;                        // GEMV: groups of kThreads threads splitting a block's chunks
constexpr int kGemvThreads = kThreads * kGroups;
constexpr int kStageFloats = 8192;                // GEMV: staged x per block, 32 KiB (plus the slot sums)

struct Chunk {
  int bits, rows, group, j0, nwords;
  int64_t w0;
};

// Chunk c of the table, checked against the shapes: false for an entry the kernels must not follow.
__device__ __forceinline__ bool load_chunk(const MbwqArgs& p, int c, Chunk& ch) {
  const int4 e = __ldg(p.chunks + c);
  ch.bits = e.x & 0xff;
  ch.rows = e.x >> 8;
  ch.group = e.y;
  ch.j0 = e.z;
  ch.w0 = e.w;
  ch.nwords = (ch.rows * ch.bits + 31) >> 5;
  const bool width = ch.bits >= 2 && ch.bits <= 8 && ch.bits != 7;
  return width && ch.rows >= 1 && ch.rows <= 32 && ch.group >= 0 && ch.group < p.G && ch.j0 >= 0 &&
         ch.j0 <= p.K - ch.rows && ch.w0 >= 0 && ch.w0 + ch.nwords <= p.KW;
}

// The b words of one column of a chunk (zero past its nwords: the next group's stream, or the end of qweight).
template <int B>
__device__ __forceinline__ void load_words(const int32_t* col, int64_t ld, int nwords, uint32_t (&w)[B]) {
#pragma unroll
  for (int i = 0; i < B; ++i) w[i] = i < nwords ? (uint32_t)__ldg(col + i * ld) : 0u;
}

// Code t (compile-time) of a 32-code block of B-bit codes held in B words.
template <int B, int T>
__device__ __forceinline__ uint32_t code(const uint32_t (&w)[B]) {
  constexpr int bit = T * B, wi = bit >> 5, off = bit & 31;
  uint32_t q = w[wi] >> off;
  if constexpr (off + B > 32) q |= w[wi + 1] << (32 - off);
  return q & ((1u << B) - 1u);
}

// The code as a float, exactly: 2^23 + q has q in its low mantissa bits.
__device__ __forceinline__ float code_f32(uint32_t q) { return __uint_as_float(0x4B000000u | q) - 8388608.0f; }

template <int B, int MP, int T0>
__device__ __forceinline__ void dot_step(const uint32_t (&w)[B], const float* xs, float (&aq)[MP]) {
  // codes per 16-byte load of the slot (rows of MP floats)
  constexpr int TPV = MP >= 4 ? 1 : 4 / MP;
  float xv[TPV * MP];
#pragma unroll
  for (int v = 0; v < TPV * MP / 4; ++v) {
    const float4 f = reinterpret_cast<const float4*>(xs + T0 * MP)[v];
    xv[4 * v] = f.x;
    xv[4 * v + 1] = f.y;
    xv[4 * v + 2] = f.z;
    xv[4 * v + 3] = f.w;
  }
  const float q0 = code_f32(code<B, T0>(w));
#pragma unroll
  for (int m = 0; m < MP; ++m) aq[m] = fmaf(q0, xv[m], aq[m]);
  if constexpr (TPV > 1) {
    const float q1 = code_f32(code<B, T0 + 1>(w));
#pragma unroll
    for (int m = 0; m < MP; ++m) aq[m] = fmaf(q1, xv[MP + m], aq[m]);
  }
  if constexpr (TPV > 2) {
    const float q2 = code_f32(code<B, T0 + 2>(w)), q3 = code_f32(code<B, T0 + 3>(w));
#pragma unroll
    for (int m = 0; m < MP; ++m) {
      aq[m] = fmaf(q2, xv[2 * MP + m], aq[m]);
      aq[m] = fmaf(q3, xv[3 * MP + m], aq[m]);
    }
  }
}

template <int B, int MP, int T0>
__device__ __forceinline__ void dot_from(const uint32_t (&w)[B], const float* xs, float (&aq)[MP]) {
  if constexpr (T0 < 32) {
    dot_step<B, MP, T0>(w, xs, aq);
    dot_from<B, MP, T0 + (MP >= 4 ? 1 : 4 / MP)>(w, xs, aq);
  }
}

// The b words of CPT consecutive columns of a chunk: 4-byte loads for one column, 16-byte loads for four (the
// columns' words are consecutive in a packed row; the caller guarantees 16-byte alignment: N % 4 == 0).
template <int B, int CPT>
__device__ __forceinline__ void load_cols(const int32_t* col, int64_t ld, int nwords, uint32_t (&w)[CPT][B]) {
  if constexpr (CPT == 1) {
    load_words<B>(col, ld, nwords, w[0]);
  } else {
    static_assert(CPT == 4, "one or four columns a thread");
#pragma unroll
    for (int i = 0; i < B; ++i) {
      const uint4 v = i < nwords ? __ldg(reinterpret_cast<const uint4*>(col + i * ld)) : make_uint4(0u, 0u, 0u, 0u);
      w[0][i] = v.x;
      w[1][i] = v.y;
      w[2][i] = v.z;
      w[3][i] = v.w;
    }
  }
}

// aq[c][m] = sum over the chunk's 32 slot rows of column c's code * staged x (rows past the chunk hold x = 0).
template <int B, int MP, int CPT>
__device__ __forceinline__ void chunk_dot(const int32_t* col, int64_t ld, int nwords, const float* xs,
                                          float (&aq)[CPT][MP]) {
  uint32_t w[CPT][B];
  load_cols<B, CPT>(col, ld, nwords, w);
#pragma unroll
  for (int c = 0; c < CPT; ++c) dot_from<B, MP, 0>(w[c], xs, aq[c]);
}

// CPT: columns per thread, 1 (4-byte loads) or 4 (16-byte loads: four times the bytes in flight per load, the
// staged x read once for four columns); a block covers kThreads * CPT columns.
template <typename T, int MP, int CPT>
__global__ void __launch_bounds__(kGemvThreads, CPT == 1 ? 2 : 1) mbwq_gemv_kernel(const MbwqArgs p) {
  extern __shared__ float4 smem4[];
  float* xs = reinterpret_cast<float*>(smem4);     // cps slots of 32 rows x MP
  float* sx = xs + p.cps * 32 * MP;                // cps x MP slot sums
  float* red = sx + p.cps * MP;                    // (kGroups - 1) x CPT x MP x kThreads: the other groups' sums
  __shared__ int s_last;
  const int tid = threadIdx.x;
  const int col = tid % kThreads, kg = tid / kThreads;
  const int n = (blockIdx.x * kThreads + col) * CPT;
  const int c0 = blockIdx.y * p.cps;
  const int nslots = min(p.cps, p.nchunks - c0);
  const T* x = static_cast<const T*>(p.x);

  for (int e = tid; e < nslots * 32 * MP; e += kGemvThreads) {
    const int slot = e / (32 * MP), t = (e / MP) & 31, m = e & (MP - 1);
    float v = 0.0f;
    Chunk ch;
    if (m < p.M && load_chunk(p, c0 + slot, ch) && t < ch.rows) {
      const int j = ch.j0 + t;
      const int k = __ldg(p.perm + j);
      if (k >= 0 && k < p.K) {
        v = to_f32(x[(int64_t)m * p.ldx + k]);
        if (p.rscale != nullptr) v *= __ldg(p.rscale + j);
      }
    }
    xs[e] = v;
  }
  __syncthreads();
  for (int e = tid; e < nslots * MP; e += kGemvThreads) {
    const int slot = e / MP, m = e & (MP - 1);
    const float* r = xs + slot * 32 * MP + m;
    float s = 0.0f;
#pragma unroll 8
    for (int t = 0; t < 32; ++t) s += r[t * MP];
    sx[e] = s;
  }
  __syncthreads();

  // each group of kThreads threads (one per column) takes every kGroups-th chunk of the split
  float acc[CPT][MP];
#pragma unroll
  for (int c = 0; c < CPT; ++c)
#pragma unroll
    for (int m = 0; m < MP; ++m) acc[c][m] = 0.0f;
  if (n < p.N) {   // (with CPT = 4, N % 4 == 0: all four columns exist)
    for (int slot = kg; slot < nslots; slot += kGroups) {
      Chunk ch;
      if (!load_chunk(p, c0 + slot, ch)) continue;
      const int32_t* wcol = p.qweight + ch.w0 * p.N + n;
      const float* xsl = xs + slot * 32 * MP;
      float aq[CPT][MP];
#pragma unroll
      for (int c = 0; c < CPT; ++c)
#pragma unroll
        for (int m = 0; m < MP; ++m) aq[c][m] = 0.0f;
      switch (ch.bits) {
        case 2: chunk_dot<2, MP, CPT>(wcol, p.N, ch.nwords, xsl, aq); break;
        case 3: chunk_dot<3, MP, CPT>(wcol, p.N, ch.nwords, xsl, aq); break;
        case 4: chunk_dot<4, MP, CPT>(wcol, p.N, ch.nwords, xsl, aq); break;
        case 5: chunk_dot<5, MP, CPT>(wcol, p.N, ch.nwords, xsl, aq); break;
        case 6: chunk_dot<6, MP, CPT>(wcol, p.N, ch.nwords, xsl, aq); break;
        default: chunk_dot<8, MP, CPT>(wcol, p.N, ch.nwords, xsl, aq); break;
      }
#pragma unroll
      for (int c = 0; c < CPT; ++c) {
        const int64_t gi = (int64_t)ch.group * p.N + n + c;
        const float s = __ldg(p.scales + gi), z = __ldg(p.zeros + gi);
#pragma unroll
        for (int m = 0; m < MP; ++m) acc[c][m] = fmaf(s, aq[c][m], fmaf(-z, sx[slot * MP + m], acc[c][m]));
      }
    }
  }
  // the groups' sums meet in group 0, added in group order (deterministic)
  if (kg > 0) {
#pragma unroll
    for (int c = 0; c < CPT; ++c)
#pragma unroll
      for (int m = 0; m < MP; ++m) red[(((kg - 1) * CPT + c) * MP + m) * kThreads + col] = acc[c][m];
  }
  __syncthreads();
  if (kg == 0) {
#pragma unroll
    for (int g = 1; g < kGroups; ++g)
#pragma unroll
      for (int c = 0; c < CPT; ++c)
#pragma unroll
        for (int m = 0; m < MP; ++m) acc[c][m] += red[(((g - 1) * CPT + c) * MP + m) * kThreads + col];
  }

  T* out = static_cast<T*>(p.out);
  if (p.splits == 1) {
    if (kg == 0 && n < p.N) {
#pragma unroll
      for (int c = 0; c < CPT; ++c) {
        const float b = p.bias != nullptr ? load_f32(p.bias, p.bias_dtype, n + c) : 0.0f;
#pragma unroll
        for (int m = 0; m < MP; ++m)
          if (m < p.M) out[(int64_t)m * p.N + n + c] = from_f32<T>(acc[c][m] + b);
      }
    }
    return;
  }
  if (kg == 0 && n < p.N) {
#pragma unroll
    for (int c = 0; c < CPT; ++c)
#pragma unroll
      for (int m = 0; m < MP; ++m)
        if (m < p.M) p.ws[((int64_t)blockIdx.y * p.M + m) * p.N + n + c] = acc[c][m];
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) s_last = atomicAdd(p.counters + blockIdx.x, 1) == p.splits - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  if (n < p.N) {
    for (int c = 0; c < CPT; ++c) {
      const float b = p.bias != nullptr ? load_f32(p.bias, p.bias_dtype, n + c) : 0.0f;
      for (int m = kg; m < p.M; m += kGroups) {   // the rows shared out over the groups
        float v = 0.0f;
        for (int sp = 0; sp < p.splits; ++sp) v += __ldcg(p.ws + ((int64_t)sp * p.M + m) * p.N + n + c);
        out[(int64_t)m * p.N + n + c] = from_f32<T>(v + b);
      }
    }
  }
  if (tid == 0) p.counters[blockIdx.x] = 0;   // ready for the next launch in the stream
}

template <typename T, int B>
__device__ __forceinline__ void dequant_chunk(const MbwqArgs& p, const Chunk& ch, int n, float s, float z) {
  uint32_t w[B];
  load_words<B>(p.qweight + ch.w0 * p.N + n, p.N, ch.nwords, w);
  T* out = static_cast<T*>(p.out);
  const auto one = [&](uint32_t q, int t) {
    if (t >= ch.rows) return;
    const int j = ch.j0 + t;
    const int row = p.perm != nullptr ? __ldg(p.perm + j) : j;
    if (row < 0 || row >= p.K) return;
    float v = __fsub_rn(__fmul_rn(code_f32(q), s), z);
    if (p.rscale != nullptr) v = __fmul_rn(v, __ldg(p.rscale + j));
    out[(int64_t)row * p.N + n] = from_f32<T>(v);
  };
#define BIE_MBWQ_CODE(T_) one(code<B, T_>(w), T_)
  BIE_MBWQ_CODE(0); BIE_MBWQ_CODE(1); BIE_MBWQ_CODE(2); BIE_MBWQ_CODE(3); BIE_MBWQ_CODE(4); BIE_MBWQ_CODE(5);
  BIE_MBWQ_CODE(6); BIE_MBWQ_CODE(7); BIE_MBWQ_CODE(8); BIE_MBWQ_CODE(9); BIE_MBWQ_CODE(10); BIE_MBWQ_CODE(11);
  BIE_MBWQ_CODE(12); BIE_MBWQ_CODE(13); BIE_MBWQ_CODE(14); BIE_MBWQ_CODE(15); BIE_MBWQ_CODE(16); BIE_MBWQ_CODE(17);
  BIE_MBWQ_CODE(18); BIE_MBWQ_CODE(19); BIE_MBWQ_CODE(20); BIE_MBWQ_CODE(21); BIE_MBWQ_CODE(22); BIE_MBWQ_CODE(23);
  BIE_MBWQ_CODE(24); BIE_MBWQ_CODE(25); BIE_MBWQ_CODE(26); BIE_MBWQ_CODE(27); BIE_MBWQ_CODE(28); BIE_MBWQ_CODE(29);
  BIE_MBWQ_CODE(30); BIE_MBWQ_CODE(31);
#undef BIE_MBWQ_CODE
}

template <typename T>
__global__ void __launch_bounds__(kThreads) mbwq_dequant_kernel(const MbwqArgs p) {
  const int n = blockIdx.y * kThreads + threadIdx.x;
  Chunk ch;
  if (n >= p.N || !load_chunk(p, blockIdx.x, ch)) return;
  const int64_t gi = (int64_t)ch.group * p.N + n;
  const float s = __ldg(p.scales + gi), z = __ldg(p.zeros + gi);
  switch (ch.bits) {
    case 2: dequant_chunk<T, 2>(p, ch, n, s, z); break;
    case 3: dequant_chunk<T, 3>(p, ch, n, s, z); break;
    case 4: dequant_chunk<T, 4>(p, ch, n, s, z); break;
    case 5: dequant_chunk<T, 5>(p, ch, n, s, z); break;
    case 6: dequant_chunk<T, 6>(p, ch, n, s, z); break;
    default: dequant_chunk<T, 8>(p, ch, n, s, z); break;
  }
}

int rows_padded(int m) { return m <= 1 ? 1 : m <= 2 ? 2 : m <= 4 ? 4 : 8; }

// the GEMV's dynamic shared memory: staged x, the slot sums, the groups' sums (at most 45 KiB: no opt-in needed)
int gemv_smem(int cps, int mp, int cpt) {
  return (cps * 32 * mp + cps * mp + (kGroups - 1) * cpt * mp * kThreads) * (int)sizeof(float);
}

template <typename T, int CPT>
cudaError_t gemv_for(const MbwqArgs& p, int smem, cudaStream_t st) {
  const dim3 grid((unsigned)ceil_div(p.N, kThreads * CPT), (unsigned)p.splits);
  const int mp = rows_padded(p.M);
  if constexpr (CPT == 4) {   // (1 or 2 rows: mbwq_gemv_plan)
    if (mp > 2) return cudaErrorInvalidValue;
    if (mp == 1) mbwq_gemv_kernel<T, 1, 4><<<grid, kGemvThreads, smem, st>>>(p);
    else mbwq_gemv_kernel<T, 2, 4><<<grid, kGemvThreads, smem, st>>>(p);
  } else {
    switch (mp) {
      case 1: mbwq_gemv_kernel<T, 1, 1><<<grid, kGemvThreads, smem, st>>>(p); break;
      case 2: mbwq_gemv_kernel<T, 2, 1><<<grid, kGemvThreads, smem, st>>>(p); break;
      case 4: mbwq_gemv_kernel<T, 4, 1><<<grid, kGemvThreads, smem, st>>>(p); break;
      default: mbwq_gemv_kernel<T, 8, 1><<<grid, kGemvThreads, smem, st>>>(p); break;
    }
  }
  BIE_LAUNCH_CHECK();
}

}  // namespace

int mbwq_gemv_plan(MbwqArgs& p, int num_sms, int splits_force) {
  const int mp = rows_padded(p.M);
  const int cap = kStageFloats / (32 * mp);            // chunks one block stages
  // four columns a thread (16-byte loads) where the packed rows allow it (N % 4 == 0, qweight 16-byte aligned) and
  // for 1-2 rows (the groups' sums of four columns then fit next to the staged x in 48 KiB; decoding is the case
  // that streams the weight for the fewest products)
  p.cpt = (mp <= 2 && p.N % 4 == 0 && reinterpret_cast<uintptr_t>(p.qweight) % 16 == 0) ? 4 : 1;
  const int colblocks = ceil_div(p.N, kThreads * p.cpt);
  int splits;
  if (splits_force > 0) {
    splits = splits_force;
  } else if (p.cpt == 1) {
    // about two blocks (of 16 warps: as many as are resident) per multiprocessor in all, but at least 8 chunks per
    // split (2 per group): shorter splits cost more in float32 partials than they gain in parallelism
    splits = std::max(1, ceil_div(2 * num_sms, colblocks));
    splits = std::min(splits, std::max(1, p.nchunks / 8));
  } else {
    // one block per multiprocessor is resident (its threads hold four columns' registers): at most one wave of
    // blocks, rounded down (a second, partial wave would cost a whole block's time for a few blocks)
    splits = std::max(1, num_sms / colblocks);
    splits = std::min(splits, std::max(1, p.nchunks / 8));
  }
  splits = std::max(1, std::min(splits, p.nchunks));
  const int cps = std::min(ceil_div(p.nchunks, splits), cap);
  p.cps = cps;
  p.splits = ceil_div(p.nchunks, cps);                 // no empty split
  return gemv_smem(cps, mp, p.cpt);
}

cudaError_t launch_mbwq_gemv(const MbwqArgs& p, int x_dtype, cudaStream_t st) {
  const int smem = gemv_smem(p.cps, rows_padded(p.M), p.cpt);
  const bool four = p.cpt == 4;
  switch (x_dtype) {
    case kF16: return four ? gemv_for<__half, 4>(p, smem, st) : gemv_for<__half, 1>(p, smem, st);
    case kBF16: return four ? gemv_for<__nv_bfloat16, 4>(p, smem, st) : gemv_for<__nv_bfloat16, 1>(p, smem, st);
    default: return four ? gemv_for<float, 4>(p, smem, st) : gemv_for<float, 1>(p, smem, st);
  }
}

cudaError_t launch_mbwq_dequant(const MbwqArgs& p, cudaStream_t st) {
  const dim3 grid((unsigned)p.nchunks, (unsigned)ceil_div(p.N, kThreads));
  switch (p.out_dtype) {
    case kF16: mbwq_dequant_kernel<__half><<<grid, kThreads, 0, st>>>(p); break;
    case kBF16: mbwq_dequant_kernel<__nv_bfloat16><<<grid, kThreads, 0, st>>>(p); break;
    default: mbwq_dequant_kernel<float><<<grid, kThreads, 0, st>>>(p); break;
  }
  BIE_LAUNCH_CHECK();
}

}  // namespace bie
