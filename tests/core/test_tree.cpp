// The tree's contract (src/core/tree.cppm, tree.cpp), through what a program sees: node views
// (found by id), the node each call replayed or recorded, and why a node was recorded. Tree is
// module-internal, so these tests drive it through a host pool. The pools record at a function's
// first call (`skip_warmup`), so every call below records or replays a graph node.
#include "host/host_test.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

using cgt::CallKind;
using cgt::NodeReason;
using host_test::Ran;
using host_test::ran;
using host_test::scaling;

namespace {

/// (2x, 3x), each in a storage of its own.
cgt::host::Function two_storages(cgt::host::Pool& pool, std::string name) {
  return must(pool.add_function(
      [](Context& ctx, Inputs in) {
        const Buffer doubled = ctx.allocate_like(in[0]);
        const Buffer tripled = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], doubled, tripled] {
          for (std::size_t i = 0; i < x.numel(); ++i) {
            doubled.set(i, 2 * x.get(i));
            tripled.set(i, 3 * x.get(i));
          }
        });
        return Values{doubled, tripled};
      },
      {.name = std::move(name)}));
}

/// y = 2x, handed out twice: two leases on one storage.
cgt::host::Function one_storage_twice(cgt::host::Pool& pool, std::string name) {
  return must(pool.add_function(
      [](Context& ctx, Inputs in) {
        const Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, 2 * x.get(i));
        });
        return Values{y, y};
      },
      {.name = std::move(name)}));
}

std::vector<std::int64_t> ids_of(const std::vector<cgt::Node>& nodes) {
  std::vector<std::int64_t> ids;
  for (const cgt::Node& node : nodes) ids.push_back(node.id());
  return ids;
}

std::vector<std::string> functions_of(const std::vector<cgt::Node>& nodes) {
  std::vector<std::string> names;
  for (const cgt::Node& node : nodes) names.push_back(node.function());
  return names;
}

}  // namespace

TEST_CASE("graph nodes are numbered in recording order and kept under their parent, by function and shapes",
          "[tree][host]") {
  auto pool = poisoned_pool({.skip_warmup = true, .debug_checks = true});
  auto f = scaling(pool, "f", 2);
  auto g = scaling(pool, "g", 3);
  const Buffer x4 = filled({4}, 1);
  const Buffer x8 = filled({8}, 1);
  {
    auto a = must(f({x4}));
    auto b = must(g({x4}));  // `a` is live: under f
    CHECK(ran(a) == Ran{CallKind::recording, 0});
    CHECK(ran(b) == Ran{CallKind::recording, 1});
  }
  {
    auto a = must(f({x4}));
    auto c = must(g({x8}));  // another shape of g: no node of it under f yet
    CHECK(ran(a) == Ran{CallKind::replay, 0});
    CHECK(ran(c) == Ran{CallKind::recording, 2});
  }
  CHECK(ran(must(g({x4}))) == Ran{CallKind::recording, 3});  // nothing live: a root, though g at 4 is under f
  CHECK(ran(must(f({x8}))) == Ran{CallKind::recording, 4});  // another shape of f: a root of its own

  const std::vector<cgt::Node> roots = pool.roots();
  REQUIRE(ids_of(roots) == std::vector<std::int64_t>{0, 3, 4});
  CHECK(functions_of(roots) == std::vector<std::string>{"f", "g", "f"});
  const std::vector<cgt::Node> under_f = roots[0].children();
  REQUIRE(ids_of(under_f) == std::vector<std::int64_t>{1, 2});
  CHECK(functions_of(under_f) == std::vector<std::string>{"g", "g"});
  CHECK(under_f[1].depth() == 1);
  CHECK(roots[0].num_descendants() == 2);
  CHECK(roots[1].children().empty());

  // Each call is matched against the nodes of its own shapes under the current node.
  {
    auto a = must(f({x4}));
    CHECK(ran(must(g({x8}))) == Ran{CallKind::replay, 2});
  }
  {
    auto a = must(f({x4}));
    CHECK(ran(must(g({x4}))) == Ran{CallKind::replay, 1});
  }
  CHECK(ran(must(g({x4}))) == Ran{CallKind::replay, 3});
  CHECK(pool.stats().recordings == 5);

  // A view finds its node by id at every use, until the tree is cleared.
  const cgt::Node node = std::move(pool.roots()[1]);
  CHECK(node.exists());
  CHECK(node.function() == "g");
  CHECK(node.depth() == 0);
  must(pool.shutdown());
  CHECK_FALSE(node.exists());
  CHECK(node.function().empty());
}

TEST_CASE("a call replays the first node of its shapes under the current node, in recording order, whose liveness fits",
          "[tree][host]") {
  auto pool = poisoned_pool({.skip_warmup = true, .debug_checks = true});
  auto f = two_storages(pool, "f");
  auto g = scaling(pool, "g", 5);
  const Buffer x = filled({4}, 1);
  {
    auto ys = must(f({x}));
    must(ys.release(0)).reset();  // f's first output dies; the second keeps the path going
    auto z = must(g({x}));
    CHECK(ran(z) == Ran{CallKind::recording, 1});  // replays only where f's first output is dead
  }
  {
    auto ys = must(f({x}));
    auto z = must(g({x}));  // both of f's outputs live: node 1 would overwrite the first
    CHECK(ran(ys) == Ran{CallKind::replay, 0});
    CHECK(ran(z) == Ran{CallKind::recording, 2});
    CHECK(output_values(ys, 0) == repeat(2));
  }
  {
    auto ys = must(f({x}));
    must(ys.release(0)).reset();
    auto z = must(g({x}));  // node 2 fits too, but node 1 came first
    CHECK(ran(z) == Ran{CallKind::replay, 1});
    CHECK(output_values(z, 0) == repeat(5));
  }
  {
    auto ys = must(f({x}));
    auto z = must(g({x}));
    CHECK(ran(z) == Ran{CallKind::replay, 2});
    CHECK(output_values(ys, 0) == repeat(2));
    CHECK(output_values(ys, 1) == repeat(3));
  }

  const std::vector<cgt::Node> under_f = pool.roots()[0].children();
  REQUIRE(ids_of(under_f) == std::vector<std::int64_t>{1, 2});
  CHECK(under_f[0].reason() == NodeReason::first_call);
  CHECK(under_f[0].expected_dead_before() == std::vector<cgt::PathIndex>{{.depth = 0, .output = 0}});
  CHECK(under_f[1].reason() == NodeReason::new_liveness_pattern);
  CHECK(under_f[1].expected_dead_before().empty());
  must(pool.check_memory());
}

TEST_CASE("a call whose pool-managed input moved records a sibling; each address then replays its own node",
          "[tree][host]") {
  auto pool = poisoned_pool({.skip_warmup = true, .debug_checks = true});
  auto f = two_storages(pool, "f");
  auto g = scaling(pool, "g", 5);
  const Buffer x = filled({4}, 1);
  // g reads output `which` of f in place (an output of an earlier graph of the path).
  const auto f_then_g = [&](std::size_t which) {
    auto ys = must(f({x}));
    auto z = must(g({must(ys.get(which))}));
    return std::pair{ran(z), output_values(z, 0)};
  };
  CHECK(f_then_g(0) == std::pair{Ran{CallKind::recording, 1}, repeat(10)});
  CHECK(f_then_g(0) == std::pair{Ran{CallKind::replay, 1}, repeat(10)});
  CHECK(f_then_g(1) == std::pair{Ran{CallKind::recording, 2}, repeat(15)});
  CHECK(f_then_g(0) == std::pair{Ran{CallKind::replay, 1}, repeat(10)});
  CHECK(f_then_g(1) == std::pair{Ran{CallKind::replay, 2}, repeat(15)});

  const std::vector<cgt::Node> under_f = pool.roots()[0].children();
  REQUIRE(ids_of(under_f) == std::vector<std::int64_t>{1, 2});
  CHECK(under_f[1].reason() == NodeReason::managed_input_moved);
  CHECK(pool.stats().rerecords == 1);
  CHECK(pool.stats().by_reason[static_cast<std::size_t>(cgt::Reason::managed_input_moved)] == 1);
}

TEST_CASE("a static input at a new address records a sibling and keeps the old node for the old address",
          "[tree][host]") {
  auto pool = poisoned_pool({.skip_warmup = true, .debug_checks = true});
  auto h = scaling(pool, "h", 2, {.static_inputs = {0}});
  const Buffer w1 = filled({4}, 1);
  const Buffer w2 = filled({4}, 2);
  const auto call = [&](const Buffer& w) {
    auto out = must(h({w}));
    return std::pair{ran(out), output_values(out, 0)};
  };
  CHECK(call(w1) == std::pair{Ran{CallKind::recording, 0}, repeat(2)});
  CHECK(call(w2) == std::pair{Ran{CallKind::recording, 1}, repeat(4)});
  CHECK(call(w1) == std::pair{Ran{CallKind::replay, 0}, repeat(2)});
  CHECK(call(w2) == std::pair{Ran{CallKind::replay, 1}, repeat(4)});

  const std::vector<cgt::Node> roots = pool.roots();
  REQUIRE(ids_of(roots) == std::vector<std::int64_t>{0, 1});
  CHECK(roots[1].reason() == NodeReason::static_input_moved);
  CHECK(pool.stats().rerecords == 1);
  CHECK(pool.stats().by_reason[static_cast<std::size_t>(cgt::Reason::static_input_moved)] == 1);
}

TEST_CASE("under on_static_input_moved = error, a node that fits but for a static input fails the call, naming it",
          "[tree][host]") {
  auto pool = poisoned_pool(
      {.skip_warmup = true, .on_static_input_moved = cgt::OnStaticInputMoved::error, .debug_checks = true});
  auto f = two_storages(pool, "f");
  auto h = scaling(pool, "h", 2, {.static_inputs = {0}});
  // h(w, y) = 2w: w is static, y an output of f read in place.
  const Buffer x = filled({4}, 1);
  const Buffer w1 = filled({4}, 1);
  const Buffer w2 = filled({4}, 2);
  const auto f_then_h = [&](const Buffer& w, std::size_t which) {
    auto ys = must(f({x}));
    return h({w, must(ys.get(which))});
  };
  CHECK(ran(must(f_then_h(w1, 0))) == Ran{CallKind::recording, 1});
  CHECK(ran(must(f_then_h(w1, 0))) == Ran{CallKind::replay, 1});

  // Node 1 does not fit for its pool-managed input before its static input is looked at: a new
  // node, no error.
  auto managed_moved = must(f_then_h(w2, 1));
  CHECK(ran(managed_moved) == Ran{CallKind::recording, 2});
  CHECK(output_values(managed_moved, 0) == repeat(4));
  managed_moved.reset();

  // Node 1 fits in every other way: the search ends there, with the error, though node 2 has w2.
  auto moved = f_then_h(w2, 0);
  REQUIRE_FALSE(moved);
  CHECK(moved.error().code == cgt::Errc::static_input_moved);
  CHECK(moved.error().node == 1);
  CHECK(moved.error().input == 0);
  CHECK(moved.error().function == "h");

  CHECK(ran(must(f_then_h(w1, 0))) == Ran{CallKind::replay, 1});  // the failed call changed nothing
  CHECK(ran(must(f_then_h(w2, 1))) == Ran{CallKind::replay, 2});
  const std::vector<cgt::Node> under_f = pool.roots()[0].children();
  REQUIRE(ids_of(under_f) == std::vector<std::int64_t>{1, 2});
  CHECK(under_f[1].reason() == NodeReason::managed_input_moved);
}

TEST_CASE("under on_static_input_moved = error, the search ends at the first node that fits but for a static input",
          "[tree][host]") {
  auto pool = poisoned_pool(
      {.skip_warmup = true, .on_static_input_moved = cgt::OnStaticInputMoved::error, .debug_checks = true});
  auto f = two_storages(pool, "f");
  auto h = scaling(pool, "h", 2, {.static_inputs = {0}});
  const Buffer x = filled({4}, 1);
  const Buffer w1 = filled({4}, 1);
  const Buffer w2 = filled({4}, 2);
  // h(w) after f, with f's first output dropped first (`drop_first`) or kept.
  const auto f_then_h = [&](bool drop_first, const Buffer& w) {
    auto ys = must(f({x}));
    if (drop_first) must(ys.release(0)).reset();
    return h({w});
  };
  CHECK(ran(must(f_then_h(true, w1))) == Ran{CallKind::recording, 1});  // needs f's first output dead
  // Node 1 does not fit for liveness, before its static input is looked at: a new node for w2.
  CHECK(ran(must(f_then_h(false, w2))) == Ran{CallKind::recording, 2});

  // Node 1 fits but for w2; node 2, recorded later, fits in every way: the search ended at node 1.
  auto moved = f_then_h(true, w2);
  REQUIRE_FALSE(moved);
  CHECK(moved.error().code == cgt::Errc::static_input_moved);
  CHECK(moved.error().node == 1);

  CHECK(ran(must(f_then_h(true, w1))) == Ran{CallKind::replay, 1});
  CHECK(ran(must(f_then_h(false, w2))) == Ran{CallKind::replay, 2});
}

TEST_CASE("a node that consumed a lease replays only where that lease is the storage's last: the memory dies in it",
          "[tree][host]") {
  auto pool = poisoned_pool({.skip_warmup = true, .debug_checks = true});
  auto f = one_storage_twice(pool, "f");
  auto g = scaling(pool, "g", 5);
  const Buffer x = filled({4}, 1);
  // g consumes f's first lease; the second is dropped first, or kept (`keep_second`).
  const auto f_then_g = [&](bool keep_second) {
    auto ys = must(f({x}));
    auto first = must(ys.release(0));
    auto second = must(ys.release(1));
    if (!keep_second) second.reset();
    auto z = must(g({std::move(first)}));
    CHECK(output_values(z, 0) == repeat(10));
    if (keep_second) CHECK(values_of(must(second.get()).get()) == repeat(2));
    return ran(z);
  };
  CHECK(f_then_g(false) == Ran{CallKind::recording, 1});
  CHECK(f_then_g(false) == Ran{CallKind::replay, 1});
  CHECK(f_then_g(true) == Ran{CallKind::recording, 2});  // node 1 would let the storage die under `second`
  CHECK(f_then_g(false) == Ran{CallKind::replay, 1});
  CHECK(f_then_g(true) == Ran{CallKind::replay, 2});

  const std::vector<cgt::Node> under_f = pool.roots()[0].children();
  REQUIRE(ids_of(under_f) == std::vector<std::int64_t>{1, 2});
  CHECK(under_f[0].expected_dead_after() ==
        std::vector<cgt::PathIndex>{{.depth = 0, .output = 0}, {.depth = 0, .output = 1}});
  CHECK(under_f[1].reason() == NodeReason::new_liveness_pattern);
  CHECK(under_f[1].expected_dead_after().empty());
  must(pool.check_memory());
}
