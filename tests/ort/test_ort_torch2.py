#!/usr/bin/env python3
"""The whole pipeline on torch 2.x's exports (tests/onnx/make_torch2_models.py): for
t2_mobilenet.onnx (BN kept, weights in the side file t2_mobilenet.onnx.data) and
t2_fashion_cnn_opt.onnx (BN folded by the exporter's default optimize=True), qat_train imports
the file, trains it in fp32 (the sub-run of a QAT run whose fp32 checkpoint is missing), runs
W4A4 QAT, converts, checks and lowers to the int8 device, and writes model_qdq.onnx, which ONNX
Runtime runs. Budget: 1024 training images, 1 fp32 and 1 QAT epoch, the first 512 test images.

Judged: qat_train exits 0; the check passes (summary check.ok); the int8 device is within 1
output LSB of the Q/DQ graph's exact reference (int8_vs_qdq.max_lsb <= 1); ONNX Runtime with
graph optimizations disabled gets exactly the images right that the exact reference gets right
(in count, 0 tolerance); the run that imported the BN-folded file said so once on stderr.

Usage: test_ort_torch2.py BUILD_DIR WORK_DIR
"""
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import ort_eval  # noqa: E402
import ortlib  # noqa: E402

TRAIN, TEST = 1024, 512
FP32 = """[model]
onnx = {onnx}
[data]
format = idx
train_images = {fashion}train-images-idx3-ubyte.gz
train_labels = {fashion}train-labels-idx1-ubyte.gz
test_images = {fashion}t10k-images-idx3-ubyte.gz
test_labels = {fashion}t10k-labels-idx1-ubyte.gz
mean = 0.2860
std = 0.3530
train_limit = {train}
test_limit = {test}
[train]
epochs = 1
batch_size = 64
lr = 0.05
momentum = 0.9
seed = 0
threads = 2
[output]
dir = {out}/fp32
progress = none
"""


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def run(build, work, stem):
    out = os.path.join(work, "torch2_" + stem)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    onnx = os.path.join(ROOT, "tests", "onnx", "models", stem + ".onnx")
    fp32_ini = os.path.join(out, "fp32.ini")
    with open(fp32_ini, "w") as f:
        f.write(FP32.format(onnx=onnx, fashion=ort_eval.FASHION, train=TRAIN, test=TEST, out=out))
    cmd = [os.path.join(build, "bin", "qat_train"), fp32_ini, "output.dir=" + os.path.join(out, "qat"),
           "quant.mode=qat", "quant.weight_bits=4", "quant.activation_bits=4", "quant.learnable_scale=true",
           "quant.fp32_config=" + fp32_ini, "quant.fp32_checkpoint=" + os.path.join(out, "fp32", "checkpoint.h5"),
           "train.lr=0.005", "quant.check_batch=64"]
    r = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        fail("%s: qat_train exited with %d:\n%s" % (stem, r.returncode, r.stderr[-3000:]))
    folded_note = "has no BatchNormalization (its exporter folded BN into the convs)"
    notes = r.stderr.count(folded_note)
    want_notes = 1 if stem.endswith("_opt") else 0
    if notes != want_notes:
        fail("%s: the note on folded BN appears %d times on stderr, want %d" % (stem, notes, want_notes))
    with open(os.path.join(out, "qat", "summary.json")) as f:
        s = json.load(f)
    st = s["stages"]
    if not s.get("check", {}).get("ok"):
        fail("%s: the check failed: %s" % (stem, s.get("check")))
    lsb = s.get("int8_vs_qdq", {}).get("max_lsb")
    if lsb is None or lsb > 1 + 1e-3:  # an LSB measured in float: 1.000001 is one
        fail("%s: the int8 device differs from the Q/DQ graph by %s output LSB (at most 1)" % (stem, lsb))
    onnx_qdq = os.path.join(out, "qat", "model_qdq.onnx")
    if not os.path.exists(onnx_qdq):
        fail("%s: no model_qdq.onnx" % stem)
    x, y = ort_eval.load_images(ort_eval.FASHION + "t10k-images-idx3-ubyte.gz",
                                ort_eval.FASHION + "t10k-labels-idx1-ubyte.gz", 0.2860, 0.3530, TEST)
    logits, info = ortlib.run(onnx_qdq, x, layout="NHWC", opt="disabled")
    ort_correct = int((logits.reshape(TEST, -1).argmax(1) == y).sum())
    exact = round(st["qdq_exact"]["test_accuracy"] * st["qdq_exact"]["test_images"])
    print("%s: fp32 %.2f%%, fake quant %.2f%%, Q/DQ exact %d/%d, int8 device %.2f%% (max %s LSB), ONNX Runtime %s "
          "(optimizations disabled) %d/%d" % (stem, 100 * st["fp32"]["test_accuracy"], 100 * st["fake_quant"]["test_accuracy"],
                                              exact, TEST, 100 * st["int8"]["test_accuracy"], lsb,
                                              info.get("ort_version"), ort_correct, TEST))
    if st["qdq_exact"]["test_images"] != TEST or ort_correct != exact:
        fail("%s: ONNX Runtime gets %d images right, the Q/DQ graph %d" % (stem, ort_correct, exact))


def main():
    build, work = sys.argv[1], sys.argv[2]
    for stem in ("t2_mobilenet", "t2_fashion_cnn_opt"):
        run(build, work, stem)
    print("torch 2.x pipeline: OK")


if __name__ == "__main__":
    main()
