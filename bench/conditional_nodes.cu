// The GPU time a conditional node costs on this card (no anchor publishes one): graphs of N
// repetitions of one empty kernel, as they are (the floor), inside one WHILE node of N iterations
// (each iteration the kernel and the kernel that decides), as N IF nodes taken (each after the
// kernel that sets its handle), and as N SWITCH nodes of 4 bodies; against the same kernels
// without the nodes. Each graph is launched `launches` times; GPU time by events.
//
//   conditional_nodes [N] [launches]   prints a markdown table, and "node,<what>,<us per repetition>" lines
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <vector>

namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}

__global__ void empty_kernel() {}
__global__ void set_handle(cudaGraphConditionalHandle handle, unsigned value) { cudaGraphSetConditional(handle, value); }
__global__ void reset(unsigned* counter) { *counter = 0; }
__global__ void count_down(cudaGraphConditionalHandle handle, unsigned* counter, unsigned n) {
  cudaGraphSetConditional(handle, ++*counter < n ? 1U : 0U);
}

// The body of a conditional node `params` (added to `graph` after `after`), captured from `fill`.
template <class Fill>
cudaGraphNode_t add_conditional(cudaGraph_t graph, cudaGraphNode_t after, cudaGraphConditionalHandle handle,
                                cudaGraphConditionalNodeType type, unsigned bodies, cudaStream_t side, Fill fill) {
  cudaGraphNodeParams params{};
  params.type = cudaGraphNodeTypeConditional;
  params.conditional.handle = handle;
  params.conditional.type = type;
  params.conditional.size = bodies;
  cudaGraphNode_t node = nullptr;
  check(cudaGraphAddNode(&node, graph, after != nullptr ? &after : nullptr, nullptr, after != nullptr ? 1 : 0, &params),
        "adding a conditional node");
  for (unsigned b = 0; b < bodies; ++b) {
    check(cudaStreamBeginCaptureToGraph(side, params.conditional.phGraph_out[b], nullptr, nullptr, 0,
                                        cudaStreamCaptureModeRelaxed),
          "capturing a body");
    fill(b);
    cudaGraph_t ended = nullptr;
    check(cudaStreamEndCapture(side, &ended), "ending a body");
  }
  return node;
}

// Captures `launch_all` on `stream` into a new graph.
template <class Launch>
cudaGraph_t capture(cudaStream_t stream, Launch launch_all) {
  cudaGraph_t graph = nullptr;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), "beginning a capture");
  launch_all();
  check(cudaStreamEndCapture(stream, &graph), "ending a capture");
  return graph;
}

// Host CPU microseconds one cudaGraphLaunch of `graph` costs (thread CPU time), the GPU idle before
// each: the median of `launches`.
double launch_cpu_us(cudaGraph_t graph, cudaStream_t stream, int launches) {
  cudaGraphExec_t exec = nullptr;
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiating");
  check(cudaGraphUpload(exec, stream), "uploading");
  std::vector<double> times;
  for (int i = 0; i < launches + 3; ++i) {
    check(cudaStreamSynchronize(stream), "sync");
    timespec begin{}, end{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &begin);
    check(cudaGraphLaunch(exec, stream), "launch");
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &end);
    if (i >= 3) {
      times.push_back(static_cast<double>(end.tv_sec - begin.tv_sec) * 1e6 +
                      static_cast<double>(end.tv_nsec - begin.tv_nsec) / 1e3);
    }
  }
  check(cudaStreamSynchronize(stream), "sync");
  std::sort(times.begin(), times.end());
  check(cudaGraphExecDestroy(exec), "destroy");
  return times[times.size() / 2];
}

// GPU microseconds per launch of `graph`, the median of `launches`.
double gpu_us(cudaGraph_t graph, cudaStream_t stream, int launches) {
  cudaGraphExec_t exec = nullptr;
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiating");
  cudaEvent_t begin = nullptr, end = nullptr;
  check(cudaEventCreate(&begin), "event");
  check(cudaEventCreate(&end), "event");
  std::vector<float> times;
  for (int i = 0; i < launches + 3; ++i) {
    check(cudaEventRecord(begin, stream), "record");
    check(cudaGraphLaunch(exec, stream), "launch");
    check(cudaEventRecord(end, stream), "record");
    check(cudaEventSynchronize(end), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, begin, end), "elapsed");
    if (i >= 3) times.push_back(ms * 1000.0F);
  }
  std::sort(times.begin(), times.end());
  check(cudaGraphExecDestroy(exec), "destroy");
  check(cudaEventDestroy(begin), "event");
  check(cudaEventDestroy(end), "event");
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const unsigned n = argc > 1 ? static_cast<unsigned>(std::atoi(argv[1])) : 1000;
  const int launches = argc > 2 ? std::atoi(argv[2]) : 20;
  cudaStream_t stream = nullptr, side = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  check(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), "stream");
  unsigned* counter = nullptr;
  check(cudaMalloc(&counter, sizeof(unsigned)), "malloc");
  cudaDeviceProp properties{};
  check(cudaGetDeviceProperties(&properties, 0), "properties");

  // The floors: N empty kernels; N pairs (what each conditional repetition launches besides its node).
  const double one = gpu_us(capture(stream, [&] {
                              for (unsigned i = 0; i < n; ++i) empty_kernel<<<1, 1, 0, stream>>>();
                            }),
                            stream, launches);
  const double pairs = gpu_us(capture(stream, [&] {
                                for (unsigned i = 0; i < 2 * n; ++i) empty_kernel<<<1, 1, 0, stream>>>();
                              }),
                              stream, launches);

  // WHILE: one node, N iterations of {kernel, decide}.
  cudaGraph_t loop = nullptr;
  check(cudaGraphCreate(&loop, 0), "graph");
  cudaGraphConditionalHandle loop_handle = 0;
  check(cudaGraphConditionalHandleCreate(&loop_handle, loop, 1, cudaGraphCondAssignDefault), "handle");
  cudaGraphNode_t first = nullptr;
  {
    cudaKernelNodeParams kernel{};
    void* args[] = {&counter};
    kernel.func = reinterpret_cast<void*>(reset);
    kernel.gridDim = dim3(1);
    kernel.blockDim = dim3(1);
    kernel.kernelParams = args;
    check(cudaGraphAddKernelNode(&first, loop, nullptr, 0, &kernel), "reset node");
  }
  (void)add_conditional(loop, first, loop_handle, cudaGraphCondTypeWhile, 1, side, [&](unsigned) {
    empty_kernel<<<1, 1, 0, side>>>();
    count_down<<<1, 1, 0, side>>>(loop_handle, counter, n);
  });
  const double loop_us = gpu_us(loop, stream, launches);

  // IF and SWITCH: N nodes in a chain, each after the kernel that sets its handle; the taken body
  // one empty kernel.
  auto chain = [&](cudaGraphConditionalNodeType type, unsigned bodies, unsigned value) {
    cudaGraph_t graph = nullptr;
    check(cudaGraphCreate(&graph, 0), "graph");
    cudaGraphNode_t last = nullptr;
    for (unsigned i = 0; i < n; ++i) {
      cudaGraphConditionalHandle handle = 0;
      check(cudaGraphConditionalHandleCreate(&handle, graph, 0, 0), "handle");
      cudaKernelNodeParams kernel{};
      void* args[] = {&handle, &value};
      kernel.func = reinterpret_cast<void*>(set_handle);
      kernel.gridDim = dim3(1);
      kernel.blockDim = dim3(1);
      kernel.kernelParams = args;
      cudaGraphNode_t set = nullptr;
      check(cudaGraphAddKernelNode(&set, graph, last != nullptr ? &last : nullptr, last != nullptr ? 1 : 0, &kernel),
            "set node");
      last = add_conditional(graph, set, handle, type, bodies, side,
                             [&](unsigned) { empty_kernel<<<1, 1, 0, side>>>(); });
    }
    return gpu_us(graph, stream, launches);
  };
  const double if_us = chain(cudaGraphCondTypeIf, 1, 1);
  const double if_skipped_us = chain(cudaGraphCondTypeIf, 1, 0);
  const double switch_us = chain(cudaGraphCondTypeSwitch, 4, 2);

  // The host's side: one launch of a plain graph of `kernels` empty kernels, against one whose
  // kernels are the body of a WHILE node (one iteration) or of an IF node taken.
  auto plain_of = [&](unsigned kernels) {
    return capture(stream, [&] {
      for (unsigned i = 0; i < kernels; ++i) empty_kernel<<<1, 1, 0, stream>>>();
    });
  };
  auto conditional_of = [&](cudaGraphConditionalNodeType type, unsigned kernels) {
    cudaGraph_t graph = nullptr;
    check(cudaGraphCreate(&graph, 0), "graph");
    cudaGraphConditionalHandle handle = 0;
    check(cudaGraphConditionalHandleCreate(&handle, graph, 1, cudaGraphCondAssignDefault), "handle");
    (void)add_conditional(graph, nullptr, handle, type, 1, side, [&](unsigned) {
      for (unsigned i = 0; i < kernels; ++i) empty_kernel<<<1, 1, 0, side>>>();
      if (type == cudaGraphCondTypeWhile) set_handle<<<1, 1, 0, side>>>(handle, 0);
    });
    return graph;
  };
  std::printf("# host CPU of one cudaGraphLaunch on %s (median of 200, the GPU idle before each)\n", properties.name);
  std::printf("| graph | 1 kernel | 40 kernels |\n|---|---|---|\n");
  std::printf("| plain | %.2f | %.2f |\n", launch_cpu_us(plain_of(1), stream, 200), launch_cpu_us(plain_of(40), stream, 200));
  std::printf("| the kernels in a WHILE node (one iteration) | %.2f | %.2f |\n",
              launch_cpu_us(conditional_of(cudaGraphCondTypeWhile, 1), stream, 200),
              launch_cpu_us(conditional_of(cudaGraphCondTypeWhile, 40), stream, 200));
  std::printf("| the kernels in an IF node (taken) | %.2f | %.2f |\n\n",
              launch_cpu_us(conditional_of(cudaGraphCondTypeIf, 1), stream, 200),
              launch_cpu_us(conditional_of(cudaGraphCondTypeIf, 40), stream, 200));

  const auto per = [n](double us) { return us / n; };
  std::printf("# conditional nodes on %s, %u repetitions, median of %d launches (GPU time by events)\n",
              properties.name, n, launches);
  std::printf("| what | GPU us per repetition | over its kernels without the node |\n|---|---|---|\n");
  std::printf("| 1 empty kernel (floor) | %.3f | - |\n", per(one));
  std::printf("| 2 empty kernels (floor of the rows below) | %.3f | - |\n", per(pairs));
  std::printf("| WHILE iteration: kernel + decide | %.3f | %.3f |\n", per(loop_us), per(loop_us - pairs));
  std::printf("| IF taken: set + IF{kernel} | %.3f | %.3f |\n", per(if_us), per(if_us - pairs));
  std::printf("| IF not taken: set + IF{kernel} | %.3f | %.3f |\n", per(if_skipped_us), per(if_skipped_us - one));
  std::printf("| SWITCH of 4, one taken: set + SWITCH{kernel} | %.3f | %.3f |\n", per(switch_us), per(switch_us - pairs));
  std::fprintf(stderr, "node,floor,%.4f\nnode,while,%.4f\nnode,if,%.4f\nnode,if_skipped,%.4f\nnode,switch,%.4f\n", per(one),
               per(loop_us - pairs), per(if_us - pairs), per(if_skipped_us - one), per(switch_us - pairs));
  return 0;
}
