// bie-backend-cutlass, weight-only family: torch ops under torch.ops.bie_cutlass_weight_only, and the GEMM as a
// Python module function for the layers' bound inference calls (weight_only.py): a pybind11 call converts its
// arguments directly, where an op call matches them against the schema first.
// Every argument is checked here (TORCH_CHECK raises a Python error); the kernels never
// see a case they cannot serve.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <algorithm>
#include <climits>
#include <mutex>
#include <vector>

#include "wq_launch.h"

namespace bie_wq {

// The K tile of the configurations: 64 16-bit values (one 128-byte swizzled row of x), 128 for the
// stream-K ones (configs 3 to 7); group sizes must be K or a multiple of it.
constexpr int64_t kTileK = 64;
static int64_t tile_k(int64_t config) { return config >= 3 ? 128 : 64; }

static int device_attr(int device, cudaDeviceAttr attr, std::vector<int>& cache, std::mutex& mu) {
  std::lock_guard<std::mutex> lock(mu);
  if (device >= static_cast<int>(cache.size())) cache.resize(device + 1, -1);
  if (cache[device] < 0) {
    int v = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&v, attr, device));
    cache[device] = v;
  }
  return cache[device];
}

static int sm_count(int device) {
  static std::mutex mu;
  static std::vector<int> cache;
  return device_attr(device, cudaDevAttrMultiProcessorCount, cache, mu);
}

static void check_sm90(int device) {
  static std::mutex mu1, mu2;
  static std::vector<int> major, minor;
  const int v = device_attr(device, cudaDevAttrComputeCapabilityMajor, major, mu1) * 10 +
                device_attr(device, cudaDevAttrComputeCapabilityMinor, minor, mu2);
  TORCH_CHECK(v == 90, "bie_cutlass_weight_only: the mixed-input GEMM kernels are built for sm_90 (Hopper); this "
              "device is sm_", v);
}

static bool aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

// qa: the reordered codes (uint8, n_out * k * bits / 8 bytes); x (tokens, k) float16/bfloat16 with unit
// column stride, or contiguous (..., k) of any rank (a model's (batch, tokens, k) activations: their rows are
// viewed here, where a view and a reshape back in Python cost about 3 µs of a bound call's host time);
// scale, zero (G, n_out) contiguous in x's dtype; bias float32 (n_out) or None.
// Returns y (..., n_out), contiguous, in x's dtype and leading shape.
at::Tensor gemm(const at::Tensor& qa, const at::Tensor& x, const at::Tensor& scale, const at::Tensor& zero,
                const c10::optional<at::Tensor>& bias, int64_t bits, int64_t n_out, int64_t group_size,
                int64_t config, int64_t splits) {
  const char* op = "bie_cutlass_weight_only.gemm: ";
  TORCH_CHECK(x.is_cuda() && qa.device() == x.device() && scale.device() == x.device() &&
                  zero.device() == x.device(), op, "every tensor must be on x's CUDA device");
  TORCH_CHECK(x.dim() >= 2 && (x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16), op,
              "x must be a float16 or bfloat16 tensor of at least 2 dimensions");
  TORCH_CHECK(x.dim() == 2 || x.is_contiguous(), op, "x of more than 2 dimensions must be contiguous, got strides ",
              x.strides());
  TORCH_CHECK(bits == 4 || bits == 8, op, "bits must be 4 or 8, got ", bits);
  const int64_t k = x.size(-1), tokens = x.numel() / std::max<int64_t>(k, 1);
  TORCH_CHECK(tokens > 0 && tokens < INT_MAX, op, "x must have between 1 and 2^31-1 rows, got ", tokens);
  TORCH_CHECK(k > 0 && k % kTileK == 0, op, "K=", k, " must be a positive multiple of ", kTileK);
  TORCH_CHECK(n_out > 0 && n_out % 16 == 0, op, "N=", n_out, " must be a positive multiple of 16");
  TORCH_CHECK(n_out * k < INT_MAX, op, "N*K=", n_out * k, " is too large for one weight (max 2^31-1 codes)");
  const int64_t ldx = x.dim() == 2 ? x.stride(0) : k;
  TORCH_CHECK(x.stride(-1) == 1 && ldx >= k && ldx % 8 == 0 && aligned16(x), op,
              "x needs unit column stride, a row stride that is a multiple of 8 and 16-byte alignment");
  TORCH_CHECK(qa.scalar_type() == at::kByte && qa.is_contiguous() && aligned16(qa) &&
                  qa.numel() == n_out * k * bits / 8,
              op, "qa must be the contiguous uint8 reordered codes of ", n_out * k * bits / 8, " bytes");
  TORCH_CHECK(config >= 0 && config < kNumConfigs, op, "unknown config ", config);
  TORCH_CHECK(splits >= 1 && splits <= 64 && (splits == 1 || config >= 3), op, "splits=", splits,
              " must be 1, or 2..64 with a stream-K configuration (3 to 7)");
  TORCH_CHECK(group_size == k || (group_size > 0 && group_size % tile_k(config) == 0), op, "group_size=",
              group_size, " must be K or a multiple of ", tile_k(config), " (the K tile of config ", config, ")");
  const int64_t g = (k + group_size - 1) / group_size;
  for (const at::Tensor* t : {&scale, &zero}) {
    TORCH_CHECK(t->scalar_type() == x.scalar_type() && t->is_contiguous() && t->dim() == 2 && t->size(0) == g &&
                    t->size(1) == n_out && aligned16(*t),
                op, "scale and zero must be contiguous (", g, ", ", n_out, ") tensors of x's dtype");
  }
  if (bias.has_value()) {
    TORCH_CHECK(bias->device() == x.device() && bias->scalar_type() == at::kFloat && bias->is_contiguous() &&
                    bias->numel() == n_out && aligned16(*bias),
                op, "bias must be a contiguous float32 tensor of ", n_out, " values");
  }
  const int device = x.get_device();
  check_sm90(device);
  c10::cuda::CUDAGuard guard(x.device());

  std::vector<int64_t> out_shape = x.sizes().vec();
  out_shape.back() = n_out;
  at::Tensor out = at::empty(out_shape, x.options());
  WqArgs p;
  p.a = qa.data_ptr();
  p.x = x.data_ptr();
  p.scale = scale.data_ptr();
  p.zero = zero.data_ptr();
  p.bias = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  p.d = out.data_ptr();
  p.n_out = static_cast<int>(n_out);
  p.tokens = static_cast<int>(tokens);
  p.k = static_cast<int>(k);
  p.group_size = static_cast<int>(group_size);
  p.ldx = ldx;
  p.device = device;
  p.sm_count = sm_count(device);
  p.stream = c10::cuda::getCurrentCUDAStream(device).stream();
  if (splits > 1) {  // split-K into `splits` even parts instead of the stream-K heuristic
    p.splits = static_cast<int>(splits);
    p.decomposition = 2;
  }
  WqFn fn = wq_fn(static_cast<int>(config), bits == 4 ? 0 : 1, x.scalar_type() == at::kHalf ? 0 : 1);
  TORCH_CHECK(fn != nullptr, op, "no instantiation for config ", config);
  size_t ws = 0;
  std::string err = fn(p, &ws);
  TORCH_CHECK(err.empty(), op, err);
  at::Tensor workspace;
  if (ws > 0) {
    workspace = at::empty({static_cast<int64_t>(ws)}, x.options().dtype(at::kByte));
    p.workspace = workspace.data_ptr();
  }
  err = fn(p, nullptr);
  TORCH_CHECK(err.empty(), op, err);
  return out;
}

// codes (n_out, k) int8, signed codes of `bits` bits -> the GEMM's reordered layout (uint8).
at::Tensor reorder(const at::Tensor& codes, int64_t bits) {
  const char* op = "bie_cutlass_weight_only.reorder: ";
  TORCH_CHECK(codes.is_cuda() && codes.scalar_type() == at::kChar && codes.dim() == 2 && codes.is_contiguous(), op,
              "codes must be a contiguous 2-D int8 CUDA tensor (N, K)");
  TORCH_CHECK(bits == 4 || bits == 8, op, "bits must be 4 or 8, got ", bits);
  const int64_t n_out = codes.size(0), k = codes.size(1);
  TORCH_CHECK(n_out > 0 && n_out % 16 == 0 && k > 0 && k % 16 == 0, op, "N=", n_out, " and K=", k,
              " must be positive multiples of 16 (the layout's atoms)");
  TORCH_CHECK(n_out * k < INT_MAX, op, "N*K=", n_out * k, " is too large (max 2^31-1 codes)");
  c10::cuda::CUDAGuard guard(codes.device());
  at::Tensor out = at::empty({n_out * k * bits / 8}, codes.options().dtype(at::kByte));
  std::string err = launch_reorder(static_cast<const int8_t*>(codes.data_ptr()), out.data_ptr(),
                                   static_cast<int>(n_out), static_cast<int>(k), static_cast<int>(bits),
                                   c10::cuda::getCurrentCUDAStream(codes.get_device()).stream());
  TORCH_CHECK(err.empty(), op, err);
  return out;
}

}  // namespace bie_wq

TORCH_LIBRARY(bie_cutlass_weight_only, m) {
  m.def("gemm(Tensor qa, Tensor x, Tensor scale, Tensor zero, Tensor? bias, int bits, int n_out, int group_size, "
        "int config, int splits=1) -> Tensor");
  m.def("reorder(Tensor codes, int bits) -> Tensor");
}

TORCH_LIBRARY_IMPL(bie_cutlass_weight_only, CUDA, m) {
  m.impl("gemm", &bie_wq::gemm);
  m.impl("reorder", &bie_wq::reorder);
}

// The bound inference calls' entry point: the same function as the op, the same checks (every argument passed).
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gemm", &bie_wq::gemm);
}
