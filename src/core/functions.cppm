// cgt.core:functions (internal) — the functions a pool registered and their shape variants: each
// function's static facts (options, the signature its first call fixed, which inputs are static or
// mutated), the shape key of a call, and the variant a call selects. To change the shape key, read
// this file and functions.cpp: nothing else builds or compares one.
module;
#include <expected>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

export module cgt.core:functions;
import cgt.vocabulary;
import :spi;

namespace cgt::detail {

/// A function's name as the engine's messages quote it: 'name'.
[[nodiscard]] inline std::string in_quotes(const std::string& name) {
  return "'" + name + "'";
}

/// One function at one shape key (PyTorch's FunctionID): nodes of the tree belong to a variant.
/// Made by `Functions::select`; the engine's steps write its decisions, each named beside it.
struct Variant {
  // Set by `Functions::select`, which makes the variant.
  std::uint32_t id = 0;
  std::uint32_t function = 0;
  std::vector<std::int64_t> key;
  bool warmed_up = false;  ///< set by `warm_up` and `keep_as_warmup`
  /// Its capture broke at shapes that had not warmed up of their own (`warm_up_each_shape =
  /// false`): the next decision warms them up. Set by `after_failed_recording`, cleared by `warm_up`.
  bool needs_own_warmup = false;
  /// Its recording failed for a reason that will not change at these shapes (a synchronisation
  /// inside the function, a call of another pool, an output a graph cannot hand out): it runs
  /// eagerly from then on, for `capture_failure_reason` (`Reason::capture_failed`, `nested_pool`
  /// or `unsupported_output`), with the message kept here. Both set by `run_eagerly_from_now_on`.
  std::optional<std::string> capture_failure;
  Reason capture_failure_reason = Reason::capture_failed;
  /// Its loops and branches could not be conditional graph nodes (`Cause::conditional_unavailable`):
  /// its later recordings have the host decide them between segments (`ControlFlow::on_host`).
  /// Set by `after_failed_recording`.
  bool control_flow_on_host = false;
  /// What its last warm-up asked of the pool's arena (`RunResult::allocations`; null: none, or a
  /// backend without an arena): what its recording will add is predicted from it. Set by `warm_up`.
  std::shared_ptr<const ArenaTrace> warmup_allocations;
  /// Told once that its recording would go past the budget (`Reason::over_budget`). Set by `record`.
  bool warned_over_budget = false;
  /// Re-recorded somewhere in the tree (`ChildFacts::rerecords`): only then does a call look its
  /// count up. Set by `run_tree`.
  bool rerecorded = false;
};

/// The argument signature a function is held to: set by its first call.
struct Signature {
  std::vector<backend::ArgKind> kinds;
  std::vector<std::uint16_t> dtypes;
  std::vector<std::uint8_t> ranks;
};

/// A registered function. Made by `Functions::add`; its signature and input facts are the owner's
/// (`check_signature`, `note_write`), the warnings' flags the engine's steps', each named beside it.
struct FunctionRecord {
  // Set by `Functions::add`; `Functions::take_invokers` takes the invoker.
  std::uint32_t id = 0;
  std::string name;
  std::unique_ptr<backend::Invoker> invoker;
  FunctionOptions options;
  // Set by `Functions::check_signature`, at the first call.
  std::optional<Signature> signature;
  std::vector<bool> is_static;  ///< per input, from options.static_inputs
  /// Per input: declared in options.mutated_inputs (`check_signature`), or seen written by a run
  /// (`Functions::note_write`).
  std::vector<bool> is_mutated;
  bool mutates_an_input = false;  ///< some `is_mutated` is set: calls check their inputs for it
  // Set by `Functions::select`.
  std::map<std::vector<std::int64_t>, std::uint32_t> variants;  ///< shape key -> variant id
  std::uint32_t last_variant = UINT32_MAX;                      ///< the last key seen: the fast path
  bool warned_mutation = false;                                 ///< set by `mutates_unmanaged_input`
  bool warned_many_keys = false;                                ///< set by `Functions::select`
  bool warned_pending_backward = false;                         ///< set by `warn_if_pending_backward_repeats`
  bool warned_padded_output = false;                            ///< set by `warn_if_padding_shows`
  /// Some shape of it has warmed up (see `warm_up_each_shape`); set by `warm_up`.
  bool warmed_up_once = false;
  std::set<Reason> logged;  ///< reasons already printed by the default sink; added to by `log`
};

/// Kernels may assume this alignment of their inputs (PyTorch's ALIGNMENT); a static input that
/// lacks it is copied into an aligned slot instead of being baked in mis-addressed.
inline constexpr std::uintptr_t kInputAlignment = 16;

/// Whether input `i` is a static input a graph can use in place: declared static, and aligned.
/// A misaligned one is copied into a slot, so it is no longer static (a mutation of it would go
/// to the slot: such a call runs eagerly, as PyTorch drops misaligned inputs from the static set).
[[nodiscard]] inline bool is_usable_in_place(const FunctionRecord& function, std::size_t i,
                                             const backend::ArgDesc& desc) noexcept {
  return function.is_static[i] && desc.data % kInputAlignment == 0;
}

/// The key words of the shape key (functions.cpp builds keys from them; the fast path compares).
/// A dimension's stride as the key sees it: that of a dimension of size 1 is never stepped along
/// (its index is always 0), so it is 0 whatever the value says. Without this, a column of one
/// element ([1], stride 8) and a fresh scalar tensor ([1], stride 1) recorded a graph each.
[[nodiscard]] inline std::int64_t key_stride(const backend::ArgDesc& desc, std::size_t d) noexcept {
  return desc.sizes[d] == 1 ? 0 : desc.strides[d];
}
/// A value's broadcast and view bits: a graph reads a static or pool-managed input in place, with
/// the layout and meaning it was recorded with (a matrix and its lazy conjugate at one address
/// need graphs of their own).
[[nodiscard]] inline std::int64_t key_layout_bits(const backend::ArgDesc& desc) noexcept {
  return static_cast<std::int64_t>(desc.expanded) | (static_cast<std::int64_t>(desc.view) << 32);
}
/// The word that opens each argument: its kind, and for a value its device, element type and
/// rank. With it a key says the whole signature, so a call whose key is a known variant's needs no
/// signature check (the variant's first call passed it), and no device check (a variant is made
/// only for calls whose values are all on the pool's device).
inline constexpr std::int64_t kScalarTag = std::int64_t{1} << 62;
inline constexpr std::int64_t kValueTag = std::int64_t{1} << 61;
[[nodiscard]] inline std::int64_t opening_word(const backend::ArgDesc& desc) noexcept {
  if (desc.kind == backend::ArgKind::scalar) return kScalarTag;
  const auto device = static_cast<std::int64_t>(static_cast<std::uint32_t>(desc.device));  // -1: host memory
  return kValueTag | (device << 24) | (static_cast<std::int64_t>(desc.dtype) << 8) | desc.rank;
}

/// Whether `descs` have the shape key `key`, without building one: the fast path of a call with
/// the last shapes. A key word that equals the argument's opening word says how many words follow
/// it (one for a scalar, 2 * rank + 1 for a value): only the opening words need a bound check.
[[nodiscard]] inline bool key_matches(const std::vector<std::int64_t>& key,
                                      std::span<const backend::ArgDesc> descs) noexcept {
  std::size_t at = 0;
  for (const auto& desc : descs) {
    if (at >= key.size() || key[at] != opening_word(desc)) return false;
    ++at;
    if (desc.kind == backend::ArgKind::scalar) {
      if (key[at] != desc.scalar) return false;
      ++at;
      continue;
    }
    const std::size_t rank = desc.rank;
    for (std::size_t d = 0; d < rank; ++d) {  // ranks are small: a loop beats memcmp here
      if (key[at + d] != desc.sizes[d] || key[at + rank + d] != key_stride(desc, d)) return false;
    }
    at += 2 * rank;
    if (key[at] != key_layout_bits(desc)) return false;
    ++at;
  }
  return at == key.size();
}

/// The shape key of a call (PyTorch guards on sizes and strides; a scalar is a constant of the
/// graph, like Python's int inputs): every value's sizes, strides (as `key_stride` sees them) and
/// layout bits, and every scalar's value, each argument opened by its `opening_word`.
[[nodiscard]] std::vector<std::int64_t> shape_key(std::span<const backend::ArgDesc> descs);

/// `error` from the device, told in terms of the call: which function, doing what, on which node.
[[nodiscard]] Error in_call(Error error, const FunctionRecord& function, const char* doing, std::int64_t node = -1);

/// What `Functions::select` found for a call's shapes.
struct Selection {
  Variant* variant = nullptr;   ///< null: no graph can serve these shapes (`unfit` says why)
  std::optional<Reason> unfit;  ///< another device, a size not in `graph_sizes`, a key past the limit
  /// This call made the function's distinct keys pass `Options::shape_key_warn_limit`, for the
  /// first time: the caller warns (`Reason::many_shape_keys`).
  bool passed_warn_limit = false;
};

/// Owns the functions a pool registered (their records) and their shape variants.
///
/// Contract: `add` ENSURES `operator[](id)` is the new record, with the next id. `check_signature`
/// ENSURES at a function's first call: the signature is the call's, and the options' indices were
/// checked against it (`invalid_argument` otherwise, nothing kept); at a later call: the call's
/// kinds, element types and ranks are the signature's (`wrong_input_count`, `wrong_input_type`,
/// `wrong_shape`). `select` ENSURES: the variant of the call's key (made at its first call, and the
/// function's `last_variant` from now on), or `unfit` where no graph can serve the call. `name`
/// may be read on any thread (a `concurrent_use` message names a function while another thread's
/// call holds the pool); everything else REQUIRES the pool's state.
class Functions {
 public:
  Functions() = default;
  Functions(const Functions&) = delete;
  Functions& operator=(const Functions&) = delete;

  /// Registers a callable under `name` with `options` (checked by the caller); returns its id.
  std::uint32_t add(std::string name, std::unique_ptr<backend::Invoker> invoker, FunctionOptions options);
  [[nodiscard]] inline FunctionRecord& operator[](std::uint32_t id) noexcept { return *records_[id]; }
  [[nodiscard]] inline const FunctionRecord& operator[](std::uint32_t id) const noexcept { return *records_[id]; }
  [[nodiscard]] inline std::size_t size() const noexcept { return records_.size(); }
  /// The name of function `id`, on any thread.
  [[nodiscard]] const std::string& name(std::uint32_t id) const noexcept;
  [[nodiscard]] inline Variant& variant(std::uint32_t id) noexcept { return *variants_[id]; }
  [[nodiscard]] inline const Variant& variant(std::uint32_t id) const noexcept { return *variants_[id]; }

  /// Whether the call's shape key is `function`'s last variant's: its signature, devices and graph
  /// size are then known good. (Inline: the replay's fast path.)
  [[nodiscard]] inline bool same_shapes_as_last(const FunctionRecord& function,
                                                std::span<const backend::ArgDesc> descs) const noexcept {
    return function.last_variant != UINT32_MAX && key_matches(variants_[function.last_variant]->key, descs);
  }
  /// `function`'s last variant. REQUIRES: `same_shapes_as_last`.
  [[nodiscard]] inline Variant& last_variant(const FunctionRecord& function) noexcept {
    return *variants_[function.last_variant];
  }
  /// Checks the call's signature (see the contract); `device` names element types in messages.
  [[nodiscard]] Result<void> check_signature(FunctionRecord& function, std::span<const backend::ArgDesc> descs,
                                             const backend::Device& device) const;
  /// The call's variant, or why no graph can serve it (see `Selection`). `device_index`: the pool's
  /// device (a value elsewhere is `input_on_other_device`).
  [[nodiscard]] Selection select(FunctionRecord& function, std::span<const backend::ArgDesc> descs,
                                 std::int32_t device_index, const Options& options);
  /// A run wrote input `input` of `function`: it counts as mutated from now on. Returns whether
  /// that is news (it was neither declared nor seen before).
  [[nodiscard]] static bool note_write(FunctionRecord& function, std::size_t input) noexcept;

  /// Hands every function's callable back (`shutdown()`), for the caller to destroy once it let go
  /// of the pool's state.
  [[nodiscard]] std::vector<std::unique_ptr<backend::Invoker>> take_invokers() noexcept;

 private:
  std::vector<std::unique_ptr<FunctionRecord>> records_;  ///< appended by `add` only
  /// Guards the structure of `records_` (not the records) for `name` on another thread; never held
  /// across a call.
  mutable std::mutex records_mutex_;
  std::vector<std::unique_ptr<Variant>> variants_;  ///< appended by `select` only
};

}  // namespace cgt::detail
