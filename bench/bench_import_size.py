#!/usr/bin/python3
"""Time and peak memory of the ONNX importer on large and hostile graphs, beside ONNX's own loader.

Each file is given to `qat_train` (a config whose data is the default Fashion-MNIST) and imported to
the end, where it is refused (the chains' output is an image, not class scores; the empty
messages have no op): the figures are the whole import, from reading the file to the refusal. For
each file: its size, qat_train's wall time and peak RSS (/usr/bin/time), the RSS above a run on a
one-node file (the program's own libraries), that as a multiple of the file size, and the peak RSS
of Python's `onnx.load` of the same file above `import onnx` (C++ protobuf; with --onnx-python, a
Python that has the onnx package). Files (tests/onnx/make_hostile_onnx.py's writers):
  relu_N      a chain of N Relu nodes, each named apart (about 32 bytes of file per node);
  empty_nodes 1,990,000 empty NodeProto messages (2 bytes each; the reader's cap is 2,000,000);
  empty_attrs one node with 1,990,000 empty AttributeProto messages (the largest message struct).
Run with the other core idle. Usage:
  /usr/bin/python3 bench/bench_import_size.py [--build build] [--onnx-python .venv/bin/python]
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "onnx"))
import make_hostile_onnx as h  # noqa: E402


def files(d):
    out = []
    for n in (1, 10000, 100000, 300000):
        out.append(("relu_%d" % n, h.relu_chain(n, False)))
    out.append(("empty_nodes", h.model(b"\x0a\x00" * 1990000 + h.string(2, "g"))))
    node = h.field_bytes(1, h.string(4, "Relu") + b"\x2a\x00" * 1990000)
    out.append(("empty_attrs", h.model(node + h.string(2, "g"))))
    paths = []
    for name, data in out:
        p = os.path.join(d, name + ".onnx")
        with open(p, "wb") as f:
            f.write(data)
        paths.append((name, p))
    return paths


def timed(cmd):
    """(seconds, peak RSS MB, exit status, stderr's last line) of cmd under /usr/bin/time."""
    r = subprocess.run(["/usr/bin/time", "-f", "TIME %e %M"] + cmd, capture_output=True, text=True, cwd=ROOT)
    m = re.search(r"TIME ([0-9.]+) ([0-9]+)", r.stderr)
    last = [line for line in r.stderr.splitlines() if not line.startswith(("TIME", "Command exited"))]
    return float(m.group(1)), int(m.group(2)) / 1024.0, r.returncode, last[-1] if last else ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--onnx-python", default=os.path.join(ROOT, ".venv", "bin", "python"))
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="bench_import_size_")
    ini = os.path.join(d, "ok.ini")
    with open(ini, "w") as f:
        f.write("[train]\nepochs = 1\n[output]\nprogress = none\n")
    have_onnx = os.path.exists(a.onnx_python) and subprocess.call([a.onnx_python, "-c", "import onnx"]) == 0
    onnx_base = timed([a.onnx_python, "-c", "import onnx"])[1] if have_onnx else None
    base = None
    print("%-12s %10s %8s %9s %11s %8s %14s" % ("file", "bytes", "time s", "RSS MB", "above base", "x file",
                                              "onnx.load MB"))
    for name, p in files(d):
        size = os.path.getsize(p)
        t, rss, rc, last = timed([os.path.join(a.build, "bin", "qat_train"), ini, "model.onnx=" + p,
                                  "output.dir=" + os.path.join(d, "out")])
        if rc != 2:
            sys.exit("%s: exit %d, expected the import's refusal (2): %s" % (name, rc, last))
        if base is None:
            base = rss
        ref = "-"
        if have_onnx:
            _, orss, orc, olast = timed([a.onnx_python, "-c", "import onnx,sys; onnx.load(sys.argv[1])", p])
            ref = "%.1f" % (orss - onnx_base) if orc == 0 else "exit %d" % orc
        print("%-12s %10d %8.2f %9.1f %11.1f %8.1f %14s" % (name, size, t, rss, rss - base, (rss - base) * 2**20 / size,
                                                         ref))
    print("(above base: over the one-node file's %.1f MB; onnx.load: over `import onnx`'s %s MB)" % (
        base, "%.1f" % onnx_base if onnx_base else "-"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
