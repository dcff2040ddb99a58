// Every Errc, triggered on the host backend: the call fails with the code and a message naming
// the function, the pool stays usable, and nothing the caller holds is lost or changed.
#include "host/host_test.hpp"
#include "backend_of.hpp"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <functional>
#include <latch>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "device_surface.hpp"

// A fake device stands in for the host one, through the backend interface.
import cgt.core;

#include "host/forwarding.hpp"

using cgt::host::ElementType;
using scenario::HostTensor;

// backend::Device offers every member tests/device_surface.hpp looks for: the backends' devices,
// which offer none of them to a program, are checked against requirements that can hold.
static_assert(cgt_test::offers_all_of_the_engine_side<cgt::backend::Device>);

namespace {

// A host device that fails on request, for the failures a real device can have.
class FlakyDevice final : public host_test::ForwardingDevice {
 public:
  bool fail_replay = false;
  bool fail_checkpoint = false;
  bool leak_a_block = false;  // the next warm-up leaves a block allocated that no output uses

  cgt::Result<cgt::backend::RunResult> run(cgt::backend::Invoker& fn, std::span<const cgt::backend::ArgSlot> args,
                                           cgt::backend::RunMode mode) override {
    if (leak_a_block && mode == cgt::backend::RunMode::warmup) {
      leak_a_block = false;
      // A warm-up of its own whose output it keeps: its block stays allocated, and no lease holds it.
      auto leaked = inner().run(*leaker_, {}, cgt::backend::RunMode::warmup);
      if (leaked) leaked_ = std::move(*leaked);
    }
    return inner().run(fn, args, mode);
  }
  cgt::Result<std::unique_ptr<cgt::backend::Capture>> begin_recording(cgt::backend::Invoker& fn,
                                                                      std::span<const cgt::backend::ArgSlot> args,
                                                                      const cgt::backend::RecordPlan& plan) override {
    auto capture = inner().begin_recording(fn, args, plan);
    if (!capture) return capture;
    return std::make_unique<FlakyCapture>(std::move(*capture), *this);
  }
  cgt::Result<std::unique_ptr<cgt::backend::Checkpoint>> checkpoint() override {
    if (fail_checkpoint) return cgt::fail(cgt::Errc::backend_error, "injected: checkpoint failed");
    return inner().checkpoint();
  }

 private:
  std::unique_ptr<cgt::backend::Invoker> leaker_ =
      cgt_test::BackendOf<cgt::host::Pool>::make_invoker([](cgt::host::Context& ctx, cgt::host::Inputs /*in*/) {
        return cgt::host::Values{ctx.allocate(ElementType::f32, {16})};
      });
  std::optional<cgt::backend::RunResult> leaked_;

  // The host's recording in progress, whose recording replays through a FlakyRecording.
  class FlakyCapture final : public host_test::ForwardingCapture {
   public:
    FlakyCapture(std::unique_ptr<cgt::backend::Capture> inner, FlakyDevice& device)
        : ForwardingCapture(std::move(inner)), device_(device) {}
    cgt::Result<cgt::backend::Recorded> finish() override {
      auto recorded = ForwardingCapture::finish();
      if (recorded) recorded->recording = std::make_unique<FlakyRecording>(std::move(recorded->recording), device_);
      return recorded;
    }

   private:
    FlakyDevice& device_;
  };

  class FlakyRecording final : public cgt::backend::Recording {
   public:
    FlakyRecording(std::unique_ptr<cgt::backend::Recording> inner, FlakyDevice& device)
        : inner_(std::move(inner)), device_(device) {}
    cgt::Result<void> replay(std::span<const cgt::backend::ArgSlot> args) override {
      if (device_.fail_replay) return cgt::fail(cgt::Errc::backend_error, "injected: graph launch failed");
      return inner_->replay(args);
    }
    void bind_outputs(std::span<cgt::backend::StorageHandle* const> storages) override {
      inner_->bind_outputs(storages);
    }
    const void* output(std::size_t i) const override { return inner_->output(i); }

   private:
    std::unique_ptr<cgt::backend::Recording> inner_;
    FlakyDevice& device_;
  };
};

struct FlakyPool {
  FlakyDevice* device;
  cgt::host::Pool pool;
};

FlakyPool make_flaky_pool(cgt::Options options = {}) {
  auto device = std::make_unique<FlakyDevice>();
  FlakyDevice* raw = device.get();
  return {raw, *cgt::backend::make_pool<cgt::host::Pool>(std::move(device), std::move(options))};
}

double first_value(const cgt::host::Outputs& outputs) {
  return must(outputs.get(0)).get().get(0);
}

// y = 2 x, allocating in the pool.
cgt::host::Function twice(cgt::host::Pool& pool, std::string name = "twice") {
  return must(pool.add_function(
      [](cgt::host::Context& ctx, cgt::host::Inputs in) {
        Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, 2 * x.get(i));
        });
        return cgt::host::Values{y};
      },
      {.name = std::move(name)}));
}

bool names_function(const cgt::Error& error, const std::string& name) {
  return error.function == name && error.message.find("'" + name + "'") != std::string::npos;
}

}  // namespace

TEST_CASE("wrong_input_count: a call with another number of inputs than the first", "[errors][host]") {
  auto pool = must(cgt::host::make_pool());
  auto f = twice(pool);
  const Buffer x = filled({4}, 1);
  CHECK(first_value(must(f({x}))) == 2);
  auto out = f({x, x});
  REQUIRE(!out);
  CHECK(out.error().code == cgt::Errc::wrong_input_count);
  CHECK(names_function(out.error(), "twice"));
  CHECK(first_value(must(f({x}))) == 2);  // the function still works
}

TEST_CASE("wrong_input_type: another element type, or a scalar for a value", "[errors][host]") {
  auto pool = must(cgt::host::make_pool());
  auto f = twice(pool);
  (void)must(f({filled({4}, 1)}));
  auto as_int = f({must(Buffer::make(ElementType::i32, {4}))});
  REQUIRE(!as_int);
  CHECK(as_int.error().code == cgt::Errc::wrong_input_type);
  CHECK(as_int.error().input == 0);
  CHECK(names_function(as_int.error(), "twice"));
  CHECK(as_int.error().message.find("element type i32, but its first call had f32") != std::string::npos);
  auto as_scalar = f({std::int64_t{3}});
  REQUIRE(!as_scalar);
  CHECK(as_scalar.error().code == cgt::Errc::wrong_input_type);
}

TEST_CASE("wrong_shape: another rank than the first call", "[errors][host]") {
  auto pool = must(cgt::host::make_pool());
  auto f = twice(pool);
  (void)must(f({filled({4}, 1)}));
  CHECK(must(f({filled({8}, 1)})).kind() == cgt::CallKind::warmup);  // other sizes are a new shape key
  auto out = f({filled({2, 2}, 1)});
  REQUIRE(!out);
  CHECK(out.error().code == cgt::Errc::wrong_shape);
  CHECK(out.error().message.find("ranks may not") != std::string::npos);
}

TEST_CASE("output_overwritten: a lease used after a new step reclaimed it", "[errors][host]") {
  auto pool = must(cgt::host::make_pool());
  auto f = twice(pool);
  auto out = must(f({filled({4}, 1)}));
  pool.mark_step_begin();
  CHECK(must(out.get(0)).get().get(0) == 2);  // still valid until the next call
  (void)must(f({filled({4}, 3)}));
  auto value = out.get(0);
  REQUIRE(!value);
  CHECK(value.error().code == cgt::Errc::output_overwritten);
  CHECK(names_function(value.error(), "twice"));
  CHECK(value.error().message.find("take()") != std::string::npos);
  CHECK(value.error().message.find("mark_step_begin()") != std::string::npos);
  CHECK(!must(out.release(0)).is_valid());
  // A value taken before the next step survives it.
  auto kept = must(f({filled({4}, 5)}));
  const Buffer copy = must(kept.take(0));
  pool.mark_step_begin();
  (void)must(f({filled({4}, 7)}));
  CHECK(copy.get(0) == 10);
  // Passing a reclaimed lease into a call fails before anything runs.
  auto stale = must(kept.release(0));
  auto call = f({stale});
  REQUIRE(!call);
  CHECK(call.error().code == cgt::Errc::output_overwritten);
  CHECK(call.error().input == 0);
}

TEST_CASE("pool_shut_down: calls and leases after shutdown()", "[errors][host]") {
  auto pool = must(cgt::host::make_pool());
  auto f = twice(pool);
  auto out = must(f({filled({4}, 1)}));
  must(pool.shutdown());
  CHECK(pool.is_shut_down());
  auto value = out.get(0);
  REQUIRE(!value);
  CHECK(value.error().code == cgt::Errc::pool_shut_down);
  auto call = f({filled({4}, 1)});
  REQUIRE(!call);
  CHECK(call.error().code == cgt::Errc::pool_shut_down);
  CHECK(names_function(call.error(), "twice"));
  auto added = pool.add_function([](cgt::host::Context&, cgt::host::Inputs) { return cgt::host::Values{}; });
  REQUIRE(!added);
  CHECK(added.error().code == cgt::Errc::pool_shut_down);
  CHECK(pool.live_blocks().empty());
  must(pool.shutdown());  // twice is fine
}

TEST_CASE("dropping the Pool handle alone breaks neither functions nor leases", "[errors][host]") {
  std::optional<cgt::host::Function> f;
  std::optional<cgt::host::Outputs> out;
  {
    auto pool = must(cgt::host::make_pool());
    f.emplace(twice(pool));
    out.emplace(must((*f)({filled({4}, 1)})));
  }
  CHECK(first_value(*out) == 2);
  auto again = must((*f)({filled({4}, 2)}));
  CHECK(first_value(again) == 4);
  f.reset();  // the leases still hold the pool's memory
  CHECK(first_value(*out) == 2);
  CHECK(first_value(again) == 4);
}

TEST_CASE("static_input_moved: a static input at a new address, when set to fail", "[errors][host]") {
  auto pool = must(cgt::host::make_pool({.tree = {.on_static_input_moved = cgt::OnStaticInputMoved::error}}));
  auto scale = must(pool.add_function(
      [](cgt::host::Context& ctx, cgt::host::Inputs in) {
        Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], w = in[1], y] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, x.get(i) * w.get(i));
        });
        return cgt::host::Values{y};
      },
      {.name = "scale", .static_inputs = {1}}));
  const Buffer weight = filled({4}, 3), moved_weight = filled({4}, 3);
  for (int i = 0; i < 3; ++i) {
    pool.mark_step_begin();
    CHECK(first_value(must(scale({filled({4}, 1), weight}))) == 3);
  }
  pool.mark_step_begin();
  auto out = scale({filled({4}, 1), moved_weight});
  REQUIRE(!out);
  CHECK(out.error().code == cgt::Errc::static_input_moved);
  CHECK(out.error().input == 1);
  CHECK(names_function(out.error(), "scale"));
  CHECK(first_value(must(scale({filled({4}, 1), weight}))) == 3);
}

TEST_CASE("graph_unavailable: or_error turns a fallback into an error", "[errors][host]") {
  auto pool = must(cgt::host::make_pool({.tree = {.or_error = true}}));
  auto mut = must(HostHarness::add(
      pool,
      scenario::FnSpec{"mut", {scenario::mutate(0, scenario::in(0) + 1)}, {scenario::input_out(0)}, {}, {}, {0}}));
  const Buffer x = filled({4}, 1);
  auto out = mut({x});
  REQUIRE(!out);
  CHECK(out.error().code == cgt::Errc::graph_unavailable);
  CHECK(names_function(out.error(), "mut"));
  CHECK(out.error().message.find("mutates an input") != std::string::npos);
  CHECK(x.get(0) == 1);  // nothing ran
  CHECK(pool.stats().eager_calls == 0);
}

TEST_CASE("function_failed: a function that throws while warming up or recording", "[errors][host]") {
  auto pool = must(cgt::host::make_pool({.tree = {.debug_checks = true}}));
  bool should_throw = false;
  auto flaky = must(pool.add_function(
      [&](cgt::host::Context& ctx, cgt::host::Inputs in) {
        Buffer y = ctx.allocate_like(in[0]);
        Buffer scratch = ctx.allocate_like(in[0]);
        if (should_throw) throw std::runtime_error("boom");
        ctx.launch([x = in[0], y, scratch] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, x.get(i) + 1);
        });
        return cgt::host::Values{y};
      },
      {.name = "flaky"}));
  auto keep = twice(pool, "keep");
  auto held = must(keep({filled({4}, 1)}));  // a live output the failures must not touch
  const auto blocks = pool.live_blocks().size();

  should_throw = true;  // the warm-up throws
  auto warm = flaky({filled({4}, 1)});
  REQUIRE(!warm);
  CHECK(warm.error().code == cgt::Errc::function_failed);
  CHECK(warm.error().message.find("boom") != std::string::npos);
  CHECK(names_function(warm.error(), "flaky"));
  CHECK(pool.live_blocks().size() == blocks);
  CHECK(first_value(held) == 2);

  should_throw = false;  // the warm-up succeeds
  CHECK(first_value(must(flaky({filled({4}, 1)}))) == 2);
  pool.mark_step_begin();
  held = must(keep({filled({4}, 1)}));
  should_throw = true;  // the recording throws
  (void)must(keep({filled({4}, 2)}));
  const auto blocks_before_recording = pool.live_blocks().size();
  auto recording = flaky({filled({4}, 1)});
  REQUIRE(!recording);
  CHECK(recording.error().code == cgt::Errc::function_failed);
  CHECK(pool.live_blocks().size() == blocks_before_recording);
  CHECK(first_value(held) == 2);
  must(pool.check_memory());
  should_throw = false;
  pool.mark_step_begin();
  for (int i = 0; i < 3; ++i) CHECK(first_value(must(flaky({filled({4}, 4)}))) == 5);
}

TEST_CASE("out_of_memory: the arena's limit is reached", "[errors][host]") {
  auto pool = must(cgt::host::make_pool({.arena = {.segment_bytes = 4096, .max_bytes = 8192}}));
  auto f = twice(pool);
  auto small = must(f({filled({16}, 1)}));
  auto big = f({filled({4096}, 1)});
  REQUIRE(!big);
  CHECK(big.error().code == cgt::Errc::out_of_memory);
  CHECK(big.error().message.find("max_bytes") != std::string::npos);
  CHECK(names_function(big.error(), "twice"));
  CHECK(first_value(small) == 2);
  CHECK(first_value(must(f({filled({16}, 3)}))) == 6);
}

TEST_CASE(
    "out_of_memory in a recording: the pool is put back, the call runs eagerly with its values, and a later "
    "call records once memory came back",
    "[errors][host]") {
  std::vector<cgt::Reason> said;
  auto pool = must(cgt::host::make_pool(
      {.tree = {.debug_checks = true, .log_sink = [&](const cgt::Event& event) { said.push_back(event.reason); }},
       .arena = {.segment_bytes = 4096, .max_bytes = 16384}}));
  // While recording it also needs a scratch block as large as `scratch` says (20,000 bytes: past
  // the arena's limit), until the program asks less.
  const auto scratch = std::make_shared<std::int64_t>(5000);
  auto f = must(pool.add_function(
      [scratch](cgt::host::Context& ctx, cgt::host::Inputs in) {
        if (ctx.is_capturing()) (void)ctx.allocate(cgt::ElementType::f32, {*scratch});
        Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, 2 * x.get(i));
        });
        return cgt::host::Values{y};
      },
      {.name = "scratchy"}));
  pool.mark_step_begin();
  CHECK(must(f({filled({16}, 1)})).kind() == cgt::CallKind::warmup);
  const cgt::MemoryInfo before = pool.memory();
  for (int attempt = 0; attempt < 2; ++attempt) {
    pool.mark_step_begin();
    auto out = must(f({filled({16}, 3)}));
    CHECK(out.kind() == cgt::CallKind::eager);
    CHECK(first_value(out) == 6);
    CHECK(pool.memory().allocated_bytes == before.allocated_bytes);  // nothing of the recording kept
    CHECK(pool.memory().live_blocks == before.live_blocks);
  }
  CHECK(pool.stats().count(cgt::Reason::out_of_memory) == 2);
  CHECK(pool.stats().recordings == 0);
  CHECK(std::ranges::count(said, cgt::Reason::out_of_memory) == 2);
  must(pool.check_memory());
  // The program asks less: the shape records and replays.
  *scratch = 16;
  pool.mark_step_begin();
  CHECK(must(f({filled({16}, 4)})).kind() == cgt::CallKind::recording);
  pool.mark_step_begin();
  auto replayed = must(f({filled({16}, 5)}));
  CHECK(replayed.kind() == cgt::CallKind::replay);
  CHECK(first_value(replayed) == 10);
}

TEST_CASE("backend_error: the device fails a replay or a checkpoint", "[errors][host]") {
  auto [device, pool] = make_flaky_pool();
  auto f = twice(pool);
  for (int i = 0; i < 2; ++i) {
    pool.mark_step_begin();
    (void)must(f({filled({4}, 1)}));
  }
  device->fail_replay = true;
  pool.mark_step_begin();
  auto out = f({filled({4}, 1)});
  REQUIRE(!out);
  CHECK(out.error().code == cgt::Errc::backend_error);
  CHECK(names_function(out.error(), "twice"));
  device->fail_replay = false;
  CHECK(must(f({filled({4}, 2)})).kind() == cgt::CallKind::replay);

  auto g = twice(pool, "g");
  device->fail_checkpoint = true;
  auto recording = g({filled({4}, 1)});
  REQUIRE(!recording);
  CHECK(recording.error().code == cgt::Errc::backend_error);
  device->fail_checkpoint = false;
  CHECK(first_value(must(g({filled({4}, 1)}))) == 2);
}

TEST_CASE("concurrent_use: a second call while one is in flight", "[errors][host]") {
  auto pool = must(cgt::host::make_pool());
  std::optional<cgt::host::Function> inner;
  std::optional<cgt::Error> nested_error;
  auto outer = must(pool.add_function(
      [&](cgt::host::Context& ctx, cgt::host::Inputs in) {
        auto nested = (*inner)({in[0]});  // a pool function calling the same pool
        if (!nested) nested_error = nested.error();
        Buffer y = ctx.allocate_like(in[0]);
        return cgt::host::Values{y};
      },
      {.name = "outer"}));
  inner.emplace(twice(pool, "inner"));
  (void)must(outer({filled({4}, 1)}));
  REQUIRE(nested_error);
  CHECK(nested_error->code == cgt::Errc::concurrent_use);
  CHECK(names_function(*nested_error, "inner"));

  // From another thread while a call blocks.
  std::latch entered(1), release(1);
  auto blocking = must(pool.add_function(
      [&](cgt::host::Context& ctx, cgt::host::Inputs in) {
        entered.count_down();
        release.wait();
        return cgt::host::Values{ctx.allocate_like(in[0])};
      },
      {.name = "blocking"}));
  std::thread first([&] { (void)blocking({filled({4}, 1)}); });
  entered.wait();
  auto second = (*inner)({filled({4}, 1)});
  auto shutdown = pool.shutdown();
  release.count_down();
  first.join();
  REQUIRE(!second);
  CHECK(second.error().code == cgt::Errc::concurrent_use);
  REQUIRE(!shutdown);
  CHECK(shutdown.error().code == cgt::Errc::concurrent_use);
  CHECK(first_value(must((*inner)({filled({4}, 1)}))) == 2);
}

TEST_CASE("invalid_argument: bad indices, empty leases, bad options", "[errors][host]") {
  auto pool = must(cgt::host::make_pool());
  auto f = twice(pool);
  auto out = must(f({filled({4}, 1)}));
  CHECK(out.get(1).error().code == cgt::Errc::invalid_argument);
  CHECK(out.release(5).error().code == cgt::Errc::invalid_argument);
  auto lease = must(out.release(0));
  CHECK(out.get(0).error().code == cgt::Errc::invalid_argument);  // moved out
  cgt::host::OutputLease moved = std::move(lease);
  CHECK(lease.get().error().code == cgt::Errc::invalid_argument);  // NOLINT(bugprone-use-after-move)
  CHECK(moved.get());
  auto bad_static = must(pool.add_function([](cgt::host::Context&, cgt::host::Inputs) { return cgt::host::Values{}; },
                                           {.name = "bad_static", .static_inputs = {3}}));
  auto call = bad_static({filled({4}, 1)});
  REQUIRE(!call);
  CHECK(call.error().code == cgt::Errc::invalid_argument);
  CHECK(names_function(call.error(), "bad_static"));
  auto bad_sizes = must(pool.add_function([](cgt::host::Context&, cgt::host::Inputs) { return cgt::host::Values{}; },
                                          {.name = "bad_sizes", .graph_sizes = {4}, .size_source = {0, 2}}));
  CHECK(bad_sizes({filled({4}, 1)}).error().code == cgt::Errc::invalid_argument);
}

TEST_CASE("invariant_violation: the pool's memory does not match the leases", "[errors][host]") {
  auto [device, pool] = make_flaky_pool({.debug_checks = true});
  auto f = twice(pool);
  device->leak_a_block = true;
  auto out = f({filled({4}, 1)});
  REQUIRE(!out);
  CHECK(out.error().code == cgt::Errc::invariant_violation);
  CHECK(out.error().message.find("no live lease holds it") != std::string::npos);
  CHECK(out.error().function == "twice");
  // check_memory() reports the same on demand.
  auto checked = pool.check_memory();
  REQUIRE(!checked);
  CHECK(checked.error().code == cgt::Errc::invariant_violation);
}

TEST_CASE("every Errc has a name", "[errors][host]") {
  std::set<std::string_view> names;
  for (int code = 1; code <= static_cast<int>(cgt::Errc::nested_capture); ++code) {
    names.insert(cgt::to_string(static_cast<cgt::Errc>(code)));
  }
  CHECK(names.size() == static_cast<std::size_t>(cgt::Errc::nested_capture));
  CHECK(!names.contains("unknown"));
}
