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
#include <cutlass/array.h>
#include <cutlass/numeric_types.h>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>

namespace bie_int {
using namespace cute;

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

template <class TileShape, class ClusterShape, class MainSched, class EpiSched, class ElementD>
struct IDynGemmSm90 {
  using LayoutA = cutlass::layout::RowMajor;     // A (M, K): the activation codes
  using LayoutB = cutlass::layout::ColumnMajor;  // B (N, K): the weight codes
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignAB = 16;
  static constexpr int kAlignD = 16 / int(sizeof(ElementD));
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

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, int32_t, float,
      void, LayoutD, kAlignD, ElementD, LayoutD, kAlignD, EpiSched, EVT>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, int8_t, LayoutA, kAlignAB, int8_t, LayoutB, kAlignAB,
      int32_t, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      MainSched>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                      CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments arguments(const GemmArgs& p) {
    using StrideA = typename Gemm::GemmKernel::StrideA;
    using StrideB = typename Gemm::GemmKernel::StrideB;
    using StrideD = typename Gemm::GemmKernel::StrideD;
    StrideA sA = make_stride(p.lda, _1{}, p.batch_a);
    StrideB sB = make_stride(p.ldb, _1{}, p.batch_b);
    StrideD sD = make_stride(p.ldd, _1{}, p.batch_d);
    cutlass::KernelHardwareInfo hw;
    hw.device_id = p.device;
    hw.sm_count = p.sm_count;
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {p.m, p.n, p.k, 1},
        {p.a, sA, p.b, sB},
        {{}, nullptr, sD, static_cast<ElementD*>(p.d), sD},
        hw};
    args.epilogue.thread = {
        {                                                                          // float(acc) * scale
            {},                                                                    //   acc
            {                                                                      //   row scale * column scale
                {p.row_scale, 1.0f, RowStride{_1{}, _0{}, 0}},
                {p.scale, 1.0f, ColStride{_0{}, p.scale_vec, 0}},
                {}},
            {}},
        {p.bias, -0.0f, ColStride{_0{}, true, 0}},                                // + bias (nullptr: -0.0)
        {}};
    return args;
  }

  static std::string run(const GemmArgs& p, size_t* ws) {
    return bie_cutlass::launch_gemm<Gemm>(arguments(p), p.workspace, ws, p.stream);
  }
};

#define BIE_INT_DYN_DEFINE(cfg, out, T)                                        \
  std::string idyn_##cfg##_##out(const GemmArgs& p, size_t* ws) {              \
    return IDynGemmSm90<BIE_INT_CFG_##cfg, T>::run(p, ws);                     \
  }

}  // namespace bie_int
