// cgt.torch — CUDA graph trees for libtorch.
//
// What `torch.compile(mode="reduce-overhead")` gives Python, for C++ programs on libtorch: the
// functions of a pool take and return `at::Tensor`s (and `int64_t` scalars); their first call
// warms up in the pool's private caching-allocator pool, the next records a CUDA graph into that
// pool, later calls replay it. All graphs of a pool share one memory pool (PyTorch's mechanism:
// `graph_pool_handle`, `beginAllocateToPool`, allocator checkpoints), form a tree, and hand their
// outputs out as leases that are never silently overwritten.
//
//   #include <torch/torch.h>   // your model code; include before the imports
//   import cgt;
//   import cgt.torch;
//
//   auto pool = cgt::torch::make_pool({.device = 0});
//   auto decode = pool->add_function(
//       [&model](std::vector<at::Tensor> in) { return cgt::torch::Values{model->forward(in[0])}; },
//       {.name = "decode"});
//   pool->mark_step_begin();
//   auto out = (*decode)({tokens});               // warm-up, then recording, then replays
//   const at::Tensor& logits = *out->get(0);      // borrowed: valid while `out` lives
//   at::Tensor kept = *out->take(0);              // a copy in ordinary memory, yours to keep
//
// Parameters are best captured by the function (they are then constants, never copied). Inputs
// that are not outputs of an earlier graph of the pool and not declared static are copied into
// pool slots on every replay. A tensor copied out of a lease (an escaped `at::Tensor`, or a view
// of one) is poisoned when the lease's memory is reclaimed: using it raises a `c10::Error` naming
// the function, instead of reading overwritten memory. A static input that moved is re-recorded;
// when the new graph has the old one's topology it updates the old executable in place
// (`PoolOptions::update_graphs_in_place`, counted in `pool.device().graph_counts()`).
//
// A function that cannot be captured (it synchronises: `.item()`, `nonzero`) runs eagerly for
// that shape from then on (`Reason::capture_failed`); the failed capture leaves the process as it
// was. One pool per thread: pools on several threads record and replay concurrently.
module;
export module cgt.torch;
export import cgt;
// One partition, cgt.torch-api.cppm, with its parts:
//   the pool's types: Inputs, Values, Callable, PoolOptions, Device, Backend, Pool..., make_pool
//   cgt.torch-autograd.inc: AutogradFunction, make_autograd_function (pool functions in libtorch's autograd)
//   cgt.torch-optim.inc: capturable Adam and SGD, make_training_step (training: a whole step as one graph)
//   cgt.torch-models.inc: add_jit_module, add_aoti_package (TorchScript modules and AOTInductor packages)
export import :api;
