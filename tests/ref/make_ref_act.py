#!/usr/bin/python3
"""Writes tests/ref/act.h5: PyTorch 1.13 (Debian python3-torch) references for the element-wise
activations of autograd/ops_act.c, tested by tests/kernels_cpu/test_activations_torch.c.

  x        2048 inputs: every multiple of 1/64 in [-8, 8) (the piecewise functions' corners -3,
           0 and 3 among them, exactly) and 1024 draws of 4 N(0, 1) (tails for exp, erf, tanh)
  dy       a random upstream gradient of the same size
  <case>_y, <case>_dx   the output and the input gradient (autograd) of each case:
    sigmoid, tanh, silu, hardsigmoid, hardswish, gelu (approximate='none'),
    gelu_tanh (approximate='tanh'), leaky_relu_0.01, leaky_relu_0.2, elu_1, elu_0.5,
    hardsigmoid_onnx (ONNX's HardSigmoid default alpha 0.2, beta 0.5, stated as
    torch.clamp(0.2 x + 0.5, 0, 1)), and the arithmetic with a Python number: mul_0.3 (x * 0.3),
    add_0.75 (x + 0.75), sub_0.3 (x - 0.3), rsub_0.3 (0.3 - x), div_3 (x / 3)
  mul_a, mul_dy        a (3, 5, 4, 6) NHWC and an upstream gradient of its shape
  mul_same_b, mul_channel_b   b of a's shape, and b (3, 6): one factor per sample and channel
  mul_<same|channel>_y, _da, _db   a * b (the channel one broadcast over H and W, as
    squeeze-excite's gate * x) and both gradients (autograd/ops_binary.c)
  prelu_<one|channel>_w, _y, _dx, _dw   F.prelu of mul_a (NHWC, channels last: the slopes
    broadcast over N, H, W) with one slope or one per channel, and both gradients for mul_dy
  resize_dy, resize_<nearest|bilinear>_y, _dx   F.interpolate(scale_factor=2) of mul_a (NHWC),
    nearest and bilinear (align_corners=False), and the input gradient for resize_dy

Run: /usr/bin/python3 tests/ref/make_ref_act.py   (deterministic: fixed seed)
"""
import os

import torch
import torch.nn.functional as F

from ref_h5 import put, write

torch.manual_seed(4321)
torch.set_num_threads(1)
HERE = os.path.dirname(os.path.abspath(__file__))
data = {}

grid = torch.arange(-512, 512, dtype=torch.float32) / 64.0
x = torch.cat([grid, torch.randn(1024) * 4.0])
dy = torch.randn(x.numel())
put(data, "x", x)
put(data, "dy", dy)

CASES = {
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "silu": F.silu,
    "hardsigmoid": F.hardsigmoid,
    "hardswish": F.hardswish,
    "gelu": lambda t: F.gelu(t, approximate="none"),
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "leaky_relu_0.01": lambda t: F.leaky_relu(t, 0.01),
    "leaky_relu_0.2": lambda t: F.leaky_relu(t, 0.2),
    "elu_1": lambda t: F.elu(t, 1.0),
    "elu_0.5": lambda t: F.elu(t, 0.5),
    "hardsigmoid_onnx": lambda t: torch.clamp(0.2 * t + 0.5, 0.0, 1.0),
    "mul_0.3": lambda t: t * 0.3,
    "add_0.75": lambda t: t + 0.75,
    "sub_0.3": lambda t: t - 0.3,
    "rsub_0.3": lambda t: 0.3 - t,
    "div_3": lambda t: t / 3.0,
}
for name, fn in CASES.items():
    xi = x.clone().requires_grad_()
    y = fn(xi)
    y.backward(dy)
    put(data, name + "_y", y)
    put(data, name + "_dx", xi.grad)

gen = torch.Generator().manual_seed(99)
a = torch.randn(3, 5, 4, 6, generator=gen)
b_same = torch.randn(3, 5, 4, 6, generator=gen)
b_channel = torch.rand(3, 6, generator=gen)
dy_mul = torch.randn(3, 5, 4, 6, generator=gen)
put(data, "mul_a", a)
put(data, "mul_dy", dy_mul)
for name, b, view in (("mul_same", b_same, lambda t: t), ("mul_channel", b_channel, lambda t: t[:, None, None, :])):
    ai, bi = a.clone().requires_grad_(), b.clone().requires_grad_()
    y = ai * view(bi)
    y.backward(dy_mul)
    put(data, name + "_b", b)
    put(data, name + "_y", y)
    put(data, name + "_da", ai.grad)
    put(data, name + "_db", bi.grad)

for name, w in (("prelu_one", torch.tensor([0.3])), ("prelu_channel", torch.rand(6, generator=gen) - 0.5)):
    ai, wi = a.clone().permute(0, 3, 1, 2).requires_grad_(), w.clone().requires_grad_()  # NCHW for F.prelu
    y = F.prelu(ai, wi)
    y.backward(dy_mul.permute(0, 3, 1, 2))
    put(data, name + "_w", w)
    put(data, name + "_y", y.permute(0, 2, 3, 1))
    put(data, name + "_dx", ai.grad.permute(0, 2, 3, 1))
    put(data, name + "_dw", wi.grad)

dy_resize = torch.randn(3, 10, 8, 6, generator=gen)
put(data, "resize_dy", dy_resize)
for mode in ("nearest", "bilinear"):
    ai = a.clone().permute(0, 3, 1, 2).contiguous().requires_grad_()
    kw = {} if mode == "nearest" else {"align_corners": False}
    y = F.interpolate(ai, scale_factor=2, mode=mode, **kw)
    y.backward(dy_resize.permute(0, 3, 1, 2))
    put(data, "resize_%s_y" % mode, y.permute(0, 2, 3, 1))
    put(data, "resize_%s_dx" % mode, ai.grad.permute(0, 2, 3, 1))

write(os.path.join(HERE, "act.h5"), data, "tests/ref/make_ref_act.py", torch.__version__)
