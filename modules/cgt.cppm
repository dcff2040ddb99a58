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
// This module is the whole user's surface: the handles below, the vocabulary they speak (module
// cgt.vocabulary, re-exported whole), and what the backend modules add in their namespaces
// (`cgt::host`, `cgt::cuda`, `cgt::torch`). It defines the handles; the engine behind them and the
// interface a backend implements are module `cgt.core` (modules/cgt.core.cppm), which this module
// imports without exporting: a program that imports `cgt` and a backend cannot name the engine,
// the backend interface or a backend's device class (tests/compile_fail).
//
// The handles, one partition each, are templates over a backend `B` (each backend module names
// them for its own, e.g. `cgt::host::Pool` is `cgt::Pool<B>` of the host's `B`, a class programs
// cannot name). Every handle, in every state, answers with a value or an `Errc`: a moved-from
// handle is empty (its calls fail with `invalid_argument`, its queries return empty values), and
// after `Pool::shutdown()` what needs the pool fails with `pool_shut_down`. Borrowing is checked by
// the compiler where it can be: a value cannot be borrowed from a temporary `Outputs` or
// `OutputLease` (it would dangle at the end of the statement); name the result first.
module;
export module cgt;

// The vocabulary (modules/cgt.vocabulary.cppm): errors (`Errc`, `Error`, `Result`, `fail`,
// `Cause`), the version, options (`Options`, `FunctionOptions`, `Reason`, `Event`, `LogSink`,
// `Buckets`, `Pad`, `OverBudget`, ...), what a pool tells (`Stats`, `MemoryInfo`, `MemoryReport`,
// `NodeMemory`, `Block`, `CallKind`, `NodeKind`, `NodeReason`, `GraphCounts`, `PathIndex`),
// element types and layouts, `to_string`.
export import cgt.vocabulary;

export import :lease;     // OutputLease: a claim on one output; Ref: the value it lends (modules/cgt-lease.cppm)
export import :arg;       // Arg: one argument of a call: a value, a lease (borrowed or moved in), an integer
export import :outputs;   // Outputs: the outputs of one call; Owning: a Result that cannot be borrowed from
export import :function;  // Function: a function registered with a pool; calling it
export import :node;      // Node: a read-only view of one node of the tree
export import :pool;      // PoolBase, Pool: one graph tree and its memory pool
