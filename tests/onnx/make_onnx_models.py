#!/usr/bin/python3
"""Writes the ONNX models and PyTorch references of tests/onnx/ (run with Debian's torch 1.13:
/usr/bin/python3 tests/onnx/make_onnx_models.py; deterministic, seed 0; the CTest tests need no
torch, only these committed files).

Models (tests/onnx/models/, torch.onnx.export, dynamic batch unless noted):
  fashion_cnn      the twin of the preset FashionCNN: same module names (conv1, bn1, relu1, pool1,
                   ..., flatten, fc1, relu3, fc2), PyTorch's own NCHW flatten (nn.Flatten):
                   the importer permutes fc1's columns. Opset 13, training export (BN kept).
  fashion_mlp      the twin of FashionMLP (flatten, fc1, relu1, fc2). Opset 11 (IR 6).
  res_cnn          the twin of ResCNN (stem, block1, down, block2: conv/bn/relu, the residual add
                   as a module named add, gap, flatten, fc). Opset 15.
  mobilenet        a small MobileNet-style model for Fashion-MNIST (28x28x1, 10 classes, < 50k
                   parameters): a stem conv, a depthwise-separable pair (stride 2), one inverted
                   residual block (1x1 expand, 3x3 depthwise, 1x1 linear project, add), a second
                   depthwise-separable pair (stride 2), global average pool, x.view(n, -1),
                   linear; BN and ReLU6 (exported as Clip(0, 6)). Opset 17, training export.
  mobilenet_eval   the same model exported in eval mode (PyTorch folds each BN into its conv;
                   no BN left), opset 13.
  tiny_features    what the twins do not use: a rectangular conv (3x1 kernel, stride (2, 1), pads
                   (1, 0)), AvgPool2d(3, 1, 1) (exported as a zero Pad + AveragePool), Dropout(0),
                   x.view(n, -1) of an image (Reshape, permuted columns), x @ W.t() + b (MatMul +
                   Add), ReLU, BatchNorm1d. Static batch 2 (the Reshape's shape is a constant [2, -1]).

Bad models (tests/onnx/bad/, for test_onnx_errors.sh), each a variant of a tiny conv net:
  unsupported_op (Softplus), dilation2 (a dilated conv),
  auto_pad (a Conv given auto_pad SAME_UPPER), asymmetric_pad (a Conv given pads [0, 0, 1, 1]),
  dynamic_hw (input [batch, 1, height, width], its Gemm sized for 16x16 images), rgb_dynamic
  (input [batch, 3, height, width]), missing_initializer (the conv weight removed),
  short_initializer (the fc weight's raw data 4 bytes short), bn_size (a BN scale of 3 values for
  4 channels).

References (tests/onnx/ref/onnx_ref.h5), one group per good model:
  x (8, H, W, C) NHWC input, labels (8) int32; y_eval: the eval-mode logits; y_train: the
  train-mode logits (batch statistics), loss: their cross-entropy; grad/<name>: the gradient of
  that loss for every parameter, named as the imported graph names it (PyTorch's state_dict
  names, except the MatMul weight of tiny_features) in PyTorch's layout; after/<name>: the BN
  running statistics after that training forward. Attribute `train`: 0 when only y_eval applies
  (mobilenet_eval has no BN left to train).
"""
import copy
import os

import h5py
import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS, BAD, REF = os.path.join(HERE, "models"), os.path.join(HERE, "bad"), os.path.join(HERE, "ref")
N = 8


# ---- the twins of the presets (nn/models.c) --------------------------------------------------

class FashionCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1, self.relu1 = nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU()
        self.pool1 = nn.MaxPool2d(2)
        self.conv2, self.bn2, self.relu2 = nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU()
        self.pool2 = nn.MaxPool2d(2)
        self.flatten = nn.Flatten()
        self.fc1, self.relu3, self.fc2 = nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10)

    def forward(self, x):
        x = self.pool1(self.relu1(self.bn1(self.conv1(x))))
        x = self.pool2(self.relu2(self.bn2(self.conv2(x))))
        return self.fc2(self.relu3(self.fc1(self.flatten(x))))


class FashionMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.flatten, self.fc1, self.relu1, self.fc2 = nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10)

    def forward(self, x):
        return self.fc2(self.relu1(self.fc1(self.flatten(x))))


class Add(nn.Module):
    """a + b as a module, so that the export names the node after it (block1.add)."""

    def forward(self, a, b):
        return a + b


class ConvBNReLU(nn.Module):
    def __init__(self, cin, cout, stride=1, relu6=False, groups=1, kernel=3):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU6() if relu6 else nn.ReLU()

    def forward(self, x):
        return self.relu(self.bn(self.conv(x)))


class ResBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1, self.bn1, self.relu1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU()
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.add, self.relu2 = Add(), nn.ReLU()

    def forward(self, x):
        y = self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x)))))
        return self.relu2(self.add(y, x))


class ResCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem, self.block1 = ConvBNReLU(1, 16), ResBlock(16)
        self.down, self.block2 = ConvBNReLU(16, 32, stride=2), ResBlock(32)
        self.gap, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(32, 10)

    def forward(self, x):
        x = self.block2(self.down(self.block1(self.stem(x))))
        return self.fc(torch.flatten(self.gap(x), 1))


# ---- the MobileNet-style model ----------------------------------------------------------------

class InvertedResidual(nn.Module):
    """1x1 expand + BN + ReLU6, 3x3 depthwise + BN + ReLU6, 1x1 project + BN (linear), + x."""

    def __init__(self, c, expand):
        super().__init__()
        h = c * expand
        self.expand = ConvBNReLU(c, h, relu6=True, kernel=1)
        self.dw = ConvBNReLU(h, h, relu6=True, groups=h)
        self.project = nn.Conv2d(h, c, 1, bias=False)
        self.project_bn = nn.BatchNorm2d(c)
        self.add = Add()

    def forward(self, x):
        return self.add(self.project_bn(self.project(self.dw(self.expand(x)))), x)


class MobileNetSmall(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = ConvBNReLU(1, 16, relu6=True)                      # 28x28x16
        self.dw1 = ConvBNReLU(16, 16, stride=2, relu6=True, groups=16)  # 14x14x16
        self.pw1 = ConvBNReLU(16, 48, relu6=True, kernel=1)             # 14x14x48
        self.block = InvertedResidual(48, 4)                            # 14x14x48 (192 inside)
        self.dw2 = ConvBNReLU(48, 48, stride=2, relu6=True, groups=48)  # 7x7x48
        self.pw2 = ConvBNReLU(48, 96, relu6=True, kernel=1)             # 7x7x96
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(96, 10)

    def forward(self, x):
        x = self.pw2(self.dw2(self.block(self.pw1(self.dw1(self.stem(x))))))
        x = self.gap(x)
        return self.fc(x.view(x.size(0), -1))


class TinyFeatures(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, (3, 1), stride=(2, 1), padding=(1, 0))
        self.relu = nn.ReLU()
        self.pool = nn.AvgPool2d(3, 1, 1)
        self.drop = nn.Dropout(0.0)
        self.w = nn.Parameter(torch.randn(16, 4 * 14 * 28) * 0.02)
        self.b = nn.Parameter(torch.randn(16) * 0.1)
        self.bn = nn.BatchNorm1d(16)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        y = self.pool(self.relu(self.conv(x)))
        y = self.drop(y.view(y.size(0), -1))
        return self.fc(self.bn(torch.relu(y @ self.w.t() + self.b)))


# ---- export and references ----------------------------------------------------------------------

def randomize_bn(model, gen):
    """Trained-looking BN parameters and statistics (a few large gammas so ReLU6 clamps)."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                c = m.num_features
                m.weight.copy_(torch.rand(c, generator=gen) * 2.5 + 0.5)
                m.bias.copy_(torch.randn(c, generator=gen) * 0.5)
                m.running_mean.copy_(torch.randn(c, generator=gen) * 0.3)
                m.running_var.copy_(torch.rand(c, generator=gen) + 0.5)


def export(model, path, opset, training, shape=(1, 28, 28), dynamic=True, axes=None):
    """Exports a copy of model and returns it: a training export runs the model once in train
    mode, which moves its BN running statistics before they are written, so the references are
    computed from the copy as exported."""
    m = copy.deepcopy(model)
    m.train(training)
    mode = torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL
    dyn = None
    if dynamic:
        dyn = {"input": axes or {0: "batch"}, "logits": {0: "batch"}}
    torch.onnx.export(m, torch.randn(2, *shape), path, opset_version=opset, training=mode,
                      input_names=["input"], output_names=["logits"], dynamic_axes=dyn)
    onnx.checker.check_model(onnx.load(path), full_check=True)
    return m


def round_mantissa(a, bits=14):
    """float32 rounded to `bits` mantissa bits (relative error <= 2^-(bits+1) = 3e-5, a third of
    the gradient tolerance of test_onnx_import), so that the large fc gradients compress: the
    reference file stays small."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    drop = 23 - bits
    u = ((u + (1 << (drop - 1))) >> drop) << drop
    return u.astype(np.uint32).view(np.float32)


def nhwc(t):
    return t.detach().permute(0, 2, 3, 1).contiguous().numpy()


def write_ref(f, name, model, ir_names=None, train=True, shape=(1, 28, 28)):
    """x, labels, y_eval; with train: y_train, loss, grad/<ir name>, after/<buffer>."""
    ir_names = ir_names or {}
    gen = torch.Generator().manual_seed(100 + len(f))
    x = torch.randn(N, *shape, generator=gen)
    labels = torch.randint(0, 10, (N,), generator=gen)
    g = f.create_group(name)
    g.attrs["train"] = int(train)
    g.create_dataset("x", data=nhwc(x).astype(np.float32))
    g.create_dataset("labels", data=labels.numpy().astype(np.int32))
    m = copy.deepcopy(model)
    m.eval()
    with torch.no_grad():
        g.create_dataset("y_eval", data=m(x).numpy().astype(np.float32))
    if not train:
        return
    m.train()
    m.zero_grad()
    y = m(x)
    loss = F.cross_entropy(y, labels)
    loss.backward()
    g.create_dataset("y_train", data=y.detach().numpy().astype(np.float32))
    g.create_dataset("loss", data=np.array([loss.item()], dtype=np.float32))
    for pname, p in m.named_parameters():
        g.create_dataset("grad/" + ir_names.get(pname, pname), data=round_mantissa(p.grad.numpy()),
                         compression="gzip", compression_opts=9, shuffle=True)
    for bname, b in m.named_buffers():
        if "num_batches" not in bname:
            g.create_dataset("after/" + bname, data=b.numpy().astype(np.float32))


def bad_base():
    """conv 1->2 + ReLU + max pool 4 + flatten + linear 98->10: the base of the bad models."""
    class Base(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.relu, self.pool = nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(4)
            self.flatten, self.fc = nn.Flatten(), nn.Linear(2 * 7 * 7, 10)

        def forward(self, x):
            return self.fc(self.flatten(self.pool(self.relu(self.conv(x)))))
    return Base()


def save_bad(name, model_proto):
    onnx.save(model_proto, os.path.join(BAD, name + ".onnx"))


def make_bad():
    base = bad_base()
    path = os.path.join(BAD, "base.onnx")
    export(base, path, 13, False)
    proto = onnx.load(path)
    os.remove(path)

    class Softplus(nn.Module):
        def __init__(self):
            super().__init__()
            self.base = bad_base()
            self.base.relu = nn.Softplus()

        def forward(self, x):
            return self.base(x)
    export(Softplus(), os.path.join(BAD, "unsupported_op.onnx"), 13, False)

    m = bad_base()
    m.conv = nn.Conv2d(1, 2, 3, padding=2, dilation=2)
    export(m, os.path.join(BAD, "dilation2.onnx"), 13, False)

    p = copy.deepcopy(proto)
    conv = next(n for n in p.graph.node if n.op_type == "Conv")
    for a in list(conv.attribute):
        if a.name == "pads":
            conv.attribute.remove(a)
    conv.attribute.append(onnx.helper.make_attribute("auto_pad", "SAME_UPPER"))
    save_bad("auto_pad", p)

    p = copy.deepcopy(proto)  # PyTorch exports ZeroPad2d through ConstantOfShape: set the pads by hand
    conv = next(n for n in p.graph.node if n.op_type == "Conv")
    pads = next(a for a in conv.attribute if a.name == "pads")
    pads.ints[:] = [0, 0, 1, 1]
    save_bad("asymmetric_pad", p)

    m = bad_base()
    m.fc = nn.Linear(2 * 4 * 4, 10)  # sized for 16x16 images
    export(m, os.path.join(BAD, "dynamic_hw.onnx"), 13, False, shape=(1, 16, 16),
           axes={0: "batch", 2: "height", 3: "width"})

    class RGB(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.relu = nn.Conv2d(3, 4, 3, padding=1), nn.ReLU()
            self.gap, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(4, 10)

        def forward(self, x):
            return self.fc(torch.flatten(self.gap(self.relu(self.conv(x))), 1))
    export(RGB(), os.path.join(BAD, "rgb_dynamic.onnx"), 13, False, shape=(3, 16, 16),
           axes={0: "batch", 2: "height", 3: "width"})

    p = copy.deepcopy(proto)
    w = next(t for t in p.graph.initializer if t.name == "conv.weight")
    p.graph.initializer.remove(w)
    save_bad("missing_initializer", p)

    p = copy.deepcopy(proto)
    w = next(t for t in p.graph.initializer if t.name == "fc.weight")
    w.raw_data = w.raw_data[:-4]
    save_bad("short_initializer", p)

    class BN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn, self.relu = nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU()
            self.gap, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(4, 10)

        def forward(self, x):
            return self.fc(torch.flatten(self.gap(self.relu(self.bn(self.conv(x)))), 1))
    path = os.path.join(BAD, "bn_size.onnx")
    export(BN(), path, 13, True)
    p = onnx.load(path)
    s = next(t for t in p.graph.initializer if t.name == "bn.weight")
    s.dims[0] = 3
    s.raw_data = s.raw_data[:12]
    save_bad("bn_size", p)


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    for d in (MODELS, BAD, REF):
        os.makedirs(d, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    models = {
        "fashion_cnn": (FashionCNN(), 13, {}),
        "fashion_mlp": (FashionMLP(), 11, {}),
        "res_cnn": (ResCNN(), 15, {}),
        "mobilenet": (MobileNetSmall(), 17, {}),
        "tiny_features": (TinyFeatures(), 13, {"w": "MatMul.weight", "b": "MatMul.bias"}),
    }
    for m, _, _ in models.values():
        randomize_bn(m, gen)
    n_params = sum(p.numel() for p in models["mobilenet"][0].parameters())
    assert n_params < 50000, n_params
    tmp = os.path.join(REF, "onnx_ref.h5.tmp")
    with h5py.File(tmp, "w") as f:
        f.attrs["generator"] = b"tests/onnx/make_onnx_models.py"
        f.attrs["torch_version"] = str(torch.__version__).encode()
        for name, (model, opset, ir_names) in models.items():
            static = name == "tiny_features"
            exported = export(model, os.path.join(MODELS, name + ".onnx"), opset, True, dynamic=not static)
            write_ref(f, name, exported, ir_names)
        export(models["mobilenet"][0], os.path.join(MODELS, "mobilenet_eval.onnx"), 13, False)
        write_ref(f, "mobilenet_eval", models["mobilenet"][0], train=False)
    os.replace(tmp, os.path.join(REF, "onnx_ref.h5"))
    make_bad()
    print("mobilenet: %d parameters" % n_params)
    for d in (MODELS, BAD, REF):
        for fn in sorted(os.listdir(d)):
            print("  %s/%s: %d bytes" % (os.path.basename(d), fn, os.path.getsize(os.path.join(d, fn))))


if __name__ == "__main__":
    main()
