// Must not compile: `import cgt;` (with a backend module) gives a program the user's names only.
// What backend authors need is in `import cgt.core;`, and the engine's plumbing is exported by
// no module. Each marked line names one of them and must fail with clang's "must be imported
// from module 'cgt.core'" (the name exists, but no import makes it visible here) or, for the
// static `Pool::adopt` that backends once used, "no member named". Clang makes a hidden name's
// neighbours visible once it reported one, so each line is compiled on its own: the build defines
// HIDDEN_NAME to its number. The engine's side of a backend's device is exported by no module: its
// class cannot be named, and the device a program reaches is a view without the engine's members
// ("no member named"). (`user_surface.cpp` is the other side.)
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
auto* const make = &cgt::backend::make_pool<cgt::host::Backend>;  // expect-error
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

// The engine's side of the backends' devices, and its members through the program's view.
#if HIDDEN_NAME == 17
using HostDevice = cgt::host::HostDevice;  // expect-error
#endif
#if HIDDEN_NAME == 18
auto* const shut = &cgt::host::Device::shutdown;  // expect-error
#endif
#if HIDDEN_NAME == 19
auto* const book = &cgt::host::Device::checkpoint;  // expect-error
#endif
#if HIDDEN_NAME == 20
auto* const blocks = &cgt::host::Device::live_blocks;  // expect-error
#endif
