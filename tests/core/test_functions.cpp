// The functions' contract (src/core/functions.cppm), through what a program sees: a function's
// first call fixes its signature (and checks its options' input indices against it, keeping
// nothing when they do not fit), a later call is held to it with an error naming the function and
// the input, and every shape key (sizes, strides, a scalar's value) is a variant of its own whose
// graph a call with those shapes replays, or a call no graph can serve (a size outside
// `graph_sizes`, a key past `shape_key_limit`) runs eagerly. Functions is module-internal (its
// partition is not exported), so these tests drive it through a host pool.
#include "host/host_test.hpp"
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

using Catch::Matchers::ContainsSubstring;
using cgt::CallKind;
using cgt::Errc;
using host_test::Ran;
using host_test::ran;
using host_test::scaling;

TEST_CASE("a refused first call fixes no signature: the next first call does", "[functions][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  auto f = scaling(pool, "f", 2, {.static_inputs = {3}});
  const Buffer x = filled({4}, 1);

  auto too_few = f({x});
  REQUIRE_FALSE(too_few);
  CHECK(too_few.error().code == Errc::invalid_argument);
  CHECK(too_few.error().function == "f");
  CHECK_THAT(too_few.error().message,
             ContainsSubstring("static input 3 of 'f' is out of range: the call has 1 inputs"));

  // Nothing was kept: a call of four inputs is the first call, and fixes four.
  CHECK(output_values(must(f({x, x, x, x})), 0) == repeat(2));
  auto one = f({x});
  REQUIRE_FALSE(one);
  CHECK(one.error().code == Errc::wrong_input_count);
  CHECK_THAT(one.error().message, ContainsSubstring("'f' takes 4 inputs (as in its first call), not 1"));
}

TEST_CASE("a mutated input out of range is refused at the first call, naming the function", "[functions][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  auto f = scaling(pool, "f", 2, {.mutated_inputs = {1}});
  auto out = f({filled({4}, 1)});
  REQUIRE_FALSE(out);
  CHECK(out.error().code == Errc::invalid_argument);
  CHECK(out.error().function == "f");
  CHECK_THAT(out.error().message, ContainsSubstring("mutated input 1 of 'f' is out of range: the call has 1 inputs"));
}

TEST_CASE("a later call is held to the first call's kinds, element types and ranks; sizes may change",
          "[functions][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  auto f = scaling(pool, "f", 2);
  CHECK(output_values(must(f({filled({4}, 1)})), 0) == repeat(2));

  auto two = f({filled({4}, 1), filled({4}, 1)});
  REQUIRE_FALSE(two);
  CHECK(two.error().code == Errc::wrong_input_count);
  CHECK_THAT(two.error().message, ContainsSubstring("'f' takes 1 inputs (as in its first call), not 2"));

  auto scalar = f({2});
  REQUIRE_FALSE(scalar);
  CHECK(scalar.error().code == Errc::wrong_input_type);
  CHECK(scalar.error().input == 0);
  CHECK_THAT(scalar.error().message, ContainsSubstring("input 0 of 'f' must be a value, as in its first call"));

  const Buffer integers = must(Buffer::make(cgt::ElementType::i32, {4}));
  auto typed = f({integers});
  REQUIRE_FALSE(typed);
  CHECK(typed.error().code == Errc::wrong_input_type);
  CHECK(typed.error().input == 0);
  CHECK_THAT(typed.error().message, ContainsSubstring("input 0 of 'f' has element type"));
  CHECK_THAT(typed.error().message, ContainsSubstring("but its first call had"));

  auto matrix = f({filled({2, 2}, 1)});
  REQUIRE_FALSE(matrix);
  CHECK(matrix.error().code == Errc::wrong_shape);
  CHECK(matrix.error().input == 0);
  CHECK_THAT(matrix.error().message, ContainsSubstring("input 0 of 'f' has 2 dimensions, but its first call had 1"));

  // Another size at the same rank is a new variant, not an error.
  CHECK(output_values(must(f({filled({8}, 3)})), 0) == repeat(6, 8));
}

TEST_CASE("each shape key is a variant: a call with known shapes replays that variant's graph, in any order",
          "[functions][host]") {
  auto pool = poisoned_pool({.skip_warmup = true, .debug_checks = true});
  auto f = scaling(pool, "f", 2);
  const Buffer x4 = filled({4}, 1);
  const Buffer x8 = filled({8}, 2);
  CHECK(ran(must(f({x4}))) == Ran{CallKind::recording, 0});
  CHECK(ran(must(f({x8}))) == Ran{CallKind::recording, 1});
  CHECK(ran(must(f({x4}))) == Ran{CallKind::replay, 0});  // not the last shapes: found by key
  CHECK(ran(must(f({x4}))) == Ran{CallKind::replay, 0});  // the last shapes
  CHECK(ran(must(f({x8}))) == Ran{CallKind::replay, 1});
  auto out = must(f({x8}));
  CHECK(ran(out) == Ran{CallKind::replay, 1});
  CHECK(output_values(out, 0) == repeat(4, 8));
  CHECK(pool.stats().recordings == 2);
}

TEST_CASE("a scalar's value is part of the shape key: another value records, the same replays", "[functions][host]") {
  auto pool = poisoned_pool({.skip_warmup = true, .debug_checks = true});
  auto add = must(pool.add_function(
      [](Context& ctx, Inputs in) {
        const Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y, k = in.scalar(1)] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, x.get(i) + static_cast<double>(k));
        });
        return Values{y};
      },
      {.name = "add"}));
  const Buffer x = filled({4}, 1);
  // Each call's outputs are dropped before the next, so that every call is a root of the tree.
  const auto call = [&](std::int64_t k) {
    auto out = must(add({x, k}));
    return std::pair{ran(out), output_values(out, 0)};
  };
  CHECK(call(2) == std::pair{Ran{CallKind::recording, 0}, repeat(3)});
  CHECK(call(3) == std::pair{Ran{CallKind::recording, 1}, repeat(4)});
  CHECK(call(2) == std::pair{Ran{CallKind::replay, 0}, repeat(3)});
  CHECK(call(3) == std::pair{Ran{CallKind::replay, 1}, repeat(4)});
}

TEST_CASE("a size outside graph_sizes and a key past shape_key_limit run eagerly, and the graphed ones replay",
          "[functions][host]") {
  auto pool = poisoned_pool({.skip_warmup = true, .debug_checks = true, .shape_key_limit = 2});
  auto f = scaling(pool, "f", 2, {.graph_sizes = {4, 8, 16}});
  CHECK(ran(must(f({filled({4}, 1)}))).kind == CallKind::recording);
  auto unlisted = must(f({filled({3}, 1)}));
  CHECK(unlisted.kind() == CallKind::eager);
  CHECK(output_values(unlisted, 0) == repeat(2, 3));
  CHECK(pool.stats().count(cgt::Reason::size_not_graphed) == 1);

  CHECK(ran(must(f({filled({8}, 1)}))).kind == CallKind::recording);  // the second key
  auto past_limit = must(f({filled({16}, 1)}));                       // a third key
  CHECK(past_limit.kind() == CallKind::eager);
  CHECK(output_values(past_limit, 0) == repeat(2, 16));
  CHECK(pool.stats().count(cgt::Reason::shape_key_limit) == 1);

  CHECK(ran(must(f({filled({4}, 1)}))).kind == CallKind::replay);
  CHECK(ran(must(f({filled({8}, 1)}))).kind == CallKind::replay);
}

TEST_CASE("a function passing shape_key_warn_limit distinct keys is warned about once", "[functions][host]") {
  auto pool = poisoned_pool({.skip_warmup = true, .debug_checks = true, .shape_key_warn_limit = 1});
  auto f = scaling(pool, "f", 2);
  auto g = scaling(pool, "g", 3);
  CHECK(output_values(must(f({filled({4}, 1)})), 0) == repeat(2));
  CHECK(pool.stats().count(cgt::Reason::many_shape_keys) == 0);
  CHECK(output_values(must(f({filled({8}, 1)})), 0) == repeat(2, 8));  // past the limit: the warning
  CHECK(pool.stats().count(cgt::Reason::many_shape_keys) == 1);
  CHECK(output_values(must(f({filled({16}, 1)})), 0) == repeat(2, 16));  // the same function: no more
  CHECK(pool.stats().count(cgt::Reason::many_shape_keys) == 1);
  CHECK(output_values(must(g({filled({4}, 1)})), 0) == repeat(3));
  CHECK(output_values(must(g({filled({8}, 1)})), 0) == repeat(3, 8));  // another function: its own
  CHECK(pool.stats().count(cgt::Reason::many_shape_keys) == 2);
}
