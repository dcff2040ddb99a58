#!/usr/bin/env python3
"""Reads compute-sanitizer's XML report (memcheck, --leak-check full) and says what it found.

    memcheck-report.py report.xml

Lists every record (memory error, leak, CUDA API error) with what it says and the top of its
host backtrace, counts them by kind, and exits 1 if there is any: a clean run has none.
One kind of record is known and not counted: the memory of libtorch's cuDNN handle, which
at::native::getCudnnHandle creates at the first cuDNN call of a thread and keeps for the process
(its pool of handles is never destroyed at exit), so a test that runs a cuDNN convolution ends
with three "leaks" inside cudnnCreate that no cgt code allocated.
"""
import collections
import sys
import xml.etree.ElementTree as ET


def frames(record):
    """The (function, module) of each host frame, innermost first."""
    return [((f.findtext("func") or "?").strip(), (f.findtext("module") or "").strip()) for f in record.iter("frame")]


def is_cudnn_handle(record, kind):
    """A leak of libtorch's per-process cuDNN handle (see the module's docstring)."""
    names = [function for function, _ in frames(record)]
    return kind == "Leak" and any(n.startswith("cudnnCreate") for n in names) and \
        any("getCudnnHandle" in n for n in names)


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
    known = 0
    for record in records:
        kind = (record.findtext("kind") or "").strip()
        if is_cudnn_handle(record, kind):
            known += 1
            continue
        kinds[kind] += 1
        what = " ".join((record.findtext("what/text") or "").split())
        named = [function for function, _ in frames(record) if function != "?"]
        print(f"  {kind}: {what} at " + " <- ".join(named[:6]))
    print("memcheck records: " + (", ".join(f"{n} {k}" for k, n in kinds.items()) or "none") +
          (f" ({known} of libtorch's cuDNN handle, not counted)" if known else ""))
    return 1 if sum(kinds.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
