#!/usr/bin/python3
"""Writes tests/ref/conv_linear.h5: PyTorch 1.13 references for the conv2d and linear kernels.

Run with Debian's interpreter (python3-torch, python3-h5py):
    /usr/bin/python3 tests/ref/make_ref_conv_linear.py

Per conv config, group convN holds: config (int32: N H W C OC KH KW stride_h stride_w pad_h
pad_w groups has_bias), inp (N,H,W,C), weight (OC, C/groups, KH, KW), bias (OC) when
has_bias, out (N,OH,OW,OC), dout (N,OH,OW,OC), dinp, dweight, dbias (when has_bias).
Activations are stored NHWC (torch's NCHW permuted with .permute(0,2,3,1)).
Group linear0 holds config (int32: N IN OUT), inp (N,IN), weight (OUT,IN), bias, out, dout,
dinp, dweight, dbias. All float32, computed by torch in float32 on the CPU.
"""
import os

import h5py
import torch

torch.manual_seed(0)
torch.set_num_threads(1)

OUT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conv_linear.h5")

# N, H, W, C, OC, KH, KW, stride_h, stride_w, pad_h, pad_w, groups, has_bias
CONV_CONFIGS = [
    (2, 7, 6, 3, 4, 3, 3, 1, 1, 1, 1, 1, 1),  # plain 3x3, bias
    (2, 9, 8, 4, 6, 3, 3, 2, 2, 1, 1, 2, 1),  # strided and grouped, bias
    (3, 8, 8, 1, 8, 3, 3, 1, 1, 1, 1, 1, 0),  # first-layer type: C=1, no bias
]
LINEAR_CONFIG = (4, 20, 7)  # N, IN, OUT


def nhwc(t):
    return t.permute(0, 2, 3, 1).contiguous()


def write_conv(f, name, cfg):
    n, h, w, c, oc, kh, kw, sh, sw, ph, pw, groups, has_bias = cfg
    x = torch.empty(n, c, h, w).uniform_(-1, 1).requires_grad_()
    weight = torch.empty(oc, c // groups, kh, kw).uniform_(-1, 1).requires_grad_()
    bias = torch.empty(oc).uniform_(-1, 1).requires_grad_() if has_bias else None
    y = torch.nn.functional.conv2d(x, weight, bias, stride=(sh, sw), padding=(ph, pw), groups=groups)
    dy = torch.empty_like(y).uniform_(-1, 1)
    y.backward(dy)
    g = f.create_group(name)
    g["config"] = torch.tensor(cfg, dtype=torch.int32).numpy()
    g["inp"] = nhwc(x.detach()).numpy()
    g["weight"] = weight.detach().numpy()
    g["out"] = nhwc(y.detach()).numpy()
    g["dout"] = nhwc(dy).numpy()
    g["dinp"] = nhwc(x.grad).numpy()
    g["dweight"] = weight.grad.numpy()
    if has_bias:
        g["bias"] = bias.detach().numpy()
        g["dbias"] = bias.grad.numpy()


def write_linear(f, name, cfg):
    n, d_in, d_out = cfg
    x = torch.empty(n, d_in).uniform_(-1, 1).requires_grad_()
    weight = torch.empty(d_out, d_in).uniform_(-1, 1).requires_grad_()
    bias = torch.empty(d_out).uniform_(-1, 1).requires_grad_()
    y = torch.nn.functional.linear(x, weight, bias)
    dy = torch.empty_like(y).uniform_(-1, 1)
    y.backward(dy)
    g = f.create_group(name)
    g["config"] = torch.tensor(cfg, dtype=torch.int32).numpy()
    g["inp"] = x.detach().numpy()
    g["weight"] = weight.detach().numpy()
    g["bias"] = bias.detach().numpy()
    g["out"] = y.detach().numpy()
    g["dout"] = dy.numpy()
    g["dinp"] = x.grad.numpy()
    g["dweight"] = weight.grad.numpy()
    g["dbias"] = bias.grad.numpy()


def main():
    with h5py.File(OUT_PATH, "w") as f:
        f.attrs["generator"] = "tests/ref/make_ref_conv_linear.py, torch " + torch.__version__
        for i, cfg in enumerate(CONV_CONFIGS):
            write_conv(f, "conv%d" % i, cfg)
        write_linear(f, "linear0", LINEAR_CONFIG)
    print("wrote %s (%d bytes)" % (OUT_PATH, os.path.getsize(OUT_PATH)))


if __name__ == "__main__":
    main()
