#!/usr/bin/env python3
"""ONNX Runtime judged one partition at a time against the exact integer reference.

A QDQ export (qat_export, qat_train's model_qdq.onnx) holds one QuantizeLinear per activation
point of the Q/DQ graph, named as the graph's quantize node. Here every such point's integers are
made a graph input, fed with the exact reference's integers there (qat_run --write-outputs
--reference, eval/exact.h), and ONNX Runtime's own integers at the point become a graph output.
So each point's integers are what ORT computes from the exact reference's integers at the points
before it: the ops between two quantization points (one partition), judged alone, with no
difference carried in from earlier layers. Judged (failing()): every point within 1 LSB of the
exact reference's integers there, and at most MAX_ONE_LSB_SHARE of a point's values (at least
ONE_LSB_ALLOWED, for the small points such as the logits) 1 LSB apart. Such a value sat on a
rounding tie, which float32 and the exact arithmetic round to neighbouring integers: measured at
most 0.04% of a point's values (one logit of 2,560) on the export tests and 0.005% on the zoo.
One dequantize scale made 2% larger puts 26% of the next partition's values 1 LSB or more apart.

    import ort_alone
    res = ort_alone.judge(build, "model_qdq.h5", "model_qdq.onnx", config_ini, images=256, work=dir)

The images are the first test images of the config's data (None: Fashion-MNIST's, qat_run's
default), as qat_run's loader gives them: the reference writes them (the graph's input value),
and ONNX Runtime reads the same floats.

Usage: .venv/bin/python tests/ort/ort_alone.py BUILD_DIR MODEL_QDQ.h5 MODEL_QDQ.onnx
           [--config CONFIG.ini] [--images N] [--work DIR] [--max-lsb K]
Prints each point's largest difference and a summary; exit 1 when failing() names a point.
"""
import argparse
import os
import subprocess
import sys

import h5py
import numpy as np

MAX_ONE_LSB_SHARE = 0.001
ONE_LSB_ALLOWED = 8


class AloneError(Exception):
    pass


def failing(res, max_lsb=1):
    """The points of a judge() result over max_lsb, or with more than MAX_ONE_LSB_SHARE of their
    values (and more than ONE_LSB_ALLOWED) 1 LSB apart."""
    return [p["point"] for p in res["points"]
            if p["max_lsb"] > max_lsb or p["one_lsb"] > max(MAX_ONE_LSB_SHARE * p["values"], ONE_LSB_ALLOWED)]


def summary(res):
    """One line of a judge() result: the partitions, the worst point, the values 1 LSB apart."""
    share = max(p["one_lsb"] / p["values"] for p in res["points"])
    return ("%d partitions alone on %d images: worst %d LSB (%s), %d of %d values 1 LSB apart (at one point at most "
            "%.4f%%)" % (len(res["points"]), res["images"], res["worst"]["max_lsb"], res["worst"]["point"],
                         res["one_lsb"], res["values"], 100 * share))


def _init(graph, name):
    import onnx.numpy_helper
    for t in graph.initializer:
        if t.name == name:
            return onnx.numpy_helper.to_array(t)
    return None


def points(model):
    """The activation points of the ONNX model: (quantize node name, the tensor holding the point's
    integers, scale, zero point, [qmin, qmax] or None, axis). The tensor is the QuantizeLinear's
    output, or the Clip's that narrows it to a sub-8-bit range (onnx/export.c)."""
    g = model.graph
    clips = {n.input[0]: n for n in g.node if n.op_type == "Clip"}
    out = []
    for n in g.node:
        if n.op_type != "QuantizeLinear":
            continue
        tensor, bounds = n.output[0], None
        clip = clips.get(tensor)
        if clip is not None and clip.name == n.name + ".clip":
            tensor = clip.output[0]
        lo, hi = _init(g, n.name + ".clip_min"), _init(g, n.name + ".clip_max")
        if lo is not None and hi is not None:
            bounds = (int(lo), int(hi))
        axis = next((a.i for a in n.attribute if a.name == "axis"), 1)
        out.append((n.name, tensor, _init(g, n.input[1]), _init(g, n.input[2]), bounds, axis))
    return out


def forced_model(model, pts):
    """A copy of model in which each point's tensor T is a graph input (T, the integers fed) and
    what the model computes there is a graph output (T + ".ort")."""
    import onnx
    from onnx import helper
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    producers = {o: n for n in g.node for o in n.output}
    del g.output[:]
    for name, tensor, scale, zp, bounds, axis in pts:
        node = producers[tensor]
        node.output[list(node.output).index(tensor)] = tensor + ".ort"
        etype = helper.np_dtype_to_tensor_dtype(zp.dtype)
        g.input.append(helper.make_tensor_value_info(tensor, etype, None))
        g.output.append(helper.make_tensor_value_info(tensor + ".ort", etype, None))
    return m


def onnx_layout(v, numel_shape):
    """The reference's values v (N, H, W, C) or (N, F) in the export's layout: images NCHW, a
    vector the shape ONNX gives it (numel_shape: per-sample dims, or None). A point on a flattened
    image, which ONNX orders (c, h, w) where the graph holds (h, w, c), is not reordered: no
    export of the tests has one, and its values would fail the comparison, not pass it."""
    if v.ndim == 4:
        v = v.transpose(0, 3, 1, 2)
    if numel_shape is not None and int(np.prod(numel_shape)) == int(np.prod(v.shape[1:])):
        v = v.reshape((v.shape[0],) + tuple(numel_shape))
    return np.ascontiguousarray(v)


def integers(v, scale, zp, axis):
    """The integers behind dequantized values v ((q - zp) * s in float32): round(v / s) + zp."""
    shape = [1] * v.ndim
    if np.ndim(scale) == 1 and np.size(scale) > 1:
        shape[axis] = -1
    s = np.asarray(scale, np.float64).reshape(shape)
    z = np.asarray(zp, np.int64).reshape(shape)
    return np.rint(v.astype(np.float64) / s).astype(np.int64) + z


def inferred_shapes(model):
    """Per-sample dims ONNX shape inference gives each tensor (None where unknown)."""
    import onnx
    shapes = {}
    inf = onnx.shape_inference.infer_shapes(model)
    for vi in list(inf.graph.value_info) + list(inf.graph.output):
        dims = [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
        if dims and all(d is not None for d in dims[1:]):
            shapes[vi.name] = tuple(dims[1:])
    return shapes


def input_name(qdq_h5):
    """The name of the Q/DQ file's input node (its value is the images)."""
    with h5py.File(qdq_h5, "r") as f:
        for node in f["nodes"].values():
            if node.attrs["op"] == b"input":
                return node.attrs["name"].decode()
    raise AloneError("%s has no input node" % qdq_h5)


def judge(build, qdq_h5, onnx_path, config, images=256, work=".", threads=2):
    """Judges every partition of onnx_path (the export of qdq_h5) alone in ONNX Runtime
    (optimizations disabled) against the exact reference on the first `images` test images of
    config's test set. Returns a dict: per point (name, max LSB, values 1 LSB apart, values),
    the worst point, the totals; raises AloneError on a failing run."""
    import onnx
    import onnxruntime as ort
    model = onnx.load(onnx_path)
    pts = points(model)
    if not pts:
        raise AloneError("%s holds no QuantizeLinear" % onnx_path)
    ref_h5 = os.path.join(work, "reference.h5")
    images_value = input_name(qdq_h5)
    cmd = [os.path.join(build, "bin", "qat_run"), qdq_h5] + (["--config", config] if config else []) + [
        "--images", str(images), "--quiet", "--write-outputs", ref_h5, "--reference", "--values",
        ",".join([images_value] + [p[0] for p in pts])]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise AloneError("qat_run --reference: %s" % r.stdout[-2000:])
    shapes = inferred_shapes(model)
    feeds, want = {}, {}
    with h5py.File(ref_h5, "r") as f:
        for name, tensor, scale, zp, bounds, axis in pts:
            v = onnx_layout(f[name][...], shapes.get(tensor))
            q = integers(v, scale, zp, axis)
            info = np.iinfo(zp.dtype)
            if q.min() < info.min or q.max() > info.max:
                raise AloneError("%s: the reference's integers %d..%d do not fit %s" % (name, q.min(), q.max(),
                                                                                       zp.dtype))
            feeds[tensor] = q.astype(zp.dtype)
            want[tensor] = q
        x = f[images_value][...]
    forced = forced_model(model, pts)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(forced.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feeds[model.graph.input[0].name] = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    outs = sess.run([p[1] + ".ort" for p in pts], feeds)
    per_point, worst = [], None
    total = ones = 0
    for (name, tensor, scale, zp, bounds, axis), o in zip(pts, outs):
        got = o.astype(np.int64)
        if bounds:
            got = np.clip(got, bounds[0], bounds[1])
        if got.shape != want[tensor].shape:
            raise AloneError("%s: ONNX Runtime gives shape %s, the reference %s" % (name, got.shape,
                                                                                   want[tensor].shape))
        d = np.abs(got - want[tensor])
        row = {"point": name, "max_lsb": int(d.max()), "one_lsb": int((d == 1).sum()), "values": int(d.size)}
        per_point.append(row)
        total += d.size
        ones += int((d == 1).sum())
        if worst is None or row["max_lsb"] > worst["max_lsb"]:
            worst = row
    return {"images": len(x), "points": per_point, "worst": worst, "values": total, "one_lsb": ones,
            "ort_version": ort.__version__}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build")
    ap.add_argument("qdq_h5")
    ap.add_argument("onnx")
    ap.add_argument("--config")
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--work", default=".")
    ap.add_argument("--max-lsb", type=int, default=1)
    a = ap.parse_args()
    try:
        res = judge(a.build, a.qdq_h5, a.onnx, a.config, a.images, a.work)
    except (OSError, AloneError) as e:
        sys.exit("ort_alone: %s" % e)
    for p in res["points"]:
        print("%-50s max %d LSB, %d of %d values 1 LSB apart" % (p["point"], p["max_lsb"], p["one_lsb"], p["values"]))
    print("ONNX Runtime %s, %s" % (res["ort_version"], summary(res)))
    bad = failing(res, a.max_lsb)
    if bad:
        sys.exit("ort_alone: %d points over %d LSB or with more than %.1f%% of their values 1 LSB apart: %s"
                 % (len(bad), a.max_lsb, 100 * MAX_ONE_LSB_SHARE, ", ".join(bad)))


if __name__ == "__main__":
    main()
