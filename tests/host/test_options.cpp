// The pool's options (PyTorch's knobs), its log, counters and introspection, on the host backend.
#include "host/host_test.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <iostream>
#include <memory>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

using scenario::FnSpec;
using scenario::HostTensor;
using scenario::in;
using scenario::unary;
using H = HostHarness;
namespace {

std::vector<cgt::CallKind> kinds_of_calls(cgt::host::Pool& pool, cgt::host::Function& f, int calls,
                                          bool new_steps = true) {
  std::vector<cgt::CallKind> kinds;
  for (int i = 0; i < calls; ++i) {
    if (new_steps) pool.mark_step_begin();
    kinds.push_back(must(f({H::make(HostTensor::full({4}, i))})).kind());
  }
  return kinds;
}

// Records every event the pool logs.
struct EventLog {
  std::vector<cgt::Event> events;
  std::vector<std::string> messages;
  cgt::LogSink sink() {
    return [this](const cgt::Event& event) {
      events.push_back(event);
      messages.emplace_back(event.message);
    };
  }
  [[nodiscard]] std::size_t count(cgt::Reason reason) const {
    return static_cast<std::size_t>(
        std::count_if(events.begin(), events.end(), [&](const cgt::Event& e) { return e.reason == reason; }));
  }
};

}  // namespace

TEST_CASE("skip_warmup records on the first call", "[options][host]") {
  auto pool = must(H::make_pool({.skip_warmup = true}));
  auto f = must(H::add(pool, unary("f", in(0) + 1)));
  using K = cgt::CallKind;
  CHECK(kinds_of_calls(pool, f, 3) == std::vector{K::recording, K::replay, K::replay});
  CHECK(pool.stats().warmups == 0);
}

TEST_CASE("force_warmup never records", "[options][host]") {
  auto pool = must(H::make_pool({.force_warmup = true}));
  auto f = must(H::add(pool, unary("f", in(0) + 1)));
  using K = cgt::CallKind;
  CHECK(kinds_of_calls(pool, f, 3) == std::vector{K::warmup, K::warmup, K::warmup});
  CHECK(pool.roots().empty());
  CHECK(pool.current_path().size() == 1);
  CHECK(pool.current_path()[0].reason() == cgt::NodeReason::forced_warmup);
}

TEST_CASE("without new steps, a held output makes the next call warm up again, then record beside it",
          "[options][host]") {
  auto pool = must(H::make_pool({.debug_checks = true}));
  auto f = must(H::add(pool, unary("f", in(0) + 1)));
  auto first = must(f({H::make(HostTensor::full({4}, 1))}));
  auto second = must(f({H::make(HostTensor::full({4}, 2))}));  // path still warming up: first is held
  CHECK(second.kind() == cgt::CallKind::warmup);
  const auto path = pool.current_path();
  REQUIRE(path.size() == 2);
  CHECK(path[1].reason() == cgt::NodeReason::path_warming_up);
  CHECK(scenario::value_of<H>(first, 0).data[0] == 2);
  CHECK(scenario::value_of<H>(second, 0).data[0] == 3);
}

TEST_CASE("rerecord_limit: an input from an earlier graph that keeps moving falls back", "[options][host]") {
  EventLog log;
  auto pool = must(H::make_pool({.rerecord_limit = 2, .debug_checks = true, .log_sink = log.sink()}));
  auto four = must(H::add(
      pool,
      FnSpec{"four",
             {scenario::map(in(0) + 1), scenario::map(in(0) + 2), scenario::map(in(0) + 3), scenario::map(in(0) + 4)},
             {scenario::temp_out(0), scenario::temp_out(1), scenario::temp_out(2), scenario::temp_out(3)},
             {},
             {},
             {}}));
  auto consume = must(H::add(pool, unary("consume", in(0) * 10)));
  std::vector<cgt::CallKind> kinds;
  auto walk = [&](std::size_t which) {
    pool.mark_step_begin();
    auto outs = must(four({H::make(HostTensor::full({4}, 0))}));
    auto out = must(consume({must(outs.get(which)).get()}));
    CHECK(scenario::value_of<H>(out, 0).data[0] == 10.0 * static_cast<double>(which + 1));
    kinds.push_back(out.kind());
  };
  walk(0);  // warm-ups
  walk(0);  // records consume under four, for output 0
  walk(0);  // replays
  walk(1);  // output 1 is at another address: re-record (1)
  walk(2);  // re-record (2)
  walk(3);  // a third move exceeds the limit: eager
  walk(0);  // past the limit, the function runs eagerly under this node
  using K = cgt::CallKind;
  CHECK(kinds == std::vector{K::warmup, K::recording, K::replay, K::recording, K::recording, K::eager, K::eager});
  CHECK(pool.stats().rerecords == 2);
  CHECK(pool.stats().count(cgt::Reason::managed_input_moved) == 2);
  CHECK(pool.stats().count(cgt::Reason::rerecord_limit) == 2);
  CHECK(log.count(cgt::Reason::managed_input_moved) == 2);
  CHECK(log.count(cgt::Reason::rerecord_limit) == 1);
  const auto children = pool.roots()[0].children();
  REQUIRE(children.size() == 3);
  CHECK(children[1].reason() == cgt::NodeReason::managed_input_moved);
}

TEST_CASE("a static input that moves is re-recorded, and never counts toward rerecord_limit", "[options][host]") {
  EventLog log;
  auto pool = must(H::make_pool({.rerecord_limit = 0, .log_sink = log.sink()}));
  auto scale =
      must(H::add(pool, FnSpec{"scale", {scenario::map(in(0) * in(1))}, {scenario::temp_out(0)}, {}, {1}, {}}));
  std::vector<cgt::host::Buffer> weights;
  for (int i = 0; i < 4; ++i) weights.push_back(H::make(HostTensor::full({4}, i + 1)));
  std::vector<cgt::CallKind> kinds;
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 4; ++i) {
      pool.mark_step_begin();
      auto out = must(scale({H::make(HostTensor::full({4}, 1)), weights[i]}));
      CHECK(scenario::value_of<H>(out, 0).data[0] == i + 1);
      kinds.push_back(out.kind());
    }
  }
  using K = cgt::CallKind;
  // weight 0: warm-up, weights 1-3: a recording each; the second round replays all four.
  CHECK(kinds == std::vector{K::warmup, K::recording, K::recording, K::recording, K::recording, K::replay, K::replay,
                             K::replay});
  CHECK(pool.stats().eager_calls == 0);
  CHECK(pool.stats().rerecords == 3);
  CHECK(log.count(cgt::Reason::static_input_moved) == 3);
  CHECK(pool.roots().size() == 4);
  CHECK(pool.roots()[1].reason() == cgt::NodeReason::static_input_moved);
  // Each re-recording names the recording it redoes, for a backend to share its graph.
  CHECK(must(pool.device()).get().recordings_redoing_another() == 3);
}

TEST_CASE("a misaligned static input is copied into an aligned slot", "[options][host]") {
  auto pool = must(H::make_pool());
  auto scale =
      must(H::add(pool, FnSpec{"scale", {scenario::map(in(0) * in(1))}, {scenario::temp_out(0)}, {}, {1}, {}}));
  const auto weight = H::misaligned(HostTensor::full({4}, 3));
  REQUIRE(reinterpret_cast<std::uintptr_t>(weight.data()) % 16 != 0);
  for (int i = 0; i < 3; ++i) {
    pool.mark_step_begin();
    CHECK(scenario::value_of<H>(must(scale({H::make(HostTensor::full({4}, 2)), weight})), 0).data[0] == 6);
  }
  H::write(weight, HostTensor::full({4}, 5));  // copied on every replay, so new values are seen
  pool.mark_step_begin();
  CHECK(scenario::value_of<H>(must(scale({H::make(HostTensor::full({4}, 2)), weight})), 0).data[0] == 10);
  CHECK(pool.roots()[0].copied_inputs() == std::vector<std::size_t>{0, 1});
}

TEST_CASE("copy_out_on_new_step keeps leases valid across steps, as copies", "[options][host]") {
  auto pool = must(H::make_pool({.debug_checks = true, .copy_out_on_new_step = true}));
  auto f = must(H::add(pool, FnSpec{"f",
                                    {scenario::map(in(0) + 1)},
                                    {scenario::temp_out(0), scenario::temp_out(0, scenario::slice(1, 3))},
                                    {},
                                    {},
                                    {}}));
  auto kept = must(f({H::make(HostTensor::iota({4}))}));
  const auto address = H::storage_of(must(kept.get(0)).get());
  pool.mark_step_begin();
  auto next = must(f({H::make(HostTensor::full({4}, 9))}));
  CHECK(scenario::value_of<H>(kept, 0).data == std::vector<double>{1, 2, 3, 4});
  CHECK(scenario::value_of<H>(kept, 1).data == std::vector<double>{2, 3});
  CHECK(H::storage_of(must(kept.get(0)).get()) != address);  // no longer pool memory
  CHECK(!H::is_pool_memory(pool, must(kept.get(1)).get()));
  CHECK(pool.stats().leases_copied_out == 2);
  CHECK(pool.stats().leases_invalidated == 0);
  CHECK(scenario::value_of<H>(next, 0).data[0] == 10);
}

TEST_CASE("shape keys: a variant per shape, a warning past the warn limit, eager past the limit", "[options][host]") {
  EventLog log;
  auto pool = must(H::make_pool({.shape_key_warn_limit = 2, .shape_key_limit = 3, .log_sink = log.sink()}));
  auto f = must(H::add(pool, unary("f", in(0) + 1)));
  std::vector<cgt::CallKind> kinds;
  for (std::int64_t n = 1; n <= 4; ++n) {
    for (int i = 0; i < 2; ++i) {
      pool.mark_step_begin();
      auto out = must(f({H::make(HostTensor::full({n}, 1))}));
      CHECK(scenario::value_of<H>(out, 0).data == std::vector<double>(static_cast<std::size_t>(n), 2.0));
      kinds.push_back(out.kind());
    }
  }
  using K = cgt::CallKind;
  CHECK(kinds ==
        std::vector{K::warmup, K::recording, K::warmup, K::recording, K::warmup, K::recording, K::eager, K::eager});
  CHECK(log.count(cgt::Reason::many_shape_keys) == 1);
  CHECK(pool.stats().count(cgt::Reason::shape_key_limit) == 2);
  CHECK(pool.roots().size() == 3);
}

TEST_CASE("graph_sizes: only listed sizes are graphed", "[options][host]") {
  auto pool = must(H::make_pool());
  auto f = must(pool.add_function(
      [](cgt::host::Context& ctx, cgt::host::Inputs in) {
        cgt::host::Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, x.get(i) * 3);
        });
        return cgt::host::Values{y};
      },
      {.name = "decode", .graph_sizes = {1, 4}, .size_source = {0, 0}}));
  std::vector<cgt::CallKind> kinds;
  for (std::int64_t batch : {1, 1, 3, 3, 4, 4}) {
    pool.mark_step_begin();
    auto out = must(f({H::make(HostTensor::full({batch, 2}, 1))}));
    CHECK(scenario::value_of<H>(out, 0).data[0] == 3);
    kinds.push_back(out.kind());
  }
  using K = cgt::CallKind;
  CHECK(kinds == std::vector{K::warmup, K::recording, K::eager, K::eager, K::warmup, K::recording});
  CHECK(pool.stats().count(cgt::Reason::size_not_graphed) == 2);
}

TEST_CASE("scalar inputs are part of the shape key and reach the function", "[options][host]") {
  auto pool = must(H::make_pool());
  auto add = must(pool.add_function(
      [](cgt::host::Context& ctx, cgt::host::Inputs in) {
        cgt::host::Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], k = in.scalar(1), y] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, x.get(i) + static_cast<double>(k));
        });
        return cgt::host::Values{y};
      },
      {.name = "add_k"}));
  for (int round = 0; round < 3; ++round) {
    for (std::int64_t k : {1, 5}) {
      pool.mark_step_begin();
      CHECK(scenario::value_of<H>(must(add({H::make(HostTensor::full({2}, 1)), k})), 0).data[0] == 1 + k);
    }
  }
  CHECK(pool.roots().size() == 2);
}

// Each distinct scalar value is a shape key of its own (a graph bakes it in): a position passed
// as an integer records a graph per position. The warning past shape_key_warn_limit says so, and
// names the way out: a tensor.
TEST_CASE("distinct integer scalars are shape keys, and the many-keys warning says so", "[options][host]") {
  EventLog log;
  auto pool = must(H::make_pool({.shape_key_warn_limit = 2, .log_sink = log.sink()}));
  auto add = must(pool.add_function(
      [](cgt::host::Context& ctx, cgt::host::Inputs in) {
        cgt::host::Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], k = in.scalar(1), y] { y.set(0, x.get(0) + static_cast<double>(k)); });
        return cgt::host::Values{y};
      },
      {.name = "at_position"}));
  for (std::int64_t position = 0; position < 3; ++position) {
    pool.mark_step_begin();
    CHECK(scenario::value_of<H>(must(add({H::make(HostTensor::full({1}, 1)), position})), 0).data[0] == 1 + position);
  }
  CHECK(pool.stats().warmups == 3);
  REQUIRE(log.count(cgt::Reason::many_shape_keys) == 1);
  const auto warning = std::ranges::find(log.events, cgt::Reason::many_shape_keys, &cgt::Event::reason);
  const std::string& message = log.messages[static_cast<std::size_t>(warning - log.events.begin())];
  INFO(message);
  CHECK(message.find("3 distinct shape keys") != std::string::npos);
  CHECK(message.find("integer scalar") != std::string::npos);
  CHECK(message.find("as tensors") != std::string::npos);
}

TEST_CASE("the default log prints each fallback reason once per function", "[options][host]") {
  std::ostringstream captured;
  auto* old = std::cerr.rdbuf(captured.rdbuf());
  {
    auto pool = must(H::make_pool({.shape_key_limit = 1}));
    auto f = must(H::add(pool, unary("f", in(0) + 1)));
    for (std::int64_t n = 1; n <= 4; ++n) (void)must(f({H::make(HostTensor::full({n}, 1))}));
    CHECK(pool.stats().count(cgt::Reason::shape_key_limit) == 3);
    CHECK(pool.stats().fallback_warnings == 1);
  }
  std::cerr.rdbuf(old);
  const std::string text = captured.str();
  CHECK(text.find("skipping graphs for 'f'") != std::string::npos);
  CHECK(text.find("skipping graphs for 'f'") == text.rfind("skipping graphs for 'f'"));  // once
}

TEST_CASE("the tree can be read: roots, children, the current path and a DOT dump", "[options][host]") {
  auto pool = must(H::make_pool());
  auto a = must(H::add(pool, unary("first", in(0) + 1)));
  auto b = must(H::add(pool, unary("second", in(0) * 2)));
  for (int i = 0; i < 3; ++i) {
    pool.mark_step_begin();
    auto x = must(a({H::make(HostTensor::full({4}, 1))}));
    auto y = must(b({must(x.get(0)).get()}));
    CHECK(scenario::value_of<H>(y, 0).data[0] == 4);
    const auto path = pool.current_path();
    REQUIRE(path.size() == 2);
    CHECK(path[0].function() == "first");
    CHECK(path[1].function() == "second");
    CHECK(path[1].depth() == 1);
  }
  const auto roots = pool.roots();
  REQUIRE(roots.size() == 1);
  CHECK(roots[0].kind() == cgt::NodeKind::graph);
  CHECK(roots[0].id() == 0);
  CHECK(roots[0].reason() == cgt::NodeReason::first_call);
  CHECK(roots[0].output_count() == 1);
  CHECK(roots[0].num_descendants() == 1);
  REQUIRE(roots[0].children().size() == 1);
  CHECK(roots[0].children()[0].function() == "second");
  const std::string dot = pool.to_dot();
  CHECK(dot.starts_with("digraph cgt {"));
  CHECK(dot.find("first") != std::string::npos);
  CHECK(dot.find("second") != std::string::npos);
  CHECK(dot.find("n0 -> n1") != std::string::npos);
  must(pool.shutdown());
  CHECK(!roots[0].exists());
  CHECK(roots[0].children().empty());
  CHECK(pool.roots().empty());
}

TEST_CASE("counters count what happened", "[options][host]") {
  auto pool = must(H::make_pool());
  auto f = must(H::add(pool, unary("f", in(0) + 1)));
  (void)kinds_of_calls(pool, f, 5);
  const cgt::Stats stats = pool.stats();
  CHECK(stats.calls == 5);
  CHECK(stats.warmups == 1);
  CHECK(stats.recordings == 1);
  CHECK(stats.replays == 3);
  CHECK(stats.eager_calls == 0);
  CHECK(stats.steps_reclaimed == 0);  // every output was dropped before the next step
  CHECK(pool.memory().live_blocks == 0);
  CHECK(pool.memory().reserved_bytes > 0);
}

TEST_CASE("warm_up_each_shape = false: only the first shape warms up, later shapes record at once", "[options][host]") {
  auto pool = must(H::make_pool({}));
  using K = cgt::CallKind;
  for (const bool each : {true, false}) {
    auto body = [](cgt::host::Context& ctx, cgt::host::Inputs in) {
      cgt::host::Buffer out = ctx.allocate(cgt::host::ElementType::f32, in[0].sizes());
      const cgt::host::Buffer x = in[0];
      ctx.launch([x, out] {
        for (std::size_t i = 0; i < static_cast<std::size_t>(x.numel()); ++i) out.set(i, x.get(i) * 2);
      });
      return cgt::host::Values{out};
    };
    auto f = must(pool.add_function(body, {.name = each ? "each" : "first", .warm_up_each_shape = each}));
    const auto warmups_before = pool.stats().warmups;
    std::vector<K> kinds;
    for (const std::int64_t size : {4, 8, 16}) {
      for (int call = 0; call < 3; ++call) {
        pool.mark_step_begin();
        auto out = must(f({H::make(HostTensor::full({size}, 3))}));
        kinds.push_back(out.kind());
        CHECK(scenario::value_of<H>(out, 0).data == std::vector<double>(static_cast<std::size_t>(size), 6));
      }
    }
    if (each) {
      CHECK(kinds == std::vector{K::warmup, K::recording, K::replay, K::warmup, K::recording, K::replay, K::warmup,
                                 K::recording, K::replay});
      CHECK(pool.stats().warmups - warmups_before == 3);
    } else {
      CHECK(kinds == std::vector{K::warmup, K::recording, K::replay, K::recording, K::replay, K::replay, K::recording,
                                 K::replay, K::replay});
      CHECK(pool.stats().warmups - warmups_before == 1);
    }
  }
}

// A function whose lazy set-up depends on the shape: the first call at each size "grows a
// workspace", which synchronises with the host (as a CUDA allocation or a first kernel load
// would); a capture at a size that has not set up breaks. `sizes_set_up` is that host state.
TEST_CASE("warm_up_each_shape = false: a shape whose capture fails warms up and records at its next call",
          "[options][host]") {
  using K = cgt::CallKind;
  for (const bool synchronises_every_call : {false, true}) {
    EventLog log;
    auto pool = must(H::make_pool({.log_sink = log.sink()}));
    auto sizes_set_up = std::make_shared<std::set<std::int64_t>>();
    auto body = [sizes_set_up, synchronises_every_call](cgt::host::Context& ctx, cgt::host::Inputs in) {
      if (synchronises_every_call || sizes_set_up->insert(in[0].numel()).second) ctx.synchronize();
      cgt::host::Buffer out = ctx.allocate(cgt::host::ElementType::f32, in[0].sizes());
      const cgt::host::Buffer x = in[0];
      ctx.launch([x, out] {
        for (std::size_t i = 0; i < static_cast<std::size_t>(x.numel()); ++i) out.set(i, x.get(i) + 1);
      });
      return cgt::host::Values{out};
    };
    auto f = must(pool.add_function(body, {.name = "lazy", .warm_up_each_shape = false}));
    std::vector<K> kinds;
    for (const std::int64_t size : {4, 8}) {
      for (int call = 0; call < 4; ++call) {
        pool.mark_step_begin();
        auto out = must(f({H::make(HostTensor::full({size}, call))}));
        kinds.push_back(out.kind());
        CHECK(scenario::value_of<H>(out, 0).data == std::vector<double>(static_cast<std::size_t>(size), call + 1));
      }
    }
    if (!synchronises_every_call) {
      // Size 4 warms up (the first shape) and records; size 8 records without a warm-up, its
      // capture fails, it warms up instead, then records and replays.
      CHECK(kinds ==
            std::vector{K::warmup, K::recording, K::replay, K::replay, K::warmup, K::recording, K::replay, K::replay});
      CHECK(pool.stats().warmups == 2);
      CHECK(pool.stats().recordings == 2);
      CHECK(pool.stats().eager_calls == 0);
      CHECK(log.count(cgt::Reason::capture_failed) == 1);
    } else {
      // A function that cannot be captured at all: size 4 fails after its warm-up (final); size
      // 8 fails without one, warms up, fails again (final): each shape gives up after one retry.
      CHECK(kinds == std::vector{K::warmup, K::eager, K::eager, K::eager, K::warmup, K::eager, K::eager, K::eager});
      CHECK(pool.stats().recordings == 0);
      CHECK(pool.stats().count(cgt::Reason::capture_failed) == 6);
      CHECK(log.count(cgt::Reason::capture_failed) == 3);
    }
  }
}

TEST_CASE("counters and memory read as one line of text", "[options][host]") {
  auto pool = must(H::make_pool({.shape_key_limit = 1, .log_sink = [](const cgt::Event&) {}}));
  auto f = must(H::add(pool, unary("f", in(0) + 1)));
  for (int i = 0; i < 3; ++i) (void)must(f({H::make(HostTensor::full({4}, 1))}));
  CHECK(cgt::to_string(pool.stats()) == "calls 3, warm-ups 1, recordings 1, replays 1, eager 0, failed matches 1");
  // Another shape over the limit runs eagerly: the counter and its reason join the line.
  (void)must(f({H::make(HostTensor::full({5}, 1))}));
  CHECK(cgt::to_string(pool.stats()) ==
        "calls 4, warm-ups 1, recordings 1, replays 1, eager 1, failed matches 1, fallback warnings 1, "
        "shape_key_limit 1");
  const cgt::MemoryInfo memory = pool.memory();
  CHECK(cgt::to_string(memory) == std::to_string(memory.reserved_bytes) + " bytes reserved, " +
                                      std::to_string(memory.allocated_bytes) + " allocated in " +
                                      std::to_string(memory.live_blocks) + " blocks, peak " +
                                      std::to_string(memory.peak_allocated_bytes));
}
