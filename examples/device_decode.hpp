// Greedy decoding of the small decoder (kv_decoder.hpp) until every sequence produced the end
// token or `max_new` tokens were made, three ways over the same static state:
//  * `eager`: libtorch alone, the host reading the stop condition after every token;
//  * `per_step`: one pool function per token (a replay each), the host reading the stop
//    condition after every token, as every generate loop must;
//  * `device_loop`: one pool function per generation whose loop the GPU decides
//    (`cgt::torch::loop_while`, a WHILE node), `steps_per_iteration` tokens per iteration: one
//    launch per generation, and the host never waits until it reads the tokens.
// Every step runs every sequence; a finished one (its `done` flag set) writes the end token again,
// so its tokens do not change: the three ways give the same tokens. examples/torch_device_decode.cpp
// runs them, tests/torch/test_device_decode.cpp checks them.
#pragma once

#include "kv_decoder.hpp"

#include <cstddef>
#include <cstdint>
#include <expected>
#include <utility>
#include <vector>

import cgt;
import cgt.torch;

namespace device_decode {

/// What a generation writes in place: static tensors a recorded graph writes where they are.
struct State {
  torch::Tensor tokens;     ///< [batch] int64: each sequence's last token
  torch::Tensor position;   ///< [1] int64: where the next step's key and value go
  torch::Tensor generated;  ///< [1] int64: tokens generated so far (the column of `out` written next)
  torch::Tensor out;        ///< [batch, columns] int64: the generated tokens, the end token after a stop
  torch::Tensor done;       ///< [batch] bool: sequences that produced the end token
  torch::Tensor go_on;      ///< [1] int32: not every sequence is done and fewer than `max_new` were made
  kv_decoder::Cache cache;

  /// `columns` >= max_new plus the steps a device loop may run past the stop (its iteration's rest).
  State(std::int64_t batch, std::int64_t columns, std::int64_t max_length, const torch::TensorOptions& cuda)
      : tokens(torch::zeros({batch}, cuda.dtype(torch::kLong))),
        position(torch::zeros({1}, cuda.dtype(torch::kLong))),
        generated(torch::zeros({1}, cuda.dtype(torch::kLong))),
        out(torch::zeros({batch, columns}, cuda.dtype(torch::kLong))),
        done(torch::zeros({batch}, cuda.dtype(torch::kBool))),
        go_on(torch::zeros({1}, cuda.dtype(torch::kInt))),
        cache(batch, max_length, cuda) {}

  /// The tensors a pool function takes, in its order: the state, then the cache.
  [[nodiscard]] std::vector<torch::Tensor> inputs() const {
    std::vector<torch::Tensor> all{tokens, position, generated, out, done, go_on};
    for (const torch::Tensor& t : cache.tensors()) all.push_back(t);
    return all;
  }
};
inline constexpr std::size_t state_inputs = 6;

/// Every input of a generation is static and written in place.
inline cgt::FunctionOptions options(const char* name) {
  cgt::FunctionOptions options{.name = name};
  for (std::size_t i = 0; i < state_inputs + 2 * kv_decoder::layers; ++i) {
    options.static_inputs.push_back(i);
    options.mutated_inputs.push_back(i);
  }
  return options;
}

/// Names the inputs of a pool function (or the state's tensors): the state, then the cache.
struct View {
  torch::Tensor tokens, position, generated, out, done, go_on;
  std::vector<torch::Tensor> cache;
  explicit View(const std::vector<torch::Tensor>& in)
      : tokens(in[0]),
        position(in[1]),
        generated(in[2]),
        out(in[3]),
        done(in[4]),
        go_on(in[5]),
        cache(in.begin() + state_inputs, in.end()) {}
};

/// One token of every sequence, all on the device: the step, the done mask, the stop condition.
inline void step(kv_decoder::Decoder& model, View& s, std::int64_t end_token, std::int64_t max_new) {
  const torch::Tensor logits = model->step(s.tokens, s.position, s.cache);
  const torch::Tensor next = torch::where(s.done, torch::full_like(s.tokens, end_token), logits.argmax(-1));
  s.out.index_copy_(1, s.generated, next.unsqueeze(1));
  s.done.logical_or_(next == end_token);
  s.tokens.copy_(next);
  s.position.add_(1);
  s.generated.add_(1);
  s.go_on.copy_(torch::logical_and(s.done.logical_not().any(), s.generated < max_new));
}

/// Resets what a generation writes, leaving the cache and the last token as they are.
inline void reset(State& state, std::int64_t end_token, std::int64_t position = 0) {
  state.position.fill_(position);
  state.generated.zero_();
  state.out.fill_(end_token);
  state.done.zero_();
  state.go_on.fill_(1);
}

/// Fills `state`'s cache with the prompt [batch, length] (all but its last token, eagerly) and
/// resets what a generation writes: the next step reads the prompt's last token.
inline void start(kv_decoder::Decoder& model, State& state, const torch::Tensor& prompt, std::int64_t end_token) {
  const std::int64_t length = prompt.size(1);
  for (std::int64_t p = 0; p + 1 < length; ++p) {
    (void)model->step(prompt.select(1, p).contiguous(), torch::full({1}, p, state.position.options()),
                      state.cache.tensors());
  }
  state.tokens.copy_(prompt.select(1, length - 1));
  reset(state, end_token, length - 1);
}

/// The eager reference: libtorch alone, the host reading the stop condition after every token.
inline void eager(kv_decoder::Decoder& model, State& state, std::int64_t end_token, std::int64_t max_new) {
  View s(state.inputs());
  while (s.go_on.item<std::int32_t>() != 0) step(model, s, end_token, max_new);
}

/// A pool function that makes one token of every sequence.
inline cgt::Result<cgt::torch::Function> per_step_function(cgt::torch::Pool& pool, kv_decoder::Decoder& model,
                                                           std::int64_t end_token, std::int64_t max_new) {
  return pool.add_function(
      [&model, end_token, max_new](cgt::torch::Inputs in) {
        View s(in);
        step(model, s, end_token, max_new);
        return cgt::torch::Values{};
      },
      options("decode_step"));
}

/// A pool function that generates until the stop, `steps_per_iteration` tokens per iteration of a
/// loop the GPU decides: one launch per generation once recorded. `host_decides`: the loop is
/// recorded as segments the host decides between instead (the fallback where a conditional node
/// cannot be made): one launch per iteration, a wait for `go_on` before each.
inline cgt::Result<cgt::torch::Function> device_loop_function(cgt::torch::Pool& pool, kv_decoder::Decoder& model,
                                                              std::int64_t end_token, std::int64_t max_new,
                                                              std::int64_t steps_per_iteration,
                                                              bool host_decides = false) {
  cgt::FunctionOptions loop_options = options(host_decides ? "decode_loop_on_host" : "decode_loop");
  loop_options.control_flow_on_host = host_decides;
  return pool.add_function(
      [&model, end_token, max_new, steps_per_iteration](cgt::torch::Inputs in) {
        View s(in);
        const auto iterations = static_cast<std::uint64_t>((max_new + steps_per_iteration - 1) / steps_per_iteration);
        cgt::torch::loop_while(s.go_on, iterations, [&] {
          for (std::int64_t u = 0; u < steps_per_iteration; ++u) step(model, s, end_token, max_new);
        });
        return cgt::torch::Values{};
      },
      std::move(loop_options));
}

/// Generates with `function` once per token (per_step_function), reading the stop after each.
inline cgt::Result<void> per_step(cgt::torch::Pool& pool, cgt::torch::Function& function, const State& state) {
  const std::vector<torch::Tensor> inputs = state.inputs();
  while (state.go_on.item<std::int32_t>() != 0) {
    pool.mark_step_begin();
    auto ran = function(std::vector<cgt::torch::Arg>(inputs.begin(), inputs.end()));
    if (!ran) return std::unexpected(ran.error());
  }
  return {};
}

/// Generates with `function` in one call (device_loop_function); what the call did.
inline cgt::Result<cgt::CallKind> device_loop(cgt::torch::Pool& pool, cgt::torch::Function& function,
                                              const State& state) {
  const std::vector<torch::Tensor> inputs = state.inputs();
  pool.mark_step_begin();
  auto ran = function(std::vector<cgt::torch::Arg>(inputs.begin(), inputs.end()));
  if (!ran) return std::unexpected(ran.error());
  return ran->kind();
}

}  // namespace device_decode
