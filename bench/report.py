"""Turns the CSV lines of gpu_bench and pytorch_trees.py into the tables (and the scaling plot)
of bench/results/. Usage: python3 bench/report.py results.csv out_dir "<commit>" "<gpu>"."""
import collections
import sys


def main(path, out_dir, commit, gpu):
    rows = [line.strip().split(",") for line in open(path) if line.count(",") >= 3]
    header = f"Measured on {gpu}, commit {commit}, by scripts/gpu-bench.sh.\n\n"
    files = {}

    overhead = collections.OrderedDict()
    for row in rows:
        if row[0] == "overhead":
            overhead.setdefault(row[1], {})[row[2]] = (float(row[3]), float(row[4]))
    methods = ["eager libtorch", "raw cudaGraphLaunch", "raw CUDAGraph::replay", "cgt.cuda", "cgt.cuda non-blocking", "cgt.torch",
               "PyTorch trees (Python)"]
    lines = [header, "CPU time per call (median, us) and, in brackets, its ratio to raw cudaGraphLaunch; "
             "wall time per call (us) in the second table. All but cgt.cuda and PyTorch trees launch on one "
             "non-blocking side stream; cgt.cuda uses its pool's stream, blocking (the default) or not; "
             "PyTorch trees run on PyTorch's default stream, as torch.compile users do.\n\n",
             "| work | " + " | ".join(methods) + " |\n", "|---" * (len(methods) + 1) + "|\n"]
    wall = ["\n| work (wall us/call) | " + " | ".join(methods) + " |\n", "|---" * (len(methods) + 1) + "|\n"]
    for config, results in overhead.items():
        raw = results.get("raw cudaGraphLaunch", (float("nan"), 0))[0]
        cells = []
        for m in methods:
            if m in results:
                cells.append(f"{results[m][0]:.2f} ({results[m][0] / raw:.2f}x)")
            else:
                cells.append("–")
        lines.append(f"| {config} | " + " | ".join(cells) + " |\n")
        wall.append(f"| {config} | " + " | ".join(f"{results[m][1]:.2f}" if m in results else "–" for m in methods) + " |\n")
    files["overhead.md"] = "".join(lines + wall)

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
               "cgt.cuda updates the first graph's executable in place (cudaGraphExecUpdate) or, with that "
               "option off, instantiates a new one.\n\n",
               "| work | method | warm-up + recording of the first calls | re-recording after a static input moved |\n"
               "|---|---|---|---|\n"]
    for row in rows:
        if row[0] == "capture":
            capture.append(f"| {row[1]} | {row[2]} | {float(row[3]):.3f} | {float(row[4]):.3f} |\n")
    files["capture.md"] = "".join(capture)

    for name, text in files.items():
        with open(f"{out_dir}/{name}", "w") as out:
            out.write(text)
        print(f"==> {name}\n{text}")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, len(scaling), figsize=(4 * max(len(scaling), 1), 3.2))
        for ax, (dim, points) in zip(axes if len(scaling) > 1 else [axes], scaling.items()):
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o")
            ax.set_xscale("log")
            ax.set_xlabel(dim)
            ax.set_ylabel("us per call")
            ax.set_ylim(bottom=0)
            ax.set_title(f"cost per call vs {dim}")
        fig.suptitle(f"cgt.cuda on {gpu}", fontsize=9)
        fig.tight_layout()
        fig.savefig(f"{out_dir}/scaling.png", dpi=110)
    except Exception as error:  # the tables are the result; the plot is a convenience
        print(f"no plot: {error}")


if __name__ == "__main__":
    main(*sys.argv[1:5])
