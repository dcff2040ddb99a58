// What the GPU backends' context tests share: the driver's entry points, reached through the runtime
// (a test binary links no driver, so that it starts on a machine without one), and the check that a
// pool's calls leave the caller's current context (none, or one the program made) as it was.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <catch2/catch_test_macros.hpp>

#include <vector>

import cgt;

namespace gpu_context {

/// The driver's entry point `name`, in its CUDA 12.0 form, or null.
template <class F>
F driver(const char* name) {
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &entry, 12000, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    return nullptr;
  }
  return reinterpret_cast<F>(entry);  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
}

/// The calling thread's current context (null: none).
inline CUcontext current_context() {
  static const auto get = driver<CUresult (*)(CUcontext*)>("cuCtxGetCurrent");
  CUcontext context = nullptr;
  REQUIRE(get(&context) == CUDA_SUCCESS);
  return context;
}

/// Three calls (warm-up, recording, replay) by `call()`, each from a thread whose current context
/// is none, or one the program made on device 0 (`own_context`: skipped where the device takes no
/// second context in one process, as in an exclusive compute mode); after each, that context is
/// current again. `check(outputs)` reads the outputs with the primary context current.
template <class Call, class Check>
void calls_keep_the_callers_context(bool own_context, const Call& call, const Check& check) {
  const auto create = driver<CUresult (*)(CUcontext*, unsigned int, CUdevice)>("cuCtxCreate");
  const auto destroy = driver<CUresult (*)(CUcontext)>("cuCtxDestroy");
  const auto set = driver<CUresult (*)(CUcontext)>("cuCtxSetCurrent");
  const auto get_device = driver<CUresult (*)(CUdevice*, int)>("cuDeviceGet");
  REQUIRE(set != nullptr);
  const CUcontext primary = current_context();
  CUcontext caller = nullptr;  // none
  if (own_context) {
    CUdevice device = 0;
    REQUIRE(get_device(&device, 0) == CUDA_SUCCESS);
    if (create == nullptr || create(&caller, 0, device) != CUDA_SUCCESS) {
      REQUIRE(set(primary) == CUDA_SUCCESS);
      SKIP("the device takes no second context in this process (an exclusive compute mode)");
    }
  }
  std::vector<cgt::CallKind> kinds;
  for (int i = 0; i < 3; ++i) {
    REQUIRE(set(caller) == CUDA_SUCCESS);
    auto out = call();
    CHECK(current_context() == caller);  // the program's context (or none) is current again
    REQUIRE(set(primary) == CUDA_SUCCESS);
    REQUIRE(out);
    kinds.push_back(out->kind());
    check(*out);
  }
  CHECK(kinds == std::vector{cgt::CallKind::warmup, cgt::CallKind::recording, cgt::CallKind::replay});
  if (caller != nullptr) REQUIRE(destroy(caller) == CUDA_SUCCESS);
  REQUIRE(set(primary) == CUDA_SUCCESS);
}

}  // namespace gpu_context
