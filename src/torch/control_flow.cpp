// Loops and branches the GPU decides in a libtorch pool function (cgt::torch::loop_while, if_then,
// switch_on): conditional graph nodes in a recording (src/kernels/conditional.hpp), their bodies
// captured on a stream of their own whose allocations go to the pool; run now, the host reading
// the decider, outside one. A node that cannot be made makes the pool record the function again
// with the host deciding: the capture is then cut around each decision (capture_cuts.hpp).
module;
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "capture_cuts.hpp"
#include "conditional.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

module cgt.torch;
import cgt.core;
import :internal;

namespace cgt::torch {
namespace {

constexpr std::size_t kNestedBodies = 4;  // a loop in a branch in a loop in a branch

// The value a loop or branch is decided on: one int32 element on a CUDA device.
const std::int32_t* decider_of(const at::Tensor& value, const char* what) {
  if (!value.defined() || !value.is_cuda() || value.scalar_type() != at::kInt || value.numel() != 1) {
    throw backend::InvalidArgument(std::string("cgt::torch::") + what +
                                   ": the value it is decided on must be one int32 element on a CUDA device");
  }
  return value.data_ptr<std::int32_t>();
}

// Outside a recording: the decider's value now, once the work before it ran (a wait). Refused,
// before anything is read, on a stream that captures a graph of the program's own: a read there
// would break that capture, and the loop could not be decided.
std::int32_t read_now(const at::Tensor& value, const char* what) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream().stream(), &status) != cudaSuccess) {
    (void)cudaGetLastError();
  }
  if (status != cudaStreamCaptureStatusNone) {
    throw backend::InvalidArgument(std::string("cgt::torch::") + what +
                                   ": called while the current stream captures a CUDA graph that is not a pool's "
                                   "recording (the program's own): the host cannot read the value it is decided on "
                                   "there; call it inside a pool function, which records it as a conditional node");
  }
  return value.item<std::int32_t>();
}

// The recording on this thread that captures the current stream, if any: a pool function's,
// not a capture of the program's own, nor a warm-up's.
ConditionalRecording* recording_here() {
  ConditionalRecording* recording = current_conditional_recording;
  if (recording == nullptr) return nullptr;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream().stream(), &status) != cudaSuccess ||
      status != cudaStreamCaptureStatusActive) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return recording;
}

// Gives the recording up for `why` (the first reason is kept): recorded again with the host
// deciding when `host_may_decide` (only a conditional node failed), else its shapes run eagerly.
constexpr const char* outlives_body =
    "a tensor made in a loop or branch body outlives the body (the body's C++ runs once, when it is recorded: a "
    "tensor it makes is made once, and what reads it after the body reads that one whatever the iterations): write "
    "what the body computes into tensors made outside it";

void give_up(ConditionalRecording& recording, std::string why, bool host_may_decide) {
  if (!recording.given_up.empty()) return;
  recording.given_up = std::move(why);
  recording.host_may_decide = host_may_decide;
}

using Kind = backend::HostDecisions::Kind;

// In a recording whose loops and branches the host decides: cuts the capture before the
// decision and after each body, on the pool's stream (the bodies run there too). What a body
// makes must die in it, as with conditional nodes: a tensor it reassigns would be read at the
// address the capture saw, whatever the iterations (its cuBLAS workspace is given back first).
void cut_around(ConditionalRecording& recording, Kind kind, const std::int32_t* decider, std::uint64_t max_iterations,
                std::size_t bodies, const std::function<void(std::size_t)>& capture_body) {
  kernels::HostSegments& segments = *recording.segments;
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream();
  cudaError_t failed = segments.cut(stream.stream());
  segments.decisions.open(kind, decider, max_iterations, bodies);
  for (std::size_t i = 0; i < bodies; ++i) {
    segments.decisions.body(i);
    const std::vector<std::uintptr_t> before = addresses_of(allocated_blocks(*recording.state));
    capture_body(i);
    clear_workspaces_of(stream);
    if (addresses_of(allocated_blocks(*recording.state)) != before) give_up(recording, outlives_body, false);
    if (const cudaError_t cut = segments.cut(stream.stream()); failed == cudaSuccess) failed = cut;
  }
  segments.decisions.close();
  if (failed == cudaSuccess) return;
  (void)cudaGetLastError();
  give_up(recording, std::string("cutting the capture at a loop or branch failed: ") + cudaGetErrorString(failed),
          false);
}

// A loop body that draws random numbers would draw the same ones at every iteration (its kernels'
// offsets are fixed in the graph, as in any graph): such a loop is not recorded.
void refuse_random_draws(ConditionalRecording& recording, std::uint64_t offset_before) {
  if (random_offset_in_capture(recording.state->index) == offset_before) return;
  give_up(recording,
          "a loop body draws random numbers, which a recorded loop would repeat at every iteration (their offsets "
          "are fixed in the graph): draw them before the loop, or run the loop without cgt",
          false);
}

// Bytes the bodies' pool has allocated now: 0 once every body ended, unless a tensor a body
// made outlives it.
std::size_t allocated_in_bodies(const TorchDevice::State& state) {
  std::size_t bytes = 0;
  for (const auto& segment : allocator::snapshot(state.body_pool, false).segments) {
    if (segment.owner_private_pool_id == state.body_pool) bytes += segment.allocated_size;
  }
  return bytes;
}

// Routes the allocations of every body stream to the bodies' pool while it lives: from the
// outermost body's capture to its end (libtorch routes each pool once at a time).
class BodyRouting {
 public:
  explicit BodyRouting(TorchDevice::State& state) : state_(state) {
    allocator::beginAllocateToPool(state.index, state.body_pool, [&state](cudaStream_t stream) {
      return std::ranges::any_of(state.body_streams,
                                 [stream](const c10::cuda::CUDAStream& body) { return body.stream() == stream; });
    });
    ++state.body_pool_uses;  // given back at shutdown: the graphs use the pool's memory until then
  }
  BodyRouting(const BodyRouting&) = delete;
  BodyRouting& operator=(const BodyRouting&) = delete;
  ~BodyRouting() { allocator::endAllocateToPool(state_.index, state_.body_pool); }

 private:
  TorchDevice::State& state_;
};

// Captures what `launch_all` launches into `body`, a conditional node's body, on the stream of
// its depth, whose allocations go to the bodies' pool.
void capture_body(ConditionalRecording& recording, cudaGraph_t body, const std::function<void()>& launch_all) {
  TorchDevice::State& state = *recording.state;
  if (recording.depth >= state.body_streams.size() || state.body_pool == c10::MempoolId_t{0, 0}) {
    give_up(recording, "conditional nodes nested deeper than cgt.torch captures them (4)", true);
    return;
  }
  const c10::cuda::CUDAStream side = state.body_streams[recording.depth];
  {
    std::optional<BodyRouting> routing;
    if (recording.depth == 0) routing.emplace(state);
    if (const cudaError_t began =
            cudaStreamBeginCaptureToGraph(side.stream(), body, nullptr, nullptr, 0, cudaStreamCaptureModeThreadLocal);
        began != cudaSuccess) {
      (void)cudaGetLastError();
      give_up(recording, std::string("capturing a conditional node's body failed: ") + cudaGetErrorString(began), true);
      return;
    }
    // The body's ops go to its stream, also when it throws; its capture always ends, and the
    // cuBLAS workspaces it made for its stream are given back to the bodies' pool (as the
    // recording's own are to the pool's: their memory is the graph's temporary).
    struct Nest {
      ConditionalRecording& recording;
      c10::cuda::CUDAStream side;
      ~Nest() {
        cudaGraph_t ended = nullptr;
        if (const cudaError_t error = cudaStreamEndCapture(side.stream(), &ended); error != cudaSuccess) {
          (void)cudaGetLastError();
          give_up(recording, std::string("a conditional node's body broke its capture: ") + cudaGetErrorString(error),
                  false);
        }
        clear_workspaces_of(side);
        --recording.depth;
      }
    } const nest{.recording = recording, .side = side};
    const c10::cuda::CUDAStreamGuard guard(side);
    ++recording.depth;
    launch_all();
  }
  // Every tensor a body made must be dead when the outermost body ends: the next graph's bodies
  // reuse the memory.
  if (recording.depth == 0 && allocated_in_bodies(state) > 0) give_up(recording, outlives_body, false);
}

// Adds a node of `kind` to the recording on the current stream; false (the recording given up)
// when it cannot be made.
bool append(ConditionalRecording& recording, kernels::ConditionalKind kind, const std::int32_t* decider,
            unsigned long long* counter, std::uint64_t max_iterations, unsigned bodies, kernels::ConditionalNode& node,
            const char* name) {
  if (const cudaError_t added = kernels::append_conditional(c10::cuda::getCurrentCUDAStream().stream(), kind, decider,
                                                            counter, max_iterations, bodies, node);
      added != cudaSuccess) {
    (void)cudaGetLastError();
    give_up(recording, std::string("adding a ") + name + " node failed: " + cudaGetErrorString(added), true);
    return false;
  }
  recording.made_nodes = true;
  return true;
}

void check_body(ConditionalRecording& recording, cudaGraph_t body, const char* name) {
  if (const std::string why = kernels::forbidden_in_body(body); !why.empty()) {
    give_up(recording, std::string("a ") + name + " node's body cannot be recorded as one: " + why, true);
  }
}

}  // namespace

void make_body_streams(TorchDevice::State& state) {
  if (state.body_pool == c10::MempoolId_t{0, 0}) state.body_pool = at::cuda::graph_pool_handle();
  while (state.body_streams.size() < kNestedBodies) {
    const c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(false, state.index);
    if (stream != state.stream) state.body_streams.push_back(stream);
  }
}

void loop_while(const at::Tensor& go_on, std::uint64_t max_iterations, const Body& body) {
  const std::int32_t* decider = decider_of(go_on, "loop_while");
  if (max_iterations == 0) throw backend::InvalidArgument("cgt::torch::loop_while: max_iterations must be at least 1");
  ConditionalRecording* recording = recording_here();
  if (recording == nullptr) {
    for (std::uint64_t i = 0; i < max_iterations && read_now(go_on, "loop_while") != 0; ++i) body();
    return;
  }
  if (!recording->given_up.empty()) return;  // given up already: nothing more of this capture is kept
  const std::uint64_t random_before = random_offset_in_capture(recording->state->index);
  if (recording->segments != nullptr) {
    cut_around(*recording, Kind::loop, decider, max_iterations, 1, [&](std::size_t) { body(); });
    refuse_random_draws(*recording, random_before);
    return;
  }
  const at::Tensor counter = at::empty({1}, go_on.options().dtype(at::kLong));
  auto* count = reinterpret_cast<unsigned long long*>(counter.data_ptr<std::int64_t>());  // NOLINT
  kernels::ConditionalNode node;
  if (!append(*recording, kernels::ConditionalKind::loop_while, decider, count, max_iterations, 1, node, "WHILE")) {
    return;
  }
  capture_body(*recording, node.bodies.front(), [&] {
    body();
    if (const cudaError_t decided = kernels::launch_loop_decision(c10::cuda::getCurrentCUDAStream().stream(),
                                                                  node.handle, decider, count, max_iterations);
        decided != cudaSuccess) {
      (void)cudaGetLastError();
      give_up(*recording, std::string("launching a loop's decision failed: ") + cudaGetErrorString(decided), true);
    }
  });
  refuse_random_draws(*recording, random_before);
  check_body(*recording, node.bodies.front(), "WHILE");
}

void if_then(const at::Tensor& condition, const Body& body) {
  const std::int32_t* decider = decider_of(condition, "if_then");
  ConditionalRecording* recording = recording_here();
  if (recording == nullptr) {
    if (read_now(condition, "if_then") != 0) body();
    return;
  }
  if (!recording->given_up.empty()) return;
  if (recording->segments != nullptr) {
    cut_around(*recording, Kind::branch, decider, 0, 1, [&](std::size_t) { body(); });
    return;
  }
  kernels::ConditionalNode node;
  if (!append(*recording, kernels::ConditionalKind::if_then, decider, nullptr, 0, 1, node, "IF")) return;
  capture_body(*recording, node.bodies.front(), body);
  check_body(*recording, node.bodies.front(), "IF");
}

void switch_on(const at::Tensor& index, std::span<const Body> bodies) {
  const std::int32_t* decider = decider_of(index, "switch_on");
  ConditionalRecording* recording = recording_here();
  if (recording == nullptr) {
    const std::int32_t chosen = read_now(index, "switch_on");
    if (chosen >= 0 && static_cast<std::size_t>(chosen) < bodies.size()) bodies[static_cast<std::size_t>(chosen)]();
    return;
  }
  if (!recording->given_up.empty() || bodies.empty()) return;
  if (recording->segments != nullptr) {
    cut_around(*recording, Kind::choice, decider, 0, bodies.size(), [&](std::size_t i) { bodies[i](); });
    return;
  }
  kernels::ConditionalNode node;
  if (!append(*recording, kernels::ConditionalKind::switch_on, decider, nullptr, 0,
              static_cast<unsigned>(bodies.size()), node, "SWITCH")) {
    return;
  }
  for (std::size_t i = 0; i < bodies.size(); ++i) {
    capture_body(*recording, node.bodies[i], bodies[i]);
    check_body(*recording, node.bodies[i], "SWITCH");
  }
}

}  // namespace cgt::torch
