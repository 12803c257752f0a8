#!/usr/bin/env python3
"""Exports FashionCNN's twin and torchvision's ResNet-18 and MobileNetV2 (untrained; 10 classes;
the first conv taking 1 channel, for Fashion-MNIST's 28 x 28 images) with the peers'
environment's torch 2.x, each two ways:
  <model>_readme.onnx    as the README shows it: model.train(), optimize=False (BN kept), dynamic
                         batch, weights inside the file;
  <model>_default.onnx   the exporter's defaults: torch.onnx.export(model, x, path) (BN folded,
                         static batch 2, weights in <model>_default.onnx.data).
Usage: bench/peers/.venv/bin/python bench/peers/torch2_zoo.py OUT_DIR
(bench/peers/torch2_zoo.sh runs the whole pipeline on them.)"""
import os
import sys
import warnings

import torch
import torch.nn as nn
import torchvision

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "onnx"))
import make_onnx_models  # noqa: E402


def models():
    torch.manual_seed(0)
    r = torchvision.models.resnet18(num_classes=10)
    r.conv1 = nn.Conv2d(1, 64, 7, 2, 3, bias=False)
    m = torchvision.models.mobilenet_v2(num_classes=10)
    m.features[0][0] = nn.Conv2d(1, 32, 3, 2, 1, bias=False)
    return {"fashion_cnn": make_onnx_models.FashionCNN(), "resnet18": r, "mobilenet_v2": m}


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    x = torch.randn(2, 1, 28, 28)
    for name, model in models().items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model.train(), x, os.path.join(out, name + "_readme.onnx"), optimize=False,
                              input_names=["input"], output_names=["logits"], dynamic_axes={"input": {0: "batch"}},
                              external_data=False)
            torch.onnx.export(model, x, os.path.join(out, name + "_default.onnx"))
        print("%s: torch %s, %d parameters" % (name, torch.__version__, sum(p.numel() for p in model.parameters())))


if __name__ == "__main__":
    main()
