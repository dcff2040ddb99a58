#!/usr/bin/env python3
"""The model benchmark's Python half (`scripts/gpu.sh bench-models` runs it; the C++ half is
bench/models/model_bench.cpp):

  python3 bench/models/models.py export DIR [bert|resnet ...]
      Builds the models from the libraries installed (random weights from configs, fixed seed,
      nothing downloaded) and writes, per model:
        DIR/MODEL.pt             TorchScript (torch.jit.trace)
        DIR/MODEL.pt2            AOTInductor package, dynamic batch 1..64
        DIR/MODEL-b1.pt2         AOTInductor package for batch 1 (static, as reduce-overhead's)
        DIR/MODEL-bN.input       a request of batch N (raw bytes: int64 token ids for bert,
                                 float32 images for resnet), N in SIZES
        DIR/MODEL-bN.output      eager PyTorch's first output for it (raw float32), the reference
                                 every method is compared with
  python3 bench/models/models.py measure DIR [bert|resnet ...]
      Serves the same requests with eager PyTorch and torch.compile(mode="reduce-overhead"), and
      times warm-up + recording (to the end of the recording call) of CAPTURE_SIZES with PyTorch's trees alone (cudagraphify_impl
      over the eager model, no Dynamo or Inductor) and with reduce-overhead (compile included).
      Prints CSV lines (bench/models/report.py reads them with model_bench's):
        serve,MODEL,BATCH,METHOD,cpu_us,wall_us,latency_us,max_difference
        pool,MODEL,METHOD,reserved_bytes
        capture,MODEL,METHOD,SIZES,total_ms,per-size ms separated by spaces
      With SECOND_PASS set (serving again, against drift), the capture lines are the startup loops
      instead: the trees over every size, and reduce-overhead's sizes 4-32 after 1 and 2, each as
      one loop synchronised at its ends only (per-size: -).

The models: bert = Hugging Face BertModel (bert-base config: 12 layers, hidden 768, 12 heads,
eager attention) over 128 tokens, outputs (last_hidden_state, pooler_output); resnet =
torchvision resnet18, 224x224 images, outputs the logits.
"""
import os
import shutil
import statistics
import sys
import time

import torch

SIZES = (1, 8, 32)  # the batch sizes of the serving table
CAPTURE_SIZES = (1, 2, 4, 8, 16, 32)  # warm-up + recording of these, one after another
SEQUENCE = 128
MAX_BATCH = 64


class Bert(torch.nn.Module):
    """BertModel with a plain signature for tracing and export: token ids in, a tuple out."""

    def __init__(self):
        super().__init__()
        from transformers import BertConfig, BertModel

        config = BertConfig()  # bert-base sizes
        config._attn_implementation = "eager"  # plain matmul + softmax: the same ops on every path
        self.bert = BertModel(config, add_pooling_layer=True)

    def forward(self, input_ids):
        out = self.bert(input_ids=input_ids, return_dict=False)
        return out[0], out[1]


def make_model(name):
    torch.manual_seed(0)
    if name == "bert":
        model = Bert()
    elif name == "resnet":
        import torchvision

        model = torchvision.models.resnet18(weights=None)
    else:
        raise SystemExit(f"unknown model {name}")
    return model.to("cuda").eval()


def make_input(name, batch):
    generator = torch.Generator(device="cuda").manual_seed(1000 + batch)
    if name == "bert":
        return torch.randint(0, 30522, (batch, SEQUENCE), device="cuda", generator=generator)
    return torch.randn(batch, 3, 224, 224, device="cuda", generator=generator)


def first_output(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def write_raw(tensor, path):
    with open(path, "wb") as file:
        data = tensor.detach().contiguous().cpu().view(torch.uint8).flatten()
        try:
            file.write(data.numpy().tobytes())
        except Exception:  # no numpy: slower
            file.write(bytes(data.tolist()))


def read_raw(path, dtype):
    with open(path, "rb") as file:
        return torch.frombuffer(bytearray(file.read()), dtype=dtype)


def export(directory, names):
    os.makedirs(directory, exist_ok=True)
    if shutil.which("g++"):  # Inductor compiles the package's C++ with $CXX
        os.environ["CXX"] = "g++"
    status = 0
    for name in names:
        try:
            model = make_model(name)
        except Exception as error:  # a library missing on this machine: say so, go on
            print(f"export,{name},cannot build the model: {error}", flush=True)
            status = 1
            continue
        with torch.no_grad():
            for batch in SIZES:
                x = make_input(name, batch)
                write_raw(x, os.path.join(directory, f"{name}-b{batch}.input"))
                write_raw(first_output(model(x)).float(), os.path.join(directory, f"{name}-b{batch}.output"))
            example = make_input(name, 4)
            start = time.time()
            try:
                torch.jit.trace(model, (example,), check_trace=False).save(os.path.join(directory, f"{name}.pt"))
                print(f"export,{name},TorchScript,{time.time() - start:.1f} s", flush=True)
            except Exception as error:
                print(f"export,{name},TorchScript failed: {error}", flush=True)
                status = 1
            start = time.time()
            try:
                batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
                program = torch.export.export(model, (example,), dynamic_shapes=({0: batch},))
                torch._inductor.aoti_compile_and_package(program, package_path=os.path.join(directory, f"{name}.pt2"))
                print(f"export,{name},AOTInductor,{time.time() - start:.1f} s", flush=True)
            except Exception as error:
                print(f"export,{name},AOTInductor failed: {str(error)[:2000]}", flush=True)
                status = 1
            # For batch 1 alone, static: reduce-overhead's batch-1 graph is specialised as well
            # (Dynamo specialises sizes 0 and 1), and static kernels are faster there.
            start = time.time()
            try:
                program = torch.export.export(model, (make_input(name, 1),))
                torch._inductor.aoti_compile_and_package(program, package_path=os.path.join(directory, f"{name}-b1.pt2"))
                print(f"export,{name},AOTInductor batch 1,{time.time() - start:.1f} s", flush=True)
            except Exception as error:
                print(f"export,{name},AOTInductor batch 1 failed: {str(error)[:2000]}", flush=True)
                status = 1
    return status


def timed(call, calls):
    """CPU per call with the GPU idle (synchronised before each call, not timed), wall per call
    (back to back, synchronised at the end), latency of one request (call + synchronise): the
    medians, in microseconds. The same method as model_bench.cpp."""
    for _ in range(10):
        call()
    cpu, latency = [], []
    for _ in range(calls):
        torch.cuda.synchronize()
        start = time.perf_counter_ns()
        call()
        cpu.append((time.perf_counter_ns() - start) / 1000)
    for _ in range(max(calls // 2, 10)):
        torch.cuda.synchronize()
        start = time.perf_counter_ns()
        call()
        torch.cuda.synchronize()
        latency.append((time.perf_counter_ns() - start) / 1000)
    torch.cuda.synchronize()
    start = time.perf_counter_ns()
    for _ in range(calls):
        call()
    torch.cuda.synchronize()
    wall = (time.perf_counter_ns() - start) / 1000 / calls
    return statistics.median(cpu), wall, statistics.median(latency)


def difference(out, reference):
    got = first_output(out).float().flatten().cpu()
    if got.numel() != reference.numel():
        return float("inf")
    return (got - reference).abs().max().item()


def graph_pool_bytes():
    """Bytes of the segments of the cudagraph trees' pool (every private pool: the trees' only)."""
    return sum(s["total_size"] for s in torch.cuda.memory_snapshot() if tuple(s["segment_pool_id"]) != (0, 0))


def warm_up_gpu(seconds=3.0):
    x = torch.zeros(1 << 20, device="cuda")
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(16):
            x.add_(1)
        torch.cuda.synchronize()


def measure(directory, names, calls, second_pass):
    """second_pass: serve again (against drift: `scripts/gpu.sh bench-models` runs Python, C++,
    Python, C++), without the capture lines."""
    from torch._inductor import cudagraph_trees

    warm_up_gpu()
    for name in names:
        try:
            model = make_model(name)
        except Exception as error:
            print(f"measure,{name},cannot build the model: {error}", flush=True)
            continue
        requests = {b: make_input(name, b) for b in SIZES}
        references = {b: read_raw(os.path.join(directory, f"{name}-b{b}.output"), torch.float32) for b in SIZES}
        with torch.no_grad():
            for batch in SIZES:
                x = requests[batch]
                cpu, wall, latency = timed(lambda: model(x), calls)
                diff = difference(model(x), references[batch])
                print(f"serve,{name},{batch},eager PyTorch,{cpu:.1f},{wall:.1f},{latency:.1f},{diff:.3g}", flush=True)

            # PyTorch's trees alone: one tree function per size (as Inductor makes one per static
            # shape), over the eager model. Its first call warms up (the tree manager's add_function
            # runs it once); its outputs die, so the second call records.
            cudagraph_trees.reset_cudagraph_trees()
            per_size = []
            sizes = " ".join(map(str, CAPTURE_SIZES))
            for batch in () if second_pass else CAPTURE_SIZES:
                x = make_input(name, batch)
                torch.cuda.synchronize()
                start = time.perf_counter_ns()
                try:
                    fn = tree_function(model, x)
                    for _ in range(2):  # warm-up, recording
                        fn([x])
                    torch.cuda.synchronize()
                    per_size.append((time.perf_counter_ns() - start) / 1e6)
                    fn([x])  # the first replay, untimed
                except Exception as error:  # a model that synchronises cannot be captured
                    print(f"capture,{name},PyTorch trees failed: {str(error)[:300]}", flush=True)
                    break
                del fn
            if per_size and len(per_size) == len(CAPTURE_SIZES):
                print(f"capture,{name},PyTorch trees (Python; no compile),{sizes},{sum(per_size):.1f},"
                      f"{' '.join(f'{t:.1f}' for t in per_size)}", flush=True)
            if second_pass:
                total = trees_in_one_loop(model, name)
                if total is not None:
                    print(f"capture,{name},PyTorch trees (Python; no compile; one loop),{sizes},{total:.1f},-",
                          flush=True)
            cudagraph_trees.reset_cudagraph_trees()
            torch._dynamo.reset()

            # reduce-overhead as users run it: compiled at the first size, recompiled with a
            # dynamic batch at the second (automatic dynamic shapes), then recorded per size.
            compiled = torch.compile(model, mode="reduce-overhead")

            def call(x):
                torch.compiler.cudagraph_mark_step_begin()
                return compiled(x)

            # The second pass times sizes 4-32 as one startup loop after the compiling sizes 1 and 2
            # (the first pass, each size alone).
            per_size = []
            for batch in CAPTURE_SIZES[:2] if second_pass else CAPTURE_SIZES:
                x = make_input(name, batch)
                torch.cuda.synchronize()
                start = time.perf_counter_ns()
                for _ in range(2):  # warm-up (and compile), recording
                    call(x)
                torch.cuda.synchronize()
                per_size.append((time.perf_counter_ns() - start) / 1e6)
                call(x)  # the first replay, untimed
            if not second_pass:
                print(f"capture,{name},PyTorch reduce-overhead (Python; compile included),{sizes},{sum(per_size):.1f},"
                      f"{' '.join(f'{t:.1f}' for t in per_size)}", flush=True)
            else:
                loop = [make_input(name, batch) for batch in CAPTURE_SIZES[2:]]
                torch.cuda.synchronize()
                start = time.perf_counter_ns()
                for x in loop:
                    for _ in range(2):  # warm-up, recording
                        call(x)
                torch.cuda.synchronize()
                total = (time.perf_counter_ns() - start) / 1e6
                print(f"capture,{name},PyTorch reduce-overhead (Python; one loop after 1 2),"
                      f"{' '.join(map(str, CAPTURE_SIZES[2:]))},{total:.1f},-", flush=True)
            for batch in SIZES:
                x = requests[batch]
                cpu, wall, latency = timed(lambda: call(x), calls)
                diff = difference(call(x), references[batch])
                print(f"serve,{name},{batch},PyTorch reduce-overhead,{cpu:.1f},{wall:.1f},{latency:.1f},{diff:.3g}",
                      flush=True)
            print(f"pool,{name},PyTorch reduce-overhead,{graph_pool_bytes()}", flush=True)
            del compiled
            cudagraph_trees.reset_cudagraph_trees()
            torch._dynamo.reset()
        del model
        torch.cuda.empty_cache()
    return 0


def tree_function(model, example):
    """A function of PyTorch's tree manager of device 0 over `model`, as Inductor makes them (it
    takes a list of inputs and clears it)."""
    from torch._inductor import cudagraph_trees

    def run(args):
        xs = list(args)
        args.clear()
        out = model(*xs)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    return cudagraph_trees.cudagraphify_impl(run, [example], [], device_index=0, is_backward=False, is_inference=True)


def trees_in_one_loop(model, name):
    """Milliseconds for PyTorch's trees to warm up and record every capture size as one startup
    loop, synchronised at its ends only (the trees synchronise around each recording themselves);
    None when they cannot capture the model."""
    from torch._inductor import cudagraph_trees

    cudagraph_trees.reset_cudagraph_trees()
    requests = [make_input(name, batch) for batch in CAPTURE_SIZES]
    functions = []
    torch.cuda.synchronize()
    start = time.perf_counter_ns()
    try:
        for x in requests:
            functions.append(tree_function(model, x))
            for _ in range(2):  # warm-up, recording
                functions[-1]([x])
        torch.cuda.synchronize()
    except Exception:  # reported by the first pass
        return None
    finally:
        del functions
        cudagraph_trees.reset_cudagraph_trees()
    return (time.perf_counter_ns() - start) / 1e6


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("export", "measure"):
        print(__doc__)
        return 2
    names = sys.argv[3:] or ["bert", "resnet"]
    print(f"# torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}", flush=True)
    if sys.argv[1] == "export":
        return export(sys.argv[2], names)
    return measure(sys.argv[2], names, int(os.environ.get("CALLS", "100")), bool(os.environ.get("SECOND_PASS")))


if __name__ == "__main__":
    sys.exit(main())
