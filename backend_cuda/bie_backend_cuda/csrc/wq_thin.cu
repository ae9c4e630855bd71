// The thin weight-only GEMV ("wqt"): host plan and dispatch. The kernel and its design: wq_thin_kernel.cuh.
#include "common.cuh"
#include "wq_thin.cuh"

namespace bie {
using namespace thin;

// Host plan: K range per warp (whole groups) and warps per block. Returns the dynamic shared memory.
int wqt_plan(WqtArgs& p, int bits, int num_sms, int warps_force) {
  const int ks = 16 * (bits == 8 ? 2 : (bits == 4 ? 4 : 8));   // k per 512-byte vector (16 J)
  const int fs = thin_fs(p.gs_shift);
  p.kstage = stage_k(bits);
  p.nstages = ceil_div((int64_t)p.kblocks * ks, p.kstage);
  p.sms = num_sms;
  const bool one = thin_mx(p) == 1;
  const int wbytes = bits == 8   ? (one ? thin_warp_bytes<8, 1>(fs) : thin_warp_bytes<8, 8>(fs))
                     : bits == 4 ? (one ? thin_warp_bytes<4, 1>(fs) : thin_warp_bytes<4, 8>(fs))
                                 : (one ? thin_warp_bytes<2, 1>(fs) : thin_warp_bytes<2, 8>(fs));
  // measured on the H100 (warps sweeps in benchmarks/results/cuda_h100_thin.md): 8 warps on small layers; on layers
  // of more than 2^26 weights with x staged, 16 (one block per SM; with programmatic launch and the sum(x) table,
  // 4-6 % faster at 4 bits, and at 2 bits when K >= 16384; 2-bit codes with a shorter K stay at 8); fewer when
  // the rings would not fit in the device's shared memory (8 rows of x per stage at 2 bits; smaller GPUs)
  const bool big = (int64_t)p.N * p.K > (1ll << 26);
  // 8-bit codes, one row, small layers with N >= 4096 and K <= 4096: 4 warps and two blocks per multiprocessor
  // (H100, session 14, benchmarks/results/cuda_h100_thin.md: 4096x4096 7.7-8.0 us against 8.7-8.9 with 8 warps and
  // every resident block, in three runs; 11008x4096 level at 18 us). Not elsewhere: K = 11008 (4096x11008) was 23%
  // slower that way and 2048x2048 12% slower; 2- and 4-bit codes measured best with the default below.
  const bool w8_one_small = bits == 8 && p.M == 1 && !big && p.N >= 4096 && p.K <= 4096;
  int w = warps_force > 0 ? warps_force
                          : (one && big && (bits == 4 || p.K >= 16384 || p.M > 1) ? 16 : (w8_one_small ? 4 : 8));
  if (w8_one_small && warps_force <= 0 && p.grid_force <= 0) p.grid_force = 2 * num_sms;
  const int64_t xbytes = one ? thin_xbytes(p) : 0;
  while (w > 1 && w * (int64_t)(wbytes + 2 * 512) + xbytes > p.smem_limit) w /= 2;
  w = std::max(1, std::min(w, std::min(16, p.nstages)));
  p.st_per_warp = ceil_div(p.nstages, w);
  p.warps = ceil_div(p.nstages, p.st_per_warp);
  p.smem = (int)(p.warps * (int64_t)(wbytes + 2 * 512) + xbytes);
  return p.smem;
}

cudaError_t launch_wqt_gemm(const WqtArgs& p, int bits, int cdtype, cudaStream_t st) {
  if (p.M == 0 || p.N == 0) return cudaSuccess;
  if (p.M > 8) return cudaErrorInvalidValue;
  if (cdtype == kF16) {
    if (bits == 8) return thin::launch<8, __half>(p, st);
    if (bits == 4) return thin::launch<4, __half>(p, st);
    if (bits == 2) return thin::launch<2, __half>(p, st);
  } else if (cdtype == kBF16) {
    if (bits == 8) return thin::launch<8, __nv_bfloat16>(p, st);
    if (bits == 4) return thin::launch<4, __nv_bfloat16>(p, st);
    if (bits == 2) return thin::launch<2, __nv_bfloat16>(p, st);
  }
  return cudaErrorInvalidValue;
}

}  // namespace bie
