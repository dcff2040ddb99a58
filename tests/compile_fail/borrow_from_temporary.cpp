// Must NOT compile: every line marked `expect-error` borrows a value from a temporary that dies at
// the end of the statement (the handle holding the value goes, and the reference dangles).
// tests/compile_fail/run.cmake checks that the compiler rejects exactly the marked lines, with the
// deleted-borrow diagnostic; borrow_from_named.cpp is the same program with the results named,
// which must compile, so this test cannot pass because the file is broken in some other way.
#include <cstdint>
#include <utility>

import cgt;
import cgt.host;

float borrow(cgt::host::Pool& pool, cgt::host::Function& f, const cgt::host::Buffer& x) {
  const cgt::host::Buffer& a = *f({x})->get(0);                                     // expect-error
  const cgt::host::Buffer& b = *(*f({x})).get(0);                                   // expect-error
  const cgt::host::Buffer& c = *f({x}).value().get(0);                              // expect-error
  const cgt::host::Buffer& d = *f({x})->release(0)->get();                          // expect-error
  const cgt::host::Buffer& e = *(*f({x})->release(0)).get();                        // expect-error
  const cgt::host::Buffer& g = *cgt::host::OutputLease(*f({x})->release(0)).get();  // expect-error
  auto arena = std::move(pool).device();                                            // expect-error
  return a.f32()[0] + b.f32()[0] + c.f32()[0] + d.f32()[0] + e.f32()[0] + g.f32()[0] +
         static_cast<float>(arena.has_value());
}
