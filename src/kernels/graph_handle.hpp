// Owning handles of a captured CUDA graph and of an instantiated one: used by cgt.cuda and
// cgt.torch (shared_exec.hpp, capture_cuts.hpp).
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <type_traits>

namespace cgt::kernels {

/// Destroys a captured graph (cudaGraphDestroy) when its handle goes.
struct GraphDestroyer {
  void operator()(cudaGraph_t graph) const noexcept { (void)cudaGraphDestroy(graph); }
};
using GraphHandle = std::unique_ptr<std::remove_pointer_t<cudaGraph_t>, GraphDestroyer>;

/// Destroys an instantiated graph (cudaGraphExecDestroy) when its handle goes.
struct ExecDestroyer {
  void operator()(cudaGraphExec_t exec) const noexcept { (void)cudaGraphExecDestroy(exec); }
};
using ExecHandle = std::unique_ptr<std::remove_pointer_t<cudaGraphExec_t>, ExecDestroyer>;

}  // namespace cgt::kernels
