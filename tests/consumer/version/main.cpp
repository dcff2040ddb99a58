// The version `import cgt;` reports is the one find_package accepted (cgtConfigVersion.cmake).
#include <cstdio>
#include <string_view>

import cgt;

static_assert(cgt::version == cgt::Version{PACKAGE_MAJOR, PACKAGE_MINOR, PACKAGE_PATCH});
// Ordered by number, major first: 0.10 comes after 0.9, and any 0.x before 1.0.
static_assert(cgt::Version{0, 9, 3} < cgt::Version{0, 10, 0} && cgt::version < cgt::Version{PACKAGE_MAJOR + 1, 0, 0});

int main() {
  std::printf("cgt %.*s\n", static_cast<int>(cgt::version_string.size()), cgt::version_string.data());
  return cgt::version_string == std::string_view(PACKAGE_VERSION) ? 0 : 1;
}
