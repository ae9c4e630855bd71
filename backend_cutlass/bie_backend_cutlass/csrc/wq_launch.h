// bie-backend-cutlass, weight-only family: host-side declarations shared by the
// binding (host compiler) and the CUDA sources (nvcc).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

namespace bie_wq {

// One weight-only GEMM, y = x @ W (+ bias), computed as the CUTLASS problem
//   D (n_out x tokens) = A (n_out x K) * B (K x tokens),
// A = the weight as signed codes q - 2^(bits-1) (K contiguous, reordered by wq_reorder
// so each thread's values are contiguous), dequantized in registers as
// code * scale[n, g] + zero[n, g]; B = x (tokens x K, row stride ldx); D = y
// (tokens x n_out, row-major, contiguous). scale / zero: (G, n_out) contiguous
// in the activation dtype; bias: float32 (n_out) or nullptr.
struct WqArgs {
  const void* a = nullptr;
  const void* x = nullptr;
  const void* scale = nullptr;
  const void* zero = nullptr;
  const float* bias = nullptr;
  void* d = nullptr;
  int n_out = 0, tokens = 0, k = 0, group_size = 0;
  int64_t ldx = 0;
  int device = 0;
  int sm_count = 0;
  void* workspace = nullptr;
  cudaStream_t stream = nullptr;
  // stream-K configurations only (CUTLASS's scheduler arguments; the defaults are its own):
  // splits > 1 with decomposition 2 forces split-K; decomposition 0 heuristic, 1 data-parallel,
  // 3 stream-K; reduction 0 deterministic (turnstile), 1 in any order.
  int splits = 1, decomposition = 0, reduction = 0;
};

// With ws != nullptr only the workspace size is written (and "" returned); otherwise the
// kernel is launched. Returns "" on success, else what failed (never exits).
using WqFn = std::string (*)(const WqArgs&, size_t* ws);

// bits_code: 0 = 4-bit, 1 = 8-bit; act_code: 0 = float16, 1 = bfloat16.
constexpr int kNumConfigs = 8;
WqFn wq_fn(int config, int bits_code, int act_code);

// codes (n_out, k) int8 signed, contiguous -> dst in the reordered layout of the
// GEMM's A operand (4-bit: packed two per byte, dst zeroed here; 8-bit: one per byte).
std::string launch_reorder(const int8_t* codes, void* dst, int n_out, int k, int bits, cudaStream_t stream);

}  // namespace bie_wq
