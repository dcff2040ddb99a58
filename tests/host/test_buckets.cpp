// Batch buckets with padding (FunctionOptions::buckets) on the host backend: every size up to the
// largest bucket equals an eager run, one recording per bucket, and the odd cases a user meets.
#include "host/host_test.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace {

constexpr std::int64_t kCols = 3;

// A batch of `rows` rows of `kCols` values, distinct per row, column and `seed`.
Buffer batch(std::int64_t rows, double seed, std::int64_t cols = kCols) {
  Buffer x = must(Buffer::make(cgt::ElementType::f32, {rows, cols}));
  for (std::size_t i = 0; i < x.numel(); ++i)
    x.set(i, seed + static_cast<double>(i % 7) - (0.5 * static_cast<double>(i)));
  return x;
}

Buffer vector_of(std::vector<double> values) {
  Buffer v = must(Buffer::make(cgt::ElementType::f32, {static_cast<std::int64_t>(values.size())}));
  for (std::size_t i = 0; i < values.size(); ++i) v.set(i, values[i]);
  return v;
}

std::vector<std::int64_t> sizes_of(const Buffer& buffer) {
  return {buffer.sizes().begin(), buffer.sizes().end()};
}

// The model, row by row, with a static weight: y = 2x + w (per row), s = row sums of x, and
// c = w + 1, an output without the batch dimension (7 columns: never a bucket's size here).
Values row_model(Context& ctx, const Inputs& in) {
  const Buffer x = in[0];
  const Buffer w = in[1];
  const std::int64_t rows = x.sizes()[0];
  Buffer y = ctx.allocate(cgt::ElementType::f32, {rows, kCols});
  Buffer s = ctx.allocate(cgt::ElementType::f32, {rows});
  Buffer c = ctx.allocate(cgt::ElementType::f32, {7});
  ctx.launch([x, w, y, s, c, rows] {
    for (std::int64_t r = 0; r < rows; ++r) {
      double sum = 0;
      for (std::int64_t k = 0; k < kCols; ++k) {
        const auto at = static_cast<std::size_t>((r * kCols) + k);
        y.set(at, (2 * x.get(at)) + w.get(static_cast<std::size_t>(k)));
        sum += x.get(at);
      }
      s.set(static_cast<std::size_t>(r), sum);
    }
    for (std::size_t i = 0; i < 7; ++i) c.set(i, w.get(i % kCols) + 1);
  });
  return {y, s, c};
}

struct Reference {
  std::vector<double> y, s, c;
};

Reference row_model_reference(const Buffer& x, const Buffer& w) {
  Reference ref;
  const std::int64_t rows = x.sizes()[0];
  for (std::int64_t r = 0; r < rows; ++r) {
    double sum = 0;
    for (std::int64_t k = 0; k < kCols; ++k) {
      const auto at = static_cast<std::size_t>((r * kCols) + k);
      ref.y.push_back((2 * x.get(at)) + w.get(static_cast<std::size_t>(k)));
      sum += x.get(at);
    }
    ref.s.push_back(sum);
  }
  for (std::size_t i = 0; i < 7; ++i) ref.c.push_back(w.get(i % kCols) + 1);
  return ref;
}

struct EventLog {
  std::vector<cgt::Reason> reasons;
  std::vector<std::string> messages;
  cgt::LogSink sink() {
    return [this](const cgt::Event& event) {
      reasons.push_back(event.reason);
      messages.emplace_back(event.message);
    };
  }
};

cgt::host::Pool make_pool(cgt::Options options = {}) {
  options.debug_checks = true;
  return host_test::poisoned_pool(std::move(options));
}

cgt::FunctionOptions bucketed(std::vector<std::int64_t> sizes, cgt::Pad pad = {}) {
  return {.name = "model", .static_inputs = {1}, .buckets = {.sizes = std::move(sizes), .pad = pad, .per_input = {}}};
}

}  // namespace

TEST_CASE("every size up to the largest bucket equals eager, with one recording per bucket", "[buckets][host]") {
  auto pool = make_pool();
  auto model = must(pool.add_function(row_model, bucketed({2, 5, 8})));
  const Buffer w = vector_of({0.25, -1, 3});
  std::uint64_t padded = 0;
  std::vector<std::int64_t> node_of_size(9, -1);
  for (int round = 0; round < 3; ++round) {  // warm-up, recording, replay of each bucket
    for (std::int64_t n = 1; n <= 8; ++n) {
      pool.mark_step_begin();
      const Buffer x = batch(n, static_cast<double>((round * 10) + n));
      auto out = must(model({x, w}));
      const Reference ref = row_model_reference(x, w);
      INFO("size " << n << ", round " << round);
      CHECK(sizes_of(must(out.get(0))) == std::vector<std::int64_t>{n, kCols});
      CHECK(values_of(must(out.get(0))) == ref.y);
      CHECK(values_of(must(out.get(1))) == ref.s);
      CHECK(values_of(must(out.get(2))) == ref.c);  // no batch dimension: handed out whole
      // take() copies the call's rows only.
      CHECK(sizes_of(must(out.take(0))) == std::vector<std::int64_t>{n, kCols});
      if (n != 2 && n != 5 && n != 8) ++padded;
      if (round == 2) {
        CHECK(out.kind() == cgt::CallKind::replay);
        node_of_size[static_cast<std::size_t>(n)] = out.node();
      }
    }
  }
  const cgt::Stats stats = pool.stats();
  CHECK(stats.recordings == 3);  // one per bucket, not one per size
  CHECK(pool.roots().size() == 3);
  CHECK(stats.padded_calls == padded);
  CHECK(stats.eager_calls == 0);
  // Sizes share their bucket's graph: 1-2, 3-5, 6-8.
  CHECK(node_of_size[1] == node_of_size[2]);
  CHECK(node_of_size[3] == node_of_size[5]);
  CHECK(node_of_size[6] == node_of_size[8]);
  CHECK(node_of_size[2] != node_of_size[5]);
  CHECK(node_of_size[5] != node_of_size[8]);
  must(pool.check_memory());
}

TEST_CASE("sizes above the largest bucket run eagerly, with size_above_buckets", "[buckets][host]") {
  EventLog log;
  auto pool = make_pool({.log_sink = log.sink()});
  auto model = must(pool.add_function(row_model, bucketed({2, 4})));
  const Buffer w = vector_of({1, 2, 3});
  const Buffer x = batch(5, 1);
  auto out = must(model({x, w}));
  CHECK(out.kind() == cgt::CallKind::eager);
  CHECK(values_of(must(out.get(0))) == row_model_reference(x, w).y);
  CHECK(pool.stats().count(cgt::Reason::size_above_buckets) == 1);
  CHECK(pool.stats().padded_calls == 0);
  REQUIRE(log.reasons == std::vector{cgt::Reason::size_above_buckets});
  CHECK(log.messages[0].find("'model'") != std::string::npos);
  CHECK(log.messages[0].find("largest bucket") != std::string::npos);
  CHECK(cgt::to_string(cgt::Reason::size_above_buckets) == "size_above_buckets");
  // With or_error the same call fails instead.
  auto strict = make_pool({.or_error = true});
  auto strict_model = must(strict.add_function(row_model, bucketed({2, 4})));
  auto refused = strict_model({x, w});
  REQUIRE(!refused);
  CHECK(refused.error().code == cgt::Errc::graph_unavailable);
}

TEST_CASE("size 0 runs eagerly; a bucket's own size is neither padded nor sliced", "[buckets][host]") {
  auto pool = make_pool();
  auto model = must(pool.add_function(row_model, bucketed({2, 4})));
  const Buffer w = vector_of({1, 2, 3});
  auto empty = must(model({batch(0, 1), w}));
  CHECK(empty.kind() == cgt::CallKind::eager);
  CHECK(sizes_of(must(empty.get(0))) == std::vector<std::int64_t>{0, kCols});
  CHECK(pool.stats().count(cgt::Reason::size_not_graphed) == 1);
  for (int round = 0; round < 3; ++round) {
    pool.mark_step_begin();
    const Buffer x = batch(4, round);
    auto out = must(model({x, w}));
    CHECK(values_of(must(out.get(0))) == row_model_reference(x, w).y);
  }
  CHECK(pool.stats().padded_calls == 0);
  CHECK(pool.stats().recordings == 1);
}

TEST_CASE("bucket lists that cannot be meant are refused when the function is added", "[buckets][host]") {
  auto pool = make_pool();
  const auto refused = [&](cgt::FunctionOptions options, const std::string& says) {
    auto added = pool.add_function(row_model, std::move(options));
    REQUIRE(!added);
    CHECK(added.error().code == cgt::Errc::invalid_argument);
    CHECK(added.error().function == "model");
    CHECK(added.error().message.find(says) != std::string::npos);
  };
  refused(bucketed({4, 2}), "strictly increasing");
  refused(bucketed({2, 2, 4}), "strictly increasing");
  refused(bucketed({0, 2}), "not positive");
  refused(bucketed({-1}), "not positive");
  cgt::FunctionOptions both = bucketed({2, 4});
  both.graph_sizes = {2};
  refused(both, "choose one");
  // A size source the call does not have fails its first call, naming buckets.
  cgt::FunctionOptions far = bucketed({2, 4});
  far.size_source = {.input = 0, .dim = 5};
  auto model = must(pool.add_function(row_model, far));
  auto call = model({batch(2, 1), vector_of({1, 2, 3})});
  REQUIRE(!call);
  CHECK(call.error().code == cgt::Errc::invalid_argument);
  CHECK(call.error().message.find("buckets") != std::string::npos);
  // So does a per-input pad for an input the call does not have.
  cgt::FunctionOptions per = bucketed({2, 4});
  per.buckets.per_input = {{7, cgt::Pad::constant(1)}};
  auto per_model = must(pool.add_function(row_model, per));
  CHECK(per_model({batch(2, 1), vector_of({1, 2, 3})}).error().code == cgt::Errc::invalid_argument);
}

TEST_CASE("only inputs with the call's size along the bucket dimension are padded; static ones never",
          "[buckets][host]") {
  // The batch is dimension 1 of input 0; input 1 lacks that dimension, input 2 has another size
  // along it, input 3 is static with the call's size along it.
  auto pool = make_pool();
  std::vector<std::vector<std::int64_t>> seen;  // the sizes each input had in the function
  auto f = must(pool.add_function(
      [&seen](Context& ctx, Inputs in) {
        seen.clear();
        for (std::size_t i = 0; i < in.size(); ++i) seen.push_back(sizes_of(in[i]));
        const Buffer x = in[0];
        const Buffer bias = in[1];
        Buffer y = ctx.allocate(cgt::ElementType::f32, x.sizes());
        ctx.launch([x, bias, y] {
          const std::int64_t cols = x.sizes()[1];
          for (std::size_t i = 0; i < x.numel(); ++i) {
            y.set(i, x.get(i) + bias.get(i / static_cast<std::size_t>(cols)));
          }
        });
        return Values{y};
      },
      {.name = "columns",
       .static_inputs = {3},
       .buckets = {.sizes = {4, 8}, .pad = cgt::Pad::constant(0), .per_input = {}},
       .size_source = {.input = 0, .dim = 1}}));
  const Buffer bias = vector_of({1, 2});
  const Buffer other = batch(2, 0, 7);
  const Buffer table = batch(2, 0, 3);
  for (int round = 0; round < 3; ++round) {
    pool.mark_step_begin();
    const Buffer x = batch(2, round, 3);  // 2 x 3: size 3 along dimension 1, bucket 4
    auto out = must(f({x, bias, other, table}));
    CHECK(seen == std::vector<std::vector<std::int64_t>>{{2, 4}, {2}, {2, 7}, {2, 3}});
    std::vector<double> expected;
    for (std::size_t i = 0; i < x.numel(); ++i) expected.push_back(x.get(i) + bias.get(i / 3));
    CHECK(sizes_of(must(out.get(0))) == std::vector<std::int64_t>{2, 3});
    CHECK(values_of(must(out.get(0))) == expected);
  }
  CHECK(pool.stats().recordings == 1);
  CHECK(pool.stats().padded_calls == 3);
}

TEST_CASE("the caller chooses the padding: a constant per input, or the last row again", "[buckets][host]") {
  // The sum of every element of both inputs: it sees the padding, and is handed out whole.
  const auto total = host_test::sum_of_both_inputs(cgt::ElementType::f32);
  auto pool = make_pool();
  auto constant = must(pool.add_function(
      total, {.name = "constant",
              .buckets = {.sizes = {4}, .pad = cgt::Pad::constant(10), .per_input = {{1, cgt::Pad::constant(-1)}}}}));
  auto replicate = must(pool.add_function(
      total, {.name = "replicate", .buckets = {.sizes = {4}, .pad = cgt::Pad::replicate(), .per_input = {}}}));
  const Buffer a = batch(3, 1);  // 3 x 3: one row of padding
  const Buffer b = vector_of({5, 6, 7});
  double sum = 0;
  for (std::size_t i = 0; i < a.numel(); ++i) sum += a.get(i);
  sum += 18;
  const double last_row = a.get(6) + a.get(7) + a.get(8);
  for (int round = 0; round < 3; ++round) {
    pool.mark_step_begin();
    CHECK(values_of(must(must(constant({a, b})).take(0))) == std::vector<double>{sum + (3 * 10) + (-1)});
    pool.mark_step_begin();
    CHECK(values_of(must(must(replicate({a, b})).take(0))) == std::vector<double>{sum + last_row + 7});
  }
  CHECK(pool.stats().recordings == 2);
}

TEST_CASE("a sliced output keeps its whole bucket's memory live, and is reclaimed like any output", "[buckets][host]") {
  auto pool = make_pool();
  auto model = must(pool.add_function(row_model, bucketed({4})));
  const Buffer w = vector_of({1, 2, 3});
  for (int round = 0; round < 2; ++round) {  // warm up and record
    pool.mark_step_begin();
    (void)must(model({batch(3, 0), w}));
  }
  pool.mark_step_begin();
  const Buffer x = batch(3, 1);
  auto held = must(model({x, w}));
  CHECK(held.kind() == cgt::CallKind::replay);
  // Without a new step, the next call must not overwrite the held bucket: it records beside it.
  auto next = must(model({batch(2, 9), w}));
  CHECK(next.kind() == cgt::CallKind::recording);
  CHECK(values_of(must(held.get(0))) == row_model_reference(x, w).y);
  auto kept = must(held.release(0));
  held.reset();
  next.reset();
  pool.mark_step_begin();
  (void)must(model({batch(1, 5), w}));
  auto stale = kept.get();
  REQUIRE(!stale);
  CHECK(stale.error().code == cgt::Errc::output_overwritten);
  must(pool.check_memory());
}

TEST_CASE("bucketed functions chain: a sliced output passed on is padded again", "[buckets][host]") {
  auto pool = make_pool();
  auto first = must(pool.add_function(row_model, bucketed({2, 4, 8})));
  auto second = must(pool.add_function(row_model, bucketed({2, 4, 8})));
  const Buffer w = vector_of({1, -2, 0.5});
  for (int round = 0; round < 3; ++round) {
    for (std::int64_t n = 1; n <= 8; ++n) {
      pool.mark_step_begin();
      const Buffer x = batch(n, n);
      auto a = must(first({x, w}));
      const Buffer& y = must(a.get(0)).get();
      auto b = must(second({y, w}));
      const Buffer expected_x = must(y.clone());
      INFO("size " << n << ", round " << round);
      CHECK(values_of(must(b.get(0))) == row_model_reference(expected_x, w).y);
      CHECK(values_of(expected_x) == row_model_reference(x, w).y);
    }
  }
  CHECK(pool.stats().recordings == 6);  // per function, one per bucket
  must(pool.check_memory());
}

TEST_CASE("mutated inputs with buckets: a padded one runs eagerly, a static one replays", "[buckets][host]") {
  // state[0] += the sum of x; y = 2x. Padding x with zeros leaves the sum as it is.
  const auto accumulate = [](Context& ctx, Inputs in) {
    Buffer y = ctx.allocate(cgt::ElementType::f32, in[0].sizes());
    ctx.launch([x = in[0], state = in[1], y] {
      double sum = 0;
      for (std::size_t i = 0; i < x.numel(); ++i) {
        sum += x.get(i);
        y.set(i, 2 * x.get(i));
      }
      state.set(0, state.get(0) + sum);
    });
    return Values{y};
  };
  SECTION("a static mutated input (a cache) is never padded: the calls replay") {
    auto pool = make_pool();
    auto f = must(pool.add_function(accumulate, {.name = "acc",
                                                 .static_inputs = {1},
                                                 .mutated_inputs = {1},
                                                 .buckets = {.sizes = {4}, .pad = {}, .per_input = {}}}));
    const Buffer state = vector_of({0});
    double expected = 0;
    for (int round = 0; round < 4; ++round) {
      pool.mark_step_begin();
      const Buffer x = batch(3, round);
      for (std::size_t i = 0; i < x.numel(); ++i) expected += x.get(i);
      auto out = must(f({x, state}));
      CHECK(state.get(0) == expected);
      if (round >= 2) CHECK(out.kind() == cgt::CallKind::replay);
    }
  }
  SECTION("a mutated input that would be padded runs eagerly, and the caller sees the mutation") {
    EventLog log;
    auto pool = make_pool({.log_sink = log.sink()});
    auto f = must(pool.add_function(
        [](Context& ctx, Inputs in) {
          Buffer y = ctx.allocate(cgt::ElementType::f32, in[0].sizes());
          ctx.launch([x = in[0], y] {
            for (std::size_t i = 0; i < x.numel(); ++i) {
              y.set(i, x.get(i));
              x.set(i, x.get(i) + 1);
            }
          });
          return Values{y};
        },
        {.name = "bump", .mutated_inputs = {0}, .buckets = {.sizes = {4}, .pad = {}, .per_input = {}}}));
    const Buffer x = batch(3, 0);
    const std::vector<double> before = values_of(x);
    auto out = must(f({x}));
    CHECK(out.kind() == cgt::CallKind::eager);
    CHECK(values_of(must(out.get(0))) == before);
    std::vector<double> bumped = before;
    for (double& v : bumped) v += 1;
    CHECK(values_of(x) == bumped);
    CHECK(pool.stats().count(cgt::Reason::mutated_input) == 1);
    CHECK(pool.stats().padded_calls == 0);
    REQUIRE(!log.messages.empty());
    CHECK(log.messages[0].find("would be padded") != std::string::npos);
  }
}

TEST_CASE("copy_out_on_new_step keeps a sliced output's rows", "[buckets][host]") {
  auto pool = make_pool({.copy_out_on_new_step = true});
  auto model = must(pool.add_function(row_model, bucketed({4})));
  const Buffer w = vector_of({1, 2, 3});
  const Buffer x = batch(3, 2);
  auto held = must(model({x, w}));
  for (int round = 0; round < 3; ++round) {  // new steps reuse the bucket's memory
    pool.mark_step_begin();
    (void)must(model({batch(2, 40 + round), w}));
  }
  CHECK(sizes_of(must(held.get(0))) == std::vector<std::int64_t>{3, kCols});
  CHECK(values_of(must(held.get(0))) == row_model_reference(x, w).y);
  CHECK(pool.stats().leases_copied_out > 0);
}

// The rules go by size. An output that is not batch-shaped (c: 7 values) is cut to the call's rows
// when a bucket is 7, and a table that is not static is padded when it has the call's size: both
// unless named in whole_outputs / unpadded_inputs. Indices past the function's are refused.
TEST_CASE("outputs and inputs of the batch's size by coincidence are kept whole when named", "[buckets][host]") {
  auto pool = make_pool();
  cgt::FunctionOptions by_size = bucketed({3, 7});
  cgt::FunctionOptions named = bucketed({3, 7});
  named.name = "named";
  named.buckets.whole_outputs = {2};
  auto cut = must(pool.add_function(row_model, by_size));
  auto kept = must(pool.add_function(row_model, named));
  const Buffer w = vector_of({0.25, -1, 3});
  for (int round = 0; round < 3; ++round) {  // warm-up, recording, replay
    pool.mark_step_begin();
    const Buffer x = batch(5, round);
    const Reference ref = row_model_reference(x, w);
    auto a = must(cut({x, w}));
    CHECK(sizes_of(must(a.get(2))) == std::vector<std::int64_t>{5});  // what the option is for
    auto b = must(kept({x, w}));
    CHECK(values_of(must(b.get(2))) == ref.c);
    CHECK(values_of(must(b.get(0))) == ref.y);  // the batch's outputs are still sliced
    CHECK(values_of(must(b.get(1))) == ref.s);
  }

  // y = x * sum(t), t a table passed by value (not static) that has 3 values, as the batch has rows.
  const auto scaled = [](Context& ctx, Inputs in) {
    const Buffer x = in[0];
    const Buffer t = in[1];
    Buffer y = ctx.allocate_like(x);
    ctx.launch([x, t, y] {
      double total = 0;
      for (std::size_t i = 0; i < t.numel(); ++i) total += t.get(i);
      for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, x.get(i) * total);
    });
    return Values{y};
  };
  const cgt::Buckets padded_by_size{.sizes = {2, 5}, .pad = cgt::Pad::constant(1)};
  cgt::Buckets table_whole = padded_by_size;
  table_whole.unpadded_inputs = {1};
  auto padded_table = must(pool.add_function(scaled, {.name = "padded_table", .buckets = padded_by_size}));
  auto whole_table = must(pool.add_function(scaled, {.name = "whole_table", .buckets = table_whole}));
  const Buffer t = vector_of({1, 2, 3});
  for (int round = 0; round < 3; ++round) {
    pool.mark_step_begin();
    const Buffer x = batch(3, round);
    std::vector<double> expected = values_of(x);
    for (double& v : expected) v = static_cast<double>(static_cast<float>(v * 6));
    auto wrong = must(padded_table({x, t}));
    CHECK(values_of(must(wrong.get(0))) != expected);  // the table was padded with two ones
    auto right = must(whole_table({x, t}));
    CHECK(values_of(must(right.get(0))) == expected);
    CHECK(right.kind() != cgt::CallKind::eager);
  }

  cgt::FunctionOptions bad_output = bucketed({3, 7});
  bad_output.name = "bad_output";
  bad_output.buckets.whole_outputs = {3};  // row_model returns 3 outputs
  auto no_such_output = must(pool.add_function(row_model, bad_output));
  auto refused = no_such_output({batch(5, 0), w});
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().code == cgt::Errc::invalid_argument);
  cgt::Buckets bad_input = padded_by_size;
  bad_input.unpadded_inputs = {2};
  auto no_such_input = must(pool.add_function(scaled, {.name = "bad_input", .buckets = bad_input}));
  auto refused_input = no_such_input({batch(3, 0), t});
  REQUIRE_FALSE(refused_input.has_value());
  CHECK(refused_input.error().code == cgt::Errc::invalid_argument);
}

namespace {

// Outputs whose batch is not on the input's dimension: x.T ([cols, n]) and the [n, n] matrix of
// row dot products (attention's shape), both computed into new memory.
Values transposed_and_gram(Context& ctx, const Inputs& in) {
  const Buffer x = in[0];
  const std::int64_t rows = x.sizes()[0];
  const std::int64_t cols = x.sizes()[1];
  Buffer t = ctx.allocate(cgt::ElementType::f32, {cols, rows});
  Buffer g = ctx.allocate(cgt::ElementType::f32, {rows, rows});
  ctx.launch([x, t, g, rows, cols] {
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t k = 0; k < cols; ++k) {
        t.set(static_cast<std::size_t>((k * rows) + r), x.get(static_cast<std::size_t>((r * cols) + k)));
      }
      for (std::int64_t q = 0; q < rows; ++q) {
        double dot = 0;
        for (std::int64_t k = 0; k < cols; ++k) {
          dot += x.get(static_cast<std::size_t>((r * cols) + k)) * x.get(static_cast<std::size_t>((q * cols) + k));
        }
        g.set(static_cast<std::size_t>((r * rows) + q), dot);
      }
    }
  });
  return {t, g};
}

// The reference: the same function run outside any pool.
std::vector<std::vector<double>> transposed_and_gram_reference(const Buffer& x) {
  const std::int64_t rows = x.sizes()[0];
  const std::int64_t cols = x.sizes()[1];
  std::vector<double> t;
  std::vector<double> g;
  for (std::int64_t k = 0; k < cols; ++k) {
    for (std::int64_t r = 0; r < rows; ++r) t.push_back(x.get(static_cast<std::size_t>((r * cols) + k)));
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t q = 0; q < rows; ++q) {
      double dot = 0;
      for (std::int64_t k = 0; k < cols; ++k) {
        dot += x.get(static_cast<std::size_t>((r * cols) + k)) * x.get(static_cast<std::size_t>((q * cols) + k));
      }
      g.push_back(dot);
    }
  }
  return {t, g};
}

}  // namespace

// A bucketed function whose outputs carry the batch on dimension 1 (x.T) or on both (an [n, n]
// map): declared in output_dims, they are sliced there and equal eager's on warm-up, recording
// and replay, with the padded rows nowhere in them.
TEST_CASE("outputs with their batch on other dimensions are sliced where output_dims says", "[buckets][host]") {
  EventLog log;
  cgt::Options options;
  options.log_sink = log.sink();
  auto pool = make_pool(std::move(options));
  cgt::FunctionOptions declared{.name = "declared", .buckets = {.sizes = {4}, .pad = cgt::Pad::constant(-999)}};
  declared.buckets.output_dims = {{0, 1}, {1, 0}, {1, 1}};
  auto f = must(pool.add_function(transposed_and_gram, std::move(declared)));
  std::vector<cgt::CallKind> kinds;
  for (int call = 0; call < 3; ++call) {
    pool.mark_step_begin();
    const Buffer x = batch(3, call, 2);
    auto out = must(f({x}));
    kinds.push_back(out.kind());
    const auto reference = transposed_and_gram_reference(x);
    CHECK(sizes_of(must(out.get(0)).get()) == std::vector<std::int64_t>{2, 3});
    CHECK(sizes_of(must(out.get(1)).get()) == std::vector<std::int64_t>{3, 3});
    CHECK(values_of(must(out.get(0)).get()) == reference[0]);
    CHECK(values_of(must(out.get(1)).get()) == reference[1]);
  }
  using K = cgt::CallKind;
  CHECK(kinds == std::vector{K::warmup, K::recording, K::replay});
  CHECK(pool.stats().count(cgt::Reason::padded_output) == 0);
  CHECK(log.reasons.empty());
}

// Undeclared, such an output cannot be sliced right; it must never be handed out with padded
// rows silently: the call warns once (padded_output), naming the output and what to declare.
TEST_CASE("an undeclared output with the bucket's size on another dimension is warned about once", "[buckets][host]") {
  EventLog log;
  cgt::Options options;
  options.log_sink = log.sink();
  auto pool = make_pool(std::move(options));
  auto f = must(pool.add_function(transposed_and_gram,
                                  {.name = "undeclared", .buckets = {.sizes = {4}, .pad = cgt::Pad::constant(-999)}}));
  for (int call = 0; call < 3; ++call) {
    pool.mark_step_begin();
    (void)must(f({batch(3, call, 2)}));
  }
  REQUIRE(log.reasons == std::vector{cgt::Reason::padded_output});
  CHECK(log.messages[0].find("output 0 of 'undeclared'") != std::string::npos);
  CHECK(log.messages[0].find("output_dims") != std::string::npos);
  CHECK(pool.stats().count(cgt::Reason::padded_output) == 1);
  // At a bucket's own size nothing is padded: nothing to warn about.
  EventLog quiet;
  cgt::Options quiet_options;
  quiet_options.log_sink = quiet.sink();
  auto other = make_pool(std::move(quiet_options));
  auto g = must(other.add_function(transposed_and_gram,
                                   {.name = "at_bucket", .buckets = {.sizes = {4}, .pad = cgt::Pad::constant(-999)}}));
  (void)must(g({batch(4, 1, 2)}));
  CHECK(quiet.reasons.empty());
}

TEST_CASE("output_dims that cannot be meant fail the call with invalid_argument", "[buckets][host]") {
  auto pool = make_pool();
  cgt::FunctionOptions wrong_dim{.name = "wrong_dim", .buckets = {.sizes = {4}, .pad = cgt::Pad::constant(0)}};
  wrong_dim.buckets.output_dims = {{0, 0}};  // x.T has the batch on dimension 1, 2 rows on 0
  auto f = must(pool.add_function(transposed_and_gram, std::move(wrong_dim)));
  auto failed = f({batch(3, 1, 2)});
  REQUIRE_FALSE(failed);
  CHECK(failed.error().code == cgt::Errc::invalid_argument);
  CHECK(failed.error().message.find("output_dims") != std::string::npos);

  // Lists that contradict themselves are refused when the function is added, before any call's
  // work: an output both sliced and whole, an (output, dimension) pair named twice (which sliced
  // the dimension twice and failed every padded call after its work), an output whole twice.
  cgt::FunctionOptions both{.name = "both", .buckets = {.sizes = {4}, .pad = cgt::Pad::constant(0)}};
  both.buckets.output_dims = {{1, 0}};
  both.buckets.whole_outputs = {1};
  auto refused = pool.add_function(transposed_and_gram, std::move(both));
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code == cgt::Errc::invalid_argument);
  CHECK(refused.error().message.find("output_dims and whole_outputs both name output 1") != std::string::npos);
  cgt::FunctionOptions twice{.name = "twice", .buckets = {.sizes = {4}, .pad = cgt::Pad::constant(0)}};
  twice.buckets.output_dims = {{0, 1}, {0, 1}};
  auto repeated = pool.add_function(transposed_and_gram, std::move(twice));
  REQUIRE_FALSE(repeated);
  CHECK(repeated.error().code == cgt::Errc::invalid_argument);
  CHECK(repeated.error().message.find("names output 0 and dimension 1 twice") != std::string::npos);
  cgt::FunctionOptions whole_twice{.name = "whole_twice", .buckets = {.sizes = {4}, .pad = cgt::Pad::constant(0)}};
  whole_twice.buckets.whole_outputs = {1, 1};
  CHECK_FALSE(pool.add_function(transposed_and_gram, std::move(whole_twice)));
  // Distinct dimensions of one output are fine (a [n, n] map sliced on both).
  cgt::FunctionOptions two_dims{.name = "two_dims", .buckets = {.sizes = {4}, .pad = cgt::Pad::constant(0)}};
  two_dims.buckets.output_dims = {{1, 0}, {1, 1}};
  CHECK(pool.add_function(transposed_and_gram, std::move(two_dims)));

  cgt::FunctionOptions past{.name = "past", .buckets = {.sizes = {4}, .pad = cgt::Pad::constant(0)}};
  past.buckets.output_dims = {{2, 0}};  // two outputs
  auto h = must(pool.add_function(transposed_and_gram, std::move(past)));
  auto out_of_range = h({batch(3, 1, 2)});
  REQUIRE_FALSE(out_of_range);
  CHECK(out_of_range.error().code == cgt::Errc::invalid_argument);
}
