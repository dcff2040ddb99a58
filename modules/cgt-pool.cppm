// cgt:pool — one graph tree and its memory pool (`Pool`, `PoolBase`).
module;
#include <expected>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

// Its deleted borrows say why they are deleted (`= delete("...")`, C++26, which clang accepts
// earlier): the message is what a user who wrote a dangling borrow reads.
#pragma clang diagnostic ignored "-Wc++26-extensions"

export module cgt:pool;
import cgt.vocabulary;
import cgt.core;
import :function;
import :node;

export namespace cgt {

template <class B>
class Pool;
class PoolBase;

/// What every pool can do, whatever its backend. A moved-from pool is empty: its queries return
/// empty values (`options()` the defaults), `mark_step_begin()` does nothing, and what would
/// change it (`shutdown()`, `add_function`, `device()`) fails with `invalid_argument`.
class PoolBase {
 public:
  PoolBase(PoolBase&&) noexcept = default;
  PoolBase& operator=(PoolBase&&) noexcept = default;

  /// A new step begins: at the next call, the memory of every output of earlier calls may be
  /// reclaimed, and leases still held on it report `output_overwritten` (or keep a copy, with
  /// `Options::copy_out_on_new_step`). Call it at the top of each training or inference step.
  void mark_step_begin() noexcept { detail::pool_view::mark_step_begin(engine_); }
  /// Ends the pool: frees its graphs and memory. Dropping the `Pool` handle alone is not a shutdown: functions and
  /// leases still held keep working. A second `shutdown()` succeeds and does nothing. Fails with
  /// `concurrent_use` during a call, `invalid_argument` on a moved-from pool.
  /// ENSURES: on success, `is_shut_down()`; every later call and lease access of this pool fails
  /// with `pool_shut_down`.
  [[nodiscard]] Result<void> shutdown() { return detail::pool_view::shutdown(engine_); }
  /// True when a forward function ran and no backward function has since (PyTorch's
  /// `running_forwards_with_pending_backwards`): until one does, forwards begin no new step.
  [[nodiscard]] bool has_pending_backward() const noexcept { return detail::pool_view::has_pending_backward(engine_); }
  /// True after `shutdown()`, and for a moved-from pool (which can run nothing either).
  [[nodiscard]] bool is_shut_down() const noexcept { return detail::pool_view::is_shut_down(engine_); }

  /// The options the pool was made with (the defaults for a moved-from pool).
  [[nodiscard]] const Options& options() const noexcept { return detail::pool_view::options(engine_); }
  [[nodiscard]] Stats stats() const noexcept { return detail::pool_view::stats(engine_); }
  /// The pool's memory now; all zero after `shutdown()` or once moved from.
  [[nodiscard]] MemoryInfo memory() const { return detail::pool_view::memory(engine_); }
  /// Allocated blocks of the pool now (PyTorch's tests count these as "live blocks").
  [[nodiscard]] std::vector<Block> live_blocks() const { return detail::pool_view::live_blocks(engine_); }
  /// The pool's memory by owner: its segments (live, cached), the graphs' input slots, copies kept
  /// past a step (`copy_out_on_new_step`), the executables; per function. Empty after `shutdown()`.
  [[nodiscard]] MemoryReport memory_report() const { return detail::pool_view::memory_report(engine_); }
  /// Gives the pool's memory back to the system while its graphs stay recorded: the segments'
  /// addresses stay reserved, their pages go (cgt.host: madvise; cgt.cuda: unmapped, with
  /// `PoolOptions::sleepable`). Returns the bytes given back. The next call, or `wake()`, takes the
  /// memory back at the same addresses, with no re-recording. Fails with `invalid_argument` while a
  /// lease holds pool memory (its contents would be lost) or where the backend cannot (cgt.torch;
  /// cgt.cuda without `sleepable`), `concurrent_use` during a call, `pool_shut_down` after
  /// `shutdown()`. A second `sleep()` does nothing.
  [[nodiscard]] Result<std::size_t> sleep() { return detail::pool_view::sleep(engine_); }
  /// Takes the memory back now, rather than at the next call; `out_of_memory` where the system
  /// refuses (the pool stays asleep, and a call tries again). Does nothing while awake.
  [[nodiscard]] Result<void> wake() { return detail::pool_view::wake(engine_); }
  /// Whether the pool sleeps (`sleep()` with no `wake()` or call since).
  [[nodiscard]] bool asleep() const { return detail::pool_view::is_asleep(engine_); }
  /// Root recordings, in recording order.
  [[nodiscard]] std::vector<Node> roots() const { return Node::views(engine_, detail::pool_view::roots(engine_)); }
  /// The nodes of the current path, root first (empty when no path is being executed).
  [[nodiscard]] std::vector<Node> current_path() const {
    return Node::views(engine_, detail::pool_view::current_path(engine_));
  }
  /// The tree as a Graphviz DOT graph: recordings, warm-ups of the current path, why each was made.
  [[nodiscard]] std::string to_dot() const { return detail::pool_view::to_dot(engine_); }
  /// Checks now that the pool's live blocks are exactly the memory of live leases; the check
  /// `Options::debug_checks` runs after every call. Fails with `invariant_violation`,
  /// `pool_shut_down`, `concurrent_use` from inside a call of the pool (its function, a kernel,
  /// the log sink: the call is halfway done), `invalid_argument` on a moved-from pool.
  [[nodiscard]] Result<void> check_memory() const { return detail::pool_view::check_memory(engine_); }

 protected:
  explicit PoolBase(detail::EngineRef engine) noexcept : engine_(std::move(engine)) {}
  detail::EngineRef engine_;
};

/// One graph tree and its memory pool, for one device and stream. Made by a backend
/// (`cgt::host::make_pool`, `cgt::torch::make_pool`). Move-only. Used by one thread at a time.
template <class B>
class Pool : public PoolBase {
 public:
  /// Registers a function. Fails with `pool_shut_down`, `invalid_argument` on a moved-from pool.
  /// The pool keeps `fn`, and what it captures, until every graph recorded from its functions is
  /// destroyed (at `shutdown()`, or when the last handle of the pool goes): what the graphs use
  /// besides their inputs (an NCCL communicator, a library handle, a workspace) outlives them when
  /// `fn` owns it, by a `std::shared_ptr` whose deleter frees it (`ncclCommDestroy`).
  /// ENSURES: on success, the function's id is the number of functions registered before it.
  [[nodiscard]] Result<Function<B>> add_function(typename B::Callable fn, FunctionOptions options = {}) {
    if (!engine_) return moved_from("add_function");
    auto id = detail::add_function(*engine_, B::make_invoker(std::move(fn)), std::move(options));
    if (!id) return std::unexpected(std::move(id.error()));
    return Function<B>(engine_, *id);
  }

  /// The program's view of the pool's device (`B::Device`: its index, its memory to look at, its
  /// stream), never the engine's side of it; valid while the pool's engine lives (this handle, a
  /// function or a lease keeps it). Fails with
  /// `pool_shut_down` after `shutdown()`, `invalid_argument` on a moved-from pool.
  /// ENSURES: on success, the same view on every call (one per pool).
  [[nodiscard]] Result<std::reference_wrapper<typename B::Device>> device() & [[clang::lifetimebound]] {
    if (!engine_) return moved_from("device()");
    if (is_shut_down()) {
      return fail(Errc::pool_shut_down, "device() after the pool was shut down: its device is released");
    }
    return std::ref(B::view(detail::device(*engine_)));
  }
  // A temporary pool may be the last handle on the engine: the device would die with it.
  [[nodiscard]] Result<std::reference_wrapper<typename B::Device>> device() && =
      delete("the device of a temporary Pool dies with it at the end of the statement: name the pool first");

 private:
  friend struct detail::HandleAccess<Pool>;  // backend::make_pool makes pools, backend::device_of reads them
  explicit Pool(detail::EngineRef engine) noexcept : PoolBase(std::move(engine)) {}
  static std::unexpected<Error> moved_from(const char* what) {
    return fail(Errc::invalid_argument,
                std::string(what) + " on an empty Pool handle (moved from); use the handle it was moved into");
  }
};

}  // namespace cgt
