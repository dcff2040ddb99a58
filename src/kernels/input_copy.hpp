// Copying a replay's inputs into their pool slots, inside the graph. The copy kernel is captured
// as the graph's first node; each replay points that node at the call's inputs by updating the
// instantiated graph (cudaGraphExecKernelNodeSetParams) and launches the graph once. Measured on
// an H200, a cudaMemcpyAsync or a kernel launch costs the CPU about 5 us, more than the graph
// launch itself, while the node update costs well under a microsecond. Used by cgt.cuda and
// cgt.torch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace cgt::kernels {

/// The most inputs one copy node copies; more inputs take more nodes.
inline constexpr int max_copies = 8;

struct CopyJob {
  const void* source = nullptr;
  void* target = nullptr;
  std::size_t bytes = 0;  // 0: nothing to copy (the replay filled the slot another way)
};

/// The jobs of one node, passed to the kernel by value.
struct CopyBatch {
  int count = 0;
  CopyJob jobs[max_copies];
};

/// A copy kernel captured into a graph, and what it copies now.
struct CopyNode {
  cudaGraphNode_t node = nullptr;  // of the captured graph, which must outlive its executable's updates
  unsigned blocks = 0;             // the grid's width it was captured with
  CopyBatch batch;
};

/// Launches the copy of `batch` on `stream`, which must be capturing, into `node`. The jobs
/// must not overlap.
cudaError_t capture_copy(const CopyBatch& batch, cudaStream_t stream, CopyNode& node);

/// Makes the next launches of `exec` (instantiated from the captured graph) copy `batch`, which
/// has the node's count and targets and, job by job, the same or zero bytes. Does nothing when
/// the node already copies `batch`.
cudaError_t retarget_copy(cudaGraphExec_t exec, CopyNode& node, const CopyBatch& batch);

}  // namespace cgt::kernels
