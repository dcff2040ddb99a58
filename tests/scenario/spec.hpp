// Backend-neutral descriptions of the small functions the scenario tests register, and a plain
// C++ reference evaluator for them. Each backend's harness turns a FnSpec into its own callable
// (host kernels, libtorch ops, CUDA kernels), so one scenario body runs on every backend.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

namespace scenario {

/// Plain host data with a row-major shape: inputs to make and results to compare.
struct HostTensor {
  std::vector<std::int64_t> sizes;
  std::vector<double> data;

  [[nodiscard]] std::size_t numel() const {
    return static_cast<std::size_t>(std::accumulate(sizes.begin(), sizes.end(), std::int64_t{1}, std::multiplies<>()));
  }
  static HostTensor full(std::vector<std::int64_t> sizes, double value) {
    HostTensor t{std::move(sizes), {}};
    t.data.assign(t.numel(), value);
    return t;
  }
  /// Deterministic values in [0, 1) from `seed`.
  static HostTensor random(std::vector<std::int64_t> sizes, std::uint64_t seed) {
    HostTensor t{std::move(sizes), {}};
    t.data.resize(t.numel());
    std::uint64_t state = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    for (double& value : t.data) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      value = static_cast<double>(state >> 40) / static_cast<double>(1ULL << 24);
    }
    return t;
  }
  static HostTensor iota(std::vector<std::int64_t> sizes) {
    HostTensor t{std::move(sizes), {}};
    t.data.resize(t.numel());
    std::iota(t.data.begin(), t.data.end(), 0.0);
    return t;
  }
  [[nodiscard]] double sum() const { return std::accumulate(data.begin(), data.end(), 0.0); }
};

/// Same shape and values within a float32 tolerance.
inline bool close(const HostTensor& a, const HostTensor& b, double tolerance = 1e-4) {
  if (a.sizes != b.sizes || a.data.size() != b.data.size()) return false;
  for (std::size_t i = 0; i < a.data.size(); ++i) {
    if (!(std::abs(a.data[i] - b.data[i]) <= tolerance * (1 + std::abs(b.data[i])))) return false;
  }
  return true;
}

/// One instruction of an elementwise expression, evaluated per element on a small stack.
struct Instr {
  enum class Op : std::uint8_t { input, temp, constant, add, sub, mul };
  Op op = Op::constant;
  int index = 0;
  double value = 0;
};

/// An elementwise expression over the inputs and earlier temporaries of a function.
struct Expr {
  std::vector<Instr> code;
};

inline Expr in(int i) {
  return {{{Instr::Op::input, i, 0}}};
}
inline Expr tmp(int k) {
  return {{{Instr::Op::temp, k, 0}}};
}
inline Expr num(double v) {
  return {{{Instr::Op::constant, 0, v}}};
}
inline Expr binary(Expr a, const Expr& b, Instr::Op op) {
  a.code.insert(a.code.end(), b.code.begin(), b.code.end());
  a.code.push_back({op, 0, 0});
  return a;
}
inline Expr operator+(Expr a, const Expr& b) {
  return binary(std::move(a), b, Instr::Op::add);
}
inline Expr operator-(Expr a, const Expr& b) {
  return binary(std::move(a), b, Instr::Op::sub);
}
inline Expr operator*(Expr a, const Expr& b) {
  return binary(std::move(a), b, Instr::Op::mul);
}
inline Expr operator+(Expr a, double v) {
  return std::move(a) + num(v);
}
inline Expr operator-(Expr a, double v) {
  return std::move(a) - num(v);
}
inline Expr operator*(Expr a, double v) {
  return std::move(a) * num(v);
}

/// Evaluates `expr` at element `i`, reading inputs and temporaries through `load`.
template <class Load>
double evaluate(const Expr& expr, std::size_t i, Load&& load) {
  double stack[16];
  int top = 0;
  for (const Instr& instr : expr.code) {
    switch (instr.op) {
      case Instr::Op::input:
      case Instr::Op::temp: stack[top++] = load(instr.op == Instr::Op::temp, instr.index, i); break;
      case Instr::Op::constant: stack[top++] = instr.value; break;
      case Instr::Op::add:
        --top;
        stack[top - 1] += stack[top];
        break;
      case Instr::Op::sub:
        --top;
        stack[top - 1] -= stack[top];
        break;
      case Instr::Op::mul:
        --top;
        stack[top - 1] *= stack[top];
        break;
    }
  }
  return stack[0];
}

/// One step of a function: a new temporary (elementwise, or transpose(input a) @ input b), or an
/// in-place update of an input.
struct Step {
  enum class Kind : std::uint8_t { map, matmul_transposed, mutate };
  Kind kind = Kind::map;
  Expr expr;
  int a = 0;  ///< map: input (or temp, if shape_from_temp) whose shape the result has; mutate: input
  int b = 0;  ///< matmul: right operand (input)
  bool shape_from_temp = false;
};

/// How an output views its source.
struct View {
  enum class Kind : std::uint8_t { whole, slice, select, transpose };
  Kind kind = Kind::whole;
  std::int64_t start = 0;
  std::int64_t end = 0;
};

struct Output {
  enum class From : std::uint8_t { temp, input, constant, none };
  From from = From::temp;
  int index = 0;
  View view;
};

/// A function as the scenarios describe it.
struct FnSpec {
  std::string name;
  std::vector<Step> steps;
  std::vector<Output> outputs;
  std::vector<HostTensor> constants;  ///< captured by the function: neither inputs nor pool memory
  std::vector<std::size_t> static_inputs;
  std::vector<std::size_t> mutated_inputs;
};

/// The outputs a function of `spec` returns: views (made by `view_of`) of its temporaries, inputs
/// or constants, or empty values. Every backend's harness builds them this way.
template <class Values, class Temps, class Inputs, class Constants, class ViewOf>
Values select_outputs(const FnSpec& spec, const Temps& temps, const Inputs& inputs, const Constants& constants,
                      ViewOf view_of) {
  Values outputs;
  for (const Output& out : spec.outputs) {
    const auto i = static_cast<std::size_t>(out.index);
    switch (out.from) {
      case Output::From::temp: outputs.push_back(view_of(temps[i], out.view)); break;
      case Output::From::input: outputs.push_back(view_of(inputs[i], out.view)); break;
      case Output::From::constant: outputs.push_back(view_of(constants[i], out.view)); break;
      case Output::From::none: outputs.emplace_back(); break;
    }
  }
  return outputs;
}

// Builders that keep scenario code short.
inline Step map(Expr expr, int shape_input = 0) {
  return {Step::Kind::map, std::move(expr), shape_input, 0, false};
}
inline Step mutate(int input, Expr expr) {
  return {Step::Kind::mutate, std::move(expr), input, 0, false};
}
inline Step matmul_t(int left, int right) {
  return {Step::Kind::matmul_transposed, {}, left, right, false};
}
inline Output temp_out(int k, View view = {}) {
  return {Output::From::temp, k, view};
}
inline Output input_out(int i, View view = {}) {
  return {Output::From::input, i, view};
}
inline Output constant_out(int c, View view = {}) {
  return {Output::From::constant, c, view};
}
inline View slice(std::int64_t start, std::int64_t end) {
  return {View::Kind::slice, start, end};
}
inline View select(std::int64_t index) {
  return {View::Kind::select, index, 0};
}
inline View transposed() {
  return {View::Kind::transpose, 0, 0};
}

/// A function of one expression with one output: the common case.
inline FnSpec unary(std::string name, Expr expr) {
  return FnSpec{std::move(name), {map(std::move(expr))}, {temp_out(0)}, {}, {}, {}};
}

/// The view `view` of `t` as new data.
inline HostTensor apply_view(const HostTensor& t, const View& view) {
  if (view.kind == View::Kind::whole) return t;
  const std::size_t inner = t.sizes.empty() ? 1 : t.numel() / static_cast<std::size_t>(t.sizes[0]);
  HostTensor out;
  if (view.kind == View::Kind::slice) {
    out.sizes = t.sizes;
    out.sizes[0] = view.end - view.start;
    out.data.assign(t.data.begin() + static_cast<std::ptrdiff_t>(view.start * inner),
                    t.data.begin() + static_cast<std::ptrdiff_t>(view.end * inner));
  } else if (view.kind == View::Kind::select) {
    out.sizes.assign(t.sizes.begin() + 1, t.sizes.end());
    out.data.assign(t.data.begin() + static_cast<std::ptrdiff_t>(view.start * inner),
                    t.data.begin() + static_cast<std::ptrdiff_t>((view.start + 1) * inner));
  } else {
    const auto rows = t.sizes[0], cols = t.sizes[1];
    out.sizes = {cols, rows};
    out.data.resize(t.data.size());
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < cols; ++c) out.data[c * rows + r] = t.data[r * cols + c];
    }
  }
  return out;
}

/// transpose(a) @ b for 2-D a (k x m) and b (k x n).
inline HostTensor matmul_transposed(const HostTensor& a, const HostTensor& b) {
  const auto k = a.sizes[0], m = a.sizes[1], n = b.sizes[1];
  HostTensor out{{m, n}, std::vector<double>(static_cast<std::size_t>(m * n), 0.0)};
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (std::int64_t p = 0; p < k; ++p) acc += a.data[p * m + i] * b.data[p * n + j];
      out.data[i * n + j] = acc;
    }
  }
  return out;
}

/// What the function computes, run plainly: the reference every backend must equal. Applies
/// the function's mutations to `inputs`.
inline std::vector<HostTensor> reference(const FnSpec& spec, std::vector<HostTensor>& inputs) {
  std::vector<HostTensor> temps;
  for (const Step& step : spec.steps) {
    auto load = [&](bool is_temp, int index, std::size_t i) {
      return is_temp ? temps[static_cast<std::size_t>(index)].data[i] : inputs[static_cast<std::size_t>(index)].data[i];
    };
    if (step.kind == Step::Kind::matmul_transposed) {
      temps.push_back(matmul_transposed(inputs[step.a], inputs[step.b]));
    } else if (step.kind == Step::Kind::map) {
      HostTensor t{step.shape_from_temp ? temps[step.a].sizes : inputs[step.a].sizes, {}};
      t.data.resize(t.numel());
      for (std::size_t i = 0; i < t.data.size(); ++i) t.data[i] = evaluate(step.expr, i, load);
      temps.push_back(std::move(t));
    } else {
      HostTensor& target = inputs[step.a];
      for (std::size_t i = 0; i < target.data.size(); ++i) target.data[i] = evaluate(step.expr, i, load);
    }
  }
  std::vector<HostTensor> outputs;
  for (const Output& out : spec.outputs) {
    switch (out.from) {
      case Output::From::temp: outputs.push_back(apply_view(temps[out.index], out.view)); break;
      case Output::From::input: outputs.push_back(apply_view(inputs[out.index], out.view)); break;
      case Output::From::constant: outputs.push_back(apply_view(spec.constants[out.index], out.view)); break;
      case Output::From::none: outputs.push_back(HostTensor{}); break;
    }
  }
  return outputs;
}

}  // namespace scenario
