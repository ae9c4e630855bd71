// Binary GEMM on CUTLASS 2.x: GemmUniversal over cutlass::uint1b_t, A row-major, B column-major,
// arch::OpAndPopc (mma.sync m16n8k256 .and.popc: native BMMA.168256.AND.POPC on sm_80..sm_90;
// XOR.POPC is emulated on sm_90 and never used), int32 accumulation, and one fused epilogue
// visitor (VisitorBinaryFinish) that turns popc(a & b) into the +-1 dot product
//   dot = 4 popc(a & b) - 2 popc(a) - 2 popc(b) + K
// (row and column terms precomputed), applies scale / bias / output dtype, and writes the
// output with any row stride, optionally scattered to NCHW (binary conv).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "cutlass/cutlass.h"
#include "cutlass/numeric_types.h"
#include "cutlass/numeric_conversion.h"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/default_gemm_universal_with_visitor.h"
#include "cutlass/epilogue/threadblock/fusion/visitors.hpp"

#include "binary_common.h"

namespace bie_cutlass_bin {

using namespace cute;

__device__ __forceinline__ float ld_f32(const void* p, int dt, int64_t i) {
  if (dt == kF16) return __half2float(static_cast<const __half*>(p)[i]);
  if (dt == kBF16) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

// float32(s1) * float32(s2) (one rounding, like linear_scale); 1 when absent.
__device__ __forceinline__ float chan_scale(const EpiArgs& e, int64_t ch) {
  float s = 1.f;
  if (e.s1) s = ld_f32(e.s1, e.s1_dt, e.s1_per ? ch : 0);
  if (e.s2) {
    const float t = ld_f32(e.s2, e.s2_dt, e.s2_per ? ch : 0);
    s = e.s1 ? __fmul_rn(s, t) : t;
  }
  return s;
}

template <class ElementOut>
__device__ __forceinline__ ElementOut cvt_out(float y) {
  if constexpr (std::is_same<ElementOut, float>::value) {
    return y;
  } else if constexpr (std::is_same<ElementOut, cutlass::half_t>::value) {
    return cutlass::half_t::bitcast(__half_as_ushort(__float2half_rn(y)));
  } else {
    return cutlass::bfloat16_t::bitcast(__bfloat16_as_ushort(__float2bfloat16_rn(y)));
  }
}

template <class ThreadMap, class ElementOut>
struct VisitorBinaryFinish {
  struct Arguments {
    EpiArgs e;
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }

  struct SharedStorage {};

  static constexpr int F = ThreadMap::kElementsPerAccess;
  static_assert(F * sizeof(ElementOut) == 16, "one 16-byte vector per access");

  CUTLASS_HOST_DEVICE VisitorBinaryFinish() {}
  CUTLASS_HOST_DEVICE VisitorBinaryFinish(Params const& params, SharedStorage const&) : params_ptr(&params) {}

  Params const* params_ptr;

  template <class CRow, class CCol, class COut, class RI, class RF, class CI, class CF>
  struct Callbacks : cutlass::epilogue::threadblock::detail::EmptyCallbacks {
    CRow tC_cRow;  // (FRAG_ROW, ITERS) coordinates (m, n, l)
    CCol tC_cCol;  // (VECTOR, FRAG_COL)
    COut tC_cOut;  // (VECTOR, FRAG_COL, FRAG_ROW, ITERS)
    RI rRowT;
    RF rRowS, rRowB;
    CI rColT;
    CF rColS, rColB;
    Params const* params_ptr;
    int M, N;

    CUTLASS_DEVICE Callbacks(CRow cr, CCol cc, COut co, RI rt, RF rs, RF rb, CI ct, CF cs, CF cb, int m, int n,
                             Params const* p)
        : tC_cRow(cr), tC_cCol(cc), tC_cOut(co), rRowT(rt), rRowS(rs), rRowB(rb), rColT(ct), rColS(cs),
          rColB(cb), params_ptr(p), M(m), N(n) {}

    // The terms of row (or column) i < extent of batch item l: its popcount term, and where the channels
    // lie along it its scale and bias (elsewhere 1 and 0; past the extent all neutral).
    CUTLASS_DEVICE static void load_terms(EpiArgs const& e, int i, int l, int extent, const int* term,
                                          int64_t term_bs, bool channels, int& t, float& s, float& b) {
      t = 0;
      s = 1.f;
      b = 0.f;
      if (i < extent) {
        t = term[(int64_t)l * term_bs + i];
        if (channels) {
          const int64_t ch = (int64_t)l * e.chan_bs + i;
          s = chan_scale(e, ch);
          if (e.bias) b = ld_f32(e.bias, e.bias_dt, ch);
        }
      }
    }

    CUTLASS_DEVICE void begin_epilogue() {
      EpiArgs const& e = params_ptr->e;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(tC_cRow); ++i) {
        auto c = tC_cRow(i);
        int t;
        float s, b;
        load_terms(e, get<0>(c), get<2>(c), M, e.row_term, e.row_bs, e.chan_row, t, s, b);
        rRowT(i) = t;
        rRowS(i) = s;
        rRowB(i) = b;
      }
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(tC_cCol); ++i) {
        auto c = tC_cCol(i);
        int t;
        float s, b;
        load_terms(e, get<1>(c), get<2>(c), N, e.col_term, e.col_bs, !e.chan_row, t, s, b);
        rColT(i) = t;
        rColS(i) = s;
        rColB(i) = b;
      }
    }

    template <class ElementAccumulator, int FragmentSize>
    CUTLASS_DEVICE auto visit(int iter_idx, int row_idx, int column_idx, int frg_idx,
                              cutlass::Array<ElementAccumulator, FragmentSize> const& frg_acc) {
      static_assert(FragmentSize == F, "fragment is one output vector");
      EpiArgs const& e = params_ptr->e;
      auto co = tC_cOut(0, column_idx, row_idx, iter_idx);
      const int m = get<0>(co), n = get<1>(co), l = get<2>(co);
      const int rt = rRowT(row_idx, iter_idx);
      const float rs = rRowS(row_idx, iter_idx), rb = rRowB(row_idx, iter_idx);
      cutlass::AlignedArray<ElementOut, FragmentSize, 16> out;
      CUTLASS_PRAGMA_UNROLL
      for (int v = 0; v < FragmentSize; ++v) {
        int d = 4 * int(frg_acc[v]) + rt + rColT(v, column_idx);
        if (e.halve) d >>= 1;  // pad_value 0: (dot(-1) + dot(+1)) / 2, always even
        if constexpr (std::is_same<ElementOut, int32_t>::value) {
          out[v] = d;
        } else {
          float y = float(d);
          // one of the two factors / addends is exactly 1 / 0: no extra rounding
          if (e.has_scale) y = __fmul_rn(y, rs * rColS(v, column_idx));
          if (e.bias) y = __fadd_rn(y, rb + rColB(v, column_idx));
          out[v] = cvt_out<ElementOut>(y);
        }
      }
      if (m < M && n < N) {
        ElementOut* base = static_cast<ElementOut*>(e.out) + (int64_t)l * e.out_bs + (int64_t)m * e.out_ldm;
        int q = 0, r = n;
        if (e.out_p > 0) {
          q = n / (int)e.out_p;
          r = n - q * (int)e.out_p;
        }
        if (e.vec_ok && n + FragmentSize <= N) {
          ElementOut* dst = base + (int64_t)q * e.out_sq + r;
          *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<uint4 const*>(&out);
        } else {
          CUTLASS_PRAGMA_UNROLL
          for (int v = 0; v < FragmentSize; ++v) {
            if (n + v < N) base[(int64_t)q * e.out_sq + r] = out[v];
            ++r;
            if (e.out_p > 0 && r == (int)e.out_p) {
              r = 0;
              ++q;
            }
          }
        }
      }
      return frg_acc;
    }
  };

  template <class ProblemShape>
  CUTLASS_DEVICE auto get_callbacks(cutlass::gemm::GemmCoord threadblock_tile_offset, int thread_idx,
                                    ProblemShape problem_shape) {
    Tensor cD = make_identity_tensor(problem_shape);  // (M, N, L) -> (m, n, l)
    // VECTOR, FRAGMENT_COLUMN, FRAGMENT_ROW, ITERATION_ROW, ITERATION_GROUP, ITERATION_CLUSTER
    auto part = ThreadMap::partition(cD, thread_idx, threadblock_tile_offset);
    auto cRow = group_modes<1, 4>(part(_0{}, _0{}, _, _, _, _));
    auto cCol = part(_, _, _0{}, _0{}, _0{}, _0{});
    auto cOut = group_modes<3, 6>(part);
    auto rRowT = make_tensor<int>(shape(cRow));
    auto rRowS = make_tensor<float>(shape(cRow));
    auto rRowB = make_tensor<float>(shape(cRow));
    auto rColT = make_tensor<int>(shape(cCol));
    auto rColS = make_tensor<float>(shape(cCol));
    auto rColB = make_tensor<float>(shape(cCol));
    return Callbacks<decltype(cRow), decltype(cCol), decltype(cOut), decltype(rRowT), decltype(rRowS),
                     decltype(rColT), decltype(rColS)>(cRow, cCol, cOut, rRowT, rRowS, rRowB, rColT, rColS, rColB,
                                                       int(get<0>(problem_shape)), int(get<1>(problem_shape)),
                                                       params_ptr);
  }
};

template <int BM, int BN, int BK, int WM, int WN, int STAGES, class ElementOut>
struct BinGemm {
  using TB = cutlass::gemm::GemmShape<BM, BN, BK>;
  using WS = cutlass::gemm::GemmShape<WM, WN, BK>;
  static constexpr int kAlignC = 16 / int(sizeof(ElementOut));
  using ThreadMap = cutlass::epilogue::threadblock::OutputTileThreadLayout<TB, WS, ElementOut, kAlignC, 1>;
  using Finish = VisitorBinaryFinish<ThreadMap, ElementOut>;
  using Kernel = typename cutlass::gemm::kernel::DefaultGemmWithVisitor<
      cutlass::uint1b_t, cutlass::layout::RowMajor, cutlass::ComplexTransform::kNone, 128,
      cutlass::uint1b_t, cutlass::layout::ColumnMajor, cutlass::ComplexTransform::kNone, 128,
      ElementOut, cutlass::layout::RowMajor, kAlignC,
      int32_t, float,
      cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80, TB, WS, cutlass::gemm::GemmShape<16, 8, 256>,
      Finish, cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<8>, STAGES, cutlass::arch::OpAndPopc,
      1>::GemmKernel;
  using Device = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static cudaError_t run(const GemmArgs& g, cudaStream_t st) {
    typename Finish::Arguments epi{g.epi};
    const bool batched = g.batch > 1;
    typename Device::Arguments args(
        batched ? cutlass::gemm::GemmUniversalMode::kBatched : cutlass::gemm::GemmUniversalMode::kGemm,
        cutlass::gemm::GemmCoord(g.M, g.N, g.K), batched ? g.batch : 1, epi, g.a, g.b, nullptr, nullptr,
        g.a_bs, g.b_bs, int64_t(0), int64_t(0), int64_t(g.lda), int64_t(g.ldb), int64_t(0), int64_t(0));
    Device op;
    cutlass::Status s = op.initialize(args, nullptr, st);
    if (s != cutlass::Status::kSuccess) {
      cudaError_t e = cudaGetLastError();
      return e != cudaSuccess ? e : cudaErrorInvalidConfiguration;
    }
    s = op.run(st);
    if (s != cutlass::Status::kSuccess) {
      cudaError_t e = cudaGetLastError();
      return e != cudaSuccess ? e : cudaErrorLaunchFailure;
    }
    return cudaSuccess;
  }
};

}  // namespace bie_cutlass_bin

// One (tile configuration, output type) per translation unit so that ninja builds them in parallel.
#define BIE_BGEMM_CFG0(OUT) ::bie_cutlass_bin::BinGemm<128, 256, 512, 64, 64, 3, OUT>
#define BIE_BGEMM_CFG1(OUT) ::bie_cutlass_bin::BinGemm<128, 256, 1024, 64, 64, 3, OUT>
#define BIE_BGEMM_CFG2(OUT) ::bie_cutlass_bin::BinGemm<64, 128, 512, 32, 64, 4, OUT>
#define BIE_BGEMM_DEFINE(NAME, CFG, OUT)                                                        \
  namespace bie_cutlass_bin {                                                                    \
  cudaError_t NAME(const GemmArgs& g, cudaStream_t st) { return CFG(OUT)::run(g, st); }          \
  }
