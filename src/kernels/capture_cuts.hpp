// Cutting a stream capture into segments, for a recording whose loops and branches the host
// decides (backend::ControlFlow::on_host; cgt.cuda and cgt.torch). The capture goes on as one:
// at each decision `cut` notes which nodes were captured since the last cut (a segment), and once
// the capture ended `split` makes each segment a graph of its own. Capture order keeps every edge
// of the graph from an earlier segment to a later one or within one, so launching the segments in
// order on one stream keeps every dependency; the edges between segments are dropped.
//
// Segment 0 stays the captured graph itself, trimmed to its nodes: node handles taken during the
// capture (the input copy nodes, captured first) stay valid in it.
#pragma once

#include <cuda_runtime_api.h>

#include "graph_handle.hpp"

#include <cstddef>
#include <cstdint>
#include <unordered_set>
#include <vector>

namespace cgt::kernels {

class CaptureCuts {
 public:
  /// Ends the segment captured on `stream` (capturing) since the last cut. Sets `made` when it
  /// has nodes (its index is then `segments() - 1`); an empty one is left out.
  cudaError_t cut(cudaStream_t stream, bool& made);
  [[nodiscard]] std::size_t segments() const noexcept { return segments_.size(); }
  /// After the capture ended into `graph` (every node of it in a segment): segments 1.. as new
  /// graphs in `later`, and `graph` trimmed to segment 0.
  cudaError_t split(cudaGraph_t graph, std::vector<GraphHandle>& later) const;

 private:
  std::vector<std::vector<cudaGraphNode_t>> segments_;
  std::unordered_set<cudaGraphNode_t> seen_;
};

/// Reads the one int32 at `decider` (device memory) once the work on `stream` before it ran.
cudaError_t read_decider(const void* decider, cudaStream_t stream, std::int32_t& value);

}  // namespace cgt::kernels
