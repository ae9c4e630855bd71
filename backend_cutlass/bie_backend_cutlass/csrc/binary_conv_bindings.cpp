// bie-backend-cutlass, binary_conv family: torch.ops.bie_cutlass_binary_conv.conv (packing, then the conv) and
// conv_signs (the conv of an operand made elsewhere), and the same functions as a Python module for the layers'
// bound inference calls (binary_conv.py bind). Every argument is checked here
// (TORCH_CHECK raises a Python error); the kernels never see a case they cannot serve.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <climits>
#include <cstdint>
#include <mutex>
#include <vector>

#include "binary_conv_launch.h"

namespace bie_bconv {

static bool sm90(int dev) {
  static std::mutex mu;
  static std::vector<int> cc;   // per device: 0 unknown, else major * 10 + minor
  std::lock_guard<std::mutex> lock(mu);
  if (dev >= static_cast<int>(cc.size())) cc.resize(dev + 1, 0);
  if (cc[dev] == 0) {
    int major = 0, minor = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    cc[dev] = major * 10 + minor;
  }
  return cc[dev] == 90;
}

static int dtype_code(at::ScalarType t) {
  switch (t) {
    case at::kChar: return 0;
    case at::kFloat: return 1;
    case at::kBFloat16: return 2;
    case at::kHalf: return 3;
    default: return -1;
  }
}

static int out_code(const c10::optional<at::ScalarType>& dt) {
  if (!dt.has_value()) return 0;
  switch (*dt) {
    case at::kFloat: return 1;
    case at::kBFloat16: return 2;
    case at::kHalf: return 3;
    default: TORCH_CHECK(false, "bie_cutlass_binary_conv.conv: out_dtype must be float32, bfloat16, float16 or None");
  }
  return -1;
}

static at::Tensor epilogue_vector(const c10::optional<at::Tensor>& v, const char* name, const at::Tensor& x,
                                  int64_t o, bool allow_scalar) {
  const at::Tensor& t = *v;
  TORCH_CHECK(t.device() == x.device() && t.scalar_type() == at::kFloat && t.dim() == 1 && t.is_contiguous(),
              "bie_cutlass_binary_conv.conv: ", name, " must be a contiguous 1-D float32 tensor on x's device");
  TORCH_CHECK(t.numel() == o || (allow_scalar && t.numel() == 1), "bie_cutlass_binary_conv.conv: ", name, " has ",
              t.numel(), " values for ", o, " output channels");
  // the epilogue's vector loads want 16-byte aligned vectors
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 ? t : t.clone();
}

namespace {
// What both entries launch: the conv of the padded operand xp (N, hp, wp, C/4) bytes into out, with the window
// rows it reads where config is a window GEMM.
struct Launch {
  BConvArgs p;
  BConvFn fn = nullptr;
  at::Tensor out, rows, scale, bias;   // (the epilogue vectors stay alive until the launch)
  int64_t ho = 0, wo = 0;
  bool windows = false;
};
}  // namespace

// The checks both entries share and the launch's arguments, for a padded operand xp of N images of hp x wp pixels,
// C channels (xp allocated: conv fills it after these checks), then CUTLASS's can_implement: the caller falls back
// on its error before anything runs.
static Launch plan(const at::Tensor& xp, const at::Tensor& wp, int64_t N, int64_t C, int64_t hp, int64_t wpx,
                   int64_t sh, int64_t sw, int64_t dh, int64_t dw, const c10::optional<at::Tensor>& scale_in,
                   const c10::optional<at::Tensor>& bias_in, c10::optional<at::ScalarType> out_dtype, int64_t config,
                   const char* who) {
  TORCH_CHECK(wp.device() == xp.device() && wp.dim() == 4 && wp.scalar_type() == at::kChar && wp.is_contiguous() &&
                  reinterpret_cast<uintptr_t>(wp.data_ptr()) % 16 == 0,
              who, "wp must be the prepared contiguous (O, kh, kw, C/4) int8 weight on x's device");
  const int64_t O = wp.size(0), kh = wp.size(1), kw = wp.size(2);
  TORCH_CHECK(C > 0 && C % 64 == 0 && wp.size(3) == C / 4, who, "C must be a positive multiple of 64 and wp's rows C/4 ",
              "bytes: C = ", C, ", wp ", wp.sizes());
  TORCH_CHECK(O > 0 && O % 8 == 0 && O < INT_MAX, who, "O must be a positive multiple of 8, got ", O);
  TORCH_CHECK(sh >= 1 && sw >= 1 && sh <= 8 && sw <= 8 && dh >= 1 && dw >= 1 && dh < 65536 && dw < 65536, who,
              "stride 1..8 and dilation >= 1 required");
  Launch L;
  L.ho = (hp - dh * (kh - 1) - 1) / sh + 1;
  L.wo = (wpx - dw * (kw - 1) - 1) / sw + 1;
  TORCH_CHECK(N > 0 && hp - dh * (kh - 1) - 1 >= 0 && wpx - dw * (kw - 1) - 1 >= 0, who, "empty problem: ", N,
              " images of ", hp, "x", wpx, " padded pixels, kernel ", kh, "x", kw);
  TORCH_CHECK(N * hp * wpx * (C / 4) < INT_MAX && N * L.ho * L.wo < INT_MAX && kh * kw * C < (int64_t(1) << 30) &&
                  (config < kFirstWindowConfig || N * L.ho * L.wo * kh * kw * (C / 4) < INT_MAX),
              who, "problem outside the 32-bit index range served");
  TORCH_CHECK(config >= 0 && config < kNumConfigs, who, "unknown config ", config);
  TORCH_CHECK(sm90(xp.get_device()), who, "needs a compute capability 9.0 GPU");
  const int code = out_code(out_dtype);
  if (code == 0) TORCH_CHECK(!scale_in.has_value() && !bias_in.has_value(), who, "int32 output takes no scale/bias");
  BConvArgs& p = L.p;
  if (scale_in.has_value()) {
    L.scale = epilogue_vector(scale_in, "scale", xp, O, true);
    p.scale = L.scale.data_ptr<float>();
    p.scale_vec = L.scale.numel() > 1;
  }
  if (bias_in.has_value()) {
    L.bias = epilogue_vector(bias_in, "bias", xp, O, false);
    p.bias = L.bias.data_ptr<float>();
  }
  p.n = int(N);
  p.h = int(hp);
  p.w = int(wpx);
  p.c_bytes = int(C / 4);
  p.o = int(O);
  p.r = int(kh);
  p.s = int(kw);
  p.stride_h = int(sh);
  p.stride_w = int(sw);
  p.dil_h = int(dh);
  p.dil_w = int(dw);
  p.k_bits = int32_t(kh * kw * C);
  p.stream = c10::cuda::getCurrentCUDAStream(xp.get_device()).stream();
  p.device = xp.get_device();
  p.sm_count = at::cuda::getDeviceProperties(p.device)->multiProcessorCount;
  p.m = int(N * L.ho * L.wo);
  L.windows = config >= kFirstWindowConfig;
  L.fn = conv_fn(int(config), code);
  TORCH_CHECK(L.fn != nullptr, who, "no instantiation for config ", config, " out ", code);
  const at::ScalarType odt = code == 0 ? at::kInt : *out_dtype;
  L.out = at::empty({N, L.ho, L.wo, O}, xp.options().dtype(odt));
  p.x = static_cast<const int8_t*>(xp.data_ptr());
  if (L.windows) {
    L.rows = at::empty({N * L.ho * L.wo, kh * kw * (C / 4)}, xp.options().dtype(at::kChar));
    p.windows = static_cast<const int8_t*>(L.rows.data_ptr());
  }
  p.wt = static_cast<const int8_t*>(wp.data_ptr());
  p.d = L.out.data_ptr();
  std::string err = L.fn(p, 0, nullptr);
  TORCH_CHECK(err.empty(), who, err);
  return L;
}

// The window rows (window GEMMs), then the conv; returns (N, O, Ho, Wo) as a channels_last tensor.
static at::Tensor run(Launch& L, const at::Tensor& like, const char* who) {
  BConvArgs& p = L.p;
  std::string err;
  if (L.windows) {
    err = launch_windows(p.x, p.n, p.h, p.w, p.c_bytes, p.r, p.s, p.stride_h, p.stride_w, p.dil_h, p.dil_w,
                         int(L.ho), int(L.wo), static_cast<int8_t*>(L.rows.data_ptr()), p.stream);
    TORCH_CHECK(err.empty(), who, err);
  }
  size_t ws = 0;
  err = L.fn(p, 1, &ws);
  TORCH_CHECK(err.empty(), who, err);
  at::Tensor workspace;
  if (ws > 0) {
    workspace = at::empty({static_cast<int64_t>(ws)}, like.options().dtype(at::kByte));
    p.workspace = workspace.data_ptr();
  }
  err = L.fn(p, 2, nullptr);
  TORCH_CHECK(err.empty(), who, err);
  return L.out.permute({0, 3, 1, 2});
}

// x (N, C, H, W) of int8 / float32 / bfloat16 / float16 with any strides, C % 64 == 0; wp the prepared (O, kh, kw,
// C / 4) int8 weight (binary_conv.py prepare: [w | ~w] bytes per tap), O % 8 == 0; shift None or C float32 values
// (the op's shift cast to x's dtype, then to float32; a float x only); the conv of pad(sgn(x [+ shift]), padding,
// value = +1 if pad_plus else -1) with sgn(W): returns (N, O, Ho, Wo) as a channels_last tensor (the NHWC result),
// int32 counts (out_dtype None) or float32(count) * scale + bias in out_dtype.
at::Tensor conv(const at::Tensor& x, const at::Tensor& wp, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                int64_t dh, int64_t dw, bool pad_plus, const c10::optional<at::Tensor>& shift,
                const c10::optional<at::Tensor>& scale_in,
                const c10::optional<at::Tensor>& bias_in, c10::optional<at::ScalarType> out_dtype, int64_t config) {
  const char* who = "bie_cutlass_binary_conv.conv: ";
  TORCH_CHECK(x.is_cuda() && x.dim() == 4, who, "x must be a 4-D CUDA tensor, got ", x.sizes());
  const int dcode = dtype_code(x.scalar_type());
  TORCH_CHECK(dcode >= 0, who, "x must be int8, float32, bfloat16 or float16, got ", x.scalar_type());
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  TORCH_CHECK(ph >= 0 && pw >= 0 && ph < 65536 && pw < 65536, who, "padding must be in [0, 65535]");
  c10::optional<at::Tensor> shift_al;
  if (shift.has_value()) {
    const at::Tensor& s = *shift;
    TORCH_CHECK(dcode > 0 && s.device() == x.device() && s.scalar_type() == at::kFloat && s.dim() == 1 &&
                    s.numel() == C && s.is_contiguous(),
                who, "shift must be C contiguous float32 values on x's device, of a float x");
    // the packing kernel reads the shift in 16-byte loads
    shift_al = reinterpret_cast<uintptr_t>(s.data_ptr()) % 16 == 0 ? s : s.clone();
  }
  c10::cuda::CUDAGuard guard(x.device());
  const int64_t hp = H + 2 * ph, wpx = W + 2 * pw;
  TORCH_CHECK(C > 0 && C % 64 == 0, who, "C must be a positive multiple of 64, got ", C);
  at::Tensor xp = at::empty({N, hp, wpx, C / 4}, x.options().dtype(at::kChar));
  Launch L = plan(xp, wp, N, C, hp, wpx, sh, sw, dh, dw, scale_in, bias_in, out_dtype, config, who);
  std::string err = launch_pack(x.data_ptr(), dcode, x.stride(0), x.stride(1), x.stride(2), x.stride(3), int(N),
                                int(C), int(H), int(W), int(ph), int(pw), pad_plus,
                                shift_al.has_value() ? shift_al->data_ptr<float>() : nullptr,
                                reinterpret_cast<uint32_t*>(xp.data_ptr()), L.p.stream);
  TORCH_CHECK(err.empty(), who, err);
  return run(L, x, who);
}

// The same conv of a padded sign operand made elsewhere (the op binary_conv2d_signs: a compiled model writes it in
// the kernel that computes the activation): xs (N, hp, wp, C/4) uint8 or int8, contiguous and 16-byte aligned, per
// pixel the C sign bits (channel i at byte i / 8, bit i % 8) and then their complements, the padding already in
// its ring; C % 64 == 0.
at::Tensor conv_signs(const at::Tensor& xs, const at::Tensor& wp, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                      const c10::optional<at::Tensor>& scale_in, const c10::optional<at::Tensor>& bias_in,
                      c10::optional<at::ScalarType> out_dtype, int64_t config) {
  const char* who = "bie_cutlass_binary_conv.conv_signs: ";
  TORCH_CHECK(xs.is_cuda() && xs.dim() == 4 && (xs.scalar_type() == at::kByte || xs.scalar_type() == at::kChar) &&
                  xs.is_contiguous() && reinterpret_cast<uintptr_t>(xs.data_ptr()) % 16 == 0,
              who, "xs must be a contiguous, 16-byte aligned 4-D uint8 / int8 CUDA tensor (N, Hp, Wp, C/4), got ",
              xs.scalar_type(), " ", xs.sizes());
  c10::cuda::CUDAGuard guard(xs.device());
  Launch L = plan(xs, wp, xs.size(0), xs.size(3) * 4, xs.size(1), xs.size(2), sh, sw, dh, dw, scale_in, bias_in,
                  out_dtype, config, who);
  return run(L, xs, who);
}

}  // namespace bie_bconv

TORCH_LIBRARY(bie_cutlass_binary_conv, m) {
  m.def("conv(Tensor x, Tensor wp, int sh, int sw, int ph, int pw, int dh, int dw, bool pad_plus, Tensor? shift, "
        "Tensor? scale, Tensor? bias, ScalarType? out_dtype, int config) -> Tensor");
  m.def("conv_signs(Tensor xs, Tensor wp, int sh, int sw, int dh, int dw, Tensor? scale, Tensor? bias, "
        "ScalarType? out_dtype, int config) -> Tensor");
}

TORCH_LIBRARY_IMPL(bie_cutlass_binary_conv, CUDA, m) {
  m.impl("conv", &bie_bconv::conv);
  m.impl("conv_signs", &bie_bconv::conv_signs);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("conv", &bie_bconv::conv);
  m.def("conv_signs", &bie_bconv::conv_signs);
}
