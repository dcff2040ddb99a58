// cgt — CUDA graph trees for C++.
//
// A CUDA graph replays a recorded sequence of kernels with one launch. Its catch: a replay writes
// the same addresses every time, and each graph normally needs memory of its own. A cgt `Pool`
// fixes both, like PyTorch's `torch.compile(mode="reduce-overhead")`:
//
//  * every graph of a pool records into one shared memory pool: memory dead after graph A is
//    reused by graph B, and two paths A→B and A→B' cost max(A+B, A+B'), not the sum;
//  * graphs form a tree: after A the program may call B or B'; each (parent, function, which
//    outputs are alive) gets its own recording, later calls replay the matching one;
//  * outputs are handed out as leases (`OutputLease`). While a lease exists no replay or
//    recording overwrites its memory; a new step (`mark_step_begin`) reclaims it, and a lease used
//    afterwards fails with `Errc::output_overwritten` instead of returning overwritten data.
//
// Using it (the host backend; `cgt.torch` and `cgt.cuda` look the same with tensors and device
// buffers):
//
//   import cgt;
//   import cgt.host;
//
//   auto pool = cgt::host::make_pool();                          // cgt::Result<cgt::host::Pool>
//   auto twice = pool->add_function(
//       [](cgt::host::Context& ctx, cgt::host::Inputs in) {
//         cgt::host::Buffer y = ctx.allocate_like(in[0]);         // pool memory
//         ctx.launch([x = in[0], y] { for (std::size_t i = 0; i < x.numel(); ++i) y.f32()[i] = 2 * x.f32()[i]; });
//         return cgt::host::Values{y};
//       },
//       {.name = "twice"});                                       // cgt::Result<cgt::host::Function>
//   for (int step = 0; step < 3; ++step) {
//     pool->mark_step_begin();                                    // last step's outputs may be reclaimed
//     auto out = (*twice)({x});                                   // warm-up, record, then replay
//     if (!out) return report(out.error());
//     const cgt::host::Buffer& y = *out->get(0);                  // borrowed; valid while `out` lives
//     // `*(*twice)({x})->get(0)` does not compile: the temporary result would die under `y`.
//   }
//   std::cout << pool->to_dot();
//
// Per call (PyTorch's `CUDAGraphTreeManager._run`), a pool:
//  1. ends the current path if a new step began (reclaiming its memory) or all its outputs are dead;
//  2. falls back to eager execution, with a counted and logged `Reason`, when graphing would be
//     wrong (a mutated input that is neither static nor pool memory, too many re-recordings,
//     too many shape keys, a size outside the allow-list, an input on another device);
//  3. warms the function up on its first call, in the pool;
//  4. replays the first child of the current node recorded for this function whose invariants
//     hold (pool inputs and static inputs at their recorded addresses, the same outputs dead);
//  5. or records a new child, after restoring the allocator to the parent's checkpoint.
//
// Errors are values: every operation that can fail returns `cgt::Result<T>` (a `std::expected`);
// nothing throws, asserts or aborts on a caller's mistake. `Errc` lists the codes. Every handle, in
// every state, gives a value or an `Errc`: a moved-from handle fails with `invalid_argument` (its
// queries return empty values), and after `shutdown()` what needs the pool fails with
// `pool_shut_down`. A call that fails changes nothing the caller holds: a lease moved into it
// still holds its value (unless the failure is a `backend_error` or `invariant_violation` found
// after the call's work was done).
//
// Threads: a pool is called by one thread at a time (`concurrent_use` otherwise), but every handle
// may be dropped or read on any thread, also during another thread's call of the same pool, and
// `mark_step_begin()` may be called from any thread or from inside a pool function (the step
// begins at the next call).
//
// This module is the whole user's surface: the names below, and what the backend modules add in
// their namespaces (`cgt::host`, `cgt::cuda`, `cgt::torch`). A backend of your own is written
// against `cgt.core` (modules/cgt.core.cppm), which also has the backend interface
// (`cgt::backend::Device`, ...) and the `cgt::Arena` allocator; `cgt` re-exports only the user's
// names from it (as `import std;` re-exports the standard library's names).
module;
export module cgt;
import cgt.core;

// clang-tidy 19 takes an exported using-declaration for an unused one.
// NOLINTBEGIN(misc-unused-using-decls)
export namespace cgt {

// Errors (modules/cgt-error.cppm).
using cgt::Cause;      // Error::cause: what kind of failure the pool acted on (decide on it, not on text)
using cgt::Errc;       // what went wrong
using cgt::Error;      // a failure: code, message, function, node, input
using cgt::fail;       // `return cgt::fail(Errc::..., "message")` in code returning a Result
using cgt::Result;     // std::expected<T, Error>: what every fallible operation returns
using cgt::to_string;  // names of Errc, Reason, FunctionMode, CallKind, NodeReason, ElementType values

// Which cgt this is (modules/cgt-version.cppm): the project's version, as find_package compares it.
using cgt::Version;         // major, minor, patch; ordered
using cgt::version;         // the cgt this program was compiled against, e.g. {0, 2, 0}
using cgt::version_string;  // the same as text, e.g. "0.2.0"

// How a pool behaves and reports its decisions (modules/cgt-options.cppm).
using cgt::Buckets;             // FunctionOptions::buckets: capture sizes, padding up to the next one
using cgt::Event;               // one logged decision
using cgt::EventKind;           // what a logged decision did
using cgt::FunctionMode;        // inference, or the forward or backward half of a trained function
using cgt::FunctionOptions;     // one function's static facts: name, static and mutated inputs, sizes, mode
using cgt::LogSink;             // where decisions go
using cgt::OnStaticInputMoved;  // Options::on_static_input_moved
using cgt::Options;             // one pool's behaviour
using cgt::Pad;                 // how a padded input's added rows are filled
using cgt::PadMode;             // Pad::mode: a constant, or the last row again
using cgt::Reason;              // why a call did not replay, or why the pool warns
using cgt::SizeSource;          // FunctionOptions::size_source

// What a pool tells about itself (modules/cgt-info.cppm).
using cgt::Block;        // one allocated block
using cgt::CallKind;     // what one call did: warm-up, recording, replay, eager
using cgt::GraphCounts;  // how the CUDA graphs of cgt.cuda and cgt.torch pools came to be
using cgt::MemoryInfo;   // the pool's memory
using cgt::NodeKind;     // graph or warm-up
using cgt::NodeReason;   // why a node was made
using cgt::Stats;        // counters

// Element types and strided layouts of the host and cuda buffers (modules/cgt-layout.cppm).
using cgt::element_size;
using cgt::ElementType;
using cgt::Layout;
using cgt::max_rank;

// The handles a program holds, templates over a backend (modules/cgt-handles.cppm lists their
// files); each backend names them for its own type, e.g. `cgt::host::Pool`.
using cgt::Arg;          // one argument of a call: a value, a lease (borrowed or moved in), an integer
using cgt::Function;     // a function registered with a pool
using cgt::Node;         // a read-only view of one node of the tree
using cgt::OutputLease;  // a claim on one output: its memory is not reused while the lease lives
using cgt::Outputs;      // the outputs of one call, each held by a lease
using cgt::Owning;       // a Result of a handle that owns pool memory: no borrowing from a temporary
using cgt::PathIndex;    // one output of one node of the current path
using cgt::Pool;         // one graph tree and its memory pool
using cgt::PoolBase;     // what every pool can do, whatever its backend
using cgt::Ref;          // a read-only reference to the value a lease hands out

}  // namespace cgt
// NOLINTEND(misc-unused-using-decls)
