// Sleep and wake: the pool's memory given back while its graphs stay recorded over their
// addresses, and taken back at the same addresses before the next call.
module;
#include <cstddef>
#include <expected>
#include <string>
#include <utility>

module cgt.core;
import :engine;

namespace cgt::detail {

Result<std::size_t> Engine::sleep() {
  if (shut_down_) return fail(Errc::pool_shut_down, "sleep() after the pool was shut down");
  if (asleep_) return device_->asleep_bytes();
  // Memory a lease reads cannot go: its contents would be lost. (A replay's outputs are not the
  // allocator's, so the path is asked, not the allocator.)
  if (path_.node() != nullptr && !path_.all_outputs_dead()) {
    return fail(Errc::invalid_argument,
                "sleep(): " + std::to_string(path_.live_cells().size()) +
                    " outputs of the pool are still held by leases; drop them (or begin a new step and call once) "
                    "before the pool gives its memory back");
  }
  path_.end();  // the next call starts from the roots, whose graphs read nothing left in the pool
  auto released = device_->sleep();
  if (!released) return released;
  asleep_ = true;
  ++stats_.sleeps;
  return released;
}

Result<void> Engine::wake() {
  if (!asleep_) return {};
  if (auto woken = device_->wake(); !woken) return woken;
  asleep_ = false;
  ++stats_.wakes;
  return {};
}

}  // namespace cgt::detail
