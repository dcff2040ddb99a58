// Test kernels of the cuda backend's tests and benchmarks.
#include "kernels.hpp"

namespace cgt_test {
namespace {

__device__ std::int64_t offset_of(const Operand& operand, const std::int64_t* sizes, int rank, std::int64_t flat) {
  std::int64_t at = 0;
  for (int d = rank - 1; d >= 0; --d) {
    at += (flat % sizes[d]) * operand.strides[d];
    flat /= sizes[d];
  }
  return at;
}

__global__ void evaluate_kernel(Program program) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= program.numel) return;
  double stack[16];
  int top = 0;
  for (int k = 0; k < program.count; ++k) {
    const Instruction& instr = program.code[k];
    switch (instr.op) {
      case 0: {
        const Operand& operand = program.operands[instr.index];
        stack[top++] = operand.data[offset_of(operand, program.sizes, program.rank, i)];
        break;
      }
      case 1: stack[top++] = instr.value; break;
      case 2:
        --top;
        stack[top - 1] += stack[top];
        break;
      case 3:
        --top;
        stack[top - 1] -= stack[top];
        break;
      default:
        --top;
        stack[top - 1] *= stack[top];
        break;
    }
  }
  program.out.data[offset_of(program.out, program.sizes, program.rank, i)] = static_cast<float>(stack[0]);
}

__global__ void matmul_transposed_kernel(const float* a, std::int64_t ar, std::int64_t ac, const float* b,
                                         std::int64_t br, std::int64_t bc, float* out, std::int64_t k, std::int64_t m,
                                         std::int64_t n) {
  const std::int64_t cell = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (cell >= m * n) return;
  const std::int64_t i = cell / n, j = cell % n;
  double acc = 0;
  for (std::int64_t p = 0; p < k; ++p) acc += static_cast<double>(a[p * ar + i * ac]) * b[p * br + j * bc];
  out[cell] = static_cast<float>(acc);
}

__global__ void add_kernel(float* data, std::int64_t n, float value) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) data[i] += value;
}

__global__ void sum_kernel(const float* a, const float* b, const float* c, const float* d, float* out, std::int64_t n) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float sum = a[i];
  if (b != nullptr) sum += b[i];
  if (c != nullptr) sum += c[i];
  if (d != nullptr) sum += d[i];
  out[i] = sum;
}

unsigned blocks_for(std::int64_t n) {
  return static_cast<unsigned>((n + 255) / 256);
}

}  // namespace

cudaError_t evaluate(const Program& program, cudaStream_t stream) {
  if (program.numel == 0) return cudaSuccess;
  evaluate_kernel<<<blocks_for(program.numel), 256, 0, stream>>>(program);
  return cudaGetLastError();
}

cudaError_t matmul_transposed(const float* a, std::int64_t a_row_stride, std::int64_t a_col_stride, const float* b,
                              std::int64_t b_row_stride, std::int64_t b_col_stride, float* out, std::int64_t k,
                              std::int64_t m, std::int64_t n, cudaStream_t stream) {
  matmul_transposed_kernel<<<blocks_for(m * n), 256, 0, stream>>>(a, a_row_stride, a_col_stride, b, b_row_stride,
                                                                  b_col_stride, out, k, m, n);
  return cudaGetLastError();
}

cudaError_t add_repeatedly(float* data, std::int64_t n, float value, int times, cudaStream_t stream) {
  for (int t = 0; t < times; ++t) add_kernel<<<blocks_for(n), 256, 0, stream>>>(data, n, value);
  return cudaGetLastError();
}

cudaError_t sum_inputs(const float* a, const float* b, const float* c, const float* d, float* out, std::int64_t n,
                       cudaStream_t stream) {
  sum_kernel<<<blocks_for(n), 256, 0, stream>>>(a, b, c, d, out, n);
  return cudaGetLastError();
}

namespace {
__global__ void count_step_kernel(float* count, std::int32_t* go_on, const float* target) {
  *count += 1;
  *go_on = *count < *target ? 1 : 0;
}
__global__ void count_decide_kernel(const float* count, std::int32_t* go_on, const float* target) {
  *go_on = *count < *target ? 1 : 0;
}
}  // namespace

cudaError_t count_step(float* count, std::int32_t* go_on, const float* target, cudaStream_t stream) {
  count_step_kernel<<<1, 1, 0, stream>>>(count, go_on, target);
  return cudaGetLastError();
}

cudaError_t count_decide(const float* count, std::int32_t* go_on, const float* target, cudaStream_t stream) {
  count_decide_kernel<<<1, 1, 0, stream>>>(count, go_on, target);
  return cudaGetLastError();
}

}  // namespace cgt_test
