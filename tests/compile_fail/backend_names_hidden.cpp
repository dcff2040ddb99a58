// Must not compile: `import cgt;` (with a backend module) gives a program the user's names only.
// What backend authors need is in `import cgt.core;` (which module cgt imports and does not
// export), the engine's own state in no module. Each marked line names one of them and must fail
// with clang's "must be imported from module 'cgt.core'" (the name exists, but no import makes it
// visible here) or, for the static `Pool::adopt` that backends once used, "no member named".
// Clang makes a hidden name's neighbours visible once it reported one, so each line is compiled
// on its own: the build defines HIDDEN_NAME to its number. What each backend's device keeps of
// the engine's side is `backend_device_hidden.cpp`'s; `user_surface.cpp` is the other side.
import cgt;
import cgt.host;

// The backend interface.
#if HIDDEN_NAME == 1
using Device = cgt::backend::Device;  // expect-error
#endif
#if HIDDEN_NAME == 2
using Recording = cgt::backend::Recording;  // expect-error
#endif
#if HIDDEN_NAME == 3
using Desc = cgt::backend::ArgDesc;  // expect-error
#endif
#if HIDDEN_NAME == 4
using Slot = cgt::backend::ArgSlot;  // expect-error
#endif
#if HIDDEN_NAME == 5
using Checkpoint = cgt::backend::Checkpoint;  // expect-error
#endif
#if HIDDEN_NAME == 6
using Handle = cgt::backend::StorageHandle;  // expect-error
#endif

// The helpers of backends over an arena, and the arena (`cgt::host::Arena` is the host backend's name for it).
#if HIDDEN_NAME == 7
using ArenaCheckpoint = cgt::backend::ArenaCheckpointOf;  // expect-error
#endif
#if HIDDEN_NAME == 8
auto* const settle = &cgt::backend::free_all;  // expect-error
#endif
#if HIDDEN_NAME == 9
using Arena = cgt::Arena;  // expect-error
#endif

// Making a pool over a device of one's own.
#if HIDDEN_NAME == 10
auto* const make = &cgt::backend::make_pool<cgt::host::Pool>;  // expect-error
#endif
#if HIDDEN_NAME == 11
auto* const make = &cgt::detail::make_engine;  // expect-error
#endif
#if HIDDEN_NAME == 12
auto* const adopt = &cgt::host::Pool::adopt;  // expect-error
#endif

// The engine's plumbing.
#if HIDDEN_NAME == 13
using Engine = cgt::detail::EngineRef;  // expect-error
#endif
#if HIDDEN_NAME == 14
using Small = cgt::detail::SmallArray<int, 2>;  // expect-error
#endif
#if HIDDEN_NAME == 15
using Lease = cgt::detail::LeaseCore;  // expect-error
#endif
#if HIDDEN_NAME == 16
using Source = cgt::detail::ArgSource;  // expect-error
#endif

#if HIDDEN_NAME == 17
auto* const stats = &cgt::detail::pool_view::stats;  // expect-error
#endif
#if HIDDEN_NAME == 18
using Access = cgt::detail::HandleAccess<cgt::host::Pool>;  // expect-error
#endif
#if HIDDEN_NAME == 19
auto* const reach = &cgt::backend::device_of<cgt::host::Pool>;  // expect-error
#endif
