// bie-backend-cutlass, binary_conv family: the window GEMMs of the 1-bit convolution (sm_90a).
//
// The window GEMM (BWinGemmSm90): the same operands and epilogue, with every output pixel's window first copied
// into a row of its own (binary_conv_pack.cu, launch_windows: kh * kw * C/4 bytes), then a plain GEMM of those rows
// against the weight's (O, kh * kw * C/4) rows on the persistent cooperative TMA mainloop (binary_wgmma.cuh). TMA's
// im2col mode fetches about one pixel row per ten cycles per SM whatever its width, so where a tap is 16-32 bytes
// (C = 64, 128) the conv waits on those fetches; the window rows cost a copy of the windows but reach the GEMM as
// wide tiled loads.
#pragma once
#include <cstdint>
#include <string>

#include "binary_conv_epilogue.cuh"
#include "binary_conv_launch.h"
#include "binary_wgmma.cuh"
#include "cutlass_launch.cuh"

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/kernel_hardware_info.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>

namespace bie_bconv {
using namespace cute;

// The window GEMM: M = output pixels (rows of windows), N = output channels, K = a window's bytes; D the NHWC rows.
template <class TileShape, class ClusterShape, class ElementD>
struct BWinGemmSm90 {
  using Epi = BConvEpilogue<TileShape, ElementD>;
  static constexpr int kAlignD = 16 / int(sizeof(ElementD));
  using Sched = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, int32_t, typename Epi::ElementCompute, void,
      cutlass::layout::RowMajor, kAlignD, ElementD, cutlass::layout::RowMajor, kAlignD,
      cutlass::epilogue::TmaWarpSpecializedCooperative, typename Epi::EVT>::CollectiveOp;
  using CollectiveMainloop =
      typename bie_cutlass_bin::B1Mainloop<TileShape, ClusterShape, Sched,
                                           int(sizeof(typename CollectiveEpilogue::SharedStorage))>::type;
  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments arguments(const BConvArgs& p) {
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideD = typename Kernel::StrideD;
    cutlass::KernelHardwareInfo hw;
    hw.device_id = p.device;
    hw.sm_count = p.sm_count;
    const int kb = p.r * p.s * p.c_bytes;
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                  {p.m, p.o, kb, 1},
                                  {p.windows, StrideA{int64_t(kb), _1{}, 0}, p.wt, StrideB{int64_t(kb), _1{}, 0}},
                                  {{}, nullptr, StrideD{int64_t(p.o), _1{}, 0}, static_cast<ElementD*>(p.d),
                                   StrideD{int64_t(p.o), _1{}, 0}},
                                  hw};
    Epi::set(args.epilogue.thread, p.k_bits, p.scale, p.scale_vec, p.bias);
    return args;
  }

  static std::string run(const BConvArgs& p, int mode, size_t* ws) {
    if (mode == 0) {
      const cutlass::Status s = Gemm::can_implement(arguments(p));
      return s == cutlass::Status::kSuccess ? ""
                                            : std::string("CUTLASS cannot implement this problem: ") +
                                                  cutlassGetStatusString(s);
    }
    return bie_cutlass::launch_gemm<Gemm>(arguments(p), p.workspace, mode == 1 ? ws : nullptr, p.stream);
  }
};

// The window GEMM's configuration: 128 x 128 tiles, 128 bytes of K a step, cooperative, persistent. On the H200
// (ResNet-18's layers at batch 64) it beat 64-byte K steps by 1.1-1.3x; a 64 x 128 ping-pong tile was slower where
// windows serve (C = 64, 128) and eight epilogue store buffers no faster.
#define BIE_BCONV_CFG_w128x128k128 Shape<_128, _128, _128>, Shape<_1, _1, _1>

#define BIE_BWIN_DEFINE(cfg, out, T)                                              \
  std::string bconv_##cfg##_##out(const BConvArgs& p, int mode, size_t* ws) {     \
    return BWinGemmSm90<BIE_BCONV_CFG_##cfg, T>::run(p, mode, ws);                \
  }

}  // namespace bie_bconv
