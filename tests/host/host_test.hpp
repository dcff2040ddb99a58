// The host tests' preamble, in one place: Catch2, the shared scenarios, the host harness and its
// value helpers, and the names every host test uses unqualified. A test file includes this first,
// then what it alone needs.
#pragma once

#include <catch2/catch_test_macros.hpp>

#include "scenario/spec.hpp"

import cgt;
import cgt.host;

#include "host/harness.hpp"
#include "host/values.hpp"
#include "scenario/scenarios.hpp"

// NOLINTBEGIN(misc-unused-using-decls, google-global-names-in-headers): the tests' shared names
using cgt::host::Buffer;
using cgt::host::Context;
using cgt::host::Inputs;
using cgt::host::Values;
using host_test::output_values;
using host_test::poisoned_pool;
using host_test::repeat;
using host_test::values_of;
using scenario::must;
using K = cgt::CallKind;
// NOLINTEND(misc-unused-using-decls, google-global-names-in-headers)
