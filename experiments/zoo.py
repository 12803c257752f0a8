#!/usr/bin/env python3
"""torchvision's CNN zoo and a small vision transformer through the whole pipeline: fp32 -> PTQ W8A8 -> QAT W4A8 -> check ->
int8 device -> QDQ ONNX -> ONNX Runtime, one row per model, into experiments/results/zoo.md
(+ zoo.json).

    bench/peers/.venv/bin/python experiments/zoo.py                    # every model, runs/zoo/
    bench/peers/.venv/bin/python experiments/zoo.py --models squeezenet1_1 --train-limit 2048
    bench/peers/.venv/bin/python experiments/zoo.py --models resnet18 --torch-only   # the PyTorch column alone
    bench/peers/.venv/bin/python experiments/zoo.py --models squeezenet1_1 --seeds 5 --keep  # + fp32 over 5 seeds
    bench/peers/.venv/bin/python experiments/zoo.py --pt2e             # PT2E on the rows' fp32 checkpoints

Runs with the peers' environment (bench/peers/setup_peers.sh makes it: torch 2.x, torchvision,
onnxruntime, h5py), by hand, never in CI. Each model is torchvision's, built with 10 classes, its
first convolution taking 1 channel (Fashion-MNIST's 1x28x28), exported by the TorchScript
exporter in training mode (BN kept, opset 17, dynamic batch); EfficientNet-B0 with
stochastic_depth_prob=0 (in training mode its stochastic depth exports random ops, which the
importer refuses). The ViT is tests/onnx/make_act_models.py's (timm's style: 4x4 patches of
1x28x28 as 49 tokens of 32 features, 2 pre-norm blocks of 4 heads, q, k, v as separate linear
maps); vit_torchvision is torchvision's VisionTransformer of the same size (nn.MultiheadAttention
with its packed in_proj, a class token, x[:, 0] to the head). Both train with
experiments/vit_onnx_fp32.ini's recipe (AdamW 2e-3, weight decay 0.05) and QAT at lr 2e-4. Then build/bin/qat_train, as a user would:
  - fp32: experiments/mobilenet_onnx_fp32.ini's recipe (SGD 0.05, cosine, batch 128; the ViT's above) for
    --fp32-epochs on the first --train-limit training images;
  - PTQ W8A8 (oneDNN Quantizer, histogram MSE ranges) and QAT W4A8 (LSQ, --qat-epochs at lr
    0.005, BN frozen after the first epoch) from that checkpoint; each converts, checks the
    training graph against the Q/DQ graph, lowers to the oneDNN int8 device and exports
    model_qdq.onnx;
  - the first --test-limit test images for every accuracy;
  - ONNX Runtime (graph optimizations disabled) runs the QAT run's model_qdq.onnx on the first
    256 test images, against the int8 device's logits (qat_run --write-outputs), in output LSB;
  - the fp32 recipe's first training step twice (train_limit 128, 1 epoch), its checkpoints
    compared bit for bit;
  - PyTorch trains the same model from the same initial weights with the same recipe and images
    (bench/peers/pt2e.py's loop): the fp32 column's reference.
--pt2e (alone: for the --models' rows of OUT/zoo.json) loads each row's fp32 checkpoint (ours) into
the PyTorch module and quantizes it with PT2E (torchao's prepare_pt2e / prepare_qat_pt2e /
convert_pt2e, bench/peers/pt2e.py): PTQ W8A8 with XNNPACKQuantizer and X86InductorQuantizer (the
same 32 calibration batches of 128 training images), QAT W4A8 with XNNPACKQuantizer (the QAT
recipe above, without LSQ: PT2E's fake quant keeps observer ranges); so the quantizers are
compared on one fp32 model. The module's fp32 accuracy with our weights is recorded as the check
that the weights were mapped.
Figures of time and memory are qat_train's own (summary.json: train images/s, peak RSS).
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import time

import h5py
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "ort"))
import ort_eval  # noqa: E402
import ortlib  # noqa: E402

MODELS = ["resnet18", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0", "shufflenet_v2_x0_5",
          "squeezenet1_1", "vit", "vit_torchvision"]
# per model kind: the fp32 recipe, the names in it that the run replaces, the QAT learning rate
RECIPES = {"cnn": (os.path.join(ROOT, "experiments", "mobilenet_onnx_fp32.ini"), "tests/onnx/models/mobilenet.onnx",
                   "runs/mobilenet_onnx_fp32", "0.005"),
           "vit": (os.path.join(ROOT, "experiments", "vit_onnx_fp32.ini"), "tests/onnx/models/vit.onnx",
                   "runs/vit_onnx_fp32", "0.0002")}
# Per model, where the shared recipe does not train it: the fp32 learning rate, and the BN
# momentum (PyTorch's convention) the model is built with. torchvision's MobileNetV3 has BN
# momentum 0.01, made for 600 ImageNet epochs: after the recipe's 128 steps its running
# statistics are still 28% their initial values, and eval accuracy is chance (9.85% here and in
# PyTorch alike, whose training mode reaches 79%). SqueezeNet (no BN) is fragile: PyTorch
# reaches 19% at lr 0.05; at 0.02 some seeds stay at chance, ours and PyTorch's (ours: seed 0;
# with a linear warmup of a quarter or half an epoch, more of them); at 0.01 every seed of 0 to 4
# trains (--seeds). EfficientNet-B0's first epoch at 0.05 ends above chance's loss (ours 3.39,
# 38.40% after the 2 epochs; PyTorch 58.85%), and QAT from there diverges; at 0.02 ours reaches
# 67.60% (0.01: 68.15%).
FP32_LR = {"squeezenet1_1": "0.01", "efficientnet_b0": "0.02"}
# Per model, where --fp32-epochs leaves it far from trained: its fp32 epochs. EfficientNet-B0
# after 2 epochs: 67.60%, after 4: 74.95% (qat_train runs/zoo/efficientnet_b0/fp32.ini
# train.epochs=4).
FP32_EPOCHS = {"efficientnet_b0": 4}
# Per model, where one QAT epoch does not recover the fp32 accuracy: the QAT epochs (else
# --qat-epochs). EfficientNet-B0 at W4A8 (LSQ, lr 0.005, cosine) from its 4-epoch fp32 checkpoint
# (74.95%): fake quant 69.05, 71.95, 73.75, 75.00% after epochs 1 to 4 of a 4-epoch run, Q/DQ
# 74.80%; 71.55% (Q/DQ) after a 2-epoch run.
QAT_EPOCHS = {"efficientnet_b0": 4}


def fp32_epochs(args, name):
    return FP32_EPOCHS.get(name, args.fp32_epochs)


def qat_epochs(args, name):
    return QAT_EPOCHS.get(name, args.qat_epochs)
BN_MOMENTUM = {"mobilenet_v3_small": 0.1}
QAT = ["quant.mode=qat", "quant.weight_bits=4", "quant.activation_bits=8", "quant.quantizer=onednn",
       "train.schedule=cosine", "train.min_lr=0", "quant.learnable_scale=true",
       "quant.activation_observer=histogram", "quant.activation_range=mse", "quant.freeze_bn_after=1"]
PTQ = ["quant.mode=ptq", "quant.weight_bits=8", "quant.activation_bits=8", "quant.quantizer=onednn",
       "quant.calibration_batches=32", "quant.activation_observer=histogram", "quant.activation_range=mse"]


def build(name):
    import torch.nn as nn
    import torchvision
    if name == "vit":
        sys.path.insert(0, os.path.join(ROOT, "tests", "onnx"))
        import make_act_models
        return make_act_models.ViT()
    if name == "vit_torchvision":  # the ViT's size: 4x4 patches, 2 layers of 4 heads, 32 features, MLP 64
        m = torchvision.models.VisionTransformer(image_size=28, patch_size=4, num_layers=2, num_heads=4, hidden_dim=32,
                                                 mlp_dim=64, num_classes=10)
        m.conv_proj = nn.Conv2d(1, 32, 4, 4)
        return m
    kw = {"num_classes": 10}
    if name == "efficientnet_b0":
        kw["stochastic_depth_prob"] = 0.0
    m = getattr(torchvision.models, name)(**kw)
    if name in BN_MOMENTUM:
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.momentum = BN_MOMENTUM[name]
    for path, mod in m.named_modules():  # the first convolution takes 1 channel
        if isinstance(mod, nn.Conv2d) and mod.in_channels == 3:
            parent = m
            for p in path.split(".")[:-1]:
                parent = getattr(parent, p)
            setattr(parent, path.split(".")[-1],
                    nn.Conv2d(1, mod.out_channels, mod.kernel_size, mod.stride, mod.padding, bias=mod.bias is not None))
            break
    return m


def recipe_kind(name):
    return "vit" if name.startswith("vit") else "cnn"


def write_fp32_config(name, onnx_path, out_dir, path, epochs, train_limit, test_limit):
    """The model's fp32 recipe (RECIPES) for onnx_path, written to `path`: its output in out_dir, the
    data limits in the file, so that the PTQ and QAT runs reuse its fp32 checkpoint
    (quant.fp32_config: a run whose [data] differs trains its own)."""
    ini, ini_model, ini_dir, _ = RECIPES[recipe_kind(name)]
    with open(ini) as f:
        text = f.read()
    # the recipe's own header comment describes its model: this file's names the zoo's
    body = text[text.index("[model]"):]
    text = ("; %s (%s, exported from %s), trained in fp32 by experiments/zoo.py with the recipe of\n"
            "; %s; the epochs and data limits below (and the learning rate where FP32_LR sets one) are the zoo's.\n" % (
                name, onnx_path, "tests/onnx/make_act_models.py" if name == "vit" else "torchvision",
                os.path.relpath(ini, ROOT))) + body
    text = text.replace(ini_model, onnx_path).replace(ini_dir, out_dir)
    text = text.replace("epochs = 4", "epochs = %d" % epochs)
    if name in FP32_LR:
        assert "\nlr = 0.05\n" in text
        text = text.replace("\nlr = 0.05\n", "\nlr = %s\n" % FP32_LR[name])
    text = text.replace("[data]\n", "[data]\ntrain_limit = %d\ntest_limit = %d\n" % (train_limit, test_limit), 1)
    with open(path, "w") as f:
        f.write(text)


def export(name, path):
    import torch
    torch.manual_seed(0)
    m = build(name).train()
    torch.onnx.export(m, torch.randn(2, 1, 28, 28), path, opset_version=17, dynamo=False,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})


def qat_train(args, config, overrides, log):
    cmd = [os.path.join(args.build, "bin", "qat_train"), config] + overrides
    t0 = time.time()
    with open(log, "w") as f:
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT,
                             env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
    return rc, time.time() - t0, " ".join(cmd[1:])


def summary(d):
    with open(os.path.join(d, "summary.json")) as f:
        return json.load(f)


def acc(s, stage):
    st = s.get("stages", {}).get(stage)
    return round(100 * st["test_accuracy"], 2) if st else None


def ort_vs_device(args, d, out_scale):
    """ORT (optimizations off) on model_qdq.onnx against the int8 device's logits, 256 images."""
    n = 256
    dev = os.path.join(d, "device_outputs.h5")
    rc = subprocess.call([os.path.join(args.build, "bin", "qat_run"), os.path.join(d, "model_qdq.h5"), "--images",
                          str(n), "--quiet", "--write-outputs", dev], cwd=ROOT, stdout=subprocess.DEVNULL)
    if rc:
        return {"error": "qat_run exit %d" % rc}
    with h5py.File(dev, "r") as f:
        want = f["logits"][...]
    x, _ = ort_eval.load_images(ort_eval.FASHION + "t10k-images-idx3-ubyte.gz",
                                ort_eval.FASHION + "t10k-labels-idx1-ubyte.gz", 0.2860, 0.3530, n)
    y, info = ortlib.run(os.path.join(d, "model_qdq.onnx"), x, layout="NHWC", opt="disabled")
    lsb = np.abs(y.astype(np.float64) - want) / out_scale
    return {"images": n, "max_lsb": round(float(lsb.max()), 2),
            "top1_agreement": float((y.argmax(1) == want.argmax(1)).mean()), "ort_version": info["ort_version"]}


def torch_fp32(name, config, train_limit, test_limit, seed=None):
    """PyTorch's own training of the model with the same recipe (config's [train]; its seed, or
    `seed`, draws the batches' order), from the same initial weights (torch.manual_seed(0) before
    building, as export() does), on the same images: the test accuracy (%) of the fp32 column's
    reference. The batches' order is PyTorch's."""
    import torch
    sys.path.insert(0, os.path.join(ROOT, "bench", "peers"))
    import common
    import models
    import pt2e
    rec = common.recipe(name, "fp32", config)
    torch.manual_seed(0)
    m = build(name)
    x, y = models.load_fashion("train", train_limit)
    xt, yt = models.load_fashion("t10k", test_limit)
    t0 = time.time()
    pt2e.train_epochs(m, x, y, rec, int(rec["seed"]) if seed is None else seed, int(rec["epochs"]))
    return round(100 * models.accuracy(m, xt, yt), 2), round(time.time() - t0, 1)


def fp32_seeds(args, row, d, config):
    """The fp32 recipe trained with train.seed 0 .. --seeds - 1 (the batches' order and, where the
    model has Dropout, its masks), ours and PyTorch's: their test accuracies (%), for models whose
    training is fragile at this recipe. The recipe's own seed is the row's fp32 runs."""
    sys.path.insert(0, os.path.join(ROOT, "bench", "peers"))
    import common
    name, own = row["model"], int(common.recipe(row["model"], "fp32", config)["seed"])
    ours, theirs = [], []
    for k in range(args.seeds):
        if k == own:
            ours.append(row["fp32"])
            theirs.append(row["torch_fp32"])
            continue
        out = os.path.join(d, "fp32_seed%d" % k)
        rc, _, _ = qat_train(args, config, ["train.seed=%d" % k, "output.dir=" + out],
                             os.path.join(d, "fp32_seed%d.log" % k))
        ours.append(acc(summary(out), "fp32") if rc == 0 else None)
        theirs.append(torch_fp32(name, config, args.train_limit, args.test_limit, seed=k)[0])
    return ours, theirs


def load_ours(name, ckpt):
    """The PyTorch module of `name` with our fp32 checkpoint's parameters and BN statistics (names as
    the importer keeps them: the module's own; a 1x1 conv the importer holds as a linear map, or a
    linear map it holds as a 1x1 conv, is reshaped)."""
    import torch
    torch.manual_seed(0)
    m = build(name)
    sd = m.state_dict()
    seen = set()
    sys.path.insert(0, os.path.join(ROOT, "tests", "onnx"))
    # the importer's names: of nn.MultiheadAttention's in_proj, of long module names, and <name>.weight
    # of a parameter that is a module's attribute (a position embedding, a class token)
    import make_mha_models
    theirs = {ours: t for t, ours in make_mha_models.ir_names(m).items()}
    with h5py.File(ckpt, "r") as f:
        for grp in ("params", "buffers"):
            for k in f[grp]:
                a = torch.from_numpy(np.asarray(f[grp][k]))
                if k not in sd and k in theirs and sd[theirs[k]].numel() == a.numel():
                    k = theirs[k]
                    a = a.reshape(sd[k].shape)
                if k not in sd:
                    raise ValueError("our tensor %s has no counterpart in the PyTorch module" % k)
                if sd[k].shape != a.shape:
                    # a 1x1 conv held as a linear map, or a linear map held as a 1x1 conv (per token)
                    if sd[k].shape[:2] != a.shape[:2] or sd[k].numel() != a.numel() or {sd[k].dim(), a.dim()} != {2, 4}:
                        raise ValueError("%s: ours %s, PyTorch's %s" % (k, tuple(a.shape), tuple(sd[k].shape)))
                    a = a.reshape(sd[k].shape)
                sd[k] = a
                seen.add(k)
    missing = [k for k in sd if k not in seen and not k.endswith("num_batches_tracked")]
    if missing:
        raise ValueError("the PyTorch module's %s not in our checkpoint" % ", ".join(missing[:3]))
    m.load_state_dict(sd)
    return m


def pt2e_columns(args, name):
    """PT2E PTQ W8A8 (XNNPACK, X86 Inductor) and QAT W4A8 (XNNPACK) of our fp32 checkpoint: test
    accuracies (%), or the error."""
    sys.path.insert(0, os.path.join(ROOT, "bench", "peers"))
    import common
    import models
    import pt2e
    d = os.path.join(args.runs, name)
    config = os.path.join(d, "fp32.ini")
    out = {}
    try:
        m = load_ours(name, os.path.join(d, "fp32", "checkpoint.h5"))
    except (ValueError, OSError, KeyError) as e:
        return {"error": "loading our checkpoint: %s" % e}
    x, y = models.load_fashion("train", args.train_limit)
    xt, yt = models.load_fashion("t10k", args.test_limit)
    out["fp32_ours_in_torch"] = round(100 * models.accuracy(m.eval(), xt, yt), 2)
    rec = common.recipe(name, "fp32", config)
    calib = pt2e.calibration_batches(x, y, rec, 0, 32)
    for kind in ("xnnpack", "x86"):
        try:
            out["ptq_w8a8_" + kind] = round(100 * pt2e.run_ptq(m, kind, "w8a8", calib, xt, yt)[0], 2)
        except Exception as e:  # a peer's failure is a result, reported with its message
            out["ptq_w8a8_" + kind] = "error: %s" % str(e).splitlines()[0][:160]
    qrec = dict(rec, lr=float(RECIPES[recipe_kind(name)][3]), epochs=qat_epochs(args, name), freeze_bn_after=1.0,
                schedule="cosine", min_lr=0.0)
    try:
        out["qat_w4a8_xnnpack"] = round(100 * pt2e.run_qat(m, "xnnpack", "w4a8", qrec, int(rec["seed"]), x, y, xt,
                                                           yt)[0], 2)
    except Exception as e:
        out["qat_w4a8_xnnpack"] = "error: %s" % str(e).splitlines()[0][:160]
    return out


def repeatable(args, d, config):
    """The fp32 recipe's first training step twice: bit-identical checkpoints?"""
    params = []
    for k in range(2):
        out = os.path.join(d, "step%d" % k)
        rc, _, _ = qat_train(args, config, ["train.epochs=1", "data.train_limit=128", "data.test_limit=128",
                                            "output.dir=" + out], os.path.join(d, "step%d.log" % k))
        if rc:
            return None
        with h5py.File(os.path.join(out, "checkpoint.h5"), "r") as f:
            vals = []
            f.visititems(lambda n, o: vals.append((n, o[...].tobytes())) if isinstance(o, h5py.Dataset) else None)
            params.append(vals)
    return params[0] == params[1]


def run_model(args, name):
    d = os.path.join(args.runs, name)
    os.makedirs(d, exist_ok=True)
    onnx_path = os.path.join(d, name + ".onnx")
    row = {"model": name}
    t0 = time.time()
    export(name, onnx_path)
    row["export_s"] = round(time.time() - t0, 1)
    fp32_dir = os.path.join(d, "fp32")
    config = os.path.join(d, "fp32.ini")
    write_fp32_config(name, onnx_path, fp32_dir, config, fp32_epochs(args, name), args.train_limit, args.test_limit)
    qat_lr = RECIPES[recipe_kind(name)][3]
    limits = []
    rc, sec, cmd = qat_train(args, config, limits, os.path.join(d, "fp32.log"))
    row["fp32_rc"], row["fp32_s"] = rc, round(sec, 1)
    if rc:
        row["error"] = "fp32 run: exit %d (%s)" % (rc, os.path.join(d, "fp32.log"))
        return row
    s = summary(fp32_dir)
    row["params"] = s.get("parameters")
    row["fp32"] = acc(s, "fp32")
    row["train_images_per_s"] = s["train"]["images_per_s"]
    row["peak_rss_mb"] = s["train"]["peak_rss_mb"]
    row["torch_fp32"], row["torch_fp32_s"] = torch_fp32(name, config, args.train_limit, args.test_limit)
    for kind, over in (("ptq_w8a8", PTQ), ("qat_w4a8", QAT + ["train.lr=" + qat_lr, "train.epochs=%d" % qat_epochs(args, name)])):
        out = os.path.join(d, kind)
        rc, sec, cmd = qat_train(args, config, limits + over + [
            "quant.fp32_checkpoint=" + os.path.join(fp32_dir, "checkpoint.h5"), "quant.fp32_config=" + config,
            "output.dir=" + out], os.path.join(d, kind + ".log"))
        r = {"rc": rc, "seconds": round(sec, 1)}
        if rc == 0:
            s = summary(out)
            r.update({"fake_quant": acc(s, "fake_quant"), "qdq": acc(s, "qdq"), "exact": acc(s, "qdq_exact"),
                      "int8": acc(s, "int8"), "check_ok": s["check"]["ok"],
                      "device_vs_qdq_max_lsb": s["int8_vs_qdq"]["max_lsb"],
                      "qdq_vs_exact_max_lsb": s["qdq_float_vs_exact"]["max_lsb"],
                      "int8_partitions": s["lowering"]["int8_partitions"],
                      "fallback_partitions": s["lowering"]["fallback_partitions"],
                      "fallback_ops": sorted({fb["reason"].split(" in fp32")[0] for fb in s["lowering"]["fallbacks"]}),
                      "train_images_per_s": s["train"]["images_per_s"] if "train" in s else None,
                      "peak_rss_mb": s["train"]["peak_rss_mb"] if "train" in s else None})
            if kind == "qat_w4a8":
                r["ort"] = ort_vs_device(args, out, s["int8_vs_qdq"]["output_scale"])
        row[kind] = r
    row["step_bit_identical"] = repeatable(args, d, config)
    if args.seeds > 1:
        row["fp32_seeds"], row["torch_fp32_seeds"] = fp32_seeds(args, row, d, config)
    return row


def fmt(v):
    return "—" if v is None else ("%.2f" % v if isinstance(v, float) else str(v))


def write(args, rows, versions, run_args=None):
    """zoo.json (with run_args, default vars(args): the settings the rows were run with) and zoo.md."""
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "zoo.json"), "w") as f:
        json.dump({"versions": versions, "args": run_args or vars(args), "rows": rows}, f, indent=1)
    made = []  # each distinct command, date and machine, with its models
    for r in rows:
        key = (r.get("command", "experiments/zoo.py"), r.get("date", versions["date"]), r.get("cpu", versions["cpu"]))
        if key not in [m[0] for m in made]:
            made.append((key, []))
        next(m[1] for m in made if m[0] == key).append(r["model"])
    by = "; ".join("`bench/peers/.venv/bin/python %s` on %s (%s%s)" % (c, d, cpu, "" if len(made) == 1 else ": " + ", ".join(ms))
                   for (c, d, cpu), ms in made)
    later = [r for r in rows if "torch_command" in r]
    if later:
        by += "; the PyTorch column of %s by `bench/peers/.venv/bin/python %s` on %s" % (
            ", ".join(r["model"] for r in later), later[0]["torch_command"], later[0]["torch_date"])
    lines = ["# torchvision's CNN zoo and a small vision transformer through the pipeline", "",
             "Generated by %s, %d cores, %s." % (by, os.cpu_count(), "one run at a time"),
             "torch %s, torchvision %s (the exporter), ONNX Runtime %s." % (
                 versions["torch"], versions["torchvision"], versions["onnxruntime"]), "",
             "Recipe (a pipeline check, not a tuned training): fp32 %d epochs%s on the first %d training images "
             "(SGD 0.05, SqueezeNet 0.01, EfficientNet-B0 0.02; the ViTs: AdamW 2e-3; MobileNetV3 built with BN momentum 0.1, not "
             "torchvision's 0.01: see experiments/zoo.py); PyTorch: PyTorch's own training with the same recipe "
             "from the same initial weights; PTQ W8A8 (histogram MSE ranges, oneDNN Quantizer); QAT W4A8 (LSQ; "
             "lr 0.005, the ViTs 2e-4) %d epoch(s)%s from the fp32 "
             "checkpoint; accuracies (%%) on the first %d test images. The check is the training graph against the "
             "Q/DQ graph; device: the oneDNN int8 lowering against the Q/DQ graph, whose float32 executor is "
             "checked against the exact integer reference (max output LSB); ORT: ONNX Runtime (optimizations "
             "disabled) on the QAT run's model_qdq.onnx against the int8 device, 256 images. Images/s and peak RSS: "
             "the fp32 training run's." % (args.fp32_epochs, "".join(
                 ", %s %d" % ("EfficientNet-B0" if m == "efficientnet_b0" else m, e) for m, e in sorted(FP32_EPOCHS.items())),
                 args.train_limit, args.qat_epochs, "".join(
                 ", %s %d" % ("EfficientNet-B0" if m == "efficientnet_b0" else m, e) for m, e in sorted(QAT_EPOCHS.items())),
                 args.test_limit), "",
             "| model | params | fp32 | PyTorch fp32 | PTQ W8A8 Q/DQ | QAT W4A8 fake-quant / Q/DQ / int8 | check | device vs Q/DQ, "
             "Q/DQ vs exact (LSB) | ORT vs device (LSB, top-1) | int8 / fallback partitions (QAT) | fallback ops | "
             "train img/s | peak RSS MB | step bit-identical |",
             "|---|---:|---:|---:|---:|---:|---|---|---|---|---|---:|---:|---|"]
    for r in rows:
        if "error" in r:
            lines.append("| %s | — | — | — | — | — | — | — | — | — | %s | — | — | — |" % (r["model"], r["error"]))
            continue
        p, q = r.get("ptq_w8a8", {}), r.get("qat_w4a8", {})
        o = q.get("ort", {})
        lines.append("| %s | %s | %s | %s | %s | %s / %s / %s | %s | %s, %s | %s | %s / %s | %s | %s | %s | %s |" % (
            r["model"], fmt(r.get("params")), fmt(r.get("fp32")), fmt(r.get("torch_fp32")), fmt(p.get("qdq")), fmt(q.get("fake_quant")),
            fmt(q.get("qdq")), fmt(q.get("int8")),
            "ok" if p.get("check_ok") and q.get("check_ok") else "FAIL",
            fmt(q.get("device_vs_qdq_max_lsb")), fmt(q.get("qdq_vs_exact_max_lsb")),
            "%s, %.1f%%" % (fmt(o.get("max_lsb")), 100 * o["top1_agreement"]) if "max_lsb" in o else o.get("error", "—"),
            fmt(q.get("int8_partitions")), fmt(q.get("fallback_partitions")), ", ".join(q.get("fallback_ops", [])),
            fmt(r.get("train_images_per_s")), fmt(r.get("peak_rss_mb")),
            {True: "yes", False: "NO", None: "—"}[r.get("step_bit_identical")]))
    quantized = [r for r in rows if "pt2e" in r]
    if quantized:
        runs = []  # each distinct command, date and machine, with its models
        for r in quantized:
            key = (r["pt2e"].get("command", "?"), r["pt2e"].get("date", "?"), r["pt2e"].get("cpu", versions["cpu"]))
            if key not in [k for k, _ in runs]:
                runs.append((key, []))
            next(ms for k, ms in runs if k == key).append(r["model"])
        by = "; ".join("`bench/peers/.venv/bin/python %s` on %s (%s%s)" % (c, d, cpu, "" if len(runs) == 1 else ": " + ", ".join(ms))
                       for (c, d, cpu), ms in runs)
        lines += ["", "PT2E (torchao %s) on our fp32 checkpoints, by %s: the checkpoint loaded into the PyTorch "
                  "module (its fp32 accuracy there: the mapping's check), PTQ W8A8 with XNNPACKQuantizer and "
                  "X86InductorQuantizer (32 calibration batches), QAT W4A8 with XNNPACKQuantizer (the recipe above, "
                  "observer ranges, no LSQ); ours beside them (ours: the main table's):" % (
                      quantized[0]["pt2e"].get("torchao", "?"), by), "",
                  "| model | fp32: ours / our weights in PyTorch | PTQ W8A8: ours / PT2E XNNPACK / PT2E X86 | QAT W4A8: "
                  "ours (int8) / PT2E XNNPACK |", "|---|---:|---:|---:|"]
        for r in quantized:
            t = r["pt2e"]
            if "error" in t:
                lines.append("| %s | %s | — | — |" % (r["model"], t["error"]))
                continue
            lines.append("| %s | %s / %s | %s / %s / %s | %s / %s |" % (
                r["model"], fmt(r.get("fp32")), fmt(t.get("fp32_ours_in_torch")), fmt(r.get("ptq_w8a8", {}).get("qdq")),
                fmt(t.get("ptq_w8a8_xnnpack")), fmt(t.get("ptq_w8a8_x86")), fmt(r.get("qat_w4a8", {}).get("int8")),
                fmt(t.get("qat_w4a8_xnnpack"))))
    swept = [r for r in rows if r.get("fp32_seeds")]
    if swept:
        lines += ["", "fp32 with train.seed 0 to %d (the batches' order and the Dropout masks; PyTorch: its shuffle "
                  "from the same seeds, its Dropout from its generator), ours / PyTorch's:" % (
                      len(swept[0]["fp32_seeds"]) - 1), "",
                  "| model | " + " | ".join("seed %d" % k for k in range(len(swept[0]["fp32_seeds"]))) + " |",
                  "|---|" + "---:|" * len(swept[0]["fp32_seeds"])]
        for r in swept:
            lines.append("| %s | %s |" % (r["model"], " | ".join(
                "%s / %s" % (fmt(a), fmt(b)) for a, b in zip(r["fp32_seeds"], r["torch_fp32_seeds"]))))
    with open(os.path.join(args.out, "zoo.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="*", default=MODELS, choices=MODELS)
    ap.add_argument("--runs", default=os.path.join(ROOT, "runs", "zoo"))
    ap.add_argument("--out", default=os.path.join(ROOT, "experiments", "results"))
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--train-limit", type=int, default=8192)
    ap.add_argument("--test-limit", type=int, default=2000)
    ap.add_argument("--fp32-epochs", type=int, default=2)
    ap.add_argument("--qat-epochs", type=int, default=1)
    ap.add_argument("--seeds", type=int, default=1,
                    help="also train fp32 (ours and PyTorch's) with train.seed 0 .. SEEDS-1, for fragile models")
    ap.add_argument("--keep", action="store_true",
                    help="keep the rows of OUT/zoo.json for the models not run now (same settings required)")
    ap.add_argument("--pt2e", action="store_true",
                    help="only (re)compute the PT2E columns of the --models' rows of OUT/zoo.json, from their "
                         "RUNS/<model>/fp32/checkpoint.h5 (implies --keep)")
    ap.add_argument("--torch-only", action="store_true",
                    help="only (re)compute the PyTorch fp32 column of the --models' rows of OUT/zoo.json, from "
                         "their RUNS/<model>/fp32.ini (implies --keep)")
    args = ap.parse_args()
    import onnxruntime
    import torch
    import torchvision
    cpu = platform.machine()
    with open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    versions = {"torch": torch.__version__, "torchvision": torchvision.__version__,
                "onnxruntime": onnxruntime.__version__, "machine": platform.node() or "?", "cpu": cpu,
                "date": time.strftime("%Y-%m-%d")}
    kept = {}
    if args.torch_only or args.pt2e:
        args.keep = True
    if args.keep:
        with open(os.path.join(args.out, "zoo.json")) as f:
            old = json.load(f)
        same = ("train_limit", "test_limit", "fp32_epochs", "qat_epochs", "build")
        if any(old["args"].get(k) != getattr(args, k) for k in same):
            sys.exit("zoo: --keep: %s/zoo.json was made with other settings (%s)" % (args.out, ", ".join(same)))
        kept = {r["model"]: r for r in old["rows"] if r["model"] not in args.models or args.torch_only or args.pt2e}
    if args.pt2e:
        import torchao
        for name in args.models:
            r = kept.get(name)
            if r is None or "error" in r:
                sys.exit("zoo: --pt2e: no row of %s in %s/zoo.json" % (name, args.out))
            t0 = time.time()
            r["pt2e"] = pt2e_columns(args, name)
            r["pt2e"].update({"command": " ".join(["experiments/zoo.py"] + sys.argv[1:]), "date": versions["date"],
                              "cpu": versions["cpu"],
                              "torchao": torchao.__version__, "seconds": round(time.time() - t0, 1)})
            print("zoo: %s: PT2E %s" % (name, json.dumps(r["pt2e"])), flush=True)
            write(args, [kept[m] for m in MODELS if m in kept], old["versions"], old["args"])
        return 0
    if args.torch_only:
        for name in args.models:
            r = kept.get(name)
            if r is None or "error" in r:
                sys.exit("zoo: --torch-only: no row of %s in %s/zoo.json" % (name, args.out))
            r["torch_fp32"], r["torch_fp32_s"] = torch_fp32(name, os.path.join(args.runs, name, "fp32.ini"),
                                                            args.train_limit, args.test_limit)
            r["torch_command"] = " ".join(["experiments/zoo.py"] + sys.argv[1:])
            r["torch_date"] = versions["date"]
            print("zoo: %s: PyTorch fp32 %.2f%% (ours %.2f%%)" % (name, r["torch_fp32"], r["fp32"]), flush=True)
        write(args, [kept[m] for m in MODELS if m in kept], old["versions"], old["args"])
        return 0
    rows = []
    for name in args.models:
        print("zoo: %s ..." % name, flush=True)
        t0 = time.time()
        rows.append(run_model(args, name))
        rows[-1].update({"command": " ".join(["experiments/zoo.py"] + sys.argv[1:]), "date": versions["date"],
                         "cpu": versions["cpu"]})
        print("zoo: %s done in %.0f s: %s" % (name, time.time() - t0, json.dumps(rows[-1])[:300]), flush=True)
        done = {r["model"]: r for r in rows}
        write(args, [done.get(m) or kept[m] for m in MODELS if m in done or m in kept], versions)
    return 0


if __name__ == "__main__":
    sys.exit(main())
