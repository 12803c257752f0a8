#!/usr/bin/env python3
"""int8 inference of FashionCNN: this framework's int8 device against ONNX Runtime running the same
model exported as QDQ ONNX, side by side in one run (batch 256, 2 threads, the same test images).

Usage: /usr/bin/python3 bench/bench_ort.py [--rounds 5] [--repeat 2] [--build build]
                                           [--qdq runs/fashion_cnn_ptq_w8a8/model_qdq.h5]
                                           [--fp32 runs/fashion_cnn_fp32/checkpoint.h5]

Ours: `qat_report MODEL_QDQ --fp32 CHECKPOINT` (model time of the lowered int8 model, best of
--rounds rounds of 8 batches of 256, as bench/bench_infer.py). ONNX Runtime (onnxruntime-node,
tests/ort): `qat_export MODEL_QDQ model.onnx`, then tests/ort/ort_run.js on 8 x 256 test images per
session with graph optimizations on (its QDQ fusion: integer kernels where it fuses, float where it
does not) and off, 2 intra-op threads with spinning on (ORT's default), timed around the run calls
only (session creation excluded), best of --rounds sessions. The accuracy of each on the whole test
set is printed beside it. The whole sequence runs --repeat times and every row keeps its best.
Issue #11's goal: ours >= 1.0x ONNX Runtime. Run with both cores idle.
"""
import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "ort"))
from bench_infer import ensure_models, run_ours  # noqa: E402
import ort_eval  # noqa: E402
import ortlib  # noqa: E402

BATCH, BATCHES = 256, 8


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--qdq", default=os.path.join(ROOT, "runs", "fashion_cnn_ptq_w8a8", "model_qdq.h5"))
    ap.add_argument("--fp32", default=os.path.join(ROOT, "runs", "fashion_cnn_fp32", "checkpoint.h5"))
    a = ap.parse_args()
    ensure_models(a.build, a.qdq, a.fp32)
    model = os.path.join(tempfile.mkdtemp(prefix="bench_ort_"), "model_qdq.onnx")
    subprocess.run([os.path.join(a.build, "bin", "qat_export"), a.qdq, model], check=True)
    x, y = ort_eval.load_images(ort_eval.FASHION + "t10k-images-idx3-ubyte.gz",
                                ort_eval.FASHION + "t10k-labels-idx1-ubyte.gz", 0.2860, 0.3530)
    timed = x[:BATCH * BATCHES]
    acc = {}
    for opt in ("all", "disabled"):
        logits, info = ortlib.run(model, x, layout="NHWC", opt=opt, threads=a.threads)
        acc[opt] = float((logits.reshape(len(x), -1).argmax(1) == y).mean())
        version = info.get("ort_version")
    best = {}
    for _ in range(a.repeat):
        _, ours_int8, ours_acc, _ = run_ours(a.build, a.qdq, a.fp32, a.rounds, a.threads)
        best["ours"] = max(best.get("ours", 0), ours_int8)
        for opt in ("all", "disabled"):
            for _ in range(a.rounds):
                _, info = ortlib.run(model, timed, layout="NHWC", opt=opt, threads=a.threads, batch=BATCH,
                                     spinning=True, warmup=True)
                ips = len(timed) / (info["run_ms"] / 1000.0)
                best[opt] = max(best.get(opt, 0), ips)
    print("FashionCNN int8 inference (%s), batch %d, %d threads, best of %d x %d rounds of %d batches"
          % (os.path.relpath(a.qdq, ROOT), BATCH, a.threads, a.repeat, a.rounds, BATCHES))
    print("%-58s %12s %14s" % ("", "images/s", "test accuracy"))
    print("%-58s %12.0f %13.2f%%" % ("this framework, int8 device (oneDNN)", best["ours"],
                                      100 * ours_acc.get("int8 device", float("nan"))))
    print("%-58s %12.0f %13.2f%%" % ("ONNX Runtime %s, QDQ ONNX, default optimizations" % version, best["all"],
                                      100 * acc["all"]))
    print("%-58s %12.0f %13.2f%%" % ("ONNX Runtime %s, QDQ ONNX, optimizations disabled" % version,
                                      best["disabled"], 100 * acc["disabled"]))
    print("ours / ONNX Runtime (default optimizations): %.2fx (goal >= 1.0x)" % (best["ours"] / best["all"]))


if __name__ == "__main__":
    main()
