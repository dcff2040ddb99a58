// Making a pool's device current for a piece of work, for cgt.cuda and cgt.torch: one definition,
// compiled into each. Like cuda_status.hpp it names cgt's types and includes nothing itself: a
// backend includes it in its module's purview after cuda_status.hpp, and its global module
// fragment includes <cuda.h> (types only: the driver is reached through the runtime, never
// linked, so that a machine without a driver still loads the library) and <cuda_runtime_api.h>.
#pragma once

namespace cgt::kernels {

/// The calling thread's current driver context, or null when there is none or the driver cannot
/// say. Read through the driver's entry point, which the runtime looks up once: a replay asks on
/// every call whether its pool's device is current, and cudaGetDevice costs about 60 ns there (an
/// H100 host, `gpu_bench diagnose`), as much as a twentieth of a raw cudaGraphLaunch.
[[nodiscard]] inline void* current_context() noexcept {
  using GetCurrent = CUresult (*)(CUcontext*);
  static const GetCurrent get_current = [] {
    void* entry = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &entry, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return GetCurrent{nullptr};
    }
    return reinterpret_cast<GetCurrent>(
        entry);  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast): the driver's type
  }();
  CUcontext context = nullptr;
  if (get_current == nullptr || get_current(&context) != CUDA_SUCCESS) return nullptr;
  return context;
}

/// Makes a device current for one piece of work and puts the caller's current device back after:
/// a pool on device 1 called from a thread whose current device is 0 launches on device 1 and
/// leaves the thread on device 0.
class CurrentDevice {
 public:
  CurrentDevice() = default;
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;
  CurrentDevice(CurrentDevice&&) = delete;
  CurrentDevice& operator=(CurrentDevice&&) = delete;
  ~CurrentDevice() {
    if (switched_) (void)cudaSetDevice(previous_);
  }

  /// Makes `device` current. `context`: the context the pool's stream was made in, read by
  /// current_context() then (null: unknown). When it is the thread's current context, the
  /// device is current and nothing more is asked (the usual case, a few ns); otherwise the
  /// runtime is asked (cudaGetDevice, and cudaSetDevice when another device is current).
  [[nodiscard]] Result<void> enter(int device, const void* context = nullptr) {
    if (context != nullptr && current_context() == context) return {};
    if (auto got = checked(cudaGetDevice(&previous_), "reading the current device"); !got) return got;
    if (previous_ == device) return {};
    if (auto set = checked(cudaSetDevice(device), "selecting the device"); !set) return set;
    switched_ = true;
    return {};
  }

 private:
  int previous_ = 0;
  bool switched_ = false;
};

}  // namespace cgt::kernels
