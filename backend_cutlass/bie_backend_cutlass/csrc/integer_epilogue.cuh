// bie-backend-cutlass, integer family: the epilogue visitor tree of the int8 GEMM and the implicit-GEMM conv,
// fused into their TMA store (one definition, so both compute the same values bit for bit):
//   int32 out:  D = acc
//   float out:  D = cvt(float(acc) * scale[n] + bias[n])        (scale scalar or per column / output channel)
// The product and the sum each round to float32, as the ops define it (bie_core ops/_common.py scaled_epilogue, and
// bie-backend-cuda's epilogues): a fused multiply-add rounds once and gives another value for about one output in
// 50,000 after the cast to bf16.
#pragma once
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/array.h>
#include <cutlass/functional.h>
#include <cutlass/epilogue/thread/activation.h>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>

namespace bie_int {

// Element-wise float32 multiply / add, each rounded once (the compute nodes' functors: a scalar form for
// Sm90Compute's argument probe, an array form for its fragments).
template <class T> struct MulRn {
  CUTLASS_HOST_DEVICE T operator()(T a, T b) const { return a * b; }
};
template <int N> struct MulRn<cutlass::Array<float, N>> {
  CUTLASS_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const& a,
                                                     cutlass::Array<float, N> const& b) const {
    cutlass::Array<float, N> r;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) r[i] = __fmul_rn(a[i], b[i]);
    return r;
  }
};
template <class T> struct AddRn {
  CUTLASS_HOST_DEVICE T operator()(T a, T b) const { return a + b; }
};
template <int N> struct AddRn<cutlass::Array<float, N>> {
  CUTLASS_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const& a,
                                                     cutlass::Array<float, N> const& b) const {
    cutlass::Array<float, N> r;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) r[i] = __fadd_rn(a[i], b[i]);
    return r;
  }
};

template <class TileShape, class ElementD>
struct IntEpilogue {
  static constexpr bool kInt = std::is_same_v<ElementD, int32_t>;
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
  // (row: broadcast, column: vector or scalar, batch)
  using VecStride = cute::Stride<cute::_0, bool, int64_t>;
  using Vec = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, float, float, VecStride>;
  template <template <class> class Fn, class Out>
  using Node = cutlass::epilogue::fusion::Sm90Compute<Fn, Out, float, kRound>;
  using ProductEVT = cutlass::epilogue::fusion::Sm90EVT<Node<MulRn, float>, cutlass::epilogue::fusion::Sm90AccFetch,
                                                        Vec>;
  using ScaledEVT = cutlass::epilogue::fusion::Sm90EVT<Node<AddRn, ElementD>, ProductEVT, Vec>;
  using IntEVT = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::epilogue::thread::Identity, int32_t, int32_t, kRound>,
      cutlass::epilogue::fusion::Sm90AccFetch>;
  using EVT = std::conditional_t<kInt, IntEVT, ScaledEVT>;
  using ElementCompute = std::conditional_t<kInt, int32_t, float>;

  // the EVT's arguments: scale (nullptr: 1; one value, or one per column with scale_vec) and bias (nullptr: -0.0,
  // which returns the product unchanged, signed zeros included, as the op without a bias does), each vector
  // advancing by its batch stride from one batch to the next; nothing for the int32 output
  template <class Thread>
  static void set(Thread& t, const float* scale, bool scale_vec, int64_t scale_batch, const float* bias,
                  int64_t bias_batch) {
    if constexpr (!kInt) {
      t = {{{},                                                                  // acc
            {scale, 1.0f, VecStride{cute::_0{}, scale_vec, scale_batch}},      // * scale
            {}},
           {bias, -0.0f, VecStride{cute::_0{}, true, bias_batch}},             // + bias
           {}};
    }
  }
  template <class Thread, class Args>
  static void set(Thread& t, const Args& p) {
    set(t, p.scale, p.scale_vec, p.scale_batch, p.bias, p.bias_batch);
  }
};

}  // namespace bie_int
