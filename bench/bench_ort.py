#!/usr/bin/env python3
"""int8 inference in ONNX Runtime against this framework's devices, side by side in one run:
each Q/DQ model exported with qat_export (QDQ ONNX) and run in ONNX Runtime, ONNX Runtime's own
quantize_static model and the fp32 model in ONNX Runtime, and our oneDNN int8 device
(qat_report), at batch 256 (images/s) and batch 1 (ms per image), 2 threads.

Usage: .venv/bin/python bench/bench_ort.py [--runs fashion_cnn_qat_w8a8 fashion_cnn_qat_w4a8 ...]
           [--fp32 runs/fashion_cnn_fp32/checkpoint.h5] [--fp32-onnx tests/onnx/models/fashion_cnn.onnx]
           [--rounds 5] [--threads 2] [--json OUT.json] [--build build]

--runs: qat_train output folders under runs/ (each with model_qdq.h5); missing ones are made
with `qat_train experiments/NAME.ini`. ONNX Runtime (the test environment's onnxruntime, default
session options but for the thread count: graph optimizations on, spinning on) is timed around
its run calls only: batch 256 as the best of --rounds sessions of 8 batches; batch 1 as the
median of 512 single-image calls per session, best session. The rows take turns round by round.
Ours: `qat_report MODEL --backend onednn --images 256 --timing-batch 256|1`, one timing
round per round (best of --rounds); the int8 device's accuracy from one report on the whole test
set.
ONNX Runtime's quantize_static (QDQ, per-channel int8 weights, uint8 activations, MinMax
calibration on 512 training images; after quant_pre_process, as ORT recommends) quantizes --fp32-onnx, whose BatchNormalization nodes are set
to inference mode; its accuracy is printed only when that file's weights are trained (give
--fp32-onnx a trained export: the default, the architecture's committed twin, is untrained and
times the same graph). Test accuracy of each model on the whole test set is printed beside it.
Run with both cores idle.
"""
import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "ort"))
from bench_infer import run_ours  # noqa: E402
import ort_eval  # noqa: E402
import ort_run  # noqa: E402
import ortlib  # noqa: E402

import numpy as np  # noqa: E402

BATCH, BATCHES, SINGLES = 256, 8, 512


def ensure_run(build, name):
    qdq = os.path.join(ROOT, "runs", name, "model_qdq.h5")
    if not os.path.exists(qdq):
        print("bench_ort: %s missing: qat_train experiments/%s.ini" % (qdq, name), flush=True)
        subprocess.run([os.path.join(build, "bin", "qat_train"), os.path.join(ROOT, "experiments", name + ".ini"),
                        "output.progress=none"], check=True, cwd=ROOT)
    return qdq


def quantize_static(fp32_onnx, out, calib):
    """ONNX Runtime's own PTQ of fp32_onnx (QDQ, per-channel, MinMax) into out, after its
    recommended pre-processing (quant_pre_process: shape inference and ORT's graph optimizations,
    which fold BatchNormalization into the convolutions)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static as qs
    from onnxruntime.quantization import CalibrationMethod
    from onnxruntime.quantization.shape_inference import quant_pre_process
    pre = out + ".pre.onnx"
    quant_pre_process(fp32_onnx, pre, skip_symbolic_shape=True)  # static shapes: ONNX shape inference suffices

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"input": calib[i:i + 64]} for i in range(0, len(calib), 64)])

        def get_next(self):
            return next(self.it, None)

    qs(pre, out, Reader(), quant_format=QuantFormat.QDQ, per_channel=True, activation_type=QuantType.QUInt8,
       weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax)
    os.remove(pre)


def ort_round(model, x256, x1, threads):
    """One session: (batch-256 images/s over 8 batches, median ms of the single-image calls)."""
    sess, _, _ = ort_run.make_session(model, "all", threads, spinning=True)
    inp, out = sess.get_inputs()[0].name, sess.get_outputs()[0].name
    sess.run([out], {inp: x256[:BATCH]})
    t0 = time.perf_counter()
    for b in range(BATCHES):
        sess.run([out], {inp: x256[b * BATCH:(b + 1) * BATCH]})
    ips = BATCH * BATCHES / (time.perf_counter() - t0)
    times = []
    for i in range(SINGLES):
        xi = x1[i:i + 1]
        t = time.perf_counter()
        sess.run([out], {inp: xi})
        times.append(time.perf_counter() - t)
    return ips, 1000 * statistics.median(times)


def ort_accuracy(model, x, y, threads):
    logits, info = ortlib.run(model, x, layout="NHWC", opt="all", threads=threads, spinning=True)
    return float((logits.reshape(len(x), -1).argmax(1) == y).mean()), info["ort_version"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", nargs="+", default=["fashion_cnn_qat_w8a8", "fashion_cnn_qat_w4a8", "fashion_cnn_qat_w4a4"])
    ap.add_argument("--fp32", default=os.path.join(ROOT, "runs", "fashion_cnn_fp32", "checkpoint.h5"))
    ap.add_argument("--fp32-onnx", default=os.path.join(ROOT, "tests", "onnx", "models", "fashion_cnn.onnx"))
    ap.add_argument("--fp32-onnx-trained", action="store_true", help="--fp32-onnx holds trained weights")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--json", help="also write the results to this JSON file")
    a = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="bench_ort_")
    x, y = ort_eval.load_images(ort_eval.FASHION + "t10k-images-idx3-ubyte.gz",
                                ort_eval.FASHION + "t10k-labels-idx1-ubyte.gz", 0.2860, 0.3530)
    xt, _ = ort_eval.load_images(ort_eval.FASHION + "train-images-idx3-ubyte.gz",
                                 ort_eval.FASHION + "train-labels-idx1-ubyte.gz", 0.2860, 0.3530, 512)
    x_nchw = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    x256, x1 = x_nchw[:BATCH * BATCHES], x_nchw[BATCH * BATCHES:BATCH * BATCHES + SINGLES]

    rows = []  # {name, kind, model, ...}
    for name in a.runs:
        qdq = ensure_run(a.build, name)
        onnx_path = os.path.join(tmp, name + ".onnx")
        subprocess.run([os.path.join(a.build, "bin", "qat_export"), qdq, onnx_path, "--quiet"], check=True)
        rows.append({"name": "ONNX Runtime, our export of %s" % name, "kind": "ort", "model": onnx_path, "run": name})
        # the example models are quantized for oneDNN: on XNNPACK every layer would be an fp32
        # fallback (u8 activations, per-channel linear weights); bench/peers/int8_infer.py times
        # our XNNPACK device on a model quantized for it
        for backend in ("onednn",):
            rows.append({"name": "ours, %s int8 device, %s" % (backend, name), "kind": "ours", "backend": backend,
                         "model": qdq, "run": name})
    fp32_eval = os.path.join(tmp, "fp32_eval.onnx")
    ortlib.inference_copy(a.fp32_onnx, fp32_eval)
    static = os.path.join(tmp, "quantize_static.onnx")
    quantize_static(fp32_eval, static, np.ascontiguousarray(xt.transpose(0, 3, 1, 2)))
    rows.append({"name": "ONNX Runtime, its quantize_static (QDQ, per-channel, MinMax)", "kind": "ort", "model": static,
                 "trained": a.fp32_onnx_trained})
    rows.append({"name": "ONNX Runtime, fp32", "kind": "ort", "model": fp32_eval, "trained": a.fp32_onnx_trained})

    version = None
    for r in rows:  # accuracy on the whole test set, once
        if r["kind"] == "ort":
            if r.get("trained", True):
                r["accuracy"], version = ort_accuracy(r["model"], x, y, a.threads)
        else:
            out = subprocess.run([os.path.join(a.build, "bin", "qat_report"), r["model"], "--backend", r["backend"],
                                  "--probe-images", "0", "--no-timing"], check=True, capture_output=True, text=True,
                                 env=dict(os.environ, OMP_NUM_THREADS=str(a.threads))).stdout
            m = re.search(r"int8 device\s+top-1\s+([0-9.]+)%", out)
            r["accuracy"] = float(m.group(1)) / 100 if m else None
        r["ips"], r["ms1"] = [], []
    quick = ["--images", "256"]  # the report on 256 images; the timing is qat_report's own
    for rnd in range(a.rounds):
        for r in rows:
            if r["kind"] == "ort":
                ips, ms1 = ort_round(r["model"], x256, x1, a.threads)
            else:
                _, ips, _, _ = run_ours(a.build, r["model"], None, 1, a.threads, r["backend"], extra=quick)
                _, ips1, _, _ = run_ours(a.build, r["model"], None, 1, a.threads, r["backend"],
                                         extra=quick + ["--timing-batch", "1"])
                ms1 = 1000.0 / ips1
            r["ips"].append(ips)
            r["ms1"].append(ms1)
        print("round %d of %d done" % (rnd + 1, a.rounds), flush=True)

    print("\nFashionCNN int8 inference, %d threads, best of %d rounds (batch 256: images/s over %d batches; batch 1: "
          "median ms per image over %d calls)" % (a.threads, a.rounds, BATCHES, SINGLES))
    print("%-72s %10s %10s %9s" % ("", "batch 256", "batch 1", "accuracy"))
    for r in rows:
        r["best_ips"], r["best_ms1"] = max(r["ips"]), min(r["ms1"])
        acc = r.get("accuracy")
        print("%-72s %10.0f %9.3f %9s" % (r["name"], r["best_ips"], r["best_ms1"],
                                          "%.2f%%" % (100 * acc) if acc is not None else "n/a"))
    by = {(r["kind"], r.get("run"), r.get("backend")): r for r in rows}
    for name in a.runs:
        if "w8a8" in name:
            continue
        w8 = by.get(("ort", name.replace("w4a4", "w8a8").replace("w4a8", "w8a8"), None))
        if w8:
            print("ONNX Runtime, %s / W8A8 export: %.2fx at batch 256" % (name, by[("ort", name, None)]["best_ips"]
                                                                            / w8["best_ips"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"onnxruntime": version, "threads": a.threads, "rounds": a.rounds, "machine": platform.processor()
                       or platform.machine(), "cpu": subprocess.run(["sh", "-c", "lscpu | grep 'Model name'"],
                                                                   capture_output=True, text=True).stdout.strip(),
                       "command": " ".join(sys.argv),
                       "rows": [{k: v for k, v in r.items() if k != "model"} for r in rows]}, f, indent=1)
        print("wrote", a.json)


if __name__ == "__main__":
    main()
