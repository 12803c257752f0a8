#!/usr/bin/python3
"""Writes tests/ref/tokens.h5: PyTorch 1.13 (Debian python3-torch) references for the
transformer's ops of autograd/ops_tokens.c, tested by tests/kernels_cpu/test_tokens_torch.c.
Tensors are NHWC images whose pixels are the tokens, or (N, T, D) rows.

  ln_x, ln_gamma, ln_beta, ln_dy   x (3, 5, 4, 24) with a per-row offset up to 8 (a mean far from
           0), gamma and beta (24), an upstream gradient
  ln_y, ln_dx, ln_dgamma, ln_dbeta  F.layer_norm over the last dim, eps 1e-6, and its gradients
  attn<k>_q, _k, _v, _dy   q, k, v and an upstream gradient of one shape: attn4 (2, 7, 7, 32)
           with 4 heads (49 tokens of 32 features), attn1 (3, 5, 16) with 1 head
  attn<k>_y, _dq, _dk, _dv   per sample and head softmax(Q K^T / sqrt(D / heads)) V, the heads
           split from the last dim as (heads, D / heads), and the gradients
  addp_x, addp_p, addp_dy   x (3, 7, 7, 8), p (7, 7, 8), an upstream gradient
  addp_y, addp_dx, addp_dp   x + p (p broadcast over the batch) and its gradients

Run: /usr/bin/python3 tests/ref/make_ref_tokens.py   (deterministic: fixed seed)
"""
import math
import os

import torch
import torch.nn.functional as F

from ref_h5 import put, write

torch.set_num_threads(1)
HERE = os.path.dirname(os.path.abspath(__file__))
gen = torch.Generator().manual_seed(2024)
data = {}


def rand(*shape):
    return torch.randn(*shape, generator=gen)


def grads(fn, inputs, dy):
    leaves = [t.clone().requires_grad_() for t in inputs]
    y = fn(*leaves)
    y.backward(dy)
    return y, [t.grad for t in leaves]


x = rand(3, 5, 4, 24) + 8.0 * torch.rand(3, 5, 4, 1, generator=gen)
gamma, beta, dy = rand(24), rand(24), rand(3, 5, 4, 24)
y, (dx, dg, db) = grads(lambda a, g, b: F.layer_norm(a, (24,), g, b, 1e-6), (x, gamma, beta), dy)
for k, v in dict(x=x, gamma=gamma, beta=beta, dy=dy, y=y, dx=dx, dgamma=dg, dbeta=db).items():
    put(data, "ln_" + k, v)


def attention(q, k, v, heads):
    N, D = q.shape[0], q.shape[-1]
    dh = D // heads

    def split(t):
        return t.reshape(N, -1, heads, dh).permute(0, 2, 1, 3)

    p = torch.softmax(split(q) @ split(k).transpose(-2, -1) / math.sqrt(dh), dim=-1)
    return (p @ split(v)).permute(0, 2, 1, 3).reshape(q.shape)


for name, shape, heads in (("attn4", (2, 7, 7, 32), 4), ("attn1", (3, 5, 16), 1)):
    q, k, v, dy = rand(*shape), rand(*shape), rand(*shape), rand(*shape)
    y, (dq, dk, dv) = grads(lambda a, b, c: attention(a, b, c, heads), (q, k, v), dy)
    for key, val in dict(q=q, k=k, v=v, dy=dy, y=y, dq=dq, dk=dk, dv=dv).items():
        put(data, name + "_" + key, val)

x, p, dy = rand(3, 7, 7, 8), rand(7, 7, 8), rand(3, 7, 7, 8)
y, (dx, dp) = grads(lambda a, b: a + b, (x, p), dy)
for k, v in dict(x=x, p=p, dy=dy, y=y, dx=dx, dp=dp).items():
    put(data, "addp_" + k, v)

write(os.path.join(HERE, "tokens.h5"), data, "tests/ref/make_ref_tokens.py", torch.__version__)
