#!/usr/bin/env python3
"""Draws loop.png from the "loop,<batch>,<tokens>,<way>,<wall us/token>,<cpu us/token>" lines of
bench/loop_bench and bench/loop_decode.py (their logs): per token, the wall time (bars) and the
host CPU time (dots, log scale) of each way, one panel per batch size and token count.

    plot_loop.py OUT.png LOG [LOG...]

The table in loop.md is the result; the plot is a convenience: without matplotlib it says so and
exits 0."""
import sys


def rows_of(paths):
    rows = []
    for path in paths:
        with open(path, encoding="utf-8") as log:
            for line in log:
                parts = line.strip().split(",")
                if len(parts) < 6 or parts[0] != "loop":
                    continue
                way = ",".join(parts[3:-2])  # a way's name may hold commas
                rows.append((int(parts[1]), int(parts[2]), way, float(parts[-2]), float(parts[-1])))
    return rows


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    rows = rows_of(sys.argv[2:])
    if not rows:
        print("plot_loop.py: no loop rows in the logs", file=sys.stderr)
        return 1
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_loop.py: matplotlib is not installed; no plot drawn")
        return 0
    panels = sorted({(batch, tokens) for batch, tokens, *_ in rows})
    ways = list(dict.fromkeys(way for _, _, way, _, _ in rows))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 6), sharey=True, squeeze=False)
    for axis, (batch, tokens) in zip(axes[0], panels):
        cells = {way: (wall, cpu) for b, t, way, wall, cpu in rows if (b, t) == (batch, tokens)}
        names = [way for way in ways if way in cells]
        positions = range(len(names))
        axis.barh(positions, [cells[n][0] for n in names], color="tab:blue", label="wall us/token")
        axis.scatter([max(cells[n][1], 0.01) for n in names], positions, color="tab:red", zorder=3,
                     label="CPU us/token")
        axis.set_xscale("log")
        axis.set_yticks(list(positions))
        axis.set_yticklabels(names, fontsize=7)
        axis.invert_yaxis()
        axis.set_title(f"batch {batch}, {tokens} tokens")
        axis.set_xlabel("microseconds per token (log)")
    axes[0][0].legend(loc="lower right", fontsize=7)
    fig.suptitle("Greedy decoding per token: wall and host CPU (bench/results/loop.md)")
    fig.tight_layout()
    fig.savefig(sys.argv[1], dpi=110)
    print(f"plot_loop.py: wrote {sys.argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
