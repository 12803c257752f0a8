#!/usr/bin/env python3
"""Exactness of the ONNX QDQ export (onnx/export.c): for each exported case, runs the ONNX model
with a small numpy evaluator of the ONNX ops the export writes (written from the ONNX operator
definitions, opset 13), and the Q/DQ graph file it came from with tests/qdq/read_qdq.py's numpy
reference interpreter (written from docs/qdq_format.md), on the same images, and compares.

    check_onnx_export.py READ_QDQ_PY STEM...     # STEM.onnx, STEM_qdq.h5, STEM_io.h5 (/input NHWC, /output)

Both accumulate Conv/Gemm in float64 and round to float32 after, so they differ only where the
two definitions differ: QuantizeLinear computes x / s, the Q/DQ graph x * (1/s) (a rounding flip
on rare inputs), and the Clip the export puts before a sub-8-bit QuantizeLinear. Passes when
every output is within 1 LSB of the final dequantize's scale and top-1 is the same on every
image; also compares with the C executor's output (/output) within read_qdq.py's 2 LSB (8 where the
logits read the class token alone: MAX_LSB_C_ONE_TOKEN).
Needs numpy, h5py and onnx (the test environment, .venv, which scripts/setup.sh makes): a missing
module is a failure, not a skip. The evaluator is this file's own, independent of onnx.reference."""
import importlib.util
import math
import os
import sys

try:
    import h5py
    import numpy as np
    import onnx
    from onnx import numpy_helper
except ImportError as e:
    print(f"check_onnx_export.py: {e}: run with the test environment's python (.venv/bin/python; scripts/setup.sh makes it)")
    sys.exit(1)

MAX_LSB = 1.0      # ONNX evaluator vs read_qdq.py's interpreter, in final-dequantize LSB
SLACK = 1e-3       # two adjacent dequantized levels are 1 LSB apart only up to their float32 rounding
MAX_LSB_C = 2.0    # ONNX evaluator vs the C executor (read_qdq.py's tolerance: float32 accumulation order)
# A model whose logits read the class token alone (its graph has a first_token node: torchvision's
# and timm's ViTs) passes one rounding tie of an attention's float32 output (oneDNN's sgemm in the
# C executor, float64 here) at its quantize to the logits undiluted by a mean over tokens: at W8A8
# 3 LSB on 1.2% of the outputs (mha_vit_cls) and 6 LSB on 0.7% (mha_timm), found by dumping every
# quantize's input for the worst image: at most 4e-7 apart up to the first attention's output
# quantize, 1.5e-3 after the projection that reads it. ONNX vs read_qdq.py stays at 0 LSB.
MAX_LSB_C_ONE_TOKEN = 8.0


# ---- a numpy evaluator of the ONNX ops the export writes (opset 13) ------------------------

def attrs(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def per_axis(p, x, axis):
    """A scale / zero point: scalar, or 1-D along `axis` of x."""
    if p.ndim == 0:
        return p
    shape = [1] * x.ndim
    shape[axis] = p.size
    return p.reshape(shape)


def quantize_linear(x, scale, zp, axis=1):
    """y = saturate(round_half_even(x / y_scale) + y_zero_point), saturating to zp's type."""
    s = per_axis(scale, x, axis).astype(np.float32)
    z = per_axis(zp, x, axis)
    info = np.iinfo(zp.dtype)
    q = np.rint((x.astype(np.float32) / s).astype(np.float32)).astype(np.float64) + z.astype(np.float64)
    return np.clip(q, info.min, info.max).astype(zp.dtype)


def dequantize_linear(q, scale, zp, axis=1):
    """y = (x - x_zero_point) * x_scale, in float32."""
    s = per_axis(scale, q, axis).astype(np.float32)
    z = per_axis(zp, q, axis)
    return ((q.astype(np.int32) - z.astype(np.int32)).astype(np.float32) * s).astype(np.float32)


def windows(x, kh, kw, sh, sw, pads, fill):
    """NCHW x -> (N, C, OH, OW, KH, KW) after padding (top, left, bottom, right) with fill."""
    t, l, b, r = pads
    x = np.pad(x, ((0, 0), (0, 0), (t, b), (l, r)), constant_values=fill)
    v = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(2, 3))
    return v[:, :, ::sh, ::sw]


def window_attrs(a, w_shape=None):
    k = list(a.get("kernel_shape", w_shape[2:] if w_shape is not None else None))
    s = list(a.get("strides", [1, 1]))
    p = list(a.get("pads", [0, 0, 0, 0]))
    assert list(a.get("dilations", [1, 1])) == [1, 1], "dilations other than 1"
    assert a.get("auto_pad", b"NOTSET") in (b"NOTSET", "NOTSET"), "auto_pad"
    return k, s, (p[0], p[1], p[2], p[3])


def ceil_pads(a, x_shape):
    """MaxPool's pads, with ceil_mode's overhang added at the bottom and right (PyTorch's and ONNX's
    output size: the last window starts inside the input or its top/left padding)."""
    (kh, kw), (sh, sw), (t, l, b, r) = window_attrs(a)
    if not a.get("ceil_mode", 0):
        return (t, l, b, r)
    over = []
    for n, k, s, p0, p1 in ((x_shape[2], kh, sh, t, b), (x_shape[3], kw, sw, l, r)):
        o = -(-(n + p0 + p1 - k) // s) + 1
        if (o - 1) * s >= n + p0:
            o -= 1
        over.append(max(0, (o - 1) * s + k - (n + p0 + p1)))
    return (t, l, b + over[0], r + over[1])


def conv(x, w, b, a):
    (kh, kw), (sh, sw), pads = window_attrs(a, w.shape)
    G = a.get("group", 1)
    win = windows(x.astype(np.float64), kh, kw, sh, sw, pads, 0.0)  # (N, C, OH, OW, KH, KW)
    OC, cg = w.shape[0], w.shape[1]
    og = OC // G
    parts = [np.einsum("nchwij,ocij->nohw", win[:, g * cg:(g + 1) * cg], w[g * og:(g + 1) * og].astype(np.float64),
                       optimize=True) for g in range(G)]
    y = np.concatenate(parts, axis=1)
    if b is not None:
        y = y + b.reshape(1, -1, 1, 1)
    return y.astype(np.float32)


def gemm(A, B, C, a):
    A = A.astype(np.float64)
    B = B.astype(np.float64)
    if a.get("transA", 0):
        A = A.T
    if a.get("transB", 0):
        B = B.T
    y = a.get("alpha", 1.0) * (A @ B)
    if C is not None:
        y = y + a.get("beta", 1.0) * C
    return y.astype(np.float32)


def resize(x, scales, a):
    """ONNX Resize of the spatial axes of NCHW x by scales (nearest with asymmetric coordinates
    and floor, or linear with half_pixel / pytorch_half_pixel, source clamped to the edges)."""
    mode = a.get("mode", b"nearest").decode()
    ct = a.get("coordinate_transformation_mode", b"half_pixel").decode()
    v = x.astype(np.float64)
    for ax in (2, 3):
        n_in, s = v.shape[ax], float(scales[ax])
        n_out = int(math.floor(n_in * s))
        o = np.arange(n_out, dtype=np.float64)
        if ct == "asymmetric":
            src = o / s
        elif ct in ("half_pixel", "pytorch_half_pixel"):
            src = (o + 0.5) / s - 0.5
        else:
            raise SystemExit("Resize: coordinate_transformation_mode %s unknown to this evaluator" % ct)
        if mode == "nearest":
            if a.get("nearest_mode", b"round_prefer_floor").decode() != "floor":
                raise SystemExit("Resize: only nearest_mode floor in this evaluator")
            v = np.take(v, np.clip(np.floor(src).astype(np.int64), 0, n_in - 1), axis=ax)
            continue
        src = np.clip(src, 0.0, n_in - 1)
        i0 = np.floor(src).astype(np.int64)
        i1 = np.minimum(i0 + 1, n_in - 1)
        shape = [1, 1, 1, 1]
        shape[ax] = n_out
        l1 = (src - i0).reshape(shape)
        v = np.take(v, i0, axis=ax) * (1.0 - l1) + np.take(v, i1, axis=ax) * l1
    return v.astype(np.float32)


def run_onnx(model, x):
    env = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    env[model.graph.input[0].name] = x
    for node in model.graph.node:
        a = attrs(node)
        ins = [env[i] if i else None for i in node.input]
        op = node.op_type
        if op == "QuantizeLinear":
            y = quantize_linear(ins[0], ins[1], ins[2], a.get("axis", 1))
        elif op == "DequantizeLinear":
            y = dequantize_linear(ins[0], ins[1], ins[2], a.get("axis", 1))
        elif op == "Conv":
            y = conv(ins[0], ins[1], ins[2] if len(ins) > 2 else None, a)
        elif op == "Gemm":
            y = gemm(ins[0], ins[1], ins[2] if len(ins) > 2 else None, a)
        elif op == "Relu":
            y = np.maximum(ins[0], np.float32(0))
        elif op == "Clip":
            lo = ins[1] if len(ins) > 1 and ins[1] is not None else np.float32(-np.inf)
            hi = ins[2] if len(ins) > 2 and ins[2] is not None else np.float32(np.inf)
            y = np.minimum(np.maximum(ins[0], lo), hi).astype(ins[0].dtype)  # float, or the integers' type
        elif op == "MaxPool":
            (kh, kw), (sh, sw), _ = window_attrs(a)
            pads = ceil_pads(a, ins[0].shape)
            t = ins[0].dtype  # float32, or the integers of a quantized tensor
            fill = -np.inf if t == np.float32 else np.iinfo(t).min
            y = windows(ins[0], kh, kw, sh, sw, pads, fill).max(axis=(4, 5)).astype(t)
        elif op == "AveragePool":
            (kh, kw), (sh, sw), pads = window_attrs(a)
            assert a.get("ceil_mode", 0) == 0, "AveragePool ceil_mode"
            assert a.get("count_include_pad", 0) == 1 or pads == (0, 0, 0, 0)
            y = (windows(ins[0].astype(np.float64), kh, kw, sh, sw, pads, 0.0).sum(axis=(4, 5)) / (kh * kw))
            y = y.astype(np.float32)
        elif op == "GlobalAveragePool":
            y = ins[0].astype(np.float64).mean(axis=(2, 3), keepdims=True).astype(np.float32)
        elif op == "Flatten":
            ax = a.get("axis", 1)
            y = ins[0].reshape(int(np.prod(ins[0].shape[:ax])), -1)
        elif op == "Reshape":
            assert a.get("allowzero", 0) == 0, "allowzero"
            shape = [ins[0].shape[i] if d == 0 else int(d) for i, d in enumerate(ins[1])]  # 0: copy the dim
            y = ins[0].reshape(shape)
        elif op == "Add":
            y = (ins[0].astype(np.float64) + ins[1]).astype(np.float32)
        elif op == "Sigmoid":
            y = (1.0 / (1.0 + np.exp(-ins[0].astype(np.float64)))).astype(np.float32)
        elif op == "Tanh":
            y = np.tanh(ins[0].astype(np.float64)).astype(np.float32)
        elif op == "HardSigmoid":
            al, be = a.get("alpha", 0.2), a.get("beta", 0.5)
            y = np.clip(np.float32(al) * ins[0] + np.float32(be), 0, 1).astype(np.float32)
        elif op == "LeakyRelu":
            y = np.where(ins[0] >= 0, ins[0], ins[0] * np.float32(a.get("alpha", 0.01))).astype(np.float32)
        elif op == "Resize":
            y = resize(ins[0], ins[2], a)
        elif op == "PRelu":  # the slope broadcast as ONNX does ([C, 1, 1] over NCHW, [F] or [1])
            y = np.where(ins[0] > 0, ins[0], ins[0] * ins[1].astype(np.float32)).astype(np.float32)
        elif op == "Elu":
            v = ins[0].astype(np.float64)
            y = np.where(v < 0, a.get("alpha", 1.0) * (np.exp(np.minimum(v, 0.0)) - 1.0), v).astype(np.float32)
        elif op == "Erf":
            y = np.vectorize(math.erf)(ins[0].astype(np.float64)).astype(np.float32)
        elif op == "Mul":
            y = (ins[0].astype(np.float64) * ins[1]).astype(np.float32)
        elif op == "Div":
            y = (ins[0].astype(np.float64) / ins[1]).astype(np.float32)
        elif op == "Transpose":
            y = np.ascontiguousarray(np.transpose(ins[0], a["perm"]))
        elif op == "Sub":
            y = (ins[0].astype(np.float64) - ins[1]).astype(np.float32)
        elif op == "Sqrt":
            y = np.sqrt(ins[0].astype(np.float64)).astype(np.float32)
        elif op == "ReduceMean":  # opset 13: axes as an attribute
            y = ins[0].astype(np.float64).mean(axis=tuple(a["axes"]), keepdims=bool(a.get("keepdims", 1)))
            y = y.astype(np.float32)
        elif op == "MatMul":
            y = np.matmul(ins[0].astype(np.float64), ins[1]).astype(np.float32)
        elif op == "Softmax":  # opset 13: along one axis
            v = ins[0].astype(np.float64)
            e = np.exp(v - v.max(axis=a.get("axis", -1), keepdims=True))
            y = (e / e.sum(axis=a.get("axis", -1), keepdims=True)).astype(np.float32)
        elif op == "Slice":  # starts, ends, axes; steps 1
            assert len(ins) == 4 or (len(ins) == 5 and ins[4] is None), "Slice steps"
            sl = [slice(None)] * ins[0].ndim
            for b, e, ax in zip(ins[1], ins[2], ins[3]):
                sl[int(ax)] = slice(int(b), int(e))
            y = ins[0][tuple(sl)]
        elif op == "Concat":
            y = np.concatenate(ins, axis=a["axis"])
        elif op == "Shape":  # opset 13: the whole shape
            y = np.array(ins[0].shape, dtype=np.int64)
        elif op == "Gather":
            y = np.take(ins[0], ins[1], axis=a.get("axis", 0))
        elif op == "Expand":  # ONNX's broadcast of the input and the shape
            y = ins[0] * np.ones([int(d) for d in ins[1]], dtype=ins[0].dtype)
        elif op == "BatchNormalization":
            xx, g, b, m, v = ins
            sh = (1, -1) + (1,) * (xx.ndim - 2)
            y = ((xx - m.reshape(sh)) / np.sqrt(v.reshape(sh).astype(np.float64) + a.get("epsilon", 1e-5))
                 * g.reshape(sh) + b.reshape(sh)).astype(np.float32)
        else:
            raise SystemExit(f"node '{node.name}': op {op} unknown to this evaluator")
        env[node.output[0]] = y
    return env[model.graph.output[0].name]


# ---- the comparison ------------------------------------------------------------------------

def load_read_qdq(path):
    spec = importlib.util.spec_from_file_location("read_qdq", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def check(rq, stem):
    model = onnx.load(stem + ".onnx")
    f, nodes, values, tensors, quant = rq.load(stem + "_qdq.h5")
    with h5py.File(stem + "_io.h5", "r") as io:
        x, c_out = io["input"][...], io["output"][...]
    want = rq.run(nodes, values, tensors, quant, x, int(f.attrs["output"])).reshape(c_out.shape)
    got = run_onnx(model, np.ascontiguousarray(x.transpose(0, 3, 1, 2))).reshape(c_out.shape)
    last = nodes[int(f["values/producer"][int(f.attrs["output"])])]
    if last["op"] != "dequantize":
        print(f"{stem}: the output is not a dequantize; this test measures in output LSB")
        return False
    lsb = float(quant[("activation", last["name"])]["scale"].max())
    d = np.abs(got.astype(np.float64) - want) / lsb
    dc = np.abs(got.astype(np.float64) - c_out) / lsb
    top = got.argmax(axis=1) == want.argmax(axis=1)
    topc = got.argmax(axis=1) == c_out.argmax(axis=1)
    max_c = MAX_LSB_C_ONE_TOKEN if any(n["op"] == "first_token" for n in nodes) else MAX_LSB_C
    ok = d.max() <= MAX_LSB + SLACK and top.all() and dc.max() <= max_c + SLACK
    print(f"{stem}: {x.shape[0]} images, ONNX vs read_qdq.py: max {d.max():.2f} LSB (scale {lsb:.6g}), "
          f"{100 * (d > 0).mean():.3f}% of outputs differ, top-1 equal on {100 * top.mean():.2f}%; "
          f"ONNX vs C executor: max {dc.max():.2f} LSB, {100 * (dc > 0).mean():.3f}% differ, top-1 equal on "
          f"{100 * topc.mean():.2f}%: {'ok' if ok else 'FAIL'}")
    if not ok:
        bad = np.argwhere(d > MAX_LSB + SLACK)[:5]
        for i, j in bad:
            print(f"  image {i} output {j}: ONNX {got[i, j]:.6g}, read_qdq {want[i, j]:.6g}")
    return ok


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    rq = load_read_qdq(sys.argv[1])
    ok = True
    for stem in sys.argv[2:]:
        for suffix in (".onnx", "_qdq.h5", "_io.h5"):
            if not os.path.exists(stem + suffix):
                print(f"{stem}{suffix} is missing (written by test_onnx_export_checker)")
                return 1
        ok = check(rq, stem) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
