// The x86-64 instruction-set levels of the vector variants, and the pragmas that compile a
// stretch of code for one of them: BIE_ISA_BEGIN(BIE_ISA_AVX2) ... BIE_ISA_END. A variant file
// brackets its kernels (the shared headers it includes among them) with the pair, so only its
// own functions use the level's instructions and the rest of the library stays baseline code
// (binding.cpp picks a variant at run time from the CPU's features).
#pragma once

#define BIE_ISA_AVX2 "avx2,fma,f16c,popcnt,bmi,bmi2"
#define BIE_ISA_AVX512 "avx2,fma,f16c,popcnt,bmi,bmi2,avx512f,avx512bw,avx512vl,avx512dq"
#define BIE_ISA_AVX512ICL \
  "avx2,fma,f16c,popcnt,bmi,bmi2,avx512f,avx512bw,avx512vl,avx512dq,avx512vpopcntdq,avx512vnni"
#define BIE_ISA_AVX512BF16 "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16"

// (two steps, so that a level's name is replaced by its string before the pragma text is quoted)
#define BIE_PRAGMA_TEXT(text) _Pragma(#text)
#define BIE_PRAGMA(text) BIE_PRAGMA_TEXT(text)
#if defined(__clang__)
#define BIE_ISA_BEGIN(level) BIE_PRAGMA(clang attribute push(__attribute__((target(level))), apply_to = function))
#define BIE_ISA_END BIE_PRAGMA(clang attribute pop)
#else
#define BIE_ISA_BEGIN(level) BIE_PRAGMA(GCC push_options) BIE_PRAGMA(GCC target(level))
#define BIE_ISA_END BIE_PRAGMA(GCC pop_options)
#endif
