#!/usr/bin/env python3
"""Module dependency cycles inside each crate of the workspace.

Edges between files of one crate are `crate::m` / `super::m` paths. Prints
each crate's strongly connected components of more than one file; exit
status 1 if any (a cycle). The firmware splits one `impl Nic` across files
by design (files call each other through `Nic`), so for it the script also
lists pairs of files that call each other's functions, as information.

Usage: scripts/dev/modcycles.py [ROOT]   (ROOT defaults to the repository)
"""
import os
import re
import sys
from collections import defaultdict

CRATES = ["uapi", "firmware", "nic", "libemp", "sim", "tools", "tests"]
FN_DEF = re.compile(r"\bfn\s+([a-z_][a-z0-9_]*)")
CALL = re.compile(r"(?:\.|::|\b)([a-z_][a-z0-9_]*)\s*(?:::<[^>]*>)?\(")
PATH = re.compile(r"\b(?:crate|super)::([a-z_][a-z0-9_]*)")
# Names too common to say anything about coupling.
COMMON = {"new", "get", "put", "len", "is_empty", "default", "from", "into", "clone", "drop", "fmt", "run", "check", "read", "write"}


def module_of(src_root, path):
    rel = os.path.relpath(path, src_root)[:-3]
    parts = rel.split(os.sep)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return "/".join(parts) or "lib"


def strip(text):
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    # Unit tests are not part of the module graph.
    return re.split(r"#\[cfg\(test\)\]\s*mod\s+tests", text)[0]


def crate_graph(src_root, calls=False):
    files = {}
    for d, _, fs in os.walk(src_root):
        for f in fs:
            if f.endswith(".rs") and "bin" not in os.path.relpath(d, src_root).split(os.sep):
                p = os.path.join(d, f)
                files[module_of(src_root, p)] = strip(open(p).read())
    defs = defaultdict(set)
    for m, t in files.items():
        for name in FN_DEF.findall(t):
            defs[name].add(m)
    mods = set(files)
    edges = defaultdict(set)
    for m, t in files.items():
        for target in PATH.findall(t):
            for cand in mods:
                if cand == target or cand.endswith("/" + target) or cand.split("/")[0] == target:
                    if cand != m and not cand.startswith(m + "/") and not m.startswith(cand + "/"):
                        edges[m].add(cand)
        if not calls:
            continue
        own = set(FN_DEF.findall(t))
        for name in set(CALL.findall(t)):
            if name in COMMON or name in own:
                continue
            owners = defs.get(name, set()) - {m}
            if len(owners) == 1:
                (o,) = owners
                if not o.startswith(m + "/") and not m.startswith(o + "/"):
                    edges[m].add(o)
    return mods, edges


def sccs(nodes, edges):
    index, low, on, stack, out, i = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = i[0]
        i[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return [c for c in out if len(c) > 1]


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    found = 0
    for c in CRATES:
        src = os.path.join(root, c, "src")
        if not os.path.isdir(src):
            continue
        mods, edges = crate_graph(src)
        for comp in sccs(mods, edges):
            found += 1
            print(f"{c}: cycle among {', '.join(comp)}")
        if c == "firmware":
            _, call_edges = crate_graph(src, calls=True)
            pairs = sorted({tuple(sorted((a, b))) for a in call_edges for b in call_edges[a] if a in call_edges.get(b, ())})
            pairs = [p for p in pairs if "lib" not in p]
            print(f"firmware: files calling each other through Nic (information): {pairs}")
    print(f"{found} module cycles")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
