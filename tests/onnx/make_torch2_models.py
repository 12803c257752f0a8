#!/usr/bin/env python3
"""Writes the PyTorch 2.x ONNX models, the opset-forms models, the hostile external-data files and
their references (tests/onnx/ref/onnx2_ref.h5). Run with the peers environment's torch 2.x
(bench/peers/.venv, bench/peers/requirements-peers.txt: torch, onnxscript and onnx-ir, whose
versions decide what the exporter writes; its onnxruntime is the test environment's version):

    bench/peers/.venv/bin/python tests/onnx/make_torch2_models.py

Deterministic (seed 0; the same bytes on every run from the same checkout path: torch writes
each node's Python stack trace, with absolute file names, into its metadata_props). The CTest
tests need no torch, only these committed files. The twins FashionCNN and MobileNetSmall and
randomize_bn, write_ref, round_mantissa, nhwc come from make_onnx_models.py (torch 1.13's
generator); the five twins are made in that generator's order from the same seeds, so the
parameters are the ones of fashion_cnn.onnx / mobilenet.onnx (checked and printed).

Models (tests/onnx/models/), torch 2.x exports, the dynamo exporter (the default from torch 2.9):

    torch.onnx.export(model.train(), (torch.randn(2, 1, 28, 28),), path, dynamo=True,
                      input_names=["input"], output_names=["logits"],
                      dynamic_shapes={"x": {0: torch.export.Dim("batch")}},
                      optimize=OPTIMIZE, external_data=EXTERNAL)

  opset_version left to torch (20 with torch 2.15: IR version 10). Dynamic batch ("batch").
  t2_fashion_cnn        FashionCNN, optimize=False: Conv (its zero bias built by a Shape /
                        Expand / CastLike subgraph), BatchNormalization (inference form: no
                        training_mode attribute, one output, momentum 0.9, although the model
                        was in train mode: torch 2.x's ONNX functions always write BN's
                        inference form), the flatten as Reshape(allowzero=1) of
                        Concat(Reshape(Squeeze(Shape(input, end=1)), [-1]), [3136]).
  t2_fashion_cnn_opt    the same, optimize=True (the default): BN folded into the convs (whose
                        initializers keep the names conv1.weight / conv2.weight but hold the
                        folded weights; the biases are new initializers conv1.weight_bias ...),
                        the shape subgraph folded to a constant [-1, 3136] (initializer val_*).
  t2_mobilenet          MobileNetSmall, optimize=False, EXTERNAL DATA: 21 of its 42 initializers
                        (those of 384 bytes and more here; 192 bytes and less stay inside) are
                        in t2_mobilenet.onnx.data (location "t2_mobilenet.onnx.data",
                        relative; contiguous offsets from 0, no alignment). ReLU6 as Clip(x, CastLike(0),
                        CastLike(6)), the global average pool as ReduceMean(axes input [-1, -2],
                        keepdims=1) with the axes from Reshape(Constant, [-1]).
  t2_mobilenet_opt      the same, optimize=True, weights inside the file: BN folded, ReLU6 as
                        Clip(x, min_val_cast, max_val_cast), two scalar initializers shared by
                        all seven Clips; ReduceMean's axes an initializer.
  A training export in torch 2.x does not run the model (torch.export traces it), so the BN
  running statistics are the model's; the export still works on a deep copy (as the old
  generator's export() does) and the initializers are checked equal to that copy's state_dict
  (optimize=False) or to its BN folding (optimize=True).

Opset-forms models (tests/onnx/models/forms_opset{11,13,18,22}.onnx, onnx.helper, IR versions
6, 7, 8, 10), the same network and weights (numpy seed 0) in each, input "input" [batch, 1, 12,
12]:
  conv1 Conv(1->4, 3x3, pads 1, bias) -> Relu -> Pad(zero; 1 on H and W only) ->
  AveragePool(3x3, stride 1, no pads) -> conv2 Conv(4->6, 1x1, bias) -> Clip(0, 6) ->
  ReduceMean(axes [2, 3], keepdims=1) -> Squeeze(axes [2, 3]) -> Reshape(shape) ->
  fc Gemm(6->10, transB=1) -> "logits" [batch, 10], where shape = Concat(Unsqueeze(
  Gather(Shape(squeezed), 0), axes [0]), [-1]).
                  Pad                          ReduceMean  Squeeze/Unsqueeze  Reshape    constants
  forms_opset11   pads input [8], value 0      axes attr   axes attr          -          Constant nodes
  forms_opset13   pads input [8], value 0      axes attr   axes input         -          Constant nodes
  forms_opset18   pads [4] + axes [2, 3], 0    axes input  axes input         allowzero=1 initializers
  forms_opset22   pads [4] + axes [2, 3],      axes input  axes input         allowzero=1 initializers
                  constant_value omitted ("")
  Their reference is ONNX Runtime's output (graph optimizations disabled); the four are checked
  to compute the same logits.

Hostile external-data files (tests/onnx/bad/, a few hundred bytes each): the tiny model input
[batch, 1, 4, 4] -> conv Conv(1->2, 3x3, pads 1, bias) -> Relu -> GlobalAveragePool -> Flatten
-> fc Gemm(2->10, transB=1), opset 13, IR 7, whose conv.weight (2x1x3x3 float, 72 bytes) is
stored externally; everything else is inside the .onnx.
  ext_data.bin         the shared data file (160 bytes): 16 decoy floats at 0..63 (a reader at
                       the wrong offset computes other logits), conv.weight at 64..135, 6
                       decoy floats at 136..159.
  ext_ok.onnx          location "ext_data.bin", offset 64, length 72: valid; imports and
                       computes the reference (group ext_ok).
  ext_absolute.onnx    location "/etc/passwd" (offset 0, length 72): an absolute path.
  ext_dotdot.onnx      location "../ext_secret.bin": a path leaving the model's directory (the
                       file does not exist in the tree: a test that wants the read to succeed
                       without the rule copies the model one directory down and puts the file
                       next to that directory).
  ext_dotdot_reentry.onnx  location "../bad/ext_data.bin", offset 64, length 72: a ".."
                       component that leaves the model's directory and comes back to the valid
                       data file: a lexical rule (no ".." component; onnx.checker's) refuses it,
                       a canonical-path rule (the resolved file inside the model's directory;
                       ONNX Runtime 1.32's) accepts it. The importer's choice decides which
                       verdict its test expects.
  ext_past_end.onnx    location "ext_data.bin", offset 100, length 72: ends at byte 172 of a
                       160-byte file.
  ext_length.onnx      location "ext_data.bin", offset 64, length 68: not 2*1*3*3*4 = 72.
  ext_missing.onnx     location "ext_missing.bin": no such file.
  ext_inline.onnx      location "ext_data.bin", offset 64, length 72, and raw_data as well: data
                       stored externally and inline at once.
  A symlink as location is made at test time (not committed).
  onnx 1.23.2's checker (path form) refuses absolute, dotdot, dotdot_reentry, missing, inline and
  accepts past_end and length (it does not read the data); ONNX Runtime 1.32 refuses all but ok
  and dotdot_reentry.

References (tests/onnx/ref/onnx2_ref.h5, attributes generator, torch_version, onnxscript_version,
onnx_version, onnxruntime_version), the format of onnx_ref.h5 (make_onnx_models.write_ref), one group per
file, named by its stem:
  t2_fashion_cnn, t2_mobilenet (train=1): x (8, 28, 28, 1) NHWC, labels, y_eval (eval mode),
      y_train (train mode, batch statistics), loss, grad/<state_dict name> (rounded to 14
      mantissa bits, gzip), after/<buffer> (BN running statistics after that forward).
      t2_fashion_cnn's x is onnx_ref.h5's fashion_cnn x (the same seed).
  t2_fashion_cnn_opt, t2_mobilenet_opt (train=0): x, labels, y_eval from the exported copy in
      eval mode (the file folds BN with the running statistics).
  forms_opset11 ... forms_opset22, ext_ok (train=0): x (8, 12, 12, 1) / (8, 4, 4, 1), labels,
      y_eval = ONNX Runtime's logits on x transposed to NCHW, ORT_DISABLE_ALL.
Each model is checked here: onnx.checker (full_check), ONNX Runtime against y_eval (and, for the
train=1 exports, a copy whose BNs are set to training mode against y_train), within 1e-5 of
max |logit|.
"""
import collections
import copy
import os
import sys
import tempfile
import warnings

import h5py
import numpy as np
import onnx
import onnxruntime as ort
import onnxscript
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_onnx_models import (FashionCNN, FashionMLP, MobileNetSmall, ResCNN, TinyFeatures,  # noqa: E402
                              N, nhwc, randomize_bn, write_ref)

MODELS, BAD, REF = os.path.join(HERE, "models"), os.path.join(HERE, "bad"), os.path.join(HERE, "ref")
SRC = os.path.dirname(os.path.dirname(HERE))
TOL = 1e-5


# ---- checks ---------------------------------------------------------------------------------------

def describe(path):
    m = onnx.load(path, load_external_data=False)
    ops = collections.Counter(n.op_type for n in m.graph.node)
    opset = next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))
    ext = sum(t.data_location == TensorProto.EXTERNAL for t in m.graph.initializer)
    print("  %s: IR %d, opset %d, %d nodes, %d initializers%s, %d bytes%s" % (
        os.path.relpath(path, SRC), m.ir_version, opset, len(m.graph.node), len(m.graph.initializer),
        " (%d external)" % ext if ext else "", os.path.getsize(path),
        " + %d bytes of external data" % os.path.getsize(path + ".data") if os.path.exists(path + ".data") else ""))
    print("    " + ", ".join("%s %d" % kv for kv in sorted(ops.items())))
    return m.ir_version, opset, ops


def check(path):
    """onnx.checker on the file (the path form: external data resolved from its directory)."""
    onnx.checker.check_model(path, full_check=True)


def ort_run(path, x_nchw):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: np.ascontiguousarray(x_nchw, dtype=np.float32)})[0]


def rel_err(y, ref):
    return float(np.abs(y - ref).max()) / float(np.abs(ref).max())


def expect_close(what, y, ref, tol=TOL):
    err = rel_err(y, ref)
    print("    %-44s max |ORT - ref| / max |ref| = %.2e (max |ref| %.3g)" % (what, err, float(np.abs(ref).max())))
    assert y.shape == ref.shape and err <= tol, (what, y.shape, ref.shape, err)
    return err


def training_copy(src, dst):
    """A copy of src whose BatchNormalization nodes run in training mode (batch statistics), the
    three outputs that training_mode=1 requires (ORT's shape inference): what PyTorch's train-mode
    forward computes."""
    m = onnx.load(src)
    n_bn = 0
    for n in m.graph.node:
        if n.op_type == "BatchNormalization":
            assert len(n.output) == 1 and not any(a.name == "training_mode" for a in n.attribute), n
            n.attribute.append(helper.make_attribute("training_mode", 1))
            n.output.extend([n.output[0] + "__running_mean", n.output[0] + "__running_var"])
            n_bn += 1
    onnx.save(m, dst)
    return n_bn


# ---- the torch 2.x exports ------------------------------------------------------------------------

def export2(model, path, optimize, external_data):
    """Exports a deep copy of model in train mode and returns the copy (the old generator's
    export(): references computed from the weights as exported)."""
    for p in (path, path + ".data"):
        if os.path.exists(p):
            os.remove(p)
    m = copy.deepcopy(model)
    m.train()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Exporting a model while it is in training mode")
        torch.onnx.export(m, (torch.randn(2, 1, 28, 28),), path, dynamo=True,
                          input_names=["input"], output_names=["logits"],
                          dynamic_shapes={"x": {0: torch.export.Dim("batch")}},
                          optimize=optimize, external_data=external_data)
    assert os.path.exists(path + ".data") == external_data, path
    check(path)
    m.eval()
    return m


def initializers(path):
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}


def check_initializers(path, model, optimize):
    """The file's weights are the copy's: every state_dict tensor (optimize=False), or each conv's
    BN folding (optimize=True: weight * gamma / sqrt(var + eps), beta - mean * gamma / sqrt(var + eps)
    under the conv weight's name and <name>_bias)."""
    init = initializers(path)
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items() if "num_batches" not in k}
    if not optimize:
        missing = sorted(set(sd) - set(init))
        assert not missing, (path, missing)
        for k, v in sd.items():
            assert init[k].shape == v.shape and np.array_equal(init[k], v), (path, k)
        print("    initializers equal the exported copy's state_dict (%d tensors)" % len(sd))
        return
    mods = dict(model.named_modules())
    folded, worst = 0, 0.0
    convs = [(n, m) for n, m in mods.items() if isinstance(m, torch.nn.Conv2d)]
    bns = [m for m in mods.values() if isinstance(m, torch.nn.BatchNorm2d)]
    assert len(convs) == len(bns)
    for (cname, conv), bn in zip(convs, bns):  # in module order: each conv is followed by its BN
        s = (bn.weight / torch.sqrt(bn.running_var + bn.eps)).detach()
        w = (conv.weight.detach() * s.view(-1, 1, 1, 1)).numpy()
        b = (bn.bias.detach() - bn.running_mean * s).numpy()
        wn, bn_name = cname + ".weight", cname + ".weight_bias"
        assert wn in init and bn_name in init, (path, wn, sorted(init))
        for got, want in ((init[wn], w), (init[bn_name], b)):
            assert got.shape == want.shape, (path, wn)
            worst = max(worst, float(np.abs(got - want).max() / np.abs(want).max()))
        folded += 1
    for k, v in sd.items():
        if k.startswith("fc"):
            assert np.array_equal(init[k], v), (path, k)
    assert worst < 1e-6, (path, worst)
    print("    %d convs hold their BN folded (max relative difference %.1e), the fc weights equal" % (folded, worst))


def ort_checks(path, g, tmp):
    """The file in ORT (loaded from its own directory) against y_eval; with train, a training-mode
    copy against y_train. Returns the relative errors."""
    x = g["x"][...].transpose(0, 3, 1, 2)
    what = "%s (file as written) vs y_eval" % os.path.basename(path)
    errs = {"eval": expect_close(what, ort_run(path, x), g["y_eval"][...])}
    if g.attrs["train"]:
        dst = os.path.join(tmp, os.path.basename(path)[:-5] + "_train.onnx")
        n_bn = training_copy(path, dst)
        what = "its %d BNs in training mode vs y_train" % n_bn
        errs["train"] = expect_close(what, ort_run(dst, x), g["y_train"][...])
    return errs


def same_parameters(path, model, old):
    """Whether the model's parameters equal those in the torch 1.13 file `old` (the twins were made
    in the old generator's order from the same seeds)."""
    init = initializers(os.path.join(MODELS, old))
    same = all(k in init and np.array_equal(init[k], p.detach().numpy()) for k, p in model.named_parameters())
    print("    parameters equal to %s's: %s" % (old, "yes" if same else "NO"))
    return same


# ---- the opset-forms models -----------------------------------------------------------------------

FORMS = {11: 6, 13: 7, 18: 8, 22: 10}  # opset: IR version


def forms_weights():
    rng = np.random.default_rng(0)
    return {
        "conv1.weight": (rng.standard_normal((4, 1, 3, 3)) * 0.6).astype(np.float32),
        "conv1.bias": (rng.standard_normal(4) * 0.2).astype(np.float32),
        "conv2.weight": (rng.standard_normal((6, 4, 1, 1)) * 2.5).astype(np.float32),
        "conv2.bias": (rng.standard_normal(6) * 0.5 + 1.0).astype(np.float32),
        "fc.weight": (rng.standard_normal((10, 6)) * 0.5).astype(np.float32),
        "fc.bias": (rng.standard_normal(10) * 0.1).astype(np.float32),
    }


def forms_model(opset):
    ir = FORMS[opset]
    nodes, inits = [], [numpy_helper.from_array(v, k) for k, v in forms_weights().items()]
    as_inits = opset >= 18

    def const(name, value):
        """A small constant: a Constant node (opsets 11, 13, as torch 1.x writes them) or an
        initializer (18, 22, as torch 2.x's optimizer leaves them)."""
        t = numpy_helper.from_array(np.asarray(value), name)
        if as_inits:
            inits.append(t)
        else:
            nodes.append(helper.make_node("Constant", [], [name], name=name + "_Constant", value=t))
        return name

    def node(op, inputs, output, name, **attrs):
        nodes.append(helper.make_node(op, inputs, [output], name=name, **attrs))
        return output

    i64 = np.int64
    y = node("Conv", ["input", "conv1.weight", "conv1.bias"], "conv1_out", "conv1", kernel_shape=[3, 3],
             pads=[1, 1, 1, 1], strides=[1, 1], dilations=[1, 1], group=1)
    y = node("Relu", [y], "relu1_out", "relu1")
    if opset < 18:
        pad_in = [y, const("pad_pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], i64)),
                  const("pad_value", np.array(0.0, np.float32))]
    else:
        value = const("pad_value", np.array(0.0, np.float32)) if opset == 18 else ""
        pad_in = [y, const("pad_pads", np.array([1, 1, 1, 1], i64)), value, const("pad_axes", np.array([2, 3], i64))]
    y = node("Pad", pad_in, "pad_out", "pad", mode="constant")
    y = node("AveragePool", [y], "pool_out", "pool", kernel_shape=[3, 3], strides=[1, 1])
    y = node("Conv", [y, "conv2.weight", "conv2.bias"], "conv2_out", "conv2", kernel_shape=[1, 1],
             pads=[0, 0, 0, 0], strides=[1, 1], dilations=[1, 1], group=1)
    y = node("Clip", [y, const("clip_min", np.array(0.0, np.float32)), const("clip_max", np.array(6.0, np.float32))],
             "clip_out", "clip")
    if opset < 18:
        y = node("ReduceMean", [y], "mean_out", "mean", axes=[2, 3], keepdims=1)
    else:
        y = node("ReduceMean", [y, const("mean_axes", np.array([2, 3], i64))], "mean_out", "mean", keepdims=1)
    if opset < 13:
        sq = node("Squeeze", [y], "squeeze_out", "squeeze", axes=[2, 3])
    else:
        sq = node("Squeeze", [y, const("squeeze_axes", np.array([2, 3], i64))], "squeeze_out", "squeeze")
    s = node("Shape", [sq], "shape_out", "shape")
    s = node("Gather", [s, const("gather_index", np.array(0, i64))], "gather_out", "gather", axis=0)
    if opset < 13:
        s = node("Unsqueeze", [s], "unsqueeze_out", "unsqueeze", axes=[0])
    else:
        s = node("Unsqueeze", [s, const("unsqueeze_axes", np.array([0], i64))], "unsqueeze_out", "unsqueeze")
    s = node("Concat", [s, const("concat_rest", np.array([-1], i64))], "concat_out", "concat", axis=0)
    if opset < 14:
        y = node("Reshape", [sq, s], "reshape_out", "reshape")
    else:
        y = node("Reshape", [sq, s], "reshape_out", "reshape", allowzero=1)
    nodes.append(helper.make_node("Gemm", [y, "fc.weight", "fc.bias"], ["logits"], name="fc",
                                  alpha=1.0, beta=1.0, transB=1))
    graph = helper.make_graph(
        nodes, "forms_opset%d" % opset,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 1, 12, 12])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])], inits)
    m = helper.make_model(graph, producer_name="tests/onnx/make_torch2_models.py",
                          opset_imports=[helper.make_opsetid("", opset)], ir_version=ir)
    path = os.path.join(MODELS, "forms_opset%d.onnx" % opset)
    onnx.save(m, path)
    check(path)
    return path


def forms_stats(x_nchw):
    """The fraction of conv2's outputs Clip clamps at 0 and at 6 (the test input must reach both)."""
    w = {k: torch.from_numpy(v) for k, v in forms_weights().items()}
    with torch.no_grad():
        y = F.relu(F.conv2d(torch.from_numpy(x_nchw), w["conv1.weight"], w["conv1.bias"], padding=1))
        y = F.avg_pool2d(F.pad(y, (1, 1, 1, 1)), 3, 1)
        y = F.conv2d(y, w["conv2.weight"], w["conv2.bias"])
    return float((y < 0).float().mean()), float((y > 6).float().mean())


# ---- the hostile external-data files --------------------------------------------------------------

EXT_OFFSET = 64


def ext_weights():
    rng = np.random.default_rng(1)
    return {
        "conv.weight": (rng.standard_normal((2, 1, 3, 3)) * 0.5).astype(np.float32),
        "conv.bias": np.array([0.1, -0.05], np.float32),
        "fc.weight": (rng.standard_normal((10, 2))).astype(np.float32),
        "fc.bias": (rng.standard_normal(10) * 0.1).astype(np.float32),
    }


def ext_model(location, offset=EXT_OFFSET, length=72, inline=False):
    w = ext_weights()
    inits = []
    for k, v in w.items():
        t = numpy_helper.from_array(v, k)
        if k == "conv.weight":
            if not inline:
                t.ClearField("raw_data")
            t.data_location = TensorProto.EXTERNAL
            for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
                e = t.external_data.add()
                e.key, e.value = key, value
        inits.append(t)
    nodes = [
        helper.make_node("Conv", ["input", "conv.weight", "conv.bias"], ["conv_out"], name="conv",
                         kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1]),
        helper.make_node("Relu", ["conv_out"], ["relu_out"], name="relu"),
        helper.make_node("GlobalAveragePool", ["relu_out"], ["gap_out"], name="gap"),
        helper.make_node("Flatten", ["gap_out"], ["flat_out"], name="flatten", axis=1),
        helper.make_node("Gemm", ["flat_out", "fc.weight", "fc.bias"], ["logits"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes, "ext", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 1, 4, 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])], inits)
    return helper.make_model(graph, producer_name="tests/onnx/make_torch2_models.py",
                             opset_imports=[helper.make_opsetid("", 13)], ir_version=7)


def make_ext():
    rng = np.random.default_rng(2)
    data = (rng.standard_normal(16).astype(np.float32).tobytes() + ext_weights()["conv.weight"].tobytes()
            + rng.standard_normal(6).astype(np.float32).tobytes())
    assert len(data) == 160 and data[EXT_OFFSET:EXT_OFFSET + 72] == ext_weights()["conv.weight"].tobytes()
    with open(os.path.join(BAD, "ext_data.bin"), "wb") as f:
        f.write(data)
    files = {
        "ext_ok": ext_model("ext_data.bin"),
        "ext_absolute": ext_model("/etc/passwd", offset=0),
        "ext_dotdot": ext_model("../ext_secret.bin", offset=0),
        "ext_dotdot_reentry": ext_model("../bad/ext_data.bin"),
        "ext_past_end": ext_model("ext_data.bin", offset=100),
        "ext_length": ext_model("ext_data.bin", length=68),
        "ext_missing": ext_model("ext_missing.bin"),
        "ext_inline": ext_model("ext_data.bin", inline=True),
    }
    for name, m in files.items():
        path = os.path.join(BAD, name + ".onnx")
        with open(path, "wb") as f:  # not onnx.save: it would write ext_inline's raw_data out
            f.write(m.SerializeToString())
        try:
            check(path)
            verdict = "accepted"
        except Exception as e:  # noqa: BLE001 (the checker's verdict is only printed)
            verdict = "refused: " + str(e).strip().splitlines()[0][:110]
        print("  bad/%s.onnx (%d bytes): onnx.checker %s" % (name, os.path.getsize(path), verdict))
    return os.path.join(BAD, "ext_ok.onnx")


def write_ort_ref(f, name, path, shape):
    """A train=0 group whose y_eval is ORT's output on the file (x NHWC as write_ref stores it)."""
    gen = torch.Generator().manual_seed(100 + len(f))
    x = torch.randn(N, *shape, generator=gen)
    labels = torch.randint(0, 10, (N,), generator=gen)
    g = f.create_group(name)
    g.attrs["train"] = 0
    g.create_dataset("x", data=nhwc(x).astype(np.float32))
    g.create_dataset("labels", data=labels.numpy().astype(np.int32))
    y = ort_run(path, x.numpy())
    g.create_dataset("y_eval", data=y.astype(np.float32))
    return g, x.numpy(), y


# ---- main ---------------------------------------------------------------------------------------

def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    for d in (MODELS, BAD, REF):
        os.makedirs(d, exist_ok=True)
    # the old generator's order: the same parameters and BN values as its files
    gen = torch.Generator().manual_seed(0)
    twins = {"fashion_cnn": FashionCNN(), "fashion_mlp": FashionMLP(), "res_cnn": ResCNN(),
             "mobilenet": MobileNetSmall(), "tiny_features": TinyFeatures()}
    for m in twins.values():
        randomize_bn(m, gen)
    print("torch %s, onnxscript %s, onnx %s, onnxruntime %s" % (torch.__version__, onnxscript.__version__,
                                                              onnx.__version__, ort.__version__))
    summary = {}
    tmp_ref = os.path.join(REF, "onnx2_ref.h5.tmp")
    with h5py.File(tmp_ref, "w") as f, tempfile.TemporaryDirectory(prefix="make_torch2_models.") as tmp:
        f.attrs["generator"] = b"tests/onnx/make_torch2_models.py"
        f.attrs["torch_version"] = str(torch.__version__).encode()
        f.attrs["onnxscript_version"] = str(onnxscript.__version__).encode()
        f.attrs["onnx_version"] = str(onnx.__version__).encode()
        f.attrs["onnxruntime_version"] = str(ort.__version__).encode()
        for base in ("fashion_cnn", "mobilenet"):
            for optimize in (False, True):
                name = "t2_" + base + ("_opt" if optimize else "")
                path = os.path.join(MODELS, name + ".onnx")
                external = name == "t2_mobilenet"
                exported = export2(twins[base], path, optimize, external)
                info = describe(path)
                check_initializers(path, exported, optimize)
                same_parameters(path, exported, base + ".onnx")
                write_ref(f, name, exported, train=not optimize)
                if name == "t2_fashion_cnn":  # the same x and parameters as onnx_ref.h5's fashion_cnn
                    with h5py.File(os.path.join(REF, "onnx_ref.h5"), "r") as old:
                        o, g = old["fashion_cnn"], f[name]
                        if np.array_equal(o["x"][...], g["x"][...]):
                            print("    y_train vs onnx_ref.h5's fashion_cnn (torch %s): %.2e of max |logit|" % (
                                old.attrs["torch_version"], rel_err(g["y_train"][...], o["y_train"][...])))
                summary[name] = info + (ort_checks(path, f[name], tmp),)
        print("forms:")
        ys = {}
        for opset in FORMS:
            path = forms_model(opset)
            name = os.path.basename(path)[:-5]
            info = describe(path)
            g, x, y = write_ort_ref(f, name, path, (1, 12, 12))
            ys[opset] = y
            # the same network in every opset: each file on the first file's input
            if opset != 11:
                expect_close("%s vs forms_opset11 on the same input" % name,
                             ort_run(path, f["forms_opset11"]["x"][...].transpose(0, 3, 1, 2)),
                             f["forms_opset11"]["y_eval"][...], tol=1e-6)
            # and what torch computes for it
            w = {k: torch.from_numpy(v) for k, v in forms_weights().items()}
            with torch.no_grad():
                t = F.relu(F.conv2d(torch.from_numpy(x), w["conv1.weight"], w["conv1.bias"], padding=1))
                t = F.avg_pool2d(F.pad(t, (1, 1, 1, 1)), 3, 1)
                t = torch.clamp(F.conv2d(t, w["conv2.weight"], w["conv2.bias"]), 0, 6).mean((2, 3))
                t = F.linear(t, w["fc.weight"], w["fc.bias"])
            err = expect_close("%s ORT (reference) vs torch" % name, y, t.numpy())
            summary[name] = info + ({"torch": err},)
        lo, hi = forms_stats(f["forms_opset11"]["x"][...].transpose(0, 3, 1, 2))
        print("  forms: conv2 outputs clamped by Clip: %.0f%% at 0, %.0f%% at 6" % (100 * lo, 100 * hi))
        assert lo > 0.05 and hi > 0.05, (lo, hi)
        print("external data:")
        ok = make_ext()
        g, x, y = write_ort_ref(f, "ext_ok", ok, (1, 4, 4))
        w = {k: torch.from_numpy(v) for k, v in ext_weights().items()}
        with torch.no_grad():
            t = F.relu(F.conv2d(torch.from_numpy(x), w["conv.weight"], w["conv.bias"], padding=1)).mean((2, 3))
            t = F.linear(t, w["fc.weight"], w["fc.bias"])
        expect_close("ext_ok ORT (reference) vs torch", y, t.numpy())
    os.replace(tmp_ref, os.path.join(REF, "onnx2_ref.h5"))
    print("summary (IR, opset, nodes, ORT relative errors):")
    for name, (ir, opset, ops, errs) in summary.items():
        print("  %-20s IR %2d opset %2d %3d nodes  %s" % (name, ir, opset, sum(ops.values()),
                                                         "  ".join("%s %.2e" % kv for kv in errs.items())))
    total = 0
    for d in (MODELS, BAD, REF):
        for fn in sorted(os.listdir(d)):
            if fn.startswith(("t2_", "forms_", "ext_", "onnx2_")):
                size = os.path.getsize(os.path.join(d, fn))
                total += size
                print("  %s/%s: %d bytes" % (os.path.basename(d), fn, size))
    print("  total %d bytes" % total)


if __name__ == "__main__":
    main()
