// cgt.core:detail — the non-template plumbing behind the handle templates of :handles.
// Nothing here is exported, to users or to backend authors: the handle templates name it where they
// are defined, so their instantiations in a user's code work without the names being visible there.
module;
#include <expected>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

export module cgt.core:detail;
import :error;
import :options;
import :info;
import :spi;

namespace cgt::detail {

class Engine;  // the tree and its state, defined in src/core
struct Cell;   // one output storage and the leases on it

void retain(Engine& engine) noexcept;
void release(Engine& engine) noexcept;

/// Shared ownership of an engine: every handle that needs the pool's memory holds one.
/// (Members are declared `inline`: in a named module, in-class definitions are not implicitly
/// inline, and these run several times per call.)
class EngineRef {
 public:
  inline EngineRef() = default;
  inline explicit EngineRef(Engine* engine) noexcept : engine_(engine) {
    if (engine_ != nullptr) retain(*engine_);
  }
  inline EngineRef(const EngineRef& other) noexcept : EngineRef(other.engine_) {}
  inline EngineRef(EngineRef&& other) noexcept : engine_(std::exchange(other.engine_, nullptr)) {}
  inline EngineRef& operator=(EngineRef other) noexcept {
    std::swap(engine_, other.engine_);
    return *this;
  }
  inline ~EngineRef() {
    if (engine_ != nullptr) release(*engine_);
  }
  [[nodiscard]] inline Engine* get() const noexcept { return engine_; }
  [[nodiscard]] inline Engine& operator*() const noexcept { return *engine_; }
  inline explicit operator bool() const noexcept { return engine_ != nullptr; }

 private:
  Engine* engine_ = nullptr;
};

struct LeaseCore;
/// Drops the lease (the memory may become dead); leaves it empty.
void lease_drop(LeaseCore& lease) noexcept;
/// Drops every lease of `leases` (one call's: one engine), holding the pool's state once.
void leases_drop(std::span<LeaseCore> leases) noexcept;

/// The state of one lease: the engine, the storage it keeps live, and the value it hands out.
struct LeaseCore {
  EngineRef engine;
  Cell* cell = nullptr;  ///< holds one lease on the cell; null for values that are not pool memory
  const void* value = nullptr;
  std::shared_ptr<const void> owner;  ///< owns `value` when the engine does not
  std::uint32_t function = 0;
  std::uint32_t output = 0;

  inline LeaseCore() = default;
  LeaseCore(const LeaseCore&) = delete;
  LeaseCore& operator=(const LeaseCore&) = delete;
  inline LeaseCore(LeaseCore&& other) noexcept
      : engine(std::move(other.engine)),
        cell(std::exchange(other.cell, nullptr)),
        value(std::exchange(other.value, nullptr)),
        owner(std::move(other.owner)),
        function(other.function),
        output(other.output) {}
  LeaseCore& operator=(LeaseCore&& other) noexcept;
  inline ~LeaseCore() {
    if (engine) lease_drop(*this);
  }
};

/// The value of a lease, or why it is not available.
[[nodiscard]] Result<const void*> lease_value(LeaseCore& lease);
/// True while the lease can hand out its value.
[[nodiscard]] bool lease_is_valid(const LeaseCore& lease) noexcept;

/// What one call produced.
struct CallOutputs {
  std::vector<LeaseCore> leases;
  CallKind kind = CallKind::eager;
  std::int64_t node = -1;
};

/// A new engine over `device`; fails with `invalid_argument` for contradictory options.
[[nodiscard]] Result<EngineRef> make_engine(std::unique_ptr<backend::Device> device, Options options);
[[nodiscard]] Result<std::uint32_t> add_function(Engine& engine, std::unique_ptr<backend::Invoker> invoker,
                                                 FunctionOptions options);
/// The arguments of a call, described one by one once the pool is ready to read them (a new
/// step may have reclaimed, or copied out, the memory of a lease passed as an argument).
class ArgSource {
 public:
  [[nodiscard]] virtual std::size_t size() const noexcept = 0;
  [[nodiscard]] virtual Result<void> describe(std::size_t i, backend::ArgSlot& slot, backend::ArgDesc& desc) const = 0;

 protected:
  ~ArgSource() = default;
};

[[nodiscard]] Result<CallOutputs> call(Engine& engine, std::uint32_t function, const ArgSource& args);
[[nodiscard]] const std::string& function_name(Engine& engine, std::uint32_t function) noexcept;
[[nodiscard]] backend::Device& device(Engine& engine) noexcept;

/// A fixed-capacity array on the stack that spills to the heap: calls with few arguments
/// allocate nothing for their argument descriptions.
template <class T, std::size_t Inline>
class SmallArray {
 public:
  inline explicit SmallArray(std::size_t size) : size_(size) {
    if (size > Inline) {
      heap_ = std::make_unique<T[]>(size);
    } else {
      std::uninitialized_value_construct_n(inline_.data(), size);  // NOLINT(cppcoreguidelines-pro-type-union-access)
    }
  }
  SmallArray(const SmallArray&) = delete;
  SmallArray& operator=(const SmallArray&) = delete;
  inline ~SmallArray() {
    if (size_ <= Inline) std::destroy_n(inline_.data(), size_);  // NOLINT(cppcoreguidelines-pro-type-union-access)
  }
  [[nodiscard]] inline std::span<T> span() noexcept {
    return {size_ > Inline ? heap_.get() : inline_.data(), size_};  // NOLINT(cppcoreguidelines-pro-type-union-access)
  }

 private:
  // Only the first `size` elements are constructed: a call with few arguments touches only those.
  union {
    std::array<T, Inline> inline_;
  };
  std::unique_ptr<T[]> heap_;
  std::size_t size_;
};

}  // namespace cgt::detail
