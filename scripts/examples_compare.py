#!/usr/bin/python3
"""Compares two runs/ folders written by scripts/examples_run.sh: every summary.json value except
timings and memory, the same of analysis.json, metrics.csv without its timing columns, every
dataset and attribute of model_qdq.h5 and model_trained.h5, every dataset of checkpoint.h5 (its
attributes hold the config text, whose comments may change), and quantizer.txt. Exit 0 when equal, 1 with the differences listed otherwise.

Usage: examples_compare.py OLD_RUNS NEW_RUNS [--ignore REGEX ...]
--ignore skips differences whose "<run>/<file> <key>" matches REGEX (intended format changes,
e.g. --ignore 'input_preprocessing' --ignore 'quantizer.txt line0')."""
import json, os, re, sys
import h5py, numpy as np

VOLATILE = {"images_per_s", "epoch_seconds", "peak_rss_mb", "arena_peak_mb", "seconds", "threads",
            "fp32_images_per_s", "int8_images_per_s", "int8_vs_fp32", "speedup", "wall_seconds"}

def flat(prefix, v, out):
    if isinstance(v, dict):
        for k, x in v.items():
            if k in VOLATILE or k.endswith("_seconds") or k.endswith("images_per_s"):
                continue
            flat(prefix + "." + k, x, out)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            flat("%s[%d]" % (prefix, i), x, out)
    else:
        out[prefix] = v

def h5_items(path, attrs=True):
    items = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            for k, a in (obj.attrs.items() if attrs else []):
                items[name + "@" + k] = np.asarray(a).tobytes() if not isinstance(a, (str, bytes)) else a
            if isinstance(obj, h5py.Dataset):
                items[name] = obj[()].tobytes()
        visit("/", f)
        f.visititems(visit)
    return items

def main():
    old, new = sys.argv[1], sys.argv[2]
    ignore = [re.compile(sys.argv[i + 1]) for i in range(3, len(sys.argv) - 1) if sys.argv[i] == "--ignore"]
    bad = 0; compared = 0; ignored = 0
    for run in sorted(os.listdir(old)):
        for fname in ("summary.json", "analysis.json", "model_qdq.h5", "model_trained.h5", "checkpoint.h5",
                      "quantizer.txt", "metrics.csv"):
            a, b = os.path.join(old, run, fname), os.path.join(new, run, fname)
            if not os.path.exists(a):
                continue
            if not os.path.exists(b):
                print("missing %s" % b); bad += 1; continue
            compared += 1
            if fname.endswith(".json"):
                fa, fb = {}, {}
                flat("", json.load(open(a)), fa); flat("", json.load(open(b)), fb)
            elif fname.endswith(".h5"):
                attrs = fname != "checkpoint.h5"
                fa, fb = h5_items(a, attrs), h5_items(b, attrs)
            elif fname == "metrics.csv":  # without the timing columns (images_per_s, epoch_seconds)
                rows = lambda p: {"row%d" % i: ",".join(c for j, c in enumerate(l.split(",")) if j not in (6, 7))
                                  for i, l in enumerate(open(p))}
                fa, fb = rows(a), rows(b)
            else:
                fa = {"line%d" % i: l for i, l in enumerate(open(a))}
                fb = {"line%d" % i: l for i, l in enumerate(open(b))}
            for k in sorted(set(fa) | set(fb)):
                if fa.get(k) != fb.get(k):
                    if any(r.search("%s/%s %s" % (run, fname, k)) for r in ignore):
                        ignored += 1
                        continue
                    bad += 1
                    if bad <= 40:
                        print("%s/%s %s: %r -> %r" % (run, fname, k, str(fa.get(k))[:80], str(fb.get(k))[:80]))
    print("examples_compare: %d files compared, %d differences (%d ignored)" % (compared, bad, ignored))
    return 1 if bad or not compared else 0

if __name__ == "__main__":
    sys.exit(main())
