// Uses the installed modules: one function, warmed up, recorded and replayed.
#include <cstddef>
#include <cstdio>
#include <string_view>

import cgt;
import cgt.host;

int main() {
  auto pool = cgt::host::make_pool();
  if (!pool) return 1;
  auto twice = pool->add_function([](cgt::host::Context& ctx, cgt::host::Inputs in) {
    cgt::host::Buffer y = ctx.allocate_like(in[0]);
    ctx.launch([x = in[0], y] {
      for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, 2 * x.get(i));
    });
    return cgt::host::Values{y};
  });
  if (!twice) return 2;
  const auto made = cgt::host::Buffer::make(cgt::host::ElementType::f32, {4});
  if (!made) return 5;
  const cgt::host::Buffer& x = *made;
  x.fill(21);
  for (int step = 0; step < 3; ++step) {
    pool->mark_step_begin();
    auto out = (*twice)({x});
    if (!out || (*out->get(0)).get().get(3) != 42) return 3;
    const std::string_view kind = cgt::to_string(out->kind());
    std::printf("%.*s ", static_cast<int>(kind.size()), kind.data());
  }
  std::printf("\n");
  return pool->stats().replays == 1 ? 0 : 4;
}
