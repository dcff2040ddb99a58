// cgt.torch with tensors of every layout: inputs and outputs with every layout libtorch allows
// (channels_last, broadcast, offsets, gaps, transposes, overlaps, no elements, no dimensions,
// integers and bools) and leases kept where a careless caller keeps them. The promise checked: a
// pool call returns what the function run eagerly returns (defined or not, element type, sizes,
// strides, values) at its warm-up, its recording and every replay, each call with new input
// values (a stale input slot would repeat old ones), and no output a caller holds is overwritten.
// Tagged [gpu]; SKIPPED without a device.
#include <torch/torch.h>
// libtorch's logging defines CHECK; the tests mean Catch2's.
#undef CHECK
#include <catch2/catch_test_macros.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "scenario/spec.hpp"

import cgt;
import cgt.torch;

#include "torch/harness.hpp"

namespace {

using H = TorchHarness;
using K = cgt::CallKind;
using scenario::must;
using Tensors = std::vector<at::Tensor>;
using Values = cgt::torch::Values;
/// A pool function written over plain tensors, so that the test can run it eagerly as well.
using Body = std::function<Values(const Tensors&)>;
/// The inputs of one step: new values every step.
using MakeInputs = std::function<Tensors(int)>;
/// More checks of one call's outputs against eager's (aliasing, offsets).
using ExtraCheck = std::function<void(const cgt::torch::Outputs&, const Values&)>;

at::TensorOptions cuda(at::ScalarType dtype = at::kFloat) {
  return H::cuda().dtype(dtype);
}

/// A pool whose every call is followed by debug_checks (its live blocks are exactly the memory of
/// live leases).
cgt::torch::Pool new_pool(cgt::Options options = {}) {
  options.debug_checks = true;
  return must(H::make_pool(std::move(options)));
}

cgt::torch::Function add(cgt::torch::Pool& pool, const Body& body, cgt::FunctionOptions options) {
  return must(pool.add_function([body](cgt::torch::Inputs in) { return body(in); }, std::move(options)));
}

/// Equal values: exactly for integers and bools; floating point within `tolerance` (cuBLAS and
/// cuDNN may choose another algorithm inside a capture).
bool same_values(const at::Tensor& got, const at::Tensor& want, double tolerance) {
  if (got.numel() == 0) return true;
  const at::Tensor a = got.detach().cpu();
  const at::Tensor b = want.detach().cpu();
  if (at::isFloatingType(a.scalar_type()) || at::isComplexType(a.scalar_type())) {
    return at::allclose(a, b, tolerance, tolerance, /*equal_nan=*/true);
  }
  return at::equal(a, b);
}

/// Why `got` (a pool call's output) is not what eager execution returned (`want`); empty when it
/// is. `strides`: compare the layout too (a copy made by take() has its own).
std::string difference(const at::Tensor& got, const at::Tensor& want, double tolerance, bool strides = true) {
  std::ostringstream why;
  if (got.defined() != want.defined()) {
    why << "defined: " << got.defined() << ", eager: " << want.defined();
  } else if (!got.defined()) {
    return {};
  } else if (got.device() != want.device()) {
    why << "device " << got.device() << ", eager " << want.device();
  } else if (got.scalar_type() != want.scalar_type()) {
    why << "type " << got.scalar_type() << ", eager " << want.scalar_type();
  } else if (got.sizes() != want.sizes()) {
    why << "sizes " << got.sizes() << ", eager " << want.sizes();
  } else if (strides && got.strides() != want.strides()) {
    why << "strides " << got.strides() << ", eager " << want.strides();
  } else if (got.requires_grad() != want.requires_grad()) {
    why << "requires_grad " << got.requires_grad() << ", eager " << want.requires_grad();
  } else if (!same_values(got, want, tolerance)) {
    why << "values differ: " << got.detach().cpu().flatten().slice(0, 0, 8) << " eager "
        << want.detach().cpu().flatten().slice(0, 0, 8);
  }
  return why.str();
}

/// Every output of `out` (and a copy of it, take()) against `want`, eager's outputs.
void expect_like_eager(const cgt::torch::Outputs& out, const Values& want, double tolerance = 1e-5) {
  REQUIRE(out.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO("output " << i << " of a " << cgt::to_string(out.kind()));
    const at::Tensor& got = must(out.get(i)).get();
    CHECK(difference(got, want[i], tolerance) == "");
    CHECK(difference(must(out.take(i)), want[i], tolerance, /*strides=*/false) == "");
  }
}

/// Calls `f` once per step, `steps` times, with `inputs(step)`, and compares every output with
/// `body` run eagerly on the same inputs. Returns what each call did.
std::vector<K> run_steps(cgt::torch::Pool& pool, cgt::torch::Function& f, const Body& body, const MakeInputs& inputs,
                         int steps, double tolerance = 1e-5, const ExtraCheck& extra = {}) {
  std::vector<K> kinds;
  for (int step = 0; step < steps; ++step) {
    const Tensors in = inputs(step);
    const std::vector<cgt::torch::Arg> args(in.begin(), in.end());
    pool.mark_step_begin();
    auto out = must(f(args));
    kinds.push_back(out.kind());
    const Values want = body(in);
    INFO("step " << step);
    expect_like_eager(out, want, tolerance);
    if (extra) extra(out, want);
  }
  return kinds;
}

/// The error a result holds, if any (reading `error()` of a value would be undefined).
template <class T>
std::optional<cgt::Errc> error_of(const cgt::Result<T>& result) {
  if (result) return std::nullopt;
  return result.error().code;
}

const std::vector<K> warm_record_replays{K::warmup, K::recording, K::replay, K::replay, K::replay};

}  // namespace

#define REQUIRE_GPU() scenario::skip_unless_available<H>()

// ---- inputs -----------------------------------------------------------------------------------

// A channels_last input is copied into a slot of its own layout (by copy_, not by the graph's
// copy node), so the function, and its outputs' strides, see what eager execution sees.
TEST_CASE("torch/layouts: channels_last inputs replay with new values and eager's strides", "[gpu]") {
  REQUIRE_GPU();
  auto pool = new_pool();
  const Body body = [](const Tensors& in) {
    const at::Tensor scaled = in[0] * 2 + in[1];  // in[1]: one value per channel, broadcast
    return Values{scaled, scaled.sum({2, 3}), at::relu(in[0]).mean(1, true), scaled.permute({0, 2, 3, 1})};
  };
  auto f = add(pool, body, {.name = "nhwc"});
  const auto kinds = run_steps(
      pool, f, body,
      [](int) {
        return Tensors{at::randn({2, 3, 4, 5}, cuda()).contiguous(at::MemoryFormat::ChannelsLast),
                       at::randn({1, 3, 1, 1}, cuda())};
      },
      5);
  CHECK(kinds == warm_record_replays);
  CHECK(pool.roots().at(0).copied_inputs() == std::vector<std::size_t>{0, 1});
}

TEST_CASE("torch/layouts: a channels_last convolution (cuDNN) replays like eager", "[gpu]") {
  REQUIRE_GPU();
  const torch::NoGradGuard no_grad;
  auto pool = new_pool();
  const at::Tensor weight = at::randn({8, 3, 3, 3}, cuda()).contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor bias = at::randn({8}, cuda());
  const Body body = [weight, bias](const Tensors& in) {
    return Values{at::relu(at::conv2d(in[0], weight, bias, {1, 1}, {1, 1}))};
  };
  auto f = add(pool, body, {.name = "conv_nhwc"});
  const auto kinds = run_steps(
      pool, f, body,
      [](int) { return Tensors{at::randn({2, 3, 8, 8}, cuda()).contiguous(at::MemoryFormat::ChannelsLast)}; }, 5, 1e-3);
  CHECK(kinds == warm_record_replays);
}

// Broadcast inputs (stride 0) are copied once per distinct element into a slot that keeps the
// broadcast; returned as they are, they come back with eager's strides. The same sizes without
// the broadcast are another shape key: never read through the broadcast graph.
TEST_CASE("torch/layouts: expanded (stride-0) inputs, and the same sizes without the broadcast", "[gpu]") {
  REQUIRE_GPU();
  auto pool = new_pool();
  const Body body = [](const Tensors& in) {
    return Values{in[0] + in[1] * in[2] - in[3], in[0], in[1].sum(0), in[2] * 1, in[1].t()};
  };
  auto f = add(pool, body, {.name = "broadcast"});
  const auto kinds = run_steps(
      pool, f, body,
      [](int step) {
        at::Tensor row = at::randn({1, 16}, cuda()).expand({8, 16});  // strides [0, 1]
        if (step == 5) row = row.contiguous();                        // strides [16, 1]: a new key
        return Tensors{row, at::randn({8, 1}, cuda()).expand({8, 16}),
                       at::scalar_tensor(step + 0.5, cuda()).expand({8, 16}),  // strides [0, 0]
                       at::randn({8, 16}, cuda())};
      },
      7);
  CHECK(kinds == std::vector{K::warmup, K::recording, K::replay, K::replay, K::replay, K::warmup, K::replay});
}

// Inputs at a storage offset, with gaps between their elements, and transposed: copied with their
// layout, whatever their offset (a slot starts at 0).
TEST_CASE("torch/layouts: inputs at an offset, with gaps, and transposed", "[gpu]") {
  REQUIRE_GPU();
  auto pool = new_pool();
  const Body body = [](const Tensors& in) {
    return Values{in[0] * in[1] + in[2] - in[3], in[1] * 3, in[2].exp(), in[3].cumsum(1), in[2].t(), in[0]};
  };
  auto f = add(pool, body, {.name = "strided"});
  const auto kinds = run_steps(
      pool, f, body,
      [](int) {
        return Tensors{at::randn({16, 16}, cuda()).narrow(0, 3, 8),    // contiguous, offset 48
                       at::randn({8, 32}, cuda()).slice(1, 0, 32, 2),  // every second column
                       at::randn({16, 8}, cuda()).t(),                 // strides [1, 8]
                       at::randn({8, 40}, cuda()).narrow(1, 5, 16)};   // rows 40 apart, offset 5
      },
      5);
  CHECK(kinds == warm_record_replays);
  CHECK(pool.roots().at(0).copied_inputs() == std::vector<std::size_t>{0, 1, 2, 3});
}

// The caller passes the same tensors every time (same addresses, same views) and changes their
// values in place between calls: every replay must copy them again.
TEST_CASE("torch/layouts: the same input views, their values changed in place between replays", "[gpu]") {
  REQUIRE_GPU();
  auto pool = new_pool();
  const Body body = [](const Tensors& in) { return Values{in[0] * 2 + in[1], in[2] - in[0]}; };
  auto f = add(pool, body, {.name = "same_views"});
  const at::Tensor wide = at::randn({8, 32}, cuda());
  const at::Tensor gapped = wide.slice(1, 1, 32, 2);    // copied by copy_
  const at::Tensor dense = at::randn({8, 16}, cuda());  // copied by the graph's copy node
  const at::Tensor flipped = at::randn({16, 8}, cuda()).t();
  const auto kinds = run_steps(
      pool, f, body,
      [&](int) {
        wide.normal_();
        dense.normal_();
        flipped.normal_();
        return Tensors{gapped, dense, flipped};
      },
      6);
  CHECK(kinds == std::vector{K::warmup, K::recording, K::replay, K::replay, K::replay, K::replay});
}

// A tensor without elements and tensors without dimensions, as inputs and outputs. A 0-dim CPU
// tensor (libtorch lets one meet CUDA tensors) is not device memory: the call runs eagerly.
TEST_CASE("torch/layouts: inputs with no elements and with no dimensions", "[gpu]") {
  REQUIRE_GPU();
  auto pool = new_pool();
  SECTION("CUDA tensors: recorded and replayed") {
    const Body body = [](const Tensors& in) {
      return Values{in[0] * 2, in[0].sum(0), in[2] * in[1], in[1] + 1, in[0].t(), in[1]};
    };
    auto f = add(pool, body, {.name = "empty_and_scalar"});
    const auto kinds = run_steps(
        pool, f, body,
        [](int step) {
          return Tensors{at::randn({0, 16}, cuda()), at::scalar_tensor(step + 0.25, cuda()), at::randn({16}, cuda())};
        },
        5);
    CHECK(kinds == warm_record_replays);
  }
  SECTION("a 0-dim CPU tensor runs eagerly") {
    const Body body = [](const Tensors& in) { return Values{in[0] * in[1]}; };
    auto f = add(pool, body, {.name = "cpu_scalar"});
    const auto kinds = run_steps(
        pool, f, body, [](int step) { return Tensors{at::randn({16}, cuda()), at::scalar_tensor(step + 1.5)}; }, 3);
    CHECK(kinds == std::vector<K>(3, K::eager));
    CHECK(pool.stats().count(cgt::Reason::input_on_other_device) == 3);
  }
}

// One tensor passed twice, two views that overlap, a view whose elements overlap each other, and
// overlapping views of a pool output (used in place, not copied).
TEST_CASE("torch/layouts: inputs that alias each other or themselves", "[gpu]") {
  REQUIRE_GPU();
  auto pool = new_pool();
  const Body pair = [](const Tensors& in) { return Values{in[0] + in[1] * 2, in[0] - in[1], in[1]}; };
  SECTION("the same tensor twice") {
    auto f = add(pool, pair, {.name = "twice_the_same"});
    const auto kinds = run_steps(
        pool, f, pair,
        [](int) {
          const at::Tensor x = at::randn({8, 16}, cuda());
          return Tensors{x, x};
        },
        5);
    CHECK(kinds == warm_record_replays);
  }
  SECTION("two overlapping views of one storage") {
    auto f = add(pool, pair, {.name = "overlapping_views"});
    const auto kinds = run_steps(
        pool, f, pair,
        [](int) {
          const at::Tensor big = at::randn({12, 16}, cuda());
          return Tensors{big.narrow(0, 0, 8), big.narrow(0, 4, 8)};
        },
        5);
    CHECK(kinds == warm_record_replays);
  }
  SECTION("a view whose rows overlap (as_strided)") {
    const Body rows = [](const Tensors& in) { return Values{in[0] * 2, in[0].sum(1), in[0]}; };
    auto f = add(pool, rows, {.name = "self_overlapping"});
    const auto kinds =
        run_steps(pool, f, rows, [](int) { return Tensors{at::randn({16}, cuda()).as_strided({4, 8}, {2, 1})}; }, 5);
    CHECK(kinds == warm_record_replays);
  }
  SECTION("overlapping views of a pool output") {
    auto producer = add(pool, [](const Tensors& in) { return Values{in[0] * 3}; }, {.name = "producer"});
    auto consumer = add(pool, pair, {.name = "consumer"});
    std::vector<K> kinds;
    for (int step = 0; step < 5; ++step) {
      const at::Tensor x = at::randn({12, 16}, cuda());
      pool.mark_step_begin();
      auto produced = must(producer({x}));
      const at::Tensor& y = must(produced.get(0)).get();
      const at::Tensor top = y.narrow(0, 0, 8);
      const at::Tensor bottom = y.narrow(0, 4, 8);
      auto out = must(consumer({top, bottom}));
      kinds.push_back(out.kind());
      INFO("step " << step);
      CHECK(at::equal(y, x * 3));
      expect_like_eager(out, pair({top, bottom}));
    }
    CHECK(kinds == warm_record_replays);
  }
}

// Strides are part of the shape key: a matrix and its transpose never replay each other's graph,
// whatever order they come in.
TEST_CASE("torch/layouts: an input's layout changes between calls at the same sizes", "[gpu]") {
  REQUIRE_GPU();
  auto pool = new_pool();
  const Body body = [](const Tensors& in) { return Values{in[0].cumsum(1), in[0] + 0, in[0].select(0, 1)}; };
  auto f = add(pool, body, {.name = "layouts"});
  const std::vector<bool> transposed{false, false, true, true, false, true, false, true};
  const auto kinds = run_steps(
      pool, f, body,
      [&transposed](int step) {
        const at::Tensor base = at::randn({8, 8}, cuda());
        return Tensors{transposed[static_cast<std::size_t>(step)] ? base.t() : base};
      },
      static_cast<int>(transposed.size()));
  CHECK(kinds ==
        std::vector{K::warmup, K::recording, K::warmup, K::recording, K::replay, K::replay, K::replay, K::replay});
  CHECK(pool.stats().recordings == 2);
}

// Another element type at the same shape is refused (wrong_input_type), as an undefined tensor
// and a scalar where a tensor was are; the pool goes on with the first type.
TEST_CASE("torch/layouts: another element type, an undefined tensor, a scalar: refused, never a wrong value", "[gpu]") {
  REQUIRE_GPU();
  auto pool = new_pool();
  const Body body = [](const Tensors& in) { return Values{in[0] * 2 + 1}; };
  auto f = add(pool, body, {.name = "typed"});
  const at::Tensor x = at::randn({4, 8}, cuda());
  (void)must(f({x}));  // warm-up
  pool.mark_step_begin();
  auto as_double = f({x.to(at::kDouble)});
  REQUIRE(!as_double);
  INFO(as_double.error().message);
  CHECK(as_double.error().code == cgt::Errc::wrong_input_type);
  CHECK(as_double.error().message.find("Double") != std::string::npos);
  auto undefined = f({at::Tensor()});
  REQUIRE(!undefined);
  CHECK(undefined.error().code == cgt::Errc::invalid_argument);
  auto scalar = f({std::int64_t{3}});
  REQUIRE(!scalar);
  CHECK(scalar.error().code == cgt::Errc::wrong_input_type);
  for (int step = 0; step < 3; ++step) {
    const at::Tensor input = at::randn({4, 8}, cuda());
    pool.mark_step_begin();
    auto out = must(f({input}));
    CHECK(out.kind() == (step == 0 ? K::recording : K::replay));
    expect_like_eager(out, body({input}));
  }
}

// Integer and bool inputs (indices, a mask) through the graph's copy nodes (1- and 4-byte
// elements), a static float table, and integer and bool outputs.
TEST_CASE("torch/layouts: integer and bool inputs and outputs", "[gpu]") {
  REQUIRE_GPU();
  auto pool = new_pool();
  const Body body = [](const Tensors& in) {
    return Values{at::where(in[1], in[2].index_select(0, in[0]), in[3].to(at::kFloat)), in[1].logical_not(),
                  in[0] * 2 + in[3], in[1].sum(), in[3].to(at::kBool)};
  };
  auto f = add(pool, body, {.name = "integers", .static_inputs = {2}});
  const at::Tensor table = at::randn({32}, cuda());
  const auto kinds = run_steps(
      pool, f, body,
      [&table](int) {
        return Tensors{at::randint(0, 32, {8}, cuda(at::kLong)), at::rand({8}, cuda()) < 0.5, table,
                       at::randint(-5, 5, {8}, cuda(at::kInt))};
      },
      6);
  CHECK(kinds == std::vector{K::warmup, K::recording, K::replay, K::replay, K::replay, K::replay});
  CHECK(pool.roots().at(0).copied_inputs() == std::vector<std::size_t>{0, 1, 3});
}

// Lazily conjugated and negated views (`z.conj()`, `at::_neg_view`): contiguous, but their bytes are
// not their values. A graph's copy node copied the bytes, so the function saw z instead of its
// conjugate (at the recording, whose first run the copy node makes, and at every replay); copy_
// applies the bit. The bits are part of the shape key: views, then plain tensors of the same
// sizes, each warm up and record a graph of their own.
TEST_CASE("torch/layouts: conjugate and negative views as inputs", "[gpu]") {
  REQUIRE_GPU();
  auto pool = new_pool();
  const Body body = [](const Tensors& in) {
    return Values{in[0] * 2, at::real(in[0]) + at::imag(in[0]), in[1] + 1, in[1]};
  };
  auto f = add(pool, body, {.name = "conjugates"});
  const auto kinds = run_steps(
      pool, f, body,
      [&](int step) {
        const bool views = step < 3;
        const at::Tensor z = at::randn({8, 4}, cuda(at::kComplexFloat));
        const at::Tensor r = at::randn({8, 4}, cuda());
        return Tensors{views ? z.conj() : z, views ? at::_neg_view(r) : r};
      },
      6);
  CHECK(kinds == std::vector{K::warmup, K::recording, K::replay, K::warmup, K::recording, K::replay});
  CHECK(pool.roots().at(0).copied_inputs() == std::vector<std::size_t>{0, 1});
}

// A static input is read in place, as its bytes were when recorded. Its lazy conjugate (or negated
// view) has the same address and sizes: it must not replay the graph recorded for the plain
// tensor, which would hand back the function of z for the function of conj(z).
TEST_CASE("torch/layouts: a static input's conjugate at the same address is another input", "[gpu]") {
  REQUIRE_GPU();
  auto pool = new_pool();
  const Body body = [](const Tensors& in) { return Values{in[0] * 2 + 1, at::imag(in[0]), in[1] * 3}; };
  auto f = add(pool, body, {.name = "static_conjugates", .static_inputs = {0, 1}});
  const at::Tensor z = at::randn({8, 4}, cuda(at::kComplexFloat));
  const at::Tensor r = at::randn({8, 4}, cuda());
  const auto kinds = run_steps(
      pool, f, body,
      [&](int step) {
        const bool views = step % 4 >= 2;  // plain, plain, views, views, plain, plain, views, views
        return Tensors{views ? z.conj() : z, views ? at::_neg_view(r) : r};
      },
      8);
  CHECK(kinds ==
        std::vector{K::warmup, K::recording, K::warmup, K::recording, K::replay, K::replay, K::replay, K::replay});
}

// ---- outputs ----------------------------------------------------------------------------------

// Outputs that are inputs or views of them: a copied input comes back as (a view of) its slot,
// holding this call's values; a static input (a parameter, changed in place between calls) as
// the parameter itself.
TEST_CASE("torch/layouts: outputs that are inputs, views of inputs, or a parameter", "[gpu]") {
  REQUIRE_GPU();
  auto pool = new_pool();
  const Body body = [](const Tensors& in) {
    return Values{in[0],     in[0].t(), in[0].narrow(0, 1, 2), in[1],
                  in[1].t(), in[1][2],  in[0] * in[1].sum(),   in[0].expand({3, 4, 8})};
  };
  auto f = add(pool, body, {.name = "pass_through", .static_inputs = {1}});
  const at::Tensor weight = at::randn({4, 8}, cuda());
  const auto kinds = run_steps(
      pool, f, body,
      [&weight](int) {
        weight.add_(1);  // in place: the graph reads it where it is
        return Tensors{at::randn({4, 8}, cuda()), weight};
      },
      6, 1e-5,
      [&weight](const cgt::torch::Outputs& out, const Values&) {
        CHECK(must(out.get(3)).get().data_ptr() == weight.data_ptr());
        CHECK(must(out.get(4)).get().data_ptr() == weight.data_ptr());
      });
  CHECK(kinds == std::vector{K::warmup, K::recording, K::replay, K::replay, K::replay, K::replay});
  CHECK(pool.roots().at(0).copied_inputs() == std::vector<std::size_t>{0});
}

namespace {

// Outputs that view one storage must view one storage, at eager's distances, after every call.
void expect_same_aliasing(const cgt::torch::Outputs& out, const Values& want) {
  const at::Tensor& first = must(out.get(0)).get();
  for (std::size_t i = 1; i < want.size(); ++i) {
    const at::Tensor& got = must(out.get(i)).get();
    if (!got.defined() || !want[i].defined() || want[i].numel() == 0) continue;
    const bool eager_shares = want[i].storage().is_alias_of(want[0].storage());
    INFO("output " << i);
    CHECK((got.storage().data_ptr().get() == first.storage().data_ptr().get()) == eager_shares);
    CHECK(got.storage_offset() == want[i].storage_offset());
    if (eager_shares) {
      CHECK(static_cast<const char*>(got.data_ptr()) - static_cast<const char*>(first.data_ptr()) ==
            static_cast<const char*>(want[i].data_ptr()) - static_cast<const char*>(want[0].data_ptr()));
    }
  }
}

}  // namespace

// Several outputs over one storage (the tensor, its transpose, two slices, a row, a broadcast):
// after each replay they still share it, each at its offset, and a write through one shows in
// the others.
TEST_CASE("torch/layouts: outputs that view one storage", "[gpu]") {
  REQUIRE_GPU();
  auto pool = new_pool();
  const Body body = [](const Tensors& in) {
    const at::Tensor y = in[0] * 2 + 1;
    return Values{y, y.t(), y.narrow(0, 0, 4), y.narrow(0, 4, 4), y[3], y[5].expand({2, 8})};
  };
  auto f = add(pool, body, {.name = "aliases"});
  const auto kinds = run_steps(
      pool, f, body, [](int) { return Tensors{at::randn({8, 8}, cuda())}; }, 6, 1e-5,
      [](const cgt::torch::Outputs& out, const Values& want) {
        expect_same_aliasing(out, want);
        const at::Tensor& y = must(out.get(0)).get();
        y.fill_(7);  // the caller's while it holds the lease
        CHECK(at::equal(must(out.get(1)).get(), at::full({8, 8}, 7, cuda())));
        CHECK(at::equal(must(out.get(3)).get(), at::full({4, 8}, 7, cuda())));
      });
  CHECK(kinds == std::vector{K::warmup, K::recording, K::replay, K::replay, K::replay, K::replay});
}

// The odd outputs: a broadcast view of a pool tensor, no elements (a view of pool memory, and a
// tensor without memory), no dimensions, undefined, at an offset, transposed, a strided column,
// the same bytes as another element type.
TEST_CASE("torch/layouts: broadcast, empty, 0-dim, undefined, offset and transposed outputs", "[gpu]") {
  REQUIRE_GPU();
  auto pool = new_pool();
  const Body body = [](const Tensors& in) {
    const at::Tensor y = in[0] * 3;
    const at::Tensor row = in[0].sum(0, /*keepdim=*/true);
    return Values{row.expand({8, 16}),
                  y.narrow(0, 0, 0),
                  at::empty({0, 16}, in[0].options()),
                  y.sum(),
                  at::Tensor(),
                  y.narrow(0, 2, 3),
                  y.t(),
                  y.select(1, 5),
                  row.squeeze(0)[4],
                  y.view(at::kInt)};
  };
  auto f = add(pool, body, {.name = "odd_outputs"});
  const auto kinds = run_steps(
      pool, f, body, [](int) { return Tensors{at::randn({8, 16}, cuda())}; }, 6, 1e-5,
      [](const cgt::torch::Outputs& out, const Values& want) {
        for (const std::size_t i : {5, 7, 8}) {
          INFO("output " << i);
          CHECK(must(out.get(i)).get().storage_offset() == want[i].storage_offset());
        }
        CHECK(!must(out.take(4)).defined());
      });
  CHECK(kinds == std::vector{K::warmup, K::recording, K::replay, K::replay, K::replay, K::replay});
}

// Outputs that are lazily conjugated or negated views of pool tensors: a replay rebuilds each
// output over its storage from the recorded layout, and lost the bit (z instead of its conjugate,
// the imaginary part with the wrong sign); so did a copy made by copy_out_on_new_step.
TEST_CASE("torch/layouts: conjugate and negative views as outputs", "[gpu]") {
  REQUIRE_GPU();
  const Body body = [](const Tensors& in) {
    const at::Tensor z = in[0] * 2;
    const at::Tensor r = in[1] + 1;
    return Values{z.conj(), at::imag(z.conj()), at::_neg_view(r), z.conj().t(), z, r};
  };
  const MakeInputs inputs = [](int) {
    return Tensors{at::randn({8, 4}, cuda(at::kComplexFloat)), at::randn({8, 4}, cuda())};
  };
  SECTION("replayed") {
    auto pool = new_pool();
    auto f = add(pool, body, {.name = "conjugate_outputs"});
    const auto kinds = run_steps(pool, f, body, inputs, 5);
    CHECK(kinds == warm_record_replays);
  }
  SECTION("kept over a new step, copied out") {
    cgt::Options options;
    options.copy_out_on_new_step = true;
    auto pool = new_pool(std::move(options));
    auto f = add(pool, body, {.name = "conjugate_outputs_copied"});
    std::optional<cgt::torch::Outputs> previous;
    Values previous_want;
    for (int step = 0; step < 5; ++step) {
      INFO("step " << step);
      const Tensors in = inputs(step);
      pool.mark_step_begin();
      auto out = must(f({in[0], in[1]}));
      const Values want = body(in);
      expect_like_eager(out, want);
      if (previous) {
        INFO("the outputs of the step before, copied out");
        expect_like_eager(*previous, previous_want);
      }
      previous = std::move(out);
      previous_want = want;
    }
  }
}

// ---- leases -----------------------------------------------------------------------------------

// The same function twice in one step: the second call is a child in the tree, whose graph may
// reuse the memory of the first call's outputs only if they were dead when it was recorded. The
// caller drops the first call's output 0 before the second call in some steps (keeping output 1,
// so that the path goes on) and keeps it in others: the second call gets a graph of its own for
// each pattern, and never overwrites an output the caller holds.
TEST_CASE("torch/layouts: an output held while its function runs again in the same step keeps its values", "[gpu]") {
  REQUIRE_GPU();
  auto pool = new_pool();
  const Body body = [](const Tensors& in) { return Values{in[0] * 2 + 1, in[0].t() * 3}; };
  auto f = add(pool, body, {.name = "again"});
  const std::vector<bool> hold{true, false, true, false, true, true};
  std::vector<K> first_kinds;
  std::vector<K> second_kinds;
  for (std::size_t step = 0; step < hold.size(); ++step) {
    INFO("step " << step << (hold[step] ? ", first outputs held" : ", first call's output 0 dropped"));
    const at::Tensor x1 = at::randn({16, 16}, cuda());
    const at::Tensor x2 = at::randn({16, 16}, cuda());
    pool.mark_step_begin();
    auto first = must(f({x1}));
    first_kinds.push_back(first.kind());
    const Values want_first = body({x1});
    expect_like_eager(first, want_first);
    if (!hold[step]) (void)first.release(0);  // dropped at once
    auto second = must(f({x2}));
    second_kinds.push_back(second.kind());
    expect_like_eager(second, body({x2}));
    // What the caller still holds of the first call is not overwritten by the second.
    for (std::size_t i = hold[step] ? 0 : 1; i < want_first.size(); ++i) {
      INFO("the first call's output " << i << ", after the second call");
      CHECK(difference(must(first.get(i)).get(), want_first[i], 1e-5) == "");
    }
  }
  CHECK(first_kinds == std::vector{K::warmup, K::recording, K::replay, K::replay, K::replay, K::replay});
  // Step 2 keeps what step 1's child graph was allowed to reuse: it records a graph of its own.
  CHECK(second_kinds == std::vector{K::warmup, K::recording, K::recording, K::replay, K::replay, K::replay});
  CHECK(pool.stats().recordings == 3);  // the root, and a child for each pattern
}

// Leases kept past a new step: reclaimed (output_overwritten, escaped copies poisoned), or, with
// copy_out_on_new_step, copied out with their layouts; take()n copies are the caller's for good.
TEST_CASE("torch/layouts: outputs kept over new steps", "[gpu]") {
  REQUIRE_GPU();
  const Body body = [](const Tensors& in) {
    const at::Tensor y = in[0] * 2 - 1;
    return Values{y, y.t(), y.narrow(0, 2, 3), in[0].sum(0, true).expand({8, 16}), y.sum()};
  };
  SECTION("reclaimed, and take()n copies survive") {
    auto pool = new_pool();
    auto f = add(pool, body, {.name = "kept"});
    std::vector<at::Tensor> taken;
    std::vector<Values> wanted;
    std::optional<cgt::torch::Outputs> previous;
    at::Tensor escaped;
    for (int step = 0; step < 6; ++step) {
      INFO("step " << step);
      const at::Tensor x = at::randn({8, 16}, cuda());
      pool.mark_step_begin();
      auto out = must(f({x}));
      if (step > 0) {
        CHECK(error_of(previous->get(0)) == cgt::Errc::output_overwritten);
        CHECK(error_of(previous->get(1)) == cgt::Errc::output_overwritten);
        CHECK_THROWS_AS(escaped.sum(), c10::Error);
      }
      wanted.push_back(body({x}));
      expect_like_eager(out, wanted.back());
      taken.push_back(must(out.take(1)));
      escaped = must(out.get(2)).get();
      previous = std::move(out);
      for (std::size_t t = 0; t < taken.size(); ++t) {
        INFO("copy taken at step " << t);
        CHECK(difference(taken[t], wanted[t][1], 1e-5, false) == "");
      }
    }
  }
  SECTION("copied out") {
    cgt::Options options;
    options.copy_out_on_new_step = true;
    auto pool = new_pool(std::move(options));
    auto f = add(pool, body, {.name = "copied_out"});
    std::optional<cgt::torch::Outputs> previous;
    Values previous_want;
    std::vector<K> kinds;
    for (int step = 0; step < 6; ++step) {
      INFO("step " << step);
      const at::Tensor x = at::randn({8, 16}, cuda());
      pool.mark_step_begin();
      auto out = must(f({x}));
      kinds.push_back(out.kind());
      const Values want = body({x});
      expect_like_eager(out, want);
      if (step > 0) {
        INFO("the outputs of the step before");
        expect_like_eager(*previous, previous_want);
      }
      previous = std::move(out);
      previous_want = want;
    }
    CHECK(kinds == std::vector{K::warmup, K::recording, K::replay, K::replay, K::replay, K::replay});
    CHECK(pool.stats().leases_copied_out >= 5);
  }
}

// A borrowed output is a `const at::Tensor&`, yet libtorch's in-place metadata methods are const:
// a caller may transpose, unsqueeze, resize, restride it or make it require grad. The next replay
// must still return what the function returns, not the changed tensor.
TEST_CASE("torch/layouts: in-place metadata changes of a replay's output do not reach the next replay", "[gpu]") {
  REQUIRE_GPU();
  auto pool = new_pool();
  const Body body = [](const Tensors& in) { return Values{in[0] * 2, (in[0] + 1).t()}; };
  auto f = add(pool, body, {.name = "reshaped_by_caller"});
  std::vector<K> kinds;
  for (int step = 0; step < 7; ++step) {
    INFO("step " << step);
    const at::Tensor x = at::randn({8, 16}, cuda());
    pool.mark_step_begin();
    auto out = must(f({x}));
    kinds.push_back(out.kind());
    expect_like_eager(out, body({x}));
    const at::Tensor& doubled = must(out.get(0)).get();
    const at::Tensor& flipped = must(out.get(1)).get();
    switch (step % 4) {
      case 0:
        doubled.unsqueeze_(0);
        flipped.t_();
        break;
      case 1:
        doubled.resize_({2, 8});
        flipped.as_strided_({4, 4}, {1, 4});
        break;
      case 2: doubled.requires_grad_(true); break;
      default: doubled.squeeze_().transpose_(0, 1); break;
    }
    // `out` dies here, before the next step: its storages are not reclaimed, only dead.
  }
  CHECK(kinds == std::vector{K::warmup, K::recording, K::replay, K::replay, K::replay, K::replay, K::replay});
}
