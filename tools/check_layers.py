#!/usr/bin/env python3
"""The daemon's folders and the arrows between them (docs/architecture.md "Layers"), checked.

Sources (always):
  - daemon/src/<folder>/ files include their own folder's headers and the interface headers of
    the folders below theirs, never above: main > server > rpc > runner > job > ckpt > coll >
    mesh > backend > config > obs;
  - a private header (*_int.h) is included only inside its own folder;
  - only rpc/ includes ipc.proto's generated header;
  - the loop thread's files (server/) do not compile against job/job.h or zk/kernels.h, even
    through other headers;
  - no function over MAX_FN lines and no file over MAX_FILE lines in daemon/ and client/ (C and
    Python).
Objects (with --objects BUILD_DIR, after a build): the symbols each object file takes from the
others (nm): no circle of calls between objects anywhere in daemon/, client/, common/ and
kernels/, but the ones ALLOWED_CIRCLES names (listed, not refused).

Exit status 1 when a rule is broken, each break on a line of its own; 0 with a summary.
"""
import argparse
import ast
import os
import re
import subprocess
import sys
from collections import defaultdict

LAYERS = ["main", "server", "rpc", "runner", "job", "ckpt", "coll", "mesh", "backend", "config",
          "obs"]
MAX_FN, MAX_FILE = 60, 700
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "daemon", "src")
INC = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def folder_of(rel):
    """daemon/src-relative path -> its room (coll/ucx is in coll); main.c and the like: main."""
    parts = rel.split("/")
    return parts[0] if len(parts) > 1 else "main"


def subfolder_of(rel):
    return os.path.dirname(rel)


def daemon_files():
    out = []
    for d, _, names in os.walk(SRC):
        for n in names:
            if n.endswith((".c", ".h")):
                out.append(os.path.relpath(os.path.join(d, n), SRC))
    return sorted(out)


def includes(rel):
    return INC.findall(open(os.path.join(SRC, rel), errors="replace").read())


def check_sources(bad):
    files = daemon_files()
    known = set(files)
    arrows = up = 0
    graph = defaultdict(set)
    for rel in files:
        me = folder_of(rel)
        for h in includes(rel):
            if h not in known:
                if "ipc/v1/ipc.pb-c.h" in h and me != "rpc":
                    bad.append("daemon/src/%s: includes %s; only rpc/ may" % (rel, h))
                continue
            arrows += 1
            graph[rel].add(h)
            them = folder_of(h)
            if h.endswith("_int.h") and subfolder_of(h) != subfolder_of(rel):
                bad.append("daemon/src/%s: includes %s, private to daemon/src/%s/" %
                           (rel, h, subfolder_of(h)))
            if them != me and LAYERS.index(them) < LAYERS.index(me):
                up += 1
                bad.append("daemon/src/%s: includes %s: %s/ is above %s/" % (rel, h, them, me))
    # what server/ compiles against, through every header
    for rel in files:
        if folder_of(rel) != "server":
            continue
        seen, todo = set(), [rel]
        while todo:
            f = todo.pop()
            for h in includes(f) if f in known else []:
                if h not in seen:
                    seen.add(h)
                    todo.append(h)
        for h in ("job/job.h", "zk/kernels.h"):
            if h in seen:
                bad.append("daemon/src/%s compiles against %s (the loop thread's files must "
                           "not)" % (rel, h))
    cycles = [c for c in sccs(graph) if len(c) > 1]
    for c in cycles:
        bad.append("include circle: %s" % " -> ".join(sorted(c)))
    return len(files), arrows, up, len(cycles)


def c_function_lengths(path, bad):
    lines = open(path, errors="replace").read().split("\n")
    if len(lines) - 1 > MAX_FILE:
        bad.append("%s: %d lines (at most %d)" % (os.path.relpath(path, ROOT), len(lines) - 1,
                                                   MAX_FILE))
    i = 0
    while i < len(lines):
        if lines[i] == "{" and i > 0 and lines[i - 1].rstrip().endswith(")"):
            j = i - 1
            while j > 0 and lines[j - 1].strip() and not lines[j - 1].startswith(
                    ("}", "#", "/*", " *", "*/")) and not lines[j - 1].rstrip().endswith((";", "*/")):
                j -= 1
            k = i + 1
            while k < len(lines) and lines[k] != "}":
                k += 1
            m = re.search(r"(\w+)\s*\(", " ".join(lines[j:i]))
            if k - j + 1 > MAX_FN:
                bad.append("%s:%d: %s() is %d lines (at most %d)" % (
                    os.path.relpath(path, ROOT), j + 1, m.group(1) if m else "?", k - j + 1, MAX_FN))
            i = k
        i += 1


def py_function_lengths(path, bad):
    text = open(path, errors="replace").read()
    if text.count("\n") > MAX_FILE:
        bad.append("%s: %d lines (at most %d)" % (os.path.relpath(path, ROOT), text.count("\n"),
                                                   MAX_FILE))
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > MAX_FN:
                bad.append("%s:%d: %s() is %d lines (at most %d)" % (
                    os.path.relpath(path, ROOT), node.lineno, node.name, n, MAX_FN))


def check_lengths(bad):
    for top in ("daemon", "client"):
        for d, _, names in os.walk(os.path.join(ROOT, top)):
            for n in names:
                p = os.path.join(d, n)
                if n.endswith((".c", ".h")):
                    c_function_lengths(p, bad)
                elif n.endswith(".py"):
                    py_function_lengths(p, bad)


def sccs(graph):
    """Tarjan's strongly connected components of {node: set(nodes)}."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    nodes = set(graph) | {v for vs in graph.values() for v in vs}

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
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
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


# The one circle of calls the tree keeps: a job and its lifecycle (create, attach, drop, end)
# call each other, both inside job/.
ALLOWED_CIRCLES = [{"daemon/src/job/job.c", "daemon/src/job/job_ctl.c"}]


def object_graph(objs):
    """{object: set(objects whose symbols it uses)} from nm."""
    defs, uses = {}, defaultdict(set)
    for o in objs:
        for line in subprocess.check_output(["nm", "--defined-only", "-g", o]).decode().splitlines():
            parts = line.split()
            if len(parts) == 3:
                defs.setdefault(parts[2], o)
        for line in subprocess.check_output(["nm", "-u", o]).decode().splitlines():
            parts = line.split()
            if parts:
                uses[o].add(parts[-1])
    graph = defaultdict(set)
    for o, syms in uses.items():
        for s in syms:
            if s in defs and defs[s] != o:
                graph[o].add(defs[s])
    return graph


def check_objects(build, bad):
    objs = []
    for d, _, names in os.walk(build):
        for n in names:
            if n.endswith(".c.o") and ("/zd_core.dir/" in d or "/zerod.dir/" in d or
                                       "/zc_obj.dir/" in d or "/zs.dir/" in d or
                                       "/zk.dir/" in d):
                objs.append(os.path.join(d, n))
    if not objs:
        bad.append("%s: no object files of zd_core, zerod, zc, zs or zk: build first" % build)
        return 0, 0
    name = {}
    for o in list(objs):  # objects of sources still in the tree (a build dir keeps old ones)
        m = re.search(r"/(daemon|client|common|kernels)/CMakeFiles/[^/]+\.dir/(.*)\.o$", o)
        src = "%s/%s" % (m.group(1), m.group(2)) if m else o
        if not os.path.isfile(os.path.join(ROOT, src)):
            objs.remove(o)
            continue
        name[o] = src
    inside = 0
    for comp in sccs(object_graph(objs)):
        if len(comp) < 2:
            continue
        files = sorted(name[o] for o in comp)
        if set(files) in ALLOWED_CIRCLES:
            inside += 1
            print("circle of calls (allowed): %s" % ", ".join(files))
        else:
            bad.append("circle of calls: %s" % ", ".join(files))
    return len(objs), inside


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--objects", metavar="BUILD_DIR", help="also check the objects of a build")
    a = ap.parse_args()
    bad = []
    n, arrows, up, circles = check_sources(bad)
    check_lengths(bad)
    summary = "daemon/src: %d files, %d include arrows, %d running up, %d include circles" % (
        n, arrows, up, circles)
    if a.objects:
        nobj, inside = check_objects(a.objects, bad)
        summary += "; %d objects, %d allowed circles of calls" % (nobj, inside)
    for b in bad:
        print(b)
    print(("layers: %d problems; " % len(bad) if bad else "layers: clean; ") + summary)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
