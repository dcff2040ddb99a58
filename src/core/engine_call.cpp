// The per-call algorithm of a pool (PyTorch's CUDAGraphTreeManager._run): check the call, pick the
// function's shape variant, then end the path / fall back / warm up / replay / record.
module;
#include <expected>
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "capture_gate.hpp"
#include "generation_rule.hpp"

module cgt.core;
import :engine;

namespace cgt::detail {
namespace {

// Releases the pool for the next call however the call ends.
class BusyGuard {
 public:
  explicit BusyGuard(Engine& engine) noexcept : engine_(engine) {}
  BusyGuard(const BusyGuard&) = delete;
  BusyGuard& operator=(const BusyGuard&) = delete;
  ~BusyGuard() { engine_.caller().release(); }

 private:
  Engine& engine_;
};

// Keeps the engine alive through a call: the function may drop the last handles of its own pool
// while it runs. (An EngineRef would do it through two calls into pool.cpp on every replay.)
class CallKeepsEngine {
 public:
  explicit CallKeepsEngine(Engine& engine) noexcept : engine_(engine) { engine_.add_references(1); }
  CallKeepsEngine(const CallKeepsEngine&) = delete;
  CallKeepsEngine& operator=(const CallKeepsEngine&) = delete;
  ~CallKeepsEngine() { engine_.drop_references(1); }

 private:
  Engine& engine_;
};

// Ends the device's scope of a call (`Device::end_call`) however the call ends.
class DeviceCallScope {
 public:
  explicit DeviceCallScope(backend::Device* device) noexcept : device_(device) {}
  DeviceCallScope(const DeviceCallScope&) = delete;
  DeviceCallScope& operator=(const DeviceCallScope&) = delete;
  ~DeviceCallScope() {
    if (device_ != nullptr) device_->end_call();
  }

 private:
  backend::Device* device_;
};

// Reads every argument's description into `slots` and `descs`; an error names the input.
Result<void> describe_arguments(const ArgSource& source, const std::string& function, std::span<backend::ArgSlot> slots,
                                std::span<backend::ArgDesc> descs, std::vector<std::shared_ptr<const void>>& keep) {
  auto described = source.describe(slots, descs, keep);
  if (!described) [[unlikely]] {
    Error& error = described.error();
    error.message = "input " + std::to_string(error.input) + " of " + in_quotes(function) + ": " + error.message;
    error.function = function;
  }
  return described;
}

// Inlined into `Engine::run_call`, its only caller: every call runs it.
[[clang::always_inline]] inline Result<void> check_inputs_not_reclaimed(const CallFrame& frame,
                                                                        const backend::Device& device, const Path& path,
                                                                        bool stamps_values) {
  // Pool memory is handed out only through leases; an input in pool memory that no live lease
  // holds is an escaped copy of a value whose memory was reclaimed (its lease dropped, or a new
  // generation began): reading it would read whatever the pool put there since.
  for (std::size_t i = 0; i < frame.descs.size(); ++i) {
    const backend::ArgDesc& desc = frame.descs[i];
    // `owns` first: most inputs that are not pool memory are the caller's, and it is the cheap test.
    if (desc.kind != backend::ArgKind::value || !device.owns(desc.storage)) continue;
    // Live memory is not enough: it may live again for another output since this value escaped
    // (where the backend stamps values, their life number must be the memory's current one).
    if (const Cell* cell = path.live_cell(desc.storage)) {
      if (!stamps_values || desc.life == cell->life()) continue;
    }
    if (path.is_output_of_ended(desc.storage)) {
      return fail(Errc::output_overwritten,
                  "input " + std::to_string(i) + " of " + in_quotes(frame.function->name) +
                      " is an output of the last step, whose memory the new step this call begins reclaims; the "
                      "call is refused and the lease stays valid: take() the value before the step begins, or set "
                      "Options::copy_out_on_new_step",
                  frame.function->name, -1, static_cast<std::int32_t>(i));
    }
    return fail(Errc::output_overwritten,
                "input " + std::to_string(i) + " of " + in_quotes(frame.function->name) +
                    " views pool memory that no live lease holds: it is a copy of an output whose lease was dropped "
                    "or whose step ended, and the pool may have reused the memory; keep the lease while you use "
                    "the value, or take() it",
                frame.function->name, -1, static_cast<std::int32_t>(i));
  }
  return {};
}

}  // namespace

Result<CallOutputs> call(Engine& engine, std::uint32_t function, const ArgSource& args) {
  if (const FunctionRecord* outer = RecordingScope::other_recording(engine)) {
    const std::string name = function_name(engine, function);
    return fail(Errc::nested_capture,
                "call of " + in_quotes(name) + " while another pool records " + in_quotes(outer->name) +
                    " on this thread; one pool's graph cannot hold another pool's call, so '" + outer->name +
                    "' runs eagerly instead, where this call works (or give both functions one pool)",
                name);
  }
  // Another pool recording on another thread: wait for it (see capture_gate.hpp).
  if (!CaptureGate::process_is_open()) [[unlikely]] {
    CaptureGate::process().pass(&engine, engine.options().wait_for_other_captures);
  }
  if (!engine.caller().try_take()) {
    const std::string name = function_name(engine, function);
    return fail(Errc::concurrent_use,
                "call of " + in_quotes(name) +
                    " while another call of the same pool is in flight (another thread, or a call from inside a "
                    "pool function); a pool is used by one thread at a time: use one pool per thread",
                name);
  }
  // The function may drop the last handles of its own pool while it runs: the call keeps the
  // engine alive until it is done (declared first, released last).
  const CallKeepsEngine keep(engine);
  const BusyGuard guard(engine);
  const StateLock lock(engine);
  return engine.call(function, args);
}

// The call as a script (PyTorch's CUDAGraphTreeManager._run): the generation it runs in, the path
// ended first where a new generation or dead outputs end it, then its arguments read and checked
// and the call run; at the end the ended path's memory is released, or on failure the path is put
// back and the generation taken back.
Result<CallOutputs> Engine::call_locked(FunctionRecord& function, const ArgSource& source) {
  if (shut_down_) {
    return fail(Errc::pool_shut_down,
                "call of " + in_quotes(function.name) + " after the pool was shut down; make a new pool",
                function.name);
  }
  if (asleep_) [[unlikely]] {
    // The pool slept (`Pool::sleep`): its memory comes back at the same addresses before any work.
    if (auto woken = wake(); !woken) {
      Error error = std::move(woken.error());
      error.message = "call of " + in_quotes(function.name) + ": " + error.message;
      error.function = function.name;
      return std::unexpected(std::move(error));
    }
  }
  if (scopes_calls_) {
    if (auto begun = device_->begin_call(); !begun) {
      Error error = std::move(begun.error());
      error.message = "call of " + in_quotes(function.name) + ": " + error.message;
      error.function = function.name;
      return std::unexpected(std::move(error));
    }
  }
  const DeviceCallScope scope(scopes_calls_ ? device_.get() : nullptr);
  ++stats_.calls;
  const CallGeneration generation = begin_generation(function);
  const std::uint64_t reclaims_before = path_.reclaims();
  // End the path first: a new generation reclaims (or copies out) the memory of leases the caller
  // may be passing in, and the arguments must be read after that. Its memory is released only
  // once the call's work may reuse it.
  memory_.end_path_if_over(generation.generation, PathCheck::call_start);
  SmallArray<backend::ArgSlot, 8> slots(source.size());
  SmallArray<backend::ArgDesc, 8> descs(source.size());
  std::vector<std::shared_ptr<const void>> keep;  // what keeps arguments alive (ArgSource::describe)
  Result<CallOutputs> out = run_call(function, source, slots.span(), descs.span(), keep, generation.generation);
  if (!out) {
    abandon_call(generation, reclaims_before);
    return out;
  }
  memory_.release_ended();
  if (options_.debug_checks && out->kind != CallKind::eager) {
    if (auto checked = memory_.debug_check("after the call"); !checked) {
      return std::unexpected(in_call(std::move(checked.error()), function, "checking the pool"));
    }
  }
  generation_rule_.end_call(role_of(function));
  return out;
}

[[clang::always_inline]] CallGeneration Engine::begin_generation(FunctionRecord& function) {
  const CallGeneration call = generation_rule_.begin_call(role_of(function), path_.node() != nullptr);
  if (call.begun_by_forward || call.held_by_pending_backward) [[unlikely]]
    note_generation(call, function, stats_, path_, functions_, events_);
  return call;
}

// Inlined into `call_locked`, its only caller: a call of its own costs a replay about 40 instructions.
[[clang::always_inline]] inline Result<CallOutputs> Engine::run_call(FunctionRecord& function, const ArgSource& source,
                                                                     std::span<backend::ArgSlot> slots,
                                                                     std::span<backend::ArgDesc> descs,
                                                                     std::vector<std::shared_ptr<const void>>& keep,
                                                                     std::uint64_t generation) {
  if (auto described = describe_arguments(source, function.name, slots, descs, keep); !described) {
    return std::unexpected(std::move(described.error()));
  }
  // The shapes of the last call: the signature is checked already (see `opening_word`).
  const bool same_shapes = functions_.same_shapes_as_last(function, descs);
  if (!same_shapes) {
    if (auto checked = functions_.check_signature(function, descs, *device_); !checked) {
      return std::unexpected(std::move(checked.error()));
    }
  }
  CallFrame frame{.args = slots,
                  .descs = descs,
                  .function = &function,
                  .variant = nullptr,
                  .generation = generation,
                  .same_shapes_as_last = same_shapes};
  if (auto checked = check_inputs_not_reclaimed(frame, *device_, path_, stamps_values_); !checked)
    return std::unexpected(std::move(checked.error()));
  if (!function.options.buckets.sizes.empty()) return run_bucketed(frame);
  return run_decided(frame);
}

// Not `inline`: run_bucketed (engine_buckets.cpp) calls it too; here it is inlined.
[[clang::always_inline]] Result<CallOutputs> Engine::run_decided(CallFrame& frame) {
  // The last variant's key: its signature, devices and graph size are known good (`opening_word`).
  frame.variant = frame.same_shapes_as_last ? &functions_.last_variant(*frame.function) : select_variant(frame);
  if (const std::optional<Reason> reason = eager_reason(frame)) return run_eager(frame, *reason);
  Result<CallOutputs> result = run_tree(frame);
  if (frame.given_back) [[unlikely]]
    result = decide_again(frame);
  return result;
}

[[clang::always_inline]] std::optional<Reason> Engine::eager_reason(CallFrame& frame) {
  if (frame.unfit) [[unlikely]]
    return frame.unfit;
  const Variant& variant = *frame.variant;
  // Checked on every call, from this call's inputs: whether an input is pool memory depends on
  // the call, and a graph that copied a mutated input into a slot would lose the mutation.
  if (frame.function->mutates_an_input && mutates_unmanaged_input(frame, path_, events_)) {
    return Reason::mutated_input;
  }
  if (variant.capture_failure) [[unlikely]]
    return variant.capture_failure_reason;
  if (variant.rerecorded && path_.children(tree_.roots()).facts(variant.id).rerecords > options_.rerecord_limit) {
    return Reason::rerecord_limit;
  }
  return std::nullopt;
}

void Engine::abandon_call(const CallGeneration& generation, std::uint64_t reclaims_before) noexcept {
  // A call that failed before its work (its arguments, its padding, its function) leaves the last
  // generation's outputs as they were, and a generation its forward began is not begun. A call
  // that failed after the new generation reclaimed them cannot undo that.
  memory_.put_back_ended();
  if (path_.reclaims() == reclaims_before && generation_rule_.take_back(generation)) --stats_.steps_begun_by_forward;
}

Result<CallOutputs> Engine::decide_again(CallFrame& frame) {
  frame.given_back = false;
  if (const std::optional<Reason> reason = eager_reason(frame)) return run_eager(frame, *reason);
  Result<CallOutputs> result = run_tree(frame);
  if (frame.given_back) [[unlikely]] {
    return fail(Errc::invariant_violation,
                "'" + frame.function->name + "' was given back undone twice by the tree; this is a bug in cgt",
                frame.function->name);
  }
  return result;
}

Variant* Engine::select_variant(CallFrame& frame) {
  if (frame.unfit) return nullptr;  // `eager_reason` runs it eagerly
  FunctionRecord& function = *frame.function;
  const Selection selection = functions_.select(function, frame.descs, device_index_, options_);
  frame.unfit = selection.unfit;
  if (selection.passed_warn_limit) {
    events_.count_and_say(
        EventKind::warning, Reason::many_shape_keys, function,
        in_quotes(function.name) + " has been called with " + std::to_string(function.variants.size()) +
            " distinct shape keys, each warmed up and recorded separately; a key is the inputs' sizes and "
            "strides and the value of every integer scalar argument: pad inputs to a few sizes (graph_sizes), "
            "and pass values that change every call (positions, lengths) as tensors, not integer scalars");
  }
  return selection.variant;
}

}  // namespace cgt::detail
