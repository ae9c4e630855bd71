// bie-backend-cutlass, weight-only family: the sm_90 (Hopper) mixed-input GEMM.
//
// y = x @ W for GPTQ / GBA weights at prefill sizes: the weight never exists in
// 16 bits in memory. CUTLASS 3.x's mixed-input collective loads the 4/8-bit codes
// with TMA, turns them into fp16/bf16 in registers as code * scale + zero (one
// scale and one zero per group of K and output channel), and feeds them to wgmma
// as the register operand; x arrives by TMA as the shared-memory operand.
// The weight is the GEMM's A operand (the narrow type must be), so the kernel
// computes y^T: D (n_out x tokens, column-major) is y (tokens x n_out, row-major).
// The bias (per output channel = per row of D) is added in the epilogue.
#pragma once
#include <type_traits>

#include "wq_launch.h"
#include "cutlass_launch.cuh"
#include "wq_layout.cuh"

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>
#include <cutlass/functional.h>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>

namespace bie_wq {
using namespace cute;

template <int Bits, class Act, class TileShape, class ClusterShape, class MainSched, class EpiSched,
          class Scheduler = void>
struct WqGemmSm90 {
  using QuantT = typename Quant<Bits>::T;
  using LayoutA = typename ReorderedA<Bits>::Type;
  using LayoutB = cutlass::layout::ColumnMajor;  // x as (K x tokens), K contiguous
  using LayoutD = cutlass::layout::ColumnMajor;  // D (n_out x tokens), n_out contiguous
  static constexpr int kAlignA = 128 / cutlass::sizeof_bits<QuantT>::value;
  static constexpr int kAlignB = 8;
  static constexpr int kAlignD = 8;
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

  using Bias = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, float, float, Stride<_1, _0, int64_t>>;
  using EVT = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::plus, Act, float, kRound>,
      cutlass::epilogue::fusion::Sm90AccFetch, Bias>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, LayoutD, kAlignD, Act, LayoutD, kAlignD, EpiSched, EVT>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      cute::tuple<QuantT, Act, Act>, LayoutA, kAlignA,
      Act, LayoutB, kAlignB, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      MainSched>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                      CollectiveEpilogue, Scheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments arguments(const WqArgs& p) {
    using StrideB = typename Gemm::GemmKernel::StrideB;
    using StrideD = typename Gemm::GemmKernel::StrideD;
    using StrideS = typename CollectiveMainloop::StrideScale;
    StrideB sB = make_stride(p.ldx, _1{}, int64_t(0));
    StrideD sD = make_stride(_1{}, int64_t(p.n_out), int64_t(0));
    StrideS sS = make_stride(_1{}, int64_t(p.n_out), int64_t(0));
    cutlass::KernelHardwareInfo hw;
    hw.device_id = p.device;
    hw.sm_count = p.sm_count;
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {p.n_out, p.tokens, p.k, 1},
        {static_cast<const QuantT*>(p.a), ReorderedA<Bits>::make(p.n_out, p.k), static_cast<const Act*>(p.x), sB,
         static_cast<const Act*>(p.scale), sS, p.group_size, static_cast<const Act*>(p.zero)},
        {{}, nullptr, sD, static_cast<Act*>(p.d), sD},
        hw};
    if constexpr (std::is_same_v<Scheduler, cutlass::gemm::StreamKScheduler>) {
      using Sched = typename Gemm::GemmKernel::TileSchedulerArguments;
      args.scheduler.splits = p.splits;
      args.scheduler.decomposition_mode = static_cast<decltype(Sched::decomposition_mode)>(p.decomposition);
      args.scheduler.reduction_mode = static_cast<decltype(Sched::reduction_mode)>(p.reduction);
    }
    args.epilogue.thread = {
        {},                                                        // acc
        {p.bias, 0.0f, Stride<_1, _0, int64_t>{_1{}, _0{}, 0}},     // bias per output channel (nullptr: 0)
        {}};                                                       // plus
    return args;
  }

  static std::string run(const WqArgs& p, size_t* ws) {
    return bie_cutlass::launch_gemm<Gemm>(arguments(p), p.workspace, ws, p.stream);
  }
};

// The configurations (ids as in weight_only.py's CONFIGS). Tile = (output channels, tokens, K).
// c*: persistent cooperative kernels for many tokens (compute-bound); s*: few tokens (memory-bound),
// a K tile of 128 (longer TMA transactions) and the stream-K scheduler, which splits the K loop of the
// few output tiles over all SMs (8192 channels are only 64 tiles of 128).
#define BIE_WQ_STREAM_K(M, N, K) BIE_SM90_COOPERATIVE(M, N, K, _1), cutlass::gemm::StreamKScheduler
#define BIE_WQ_CFG_c128x256 BIE_SM90_COOPERATIVE(_128, _256, _64, _1)
#define BIE_WQ_CFG_c128x128 BIE_SM90_COOPERATIVE(_128, _128, _64, _1)
#define BIE_WQ_CFG_p64x128 BIE_SM90_PINGPONG(_64, _128, _64, _1)
#define BIE_WQ_CFG_s128x16 BIE_WQ_STREAM_K(_128, _16, _128)
#define BIE_WQ_CFG_s128x32 BIE_WQ_STREAM_K(_128, _32, _128)
// 256 channels per tile: each consumer warpgroup converts and multiplies two 64-row blocks per k step,
// twice the independent work between the waits of its dependent load -> convert -> wgmma chain
#define BIE_WQ_CFG_s256x16 BIE_WQ_STREAM_K(_256, _16, _128)
#define BIE_WQ_CFG_s256x32 BIE_WQ_STREAM_K(_256, _32, _128)
#define BIE_WQ_CFG_s256x64 BIE_WQ_STREAM_K(_256, _64, _128)

#define BIE_WQ_DEFINE(cfg, bits, act, T)                                        \
  std::string wq_##cfg##_w##bits##_##act(const WqArgs& p, size_t* ws) {         \
    return WqGemmSm90<bits, T, BIE_WQ_CFG_##cfg>::run(p, ws);                    \
  }

}  // namespace bie_wq
