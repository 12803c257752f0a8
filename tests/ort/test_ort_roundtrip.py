#!/usr/bin/env python3
"""The round trip as a test (docs/onnx_import.md, "Round trip"): a model trained in PyTorch and exported to ONNX
(tests/onnx/models/mobilenet_trained.onnx and PyTorch's test-set logits, tests/onnx/ref/
roundtrip_ref.h5, both from tests/onnx/make_roundtrip_model.py) goes through
experiments/mobilenet_trained_onnx_qat_w8a8.ini on a small budget (QAT W8A8 for one epoch of 3000
training images, the first 2000 test images):

1. the import: qat_train's fp32 accuracy (stages.fp32, the file's own weights before any training)
   equals PyTorch's on the same test images, image for image in count (0 tolerance);
2. the export: model_qdq.onnx, run in ONNX Runtime with graph optimizations disabled, has exactly
   the Q/DQ graph's accuracy (stages.qdq_exact, the exact integer reference);
3. with ORT's default optimizations the accuracy is printed beside it (not judged here: the
   agreement test states it per logit).

Usage: test_ort_roundtrip.py BUILD_DIR WORK_DIR
"""
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import ort_eval  # noqa: E402
import ortlib  # noqa: E402

TRAIN, TEST = 3000, 2000


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def main():
    build, work = sys.argv[1], sys.argv[2]
    out = os.path.join(work, "roundtrip")
    shutil.rmtree(out, ignore_errors=True)
    cmd = [os.path.join(build, "bin", "qat_train"), os.path.join(ROOT, "experiments", "mobilenet_trained_onnx_qat_w8a8.ini"),
           "data.train_limit=%d" % TRAIN, "data.test_limit=%d" % TEST, "output.dir=" + out, "output.progress=none"]
    r = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        fail("qat_train exited with %d:\n%s" % (r.returncode, r.stdout[-3000:]))
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    st = s["stages"]
    x, y = ort_eval.load_images(ort_eval.FASHION + "t10k-images-idx3-ubyte.gz",
                                ort_eval.FASHION + "t10k-labels-idx1-ubyte.gz", 0.2860, 0.3530, TEST)

    # 1. the import against PyTorch
    with h5py.File(os.path.join(ROOT, "tests", "onnx", "ref", "roundtrip_ref.h5"), "r") as f:
        torch_pred = f["pred"][:TEST]
        torch_full = float(f.attrs["accuracy"])
    torch_correct = int((torch_pred == y).sum())
    ours_correct = round(st["fp32"]["test_accuracy"] * st["fp32"]["test_images"])
    print("import: PyTorch %d/%d correct (%.2f%%; %.2f%% on all 10000), qat_train's fp32 graph %d/%d"
          % (torch_correct, TEST, 100.0 * torch_correct / TEST, 100 * torch_full, ours_correct, TEST))
    if st["fp32"]["test_images"] != TEST or ours_correct != torch_correct:
        fail("the imported model's fp32 accuracy differs from PyTorch's on the same images")

    # 2. the export in ONNX Runtime against the Q/DQ graph
    onnx_path = os.path.join(out, "model_qdq.onnx")
    if s.get("convert", {}).get("onnx_model") is None or not os.path.exists(onnx_path):
        fail("qat_train wrote no model_qdq.onnx (summary convert.onnx_model: %s)" % s.get("convert"))
    exact = round(st["qdq_exact"]["test_accuracy"] * st["qdq_exact"]["test_images"])
    res = {}
    for opt in ("disabled", "all"):
        logits, info = ortlib.run(onnx_path, x, layout="NHWC", opt=opt)
        res[opt] = int((logits.reshape(TEST, -1).argmax(1) == y).sum())
        print("export: ONNX Runtime %s, optimizations %s: %d/%d correct" % (info.get("ort_version"), opt, res[opt],
                                                                           TEST))
    print("Q/DQ graph (exact reference) %d/%d, float32 executor %.2f%%, int8 device (oneDNN) %.2f%%; fake quant %.2f%%"
          % (exact, TEST, 100 * st["qdq"]["test_accuracy"], 100 * st["int8"]["test_accuracy"],
             100 * st["fake_quant"]["test_accuracy"]))
    if res["disabled"] != exact:
        fail("ONNX Runtime (optimizations disabled) gets %d images right, the Q/DQ graph %d" % (res["disabled"], exact))
    print("round trip: OK")


if __name__ == "__main__":
    main()
