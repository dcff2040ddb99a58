#!/usr/bin/env python3
"""Plots bench/memory_bench's lines: predicted against recorded pool growth per batch size, and the
pool layouts' bytes. Usage: plot_memory.py OUT.png MEMORY_LOG (skips quietly without matplotlib)."""
import sys


def main() -> int:
    out, log = sys.argv[1], sys.argv[2]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_memory.py: no matplotlib; no plot")
        return 0
    prediction, layouts = [], []
    with open(log, encoding="utf-8") as lines:
        for line in lines:
            parts = line.strip().split(",")
            if parts[0] != "memory":
                continue
            if parts[1] == "prediction":
                prediction.append((int(parts[2]), int(parts[3]) / 2**20, int(parts[4]) / 2**20))
            elif parts[1] == "layout":
                layouts.append((parts[2], int(parts[3]) / 2**20))
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    batches = [str(b) for b, _, _ in prediction]
    x = range(len(batches))
    left.bar([i - 0.2 for i in x], [p for _, p, _ in prediction], 0.4, label="predicted (from the warm-up)")
    left.bar([i + 0.2 for i in x], [m for _, _, m in prediction], 0.4, label="recorded")
    left.set_xticks(list(x), batches)
    left.set_xlabel("batch (recorded smallest first)")
    left.set_ylabel("MiB added to the pool")
    left.legend()
    left.set_title("What a recording adds")
    right.barh([name for name, _ in layouts], [value for _, value in layouts])
    right.set_xlabel("MiB (segments + executables)")
    right.set_title("Six graphs: one pool against one per graph")
    figure.tight_layout()
    figure.savefig(out, dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
