// bie-backend-cutlass, binary family: a lean epilogue for the Hopper 1-bit GEMM's 16-bit outputs.
//
//   dot = 4*acc + row_term[m] + col_term[n]                        (int32, exact)
//   y   = f16/bf16( float(dot) * (s1*s2)  [+ bias[n]] )            (each step rounded, as the reference;
//                                                                   no bias: nothing added, -0.0 stays)
//
// Why not CUTLASS's epilogue visitor tree: the cooperative kernel's two math warpgroups run the epilogue
// while the tensor cores idle, and the tree (three broadcast vectors staged per subtile, s1*s2 per
// element, a shared-memory round trip per 128x32 subtile) made that about a fifth of a 4096^3 call, most
// of the gap to the same kernel with an accumulator-only epilogue (benchmarks/results/
// cutlass_h100_binary.md). What this one does instead:
//  - the kernel's epilogue load warp (otherwise idle here) runs ahead of the math warpgroups and stages
//    each tile's terms in shared memory: per column pair one 32-byte record {col_term x2, s1*s2 x2,
//    bias x2}, and the tile's row terms (an mbarrier pipeline of 2 tiles), so no global load sits
//    between a tile's mainloop and its stores;
//  - each math thread converts its whole accumulator into packed 16-bit pairs in registers first and
//    only then writes them (stmatrix, four 8x8 blocks per instruction): with no store between two reads
//    of the records, the compiler keeps those reads in flight (converting and writing one column pair at a
//    time pays their latency per pair and is twice as slow);
//  - the outputs are staged as 64x64 boxes in the TMA's 128-byte swizzle (conflict-free stmatrix) and
//    leave by one TMA tensor store per box, issued by one thread; the math warps go straight back to the
//    mainloop, and wait for the TMA to have read a slab only before rewriting it. (Per-row bulk copies,
//    128 per tile, are 2x slower: the TMA engine takes them one at a time; 16-byte stores by the math
//    warps are 1.5x slower.)
//
// It plugs into CUTLASS's sm90 warp-specialized kernels through their operator-style epilogue adapter,
// with its own load pipeline (the kernel builds and initialises it) and TMA stores outside CUTLASS's store
// pipeline. It serves the cooperative 128xN tile (two warpgroups, 64 rows and one slab each) and the
// ping-pong 64xN tile (one warpgroup per tile; the kernel orders the two warpgroups' epilogues and calls
// store_tail after each, which waits for the TMA's reads, so one slab serves both).
//
// Programmatic dependent launch: the load warp waits (griddepcontrol.wait) for the kernel this one was
// launched after before it reads any term (CUTLASS's own wait covers the mainloop's loads).
#pragma once
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>
#include <cutlass/epilogue/collective/detail.hpp>
#include <cutlass/cuda_host_adapter.hpp>

namespace bie_cutlass_bin {

namespace lean_detail {

CUTLASS_DEVICE void wait_prior_grid() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
CUTLASS_DEVICE void smem_writes_to_async_proxy() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}
// one box of the output tensor map, shared -> global by the TMA engine (clipped at the tensor's bounds)
CUTLASS_DEVICE void tma_store_box(const void* tmap, const void* smem, int x, int y, int z) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];"
               ::"l"(reinterpret_cast<uint64_t>(tmap)), "r"(s), "r"(x), "r"(y), "r"(z)
               : "memory");
#endif
}
CUTLASS_DEVICE void tma_store_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
#endif
}
CUTLASS_DEVICE void tma_store_reads_done() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
#endif
}
// four 8x8 blocks of 16-bit values from the mma accumulator layout into shared memory (lane l: the
// address of row l % 8 of block l / 8)
CUTLASS_DEVICE void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
#endif
}
// global -> shared copies that use no registers (so the load warp's 40 hold every load of a tile in flight);
// valid == false: the bytes are zero-filled and nothing is read
CUTLASS_DEVICE void cp_async8(void* smem, const void* gmem, bool valid) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(s), "l"(gmem), "r"(valid ? 8 : 0) : "memory");
}
CUTLASS_DEVICE void cp_async4(void* smem, const void* gmem, bool valid) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(s), "l"(gmem), "r"(valid ? 4 : 0) : "memory");
}
CUTLASS_DEVICE void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
// Counted row terms (B1MainloopCountA in binary_wgmma.cuh): each consumer warpgroup's mainloop leaves the
// set-bit count of its 64 A rows here for its epilogue (512 bytes used). 1024 bytes, 1024-byte aligned:
// static shared memory sits below CUTLASS's dynamic storage, whose 128-byte-swizzled TMA/wgmma stages need a
// 1024-byte aligned base (with 512 bytes here every product came out wrong).
CUTLASS_DEVICE int* a_row_counts() {
  __shared__ alignas(1024) int counts[256];
  return counts;
}
CUTLASS_DEVICE void warpgroup_sync(int id) {
  asm volatile("bar.sync %0, 128;" ::"r"(id) : "memory");
}
template <class T>
CUTLASS_DEVICE uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, cutlass::bfloat16_t>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// The "EpilogueOp" CUTLASS's adapter wraps: arguments, host-side checks, shared storage.
template <class ElementD_, int kTileM, int kTileN, int kSlabRows, int kStages, bool kCountedRows>
struct LeanOp {
  static_assert(sizeof(ElementD_) == 2, "the lean epilogue writes 16-bit outputs");
  using ElementD = ElementD_;
  using ElementC = ElementD_;  // no source tensor; CUTLASS's adapter needs a type
  using StrideD = cute::Stride<int64_t, cute::_1, int64_t>;
  using StrideC = StrideD;
  struct ThreadEpilogueOp {
    using ElementOutput = ElementD_;
    using ElementAccumulator = int32_t;
    using ElementCompute = float;
    static constexpr int kCount = 8;
  };
  // The staged outputs: boxes of 64 rows x 64 columns (128-byte rows) in the TMA's 128-byte swizzle
  // (16-byte chunk j of row r stored at chunk j ^ (r % 8)), so the 8 rows x 4 lanes of a warp's 4-byte
  // writes hit 32 different banks, and one TMA store per box writes it out.
  static constexpr int kBoxCols = 64, kBoxBytes = 64 * 128;
  static constexpr int kBoxesPerSlab = kTileN / kBoxCols;          // one slab = 64 rows of the tile
  static constexpr int kSlabBytes = kBoxesPerSlab * kBoxBytes;
  // a tile's terms, one 32-byte record per column pair: {col_term, col_term', s1*s2, (s1*s2)', bias,
  // bias', -, -}, and the row terms
  struct alignas(32) ColPair {
    int c0, c1;
    float s0, s1, b0, b1;
    int pad0, pad1;
  };
  struct TileTerms {
    ColPair cols[kTileN / 2];
    int rows[kTileM];
  };
  // the load warp's landing area: a tile's terms as they are in global memory (one buffer: only that warp
  // uses it, tile after tile)
  struct RawTerms {
    int2 c[kTileN / 2];
    float2 s1[kTileN / 2], s2[kTileN / 2], b[kTileN / 2];
    int rows[kTileM];
  };
  struct SharedStorage {
    alignas(1024) uint8_t rows[kSlabRows / 64 * kSlabBytes];
    TileTerms terms[kStages];
    RawTerms raw;
  };
  struct Arguments {
    ElementD* d; int64_t ldd, d_bs;
    const int* row_term; int64_t row_bs;
    const int* col_term; int64_t col_bs;
    const float* s1; int s1_vec;
    const float* s2; int s2_vec;
    const float* bias;
    int row_c0, row_c1;   // kCountedRows: row term = row_c0 + row_c1 * popc(A row), row_term unused
  };
  struct Params {
    cute::TmaDescriptor tmap_d;   // D as (N, M, L), boxes of 64 x 64 x 1
    Arguments a;
  };

  // D as a (N, M, L) tensor map with 64 x 64 x 1 boxes in the 128-byte swizzle
  template <class ProblemShape>
  static CUresult encode(ProblemShape const& shape, Arguments const& a, cute::TmaDescriptor* map) {
    const cuuint64_t dims[3] = {cuuint64_t(cute::get<1>(shape)), cuuint64_t(cute::get<0>(shape)),
                                cuuint64_t(cute::get<3>(shape))};
    const cuuint64_t strides[2] = {cuuint64_t(a.ldd) * 2, cuuint64_t(a.d_bs > 0 ? a.d_bs : a.ldd) * 2};
    const cuuint32_t box[3] = {kBoxCols, 64, 1}, unit[3] = {1, 1, 1};
    return CUTLASS_CUDA_DRIVER_WRAPPER_CALL(cuTensorMapEncodeTiled)(
        map, std::is_same_v<ElementD_, cutlass::bfloat16_t> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                            : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        3, a.d, dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
        CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  }
  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& shape, Arguments const& a, void*) {
    Params p{};
    p.a = a;
    encode(shape, a, &p.tmap_d);  // can_implement has already encoded the same map successfully
    return p;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }
  // the output tensor map: 16-byte aligned base and strides; 8-byte aligned term pairs
  template <class ProblemShape>
  static bool can_implement(ProblemShape const& shape, Arguments const& a) {
    const int n = cute::get<1>(shape);
    auto al = [](const void* q, int b) { return reinterpret_cast<uintptr_t>(q) % b == 0; };
    if (!(a.d != nullptr && (kCountedRows || a.row_term != nullptr) && a.col_term != nullptr && al(a.d, 16) && a.ldd % 8 == 0 &&
          a.d_bs % 8 == 0 && n % 8 == 0 && al(a.col_term, 8) && a.col_bs % 2 == 0 &&
          (a.s1 == nullptr || !a.s1_vec || al(a.s1, 8)) && (a.s2 == nullptr || !a.s2_vec || al(a.s2, 8)) &&
          (a.bias == nullptr || al(a.bias, 8))))
      return false;
    cute::TmaDescriptor map;  // whatever else the driver requires of the output's tensor map
    return encode(shape, a, &map) == CUDA_SUCCESS;
  }

  CUTLASS_HOST_DEVICE LeanOp(Params const& p) : params(p.a), tmap_d(&p.tmap_d) {}
  Arguments params;
  const cute::TmaDescriptor* tmap_d;
};

}  // namespace lean_detail

// kPingpong: one warpgroup per tile (the kernel's two consumer warpgroups take turns and their epilogues
// are ordered, so one slab serves both); otherwise kTileM / 64 warpgroups share the tile, 64 rows each.
// kCountedRows: the row terms come from the set-bit counts the mainloop left in a_row_counts()
// (B1MainloopCountA), not from row_term.
template <class ElementD, int kTileM, int kTileN, bool kPingpong, bool kCountedRows = false>
class LeanBinEpilogue
    : public cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<
          lean_detail::LeanOp<ElementD, kTileM, kTileN, kTileM, 2, kCountedRows>> {
  static constexpr int kStages = 2;  // tiles whose terms the epilogue load warp stages ahead
  using Op = lean_detail::LeanOp<ElementD, kTileM, kTileN, kTileM, kStages, kCountedRows>;
  using Base = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<Op>;
  static_assert(kPingpong ? kTileM == 64 : kTileM % 64 == 0, "64 rows per warpgroup");
  static constexpr int kBoxCols = Op::kBoxCols, kBoxBytes = Op::kBoxBytes, kSlabBytes = Op::kSlabBytes;
  static constexpr int kBarrierBase = 8;  // named barriers 9, 10 (CUTLASS reserves 0..7)

 public:
  // The kernel's epilogue load warp runs ahead of the math warpgroups, tile by tile: it stages each
  // tile's terms in shared memory (an mbarrier pipeline of kStages tiles), so the math warpgroups find
  // them there instead of waiting on global loads between their mainloop and their stores.
  using LoadPipeline = cutlass::PipelineAsync<kStages>;
  using LoadPipelineState = cutlass::PipelineState<kStages>;
  using PipelineStorage = typename LoadPipeline::SharedStorage;
  static constexpr bool RequiresTransactionBytes = false;
  using typename Base::StorePipeline;
  using typename Base::StorePipelineState;
  using typename Base::TensorStorage;
  using Params = typename Op::Params;
  using Arguments = typename Op::Arguments;
  using ColPair = typename Op::ColPair;
  using TileTerms = typename Op::TileTerms;

  CUTLASS_HOST_DEVICE LeanBinEpilogue(Params const& p, TensorStorage& s) : Base(p, s), storage_(&s) {}

  CUTLASS_DEVICE bool is_producer_load_needed() const { return true; }

  // The epilogue load warp (lane = 0..31): one tile's terms into the next stage.
  template <class ProblemShapeMNKL, class TileShapeMNK, class TileCoordMNKL, class TiledMma>
  CUTLASS_DEVICE auto load(LoadPipeline pipeline, LoadPipelineState state, ProblemShapeMNKL problem,
                           TileShapeMNK, TileCoordMNKL coord, TiledMma, int lane, TensorStorage&, int = -1) {
    using namespace cute;
    const Arguments& p = this->params;
    const int M = int(get<0>(problem)), N = int(get<1>(problem));
    const int m0 = int(get<0>(coord)) * kTileM, n0 = int(get<1>(coord)) * kTileN;
    const int64_t l = int64_t(get<3>(coord));
    // the terms may come from the kernel this one was launched as a programmatic dependent of
    lean_detail::wait_prior_grid();
    // every load of the tile in flight at once, before waiting for a free stage: cp.async into the raw area
    // (no registers: the producer warps run on 40), then one pass turns them into the stage's records
    constexpr int kPairsPerLane = kTileN / 2 / 32, kRowsPerLane = kTileM / 32;
    const bool s1v = p.s1 != nullptr && p.s1_vec, s2v = p.s2 != nullptr && p.s2_vec;
    typename Op::RawTerms& raw = storage_->raw;
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kPairsPerLane; ++j) {
      const int i = lane + 32 * j, n = n0 + 2 * i;
      const bool in = n < N;   // N % 8 == 0: both columns of the pair are in range or neither
      const int nc = in ? n : 0;
      lean_detail::cp_async8(&raw.c[i], p.col_term + l * p.col_bs + nc, in);
      if (s1v) lean_detail::cp_async8(&raw.s1[i], p.s1 + nc, in);
      if (s2v) lean_detail::cp_async8(&raw.s2[i], p.s2 + nc, in);
      if (p.bias != nullptr) lean_detail::cp_async8(&raw.b[i], p.bias + nc, in);
    }
    if constexpr (!kCountedRows) {
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kRowsPerLane; ++j) {
        const int r = lane + 32 * j, m = m0 + r;
        lean_detail::cp_async4(&raw.rows[r], p.row_term + l * p.row_bs + (m < M ? m : 0), m < M);
      }
    }
    const float s1u = p.s1 != nullptr && !p.s1_vec ? __ldg(p.s1) : 1.0f;
    const float s2u = p.s2 != nullptr && !p.s2_vec ? __ldg(p.s2) : 1.0f;
    pipeline.producer_acquire(state);
    TileTerms& st = storage_->terms[state.index()];
    lean_detail::cp_async_wait_all();   // (each lane reads back only what it copied)
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kPairsPerLane; ++j) {
      const int i = lane + 32 * j;
      const int2 c = raw.c[i];
      const float2 s1 = s1v ? raw.s1[i] : make_float2(s1u, s1u);
      const float2 s2 = s2v ? raw.s2[i] : make_float2(s2u, s2u);
      ColPair& rec = st.cols[i];
      *reinterpret_cast<int4*>(&rec) =
          make_int4(c.x, c.y, __float_as_int(__fmul_rn(s1.x, s2.x)), __float_as_int(__fmul_rn(s1.y, s2.y)));
      *reinterpret_cast<float2*>(&rec.b0) = p.bias != nullptr ? raw.b[i] : make_float2(0.f, 0.f);
    }
    if constexpr (!kCountedRows) {
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kRowsPerLane; ++j) st.rows[lane + 32 * j] = raw.rows[lane + 32 * j];
    }
    pipeline.producer_commit(state);
    ++state;
    return state;
  }

  CUTLASS_DEVICE auto load_tail(LoadPipeline, LoadPipelineState state) { return state; }

  template <class ProblemShapeMNKL, class TileShapeMNK, class TileCoordMNKL, class AccEngine, class AccLayout,
            class TiledMma>
  CUTLASS_DEVICE auto store(LoadPipeline pipeline, LoadPipelineState load_state, StorePipeline,
                            StorePipelineState store_state, ProblemShapeMNKL, TileShapeMNK,
                            TileCoordMNKL coord, cute::Tensor<AccEngine, AccLayout> acc, TiledMma tiled_mma,
                            int thread_idx, TensorStorage&, int = -1) {
    using namespace cute;
    static_assert(int(size<0>(TileShapeMNK{})) == kTileM && int(size<1>(TileShapeMNK{})) == kTileN, "tile");
    // each thread holds one m64nN wgmma accumulator: rows r, r + 8 of its warp's 16, two adjacent
    // columns of every 8 (registers 4i..4i+3 = (r, c), (r, c+1), (r+8, c), (r+8, c+1))
    static_assert(int(size(AccLayout{})) == kTileN / 2, "one m64nN accumulator per thread");
    const int m0 = int(get<0>(coord)) * kTileM, n0 = int(get<1>(coord)) * kTileN;
    const int64_t l = int64_t(get<3>(coord));
    const int hw_wg = int(threadIdx.x) / 128;   // 1 or 2: the consumer warpgroup
    const int t = thread_idx % 128;
    auto tC = tiled_mma.get_slice(thread_idx).partition_C(make_identity_tensor(make_shape(Int<kTileM>{}, Int<kTileN>{})));
    const int r_lo = int(get<0>(tC(0))), r_hi = int(get<0>(tC(2)));
    const int wg_row0 = r_lo - (r_lo % 64);     // this warpgroup's 64 rows of the tile

    // this warpgroup's 64 rows of the tile, as kTileN / 64 swizzled boxes
    uint8_t* slab = storage_->rows + (kPingpong ? 0 : wg_row0 / 64) * kSlabBytes;

    // the TMA has read this slab's previous tile (its issuing thread waits; the barrier tells the rest)
    if (t == 0) lean_detail::tma_store_reads_done();
    lean_detail::warpgroup_sync(kBarrierBase + hw_wg);
    pipeline.consumer_wait(load_state);
    const TileTerms& terms = storage_->terms[load_state.index()];
    int row_lo, row_hi;
    if constexpr (kCountedRows) {   // (written by this warpgroup's mainloop before the barrier above)
      const int* pop = lean_detail::a_row_counts() + (hw_wg - 1) * 64;
      row_lo = this->params.row_c0 + this->params.row_c1 * pop[r_lo - wg_row0];
      row_hi = this->params.row_c0 + this->params.row_c1 * pop[r_hi - wg_row0];
    } else {
      row_lo = terms.rows[r_lo];
      row_hi = terms.rows[r_hi];
    }
    // all of the tile's outputs first, packed in registers (the accumulators die as they go), then all
    // the shared-memory writes: no store sits between two loads of the terms, so the compiler keeps
    // those loads in flight instead of paying their latency once per column pair
    uint32_t packed[kTileN / 4];
    // without a bias nothing is added, as in the reference (so -0.0 stays -0.0), and half the record is read
    auto convert = [&](auto has_bias) {
      constexpr bool kBias = decltype(has_bias)::value;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kTileN / 8; ++i) {
        const int c = int(get<1>(tC(4 * i)));
        const int4 cs = *reinterpret_cast<const int4*>(&terms.cols[c / 2]);   // c0, c1, s0, s1
        const float s0 = __int_as_float(cs.z), s1 = __int_as_float(cs.w);
        float y00 = __fmul_rn(__int2float_rn(4 * acc(4 * i + 0) + row_lo + cs.x), s0);
        float y01 = __fmul_rn(__int2float_rn(4 * acc(4 * i + 1) + row_lo + cs.y), s1);
        float y10 = __fmul_rn(__int2float_rn(4 * acc(4 * i + 2) + row_hi + cs.x), s0);
        float y11 = __fmul_rn(__int2float_rn(4 * acc(4 * i + 3) + row_hi + cs.y), s1);
        if constexpr (kBias) {
          const float2 b = *reinterpret_cast<const float2*>(&terms.cols[c / 2].b0);
          y00 = __fadd_rn(y00, b.x);
          y01 = __fadd_rn(y01, b.y);
          y10 = __fadd_rn(y10, b.x);
          y11 = __fadd_rn(y11, b.y);
        }
        packed[2 * i] = lean_detail::pack2<ElementD>(y00, y01);
        packed[2 * i + 1] = lean_detail::pack2<ElementD>(y10, y11);
      }
    };
    if (this->params.bias != nullptr)
      convert(cute::true_type{});
    else
      convert(cute::false_type{});
    // stmatrix: four 8x8 blocks per instruction, {(chunk i, rows 0-7), (chunk i, rows 8-15), (chunk i+1,
    // rows 0-7), (chunk i+1, rows 8-15)} of this warp's 16 rows (chunk = 8 columns = 16 bytes); lane l
    // names row l % 8 of block l / 8. Rows r and r + 8 share their swizzle (r % 8).
    const int lane = t % 32;
    const int rr = (t / 32) * 16 + (lane & 7) + 8 * ((lane >> 3) & 1);   // slab row this lane addresses
    const uint32_t row_base = static_cast<uint32_t>(__cvta_generic_to_shared(slab)) + rr * 128;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kTileN / 8; i += 2) {
      const int chunk = i + (lane >> 4);
      const uint32_t addr = row_base + (chunk / 8) * kBoxBytes + (((chunk % 8) ^ (lane & 7)) << 4);
      lean_detail::stmatrix_x4(addr, packed[2 * i], packed[2 * i + 1], packed[2 * i + 2], packed[2 * i + 3]);
    }
    pipeline.consumer_release(load_state);
    ++load_state;
    lean_detail::smem_writes_to_async_proxy();
    lean_detail::warpgroup_sync(kBarrierBase + hw_wg);

    // one TMA store per box, by one thread; the math warps go on to their next tile meanwhile
    if (t == 0) {
      CUTLASS_PRAGMA_UNROLL
      for (int b = 0; b < kTileN / kBoxCols; ++b)
        lean_detail::tma_store_box(this->tmap_d, slab + b * kBoxBytes, n0 + b * kBoxCols, m0 + wg_row0, int(l));
      lean_detail::tma_store_commit();
    }
    return cute::make_tuple(load_state, store_state);
  }

  // after the last tile (cooperative) or every tile (ping-pong: the other warpgroup's epilogue reuses
  // the slab next): the TMA has read the staged outputs, so the slab may be rewritten or freed
  CUTLASS_DEVICE auto store_tail(LoadPipeline, LoadPipelineState load_state, StorePipeline,
                                 StorePipelineState store_state) {
    lean_detail::tma_store_reads_done();
    return cute::make_tuple(load_state, store_state);
  }

 private:
  TensorStorage* storage_;
};

}  // namespace bie_cutlass_bin
