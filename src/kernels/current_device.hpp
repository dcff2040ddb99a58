// Making a pool's device current for a piece of work, and launching a replay's graph, for cgt.cuda
// and cgt.torch: one definition, compiled into each. Like cuda_status.hpp it names cgt's types and
// includes nothing itself: a backend includes it in its module's purview after cuda_status.hpp, and
// its global module fragment includes <cuda.h> (types only: the driver is reached through the
// runtime, never linked, so that a machine without a driver still loads the library) and
// <cuda_runtime_api.h>.
#pragma once

namespace cgt::kernels {

/// The driver's entry point `name` (its CUDA 12.0 form), looked up through the runtime, or null
/// when the driver has none.
[[nodiscard]] inline void* driver_entry(const char* name) noexcept {
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &entry, 12000, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return entry;
}

/// The calling thread's current driver context, or null when there is none or the driver cannot
/// say. A replay asks on every call whether its pool's device is current, and cudaGetDevice costs
/// 40-100 ns there (H100 hosts, `gpu_bench diagnose`), a twentieth of a raw cudaGraphLaunch.
[[nodiscard]] inline void* current_context() noexcept {
  using GetCurrent = CUresult (*)(CUcontext*);
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-reinterpret-cast): the driver's type for the entry
  static const auto get_current = reinterpret_cast<GetCurrent>(driver_entry("cuCtxGetCurrent"));
  CUcontext context = nullptr;
  if (get_current == nullptr || get_current(&context) != CUDA_SUCCESS) return nullptr;
  return context;
}

/// Makes a device current for one piece of work and puts the caller's current device back after:
/// a pool on device 1 called from a thread whose current device is 0 launches on device 1 and
/// leaves the thread on device 0.
class CurrentDevice {
 public:
  // `inline` spelled out: in a module's purview a member defined in its class is not inline.
  inline CurrentDevice() = default;
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;
  CurrentDevice(CurrentDevice&&) = delete;
  CurrentDevice& operator=(CurrentDevice&&) = delete;
  inline ~CurrentDevice() {
    if (switched_) (void)cudaSetDevice(previous_);
  }

  /// Makes `device` current. `context`: the context the pool's stream was made in, read by
  /// current_context() then (null: unknown). When it is the thread's current context, the
  /// device is current and nothing more is asked (the usual case, a few ns); otherwise the
  /// runtime is asked (cudaGetDevice, and cudaSetDevice when another device is current).
  [[nodiscard]] inline Result<void> enter(int device, const void* context = nullptr) {
    if (context != nullptr && current_context() == context) {
      in_context_ = true;
      return {};
    }
    if (auto got = checked(cudaGetDevice(&previous_), "reading the current device"); !got) return got;
    if (previous_ == device) return {};
    if (auto set = checked(cudaSetDevice(device), "selecting the device"); !set) return set;
    switched_ = true;
    return {};
  }

  /// Whether enter() found the pool's context current: the driver may then be called directly.
  [[nodiscard]] inline bool in_pools_context() const noexcept { return in_context_; }

 private:
  int previous_ = 0;
  bool switched_ = false;
  bool in_context_ = false;
};

/// Launches `exec` on `stream`. In the pool's context (`device.in_pools_context()`) through the
/// driver's cuGraphLaunch, which the runtime's cudaGraphLaunch wraps; otherwise, and when the
/// driver fails (its error is then the runtime's, said in the runtime's words), through the
/// runtime, which also makes a context current where a thread has none. A failed launch launches
/// nothing, so it is safe to try again.
[[nodiscard]] inline Result<void> launch_graph(cudaGraphExec_t exec, cudaStream_t stream, const CurrentDevice& device,
                                               const char* doing) {
  using Launch = CUresult (*)(CUgraphExec, CUstream);
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-reinterpret-cast): the driver's type for the entry
  static const auto launch = reinterpret_cast<Launch>(driver_entry("cuGraphLaunch"));
  if (device.in_pools_context() && launch != nullptr && launch(exec, stream) == CUDA_SUCCESS) return {};
  return checked(cudaGraphLaunch(exec, stream), doing);
}

}  // namespace cgt::kernels
