// bie-backend-cutlass, binary_conv family: the epilogue of the 1-bit convolutions (binary_conv_sm90.cuh) and of the
// window GEMMs (binary_conv_windows_sm90.cuh), a visitor tree fused into the TMA store of the NHWC output:
//   int32 out:  D = 2 * acc - K
//   float out:  D = cvt(float(2 * acc - K) * scale[o] + bias[o])     (each operation rounded once)
// (acc: the count of equal signs of a window and a filter, K: the +-1 values a window holds). Its own header because
// the conv and GEMM kernel headers of CUTLASS cannot share a translation unit.
#pragma once
#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/array.h>
#include <cutlass/numeric_types.h>
#include <cutlass/functional.h>
#include <cutlass/epilogue/thread/activation.h>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>

namespace bie_bconv {
using namespace cute;

// 2 * acc - K on int32 fragments (exact: |2 acc - K| <= K < 2^31).
template <class T>
struct TwiceMinusK {
  CUTLASS_HOST_DEVICE T operator()(T acc, T k) const { return 2 * acc - k; }
};
template <int N>
struct TwiceMinusK<cutlass::Array<int32_t, N>> {
  using A = cutlass::Array<int32_t, N>;
  CUTLASS_HOST_DEVICE A operator()(A const& acc, A const& k) const {
    A o;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) o[i] = 2 * acc[i] - k[i];
    return o;
  }
};

// float32 multiply / add, each rounded once (no contraction into an FMA: the op rounds the product and the sum).
template <class T>
struct MulRn {
  CUTLASS_HOST_DEVICE T operator()(T a, T b) const { return a * b; }
};
template <int N>
struct MulRn<cutlass::Array<float, N>> {
  using A = cutlass::Array<float, N>;
  CUTLASS_DEVICE A operator()(A const& a, A const& b) const {
    A r;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) r[i] = __fmul_rn(a[i], b[i]);
    return r;
  }
};
template <class T>
struct AddRn {
  CUTLASS_HOST_DEVICE T operator()(T a, T b) const { return a + b; }
};
template <int N>
struct AddRn<cutlass::Array<float, N>> {
  using A = cutlass::Array<float, N>;
  CUTLASS_DEVICE A operator()(A const& a, A const& b) const {
    A r;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) r[i] = __fadd_rn(a[i], b[i]);
    return r;
  }
};

template <class TileShape, class ElementD>
struct BConvEpilogue {
  static constexpr bool kInt = std::is_same_v<ElementD, int32_t>;
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
  using VecStride = Stride<_0, bool, int64_t>;   // (broadcast over pixels, per channel or scalar, batch)
  using Vec = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, float, float, VecStride>;
  using K = cutlass::epilogue::fusion::Sm90ScalarBroadcast<int32_t>;
  using Acc = cutlass::epilogue::fusion::Sm90AccFetch;
  template <template <class> class Fn, class Out, class Compute>
  using Node = cutlass::epilogue::fusion::Sm90Compute<Fn, Out, Compute, kRound>;
  template <class Out>
  using DotEVT = cutlass::epilogue::fusion::Sm90EVT<Node<TwiceMinusK, Out, int32_t>, Acc, K>;
  using ProductEVT = cutlass::epilogue::fusion::Sm90EVT<Node<MulRn, float, float>, DotEVT<float>, Vec>;
  using ScaledEVT = cutlass::epilogue::fusion::Sm90EVT<Node<AddRn, ElementD, float>, ProductEVT, Vec>;
  using EVT = std::conditional_t<kInt, DotEVT<int32_t>, ScaledEVT>;
  using ElementCompute = std::conditional_t<kInt, int32_t, float>;

  // scale: nullptr = 1, one value or one per output channel (scale_vec); bias: nullptr = -0.0 (returns the product
  // unchanged, signed zeros included, as the op without a bias)
  template <class Thread>
  static void set(Thread& t, int32_t k, const float* scale, bool scale_vec, const float* bias) {
    typename K::Arguments ka{};
    ka.scalars[0] = k;
    if constexpr (kInt) {
      t = {{}, ka, {}};
    } else {
      t = {{{{}, ka, {}},                                                   // 2 * acc - K
            {scale, 1.0f, VecStride{_0{}, scale_vec, 0}},                  // * scale
            {}},
           {bias, -0.0f, VecStride{_0{}, true, 0}},                        // + bias
           {}};
    }
  }
};

}  // namespace bie_bconv
