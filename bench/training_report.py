"""The training tables (bench/results/training.md) from the "training,..." CSV lines of
training_bench and bench/training.py, one table per precision, and, where matplotlib is installed,
training.png (CPU time, wall time and peak memory per step of each method).
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
PRECISION = {"fp32": "fp32 matmuls", "tf32": "TF32 matmuls (cuBLAS, every method alike)"}
PICTURE = "![CPU time, wall time and peak memory per training step of each method](training.png)"


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
        if precision and line.startswith("| ") and len(cells) == 6 and cells[0] != "method":
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
    if plot(by_precision, out_dir, f"{gpu}, commit {commit}"):
        lines[1:1] = [PICTURE + "\n\n"]
    for precision, rows in by_precision.items():
        lines += table(precision, rows)
    text = "".join(lines)
    open(f"{out_dir}/training.md", "w").write(text)
    print(f"==> training.md\n{text}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--from-md"]:
        rows, where = read_md(sys.argv[2])
        plot(rows, sys.argv[3], where)
    else:
        main(*sys.argv[1:5])
