// torch bindings of the binary CUTLASS kernels (namespace torch.ops.bie_cutlass_binary).
// Every argument is checked here (TORCH_CHECK -> Python RuntimeError); the kernels never read or
// write outside the tensors they are given.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <vector>

#include "binary_common.h"

namespace bie_cutlass_bin {
namespace {

int dt_code(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return kF32;
    case at::kHalf: return kF16;
    case at::kBFloat16: return kBF16;
    case at::kInt: return kI32;
    case at::kChar: return kI8;
    default: TORCH_CHECK(false, "bie_cutlass_binary: unsupported dtype ", t);
  }
  return -1;
}

// Bytes from t's data pointer to the end of its storage.
int64_t avail_bytes(const at::Tensor& t) {
  return (int64_t)t.storage().nbytes() - (int64_t)t.storage_offset() * (int64_t)t.element_size();
}

void check_cuda(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), "bie_cutlass_binary: ", name, " must be a CUDA tensor");
}

void cuda_ok(cudaError_t e, const char* what) {
  TORCH_CHECK(e == cudaSuccess, "bie_cutlass_binary: ", what, " failed: ", cudaGetErrorString(e));
}

// The operand geometry gemm and wgemm read from geo (M, N, K bits, batch, lda / ldb bits, a / b batch
// strides in bytes, row / col term batch strides), checked against a, b and out: CUDA tensors, sizes in range
// (batch <= 65535: the grid's z), K, lda and ldb multiples of 128 bits (>= K), 16-byte aligned operands and
// batch strides, and a and b large enough for every row read. fn names the caller in the messages.
struct OperandGeo {
  int64_t M, N, K, batch, lda, ldb, a_bs, b_bs, row_bs, col_bs;
};

OperandGeo checked_operands(const char* fn, const at::Tensor& a, const at::Tensor& b, const at::Tensor& out,
                            at::IntArrayRef geo) {
  TORCH_CHECK(geo.size() == 17, fn, ": geo must have 17 values");
  check_cuda(a, "a");
  check_cuda(b, "b");
  check_cuda(out, "out");
  const OperandGeo o{geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7], geo[8], geo[9]};
  TORCH_CHECK(o.M > 0 && o.N > 0 && o.K > 0 && o.batch > 0 && o.batch <= 65535 && o.M < (1LL << 31) &&
                  o.N < (1LL << 31) && o.K < (1LL << 31),
              fn, ": bad sizes (batch must be <= 65535)");
  TORCH_CHECK(o.K % 128 == 0 && o.lda % 128 == 0 && o.ldb % 128 == 0 && o.lda >= o.K && o.ldb >= o.K &&
                  o.a_bs % 16 == 0 && o.b_bs % 16 == 0 && o.a_bs >= 0 && o.b_bs >= 0,
              fn, ": K, lda, ldb must be multiples of 128 bits (>= K), batch strides of 16 bytes");
  TORCH_CHECK(a.data_ptr() != nullptr && reinterpret_cast<uintptr_t>(a.data_ptr()) % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(b.data_ptr()) % 16 == 0,
              fn, ": operands must be 16-byte aligned");
  TORCH_CHECK((o.batch - 1) * o.a_bs + (o.M - 1) * (o.lda / 8) + o.K / 8 <= avail_bytes(a) &&
                  (o.batch - 1) * o.b_bs + (o.N - 1) * (o.ldb / 8) + o.K / 8 <= avail_bytes(b),
              fn, ": operand tensors too small for the geometry");
  return o;
}

// geo: M, N, K(bits, multiple of 128), batch, lda(bits), ldb(bits), a_bs(bytes), b_bs(bytes),
//      row_bs, col_bs, chan_row, chan_bs, halve, out_bs, out_ldm, out_p, out_sq
void gemm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& row_term, const at::Tensor& col_term,
          const c10::optional<at::Tensor>& s1, const c10::optional<at::Tensor>& s2,
          const c10::optional<at::Tensor>& bias, at::Tensor& out, at::IntArrayRef geo, int64_t cfg) {
  const OperandGeo o = checked_operands("bie_cutlass_binary.gemm", a, b, out, geo);
  c10::cuda::CUDAGuard guard(a.device());
  const int64_t M = o.M, N = o.N, K = o.K, batch = o.batch, row_bs = o.row_bs, col_bs = o.col_bs;
  TORCH_CHECK(row_term.scalar_type() == at::kInt && col_term.scalar_type() == at::kInt && row_term.is_contiguous() &&
                  col_term.is_contiguous(),
              "bie_cutlass_binary.gemm: terms must be contiguous int32");
  TORCH_CHECK(row_bs >= 0 && col_bs >= 0 && (batch - 1) * row_bs + M <= row_term.numel() &&
                  (batch - 1) * col_bs + N <= col_term.numel(),
              "bie_cutlass_binary.gemm: term vectors too short");
  EpiArgs e{};
  e.row_term = row_term.data_ptr<int>();
  e.row_bs = row_bs;
  e.col_term = col_term.data_ptr<int>();
  e.col_bs = col_bs;
  e.chan_row = (int)geo[10];
  e.chan_bs = geo[11];
  e.halve = (int)geo[12];
  const int64_t nchan = (e.chan_row ? M : N) + (batch - 1) * e.chan_bs;
  auto vec_arg = [&](const c10::optional<at::Tensor>& t, const char* nm, const void** p, int* dt, int* per) {
    *p = nullptr;
    *dt = kF32;
    *per = 0;
    if (!t.has_value()) return;
    const at::Tensor& v = *t;
    check_cuda(v, nm);
    TORCH_CHECK(v.is_contiguous() && (v.numel() == 1 || v.numel() >= nchan), "bie_cutlass_binary.gemm: ", nm,
                " must be contiguous with 1 or one value per output channel");
    *p = v.data_ptr();
    *dt = dt_code(v.scalar_type());
    TORCH_CHECK(*dt <= kBF16, "bie_cutlass_binary.gemm: ", nm, " must be floating");
    *per = v.numel() > 1;
  };
  vec_arg(s1, "s1", &e.s1, &e.s1_dt, &e.s1_per);
  vec_arg(s2, "s2", &e.s2, &e.s2_dt, &e.s2_per);
  int bias_per = 0;
  vec_arg(bias, "bias", &e.bias, &e.bias_dt, &bias_per);
  TORCH_CHECK(!bias.has_value() || bias_per || nchan == 1, "bie_cutlass_binary.gemm: bias needs one value per channel");
  e.has_scale = (e.s1 || e.s2) ? 1 : 0;
  const int out_dt = dt_code(out.scalar_type());
  TORCH_CHECK(out_dt <= kI32, "bie_cutlass_binary.gemm: out must be float32/float16/bfloat16/int32");
  TORCH_CHECK(out_dt != kI32 || (!e.has_scale && !e.bias), "bie_cutlass_binary.gemm: int32 output takes no scale/bias");
  e.out = out.data_ptr();
  e.out_bs = geo[13];
  e.out_ldm = geo[14];
  e.out_p = geo[15];
  e.out_sq = geo[16];
  {  // the largest element offset written must lie inside out
    int64_t last = (batch - 1) * e.out_bs + (M - 1) * e.out_ldm;
    if (e.out_p > 0) last += ((N - 1) / e.out_p) * e.out_sq + (N - 1) % e.out_p;
    else last += N - 1;
    TORCH_CHECK(e.out_bs >= 0 && e.out_ldm >= 0 && e.out_sq >= 0 && e.out_p >= 0 &&
                    (last + 1) * out.element_size() <= avail_bytes(out),
                "bie_cutlass_binary.gemm: output too small for the geometry");
  }
  const int F = 16 / (int)out.element_size();
  e.vec_ok = reinterpret_cast<uintptr_t>(out.data_ptr()) % 16 == 0 && e.out_bs % F == 0 && e.out_ldm % F == 0 &&
             (e.out_p == 0 || (e.out_p % F == 0 && e.out_sq % F == 0));
  GemmArgs g{};
  g.a = a.data_ptr();
  g.b = b.data_ptr();
  g.M = (int)M;
  g.N = (int)N;
  g.K = (int)K;
  g.batch = (int)batch;
  g.lda = o.lda;
  g.ldb = o.ldb;
  g.a_bs = o.a_bs;
  g.b_bs = o.b_bs;
  g.epi = e;
  cuda_ok(run_gemm(g, (int)cfg, out_dt, at::cuda::getCurrentCUDAStream()), "binary GEMM");
}

// The Hopper wgmma GEMM (sm_90a), same arguments as gemm (geo: the same 17 values) with the
// restrictions of its TMA epilogue: no NCHW scatter (out_p 0), no halving, channels on columns,
// float32 s1 / s2 / bias, a 16-byte aligned output with 16-byte aligned rows and batches.
void wgemm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& row_term, const at::Tensor& col_term,
           const c10::optional<at::Tensor>& s1, const c10::optional<at::Tensor>& s2,
           const c10::optional<at::Tensor>& bias, at::Tensor& out, at::IntArrayRef geo, int64_t cfg) {
  const OperandGeo o = checked_operands("bie_cutlass_binary.wgemm", a, b, out, geo);
  c10::cuda::CUDAGuard guard(a.device());
  const int64_t M = o.M, N = o.N, K = o.K, batch = o.batch, row_bs = o.row_bs, col_bs = o.col_bs;
  // configurations from kWgCountedFirst count K - 2 popc(a row) themselves: row_term is not read
  const bool counted = cfg >= kWgCountedFirst;
  TORCH_CHECK(row_term.scalar_type() == at::kInt && col_term.scalar_type() == at::kInt && row_term.is_contiguous() &&
                  col_term.is_contiguous() && row_bs >= 0 && col_bs >= 0 &&
                  (counted || (batch - 1) * row_bs + M <= row_term.numel()) && (batch - 1) * col_bs + N <= col_term.numel(),
              "bie_cutlass_binary.wgemm: bad term vectors");
  TORCH_CHECK(geo[10] == 0 && geo[12] == 0 && geo[15] == 0,
              "bie_cutlass_binary.wgemm: channels must be columns, no halving, no NCHW scatter");
  const int out_dt = dt_code(out.scalar_type());
  TORCH_CHECK(out_dt <= kI32, "bie_cutlass_binary.wgemm: out must be float32/float16/bfloat16/int32");
  const int64_t d_bs = geo[13], ldd = geo[14];
  const int64_t F = 16 / (int64_t)out.element_size();
  TORCH_CHECK(reinterpret_cast<uintptr_t>(out.data_ptr()) % 16 == 0 && ldd % F == 0 && d_bs % F == 0 && ldd >= N &&
                  d_bs >= 0 && ((batch - 1) * d_bs + (M - 1) * ldd + N) * out.element_size() <= avail_bytes(out),
              "bie_cutlass_binary.wgemm: output must be 16-byte aligned (rows and batches) and large enough");
  WgArgs g{};
  auto fvec = [&](const c10::optional<at::Tensor>& t, const char* nm, const float** p, int* vec) {
    *p = nullptr;
    *vec = 0;
    if (!t.has_value()) return;
    check_cuda(*t, nm);
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && (t->numel() == 1 || t->numel() >= N),
                "bie_cutlass_binary.wgemm: ", nm, " must be contiguous float32 with 1 or N values");
    TORCH_CHECK(reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0, "bie_cutlass_binary.wgemm: ", nm,
                " must be 16-byte aligned");
    *p = t->data_ptr<float>();
    *vec = t->numel() > 1;
  };
  int bias_vec = 0;
  fvec(s1, "s1", &g.s1, &g.s1_vec);
  fvec(s2, "s2", &g.s2, &g.s2_vec);
  fvec(bias, "bias", &g.bias, &bias_vec);
  TORCH_CHECK(!bias.has_value() || bias_vec || N == 1, "bie_cutlass_binary.wgemm: bias needs N values");
  TORCH_CHECK(out_dt != kI32 || (!g.s1 && !g.s2 && !g.bias), "bie_cutlass_binary.wgemm: int32 output takes no scale/bias");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(row_term.data_ptr()) % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(col_term.data_ptr()) % 16 == 0,
              "bie_cutlass_binary.wgemm: term vectors must be 16-byte aligned");
  g.a = a.data_ptr();
  g.b = b.data_ptr();
  g.d = out.data_ptr();
  g.M = (int)M;
  g.N = (int)N;
  g.Kb = (int)(K / 8);
  g.L = (int)batch;
  g.lda = o.lda / 8;
  g.ldb = o.ldb / 8;
  g.a_bs = o.a_bs;
  g.b_bs = o.b_bs;
  g.ldd = ldd;
  g.d_bs = d_bs;
  g.row_term = row_term.data_ptr<int>();
  g.row_bs = row_bs;
  g.col_term = col_term.data_ptr<int>();
  g.col_bs = col_bs;
  g.device = a.device().index();
  g.sm_count = at::cuda::getDeviceProperties(g.device)->multiProcessorCount;
  auto stream = at::cuda::getCurrentCUDAStream();
  size_t ws = 0;
  std::string err = run_wgmma(g, (int)cfg, out_dt, &ws, stream);
  TORCH_CHECK(err.empty(), "bie_cutlass_binary.wgemm: ", err);
  at::Tensor wst;
  if (ws > 0) {
    wst = at::empty({(int64_t)ws}, a.options().dtype(at::kByte));
    g.workspace = wst.data_ptr();
  }
  err = run_wgmma(g, (int)cfg, out_dt, nullptr, stream);
  TORCH_CHECK(err.empty(), "bie_cutlass_binary.wgemm: ", err);
}

// x (rows, K) floating; shift (K,) of x's dtype or None; words (rows, ldw) int32; term (rows,) int32
void pack_act(const at::Tensor& x, const c10::optional<at::Tensor>& shift, at::Tensor& words, at::Tensor& term,
              int64_t K) {
  check_cuda(x, "x");
  c10::cuda::CUDAGuard guard(x.device());
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K && K > 0, "bie_cutlass_binary.pack_act: x must be (rows, K)");
  const int dt = dt_code(x.scalar_type());
  TORCH_CHECK(dt <= kBF16, "bie_cutlass_binary.pack_act: x must be floating");
  const int64_t rows = x.size(0);
  TORCH_CHECK(words.scalar_type() == at::kInt && words.dim() == 2 && words.size(0) == rows &&
                  words.size(1) * 32 >= K && words.stride(1) == 1,
              "bie_cutlass_binary.pack_act: bad words buffer");
  TORCH_CHECK(term.scalar_type() == at::kInt && term.is_contiguous() && term.numel() >= rows,
              "bie_cutlass_binary.pack_act: bad term buffer");
  const void* sp = nullptr;
  int64_t ssk = 0;
  if (shift.has_value()) {
    TORCH_CHECK(shift->scalar_type() == x.scalar_type() && shift->dim() == 1 && shift->numel() == K,
                "bie_cutlass_binary.pack_act: shift must be (K,) of x's dtype");
    check_cuda(*shift, "shift");
    sp = shift->data_ptr();
    ssk = shift->stride(0);
  }
  const int es = (int)x.element_size();
  const bool vec = x.stride(1) == 1 && (x.stride(0) * es) % 16 == 0 && reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0 &&
                   (sp == nullptr || (ssk == 1 && reinterpret_cast<uintptr_t>(sp) % 16 == 0));
  cuda_ok(launch_pack_act(x.data_ptr(), dt, x.stride(0), x.stride(1), sp, ssk,
                          reinterpret_cast<uint32_t*>(words.data_ptr<int>()), words.stride(0), (int)words.size(1),
                          term.data_ptr<int>(), (int)rows, (int)K, vec ? 1 : 0, at::cuda::getCurrentCUDAStream()),
          "pack_act");
}

// a (B, R, KB) uint8 (any strides); out (B*R, copies*KBo) uint8 or None; term (B*R,) int32
void rows(const at::Tensor& a, const c10::optional<at::Tensor>& out, at::Tensor& term, int64_t K, int64_t KBo,
          int64_t copies, int64_t c0, int64_t c1) {
  check_cuda(a, "a");
  c10::cuda::CUDAGuard guard(a.device());
  TORCH_CHECK(a.dim() == 3 && a.scalar_type() == at::kByte, "bie_cutlass_binary.rows: a must be (B, R, KB) uint8");
  const int64_t nb = a.size(0), R = a.size(1), KB = a.size(2);
  TORCH_CHECK(K > 0 && KB == (K + 7) / 8, "bie_cutlass_binary.rows: KB does not match K");
  TORCH_CHECK(term.scalar_type() == at::kInt && term.is_contiguous() && term.numel() >= nb * R,
              "bie_cutlass_binary.rows: bad term buffer");
  uint8_t* op = nullptr;
  int64_t ldo = 0;
  if (out.has_value()) {
    TORCH_CHECK(out->scalar_type() == at::kByte && out->dim() == 2 && out->size(0) == nb * R && out->stride(1) == 1 &&
                    KBo >= KB && copies >= 1 && copies <= 2 && out->size(1) >= copies * KBo,
                "bie_cutlass_binary.rows: bad out buffer");
    op = out->data_ptr<uint8_t>();
    ldo = out->stride(0);
  } else {
    KBo = KB;
  }
  const bool vec = op == nullptr && a.stride(2) == 1 && KB % 16 == 0 && K % 8 == 0 && a.stride(1) % 16 == 0 &&
                   a.stride(0) % 16 == 0 && reinterpret_cast<uintptr_t>(a.data_ptr()) % 16 == 0;
  cuda_ok(launch_rows(a.data_ptr<uint8_t>(), a.stride(0), a.stride(1), a.stride(2), (int)nb, (int)R, (int)KB, (int)K,
                      op, ldo, (int)KBo, (int)copies, term.data_ptr<int>(), (int)c0, (int)c1, vec ? 1 : 0,
                      at::cuda::getCurrentCUDAStream()),
          "rows");
}

// x (N, C, H, W) any strides; xb and ppop (N*H*W, G*Cgw) int32
void pack_channels(const at::Tensor& x, at::Tensor& xb, at::Tensor& ppop, int64_t G, int64_t Cgw) {
  check_cuda(x, "x");
  c10::cuda::CUDAGuard guard(x.device());
  TORCH_CHECK(x.dim() == 4 && G >= 1 && x.size(1) % G == 0, "bie_cutlass_binary.pack_channels: bad x / groups");
  const int64_t Cg = x.size(1) / G;
  TORCH_CHECK(Cgw * 32 >= Cg && Cgw >= 1, "bie_cutlass_binary.pack_channels: Cgw too small");
  TORCH_CHECK(xb.scalar_type() == at::kInt && xb.is_contiguous() &&
                  xb.numel() >= x.size(0) * x.size(2) * x.size(3) * G * Cgw,
              "bie_cutlass_binary.pack_channels: bad xb buffer");
  TORCH_CHECK(ppop.scalar_type() == at::kInt && ppop.is_contiguous() &&
                  ppop.numel() >= x.size(0) * x.size(2) * x.size(3) * G * Cgw,
              "bie_cutlass_binary.pack_channels: bad ppop buffer");
  cuda_ok(launch_pack_channels(x.data_ptr(), dt_code(x.scalar_type()), (int)x.size(0), (int)x.size(1), (int)x.size(2),
                               (int)x.size(3), x.stride(0), x.stride(1), x.stride(2), x.stride(3), (int)G, (int)Cgw,
                               reinterpret_cast<uint32_t*>(xb.data_ptr<int>()), ppop.data_ptr<int>(),
                               at::cuda::getCurrentCUDAStream()),
          "pack_channels");
}

// geo: N, H, W, G, Cg, Cgw, kh, kw, sh, sw, ph, pw, dh, dw, Ho, Wo, KWh, copies, pad_mode, c0
void gather(const at::Tensor& xb, const at::Tensor& ppop, at::Tensor& cols, at::Tensor& term, at::IntArrayRef geo) {
  check_cuda(xb, "xb");
  c10::cuda::CUDAGuard guard(xb.device());
  TORCH_CHECK(geo.size() == 20, "bie_cutlass_binary.gather: geo must have 20 values");
  GatherArgs g{};
  int* f[] = {&g.N, &g.H, &g.W, &g.G, &g.Cg, &g.Cgw, &g.kh, &g.kw, &g.sh, &g.sw,
              &g.ph, &g.pw, &g.dh, &g.dw, &g.Ho, &g.Wo, &g.KWh, &g.copies, &g.pad_mode, &g.c0};
  for (int i = 0; i < 20; ++i) {
    TORCH_CHECK(geo[i] >= 0 && geo[i] < (1LL << 31), "bie_cutlass_binary.gather: bad geometry");
    *f[i] = (int)geo[i];
  }
  TORCH_CHECK(g.kh * g.kw * g.Cgw <= g.KWh && (g.copies == 1 || g.copies == 2) && g.Cgw * 32 >= g.Cg,
              "bie_cutlass_binary.gather: inconsistent geometry");
  const int64_t rows = (int64_t)g.G * g.N * g.Ho * g.Wo;
  TORCH_CHECK(xb.scalar_type() == at::kInt && xb.is_contiguous() &&
                  xb.numel() >= (int64_t)g.N * g.H * g.W * g.G * g.Cgw,
              "bie_cutlass_binary.gather: bad xb");
  TORCH_CHECK(ppop.scalar_type() == at::kInt && ppop.is_contiguous() &&
                  ppop.numel() >= (int64_t)g.N * g.H * g.W * g.G * g.Cgw,
              "bie_cutlass_binary.gather: bad ppop");
  TORCH_CHECK(rows * g.kh * g.kw < (1LL << 31) && rows < (1LL << 31), "bie_cutlass_binary.gather: too many rows");
  TORCH_CHECK(cols.scalar_type() == at::kInt && cols.is_contiguous() &&
                  cols.numel() >= rows * g.KWh * g.copies,
              "bie_cutlass_binary.gather: bad cols buffer");
  TORCH_CHECK(term.scalar_type() == at::kInt && term.is_contiguous() && term.numel() >= rows,
              "bie_cutlass_binary.gather: bad term buffer");
  cuda_ok(launch_gather(reinterpret_cast<const uint32_t*>(xb.data_ptr<int>()), ppop.data_ptr<int>(), g,
                        reinterpret_cast<uint32_t*>(cols.data_ptr<int>()), term.data_ptr<int>(),
                        at::cuda::getCurrentCUDAStream()),
          "gather");
}

}  // namespace
}  // namespace bie_cutlass_bin

TORCH_LIBRARY(bie_cutlass_binary, m) {
  m.def("gemm(Tensor a, Tensor b, Tensor row_term, Tensor col_term, Tensor? s1, Tensor? s2, Tensor? bias, "
        "Tensor(a!) out, int[] geo, int cfg) -> ()");
  m.def("wgemm(Tensor a, Tensor b, Tensor row_term, Tensor col_term, Tensor? s1, Tensor? s2, Tensor? bias, "
        "Tensor(a!) out, int[] geo, int cfg) -> ()");
  m.def("pack_act(Tensor x, Tensor? shift, Tensor(a!) words, Tensor(b!) term, int K) -> ()");
  m.def("rows(Tensor a, Tensor(a!)? out, Tensor(b!) term, int K, int KBo, int copies, int c0, int c1) -> ()");
  m.def("pack_channels(Tensor x, Tensor(a!) xb, Tensor(b!) ppop, int G, int Cgw) -> ()");
  m.def("gather(Tensor xb, Tensor ppop, Tensor(a!) cols, Tensor(b!) term, int[] geo) -> ()");
}

TORCH_LIBRARY_IMPL(bie_cutlass_binary, CUDA, m) {
  m.impl("gemm", &bie_cutlass_bin::gemm);
  m.impl("wgemm", &bie_cutlass_bin::wgemm);
  m.impl("pack_act", &bie_cutlass_bin::pack_act);
  m.impl("rows", &bie_cutlass_bin::rows);
  m.impl("pack_channels", &bie_cutlass_bin::pack_channels);
  m.impl("gather", &bie_cutlass_bin::gather);
}
