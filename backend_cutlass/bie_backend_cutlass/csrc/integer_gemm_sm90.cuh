// bie-backend-cutlass, integer family: the sm_90 (Hopper) int8 GEMM.
//
// CUTLASS 3.x CollectiveBuilder: TMA loads, warp-specialized persistent kernels
// (cooperative or ping-pong), int8 x int8 -> int32 wgmma (IGMMA in SASS), and an
// epilogue visitor tree that fuses the whole op epilogue into the TMA store:
//   int32 out:  D = acc
//   float out:  D = cvt(float(acc) * scale[n] + bias[n])        (scale scalar or per column; two roundings)
// 4-bit codes (held in int8) run on the same int8 tensor cores: Hopper has no int4 MMA.
#pragma once
#include <type_traits>

#include "integer_launch.h"
#include "cutlass_launch.cuh"
#include "cutlass_params_cache.cuh"
#include "integer_epilogue.cuh"

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>
#include <cutlass/functional.h>
#include <cutlass/epilogue/thread/activation.h>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>

namespace bie_int {
using namespace cute;

// EpiT: the epilogue visitor tree and its arguments (IntEpilogue; the dynamic linear's DynEpilogue)
template <class TileShape, class ClusterShape, class MainSched, class EpiSched, class ElementD,
          template <class, class> class EpiT = IntEpilogue>
struct IGemmSm90 {
  using Epi = EpiT<TileShape, ElementD>;
  using LayoutA = cutlass::layout::RowMajor;     // A (M, K), K contiguous
  using LayoutB = cutlass::layout::ColumnMajor;  // B (N, K), K contiguous
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignAB = 16;
  static constexpr int kAlignD = 16 / int(sizeof(ElementD));

  using EVT = typename Epi::EVT;
  using ElementCompute = typename Epi::ElementCompute;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, int32_t, ElementCompute,
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
        p.l > 1 ? cutlass::gemm::GemmUniversalMode::kBatched : cutlass::gemm::GemmUniversalMode::kGemm,
        {p.m, p.n, p.k, p.l},
        {p.a, sA, p.b, sB},
        {{}, nullptr, sD, static_cast<ElementD*>(p.d), sD},
        hw};
    Epi::set(args.epilogue.thread, p);
    return args;
  }

  // every field of p that arguments(p) reads, a word each (the key of the params made from them)
  static std::array<int64_t, 21> key_of(const GemmArgs& p) {
    auto w = [](const void* q) { return static_cast<int64_t>(reinterpret_cast<intptr_t>(q)); };
    return {w(p.a), w(p.b), w(p.d), p.m, p.n, p.k, p.l, p.lda, p.ldb, p.ldd, p.batch_a, p.batch_b, p.batch_d,
            w(p.scale), p.scale_vec, p.scale_batch, w(p.bias), p.bias_batch, w(p.row_scale), p.device, p.sm_count};
  }

  static std::string run(const GemmArgs& p, size_t* ws) {
    return bie_cutlass::launch_gemm_kept<Gemm>(key_of(p), arguments(p), p.workspace, ws, p.stream);
  }
};

// The configurations (ids as in integer.py's CONFIGS).
#define BIE_INT_CFG_c128x256 BIE_SM90_COOPERATIVE(_128, _256, _128, _2)
#define BIE_INT_CFG_p64x128 BIE_SM90_PINGPONG(_64, _128, _128, _1)
#define BIE_INT_CFG_c128x128 BIE_SM90_COOPERATIVE(_128, _128, _128, _1)

#define BIE_INT_DEFINE(cfg, out, T)                                            \
  std::string igemm_##cfg##_##out(const GemmArgs& p, size_t* ws) {             \
    return IGemmSm90<BIE_INT_CFG_##cfg, T>::run(p, ws);                         \
  }

}  // namespace bie_int
