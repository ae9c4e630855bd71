// Direct binary conv2d on the 1-bit tensor cores (implicit GEMM, sm_80+), for groups == 1.
//
// out[n, o, ho, wo] = sum over (c, r, s) of sgn(xpad[n, c, ho*SH + r*DH, wo*SW + s*DW]) * W[o, c, r, s]
// with xpad = x padded by the pad value (-1, +1 or 0), then float32(dot) * scale + bias in the output dtype.
//
// Two kernels, no im2col buffer:
//  1. bconv_pack: x (any strides: NCHW, channels_last, views; float32/float16/bfloat16/int8) -> the sign words
//     of the padded input, [N][Hp][Wp][CW] uint32 (bit b of word cw: channel 32*cw + b, 1 = +1; bits past C are
//     0), the padding ring holding the pad value's bits (pad 0: 0 bits), and per padded pixel its number of +1
//     channels (ppop). One read of x, 1/16 of it written back (bf16).
//  2. bconv_mma: a GEMM whose rows are output pixels and columns output channels; K runs over (tap, channel
//     word). Row p's K word q sits at packed[base(p) + delta[q]] (delta: a per-word table in shared memory), so
//     the A fragments of mma.m16n8k256.and.popc are read straight from global memory (a window is a few cache
//     lines, shared by neighbouring pixels and taps through L1). A chunk of weights [BN channels][KC words] is
//     staged in shared memory. The ±1 dot product comes from AND counts (XOR+popc is emulated on sm_90):
//         dot = 4 popc(a & w) - 2 popc(a) - 2 popc(w over the valid taps) + K_valid
//     popc(a) of a window = the sum of its taps' ppop; with pad 0 the taps that fall in the padding count neither
//     in popc(w) (a per-tap table of weight popcounts) nor in K_valid. The tile is scaled, biased and staged in
//     shared memory as [channel][pixel], then written as NCHW rows (consecutive threads, consecutive pixels).
#include "common.cuh"

namespace bie {
namespace {

constexpr int kConvBM = 128;              // output pixels per block: 4 warps x 32 (two m16 tiles each)
constexpr int kConvThreads = 128;
constexpr int kStageLd = kConvBM + 4;     // staging row (floats): +4 makes the fragment writes conflict-free

// ------------------------------------------------------------------ packing
template <typename T>
__device__ __forceinline__ bool sign_bit(T v) { return to_f32(v) >= 0.f; }   // sgn(0) = +1, NaN -> -1
template <>
__device__ __forceinline__ bool sign_bit<int8_t>(int8_t v) { return v >= 0; }

// block (32, 8): 32 consecutive padded pixels (lanes: consecutive w, so NCHW reads coalesce) x the channel words
template <typename T>
__global__ void __launch_bounds__(256) bconv_pack_kernel(BinConvArgs p) {
  __shared__ int s_pop[8][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t npix = (int64_t)p.N * p.Hp * p.Wp;
  const int64_t pix = (int64_t)blockIdx.x * 32 + tx;
  int pop = 0;
  if (pix < npix) {
    const int wq = (int)(pix % p.Wp);
    const int64_t t = pix / p.Wp;
    const int hq = (int)(t % p.Hp);
    const int n = (int)(t / p.Hp);
    const int h = hq - p.PH, w = wq - p.PW;
    const bool inside = h >= 0 && h < p.H && w >= 0 && w < p.W;
    const T* x = static_cast<const T*>(p.x) + (inside ? n * p.sn + h * p.sh + w * p.sw : 0);
    uint32_t* dst = p.packed + pix * p.CW;
    for (int cw = ty; cw < p.CW; cw += 8) {
      const int nb = min(32, p.C - cw * 32);   // channels in this word
      uint32_t word = 0;
      if (inside) {
        const T* xc = x + (int64_t)cw * 32 * p.sc;
#pragma unroll
        for (int b = 0; b < 32; ++b)
          if (b < nb) word |= (uint32_t)sign_bit(xc[b * p.sc]) << b;
      } else if (p.pad_mode == 1) {
        word = nb == 32 ? ~0u : ((1u << nb) - 1u);
      }
      dst[cw] = word;
      pop += __popc(word);
    }
  }
  s_pop[ty][tx] = pop;
  __syncthreads();
  if (ty == 0 && pix < npix) {
    int sum = 0;
#pragma unroll
    for (int y = 0; y < 8; ++y) sum += s_pop[y][tx];
    p.ppop[pix] = sum;
  }
}

// --------------------------------------------------------------------- conv
__device__ __forceinline__ void mma_b1(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k256.row.col.s32.b1.b1.s32.and.popc "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Shared memory (dynamic): delta[KWP] | per-pixel popc(a), invalid-tap mask, output offset [BM] each |
// per-channel popc(w), scale, bias [BN] each | union { weights [BN][kc + 4] words, staging [BN][kStageLd] floats }.
// A weight row of kc + 4 words (kc % 8 == 0) puts the 8 channels x 4 words of a B fragment in 32 distinct banks.
template <int NT>
__global__ void __launch_bounds__(kConvThreads, 4) bconv_mma_kernel(BinConvArgs p, int kc) {
  constexpr int BN = NT * 8;
  extern __shared__ __align__(16) unsigned char smem[];
  int* s_delta = reinterpret_cast<int*>(smem);
  int* s_popa = s_delta + p.KWP;
  uint32_t* s_inv = reinterpret_cast<uint32_t*>(s_popa + kConvBM);
  int64_t* s_obase = reinterpret_cast<int64_t*>(s_inv + kConvBM);   // KWP % 8 == 0 keeps this 8-byte aligned
  int* s_wpop = reinterpret_cast<int*>(s_obase + kConvBM);
  float* s_scale = reinterpret_cast<float*>(s_wpop + BN);
  float* s_bias = s_scale + BN;
  uint32_t* s_w = reinterpret_cast<uint32_t*>(s_bias + BN);          // 16-byte aligned: see conv_smem_bytes
  float* s_out = reinterpret_cast<float*>(s_w);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gid = lane >> 2, tig = lane & 3;
  const int P = p.Ho * p.Wo;
  const int64_t npix = (int64_t)p.N * P;
  const int64_t p0 = (int64_t)blockIdx.x * kConvBM;
  const int o0 = blockIdx.y * BN;
  const int taps = p.KH * p.KW;

  // K word -> offset (words) from a window's first word; the padding words past K read word 0 of the window
  // (their weight bits are 0, and popc(a) comes from ppop, so what they read never counts)
  for (int q = tid; q < p.KWP; q += kConvThreads) {
    int d = 0;
    if (q < p.KWORDS) {
      const int t = q / p.CW, cw = q - t * p.CW;
      const int r = t / p.KW, s = t - r * p.KW;
      d = (r * p.DH * p.Wp + s * p.DW) * p.CW + cw;
    }
    s_delta[q] = d;
  }
  // per pixel: popc of its window, the taps in the padding (pad 0 only), its NCHW output offset
  {
    const int64_t pix = p0 + tid;
    int popa = 0;
    uint32_t inv = 0;
    int64_t ob = -1;
    if (pix < npix) {
      const int n = (int)(pix / P), rem = (int)(pix - (int64_t)n * P);
      const int ho = rem / p.Wo, wo = rem - ho * p.Wo;
      const int64_t pb = ((int64_t)n * p.Hp + ho * p.SH) * p.Wp + wo * p.SW;
      for (int r = 0; r < p.KH; ++r) {
        const int hh = ho * p.SH + r * p.DH - p.PH;
        for (int s = 0; s < p.KW; ++s) {
          popa += __ldg(p.ppop + pb + r * p.DH * p.Wp + s * p.DW);
          const int ww = wo * p.SW + s * p.DW - p.PW;
          if (p.pad_mode == 2 && (hh < 0 || hh >= p.H || ww < 0 || ww >= p.W)) inv |= 1u << (r * p.KW + s);
        }
      }
      ob = (int64_t)n * p.O * P + rem;
    }
    s_popa[tid] = popa;
    s_inv[tid] = inv;
    s_obase[tid] = ob;
  }
  for (int j = tid; j < BN; j += kConvThreads) {
    const int o = o0 + j;
    s_wpop[j] = o < p.O ? __ldg(p.wpop + o) : 0;
    s_scale[j] = (p.scale && o < p.O) ? load_f32(p.scale, p.scale_dtype, p.scale_stride * o) : 1.f;
    s_bias[j] = (p.bias && o < p.O) ? load_f32(p.bias, p.bias_dtype, o) : 0.f;
  }

  // this thread's four A rows (pixels warp*32 + mt*16 + gid + 8h): word offset of each window's first word
  int base[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t pix = p0 + warp * 32 + mt * 16 + gid + 8 * h;
      int b = 0;
      if (pix < npix) {
        const int n = (int)(pix / P), rem = (int)(pix - (int64_t)n * P);
        const int ho = rem / p.Wo, wo = rem - ho * p.Wo;
        b = (int)((((int64_t)n * p.Hp + ho * p.SH) * p.Wp + wo * p.SW) * p.CW);
      }
      base[mt][h] = b;
    }

  int acc[2][NT][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0;

  const uint32_t* __restrict__ packed = p.packed;
  const int ldw = kc + 4;
  for (int k0 = 0; k0 < p.KWP; k0 += kc) {
    const int kn = min(kc, p.KWP - k0);
    __syncthreads();   // the previous chunk's readers are done (and the tables above are written)
    const int v4 = kn / 4;
    for (int i = tid; i < BN * v4; i += kConvThreads) {
      const int row = i / v4, c4 = i - row * v4;
      const int o = o0 + row;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (o < p.O) v = __ldg(reinterpret_cast<const uint4*>(p.wp + (int64_t)o * p.KWP + k0) + c4);
      *reinterpret_cast<uint4*>(s_w + row * ldw + c4 * 4) = v;
    }
    __syncthreads();
#pragma unroll 2
    for (int s = 0; s < kn; s += 8) {
      const int d0 = s_delta[k0 + s + tig], d1 = s_delta[k0 + s + tig + 4];
      uint32_t a[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        a[mt][0] = __ldg(packed + base[mt][0] + d0);
        a[mt][1] = __ldg(packed + base[mt][1] + d0);
        a[mt][2] = __ldg(packed + base[mt][0] + d1);
        a[mt][3] = __ldg(packed + base[mt][1] + d1);
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint32_t* wr = s_w + (nt * 8 + gid) * ldw + s + tig;
        const uint32_t b0 = wr[0], b1 = wr[4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) mma_b1(acc[mt][nt], a[mt], b0, b1);
      }
    }
  }
  __syncthreads();   // the weight chunk's space becomes the output staging tile

  // epilogue: dot -> value, staged as [channel][pixel]
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp * 32 + mt * 16 + gid + 8 * h;
      const int popa = s_popa[row];
      const uint32_t inv = s_inv[row];
      const int kv = p.K - (p.pad_mode == 2 ? __popc(inv) * p.C : 0);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int col = nt * 8 + 2 * tig + j;
          int wv = s_wpop[col];
          if (inv && o0 + col < p.O)
            for (uint32_t m = inv; m; m &= m - 1) wv -= __ldg(p.wtap + (int64_t)(o0 + col) * taps + (__ffs(m) - 1));
          const int dot = 4 * acc[mt][nt][2 * h + j] - 2 * popa - 2 * wv + kv;
          float y;
          if (p.out_dtype == kI32) {
            y = __int_as_float(dot);
          } else {
            // float32(dot) * float32(scale) + float32(bias): two roundings, like the reference
            y = (float)dot;
            if (p.scale) y = __fmul_rn(y, s_scale[col]);
            if (p.bias) y = __fadd_rn(y, s_bias[col]);
          }
          s_out[col * kStageLd + row] = y;
        }
    }
  __syncthreads();

  // NCHW rows: thread tid writes pixel p0 + tid of every channel of the tile
  const int64_t ob = s_obase[tid];
  if (ob >= 0) {
    const int ncol = min(BN, p.O - o0);
    for (int col = 0; col < ncol; ++col) {
      const float y = s_out[col * kStageLd + tid];
      const int64_t off = ob + (int64_t)(o0 + col) * P;
      switch (p.out_dtype) {
        case kI32: static_cast<int32_t*>(p.out)[off] = __float_as_int(y); break;
        case kF32: static_cast<float*>(p.out)[off] = y; break;
        case kF16: static_cast<__half*>(p.out)[off] = __float2half_rn(y); break;
        default: static_cast<__nv_bfloat16*>(p.out)[off] = __float2bfloat16_rn(y); break;
      }
    }
  }
}

}  // namespace

int conv_chunk_words(int kwp) { return std::min(kwp, kConvMaxChunk); }

size_t conv_smem_bytes(int kwp, int bn) {
  const int kc = conv_chunk_words(kwp);
  const size_t tables = (size_t)kwp * 4 + kConvBM * (4 + 4 + 8) + (size_t)bn * 12;
  const size_t tile = std::max((size_t)bn * (kc + 4) * 4, (size_t)bn * kStageLd * 4);
  return ((tables + 15) / 16) * 16 + tile;
}

cudaError_t launch_bconv_pack(const BinConvArgs& p, cudaStream_t st) {
  const int64_t npix = (int64_t)p.N * p.Hp * p.Wp;
  const dim3 grid((unsigned)((npix + 31) / 32)), block(32, 8);
  switch (p.x_dtype) {
    case kF32: bconv_pack_kernel<float><<<grid, block, 0, st>>>(p); break;
    case kF16: bconv_pack_kernel<__half><<<grid, block, 0, st>>>(p); break;
    case kBF16: bconv_pack_kernel<__nv_bfloat16><<<grid, block, 0, st>>>(p); break;
    case kI8: bconv_pack_kernel<int8_t><<<grid, block, 0, st>>>(p); break;
    default: return cudaErrorInvalidValue;
  }
  BIE_LAUNCH_CHECK();
}

cudaError_t launch_bconv(const BinConvArgs& p, int bn, cudaStream_t st) {
  const int64_t npix = (int64_t)p.N * p.Ho * p.Wo;
  const int kc = conv_chunk_words(p.KWP);
  const size_t smem = conv_smem_bytes(p.KWP, bn);
  const dim3 grid((unsigned)((npix + kConvBM - 1) / kConvBM), (unsigned)((p.O + bn - 1) / bn));
  auto run = [&](auto kernel) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    kernel<<<grid, kConvThreads, smem, st>>>(p, kc);
    return cudaGetLastError();
  };
  if (bn == 32) return run(bconv_mma_kernel<4>);
  if (bn == 64) return run(bconv_mma_kernel<8>);
  return cudaErrorInvalidValue;
}

}  // namespace bie
