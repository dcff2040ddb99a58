#!/usr/bin/env python3
"""Reads compute-sanitizer's XML report (memcheck, --leak-check full) and fails on what matters.

    memcheck-report.py report.xml

Every record is counted by kind and listed with the top of its backtrace. The run fails (exit 1)
on any memory error and on any leak, except two kinds that are listed but do not fail it:
  - leaks allocated inside cuBLAS: libtorch keeps one cuBLAS handle per device and thread for the
    life of the process, on purpose (tests/torch/main.cpp creates it first; see docs/);
  - CUDA API errors returned to the caller: the error-path tests provoke them on purpose (a
    synchronize inside a capture, a failed capture's end) and assert that cgt reports them.
"""
import collections
import sys
import xml.etree.ElementTree as ET


def frames(record):
    """The (function, module) of each host frame, innermost first."""
    return [((f.findtext("func") or "?").strip(), (f.findtext("module") or "").strip()) for f in record.iter("frame")]


def allocated_by_cublas(record):
    """Whether the first frame outside the driver (libcuda) is in libcublas."""
    outside_driver = [module for _, module in frames(record) if "libcuda.so" not in module]
    return bool(outside_driver) and "libcublas" in outside_driver[0]


def main(path):
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as error:
        print(f"memcheck report {path} unreadable: {error}")
        return 1
    records = [el for el in root.iter() if el.find("kind") is not None]
    with open(path, encoding="utf-8", errors="replace") as report:
        tagged = report.read().count("<kind>")
    if tagged != len(records):  # a format this script does not know: never pass it silently
        print(f"memcheck report {path}: {tagged} <kind> tags but {len(records)} records understood")
        return 1
    kinds = collections.Counter()
    failing = []
    for record in records:
        kind = (record.findtext("kind") or "").strip()
        if kind.lower().startswith("leak") and allocated_by_cublas(record):
            category = "leak in cuBLAS (libtorch's process-long handle)"
        elif "api" in kind.lower():
            category = "CUDA API error returned to the caller"
        else:
            category = kind
            failing.append(record)
        kinds[category] += 1
        what = " ".join((record.findtext("what/text") or "").split())
        named = [function for function, _ in frames(record) if function != "?"]
        print(f"  {category}: {what} at " + " <- ".join(named[:6]))
    print("memcheck records: " + (", ".join(f"{n} {k}" for k, n in kinds.items()) or "none"))
    print(f"memcheck failing records: {len(failing)}")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
