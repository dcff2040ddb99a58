// A randomized walk of autograd as training code uses it, through a cgt autograd function and,
// beside it, the same model eagerly: forwards with new batches, backwards of any pending forward
// (in any order, some with retain_graph, some twice), both zero_grad forms, a kept .grad,
// outputs dropped before their backward, steps marked between a forward and its backward. After
// every action the gradients equal eager's; a backward whose saved values a new step reclaimed
// (the eager ops after the function saved its output, an escaped tensor: poisoned when the step
// reclaims it, with copy_out_on_new_step too, which keeps only leases valid) or whose outputs
// were dropped may fail, but only with a c10::Error, never with a wrong number. Tagged [gpu][autograd].
#include <torch/torch.h>
// libtorch's logging defines CHECK; the tests mean Catch2's.
#undef CHECK
#include <catch2/catch_test_macros.hpp>

#include <cstddef>
#include <cstdint>
#include <array>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "scenario/spec.hpp"

import cgt;
import cgt.torch;

#include "torch/harness.hpp"

using H = TorchHarness;
using scenario::must;

#define REQUIRE_GPU() scenario::skip_unless_available<H>()

namespace {

/// One forward whose backward has not run (or was retained): cgt's loss and eager's, and the
/// outputs' bundle, which the program keeps until the backward ran (or drops before it).
struct Pending {
  std::optional<cgt::torch::AutogradOutputs> outputs;
  at::Tensor loss;
  at::Tensor eager_loss;
  std::uint64_t step = 0;  ///< the pool's step it was made in
};

struct Walk {
  std::uint64_t rng;
  std::uint64_t pick(std::uint64_t bound) {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (rng >> 33) % bound;
  }
};

bool close(const at::Tensor& a, const at::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  return !a.defined() || at::allclose(a, b, 1e-4, 1e-5);
}

}  // namespace

TEST_CASE("torch/autograd walk: random forwards, backwards, zero_grads and steps give eager's gradients",
          "[gpu][autograd]") {
  REQUIRE_GPU();
  for (const bool copy_out : {false, true}) {
    for (std::uint64_t seed = 1; seed <= 3; ++seed) {
      INFO("seed " << seed << ", copy_out_on_new_step " << copy_out);
      torch::manual_seed(static_cast<std::uint64_t>(seed));
      at::Tensor w = at::randn({8, 4}, H::cuda()).requires_grad_(true);
      at::Tensor w_eager = w.detach().clone().requires_grad_(true);
      at::Tensor v = at::randn({3, 8}, H::cuda()).requires_grad_(true);  // an eager layer after it
      at::Tensor v_eager = v.detach().clone().requires_grad_(true);
      auto pool = must(H::make_pool({.debug_checks = true, .copy_out_on_new_step = copy_out}));
      auto layer = must(cgt::torch::make_autograd_function(
          pool, [w](cgt::torch::Inputs in) { return cgt::torch::Values{at::tanh(at::mm(in[0], w.t()))}; },
          {.name = "layer", .parameters = {w}}));
      const auto eager_layer = [&w_eager](const at::Tensor& x) { return at::tanh(at::mm(x, w_eager.t())); };

      Walk walk{seed};
      std::vector<Pending> pending;
      std::vector<std::pair<at::Tensor, at::Tensor>> kept;  // .grad tensors the program kept, with eager's
      std::uint64_t marks = 0;
      // Steps the program marked, and those its forwards began (before its first mark, a forward
      // with no backward pending begins one).
      const auto step_now = [&] { return marks + pool.stats().steps_begun_by_forward; };
      std::size_t backwards = 0;
      std::size_t refused = 0;
      auto check_grads = [&](const char* after) {
        INFO("after " << after);
        CHECK(close(w.grad(), w_eager.grad()));
        CHECK(close(v.grad(), v_eager.grad()));
        for (const auto& [mine, theirs] : kept) CHECK(close(mine, theirs));  // never overwritten
      };
      auto zero_grads = [&](bool set_to_none) {
        for (at::Tensor* p : std::array{&w, &v, &w_eager, &v_eager}) {
          at::Tensor& grad = p->mutable_grad();
          if (!grad.defined()) continue;
          if (set_to_none) {
            grad = at::Tensor();
          } else {
            grad.detach_().zero_();
          }
        }
      };
      for (int action = 0; action < 120; ++action) {
        const auto what = walk.pick(100);
        if (what < 35) {  // a forward (most of them begin no step: a backward is pending)
          const std::int64_t batch = 2 + static_cast<std::int64_t>(walk.pick(2));
          const at::Tensor x = at::randn({batch, 4}, H::cuda());
          auto out = must(layer({x}));
          const at::Tensor loss = (at::mm(out[0], v.t())).pow(2).sum();
          pending.push_back({std::move(out), loss, (at::mm(eager_layer(x), v_eager.t())).pow(2).sum(), step_now()});
        } else if (what < 65 && !pending.empty()) {  // a backward of any pending forward
          const std::size_t i = walk.pick(pending.size());
          const bool retain = walk.pick(4) == 0;
          Pending& item = pending[i];
          std::string failure;
          try {
            item.loss.backward({}, retain);
          } catch (const c10::Error& error) {
            failure = error.what_without_backtrace();  // only where the memory is gone: outputs dropped, or reclaimed
          }
          if (!failure.empty()) {
            INFO("action " << action << ": the backward of a forward of step " << item.step << " (now " << step_now()
                           << "), outputs " << (item.outputs ? "held" : "dropped") << ", failed: " << failure);
            CHECK((!item.outputs || item.step < step_now()));
            ++refused;
            pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
            zero_grads(true);  // what a program does after a failed step
            check_grads("a refused backward");
            continue;
          }
          item.eager_loss.backward({}, retain);
          ++backwards;
          if (!retain) pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
          check_grads("a backward");
        } else if (what < 75) {
          zero_grads(walk.pick(2) == 0);
          check_grads("zero_grad");
        } else if (what < 80 && w.grad().defined()) {  // the program keeps .grad, then sets it to none
          kept.emplace_back(w.grad(), w_eager.grad());
          w.mutable_grad() = at::Tensor();
          w_eager.mutable_grad() = at::Tensor();
        } else if (what < 84 && !pending.empty()) {  // a forward and its graph dropped before the backward
          pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(walk.pick(pending.size())));
        } else if (what < 88 && !pending.empty()) {  // the outputs dropped, the loss kept
          pending[walk.pick(pending.size())].outputs.reset();
        } else if (what < 95) {
          pool.mark_step_begin();
          ++marks;
        } else {
          pending.clear();
          kept.clear();
        }
      }
      pending.clear();
      UNSCOPED_INFO("backwards " << backwards << ", refused " << refused);
      CHECK(backwards > 10);
      must(pool.check_memory());
    }
  }
}
