// Launch cost that does not depend on what a capture produced. cudaGraphLaunch of a graph with
// memset nodes costs tens of microseconds of CPU (an H200: BERT-base via TorchScript, 490 nodes of
// which 60 memsets, 81 us per launch; graphs of kernels only launch in 3-5 us), and cuBLAS,
// cuDNN and Inductor captures contain them. After a capture and before instantiation, cgt.cuda and
// cgt.torch replace each memset node, and each one-dimensional device-to-device memcpy node of
// the current device, by a kernel node that writes the same bytes, with the same dependencies.
// Other node types (host, event, child graph, memcpy from or to the host) are left as they are.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace cgt::kernels {

/// What `rewrite_for_launch` found in a graph (added to the counts it is given).
struct NodeRewrites {
  std::uint64_t memsets_rewritten = 0;
  std::uint64_t memsets_kept = 0;  ///< left as memset nodes (rewriting off, or memory of another device)
  std::uint64_t memcpys_rewritten = 0;
  std::uint64_t memcpys_kept = 0;  ///< left as memcpy nodes (rewriting off, host memory, arrays, 2D or 3D)
};

/// Replaces, when `rewrite`, the memset nodes and the 1D device-to-device memcpy nodes of
/// `graph` (captured on the current device, not instantiated) by kernel nodes with the same
/// dependencies, and counts what it replaced and what it left into `counts`. On failure the graph
/// may be half rewritten: it must not be used.
cudaError_t rewrite_for_launch(cudaGraph_t graph, bool rewrite, NodeRewrites& counts);

}  // namespace cgt::kernels
