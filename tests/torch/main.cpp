// Catch2's main for the GPU tests, made so that compute-sanitizer's leak check reports only memory
// the tests leak:
//  * libtorch keeps its cuBLAS handles for the life of the process (a deliberately leaked
//    singleton in its handle pool), and cuBLAS allocates device memory for them. main() creates
//    the handle first, in one place, so that those allocations carry one backtrace, through
//    libcublas, that scripts/memcheck-report.py tells apart from the tests' own.
//  * After the tests, cached device and pinned host memory is handed back.
#include <ATen/ATen.h>
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <catch2/catch_session.hpp>

namespace {

[[gnu::noinline]] void create_cublas_handle() {
  const at::Tensor a = at::ones({8, 8}, at::TensorOptions().device(at::kCUDA, 0));
  (void)at::matmul(a, a);
  c10::cuda::device_synchronize();
}

void hand_back_cached_memory() {
  c10::cuda::device_synchronize();
  at::cuda::clearCublasWorkspaces();
  c10::cuda::CUDACachingAllocator::emptyCache();
  at::getHostAllocator(at::kCUDA)->empty_cache();  // pinned buffers of tensor.item()
}

}  // namespace

int main(int argc, char* argv[]) {
  const bool has_device = c10::cuda::device_count() > 0;
  if (has_device) create_cublas_handle();
  const int result = Catch::Session().run(argc, argv);
  if (has_device) hand_back_cached_memory();
  return result;
}
