"""The training tables (bench/results/training.md) from the "training,..." CSV lines of
training_bench and bench/training.py, one table per configuration (fp32, tf32, the modern loop),
the loss curves of the modern loop from training_bench's "loss,..." lines, and, where matplotlib
is installed, training.png (CPU time, wall time and peak memory per step of each method) and
training-loss.png (the loss curves).
Usage: python3 bench/training_report.py results.csv out_dir "<commit>" "<gpu>"
       python3 bench/training_report.py --from-md training.md out_dir
The second draws training.png alone from the tables of a training.md this script wrote (GPU runs
keep the tables, not always the CSV lines they came from); it leaves the .md as it is."""
import collections
import math
import re
import sys

EAGER = "eager libtorch"
WHOLE = ["cgt whole-step graph", "cgt whole-step graph (per-step grads)",
         "cgt AOTInductor whole-step graph",
         "cgt AOTInductor whole-step graph (per-step grads)"]
PER_FUNCTION = "cgt per-function graphs + graphed update"
TARGET_SPEEDUP, TARGET_MEMORY, TARGET_CPU = 5.0, 1.05, 10.0
PRECISION = {"fp32": "fp32 matmuls", "tf32": "TF32 matmuls (cuBLAS, every method alike)",
             "loop": "A modern loop: AdamW, warm-up + cosine, clipping at 1.0, bf16 autocast, 4 micro-batches a step"}
PICTURE = "![CPU time, wall time and peak memory per training step of each method](training.png)"
LOSS_PICTURE = "![The modern loop's loss per step: eager libtorch and cgt's training steps](training-loss.png)"
LOOP_CGT = ["cgt training step (a graph per micro-batch)", "cgt training step (one graph per step)"]
LOOP_TEXT = ("The modern loop: one optimizer step is 4 micro-batches of the batch above (forward and backward "
             "each, under bf16 autocast, the losses divided by 4 and the gradients accumulated), gradient "
             "clipping at norm 1.0, AdamW (weight decay 0.01) at the rate of a warm-up + cosine schedule (peak "
             "1e-3 after 20 steps, down to 1e-4), over 8 steps of data cycled, the target a learnable function of "
             "the input. Eager libtorch: the loop as written by hand (the rate set each step, autocast, "
             "clip_grad_norm_). cgt: cgt::torch::make_training_step with micro_batches = 4 and autocast = bf16, the "
             "Adam with max_grad_norm and set_schedule; a graph per micro-batch (a call each) or one graph per step "
             "(all_in_one_call). PyTorch reduce-overhead: the loss (autocast inside) compiled, "
             "AdamW(capturable=True) and clip_grad_norm_ eager; + compiled optimizer step: the clipping and the "
             "step compiled under reduce-overhead too, the rate a tensor (PyTorch's best for this loop).")


def pytorch_best(rows):
    """The fastest wall time of PyTorch's compiled methods (reduce-overhead, with or without the
    optimizer step compiled), or None."""
    walls = [rows[m][1] for m in rows if m.startswith("PyTorch reduce-overhead") and not math.isnan(rows[m][1])]
    return min(walls) if walls else None


def table(precision, rows):
    reduce = next((rows[m] for m in rows if m.startswith("PyTorch reduce-overhead")), None)
    best = pytorch_best(rows)
    eager_peak = rows.get(EAGER, (math.nan,) * 3)[2]
    lines = [f"\n### {PRECISION.get(precision, precision)}\n\n"]
    if precision == "loop":
        lines.append(LOOP_TEXT + "\n\n")
    lines += ["| method | CPU us/step | wall us/step | peak MiB | peak vs eager libtorch | wall: reduce-overhead / this "
              "| wall: PyTorch's best / this |\n",
              "|---|---|---|---|---|---|---|\n"]
    for name, (cpu, wall, peak) in rows.items():
        if math.isnan(cpu):
            lines.append(f"| {name} | – | – | – | – | – | – (not measured) |\n")
            continue
        speedup = f"{reduce[1] / wall:.2f}x" if reduce and not math.isnan(reduce[1]) else "–"
        best_speedup = f"{best / wall:.2f}x" if best else "–"
        lines.append(f"| {name} | {cpu:.1f} | {wall:.1f} | {peak / 2**20:.1f} | {peak / eager_peak:.3f}x | {speedup} "
                     f"| {best_speedup} |\n")
    for name in LOOP_CGT:
        if name in rows and best and EAGER in rows and not math.isnan(rows[name][1]):
            cpu, wall, peak = rows[name]
            lines.append(f"\n{name}: wall time {rows[EAGER][1] / wall:.2f}x below eager libtorch and {best / wall:.2f}x "
                         f"below PyTorch's best; CPU {rows[EAGER][0] / cpu:.0f}x below eager libtorch; peak memory "
                         f"{(peak / eager_peak - 1) * 100:+.1f}% against eager libtorch.\n")
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


def read_md(path):
    """The rows of a training.md this script wrote, as main reads them from the CSV lines:
    {precision: {method: (CPU us, wall us, peak bytes)}} (the peak as the table rounds it, to
    0.1 MiB; "–" cells as nan), and "<gpu>, commit <commit>" from its first line."""
    by_precision, precision = collections.OrderedDict(), None
    names = {title: key for key, title in PRECISION.items()}
    lines = open(path).read().splitlines()
    match = re.match(r"Measured on (.+), commit (\S+), by", lines[0])
    where = f"{match[1]}, commit {match[2]}" if match else path
    for line in lines:
        if line.startswith("### "):
            precision = names.get(line[4:].strip())
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if precision and line.startswith("| ") and len(cells) in (6, 7) and cells[0] != "method":
            values = [math.nan if c == "–" else float(c) for c in cells[1:4]]
            by_precision.setdefault(precision, collections.OrderedDict())[cells[0]] = (
                values[0], values[1], values[2] * 2**20)
    return by_precision, where


def plot(by_precision, out_dir, where):
    """Draws training.png: CPU time (log x: graphs take a few us against milliseconds), wall time
    and peak memory per step of each method, a bar per precision. Returns whether it drew: the table
    is the result, the plot a convenience, so without matplotlib or on an error it says so and goes on."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError as error:
        print(f"no plot: {error}")
        return False
    try:
        methods = list(dict.fromkeys(m for rows in by_precision.values() for m in rows))
        fig, axes = plt.subplots(1, 3, figsize=(15, 1.6 + 0.55 * len(methods)), sharey=True, layout="constrained")
        height = 0.8 / len(by_precision)
        colors = ["tab:blue", "tab:orange", "tab:green"]
        panels = (("CPU time per step\n(us, log scale)", 0, 1),
                  ("wall time per step (us)\nin brackets: reduce-overhead's over it", 1, 1),
                  ("peak allocated (MiB)\ndashed: eager libtorch's + 5%, the target", 2, 2**20))
        for ax, (label, column, unit) in zip(axes, panels):
            for i, (precision, rows) in enumerate(by_precision.items()):
                shown = [(y, m) for y, m in enumerate(methods) if m in rows and not math.isnan(rows[m][column])]
                bars = ax.barh([y + (i - (len(by_precision) - 1) / 2) * height for y, _ in shown],
                               [rows[m][column] / unit for _, m in shown], height, color=colors[i % len(colors)],
                               label=PRECISION.get(precision, precision))
                reduce = next((rows[m][1] for m in rows if m.startswith("PyTorch reduce-overhead")), None)
                labels = [f"{rows[m][column] / unit:.1f}" for _, m in shown]
                if column == 1 and reduce:
                    labels = [f"{rows[m][1]:.0f} ({reduce / rows[m][1]:.2f}x)" for _, m in shown]
                if column == 2:  # inside the bars, clear of the target's line
                    ax.bar_label(bars, labels, fontsize=7, label_type="center", color="white")
                else:
                    ax.bar_label(bars, labels, fontsize=7, padding=2)
            ax.set_xlabel(label)
            ax.grid(axis="x", alpha=0.3)
            ax.margins(x=0.2)
        for peak in {rows[EAGER][2] for rows in by_precision.values() if EAGER in rows}:
            axes[2].axvline(peak * TARGET_MEMORY / 2**20, color="0.3", linestyle="--", linewidth=1)
        axes[0].set_xscale("log")
        cpu = [rows[m][0] for rows in by_precision.values() for m in rows if not math.isnan(rows[m][0])]
        axes[0].set_xlim(min(cpu) / 2, max(cpu) * 5)  # room for the labels on a log axis
        axes[0].xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        axes[0].set_yticks(range(len(methods)), methods, fontsize=8)
        axes[0].invert_yaxis()  # the table's order, top to bottom
        fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=len(by_precision),
                   fontsize=8, frameon=False)
        fig.suptitle(f"One training step of the benchmark transformer, each method, on {where}", fontsize=10)
        fig.savefig(f"{out_dir}/training.png", dpi=110)
        plt.close(fig)
        return True
    except Exception as error:  # a plot never costs the table
        print(f"no plot: {error}")
        return False


def loss_section(curves):
    """The modern loop's losses at a few steps, per method, and each cgt curve's largest relative
    difference from eager libtorch's."""
    eager = curves.get(EAGER)
    marks = [s for s in (1, 10, 50, 100, 150, 200) if eager and s <= len(eager)]
    lines = ["\n### The modern loop's loss curve\n\n",
             f"Each method of the modern loop trained {len(eager) if eager else 0} steps from the same model and "
             "data (training_bench curve; the loss of a step is the mean of its micro-batches'). They differ where "
             "the arithmetic does: cgt's update is one fused kernel, libtorch's AdamW a sequence of operations, "
             "and bf16 carries the rounding differences on.\n\n",
             "| method | " + " | ".join(f"step {s}" for s in marks) + " | largest relative difference from eager |\n",
             "|---|" + "---|" * (len(marks) + 1) + "\n"]
    for name, losses in curves.items():
        diff = "–"
        if eager and name != EAGER and len(losses) == len(eager):
            diff = f"{max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(losses, eager)):.2e}"
        lines.append(f"| {name} | " + " | ".join(f"{losses[s - 1]:.4f}" for s in marks) + f" | {diff} |\n")
    return lines


def plot_losses(curves, out_dir, where):
    """Draws training-loss.png: the loss of each step of each method; returns whether it drew."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        print(f"no loss plot: {error}")
        return False
    try:
        fig, ax = plt.subplots(figsize=(8, 4.5), layout="constrained")
        styles = [("tab:gray", "-", 3.0), ("tab:blue", "--", 1.2), ("tab:orange", ":", 1.2)]
        for (name, losses), (color, style, width) in zip(curves.items(), styles * 3):
            ax.plot(range(1, len(losses) + 1), losses, color=color, linestyle=style, linewidth=width, label=name)
        ax.set_xlabel("optimizer step (4 micro-batches each)")
        ax.set_ylabel("loss (mean of the micro-batches')")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title(f"The modern loop (warm-up + cosine, clipping, bf16, 4 micro-batches)\n{where}", fontsize=9)
        fig.savefig(f"{out_dir}/training-loss.png", dpi=110)
        plt.close(fig)
        return True
    except Exception as error:  # a plot never costs the table
        print(f"no loss plot: {error}")
        return False


def main(path, out_dir, commit, gpu):
    by_precision, curves = collections.OrderedDict(), collections.OrderedDict()
    for line in open(path):
        parts = line.strip().split(",")
        if len(parts) == 6 and parts[0] == "training":
            by_precision.setdefault(parts[1], collections.OrderedDict())[parts[2]] = tuple(float(v) for v in parts[3:])
        if len(parts) == 4 and parts[0] == "loss":
            curves.setdefault(parts[1], []).append(float(parts[3]))
    lines = [f"Measured on {gpu}, commit {commit}, by `scripts/gpu.sh bench-training` (also part of `bench` and "
             "`training`).\n\n",
             "One training step (forward, backward, Adam) of a transformer: 2 layers, hidden 256, 4 heads, "
             "batch 8, seq 64, float32 (tensors; the matmuls in fp32 or TF32 per table). CPU time: median per "
             "step, the GPU's queue drained every 4 steps (not timed); wall time: steps back to back, then a "
             "synchronisation. Peak: the caching allocator's peak of allocated bytes from the model's creation on "
             "(parameters included; cuBLAS workspaces cleared before each method, so each counts its own). The "
             "C++ methods run in bench/training_bench.cpp (eager libtorch: torch::optim::Adam, zero_grad(true)); "
             "the Python ones in bench/training.py (reduce-overhead compiles the loss; Adam(capturable=True) "
             "steps outside it, zero_grad(set_to_none=True); + compiled optimizer step: Adam's step compiled "
             "under reduce-overhead too, its rate a tensor, PyTorch's best). cgt whole-step graph: cgt::torch::make_training_step "
             "with the capturable Adam, gradients at static addresses; (per-step grads): static_grads = false. "
             "cgt per-function: each block and the norm+loss head as cgt::torch::make_autograd_function (forward "
             "graph; the backward graph recomputes the forward), loss.backward() through them, then the Adam "
             "update as a graph of its own (cgt::torch::make_optimizer_step); the backward graphs accumulate into "
             "the optimizer's gradients. cgt AOTInductor whole-step graph: the forward, the loss and the backward "
             "exported as one AOTInductor package (scripts/aoti_training.py: AOTAutograd's joint graph, "
             "compiled by Inductor), then the capturable Adam, one graph per step "
             "(cgt::torch::load_aoti_gradients + make_training_step_from_gradients).\n"]
    if plot(by_precision, out_dir, f"{gpu}, commit {commit}"):
        lines[1:1] = [PICTURE + "\n\n"]
    for precision, rows in by_precision.items():
        lines += table(precision, rows)
    if curves:
        lines += loss_section(curves)
        if plot_losses(curves, out_dir, f"{gpu}, commit {commit}"):
            lines.append("\n" + LOSS_PICTURE + "\n")
    text = "".join(lines)
    open(f"{out_dir}/training.md", "w").write(text)
    print(f"==> training.md\n{text}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--from-md"]:
        rows, where = read_md(sys.argv[2])
        plot(rows, sys.argv[3], where)
    else:
        main(*sys.argv[1:5])
