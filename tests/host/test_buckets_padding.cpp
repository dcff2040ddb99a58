// What a padded call of batch buckets (FunctionOptions::buckets) does, on the host backend:
// outputs that alias the padded inputs, outputs without the batch dimension, pad values the
// element type cannot hold, size sources the buckets cannot pad, functions and kernels that throw
// on a padded call, buckets with warm_up_each_shape = false and with training modes.
#include "host/host_test.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

Buffer rows_of(std::int64_t rows, double seed, std::int64_t cols = 2, cgt::ElementType type = cgt::ElementType::f32) {
  Buffer x = must(Buffer::make(type, {rows, cols}));
  for (std::size_t i = 0; i < x.numel(); ++i) x.set(i, seed + static_cast<double>(i));
  return x;
}

std::vector<std::int64_t> sizes_of(const Buffer& buffer) {
  return {buffer.sizes().begin(), buffer.sizes().end()};
}

std::vector<double> times(std::vector<double> values, double factor) {
  for (double& v : values) v *= factor;
  return values;
}

cgt::host::Pool make_pool(cgt::Options options = {}) {
  options.debug_checks = true;
  return host_test::poisoned_pool(std::move(options));
}

cgt::Buckets buckets_of(std::vector<std::int64_t> sizes, cgt::Pad pad = {}) {
  return {.sizes = std::move(sizes), .pad = pad, .per_input = {}};
}

// y = 2x (the batch's rows), t = the sum of every element of x, as a rank-0 buffer: a reduction
// over the batch that has no batch dimension, and sees the padding.
Values doubled_and_total(Context& ctx, const Inputs& in) {
  const Buffer x = in[0];
  Buffer y = ctx.allocate_like(x);
  Buffer t = ctx.allocate(cgt::ElementType::f64, std::span<const std::int64_t>{});
  ctx.launch([x, y, t] {
    double sum = 0;
    for (std::size_t i = 0; i < x.numel(); ++i) {
      y.set(i, 2 * x.get(i));
      sum += x.get(i);
    }
    t.set(0, sum);
  });
  return {y, t};
}

}  // namespace

TEST_CASE("an output that is its padded input is handed out sliced, and a later call does not change it",
          "[buckets][host]") {
  // The identity: the output is the input the graph received, which for a padded call is the
  // padded copy (or the graph's slot for it).
  auto pool = make_pool();
  auto f = must(pool.add_function([](Context&, Inputs in) { return Values{in[0]}; },
                                  {.name = "identity", .buckets = buckets_of({4}, cgt::Pad::constant(-7))}));
  std::vector<K> kinds;
  for (int round = 0; round < 4; ++round) {
    pool.mark_step_begin();
    const Buffer a = rows_of(3, 10 * round);
    auto first = must(f({a}));
    kinds.push_back(first.kind());
    // Same step: the first output is still held, so the second call may not overwrite it.
    const Buffer b = rows_of(3, (10 * round) + 100);
    auto second = must(f({b}));
    INFO("round " << round);
    CHECK(sizes_of(must(first.get(0))) == std::vector<std::int64_t>{3, 2});
    CHECK(values_of(must(first.get(0))) == values_of(a));
    CHECK(values_of(must(second.get(0))) == values_of(b));
    // take() copies the call's rows only, not the padding.
    CHECK(values_of(must(first.take(0))) == values_of(a));
    // Writing the caller's input afterwards does not reach the output (it was copied).
    a.fill(0);
    CHECK(values_of(must(second.get(0))) == values_of(b));
  }
  CHECK(kinds.back() == K::replay);
  must(pool.check_memory());
}

TEST_CASE("at a bucket's own size, an identity fed pool outputs hands out copies that later calls leave alone",
          "[buckets][host]") {
  // A batch input at a bucket's size is copied into the graph's slot even when it is pool memory
  // (a padded call must find the same graph): the output is that slot, and a held one must not be
  // overwritten by the next replay.
  auto pool = make_pool();
  auto source = must(pool.add_function(doubled_and_total, {.name = "source", .buckets = buckets_of({2, 4})}));
  auto identity = must(pool.add_function([](Context&, Inputs in) { return Values{in[0]}; },
                                         {.name = "identity", .buckets = buckets_of({2, 4})}));
  for (int round = 0; round < 4; ++round) {
    for (const std::int64_t n : {4, 3}) {
      pool.mark_step_begin();
      const Buffer a = rows_of(n, round);
      const Buffer b = rows_of(n, round + 50);
      auto made_a = must(source({a}));
      auto made_b = must(source({b}));
      auto first = must(identity({must(made_a.get(0)).get()}));
      auto second = must(identity({must(made_b.get(0)).get()}));
      INFO("size " << n << ", round " << round);
      CHECK(values_of(must(first.get(0))) == times(values_of(a), 2));
      CHECK(values_of(must(second.get(0))) == times(values_of(b), 2));
      if (round == 3) CHECK(second.kind() == K::replay);
    }
  }
  must(pool.check_memory());
}

TEST_CASE("outputs without the batch dimension (a rank-0 reduction) are handed out whole", "[buckets][host]") {
  auto pool = make_pool();
  auto f = must(
      pool.add_function(doubled_and_total, {.name = "total", .buckets = buckets_of({1, 4}, cgt::Pad::constant(1))}));
  for (int round = 0; round < 3; ++round) {
    for (const std::int64_t n : {1, 2, 3, 4}) {
      pool.mark_step_begin();
      const Buffer x = rows_of(n, round);
      auto out = must(f({x}));
      double sum = 0;
      for (const double v : values_of(x)) sum += v;
      const std::int64_t bucket = n == 1 ? 1 : 4;
      sum += static_cast<double>((bucket - n) * 2);  // every padded element is 1
      INFO("size " << n << ", round " << round);
      CHECK(values_of(must(out.get(0))) == times(values_of(x), 2));
      CHECK(must(out.get(1)).get().rank() == 0);
      CHECK(values_of(must(out.get(1))) == std::vector<double>{sum});
      if (round == 2) CHECK(out.kind() == K::replay);
    }
  }
  CHECK(pool.stats().recordings == 2);
}

TEST_CASE("a constant pad the input's element type cannot hold fails the call, naming the input", "[buckets][host]") {
  // Converting -1 to u8, NaN or 1e300 to an integer, is undefined behaviour: it must not be done.
  // The sum of both inputs' elements sees the padding of both (f64: it holds NaN, inf and 1e300).
  const auto sum_rows = host_test::sum_of_both_inputs(cgt::ElementType::f64);
  struct Case {
    cgt::ElementType type;
    double pad;
    bool fits;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<Case> cases{
      {cgt::ElementType::u8, -1, false},     {cgt::ElementType::u8, 256, false},   {cgt::ElementType::u8, 255, true},
      {cgt::ElementType::i32, nan, false},   {cgt::ElementType::i32, 1e10, false}, {cgt::ElementType::i32, 0.5, false},
      {cgt::ElementType::i64, 1e300, false}, {cgt::ElementType::i64, -inf, false}, {cgt::ElementType::i64, -3, true},
      {cgt::ElementType::f32, -inf, true},   {cgt::ElementType::f64, nan, true},
  };
  for (const Case& c : cases) {
    auto pool = make_pool();
    auto f = must(pool.add_function(
        sum_rows,
        {.name = "sum", .buckets = {.sizes = {4}, .pad = {}, .per_input = {{1, cgt::Pad::constant(c.pad)}}}}));
    const Buffer x = rows_of(3, 1, 2, c.type);
    const Buffer y = rows_of(3, 0, 1, c.type);  // input 1: padded with the case's value
    INFO("type " << cgt::to_string(c.type) << ", pad " << c.pad);
    auto out = f({x, y});
    if (c.fits) {
      REQUIRE(out.has_value());
      double expected = 0;
      for (const double v : values_of(x)) expected += v;
      for (const double v : values_of(y)) expected += v;
      expected += c.pad;  // one padded row: x gets the default pad (0), y one element of the case's
      const double got = values_of(must(out->get(0)))[0];
      if (std::isnan(expected)) {
        CHECK(std::isnan(got));
      } else {
        CHECK(got == expected);
      }
    } else {
      REQUIRE_FALSE(out.has_value());
      CHECK(out.error().code == cgt::Errc::invalid_argument);
      CHECK(out.error().input == 1);
      CHECK(out.error().function == "sum");
      CHECK(out.error().message.find(std::string(cgt::to_string(c.type))) != std::string::npos);
    }
  }
}

TEST_CASE("Buffer::set of a value the element type cannot hold saturates instead of being undefined",
          "[buckets][host]") {
  Buffer u8 = must(Buffer::make(cgt::ElementType::u8, {4}));
  u8.set(0, -1);
  u8.set(1, 300);
  u8.set(2, std::numeric_limits<double>::quiet_NaN());
  u8.set(3, 7.9);
  CHECK(values_of(u8) == std::vector<double>{0, 255, 0, 7});
  Buffer i32 = must(Buffer::make(cgt::ElementType::i32, {3}));
  i32.set(0, 1e300);
  i32.set(1, -std::numeric_limits<double>::infinity());
  i32.set(2, -2.5);
  CHECK(values_of(i32) == std::vector<double>{2147483647.0, -2147483648.0, -2});
  Buffer i64 = must(Buffer::make(cgt::ElementType::i64, {2}));
  i64.set(0, 1e300);
  i64.set(1, -1e300);
  CHECK(i64.as<std::int64_t>()[0] == std::numeric_limits<std::int64_t>::max());
  CHECK(i64.as<std::int64_t>()[1] == std::numeric_limits<std::int64_t>::min());
}

TEST_CASE("buckets whose size source is an input they never pad are refused when the function is added",
          "[buckets][host]") {
  auto pool = make_pool();
  // A static size source: the other inputs would be padded, it would not, and the function would
  // see inputs of different batch sizes.
  auto static_source = pool.add_function(doubled_and_total, {.name = "static_source",
                                                             .static_inputs = {0},
                                                             .buckets = buckets_of({4}),
                                                             .size_source = {.input = 0, .dim = 0}});
  REQUIRE_FALSE(static_source.has_value());
  CHECK(static_source.error().code == cgt::Errc::invalid_argument);
  CHECK(static_source.error().message.find("static") != std::string::npos);
  cgt::Buckets unpadded = buckets_of({4});
  unpadded.unpadded_inputs = {1};
  auto unpadded_source = pool.add_function(
      doubled_and_total, {.name = "unpadded_source", .buckets = unpadded, .size_source = {.input = 1, .dim = 0}});
  REQUIRE_FALSE(unpadded_source.has_value());
  CHECK(unpadded_source.error().code == cgt::Errc::invalid_argument);
  CHECK(unpadded_source.error().message.find("unpadded_inputs") != std::string::npos);
  // graph_sizes pads nothing: a static size source is fine there.
  CHECK(pool.add_function(doubled_and_total,
                          {.name = "sizes", .static_inputs = {0}, .graph_sizes = {4}, .size_source = {.input = 0}})
            .has_value());
}

TEST_CASE("a size source that is a scalar fails the first call with invalid_argument", "[buckets][host]") {
  auto pool = make_pool();
  auto f = must(pool.add_function(
      [](Context& ctx, Inputs in) {
        Buffer y = ctx.allocate_like(in[0]);
        return Values{y};
      },
      {.name = "scalar_source", .buckets = buckets_of({4}), .size_source = {.input = 1, .dim = 0}}));
  auto out = f({rows_of(3, 0), std::int64_t{3}});
  REQUIRE_FALSE(out.has_value());
  CHECK(out.error().code == cgt::Errc::invalid_argument);
  CHECK(out.error().message.find("buckets") != std::string::npos);
  // The call did not fix a signature: a call with a value there is checked afresh, and works.
  auto fixed = f({rows_of(3, 0), rows_of(3, 0)});
  CHECK(fixed.has_value());
}

TEST_CASE("a bucket too large to pad to fails the call with an error value", "[buckets][host]") {
  auto pool = make_pool();
  constexpr std::int64_t huge = std::numeric_limits<std::int64_t>::max() / 2;
  auto f = must(pool.add_function(doubled_and_total, {.name = "huge", .buckets = buckets_of({2, huge})}));
  auto out = f({rows_of(3, 0)});
  REQUIRE_FALSE(out.has_value());
  CHECK(out.error().function == "huge");
  CHECK(out.error().input == 0);
  // The pool is still usable at the sizes it can pad.
  auto small = must(f({rows_of(1, 5)}));
  CHECK(values_of(must(small.get(0))) == times(values_of(rows_of(1, 5)), 2));
  must(pool.check_memory());
}

TEST_CASE("a function or kernel that throws on a padded call fails that call, and the next ones work",
          "[buckets][host]") {
  // throw_at: which call (counting from 0) throws: in the function body (body_throws) or in the
  // kernel it launches.
  for (const bool body_throws : {true, false}) {
    for (int throw_at = 0; throw_at < 4; ++throw_at) {
      auto pool = make_pool();
      int call = 0;
      auto f = must(pool.add_function(
          [&call, throw_at, body_throws](Context& ctx, Inputs in) {
            if (body_throws && call == throw_at) throw std::runtime_error("body");
            Buffer y = ctx.allocate_like(in[0]);
            ctx.launch([x = in[0], y, &call, throw_at, body_throws] {
              if (!body_throws && call == throw_at) throw std::runtime_error("kernel");
              for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, x.get(i) + 1);
            });
            return Values{y};
          },
          {.name = "throws", .buckets = buckets_of({2, 4})}));
      for (call = 0; call < 7; ++call) {
        pool.mark_step_begin();
        const Buffer x = rows_of(3, call);
        auto out = f({x});
        INFO("body_throws " << body_throws << ", throw_at " << throw_at << ", call " << call);
        if (call == throw_at) {
          // A body runs only at warm-up and recording; a kernel also at every replay.
          if (out.has_value()) {
            CHECK(body_throws);
            CHECK(out->kind() == K::replay);
            continue;
          }
          CHECK(out.error().code == cgt::Errc::function_failed);
          CHECK(out.error().function == "throws");
          continue;
        }
        REQUIRE(out.has_value());
        std::vector<double> expected = values_of(x);
        for (double& v : expected) v += 1;
        CHECK(sizes_of(must(out->get(0))) == std::vector<std::int64_t>{3, 2});
        CHECK(values_of(must(out->get(0))) == expected);
        if (call == 6) CHECK(out->kind() == K::replay);
      }
      CHECK(pool.stats().padded_calls >= 6);
      must(pool.check_memory());
    }
  }
}

TEST_CASE("buckets with warm_up_each_shape = false: the first bucket warms up, the others record at once",
          "[buckets][host]") {
  auto pool = make_pool();
  auto f = must(pool.add_function(
      doubled_and_total,
      {.name = "once", .buckets = buckets_of({2, 4, 8}, cgt::Pad::constant(0)), .warm_up_each_shape = false}));
  std::vector<K> kinds;
  for (int round = 0; round < 2; ++round) {
    for (const std::int64_t n : {1, 3, 7, 2, 4, 8}) {
      pool.mark_step_begin();
      const Buffer x = rows_of(n, n + round);
      auto out = must(f({x}));
      kinds.push_back(out.kind());
      double sum = 0;
      for (const double v : values_of(x)) sum += v;
      INFO("size " << n << ", round " << round);
      CHECK(values_of(must(out.get(0))) == times(values_of(x), 2));
      CHECK(values_of(must(out.get(1))) == std::vector<double>{sum});
    }
  }
  // Bucket 2 warmed up at size 1 but was never recorded: size 2 records it.
  CHECK(kinds == std::vector{K::warmup, K::recording, K::recording, K::recording, K::replay, K::replay, K::replay,
                             K::replay, K::replay, K::replay, K::replay, K::replay});
  CHECK(pool.stats().warmups == 1);
  CHECK(pool.stats().recordings == 3);
}

TEST_CASE("a bucketed forward and backward train: padded rows, sliced gradients, replayed whole", "[buckets][host]") {
  // forward(x, w) -> (y = x * w per column, saved = x); backward(gy, saved, w) -> (gx = gy * w).
  auto pool = make_pool();
  auto fwd = must(pool.add_function(
      [](Context& ctx, Inputs in) {
        Buffer y = ctx.allocate_like(in[0]);
        Buffer saved = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], w = in[1], y, saved] {
          for (std::size_t i = 0; i < x.numel(); ++i) {
            y.set(i, x.get(i) * w.get(i % 2));
            saved.set(i, x.get(i));
          }
        });
        return Values{y, saved};
      },
      {.name = "forward", .static_inputs = {1}, .buckets = buckets_of({4}), .mode = cgt::FunctionMode::forward}));
  auto bwd = must(pool.add_function(
      [](Context& ctx, Inputs in) {
        Buffer gx = ctx.allocate_like(in[0]);
        ctx.launch([gy = in[0], saved = in[1], w = in[2], gx] {
          for (std::size_t i = 0; i < gy.numel(); ++i) gx.set(i, (gy.get(i) * w.get(i % 2)) + saved.get(i));
        });
        return Values{gx};
      },
      {.name = "backward", .static_inputs = {2}, .buckets = buckets_of({4}), .mode = cgt::FunctionMode::backward}));
  Buffer w = must(Buffer::make(cgt::ElementType::f32, {2}));
  w.set(0, 2);
  w.set(1, -1);
  std::vector<K> kinds;
  for (int step = 0; step < 4; ++step) {
    const Buffer x = rows_of(3, step);
    auto forward_out = must(fwd({x, w}));
    auto saved = must(forward_out.release(1));
    const Buffer gy = rows_of(3, 50 + step);
    auto backward_out = must(bwd({gy, std::move(saved), w}));
    kinds.push_back(forward_out.kind());
    kinds.push_back(backward_out.kind());
    std::vector<double> expected_y, expected_gx;
    for (std::size_t i = 0; i < x.numel(); ++i) {
      expected_y.push_back(x.get(i) * w.get(i % 2));
      expected_gx.push_back((gy.get(i) * w.get(i % 2)) + x.get(i));
    }
    INFO("step " << step);
    CHECK(values_of(must(forward_out.get(0))) == expected_y);
    CHECK(values_of(must(backward_out.get(0))) == expected_gx);
  }
  CHECK(kinds ==
        std::vector{K::warmup, K::warmup, K::recording, K::recording, K::replay, K::replay, K::replay, K::replay});
  must(pool.check_memory());
}

TEST_CASE("a sliced output outlives its pool handle, and after shutdown() says pool_shut_down", "[buckets][host]") {
  std::optional<cgt::host::Outputs> held;
  std::optional<cgt::host::Function> f;
  const Buffer x = rows_of(3, 4);
  {
    auto pool = make_pool();
    f = must(pool.add_function(doubled_and_total, {.name = "outlives", .buckets = buckets_of({4})}));
    for (int round = 0; round < 3; ++round) {
      pool.mark_step_begin();
      held = must((*f)({x}));
    }
    CHECK(held->kind() == K::replay);
  }  // the Pool handle goes; the function and the leases keep the pool
  CHECK(values_of(must(held->get(0))) == times(values_of(x), 2));
  auto taken = must(held->take(0));
  CHECK(sizes_of(taken) == std::vector<std::int64_t>{3, 2});
  auto again = must((*f)({rows_of(2, 0)}));
  CHECK(values_of(must(again.get(0))) == times(values_of(rows_of(2, 0)), 2));
  auto lease = must(held->release(0));

  auto pool = make_pool();
  auto g = must(pool.add_function(doubled_and_total, {.name = "shut", .buckets = buckets_of({4})}));
  auto out = must(g({x}));
  auto kept = must(out.release(0));
  must(pool.shutdown());
  CHECK(kept.get().error().code == cgt::Errc::pool_shut_down);
  CHECK(out.take(1).error().code == cgt::Errc::pool_shut_down);
  CHECK(values_of(taken) == times(values_of(x), 2));              // a copy taken before is the caller's
  CHECK(values_of(must(lease.get())) == times(values_of(x), 2));  // the other pool lives on
}

TEST_CASE("replicate pads along a dimension that is not the first: the last column again", "[buckets][host]") {
  auto pool = make_pool();
  std::vector<double> seen;
  auto f = must(pool.add_function(
      [&seen](Context& ctx, Inputs in) {
        Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y, &seen] {
          seen = values_of(x);
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, x.get(i) + 1);
        });
        return Values{y};
      },
      {.name = "columns", .buckets = buckets_of({4}, cgt::Pad::replicate()), .size_source = {.input = 0, .dim = 1}}));
  for (int round = 0; round < 3; ++round) {
    pool.mark_step_begin();
    const Buffer x = rows_of(2, 10 * round, 3);  // [[a b c] [d e f]] -> [[a b c c] [d e f f]]
    auto out = must(f({x}));
    const std::vector<double> v = values_of(x);
    CHECK(seen == std::vector<double>{v[0], v[1], v[2], v[2], v[3], v[4], v[5], v[5]});
    CHECK(sizes_of(must(out.get(0))) == std::vector<std::int64_t>{2, 3});
    std::vector<double> expected = v;
    for (double& e : expected) e += 1;
    CHECK(values_of(must(out.get(0))) == expected);
  }
  CHECK(pool.stats().recordings == 1);
}

// Lazy set-up per padded size (a workspace grown at the first call of each size synchronises, as
// test_options.cpp's "lazy" function does): a bucket whose capture fails warms up on the padded
// inputs, or, when every capture fails, runs eagerly on them; either way the outputs are sliced.
TEST_CASE("a bucket whose capture fails warms up or runs eagerly on the padded inputs, and slices", "[buckets][host]") {
  for (const bool synchronises_every_call : {false, true}) {
    auto pool = make_pool();
    std::set<std::size_t> sizes_set_up;
    auto f = must(pool.add_function(
        [&sizes_set_up, synchronises_every_call](Context& ctx, Inputs in) {
          if (synchronises_every_call || sizes_set_up.insert(in[0].numel()).second) ctx.synchronize();
          Buffer y = ctx.allocate_like(in[0]);
          ctx.launch([x = in[0], y] {
            for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, x.get(i) + 1);
          });
          return Values{y};
        },
        {.name = "lazy", .buckets = buckets_of({4, 8}), .warm_up_each_shape = false}));
    std::vector<K> kinds;
    for (const std::int64_t n : {3, 3, 3, 6, 6, 6, 8}) {
      pool.mark_step_begin();
      const Buffer x = rows_of(n, static_cast<double>(kinds.size()));
      auto out = must(f({x}));
      kinds.push_back(out.kind());
      std::vector<double> expected = values_of(x);
      for (double& v : expected) v += 1;
      INFO("size " << n << ", synchronises_every_call " << synchronises_every_call);
      CHECK(sizes_of(must(out.get(0))) == std::vector<std::int64_t>{n, 2});
      CHECK(values_of(must(out.get(0))) == expected);
    }
    if (!synchronises_every_call) {
      CHECK(kinds == std::vector{K::warmup, K::recording, K::replay, K::warmup, K::recording, K::replay, K::replay});
    } else {
      CHECK(kinds == std::vector{K::warmup, K::eager, K::eager, K::warmup, K::eager, K::eager, K::eager});
      CHECK(pool.stats().count(cgt::Reason::capture_failed) == 5);
    }
    CHECK(pool.stats().padded_calls == 6);
    must(pool.check_memory());
  }
}
