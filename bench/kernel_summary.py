#!/usr/bin/env python3
"""Summarises an Nsight Compute per-kernel CSV (ncu --metrics gpu__time_duration.sum
--print-summary per-kernel --csv) per training step: kernels per step, GPU time per kernel
name, largest first. Steps are counted by the invocations of the kernel whose name contains
STEP_KERNEL (the fused Adam's multi_tensor_apply_kernel: one per step).

  kernel_summary.py NCU_CSV [STEP_KERNEL] > summary.md
"""
import csv
import sys


def main():
    lines = open(sys.argv[1]).read().splitlines()
    marker = sys.argv[2] if len(sys.argv) > 2 else "FusedOptimizerTensorListMetadata"
    start = next(i for i, line in enumerate(lines) if line.startswith('"Process ID"'))
    rows = list(csv.DictReader(lines[start:]))
    number = lambda text: float(text.replace(",", ""))
    steps = max(int(r["Invocations"]) for r in rows if marker in r["Kernel Name"])
    kernels = []
    for r in rows:
        per_step = int(r["Invocations"]) / steps
        average_us = number(r["Average"]) / 1000
        kernels.append((per_step * average_us, per_step, average_us, r["Kernel Name"], r["Grid Size"]))
    kernels.sort(reverse=True)
    total = sum(k[0] for k in kernels)
    print(f"{steps} steps profiled; {sum(k[1] for k in kernels):.0f} kernels and {total:.0f} us of kernel time "
          "per step (each kernel alone, at the clocks and cold caches Nsight Compute sets).\n")
    print("| us per step | share | kernels per step | us each | grid | kernel |")
    print("|---|---|---|---|---|---|")
    for time, count, each, name, grid in kernels:
        if time < 0.005 * total:
            continue
        short = name if len(name) <= 90 else name[:87] + "..."
        print(f"| {time:.1f} | {100 * time / total:.1f}% | {count:.2f} | {each:.2f} | {grid} | `{short}` |")


if __name__ == "__main__":
    main()
