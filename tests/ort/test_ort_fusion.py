#!/usr/bin/env python3
"""test_ort_fusion: ONNX Runtime runs every layer that the Q/DQ graph runs on integers in its
integer kernels, at every bit width. For each export of test_onnx_export_checker (FashionCNN at
W8A8, W4A8 and W4A4, ResCNN and the MobileNet-style model at W8A8 and W4A4, and the int32-bias
graphs), ORT (default optimizations, ORT_ENABLE_ALL) writes the graph it runs
(--optimized-model), and:

  - the integer layers: every Conv / Gemm of the export whose weight is integers read by a
    DequantizeLinear ("<layer>.weight_int") and whose input and output are quantized;
  - ORT's graph holds exactly that many fused integer nodes (QLinearConv, QGemm, ConvInteger,
    MatMulInteger, QLinearMatMul, and their NHWC forms) and exactly as many float convolution
    and matrix nodes (Conv, FusedConv, Gemm, MatMul, FusedGemm, FusedMatMul, NhwcFusedConv) as
    the export has float layers: none where the Q/DQ graph has an int8 partition;
  - every Clip of the export (the narrowing of a sub-8-bit range) has integer bounds: no float
    Clip sits between an op and its QuantizeLinear, where it would keep the op out of ORT's
    QDQ fusion.

The values of these runs are judged by test_ort_agreement (within 1 output LSB of the exact
integer reference). Usage: test_ort_fusion.py EXPORT_DIR (where test_onnx_export_checker left
its files); run by CTest through tests/ort/ort_test.sh.
"""
import collections
import os
import sys
import tempfile

import numpy as np
import onnx

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ortlib  # noqa: E402

CASES = ("fashion_cnn_w8a8", "fashion_cnn_w4a8", "fashion_cnn_w4a4", "res_cnn_w8a8", "res_cnn_w4a4",
         "mobilenet_w8a8", "mobilenet_w4a4", "fashion_cnn_w8a8_b32", "mobilenet_w4a4_b32")
FUSED = {"QLinearConv", "QGemm", "ConvInteger", "MatMulInteger", "QLinearMatMul", "NhwcQLinearConv"}
FLOAT = {"Conv", "FusedConv", "NhwcFusedConv", "Gemm", "FusedGemm", "MatMul", "FusedMatMul"}
INT_TYPES = {onnx.TensorProto.INT8, onnx.TensorProto.UINT8}


def export_layers(model):
    """(integer layers, float layers) of an export: Conv / Gemm node names."""
    inits = {t.name for t in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    readers = collections.defaultdict(list)
    for n in model.graph.node:
        for i in n.input:
            readers[i].append(n)
    ints, floats = [], []
    for n in model.graph.node:
        if n.op_type not in ("Conv", "Gemm"):
            continue
        w = producer.get(n.input[1])
        int_weight = w is not None and w.op_type == "DequantizeLinear" and w.input[0] in inits
        x = producer.get(n.input[0])
        # the input through the ops ORT moves dequantizes past (max pool, reshape)
        while x is not None and x.op_type in ("MaxPool", "Reshape"):
            x = producer.get(x.input[0])
        q_in = x is not None and x.op_type == "DequantizeLinear"
        out = n.output[0]
        nxt = readers.get(out, [])
        # the activation (relu, relu6 as Clip(0, 6)) between the layer and its quantize, which
        # the device fuses into the layer and ORT into its QuantizeLinear
        while len(nxt) == 1 and nxt[0].op_type in ("Relu", "Clip"):
            nxt = readers.get(nxt[0].output[0], [])
        q_out = len(nxt) == 1 and nxt[0].op_type == "QuantizeLinear"
        (ints if int_weight and q_in and q_out else floats).append(n.name)
    return ints, floats


def main():
    export_dir = sys.argv[1]
    failures = []
    x = np.random.RandomState(0).randn(8, 1, 28, 28).astype(np.float32)
    with tempfile.TemporaryDirectory(prefix="test_ort_fusion.") as tmp:
        for stem in CASES:
            path = os.path.join(export_dir, "export_%s.onnx" % stem)
            if not os.path.exists(path):
                failures.append("%s: no %s (run test_onnx_export_checker first: the fixture onnx_export_files)"
                                % (stem, path))
                continue
            model = onnx.load(path)
            ints, floats = export_layers(model)
            inits = {t.name: t for t in model.graph.initializer}
            clips = [n for n in model.graph.node if n.op_type == "Clip" and n.name.endswith(".clip")]
            float_clips = [n.name for n in clips if any(inits[i].data_type not in INT_TYPES for i in n.input[1:] if i)]
            opt_path = os.path.join(tmp, stem + "_opt.onnx")
            try:
                _, info = ortlib.run(path, x, opt="all", optimized_model=opt_path)
            except ortlib.OrtError as e:
                failures.append(str(e))
                continue
            ops = collections.Counter(n.op_type for n in onnx.load(opt_path).graph.node)
            fused = sum(ops[k] for k in FUSED)
            flt = sum(ops[k] for k in FLOAT)
            ok = fused == len(ints) and flt == len(floats) and not float_clips and ints
            print("%-20s integer layers %d (%s), float layers %d (%s); ORT %s: %d fused integer nodes, %d float "
                  "conv/matrix nodes; %d narrowing Clips, %d float; %s"
                  % (stem, len(ints), ",".join(ints), len(floats), ",".join(floats) or "-", info["ort_version"], fused,
                     flt, len(clips), len(float_clips), "ok" if ok else "FAIL"))
            print("%20s ORT's graph: %s" % ("", ", ".join("%s %d" % kv for kv in sorted(ops.items()))))
            if not ints:
                failures.append("%s: no integer layers found in the export (a test that cannot fail)" % stem)
            if fused != len(ints) or flt != len(floats):
                failures.append("%s: ORT runs %d layers in integer kernels and %d in float; the Q/DQ graph has %d "
                                "integer and %d float layers" % (stem, fused, flt, len(ints), len(floats)))
            if float_clips:
                failures.append("%s: float Clips %s" % (stem, ", ".join(float_clips)))
            if ("w4a4" in stem) != bool(clips):
                failures.append("%s: %d narrowing Clips" % (stem, len(clips)))
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("%d exports: every integer layer fused" % len(CASES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
