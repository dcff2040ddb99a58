// The capture pipeline's decisions (src/core/capture_pipeline.cpp), each made once for every
// backend: a fake device records through the host's primitives, but reports, on request, a capture
// that broke, a function that failed, a write to an input, node rewrites or an earlier executable
// that fits. Each case is a user's calls, then what the pipeline decided: the error or eager run,
// the counts, which primitives ran, and that a capture given up kept nothing.
#include "host/host_test.hpp"
#include <catch2/generators/catch_generators.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

import cgt.core;

#include "host/forwarding.hpp"

namespace {

// What the fake device reports, instead of what the host's primitives saw.
struct Script {
  bool break_capture = false;          // capture(): the capture broke
  bool fail_function = false;          // capture(): the function failed
  std::optional<std::uint32_t> write;  // written_inputs(): the function wrote this input
  cgt::backend::WritesKnown writes_known = cgt::backend::WritesKnown::at_capture;
  cgt::backend::NodeRewrites rewrites;  // rewrite_nodes()
  bool allows_update = false;           // allows_update_in_place()
  bool fits_earlier = false;            // load_into(): the earlier executable takes the graph
  bool fail_instantiate = false;        // instantiate(): fails
};

// What the pipeline asked of the device.
struct Asked {
  int recordings = 0;  // begin_recording
  int replacing = 0;   // ... naming a recording it redoes (RecordPlan::replaces)
  int loads = 0;       // load_into
  int instantiations = 0;
  int first_runs = 0;
  int write_backs = 0;  // write_back
  int finished = 0;     // finish
  int discarded = 0;    // captures destroyed unfinished
};

class ScriptedDevice final : public host_test::ForwardingDevice {
 public:
  Script script;
  Asked asked;
  cgt::GraphCounts counts;  // where the pipeline counts (a cuda or torch device's graph_counts())

  cgt::Result<std::unique_ptr<cgt::backend::Capture>> begin_recording(cgt::backend::Invoker& fn,
                                                                      std::span<const cgt::backend::ArgSlot> args,
                                                                      const cgt::backend::RecordPlan& plan) override {
    ++asked.recordings;
    if (plan.replaces != nullptr) ++asked.replacing;
    auto capture = inner().begin_recording(fn, args, plan);
    if (!capture) return capture;
    return std::make_unique<ScriptedCapture>(std::move(*capture), *this);
  }

 private:
  class ScriptedCapture final : public host_test::ForwardingCapture {
   public:
    ScriptedCapture(std::unique_ptr<cgt::backend::Capture> inner, ScriptedDevice& device)
        : ForwardingCapture(std::move(inner)), device_(device) {}
    ScriptedCapture(const ScriptedCapture&) = delete;
    ScriptedCapture& operator=(const ScriptedCapture&) = delete;
    ~ScriptedCapture() override {
      if (!finished_) ++device_.asked.discarded;
    }

    cgt::backend::CaptureOutcome capture() override {
      cgt::backend::CaptureOutcome outcome = ForwardingCapture::capture();
      if (script().fail_function && outcome.work) {
        outcome.work = cgt::fail(cgt::Errc::function_failed, "injected: the function failed");
      }
      if (script().break_capture) {
        outcome.broken = true;
        outcome.broken_because = "injected: the stream's capture was invalidated";
      }
      return outcome;
    }
    cgt::backend::WritesKnown writes_known() const noexcept override { return script().writes_known; }
    std::vector<std::uint32_t> written_inputs() const override {
      if (script().write) return {*script().write};
      return {};
    }
    cgt::Result<cgt::backend::NodeRewrites> rewrite_nodes() override { return script().rewrites; }
    bool allows_update_in_place() const noexcept override { return script().allows_update; }
    cgt::Result<bool> load_into(cgt::backend::Recording& /*earlier*/) override {
      ++device_.asked.loads;
      return script().fits_earlier;
    }
    cgt::Result<void> instantiate() override {
      ++device_.asked.instantiations;
      if (script().fail_instantiate) return cgt::fail(cgt::Errc::backend_error, "injected: instantiation failed");
      return ForwardingCapture::instantiate();
    }
    cgt::Result<void> run_first() override {
      ++device_.asked.first_runs;
      return ForwardingCapture::run_first();
    }
    cgt::Result<void> write_back(std::span<const std::uint32_t> inputs) override {
      ++device_.asked.write_backs;
      return ForwardingCapture::write_back(inputs);
    }
    cgt::Result<cgt::backend::Recorded> finish() override {
      ++device_.asked.finished;
      finished_ = true;
      return ForwardingCapture::finish();
    }
    cgt::GraphCounts* counts() noexcept override { return &device_.counts; }

   private:
    [[nodiscard]] const Script& script() const noexcept { return device_.script; }
    ScriptedDevice& device_;
    bool finished_ = false;
  };
};

struct ScriptedPool {
  ScriptedDevice* device;
  cgt::host::Pool pool;
};

// Messages of the events logged for `reason`.
struct Messages {
  cgt::Reason reason;
  std::vector<std::string> seen;
  cgt::LogSink sink() {
    return [this](const cgt::Event& event) {
      if (event.reason == reason) seen.emplace_back(event.message);
    };
  }
};

ScriptedPool scripted_pool(cgt::Options options = {}) {
  if (!options.log_sink) options.log_sink = [](const cgt::Event& /*event*/) {};  // the tests read what they need
  auto device = std::make_unique<ScriptedDevice>();
  ScriptedDevice* raw = device.get();
  return {raw, must(cgt::backend::make_pool<cgt::host::Pool>(std::move(device), std::move(options)))};
}

// y = x * w, in the pool; `static_inputs` as given.
cgt::host::Function scale(cgt::host::Pool& pool, std::vector<std::size_t> static_inputs = {}) {
  return must(pool.add_function(
      [](Context& ctx, Inputs in) {
        Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], w = in[1], y] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, x.get(i) * w.get(i));
        });
        return Values{y};
      },
      {.name = "scale", .static_inputs = std::move(static_inputs)}));
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("capture pipeline: a capture that broke is uncapturable, told in the device's words, and discarded",
          "[host][capture]") {
  const bool function_failed_too = GENERATE(false, true);
  Messages failures{cgt::Reason::capture_failed};
  auto [device, pool] = scripted_pool({.log_sink = failures.sink()});
  auto f = scale(pool);
  const Buffer x = filled({4}, 2);
  const Buffer w = filled({4}, 3);
  CHECK(must(f({x, w})).kind() == K::warmup);
  device->script.break_capture = true;
  device->script.fail_function = function_failed_too;
  {
    // Broken, whatever the function returned: the shape runs eagerly for good, and this call too.
    auto out = must(f({x, w}));
    CHECK(out.kind() == K::eager);
    CHECK(output_values(out, 0) == repeat(6));
  }
  CHECK(device->asked.recordings == 1);
  CHECK(device->asked.discarded == 1);
  CHECK(device->asked.instantiations == 0);
  CHECK(pool.memory().allocated_bytes == 0);  // the slots and the capture's output went back
  CHECK(pool.stats().count(cgt::Reason::capture_failed) == 1);
  REQUIRE(failures.seen.size() == 1);
  CHECK(contains(failures.seen[0], "capture failed: injected: the stream's capture was invalidated"));
  CHECK(contains(failures.seen[0], "; the function reported: injected: the function failed") == function_failed_too);
  CHECK(must(f({x, w})).kind() == K::eager);
  CHECK(device->asked.recordings == 1);  // never recorded again
}

TEST_CASE("capture pipeline: a function that fails in an intact capture fails the call with its own error",
          "[host][capture]") {
  auto [device, pool] = scripted_pool();
  auto f = scale(pool);
  const Buffer x = filled({4}, 2);
  const Buffer w = filled({4}, 3);
  (void)must(f({x, w}));  // warm-up
  device->script.fail_function = true;
  auto failed = f({x, w});
  REQUIRE(!failed);
  CHECK(failed.error().code == cgt::Errc::function_failed);
  CHECK(failed.error().cause == cgt::Cause::unspecified);
  CHECK(contains(failed.error().message, "'scale' failed while recording: injected: the function failed"));
  CHECK(device->asked.discarded == 1);
  CHECK(pool.memory().allocated_bytes == 0);
  CHECK(pool.stats().count(cgt::Reason::capture_failed) == 0);
  // Not a decision for good: the next call records.
  device->script.fail_function = false;
  auto out = must(f({x, w}));
  CHECK(out.kind() == K::recording);
  CHECK(output_values(out, 0) == repeat(6));
}

TEST_CASE("capture pipeline: a write to a copied input runs the graph once, carries the write back, keeps no graph",
          "[host][capture]") {
  // Seen at capture (cgt.torch's version counters) or only after the first run (the host's byte
  // compare): either way the graph's one run is the call's run, never followed by an eager one.
  const auto known = GENERATE(cgt::backend::WritesKnown::at_capture, cgt::backend::WritesKnown::after_first_run);
  const std::uint32_t written = GENERATE(0U, 1U);  // both are a caller's buffers: copied into slots
  auto [device, pool] = scripted_pool();
  auto f = scale(pool);
  const Buffer x = filled({4}, 2);
  const Buffer w = filled({4}, 3);
  (void)must(f({x, w}));  // warm-up
  device->script.write = written;
  device->script.writes_known = known;
  {
    auto out = must(f({x, w}));
    CHECK(out.kind() == K::warmup);  // its outputs are a warm-up node's: no graph to replay
    CHECK(out.node() < 0);
    CHECK(output_values(out, 0) == repeat(6));
    CHECK(device->asked.first_runs == 1);
    CHECK(device->asked.write_backs == 1);
    CHECK(device->asked.finished == 1);
    CHECK(device->asked.discarded == 0);
    CHECK(pool.stats().recordings_not_kept == 1);
    CHECK(pool.stats().recordings == 0);
    CHECK(pool.stats().eager_calls == 0);
    CHECK(pool.stats().count(cgt::Reason::undeclared_write) == 1);  // the input counts as mutated from now on
    CHECK(pool.roots().empty());
  }
  CHECK(pool.memory().allocated_bytes == 0);  // the output went with its lease, the slots with the graph
  // The written input is a caller's buffer a graph would copy: the next calls run eagerly.
  CHECK(must(f({x, w})).kind() == K::eager);
  CHECK(pool.stats().count(cgt::Reason::mutated_input) == 1);
  CHECK(device->asked.recordings == 1);
}

TEST_CASE("capture pipeline: a write to an input read in place keeps the recording; the input counts as mutated",
          "[host][capture]") {
  const auto known = GENERATE(cgt::backend::WritesKnown::at_capture, cgt::backend::WritesKnown::after_first_run);
  auto [device, pool] = scripted_pool();
  auto f = scale(pool, {1});  // w: static, read in place
  const Buffer x = filled({4}, 2);
  const Buffer w = filled({4}, 3);
  (void)must(f({x, w}));  // warm-up
  device->script.write = 1;
  device->script.writes_known = known;
  CHECK(must(f({x, w})).kind() == K::recording);
  CHECK(device->asked.write_backs == 0);
  CHECK(device->asked.discarded == 0);
  CHECK(pool.stats().count(cgt::Reason::undeclared_write) == 1);  // the pipeline passed the write on
  CHECK(must(f({x, w})).kind() == K::replay);
}

TEST_CASE("capture pipeline: a re-recording updates the earlier executable in place only when allowed and it fits",
          "[host][capture]") {
  const bool allowed = GENERATE(false, true);
  const bool fits = GENERATE(false, true);
  auto [device, pool] = scripted_pool();
  device->script.allows_update = allowed;
  device->script.fits_earlier = fits;
  auto f = scale(pool, {1});
  const Buffer x = filled({4}, 2);
  const std::vector<Buffer> weights{filled({4}, 3), filled({4}, 4), filled({4}, 5)};
  std::vector<K> kinds;
  for (const Buffer& w : weights) {
    pool.mark_step_begin();
    auto out = must(f({x, w}));
    CHECK(output_values(out, 0) == repeat(2 * w.get(0)));
    kinds.push_back(out.kind());
  }
  // The first weight warms up, the second records, the third re-records for the moved static input.
  CHECK(kinds == std::vector{K::warmup, K::recording, K::recording});
  REQUIRE(device->asked.replacing == 1);
  const std::uint64_t updated = allowed && fits ? 1 : 0;
  CHECK(device->asked.loads == (allowed ? 1 : 0));
  CHECK(device->counts.updated_in_place == updated);
  CHECK(device->counts.instantiated == 2 - updated);
  CHECK(device->asked.instantiations == static_cast<int>(2 - updated));
  CHECK(device->asked.first_runs == 2);
}

TEST_CASE("capture pipeline: node rewrites are asked once per recording and counted", "[host][capture]") {
  auto [device, pool] = scripted_pool();
  device->script.rewrites = {.memsets_rewritten = 1, .memsets_kept = 2, .memcpys_rewritten = 3, .memcpys_kept = 4};
  auto f = scale(pool);
  for (const std::int64_t size : {4, 8}) {
    const Buffer x = filled({size}, 2);
    const Buffer w = filled({size}, 3);
    CHECK(must(f({x, w})).kind() == K::warmup);
    CHECK(must(f({x, w})).kind() == K::recording);
  }
  // A capture that broke never gets as far.
  device->script.break_capture = true;
  const Buffer x = filled({16}, 2);
  const Buffer w = filled({16}, 3);
  (void)must(f({x, w}));
  CHECK(must(f({x, w})).kind() == K::eager);
  CHECK(device->counts.memset_nodes_rewritten == 2);
  CHECK(device->counts.memset_nodes_kept == 4);
  CHECK(device->counts.memcpy_nodes_rewritten == 6);
  CHECK(device->counts.memcpy_nodes_kept == 8);
  CHECK(device->counts.instantiated == 2);
}

TEST_CASE("capture pipeline: a device step that fails fails the call with its error; the capture keeps nothing",
          "[host][capture]") {
  auto [device, pool] = scripted_pool();
  auto f = scale(pool);
  const Buffer x = filled({4}, 2);
  const Buffer w = filled({4}, 3);
  (void)must(f({x, w}));  // warm-up
  device->script.fail_instantiate = true;
  auto failed = f({x, w});
  REQUIRE(!failed);
  CHECK(failed.error().code == cgt::Errc::backend_error);
  CHECK(contains(failed.error().message, "injected: instantiation failed"));
  CHECK(device->asked.first_runs == 0);
  CHECK(device->asked.discarded == 1);
  CHECK(device->counts.instantiated == 0);
  CHECK(pool.memory().allocated_bytes == 0);
  device->script.fail_instantiate = false;
  CHECK(must(f({x, w})).kind() == K::recording);
}

TEST_CASE("capture pipeline, host: a synchronisation breaks the capture; the message says so", "[host][capture]") {
  Messages failures{cgt::Reason::capture_failed};
  auto pool = must(cgt::host::make_pool({.tree = {.skip_warmup = true, .log_sink = failures.sink()}}));
  auto syncing = must(pool.add_function(
      [](Context& ctx, Inputs in) {
        Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, x.get(i) + 1);
        });
        ctx.synchronize();
        return Values{y};
      },
      {.name = "syncing"}));
  auto out = must(syncing({filled({4}, 1)}));
  CHECK(out.kind() == K::eager);
  CHECK(output_values(out, 0) == repeat(2));
  REQUIRE(failures.seen.size() == 1);
  CHECK(contains(failures.seen[0],
                 "'syncing' failed while recording: capture failed: the function synchronised with "
                 "the host during its capture (Context::synchronize)"));
  CHECK(pool.memory().allocated_bytes == 0);
}
