// Copying a replay's inputs into their pool slots, inside the graph. The copy kernel is captured
// as the graph's first node; each replay points that node at the call's inputs by updating the
// instantiated graph (cudaGraphExecKernelNodeSetParams) and launches the graph once. Measured on
// an H200, a cudaMemcpyAsync or a kernel launch costs the CPU about 5 us, more than the graph
// launch itself, while the node update costs well under a microsecond. Used by cgt.cuda and
// cgt.torch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

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

/// Launches the copies of `jobs` on `stream`, which must be capturing: `max_copies` jobs to a node,
/// in order, each node appended to `nodes`. Stops at the first failure.
cudaError_t capture_copies(const std::vector<CopyJob>& jobs, cudaStream_t stream, std::vector<CopyNode>& nodes);

/// Makes the next launches of `exec` (instantiated from the captured graph) copy `batch`, which
/// has the node's count and targets and, job by job, the same or zero bytes. Does nothing when
/// the node already copies `batch`.
cudaError_t retarget_copy(cudaGraphExec_t exec, CopyNode& node, const CopyBatch& batch);

/// A strided view to gather into contiguous memory: the copy of an input whose elements overlap
/// or run backwards, which a byte-span copy cannot reproduce.
struct Gather {
  static constexpr int max_rank = 6;
  const void* source = nullptr;  // the view's first element
  void* target = nullptr;        // contiguous, row-major
  long long sizes[max_rank] = {};
  long long strides[max_rank] = {};  // in elements, any sign
  int rank = 0;
  int element_bytes = 0;  // 1, 2, 4 or 8
  long long count = 0;    // elements
};

/// Launches the gather on `stream` (an ordinary launch, before a graph's or in a capture).
cudaError_t gather(const Gather& gather, cudaStream_t stream);

/// What copy nodes copy now (after a capture: what they were captured with).
inline std::vector<CopyBatch> batches_of(const std::vector<CopyNode>& nodes) {
  std::vector<CopyBatch> batches;
  batches.reserve(nodes.size());
  for (const CopyNode& node : nodes) batches.push_back(node.batch);
  return batches;
}

/// Loads `graph` into `exec`, an executable shared by graphs of one topology, whose copy nodes
/// are `nodes` (of the graph it was instantiated from): they then copy `captured`, what the copy
/// nodes of `graph` were captured with, until the next retarget.
inline cudaError_t load_graph(cudaGraphExec_t exec, cudaGraph_t graph, std::vector<CopyNode>& nodes,
                              const std::vector<CopyBatch>& captured) {
  cudaGraphExecUpdateResultInfo info{};
  if (const cudaError_t updated = cudaGraphExecUpdate(exec, graph, &info); updated != cudaSuccess) return updated;
  for (std::size_t n = 0; n < captured.size() && n < nodes.size(); ++n) nodes[n].batch = captured[n];
  return cudaSuccess;
}

/// Loads a newly captured `graph`, whose copy nodes are `graph_nodes` (which copy `captured`),
/// into `exec` (copy nodes `nodes`) when it has the topology `exec` runs: copy nodes of the same
/// shape, and a graph cudaGraphExecUpdate accepts. False, with the runtime's error cleared, when
/// it has another.
inline bool load_if_same_topology(cudaGraphExec_t exec, std::vector<CopyNode>& nodes, cudaGraph_t graph,
                                  const std::vector<CopyNode>& graph_nodes, const std::vector<CopyBatch>& captured) {
  if (nodes.size() != graph_nodes.size()) return false;
  for (std::size_t n = 0; n < nodes.size(); ++n) {
    if (nodes[n].blocks != graph_nodes[n].blocks || nodes[n].batch.count != graph_nodes[n].batch.count) return false;
  }
  if (load_graph(exec, graph, nodes, captured) == cudaSuccess) return true;
  (void)cudaGetLastError();
  return false;
}

}  // namespace cgt::kernels
