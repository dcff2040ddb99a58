// Loops and branches the GPU decides in a libtorch pool function (cgt::torch::loop_while, if_then,
// switch_on): conditional graph nodes in a recording (src/kernels/conditional.hpp), their bodies
// captured on a stream of their own whose allocations go to the pool; run now, the host reading
// the decider, outside one. A node that cannot be made gives the recording up: its shapes run
// eagerly with the same results.
module;
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "conditional.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>

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

// Outside a recording: the decider's value now, once the work before it ran (a wait).
std::int32_t read_now(const at::Tensor& value) {
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

void give_up(ConditionalRecording& recording, std::string why) {
  if (recording.given_up.empty()) recording.given_up = std::move(why);
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
    give_up(recording, "conditional nodes nested deeper than cgt.torch captures them (4)");
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
      give_up(recording, std::string("capturing a conditional node's body failed: ") + cudaGetErrorString(began));
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
          give_up(recording, std::string("a conditional node's body broke its capture: ") + cudaGetErrorString(error));
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
  if (recording.depth == 0 && allocated_in_bodies(state) > 0) {
    give_up(recording,
            "a tensor made in a loop or branch body outlives the body (the bodies' temporaries are reused by "
            "every graph of the pool): write what the body computes into tensors made outside it");
  }
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
    give_up(recording, std::string("adding a ") + name + " node failed: " + cudaGetErrorString(added));
    return false;
  }
  return true;
}

void check_body(ConditionalRecording& recording, cudaGraph_t body, const char* name) {
  if (const std::string why = kernels::forbidden_in_body(body); !why.empty()) {
    give_up(recording, std::string("a ") + name + " node's body cannot be recorded as one: " + why);
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
    for (std::uint64_t i = 0; i < max_iterations && read_now(go_on) != 0; ++i) body();
    return;
  }
  if (!recording->given_up.empty()) return;  // given up already: nothing more of this capture is kept
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
      give_up(*recording, std::string("launching a loop's decision failed: ") + cudaGetErrorString(decided));
    }
  });
  check_body(*recording, node.bodies.front(), "WHILE");
}

void if_then(const at::Tensor& condition, const Body& body) {
  const std::int32_t* decider = decider_of(condition, "if_then");
  ConditionalRecording* recording = recording_here();
  if (recording == nullptr) {
    if (read_now(condition) != 0) body();
    return;
  }
  if (!recording->given_up.empty()) return;
  kernels::ConditionalNode node;
  if (!append(*recording, kernels::ConditionalKind::if_then, decider, nullptr, 0, 1, node, "IF")) return;
  capture_body(*recording, node.bodies.front(), body);
  check_body(*recording, node.bodies.front(), "IF");
}

void switch_on(const at::Tensor& index, std::span<const Body> bodies) {
  const std::int32_t* decider = decider_of(index, "switch_on");
  ConditionalRecording* recording = recording_here();
  if (recording == nullptr) {
    const std::int32_t chosen = read_now(index);
    if (chosen >= 0 && static_cast<std::size_t>(chosen) < bodies.size()) bodies[static_cast<std::size_t>(chosen)]();
    return;
  }
  if (!recording->given_up.empty() || bodies.empty()) return;
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
