// Leases: the only thing that makes pool memory live. Dropping the last lease on a storage is the
// moment its memory becomes dead.
module;
#include <expected>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

module cgt;
import :engine;

namespace cgt::detail {

LeaseCore& LeaseCore::operator=(LeaseCore&& other) noexcept {
  if (this != &other) {
    lease_drop(*this);
    engine = std::move(other.engine);
    cell = std::exchange(other.cell, nullptr);
    value = std::exchange(other.value, nullptr);
    owner = std::move(other.owner);
    function = other.function;
    output = other.output;
  }
  return *this;
}

void lease_drop(LeaseCore& lease) noexcept {
  if (Cell* cell = std::exchange(lease.cell, nullptr)) {
    if (--cell->leases == 0 && !cell->reclaimed) cell->engine->cell_died(*cell);
    CellRef::unref(cell);
  }
  lease.value = nullptr;
  lease.owner.reset();
  lease.engine = EngineRef();
}

bool lease_is_valid(const LeaseCore& lease) noexcept {
  if (!lease.engine || (*lease.engine).shut_down) return false;
  return lease.cell == nullptr || !lease.cell->reclaimed || lease.cell->rescued != nullptr;
}

Result<const void*> lease_value(LeaseCore& lease) {
  if (!lease.engine) {
    return fail(Errc::invalid_argument, "the lease is empty: it was moved from, reset, or moved into a call");
  }
  Engine& engine = *lease.engine;
  const std::string& name = engine.functions[lease.function]->name;
  if (engine.shut_down) {
    return fail(Errc::pool_shut_down,
                "output " + std::to_string(lease.output) + " of '" + name +
                    "' is gone: its pool was shut down; take() values you need before shutdown()",
                name);
  }
  Cell* cell = lease.cell;
  if (cell != nullptr && cell->reclaimed) {
    if (cell->rescued == nullptr) {
      return fail(Errc::output_overwritten, engine.overwritten_message(*cell, lease.output), name);
    }
    // Options::copy_out_on_new_step kept a copy: from now on this lease views the copy.
    lease.owner = engine.device->rebase(lease.value, cell->storage, cell->rescued);
    lease.value = lease.owner.get();
    lease.cell = nullptr;
    --cell->leases;
    CellRef::unref(cell);
  }
  return lease.value;
}

}  // namespace cgt::detail
