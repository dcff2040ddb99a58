// Must compile: borrow_from_temporary.cpp with every result named before it lends a value.
#include <cstdint>
#include <utility>

import cgt;
import cgt.host;

float borrow(cgt::host::Pool& pool, cgt::host::Function& f, const cgt::host::Buffer& x) {
  auto out = f({x});
  const cgt::host::Buffer& a = *out->get(0);
  const cgt::host::Buffer& b = *(*out).get(0);
  const cgt::host::Buffer& c = *out.value().get(0);
  auto released = out->release(0);
  const cgt::host::Buffer& d = *released->get();
  const cgt::host::Buffer& e = *(*released).get();
  const cgt::host::OutputLease lease(std::move(*released));
  const cgt::host::Buffer& g = *lease.get();
  auto device = pool.device();
  return a.f32()[0] + b.f32()[0] + c.f32()[0] + d.f32()[0] + e.f32()[0] + g.f32()[0] +
         static_cast<float>(device.has_value());
}
