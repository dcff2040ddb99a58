// The capture pipeline: one recording, from the input slots to the graph's first run, with every
// decision between the steps taken here, once for every backend. The backend's `Capture`
// (modules/cgt.core-spi.cppm) does the device work of each step and reports what happened; a step that
// fails returns its error, and destroying the capture discards whatever it made.
//
// Its rule: a failure before the graph's first run is an error, and nothing of the function's
// work ran (its body ran under capture, which runs nothing); from the first run on, the call's
// work is done, and the pipeline hands that run's outputs back even where the graph must not be
// kept (`Recorded::not_kept`), so that the engine never runs the function a second time.
module;
#include <algorithm>
#include <cstdint>
#include <expected>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

module cgt.core;
import :engine;

namespace cgt::detail {
namespace {

// An error of a kind the engine acts on (`cause`), about the function's recording.
Error recording_error(Cause cause, std::string message, std::int32_t input = -1) {
  return Error{.code = Errc::function_failed, .message = std::move(message), .cause = cause, .input = input};
}

// A capture the function broke would break again at these shapes, whatever the function returned:
// that is the cause the engine acts on (it runs those shapes eagerly from then on). One that only
// a loop or branch broke, as a conditional node, can be recorded with the host deciding them.
Error broken_capture(const backend::CaptureOutcome& outcome, const backend::RecordPlan& plan) {
  std::string message = "capture failed: " + outcome.broken_because;
  if (!outcome.work) message += "; the function reported: " + outcome.work.error().message;
  const bool host_may_decide = outcome.needs_host_decisions && plan.control_flow == backend::ControlFlow::on_device;
  return recording_error(host_may_decide ? Cause::conditional_unavailable : Cause::uncapturable, std::move(message));
}

// A call of another pool on this thread was refused while the function ran under capture: the
// graph lacks that call's work, whatever the function made of the refusal. Given up before it
// ran; the engine runs these shapes eagerly from then on, where the inner call works.
Error refused_inner_call() {
  return recording_error(Cause::nested_pool,
                         "it called a function of another pool while its own pool recorded it (that call failed "
                         "with nested_capture); one pool's graph cannot hold another pool's call: give both "
                         "functions one pool to graph them together");
}

// Captures the function, watched for calls of other pools. One that failed in an intact capture
// fails as it did: its error may be passing (out of memory, say), so the shape keeps its graphs.
Result<OtherPoolCalls> capture_function(backend::Capture& capture, const Engine& engine, const FunctionRecord& function,
                                        const backend::RecordPlan& plan) {
  WatchedCapture watched(engine, function);
  backend::CaptureOutcome outcome = capture.capture();
  const OtherPoolCalls others = watched.finish();
  if (others == OtherPoolCalls::refused_here) return std::unexpected(refused_inner_call());
  if (outcome.broken) return std::unexpected(broken_capture(outcome, plan));
  if (!outcome.work) return std::unexpected(std::move(outcome.work.error()));
  return others;
}

// The copied inputs among `written`: the graph reads them through slots, so their writes went to
// the slots, never to the caller's inputs.
std::vector<std::uint32_t> copied_among(std::span<const std::uint32_t> written, const backend::RecordPlan& plan) {
  std::vector<std::uint32_t> copied;
  std::ranges::copy_if(written, std::back_inserter(copied), [&plan](std::uint32_t input) {
    return input < plan.copy_input.size() && plan.copy_input[input];
  });
  return copied;
}

// Nodes that cost launch time become kernels before anything compares or instantiates the graph.
Result<void> rewrite_nodes(backend::Capture& capture) {
  auto rewrites = capture.rewrite_nodes();
  if (!rewrites) return std::unexpected(std::move(rewrites.error()));
  if (GraphCounts* counts = capture.counts(); counts != nullptr) {
    counts->memset_nodes_rewritten += rewrites->memsets_rewritten;
    counts->memset_nodes_kept += rewrites->memsets_kept;
    counts->memcpy_nodes_rewritten += rewrites->memcpys_rewritten;
    counts->memcpy_nodes_kept += rewrites->memcpys_kept;
  }
  return {};
}

// Where the graph runs. A re-recording because a static input moved usually has the topology of
// the recording it redoes: updating that one's executable in place costs less than instantiating
// another, and the two share it. Otherwise the graph gets an executable of its own.
Result<void> place_graph(backend::Capture& capture, const backend::RecordPlan& plan) {
  GraphCounts* counts = capture.counts();
  if (plan.replaces != nullptr && capture.allows_update_in_place()) {
    auto loaded = capture.load_into(*plan.replaces);
    if (!loaded) return std::unexpected(std::move(loaded.error()));
    if (*loaded) {
      if (counts != nullptr) ++counts->updated_in_place;
      return {};
    }
  }
  if (auto made = capture.instantiate(); !made) return made;
  if (counts != nullptr) ++counts->instantiated;
  return {};
}

// Why a graph that ran once must not be kept, if it must not: a copied input it wrote (whose
// write `write_back` carried to the caller's input), or a call of another pool on another thread
// that overlapped its capture (the graph may read what that call computed this once).
std::optional<Error> not_kept_because(std::span<const std::uint32_t> copied_written, OtherPoolCalls others) {
  if (!copied_written.empty()) {
    return recording_error(Cause::wrote_copied_input,
                           "input " + std::to_string(copied_written.front()) +
                               " was written in place, but the graph reads it through a copy",
                           static_cast<std::int32_t>(copied_written.front()));
  }
  if (others == OtherPoolCalls::overlapped) {
    return recording_error(Cause::nested_pool,
                           "a call of another pool on another thread overlapped its capture (it waited its "
                           "Options::wait_for_other_captures); the graph may read what that call computed once, "
                           "so it ran for this call and is not kept");
  }
  return std::nullopt;
}

}  // namespace

Result<backend::Recorded> record_graph(backend::Device& device, backend::Invoker& fn,
                                       std::span<const backend::ArgSlot> args, const backend::RecordPlan& plan,
                                       const Engine& engine, const FunctionRecord& function) {
  auto begun = device.begin_recording(fn, args, plan);
  if (!begun) return std::unexpected(std::move(begun.error()));
  backend::Capture& capture = **begun;
  if (auto slots = capture.make_slots(); !slots) return std::unexpected(std::move(slots.error()));
  auto others = capture_function(capture, engine, function, plan);
  if (!others) return std::unexpected(std::move(others.error()));
  const backend::WritesKnown writes_known = capture.writes_known();
  std::vector<std::uint32_t> written;
  if (writes_known == backend::WritesKnown::at_capture) written = capture.written_inputs();
  if (auto settled = capture.settle_outputs(); !settled) return std::unexpected(std::move(settled.error()));
  if (auto rewritten = rewrite_nodes(capture); !rewritten) return std::unexpected(std::move(rewritten.error()));
  if (auto placed = place_graph(capture, plan); !placed) return std::unexpected(std::move(placed.error()));
  // From here on the call's work has run: whatever follows hands this run's outputs back.
  if (auto ran = capture.run_first(); !ran) return std::unexpected(std::move(ran.error()));
  if (writes_known == backend::WritesKnown::after_first_run) written = capture.written_inputs();
  const std::vector<std::uint32_t> copied_written = copied_among(written, plan);
  if (!copied_written.empty()) {
    if (auto carried = capture.write_back(copied_written); !carried) return std::unexpected(carried.error());
  }
  auto recorded = capture.finish();
  if (!recorded) return recorded;
  // Writes to inputs: the engine counts those inputs as mutated from now on.
  recorded->first_outputs.written_inputs = std::move(written);
  recorded->not_kept = not_kept_because(copied_written, *others);
  return recorded;
}

}  // namespace cgt::detail
