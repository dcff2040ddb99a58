// cgt.cuda on a GPU: the shared scenario suite with device buffers and CUDA graphs, and the cuda
// backend's own failures. Every test is tagged [gpu] and reports SKIPPED without a device.
#include <catch2/catch_test_macros.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <ostream>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cuda/kernels.hpp"
#include "device_surface.hpp"
#include "scenario/spec.hpp"

import cgt;
import cgt.cuda;

#include "cuda/harness.hpp"
#include "scenario/register.hpp"

using H = CudaHarness;
using scenario::must;

// The device a program reaches (`pool.device()`) offers its own members, none of the engine's side.
static_assert(!cgt_test::offers_the_engine_side<cgt::cuda::Device>);
static_assert(requires(cgt::cuda::Device& d, const cgt::cuda::Device& producer) {
  d.stream();
  d.arena();
  d.synchronize();
  d.wait_for(producer);
  d.graph_counts();
});
// Its memory is there to look at, not to change (the engine's); a device that handed out its arena
// would allow it.
struct HandsOutItsArena {
  cgt::cuda::Arena& arena();
};
static_assert(!cgt_test::allocates_through_its_arena<cgt::cuda::Device>);
static_assert(cgt_test::allocates_through_its_arena<HandsOutItsArena>);

#define REQUIRE_GPU() scenario::skip_unless_available<H>()

// The shared scenario suite (scenario/register.hpp), named "cuda/<scenario>" and tagged [gpu].
namespace {
const bool registered = scenario::register_scenarios<H>("cuda/", "[gpu]");
}  // namespace

// Strides are part of what a replay checks: the transpose of a recorded input gets a recording of
// its own and reads right (it used to replay the graph of the other layout, or fail).
TEST_CASE("cuda/a copied input with other strides than recorded gets its own recording and reads right", "[gpu]") {
  REQUIRE_GPU();
  auto pool = must(H::make_pool({}));
  auto f = must(H::add(pool, scenario::unary("f", scenario::in(0) + 1)));
  const auto square = H::make(scenario::HostTensor::iota({4, 4}));
  for (int i = 0; i < 3; ++i) {
    pool.mark_step_begin();
    (void)must(f({square}));
  }
  for (int i = 0; i < 3; ++i) {
    pool.mark_step_begin();
    const auto transposed = must(f({square.with_layout(square.layout().transposed())}));
    const auto values = H::read(must(transposed.get(0)).get()).data;
    CHECK(values[1] == 5);  // element (0, 1) of the transpose is element (1, 0) of the square
    CHECK(values[4] == 2);
  }
  pool.mark_step_begin();
  const auto again = must(f({square}));
  CHECK(H::read(must(again.get(0)).get()).data[5] == 6);
  CHECK(pool.stats().replays >= 3);
}

// Replays copy inputs into their slots by one kernel per eight inputs: ten inputs of different
// sizes take two launches, and every element of every input must arrive.
TEST_CASE("cuda/ten copied inputs of different sizes all reach the graph on every replay", "[gpu]") {
  REQUIRE_GPU();
  constexpr int count = 10;
  auto pool = must(H::make_pool({}));
  auto total = must(pool.add_function(
      [](cgt::cuda::Context& ctx, cgt::cuda::Inputs in) {
        // out[e] = the sum over inputs i of in[i][e % numel(i)], by sum_inputs over rotating views
        const std::int64_t n = 1024;
        cgt::cuda::Buffer acc = ctx.allocate(cgt::ElementType::f32, {n});
        (void)cudaMemsetAsync(acc.data(), 0, n * sizeof(float), ctx.stream());
        for (std::size_t i = 0; i < in.size(); ++i) {
          const std::int64_t size = static_cast<std::int64_t>(in[i].numel());
          for (std::int64_t start = 0; start < n; start += size) {
            (void)cgt_test::sum_inputs(acc.as<float>() + start, in[i].as<float>(), nullptr, nullptr,
                                       acc.as<float>() + start, std::min(size, n - start), ctx.stream());
          }
        }
        return cgt::cuda::Values{acc};
      },
      {.name = "total"}));
  for (int step = 0; step < 4; ++step) {
    std::vector<scenario::HostTensor> hosts;
    std::vector<H::Value> inputs;
    for (int i = 0; i < count; ++i) {
      scenario::HostTensor t = scenario::HostTensor::iota({std::int64_t{8} << (i % 8)});  // 8 .. 1024 floats
      for (double& x : t.data) x = x * (i + 1) + step;
      hosts.push_back(t);
      inputs.push_back(H::make(t));
    }
    const std::vector<cgt::cuda::Arg> args(inputs.begin(), inputs.end());
    pool.mark_step_begin();
    auto outputs = must(total(args));
    const auto out = H::read(must(outputs.get(0)).get());
    for (std::size_t e = 0; e < out.data.size(); ++e) {
      double expected = 0;
      for (const auto& t : hosts) expected += t.data[e % t.data.size()];
      REQUIRE(out.data[e] == expected);
    }
  }
  CHECK(pool.stats().replays >= 2);
}

// A static input that moves is re-recorded as a sibling (PyTorch's rule), and the re-recording,
// of the same topology, updates the first graph's executable instead of instantiating another.
// Both addresses keep replaying correctly, each loading its graph back when the other ran last.
TEST_CASE("cuda/a moved static input updates the recorded graph in place, and every address still replays", "[gpu]") {
  REQUIRE_GPU();
  for (const bool in_place : {true, false}) {
    INFO("update_graphs_in_place = " << in_place);
    cgt::cuda::PoolOptions options;
    options.update_graphs_in_place = in_place;
    options.poison_dead_memory = true;
    auto pool = must(cgt::cuda::make_pool(std::move(options)));
    auto scale = must(H::add(
        pool, scenario::FnSpec{
                  "scale", {scenario::map(scenario::in(0) * scenario::in(1))}, {scenario::temp_out(0)}, {}, {1}, {}}));
    std::vector<H::Value> weights;
    for (int w = 0; w < 3; ++w) weights.push_back(H::make(scenario::HostTensor::full({4}, w + 2)));
    // weight 0: warm-up, then the first recording; weights 1 and 2: re-recordings; then replays
    // that alternate between the three graphs.
    const std::vector<int> order{0, 0, 1, 2, 0, 1, 2, 1, 0};
    for (std::size_t step = 0; step < order.size(); ++step) {
      const auto w = static_cast<std::size_t>(order[step]);
      const auto x = static_cast<double>(step + 1);
      pool.mark_step_begin();
      auto out = must(scale({H::make(scenario::HostTensor::full({4}, x)), weights[w]}));
      CHECK(H::read(must(out.get(0)).get()).data[3] == x * static_cast<double>(w + 2));
      CHECK(out.kind() ==
            (step == 0 ? cgt::CallKind::warmup : (step < 4 ? cgt::CallKind::recording : cgt::CallKind::replay)));
    }
    CHECK(pool.stats().rerecords == 2);
    const cgt::cuda::GraphCounts& counts = must(pool.device()).get().graph_counts();
    CHECK(counts.instantiated == (in_place ? 1U : 3U));
    CHECK(counts.updated_in_place == (in_place ? 2U : 0U));
    CHECK(counts.switched == (in_place ? 5U : 0U));
  }
}

// Tagged [provokes-api-errors]: the CUDA runtime reports the failed capture, and
// scripts/gpu.sh memcheck runs it under memcheck apart, with API error reports off.
// take() copies an output after the work that wrote it, also from a pool whose stream is
// non-blocking (not ordered with the legacy default stream that cudaMemcpy uses): 2000 kernels
// that each add 1 run for milliseconds, and the copy must see all of them.
TEST_CASE("cuda/take copies an output after the pool's work, on a non-blocking stream too", "[gpu]") {
  REQUIRE_GPU();
  constexpr std::int64_t n = 1024;
  constexpr int adds = 2000;
  auto pool = must(cgt::cuda::make_pool({.device = 0, .blocking_stream = false}));
  auto slow = must(pool.add_function(
      [](cgt::cuda::Context& ctx, cgt::cuda::Inputs in) {
        cgt::cuda::Buffer out = ctx.allocate(cgt::ElementType::f32, {n});
        if (cgt_test::sum_inputs(in[0].as<float>(), nullptr, nullptr, nullptr, out.as<float>(), n, ctx.stream()) !=
                cudaSuccess ||
            cgt_test::add_repeatedly(out.as<float>(), n, 1.0F, adds, ctx.stream()) != cudaSuccess) {
          throw std::runtime_error("a launch failed");
        }
        return cgt::cuda::Values{out};
      },
      {.name = "slow"}));
  const auto zeros = must(cgt::cuda::Buffer::make(cgt::ElementType::f32, {n}));
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);  // made on the legacy stream: order it yourself
  for (const cgt::CallKind kind : {cgt::CallKind::warmup, cgt::CallKind::recording, cgt::CallKind::replay}) {
    pool.mark_step_begin();
    auto out = must(slow({zeros}));
    CHECK(out.kind() == kind);
    const cgt::cuda::Buffer kept = must(out.take(0));
    const std::vector<double> values = must(kept.read());
    CHECK(values.front() == adds);
    CHECK(values.back() == adds);
  }
}

// A function that synchronises cannot be captured. Its recording's failure carries the cause
// `uncapturable` (as on the host and torch backends), so the engine runs it eagerly at those
// shapes from then on, with Reason::capture_failed logged once, and its values are right; the
// pool holds nothing of the broken capture and still records other functions.
TEST_CASE("cuda/work that cannot be captured runs eagerly with Reason::capture_failed, and the pool stays usable",
          "[gpu][provokes-api-errors]") {
  REQUIRE_GPU();
  std::vector<cgt::Reason> logged;
  cgt::Options options{.skip_warmup = true};
  options.log_sink = [&logged](const cgt::Event& event) { logged.push_back(event.reason); };
  auto pool = must(H::make_pool(std::move(options)));
  auto syncing = must(pool.add_function(
      [](cgt::cuda::Context& ctx, cgt::cuda::Inputs in) {
        cgt::cuda::Buffer y = ctx.allocate_like(in[0]);
        const auto n = static_cast<std::int64_t>(in[0].numel());
        (void)cudaMemsetAsync(y.data(), 0, n * sizeof(float), ctx.stream());
        (void)cgt_test::sum_inputs(in[0].as<float>(), in[0].as<float>(), nullptr, nullptr, y.as<float>(), n,
                                   ctx.stream());
        (void)cudaDeviceSynchronize();  // not allowed while the stream is captured
        return cgt::cuda::Values{y};
      },
      {.name = "syncing"}));
  for (int call = 0; call < 3; ++call) {
    pool.mark_step_begin();
    auto out = must(syncing({H::make(scenario::HostTensor::full({8}, 1 + call))}));
    CHECK(out.kind() == cgt::CallKind::eager);
    CHECK(H::read(must(out.get(0)).get()).data[0] == 2 * (1 + call));
  }
  CHECK(std::ranges::count(logged, cgt::Reason::capture_failed) == 1);
  CHECK(pool.stats().by_reason[static_cast<std::size_t>(cgt::Reason::capture_failed)] >= 1);
  CHECK(pool.stats().recordings == 0);
  auto f = must(H::add(pool, scenario::unary("f", scenario::in(0) * 2)));
  pool.mark_step_begin();
  const auto out_f = must(f({H::make(scenario::HostTensor::full({8}, 3))}));
  CHECK(out_f.kind() == cgt::CallKind::recording);
  CHECK(H::read(must(out_f.get(0)).get()).data[0] == 6);
}

TEST_CASE("cuda/make_pool without a usable device fails cleanly", "[cuda]") {
  auto pool = cgt::cuda::make_pool({.device = 99});
  REQUIRE(!pool);
  CHECK(pool.error().code == cgt::Errc::backend_error);
}

// --- Hostile sizes and layouts -------------------------------------------------------------------

TEST_CASE("cuda/Buffer::make refuses sizes whose byte count overflows or is negative with invalid_argument", "[cuda]") {
  // Checked before any CUDA call: runs without a device too.
  constexpr std::int64_t huge = std::int64_t{1} << 62;
  for (const std::vector<std::int64_t>& sizes : {std::vector<std::int64_t>{huge + 1}, std::vector<std::int64_t>{-1},
                                                 std::vector<std::int64_t>{1, 1, 1, 1, 1, 1, 1}}) {
    auto made = cgt::cuda::Buffer::make(cgt::ElementType::f32, sizes);
    REQUIRE(!made);
    CHECK(made.error().code == cgt::Errc::invalid_argument);
  }
}

TEST_CASE("cuda/Context::allocate with a bad size fails the call with invalid_argument and frees the call's blocks",
          "[gpu]") {
  REQUIRE_GPU();
  auto pool = must(H::make_pool({}));
  auto f = must(pool.add_function(
      [](cgt::cuda::Context& ctx, cgt::cuda::Inputs in) {
        cgt::cuda::Buffer first = ctx.allocate(cgt::ElementType::f32, {64});
        if (in.scalar(0) != 0) (void)ctx.allocate(cgt::ElementType::f32, {in.scalar(0)});
        return cgt::cuda::Values{first};
      },
      {.name = "bad_size"}));
  for (const std::int64_t bad : {(std::int64_t{1} << 62) + 1, std::int64_t{-5}}) {
    auto out = f({bad});
    REQUIRE(!out);
    CHECK(out.error().code == cgt::Errc::invalid_argument);
    CHECK(pool.live_blocks().empty());
  }
}

TEST_CASE("cuda/a copied input with overlapping or negative strides is gathered into its slot, on every replay",
          "[gpu]") {
  REQUIRE_GPU();
  auto pool = must(H::make_pool({.skip_warmup = true, .debug_checks = true}));
  const auto storage = H::make(scenario::HostTensor::iota({9}));
  const std::int64_t sizes[] = {3, 3};
  const std::int64_t overlapping[] = {1, 1};  // (i, j) reads element i + j
  const std::int64_t reversed[] = {-3, -1};   // from offset 8: (i, j) reads element 8 - 3i - j
  const cgt::cuda::Buffer views[] = {storage.with_layout(storage.layout().restrided(0, sizes, overlapping)),
                                     storage.with_layout(storage.layout().restrided(8, sizes, reversed))};
  auto f = must(H::add(pool, scenario::unary("f", scenario::in(0) + 1)));
  for (int call = 0; call < 3; ++call) {
    const double scale = call + 1.0;  // new values in the caller's storage before every call
    scenario::HostTensor values = scenario::HostTensor::iota({9});
    for (double& v : values.data) v *= scale;
    H::write(storage, values);
    for (std::size_t v = 0; v < 2; ++v) {
      pool.mark_step_begin();
      auto out = must(f({views[v]}));
      CHECK(out.kind() == (call == 0 ? cgt::CallKind::recording : cgt::CallKind::replay));
      const auto got = H::read(must(out.get(0)).get()).data;
      for (int i = 0; i < 3; ++i) {
        for (int j = 0; j < 3; ++j) {
          const int element = v == 0 ? i + j : 8 - 3 * i - j;
          CHECK(got[static_cast<std::size_t>(3 * i + j)] == element * scale + 1);
        }
      }
    }
  }
}

TEST_CASE("cuda/a held empty output does not stop the next call from replaying", "[gpu]") {
  REQUIRE_GPU();
  auto pool = must(H::make_pool({}));
  auto f = must(pool.add_function(
      [](cgt::cuda::Context& ctx, cgt::cuda::Inputs /*in*/) {
        cgt::cuda::Buffer y = ctx.allocate(cgt::ElementType::f32, {4});
        (void)cgt_test::add_repeatedly(y.as<float>(), 4, 1.0F, 1, ctx.stream());
        return cgt::cuda::Values{y, ctx.allocate(cgt::ElementType::f32, {0})};
      },
      {.name = "with_empty"}));
  std::vector<cgt::cuda::OutputLease> held;
  for (int call = 0; call < 6; ++call) {
    auto out = must(f({H::make(scenario::HostTensor::full({4}, 1))}));
    CHECK(must(out.get(1)).get().numel() == 0);
    held.push_back(must(out.release(1)));  // keep only the empty output
  }
  CHECK(pool.stats().recordings == 1);
  CHECK(pool.stats().replays == 4);
}

// A replay asks the driver whether its pool's context is the thread's current one, and only when
// it is not asks the runtime for the current device. A thread that has never used CUDA has no
// current context: its first replay takes the runtime's way (which makes the device current), its
// next ones the driver's; both launch the graph on the pool's device and read right.
TEST_CASE("cuda/replays from threads that never used CUDA launch on the pool's device and read right", "[gpu]") {
  REQUIRE_GPU();
  auto pool = must(H::make_pool({}));
  auto f = must(pool.add_function(
      [](cgt::cuda::Context& ctx, cgt::cuda::Inputs in) {
        cgt::cuda::Buffer out = ctx.allocate(cgt::ElementType::f32, {4});
        if (cgt_test::sum_inputs(in[0].as<float>(), nullptr, nullptr, nullptr, out.as<float>(), 4, ctx.stream()) !=
                cudaSuccess ||
            cgt_test::add_repeatedly(out.as<float>(), 4, 1.0F, 1, ctx.stream()) != cudaSuccess) {
          throw std::runtime_error("a launch failed");
        }
        return cgt::cuda::Values{out};
      },
      {.name = "plus_one", .static_inputs = {0}}));
  const auto x = H::make(scenario::HostTensor::full({4}, 2));
  for (int call = 0; call < 2; ++call) (void)must(f({x}));  // warmed up and recorded on this thread
  for (int thread = 0; thread < 3; ++thread) {
    std::vector<std::vector<double>> seen;
    std::vector<cgt::CallKind> kinds;
    std::thread([&] {
      for (int call = 0; call < 3; ++call) {
        auto out = must(f({x}));
        kinds.push_back(out.kind());
        seen.push_back(must(must(out.take(0)).read()));
      }
    }).join();
    CHECK(kinds == std::vector<cgt::CallKind>(3, cgt::CallKind::replay));
    CHECK(seen == std::vector<std::vector<double>>(3, std::vector<double>(4, 3.0)));
  }
  CHECK(pool.stats().replays == 9);
}

TEST_CASE("cuda/a recording that runs out of pool memory runs its call eagerly and keeps nothing; a later call records",
          "[gpu]") {
  REQUIRE_GPU();
  cgt::cuda::PoolOptions options;
  options.tree.debug_checks = true;
  options.arena = {.segment_bytes = std::size_t{1} << 20, .max_bytes = std::size_t{4} << 20};
  auto pool = must(cgt::cuda::make_pool(std::move(options)));
  // While recording it also needs a scratch block as large as `scratch` says (8 MiB: past the
  // arena's limit) until the program asks less.
  const auto scratch = std::make_shared<std::int64_t>(std::int64_t{2} << 20);
  auto copy = must(pool.add_function(
      [scratch](cgt::cuda::Context& ctx, cgt::cuda::Inputs in) {
        if (ctx.is_capturing()) (void)ctx.allocate(cgt::ElementType::f32, {*scratch});
        cgt::cuda::Buffer y = ctx.allocate_like(in[0]);
        (void)cgt_test::sum_inputs(in[0].as<float>(), nullptr, nullptr, nullptr, y.as<float>(), in[0].numel(),
                                   ctx.stream());
        return cgt::cuda::Values{y};
      },
      {.name = "scratchy"}));
  auto input = [](float value) {
    cgt::cuda::Buffer x = must(cgt::cuda::Buffer::make(cgt::ElementType::f32, {256}));
    must(x.write(std::vector<double>(256, value)));
    return x;
  };
  pool.mark_step_begin();
  CHECK(must(copy({input(1)})).kind() == cgt::CallKind::warmup);
  const cgt::MemoryInfo before = pool.memory();
  for (const float value : {2.0F, 3.0F}) {
    pool.mark_step_begin();
    auto out = must(copy({input(value)}));
    CHECK(out.kind() == cgt::CallKind::eager);
    CHECK(must(must(out.get(0)).get().read()) == std::vector<double>(256, value));
    CHECK(pool.memory().allocated_bytes == before.allocated_bytes);
    CHECK(pool.memory().live_blocks == before.live_blocks);
  }
  CHECK(pool.stats().count(cgt::Reason::out_of_memory) == 2);
  must(pool.check_memory());
  *scratch = 16;
  pool.mark_step_begin();
  CHECK(must(copy({input(4)})).kind() == cgt::CallKind::recording);
  pool.mark_step_begin();
  auto replayed = must(copy({input(5)}));
  CHECK(replayed.kind() == cgt::CallKind::replay);
  CHECK(must(must(replayed.get(0)).get().read()) == std::vector<double>(256, 5));
}

TEST_CASE("cuda/a recording that needs a segment its warm-up did not records (the arena grows during the capture)",
          "[gpu]") {
  REQUIRE_GPU();
  auto pool = must(H::make_pool({.debug_checks = true}));
  // The warm-up allocates nothing of the pool; the recording allocates a scratch block (its
  // arena then has no segment yet, and obtains one while the stream captures).
  auto f = must(pool.add_function(
      [](cgt::cuda::Context& ctx, cgt::cuda::Inputs in) {
        if (ctx.is_capturing()) {
          const cgt::cuda::Buffer scratch =
              ctx.allocate(cgt::ElementType::f32, {static_cast<std::int64_t>(in[0].numel())});
          (void)cgt_test::sum_inputs(in[0].as<float>(), nullptr, nullptr, nullptr, scratch.as<float>(), in[0].numel(),
                                     ctx.stream());
        }
        (void)cgt_test::add_repeatedly(in[0].as<float>(), static_cast<std::int64_t>(in[0].numel()), 1, 1, ctx.stream());
        return cgt::cuda::Values{};
      },
      {.name = "grows", .static_inputs = {0}, .mutated_inputs = {0}}));
  const cgt::cuda::Buffer x = must(cgt::cuda::Buffer::make(cgt::ElementType::f32, {64}));
  must(x.write(std::vector<double>(64, 0)));
  std::vector<cgt::CallKind> kinds;
  for (int call = 0; call < 4; ++call) {
    pool.mark_step_begin();
    kinds.push_back(must(f({x})).kind());
  }
  CHECK(kinds == std::vector<cgt::CallKind>{cgt::CallKind::warmup, cgt::CallKind::recording, cgt::CallKind::replay,
                                            cgt::CallKind::replay});
  CHECK(must(x.read()) == std::vector<double>(64, 4));
  CHECK(pool.stats().eager_calls == 0);
}
