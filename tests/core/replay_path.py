#!/usr/bin/env python3
"""Checks docs/design.md's replay path (section 3.1) against the source.

Each row names a file and a function: the file must exist and define the function. Every name in
backticks in the row's last column (an owner's API or an engine step, `Owner::member` or `member`)
must be called or named in that file. The path must stay readable in one sitting: at most six files
and at most ten changes of file from the first row to the launch (issue 40's bound).
Usage: replay_path.py <source root>
"""
import pathlib
import re
import sys

MAX_FILES = 6
MAX_CHANGES = 10


def rows(design: str):
    marker = design.index("<!-- replay-path:")
    for line in design[marker:].splitlines()[1:]:
        if not line.startswith("|"):
            if line.strip():
                break
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if cells and cells[0].isdigit():
            yield cells


def names(column: str):
    for token in re.findall(r"`([^`]+)`", column):
        name = token.split("::")[-1].removesuffix("()")
        if re.fullmatch(r"[A-Za-z_][A-Za-z_0-9]*", name):
            yield token, name


def main() -> int:
    root = pathlib.Path(sys.argv[1])
    design = (root / "docs/design.md").read_text()
    failures = []
    files = []
    table = list(rows(design))
    if not table:
        failures.append("docs/design.md: no replay-path table after its marker")
    for step, path, function, what in table:
        source_path = root / path
        if not source_path.is_file():
            failures.append(f"step {step}: {path} does not exist")
            continue
        source = source_path.read_text()
        function = function.strip("`")
        if not re.search(r"(::|\s)" + re.escape(function) + r"\(", source):
            failures.append(f"step {step}: {path} defines no {function}(")
        for token, name in names(what):
            if not re.search(r"\b" + re.escape(name) + r"\b", source):
                failures.append(f"step {step}: {path} never names {token}")
        files.append(path)
    changes = sum(1 for before, after in zip(files, files[1:]) if before != after)
    if len(set(files)) > MAX_FILES:
        failures.append(f"the path crosses {len(set(files))} files (at most {MAX_FILES})")
    if changes > MAX_CHANGES:
        failures.append(f"the path changes file {changes} times (at most {MAX_CHANGES})")
    for failure in failures:
        print(f"replay path: {failure}", file=sys.stderr)
    if not failures:
        print(f"replay path: {len(table)} steps, {len(set(files))} files, {changes} changes of file: as written")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
