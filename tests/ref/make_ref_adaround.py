#!/usr/bin/python3
"""Writes tests/ref/adaround.h5: PyTorch 1.13 (Debian python3-torch) statements of AdaRound's
formulas (Nagel et al., 2020), as tests/qat/test_adaround.c checks autograd/ops_adaround.c:

  h(v)   = clamp(sigmoid(v) * (zeta - gamma) + gamma, 0, 1), zeta = 1.1, gamma = -0.1
  w~(v)  = (clamp(floor(w / s) + h(v) + zp, qmin, qmax) - zp) * s       per channel (axis 0)
  R(v)   = lambda * sum(1 - |2 h(v) - 1|^beta)
  E(x)   = sum((x - t)^2) / divisor

Views follow quant/quant.h: (outer, channels, inner) with the channel axis in the middle; meta
rows are int32 [outer, channels, inner, quant_min, quant_max].

  ar_count             cases; for each case i:
  ar<i>_meta, ar<i>_scale (C), ar<i>_zp (C, int32), ar<i>_w    the weight and its qparams
  ar<i>_v              v: the AdaRound start -log((zeta - gamma) / (r - gamma) - 1) for
                       r = w / s - floor(w / s) (ar<i>_v_init), plus for half the elements a
                       normal step of std 3 (so h reaches its clamps at 0 and 1)
  ar<i>_v_init         the start itself
  ar<i>_h, ar<i>_dh    h(v) and dh/dv (autograd of h.sum())
  ar<i>_wsoft          w~(v); ar<i>_dv_w = dE/dv for E = sum((w~(v) - w)^2) / n (n elements):
                       w~'s backward composed with the squared error's
  ar<i>_rl             (B,) R(v) for lambda 0.01 and each beta of ar_betas; ar<i>_drl (B, n) its
                       gradient
  se_x, se_t, se_div (1), se_loss (1), se_dx   E and dE/dx

Run: /usr/bin/python3 tests/ref/make_ref_adaround.py   (deterministic: fixed seeds)
"""
import os

import numpy as np
import torch

import ref_h5

torch.manual_seed(4321)
torch.set_num_threads(1)
rng = np.random.default_rng(4321)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "adaround.h5")
ZETA, GAMMA = 1.1, -0.1
LAMBDA = 0.01
BETAS = [20.0, 8.0, 2.0]
data = {}
F32 = np.float32


def put(name, arr, dtype=np.float32):
    ref_h5.put(data, name, arr, dtype)


def h_of(v):
    return torch.clamp(torch.sigmoid(v) * (ZETA - GAMMA) + GAMMA, 0, 1)


# (outer, channels, inner, qmin, qmax, symmetric)
cases = [
    (1, 6, 27, -8, 7, True),     # 4-bit per-channel OIHW conv weight
    (1, 1, 200, 0, 15, False),   # 4-bit unsigned affine per tensor
    (1, 5, 40, -2, 1, True),     # 2-bit per-channel linear weight
    (1, 4, 9, -128, 127, True),  # 8-bit
]
put("ar_count", [len(cases)], np.int32)
put("ar_betas", BETAS)
for i, (outer, C, inner, qmin, qmax, sym) in enumerate(cases):
    n = outer * C * inner
    scale = (rng.uniform(0.01, 0.2, C)).astype(F32)
    zp = np.zeros(C, np.int32) if sym else rng.integers(qmin + 2, qmax - 2, C).astype(np.int32)
    # weights spanning the channel's range and a little beyond (clamped at the ends)
    w = np.empty((outer, C, inner), F32)
    for c in range(C):
        lo, hi = (qmin - zp[c] - 1.0) * scale[c], (qmax - zp[c] + 1.0) * scale[c]
        w[:, c, :] = rng.uniform(lo, hi, (outer, inner)).astype(F32)
    w = w.reshape(-1)
    st = torch.from_numpy(scale).view(1, C, 1)
    zt = torch.from_numpy(zp.astype(np.float32)).view(1, C, 1)
    wt = torch.from_numpy(w).view(outer, C, inner)
    wf = torch.floor(wt / st)
    rest = wt / st - wf
    v_init = -torch.log((ZETA - GAMMA) / (rest - GAMMA) - 1)
    step = torch.from_numpy((rng.standard_normal(n) * 3).astype(F32)).view(outer, C, inner)
    mask = torch.from_numpy(rng.random(n) < 0.5).view(outer, C, inner)
    v = torch.where(mask, v_init + step, v_init).detach().requires_grad_(True)

    h = h_of(v)
    (dh,) = torch.autograd.grad(h.sum(), v, retain_graph=True)
    wsoft = (torch.clamp(wf + h + zt, qmin, qmax) - zt) * st
    (dv_w,) = torch.autograd.grad(((wsoft - wt) ** 2).sum() / n, v)
    rl, drl = [], []
    for beta in BETAS:
        r = LAMBDA * (1 - (2 * h_of(v) - 1).abs().pow(beta)).sum()
        (g,) = torch.autograd.grad(r, v)
        rl.append(r.item())
        drl.append(g.reshape(-1).numpy())
    put("ar%d_meta" % i, [outer, C, inner, qmin, qmax], np.int32)
    put("ar%d_scale" % i, scale)
    put("ar%d_zp" % i, zp, np.int32)
    put("ar%d_w" % i, w)
    put("ar%d_v" % i, v.reshape(-1))
    put("ar%d_v_init" % i, v_init.reshape(-1))
    put("ar%d_h" % i, h.reshape(-1))
    put("ar%d_dh" % i, dh.reshape(-1))
    put("ar%d_wsoft" % i, wsoft.reshape(-1))
    put("ar%d_dv_w" % i, dv_w.reshape(-1))
    put("ar%d_rl" % i, rl)
    put("ar%d_drl" % i, np.stack(drl))

# the squared error: 2 x 3 x 3 x 4 activations, divisor = numel / channels
x = torch.from_numpy(rng.standard_normal((2, 3, 3, 4)).astype(F32)).requires_grad_(True)
t = torch.from_numpy(rng.standard_normal((2, 3, 3, 4)).astype(F32))
div = x.numel() / 4
loss = ((x - t) ** 2).sum() / div
(dx,) = torch.autograd.grad(loss, x)
put("se_x", x.reshape(-1))
put("se_t", t.reshape(-1))
put("se_div", [div], np.float64)
put("se_loss", [loss.item()])
put("se_dx", dx.reshape(-1))

ref_h5.write(OUT, data, "tests/ref/make_ref_adaround.py", torch.__version__)
