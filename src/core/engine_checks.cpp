// Consistency checks of the pool's memory against the leases, and reporting of decisions.
module;
#include <expected>
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

module cgt.core;
import :engine;

namespace cgt::detail {
namespace {

std::string hex(std::uintptr_t address) {
  std::ostringstream text;
  text << "0x" << std::hex << address;
  return text.str();
}

}  // namespace

Error in_call(Error error, const FunctionRecord& function, const char* doing, std::int64_t node) {
  error.message = "'" + function.name + "' failed while " + doing + ": " + error.message;
  error.function = function.name;
  if (node >= 0) error.node = node;
  return error;
}

Result<void> Engine::check_memory() const {
  // Blocks the allocator counts as allocated must be exactly the storages that live leases hold
  // and the allocator owns (PyTorch's check_memory_pool).
  std::vector<std::uintptr_t> expected;
  for (const Cell* cell : path_.live_cells()) {
    if (cell->storage.owned_by_allocator) expected.push_back(cell->storage.address);
  }
  // A path a new generation ended: its memory is released once the call does its work.
  for (const CellRef& cell : path_.ended_cells()) {
    if (cell->storage.owned_by_allocator) expected.push_back(cell->storage.address);
  }
  std::vector<std::string> problems;
  for (const Block& block : device_->live_blocks()) {
    auto found = std::ranges::find(expected, block.address);
    if (found == expected.end()) {
      problems.push_back("block " + hex(block.address) + " (" + std::to_string(block.bytes) +
                         " bytes) is allocated in the pool, but no live lease holds it");
    } else {
      expected.erase(found);
    }
  }
  for (const std::uintptr_t address : expected) {
    problems.push_back("storage " + hex(address) + " is held by a live lease, but is not allocated in the pool");
  }
  if (problems.empty()) return {};
  std::string message = "the pool's memory does not match its leases: ";
  for (std::size_t i = 0; i < problems.size(); ++i) message += (i > 0 ? "; " : "") + problems[i];
  return fail(Errc::invariant_violation, message + ". This is a bug in cgt or its backend: please report it");
}

Result<void> Engine::debug_check(const char* where) const {
  if (!options_.debug_checks) return {};
  auto checked = check_memory();
  if (!checked) checked.error().message = std::string(where) + ": " + checked.error().message;
  return checked;
}

void Engine::log(EventKind kind, Reason reason, FunctionRecord& function, const std::string& message) noexcept {
  try {
    const bool first = function.logged.insert(reason).second;
    if (kind == EventKind::eager_fallback && first) ++stats_.fallback_warnings;
    if (options_.log_sink) {
      options_.log_sink(Event{.kind = kind, .reason = reason, .function = function.name, .message = message});
    } else if (first) {
      std::cerr << "cgt: " << message << '\n';
    }
  } catch (...) {
    // A log sink that throws must not abandon a call halfway through its bookkeeping: the
    // decision stands (it is counted in Stats), only its report is lost.
    ++stats_.log_sink_failures;
  }
}

std::string Engine::overwritten_message(const Cell& cell, std::uint32_t output) const {
  // Until the program marks generations, only a forward's call begins them (`FunctionMode::forward`).
  const bool by_forward = !generation_rule_.program_marks_generations();
  return "output " + std::to_string(output) + " of '" + functions_[cell.function].name +
         "' was reclaimed when a new step began (" +
         (by_forward ? "a forward function was called, with no backward pending," : "mark_step_begin was called") +
         " after it was produced in step " + std::to_string(cell.generation()) +
         "); to keep a value across steps, take() it before the next step, set Options::copy_out_on_new_step "
         "(a new step then copies held outputs out of the pool), or " +
         (by_forward ? "call the next step's forward" : "call mark_step_begin()") + " only after you are done with it";
}

}  // namespace cgt::detail
