// The probe's side of the CUDA runtime (cuda_probe.hpp says what it notes and when): definitions
// of the runtime functions cgt's call uses, each forwarding to the runtime's own.
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "cuda_probe.hpp"

namespace probe {
namespace {

template <class Fn>
Fn real(const char* name) {
  void* found = dlsym(RTLD_NEXT, name);
  if (found == nullptr) {
    std::fprintf(stderr, "probe: the runtime has no %s\n", name);
    std::abort();
  }
  return reinterpret_cast<Fn>(found);  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
}

inline void note_call(Api api) {
  if (armed) ++calls[api];  // NOLINT(cppcoreguidelines-pro-bounds-constant-array-index)
}

}  // namespace
}  // namespace probe

extern "C" {
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  static const auto forward = probe::real<cudaError_t (*)(cudaGraphExec_t, cudaStream_t)>("cudaGraphLaunch");
  if (!probe::armed) return forward(exec, stream);
  probe::note_call(probe::graph_launch);
  probe::launched = exec;
  probe::launch_began = std::chrono::steady_clock::now();
  const cudaError_t status = forward(exec, stream);
  probe::launch_ended = std::chrono::steady_clock::now();
  return status;
}
cudaError_t cudaGetDevice(int* device) {
  static const auto forward = probe::real<cudaError_t (*)(int*)>("cudaGetDevice");
  probe::note_call(probe::get_device);
  return forward(device);
}
cudaError_t cudaSetDevice(int device) {
  static const auto forward = probe::real<cudaError_t (*)(int)>("cudaSetDevice");
  probe::note_call(probe::set_device);
  return forward(device);
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  static const auto forward = probe::real<cudaError_t (*)(cudaEvent_t, cudaStream_t)>("cudaEventRecord");
  probe::note_call(probe::event_record);
  return forward(event, stream);
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  static const auto forward =
      probe::real<cudaError_t (*)(cudaStream_t, cudaEvent_t, unsigned int)>("cudaStreamWaitEvent");
  probe::note_call(probe::stream_wait_event);
  return forward(stream, event, flags);
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  static const auto forward = probe::real<cudaError_t (*)(cudaEvent_t*, unsigned int)>("cudaEventCreateWithFlags");
  probe::note_call(probe::event_create);
  return forward(event, flags);
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  static const auto forward = probe::real<cudaError_t (*)(cudaEvent_t)>("cudaEventDestroy");
  probe::note_call(probe::event_destroy);
  return forward(event);
}
cudaError_t cudaLaunchKernel(const void* func, dim3 grid, dim3 block, void** args, size_t shared, cudaStream_t stream) {
  static const auto forward =
      probe::real<cudaError_t (*)(const void*, dim3, dim3, void**, size_t, cudaStream_t)>("cudaLaunchKernel");
  probe::note_call(probe::launch_kernel);
  return forward(func, grid, block, args, shared, stream);
}
cudaError_t cudaGraphExecKernelNodeSetParams(cudaGraphExec_t exec, cudaGraphNode_t node,
                                             const cudaKernelNodeParams* params) {
  static const auto forward =
      probe::real<cudaError_t (*)(cudaGraphExec_t, cudaGraphNode_t, const cudaKernelNodeParams*)>(
          "cudaGraphExecKernelNodeSetParams");
  probe::note_call(probe::exec_kernel_node_set_params);
  return forward(exec, node, params);
}
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t exec, cudaGraph_t graph, cudaGraphExecUpdateResultInfo* info) {
  static const auto forward =
      probe::real<cudaError_t (*)(cudaGraphExec_t, cudaGraph_t, cudaGraphExecUpdateResultInfo*)>("cudaGraphExecUpdate");
  probe::note_call(probe::exec_update);
  return forward(exec, graph, info);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  static const auto forward =
      probe::real<cudaError_t (*)(void*, const void*, size_t, cudaMemcpyKind, cudaStream_t)>("cudaMemcpyAsync");
  probe::note_call(probe::memcpy_async);
  return forward(dst, src, bytes, kind, stream);
}
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  static const auto forward =
      probe::real<cudaError_t (*)(cudaStream_t, cudaStreamCaptureStatus*)>("cudaStreamIsCapturing");
  probe::note_call(probe::stream_is_capturing);
  return forward(stream, status);
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags) {
  static const auto forward =
      probe::real<cudaError_t (*)(cudaGraphExec_t*, cudaGraph_t, unsigned long long)>("cudaGraphInstantiate");
  const cudaError_t status = forward(exec, graph, flags);
  if (status == cudaSuccess) {
    const std::lock_guard<std::mutex> lock(probe::instantiated_mutex());
    probe::instantiated()[*exec] = {.graph = graph, .flags = flags};
  }
  return status;
}
cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags) {
  static const auto forward =
      probe::real<cudaError_t (*)(cudaGraphExec_t*, cudaGraph_t, unsigned long long)>("cudaGraphInstantiateWithFlags");
  const cudaError_t status = forward(exec, graph, flags);
  if (status == cudaSuccess) {
    const std::lock_guard<std::mutex> lock(probe::instantiated_mutex());
    probe::instantiated()[*exec] = {.graph = graph, .flags = flags};
  }
  return status;
}
}  // extern "C"
