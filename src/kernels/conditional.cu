// Conditional graph nodes appended to a stream capture (conditional.hpp).
#include "conditional.hpp"

namespace cgt::kernels {
namespace {

// Runs before the node, in the same graph: a handle is set by a kernel of the graph that owns it.
__global__ void set_before(cudaGraphConditionalHandle handle, ConditionalKind kind, const std::int32_t* decider,
                           unsigned long long* counter, unsigned long long max_iterations) {
  const std::int32_t value = *decider;
  switch (kind) {
    case ConditionalKind::if_then: cudaGraphSetConditional(handle, value != 0 ? 1U : 0U); break;
    case ConditionalKind::loop_while:
      *counter = 0;
      cudaGraphSetConditional(handle, value != 0 && max_iterations > 0 ? 1U : 0U);
      break;
    // A negative index becomes a large unsigned one: out of range, so no body runs.
    case ConditionalKind::switch_on: cudaGraphSetConditional(handle, static_cast<unsigned>(value)); break;
  }
}

__global__ void decide_next_iteration(cudaGraphConditionalHandle handle, const std::int32_t* go_on,
                                      unsigned long long* counter, unsigned long long max_iterations) {
  const unsigned long long ran = ++*counter;
  cudaGraphSetConditional(handle, ran < max_iterations && *go_on != 0 ? 1U : 0U);
}

cudaGraphConditionalNodeType type_of(ConditionalKind kind) {
  switch (kind) {
    case ConditionalKind::if_then: return cudaGraphCondTypeIf;
    case ConditionalKind::loop_while: return cudaGraphCondTypeWhile;
    case ConditionalKind::switch_on: return cudaGraphCondTypeSwitch;
  }
  return cudaGraphCondTypeIf;
}

const char* forbidden_type(cudaGraphNodeType type) {
  switch (type) {
    case cudaGraphNodeTypeHost: return "a host node (a host callback or function)";
    case cudaGraphNodeTypeEventRecord: return "an event record node (an event recorded on its stream)";
    case cudaGraphNodeTypeWaitEvent: return "an event wait node (a wait on another stream's event)";
    case cudaGraphNodeTypeMemAlloc: return "a memory allocation node (cudaMallocAsync)";
    case cudaGraphNodeTypeMemFree: return "a memory free node (cudaFreeAsync)";
    case cudaGraphNodeTypeExtSemaphoreSignal:
    case cudaGraphNodeTypeExtSemaphoreWait: return "an external semaphore node";
    default: return nullptr;
  }
}

}  // namespace

cudaError_t append_conditional(cudaStream_t stream, ConditionalKind kind, const std::int32_t* decider,
                               unsigned long long* counter, unsigned long long max_iterations, unsigned bodies,
                               ConditionalNode& node) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaGraph_t graph = nullptr;
  if (const cudaError_t error = cudaStreamGetCaptureInfo(stream, &status, nullptr, &graph); error != cudaSuccess) {
    return error;
  }
  if (status != cudaStreamCaptureStatusActive) return cudaErrorStreamCaptureInvalidated;
  if (const cudaError_t error = cudaGraphConditionalHandleCreate(&node.handle, graph, 0, 0); error != cudaSuccess) {
    return error;
  }
  set_before<<<1, 1, 0, stream>>>(node.handle, kind, decider, counter, max_iterations);
  if (const cudaError_t error = cudaGetLastError(); error != cudaSuccess) return error;
  // The node depends on what the capture has now (the kernel above), and the capture goes on after it.
  const cudaGraphNode_t* dependencies = nullptr;
  const cudaGraphEdgeData* edges = nullptr;
  std::size_t count = 0;
  if (const cudaError_t error =
          cudaStreamGetCaptureInfo(stream, &status, nullptr, &graph, &dependencies, &edges, &count);
      error != cudaSuccess) {
    return error;
  }
  cudaGraphNodeParams params{};
  params.type = cudaGraphNodeTypeConditional;
  params.conditional.handle = node.handle;
  params.conditional.type = type_of(kind);
  params.conditional.size = bodies;
  if (const cudaError_t error = cudaGraphAddNode(&node.node, graph, dependencies, edges, count, &params);
      error != cudaSuccess) {
    return error;
  }
  // CUDA points phGraph_out at an array of its own, which the node owns.
  node.bodies.assign(params.conditional.phGraph_out, params.conditional.phGraph_out + bodies);
  return cudaStreamUpdateCaptureDependencies(stream, &node.node, nullptr, 1, cudaStreamSetCaptureDependencies);
}

cudaError_t launch_loop_decision(cudaStream_t stream, cudaGraphConditionalHandle handle, const std::int32_t* go_on,
                                 unsigned long long* counter, unsigned long long max_iterations) {
  decide_next_iteration<<<1, 1, 0, stream>>>(handle, go_on, counter, max_iterations);
  return cudaGetLastError();
}

std::string forbidden_in_body(cudaGraph_t body) {
  std::size_t count = 0;
  if (cudaGraphGetNodes(body, nullptr, &count) != cudaSuccess) return "its nodes could not be listed";
  std::vector<cudaGraphNode_t> nodes(count);
  if (count > 0 && cudaGraphGetNodes(body, nodes.data(), &count) != cudaSuccess) return "its nodes could not be listed";
  for (const cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    if (cudaGraphNodeGetType(node, &type) != cudaSuccess) return "a node's type could not be read";
    if (const char* why = forbidden_type(type)) return std::string("it holds ") + why;
    if (type == cudaGraphNodeTypeGraph) {  // a child graph's nodes are the body's too
      cudaGraph_t child = nullptr;
      if (cudaGraphChildGraphNodeGetGraph(node, &child) != cudaSuccess) return "a child graph could not be read";
      if (std::string why = forbidden_in_body(child); !why.empty()) return why;
    }
  }
  return {};
}

}  // namespace cgt::kernels
