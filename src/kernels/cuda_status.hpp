// CUDA statuses as cgt errors, for cgt.cuda and cgt.torch: one definition, compiled into each.
// It names cgt's types, so a backend includes it in its module's purview, after `import cgt;`
// (cgt.cuda:internal, cgt.torch:internal), and its global module fragment includes
// <cuda_runtime_api.h> and <string>; it includes nothing itself.
#pragma once

namespace cgt::kernels {

/// Nothing when `status` is cudaSuccess, else a backend_error that says what was being done. The
/// error is cleared first (a non-sticky one must not fail the next call).
[[nodiscard]] inline Result<void> checked(cudaError_t status, const char* doing) {
  if (status == cudaSuccess) return {};
  (void)cudaGetLastError();
  return fail(Errc::backend_error, std::string("CUDA failed while ") + doing + ": " + cudaGetErrorString(status));
}

}  // namespace cgt::kernels
