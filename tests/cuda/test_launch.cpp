// cgt.cuda's recorded graphs with memset and memcpy nodes: replaced by kernel nodes before
// instantiation (`PoolOptions::rewrite_memset_nodes`, `rewrite_memcpy_nodes`), they must write
// byte for byte what the memsets and copies wrote, in the same order with the kernels around them.
// Tagged [gpu][launch].
#include <catch2/catch_test_macros.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

#include "cuda/kernels.hpp"
#include "launch/memset_script.hpp"
#include "scenario/spec.hpp"

import cgt;
import cgt.cuda;

#include "cuda/harness.hpp"

namespace {

using H = CudaHarness;
using scenario::must;
namespace lt = launch_test;

constexpr std::int64_t floats = 64;

// The script's memsets, then the region's 64 floats (1.0f) += 2 by two kernels, += `added` (an
// input), then the script's copies (one copies the region): a byte buffer of the pool.
cgt::cuda::Values run_script(cgt::cuda::Context& ctx, const cgt::cuda::Buffer& added) {
  cgt::cuda::Buffer out = ctx.allocate(cgt::ElementType::u8, {static_cast<std::int64_t>(lt::script_bytes)});
  auto* base = out.as<unsigned char>();
  auto* region =
      reinterpret_cast<float*>(base + lt::kernel_region);  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
  lt::launch(lt::script_before_kernel(), base, ctx.stream());
  if (cgt_test::add_repeatedly(region, floats, 1.0F, 2, ctx.stream()) != cudaSuccess ||
      cgt_test::sum_inputs(region, added.as<float>(), nullptr, nullptr, region, floats, ctx.stream()) != cudaSuccess) {
    throw std::runtime_error("a kernel failed to launch");
  }
  lt::launch(lt::script_after_kernel(), base, ctx.stream());
  return {out};
}

// What run_script writes, on the host.
std::vector<unsigned char> expected_bytes(const std::vector<double>& added) {
  std::vector<unsigned char> bytes(lt::script_bytes, 0);
  lt::apply(lt::script_before_kernel(), bytes);
  for (std::size_t i = 0; i < added.size(); ++i) {
    const float value = 3.0F + static_cast<float>(added[i]);
    std::memcpy(bytes.data() + lt::kernel_region + i * sizeof(float), &value, sizeof(float));
  }
  lt::apply(lt::script_after_kernel(), bytes);
  return bytes;
}

std::vector<unsigned char> read_bytes(const cgt::cuda::Buffer& buffer) {
  std::vector<unsigned char> bytes(buffer.storage_bytes());
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  REQUIRE(cudaMemcpy(bytes.data(), buffer.data(), bytes.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
  return bytes;
}

// The first byte where two buffers differ, or their size when none does (REQUIRE names it).
std::size_t first_difference(const std::vector<unsigned char>& a, const std::vector<unsigned char>& b) {
  const std::size_t n = std::min(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) return i;
  }
  return a.size() == b.size() ? n : n + 1;
}

scenario::HostTensor added_at(int step) {
  scenario::HostTensor t = scenario::HostTensor::iota({floats});
  for (double& x : t.data) x = x * 0.5 + step;
  return t;
}

}  // namespace

TEST_CASE("cuda/memset and memcpy nodes become kernels that write the same bytes on every replay", "[gpu][launch]") {
  scenario::skip_unless_available<H>();
  const std::size_t memsets = lt::memsets_in(lt::script_before_kernel()) + lt::memsets_in(lt::script_after_kernel());
  const std::size_t copies = lt::copies_in(lt::script_after_kernel());
  for (const bool rewrite : {true, false}) {
    INFO("rewrite_memset_nodes = rewrite_memcpy_nodes = " << rewrite);
    cgt::cuda::PoolOptions options;
    options.poison_dead_memory = true;  // a replay that skipped a byte shows 0xFF there
    options.rewrite_memset_nodes = rewrite;
    options.rewrite_memcpy_nodes = rewrite;
    auto pool = must(cgt::cuda::make_pool(std::move(options)));
    auto script = must(pool.add_function(
        [](cgt::cuda::Context& ctx, cgt::cuda::Inputs in) { return run_script(ctx, in[0]); }, {.name = "script"}));
    for (int step = 0; step < 5; ++step) {
      INFO("step " << step);
      pool.mark_step_begin();
      const scenario::HostTensor added = added_at(step);
      auto out = must(script({H::make(added)}));
      CHECK(out.kind() ==
            (step == 0 ? cgt::CallKind::warmup : (step == 1 ? cgt::CallKind::recording : cgt::CallKind::replay)));
      const std::vector<unsigned char> bytes = read_bytes(must(out.get(0)).get());
      const std::vector<unsigned char> expected = expected_bytes(added.data);
      REQUIRE(first_difference(bytes, expected) == expected.size());
    }
    const cgt::cuda::GraphCounts& counts = must(pool.device()).get().graph_counts();
    CHECK(counts.instantiated == 1);
    CHECK(counts.memset_nodes_rewritten == (rewrite ? memsets : 0));
    CHECK(counts.memset_nodes_kept == (rewrite ? 0 : memsets));
    CHECK(counts.memcpy_nodes_rewritten == (rewrite ? copies : 0));
    CHECK(counts.memcpy_nodes_kept == (rewrite ? 0 : copies));
  }
}

// A re-recording because a static input moved has the rewritten topology of the first recording
// (the rewrite goes node by node in creation order): it updates that executable in place, and
// both graphs, loaded in turn, write their bytes. Default options: memsets rewritten, memcpys kept.
TEST_CASE("cuda/a rewritten graph updates in place when a static input moves, and both addresses replay right",
          "[gpu][launch]") {
  scenario::skip_unless_available<H>();
  cgt::cuda::PoolOptions options;
  options.poison_dead_memory = true;
  auto pool = must(cgt::cuda::make_pool(std::move(options)));
  auto script =
      must(pool.add_function([](cgt::cuda::Context& ctx, cgt::cuda::Inputs in) { return run_script(ctx, in[0]); },
                             {.name = "script", .static_inputs = {0}}));
  const std::vector<scenario::HostTensor> weights{added_at(10), added_at(20)};
  const std::vector<H::Value> buffers{H::make(weights[0]), H::make(weights[1])};
  const std::vector<std::size_t> order{0, 0, 1, 0, 1, 1, 0};
  for (std::size_t step = 0; step < order.size(); ++step) {
    INFO("step " << step);
    pool.mark_step_begin();
    auto out = must(script({buffers[order[step]]}));
    const std::vector<unsigned char> expected = expected_bytes(weights[order[step]].data);
    REQUIRE(first_difference(read_bytes(must(out.get(0)).get()), expected) == expected.size());
  }
  const cgt::cuda::GraphCounts& counts = must(pool.device()).get().graph_counts();
  CHECK(counts.instantiated == 1);
  CHECK(counts.updated_in_place == 1);
  CHECK(counts.memset_nodes_kept == 0);
  CHECK(counts.memset_nodes_rewritten ==
        2 * (lt::memsets_in(lt::script_before_kernel()) + lt::memsets_in(lt::script_after_kernel())));
  CHECK(counts.memcpy_nodes_rewritten == 0);
  CHECK(counts.memcpy_nodes_kept == 2 * lt::copies_in(lt::script_after_kernel()));
}
