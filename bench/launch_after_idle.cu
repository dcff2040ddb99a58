// What a cudaGraphLaunch costs the CPU depending on what came before it (issue 12, item 4: the
// launch of some real-model graphs costs 10x more right after a synchronisation than call after
// call, whatever their node types). No cgt inside: raw launches of two graphs captured from tiny
// kernels, a chain of 240 and a single one, each timed (thread CPU time, and wall) in five
// situations:
//   back to back      launched call after call, nothing waited for
//   while GPU busy    launched while a 20 ms kernel runs
//   after short run   after a synchronisation that ended 0.1 ms of GPU work
//   after long run    after a synchronisation that ended 20 ms of GPU work
//   after host sleep  after a synchronisation, then 20 ms of the host sleeping (GPU idle)
// Medians of 30, microseconds. Build and run on a GPU machine (no dependencies):
//   nvcc -O2 -o launch_after_idle bench/launch_after_idle.cu && ./launch_after_idle
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <thread>
#include <vector>

namespace {

void check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(status));
  std::exit(1);
}

__global__ void tiny(float* x) {
  x[threadIdx.x] += 1.0F;
}

// Keeps one block busy for about `nanoseconds` of GPU time.
__global__ void spin(unsigned long long nanoseconds) {
  const unsigned long long start = clock64();
  // clock64 counts SM cycles; about 1.5-2 cycles per ns on an H100/H200: a floor, not exact.
  while (clock64() - start < nanoseconds * 2ULL) {
  }
}

cudaGraphExec_t capture_chain(cudaStream_t stream, float* x, int kernels) {
  cudaGraph_t graph = nullptr;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  for (int i = 0; i < kernels; ++i) tiny<<<1, 32, 0, stream>>>(x);
  check(cudaStreamEndCapture(stream, &graph), "end capture");
  cudaGraphExec_t exec = nullptr;
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  check(cudaGraphDestroy(graph), "destroy graph");
  return exec;
}

double thread_cpu_us() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) * 1e6 + static_cast<double>(now.tv_nsec) / 1e3;
}

struct Sample {
  double cpu = 0, wall = 0;
};

Sample timed_launch(cudaGraphExec_t exec, cudaStream_t stream) {
  const double cpu = thread_cpu_us();
  const auto wall = std::chrono::steady_clock::now();
  check(cudaGraphLaunch(exec, stream), "launch");
  return {thread_cpu_us() - cpu,
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - wall).count()};
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

enum class Before { back_to_back, gpu_busy, short_run, long_run, host_sleep };

Sample measure(cudaGraphExec_t exec, cudaStream_t stream, Before before) {
  constexpr int rounds = 30;
  std::vector<double> cpu, wall;
  for (int round = 0; round < rounds; ++round) {
    switch (before) {
      case Before::back_to_back: break;  // the previous round's launch is still queued or running
      case Before::gpu_busy: spin<<<1, 1, 0, stream>>>(20'000'000ULL); break;
      case Before::short_run:
        spin<<<1, 1, 0, stream>>>(100'000ULL);
        check(cudaStreamSynchronize(stream), "sync");
        break;
      case Before::long_run:
        spin<<<1, 1, 0, stream>>>(20'000'000ULL);
        check(cudaStreamSynchronize(stream), "sync");
        break;
      case Before::host_sleep:
        check(cudaStreamSynchronize(stream), "sync");
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        break;
    }
    const Sample sample = timed_launch(exec, stream);
    cpu.push_back(sample.cpu);
    wall.push_back(sample.wall);
    if (before != Before::back_to_back) check(cudaStreamSynchronize(stream), "sync");
  }
  check(cudaStreamSynchronize(stream), "sync");
  return {median(cpu), median(wall)};
}

}  // namespace

int main() {
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  float* x = nullptr;
  check(cudaMalloc(&x, 32 * sizeof(float)), "malloc");
  check(cudaMemset(x, 0, 32 * sizeof(float)), "memset");
  const cudaGraphExec_t chain = capture_chain(stream, x, 240);
  const cudaGraphExec_t single = capture_chain(stream, x, 1);
  for (int i = 0; i < 20; ++i) {  // first-use costs (lazy loading, uploads) out of the way
    check(cudaGraphLaunch(chain, stream), "launch");
    check(cudaGraphLaunch(single, stream), "launch");
    spin<<<1, 1, 0, stream>>>(1000ULL);
  }
  check(cudaStreamSynchronize(stream), "sync");

  const struct {
    Before before;
    const char* name;
  } situations[] = {{Before::back_to_back, "back to back"},
                    {Before::gpu_busy, "while GPU busy"},
                    {Before::short_run, "after short run"},
                    {Before::long_run, "after long run"},
                    {Before::host_sleep, "after host sleep"}};
  std::printf("| before the launch | 240 kernels: CPU | wall | 1 kernel: CPU | wall |\n|---|---|---|---|---|\n");
  for (int pass = 0; pass < 2; ++pass) {  // twice: a drift of the machine shows as a difference
    for (const auto& situation : situations) {
      const Sample many = measure(chain, stream, situation.before);
      const Sample one = measure(single, stream, situation.before);
      std::printf("| %s (pass %d) | %.1f | %.1f | %.1f | %.1f |\n", situation.name, pass + 1, many.cpu, many.wall,
                  one.cpu, one.wall);
    }
  }
  check(cudaGraphExecDestroy(chain), "destroy");
  check(cudaGraphExecDestroy(single), "destroy");
  check(cudaFree(x), "free");
  check(cudaStreamDestroy(stream), "stream");
  return 0;
}
