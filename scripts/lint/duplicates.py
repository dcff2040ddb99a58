#!/usr/bin/env python3
"""Blocks of code repeated in the library: six or more lines in a row that stand again elsewhere.

Reads the library's sources (modules/*.cppm and *.inc, src/**.cppm, .cpp, .hpp, .cu: the module
interfaces and their textual parts included), compares them line by line with blank lines, comment
lines and whitespace left out, and reports every run of at least MIN_LINES lines, at least half of
them substantial (more than punctuation: a line of `}` alone says nothing), that stands in two
places. A run already known is listed in the baseline file by the hash of its lines (with where it
stood, for a reader); only runs that are not in it fail:

    scripts/lint/duplicates.py                 # exit 1 on a run not in the baseline
    scripts/lint/duplicates.py --all           # every run, known or not
    scripts/lint/duplicates.py --write-baseline   # the baseline becomes the runs found now

Why not the workplace's `duplicates` tool: CI has none, and it reads no .cppm or .inc file.
"""
from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

MIN_LINES = 6
PATTERNS = ("modules/*.cppm", "modules/*.inc", "src/*.cppm", "src/*.cpp", "src/*.hpp", "src/*.cu")
ROOT = Path(__file__).resolve().parents[2]
BASELINE = Path(__file__).resolve().parent / "duplicates-baseline.txt"
TRIVIAL = re.compile(r"^[{}();,:\s]*$|^(break|continue|default:|return;|return \{\};|public:|private:|protected:)$")


@dataclass
class Line:
    text: str  # whitespace-normalized
    number: int  # 1-based, in its file


def significant_lines(path: Path) -> list[Line]:
    lines: list[Line] = []
    in_block_comment = False
    for number, raw in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        text = " ".join(raw.split())
        if in_block_comment:
            if "*/" in text:
                in_block_comment = False
            continue
        if text.startswith("/*"):
            in_block_comment = "*/" not in text
            continue
        if not text or text.startswith("//") or text.startswith("#include") or text.startswith("import "):
            continue
        lines.append(Line(text, number))
    return lines


def substantial(text: str) -> bool:
    return not TRIVIAL.match(text)


@dataclass(frozen=True)
class Place:
    file: str
    first: int
    last: int

    def __str__(self) -> str:
        return f"{self.file}:{self.first}-{self.last}"


def find_runs(files: dict[str, list[Line]]) -> dict[str, list[Place]]:
    """Maximal runs of MIN_LINES or more lines standing in two places or more, by the hash of the run."""
    # Every window of MIN_LINES lines, by its text: windows seen twice are where runs start.
    windows: dict[tuple[str, ...], list[tuple[str, int]]] = {}
    for name, lines in files.items():
        for start in range(len(lines) - MIN_LINES + 1):
            key = tuple(line.text for line in lines[start : start + MIN_LINES])
            if sum(substantial(text) for text in key) * 2 < MIN_LINES:
                continue
            windows.setdefault(key, []).append((name, start))
    runs: dict[str, list[Place]] = {}
    covered: set[tuple[str, int]] = set()
    for key, where in sorted(windows.items(), key=lambda item: item[1]):
        if len(where) < 2:
            continue
        # Grow the run from each pair of places while their next lines agree.
        for i, (a_name, a_start) in enumerate(where):
            for b_name, b_start in where[i + 1 :]:
                if (a_name, a_start) in covered and (b_name, b_start) in covered:
                    continue
                if a_name == b_name and abs(a_start - b_start) < MIN_LINES:
                    continue  # a run overlapping itself (a repeated line)
                a, b = files[a_name], files[b_name]
                length = MIN_LINES
                while (
                    a_start + length < len(a)
                    and b_start + length < len(b)
                    and a[a_start + length].text == b[b_start + length].text
                    and not (a_name == b_name and a_start + length == b_start)
                ):
                    length += 1
                for offset in range(length):
                    covered.add((a_name, a_start + offset))
                    covered.add((b_name, b_start + offset))
                text = "\n".join(line.text for line in a[a_start : a_start + length])
                digest = hashlib.sha1(text.encode()).hexdigest()[:16]
                places = runs.setdefault(digest, [])
                for name, start in ((a_name, a_start), (b_name, b_start)):
                    lines = files[name]
                    place = Place(name, lines[start].number, lines[start + length - 1].number)
                    if place not in places:
                        places.append(place)
    return runs


def read_baseline(baseline: Path) -> set[str]:
    if not baseline.exists():
        return set()
    return {line.split()[0] for line in baseline.read_text().splitlines() if line and not line.startswith("#")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--all", action="store_true", help="list every run, known or not")
    parser.add_argument("--write-baseline", action="store_true", help="make the runs found now the baseline")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to read (default: this one)")
    parser.add_argument("--baseline", type=Path, default=BASELINE, help="the baseline file")
    args = parser.parse_args()
    root, baseline = args.root.resolve(), args.baseline
    names = subprocess.run(["git", "ls-files", *PATTERNS], cwd=root, check=True, capture_output=True, text=True)
    files = {name: significant_lines(root / name) for name in names.stdout.split()}
    runs = find_runs(files)
    if args.write_baseline:
        with baseline.open("w") as out:
            out.write("# Runs of repeated library code known when this was written (scripts/lint/duplicates.py):\n")
            out.write("# the hash of the run's lines, then where it stood. Mend one and drop its line.\n")
            for digest, places in sorted(runs.items(), key=lambda item: str(item[1][0])):
                out.write(f"{digest} " + " ~ ".join(map(str, places)) + "\n")
        print(f"duplicates: {len(runs)} runs written to {baseline}")
        return 0
    known = read_baseline(baseline)
    new = {digest: places for digest, places in runs.items() if digest not in known}
    shown = runs if args.all else new
    for digest, places in sorted(shown.items(), key=lambda item: str(item[1][0])):
        mark = "" if digest in known else " (new)"
        print(f"{digest}{mark}: " + " ~ ".join(map(str, places)))
    print(f"duplicates: {len(files)} files, {len(runs)} runs of {MIN_LINES}+ lines in two places, {len(new)} not in the baseline")
    return 1 if new else 0


if __name__ == "__main__":
    sys.exit(main())
