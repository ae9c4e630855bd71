// bie-backend-cutlass, integer family: the epilogue visitor tree of the int8 GEMM and the implicit-GEMM conv,
// fused into their TMA store (one definition, so both compute the same values bit for bit):
//   int32 out:  D = acc
//   float out:  D = cvt(fma(float(acc), scale[n], bias[n]))     (scale scalar or per column / output channel)
#pragma once
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/functional.h>
#include <cutlass/epilogue/thread/activation.h>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>

namespace bie_int {

template <class TileShape, class ElementD>
struct IntEpilogue {
  static constexpr bool kInt = std::is_same_v<ElementD, int32_t>;
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
  // (row: broadcast, column: vector or scalar, batch)
  using VecStride = cute::Stride<cute::_0, bool, int64_t>;
  using Vec = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, float, float, VecStride>;
  using ScaledEVT = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::homogeneous_multiply_add, ElementD, float, kRound>,
      cutlass::epilogue::fusion::Sm90AccFetch, Vec, Vec>;
  using IntEVT = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::epilogue::thread::Identity, int32_t, int32_t, kRound>,
      cutlass::epilogue::fusion::Sm90AccFetch>;
  using EVT = std::conditional_t<kInt, IntEVT, ScaledEVT>;
  using ElementCompute = std::conditional_t<kInt, int32_t, float>;
};

}  // namespace bie_int
