// What waits for what in cgt.torch (docs/libtorch.md, "Streams"): warm-ups, recordings and replays
// queue behind the caller's stream without waiting on the host for it, and still compute with the
// values the caller's earlier work writes. The caller's stream is held shut by a host function
// while the calls run: a call that waited on the host for that stream would never return (a
// watchdog opens it after a minute and the test fails).
//
// Each test first runs its calls once on a scratch pool with the stream open: CUDA loads a
// kernel at its first launch in the process (lazy loading), and a load may wait for the whole
// context, held gate included.
#include <torch/torch.h>
// libtorch's logging defines CHECK; the tests mean Catch2's.
#undef CHECK
#include <catch2/catch_test_macros.hpp>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "scenario/spec.hpp"

import cgt;
import cgt.torch;

#include "torch/harness.hpp"

using H = TorchHarness;
using scenario::must;

namespace {

// Holds `stream` at a host function until open() (or the watchdog) lets it go: work queued on it
// after the gate runs only then.
class StreamGate {
 public:
  explicit StreamGate(cudaStream_t stream) : stream_(stream) {
    if (cudaLaunchHostFunc(stream, &StreamGate::hold, this) != cudaSuccess) {
      (void)cudaGetLastError();
      open_.store(true);
      failed_to_close_ = true;
    }
    watchdog_ = std::thread([this] {
      std::unique_lock lock(mutex_);
      if (!opened_.wait_for(lock, std::chrono::seconds(60), [this] { return open_.load(); })) {
        forced_.store(true);
        open_.store(true);
      }
    });
  }
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;
  ~StreamGate() {
    open();
    watchdog_.join();
  }

  void open() {
    {
      const std::lock_guard lock(mutex_);
      open_.store(true);
    }
    opened_.notify_all();
  }
  /// Opens the gate; true when the stream was still held behind it (work queued, none run).
  [[nodiscard]] bool release() {
    const bool held = cudaStreamQuery(stream_) == cudaErrorNotReady;
    open();
    return held;
  }
  /// Whether the gate could be put on the stream at all.
  [[nodiscard]] bool closed_at_start() const { return !failed_to_close_; }
  /// Whether a call waited for the stream so long that the watchdog had to open it.
  [[nodiscard]] bool forced_open() const { return forced_.load(); }

 private:
  static void CUDART_CB hold(void* self) {
    const auto* gate = static_cast<const StreamGate*>(self);
    while (!gate->open_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

  cudaStream_t stream_;
  std::atomic<bool> open_{false};
  std::atomic<bool> forced_{false};
  bool failed_to_close_ = false;
  std::mutex mutex_;
  std::condition_variable opened_;
  std::thread watchdog_;
};

struct Kept {
  at::Tensor output;  // taken from its lease: kept across steps
  cgt::CallKind kind = cgt::CallKind::eager;
  float input = 0;
};

// Calls `affine` once per shape, each input written on the caller's stream just before its call (a
// call that read it before the caller's work ran would compute with garbage), each call a step.
// With two shapes of one rank, the second shape's warm-up and recording reuse pool memory (the
// first recording's input slot) that the first recording's run may not have read yet.
const std::vector<std::vector<std::int64_t>> affine_shapes{{256}, {256}, {256}, {128}, {128}, {128}, {256}};

std::vector<Kept> call_affine(cgt::torch::Pool& pool, const cgt::torch::Function& affine, const StreamGate* gate) {
  std::vector<Kept> kept;
  for (std::size_t i = 0; i < affine_shapes.size(); ++i) {
    const auto value = static_cast<float>(i + 1);
    const at::Tensor x = at::empty(affine_shapes[i], H::cuda());
    x.fill_(value);
    pool.mark_step_begin();
    auto out = must(affine({x}));
    INFO("call " << i);
    if (gate != nullptr) CHECK_FALSE(gate->forced_open());
    kept.push_back({.output = must(out.take(0)), .kind = out.kind(), .input = value});
  }
  return kept;
}

cgt::torch::Function make_affine(cgt::torch::Pool& pool) {
  return must(
      pool.add_function([](cgt::torch::Inputs in) { return cgt::torch::Values{in[0] * 2 + 1}; }, {.name = "affine"}));
}

std::vector<at::Tensor> draw_four(cgt::torch::Pool& pool, const cgt::torch::Function& draw, const StreamGate* gate,
                                  std::vector<cgt::CallKind>& kinds) {
  at::manual_seed(0);
  std::vector<at::Tensor> drawn;
  for (int i = 0; i < 4; ++i) {
    pool.mark_step_begin();
    auto out = must(draw({}));
    INFO("call " << i);
    if (gate != nullptr) CHECK_FALSE(gate->forced_open());
    kinds.push_back(out.kind());
    drawn.push_back(must(out.take(0)));
  }
  return drawn;
}

cgt::torch::Function make_draw(cgt::torch::Pool& pool) {
  return must(pool.add_function([](cgt::torch::Inputs) { return cgt::torch::Values{at::rand({20}, H::cuda())}; },
                                {.name = "draw"}));
}

}  // namespace

TEST_CASE("torch/streams: warm-ups, recordings and replays queue behind the caller's work without waiting for it",
          "[gpu][streams]") {
  scenario::skip_unless_available<H>();
  {
    auto scratch = must(H::make_pool());
    const auto affine = make_affine(scratch);
    (void)call_affine(scratch, affine, nullptr);
    must(scratch.shutdown());
  }
  auto pool = must(H::make_pool());
  const auto affine = make_affine(pool);
  StreamGate gate(c10::cuda::getCurrentCUDAStream(0).stream());
  REQUIRE(gate.closed_at_start());
  std::vector<Kept> kept = call_affine(pool, affine, &gate);
  CHECK(gate.release());
  std::vector<cgt::CallKind> kinds;
  for (const Kept& k : kept) kinds.push_back(k.kind);
  using K = cgt::CallKind;
  CHECK(kinds == std::vector{K::warmup, K::recording, K::replay, K::warmup, K::recording, K::replay, K::replay});
  for (std::size_t i = 0; i < kept.size(); ++i) {
    INFO("call " << i);
    CHECK(at::equal(kept[i].output, at::full(affine_shapes[i], kept[i].input * 2 + 1, H::cuda())));
  }
}

// check_rng with the caller's stream held: the generator's graph state is reset by the capture on
// the pool's stream and read by the first run on the caller's, both queued.
TEST_CASE("torch/streams: random numbers drawn behind held work are eager's", "[gpu][streams]") {
  scenario::skip_unless_available<H>();
  {
    auto scratch = must(H::make_pool());
    const auto draw = make_draw(scratch);
    std::vector<cgt::CallKind> ignored;
    (void)draw_four(scratch, draw, nullptr, ignored);
    must(scratch.shutdown());
  }
  auto pool = must(H::make_pool());
  const auto draw = make_draw(pool);
  StreamGate gate(c10::cuda::getCurrentCUDAStream(0).stream());
  REQUIRE(gate.closed_at_start());
  std::vector<cgt::CallKind> kinds;
  const std::vector<at::Tensor> drawn = draw_four(pool, draw, &gate, kinds);
  at::manual_seed(0);
  std::vector<at::Tensor> eager;
  for (int i = 0; i < 4; ++i) eager.push_back(at::rand({20}, H::cuda()));
  CHECK(gate.release());
  using K = cgt::CallKind;
  CHECK(kinds == std::vector{K::warmup, K::recording, K::replay, K::replay});
  for (std::size_t i = 0; i < drawn.size(); ++i) {
    INFO("draw " << i);
    CHECK(at::equal(drawn[i], eager[i]));
  }
}

// A pool called from a second stream while the work its last call queued on the first is held:
// the graph's first run, queued behind the gate, reads its input slot, and the replay from the
// second stream writes that slot. The input is transposed, so the replay's copy into the slot is a
// copy_ on the caller's stream, outside the graph: unordered with the first stream, it would land
// before the first run reads the slot and be overwritten by the recording's own copy.
TEST_CASE("torch/streams: a call from another stream waits for the work the last call queued", "[gpu][streams]") {
  scenario::skip_unless_available<H>();
  const auto transposed = [](float value) { return at::full({64, 32}, value, H::cuda()).t(); };
  {
    auto scratch = must(H::make_pool());
    const auto affine = make_affine(scratch);
    for (int i = 0; i < 3; ++i) {
      scratch.mark_step_begin();
      (void)must(affine({transposed(1)}));
    }
    must(scratch.shutdown());
  }
  const c10::cuda::CUDAStream first = c10::cuda::getStreamFromPool(false, 0);
  const c10::cuda::CUDAStream second = c10::cuda::getStreamFromPool(false, 0);
  auto pool = must(H::make_pool());
  const auto affine = make_affine(pool);
  std::vector<cgt::CallKind> kinds;
  at::Tensor replayed;
  {
    const c10::cuda::CUDAStreamGuard on_first(first);
    StreamGate gate(first.stream());
    REQUIRE(gate.closed_at_start());
    for (int i = 0; i < 2; ++i) {  // a warm-up and a recording, queued behind the gate
      pool.mark_step_begin();
      kinds.push_back(must(affine({transposed(1)})).kind());
    }
    {
      const c10::cuda::CUDAStreamGuard on_second(second);
      pool.mark_step_begin();
      auto out = must(affine({transposed(5)}));
      kinds.push_back(out.kind());
      replayed = must(out.take(0));
    }
    CHECK_FALSE(gate.forced_open());
    CHECK(gate.release());
  }
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  using K = cgt::CallKind;
  CHECK(kinds == std::vector{K::warmup, K::recording, K::replay});
  INFO("replayed: from " << replayed.min().item<float>() << " to " << replayed.max().item<float>());
  CHECK(at::equal(replayed, at::full({32, 64}, 11.0F, H::cuda())));
}

// A replay asks the driver whether its pool's context is the thread's current one, and only when
// it is not asks the runtime (see cgt.cuda's test of the same name). A thread that has never used
// CUDA takes the runtime's way on its first replay and the driver's on its next ones; the graph runs
// on the pool's device and the values are right either way.
TEST_CASE("torch/streams: replays from threads that never used CUDA launch on the pool's device and read right",
          "[gpu]") {
  scenario::skip_unless_available<H>();
  auto pool = must(H::make_pool());
  auto f = must(pool.add_function([](cgt::torch::Inputs in) { return cgt::torch::Values{in[0] * 2 + 1}; },
                                  {.name = "twice_plus_one", .static_inputs = {0}}));
  const at::Tensor x = torch::full({4}, 3.0F, H::cuda());
  for (int call = 0; call < 2; ++call) (void)must(f({x}));
  for (int thread = 0; thread < 3; ++thread) {
    std::vector<at::Tensor> seen;
    std::vector<cgt::CallKind> kinds;
    std::thread([&] {
      for (int call = 0; call < 3; ++call) {
        auto out = must(f({x}));
        kinds.push_back(out.kind());
        seen.push_back(must(out.take(0)).cpu());
      }
    }).join();
    CHECK(kinds == std::vector<cgt::CallKind>(3, cgt::CallKind::replay));
    for (const at::Tensor& values : seen) CHECK(torch::equal(values, torch::full({4}, 7.0F)));
  }
  CHECK(pool.stats().replays == 9);
}
