#!/usr/bin/python3
"""Writes variants of tests/onnx/models/vit.onnx and mha_vit.onnx (run at test time by tests/onnx/test_onnx_errors.sh
with Debian's python3-onnx; no torch). Three the importer must refuse:
  vit_scale.onnx         the first attention's scores scaled by 0.5, not 1 / sqrt(head size)
  vit_softmax_axis.onnx  the first attention's Softmax over axis 2, not the last
  vit_mean_keepdims.onnx the mean of the tokens with keepdims 1 ([N, 1, C])
two variants of mha_vit.onnx (nn.MultiheadAttention) it must refuse:
  mha_pack_perm.onnx     the first packed projections Transpose'd [3, 2, 1, 0, 4], not [3, 1, 2, 0, 4]
  mha_gather3.onnx       the first Gather of q, k or v taking index 3 of the packed [3, T, N, C]
and two of mha_vit_cls.onnx (torchvision's ViT):
  mha_cls_after.onnx     the class token Concat'ed after the tokens, not before
  mha_token1.onnx        the head reading token 1 (Gather index 1), not the class token
and one it must import as vit.onnx itself:
  vit_transposed.onnx    every MatMul weight W stored transposed and read through Transpose(W^T), as
                         torch's exporter writes a linear layer of tokens without constant folding
Usage: make_bad_vit.py OUT_DIR"""
import os
import sys

import numpy as np
import onnx
from onnx import helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))


def first(model, op_type):
    return next(n for n in model.graph.node if n.op_type == op_type)


def set_attr(node, name, value):
    for a in list(node.attribute):
        if a.name == name:
            node.attribute.remove(a)
    node.attribute.append(helper.make_attribute(name, value))


def scaled(model):
    softmax = first(model, "Softmax")
    mul = next(n for n in model.graph.node if n.output[0] == softmax.input[0])
    const = next(n for n in model.graph.node if n.output and n.output[0] in mul.input and n.op_type == "Constant")
    set_attr(const, "value", numpy_helper.from_array(np.array(0.5, dtype=np.float32)))


def transposed(model):
    inits = {t.name: t for t in model.graph.initializer}
    nodes = []
    for n in model.graph.node:
        if n.op_type == "MatMul" and n.input[1] in inits:
            t = inits[n.input[1]]
            wt = numpy_helper.to_array(t).T.copy()
            t.CopyFrom(numpy_helper.from_array(wt, t.name + "_t"))
            out = t.name + "_back"
            nodes.append(helper.make_node("Transpose", [t.name], [out], name=n.name + "_weight_T", perm=[1, 0]))
            n.input[1] = out
        nodes.append(n)
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def pack_transpose(model):
    return next(n for n in model.graph.node
                if n.op_type == "Transpose" and list(helper.get_attribute_value(n.attribute[0])) == [3, 1, 2, 0, 4])


def pack_perm(model):
    set_attr(pack_transpose(model), "perm", [3, 2, 1, 0, 4])


def gather3(model):
    t = pack_transpose(model)
    squeeze = next(n for n in model.graph.node if n.op_type == "Squeeze" and n.input[0] == t.output[0])
    g = next(n for n in model.graph.node if n.op_type == "Gather" and n.input[0] == squeeze.output[0])
    model.graph.initializer.append(numpy_helper.from_array(np.array(3, dtype=np.int64), "index_3"))
    g.input[1] = "index_3"


def cls_after(model):
    cat = next(n for n in model.graph.node if n.op_type == "Concat" and "Expand" in n.input[0])
    cat.input[0], cat.input[1] = cat.input[1], cat.input[0]


def token1(model):
    g = next(n for n in model.graph.node if n.op_type == "Gather" and "LayerNormalization" in n.input[0])
    model.graph.initializer.append(numpy_helper.from_array(np.array(1, dtype=np.int64), "index_1"))
    g.input[1] = "index_1"


def main():
    out = sys.argv[1]
    for name, src, edit in (("mha_pack_perm", "mha_vit", pack_perm), ("mha_gather3", "mha_vit", gather3),
                            ("mha_cls_after", "mha_vit_cls", cls_after), ("mha_token1", "mha_vit_cls", token1)):
        model = onnx.load(os.path.join(HERE, "models", src + ".onnx"))
        edit(model)
        onnx.save(model, os.path.join(out, name + ".onnx"))
        print("wrote %s" % os.path.join(out, name + ".onnx"))
    edits = {"vit_scale": scaled,
             "vit_softmax_axis": lambda m: set_attr(first(m, "Softmax"), "axis", 2),
             "vit_mean_keepdims": lambda m: set_attr(first(m, "ReduceMean"), "keepdims", 1),
             "vit_transposed": transposed}
    for name, edit in edits.items():
        model = onnx.load(os.path.join(HERE, "models", "vit.onnx"))
        edit(model)
        onnx.save(model, os.path.join(out, name + ".onnx"))
        print("wrote %s" % os.path.join(out, name + ".onnx"))


if __name__ == "__main__":
    main()
