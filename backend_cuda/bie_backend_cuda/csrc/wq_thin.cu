// The thin weight-only GEMV: host plan and dispatch. The kernel and its design: wq_thin_kernel.cuh.
#include "common.cuh"
#include "wq_thin.cuh"

namespace bie {
using namespace thin;

int wq_thin_max_warps() { return THIN_MAX_WARPS; }

// Host plan: how x is held (whole rows staged per block, staged per K slice, or copied per stage), the K range per
// warp (whole stages) and warps per block. Returns the dynamic shared memory.
int wq_thin_plan(WqThinArgs& p, int bits, int num_sms, int warps_force, int slices_force) {
  const int ks = 16 * (bits == 8 ? 2 : (bits == 4 ? 4 : 8));   // k per 512-byte vector (16 J)
  const int fs = thin_fs(p.gs_shift);
  const int mr = p.M > 8 ? 2 : 1;   // 8-row tiles of the output fragments
  p.kstage = stage_k(bits, mr);
  p.nstages = ceil_div((int64_t)p.kblocks * ks, p.kstage);
  p.sms = num_sms;
  p.kslices = 1;
  p.slice_stages = p.nstages;
  const bool big = (int64_t)p.N * p.K > (1ll << 26);
  // K slices (each block stages x over its slice of K, its warps split the columns): from 5 rows always (faster than
  // x staged whole with the warps splitting K), and for 2-4 rows of a big layer whose rows do not fit whole
  // (per-stage copies of several rows read x from L2 once per warp and stage: slower than the skinny kernel there).
  // 2-4 rows that fit stay whole; small layers keep per-stage copies up to 4 rows. 9-16 rows are never copied per
  // stage. (Measurements: benchmarks/results/cuda_h100.md.)
  const bool whole = thin_mx(p) == 1;
  const bool fits = thin_fits(p);
  // One row of 4-bit codes in groups of 128 on layers of more than 2^24 weights (decode's larger projections): K
  // slices too, their count from the per-item cost below. On the H200 this read 4096x6144 .. 28672x8192 1-18% faster
  // than x staged whole with the warps splitting K; 4096x4096 and smaller stayed faster whole
  // (benchmarks/results/cuda_thin_h200.md).
  const bool one_row_slices = slices_force == 0 && p.M == 1 && bits == 4 && fs == 8 && fits && p.nstages >= 2 &&
                              (int64_t)p.N * p.K > (1ll << 24);
  const bool sliced = slices_force > 0 || (slices_force == 0 && (p.M > 4 || (!fits && big))) || (p.M > 8 && !fits) ||
                      one_row_slices;
  p.mx = sliced || whole ? 1 : 8;
  const bool one = p.mx == 1;
  // 4-bit codes, one row tile, x staged: the 8-stage ring instead of 4 on layers of more than 2^26 weights for one row
  // in groups of at most 128, for 2-4 rows (x staged whole), and for 5-8 rows per channel or in groups of 256 or more
  // (where it measured faster). 8-bit codes: 4 stages instead of 3 on layers of at most 2^26 weights (Thin).
  const bool deep_ring = p.M == 1 ? fs > 0 : (p.M <= 4 || fs == 0);
  p.deep = one && mr == 1 && ((bits == 4 && big && deep_ring) || (bits == 8 && !big));
  const int wbytes = mr == 2      ? (bits == 8 ? thin_warp_bytes<8, 1, 2>(fs)
                                                 : bits == 4 ? thin_warp_bytes<4, 1, 2>(fs) : thin_warp_bytes<2, 1, 2>(fs))
                     : bits == 8 ? (one ? (p.deep ? thin_warp_bytes<8, 1, 1, true>(fs) : thin_warp_bytes<8, 1>(fs))
                                        : thin_warp_bytes<8, 8>(fs))
                     : bits == 4 ? (one ? (p.deep ? thin_warp_bytes<4, 1, 1, true>(fs) : thin_warp_bytes<4, 1>(fs))
                                        : thin_warp_bytes<4, 8>(fs))
                                 : (one ? thin_warp_bytes<2, 1>(fs) : thin_warp_bytes<2, 8>(fs));
  // K slices: the warps of a block split the columns (each warp streams whole items over the block's slice and
  // writes its own partial sums; no barrier per item, whose reduction by one warp was the bottleneck at 16 rows)
  p.cols = sliced ? 1 : 0;
  // the items of a K slice dealt to its blocks in turn (p.rr, wq_thin_kernel.cuh)
  p.rr = p.cols;
  // per warp: its ring + the item partials' buffers (two parities, mr float4 per lane) when the warps split K
  const int64_t per_warp = wbytes + (p.cols ? 0 : 2 * 512 * mr);
  // x through a ring (p.xring: the XC kernels, wq_thin_kernel.cuh): 9-16 rows of 4-bit codes in groups of 128 on
  // layers of more than 2^27 weights whose items all fit one pass of one K slice (every warp but the producer at most
  // one item: 28672x8192 on 132 SMs). Each block then holds a ring of chunks of x instead of its whole slice, filled
  // and summed by its last warp (the producer), so x need not fit: one slice, no float32 partials, no reduction
  // kernel, where x staged whole per slice needs two. Not where the items need several slices (there x staged in
  // slices measured level or faster).
  {
    const bool can = mr == 2 && bits == 4 && fs == 8 && p.bulk && (p.xpre == -2 || p.xpre == -3) && slices_force >= 0;
    if (can && (int64_t)p.N * p.K > (1ll << 27) && slices_force == 0 && warps_force <= 0) {
      const int w = std::min(warps_force > 0 ? warps_force : 16, thin_max_warps(bits, fs, mr));
      const int64_t items = ceil_div(p.N, 16), iw = w - 1;   // (the last warp is the producer)
      int ks = slices_force;   // else the most slices that keep one item per warp
      for (int k = std::min(p.nstages, num_sms); ks == 0 && iw > 0 && k >= 1; --k)
        if ((int64_t)(num_sms / k) * iw >= items) ks = k;
      if (ks > 0 && iw > 0 && ks == 1) {
        WqThinArgs q = p;
        q.slice_stages = ceil_div(p.nstages, std::min(ks, p.nstages));
        q.kslices = ceil_div(p.nstages, q.slice_stages);
        // stages per chunk: two turns of the two-tile ring, 32 stages of x held (4 chunks). Every chunk step costs
        // its waits, so chunks are not shorter; with 2 chunks the producer waits for the slowest warp to leave a chunk
        // before refilling it, so there are not fewer
        constexpr int S2 = Thin<4, 1, 2>::S;
        q.xring = 2 * S2;
        q.xring_r = std::max(4, std::min(THIN_XCHUNKS, 32 / q.xring));
        // the producer issues a chunk's copies R / 2 steps before it sums it
        q.xring_d = q.xring_r / 2;
        const int64_t smem = w * per_warp + thin_xbytes(q, q.xring_r * q.xring) + THIN_XCHUNKS * 8;
        if ((int64_t)(num_sms / q.kslices) * iw >= items && smem <= p.smem_limit) {
          q.xpre = -3;
          q.mx = q.cols = q.rr = 1;
          q.warps = w;
          q.st_per_warp = q.slice_stages;
          q.smem = (int)smem;
          p = q;
          return p.smem;
        }
      }
    }
  }
  // Warps per block, as measured fastest (benchmarks/results/cuda_h100.md): 8 on small layers; on layers of more than
  // 2^26 weights with x staged, 16 (one block per SM; at 2 bits only when K >= 16384); fewer when the rings would
  // not fit in the device's shared memory (8 rows of x per stage at 2 bits; smaller GPUs). K slices: 16 warps.
  // 8-bit codes, one row, small layers with N >= 4096 and K <= 4096: 4 warps and two blocks per multiprocessor (not
  // elsewhere: slower with a longer K or a smaller layer; 2- and 4-bit codes measured best with the default).
  // One row of 4-bit codes with at most one 16-column item per two multiprocessors (4096x1024: the k and v
  // projections of grouped-query attention): 16 warps, so that each block's K range is split finer (H200: 22% faster
  // than 8 at 4096x1024).
  const bool w8_one_small = bits == 8 && p.M == 1 && !big && p.N >= 4096 && p.K <= 4096;
  const bool w4_one_narrow = bits == 4 && p.M == 1 && 2 * ceil_div(p.N, 16) <= num_sms;
  int w = warps_force > 0 ? warps_force
          : sliced        ? 16
                          : (one && (big || w4_one_narrow) && (bits == 4 || p.K >= 16384 || p.M > 1)
                                 ? 16
                                 : (w8_one_small ? 4 : 8));
  if (w8_one_small && warps_force <= 0 && p.grid_force <= 0) p.grid_force = 2 * num_sms;
  w = std::min(w, thin_max_warps(bits, fs, mr));
  if (sliced) {
    // the longest slice that fits beside the rings (fewer warps while not even one stage would), then slices of
    // equal length
    const int64_t stage_bytes = thin_xbytes(p, 2) - thin_xbytes(p, 1), fixed = thin_xbytes(p, 1) - stage_bytes;
    int n = 0;
    for (;;) {
      const int64_t avail = p.smem_limit - w * per_warp - fixed;
      n = avail > 0 ? (int)std::min<int64_t>(p.nstages, avail / stage_bytes) : 0;
      if (n >= 1 || w == 1) break;
      w /= 2;
    }
    if (slices_force > 0) {
      p.kslices = std::min(slices_force, p.nstages);
    } else if (one_row_slices) {
      // One row: the fewest items per warp, each item costing its slice's stages plus about 4 stages of its own
      // (the partial sums written per item, the ring's turn into the next item). With one block per multiprocessor,
      // a slice's warps are (SMs / slices) * w. On the H200 this picked the fastest slice count, or one within 2%
      // of it, on nine of the ten layers of cuda_thin_h200.md (4096x6144: 5 slices, 10% slower than 4). The partial
      // sums' traffic, 4 bytes per output and slice, is small beside the codes at one row.
      const int64_t items = ceil_div(p.N, 16);
      int64_t best = -1;
      for (int64_t ks = 2; ks <= std::min<int64_t>(p.nstages, 32); ++ks) {
        const int64_t ss = ceil_div(p.nstages, ks), kk = ceil_div(p.nstages, ss);
        const int64_t wps = std::max<int64_t>(1, num_sms / kk) * w;
        const int64_t cost = ceil_div(items, wps) * (ss + 4);
        if (best < 0 || cost < best) {
          best = cost;
          p.kslices = (int)kk;
        }
      }
    } else {
      // the slice count with the least modelled time: the codes of the busiest block (one block per SM; each warp
      // takes the block's item w, w + the slice's warps, ...: blocks differ by one item per warp) plus the float32
      // partials (written and summed once per slice), device-wide traffic that weighs 2x per byte against one SM's
      // share (a fit of the H100 sweeps, benchmarks/results/cuda_h100.md). From the fewest slices that fit.
      const int64_t items = ceil_div(p.N, 16), lo = ceil_div(p.nstages, std::max(n, 1));
      const int64_t vbytes = (int64_t)p.kstage / ks * 512;   // code bytes per stage
      double best = -1.0;
      for (int64_t ks = lo; ks <= std::min<int64_t>(p.nstages, std::max<int64_t>(4 * lo, 32)); ++ks) {
        const int64_t ss = ceil_div(p.nstages, ks), kk = ceil_div(p.nstages, ss);
        const int64_t wps = std::max<int64_t>(1, num_sms / kk) * w;   // warps per slice
        int64_t items0 = 0;                                              // the items of block 0 (the most)
        for (int64_t i = 0; i < w; ++i) items0 += i < items ? ceil_div(items - i, wps) : 0;
        const double cost = (double)items0 * ss * vbytes + (kk > 1 ? 2.0 * kk * p.M * (double)p.N * 8.0 / num_sms : 0.0);
        if (best < 0 || cost < best) {
          best = cost;
          p.kslices = (int)kk;
        }
      }
    }
    p.slice_stages = ceil_div(p.nstages, p.kslices);
    p.kslices = ceil_div(p.nstages, p.slice_stages);   // (no empty slice)
  }
  const int64_t xbytes = one ? thin_xbytes(p, p.slice_stages) : 0;
  while (w > 1 && w * per_warp + xbytes > p.smem_limit) w /= 2;
  if (p.cols) {   // every warp covers the whole slice
    w = std::max(1, std::min(w, thin_max_warps(bits, fs, mr)));
    p.st_per_warp = p.slice_stages;
    p.warps = w;
  } else {
    w = std::max(1, std::min(w, std::min(thin_max_warps(bits, fs, mr), p.slice_stages)));
    p.st_per_warp = ceil_div(p.slice_stages, w);
    p.warps = ceil_div(p.slice_stages, p.st_per_warp);
  }
  // One row of x through registers (p.xl, wq_thin_kernel.cuh): 8 16-byte pieces in flight per thread where a thread
  // has more than 4, so that the row is one batch of loads; else 4 (8 would also run the sums of the empty slots).
  const int64_t pieces = (int64_t)p.M * p.slice_stages * (p.kstage / 8);
  p.xl = ceil_div(pieces, (int64_t)p.warps * 32) > 4 ? 8 : 4;
  const int64_t smem = p.warps * per_warp + xbytes;
  p.smem = (int)std::min<int64_t>(smem, 1 << 30);
  return p.smem;
}

namespace {
// The K slices' float32 partials summed in slice order (deterministic), + bias, in the output dtype. Launched as a
// programmatic dependent of the thin kernel: it waits for it before reading the partials.
__global__ void wq_thin_reduce_kernel(const WqThinArgs p) {
  frag::griddep_launch_dependents();
  frag::griddep_wait();
  const int64_t total = (int64_t)p.M * p.N;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    float v = 0.f;
    for (int s = 0; s < p.kslices; ++s) v += __ldcg(p.ws + s * total + i);
    if (p.bias) v += load_f32(p.bias, p.bias_dtype, i % p.N);
    store_f32(p.out, p.out_dtype, i, v);
  }
}
// The same sums, 4 outputs a thread (N % 4 == 0, output 16-byte aligned): every slice's float4 in flight at once, where
// the kernel above waits for a round of scalar L2 loads per output; the same additions in the same order (same bits).
__global__ void wq_thin_reduce4_kernel(const WqThinArgs p) {
  frag::griddep_launch_dependents();
  frag::griddep_wait();
  const int64_t total = (int64_t)p.M * p.N;
  for (int64_t i = 4 * (blockIdx.x * (int64_t)blockDim.x + threadIdx.x); i < total;
       i += 4 * (int64_t)gridDim.x * blockDim.x) {
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
    for (int s = 0; s < p.kslices; ++s) {
      const float4 q = __ldcg(reinterpret_cast<const float4*>(p.ws + s * total + i));
      v.x += q.x;
      v.y += q.y;
      v.z += q.z;
      v.w += q.w;
    }
    if (p.bias) {
      const int64_t n = i % p.N;
      v.x += load_f32(p.bias, p.bias_dtype, n);
      v.y += load_f32(p.bias, p.bias_dtype, n + 1);
      v.z += load_f32(p.bias, p.bias_dtype, n + 2);
      v.w += load_f32(p.bias, p.bias_dtype, n + 3);
    }
    store4_f32(p.out, p.out_dtype, i, v);
  }
}
}  // namespace

cudaError_t launch_wq_thin_gemm(const WqThinArgs& p, int bits, int cdtype, cudaStream_t st) {
  if (p.M == 0 || p.N == 0) return cudaSuccess;
  if (p.M > 16 || (p.M > 8 && p.mx != 1) || (p.kslices > 1 && (p.ws == nullptr || p.mx != 1)))
    return cudaErrorInvalidValue;
  cudaError_t e = cudaErrorInvalidValue;
  if (cdtype == kF16) {
    if (bits == 8) e = thin::launch<8, __half>(p, st);
    if (bits == 4) e = thin::launch<4, __half>(p, st);
    if (bits == 2) e = thin::launch<2, __half>(p, st);
  } else if (cdtype == kBF16) {
    if (bits == 8) e = thin::launch<8, __nv_bfloat16>(p, st);
    if (bits == 4) e = thin::launch<4, __nv_bfloat16>(p, st);
    if (bits == 2) e = thin::launch<2, __nv_bfloat16>(p, st);
  }
  if (e != cudaSuccess || p.kslices <= 1 || p.sem != nullptr) return e;   // (p.sem: summed in the launch)
  const int64_t total = (int64_t)p.M * p.N;
  // 4 outputs a thread where rows are whole float4s, the output is aligned and there are at least 3 blocks of 256
  // outputs per SM (on smaller outputs the fewer, fatter blocks were slower)
  const bool can4 = p.N % 4 == 0 && reinterpret_cast<uintptr_t>(p.out) % 16 == 0;
  const bool four = can4 && total >= 3 * (int64_t)p.sms * 256;
  const int64_t threads = four ? total / 4 : total;
  const int bt = 256;
  const int grid = (int)std::max<int64_t>(1, std::min<int64_t>((threads + bt - 1) / bt, 4 * (int64_t)p.sms * (256 / bt)));
  // (a programmatic dependent of the thin kernel where the device has it: its launch overlaps that kernel's tail)
  return launch_kernel(four ? wq_thin_reduce4_kernel : wq_thin_reduce_kernel, dim3((unsigned)grid), dim3((unsigned)bt), 0, st,
                       p.pdl != 0, p);
}

}  // namespace bie
