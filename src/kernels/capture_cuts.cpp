// Cutting a stream capture into segments (capture_cuts.hpp).
#include "capture_cuts.hpp"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace cgt::kernels {

cudaError_t CaptureCuts::cut(cudaStream_t stream, bool& made) {
  made = false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaGraph_t graph = nullptr;
  if (const cudaError_t error = cudaStreamGetCaptureInfo(stream, &status, nullptr, &graph); error != cudaSuccess) {
    return error;
  }
  if (status != cudaStreamCaptureStatusActive || graph == nullptr) return cudaErrorStreamCaptureInvalidated;
  std::size_t count = 0;
  if (const cudaError_t error = cudaGraphGetNodes(graph, nullptr, &count); error != cudaSuccess) return error;
  std::vector<cudaGraphNode_t> nodes(count);
  if (const cudaError_t error = cudaGraphGetNodes(graph, nodes.data(), &count); error != cudaSuccess) return error;
  std::vector<cudaGraphNode_t> added;
  for (std::size_t i = 0; i < count; ++i) {
    if (seen_.insert(nodes[i]).second) added.push_back(nodes[i]);
  }
  if (added.empty()) return cudaSuccess;
  segments_.push_back(std::move(added));
  made = true;
  return cudaSuccess;
}

cudaError_t CaptureCuts::split(cudaGraph_t graph, std::vector<GraphHandle>& later) const {
  later.clear();
  // Clones first: each needs the whole graph.
  for (std::size_t s = 1; s < segments_.size(); ++s) {
    cudaGraph_t clone = nullptr;
    if (const cudaError_t error = cudaGraphClone(&clone, graph); error != cudaSuccess) return error;
    later.emplace_back(clone);
    const std::unordered_set<cudaGraphNode_t> keep(segments_[s].begin(), segments_[s].end());
    for (cudaGraphNode_t node : seen_) {
      if (keep.contains(node)) continue;
      cudaGraphNode_t cloned = nullptr;
      if (const cudaError_t error = cudaGraphNodeFindInClone(&cloned, node, clone); error != cudaSuccess) return error;
      if (const cudaError_t error = cudaGraphDestroyNode(cloned); error != cudaSuccess) return error;
    }
  }
  for (std::size_t s = 1; s < segments_.size(); ++s) {
    for (cudaGraphNode_t node : segments_[s]) {
      if (const cudaError_t error = cudaGraphDestroyNode(node); error != cudaSuccess) return error;
    }
  }
  return cudaSuccess;
}

cudaError_t read_decider(const void* decider, cudaStream_t stream, std::int32_t& value) {
  if (const cudaError_t error = cudaMemcpyAsync(&value, decider, sizeof value, cudaMemcpyDeviceToHost, stream);
      error != cudaSuccess) {
    return error;
  }
  return cudaStreamSynchronize(stream);
}

}  // namespace cgt::kernels
