// cgt.host — the host backend of cgt: graph trees over host memory.
//
// Memory is a best-fit arena over host segments (`Arena`), with checkpoint and restore of its
// block map; "kernels" are closures launched on a host `Stream`; recording captures the closures
// into a `Graph`, and replays run them again on the same addresses. Replays really overwrite
// memory, so tests can catch any output that a replay would clobber. It is cgt's CI backend and
// a dry-run mode for the tree logic of a program.
//
//   auto pool = cgt::host::make_pool();
//   auto cube = pool->add_function([](cgt::host::Context& ctx, cgt::host::Inputs in) {
//     cgt::host::Buffer y = ctx.allocate_like(in[0]);
//     ctx.launch([x = in[0], y] {
//       for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, x.get(i) * x.get(i) * x.get(i));
//     });
//     return cgt::host::Values{y};
//   }, {.name = "cube"});
//   auto out = (*cube)({x});   // x: a cgt::host::Buffer, e.g. Buffer::make(ElementType::f32, {4, 4})
module;
export module cgt.host;
export import cgt;
export import :buffer;  // Buffer, copy, ElementType (cgt::ElementType)
export import :device;  // Context, Inputs, Values, Stream, Graph, Device, PoolOptions, make_pool, Pool...,
                        // Arena, ArenaOptions (the allocator of cgt.core)
