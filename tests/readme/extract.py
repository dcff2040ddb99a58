#!/usr/bin/env python3
"""Extracts the code blocks of README.md, so that each is compiled (tests/readme) or built as a
project (tests/consumer).

Every ```cpp and ```cuda block of the README is preceded by a comment saying how it is checked:

  <!-- cgt-test: file host/main.cpp -->    a file of the README's example project `host`; the
                                            consumer test builds the project from these files
  <!-- cgt-test: tu torch -->               a whole translation unit, compiled with cgt::torch
  <!-- cgt-test: harness host-step -->      a fragment, compiled inside tests/readme/harness/host-step.cpp

A harness puts the fragment's leading #include / import lines at its `// @imports@` line and the
rest at its `// @fragment@` line. The backend (host, cuda, torch) is a file's directory, the tu's
argument, or the harness name's first word. ```cmake and ```sh blocks may carry a `file` comment too.

  extract.py blocks README HARNESS_DIR OUT_DIR   writes OUT_DIR/block-N.{cpp,cu} and OUT_DIR/blocks.cmake
                                                 (cgt_readme_block(name backend source line) calls,
                                                 then CGT_README_ERRORS: blocks without a usable comment)
  extract.py project README NAME OUT_DIR         writes the files of project NAME into OUT_DIR
"""
import os
import re
import sys

MARK = re.compile(r"^<!--\s*cgt-test:\s*(file|tu|harness)\s+(\S+)\s*-->\s*$")
FENCE = re.compile(r"^```(\w*)\s*$")
BACKENDS = ("host", "cuda", "torch")


def blocks(readme):
    """(line of the first code line, fence language, marker or None, code) for each fenced block."""
    lines = open(readme, encoding="utf-8").read().split("\n")
    found, i = [], 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        previous = i - 1
        while previous >= 0 and not lines[previous].strip():
            previous -= 1
        mark = MARK.match(lines[previous]) if previous >= 0 else None
        end = i + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        found.append((i + 2, fence.group(1), mark.groups() if mark else None, "\n".join(lines[i + 1 : end]) + "\n"))
        i = end + 1
    return found


def cmake_quote(text):
    return '"' + text.replace("\\", "/").replace('"', '\\"') + '"'


def write_blocks(readme, harness_dir, out):
    os.makedirs(out, exist_ok=True)
    readme = os.path.abspath(readme)
    calls, errors = [], []
    for n, (line, lang, mark, code) in enumerate(blocks(readme)):
        if lang not in ("cpp", "cuda"):
            continue
        where = f"README.md line {line - 1} (```{lang})"
        if mark is None:
            errors.append(f"{where}: no <!-- cgt-test: ... --> comment before it")
            continue
        kind, arg = mark
        source = f"{out}/block-{n}.{'cu' if lang == 'cuda' else 'cpp'}"
        directive = f'#line {line} "{readme}"\n'
        if kind == "file":
            backend = arg.split("/")[0]
            text = directive + code
        elif kind == "tu":
            backend = arg
            text = directive + code
        else:
            backend = arg.split("-")[0]
            path = os.path.join(harness_dir, arg + ".cpp")
            if not os.path.exists(path):
                errors.append(f"{where}: no harness {path}")
                continue
            harness = open(path, encoding="utf-8").read()
            code_lines = code.split("\n")
            head = 0
            while head < len(code_lines) and re.match(r"^\s*(#include|import |//|$)", code_lines[head]):
                head += 1
            imports = directive + "\n".join(code_lines[:head]) + "\n"
            fragment = f'#line {line + head} "{readme}"\n' + "\n".join(code_lines[head:]) + "\n"
            if "// @imports@" not in harness or "// @fragment@" not in harness:
                errors.append(f"{where}: harness {path} lacks // @imports@ or // @fragment@")
                continue
            harness_lines = harness.split("\n")
            for marker, inserted in (("// @imports@", imports), ("// @fragment@", fragment)):
                at = next((k for k, text in enumerate(harness_lines) if text.strip() == marker), None)
                if at is not None:  # the harness's own lines keep their own names in diagnostics
                    harness_lines[at] = inserted + f'#line {at + 2} "{os.path.abspath(path)}"'
            text = "\n".join(harness_lines)
        if backend not in BACKENDS:
            errors.append(f"{where}: unknown backend '{backend}' (one of {', '.join(BACKENDS)})")
            continue
        if lang == "cuda" and backend != "cuda" and backend != "torch":
            errors.append(f"{where}: a ```cuda block needs the cuda or torch backend")
            continue
        with open(source, "w", encoding="utf-8") as f:
            f.write(text)
        calls.append(f"cgt_readme_block(block-{n} {backend} {cmake_quote(source)} {line - 1})")
    with open(f"{out}/blocks.cmake", "w", encoding="utf-8") as f:
        f.write("# Generated by tests/readme/extract.py from README.md.\n")
        f.write("\n".join(calls) + "\n")
        f.write("set(CGT_README_ERRORS " + " ".join(cmake_quote(e.replace(";", ",")) for e in errors) + ")\n")


def write_project(readme, name, out):
    written = 0
    for _, _, mark, code in blocks(readme):
        if mark and mark[0] == "file" and mark[1].startswith(name + "/"):
            path = os.path.join(out, mark[1][len(name) + 1 :])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(code)
            written += 1
    if written == 0:
        sys.exit(f"README has no <!-- cgt-test: file {name}/... --> blocks")
    print(f"{written} files of project {name} written to {out}")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "blocks":
        write_blocks(sys.argv[2], sys.argv[3], sys.argv[4])
    elif len(sys.argv) == 5 and sys.argv[1] == "project":
        write_project(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit(__doc__)
