// bie-backend-cutlass, integer family: torch ops under torch.ops.bie_cutlass_integer, and the functions the layers'
// bound inference calls use (integer.py bind_*) as a Python module: a pybind11 call converts its arguments
// directly, where an op call matches them against the schema first.
// Every argument is checked here (TORCH_CHECK raises a Python error); the
// kernels never see a case they cannot serve.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <mutex>
#include <vector>

#include "integer_launch.h"

namespace bie_int {

static int sm_count(int device) {
  static std::mutex mu;
  static std::vector<int> counts;
  std::lock_guard<std::mutex> lock(mu);
  if (device >= static_cast<int>(counts.size())) counts.resize(device + 1, 0);
  if (counts[device] == 0) {
    int v = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, device));
    counts[device] = v;
  }
  return counts[device];
}

static void check_sm90(const at::Tensor& t) {
  static std::mutex mu;
  static std::vector<int> cc;   // per device: 0 unknown, else major * 10 + minor
  const int dev = t.get_device();
  int v = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (dev >= static_cast<int>(cc.size())) cc.resize(dev + 1, 0);
    if (cc[dev] == 0) {
      int major = 0, minor = 0;
      C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
      C10_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
      cc[dev] = major * 10 + minor;
    }
    v = cc[dev];
  }
  TORCH_CHECK(v == 90, "bie_cutlass_integer: the int8 GEMM kernels are built for sm_90 (Hopper); this device is sm_",
              v);
}

static int out_code_of(const c10::optional<at::ScalarType>& dt) {
  if (!dt.has_value()) return 0;
  switch (*dt) {
    case at::kFloat: return 1;
    case at::kBFloat16: return 2;
    case at::kHalf: return 3;
    default: TORCH_CHECK(false, "bie_cutlass_integer.gemm: out dtype must be float32, bfloat16, float16 or None");
  }
  return -1;
}

static void check_vec(const c10::optional<at::Tensor>& v, const char* name, const at::Tensor& a, int64_t n, int64_t l,
                      int64_t batch, bool allow_scalar) {
  if (!v.has_value()) return;
  const at::Tensor& t = *v;
  TORCH_CHECK(t.device() == a.device(), "bie_cutlass_integer.gemm: ", name, " must be on the device of a");
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous(), "bie_cutlass_integer.gemm: ", name,
              " must be a contiguous float32 tensor");
  TORCH_CHECK(batch >= 0, "bie_cutlass_integer.gemm: negative ", name, " batch stride");
  if (allow_scalar && t.numel() == 1) {
    TORCH_CHECK(batch == 0, "bie_cutlass_integer.gemm: a single-value ", name, " needs batch stride 0");
    return;
  }
  TORCH_CHECK(t.numel() >= (l - 1) * batch + n, "bie_cutlass_integer.gemm: ", name, " has ", t.numel(),
              " elements, the problem reads ", (l - 1) * batch + n);
}

// The float epilogue's vectors of p (scale: one value, or per column with a batch stride; bias per column).
static void set_epilogue(GemmArgs& p, const c10::optional<at::Tensor>& scale, int64_t scale_batch,
                         const c10::optional<at::Tensor>& bias, int64_t bias_batch) {
  if (scale.has_value()) {
    p.scale = scale->data_ptr<float>();
    p.scale_vec = scale->numel() > 1;
    p.scale_batch = p.scale_vec ? scale_batch : 0;
  }
  if (bias.has_value()) {
    p.bias = bias->data_ptr<float>();
    p.bias_batch = bias_batch;
  }
}

// The operands of L products of K-contiguous int8 matrices, A (M, K) and B (N, K) each batch after the other, into D
// of row stride ldd (batches M * ldd apart), on device `device` (checked by the caller).
static GemmArgs gemm_operands(const void* a, const void* b, void* d, int64_t M, int64_t N, int64_t K, int64_t L,
                              int64_t ldd, int device) {
  GemmArgs p;
  p.a = static_cast<const int8_t*>(a);
  p.b = static_cast<const int8_t*>(b);
  p.d = d;
  p.m = static_cast<int>(M);
  p.n = static_cast<int>(N);
  p.k = static_cast<int>(K);
  p.l = static_cast<int>(L);
  p.lda = K;
  p.ldb = K;
  p.ldd = ldd;
  p.batch_a = M * K;
  p.batch_b = N * K;
  p.batch_d = M * ldd;
  p.device = device;
  return p;
}

// Launches the GEMM instantiation fn (gemm_fn / dyn_gemm_fn of `config` and output code `code`, for the message) on
// p (operands, output and epilogue set, checked by the caller) on p's device and current stream; the workspace
// CUTLASS asks for is allocated with `opts`.
static void run_gemm(GemmArgs& p, GemmFn fn, int64_t config, int code, const at::TensorOptions& opts,
                     const char* who) {
  p.sm_count = sm_count(p.device);
  p.stream = c10::cuda::getCurrentCUDAStream(p.device).stream();
  TORCH_CHECK(fn != nullptr, who, "no instantiation for config ", config, " out ", code);
  size_t ws = 0;
  std::string err = fn(p, &ws);
  TORCH_CHECK(err.empty(), who, err);
  at::Tensor workspace;
  if (ws > 0) {
    workspace = at::empty({static_cast<int64_t>(ws)}, opts.dtype(at::kByte));
    p.workspace = workspace.data_ptr();
  }
  err = fn(p, nullptr);
  TORCH_CHECK(err.empty(), who, err);
}

// a (L, M, K), b (L, N, K) int8, K % 16 == 0 -> (L, M, n_pad) with columns [0, N) written.
at::Tensor gemm(const at::Tensor& a, const at::Tensor& b, const c10::optional<at::Tensor>& scale,
                int64_t scale_batch, const c10::optional<at::Tensor>& bias, int64_t bias_batch,
                c10::optional<at::ScalarType> out_dtype, int64_t n_pad, int64_t config) {
  TORCH_CHECK(a.is_cuda() && b.is_cuda() && a.device() == b.device(), "bie_cutlass_integer.gemm: a and b must be on one CUDA device");
  TORCH_CHECK(a.scalar_type() == at::kChar && b.scalar_type() == at::kChar, "bie_cutlass_integer.gemm: a and b must be int8");
  TORCH_CHECK(a.dim() == 3 && b.dim() == 3, "bie_cutlass_integer.gemm: a and b must be 3-D (L, M, K) / (L, N, K)");
  TORCH_CHECK(a.is_contiguous() && b.is_contiguous(), "bie_cutlass_integer.gemm: a and b must be contiguous");
  const int64_t L = a.size(0), M = a.size(1), K = a.size(2), N = b.size(1);
  TORCH_CHECK(b.size(0) == L && b.size(2) == K, "bie_cutlass_integer.gemm: shapes ", a.sizes(), " and ", b.sizes(),
              " do not match");
  TORCH_CHECK(L > 0 && M > 0 && N > 0 && K > 0, "bie_cutlass_integer.gemm: empty problem");
  TORCH_CHECK(K % 16 == 0, "bie_cutlass_integer.gemm: K=", K, " must be a multiple of 16 (TMA rows of 16 bytes)");
  TORCH_CHECK(L < INT_MAX && M < INT_MAX && N < INT_MAX && K < INT_MAX, "bie_cutlass_integer.gemm: dimension too large");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(a.data_ptr()) % 16 == 0 && reinterpret_cast<uintptr_t>(b.data_ptr()) % 16 == 0,
              "bie_cutlass_integer.gemm: a and b must be 16-byte aligned");
  TORCH_CHECK(config >= 0 && config < kNumConfigs, "bie_cutlass_integer.gemm: unknown config ", config);
  const int code = out_code_of(out_dtype);
  const int64_t align = (code <= 1) ? 4 : 8;
  TORCH_CHECK(n_pad >= N && n_pad % align == 0, "bie_cutlass_integer.gemm: n_pad=", n_pad, " must be >= N=", N,
              " and a multiple of ", align);
  if (code == 0) {
    TORCH_CHECK(!scale.has_value() && !bias.has_value(), "bie_cutlass_integer.gemm: int32 output takes no scale/bias");
  }
  check_vec(scale, "scale", a, N, L, scale_batch, true);
  check_vec(bias, "bias", a, N, L, bias_batch, false);
  check_sm90(a);
  c10::cuda::CUDAGuard guard(a.device());

  const at::ScalarType odt = code == 0 ? at::kInt : *out_dtype;
  at::Tensor out = at::empty({L, M, n_pad}, a.options().dtype(odt));
  GemmArgs p = gemm_operands(a.data_ptr(), b.data_ptr(), out.data_ptr(), M, N, K, L, n_pad, a.get_device());
  set_epilogue(p, scale, scale_batch, bias, bias_batch);
  run_gemm(p, gemm_fn(static_cast<int>(config), code), config, code, a.options(), "bie_cutlass_integer.gemm: ");
  return out;
}

static int float_code(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return 1;
    case at::kBFloat16: return 2;
    case at::kHalf: return 3;
    default: return 0;
  }
}

at::Tensor quantize(const at::Tensor& x, const at::Tensor& scale, int64_t rows, int64_t bits,
                    const c10::optional<at::Tensor>& shift, c10::optional<at::ScalarType> out_dtype) {
  TORCH_CHECK(x.is_cuda() && scale.device() == x.device(), "bie_cutlass_integer.quantize: x and scale on one CUDA device");
  TORCH_CHECK(x.is_contiguous(), "bie_cutlass_integer.quantize: x must be contiguous");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous(), "bie_cutlass_integer.quantize: scale must be contiguous float32");
  TORCH_CHECK(bits == 4 || bits == 8, "bie_cutlass_integer.quantize: bits must be 4 or 8");
  const int dt = float_code(x.scalar_type());
  TORCH_CHECK(dt != 0, "bie_cutlass_integer.quantize: x must be float32, bfloat16 or float16");
  const int64_t n = x.numel();
  const bool per_row = rows > 1;
  TORCH_CHECK(rows >= 1, "bie_cutlass_integer.quantize: rows must be >= 1");
  TORCH_CHECK(per_row ? scale.numel() == rows && n % rows == 0 : scale.numel() == 1,
              "bie_cutlass_integer.quantize: scale has ", scale.numel(), " elements for rows=", rows);
  const void* sp = nullptr;
  int64_t cols = 1;
  if (shift.has_value()) {
    const at::Tensor& sh = *shift;
    TORCH_CHECK(x.dim() >= 1 && sh.device() == x.device() && sh.scalar_type() == x.scalar_type() && sh.dim() == 1 &&
                    sh.is_contiguous() && sh.numel() == x.size(-1),
                "bie_cutlass_integer.quantize: shift must be a contiguous 1-D tensor of x's dtype with one value "
                "per element of x's last dim");
    sp = sh.data_ptr();
    cols = sh.numel();
  }
  const int out_code = out_dtype.has_value() ? float_code(*out_dtype) : 0;
  TORCH_CHECK(!out_dtype.has_value() || out_code != 0, "bie_cutlass_integer.quantize: out_dtype must be a float dtype");
  c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty(x.sizes(), x.options().dtype(out_dtype.has_value() ? *out_dtype : at::kChar));
  if (n == 0) return out;
  std::string err = launch_quantize(x.data_ptr(), dt, n, scale.data_ptr<float>(), per_row, per_row ? n / rows : 1,
                                    sp, cols, static_cast<int>(bits), out.data_ptr(), out_code,
                                    c10::cuda::getCurrentCUDAStream(x.get_device()).stream());
  TORCH_CHECK(err.empty(), "bie_cutlass_integer.quantize: ", err);
  return out;
}

static bool aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

// (grad_v, grad_scale, grad_shift or empty, codes or empty), the op's outputs; see LsqArgs.
std::vector<at::Tensor> lsq_backward(const at::Tensor& v, const at::Tensor& scale, const at::Tensor& prod, int64_t bits,
                                     const c10::optional<at::Tensor>& shift, const c10::optional<at::Tensor>& factor,
                                     bool rowwise, c10::optional<at::ScalarType> codes_dtype, int64_t row_chunks) {
  const char* me = "bie_cutlass_integer.lsq_backward: ";
  TORCH_CHECK(v.is_cuda() && v.dim() == 2 && v.is_contiguous() && aligned16(v), me, "v must be a contiguous, 16-byte aligned 2-D CUDA tensor");
  TORCH_CHECK(prod.device() == v.device() && prod.sizes() == v.sizes() && prod.is_contiguous() && aligned16(prod), me,
              "prod must be a contiguous, aligned tensor of v's shape on its device");
  const int64_t R = v.size(0), C = v.size(1);
  TORCH_CHECK(C % 8 == 0, me, "the column count must be a multiple of 8");
  TORCH_CHECK(scale.device() == v.device() && scale.scalar_type() == at::kFloat && scale.is_contiguous() &&
                  scale.numel() == (rowwise ? R : 1), me, "scale must be contiguous float32 with ", rowwise ? R : 1, " values");
  LsqArgs a{};
  a.v_code = float_code(v.scalar_type());
  a.prod_code = float_code(prod.scalar_type());
  TORCH_CHECK(a.v_code != 0 && a.prod_code != 0, me, "v and prod must be float32, bfloat16 or float16");
  c10::cuda::CUDAGuard guard(v.device());
  at::Tensor grad_v = at::empty_like(v);
  at::Tensor codes = at::empty({0}, v.options().dtype(at::kFloat));
  if (codes_dtype.has_value()) {
    codes = at::empty(v.sizes(), v.options().dtype(*codes_dtype));
    a.codes_code = float_code(*codes_dtype);
    TORCH_CHECK(a.codes_code != 0, me, "codes_dtype must be a float dtype");
    a.codes = codes.data_ptr();
  }
  if (shift.has_value()) {
    const at::Tensor& sh = *shift;
    TORCH_CHECK(!rowwise && sh.device() == v.device() && sh.scalar_type() == v.scalar_type() && sh.dim() == 1 &&
                    sh.numel() == C && sh.is_contiguous() && aligned16(sh), me,
                "shift must be a contiguous, aligned (C,) tensor of v's dtype (column mode)");
    a.shift = sh.data_ptr();
  }
  if (factor.has_value()) {
    TORCH_CHECK(factor->device() == v.device() && factor->scalar_type() == at::kFloat && factor->numel() == 1, me,
                "factor must be one float32 value on v's device");
    a.factor = factor->data_ptr<float>();
  }
  TORCH_CHECK(bits == 4 || bits == 8, me, "bits must be 4 or 8");
  TORCH_CHECK(rowwise || (row_chunks >= 1 && row_chunks <= 65535), me, "row_chunks must be in [1, 65535]");
  at::Tensor grad_scale, grad_shift = at::empty({0}, v.options().dtype(at::kFloat)), part_ds, part_shift;
  a.v = v.data_ptr();
  a.prod = prod.data_ptr();
  a.scale = scale.data_ptr<float>();
  a.grad_v = grad_v.data_ptr();
  a.rows = R;
  a.cols = C;
  a.bits = static_cast<int>(bits);
  a.rowwise = rowwise;
  const int64_t hi = (1LL << (bits - 1)) - 1;
  const int64_t n = rowwise ? C : R * C;
  a.denom = static_cast<float>(std::sqrt(static_cast<double>(std::max<int64_t>(n, 1) * hi)));
  if (rowwise) {
    grad_scale = at::empty({R}, v.options().dtype(at::kFloat));
  } else {
    const int64_t col_blocks = (C + 1023) / 1024;
    grad_scale = at::empty({}, v.options().dtype(at::kFloat));
    part_ds = at::empty({row_chunks * col_blocks}, v.options().dtype(at::kFloat));
    a.part_ds = part_ds.data_ptr<float>();
    a.row_chunks = static_cast<int>(row_chunks);
    if (a.shift != nullptr) {
      part_shift = at::empty({row_chunks, C}, v.options().dtype(at::kFloat));
      a.part_shift = part_shift.data_ptr<float>();
      grad_shift = at::empty({C}, v.options().dtype(at::kFloat));
      a.grad_shift = grad_shift.data_ptr<float>();
    }
  }
  a.grad_scale = grad_scale.data_ptr<float>();
  if (R > 0) {
    std::string err = launch_lsq_backward(a, c10::cuda::getCurrentCUDAStream(v.get_device()).stream());
    TORCH_CHECK(err.empty(), me, err);
  } else {
    grad_scale.zero_();
    grad_shift.zero_();
  }
  return {grad_v, grad_scale, grad_shift, codes};
}

at::Tensor im2col(const at::Tensor& x, int64_t groups, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph,
                  int64_t pw, int64_t dh, int64_t dw, int64_t ho, int64_t wo, int64_t kgp) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kChar && x.dim() == 4 && x.is_contiguous(),
              "bie_cutlass_integer.im2col: x must be a contiguous 4-D int8 CUDA tensor (N, H, W, C)");
  const int64_t N = x.size(0), H = x.size(1), W = x.size(2), C = x.size(3);
  TORCH_CHECK(groups >= 1 && C % groups == 0, "bie_cutlass_integer.im2col: groups must divide C");
  TORCH_CHECK(kh >= 1 && kw >= 1 && sh >= 1 && sw >= 1 && dh >= 1 && dw >= 1 && ph >= 0 && pw >= 0,
              "bie_cutlass_integer.im2col: bad geometry");
  TORCH_CHECK(ho >= 1 && wo >= 1 && (ho - 1) * sh + (kh - 1) * dh < H + 2 * ph && (wo - 1) * sw + (kw - 1) * dw < W + 2 * pw,
              "bie_cutlass_integer.im2col: output size does not match the geometry");
  TORCH_CHECK(kgp >= (C / groups) * kh * kw, "bie_cutlass_integer.im2col: kgp too small");
  // a pointwise conv (1x1, stride 1, no padding, one group) of unpadded channels: the NHWC codes are the patch
  // matrix already, a view (a copy would read and write the whole activation once more)
  if (groups == 1 && kh == 1 && kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0 && kgp == C)
    return x.view({1, N * H * W, C});
  c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty({groups, N * ho * wo, kgp}, x.options());
  std::string err = launch_im2col(static_cast<const int8_t*>(x.data_ptr()), static_cast<int8_t*>(out.data_ptr()), N, C,
                                  H, W, groups, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo, kgp,
                                  c10::cuda::getCurrentCUDAStream(x.get_device()).stream());
  TORCH_CHECK(err.empty(), "bie_cutlass_integer.im2col: ", err);
  return out;
}

// ------------------------------------------------------------------ bound inference calls
// Codes for the GEMM's A operand: x's quantization (act_scale given: one float32 value, shift: x's dtype, one value
// per element of x's last dim) or x itself (int8 codes), as a contiguous tensor of x's shape.
static at::Tensor codes_of(const at::Tensor& x, const c10::optional<at::Tensor>& act_scale, int64_t act_bits,
                           const c10::optional<at::Tensor>& shift, const char* who) {
  if (act_scale.has_value()) {
    TORCH_CHECK(act_scale->numel() == 1, who, "act_scale must be one value");
    return quantize(x.is_contiguous() ? x : x.contiguous(), *act_scale, 1, act_bits, shift, c10::nullopt);
  }
  TORCH_CHECK(x.scalar_type() == at::kChar, who, "without act_scale, x must be int8 codes");
  TORCH_CHECK(!shift.has_value(), who, "a shift needs act_scale");
  return x.is_contiguous() ? x : x.contiguous();
}

// The integer linear of one bound call: a (..., K) int8 codes (act_scale None), or float activations quantized
// first (quantize_int(a, act_scale, act_bits, shift), the same kernel as the quantize op); then the GEMM against
// the prepared weight b (1, Np, Kp) (rows and K zero padded, Np % 8 == 0, Kp % 16 == 0) with the epilogue
// vectors scale / bias as gemm takes them (padded to Np); returns (..., n) contiguous. A model's activations
// (batch, tokens, K) are taken as they are, and the output is made in its final shape: every view of a tensor is
// an ATen call of its own (a reshape in Python before and after the call cost a few microseconds of host time on
// every call, and the views around gemm's (1, M, Np) output a microsecond or two more).
at::Tensor linear(const at::Tensor& a, const c10::optional<at::Tensor>& act_scale, int64_t act_bits,
                  const c10::optional<at::Tensor>& shift, const at::Tensor& b, const c10::optional<at::Tensor>& scale,
                  const c10::optional<at::Tensor>& bias, c10::optional<at::ScalarType> out_dtype, int64_t n,
                  int64_t config) {
  const char* who = "bie_cutlass_integer.linear: ";
  TORCH_CHECK(a.is_cuda() && a.dim() >= 1, who, "a must be a CUDA tensor of at least one dim, got ", a.sizes());
  TORCH_CHECK(b.dim() == 3 && b.size(0) == 1 && b.size(1) >= n && n > 0, who, "b must be the prepared (1, Np, Kp) weight "
              "with Np >= n=", n, ", got ", b.sizes());
  TORCH_CHECK(b.device() == a.device() && b.scalar_type() == at::kChar && b.is_contiguous() && aligned16(b), who,
              "b must be a contiguous 16-byte aligned int8 tensor on a's device");
  const int64_t K = a.size(-1), Np = b.size(1), Kp = b.size(2);
  const int64_t M = K > 0 ? a.numel() / K : 0;
  TORCH_CHECK(M > 0 && K > 0 && K <= Kp && Kp - K < 16 && Kp % 16 == 0, who, "a ", a.sizes(),
              " does not fit the weight's K=", Kp);
  TORCH_CHECK(M < INT_MAX && Np < INT_MAX && Kp < INT_MAX, who, "dimension too large");
  TORCH_CHECK(config >= 0 && config < kNumConfigs, who, "unknown config ", config);
  const int code = out_code_of(out_dtype);
  const int64_t align = (code <= 1) ? 4 : 8;
  TORCH_CHECK(Np % align == 0, who, "the weight's padded rows Np=", Np, " must be a multiple of ", align);
  if (code == 0) {
    TORCH_CHECK(!scale.has_value() && !bias.has_value(), who, "int32 output takes no scale/bias");
  }
  check_vec(scale, "scale", a, Np, 1, 0, true);
  check_vec(bias, "bias", a, Np, 1, 0, false);
  check_sm90(a);
  c10::cuda::CUDAGuard guard(a.device());
  at::Tensor codes = codes_of(a, act_scale, act_bits, shift, who);   // contiguous, a's shape
  if (K != Kp || !aligned16(codes)) {   // K padded with zero codes (TMA moves 16-byte rows)
    at::Tensor padded = at::zeros({M, Kp}, codes.options());
    padded.narrow(1, 0, K).copy_(codes.view({M, K}));
    codes = padded;
  }
  std::vector<int64_t> shape(a.sizes().begin(), a.sizes().end() - 1);
  shape.push_back(Np);
  at::Tensor out = at::empty(shape, a.options().dtype(code == 0 ? at::kInt : *out_dtype));
  GemmArgs p = gemm_operands(codes.data_ptr(), b.data_ptr(), out.data_ptr(), M, Np, Kp, 1, Np, a.get_device());
  set_epilogue(p, scale, 0, bias, 0);
  run_gemm(p, gemm_fn(static_cast<int>(config), code), config, code, a.options(), who);
  return Np == n ? out : out.narrow(-1, 0, n).contiguous();
}

// The epilogue's broadcast nodes may load their vectors 16 bytes at a time: a vector starting elsewhere is copied
// (a fresh allocation is aligned).
static at::Tensor aligned_vector(const at::Tensor& t) { return aligned16(t) ? t : t.clone(); }

// dynamic_int8_linear (per_token_symmetric) after the activation quantization: codes (M, K) int8, row_scale (M)
// float32 (the per-token scales), b the prepared (1, Np, Kp) weight codes (integer.py prepare_gemm's layout, Np % 8
// == 0, Kp % 16 == 0, K <= Kp < K + 16), scale float32 with 1 or Np values (zero padded), bias None or Np float32
// values; out_dtype float32 / bfloat16 / float16. Returns (M, n): float(acc) * (row_scale[m] * scale[n]) + bias[n],
// each operation rounded once (integer_dyn_gemm_sm90.cuh).
at::Tensor dyn_linear(const at::Tensor& codes, const at::Tensor& row_scale_in, const at::Tensor& b,
                      const at::Tensor& scale_in, const c10::optional<at::Tensor>& bias_in, at::ScalarType out_dtype,
                      int64_t n, int64_t config) {
  const char* who = "bie_cutlass_integer.dyn_linear: ";
  TORCH_CHECK(codes.is_cuda() && codes.dim() == 2 && codes.scalar_type() == at::kChar, who,
              "codes must be a 2-D int8 CUDA tensor, got ", codes.sizes(), " ", codes.scalar_type());
  TORCH_CHECK(b.dim() == 3 && b.size(0) == 1 && b.scalar_type() == at::kChar && b.is_contiguous() && aligned16(b) &&
                  b.size(1) >= n && b.size(1) % 8 == 0 && b.size(2) % 16 == 0 && n > 0,
              who, "b must be the prepared contiguous (1, Np, Kp) int8 weight with Np >= n=", n, ", got ", b.sizes());
  TORCH_CHECK(b.device() == codes.device() && row_scale_in.device() == codes.device() &&
                  scale_in.device() == codes.device(),
              who, "tensors on different devices");
  const int64_t M = codes.size(0), K = codes.size(1), Np = b.size(1), Kp = b.size(2);
  TORCH_CHECK(M > 0 && M < INT_MAX && K > 0 && K <= Kp && Kp - K < 16 && Kp < INT_MAX, who, "codes ", codes.sizes(),
              " do not fit the weight's K=", Kp);
  TORCH_CHECK(row_scale_in.scalar_type() == at::kFloat && row_scale_in.is_contiguous() && row_scale_in.numel() == M,
              who, "row_scale must be ", M, " contiguous float32 values");
  TORCH_CHECK(scale_in.scalar_type() == at::kFloat && scale_in.is_contiguous() &&
                  (scale_in.numel() == 1 || scale_in.numel() >= Np),
              who, "scale must be contiguous float32 with 1 or ", Np, " values");
  if (bias_in.has_value()) {
    TORCH_CHECK(bias_in->device() == codes.device() && bias_in->scalar_type() == at::kFloat &&
                    bias_in->is_contiguous() && bias_in->numel() >= Np,
                who, "bias must be contiguous float32 with ", Np, " values");
  }
  const int code = out_code_of(out_dtype);
  TORCH_CHECK(code >= 1, who, "out_dtype must be float32, bfloat16 or float16");
  TORCH_CHECK(config >= 0 && config < kNumConfigs, who, "unknown config ", config);
  check_sm90(codes);
  const at::Tensor row_scale = aligned_vector(row_scale_in), scale = aligned_vector(scale_in);
  c10::optional<at::Tensor> bias;
  if (bias_in.has_value()) bias = aligned_vector(*bias_in);
  c10::cuda::CUDAGuard guard(codes.device());
  at::Tensor a = codes;
  if (K != Kp || !a.is_contiguous() || !aligned16(a)) {   // K padded with zero codes (TMA moves 16-byte rows)
    a = at::zeros({M, Kp}, codes.options());
    a.narrow(1, 0, K).copy_(codes);
  }
  at::Tensor out = at::empty({M, Np}, codes.options().dtype(out_dtype));
  GemmArgs p = gemm_operands(a.data_ptr(), b.data_ptr(), out.data_ptr(), M, Np, Kp, 1, Np, codes.get_device());
  p.row_scale = row_scale.data_ptr<float>();
  set_epilogue(p, scale, 0, bias, 0);
  run_gemm(p, dyn_gemm_fn(static_cast<int>(config), code), config, code, codes.options(), who);
  return Np == n ? out : out.narrow(1, 0, n).contiguous();
}

// ------------------------------------------------------------------ implicit-GEMM convolution
// Whether the implicit-GEMM conv (integer_conv_sm90.cuh) takes these operands: codes (N, H, W, C) int8 with C a
// multiple of 16, channels contiguous, the other strides multiples of 16 (TMA's 16-byte units) and a 16-byte aligned
// start; w the prepared (1, Np, Kp) weight whose K is exactly kh * kw * C (no K padding: KRSC rows).
static bool iconv_fits(const at::Tensor& codes, const at::Tensor& w, int64_t kh, int64_t kw) {
  if (codes.dim() != 4 || codes.scalar_type() != at::kChar || w.dim() != 3 || w.size(0) != 1) return false;
  const int64_t C = codes.size(3);
  if (C % 16 != 0 || C == 0 || codes.stride(3) != 1 || !aligned16(codes)) return false;
  for (int i = 0; i < 3; ++i)
    if (codes.stride(i) % 16 != 0) return false;
  return w.scalar_type() == at::kChar && w.is_contiguous() && aligned16(w) && w.size(2) == kh * kw * C &&
         w.size(1) % 8 == 0 && codes.numel() < INT_MAX;
}

// The implicit-GEMM conv of fitting operands (iconv_fits) into a new (N, Ho, Wo, Np) tensor; nullopt when CUTLASS
// cannot implement the geometry (its TMA im2col limits on padding and filter extent), nothing launched then.
// scale / bias: float32 with 1 (scale only) or >= Np values, as gemm takes them; out_dtype None: int32 counts.
static c10::optional<at::Tensor> iconv_try(const at::Tensor& codes, const at::Tensor& w, int64_t kh, int64_t kw,
                                           int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw,
                                           const c10::optional<at::Tensor>& scale_in,
                                           const c10::optional<at::Tensor>& bias_in,
                                           c10::optional<at::ScalarType> out_dtype, int64_t config, const char* who) {
  const int64_t N = codes.size(0), H = codes.size(1), W = codes.size(2), C = codes.size(3), Np = w.size(1);
  const int64_t ho = (H + 2 * ph - dh * (kh - 1) - 1) / sh + 1, wo = (W + 2 * pw - dw * (kw - 1) - 1) / sw + 1;
  TORCH_CHECK(ho > 0 && wo > 0 && N * ho * wo < INT_MAX && N * ho * wo * Np < (int64_t(1) << 40), who,
              "output size out of range");
  TORCH_CHECK(config >= 0 && config < kNumConvConfigs, who, "unknown conv config ", config);
  const int code = out_code_of(out_dtype);
  if (code == 0) {
    TORCH_CHECK(!scale_in.has_value() && !bias_in.has_value(), who, "int32 output takes no scale/bias");
  }
  check_vec(scale_in, "scale", codes, Np, 1, 0, true);
  check_vec(bias_in, "bias", codes, Np, 1, 0, false);
  check_sm90(codes);
  c10::optional<at::Tensor> scale, bias;
  if (scale_in.has_value()) scale = aligned_vector(*scale_in);
  if (bias_in.has_value()) bias = aligned_vector(*bias_in);
  ConvArgs p;
  p.x = static_cast<const int8_t*>(codes.data_ptr());
  p.wt = static_cast<const int8_t*>(w.data_ptr());
  p.n = static_cast<int>(N);
  p.h = static_cast<int>(H);
  p.w = static_cast<int>(W);
  p.c = static_cast<int>(C);
  p.k = static_cast<int>(Np);
  p.r = static_cast<int>(kh);
  p.s = static_cast<int>(kw);
  p.x_stride_n = codes.stride(0);
  p.x_stride_h = codes.stride(1);
  p.x_stride_w = codes.stride(2);
  p.pad_h = static_cast<int>(ph);
  p.pad_w = static_cast<int>(pw);
  p.stride_h = static_cast<int>(sh);
  p.stride_w = static_cast<int>(sw);
  p.dil_h = static_cast<int>(dh);
  p.dil_w = static_cast<int>(dw);
  if (scale.has_value()) {
    p.scale = scale->data_ptr<float>();
    p.scale_vec = scale->numel() > 1;
  }
  if (bias.has_value()) p.bias = bias->data_ptr<float>();
  p.device = codes.get_device();
  p.stream = c10::cuda::getCurrentCUDAStream(p.device).stream();
  ConvFn fn = conv_fn(static_cast<int>(config), code);
  TORCH_CHECK(fn != nullptr, who, "no conv instantiation for config ", config, " out ", code);
  // TMA's im2col mode traverses with element strides of 1 to 8 (a tensor-map limit can_implement does not ask)
  if (sh > 8 || sw > 8) return c10::nullopt;
  if (!fn(p, 0, nullptr).empty()) return c10::nullopt;
  const at::ScalarType odt = code == 0 ? at::kInt : *out_dtype;
  at::Tensor out = at::empty({N, ho, wo, Np}, codes.options().dtype(odt));
  p.d = out.data_ptr();
  size_t ws = 0;
  std::string err = fn(p, 1, &ws);
  TORCH_CHECK(err.empty(), who, err);
  at::Tensor workspace;
  if (ws > 0) {
    workspace = at::empty({static_cast<int64_t>(ws)}, codes.options().dtype(at::kByte));
    p.workspace = workspace.data_ptr();
  }
  err = fn(p, 2, nullptr);
  TORCH_CHECK(err.empty(), who, err);
  return out;
}

// The op: x (N, H, W, C) int8 codes (channels contiguous), w the prepared (1, Np, Kp) weight with Kp = kh * kw * C;
// returns the (N, Ho, Wo, Np) output. Raises where the implicit GEMM does not serve (iconv_fits, or a geometry CUTLASS
// cannot implement): integer.py then runs the im2col path.
at::Tensor iconv(const at::Tensor& x, const at::Tensor& w, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                 int64_t ph, int64_t pw, int64_t dh, int64_t dw, const c10::optional<at::Tensor>& scale,
                 const c10::optional<at::Tensor>& bias, c10::optional<at::ScalarType> out_dtype, int64_t config) {
  const char* who = "bie_cutlass_integer.iconv: ";
  TORCH_CHECK(x.is_cuda() && w.is_cuda() && x.device() == w.device(), who, "x and w must be on one CUDA device");
  TORCH_CHECK(kh >= 1 && kw >= 1 && sh >= 1 && sw >= 1 && dh >= 1 && dw >= 1 && ph >= 0 && pw >= 0 && kh < 65536 &&
                  kw < 65536 && sh < 65536 && sw < 65536 && dh < 65536 && dw < 65536 && ph < 65536 && pw < 65536,
              who, "bad geometry");
  TORCH_CHECK(x.dim() == 4 && x.size(0) > 0 && x.size(1) > 0 && x.size(2) > 0 && x.size(1) < INT_MAX &&
                  x.size(2) < INT_MAX,
              who, "x must be non-empty (N, H, W, C), got ", x.sizes());
  TORCH_CHECK(iconv_fits(x, w, kh, kw), who, "operands the implicit GEMM does not take: x ", x.sizes(), " strides ",
              x.strides(), ", w ", w.sizes(), " (C a multiple of 16, 16-byte rows, w's K = kh * kw * C)");
  c10::cuda::CUDAGuard guard(x.device());
  c10::optional<at::Tensor> out = iconv_try(x, w, kh, kw, sh, sw, ph, pw, dh, dw, scale, bias, out_dtype, config, who);
  TORCH_CHECK(out.has_value(), who, "CUTLASS cannot implement this geometry");
  return *out;
}

// The integer conv of one bound call: x (N, C, H, W) int8 codes (act_scale None), or float activations quantized
// first with the channel shift (C values of x's dtype, added in x's dtype as the layer's x + shift does); read as
// NHWC (free for a channels_last x); with conv_config >= 0 (an index into the conv configurations) the implicit
// GEMM where it serves (one group, iconv_fits, a geometry CUTLASS implements), else an int8 im2col and the GEMM
// (config) batched over groups against the prepared weight w (G, Np, Kp) (integer.py prepare_conv), epilogue
// vectors as gemm takes them; returns (N, O, Ho, Wo) in the op's memory format: channels_last for a channels_last
// x (as cuDNN's conv; the NHWC results as they are), else contiguous NCHW.
at::Tensor conv(const at::Tensor& x, const c10::optional<at::Tensor>& act_scale, int64_t act_bits,
                const c10::optional<at::Tensor>& channel_shift, const at::Tensor& w, int64_t o, int64_t kh, int64_t kw,
                int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw,
                const c10::optional<at::Tensor>& scale, int64_t scale_batch, const c10::optional<at::Tensor>& bias,
                int64_t bias_batch, c10::optional<at::ScalarType> out_dtype, int64_t config, int64_t conv_config) {
  const char* who = "bie_cutlass_integer.conv: ";
  TORCH_CHECK(x.is_cuda() && x.dim() == 4, who, "x must be a 4-D CUDA tensor, got ", x.sizes());
  TORCH_CHECK(w.dim() == 3 && w.size(0) >= 1 && o > 0 && o % w.size(0) == 0 && w.size(1) >= o / w.size(0), who,
              "w must be the prepared (G, Np, Kp) weight for ", o, " output channels, got ", w.sizes());
  TORCH_CHECK(kh >= 1 && kw >= 1 && sh >= 1 && sw >= 1 && dh >= 1 && dw >= 1 && ph >= 0 && pw >= 0, who,
              "bad geometry");
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3), G = w.size(0), og = o / G;
  const int64_t ho = (H + 2 * ph - dh * (kh - 1) - 1) / sh + 1, wo = (W + 2 * pw - dw * (kw - 1) - 1) / sw + 1;
  TORCH_CHECK(N > 0 && ho > 0 && wo > 0 && C % G == 0, who, "x ", x.sizes(), " does not fit the geometry");
  c10::cuda::CUDAGuard guard(x.device());
  const bool cl = x.is_contiguous(at::MemoryFormat::ChannelsLast) && !x.is_contiguous();
  const auto out_format = cl ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  const at::Tensor nhwc = x.permute({0, 2, 3, 1});
  at::Tensor codes = codes_of(nhwc, act_scale, act_bits, channel_shift, who);
  if (conv_config >= 0 && G == 1 && iconv_fits(codes, w, kh, kw)) {   // the implicit GEMM: no patch matrix
    c10::optional<at::Tensor> d = iconv_try(codes, w, kh, kw, sh, sw, ph, pw, dh, dw, scale, bias, out_dtype,
                                            conv_config, who);
    if (d.has_value()) {
      // (N, Ho, Wo, Np): for channels_last a copy only to drop padded channels
      const at::Tensor y = (d->size(3) == o ? *d : d->narrow(3, 0, o)).permute({0, 3, 1, 2});
      return y.contiguous(out_format);
    }
  }
  at::Tensor cols = im2col(codes, G, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo, w.size(2));
  at::Tensor d = gemm(cols, w, scale, scale_batch, bias, bias_batch, out_dtype, w.size(1), config);   // (G, N*Ho*Wo, Np)
  if (d.size(2) != og) d = d.narrow(2, 0, og);
  // (G, N*Ho*Wo, og) -> (N, Ho, Wo, G, og) -> NCHW view of the channels (g, og); one group and channels_last: no copy
  return d.reshape({G, N, ho, wo, og}).permute({1, 2, 3, 0, 4}).reshape({N, ho, wo, o}).permute({0, 3, 1, 2})
      .contiguous(out_format);
}

}  // namespace bie_int

TORCH_LIBRARY(bie_cutlass_integer, m) {
  m.def("gemm(Tensor a, Tensor b, Tensor? scale, int scale_batch, Tensor? bias, int bias_batch, "
        "ScalarType? out_dtype, int n_pad, int config) -> Tensor");
  m.def("quantize(Tensor x, Tensor scale, int rows, int bits, Tensor? shift, ScalarType? out_dtype) -> Tensor");
  m.def("lsq_backward(Tensor v, Tensor scale, Tensor prod, int bits, Tensor? shift, Tensor? factor, bool rowwise, "
        "ScalarType? codes_dtype, int row_chunks) -> Tensor[]");
  m.def("im2col(Tensor x, int groups, int kh, int kw, int sh, int sw, int ph, int pw, int dh, int dw, int ho, "
        "int wo, int kgp) -> Tensor");
  m.def("dyn_linear(Tensor codes, Tensor row_scale, Tensor b, Tensor scale, Tensor? bias, ScalarType out_dtype, "
        "int n, int config) -> Tensor");
  m.def("iconv(Tensor x, Tensor w, int kh, int kw, int sh, int sw, int ph, int pw, int dh, int dw, Tensor? scale, "
        "Tensor? bias, ScalarType? out_dtype, int config) -> Tensor");
}

TORCH_LIBRARY_IMPL(bie_cutlass_integer, CUDA, m) {
  m.impl("gemm", &bie_int::gemm);
  m.impl("quantize", &bie_int::quantize);
  m.impl("lsq_backward", &bie_int::lsq_backward);
  m.impl("im2col", &bie_int::im2col);
  m.impl("dyn_linear", &bie_int::dyn_linear);
  m.impl("iconv", &bie_int::iconv);
}

// The bound inference calls' entry points: the same functions as the ops, the same checks (every argument passed).
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gemm", &bie_int::gemm);
  m.def("quantize", &bie_int::quantize);
  m.def("linear", &bie_int::linear);
  m.def("conv", &bie_int::conv);
  m.def("dyn_linear", &bie_int::dyn_linear);
  m.def("iconv", &bie_int::iconv);
}
