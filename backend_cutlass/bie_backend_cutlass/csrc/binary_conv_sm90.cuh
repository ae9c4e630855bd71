// bie-backend-cutlass, binary_conv family: the sm_90a implicit-GEMM 1-bit convolution (forward, one group).
//
// Operands (binary_conv_pack.cu, binary_conv.py prepare): every pixel of the padded input holds the sign bits of
// its C channels followed by their complements, 2C bits = C/4 bytes (a ring of pad pixels holds the pad value's
// bits, so the conv itself runs without padding and every tap of every window is a real +-1 value); every tap of
// the weight holds the same two halves, [w | ~w]. A 1-bit AND.POPC wgmma over these rows counts
//     popc(a & w) + popc(~a & ~w) = the number of equal signs,
// so the +-1 dot product of a window is  dot = 2 * acc - K  (K = kh * kw * C): a scalar correction, where the
// plain bits would need a per-window popcount of the input (a pass before the conv, or a row term per pixel).
//
// Mainloop: CUTLASS 3.x's implicit-GEMM conv collective for int8 NHWC (TMA im2col gathers the windows, no patch
// matrix) with the 1-bit tiled MMA swapped in (binary_wgmma_atom.h): 256 bits of K are 32 bytes, what the int8
// K-major wgmma consumes, so the collective's shared-memory layouts, swizzles and TMA boxes serve the packed
// bytes unchanged. Epilogue: a visitor tree fused into the TMA store of the NHWC output,
//   int32 out:  D = 2 * acc - K
//   float out:  D = cvt(float(2 * acc - K) * scale[o] + bias[o])     (each operation rounded once)
// which is binary_conv2d's epilogue bit for bit (binary_conv_epilogue.cuh).
#pragma once
#include <cstdint>
#include <string>
#include <type_traits>

#include "binary_conv_epilogue.cuh"
#include "binary_conv_launch.h"
#include "binary_wgmma_atom.h"
#include "cutlass_launch.cuh"

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/array.h>
#include <cutlass/numeric_types.h>
#include <cutlass/functional.h>
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

namespace bie_bconv {
using namespace cute;

// The int8 NHWC implicit-GEMM conv mainloop (what CUTLASS's builder makes for int8 x int8 -> int32) with the 1-bit
// tiled MMA swapped in; kCarveout: the epilogue's shared memory.
template <class TileShape, class ClusterShape, int kCarveout>
struct B1ConvMainloop {
  using Layout = cutlass::layout::TensorNHWC;
  using Int8 = typename cutlass::conv::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::conv::Operator::kFprop, int8_t, Layout, 16,
      int8_t, Layout, 16, int32_t, TileShape, ClusterShape,
      cutlass::conv::collective::StageCountAutoCarveout<kCarveout>,
      cutlass::conv::KernelImplicitTmaWarpSpecializedSm90>::CollectiveOp;
  static constexpr int kTileN = int(size<1>(TileShape{}));
  static_assert(kTileN % 128 == 0, "the 1-bit atoms are 128 or 256 columns wide (binary_wgmma_atom.h)");
  using Atom = bie_cutlass_bin::SM90_64xNx256_S32B1B1_AND_SS<(kTileN % 256 == 0 ? 256 : 128)>;
  using TiledMma = decltype(make_tiled_mma(Atom{}, cute::Layout<Shape<_1, _1, _1>>{}));
  static_assert(size(TiledMma{}) == size(typename Int8::TiledMma{}), "warpgroup layout differs");
  using type = cutlass::conv::collective::CollectiveConv<
      typename Int8::DispatchPolicy, typename Int8::TileShape, int8_t, int8_t, TiledMma,
      cutlass::conv::collective::detail::Sm90ImplicitGemmTileTraits<typename Int8::GmemTiledCopyA,
                                                                     typename Int8::SmemLayoutA>,
      cutlass::conv::collective::detail::Sm90ImplicitGemmTileTraits<typename Int8::GmemTiledCopyB,
                                                                     typename Int8::SmemLayoutB>>;
};

template <class TileShape, class ClusterShape, class ElementD>
struct BConvSm90 {
  using Epi = BConvEpilogue<TileShape, ElementD>;
  using Layout = cutlass::layout::TensorNHWC;
  static constexpr int kAlignD = 16 / int(sizeof(ElementD));
  static constexpr auto kFprop = cutlass::conv::Operator::kFprop;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, int32_t, typename Epi::ElementCompute,
      void, Layout, kAlignD, ElementD, Layout, kAlignD, cutlass::epilogue::TmaWarpSpecialized,
      typename Epi::EVT>::CollectiveOp;
  using CollectiveMainloop = typename B1ConvMainloop<TileShape, ClusterShape,
                                                     static_cast<int>(sizeof(
                                                         typename CollectiveEpilogue::SharedStorage))>::type;
  using ProblemShape =
      cutlass::conv::ConvProblemShape<kFprop, CollectiveMainloop::DispatchPolicy::NumSpatialDimensions>;
  using Kernel = cutlass::conv::kernel::ConvUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Conv = cutlass::conv::device::ConvUniversalAdapter<Kernel>;

  static typename Conv::Arguments arguments(const BConvArgs& p) {
    using TE = typename ProblemShape::TensorExtent;
    using TS = typename ProblemShape::TensorStride;
    using SE = typename ProblemShape::SpatialExtent;
    // the padding is in the operand (its ring of pad pixels): the conv itself pads nothing
    const ProblemShape ps(cutlass::conv::Mode::kCrossCorrelation, TE{p.n, p.h, p.w, p.c_bytes},
                          TS{int64_t(p.h) * p.w * p.c_bytes, int64_t(p.w) * p.c_bytes, int64_t(p.c_bytes), 1},
                          TE{p.o, p.r, p.s, p.c_bytes},
                          TS{int64_t(p.r) * p.s * p.c_bytes, int64_t(p.s) * p.c_bytes, int64_t(p.c_bytes), 1},
                          SE{0, 0}, SE{0, 0}, SE{p.stride_h, p.stride_w}, SE{p.dil_h, p.dil_w}, 1);
    // the output's (Q, P, N) strides, innermost spatial mode first, from the problem's packed NHWC output
    typename Kernel::StrideD sD{};
    get<0, 0>(sD) = ps.stride_C[2];
    get<0, 1>(sD) = ps.stride_C[1];
    get<0, 2>(sD) = ps.stride_C[0];
    typename Conv::Arguments args{ps, {p.x, p.wt}, {{}, nullptr, sD, static_cast<ElementD*>(p.d), sD}};
    Epi::set(args.epilogue.thread, p.k_bits, p.scale, p.scale_vec, p.bias);
    return args;
  }

  static std::string run(const BConvArgs& p, int mode, size_t* ws) {
    return bie_cutlass::launch_conv<Conv>(arguments(p), p.workspace, mode, ws, p.stream);
  }
};

// The configurations (ids as in binary_conv.py CONFIGS): output pixels x output channels x bytes of packed K a step
// (a tap's C/4 bytes take whole steps), cluster. On the H200 (ResNet-18's layers at batch 64) 64-pixel tiles were
// 1.2-1.6x slower than these everywhere, and four pipeline stages (two CTAs an SM) no faster than as many as fit.
#define BIE_BCONV_CFG_t128x128 Shape<_128, _128, Shape<_64>>, Shape<_1, _1, _1>
// 32 bytes a step: C = 128's taps without a zero-filled half step (1.3x faster there)
#define BIE_BCONV_CFG_t128x128k32 Shape<_128, _128, Shape<_32>>, Shape<_1, _1, _1>

#define BIE_BCONV_DEFINE(cfg, out, T)                                             \
  std::string bconv_##cfg##_##out(const BConvArgs& p, int mode, size_t* ws) {     \
    return BConvSm90<BIE_BCONV_CFG_##cfg, T>::run(p, mode, ws);                   \
  }

}  // namespace bie_bconv
