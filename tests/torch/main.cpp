// Catch2's main for the GPU tests, made so that compute-sanitizer's leak check reports only memory
// the tests leak:
//  * libtorch keeps its cuBLAS handles for the life of the process (a deliberately leaked
//    singleton in its handle pool), and cuBLAS allocates device memory for each. After the tests,
//    main() destroys the handle of this thread (the only one the tests use), found in the
//    libcublas that libtorch loaded; the pool is never destroyed, so nothing uses it again. The
//    same holds for its cuDNN handles (a convolution's), destroyed the same way.
//  * After the tests, cached device and pinned host memory is handed back.
#include <ATen/ATen.h>
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <catch2/catch_session.hpp>
#include <dlfcn.h>

struct cudnnContext;
namespace at::native {
cudnnContext* getCudnnHandle();  // ATen/cudnn/Handle.h, which needs cudnn.h
}  // namespace at::native

namespace {

// Initialises libtorch's CUDA state (allocator, cuBLAS handle) before any test, so that handing
// memory back at exit is valid even when no test ran (--list-tests, as ctest's discovery does).
void initialise_cuda_state() {
  const at::Tensor a = at::ones({8, 8}, at::TensorOptions().device(at::kCUDA, 0));
  (void)at::matmul(a, a);
  c10::cuda::device_synchronize();
}

// cublasDestroy_v2 of the libcublas libtorch loaded (linking one here could load another copy).
void destroy_cublas_handle() {
  using Destroy = int (*)(cublasHandle_t);
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-reinterpret-cast): dlsym's result is a function
  const auto destroy = reinterpret_cast<Destroy>(dlsym(RTLD_DEFAULT, "cublasDestroy_v2"));
  if (destroy != nullptr) (void)destroy(at::cuda::getCurrentCUDABlasHandle());
}

// cudnnDestroy of the libcudnn libtorch loaded, on this thread's handle (made now if no test made
// one: made and destroyed, it leaves nothing). Declared here, as libtorch does, so that this file
// needs no cuDNN headers.
void destroy_cudnn_handle() {
  using Destroy = int (*)(cudnnContext*);
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-reinterpret-cast): dlsym's result is a function
  const auto destroy = reinterpret_cast<Destroy>(dlsym(RTLD_DEFAULT, "cudnnDestroy"));
  if (destroy != nullptr) (void)destroy(at::native::getCudnnHandle());
}

void hand_back_cached_memory() {
  c10::cuda::device_synchronize();
  destroy_cublas_handle();
  destroy_cudnn_handle();
  at::cuda::clearCublasWorkspaces();
  c10::cuda::CUDACachingAllocator::emptyCache();
  at::getHostAllocator(at::kCUDA)->empty_cache();  // pinned buffers of tensor.item()
}

}  // namespace

int main(int argc, char* argv[]) {
  const bool has_device = c10::cuda::device_count() > 0;
  if (has_device) initialise_cuda_state();
  const int result = Catch::Session().run(argc, argv);
  if (has_device) hand_back_cached_memory();
  return result;
}
