#!/usr/bin/env python3
"""Reads compute-sanitizer's XML report (memcheck, --leak-check full) and says what it found.

    memcheck-report.py report.xml

Lists every record (memory error, leak, CUDA API error) with what it says and the top of its
host backtrace, counts them by kind, and exits 1 if there is any: a clean run has none.
"""
import collections
import sys
import xml.etree.ElementTree as ET


def frames(record):
    """The (function, module) of each host frame, innermost first."""
    return [((f.findtext("func") or "?").strip(), (f.findtext("module") or "").strip()) for f in record.iter("frame")]


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
    for record in records:
        kind = (record.findtext("kind") or "").strip()
        kinds[kind] += 1
        what = " ".join((record.findtext("what/text") or "").split())
        named = [function for function, _ in frames(record) if function != "?"]
        print(f"  {kind}: {what} at " + " <- ".join(named[:6]))
    print("memcheck records: " + (", ".join(f"{n} {k}" for k, n in kinds.items()) or "none"))
    return 1 if records else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
