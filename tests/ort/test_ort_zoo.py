#!/usr/bin/env python3
"""The zoo's architectures through the whole pipeline: torchvision's ResNet-18, MobileNetV2,
MobileNetV3-Small, EfficientNet-B0, ShuffleNetV2 x0.5, SqueezeNet 1.1 and VisionTransformer, and
the timm-style ViT, as the TorchScript exporter wrote them (tests/onnx/zoo/, with weights drawn
as torchvision initializes them, its all-zero matrices drawn too: tests/ort/zoo_weights.py
--draw-zeros). Budget per model: TRAIN training images (fp32 1 epoch, SGD lr 0.02, the ViTs
AdamW 2e-3; then QAT W4A8 1 epoch at lr 0.001, the ViTs 2e-4, with the zoo's QAT flags: LSQ,
histogram MSE ranges, the oneDNN Quantizer), the first TEST test images.

Judged, per model:
- import: the imported fp32 forward (tests/onnx/onnx_forward) equals ONNX Runtime's on the same
  file (BN and Dropout in inference mode, graph optimizations disabled) on 8 random images, within
  1e-4 of the largest |logit| (test_ort_torch2.fp32_agrees);
- one training step (BATCH images, fp32 recipe) run twice: the two checkpoints bit-identical;
- QAT W4A8: qat_train exits 0, the check passes (training graph = Q/DQ graph), the int8 device
  runs every partition in int8 for the CNNs (the ViTs: the fallbacks their attention, layer norm,
  position embedding and class token need, and no others), and every partition of the device,
  judged alone on its own inputs against the exact integer reference (summary.json sqnr_db[].alone),
  is within 1 LSB;
- ONNX Runtime (graph optimizations disabled) on the QAT run's model_qdq.onnx against the
  device's logits (qat_run --write-outputs) on the TEST images: at most MAX_OVER of the logits
  more than 1 output LSB apart. Both compute the same Q/DQ graph; where a float32 sum in one and
  the integer sum in the other round a value to different integers (a value on a rounding tie),
  the one-LSB difference travels on through the layers, so deep models reach logits a few LSB
  apart on a few images (printed: the LSB histogram and the top-1 agreement, which on these
  barely trained models, their logits close together, a 1-LSB difference moves; measured at most
  0.16% over 1 LSB). A wrong scale, zero point or op in the export moves many logits: one
  mid-network dequantize scale of ResNet-18's export made 2% larger puts 0.74% of them over,
  5% larger 7.8%;
- ONNX Runtime one partition at a time (tests/ort/ort_alone.py): every activation point of the
  export fed the exact reference's integers, ORT's integers there within 1 LSB of the
  reference's, at most 0.1% of a point's values 1 LSB apart (measured at most 0.005%; the 2%
  larger scale above puts 28% of its partition's values 1 LSB or more apart, 2 LSB at most).

Usage: test_ort_zoo.py BUILD_DIR WORK_DIR [--train N] [--test N] [NAME ...] (default: every
graph in tests/onnx/zoo/).
"""
import glob
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import h5py  # noqa: E402
import numpy as np  # noqa: E402
import ort_alone  # noqa: E402
import ort_eval  # noqa: E402
import ortlib  # noqa: E402
import test_ort_torch2  # noqa: E402
import zoo_weights  # noqa: E402

ZOO = os.path.join(ROOT, "tests", "onnx", "zoo")
TRAIN, TEST, BATCH = 512, 256, 64
MAX_OVER = 0.005  # share of the logits more than 1 output LSB apart
# The fallbacks the ViTs need (the Quantizer leaves these ops in fp32 as PT2E's do).
VIT_FALLBACKS = {"add_param", "attention", "first_token", "layer_norm", "prepend_token"}
CONFIG = test_ort_torch2.MODEL_DATA + """[train]
epochs = 1
batch_size = {batch}
{optimizer}
seed = 0
threads = 2
[output]
dir = {out}
progress = none
"""
SGD = "optimizer = sgd\nlr = 0.02\nmomentum = 0.9\nweight_decay = 5e-4"
ADAMW = "optimizer = adamw\nlr = 0.002\nweight_decay = 0.05"
fail = test_ort_torch2.fail
QAT = ["quant.mode=qat", "quant.weight_bits=4", "quant.activation_bits=8", "quant.quantizer=onednn",
       "quant.learnable_scale=true", "quant.activation_observer=histogram", "quant.activation_range=mse",
       "quant.check_batch=64"]


def qat_train(build, args, what, name):
    r = subprocess.run([os.path.join(build, "bin", "qat_train")] + args, cwd=ROOT, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
    if r.returncode != 0:
        fail("%s: %s: qat_train exited with %d:\n%s" % (name, what, r.returncode, r.stderr[-3000:]))


def write_config(path, onnx, out, train, test, vit):
    with open(path, "w") as f:
        f.write(CONFIG.format(onnx=onnx, fashion=ort_eval.FASHION, train=train, test=test, batch=BATCH,
                              optimizer=ADAMW if vit else SGD, out=out))


def datasets(path):
    vals = []
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: vals.append((n, o[...].tobytes())) if isinstance(o, h5py.Dataset) else None)
    return vals


def one_step(build, out, onnx, name, vit):
    """The fp32 recipe's first step (one batch) twice: bit-identical checkpoints."""
    runs = []
    for k in range(2):
        cfg = os.path.join(out, "step%d.ini" % k)
        write_config(cfg, onnx, os.path.join(out, "step%d" % k), BATCH, BATCH, vit)
        qat_train(build, [cfg], "one training step", name)
        runs.append(datasets(os.path.join(out, "step%d" % k, "checkpoint.h5")))
    if not runs[0] or runs[0] != runs[1]:
        fail("%s: one training step, run twice, wrote different checkpoints" % name)
    print("%s: one training step run twice: %d checkpoint datasets bit-identical" % (name, len(runs[0])))


def run(build, work, src):
    name = os.path.basename(src)[:-len(".onnx")]
    vit = name.startswith("vit")
    out = os.path.join(work, name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    onnx = zoo_weights.materialize(src, os.path.join(out, "model"), draw_zeros=True)
    test_ort_torch2.fp32_agrees(build, out, onnx, name)
    one_step(build, out, onnx, name, vit)
    fp32_ini = os.path.join(out, "fp32.ini")
    write_config(fp32_ini, onnx, os.path.join(out, "fp32"), TRAIN, TEST, vit)
    qat_train(build, [fp32_ini], "fp32", name)
    qat_dir = os.path.join(out, "qat")
    qat_train(build, [fp32_ini, "output.dir=" + qat_dir, "quant.fp32_config=" + fp32_ini,
                      "quant.fp32_checkpoint=" + os.path.join(out, "fp32", "checkpoint.h5"),
                      "train.lr=%s" % ("0.0002" if vit else "0.001")] + QAT, "QAT W4A8", name)
    with open(os.path.join(qat_dir, "summary.json")) as f:
        s = json.load(f)
    if not s.get("check", {}).get("ok"):
        fail("%s: the check failed: %s" % (name, s.get("check")))
    low = s["lowering"]
    fallback_ops = {fb["reason"].split(" in fp32")[0] for fb in low["fallbacks"]}
    allowed = VIT_FALLBACKS if vit else set()
    if not fallback_ops <= allowed or low["int8_partitions"] < 1:
        fail("%s: %d int8 partitions, fallbacks %s (allowed: %s)" % (name, low["int8_partitions"],
                                                                    sorted(fallback_ops), sorted(allowed)))
    alone = [(p["point"], p["alone"]["max_lsb"]) for p in s["sqnr_db"] if "alone" in p]
    worst = max(alone, key=lambda a: a[1]) if alone else None
    if not alone or worst[1] > 1:
        fail("%s: partitions judged alone against the exact reference: %s (at most 1 LSB)" % (name, worst or "none"))
    dev_h5 = os.path.join(out, "device.h5")
    r = subprocess.run([os.path.join(build, "bin", "qat_run"), os.path.join(qat_dir, "model_qdq.h5"), "--config",
                        fp32_ini, "--images", str(TEST), "--quiet", "--write-outputs", dev_h5],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        fail("%s: qat_run: %s" % (name, r.stdout[-2000:]))
    with h5py.File(dev_h5, "r") as f:
        dev, labels = f["logits"][...], f["labels"][...]
    x, y = ort_eval.load_images(ort_eval.FASHION + "t10k-images-idx3-ubyte.gz",
                                ort_eval.FASHION + "t10k-labels-idx1-ubyte.gz", 0.2860, 0.3530, TEST)
    if not np.array_equal(y, labels):
        fail("%s: qat_run's labels are not the first %d test labels" % (name, TEST))
    logits, info = ortlib.run(os.path.join(qat_dir, "model_qdq.onnx"), x, layout="NHWC", opt="disabled")
    logits = logits.reshape(dev.shape)
    lsb = np.rint(np.abs(logits.astype(np.float64) - dev) / s["int8_vs_qdq"]["output_scale"]).astype(int)
    top1 = float((logits.argmax(1) == dev.argmax(1)).mean())
    over = float((lsb > 1).mean())
    hist = {k: int((lsb == k).sum()) for k in range(int(lsb.max()) + 1) if (lsb == k).any()}
    st = s["stages"]
    exact = round(st["qdq_exact"]["test_accuracy"] * st["qdq_exact"]["test_images"])
    print("%s: QAT W4A8 fake quant %.2f%%, Q/DQ exact %d/%d; device: %d int8 / %d fallback partitions %s, every "
          "partition alone within %d LSB of the exact reference (%s), end to end max %s LSB of the Q/DQ graph; "
          "ONNX Runtime %s (optimizations disabled) %d/%d right, against the device: top-1 %.2f%%, logits by "
          "LSB %s, %.2f%% over 1" % (name, 100 * st["fake_quant"]["test_accuracy"], exact, TEST,
                                     low["int8_partitions"], low["fallback_partitions"], sorted(fallback_ops),
                                     worst[1], worst[0], s["int8_vs_qdq"]["max_lsb"], info.get("ort_version"),
                                     int((logits.argmax(1) == y).sum()), TEST, 100 * top1, hist, 100 * over))
    if over > MAX_OVER:
        fail("%s: ONNX Runtime against the device: %.2f%% of the logits more than 1 LSB apart (at most %.1f%%)" % (
            name, 100 * over, 100 * MAX_OVER))
    try:
        a = ort_alone.judge(build, os.path.join(qat_dir, "model_qdq.h5"), os.path.join(qat_dir, "model_qdq.onnx"),
                            fp32_ini, TEST, out)
        bad = ort_alone.failing(a)
    except (OSError, ort_alone.AloneError) as e:
        fail("%s: ONNX Runtime partition by partition: %s" % (name, e))
    print("%s: ONNX Runtime on the exact reference's integers, %s" % (name, ort_alone.summary(a)))
    if bad:
        fail("%s: ONNX Runtime partition by partition against the exact reference: over 1 LSB, or more than "
             "%.1f%% of the values 1 LSB apart, at %s" % (name, 100 * ort_alone.MAX_ONE_LSB_SHARE, bad))


def main():
    global TRAIN, TEST
    build, work, args, names = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2]), sys.argv[3:], []
    while args:
        a = args.pop(0)
        if a in ("--train", "--test"):
            n = int(args.pop(0))
            TRAIN = n if a == "--train" else TRAIN
            TEST = n if a == "--test" else TEST
        else:
            names.append(a)
    srcs = [os.path.join(ZOO, n + ".onnx") for n in names] or sorted(glob.glob(os.path.join(ZOO, "*.onnx")))
    if len(srcs) < 1:
        fail("no zoo graphs in %s" % ZOO)
    for src in srcs:
        if not os.path.exists(src):
            fail("%s: no such graph (tests/onnx/make_zoo_models.py writes them)" % src)
        run(build, work, src)
    print("zoo pipeline: OK (%d models)" % len(srcs))


if __name__ == "__main__":
    main()
