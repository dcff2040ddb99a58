"""Python's best for bench/loop_bench.cpp's work: the small decoder of examples/kv_decoder.hpp (the
same architecture, random weights) decoding greedily with a static KV cache, one step per token
under torch.compile(mode="reduce-overhead") (CUDA graphs through PyTorch's trees), the host reading
the stop condition after each token, as a generate loop must. The step is that of
examples/device_decode.hpp: every sequence, a done mask, the stop condition on the device.

Per token: wall time (the generation, its tokens back), and the thread's CPU time until the final
wait (the per-token read waits inside, and that counts). Median of `generations` after two
untimed generations (compilation, recording). Prints a markdown table and
"loop,<batch>,<tokens>,<way>,<wall us/token>,<cpu us/token>" lines on stderr.
    python3 bench/loop_decode.py [generations]
"""
import math
import statistics
import sys
import time

import torch
import torch._dynamo

VOCABULARY, WIDTH, HEADS, LAYERS = 512, 128, 4, 2
HEAD_DIM = WIDTH // HEADS
PROMPT, SLACK = 8, 8


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(WIDTH)
        self.qkv = torch.nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = torch.nn.Linear(WIDTH, WIDTH)
        self.norm2 = torch.nn.LayerNorm(WIDTH)
        self.up = torch.nn.Linear(WIDTH, 4 * WIDTH)
        self.down = torch.nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x, position, positions, keys, values):
        batch = x.size(0)
        parts = self.qkv(self.norm1(x)).view(batch, 3, HEADS, 1, HEAD_DIM)
        keys.index_copy_(2, position, parts[:, 1])
        values.index_copy_(2, position, parts[:, 2])
        scores = torch.matmul(parts[:, 0], keys.transpose(-2, -1)) / math.sqrt(HEAD_DIM)
        scores = scores.masked_fill(positions.gt(position), float("-inf"))
        attended = torch.matmul(torch.softmax(scores, -1), values).reshape(batch, WIDTH)
        h = x + self.proj(attended)
        return h + self.down(torch.nn.functional.gelu(self.up(self.norm2(h))))


class Decoder(torch.nn.Module):
    def __init__(self, max_length):
        super().__init__()
        self.embedding = torch.nn.Embedding(VOCABULARY, WIDTH)
        self.blocks = torch.nn.ModuleList(Layer() for _ in range(LAYERS))
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.head = torch.nn.Linear(WIDTH, VOCABULARY)
        self.register_buffer("positions", torch.arange(max_length))

    def step(self, tokens, position, cache):
        x = self.embedding(tokens)
        for layer, block in enumerate(self.blocks):
            x = block(x, position, self.positions, cache[2 * layer], cache[2 * layer + 1])
        return self.head(self.norm(x))


def make_state(batch, columns, max_length):
    cuda = {"device": "cuda"}
    state = {
        "tokens": torch.zeros(batch, dtype=torch.long, **cuda),
        "position": torch.zeros(1, dtype=torch.long, **cuda),
        "generated": torch.zeros(1, dtype=torch.long, **cuda),
        "out": torch.zeros(batch, columns, dtype=torch.long, **cuda),
        "done": torch.zeros(batch, dtype=torch.bool, **cuda),
        "go_on": torch.zeros(1, dtype=torch.int32, **cuda),
    }
    state["cache"] = [torch.zeros(batch, HEADS, max_length, HEAD_DIM, **cuda) for _ in range(2 * LAYERS)]
    # Written in place by every step: static addresses, as Hugging Face's StaticCache marks its
    # cache, so that the graphs may mutate them.
    for tensor in [*(v for k, v in state.items() if k != "cache"), *state["cache"]]:
        torch._dynamo.mark_static_address(tensor)
    return state


def make_step(model, end_token, max_new):
    def step(tokens, position, generated, out, done, go_on, cache):
        logits = model.step(tokens, position, cache)
        nxt = torch.where(done, torch.full_like(tokens, end_token), logits.argmax(-1))
        out.index_copy_(1, generated, nxt.unsqueeze(1))
        done.logical_or_(nxt == end_token)
        tokens.copy_(nxt)
        position.add_(1)
        generated.add_(1)
        go_on.copy_(torch.logical_and(done.logical_not().any(), generated < max_new))

    return step


def start(model, state, prompt):
    with torch.no_grad():
        for p in range(prompt.size(1) - 1):
            model.step(prompt[:, p].contiguous(), torch.full((1,), p, device="cuda", dtype=torch.long), state["cache"])
        state["tokens"].copy_(prompt[:, -1])
        state["position"].fill_(prompt.size(1) - 1)
        state["generated"].zero_()
        state["out"].fill_(-1)
        state["done"].zero_()
        state["go_on"].fill_(1)


def main():
    generations = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    torch.manual_seed(0)
    print(f"# loop_decode.py on {torch.cuda.get_device_name(0)}, torch {torch.__version__}, {generations} generations per row")
    print("| batch | tokens | way | wall us/token | CPU us/token |\n|---|---|---|---|---|")
    for tokens in (64, 256):
        max_length = PROMPT + tokens + SLACK
        model = Decoder(max_length).cuda().eval()
        for batch in (1, 8):
            prompt = torch.randint(VOCABULARY, (batch, PROMPT), device="cuda")
            state = make_state(batch, tokens + SLACK, max_length)
            step = torch.compile(make_step(model, -1, tokens), mode="reduce-overhead", fullgraph=True)
            walls, cpus = [], []
            with torch.no_grad():
                for g in range(generations + 2):
                    start(model, state, prompt)
                    torch.cuda.synchronize()
                    wall0, cpu0 = time.perf_counter(), time.thread_time()
                    while state["go_on"].item() != 0:
                        torch.compiler.cudagraph_mark_step_begin()
                        step(state["tokens"], state["position"], state["generated"], state["out"], state["done"],
                             state["go_on"], state["cache"])
                    cpu = time.thread_time() - cpu0
                    torch.cuda.synchronize()
                    wall = time.perf_counter() - wall0
                    if g >= 2:
                        walls.append(wall * 1e6 / tokens)
                        cpus.append(cpu * 1e6 / tokens)
            way = "PyTorch reduce-overhead step, reads the stop"
            wall, cpu = statistics.median(walls), statistics.median(cpus)
            print(f"| {batch} | {tokens} | {way} | {wall:.3f} | {cpu:.3f} |")
            print(f"loop,{batch},{tokens},{way},{wall:.3f},{cpu:.3f}", file=sys.stderr)
            sys.stdout.flush()


if __name__ == "__main__":
    main()
