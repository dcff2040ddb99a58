// Launch cost against node types (issue 12, item 4): the CPU time of one launch of a captured
// graph with memset or memcpy nodes, launched raw (cudaGraphLaunch of the graph as captured), and
// through cgt's replay with the rewrite off and on (`rewrite_memset_nodes` and
// `rewrite_memcpy_nodes` both, to measure the memcpys too); also the raw launch of the
// rewritten graph (the rewrite alone, without cgt's bookkeeping). The GPU is idle before every
// timed launch (a synchronisation after each, not timed). `scripts/gpu.sh launch` runs it.
//
//   synthetic  400 tiny kernels with 60 memsets, 60 device-to-device memcpys, 60 external event
//              records (left as they are), or none
//   probe      libtorch workloads captured by CUDAGraph: how many memset / memcpy / kernel nodes
//   torch      the probed workloads through cgt.torch (BERT-like layers always)
//
// Prints "launch,<config>,<nodes>,<method>,<cpu us median>,<cpu us p90>".
#include <torch/torch.h>

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../tests/cuda/kernels.hpp"
#include "node_rewrite.hpp"

import cgt;
import cgt.cuda;
import cgt.torch;

namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}

template <class T>
T must(cgt::Result<T> result) {
  if (!result) {
    std::cerr << result.error().describe() << '\n';
    std::exit(1);
  }
  return std::move(*result);
}

struct Percentiles {
  double median = 0;
  double p90 = 0;
};

// One way of launching a graph, and what the graph holds.
struct Method {
  std::string name;
  std::string nodes;
  std::function<void()> call;
};

// CPU time of each method's call with the GPU idle before each (synchronised after each, not
// timed), the methods interleaved: 10 rounds, each timing every method 30 times in turn, so that
// a drift of the machine's speed reaches every method alike.
std::vector<Percentiles> measure_interleaved(const std::vector<Method>& methods) {
  constexpr int rounds = 10;
  constexpr int per_round = 30;
  for (const Method& method : methods) {
    for (int i = 0; i < 20; ++i) method.call();
  }
  check(cudaDeviceSynchronize(), "warming up");
  std::vector<std::vector<double>> us(methods.size());
  for (int round = 0; round < rounds; ++round) {
    for (std::size_t m = 0; m < methods.size(); ++m) {
      for (int i = 0; i < per_round; ++i) {
        const auto start = std::chrono::steady_clock::now();
        methods[m].call();
        us[m].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() * 1e6);
        check(cudaDeviceSynchronize(), "draining");
      }
    }
  }
  std::vector<Percentiles> result;
  for (std::vector<double>& times : us) {
    std::ranges::sort(times);
    result.push_back({times[times.size() / 2], times[times.size() * 9 / 10]});
  }
  return result;
}

struct NodeCounts {
  std::size_t total = 0, kernels = 0, memsets = 0, memcpys = 0, other = 0;
  [[nodiscard]] std::string describe() const {
    return std::to_string(total) + " nodes: " + std::to_string(kernels) + " kernel " + std::to_string(memsets) +
           " memset " + std::to_string(memcpys) + " memcpy " + std::to_string(other) + " other";
  }
};

NodeCounts count_nodes(cudaGraph_t graph) {
  std::size_t n = 0;
  check(cudaGraphGetNodes(graph, nullptr, &n), "counting nodes");
  std::vector<cudaGraphNode_t> nodes(n);
  check(cudaGraphGetNodes(graph, nodes.data(), &n), "listing nodes");
  NodeCounts counts;
  counts.total = n;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    check(cudaGraphNodeGetType(node, &type), "typing a node");
    if (type == cudaGraphNodeTypeKernel)
      ++counts.kernels;
    else if (type == cudaGraphNodeTypeMemset)
      ++counts.memsets;
    else if (type == cudaGraphNodeTypeMemcpy)
      ++counts.memcpys;
    else
      ++counts.other;
  }
  return counts;
}

void print(const std::string& config, const std::vector<Method>& methods) {
  const std::vector<Percentiles> times = measure_interleaved(methods);
  for (std::size_t m = 0; m < methods.size(); ++m) {
    std::printf("launch,%s,%s,%s,%.2f,%.2f\n", config.c_str(), methods[m].nodes.c_str(), methods[m].name.c_str(),
                times[m].median, times[m].p90);
  }
  std::fflush(stdout);
}

// A graph instantiated from a copy of `graph`, rewritten (the raw rewrite, without cgt).
cudaGraphExec_t instantiate_rewritten(cudaGraph_t graph, NodeCounts& after) {
  cudaGraph_t copy = nullptr;
  check(cudaGraphClone(&copy, graph), "cloning");
  cgt::kernels::NodeRewrites rewrites;
  check(cgt::kernels::rewrite_for_launch(copy, {.memsets = true, .memcpys = true}, rewrites), "rewriting");
  after = count_nodes(copy);
  cudaGraphExec_t exec = nullptr;
  check(cudaGraphInstantiate(&exec, copy, 0), "instantiating");
  check(cudaGraphDestroy(copy), "destroying");
  return exec;
}

// ---- synthetic: 400 kernels and 60 memsets or memcpys, raw and through cgt.cuda ----

enum class Extra : std::uint8_t { none, memsets, memcpys, events };
constexpr int kernel_count = 400;
constexpr int extra_count = 60;
constexpr std::int64_t elements = 256;

// External event records (cudaEventRecordExternal): nodes cgt leaves alone, measured for the record.
std::vector<cudaEvent_t>& external_events() {
  static std::vector<cudaEvent_t> events = [] {
    std::vector<cudaEvent_t> made(extra_count);
    for (cudaEvent_t& event : made) check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "event");
    return made;
  }();
  return events;
}

// `capturing`: external event records exist only in captures (a plain run records plainly).
void synthetic_work(float* data, unsigned char* bytes, Extra extra, bool capturing, cudaStream_t stream) {
  const int every = kernel_count / extra_count;
  int extras = 0;
  for (int k = 0; k < kernel_count; ++k) {
    check(cgt_test::add_repeatedly(data, elements, 1.0F, 1, stream), "kernel");
    if (extra == Extra::none || k % every != every - 1 || extras == extra_count) continue;
    unsigned char* at = bytes + static_cast<std::size_t>(extras) * 1024;
    if (extra == Extra::memsets) check(cudaMemsetAsync(at, extras, 1000, stream), "memset");
    if (extra == Extra::memcpys) {
      check(cudaMemcpyAsync(at + 512, at, 512, cudaMemcpyDeviceToDevice, stream), "memcpy");
    }
    if (extra == Extra::events) {
      check(cudaEventRecordWithFlags(external_events()[static_cast<std::size_t>(extras)], stream,
                                     capturing ? cudaEventRecordExternal : cudaEventRecordDefault),
            "event record");
    }
    ++extras;
  }
}

void synthetic(Extra extra) {
  const std::string config = extra == Extra::none      ? "synthetic 400 kernels"
                             : extra == Extra::memsets ? "synthetic 400 kernels + 60 memsets"
                             : extra == Extra::memcpys ? "synthetic 400 kernels + 60 memcpys"
                                                       : "synthetic 400 kernels + 60 event records";
  auto data = must(cgt::cuda::Buffer::make(cgt::ElementType::f32, {elements}));
  auto bytes = must(cgt::cuda::Buffer::make(cgt::ElementType::u8, {extra_count * 1024}));
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  cudaGraph_t graph = nullptr;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
  synthetic_work(data.as<float>(), bytes.as<unsigned char>(), extra, true, stream);
  check(cudaStreamEndCapture(stream, &graph), "end capture");
  const NodeCounts captured = count_nodes(graph);
  cudaGraphExec_t exec = nullptr;
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  check(cudaGraphUpload(exec, stream), "upload");
  std::vector<Method> methods;
  methods.push_back(
      {"raw cudaGraphLaunch", captured.describe(), [&] { check(cudaGraphLaunch(exec, stream), "launch"); }});
  NodeCounts rewritten;
  cudaGraphExec_t rewritten_exec = instantiate_rewritten(graph, rewritten);
  check(cudaGraphUpload(rewritten_exec, stream), "upload");
  methods.push_back({"raw cudaGraphLaunch of the rewritten graph", rewritten.describe(),
                     [&] { check(cudaGraphLaunch(rewritten_exec, stream), "launch"); }});
  // The same capture again, rewritten in place (as cgt does) rather than cloned first.
  cudaGraph_t again = nullptr;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
  synthetic_work(data.as<float>(), bytes.as<unsigned char>(), extra, true, stream);
  check(cudaStreamEndCapture(stream, &again), "end capture");
  cgt::kernels::NodeRewrites in_place;
  check(cgt::kernels::rewrite_for_launch(again, {.memsets = true, .memcpys = true}, in_place), "rewriting");
  cudaGraphExec_t in_place_exec = nullptr;
  check(cudaGraphInstantiate(&in_place_exec, again, 0), "instantiate");
  check(cudaGraphUpload(in_place_exec, stream), "upload");
  methods.push_back({"raw cudaGraphLaunch of the graph rewritten in place", count_nodes(again).describe(),
                     [&] { check(cudaGraphLaunch(in_place_exec, stream), "launch"); }});
  std::vector<cgt::cuda::Pool> pools;
  std::vector<cgt::cuda::Function> functions;
  pools.reserve(2);  // the calls below keep references to both
  functions.reserve(2);
  for (const bool rewrite : {false, true}) {
    cgt::cuda::PoolOptions options;
    options.blocking_stream = false;
    options.rewrite_memset_nodes = rewrite;
    options.rewrite_memcpy_nodes = rewrite;
    cgt::cuda::Pool& pool = pools.emplace_back(must(cgt::cuda::make_pool(std::move(options))));
    cgt::cuda::Function& fn = functions.emplace_back(must(pool.add_function(
        [extra](cgt::cuda::Context& ctx, cgt::cuda::Inputs in) {
          synthetic_work(in[0].as<float>(), in[1].as<unsigned char>(), extra, ctx.is_capturing(), ctx.stream());
          cgt::cuda::Buffer out = ctx.allocate(cgt::ElementType::f32, {elements});
          check(cgt_test::sum_inputs(in[0].as<float>(), nullptr, nullptr, nullptr, out.as<float>(), elements,
                                     ctx.stream()),
                "sum");
          return cgt::cuda::Values{out};
        },
        {.name = "synthetic", .static_inputs = {0, 1}})));
    const auto call = [&pool, &fn, &data, &bytes] {
      pool.mark_step_begin();
      (void)must(fn({data, bytes}));
    };
    call();  // warm-up
    call();  // recording
    const cgt::GraphCounts& counts = must(pool.device()).get().graph_counts();
    NodeCounts seen = captured;  // + the output's kernel, and what cgt rewrote
    seen.kernels += counts.memset_nodes_rewritten + counts.memcpy_nodes_rewritten + 1;
    seen.memsets -= counts.memset_nodes_rewritten;
    seen.memcpys -= counts.memcpy_nodes_rewritten;
    seen.total += 1;
    methods.push_back(
        {rewrite ? "cgt.cuda replay (rewrite on)" : "cgt.cuda replay (rewrite off)", seen.describe(), call});
  }
  print(config, methods);
  functions.clear();
  pools.clear();
  check(cudaGraphExecDestroy(in_place_exec), "destroy");
  check(cudaGraphDestroy(again), "destroy");
  check(cudaGraphExecDestroy(rewritten_exec), "destroy");
  check(cudaGraphExecDestroy(exec), "destroy");
  check(cudaGraphDestroy(graph), "destroy");
  check(cudaStreamDestroy(stream), "destroy");
}

// ---- libtorch workloads ----

at::TensorOptions cuda() {
  return at::TensorOptions().device(at::kCUDA, 0);
}

struct Workload {
  std::string name;
  std::function<at::Tensor(const at::Tensor&)> run;
  std::function<at::Tensor()> input;
};

// A BERT-base-like encoder layer (hidden 768, 12 heads, FFN 3072) of at:: ops, `layers` deep.
struct BertLike {
  std::vector<at::Tensor> p;
  int layers;
  explicit BertLike(int depth) : layers(depth) {
    for (int l = 0; l < layers; ++l) {
      for (auto [o, i] : {std::pair{2304, 768}, std::pair{768, 768}, std::pair{3072, 768}, std::pair{768, 3072}}) {
        p.push_back(at::randn({o, i}, cuda()) * 0.02);
        p.push_back(at::zeros({o}, cuda()));
      }
      for (int k = 0; k < 4; ++k) p.push_back(k % 2 == 0 ? at::ones({768}, cuda()) : at::zeros({768}, cuda()));
    }
  }
  at::Tensor operator()(const at::Tensor& input) const {
    at::Tensor x = input;  // [batch, seq, 768]
    const std::int64_t b = x.size(0), s = x.size(1);
    for (int l = 0; l < layers; ++l) {
      const at::Tensor* w = &p[static_cast<std::size_t>(l) * 12];
      at::Tensor qkv = at::linear(x, w[0], w[1]).view({b, s, 3, 12, 64}).permute({2, 0, 3, 1, 4});
      at::Tensor scores = at::matmul(qkv[0], qkv[1].transpose(-1, -2)) / 8.0;
      at::Tensor context = at::matmul(at::softmax(scores, -1), qkv[2]).transpose(1, 2).reshape({b, s, 768});
      x = at::layer_norm(x + at::linear(context, w[2], w[3]), {768}, w[8], w[9]);
      at::Tensor h = at::gelu(at::linear(x, w[4], w[5]));
      x = at::layer_norm(x + at::linear(h, w[6], w[7]), {768}, w[10], w[11]);
    }
    return x;
  }
};

std::vector<Workload> workloads() {
  auto bert = std::make_shared<BertLike>(12);
  std::vector<Workload> list;
  for (const std::int64_t seq : {8, 128}) {
    list.push_back({"BERT-like 12 layers, batch 1, seq " + std::to_string(seq),
                    [bert](const at::Tensor& x) { return (*bert)(x); },
                    [seq] { return at::randn({1, seq, 768}, cuda()); }});
  }
  list.push_back({"bf16 linear, small M (8 x 768 -> 3072 -> 768, 12 times)",
                  [](const at::Tensor& x) {
                    static const at::Tensor up = at::randn({3072, 768}, cuda().dtype(at::kBFloat16)) * 0.02;
                    static const at::Tensor down = at::randn({768, 3072}, cuda().dtype(at::kBFloat16)) * 0.02;
                    static const at::Tensor bias = at::zeros({3072}, cuda().dtype(at::kBFloat16));
                    at::Tensor h = x;
                    for (int i = 0; i < 12; ++i) h = at::linear(at::gelu(at::linear(h, up, bias)), down);
                    return h;
                  },
                  [] { return at::randn({8, 768}, cuda().dtype(at::kBFloat16)); }});
  list.push_back({"embedding backward (30522 x 768, 128 tokens)",
                  [](const at::Tensor& grad) {
                    const at::Tensor ids = at::arange(128, cuda().dtype(at::kLong)) * 7 % 30522;
                    return at::embedding_dense_backward(grad, ids, 30522, -1, false);
                  },
                  [] { return at::randn({128, 768}, cuda()); }});
  list.push_back({"index_put_ accumulate (4096 x 64)",
                  [](const at::Tensor& v) {
                    at::Tensor out = at::zeros({4096, 64}, cuda());
                    const at::Tensor ids = at::arange(512, cuda().dtype(at::kLong)) * 5 % 4096;
                    return out.index_put_({ids}, v, true);
                  },
                  [] { return at::randn({512, 64}, cuda()); }});
  list.push_back({"sort + cumsum (65536)", [](const at::Tensor& v) { return at::cumsum(std::get<0>(at::sort(v)), 0); },
                  [] { return at::randn({65536}, cuda()); }});
  list.push_back({"zeros + copy_ (1 MiB)",
                  [](const at::Tensor& v) {
                    at::Tensor z = at::zeros({262144}, cuda());
                    z.copy_(v);
                    return z + 1;
                  },
                  [] { return at::randn({262144}, cuda()); }});
  list.push_back({"conv 3x3 + batch norm (cuDNN, 1x64x56x56)",
                  [](const at::Tensor& x) {
                    static const at::Tensor w = at::randn({64, 64, 3, 3}, cuda()) * 0.05;
                    static const at::Tensor g = at::ones({64}, cuda());
                    static const at::Tensor z = at::zeros({64}, cuda());
                    return at::relu(at::batch_norm(at::conv2d(x, w, {}, 1, 1), g, z, g, z, false, 0.1, 1e-5, true));
                  },
                  [] { return at::randn({1, 64, 56, 56}, cuda()); }});
  return list;
}

// Captures `workload` with libtorch's CUDAGraph (keep_graph: its cudaGraph_t stays readable) and
// measures raw launches of it and of its rewritten copy, then cgt.torch's replays, rewrite off/on.
void torch_workload(const Workload& workload) {
  const at::Tensor input = workload.input();
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  NodeCounts captured;
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  {
    const c10::cuda::CUDAStreamGuard guard(side);
    (void)workload.run(input);  // warm-up (cuBLAS handles, workspaces, cuDNN plans)
    side.synchronize();
    graph = std::make_unique<at::cuda::CUDAGraph>(/*keep_graph=*/true);
    try {
      graph->capture_begin();
      (void)workload.run(input);
      graph->capture_end();
    } catch (const std::exception& error) {
      std::printf("probe,%s,capture failed: %s\n", workload.name.c_str(), error.what());
      (void)cudaGetLastError();
      return;
    }
    captured = count_nodes(graph->raw_cuda_graph());
    graph->instantiate();
  }
  std::printf("probe,%s,%s\n", workload.name.c_str(), captured.describe().c_str());
  std::fflush(stdout);
  const cudaStream_t stream = side.stream();
  check(cudaGraphUpload(graph->raw_cuda_graph_exec(), stream), "upload");
  std::vector<Method> methods;
  methods.push_back({"raw cudaGraphLaunch", captured.describe(),
                     [&] { check(cudaGraphLaunch(graph->raw_cuda_graph_exec(), stream), "launch"); }});
  NodeCounts rewritten;
  cudaGraphExec_t rewritten_exec = instantiate_rewritten(graph->raw_cuda_graph(), rewritten);
  check(cudaGraphUpload(rewritten_exec, stream), "upload");
  methods.push_back({"raw cudaGraphLaunch of the rewritten graph", rewritten.describe(),
                     [&] { check(cudaGraphLaunch(rewritten_exec, stream), "launch"); }});
  std::vector<cgt::torch::Pool> pools;
  std::vector<cgt::torch::Function> functions;
  pools.reserve(2);  // the calls below keep references to both
  functions.reserve(2);
  for (const bool rewrite : {false, true}) {
    cgt::torch::Pool& pool = pools.emplace_back(
        must(cgt::torch::make_pool({.rewrite_memset_nodes = rewrite, .rewrite_memcpy_nodes = rewrite})));
    auto run = workload.run;
    cgt::torch::Function& fn = functions.emplace_back(must(
        pool.add_function([run](cgt::torch::Inputs in) { return cgt::torch::Values{run(in[0])}; }, {.name = "w"})));
    const auto call = [&pool, &fn, &input] {
      pool.mark_step_begin();
      (void)must(fn({input}));
    };
    call();
    call();
    if (pool.stats().recordings != 1) {
      std::printf("probe,%s,cgt.torch did not record (%llu eager calls)\n", workload.name.c_str(),
                  static_cast<unsigned long long>(pool.stats().eager_calls));
      continue;
    }
    const cgt::GraphCounts& counts = must(pool.device()).get().graph_counts();
    NodeCounts seen;  // what cgt's graph holds, as cgt counted it (its capture may differ a little)
    seen.memsets = counts.memset_nodes_kept;
    seen.memcpys = counts.memcpy_nodes_kept;
    seen.kernels = captured.kernels + counts.memset_nodes_rewritten + counts.memcpy_nodes_rewritten;
    seen.other = captured.other;
    seen.total = seen.kernels + seen.memsets + seen.memcpys + seen.other;
    methods.push_back(
        {rewrite ? "cgt.torch replay (rewrite on)" : "cgt.torch replay (rewrite off)", seen.describe(), call});
  }
  print(workload.name, methods);
  functions.clear();
  pools.clear();
  check(cudaGraphExecDestroy(rewritten_exec), "destroy");
}

}  // namespace

int main(int argc, char** argv) {
  if (cgt::cuda::device_count() == 0) {
    std::puts("no CUDA device");
    return 0;
  }
  const std::string only = argc > 1 ? argv[1] : "";
  cudaDeviceProp properties{};
  check(cudaGetDeviceProperties(&properties, 0), "properties");
  int driver = 0;
  check(cudaDriverGetVersion(&driver), "driver");
  std::printf("device,%s,driver %d\n", properties.name, driver);
  if (only.empty() || only == "synthetic") {
    for (const Extra extra : {Extra::none, Extra::memsets, Extra::memcpys, Extra::events}) synthetic(extra);
  }
  if (only.empty() || only == "torch") {
    for (const Workload& workload : workloads()) torch_workload(workload);
  }
  return 0;
}
