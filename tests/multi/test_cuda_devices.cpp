// cgt.cuda with several pools: two pools on one device (runs on any GPU), and pools on two devices
// ([multi-gpu]: SKIPPED with fewer than two GPUs) — calls alternating between them, outputs of one
// pool copied into the other's functions, an input on the wrong device, the replay's device switch,
// and the shared scenario suite on device 1.
#include <catch2/catch_test_macros.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "scenario/spec.hpp"

import cgt;
import cgt.cuda;

#include "cuda/harness.hpp"
#include "scenario/register.hpp"

namespace {

using H0 = CudaHarnessOn<0>;
using H1 = CudaHarnessOn<1>;
using scenario::must;

// The scenario suite on device 1, named "cuda/device1/<scenario>".
const bool registered = scenario::register_scenarios<H1>("cuda/device1/", "[gpu][multi-gpu]");

void require_gpus(int count) {
  const int have = cgt::cuda::device_count();
  if (have < count) SKIP("needs " << count << " GPUs, this machine has " << have);
}

int current_device() {
  int device = -1;
  REQUIRE(cudaGetDevice(&device) == cudaSuccess);
  return device;
}

// Waits for every device (a peer copy runs on the legacy streams of both devices).
void synchronize_all() {
  int current = 0;
  REQUIRE(cudaGetDevice(&current) == cudaSuccess);
  for (int device = 0; device < cgt::cuda::device_count(); ++device) {
    REQUIRE(cudaSetDevice(device) == cudaSuccess);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  }
  REQUIRE(cudaSetDevice(current) == cudaSuccess);
}

// A copy of `source` (any device) on `device`, by the driver's peer copy: a new allocation there.
cgt::cuda::Buffer copy_to(const cgt::cuda::Buffer& source, int device) {
  cgt::cuda::Buffer target = must(cgt::cuda::Buffer::make(source.type(), source.sizes(), device));
  synchronize_all();
  REQUIRE(cudaMemcpyPeer(target.data(), device, source.data(), source.device(), source.numel() * sizeof(float)) ==
          cudaSuccess);
  synchronize_all();
  return target;
}

bool disjoint(const std::vector<cgt::Block>& a, const std::vector<cgt::Block>& b) {
  for (const cgt::Block& x : a) {
    for (const cgt::Block& y : b) {
      if (x.address < y.address + y.bytes && y.address < x.address + x.bytes) return false;
    }
  }
  return true;
}

}  // namespace

TEST_CASE("multi/cuda: two pools on one device alternate, feed each other, and keep their memory apart", "[gpu]") {
  scenario::skip_unless_available<H0>();
  auto first = must(H0::make_pool({}));
  auto second = must(H0::make_pool({}));
  auto add_one = must(H0::add(first, scenario::unary("add_one", scenario::in(0) + 1)));
  auto twice = must(H0::add(second, scenario::unary("twice", scenario::in(0) * 2)));
  for (int step = 0; step < 5; ++step) {
    INFO("step " << step);
    const auto x = H0::make(scenario::HostTensor::iota({64}));
    first.mark_step_begin();
    second.mark_step_begin();
    auto a = must(add_one({x}));  // first pool: x + 1
    // The pools' streams are not ordered with each other: each consumer waits for the producer.
    must(must(second.device()).get().wait_for(must(first.device()).get()));
    auto b = must(twice({must(a.get(0)).get()}));  // second pool: (x + 1) * 2, a's output copied in
    must(must(first.device()).get().wait_for(must(second.device()).get()));
    auto c = must(add_one({must(b.get(0)).get()}));  // first pool again: (x + 1) * 2 + 1
    const auto values = H0::read(must(c.get(0)).get()).data;
    for (std::size_t i = 0; i < values.size(); ++i) REQUIRE(values[i] == (static_cast<double>(i) + 1) * 2 + 1);
    CHECK(b.kind() != cgt::CallKind::eager);
    // Each output is its own pool's memory, never the other's.
    const auto& a_out = must(a.get(0)).get();
    const auto& b_out = must(b.get(0)).get();
    CHECK(H0::is_pool_memory(first, a_out));
    CHECK_FALSE(H0::is_pool_memory(second, a_out));
    CHECK(H0::is_pool_memory(second, b_out));
    CHECK_FALSE(H0::is_pool_memory(first, b_out));
    CHECK(disjoint(first.live_blocks(), second.live_blocks()));
  }
  CHECK(first.stats().replays >= 3);
  CHECK(second.stats().replays >= 2);
  CHECK(first.stats().eager_calls == 0);
  CHECK(second.stats().eager_calls == 0);
}

TEST_CASE("multi/cuda: pools on two devices alternate, and device 0's output copied to device 1 is read right",
          "[gpu][multi-gpu]") {
  require_gpus(2);
  auto pool0 = must(H0::make_pool({}));
  auto pool1 = must(H1::make_pool({}));
  auto add_one = must(H0::add(pool0, scenario::unary("add_one", scenario::in(0) + 1)));
  auto twice = must(H1::add(pool1, scenario::unary("twice", scenario::in(0) * 2)));
  for (int step = 0; step < 5; ++step) {
    INFO("step " << step);
    pool0.mark_step_begin();
    pool1.mark_step_begin();
    auto a = must(add_one({H0::make(scenario::HostTensor::iota({256}))}));
    const cgt::cuda::Buffer& a_out = must(a.get(0)).get();
    REQUIRE(a_out.device() == 0);
    const cgt::cuda::Buffer moved = copy_to(a_out, 1);
    CHECK(moved.storage() != a_out.storage());
    auto b = must(twice({moved}));
    CHECK(b.kind() != cgt::CallKind::eager);
    const cgt::cuda::Buffer& b_out = must(b.get(0)).get();
    CHECK(b_out.device() == 1);
    CHECK(H1::is_pool_memory(pool1, b_out));
    CHECK_FALSE(H0::is_pool_memory(pool0, b_out));
    const auto values = H1::read(b_out).data;
    for (std::size_t i = 0; i < values.size(); ++i) REQUIRE(values[i] == (static_cast<double>(i) + 1) * 2);
    // Device 0's output is untouched by device 1's work.
    CHECK(H0::read(a_out).data[3] == 4);
  }
  CHECK(pool0.stats().replays >= 3);
  CHECK(pool1.stats().replays >= 3);
  CHECK(pool0.stats().eager_calls + pool1.stats().eager_calls == 0);
}

TEST_CASE("multi/cuda: an input on another device runs eagerly, input_on_other_device", "[gpu][multi-gpu]") {
  require_gpus(2);
  auto pool1 = must(H1::make_pool({}));
  // The function copies its input to its own device first (a peer copy: no peer access needed),
  // then doubles it there: an eager run sees the foreign buffer as it is.
  auto twice = must(pool1.add_function(
      [](cgt::cuda::Context& ctx, cgt::cuda::Inputs in) {
        cgt::cuda::Buffer local = ctx.allocate_like(in[0]);
        int device = 0;
        (void)cudaGetDevice(&device);
        if (cudaMemcpyPeerAsync(local.data(), device, in[0].data(), in[0].device(), in[0].numel() * sizeof(float),
                                ctx.stream()) != cudaSuccess) {
          throw std::runtime_error("peer copy failed");
        }
        cgt::cuda::Buffer out = ctx.allocate_like(in[0]);
        H1::launch(scenario::in(0) * 2, {local}, {}, out, ctx.stream());
        return cgt::cuda::Values{out};
      },
      {.name = "twice"}));
  const auto on_device0 = H0::make(scenario::HostTensor::iota({32}));
  for (int call = 0; call < 3; ++call) {
    pool1.mark_step_begin();
    auto out = must(twice({on_device0}));
    CHECK(out.kind() == cgt::CallKind::eager);
    CHECK(H1::read(must(out.get(0)).get()).data[5] == 10);
  }
  CHECK(pool1.stats().count(cgt::Reason::input_on_other_device) == 3);
  CHECK(pool1.stats().recordings == 0);
}

TEST_CASE("multi/cuda: a replay from a thread on the other device launches on the pool's and restores the caller's",
          "[gpu][multi-gpu]") {
  require_gpus(2);
  auto pool1 = must(H1::make_pool({}));
  auto add_one = must(H1::add(pool1, scenario::unary("add_one", scenario::in(0) + 1)));
  const auto x = H1::make(scenario::HostTensor::iota({128}));
  for (int call = 0; call < 4; ++call) {
    INFO("call " << call);
    REQUIRE(cudaSetDevice(0) == cudaSuccess);
    pool1.mark_step_begin();
    auto out = must(add_one({x}));
    CHECK(current_device() == 0);  // warm-up, recording and replay each put device 0 back
    const cgt::cuda::Buffer& y = must(out.get(0)).get();
    CHECK(y.device() == 1);
    cudaPointerAttributes attributes{};
    REQUIRE(cudaPointerGetAttributes(&attributes, y.data()) == cudaSuccess);
    CHECK(attributes.device == 1);
    CHECK(H1::read(y).data[7] == 8);
    CHECK(current_device() == 0);  // reading a device-1 buffer too
    if (call >= 2) CHECK(out.kind() == cgt::CallKind::replay);
  }
}
