// bie-backend-cutlass, weight-only family: the memory layout of the weight codes
// (shared by the GEMM and the kernel that writes the layout at prepare time).
#pragma once
#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>
#include <cutlass/gemm/gemm.h>

namespace bie_wq {
using namespace cute;

// The weight's code type, and where the codes of one warp's wgmma A fragment go in memory.
//
// With A from registers, wgmma gives each warp a 16 x 16 (channel x k) block per k16 step;
// lane 4*(m%8) + (k%8)/2 holds its values v = k%2 + 2*(m/8) + 4*(k/8) (the m16n8k16 A
// fragment). Stored in plain K-major order, a thread's 8 codes are 4 separate pairs; the
// atoms below store them contiguously at 8*lane + pos(v), so one 32-bit (4-bit codes) or
// 64-bit (8-bit codes) shared-memory load fetches them. For 4-bit codes pos(v) = v/2 +
// 4*(v%2): the even values in the low nibbles, the odd ones in the high nibbles, which is
// the order CUTLASS's shift-free int4 -> 16-bit conversion takes. With m = m0 + 8*m1 and
// k = k0 + 2*k1 + 8*k2 the offsets are linear in the digits, hence these static layouts.
// (CUTLASS's collective builds its TMA and shared-memory layouts from the gmem layout, so
// any bijective layout is computed correctly; this one is the fast one.)
template <int Bits> struct Quant;
template <> struct Quant<4> {
  using T = cutlass::int4b_t;
  using Atom = Layout<Shape<Shape<_8, _2>, Shape<_2, _4, _2>>, Stride<Stride<_32, _1>, Stride<_4, _8, _2>>>;
};
template <> struct Quant<8> {
  using T = int8_t;
  using Atom = Layout<Shape<Shape<_8, _2>, Shape<_2, _4, _2>>, Stride<Stride<_32, _2>, Stride<_1, _8, _4>>>;
};

// The layout of A (n_out, K, 1): 16 x 16 atoms, tiled along the channels first.
template <int Bits>
struct ReorderedA {
  using StrideA = cutlass::detail::TagToStrideA_t<cutlass::layout::RowMajor>;
  using Atom = typename Quant<Bits>::Atom;
  using Type = decltype(tile_to_shape(Atom{}, Layout<Shape<int, int, int>, StrideA>{}));
  static CUTE_HOST_DEVICE Type make(int n_out, int k) { return tile_to_shape(Atom{}, make_shape(n_out, k, 1)); }
};

}  // namespace bie_wq
