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
// Then two tables that say where the cost comes from. First, the single-kernel graph's launch after
// the host waited 0.1 to 20 ms without a CUDA call: asleep or spinning with the GPU idle, or spinning
// while the GPU runs (is it the CPU going idle, the GPU going idle, or the wait itself?). Second,
// after 20 ms asleep or after a synchronisation that ended 20 ms of GPU work, which first call pays
// it: a plain kernel launch, a stream query or an event record, each timed, then the graph launch.
// Medians of 30, microseconds. Build and run on a GPU machine (no dependencies); the argument picks
// how a synchronisation waits (auto, spin, yield or block):
//   nvcc -O2 -o launch_after_idle bench/launch_after_idle.cu && ./launch_after_idle [auto]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <string>
#include <utility>
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

// Time of `call` on the thread's CPU and on the clock.
template <typename Call>
Sample timed(Call&& call) {
  const double cpu = thread_cpu_us();
  const auto wall = std::chrono::steady_clock::now();
  call();
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
    const Sample sample = timed([&] { check(cudaGraphLaunch(exec, stream), "launch"); });
    cpu.push_back(sample.cpu);
    wall.push_back(sample.wall);
    if (before != Before::back_to_back) check(cudaStreamSynchronize(stream), "sync");
  }
  check(cudaStreamSynchronize(stream), "sync");
  return {median(cpu), median(wall)};
}

// The host waits `microseconds` without a CUDA call: asleep (the core may go idle) or spinning.
void host_wait(double microseconds, bool sleep) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double, std::micro>(microseconds);
  if (sleep) {
    std::this_thread::sleep_until(until);
    return;
  }
  while (std::chrono::steady_clock::now() < until) {
  }
}

// After `before` (which leaves the stream idle or busy), the CPU time of `first` and of the launch
// after it: medians of 30.
std::pair<double, double> after(cudaGraphExec_t exec, cudaStream_t stream, const std::function<void()>& before,
                                const std::function<void()>& first) {
  constexpr int rounds = 30;
  std::vector<double> first_cpu, launch_cpu;
  for (int round = 0; round < rounds; ++round) {
    check(cudaStreamSynchronize(stream), "sync");
    before();
    first_cpu.push_back(timed(first).cpu);
    launch_cpu.push_back(timed([&] { check(cudaGraphLaunch(exec, stream), "launch"); }).cpu);
  }
  check(cudaStreamSynchronize(stream), "sync");
  return {median(first_cpu), median(launch_cpu)};
}

void print_idle_sweep(cudaGraphExec_t single, cudaStream_t stream) {
  std::printf(
      "\n| host waited | GPU idle, host asleep | GPU idle, host spinning | GPU running, host spinning |\n"
      "|---|---|---|---|\n");
  const auto nothing = [] {};
  for (const double microseconds : {100.0, 1000.0, 5000.0, 20000.0}) {
    const double asleep = after(single, stream, [&] { host_wait(microseconds, true); }, nothing).second;
    const double spinning = after(single, stream, [&] { host_wait(microseconds, false); }, nothing).second;
    const double gpu_running = after(
                                   single, stream,
                                   [&] {  // the GPU works for 90% of the wait
                                     spin<<<1, 1, 0, stream>>>(static_cast<unsigned long long>(microseconds * 900));
                                     host_wait(microseconds, false);
                                   },
                                   nothing)
                                   .second;
    std::printf("| %.1f ms | %.1f | %.1f | %.1f |\n", microseconds / 1000, asleep, spinning, gpu_running);
  }
}

void print_who_pays(cudaGraphExec_t single, cudaStream_t stream, float* x) {
  cudaEvent_t event = nullptr;
  check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "event");
  const struct {
    const char* name;
    std::function<void()> call;
  } firsts[] = {{"nothing", [] {}},
                {"kernel launch", [&] { tiny<<<1, 32, 0, stream>>>(x); }},
                {"stream query", [&] { (void)cudaStreamQuery(stream); }},
                {"event record", [&] { check(cudaEventRecord(event, stream), "record"); }},
                {"graph launch", [&] { check(cudaGraphLaunch(single, stream), "launch"); }}};
  const auto asleep = [] { host_wait(20000.0, true); };
  const auto long_run = [&] {
    spin<<<1, 1, 0, stream>>>(20'000'000ULL);
    check(cudaStreamSynchronize(stream), "sync");
  };
  std::printf(
      "\n| first call | after 20 ms asleep: its CPU | graph launch after it | after a sync that ended 20 ms "
      "of GPU work: its CPU | graph launch after it |\n|---|---|---|---|---|\n");
  for (int pass = 0; pass < 2; ++pass) {
    for (const auto& first : firsts) {
      const auto [asleep_first, asleep_launch] = after(single, stream, asleep, first.call);
      const auto [run_first, run_launch] = after(single, stream, long_run, first.call);
      std::printf("| %s (pass %d) | %.1f | %.1f | %.1f | %.1f |\n", first.name, pass + 1, asleep_first, asleep_launch,
                  run_first, run_launch);
    }
  }
  check(cudaEventDestroy(event), "event");
}

// Can calls made during a 20 ms wait (GPU idle, host spinning) keep the next launch cheap? Every
// 1 ms: nothing, a stream query, or a launch of the single-kernel graph on a side stream, on the
// launching thread; or that side launch on a second thread.
void print_kept_warm(cudaGraphExec_t single, cudaStream_t stream) {
  cudaStream_t side = nullptr;
  check(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), "stream");
  const auto spin_with = [](const std::function<void()>& every_ms) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
    auto next = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() < end) {
      if (std::chrono::steady_clock::now() < next) continue;
      every_ms();
      next += std::chrono::milliseconds(1);
    }
  };
  const auto nothing = [] {};
  const auto query = [&] { (void)cudaStreamQuery(stream); };
  const auto side_launch = [&] { check(cudaGraphLaunch(single, side), "launch"); };
  const auto other_thread = [&] { std::thread([&] { spin_with(side_launch); }).join(); };
  const struct {
    const char* name;
    std::function<void()> before;
  } ways[] = {{"nothing", [&] { spin_with(nothing); }},
              {"stream query", [&] { spin_with(query); }},
              {"side-stream graph launch", [&] { spin_with(side_launch); }},
              {"side-stream graph launch, other thread", other_thread}};
  std::printf("\n| every 1 ms of a 20 ms wait | launch CPU (pass 1) | (pass 2) |\n|---|---|---|\n");
  for (const auto& way : ways) {
    const double first = after(single, stream, way.before, nothing).second;
    const double second = after(single, stream, way.before, nothing).second;
    std::printf("| %s | %.1f | %.1f |\n", way.name, first, second);
  }
  check(cudaStreamSynchronize(side), "sync");
  check(cudaStreamDestroy(side), "stream");
}

}  // namespace

// argv[1] picks how a synchronisation waits: auto (the default), spin, yield or block.
int main(int argc, char** argv) {
  const std::string schedule = argc > 1 ? argv[1] : "auto";
  const unsigned flags = schedule == "spin"    ? cudaDeviceScheduleSpin
                         : schedule == "yield" ? cudaDeviceScheduleYield
                         : schedule == "block" ? cudaDeviceScheduleBlockingSync
                                               : cudaDeviceScheduleAuto;
  check(cudaSetDeviceFlags(flags), "device flags");
  std::printf("synchronisation: %s\n\n", schedule.c_str());
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
  print_idle_sweep(single, stream);
  print_who_pays(single, stream, x);
  print_kept_warm(single, stream);
  check(cudaGraphExecDestroy(chain), "destroy");
  check(cudaGraphExecDestroy(single), "destroy");
  check(cudaFree(x), "free");
  check(cudaStreamDestroy(stream), "stream");
  return 0;
}
