#!/usr/bin/python3
"""Writes tests/onnx/models/act_cnn.onnx, se_cnn.onnx, cat_cnn.onnx and shuffle_cnn.onnx and their
PyTorch reference
tests/onnx/ref/act_ref.h5 (run with Debian's torch 1.13: /usr/bin/python3
tests/onnx/make_act_models.py; deterministic, seed 0; the CTest tests need no torch, only these
committed files).

act_cnn: a small conv net for Fashion-MNIST with element-wise activations, each after a conv +
BN: Hardswish (HardSwish), Hardsigmoid (HardSigmoid, alpha 1/6), LeakyReLU(0.1) (LeakyRelu),
ELU(0.5) (Elu), Tanh, Sigmoid, and SiLU (exported as x * Sigmoid(x): Sigmoid, Mul); a stride-2
depthwise conv, global average pool, flatten, linear. Opset 17, training export (BN kept), dynamic batch.
se_cnn: squeeze-excite blocks as torchvision builds them (torchvision.ops.SqueezeExcitation:
adaptive average pool, 1x1 conv, activation, 1x1 conv, gate, then gate * input): MobileNetV3's
(ReLU, Hardsigmoid) after a stride-2 depthwise conv, EfficientNet's (SiLU, Sigmoid) after a
stride-2 conv with SiLU, then a conv with GELU (torch 1.13 exports it as Div, Erf, Add, Mul,
Mul), global average pool, flatten, linear. Opset 17, training export, dynamic batch.
cat_cnn: concatenation along channels: SqueezeNet's Fire module (a 1x1 squeeze, then 1x1 and
3x3 expands concatenated), twice, with BN and SqueezeNet's ceil-mode max pool between them, an
Inception-style block of three branches (1x1, 3x3, average pool + 1x1), and the concatenation
of two global pools' vectors before the linear layer. Opset 17, training export, dynamic batch.
prelu_cnn: nn.PReLU() (one slope, exported as PRelu with a [1] slope) after a conv + BN, and
nn.PReLU(16) (a [16, 1, 1] slope) after a strided conv + BN, global average pool, linear. Opset
17, training export, dynamic batch.
resize_cnn: a strided conv + BN + ReLU, nn.Upsample(scale_factor=2) nearest (exported as Resize,
asymmetric, floor), a conv, a strided conv, nn.Upsample bilinear (align_corners=False: Resize
linear, pytorch_half_pixel), a conv, global average pool, linear. Opset 17, training export,
dynamic batch.
arith_cnn: arithmetic with Python numbers between layers, as torch exports it (Mul, Add, Sub and Div
with a constant scalar, the constant first for 1.0 - x): on the input, after a conv + BN + ReLU,
after a conv + BN, after a conv, and on the pooled vector before the linear layer. Opset 17,
training export, dynamic batch.
shuffle_cnn: ShuffleNetV2's units as torchvision builds them (torchvision.models.shufflenetv2:
the stride-2 unit's two branches concatenated, the stride-1 unit's x.chunk(2, dim=1) with one
half passed through, channel_shuffle's view to [N, 2, C / 2, H, W], transpose and view back,
its sizes computed from x.size()), then global average pool, linear. Opset 17, training export,
dynamic batch.
The reference groups `act_cnn`, `se_cnn`, `cat_cnn`, `shuffle_cnn`, `vit`, `arith_cnn`,
`prelu_cnn` and `resize_cnn` hold what
make_onnx_models.py's write_ref writes (x, labels, y_eval; y_train, loss, grad/<name>,
after/<buffer>), which tests/onnx/test_onnx_import.c checks.
"""
import os

import h5py
import torch
import torch.nn as nn

import make_onnx_models as base


class ActCNN(nn.Module):
    def __init__(self):
        super().__init__()

        def unit(cin, cout, act, stride=1, groups=1):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, groups=groups, bias=False), nn.BatchNorm2d(cout),
                                 act)
        self.u1 = unit(1, 16, nn.Hardswish())
        self.u2 = unit(16, 16, nn.Hardsigmoid(), stride=2, groups=16)
        self.u3 = unit(16, 24, nn.LeakyReLU(0.1))
        self.u4 = unit(24, 24, nn.ELU(0.5), stride=2)
        self.u5 = unit(24, 32, nn.Tanh())
        self.u6 = unit(32, 32, nn.Sigmoid())
        self.u7 = unit(32, 32, nn.SiLU())
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = self.u7(self.u6(self.u5(self.u4(self.u3(self.u2(self.u1(x)))))))
        return self.fc(self.gap(x).flatten(1))


class SqueezeExcitation(nn.Module):
    """torchvision.ops.SqueezeExcitation (torchvision 0.14), written out: torchvision is not a
    dependency of the tests."""
    def __init__(self, channels, squeeze, act, gate):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.activation = act
        self.scale_activation = gate

    def forward(self, x):
        scale = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
        return scale * x


class SECNN(nn.Module):
    def __init__(self):
        super().__init__()

        def unit(cin, cout, act, k=3, stride=1, groups=1):
            return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                                 nn.BatchNorm2d(cout), act)
        self.stem = unit(1, 16, nn.Hardswish())
        self.dw = unit(16, 16, nn.ReLU(), stride=2, groups=16)
        self.se1 = SqueezeExcitation(16, 8, nn.ReLU(), nn.Hardsigmoid())
        self.pw = nn.Sequential(nn.Conv2d(16, 24, 1, bias=False), nn.BatchNorm2d(24))
        self.u2 = unit(24, 24, nn.SiLU(), stride=2)
        self.se2 = SqueezeExcitation(24, 6, nn.SiLU(), nn.Sigmoid())
        self.u3 = unit(24, 32, nn.GELU())
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = self.pw(self.se1(self.dw(self.stem(x))))
        x = self.u3(self.se2(self.u2(x)))
        return self.fc(self.gap(x).flatten(1))


class Fire(nn.Module):
    """torchvision.models.squeezenet.Fire (torchvision 0.14), with BN after each conv."""
    def __init__(self, cin, squeeze, expand1, expand3):
        super().__init__()

        def cbr(a, b, k):
            return nn.Sequential(nn.Conv2d(a, b, k, padding=k // 2, bias=False), nn.BatchNorm2d(b), nn.ReLU())
        self.squeeze = cbr(cin, squeeze, 1)
        self.expand1x1 = cbr(squeeze, expand1, 1)
        self.expand3x3 = cbr(squeeze, expand3, 3)

    def forward(self, x):
        x = self.squeeze(x)
        return torch.cat([self.expand1x1(x), self.expand3x3(x)], 1)


class CatCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.fire1 = Fire(16, 8, 16, 16)
        self.pool = nn.MaxPool2d(3, 2, ceil_mode=True)  # SqueezeNet's: 14 -> 7 (floor mode: 6)
        self.fire2 = Fire(32, 8, 16, 16)
        self.b1 = nn.Conv2d(32, 8, 1)
        self.b3 = nn.Conv2d(32, 8, 3, padding=1)
        self.bp = nn.Sequential(nn.AvgPool2d(3, 1, 1), nn.Conv2d(32, 8, 1))
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(56, 10)

    def forward(self, x):
        x = self.fire2(self.pool(self.fire1(self.stem(x))))
        y = torch.relu(torch.cat([self.b1(x), self.b3(x), self.bp(x)], 1))
        return self.fc(torch.cat([self.gap(x).flatten(1), self.gap(y).flatten(1)], 1))


def channel_shuffle(x, groups):
    """torchvision.models.shufflenetv2.channel_shuffle (torchvision 0.14)."""
    batchsize, num_channels, height, width = x.size()
    channels_per_group = num_channels // groups
    x = x.view(batchsize, groups, channels_per_group, height, width)
    x = torch.transpose(x, 1, 2).contiguous()
    return x.view(batchsize, num_channels, height, width)


class ShuffleUnit(nn.Module):
    """torchvision.models.shufflenetv2.InvertedResidual (torchvision 0.14), written out."""
    def __init__(self, inp, oup, stride):
        super().__init__()
        self.stride = stride
        branch = oup // 2

        def dw(c, s):
            return [nn.Conv2d(c, c, 3, s, 1, groups=c, bias=False), nn.BatchNorm2d(c)]

        def pw(a, b):
            return [nn.Conv2d(a, b, 1, bias=False), nn.BatchNorm2d(b), nn.ReLU(inplace=True)]
        if stride > 1:
            self.branch1 = nn.Sequential(*dw(inp, stride), *pw(inp, branch))
        else:
            self.branch1 = nn.Sequential()
        self.branch2 = nn.Sequential(*pw(inp if stride > 1 else branch, branch), *dw(branch, stride),
                                     *pw(branch, branch))

    def forward(self, x):
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat((x1, self.branch2(x2)), dim=1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)
        return channel_shuffle(out, 2)


class ShuffleCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv2d(1, 12, 3, 2, 1, bias=False), nn.BatchNorm2d(12), nn.ReLU())
        self.stage = nn.Sequential(ShuffleUnit(12, 24, 2), ShuffleUnit(24, 24, 1), ShuffleUnit(24, 24, 1))
        self.fc = nn.Linear(24, 10)

    def forward(self, x):
        return self.fc(self.stage(self.conv1(x)).mean([2, 3]))


class Attention(nn.Module):
    """Multi-head self-attention as small vision transformers write it by hand: q, k and v
    linear maps of the tokens, split into heads, softmax(q k^T * scale) v with timm's
    scale = (C / heads) ** -0.5, the heads merged, an output projection."""
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        n, t, c = x.shape
        h = self.heads
        q = self.q(x).reshape(n, t, h, c // h).transpose(1, 2)
        k = self.k(x).reshape(n, t, h, c // h).transpose(1, 2)
        v = self.v(x).reshape(n, t, h, c // h).transpose(1, 2)
        attn = (q @ k.transpose(-2, -1)) * self.scale
        x = (attn.softmax(dim=-1) @ v).transpose(1, 2).reshape(n, t, c)
        return self.proj(x)


class Block(nn.Module):
    """A pre-norm transformer block: x + attention(LN(x)), then x + MLP(LN(x)) with GELU."""
    def __init__(self, dim, heads, hidden):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim, eps=1e-6), nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, heads)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """A small vision transformer for 1x28x28: 4x4 patches (a stride-4 conv) as 49 tokens of 32
    features, a learned position embedding, two blocks of 4 heads, a final LayerNorm, the mean
    of the tokens, a linear head."""
    def __init__(self, dim=32, heads=4, depth=2, hidden=64):
        super().__init__()
        self.patch = nn.Conv2d(1, dim, 4, 4)
        self.pos_embedding = nn.Parameter(torch.randn(1, 49, dim) * 0.02)
        self.blocks = nn.Sequential(*[Block(dim, heads, hidden) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, 10)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2) + self.pos_embedding
        return self.head(self.norm(self.blocks(x)).mean(dim=1))


class ArithCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Sequential(nn.Conv2d(1, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.c2 = nn.Sequential(nn.Conv2d(8, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16))
        self.c3 = nn.Conv2d(16, 16, 3, 2, 1)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = self.c1(x * 0.5 + 0.25) - 0.1
        x = torch.relu(1.0 - self.c2(x)) / 3.0
        x = self.c3(x) * 2.0
        return self.fc(self.gap(x).flatten(1) * 0.7)


class PReLUCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Sequential(nn.Conv2d(1, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8))
        self.p1 = nn.PReLU()
        self.c2 = nn.Sequential(nn.Conv2d(8, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16))
        self.p2 = nn.PReLU(16)
        with torch.no_grad():  # slopes apart from PyTorch's 0.25, of both signs
            self.p2.weight.copy_(torch.linspace(-0.4, 0.6, 16))
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = self.p2(self.c2(self.p1(self.c1(x))))
        return self.fc(self.gap(x).flatten(1))


class ResizeCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Sequential(nn.Conv2d(1, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.up1 = nn.Upsample(scale_factor=2, mode="nearest")
        self.c2 = nn.Sequential(nn.Conv2d(8, 8, 3, 1, 1), nn.ReLU())
        self.c3 = nn.Sequential(nn.Conv2d(8, 16, 3, 2, 1), nn.ReLU())
        self.up2 = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.c4 = nn.Conv2d(16, 16, 3, 2, 1)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = self.c4(self.up2(self.c3(self.c2(self.up1(self.c1(x))))))
        return self.fc(self.gap(x).flatten(1))


def main():
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)  # every model's BN statistics, in this order
    tmp = os.path.join(base.REF, "act_ref.h5.tmp")
    with h5py.File(tmp, "w") as f:
        f.attrs["generator"] = b"tests/onnx/make_act_models.py"
        f.attrs["torch_version"] = str(torch.__version__).encode()
        for seed, (name, cls) in enumerate((("act_cnn", ActCNN), ("se_cnn", SECNN), ("cat_cnn", CatCNN),
                                             ("shuffle_cnn", ShuffleCNN), ("vit", ViT), ("arith_cnn", ArithCNN),
                                             ("prelu_cnn", PReLUCNN), ("resize_cnn", ResizeCNN))):
            torch.manual_seed(seed)
            model = cls()
            base.randomize_bn(model, gen)
            exported = base.export(model, os.path.join(base.MODELS, name + ".onnx"), 17, True)
            base.write_ref(f, name, exported, {"pos_embedding": "pos_embedding.weight"})
    os.replace(tmp, os.path.join(base.REF, "act_ref.h5"))


if __name__ == "__main__":
    main()
