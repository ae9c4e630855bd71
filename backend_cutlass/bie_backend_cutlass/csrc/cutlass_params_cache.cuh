// bie-backend-cutlass: launching a CUTLASS 3.x GEMM again on params made for equal arguments before.
//
// CUTLASS makes a launch's params on every call: the problem checks, the tile scheduler's grid, and a TMA descriptor
// for each of A, B and D, each encoded after a lookup of the driver's entry point by name. On a layer's eager call
// that is about as much host time as the launch itself, and it is the same work every time: the params are a
// function of the arguments (pointers, shapes, strides, epilogue vectors, device and SM count), and an eager model
// run calls each layer on the same weight, with activations and outputs the caching allocator hands back at the same
// addresses step after step. So the params are kept per GEMM type and thread, by the arguments they were made from,
// and a launch whose arguments were seen reuses them: only the launch is left. A GEMM that needs a workspace is
// never kept (its workspace is filled on each call).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>

#include "cutlass_launch.cuh"

namespace bie_cutlass {

template <std::size_t N>
struct ArgsKeyHash {
  std::size_t operator()(std::array<int64_t, N> const& k) const {
    uint64_t h = 1469598103934665603ull;   // FNV-1a over the words: the keys differ in a few of them
    for (int64_t v : k) {
      h ^= static_cast<uint64_t>(v);
      h *= 1099511628211ull;
    }
    return static_cast<std::size_t>(h ^ (h >> 29));
  }
};

// The kept params of one GEMM type: a model's layers at a few input shapes each fit; past kMaxKept the map is
// cleared (rebuilding params is only the cost of a call without this cache).
constexpr std::size_t kMaxKept = 1024;

// launch_gemm with the params made for `key` (every argument `args` is made from, a word each) reused where they
// were kept. ws != nullptr: the workspace size alone, as launch_gemm.
template <class Gemm, std::size_t N>
std::string launch_gemm_kept(std::array<int64_t, N> const& key, typename Gemm::Arguments const& args,
                             void* workspace, size_t* ws, cudaStream_t st, bool pdl = false) {
  if (ws != nullptr || workspace != nullptr) return launch_gemm<Gemm>(args, workspace, ws, st, pdl);
  using Params = typename Gemm::Params;
  thread_local std::unordered_map<std::array<int64_t, N>, Params, ArgsKeyHash<N>> kept;
  auto it = kept.find(key);
  if (it == kept.end()) {   // launch_gemm's steps up to its launch, then the params kept
    Gemm gemm;
    cutlass::Status s = gemm.can_implement(args);
    if (s != cutlass::Status::kSuccess)
      return std::string("CUTLASS cannot implement this problem: ") + cutlassGetStatusString(s);
    s = prepare_launch<typename Gemm::GemmKernel>(gemm, args, workspace, st);
    if (s != cutlass::Status::kSuccess) return std::string("CUTLASS initialize failed: ") + cutlassGetStatusString(s);
    if (kept.size() >= kMaxKept) kept.clear();
    it = kept.emplace(key, gemm.params()).first;
  }
  const cutlass::Status s = Gemm::run(it->second, st, nullptr, pdl);
  if (s != cutlass::Status::kSuccess) return std::string("CUTLASS launch failed: ") + cutlassGetStatusString(s);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return std::string("CUDA error after the GEMM launch: ") + cudaGetErrorString(e);
  return "";
}

}  // namespace bie_cutlass
