// Session 15 lab helper: the dynamic shared memory of lab GEMM types (bwc_smem_<idx>), to see whether a one-warp
// block (popc.cu's thin pass: 1 KB reserved) still fits beside a GEMM block on one SM (228 KB)
#include "bwc_lab.h"
using namespace cute;
using C0 = bie_cutlass_bin::BGemmSm90Lean<cutlass::bfloat16_t, Shape<_128, _256, _128>, Shape<_2, _1, _1>,
                                          cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
using R0 = bie_cutlass_bin::BGemmSm90LeanCounted<cutlass::bfloat16_t, Shape<_128, _256, _128>, Shape<_2, _1, _1>,
                                                 cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
extern "C" int bwc_smem_17() { return int(sizeof(typename C0::Gemm::GemmKernel::SharedStorage)); }
extern "C" int bwc_smem_18() { return int(sizeof(typename R0::Gemm::GemmKernel::SharedStorage)); }
extern "C" int bwc_stages_17() { return int(C0::Gemm::GemmKernel::CollectiveMainloop::DispatchPolicy::Stages); }
extern "C" int bwc_stages_18() { return int(R0::Gemm::GemmKernel::CollectiveMainloop::DispatchPolicy::Stages); }
