// Binary (1-bit) kernels: sign packing, binary GEMM (1-bit tensor cores with
// AND+popc, and a SIMT popcount path), packed-row embedding gathers.
//
// Canonical sign bits: bit 1 = +1 (v >= 0, NaN packs as -1), packed along K,
// LSB first, 8 per byte, pad bits 0.
//
// Binary dot product via AND (sm_90 has no native XOR+popc MMA: it is emulated, several times slower):
//   dot = K - 2 popc(a ^ w) = 4 popc(a & w) - 2 popc(a) - 2 popc(w) + K
// valid because pad bits are zero on both sides. popc(a) is summed by the
// GEMM kernel from its shared-memory tiles; popc(w) is precomputed at prepare
// time for weights (or also summed in the kernel, for batched products).
#include <type_traits>

#include "b1_common.cuh"
#include "common.cuh"
#include "hopper.cuh"

namespace bie {

// ----------------------------------------------------------------- pack_signs

// One thread per output byte. x is (rows, K) with element strides (sr, sk).
template <typename T, bool VEC>
__global__ void pack_signs_kernel(const T* __restrict__ x, uint8_t* __restrict__ out, int64_t rows, int64_t K,
                                  int64_t KB, int64_t sr, int64_t sk) {
  const int64_t total = rows * KB;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / KB, b = i - r * KB;
    const T* row = x + r * sr;
    uint32_t byte = 0;
    if (VEC) {  // sk == 1, K % 8 == 0 and 8 elements aligned to 8*sizeof(T)
      if (sizeof(T) == 4) {
        const float4* p = reinterpret_cast<const float4*>(row + 8 * b);
        float4 u = p[0], v = p[1];
        float e[8] = {u.x, u.y, u.z, u.w, v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 8; ++j) byte |= (uint32_t)(e[j] >= 0.f) << j;
      } else if (sizeof(T) == 2) {
        uint4 u = *reinterpret_cast<const uint4*>(row + 8 * b);
        const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
        for (int j = 0; j < 8; ++j) byte |= (uint32_t)nonneg<T>(e[j]) << j;
      } else {
        uint2 u = *reinterpret_cast<const uint2*>(row + 8 * b);
        const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
        for (int j = 0; j < 8; ++j) byte |= (uint32_t)nonneg<T>(e[j]) << j;
      }
    } else {
      const int64_t k0 = 8 * b;
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (k0 + j < K) byte |= (uint32_t)nonneg<T>(row[(k0 + j) * sk]) << j;
    }
    out[i] = (uint8_t)byte;
  }
}

template <typename T>
static cudaError_t launch_pack_t(const void* x, uint8_t* out, int64_t rows, int64_t K, int64_t sr, int64_t sk,
                                 cudaStream_t st) {
  const int64_t KB = (K + 7) / 8, total = rows * KB;
  if (total == 0) return cudaSuccess;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((total + threads - 1) / threads, 65536);
  const bool vec = sk == 1 && K % 8 == 0 && sr % 8 == 0 &&
                   reinterpret_cast<uintptr_t>(x) % (8 * sizeof(T)) == 0;
  if (vec)
    pack_signs_kernel<T, true><<<(unsigned)blocks, threads, 0, st>>>(static_cast<const T*>(x), out, rows, K, KB, sr, sk);
  else
    pack_signs_kernel<T, false><<<(unsigned)blocks, threads, 0, st>>>(static_cast<const T*>(x), out, rows, K, KB, sr, sk);
  BIE_LAUNCH_CHECK();
}

cudaError_t launch_pack_signs(const void* x, int dtype, uint8_t* out, int64_t rows, int64_t K, int64_t sr, int64_t sk,
                              cudaStream_t st) {
  switch (dtype) {
    case kF32: return launch_pack_t<float>(x, out, rows, K, sr, sk, st);
    case kF16: return launch_pack_t<__half>(x, out, rows, K, sr, sk, st);
    case kBF16: return launch_pack_t<__nv_bfloat16>(x, out, rows, K, sr, sk, st);
    case kI8: return launch_pack_t<int8_t>(x, out, rows, K, sr, sk, st);
  }
  return cudaErrorInvalidValue;
}

// The sign bits of x + shift for the binary linear layers' bound inference call: x (rows, K) contiguous, shift (K)
// in x's dtype or null. The sum is rounded to x's dtype before its sign is taken, as torch's addition in x's dtype
// rounds it (the reference adds, then packs), so the bits are those of the unfused ops. One thread per output byte;
// out rows hold KBp >= ceil(K/8) bytes, those past the last bit zero (the GEMMs read rows in 16-byte pieces).
template <typename T>
__device__ __forceinline__ bool shifted_nonneg(T v, const T* shift, int64_t k) {
  if (shift == nullptr) return nonneg<T>(v);
  return nonneg<T>(from_f32<T>(to_f32(v) + to_f32(shift[k])));
}

// The sign words of x + shift that the fused kernels (the GEMV below, the tensor-core GEMM's fused form) make for
// themselves: a thread takes word k0 / 32 (32 consecutive features) of RB rows at once, the shift's 32 values loaded
// once for them, and issues all its loads together (16-byte loads where x's rows and the shift are 16-byte aligned,
// `vec`). Every block (or cluster) repeats this, so it must cost a few memory latencies: one element a lane and a ballot per word
// (a latency per 4 words of a warp) took longer than the products, 50 us at 8 rows of 4096 features. The sum is
// rounded to x's dtype before its sign is taken, as the unfused ops round it. Rows from m0 past M, and features
// past K, give zero bits; `live` false gives zero words.
template <typename T> __host__ __device__ constexpr int sign_rows() { return sizeof(T) == 2 ? 4 : 2; }

template <typename T>
__device__ __forceinline__ bool sign_words_vec(const T* x, const T* sh, int K) {
  return (K * sizeof(T)) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(sh) % 16 == 0;
}

template <typename T, int RB>
__device__ __forceinline__ void sign_words(const T* x, const T* sh, int M, int K, int m0, int64_t k0, bool vec,
                                           bool live, uint32_t (&word)[RB]) {
  constexpr int E = 16 / sizeof(T);   // elements of a 16-byte load
#pragma unroll
  for (int r = 0; r < RB; ++r) word[r] = 0;
  if (!live || k0 >= K) return;
  if (vec && k0 + 32 <= K) {
    uint4 v[32 / E], u[RB][32 / E];
    if (sh != nullptr) {
#pragma unroll
      for (int i = 0; i < 32 / E; ++i) v[i] = __ldg(reinterpret_cast<const uint4*>(sh + k0) + i);
    }
#pragma unroll
    for (int r = 0; r < RB; ++r)
      if (m0 + r < M) {
#pragma unroll
        for (int i = 0; i < 32 / E; ++i)
          u[r][i] = __ldg(reinterpret_cast<const uint4*>(x + (int64_t)(m0 + r) * K + k0) + i);
      }
#pragma unroll
    for (int r = 0; r < RB; ++r) {
      if (m0 + r >= M) continue;
#pragma unroll
      for (int i = 0; i < 32 / E; ++i) {
        const T* e = reinterpret_cast<const T*>(&u[r][i]);
        const T* f = reinterpret_cast<const T*>(&v[i]);
#pragma unroll
        for (int j = 0; j < E; ++j) {
          const bool b = sh == nullptr ? nonneg<T>(e[j]) : nonneg<T>(from_f32<T>(to_f32(e[j]) + to_f32(f[j])));
          word[r] |= (uint32_t)b << (i * E + j);
        }
      }
    }
  } else {
#pragma unroll
    for (int r = 0; r < RB; ++r) {
      if (m0 + r >= M) continue;
      const T* row = x + (int64_t)(m0 + r) * K;
#pragma unroll 8
      for (int j = 0; j < 32; ++j)
        if (k0 + j < K) word[r] |= (uint32_t)shifted_nonneg<T>(row[k0 + j], sh, k0 + j) << j;
    }
  }
}

template <typename T, bool VEC>
__global__ void pack_signs_shifted_kernel(const T* __restrict__ x, const T* __restrict__ shift,
                                          uint8_t* __restrict__ out, int64_t rows, int64_t K, int64_t KBp) {
  const int64_t total = rows * KBp;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / KBp, k0 = 8 * (i - r * KBp);
    const T* row = x + r * K;
    uint32_t byte = 0;
    if (VEC && k0 + 8 <= K) {   // 8 elements of 16 bytes (2-byte types) at a 16-byte aligned address
      uint4 u = *reinterpret_cast<const uint4*>(row + k0);
      const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
      for (int j = 0; j < 8; ++j) byte |= (uint32_t)shifted_nonneg<T>(e[j], shift, k0 + j) << j;
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (k0 + j < K) byte |= (uint32_t)shifted_nonneg<T>(row[k0 + j], shift, k0 + j) << j;
    }
    out[i] = (uint8_t)byte;
  }
}

template <typename T>
static cudaError_t launch_pack_shifted_t(const void* x, const void* shift, uint8_t* out, int64_t rows, int64_t K,
                                         int64_t KBp, cudaStream_t st) {
  const int64_t total = rows * KBp;
  if (total == 0) return cudaSuccess;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((total + threads - 1) / threads, 65536);
  const T* xt = static_cast<const T*>(x);
  const T* sh = static_cast<const T*>(shift);
  if constexpr (sizeof(T) == 2) {   // (the vector load covers 8 elements of 2 bytes)
    if (K % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0) {
      pack_signs_shifted_kernel<T, true><<<(unsigned)blocks, threads, 0, st>>>(xt, sh, out, rows, K, KBp);
      BIE_LAUNCH_CHECK();
    }
  }
  pack_signs_shifted_kernel<T, false><<<(unsigned)blocks, threads, 0, st>>>(xt, sh, out, rows, K, KBp);
  BIE_LAUNCH_CHECK();
}

cudaError_t launch_pack_signs_shifted(const void* x, const void* shift, int dtype, uint8_t* out, int64_t rows,
                                      int64_t K, int64_t KBp, cudaStream_t st) {
  switch (dtype) {
    case kF32: return launch_pack_shifted_t<float>(x, shift, out, rows, K, KBp, st);
    case kF16: return launch_pack_shifted_t<__half>(x, shift, out, rows, K, KBp, st);
    case kBF16: return launch_pack_shifted_t<__nv_bfloat16>(x, shift, out, rows, K, KBp, st);
  }
  return cudaErrorInvalidValue;
}

// --------------------------------------------------------------- unpack_signs
template <typename T>
__global__ void unpack_signs_kernel(const uint8_t* __restrict__ bits, T* __restrict__ out, int64_t rows, int64_t k,
                                    int64_t ldb) {
  const int64_t total = rows * k;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / k, j = i - r * k;
    const bool bit = (bits[r * ldb + (j >> 3)] >> (j & 7)) & 1;
    out[i] = from_f32<T>(bit ? 1.f : -1.f);
  }
}
__global__ void unpack_signs_i8_kernel(const uint8_t* __restrict__ bits, int8_t* __restrict__ out, int64_t rows,
                                       int64_t k, int64_t ldb) {
  const int64_t total = rows * k;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / k, j = i - r * k;
    out[i] = ((bits[r * ldb + (j >> 3)] >> (j & 7)) & 1) ? 1 : -1;
  }
}

cudaError_t launch_unpack_signs(const uint8_t* bits, int64_t rows, int64_t k, int64_t ldb, void* out, int dtype,
                                cudaStream_t st) {
  const int64_t total = rows * k;
  if (total == 0) return cudaSuccess;
  const int threads = 256;
  const unsigned blocks = (unsigned)std::min<int64_t>((total + threads - 1) / threads, 65536);
  switch (dtype) {
    case kF32: unpack_signs_kernel<float><<<blocks, threads, 0, st>>>(bits, (float*)out, rows, k, ldb); break;
    case kF16: unpack_signs_kernel<__half><<<blocks, threads, 0, st>>>(bits, (__half*)out, rows, k, ldb); break;
    case kBF16:
      unpack_signs_kernel<__nv_bfloat16><<<blocks, threads, 0, st>>>(bits, (__nv_bfloat16*)out, rows, k, ldb);
      break;
    case kI8: unpack_signs_i8_kernel<<<blocks, threads, 0, st>>>(bits, (int8_t*)out, rows, k, ldb); break;
    default: return cudaErrorInvalidValue;
  }
  BIE_LAUNCH_CHECK();
}

// dot -> output element (float32(dot) * float32(scale) + float32(bias), two
// roundings like the reference: no fused multiply-add).
__device__ __forceinline__ void store_out(const BinGemmArgs& p, int64_t off, int n, int dot) {
  if (p.out_dtype == kI32) {
    static_cast<int32_t*>(p.out)[off] = dot;
    return;
  }
  float y = (float)dot;
  if (p.scale) y = __fmul_rn(y, load_f32(p.scale, p.scale_dtype, p.scale_stride * n));
  if (p.bias) y = __fadd_rn(y, load_f32(p.bias, p.bias_dtype, n));
  switch (p.out_dtype) {
    case kF32: static_cast<float*>(p.out)[off] = y; break;
    case kF16: static_cast<__half*>(p.out)[off] = __float2half_rn(y); break;
    default: static_cast<__nv_bfloat16*>(p.out)[off] = __float2bfloat16_rn(y); break;
  }
}

// Two adjacent columns (n, n+1) of one row; vector store when both exist and
// the row length is even (then off is even and the pair is aligned).
__device__ __forceinline__ void store_pair(const BinGemmArgs& p, int64_t off, int n, int d0, int d1) {
  if (n + 1 < p.N && (p.N & 1) == 0) {
    if (p.out_dtype == kI32) {
      *reinterpret_cast<int2*>(static_cast<int32_t*>(p.out) + off) = make_int2(d0, d1);
      return;
    }
    float y0 = (float)d0, y1 = (float)d1;
    if (p.scale) {
      y0 = __fmul_rn(y0, load_f32(p.scale, p.scale_dtype, p.scale_stride * n));
      y1 = __fmul_rn(y1, load_f32(p.scale, p.scale_dtype, p.scale_stride * (n + 1)));
    }
    if (p.bias) {
      y0 = __fadd_rn(y0, load_f32(p.bias, p.bias_dtype, n));
      y1 = __fadd_rn(y1, load_f32(p.bias, p.bias_dtype, n + 1));
    }
    switch (p.out_dtype) {
      case kF32: *reinterpret_cast<float2*>(static_cast<float*>(p.out) + off) = make_float2(y0, y1); break;
      case kF16: *reinterpret_cast<__half2*>(static_cast<__half*>(p.out) + off) = __floats2half2_rn(y0, y1); break;
      default:
        *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(p.out) + off) = __floats2bfloat162_rn(y0, y1);
        break;
    }
    return;
  }
  if (n < p.N) store_out(p, off, n, d0);
  if (n + 1 < p.N) store_out(p, off + 1, n + 1, d1);
}

// ------------------------------------------------- tensor-core GEMM (sm_80+)
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Shared-memory tile: rows of CK = 64 bytes (512 signs) = four 16-byte chunks;
// chunk c of row r lives at chunk c ^ ((r >> 1) & 3), which makes both the
// cp.async stores and the 8-row ldmatrix reads bank-conflict free.
constexpr int CK = 64;
__device__ __forceinline__ int swz(int r, int c) { return r * CK + ((c ^ ((r >> 1) & 3)) << 4); }

template <int ROWS, int THREADS>
__device__ __forceinline__ void load_tile(uint8_t* s, const uint8_t* g, int64_t ld, int row0, int nrows, int KB,
                                          int kbyte0, int tid) {
#pragma unroll
  for (int q0 = 0; q0 < ROWS * 4; q0 += THREADS) {
    const int q = q0 + tid;
    if (ROWS * 4 % THREADS == 0 || q < ROWS * 4) {
      const int r = q >> 2, c = q & 3;
      const int off = kbyte0 + c * 16;
      const int gr = row0 + r;
      const int nb = gr < nrows ? max(0, min(16, KB - off)) : 0;
      const uint8_t* src = nb > 0 ? g + (int64_t)gr * ld + off : g;
      cp_async16(smem_u32(s + swz(r, c)), src, nb);
    }
  }
}

// Adds the popcount of each tile row to acc (the thread's share of rows).
template <int ROWS, int THREADS>
__device__ __forceinline__ void popc_tile(const uint8_t* s, int tid, int (&acc)[(ROWS * 4 + THREADS - 1) / THREADS]) {
#pragma unroll
  for (int j = 0; j < (ROWS * 4 + THREADS - 1) / THREADS; ++j) {
    const int q = j * THREADS + tid;
    if (ROWS * 4 % THREADS == 0 || q < ROWS * 4) {
      const uint4 v = *reinterpret_cast<const uint4*>(s + q * 16);  // the 4 chunks of row q/4, any order
      acc[j] += __popc(v.x) + __popc(v.y) + __popc(v.z) + __popc(v.w);
    }
  }
}
template <int ROWS, int THREADS>
__device__ __forceinline__ void popc_finish(int* dst, int tid, int (&acc)[(ROWS * 4 + THREADS - 1) / THREADS]) {
#pragma unroll
  for (int j = 0; j < (ROWS * 4 + THREADS - 1) / THREADS; ++j) {
    int v = acc[j];
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    const int q = j * THREADS + tid;
    if ((ROWS * 4 % THREADS == 0 || q < ROWS * 4) && (q & 3) == 0) dst[q >> 2] = v;
  }
}

// XT = uint8_t: A is packed sign rows in global memory, staged with B through the cp.async ring. XT = float, __half
// or __nv_bfloat16 (the fused form, binary_linear's bound call at few rows): A is args.x (M <= BM rows, K) with
// args.shift, and the block's sign words of all of K are made in the launch (sign_words) into shared memory, where
// they stay for the whole loop while B streams through the ring: one launch and no buffer for the signs, where the
// unfused call packs them in a launch of its own. The blocks lie along N (blockIdx.x), batch 1. On sm_90 they run in
// clusters, and each block of a cluster makes every cluster-size-th chunk of the signs and stores it into the shared
// memory of all of them: the sign phase is repeated once per cluster, not once per block (made by every block, it
// took 15 us at 32 rows of 4096x4096 against the two launches' 9). The first B stages are issued before it, so the
// weight's loads overlap it.
template <int BM, int BN, int WM, int WN, int STAGES, bool PW, typename OT, typename XT = uint8_t>
__global__ void __launch_bounds__(WM* WN * 32) bgemm_tc_kernel(const BinGemvArgs args) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr bool FUSED = !std::is_same<XT, uint8_t>::value;
  const BinGemmArgs& p = args.gemm;
  constexpr int THREADS = WM * WN * 32;
  constexpr int TM = BM / WM, TN = BN / WN;
  constexpr int MT = TM / 16, NT = TN / 8;
  static_assert(TM % 16 == 0 && TN % 16 == 0, "warp tile must be a multiple of 16x16");
  constexpr int A_ST = BM * CK, B_ST = BN * CK;
  constexpr int PA_N = (BM * 4 + THREADS - 1) / THREADS, PB_N = (BN * 4 + THREADS - 1) / THREADS;
  extern __shared__ __align__(128) uint8_t smem[];
  const int nchunks = (p.KB + CK - 1) / CK;
  uint8_t* sA = smem;   // the ring's A stages, or (FUSED) all of A's chunks (binary_linear_tc_smem)
  uint8_t* sB = smem + (FUSED ? max(nchunks, STAGES) : STAGES) * A_ST;
  __shared__ int s_pa[BM];
  __shared__ int s_pb[BN];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / WN, wn = warp % WN;
  const int m0 = FUSED ? 0 : blockIdx.x * BM, n0 = (FUSED ? blockIdx.x : blockIdx.y) * BN;
  const int bz = blockIdx.z;
  const uint8_t* A = p.a + bz * p.a_bs;
  const uint8_t* B = p.b + bz * p.b_bs;

  // (FUSED, in a cluster) this block has started: the others may write its shared memory once they all have
  const int cl = FUSED ? (int)hop::cluster_size() : 1;
  if (cl > 1) hop::cluster_arrive_relaxed();

  int acc[MT][NT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0;
  int pa[PA_N], pb[PB_N];
#pragma unroll
  for (int j = 0; j < PA_N; ++j) pa[j] = 0;
#pragma unroll
  for (int j = 0; j < PB_N; ++j) pb[j] = 0;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nchunks) {
      if (!FUSED) load_tile<BM, THREADS>(sA + s * A_ST, A, p.lda, m0, p.M, p.KB, s * CK, tid);
      load_tile<BN, THREADS>(sB + s * B_ST, B, p.ldb, n0, p.N, p.KB, s * CK, tid);
    }
    cp_async_commit();
  }
  if constexpr (FUSED) {
    // word j of row r goes where load_tile would have put its bytes: chunk j / 16, 16-byte piece (j % 16) / 4.
    // Words past K (to the last chunk's end) are zero, as the AND identity needs; the cluster barrier below (one
    // block: the loop's first barrier) orders these stores before any read of them.
    constexpr int RB = sign_rows<XT>();
    constexpr int PER_CHUNK = BM / RB * 16;   // items of a chunk: RB rows of one of its 16 words
    static_assert(BM % RB == 0, "the sign phase takes RB rows at once");
    const XT* x = static_cast<const XT*>(args.x);
    const XT* sh = static_cast<const XT*>(args.shift);
    const bool vec = sign_words_vec<XT>(x, sh, p.K);
    const int rank = (int)hop::cluster_rank();
    const int mine = (nchunks - rank + cl - 1) / cl;   // chunks rank, rank + cl, ...
    if (cl > 1) hop::cluster_wait();   // every block of the cluster has started: its shared memory may be written
    for (int it = tid; it < mine * PER_CHUNK; it += THREADS) {
      const int c = rank + it / PER_CHUNK * cl, rem = it % PER_CHUNK;
      const int rb = rem / 16, j = c * 16 + rem % 16;
      uint32_t word[RB];
      sign_words<XT, RB>(x, sh, p.M, p.K, rb * RB, (int64_t)j * 32, vec, true, word);
#pragma unroll
      for (int r = 0; r < RB; ++r) {
        uint8_t* dst = sA + c * A_ST + swz(rb * RB + r, (j & 15) >> 2) + (j & 3) * 4;
        if (cl == 1) {
          *reinterpret_cast<uint32_t*>(dst) = word[r];
        } else {
          for (int b = 0; b < cl; ++b) hop::st_shared_cluster(smem_u32(dst), b, word[r]);
        }
      }
    }
    // every block's stores into every other's are done before any block reads its signs (or leaves)
    if (cl > 1) hop::cluster_sync();
  }

  for (int kc = 0; kc < nchunks; ++kc) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    {
      const int nk = kc + STAGES - 1;
      if (nk < nchunks) {
        const int st = nk % STAGES;
        if (!FUSED) load_tile<BM, THREADS>(sA + st * A_ST, A, p.lda, m0, p.M, p.KB, nk * CK, tid);
        load_tile<BN, THREADS>(sB + st * B_ST, B, p.ldb, n0, p.N, p.KB, nk * CK, tid);
      }
      cp_async_commit();
    }
    const uint8_t* cA = sA + (FUSED ? kc : kc % STAGES) * A_ST;
    const uint8_t* cB = sB + (kc % STAGES) * B_ST;
    popc_tile<BM, THREADS>(cA, tid, pa);
    if (!PW) popc_tile<BN, THREADS>(cB, tid, pb);
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      uint32_t af[MT][4];
      uint32_t bf[NT][2];
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        const int r = wm * TM + i * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
        const int c = ks * 2 + (lane >> 4);
        ldmatrix_x4(af[i], smem_u32(cA + swz(r, c)));
      }
#pragma unroll
      for (int j = 0; j < NT / 2; ++j) {
        const int r = wn * TN + j * 16 + (lane & 7) + (lane >> 4) * 8;
        const int c = ks * 2 + ((lane >> 3) & 1);
        uint32_t t[4];
        ldmatrix_x4(t, smem_u32(cB + swz(r, c)));
        bf[2 * j][0] = t[0];
        bf[2 * j][1] = t[1];
        bf[2 * j + 1][0] = t[2];
        bf[2 * j + 1][1] = t[3];
      }
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) mma_b1_and(acc[i][j], af[i], bf[j][0], bf[j][1]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();

  popc_finish<BM, THREADS>(s_pa, tid, pa);
  if (PW) {
    const int32_t* pw = p.pw + (int64_t)bz * p.N;
    for (int q = tid; q < BN; q += THREADS) s_pb[q] = (n0 + q < p.N) ? pw[n0 + q] : 0;
  } else {
    popc_finish<BN, THREADS>(s_pb, tid, pb);
  }
  __syncthreads();

  // Epilogue: dot = K - 2 popc(a) - 2 popc(w) + 4 popc(a & w). Scale and
  // bias of the block's columns are staged as float32; each warp stages 16
  // rows of its tile as int32 in (now idle) pipeline shared memory, then
  // writes 8 consecutive outputs per lane (16-byte stores).
  __shared__ float s_scale[BN], s_bias[BN];
  for (int q = tid; q < BN; q += THREADS) {
    const int n = n0 + q;
    s_scale[q] = (p.scale && n < p.N) ? load_f32(p.scale, p.scale_dtype, p.scale_stride * n) : 1.f;
    s_bias[q] = (p.bias && n < p.N) ? load_f32(p.bias, p.bias_dtype, n) : 0.f;
  }
  __syncthreads();
  const int g = lane >> 2, tig = lane & 3;
  OT* out = static_cast<OT*>(p.out) + (int64_t)bz * p.M * p.N;
  constexpr int LDT = TN + 4;
  static_assert(WM * WN * 16 * LDT * 4 <= STAGES * (BM + BN) * CK, "epilogue tile does not fit");
  int* stile = reinterpret_cast<int*>(smem) + warp * 16 * LDT;
  constexpr int LPR = TN / 8;          // lanes per row (8 outputs each)
  constexpr int RPI = 32 / LPR;        // rows per iteration
  const bool vec_ok = (p.N % 8) == 0;
#pragma unroll
  for (int i = 0; i < MT; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rl = wm * TM + i * 16 + g + h * 8;
      const int ka = p.K - 2 * s_pa[rl];
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int cl = wn * TN + j * 8 + tig * 2;
        *reinterpret_cast<int2*>(stile + (g + h * 8) * LDT + j * 8 + tig * 2) =
            make_int2(ka - 2 * s_pb[cl] + 4 * acc[i][j][2 * h], ka - 2 * s_pb[cl + 1] + 4 * acc[i][j][2 * h + 1]);
      }
    }
    __syncwarp();
    const int rbase = m0 + wm * TM + i * 16;
    const int cl0 = wn * TN + (lane % LPR) * 8;
    const int col = n0 + cl0;
#pragma unroll
    for (int r0 = 0; r0 < 16; r0 += RPI) {
      const int r = r0 + lane / LPR;
      const int row = rbase + r;
      if (row < p.M && col < p.N) {
        const int* src = stile + r * LDT + (lane % LPR) * 8;
        OT v[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          if constexpr (std::is_same<OT, int32_t>::value) {  // the raw dot
            v[e] = src[e];
          } else {
            const float y = __fadd_rn(__fmul_rn((float)src[e], s_scale[cl0 + e]), s_bias[cl0 + e]);
            v[e] = from_f32<OT>(y);
          }
        }
        OT* dst = out + (int64_t)row * p.N + col;
        if (vec_ok && col + 8 <= p.N) {
#pragma unroll
          for (int q = 0; q < (int)(8 * sizeof(OT)) / 16; ++q)
            reinterpret_cast<uint4*>(dst)[q] = reinterpret_cast<const uint4*>(v)[q];
        } else {
          for (int e = 0; e < 8 && col + e < p.N; ++e) dst[e] = v[e];
        }
      }
    }
    __syncwarp();
  }
#endif
}

template <void (*KERNEL)(const BinGemvArgs), int THREADS, int SMEM>
static cudaError_t launch_tc_k(const BinGemmArgs& p, dim3 grid, cudaStream_t st) {
  cudaError_t e = bie::set_smem_limit(reinterpret_cast<const void*>(KERNEL), SMEM);
  if (e != cudaSuccess) return e;
  BinGemvArgs g{};
  g.gemm = p;
  KERNEL<<<grid, THREADS, SMEM, st>>>(g);
  BIE_LAUNCH_CHECK();
}

template <int BM, int BN, int WM, int WN, int STAGES, typename OT>
static cudaError_t launch_tc(const BinGemmArgs& p, int batch, cudaStream_t st) {
  constexpr int THREADS = WM * WN * 32;
  constexpr int SMEM = STAGES * (BM + BN) * CK;
  dim3 grid((unsigned)ceil_div(p.M, BM), (unsigned)ceil_div(p.N, BN), (unsigned)batch);
  if (grid.y > 65535u || grid.z > 65535u) return cudaErrorInvalidConfiguration;
  if (p.pw) return launch_tc_k<bgemm_tc_kernel<BM, BN, WM, WN, STAGES, true, OT>, THREADS, SMEM>(p, grid, st);
  return launch_tc_k<bgemm_tc_kernel<BM, BN, WM, WN, STAGES, false, OT>, THREADS, SMEM>(p, grid, st);
}

template <typename OT>
static cudaError_t launch_tile(const BinGemmArgs& p, int batch, int tile, cudaStream_t st) {
  switch (tile) {
    case 1: return launch_tc<16, 64, 1, 4, 4, OT>(p, batch, st);
    case 2: return launch_tc<64, 128, 2, 2, 4, OT>(p, batch, st);
    case 3: return launch_tc<128, 256, 2, 4, 4, OT>(p, batch, st);
    case 4: return launch_tc<128, 256, 4, 4, 4, OT>(p, batch, st);
    case 5: return launch_tc<128, 128, 2, 4, 4, OT>(p, batch, st);
  }
  return cudaErrorInvalidValue;
}

// tile: 0 = choose by shape, 1 = 16x64, 2 = 64x128, 3 = 128x256 (8 warps), 4 = 128x256 (16 warps),
// 5 = 128x128 (8 warps); benchmarks and tests force one
cudaError_t launch_binary_gemm_tc(const BinGemmArgs& p, int batch, int tile, int num_sms, cudaStream_t st) {
  if (p.M == 0 || p.N == 0 || batch == 0) return cudaSuccess;
  if (tile == 0) {
    // 128x128 where it fills the SMs: the fastest tile at 4096^3 (benchmarks/results/cuda_h100.md)
    const int64_t big = (int64_t)ceil_div(p.M, 128) * ceil_div(p.N, 128) * batch;
    if (p.M <= 16) tile = 1;
    else if (p.M >= 256 && big >= num_sms) tile = 5;
    else tile = 2;
  }
  switch (p.out_dtype) {
    case kI32: return launch_tile<int32_t>(p, batch, tile, st);
    case kF32: return launch_tile<float>(p, batch, tile, st);
    case kF16: return launch_tile<__half>(p, batch, tile, st);
    case kBF16: return launch_tile<__nv_bfloat16>(p, batch, tile, st);
  }
  return cudaErrorInvalidValue;
}

// The fused form (binary_linear at 1-32 rows, x taken as it is): 16 or 32 rows a block, 64 weight rows, a 4-stage
// ring for B. Shared memory: all of A's chunks (at least STAGES of them, the space the epilogue stages its tile in)
// and the ring.
constexpr int kFusedBN = 64, kFusedStages = 4;

size_t binary_linear_tc_smem(int M, int K) {
  const int bm = M <= 16 ? 16 : 32;
  const int nchunks = ceil_div(ceil_div(K, 8), CK);
  return (size_t)(std::max(nchunks, kFusedStages) * bm + kFusedStages * kFusedBN) * CK;
}

// cluster: blocks per cluster (1: a plain launch; sm_90: up to 8, the portable most), the grid rounded up to a whole
// number of clusters (a block past N makes its share of the signs and stores nothing)
template <int BM, int WM, int WN, typename OT, typename XT>
static cudaError_t launch_fused(const BinGemvArgs& g, int smem, int cluster, cudaStream_t st) {
  auto kernel = bgemm_tc_kernel<BM, kFusedBN, WM, WN, kFusedStages, true, OT, XT>;
  cudaError_t e = bie::set_smem_limit(reinterpret_cast<const void*>(kernel), smem);
  if (e != cudaSuccess) return e;
  const unsigned blocks = (unsigned)(ceil_div(ceil_div(g.gemm.N, kFusedBN), cluster) * cluster);
  if (cluster == 1) {
    kernel<<<blocks, WM * WN * 32, smem, st>>>(g);
    return cudaGetLastError();
  }
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = (unsigned)cluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.gridDim = dim3(blocks, 1, 1);
  cfg.blockDim = dim3(WM * WN * 32, 1, 1);
  cfg.dynamicSmemBytes = (size_t)smem;
  cfg.stream = st;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, g);
}

template <typename XT, typename OT>
static cudaError_t launch_fused_rows(const BinGemvArgs& g, int smem, int cluster, cudaStream_t st) {
  // 32 rows: eight warps of 16 x 16 (twice the threads of the 16-row form for its sign phase's twice the rows)
  return g.gemm.M <= 16 ? launch_fused<16, 1, 4, OT, XT>(g, smem, cluster, st)
                          : launch_fused<32, 2, 4, OT, XT>(g, smem, cluster, st);
}

template <typename XT>
static cudaError_t launch_fused_x(const BinGemvArgs& g, int smem, int cluster, cudaStream_t st) {
  switch (g.gemm.out_dtype) {
    case kI32: return launch_fused_rows<XT, int32_t>(g, smem, cluster, st);
    case kF32: return launch_fused_rows<XT, float>(g, smem, cluster, st);
    case kF16: return launch_fused_rows<XT, __half>(g, smem, cluster, st);
    case kBF16: return launch_fused_rows<XT, __nv_bfloat16>(g, smem, cluster, st);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_binary_linear_tc(const BinGemvArgs& g, int dtype, int cc_major, cudaStream_t st) {
  const BinGemmArgs& p = g.gemm;
  if (p.M < 1 || p.M > kBinTcFusedMaxM || p.N < 1 || p.K < 1 || p.pw == nullptr) return cudaErrorInvalidValue;
  const size_t smem = binary_linear_tc_smem(p.M, p.K);
  if (smem > (size_t)kBinGemvMaxSmem) return cudaErrorInvalidValue;
  // clusters of up to 8 blocks on sm_90 (a power of two no larger than the blocks there are: the padding blocks of
  // the last cluster only make signs)
  int cluster = 1;
  if (cc_major == 9)
    while (cluster < 8 && 2 * cluster <= ceil_div(p.N, kFusedBN)) cluster *= 2;
  switch (dtype) {
    case kF32: return launch_fused_x<float>(g, (int)smem, cluster, st);
    case kF16: return launch_fused_x<__half>(g, (int)smem, cluster, st);
    case kBF16: return launch_fused_x<__nv_bfloat16>(g, (int)smem, cluster, st);
  }
  return cudaErrorInvalidValue;
}

// ------------------------------------------------ SIMT popcount GEMM (any sm)
// For GPUs without 1-bit MMA. Tile 32x32 outputs, 256 threads (4 outputs each);
// rows staged in shared memory 32 bits at a time, bytes past KB read as 0.
__device__ __forceinline__ uint32_t load_word(const uint8_t* row, int w, int KB) {
  uint32_t v = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int o = w * 4 + j;
    if (o < KB) v |= (uint32_t)row[o] << (8 * j);
  }
  return v;
}

__global__ void __launch_bounds__(256) bgemm_simt_kernel(const BinGemmArgs p) {
  constexpr int T = 32, KW = 16;  // 16 words = 512 signs per step
  __shared__ uint32_t sa[T][KW + 1], sb[T][KW + 1];
  const int tid = threadIdx.x;
  const int m0 = blockIdx.x * T, n0 = blockIdx.y * T, bz = blockIdx.z;
  const uint8_t* A = p.a + bz * p.a_bs;
  const uint8_t* B = p.b + bz * p.b_bs;
  const int tr = tid / 8, tc = (tid % 8) * 4;  // row tr, cols tc..tc+3
  int acc[4] = {0, 0, 0, 0};
  const int nw = (p.KB + 3) / 4;
  for (int w0 = 0; w0 < nw; w0 += KW) {
    for (int q = tid; q < T * KW; q += 256) {
      const int r = q / KW, w = w0 + q % KW;
      sa[r][q % KW] = (m0 + r < p.M && w < nw) ? load_word(A + (int64_t)(m0 + r) * p.lda, w, p.KB) : 0u;
      sb[r][q % KW] = (n0 + r < p.N && w < nw) ? load_word(B + (int64_t)(n0 + r) * p.ldb, w, p.KB) : 0u;
    }
    __syncthreads();
#pragma unroll
    for (int w = 0; w < KW; ++w) {
      const uint32_t a = sa[tr][w];
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[c] += __popc(a ^ sb[tc + c][w]);
    }
    __syncthreads();
  }
  // pad words/bytes are zero in both operands: XOR counts only true positions
  const int row = m0 + tr;
  if (row >= p.M) return;
  const int64_t obase = (int64_t)bz * p.M * p.N + (int64_t)row * p.N;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int col = n0 + tc + c;
    if (col < p.N) store_out(p, obase + col, col, p.K - 2 * acc[c]);
  }
}

cudaError_t launch_binary_gemm_simt(const BinGemmArgs& p, int batch, cudaStream_t st) {
  if (p.M == 0 || p.N == 0 || batch == 0) return cudaSuccess;
  dim3 grid((unsigned)ceil_div(p.M, 32), (unsigned)ceil_div(p.N, 32), (unsigned)batch);
  if (grid.y > 65535u || grid.z > 65535u) return cudaErrorInvalidConfiguration;
  bgemm_simt_kernel<<<grid, 256, 0, st>>>(p);
  BIE_LAUNCH_CHECK();
}

// ------------------------------------------- fused binary GEMV (few rows, sm_80+)
// binary_linear for 1-32 rows in one launch: every block takes the signs of x + shift itself (a thread makes the
// 32-bit word of 32 features of several rows; the sum is rounded to x's dtype first, as the unfused ops round it),
// keeps the rows' words and their popcounts in shared memory, then each warp streams whole weight rows
// (16-byte loads, kGemvCh channels at a time so that their loads are in flight together) and forms
//   dot = 4 popc(x & w) - 2 popc(x) - 2 popc(w) + K
// with popc(w) from the prepared layout. x's pad bits are zero, so the weight's bytes past ceil(K/8) (read up to the
// 16-byte boundary of the row, which the prepared layout holds) never count. No launch for the signs, no buffer for
// them: one launch where the unfused call makes two.
constexpr int kGemvWarps = 8, kGemvCh = 4;

// The sum over a warp's lanes of v[r] for each of the R rows r (R a power of two, 8 to 32), left in lane
// r * (32 / R): recursive halving. Each exchange hands the partner lane the half of the rows it keeps, so the
// R sums cost R - 1 + log2(32 / R) shuffles (9 at 8 rows, 31 at 32) where a reduction per row costs 5 R (40, 160).
template <int C, int R>
__device__ __forceinline__ void halve_rows(int (&v)[R], int lane) {
  if constexpr (C > 1) {
    constexpr int o = 16 * C / R;   // (16 at the first exchange, then 8, ...)
    const bool upper = lane & o;
#pragma unroll
    for (int i = 0; i < C / 2; ++i) {
      const int send = upper ? v[i] : v[C / 2 + i];
      const int keep = upper ? v[C / 2 + i] : v[i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
    }
    halve_rows<C / 2, R>(v, lane);
  }
}

template <int R>
__device__ __forceinline__ int warp_row_sums(int (&v)[R], int lane) {
  halve_rows<R, R>(v, lane);
  int t = v[0];
#pragma unroll
  for (int o = 16 / R; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  return t;   // the sum of row lane / (32 / R), in the lanes that are a multiple of 32 / R
}

// MR: the rows a warp's accumulators hold (8, 16 or 32; M <= MR).
template <typename T, int MR>
__global__ void __launch_bounds__(kGemvWarps * 32) binary_gemv_kernel(const BinGemvArgs g) {
  const BinGemmArgs& p = g.gemm;
  extern __shared__ __align__(16) uint32_t xw[];   // [M][KW4 * 4] sign words, then [M] popcounts
  const int KW = (p.K + 31) >> 5, KC = (KW + 3) >> 2;   // words of a row, 16-byte chunks of a row
  int* popx = reinterpret_cast<int*>(xw + (size_t)p.M * KC * 4);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x < p.M) popx[threadIdx.x] = 0;
  __syncthreads();
  const T* x = static_cast<const T*>(g.x);
  const T* sh = static_cast<const T*>(g.shift);
  // the sign words (sign_words: all of a thread's loads in flight together)
  constexpr int RB = sign_rows<T>();
  const int KW4 = KC * 4;                         // words of a row in shared memory (zero past K)
  const int items = (p.M + RB - 1) / RB * KW4;
  const bool vec = sign_words_vec<T>(x, sh, p.K);
  for (int base = 0; base < items; base += kGemvWarps * 32) {
    const int it = min(base + (int)threadIdx.x, items - 1);
    const int rb = it / KW4, m0 = rb * RB;
    const int64_t k0 = (int64_t)(it - rb * KW4) * 32;
    uint32_t word[RB];
    sign_words<T, RB>(x, sh, p.M, p.K, m0, k0, vec, base + (int)threadIdx.x < items, word);
    const bool mine = base + (int)threadIdx.x < items;
#pragma unroll
    for (int r = 0; r < RB; ++r)
      if (mine && m0 + r < p.M) xw[(size_t)(m0 + r) * KW4 + (it - rb * KW4)] = word[r];
    // the rows' popcounts: a warp's items mostly share their rows (a row holds KW4 words)
    const int rb0 = __shfl_sync(0xffffffffu, rb, 0);
    const bool one = __all_sync(0xffffffffu, rb == rb0 || !mine);
#pragma unroll
    for (int r = 0; r < RB; ++r) {
      int cnt = mine ? __popc(word[r]) : 0;
      if (one) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) cnt += __shfl_xor_sync(0xffffffffu, cnt, o);
        if (lane == 0 && cnt) atomicAdd(&popx[rb0 * RB + r], cnt);
      } else if (cnt) {
        atomicAdd(&popx[m0 + r], cnt);
      }
    }
  }
  __syncthreads();

  const uint4* xs = reinterpret_cast<const uint4*>(xw);
  const int64_t groups = (p.N + kGemvCh - 1) / kGemvCh;
  for (int64_t grp = (int64_t)blockIdx.x * kGemvWarps + warp; grp < groups; grp += (int64_t)gridDim.x * kGemvWarps) {
    const int n0 = (int)(grp * kGemvCh);
    int acc[kGemvCh][MR];
#pragma unroll
    for (int c = 0; c < kGemvCh; ++c)
#pragma unroll
      for (int m = 0; m < MR; ++m) acc[c][m] = 0;
    for (int q = lane; q < KC; q += 32) {
      uint4 wv[kGemvCh];
#pragma unroll
      for (int c = 0; c < kGemvCh; ++c) {
        const int n = min(n0 + c, p.N - 1);   // (a channel past N repeats the last one; it is not stored)
        wv[c] = __ldg(reinterpret_cast<const uint4*>(p.b + (int64_t)n * p.ldb) + q);
      }
#pragma unroll
      for (int m = 0; m < MR; ++m) {
        if (m < p.M) {
          const uint4 a = xs[(size_t)m * KC + q];
#pragma unroll
          for (int c = 0; c < kGemvCh; ++c)
            acc[c][m] += __popc(a.x & wv[c].x) + __popc(a.y & wv[c].y) + __popc(a.z & wv[c].z) + __popc(a.w & wv[c].w);
        }
      }
    }
#pragma unroll
    for (int c = 0; c < kGemvCh; ++c) {
      const int n = n0 + c;
      const int v = warp_row_sums<MR>(acc[c], lane);
      const int m = lane / (32 / MR);
      if (lane % (32 / MR) == 0 && m < p.M && n < p.N)
        store_out(p, (int64_t)m * p.N + n, n, 4 * v - 2 * popx[m] - 2 * p.pw[n] + p.K);
    }
  }
}

size_t binary_gemv_smem(int M, int K) {
  const int KC = ((K + 31) / 32 + 3) / 4;
  return (size_t)M * KC * 16 + (size_t)M * 4;
}

template <typename T, int MR>
static cudaError_t launch_gemv_rows(const BinGemvArgs& g, unsigned grid, size_t smem, cudaStream_t st) {
  auto kernel = binary_gemv_kernel<T, MR>;
  if (smem > 48 * 1024) {   // past the default limit: the kernel's opt-in (once per kernel and size: set_smem_limit)
    const cudaError_t e = bie::set_smem_limit(reinterpret_cast<const void*>(kernel), (int)smem);
    if (e != cudaSuccess) return e;
  }
  kernel<<<grid, kGemvWarps * 32, smem, st>>>(g);
  return cudaGetLastError();
}

template <typename T>
static cudaError_t launch_gemv_typed(const BinGemvArgs& g, unsigned grid, size_t smem, cudaStream_t st) {
  const int M = g.gemm.M;
  return M <= 8 ? launch_gemv_rows<T, 8>(g, grid, smem, st)
       : M <= 16 ? launch_gemv_rows<T, 16>(g, grid, smem, st)
                 : launch_gemv_rows<T, 32>(g, grid, smem, st);
}

cudaError_t launch_binary_gemv(const BinGemvArgs& g, int dtype, int num_sms, cudaStream_t st) {
  const BinGemmArgs& p = g.gemm;
  if (p.M < 1 || p.M > kBinGemvMaxM || p.N < 1 || p.K < 1 || p.K > kBinGemvMaxK || p.pw == nullptr)
    return cudaErrorInvalidValue;
  const size_t smem = binary_gemv_smem(p.M, p.K);
  if (smem > (size_t)kBinGemvMaxSmem) return cudaErrorInvalidValue;
  const int64_t groups = ((int64_t)p.N + kGemvCh - 1) / kGemvCh;
  // a warp per group of kGemvCh channels, at most 4 blocks per SM: more channels a warp past that
  const int64_t want = (groups + kGemvWarps - 1) / kGemvWarps;
  const unsigned grid = (unsigned)std::max<int64_t>(1, std::min<int64_t>(want, (int64_t)num_sms * 4));
  switch (dtype) {
    case kF32: return launch_gemv_typed<float>(g, grid, smem, st);
    case kF16: return launch_gemv_typed<__half>(g, grid, smem, st);
    case kBF16: return launch_gemv_typed<__nv_bfloat16>(g, grid, smem, st);
    default: return cudaErrorInvalidValue;
  }
}

// ------------------------------------------------------------ sign embedding
// out[l, j] = scale[i] * (bit j of row i ? +1 : -1), i = idx[l]. An index
// outside [0, V) cannot be checked without a host sync: its row is written as
// NaN and nothing outside the tables is read.
template <typename T, typename I>
__global__ void sign_embedding_kernel(const I* __restrict__ idx, const uint8_t* __restrict__ bits, int64_t ldb,
                                      const void* scale, int scale_dtype, int64_t V, int64_t L, int64_t dim,
                                      T* __restrict__ out) {
  const int64_t total = L * dim;
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x) {
    const int64_t l = t / dim, j = t - l * dim;
    const int64_t i = (int64_t)idx[l];
    float v;
    if (i < 0 || i >= V) {
      v = __int_as_float(0x7fc00000);
    } else {
      const float s = load_f32(scale, scale_dtype, i);
      v = ((bits[i * ldb + (j >> 3)] >> (j & 7)) & 1) ? s : -s;
    }
    out[t] = from_f32<T>(v);
  }
}

template <typename I>
static cudaError_t launch_emb_i(const void* idx, const uint8_t* bits, int64_t ldb, const void* scale, int scale_dtype,
                                int64_t V, int64_t L, int64_t dim, void* out, int dtype, cudaStream_t st) {
  const int64_t total = L * dim;
  if (total == 0) return cudaSuccess;
  const int threads = 256;
  const unsigned blocks = (unsigned)std::min<int64_t>((total + threads - 1) / threads, 65536);
  const I* ix = static_cast<const I*>(idx);
  switch (dtype) {
    case kF32:
      sign_embedding_kernel<float, I><<<blocks, threads, 0, st>>>(ix, bits, ldb, scale, scale_dtype, V, L, dim, (float*)out);
      break;
    case kF16:
      sign_embedding_kernel<__half, I><<<blocks, threads, 0, st>>>(ix, bits, ldb, scale, scale_dtype, V, L, dim, (__half*)out);
      break;
    case kBF16:
      sign_embedding_kernel<__nv_bfloat16, I>
          <<<blocks, threads, 0, st>>>(ix, bits, ldb, scale, scale_dtype, V, L, dim, (__nv_bfloat16*)out);
      break;
    default: return cudaErrorInvalidValue;
  }
  BIE_LAUNCH_CHECK();
}

cudaError_t launch_sign_embedding(const void* idx, bool idx64, const uint8_t* bits, int64_t ldb, const void* scale,
                                  int scale_dtype, int64_t V, int64_t L, int64_t dim, void* out, int dtype,
                                  cudaStream_t st) {
  return idx64 ? launch_emb_i<int64_t>(idx, bits, ldb, scale, scale_dtype, V, L, dim, out, dtype, st)
               : launch_emb_i<int32_t>(idx, bits, ldb, scale, scale_dtype, V, L, dim, out, dtype, st);
}

// Majority vote over the L rows of each bag: +1 where 2 * ones >= L. A bag
// with an index outside [0, V) gets NaN (see above).
template <typename T, typename I>
__global__ void sign_bag_kernel(const I* __restrict__ idx, const uint8_t* __restrict__ bits, int64_t ldb, int64_t V,
                                int64_t nbags, int64_t L, int64_t dim, T* __restrict__ out) {
  const int64_t total = nbags * dim;
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x) {
    const int64_t bag = t / dim, j = t - bag * dim;
    int64_t ones = 0;
    bool bad = false;
    for (int64_t l = 0; l < L; ++l) {
      const int64_t i = (int64_t)idx[bag * L + l];
      if (i < 0 || i >= V) { bad = true; break; }
      ones += (bits[i * ldb + (j >> 3)] >> (j & 7)) & 1;
    }
    const float v = bad ? __int_as_float(0x7fc00000) : (2 * ones >= L ? 1.f : -1.f);
    out[t] = from_f32<T>(v);
  }
}

template <typename I>
static cudaError_t launch_bag_i(const void* idx, const uint8_t* bits, int64_t ldb, int64_t V, int64_t nbags, int64_t L,
                                int64_t dim, void* out, int dtype, cudaStream_t st) {
  const int64_t total = nbags * dim;
  if (total == 0) return cudaSuccess;
  const int threads = 256;
  const unsigned blocks = (unsigned)std::min<int64_t>((total + threads - 1) / threads, 65536);
  const I* ix = static_cast<const I*>(idx);
  switch (dtype) {
    case kF32: sign_bag_kernel<float, I><<<blocks, threads, 0, st>>>(ix, bits, ldb, V, nbags, L, dim, (float*)out); break;
    case kF16: sign_bag_kernel<__half, I><<<blocks, threads, 0, st>>>(ix, bits, ldb, V, nbags, L, dim, (__half*)out); break;
    case kBF16:
      sign_bag_kernel<__nv_bfloat16, I><<<blocks, threads, 0, st>>>(ix, bits, ldb, V, nbags, L, dim, (__nv_bfloat16*)out);
      break;
    default: return cudaErrorInvalidValue;
  }
  BIE_LAUNCH_CHECK();
}

cudaError_t launch_sign_embedding_bag(const void* idx, bool idx64, const uint8_t* bits, int64_t ldb, int64_t V,
                                      int64_t nbags, int64_t L, int64_t dim, void* out, int dtype, cudaStream_t st) {
  return idx64 ? launch_bag_i<int64_t>(idx, bits, ldb, V, nbags, L, dim, out, dtype, st)
               : launch_bag_i<int32_t>(idx, bits, ldb, V, nbags, L, dim, out, dtype, st);
}

// popcount of each row (prepare-time helper for weights): rows x KB bytes.
__global__ void row_popc_kernel(const uint8_t* __restrict__ b, int64_t ldb, int64_t rows, int64_t KB,
                                int32_t* __restrict__ out) {
  const int64_t r = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
  if (r >= rows) return;
  const int lane = threadIdx.x & 31;
  int s = 0;
  for (int64_t o = lane; o < KB; o += 32) s += __popc((uint32_t)b[r * ldb + o]);
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) s += __shfl_xor_sync(0xffffffffu, s, d);
  if (lane == 0) out[r] = s;
}

cudaError_t launch_row_popc(const uint8_t* b, int64_t ldb, int64_t rows, int64_t KB, int32_t* out, cudaStream_t st) {
  if (rows == 0) return cudaSuccess;
  const unsigned blocks = (unsigned)((rows + 7) / 8);
  row_popc_kernel<<<blocks, 256, 0, st>>>(b, ldb, rows, KB, out);
  BIE_LAUNCH_CHECK();
}

}  // namespace bie
