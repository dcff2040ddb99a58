"""Turns the CSV lines of gpu_bench and pytorch_trees.py into the tables of bench/results/ and, where
matplotlib is installed, their plots (overhead.png, scaling.png).
Usage: python3 bench/report.py results.csv out_dir "<commit>" "<gpu>"."""
import collections
import statistics
import sys


RAW = "raw cudaGraphLaunch"
RAW_BLOCKING = "raw cudaGraphLaunch (blocking stream)"
RAW_TORCH = "raw cudaGraphLaunch (libtorch graph)"
METHODS = ["eager libtorch", RAW, RAW_BLOCKING, RAW_TORCH, "raw CUDAGraph::replay", "cgt.cuda", "cgt.cuda non-blocking", "cgt.torch",
           "PyTorch trees (Python)"]
# Each method against the raw launch of the same graph on the same kind of stream: the raw kernels'
# graph for cgt.cuda (its default pool stream is blocking, like RAW_BLOCKING's), the libtorch ops'
# graph for the libtorch methods (they differ with 4 inputs: 1 kernel against 4).
BASELINE = {RAW: RAW, RAW_BLOCKING: RAW_BLOCKING, "cgt.cuda": RAW_BLOCKING, "cgt.cuda non-blocking": RAW}
TARGET_STATIC, TARGET_COPIED, TARGET_TREES = 1.5, 2.0, 10.0
TARGET_STATIC_27 = 1.25  # issue 27, item 5: static inputs (copied inputs and trees as issue 4)
PICTURES = {"overhead.png": "CPU time per call: raw cudaGraphLaunch, cgt.cuda, cgt.torch and PyTorch's trees",
            "scaling.png": "cgt.cuda's CPU time per call as the tree grows"}
PLOTTED = [RAW, "cgt.cuda", "cgt.torch", "PyTorch trees (Python)"]  # the raw launch first: the reference


def median_round(values):
    """The median over rounds of (CPU, wall) per call, each taken on its own."""
    return tuple(statistics.median(v[i] for v in values) for i in range(2))


def overhead_tables(overhead):
    """The CPU and wall tables, then the targets of issue 4 cell by cell."""
    nan = (float("nan"), float("nan"))
    lines = ["CPU time per call (median, us) and, in brackets, its ratio to the raw cudaGraphLaunch of the same "
             "graph on the same kind of stream: the raw kernels' graph for the raw launches and cgt.cuda, the "
             "libtorch ops' graph for the others (with 4 inputs the libtorch ops are 4 kernels where the raw work "
             "sums in one). Methods are measured interleaved, in 10 rounds, with the GPU's queue drained every 16 "
             "calls (not timed), after 5 s of launches; the C++ and Python processes take turns 3 times, and each "
             "cell is the median of its 3 values. Wall time per call (us) in the second table. All but cgt.cuda, "
             "the blocking raw launch and PyTorch trees launch on one non-blocking side stream; cgt.cuda uses its "
             "pool's stream, blocking (the default, against the raw launch on a blocking stream) or not (against "
             "the raw launch on the side stream); PyTorch trees run on PyTorch's default stream, in their own "
             "process, as torch.compile users do.\n\n",
             "| work | " + " | ".join(METHODS) + " |\n", "|---" * (len(METHODS) + 1) + "|\n"]
    wall = ["\n| work (wall us/call) | " + " | ".join(METHODS) + " |\n", "|---" * (len(METHODS) + 1) + "|\n"]
    targets = ["\nThe targets of issue 4, cell by cell (CPU time): cgt at most "
               f"{TARGET_STATIC}x the raw launch of its graph (on the same kind of stream) with static inputs, at "
               f"most {TARGET_COPIED}x with copied inputs (the raw launch then includes its cudaMemcpyAsync), and at "
               f"least {TARGET_TREES}x less than PyTorch's trees. In brackets, cgt.torch against the raw kernels' "
               f"graph. The last column: issue 27's, at most {TARGET_STATIC_27}x with static inputs.\n\n",
               "| work | cgt.cuda / raw (blocking) | cgt.cuda non-blocking / raw | cgt.torch / raw (libtorch graph) "
               "| trees / cgt.cuda | trees / cgt.torch | met | met (issue 27) |\n", "|---|---|---|---|---|---|---|---|\n"]
    for config, results in overhead.items():
        cpu = {m: results.get(m, nan)[0] for m in METHODS}
        cells = []
        for m in METHODS:
            base = cpu[BASELINE.get(m, RAW_TORCH)]
            cells.append(f"{cpu[m]:.2f} ({cpu[m] / base:.2f}x)" if m in results else "–")
        lines.append(f"| {config} | " + " | ".join(cells) + " |\n")
        wall.append(f"| {config} | " + " | ".join(f"{results[m][1]:.2f}" if m in results else "–" for m in METHODS)
                    + " |\n")
        cuda_ratio = cpu["cgt.cuda"] / cpu[RAW_BLOCKING]
        non_blocking_ratio = cpu["cgt.cuda non-blocking"] / cpu[RAW]
        torch_ratio = cpu["cgt.torch"] / cpu[RAW_TORCH]
        trees = cpu["PyTorch trees (Python)"]

        def meets(static_limit):
            limit = TARGET_COPIED if "copied" in config else static_limit
            return (max(cuda_ratio, non_blocking_ratio, torch_ratio) <= limit
                    and trees / cpu["cgt.cuda"] >= TARGET_TREES and trees / cpu["cgt.torch"] >= TARGET_TREES)

        targets.append(f"| {config} | {cuda_ratio:.2f}x | {non_blocking_ratio:.2f}x | {torch_ratio:.2f}x "
                       f"({cpu['cgt.torch'] / cpu[RAW]:.2f}x) "
                       f"| {trees / cpu['cgt.cuda']:.1f}x | {trees / cpu['cgt.torch']:.1f}x | "
                       f"{'yes' if meets(TARGET_STATIC) else '**no**'} | "
                       f"{'yes' if meets(TARGET_STATIC_27) else '**no**'} |\n")
    return "".join(lines + wall + targets)


def diagnose_table(rows):
    """`gpu_bench diagnose`: each method's CPU time per call (median over its repeats) and what it
    costs over the raw cudaGraphLaunch of the same work."""
    repeats = collections.OrderedDict()
    for row in rows:
        if row[0] == "diagnose":
            repeats.setdefault(row[1], collections.OrderedDict()).setdefault(row[2], []).append(float(row[3]))
    lines = ["Where a replay's CPU time over a raw launch goes (`gpu_bench diagnose`, static inputs, one kernel): "
             "each method's CPU time per call (us; the median over 3 repeats of 3000 interleaved calls) and, in "
             "brackets, its difference from the raw cudaGraphLaunch of the same graph (the raw kernels', or libtorch's for the libtorch rows) on the same non-blocking stream. \"the engine "
             "alone\" is the same call shape through a host pool whose graph launches nothing: the bookkeeping on "
             "this CPU.\n\n"]
    for config, methods in repeats.items():
        raw = {name: statistics.median(methods.get(name, [float("nan")])) for name in (RAW, RAW_TORCH)}
        lines += [f"\n| {config} | us per call |\n", "|---|---|\n"]
        for method, values in methods.items():
            us = statistics.median(values)
            if method.startswith("the engine alone"):
                lines.append(f"| {method} | {us:.3f} |\n")
                continue
            torch_graph = "libtorch graph" in method or method == "cgt.torch"
            lines.append(f"| {method} | {us:.3f} ({us - raw[RAW_TORCH if torch_graph else RAW]:+.3f}) |\n")
    return "".join(lines)


def main(path, out_dir, commit, gpu):
    rows = [line.strip().split(",") for line in open(path) if line.count(",") >= 3]
    header = f"Measured on {gpu}, commit {commit}, by `scripts/gpu.sh bench`.\n\n"
    files = {}

    rounds = collections.OrderedDict()  # `scripts/gpu.sh bench` measures the overhead in rounds
    for row in rows:
        if row[0] == "overhead":
            rounds.setdefault(row[1], {}).setdefault(row[2], []).append((float(row[3]), float(row[4])))
    overhead = collections.OrderedDict(
        (config, {m: median_round(values) for m, values in methods.items()}) for config, methods in rounds.items())
    files["overhead.md"] = header + overhead_tables(overhead)
    if any(row[0] == "diagnose" for row in rows):
        files["diagnose.md"] = header + diagnose_table(rows)

    memory = [header, "| work | method | pool bytes reserved | peak allocated |\n|---|---|---|---|\n"]
    for row in rows:
        if row[0] == "memory":
            memory.append(f"| {row[1]} | {row[2]} | {int(row[3]) / 2**20:.1f} MiB | {int(row[4]) / 2**20:.1f} MiB |\n")
    files["memory.md"] = "".join(memory)

    scaling = collections.defaultdict(list)
    for row in rows:
        if row[0] == "scaling":
            scaling[row[1]].append((int(row[2]), float(row[3])))
    table = [header, "cgt.cuda, CPU time of one call (median, us) as the tree grows.\n\n",
             "| dimension | size | us per call |\n|---|---|---|\n"]
    for dim, points in scaling.items():
        for size, us in points:
            table.append(f"| {dim} | {size} | {us:.2f} |\n")
    files["scaling.md"] = "".join(table)

    capture = [header, "Wall time, ms. Re-recording: the median of 8 moves of a static input to a new address; "
               "cgt updates the first graph's executable in place (cudaGraphExecUpdate) or, with that "
               "option off, instantiates a new one.\n\n",
               "| work | method | warm-up + recording of the first calls | re-recording after a static input moved |\n"
               "|---|---|---|---|\n"]
    for row in rows:
        if row[0] == "capture":
            capture.append(f"| {row[1]} | {row[2]} | {float(row[3]):.3f} | {float(row[4]):.3f} |\n")
    files["capture.md"] = "".join(capture)

    drawn = plots(out_dir, overhead, scaling, f"{gpu}, commit {commit}")
    for name, text in files.items():
        png = name.replace(".md", ".png")
        if png in drawn:  # the picture goes under the header line, linked only where it was drawn
            text = text.replace(header, f"{header}![{PICTURES[png]}]({png})\n\n", 1)
        with open(f"{out_dir}/{name}", "w") as out:
            out.write(text)
        print(f"==> {name}\n{text}")


def plots(out_dir, overhead, scaling, where):
    """Draws overhead.png and scaling.png into out_dir; returns the names drawn. The tables are the
    result and the plots a convenience: without matplotlib, or where one fails, it says so and goes on."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        print(f"no plots: {error}")
        return set()
    drawn = set()
    for name, draw, data in (("overhead.png", plot_overhead, overhead), ("scaling.png", plot_scaling, scaling)):
        try:
            fig = draw(plt, data, where)
            fig.savefig(f"{out_dir}/{name}", dpi=110)
            plt.close(fig)
            drawn.add(name)
        except Exception as error:  # a plot never costs the tables
            print(f"no {name}: {error}")
    return drawn


def plot_overhead(plt, overhead, where):
    """CPU time per call of each work cell, one panel for static and one for copied inputs, log y:
    PyTorch's trees cost 10-30x the others. With copied inputs the raw launch includes its
    cudaMemcpyAsync per input, which cgt does with a node of the graph, hence cgt below it."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True, layout="constrained")
    width = 0.8 / len(PLOTTED)
    colors = {RAW: "0.55", "cgt.cuda": "tab:blue", "cgt.torch": "tab:green", "PyTorch trees (Python)": "tab:red"}
    for ax, kind in zip(axes, ("static", "copied")):
        configs = [c for c in overhead if c.endswith(kind)]
        for i, method in enumerate(PLOTTED):
            xs = [x + (i - (len(PLOTTED) - 1) / 2) * width for x, c in enumerate(configs) if method in overhead[c]]
            ys = [overhead[c][method][0] for c in configs if method in overhead[c]]
            ax.bar(xs, ys, width, label=method, color=colors[method])
        for x, config in enumerate(configs):  # cgt.cuda against the raw launch, the trees against cgt.cuda
            cpu = overhead[config]
            for method, base, offset in (("cgt.cuda", RAW, -0.5), ("PyTorch trees (Python)", "cgt.cuda", 1.5)):
                if method in cpu and base in cpu:
                    ratio = cpu[method][0] / cpu[base][0]
                    text = f"{ratio:.2f}x" if ratio < 10 else f"{ratio:.0f}x"
                    ax.annotate(text, (x + offset * width, cpu[method][0]),
                                ha="center", va="bottom", fontsize=7, xytext=(0, 1), textcoords="offset points",
                                rotation=90 if ratio < 10 else 0)
        ax.set_xticks(range(len(configs)))
        ax.set_xticklabels([c.replace(f" {kind}", "").replace(" inputs=", "\ninputs=") for c in configs], fontsize=8)
        ax.set_yscale("log")
        top = max([100] + [2 * overhead[c][m][0] for c in configs for m in PLOTTED if m in overhead[c]])
        ticks = [t for t in (0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000) if t <= top]
        ax.set_ylim(0.5, top)
        ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
        ax.set_xlabel("work: K kernels, inputs")
        ax.set_title(f"{kind} inputs" + (" (raw = launch + one cudaMemcpyAsync per input)" if kind == "copied" else ""),
                     fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("CPU time per call (us, log scale)")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=len(PLOTTED),
               fontsize=8, frameon=False)
    fig.suptitle(f"CPU time per call, median of 3 rounds, on {where}\n"
                 "above cgt.cuda: its factor over the raw launch; above the trees: theirs over cgt.cuda", fontsize=9)
    return fig


def plot_scaling(plt, scaling, where):
    fig, axes = plt.subplots(1, len(scaling), figsize=(4 * max(len(scaling), 1), 3.2))
    for ax, (dim, points) in zip(axes if len(scaling) > 1 else [axes], scaling.items()):
        xs, ys = zip(*points)
        ax.plot(xs, ys, marker="o")
        ax.set_xscale("log")
        ax.set_xlabel(dim)
        ax.set_ylabel("CPU time per call (us)")
        ax.set_ylim(bottom=0)
        ax.set_title(f"cost per call vs {dim}")
    fig.suptitle(f"cgt.cuda on {where}", fontsize=9)
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    main(*sys.argv[1:5])
