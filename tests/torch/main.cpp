// Catch2's main for the GPU tests, then the caching allocator's cached memory handed back, so that
// compute-sanitizer's leak check reports only memory the tests really leaked.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <catch2/catch_session.hpp>

int main(int argc, char* argv[]) {
  const int result = Catch::Session().run(argc, argv);
  if (c10::cuda::device_count() > 0) {
    c10::cuda::device_synchronize();
    at::cuda::clearCublasWorkspaces();
    c10::cuda::CUDACachingAllocator::emptyCache();
  }
  return result;
}
