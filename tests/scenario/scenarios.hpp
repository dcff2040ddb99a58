// The scenario suite: PyTorch's cudagraph-tree tests (test/inductor/test_cudagraph_trees.py) as
// sequences of calls a C++ user makes, written once against a harness `H` (host, torch, cuda).
// Every top-level `torch.compile` call of the reference starts a new generation; here that is a
// `mark_step_begin()` (`env.step()`), so tree shapes, checkpoint counts and live-block counts are
// the reference's. Every scenario is registered for every backend in register.hpp.
#pragma once

#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "scenario/spec.hpp"

import cgt;

// Printable cgt values, for test messages (libtorch's headers print any std::vector with <<, so
// its elements must be printable too).
namespace cgt {
inline std::ostream& operator<<(std::ostream& out, CallKind kind) {
  return out << to_string(kind);
}
inline std::ostream& operator<<(std::ostream& out, NodeReason reason) {
  return out << to_string(reason);
}
inline std::ostream& operator<<(std::ostream& out, Reason reason) {
  return out << to_string(reason);
}
inline std::ostream& operator<<(std::ostream& out, const PathIndex& index) {
  return out << "(" << index.depth << ", " << index.output << ")";
}
}  // namespace cgt

namespace scenario {

template <class T>
T must(cgt::Result<T> result) {
  if (!result) FAIL(result.error().describe());
  return std::move(*result);
}
inline void must(cgt::Result<void> result) {
  if (!result) FAIL(result.error().describe());
}

/// The handle types a harness names, for the backend of pool handle `P` (`cgt::host::Pool`: the
/// backend's `B` itself is not exported).
template <class P>
struct HarnessTypes;
template <class B>
struct HarnessTypes<cgt::Pool<B>> {
  using Pool = cgt::Pool<B>;
  using Function = cgt::Function<B>;
  using Outputs = cgt::Outputs<B>;
  using Lease = cgt::OutputLease<B>;
  using Arg = cgt::Arg<B>;
  using Value = typename B::Value;
};

/// Skips the test case (reported SKIPPED, not passed) when harness `H` cannot run here.
template <class H>
void skip_unless_available() {
  if (const std::string why = H::unavailable(); !why.empty()) SKIP(why);
}

/// A pool and the helpers a scenario needs.
template <class H>
struct Env {
  typename H::Pool pool;
  explicit Env(cgt::Options options = {}) : pool(must(H::make_pool(std::move(options)))) {}
  typename H::Function add(const FnSpec& spec) { return must(H::add(pool, spec)); }
  /// A new top-level step (the reference: a new torch.compile invocation or mark_step_begin).
  void step() { pool.mark_step_begin(); }
  [[nodiscard]] std::size_t live_blocks() const { return H::live_blocks(pool); }
  [[nodiscard]] std::uint64_t checkpoints() const { return pool.stats().checkpoint_restores; }
  [[nodiscard]] std::vector<std::size_t> root_descendants() const {
    std::vector<std::size_t> counts;
    for (const cgt::Node& root : pool.roots()) counts.push_back(root.num_descendants());
    return counts;
  }
};

template <class H>
HostTensor value_of(const typename H::Outputs& outputs, std::size_t i) {
  return H::read(must(outputs.get(i)).get());
}
template <class H>
HostTensor value_of(const typename H::Lease& lease) {
  return H::read(must(lease.get()).get());
}
template <class H>
typename H::Lease lease(typename H::Outputs& outputs, std::size_t i) {
  return must(outputs.release(i));
}
inline HostTensor cube(const HostTensor& x) {
  HostTensor y = x;
  for (double& v : y.data) v = v * v * v;
  return y;
}
inline HostTensor plus(const HostTensor& x, double c) {
  HostTensor y = x;
  for (double& v : y.data) v += c;
  return y;
}

// test_run_simple: one function, two shapes: two roots without children.
template <class H>
void run_simple() {
  Env<H> env;
  auto foo = env.add(unary("foo", in(0) * in(0) * in(0)));
  const auto ones = HostTensor::full({4, 4}, 1), zeros = HostTensor::full({5, 5}, 0);
  for (const HostTensor& x : {ones, zeros}) {
    const auto value = H::make(x);
    env.step();
    auto warm = must(foo({value}));
    CHECK(warm.kind() == cgt::CallKind::warmup);
    CHECK(close(value_of<H>(warm, 0), cube(x)));
    env.step();
    auto recorded = must(foo({value}));
    CHECK(recorded.kind() == cgt::CallKind::recording);
    CHECK(close(value_of<H>(recorded, 0), cube(x)));
  }
  CHECK(env.root_descendants() == std::vector<std::size_t>{0, 0});
  CHECK(env.pool.stats().warmups == 2);
  CHECK(env.pool.stats().recordings == 2);
}

// test_function_compiled_multiple_times: foo(x) = foo2(x) + foo2(foo2(x)) with graph breaks:
// one root (foo2) with two descendants (foo2 again, then the sum).
template <class H>
void function_compiled_multiple_times() {
  Env<H> env;
  auto foo2 = env.add(unary("foo2", in(0) * in(0) * in(0)));
  auto tail = env.add(FnSpec{"foo_tail", {map(in(0) + in(1))}, {temp_out(0)}, {}, {}, {}});
  auto foo = [&](const typename H::Value& x) {
    auto first = must(foo2({x}));
    auto y = lease<H>(first, 0);
    auto second = must(foo2({y}));
    auto y2 = lease<H>(second, 0);
    return must(tail({y, y2}));  // y and y2 die when foo returns, like the frame's locals
  };
  const auto ones = H::make(HostTensor::full({4, 4}, 1));
  std::vector<cgt::CallKind> kinds;
  for (int call = 0; call < 3; ++call) {
    env.step();
    auto out = foo(ones);
    kinds.push_back(out.kind());
    CHECK(close(value_of<H>(out, 0), HostTensor::full({4, 4}, 2)));
  }
  CHECK(kinds == std::vector{cgt::CallKind::warmup, cgt::CallKind::recording, cgt::CallKind::replay});
  CHECK(env.root_descendants() == std::vector<std::size_t>{2});
}

// test_end_recording_early: a recording ends as soon as all outputs of its path are dead, so a
// function called afterwards in the same generation starts a root of its own.
template <class H>
void end_recording_early() {
  Env<H> env;
  auto head = env.add(unary("foo_head", in(0) * in(0) * in(0)));
  auto tail = env.add(FnSpec{"foo_tail", {map(in(0) + in(1))}, {temp_out(0)}, {}, {}, {}});
  auto foo2 = env.add(unary("foo2", in(0) + 4));
  const auto ones = H::make(HostTensor::full({4, 4}, 1));
  auto foo = [&] {
    auto y = must(head({ones}));
    auto y_lease = lease<H>(y, 0);
    auto z = must(tail({ones, y_lease}));
    CHECK(close(value_of<H>(z, 0), HostTensor::full({4, 4}, 2)));
  };
  for (int i = 0; i < 3; ++i) {
    env.step();
    foo();                          // its outputs die here
    auto out = must(foo2({ones}));  // same generation: the path ended because everything died
    CHECK(close(value_of<H>(out, 0), HostTensor::full({4, 4}, 5)));
  }
  env.step();
  foo();
  CHECK(env.root_descendants() == std::vector<std::size_t>{1, 0});
}

// test_execution_into_recording: replaying a root, then warming up and recording a new child of
// it, with the live blocks the reference counts.
template <class H>
void execution_into_recording() {
  Env<H> env;
  auto head = env.add(unary("foo_head", in(0) + in(0)));
  auto positive = env.add(unary("foo_if", in(0) + 10));
  auto negative = env.add(unary("foo_else", in(0) - 10));
  const auto inp = H::make(HostTensor::full({4, 4}, 0));
  auto foo = [&] {
    auto y = must(head({inp}));
    auto y_lease = lease<H>(y, 0);
    const bool is_positive = value_of<H>(y_lease).sum() > 0;  // a data-dependent branch: a graph break
    return is_positive ? must(positive({y_lease})) : must(negative({y_lease}));
  };
  for (int i = 0; i < 2; ++i) {
    env.step();
    CHECK(close(value_of<H>(foo(), 0), HostTensor::full({4, 4}, -10)));
  }
  H::write(inp, HostTensor::full({4, 4}, 1));  // inp.add_(1)
  const HostTensor expected = HostTensor::full({4, 4}, 12);

  env.step();
  auto out_warmup = foo();
  CHECK(out_warmup.kind() == cgt::CallKind::warmup);
  CHECK(close(value_of<H>(out_warmup, 0), expected));
  CHECK(env.live_blocks() == 1);  // the warm-up output, allocated in the pool

  env.step();
  auto out_live = foo();
  CHECK(out_live.kind() == cgt::CallKind::recording);
  CHECK(close(value_of<H>(out_live, 0), expected));
  CHECK(env.live_blocks() == 1);  // the new step reclaimed the warm-up output
  CHECK(out_warmup.get(0).error().code == cgt::Errc::output_overwritten);
  out_warmup.reset();
  CHECK(env.live_blocks() == 1);
  out_live.reset();
  CHECK(env.live_blocks() == 0);

  env.step();
  auto out = foo();
  CHECK(out.kind() == cgt::CallKind::replay);
  CHECK(close(value_of<H>(out, 0), expected));
  CHECK(env.live_blocks() == 0);  // replays allocate nothing
  CHECK(env.checkpoints() == 2);  // to warm up foo_if after a replay, and to record it
}

// test_accumulate_multiple_recordings: recordings of several shapes accumulate; a new step
// reclaims the outputs of the last one.
template <class H>
void accumulate_multiple_recordings() {
  Env<H> env;
  auto head = env.add(unary("foo_head", in(0) + in(0) + in(0)));
  auto tail = env.add(unary("foo_tail", in(0) * 10));
  auto foo = [&](const typename H::Value& x) {
    auto y = must(head({x}));
    if (value_of<H>(y, 0).sum() <= 0) return y;
    auto y_lease = lease<H>(y, 0);
    return must(tail({y_lease}));
  };
  auto run_twice = [&](const HostTensor& x) {
    const auto value = H::make(x);
    env.step();
    (void)foo(value);
    env.step();
    return foo(value);
  };
  auto out1 = run_twice(HostTensor::full({5}, 0));
  auto out2 = run_twice(HostTensor::full({6}, 0));  // out1 is reclaimed by the new step
  CHECK(out1.get(0).error().code == cgt::Errc::output_overwritten);
  CHECK(env.live_blocks() == 1);
  auto out3 = run_twice(HostTensor::full({5}, 1));
  CHECK(close(value_of<H>(out3, 0), HostTensor::full({5}, 30)));
  CHECK(env.live_blocks() == 1);
  out1.reset();
  out2.reset();
  CHECK(env.live_blocks() == 1);
  out3.reset();
  CHECK(env.live_blocks() == 0);
}

// test_live_outputs_multiple_graphs: a checkpoint to warm up a function after a replay, and
// another to record it.
template <class H>
void live_outputs_multiple_graphs() {
  Env<H> env;
  auto head = env.add(FnSpec{"foo_head",
                             {map(in(0) + in(0) + in(0)), Step{Step::Kind::map, tmp(0) + 1, 0, 0, true}},
                             {temp_out(0), temp_out(1)},
                             {},
                             {},
                             {}});
  auto mid = env.add(unary("foo_mid", in(0) * in(0)));
  auto tail = env.add(unary("foo_tail", in(0) + 1));
  auto foo = [&](const typename H::Value& x) {
    auto outs = must(head({x}));
    auto x3 = lease<H>(outs, 0);
    auto y = lease<H>(outs, 1);
    auto z = must(mid({x3}));
    const bool is_positive = value_of<H>(z, 0).sum() > 0;
    z.reset();
    x3.reset();
    if (!is_positive) return y;
    auto out = must(tail({y}));
    return lease<H>(out, 0);
  };
  auto run_twice = [&](const HostTensor& x) {
    const auto value = H::make(x);
    env.step();
    (void)foo(value);
    env.step();
    return foo(value);
  };
  (void)run_twice(HostTensor::full({5}, 0));
  CHECK(env.checkpoints() == 0);
  auto out = run_twice(HostTensor::full({5}, 1));
  CHECK(close(value_of<H>(out), HostTensor::full({5}, 5)));
  CHECK(env.live_blocks() == 1);
  out.reset();
  CHECK(env.live_blocks() == 0);
  CHECK(env.checkpoints() == 2);
}

// test_tensor_dies_between_checkpoint: an output that died after its graph replayed is freed
// when the checkpoint is restored for the next recording.
template <class H>
void tensor_dies_between_checkpoint() {
  Env<H> env(cgt::Options{.skip_warmup = true});
  auto foo = env.add(FnSpec{"foo", {map(in(0) + 1), map(in(0) + 2)}, {temp_out(0), temp_out(1)}, {}, {}, {}});
  auto foo2 = env.add(unary("foo2", in(0) * in(0) * in(0)));
  const HostTensor inp_data = HostTensor::random({4}, 7);
  const auto inp = H::make(inp_data);
  CHECK(must(foo({inp})).kind() == cgt::CallKind::recording);
  CHECK(must(foo({inp})).kind() == cgt::CallKind::replay);
  auto outs = must(foo({inp}));
  auto out1 = lease<H>(outs, 0);
  outs.reset();  // out2 dies between the checkpoint and the next recording
  CHECK(env.checkpoints() == 0);
  auto x = must(foo2({std::move(out1)}));  // consumed, as the reference clears its input list
  CHECK(x.kind() == cgt::CallKind::recording);
  CHECK(env.checkpoints() == 1);
  CHECK(close(value_of<H>(x, 0), cube(plus(inp_data, 1))));
  CHECK(env.live_blocks() == 1);
  x.reset();
  CHECK(env.live_blocks() == 0);
}

// test_aliased_storage_single_weakref: five outputs over two storages; aliases, also across
// graphs, share one storage object, and the path is dead once all of them are dropped.
template <class H>
void aliased_storage_single_weakref() {
  Env<H> env(cgt::Options{.debug_checks = true});
  auto head = env.add(FnSpec{"foo_head",
                             {map(in(0) * 20), map(in(0) * 200)},
                             {temp_out(0), temp_out(0, select(0)), temp_out(1), temp_out(1, select(0))},
                             {},
                             {},
                             {}});
  auto tail = env.add(FnSpec{"foo_tail", {}, {input_out(0, slice(4, 20)), input_out(1, slice(4, 20))}, {}, {}, {}});
  for (int i = 0; i < 4; ++i) {
    env.step();
    const HostTensor x = HostTensor::random({20, 20}, 100 + static_cast<std::uint64_t>(i));
    auto first = must(head({H::make(x)}));
    auto x20 = lease<H>(first, 0), x_alias = lease<H>(first, 1), y = lease<H>(first, 2), y_alias = lease<H>(first, 3);
    auto second = must(tail({x20, y}));
    auto x_alias2 = lease<H>(second, 0), y_alias2 = lease<H>(second, 1);
    y.reset();  // y is not returned: only its aliases keep its storage live

    std::vector<typename H::Lease*> outs{&x20, &x_alias, &x_alias2, &y_alias, &y_alias2};
    std::set<std::uintptr_t> storages, objects;
    for (auto* out : outs) {
      storages.insert(H::storage_of(must(out->get()).get()));
      objects.insert(H::storage_object_of(must(out->get()).get()));
    }
    CHECK(storages.size() == 2);
    CHECK(objects.size() == 2);  // one storage object per storage, across both graphs
    HostTensor x20_expected = x;
    for (double& v : x20_expected.data) v *= 20;
    CHECK(close(value_of<H>(x_alias2), apply_view(x20_expected, slice(4, 20))));
    if (i == 3) {
      // Dropping every output but a view made by the second graph keeps the first graph's storage live.
      x20.reset();
      x_alias.reset();
      y_alias.reset();
      y_alias2.reset();
      const auto path = env.pool.current_path();
      REQUIRE(path.size() == 2);
      CHECK(path[0].live_outputs() == 2);  // x20 and its alias, through x_alias2
    }
  }
  for (const cgt::Node& node : env.pool.current_path()) CHECK(node.live_outputs() == 0);
  CHECK(env.pool.stats().recordings > 0);
}

// test_aliasing_static_ref: outputs that view a static input are that input's memory, not pool
// memory; a view of an earlier output shares that output's storage object.
template <class H>
void aliasing_static_ref() {
  Env<H> env;
  auto foo = env.add(FnSpec{
      "forward", {matmul_t(0, 1)}, {temp_out(0), input_out(0, transposed()), input_out(0, slice(0, 4))}, {}, {0}, {}});
  auto foo2 = env.add(FnSpec{"foo2", {}, {input_out(0, slice(2, 10))}, {}, {}, {}});
  const HostTensor weight_data = HostTensor::random({10, 10}, 3);
  const auto weight = H::make(weight_data);
  for (int i = 0; i < 3; ++i) {
    const HostTensor x_data = HostTensor::random({10, 10}, 10 + static_cast<std::uint64_t>(i));
    const auto x = H::make(x_data);
    env.step();
    auto outs = must(foo({weight, x}));
    const auto weight_storage = H::storage_object_of(weight);
    CHECK(H::storage_object_of(must(outs.get(1)).get()) == weight_storage);
    CHECK(H::storage_object_of(must(outs.get(2)).get()) == weight_storage);
    CHECK(close(value_of<H>(outs, 0), matmul_transposed(weight_data, x_data)));
    CHECK(close(value_of<H>(outs, 1), apply_view(weight_data, transposed())));
    auto out1 = lease<H>(outs, 0);
    auto out2 = must(foo2({out1}));
    CHECK(H::storage_object_of(must(out2.get(0)).get()) == H::storage_object_of(must(out1.get()).get()));
    CHECK(close(value_of<H>(out2, 0), apply_view(matmul_transposed(weight_data, x_data), slice(2, 10))));
  }
  const auto roots = env.pool.roots();
  REQUIRE(roots.size() == 1);
  CHECK(roots[0].copied_inputs() == std::vector<std::size_t>{1});  // the weight is used in place
}

// test_constant_output: outputs that are constants of the function (frozen parameters).
template <class H>
void constant_output() {
  Env<H> env;
  const HostTensor param = HostTensor::iota({10});
  const FnSpec spec{
      "forward", {map(in(0) + 2)}, {constant_out(0), constant_out(0, slice(0, 2)), temp_out(0)}, {param}, {}, {}};
  auto forward = env.add(spec);
  const HostTensor inp_data = HostTensor::full({1}, 2);
  std::vector<HostTensor> inputs{inp_data};
  const auto expected = reference(spec, inputs);
  for (int i = 0; i < 3; ++i) {
    env.step();
    auto outs = must(forward({H::make(inp_data)}));
    for (std::size_t o = 0; o < expected.size(); ++o) CHECK(close(value_of<H>(outs, o), expected[o]));
  }
  CHECK(env.pool.stats().recordings == 1);
  CHECK(env.pool.stats().replays == 1);
}

// test_expanded_inputs: a broadcast (stride 0) input is copied into a slot of its own layout.
template <class H>
void expanded_inputs() {
  Env<H> env;
  auto foo = env.add(unary("foo", in(0) + 4 + 1));
  const HostTensor row = HostTensor::random({1, 512}, 5);
  const auto x = H::expand(H::make(row), {4, 512});
  HostTensor expected{{4, 512}, {}};
  for (int r = 0; r < 4; ++r) expected.data.insert(expected.data.end(), row.data.begin(), row.data.end());
  for (double& v : expected.data) v += 5;
  for (int i = 0; i < 3; ++i) {
    env.step();
    CHECK(close(value_of<H>(must(foo({x})), 0), expected));
  }
  CHECK(env.pool.stats().recordings == 1);
  const auto roots = env.pool.roots();
  REQUIRE(roots.size() == 1);
  CHECK(roots[0].copied_inputs() == std::vector<std::size_t>{0});
}

// test_mutation_on_inp: mutating a plain input runs eagerly (one warning); mutating a static
// input (a module buffer) is graphed and matches eager execution.
template <class H>
void mutation_on_inp() {
  Env<H> env;
  const FnSpec mutating{"foo", {mutate(0, in(0) + 2)}, {input_out(0)}, {}, {}, {0}};
  auto foo = env.add(mutating);
  const auto x = H::make(HostTensor::full({10}, 1));
  auto out = must(foo({x}));
  CHECK(out.kind() == cgt::CallKind::eager);
  CHECK(close(value_of<H>(out, 0), HostTensor::full({10}, 3)));
  CHECK(close(H::read(x), HostTensor::full({10}, 3)));
  CHECK(env.pool.stats().count(cgt::Reason::mutated_input) == 1);
  CHECK(env.pool.stats().fallback_warnings == 1);
  CHECK(env.pool.roots().empty());

  const FnSpec module{"mod_forward", {mutate(0, in(0) + in(1)), map(in(0) + in(1))}, {temp_out(0)}, {}, {0}, {0}};
  auto forward = env.add(module);
  const auto buf = H::make(HostTensor::full({10}, 1));
  std::vector<HostTensor> eager{HostTensor::full({10}, 1), HostTensor::full({10}, 1)};
  for (int i = 0; i < 3; ++i) {
    env.step();
    auto result = must(forward({buf, H::make(HostTensor::full({10}, 1))}));
    eager[1] = HostTensor::full({10}, 1);
    const auto expected = reference(module, eager);
    CHECK(close(value_of<H>(result, 0), expected[0]));
    CHECK(close(H::read(buf), eager[0]));
  }
  CHECK(env.pool.roots().size() == 1);
  CHECK(env.pool.stats().count(cgt::Reason::mutated_input) == 1);
}

// test_mutation_cudagraph_managed_tensors: mutating an output of an earlier graph is graphed;
// mutating a copy of it in ordinary memory runs eagerly, with one warning.
template <class H>
void mutation_cudagraph_managed_tensors() {
  Env<H> env;
  auto foo = env.add(unary("foo", in(0) + 1));
  auto mut = env.add(FnSpec{"mut", {mutate(0, in(0) + 2)}, {input_out(0)}, {}, {}, {0}});
  typename H::Lease tmp, mut_out;  // reassigned each step: the old ones live into the next call
  for (int i = 0; i < 3; ++i) {
    env.step();
    const HostTensor inp = HostTensor::random({4}, 20 + static_cast<std::uint64_t>(i));
    auto foo_out = must(foo({H::make(inp)}));
    tmp = lease<H>(foo_out, 0);
    auto mut_outs = must(mut({tmp}));
    mut_out = lease<H>(mut_outs, 0);
    CHECK(close(value_of<H>(mut_out), plus(inp, 3)));
    CHECK(mut_outs.kind() != cgt::CallKind::eager);
  }
  CHECK(env.pool.stats().eager_calls == 0);
  CHECK(env.pool.stats().fallback_warnings == 0);

  env.step();
  const HostTensor inp = HostTensor::random({4}, 30);
  auto foo_out = must(foo({H::make(inp)}));
  const auto mut_inp = H::make(value_of<H>(foo_out, 0));  // tmp.clone(): ordinary memory
  auto eager = must(mut({mut_inp}));
  CHECK(eager.kind() == cgt::CallKind::eager);
  CHECK(close(H::read(mut_inp), plus(inp, 3)));
  CHECK(env.pool.stats().count(cgt::Reason::mutated_input) == 1);
  CHECK(env.pool.stats().fallback_warnings == 1);
}

// test_mutation_cudagraph_managed_tensor_warn_only_once.
template <class H>
void mutation_cudagraph_managed_tensor_warn_only_once() {
  std::vector<cgt::Reason> events;
  cgt::Options options;
  options.log_sink = [&](const cgt::Event& event) { events.push_back(event.reason); };
  Env<H> env(options);
  auto foo = env.add(unary("foo", in(0) + 1));
  auto mut = env.add(FnSpec{"mut", {mutate(0, in(0) + 2)}, {input_out(0)}, {}, {}, {0}});
  CHECK(must(mut({H::make(HostTensor::random({4}, 1))})).kind() == cgt::CallKind::eager);  // warns
  typename H::Lease tmp;
  for (int i = 0; i < 3; ++i) {
    env.step();
    auto out = must(foo({H::make(HostTensor::random({4}, 2))}));
    tmp = lease<H>(out, 0);
    CHECK(must(mut({tmp})).kind() != cgt::CallKind::eager);  // a pool output: no warning
  }
  const auto mut_inp = H::make(value_of<H>(tmp));
  CHECK(must(mut({mut_inp})).kind() == cgt::CallKind::eager);  // mut has warned already
  CHECK(std::count(events.begin(), events.end(), cgt::Reason::mutated_input) == 1);
  CHECK(env.pool.stats().fallback_warnings == 1);
  CHECK(env.pool.stats().count(cgt::Reason::mutated_input) == 2);
}

// test_mutation_cudagraph_managed_tensor_warn: a function fed by an eager fallback's output.
template <class H>
void mutation_cudagraph_managed_tensor_warn() {
  Env<H> env;
  auto foo = env.add(FnSpec{"foo", {mutate(0, in(0) + 1)}, {input_out(0)}, {}, {}, {0}});
  auto fee = env.add(FnSpec{"fee", {map(in(1) + 3, 1)}, {temp_out(0)}, {}, {}, {}});
  for (int i = 0; i < 3; ++i) {
    env.step();
    const HostTensor z = HostTensor::random({4}, 40 + static_cast<std::uint64_t>(i));
    auto mutated = must(foo({H::make(z)}));
    auto out = must(fee({H::make(HostTensor::random({4}, 1)), must(mutated.get(0)).get()}));
    CHECK(close(value_of<H>(out, 0), plus(z, 4)));
  }
  CHECK(env.pool.stats().fallback_warnings == 1);
  CHECK(env.pool.stats().count(cgt::Reason::mutated_input) == 3);
}

// A branching tree A→B, A→B' costs the larger of the two paths, not their sum: B' records into
// the memory B used, after restoring A's checkpoint.
template <class H>
void memory_of_branches_is_max_not_sum() {
  Env<H> env;
  const std::int64_t n = 1 << 16;  // 256 KiB per float32 output
  auto a = env.add(unary("A", in(0) + 1));
  auto b =
      env.add(FnSpec{"B", {map(in(0) * 2), Step{Step::Kind::map, tmp(0) * 2, 0, 0, true}}, {temp_out(1)}, {}, {}, {}});
  auto b_prime =
      env.add(FnSpec{"B'", {map(in(0) * 3), Step{Step::Kind::map, tmp(0) + 1, 0, 0, true}}, {temp_out(1)}, {}, {}, {}});
  const auto x = H::make(HostTensor::full({n}, 1));
  auto path = [&](auto& second) {
    auto first = must(a({x}));
    auto a_out = lease<H>(first, 0);
    return must(second({a_out}));
  };
  for (int i = 0; i < 3; ++i) {
    env.step();
    CHECK(value_of<H>(path(b), 0).data[0] == 8);
  }
  const std::size_t reserved_after_b = env.pool.memory().reserved_bytes;
  for (int i = 0; i < 3; ++i) {
    env.step();
    CHECK(value_of<H>(path(b_prime), 0).data[0] == 7);
  }
  CHECK(env.root_descendants() == std::vector<std::size_t>{2});
  CHECK(env.pool.memory().reserved_bytes == reserved_after_b);
  // Both paths replay from the same memory.
  for (int i = 0; i < 2; ++i) {
    env.step();
    CHECK(value_of<H>(path(b), 0).data[0] == 8);
    env.step();
    CHECK(value_of<H>(path(b_prime), 0).data[0] == 7);
  }
  CHECK(env.pool.memory().reserved_bytes == reserved_after_b);
}

// A replay never changes a value the caller still holds a lease on: holding an output makes the
// next call record (or replay) a graph that avoids its memory.
template <class H>
void replay_never_changes_a_held_value() {
  Env<H> env(cgt::Options{.debug_checks = true});
  auto f = env.add(unary("f", in(0) * 2 + 1));
  std::vector<std::pair<typename H::Lease, HostTensor>> held;
  auto call = [&](double value) {
    const HostTensor x = HostTensor::full({64}, value);
    auto out = must(f({H::make(x)}));
    HostTensor expected = x;
    for (double& v : expected.data) v = v * 2 + 1;
    CHECK(close(value_of<H>(out, 0), expected));
    held.emplace_back(lease<H>(out, 0), expected);
    for (const auto& [lease, value_held] : held) CHECK(close(value_of<H>(lease), value_held));
  };
  std::uint64_t replays = 0;
  for (int round = 0; round < 4; ++round) {
    for (int i = 0; i < 4; ++i) call(round * 10 + i);  // each call while all earlier outputs are held
    replays = env.pool.stats().replays;
    held.erase(held.begin());  // drop the oldest; the rest must stay intact
    call(-1);
    held.clear();
  }
  CHECK(replays > 0);
  CHECK(env.pool.stats().recordings >= 4);
}

// An output that was dead when a child was recorded is alive now: the child may have reused its
// memory, so it must not replay; a sibling is recorded for the new liveness pattern instead.
template <class H>
void new_liveness_pattern_records_a_sibling() {
  Env<H> env(cgt::Options{.debug_checks = true});
  auto a = env.add(FnSpec{"A", {map(in(0) + 1), map(in(0) + 2)}, {temp_out(0), temp_out(1)}, {}, {}, {}});
  auto b = env.add(unary("B", in(0) * 2));
  const HostTensor x = HostTensor::full({256}, 1), y = HostTensor::full({256}, 5);
  auto walk = [&](bool keep_first) {
    auto outs = must(a({H::make(x)}));
    auto first = lease<H>(outs, 0), second = lease<H>(outs, 1);
    if (!keep_first) first.reset();
    auto out = must(b({H::make(y)}));
    CHECK(close(value_of<H>(out, 0), HostTensor::full({256}, 10)));
    if (keep_first) CHECK(close(value_of<H>(first), HostTensor::full({256}, 2)));  // not clobbered by B
    CHECK(close(value_of<H>(second), HostTensor::full({256}, 3)));
    return out.kind();
  };
  for (int i = 0; i < 3; ++i) {
    env.step();
    (void)walk(false);
  }
  env.step();
  CHECK(walk(true) == cgt::CallKind::recording);  // restores A's checkpoint, records a sibling
  CHECK(env.checkpoints() == 1);
  env.step();
  CHECK(walk(true) == cgt::CallKind::replay);
  env.step();
  CHECK(walk(false) == cgt::CallKind::replay);
  const auto roots = env.pool.roots();
  REQUIRE(roots.size() == 1);
  const auto children = roots[0].children();
  REQUIRE(children.size() == 2);
  CHECK(children[0].reason() == cgt::NodeReason::first_call);
  CHECK(children[0].expected_dead_before() == std::vector<cgt::PathIndex>{{0, 0}});
  CHECK(children[1].reason() == cgt::NodeReason::new_liveness_pattern);
  CHECK(children[1].expected_dead_before().empty());
}

}  // namespace scenario
