// bie-backend-cutlass, binary family: the CuTe MMA atom of the Hopper 1-bit wgmma
// (wgmma.mma_async.m64nNk256.s32.b1.b1.and.popc, A and B in shared memory, K-major), N = 128 or 256.
//
// The atom consumes 256 bits of K per row, i.e. 32 bytes: exactly what the int8 K-major wgmma
// (m64nNk32.s32.s8.s8) consumes. Its traits therefore describe the operands as int8 "elements"
// (Shape_MNK = (64, N, 32) bytes) with the int8 SS atom's layouts, so every shared-memory layout,
// swizzle, descriptor and TMA copy built for a K-major int8 GEMM serves packed bits unchanged.
#pragma once
#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

namespace bie_cutlass_bin {

// The registers of the m64nNk256 atom: A and B as shared-memory descriptors, D = C in 64 x N int32 over
// the warpgroup's 128 threads.
template <int N>
struct B1AndSSRegs {
  using DRegisters = void;
  using ARegisters = uint64_t[1];
  using BRegisters = uint64_t[1];
  using CRegisters = uint32_t[N / 2];
};

// D(64 x N, int32) (+)= popc(A & B) over 256 bits of K; its fma per width: binary_wgmma_atom_fma.h
template <int N>
struct SM90_64xNx256_S32B1B1_AND_SS;

}  // namespace bie_cutlass_bin

#include "binary_wgmma_atom_fma.h"

namespace cute {

template <int N>
struct MMA_Traits<bie_cutlass_bin::SM90_64xNx256_S32B1B1_AND_SS<N>> {
  using ValTypeD = int32_t;
  using ValTypeA = int8_t;   // 8 packed bits per "element": 32 elements = 256 bits of K
  using ValTypeB = int8_t;
  using ValTypeC = int32_t;
  using FrgTypeA = GMMA::smem_desc<GMMA::Major::K>;
  using FrgTypeB = GMMA::smem_desc<GMMA::Major::K>;
  using Shape_MNK = Shape<_64, Int<N>, _32>;
  using ThrID = Layout<_128>;
  using ALayout = GMMA::ABLayout<64, 32>;
  using BLayout = GMMA::ABLayout<N, 32>;
  using CLayout = GMMA::CLayout_64xN<N>;
  GMMA::ScaleOut accumulate_ = GMMA::ScaleOut::One;
};

}  // namespace cute
