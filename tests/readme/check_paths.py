#!/usr/bin/env python3
"""Every file or folder of this repository that README.md or a page of docs/ names exists.

A name is a relative path that starts at one of the repository's top folders (src/, modules/,
tests/, scripts/, docs/, bench/, examples/, cmake/, .ci/) or is a root file (README.md,
CHANGELOG.md, CMakeLists.txt), in code spans, links or plain text. Globs (`*`) must match
something; a trailing `...` or `<...>` part is a placeholder, and the path up to it is checked; a
program may be named by its source's path without the extension (bench/tp_bench). Links are
resolved from the page's own folder.

  check_paths.py ROOT PAGE...   prints each missing name as PAGE:LINE: NAME; exits 1 if any
"""
import glob
import os
import re
import sys

TOP = ("src", "modules", "tests", "scripts", "docs", "bench", "examples", "cmake", ".ci")
ROOT_FILES = ("README.md", "CHANGELOG.md", "CMakeLists.txt")
# A path-like word: top folder, then path characters (no spaces); or a root file name.
PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./*<>{}-]*|(?:%s))" % ("|".join(re.escape(t) for t in TOP),
                                                                    "|".join(re.escape(f) for f in ROOT_FILES)))
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def candidates(line):
    for match in PATH.finditer(line):
        yield match.group(1), False
    for match in LINK.finditer(line):
        target = match.group(1)
        if "://" not in target and not target.startswith("mailto:"):
            yield target, True


def cleaned(name):
    # Placeholders end the checked part: tests/consumer/<name>, scripts/gpu/..., build-<kind>/.
    name = re.split(r"<|\{|\.\.\.", name)[0]
    return name.rstrip(".,;:)'\"`").rstrip("/") or None


def exists(root, name):
    path = os.path.join(root, name)
    if "*" in name:
        return bool(glob.glob(path))
    # A program is named by its source's path without the extension (bench/tp_bench).
    return os.path.exists(path) or bool(glob.glob(glob.escape(path) + ".*"))


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    root, pages = sys.argv[1], sys.argv[2:]
    missing = []
    for page in pages:
        page_dir = os.path.relpath(os.path.dirname(os.path.abspath(page)), root)
        in_fence = False
        for number, line in enumerate(open(page, encoding="utf-8"), start=1):
            if line.startswith("```"):
                in_fence = not in_fence
            for name, is_link in candidates(line):
                name = cleaned(name)
                if name is None:
                    continue
                # A link is relative to its page; a path in text or code names a file of the repository.
                relative = os.path.normpath(os.path.join(page_dir, name)) if is_link else name
                if not exists(root, relative):
                    missing.append(f"{os.path.relpath(page, root)}:{number}: {name}")
    for entry in missing:
        print(entry)
    if missing:
        print(f"{len(missing)} names of files that do not exist (see tests/readme/check_paths.py)")
        return 1
    print(f"every file named by {len(pages)} pages exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
