// bie-backend-cutlass, integer family: the true IEEE division x / s of the quantizers, for many x and one s.
//
// __fdiv_rn(x, s) per element is a reciprocal estimate, four FMAs, a range check and a guarded slow-path
// call (about ten instructions with its branch): the largest part of the quantize and LSQ kernels'
// instruction count, which bounds them. With the correctly rounded reciprocal r = RN(1/s) computed once,
// q = RN(x * r) is within 1.5 ulp of x / s, the remainder x - q * s is exact in one FMA, and
// RN(q + rem * r) is the correctly rounded quotient (Markstein's correction step; the same sequence
// __fdiv_rn runs after its own reciprocal refinement) while x / s stays in the normal range. Outside it:
//   * s with |s| outside [2^-100, 2^100] (r or the products could leave the normal range): __fdiv_rn;
//   * x = +-inf (or x * r overflowing): the remainder is NaN and q (+-inf) is the quotient's rounding
//     (for a finite x whose quotient rounds just below the overflow, +-inf instead of +-FLT_MAX: both
//     clamp to the same code, and are outside the clip range alike);
//   * a quotient in the subnormal range (|x / s| < 2^-126) may differ in its last bit: far below 0.5, its
//     code is 0 and it is inside the clip range either way.
// So every code and clip decision equals the IEEE division's; tests compare with the reference's true
// division on random values over the whole exponent range, ties and specials.
#pragma once

#include <cuda_runtime.h>

namespace bie_int {

struct Divider {
  float s, r;
  bool fast;
};

__device__ __forceinline__ Divider make_divider(float s) {
  Divider d;
  d.s = s;
  d.r = __fdiv_rn(1.0f, s);
  const float as = fabsf(s);
  d.fast = as >= 0x1p-100f && as <= 0x1p100f;
  return d;
}

__device__ __forceinline__ float divide(float x, const Divider& d) {
  if (!d.fast) return __fdiv_rn(x, d.s);
  const float q = __fmul_rn(x, d.r);
  const float rem = __fmaf_rn(-q, d.s, x);
  const float q2 = __fmaf_rn(rem, d.r, q);
  return q2 != q2 ? q : q2;
}

}  // namespace bie_int
