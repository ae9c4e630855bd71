// Pieces shared by the weight-only kernels (weight_only.cu: small-M kernel; wq_skinny.cu: skinny
// kernel; wq_wgmma.cu: the Hopper wgmma kernel): 16-bit pair types, the magic
// exponents that turn codes into exact fp16/bf16 values with one LOP3, the
// A-fragment code extraction of the interleaved skinny layout, statistics
// decoding and the cp.async helpers.
#pragma once
#include <cstdint>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace bie {

template <typename T> struct V2;
template <> struct V2<__half> {
  using t = __half2;
  static __device__ __forceinline__ t from_bits(uint32_t u) { return *reinterpret_cast<t*>(&u); }
  static __device__ __forceinline__ t dup(__half v) { return __half2half2(v); }
  static constexpr uint32_t one_bits = 0x3C003C00u;
};
template <> struct V2<__nv_bfloat16> {
  using t = __nv_bfloat162;
  static __device__ __forceinline__ t from_bits(uint32_t u) { return *reinterpret_cast<t*>(&u); }
  static __device__ __forceinline__ t dup(__nv_bfloat16 v) { return __bfloat162bfloat162(v); }
  static constexpr uint32_t one_bits = 0x3F803F80u;
};

template <typename T> struct Magic;  // bits of the pair {MAGIC, MAGIC}
template <> struct Magic<__half> { static constexpr uint32_t v = 0x64006400u; };
template <> struct Magic<__nv_bfloat16> { static constexpr uint32_t v = 0x43004300u; };

template <int BITS> struct Layout;
template <> struct Layout<4> { static constexpr int J = 4; };
template <> struct Layout<2> { static constexpr int J = 8; };
template <> struct Layout<8> { static constexpr int J = 2; };

// (x & mask) | magic in one LOP3.
template <uint32_t MASK, uint32_t MAGIC>
__device__ __forceinline__ uint32_t and_or(uint32_t x) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(r) : "r"(x), "n"(MASK), "n"(MAGIC));
  return r;
}

namespace frag {

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// (a run-time count, 0..7: the instruction takes an immediate)
__device__ __forceinline__ void cp_wait_n(int n) {
  switch (n) {
    case 0: cp_wait<0>(); break;
    case 1: cp_wait<1>(); break;
    case 2: cp_wait<2>(); break;
    case 3: cp_wait<3>(); break;
    case 4: cp_wait<4>(); break;
    case 5: cp_wait<5>(); break;
    case 6: cp_wait<6>(); break;
    default: cp_wait<7>(); break;
  }
}
__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
// 16 bytes streamed from global memory (read once: not kept in L1)
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ void sts32f(uint32_t addr, float v) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}

__device__ __forceinline__ uint32_t bf16x2_of_bytes(uint32_t x, uint32_t s0, uint32_t s1) {
  // two bytes of x (selectors 0x5440 + i) -> exact bf16 pair via float32 magic
  const float f0 = __uint_as_float(__byte_perm(x, 0x00004B00u, s0)) - 8388608.f;
  const float f1 = __uint_as_float(__byte_perm(x, 0x00004B00u, s1)) - 8388608.f;
  // both are integers < 256, exact in bf16: keep the high halves
  return __byte_perm(__float_as_uint(f0), __float_as_uint(f1), 0x7632);
}

// The four A registers of step j, as qm = code + MAGIC (or code for 8-bit bf16).
template <int BITS, typename T>
__device__ __forceinline__ void extract_a(const uint4& v, int j, uint32_t (&a)[4]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  if (BITS == 4) {
    const uint32_t x = w[j];
    a[0] = and_or<0x000F000Fu, Magic<T>::v>(x);
    a[1] = and_or<0x000F000Fu, Magic<T>::v>(x >> 4);
    a[2] = and_or<0x000F000Fu, Magic<T>::v>(x >> 8);
    a[3] = and_or<0x000F000Fu, Magic<T>::v>(x >> 12);
  } else if (BITS == 2) {
    const uint32_t x = w[j >> 1] >> ((j & 1) * 8);
    a[0] = and_or<0x00030003u, Magic<T>::v>(x);
    a[1] = and_or<0x00030003u, Magic<T>::v>(x >> 2);
    a[2] = and_or<0x00030003u, Magic<T>::v>(x >> 4);
    a[3] = and_or<0x00030003u, Magic<T>::v>(x >> 6);
  } else {
    const uint32_t x0 = w[2 * j], x1 = w[2 * j + 1];
    if (Magic<T>::v == 0x64006400u) {
      a[0] = __byte_perm(x0, 0x64646464u, 0x4140);
      a[1] = __byte_perm(x0, 0x64646464u, 0x4342);
      a[2] = __byte_perm(x1, 0x64646464u, 0x4140);
      a[3] = __byte_perm(x1, 0x64646464u, 0x4342);
    } else {
      a[0] = bf16x2_of_bytes(x0, 0x5440, 0x5441);
      a[1] = bf16x2_of_bytes(x0, 0x5442, 0x5443);
      a[2] = bf16x2_of_bytes(x1, 0x5440, 0x5441);
      a[3] = bf16x2_of_bytes(x1, 0x5442, 0x5443);
    }
  }
}

// Programmatic dependent launch (launch_kernel with pdl, common.cuh): a kernel launched that way may start while the
// previous kernel in the stream still runs. launch_dependents lets the next kernel start early in turn; wait blocks
// until the previous kernel has finished and its writes are visible: nothing it may write (x, workspaces,
// counters, outputs) is touched before. Without a programmatic launch, or before sm_90, both are no-ops.
__device__ __forceinline__ void griddep_launch_dependents() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void griddep_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
// a 4-byte global load through L2 only (data another kernel may just have written)
__device__ __forceinline__ uint32_t ldg_cg32(const void* src) {
  uint32_t v;
  asm volatile("ld.global.cg.u32 %0, [%1];\n" : "=r"(v) : "l"(src) : "memory");
  return v;
}

// 4-byte cp.async (zero-filled when src_bytes is 0): x staging when K is only even.
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
// Sum of a packed 16-bit pair, in float32.
template <typename T> __device__ __forceinline__ float pair_sum(uint32_t u);
template <> __device__ __forceinline__ float pair_sum<__nv_bfloat16>(uint32_t u) {
  return __uint_as_float(u << 16) + __uint_as_float(u & 0xFFFF0000u);
}
template <> __device__ __forceinline__ float pair_sum<__half>(uint32_t u) {
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&u));
  return f.x + f.y;
}

// c += A (16x16, four registers) * B (16x8, two registers), float32 accumulate.
template <typename T> __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <> __device__ __forceinline__ void mma<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <> __device__ __forceinline__ void mma<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void decode_stat(uint32_t u, bool bf, float& s, float& z) {
  if (bf) {
    s = __uint_as_float(u << 16);
    z = __uint_as_float(u & 0xFFFF0000u);
  } else {
    s = __half2float(__ushort_as_half((unsigned short)(u & 0xFFFFu)));
    z = __half2float(__ushort_as_half((unsigned short)(u >> 16)));
  }
}

}  // namespace frag
}  // namespace bie
