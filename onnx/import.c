/* ONNX import (onnx_import.h): the protobuf is parsed by the protobuf-c code generated from
 * Debian's onnx.proto; the importer walks the parsed model, checks every node against what the
 * graph IR can express and builds the graph with the nn builder. This file holds the model level;
 * import_int.h lists the other parts. */
#define _GNU_SOURCE /* hsearch_r: glibc's reentrant hash tables */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx/import_int.h"
#include "base/base.h"
#include "onnx/wire.h"

#define ONNX_MAX_BYTES ((long)1 << 30)
#define ONNX_MAX_DEPTH 64          /* nested messages (a real model: under 10) */
#define ONNX_MAX_MESSAGES 2000000L /* nodes, attributes, tensors, value infos, ... in all */

/* ---- the model ------------------------------------------------------------------------------- */

static const qt_imp_op *op_lookup(const char *op) {
  const qt_imp_op *tables[] = {qt_imp_layer_ops, qt_imp_elementwise_ops, qt_imp_shape_ops, qt_imp_tokens_ops};
  for (size_t k = 0; k < sizeof tables / sizeof tables[0]; k++)
    for (const qt_imp_op *row = tables[k]; row->op; row++)
      if (strcmp(row->op, op) == 0) return row;
  return NULL;
}

/* The file's bytes (malloc'd), or NULL with err. */
static uint8_t *read_file(imp *im, size_t *len) {
  FILE *f = fopen(im->path, "rb");
  if (!f) return qt_imp_file_err(im, "cannot open: %s", strerror(errno)), NULL;
  uint8_t *buf = NULL;
  long size = -1;
  if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
  if (size < 0 || fseek(f, 0, SEEK_SET) != 0) {
    fclose(f);
    return qt_imp_file_err(im, "cannot read (not a regular file?)"), NULL;
  }
  if (size == 0 || size > ONNX_MAX_BYTES) {
    fclose(f);
    return qt_imp_file_err(im, "%ld bytes: not an ONNX model (empty, or larger than 1 GiB)", size), NULL;
  }
  buf = malloc((size_t)size);
  QT_ASSERT(buf, "out of memory reading %ld bytes", size);
  if (fread(buf, 1, (size_t)size, f) != (size_t)size) {
    fclose(f);
    free(buf);
    return qt_imp_file_err(im, "read error: %s", strerror(errno)), NULL;
  }
  fclose(f);
  *len = (size_t)size;
  return buf;
}

/* ir_version, the default domain's opset, one graph with one input and one output; every node's
 * op type supported (before any graph is built). */
static int check_model(imp *im, const Onnx__ModelProto *m) {
  if (!m->has_ir_version || !m->graph)
    return qt_imp_file_err(im, "not an ONNX model (no %s): a truncated file or another format?",
                           !m->has_ir_version ? "ir_version" : "graph");
  im->info->ir_version = m->ir_version;
  snprintf(im->info->producer, sizeof im->info->producer, "%s %s", str(m->producer_name), str(m->producer_version));
  int64_t opset = -1;
  for (size_t i = 0; i < m->n_opset_import; i++) {
    const Onnx__OperatorSetIdProto *o = m->opset_import[i];
    if ((!o->domain || !o->domain[0] || strcmp(o->domain, "ai.onnx") == 0) && o->has_version) opset = o->version;
  }
  im->opset = im->info->opset = opset;
  if (m->ir_version < 6 || m->ir_version > 10)
    return qt_imp_file_err(im, "IR version %lld is not supported (6 to 10: PyTorch 1.13 writes 6 to 8, PyTorch 2.x 10)",
                           (long long)m->ir_version);
  if (opset < 11 || opset > 22)
    return qt_imp_file_err(im, "opset %lld of the default domain is not supported (11 to 22)", (long long)opset);
  const Onnx__GraphProto *gp = m->graph;
  im->gp = gp;
  for (size_t i = 0; i < gp->n_node; i++) {
    const Onnx__NodeProto *n = gp->node[i];
    im->node = n;
    im->node_index = (int)i;
    if (n->domain && n->domain[0] && strcmp(n->domain, "ai.onnx") != 0)
      return qt_imp_node_err(im, "domain '%s' is not supported (only the default ONNX domain)", n->domain);
    if (!n->op_type || !op_lookup(n->op_type))
      return qt_imp_node_err(im,
                             "op type not supported (supported: Conv, BatchNormalization, Relu, Clip(0, 6), "
                             "Sigmoid, Tanh, HardSigmoid, HardSwish, LeakyRelu, Elu, Gelu (or Div, Erf, Add, Mul, "
                             "Mul), Mul of two activations, MaxPool, AveragePool, GlobalAveragePool, ReduceMean "
                             "(over H and W), Flatten, Reshape (flatten; a channel shuffle's with Transpose), "
                             "Squeeze, Gemm, MatMul, Add, Concat, Split and Slice of channels, Identity, Dropout, "
                             "LayerNormalization, multi-head attention (MatMul, Softmax, Transpose, Reshape), "
                             "Pad (zeros before Conv / AveragePool), and Constant / Shape / Gather / Unsqueeze / "
                             "Squeeze / Concat / Expand / Cast / CastLike / Reshape / Add / Sub / Mul / Div "
                             "computing constants and shapes)");
    const qt_imp_op *row = op_lookup(n->op_type);
    if (n->n_input < (size_t)row->min_in || n->n_input > (size_t)row->max_in)
      return qt_imp_node_err(im, "%zu inputs; %s takes %d to %d", n->n_input, row->op, row->min_in, row->max_in);
    if (n->n_output < (size_t)row->min_out || n->n_output > (size_t)row->max_out)
      return qt_imp_node_err(im, "%zu outputs; %s gives %d to %d", n->n_output, row->op, row->min_out, row->max_out);
    if (n->n_output < 1 || !n->output[0] || !n->output[0][0]) return qt_imp_node_err(im, "no output");
    im->info->convs += strcmp(n->op_type, "Conv") == 0;
    im->info->batch_norms += strcmp(n->op_type, "BatchNormalization") == 0;
    im->info->layer_norms += strcmp(n->op_type, "LayerNormalization") == 0;
  }
  if (gp->n_output != 1)
    return qt_imp_file_err(im, "graph '%s' has %zu outputs; one (the logits) is supported", str(gp->name),
                           gp->n_output);
  for (size_t i = 0; i < gp->n_input; i++)
    if (!gp->input[i]->name || !gp->input[i]->name[0]) return qt_imp_file_err(im, "graph input %zu has no name", i);
  if (!gp->output[0]->name || !gp->output[0]->name[0]) return qt_imp_file_err(im, "the graph output has no name");
  return 0;
}

/* The graph input: the one input that is not an initializer; NCHW float32. */
static int make_input(imp *im, const int *data_hwc) {
  const Onnx__GraphProto *gp = im->gp;
  const Onnx__ValueInfoProto *in = NULL;
  for (size_t i = 0; i < gp->n_input; i++) {
    const sym *s = qt_imp_find(im, str(gp->input[i]->name));
    if (s && s->kind == S_CONST) continue;
    if (in)
      return qt_imp_file_err(im, "graph inputs '%s' and '%s': one image input is supported", str(in->name),
                             str(gp->input[i]->name));
    in = gp->input[i];
  }
  if (!in) return qt_imp_file_err(im, "the graph has no input (other than initializers)");
  qt_onnx_info *info = im->info;
  snprintf(info->input_name, sizeof info->input_name, "%s", str(in->name));
  const Onnx__TypeProto *tp = in->type;
  if (!tp || tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !tp->tensor_type)
    return qt_imp_file_err(im, "input '%s' is not a tensor", str(in->name));
  const Onnx__TypeProto__Tensor *tt = tp->tensor_type;
  if (tt->elem_type != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT)
    return qt_imp_file_err(im, "input '%s' has element type %d; float32 (1) is supported", str(in->name),
                           (int)tt->elem_type);
  if (!tt->shape || tt->shape->n_dim != 4)
    return qt_imp_file_err(im, "input '%s' has %s; an image input (N, C, H, W) is supported", str(in->name),
                           tt->shape ? "another rank" : "no shape");
  int64_t dims[4];
  size_t k = (size_t)snprintf(info->input_decl, sizeof info->input_decl, "[");
  const char *dyn_names[3] = {0};
  for (int d = 0; d < 4; d++) {
    const Onnx__TensorShapeProto__Dimension *dim = tt->shape->dim[d];
    if (dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE && dim->dim_value < 0)
      return qt_imp_file_err(im, "input '%s': dimension %d is %lld (negative)", str(in->name), d,
                             (long long)dim->dim_value);
    const int fixed = dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE && dim->dim_value > 0;
    dims[d] = fixed ? dim->dim_value : -1;
    const char *p = dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM && dim->dim_param
                        ? dim->dim_param
                        : "?";
    if (fixed)
      k += (size_t)snprintf(info->input_decl + k, k < sizeof info->input_decl ? sizeof info->input_decl - k : 0,
                            "%s%lld", d ? ", " : "", (long long)dims[d]);
    else
      k += (size_t)snprintf(info->input_decl + k, k < sizeof info->input_decl ? sizeof info->input_decl - k : 0, "%s%s",
                            d ? ", " : "", p);
    if (d > 0 && !fixed) dyn_names[d - 1] = p;
  }
  if (k < sizeof info->input_decl) snprintf(info->input_decl + k, sizeof info->input_decl - k, "] (NCHW)");
  im->static_batch = dims[0] > 0 ? dims[0] : 0;
  const int want[3] = {data_hwc ? data_hwc[2] : 0, data_hwc ? data_hwc[0] : 0, data_hwc ? data_hwc[1] : 0};
  for (int d = 1; d < 4; d++)
    if (dims[d] < 0) {
      im->dynamic = info->dynamic_dims = 1;
      if (!data_hwc || want[d - 1] < 1) {
        info->needs_shape = 1;
        return qt_imp_file_err(im, "input '%s' %s has a dynamic %s ('%s'); its size must come from the data",
                               str(in->name), info->input_decl,
                               d == 1   ? "channel count"
                               : d == 2 ? "height"
                                        : "width",
                               dyn_names[d - 1]);
      }
      dims[d] = want[d - 1];
    }
  if (dims[1] > 64 || dims[2] > 65536 || dims[3] > 65536)
    return qt_imp_file_err(im, "input '%s' %s is too large", str(in->name), info->input_decl);
  char name[QT_NAME_LEN];
  qt_imp_sanitize(str(in->name), name, sizeof name);
  if (!name[0]) snprintf(name, sizeof name, "input");
  const int v = qt_graph_input(im->g, name, (int)dims[2], (int)dims[3], (int)dims[1]);
  if (v < 0) return qt_imp_file_err(im, "input '%s': %s", str(in->name), im->g->error);
  qt_imp_add_sym(im, in->name, S_ACT)->value = v;
  return 0;
}

/* Copies (and converts) every parameter into the finalized graph's slabs. */
static void copy_params(imp *im) {
  for (int i = 0; i < im->n_copies; i++) {
    const param_copy *c = &im->copies[i];
    const qt_param *p = &im->g->tensors[c->tensor];
    float *dst = qt_graph_tensor_data(im->g, c->tensor);
    float *src = malloc((size_t)p->numel * sizeof(float));
    QT_ASSERT(src, "out of memory");
    qt_imp_float_data(c->src, src, p->numel);
    if (c->kind == COPY_TRANSPOSE) { /* (IN, OUT) -> (OUT, IN) */
      const int64_t OUT = p->shape[0], IN = p->shape[1];
      for (int64_t o = 0; o < OUT; o++)
        for (int64_t k = 0; k < IN; k++) dst[o * IN + k] = src[k * OUT + o];
    } else {
      memcpy(dst, src, (size_t)p->numel * sizeof(float));
    }
    if (c->perm_c) { /* each row: PyTorch's (c, h, w) flatten order -> the graph's (h, w, c) */
      const int64_t H = c->perm_h, W = c->perm_w, C = c->perm_c, IN = H * W * C, OUT = p->numel / IN;
      for (int64_t o = 0; o < OUT; o++) {
        memcpy(src, dst + o * IN, (size_t)IN * sizeof(float));
        for (int64_t h = 0; h < H; h++)
          for (int64_t w = 0; w < W; w++)
            for (int64_t ch = 0; ch < C; ch++) dst[o * IN + (h * W + w) * C + ch] = src[ch * H * W + h * W + w];
      }
    }
    free(src);
  }
}

static qt_graph *import_graph(imp *im, const int *data_hwc) {
  const Onnx__GraphProto *gp = im->gp;
  im->cap_syms = (int)(gp->n_initializer + gp->n_input + 2 * gp->n_node + 8);
  for (size_t i = 0; i < gp->n_node; i++) im->cap_syms += (int)gp->node[i]->n_output;
  im->syms = calloc((size_t)im->cap_syms, sizeof *im->syms);
  QT_ASSERT(im->syms, "out of memory");
  /* room for every symbol, and for a memo per ONNX node's name */
  QT_ASSERT(hcreate_r(2 * (size_t)im->cap_syms, &im->sym_index) && hcreate_r(2 * gp->n_node + 64, &im->next_suffix),
            "out of memory");
  if (qt_imp_load_external(im)) return NULL;
  for (size_t i = 0; i < gp->n_initializer; i++) {
    const Onnx__TensorProto *t = gp->initializer[i];
    if (!t->name || !t->name[0]) return qt_imp_file_err(im, "initializer %zu has no name", i), NULL;
    if (qt_imp_find(im, t->name)) return qt_imp_file_err(im, "initializer '%s' is defined twice", t->name), NULL;
    for (size_t d = 0; d < t->n_dims; d++)
      if (t->dims[d] < 0)
        return qt_imp_file_err(im, "initializer '%s': dimension %zu is %lld (negative)", t->name, d,
                               (long long)t->dims[d]),
               NULL;
    qt_imp_add_sym(im, t->name, S_CONST)->t = t;
  }
  char gname[QT_NAME_LEN];
  qt_onnx_graph_name(im->path, gname, sizeof gname);
  im->g = qt_graph_create(gname);
  if (make_input(im, data_hwc)) return NULL;
  im->absorbed = calloc(gp->n_node + 1, 1);
  QT_ASSERT(im->absorbed, "out of memory");
  for (size_t i = 0; i < gp->n_node; i++) {
    im->node = gp->node[i];
    im->node_index = (int)i;
    im->info->nodes++;
    if (im->absorbed[i]) continue;
    if (op_lookup(im->node->op_type)->fn(im)) return NULL;
  }
  const char *out_name = str(gp->output[0]->name);
  const sym *out = qt_imp_find(im, out_name);
  if (!out || out->kind != S_ACT)
    return qt_imp_file_err(im, "the graph output '%s' is %s", out_name,
                           out ? kind_text(out) : "not computed by any node"),
           NULL;
  if (is_image(im, out))
    return qt_imp_file_err(im,
                           "the graph output '%s' is an image (N, C, H, W); a classifier's (N, classes) output is "
                           "supported (Flatten it)",
                           out_name),
           NULL;
  if (out->perm_c)
    return qt_imp_file_err(im,
                           "the graph output '%s' is a flattened image, whose order in the graph IR (h, w, c) differs "
                           "from PyTorch's (c, h, w)",
                           out_name),
           NULL;
  if (qt_graph_finalize(im->g, out->value, im->err)) return NULL;
  copy_params(im);
  return im->g;
}

qt_graph *qt_onnx_import(const char *path, const int *data_hwc, qt_onnx_info *info, char *err) {
  qt_onnx_info local;
  if (!info) info = &local;
  memset(info, 0, sizeof *info);
  imp im = {.path = path, .err = err, .info = info};
  size_t len = 0;
  uint8_t *buf = read_file(&im, &len);
  if (!buf) return NULL;
  char what[256];
  if (qt_onnx_wire_check(buf, len, &onnx__model_proto__descriptor, ONNX_MAX_DEPTH, ONNX_MAX_MESSAGES, what,
                         sizeof what)) {
    free(buf);
    qt_imp_file_err(&im, "not a readable ONNX model: %s", what);
    return NULL;
  }
  Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, len, buf);
  free(buf);
  if (!m) {
    qt_imp_file_err(&im,
                    "not a readable ONNX model (the protobuf does not parse: a truncated file or another format?)");
    return NULL;
  }
  qt_graph *g = NULL;
  if (check_model(&im, m) == 0) g = import_graph(&im, data_hwc);
  if (!g) qt_graph_free(im.g);
  qt_imp_free_external(&im);
  onnx__model_proto__free_unpacked(m, NULL);
  free(im.syms);
  hdestroy_r(&im.sym_index);
  hdestroy_r(&im.next_suffix);
  for (int i = 0; i < im.n_suffix_keys; i++) free(im.suffix_keys[i]);
  QT_FREE_ALL(im.suffix_keys, im.copies, im.absorbed);
  for (int i = 0; i < im.n_made; i++) QT_FREE_ALL(im.made[i]->dims, im.made[i]->raw_data.data, im.made[i]);
  free(im.made);
  return g;
}