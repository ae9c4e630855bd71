// Lab (session 12): how much of the 1-bit wgmma GEMM's time is its epilogue visitor tree's work.
// The product kernel's mainloop (the int8 TMA warp-specialized mainloop with the b1 AND.POPC atom) and its
// cooperative 128x256 tile, cluster 2x1, bf16 output, with two cheaper (NOT equivalent) epilogues:
//   EPI_DOT:  bf16(4*acc + r[m] + c[n])          (the integer part only; no scale, no bias)
//   EPI_ACC:  bf16(acc)                          (no broadcasts at all: the floor of any visitor tree)
// Both are timed against the product's (dot, then float(dot)*(s1*s2)+bias).
#pragma once
#include "bwc_lab.h"

namespace bie_cutlass_bin {
template <int Kind>  // 0: dot only, 1: accumulator only
struct BGemmEpiLab {
  using ElementD = cutlass::bfloat16_t;
  using Base = BGemmSm90<ElementD, Shape<_128, _256, _128>, Shape<_2, _1, _1>,
                         cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                         cutlass::epilogue::TmaWarpSpecializedCooperative,
                         cutlass::epilogue::collective::EpilogueTileAuto, 8>;
  using TileShape = Shape<_128, _256, _128>;
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
  using DotToD = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::epilogue::thread::Identity, ElementD, int32_t, kRound>,
      typename Base::DotEVT>;
  using AccToD = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::epilogue::thread::Identity, ElementD, int32_t, kRound>,
      cutlass::epilogue::fusion::Sm90AccFetch>;
  using EVT = std::conditional_t<Kind == 0, DotToD, AccToD>;
  using CollectiveEpilogue = typename WithStagesD<typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, Shape<_2, _1, _1>,
      cutlass::epilogue::collective::EpilogueTileAuto, int32_t, int32_t,
      void, LayoutD, 8, ElementD, LayoutD, 8, cutlass::epilogue::TmaWarpSpecializedCooperative, EVT>::CollectiveOp,
      8>::type;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, typename Base::CollectiveMainloop,
                                                      CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static std::string run(const WgArgs& p, size_t* ws, cudaStream_t st, bool pdl) {
    using StrideA = typename Gemm::GemmKernel::StrideA;
    using StrideB = typename Gemm::GemmKernel::StrideB;
    using StrideD = typename Gemm::GemmKernel::StrideD;
    cutlass::KernelHardwareInfo hw;
    hw.device_id = p.device;
    hw.sm_count = p.sm_count;
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm, {p.M, p.N, p.Kb, 1},
        {static_cast<const int8_t*>(p.a), StrideA{p.lda, _1{}, 0}, static_cast<const int8_t*>(p.b),
         StrideB{p.ldb, _1{}, 0}},
        {{}, nullptr, StrideD{p.ldd, _1{}, 0}, static_cast<ElementD*>(p.d), StrideD{p.ldd, _1{}, 0}},
        hw};
    if constexpr (Kind == 0) {
      args.epilogue.thread = {{{},
                               {p.row_term, 0, typename Base::RowTermStride{_1{}, _0{}, 0}},
                               {p.col_term, 0, typename Base::ColTermStride{_0{}, _1{}, 0}},
                               {}},
                              {}};
    }
    if (ws) { *ws = Gemm::get_workspace_size(args); return ""; }
    Gemm gemm;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return "cannot implement";
    if (gemm.initialize(args, p.workspace, st) != cutlass::Status::kSuccess) return "initialize failed";
    if (gemm.run(st, nullptr, pdl) != cutlass::Status::kSuccess) return "launch failed";
    return cudaGetLastError() == cudaSuccess ? "" : "CUDA error after launch";
  }
};
}  // namespace bie_cutlass_bin

#define BWC_EPI_VARIANT(idx, kind) BWC_DEFINE(idx, bie_cutlass_bin::BGemmEpiLab<kind>)
