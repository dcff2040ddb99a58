#!/usr/bin/env python3
"""The functions a replay runs, from a callgrind profile of bench/host_overhead (scripts/bench-host.sh
makes it with --compress-strings=no): every function of cgt's own sources that is reached, by calls
that actually happened, from `Function::operator()` (the call) or from `LeaseArray::free_leases` and
`leases_drop` (dropping the call's outputs), and the files they are in. Inlined functions are not calls: they are not counted.

  replay-hops.py PROFILE     prints "call: N functions in M files" and "drop: ...", then the lists
"""
import re
import subprocess
import sys
from collections import defaultdict


def demangled(names):
    """The names as c++filt writes them (valgrind leaves module-attached names mangled)."""
    names = list(names)
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return dict(zip(names, out.split("\n")))


def parse(path):
    calls = defaultdict(set)  # caller -> callees
    where = {}  # function -> file
    fl = fn = None
    pending_file = None
    for line in open(path, encoding="utf-8", errors="replace"):
        line = line.rstrip("\n")
        if line.startswith("fl=") or line.startswith("fi=") or line.startswith("fe="):
            name = line[3:]
            if line.startswith("fl="):
                fl = name
        elif line.startswith("fn="):
            fn = line[3:]
            where.setdefault(fn, fl)
        elif line.startswith("cfi=") or line.startswith("cfl="):
            pending_file = line[4:]
        elif line.startswith("cfn="):
            callee = line[4:]
            calls[fn].add(callee)
            if pending_file is not None:
                where.setdefault(callee, pending_file)
            pending_file = None
    return calls, where


def reached(calls, roots):
    seen, todo = set(), list(roots)
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        todo.extend(calls.get(f, ()))
    return seen


def ours(name, file, root):
    if file is None or not file.startswith(root):
        return False
    rel = file[len(root):]
    return (rel.startswith("src/") or rel.startswith("modules/")) and "_Function_handler" not in name


def main():
    raw_calls, raw_where = parse(sys.argv[1])
    names = demangled(set(raw_calls) | set(raw_where) | {c for cs in raw_calls.values() for c in cs})
    calls = defaultdict(set)
    for caller, callees in raw_calls.items():
        calls[names[caller]].update(names[c] for c in callees)
    where = {names[f]: file for f, file in raw_where.items()}
    root = sys.argv[2] if len(sys.argv) > 2 else "/work/main/"
    entries = {
        "call": [f for f in calls if re.search(r"cgt::Function(@[\w.]+)?<.*>::operator\(\)\(std::span", f)],
        "drop": [f for f in calls if re.search(r"cgt::detail::(leases_drop|LeaseArray(@[\w.]+)?::free_leases)", f)],
    }
    for what, roots in entries.items():
        functions = sorted(f for f in reached(calls, roots) if ours(f, where.get(f), root))
        files = sorted({where[f][len(root):] for f in functions})
        print(f"{what}: {len(functions)} functions in {len(files)} files")
    for what, roots in entries.items():
        print(f"\n{what}:")
        for f in sorted(f for f in reached(calls, roots) if ours(f, where.get(f), root)):
            short = re.sub(r"\(.*", "", f)
            print(f"  {where[f][len(root):]}: {short}")


main()
