"""PyTorch twins of this framework's models, its Fashion-MNIST data and a reader of its fp32
checkpoints, for the peer benchmarks in bench/peers/ (run with bench/peers/.venv/bin/python).

Models (the names are the grid's, experiments/grid/*.ini):
  fashion_cnn     nn/models.c's FashionCNN: conv 1->32 3x3 pad 1 (no bias) + BN + ReLU, max-pool 2;
                  conv 32->64 3x3 pad 1 (no bias) + BN + ReLU, max-pool 2; flatten 3136;
                  linear 3136->128 + ReLU; linear 128->10.
  res_cnn         nn/models.c's ResCNN: stem conv 1->16 + BN + ReLU; residual block 16; conv
                  16->32 stride 2 + BN + ReLU; residual block 32; global average pool; linear 32->10.
  mobilenet_onnx  the MobileNet-style model of tests/onnx/make_onnx_models.py (MobileNetSmall,
                  28.5k parameters), which experiments/mobilenet_onnx_*.ini import from ONNX.
The classes are tests/onnx/make_onnx_models.py's. Module names are the framework's parameter
names (PyTorch state_dict names), so a checkpoint maps one to one.

Data: the gzip'd IDX files of Debian's dataset-fashion-mnist, the first N images of a split (as
data.train_limit / data.test_limit take them), normalized as the framework does:
(x / 255 - 0.2860) / 0.3530, float32, NCHW.

Checkpoints (train/checkpoint.c): HDF5 with /params/<name> and /buffers/<name> in PyTorch's
state_dict names and shapes; conv weights are stored OIHW, as PyTorch's, and load as they are.
The framework's activations are NHWC, so a flatten of an image orders the features (h, w, c)
where PyTorch's nn.Flatten orders them (c, h, w): FashionCNN's fc1 (the only linear layer after
a flatten of a spatial image; ResCNN and the MobileNet-style model flatten a 1x1 pooled map)
has its 3136 columns permuted from (h, w, c) to (c, h, w) on loading, so that the standard
NCHW PyTorch module computes the same function. `python models.py verify` checks that on a
checkpoint: the loaded model's test accuracy against the run's summary.json.
"""
import argparse
import gzip
import json
import os
import sys

import numpy as np
import torch
import torch.nn as nn

FASHION = "/usr/share/datasets/fashion-mnist/"
MEAN, STD = 0.2860, 0.3530
MODEL_NAMES = ("fashion_cnn", "res_cnn", "mobilenet_onnx")


# ---- models ------------------------------------------------------------------------------------
# The same PyTorch twins that tests/onnx/make_onnx_models.py exports for the importer's tests (their
# module names are the framework's parameter names): one definition of each architecture.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "onnx"))
from make_onnx_models import FashionCNN, MobileNetSmall, ResCNN  # noqa: E402


def build(name):
    """A fresh (randomly initialized) model by grid name."""
    if name == "fashion_cnn":
        return FashionCNN()
    if name == "res_cnn":
        return ResCNN()
    if name in ("mobilenet_onnx", "mobilenet"):
        return MobileNetSmall()
    import zoo  # experiments/zoo.py (on the path by common.py): torchvision's models as the zoo builds them
    if name in zoo.MODELS:
        return zoo.build(name)
    raise ValueError("unknown model %r (known: %s)" % (name, ", ".join(MODEL_NAMES)))


# ---- data --------------------------------------------------------------------------------------

def load_fashion(split, limit=0, root=FASHION):
    """(x, y) of split 'train' or 't10k': the first `limit` images (0 = all), x float32 NCHW
    normalized as the framework does, y int64."""
    with gzip.open(os.path.join(root, "%s-images-idx3-ubyte.gz" % split), "rb") as f:
        raw = f.read()
    with gzip.open(os.path.join(root, "%s-labels-idx1-ubyte.gz" % split), "rb") as f:
        lab = f.read()
    if int.from_bytes(raw[:4], "big") != 2051 or int.from_bytes(lab[:4], "big") != 2049:
        raise ValueError("%s: not IDX image/label files" % split)
    n = int.from_bytes(raw[4:8], "big")
    if limit:
        n = min(n, limit)
    x = np.frombuffer(raw, np.uint8, count=n * 784, offset=16).reshape(n, 1, 28, 28)
    y = np.frombuffer(lab, np.uint8, count=n, offset=8)
    x = (x.astype(np.float32) / np.float32(255.0) - np.float32(MEAN)) / np.float32(STD)
    return torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))


def batches(x, y, batch_size, shuffle=False, generator=None, drop_last=False):
    n = x.shape[0]
    order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
    stop = n - n % batch_size if drop_last else n
    for i in range(0, stop, batch_size):
        idx = order[i:i + batch_size]
        yield x[idx], y[idx]


@torch.no_grad()
def accuracy(model, x, y, batch_size=256, memory_format=None):
    """Top-1 accuracy of a callable (nn.Module, GraphModule, or any function of a batch)."""
    if isinstance(model, nn.Module) and not isinstance(model, torch.fx.GraphModule):
        model.eval()  # exported graphs are switched by the caller (move_exported_model_to_eval)
    correct = 0
    for i in range(0, x.shape[0], batch_size):
        xb = x[i:i + batch_size]
        if memory_format is not None:
            xb = xb.contiguous(memory_format=memory_format)
        correct += int((model(xb).argmax(1) == y[i:i + batch_size]).sum())
    return correct / x.shape[0]


# ---- checkpoints -------------------------------------------------------------------------------

def hwc_to_chw_columns(w, c, h, wd):
    """Linear weight (out, h*w*c) whose input is an NHWC flatten -> (out, c*h*w) for NCHW's."""
    out = w.shape[0]
    return w.reshape(out, h, wd, c).permute(0, 3, 1, 2).reshape(out, c * h * wd).contiguous()


def read_checkpoint(path):
    """{name: tensor} of /params and /buffers, and the root attributes."""
    import h5py
    state = {}
    with h5py.File(path, "r") as f:
        for group in ("params", "buffers"):
            if group in f:
                for k in f[group]:
                    state[k] = torch.from_numpy(np.array(f[group][k][()], dtype=np.float32))
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
    return state, attrs


def load_checkpoint(model, path, name=None):
    """Loads a framework fp32 checkpoint into a twin model (strict: every parameter and BN
    statistic must be there with its shape). Returns the checkpoint's root attributes."""
    state, attrs = read_checkpoint(path)
    name = name or attrs.get("model")
    if name == "fashion_cnn" and "fc1.weight" in state:
        state["fc1.weight"] = hwc_to_chw_columns(state["fc1.weight"], 64, 7, 7)
    own = model.state_dict()
    missing = [k for k in own if k not in state and not k.endswith("num_batches_tracked")]
    extra = [k for k in state if k not in own]
    if missing or extra:
        raise ValueError("%s: checkpoint does not match the model: missing %s, unexpected %s"
                         % (path, missing, extra))
    for k, v in own.items():
        if k.endswith("num_batches_tracked"):
            continue
        if tuple(state[k].shape) != tuple(v.shape):
            raise ValueError("%s: %s has shape %s, the model wants %s" % (path, k, tuple(state[k].shape), tuple(v.shape)))
        with torch.no_grad():
            v.copy_(state[k])
    return attrs


def load_model(name, checkpoint):
    """The twin of `name` with the checkpoint's weights, in eval mode."""
    m = build(name)
    load_checkpoint(m, checkpoint, "mobilenet" if name.startswith("mobilenet") else name)
    return m.eval()


def verify(name, checkpoint, test_limit=0):
    """(our summary.json fp32 accuracy, the twin's accuracy on the same test images)."""
    summary = os.path.join(os.path.dirname(checkpoint), "summary.json")
    with open(summary) as f:
        s = json.load(f)
    ours = s["stages"]["fp32"]["test_accuracy"]
    n = s["stages"]["fp32"].get("test_images") or test_limit
    x, y = load_fashion("t10k", n)
    return ours, accuracy(load_model(name, checkpoint), x, y), n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("verify", help="load a checkpoint and compare its accuracy with summary.json")
    v.add_argument("--model", required=True, choices=MODEL_NAMES)
    v.add_argument("--checkpoint", required=True)
    v.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    ours, theirs, n = verify(a.model, a.checkpoint)
    print("%s: framework fp32 %.4f, PyTorch twin %.4f on %d test images (difference %+.4f)"
          % (a.model, ours, theirs, n, theirs - ours))
    sys.exit(0 if abs(theirs - ours) <= 0.002 else 1)


if __name__ == "__main__":
    main()
