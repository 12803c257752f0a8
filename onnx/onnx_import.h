/* ONNX import: an fp32 ONNX model (as torch.onnx.export writes it: torch 1.13's TorchScript
 * exporter, IR 6-8, opsets 11-17; torch 2.x's exporter, IR 10, opsets 18-20; eval or training
 * export; IR 6-10 and opsets 11-22 are read) becomes a graph IR (nn/nn.h) with its initializers as
 * the parameters and BN buffers, so that every later step (training, PTQ, QAT, convert, check,
 * lowering, report) runs on it unchanged. The file is parsed by protobuf-c over Debian's
 * onnx.proto (libonnx-dev), with C code generated at build time; nothing here decodes protobuf by
 * hand. Initializers may keep their bytes in a side file (ONNX external data, as torch 2.x
 * writes "model.onnx.data"): read from the model's directory only (import_external.c).
 *
 * Ops: Conv (groups, depthwise; strides; symmetric pads; dilation 1), BatchNormalization, Relu,
 * Clip(0, 6) as relu6 (Clip(0, inf) as relu), MaxPool, AveragePool (a zero Pad before it or
 * before a Conv is folded into its padding, as PyTorch exports AvgPool2d), GlobalAveragePool and
 * ReduceMean over H and W, Flatten, Squeeze of a pooled [N, C, 1, 1], the Reshape that
 * x.view(n, -1) exports, Gemm, MatMul (+ Add of a bias), Add of two activations (residual),
 * Identity (dropped), Dropout (a dropout node where it drops in training: a ratio above 0 and,
 * from opset 12, training_mode true; else dropped). Constants and the shape arithmetic
 * exporters write (Constant, Shape, Gather, Unsqueeze, Squeeze, Concat, Expand, Cast, CastLike,
 * Reshape of a shape) are evaluated at import; torch 2.x's all-zero bias of a Conv without one is
 * dropped. Where an op's form changed between opsets (axes as an attribute or an input in
 * ReduceMean, Squeeze, Unsqueeze and Pad), both are read. Anything else, and attributes the IR
 * cannot express (dilation 2, ceil_mode 1, auto_pad other than NOTSET, asymmetric pads,
 * non-square pools, count_include_pad 0 with padding), is refused before the graph is built,
 * naming the node, its op type and the model's opset.
 *
 * Layout: ONNX activations are NCHW, the graph's NHWC. Conv weights are OIHW in both; a linear
 * layer reading a flattened image (H x W x C with H*W > 1 and C > 1) gets its weight columns
 * permuted from PyTorch's (c, h, w) order to the graph's (h, w, c) order, so the imported model
 * computes what PyTorch computes. A Gemm with transB = 0 and a MatMul get their weight
 * transposed to (OUT, IN).
 *
 * Names: a layer is named after its weight ("conv1.weight" -> node "conv1"), other nodes after
 * PyTorch's scope ("/block1/relu2/Relu" -> "block1.relu2"), so tensor names are PyTorch's
 * state_dict names and quant.layer_overrides can name the PyTorch modules. The graph is named
 * after the file ("models/mobilenet.onnx" -> "mobilenet"): checkpoints record that name. */
#ifndef QT_ONNX_IMPORT_H
#define QT_ONNX_IMPORT_H

#include "nn/nn.h"

/* What the import found, for reports and error messages. */
typedef struct {
  int64_t ir_version, opset;
  char producer[64];            /* producer name and version, e.g. "pytorch 1.13.1" */
  char input_name[QT_NAME_LEN]; /* the ONNX graph input */
  char input_decl[128];         /* its declared shape, e.g. "[batch, 1, 28, 28] (NCHW)" */
  int dynamic_dims;             /* C, H or W given by a dim_param (resolved from the data's shape) */
  int needs_shape;              /* set on failure: dynamic dims and no data shape given */
  int dropped;                  /* Identity nodes and Dropouts that drop nothing in training, dropped */
  int dropouts;                 /* Dropouts that drop in training: dropout nodes of the graph */
  int folded;                   /* Pad nodes folded into a Conv / AveragePool, Adds folded into MatMul */
  int permuted;                 /* linear weights whose columns were permuted to NHWC order */
  int nodes;                    /* ONNX nodes read */
  int convs, batch_norms;       /* Conv and BatchNormalization nodes (none: the exporter folded BN) */
  int layer_norms;              /* LayerNormalization nodes (a transformer: no BN by design) */
  int external;                 /* initializers read from external data files */
} qt_onnx_info;

/* Imports the ONNX model at path. data_hwc (may be NULL) is the data's image shape (H, W, C),
 * used for input dims the model leaves dynamic (a dim_param); without it such a model is refused
 * with info->needs_shape set. The batch dim is the batch whatever it declares. Returns the
 * finalized graph holding the initializers (no random initialization), or NULL with err
 * ("onnx: <path>: node '<name>' (<OpType>, opset <n>): <what>"). info may be NULL. */
qt_graph *qt_onnx_import(const char *path, const int *data_hwc, qt_onnx_info *info, char *err);

/* The graph name an import of path gets: its file name without directory and ".onnx", with
 * characters outside [A-Za-z0-9_.-] replaced by '_' (at most QT_NAME_LEN - 1 characters). */
void qt_onnx_graph_name(const char *path, char *name, size_t n);

#endif
