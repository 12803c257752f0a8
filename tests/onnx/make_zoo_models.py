#!/usr/bin/env python3
"""Writes the zoo's graphs for the tests (tests/onnx/zoo/NAME.onnx): torchvision's ResNet-18,
MobileNetV2, MobileNetV3-Small, EfficientNet-B0, ShuffleNetV2 x0.5, SqueezeNet 1.1 and
VisionTransformer, and the timm-style ViT of make_act_models.py, each built and exported exactly
as experiments/zoo.py builds and exports them (10 classes, the first convolution on 1 channel,
the TorchScript exporter in training mode, opset 17, dynamic batch). Run with the peers'
environment (torch 2.x and torchvision: bench/peers/setup_peers.sh):

    bench/peers/.venv/bin/python tests/onnx/make_zoo_models.py

The graphs are committed; their weights are not (ResNet-18's alone are 45 MB). Every float
initializer of WEIGHTS_FROM elements or more is stored as external data in NAME.onnx.data (its
location, offset and length set here, contiguous from 0), a file that is not committed: the test
makes it (tests/ort/zoo_weights.py) by drawing each such tensor from a normal distribution of
the mean and standard deviation that torchvision's initialization gave it, clipped to its
smallest and largest value, recorded here in the tensor's doc_string as JSON {"mean": m, "std":
s, "min": lo, "max": hi}. The clip keeps BN's running variances positive: the export traces the
model in training mode, which moves them from 1 by one batch's statistics. A tensor torchvision
fills with one value (BN's scale 1 and shift 0, zero biases, the class token) has std 0 and is
drawn exactly. Smaller initializers, the shape constants among them, stay in the graph
as exported. The graphs are what the exporter wrote; the weights are torchvision's
initialization in distribution, not in value.
"""
import json
import os
import sys
import tempfile

import numpy as np
import onnx
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
import zoo  # noqa: E402

OUT = os.path.join(HERE, "zoo")
WEIGHTS_FROM = 256  # float initializers of this many elements and more become drawn external data


def strip(src, dst, name):
    m = onnx.load(src)
    loc = name + ".onnx.data"
    offset = drawn = kept = 0
    for t in m.graph.initializer:
        a = numpy_helper.to_array(t)
        if t.data_type != onnx.TensorProto.FLOAT or a.size < WEIGHTS_FROM:
            kept += 1
            continue
        stats = {"min": float(a.min()), "max": float(a.max())}
        if a.min() == a.max():  # the value itself: a float64 mean of it need not round back to it
            stats.update(mean=float(a.flat[0]), std=0.0)
        else:
            stats.update(mean=float(np.float32(a.astype(np.float64).mean())),
                         std=float(np.float32(a.astype(np.float64).std())))
        t.ClearField("raw_data")
        t.ClearField("float_data")
        t.data_location = onnx.TensorProto.EXTERNAL
        del t.external_data[:]
        for k, v in (("location", loc), ("offset", str(offset)), ("length", str(4 * a.size))):
            e = t.external_data.add()
            e.key, e.value = k, v
        t.doc_string = json.dumps(stats, sort_keys=True)
        offset += 4 * a.size
        drawn += 1
    for n in m.graph.node:  # the exporter's source locations: paths of the machine that ran it
        n.doc_string = ""
    onnx.save(m, dst)
    return drawn, kept, offset


def main():
    os.makedirs(OUT, exist_ok=True)
    names = sys.argv[1:] or zoo.MODELS
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            src = os.path.join(tmp, name + ".onnx")
            zoo.export(name, src)
            dst = os.path.join(OUT, name + ".onnx")
            drawn, kept, nbytes = strip(src, dst, name)
            print("%s: %d initializers drawn (%d bytes of external data), %d kept in the graph; %d bytes" % (
                dst, drawn, nbytes, kept, os.path.getsize(dst)))


if __name__ == "__main__":
    main()
