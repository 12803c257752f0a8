#!/usr/bin/env python3
"""Test accuracy of an ONNX model (an fp32 import source, or a model_qdq.onnx qat_train wrote) in
ONNX Runtime, on an IDX image set preprocessed as the framework does ((pixel / 255 - mean) / std
per channel, in float32): the other end of the round trip (docs/onnx_import.md, "Round trip").

Usage: .venv/bin/python tests/ort/ort_eval.py MODEL.onnx [--images N] [--opt disabled|basic|extended|all]
           [--x64quantprecision] [--threads K] [--test-images IDX.gz --test-labels IDX.gz]
           [--mean M --std S] [--logits OUT.npy] [--json]
Defaults: the Fashion-MNIST test set of Debian's dataset-fashion-mnist, mean 0.2860, std 0.3530,
every image, graph optimizations on (ORT's fused integer kernels), 2 threads. Prints the
accuracy (or a JSON line with --json); exit 1 with a message on an error.
"""
import argparse
import gzip
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ortlib  # noqa: E402

FASHION = "/usr/share/datasets/fashion-mnist/"


def read_idx(path):
    """An IDX file (optionally gzip-compressed) as a numpy array."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 8:
        raise ValueError("%s: not an unsigned-byte IDX file" % path)
    nd = data[3]
    dims = struct.unpack(">%dI" % nd, data[4:4 + 4 * nd])
    body = np.frombuffer(data, np.uint8, offset=4 + 4 * nd)
    if body.size != int(np.prod(dims)):
        raise ValueError("%s: %d bytes of data for dims %s" % (path, body.size, dims))
    return body.reshape(dims)


def load_images(images, labels, mean, std, limit=0):
    """NHWC float32 images preprocessed as data/loader.c does, and int64 labels."""
    x, y = read_idx(images), read_idx(labels).astype(np.int64)
    if limit:
        x, y = x[:limit], y[:limit]
    if x.ndim == 3:
        x = x[..., None]
    x = x.astype(np.float32)
    x = (x / np.float32(255.0) - np.float32(mean)) / np.float32(std)
    return x.astype(np.float32), y


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--images", type=int, default=0, help="the first N test images (0: all)")
    ap.add_argument("--opt", default="all", choices=["disabled", "basic", "extended", "all"])
    ap.add_argument("--x64quantprecision", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--test-images", default=FASHION + "t10k-images-idx3-ubyte.gz")
    ap.add_argument("--test-labels", default=FASHION + "t10k-labels-idx1-ubyte.gz")
    ap.add_argument("--mean", type=float, default=0.2860)
    ap.add_argument("--std", type=float, default=0.3530)
    ap.add_argument("--logits", help="also save the logits (N, classes) float32 to this .npy file")
    ap.add_argument("--json", action="store_true", help="print one JSON line")
    a = ap.parse_args()
    try:
        x, y = load_images(a.test_images, a.test_labels, a.mean, a.std, a.images)
        logits, info = ortlib.run(a.model, x, layout="NHWC", opt=a.opt, x64quantprecision=a.x64quantprecision,
                                  threads=a.threads, spinning=True)
    except (OSError, ValueError, ortlib.OrtError) as e:
        sys.exit("ort_eval: %s" % e)
    logits = logits.reshape(len(x), -1)
    correct = int((logits.argmax(1) == y).sum())
    if a.logits:
        np.save(a.logits, logits)
    res = {"model": a.model, "images": len(x), "correct": correct, "accuracy": correct / len(x), "opt": a.opt,
           "x64quantprecision": a.x64quantprecision, "ort_version": info.get("ort_version"),
           "run_ms": info.get("run_ms")}
    if a.json:
        print(json.dumps(res))
    else:
        print("%s in ONNX Runtime %s (optimizations %s): top-1 %.2f%% on %d test images (%d correct)"
              % (a.model, res["ort_version"], a.opt, 100 * res["accuracy"], len(x), correct))


if __name__ == "__main__":
    main()
