// Launch cost that does not depend on what a capture produced. cudaGraphLaunch of a graph with
// memset nodes costs tens of microseconds of CPU (an H200: BERT-base via TorchScript, 490 nodes of
// which 60 memsets, 81 us per launch; graphs of kernels only launch in 3-5 us; an H100: 60
// memsets among 400 kernels, 116 us against 4 us), and cuBLAS, cuDNN, CUB and Inductor captures
// contain them. After a capture and before instantiation, cgt.cuda and cgt.torch replace each
// memset node by a kernel node that writes the same bytes, with the same dependencies. One-row
// device-to-device memcpy nodes can be replaced too, on request: they were measured no slower to
// launch than kernels (bench/results/launch.md). Other node types (host, event, child graph,
// memcpy from or to the host) are left as they are; event record nodes are as slow as memsets, but
// their effect is seen outside the graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace cgt::kernels {

/// Which nodes `rewrite_for_launch` replaces.
struct RewriteChoice {
  bool memsets = true;
  bool memcpys = false;
};

/// What `rewrite_for_launch` found in a graph (added to the counts it is given).
struct NodeRewrites {
  std::uint64_t memsets_rewritten = 0;
  std::uint64_t memsets_kept = 0;  ///< left as memset nodes (not chosen, or memory of another device)
  std::uint64_t memcpys_rewritten = 0;
  std::uint64_t memcpys_kept = 0;  ///< left as memcpy nodes (not chosen, host memory, arrays, 2D or 3D)
};

/// Replaces the memset nodes and the 1D device-to-device memcpy nodes of `graph` (captured on the
/// current device, not instantiated) that `choice` names by kernel nodes with the same
/// dependencies, and counts what it replaced and what it left into `counts`. On failure the graph
/// may be half rewritten: it must not be used.
cudaError_t rewrite_for_launch(cudaGraph_t graph, RewriteChoice choice, NodeRewrites& counts);

}  // namespace cgt::kernels
