// The capture pipeline: one recording, from the input slots to the graph's first run, with every
// decision between the steps taken here, once for every backend. The backend's `Capture`
// (modules/cgt-spi.cppm) does the device work of each step and reports what happened; a step that
// fails returns its error, and destroying the capture discards whatever it made.
module;
#include <algorithm>
#include <cstdint>
#include <expected>
#include <span>
#include <string>
#include <utility>
#include <vector>

module cgt.core;
import :engine;

namespace cgt::detail {
namespace {

// A capture the function broke would break again at these shapes, whatever the function returned:
// that is the cause the engine acts on (it runs those shapes eagerly from then on).
Error broken_capture(const backend::CaptureOutcome& outcome) {
  std::string message = "capture failed: " + outcome.broken_because;
  if (!outcome.work) message += "; the function reported: " + outcome.work.error().message;
  return Error{.code = Errc::function_failed, .message = std::move(message), .cause = Cause::uncapturable};
}

// Captures the function. One that failed in an intact capture fails as it did: its error may be
// passing (out of memory, say), so the shape keeps its graphs.
Result<void> capture_function(backend::Capture& capture) {
  backend::CaptureOutcome outcome = capture.capture();
  if (outcome.broken) return std::unexpected(broken_capture(outcome));
  return std::move(outcome.work);
}

// A graph reads a copied input through its slot, so a write to it would go to the slot and never
// reach the caller's input: the recording is given up, and the engine runs the call eagerly, where
// the write reaches the input.
Result<void> refuse_write_to_copy(std::span<const std::uint32_t> written, const backend::RecordPlan& plan) {
  const auto to_copy = std::ranges::find_if(
      written, [&plan](std::uint32_t input) { return input < plan.copy_input.size() && plan.copy_input[input]; });
  if (to_copy == written.end()) return {};
  return fail(Cause::wrote_copied_input, Errc::function_failed,
              "input " + std::to_string(*to_copy) + " was written in place, but the graph reads it through a copy",
              static_cast<std::int32_t>(*to_copy));
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

}  // namespace

Result<backend::Recorded> record_graph(backend::Device& device, backend::Invoker& fn,
                                       std::span<const backend::ArgSlot> args, const backend::RecordPlan& plan) {
  auto begun = device.begin_recording(fn, args, plan);
  if (!begun) return std::unexpected(std::move(begun.error()));
  backend::Capture& capture = **begun;
  if (auto slots = capture.make_slots(); !slots) return std::unexpected(std::move(slots.error()));
  if (auto captured = capture_function(capture); !captured) return std::unexpected(std::move(captured.error()));
  const backend::WritesKnown writes_known = capture.writes_known();
  std::vector<std::uint32_t> written;
  if (writes_known == backend::WritesKnown::at_capture) {
    written = capture.written_inputs();
    if (auto refused = refuse_write_to_copy(written, plan); !refused) return std::unexpected(refused.error());
  }
  if (auto settled = capture.settle_outputs(); !settled) return std::unexpected(std::move(settled.error()));
  if (auto rewritten = rewrite_nodes(capture); !rewritten) return std::unexpected(std::move(rewritten.error()));
  if (auto placed = place_graph(capture, plan); !placed) return std::unexpected(std::move(placed.error()));
  if (auto ran = capture.run_first(); !ran) return std::unexpected(std::move(ran.error()));
  if (writes_known == backend::WritesKnown::after_first_run) {
    written = capture.written_inputs();
    if (auto refused = refuse_write_to_copy(written, plan); !refused) {
      capture.undo_writes();  // the run wrote the caller's inputs in place: as if nothing ran
      return std::unexpected(refused.error());
    }
  }
  auto recorded = capture.finish();
  if (!recorded) return recorded;
  // Writes to inputs read in place: the engine counts those inputs as mutated from now on.
  recorded->first_outputs.written_inputs = std::move(written);
  return recorded;
}

}  // namespace cgt::detail
