// The model benchmark's C++ half (`scripts/gpu.sh bench-models` runs it after
// `bench/models/models.py export DIR`): serves the exported models from C++, eagerly with libtorch
// and through cgt.torch, TorchScript and AOTInductor, on the requests the export wrote, and
// compares every output with eager PyTorch's (the .output files).
//
//   model_bench DIR MODEL [CALLS]        MODEL: bert | resnet
//
// Per format (TorchScript DIR/MODEL.pt, AOTInductor DIR/MODEL.pt2, and DIR/MODEL-b1.pt2, a
// package exported for batch 1, at batch 1):
//   * capture (after serving): a fresh pool, the model registered, then warm-up + recording + the
//     first replay of each CAPTURE_SIZES batch in turn (priming runs included), timed per size;
//     the format's default, and AOTI also with `warm_up_each_shape = true` (as PyTorch's trees);
//     TorchScript also with `jit_optimize = false` (no executor optimisations, served too);
//     then, on fresh pools, the same sizes as one startup loop synchronised at its ends only, and
//     sizes 4-32 likewise after 1 and 2;
//   * serve, per batch of SIZES: eager libtorch and cgt.torch, CPU per call with the GPU idle,
//     wall per call back to back, latency of one request (call + synchronise), max |difference|
//     from eager PyTorch; the methods interleaved in rounds, each cell the median round;
//   * launch: the model captured by libtorch's CUDAGraph (as captured: no node rewrite), its node
//     types, and the CPU of a raw cudaGraphLaunch of it and of cgt's call in turn, with the GPU
//     idle (right after a synchronisation, and 1 ms after one), then each alone, call after call,
//     and each right after a small kernel; then cgt's call against a kernel-only graph of its size;
//   * pool: the cgt pool's reserved bytes after serving every size.
// Prints the CSV lines bench/models/report.py reads (the same as models.py's), plus
//   launch,MODEL,BATCH,METHOD,nodes,memsets,raw_us,cgt_us,raw_us_after_1ms,cgt_us_after_1ms,
//          raw_us_alone,cgt_us_alone,raw_us_after_small_kernel,cgt_us_after_small_kernel
//   calls,MODEL,METHOD,replays,eager calls
//   nodes / rewritten,MODEL,BATCH,FORMAT,<the captured graph's node types and shape, before and after
//          cgt's memset rewrite>
//   rewrittenlaunch,MODEL,BATCH,FORMAT,<raw launch of the rewritten graph: alone, after a small kernel>
//   rewrittenflags,MODEL,BATCH,FORMAT,<the same after a small kernel, instantiated with flags 0,
//     auto-free on launch, node priority, both>
//   cgtsplit,MODEL,BATCH,FORMAT,<cgt's call taken apart, in one loop with the raw launches, each right
//          after a small kernel: see split_cgt_call>
//   cudacalls,MODEL,BATCH,FORMAT,<CUDA runtime calls per cgt call, by name>
//   cgtgraph,flags F,MODEL,BATCH,FORMAT,<the graph cgt launches: its instantiate flags, node types and shape>
//   kernelonly,MODEL,BATCH,FORMAT,N,reference nodes,model call us,reference call us,ratio,raw reference exec us,
//          raw model exec us,model call spun us,reference call spun us,ratio spun
//     <cgt's call of the model against a pool function whose graph is N kernel nodes in one chain (N: the
//     nodes of the graph cgt's call launches), each right after a small kernel; spun: the thread kept on the
//     CPU 50 us before the call; see kernel_only_reference>
//   graphcounts,MODEL,FORMAT,<the pool's GraphCounts after serving>
// and, at the end, the kernelonly lines as a table (the target: the model's call within 1.5x of the
// reference's). With CGT_BENCH_SECOND_PASS set, only the serving lines (a second pass, against
// drift). The CUDA runtime calls are counted by the probe of cuda_probe.hpp.
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "cuda_probe.hpp"
#include "node_rewrite.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <memory>
#include <mutex>
#include <map>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

import cgt;
import cgt.torch;

namespace {

constexpr std::int64_t sizes[] = {1, 8, 32};                    // the serving table (models.py SIZES)
constexpr std::int64_t capture_sizes[] = {1, 2, 4, 8, 16, 32};  // models.py CAPTURE_SIZES
constexpr std::int64_t sequence = 128;
constexpr int rounds = 3;

template <class T>
T must(cgt::Result<T> result, const char* what) {
  if (!result) {
    std::cerr << what << ": " << result.error().describe() << '\n';
    std::exit(1);
  }
  return std::move(*result);
}

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::cerr << what << ": " << cudaGetErrorString(status) << '\n';
    std::exit(1);
  }
}

using Clock = std::chrono::steady_clock;
double micros(Clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}
// The calling thread's CPU time so far, in microseconds.
double thread_cpu_micros() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) * 1e6 + static_cast<double>(now.tv_nsec) / 1e3;
}

void synchronize() {
  check(cudaDeviceSynchronize(), "synchronising");
}

// What each timed launch of the launch diagnosis follows (issue 27, item 6): a small kernel that
// ran alone on the GPU, synchronised before and after, so the GPU is idle after short work.
void after_small_kernel(const at::Tensor& small) {
  synchronize();
  small.add_(1);
  synchronize();
}

// Keeps the calling thread on the CPU for `duration`, reading the clock (no sleep, no yield).
void spin(Clock::duration duration) {
  const auto until = Clock::now() + duration;
  while (Clock::now() < until) {
  }
}

double median(std::vector<double> values) {
  std::ranges::sort(values);
  return values.empty() ? 0 : values[values.size() / 2];
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::cerr << "cannot read " << path << " (run bench/models/models.py export first)\n";
    std::exit(1);
  }
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A request of `batch` as the export wrote it (the same bytes eager PyTorch ran), on the GPU.
at::Tensor request(const std::string& dir, const std::string& model, std::int64_t batch) {
  const std::string bytes = read_file(dir + "/" + model + "-b" + std::to_string(batch) + ".input");
  const bool tokens = model == "bert";
  const auto type = tokens ? at::kLong : at::kFloat;
  std::vector<std::int64_t> shape =
      tokens ? std::vector<std::int64_t>{batch, sequence} : std::vector<std::int64_t>{batch, 3, 224, 224};
  at::Tensor host = at::empty(shape, at::TensorOptions().dtype(type));
  if (static_cast<std::size_t>(host.nbytes()) != bytes.size()) {
    std::cerr << model << " batch " << batch << ": the input file has the wrong size\n";
    std::exit(1);
  }
  std::memcpy(host.data_ptr(), bytes.data(), bytes.size());
  return host.to(at::Device(at::kCUDA, 0));
}

// A request of a size the export did not write (capture timing only: any values do).
at::Tensor any_request(const std::string& model, std::int64_t batch) {
  const auto cuda = at::TensorOptions().device(at::kCUDA, 0);
  if (model == "bert") return at::randint(0, 30522, {batch, sequence}, cuda.dtype(at::kLong));
  return at::randn({batch, 3, 224, 224}, cuda);
}

at::Tensor reference(const std::string& dir, const std::string& model, std::int64_t batch) {
  const std::string bytes = read_file(dir + "/" + model + "-b" + std::to_string(batch) + ".output");
  at::Tensor host = at::empty({static_cast<std::int64_t>(bytes.size() / sizeof(float))}, at::kFloat);
  std::memcpy(host.data_ptr(), bytes.data(), bytes.size());
  return host;
}

double difference(const at::Tensor& output, const at::Tensor& expected) {
  const at::Tensor got = output.detach().to(at::kCPU, at::kFloat).flatten();
  if (got.numel() != expected.numel()) return INFINITY;
  return (got - expected).abs().max().item<double>();
}

struct Timing {
  double cpu = 0, wall = 0, latency = 0;
};

// The same method as models.py's timed(): CPU with the GPU idle, latency, wall back to back.
Timing timed(const std::function<void()>& call, int calls) {
  for (int i = 0; i < 10; ++i) call();
  std::vector<double> cpu, latency;
  for (int i = 0; i < calls; ++i) {
    synchronize();
    const auto start = Clock::now();
    call();
    cpu.push_back(micros(Clock::now() - start));
  }
  for (int i = 0; i < std::max(calls / 2, 10); ++i) {
    synchronize();
    const auto start = Clock::now();
    call();
    synchronize();
    latency.push_back(micros(Clock::now() - start));
  }
  synchronize();
  const auto start = Clock::now();
  for (int i = 0; i < calls; ++i) call();
  synchronize();
  return {median(cpu), micros(Clock::now() - start) / calls, median(latency)};
}

// A way to run the model: eager or through a pool; `output` runs once and returns output 0.
struct Method {
  std::string name;
  std::function<void(const at::Tensor&)> call;
  std::function<at::Tensor(const at::Tensor&)> output;
};

struct Format {
  std::string label;  // "TorchScript" or "AOTI"
  std::function<std::vector<at::Tensor>(const at::Tensor&)> run_eager;
  // Registers the model with `pool` (a fresh registration per call).
  std::function<cgt::torch::Model(cgt::torch::Pool&, std::optional<bool> warm_up_each_shape)> add_to;
  // The batch sizes it serves (a package exported for one batch size serves that one only).
  std::vector<std::int64_t> sizes{std::begin(::sizes), std::end(::sizes)};
  bool time_capture = true;
  // Runs the model once for capture by libtorch's CUDAGraph (a runner that can be captured);
  // empty: no raw launch is measured.
  std::function<void(const at::Tensor&)> run_capturable;
};

void print_capture(const std::string& model, const std::string& method, const std::vector<double>& per_size) {
  double total = 0;
  std::ostringstream sizes_text, times;
  for (std::size_t i = 0; i < per_size.size(); ++i) {
    total += per_size[i];
    sizes_text << (i ? " " : "") << capture_sizes[i];
    times << (i ? " " : "") << per_size[i];
  }
  std::printf("capture,%s,%s,%s,%.1f,%s\n", model.c_str(), method.c_str(), sizes_text.str().c_str(), total,
              times.str().c_str());
  std::fflush(stdout);
}

// Calls `fn` on `x`, a step each, until the call records (warm-ups and priming first).
void call_until_recorded(cgt::torch::Pool& pool, const cgt::torch::Model& fn, const at::Tensor& x) {
  cgt::CallKind kind = cgt::CallKind::warmup;
  for (int call = 0; call < 6 && kind != cgt::CallKind::recording; ++call) {
    pool.mark_step_begin();
    kind = must(fn({x}), "capture call").kind();
  }
}

// Warm-up + recording of every capture size in turn on a fresh pool, timed per size up to the end
// of the recording call (synchronised); the first replay follows, untimed.
void time_capture(const std::string& model, const Format& format, std::optional<bool> warm_up_each_shape,
                  const char* suffix) {
  cgt::torch::Pool pool = must(cgt::torch::make_pool({.device = 0}), "making a pool");
  std::vector<double> per_size;
  {
    const cgt::torch::Model fn = format.add_to(pool, warm_up_each_shape);
    for (const std::int64_t batch : capture_sizes) {
      const at::Tensor x = any_request(model, batch);
      synchronize();
      const auto start = Clock::now();
      call_until_recorded(pool, fn, x);
      synchronize();
      per_size.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
      pool.mark_step_begin();
      if (must(fn({x}), "replay").kind() != cgt::CallKind::replay) std::printf("note,%s,no replay\n", model.c_str());
    }
  }
  print_capture(model, "cgt.torch (" + format.label + suffix + ")", per_size);
}

// Records each of `sizes` in turn through `fn` (calls until the recording), as a server's startup
// loop does: synchronised at its start and end only, so a size's capture may overlap the previous
// size's first replay. Milliseconds.
double record_in_one_loop(cgt::torch::Pool& pool, const cgt::torch::Model& fn, const std::string& model,
                          std::span<const std::int64_t> sizes) {
  std::vector<at::Tensor> requests;
  for (const std::int64_t batch : sizes) requests.push_back(any_request(model, batch));
  synchronize();
  const auto start = Clock::now();
  for (const at::Tensor& x : requests) call_until_recorded(pool, fn, x);
  synchronize();
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// The startup loop over every capture size on a fresh pool, and, on another, sizes 4-32 as one
// loop after 1 and 2 (where reduce-overhead compiles; models.py times its recordings alike).
void time_capture_loop(const std::string& model, const Format& format) {
  const std::string method = "cgt.torch (" + format.label + "; one loop";
  {
    cgt::torch::Pool pool = must(cgt::torch::make_pool({.device = 0}), "making a pool");
    const cgt::torch::Model fn = format.add_to(pool, std::nullopt);
    const double total = record_in_one_loop(pool, fn, model, capture_sizes);
    std::printf("capture,%s,%s),1 2 4 8 16 32,%.1f,-\n", model.c_str(), method.c_str(), total);
  }
  {
    cgt::torch::Pool pool = must(cgt::torch::make_pool({.device = 0}), "making a pool");
    const cgt::torch::Model fn = format.add_to(pool, std::nullopt);
    (void)record_in_one_loop(pool, fn, model, std::span(capture_sizes).first(2));
    const double total = record_in_one_loop(pool, fn, model, std::span(capture_sizes).subspan(2));
    std::printf("capture,%s,%s after 1 2),4 8 16 32,%.1f,-\n", model.c_str(), method.c_str(), total);
  }
  std::fflush(stdout);
}

struct NodeTypes {
  std::size_t total = 0, memsets = 0;
  // What else may make a launch costly (issue 12, item 4): kernels launched with a thread-block
  // cluster, programmatic (PDL) dependencies, node types other than kernels and memsets, and how
  // many distinct kernels the graph runs.
  std::size_t cluster_kernels = 0, programmatic_edges = 0, other_nodes = 0, distinct_kernels = 0;
  // The shape (issue 27, item 6: what a graph launched slowly has that a kernel-only graph does
  // not): nodes without a dependency, nodes that wait on several, nodes several wait on, edges.
  std::size_t roots = 0, joins = 0, forks = 0, edges = 0;
  // Kernel nodes with a priority or another launch attribute set; memcpy nodes.
  std::size_t prioritised_kernels = 0, memcpys = 0;
};

NodeTypes node_types(cudaGraph_t graph) {
  std::size_t count = 0;
  check(cudaGraphGetNodes(graph, nullptr, &count), "counting nodes");
  std::vector<cudaGraphNode_t> nodes(count);
  check(cudaGraphGetNodes(graph, nodes.data(), &count), "listing nodes");
  NodeTypes types{.total = count};
  std::vector<void*> kernels;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    check(cudaGraphNodeGetType(node, &type), "node type");
    if (type == cudaGraphNodeTypeMemset) {
      ++types.memsets;
    } else if (type == cudaGraphNodeTypeKernel) {
      cudaKernelNodeParams params{};
      if (cudaGraphKernelNodeGetParams(node, &params) == cudaSuccess &&
          std::ranges::find(kernels, params.func) == kernels.end()) {
        kernels.push_back(params.func);
      }
      cudaLaunchAttributeValue cluster{};
      if (cudaGraphKernelNodeGetAttribute(node, cudaLaunchAttributeClusterDimension, &cluster) == cudaSuccess &&
          cluster.clusterDim.x * cluster.clusterDim.y * cluster.clusterDim.z > 1) {
        ++types.cluster_kernels;
      }
      cudaLaunchAttributeValue priority{};
      if (cudaGraphKernelNodeGetAttribute(node, cudaLaunchAttributePriority, &priority) == cudaSuccess &&
          priority.priority != 0) {
        ++types.prioritised_kernels;
      }
    } else if (type == cudaGraphNodeTypeMemcpy) {
      ++types.memcpys;
      ++types.other_nodes;
    } else {
      ++types.other_nodes;
    }
  }
  (void)cudaGetLastError();  // an attribute a node does not have
  types.distinct_kernels = kernels.size();
  std::size_t edges = 0;
  if (cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &edges) == cudaSuccess && edges > 0) {
    std::vector<cudaGraphNode_t> from(edges), to(edges);
    std::vector<cudaGraphEdgeData> data(edges);
    if (cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &edges) == cudaSuccess) {
      types.edges = edges;
      std::map<cudaGraphNode_t, std::size_t> in, out;
      for (std::size_t e = 0; e < edges; ++e) {
        if (data[e].type == cudaGraphDependencyTypeProgrammatic) ++types.programmatic_edges;
        ++out[from[e]];
        ++in[to[e]];
      }
      for (cudaGraphNode_t node : nodes) {
        if (in[node] == 0) ++types.roots;
        if (in[node] > 1) ++types.joins;
        if (out[node] > 1) ++types.forks;
      }
    }
  } else {
    types.roots = count;
  }
  (void)cudaGetLastError();
  return types;
}

void print_node_types(const char* what, const std::string& model, std::int64_t batch, const std::string& label,
                      const NodeTypes& types) {
  std::printf(
      "%s,%s,%lld,%s,%zu nodes: %zu memsets; %zu memcpys; %zu kernels with a cluster; %zu with a priority; %zu "
      "programmatic edges; %zu other nodes; %zu distinct kernels; %zu roots, %zu joins, %zu forks, %zu edges\n",
      what, model.c_str(), static_cast<long long>(batch), label.c_str(), types.total, types.memsets, types.memcpys,
      types.cluster_kernels, types.prioritised_kernels, types.programmatic_edges, types.other_nodes,
      types.distinct_kernels, types.roots, types.joins, types.forks, types.edges);
}

// Issue 27, item 6: the captured graph with its memsets rewritten as cgt rewrites them
// (cgt::kernels::rewrite_for_launch on a clone), instantiated and launched raw, alone and right
// after a small kernel: whether a slow cgt call is the graph's own launch cost or cgt's, and what
// the rewritten graph still has. Prints "rewritten,..." (node types) and
// "rewrittenlaunch,MODEL,BATCH,FORMAT,alone us,after a small kernel us".
void rewritten_launch(const std::string& model, std::int64_t batch, const std::string& label, cudaGraph_t captured,
                      const c10::cuda::CUDAStream& side, int calls) {
  cudaGraph_t copy = nullptr;
  check(cudaGraphClone(&copy, captured), "cloning the graph");
  cgt::kernels::NodeRewrites counts;
  check(cgt::kernels::rewrite_for_launch(copy, {.memsets = true, .memcpys = false}, counts), "rewriting");
  print_node_types("rewritten", model, batch, label, node_types(copy));
  cudaGraphExec_t exec = nullptr;
  check(cudaGraphInstantiate(&exec, copy, 0), "instantiating the rewritten graph");
  check(cudaGraphUpload(exec, side.stream()), "upload");
  at::Tensor small = at::zeros({256}, at::TensorOptions().device(at::kCUDA).dtype(at::kFloat));
  std::vector<double> alone, after_small;
  for (int i = 0; i < calls + 10; ++i) {
    synchronize();
    const auto start = Clock::now();
    check(cudaGraphLaunch(exec, side.stream()), "launch");
    if (i >= 10) alone.push_back(micros(Clock::now() - start));
  }
  for (int i = 0; i < calls + 10; ++i) {
    after_small_kernel(small);
    const auto start = Clock::now();
    check(cudaGraphLaunch(exec, side.stream()), "launch");
    if (i >= 10) after_small.push_back(micros(Clock::now() - start));
  }
  synchronize();
  std::printf("rewrittenlaunch,%s,%lld,%s,%.2f,%.2f\n", model.c_str(), static_cast<long long>(batch), label.c_str(),
              median(alone), median(after_small));
  check(cudaGraphExecDestroy(exec), "destroying");
  // The same rewritten graph instantiated with each of the flags libtorch's CUDAGraph uses (cgt's
  // torch executables have both: cgtgraph's "flags 9"), each launched right after a small kernel:
  // whether an instantiation flag, not the graph, makes cgt's executable launch slower.
  // Prints "rewrittenflags,MODEL,BATCH,FORMAT,flags 0,auto-free on launch,node priority,both" (us).
  const std::array<unsigned long long, 4> flag_sets{
      0, cudaGraphInstantiateFlagAutoFreeOnLaunch, cudaGraphInstantiateFlagUseNodePriority,
      cudaGraphInstantiateFlagAutoFreeOnLaunch | cudaGraphInstantiateFlagUseNodePriority};
  std::array<double, 4> by_flags{};
  for (std::size_t f = 0; f < flag_sets.size(); ++f) {
    cudaGraphExec_t flagged = nullptr;
    check(cudaGraphInstantiateWithFlags(&flagged, copy, flag_sets.at(f)), "instantiating with flags");
    check(cudaGraphUpload(flagged, side.stream()), "upload");
    std::vector<double> times;
    for (int i = 0; i < calls + 10; ++i) {
      after_small_kernel(small);
      const auto start = Clock::now();
      check(cudaGraphLaunch(flagged, side.stream()), "launch");
      if (i >= 10) times.push_back(micros(Clock::now() - start));
    }
    synchronize();
    by_flags.at(f) = median(times);
    check(cudaGraphExecDestroy(flagged), "destroying");
  }
  std::printf("rewrittenflags,%s,%lld,%s,%.2f,%.2f,%.2f,%.2f\n", model.c_str(), static_cast<long long>(batch),
              label.c_str(), by_flags[0], by_flags[1], by_flags[2], by_flags[3]);
  check(cudaGraphDestroy(copy), "destroying");
}

// How the probe saw `exec` instantiated: its graph and flags (graph null where it did not).
probe::Instantiated instantiation_of(cudaGraphExec_t exec) {
  const std::lock_guard<std::mutex> lock(probe::instantiated_mutex());
  const auto entry = probe::instantiated().find(exec);
  return entry == probe::instantiated().end() ? probe::Instantiated{} : entry->second;
}

// The executable `call` launched, through the probe (null where it launched none).
cudaGraphExec_t launched_by(const std::function<void()>& call) {
  probe::launched = nullptr;
  probe::armed = true;
  call();
  probe::armed = false;
  return probe::launched;
}

// Issue 27, item 6, taken apart: in one loop, each right after a small kernel ran alone on the GPU
// (synchronised before and after it), in turn:
//   * the raw launch of libtorch's capture (`exec`, as raw_launch's),
//   * cgt's call, timed in parts through the probe: the step (mark_step_begin), the call until
//     its cudaGraphLaunch began, the launch itself, from its end to the call's return, and the
//     drop of the outputs (the ModelOutputs' destructor),
//   * the raw launch of the executable cgt's call launched (its own graph, input copy node
//     included: whether cgt's graph itself launches slower than libtorch's capture),
//   * for AOTI, the pool function called directly (`fn.function()({x})`: the Model layer bypassed;
//     the same shape key, so the same graph).
// Prints, medians in us:
//   cgtsplit,MODEL,BATCH,FORMAT,raw libtorch exec,raw cgt exec,cgt total,step,until launch,launch,
//            launch to return,drop,function call (- when not measured),cgt total thread CPU
//   cudacalls,MODEL,BATCH,FORMAT,<name=calls per cgt call of every runtime function the probe sees>
//   cgtgraph,flags F,MODEL,BATCH,FORMAT,<the graph cgt launches (F: its instantiate flags), as the nodes lines>
// and "note,..." where a timed call was not a replay or launched no graph.
void split_cgt_call(const std::string& model, std::int64_t batch, const Format& format, const at::Tensor& x, int calls,
                    cgt::torch::Pool& pool, const cgt::torch::Model& fn, cudaGraphExec_t exec,
                    const c10::cuda::CUDAStream& side) {
  const at::Tensor small = at::zeros({256}, x.options().dtype(at::kFloat));
  const bool function_only = format.label.rfind("AOTI", 0) == 0;  // its pool function takes {x}
  std::vector<double> raw, raw_cgt_exec, total, step, until_launch, launch, to_return, drop, function_call, cpu;
  std::array<std::uint64_t, probe::Api::count> api_calls{};
  cudaGraphExec_t cgt_exec = nullptr;
  bool noted = false;
  const auto note = [&](const char* what) {
    if (!noted)
      std::printf("note,%s,%lld,%s,%s\n", model.c_str(), static_cast<long long>(batch), format.label.c_str(), what);
    noted = true;
  };
  for (int i = 0; i < calls + 10; ++i) {
    const bool keep = i >= 10;
    after_small_kernel(small);
    auto start = Clock::now();
    check(cudaGraphLaunch(exec, side.stream()), "launch");
    if (keep) raw.push_back(micros(Clock::now() - start));

    after_small_kernel(small);
    probe::calls = {};
    probe::launched = nullptr;
    probe::armed = true;
    const double cpu_start = thread_cpu_micros();
    const auto t0 = Clock::now();
    pool.mark_step_begin();
    const auto t1 = Clock::now();
    Clock::time_point t2;
    {
      auto out = fn({x});
      t2 = Clock::now();
      if (!out || out->kind() != cgt::CallKind::replay) note("a timed cgt call was not a replay");
    }
    const auto t3 = Clock::now();
    const double cpu_end = thread_cpu_micros();
    probe::armed = false;
    if (probe::launched == nullptr) {
      note("a timed cgt call launched no graph");
    } else {
      cgt_exec = probe::launched;
    }
    if (probe::launched != nullptr && keep) {
      total.push_back(micros(t3 - t0));
      step.push_back(micros(t1 - t0));
      until_launch.push_back(micros(probe::launch_began - t1));
      launch.push_back(micros(probe::launch_ended - probe::launch_began));
      to_return.push_back(micros(t2 - probe::launch_ended));
      drop.push_back(micros(t3 - t2));
      cpu.push_back(cpu_end - cpu_start);
      for (std::size_t a = 0; a < api_calls.size(); ++a) api_calls[a] += probe::calls[a];
    }

    if (cgt_exec != nullptr) {
      after_small_kernel(small);
      start = Clock::now();
      check(cudaGraphLaunch(cgt_exec, side.stream()), "launching cgt's executable");
      if (keep) raw_cgt_exec.push_back(micros(Clock::now() - start));
    }

    if (function_only) {
      after_small_kernel(small);
      start = Clock::now();
      pool.mark_step_begin();
      {
        auto out = fn.function()({x});
        if (!out || out->kind() != cgt::CallKind::replay) note("a timed pool function call was not a replay");
      }
      if (keep) function_call.push_back(micros(Clock::now() - start));
    }
  }
  synchronize();
  std::array<char, 32> function_text{'-', '\0'};
  if (function_only) std::snprintf(function_text.data(), function_text.size(), "%.2f", median(function_call));
  std::printf("cgtsplit,%s,%lld,%s,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%s,%.2f\n", model.c_str(),
              static_cast<long long>(batch), format.label.c_str(), median(raw), median(raw_cgt_exec), median(total),
              median(step), median(until_launch), median(launch), median(to_return), median(drop), function_text.data(),
              median(cpu));
  std::ostringstream counted;
  const double timed = std::max<double>(1, static_cast<double>(total.size()));
  for (std::size_t a = 0; a < api_calls.size(); ++a) {
    if (api_calls[a] != 0)
      counted << (counted.tellp() > 0 ? " " : "") << probe::names[a] << "=" << api_calls[a] / timed;
  }
  std::printf("cudacalls,%s,%lld,%s,%s\n", model.c_str(), static_cast<long long>(batch), format.label.c_str(),
              counted.str().c_str());
  const probe::Instantiated found = instantiation_of(cgt_exec);
  if (found.graph != nullptr) {
    print_node_types(("cgtgraph,flags " + std::to_string(found.flags)).c_str(), model, batch, format.label,
                     node_types(found.graph));
  } else {
    std::printf("cgtgraph,%s,%lld,%s,its instantiation was not seen\n", model.c_str(), static_cast<long long>(batch),
                format.label.c_str());
  }
  std::fflush(stdout);
}

// A pool function whose recorded graph is kernel nodes only, in one chain, as the graph of cgt's
// call of the model is: the copy node of its input (copied, not static, as the model's is), then
// `y = x + 1` and `adds` times `y.add_(1)`; recorded on a fresh pool made as the serving one.
struct Reference {
  cgt::torch::Pool pool;
  cgt::torch::Function fn;
  cudaGraphExec_t exec = nullptr;  // what its replays launch (null where the probe saw none)
  NodeTypes types;                 // that executable's graph
};

Reference record_reference(std::size_t adds, const at::Tensor& input) {
  cgt::torch::Pool pool =
      must(cgt::torch::make_pool({.device = 0, .rewrite_memset_nodes = true}), "making the reference's pool");
  cgt::torch::Function fn = must(pool.add_function(
                                     [adds](cgt::torch::Inputs in) {
                                       at::Tensor y = in[0] + 1;
                                       for (std::size_t i = 0; i < adds; ++i) y.add_(1);
                                       return cgt::torch::Values{y};
                                     },
                                     {.name = "kernel-only reference"}),
                                 "adding the reference");
  // Warm-up and recording, then the first replay: the executable every later replay launches.
  cudaGraphExec_t exec = nullptr;
  for (int call = 0; call < 6 && exec == nullptr; ++call) {
    cgt::CallKind kind = cgt::CallKind::warmup;
    const cudaGraphExec_t launched = launched_by([&] {
      pool.mark_step_begin();
      kind = must(fn({input}), "reference call").kind();
    });
    if (kind == cgt::CallKind::replay) exec = launched;
  }
  const probe::Instantiated found = instantiation_of(exec);
  NodeTypes types = found.graph != nullptr ? node_types(found.graph) : NodeTypes{};
  return {.pool = std::move(pool), .fn = std::move(fn), .exec = exec, .types = types};
}

// One kernelonly line, kept for the summary at the end of the run.
struct KernelOnlyRow {
  std::string model, format;
  std::int64_t batch = 0;
  std::size_t nodes = 0;
  double model_call = 0, reference_call = 0;
};
std::vector<KernelOnlyRow>& kernel_only_rows() {
  static std::vector<KernelOnlyRow> rows;
  return rows;
}

// Issue 27, item 6's target, measured directly: cgt's call of the model against the call of a
// kernel-only graph of the same node count (Reference), on a pool of its own. In one loop, each
// right after a small kernel ran alone on the GPU: cgt's call of the model (the step, the call, the
// drop of its outputs, as split_cgt_call's total), the reference's call alike, and the raw
// launches of the reference's executable and of the model's (whether what is left is in the call
// or in the graph). In a second loop the two calls again, the thread kept on the CPU for 50 us
// (reading the clock) between the small kernel and the call: whether a call costs more after the
// thread slept in the synchronisation (launch-diagnosis.md's cold-CPU reading). Prints, medians in us,
//   kernelonly,MODEL,BATCH,FORMAT,N,reference nodes,model call us,reference call us,ratio,
//              raw reference exec us,raw model exec us,model call spun us,reference call spun us,ratio spun
// (ratio: model call / reference call), and "note,..." where the reference is not N kernel nodes in
// one chain or a timed call was not a replay.
void kernel_only_reference(const std::string& model, std::int64_t batch, const Format& format, const at::Tensor& x,
                           int calls, cgt::torch::Pool& pool, const cgt::torch::Model& fn,
                           const c10::cuda::CUDAStream& side) {
  const auto note = [&](const std::string& what) {
    std::printf("note,%s,%lld,%s,kernel-only reference: %s\n", model.c_str(), static_cast<long long>(batch),
                format.label.c_str(), what.c_str());
  };
  const cudaGraphExec_t model_exec = launched_by([&] {
    pool.mark_step_begin();
    (void)fn({x});
  });
  const probe::Instantiated model_graph = instantiation_of(model_exec);
  if (model_graph.graph == nullptr) {
    note("the graph of cgt's call was not seen");
    return;
  }
  const std::size_t nodes = node_types(model_graph.graph).total;
  // N nodes: the input's copy node, `y = x + 1`, N - 2 adds. Where the copy node is not there
  // (the count comes out otherwise), recorded once more with the difference made up.
  const at::Tensor input = at::zeros({256}, x.options().dtype(at::kFloat));
  const std::size_t adds = nodes > 2 ? nodes - 2 : 0;
  Reference reference = record_reference(adds, input);
  if (reference.types.total != 0 && reference.types.total != nodes && adds + nodes >= reference.types.total) {
    note("its first recording had " + std::to_string(reference.types.total) + " nodes; recorded again");
    reference = record_reference(adds + nodes - reference.types.total, input);
  }
  const NodeTypes& types = reference.types;
  if (reference.exec == nullptr) {
    note("its replay launched no graph");
    return;
  }
  if (types.total != nodes || types.memsets != 0 || types.other_nodes != 0 || types.roots != 1 || types.joins != 0 ||
      types.forks != 0) {
    note(std::to_string(types.total) + " nodes for " + std::to_string(nodes) + "; " + std::to_string(types.memsets) +
         " memsets; " + std::to_string(types.other_nodes) + " other nodes; " + std::to_string(types.roots) +
         " roots; " + std::to_string(types.joins) + " joins; " + std::to_string(types.forks) + " forks");
  }

  bool replays = true;
  // A call as a server makes it: the step, the call, its outputs dropped.
  const auto timed_call = [&](cgt::torch::Pool& on, const auto& call) {
    const auto start = Clock::now();
    on.mark_step_begin();
    {
      auto out = call();
      if (!out || out->kind() != cgt::CallKind::replay) replays = false;
    }
    return micros(Clock::now() - start);
  };
  const auto call_model = [&] { return fn({x}); };
  const auto call_reference = [&] { return reference.fn({input}); };
  const auto timed_launch = [&](cudaGraphExec_t exec) {
    const auto start = Clock::now();
    check(cudaGraphLaunch(exec, side.stream()), "launching raw");
    return micros(Clock::now() - start);
  };
  const at::Tensor small = at::zeros({256}, x.options().dtype(at::kFloat));
  std::vector<double> model_call, reference_call, raw_reference, raw_model, model_spun, reference_spun;
  for (int i = 0; i < calls + 10; ++i) {
    after_small_kernel(small);
    const double model_us = timed_call(pool, call_model);
    after_small_kernel(small);
    const double reference_us = timed_call(reference.pool, call_reference);
    after_small_kernel(small);
    const double raw_reference_us = timed_launch(reference.exec);
    after_small_kernel(small);
    const double raw_model_us = timed_launch(model_exec);
    if (i < 10) continue;
    model_call.push_back(model_us);
    reference_call.push_back(reference_us);
    raw_reference.push_back(raw_reference_us);
    raw_model.push_back(raw_model_us);
  }
  constexpr auto hot = std::chrono::microseconds(50);
  for (int i = 0; i < calls + 10; ++i) {
    after_small_kernel(small);
    spin(hot);
    const double model_us = timed_call(pool, call_model);
    after_small_kernel(small);
    spin(hot);
    const double reference_us = timed_call(reference.pool, call_reference);
    if (i < 10) continue;
    model_spun.push_back(model_us);
    reference_spun.push_back(reference_us);
  }
  synchronize();
  if (!replays) note("a timed call was not a replay");
  const double model_us = median(model_call), reference_us = median(reference_call);
  const double model_spun_us = median(model_spun), reference_spun_us = median(reference_spun);
  std::printf("kernelonly,%s,%lld,%s,%zu,%zu,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f\n", model.c_str(),
              static_cast<long long>(batch), format.label.c_str(), nodes, types.total, model_us, reference_us,
              model_us / reference_us, median(raw_reference), median(raw_model), model_spun_us, reference_spun_us,
              model_spun_us / reference_spun_us);
  std::fflush(stdout);
  kernel_only_rows().push_back({.model = model,
                                .format = format.label,
                                .batch = batch,
                                .nodes = nodes,
                                .model_call = model_us,
                                .reference_call = reference_us});
}

// The kernelonly lines as a table, at the end of the run: whether each graph met the target.
void print_kernel_only_summary() {
  if (kernel_only_rows().empty()) return;
  std::printf("\nkernel-only reference after a small kernel (us; medians; met: model call <= 1.5x reference call)\n");
  std::printf("%-8s %5s  %-22s %5s %10s %10s %6s  %s\n", "model", "batch", "format", "N", "model", "reference", "ratio",
              "met");
  for (const KernelOnlyRow& row : kernel_only_rows()) {
    const double ratio = row.model_call / row.reference_call;
    std::printf("%-8s %5lld  %-22s %5zu %10.2f %10.2f %6.2f  %s\n", row.model.c_str(),
                static_cast<long long>(row.batch), row.format.c_str(), row.nodes, row.model_call, row.reference_call,
                ratio, ratio <= 1.5 ? "yes" : "no");
  }
  std::fflush(stdout);
}

// The launch line of a model that could not be captured raw (report.py leaves it out).
void print_raw_capture_failed(const std::string& model, std::int64_t batch, const Format& format) {
  std::printf("launch,%s,%lld,raw cudaGraphLaunch (%s),capture failed,0,0,0,0,0\n", model.c_str(),
              static_cast<long long>(batch), format.label.c_str());
}

// The model captured by libtorch's CUDAGraph as it is (no rewrite), launched raw: the CPU of one
// cudaGraphLaunch with the GPU idle, the yardstick of issue 12's launch-cost target.
void raw_launch(const std::string& model, std::int64_t batch, const Format& format, const at::Tensor& x, int calls,
                const std::function<void()>& cgt_call, cgt::torch::Pool& pool, const cgt::torch::Model& fn) {
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  const c10::cuda::CUDAStreamGuard guard(side);
  format.run_capturable(x);  // warm-up on the capture stream
  side.synchronize();
  at::cuda::CUDAGraph graph(/*keep_graph=*/true);
  try {
    graph.capture_begin();
    format.run_capturable(x);
    graph.capture_end();
  } catch (const std::exception&) {
    // The model threw inside the capture: end the stream's capture, or every later CUDA call of
    // the process fails (libtorch's generator state may stay broken all the same).
    try {
      graph.capture_end();
    } catch (const std::exception&) {  // invalidated: ended all the same
    }
    print_raw_capture_failed(model, batch, format);
    (void)cudaGetLastError();
    return;
  }
  const NodeTypes types = node_types(graph.raw_cuda_graph());
  graph.instantiate();
  const cudaGraphExec_t exec = graph.raw_cuda_graph_exec();
  check(cudaGraphUpload(exec, side.stream()), "upload");
  // The raw launch and cgt's call in turn, each with the GPU idle: right after the
  // synchronisation, and after the host waited 1 ms more (whether the launch's cost depends on
  // how recently the GPU finished).
  std::vector<double> raw, ours, raw_paused, ours_paused;
  // Beside the elapsed time, the thread's own CPU time: where they part, the call waited (off the
  // CPU: descheduled, or asleep in the driver) rather than worked.
  std::map<const std::vector<double>*, std::vector<double>> thread_cpu;
  const auto one = [&](const std::function<void()>& call, bool pause, std::vector<double>& into, bool keep) {
    synchronize();
    if (pause) spin(std::chrono::milliseconds(1));
    const double cpu_start = thread_cpu_micros();
    const auto start = Clock::now();
    call();
    const auto end = Clock::now();
    const double cpu_end = thread_cpu_micros();
    if (keep) {
      into.push_back(micros(end - start));
      thread_cpu[&into].push_back(cpu_end - cpu_start);
    }
  };
  const std::function<void()> launch = [&] { check(cudaGraphLaunch(exec, side.stream()), "launch"); };
  for (int i = 0; i < calls + 10; ++i) {
    one(launch, false, raw, i >= 10);
    one(cgt_call, false, ours, i >= 10);
    one(launch, true, raw_paused, i >= 10);
    one(cgt_call, true, ours_paused, i >= 10);
  }
  // Each alone, call after call (what serving does), and each right after a small kernel ran
  // alone on the GPU: whether a launch costs more after the other graph ran, or after long GPU work.
  std::vector<double> raw_alone, ours_alone, raw_after_small, ours_after_small;
  for (int i = 0; i < calls + 10; ++i) one(launch, false, raw_alone, i >= 10);
  for (int i = 0; i < calls + 10; ++i) one(cgt_call, false, ours_alone, i >= 10);
  at::Tensor small = at::zeros({256}, x.options().dtype(at::kFloat));
  const std::function<void()> small_kernel = [&] { small.add_(1); };
  for (int i = 0; i < calls + 10; ++i) {
    one(small_kernel, false, raw_after_small, false);
    one(launch, false, raw_after_small, i >= 10);
    one(small_kernel, false, ours_after_small, false);
    one(cgt_call, false, ours_after_small, i >= 10);
  }
  synchronize();
  std::printf("launch,%s,%lld,raw cudaGraphLaunch (%s),%zu,%zu,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f\n",
              model.c_str(), static_cast<long long>(batch), format.label.c_str(), types.total, types.memsets,
              median(raw), median(ours), median(raw_paused), median(ours_paused), median(raw_alone), median(ours_alone),
              median(raw_after_small), median(ours_after_small));
  std::printf(
      "launchcpu,%s,%lld,%s,thread CPU us (medians; in turn raw cgt, 1 ms after raw cgt, alone raw cgt, "
      "after a small kernel raw cgt): %.2f %.2f %.2f %.2f %.2f %.2f %.2f %.2f\n",
      model.c_str(), static_cast<long long>(batch), format.label.c_str(), median(thread_cpu[&raw]),
      median(thread_cpu[&ours]), median(thread_cpu[&raw_paused]), median(thread_cpu[&ours_paused]),
      median(thread_cpu[&raw_alone]), median(thread_cpu[&ours_alone]), median(thread_cpu[&raw_after_small]),
      median(thread_cpu[&ours_after_small]));
  print_node_types("nodes", model, batch, format.label, types);
  rewritten_launch(model, batch, format.label, graph.raw_cuda_graph(), side, calls);
  split_cgt_call(model, batch, format, x, calls, pool, fn, exec, side);
  kernel_only_reference(model, batch, format, x, calls, pool, fn, side);
  std::fflush(stdout);
}

void bench_format(const std::string& dir, const std::string& model, const Format& format, int calls, bool first_pass,
                  bool rewrite_memsets = true) {
  // The pool that serves: every size recorded once, then timed against eager.
  cgt::torch::Pool pool =
      must(cgt::torch::make_pool({.device = 0, .rewrite_memset_nodes = rewrite_memsets}), "making a pool");
  const cgt::torch::Model fn = format.add_to(pool, std::nullopt);
  const std::vector<Method> methods{
      {"eager libtorch (" + format.label + ")", [&](const at::Tensor& x) { (void)format.run_eager(x); },
       [&](const at::Tensor& x) { return format.run_eager(x).at(0); }},
      {"cgt.torch (" + format.label + ")",
       [&](const at::Tensor& x) {
         pool.mark_step_begin();
         (void)must(fn({x}), "call");
       },
       [&](const at::Tensor& x) {
         pool.mark_step_begin();
         auto out = must(fn({x}), "call");
         return must(out.take(0), "take");
       }},
  };
  for (const std::int64_t batch : format.sizes) {
    const at::Tensor x = request(dir, model, batch);
    const at::Tensor expected = reference(dir, model, batch);
    std::vector<std::vector<Timing>> measured(methods.size());
    for (int round = 0; round < rounds; ++round) {
      for (std::size_t m = 0; m < methods.size(); ++m) {
        measured[m].push_back(timed([&] { methods[m].call(x); }, calls / rounds));
      }
    }
    for (std::size_t m = 0; m < methods.size(); ++m) {
      auto cell = [&](double Timing::* field) {
        std::vector<double> values;
        for (const Timing& t : measured[m]) values.push_back(t.*field);
        return median(values);
      };
      const double diff = difference(methods[m].output(x), expected);
      std::printf("serve,%s,%lld,%s,%.1f,%.1f,%.1f,%.3g\n", model.c_str(), static_cast<long long>(batch),
                  methods[m].name.c_str(), cell(&Timing::cpu), cell(&Timing::wall), cell(&Timing::latency), diff);
      std::fflush(stdout);
    }
    // A model cgt could not graph at this batch (its capture failed: it runs eagerly) is not
    // captured raw either: libtorch's CUDAGraph leaves a capture that threw open.
    const std::uint64_t eager_before = pool.stats().eager_calls;
    methods[1].call(x);
    if (first_pass && pool.stats().eager_calls > eager_before) {
      print_raw_capture_failed(model, batch, format);
    } else if (first_pass && format.run_capturable) {
      raw_launch(model, batch, format, x, calls, [&] { methods[1].call(x); }, pool, fn);
    }
  }
  const cgt::Stats stats = pool.stats();
  if (auto device = pool.device()) {
    const auto& counts = device->get().graph_counts();
    std::printf(
        "graphcounts,%s,%s,instantiated %llu,updated in place %llu,switched %llu,memsets rewritten %llu,"
        "memsets kept %llu,memcpys rewritten %llu,memcpys kept %llu\n",
        model.c_str(), format.label.c_str(), static_cast<unsigned long long>(counts.instantiated),
        static_cast<unsigned long long>(counts.updated_in_place), static_cast<unsigned long long>(counts.switched),
        static_cast<unsigned long long>(counts.memset_nodes_rewritten),
        static_cast<unsigned long long>(counts.memset_nodes_kept),
        static_cast<unsigned long long>(counts.memcpy_nodes_rewritten),
        static_cast<unsigned long long>(counts.memcpy_nodes_kept));
  }
  std::printf("calls,%s,cgt.torch (%s),%llu,%llu\n", model.c_str(), format.label.c_str(),
              static_cast<unsigned long long>(stats.replays), static_cast<unsigned long long>(stats.eager_calls));
  std::printf("pool,%s,cgt.torch (%s),%zu\n", model.c_str(), format.label.c_str(), pool.memory().reserved_bytes);
  std::fflush(stdout);
  // After the serving runs, as models.py times PyTorch's trees after its eager runs.
  if (first_pass && format.time_capture) {
    // The format's default (AOTI: only the first shape warms up; TorchScript: every shape does),
    // and AOTI with a warm-up per shape, as PyTorch's trees do.
    time_capture(model, format, std::nullopt, "");
    time_capture_loop(model, format);
    if (format.label == "AOTI") time_capture(model, format, true, " warm_up_each_shape true");
  }
}

std::vector<at::Tensor> tensors_of(const c10::IValue& value) {
  std::vector<at::Tensor> out;
  if (value.isTensor()) out.push_back(value.toTensor());
  if (value.isTuple()) {
    for (const c10::IValue& element : value.toTupleRef().elements()) out.push_back(element.toTensor());
  }
  return out;
}

void warm_up_gpu() {
  at::Tensor x = at::zeros({1 << 20}, at::TensorOptions().device(at::kCUDA, 0));
  const auto start = Clock::now();
  while (Clock::now() - start < std::chrono::seconds(3)) {
    for (int i = 0; i < 16; ++i) x.add_(1);
    synchronize();
  }
}

}  // namespace

int main(int argc, char* argv[]) {
  if (argc < 3) {
    std::cerr << "usage: model_bench DIR bert|resnet [CALLS]\n";
    return 2;
  }
  const std::string dir = argv[1];
  const std::string model = argv[2];
  const int calls = argc > 3 ? std::atoi(argv[3]) : 150;
  // A second pass (`scripts/gpu.sh bench-models` runs Python, C++, Python, C++) serves only.
  const bool first_pass = std::getenv("CGT_BENCH_SECOND_PASS") == nullptr;
  if (!cgt::torch::is_available()) {
    std::cerr << "no CUDA device\n";
    return 1;
  }
  const torch::NoGradGuard no_grad;
  warm_up_gpu();

  try {
    torch::jit::Module module = torch::jit::load(dir + "/" + model + ".pt", torch::Device(torch::kCUDA, 0));
    module.eval();
    const Format torchscript{
        .label = "TorchScript",
        .run_eager = [&](const at::Tensor& x) { return tensors_of(module.forward({x})); },
        .add_to =
            [&](cgt::torch::Pool& pool, std::optional<bool> warm_up_each_shape) {
              return must(
                  cgt::torch::add_jit_module(pool, module, {.name = model, .warm_up_each_shape = warm_up_each_shape}),
                  "add_jit_module");
            },
        .run_capturable = [&](const at::Tensor& x) { (void)module.forward({x}); },
    };
    bench_format(dir, model, torchscript, calls, first_pass);
    // The same module with the executor's optimisations off for cgt's calls (jit_optimize =
    // false: one plan for every shape, no priming or warm-up per batch size), and its eager
    // libtorch run likewise (on a clone: the module above keeps its optimised plan).
    torch::jit::Module plain = module.clone(/*inplace=*/true);
    const Format unoptimized{
        .label = "TorchScript jit_optimize false",
        .run_eager =
            [&](const at::Tensor& x) {
              const torch::jit::GraphOptimizerEnabledGuard optimizer(false);
              return tensors_of(plain.forward({x}));
            },
        .add_to =
            [&](cgt::torch::Pool& pool, std::optional<bool> warm_up_each_shape) {
              return must(
                  cgt::torch::add_jit_module(
                      pool, module, {.name = model, .warm_up_each_shape = warm_up_each_shape, .jit_optimize = false}),
                  "add_jit_module");
            },
        // No raw launch: unoptimised, the module as loaded cannot be captured (Hugging Face's BERT
        // synchronises and copies from the host; cgt's clone is folded for capture), and a
        // capture that throws inside libtorch's CUDAGraph leaves its generator state broken.
    };
    bench_format(dir, model, unoptimized, calls, first_pass);
  } catch (const std::exception& error) {
    std::printf("error,%s,TorchScript,%s\n", model.c_str(), error.what());
  }

  // AOTI: the package with a dynamic batch, and the one exported for batch 1 (reduce-overhead's
  // batch-1 graph is specialised too: Dynamo specialises sizes 0 and 1).
  for (const bool batch_one : {false, true}) {
    const std::string label = batch_one ? "AOTI batch-1 package" : "AOTI";
    try {
      const std::string path = dir + "/" + model + (batch_one ? "-b1" : "") + ".pt2";
      // As users load a package (the default multi-threaded runner), and one that can be captured.
      torch::inductor::AOTIModelPackageLoader eager_loader(path);
      torch::inductor::AOTIModelPackageLoader capturable(path, "model", /*run_single_threaded=*/true, 1, 0);
      Format aoti{
          .label = label,
          .run_eager = [&](const at::Tensor& x) { return eager_loader.run({x}); },
          .add_to =
              [&](cgt::torch::Pool& pool, std::optional<bool> warm_up_each_shape) {
                return must(
                    cgt::torch::add_aoti_package(pool, path, {.name = model, .warm_up_each_shape = warm_up_each_shape}),
                    "add_aoti_package");
              },
          .run_capturable = [&](const at::Tensor& x) { (void)capturable.run({x}); },
      };
      if (batch_one) {
        aoti.sizes = {1};
        aoti.time_capture = false;
      }
      bench_format(dir, model, aoti, calls, first_pass);
      if (!batch_one && first_pass) {  // whether the memset rewrite costs GPU time: the nodes kept
        aoti.label = "AOTI memset nodes kept";
        aoti.time_capture = false;
        bench_format(dir, model, aoti, calls, /*first_pass=*/false, /*rewrite_memsets=*/false);
      }
    } catch (const std::exception& error) {
      std::printf("error,%s,%s,%s\n", model.c_str(), label.c_str(), std::string(error.what()).substr(0, 300).c_str());
    }
  }
  print_kernel_only_summary();
  return 0;
}
