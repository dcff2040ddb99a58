// Batch buckets in cgt.torch: inputs padded with libtorch ops, outputs sliced with `narrow`.
module;
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>

#include <cstddef>
#include <cstdint>
#include <expected>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

module cgt.torch;
import cgt.core;
import :internal;

namespace cgt::torch {
namespace {

// A slice of a pool output, handed out by a lease. Registered as a view of the output's storage
// while it lives, as the output itself is: the storage's escape check (`TorchStorage::escaped`)
// then counts it as cgt's own, and a copy the caller keeps of it as an escape.
struct SlicedOutput {
  SlicedOutput(at::Tensor view, std::shared_ptr<TorchStorage> storage)
      : tensor(std::move(view)), record(std::move(storage)) {
    if (record) record->add_view(&tensor);
  }
  SlicedOutput(const SlicedOutput&) = delete;
  SlicedOutput& operator=(const SlicedOutput&) = delete;
  ~SlicedOutput() {
    if (record) record->remove_view(&tensor);
  }
  at::Tensor tensor;
  std::shared_ptr<TorchStorage> record;
};

at::Scalar fill_value(const at::Tensor& tensor, double value) {
  // An integer tensor (token ids, positions) gets the integer: a double Scalar would be refused.
  if (at::isIntegralType(tensor.scalar_type(), /*includeBool=*/true)) return {static_cast<std::int64_t>(value)};
  return {value};
}

}  // namespace

Result<backend::Padded> TorchDevice::pad(const void* value, const backend::ArgDesc& /*desc*/, std::size_t dim,
                                         std::int64_t size, Pad pad) {
  const at::Tensor& source = *static_cast<const at::Tensor*>(value);
  return guarded("padding an input to its bucket", [&]() -> Result<backend::Padded> {
    // On the caller's stream of the tensor's device, like the caller's own work on it: a replay
    // (launched there too) reads it after, and its block is reused only by work queued later.
    const c10::OptionalDeviceGuard device_guard(source.device());
    const NormalTensors normal;  // the function's writes to the padded copy must be seen
    const auto d = static_cast<std::int64_t>(dim);
    const std::int64_t rows = source.size(d);
    std::vector<std::int64_t> sizes = source.sizes().vec();
    sizes[dim] = size;
    auto padded = std::make_shared<at::Tensor>(at::empty(sizes, source.options()));
    padded->narrow(d, 0, rows).copy_(source);
    const at::Tensor added = padded->narrow(d, rows, size - rows);
    if (pad.mode == PadMode::replicate) {
      added.copy_(source.narrow(d, rows - 1, 1).expand_as(added));
    } else {
      // Converting a NaN, an infinity or a value past int64 to an integer is undefined: refused
      // here (libtorch refuses one past a smaller integer type itself, with an exception).
      if (at::isIntegralType(source.scalar_type(), /*includeBool=*/true) &&
          !cgt::holds_exactly(cgt::ElementType::i64, pad.value)) {
        return fail(Errc::invalid_argument, "the pad value " + std::to_string(pad.value) +
                                                " is not a value of the input's integer elements (" +
                                                std::string(c10::toString(source.scalar_type())) +
                                                "); choose one the type holds (Buckets::per_input)");
      }
      added.fill_(fill_value(source, pad.value));
    }
    backend::Padded result{.owner = padded, .value = padded.get(), .desc = {}};
    if (auto described = Backend::describe(*padded, result.desc); !described) {
      return std::unexpected(std::move(described.error()));
    }
    return result;
  });
}

Result<void> TorchDevice::write_back(const void* padded, const void* original, std::size_t dim, std::int64_t rows) {
  const at::Tensor& source = *static_cast<const at::Tensor*>(padded);
  const at::Tensor& target = *static_cast<const at::Tensor*>(original);
  return guarded("copying a write to a padded input back", [&]() -> Result<void> {
    // On the caller's stream, after the call's work (a warm-up's stream was joined back to it).
    const c10::OptionalDeviceGuard device_guard(target.device());
    // No autograd history for cgt's own copy; an inference tensor is written in inference mode.
    std::optional<c10::InferenceMode> inference;
    if (target.is_inference()) inference.emplace();
    const c10::NoGradGuard no_grad;
    target.copy_(source.narrow(static_cast<std::int64_t>(dim), 0, rows));
    return {};
  });
}

Result<std::shared_ptr<const void>> TorchDevice::slice(const void* value, const backend::StorageHandle* storage,
                                                       std::size_t dim, std::int64_t bucket, std::int64_t size) {
  const at::Tensor& output = *static_cast<const at::Tensor*>(value);
  if (!output.defined() || dim >= static_cast<std::size_t>(output.dim()) ||
      output.size(static_cast<std::int64_t>(dim)) != bucket) {
    return nullptr;
  }
  return guarded("slicing an output", [&]() -> Result<std::shared_ptr<const void>> {
    std::shared_ptr<TorchStorage> record;
    if (storage != nullptr && storage->native != nullptr) {
      record = std::static_pointer_cast<TorchStorage>(storage->native_owner);
    }
    auto sliced =
        std::make_shared<SlicedOutput>(output.narrow(static_cast<std::int64_t>(dim), 0, size), std::move(record));
    return std::shared_ptr<const void>(sliced, &sliced->tensor);
  });
}

std::vector<std::int64_t> TorchDevice::sizes_of(const void* value) const {
  const at::Tensor& tensor = *static_cast<const at::Tensor*>(value);
  if (!tensor.defined()) return {};
  return tensor.sizes().vec();
}

}  // namespace cgt::torch
