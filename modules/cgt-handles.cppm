// cgt.core:handles — the handles a program holds, one partition each: `Ref` and `OutputLease`
// (cgt-lease.cppm), `Arg` (cgt-arg.cppm), `Owning` and `Outputs` (cgt-outputs.cppm), `Function`
// (cgt-function.cppm), `Node` and `PathIndex` (cgt-node.cppm), `PoolBase` and `Pool`
// (cgt-pool.cppm). They are templates over a backend (cgt::host, cgt::torch, ...); each backend
// module names them, e.g. `cgt::host::Pool`. A backend type `B` provides:
//   using Value    = ...;  // what a call takes and a lease hands out (a buffer view, an at::Tensor)
//   using Callable = ...;  // the user's function
//   using Device   = ...;  // the program's view of a pool's device (`Pool::device()`)
//   static Result<void> describe(const Value&, backend::ArgDesc&);  // fails for unusable values
//   static Result<Value> take(const Value&);                        // copy out of the pool
//   static std::unique_ptr<backend::Invoker> make_invoker(Callable&&);
//   static Device& view(backend::Device&);                          // the view of its device
//
// Every handle, in every state, answers with a value or an `Errc`: a moved-from handle is empty
// (its calls fail with `invalid_argument`, its queries return empty values), and after
// `Pool::shutdown()` what needs the pool fails with `pool_shut_down`. Borrowing is checked by
// the compiler where it can be: a value cannot be borrowed from a temporary `Outputs` or
// `OutputLease` (it would dangle at the end of the statement); name the result first.
export module cgt.core:handles;
export import :lease;
export import :arg;
export import :outputs;
export import :function;
export import :node;
export import :pool;
