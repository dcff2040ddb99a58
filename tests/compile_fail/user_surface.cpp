// Must compile: with only `import cgt;` and a backend module, a program names every type and
// function of the user's surface, and finds the operators and `to_string` overloads by ADL.
// (`backend_names_hidden.cpp` checks the other side: what is not for users is not there.)
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "../device_surface.hpp"

import cgt;
import cgt.host;

namespace {

// Every name cgt exports to users, named once (the backends' handles are these templates).
[[maybe_unused]] void names(cgt::host::Pool& pool) {
  [[maybe_unused]] cgt::Errc code = cgt::Errc::output_overwritten;
  [[maybe_unused]] cgt::Error error{.code = code, .message = "m"};
  [[maybe_unused]] const bool nested = error.cause == cgt::Cause::nested_pool;
  [[maybe_unused]] cgt::Result<int> result = cgt::fail(cgt::Errc::invalid_argument, "m");
  [[maybe_unused]] const bool ordered = cgt::version >= cgt::Version{0, 0, 0} && !cgt::version_string.empty();
  [[maybe_unused]] cgt::Options options{.on_static_input_moved = cgt::OnStaticInputMoved::error,
                                        .log_sink = [](const cgt::Event& event) {
                                          (void)(event.kind == cgt::EventKind::warning);
                                          (void)(event.reason == cgt::Reason::mutated_input);
                                        }};
  [[maybe_unused]] cgt::LogSink sink = options.log_sink;
  [[maybe_unused]] cgt::FunctionOptions function_options{.name = "f", .size_source = cgt::SizeSource{}};
  [[maybe_unused]] cgt::CallKind call = cgt::CallKind::replay;
  [[maybe_unused]] cgt::NodeKind node_kind = cgt::NodeKind::graph;
  [[maybe_unused]] cgt::NodeReason node_reason = cgt::NodeReason::first_call;
  [[maybe_unused]] cgt::Stats stats = pool.stats();
  [[maybe_unused]] cgt::MemoryInfo memory = pool.memory();
  [[maybe_unused]] std::vector<cgt::Block> blocks = pool.live_blocks();
  [[maybe_unused]] cgt::GraphCounts counts{};
  [[maybe_unused]] cgt::ElementType type = cgt::ElementType::f32;
  [[maybe_unused]] std::size_t bytes = cgt::element_size(type) * cgt::max_rank;
  [[maybe_unused]] const std::int64_t sizes[] = {2, 3};
  [[maybe_unused]] cgt::Layout layout = cgt::Layout::contiguous(type, sizes);
  [[maybe_unused]] cgt::PoolBase& base = pool;
  [[maybe_unused]] std::vector<cgt::Node> roots = pool.roots();
  [[maybe_unused]] cgt::PathIndex index{};
  using Owned = cgt::Owning<cgt::host::Outputs>;
  using Borrowed = cgt::Ref<cgt::host::Buffer>;
}

// The handle templates, over a backend a program never names (`cgt::host::Pool` is one of them).
template <class B>
[[maybe_unused]] void templates(cgt::Pool<B>& pool) {
  using Lease = cgt::OutputLease<B>;
  using Bundle = cgt::Outputs<B>;
  using Handle = cgt::Function<B>;
  using Argument = cgt::Arg<B>;
  static_assert(std::is_same_v<Lease, cgt::host::OutputLease> && std::is_same_v<Bundle, cgt::host::Outputs> &&
                std::is_same_v<Handle, cgt::host::Function> && std::is_same_v<Argument, cgt::host::Arg>);
}
[[maybe_unused]] void typed(cgt::host::Pool& pool) { templates(pool); }

// What the README and examples do, through `import cgt; import cgt.host;` alone.
[[maybe_unused]] int program() {
  auto pool = cgt::host::make_pool({.tree = {.debug_checks = true}});
  if (!pool) return 1;
  auto twice = pool->add_function(
      [](cgt::host::Context& ctx, cgt::host::Inputs in) {
        cgt::host::Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, 2 * x.get(i));
        });
        return cgt::host::Values{y};
      },
      {.name = "twice"});
  if (!twice) return 1;
  auto x = cgt::host::Buffer::make(cgt::host::ElementType::f32, {4});
  if (!x) return 1;
  pool->mark_step_begin();
  auto out = (*twice)({*x, 3});
  if (!out) return out.error().code == cgt::Errc::out_of_memory ? 2 : 3;
  const cgt::host::Buffer& y = *out->get(0);
  cgt::host::OutputLease lease = std::move(*out->release(0));
  [[maybe_unused]] auto again = (*twice)({std::move(lease)});
  // ADL: `to_string` and `==` are found from their arguments' types, unqualified.
  std::string line = std::string(to_string(out->kind())) + std::string(to_string(cgt::Errc::pool_shut_down)) +
                     std::string(to_string(cgt::Reason::rerecord_limit)) +
                     std::string(to_string(cgt::NodeReason::forced_warmup)) + std::string(to_string(y.type())) +
                     std::string(cgt::to_string(cgt::CallKind::eager)) + out.error().describe();
  const std::vector<cgt::Node> path = pool->current_path();
  const bool same = !path.empty() && path.front().expected_dead_before() == std::vector<cgt::PathIndex>{} &&
                    cgt::PathIndex{} == cgt::PathIndex{};
  cgt::host::Device& device = pool->device()->get();
  const bool mine = device.index() == 0 && device.contains(reinterpret_cast<std::uintptr_t>(y.storage()));
  return static_cast<int>(line.size()) + static_cast<int>(same) + static_cast<int>(device.arena().block_count()) +
         static_cast<int>(mine) + static_cast<int>(pool->to_dot().size()) + static_cast<int>(!pool->shutdown());
}

// The device a program reaches offers none of the engine's side (tests/device_surface.hpp).
static_assert(!cgt_test::offers_the_engine_side<cgt::host::Device>);
static_assert(requires(cgt::host::Device& d) {
  d.index();
  d.contains(0);
  d.arena();
  d.stream();
  d.recordings_redoing_another();
});
// It is a view of the pool's own device: a reference, never a copy a program could keep.
static_assert(!std::is_copy_constructible_v<cgt::host::Device> && !std::is_copy_assignable_v<cgt::host::Device>);
// Its memory is there to look at, not to change (the engine's); a device that handed out its arena
// would allow it.
struct HandsOutItsArena {
  cgt::host::Arena& arena();
};
static_assert(!cgt_test::allocates_through_its_arena<cgt::host::Device>);
static_assert(cgt_test::allocates_through_its_arena<HandsOutItsArena>);

}  // namespace
