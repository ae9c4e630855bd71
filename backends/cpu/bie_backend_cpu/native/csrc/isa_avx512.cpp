// AVX-512 variant (F, BW, VL, DQ: Skylake-SP and later, Zen 4): sign packing,
// quantization and int GEMM with int16 multiply-add on 512-bit vectors.
// Binary GEMM on such CPUs without VPOPCNTDQ uses the AVX2 variant.
#include <stdint.h>
#include "bie_native.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#include "isa_target.h"

BIE_ISA_BEGIN(BIE_ISA_AVX512)

namespace {
#include "scalar_util.h"
#include "prim_avx512.h"

#define BIE_WITH_PACK 1
#define BIE_WITH_BINARY 0
#define BIE_WITH_INT 1

// int tile: int16 pairs (vpmaddwd, exact: no saturation), panels of 16 columns
#define IMR 4
#define INR 4
#define IPW 16
#define IKSTEP 2
#define IBSIZE 2
#define IVNNI 0
typedef int16_t iscalar_t;
#define IVEC __m512i
#define IVEC_ZERO() _mm512_setzero_si512()
#define IVEC_LOAD(p) _mm512_loadu_si512(p)
#define IVEC_SET1(w) _mm512_set1_epi32(w)
#define IVEC_DOT(acc, a, b) _mm512_add_epi32(acc, _mm512_madd_epi16(a, b))
#define IVEC_STORE(p, v) _mm512_storeu_si512(p, v)
#include "itile_simd.h"

#include "drivers.h"
}  // namespace

BIE_EXPORT(avx512, pack)
BIE_EXPORT(avx512, bconv_pack)
BIE_EXPORT(avx512, quant)
BIE_EXPORT(avx512, lsq)
BIE_EXPORT(avx512, igemm)
BIE_EXPORT(avx512, dquant)
BIE_EXPORT(avx512, iconv)
BIE_EXPORT(avx512, semb)

BIE_ISA_END
#endif  // x86-64
