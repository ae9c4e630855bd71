// v18's row terms counted in the mainloop (B1MainloopCountA), ping-pong 64x128 c1x1
#include "bwc_lab.h"
using namespace cute;
extern "C" int bwc_run_21(const bie_cutlass_bin::WgArgs* p, size_t* ws, void* st, int pdl, char* err, int errlen) {
  using G = bie_cutlass_bin::BGemmSm90LeanCounted<cutlass::bfloat16_t, Shape<_64, _128, _128>, Shape<_1, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedPingpong>;
  std::string e = G::run(*p, ws, (cudaStream_t)st, pdl != 0);   // binary_gemm: K - 2 popc(a row)
  if (!e.empty() && err) { snprintf(err, errlen, "%s", e.c_str()); return 1; }
  return 0;
}
