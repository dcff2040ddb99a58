"""The training tables (bench/results/training.md) from the "training,..." CSV lines of
training_bench and bench/training.py, one table per precision.
Usage: python3 bench/training_report.py results.csv out_dir "<commit>" "<gpu>"."""
import collections
import math
import sys

EAGER = "eager libtorch"
WHOLE = ["cgt whole-step graph", "cgt whole-step graph (per-step grads)",
         "cgt AOTInductor whole-step graph",
         "cgt AOTInductor whole-step graph (per-step grads)"]
PER_FUNCTION = "cgt per-function graphs + graphed update"
TARGET_SPEEDUP, TARGET_MEMORY, TARGET_CPU = 5.0, 1.05, 10.0
PRECISION = {"fp32": "fp32 matmuls", "tf32": "TF32 matmuls (cuBLAS, every method alike)"}


def table(precision, rows):
    reduce = next((rows[m] for m in rows if m.startswith("PyTorch reduce-overhead")), None)
    eager_peak = rows.get(EAGER, (math.nan,) * 3)[2]
    lines = [f"\n### {PRECISION.get(precision, precision)}\n\n",
             "| method | CPU us/step | wall us/step | peak MiB | peak vs eager libtorch | wall: reduce-overhead / this |\n",
             "|---|---|---|---|---|---|\n"]
    for name, (cpu, wall, peak) in rows.items():
        if math.isnan(cpu):
            lines.append(f"| {name} | – | – | – | – | – (not measured yet) |\n")
            continue
        speedup = f"{reduce[1] / wall:.2f}x" if reduce else "–"
        lines.append(f"| {name} | {cpu:.1f} | {wall:.1f} | {peak / 2**20:.1f} | {peak / eager_peak:.3f}x | {speedup} |\n")
    for whole in WHOLE:
        if whole in rows and reduce:
            cpu, wall, peak = rows[whole]
            speed_ok = reduce[1] / wall >= TARGET_SPEEDUP
            memory_ok = peak / eager_peak <= TARGET_MEMORY
            lines.append(f"\n{whole}: wall time {reduce[1] / wall:.2f}x below reduce-overhead (target "
                         f"{TARGET_SPEEDUP:.0f}x: {'met' if speed_ok else 'NOT met'}); peak memory "
                         f"{(peak / eager_peak - 1) * 100:+.1f}% against eager libtorch (target at most "
                         f"+{(TARGET_MEMORY - 1) * 100:.0f}%: {'met' if memory_ok else 'NOT met'}).\n")
    if PER_FUNCTION in rows and reduce:
        cpu, wall, peak = rows[PER_FUNCTION]
        lines.append(f"\n{PER_FUNCTION}: CPU {reduce[0] / cpu:.1f}x below reduce-overhead (target "
                     f"{TARGET_CPU:.0f}x: {'met' if reduce[0] / cpu >= TARGET_CPU else 'NOT met'}); wall time "
                     f"{reduce[1] / wall:.2f}x below it (target: at or below: "
                     f"{'met' if wall <= reduce[1] else 'NOT met'}); peak memory {(peak / eager_peak - 1) * 100:+.1f}% "
                     f"against eager libtorch (target at most +{(TARGET_MEMORY - 1) * 100:.0f}%: "
                     f"{'met' if peak / eager_peak <= TARGET_MEMORY else 'NOT met'}).\n")
    return lines


def main(path, out_dir, commit, gpu):
    by_precision = collections.OrderedDict()
    for line in open(path):
        parts = line.strip().split(",")
        if len(parts) == 6 and parts[0] == "training":
            by_precision.setdefault(parts[1], collections.OrderedDict())[parts[2]] = tuple(float(v) for v in parts[3:])
    lines = [f"Measured on {gpu}, commit {commit}, by `scripts/gpu.sh bench` (or `scripts/gpu.sh training`).\n\n",
             "One training step (forward, backward, Adam) of a transformer: 2 layers, hidden 256, 4 heads, "
             "batch 8, seq 64, float32 (tensors; the matmuls in fp32 or TF32 per table). CPU time: median per "
             "step, the GPU's queue drained every 4 steps (not timed); wall time: steps back to back, then a "
             "synchronisation. Peak: the caching allocator's peak of allocated bytes from the model's creation on "
             "(parameters included; cuBLAS workspaces cleared before each method, so each counts its own). The "
             "C++ methods run in bench/training_bench.cpp (eager libtorch: torch::optim::Adam, zero_grad(true)); "
             "the Python ones in bench/training.py (reduce-overhead compiles the loss; Adam(capturable=True) "
             "steps outside it, zero_grad(set_to_none=True)). cgt whole-step graph: cgt::torch::make_training_step "
             "with the capturable Adam, gradients at static addresses; (per-step grads): static_grads = false. "
             "cgt per-function: each block and the norm+loss head as cgt::torch::make_autograd_function (forward "
             "graph; the backward graph recomputes the forward), loss.backward() through them, then the Adam "
             "update as a graph of its own (cgt::torch::make_optimizer_step); the backward graphs accumulate into "
             "the optimizer's gradients. cgt AOTInductor whole-step graph: the forward, the loss and the backward "
             "exported as one AOTInductor package (scripts/aoti_training.py: AOTAutograd's joint graph, "
             "compiled by Inductor), then the capturable Adam, one graph per step "
             "(cgt::torch::load_aoti_gradients + make_training_step_from_gradients).\n"]
    for precision, rows in by_precision.items():
        lines += table(precision, rows)
    text = "".join(lines)
    open(f"{out_dir}/training.md", "w").write(text)
    print(f"==> training.md\n{text}")


if __name__ == "__main__":
    main(*sys.argv[1:5])
