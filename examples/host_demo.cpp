// The host demo: a toy two-layer "model" called as a decode loop through a graph-tree pool. Every
// third step exits early, after one layer: the tree branches there. It prints cgt's version, then
// per call whether the pool warmed up, recorded or replayed, then the counters, the pool's memory
// and the tree as Graphviz DOT (also written to tree.dot; scripts/demo.sh draws it as tree.svg).
//
//   build/examples/host_demo [steps]
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <string>
#include <vector>

import cgt;
import cgt.host;

namespace {

using cgt::host::Buffer;
using cgt::host::Context;
using cgt::host::ElementType;
using cgt::host::Inputs;
using cgt::host::Values;

int report(const cgt::Error& error) {
  std::cerr << "error: " << error.describe() << '\n';
  return 1;
}

// out = relu(x * w + b), elementwise: a stand-in for a layer; w and b are weights (static inputs).
Values layer(Context& ctx, Inputs in) {
  Buffer out = ctx.allocate_like(in[0]);
  ctx.launch([x = in[0], w = in[1], b = in[2], out] {
    for (std::size_t i = 0; i < x.numel(); ++i) {
      const double value = x.get(i) * w.get(i % w.numel()) + b.get(i % b.numel());
      out.set(i, value > 0 ? value : 0);
    }
  });
  return {out};
}

// logits = h * 0.5, and the token: the index of the largest logit (written as a 1-element buffer).
Values head(Context& ctx, Inputs in) {
  Buffer logits = ctx.allocate_like(in[0]);
  Buffer token = ctx.allocate(ElementType::f32, {1});
  ctx.launch([h = in[0], logits, token] {
    std::size_t best = 0;
    for (std::size_t i = 0; i < h.numel(); ++i) {
      logits.set(i, h.get(i) * 0.5);
      if (logits.get(i) > logits.get(best)) best = i;
    }
    token.set(0, static_cast<double>(best));
  });
  return {logits, token};
}

Buffer filled(std::int64_t n, double start, double step) {
  Buffer buffer = Buffer::make(ElementType::f32, {n}).value();  // a size of the demo's own: cannot fail
  for (std::int64_t i = 0; i < n; ++i) buffer.set(static_cast<std::size_t>(i), start + step * static_cast<double>(i));
  return buffer;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 6;
  constexpr std::int64_t width = 8;
  std::cout << "cgt " << cgt::version_string << ", host backend\n";

  auto pool = cgt::host::make_pool();
  if (!pool) return report(pool.error());
  auto layer_fn = pool->add_function(layer, {.name = "layer", .static_inputs = {1, 2}});
  auto head_fn = pool->add_function(head, {.name = "head"});
  if (!layer_fn) return report(layer_fn.error());
  if (!head_fn) return report(head_fn.error());

  const Buffer w1 = filled(width, 0.5, 0.25), b1 = filled(width, -1, 0.1);
  const Buffer w2 = filled(width, 1.5, -0.1), b2 = filled(width, 0.2, 0.0);
  Buffer state = filled(width, 1, 0.5);

  std::cout << "step  layer 1     layer 2     head        token\n";
  for (int step = 0; step < steps; ++step) {
    pool->mark_step_begin();  // outputs of the last step may be reclaimed from here on
    auto h1 = (*layer_fn)({state, w1, b1});
    if (!h1) return report(h1.error());
    // Every third step exits early: the head reads layer 1's output, a branch of the tree.
    const bool early_exit = step % 3 == 2;
    const cgt::CallKind first = h1->kind();
    cgt::Owning<cgt::host::Outputs> h2 = early_exit ? std::move(h1) : (*layer_fn)({*h1->get(0), w2, b2});
    if (!h2) return report(h2.error());
    auto out = (*head_fn)({*h2->get(0)});
    if (!out) return report(out.error());
    const Buffer& token = *out->get(1);  // borrowed: valid while `out` lives
    std::cout << std::setw(4) << step << "  " << std::left << std::setw(12) << cgt::to_string(first) << std::setw(12)
              << (early_exit ? "(exit)" : cgt::to_string(h2->kind())) << std::setw(12) << cgt::to_string(out->kind())
              << std::right << token.get(0) << '\n';
    auto next = out->take(0);  // eager code between steps keeps a copy, not pool memory
    if (!next) return report(next.error());
    state = *next;
  }

  std::cout << "\ncounters: " << cgt::to_string(pool->stats()) << '\n';
  std::cout << "pool memory: " << cgt::to_string(pool->memory()) << '\n';
  const std::string dot = pool->to_dot();
  std::ofstream("tree.dot") << dot;
  std::cout << "\ntree (also in tree.dot):\n" << dot;
  return 0;
}
