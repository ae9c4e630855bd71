// Fused inference binary_linear, bound with pybind11 (at::Tensor arguments);
// the bound plans of the integer and weight-only layers are in fused_plans.cpp.
//
// Why a second library: the ctypes entry points of bie_cpu_native cost
// several µs of Python per call (argument structs, data pointers, output
// allocation from Python), which is most of the time of a tiny inference layer
// (BinaryLinear(64, 64) at batch 1 is a few hundred nanoseconds of work). This
// module takes the tensors themselves, checks them, and does the whole op in
// one call: y = epilogue(sgn(x + shift) @ sgn(W).T). It holds no kernels of its
// own: the packing and the XOR-popcount GEMM are the ISA-dispatched entry
// points of bie_cpu_native (bie_pack, bie_bgemm), handed over as function
// pointers by `init` once that library is loaded. It includes only the tensor
// and pybind11 headers of torch (not torch/extension.h), which keeps the build
// to ~15 s.
//
// Semantics (= the reference, bit for bit):
//   xs = x + shift.to(x.dtype)      only the sign of xs is used: for float16 and
//                                   bfloat16 x the sum is formed in float32, whose
//                                   sign equals the sign of the rounded sum
//                                   (a nonzero sum of two values of one format
//                                   never rounds to zero; x - x is +0 either way)
//   dot = K - 2 * popcount(sgn bits(xs) XOR W bits)
//   y   = float32(dot) * (float32(act_scale) * float32(w_scale)) + float32(bias),
//         rounded to the output dtype (bie_bgemm's epilogue)
//
// Safety: every extent bie_bgemm relies on is derived from the tensors here
// and checked against each other; bad arguments raise ValueError (before any
// native work); nothing is written outside the freshly allocated output and
// this call's scratch buffers.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/csrc/utils/pybind.h>

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

using pack_fn = int (*)(const bie_pack_args*);
using bgemm_fn = int (*)(const bie_bgemm_args*);
pack_fn g_pack = nullptr;
bgemm_fn g_bgemm = nullptr;

// Work (rows x panels x words) below which the GEMM runs as one task on the
// calling thread: waking the thread pool costs more than such a GEMM.
constexpr int64_t kSerialWork = int64_t{1} << 14;
// Elements of x below which x + shift is formed here (one pass, no allocation)
// rather than by at::add (parallel, but ~1 µs of dispatch).
constexpr int64_t kLocalShift = int64_t{1} << 16;
// GIL released above this much work (releasing costs more than tiny calls).
constexpr int64_t kReleaseGil = int64_t{1} << 15;

[[noreturn]] void bad(const std::string& msg) { throw py::value_error("bie native binary_linear (fused): " + msg); }

// one float32 value of a float tensor, as the reference's .to(torch.float32)
float load_f32(const at::Tensor& t, int64_t i) {
  const void* p = t.const_data_ptr();
  switch (t.scalar_type()) {
    case at::kFloat: return static_cast<const float*>(p)[i];
    case at::kHalf: return bie_f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case at::kBFloat16: return bie_bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    default: bad("unsupported dtype");
  }
}

// n float32 values of a contiguous float tensor (one dtype switch, not one per value)
void load_f32_n(const at::Tensor& t, float* out, int64_t n) {
  const void* p = t.const_data_ptr();
  switch (t.scalar_type()) {
    case at::kFloat: std::memcpy(out, p, (size_t)n * sizeof(float)); return;
    case at::kHalf:
      for (int64_t i = 0; i < n; ++i) out[i] = bie_f16_to_f32(static_cast<const uint16_t*>(p)[i]);
      return;
    case at::kBFloat16:
      for (int64_t i = 0; i < n; ++i) out[i] = bie_bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
      return;
    default: bad("unsupported dtype");
  }
}

// a float value rounded to x's dtype and back (shift.to(x.dtype)), as float32
float round_to(int64_t code, float v) {
  if (code == BIE_F16) return bie_f16_to_f32(bie_f32_to_f16(v));
  if (code == BIE_BF16) return bie_bf16_to_f32(bie_f32_to_bf16(v));
  return v;
}

void check_float(const at::Tensor& t, const char* name) {
  if (t.device().type() != c10::DeviceType::CPU) bad(std::string(name) + " must be a CPU tensor");
  if (dtype_code(t.scalar_type()) < 0) bad(std::string(name) + " must be float32, float16 or bfloat16");
}

void check_rc(int rc) {
  if (rc == BIE_ENOMEM) throw std::bad_alloc();
  if (rc) throw std::runtime_error("bie native binary_linear (fused) failed: error " + std::to_string(rc));
}

// The row and panel blocks of the GEMM (as kernels.py's _blocks): shrink them
// until every thread has work, unless the whole GEMM is too small for threads.
void blocking(int64_t m, int64_t p, int64_t kw, int64_t& mb, int64_t& pb) {
  if (m * p * kw <= kSerialWork) {
    mb = m > 0 ? m : 1;
    pb = p > 0 ? p : 1;
    return;
  }
  mb = 64;
  pb = 16;
  shrink_blocks(m, p, mb, pb);
}

at::Tensor binary_linear_rows(const at::Tensor& x, const std::optional<at::Tensor>& shift, const at::Tensor& w,
                              const at::Tensor& panels, int64_t k, const std::optional<at::Tensor>& act_scale,
                              const std::optional<at::Tensor>& w_scale, const std::optional<at::Tensor>& bias,
                              int64_t out_code) {
  if (!g_pack || !g_bgemm) bad("not initialised (bie_cpu_native is not loaded)");
  // ------------------------------------------------------------ checks
  check_float(x, "x");
  if (x.dim() != 2 || k < 1 || x.size(1) != k)
    bad("x must be (M, k) with k = " + std::to_string(k) + " >= 1, got " + std::to_string(x.dim()) + "-D");
  const int64_t xcode = dtype_code(x.scalar_type());
  const int64_t kb = (k + 7) / 8, m = x.size(0);
  if (w.device().type() != c10::DeviceType::CPU || w.scalar_type() != at::kByte || w.dim() != 2 || w.size(1) != kb)
    bad("w must be a CPU uint8 (N, ceil(k/8)) tensor");
  const int64_t n = w.size(0);
  const int64_t p = (n + 7) / 8, kw = (kb + 7) / 8;
  if (panels.device().type() != c10::DeviceType::CPU || panels.scalar_type() != at::kLong || panels.dim() != 3 ||
      !panels.is_contiguous() || panels.size(0) != p || panels.size(1) != kw || panels.size(2) != 8)
    bad("the prepared panels do not match w (expected (ceil(N/8), ceil(KB/8), 8) int64)");
  if (out_code != BIE_F32 && out_code != BIE_F16 && out_code != BIE_BF16 && out_code != BIE_I32)
    bad("unsupported out_dtype code " + std::to_string(out_code));
  const bool counts = out_code == BIE_I32;
  if (counts && (act_scale || w_scale || bias)) bad("integer counts take no scale or bias");
  at::Tensor sh;
  if (shift) {
    check_float(*shift, "shift");
    if (shift->numel() != k) bad("shift must have k elements");
    sh = shift->is_contiguous() ? *shift : shift->contiguous();
  }
  if (act_scale) {
    check_float(*act_scale, "act_scale");
    if (act_scale->numel() != 1) bad("act_scale must be one value");
  }
  at::Tensor ws;
  if (w_scale) {
    check_float(*w_scale, "w_scale");
    if (w_scale->numel() != 1 && w_scale->numel() != n) bad("w_scale must have 1 or N values");
    ws = w_scale->is_contiguous() ? *w_scale : w_scale->contiguous();
  }
  at::Tensor bs;
  if (bias) {
    check_float(*bias, "bias");
    if (bias->numel() != n) bad("bias must have N values");
    bs = bias->is_contiguous() ? *bias : bias->contiguous();
  }

  static const at::ScalarType out_types[] = {at::kFloat, at::kHalf, at::kBFloat16, at::kChar, at::kInt};
  at::Tensor out = at::empty({m, n}, at::TensorOptions().dtype(out_types[out_code]));
  if (m == 0 || n == 0) return out;

  // ------------------------------------------------------------ epilogue
  // scale = float32(act_scale) * float32(w_scale), one float32 multiply per
  // value (linear_scale in bie_core.ops.binary); bias as float32
  int64_t flags = 0;
  float s1 = 1.0f;
  Scratch<float, 256> svec(w_scale && ws.numel() > 1 ? n : 0), bvec(bias ? n : 0);
  if (act_scale || w_scale) {
    flags |= BIE_EPI_SCALE;
    const float sa = act_scale ? load_f32(*act_scale, 0) : 1.0f;
    if (w_scale && ws.numel() > 1) {
      flags |= BIE_EPI_SCALE_VEC;
      float* sv = svec.data();
      load_f32_n(ws, sv, n);
      if (act_scale)
        for (int64_t j = 0; j < n; ++j) sv[j] = sa * sv[j];
    } else {
      s1 = act_scale && w_scale ? sa * load_f32(ws, 0) : act_scale ? sa : load_f32(ws, 0);
    }
  }
  if (bias) {
    flags |= BIE_EPI_BIAS | BIE_EPI_BIAS_VEC;
    load_f32_n(bs, bvec.data(), n);
  }

  int64_t mb, pb;
  blocking(m, p, kw, mb, pb);
  std::unique_ptr<py::gil_scoped_release> nogil;
  if (m * k + m * p * kw > kReleaseGil) nogil = std::make_unique<py::gil_scoped_release>();

  // ------------------------------------------------------- x + shift, signs
  at::Tensor xc = x.stride(1) == 1 ? x : x.contiguous();
  const void* src = xc.const_data_ptr();
  int64_t src_code = xcode, ldx = xc.stride(0);
  const bool local_shift = shift && m * k <= kLocalShift;
  Scratch<float, 1024> xs_local(local_shift ? m * k : 0), sf(local_shift ? k : 0);
  at::Tensor xs_big;
  if (shift) {
    if (local_shift) {
      // float32 sum, shift first rounded to x's dtype (see the file comment)
      float* sfp = sf.data();
      load_f32_n(sh, sfp, k);
      if (xcode != BIE_F32 && sh.scalar_type() != x.scalar_type())
        for (int64_t j = 0; j < k; ++j) sfp[j] = round_to(xcode, sfp[j]);
      for (int64_t r = 0; r < m; ++r) {
        float* d = xs_local.data() + r * k;
        if (xcode == BIE_F32) {
          const float* s = static_cast<const float*>(src) + r * ldx;
          for (int64_t j = 0; j < k; ++j) d[j] = s[j] + sfp[j];
        } else {
          const uint16_t* s = static_cast<const uint16_t*>(src) + r * ldx;
          if (xcode == BIE_F16)
            for (int64_t j = 0; j < k; ++j) d[j] = bie_f16_to_f32(s[j]) + sfp[j];
          else
            for (int64_t j = 0; j < k; ++j) d[j] = bie_bf16_to_f32(s[j]) + sfp[j];
        }
      }
      src = xs_local.data();
      src_code = BIE_F32;
      ldx = k;
    } else {
      // large inputs: exactly the reference's x + shift.to(x.dtype), in parallel
      xs_big = xc.add(sh.to(x.scalar_type()).reshape({k}));
      src = xs_big.const_data_ptr();
      ldx = xs_big.stride(0);
    }
  }
  Scratch<uint8_t, 4096> bits((size_t)(m * kb));
  bie_pack_args pa{src, src_code, m, k, ldx, bits.data()};
  check_rc(g_pack(&pa));

  // ------------------------------------------------------------ GEMM
  bie_bgemm_args ga{bits.data(), kb, static_cast<const uint64_t*>(panels.const_data_ptr()), m, n, k, kb, kw, p,
                    mb, pb, (flags & BIE_EPI_SCALE_VEC) ? svec.data() : (flags & BIE_EPI_SCALE) ? &s1 : nullptr,
                    bias ? bvec.data() : nullptr, flags, counts ? (int64_t)BIE_I32 : out_code, out.data_ptr()};
  check_rc(g_bgemm(&ga));
  return out;
}

void init(uintptr_t pack, uintptr_t bgemm, int64_t abi) {
  if (abi != BIE_NATIVE_ABI)
    throw std::runtime_error("bie_cpu_native ABI " + std::to_string(abi) + " != " + std::to_string(BIE_NATIVE_ABI));
  g_pack = reinterpret_cast<pack_fn>(pack);
  g_bgemm = reinterpret_cast<bgemm_fn>(bgemm);
}

at::Tensor noop(const at::Tensor& x) { return x; }
}  // namespace

void bie_register_plans(py::module_& m);  // fused_plans.cpp

// x of any rank: its rows are the last dim, the output has x's shape with N there (a layer's bound call passes a
// model's (batch, tokens, features) activations as they are: reshaping in C++ costs far less than in Python)
at::Tensor binary_linear(const at::Tensor& x, const std::optional<at::Tensor>& shift, const at::Tensor& w,
                         const at::Tensor& panels, int64_t k, const std::optional<at::Tensor>& act_scale,
                         const std::optional<at::Tensor>& w_scale, const std::optional<at::Tensor>& bias,
                         int64_t out_code) {
  if (x.dim() == 2 || x.dim() < 1 || x.size(-1) != k)
    return binary_linear_rows(x, shift, w, panels, k, act_scale, w_scale, bias, out_code);   // (it checks x)
  at::Tensor out = binary_linear_rows(x.reshape({-1, k}), shift, w, panels, k, act_scale, w_scale, bias, out_code);
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = out.size(1);
  return out.view(sizes);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "bie-backend-cpu: fused inference binary_linear (pybind11; kernels from bie_cpu_native)";
  m.attr("abi") = BIE_NATIVE_ABI;
  m.def("init", &init, "hand over bie_pack / bie_bgemm of the loaded bie_cpu_native library");
  m.def("binary_linear", &binary_linear, py::arg("x"), py::arg("shift"), py::arg("w"), py::arg("panels"),
        py::arg("k"), py::arg("act_scale"), py::arg("w_scale"), py::arg("bias"), py::arg("out_code"));
  m.def("noop", &noop, "returns its argument (measures the call overhead)");
  bie_register_plans(m);
}
