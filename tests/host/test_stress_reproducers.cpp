// Minimal reproducers of library bugs the stress test (test_stress.cpp) found: hidden, run them
// with "[repro]".
#include <catch2/catch_test_macros.hpp>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

import cgt;
import cgt.host;

namespace {
cgt::host::Buffer filled_buffer(std::vector<std::int64_t> sizes, double value) {
  cgt::host::Buffer b = *cgt::host::Buffer::make(cgt::ElementType::f32, sizes);
  b.fill(value);
  return b;
}
}  // namespace

TEST_CASE("repro: a static input mutated in place by a recording keeps the mutation", "[.][repro][stress][host]") {
  for (bool skip_warmup : {true, false}) {
    for (bool sliced : {false, true}) {
      cgt::host::PoolOptions options;
      options.tree.skip_warmup = skip_warmup;
      options.tree.debug_checks = true;
      auto pool = *cgt::host::make_pool(std::move(options));
      auto bump = *pool.add_function(
          [](cgt::host::Context& ctx, cgt::host::Inputs in) {
            cgt::host::Buffer y = ctx.allocate_like(in[0]);
            ctx.launch([w = in[0], x = in[1], y] {
              for (std::size_t i = 0; i < w.numel(); ++i) y.set(i, w.get(i) + x.get(i));
            });
            ctx.launch([w = in[0]] {
              for (std::size_t i = 0; i < w.numel(); ++i) w.set(i, w.get(i) + 1);
            });
            return cgt::host::Values{y};
          },
          {.name = "bump", .static_inputs = {0}, .mutated_inputs = {0}});
      cgt::host::Buffer backing = filled_buffer({5}, 10);
      cgt::host::Buffer w = sliced ? backing.slice(1, 5) : filled_buffer({4}, 10);
      const cgt::host::Buffer x = filled_buffer({4}, 1);
      for (int call = 0; call < 3; ++call) {
        auto out = bump({w, x});
        REQUIRE(out);
        INFO("skip_warmup " << skip_warmup << ", sliced " << sliced << ", call " << call << " ("
                            << cgt::to_string(out->kind()) << ")");
        CHECK((*out->get(0)).get().get(0) == 10 + call + 1);
        CHECK(w.get(0) == 10 + call + 1);
      }
    }
  }
}

TEST_CASE("repro: an escaped value of a reclaimed lease passed back in fails with output_overwritten",
          "[.][repro][stress][host]") {
  auto pool = *cgt::host::make_pool();
  auto twice = *pool.add_function(
      [](cgt::host::Context& ctx, cgt::host::Inputs in) {
        cgt::host::Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, 2 * x.get(i));
        });
        return cgt::host::Values{y};
      },
      {.name = "twice"});
  const cgt::host::Buffer x = filled_buffer({4}, 1);
  for (int call = 0; call < 3; ++call) {
    pool.mark_step_begin();
    auto first = twice({x});
    REQUIRE(first);
    const cgt::host::Buffer escaped = (*first->get(0)).get();  // a copy of the view: it escapes the lease
    pool.mark_step_begin();
    auto second = twice({x});  // reclaims the first output
    REQUIRE(second);
    REQUIRE(!first->get(0));
    second->reset();  // (else the second output may be that very memory, live again)
    auto again = twice({escaped});
    INFO("call " << call);
    REQUIRE(!again);
    CHECK(again.error().code == cgt::Errc::output_overwritten);
  }
}
