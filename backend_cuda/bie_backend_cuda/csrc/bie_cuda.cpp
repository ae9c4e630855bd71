// Torch bindings of bie-backend-cuda: argument checks (TORCH_CHECK raises a
// Python RuntimeError; nothing here exits or aborts), output allocation, the
// current stream, and the calls into the launchers of the .cu files.
// Registered as torch.ops.bie_cuda.* for the registered kernels, and the same functions as a Python module for the
// layers' bound inference calls (weight_only.py): a pybind11 call converts its arguments directly, where an op
// call matches them against the schema first, which at decode-sized shapes is a large part of the host time.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <torch/extension.h>

#include <cuda_runtime.h>
#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "launchers.h"

namespace bie {
namespace {
struct LaunchKey {
  int device;
  const void* kernel;
  int threads;
  int smem;
  int cluster = 0;
  bool operator==(const LaunchKey& o) const {
    return device == o.device && kernel == o.kernel && threads == o.threads && smem == o.smem && cluster == o.cluster;
  }
};
struct LaunchKeyHash {
  size_t operator()(const LaunchKey& k) const {
    return std::hash<const void*>()(k.kernel) ^ ((size_t)k.device * 0x9E3779B97F4A7C15ull) ^
           ((size_t)k.threads << 24) ^ (size_t)k.smem ^ ((size_t)k.cluster << 40);
  }
};
std::mutex launch_cache_mutex;
std::unordered_map<LaunchKey, int, LaunchKeyHash> smem_limits;   // (device, kernel) -> the limit set
std::unordered_map<LaunchKey, int, LaunchKeyHash> occupancies;   // (device, kernel, threads, smem) -> blocks per SM
std::unordered_map<LaunchKey, int, LaunchKeyHash> cluster_counts;   // (..., cluster) -> clusters resident at once
}  // namespace

cudaError_t set_smem_limit(const void* kernel, int smem) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const LaunchKey key{dev, kernel, 0, 0};
  // held across the driver call: two threads raising the limit must not leave it at the smaller value
  std::lock_guard<std::mutex> lock(launch_cache_mutex);
  auto it = smem_limits.find(key);
  if (it != smem_limits.end() && it->second >= smem) return cudaSuccess;
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  smem_limits[key] = smem;
  return cudaSuccess;
}

cudaError_t blocks_per_sm(int* blocks, const void* kernel, int threads, int smem) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const LaunchKey key{dev, kernel, threads, smem};
  {
    std::lock_guard<std::mutex> lock(launch_cache_mutex);
    auto it = occupancies.find(key);
    if (it != occupancies.end()) {
      *blocks = it->second;
      return cudaSuccess;
    }
  }
  e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kernel, threads, smem);
  if (e != cudaSuccess) return e;
  std::lock_guard<std::mutex> lock(launch_cache_mutex);
  occupancies[key] = *blocks;
  return cudaSuccess;
}

cudaError_t active_clusters(int* clusters, const void* kernel, int threads, int smem, int cluster) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const LaunchKey key{dev, kernel, threads, smem, cluster};
  {
    std::lock_guard<std::mutex> lock(launch_cache_mutex);
    auto it = cluster_counts.find(key);
    if (it != cluster_counts.end()) {
      *clusters = it->second;
      return cudaSuccess;
    }
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)cluster, 1, 1);
  cfg.blockDim = dim3((unsigned)threads, 1, 1);
  cfg.dynamicSmemBytes = (size_t)smem;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = (unsigned)cluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  e = cudaOccupancyMaxActiveClusters(clusters, kernel, &cfg);
  if (e != cudaSuccess) return e;
  std::lock_guard<std::mutex> lock(launch_cache_mutex);
  cluster_counts[key] = *clusters;
  return cudaSuccess;
}
}  // namespace bie

namespace {

using at::Tensor;

int dtype_code(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return bie::kF32;
    case at::kHalf: return bie::kF16;
    case at::kBFloat16: return bie::kBF16;
    case at::kChar: return bie::kI8;
    case at::kInt: return bie::kI32;
    default: TORCH_CHECK(false, "bie_cuda: unsupported dtype ", t);
  }
  return -1;
}

void check_cuda(const Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), "bie_cuda: ", name, " must be a CUDA tensor, got ", t.device());
}

void check_launch(cudaError_t e, const char* what) {
  TORCH_CHECK(e == cudaSuccess, "bie_cuda: ", what, " failed: ", cudaGetErrorString(e));
}

cudaStream_t stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

// The id of the CUDA graph capture the current stream records into (unique in the process), 0 where it records
// none, -1 where the query fails (its error cleared, as in capturing below). The split-K semaphores are kept per capture by it
// (weight_only.py _counters_for), so that graphs captured on one stream do not share them.
int64_t capture_id() {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  if (cudaStreamGetCaptureInfo(stream(), &st, &id) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return st == cudaStreamCaptureStatusActive ? (int64_t)id : 0;
}

int num_sms() {
  int dev = 0, n = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
  return n > 0 ? n : 1;
}

int compute_major() {
  int dev = 0, n = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&n, cudaDevAttrComputeCapabilityMajor, dev);
  return n;
}

// Dynamic shared memory one block may opt in to on the current device (227 KiB on sm_90, 163 on sm_80, 99 on sm_86/89).
int smem_optin() {
  int dev = 0, n = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&n, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  return n > 0 ? n : 48 * 1024;
}

// Arrival counters of the thin GEMV's K slices (one per 16-column item) for the launches of one stream of one device.
// A launch leaves them zero (the warp that sums an item zeroes its counter again), so they are made once per stream,
// zeroed on that stream (stream order puts the zeros before the launch that reads them; cudaMemset would queue them
// on the legacy stream, which a non-blocking stream does not wait for), and kept: never freed, as a launch in flight
// may still use a buffer that a larger layer outgrew. Only eager launches use them (never under graph capture, where
// cudaMalloc would be illegal), so the cost is one map lookup a call: here, not handed in from Python as the other
// kernels' split-K semaphores are (weight_only._counters_for), whose lookup would cost the bound call host time.
unsigned* thin_counters(cudaStream_t s, int64_t need) {
  static std::mutex mu;
  static auto* pool = new std::unordered_map<cudaStream_t, std::pair<unsigned*, int64_t>>[64];
  int dev = 0;
  cudaGetDevice(&dev);
  TORCH_CHECK(dev >= 0 && dev < 64, "bie_cuda.wq_thin_gemm: device index ", dev, " beyond 63");
  std::lock_guard<std::mutex> lock(mu);
  auto& e = pool[dev][s];
  if (e.second < need) {
    const int64_t n = std::max<int64_t>(need, 4096);
    void* ptr = nullptr;
    TORCH_CHECK(cudaMalloc(&ptr, n * sizeof(unsigned)) == cudaSuccess, "bie_cuda.wq_thin_gemm: cannot allocate ", n,
                " slice counters");
    TORCH_CHECK(cudaMemsetAsync(ptr, 0, n * sizeof(unsigned), s) == cudaSuccess,
                "bie_cuda.wq_thin_gemm: cannot zero counters");
    e = {static_cast<unsigned*>(ptr), n};
  }
  return e.first;
}

// Whether work queued on s now would be recorded into a CUDA graph instead of run. An error (the legacy stream
// queried while another thread captures in global mode) counts as capturing, and is cleared so that the next launch
// check does not report it.
bool capturing(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &st) != cudaSuccess) {
    (void)cudaGetLastError();
    return true;
  }
  return st != cudaStreamCaptureStatusNone;
}

// The bias and output fields shared by the weight-only launch structs: bias (N values, any floating dtype, on
// x's device) kept alive in bias_c, output pointer and floating dtype code.
template <class Args>
void set_bias_out(Args& p, const std::optional<Tensor>& bias, Tensor& bias_c, const Tensor& x, const Tensor& out,
                  at::ScalarType out_dtype, int64_t N, const char* who) {
  if (bias.has_value() && bias->defined()) {
    bias_c = bias->reshape({-1}).contiguous();
    TORCH_CHECK(bias_c.numel() == N && bias_c.device() == x.device(), "bie_cuda.", who, ": bias must have N values");
    p.bias = bias_c.data_ptr();
    p.bias_dtype = dtype_code(bias_c.scalar_type());
  }
  p.out = out.data_ptr();
  p.out_dtype = dtype_code(out_dtype);
  TORCH_CHECK(p.out_dtype == bie::kF32 || p.out_dtype == bie::kF16 || p.out_dtype == bie::kBF16, "bie_cuda.", who,
              ": floating out_dtype");
}

// k16 steps per 16-byte vector of prepared codes (4-bit: 4, 2-bit: 8, 8-bit: 2).
int64_t vector_steps(int64_t bits) { return bits == 4 ? 4 : (bits == 2 ? 8 : 2); }

// The A-fragment code layout of the skinny and wgmma kernels: Np columns padded to a multiple of `pad` (less than
// `pad` beyond N), kblocks vectors of 16 * J k covering exactly K, (Np / 16) * kblocks * 128 int32 words.
void check_fragment_codes(const Tensor& qwa, int64_t bits, int64_t N, int64_t K, int64_t Np, int64_t kblocks,
                          int64_t pad, const char* who) {
  const int64_t J = vector_steps(bits);
  TORCH_CHECK(Np % pad == 0 && N <= Np && N > Np - pad && kblocks * 16 * J >= K && (kblocks - 1) * 16 * J < K,
              "bie_cuda.", who, ": inconsistent prepared shapes");
  TORCH_CHECK(qwa.scalar_type() == at::kInt && qwa.is_contiguous() && qwa.numel() == (Np / 16) * kblocks * 128,
              "bie_cuda.", who, ": prepared qweight has ", qwa.numel(), " words, expected ", (Np / 16) * kblocks * 128);
}

// A linear kernel's x is the rows of its last dimension, as nn.Linear takes it: (M, K), or a model's (batch, tokens,
// K) activations (contiguous), the output keeping the leading dimensions. The layers' bound calls hand x over as it
// is: viewing it as 2-D and the output back in Python costs about 3 µs a call, a fifth of a decode layer's host time.
int64_t rows_of(const Tensor& x) {
  int64_t m = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) m *= x.size(d);
  return m;
}

std::vector<int64_t> rows_out_shape(const Tensor& x, int64_t n) {
  auto s = x.sizes().vec();
  s.back() = n;
  return s;
}

// x as rows_of describes: at least 1-D, K features last; other than 2-D only contiguous (the kernels take one row
// stride).
void check_rows(const Tensor& x, int64_t K, const char* who) {
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == K && (x.dim() == 2 || x.is_contiguous()), "bie_cuda.", who,
              ": x must be (..., ", K, ") with contiguous rows, got ", x.sizes());
}

// x (..., K) fp16/bf16 contiguous (rows_of) and the (G, Np) int32 statistics, as the skinny-layout kernels (skinny,
// thin, wgmma) take them.
void check_skinny_operands(const Tensor& x, const Tensor& st, int64_t K, const char* who) {
  TORCH_CHECK(x.dim() >= 1 && x.is_contiguous() && x.size(-1) == K, "bie_cuda.", who,
              ": x must be contiguous (..., K) with K=", K, ", got ", x.sizes());
  TORCH_CHECK(x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16, "bie_cuda.", who,
              ": x must be fp16/bf16");
  TORCH_CHECK(st.scalar_type() == at::kInt && st.dim() == 2 && st.is_contiguous() && st.size(0) >= 1, "bie_cuda.", who,
              ": statistics must be contiguous int32 (G, Np)");
}

// The fields the skinny-layout launch structs share: x, codes, shapes (the statistics pointer is the caller's).
template <typename Args>
void set_skinny_shapes(Args& p, const Tensor& x, const Tensor& qwa, const Tensor& st, int64_t N, int64_t K,
                       int64_t gs_shift, int64_t kblocks) {
  p.x = x.data_ptr();
  p.qw = reinterpret_cast<const uint4*>(qwa.data_ptr<int32_t>());
  p.M = (int)rows_of(x);
  p.N = (int)N;
  p.Np = (int)st.size(1);
  p.K = (int)K;
  p.G = (int)st.size(0);
  p.gs_shift = (int)gs_shift;
  p.kblocks = (int)kblocks;
}

// ------------------------------------------------------------------- binary
Tensor pack_signs(const Tensor& x) {
  check_cuda(x, "x");
  TORCH_CHECK(x.dim() == 2, "bie_cuda.pack_signs: x must be 2-D (rows, K), got ", x.sizes());
  const int64_t rows = x.size(0), K = x.size(1);
  TORCH_CHECK(K > 0, "bie_cuda.pack_signs: K must be positive");
  c10::cuda::CUDAGuard guard(x.device());
  auto out = at::empty({rows, (K + 7) / 8}, x.options().dtype(at::kByte));
  check_launch(bie::launch_pack_signs(x.data_ptr(), dtype_code(x.scalar_type()), out.data_ptr<uint8_t>(), rows, K,
                                      x.stride(0), x.stride(1), stream()),
               "pack_signs");
  return out;
}

Tensor unpack_signs(const Tensor& bits, int64_t k, at::ScalarType dtype) {
  check_cuda(bits, "bits");
  TORCH_CHECK(bits.dim() == 2 && bits.scalar_type() == at::kByte, "bie_cuda.unpack_signs: bits must be 2-D uint8");
  TORCH_CHECK(k > 0 && bits.size(1) == (k + 7) / 8, "bie_cuda.unpack_signs: bits has ", bits.size(1),
              " bytes per row, k=", k, " needs ", (k + 7) / 8);
  TORCH_CHECK(bits.size(1) <= 1 || bits.stride(1) == 1, "bie_cuda.unpack_signs: bits rows must be contiguous");
  c10::cuda::CUDAGuard guard(bits.device());
  auto out = at::empty({bits.size(0), k}, bits.options().dtype(dtype));
  check_launch(bie::launch_unpack_signs(bits.data_ptr<uint8_t>(), bits.size(0), k, bits.stride(0), out.data_ptr(),
                                        dtype_code(dtype), stream()),
               "unpack_signs");
  return out;
}

Tensor row_popc(const Tensor& b) {
  check_cuda(b, "b");
  TORCH_CHECK(b.dim() == 2 && b.scalar_type() == at::kByte && (b.size(1) <= 1 || b.stride(1) == 1),
              "bie_cuda.row_popc: b must be 2-D uint8 with contiguous rows");
  c10::cuda::CUDAGuard guard(b.device());
  auto out = at::empty({b.size(0)}, b.options().dtype(at::kInt));
  check_launch(bie::launch_row_popc(b.data_ptr<uint8_t>(), b.stride(0), b.size(0), b.size(1), out.data_ptr<int32_t>(),
                                    stream()),
               "row_popc");
  return out;
}

// The binary GEMMs' epilogue operands: per-channel or scalar scale, per-channel bias (floating types).
// The returned tensors keep the contiguous copies alive while the kernel is queued.
template <typename Args>  // BinGemmArgs or BinConvArgs
static std::pair<Tensor, Tensor> set_scale_bias(Args& p, const std::optional<Tensor>& scale,
                                                const std::optional<Tensor>& bias, at::ScalarType odt, int64_t N,
                                                const at::Device& dev, const char* who) {
  Tensor scale_c, bias_c;
  if (scale.has_value() && scale->defined()) {
    TORCH_CHECK(odt != at::kInt, "bie_cuda.", who, ": a scale needs a floating out_dtype");
    scale_c = scale->reshape({-1}).contiguous();
    TORCH_CHECK(scale_c.numel() == 1 || scale_c.numel() == N, "bie_cuda.", who, ": scale must have 1 or N values");
    TORCH_CHECK(scale_c.device() == dev, "bie_cuda.", who, ": scale on another device");
    p.scale = scale_c.data_ptr();
    p.scale_dtype = dtype_code(scale_c.scalar_type());
    p.scale_stride = scale_c.numel() == 1 ? 0 : 1;
  }
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(odt != at::kInt, "bie_cuda.", who, ": a bias needs a floating out_dtype");
    bias_c = bias->reshape({-1}).contiguous();
    TORCH_CHECK(bias_c.numel() == N && bias_c.device() == dev, "bie_cuda.", who, ": bias must have N values");
    p.bias = bias_c.data_ptr();
    p.bias_dtype = dtype_code(bias_c.scalar_type());
  }
  for (int code : {p.scale ? p.scale_dtype : bie::kF32, p.bias ? p.bias_dtype : bie::kF32})
    TORCH_CHECK(code == bie::kF32 || code == bie::kF16 || code == bie::kBF16,
                "bie_cuda.", who, ": scale and bias must be floating");
  return {scale_c, bias_c};
}

// The binary GEMMs' output dtype: int32 (the dot itself, when none is given) or a floating type.
static at::ScalarType binary_out_dtype(std::optional<at::ScalarType> out_dtype, const char* who) {
  const at::ScalarType odt = out_dtype.has_value() ? *out_dtype : at::kInt;
  TORCH_CHECK(odt == at::kInt || odt == at::kFloat || odt == at::kHalf || odt == at::kBFloat16, "bie_cuda.", who,
              ": out_dtype must be int32 (None), float32, float16 or bfloat16");
  return odt;
}

// a (B, M, >=ceil(k/8)), b (B, N, >=ceil(k/8)) uint8 with contiguous rows; only
// the first ceil(k/8) bytes of each row are read. impl 0: tensor cores (needs
// 16-byte aligned rows), 1: SIMT. tile: 0 automatic, else a fixed tile (tests).
Tensor binary_mm(const Tensor& a, const Tensor& b, int64_t k, const std::optional<Tensor>& pw,
                 const std::optional<Tensor>& scale, const std::optional<Tensor>& bias,
                 std::optional<at::ScalarType> out_dtype, int64_t impl, int64_t tile) {
  check_cuda(a, "a");
  check_cuda(b, "b");
  TORCH_CHECK(a.dim() == 3 && b.dim() == 3 && a.scalar_type() == at::kByte && b.scalar_type() == at::kByte,
              "bie_cuda.binary_mm: a and b must be 3-D uint8");
  TORCH_CHECK(a.size(0) == b.size(0), "bie_cuda.binary_mm: batch sizes differ");
  const int64_t KB = (k + 7) / 8;
  TORCH_CHECK(k > 0 && a.size(2) >= KB && b.size(2) >= KB, "bie_cuda.binary_mm: rows shorter than ceil(k/8)");
  TORCH_CHECK((a.size(2) <= 1 || a.stride(2) == 1) && (b.size(2) <= 1 || b.stride(2) == 1),
              "bie_cuda.binary_mm: packed rows must be contiguous");
  const int64_t M = a.size(1), N = b.size(1), batch = a.size(0);
  TORCH_CHECK(M < (1ll << 31) && N < (1ll << 31) && k < (1ll << 31) && batch < 65536,
              "bie_cuda.binary_mm: problem too large");
  if (impl == 0) {
    auto aligned = [](const Tensor& t) {
      return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 && (t.size(1) <= 1 || t.stride(1) % 16 == 0) &&
             (t.size(0) <= 1 || t.stride(0) % 16 == 0);
    };
    TORCH_CHECK(aligned(a) && aligned(b), "bie_cuda.binary_mm: tensor-core path needs 16-byte aligned rows");
  }
  c10::cuda::CUDAGuard guard(a.device());
  const at::ScalarType odt = binary_out_dtype(out_dtype, "binary_mm");
  auto out = at::empty({batch, M, N}, a.options().dtype(odt));
  bie::BinGemmArgs p{};
  p.a = a.data_ptr<uint8_t>();
  p.b = b.data_ptr<uint8_t>();
  p.lda = M > 1 ? a.stride(1) : KB;
  p.a_bs = a.stride(0);
  p.ldb = N > 1 ? b.stride(1) : KB;
  p.b_bs = b.stride(0);
  p.M = (int)M;
  p.N = (int)N;
  p.K = (int)k;
  p.KB = (int)KB;
  p.out = out.data_ptr();
  p.out_dtype = dtype_code(odt);
  Tensor pw_c;  // keep alive
  if (pw.has_value() && pw->defined()) {
    pw_c = pw->contiguous();
    TORCH_CHECK(pw_c.scalar_type() == at::kInt && pw_c.numel() == batch * N && pw_c.device() == a.device(),
                "bie_cuda.binary_mm: pw must be int32 (B*N) on a's device");
    p.pw = pw_c.data_ptr<int32_t>();
  }
  const auto keep = set_scale_bias(p, scale, bias, odt, N, a.device(), "binary_mm");
  if (impl == 0) {
    const int sms = num_sms();
    check_launch(bie::launch_binary_gemm_tc(p, (int)batch, (int)tile, sms, stream()), "binary_mm (tensor cores)");
  } else {
    check_launch(bie::launch_binary_gemm_simt(p, (int)batch, stream()), "binary_mm (SIMT)");
  }
  return out;
}

// The Hopper 1-bit wgmma GEMM (binary_wgmma.cu): a (M, >= k/8) uint8 with 16-byte aligned contiguous rows,
// img the prepared weight image of n rows (bie_backend_cuda.binary.wgmma_image), pw (n) int32 the weight
// rows' popcounts. k % 128 == 0, n % 8 == 0, sm_90 only. cluster: blocks per cluster (0 automatic, 1, 2, 4).
Tensor binary_mm_wgmma(const Tensor& a, const Tensor& img, const Tensor& pw, int64_t k, int64_t n,
                       const std::optional<Tensor>& scale, const std::optional<Tensor>& bias,
                       std::optional<at::ScalarType> out_dtype, int64_t cluster) {
  check_cuda(a, "a");
  check_cuda(img, "img");
  check_cuda(pw, "pw");
  TORCH_CHECK(a.dim() == 2 && a.scalar_type() == at::kByte, "bie_cuda.binary_mm_wgmma: a must be 2-D uint8");
  TORCH_CHECK(k > 0 && k % 128 == 0 && k < (1ll << 30), "bie_cuda.binary_mm_wgmma: k must be a positive multiple of 128, got ", k);
  TORCH_CHECK(n > 0 && n % 8 == 0 && n < (1ll << 30), "bie_cuda.binary_mm_wgmma: n must be a positive multiple of 8, got ", n);
  TORCH_CHECK(cluster == 0 || cluster == 1 || cluster == 2 || cluster == 4,
              "bie_cuda.binary_mm_wgmma: cluster must be 0 (automatic), 1, 2 or 4, got ", cluster);
  const int64_t KB = k / 8, M = a.size(0);
  TORCH_CHECK(M < (1ll << 30), "bie_cuda.binary_mm_wgmma: too many rows");
  TORCH_CHECK(a.size(1) >= KB && (a.size(1) <= 1 || a.stride(1) == 1),
              "bie_cuda.binary_mm_wgmma: rows of a must be contiguous and hold k/8 bytes");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(a.data_ptr()) % 16 == 0 && (M <= 1 || a.stride(0) % 16 == 0),
              "bie_cuda.binary_mm_wgmma: rows of a must be 16-byte aligned");
  const int64_t ns = (KB + 127) / 128, nt = (n + 255) / 256;
  TORCH_CHECK(img.scalar_type() == at::kByte && img.is_contiguous() && img.numel() == nt * ns * 256 * 128 &&
                  reinterpret_cast<uintptr_t>(img.data_ptr()) % 16 == 0,
              "bie_cuda.binary_mm_wgmma: img is not the prepared image of ", n, " rows of ", k, " bits");
  TORCH_CHECK(pw.scalar_type() == at::kInt && pw.is_contiguous() && pw.numel() == n,
              "bie_cuda.binary_mm_wgmma: pw must be ", n, " contiguous int32");
  TORCH_CHECK(img.device() == a.device() && pw.device() == a.device(), "bie_cuda.binary_mm_wgmma: tensors on different devices");
  c10::cuda::CUDAGuard guard(a.device());
  int major = 0;   // a's device (the guard made it current): the 1-bit wgmma exists on sm_90 only
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, a.get_device());
  TORCH_CHECK(major == 9, "bie_cuda.binary_mm_wgmma: needs a Hopper (sm_90) GPU");
  const at::ScalarType odt = binary_out_dtype(out_dtype, "binary_mm_wgmma");
  auto out = at::empty({M, n}, a.options().dtype(odt));
  bie::BinGemmArgs p{};
  p.a = a.data_ptr<uint8_t>();
  p.b = img.data_ptr<uint8_t>();
  p.pw = pw.data_ptr<int32_t>();
  p.lda = M > 1 ? a.stride(0) : KB;
  p.M = (int)M;
  p.N = (int)n;
  p.K = (int)k;
  p.KB = (int)KB;
  p.out = out.data_ptr();
  p.out_dtype = dtype_code(odt);
  const auto keep = set_scale_bias(p, scale, bias, odt, n, a.device(), "binary_mm_wgmma");
  check_launch(bie::launch_binary_gemm_wgmma(p, (int)cluster, num_sms(), stream()), "binary_mm_wgmma");
  return out;
}

// The input of the binary linear entry points: x contiguous (..., k) (rows_of) of a float dtype on the GPU, and the
// shift k contiguous values in x's dtype on x's device, or none (returned as its data pointer, or null).
static const void* shifted_input(const Tensor& x, const std::optional<Tensor>& shift, int64_t k, const char* who) {
  check_cuda(x, "x");
  TORCH_CHECK(x.dim() >= 1 && x.is_contiguous() && x.size(-1) == k && k > 0,
              "bie_cuda.", who, ": x must be contiguous (..., k), got ", x.sizes(), " for k=", k);
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16,
              "bie_cuda.", who, ": x must be float32, float16 or bfloat16, got ", x.scalar_type());
  if (!shift.has_value() || !shift->defined()) return nullptr;
  TORCH_CHECK(shift->scalar_type() == x.scalar_type() && shift->is_contiguous() && shift->numel() == k &&
                  shift->device() == x.device(),
              "bie_cuda.", who, ": shift must be ", k, " contiguous values in x's dtype on x's device");
  return shift->data_ptr();
}

// The arguments of the one-launch binary_linear kernels (the GEMV, the tensor-core GEMM's fused form) and their
// output: x's rows (rows_of) with the shift's pointer sp, w the prepared weight rows (n, >= kb16 bytes, 16-byte aligned
// rows) and pw their popcounts; the epilogue as binary_mm's. `keep` holds the epilogue's contiguous copies while the
// kernel is queued.
struct FewRowCall {
  bie::BinGemvArgs g{};
  Tensor out;
  std::pair<Tensor, Tensor> keep;
};

static FewRowCall few_row_call(const Tensor& x, const void* sp, const Tensor& w, const Tensor& pw, int64_t k,
                               int64_t n, int64_t kb16, const std::optional<Tensor>& scale,
                               const std::optional<Tensor>& bias, std::optional<at::ScalarType> out_dtype,
                               const char* who) {
  check_cuda(w, "w");
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kByte && w.size(0) == n && n >= 1 && w.size(1) >= kb16 &&
                  (n == 1 || w.stride(0) % 16 == 0) && (w.size(1) <= 1 || w.stride(1) == 1) &&
                  reinterpret_cast<uintptr_t>(w.data_ptr()) % 16 == 0,
              "bie_cuda.", who, ": w must be (n, >= ", kb16, ") uint8 rows, 16-byte aligned, got ", w.sizes(),
              " strides ", w.strides());
  TORCH_CHECK(pw.scalar_type() == at::kInt && pw.is_contiguous() && pw.numel() == n && pw.device() == x.device() &&
                  w.device() == x.device(),
              "bie_cuda.", who, ": pw must be n contiguous int32 popcounts on x's device");
  FewRowCall c;
  const at::ScalarType odt = binary_out_dtype(out_dtype, who);
  c.out = at::empty(rows_out_shape(x, n), x.options().dtype(odt));
  bie::BinGemmArgs& p = c.g.gemm;
  p.b = w.data_ptr<uint8_t>();
  p.ldb = n > 1 ? w.stride(0) : kb16;
  p.pw = pw.data_ptr<int32_t>();
  p.M = (int)rows_of(x);
  p.N = (int)n;
  p.K = (int)k;
  p.KB = (int)((k + 7) / 8);
  p.out = c.out.data_ptr();
  p.out_dtype = dtype_code(odt);
  c.keep = set_scale_bias(p, scale, bias, odt, n, x.device(), who);
  c.g.x = x.data_ptr();
  c.g.shift = sp;
  return c;
}

// The bound call's tile code for the tensor-core GEMM's fused form (tests force it; 0 takes it where it applies)
constexpr int64_t kFusedTile = 6;

// The binary linear layers' bound inference call (binary.py bind_binary_linear): in one call from Python what the
// registered kernel does in several, with the same result bit for bit. x of any rank (rows_of), shift k values in
// x's dtype or none, pw the weight rows' popcounts, scale float32(act) * float32(weight). The GEMM:
//   tile < 0: the Hopper wgmma kernel on the weight image w (blocks per cluster -1 - tile, 0 automatic), after the
//     sign bits of x + shift are packed by a launch of their own;
//   tile 0: at 1-32 rows (kBinTcFusedMaxM) where the signs fit in shared memory, the mma.sync GEMM's fused form on
//     the weight bits w, one launch that takes the signs itself; otherwise, and while the stream is being captured
//     into a CUDA graph, as tile 1-5. The fused form saves a launch's host time, which a graph's replay does not
//     pay; on the GPU alone the two launches are as fast or faster (1-2 us at 4-32 rows on an H200:
//     benchmarks/results/binary_gemv_cuda.md);
//   tile 1-5: the sign packing, then the mma.sync GEMM with that tile (binary_mm); tile 6: the fused form, forced.
Tensor binary_linear_bound(const Tensor& x, const std::optional<Tensor>& shift, const Tensor& w, const Tensor& pw,
                           int64_t k, int64_t n, const std::optional<Tensor>& scale, const std::optional<Tensor>& bias,
                           std::optional<at::ScalarType> out_dtype, int64_t tile) {
  const void* sp = shifted_input(x, shift, k, "binary_linear_bound");
  const int64_t M = rows_of(x), KB = (k + 7) / 8, KBp = (KB + 15) / 16 * 16;
  TORCH_CHECK(M < (1ll << 31) && k < (1ll << 31), "bie_cuda.binary_linear_bound: problem too large");
  c10::cuda::CUDAGuard guard(x.device());
  if ((tile == 0 && !capturing(stream())) || tile == kFusedTile) {
    const bool fits = M >= 1 && M <= bie::kBinTcFusedMaxM && n >= 1 &&
                      bie::binary_linear_tc_smem((int)M, (int)k) <= (size_t)bie::kBinGemvMaxSmem;
    TORCH_CHECK(fits || tile == 0, "bie_cuda.binary_linear_bound: the fused form takes 1 to ", bie::kBinTcFusedMaxM,
                " rows whose signs fit in ", bie::kBinGemvMaxSmem, " bytes of shared memory; got ", M, " rows of k=", k);
    if (fits) {
      FewRowCall c = few_row_call(x, sp, w, pw, k, n, KB, scale, bias, out_dtype, "binary_linear_bound");
      int major = 0;
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, x.get_device());
      check_launch(bie::launch_binary_linear_tc(c.g, dtype_code(x.scalar_type()), major, stream()),
                   "binary_linear_bound (fused)");
      return c.out;
    }
  }
  auto a = at::empty({M, KBp}, x.options().dtype(at::kByte));
  check_launch(bie::launch_pack_signs_shifted(x.data_ptr(), sp, dtype_code(x.scalar_type()), a.data_ptr<uint8_t>(), M,
                                              k, KBp, stream()),
               "binary_linear_bound (packing)");
  const Tensor packed = a.narrow(1, 0, KB);
  if (tile < 0)
    return binary_mm_wgmma(packed, w, pw, k, n, scale, bias, out_dtype, -1 - tile).view(rows_out_shape(x, n));
  TORCH_CHECK(w.dim() == 2 && w.size(0) == n, "bie_cuda.binary_linear_bound: w must be the (n, bytes) weight bits");
  return binary_mm(packed.unsqueeze(0), w.unsqueeze(0), k, pw, scale, bias, out_dtype, 0, tile).select(0, 0)
      .view(rows_out_shape(x, n));
}

// binary_linear for 1-32 rows in one launch (binary.cu binary_gemv_kernel): x (M, k) contiguous, shift k values in
// x's dtype or none, w the prepared weight rows (n, >= ceil16(ceil(k/8)) bytes, 16-byte aligned rows), pw their
// popcounts; the epilogue as binary_mm's.
Tensor binary_linear_gemv(const Tensor& x, const std::optional<Tensor>& shift, const Tensor& w, const Tensor& pw,
                          int64_t k, int64_t n, const std::optional<Tensor>& scale, const std::optional<Tensor>& bias,
                          std::optional<at::ScalarType> out_dtype) {
  const void* sp = shifted_input(x, shift, k, "binary_linear_gemv");
  TORCH_CHECK(k <= bie::kBinGemvMaxK, "bie_cuda.binary_linear_gemv: k must be at most ", bie::kBinGemvMaxK, ", got ", k);
  const int64_t M = rows_of(x);
  TORCH_CHECK(M >= 1 && M <= bie::kBinGemvMaxM, "bie_cuda.binary_linear_gemv: 1 to ", bie::kBinGemvMaxM,
              " rows, got ", M);
  TORCH_CHECK(bie::binary_gemv_smem((int)M, (int)k) <= (size_t)bie::kBinGemvMaxSmem, "bie_cuda.binary_linear_gemv: ", M,
              " rows of k=", k, " take ", bie::binary_gemv_smem((int)M, (int)k), " bytes of shared memory, more than ",
              bie::kBinGemvMaxSmem, " (fewer rows or a shorter k)");
  const int64_t KB = (k + 7) / 8, KB16 = (KB + 15) / 16 * 16;
  c10::cuda::CUDAGuard guard(x.device());
  FewRowCall c = few_row_call(x, sp, w, pw, k, n, KB16, scale, bias, out_dtype, "binary_linear_gemv");
  check_launch(bie::launch_binary_gemv(c.g, dtype_code(x.scalar_type()), num_sms(), stream()), "binary_linear_gemv");
  return c.out;
}

Tensor sign_embedding(const Tensor& idx, const Tensor& bits, const Tensor& scale, int64_t dim, at::ScalarType dtype) {
  check_cuda(idx, "indices");
  check_cuda(bits, "bits");
  check_cuda(scale, "scale");
  TORCH_CHECK(idx.scalar_type() == at::kLong || idx.scalar_type() == at::kInt, "bie_cuda.sign_embedding: int indices");
  TORCH_CHECK(bits.dim() == 2 && bits.scalar_type() == at::kByte && (bits.size(1) <= 1 || bits.stride(1) == 1) &&
                  bits.size(1) == (dim + 7) / 8,
              "bie_cuda.sign_embedding: bits must be (V, ceil(dim/8)) uint8 with contiguous rows");
  auto ix = idx.contiguous();
  auto sc = scale.reshape({-1}).contiguous();
  TORCH_CHECK(sc.numel() == bits.size(0), "bie_cuda.sign_embedding: one scale per row");
  c10::cuda::CUDAGuard guard(bits.device());
  std::vector<int64_t> shape(idx.sizes().begin(), idx.sizes().end());
  shape.push_back(dim);
  auto out = at::empty(shape, bits.options().dtype(dtype));
  check_launch(bie::launch_sign_embedding(ix.data_ptr(), ix.scalar_type() == at::kLong, bits.data_ptr<uint8_t>(),
                                          bits.stride(0), sc.data_ptr(), dtype_code(sc.scalar_type()), bits.size(0),
                                          ix.numel(), dim, out.data_ptr(), dtype_code(dtype), stream()),
               "sign_embedding");
  return out;
}

Tensor sign_embedding_bag(const Tensor& idx, const Tensor& bits, int64_t dim, at::ScalarType dtype) {
  check_cuda(idx, "indices");
  check_cuda(bits, "bits");
  TORCH_CHECK(idx.dim() == 2 && (idx.scalar_type() == at::kLong || idx.scalar_type() == at::kInt),
              "bie_cuda.sign_embedding_bag: indices must be 2-D int");
  TORCH_CHECK(bits.dim() == 2 && bits.scalar_type() == at::kByte && (bits.size(1) <= 1 || bits.stride(1) == 1) &&
                  bits.size(1) == (dim + 7) / 8,
              "bie_cuda.sign_embedding_bag: bits must be (V, ceil(dim/8)) uint8 with contiguous rows");
  auto ix = idx.contiguous();
  c10::cuda::CUDAGuard guard(bits.device());
  auto out = at::empty({idx.size(0), dim}, bits.options().dtype(dtype));
  check_launch(bie::launch_sign_embedding_bag(ix.data_ptr(), ix.scalar_type() == at::kLong, bits.data_ptr<uint8_t>(),
                                              bits.stride(0), bits.size(0), idx.size(0), idx.size(1), dim,
                                              out.data_ptr(), dtype_code(dtype), stream()),
               "sign_embedding_bag");
  return out;
}

// -------------------------------------------------------------- weight-only
// x (M, K) in the compute dtype (fp16/bf16), contiguous; qw/s/zp the prepared
// layout (bie_backend_cuda/weight_only.py); counters: int32 zeros, at least
// ceil(Np/128) * ceil(M/16) of them, left zero by every launch.
Tensor wq_mma_gemm(const Tensor& x, const Tensor& qw, const Tensor& s, const Tensor& zp, const Tensor& s32,
               const Tensor& c32, const std::optional<Tensor>& bias,
               int64_t bits, int64_t N, int64_t K, int64_t gs_shift, int64_t kblocks, bool gptq,
               at::ScalarType out_dtype, const Tensor& counters, int64_t tune) {
  for (const Tensor* t : {&x, &qw, &s, &zp, &counters}) check_cuda(*t, "wq_mma_gemm operand");
  TORCH_CHECK(x.dim() >= 1 && x.is_contiguous() && x.size(-1) == K, "bie_cuda.wq_mma_gemm: x must be contiguous (..., K)");
  TORCH_CHECK(x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16, "bie_cuda.wq_mma_gemm: x must be fp16/bf16");
  TORCH_CHECK(s.scalar_type() == x.scalar_type() && zp.scalar_type() == x.scalar_type() && s.dim() == 2 &&
                  s.sizes() == zp.sizes() && s.is_contiguous() && zp.is_contiguous(),
              "bie_cuda.wq_mma_gemm: prepared statistics must be contiguous (G, Np) in x's dtype");
  TORCH_CHECK(bits == 2 || bits == 4 || bits == 8, "bie_cuda.wq_mma_gemm: bits must be 2, 4 or 8");
  TORCH_CHECK(s32.scalar_type() == at::kFloat && c32.scalar_type() == at::kFloat && s32.sizes() == s.sizes() &&
                  c32.sizes() == s.sizes() && s32.is_contiguous() && c32.is_contiguous() && s32.is_cuda() &&
                  c32.is_cuda(),
              "bie_cuda.wq_mma_gemm: float32 statistics must be contiguous (G, Np)");
  const int64_t Np = s.size(1), G = s.size(0), M = rows_of(x);
  const int64_t J = vector_steps(bits);
  TORCH_CHECK(Np % 16 == 0 && N <= Np && kblocks * 16 * J >= K, "bie_cuda.wq_mma_gemm: inconsistent prepared shapes");
  TORCH_CHECK(qw.scalar_type() == at::kInt && qw.is_contiguous() && qw.numel() == (Np / 16) * kblocks * 128,
              "bie_cuda.wq_mma_gemm: prepared qweight has ", qw.numel(), " words, expected ", (Np / 16) * kblocks * 128);
  TORCH_CHECK(counters.scalar_type() == at::kInt && counters.numel() >= ((Np + 127) / 128) * ((M + 15) / 16),
              "bie_cuda.wq_mma_gemm: counters too small");
  TORCH_CHECK(M < (1ll << 31) && K < (1ll << 31) && N < (1ll << 31), "bie_cuda.wq_mma_gemm: problem too large");
  c10::cuda::CUDAGuard guard(x.device());
  auto out = at::empty(rows_out_shape(x, N), x.options().dtype(out_dtype));
  if (M == 0 || N == 0) return out;
  bie::WqArgs p{};
  p.x = x.data_ptr();
  p.qw = reinterpret_cast<const uint4*>(qw.data_ptr<int32_t>());
  p.s = s.data_ptr();
  p.zp = zp.data_ptr();
  p.s32 = s32.data_ptr<float>();
  p.c32 = c32.data_ptr<float>();
  Tensor bias_c;
  set_bias_out(p, bias, bias_c, x, out, out_dtype, N, "wq_mma_gemm");
  p.M = (int)M;
  p.N = (int)N;
  p.Np = (int)Np;
  p.K = (int)K;
  p.G = (int)G;
  p.gs_shift = (int)gs_shift;
  p.kblocks = (int)kblocks;
  p.counters = counters.data_ptr<int32_t>();
  const int sms = num_sms();
  // tune (benchmarks): bit 0 grid order, bit 1 scalar x staging, bits 4.. blocks per SM to aim for (0: 3)
  p.order = (int)(tune & 1);
  p.vec_stage = ((tune & 2) == 0 && reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0) ? 1 : 0;   // 16-byte loads of x need an aligned start
  // default split target (H100 sweep): big layers 6 blocks/SM (2-bit: 1), small layers 2
  const bool big = (Np / 16) * kblocks * 512 >= (32ll << 20);
  const int mult = (int)(tune >> 4) > 0 ? (int)(tune >> 4) : (big ? (bits == 2 ? 1 : 6) : 2);
  bie::wq_plan(p.M, p.Np, p.kblocks, sms, mult, &p.splits, &p.kb_per_split);
  Tensor ws;
  if (p.splits > 1) {
    ws = at::empty({p.splits, M, Np}, x.options().dtype(at::kFloat));
    p.ws = ws.data_ptr<float>();
  }
  check_launch(bie::launch_wq_gemm(p, (int)bits, dtype_code(x.scalar_type()), gptq, sms, stream()), "wq_mma_gemm");
  return out;
}

// Skinny kernel (M <= 16): x (M, K) fp16/bf16 contiguous; qwa the A-fragment
// ordered codes, st (G, Np) int32 statistics (scale | zero << 16, fp16 or bf16
// bits); counters as for wq_mma_gemm. tune (benchmarks): bits 4..7 blocks per SM
// to aim for (0: default), bits 8..15 shared-memory budget per block in KiB
// (0: default). pdl: as for wq_thin_gemm.
Tensor wq_skinny_gemm(const Tensor& x, const Tensor& qwa, const Tensor& st, const std::optional<Tensor>& bias, int64_t bits,
                int64_t N, int64_t K, int64_t gs_shift, int64_t kblocks, bool gptq, bool st_bf16, bool inter,
                at::ScalarType out_dtype, const Tensor& counters, int64_t tune, bool pdl) {
  for (const Tensor* t : {&x, &qwa, &st, &counters}) check_cuda(*t, "wq_skinny_gemm operand");
  check_skinny_operands(x, st, K, "wq_skinny_gemm");
  TORCH_CHECK(rows_of(x) <= 16, "bie_cuda.wq_skinny_gemm: at most 16 rows");
  TORCH_CHECK(bits == 2 || bits == 4 || bits == 8, "bie_cuda.wq_skinny_gemm: bits must be 2, 4 or 8");
  TORCH_CHECK(gs_shift == -1 || (gs_shift >= 4 && gs_shift <= 30), "bie_cuda.wq_skinny_gemm: group size shift");
  const int64_t Np = st.size(1), M = rows_of(x);
  check_fragment_codes(qwa, bits, N, K, Np, kblocks, inter ? 128 : 16, "wq_skinny_gemm");
  TORCH_CHECK(counters.scalar_type() == at::kInt && counters.numel() >= (Np + 127) / 128,
              "bie_cuda.wq_skinny_gemm: counters too small");
  TORCH_CHECK(K < (1ll << 30) && N < (1ll << 30) && kblocks < (1 << 20), "bie_cuda.wq_skinny_gemm: problem too large");
  c10::cuda::CUDAGuard guard(x.device());
  auto out = at::empty(rows_out_shape(x, N), x.options().dtype(out_dtype));
  if (M == 0 || N == 0) return out;
  bie::WqSkinnyArgs p{};
  set_skinny_shapes(p, x, qwa, st, N, K, gs_shift, kblocks);
  p.st = reinterpret_cast<const uint32_t*>(st.data_ptr<int32_t>());
  Tensor bias_c;
  set_bias_out(p, bias, bias_c, x, out, out_dtype, N, "wq_skinny_gemm");
  p.counters = counters.data_ptr<int32_t>();
  p.vec_x = (K % 2 == 0 && reinterpret_cast<uintptr_t>(x.data_ptr()) % 4 == 0) ? 1 : 0;
  p.st_bf16 = st_bf16 ? 1 : 0;
  p.gptq = gptq ? 1 : 0;
  p.inter = inter ? 1 : 0;
  p.pdl = pdl && compute_major() >= 9 ? 1 : 0;   // as for wq_thin_gemm
  // default split target (H100 sweep, benchmarks/bench_cuda.py --only sweep): big layers 8 blocks per SM, small 2
  const bool big = (Np / 16) * kblocks * 512 >= (32ll << 20);
  const int mult = (int)((tune >> 4) & 15) > 0 ? (int)((tune >> 4) & 15) : (big ? 8 : 2);
  const int budget = (int)((tune >> 8) & 255) > 0 ? (int)((tune >> 8) & 255) * 1024 : 72 * 1024;
  const int smem = bie::wq_skinny_plan(p, (int)bits, (int)x.element_size(), num_sms(), mult, budget);
  TORCH_CHECK(smem <= 227 * 1024, "bie_cuda.wq_skinny_gemm: shared memory plan too large (", smem, " bytes)");
  Tensor ws;
  if (p.splits > 1) {
    ws = at::empty({p.splits, M, Np}, x.options().dtype(at::kFloat));
    p.ws = ws.data_ptr<float>();
  }
  check_launch(bie::launch_wq_skinny_gemm(p, (int)bits, dtype_code(x.scalar_type()), smem, stream()), "wq_skinny_gemm");
  return out;
}

// Thin GEMV (M <= 16): x (M, K) fp16/bf16 contiguous, 16-byte aligned, K % 8 == 0; qwa / st as for wq_skinny_gemm;
// 2/4/8-bit kernel codes, groups of at least 32 (gs_shift >= 5) or per-channel (-1). warps: K split per 16-column
// block, grid: persistent blocks, slices: K slices of x staged per block (-1 never; 0: planned for all three;
// benchmarks sweep them), xpre: how x is staged per block (-2: planned; -1: after every first ring stage, through
// registers; n >= 0: cp.async after the first n stages; -3: in chunks by bulk copies, with K slices of 4-bit codes in
// groups of 128 on sm_90, else as -1; see the kernel's prologue). pdl: launch as a programmatic dependent of the
// previous kernel in the stream (the kernel prefetches its codes and statistics before waiting for it), so the
// caller must know that kernel did not write qwa or st (weight_only.py: not on a layout's first use).
Tensor wq_thin_gemm(const Tensor& x, const Tensor& qwa, const Tensor& st, const std::optional<Tensor>& bias, int64_t bits,
                int64_t N, int64_t K, int64_t gs_shift, int64_t kblocks, bool gptq, bool st_bf16, bool inter,
                at::ScalarType out_dtype, int64_t warps, int64_t grid, bool pdl, int64_t slices,
                int64_t xpre) {
  for (const Tensor* t : {&x, &qwa, &st}) check_cuda(*t, "wq_thin_gemm operand");
  check_skinny_operands(x, st, K, "wq_thin_gemm");
  TORCH_CHECK(rows_of(x) <= 16, "bie_cuda.wq_thin_gemm: at most 16 rows");
  TORCH_CHECK(slices >= -1 && slices < (1 << 20), "bie_cuda.wq_thin_gemm: slices must be -1..2^20");
  TORCH_CHECK(rows_of(x) <= 8 || slices >= 0,
              "bie_cuda.wq_thin_gemm: more than 8 rows need x staged per block (slices >= 0, not -1)");
  TORCH_CHECK(K % 8 == 0 && reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0,
              "bie_cuda.wq_thin_gemm: K must be a multiple of 8 and x 16-byte aligned");
  TORCH_CHECK(bits == 2 || bits == 4 || bits == 8, "bie_cuda.wq_thin_gemm: bits must be 2, 4 or 8");
  TORCH_CHECK(gs_shift == -1 || (gs_shift >= 5 && gs_shift <= 30), "bie_cuda.wq_thin_gemm: groups of at least 32");
  TORCH_CHECK(warps >= 0 && warps <= bie::wq_thin_max_warps(), "bie_cuda.wq_thin_gemm: warps must be 0..", bie::wq_thin_max_warps());
  TORCH_CHECK(grid >= 0 && grid < (1 << 20), "bie_cuda.wq_thin_gemm: grid must be 0..2^20");
  TORCH_CHECK(xpre >= -3 && xpre <= 7, "bie_cuda.wq_thin_gemm: xpre must be -3..7");
  const int64_t Np = st.size(1), G = st.size(0), M = rows_of(x);
  check_fragment_codes(qwa, bits, N, K, Np, kblocks, inter ? 128 : 16, "wq_thin_gemm");
  TORCH_CHECK(K < (1ll << 30) && N < (1ll << 30) && kblocks < (1 << 20), "bie_cuda.wq_thin_gemm: problem too large");
  TORCH_CHECK(gs_shift == -1 || ((K + (1ll << gs_shift) - 1) >> gs_shift) <= G,
              "bie_cuda.wq_thin_gemm: statistics have fewer groups than K needs");
  c10::cuda::CUDAGuard guard(x.device());
  auto out = at::empty(rows_out_shape(x, N), x.options().dtype(out_dtype));
  if (M == 0 || N == 0) return out;
  bie::WqThinArgs p{};
  set_skinny_shapes(p, x, qwa, st, N, K, gs_shift, kblocks);
  p.st = reinterpret_cast<const uint32_t*>(st.data_ptr<int32_t>());
  Tensor bias_c;
  set_bias_out(p, bias, bias_c, x, out, out_dtype, N, "wq_thin_gemm");
  p.st_bf16 = st_bf16 ? 1 : 0;
  p.gptq = gptq ? 1 : 0;
  p.inter = inter ? 1 : 0;
  p.grid_force = (int)grid;
  p.xpre = (int)xpre;
  p.smem_limit = smem_optin();
  // programmatic dependent launch only where the device has it (sm_90+)
  p.pdl = pdl && compute_major() >= 9 ? 1 : 0;
  p.bulk = compute_major() >= 9 ? 1 : 0;
  const int smem = bie::wq_thin_plan(p, (int)bits, num_sms(), (int)warps, (int)slices);
  TORCH_CHECK(smem <= p.smem_limit, "bie_cuda.wq_thin_gemm: shared memory plan too large (", smem, " bytes, the device allows ",
              p.smem_limit, ")");
  TORCH_CHECK(M <= 8 || p.mx == 1, "bie_cuda.wq_thin_gemm: internal error: more than 8 rows planned without staged x");
  Tensor ws;   // the K slices' float32 partials
  const cudaStream_t st_ = stream();
  if (p.kslices > 1) {
    ws = at::empty({p.kslices, M, N}, x.options().dtype(at::kFloat));
    p.ws = ws.data_ptr<float>();
    // Who sums the slices (the same additions in the same order either way, so the same bits): called eagerly on a
    // layer of at most 2^27 weights, the warp that writes an item's last partial, in this launch; else a second
    // kernel. Eager calls of these few-row products are bound by the host (their GPU time, under about 20 us up to
    // 2^27 weights, is less than a call's host time), and the second launch cost about 10 us of host time a call
    // (29-31 against 19-20 us at 5-8 rows on Llama-3-8B's projections). Replayed from a graph only the GPU time
    // counts, and so it does on larger layers: there the in-launch sums cost 1-3 us more
    // (benchmarks/results/host_path_cuda.md).
    if ((int64_t)N * K <= (1ll << 27) && !capturing(st_)) p.sem = thin_counters(st_, (N + 15) / 16);
  }
  check_launch(bie::launch_wq_thin_gemm(p, (int)bits, dtype_code(x.scalar_type()), st_), "wq_thin_gemm");
  return out;
}

Tensor wq_wgmma_gemm(const Tensor& x, const Tensor& qwa, const Tensor& stw, const std::optional<Tensor>& bias, int64_t bits,
                int64_t N, int64_t K, int64_t gs_shift, int64_t kblocks, bool gptq, at::ScalarType out_dtype,
                int64_t ntok, int64_t force_splits, bool st_bf16) {
  for (const Tensor* t : {&x, &qwa, &stw}) check_cuda(*t, "wq_wgmma_gemm operand");
  check_skinny_operands(x, stw, K, "wq_wgmma_gemm");
  TORCH_CHECK(K % 8 == 0 && reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0,
              "bie_cuda.wq_wgmma_gemm: K must be a multiple of 8 and x 16-byte aligned");
  TORCH_CHECK(bits == 2 || bits == 4 || bits == 8, "bie_cuda.wq_wgmma_gemm: bits must be 2, 4 or 8");
  const bool many_rows = ntok == bie::WQ_ROWS_NTOK;
  TORCH_CHECK(ntok == 16 || ntok == 32 || ntok == 64 || ntok == 128 || many_rows,
              "bie_cuda.wq_wgmma_gemm: ntok must be 16, 32, 64, 128 or ", bie::WQ_ROWS_NTOK, " (the pipelined many-row kernel)");
  TORCH_CHECK(!many_rows || (bits == 4 && (gs_shift == -1 || gs_shift >= 5)),
              "bie_cuda.wq_wgmma_gemm: the pipelined kernel takes 4-bit codes in groups of 32 or more (or per channel)");
  TORCH_CHECK(gs_shift == -1 || (gs_shift >= 4 && gs_shift <= 30), "bie_cuda.wq_wgmma_gemm: group size shift");
  const int64_t Np = stw.size(1), G = stw.size(0), M = rows_of(x);
  check_fragment_codes(qwa, bits, N, K, Np, kblocks, 128, "wq_wgmma_gemm");
  TORCH_CHECK(gs_shift == -1 || ((K - 1) >> gs_shift) < G, "bie_cuda.wq_wgmma_gemm: too few statistics rows for K");
  TORCH_CHECK(K < (1ll << 30) && N < (1ll << 30) && M < (1ll << 30), "bie_cuda.wq_wgmma_gemm: problem too large");
  c10::cuda::CUDAGuard guard(x.device());
  int major = 0;   // x's device (the guard made it current): wgmma exists on sm_90 only
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, x.get_device());
  TORCH_CHECK(major == 9, "bie_cuda.wq_wgmma_gemm: needs a Hopper (sm_90) GPU");
  auto out = at::empty(rows_out_shape(x, N), x.options().dtype(out_dtype));
  if (M == 0 || N == 0) return out;
  bie::WqWgmmaArgs p{};
  set_skinny_shapes(p, x, qwa, stw, N, K, gs_shift, kblocks);
  p.stw = reinterpret_cast<const uint32_t*>(stw.data_ptr<int32_t>());
  Tensor bias_c;
  set_bias_out(p, bias, bias_c, x, out, out_dtype, N, "wq_wgmma_gemm");
  p.gptq = gptq ? 1 : 0;
  p.ntok = (int)ntok;
  p.st_bf16 = st_bf16 ? 1 : 0;
  // split K when the tiles alone leave SMs idle: as many splits as keep the grid within one wave of blocks
  // (blocks per SM: 4 for 16-row tiles, 3 for 32 (64 columns each), 2 for 64 rows, 1 for 128), >= 4 stages per split
  // (H100 sweep in benchmarks/results/cuda_h100_wqw.md: one full wave beat two)
  const int64_t tiles = ((M + ntok - 1) / ntok) * (Np / (ntok <= 32 ? 64 : 128));
  const int64_t slots = (int64_t)num_sms() * (ntok == 16 ? 4 : (ntok == 32 ? 3 : (ntok == 64 ? 2 : 1)));
  const int64_t stages = (kblocks * 16 * vector_steps(bits) + 127) / 128;
  int64_t splits = 1;
  Tensor ws;
  if (many_rows) {
    // Persistent blocks, one per SM: the tiles of whole waves run whole; the last wave's `tail` tiles, when they
    // would leave at least half of the SMs idle, are split in K so that their parts fill the SMs (at least
    // WQ_ROWS_MIN_PART_STAGES code blocks a part): float32 partials, then a reduction of only those tiles.
    const int64_t sms = num_sms(), tail = tiles >= sms ? tiles % sms : tiles;
    if (force_splits > 0) splits = std::min<int64_t>(force_splits, kblocks);
    else if (tail > 0) splits = std::min<int64_t>(sms / tail, kblocks / bie::WQ_ROWS_MIN_PART_STAGES);
    if (tail == 0 || splits < 1) splits = 1;
    p.splits = (int)splits;
    p.whole_tiles = (int)(splits > 1 ? tiles - tail : tiles);
    // outputs staged in shared memory, stored in whole lines
    p.wq_rows_epi = 1;
    if (splits > 1) {
      ws = at::empty({splits * tail * bie::WQ_ROWS_NTOK * 128}, x.options().dtype(at::kFloat));
      p.ws = ws.data_ptr<float>();
    }
  } else {
    if (tiles * 3 < slots * 2) splits = std::max<int64_t>(1, std::min<int64_t>(stages / 4, slots / tiles));
    if (force_splits > 0) splits = std::min<int64_t>(force_splits, stages);
    p.splits = (int)splits;
    if (splits > 1) {
      ws = at::empty({splits, M, N}, x.options().dtype(at::kFloat));
      p.ws = ws.data_ptr<float>();
    }
  }
  check_launch(bie::launch_wq_wgmma_gemm(p, (int)bits, dtype_code(x.scalar_type()), num_sms(), stream()), "wq_wgmma_gemm");
  return out;
}

Tensor wq_dequant(const Tensor& qw, const Tensor& s, const Tensor& zp, const std::optional<Tensor>& perm, int64_t bits,
                  int64_t N, int64_t K, int64_t gs_shift, int64_t kblocks, bool gptq) {
  for (const Tensor* t : {&qw, &s, &zp}) check_cuda(*t, "wq_dequant operand");
  TORCH_CHECK(bits == 2 || bits == 4 || bits == 8, "bie_cuda.wq_dequant: bits must be 2, 4 or 8");
  TORCH_CHECK(s.dim() == 2 && s.sizes() == zp.sizes() && s.is_contiguous() && zp.is_contiguous() &&
                  s.scalar_type() == zp.scalar_type(),
              "bie_cuda.wq_dequant: statistics must be contiguous (G, Np)");
  const int64_t Np = s.size(1);
  const int64_t J = vector_steps(bits);
  TORCH_CHECK(Np % 16 == 0 && N <= Np && kblocks * 16 * J >= K && qw.is_contiguous() &&
                  qw.numel() == (Np / 16) * kblocks * 128,
              "bie_cuda.wq_dequant: inconsistent prepared shapes");
  const int64_t* pp = nullptr;
  Tensor perm_c;
  if (perm.has_value() && perm->defined()) {
    perm_c = perm->to(at::kLong).contiguous();
    TORCH_CHECK(perm_c.numel() == K && perm_c.device() == qw.device(), "bie_cuda.wq_dequant: perm must have K values");
    pp = perm_c.data_ptr<int64_t>();
  }
  c10::cuda::CUDAGuard guard(qw.device());
  auto out = at::empty({K, N}, s.options());
  check_launch(bie::launch_wq_dequant(reinterpret_cast<const uint4*>(qw.data_ptr<int32_t>()), s.data_ptr(),
                                      zp.data_ptr(), pp, (int)bits, dtype_code(s.scalar_type()), gptq, (int)N, (int)Np,
                                      (int)K, (int)s.size(0), (int)gs_shift, (int)kblocks, out.data_ptr(), stream()),
               "wq_dequant");
  return out;
}

// Dequantize straight from the canonical tensors (bits 1, 2, 4, 8): W (K, N), or with out (K rows, nc columns of
// stride 1, rows of any stride >= nc, in out_dtype) its columns [n0, n0 + nc) into out (returned).
Tensor wq_dequant_canonical(const Tensor& qweight, const Tensor& scales, const Tensor& zeros,
                            const std::optional<Tensor>& g_idx, int64_t bits, int64_t group_size, int64_t K,
                            bool gptq, at::ScalarType out_dtype, int64_t n0, const std::optional<Tensor>& out_opt) {
  for (const Tensor* t : {&qweight, &scales, &zeros}) check_cuda(*t, "wq_dequant_canonical operand");
  TORCH_CHECK(bits == 1 || bits == 2 || bits == 4 || bits == 8, "bie_cuda.wq_dequant_canonical: bits 1/2/4/8");
  const int64_t N = qweight.size(1), G = scales.size(0);
  auto qw = qweight.contiguous();
  auto sc = scales.contiguous();
  auto zr = zeros.contiguous();
  TORCH_CHECK(qw.scalar_type() == at::kInt && qw.dim() == 2 && qw.size(0) == (K * bits + 31) / 32,
              "bie_cuda.wq_dequant_canonical: qweight must be int32 (ceil(K*bits/32), N)");
  TORCH_CHECK(sc.dim() == 2 && sc.size(1) == N, "bie_cuda.wq_dequant_canonical: scales must be (G, N)");
  if (gptq) {
    TORCH_CHECK(zr.scalar_type() == at::kInt && zr.dim() == 2 && zr.size(0) == G && zr.size(1) == (N * bits + 31) / 32,
                "bie_cuda.wq_dequant_canonical: qzeros must be int32 (G, ceil(N*bits/32))");
  } else {
    TORCH_CHECK(zr.dim() == 2 && zr.size(0) == G && zr.size(1) == N, "bie_cuda.wq_dequant_canonical: zeros (G, N)");
  }
  Tensor gi;
  const int32_t* gp = nullptr;
  if (g_idx.has_value() && g_idx->defined()) {
    gi = g_idx->to(at::kInt).contiguous();
    TORCH_CHECK(gi.numel() == K && gi.device() == qweight.device(), "bie_cuda.wq_dequant_canonical: g_idx (K,)");
    gp = gi.data_ptr<int32_t>();
  }
  TORCH_CHECK(K < (1ll << 31) && N < (1ll << 31), "bie_cuda.wq_dequant_canonical: problem too large");
  Tensor out;
  if (out_opt.has_value() && out_opt->defined()) {
    out = *out_opt;
    check_cuda(out, "wq_dequant_canonical out");
    TORCH_CHECK(out.device() == qweight.device() && out.scalar_type() == out_dtype && out.dim() == 2 &&
                    out.size(0) == K && (out.size(1) <= 1 || out.stride(1) == 1) && out.stride(0) >= out.size(1),
                "bie_cuda.wq_dequant_canonical: out must be (K, nc) in out_dtype on qweight's device, columns of "
                "stride 1, rows of stride >= nc");
    TORCH_CHECK(n0 >= 0 && n0 + out.size(1) <= N, "bie_cuda.wq_dequant_canonical: columns [", n0, ", ",
                n0 + out.size(1), ") outside N = ", N);
  } else {
    TORCH_CHECK(n0 == 0, "bie_cuda.wq_dequant_canonical: n0 needs out");
    out = at::empty({K, N}, qweight.options().dtype(out_dtype));
  }
  c10::cuda::CUDAGuard guard(qweight.device());
  check_launch(bie::launch_wq_dequant_canonical(qw.data_ptr<int32_t>(), sc.data_ptr(), dtype_code(sc.scalar_type()),
                                                zr.data_ptr(), gptq ? bie::kI32 : dtype_code(zr.scalar_type()), gptq,
                                                gp, group_size > 0 ? (int)group_size : -1, (int)G, (int)bits, (int)K,
                                                (int)N, (int)n0, (int)out.size(1), out.stride(0), out.data_ptr(),
                                                dtype_code(out_dtype), stream()),
               "wq_dequant_canonical");
  return out;
}


// Fused per-token W8A8-dynamic GEMV (dynamic_gemv.cu): dynamic_int8_linear with scheme per_token_symmetric for
// 1..16 rows. x (M, K) float32/float16/bfloat16 (rows of any stride; a column stride other than 1 is copied);
// wf the fragment-ordered weight codes of the (N, K) int8 weight (bie_backend_cuda/dynamic.py prepare_gemv);
// weight_scale 1 or N values, bias N values or None (floating dtypes, on x's device). grid: blocks (0: planned).
// pdl: launch as a programmatic dependent of the previous kernel in the stream (the kernel prefetches weight tiles
// before waiting for it), so the caller must know that kernel did not write wf (dynamic.py: not on a layout's first
// use). ring: the weight staging (0 registers, 1 shared memory through cp.async: dynamic_gemv.cu). Returns (M, N)
// in x's dtype.
Tensor dynamic_gemv(const Tensor& x, const Tensor& wf, const Tensor& weight_scale, const std::optional<Tensor>& bias,
                    int64_t N, int64_t K, int64_t grid, bool pdl, int64_t ring) {
  check_cuda(x, "x");
  check_cuda(wf, "wf");
  check_cuda(weight_scale, "weight_scale");
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K, "bie_cuda.dynamic_gemv: x must be (M, ", K, "), got ", x.sizes());
  const auto xt = x.scalar_type();
  TORCH_CHECK(xt == at::kFloat || xt == at::kHalf || xt == at::kBFloat16,
              "bie_cuda.dynamic_gemv: x must be float32, float16 or bfloat16, got ", xt);
  const int64_t M = x.size(0);
  TORCH_CHECK(M <= bie::DYN_GEMV_MAX_M, "bie_cuda.dynamic_gemv: at most ", bie::DYN_GEMV_MAX_M, " rows, got ", M);
  TORCH_CHECK(K >= 1 && K <= 65535 && N >= 1 && N < (1ll << 30),
              "bie_cuda.dynamic_gemv: K must be 1..65535 and N positive, got K=", K, " N=", N);
  const int64_t NB = (N + 15) / 16, KT = (K + 31) / 32;
  TORCH_CHECK(wf.scalar_type() == at::kChar && wf.is_contiguous() && wf.numel() == NB * KT * 512,
              "bie_cuda.dynamic_gemv: wf is not the fragment-ordered layout of a (", N, ", ", K, ") int8 weight");
  TORCH_CHECK(wf.device() == x.device() && weight_scale.device() == x.device(),
              "bie_cuda.dynamic_gemv: tensors on different devices");
  TORCH_CHECK(grid >= 0 && grid < (1 << 20), "bie_cuda.dynamic_gemv: grid must be 0..2^20");
  TORCH_CHECK(ring == 0 || ring == 1, "bie_cuda.dynamic_gemv: ring must be 0 (registers) or 1 (shared memory), got ",
              ring);
  const Tensor xc = (K <= 1 || x.stride(1) == 1) ? x : x.contiguous();
  const Tensor ws = weight_scale.reshape({-1}).contiguous();
  TORCH_CHECK(ws.numel() == 1 || ws.numel() == N, "bie_cuda.dynamic_gemv: weight_scale must have 1 or ", N,
              " values, got ", ws.numel());
  TORCH_CHECK(at::isFloatingType(ws.scalar_type()) && ws.scalar_type() != at::kDouble,
              "bie_cuda.dynamic_gemv: weight_scale must be float32, float16 or bfloat16, got ", ws.scalar_type());
  c10::cuda::CUDAGuard guard(x.device());
  auto out = at::empty({M, N}, x.options());
  if (M == 0) return out;
  bie::DynGemvArgs p{};
  p.x = xc.data_ptr();
  p.ldx = M > 1 ? xc.stride(0) : K;
  const int64_t esize = xc.element_size();
  p.x_vec = (reinterpret_cast<uintptr_t>(p.x) % 16 == 0 && (M <= 1 || (p.ldx * esize) % 16 == 0)) ? 1 : 0;
  p.w = wf.data_ptr<int8_t>();
  p.wscale = ws.data_ptr();
  p.wscale_dtype = dtype_code(ws.scalar_type());
  p.per_channel = ws.numel() == N && N > 1 ? 1 : 0;
  Tensor bias_c;
  set_bias_out(p, bias, bias_c, x, out, xt, N, "dynamic_gemv");
  p.M = (int)M;
  p.N = (int)N;
  p.K = (int)K;
  p.pdl = pdl && compute_major() >= 9 ? 1 : 0;
  const int optin = smem_optin();
  TORCH_CHECK(bie::dynamic_gemv_min_smem((int)M, (int)K) <= (size_t)optin, "bie_cuda.dynamic_gemv: ", M, " rows of K=", K,
              " need ", bie::dynamic_gemv_min_smem((int)M, (int)K), " bytes of shared memory, the device allows ", optin);
  check_launch(bie::launch_dynamic_gemv(p, dtype_code(xt), (int)grid, num_sms(), optin, stream(), (int)ring,
                                        compute_major(), 1),
               "dynamic_gemv");
  return out;
}

// int_gemm for 1-32 rows in one launch (dynamic_gemv.cu, modes 1 and 2): x the int8 codes (M, K), or floats that the
// kernel quantizes as quantize_int(x, act_scale, bits, shift) does (act_scale one float32 value on x's device, shift
// K values in x's dtype or none); wf the fragment-ordered weight codes (dynamic.py prepare_gemv). The epilogue:
// the int32 sums (out_dtype none), or float32(acc) * float32(scale) + float32(bias) in out_dtype. cluster: blocks
// per cluster sharing the codes of x (0: the launcher's choice, sm_90 from 9 rows; 1: none; 2, 4, 8: that many, or
// fewer where the device cannot hold them; sm_90 only).
Tensor int_gemv(const Tensor& x, const std::optional<Tensor>& act_scale, const std::optional<Tensor>& shift,
                int64_t bits, const Tensor& wf, const std::optional<Tensor>& scale, const std::optional<Tensor>& bias,
                int64_t N, int64_t K, std::optional<at::ScalarType> out_dtype, bool pdl, int64_t ring,
                int64_t cluster) {
  check_cuda(x, "x");
  check_cuda(wf, "wf");
  check_rows(x, K, "int_gemv");
  TORCH_CHECK(rows_of(x) >= 1 && rows_of(x) <= bie::INT_GEMV_MAX_M, "bie_cuda.int_gemv: x must have 1 to ",
              bie::INT_GEMV_MAX_M, " rows of ", K, " features, got ", x.sizes());
  TORCH_CHECK(K >= 1 && K <= 65535 && N >= 1 && N < (1ll << 30),
              "bie_cuda.int_gemv: K must be 1..65535 and N positive, got K=", K, " N=", N);
  const auto xt = x.scalar_type();
  const bool codes = xt == at::kChar;
  TORCH_CHECK(codes || xt == at::kFloat || xt == at::kHalf || xt == at::kBFloat16,
              "bie_cuda.int_gemv: x must be int8 codes or float32, float16, bfloat16, got ", xt);
  const int64_t NB = (N + 15) / 16, KT = (K + 31) / 32;
  TORCH_CHECK(wf.scalar_type() == at::kChar && wf.is_contiguous() && wf.numel() == NB * KT * 512 &&
                  wf.device() == x.device(),
              "bie_cuda.int_gemv: wf is not the fragment-ordered layout of a (", N, ", ", K, ") int8 weight");
  TORCH_CHECK(ring == 0 || ring == 1, "bie_cuda.int_gemv: ring must be 0 or 1, got ", ring);
  TORCH_CHECK(cluster == 0 || cluster == 1 || cluster == 2 || cluster == 4 || cluster == 8,
              "bie_cuda.int_gemv: cluster must be 0 (chosen), 1, 2, 4 or 8, got ", cluster);
  const Tensor xc = (K <= 1 || x.stride(-1) == 1) ? x : x.contiguous();
  const int64_t M = rows_of(xc);
  bie::DynGemvArgs p{};
  Tensor shift_c;
  if (codes) {
    p.mode = 2;
  } else {
    TORCH_CHECK(bits == 4 || bits == 8, "bie_cuda.int_gemv: bits must be 4 or 8, got ", bits);
    TORCH_CHECK(act_scale.has_value() && act_scale->defined() && act_scale->numel() == 1 &&
                    act_scale->scalar_type() == at::kFloat && act_scale->device() == x.device(),
                "bie_cuda.int_gemv: act_scale must be one float32 value on x's device");
    p.mode = 1;
    p.act_scale = act_scale->data_ptr<float>();
    p.qlo = bits == 4 ? -8 : -128;
    p.qhi = bits == 4 ? 7 : 127;
    if (shift.has_value() && shift->defined()) {
      shift_c = shift->reshape({-1}).contiguous();
      TORCH_CHECK(shift_c.scalar_type() == xt && shift_c.numel() == K && shift_c.device() == x.device(),
                  "bie_cuda.int_gemv: shift must be ", K, " values in x's dtype on x's device");
      p.shift = shift_c.data_ptr();
      p.shift_vec = reinterpret_cast<uintptr_t>(p.shift) % 16 == 0 ? 1 : 0;
    }
  }
  const at::ScalarType odt = out_dtype.has_value() ? *out_dtype : at::kInt;
  TORCH_CHECK(odt == at::kInt || odt == at::kFloat || odt == at::kHalf || odt == at::kBFloat16,
              "bie_cuda.int_gemv: out_dtype must be int32 (none), float32, float16 or bfloat16");
  c10::cuda::CUDAGuard guard(x.device());
  auto out = at::empty(rows_out_shape(x, N), x.options().dtype(odt));
  bie::BinGemmArgs e{};   // (the scale and bias checks of the binary GEMMs' epilogue: the same contract)
  const auto keep = set_scale_bias(e, scale, bias, odt, N, x.device(), "int_gemv");
  p.wscale = e.scale;
  p.wscale_dtype = e.scale_dtype;
  p.per_channel = e.scale != nullptr && e.scale_stride == 1 && N > 1 ? 1 : 0;
  p.bias = e.bias;
  p.bias_dtype = e.bias_dtype;
  p.out = out.data_ptr();
  p.out_dtype = dtype_code(odt);
  p.x = xc.data_ptr();
  p.ldx = M > 1 && xc.dim() == 2 ? xc.stride(0) : K;
  const int64_t esize = xc.element_size(), align = codes ? 8 : 16;
  p.x_vec = (reinterpret_cast<uintptr_t>(p.x) % align == 0 && (M <= 1 || (p.ldx * esize) % align == 0)) ? 1 : 0;
  p.w = wf.data_ptr<int8_t>();
  p.M = (int)M;
  p.N = (int)N;
  p.K = (int)K;
  // (the compute capability of x's device, as the guard above made it current)
  const int major = compute_major();
  TORCH_CHECK(cluster <= 1 || major == 9, "bie_cuda.int_gemv: clusters of ", cluster,
              " blocks need an sm_90 GPU (compute capability 9.x), this one is ", major, ".x");
  p.pdl = pdl && major >= 9 ? 1 : 0;
  const int optin = smem_optin();
  TORCH_CHECK(bie::dynamic_gemv_min_smem((int)M, (int)K) <= (size_t)optin, "bie_cuda.int_gemv: ", M, " rows of K=", K,
              " need more shared memory than the device allows (", optin, " bytes)");
  check_launch(bie::launch_dynamic_gemv(p, dtype_code(xt), 0, num_sms(), optin, stream(), (int)ring, major,
                                        (int)cluster),
               "int_gemv");
  return out;
}

// dynamic_quantize_act, scheme per_token_symmetric, in one pass (dynamic_quantize.cu). x (M, K) float32/float16/
// bfloat16: rows of any stride, or a transposed x (unit row stride: y.t() of a y with rows of unit stride), whose codes
// come out transposed from two passes over y (dynamic_quantize_cols.cu); other layouts are copied. Returns (int8
// codes (M, K) contiguous, float32 scales (M)).
std::tuple<Tensor, Tensor> dynamic_quantize_token(const Tensor& x) {
  check_cuda(x, "x");
  TORCH_CHECK(x.dim() == 2, "bie_cuda.dynamic_quantize_token: x must be 2-D (M, K), got ", x.sizes());
  const auto xt = x.scalar_type();
  TORCH_CHECK(xt == at::kFloat || xt == at::kHalf || xt == at::kBFloat16,
              "bie_cuda.dynamic_quantize_token: x must be float32, float16 or bfloat16, got ", xt);
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(M < (1ll << 31) && K < (1ll << 31) - 8,
              "bie_cuda.dynamic_quantize_token: at most 2^31 - 1 rows of fewer than 2^31 - 8 elements, got ", x.sizes());
  c10::cuda::CUDAGuard guard(x.device());
  auto codes = at::empty({M, K}, x.options().dtype(at::kChar));
  if (K == 0) return {codes, at::ones({M}, x.options().dtype(at::kFloat))};   // an empty row's abs-max is 0: scale 1
  auto scale = at::empty({M}, x.options().dtype(at::kFloat));
  if (M == 0) return {codes, scale};
  if (M > 1 && K > 1 && x.stride(0) == 1 && x.stride(1) >= M && K <= 65535ll * 128) {
    auto amax = at::empty({M}, x.options().dtype(at::kInt));
    bie::DynQuantArgs p{};
    p.x = x.data_ptr();
    p.ldx = x.stride(1);
    p.x_vec = (reinterpret_cast<uintptr_t>(p.x) % 16 == 0 && (p.ldx * x.element_size()) % 16 == 0) ? 1 : 0;
    p.codes = codes.data_ptr<int8_t>();
    p.out_vec = (reinterpret_cast<uintptr_t>(p.codes) % 16 == 0 && K % 16 == 0) ? 1 : 0;
    p.scale = scale.data_ptr<float>();
    p.M = M;
    p.K = (int)K;
    p.amax = reinterpret_cast<uint32_t*>(amax.data_ptr<int32_t>());
    check_launch(bie::launch_dynamic_quantize_token_cols(p, dtype_code(xt), stream()), "dynamic_quantize_token");
    return {codes, scale};
  }
  const Tensor xc = (K <= 1 || x.stride(1) == 1) ? x : x.contiguous();
  bie::DynQuantArgs p{};
  p.x = xc.data_ptr();
  p.ldx = M > 1 ? xc.stride(0) : K;
  const int64_t esize = xc.element_size();
  p.x_vec = (reinterpret_cast<uintptr_t>(p.x) % 16 == 0 && (M <= 1 || (p.ldx * esize) % 16 == 0)) ? 1 : 0;
  p.codes = codes.data_ptr<int8_t>();
  p.out_vec = (reinterpret_cast<uintptr_t>(p.codes) % 8 == 0 && K % 8 == 0) ? 1 : 0;
  p.scale = scale.data_ptr<float>();
  p.M = M;
  p.K = (int)K;
  check_launch(bie::launch_dynamic_quantize_token(p, dtype_code(xt), stream()), "dynamic_quantize_token");
  return {codes, scale};
}

// The direct binary conv2d (binary_conv.cu), groups == 1. x (N, C, H, W) float32/float16/bfloat16/int8, any strides;
// wp (O, KWP) int32 weight words in (tap, channel word) K order (bie_backend_cuda.binary.conv_weight), wpop (O) and
// wtap (O, KH*KW) int32 popcounts; geom = [KH, KW, SH, SW, PH, PW, DH, DW]; pad_mode 0: pad -1, 1: +1, 2: 0.
// tile: 0 chosen by shape, 1 = 128 pixels x 64 channels per block, 2 = 128 x 32, 3 = 64 x 64, 4 = 64 x 32;
// 5-8: tiles 1-4 reading the windows from global memory, never staged in shared memory (tests).
// Returns (N, O, Ho, Wo) contiguous NCHW.
Tensor binary_conv2d(const Tensor& x, const Tensor& wp, const Tensor& wpop, const Tensor& wtap,
                     std::vector<int64_t> geom, int64_t pad_mode, const std::optional<Tensor>& scale,
                     const std::optional<Tensor>& bias, std::optional<at::ScalarType> out_dtype, int64_t tile) {
  const char* who = "binary_conv2d";
  check_cuda(x, "x");
  check_cuda(wp, "wp");
  check_cuda(wpop, "wpop");
  check_cuda(wtap, "wtap");
  TORCH_CHECK(x.dim() == 4, "bie_cuda.binary_conv2d: x must be 4-D (N, C, H, W)");
  const auto xt = x.scalar_type();
  TORCH_CHECK(xt == at::kFloat || xt == at::kHalf || xt == at::kBFloat16 || xt == at::kChar,
              "bie_cuda.binary_conv2d: x must be float32, float16, bfloat16 or int8");
  TORCH_CHECK(geom.size() == 8, "bie_cuda.binary_conv2d: geom must be [KH, KW, SH, SW, PH, PW, DH, DW]");
  const int64_t KH = geom[0], KW = geom[1], SH = geom[2], SW = geom[3], PH = geom[4], PW = geom[5], DH = geom[6],
                DW = geom[7];
  TORCH_CHECK(KH > 0 && KW > 0 && SH > 0 && SW > 0 && DH > 0 && DW > 0 && PH >= 0 && PW >= 0 && KH * KW <= 4096,
              "bie_cuda.binary_conv2d: kernel, stride, dilation must be > 0 (kernel at most 4096 taps), padding >= 0");
  TORCH_CHECK(pad_mode >= 0 && pad_mode <= 2, "bie_cuda.binary_conv2d: pad_mode must be 0 (-1), 1 (+1) or 2 (0)");
  TORCH_CHECK(pad_mode != 2 || KH * KW <= 32, "bie_cuda.binary_conv2d: pad value 0 serves kernels of at most 32 taps");
  TORCH_CHECK(tile >= 0 && tile <= 8, "bie_cuda.binary_conv2d: tile must be 0 (chosen) or 1-8");
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  TORCH_CHECK(C > 0, "bie_cuda.binary_conv2d: x has no channels");
  const int64_t Ho = (H + 2 * PH - DH * (KH - 1) - 1) / SH + 1, Wo = (W + 2 * PW - DW * (KW - 1) - 1) / SW + 1;
  TORCH_CHECK(H + 2 * PH - DH * (KH - 1) - 1 >= 0 && W + 2 * PW - DW * (KW - 1) - 1 >= 0,
              "bie_cuda.binary_conv2d: input too small for the kernel");
  const int64_t CW = (C + 31) / 32, KWORDS = KH * KW * CW, KWP = (KWORDS + 7) / 8 * 8;
  const int64_t O = wp.size(0);
  TORCH_CHECK(wp.dim() == 2 && wp.scalar_type() == at::kInt && wp.is_contiguous() && wp.size(1) == KWP,
              "bie_cuda.binary_conv2d: wp must be contiguous int32 (O, ", KWP, ") for C=", C, ", kernel ", KH, "x",
              KW, "; got ", wp.sizes());
  TORCH_CHECK(wpop.scalar_type() == at::kInt && wpop.is_contiguous() && wpop.numel() == O,
              "bie_cuda.binary_conv2d: wpop must be contiguous int32 with O values");
  TORCH_CHECK(wtap.scalar_type() == at::kInt && wtap.is_contiguous() && wtap.numel() == O * KH * KW,
              "bie_cuda.binary_conv2d: wtap must be contiguous int32 (O, KH*KW)");
  TORCH_CHECK(wp.device() == x.device() && wpop.device() == x.device() && wtap.device() == x.device(),
              "bie_cuda.binary_conv2d: weights on another device");
  const int64_t Hp = H + 2 * PH, Wp = W + 2 * PW;
  // 32-bit word offsets inside the kernels; K (a count) in int32
  TORCH_CHECK(N * Hp * Wp * CW < (1ll << 31) - 1024 && N * Ho * Wo < (1ll << 31) - 1024 && C * KH * KW < (1ll << 30) &&
                  O < 65535ll * 32 && N * Hp * Wp < (1ll << 31),
              "bie_cuda.binary_conv2d: problem outside the 32-bit index range served");
  c10::cuda::CUDAGuard guard(x.device());
  const at::ScalarType odt = binary_out_dtype(out_dtype, who);
  auto out = at::empty({N, O, Ho, Wo}, x.options().dtype(odt));
  if (N == 0 || O == 0 || Ho == 0 || Wo == 0) return out;
  auto packed = at::empty({N * Hp * Wp * CW}, x.options().dtype(at::kInt));
  bie::BinConvArgs p{};
  p.x = x.data_ptr();
  p.x_dtype = dtype_code(xt);
  p.sn = x.stride(0);
  p.sc = x.stride(1);
  p.sh = x.stride(2);
  p.sw = x.stride(3);
  p.N = (int)N;
  p.C = (int)C;
  p.H = (int)H;
  p.W = (int)W;
  p.PH = (int)PH;
  p.PW = (int)PW;
  p.Hp = (int)Hp;
  p.Wp = (int)Wp;
  p.CW = (int)CW;
  p.pad_mode = (int)pad_mode;
  p.packed = reinterpret_cast<uint32_t*>(packed.data_ptr<int32_t>());
  p.wp = reinterpret_cast<const uint32_t*>(wp.data_ptr<int32_t>());
  p.wpop = wpop.data_ptr<int32_t>();
  p.wtap = wtap.data_ptr<int32_t>();
  p.O = (int)O;
  p.KH = (int)KH;
  p.KW = (int)KW;
  p.SH = (int)SH;
  p.SW = (int)SW;
  p.DH = (int)DH;
  p.DW = (int)DW;
  p.Ho = (int)Ho;
  p.Wo = (int)Wo;
  p.K = (int)(C * KH * KW);
  p.KWORDS = (int)KWORDS;
  p.KWP = (int)KWP;
  p.out = out.data_ptr();
  p.out_dtype = dtype_code(odt);
  const auto keep = set_scale_bias(p, scale, bias, odt, O, x.device(), who);
  {  // the largest tile without the windows' range (the launcher stages that only where it fits)
    bie::BinConvArgs q = p;
    q.span_cap = 0;
    TORCH_CHECK(bie::conv_smem_bytes(q, 1) <= (size_t)smem_optin(),
                "bie_cuda.binary_conv2d: ", KWORDS, " K words need more shared memory than this GPU has");
  }
  check_launch(bie::launch_bconv_pack(p, stream()), "binary_conv2d (packing)");
  const int t = tile == 0 ? bie::conv_auto_tile(p, num_sms()) : (int)(tile > 4 ? tile - 4 : tile);
  // tiles 1-4 stage the windows in shared memory, 5-8 read them through L1; tile 0 chooses both
  const bool stage = tile == 0 ? bie::conv_auto_stage(p) : tile <= 4;
  check_launch(bie::launch_bconv(p, t, stage, stream()), "binary_conv2d");
  return out;
}

// ------------------------------------------------------------ quantize_int
// x contiguous float; scale float32 on x's device: one value (inner == 0) or values[i / inner]; shift: cols
// contiguous values of x's dtype (element i adds shift[i % cols]) or none; codes as int8 or out_dtype (quantize.cu).
Tensor quantize_int(const Tensor& x, const Tensor& scale, int64_t inner, int64_t bits, const std::optional<Tensor>& shift,
                    std::optional<at::ScalarType> out_dtype) {
  const char* who = "bie_cuda.quantize_int: ";
  check_cuda(x, "x");
  TORCH_CHECK(x.is_contiguous(), who, "x must be contiguous");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16, who,
              "x must be float32, float16 or bfloat16, got ", x.scalar_type());
  TORCH_CHECK(bits == 4 || bits == 8, who, "bits must be 4 or 8, got ", bits);
  TORCH_CHECK(scale.device() == x.device() && scale.scalar_type() == at::kFloat && scale.is_contiguous(), who,
              "scale must be contiguous float32 on x's device");
  const int64_t n = x.numel();
  TORCH_CHECK(inner >= 0, who, "inner must be >= 0, got ", inner);
  if (inner == 0) {
    TORCH_CHECK(scale.numel() == 1, who, "one scale value expected (inner 0), got ", scale.numel());
  } else {
    TORCH_CHECK(scale.numel() * inner == n, who, scale.numel(), " scale values in runs of ", inner, " do not cover ",
                n, " elements");
  }
  const void* sp = nullptr;
  int64_t cols = 0;
  if (shift.has_value() && shift->defined()) {
    TORCH_CHECK(x.dim() >= 1 && shift->device() == x.device() && shift->scalar_type() == x.scalar_type() &&
                    shift->dim() == 1 && shift->is_contiguous() && shift->numel() == x.size(-1) && x.size(-1) > 0,
                who, "shift must be one contiguous value of x's dtype per element of x's last dimension");
    sp = shift->data_ptr();
    cols = shift->numel();
  }
  int odt = bie::kI8;
  if (out_dtype.has_value()) {
    TORCH_CHECK(*out_dtype == at::kFloat || *out_dtype == at::kHalf || *out_dtype == at::kBFloat16, who,
                "out_dtype must be a float dtype or None, got ", *out_dtype);
    odt = dtype_code(*out_dtype);
  }
  c10::cuda::CUDAGuard guard(x.device());
  auto out = at::empty(x.sizes(), x.options().dtype(out_dtype.has_value() ? *out_dtype : at::kChar));
  check_launch(bie::launch_quantize_int(x.data_ptr(), dtype_code(x.scalar_type()), n, scale.data_ptr<float>(),
                                        inner == 0, inner, sp, cols, (int)bits, out.data_ptr(), odt, stream()),
               "quantize_int");
  return out;
}
// ------------------------------------------------------------ transpose_2d
// x.t() as a new contiguous tensor: rows of unit stride read as they are (any row stride), other layouts copied to
// contiguous first.
Tensor transpose_2d(const Tensor& x) {
  check_cuda(x, "x");
  TORCH_CHECK(x.dim() == 2, "bie_cuda.transpose_2d: x must be 2-D, got ", x.sizes());
  const int64_t es = x.element_size();
  TORCH_CHECK(es == 1 || es == 2 || es == 4 || es == 8, "bie_cuda.transpose_2d: elements of ", es,
              " bytes are not supported (1, 2, 4 or 8)");
  auto out = at::empty({x.size(1), x.size(0)}, x.options());
  if (x.numel() == 0) return out;
  const Tensor xs = (x.stride(1) == 1 && x.stride(0) >= x.size(1)) ? x : x.contiguous();
  c10::cuda::CUDAGuard guard(x.device());
  check_launch(bie::launch_transpose_2d(xs.data_ptr(), xs.stride(0), out.data_ptr(), xs.size(0), xs.size(1), (int)es,
                                        stream()),
               "transpose_2d");
  return out;
}

// Mixed-width weight-only kernels (mbwq.cu). The operands come from bie_backend_cuda/mbwq.py's prepared layout:
// chunks (nchunks, 4) int32 (the chunk table), scales / zeros (G, N) float32, perm (K) int32, rscale (K) float32
// or None; qweight (KW, N) int32 as the op received it. The table's entries are checked by the kernels against K,
// G and KW; perm's values are checked where they are used.
void check_mbwq_operands(const char* who, const Tensor& qweight, const Tensor& chunks, const Tensor& scales,
                         const Tensor& zeros, const std::optional<Tensor>& rscale, int64_t K) {
  for (const Tensor* t : {&qweight, &chunks, &scales, &zeros}) check_cuda(*t, who);
  const auto dev = qweight.device();
  TORCH_CHECK(qweight.scalar_type() == at::kInt && qweight.dim() == 2 && qweight.is_contiguous() &&
                  qweight.size(0) >= 1 && qweight.size(1) >= 1 && qweight.size(1) < (1ll << 30),
              "bie_cuda.", who, ": qweight must be a contiguous (KW, N) int32 tensor, got ", qweight.scalar_type(), " ",
              qweight.sizes());
  const int64_t N = qweight.size(1);
  TORCH_CHECK(chunks.scalar_type() == at::kInt && chunks.dim() == 2 && chunks.size(1) == 4 && chunks.size(0) >= 1 &&
                  chunks.size(0) < (1ll << 31) && chunks.is_contiguous() && chunks.device() == dev,
              "bie_cuda.", who, ": chunks must be a contiguous (nchunks, 4) int32 chunk table on qweight's device, ",
              "got ", chunks.scalar_type(), " ", chunks.sizes());
  TORCH_CHECK(reinterpret_cast<uintptr_t>(chunks.data_ptr()) % 16 == 0, "bie_cuda.", who,
              ": chunks must be 16-byte aligned");
  TORCH_CHECK(scales.dim() == 2 && scales.size(0) >= 1 && scales.size(0) < (1ll << 31) && scales.size(1) == N,
              "bie_cuda.", who, ": scales must be (G, ", N, "), got ", scales.sizes());
  for (const Tensor* t : {&scales, &zeros})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->device() == dev &&
                    t->sizes() == scales.sizes(),
                "bie_cuda.", who, ": scales and zeros must be contiguous float32 (G, N) tensors on qweight's device");
  TORCH_CHECK(K >= 1 && K < (1ll << 31) - 64, "bie_cuda.", who, ": K must be 1..2^31-65, got ", K);
  if (rscale.has_value() && rscale->defined()) {
    check_cuda(*rscale, who);
    TORCH_CHECK(rscale->scalar_type() == at::kFloat && rscale->dim() == 1 && rscale->numel() == K &&
                    rscale->is_contiguous() && rscale->device() == dev,
                "bie_cuda.", who, ": rscale must be a contiguous float32 (", K, ") tensor on qweight's device");
  }
}

// The mixed-width weight's fields that the GEMV's and the skinny kernel's arguments share (checked operands)
template <class Args>
void fill_mbwq_weight(Args& p, const Tensor& qweight, const Tensor& chunks, const Tensor& scales, const Tensor& zeros,
                      int64_t K) {
  p.qweight = qweight.data_ptr<int32_t>();
  p.KW = qweight.size(0);
  p.N = (int)qweight.size(1);
  p.K = (int)K;
  p.G = (int)scales.size(0);
  p.chunks = reinterpret_cast<const int4*>(chunks.data_ptr<int32_t>());
  p.nchunks = (int)chunks.size(0);
  p.scales = scales.data_ptr<float>();
  p.zeros = zeros.data_ptr<float>();
}

void fill_mbwq_args(bie::MbwqArgs& p, const Tensor& qweight, const Tensor& chunks, const Tensor& scales,
                    const Tensor& zeros, const std::optional<Tensor>& rscale, int64_t K) {
  fill_mbwq_weight(p, qweight, chunks, scales, zeros, K);
  p.rscale = rscale.has_value() && rscale->defined() ? rscale->data_ptr<float>() : nullptr;
}

// mbwq_gemm for 1..MBWQ_GEMV_MAX_M rows in one launch: x (M, K) float32/float16/bfloat16 (rows of any stride; a
// column stride other than 1 is copied), bias N values of a floating dtype or None, counters the zeroed split-K
// semaphores of the current stream (at least ceil(N / 128)), splits 0 (planned) or the K splits to use at most.
// Returns (M, N) in x's dtype.
Tensor mbwq_gemv(const Tensor& x, const Tensor& qweight, const Tensor& chunks, const Tensor& perm,
                 const Tensor& scales, const Tensor& zeros, const std::optional<Tensor>& rscale,
                 const std::optional<Tensor>& bias, const Tensor& counters, int64_t splits) {
  const char* who = "mbwq_gemv";
  check_cuda(x, "x");
  check_cuda(perm, "perm");
  check_cuda(counters, "counters");
  TORCH_CHECK(x.dim() >= 1 && (x.dim() == 2 || x.is_contiguous()), "bie_cuda.mbwq_gemv: x must be (M, K) or "
              "contiguous (..., K), got ", x.sizes());
  const auto xt = x.scalar_type();
  TORCH_CHECK(xt == at::kFloat || xt == at::kHalf || xt == at::kBFloat16,
              "bie_cuda.mbwq_gemv: x must be float32, float16 or bfloat16, got ", xt);
  const int64_t M = rows_of(x), K = x.size(-1);
  TORCH_CHECK(M <= bie::MBWQ_GEMV_MAX_M, "bie_cuda.mbwq_gemv: at most ", bie::MBWQ_GEMV_MAX_M, " rows, got ", M);
  check_mbwq_operands(who, qweight, chunks, scales, zeros, rscale, K);
  const int64_t N = qweight.size(1);
  TORCH_CHECK(perm.scalar_type() == at::kInt && perm.dim() == 1 && perm.numel() == K && perm.is_contiguous(),
              "bie_cuda.mbwq_gemv: perm must be a contiguous int32 (", K, ") tensor, got ", perm.scalar_type(), " ",
              perm.sizes());
  TORCH_CHECK(x.device() == qweight.device() && perm.device() == x.device() && counters.device() == x.device(),
              "bie_cuda.mbwq_gemv: tensors on different devices");
  const int64_t colblocks = (N + bie::MBWQ_THREADS - 1) / bie::MBWQ_THREADS;
  TORCH_CHECK(counters.scalar_type() == at::kInt && counters.is_contiguous() && counters.numel() >= colblocks,
              "bie_cuda.mbwq_gemv: counters must be a contiguous int32 tensor of at least ", colblocks, " values");
  TORCH_CHECK(splits >= 0 && splits < 65536, "bie_cuda.mbwq_gemv: splits must be 0..65535, got ", splits);
  c10::cuda::CUDAGuard guard(x.device());
  auto out = at::empty(rows_out_shape(x, N), x.options());
  if (M == 0) return out;
  const Tensor xc = (K <= 1 || x.stride(-1) == 1) ? x : x.contiguous();
  bie::MbwqArgs p{};
  fill_mbwq_args(p, qweight, chunks, scales, zeros, rscale, K);
  p.perm = perm.data_ptr<int32_t>();
  p.x = xc.data_ptr();
  p.ldx = M > 1 && xc.dim() == 2 ? xc.stride(0) : K;
  p.M = (int)M;
  Tensor bias_c;
  set_bias_out(p, bias, bias_c, x, out, xt, N, who);
  p.counters = counters.data_ptr<int32_t>();
  bie::mbwq_gemv_plan(p, num_sms(), (int)splits);
  TORCH_CHECK(p.splits <= 65535, "bie_cuda.mbwq_gemv: ", p.nchunks, " chunks need ", p.splits,
              " K splits, more than a grid allows (65535)");
  Tensor ws;
  if (p.splits > 1) {
    ws = at::empty({(int64_t)p.splits, M, N}, x.options().dtype(at::kFloat));
    p.ws = ws.data_ptr<float>();
  }
  check_launch(bie::launch_mbwq_gemv(p, dtype_code(xt), stream()), who);
  return out;
}

// The (K, N) dequantized weight in out_dtype: row perm[j] (perm given) or j holds packed row j, (q * s - z) *
// rscale[j] (rscale given). With perm every row is written when perm is a permutation (the caller checks that).
Tensor mbwq_dequant(const Tensor& qweight, const Tensor& chunks, const Tensor& scales, const Tensor& zeros,
                    const std::optional<Tensor>& rscale, const std::optional<Tensor>& perm, int64_t K,
                    at::ScalarType out_dtype) {
  const char* who = "mbwq_dequant";
  check_mbwq_operands(who, qweight, chunks, scales, zeros, rscale, K);
  TORCH_CHECK(out_dtype == at::kFloat || out_dtype == at::kHalf || out_dtype == at::kBFloat16,
              "bie_cuda.mbwq_dequant: out_dtype must be float32, float16 or bfloat16, got ", out_dtype);
  const int64_t N = qweight.size(1);
  TORCH_CHECK((N + bie::MBWQ_THREADS - 1) / bie::MBWQ_THREADS <= 65535,
              "bie_cuda.mbwq_dequant: N must be at most ", 65535ll * bie::MBWQ_THREADS, ", got ", N);
  bie::MbwqArgs p{};
  fill_mbwq_args(p, qweight, chunks, scales, zeros, rscale, K);
  if (perm.has_value() && perm->defined()) {
    check_cuda(*perm, who);
    TORCH_CHECK(perm->scalar_type() == at::kInt && perm->dim() == 1 && perm->numel() == K && perm->is_contiguous() &&
                    perm->device() == qweight.device(),
                "bie_cuda.mbwq_dequant: perm must be a contiguous int32 (", K, ") tensor on qweight's device");
    p.perm = perm->data_ptr<int32_t>();
  }
  c10::cuda::CUDAGuard guard(qweight.device());
  auto out = at::empty({K, N}, qweight.options().dtype(out_dtype));
  p.out = out.data_ptr();
  p.out_dtype = dtype_code(out_dtype);
  check_launch(bie::launch_mbwq_dequant(p, stream()), who);
  return out;
}

// mbwq_gemm for any rows in one library call (past the GEMV's rows): the weight dequantized with rscale folded in, in
// x's dtype, its rows scattered to input order by perm (the dequantization kernel: packed row j is input row perm[j];
// perm must be a permutation, as prepare checks), then cuBLAS, addmm with the bias cast to x's dtype. Scattering
// the weight's rows (one perm read per row written) spares a gather of x's columns: an index_select, an allocation
// and a launch on every call. x of any rank (rows_of; a strided x is copied to rows), the output in its shape.
Tensor mbwq_gemm_dense(const Tensor& x, const Tensor& qweight, const Tensor& chunks, const Tensor& perm,
                       const Tensor& scales, const Tensor& zeros, const std::optional<Tensor>& rscale,
                       const std::optional<Tensor>& bias) {
  check_cuda(x, "x");
  TORCH_CHECK(x.dim() >= 1, "bie_cuda.mbwq_gemm_dense: x must have K features last, got ", x.sizes());
  const auto xt = x.scalar_type();
  TORCH_CHECK(xt == at::kFloat || xt == at::kHalf || xt == at::kBFloat16,
              "bie_cuda.mbwq_gemm_dense: x must be float32, float16 or bfloat16, got ", xt);
  TORCH_CHECK(qweight.device() == x.device(), "bie_cuda.mbwq_gemm_dense: tensors on different devices");
  const int64_t K = x.size(-1);
  c10::cuda::CUDAGuard guard(x.device());
  const Tensor w = mbwq_dequant(qweight, chunks, scales, zeros, rscale, perm, K, xt);   // (checks perm)
  const Tensor x2 = x.reshape({-1, K});
  Tensor out;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->device() == x.device() && bias->numel() == w.size(1),
                "bie_cuda.mbwq_gemm_dense: bias must hold N = ", w.size(1), " values on x's device");
    out = at::addmm(bias->to(xt), x2, w);
  } else {
    out = at::mm(x2, w);
  }
  return out.view(rows_out_shape(x, w.size(1)));
}

// mbwq_gemm for up to MBWQ_SKINNY_MAX_M rows of fp16 / bf16 x in one cooperative launch (mbwq_skinny.cu). The
// operands are the prepared layout's (bie_backend_cuda/mbwq.py): chunks, scales, zeros as for mbwq_gemv; xslot (K)
// int32, the row of the kernel's scratch that input row k feeds; cscale (K) float32 channel_scale in input order or
// None; max_bits the widest code of the table (a chunk wider than that is skipped). The K splits' counters are part
// of the call's scratch (zeroed by the kernel: nothing is shared between calls, streams or CUDA graphs). tune
// (benchmarks): bits 0..15 the K splits to use at most (0: planned), bits 16..19 the ring's stages (0: planned). x of
// any rank (rows_of; a column stride other than 1 is copied), the output in its shape and dtype.
Tensor mbwq_skinny(const Tensor& x, const Tensor& qweight, const Tensor& chunks, const Tensor& xslot,
                   const Tensor& scales, const Tensor& zeros, const std::optional<Tensor>& cscale,
                   const std::optional<Tensor>& bias, int64_t max_bits, int64_t tune) {
  const char* who = "mbwq_skinny";
  check_cuda(x, "x");
  check_cuda(xslot, "xslot");
  TORCH_CHECK(x.dim() >= 1 && (x.dim() == 2 || x.is_contiguous()), "bie_cuda.mbwq_skinny: x must be (M, K) or "
              "contiguous (..., K), got ", x.sizes());
  const auto xt = x.scalar_type();
  TORCH_CHECK(xt == at::kHalf || xt == at::kBFloat16, "bie_cuda.mbwq_skinny: x must be float16 or bfloat16, got ",
              xt);
  const int64_t M = rows_of(x), K = x.size(-1);
  TORCH_CHECK(M <= bie::MBWQ_SKINNY_MAX_M, "bie_cuda.mbwq_skinny: at most ", bie::MBWQ_SKINNY_MAX_M,
              " rows, got ", M);
  check_mbwq_operands(who, qweight, chunks, scales, zeros, std::nullopt, K);
  const int64_t N = qweight.size(1);
  TORCH_CHECK(xslot.scalar_type() == at::kInt && xslot.dim() == 1 && xslot.numel() == K && xslot.is_contiguous(),
              "bie_cuda.mbwq_skinny: xslot must be a contiguous int32 (", K, ") tensor, got ", xslot.scalar_type(),
              " ", xslot.sizes());
  if (cscale.has_value() && cscale->defined()) {
    check_cuda(*cscale, who);
    TORCH_CHECK(cscale->scalar_type() == at::kFloat && cscale->dim() == 1 && cscale->numel() == K &&
                    cscale->is_contiguous() && cscale->device() == x.device(),
                "bie_cuda.mbwq_skinny: cscale must be a contiguous float32 (", K, ") tensor on x's device");
  }
  TORCH_CHECK(x.device() == qweight.device() && xslot.device() == x.device(),
              "bie_cuda.mbwq_skinny: tensors on different devices");
  TORCH_CHECK(max_bits >= 2 && max_bits <= 8, "bie_cuda.mbwq_skinny: max_bits must be 2..8, got ", max_bits);
  TORCH_CHECK(tune >= 0 && tune < (1 << 20), "bie_cuda.mbwq_skinny: tune must be 0..2^20-1, got ", tune);
  c10::cuda::CUDAGuard guard(x.device());
  TORCH_CHECK(compute_major() >= 8, "bie_cuda.mbwq_skinny: needs sm_80 or newer (bf16 / fp16 mma)");
  auto out = at::empty(rows_out_shape(x, N), x.options());
  if (M == 0) return out;
  const Tensor xc = (K <= 1 || x.stride(-1) == 1) ? x : x.contiguous();
  bie::MbwqSkinnyArgs p{};
  fill_mbwq_weight(p, qweight, chunks, scales, zeros, K);
  p.xslot = xslot.data_ptr<int32_t>();
  p.cscale = cscale.has_value() && cscale->defined() ? cscale->data_ptr<float>() : nullptr;
  p.x = xc.data_ptr();
  p.ldx = M > 1 && xc.dim() == 2 ? xc.stride(0) : K;
  p.M = (int)M;
  Tensor bias_c;
  set_bias_out(p, bias, bias_c, x, out, xt, N, who);
  p.sr = (int)max_bits;
  const auto al16 = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  p.vec = N % 4 == 0 && al16(p.qweight) && al16(p.scales) && al16(p.zeros) ? 1 : 0;
  int dev = 0, coop = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev);
  TORCH_CHECK(coop != 0, "bie_cuda.mbwq_skinny: the device has no cooperative launches");
  const int smem = bie::mbwq_skinny_plan(p, dtype_code(xt), num_sms(), smem_optin(), (int)(tune & 0xFFFF),
                                         (int)((tune >> 16) & 0xF));
  TORCH_CHECK(smem > 0, "bie_cuda.mbwq_skinny: no plan fits this device (", M, " rows, codes up to ", max_bits,
              " bits)");
  // one scratch allocation: xp (the rows of x in the kernel's order) and, with K splits, the float32 partials and
  // a counter per column block
  const int64_t xp_bytes = ((int64_t)p.nchunks * 32 * 8 * p.nt * 2 + 255) / 256 * 256;
  const int64_t ws_bytes = p.splits > 1 ? (int64_t)p.splits * M * N * 4 : 0;
  const int64_t sem_bytes = p.splits > 1 ? (int64_t)p.colblocks * 4 : 0;
  Tensor scratch = at::empty({xp_bytes + ws_bytes + sem_bytes}, x.options().dtype(at::kByte));
  uint8_t* base = static_cast<uint8_t*>(scratch.data_ptr());
  p.xp = base;
  if (p.splits > 1) {
    p.ws = reinterpret_cast<float*>(base + xp_bytes);
    p.counters = reinterpret_cast<int32_t*>(base + xp_bytes + ws_bytes);
  }
  check_launch(bie::launch_mbwq_skinny(p, dtype_code(xt), smem, stream()), who);
  return out;
}
}  // namespace

TORCH_LIBRARY(bie_cuda, m) {
  m.def("pack_signs", &pack_signs);
  m.def("unpack_signs", &unpack_signs);
  m.def("row_popc", &row_popc);
  m.def("binary_mm", &binary_mm);
  m.def("binary_mm_wgmma", &binary_mm_wgmma);
  m.def("binary_conv2d", &binary_conv2d);
  m.def("sign_embedding", &sign_embedding);
  m.def("sign_embedding_bag", &sign_embedding_bag);
  m.def("wq_mma_gemm", &wq_mma_gemm);
  m.def("wq_skinny_gemm", &wq_skinny_gemm);
  m.def("wq_thin_gemm", &wq_thin_gemm);
  m.def("wq_wgmma_gemm", &wq_wgmma_gemm);
  m.def("wq_dequant", &wq_dequant);
  m.def("wq_dequant_canonical", &wq_dequant_canonical);
  m.def("quantize_int", &quantize_int);
  m.def("transpose_2d", &transpose_2d);
  m.def("dynamic_gemv", &dynamic_gemv);
  m.def("int_gemv", &int_gemv);
  m.def("dynamic_quantize_token", &dynamic_quantize_token);
  m.def("mbwq_gemv", &mbwq_gemv);
  m.def("mbwq_gemm_dense", &mbwq_gemm_dense);
  m.def("mbwq_dequant", &mbwq_dequant);
  m.def("mbwq_skinny", &mbwq_skinny);
}

// The bound inference calls' entry points (see the top of this file): the same functions, the same checks.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("wq_thin_gemm", &wq_thin_gemm);
  m.def("wq_wgmma_gemm", &wq_wgmma_gemm);
  m.def("wq_skinny_gemm", &wq_skinny_gemm);
  m.def("wq_mma_gemm", &wq_mma_gemm);
  m.def("binary_mm", &binary_mm);
  m.def("binary_mm_wgmma", &binary_mm_wgmma);
  m.def("binary_linear_bound", &binary_linear_bound);
  m.def("binary_linear_gemv", &binary_linear_gemv);
  m.def("binary_conv2d", &binary_conv2d);
  m.def("quantize_int", &quantize_int);
  m.def("transpose_2d", &transpose_2d);
  m.def("dynamic_gemv", &dynamic_gemv);
  m.def("int_gemv", &int_gemv);
  m.def("dynamic_quantize_token", &dynamic_quantize_token);
  m.def("mbwq_gemv", &mbwq_gemv);
  m.def("mbwq_gemm_dense", &mbwq_gemm_dense);
  m.def("mbwq_dequant", &mbwq_dequant);
  m.def("mbwq_skinny", &mbwq_skinny);
  m.def("capture_id", &capture_id);
}
