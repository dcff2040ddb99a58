// The captured input copies of input_copy.hpp.
#include "input_copy.hpp"

#include <cstdint>

namespace cgt::kernels {
namespace {

constexpr unsigned threads = 256;

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

// One thread per element: the row-major index gives the target, the strides the source.
template <class Element>
__global__ void gather_kernel(Gather g) {
  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < g.count; i += step) {
    long long rest = i;
    long long offset = 0;
    for (int d = g.rank - 1; d >= 0; --d) {
      offset += (rest % g.sizes[d]) * g.strides[d];
      rest /= g.sizes[d];
    }
    static_cast<Element*>(g.target)[i] = static_cast<const Element*>(g.source)[offset];
  }
}

bool same_jobs(const CopyBatch& a, const CopyBatch& b) {
  if (a.count != b.count) return false;
  for (int j = 0; j < a.count; ++j) {
    if (a.jobs[j].source != b.jobs[j].source || a.jobs[j].target != b.jobs[j].target ||
        a.jobs[j].bytes != b.jobs[j].bytes) {
      return false;
    }
  }
  return true;
}

}  // namespace

cudaError_t capture_copy(const CopyBatch& batch, cudaStream_t stream, CopyNode& node) {
  std::size_t largest = 0;
  for (int j = 0; j < batch.count; ++j) largest = batch.jobs[j].bytes > largest ? batch.jobs[j].bytes : largest;
  // One 16-byte unit per thread of the largest job, up to a few waves of an H100/H200 (132
  // SMs); larger jobs loop.
  constexpr std::size_t max_blocks = 1024;
  const std::size_t wanted = (largest / 16 + threads - 1) / threads;
  node.blocks = static_cast<unsigned>(wanted == 0 ? 1 : (wanted < max_blocks ? wanted : max_blocks));
  node.batch = batch;
  copy_kernel<<<dim3(node.blocks, static_cast<unsigned>(batch.count)), threads, 0, stream>>>(batch);
  if (const cudaError_t launched = cudaGetLastError(); launched != cudaSuccess) return launched;
  // Right after the launch, the capture's only dependency is the node it added.
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaGraphNode_t* dependencies = nullptr;
  std::size_t count = 0;
  const cudaError_t queried =
      cudaStreamGetCaptureInfo(stream, &status, nullptr, nullptr, &dependencies, nullptr, &count);
  if (queried != cudaSuccess) return queried;
  if (status != cudaStreamCaptureStatusActive || count != 1) return cudaErrorIllegalState;
  node.node = dependencies[0];
  return cudaSuccess;
}

cudaError_t capture_copies(const std::vector<CopyJob>& jobs, cudaStream_t stream, std::vector<CopyNode>& nodes) {
  for (std::size_t first = 0; first < jobs.size(); first += max_copies) {
    CopyBatch batch;
    for (std::size_t k = first; k < jobs.size() && batch.count < max_copies; ++k) batch.jobs[batch.count++] = jobs[k];
    if (const cudaError_t captured = capture_copy(batch, stream, nodes.emplace_back()); captured != cudaSuccess) {
      return captured;
    }
  }
  return cudaSuccess;
}

cudaError_t retarget_copy(cudaGraphExec_t exec, CopyNode& node, const CopyBatch& batch) {
  if (same_jobs(node.batch, batch)) return cudaSuccess;
  CopyBatch argument = batch;
  void* arguments[] = {&argument};
  cudaKernelNodeParams params{};
  params.func = reinterpret_cast<void*>(&copy_kernel);
  params.gridDim = dim3(node.blocks, static_cast<unsigned>(batch.count));
  params.blockDim = dim3(threads);
  params.sharedMemBytes = 0;
  params.kernelParams = arguments;
  params.extra = nullptr;
  const cudaError_t set = cudaGraphExecKernelNodeSetParams(exec, node.node, &params);
  if (set == cudaSuccess) node.batch = batch;
  return set;
}

cudaError_t gather(const Gather& g, cudaStream_t stream) {
  if (g.count == 0) return cudaSuccess;
  constexpr long long max_blocks = 1024;
  const long long wanted = (g.count + threads - 1) / threads;
  const dim3 grid(static_cast<unsigned>(wanted < max_blocks ? wanted : max_blocks));
  switch (g.element_bytes) {
    case 1: gather_kernel<unsigned char><<<grid, threads, 0, stream>>>(g); break;
    case 2: gather_kernel<unsigned short><<<grid, threads, 0, stream>>>(g); break;
    case 4: gather_kernel<unsigned int><<<grid, threads, 0, stream>>>(g); break;
    case 8: gather_kernel<unsigned long long><<<grid, threads, 0, stream>>>(g); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace cgt::kernels
