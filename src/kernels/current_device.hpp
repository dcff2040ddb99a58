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

/// Reads the calling thread's current driver context into `context` (null: the thread has none).
/// False when the driver cannot say. A replay asks on every call whether its pool's context is
/// current, and cudaGetDevice costs 40-100 ns there (H100 hosts, `gpu_bench diagnose`), a
/// twentieth of a raw cudaGraphLaunch.
[[nodiscard]] inline bool read_current_context(CUcontext& context) noexcept {
  using GetCurrent = CUresult (*)(CUcontext*);
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-reinterpret-cast): the driver's type for the entry
  static const auto get_current = reinterpret_cast<GetCurrent>(driver_entry("cuCtxGetCurrent"));
  context = nullptr;
  return get_current != nullptr && get_current(&context) == CUDA_SUCCESS;
}

/// The calling thread's current driver context, or null when there is none or the driver cannot say.
[[nodiscard]] inline void* current_context() noexcept {
  CUcontext context = nullptr;
  return read_current_context(context) ? context : nullptr;
}

/// Makes `context` the calling thread's current driver context (null: none); false when the
/// driver cannot.
[[nodiscard]] inline bool make_context_current(CUcontext context) noexcept {
  using SetCurrent = CUresult (*)(CUcontext);
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-reinterpret-cast): the driver's type for the entry
  static const auto set_current = reinterpret_cast<SetCurrent>(driver_entry("cuCtxSetCurrent"));
  return set_current != nullptr && set_current(context) == CUDA_SUCCESS;
}

/// Whether `stream` is capturing a graph: through the driver's cuStreamIsCapturing where it can be
/// reached, else the runtime's. A stream that cannot be asked (the legacy stream while a blocking
/// stream captures: using it would break that capture) counts as capturing.
[[nodiscard]] inline bool is_capturing(cudaStream_t stream) noexcept {
  using IsCapturing = CUresult (*)(CUstream, CUstreamCaptureStatus*);
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-reinterpret-cast): the driver's type for the entry
  static const auto is_capturing = reinterpret_cast<IsCapturing>(driver_entry("cuStreamIsCapturing"));
  if (is_capturing != nullptr) {
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    const CUresult asked = is_capturing(stream, &status);
    if (asked == CUDA_SUCCESS) return status != CU_STREAM_CAPTURE_STATUS_NONE;
  }
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t asked = cudaStreamIsCapturing(stream, &status);
  if (asked != cudaSuccess) {
    (void)cudaGetLastError();
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
}

/// Makes a pool's device current for one piece of work and puts the caller's current context
/// back after, whatever it was: a pool on device 1 called from a thread whose current context is
/// device 0's (or one the program made itself with cuCtxCreate, or none) launches in device 1's
/// primary context, where its stream was made, and leaves the thread in the context it had.
class CurrentDevice {
 public:
  // `inline` spelled out: in a module's purview a member defined in its class is not inline.
  inline CurrentDevice() = default;
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;
  CurrentDevice(CurrentDevice&&) = delete;
  CurrentDevice& operator=(CurrentDevice&&) = delete;
  inline ~CurrentDevice() {
    if (switched_context_) {
      (void)make_context_current(static_cast<CUcontext>(previous_context_));
    } else if (switched_) {
      (void)cudaSetDevice(previous_);
    }
  }

  /// Makes `device` current. `context`: the primary context the pool's stream was made in, read by
  /// current_context() then (null: unknown). When it is the thread's current context, nothing
  /// more is done (the usual case, a few ns). When another context is current, or none, the
  /// pool's is made current through the driver and the caller's is put back at the end; without
  /// the driver (or without `context`), the runtime selects `device` (cudaGetDevice, and
  /// cudaSetDevice when another device is current).
  [[nodiscard]] inline Result<void> enter(int device, const void* context = nullptr) {
    if (context != nullptr) {
      CUcontext current = nullptr;
      if (read_current_context(current)) {
        if (current == context) {
          in_context_ = true;
          return {};
        }
        // Compared by context, not device: a context the program made on the pool's device is
        // not the one the pool's stream belongs to.
        if (make_context_current(
                static_cast<CUcontext>(const_cast<void*>(context)))) {  // NOLINT(cppcoreguidelines-pro-type-const-cast)
          previous_context_ = current;
          switched_context_ = true;
          in_context_ = true;
          return {};
        }
      }
    }
    if (auto got = checked(cudaGetDevice(&previous_), "reading the current device"); !got) return got;
    if (previous_ == device) return {};
    if (auto set = checked(cudaSetDevice(device), "selecting the device"); !set) return set;
    switched_ = true;
    return {};
  }

  /// Whether enter() made sure the pool's context is current: the driver may then be called directly.
  [[nodiscard]] inline bool in_pools_context() const noexcept { return in_context_; }

 private:
  int previous_ = 0;
  void* previous_context_ = nullptr;  // the caller's context, when enter() switched through the driver
  bool switched_ = false;
  bool switched_context_ = false;
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
