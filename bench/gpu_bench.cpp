// GPU benchmarks of cgt against raw graph launch, eager libtorch and libtorch's CUDAGraph, on the
// same work, in one run (`scripts/gpu.sh bench` adds PyTorch's Python trees and makes the tables):
//
//   overhead  CPU time per call (median) and wall time per call, for K = 1, 10, 100 tiny kernels,
//             1 or 4 inputs, static or copied inputs
//   memory    pool bytes reserved for a branching tree of 64 MiB tensors and for a decode loop
//             with two batch sizes: cgt.torch, against one separate pool per graph
//   scaling   cost per call as the tree grows: siblings that do not match, path depth, outputs held
//   capture   time to warm up and record a first call, and to re-record after a static input moved
//
// Prints CSV lines "<benchmark>,<config>,<method>,<value>[,<value>]".
#include <torch/torch.h>

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda.h>  // the driver's types, for its entry points in `diagnose` (not linked)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../tests/cuda/kernels.hpp"

import cgt;
import cgt.cuda;
import cgt.host;
import cgt.torch;

namespace {

constexpr std::int64_t elements = 256;  // tiny kernels: the benchmark is about launch cost
// CPU times are taken with the GPU's queue kept short: a synchronisation (not timed) every so
// many calls, so that no launch waits for room in the queue.
constexpr int drain_every = 16;

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

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct Timing {
  double cpu_us = 0;   // median CPU time of one call (the call returns before the GPU work ends)
  double wall_us = 0;  // calls back to back, then a synchronization: per call
};

Timing measure(const std::function<void()>& call, int calls) {
  for (int i = 0; i < 20; ++i) call();
  check(cudaDeviceSynchronize(), "warming up");
  std::vector<double> cpu;
  cpu.reserve(static_cast<std::size_t>(calls));
  for (int i = 0; i < calls; ++i) {
    const auto start = std::chrono::steady_clock::now();
    call();
    cpu.push_back(seconds_since(start) * 1e6);
    if (i % drain_every == drain_every - 1) check(cudaDeviceSynchronize(), "draining");  // not timed
  }
  std::ranges::sort(cpu);
  check(cudaDeviceSynchronize(), "draining");
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) call();
  check(cudaDeviceSynchronize(), "draining");
  return {cpu[cpu.size() / 2], seconds_since(start) * 1e6 / calls};
}

void print(const std::string& benchmark, const std::string& config, const std::string& method, const Timing& t) {
  std::printf("%s,%s,%s,%.3f,%.3f\n", benchmark.c_str(), config.c_str(), method.c_str(), t.cpu_us, t.wall_us);
  std::fflush(stdout);
}

// The work, in libtorch ops: the inputs summed, then K-1 times "+ 1".
at::Tensor torch_work(const std::vector<at::Tensor>& inputs, int kernels) {
  at::Tensor y = inputs[0] + 1;
  for (std::size_t i = 1; i < inputs.size(); ++i) y = y + inputs[i];
  for (int k = 1; k < kernels; ++k) y = y + 1;
  return y;
}

// The work, in raw kernels: one kernel sums the inputs, K-1 kernels add 1.
void raw_work(const std::vector<const float*>& inputs, float* out, int kernels, cudaStream_t stream) {
  check(
      cgt_test::sum_inputs(inputs[0], inputs.size() > 1 ? inputs[1] : nullptr, inputs.size() > 2 ? inputs[2] : nullptr,
                           inputs.size() > 3 ? inputs[3] : nullptr, out, elements, stream),
      "sum");
  if (kernels > 1) check(cgt_test::add_repeatedly(out, elements, 1.0F, kernels - 1, stream), "add");
}

// One way of making the call, for the overhead table.
struct Method {
  std::string name;
  std::function<void()> call;
};

// Measures the methods of one work interleaved: `rounds` rounds, each timing every method in turn,
// so that a drift of the machine (clocks, other load) during the run reaches every method alike.
std::vector<Timing> measure_interleaved(const std::vector<Method>& methods, int calls) {
  constexpr int rounds = 10;
  const int per_round = std::max(1, calls / rounds);
  std::vector<std::vector<double>> cpu(methods.size());
  std::vector<double> wall_us(methods.size(), 0);
  for (const Method& method : methods) {
    for (int i = 0; i < 20; ++i) method.call();
  }
  check(cudaDeviceSynchronize(), "warming up");
  for (int round = 0; round < rounds; ++round) {
    for (std::size_t m = 0; m < methods.size(); ++m) {
      for (int i = 0; i < per_round; ++i) {
        const auto start = std::chrono::steady_clock::now();
        methods[m].call();
        cpu[m].push_back(seconds_since(start) * 1e6);
        if (i % drain_every == drain_every - 1) check(cudaDeviceSynchronize(), "draining");  // not timed
      }
      check(cudaDeviceSynchronize(), "draining");
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < per_round; ++i) methods[m].call();
      check(cudaDeviceSynchronize(), "draining");
      wall_us[m] += seconds_since(start) * 1e6;
    }
  }
  std::vector<Timing> timings;
  for (std::size_t m = 0; m < methods.size(); ++m) {
    std::ranges::sort(cpu[m]);
    timings.push_back({cpu[m][cpu[m].size() / 2], wall_us[m] / (per_round * rounds)});
  }
  return timings;
}

// A graph captured from raw CUDA work on `stream`, instantiated and uploaded.
class RawGraph {
 public:
  RawGraph(cudaStream_t stream, const std::function<void()>& work) {
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
    work();
    check(cudaStreamEndCapture(stream, &graph_), "capture");
    check(cudaGraphInstantiate(&exec_, graph_, 0), "instantiate");
    check(cudaGraphUpload(exec_, stream), "upload");
  }
  RawGraph(const RawGraph&) = delete;
  RawGraph& operator=(const RawGraph&) = delete;
  ~RawGraph() {
    (void)cudaGraphExecDestroy(exec_);
    (void)cudaGraphDestroy(graph_);
  }
  [[nodiscard]] cudaGraphExec_t exec() const noexcept { return exec_; }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

// A stream of the benchmark's own (a blocking one: as cgt.cuda's default pool stream), destroyed
// once its work is done.
class OwnStream {
 public:
  explicit OwnStream(unsigned flags) { check(cudaStreamCreateWithFlags(&stream_, flags), "stream"); }
  OwnStream(const OwnStream&) = delete;
  OwnStream& operator=(const OwnStream&) = delete;
  ~OwnStream() {
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
  }
  [[nodiscard]] cudaStream_t get() const noexcept { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// The inputs as cgt.cuda buffers over the tensors' memory.
std::vector<cgt::cuda::Buffer> cuda_views(const std::vector<at::Tensor>& inputs) {
  std::vector<cgt::cuda::Buffer> buffers;
  for (const auto& input : inputs) {
    buffers.push_back(cgt::cuda::Buffer::view_of(static_cast<std::byte*>(input.data_ptr()), elements * sizeof(float),
                                                 cgt::ElementType::f32, {&elements, 1}, 0));
  }
  return buffers;
}

// The raw kernels of the work as a cgt.cuda pool function.
cgt::cuda::Function add_cuda_work(cgt::cuda::Pool& pool, int kernels, const std::vector<std::size_t>& statics) {
  return must(pool.add_function(
      [kernels](cgt::cuda::Context& ctx, cgt::cuda::Inputs in) {
        std::vector<const float*> from;
        for (std::size_t i = 0; i < in.size(); ++i) from.push_back(in[i].as<float>());
        cgt::cuda::Buffer out = ctx.allocate(cgt::ElementType::f32, {elements});
        raw_work(from, out.as<float>(), kernels, ctx.stream());
        return cgt::cuda::Values{out};
      },
      {.name = "work", .static_inputs = statics}));
}

// The libtorch ops of the work as a cgt.torch pool function.
cgt::torch::Function add_torch_work(cgt::torch::Pool& pool, int kernels, const std::vector<std::size_t>& statics) {
  return must(pool.add_function(
      [kernels](cgt::torch::Inputs in) {
        std::vector<at::Tensor> tensors = in;
        return cgt::torch::Values{torch_work(tensors, kernels)};
      },
      {.name = "work", .static_inputs = statics}));
}

// libtorch's CUDAGraph of the libtorch ops over `slots`, warmed up first on the current stream, as
// PyTorch recommends. Returns the graph's output.
at::Tensor capture_torch_work(at::cuda::CUDAGraph& graph, const std::vector<at::Tensor>& slots, int kernels) {
  (void)torch_work(slots, kernels);
  graph.capture_begin();
  at::Tensor out = torch_work(slots, kernels);
  graph.capture_end();
  return out;
}

// The overhead table: every way of making the call, on the same work (K tiny kernels over 1 or 4
// inputs, static or copied). The raw kernels (cgt.cuda's work) and the libtorch ops (eager,
// CUDAGraph and cgt.torch's work) make different graphs when there are 4 inputs (one summing
// kernel against three adds), so each has its own raw cudaGraphLaunch baseline.
void overhead_of(int kernels, std::size_t count, bool copied, int calls, bool report) {
  const auto options = at::TensorOptions().device(at::kCUDA, 0);
  const std::string config =
      "K=" + std::to_string(kernels) + " inputs=" + std::to_string(count) + " " + (copied ? "copied" : "static");
  std::vector<at::Tensor> inputs;
  for (std::size_t i = 0; i < count; ++i) inputs.push_back(at::rand({elements}, options));
  std::vector<std::size_t> statics;
  if (!copied) {
    for (std::size_t i = 0; i < count; ++i) statics.push_back(i);
  }

  // Everything but cgt.cuda runs on one non-blocking side stream, as the raw launch does (a
  // blocking stream costs more per launch); cgt.cuda uses its pool's stream, of either kind, and
  // is measured against a raw launch on a stream of the same kind.
  const c10::cuda::CUDAStreamGuard side_stream(c10::cuda::getStreamFromPool(false, 0));
  c10::cuda::device_synchronize();  // the inputs were made on the default stream
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(0).stream();
  std::vector<Method> methods;

  // Eager libtorch: every op launched by the CPU.
  methods.push_back({"eager libtorch", [&] { (void)torch_work(inputs, kernels); }});

  // Copied inputs, done by hand: cudaMemcpyAsync into the slots the graph reads.
  std::vector<at::Tensor> slots;
  for (const auto& input : inputs) slots.push_back(copied ? input.clone() : input);
  auto copy_inputs = [&](cudaStream_t on) {
    if (!copied) return;
    for (std::size_t i = 0; i < count; ++i) {
      check(cudaMemcpyAsync(slots[i].data_ptr(), inputs[i].data_ptr(), elements * sizeof(float),
                            cudaMemcpyDeviceToDevice, on),
            "copy");
    }
  };

  // Raw cudaGraphLaunch of the raw kernels.
  std::vector<const float*> reads;
  for (const auto& slot : slots) reads.push_back(slot.data_ptr<float>());
  const at::Tensor raw_out = at::empty({elements}, options);
  const RawGraph raw(stream, [&] { raw_work(reads, raw_out.data_ptr<float>(), kernels, stream); });
  methods.push_back({"raw cudaGraphLaunch", [&] {
                       copy_inputs(stream);
                       check(cudaGraphLaunch(raw.exec(), stream), "launch");
                     }});
  // The same on a blocking stream, as cgt.cuda's default pool stream is: such a stream costs more
  // per launch, and cgt.cuda's default is measured against it.
  const OwnStream blocking(cudaStreamDefault);
  const RawGraph raw_blocking(blocking.get(),
                              [&] { raw_work(reads, raw_out.data_ptr<float>(), kernels, blocking.get()); });
  methods.push_back({"raw cudaGraphLaunch (blocking stream)", [&] {
                       copy_inputs(blocking.get());
                       check(cudaGraphLaunch(raw_blocking.exec(), blocking.get()), "launch");
                     }});

  // libtorch's CUDAGraph of the libtorch ops: replayed by CUDAGraph::replay (copied inputs:
  // copy_ into the captured inputs), and its executable launched raw.
  at::cuda::CUDAGraph torch_graph;
  const at::Tensor torch_out = capture_torch_work(torch_graph, slots, kernels);
  methods.push_back({"raw CUDAGraph::replay", [&] {
                       if (copied) {
                         for (std::size_t i = 0; i < count; ++i) slots[i].copy_(inputs[i], true);
                       }
                       torch_graph.replay();
                     }});
  methods.push_back({"raw cudaGraphLaunch (libtorch graph)", [&] {
                       copy_inputs(stream);
                       check(cudaGraphLaunch(torch_graph.raw_cuda_graph_exec(), stream), "launch");
                     }});

  // cgt.cuda: the raw kernels through a pool, on its own blocking (default) or non-blocking stream.
  const std::vector<cgt::cuda::Buffer> buffers = cuda_views(inputs);
  const std::vector<cgt::cuda::Arg> cuda_args(buffers.begin(), buffers.end());
  std::vector<cgt::cuda::Pool> cuda_pools;
  std::vector<cgt::cuda::Function> cuda_functions;
  for (const bool blocking_stream : {true, false}) {
    cuda_pools.push_back(must(cgt::cuda::make_pool({.device = 0, .blocking_stream = blocking_stream})));
    cuda_functions.push_back(add_cuda_work(cuda_pools.back(), kernels, statics));
  }
  for (std::size_t b = 0; b < cuda_functions.size(); ++b) {
    methods.push_back({b == 0 ? "cgt.cuda" : "cgt.cuda non-blocking",
                       [&, b] { (void)cuda_functions[b](std::span<const cgt::cuda::Arg>(cuda_args)); }});
  }

  // cgt.torch: the libtorch ops through a pool.
  auto torch_pool = must(cgt::torch::make_pool({.device = 0}));
  auto torch_function = add_torch_work(torch_pool, kernels, statics);
  const std::vector<cgt::torch::Arg> torch_args(inputs.begin(), inputs.end());
  methods.push_back({"cgt.torch", [&] { (void)torch_function(std::span<const cgt::torch::Arg>(torch_args)); }});

  const std::vector<Timing> timings = measure_interleaved(methods, calls);
  if (!report) return;
  for (std::size_t m = 0; m < methods.size(); ++m) print("overhead", config, methods[m].name, timings[m]);
  for (const auto& pool : cuda_pools) {
    if (pool.stats().replays < static_cast<std::uint64_t>(calls)) std::fprintf(stderr, "cgt.cuda did not replay\n");
  }
  if (torch_pool.stats().replays < static_cast<std::uint64_t>(calls))
    std::fprintf(stderr, "cgt.torch did not replay\n");
}

// Keeps the GPU busy with launches for `seconds` before anything is measured: a GPU that was idle
// comes back slowly (clocks, its PCIe link), and on an H200 the works measured first ran up to
// 0.6 us slower per raw launch than the same works later in the run.
void warm_up(double seconds) {
  const at::Tensor x = at::zeros({elements}, at::TensorOptions().device(at::kCUDA, 0));
  const auto start = std::chrono::steady_clock::now();
  while (seconds_since(start) < seconds) {
    for (int i = 0; i < drain_every; ++i) x.add_(1);
    check(cudaDeviceSynchronize(), "warming up");
  }
}

void overhead(int calls) {
  overhead_of(1, 1, false, calls, false);  // once through every method, unreported
  for (int kernels : {1, 10, 100}) {
    for (std::size_t count : {std::size_t{1}, std::size_t{4}}) {
      for (bool copied : {false, true}) overhead_of(kernels, count, copied, calls, true);
    }
  }
}

// Where a replay's CPU time over a raw launch goes, on this machine (`gpu_bench diagnose`): the
// static cells' work launched raw, also after each current-device read a replay could make (the
// runtime's cudaGetDevice, the driver's cuCtxGetCurrent), through the driver's cuGraphLaunch and on
// a blocking stream (as cgt.cuda's default pool stream is); through cgt.cuda and cgt.torch, each
// beside the raw launch of its graph; and the engine's bookkeeping alone: the same call shape
// through a host pool whose graph does nothing.
void diagnose_of(std::size_t count, int calls) {
  const auto options = at::TensorOptions().device(at::kCUDA, 0);
  const std::string config = "K=1 inputs=" + std::to_string(count) + " static";
  std::vector<at::Tensor> inputs;
  for (std::size_t i = 0; i < count; ++i) inputs.push_back(at::rand({elements}, options));
  std::vector<std::size_t> statics;
  for (std::size_t i = 0; i < count; ++i) statics.push_back(i);
  const c10::cuda::CUDAStreamGuard side_stream(c10::cuda::getStreamFromPool(false, 0));
  c10::cuda::device_synchronize();
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(0).stream();
  const OwnStream blocking(cudaStreamDefault);
  std::vector<const float*> reads;
  for (const auto& input : inputs) reads.push_back(input.data_ptr<float>());
  const at::Tensor raw_out = at::empty({elements}, options);
  const RawGraph raw(stream, [&] { raw_work(reads, raw_out.data_ptr<float>(), 1, stream); });
  const RawGraph raw_blocking(blocking.get(), [&] { raw_work(reads, raw_out.data_ptr<float>(), 1, blocking.get()); });
  // The driver's own entry points, looked up through the runtime (as current_device.hpp does).
  using GetCurrent = CUresult (*)(CUcontext*);
  using Launch = CUresult (*)(CUgraphExec, CUstream);
  void* get_current_entry = nullptr;
  void* launch_entry = nullptr;
  check(cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &get_current_entry, 12000, cudaEnableDefault, nullptr),
        "entry point");
  check(cudaGetDriverEntryPointByVersion("cuGraphLaunch", &launch_entry, 12000, cudaEnableDefault, nullptr),
        "entry point");
  const auto get_current = reinterpret_cast<GetCurrent>(get_current_entry);
  const auto launch = reinterpret_cast<Launch>(launch_entry);

  std::vector<Method> methods;
  methods.push_back({"raw cudaGraphLaunch", [&] { check(cudaGraphLaunch(raw.exec(), stream), "launch"); }});
  methods.push_back({"raw cudaGraphLaunch + cudaGetDevice", [&] {
                       int device = 0;
                       check(cudaGetDevice(&device), "device");
                       check(cudaGraphLaunch(raw.exec(), stream), "launch");
                     }});
  methods.push_back({"raw cudaGraphLaunch + cuCtxGetCurrent", [&] {
                       CUcontext context = nullptr;
                       if (get_current(&context) != CUDA_SUCCESS || context == nullptr) std::exit(1);
                       check(cudaGraphLaunch(raw.exec(), stream), "launch");
                     }});
  methods.push_back({"raw cuGraphLaunch (the driver's)", [&] {
                       if (launch(raw.exec(), stream) != CUDA_SUCCESS) std::exit(1);
                     }});
  methods.push_back({"raw cudaGraphLaunch (blocking stream)",
                     [&] { check(cudaGraphLaunch(raw_blocking.exec(), blocking.get()), "launch"); }});

  const std::vector<cgt::cuda::Buffer> buffers = cuda_views(inputs);
  const std::vector<cgt::cuda::Arg> cuda_args(buffers.begin(), buffers.end());
  auto cuda_pool = must(cgt::cuda::make_pool({.device = 0, .blocking_stream = false}));
  auto cuda_function = add_cuda_work(cuda_pool, 1, statics);
  methods.push_back(
      {"cgt.cuda non-blocking", [&] { (void)cuda_function(std::span<const cgt::cuda::Arg>(cuda_args)); }});

  // cgt.torch, against the raw launch of libtorch's graph of the same ops.
  const std::vector<at::Tensor> slots(inputs);
  at::cuda::CUDAGraph torch_graph;
  const at::Tensor torch_out = capture_torch_work(torch_graph, slots, 1);
  methods.push_back({"raw cudaGraphLaunch (libtorch graph)",
                     [&] { check(cudaGraphLaunch(torch_graph.raw_cuda_graph_exec(), stream), "launch"); }});
  methods.push_back(
      {"raw cudaGraphLaunch (libtorch graph) on getCurrentCUDAStream", [&] {
         check(cudaGraphLaunch(torch_graph.raw_cuda_graph_exec(), c10::cuda::getCurrentCUDAStream(0).stream()),
               "launch");
       }});
  methods.push_back({"raw cuGraphLaunch (libtorch graph)", [&] {
                       if (launch(torch_graph.raw_cuda_graph_exec(), stream) != CUDA_SUCCESS) std::exit(1);
                     }});
  auto torch_pool = must(cgt::torch::make_pool({.device = 0}));
  auto torch_function = add_torch_work(torch_pool, 1, statics);
  const std::vector<cgt::torch::Arg> torch_args(inputs.begin(), inputs.end());
  methods.push_back({"cgt.torch", [&] { (void)torch_function(std::span<const cgt::torch::Arg>(torch_args)); }});

  // The engine alone: the same shape (static inputs, one output) through a host pool whose graph
  // launches nothing.
  std::vector<cgt::host::Buffer> host_inputs;
  for (std::size_t i = 0; i < count; ++i)
    host_inputs.push_back(must(cgt::host::Buffer::make(cgt::ElementType::f32, {elements})));
  const std::vector<cgt::host::Arg> host_args(host_inputs.begin(), host_inputs.end());
  auto host_pool = must(cgt::host::make_pool());
  auto host_function = must(host_pool.add_function(
      [](cgt::host::Context& ctx, cgt::host::Inputs in) { return cgt::host::Values{ctx.allocate_like(in[0])}; },
      {.name = "nothing", .static_inputs = statics}));
  methods.push_back({"the engine alone (cgt.host with no work)",
                     [&] { (void)host_function(std::span<const cgt::host::Arg>(host_args)); }});

  const std::vector<Timing> timings = measure_interleaved(methods, calls);
  for (std::size_t m = 0; m < methods.size(); ++m) print("diagnose", config, methods[m].name, timings[m]);
  const auto replayed = [calls](std::uint64_t replays) { return replays >= static_cast<std::uint64_t>(calls); };
  if (!replayed(cuda_pool.stats().replays)) std::fprintf(stderr, "cgt.cuda did not replay\n");
  if (!replayed(torch_pool.stats().replays)) std::fprintf(stderr, "cgt.torch did not replay\n");
  if (!replayed(host_pool.stats().replays)) std::fprintf(stderr, "cgt.host did not replay\n");
}

void diagnose(int calls) {
  for (int repeat = 0; repeat < 3; ++repeat) {
    for (std::size_t count : {std::size_t{1}, std::size_t{4}}) diagnose_of(count, calls);
  }
}

std::size_t pool_reserved(c10::MempoolId_t pool) {
  std::size_t bytes = 0;
  for (const auto& segment : c10::cuda::CUDACachingAllocator::snapshot(pool, false).segments) {
    if (segment.owner_private_pool_id == pool) bytes += segment.total_size;
  }
  return bytes;
}

void memory() {
  const auto options = at::TensorOptions().device(at::kCUDA, 0);
  constexpr std::int64_t big = std::int64_t{16} << 20;  // 64 MiB of floats
  const at::Tensor x = at::rand({big}, options);
  auto a = [](const at::Tensor& t) { return t * 2; };
  auto b = [](const at::Tensor& t) { return t + 1; };
  auto b_prime = [](const at::Tensor& t) { return t * 3; };
  {
    auto pool = must(cgt::torch::make_pool({.device = 0}));
    auto fa =
        must(pool.add_function([&](cgt::torch::Inputs in) { return cgt::torch::Values{a(in[0])}; }, {.name = "A"}));
    auto fb =
        must(pool.add_function([&](cgt::torch::Inputs in) { return cgt::torch::Values{b(in[0])}; }, {.name = "B"}));
    auto fc = must(
        pool.add_function([&](cgt::torch::Inputs in) { return cgt::torch::Values{b_prime(in[0])}; }, {.name = "B'"}));
    std::size_t peak = 0;
    for (auto* second : {&fb, &fc}) {
      for (int i = 0; i < 3; ++i) {
        pool.mark_step_begin();
        auto out_a = must(fa({x}));
        auto out_b = must((*second)({*out_a.get(0)}));
        peak = std::max(peak, pool.memory().allocated_bytes);
      }
    }
    std::printf("memory,branching A->B and A->B' (64 MiB tensors),cgt.torch,%zu,%zu\n", pool.memory().reserved_bytes,
                peak);
  }
  {
    // One pool per graph: what plain CUDA graphs (or make_graphed_callables without a shared pool) hold.
    const c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromPool(false, 0));
    at::cuda::CUDAGraph ga, gb, gc;
    const auto pa = at::cuda::graph_pool_handle(), pb = at::cuda::graph_pool_handle(),
               pc = at::cuda::graph_pool_handle();
    ga.capture_begin(pa);
    const at::Tensor out_a = a(x);
    ga.capture_end();
    gb.capture_begin(pb);
    const at::Tensor out_b = b(out_a);
    gb.capture_end();
    gc.capture_begin(pc);
    const at::Tensor out_c = b_prime(out_a);
    gc.capture_end();
    const std::size_t reserved = pool_reserved(pa) + pool_reserved(pb) + pool_reserved(pc);
    std::printf("memory,branching A->B and A->B' (64 MiB tensors),one pool per graph,%zu,%zu\n", reserved, reserved);
  }
  // A decode loop: y = tanh(x @ W), two batch sizes.
  const at::Tensor weight = at::rand({4096, 4096}, options) / 64;
  auto step = [&](const at::Tensor& in) { return at::tanh(at::matmul(in, weight)); };
  {
    auto pool = must(cgt::torch::make_pool({.device = 0}));
    auto decode = must(
        pool.add_function([&](cgt::torch::Inputs in) { return cgt::torch::Values{step(in[0])}; }, {.name = "decode"}));
    std::size_t peak = 0;
    for (std::int64_t batch : {1, 8}) {
      const at::Tensor tokens = at::rand({batch, 4096}, options);
      for (int i = 0; i < 4; ++i) {
        pool.mark_step_begin();
        auto out = must(decode({tokens}));
        peak = std::max(peak, pool.memory().allocated_bytes);
      }
    }
    std::printf("memory,decode loop batch 1 and 8,cgt.torch,%zu,%zu\n", pool.memory().reserved_bytes, peak);
  }
  {
    const c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromPool(false, 0));
    std::size_t reserved = 0;
    std::vector<std::unique_ptr<at::cuda::CUDAGraph>> graphs;
    std::vector<at::Tensor> keep;
    for (std::int64_t batch : {1, 8}) {
      const at::Tensor tokens = at::rand({batch, 4096}, options);
      (void)step(tokens);
      const auto pool = at::cuda::graph_pool_handle();
      graphs.push_back(std::make_unique<at::cuda::CUDAGraph>());
      graphs.back()->capture_begin(pool);
      keep.push_back(step(tokens));
      graphs.back()->capture_end();
      reserved += pool_reserved(pool);
    }
    std::printf("memory,decode loop batch 1 and 8,one pool per graph,%zu,%zu\n", reserved, reserved);
  }
}

void scaling() {
  const auto buffer = must(cgt::cuda::Buffer::make(cgt::ElementType::f32, {elements}));
  auto kernel_fn = [](int outputs) {
    return [outputs](cgt::cuda::Context& ctx, cgt::cuda::Inputs in) {
      cgt::cuda::Values out;
      for (int o = 0; o < outputs; ++o) {
        cgt::cuda::Buffer y = ctx.allocate(cgt::ElementType::f32, {elements});
        raw_work({in[0].as<float>()}, y.as<float>(), 1, ctx.stream());
        out.push_back(y);
      }
      return out;
    };
  };
  // Siblings: a root R, then N functions recorded as children of R; the cost of calling F0 after R.
  for (int siblings : {1, 10, 100, 1000}) {
    auto pool = must(cgt::cuda::make_pool({.device = 0}));
    auto root = must(pool.add_function(kernel_fn(1), {.name = "R"}));
    std::vector<cgt::cuda::Function> children;
    for (int i = 0; i < siblings; ++i)
      children.push_back(must(pool.add_function(kernel_fn(1), {.name = "F" + std::to_string(i)})));
    for (int walk = 0; walk < 2; ++walk) {
      for (auto& child : children) {
        pool.mark_step_begin();
        auto r = must(root({buffer}));
        (void)must(child({*r.get(0)}));
      }
    }
    std::vector<double> cpu;
    for (int i = 0; i < 2000; ++i) {
      pool.mark_step_begin();
      auto r = must(root({buffer}));
      const auto start = std::chrono::steady_clock::now();
      auto c = must(children[0]({*r.get(0)}));
      cpu.push_back(seconds_since(start) * 1e6);
      if (i % drain_every == drain_every - 1) check(cudaDeviceSynchronize(), "draining");
    }
    std::ranges::sort(cpu);
    std::printf("scaling,siblings,%d,%.3f\n", siblings, cpu[cpu.size() / 2]);
  }
  // Depth: a chain of D calls, each on the previous output; the cost of the last call.
  for (int depth : {1, 10, 100}) {
    auto pool = must(cgt::cuda::make_pool({.device = 0}));
    auto link = must(pool.add_function(kernel_fn(1), {.name = "link"}));
    std::vector<double> cpu;
    for (int walk = 0; walk < 400; ++walk) {
      pool.mark_step_begin();
      std::vector<cgt::cuda::Outputs> chain;
      chain.push_back(must(link({buffer})));
      for (int d = 1; d < depth; ++d) {
        const auto start = std::chrono::steady_clock::now();
        chain.push_back(must(link({*chain.back().get(0)})));
        if (d == depth - 1 && walk >= 2) cpu.push_back(seconds_since(start) * 1e6);
      }
      if (depth == 1 && walk >= 2) {
        const auto start = std::chrono::steady_clock::now();
        (void)must(link({buffer}));
        cpu.push_back(seconds_since(start) * 1e6);
      }
      check(cudaDeviceSynchronize(), "draining");
    }
    std::ranges::sort(cpu);
    std::printf("scaling,depth,%d,%.3f\n", depth, cpu[cpu.size() / 2]);
  }
  // Outputs: one function with M outputs, all held until the call returns.
  for (int outputs : {1, 8, 64}) {
    auto pool = must(cgt::cuda::make_pool({.device = 0}));
    auto many = must(pool.add_function(kernel_fn(outputs), {.name = "many"}));
    const Timing t = measure([&] { (void)must(many({buffer})); }, 2000);
    std::printf("scaling,outputs,%d,%.3f\n", outputs, t.cpu_us);
  }
}

// Time to warm up and record the first calls, and to re-record after a static input moved (the
// median of `moves` moves, each to a new address), for K kernels.
void capture() {
  constexpr int moves = 8;
  const auto options = at::TensorOptions().device(at::kCUDA, 0);
  auto timed_ms = [](const std::function<void()>& work) {
    check(cudaDeviceSynchronize(), "sync");
    const auto start = std::chrono::steady_clock::now();
    work();
    check(cudaDeviceSynchronize(), "sync");
    return seconds_since(start) * 1e3;
  };
  bool reported = false;
  // Times the first calls of `f` (warm-up + recording) and its re-recordings as its static input 1
  // moves through `weights`, and reports them as `backend` with the in-place update on or off.
  auto time_captures = [&](auto& pool, auto& f, const auto& x, const auto& weights, int kernels, const char* backend,
                           bool in_place) {
    const double first = timed_ms([&] {
      (void)must(f({x, weights[0]}));
      pool.mark_step_begin();
      (void)must(f({x, weights[0]}));
    });
    std::vector<double> moved;
    for (std::size_t i = 1; i < weights.size(); ++i) {
      pool.mark_step_begin();
      moved.push_back(timed_ms([&] { (void)must(f({x, weights[i]})); }));
    }
    if (in_place && must(pool.device()).get().graph_counts().updated_in_place != moved.size())
      std::fprintf(stderr, "%s did not update its graph in place\n", backend);
    if (!reported) return;
    std::ranges::sort(moved);
    std::printf("capture,K=%d,%s (%s),%.3f,%.3f\n", kernels, backend, in_place ? "update in place" : "instantiate anew",
                first, moved[moved.size() / 2]);
    std::fflush(stdout);
  };
  // The first pass, unreported, pays what the process uses for the first time (libtorch's and the
  // driver's lazy set-up: 18 ms in a first recording), which is no part of a recording's cost.
  for (const int kernels : {10, 10, 100}) {
    for (const bool in_place : {true, false}) {
      auto pool = must(cgt::torch::make_pool({.device = 0, .update_graphs_in_place = in_place}));
      const at::Tensor x = at::rand({elements}, options);
      std::vector<at::Tensor> weights;
      for (int i = 0; i <= moves; ++i) weights.push_back(at::rand({elements}, options));
      auto f = must(pool.add_function(
          [kernels](cgt::torch::Inputs in) { return cgt::torch::Values{torch_work({in[0], in[1]}, kernels)}; },
          {.name = "f", .static_inputs = {1}}));
      time_captures(pool, f, x, weights, kernels, "cgt.torch", in_place);
    }
    for (const bool in_place : {true, false}) {
      auto pool = must(cgt::cuda::make_pool({.device = 0, .update_graphs_in_place = in_place}));
      auto x = must(cgt::cuda::Buffer::make(cgt::ElementType::f32, {elements}));
      std::vector<cgt::cuda::Buffer> weights;
      for (int i = 0; i <= moves; ++i)
        weights.push_back(must(cgt::cuda::Buffer::make(cgt::ElementType::f32, {elements})));
      auto f = must(pool.add_function(
          [kernels](cgt::cuda::Context& ctx, cgt::cuda::Inputs in) {
            cgt::cuda::Buffer out = ctx.allocate(cgt::ElementType::f32, {elements});
            raw_work({in[0].as<float>(), in[1].as<float>()}, out.as<float>(), kernels, ctx.stream());
            return cgt::cuda::Values{out};
          },
          {.name = "f", .static_inputs = {1}}));
      time_captures(pool, f, x, weights, kernels, "cgt.cuda", in_place);
    }
    reported = true;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (!cgt::torch::is_available()) {
    std::fprintf(stderr, "gpu_bench needs a CUDA device\n");
    return 1;
  }
  torch::NoGradGuard no_grad;
  const std::string_view what = argc > 1 ? argv[1] : "all";
  const int calls = argc > 2 ? std::atoi(argv[2]) : 3000;
  warm_up(5.0);
  if (what == "overhead" || what == "all") overhead(calls);
  if (what == "diagnose") diagnose(calls);
  if (what == "memory" || what == "all") memory();
  if (what == "scaling" || what == "all") scaling();
  if (what == "capture" || what == "all") capture();
  return 0;
}
