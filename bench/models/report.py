#!/usr/bin/env python3
"""Writes bench/results/models.md from the CSV lines of bench/models/models.py (Python: eager
PyTorch, reduce-overhead, PyTorch's trees) and model_bench (C++: eager libtorch and cgt.torch,
TorchScript and AOTInductor), with each model's targets (issue 12, items 4-6) checked, and, where
matplotlib is installed, models.png (CPU and wall time per call of each model and batch).

  python3 bench/models/report.py RESULTS.csv OUT_DIR COMMIT "GPU NAME"
"""
import collections
import math
import sys

NAMES = {"bert": "BERT-base (Hugging Face BertModel, 128 tokens)", "resnet": "ResNet-18 (torchvision, 224x224)"}
RO = "PyTorch reduce-overhead"
CGT_AOTI = "cgt.torch (AOTI)"
CGT_AOTI_B1 = "cgt.torch (AOTI batch-1 package)"
PICTURE = "![CPU and wall time per call of each model and batch: reduce-overhead against cgt.torch](models.png)"
# The methods models.png shows, in its order: the Python ones, eager libtorch on AOTInductor's kernels,
# and cgt on each format (the memset ablation and eager TorchScript stay in the table).
PLOTTED = {"eager PyTorch": "0.7", RO: "tab:red", "eager libtorch (AOTI)": "tab:orange",
           "cgt.torch (TorchScript)": "tab:cyan", CGT_AOTI: "tab:blue", CGT_AOTI_B1: "tab:purple"}


def read(path):
    serve = collections.OrderedDict()  # (model, batch, method) -> (cpu, wall, latency, diff)
    pools, captures, launches, calls, notes = {}, {}, {}, {}, []
    with open(path) as lines:
        for line in lines:
            fields = line.rstrip("\n").split(",")
            kind = fields[0]
            try:
                if kind == "serve":  # one line per pass: averaged below
                    row = tuple(map(float, fields[4:8]))
                    serve.setdefault((fields[1], int(fields[2]), fields[3]), []).append(row)
                elif kind == "pool":
                    pools[(fields[1], fields[2])] = int(fields[3])
                elif kind == "capture" and len(fields) >= 6:
                    captures[(fields[1], fields[2])] = (fields[3], float(fields[4]), fields[5])
                elif kind == "launch" and len(fields) >= 10 and fields[4] != "capture failed":
                    # Older runs have no "alone" / "after a small kernel" columns: nan there.
                    timings = [float(v) for v in fields[6:14]] + [float("nan")] * (14 - len(fields))
                    launches[(fields[1], int(fields[2]), fields[3])] = (int(fields[4]), int(fields[5]), *timings)
                elif kind == "calls":
                    calls[(fields[1], fields[2])] = (int(fields[3]), int(fields[4]))
                elif kind in ("error", "export", "measure", "nodes", "launchcpu", "rewritten", "rewrittenlaunch",
                              "rewrittenflags", "cgtsplit", "cudacalls", "cgtgraph", "kernelonly", "graphcounts") or (kind == "capture" and "failed" in line):
                    notes.append(line.strip())
            except (ValueError, IndexError):
                notes.append("unparsed: " + line.strip())
    passes = max((len(v) for v in serve.values()), default=0)
    averaged = collections.OrderedDict()
    for key, rows in serve.items():
        averaged[key] = tuple(sum(r[i] for r in rows) / len(rows) for i in range(3)) + (max(r[3] for r in rows),)
    return averaged, passes, pools, captures, launches, calls, notes


def model_section(model, serve, passes, pools, captures, launches, calls):
    out = [f"## {NAMES.get(model, model)}", ""]
    out += ["CPU: the call's CPU time with the GPU idle. Wall: per call, back to back. Latency: one request, "
            f"call + synchronise. Medians, microseconds, averaged over {passes} passes (Python and C++ take "
            "turns). Difference: max |output 0 - eager PyTorch's|.", ""]
    out += ["| batch | method | CPU per call | wall per call | latency | max difference |", "|---|---|---|---|---|---|"]
    batches = sorted({b for (m, b, _) in serve if m == model})
    for batch in batches:
        for (m, b, method), (cpu, wall, latency, diff) in serve.items():
            if m == model and b == batch:
                out.append(f"| {batch} | {method} | {cpu:.1f} | {wall:.1f} | {latency:.1f} | {diff:.3g} |")
    out.append("")

    out += ["Targets (issue 12, item 6): cgt + AOTI wall at or below reduce-overhead, CPU at least 20x below it. "
            "At batch 1 reduce-overhead runs a graph compiled for batch 1 alone (Dynamo specialises sizes 0 and "
            "1); the like-for-like AOTI is the package exported for batch 1.", ""]
    out += ["| batch | package | wall cgt+AOTI / reduce-overhead | CPU reduce-overhead / cgt+AOTI | met |",
            "|---|---|---|---|---|"]
    for batch in batches:
        for method, package in ((CGT_AOTI, "dynamic batch"), (CGT_AOTI_B1, "batch 1")):
            ro, ours = serve.get((model, batch, RO)), serve.get((model, batch, method))
            if not ours:
                continue
            if not ro:
                out.append(f"| {batch} | {package} | missing | missing | no |")
                continue
            wall, cpu = ours[1] / ro[1], ro[0] / ours[0]
            out.append(f"| {batch} | {package} | {wall:.2f}x | {cpu:.1f}x | {'yes' if wall <= 1.0 and cpu >= 20 else 'no'} |")
    out.append("")

    out += ["Launch cost (item 4: cgt's replay at most 10 us of CPU on every graph): the model captured by "
            "libtorch's CUDAGraph as it is, launched raw, and cgt's call (step, input copy, replay), with the GPU "
            "idle. In turn: the raw launch and cgt's call alternate, right after a synchronisation and 1 ms after "
            "one. Alone: each call after call, as serving does. After a small kernel: each right after a small "
            "kernel ran alone. Medians, microseconds; met: cgt's call alone (and after a small kernel).", ""]
    out += ["| batch | format | nodes | memset nodes | raw, in turn | cgt, in turn | raw, 1 ms after | "
            "cgt, 1 ms after | raw, alone | cgt, alone | raw, after a small kernel | cgt, after a small kernel | met |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (m, batch, method), (nodes, memsets, *timings) in sorted(launches.items()):
        if m != model:
            continue
        label = method[method.index("(") + 1:-1]
        ours_alone, ours_after_small = timings[5], timings[7]
        if math.isnan(ours_alone):
            met = "yes" if timings[1] <= 10 else "no"
        else:
            met = "yes" if ours_alone <= 10 and ours_after_small <= 10 else "no"
        cells = " | ".join("-" if math.isnan(t) else f"{t:.1f}" for t in timings)
        out.append(f"| {batch} | {label} | {nodes} | {memsets} | {cells} | {met} |")
    out.append("")

    out += ["Capture time (item 5): warm-up + recording of each batch size in turn, on a fresh pool / tree, "
            "to the end of the recording call, synchronised (milliseconds). PyTorch's trees alone wrap the eager "
            "model (no Dynamo, no Inductor); reduce-overhead includes Dynamo and Inductor compiling at the first "
            "size and again, with a dynamic batch, at the second.", ""]
    out += ["| method | sizes | total | per size |", "|---|---|---|---|"]
    for (m, method), (sizes, total, per_size) in captures.items():
        if m == model:
            out.append(f"| {method} | {sizes} | {total:.1f} | {per_size} |")
    out.append("")
    out += ["| method | pool memory (MiB) | replays | eager calls |", "|---|---|---|---|"]
    for (m, method), reserved in pools.items():
        if m == model:
            replays, eager = calls.get((model, method), ("-", "-"))
            out.append(f"| {method} | {reserved / 2**20:.1f} | {replays} | {eager} |")
    out.append("")
    return out


def plot(serve, out_dir, where):
    """Draws models.png: CPU (top) and wall time (bottom) per call for each model (column) and batch,
    log y (CPU runs from a few us to milliseconds); above cgt + AOTI, its ratio to reduce-overhead,
    the targets' terms. Returns whether it drew: the table is the result, the plot a convenience, so
    without matplotlib or on an error it says so and goes on."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        print(f"no plot: {error}")
        return False
    try:
        models = list(dict.fromkeys(m for (m, _, _) in serve))
        fig, axes = plt.subplots(2, len(models), figsize=(6 * len(models), 7.5), squeeze=False, layout="constrained")
        width = 0.8 / len(PLOTTED)
        for column, model in enumerate(models):
            batches = sorted({b for (m, b, _) in serve if m == model})
            for row, label in enumerate(("CPU per call", "wall per call")):
                ax = axes[row][column]
                lowest, highest = math.inf, 0.0
                for x, batch in enumerate(batches):  # a batch's bars side by side, only the methods it has
                    present = [m for m in PLOTTED if (model, batch, m) in serve]
                    ro = serve.get((model, batch, RO))
                    for i, method in enumerate(present):
                        value = serve[(model, batch, method)][row]
                        lowest, highest = min(lowest, value), max(highest, value)
                        ax.bar(x + (i - (len(present) - 1) / 2) * width, value, width, color=PLOTTED[method],
                               label=method)
                        if method in (CGT_AOTI, CGT_AOTI_B1) and ro:
                            ratio = f"{ro[0] / value:.0f}x less" if row == 0 else f"{value / ro[1]:.2f}x"
                            ax.annotate(ratio, (x + (i - (len(present) - 1) / 2) * width, value), ha="center",
                                        va="bottom", rotation=90, fontsize=7, xytext=(0, 2), textcoords="offset points")
                ax.set_xticks(range(len(batches)), [f"batch {b}" for b in batches])
                ax.set_yscale("log")
                ax.set_ylim(lowest / 2.5, highest * 2)  # on a log axis a bar's length is arbitrary: none vanishes
                plain_log_ticks(ax)
                ax.set_ylabel(f"{label} (us, log scale)")
                ax.grid(axis="y", alpha=0.3)
                ax.set_title(f"{NAMES.get(model, model)}\n{label}; above cgt + AOTI: "
                             + ("how much less CPU than reduce-overhead" if row == 0
                                else "its wall / reduce-overhead's"),
                             fontsize=9)
        handles = {}
        for ax in axes.flat:
            handles.update(zip(*reversed(ax.get_legend_handles_labels())))
        fig.legend([handles[m] for m in PLOTTED if m in handles], [m for m in PLOTTED if m in handles],
                   loc="outside lower center", ncol=3, fontsize=8, frameon=False)
        fig.suptitle(f"Real models served on {where}", fontsize=10)
        fig.savefig(f"{out_dir}/models.png", dpi=110)
        plt.close(fig)
        return True
    except Exception as error:  # a plot never costs the table
        print(f"no plot: {error}")
        return False


def plain_log_ticks(ax):
    """Labels a log axis with plain numbers (2000, not 2x10^3), at 1-2-5 steps where it spans under
    two decades, else at the powers of ten."""
    import matplotlib.ticker as ticker
    low, high = ax.get_ylim()
    steps = [1, 2, 5] if high / low < 100 else [1]
    ax.yaxis.set_major_locator(ticker.LogLocator(subs=steps))
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())


def main():
    if len(sys.argv) < 5:
        print(__doc__)
        return 2
    serve, passes, pools, captures, launches, calls, notes = read(sys.argv[1])
    out = [f"# Real models served from C++", "",
           f"Measured on {sys.argv[4]} at commit `{sys.argv[3]}` by `scripts/gpu.sh bench-models` "
           "(bench/models/: models.py exports and runs the Python methods, model_bench the C++ ones; "
           "random weights, nothing downloaded).", ""]
    if plot(serve, sys.argv[2], f"{sys.argv[4]}, commit {sys.argv[3]} (medians, averaged over {passes} passes)"):
        out += [PICTURE, ""]
    models = list(dict.fromkeys(m for (m, _, _) in serve))
    for model in models:
        out += model_section(model, serve, passes, pools, captures, launches, calls)
    if notes:
        out += ["## Notes from the run", ""] + [f"    {n[:300]}" for n in notes] + [""]
    with open(f"{sys.argv[2]}/models.md", "w") as file:
        file.write("\n".join(out))
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
