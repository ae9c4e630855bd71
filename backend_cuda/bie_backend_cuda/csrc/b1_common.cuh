// Device helpers shared by the mma.sync binary kernels (binary.cu: GEMM; binary_conv.cu: direct conv): the sign
// test, 16-byte cp.async with zero fill, its groups, and the 1-bit AND+POPC MMA.
#pragma once
#include <cstdint>

#include "common.cuh"

namespace bie {

// sgn(x) >= 0 as the +1 bit: sgn(0) = +1, NaN -> -1 (the comparison is false)
template <typename T> __device__ __forceinline__ bool nonneg(T v) { return to_f32(v) >= 0.f; }
template <> __device__ __forceinline__ bool nonneg<int8_t>(int8_t v) { return v >= 0; }
template <> __device__ __forceinline__ bool nonneg<float>(float v) { return v >= 0.f; }

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}
// 16-byte async copy; bytes beyond nbytes (0..16) are zero-filled, so rows and bytes past the data are read as
// zero bits without touching global memory.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int nbytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(nbytes));
}
// (the same, to a generic pointer into shared memory)
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int nbytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
               "l"(src), "r"(nbytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// c += popc(a & b) over 256 bits of K per (row, column): a 16 x 256, b 256 x 8 (sm_80+)
__device__ __forceinline__ void mma_b1_and(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k256.row.col.s32.b1.b1.s32.and.popc "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

}  // namespace bie
