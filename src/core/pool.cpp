// Making engines and pools, registering functions, shutting down, and the names of enums.
module;
#include <expected>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

module cgt;
import :engine;

namespace cgt::detail {

Engine::Engine(std::unique_ptr<backend::Device> device_, Options options_)
    : device(std::move(device_)),
      options(std::move(options_)),
      device_index(device->device_index()),
      releases_unowned(device->releases_unowned_storage()) {}

Engine::~Engine() {
  // Nodes hold recordings and cells that use the device: drop them before it goes.
  warmup_chain.clear();
  current = nullptr;
  roots.clear();
  graph_nodes.clear();
}

void retain(Engine& engine) noexcept {
  ++engine.refs;
}

void release(Engine& engine) noexcept {
  if (--engine.refs == 0) delete &engine;  // NOLINT(cppcoreguidelines-owning-memory): counted ownership
}

EngineRef make_engine(std::unique_ptr<backend::Device> device, Options options) {
  return EngineRef(new Engine(std::move(device), std::move(options)));  // NOLINT(cppcoreguidelines-owning-memory)
}

Result<std::uint32_t> add_function(Engine& engine, std::unique_ptr<backend::Invoker> invoker, FunctionOptions options) {
  if (engine.shut_down) return fail(Errc::pool_shut_down, "add_function after the pool was shut down; make a new pool");
  if (engine.busy.load(std::memory_order_acquire)) {
    return fail(Errc::concurrent_use, "add_function while a call of the same pool is in flight");
  }
  auto record = std::make_unique<FunctionRecord>();
  record->id = static_cast<std::uint32_t>(engine.functions.size());
  record->name = options.name.empty() ? "function" + std::to_string(record->id) : options.name;
  record->invoker = std::move(invoker);
  record->options = std::move(options);
  engine.functions.push_back(std::move(record));
  return engine.functions.back()->id;
}

const std::string& function_name(const Engine& engine, std::uint32_t function) noexcept {
  return engine.functions[function]->name;
}

backend::Device& device(Engine& engine) noexcept {
  return *engine.device;
}

void Engine::shutdown() {
  if (shut_down) return;
  if (current != nullptr) reclaim_path();
  warmup_chain.clear();
  current = nullptr;
  state = PathState::none;
  roots.clear();
  root_order.clear();
  graph_nodes.clear();
  shut_down = true;
  device->shutdown();
}

}  // namespace cgt::detail

namespace cgt {

void PoolBase::mark_step_begin() noexcept {
  ++(*engine_).step;
}

Result<void> PoolBase::shutdown() {
  detail::Engine& engine = *engine_;
  bool idle = false;
  if (!engine.busy.compare_exchange_strong(idle, true, std::memory_order_acquire)) {
    return fail(Errc::concurrent_use, "shutdown() while a call of the same pool is in flight");
  }
  engine.shutdown();
  engine.busy.store(false, std::memory_order_release);
  return {};
}

bool PoolBase::is_shut_down() const noexcept {
  return (*engine_).shut_down;
}
const Options& PoolBase::options() const noexcept {
  return (*engine_).options;
}
Stats PoolBase::stats() const noexcept {
  return (*engine_).stats;
}

MemoryInfo PoolBase::memory() const {
  const detail::Engine& engine = *engine_;
  return engine.shut_down ? MemoryInfo{} : engine.device->memory();
}

std::vector<Block> PoolBase::live_blocks() const {
  const detail::Engine& engine = *engine_;
  return engine.shut_down ? std::vector<Block>{} : engine.device->live_blocks();
}

Result<void> PoolBase::check_memory() const {
  const detail::Engine& engine = *engine_;
  if (engine.shut_down) return fail(Errc::pool_shut_down, "check_memory after the pool was shut down");
  return engine.check_memory();
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
    case Reason::input_on_other_device: return "input_on_other_device";
    case Reason::static_input_moved: return "static_input_moved";
    case Reason::managed_input_moved: return "managed_input_moved";
    case Reason::many_shape_keys: return "many_shape_keys";
    case Reason::count_: break;
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
  }
  return "unknown";
}

}  // namespace cgt
