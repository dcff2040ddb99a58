// The backend type `B` of a handle (`cgt::Pool<B>`, `cgt::Function<B>`, ...). A backend module
// exports its handles' names and not `B`, whose members are the engine's side; the tests that
// stand in for a backend's engine side (they import cgt.core) reach it through a handle.
#pragma once

namespace cgt_test {

template <class Handle>
struct BackendOfHandle;
template <template <class> class Handle, class B>
struct BackendOfHandle<Handle<B>> {
  using type = B;
};
/// `BackendOf<cgt::host::Pool>` is the host backend's `B`.
template <class Handle>
using BackendOf = typename BackendOfHandle<Handle>::type;

}  // namespace cgt_test
