#!/usr/bin/env python3
"""test_ort_alone: ONNX Runtime judged one partition at a time against the exact integer
reference (tests/ort/ort_alone.py), on every export test_onnx_export_checker left (export_<case>.onnx
and its Q/DQ file export_<case>_qdq.h5: FashionCNN, ResCNN, the MobileNet-style model, the
activation, arithmetic, concat, PReLU, resize, squeeze-excite, channel-shuffle and attention
models, at W8A8 and W4A4, and the int32-bias graphs), on the first IMAGES Fashion-MNIST test
images, graph optimizations disabled.

Each activation point's integers are fed from the exact reference and ORT's own integers there
are compared with the reference's (ort_alone.failing): every point within 1 LSB, and at most
0.1% of a point's values (at least 8 allowed) 1 LSB apart (a value on a rounding tie that float32 and the exact
arithmetic round to neighbouring integers). The same comparison end to end (test_ort_agreement)
lets a difference travel through the layers; here each partition starts from the reference's
integers.

The test proves it can fail: a copy of FashionCNN W8A8's export with one dequantize scale made
2% larger must fail at exactly the partition that reads it, and nowhere else.

Usage: test_ort_alone.py BUILD_DIR EXPORT_DIR (where test_onnx_export_checker left its files).
"""
import glob
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnx.numpy_helper  # noqa: E402
import ort_alone  # noqa: E402
import test_ort_torch2  # noqa: E402

IMAGES = 256
# the case, the dequantize mutated, and the point ending the partition that reads it (conv2, relu2)
MUTATED = ("fashion_cnn_w8a8", "relu1.fq.dequantize", "relu2.fq.quantize")
fail = test_ort_torch2.fail


def judged(build, h5, model, work):
    try:
        return ort_alone.judge(build, h5, model, None, IMAGES, work)
    except (OSError, ort_alone.AloneError) as e:
        fail("%s: %s" % (model, e))


def mutation(build, export_dir, work):
    """One dequantize scale 2% larger: caught at the partition that reads it, and only there."""
    case, dq, reader = MUTATED
    m = onnx.load(os.path.join(export_dir, "export_%s.onnx" % case))
    node = next((n for n in m.graph.node if n.name == dq), None)
    if node is None:
        fail("mutation: export_%s.onnx has no dequantize %s" % (case, dq))
    init = next(t for t in m.graph.initializer if t.name == node.input[1])
    init.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(init) * np.float32(1.02), init.name))
    path = os.path.join(work, "mutated.onnx")
    onnx.save(m, path)
    res = judged(build, os.path.join(export_dir, "export_%s_qdq.h5" % case), path, work)
    bad = ort_alone.failing(res)
    worst = max(res["points"], key=lambda p: p["one_lsb"])
    print("mutation: %s's %s scale x1.02: points failing %s (worst %s: %d LSB, %d of %d values 1 LSB apart)"
          % (case, dq, bad, worst["point"], worst["max_lsb"], worst["one_lsb"], worst["values"]))
    if bad != [reader]:
        fail("mutation: a 2%% larger scale at %s must fail the partition ending at %s alone, failed: %s"
             % (dq, reader, bad))


def main():
    build, export_dir = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    cases = sorted(os.path.basename(p)[len("export_"):-len("_qdq.h5")]
                   for p in glob.glob(os.path.join(export_dir, "export_*_qdq.h5")))
    if len(cases) < 20:
        fail("%d exports in %s (test_onnx_export_checker leaves about 30)" % (len(cases), export_dir))
    with tempfile.TemporaryDirectory() as work:
        failed = []
        for case in cases:
            res = judged(build, os.path.join(export_dir, "export_%s_qdq.h5" % case),
                         os.path.join(export_dir, "export_%s.onnx" % case), work)
            bad = ort_alone.failing(res)
            print("%s: %s%s" % (case, ort_alone.summary(res), "; FAILING: %s" % bad if bad else ""))
            if bad:
                failed.append(case)
        mutation(build, export_dir, work)
    if failed:
        fail("ONNX Runtime partition by partition: over 1 LSB, or more than %.1f%% of a point's values 1 LSB "
             "apart, in %s" % (100 * ort_alone.MAX_ONE_LSB_SHARE, failed))
    print("test_ort_alone: OK (%d exports, ONNX Runtime %s)" % (len(cases), res["ort_version"]))


if __name__ == "__main__":
    main()
