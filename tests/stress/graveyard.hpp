// The [threads] mode of the stress test: a thread that destroys the handles the sequence hands
// over, a little later each, so that their destructors race with the main thread's calls.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <type_traits>
#include <utility>

namespace stress {

/// Destroys handles on a thread of its own (the [threads] mode), in the order they are handed over.
class Graveyard {
 public:
  explicit Graveyard(bool threaded) {
    if (threaded) thread_ = std::thread([this] { run(); });
  }
  Graveyard(const Graveyard&) = delete;
  Graveyard& operator=(const Graveyard&) = delete;
  ~Graveyard() { close(); }

  /// Drops `handle` here (no thread) or on the graveyard's thread.
  template <class T>
  void bury(T&& handle) {
    auto box = std::make_shared<std::decay_t<T>>(std::forward<T>(handle));
    if (!thread_.joinable()) return;  // the box dies here
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(box));
    ready_.notify_one();
  }
  /// Waits until every handed-over handle is dropped, and stops the thread.
  void close() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard lock(mutex_);
      closing_ = true;
      ready_.notify_one();
    }
    thread_.join();
  }
  std::uint64_t buried() const { return buried_; }
  std::uint64_t buried_during_call() const { return buried_during_call_; }
  /// Set by the main thread while it is in a call of the pool (the figures say how many drops
  /// really overlapped a call).
  std::atomic<bool> in_call{false};

 private:
  void run() {
    std::minstd_rand rng(7);
    std::uniform_int_distribution<int> delay(0, 100);
    std::unique_lock lock(mutex_);
    for (;;) {
      ready_.wait(lock, [&] { return closing_ || !queue_.empty(); });
      if (queue_.empty()) return;
      std::shared_ptr<void> box = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      // A little later, so that drops land in the middle of the main thread's calls.
      if (const auto wait = delay(rng); wait > 40) std::this_thread::sleep_for(std::chrono::microseconds(wait - 40));
      const bool during_call = in_call.load();
      box.reset();  // the handle's destructor runs here, racing with the main thread's calls
      ++buried_;
      if (during_call) ++buried_during_call_;
      lock.lock();
    }
  }
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::shared_ptr<void>> queue_;
  bool closing_ = false;
  std::atomic<std::uint64_t> buried_{0};
  std::atomic<std::uint64_t> buried_during_call_{0};
};

}  // namespace stress
