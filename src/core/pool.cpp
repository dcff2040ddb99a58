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

namespace cgt::detail::pool_view {

// Every method of a pool handle works on a moved-from handle too (a null `pool`): it reads as an
// empty pool, and what would change one fails with `invalid_argument`.

void mark_step_begin(const EngineRef& pool) noexcept {
  // Atomic: any thread, and a pool function, may begin a step; the next call sees it. From now
  // on the program says when steps begin: forwards no longer begin them (`FunctionMode::forward`).
  if (!pool) return;
  (*pool).mark_step_begin();
}

bool has_pending_backward(const EngineRef& pool) noexcept {
  return read_engine(pool, false, [](const Engine& engine) { return engine.generation_rule().pending_backward(); });
}

namespace {

// Runs `change` on the engine with no call in flight and the state held (`shutdown`, `sleep`,
// `wake`): `invalid_argument` for a moved-from handle, `concurrent_use` during a call.
template <class R, class Change>
R with_pool_taken(const EngineRef& pool, const char* what, Change change) {
  if (!pool) return fail(Errc::invalid_argument, std::string(what) + " of a moved-from pool handle");
  Engine& engine = *pool;
  if (!engine.caller().try_take()) {
    return fail(Errc::concurrent_use, std::string(what) + " while a call of the same pool is in flight");
  }
  R result = [&] {
    const StateLock lock(engine);
    return change(engine);
  }();
  engine.caller().release();
  return result;
}

}  // namespace

Result<void> shutdown(const EngineRef& pool) {
  // The callables released below may hold the pool's last handles, even the one whose `pool`
  // this is (a pool kept by its own function): the engine must outlive them, and `pool` may not.
  const EngineRef keep = pool;  // NOLINT(performance-unnecessary-copy-initialization)
  auto callables = with_pool_taken<Result<std::vector<std::unique_ptr<backend::Invoker>>>>(
      pool, "shutdown()", [](Engine& engine) { return engine.shutdown(); });
  if (!callables) return std::unexpected(std::move(callables.error()));
  callables->clear();  // outside the state and the caller: their destructors may drop handles of this pool
  return {};
}

Result<std::size_t> sleep(const EngineRef& pool) {
  return with_pool_taken<Result<std::size_t>>(pool, "sleep()", [](Engine& engine) { return engine.sleep(); });
}

Result<void> wake(const EngineRef& pool) {
  return with_pool_taken<Result<void>>(pool, "wake()", [](Engine& engine) { return engine.wake(); });
}

bool is_asleep(const EngineRef& pool) noexcept {
  return read_engine(pool, false, [](const Engine& engine) { return engine.is_asleep(); });
}

bool is_shut_down(const EngineRef& pool) noexcept {
  return read_engine(pool, true, [](const Engine& engine) { return engine.is_shut_down(); });
}
const Options& options(const EngineRef& pool) noexcept {
  static const Options none;  // a moved-from handle's
  return pool ? (*pool).options() : none;
}
Stats stats(const EngineRef& pool) noexcept {
  return read_engine(pool, Stats{}, [](const Engine& engine) { return engine.stats(); });
}

MemoryInfo memory(const EngineRef& pool) {
  return read_engine(pool, MemoryInfo{}, [](const Engine& engine) {
    return engine.is_shut_down() ? MemoryInfo{} : engine.device().memory();
  });
}

MemoryReport memory_report(const EngineRef& pool) {
  return read_engine(pool, MemoryReport{}, [](const Engine& engine) {
    if (engine.is_shut_down()) return MemoryReport{};
    const MemoryInfo memory = engine.device().memory();
    MemoryReport report{.reserved_bytes = memory.reserved_bytes,
                        .live_bytes = memory.allocated_bytes,
                        .cached_bytes = memory.reserved_bytes > memory.allocated_bytes
                                            ? memory.reserved_bytes - memory.allocated_bytes
                                            : 0,
                        .copied_out_bytes = engine.pool_memory().copied_out_bytes(),
                        .asleep_bytes = engine.device().asleep_bytes()};
    std::vector<FunctionMemory> by_function(engine.functions().size());
    for (const TreeNode* node : engine.tree().nodes()) {
      if (node == nullptr) continue;  // evicted
      const NodeMemory graph = node->memory();
      FunctionMemory& owner = by_function[function_of(engine, *node)];
      ++owner.graphs;
      owner.pool_bytes += graph.pool_bytes;
      owner.slot_bytes += graph.slot_bytes;
      owner.executable_bytes += graph.executable_bytes;
      report.slot_bytes += graph.slot_bytes;
      report.executable_bytes += graph.executable_bytes;
    }
    for (std::uint32_t i = 0; i < by_function.size(); ++i) {
      if (by_function[i].graphs == 0) continue;
      by_function[i].function = engine.functions().name(i);
      report.functions.push_back(std::move(by_function[i]));
    }
    return report;
  });
}

std::vector<Block> live_blocks(const EngineRef& pool) {
  return read_engine(pool, std::vector<Block>{}, [](const Engine& engine) {
    return engine.is_shut_down() ? std::vector<Block>{} : engine.device().live_blocks();
  });
}

Result<void> check_memory(const EngineRef& pool) {
  if (!pool) return fail(Errc::invalid_argument, "check_memory of a moved-from pool handle");
  Engine& engine = *pool;
  // From inside a call (its function, a kernel, the log sink) the pool is halfway through it:
  // blocks are allocated that no lease holds yet, and the check would report a bug that is not
  // one.
  if (engine.caller().is_taken() && engine.ledger().is_held_here()) {
    return fail(Errc::concurrent_use,
                "check_memory from inside a call of the same pool (its function, a kernel or the log sink): the "
                "pool is halfway through the call; check it after the call returns");
  }
  const StateLock lock(*pool);
  if (engine.is_shut_down()) return fail(Errc::pool_shut_down, "check_memory after the pool was shut down");
  return engine.pool_memory().check();
}

}  // namespace cgt::detail::pool_view
