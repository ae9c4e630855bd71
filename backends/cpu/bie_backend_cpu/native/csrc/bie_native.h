// bie-backend-cpu native kernels: argument blocks shared by the ISA variants
// and the C entry points (called from Python through ctypes).
//
// Every struct holds only 64-bit integers and pointers, so the Python mirror
// (ctypes.Structure) has the same layout on every 64-bit ABI. Python
// validates every size before a call; the kernels trust these fields and
// never touch memory outside the extents they describe.
#pragma once
#include <stddef.h>
#include <stdint.h>

#define BIE_NATIVE_ABI 7

enum bie_dtype { BIE_F32 = 0, BIE_F16 = 1, BIE_BF16 = 2, BIE_I8 = 3, BIE_I32 = 4 };

// epilogue flags: y = float(acc) [* scale] [+ bias], scale/bias per column
// (GEMM) or per row (conv: one value per output channel).
enum { BIE_EPI_SCALE = 1, BIE_EPI_SCALE_VEC = 2, BIE_EPI_BIAS = 4, BIE_EPI_BIAS_VEC = 8 };

// error codes (0 = ok)
enum { BIE_OK = 0, BIE_ENOMEM = 1, BIE_EEXCEPTION = 2, BIE_EBADARG = 3, BIE_EINDEX = 4 };

// int GEMM weight layouts (which one a level uses: bie_int_layout())
enum { BIE_INT_ROWS = 0,      // b as given: (N, K) int8 row-major
       BIE_INT_MADD8 = 1,     // (P, K2/2, 8, 2) int16, P = ceil(N/8)   [AVX2]
       BIE_INT_MADD16 = 2,    // (P, K2/2, 16, 2) int16, P = ceil(N/16) [AVX-512]
       BIE_INT_VNNI16 = 3 };  // (P, K4/4, 16, 4) int8 + colsum          [AVX-512 VNNI]

typedef struct {
  const void* x;      // rows of k elements of dtype; element stride 1
  int64_t dtype;
  int64_t rows, k;
  int64_t ldx;        // row stride in elements
  uint8_t* out;       // (rows, ceil(k/8)) contiguous
} bie_pack_args;

typedef struct {
  const uint8_t* a;   // (M, KB) packed rows, byte stride 1
  int64_t lda;        // row stride in bytes
  const uint64_t* bp; // (P, KW, 8) panels of 8 columns, zero padded
  int64_t M, N, K, KB, KW, P;
  int64_t mb, pb;     // rows / panels per task
  const float* scale; // float32: 1 value or N values (flags say which)
  const float* bias;  // float32: N values
  int64_t flags, out_type;
  void* out;          // (M, N) contiguous of out_type
} bie_bgemm_args;

typedef struct {
  const void* x;      // (N, C, H, W) with element strides sN, sC, sH, sW
  int64_t dtype;
  int64_t N, C, H, W;
  int64_t sN, sC, sH, sW;
  int64_t G, Cg, CW;  // groups, channels per group, 64-bit words per group
  int64_t ph, pw, Hp, Wp;
  uint64_t* xs;       // (N, Hp, Wp, G*CW) sign bits, zero initialised
  int64_t hrows;      // input rows per task
} bie_bconv_pack_args;

typedef struct {
  const uint64_t* xs; // as produced by bie_bconv_pack_args
  int64_t N, H, W, Hp, Wp, G, CW;
  const uint64_t* w;  // (O, KH*KW*CW) weight bits, tap-major, channel bits in the words
  const int32_t* taps;// (O, KH*KW): sum over the channels of sgn(W) per tap
  int64_t O, Og, KH, KWk, sh, sw, ph, pw, dh, dw, Ho, Wo, K;
  int64_t padmul;     // pad_value + 1 (0, 1 or 2)
  int64_t pix;        // output pixels per task (multiple of 8)
  const float* scale; const float* bias;  // per output channel (or one value)
  int64_t flags, out_type;
  void* out;          // (N, O, Ho, Wo): contiguous, or with out_nhwc the (N, Ho, Wo, O) rows of a channels_last tensor
  int64_t out_nhwc;
} bie_bconv_args;

typedef struct {
  const int8_t* a;    // (M, K), byte stride 1
  int64_t lda;
  const void* bl;     // weight layout (see BIE_INT_*)
  const int32_t* colsum;  // VNNI: per column sum of b (P*16 entries)
  int64_t layout, M, N, K, Kp, P, PW;
  int64_t mb, pb;
  const float* scale; const float* bias;
  int64_t flags, out_type;
  void* out;          // (M, N) contiguous
  // dynamic int8 linear (null/0 otherwise): acc += cmul * ccorr[n] (exact int32; the zero point and the
  // uint8 -> int8 shift of the activation codes), and the scale of row m is rscale[m * rs_stride] * scale[n]
  const float* rscale;
  int64_t rs_stride;
  const int32_t* ccorr;
  int64_t cmul;
} bie_igemm_args;

// dynamic activation quantization of float rows (dynamic_quantize_act):
// mode 0 (per_tensor_affine): q = clamp(rint(fma(x, inv, zp)), 0, qmax), stored as q - 128 (int8 operand);
// mode 1 (per_token_symmetric): s = amax|row| / 127 (1 if 0, NaN if the row has a NaN) written to
// rscale[m], q = clamp(rint(x / s), -127, 127). NaN codes are 0.
// mode 2: no codes; rscale[2m], rscale[2m + 1] = min and max of row m (both NaN if it holds a NaN).
typedef struct {
  const void* x;      // (M, K) rows of dtype, element stride 1, row stride ldx elements
  int64_t dtype, M, K, ldx, mode;
  double inv, zp;     // mode 0: float32 values carried as double
  int64_t qmax;
  int8_t* out;        // (M, K) contiguous
  float* rscale;      // mode 1: M values written; mode 2: 2 * M values
} bie_dquant_args;

typedef struct {
  const void* x;      // n contiguous elements of dtype (float types)
  int64_t dtype, n;
  double scale;       // float32 value, carried as double (when svec is null)
  int64_t lo, hi;
  int8_t* out;
  const float* svec;  // or: scale of element e is svec[e / inner] (n / inner values)
  int64_t inner;
  // or null: element e is first x[e] + shift[(e / sh_inner) % sh_period] (shift in x's dtype), the sum
  // rounded to x's dtype, as the op adds in x's dtype
  const void* shift;
  int64_t sh_inner, sh_period;
} bie_quant_args;

// lsq_backward of a contiguous (R, C) tensor v with the gradient prod (same shape), task t = rows
// [t * rows_per_task, (t + 1) * rows_per_task): with v' = v + shift (per column, in v's dtype) or v,
// q = float32(v') / s (s: scale[0], or scale[r] when rowwise), inside = lo <= q <= hi,
// Q = clamp(round_half_even(q), lo, hi) (NaN -> 0) and g = float32(prod) [* factor]:
// grad_v = inside ? g : 0 in v's dtype; codes = Q in codes_dtype (when codes is not null);
// part_scale[r] (rowwise) or part_scale[t] = sum of g * (Q - (inside ? q : 0)) over the row / the task,
// in double; part_shift[t * C + c] (when not null) = sum over the task's rows of grad_v as stored.
// Then, in task order: grad_scale = (its sums) / denom as float32 (R values, or one), and grad_shift[c] (when
// part_shift is not null) = the column's sum as float32.
typedef struct {
  const void* v;
  int64_t v_dtype;
  const void* prod;
  int64_t prod_dtype;
  const float* scale;
  const void* shift;       // C values of v's dtype, or null
  double factor;           // float32 value carried as double
  int64_t has_factor, R, C, lo, hi, rowwise, rows_per_task;
  void* grad_v;            // (R, C) of v's dtype
  void* codes;             // (R, C) of codes_dtype, or null
  int64_t codes_dtype;     // a float dtype
  double* part_scale;      // R values (rowwise) or one per task
  double* part_shift;      // (tasks, C), or null
  double denom;
  float* grad_scale;       // R values (rowwise) or one
  float* grad_shift;       // C values (when part_shift is not null)
} bie_lsq_args;

// batched int GEMM (int_bmm): item b uses a + b*sa, the weight layout at
// bl + b*sbl bytes, colsum + b*scol, out + b*M*N; g describes item 0.
typedef struct {
  bie_igemm_args g;
  int64_t batch, sa, sbl, scol;
} bie_ibmm_args;

// batched binary GEMM (binary_bmm): item b uses a + b*sa bytes, panels
// bp + b*sbp words, out + b*M*N; g describes item 0.
typedef struct {
  bie_bgemm_args g;
  int64_t batch, sa, sbp;
} bie_bbmm_args;

// int conv2d: implicit im2col of int8 x into the level's B panels (IPW
// pixels, k = (i*KW + j)*Cgp + c: per tap the group's channels padded to Cgp,
// a multiple of the level's k step; zero padding), times the weight rows
// prepared in the level's A format (iprep_row: u8 w^0x80 for VNNI, int16
// otherwise) in the same order, Kp = KH*KW*Cgp.
typedef struct {
  const int8_t* x;    // (N, C, H, W) int8 with element strides sN, sC = 1 (channels last), sH, sW
  int64_t N, C, H, W, sN, sC, sH, sW;
  const void* wl;     // (O, Kp) weight rows
  int64_t layout;     // bie_int_layout() the rows were prepared for
  int64_t O, G, Cg, Og, KH, KWk, sh, sw, ph, pw, dh, dw, Ho, Wo, K, Kp;
  int64_t pix;        // output pixels per task (multiple of 16)
  const float* scale; const float* bias;  // per output channel (or one value)
  int64_t flags, out_type;
  void* out;          // (N, O, Ho, Wo) contiguous, or with out_nhwc (N, Ho, Wo, O) contiguous (a channels_last
                      // NCHW tensor: the int_conv2d op's output for channels_last input)
  int64_t out_nhwc;
} bie_iconv_args;

// sign_embedding: out[l, j] = (bit j of bits[idx[l]] ? +s : -s), s = float32(scale[idx[l]]),
// converted to out_type; sign_embedding_bag (scale null, L = bags * per):
// out[b, j] = +1 if 2 * (number of set bits j over the bag's rows) >= per else -1.
typedef struct {
  const void* idx;    // L (or bags * per) contiguous indices
  int64_t idx64;      // 1: int64 indices, 0: int32
  int64_t L, per;     // rows out (bags), indices per row (1 for sign_embedding)
  const uint8_t* bits;// (V, KB) packed rows, row stride ldb bytes
  int64_t V, KB, ldb, D;
  const void* scale;  // V contiguous values of scale_dtype (sign_embedding), or null (bag)
  int64_t scale_dtype, out_type;
  void* out;          // (L, D) contiguous of out_type
} bie_semb_args;

// weight-only GEMM / dequantization (wq_*.cpp; layout described in wq_kernels.h)
typedef struct {
  const float* x;      // (M, Kp) float32 activations in the prepared row order (gemm only)
  int64_t M, N, Kp, P, G, bits;
  const int32_t* qw;   // (P, Kp/32, bits, 16) code words
  const float* s;      // (P, G, 16) scales
  const float* z;      // (P, G, 16) zero points as float32 (gptq: the code; gba: the float zero)
  const float* c;      // (P, G, 16) -s*z (gptq) or -z (gba)
  const int64_t* gb;   // G+1 block offsets: group g is blocks gb[g] .. gb[g+1]-1
  const float* xsum;   // (M, G) group sums of x: filled by the entry point (pass null)
  const float* bias;   // N float32 values or null (gemm only)
  int64_t format;      // 0 gptq, 1 gba
  float* out;          // gemm: (M, N) float32; dequant: (Kp, N) float32
} bie_wq_args;

// weight-only GEMM with bf16 dot products (wq_avx512bf16.cpp; layout there)
typedef struct {
  const void* x;       // (M, Kp) activations in the prepared row order, dtype xdt
  int64_t xdt;         // 0 bfloat16, 1 float16, 2 float32
  int64_t M, N, Kp, P, G, bits;
  const int32_t* qw;   // (P, Kp/32, bits, 16) code words, dot-product layout
  const float* s;      // (P, G, 16) scales
  const float* c;      // (P, G, 16) -s*z (gptq) or -z (gba)
  const int64_t* gb;   // G+1 block offsets: group g is blocks gb[g] .. gb[g+1]-1
  const float* bias;   // N float32 values or null
  float* out;          // (M, N) float32 result, or null (then only outx is written)
  void* outx;          // (M, N) result in the activations' dtype, or null
  int64_t nflag;       // written: rows left for the exact path (their outputs are NaN)
} bie_wqb_args;

// per-ISA range functions: process tasks [t0, t1); return 0 or an error code
typedef int (*bie_range_fn)(const void* args, int64_t t0, int64_t t1);

#define BIE_DECLARE_ISA(ns)                                                        \
  extern "C" int bie_##ns##_pack(const void*, int64_t, int64_t);                   \
  extern "C" int bie_##ns##_bconv_pack(const void*, int64_t, int64_t);             \
  extern "C" int bie_##ns##_quant(const void*, int64_t, int64_t);                  \
  extern "C" int bie_##ns##_bgemm(const void*, int64_t, int64_t);                  \
  extern "C" int bie_##ns##_bconv(const void*, int64_t, int64_t);                  \
  extern "C" int bie_##ns##_igemm(const void*, int64_t, int64_t);                  \
  extern "C" int bie_##ns##_iconv(const void*, int64_t, int64_t);                  \
  extern "C" int bie_##ns##_semb(const void*, int64_t, int64_t);                   \
  extern "C" int bie_##ns##_lsq(const void*, int64_t, int64_t);

// a variant's driver drv_<op> (internal linkage) exported as bie_<variant>_<op>
#define BIE_EXPORT(ns, op) \
  extern "C" int bie_##ns##_##op(const void* a, int64_t t0, int64_t t1) { return drv_##op(a, t0, t1); }
