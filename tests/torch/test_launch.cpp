// cgt.torch's recorded graphs with memset and memcpy nodes: replaced by kernel nodes before
// instantiation (`PoolOptions::rewrite_memset_nodes`, `rewrite_memcpy_nodes`), they must write
// byte for byte what the memsets and copies wrote, around libtorch's kernels. Tagged [gpu][launch].
#include <torch/torch.h>
// libtorch's logging defines CHECK; the tests mean Catch2's.
#undef CHECK
#include <catch2/catch_test_macros.hpp>

#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "launch/memset_script.hpp"
#include "scenario/spec.hpp"

import cgt;
import cgt.torch;

#include "torch/harness.hpp"

namespace {

using H = TorchHarness;
using scenario::must;
namespace lt = launch_test;

constexpr std::int64_t floats = 64;

// The script's memsets, then the region's 64 floats (1.0f) += 2 and += `added` by libtorch's
// kernels, then the script's copies (one copies the region).
cgt::torch::Values run_script(const at::Tensor& added) {
  at::Tensor out = at::empty({static_cast<std::int64_t>(lt::script_bytes)}, H::cuda().dtype(at::kByte));
  auto* base = static_cast<unsigned char*>(out.data_ptr());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  lt::launch(lt::script_before_kernel(), base, stream);
  at::Tensor region = out.narrow(0, static_cast<std::int64_t>(lt::kernel_region), floats * 4).view(at::kFloat);
  region.add_(2.0).add_(added);
  lt::launch(lt::script_after_kernel(), base, stream);
  return {out};
}

std::vector<unsigned char> expected_bytes(const at::Tensor& added) {
  std::vector<unsigned char> bytes(lt::script_bytes, 0);
  lt::apply(lt::script_before_kernel(), bytes);
  const at::Tensor host = added.cpu();
  for (std::int64_t i = 0; i < floats; ++i) {
    const float value = 3.0F + host[i].item<float>();
    std::memcpy(bytes.data() + lt::kernel_region + static_cast<std::size_t>(i) * sizeof(float), &value, sizeof(float));
  }
  lt::apply(lt::script_after_kernel(), bytes);
  return bytes;
}

std::vector<unsigned char> bytes_of(const at::Tensor& tensor) {
  const at::Tensor host = tensor.cpu();
  const auto* data = static_cast<const unsigned char*>(host.data_ptr());
  return {data, data + host.numel()};
}

std::size_t first_difference(const std::vector<unsigned char>& a, const std::vector<unsigned char>& b) {
  const std::size_t n = std::min(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) return i;
  }
  return a.size() == b.size() ? n : n + 1;
}

}  // namespace

TEST_CASE("torch/memset and memcpy nodes become kernels that write the same bytes on every replay", "[gpu][launch]") {
  scenario::skip_unless_available<H>();
  const std::size_t memsets = lt::memsets_in(lt::script_before_kernel()) + lt::memsets_in(lt::script_after_kernel());
  const std::size_t copies = lt::copies_in(lt::script_after_kernel());
  for (const bool rewrite : {true, false}) {
    INFO("rewrite_memset_nodes = rewrite_memcpy_nodes = " << rewrite);
    auto pool = must(cgt::torch::make_pool(
        {.tree = {.debug_checks = true}, .rewrite_memset_nodes = rewrite, .rewrite_memcpy_nodes = rewrite}));
    auto script = must(pool.add_function([](cgt::torch::Inputs in) { return run_script(in[0]); }, {.name = "script"}));
    for (int step = 0; step < 5; ++step) {
      INFO("step " << step);
      pool.mark_step_begin();
      const at::Tensor added = at::arange(floats, H::cuda()) * 0.5 + step;
      auto out = must(script({added}));
      CHECK(out.kind() ==
            (step == 0 ? cgt::CallKind::warmup : (step == 1 ? cgt::CallKind::recording : cgt::CallKind::replay)));
      const std::vector<unsigned char> expected = expected_bytes(added);
      const std::vector<unsigned char> bytes = bytes_of(must(out.get(0)).get());
      REQUIRE(first_difference(bytes, expected) == expected.size());
      // The next replay writes into the same memory: garbage there must all be overwritten.
      (void)must(out.get(0)).get().fill_(0xFF);
    }
    const cgt::GraphCounts& counts = must(pool.device()).get().graph_counts();
    CHECK(counts.memset_nodes_rewritten == (rewrite ? memsets : 0));
    CHECK(counts.memset_nodes_kept == (rewrite ? 0 : memsets));
    CHECK(counts.memcpy_nodes_rewritten == (rewrite ? copies : 0));
    CHECK(counts.memcpy_nodes_kept == (rewrite ? 0 : copies));
    must(pool.check_memory());
  }
}

// Ordinary libtorch work whose capture holds memcpy nodes (copy_ of contiguous tensors of one
// type is a cudaMemcpyAsync) and memset nodes (CUB's radix sort of 65536 values: the benchmark's
// probe counted 6 memsets in sort + cumsum): replays give eager's values.
TEST_CASE("torch/a capture of libtorch copies and matmuls, its nodes rewritten, replays eager's values",
          "[gpu][launch]") {
  scenario::skip_unless_available<H>();
  auto pool = must(cgt::torch::make_pool({.rewrite_memcpy_nodes = true}));
  const auto layer = [](const at::Tensor& x, const at::Tensor& w) {
    at::Tensor copy = at::empty_like(x);
    copy.copy_(x);
    at::Tensor y = at::matmul(copy, w);
    at::Tensor z = at::zeros({y.size(0), 3}, y.options());
    z.add_(y.narrow(1, 0, 3));
    const at::Tensor many = copy.flatten().repeat(171).narrow(0, 0, 65536);
    return cgt::torch::Values{y, z, copy, at::cumsum(copy, 1), at::cumsum(std::get<0>(at::sort(many)), 0)};
  };
  const at::Tensor w = at::randn({48, 40}, H::cuda());
  auto fn = must(pool.add_function([w, layer](cgt::torch::Inputs in) { return layer(in[0], w); }, {.name = "layer"}));
  for (int step = 0; step < 4; ++step) {
    INFO("step " << step);
    pool.mark_step_begin();
    const at::Tensor x = at::randn({8, 48}, H::cuda());
    auto out = must(fn({x}));
    const cgt::torch::Values eager = layer(x, w);
    for (std::size_t i = 0; i < eager.size(); ++i) {
      INFO("output " << i);
      // The last sums 65536 values (to about 3e4) by CUB's scan, whose order of additions depends
      // on timing: it matches eager to rounding only.
      const bool long_sum = i + 1 == eager.size();
      CHECK(at::allclose(must(out.get(i)).get(), eager[i], long_sum ? 1e-3 : 1e-5, long_sum ? 1e-1 : 1e-5));
    }
    CHECK(at::equal(must(out.get(2)).get(), x));
  }
  CHECK(pool.stats().replays == 2);
  const cgt::GraphCounts& counts = must(pool.device()).get().graph_counts();
  CHECK(counts.memcpy_nodes_rewritten >= 1);
  CHECK(counts.memset_nodes_rewritten >= 1);
  CHECK(counts.memset_nodes_kept == 0);
  CHECK(counts.memcpy_nodes_kept == 0);
}
