"""The training table (bench/results/training.md) from the "training,..." CSV lines of
training_bench and bench/training.py. Usage: python3 bench/training_report.py results.csv out_dir "<commit>" "<gpu>"."""
import math
import sys

EAGER = "eager libtorch"
WHOLE = "cgt whole-step graph"
TARGET_SPEEDUP, TARGET_MEMORY = 5.0, 1.05


def main(path, out_dir, commit, gpu):
    rows = {}
    for line in open(path):
        parts = line.strip().split(",")
        if len(parts) == 5 and parts[0] == "training":
            rows[parts[1]] = tuple(float(v) for v in parts[2:])
    reduce = next((rows[m] for m in rows if m.startswith("PyTorch reduce-overhead")), None)
    eager_peak = rows.get(EAGER, (math.nan,) * 3)[2]
    lines = [f"Measured on {gpu}, commit {commit}, by scripts/gpu-bench.sh.\n\n",
             "One training step (forward, backward, Adam) of a transformer: 2 layers, hidden 256, 4 heads, "
             "batch 8, seq 64, fp32. CPU time: median per step, the GPU's queue drained every 4 steps (not "
             "timed); wall time: steps back to back, then a synchronisation. Peak: the caching allocator's "
             "peak of allocated bytes from the model's creation on (parameters included). The C++ methods run "
             "in training_bench, the Python ones in bench/training.py (reduce-overhead compiles the loss; "
             "Adam(capturable=True) steps outside it).\n\n",
             "| method | CPU us/step | wall us/step | peak MiB | peak vs eager libtorch | wall: reduce-overhead / this |\n",
             "|---|---|---|---|---|---|\n"]
    for name, (cpu, wall, peak) in rows.items():
        if math.isnan(cpu):
            lines.append(f"| {name} | – | – | – | – | – (not measured yet) |\n")
            continue
        speedup = f"{reduce[1] / wall:.2f}x" if reduce else "–"
        lines.append(f"| {name} | {cpu:.1f} | {wall:.1f} | {peak / 2**20:.1f} | {peak / eager_peak:.3f}x | {speedup} |\n")
    if WHOLE in rows and reduce:
        cpu, wall, peak = rows[WHOLE]
        speed_ok = reduce[1] / wall >= TARGET_SPEEDUP
        memory_ok = peak / eager_peak <= TARGET_MEMORY
        lines.append(f"\nTargets of issue 11 for the whole-step graph: wall time at least {TARGET_SPEEDUP:.0f}x below "
                     f"reduce-overhead: {reduce[1] / wall:.2f}x ({'met' if speed_ok else 'NOT met'}); peak memory at most "
                     f"{(TARGET_MEMORY - 1) * 100:.0f}% above eager libtorch: {(peak / eager_peak - 1) * 100:+.1f}% "
                     f"({'met' if memory_ok else 'NOT met'}).\n")
    text = "".join(lines)
    open(f"{out_dir}/training.md", "w").write(text)
    print(f"==> training.md\n{text}")


if __name__ == "__main__":
    main(*sys.argv[1:5])
