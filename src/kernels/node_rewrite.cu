// Memset and device-to-device memcpy nodes replaced by kernel nodes (node_rewrite.hpp).
#include "fill_row.hpp"
#include "node_rewrite.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace cgt::kernels {
namespace {

constexpr unsigned threads = 256;
constexpr std::size_t max_blocks = 1024;  // a few waves of an H100/H200 (132 SMs); larger fills loop

// blockIdx.y strides over the rows, the threads along x over a row (fill_row.hpp).
__global__ void fill_kernel(Fill fill) {
  fill_rows(fill, blockIdx.y, gridDim.y, static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x,
            static_cast<std::size_t>(gridDim.x) * blockDim.x);
}

struct ByteCopy {
  const void* source = nullptr;
  void* target = nullptr;
  std::size_t bytes = 0;
};

// 16 bytes at a time when both ends and the size allow it (allocations are 256-byte aligned), else
// one byte at a time.
__global__ void copy_kernel(ByteCopy copy) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const auto source = reinterpret_cast<std::uintptr_t>(copy.source);
  const auto target = reinterpret_cast<std::uintptr_t>(copy.target);
  if (((source | target | copy.bytes) & 15U) == 0) {
    const auto* from = static_cast<const uint4*>(copy.source);
    auto* to = static_cast<uint4*>(copy.target);
    for (; i < copy.bytes / 16; i += stride) to[i] = from[i];
    return;
  }
  const auto* from = static_cast<const unsigned char*>(copy.source);
  auto* to = static_cast<unsigned char*>(copy.target);
  for (; i < copy.bytes; i += stride) to[i] = from[i];
}

unsigned blocks_for(std::size_t units) {
  const std::size_t wanted = (units + threads - 1) / threads;
  return static_cast<unsigned>(wanted == 0 ? 1 : (wanted < max_blocks ? wanted : max_blocks));
}

// Whether `pointer` is memory a kernel on `device` writes as the runtime's copy or memset would:
// device memory of that device, or managed memory. (Host memory, even pinned, is left to the
// copy engines.)
bool is_memory_of(const void* pointer, int device) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return (attributes.type == cudaMemoryTypeDevice && attributes.device == device) ||
         attributes.type == cudaMemoryTypeManaged;
}

// A node's edges, with their data (ports and types), in one direction.
struct Edges {
  std::vector<cudaGraphNode_t> nodes;
  std::vector<cudaGraphEdgeData> data;
};

cudaError_t dependencies_of(cudaGraphNode_t node, Edges& edges) {
  std::size_t count = 0;
  if (const cudaError_t counted = cudaGraphNodeGetDependencies(node, nullptr, nullptr, &count);
      counted != cudaSuccess) {
    return counted;
  }
  edges.nodes.resize(count);
  edges.data.resize(count);
  return count == 0 ? cudaSuccess : cudaGraphNodeGetDependencies(node, edges.nodes.data(), edges.data.data(), &count);
}

cudaError_t dependents_of(cudaGraphNode_t node, Edges& edges) {
  std::size_t count = 0;
  if (const cudaError_t counted = cudaGraphNodeGetDependentNodes(node, nullptr, nullptr, &count);
      counted != cudaSuccess) {
    return counted;
  }
  edges.nodes.resize(count);
  edges.data.resize(count);
  return count == 0 ? cudaSuccess : cudaGraphNodeGetDependentNodes(node, edges.nodes.data(), edges.data.data(), &count);
}

// Puts a kernel node of `kernel` in `old`'s place: the same incoming and outgoing edges (with
// their data), then `old` goes. `arguments` point at the kernel's arguments (copied into the node).
cudaError_t replace_by_kernel(cudaGraph_t graph, cudaGraphNode_t old, void* kernel, dim3 grid, void** arguments) {
  Edges in;
  Edges out;
  if (const cudaError_t got = dependencies_of(old, in); got != cudaSuccess) return got;
  if (const cudaError_t got = dependents_of(old, out); got != cudaSuccess) return got;
  cudaGraphNodeParams params{};
  params.type = cudaGraphNodeTypeKernel;
  params.kernel.func = kernel;
  params.kernel.gridDim = grid;
  params.kernel.blockDim = dim3(threads);
  params.kernel.sharedMemBytes = 0;
  params.kernel.kernelParams = arguments;
  params.kernel.extra = nullptr;
  cudaGraphNode_t added = nullptr;
  if (const cudaError_t made =
          cudaGraphAddNode(&added, graph, in.nodes.data(), in.data.data(), in.nodes.size(), &params);
      made != cudaSuccess) {
    return made;
  }
  if (!out.nodes.empty()) {
    const std::vector<cudaGraphNode_t> from(out.nodes.size(), added);
    if (const cudaError_t linked =
            cudaGraphAddDependencies(graph, from.data(), out.nodes.data(), out.data.data(), out.nodes.size());
        linked != cudaSuccess) {
      return linked;
    }
  }
  return cudaGraphDestroyNode(old);  // and its edges
}

// A memset node: a fill kernel, when its memory is this device's.
cudaError_t rewrite_memset(cudaGraph_t graph, cudaGraphNode_t node, int device, bool rewrite, NodeRewrites& counts) {
  cudaMemsetParams memset{};
  if (const cudaError_t got = cudaGraphMemsetNodeGetParams(node, &memset); got != cudaSuccess) return got;
  const bool supported = memset.elementSize == 1 || memset.elementSize == 2 || memset.elementSize == 4;
  if (!rewrite || !supported || !is_memory_of(memset.dst, device)) {
    ++counts.memsets_kept;
    return cudaSuccess;
  }
  Fill fill;
  fill.target = memset.dst;
  fill.pitch = memset.pitch;
  fill.value = memset.value;
  fill.element_bytes = memset.elementSize;
  fill.width = memset.width;
  fill.height = memset.height;
  void* arguments[] = {&fill};
  const std::size_t rows = fill.height == 0 ? 1 : (fill.height < max_blocks ? fill.height : max_blocks);
  const dim3 grid(blocks_for(fill.width * fill.element_bytes / 16), static_cast<unsigned>(rows));
  const cudaError_t replaced = replace_by_kernel(graph, node, reinterpret_cast<void*>(&fill_kernel), grid, arguments);
  if (replaced == cudaSuccess) ++counts.memsets_rewritten;
  return replaced;
}

// A memcpy node: a copy kernel, when it copies one row of bytes between memory of this device.
cudaError_t rewrite_memcpy(cudaGraph_t graph, cudaGraphNode_t node, int device, bool rewrite, NodeRewrites& counts) {
  cudaMemcpy3DParms copy{};
  if (const cudaError_t got = cudaGraphMemcpyNodeGetParams(node, &copy); got != cudaSuccess) return got;
  const bool one_row = copy.srcArray == nullptr && copy.dstArray == nullptr && copy.extent.height <= 1 &&
                       copy.extent.depth <= 1 && copy.srcPos.y == 0 && copy.srcPos.z == 0 && copy.dstPos.y == 0 &&
                       copy.dstPos.z == 0 && copy.srcPtr.ptr != nullptr && copy.dstPtr.ptr != nullptr;
  const bool device_kind = copy.kind == cudaMemcpyDeviceToDevice || copy.kind == cudaMemcpyDefault;
  ByteCopy job;
  if (one_row) {
    job.source = static_cast<const unsigned char*>(copy.srcPtr.ptr) + copy.srcPos.x;
    job.target = static_cast<unsigned char*>(copy.dstPtr.ptr) + copy.dstPos.x;
    job.bytes = copy.extent.width;
  }
  if (!rewrite || !one_row || !device_kind || !is_memory_of(job.source, device) || !is_memory_of(job.target, device)) {
    ++counts.memcpys_kept;
    return cudaSuccess;
  }
  void* arguments[] = {&job};
  const dim3 grid(blocks_for(job.bytes / 16));
  const cudaError_t replaced = replace_by_kernel(graph, node, reinterpret_cast<void*>(&copy_kernel), grid, arguments);
  if (replaced == cudaSuccess) ++counts.memcpys_rewritten;
  return replaced;
}

}  // namespace

cudaError_t rewrite_for_launch(cudaGraph_t graph, RewriteChoice choice, NodeRewrites& counts) {
  int device = 0;
  if (const cudaError_t got = cudaGetDevice(&device); got != cudaSuccess) return got;
  std::size_t count = 0;
  if (const cudaError_t counted = cudaGraphGetNodes(graph, nullptr, &count); counted != cudaSuccess) return counted;
  std::vector<cudaGraphNode_t> nodes(count);
  if (count != 0) {
    if (const cudaError_t listed = cudaGraphGetNodes(graph, nodes.data(), &count); listed != cudaSuccess) return listed;
  }
  for (cudaGraphNode_t node : nodes) {  // in creation order: two captures of one topology rewrite alike
    cudaGraphNodeType type{};
    if (const cudaError_t typed = cudaGraphNodeGetType(node, &type); typed != cudaSuccess) return typed;
    cudaError_t done = cudaSuccess;
    if (type == cudaGraphNodeTypeMemset) done = rewrite_memset(graph, node, device, choice.memsets, counts);
    if (type == cudaGraphNodeTypeMemcpy) done = rewrite_memcpy(graph, node, device, choice.memcpys, counts);
    if (done != cudaSuccess) return done;
  }
  return cudaSuccess;
}

}  // namespace cgt::kernels
