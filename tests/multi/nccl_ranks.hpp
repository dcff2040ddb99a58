// NCCL for the tests and the tensor-parallel benchmark: one communicator per visible GPU of this
// process (ncclCommInitAll: rank i on device i; a single GPU gives a 1-rank communicator, which
// NCCL allows), and one thread per rank. Made before any capture: ncclCommInitAll allocates and
// synchronises, which a capturing stream would not survive.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <exception>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace cgt_test {

/// Throws std::runtime_error when `result` is not ncclSuccess, saying what was being done.
inline void nccl_check(ncclResult_t result, const char* doing) {
  if (result != ncclSuccess) {
    throw std::runtime_error(std::string("NCCL failed while ") + doing + ": " + ncclGetErrorString(result));
  }
}

/// The communicators of `ranks` GPUs (devices 0 .. ranks-1), destroyed with the object.
class Communicators {
 public:
  explicit Communicators(int ranks) : comms_(static_cast<std::size_t>(ranks)) {
    std::vector<int> devices(static_cast<std::size_t>(ranks));
    std::iota(devices.begin(), devices.end(), 0);
    int current = 0;
    (void)cudaGetDevice(&current);
    nccl_check(ncclCommInitAll(comms_.data(), ranks, devices.data()), "making the communicators");
    (void)cudaSetDevice(current);
  }
  ~Communicators() {
    for (ncclComm_t comm : comms_) (void)ncclCommDestroy(comm);
  }
  Communicators(const Communicators&) = delete;
  Communicators& operator=(const Communicators&) = delete;

  [[nodiscard]] ncclComm_t operator[](int rank) const { return comms_[static_cast<std::size_t>(rank)]; }
  [[nodiscard]] int size() const { return static_cast<int>(comms_.size()); }

 private:
  std::vector<ncclComm_t> comms_;
};

/// Runs `body(rank)` on one thread per rank, all at once (a rank's collective waits on the GPU for
/// the others' calls), and rethrows the first exception a rank threw. Catch2's assertions are not
/// for other threads: ranks report what they saw, and the test checks it on its own thread.
inline void run_ranks(int ranks, const std::function<void(int)>& body) {
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        (void)cudaSetDevice(rank);
        body(rank);
      } catch (...) {
        errors[static_cast<std::size_t>(rank)] = std::current_exception();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const std::exception_ptr& error : errors) {
    if (error) std::rethrow_exception(error);
  }
}

}  // namespace cgt_test
