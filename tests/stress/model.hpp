// The stress test's eager model: what every value the test holds must contain. Memory is modelled
// as objects (one per storage block the test knows of), each a map from an element's offset in its
// storage to its value; a value (a caller's buffer, a lease) is an object and the offsets of its
// elements in row-major order. Aliases share an object, so an in-place write through one changes
// what every alias must read, as it does in memory. Values are rounded to f32 like the buffers.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

import cgt.host;

namespace stress {

struct Object {
  std::unordered_map<std::int64_t, double> values;
};
using ObjectPtr = std::shared_ptr<Object>;

/// A value in row-major order with its sizes: an input as the model sees it, or an expected output.
struct Value {
  std::vector<std::int64_t> sizes;
  std::vector<double> data;
};

inline double f32(double v) {
  return static_cast<double>(static_cast<float>(v));
}

/// Offsets, in elements from the start of its storage, of each element of `b` in row-major order.
inline std::vector<std::int64_t> offsets_of(const cgt::host::Buffer& b) {
  std::vector<std::int64_t> offsets(b.numel());
  const auto sizes = b.sizes();
  const auto strides = b.strides();
  for (std::size_t flat = 0; flat < offsets.size(); ++flat) {
    std::size_t rest = flat;
    std::int64_t at = b.offset();
    for (std::size_t d = sizes.size(); d-- > 0;) {
      const auto size = static_cast<std::size_t>(sizes[d]);
      at += static_cast<std::int64_t>(rest % size) * strides[d];
      rest /= size;
    }
    offsets[flat] = at;
  }
  return offsets;
}

inline std::vector<double> gather(const Object& object, const std::vector<std::int64_t>& offsets) {
  std::vector<double> out(offsets.size());
  for (std::size_t i = 0; i < offsets.size(); ++i) {
    auto it = object.values.find(offsets[i]);
    out[i] = it == object.values.end() ? std::nan("") : it->second;
  }
  return out;
}

inline void scatter(Object& object, const std::vector<std::int64_t>& offsets, const std::vector<double>& data) {
  for (std::size_t i = 0; i < offsets.size(); ++i) object.values[offsets[i]] = data[i];
}

inline std::vector<double> read(const cgt::host::Buffer& b) {
  std::vector<double> out(b.numel());
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = b.get(i);
  return out;
}

/// Exactly equal (both sides are f32 values computed the same way); NaN never equals.
inline bool same(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;  // also equal infinities, whose difference is NaN
    if (!(std::abs(a[i] - b[i]) <= 1e-6 * (1 + std::abs(b[i])))) return false;
  }
  return true;
}

inline std::string show(const std::vector<double>& v) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size() && i < 8; ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  if (v.size() > 8) out += ", ... (" + std::to_string(v.size()) + ")";
  return out + "]";
}

inline Value map(const Value& x, const std::function<double(double)>& f) {
  Value y{x.sizes, x.data};
  for (double& v : y.data) v = f32(f(v));
  return y;
}
inline Value zip(const Value& a, const Value& b, const std::function<double(double, double)>& f) {
  Value y{a.sizes, a.data};
  for (std::size_t i = 0; i < y.data.size(); ++i) y.data[i] = f32(f(a.data[i], b.data[i]));
  return y;
}
/// Elements [0, end) of dimension 0 of a 1-D value.
inline Value head(const Value& x, std::int64_t end) {
  return {{end}, {x.data.begin(), x.data.begin() + end}};
}
/// The transpose of a 2-D value.
inline Value transposed(const Value& x) {
  const auto r = x.sizes[0], c = x.sizes[1];
  Value t{{c, r}, std::vector<double>(x.data.size())};
  for (std::int64_t i = 0; i < r; ++i) {
    for (std::int64_t j = 0; j < c; ++j)
      t.data[static_cast<std::size_t>(j * r + i)] = x.data[static_cast<std::size_t>(i * c + j)];
  }
  return t;
}

}  // namespace stress
