#!/usr/bin/python3
"""Reads a Q/DQ graph file (docs/qdq_format.md) with h5py alone, as another tool would, and
prints the node list and every quantization point. Both kinds of file: `qdq` (convert graphs)
and `prepared` (eval-mode training graphs: fake_quant, conv_bn, fake-quantized float weights).

    read_qdq.py model_qdq.h5                 # node list + quantization points
    read_qdq.py model_qdq.h5 --io io.h5      # also run the reference interpreter below on
                                             # io.h5:/input (N,H,W,C) and compare with /output;
                                             # when the model file describes its input
                                             # preprocessing and io.h5 has /raw (uint8 pixels),
                                             # the input is computed from /raw with it and must
                                             # equal /input exactly

The interpreter is a plain numpy reading of the format document (NHWC activations, OIHW
weights, q = clamp(round_half_even(x * (1/scale)) + zp, qmin, qmax), x = (q - zp) * scale;
fake_quant = dequantize(quantize(x)); conv_bn = conv(x, fq(W * sf)) / sf + b, then batch norm
with the running statistics, sf = gamma / sqrt(running_var + eps) in float32; an int32 bias
(weight record attribute bias = "int32") computes with bias_int * (s_x * s_w[c]), or in a
prepared graph with the bias fake-quantized at that scale, conv_bn's folded bias included).
It accumulates in float64, so it may differ from the C executor (float32, oneDNN) by a
rounding flip at a quantization point; --max-lsb bounds the output difference in units of the
last dequantize's scale. Exit status: 0 ok, 1 mismatch or malformed file, 77 when h5py is
missing (CTest's skip code)."""
import argparse
import math
import sys

try:
    import h5py
    import numpy as np
except ImportError as e:  # pragma: no cover
    print(f"read_qdq.py: skipped: {e}", file=sys.stderr)
    sys.exit(77)

FORMAT = "qt-qdq-graph"


def text(v):
    """Attribute strings come back as bytes (fixed-length) or str (variable-length)."""
    return v.decode() if isinstance(v, (bytes, np.bytes_)) else str(v)


def load(path):
    f = h5py.File(path, "r")
    if text(f.attrs.get("format", b"")) != FORMAT:
        raise SystemExit(f"{path}: format attribute is not '{FORMAT}'")
    if int(f.attrs["format_version"]) != 1:
        raise SystemExit(f"{path}: format version {int(f.attrs['format_version'])}, this reader knows 1")
    graph_kind = text(f.attrs.get("kind", b"qdq"))  # absent in files from before prepared graphs
    if graph_kind not in ("qdq", "prepared"):
        raise SystemExit(f"{path}: kind '{graph_kind}', this reader knows 'qdq' and 'prepared'")
    nodes = []
    for key in f["nodes"]:  # "<index>_<name>"; sort by the index, not the text
        g = f["nodes"][key]
        a = {k: (text(v) if isinstance(v, (bytes, np.bytes_, str)) else v) for k, v in g.attrs.items()}
        a["inputs"] = [int(i) for i in np.atleast_1d(g.attrs["inputs"])]
        nodes.append(a)
    nodes.sort(key=lambda a: int(a["index"]))
    values = {
        "name": [text(n) for n in f["values/name"][:]],
        "ndim": f["values/ndim"][:],
        "shape": f["values/shape"][:],
    }
    tensors = {name: ds[...] for name, ds in f["tensors"].items()}
    quant = {}
    for kind in ("activation", "weight"):
        for name, g in f["quant"][kind].items():
            r = {k: (text(v) if isinstance(v, (bytes, np.bytes_, str)) else v) for k, v in g.attrs.items()}
            r["scale"] = g["scale"][:].astype(np.float32)
            r["zero_point"] = g["zero_point"][:].astype(np.int64)
            if kind == "weight" and "weight_int" in g:  # prepared graphs: qparams only
                r["weight_int"] = g["weight_int"][...]
            if kind == "weight" and "bias_int" in g:  # int32 biases (attribute bias = "int32")
                r["bias_int"] = g["bias_int"][...]
            quant[(kind, name)] = r
    pre = None  # optional: how raw pixels become the input (absent in older files)
    if "input_preprocessing" in f:
        g = f["input_preprocessing"]
        pre = {"layout": text(g.attrs["layout"]), "shape": tuple(int(d) for d in g.attrs["shape"]),
               "raw_min": float(g.attrs["raw_min"]), "raw_max": float(g.attrs["raw_max"]),
               "divisor": np.float32(g.attrs["divisor"]),
               "mean": np.asarray(g.attrs["mean"], dtype=np.float32),
               "std": np.asarray(g.attrs["std"], dtype=np.float32)}
        inp = int(f.attrs["input"])
        want = tuple(int(d) for d in f["values/shape"][inp][: f["values/ndim"][inp]])
        if pre["layout"] != "NHWC" or pre["shape"] != want or len(pre["mean"]) != want[-1] or len(pre["std"]) != want[-1]:
            raise SystemExit(f"{path}: input_preprocessing does not describe the input {want} (NHWC)")
    values["input_preprocessing"] = pre
    ops = {a["op"] for a in nodes}
    wrong = ops & ({"fake_quant", "conv_bn"} if graph_kind == "qdq" else {"quantize", "dequantize"})
    if wrong:
        raise SystemExit(f"{path}: kind '{graph_kind}' holds op(s) {sorted(wrong)}")
    return f, nodes, values, tensors, quant


def value_shape(values, v):
    return tuple(int(d) for d in values["shape"][v][: values["ndim"][v]])


def describe(path, f, nodes, values, tensors, quant):
    print(f"{path}: {text(f.attrs.get('kind', b'qdq'))} graph '{text(f.attrs['name'])}', {len(nodes)} nodes, "
          f"{len(tensors)} tensors, "
          f"input value {int(f.attrs['input'])}, output value {int(f.attrs['output'])}")
    pre = values["input_preprocessing"]
    if pre is not None:
        print(f"  input preprocessing: {pre['layout']} {pre['shape']}, raw [{pre['raw_min']:g}, {pre['raw_max']:g}], "
              f"x = (raw / {float(pre['divisor']):g} - mean) / std, mean {pre['mean'].tolist()}, "
              f"std {pre['std'].tolist()}")
    for a in nodes:
        op = a["op"]
        extra = []
        if op in ("conv2d", "conv_bn"):
            extra.append(f"k{a['kernel_h']}x{a['kernel_w']} s{a['stride_h']}x{a['stride_w']} "
                         f"p{a['pad_h']}x{a['pad_w']} g{a['groups']} oc{a['out_channels']}")
        elif op in ("max_pool2d", "avg_pool2d"):
            extra.append(f"k{a['kernel_h']} s{a['stride_h']} p{a['pad_h']}")
        elif op == "linear":
            extra.append(f"out{a['out_channels']}")
        if op in ("batch_norm", "conv_bn"):
            extra.append(f"eps {float(a['eps']):g}" + (" frozen" if int(a["bn_frozen"]) else ""))
        for slot in ("weight", "bias", "bn_weight", "bn_bias", "running_mean", "running_var"):
            if slot in a:
                extra.append(f"{slot}={a[slot]}{tuple(tensors[a[slot]].shape)}")
        if ("weight", a["name"]) in quant:
            extra.append("int weights" if "weight_int" in quant[("weight", a["name"])] else "fake-quant weights")
        ins = ",".join(str(i) for i in a["inputs"])
        print(f"  {int(a['index']):3d} {op:15s} {a['name']:22s} [{ins}] -> {int(a['output'])} "
              f"{value_shape(values, int(a['output']))}  {' '.join(extra)}")
    print("quantization points:")
    for (kind, name), r in sorted(quant.items(), key=lambda kv: int(kv[1]["node"])):
        mode = f"per-channel axis {int(r['axis'])}" if int(r["per_channel"]) else "per-tensor"
        sign = "signed" if int(r["signed"]) else "unsigned"
        sym = "symmetric" if int(r["symmetric"]) else "affine"
        s, z = r["scale"], r["zero_point"]
        sc = f"scale {s[0]:.6g}" if len(s) == 1 else f"scale [{s.min():.6g} .. {s.max():.6g}] x{len(s)}"
        zp = f"zp {z[0]}" if len(z) == 1 else f"zp [{z.min()} .. {z.max()}]"
        line = (f"  {kind:10s} {name:22s} node {int(r['node']):3d}: {int(r['bits'])}-bit {sign} {sym} {mode}, "
                f"[{int(r['qmin'])}, {int(r['qmax'])}], {sc}, {zp}")
        if "weight_int" in r:
            w = r["weight_int"]
            line += f", weight_int {w.dtype} {tuple(w.shape)} in [{w.min()}, {w.max()}] of '{r['tensor']}'"
        if r.get("bias", "float") == "int32":
            b = r.get("bias_int")
            line += ", bias int32" + (f" in [{b.min()}, {b.max()}]" if b is not None else " (fake-quantized)")
        print(line)


# ---- reference interpreter ----------------------------------------------------------------

def quantize(x, r):
    """q = clamp(round_half_even(x * (1/scale)) + zp, qmin, qmax), per channel on the last axis."""
    inv = (np.float32(1.0) / r["scale"]).astype(np.float32)
    q = np.rint(x.astype(np.float32) * inv).astype(np.float32) + r["zero_point"].astype(np.float32)
    q = np.where(np.isnan(q) | (q >= np.float32(2.0**63)), -np.inf, q)  # PyTorch: -> INT64_MIN -> qmin
    return np.clip(q, int(r["qmin"]), int(r["qmax"])).astype(np.int32)


def dequantize(q, r):
    return ((q.astype(np.int64) - r["zero_point"]).astype(np.float32) * r["scale"]).astype(np.float32)


def fake_quant_weight(w, r):
    """dequantize(quantize(w)) per channel along axis 0 (or per tensor), all in float32."""
    bshape = (-1,) + (1,) * (w.ndim - 1)
    s = r["scale"].reshape(bshape)
    zp = r["zero_point"].reshape(bshape)
    inv = (np.float32(1.0) / s).astype(np.float32)
    q = np.rint(w.astype(np.float32) * inv).astype(np.float32) + zp.astype(np.float32)
    q = np.clip(q, int(r["qmin"]), int(r["qmax"])).astype(np.int64)
    return ((q - zp).astype(np.float32) * s).astype(np.float32)


def weight_of(a, tensors, quant, w=None):
    """The weight an op computes with: dequantized integers (axis 0), the fake-quantized float
    tensor (prepared graphs; `w` overrides the tensor, conv_bn's W * sf), or the float tensor."""
    r = quant.get(("weight", a["name"]))
    if w is None:
        w = tensors[a["weight"]]
    if r is None:
        return w.astype(np.float64)
    if "weight_int" not in r:
        return fake_quant_weight(w, r).astype(np.float64)
    w = r["weight_int"].astype(np.int64)
    bshape = (-1,) + (1,) * (w.ndim - 1)
    return ((w - r["zero_point"].reshape(bshape)).astype(np.float32) * r["scale"].reshape(bshape)).astype(np.float64)


BIAS_QMAX = 2147483520  # the int32 bias's range: +-(2^31 - 128)


def bias_of(a, tensors, quant, src, b=None):
    """The bias an op computes with (float32): the float tensor, or with an int32 bias (record
    attribute bias = "int32") at the derived scale s_x * s_w[c] (float32 product; s_x of the
    per-tensor quantization the layer's input lies on, `src`): the dequantized integers (Q/DQ
    graphs) or the fake-quantized float bias (prepared graphs; `b` overrides the tensor)."""
    r = quant.get(("weight", a["name"]))
    if b is None:
        b = tensors[a["bias"]]
    if r is None or r.get("bias", "float") != "int32":
        return b
    if src is None:
        raise SystemExit(f"{a['name']}: an int32 bias without a per-tensor quantized input")
    s = (np.float32(src["scale"][0]) * np.broadcast_to(r["scale"], b.shape)).astype(np.float32)
    if "bias_int" in r:
        return (r["bias_int"].astype(np.float32) * s).astype(np.float32)
    q = np.rint(b.astype(np.float32) * (np.float32(1.0) / s).astype(np.float32)).astype(np.float32)
    return (np.clip(q, -BIAS_QMAX, BIAS_QMAX).astype(np.float32) * s).astype(np.float32)


def conv2d(x, w, a):
    """NHWC x (float64) with OIHW w: grouped 2-D cross-correlation, zero padding."""
    win = windows(x, int(a["kernel_h"]), int(a["kernel_w"]), int(a["stride_h"]), int(a["stride_w"]),
                  int(a["pad_h"]), int(a["pad_w"]), 0.0)
    G, OC = int(a["groups"]), w.shape[0]
    cg, og = w.shape[1], OC // G
    return np.concatenate([np.tensordot(win[:, :, :, g * cg:(g + 1) * cg], w[g * og:(g + 1) * og],
                                        axes=([3, 4, 5], [1, 2, 3])) for g in range(G)], axis=3)


def batch_norm(x, a, tensors, gamma, beta):
    m, v = tensors[a["running_mean"]], tensors[a["running_var"]]
    return ((x - m) / np.sqrt(v.astype(np.float64) + float(a["eps"])) * gamma + beta).astype(np.float32)


def ceil_over(n, k, s, p):
    """Ceil mode (PyTorch's pooling_output_shape): how far the last window hangs over the padded end."""
    o = -(-(n + 2 * p - k) // s) + 1
    if (o - 1) * s >= n + p:
        o -= 1
    return max(0, (o - 1) * s + k - (n + 2 * p))


def windows(x, kh, kw, sh, sw, ph, pw, fill):
    """(N,H,W,C) -> (N,OH,OW,C,KH,KW) windows after padding with `fill`."""
    x = np.pad(x, ((0, 0), (ph, ph), (pw, pw), (0, 0)), constant_values=fill)
    v = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(1, 2))
    return v[:, ::sh, ::sw]


def resize2x(x, bilinear, h_axis):
    """Upsampling by 2 along axes h_axis and h_axis + 1: nearest (output o reads o // 2) or
    bilinear (source 0.5 (o + 0.5) - 0.5 clamped at 0, the last index repeating), in float64."""
    v = x.astype(np.float64)
    for ax in (h_axis, h_axis + 1):
        size = v.shape[ax]
        if not bilinear:
            v = np.repeat(v, 2, axis=ax)
            continue
        real = np.maximum(0.5 * (np.arange(2 * size) + 0.5) - 0.5, 0.0)
        i0 = np.floor(real).astype(np.int64)
        i1 = np.minimum(i0 + 1, size - 1)
        shape = [1] * v.ndim
        shape[ax] = 2 * size
        l1 = (real - i0).reshape(shape)
        v = np.take(v, i0, axis=ax) * (1.0 - l1) + np.take(v, i1, axis=ax) * l1
    return v.astype(np.float32)


def activation(x, act, alpha, beta):
    """docs/qdq_format.md's activations, in float64, rounded to float32 once."""
    v = x.astype(np.float64)
    if act == "sigmoid":
        y = 1.0 / (1.0 + np.exp(-v))
    elif act == "tanh":
        y = np.tanh(v)
    elif act == "silu":
        y = v / (1.0 + np.exp(-v))
    elif act == "hardsigmoid":
        y = np.clip((v + 3.0) / 6.0 if (np.float32(alpha), np.float32(beta)) == (np.float32(1 / 6), np.float32(0.5))
                    else alpha * v + beta, 0.0, 1.0)
    elif act == "hardswish":
        y = v * np.clip(v + 3.0, 0.0, 6.0) / 6.0
    elif act == "gelu":
        y = v * 0.5 * (1.0 + np.vectorize(math.erf)(v / math.sqrt(2.0)))
    elif act == "gelu_tanh":
        y = 0.5 * v * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v ** 3)))
    elif act == "leaky_relu":
        y = np.where(v > 0, v, v * alpha)
    elif act == "elu":
        y = np.where(v <= 0, alpha * (np.exp(np.minimum(v, 0.0)) - 1.0), v)
    elif act == "affine":
        y = alpha * v + beta
    elif act == "div":
        y = v / alpha
    else:
        raise SystemExit(f"activation '{act}' unknown to this reader")
    return y.astype(np.float32)


def run(nodes, values, tensors, quant, x, output):
    vals = {}
    src = {}  # value -> the per-tensor record its values lie on (for int32 biases)
    for a in nodes:
        op, ins = a["op"], [vals.get(i) for i in a["inputs"]]
        xi = ins[0] if ins else None
        xs = src.get(a["inputs"][0]) if a["inputs"] else None
        if op == "input":
            y = x.astype(np.float32)
        elif op == "quantize":
            y = quantize(xi, quant[("activation", a["name"])])
        elif op == "dequantize":
            y = dequantize(xi, quant[("activation", a["name"])])
        elif op == "fake_quant":
            r = quant[("activation", a["name"])]
            y = dequantize(quantize(xi, r), r)
        elif op == "conv2d":
            y = conv2d(xi.astype(np.float64), weight_of(a, tensors, quant), a)  # w: (OC, C/groups, KH, KW)
            if "bias" in a:
                y = y + bias_of(a, tensors, quant, xs)
            y = y.astype(np.float32)
        elif op == "conv_bn":  # eval: conv(x, fq(W * sf)) / sf + b, then BN with the running statistics
            gamma, beta = tensors[a["bn_weight"]], tensors[a["bn_bias"]]
            sf = (gamma / np.sqrt(tensors[a["running_var"]] + np.float32(a["eps"]))).astype(np.float32)
            ws = (tensors[a["weight"]] * sf.reshape(-1, 1, 1, 1)).astype(np.float32)
            y = (conv2d(xi.astype(np.float64), weight_of(a, tensors, quant, ws), a).astype(np.float32) / sf)
            if "bias" in a:
                y = y + tensors[a["bias"]]
            y = batch_norm(y.astype(np.float32), a, tensors, gamma, beta)
            r = quant.get(("weight", a["name"]))
            if r is not None and r.get("bias", "float") == "int32":  # what the folded bias loses to int32
                b = tensors[a["bias"]] if "bias" in a else np.float32(0)
                bf = (beta + (b - tensors[a["running_mean"]]).astype(np.float32) * sf).astype(np.float32)
                y = (y + (bias_of(a, tensors, quant, xs, bf) - bf).astype(np.float32)).astype(np.float32)
        elif op == "linear":
            y = xi.astype(np.float64) @ weight_of(a, tensors, quant).T
            if "bias" in a:
                y = y + bias_of(a, tensors, quant, xs)
            y = y.astype(np.float32)
        elif op == "relu":
            y = np.maximum(xi, np.float32(0))
        elif op == "relu6":
            y = np.minimum(np.maximum(xi, np.float32(0)), np.float32(6))
        elif op == "max_pool2d":  # ceil: the last windows hang over the bottom and right (-inf there)
            k, s, p = int(a["kernel_h"]), int(a["stride_h"]), int(a["pad_h"])
            over = [ceil_over(n, k, s, p) if int(a.get("ceil", 0)) else 0 for n in xi.shape[1:3]]
            xo = np.pad(xi, ((0, 0), (0, over[0]), (0, over[1]), (0, 0)), constant_values=-np.inf)
            y = windows(xo, k, k, s, s, p, p, -np.inf).max(axis=(4, 5)).astype(np.float32)
        elif op == "avg_pool2d":  # count_include_pad: divide by k*k
            k, s, p = int(a["kernel_h"]), int(a["stride_h"]), int(a["pad_h"])
            y = windows(xi.astype(np.float64), k, k, s, s, p, p, 0.0).sum(axis=(4, 5)) / (k * k)
            y = y.astype(np.float32)
        elif op == "global_avg_pool":
            y = xi.astype(np.float64).mean(axis=(1, 2)).astype(np.float32)
        elif op == "flatten":  # NHWC order: (N, H*W*C) with C fastest
            y = xi.reshape(xi.shape[0], -1)
        elif op == "add":
            y = (ins[0].astype(np.float64) + ins[1]).astype(np.float32)
        elif op == "concat":  # along the last axis: channels (NHWC) or features
            y = np.concatenate(ins, axis=-1)
        elif op == "channel_shuffle":  # (groups, C / groups) transposed, along the last axis
            g_ = int(a["groups"])
            c_ = xi.shape[-1]
            y = xi.reshape(xi.shape[:-1] + (g_, c_ // g_)).swapaxes(-1, -2).reshape(xi.shape)
        elif op == "channel_slice":
            y = np.ascontiguousarray(xi[..., int(a["begin"]):int(a["end"])])
        elif op == "mul":  # a (C) vector scales every pixel of an image
            b = ins[1] if ins[1].ndim == ins[0].ndim else ins[1][:, None, None, :]
            y = (ins[0] * b).astype(np.float32)
        elif op == "batch_norm":
            y = batch_norm(xi, a, tensors, tensors[a["weight"]], tensors[a["bias"]])
        elif op == "activation":
            y = activation(xi, text(a["act"]), float(a["alpha"]), float(a["beta"]))
        elif op == "layer_norm":  # over the channels of every pixel (features of a flat value)
            x64 = xi.astype(np.float64)
            m = x64.mean(axis=-1, keepdims=True)
            sd = np.sqrt(((x64 - m) ** 2).mean(axis=-1, keepdims=True) + float(np.float32(a["eps"])))
            y = ((x64 - m) / sd * tensors[a["weight"]] + tensors[a["bias"]]).astype(np.float32)
        elif op == "attention":  # the pixels are the tokens; heads split the channels
            h_ = int(a["heads"])
            n_, c_ = xi.shape[0], xi.shape[-1]
            q, k, v = (t.astype(np.float64).reshape(n_, -1, h_, c_ // h_).transpose(0, 2, 1, 3) for t in ins)
            s_ = q @ k.transpose(0, 1, 3, 2) / np.sqrt(c_ // h_)
            p_ = np.exp(s_ - s_.max(axis=-1, keepdims=True))
            p_ /= p_.sum(axis=-1, keepdims=True)
            y = (p_ @ v).transpose(0, 2, 1, 3).reshape(xi.shape).astype(np.float32)
        elif op == "add_param":  # a tensor of one sample's shape
            y = (xi.astype(np.float64) + tensors[a["weight"]]).astype(np.float32)
        elif op == "prepend_token":  # a learned token before the pixels' tokens: (N, 1, 1 + H W, C)
            t_ = np.broadcast_to(tensors[a["weight"]].astype(np.float32), (xi.shape[0], 1, xi.shape[-1]))
            y = np.concatenate([t_, xi.reshape(xi.shape[0], -1, xi.shape[-1])], axis=1)[:, None]
        elif op == "first_token":  # the first pixel's features: (N, C)
            y = np.ascontiguousarray(xi.reshape(xi.shape[0], -1, xi.shape[-1])[:, 0])
        elif op == "resize":  # by 2 in H and W of (N, H, W, C)
            y = resize2x(xi, text(a["mode"]) == "bilinear", 1)
        elif op == "prelu":  # one slope, or one per channel (the last axis)
            w_ = tensors[a["weight"]].astype(np.float32)
            y = np.where(xi > 0, xi, w_ * xi).astype(np.float32)
        elif op == "dropout":  # the identity in eval
            y = xi
        else:
            raise SystemExit(f"node {a['index']} '{a['name']}': op '{op}' unknown to this reader")
        vals[int(a["output"])] = y
        if op in ("dequantize", "fake_quant"):
            r = quant[("activation", a["name"])]
            if len(r["scale"]) == 1:
                src[int(a["output"])] = r
        elif op in ("max_pool2d", "flatten", "relu", "dropout") and xs is not None:
            src[int(a["output"])] = xs
    return vals[output]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--io", help="HDF5 file with /input (N,H,W,C) and /output to compare against")
    ap.add_argument("--max-lsb", type=float, default=2.0, help="allowed output difference, in output LSB")
    args = ap.parse_args()
    f, nodes, values, tensors, quant = load(args.file)
    describe(args.file, f, nodes, values, tensors, quant)
    if not args.io:
        return 0
    with h5py.File(args.io, "r") as io:
        x, want = io["input"][...], io["output"][...]
        raw = io["raw"][...] if "raw" in io else None
    pre = values["input_preprocessing"]
    if pre is not None and raw is not None:  # float32, in this order, as the format says
        xr = ((raw.astype(np.float32) / pre["divisor"]).astype(np.float32) - pre["mean"]) / pre["std"]
        xr = xr.astype(np.float32)
        if xr.shape != x.shape or not np.array_equal(xr, x):
            print(f"input preprocessing of /raw differs from /input: max |diff| {np.abs(xr - x).max():.3g}")
            return 1
        print(f"input preprocessing applied to {args.io}:/raw reproduces /input exactly")
        x = xr
    got = run(nodes, values, tensors, quant, x, int(f.attrs["output"]))
    got = got.reshape(want.shape)
    diff = np.abs(got.astype(np.float64) - want)
    exact = float((diff == 0).mean())
    last = nodes[int(f["values/producer"][int(f.attrs["output"])])]
    if last["op"] in ("dequantize", "fake_quant"):  # a quantized output: count in its LSB
        lsb = float(quant[("activation", last["name"])]["scale"].max())
        tol, unit = args.max_lsb * lsb, f"{diff.max() / lsb:.2f} LSB (tolerance {args.max_lsb:g} LSB)"
    else:  # an fp32 output: float32 vs float64 accumulation only
        tol = 1e-5 * (1.0 + float(np.abs(want).max()))
        unit = f"fp32 output (tolerance {tol:.3g})"
    print(f"reference interpreter vs {args.io}: max |diff| {diff.max():.3g} = {unit}, "
          f"{100 * exact:.1f}% bit-identical")
    return 0 if diff.max() <= tol else 1


if __name__ == "__main__":
    sys.exit(main())
