"""PyTorch's own CUDA graph trees on the work of gpu_bench.cpp, for the comparison tables.

Uses torch._inductor.cudagraph_trees.cudagraphify_impl directly (what torch.compile's
mode="reduce-overhead" calls for each graph), so that the same function runs through PyTorch's
trees with no Dynamo or Inductor in between. Prints CSV lines like gpu_bench.
    python3 bench/pytorch_trees.py [overhead|memory|capture|all] [calls]
"""
import statistics
import sys
import time

import torch
import torch._dynamo.config
from torch._inductor import cudagraph_trees

ELEMENTS = 256


def torch_work(inputs, kernels):
    y = inputs[0] + 1
    for t in inputs[1:]:
        y = y + t
    for _ in range(kernels - 1):
        y = y + 1
    return y


def tree_function(body, inputs, static_input_idxs):
    """A function of the tree manager of device 0, as Inductor makes them: it takes a list and
    clears it (PyTorch's trees rely on that to free inputs)."""

    def model(args):
        xs = list(args)
        args.clear()
        return [body(xs)]

    return cudagraph_trees.cudagraphify_impl(
        model, list(inputs), static_input_idxs, device_index=0, is_backward=False, is_inference=True
    )


def measure(call, calls):
    for _ in range(20):
        call()
    torch.cuda.synchronize()
    cpu = []
    for i in range(calls):
        start = time.perf_counter_ns()
        call()
        cpu.append((time.perf_counter_ns() - start) / 1000)
        if i % 16 == 15:  # drain the GPU queue (not timed), as gpu_bench does
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    start = time.perf_counter_ns()
    for _ in range(calls):
        call()
    torch.cuda.synchronize()
    wall = (time.perf_counter_ns() - start) / 1000 / calls
    return statistics.median(cpu), wall


def overhead_of(kernels, count, copied, calls, report=True):
    cudagraph_trees.reset_cudagraph_trees()
    config = f"K={kernels} inputs={count} {'copied' if copied else 'static'}"
    inputs = [torch.rand(ELEMENTS, device="cuda") for _ in range(count)]
    static = [] if copied else list(range(count))
    fn = tree_function(lambda xs: torch_work(xs, kernels), inputs, static)

    def call():
        out = fn(list(inputs))
        del out

    cpu, wall = measure(call, calls)
    if report:
        print(f"overhead,{config},PyTorch trees (Python),{cpu:.3f},{wall:.3f}", flush=True)


def warm_up(seconds):
    """Keeps the GPU busy for a few seconds before measuring, as gpu_bench does (an idle GPU comes
    back slowly)."""
    x = torch.zeros(ELEMENTS, device="cuda")
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(16):
            x.add_(1)
        torch.cuda.synchronize()


def overhead(calls):
    warm_up(5.0)
    overhead_of(1, 1, False, calls, report=False)  # and once through the trees, unreported, as gpu_bench
    for kernels in (1, 10, 100):
        for count in (1, 4):
            for copied in (False, True):
                overhead_of(kernels, count, copied, calls)


def pool_memory():
    manager = cudagraph_trees.get_container(0).tree_manager
    pool = manager.cuda_graphs_thread_pool
    reserved = allocated = 0
    for segment in torch.cuda.memory_snapshot():
        if segment["segment_pool_id"] == pool:
            reserved += segment["total_size"]
            allocated += sum(b["size"] for b in segment["blocks"] if b["state"] == "active_allocated")
    return reserved, allocated


def memory():
    cudagraph_trees.reset_cudagraph_trees()
    x = torch.rand(16 << 20, device="cuda")
    a = tree_function(lambda xs: xs[0] * 2, [x], [])
    b = tree_function(lambda xs: xs[0] + 1, [a([x])[0]], [])
    c = tree_function(lambda xs: xs[0] * 3, [a([x])[0]], [])
    peak = 0
    for second in (b, c):
        for _ in range(3):
            out_a = a([x])
            out_b = second([out_a[0]])
            peak = max(peak, pool_memory()[1])
            del out_a, out_b
    reserved, _ = pool_memory()
    print(f"memory,branching A->B and A->B' (64 MiB tensors),PyTorch trees (Python),{reserved},{peak}", flush=True)

    cudagraph_trees.reset_cudagraph_trees()
    weight = torch.rand(4096, 4096, device="cuda") / 64
    peak = 0
    for batch in (1, 8):
        tokens = torch.rand(batch, 4096, device="cuda")
        decode = tree_function(lambda xs: torch.tanh(xs[0] @ weight), [tokens], [])
        for _ in range(4):
            out = decode([tokens])
            peak = max(peak, pool_memory()[1])
            del out
    reserved, _ = pool_memory()
    print(f"memory,decode loop batch 1 and 8,PyTorch trees (Python),{reserved},{peak}", flush=True)


def capture(moves=8):
    """Warm-up + recording of the first calls, and the median re-recording after a static input
    moved to a new address, for K kernels."""
    torch._dynamo.config.inline_inbuilt_nn_modules = True  # re-record when a static input moves
    # The first pass, unreported, pays the process's first-use costs, as in gpu_bench.
    for kernels, reported in ((10, False), (10, True), (100, True)):
        cudagraph_trees.reset_cudagraph_trees()
        x = torch.rand(ELEMENTS, device="cuda")
        weights = [torch.rand(ELEMENTS, device="cuda") for _ in range(moves + 1)]
        torch.cuda.synchronize()
        start = time.perf_counter_ns()
        fn = tree_function(lambda xs, k=kernels: torch_work(xs, k), [x, weights[0]], [1])
        fn([x, weights[0]])  # the first call: a warm-up (making the function runs nothing)
        fn([x, weights[0]])  # its outputs died: the recording
        torch.cuda.synchronize()
        first = (time.perf_counter_ns() - start) / 1e6
        moved = []
        for w in weights[1:]:
            start = time.perf_counter_ns()
            fn([x, w])
            torch.cuda.synchronize()
            moved.append((time.perf_counter_ns() - start) / 1e6)
        moved.sort()
        if reported:
            print(f"capture,K={kernels},PyTorch trees (Python),{first:.3f},{moved[len(moved) // 2]:.3f}", flush=True)


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "all"
    calls = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    with torch.no_grad():
        if what in ("overhead", "all"):
            overhead(calls)
        if what in ("memory", "all"):
            memory()
        if what in ("capture", "all"):
            capture()
