// Test kernels for the cuda backend, compiled by nvcc (kernels.cu) and called as plain functions:
// an evaluator of the scenarios' elementwise expressions, and a matrix product.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace cgt_test {

inline constexpr int max_instructions = 32;
inline constexpr int max_operands = 8;
inline constexpr int max_dims = 4;

/// One instruction: 0 operand (input or temporary, by `index` into the operands), 1 constant,
/// 2 add, 3 subtract, 4 multiply.
struct Instruction {
  int op = 1;
  int index = 0;
  double value = 0;
};

/// A strided float tensor on the device.
struct Operand {
  float* data = nullptr;
  std::int64_t strides[max_dims] = {};
};

/// out[i] = program(operands at i), for every element of `sizes`; everything by value, so that a
/// captured launch replays with the same arguments.
struct Program {
  int count = 0;
  Instruction code[max_instructions];
  int operand_count = 0;
  Operand operands[max_operands];
  Operand out;
  std::int64_t sizes[max_dims] = {};
  int rank = 0;
  std::int64_t numel = 0;
};

/// Launches the program on `stream`.
cudaError_t evaluate(const Program& program, cudaStream_t stream);

/// out (m x n, contiguous) = transpose(a) @ b, for a (k x m) and b (k x n) with the given strides.
cudaError_t matmul_transposed(const float* a, std::int64_t a_row_stride, std::int64_t a_col_stride, const float* b,
                              std::int64_t b_row_stride, std::int64_t b_col_stride, float* out, std::int64_t k,
                              std::int64_t m, std::int64_t n, cudaStream_t stream);

/// Adds `value` to each of `n` floats, `times` kernels in a row (the benchmarks' launch-bound work).
cudaError_t add_repeatedly(float* data, std::int64_t n, float value, int times, cudaStream_t stream);
/// out = a + b + c + d elementwise (null inputs are skipped), `n` floats.
cudaError_t sum_inputs(const float* a, const float* b, const float* c, const float* d, float* out, std::int64_t n,
                       cudaStream_t stream);

/// A counting loop's step: `*count += 1; *go_on = *count < *target` (one thread).
cudaError_t count_step(float* count, std::int32_t* go_on, const float* target, cudaStream_t stream);
/// Whether a counting loop goes on: `*go_on = *count < *target` (one thread).
cudaError_t count_decide(const float* count, std::int32_t* go_on, const float* target, cudaStream_t stream);

}  // namespace cgt_test
