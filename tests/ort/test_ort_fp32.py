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
        print("%-15s %-6s --opt %-8s max |y - ref| / max |ref| = %.2e  %s" % (name, what, opt, err, "ok" if ok else "FAIL"))
        if not ok:
            failures.append("%s %s --opt %s: relative error %.3g > %g" % (name, what, opt, err, TOL))

    models = sorted(f[:-5] for f in os.listdir(MODELS) if f.endswith(".onnx") and f[:-5] != ROUNDTRIP)
    with h5py.File(REF, "r") as f, tempfile.TemporaryDirectory(prefix="test_ort_fp32.") as tmp:
        missing = sorted(set(models) ^ set(f.keys()))
        if missing:
            failures.append("models and reference groups differ: %s" % ", ".join(missing))
        for name in models:
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
                    print("%-15s --opt %-8s ERROR %s" % (name, opt, e))

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

    # 6 models x 2 levels (eval) + 4 dynamic-batch training exports x 2 + fashion_cnn chunked x 2
    # + mobilenet_trained x 2
    expected = 2 * len(models) + 2 * 4 + 2 + 2
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
