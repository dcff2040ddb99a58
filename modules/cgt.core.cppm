// cgt.core — the engine's module: the user's names, which `cgt` re-exports (read modules/cgt.cppm
// first), and what a backend needs to put a device under the tree engine.
//
// A program that uses a backend imports `cgt` and the backend's module (`cgt.host`, `cgt.cuda`,
// `cgt.torch`); only the code of a backend, and tests that stand a fake device in for one, import
// this module. A backend:
//  * implements `cgt::backend::Device` (its stream, its checkpointable allocator, running a
//    function), `cgt::backend::Capture` (the device primitives of one recording, which the capture
//    pipeline in src/core calls in order) and `cgt::backend::Recording` (one captured graph) — :spi;
//  * names a backend type `B` for the handle templates (`Value`, `Callable`, `Device`, `describe`,
//    `take`, `make_invoker`, `view`; see :handles) and aliases `cgt::Pool<B>` and friends in its
//    namespace; `B::Device` is the program's view of a pool's device, not the backend device;
//  * makes its pools with `cgt::backend::make_pool<B>(std::make_unique<MyDevice>(...), options)`;
//  * if its memory is a `cgt::Arena` and its values are buffers, reuses the helpers of
//    :arena_spi (`finish_call`, `checkpoint_arena`, `restore_arena`, ...).
//
// The engine's plumbing (`cgt::detail`: engine handles, lease state, argument sources) is not
// exported from here either: the handle templates use it where they are defined.
module;
export module cgt.core;

export import :error;      // Errc, Error, Result<T>, fail
export import :version;    // Version, version, version_string: which cgt this is
export import :options;    // Options, FunctionOptions, Reason, Event, LogSink
export import :info;       // Stats, MemoryInfo, Block, CallKind, NodeKind, NodeReason, GraphCounts
export import :layout;     // ElementType, Layout: strided views, for the backends' buffers
export import :handles;    // Pool<B>, Function<B>, Arg<B>, Outputs<B>, OutputLease<B>, Owning<T>, Node;
                           // backend::make_pool<B>, backend::device_of (one partition per handle)
export import :spi;        // backend::Device, Capture, Recording, Checkpoint, ArgDesc, ArgSlot, Invoker, ...
export import :arena;      // Arena: the checkpointable best-fit allocator of the host and cuda pools
export import :arena_spi;  // backend helpers over an Arena: finish_call, checkpoint_arena, restore_arena
export import :detail;     // exports nothing (the handles' plumbing); imported so that it is reachable
