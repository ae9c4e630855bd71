// bie-backend-cutlass: the one launch sequence every family's CUTLASS 3.x GEMM goes through
// (can_implement, initialize, run), so each failure says which step failed and no family repeats it.
#pragma once
#include <atomic>
#include <string>

#include <cuda_runtime.h>
#include <cutlass/cutlass.h>

// The kernel schedules of every family's sm_90 tile configurations (as the first four template arguments of
// its GEMM: tile shape, cluster shape, mainloop schedule, epilogue schedule); M, N, K: cute::_128 and the like.
// Cooperative: two consumer warpgroups share a 128-row tile; ping-pong: they alternate 64-row tiles.
#define BIE_SM90_COOPERATIVE(M, N, K, CLUSTER_M)                                                          \
  cute::Shape<M, N, K>, cute::Shape<CLUSTER_M, cute::_1, cute::_1>, cutlass::gemm::KernelTmaWarpSpecializedCooperative, \
      cutlass::epilogue::TmaWarpSpecializedCooperative
#define BIE_SM90_PINGPONG(M, N, K, CLUSTER_M)                                                          \
  cute::Shape<M, N, K>, cute::Shape<CLUSTER_M, cute::_1, cute::_1>, cutlass::gemm::KernelTmaWarpSpecializedPingpong, \
      cutlass::epilogue::TmaWarpSpecialized

namespace bie_cutlass {

// The adapters' initialize sets the kernel's dynamic shared-memory limit (cudaFuncSetAttribute) on every call: about
// 3 µs of host time, a sixth of a layer's eager call. The limit belongs to the kernel function in each device's
// context, so it is set once per device (the first initialize there) and later calls only refresh the workspace and
// the params: what initialize does besides. One flag per adapter type (the function-local static) and device.
constexpr int kMaxDevices = 64;

template <class Adapter>
std::atomic<bool>* limit_set_flag() {
  static std::atomic<bool> set[kMaxDevices] = {};
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) {
    cudaGetLastError();
    return nullptr;   // (initialize on every call)
  }
  return &set[device];
}

// initialize on a device's first call, afterwards the workspace and params alone (Kernel: the adapter's kernel)
template <class Kernel, class Adapter, class Arguments>
cutlass::Status prepare_launch(Adapter& op, Arguments const& args, void* workspace, cudaStream_t st) {
  std::atomic<bool>* done = limit_set_flag<Adapter>();
  if (done == nullptr || !done->load(std::memory_order_acquire)) {
    const cutlass::Status s = op.initialize(args, workspace, st);
    if (s == cutlass::Status::kSuccess && done != nullptr) done->store(true, std::memory_order_release);
    return s;
  }
  const cutlass::Status s = Kernel::initialize_workspace(args, workspace, st, nullptr);
  return s != cutlass::Status::kSuccess ? s : op.update(args, workspace);
}

// ws != nullptr: only the workspace size of args goes there. Else launches on st (pdl: as a programmatic
// dependent of the kernel before it; the kernel must be built to wait for it before its first load).
// Returns "" on success, else what failed.
template <class Gemm>
std::string launch_gemm(typename Gemm::Arguments const& args, void* workspace, size_t* ws, cudaStream_t st,
                        bool pdl = false) {
  if (ws != nullptr) {
    *ws = Gemm::get_workspace_size(args);
    return "";
  }
  Gemm gemm;
  cutlass::Status s = gemm.can_implement(args);
  if (s != cutlass::Status::kSuccess)
    return std::string("CUTLASS cannot implement this problem: ") + cutlassGetStatusString(s);
  s = prepare_launch<typename Gemm::GemmKernel>(gemm, args, workspace, st);
  if (s != cutlass::Status::kSuccess) return std::string("CUTLASS initialize failed: ") + cutlassGetStatusString(s);
  s = gemm.run(st, nullptr, pdl);
  if (s != cutlass::Status::kSuccess) return std::string("CUTLASS launch failed: ") + cutlassGetStatusString(s);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return std::string("CUDA error after the GEMM launch: ") + cudaGetErrorString(e);
  return "";
}

// The same sequence for a CUTLASS 3.x convolution (ConvUniversalAdapter, which launches without the programmatic
// dependent launch option). mode 0: only whether CUTLASS can implement args ("" if so); 1: only the workspace size
// of args, into *ws; 2: launch on st.
template <class Conv>
std::string launch_conv(typename Conv::Arguments const& args, void* workspace, int mode, size_t* ws,
                        cudaStream_t st) {
  if (mode == 1) {
    *ws = Conv::get_workspace_size(args);
    return "";
  }
  Conv conv;
  cutlass::Status s = conv.can_implement(args);
  if (s != cutlass::Status::kSuccess)
    return std::string("CUTLASS cannot implement this problem: ") + cutlassGetStatusString(s);
  if (mode == 0) return "";
  s = prepare_launch<typename Conv::ConvKernel>(conv, args, workspace, st);
  if (s != cutlass::Status::kSuccess) return std::string("CUTLASS initialize failed: ") + cutlassGetStatusString(s);
  s = conv.run(st);
  if (s != cutlass::Status::kSuccess) return std::string("CUTLASS launch failed: ") + cutlassGetStatusString(s);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return std::string("CUDA error after the convolution launch: ") + cudaGetErrorString(e);
  return "";
}

}  // namespace bie_cutlass
