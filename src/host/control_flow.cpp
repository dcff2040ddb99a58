// Loops and branches decided by the kernels (Context::loop_while, if_then, switch_on): run now
// outside a recording, captured once into one kernel that decides at each replay within one (as a
// conditional node does on a GPU), or, in a recording whose loops and branches the host decides,
// cut into segments the replay runs as the deciders say (:host_decisions).
module;
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

module cgt.host;
import cgt.core;
import :internal;

namespace cgt::host {
namespace {

// The value a loop or branch is decided on: one i32 element, read when the kernels before it ran.
void check_decider(const Buffer& value, const char* what) {
  if (value.type() != ElementType::i32 || value.numel() != 1) {
    throw InvalidArgument(std::string("Context::") + what + ": the value it is decided on must be one i32 element");
  }
}

std::int64_t decider_of(const Buffer& value) {
  return static_cast<std::int64_t>(value.get(0));
}

using Kind = backend::HostDecisions::Kind;

// In a host-decided recording: the segment before the decision, each body's, and the next one
// begins after it.
void cut_around(HostSegments& segments, const Stream& stream, Kind kind, const Buffer& decider,
                std::uint64_t max_iterations, std::size_t bodies,
                const std::function<void(std::size_t)>& capture_body) {
  segments.cut(stream);
  segments.decisions.open(kind, decider.as<std::int32_t>(), max_iterations, bodies);
  for (std::size_t i = 0; i < bodies; ++i) {
    segments.decisions.body(i);
    capture_body(i);
    segments.cut(stream);
  }
  segments.decisions.close();
}

}  // namespace

void Context::loop_while(const Buffer& go_on, std::uint64_t max_iterations, const Body& body) {
  check_decider(go_on, "loop_while");
  if (max_iterations == 0) throw InvalidArgument("Context::loop_while: max_iterations must be at least 1");
  Stream& stream = device_.stream();
  if (!stream.is_capturing()) {
    // Run now. In a warm-up, an iteration's pool blocks die with it: the next one reuses them
    // (as the graph's iterations reuse the body's), and the last one's live to the call's end.
    const std::size_t kept = allocations_.size();
    for (std::uint64_t i = 0; i < max_iterations && decider_of(go_on) != 0; ++i) {
      if (i > 0) free_allocations_since(kept);
      body(*this);
    }
    return;
  }
  if (segments_ != nullptr) {
    cut_around(*segments_, stream, Kind::loop, go_on, max_iterations, 1, [&](std::size_t) { body(*this); });
    return;
  }
  auto iteration = std::make_shared<const Graph>(stream.capture_apart([&] { body(*this); }));
  stream.launch([iteration, go_on, max_iterations] {
    for (std::uint64_t i = 0; i < max_iterations && decider_of(go_on) != 0; ++i) iteration->replay();
  });
}

void Context::if_then(const Buffer& condition, const Body& body) {
  check_decider(condition, "if_then");
  Stream& stream = device_.stream();
  if (!stream.is_capturing()) {
    if (decider_of(condition) != 0) body(*this);
    return;
  }
  if (segments_ != nullptr) {
    cut_around(*segments_, stream, Kind::branch, condition, 0, 1, [&](std::size_t) { body(*this); });
    return;
  }
  auto taken = std::make_shared<const Graph>(stream.capture_apart([&] { body(*this); }));
  stream.launch([taken, condition] {
    if (decider_of(condition) != 0) taken->replay();
  });
}

void Context::switch_on(const Buffer& index, std::span<const Body> bodies) {
  check_decider(index, "switch_on");
  Stream& stream = device_.stream();
  if (!stream.is_capturing()) {
    const std::int64_t chosen = decider_of(index);
    if (chosen >= 0 && static_cast<std::size_t>(chosen) < bodies.size())
      bodies[static_cast<std::size_t>(chosen)](*this);
    return;
  }
  if (segments_ != nullptr) {
    cut_around(*segments_, stream, Kind::choice, index, 0, bodies.size(), [&](std::size_t i) { bodies[i](*this); });
    return;
  }
  auto cases = std::make_shared<std::vector<Graph>>();
  for (const Body& body : bodies) cases->push_back(stream.capture_apart([&] { body(*this); }));
  stream.launch([cases = std::shared_ptr<const std::vector<Graph>>(std::move(cases)), index] {
    const std::int64_t chosen = decider_of(index);
    if (chosen >= 0 && static_cast<std::size_t>(chosen) < cases->size())
      (*cases)[static_cast<std::size_t>(chosen)].replay();
  });
}

}  // namespace cgt::host
