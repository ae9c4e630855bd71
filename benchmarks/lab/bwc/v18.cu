// NEEDS benchmarks/lab/bwc/rowpopc.patch applied to the product headers (git apply); built, never run on a GPU yet (session 14).
// v17 with the row terms counted in the mainloop (B1MainloopRowPopc): no popcount pass before the GEMM
#include "bwc_lab.h"
using namespace cute;
extern "C" int bwc_run_18(const bie_cutlass_bin::WgArgs* p, size_t* ws, void* st, int pdl, char* err, int errlen) {
  using G = bie_cutlass_bin::BGemmSm90LeanRowPopc<cutlass::bfloat16_t, Shape<_128, _256, _128>, Shape<_2, _1, _1>,
                                                  cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  // binary_gemm's row term: K - 2 popc(a row)
  std::string e = G::run(*p, ws, (cudaStream_t)st, pdl != 0, p->Kb * 8, -2);
  if (!e.empty() && err) { snprintf(err, errlen, "%s", e.c_str()); return 1; }
  return 0;
}
