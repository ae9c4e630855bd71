// bie-backend-cutlass, integer family: the sm_90 (Hopper) implicit-GEMM int8 convolution (forward, one group).
//
// CUTLASS 3.x conv CollectiveBuilder: the activation codes are read straight from NHWC memory by TMA in its im2col
// mode (the hardware gathers each filter tap's window and fills the zero padding), so no patch matrix is written;
// the filter codes are KRSC rows, which is the (kh, kw, c) order integer.py prepare_conv already stores. int8 x
// int8 -> int32 wgmma, and the same epilogue visitor tree as the GEMM (integer_gemm_sm90.cuh) fused into the TMA
// store of the NHWC output:
//   int32 out:  D = acc
//   float out:  D = cvt(float(acc) * scale[k] + bias[k])        (scale scalar or per output channel; two roundings)
// so results are bit-identical to the im2col path. CUTLASS's conv mainloop has no persistent (cooperative /
// ping-pong) schedule on sm_90: one CTA per output tile, one consumer warpgroup.
#pragma once
#include <type_traits>

#include "integer_launch.h"
#include "cutlass_launch.cuh"
#include "integer_epilogue.cuh"

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>
#include <cutlass/functional.h>
#include <cutlass/epilogue/thread/activation.h>
// (the conv collectives use these without including them)
#include <cutlass/kernel_hardware_info.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/conv/collective/collective_builder.hpp>
#include <cutlass/conv/convnd_problem_shape.hpp>
#include <cutlass/conv/convolution.h>
#include <cutlass/conv/dispatch_policy.hpp>
#include <cutlass/conv/kernel/conv_universal.hpp>
#include <cutlass/conv/device/conv_universal_adapter.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>

namespace bie_int {
using namespace cute;

template <class TileShape, class ClusterShape, class ElementD>
struct IConvSm90 {
  using Epi = IntEpilogue<TileShape, ElementD>;
  using Layout = cutlass::layout::TensorNHWC;     // activations, filters (KRSC) and output: channels innermost
  static constexpr int kAlignAB = 16;             // 16 int8 channels: one 16-byte TMA unit
  static constexpr int kAlignD = 16 / int(sizeof(ElementD));
  static constexpr auto kFprop = cutlass::conv::Operator::kFprop;

  using EVT = typename Epi::EVT;
  using ElementCompute = typename Epi::ElementCompute;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, int32_t, ElementCompute,
      void, Layout, kAlignD, ElementD, Layout, kAlignD, cutlass::epilogue::TmaWarpSpecialized, EVT>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::conv::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, kFprop, int8_t, Layout, kAlignAB, int8_t, Layout,
      kAlignAB, int32_t, TileShape, ClusterShape,
      cutlass::conv::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::conv::KernelImplicitTmaWarpSpecializedSm90>::CollectiveOp;

  using ProblemShape =
      cutlass::conv::ConvProblemShape<kFprop, CollectiveMainloop::DispatchPolicy::NumSpatialDimensions>;
  using Kernel = cutlass::conv::kernel::ConvUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Conv = cutlass::conv::device::ConvUniversalAdapter<Kernel>;

  static typename Conv::Arguments arguments(const ConvArgs& p) {
    using TE = typename ProblemShape::TensorExtent;
    using TS = typename ProblemShape::TensorStride;
    using SE = typename ProblemShape::SpatialExtent;
    const ProblemShape ps(cutlass::conv::Mode::kCrossCorrelation, TE{p.n, p.h, p.w, p.c},
                          TS{p.x_stride_n, p.x_stride_h, p.x_stride_w, 1}, TE{p.k, p.r, p.s, p.c},
                          TS{int64_t(p.r) * p.s * p.c, int64_t(p.s) * p.c, int64_t(p.c), 1}, SE{p.pad_h, p.pad_w},
                          SE{p.pad_h, p.pad_w}, SE{p.stride_h, p.stride_w}, SE{p.dil_h, p.dil_w}, 1);
    // the output's (Q, P, N) strides, innermost spatial mode first, from the problem's packed NHWC output
    typename Kernel::StrideD sD{};
    get<0, 0>(sD) = ps.stride_C[2];
    get<0, 1>(sD) = ps.stride_C[1];
    get<0, 2>(sD) = ps.stride_C[0];
    typename Conv::Arguments args{ps, {p.x, p.wt}, {{}, nullptr, sD, static_cast<ElementD*>(p.d), sD}};
    Epi::set(args.epilogue.thread, p.scale, p.scale_vec, 0, p.bias, 0);
    return args;
  }

  static std::string run(const ConvArgs& p, int mode, size_t* ws) {
    return bie_cutlass::launch_conv<Conv>(arguments(p), p.workspace, mode, ws, p.stream);
  }
};

// The configurations (ids as in integer.py's CONV_CONFIGS): output pixels x output channels (x input channels a
// step, 128 unless named).
#define BIE_INT_CONV_CFG_t128x128 Shape<_128, _128, Shape<_128>>, Shape<_1, _1, _1>
#define BIE_INT_CONV_CFG_t64x128 Shape<_64, _128, Shape<_128>>, Shape<_1, _1, _1>
// 64 channels a step: no zero-filled half step where C is an odd multiple of 64 (ResNet's 64-channel stages)
#define BIE_INT_CONV_CFG_t128x128k64 Shape<_128, _128, Shape<_64>>, Shape<_1, _1, _1>
// 64 output channels a tile: a 128-channel tile left half its tensor-core work on zero-padded weight rows for
// ResNet's 64-channel stages
#define BIE_INT_CONV_CFG_t128x64k64 Shape<_128, _64, Shape<_64>>, Shape<_1, _1, _1>

#define BIE_INT_CONV_DEFINE(cfg, out, T)                                           \
  std::string iconv_##cfg##_##out(const ConvArgs& p, int mode, size_t* ws) {        \
    return IConvSm90<BIE_INT_CONV_CFG_##cfg, T>::run(p, mode, ws);                  \
  }

}  // namespace bie_int
