// Bound inference plans of the integer and weight-only layers (pybind11
// classes of the fused module; see fused.cpp for why a second library).
//
// A plan is made once per layer signature from the prepared weight layout and
// the layer's constants (Python builds and checks every layout, see
// kernels.py / kernels_wq.py / kernels_mbwq.py); a call takes the activation
// tensor alone and does the whole forward in one C++ call with the kernels of
// bie_cpu_native (handed over by `init_plans` as function pointers):
//
//   IntLinearPlan  y = int_gemm(quantize_int(x, sa, bits, shift), codes, scale, bias)
//   IntConvPlan    y = int_conv2d(quantize_int(x + shift[c], sa, bits), codes, geometry, scale, bias)
//   BinaryConvPlan y = binary_conv2d(x, sign bits, geometry, pad value, scale, bias)
//   DynLinearPlan  y = dynamic_int8_linear(x, codes, weight_scale, bias, scheme, reduce_range): the
//                  activation range pass, the quantization, the int8 GEMM and the epilogue
//   WqPlan         y = sum over width segments of wq_gemm(x * channel_scale gathered in the
//                  segment's row order) (+ bias), or None where a result is not finite
//                  (the caller then takes the unbound kernel, whose exact path handles it)
//
// Semantics are the ops' own, bit for bit: the shifted activation is formed
// as the ops define it (x + shift.to(x.dtype), rounded to x's dtype: a float32
// sum rounded once, as PyTorch's CPU half-precision add), and the
// quantization, GEMM and epilogue are the same native entry points the
// unbound kernels call with the same arguments.
//
// Safety: the constructor checks every extent of the layout tensors against
// the sizes it is given; a call checks the activation's device, dtype and
// shape and raises ValueError otherwise; scratch buffers and outputs are
// allocated here at the sizes the kernels are told.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/csrc/utils/pybind.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "bie_native.h"

namespace py = pybind11;

namespace {
#include "scalar_util.h"
#include "fused_common.h"

using quant_fn = int (*)(const bie_quant_args*);
using dquant_fn = int (*)(const bie_dquant_args*);
using igemm_fn = int (*)(const bie_igemm_args*);
using iconv_fn = int (*)(const bie_iconv_args*);
using wq_fn = int (*)(const bie_wq_args*);
using bconv_fn = int (*)(const bie_bconv_pack_args*, const bie_bconv_args*);
using level_fn = int (*)();
quant_fn g_quant = nullptr;
dquant_fn g_dquant = nullptr;
igemm_fn g_igemm = nullptr;
iconv_fn g_iconv = nullptr;
wq_fn g_wq = nullptr;
bconv_fn g_bconv = nullptr;
level_fn g_int_layout = nullptr;

// GIL released above this much work (multiply-adds); below it releasing costs more than the call.
constexpr int64_t kReleaseGil = int64_t{1} << 18;

[[noreturn]] void bad(const char* plan, const std::string& msg) {
  throw py::value_error(std::string("bie native ") + plan + ": " + msg);
}

void check_rc(int rc, const char* plan) {
  if (rc == BIE_ENOMEM) throw std::bad_alloc();
  if (rc) throw std::runtime_error(std::string("bie native ") + plan + " failed: error " + std::to_string(rc));
}

at::ScalarType dtype_of(int64_t code) {
  switch (code) {
    case BIE_F32: return at::kFloat;
    case BIE_F16: return at::kHalf;
    case BIE_BF16: return at::kBFloat16;
    default: return at::kInt;
  }
}

// float32 values of a float tensor (any float dtype, contiguous or not)
std::vector<float> f32_values(const at::Tensor& t, const char* plan, const char* name) {
  if (t.device().type() != c10::DeviceType::CPU || dtype_code(t.scalar_type()) < 0)
    bad(plan, std::string(name) + " must be a float CPU tensor");
  at::Tensor c = t.to(at::kFloat).contiguous();
  const float* p = c.const_data_ptr<float>();
  return std::vector<float>(p, p + c.numel());
}

float round_to(int64_t code, float v) {
  if (code == BIE_F16) return bie_f16_to_f32(bie_f32_to_f16(v));
  if (code == BIE_BF16) return bie_bf16_to_f32(bie_f32_to_bf16(v));
  return v;
}

float load(int64_t code, const void* p, int64_t i) {
  if (code == BIE_F32) return static_cast<const float*>(p)[i];
  const uint16_t h = static_cast<const uint16_t*>(p)[i];
  return code == BIE_F16 ? bie_f16_to_f32(h) : bie_bf16_to_f32(h);
}

// store v (already a value of the dtype) in dtype `code`
void store(int64_t code, void* p, int64_t i, float v) {
  if (code == BIE_F32) static_cast<float*>(p)[i] = v;
  else static_cast<uint16_t*>(p)[i] = code == BIE_F16 ? bie_f32_to_f16(v) : bie_f32_to_bf16(v);
}

void need(bool ok, const char* plan, const char* what) {
  if (!ok) bad(plan, std::string("prepared layout does not match: ") + what);
}

// The epilogue of a plan: scale (1 or `c` float32 values) and bias (`c` values), fixed at bind.
struct Epilogue {
  std::vector<float> scale, bias;
  int64_t flags = 0;

  void set(const std::optional<at::Tensor>& s, const std::optional<at::Tensor>& b, int64_t c, const char* plan) {
    if (s) {
      scale = f32_values(*s, plan, "scale");
      if ((int64_t)scale.size() != 1 && (int64_t)scale.size() != c) bad(plan, "scale must have 1 or C values");
      flags |= BIE_EPI_SCALE | (scale.size() > 1 ? BIE_EPI_SCALE_VEC : 0);
    }
    if (b) {
      bias = f32_values(*b, plan, "bias");
      if ((int64_t)bias.size() != c) bad(plan, "bias must have C values");
      flags |= BIE_EPI_BIAS | BIE_EPI_BIAS_VEC;
    }
  }
  const float* sp() const { return scale.empty() ? nullptr : scale.data(); }
  const float* bp() const { return bias.empty() ? nullptr : bias.data(); }
};

// The activation quantization of both integer plans: codes of x + shift (shift rounded to x's
// dtype at bind, the sum rounded to it per element), scale sa, range [lo, hi].
struct ActQuant {
  int64_t xcode = BIE_F32, lo = 0, hi = 0;
  float sa = 1.0f;
  std::vector<float> shift;  // values of shift.to(x.dtype), as float32 (empty: no shift)

  void set(int64_t code, float scale, int64_t bits, const std::optional<at::Tensor>& sh, int64_t c,
           const char* plan) {
    if (bits != 4 && bits != 8) bad(plan, "bits must be 4 or 8");
    xcode = code;
    sa = scale;
    lo = -(int64_t{1} << (bits - 1));
    hi = (int64_t{1} << (bits - 1)) - 1;
    if (sh) {
      shift = f32_values(*sh, plan, "shift");
      if ((int64_t)shift.size() != c) bad(plan, "shift must have one value per input feature/channel");
      for (float& v : shift) v = round_to(code, v);
    }
  }
  // codes of n contiguous elements already shifted (in x's dtype) at src
  void codes(const void* src, int64_t n, int8_t* out, const char* plan) const {
    bie_quant_args qa{src, xcode, n, (double)sa, lo, hi, out, nullptr, 0};
    check_rc(g_quant(&qa), plan);
  }
};

void check_x(const at::Tensor& x, int64_t xcode, const char* plan) {
  if (x.device().type() != c10::DeviceType::CPU) bad(plan, "x must be a CPU tensor");
  if (dtype_code(x.scalar_type()) != xcode)
    bad(plan, std::string("x must have the bound dtype ") + c10::toString(dtype_of(xcode)) + ", got " +
                  c10::toString(x.scalar_type()));
}

// ------------------------------------------------------------- IntLinearPlan
// The int GEMM weight layout as kernels.py's IntLayout: data, colsum (VNNI), kind, Kp, P, PW.
class IntLinearPlan {
 public:
  IntLinearPlan(const at::Tensor& data, const std::optional<at::Tensor>& colsum, int64_t kind, int64_t n, int64_t k,
                int64_t kp, int64_t p, int64_t pw, int64_t x_code, double act_scale, int64_t bits,
                const std::optional<at::Tensor>& shift, const std::optional<at::Tensor>& scale,
                const std::optional<at::Tensor>& bias)
      : data_(data), kind_(kind), n_(n), k_(k), kp_(kp), p_(p), pw_(pw) {
    const char* nm = "int_linear plan";
    if (!g_quant || !g_igemm || !g_int_layout) bad(nm, "not initialised (bie_cpu_native is not loaded)");
    need(n >= 1 && k >= 1 && kp >= k && p >= 1 && (pw == 8 || pw == 16) && p * pw >= n, nm, "sizes");
    need(data.device().type() == c10::DeviceType::CPU && data.is_contiguous(), nm, "data must be contiguous CPU");
    const int64_t esize = kind == BIE_INT_VNNI16 ? 1 : kind == BIE_INT_ROWS ? 1 : 2;
    const int64_t want = kind == BIE_INT_ROWS ? n * k : p * pw * kp;
    need(kind >= BIE_INT_ROWS && kind <= BIE_INT_VNNI16 && data.numel() * (int64_t)data.element_size() == want * esize,
         nm, "data size");
    if (kind == BIE_INT_VNNI16) {
      need(colsum && colsum->scalar_type() == at::kInt && colsum->is_contiguous() && colsum->numel() == p * pw, nm,
           "colsum");
      colsum_ = *colsum;
    }
    if (dtype_code(dtype_of(x_code)) < 0) bad(nm, "x dtype must be float32, float16 or bfloat16");
    quant_.set(x_code, (float)act_scale, bits, shift, k, nm);
    epi_.set(scale, bias, n, nm);
  }

  // x of any rank: its rows are the last dim, the output has x's shape with N there (see WqPlan::call)
  at::Tensor call(const at::Tensor& x) const {
    if (x.dim() == 2 || x.dim() < 1 || x.size(-1) != k_) return call_rows(x);   // (it checks x)
    at::Tensor out = call_rows(x.reshape({-1, k_}));
    std::vector<int64_t> sizes = x.sizes().vec();
    sizes.back() = n_;
    return out.view(sizes);
  }

  at::Tensor call_rows(const at::Tensor& x) const {
    const char* nm = "int_linear plan";
    check_x(x, quant_.xcode, nm);
    if (x.dim() != 2 || x.size(1) != k_) bad(nm, "x must be (M, " + std::to_string(k_) + ")");
    const int64_t m = x.size(0);
    at::Tensor out = at::empty({m, n_}, at::TensorOptions().dtype(dtype_of(quant_.xcode)));
    if (m == 0) return out;
    if (kind_ != g_int_layout()) bad(nm, "the ISA level changed since the plan was made");
    std::unique_ptr<py::gil_scoped_release> nogil;
    if (m * n_ * k_ > kReleaseGil) nogil = std::make_unique<py::gil_scoped_release>();
    at::Tensor xc = x.is_contiguous() ? x : x.contiguous();
    const void* src = xc.const_data_ptr();
    const int64_t nel = m * k_, es = quant_.xcode == BIE_F32 ? 4 : 2;
    Scratch<unsigned char, 8192> shifted(quant_.shift.empty() ? 0 : (size_t)(nel * es));
    if (!quant_.shift.empty()) {
      void* d = shifted.data();
      const float* sh = quant_.shift.data();
      const int64_t c = quant_.xcode;
      for (int64_t r = 0; r < m; ++r)
        for (int64_t j = 0; j < k_; ++j) store(c, d, r * k_ + j, round_to(c, load(c, src, r * k_ + j) + sh[j]));
      src = d;
    }
    Scratch<int8_t, 4096> codes((size_t)nel);
    quant_.codes(src, nel, codes.data(), nm);
    // the blocking of kernels.py's bind_int_gemm (_blocks(m, P, 64, 8 or 4, 4 * threads))
    int64_t mb = 64, pb = pw_ == 8 ? 8 : 4;
    shrink_blocks(m, p_, mb, pb);
    bie_igemm_args ga{codes.data(), k_, data_.const_data_ptr(),
                      colsum_.defined() ? colsum_.const_data_ptr<int32_t>() : nullptr, kind_, m, n_, k_, kp_, p_, pw_,
                      mb, pb, epi_.sp(), epi_.bp(), epi_.flags, quant_.xcode, out.data_ptr(), nullptr, 0, nullptr, 0};
    check_rc(g_igemm(&ga), nm);
    return out;
  }

 private:
  at::Tensor data_, colsum_;
  int64_t kind_, n_, k_, kp_, p_, pw_;
  ActQuant quant_;
  Epilogue epi_;
};

// --------------------------------------------------------------- IntConvPlan
// The conv weight rows as kernels.py's _iconv_weights: (O, Kp) in the level's A format.
class IntConvPlan {
 public:
  IntConvPlan(const at::Tensor& wl, int64_t kind, int64_t kstep, int64_t o, int64_t c, int64_t g, int64_t kh,
              int64_t kw, std::vector<int64_t> stride, std::vector<int64_t> padding, std::vector<int64_t> dilation,
              int64_t x_code, double act_scale, int64_t bits, const std::optional<at::Tensor>& shift,
              const std::optional<at::Tensor>& scale, const std::optional<at::Tensor>& bias)
      : wl_(wl), kind_(kind), kstep_(kstep), o_(o), c_(c), g_(g), kh_(kh), kw_(kw) {
    const char* nm = "int_conv2d plan";
    if (!g_quant || !g_iconv || !g_int_layout) bad(nm, "not initialised (bie_cpu_native is not loaded)");
    if (stride.size() != 2 || padding.size() != 2 || dilation.size() != 2) bad(nm, "stride/padding/dilation: 2 values");
    sh_ = stride[0], sw_ = stride[1], ph_ = padding[0], pw_ = padding[1], dh_ = dilation[0], dw_ = dilation[1];
    need(o >= 1 && c >= 1 && g >= 1 && c % g == 0 && o % g == 0 && kh >= 1 && kw >= 1 && sh_ >= 1 && sw_ >= 1 &&
             dh_ >= 1 && dw_ >= 1 && ph_ >= 0 && pw_ >= 0 && (kstep == 2 || kstep == 4),
         nm, "geometry");
    cg_ = c / g;
    kp_ = kh * kw * ((cg_ + kstep - 1) / kstep) * kstep;
    need(kind != BIE_INT_ROWS && wl.device().type() == c10::DeviceType::CPU && wl.is_contiguous() && wl.dim() == 2 &&
             wl.size(0) == o && wl.size(1) == kp_ &&
             wl.element_size() == (kind == BIE_INT_VNNI16 ? 1 : 2),
         nm, "weight rows");
    if (dtype_code(dtype_of(x_code)) < 0) bad(nm, "x dtype must be float32, float16 or bfloat16");
    quant_.set(x_code, (float)act_scale, bits, shift, c, nm);
    epi_.set(scale, bias, o, nm);
  }

  at::Tensor call(const at::Tensor& x) const {
    const char* nm = "int_conv2d plan";
    check_x(x, quant_.xcode, nm);
    if (x.dim() != 4 || x.size(1) != c_) bad(nm, "x must be (N, " + std::to_string(c_) + ", H, W)");
    const int64_t n = x.size(0), h = x.size(2), w = x.size(3);
    const int64_t ho = (h + 2 * ph_ - dh_ * (kh_ - 1) - 1) / sh_ + 1, wo = (w + 2 * pw_ - dw_ * (kw_ - 1) - 1) / sw_ + 1;
    if (h < 1 || w < 1 || h + 2 * ph_ < dh_ * (kh_ - 1) + 1 || w + 2 * pw_ < dw_ * (kw_ - 1) + 1)
      bad(nm, "input too small for the kernel");
    // the int_conv2d op's memory format: channels_last output for channels_last input
    const bool nhwc = x.is_contiguous(at::MemoryFormat::ChannelsLast) && !x.is_contiguous();
    const auto opts = at::TensorOptions().dtype(dtype_of(quant_.xcode));
    at::Tensor out = nhwc ? at::empty({n, ho, wo, o_}, opts).permute({0, 3, 1, 2}) : at::empty({n, o_, ho, wo}, opts);
    if (n == 0) return out;
    if (kind_ != g_int_layout()) bad(nm, "the ISA level changed since the plan was made");
    std::unique_ptr<py::gil_scoped_release> nogil;
    if (n * ho * wo * o_ * cg_ * kh_ * kw_ > kReleaseGil) nogil = std::make_unique<py::gil_scoped_release>();
    // x + shift[c] in x's dtype, written channels last (the conv driver reads each pixel's channels
    // contiguously), then its codes
    const int64_t nel = n * c_ * h * w, code = quant_.xcode, es = code == BIE_F32 ? 4 : 2;
    const void* src = x.const_data_ptr();
    const int64_t s0 = x.stride(0), s1 = x.stride(1), s2 = x.stride(2), s3 = x.stride(3);
    Scratch<unsigned char, 8192> shifted((size_t)(nel * es));
    void* d = shifted.data();
    const bool has_shift = !quant_.shift.empty();
    int64_t e = 0;
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < h; ++i)
        for (int64_t j = 0; j < w; ++j) {
          const int64_t base = b * s0 + i * s2 + j * s3;
          if (!has_shift && code == BIE_F32) {
            for (int64_t ch = 0; ch < c_; ++ch) static_cast<float*>(d)[e + ch] = static_cast<const float*>(src)[base + ch * s1];
          } else if (!has_shift) {
            for (int64_t ch = 0; ch < c_; ++ch)
              static_cast<uint16_t*>(d)[e + ch] = static_cast<const uint16_t*>(src)[base + ch * s1];
          } else {
            const float* sh = quant_.shift.data();
            for (int64_t ch = 0; ch < c_; ++ch) store(code, d, e + ch, round_to(code, load(code, src, base + ch * s1) + sh[ch]));
          }
          e += c_;
        }
    Scratch<int8_t, 4096> codes((size_t)nel);
    quant_.codes(d, nel, codes.data(), nm);
    // pixels per task as kernels.py's int_conv2d: panels of about 64 KiB, at least 16, fewer for enough tasks
    const int64_t esz = kind_ == BIE_INT_VNNI16 ? 1 : 2;
    int64_t pix = std::max<int64_t>(16, std::min<int64_t>(128, (65536 / (kp_ * esz)) / 16 * 16));
    const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
    while (n * ((ho * wo + pix - 1) / pix) < 4 * threads && pix > 16) pix = std::max<int64_t>(16, pix / 2 / 16 * 16);
    const int64_t k = cg_ * kh_ * kw_;
    bie_iconv_args ca{codes.data(), n, c_, h, w, h * w * c_, 1, w * c_, c_, wl_.const_data_ptr(), kind_, o_, g_, cg_,
                      o_ / g_, kh_, kw_, sh_, sw_, ph_, pw_, dh_, dw_, ho, wo, k, kp_, pix, epi_.sp(), epi_.bp(),
                      epi_.flags & ~BIE_EPI_BIAS_VEC, code, out.data_ptr(), nhwc ? 1 : 0};
    check_rc(g_iconv(&ca), nm);
    return out;
  }

 private:
  at::Tensor wl_;
  int64_t kind_, kstep_, o_, c_, g_, kh_, kw_, cg_ = 1, kp_ = 0;
  int64_t sh_ = 1, sw_ = 1, ph_ = 0, pw_ = 0, dh_ = 1, dw_ = 1;
  ActQuant quant_;
  Epilogue epi_;
};

// ------------------------------------------------------------ BinaryConvPlan
// The weight as kernels.py's _conv_weights: tap-major sign words (O, KH*KW*CW) int64 and the per-tap
// sums over the channels (O, KH*KW) int32; the packing and the conv are bie_bconv's, with the blocking
// of kernels.py's binary_conv2d.
class BinaryConvPlan {
 public:
  BinaryConvPlan(const at::Tensor& words, const at::Tensor& taps, int64_t o, int64_t c, int64_t g, int64_t kh,
                 int64_t kw, std::vector<int64_t> stride, std::vector<int64_t> padding, std::vector<int64_t> dilation,
                 int64_t pad_value, int64_t x_code, int64_t out_code, const std::optional<at::Tensor>& scale,
                 const std::optional<at::Tensor>& bias)
      : words_(words), taps_(taps), o_(o), c_(c), g_(g), kh_(kh), kw_(kw), xcode_(x_code), out_code_(out_code) {
    const char* nm = "binary_conv2d plan";
    if (!g_bconv) bad(nm, "not initialised (bie_cpu_native is not loaded)");
    if (stride.size() != 2 || padding.size() != 2 || dilation.size() != 2) bad(nm, "stride/padding/dilation: 2 values");
    sh_ = stride[0], sw_ = stride[1], ph_ = padding[0], pw_ = padding[1], dh_ = dilation[0], dw_ = dilation[1];
    need(o >= 1 && c >= 1 && g >= 1 && c % g == 0 && o % g == 0 && kh >= 1 && kw >= 1 && sh_ >= 1 && sw_ >= 1 &&
             dh_ >= 1 && dw_ >= 1 && ph_ >= 0 && pw_ >= 0 && pad_value >= -1 && pad_value <= 1,
         nm, "geometry");
    cg_ = c / g;
    cw_ = (cg_ + 63) / 64;
    padmul_ = pad_value + 1;
    need(words.device().type() == c10::DeviceType::CPU && words.scalar_type() == at::kLong && words.is_contiguous() &&
             words.dim() == 2 && words.size(0) == o && words.size(1) == kh * kw * cw_, nm, "sign words");
    need(taps.device().type() == c10::DeviceType::CPU && taps.scalar_type() == at::kInt && taps.is_contiguous() &&
             taps.numel() == o * kh * kw, nm, "tap sums");
    if (x_code != BIE_F32 && x_code != BIE_F16 && x_code != BIE_BF16 && x_code != BIE_I8) bad(nm, "x dtype");
    if (out_code != BIE_F32 && out_code != BIE_F16 && out_code != BIE_BF16 && out_code != BIE_I32)
      bad(nm, "output dtype");
    if (out_code == BIE_I32 && (scale || bias)) bad(nm, "integer counts take no scale or bias");
    epi_.set(scale, bias, o, nm);
  }

  at::Tensor call(const at::Tensor& x) const {
    const char* nm = "binary_conv2d plan";
    if (x.device().type() != c10::DeviceType::CPU) bad(nm, "x must be a CPU tensor");
    const at::ScalarType want = xcode_ == BIE_I8 ? at::kChar : dtype_of(xcode_);
    if (x.scalar_type() != want) bad(nm, "x must have the bound dtype");
    if (x.dim() != 4 || x.size(1) != c_) bad(nm, "x must be (N, " + std::to_string(c_) + ", H, W)");
    const int64_t n = x.size(0), h = x.size(2), w = x.size(3);
    if (h < 1 || w < 1 || h + 2 * ph_ < dh_ * (kh_ - 1) + 1 || w + 2 * pw_ < dw_ * (kw_ - 1) + 1)
      bad(nm, "input too small for the kernel");
    const int64_t ho = (h + 2 * ph_ - dh_ * (kh_ - 1) - 1) / sh_ + 1, wo = (w + 2 * pw_ - dw_ * (kw_ - 1) - 1) / sw_ + 1;
    // the op's format: channels_last for a channels_last x (and not also contiguous), written as such
    const bool nhwc = x.is_contiguous(at::MemoryFormat::ChannelsLast) && !x.is_contiguous();
    at::Tensor out = at::empty({n, o_, ho, wo}, at::TensorOptions().dtype(dtype_of(out_code_)),
                               nhwc ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous);
    if (n == 0) return out;
    at::Tensor xc = (x.stride(3) == 1 || x.stride(1) == 1) ? x : x.contiguous();
    std::unique_ptr<py::gil_scoped_release> nogil;
    if (n * ho * wo * o_ * kh_ * kw_ * cw_ > kReleaseGil / 16) nogil = std::make_unique<py::gil_scoped_release>();
    const int64_t hp = h + 2 * ph_, wp = w + 2 * pw_;
    const size_t nxs = (size_t)(n * hp * wp * g_ * cw_);
    Scratch<uint64_t, 2048> xs(nxs);
    std::memset(xs.data(), 0, nxs * sizeof(uint64_t));
    const int64_t hrows = std::min<int64_t>(h, (256 + w - 1) / w);
    bie_bconv_pack_args pa{xc.const_data_ptr(), xcode_, n, c_, h, w, xc.stride(0), xc.stride(1), xc.stride(2),
                           xc.stride(3), g_, cg_, cw_, ph_, pw_, hp, wp, xs.data(), hrows};
    int64_t pix = 64;
    const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
    while (n * ((ho * wo + pix - 1) / pix) < 4 * threads && pix > 8) pix /= 2;
    bie_bconv_args ca{xs.data(), n, h, w, hp, wp, g_, cw_, reinterpret_cast<const uint64_t*>(words_.const_data_ptr()),
                      taps_.const_data_ptr<int32_t>(), o_, o_ / g_, kh_, kw_, sh_, sw_, ph_, pw_, dh_, dw_, ho, wo,
                      cg_ * kh_ * kw_, padmul_, pix, epi_.sp(), epi_.bp(), epi_.flags & ~BIE_EPI_BIAS_VEC, out_code_,
                      out.data_ptr(), nhwc ? 1 : 0};
    check_rc(g_bconv(&pa, &ca), nm);
    return out;
  }

 private:
  at::Tensor words_, taps_;
  int64_t o_, c_, g_, kh_, kw_, xcode_, out_code_, cg_ = 1, cw_ = 1, padmul_ = 1;
  int64_t sh_ = 1, sw_ = 1, ph_ = 0, pw_ = 0, dh_ = 1, dw_ = 1;
  Epilogue epi_;
};

// ------------------------------------------------------------ DynLinearPlan
// torch's choice of the per_tensor_affine scale and zero point (bie_core.ops.dynamic.affine_qparams_host,
// step for step: float64 arithmetic where it has Python floats, a float32 rounding where it rounds).
// False for a non-finite range (the op's scale is then NaN, its zero point 0).
constexpr double kSmallScale = (double)6.1e-5f;

double f32r(double v) { return (double)(float)v; }

bool affine_qparams(double xmin, double xmax, int64_t qmax, float& scale_out, int64_t& zp_out) {
  if (!std::isfinite(xmin) || !std::isfinite(xmax)) return false;
  const double q = (double)qmax;
  double lo = f32r(xmin), hi = f32r(xmax);
  lo = 0.0 < lo ? 0.0 : lo;   // Python's min(lo, 0.0) / max(hi, 0.0): the first argument on ties
  hi = 0.0 > hi ? 0.0 : hi;
  double scale = (hi - lo) / q;
  const double s32 = f32r(scale);
  if (s32 == 0.0 || std::isinf(f32r(1.0 / s32))) scale = 0.1;
  if (scale < kSmallScale) {
    const double org = f32r(scale);
    scale = kSmallScale;
    if (lo == 0.0) {
      hi = f32r(kSmallScale * q);
    } else if (hi == 0.0) {
      lo = f32r(-kSmallScale * q);
    } else {
      const double amp = f32r(kSmallScale / org);
      lo = f32r(lo * amp);
      hi = f32r(hi * amp);
    }
  }
  const double lo_q = lo / scale, hi_q = hi / scale;
  double z = -std::fabs(lo_q) < q - std::fabs(hi_q) ? -lo_q : q - hi_q;
  z = z < 0.0 ? 0.0 : z > q ? q : z;
  scale_out = (float)scale;
  zp_out = (int64_t)std::nearbyint(z);   // round half to even (the default rounding mode), as Python's round
  return true;
}

// Products (multiply-adds) up to which the GEMM keeps kernels_dynamic.SERIAL_MACS's blocking (no shrinking
// for threads).
constexpr int64_t kSerialMacs = int64_t{1} << 21;

// The dynamic int8 linear on kernels.py's IntLayout of the int8 weight (the same entry points and arguments
// as kernels_dynamic.dynamic_int8_linear): per_tensor_affine takes the per-row min/max of x (bie_dquant
// mode 2), reduces them here, chooses the scale and zero point, quantizes (mode 0: codes q - 128) and folds
// (128 - zp) * rowsum back into the int32 sums; per_token_symmetric quantizes each row from its own
// abs-max (mode 1). The epilogue multiplies by the row's scale times the column's (one float32 rounding)
// and adds the bias, in the output dtype (x's).
class DynLinearPlan {
 public:
  DynLinearPlan(const at::Tensor& data, const std::optional<at::Tensor>& colsum,
                const std::optional<at::Tensor>& rowsum, int64_t kind, int64_t n, int64_t k, int64_t kp, int64_t p,
                int64_t pw, int64_t x_code, bool per_token, int64_t qmax, const at::Tensor& weight_scale,
                const std::optional<at::Tensor>& bias)
      : data_(data), kind_(kind), n_(n), k_(k), kp_(kp), p_(p), pw_(pw), xcode_(x_code), per_token_(per_token),
        qmax_(qmax) {
    const char* nm = "dynamic_int8_linear plan";
    if (!g_dquant || !g_igemm || !g_int_layout) bad(nm, "not initialised (bie_cpu_native is not loaded)");
    need(n >= 1 && k >= 1 && kp >= k && p >= 1 && (pw == 8 || pw == 16) && p * pw >= n, nm, "sizes");
    need(kind >= BIE_INT_MADD8 && kind <= BIE_INT_VNNI16, nm, "layout kind (vector levels only)");
    need(data.device().type() == c10::DeviceType::CPU && data.is_contiguous(), nm, "data must be contiguous CPU");
    const int64_t esize = kind == BIE_INT_VNNI16 ? 1 : 2;
    need(data.numel() * (int64_t)data.element_size() == p * pw * kp * esize, nm, "data size");
    if (kind == BIE_INT_VNNI16) {
      need(colsum && colsum->scalar_type() == at::kInt && colsum->is_contiguous() && colsum->numel() == p * pw, nm,
           "colsum");
      colsum_ = *colsum;
    }
    if (!per_token) {
      need(rowsum && rowsum->device().type() == c10::DeviceType::CPU && rowsum->scalar_type() == at::kInt &&
               rowsum->is_contiguous() && rowsum->numel() == n,
           nm, "row sums");
      rowsum_ = *rowsum;
    }
    if (per_token ? qmax != 127 : (qmax != 127 && qmax != 255)) bad(nm, "qmax must be 255 or 127 (127 per token)");
    if (dtype_code(dtype_of(x_code)) < 0) bad(nm, "x dtype must be float32, float16 or bfloat16");
    epi_.set(weight_scale, bias, n, nm);
  }

  // The output; None when `check` is set and a scale is not finite (x holds a NaN or an infinity: the caller
  // raises its error). Without `check` such rows (per token) or calls (per tensor) give NaN outputs.
  py::object call(const at::Tensor& x, bool check) const {
    const char* nm = "dynamic_int8_linear plan";
    check_x(x, xcode_, nm);
    if (x.dim() != 2 || x.size(1) != k_) bad(nm, "x must be (M, " + std::to_string(k_) + ")");
    const int64_t m = x.size(0);
    at::Tensor out = at::empty({m, n_}, at::TensorOptions().dtype(dtype_of(xcode_)));
    if (m == 0) return py::cast(out);
    if (kind_ != g_int_layout()) bad(nm, "the ISA level changed since the plan was made");
    // rows with element stride 1 are read in place (a single row's stride says nothing)
    const bool rows = x.stride(1) == 1 && (m == 1 || x.stride(0) >= k_);
    at::Tensor xc = rows ? x : x.contiguous();
    const int64_t ldx = m == 1 ? k_ : xc.stride(0);
    bool finite = true;
    {
      std::unique_ptr<py::gil_scoped_release> nogil;
      if (m * n_ * k_ > kReleaseGil) nogil = std::make_unique<py::gil_scoped_release>();
      Scratch<int8_t, 16384> codes((size_t)(m * k_));
      Scratch<float, 512> rs((size_t)(per_token_ ? m : 2 * m));
      float row_scale = 0.0f;
      int64_t cmul = 0;
      if (per_token_) {
        bie_dquant_args qa{xc.const_data_ptr(), xcode_, m, k_, ldx, 1, 0.0, 0.0, 127, codes.data(), rs.data()};
        check_rc(g_dquant(&qa), nm);
        for (int64_t r = 0; r < m && finite; ++r) finite = std::isfinite(rs.data()[r]);
      } else {
        bie_dquant_args ra{xc.const_data_ptr(), xcode_, m, k_, ldx, 2, 0.0, 0.0, qmax_, nullptr, rs.data()};
        check_rc(g_dquant(&ra), nm);
        const float* mm = rs.data();
        float lo = mm[0], hi = mm[1];
        bool nan = lo != lo;
        for (int64_t r = 1; r < m; ++r) {
          nan |= mm[2 * r] != mm[2 * r];
          lo = mm[2 * r] < lo ? mm[2 * r] : lo;
          hi = mm[2 * r + 1] > hi ? mm[2 * r + 1] : hi;
        }
        int64_t zp = 0;
        finite = !nan && affine_qparams(lo, hi, qmax_, row_scale, zp);
        if (!finite) row_scale = __builtin_nanf("");
        // inv = float32(1 / scale); a NaN scale gives NaN products, codes 0
        const float inv = finite ? 1.0f / row_scale : __builtin_nanf("");
        bie_dquant_args qa{xc.const_data_ptr(), xcode_, m, k_, ldx, 0, (double)inv, (double)zp, qmax_, codes.data(),
                           nullptr};
        if (!(check && !finite)) check_rc(g_dquant(&qa), nm);
        cmul = 128 - zp;
      }
      if (!(check && !finite)) {
        int64_t mb = 64, pb = pw_ == 8 ? 8 : 4;
        if (m * n_ * k_ > kSerialMacs) shrink_blocks(m, p_, mb, pb);
        bie_igemm_args ga{codes.data(), k_, data_.const_data_ptr(),
                          colsum_.defined() ? colsum_.const_data_ptr<int32_t>() : nullptr, kind_, m, n_, k_, kp_,
                          p_, pw_, mb, pb, epi_.sp(), epi_.bp(), epi_.flags, xcode_, out.data_ptr(),
                          per_token_ ? rs.data() : &row_scale, per_token_ ? 1 : 0,
                          per_token_ ? nullptr : rowsum_.const_data_ptr<int32_t>(), cmul};
        check_rc(g_igemm(&ga), nm);
      }
    }
    if (check && !finite) return py::none();
    return py::cast(out);
  }

 private:
  at::Tensor data_, colsum_, rowsum_;
  int64_t kind_, n_, k_, kp_, p_, pw_, xcode_;
  bool per_token_;
  int64_t qmax_;
  Epilogue epi_;
};

// -------------------------------------------------------------------- WqPlan
// One width segment: kernels_wq.WqLayout's float32-kernel panels and the x column of every
// prepared row (index k: a zero), or none when the prepared order is x's own (kp == k).
struct WqSeg {
  at::Tensor qw, s, z, c, gb, xsrc;
  int64_t kp, p, g, bits, fmt;
};

class WqPlan {
 public:
  WqPlan(int64_t k, int64_t n, int64_t x_code, const std::optional<at::Tensor>& channel_scale, bool bias_in_kernel)
      : k_(k), n_(n), xcode_(x_code), bias_in_kernel_(bias_in_kernel) {
    const char* nm = "weight-only plan";
    if (!g_wq) bad(nm, "not initialised (bie_cpu_native is not loaded)");
    if (k < 1 || n < 1 || dtype_code(dtype_of(x_code)) < 0) bad(nm, "bad sizes or x dtype");
    if (channel_scale) {
      cs_ = f32_values(*channel_scale, nm, "channel_scale");
      if ((int64_t)cs_.size() != k) bad(nm, "channel_scale must have K values");
    }
  }

  void add_segment(const at::Tensor& qw, const at::Tensor& s, const at::Tensor& z, const at::Tensor& c,
                   const at::Tensor& gb, const std::optional<at::Tensor>& xsrc, int64_t kp, int64_t p, int64_t g,
                   int64_t bits, int64_t fmt) {
    const char* nm = "weight-only plan";
    auto f32 = [&](const at::Tensor& t, const char* what) {
      need(t.device().type() == c10::DeviceType::CPU && t.scalar_type() == at::kFloat && t.is_contiguous() &&
               t.numel() == p * g * 16, nm, what);
    };
    need((bits == 2 || bits == 3 || bits == 4 || bits == 8) && (fmt == 0 || fmt == 1) && kp >= 32 && kp % 32 == 0 &&
             p >= 1 && p * 16 >= n_ && (p - 1) * 16 < n_ && g >= 1, nm, "sizes");
    need(qw.device().type() == c10::DeviceType::CPU && qw.scalar_type() == at::kInt && qw.is_contiguous() &&
             qw.numel() == p * (kp / 32) * bits * 16, nm, "code panels");
    f32(s, "scales");
    f32(z, "zeros");
    f32(c, "offsets");
    need(gb.device().type() == c10::DeviceType::CPU && gb.scalar_type() == at::kLong && gb.is_contiguous() &&
             gb.numel() == g + 1, nm, "group blocks");
    const int64_t* gbp = gb.const_data_ptr<int64_t>();
    need(gbp[0] == 0 && gbp[g] == kp / 32, nm, "group blocks");
    for (int64_t i = 0; i < g; ++i) need(gbp[i + 1] >= gbp[i], nm, "group blocks");
    WqSeg sg{qw, s, z, c, gb, at::Tensor(), kp, p, g, bits, fmt};
    if (xsrc) {
      need(xsrc->device().type() == c10::DeviceType::CPU && xsrc->scalar_type() == at::kLong &&
               xsrc->is_contiguous() && xsrc->numel() == kp, nm, "row sources");
      const int64_t* q = xsrc->const_data_ptr<int64_t>();
      for (int64_t i = 0; i < kp; ++i) need(q[i] >= 0 && q[i] <= k_, nm, "row sources");
      sg.xsrc = *xsrc;
    } else {
      need(kp == k_, nm, "a segment without row sources must have Kp == K");
    }
    segs_.push_back(std::move(sg));
  }

  // the result, or None when a value is not finite (the unbound kernel then serves the call)
  py::object call(const at::Tensor& x, const std::optional<at::Tensor>& bias) const {
    const char* nm = "weight-only plan";
    check_x(x, xcode_, nm);
    // any rank: the rows of the last dim, the output in x's shape with N there (what a layer returns: no reshape
    // in Python on the way in or out)
    if (x.dim() < 1 || x.size(-1) != k_) bad(nm, "x must be (..., " + std::to_string(k_) + ")");
    if (segs_.empty()) bad(nm, "no segments");
    std::vector<float> b32;
    const float* bp = nullptr;   // the bias as float32 values (the tensor's own when it is float32 and contiguous)
    if (bias) {
      if (bias->numel() != n_) bad(nm, "bias must have N values");
      if (bias->device().type() == c10::DeviceType::CPU && bias->scalar_type() == at::kFloat && bias->is_contiguous()) {
        bp = bias->const_data_ptr<float>();
      } else {
        b32 = f32_values(*bias, nm, "bias");
        bp = b32.data();
      }
    }
    const int64_t m = x.numel() / k_;
    std::vector<int64_t> out_sizes = x.sizes().vec();
    out_sizes.back() = n_;
    at::Tensor out = at::empty(out_sizes, at::TensorOptions().dtype(at::kFloat));
    if (m == 0) return py::cast(xcode_ == BIE_F32 ? out : out.to(dtype_of(xcode_)));
    bool finite = true;
    {
      std::unique_ptr<py::gil_scoped_release> nogil;
      if (m * n_ * k_ > kReleaseGil) nogil = std::make_unique<py::gil_scoped_release>();
      at::Tensor xc = x.is_contiguous() ? x : x.contiguous();
      const void* src = xc.const_data_ptr();
      // float32(x) * channel_scale, with a zero column k (padding rows read it)
      const bool direct = xcode_ == BIE_F32 && cs_.empty() && segs_.size() == 1 && !segs_[0].xsrc.defined();
      Scratch<float, 2048> xf(direct ? 0 : (size_t)(m * (k_ + 1)));
      if (!direct) {
        float* d = xf.data();
        for (int64_t r = 0; r < m; ++r) {
          for (int64_t j = 0; j < k_; ++j) {
            const float v = load(xcode_, src, r * k_ + j);
            d[r * (k_ + 1) + j] = cs_.empty() ? v : v * cs_[j];
          }
          d[r * (k_ + 1) + k_] = 0.0f;
        }
      }
      size_t most = 0;
      for (const WqSeg& sg : segs_) most = std::max(most, (size_t)sg.kp);
      Scratch<float, 2048> xp(direct ? 0 : (size_t)m * most);
      Scratch<float, 1024> part(segs_.size() > 1 ? (size_t)(m * n_) : 0);
      float* o = out.data_ptr<float>();
      for (size_t si = 0; si < segs_.size(); ++si) {
        const WqSeg& sg = segs_[si];
        const float* xin = static_cast<const float*>(src);
        if (!direct) {
          float* d = xp.data();
          const float* f = xf.data();
          if (sg.xsrc.defined()) {
            const int64_t* q = sg.xsrc.const_data_ptr<int64_t>();
            for (int64_t r = 0; r < m; ++r)
              for (int64_t i = 0; i < sg.kp; ++i) d[r * sg.kp + i] = f[r * (k_ + 1) + q[i]];
          } else {
            for (int64_t r = 0; r < m; ++r) std::memcpy(d + r * sg.kp, f + r * (k_ + 1), (size_t)k_ * sizeof(float));
          }
          xin = d;
        }
        float* dst = si == 0 ? o : part.data();
        bie_wq_args a{xin, m, n_, sg.kp, sg.p, sg.g, sg.bits, sg.qw.const_data_ptr<int32_t>(),
                      sg.s.const_data_ptr<float>(), sg.z.const_data_ptr<float>(), sg.c.const_data_ptr<float>(),
                      sg.gb.const_data_ptr<int64_t>(), nullptr,
                      bias_in_kernel_ ? bp : nullptr, sg.fmt, dst};
        check_rc(g_wq(&a), nm);
        if (si > 0)
          for (int64_t i = 0; i < m * n_; ++i) o[i] += dst[i];
      }
      if (!bias_in_kernel_ && bp)
        for (int64_t r = 0; r < m; ++r)
          for (int64_t j = 0; j < n_; ++j) o[r * n_ + j] += bp[j];
      for (int64_t i = 0; i < m * n_ && finite; ++i) finite = std::isfinite(o[i]);
    }
    if (!finite) return py::none();
    return py::cast(xcode_ == BIE_F32 ? out : out.to(dtype_of(xcode_)));
  }

 private:
  int64_t k_, n_, xcode_;
  bool bias_in_kernel_;
  std::vector<float> cs_;
  std::vector<WqSeg> segs_;
};

void init_plans(uintptr_t quant, uintptr_t dquant, uintptr_t igemm, uintptr_t iconv, uintptr_t wq, uintptr_t bconv, uintptr_t int_layout,
                int64_t abi) {
  if (abi != BIE_NATIVE_ABI)
    throw std::runtime_error("bie_cpu_native ABI " + std::to_string(abi) + " != " + std::to_string(BIE_NATIVE_ABI));
  g_quant = reinterpret_cast<quant_fn>(quant);
  g_dquant = reinterpret_cast<dquant_fn>(dquant);
  g_igemm = reinterpret_cast<igemm_fn>(igemm);
  g_iconv = reinterpret_cast<iconv_fn>(iconv);
  g_wq = reinterpret_cast<wq_fn>(wq);
  g_bconv = reinterpret_cast<bconv_fn>(bconv);
  g_int_layout = reinterpret_cast<level_fn>(int_layout);
}
}  // namespace

void bie_register_plans(py::module_& m) {
  m.def("init_plans", &init_plans,
        "hand over bie_quant / bie_dquant / bie_igemm / bie_iconv / bie_wq_gemm / bie_bconv / bie_int_layout");
  py::class_<IntLinearPlan>(m, "IntLinearPlan")
      .def(py::init<const at::Tensor&, const std::optional<at::Tensor>&, int64_t, int64_t, int64_t, int64_t, int64_t,
                    int64_t, int64_t, double, int64_t, const std::optional<at::Tensor>&,
                    const std::optional<at::Tensor>&, const std::optional<at::Tensor>&>(),
           py::arg("data"), py::arg("colsum"), py::arg("kind"), py::arg("n"), py::arg("k"), py::arg("kp"),
           py::arg("p"), py::arg("pw"), py::arg("x_code"), py::arg("act_scale"), py::arg("bits"), py::arg("shift"),
           py::arg("scale"), py::arg("bias"))
      .def("__call__", &IntLinearPlan::call);
  py::class_<IntConvPlan>(m, "IntConvPlan")
      .def(py::init<const at::Tensor&, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                    std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>, int64_t, double, int64_t,
                    const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                    const std::optional<at::Tensor>&>(),
           py::arg("wl"), py::arg("kind"), py::arg("kstep"), py::arg("o"), py::arg("c"), py::arg("groups"),
           py::arg("kh"), py::arg("kw"), py::arg("stride"), py::arg("padding"), py::arg("dilation"),
           py::arg("x_code"), py::arg("act_scale"), py::arg("bits"), py::arg("shift"), py::arg("scale"),
           py::arg("bias"))
      .def("__call__", &IntConvPlan::call);
  py::class_<BinaryConvPlan>(m, "BinaryConvPlan")
      .def(py::init<const at::Tensor&, const at::Tensor&, int64_t, int64_t, int64_t, int64_t, int64_t,
                    std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>, int64_t, int64_t, int64_t,
                    const std::optional<at::Tensor>&, const std::optional<at::Tensor>&>(),
           py::arg("words"), py::arg("taps"), py::arg("o"), py::arg("c"), py::arg("groups"), py::arg("kh"),
           py::arg("kw"), py::arg("stride"), py::arg("padding"), py::arg("dilation"), py::arg("pad_value"),
           py::arg("x_code"), py::arg("out_code"), py::arg("scale"), py::arg("bias"))
      .def("__call__", &BinaryConvPlan::call);
  py::class_<DynLinearPlan>(m, "DynLinearPlan")
      .def(py::init<const at::Tensor&, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, int64_t,
                    int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, int64_t, const at::Tensor&,
                    const std::optional<at::Tensor>&>(),
           py::arg("data"), py::arg("colsum"), py::arg("rowsum"), py::arg("kind"), py::arg("n"), py::arg("k"),
           py::arg("kp"), py::arg("p"), py::arg("pw"), py::arg("x_code"), py::arg("per_token"), py::arg("qmax"),
           py::arg("weight_scale"), py::arg("bias"))
      .def("__call__", &DynLinearPlan::call, py::arg("x"), py::arg("check") = false);
  py::class_<WqPlan>(m, "WqPlan")
      .def(py::init<int64_t, int64_t, int64_t, const std::optional<at::Tensor>&, bool>(), py::arg("k"), py::arg("n"),
           py::arg("x_code"), py::arg("channel_scale"), py::arg("bias_in_kernel"))
      .def("add_segment", &WqPlan::add_segment)
      .def("__call__", &WqPlan::call);
}
