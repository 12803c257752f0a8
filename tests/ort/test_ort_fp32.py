#!/usr/bin/env python3
"""test_ort_fp32: the committed fp32 ONNX models (tests/onnx/models/) run in ONNX Runtime
through tests/ort/ortlib.py agree with the PyTorch references of tests/onnx/ref/onnx_ref.h5
(written by tests/onnx/make_onnx_models.py: per model, x (8, H, W, C) NHWC, y_eval the
eval-mode logits, y_train the train-mode logits with batch statistics).

For every model, with graph optimization disabled and with all optimizations:
  - eval: a copy of the model whose BatchNormalization nodes run in inference mode
    (ortlib.inference_copy; torch.onnx.export in training mode writes BN with batch
    statistics) against y_eval;
  - train: the model as exported (BN with batch statistics over the run's batch) against
    y_train, where the batch of 8 can run as one call (not tiny_features, whose batch is fixed
    at 2: its batch statistics would be over 2 images);
  - chunking: fashion_cnn's eval copy run in calls of 3 images (3 + 3 + 2) against y_eval;
  - mobilenet_trained (the round trip's model, tests/onnx/make_roundtrip_model.py): its eval copy
    on the first 500 Fashion-MNIST test images against PyTorch's logits in
    tests/onnx/ref/roundtrip_ref.h5.
Then every group of tests/onnx/ref/onnx2_ref.h5 (tests/onnx/make_torch2_models.py: the torch 2.x
exports t2_*, the opset-forms models forms_* of tests/onnx/models/, and tests/onnx/bad/ext_ok.onnx,
the valid twin of the hostile external-data files), with both optimization levels:
  - eval: the file itself, loaded from its own directory (t2_mobilenet reads its weights from
    t2_mobilenet.onnx.data there; the test fails if it has no external initializers), against
    y_eval. torch 2.x writes BN in inference mode even from a model in train mode, so the file as
    written computes the eval-mode logits (a file with training-mode BNs would run as an
    inference copy instead);
  - train (the train=1 groups, t2_fashion_cnn and t2_mobilenet): a copy whose BNs are set to
    training mode (training_mode=1 and the two running-statistics outputs it requires) against
    y_train (forms_* and ext_ok have ORT's own output as y_eval: they check the file against
    what it computed when it was written).
The models of tests/onnx/models named t2_* or forms_* and the groups of onnx2_ref.h5 must match,
as the models act_*, se_*, cat_*, shuffle_*, vit, arith_*, prelu_* and resize_*
(tests/onnx/make_act_models.py) and act_ref.h5, and the models mha_* (torchvision's ViT and its
blocks, tests/onnx/make_mha_models.py: the *_d ones read their weights from *_d.onnx.data) and
mha_ref.h5, checked as the torch 1.13 models are, and the other models and onnx_ref.h5 must.
Tolerance: max |y - y_ref| <= 1e-5 * max |y_ref| (the measured worst is printed at the end).
Eval and train logits differ by 0.3-1.7 of max |y_ref| here, so a BN run in the wrong mode
fails.

Run by CTest through tests/ort/ort_test.sh (which fails when the test environment is missing or
holds other versions than tests/requirements.txt); by hand: .venv/bin/python tests/ort/test_ort_fp32.py.
"""
import os
import sys
import tempfile
import time

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ortlib  # noqa: E402

SRC = os.path.dirname(os.path.dirname(HERE))
MODELS = os.path.join(SRC, "tests", "onnx", "models")
REF = os.path.join(SRC, "tests", "onnx", "ref", "onnx_ref.h5")
REF2 = os.path.join(SRC, "tests", "onnx", "ref", "onnx2_ref.h5")  # make_torch2_models.py
REF_ACT = os.path.join(SRC, "tests", "onnx", "ref", "act_ref.h5")  # make_act_models.py
REF_ACT_PREFIX = ("act_", "se_", "cat_", "shuffle_", "vit", "arith_", "prelu_", "resize_")  # the models of tests/onnx/models whose references are in REF_ACT
REF2_PREFIXES = ("t2_", "forms_")  # the models of tests/onnx/models whose references are in REF2
REF_MHA = os.path.join(SRC, "tests", "onnx", "ref", "mha_ref.h5")  # make_mha_models.py
REF_MHA_PREFIX = "mha_"  # the models of tests/onnx/models whose references are in REF_MHA
REF2_BAD = os.path.join(SRC, "tests", "onnx", "bad")  # where its ext_* models are
EXTERNAL_MODEL = "t2_mobilenet"  # its weights in t2_mobilenet.onnx.data
ROUNDTRIP = "mobilenet_trained"  # its reference: roundtrip_ref.h5 (logits on the test set)
ROUNDTRIP_REF = os.path.join(SRC, "tests", "onnx", "ref", "roundtrip_ref.h5")
ROUNDTRIP_IMAGES = 500
TOL = 1e-5
OPTS = ("disabled", "all")


def fixed_batch_and_bn(path):
    """(the input's fixed batch size or 0 when dynamic, the number of BatchNormalization nodes)"""
    import onnx
    m = onnx.load(path)
    d = m.graph.input[0].type.tensor_type.shape.dim[0]
    return (d.dim_value if d.HasField("dim_value") else 0,
            sum(n.op_type == "BatchNormalization" for n in m.graph.node))


def ref2_model(name):
    return os.path.join(REF2_BAD if name.startswith("ext_") else MODELS, name + ".onnx")


def training_bns(path):
    """(the number of BatchNormalization nodes, how many of them run in training mode)"""
    import onnx
    m = onnx.load(path, load_external_data=False)
    bns = [n for n in m.graph.node if n.op_type == "BatchNormalization"]
    return len(bns), sum(len([o for o in n.output if o]) > 1
                         or any(a.name == "training_mode" and a.i for a in n.attribute) for n in bns)


def external_initializers(path):
    import onnx
    m = onnx.load(path, load_external_data=False)
    return sum(t.data_location == onnx.TensorProto.EXTERNAL for t in m.graph.initializer)


def training_copy(src, dst):
    """Writes to dst a copy of src (external data read in) whose BatchNormalization nodes, all in
    inference mode, run in training mode: training_mode=1 and the running mean / variance outputs
    that ONNX Runtime requires with it. Returns the number of nodes changed."""
    import onnx
    m = onnx.load(src)
    changed = 0
    for n in m.graph.node:
        if n.op_type != "BatchNormalization":
            continue
        if len(n.output) != 1 or any(a.name == "training_mode" for a in n.attribute):
            raise ortlib.OrtError("%s: BN node %s is not in the inference form" % (src, n.name))
        n.attribute.append(onnx.helper.make_attribute("training_mode", 1))
        n.output.extend([n.output[0] + "__running_mean", n.output[0] + "__running_var"])
        changed += 1
    onnx.save(m, dst)
    return changed


def check_torch13(f, names, tmp, check, failures, versions):
    """The models `names` of tests/onnx/models against the groups of the open reference file f."""
    for name in names:
        if name not in f:
            continue
        g = f[name]
        path = os.path.join(MODELS, name + ".onnx")
        x = g["x"][...]
        eval_path = os.path.join(tmp, name + "_eval.onnx")
        changed = ortlib.inference_copy(path, eval_path)
        batch, bns = fixed_batch_and_bn(path)
        if g.attrs["train"] and changed != bns:
            failures.append("%s: a training export with %d BN nodes, %d in training mode" % (name, bns, changed))
        for opt in OPTS:
            try:
                y, info = ortlib.run(eval_path, x, layout="NHWC", opt=opt)
                versions.add(info["ort_version"])
                check(name, "eval", opt, y, g["y_eval"][...])
                if g.attrs["train"] and batch in (0, x.shape[0]):
                    y, info = ortlib.run(path, x, layout="NHWC", opt=opt)
                    check(name, "train", opt, y, g["y_train"][...])
                if name == "fashion_cnn":
                    y, info = ortlib.run(eval_path, x, layout="NHWC", opt=opt, batch=3)
                    if info["batch"] != 3:
                        failures.append("fashion_cnn --batch 3: the runner used batch %s" % info["batch"])
                    check(name, "chunk3", opt, y, g["y_eval"][...])
            except ortlib.OrtError as e:
                failures.append(str(e))
                print("%-20s --opt %-8s ERROR %s" % (name, opt, e))


def main():
    t0 = time.time()
    failures, checks = [], 0
    worst = {}
    versions = set()

    def check(name, what, opt, y, ref):
        nonlocal checks
        checks += 1
        scale = float(np.abs(ref).max())
        if y.shape != ref.shape:
            failures.append("%s %s --opt %s: output shape %s, reference %s" % (name, what, opt, y.shape, ref.shape))
            return
        if not scale > 0:
            failures.append("%s %s: reference is all zeros (a test that cannot fail)" % (name, what))
            return
        err = float(np.abs(y - ref).max()) / scale
        worst[what] = max(worst.get(what, 0.0), err)
        ok = err <= TOL
        print("%-20s %-6s --opt %-8s max |y - ref| / max |ref| = %.2e  %s" % (name, what, opt, err, "ok" if ok else "FAIL"))
        if not ok:
            failures.append("%s %s --opt %s: relative error %.3g > %g" % (name, what, opt, err, TOL))

    all_models = sorted(f[:-5] for f in os.listdir(MODELS) if f.endswith(".onnx") and f[:-5] != ROUNDTRIP)
    models = [m for m in all_models if not m.startswith(REF2_PREFIXES + (REF_MHA_PREFIX,))]
    models2 = [m for m in all_models if m.startswith(REF2_PREFIXES)]
    models_mha = [m for m in all_models if m.startswith(REF_MHA_PREFIX)]
    with h5py.File(REF, "r") as f, tempfile.TemporaryDirectory(prefix="test_ort_fp32.") as tmp:
        missing = sorted({m for m in models if not m.startswith(REF_ACT_PREFIX)} ^ set(f.keys()))
        if missing:
            failures.append("models and reference groups differ: %s" % ", ".join(missing))
        check_torch13(f, [m for m in models if not m.startswith(REF_ACT_PREFIX)], tmp, check, failures, versions)
        with h5py.File(REF_ACT, "r") as fa:
            acts = [m for m in models if m.startswith(REF_ACT_PREFIX)]
            missing = sorted(set(acts) ^ set(fa.keys()))
            if missing:
                failures.append("models act_*, se_*, cat_*, shuffle_*, vit*, arith_*, prelu_*, resize_* and the groups of act_ref.h5 differ: %s" % ", ".join(missing))
            check_torch13(fa, acts, tmp, check, failures, versions)
        with h5py.File(REF_MHA, "r") as fm:
            missing = sorted(set(models_mha) ^ set(fm.keys()))
            if missing:
                failures.append("models mha_* and the groups of mha_ref.h5 differ: %s" % ", ".join(missing))
            check_torch13(fm, models_mha, tmp, check, failures, versions)

        import ort_eval
        x, _ = ort_eval.load_images(ort_eval.FASHION + "t10k-images-idx3-ubyte.gz",
                                    ort_eval.FASHION + "t10k-labels-idx1-ubyte.gz", 0.2860, 0.3530, ROUNDTRIP_IMAGES)
        with h5py.File(ROUNDTRIP_REF, "r") as r:
            ref = r["logits"][:ROUNDTRIP_IMAGES]
        eval_path = os.path.join(tmp, ROUNDTRIP + "_eval.onnx")
        ortlib.inference_copy(os.path.join(MODELS, ROUNDTRIP + ".onnx"), eval_path)
        for opt in OPTS:
            try:
                y, info = ortlib.run(eval_path, x, layout="NHWC", opt=opt)
                check(ROUNDTRIP, "eval", opt, y, ref)
            except ortlib.OrtError as e:
                failures.append(str(e))

    # onnx2_ref.h5: the torch 2.x exports, the opset forms, ext_ok
    n2 = 0
    with h5py.File(REF2, "r") as f, tempfile.TemporaryDirectory(prefix="test_ort_fp32.") as tmp:
        missing = sorted(set(models2) ^ {k for k in f.keys() if not k.startswith("ext_")})
        if missing:
            failures.append("models t2_* / forms_* and the groups of onnx2_ref.h5 differ: %s" % ", ".join(missing))
        if EXTERNAL_MODEL not in f or not external_initializers(ref2_model(EXTERNAL_MODEL)):
            failures.append("%s: no initializer stored as external data (the test of external data would not run)"
                            % EXTERNAL_MODEL)
        for name in sorted(f.keys()):
            g = f[name]
            path = ref2_model(name)
            if not os.path.exists(path):
                failures.append("%s: no model %s" % (name, path))
                continue
            x = g["x"][...]
            n2 += 1
            eval_path = path  # from its own directory: external data resolved there
            train_path = None
            try:  # onnx.load raises its own errors (e.g. ValidationError on missing external data)
                bns, in_training = training_bns(path)
                if in_training:
                    eval_path = os.path.join(tmp, name + "_eval.onnx")
                    ortlib.inference_copy(path, eval_path)
                if g.attrs["train"]:
                    train_path = os.path.join(tmp, name + "_train.onnx")
                    if in_training:
                        train_path = path
                    elif training_copy(path, train_path) != bns or not bns:
                        failures.append("%s: a train=1 reference for a model with %d BN nodes" % (name, bns))
            except Exception as e:  # noqa: BLE001 (reported as a failure; the eval run below still runs)
                failures.append("%s: copying %s: %s: %s" % (name, path, type(e).__name__, e))
                if eval_path != path:
                    continue
                train_path = None
            for opt in OPTS:
                try:
                    y, info = ortlib.run(eval_path, x, layout="NHWC", opt=opt)
                    versions.add(info["ort_version"])
                    check(name, "eval", opt, y, g["y_eval"][...])
                    if train_path:
                        y, info = ortlib.run(train_path, x, layout="NHWC", opt=opt)
                        check(name, "train", opt, y, g["y_train"][...])
                except ortlib.OrtError as e:
                    failures.append(str(e))
                    print("%-20s --opt %-8s ERROR %s" % (name, opt, e))

    # 14 models x 2 levels (eval) + 12 dynamic-batch training exports (those of make_act_models.py
    # among them) x 2 + fashion_cnn chunked x 2 + mobilenet_trained x 2
    expected = 2 * len(models) + 2 * 12 + 2 + 2
    # + onnx2_ref.h5: every group x 2 levels (eval) + its 2 training exports (t2_fashion_cnn,
    # t2_mobilenet) x 2
    expected += 2 * n2 + 2 * 2
    # + mha_ref.h5: each model x 2 levels (eval) + its 3 training exports (mha_vit, mha_vit_cls, mha_timm) x 2
    expected += 2 * len(models_mha) + 3 * 2
    if checks != expected and not failures:
        failures.append("%d comparisons made, %d expected" % (checks, expected))
    print("ONNX Runtime %s; %d comparisons; worst relative error: %s; tolerance %g; %.1f s"
          % (", ".join(sorted(versions)) or "?", checks,
             ", ".join("%s %.2e" % kv for kv in sorted(worst.items())), TOL, time.time() - t0))
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
