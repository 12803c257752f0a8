#!/usr/bin/python3
"""Writes tests/ref/cpu_ops.h5: PyTorch 1.13 (Debian python3-torch) references for the CPU
kernels tested by tests/kernels_cpu/test_cpu_kernels_torch.c.

Activations are stored NHWC (torch NCHW tensors .permute(0, 2, 3, 1)); max pool indices are
torch's flat h*W+w within each (n, c) plane, stored NHWC as int32. For every op: the input,
the output, a random upstream gradient `*_dy` and torch's input gradient(s).

  bn_*        BatchNorm2d(7, eps=1e-5, momentum=0.1): x (4,5,6,7) with mean 3 and std 2;
              train: y, batch mean / invstd (native_batch_norm's save_mean/save_invstd),
              running stats before (rm0, rv0) and after one training forward (rm1, rv1),
              dx, dgamma, dbeta; eval (running stats rm0/rv0): y, dx, dgamma, dbeta.
  mp2_*       max_pool2d(k2, s2) on (2,9,11,5): y, idx, dx.
  mp3_*       max_pool2d(k3, s2, p1) on (2,9,11,21): y, idx, dx.
  mpt_*       max_pool2d(k3, s2, p1) on (2,7,7,20) with ties (values in steps of 0.5) and NaNs:
              y, idx (ties pick the first max, a NaN is always taken).
  ap_*        avg_pool2d(k3, s1, p1), count_include_pad=True, on (2,7,8,3): y, dx.
  gap_*       adaptive_avg_pool2d(1) on (3,5,4,6): y (3,6), dx.
  relu_*      relu on (2,5,5,4) with exact zeros: y, dx.
  relu6_*     relu6 (hardtanh 0..6) on (2,5,5,4) in [-9, 9] with exact 0 and 6: y, dx (drawn last,
              so the other cases keep their draws).
  shape_*     pool output-size rule: shape_cases (n,8) int32 rows (H, W, KH, KW, sh, sw, ph, pw)
              and shape_out (n,2) torch's (OH, OW) for max_pool2d, or (-1, -1) when torch
              refuses the case (pad > kernel/2, output < 1, non-positive kernel or stride).
  ce_*        cross_entropy (mean) of logits (16,10), int32 labels: loss (1), probs (softmax),
              dlogits for dloss = 1 and ce_dlogits_scaled for dloss = 2.5.

Run: /usr/bin/python3 tests/ref/make_ref_cpu_ops.py   (deterministic: fixed seed)
"""
import os

import h5py
import numpy as np
import torch
import torch.nn.functional as F

torch.manual_seed(1234)
torch.set_num_threads(1)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu_ops.h5")
data = {}


def nhwc(t):
    return t.detach().permute(0, 2, 3, 1).contiguous().numpy()


def put(name, arr, dtype=np.float32):
    if isinstance(arr, torch.Tensor):
        arr = arr.detach().numpy()
    data[name] = np.array(arr, dtype=dtype, copy=True, order="C")  # a copy: buffers mutate later


# ---- batch norm -----------------------------------------------------------------------------
C = 7
x = (torch.randn(4, C, 5, 6) * 2.0 + 3.0).requires_grad_()
bn = torch.nn.BatchNorm2d(C, eps=1e-5, momentum=0.1)
with torch.no_grad():
    bn.weight.copy_(torch.rand(C) + 0.5)
    bn.bias.copy_(torch.randn(C) * 0.5)
    bn.running_mean.copy_(torch.randn(C) * 0.3)
    bn.running_var.copy_(torch.rand(C) + 0.5)
put("bn_x", nhwc(x))
put("bn_gamma", bn.weight.detach())
put("bn_beta", bn.bias.detach())
put("bn_rm0", bn.running_mean)
put("bn_rv0", bn.running_var)
rm0, rv0 = bn.running_mean.clone(), bn.running_var.clone()

_, save_mean, save_invstd = torch.ops.aten.native_batch_norm(
    x.detach(), bn.weight.detach(), bn.bias.detach(), None, None, True, 0.1, 1e-5)
bn.train()
y = bn(x)
dy = torch.randn_like(y)
dx, dg, db = torch.autograd.grad(y, [x, bn.weight, bn.bias], dy)
put("bn_y_train", nhwc(y))
put("bn_mean", save_mean)
put("bn_invstd", save_invstd)
put("bn_rm1", bn.running_mean)
put("bn_rv1", bn.running_var)
put("bn_dy", nhwc(dy))
put("bn_dx_train", nhwc(dx))
put("bn_dgamma_train", dg)
put("bn_dbeta_train", db)

with torch.no_grad():
    bn.running_mean.copy_(rm0)
    bn.running_var.copy_(rv0)
bn.eval()
y = bn(x)
dx, dg, db = torch.autograd.grad(y, [x, bn.weight, bn.bias], dy)
put("bn_y_eval", nhwc(y))
put("bn_dx_eval", nhwc(dx))
put("bn_dgamma_eval", dg)
put("bn_dbeta_eval", db)

# ---- max pool -------------------------------------------------------------------------------
def max_pool(prefix, x, k, s, p, grad=True):
    x = x.clone().requires_grad_(grad)
    y, idx = F.max_pool2d(x, k, s, p, return_indices=True)
    # the channels-last kernel must agree (it is the path NHWC data takes in torch)
    y2, idx2 = F.max_pool2d(x.contiguous(memory_format=torch.channels_last), k, s, p, return_indices=True)
    assert torch.equal(idx, idx2) and torch.allclose(y, y2, equal_nan=True)
    put(prefix + "_x", nhwc(x))
    put(prefix + "_y", nhwc(y))
    put(prefix + "_idx", nhwc(idx), np.int32)
    if grad:
        dy = torch.randn_like(y)
        (dx,) = torch.autograd.grad(y, [x], dy)
        put(prefix + "_dy", nhwc(dy))
        put(prefix + "_dx", nhwc(dx))


max_pool("mp2", torch.randn(2, 5, 9, 11), 2, 2, 0)
max_pool("mp3", torch.randn(2, 21, 9, 11), 3, 2, 1)
xt = torch.round(torch.randn(2, 20, 7, 7) * 2.0) / 2.0
xt.view(-1)[::11] = float("nan")
max_pool("mpt", xt, 3, 2, 1, grad=False)

# ---- avg pool, global avg pool ----------------------------------------------------------------
def unary_grad(prefix, x, fn, out=nhwc):
    """y = fn(x), a random upstream gradient dy and dx, stored as <prefix>_x, _y, _dy, _dx (y and dy
    through `out`)."""
    y = fn(x)
    dy = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, [x], dy)
    put(prefix + "_x", nhwc(x))
    put(prefix + "_y", out(y))
    put(prefix + "_dy", out(dy))
    put(prefix + "_dx", nhwc(dx))


unary_grad("ap", torch.randn(2, 3, 7, 8, requires_grad=True),
           lambda t: F.avg_pool2d(t, 3, 1, 1, count_include_pad=True))
unary_grad("gap", torch.randn(3, 6, 5, 4, requires_grad=True), lambda t: F.adaptive_avg_pool2d(t, 1),
           out=lambda t: t.detach().reshape(3, 6))

# ---- relu -----------------------------------------------------------------------------------
x = torch.randn(2, 4, 5, 5)
x.view(-1)[::9] = 0.0
x.requires_grad_()
unary_grad("relu", x, torch.relu)

# ---- pool output-size rule -------------------------------------------------------------------
cases = [(28, 28, 2, 2, 2, 2, 0, 0), (9, 11, 3, 3, 2, 2, 1, 1), (7, 8, 3, 3, 1, 1, 1, 1),
         (1, 1, 2, 2, 2, 2, 0, 0), (1, 5, 3, 3, 2, 2, 0, 0), (2, 2, 3, 3, 1, 1, 1, 1),
         (5, 5, 3, 3, 1, 1, 2, 2), (5, 5, 2, 2, 2, 2, 1, 1), (5, 5, 1, 1, 1, 1, 1, 1),
         (6, 7, 3, 2, 1, 2, 1, 1), (3, 3, 3, 3, 5, 5, 0, 0), (4, 4, 5, 5, 1, 1, 2, 2),
         (4, 4, 6, 6, 1, 1, 1, 1), (7, 7, 7, 7, 7, 7, 3, 3), (2, 9, 1, 3, 1, 2, 0, 1),
         (8, 8, 4, 4, 3, 3, 2, 2), (3, 3, 4, 4, 1, 1, 0, 0), (10, 10, 3, 3, 4, 4, 1, 1),
         (5, 5, 3, 3, 1, 1, 2, 0), (5, 5, 3, 3, 1, 1, 0, 2), (1, 9, 3, 3, 1, 1, 1, 1)]
outs = []
for (h, w, kh, kw, sh, sw, ph, pw) in cases:
    try:
        y = F.max_pool2d(torch.zeros(1, 1, h, w), (kh, kw), (sh, sw), (ph, pw))
        outs.append((y.shape[2], y.shape[3]))
    except RuntimeError:
        outs.append((-1, -1))
put("shape_cases", cases, np.int32)
put("shape_out", outs, np.int32)

# ---- cross-entropy --------------------------------------------------------------------------
logits = (torch.randn(16, 10) * 4.0).requires_grad_()
labels = torch.randint(0, 10, (16,))
loss = F.cross_entropy(logits, labels)
(dl,) = torch.autograd.grad(loss, [logits])
(dl_scaled,) = torch.autograd.grad(F.cross_entropy(logits, labels) * 2.5, [logits])
put("ce_logits", logits.detach())
put("ce_labels", labels, np.int32)
put("ce_loss", loss.detach().reshape(1))
put("ce_probs", torch.softmax(logits.detach(), dim=1))
put("ce_dlogits", dl)
put("ce_dlogits_scaled", dl_scaled)

# ---- relu6 (last: the draws above are unchanged by it) ---------------------------------------
x = torch.randn(2, 4, 5, 5) * 4.5
x.view(-1)[::9] = 0.0
x.view(-1)[4::11] = 6.0
x.requires_grad_()
unary_grad("relu6", x, F.relu6)

tmp = OUT + ".tmp"
with h5py.File(tmp, "w") as f:
    f.attrs["generator"] = b"tests/ref/make_ref_cpu_ops.py"
    f.attrs["torch_version"] = str(torch.__version__).encode()
    for name in sorted(data):
        f.create_dataset(name, data=data[name])
os.replace(tmp, OUT)
print("wrote %s (%d datasets, %d bytes)" % (OUT, len(data), os.path.getsize(OUT)))
