// Host launchers implemented in the .cu files (raw pointers + stream; each
// returns the CUDA launch status).
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace bie {

enum DType : int { kF32 = 0, kF16 = 1, kBF16 = 2, kI8 = 3, kI32 = 4 };

struct BinGemmArgs {
  const uint8_t* a;
  const uint8_t* b;
  const int32_t* pw;
  int64_t lda, a_bs, ldb, b_bs;
  int M, N, K, KB;
  void* out;
  int out_dtype;
  const void* scale;
  int scale_dtype;
  int64_t scale_stride;
  const void* bias;
  int bias_dtype;
};

cudaError_t launch_pack_signs(const void* x, int dtype, uint8_t* out, int64_t rows, int64_t K, int64_t sr, int64_t sk,
                              cudaStream_t st);
cudaError_t launch_pack_signs_shifted(const void* x, const void* shift, int dtype, uint8_t* out, int64_t rows,
                                      int64_t K, int64_t KBp, cudaStream_t st);
cudaError_t launch_unpack_signs(const uint8_t* bits, int64_t rows, int64_t k, int64_t ldb, void* out, int dtype,
                                cudaStream_t st);
cudaError_t launch_row_popc(const uint8_t* b, int64_t ldb, int64_t rows, int64_t KB, int32_t* out, cudaStream_t st);
cudaError_t launch_binary_gemm_tc(const BinGemmArgs& p, int batch, int tile, int num_sms, cudaStream_t st);
cudaError_t launch_binary_gemm_simt(const BinGemmArgs& p, int batch, cudaStream_t st);
// binary_linear for few rows in one launch (binary.cu): the signs of x + shift taken by every block, then the
// popcount products against the prepared weight rows (ldb % 16 == 0, 16-byte aligned, readable up to the 16-byte
// boundary past ceil(K/8) bytes) with gemm.pw their popcounts; gemm.a unused.
constexpr int kBinGemvMaxM = 32;
struct BinGemvArgs {
  BinGemmArgs gemm;
  const void* x;        // (M, K) contiguous, float32 / float16 / bfloat16
  const void* shift;    // K values in x's dtype, or nullptr
};
size_t binary_gemv_smem(int M, int K);   // the launch's shared memory: M rows of sign words + their popcounts
constexpr int kBinGemvMaxK = 40960;
// the most shared memory a GEMV launch takes: the smallest opt-in limit of sm_80+ GPUs (99 KiB on sm_86 / sm_89), so
// that a call accepted on one GPU is accepted on every other (8 rows of kBinGemvMaxK: 40 KiB; 32 rows: K <= 25216)
constexpr int kBinGemvMaxSmem = 99 * 1024;
cudaError_t launch_binary_gemv(const BinGemvArgs& g, int dtype, int num_sms, cudaStream_t st);
// binary_linear for 1-32 rows on the 1-bit tensor cores in one launch (binary.cu, bgemm_tc_kernel's fused form):
// the blocks make the sign words of x + shift themselves (cc_major 9: shared by a cluster's blocks through
// distributed shared memory) and keep them in shared memory for the whole product, the
// weight as launch_binary_gemv's (gemm.pw its popcounts); shared memory as binary_linear_tc_smem, at most
// kBinGemvMaxSmem (32 rows: K <= 20992, 16 rows: K <= 42496).
constexpr int kBinTcFusedMaxM = 32;
size_t binary_linear_tc_smem(int M, int K);
cudaError_t launch_binary_linear_tc(const BinGemvArgs& g, int dtype, int cc_major, cudaStream_t st);
// sm_90a: b = the prepared wgmma weight image (binary_wgmma.cu), pw required, batch 1; cluster 0 (auto), 1, 2, 4
cudaError_t launch_binary_gemm_wgmma(const BinGemmArgs& p, int cluster, int num_sms, cudaStream_t st);
cudaError_t launch_sign_embedding(const void* idx, bool idx64, const uint8_t* bits, int64_t ldb, const void* scale,
                                  int scale_dtype, int64_t V, int64_t L, int64_t dim, void* out, int dtype,
                                  cudaStream_t st);
cudaError_t launch_sign_embedding_bag(const void* idx, bool idx64, const uint8_t* bits, int64_t ldb, int64_t V,
                                      int64_t nbags, int64_t L, int64_t dim, void* out, int dtype, cudaStream_t st);

// Direct binary conv2d (binary_conv.cu), groups == 1. Strides of x in elements; padded geometry Hp = H + 2 PH,
// Wp = W + 2 PW; CW = ceil(C / 32) sign words per pixel; KWORDS = KH * KW * CW words of K, KWP that rounded up to
// a multiple of 8 (one mma k step = 256 bits); K = C * KH * KW. pad_mode 0: pad -1, 1: +1, 2: 0.
// n / d and n % d for 0 <= n < 2^31 by a multiply and a shift (d fixed per launch: set with FastDiv::make)
struct FastDiv {
  uint32_t d, m, l;
  static FastDiv make(uint32_t d) {
    uint32_t l = 0;
    while ((1ull << l) < d) ++l;
    const uint32_t m = (uint32_t)(((1ull << 32) * ((1ull << l) - d)) / d + 1);
    return FastDiv{d, m, l};
  }
#ifdef __CUDACC__
  __device__ __forceinline__ int div(int n) const { return (int)((__umulhi((uint32_t)n, m) + (uint32_t)n) >> l); }
#endif
};

struct BinConvArgs {
  const void* x;
  int x_dtype;
  int64_t sn, sc, sh, sw;
  int N, C, H, W, PH, PW, Hp, Wp, CW, pad_mode;
  uint32_t* packed;  // [N][Hp][Wp][CW], written by launch_bconv_pack
  const uint32_t* wp;    // [O][KWP] weight words in (tap, channel word) order, 0 past C and past KWORDS
  const int32_t* wpop;   // [O] popcount of each weight row
  const int32_t* wtap;   // [O][KH * KW] popcount per tap (pad 0 only)
  int O, KH, KW, SH, SW, DH, DW, Ho, Wo, K, KWORDS, KWP;
  FastDiv div_plane, div_wo;   // by Ho * Wo and by Wo (set by the launcher)
  int max_delta;               // offset of a window's last word from its first (set by the launcher)
  int span_cap;                // words of the windows' range a block may stage in shared memory (launcher)
  void* out;  // (N, O, Ho, Wo) contiguous
  int out_dtype;
  const void* scale;
  int scale_dtype;
  int64_t scale_stride;
  const void* bias;
  int bias_dtype;
};
constexpr int kConvChunk = 32;  // weight words per pipelined shared-memory chunk (layers with more than 64 K words)
int conv_chunk_words(int kwp);
// conv tiles: 1 = 128 pixels x 64 channels, 2 = 128 x 32, 3 = 64 x 64, 4 = 64 x 32
size_t conv_smem_bytes(const BinConvArgs& p, int tile);   // dynamic shared memory (p.span_cap set)
int conv_span_bound(const BinConvArgs& p, int tile);
int conv_auto_tile(const BinConvArgs& p, int sms);
bool conv_auto_stage(const BinConvArgs& p);   // stage the windows in shared memory (tile 0)
cudaError_t launch_bconv_pack(const BinConvArgs& p, cudaStream_t st);
// stage_windows false: the A fragments always from global memory (tests of that path)
cudaError_t launch_bconv(const BinConvArgs& p, int tile, bool stage_windows, cudaStream_t st);

struct WqArgs {
  const void* x;
  const uint4* qw;
  const void* s;
  const void* zp;
  const float* s32;     // (G, Np) scales, float32
  const float* c32;     // (G, Np) MAGIC*s + zero terms, float32
  const void* bias;
  int bias_dtype;
  void* out;
  int out_dtype;
  float* ws;
  int* counters;
  int M, N, Np, K, G, gs_shift;
  int kblocks;
  int kb_per_split, splits;
  int order;            // grid order (0: column groups fastest, 1: K split fastest)
  int vec_stage;        // 16-byte x staging when K % 8 == 0
};

// Skinny weight-only kernel (M <= 16), see wq_skinny.cu.
constexpr int WQ_SKINNY_WARPS = 8;   // warps per block (16 columns each)
constexpr int WQ_SKINNY_SLOTS = 8;   // 16-byte cp.async ring slots per lane (power of two)
struct WqSkinnyArgs {
  const void* x;         // (M, K) compute dtype, contiguous
  const uint4* qw;       // A-fragment ordered codes
  const uint32_t* st;    // (G, Np) scale | zero << 16 (16-bit floats)
  const void* bias;
  int bias_dtype;
  void* out;
  int out_dtype;
  float* ws;
  int* counters;
  int M, N, Np, K, G, gs_shift;
  int kblocks;
  int kb_per_split, splits;
  int ngs_max, xld;      // statistics rows and x row stride (elements) staged per block
  int csum_ld;           // row stride of the per-k16-step sums of x
  int vec_x;             // cp.async x staging (K even, x 4-byte aligned)
  int st_bf16;           // statistics are bf16 (else fp16)
  int gptq;              // gptq (else gba) statistics
  int inter;             // interleaved weight layout (Np % 128 == 0)
  int pdl;               // programmatic dependent launch (sm_90): overlap the previous kernel's tail
};
int wq_skinny_plan(WqSkinnyArgs& p, int bits, int esize, int num_sms, int mult, int budget);
cudaError_t launch_wq_skinny_gemm(const WqSkinnyArgs& p, int bits, int cdtype, int smem, cudaStream_t st);

// Thin weight-only GEMV (M <= 16, 2/4/8-bit codes, groups >= 32 or per-channel), see wq_thin.cu.
struct WqThinArgs {
  const void* x;         // (M, K) compute dtype, contiguous, 16-byte aligned, K % 8 == 0
  const uint4* qw;       // A-fragment codes of the skinny kernel
  const uint32_t* st;    // (G, Np) scale | zero << 16 (16-bit floats)
  const void* bias;
  int bias_dtype;
  void* out;
  int out_dtype;
  int M, N, Np, K, G, gs_shift;
  int kblocks;
  int st_bf16;           // statistics are bf16 (else fp16)
  int gptq;              // gptq (else gba) statistics
  int inter;             // interleaved layout (Np % 128 == 0)
  int kstage;            // k per ring stage (128; 256 for 2-bit codes)
  int nstages;           // stages covering the prepared K
  int st_per_warp;       // stages per warp (whole groups)
  int warps;             // warps per block (the K split of one 16-column block)
  int grid_force;        // blocks (0: as many as are resident at once, unless the plan sets it; benchmarks sweep it)
  int smem_limit;        // dynamic shared memory a block may opt in to on this device
  int sms;               // multiprocessors of the device (set by the plan)
  int smem;              // dynamic shared memory per block (set by the plan)
  int pdl;               // programmatic dependent launch (sm_90): overlap the previous kernel's tail
  int mx;                // x staged once per block (1) or copied per stage (8) (set by the plan)
  int kslices;           // K slices (x staged per block over its slice; > 1: float32 partials in ws, summed after)
  int slice_stages;      // stages per K slice (nstages when not sliced)
  int cols;              // the warps of a block split the columns (each takes whole items over the slice), not K
  float* ws;             // (kslices, M, N) partials when kslices > 1
  unsigned* sem;         // with kslices > 1: one arrival counter per 16-column item, zero before the launch and left
                         // zero; the warp that writes an item's last partial sums its slices. nullptr: a reduction
                         // kernel after this one sums them (the same additions in the same order)
  int xpre;              // x staged per block: copied with cp.async after this many first ring stages, (-1)
                         // loaded after all of them through registers, or (-3, K slices on sm_90) copied by bulk
                         // copies in chunks that the warps wait for one by one (set by the plan unless forced)
  int bulk;              // the device has bulk (TMA-engine) copies and mbarriers (sm_90)
  int rr;                // with cols: the items dealt to the slice's blocks in turn (set by the plan)
  int xl;                // one row of x through registers: 16-byte loads in flight per thread (set by the plan)
  int deep;              // 4- / 8-bit codes, one row tile: the 8- / 4-stage ring instead of 4 / 3 (set by the plan)
  int xring;             // x through a ring of chunks of this many stages (0: the slice staged whole)
  int xring_r;           // the ring's chunks (at most THIN_XCHUNKS)
  int xring_d;           // the ring's producer issues a chunk's copies this many steps before it sums it
};
// slices_force: 0 = planned, > 0 = that many K slices (x staged per slice), -1 = never sliced
int wq_thin_plan(WqThinArgs& p, int bits, int num_sms, int warps_force, int slices_force);
// the most warps a thin block may have (16): warps_force's range
int wq_thin_max_warps();

// A kernel's dynamic shared memory limit and its occupancy depend only on (device, kernel, sizes), but setting or
// asking for them is a driver call that costs microseconds of host time: at decode-sized shapes that is a large part
// of a launch. Each is done once per key and remembered (bie_cuda.cpp). set_smem_limit only ever raises a kernel's
// limit, so that a launch with a larger size elsewhere keeps its own.
cudaError_t set_smem_limit(const void* kernel, int smem);
cudaError_t blocks_per_sm(int* blocks, const void* kernel, int threads, int smem);
// clusters of `cluster` blocks (along x) of a kernel that can be resident at once on the device (0: none fits)
cudaError_t active_clusters(int* clusters, const void* kernel, int threads, int smem, int cluster);
cudaError_t launch_wq_thin_gemm(const WqThinArgs& p, int bits, int cdtype, cudaStream_t st);

void wq_plan(int M, int Np, int kblocks, int num_sms, int mult, int* splits, int* kb_per_split);
cudaError_t launch_wq_gemm(const WqArgs& p, int bits, int cdtype, bool gptq, int num_sms, cudaStream_t st);
cudaError_t launch_wq_dequant(const uint4* qw, const void* s, const void* z, const int64_t* perm, int bits, int cdtype,
                              bool gptq, int N, int Np, int K, int G, int gs_shift, int kblocks, void* out,
                              cudaStream_t st);

// Hopper weight-only GEMM (wgmma with the codes as A from registers), see wq_wgmma.cu.
struct WqWgmmaArgs {
  const void* x;         // (M, K) compute dtype, contiguous, 16-byte aligned, K % 8 == 0
  const uint4* qw;       // interleaved A-fragment codes of the skinny kernel (Np % 128 == 0)
  const uint32_t* stw;   // (G, Np) s | zq << 16 in the checkpoint's 16-bit dtype (st_bf16)
  const void* bias;
  int bias_dtype;
  void* out;
  int out_dtype;
  int M, N, Np, K, G, gs_shift;
  int kblocks;
  int gptq;
  int ntok;              // rows of x per block: 16, 32, 64 or 128; WQ_ROWS_NTOK: the pipelined many-row kernel
  int st_bf16;           // statistics are bf16 (else fp16)
  int splits;            // K splits (1: direct epilogue; else float32 partials in ws, then a reduction)
  float* ws;             // (splits, M, N) when splits > 1; many-row kernel: (splits x tail tiles) planes of 256 x 128
  int whole_tiles;       // many-row kernel: tiles computed whole; the rest (the last partial wave) split `splits` ways in K
  int wq_rows_epi;           // many-row kernel: 16-bit outputs through shared memory in whole lines (N % 8 == 0), else direct
};
// ntok value selecting the pipelined kernel for many rows (wq_wgmma.cu: 4-bit codes, groups of 32 or
// more or per-channel; tiles of 256 rows x 128 columns, the last partial wave's tiles split in K)
constexpr int WQ_ROWS_NTOK = 256;
// the fewest code blocks (64 k each) a K part of a split tail tile may have (launcher's automatic split)
constexpr int WQ_ROWS_MIN_PART_STAGES = 8;
cudaError_t launch_wq_wgmma_gemm(const WqWgmmaArgs& p, int bits, int cdtype, int num_sms, cudaStream_t st);

// Fused per-token W8A8-dynamic GEMV (dynamic_gemv.cu): dynamic_int8_linear with scheme per_token_symmetric for
// 1 .. DYN_GEMV_MAX_M rows, quantization of x, int8 mma and epilogue in one launch; int_gemm (modes 1 and 2 below)
// for 1 .. INT_GEMV_MAX_M rows.
constexpr int DYN_GEMV_MAX_M = 16;
constexpr int INT_GEMV_MAX_M = 32;
struct DynGemvArgs {
  const void* x;         // (M, K) float32 / float16 / bfloat16, unit column stride
  int64_t ldx;           // row stride of x (elements)
  int x_vec;             // 16-byte loads of x (its start 16-byte aligned, and its row stride with more than one row)
  const int8_t* w;       // fragment-ordered codes: [ceil(N / 16)][ceil(K / 32)][32 lanes][16 bytes], zero padded
  const void* wscale;    // 1 or N values
  int wscale_dtype;
  int per_channel;       // wscale has N values
  const void* bias;      // N values or nullptr
  int bias_dtype;
  void* out;             // (M, N) contiguous, x's dtype
  int out_dtype;         // x's dtype code (the kernel is instantiated per dtype)
  int M, N, K;
  int pdl;               // programmatic dependent launch (sm_90): w must not be written by the previous kernel
  int nblocks, grid;     // channel blocks of 16, blocks of the launch (set by the launcher)
  // what x holds: 0 floats quantized per token (dynamic_int8_linear, up to DYN_GEMV_MAX_M rows); for int_gemm (up to
  // INT_GEMV_MAX_M rows) 1 floats quantized with the one scale *act_scale (quantize_int, after adding shift), 2 int8
  // codes (x_vec then means 8-byte loads).
  // Modes 1 and 2 end in int_gemm's epilogue: out_dtype kI32 for the sums, else float32(acc) * wscale (none: 1)
  // + bias in out_dtype.
  int mode;
  const float* act_scale;
  const void* shift;     // K values in x's dtype or nullptr (mode 1)
  int shift_vec;         // shift 16-byte aligned
  int qlo, qhi;          // the code range (mode 1)
};
// shared memory a launch needs at the least (the codes of x and one channel block's sums): the device must allow it
size_t dynamic_gemv_min_smem(int M, int K);
// grid: blocks (0: one per SM); ring: how the weight tiles are staged, 0 in registers, 1 through shared memory
// by cp.async (16 tiles a warp, twice the bytes in flight of the register ring; 8 beside the codes of 17-32 rows
// where 16 do not fit; the register ring where neither fits next to the codes of x).
// cc_major: the device's compute capability major. cluster (modes 1 and 2): blocks per cluster that share the
// staging of the codes of x (dynamic_gemv.cu); 0 chooses (sm_90 from 9 rows: up to 8), 1 none, 2, 4 or 8 that many
// (sm_90 only; fewer where the device cannot hold such clusters of the kernel). Mode 0 takes 0 or 1.
cudaError_t launch_dynamic_gemv(const DynGemvArgs& p, int dtype, int grid, int num_sms, int smem_optin,
                                cudaStream_t st, int ring, int cc_major, int cluster);

// dynamic_quantize_act, per_token_symmetric, one pass (dynamic_quantize.cu): x (M, K) -> int8 codes (M, K) contiguous
// and float32 scales (M).
struct DynQuantArgs {
  const void* x;         // (M, K) float32 / float16 / bfloat16, unit column stride
  int64_t ldx;           // row stride of x (elements)
  int x_vec;             // 16-byte loads of x (its start 16-byte aligned, and its row stride with more than one row)
  int8_t* codes;         // (M, K) contiguous
  int out_vec;           // 8-byte stores of the codes (codes 8-byte aligned, K % 8 == 0)
  float* scale;          // (M)
  int64_t M;
  int K;
  uint32_t* amax;        // the transposed form's (M) workspace: the rows' abs-max as ordered bits
};
cudaError_t launch_dynamic_quantize_token(const DynQuantArgs& p, int dtype, cudaStream_t st);
// The same codes and scales for x (M, K) stored transposed: element (m, k) at x[k * ldx + m] (ldx >= M, x_vec: 16-byte
// loads along m), codes (M, K) contiguous (out_vec: 16-byte stores, codes 16-byte aligned and K % 16 == 0),
// K <= 65535 * 128 (dynamic_quantize_cols.cu).
cudaError_t launch_dynamic_quantize_token_cols(const DynQuantArgs& p, int dtype, cudaStream_t st);

// columns [n0, n0 + nc) of the (K, N) dequantized weight into out (K rows of stride ldo)
cudaError_t launch_wq_dequant_canonical(const int32_t* qw, const void* scales, int sdt, const void* zeros, int zdt,
                                        bool gptq, const int32_t* gidx, int gs, int G, int bits, int K, int N, int n0,
                                        int nc, int64_t ldo, void* out, int odt, cudaStream_t st);

// quantize_int (quantize.cu): n elements of contiguous x (dtype kF32 / kF16 / kBF16) -> codes (out_dtype kI8, or the
// codes as kF32 / kF16 / kBF16 values); scale float32: scale[0] (one_scale) or scale[i / inner]; shift: nullptr or
// `cols` values of x's dtype, element i quantizing x[i] + shift[i % cols] (the sum rounded to x's dtype).
cudaError_t launch_quantize_int(const void* x, int dtype, int64_t n, const float* scale, bool one_scale,
                                int64_t inner, const void* shift, int64_t cols, int bits, void* out, int out_dtype,
                                cudaStream_t st);

// transpose_2d (transpose.cu): y (cols, rows) = x.t() for x (rows, cols) of row stride ldx (>= cols) and elements of
// elem_bytes (1, 2, 4 or 8) bytes; y contiguous.
cudaError_t launch_transpose_2d(const void* x, int64_t ldx, void* y, int64_t rows, int64_t cols, int elem_bytes,
                                cudaStream_t st);

// Mixed-width (exl2-style) weight-only kernels (mbwq.cu). The weight is walked in chunks of at most 32 packed rows
// of one group: chunk c is the int4 {bits | rows << 8, group, first packed row, first qweight word} of the chunk
// table (bie_backend_cuda/mbwq.py chunk_table); its codes are ceil(rows * bits / 32) words of the group's bit stream.
// Every entry is checked in the kernels against K, G and the rows of qweight (a bad entry is skipped).
constexpr int MBWQ_GEMV_MAX_M = 8;
constexpr int MBWQ_THREADS = 128;      // columns per block (one per thread)
struct MbwqArgs {
  const int32_t* qweight;  // (KW, N) int32 bit streams
  int64_t KW;
  int N, K, G;
  const int4* chunks;      // (nchunks) chunk table
  int nchunks;
  const float* scales;     // (G, N) float32
  const float* zeros;      // (G, N) float32
  const int32_t* perm;     // (K) packed row j is input row perm[j] (gemv: the column of x; dequant: the output row,
                           // or null for packed row order)
  const float* rscale;     // (K) factor per packed row (channel_scale in packed order) or null
  // gemv only
  const void* x;           // (M, K) x's dtype, unit column stride, rows ldx apart
  int64_t ldx;
  int M;
  const void* bias;        // N values or null
  int bias_dtype;
  void* out;               // gemv: (M, N) in x's dtype; dequant: (K, N) in out_dtype
  int out_dtype;
  float* ws;               // (splits, M, N) float32 partials when splits > 1
  int32_t* counters;       // (ceil(N / MBWQ_THREADS)) zeroed split-K semaphores, left zero
  int splits;              // K splits (blocks along y), set by mbwq_gemv_plan
  int cps;                 // chunks per split, set by mbwq_gemv_plan
  int cpt;                 // columns per thread (1, or 4 with 16-byte loads), set by mbwq_gemv_plan
};
// Sets p.splits and p.cps for p.M, p.N, p.nchunks (splits_force > 0: that many splits at most); returns the
// dynamic shared memory per block.
int mbwq_gemv_plan(MbwqArgs& p, int num_sms, int splits_force);
cudaError_t launch_mbwq_gemv(const MbwqArgs& p, int x_dtype, cudaStream_t st);
cudaError_t launch_mbwq_dequant(const MbwqArgs& p, cudaStream_t st);

// mbwq_gemm for up to MBWQ_SKINNY_MAX_M rows of fp16 / bf16 x on the tensor cores (mbwq_skinny.cu): one cooperative
// launch that first writes x[:, k] * cscale[k] into xp at row xslot[k] (MP = 8 * nt values each, zero past M), then,
// after a grid-wide barrier, multiplies it with the weight decoded in registers; blocks of MBWQ_SKINNY_BN columns and
// K splits of the chunk table.
constexpr int MBWQ_SKINNY_MAX_M = 64;
constexpr int MBWQ_SKINNY_WARPS = 8;    // four 32-column strips x two k-groups
constexpr int MBWQ_SKINNY_BN = 128;     // columns per block
struct MbwqSkinnyArgs {
  const int32_t* qweight;  // (KW, N) int32 bit streams
  int64_t KW;
  int N, K, G;
  const int4* chunks;      // (nchunks) chunk table (as MbwqArgs)
  int nchunks;
  const float* scales;     // (G, N) float32
  const float* zeros;      // (G, N) float32
  const int32_t* xslot;    // (K) input row k feeds xp row xslot[k] = 32 * chunk + mma k slot (bie_backend_cuda/mbwq.py)
  const float* cscale;     // (K) channel_scale in input order, float32, or null
  const void* x;           // (M, K) fp16 / bf16, unit column stride, rows ldx apart
  int64_t ldx;
  int M;
  const void* bias;        // N values or null
  int bias_dtype;
  void* out;               // (M, N) in x's dtype
  int out_dtype;
  void* xp;                // (nchunks * 32, 8 * nt) scratch in x's dtype
  float* ws;               // (splits, M, N) float32 partials when splits > 1
  int32_t* counters;       // (colblocks) split counters in the call's scratch when splits > 1 (zeroed by the kernel)
  int sr;                  // weight rows per chunk slot: the widest code of the table (2..8)
  int vec;                 // 16-byte copies of qweight / scales / zeros rows (N % 4 == 0, 16-byte aligned)
  // set by mbwq_skinny_plan
  int nt;                  // row tiles of 8 (1, 2, 3, 4, 6, 8)
  int colblocks, splits, cps, tiles, grid;
  int stages, chunk_bytes, stage_bytes, ring_bytes;
};
// Sets the plan fields of p (p.M, N, K, nchunks, sr set); splits_force / stages_force > 0 take that many K splits
// (at most) / ring stages. Returns the dynamic shared memory per block, or -1 where the device cannot run it.
int mbwq_skinny_plan(MbwqSkinnyArgs& p, int x_dtype, int num_sms, int smem_limit, int splits_force,
                     int stages_force);
cudaError_t launch_mbwq_skinny(const MbwqSkinnyArgs& p, int x_dtype, int smem, cudaStream_t st);

}  // namespace bie
