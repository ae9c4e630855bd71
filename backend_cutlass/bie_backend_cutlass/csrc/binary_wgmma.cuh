// bie-backend-cutlass, binary family: the Hopper (sm_90a) 1-bit GEMM on wgmma.
//
// Mainloop: the CUTLASS 3.x TMA warp-specialized int8 K-major mainloop (CollectiveBuilder for
// int8 x int8 -> int32, RowMajor A / ColumnMajor B), re-instantiated with our own tiled MMA whose
// atom issues wgmma.mma_async.m64nNk256.s32.b1.b1.and.popc (binary_wgmma_atom.h). The packed
// bits are handled as int8 bytes: 256 bits of K = 32 bytes = one int8 wgmma's K, so the builder's
// shared-memory layouts, swizzles, descriptors and TMA copies are exactly right for them.
//
// Epilogue, 16-bit outputs (f16, bf16): our lean epilogue (binary_lean_epilogue.cuh): the terms staged
// by the epilogue load warp, the math straight from the accumulator registers, TMA stores of swizzled
// boxes. 32-bit outputs (int32, float32): an Sm90 epilogue visitor tree fused into the TMA store:
//   dot = 4*acc + row_term[m] + col_term[n]                          (int32, exact)
//   int32 out: dot
//   float out: cvt(__fadd_rn(__fmul_rn(float(dot), __fmul_rn(s1, s2)), bias[n]))  (the reference's
//              roundings: float32(dot) * scale, then + bias, each rounded; scale = s1*s2 rounded)
#pragma once
#include <type_traits>

#include "binary_common.h"
#include "binary_wgmma_atom.h"
#include "binary_lean_epilogue.cuh"
#include "cutlass_launch.cuh"

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

namespace bie_cutlass_bin {
using namespace cute;

// dot = 4*acc + r + c on int32 fragments.
template <class T>
struct BinDot {};
template <int N>
struct BinDot<cutlass::Array<int32_t, N>> {
  using A = cutlass::Array<int32_t, N>;
  CUTLASS_HOST_DEVICE A operator()(A const& acc, A const& r, A const& c) const {
    A o;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) o[i] = 4 * acc[i] + r[i] + c[i];
    return o;
  }
};

// y = float(dot) * (s1 * s2) + bias, every operation rounded on its own (no FMA contraction).
template <class T>
struct BinScaleBias {};
template <int N>
struct BinScaleBias<cutlass::Array<float, N>> {
  using A = cutlass::Array<float, N>;
  CUTLASS_HOST_DEVICE A operator()(A const& d, A const& s1, A const& s2, A const& b) const {
    A o;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) {
#if defined(__CUDA_ARCH__)
      o[i] = __fadd_rn(__fmul_rn(d[i], __fmul_rn(s1[i], s2[i])), b[i]);
#else
      o[i] = d[i] * (s1[i] * s2[i]) + b[i];
#endif
    }
    return o;
  }
};

// The builder's TMA epilogue with its store-buffer count replaced: StagesD = 0 keeps the builder's
// (2 subtile buffers); more buffers let the math warps write a whole tile's subtiles without
// waiting for earlier TMA stores to drain.
template <class Epi, int StagesD>
struct WithStagesD {
  using type = Epi;
};
template <int SC, int SD, int FS, bool Reuse, bool Delay, class... Rest, int StagesD>
struct WithStagesD<cutlass::epilogue::collective::CollectiveEpilogue<
                       cutlass::epilogue::Sm90TmaWarpSpecialized<SC, SD, FS, Reuse, Delay>, Rest...>,
                   StagesD> {
  static_assert(StagesD >= 0, "StagesD");
  using type = cutlass::epilogue::collective::CollectiveEpilogue<
      cutlass::epilogue::Sm90TmaWarpSpecialized<SC, (StagesD > 0 ? StagesD : SD), FS, Reuse, Delay>, Rest...>;
};

// The int8 K-major TMA warp-specialized mainloop (what CUTLASS's builder makes for int8 x int8 -> int32,
// RowMajor A / ColumnMajor B) with the 1-bit tiled MMA swapped in; kCarveout: the epilogue's shared memory.
template <class TileShape, class ClusterShape, class MainSched, int kCarveout>
struct B1Mainloop {
  using Int8Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, int8_t, cutlass::layout::RowMajor, 16, int8_t,
      cutlass::layout::ColumnMajor, 16, int32_t, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<kCarveout>, MainSched>::CollectiveOp;
  static constexpr bool kCoop = std::is_same_v<MainSched, cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  static constexpr int kTileN = int(size<1>(TileShape{}));
  static_assert(kTileN % 128 == 0, "the 1-bit atoms are 128 or 256 columns wide (binary_wgmma_atom.h)");
  using Atom = SM90_64xNx256_S32B1B1_AND_SS<(kTileN % 256 == 0 ? 256 : 128)>;
  using AtomLayoutMNK = std::conditional_t<kCoop, Layout<Shape<_2, _1, _1>>, Layout<Shape<_1, _1, _1>>>;
  using TiledMma = decltype(make_tiled_mma(Atom{}, AtomLayoutMNK{}));
  static_assert(size(TiledMma{}) == size(typename Int8Mainloop::TiledMma{}), "warpgroup layout differs");
  using type = cutlass::gemm::collective::CollectiveMma<
      typename Int8Mainloop::DispatchPolicy, typename Int8Mainloop::TileShape,
      typename Int8Mainloop::ElementA, typename Int8Mainloop::StrideA,
      typename Int8Mainloop::ElementB, typename Int8Mainloop::StrideB,
      TiledMma,
      typename Int8Mainloop::GmemTiledCopyA, typename Int8Mainloop::SmemLayoutAtomA,
      typename Int8Mainloop::SmemCopyAtomA, typename Int8Mainloop::TransformA,
      typename Int8Mainloop::GmemTiledCopyB, typename Int8Mainloop::SmemLayoutAtomB,
      typename Int8Mainloop::SmemCopyAtomB, typename Int8Mainloop::TransformB>;
};

// The same mainloop, whose math warps also count the set bits of their warpgroup's A rows in every stage
// while that stage's wgmmas run, so binary_gemm / binary_bmm need no popcount pass before the GEMM
// (LeanBinEpilogue<..., kCountedRows = true> reads the counts from lean_detail::a_row_counts()). Each thread
// takes half of one row (64 bytes of a stage's 128-byte row: four 16-byte shared loads, in a row-dependent
// chunk order: a warp's 16 rows would otherwise all hit the same four banks); the swizzle only permutes a
// row's 16-byte chunks, so the row's bytes are the 128-byte line that holds its element (row, 0). The stage
// handling (wait, issue, release of the stage before, one batch in flight) matches what the kernel's
// mma_tail expects.
// Cost: about 10% more mainloop time where the mainloop bounds the call (every N tile counts its rows again),
// against one pass kernel saved: a win up to about 4096^3, a loss at 8192^3, hence binary.py's work limit
// (COUNT_MAX_WORK; benchmarks/results/cutlass_h100_binary.md). Counting on the tensor cores instead (one more
// m64n8k256 AND.POPC wgmma per K block against 8 columns of ones) measured the same, so the narrow wgmma
// costs the tensor pipe about what POPC costs the SM.
template <class Base>
struct B1MainloopCountA : Base {
  using typename Base::MainloopPipeline;
  using typename Base::PipelineState;
  using typename Base::TensorStorage;
  using typename Base::Params;
  using typename Base::TiledMma;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  static_assert(Base::K_PIPE_MMAS == 1, "one wgmma batch in flight");

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState read, FrgTensorC& accum, int k_tile_count,
                          int thread_idx, TensorStorage& storage, Params const&) {
    using namespace cute;
    Tensor sA = make_tensor(make_smem_ptr(storage.smem_A.data()), SmemLayoutA{});   // (M, K bytes, stage)
    Tensor sB = make_tensor(make_smem_ptr(storage.smem_B.data()), SmemLayoutB{});
    static_assert(int(size<1>(SmemLayoutA{})) == 128, "one 128-byte row per stage");
    const int wg = __shfl_sync(0xffffffffu, thread_idx / 128, 0);
    TiledMma tiled_mma;
    auto thr = tiled_mma.get_slice(wg * 128);   // (wgmma operands are partitioned per warpgroup)
    Tensor tCrA = thr.make_fragment_A(thr.partition_A(sA));
    Tensor tCrB = thr.make_fragment_B(thr.partition_B(sB));
    const int t = thread_idx % 128, row = wg * 64 + t / 2;
    int pop = 0;
    PipelineState release = read;
    tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
    CUTLASS_PRAGMA_NO_UNROLL
    for (int kt = 0; kt < k_tile_count; ++kt) {
      pipeline.consumer_wait(read, pipeline.consumer_try_wait(read));
      const int s = read.index();
      warpgroup_fence_operand(accum);
      warpgroup_arrive();
      CUTLASS_PRAGMA_UNROLL
      for (int kb = 0; kb < size<2>(tCrA); ++kb) {
        cute::gemm(tiled_mma, tCrA(_, _, kb, s), tCrB(_, _, kb, s), accum);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      // while they run: this thread's half of its row in the stage
      const uint32_t line =
          static_cast<uint32_t>(__cvta_generic_to_shared(raw_pointer_cast(&sA(row, 0, s)))) & ~127u;
      CUTLASS_PRAGMA_UNROLL
      for (int q = 0; q < 4; ++q) {
        uint32_t x, y, z, w;
        const uint32_t chunk = (4u * (t & 1) + q + row) & 7u;
        asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(x), "=r"(y), "=r"(z), "=r"(w)
                     : "r"(line + 16u * chunk));
        pop += __popc(x) + __popc(y) + __popc(z) + __popc(w);
      }
      if (kt >= 1) {   // the batch before this one is done: its stage goes back to the producer
        warpgroup_wait<1>();
        warpgroup_fence_operand(accum);
        pipeline.consumer_release(release);
        ++release;
      }
      ++read;
    }
    warpgroup_fence_operand(accum);
    pop += __shfl_xor_sync(0xffffffffu, pop, 1);
    if ((t & 1) == 0) lean_detail::a_row_counts()[(int(threadIdx.x) / 128 - 1) * 64 + t / 2] = pop;
  }
};

using bie_cutlass::launch_gemm;   // (cutlass_launch.cuh)

// The kernel and device adapter of one 1-bit GEMM: B1Mainloop with its pipeline stages sized around the
// epilogue's shared memory, then the epilogue. kCountA: the mainloop also counts popc(A row)
// (B1MainloopCountA; + 1024 bytes for the static buffer the counts go through).
template <class Epilogue, class TileShape, class ClusterShape, class MainSched, bool kCountA = false>
struct B1Kernel {
  using Plain = typename B1Mainloop<TileShape, ClusterShape, MainSched,
                                    int(sizeof(typename Epilogue::SharedStorage)) + (kCountA ? 1024 : 0)>::type;
  using CollectiveMainloop = std::conditional_t<kCountA, B1MainloopCountA<Plain>, Plain>;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

// The arguments both epilogues' kernels share: batched or not, the problem (K in bytes), the packed
// operands (K-major, batch strides in bytes) and the GPU; epi: the epilogue's own arguments.
template <class Gemm>
typename Gemm::Arguments wg_arguments(const WgArgs& p, typename Gemm::GemmKernel::EpilogueArguments const& epi) {
  using StrideA = typename Gemm::GemmKernel::StrideA;
  using StrideB = typename Gemm::GemmKernel::StrideB;
  cutlass::KernelHardwareInfo hw;
  hw.device_id = p.device;
  hw.sm_count = p.sm_count;
  return typename Gemm::Arguments{
      p.L > 1 ? cutlass::gemm::GemmUniversalMode::kBatched : cutlass::gemm::GemmUniversalMode::kGemm,
      {p.M, p.N, p.Kb, p.L},
      {static_cast<const int8_t*>(p.a), StrideA{p.lda, _1{}, p.a_bs}, static_cast<const int8_t*>(p.b),
       StrideB{p.ldb, _1{}, p.b_bs}},
      epi,
      hw};
}

template <class ElementD, class TileShape, class ClusterShape, class MainSched, class EpiSched,
          class EpiTile = cutlass::epilogue::collective::EpilogueTileAuto, int StagesD = 0>
struct BGemmSm90 {
  static constexpr bool kInt = std::is_same_v<ElementD, int32_t>;
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignD = 16 / int(sizeof(ElementD));
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

  // ---- epilogue visitor tree
  using RowTermStride = Stride<_1, _0, int64_t>;  // r[m + l*row_bs]
  using ColTermStride = Stride<_0, _1, int64_t>;  // c[n + l*col_bs]
  using RowTerm = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, int32_t, int32_t, RowTermStride>;
  using ColTerm = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, int32_t, int32_t, ColTermStride>;
  using DotEVT = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<BinDot, int32_t, int32_t, kRound>,
      cutlass::epilogue::fusion::Sm90AccFetch, RowTerm, ColTerm>;
  using VecStride = Stride<_0, bool, int64_t>;    // per column (true) or one scalar (false)
  using FVec = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, float, float, VecStride>;
  using FloatEVT = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<BinScaleBias, ElementD, float, kRound>, DotEVT, FVec, FVec, FVec>;
  using EVT = std::conditional_t<kInt, DotEVT, FloatEVT>;
  using ElementCompute = std::conditional_t<kInt, int32_t, float>;

  // StagesD counts 16-bit output buffers; 32-bit outputs get half as many (the same shared memory),
  // so the mainloop keeps its pipeline stages
  static constexpr int kStagesD = StagesD > 0 ? (StagesD * 2 / int(sizeof(ElementD)) > 2 ? StagesD * 2 / int(sizeof(ElementD)) : 2) : 0;
  using CollectiveEpilogue = typename WithStagesD<typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      EpiTile, int32_t, ElementCompute,
      void, LayoutD, kAlignD, ElementD, LayoutD, kAlignD, EpiSched, EVT>::CollectiveOp, kStagesD>::type;
  using Types = B1Kernel<CollectiveEpilogue, TileShape, ClusterShape, MainSched>;
  using CollectiveMainloop = typename Types::CollectiveMainloop;
  using Gemm = typename Types::Gemm;

  static typename Gemm::Arguments arguments(const WgArgs& p) {
    using StrideD = typename Gemm::GemmKernel::StrideD;
    const StrideD sD = make_stride(p.ldd, _1{}, p.d_bs);
    typename Gemm::Arguments args = wg_arguments<Gemm>(p, {{}, nullptr, sD, static_cast<ElementD*>(p.d), sD});
    typename DotEVT::Arguments dot{
        {},                                                          // acc
        {p.row_term, 0, RowTermStride{_1{}, _0{}, p.row_bs}},        // row term
        {p.col_term, 0, ColTermStride{_0{}, _1{}, p.col_bs}},        // column term
        {}};                                                         // 4*acc + r + c
    if constexpr (kInt) {
      args.epilogue.thread = dot;
    } else {
      args.epilogue.thread = {
          dot,
          {p.s1, 1.0f, VecStride{_0{}, p.s1_vec != 0, 0}},
          {p.s2, 1.0f, VecStride{_0{}, p.s2_vec != 0, 0}},
          {p.bias, 0.0f, VecStride{_0{}, true, 0}},
          {}};
    }
    return args;
  }

  // pdl: launch as a programmatic dependent of the kernel before it (the kernel is built with
  // CUTLASS_ENABLE_GDC_FOR_SM90, so its loads wait for that kernel; its set-up overlaps it).
  static std::string run(const WgArgs& p, size_t* ws, cudaStream_t st, bool pdl = false) {
    return launch_gemm<Gemm>(arguments(p), p.workspace, ws, st, pdl);
  }
};

// The same mainloop with the lean epilogue (binary_lean_epilogue.cuh): 16-bit outputs only. kCounted: the
// mainloop counts the row terms (B1MainloopCountA): row term = K - 2 popc(A row), binary_gemm's and
// binary_bmm's (whose A has no bits past K); row_term is not read.
template <class ElementD, class TileShape, class ClusterShape, class MainSched, bool kCounted = false>
struct BGemmSm90Lean {
  static constexpr bool kPingpong = std::is_same_v<MainSched, cutlass::gemm::KernelTmaWarpSpecializedPingpong>;
  using CollectiveEpilogue = LeanBinEpilogue<ElementD, int(size<0>(TileShape{})), int(size<1>(TileShape{})),
                                             kPingpong, kCounted>;
  using Gemm = typename B1Kernel<CollectiveEpilogue, TileShape, ClusterShape, MainSched, kCounted>::Gemm;

  static typename Gemm::Arguments arguments(const WgArgs& p) {
    return wg_arguments<Gemm>(p, {static_cast<ElementD*>(p.d), p.ldd, p.d_bs, kCounted ? nullptr : p.row_term,
                                  kCounted ? 0 : p.row_bs, p.col_term, p.col_bs, p.s1, p.s1_vec, p.s2, p.s2_vec,
                                  p.bias, kCounted ? 8 * p.Kb : 0, kCounted ? -2 : 0});
  }
  static std::string run(const WgArgs& p, size_t* ws, cudaStream_t st, bool pdl = false) {
    return launch_gemm<Gemm>(arguments(p), p.workspace, ws, st, pdl);
  }
};
template <class ElementD, class TileShape, class ClusterShape, class MainSched>
using BGemmSm90LeanCounted = BGemmSm90Lean<ElementD, TileShape, ClusterShape, MainSched, true>;

// Tile configurations (TileShape K in bytes: 128 bytes = 1024 bits of K per pipeline stage).
// The cooperative 128x256 tiles keep all of a tile's 128x32 epilogue subtiles in shared memory
// (8 buffers for 16-bit outputs, 4 of twice the size for 32-bit ones: 64 KB), so the math
// warpgroups hand a tile's TMA stores over and go on to the next tile without waiting for them
// (measured faster than CUTLASS's 2 buffers at 4096^3 and M=1024).
#define BIE_WG_CFG0 BIE_SM90_COOPERATIVE(_128, _256, _128, _2), cutlass::epilogue::collective::EpilogueTileAuto, 8
#define BIE_WG_CFG1 BIE_SM90_PINGPONG(_64, _128, _128, _1)
#define BIE_WG_CFG2 BIE_SM90_PINGPONG(_64, _256, _128, _2)
// as CFG0 without the cluster: no multicast, but no lockstep between the two blocks either (faster
// when a call is one or two waves of tiles, e.g. M = 1024 on 4096x4096 weights)
#define BIE_WG_CFG3 BIE_SM90_COOPERATIVE(_128, _256, _128, _1), cutlass::epilogue::collective::EpilogueTileAuto, 8

// The kernel a configuration gets for output type T: 16-bit outputs the lean epilogue
// (binary_lean_epilogue.cuh), 32-bit ones the visitor tree (whose store buffers StagesD sizes).
template <bool kLean, class T, class Tile, class Cluster, class MainSched, class EpiSched, class EpiTile, int StagesD>
struct BGemmPick {
  using type = BGemmSm90<T, Tile, Cluster, MainSched, EpiSched, EpiTile, StagesD>;
};
template <class T, class Tile, class Cluster, class MainSched, class EpiSched, class EpiTile, int StagesD>
struct BGemmPick<true, T, Tile, Cluster, MainSched, EpiSched, EpiTile, StagesD> {
  using type = BGemmSm90Lean<T, Tile, Cluster, MainSched>;
};
template <class T, class Tile, class Cluster, class MainSched, class EpiSched,
          class EpiTile = cutlass::epilogue::collective::EpilogueTileAuto, int StagesD = 0>
using BGemmFor =
    typename BGemmPick<sizeof(T) == 2, T, Tile, Cluster, MainSched, EpiSched, EpiTile, StagesD>::type;

// The kernels are built with CUTLASS_ENABLE_GDC_FOR_SM90: each waits (griddepcontrol.wait) for the
// kernel before it ahead of its first load, so it can always be launched as a programmatic dependent
// of that kernel; its launch and set-up then overlap the tail of the popcount / packing pass.
#define BIE_WG_DEFINE(name, cfg, T)                                       \
  namespace bie_cutlass_bin {                                             \
  std::string name(const WgArgs& p, size_t* ws, cudaStream_t st) {        \
    return BGemmFor<T, cfg>::run(p, ws, st, true);                        \
  }                                                                       \
  }
// Counted-rows kernels (BGemmSm90LeanCounted, 16-bit outputs): configuration 4 = CFG0's tile, 5 = CFG3's
#define BIE_WG_CFG4 Shape<_128, _256, _128>, Shape<_2, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedCooperative
#define BIE_WG_CFG5 Shape<_128, _256, _128>, Shape<_1, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedCooperative
#define BIE_WG_DEFINE_COUNTED(name, cfg, T)                                \
  namespace bie_cutlass_bin {                                              \
  std::string name(const WgArgs& p, size_t* ws, cudaStream_t st) {         \
    return BGemmSm90LeanCounted<T, cfg>::run(p, ws, st, true);             \
  }                                                                        \
  }

}  // namespace bie_cutlass_bin
