// cgt.core — the engine's module: the tree engine, knowing nothing of any device, and what a
// backend needs to put a device under it. Module `cgt` (read modules/cgt.cppm first) defines the
// handles a program holds over this engine and imports this module without exporting it.
//
// A program imports `cgt` and a backend's module (`cgt.host`, `cgt.cuda`, `cgt.torch`); only the
// code of a backend, and tests that stand a fake device in for one, import this module. A backend:
//  * implements `cgt::backend::Device` (its stream, its checkpointable allocator, running a
//    function), `cgt::backend::Capture` (the device primitives of one recording, which the capture
//    pipeline in src/core calls in order) and `cgt::backend::Recording` (one captured graph) — :spi;
//  * names a backend type `B` for the handle templates of module cgt, and exports the handles'
//    aliases (`using Pool = cgt::Pool<B>;` ...), not `B`. `B` provides:
//      using Value    = ...;  // what a call takes and a lease hands out (a buffer view, an at::Tensor)
//      using Callable = ...;  // the user's function
//      using Device   = ...;  // the program's view of a pool's device (`Pool::device()`)
//      static Result<void> describe(const Value&, backend::ArgDesc&);  // fails for unusable values
//      static Result<Value> take(const Value&);                        // copy out of the pool
//      static std::unique_ptr<backend::Invoker> make_invoker(Callable&&);
//      static Device& view(backend::Device&);                          // the view of its device
//    `B::Device` is the program's view of a pool's device, not the backend device;
//  * makes its pools with `cgt::backend::make_pool<Pool>(std::make_unique<MyDevice>(...), options)`;
//  * if its memory is a `cgt::Arena` and its values are buffers, reuses the helpers of
//    :arena_spi (`finish_call`, `checkpoint_arena`, `restore_arena`, ...).
module;
export module cgt.core;

export import cgt.vocabulary;   // errors, options, information, layouts: the words both sides speak
export import :spi;             // backend::Device, Capture, Recording, Checkpoint, ArgDesc, ArgSlot, Invoker, ...
export import :arena;           // Arena: the checkpointable best-fit allocator of the host and cuda pools
export import :arena_spi;       // backend helpers over an Arena: finish_call, checkpoint_arena, restore_arena
export import :host_decisions;  // HostDecisions: the fallback's segments and decisions, replayed by the host
export import :detail;          // the engine's side of module cgt's handles; backend::make_pool, backend::device_of
