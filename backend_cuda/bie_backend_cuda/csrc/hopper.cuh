// Hopper (sm_90a) building blocks shared by the wgmma kernels: wgmma group
// control, shared-memory matrix descriptors, mbarriers, bulk (TMA-engine)
// copies, named barriers and register reallocation. Every helper compiles to
// nothing on other targets; callers only launch these kernels on sm_90.
#pragma once
#include <cstdint>

// The PTX of the helpers below exists on sm_90a only; elsewhere each statement compiles to nothing
// (a value it would write keeps its initial value).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define BIE_SM90_ASM(...) asm volatile(__VA_ARGS__)
#else
#define BIE_SM90_ASM(...) ((void)0)
#endif

namespace bie {
namespace hop {

__device__ __forceinline__ void fence_proxy_async() {
  BIE_SM90_ASM("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_fence() {
  BIE_SM90_ASM("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  BIE_SM90_ASM("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void wgmma_wait() {
  BIE_SM90_ASM("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Shared-memory matrix descriptor of a K-major tile with 128-byte rows in the
// 128-byte swizzle: 8-row groups 1024 bytes apart (stride byte offset), the
// leading byte offset unused for this layout.
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
         ((uint64_t)1 << 62);
}

// ---- mbarriers (shared-memory addresses)
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  BIE_SM90_ASM("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// makes the initialised barriers visible to the asynchronous (bulk copy) proxy
__device__ __forceinline__ void mbar_init_fence() {
  BIE_SM90_ASM("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  BIE_SM90_ASM("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  BIE_SM90_ASM("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Blocks until the phase with the given parity has completed (a fresh barrier
// counts its previous phase, parity 1, as completed).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  BIE_SM90_ASM(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// ---- bulk copies through the TMA engine (16-byte aligned, sizes multiple of 16)
// global -> shared, completion counted in bytes on an mbarrier
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  BIE_SM90_ASM("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
// a box of a 2-D tensor map (coordinates: element x along the contiguous dimension, row y) -> shared memory,
// completion counted in bytes on an mbarrier; the map's box, swizzle and out-of-bounds fill apply
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* tmap, int x, int y, uint32_t bar) {
  BIE_SM90_ASM(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(tmap), "r"(x), "r"(y), "r"(bar)
      : "memory");
}
// shared -> global, tracked by this thread's bulk groups (not by an mbarrier)
__device__ __forceinline__ void bulk_s2g(void* dst, uint32_t src, uint32_t bytes) {
  BIE_SM90_ASM("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(src), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  BIE_SM90_ASM("cp.async.bulk.commit_group;\n" ::: "memory");
}
// this thread's committed bulk stores have read their shared-memory source (it may be overwritten)
__device__ __forceinline__ void bulk_wait_read_all() {
  BIE_SM90_ASM("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// this thread's committed bulk stores are complete (written to global memory)
__device__ __forceinline__ void bulk_wait_all() {
  BIE_SM90_ASM("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

// ---- barriers among a subset of warps, register reallocation between warpgroups
// four 8x8 blocks of 16-bit pairs (a thread's register m: row lane / 4, columns 2 (lane % 4) + 0 / 1 of block m)
// stored transposed: lane 8 m + r names the shared-memory address of stored row r (= column r) of block m
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
template <int R> __device__ __forceinline__ void regs_dec() {
  BIE_SM90_ASM("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R> __device__ __forceinline__ void regs_inc() {
  BIE_SM90_ASM("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}

// ---- thread-block clusters
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r = 0;
  BIE_SM90_ASM("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t cluster_id_x() {
  uint32_t r = 0;
  BIE_SM90_ASM("mov.u32 %0, %%clusterid.x;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t cluster_count_x() {
  uint32_t r = 1;
  BIE_SM90_ASM("mov.u32 %0, %%nclusterid.x;\n" : "=r"(r));
  return r;
}
// the blocks of this block's cluster (1 where clusters do not exist)
__device__ __forceinline__ uint32_t cluster_size() {
  uint32_t r = 1;
  BIE_SM90_ASM("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(r));
  return r;
}
// a 32-bit store to the same shared-memory offset in block `rank` of the cluster
__device__ __forceinline__ void st_shared_cluster(uint32_t addr, uint32_t rank, uint32_t v) {
  BIE_SM90_ASM(
      "{\n.reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "st.shared::cluster.u32 [remote], %2;\n}\n" ::"r"(addr),
      "r"(rank), "r"(v)
      : "memory");
}
// a 16-byte store to the same (16-byte aligned) shared-memory offset in block `rank` of the cluster
__device__ __forceinline__ void st_shared_cluster_v4(uint32_t addr, uint32_t rank, const uint4& v) {
  BIE_SM90_ASM(
      "{\n.reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "st.shared::cluster.v4.u32 [remote], {%2, %3, %4, %5};\n}\n" ::"r"(addr),
      "r"(rank), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
      : "memory");
}
// every thread of every block of the cluster arrives, then waits (memory ordered across the cluster)
__device__ __forceinline__ void cluster_sync() {
  BIE_SM90_ASM("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// The two halves of a cluster barrier that orders no memory: a block arrives early and waits later, which only tells
// it that every block of the cluster has started (the shared memory of a block that has not started may not be
// written, CUDA C++ Programming Guide, distributed shared memory). Every thread calls both, in this order.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  BIE_SM90_ASM("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  BIE_SM90_ASM("barrier.cluster.wait.aligned;\n" ::: "memory");
}
// arrive on the mbarrier at the same shared-memory offset in block `rank` of the cluster
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t rank) {
  BIE_SM90_ASM(
      "{\n.reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n}\n" ::"r"(bar),
      "r"(rank)
      : "memory");
}
// global -> the same shared-memory offset in every block of `mask`, completion counted in bytes on the
// mbarrier at the same offset in each of them
__device__ __forceinline__ void bulk_g2s_multicast(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar,
                                                   uint16_t mask) {
  BIE_SM90_ASM(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, [%3], %4;\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar), "h"(mask)
      : "memory");
}

}  // namespace hop
}  // namespace bie
