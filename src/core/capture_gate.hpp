// The process-wide gate between a capture and the calls of other pools on other threads. Plain
// C++, no module, so that tests/host/test_capture_gate.cpp tests it alone.
//
// Why: a capture sees only the work its own thread issues. A pool function that hands work to a
// helper thread, which calls another pool, makes a graph that reads what that call computed once,
// at the recording: every replay then returns the recording's values. The call on the helper
// thread cannot be told from an independent thread's call of its own pool, so neither is refused:
// a call of another pool waits while a capture is in progress on another thread (captures last
// milliseconds, and happen at a program's first calls), and a call that waited its limit (the
// capture is waiting for it: it is the function's own) goes on and marks the capture, whose graph
// is then run once for its call and not kept.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace cgt::detail {

/// The number of captures in progress in the process: the process gate's count, which every call
/// reads (a global, not a static of a function: no guard to test on the way).
// NOLINTNEXTLINE(cppcoreguidelines-avoid-non-const-global-variables): changed under the gate's lock
inline constinit std::atomic<std::uint32_t> captures_in_process{0};

/// Owns the captures in progress in the process (their pool, thread, and whether a call of another
/// pool overlapped them). One for the process (`process()`), shared by every pool; a test makes
/// gates of its own.
///
/// Invariants: `active_` lists exactly the captures begun and not ended; `captures_` is its size.
/// A call passes the gate while no capture of another pool is in progress on another thread, or
/// once its wait ran out, having marked each such capture overlapped.
class CaptureGate {
 public:
  /// A gate of its own (a test's).
  CaptureGate() noexcept : captures_(own_count_) {}
  CaptureGate(const CaptureGate&) = delete;
  CaptureGate& operator=(const CaptureGate&) = delete;

  /// The process's gate.
  [[nodiscard]] static CaptureGate& process() noexcept {
    static CaptureGate gate(captures_in_process);
    return gate;
  }
  /// No capture is in progress in the process: a call's only question of the gate then (one
  /// relaxed load). A capture begun by the function of a call happens after its thread read this,
  /// and a helper thread it starts or signals after that sees it (the signal orders them).
  [[nodiscard]] static bool process_is_open() noexcept {
    return captures_in_process.load(std::memory_order_relaxed) == 0;
  }

  /// No capture is in progress at this gate.
  [[nodiscard]] bool is_open() const noexcept { return captures_.load(std::memory_order_relaxed) == 0; }

  /// A call of `pool` on this thread. ENSURES: no capture of another pool is in progress on
  /// another thread, or `wait` passed and each such capture is marked overlapped (`end` says so).
  /// Captures on this thread are not waited for (a call inside one is refused before the gate).
  void pass(const void* pool, std::chrono::milliseconds wait) {
    const std::thread::id self = std::this_thread::get_id();
    const auto blocks = [&](const Capture& capture) { return capture.pool != pool && capture.thread != self; };
    std::unique_lock lock(mutex_);
    const bool clear = ended_.wait_for(lock, wait, [&] { return std::ranges::none_of(active_, blocks); });
    if (clear) return;
    for (Capture& capture : active_) {
      if (blocks(capture)) capture.overlapped = true;
    }
  }

  /// A capture of `pool` begins on this thread. Returns its ticket, for `end`.
  [[nodiscard]] std::uint64_t begin(const void* pool) {
    const std::lock_guard lock(mutex_);
    const std::uint64_t ticket = ++next_ticket_;
    active_.push_back({.ticket = ticket, .pool = pool, .thread = std::this_thread::get_id(), .overlapped = false});
    captures_.store(static_cast<std::uint32_t>(active_.size()), std::memory_order_relaxed);
    return ticket;
  }

  /// The capture `ticket` ended. Returns whether a call of another pool on another thread
  /// overlapped it (waited its limit while it was in progress). ENSURES: calls waiting for it go on.
  [[nodiscard]] bool end(std::uint64_t ticket) {
    bool overlapped = false;
    {
      const std::lock_guard lock(mutex_);
      const auto found = std::ranges::find(active_, ticket, &Capture::ticket);
      if (found != active_.end()) {
        overlapped = found->overlapped;
        active_.erase(found);
      }
      captures_.store(static_cast<std::uint32_t>(active_.size()), std::memory_order_relaxed);
    }
    ended_.notify_all();
    return overlapped;
  }

 private:
  struct Capture {  // NOLINT(performance-trivially-destructible): it has no destructor of its own to default
    std::uint64_t ticket = 0;
    const void* pool = nullptr;
    std::thread::id thread;
    bool overlapped = false;
  };
  explicit CaptureGate(std::atomic<std::uint32_t>& count) noexcept : captures_(count) {}

  std::atomic<std::uint32_t> own_count_{0};  ///< a test gate's count
  std::atomic<std::uint32_t>& captures_;     ///< `active_.size()`, read without the lock
  std::mutex mutex_;                         ///< guards `active_` and `next_ticket_`
  std::condition_variable ended_;            ///< a capture ended
  std::vector<Capture> active_;
  std::uint64_t next_ticket_ = 0;
};

}  // namespace cgt::detail
