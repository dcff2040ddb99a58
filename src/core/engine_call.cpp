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
  ~BusyGuard() { engine_.clear_busy(); }

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

std::string in_quotes(const std::string& name) {
  return "'" + name + "'";
}

// A dimension's stride as the key sees it: that of a dimension of size 1 is never stepped along
// (its index is always 0), so it is 0 whatever the tensor says. Without this, a column of one
// element ([1], stride 8) and a fresh scalar tensor ([1], stride 1) recorded a graph each.
std::int64_t key_stride(const backend::ArgDesc& desc, std::size_t d) noexcept {
  return desc.sizes[d] == 1 ? 0 : desc.strides[d];
}

// The key of a call's input shapes: sizes, strides, broadcast dimensions and view bits of every
// value, and every scalar (a scalar is baked into a graph, like PyTorch's int inputs). Strides and
// view bits belong to it: a graph reads a static or pool-managed input in place, with the layout
// it was recorded with, so a matrix and its transpose (or its lazy conjugate) at one address need
// graphs of their own.
std::int64_t key_layout_bits(const backend::ArgDesc& desc) noexcept {
  return static_cast<std::int64_t>(desc.expanded) | (static_cast<std::int64_t>(desc.view) << 32);
}

// A key word that opens each argument: its kind, and for a value its device, element type and
// rank. With it a key says the whole signature, so a call whose key is a known variant's needs no
// signature check (the variant's first call passed it), and no device check (a variant is made
// only for calls whose values are all on the pool's device).
constexpr std::int64_t kScalarTag = std::int64_t{1} << 62;
constexpr std::int64_t kValueTag = std::int64_t{1} << 61;
std::int64_t opening_word(const backend::ArgDesc& desc) noexcept {
  if (desc.kind == backend::ArgKind::scalar) return kScalarTag;
  const auto device = static_cast<std::int64_t>(static_cast<std::uint32_t>(desc.device));  // -1: host memory
  return kValueTag | (device << 24) | (static_cast<std::int64_t>(desc.dtype) << 8) | desc.rank;
}

void append_key(std::span<const backend::ArgDesc> descs, std::vector<std::int64_t>& key) {
  for (const auto& desc : descs) {
    key.push_back(opening_word(desc));
    if (desc.kind == backend::ArgKind::scalar) {
      key.push_back(desc.scalar);
      continue;
    }
    key.insert(key.end(), desc.sizes, desc.sizes + desc.rank);
    for (std::size_t d = 0; d < desc.rank; ++d) key.push_back(key_stride(desc, d));
    key.push_back(key_layout_bits(desc));
  }
}

// The same comparison without building a key: the fast path of a call with the last shapes. A key
// word that equals the argument's opening word says how many words follow it in the key (one for
// a scalar, 2 * rank + 1 for a value): only the opening words need a bound check.
bool key_matches(const std::vector<std::int64_t>& key, std::span<const backend::ArgDesc> descs) noexcept {
  std::size_t at = 0;
  for (const auto& desc : descs) {
    if (at >= key.size() || key[at] != opening_word(desc)) return false;
    ++at;
    if (desc.kind == backend::ArgKind::scalar) {
      if (key[at] != desc.scalar) return false;
      ++at;
      continue;
    }
    const std::size_t rank = desc.rank;
    for (std::size_t d = 0; d < rank; ++d) {  // ranks are small: a loop beats memcmp here
      if (key[at + d] != desc.sizes[d] || key[at + rank + d] != key_stride(desc, d)) return false;
    }
    at += 2 * rank;
    if (key[at] != key_layout_bits(desc)) return false;
    ++at;
  }
  return at == key.size();
}

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
  if (!engine.try_set_busy()) {
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
  end_path_if_over(generation.generation, PathCheck::call_start);
  SmallArray<backend::ArgSlot, 8> slots(source.size());
  SmallArray<backend::ArgDesc, 8> descs(source.size());
  std::vector<std::shared_ptr<const void>> keep;  // what keeps arguments alive (ArgSource::describe)
  Result<CallOutputs> out = run_call(function, source, slots.span(), descs.span(), keep, generation.generation);
  if (!out) {
    abandon_call(generation, reclaims_before);
    return out;
  }
  release_ended_path();
  if (options_.debug_checks && out->kind != CallKind::eager) {
    if (auto checked = debug_check("after the call"); !checked) {
      return std::unexpected(in_call(std::move(checked.error()), function, "checking the pool"));
    }
  }
  generation_rule_.end_call(role_of(function));
  return out;
}

// Inlined into `run_call`, its only caller: every call runs it.
[[clang::always_inline]] inline Result<void> Engine::check_inputs_not_reclaimed(const CallFrame& frame) const {
  // Pool memory is handed out only through leases; an input in pool memory that no live lease
  // holds is an escaped copy of a value whose memory was reclaimed (its lease dropped, or a new
  // generation began): reading it would read whatever the pool put there since.
  for (std::size_t i = 0; i < frame.descs.size(); ++i) {
    const backend::ArgDesc& desc = frame.descs[i];
    // `owns` first: most inputs that are not pool memory are the caller's, and it is the cheap test.
    if (desc.kind != backend::ArgKind::value || !device_->owns(desc.storage)) continue;
    // Live memory is not enough: it may live again for another output since this value escaped
    // (where the backend stamps values, their life number must be the memory's current one).
    if (const Cell* cell = path_.live_cell(desc.storage)) {
      if (!stamps_values_ || desc.life == cell->life()) continue;
    }
    if (path_.is_output_of_ended(desc.storage)) {
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
  const bool same_shapes =
      function.last_variant != UINT32_MAX && key_matches(variants_[function.last_variant]->key, descs);
  if (!same_shapes) {
    if (auto checked = check_signature(function, descs); !checked) return std::unexpected(std::move(checked.error()));
  }
  CallFrame frame{.args = slots,
                  .descs = descs,
                  .function = &function,
                  .variant = nullptr,
                  .generation = generation,
                  .same_shapes_as_last = same_shapes};
  if (auto checked = check_inputs_not_reclaimed(frame); !checked) return std::unexpected(std::move(checked.error()));
  if (!function.options.buckets.sizes.empty()) return run_bucketed(frame);
  return run_selected(frame);
}

void Engine::abandon_call(const CallGeneration& generation, std::uint64_t reclaims_before) noexcept {
  // A call that failed before its work (its arguments, its padding, its function) leaves the last
  // generation's outputs as they were, and a generation its forward began is not begun. A call
  // that failed after the new generation reclaimed them cannot undo that.
  restore_ended_path();
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

Result<void> Engine::check_signature(FunctionRecord& function, std::span<const backend::ArgDesc> descs) const {
  if (!function.signature) {
    // The first call fixes the signature, and lets us check the options' input indices.
    for (const std::size_t index : function.options.static_inputs) {
      if (index >= descs.size()) {
        return fail(Errc::invalid_argument,
                    "static input " + std::to_string(index) + " of " + in_quotes(function.name) +
                        " is out of range: the call has " + std::to_string(descs.size()) + " inputs",
                    function.name);
      }
    }
    for (const std::size_t index : function.options.mutated_inputs) {
      if (index >= descs.size()) {
        return fail(Errc::invalid_argument,
                    "mutated input " + std::to_string(index) + " of " + in_quotes(function.name) +
                        " is out of range: the call has " + std::to_string(descs.size()) + " inputs",
                    function.name);
      }
    }
    const bool has_buckets = !function.options.buckets.sizes.empty();
    if (!function.options.graph_sizes.empty() || has_buckets) {
      const SizeSource source = function.options.size_source;
      if (source.input >= descs.size() || descs[source.input].kind != backend::ArgKind::value ||
          source.dim >= descs[source.input].rank) {
        return fail(Errc::invalid_argument,
                    std::string(has_buckets ? "buckets" : "graph_sizes") + " of " + in_quotes(function.name) +
                        " read dimension " + std::to_string(source.dim) + " of input " + std::to_string(source.input) +
                        ", which the call does not have",
                    function.name);
      }
    }
    const auto out_of_range = [&](const char* field, std::size_t index) {
      return fail(Errc::invalid_argument,
                  std::string("buckets.") + field + " names input " + std::to_string(index) + " of " +
                      in_quotes(function.name) + ", which is out of range: the call has " +
                      std::to_string(descs.size()) + " inputs",
                  function.name);
    };
    for (const auto& [index, pad] : function.options.buckets.per_input) {
      if (index >= descs.size()) return out_of_range("per_input", index);
    }
    for (const std::size_t index : function.options.buckets.unpadded_inputs) {
      if (index >= descs.size()) return out_of_range("unpadded_inputs", index);
    }
    Signature signature;
    for (const auto& desc : descs) {
      signature.kinds.push_back(desc.kind);
      signature.dtypes.push_back(desc.dtype);
      signature.ranks.push_back(desc.rank);
    }
    function.is_static.assign(descs.size(), false);
    function.is_mutated.assign(descs.size(), false);
    for (const std::size_t index : function.options.static_inputs) function.is_static[index] = true;
    for (const std::size_t index : function.options.mutated_inputs) function.is_mutated[index] = true;
    function.mutates_an_input = !function.options.mutated_inputs.empty();
    function.signature = std::move(signature);
    return {};
  }
  const Signature& signature = *function.signature;
  if (descs.size() != signature.kinds.size()) {
    return fail(Errc::wrong_input_count,
                in_quotes(function.name) + " takes " + std::to_string(signature.kinds.size()) +
                    " inputs (as in its first call), not " + std::to_string(descs.size()),
                function.name);
  }
  for (std::size_t i = 0; i < descs.size(); ++i) {
    const auto input = static_cast<std::int32_t>(i);
    if (descs[i].kind != signature.kinds[i]) {
      const bool was_scalar = signature.kinds[i] == backend::ArgKind::scalar;
      return fail(Errc::wrong_input_type,
                  "input " + std::to_string(i) + " of " + in_quotes(function.name) + " must be a " +
                      (was_scalar ? "scalar" : "value") + ", as in its first call",
                  function.name, -1, input);
    }
    if (descs[i].kind == backend::ArgKind::scalar) continue;
    if (descs[i].dtype != signature.dtypes[i]) {
      return fail(Errc::wrong_input_type,
                  "input " + std::to_string(i) + " of " + in_quotes(function.name) + " has element type " +
                      device_->type_name(descs[i].dtype) + ", but its first call had " +
                      device_->type_name(signature.dtypes[i]),
                  function.name, -1, input);
    }
    if (descs[i].rank != signature.ranks[i]) {
      return fail(Errc::wrong_shape,
                  "input " + std::to_string(i) + " of " + in_quotes(function.name) + " has " +
                      std::to_string(descs[i].rank) + " dimensions, but its first call had " +
                      std::to_string(signature.ranks[i]) + "; sizes may change between calls, ranks may not",
                  function.name, -1, input);
    }
  }
  return {};
}

Variant* Engine::select_variant(CallFrame& frame) {
  FunctionRecord& function = *frame.function;
  for (const auto& desc : frame.descs) {
    if (desc.kind == backend::ArgKind::value && desc.device != device_index_) {
      frame.unfit = Reason::input_on_other_device;
      return nullptr;
    }
  }
  if (!function.options.graph_sizes.empty()) {
    const SizeSource source = function.options.size_source;
    const std::int64_t size = frame.descs[source.input].sizes[source.dim];
    if (std::ranges::find(function.options.graph_sizes, size) == function.options.graph_sizes.end()) {
      frame.unfit = Reason::size_not_graphed;
      return nullptr;
    }
  }
  std::vector<std::int64_t> key;
  append_key(frame.descs, key);
  if (auto found = function.variants.find(key); found != function.variants.end()) {
    function.last_variant = found->second;
    return variants_[found->second].get();
  }
  if (options_.shape_key_limit != 0 && function.variants.size() >= options_.shape_key_limit) {
    frame.unfit = Reason::shape_key_limit;
    return nullptr;
  }
  auto variant = std::make_unique<Variant>();
  variant->id = static_cast<std::uint32_t>(variants_.size());
  variant->function = function.id;
  variant->key = key;
  function.variants.emplace(std::move(key), variant->id);
  function.last_variant = variant->id;
  variants_.push_back(std::move(variant));
  if (options_.shape_key_warn_limit != 0 && function.variants.size() > options_.shape_key_warn_limit &&
      !function.warned_many_keys) {
    function.warned_many_keys = true;
    ++stats_.by_reason[static_cast<std::size_t>(Reason::many_shape_keys)];
    log(EventKind::warning, Reason::many_shape_keys, function,
        in_quotes(function.name) + " has been called with " + std::to_string(function.variants.size()) +
            " distinct shape keys, each warmed up and recorded separately; a key is the inputs' sizes and "
            "strides and the value of every integer scalar argument: pad inputs to a few sizes (graph_sizes), "
            "and pass values that change every call (positions, lengths) as tensors, not integer scalars");
  }
  return variants_.back().get();
}

bool Engine::needs_warmup(const FunctionRecord& function, const Variant& variant) const noexcept {
  // A warm-up allocates at addresses the caching state of that moment decides, so a recording
  // cannot follow it on the same path: once warming up, the path warms up until it ends.
  const bool shape_needs_it =
      !variant.warmed_up && !options_.skip_warmup &&
      (function.options.warm_up_each_shape || !function.warmed_up_once || variant.needs_own_warmup);
  return shape_needs_it || path_.state() == PathState::warmup || options_.force_warmup;
}

bool Engine::mutates_unmanaged_input(CallFrame& frame) {
  FunctionRecord& function = *frame.function;
  bool mutates = false;
  for (std::size_t i = 0; i < frame.descs.size() && !mutates; ++i) {
    mutates = function.is_mutated[i] && frame.descs[i].kind == backend::ArgKind::value &&
              !is_usable_in_place(function, i, frame.descs[i]) && !path_.is_output(frame.descs[i].storage);
  }
  if (mutates && !function.warned_mutation) {
    // Decided per call, and warned once per function, as the reference does.
    function.warned_mutation = true;
    log(EventKind::eager_fallback, Reason::mutated_input, function,
        "skipping graphs for " + in_quotes(function.name) +
            ": it mutates an input that is neither static nor an output of an earlier graph of this pool; "
            "declare the input static, or pass a pool output");
  }
  return mutates;
}

Result<void> Engine::fail_static_input_moved(const CallFrame& frame, const Match& match) const {
  // Every input that moved, so that one fix is enough.
  const TreeNode& child = *match.static_moved_child;
  std::string moved;
  for (const std::uint32_t input : child.static_inputs()) {
    if (frame.descs[input].data == child.recorded_data()[input]) continue;
    moved += (moved.empty() ? "" : ", ") + std::to_string(input);
  }
  return fail(Errc::static_input_moved,
              "static input(s) " + moved + " of " + in_quotes(frame.function->name) +
                  " are not at the addresses its graph was recorded with; keep static inputs in place, or set "
                  "on_static_input_moved = rerecord",
              frame.function->name, child.id(), match.moved_static_input);
}

Result<CallOutputs> Engine::run_tree(CallFrame& frame) {
  // The steady loop of a program: the path replayed ends in a node without a child of this
  // function, which is a root. PyTorch tries the roots once no child fits (below); with no child
  // to try, and nothing that would keep the path (a warm-up goes on down it, a rerecord count is
  // per node), that is decided first, and the checks below run once, at the roots.
  if (path_.state() == PathState::execution && path_.node() != nullptr && !frame.variant->rerecorded &&
      !path_.node()->children().has(frame.variant->id) && tree_.roots().has(frame.variant->id) &&
      !needs_warmup(*frame.function, *frame.variant)) {
    end_path_if_over(frame.generation, PathCheck::no_child_fits);
  }

  if (needs_warmup(*frame.function, *frame.variant)) {
    if (path_.state() == PathState::execution) {
      if (auto restored = restore_checkpoint(); !restored) {
        return std::unexpected(in_call(std::move(restored.error()), *frame.function, "restoring a checkpoint"));
      }
    }
    return warm_up(frame);
  }

  NodeReason reason = NodeReason::first_call;
  if (path_.state() != PathState::recording) {
    const Match match = find_replayable_child(frame);
    if (match.replayable != nullptr) return replay(*match.replayable, frame);
    if (match.static_moved_child != nullptr && options_.on_static_input_moved == OnStaticInputMoved::error) {
      return std::unexpected(fail_static_input_moved(frame, match).error());
    }

    // No child fits. If the function is also a root, the path may be over: try from the roots.
    if (path_.node() != nullptr && tree_.roots().has(frame.variant->id)) {
      end_path_if_over(frame.generation, PathCheck::no_child_fits);
      if (path_.node() == nullptr) return run_tree(frame);
    }
    if (match.moved_managed_input >= 0) {
      ChildFacts& facts = facts_for(frame.variant->id);
      ++facts.rerecords;
      frame.variant->rerecorded = true;
      if (facts.rerecords > options_.rerecord_limit) {
        // Said once, here, where the input that keeps moving is known; `eager_reason` decides.
        log(EventKind::eager_fallback, Reason::rerecord_limit, *frame.function,
            "skipping graphs for " + in_quotes(frame.function->name) + ": re-recorded more than " +
                std::to_string(options_.rerecord_limit) + " times under one node because input " +
                std::to_string(match.moved_managed_input) + " (an output of an earlier graph) keeps moving");
        return give_back(frame);
      }
    }
    ++stats_.failed_matches;
    if (match.static_moved_child != nullptr) {
      reason = NodeReason::static_input_moved;
      frame.rerecording_of = match.static_moved_child;
    } else if (match.moved_managed_input >= 0) {
      reason = NodeReason::managed_input_moved;
    } else if (match.liveness_differs) {
      reason = NodeReason::new_liveness_pattern;
    }

    end_path_if_over(frame.generation, PathCheck::no_child_fits);
    if (path_.node() != nullptr) {
      if (auto restored = restore_checkpoint(); !restored) {
        return std::unexpected(in_call(std::move(restored.error()), *frame.function, "restoring a checkpoint"));
      }
    }
  }
  return record(frame, reason);
}

}  // namespace cgt::detail
