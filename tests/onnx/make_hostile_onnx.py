#!/usr/bin/env python3
"""Writes hostile ONNX files that test_onnx_errors.sh gives the importer (into its temporary
folder, at test time), as raw protobuf bytes (the standard library only: onnx's own serializer
recurses, and these files are made to be deeper than a recursive parser survives; protobuf-c's
unpack ran out of stack on both, exit 139):

- nest.onnx: a graph whose node's attribute holds a graph whose node's attribute holds a graph ...
  100,000 messages deep (GraphProto.node -> NodeProto.attribute -> AttributeProto.g), 0.9 MB;
- seq_nest.onnx: a graph input of type Sequence(Sequence(... 100,000 deep ...)) (TypeProto
  sequence_type -> Sequence.elem_type), 0.8 MB;
- unnamed_input.onnx: a valid model (IR 8, opset 13, Relu) whose graph input has no name field;
- relu_100000.onnx: 100,000 Relu nodes in a chain, each named apart, whose output is the image
  itself (refused only after every node is built: a classifier's output is (N, classes)), 3 MB;
- relu_same_8000.onnx: the same with 8,000 Relu nodes that all have the name "r" (the importer
  names each IR node apart: r, r_2, r_3, ...);
- many_inputs.onnx: a Relu with 10,000 inputs; dup_init.onnx: two initializers named "w";
  neg_dims.onnx: an initializer with dimension -1; escape_name.onnx: a node (of an op the
  importer refuses) named with a terminal escape sequence; mul_const.onnx: Mul(x, w) by an
  initializer (a Mul of an activation by a constant tensor); div_one.onnx: 1 / x, a Div of a
  constant by an activation; concat_h.onnx: Concat(x, x) along H (axis 2); transpose_hw.onnx: a
  Transpose of H and W; split_h.onnx: a Split along H; avgpool_ceil.onnx: AveragePool(3, 2) in
  ceil mode; resize_one.onnx: a Resize by scales [1, 1, 1, 1].

Usage: python3 tests/onnx/make_hostile_onnx.py OUT_DIR
"""
import os
import sys


def varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_bytes(number, payload):
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def field_int(number, v):
    return varint(number << 3) + varint(v)


def string(number, s):
    return field_bytes(number, s.encode())


def opset(version):
    return field_bytes(8, field_int(2, version))  # ModelProto.opset_import: OperatorSetIdProto.version


def tensor_type_4d():
    """TypeProto.tensor_type (1): elem_type float (1), shape [1, 1, 28, 28]."""
    dims = b"".join(field_bytes(1, field_int(1, d)) for d in (1, 1, 28, 28))  # Dimension.dim_value
    return field_bytes(1, field_int(1, 1) + field_bytes(2, dims))


def model(graph):
    return field_int(1, 8) + field_bytes(7, graph) + opset(13)  # ir_version 8, graph, opset 13


def nest(depth):
    g = string(2, "inner")
    for _ in range(depth // 3):
        attr = string(1, "body") + field_int(20, 5) + field_bytes(6, g)  # AttributeProto name, type GRAPH, g
        node = string(4, "If") + field_bytes(5, attr)                   # NodeProto op_type, attribute
        g = field_bytes(1, node) + string(2, "g")                       # GraphProto node, name
    return model(g)


def seq_nest(depth):
    t = tensor_type_4d()
    for _ in range(depth):
        t = field_bytes(4, field_bytes(1, t))  # TypeProto.sequence_type { elem_type }
    vi = string(1, "x") + field_bytes(2, t)
    out = string(1, "y") + field_bytes(2, tensor_type_4d())
    node = string(1, "x") + string(2, "y") + string(4, "Relu")
    return model(field_bytes(1, node) + string(2, "g") + field_bytes(11, vi) + field_bytes(12, out))


def unnamed_input():
    vi = field_bytes(2, tensor_type_4d())  # ValueInfoProto without its name field
    out = string(1, "y") + field_bytes(2, tensor_type_4d())
    node = string(1, "x") + string(2, "y") + string(4, "Relu")
    return model(field_bytes(1, node) + string(2, "g") + field_bytes(11, vi) + field_bytes(12, out))


def relu_chain(n, same_name):
    nodes = b"".join(field_bytes(1, string(1, "t%d" % i) + string(2, "t%d" % (i + 1) if i < n - 1 else "y") +
                                 string(3, "r" if same_name else "r%d" % i) + string(4, "Relu"))
                     for i in range(n))
    vi = string(1, "t0") + field_bytes(2, tensor_type_4d())
    out = string(1, "y") + field_bytes(2, tensor_type_4d())
    return model(nodes + string(2, "g") + field_bytes(11, vi) + field_bytes(12, out))


def relu_model(node_fields, initializers=b""):
    """The valid frame around one node: input x [1, 1, 28, 28], output y."""
    vi = string(1, "x") + field_bytes(2, tensor_type_4d())
    out = string(1, "y") + field_bytes(2, tensor_type_4d())
    return model(field_bytes(1, node_fields) + string(2, "g") + initializers + field_bytes(11, vi) +
                 field_bytes(12, out))


def attr_int(name, v):
    """NodeProto.attribute (5): AttributeProto name (1), i (3), type INT (20: 2)."""
    return field_bytes(5, string(1, name) + field_int(3, v) + field_int(20, 2))


def attr_ints(name, vs):
    """NodeProto.attribute (5): AttributeProto name (1), ints (8, packed; each < 128), type INTS (20: 7)."""
    return field_bytes(5, string(1, name) + field_bytes(8, bytes(vs)) + field_int(20, 7))


def initializer(name, dims):
    """TensorProto: dims (1), data_type float (2), name (8), float_data (4, packed)."""
    n = 1
    for d in dims:
        n *= max(d, 0)
    packed = b"".join(b"\x00\x00\x80\x3f" for _ in range(n))  # 1.0f
    t = b"".join(field_int(1, d & 0xFFFFFFFFFFFFFFFF) for d in dims) + field_int(2, 1) + string(8, name)
    return field_bytes(5, t + field_bytes(4, packed))  # GraphProto.initializer


def main():
    out = sys.argv[1]
    for name, data in (("nest.onnx", nest(100000)), ("seq_nest.onnx", seq_nest(100000)),
                       ("unnamed_input.onnx", unnamed_input()), ("relu_100000.onnx", relu_chain(100000, False)),
                       ("relu_same_8000.onnx", relu_chain(8000, True)),
                       ("many_inputs.onnx", relu_model(b"".join(string(1, "x") for _ in range(10000)) +
                                                       string(2, "y") + string(4, "Relu"))),
                       ("dup_init.onnx", relu_model(string(1, "x") + string(2, "y") + string(4, "Relu"),
                                                    initializer("w", [2]) + initializer("w", [2]))),
                       ("neg_dims.onnx", relu_model(string(1, "x") + string(2, "y") + string(4, "Relu"),
                                                    initializer("w", [-1]))),
                       ("escape_name.onnx", relu_model(string(1, "x") + string(2, "y") +
                                                       string(3, "\x1b[31mred\x1b[0m") + string(4, "Softplus"))),
                       ("mul_const.onnx", relu_model(string(1, "x") + string(1, "w") + string(2, "y") +
                                                     string(3, "scale") + string(4, "Mul"),
                                                     initializer("w", [2]))),
                       ("div_one.onnx", relu_model(string(1, "one") + string(1, "x") + string(2, "y") +
                                                   string(3, "div") + string(4, "Div"), initializer("one", []))),
                       ("concat_h.onnx", relu_model(string(1, "x") + string(1, "x") + string(2, "y") +
                                                    string(3, "cat") + string(4, "Concat") + attr_int("axis", 2))),
                       ("transpose_hw.onnx", relu_model(string(1, "x") + string(2, "y") + string(3, "swap") +
                                                        string(4, "Transpose") + attr_ints("perm", [0, 1, 3, 2]))),
                       ("split_h.onnx", relu_model(string(1, "x") + string(2, "y") + string(2, "z") +
                                                   string(3, "halves") + string(4, "Split") + attr_int("axis", 2))),
                       ("avgpool_ceil.onnx", relu_model(string(1, "x") + string(2, "y") + string(3, "pool") +
                                                        string(4, "AveragePool") + attr_ints("kernel_shape", [3, 3]) +
                                                        attr_ints("strides", [2, 2]) + attr_int("ceil_mode", 1))),
                       ("resize_one.onnx", relu_model(string(1, "x") + string(1, "") + string(1, "s") + string(2, "y") +
                                                      string(3, "up") + string(4, "Resize"), initializer("s", [4])))):
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
        print("wrote %s (%d bytes)" % (os.path.join(out, name), len(data)))


if __name__ == "__main__":
    main()
