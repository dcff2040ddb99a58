"""One training step of the transformer of bench/training_bench.cpp in PyTorch: eager, and
torch.compile(mode="reduce-overhead") with a capturable Adam stepping outside the compiled region,
as a user would write it. Prints CSV lines like training_bench:
    training,<precision>,<method>,<cpu us/step>,<wall us/step>,<peak bytes>
    python3 bench/training.py [steps] [fp32|tf32]
"""
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

LAYERS, HIDDEN, HEADS, BATCH, SEQ = 2, 256, 4, 8, 64


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(HIDDEN)
        self.qkv = torch.nn.Linear(HIDDEN, 3 * HIDDEN)
        self.proj = torch.nn.Linear(HIDDEN, HIDDEN)
        self.norm2 = torch.nn.LayerNorm(HIDDEN)
        self.up = torch.nn.Linear(HIDDEN, 4 * HIDDEN)
        self.down = torch.nn.Linear(4 * HIDDEN, HIDDEN)

    def forward(self, x):
        b, s, d = x.shape[0], x.shape[1], HIDDEN // HEADS
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, HEADS, d).permute(2, 0, 3, 1, 4)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d)
        attended = torch.matmul(torch.softmax(scores, -1), v).transpose(1, 2).reshape(b, s, HIDDEN)
        h = x + self.proj(attended)
        return h + self.down(F.gelu(self.up(self.norm2(h))))


class Transformer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = torch.nn.LayerNorm(HIDDEN)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


def measure(step, steps):
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    cpu = []
    for i in range(steps):
        start = time.perf_counter_ns()
        step()
        cpu.append((time.perf_counter_ns() - start) / 1000)
        if i % 4 == 3:  # keep the GPU's queue short (not timed), as training_bench does
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    start = time.perf_counter_ns()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return statistics.median(cpu), (time.perf_counter_ns() - start) / 1000 / steps


def eager(model, x, y):
    adam = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        adam.zero_grad(set_to_none=True)
        F.mse_loss(model(x), y).backward()
        adam.step()

    return step


def reduce_overhead(model, x, y, **compile_args):
    # The loss inside the compiled region; the optimizer outside it, capturable (its state on the
    # device). zero_grad(set_to_none=True): with False, .grad lives in the graphs' pool and is
    # overwritten ("accessing tensor output of CUDAGraphs that has been overwritten").
    compiled = torch.compile(lambda a, b: F.mse_loss(model(a), b), **compile_args)
    adam = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True)

    def step():
        torch.compiler.cudagraph_mark_step_begin()
        adam.zero_grad(set_to_none=True)
        compiled(x, y).backward()
        adam.step()

    return step


def run(precision, name, make, x, y, steps):
    torch.manual_seed(0)
    model = Transformer().cuda()
    torch.cuda.synchronize()
    torch._C._cuda_clearCublasWorkspaces()  # every method counts its own, as training_bench
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    step = make(model, x, y)
    cpu, wall = measure(step, steps)
    torch.cuda.synchronize()
    print(f"training,{precision},{name},{cpu:.3f},{wall:.3f},{torch.cuda.max_memory_allocated()}", flush=True)
    del step, model
    torch.cuda.empty_cache()


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    precision = sys.argv[2] if len(sys.argv) > 2 else "fp32"
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.manual_seed(0)
    x = torch.randn(BATCH, SEQ, HIDDEN, device="cuda")
    y = torch.randn(BATCH, SEQ, HIDDEN, device="cuda")
    run(precision, "eager PyTorch", eager, x, y, steps)
    try:
        run(precision, "PyTorch reduce-overhead", lambda m, a, b: reduce_overhead(m, a, b, mode="reduce-overhead"), x, y, steps)
    except Exception as error:  # no Triton or no compiler on the machine: the trees without Inductor
        print(f"reduce-overhead failed ({type(error).__name__}: {str(error)[:200]}); "
              "using torch.compile(backend='cudagraphs')", file=sys.stderr)
        torch._dynamo.reset()
        run(precision, "PyTorch reduce-overhead (cudagraphs backend)",
            lambda m, a, b: reduce_overhead(m, a, b, backend="cudagraphs"), x, y, steps)


if __name__ == "__main__":
    main()
