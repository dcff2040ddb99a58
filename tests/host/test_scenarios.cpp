// The shared scenario suite on the host backend: every scenario of scenario/register.hpp, named
// as it is (ctest adds "host/") and tagged [host].
#include "host/harness.hpp"
#include "scenario/register.hpp"

namespace {
const bool registered = scenario::register_scenarios<HostHarness>("", "[host]");
}  // namespace
