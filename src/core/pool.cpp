// Making engines and pools, registering functions, shutting down, and the names of enums.
module;
#include <expected>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "generation_rule.hpp"

module cgt.core;
import :engine;

namespace cgt::detail {

Engine::Engine(std::unique_ptr<backend::Device> device, Options options)
    : device_(std::move(device)),
      options_(std::move(options)),
      device_index_(device_->device_index()),
      stamps_values_(device_->stamps_values()),
      scopes_calls_(device_->scopes_calls()),
      ledger_(memory_, stamps_values_ ? device_.get() : nullptr, device_->releases_unowned_storage()) {}

Engine::~Engine() {
  // No handle is left, so no thread holds the state; drops deferred to a holder that is gone are
  // applied now. Nodes hold recordings and cells that use the device: drop them before it goes.
  ledger_.apply_deferred_locked();
  path_.end();
  tree_.clear();
}

void retain(Engine& engine, std::uint32_t count) noexcept {
  engine.add_references(count);
}

void release(Engine& engine, std::uint32_t count) noexcept {
  engine.drop_references(count);
}

Result<EngineRef> make_engine(std::unique_ptr<backend::Device> device, Options options) {
  if (options.skip_warmup && options.force_warmup) {
    return fail(Errc::invalid_argument,
                "Options::skip_warmup and Options::force_warmup contradict each other (record on the first call, "
                "and never record): set one of them");
  }
  return EngineRef(new Engine(std::move(device), std::move(options)));  // NOLINT(cppcoreguidelines-owning-memory)
}

namespace {

// Buckets are checked when the function is added: a list that cannot be meant (unsorted,
// repeated, not positive) or a backend that cannot pad would otherwise surface on some later call.
Result<void> check_buckets(const backend::Device& device, const FunctionOptions& options, const std::string& name) {
  const std::vector<std::int64_t>& sizes = options.buckets.sizes;
  if (sizes.empty()) return {};
  const auto bad = [&](const std::string& why) {
    return fail(Errc::invalid_argument, "buckets of '" + name + "': " + why, name);
  };
  if (!options.graph_sizes.empty()) {
    return bad("graph_sizes is set too; choose one: graph_sizes runs other sizes eagerly, buckets pads them");
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] < 1) return bad("size " + std::to_string(sizes[i]) + " is not positive");
    if (i > 0 && sizes[i] <= sizes[i - 1]) {
      return bad("sizes must be strictly increasing (sorted, without repeats), but " + std::to_string(sizes[i]) +
                 " follows " + std::to_string(sizes[i - 1]));
    }
  }
  // The size source is padded like every batch input: one that never is would reach the function
  // at the call's size beside inputs padded to the bucket's.
  const std::size_t source = options.size_source.input;
  if (std::ranges::find(options.static_inputs, source) != options.static_inputs.end()) {
    return bad("size_source names input " + std::to_string(source) +
               ", which is static: static inputs are never padded; read the size from a batch input");
  }
  if (std::ranges::find(options.buckets.unpadded_inputs, source) != options.buckets.unpadded_inputs.end()) {
    return bad("size_source names input " + std::to_string(source) +
               ", which unpadded_inputs lists: the input that gives the call's size is the one padded to the bucket");
  }
  // A repeated (output, dimension) pair would slice that dimension twice, and an output both
  // sliced and handed out whole cannot be both: found here, not after a padded call's work.
  const std::vector<std::pair<std::size_t, std::size_t>>& dims = options.buckets.output_dims;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (dims[j] == dims[i]) {
        return bad("output_dims names output " + std::to_string(dims[i].first) + " and dimension " +
                   std::to_string(dims[i].second) + " twice; name each batch dimension of an output once");
      }
    }
    if (std::ranges::find(options.buckets.whole_outputs, dims[i].first) != options.buckets.whole_outputs.end()) {
      return bad("output_dims and whole_outputs both name output " + std::to_string(dims[i].first) +
                 ": an output is sliced on its batch dimensions or handed out whole");
    }
  }
  const std::vector<std::size_t>& whole = options.buckets.whole_outputs;
  for (std::size_t i = 0; i < whole.size(); ++i) {
    if (std::ranges::find(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(i), whole[i]) !=
        whole.begin() + static_cast<std::ptrdiff_t>(i)) {
      return bad("whole_outputs names output " + std::to_string(whole[i]) + " twice");
    }
  }
  if (const std::string why = device.why_no_buckets(); !why.empty()) return bad(why);
  return {};
}

}  // namespace

Result<std::uint32_t> Engine::add_function(std::unique_ptr<backend::Invoker> invoker, FunctionOptions options) {
  if (caller_.is_taken()) return fail(Errc::concurrent_use, "add_function while a call of the same pool is in flight");
  const StateLock lock(*this);
  if (shut_down_) return fail(Errc::pool_shut_down, "add_function after the pool was shut down; make a new pool");
  std::string name = options.name.empty() ? "function" + std::to_string(functions_.size()) : options.name;
  if (auto checked = check_buckets(*device_, options, name); !checked)
    return std::unexpected(std::move(checked.error()));
  return functions_.add(std::move(name), std::move(invoker), std::move(options));
}

Result<std::uint32_t> add_function(Engine& engine, std::unique_ptr<backend::Invoker> invoker, FunctionOptions options) {
  return engine.add_function(std::move(invoker), std::move(options));
}

const std::string& function_name(Engine& engine, std::uint32_t function) noexcept {
  return engine.functions().name(function);
}

backend::Device& device(Engine& engine) noexcept {
  return engine.device();
}

std::vector<std::unique_ptr<backend::Invoker>> Engine::shutdown() {
  if (shut_down_) return {};
  if (path_.node() != nullptr) memory_.reclaim_path();
  path_.end();
  tree_.clear();
  shut_down_ = true;
  memory_.shut_down();
  device_->shutdown();
  // The callables go too: one that holds a Function (or lease) of this pool would keep the engine
  // alive for good. They are destroyed by the caller once the state is let go, since their
  // destructors may drop handles of this pool.
  return functions_.take_invokers();
}

}  // namespace cgt::detail

namespace cgt {

// Every method of a pool handle works on a moved-from handle too: it reads as an empty pool, and
// what would change one fails with `invalid_argument`.

void PoolBase::mark_step_begin() noexcept {
  // Atomic: any thread, and a pool function, may begin a step; the next call sees it. From now
  // on the program says when steps begin: forwards no longer begin them (`FunctionMode::forward`).
  if (!engine_) return;
  (*engine_).mark_step_begin();
}

bool PoolBase::has_pending_backward() const noexcept {
  return detail::read_engine(engine_, false,
                             [](const detail::Engine& engine) { return engine.generation_rule().pending_backward(); });
}

Result<void> PoolBase::shutdown() {
  if (!engine_) return fail(Errc::invalid_argument, "shutdown() of a moved-from pool handle");
  detail::Engine& engine = *engine_;
  if (!engine.caller().try_take()) {
    return fail(Errc::concurrent_use, "shutdown() while a call of the same pool is in flight");
  }
  const detail::EngineRef keep = engine_;  // the callables released below may hold the pool's last handles
  std::vector<std::unique_ptr<backend::Invoker>> callables;
  {
    const detail::StateLock lock(engine);
    callables = engine.shutdown();
  }
  engine.caller().release();
  callables.clear();
  return {};
}

bool PoolBase::is_shut_down() const noexcept {
  return detail::read_engine(engine_, true, [](const detail::Engine& engine) { return engine.is_shut_down(); });
}
const Options& PoolBase::options() const noexcept {
  static const Options none;  // a moved-from handle's
  return engine_ ? (*engine_).options() : none;
}
Stats PoolBase::stats() const noexcept {
  return detail::read_engine(engine_, Stats{}, [](const detail::Engine& engine) { return engine.stats(); });
}

MemoryInfo PoolBase::memory() const {
  return detail::read_engine(engine_, MemoryInfo{}, [](const detail::Engine& engine) {
    return engine.is_shut_down() ? MemoryInfo{} : engine.device().memory();
  });
}

std::vector<Block> PoolBase::live_blocks() const {
  return detail::read_engine(engine_, std::vector<Block>{}, [](const detail::Engine& engine) {
    return engine.is_shut_down() ? std::vector<Block>{} : engine.device().live_blocks();
  });
}

Result<void> PoolBase::check_memory() const {
  if (!engine_) return fail(Errc::invalid_argument, "check_memory of a moved-from pool handle");
  detail::Engine& engine = *engine_;
  // From inside a call (its function, a kernel, the log sink) the pool is halfway through it:
  // blocks are allocated that no lease holds yet, and the check would report a bug that is not
  // one.
  if (engine.caller().is_taken() && engine.ledger().is_held_here()) {
    return fail(Errc::concurrent_use,
                "check_memory from inside a call of the same pool (its function, a kernel or the log sink): the "
                "pool is halfway through the call; check it after the call returns");
  }
  const detail::StateLock lock(*engine_);
  if (engine.is_shut_down()) return fail(Errc::pool_shut_down, "check_memory after the pool was shut down");
  return engine.pool_memory().check();
}

std::string_view to_string(Errc code) noexcept {
  switch (code) {
    case Errc::wrong_input_count: return "wrong_input_count";
    case Errc::wrong_input_type: return "wrong_input_type";
    case Errc::wrong_shape: return "wrong_shape";
    case Errc::output_overwritten: return "output_overwritten";
    case Errc::pool_shut_down: return "pool_shut_down";
    case Errc::static_input_moved: return "static_input_moved";
    case Errc::graph_unavailable: return "graph_unavailable";
    case Errc::function_failed: return "function_failed";
    case Errc::out_of_memory: return "out_of_memory";
    case Errc::backend_error: return "backend_error";
    case Errc::concurrent_use: return "concurrent_use";
    case Errc::invalid_argument: return "invalid_argument";
    case Errc::invariant_violation: return "invariant_violation";
    case Errc::nested_capture: return "nested_capture";
  }
  return "unknown";
}

std::string Error::describe() const {
  std::string text = std::string(to_string(code)) + ": " + message;
  if (!function.empty()) text += " [function '" + function + "']";
  if (node >= 0) text += " [node " + std::to_string(node) + "]";
  if (input >= 0) text += " [input " + std::to_string(input) + "]";
  return text;
}

std::string_view to_string(Reason reason) noexcept {
  switch (reason) {
    case Reason::mutated_input: return "mutated_input";
    case Reason::rerecord_limit: return "rerecord_limit";
    case Reason::shape_key_limit: return "shape_key_limit";
    case Reason::size_not_graphed: return "size_not_graphed";
    case Reason::size_above_buckets: return "size_above_buckets";
    case Reason::input_on_other_device: return "input_on_other_device";
    case Reason::static_input_moved: return "static_input_moved";
    case Reason::managed_input_moved: return "managed_input_moved";
    case Reason::many_shape_keys: return "many_shape_keys";
    case Reason::capture_failed: return "capture_failed";
    case Reason::nested_pool: return "nested_pool";
    case Reason::unsupported_output: return "unsupported_output";
    case Reason::pending_backward: return "pending_backward";
    case Reason::undeclared_write: return "undeclared_write";
    case Reason::padded_output: return "padded_output";
    case Reason::count_: break;
  }
  return "unknown";
}

std::string_view to_string(FunctionMode mode) noexcept {
  switch (mode) {
    case FunctionMode::inference: return "inference";
    case FunctionMode::forward: return "forward";
    case FunctionMode::backward: return "backward";
  }
  return "unknown";
}

std::string_view to_string(CallKind kind) noexcept {
  switch (kind) {
    case CallKind::warmup: return "warm-up";
    case CallKind::recording: return "recording";
    case CallKind::replay: return "replay";
    case CallKind::eager: return "eager";
  }
  return "unknown";
}

std::string_view to_string(NodeReason reason) noexcept {
  switch (reason) {
    case NodeReason::first_call: return "first_call";
    case NodeReason::new_liveness_pattern: return "new_liveness_pattern";
    case NodeReason::static_input_moved: return "static_input_moved";
    case NodeReason::managed_input_moved: return "managed_input_moved";
    case NodeReason::path_warming_up: return "path_warming_up";
    case NodeReason::forced_warmup: return "forced_warmup";
    case NodeReason::recording_not_kept: return "recording_not_kept";
  }
  return "unknown";
}

backend::Device& backend::device_of(PoolBase& pool) noexcept {
  return detail::device(*pool.engine_);
}

}  // namespace cgt
