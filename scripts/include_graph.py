#!/usr/bin/python3
"""The include graph of the library (every folder that builds part of it; not tests/, fuzz/,
bench/): between folders and between files, with its arrows up and its circles.

Folders are layered, lowest first (LAYERS); an include from a folder into a higher one is an arrow
up. Files: each .c is a node, with an arrow from a.c to b.c when a.c uses a function (or
variable) that b.c defines, through whichever header declares it: the dependencies the includes
carry. A circle is a strongly connected set of two or more nodes: files that need each other. Exit 0 when there is no arrow up and no circle, 1
otherwise, with them listed.

Usage: scripts/include_graph.py [--edges]   (--edges also lists every folder arrow with its count)"""
import collections
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYERS = ["base", "config", "dist", "quant", "data", "optim", "autograd", "nn", "qat", "onnx", "backend", "eval",
          "train", "cli"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"(\w+)/([\w.]+)"', re.M)


def sources():
    for d in LAYERS:
        for f in sorted(os.listdir(os.path.join(ROOT, d))):
            if f.endswith((".c", ".h")):
                yield d, f


def circles(graph):
    """Strongly connected components of two or more nodes (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


DEF = re.compile(r'^(?!static\b)(?:const\s+)?[A-Za-z_][\w \t\*]*?\b(qt_\w+)\s*(?:\([^;{}]*\)\s*(?:__attribute__\(\(.*?\)\)\s*)?\{|(?:\[[^\]]*\])*\s*=)', re.M | re.S)
USE = re.compile(r"\bqt_\w+\b")


def strip(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r'"(\\.|[^"\\])*"', '""', text)


def main():
    folders, files = collections.Counter(), collections.defaultdict(set)
    up = []
    texts = {(d, f): strip(open(os.path.join(ROOT, d, f)).read()) for d, f in sources()}
    owner = {}
    for (d, f), text in texts.items():
        if f.endswith(".c"):
            for m in DEF.finditer(text):
                owner[m.group(1)] = d + "/" + f
    for (d, f), text in texts.items():
        a = d + "/" + f
        for m in INCLUDE.finditer(open(os.path.join(ROOT, d, f)).read()):
            td, tf = m.group(1), m.group(2)
            if td not in LAYERS or not os.path.exists(os.path.join(ROOT, td, tf)) or td == d:
                continue
            folders[(d, td)] += 1
            if LAYERS.index(td) > LAYERS.index(d):
                up.append("%s includes %s/%s" % (a, td, tf))
        if f.endswith(".c"):
            files.setdefault(a, set())
            files[a] |= {owner[n] for n in set(USE.findall(text)) if n in owner and owner[n] != a}
    fgraph = collections.defaultdict(set)
    for a, b in folders:
        fgraph[a].add(b)
    folder_circles, file_circles = circles(fgraph), circles(files)
    if "--edges" in sys.argv:
        for (a, b), n in sorted(folders.items()):
            print("%s -> %s (%d)" % (a, b, n))
    print("include graph: %d folders, %d files, %d folder arrows, %d file arrows"
          % (len(LAYERS), len(files), len(folders), sum(len(v) for v in files.values())))
    print("arrows up: %d" % len(up))
    for u in up:
        print("  " + u)
    print("circles between folders: %d" % len(folder_circles))
    for c in folder_circles:
        print("  " + " <-> ".join(c))
    print("circles between files: %d" % len(file_circles))
    for c in file_circles:
        print("  " + " <-> ".join(c))
    return 1 if up or folder_circles or file_circles else 0


if __name__ == "__main__":
    sys.exit(main())
