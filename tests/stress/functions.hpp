// The stress test's functions: every kind of output a pool function can return (new memory, two
// outputs aliasing one buffer, a slice, a transpose, a pass-through of an input, an in-place
// mutation of an input, an empty output) and every kind of input (copied, static, pool-managed,
// scalar), each with its eager model.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <tuple>
#include <vector>

#include "stress/model.hpp"

import cgt.host;

namespace stress {

/// What a test asks a function to do on its next run of the body (warm-up, recording, eager).
struct Control {
  enum class Throw : std::uint8_t { none, std_error, non_std };
  Throw throw_next = Throw::none;
  std::function<void()> before_throw;  // e.g. drop a lease the test holds
  bool threw = false;
  std::byte* kept_storage = nullptr;  // the block kept_buffer keeps and writes, whoever owns it now
};

enum class In : std::uint8_t { vec, mat, scalar };

/// Output o of a function is a view of temp `temp` (new memory of the call) or of input `input`.
struct Out {
  int temp = -1;
  int input = -1;
};

struct Expected {
  std::vector<Value> outputs;
  std::vector<std::pair<std::size_t, Value>> mutated;  // input -> its values after the call
};

struct FnDef {
  std::string name;
  std::vector<In> inputs;
  std::vector<std::size_t> statics, mutated;
  std::vector<std::int64_t> graph_sizes;
  cgt::Buckets buckets;  // none unless sizes are given
  std::vector<Out> outs;
  std::function<Expected(const std::vector<Value>&, const std::vector<std::int64_t>&)> model;
  std::function<cgt::host::Callable(std::shared_ptr<Control>)> make;
  bool throws = false;                // obeys Control
  bool same_lengths = false;          // its vector inputs must have one length
  bool keeps_pool_buffer = false;     // returns a buffer kept from an earlier call
  bool control_flow_on_host = false;  // FunctionOptions::control_flow_on_host
};

using cgt::host::Buffer;
using cgt::host::Context;
using cgt::host::Inputs;
using cgt::host::Values;

inline Buffer map_kernel(Context& ctx, const Buffer& x, std::function<double(double)> f) {
  Buffer y = ctx.allocate_like(x);
  ctx.launch([x, y, f] {
    for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, f(x.get(i)));
  });
  return y;
}
inline Buffer zip_kernel(Context& ctx, const Buffer& a, const Buffer& b, std::function<double(double, double)> f) {
  Buffer y = ctx.allocate_like(a);
  ctx.launch([a, b, y, f] {
    for (std::size_t i = 0; i < a.numel(); ++i) y.set(i, f(a.get(i), b.get(i)));
  });
  return y;
}
inline Buffer head_view(const Buffer& x) {
  return x.slice(0, x.sizes()[0] / 2);
}
inline Buffer transpose_view(const Buffer& x) {
  const std::int64_t sizes[] = {x.sizes()[1], x.sizes()[0]};
  const std::int64_t strides[] = {x.strides()[1], x.strides()[0]};
  return x.restrided(x.offset(), sizes, strides);
}

/// Throws what `control` asks for, after `before_throw`.
inline void maybe_throw(Control& control) {
  const auto what = control.throw_next;
  if (what == Control::Throw::none) return;
  control.throw_next = Control::Throw::none;
  if (control.before_throw) control.before_throw();
  control.threw = true;
  if (what == Control::Throw::std_error) throw std::runtime_error("injected failure");
  throw 42;  // NOLINT(hicpp-exception-baseclass): a non-std exception, on purpose
}

/// The iterations `loop_and_branch` asks of its loop: the magnitude of `first`, truncated, mod 5
/// (0 for a NaN or an infinity; any double, however large, without overflow).
inline int loop_count(double first) {
  const double remainder = std::fmod(std::fabs(first), 5.0);
  return std::isfinite(remainder) ? static_cast<int>(remainder) : 0;
}

/// How often a function ran: its C++ body (which runs under a capture too), and its work (a kernel
/// of its own after the body's, which runs in an eager run, a warm-up, a recording's first run and
/// every replay). A call must run the work once: never twice, whatever it gave up on the way.
struct Runs {
  std::uint64_t bodies = 0;
  std::uint64_t kernels = 0;
};

/// `inner`, counting its runs in `runs`.
inline cgt::host::Callable counted(cgt::host::Callable inner, std::shared_ptr<Runs> runs) {
  return [inner = std::move(inner), runs = std::move(runs)](Context& ctx, Inputs in) mutable {
    ++runs->bodies;
    Values out = inner(ctx, in);
    ctx.launch([runs] { ++runs->kernels; });
    return out;
  };
}

template <class Body>
std::function<cgt::host::Callable(std::shared_ptr<Control>)> body(Body make_body) {
  return [make_body](std::shared_ptr<Control> control) -> cgt::host::Callable { return make_body(control); };
}

inline std::vector<FnDef> catalog() {
  std::vector<FnDef> defs;
  defs.push_back({.name = "affine",
                  .inputs = {In::vec},
                  .outs = {{.temp = 0}},
                  .model = [](const auto& x,
                              const auto&) { return Expected{{map(x[0], [](double v) { return 2 * v + 1; })}, {}}; },
                  .make = body([](auto) {
                    return [](Context& ctx, Inputs in) {
                      return Values{map_kernel(ctx, in[0], [](double v) { return 2 * v + 1; })};
                    };
                  })});
  // Lazy set-up that depends on the shape (a workspace grown for a new size): the first run at
  // each length synchronises, which breaks a capture. With warm_up_each_shape = false a new
  // length records without a warm-up, fails, and must warm up and record again.
  defs.push_back({.name = "lazy_setup",
                  .inputs = {In::vec},
                  .outs = {{.temp = 0}},
                  .model = [](const auto& x,
                              const auto&) { return Expected{{map(x[0], [](double v) { return 3 * v - 1; })}, {}}; },
                  .make = body([](auto) {
                    auto lengths_set_up = std::make_shared<std::set<std::int64_t>>();
                    return [lengths_set_up](Context& ctx, Inputs in) {
                      if (lengths_set_up->insert(in[0].numel()).second) ctx.synchronize();
                      return Values{map_kernel(ctx, in[0], [](double v) { return 3 * v - 1; })};
                    };
                  })});
  defs.push_back({.name = "square_and_head",
                  .inputs = {In::vec},
                  .outs = {{.temp = 0}, {.temp = 0}},
                  .model =
                      [](const auto& x, const auto&) {
                        Value y = map(x[0], [](double v) { return v * v; });
                        return Expected{{y, head(y, y.sizes[0] / 2)}, {}};
                      },
                  .make = body([](auto) {
                    return [](Context& ctx, Inputs in) {
                      Buffer y = map_kernel(ctx, in[0], [](double v) { return v * v; });
                      return Values{y, head_view(y)};
                    };
                  })});
  defs.push_back({.name = "pass_and_shift",
                  .inputs = {In::vec},
                  .outs = {{.input = 0}, {.temp = 0}},
                  .model = [](const auto& x,
                              const auto&) { return Expected{{x[0], map(x[0], [](double v) { return v + 1; })}, {}}; },
                  .make = body([](auto) {
                    return [](Context& ctx, Inputs in) {
                      return Values{in[0], map_kernel(ctx, in[0], [](double v) { return v + 1; })};
                    };
                  })});
  defs.push_back({.name = "add_in_place",
                  .inputs = {In::vec, In::scalar},
                  .mutated = {0},
                  .outs = {{.input = 0}},
                  .model =
                      [](const auto& x, const auto& s) {
                        const double by = static_cast<double>(s[1]);
                        Value y = map(x[0], [by](double v) { return v + by; });
                        return Expected{{y}, {{0, y}}};
                      },
                  .make = body([](auto) {
                    return [](Context& ctx, Inputs in) {
                      ctx.launch([x = in[0], by = static_cast<double>(in.scalar(1))] {
                        for (std::size_t i = 0; i < x.numel(); ++i) x.set(i, x.get(i) + by);
                      });
                      return Values{in[0]};
                    };
                  })});
  defs.push_back({.name = "static_axpy_and_bump",
                  .inputs = {In::vec, In::vec},
                  .statics = {0},
                  .mutated = {0},
                  .outs = {{.temp = 0}},
                  .model =
                      [](const auto& x, const auto&) {
                        return Expected{{zip(x[0], x[1], [](double w, double v) { return w + v; })},
                                        {{0, map(x[0], [](double w) { return w + 1; })}}};
                      },
                  .make = body([](auto) {
                    return [](Context& ctx, Inputs in) {
                      Buffer y = zip_kernel(ctx, in[0], in[1], [](double w, double v) { return w + v; });
                      ctx.launch([w = in[0]] {
                        for (std::size_t i = 0; i < w.numel(); ++i) w.set(i, w.get(i) + 1);
                      });
                      return Values{y};
                    };
                  }),
                  .same_lengths = true});
  defs.push_back(
      {.name = "empty_and_less",
       .inputs = {In::vec},
       .outs = {{.temp = 0}, {.temp = 1}},
       .model = [](const auto& x,
                   const auto&) { return Expected{{Value{{0}, {}}, map(x[0], [](double v) { return v - 1; })}, {}}; },
       .make = body([](auto) {
         return [](Context& ctx, Inputs in) {
           return Values{ctx.allocate(cgt::host::ElementType::f32, {0}),
                         map_kernel(ctx, in[0], [](double v) { return v - 1; })};
         };
       })});
  defs.push_back({.name = "triple_and_transpose",
                  .inputs = {In::mat},
                  .outs = {{.temp = 0}, {.temp = 0}},
                  .model =
                      [](const auto& x, const auto&) {
                        Value y = map(x[0], [](double v) { return 3 * v; });
                        return Expected{{transposed(y), y}, {}};
                      },
                  .make = body([](auto) {
                    return [](Context& ctx, Inputs in) {
                      Buffer y = map_kernel(ctx, in[0], [](double v) { return 3 * v; });
                      return Values{transpose_view(y), y};
                    };
                  })});
  defs.push_back({.name = "scale_by_scalar",
                  .inputs = {In::vec, In::scalar},
                  .outs = {{.temp = 0}},
                  .model =
                      [](const auto& x, const auto& s) {
                        const double by = static_cast<double>(s[1]);
                        return Expected{{map(x[0], [by](double v) { return v * by; })}, {}};
                      },
                  .make = body([](auto) {
                    return [](Context& ctx, Inputs in) {
                      const double by = static_cast<double>(in.scalar(1));
                      return Values{map_kernel(ctx, in[0], [by](double v) { return v * by; })};
                    };
                  })});
  defs.push_back({.name = "sum_and_difference",
                  .inputs = {In::vec, In::vec},
                  .outs = {{.temp = 0}, {.temp = 1}},
                  .model =
                      [](const auto& x, const auto&) {
                        return Expected{{zip(x[0], x[1], [](double a, double b) { return a + b; }),
                                         zip(x[0], x[1], [](double a, double b) { return a - b; })},
                                        {}};
                      },
                  .make = body([](auto) {
                    return [](Context& ctx, Inputs in) {
                      return Values{zip_kernel(ctx, in[0], in[1], [](double a, double b) { return a + b; }),
                                    zip_kernel(ctx, in[0], in[1], [](double a, double b) { return a - b; })};
                    };
                  }),
                  .same_lengths = true});
  defs.push_back(
      {.name = "flaky",
       .inputs = {In::vec},
       .outs = {{.temp = 0}},
       .model = [](const auto& x, const auto&) { return Expected{{map(x[0], [](double v) { return v + 5; })}, {}}; },
       .make = body([](std::shared_ptr<Control> control) {
         return [control](Context& ctx, Inputs in) {
           Buffer scratch = ctx.allocate_like(in[0]);  // allocated, then lost to the throw
           (void)scratch;
           maybe_throw(*control);
           return Values{map_kernel(ctx, in[0], [](double v) { return v + 5; })};
         };
       }),
       .throws = true});
  defs.push_back({.name = "flaky_in_place",
                  .inputs = {In::vec},
                  .mutated = {0},
                  .outs = {{.temp = 0}},
                  .model =
                      [](const auto& x, const auto&) {
                        return Expected{{map(x[0], [](double v) { return v * 2; })},
                                        {{0, map(x[0], [](double v) { return v + 3; })}}};
                      },
                  .make = body([](std::shared_ptr<Control> control) {
                    return [control](Context& ctx, Inputs in) {
                      Buffer y = map_kernel(ctx, in[0], [](double v) { return v * 2; });
                      maybe_throw(*control);
                      ctx.launch([x = in[0]] {
                        for (std::size_t i = 0; i < x.numel(); ++i) x.set(i, x.get(i) + 3);
                      });
                      return Values{y};
                    };
                  }),
                  .throws = true});
  defs.push_back(
      {.name = "weight_head_and_product",
       .inputs = {In::vec, In::vec},
       .statics = {0},
       .outs = {{.input = 0}, {.temp = 0}},
       .model =
           [](const auto& x, const auto&) {
             return Expected{{head(x[0], x[0].sizes[0] / 2), zip(x[0], x[1], [](double w, double v) { return w * v; })},
                             {}};
           },
       .make = body([](auto) {
         return [](Context& ctx, Inputs in) {
           return Values{head_view(in[0]), zip_kernel(ctx, in[0], in[1], [](double w, double v) { return w * v; })};
         };
       }),
       .same_lengths = true});
  defs.push_back({.name = "sized_head_and_shift",
                  .inputs = {In::vec},
                  .graph_sizes = {4, 16},
                  .outs = {{.input = 0}, {.temp = 0}},
                  .model =
                      [](const auto& x, const auto&) {
                        return Expected{{head(x[0], x[0].sizes[0] / 2), map(x[0], [](double v) { return v + 7; })}, {}};
                      },
                  .make = body([](auto) {
                    return [](Context& ctx, Inputs in) {
                      return Values{head_view(in[0]), map_kernel(ctx, in[0], [](double v) { return v + 7; })};
                    };
                  })});
  // Batch buckets: a call between two sizes is padded with zeros, replays the bucket's graph and
  // gets its first output sliced back; the sum (one element: no batch dimension) comes whole and
  // the zeros add nothing to it. Sizes above 9 run eagerly.
  defs.push_back({.name = "bucketed_scale_and_sum",
                  .inputs = {In::vec},
                  .buckets = {.sizes = {2, 5, 9}, .pad = cgt::Pad::constant(0)},
                  .outs = {{.temp = 0}, {.temp = 1}},
                  .model =
                      [](const auto& x, const auto&) {
                        double total = 0;
                        for (const double v : x[0].data) total += v;
                        return Expected{{map(x[0], [](double v) { return (3 * v) - 1; }), Value{{1}, {f32(total)}}},
                                        {}};
                      },
                  .make = body([](auto) {
                    return [](Context& ctx, Inputs in) {
                      Buffer sum = ctx.allocate(in[0].type(), {1});
                      ctx.launch([x = in[0], sum] {
                        double total = 0;
                        for (std::size_t i = 0; i < x.numel(); ++i) total += x.get(i);
                        sum.set(0, total);
                      });
                      return Values{map_kernel(ctx, in[0], [](double v) { return (3 * v) - 1; }), sum};
                    };
                  })});
  // Loops and branches the kernels decide (Context::loop_while, if_then, switch_on) over deciders
  // in pool memory: the first element decides the iterations (`loop_count`, at most 4 by the bound), whether to double,
  // and which of three amounts to add. A recording captures each body once; every replay decides anew from its own
  // input.
  // Loops and branches the kernels decide (Context::loop_while, if_then, switch_on) over deciders
  // in pool memory: the first element decides the iterations (`loop_count`, at most 4 by the bound), whether to double,
  // and which of three amounts to add. A recording captures each body once; every replay decides anew from its own
  // input. The second function's loop body calls a host function at odd sizes, and recordings of those sizes are
  // host-decided (the fallback); the third records every size host-decided.
  const auto loop_and_branch = [](bool host_call_when_odd) {
    return [host_call_when_odd](Context& ctx, Inputs in) {
      const Buffer x = in[0];
      Buffer y = map_kernel(ctx, x, [](double v) { return v; });
      const Buffer k = ctx.allocate(cgt::host::ElementType::i32, {1});
      const Buffer count = ctx.allocate(cgt::host::ElementType::i32, {1});
      const Buffer go_on = ctx.allocate(cgt::host::ElementType::i32, {1});
      const Buffer positive = ctx.allocate(cgt::host::ElementType::i32, {1});
      const Buffer choice = ctx.allocate(cgt::host::ElementType::i32, {1});
      ctx.launch([x, k, count, go_on, positive, choice] {
        const double first = x.numel() == 0 ? 0 : x.get(0);
        const int n = loop_count(first);
        k.set(0, n);
        count.set(0, 0);
        go_on.set(0, n > 0 ? 1 : 0);
        positive.set(0, first > 0 ? 1 : 0);
        choice.set(0, n % 3);
      });
      ctx.loop_while(go_on, 4, [&](Context& loop) {
        // A host function in the body (odd sizes): no conditional node can hold it; that
        // call runs eagerly, and the shape's next recording is host-decided.
        if (host_call_when_odd && y.numel() % 2 == 1) loop.call_on_host([] {});
        loop.launch([y, k, count, go_on] {
          for (std::size_t i = 0; i < y.numel(); ++i) y.set(i, y.get(i) + 1);
          count.set(0, count.get(0) + 1);
          go_on.set(0, count.get(0) < k.get(0) ? 1 : 0);
        });
      });
      ctx.if_then(positive, [&](Context& branch) {
        branch.launch([y] {
          for (std::size_t i = 0; i < y.numel(); ++i) y.set(i, y.get(i) * 2);
        });
      });
      std::vector<Context::Body> cases;
      for (int c = 0; c < 3; ++c) {
        cases.emplace_back([y, c](Context& chosen) {
          chosen.launch([y, c] {
            for (std::size_t i = 0; i < y.numel(); ++i) y.set(i, y.get(i) + 10.0 * (c + 1));
          });
        });
      }
      ctx.switch_on(choice, cases);
      return Values{y};
    };
  };
  for (const auto& [name, host_call_when_odd, on_host] :
       {std::tuple{"loop_and_branch", false, false}, std::tuple{"loop_and_branch_calling_host", true, false},
        std::tuple{"loop_and_branch_on_host", false, true}}) {
    defs.push_back(
        {.name = name,
         .inputs = {In::vec},
         .outs = {{.temp = 0}},
         .model =
             [](const auto& x, const auto&) {
               const double first = x[0].data.empty() ? 0 : x[0].data[0];
               const int k = loop_count(first);
               const int iterations = std::min(k, 4);
               const double factor = first > 0 ? 2 : 1;
               const double added = 10.0 * ((k % 3) + 1);
               return Expected{{map(x[0],
                                    [=](double v) {
                                      for (int i = 0; i < iterations; ++i) v = f32(v + 1);  // stored each time
                                      return f32(v * factor) + added;
                                    })},
                               {}};
             },
         .make = body([loop_and_branch, host_call_when_odd](auto) { return loop_and_branch(host_call_when_odd); }),
         .control_flow_on_host = on_host});
  }
  defs.push_back(
      {.name = "kept_buffer",
       .inputs = {In::vec},
       .outs = {{.temp = 0}},
       .model = [](const auto& x, const auto&) { return Expected{{map(x[0], [](double v) { return v + 9; })}, {}}; },
       .make = body([](std::shared_ptr<Control> control) {
         return [kept = std::make_shared<Buffer>(), control](Context& ctx, Inputs in) {
           if (kept->empty() || kept->numel() != in[0].numel()) *kept = ctx.allocate_like(in[0]);
           control->kept_storage = kept->storage();
           ctx.launch([x = in[0], y = *kept] {
             for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, x.get(i) + 9);
           });
           return Values{*kept};
         };
       }),
       .keeps_pool_buffer = true});
  return defs;
}

}  // namespace stress
