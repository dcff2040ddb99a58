// The batched input copy of input_copy.hpp.
#include "input_copy.hpp"

#include <cstdint>

namespace cgt::kernels {
namespace {

// blockIdx.y picks the job; the blocks along x stride over its bytes, 16 at a time when the
// job is aligned for it (tensors' storages are), else one at a time.
__global__ void copy_kernel(CopyBatch batch) {
  const CopyJob job = batch.jobs[blockIdx.y];
  const auto source = reinterpret_cast<std::uintptr_t>(job.source);
  const auto target = reinterpret_cast<std::uintptr_t>(job.target);
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (((source | target | job.bytes) & 15U) == 0) {
    const auto* from = static_cast<const uint4*>(job.source);
    auto* to = static_cast<uint4*>(job.target);
    for (; i < job.bytes / 16; i += stride) to[i] = from[i];
    return;
  }
  const auto* from = static_cast<const unsigned char*>(job.source);
  auto* to = static_cast<unsigned char*>(job.target);
  for (; i < job.bytes; i += stride) to[i] = from[i];
}

}  // namespace

cudaError_t copy_inputs(const CopyBatch& batch, cudaStream_t stream) {
  if (batch.count <= 0) return cudaSuccess;
  std::size_t largest = 0;
  for (int j = 0; j < batch.count; ++j) largest = batch.jobs[j].bytes > largest ? batch.jobs[j].bytes : largest;
  // Enough blocks for one 16-byte unit per thread of the largest job, capped at a few waves of
  // an H100/H200 (132 SMs); larger jobs loop.
  constexpr unsigned threads = 256;
  constexpr std::size_t max_blocks = 1024;
  const std::size_t wanted = (largest / 16 + threads - 1) / threads;
  const auto blocks = static_cast<unsigned>(wanted == 0 ? 1 : (wanted < max_blocks ? wanted : max_blocks));
  copy_kernel<<<dim3(blocks, static_cast<unsigned>(batch.count)), threads, 0, stream>>>(batch);
  return cudaGetLastError();
}

}  // namespace cgt::kernels
