// bie-backend-cutlass, integer family: the sm_90 int8 GEMM of dynamic_int8_linear (per_token_symmetric).
//
// The mainloop is the family's (integer_gemm_sm90.cuh: TMA, warp-specialized wgmma, int32 accumulators); the epilogue
// visitor tree reproduces the reference's dynamic_epilogue operation by operation:
//   D = cvt(add(mul(float(acc), mul(row_scale[m], col_scale[n])), bias[n]))
// every multiply and add its own IEEE round to nearest (__fmul_rn / __fadd_rn: never contracted into a fused
// multiply-add), the column scale per channel or one value, the bias per channel. Without a bias the add is of -0.0,
// which returns its other operand unchanged (signed zeros included).
#pragma once
#include <type_traits>

#include "integer_gemm_sm90.cuh"   // the family's configurations (BIE_INT_CFG_*) and CUTLASS headers

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>

namespace bie_int {
using namespace cute;

// The epilogue visitor tree of IGemmSm90 (integer_gemm_sm90.cuh) for the dynamic linear, and its arguments.
template <class TileShape, class ElementD>
struct DynEpilogue {
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
  using RowStride = Stride<_1, _0, int64_t>;     // one value per row m
  using ColStride = Stride<_0, bool, int64_t>;   // one value per column n (true) or one for all (false)
  using RowScale = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, float, float, RowStride>;
  using ColVec = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, float, float, ColStride>;
  template <template <class> class Fn, class Out>
  using Node = cutlass::epilogue::fusion::Sm90Compute<Fn, Out, float, kRound>;
  using ScaleEVT = cutlass::epilogue::fusion::Sm90EVT<Node<MulRn, float>, RowScale, ColVec>;
  using ProductEVT = cutlass::epilogue::fusion::Sm90EVT<Node<MulRn, float>, cutlass::epilogue::fusion::Sm90AccFetch,
                                                        ScaleEVT>;
  using EVT = cutlass::epilogue::fusion::Sm90EVT<Node<AddRn, ElementD>, ProductEVT, ColVec>;
  using ElementCompute = float;

  template <class Thread>
  static void set(Thread& t, const GemmArgs& p) {
    t = {
        {                                                                          // float(acc) * scale
            {},                                                                    //   acc
            {                                                                      //   row scale * column scale
                {p.row_scale, 1.0f, RowStride{_1{}, _0{}, 0}},
                {p.scale, 1.0f, ColStride{_0{}, p.scale_vec, 0}},
                {}},
            {}},
        {p.bias, -0.0f, ColStride{_0{}, true, 0}},                                // + bias (nullptr: -0.0)
        {}};
  }
};

#define BIE_INT_DYN_DEFINE(cfg, out, T)                                        \
  std::string idyn_##cfg##_##out(const GemmArgs& p, size_t* ws) {              \
    return IGemmSm90<BIE_INT_CFG_##cfg, T, DynEpilogue>::run(p, ws);          \
  }

}  // namespace bie_int
