"""One training step of the transformer of bench/training_bench.cpp in PyTorch, as a user would
write it: eager; torch.compile(mode="reduce-overhead") over the loss with a capturable optimizer
stepping outside the compiled region; and PyTorch's best, the optimizer step compiled under
reduce-overhead too (its learning rate a tensor, so a schedule does not recompile it). fp32 and
tf32 time Adam on one batch; loop times the modern loop of training_bench (AdamW, warm-up +
cosine, clipping at 1.0, bf16 autocast, 4 micro-batches a step). Prints CSV lines like
training_bench:
    training,<configuration>,<method>,<cpu us/step>,<wall us/step>,<peak bytes>
    python3 bench/training.py [steps] [fp32|tf32|loop]
"""
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

LAYERS, HIDDEN, HEADS, BATCH, SEQ = 2, 256, 4, 8, 64
# The modern loop, as training_bench's: micro-batches a step, steps of data cycled, the schedule.
MICRO_BATCHES, LOOP_BATCHES, WARMUP_STEPS = 4, 8, 20
PEAK_LR, FLOOR_LR, MAX_GRAD_NORM, WEIGHT_DECAY = 1e-3, 1e-4, 1.0, 1e-2
UNTIMED_STEPS = 20


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
    for _ in range(UNTIMED_STEPS):
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


def compiled_step(model, x, y, **compile_args):
    # PyTorch's best: the loss as above, and the optimizer's step compiled under reduce-overhead
    # too (PyTorch's recipe for a compiled optimizer); the rate a tensor, as a schedule needs.
    compiled = torch.compile(lambda a, b: F.mse_loss(model(a), b), **compile_args)
    adam = torch.optim.Adam(model.parameters(), lr=torch.tensor(1e-3, device="cuda"), capturable=True)
    update = torch.compile(adam.step, **compile_args)

    def step():
        torch.compiler.cudagraph_mark_step_begin()
        adam.zero_grad(set_to_none=True)
        compiled(x, y).backward()
        update()

    return step


# --- the modern loop -----------------------------------------------------------------------------

def warmup_cosine(t, length):
    """The rate of step t: cgt::torch::lr::warmup_cosine(PEAK_LR, WARMUP_STEPS, length, FLOOR_LR)."""
    if t < WARMUP_STEPS:
        return PEAK_LR * t / WARMUP_STEPS
    if t >= length:
        return FLOOR_LR
    progress = (t - WARMUP_STEPS) / (length - WARMUP_STEPS)
    return FLOOR_LR + (PEAK_LR - FLOOR_LR) * 0.5 * (1 + math.cos(math.pi * progress))


def loop_loss(model, a, b):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(a)
    return F.mse_loss(out.float(), b)


def loop(model, x, y, length, compiled_loss, step_of):
    """The loop around a micro-batch's loss (`compiled_loss`, or eager `loop_loss`) and what
    `step_of(params)` returns: the update (clip, then step), how to set the rate, zero_grad."""
    state = {"t": 0}

    def loop_loss_of(a, b):
        return loop_loss(model, a, b)

    params = list(model.parameters())
    update, set_rate, zero_grad = step_of(params)

    def step():
        t = state["t"]
        state["t"] += 1
        # One generation of the trees per optimizer step: the micro-batches' gradients, which
        # .grad accumulates, are outputs of the step's graphs and must stay live until it ends.
        if compiled_loss:
            torch.compiler.cudagraph_mark_step_begin()
        set_rate(warmup_cosine(t, length))
        zero_grad()
        for a, b in zip(x[t % LOOP_BATCHES].chunk(MICRO_BATCHES), y[t % LOOP_BATCHES].chunk(MICRO_BATCHES)):
            ((compiled_loss or loop_loss_of)(a, b) / MICRO_BATCHES).backward()
        update()

    return step


def eager_loop(model, x, y, length):
    def step_of(params):
        adamw = torch.optim.AdamW(params, lr=PEAK_LR, weight_decay=WEIGHT_DECAY)

        def update():
            torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM)
            adamw.step()

        return update, lambda rate: adamw.param_groups[0].__setitem__("lr", rate), lambda: adamw.zero_grad(True)

    return loop(model, x, y, length, None, step_of)


def reduce_overhead_loop(model, x, y, length, compile_update, **compile_args):
    compiled = torch.compile(lambda a, b: loop_loss(model, a, b), **compile_args)

    def step_of(params):
        # A tensor rate, set in place: the compiled update reads it and does not recompile.
        adamw = torch.optim.AdamW(params, lr=torch.tensor(PEAK_LR, device="cuda"), weight_decay=WEIGHT_DECAY,
                                  capturable=True)

        def clip_and_step():
            torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM)
            adamw.step()

        update = torch.compile(clip_and_step, **compile_args) if compile_update else clip_and_step
        return update, lambda rate: adamw.param_groups[0]["lr"].fill_(rate), lambda: adamw.zero_grad(True)

    return loop(model, x, y, length, compiled, step_of)


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


def run_or_say(precision, name, make, x, y, steps):
    """run, or a row of nan and the error on stderr: one method that does not compile here costs
    only its own row."""
    try:
        run(precision, name, make, x, y, steps)
    except Exception as error:
        print(f"{name} failed ({type(error).__name__}: {str(error)[:300]})", file=sys.stderr)
        print(f"training,{precision},{name},nan,nan,nan", flush=True)
        torch._dynamo.reset()
        torch.cuda.empty_cache()


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    precision = sys.argv[2] if len(sys.argv) > 2 else "fp32"
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.manual_seed(0)
    if precision == "loop":
        # training_bench's loop data: LOOP_BATCHES steps of MICRO_BATCHES micro-batches, y a learnable
        # function of x. The schedule spans every step measure() takes.
        length = UNTIMED_STEPS + 2 * steps
        x = torch.randn(LOOP_BATCHES, MICRO_BATCHES * BATCH, SEQ, HIDDEN, device="cuda")
        y = torch.tanh(x @ (torch.randn(HIDDEN, HIDDEN, device="cuda") / math.sqrt(HIDDEN)))
        run(precision, "eager PyTorch", lambda m, a, b: eager_loop(m, a, b, length), x, y, steps)
        run_or_say(precision, "PyTorch reduce-overhead",
                   lambda m, a, b: reduce_overhead_loop(m, a, b, length, False, mode="reduce-overhead"), x, y, steps)
        torch._dynamo.reset()
        run_or_say(precision, "PyTorch reduce-overhead + compiled optimizer step",
                   lambda m, a, b: reduce_overhead_loop(m, a, b, length, True, mode="reduce-overhead"), x, y, steps)
        return
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
        return
    torch._dynamo.reset()
    run_or_say(precision, "PyTorch reduce-overhead + compiled optimizer step",
               lambda m, a, b: compiled_step(m, a, b, mode="reduce-overhead"), x, y, steps)


if __name__ == "__main__":
    main()
