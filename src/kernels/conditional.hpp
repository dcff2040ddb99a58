// Conditional graph nodes (CUDA 12.4+: IF, WHILE; 12.8+: SWITCH) appended to a stream capture in
// progress: the loops and branches of a pool function that the GPU decides at each launch of the
// graph, with no host round trip (../shared/reference/conditional-nodes.md has the facts). Used by
// cgt.cuda's Context::loop_while, if_then and switch_on.
//
// A conditional node is added to the graph the stream is capturing, after a small kernel that
// sets the node's handle from the value the node is decided on (for a loop: whether to enter it at
// all, and its iteration counter reset). Each body is then filled by capturing another stream
// into it (`cudaStreamBeginCaptureToGraph`); a loop's body ends with a kernel that decides whether
// to go on. The capture of the first stream goes on after the node.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

namespace cgt::kernels {

enum class ConditionalKind : std::uint8_t { if_then, loop_while, switch_on };

/// A conditional node of a capture in progress, its bodies empty until captured into.
struct ConditionalNode {
  cudaGraphConditionalHandle handle = 0;
  cudaGraphNode_t node = nullptr;
  std::vector<cudaGraph_t> bodies;  ///< owned by the node (CUDA made them with it)
};

/// Appends to the capture in progress on `stream` the kernel that sets the node's handle from
/// `decider` (one int32 on the device) and a conditional node of `kind` with `bodies` bodies
/// (1 for IF and WHILE). For a loop, the kernel also sets `*counter` to 0 and enters only when
/// `*decider != 0 && max_iterations > 0`. The capture on `stream` goes on after the node.
cudaError_t append_conditional(cudaStream_t stream, ConditionalKind kind, const std::int32_t* decider,
                               unsigned long long* counter, unsigned long long max_iterations, unsigned bodies,
                               ConditionalNode& node);

/// Launches on `stream` (capturing into a loop's body) the kernel that ends each iteration:
/// counts it, and goes on while `*go_on != 0` and fewer than `max_iterations` ran.
cudaError_t launch_loop_decision(cudaStream_t stream, cudaGraphConditionalHandle handle, const std::int32_t* go_on,
                                 unsigned long long* counter, unsigned long long max_iterations);

/// Why `body` cannot be the body of a conditional node (a host node, an event record or wait, a
/// memory allocation or free: CUDA forbids them there), or "" when it can.
std::string forbidden_in_body(cudaGraph_t body);

}  // namespace cgt::kernels
