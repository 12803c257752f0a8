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
    torch.clamp(0.2 x + 0.5, 0, 1))

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
}
for name, fn in CASES.items():
    xi = x.clone().requires_grad_()
    y = fn(xi)
    y.backward(dy)
    put(data, name + "_y", y)
    put(data, name + "_dx", xi.grad)

write(os.path.join(HERE, "act.h5"), data, "tests/ref/make_ref_act.py", torch.__version__)
