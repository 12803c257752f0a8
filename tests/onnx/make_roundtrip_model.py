#!/usr/bin/python3
"""The PyTorch side of the round trip (tests/onnx/test_onnx_roundtrip.sh, docs/onnx_import.md, "Round trip"):
trains the MobileNet-style model of make_onnx_models.py (MobileNetSmall) on Fashion-MNIST in
PyTorch, exports it to ONNX as a user would, and records what PyTorch computes on the test set.
Run with Debian's torch 1.13: /usr/bin/python3 tests/onnx/make_roundtrip_model.py (deterministic
for a thread count: seed 0, 2 threads; a few minutes on 2 cores). CI needs no torch: it uses the
committed files.

Writes:
  tests/onnx/models/mobilenet_trained.onnx   opset 17, training export (BN kept, for QAT's delayed
                                             folding), dynamic batch, input "input" NCHW, output "logits"
  tests/onnx/ref/roundtrip_ref.h5            torch's eval-mode logits (10000, 10) float32 and
                                             top-1 `pred` (10000,) int32 on the Fashion-MNIST test
                                             set, preprocessed as the framework does
                                             ((pixel / 255 - 0.2860) / 0.3530 in float32);
                                             attributes accuracy, images, epochs, torch version

The references are computed from the model as exported: a training export runs the model once in
train mode (moving its BN running statistics a little), so the copy that was exported is the one
evaluated.
"""
import gzip
import os
import sys

import h5py
import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_onnx_models import MobileNetSmall, export  # noqa: E402

FASHION = "/usr/share/datasets/fashion-mnist/"
MEAN, STD = 0.2860, 0.3530
EPOCHS = 2


def load(kind):
    x = np.frombuffer(gzip.open(FASHION + "%s-images-idx3-ubyte.gz" % kind, "rb").read(), np.uint8, offset=16)
    y = np.frombuffer(gzip.open(FASHION + "%s-labels-idx1-ubyte.gz" % kind, "rb").read(), np.uint8, offset=8)
    x = torch.from_numpy(x.reshape(-1, 1, 28, 28).astype(np.float32))
    # the framework's float32 steps: pixel / 255, minus the mean, divided by the std
    x = (x / torch.tensor(255.0, dtype=torch.float32) - torch.tensor(MEAN, dtype=torch.float32)) / torch.tensor(
        STD, dtype=torch.float32)
    return x, torch.from_numpy(y.astype(np.int64))


def main():
    torch.manual_seed(0)
    torch.set_num_threads(2)
    xtr, ytr = load("train")
    xte, yte = load("t10k")
    model = MobileNetSmall()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    steps = EPOCHS * ((len(xtr) + 127) // 128)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    for epoch in range(EPOCHS):
        model.train()
        perm = torch.randperm(len(xtr))
        for i in range(0, len(xtr), 128):
            idx = perm[i:i + 128]
            opt.zero_grad()
            F.cross_entropy(model(xtr[idx]), ytr[idx]).backward()
            opt.step()
            sched.step()
        print("epoch %d done" % (epoch + 1), flush=True)
    path = os.path.join(HERE, "models", "mobilenet_trained.onnx")
    exported = export(model, path, 17, True)
    onnx.checker.check_model(onnx.load(path), full_check=True)
    exported.eval()
    with torch.no_grad():
        logits = torch.cat([exported(xte[i:i + 500]) for i in range(0, len(xte), 500)])
    pred = logits.argmax(1)
    acc = (pred == yte).double().mean().item()
    with h5py.File(os.path.join(HERE, "ref", "roundtrip_ref.h5"), "w") as f:
        f.create_dataset("logits", data=logits.numpy().astype(np.float32))
        f.create_dataset("pred", data=pred.numpy().astype(np.int32))
        f.attrs["accuracy"] = acc
        f.attrs["images"] = len(xte)
        f.attrs["epochs"] = EPOCHS
        f.attrs["torch"] = np.bytes_(str(torch.__version__))
    print("mobilenet_trained: PyTorch test accuracy %.4f on %d images (%s)" % (acc, len(xte), path))


if __name__ == "__main__":
    main()
