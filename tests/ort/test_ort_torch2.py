#!/usr/bin/env python3
"""The whole pipeline on torch 2.x's exports (tests/onnx/make_torch2_models.py): for
t2_mobilenet.onnx (BN kept, weights in the side file t2_mobilenet.onnx.data) and
t2_fashion_cnn_opt.onnx (BN folded by the exporter's default optimize=True), qat_train imports
the file, trains it in fp32 (the sub-run of a QAT run whose fp32 checkpoint is missing), runs
W4A4 QAT, converts, checks and lowers to the int8 device, and writes model_qdq.onnx, which ONNX
Runtime runs. Budget: 1024 training images, 1 fp32 and 1 QAT epoch, the first 512 test images.

Judged: before any training, the imported model's fp32 forward (tests/onnx/onnx_forward) equals
ONNX Runtime's on the same file (BN and Dropout in inference mode: ortlib.inference_copy; graph
optimizations disabled) on 8 random images, within 1e-4 of
the largest |logit| (float sums in another order through up to 20 layers); qat_train exits 0; the check passes (summary check.ok); the int8 device is within 1
output LSB of the Q/DQ graph's exact reference (int8_vs_qdq.max_lsb <= 1); ONNX Runtime with
graph optimizations disabled gets exactly the images right that the exact reference gets right
(in count; 0 tolerance unless --ort-slack); the run that imported the BN-folded file said so once on stderr.

Usage: test_ort_torch2.py BUILD_DIR WORK_DIR [--train N] [--test N] [--ort-slack N] [MODEL.onnx ...]
(other models and budgets: bench/peers/torch2_zoo.sh runs torchvision's through it; deeper
models run in ONNX Runtime's float Q/DQ arithmetic may land a few images off the exact integer
reference, which --ort-slack allows and the output states).
"""
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import numpy as np  # noqa: E402
import onnx as onnx_lib  # noqa: E402
import ort_eval  # noqa: E402
import ortlib  # noqa: E402

TRAIN, TEST = 1024, 512
TOL_FP32 = 1e-4
SLACK = 0  # images ORT's and the exact reference's counts may differ by (--ort-slack)
# A config's [model] and [data]: the ONNX file and the first {train} / {test} Fashion-MNIST
# images (test_ort_zoo.py writes its configs from it too).
MODEL_DATA = """[model]
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
"""
FP32 = MODEL_DATA + """[train]
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


def fp32_agrees(build, out, onnx, stem):
    x = np.random.default_rng(0).standard_normal((8, 1, 28, 28)).astype(np.float32)
    ref = os.path.join(out, "inference.onnx")  # BN and Dropout in inference mode, as imported
    ortlib.inference_copy(onnx, ref)
    y_ort, _ = ortlib.run(ref, x, layout="NCHW", opt="disabled", batch=2)  # batch 2: static exports too
    x_path, y_path = os.path.join(out, "x.f32"), os.path.join(out, "y.f32")
    np.ascontiguousarray(x.transpose(0, 2, 3, 1)).tofile(x_path)
    r = subprocess.run([os.path.join(build, "tests", "onnx", "onnx_forward"), onnx, x_path, "8", y_path],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        fail("%s: onnx_forward: %s" % (stem, r.stdout))
    y = np.fromfile(y_path, dtype=np.float32).reshape(8, -1)
    y_ort = y_ort.reshape(8, -1)
    rel = float(np.abs(y - y_ort).max() / np.abs(y_ort).max())
    print("%s: fp32 import vs ONNX Runtime on 8 random images: max difference %.2e of max |logit|" % (stem, rel))
    if not rel <= TOL_FP32:
        fail("%s: the imported model's fp32 logits differ from ONNX Runtime's by %.2e of max |logit| (> %.0e)"
             % (stem, rel, TOL_FP32))


def run(build, work, onnx):
    stem = os.path.basename(onnx)[:-len(".onnx")]
    out = os.path.join(work, "torch2_" + stem)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    fp32_agrees(build, out, onnx, stem)
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
    folded_note = "has no BatchNormalization; if the PyTorch model has BN, its exporter folded it"
    notes = r.stderr.count(folded_note)
    graph = onnx_lib.load(onnx, load_external_data=False).graph
    want_notes = 0 if any(n.op_type == "BatchNormalization" for n in graph.node) else 1
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
    if st["qdq_exact"]["test_images"] != TEST or abs(ort_correct - exact) > SLACK:
        fail("%s: ONNX Runtime gets %d images right, the Q/DQ graph %d (at most %d apart)" % (stem, ort_correct, exact,
                                                                                          SLACK))


def main():
    global TRAIN, TEST, SLACK
    build, work, args, models = sys.argv[1], sys.argv[2], sys.argv[3:], []
    while args:
        a = args.pop(0)
        if a in ("--train", "--test", "--ort-slack"):
            n = int(args.pop(0))
            TRAIN = n if a == "--train" else TRAIN
            TEST = n if a == "--test" else TEST
            SLACK = n if a == "--ort-slack" else SLACK
        else:
            models.append(os.path.abspath(a))
    models = models or [os.path.join(ROOT, "tests", "onnx", "models", s + ".onnx")
                        for s in ("t2_mobilenet", "t2_fashion_cnn_opt")]
    for onnx in models:
        run(build, work, onnx)
    print("torch 2.x pipeline: OK")


if __name__ == "__main__":
    main()
