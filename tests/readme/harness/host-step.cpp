// Harness of the README's host fragments: what they use but do not show (an input `x`, a
// `report` for errors), and a function around their statements.
#include <cstddef>
#include <iostream>

// @imports@

namespace {
[[maybe_unused]] int report(const cgt::Error& error) {
  std::cerr << error.describe() << '\n';
  return 1;
}
}  // namespace

[[maybe_unused]] int readme_fragment() {
  auto made = cgt::host::Buffer::make(cgt::ElementType::f32, {4});
  if (!made) return report(made.error());
  [[maybe_unused]] const cgt::host::Buffer& x = *made;
  // @fragment@
  return 0;
}
