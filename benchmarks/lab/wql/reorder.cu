// the product's reorder kernel (prepare), exported for the lab
#include "../../../backend_cutlass/bie_backend_cutlass/csrc/wq_reorder.cu"
extern "C" int wql_reorder(const int8_t* codes, void* dst, int n_out, int k, int bits, void* st) {
  return bie_wq::launch_reorder(codes, dst, n_out, k, bits, (cudaStream_t)st).empty() ? 0 : 1;
}
