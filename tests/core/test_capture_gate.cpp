// The process-wide gate between captures and other pools' calls (src/core/capture_gate.hpp), alone:
// a call passes at once with no capture in progress, or one of its own pool, or one on its own
// thread; it waits for another pool's capture on another thread, and once its wait runs out it
// passes and marks that capture overlapped.
#include <catch2/catch_test_macros.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

#include "core/capture_gate.hpp"

using cgt::detail::CaptureGate;
using namespace std::chrono_literals;

namespace {

int pool_a = 0;  // identities of two pools
int pool_b = 0;

}  // namespace

TEST_CASE("capture gate: open without captures, and a call passes at once", "[host][capture-gate]") {
  CaptureGate gate;
  CHECK(gate.is_open());
  const auto start = std::chrono::steady_clock::now();
  gate.pass(&pool_a, 1000ms);
  CHECK(std::chrono::steady_clock::now() - start < 500ms);
}

TEST_CASE("capture gate: a capture on this thread, or of the caller's pool, does not hold the call",
          "[host][capture-gate]") {
  CaptureGate gate;
  const std::uint64_t own_thread = gate.begin(&pool_a);
  CHECK_FALSE(gate.is_open());
  gate.pass(&pool_b, 1000ms);  // this thread's capture: a call inside it is refused before the gate
  std::uint64_t other_thread = 0;
  std::thread([&] { other_thread = gate.begin(&pool_b); }).join();
  gate.pass(&pool_b, 1000ms);  // pool b's own capture elsewhere: the pool's busy flag answers that call
  CHECK_FALSE(gate.end(other_thread));
  CHECK_FALSE(gate.end(own_thread));
  CHECK(gate.is_open());
}

TEST_CASE("capture gate: a call waits for another pool's capture on another thread to end", "[host][capture-gate]") {
  CaptureGate gate;
  std::atomic<bool> begun{false};
  std::atomic<bool> ended{false};
  std::thread capturer([&] {
    const std::uint64_t ticket = gate.begin(&pool_a);
    begun = true;
    std::this_thread::sleep_for(50ms);
    ended = true;
    CHECK_FALSE(gate.end(ticket));  // the call waited for it: not overlapped
  });
  while (!begun) std::this_thread::yield();
  gate.pass(&pool_b, 10s);
  CHECK(ended);
  capturer.join();
}

TEST_CASE("capture gate: a call whose wait runs out passes and marks the capture overlapped", "[host][capture-gate]") {
  CaptureGate gate;
  std::atomic<bool> begun{false};
  std::atomic<bool> passed{false};
  bool overlapped = false;
  std::thread capturer([&] {
    const std::uint64_t ticket = gate.begin(&pool_a);
    begun = true;
    while (!passed) std::this_thread::yield();  // waits for the call, as a function waits for its helper
    overlapped = gate.end(ticket);
  });
  while (!begun) std::this_thread::yield();
  gate.pass(&pool_b, 20ms);
  passed = true;
  capturer.join();
  CHECK(overlapped);
  CHECK(gate.is_open());
}
