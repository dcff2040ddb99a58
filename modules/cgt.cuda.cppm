// cgt.cuda — CUDA graph trees for raw CUDA code.
//
// The pool's memory is the checkpointable arena (cgt::cuda::Arena) over segments from cudaMalloc. A pool
// function receives a `Context`: it allocates pool buffers with `ctx.allocate` and launches its
// kernels on `ctx.stream()`. Warm-ups run them; recordings capture them (cudaStreamBeginCapture in
// thread-local mode) after a copy node per eight copied inputs, instantiate the graph and upload
// it; replays point the copy nodes at the call's inputs (cudaGraphExecKernelNodeSetParams, no
// extra launch) and launch the graph (cudaGraphLaunch) on the pool's stream. A re-recording
// because a static input moved updates the earlier graph's executable in place when the topology
// is the same (cudaGraphExecUpdate; `PoolOptions::update_graphs_in_place`). Inputs and outputs are
// typed device buffer views (`Buffer`: pointer, bytes, element type, shape). Every CUDA status is
// checked and becomes a `cgt::Error`.
//
//   auto pool = cgt::cuda::make_pool({.device = 0});
//   auto scale = pool->add_function([](cgt::cuda::Context& ctx, cgt::cuda::Inputs in) {
//     cgt::cuda::Buffer y = ctx.allocate_like(in[0]);
//     my_scale_kernel<<<blocks, threads, 0, ctx.stream()>>>(in[0].as<float>(), y.as<float>(), n);
//     return cgt::cuda::Values{y};
//   }, {.name = "scale"});
//   auto out = (*scale)({x});                       // x: a cgt::cuda::Buffer on device 0
//   std::vector<double> values = *(*out->get(0)).get().read();   // waits for the device
//
// The pool's stream is a blocking stream by default: work on the legacy default stream
// (cudaMemcpy, say) and the pool's work are ordered (`PoolOptions::blocking_stream`). Copied
// inputs are copied as byte spans into a slot of their own layout: a view whose elements overlap
// or run backwards (a negative stride), or that reaches outside its storage, fails the recording
// with `invalid_argument` (pass a contiguous copy). Zero-element outputs hold no pool memory.
module;
export module cgt.cuda;
export import cgt;
export import :api;  // Buffer, Context, Inputs, Values, Callable, PoolOptions, Device, Pool..., make_pool
