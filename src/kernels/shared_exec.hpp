// A CUDA graph executable shared by several recordings, and a recording's graph in one: used by
// cgt.cuda and cgt.torch. A re-recording because a static input moved usually captures the same
// topology as the recording it redoes, only with other addresses; it then updates that one's
// executable (cudaGraphExecUpdate) instead of instantiating its own, and the two share it. The
// executable runs one recording's graph at a time; a replay of the other loads its graph back
// first (the copy nodes then copy what that graph was captured with, until the next retarget).
#pragma once

#include <cuda_runtime_api.h>

#include "graph_handle.hpp"
#include "input_copy.hpp"

#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

namespace cgt::kernels {

/// An instantiated graph and the recordings that share it. `Owner` owns the executable and the
/// graph it was instantiated from, whose copy nodes are `nodes` (the executable's copy nodes are
/// addressed through that graph's).
template <class Owner>
struct SharedExec {
  SharedExec(Owner graph_owner, cudaGraphExec_t instantiated, std::vector<CopyNode> copy_nodes)
      : owner(std::move(graph_owner)), exec(instantiated), nodes(std::move(copy_nodes)) {}
  SharedExec(const SharedExec&) = delete;
  SharedExec& operator=(const SharedExec&) = delete;
  ~SharedExec() = default;

  Owner owner;
  cudaGraphExec_t exec;
  std::vector<CopyNode> nodes;   ///< what the copy nodes copy now
  const void* loaded = nullptr;  ///< the graph the executable runs now (a `GraphInExec`)
};

/// One recording's graph in a shared executable. Made when the recording is, it is the graph the
/// executable runs then (an instantiation, or an update in place, has just loaded it).
template <class Owner>
class GraphInExec {
 public:
  /// `graph`: the recording's graph, alive as long as this (owned by `exec`'s owner, or by the
  /// recording); `captured`: what its copy nodes copied when it was captured.
  GraphInExec(std::shared_ptr<SharedExec<Owner>> exec, cudaGraph_t graph, std::vector<CopyBatch> captured)
      : exec_(std::move(exec)), graph_(graph), captured_(std::move(captured)) {
    exec_->loaded = this;
  }
  GraphInExec(const GraphInExec&) = delete;
  GraphInExec& operator=(const GraphInExec&) = delete;
  ~GraphInExec() {
    if (exec_->loaded == this) exec_->loaded = nullptr;
  }

  [[nodiscard]] SharedExec<Owner>& shared() const noexcept { return *exec_; }
  /// A share of the executable, for a recording that will run in it too.
  [[nodiscard]] const std::shared_ptr<SharedExec<Owner>>& share() const noexcept { return exec_; }
  [[nodiscard]] cudaGraphExec_t exec() const noexcept { return exec_->exec; }
  [[nodiscard]] std::vector<CopyNode>& nodes() const noexcept { return exec_->nodes; }

  /// Whether the executable runs this graph now.
  [[nodiscard]] bool is_loaded() const noexcept { return exec_->loaded == this; }
  /// Loads this graph into the executable (see load_graph).
  [[nodiscard]] cudaError_t load() {
    if (const cudaError_t loaded = load_graph(exec_->exec, graph_, exec_->nodes, captured_); loaded != cudaSuccess) {
      return loaded;
    }
    exec_->loaded = this;
    return cudaSuccess;
  }
  /// Makes copy node `node` copy `batch` on the next launches (see retarget_copy).
  [[nodiscard]] cudaError_t retarget(std::size_t node, const CopyBatch& batch) const {
    return retarget_copy(exec_->exec, exec_->nodes[node], batch);
  }

 private:
  std::shared_ptr<SharedExec<Owner>> exec_;
  cudaGraph_t graph_;
  std::vector<CopyBatch> captured_;
};

}  // namespace cgt::kernels
