// What cgt's call does on the CUDA runtime, one call at a time (the probe of model_bench). The
// benchmark defines these runtime functions itself (cuda_probe.cpp), so that every call of them in
// the process (cgt's, libtorch's, its own) comes there, and forwards each to the runtime's (the
// next definition, libcudart.so). While `armed` (the timed cgt calls, on the benchmark's thread) it
// counts them and notes when the graph launch began and ended, and which executable it launched.
// Each instantiation's graph and flags are noted always (the graph cgt launches is found by its
// executable).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>

namespace probe {
enum Api : std::uint8_t {
  graph_launch,
  get_device,
  set_device,
  event_record,
  stream_wait_event,
  event_create,
  event_destroy,
  launch_kernel,
  exec_kernel_node_set_params,
  exec_update,
  memcpy_async,
  stream_is_capturing,
  count
};
inline constexpr std::array<const char*, Api::count> names{
    "cudaGraphLaunch",     "cudaGetDevice",       "cudaSetDevice",
    "cudaEventRecord",     "cudaStreamWaitEvent", "cudaEventCreateWithFlags",
    "cudaEventDestroy",    "cudaLaunchKernel",    "cudaGraphExecKernelNodeSetParams",
    "cudaGraphExecUpdate", "cudaMemcpyAsync",     "cudaStreamIsCapturing"};
inline thread_local bool armed = false;
inline thread_local std::array<std::uint64_t, Api::count> calls{};
inline thread_local std::chrono::steady_clock::time_point launch_began, launch_ended;
inline thread_local cudaGraphExec_t launched = nullptr;
struct Instantiated {
  cudaGraph_t graph = nullptr;
  unsigned long long flags = 0;
};
inline std::map<cudaGraphExec_t, Instantiated>& instantiated() {
  static std::map<cudaGraphExec_t, Instantiated> map;
  return map;
}
inline std::mutex& instantiated_mutex() {
  static std::mutex mutex;
  return mutex;
}
}  // namespace probe
