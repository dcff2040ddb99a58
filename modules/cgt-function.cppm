// cgt:function — a function registered with a pool (`Function`): calling it.
module;
#include <expected>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

export module cgt:function;
import cgt.vocabulary;
import cgt.core;
import :lease;
import :arg;
import :outputs;

export namespace cgt {

template <class B>
class Pool;

/// A function registered with a pool. Calling it warms it up, records it, replays it, or runs it
/// eagerly with a stated reason. Move-only; it keeps the pool's memory alive (not past
/// `Pool::shutdown()`). A moved-from `Function` is empty: its calls fail with `invalid_argument`.
template <class B>
class Function {
 public:
  Function(Function&&) noexcept = default;
  Function& operator=(Function&&) noexcept = default;

  /// Calls the function. Fails with `wrong_input_count` / `wrong_input_type` / `wrong_shape` when
  /// the inputs do not match its first call, `output_overwritten` for a stale lease argument,
  /// `pool_shut_down`, `concurrent_use`, `function_failed` (the function threw; the pool is
  /// restored), `out_of_memory`, `static_input_moved`, `graph_unavailable` (with `or_error`),
  /// `backend_error`, `invalid_argument` (an empty lease argument, an empty `Function`).
  /// On failure nothing the caller holds is changed: a lease moved in still holds its value
  /// (except after a `backend_error` or `invariant_violation` found once the work was done).
  /// ENSURES: on success, a lease moved in is empty (the call consumed it) and the outputs are an
  /// `Owning` result: name it before borrowing from it.
  [[nodiscard]] Owning<Outputs<B>> operator()(std::span<const Arg<B>> args) const {
    if (!engine_) {
      return fail(Errc::invalid_argument,
                  "call of an empty Function handle (moved from); call the handle it was "
                  "moved into");
    }
    const Source source(args);
    auto out = detail::call(*engine_, id_, source);
    if (!out) return std::unexpected(std::move(out.error()));
    return Outputs<B>(std::move(*out));
  }
  [[nodiscard]] Owning<Outputs<B>> operator()(std::initializer_list<Arg<B>> args) const {
    return (*this)(std::span<const Arg<B>>(args.begin(), args.size()));
  }

  /// The name given in `FunctionOptions` (or "function<id>"); empty for an empty `Function`.
  [[nodiscard]] std::string_view name() const noexcept {
    return engine_ ? std::string_view(detail::function_name(*engine_, id_)) : std::string_view();
  }
  /// The id the pool gave the function, in registration order (kept by a moved-from handle).
  [[nodiscard]] std::uint32_t id() const noexcept { return id_; }

 private:
  template <class>
  friend class Pool;
  Function(detail::EngineRef engine, std::uint32_t id) noexcept : engine_(std::move(engine)), id_(id) {}

  class Source final : public detail::ArgSource {
   public:
    explicit Source(std::span<const Arg<B>> args) noexcept : args_(args) {}
    [[nodiscard]] std::size_t size() const noexcept override { return args_.size(); }
    [[nodiscard]] Result<void> describe(std::span<backend::ArgSlot> slots, std::span<backend::ArgDesc> descs,
                                        std::vector<std::shared_ptr<const void>>& keep) const override {
      for (std::size_t i = 0; i < args_.size(); ++i) {
        if (auto described = args_[i].describe(slots[i], descs[i], is_first_consumer(i), keep); !described)
            [[unlikely]] {
          described.error().input = static_cast<std::int32_t>(i);
          return described;
        }
      }
      return {};
    }

   private:
    // A lease moved into two arguments is consumed once: the engine counts consumed leases
    // against the leases on a storage, and one lease counted twice would make a storage that
    // another lease holds look dead.
    [[nodiscard]] bool is_first_consumer(std::size_t i) const noexcept {
      if (!args_[i].is_consumed_) return false;
      for (std::size_t j = 0; j < i; ++j) {
        if (args_[j].is_consumed_ && args_[j].lease_ == args_[i].lease_) return false;
      }
      return true;
    }

    std::span<const Arg<B>> args_;
  };

  detail::EngineRef engine_;
  std::uint32_t id_ = 0;
};

}  // namespace cgt
