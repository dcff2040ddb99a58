// One kernel that copies several inputs into their pool slots: a replay with copied inputs costs one
// launch for all of them instead of one cudaMemcpyAsync each (measured on an H200: about 5 us of CPU
// per cudaMemcpyAsync, about 2 us per kernel launch). Used by cgt.cuda and cgt.torch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace cgt::kernels {

inline constexpr int max_copies = 8;

struct CopyJob {
  const void* source = nullptr;
  void* target = nullptr;
  std::size_t bytes = 0;
};

/// The jobs of one launch, passed by value.
struct CopyBatch {
  int count = 0;
  CopyJob jobs[max_copies];
};

/// Copies every job of `batch` on `stream` (jobs must not overlap). Returns the launch's status.
cudaError_t copy_inputs(const CopyBatch& batch, cudaStream_t stream);

}  // namespace cgt::kernels
