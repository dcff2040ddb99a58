// What a test asks of the device a program reaches with `pool.device()`: the backend's own members
// (its arena or memory pool, its stream) and none of the engine's side (backend::Device), whose
// members are private in every backend. The user-surface compile test and the cuda and torch tests
// assert it of their backend's Device; a host test asserts that backend::Device itself offers all
// of it, so that no requirement below is false for a reason of its own (a wrong signature).
#pragma once

namespace cgt_test::engine_side {

// One per member of backend::Device a program could name (those whose parameters are engine types
// cannot be named outside cgt.core at all).
template <class D>
concept shutdown = requires(D& d) { d.shutdown(); };
template <class D>
concept checkpoint = requires(D& d) { d.checkpoint(); };
template <class D>
concept memory = requires(D& d) { d.memory(); };
template <class D>
concept live_blocks = requires(D& d) { d.live_blocks(); };
template <class D>
concept device_index = requires(D& d) { d.device_index(); };
template <class D>
concept type_name = requires(D& d) { d.type_name(0); };
template <class D>
concept stamps_values = requires(D& d) { d.stamps_values(); };
template <class D>
concept stamp = requires(D& d) { d.stamp(nullptr, 0); };
template <class D>
concept releases_unowned_storage = requires(D& d) { d.releases_unowned_storage(); };
template <class D>
concept owns = requires(D& d) { d.owns(0); };
template <class D>
concept why_no_buckets = requires(D& d) { d.why_no_buckets(); };
template <class D>
concept sizes_of = requires(D& d) { d.sizes_of(nullptr); };
template <class D>
concept scopes_calls = requires(D& d) { d.scopes_calls(); };
template <class D>
concept begin_call = requires(D& d) { d.begin_call(); };
template <class D>
concept end_call = requires(D& d) { d.end_call(); };

}  // namespace cgt_test::engine_side

namespace cgt_test {

/// A program can call some member of the engine's side of a D.
template <class D>
concept offers_the_engine_side =
    engine_side::shutdown<D> || engine_side::checkpoint<D> || engine_side::memory<D> || engine_side::live_blocks<D> ||
    engine_side::device_index<D> || engine_side::type_name<D> || engine_side::stamps_values<D> ||
    engine_side::stamp<D> || engine_side::releases_unowned_storage<D> || engine_side::owns<D> ||
    engine_side::why_no_buckets<D> || engine_side::sizes_of<D> || engine_side::scopes_calls<D> ||
    engine_side::begin_call<D> || engine_side::end_call<D>;
/// ...every member of it (true of backend::Device, where they are public).
template <class D>
concept offers_all_of_the_engine_side =
    engine_side::shutdown<D> && engine_side::checkpoint<D> && engine_side::memory<D> && engine_side::live_blocks<D> &&
    engine_side::device_index<D> && engine_side::type_name<D> && engine_side::stamps_values<D> &&
    engine_side::stamp<D> && engine_side::releases_unowned_storage<D> && engine_side::owns<D> &&
    engine_side::why_no_buckets<D> && engine_side::sizes_of<D> && engine_side::scopes_calls<D> &&
    engine_side::begin_call<D> && engine_side::end_call<D>;

/// A program can allocate in the pool's memory through `arena()` (the engine's to change: no).
template <class D>
concept allocates_through_its_arena = requires(D& d) { d.arena().allocate(64); };

}  // namespace cgt_test
