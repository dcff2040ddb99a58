// Loops and branches the GPU decides (Context::loop_while, if_then, switch_on): conditional graph
// nodes in a recording (src/kernels/conditional.hpp), run now, the host reading the decider,
// outside one. A node that cannot be made makes the pool record the function again with the host
// deciding: its capture is then cut around each decision (src/kernels/capture_cuts.hpp).
module;
#include <cuda_runtime_api.h>

#include "capture_cuts.hpp"
#include "conditional.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>

module cgt.cuda;
import cgt.core;
import :internal;

namespace cgt::cuda {
namespace {

using Kind = backend::HostDecisions::Kind;

// The value a loop or branch is decided on: one i32 element on the pool's device.
const std::int32_t* decider_of(const Buffer& value, int device, const char* what) {
  if (value.type() != ElementType::i32 || value.numel() != 1 || value.device() != device) {
    throw InvalidArgument(std::string("Context::") + what +
                          ": the value it is decided on must be one i32 element on the pool's device");
  }
  return value.as<std::int32_t>();
}

// Outside a recording: the decider's value now, once the stream's work before it ran.
std::int32_t read_now(const std::int32_t* decider, cudaStream_t stream) {
  std::int32_t value = 0;
  if (const cudaError_t error = kernels::read_decider(decider, stream, value); error != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::runtime_error(std::string("reading the value a loop or branch is decided on failed: ") +
                             cudaGetErrorString(error));
  }
  return value;
}

// Why a captured body cannot stay a conditional node's ("" when it can).
std::string forbidden(cudaGraph_t body, const char* node) {
  const std::string why = kernels::forbidden_in_body(body);
  return why.empty() ? why : std::string("a ") + node + " node's body cannot be recorded as one: " + why;
}

// In a recording whose loops and branches the host decides: cuts the capture before the
// decision and after each body; "" or why a cut failed.
std::string cut_around(HostSegments& segments, cudaStream_t stream, Kind kind, const std::int32_t* decider,
                       std::uint64_t max_iterations, std::size_t bodies,
                       const std::function<void(std::size_t)>& capture_body) {
  cudaError_t failed = segments.cut(stream);
  segments.decisions.open(kind, decider, max_iterations, bodies);
  for (std::size_t i = 0; i < bodies; ++i) {
    segments.decisions.body(i);
    capture_body(i);
    if (const cudaError_t cut = segments.cut(stream); failed == cudaSuccess) failed = cut;
  }
  segments.decisions.close();
  if (failed == cudaSuccess) return {};
  (void)cudaGetLastError();
  return std::string("cutting the capture at a loop or branch failed: ") + cudaGetErrorString(failed);
}

}  // namespace

void Context::give_up_recording(std::string why, bool host_may_decide) {
  if (!uncapturable_.empty()) return;
  uncapturable_ = std::move(why);
  host_may_decide_ = host_may_decide;
}

void Context::capture_body(cudaGraph_t body, const std::function<void()>& launch_all) {
  auto* const side = body_stream(depth_);
  if (side == nullptr) {
    give_up_recording("conditional nodes nested deeper than cgt.cuda captures them (4)", true);
    return;
  }
  if (const cudaError_t began =
          cudaStreamBeginCaptureToGraph(side, body, nullptr, nullptr, 0, cudaStreamCaptureModeThreadLocal);
      began != cudaSuccess) {
    give_up_recording(std::string("capturing a conditional node's body failed: ") + cudaGetErrorString(began), true);
    return;
  }
  // The body's kernels go to its stream, also when it throws; its capture always ends. A body
  // that broke its capture (a synchronisation) would break the host-decided one too.
  struct Nest {
    Context& context;
    cudaStream_t outer;
    cudaStream_t side;
    ~Nest() {
      cudaGraph_t ended = nullptr;
      if (const cudaError_t error = cudaStreamEndCapture(side, &ended); error != cudaSuccess) {
        context.give_up_recording(
            std::string("a conditional node's body broke its capture: ") + cudaGetErrorString(error), false);
      }
      context.body_stream_ = outer;
      --context.depth_;
    }
  } const nest{.context = *this, .outer = body_stream_, .side = side};
  body_stream_ = side;
  ++depth_;
  launch_all();
}

void Context::loop_while(const Buffer& go_on, std::uint64_t max_iterations, const Body& body) {
  const std::int32_t* decider = decider_of(go_on, pool_device(), "loop_while");
  if (max_iterations == 0) throw InvalidArgument("Context::loop_while: max_iterations must be at least 1");
  if (!capturing_) {
    // Run now. In a warm-up, an iteration's pool blocks die with it: the next one reuses them
    // (as the graph's iterations reuse the body's), and the last one's live to the call's end.
    const std::size_t kept = allocations_.size();
    for (std::uint64_t i = 0; i < max_iterations && read_now(decider, stream()) != 0; ++i) {
      if (i > 0) free_allocations_since(kept);
      body(*this);
    }
    return;
  }
  if (!uncapturable_.empty()) return;  // given up already: nothing more of this capture is kept
  if (segments_ != nullptr) {
    const std::string failed =
        cut_around(*segments_, stream(), Kind::loop, decider, max_iterations, 1, [&](std::size_t) { body(*this); });
    if (!failed.empty()) give_up_recording(failed, false);
    return;
  }
  const Buffer counter = allocate(ElementType::i64, {1});
  auto* count = counter.as<unsigned long long>();
  kernels::ConditionalNode node;
  if (const cudaError_t added = kernels::append_conditional(stream(), kernels::ConditionalKind::loop_while, decider,
                                                            count, max_iterations, 1, node);
      added != cudaSuccess) {
    give_up_recording(std::string("adding a WHILE node failed: ") + cudaGetErrorString(added), true);
    return;
  }
  made_conditional_nodes_ = true;
  capture_body(node.bodies.front(), [&] {
    body(*this);
    if (const cudaError_t decided =
            kernels::launch_loop_decision(stream(), node.handle, decider, count, max_iterations);
        decided != cudaSuccess) {
      give_up_recording(std::string("launching a loop's decision failed: ") + cudaGetErrorString(decided), true);
    }
  });
  if (std::string why = forbidden(node.bodies.front(), "WHILE"); !why.empty()) give_up_recording(std::move(why), true);
}

void Context::if_then(const Buffer& condition, const Body& body) {
  const std::int32_t* decider = decider_of(condition, pool_device(), "if_then");
  if (!capturing_) {
    if (read_now(decider, stream()) != 0) body(*this);
    return;
  }
  if (!uncapturable_.empty()) return;
  if (segments_ != nullptr) {
    const std::string failed =
        cut_around(*segments_, stream(), Kind::branch, decider, 0, 1, [&](std::size_t) { body(*this); });
    if (!failed.empty()) give_up_recording(failed, false);
    return;
  }
  kernels::ConditionalNode node;
  if (const cudaError_t added =
          kernels::append_conditional(stream(), kernels::ConditionalKind::if_then, decider, nullptr, 0, 1, node);
      added != cudaSuccess) {
    give_up_recording(std::string("adding an IF node failed: ") + cudaGetErrorString(added), true);
    return;
  }
  made_conditional_nodes_ = true;
  capture_body(node.bodies.front(), [&] { body(*this); });
  if (std::string why = forbidden(node.bodies.front(), "IF"); !why.empty()) give_up_recording(std::move(why), true);
}

void Context::switch_on(const Buffer& index, std::span<const Body> bodies) {
  const std::int32_t* decider = decider_of(index, pool_device(), "switch_on");
  if (!capturing_) {
    const std::int32_t chosen = read_now(decider, stream());
    if (chosen >= 0 && static_cast<std::size_t>(chosen) < bodies.size())
      bodies[static_cast<std::size_t>(chosen)](*this);
    return;
  }
  if (!uncapturable_.empty() || bodies.empty()) return;
  if (segments_ != nullptr) {
    const std::string failed = cut_around(*segments_, stream(), Kind::choice, decider, 0, bodies.size(),
                                          [&](std::size_t i) { bodies[i](*this); });
    if (!failed.empty()) give_up_recording(failed, false);
    return;
  }
  kernels::ConditionalNode node;
  if (const cudaError_t added = kernels::append_conditional(stream(), kernels::ConditionalKind::switch_on, decider,
                                                            nullptr, 0, static_cast<unsigned>(bodies.size()), node);
      added != cudaSuccess) {
    give_up_recording(std::string("adding a SWITCH node failed (it needs CUDA 12.8): ") + cudaGetErrorString(added),
                      true);
    return;
  }
  made_conditional_nodes_ = true;
  for (std::size_t i = 0; i < bodies.size(); ++i) {
    capture_body(node.bodies[i], [&] { bodies[i](*this); });
    if (std::string why = forbidden(node.bodies[i], "SWITCH"); !why.empty()) give_up_recording(std::move(why), true);
  }
}

}  // namespace cgt::cuda
