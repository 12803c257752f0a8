/* The ONNX ops that become graph IR layers (import_int.h): Conv, BatchNormalization, pooling,
 * Flatten / Reshape, Gemm / MatMul, the channel shuffle (Reshape, Transpose, Reshape), Split and
 * Slice of channels, Dropout, and the ops dropped or folded into their consumer (Identity, an
 * inference-mode Dropout, a zero Pad). The element-wise ones are in import_elementwise.c. */
#define _GNU_SOURCE /* struct hsearch_data in import_int.h */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx/import_int.h"

/* A float tensor holding only zeros (checked by qt_imp_check_float_tensor first). */
static int zeros(const Onnx__TensorProto *t) {
  const int64_t n = numel_of(t);
  if (n < 0 || !t->has_raw_data || (int64_t)t->raw_data.len != 4 * n) return 0;
  for (int64_t i = 0; i < 4 * n; i++)
    if (t->raw_data.data[i]) return 0;
  return 1;
}

/* A linear layer named after its weight w reading x, with OUT outputs: w copied as `kind` (its
 * columns taken back to (h, w, c) order when x is a flattened image), bias b or none; bound to
 * the node's output 0. NULL on an error. */
static sym *add_linear(imp *im, sym *x, const Onnx__TensorProto *w, copy_kind kind, const Onnx__TensorProto *b,
                       int64_t OUT) {
  char name[QT_NAME_LEN];
  qt_imp_node_name(im, w->name, name);
  const int y = qt_graph_linear(im->g, name, x->value, (int)OUT, b != NULL);
  if (qt_imp_builder_check(im, y)) return NULL;
  const qt_node *nd = &im->g->nodes[node_of(im, y)];
  qt_imp_add_copy(im, nd->param[QT_P_WEIGHT], w, kind, x->perm_c ? x : NULL);
  if (b) qt_imp_add_copy(im, nd->param[QT_P_BIAS], b, COPY_AS_IS, NULL);
  if (x->perm_c) im->info->permuted++;
  return qt_imp_bind_act(im, 0, y);
}

/* A 1x1 Conv of a global pool's [N, C, 1, 1] (squeeze-excite): a linear layer of the (C) vector,
 * its output standing for [N, OC, 1, 1] in turn. */
static int conv_of_pooled(imp *im, sym *x) {
  const Onnx__TensorProto *w = qt_imp_param_input(im, 1, "weight", 0), *b = NULL;
  if (!w) return -1;
  if (in_name(im->node, 2) && !(b = qt_imp_param_input(im, 2, "bias", 1))) return -1;
  int64_t group = 1;
  window win;
  if (qt_imp_attr_int(im, "group", 1, &group) || qt_imp_read_window(im, &win)) return -1;
  const int one = !win.has_kernel || (win.kernel[0] == 1 && win.kernel[1] == 1);
  if (group != 1 || !one || win.pad[0] || win.pad[1] || win.pad[2] || win.pad[3] || x->padded || w->n_dims != 4 ||
      w->dims[2] != 1 || w->dims[3] != 1)
    return qt_imp_node_err(im,
                           "a Conv of the [N, C, 1, 1] of a global average pool ('%s') is supported as a 1x1 "
                           "convolution without groups or padding (a linear layer of the C vector)",
                           x->name);
  const int64_t C = val(im, x)->shape[0], OC = w->dims[0], want_w[4] = {OC, C, 1, 1}, want_b[1] = {OC};
  if (qt_imp_check_float_tensor(im, w, "weight", 4, want_w) ||
      (b && qt_imp_check_float_tensor(im, b, "bias", 1, want_b)))
    return -1;
  sym *y = add_linear(im, x, w, COPY_AS_IS, b, OC);
  if (!y) return -1;
  y->pooled = 1;
  return 0;
}

static int op_conv(imp *im) {
  sym *x = qt_imp_act_input(im, 0, "X", 1);
  if (!x) return -1;
  if (x->pooled) return conv_of_pooled(im, x);
  if (!is_image(im, x))
    return qt_imp_node_err(im, "input '%s' is a flat (N, F) tensor; Conv needs an image (N, C, H, W)", x->name);
  const Onnx__TensorProto *w = qt_imp_param_input(im, 1, "weight", 0), *b = NULL;
  if (!w) return -1;
  if (in_name(im->node, 2) && !(b = qt_imp_param_input(im, 2, "bias", 1))) return -1;
  if (b && qt_imp_param_sym(im, 2)->computed && zeros(b)) { /* torch 2.x's bias of a Conv without one */
    b = NULL;
    im->info->dropped++;
  }
  int64_t group = 1;
  window win;
  if (qt_imp_attr_int(im, "group", 1, &group) || qt_imp_read_window(im, &win) || qt_imp_window_pads(im, &win, x))
    return -1;
  const qt_value *xv = val(im, x);
  const int64_t C = xv->shape[2];
  if (group < 1 || C % group)
    return qt_imp_node_err(im, "group %lld does not divide the input's %lld channels", (long long)group, (long long)C);
  if (w->n_dims != 4)
    return qt_imp_node_err(im, "the weight '%s' has %zu dims, expected 4 (OC, C/group, KH, KW)", str(w->name),
                           w->n_dims);
  const int64_t OC = w->dims[0], KH = win.has_kernel ? win.kernel[0] : w->dims[2],
                KW = win.has_kernel ? win.kernel[1] : w->dims[3];
  const int64_t want_w[4] = {OC, C / group, KH, KW}, want_b[1] = {OC};
  if (OC < 1 || OC % group)
    return qt_imp_node_err(im, "%lld output channels are not a multiple of group %lld", (long long)OC,
                           (long long)group);
  if (qt_imp_check_float_tensor(im, w, "weight", 4, want_w) ||
      (b && qt_imp_check_float_tensor(im, b, "bias", 1, want_b)))
    return -1;
  const qt_node_attrs a = {.kernel_h = (int)KH,
                           .kernel_w = (int)KW,
                           .stride_h = (int)win.stride[0],
                           .stride_w = (int)win.stride[1],
                           .pad_h = (int)win.pad[0],
                           .pad_w = (int)win.pad[1],
                           .groups = (int)group,
                           .out_channels = (int)OC};
  char name[QT_NAME_LEN];
  qt_imp_node_name(im, w->name, name);
  const int y = qt_graph_conv2d_attr(im->g, name, x->value, &a, b != NULL);
  if (qt_imp_builder_check(im, y)) return -1;
  const qt_node *nd = &im->g->nodes[node_of(im, y)];
  qt_imp_add_copy(im, nd->param[QT_P_WEIGHT], w, COPY_AS_IS, NULL);
  if (b) qt_imp_add_copy(im, nd->param[QT_P_BIAS], b, COPY_AS_IS, NULL);
  if (x->padded) im->info->folded++;
  qt_imp_bind_act(im, 0, y);
  return 0;
}

/* ONNX stores momentum as the running statistics' weight (0.9); the graph (PyTorch) the batch's
 * (0.1). 1 - 0.9f is 0.100000024: the 7-digit value it stands for is kept. */
static float momentum_of(float onnx_momentum) {
  char buf[32];
  snprintf(buf, sizeof buf, "%.6g", 1.0 - (double)onnx_momentum);
  return strtof(buf, NULL);
}

static int op_batch_norm(imp *im) {
  sym *x = qt_imp_act_input(im, 0, "X", 0);
  if (!x) return -1;
  if (x->perm_c) return qt_imp_node_err(im, "BatchNormalization of a flattened image ('%s') is not supported", x->name);
  const qt_value *xv = val(im, x);
  const int64_t C = xv->shape[xv->ndim - 1], want[1] = {C};
  const char *roles[4] = {"scale", "B", "mean", "var"};
  const Onnx__TensorProto *t[4];
  for (int k = 0; k < 4; k++)
    if (!(t[k] = qt_imp_param_input(im, (size_t)k + 1, roles[k], 0)) ||
        qt_imp_check_float_tensor(im, t[k], roles[k], 1, want))
      return -1;
  float eps, mom;
  if (qt_imp_attr_float(im, "epsilon", 1e-5f, &eps) || qt_imp_attr_float(im, "momentum", 0.9f, &mom)) return -1;
  if (!(eps > 0) || !(mom >= 0 && mom <= 1))
    return qt_imp_node_err(im, "epsilon %g / momentum %g out of range", (double)eps, (double)mom);
  char name[QT_NAME_LEN];
  qt_imp_node_name(im, t[0]->name, name);
  const int y = qt_graph_batch_norm(im->g, name, x->value);
  if (qt_imp_builder_check(im, y)) return -1;
  qt_node *nd = &im->g->nodes[node_of(im, y)];
  nd->attr.eps = eps;
  nd->attr.momentum = momentum_of(mom);
  qt_imp_add_copy(im, nd->param[QT_P_GAMMA], t[0], COPY_AS_IS, NULL);
  qt_imp_add_copy(im, nd->param[QT_P_BETA], t[1], COPY_AS_IS, NULL);
  qt_imp_add_copy(im, nd->buffer[QT_B_RUNNING_MEAN], t[2], COPY_AS_IS, NULL);
  qt_imp_add_copy(im, nd->buffer[QT_B_RUNNING_VAR], t[3], COPY_AS_IS, NULL);
  sym *s = qt_imp_bind_act(im, 0, y);
  s->pooled = x->pooled;
  qt_imp_outputs_unused(im, 1, "a training statistics output of BatchNormalization");
  return 0;
}

static int op_pool(imp *im, int max) {
  sym *x = qt_imp_act_input(im, 0, "X", !max);
  if (!x) return -1;
  if (!is_image(im, x)) return qt_imp_node_err(im, "input '%s' is not an image (N, C, H, W)", x->name);
  window win;
  int64_t ceil_mode = 0, count_pad = 0, storage = 0;
  if (qt_imp_read_window(im, &win) || qt_imp_attr_int(im, "ceil_mode", 0, &ceil_mode) ||
      qt_imp_attr_int(im, "count_include_pad", 0, &count_pad) || qt_imp_attr_int(im, "storage_order", 0, &storage))
    return -1;
  if (!win.has_kernel) return qt_imp_node_err(im, "no kernel_shape");
  if (ceil_mode != 0 && ceil_mode != 1) return qt_imp_node_err(im, "ceil_mode = %lld", (long long)ceil_mode);
  if (!max && !count_pad && (win.pad[0] || win.pad[1] || win.pad[2] || win.pad[3]))
    return qt_imp_node_err(
        im,
        "count_include_pad = 0 with pads is not supported (the graph IR divides by the whole window, "
        "PyTorch's count_include_pad = True)");
  if (qt_imp_window_pads(im, &win, x)) return -1;
  if (win.kernel[0] != win.kernel[1] || win.stride[0] != win.stride[1] || win.pad[0] != win.pad[1])
    return qt_imp_node_err(
        im,
        "kernel [%lld, %lld], strides [%lld, %lld], pads [%lld, %lld]: the graph IR pools with square "
        "kernels, strides and pads",
        (long long)win.kernel[0], (long long)win.kernel[1], (long long)win.stride[0], (long long)win.stride[1],
        (long long)win.pad[0], (long long)win.pad[1]);
  char name[QT_NAME_LEN];
  qt_imp_node_name(im, NULL, name);
  const int k = (int)win.kernel[0], s = (int)win.stride[0], p = (int)win.pad[0];
  /* ceil mode only where it adds a window (elsewhere both modes are one pool) */
  const qt_value *xv = val(im, x);
  int ceil = 0;
  for (int d = 0; d < 2 && ceil_mode; d++)
    ceil |= qt_pool_output_size(xv->shape[d], k, s, p, 1) != qt_pool_output_size(xv->shape[d], k, s, p, 0);
  if (ceil && !max)
    return qt_imp_node_err(im, "ceil_mode = 1 where the last window hangs over is supported for MaxPool only");
  const int y = qt_graph_pool2d(im->g, max ? QT_OP_MAX_POOL2D : QT_OP_AVG_POOL2D, name, x->value, k, s, p, ceil);
  if (qt_imp_builder_check(im, y)) return -1;
  if (x->padded) im->info->folded++;
  qt_imp_bind_act(im, 0, y);
  qt_imp_outputs_unused(im, 1, "MaxPool's Indices output");
  return 0;
}

static int op_global_pool(imp *im) {
  sym *x = qt_imp_act_input(im, 0, "X", 0);
  if (!x) return -1;
  if (!is_image(im, x)) return qt_imp_node_err(im, "input '%s' is not an image (N, C, H, W)", x->name);
  char name[QT_NAME_LEN];
  qt_imp_node_name(im, NULL, name);
  const int y = qt_graph_global_avg_pool(im->g, name, x->value);
  if (qt_imp_builder_check(im, y)) return -1;
  qt_imp_bind_act(im, 0, y)->pooled = 1;
  return 0;
}

/* The axes of a rank-4 (N, C, H, W) tensor are H and W, each once (negative ones count from the end). */
static int hw_axes(const int64_t *axes, int n_axes) {
  int seen[4] = {0};
  for (int i = 0; i < n_axes; i++) {
    const int64_t a = axes[i] < 0 ? axes[i] + 4 : axes[i];
    if (a >= 0 && a < 4) seen[a]++;
  }
  return n_axes == 2 && seen[2] == 1 && seen[3] == 1;
}

/* ReduceMean over H and W of an image: a global average pool (keepdims 1: the (C) vector stands
 * for [N, C, 1, 1], as GlobalAveragePool's does; keepdims 0: a flat (N, C) tensor). The axes are
 * an attribute before opset 18, an input from 18. */
static int op_reduce_mean(imp *im) {
  const int r = qt_imp_tokens_mean(im);
  if (r) return r < 0 ? -1 : 0;
  sym *x = qt_imp_act_input(im, 0, "data", 0);
  if (!x) return -1;
  int64_t axes[MAX_INTS], keepdims = 1, noop = 0;
  int n_axes = 0;
  if (qt_imp_axes(im, 1, axes, &n_axes) || qt_imp_attr_int(im, "keepdims", 1, &keepdims) ||
      qt_imp_attr_int(im, "noop_with_empty_axes", 0, &noop))
    return -1;
  if (!is_image(im, x) || !hw_axes(axes, n_axes))
    return qt_imp_node_err(im,
                           "only ReduceMean of an image over H and W (axes [2, 3]: a global average pool) is "
                           "supported");
  char name[QT_NAME_LEN];
  qt_imp_node_name(im, NULL, name);
  const int y = qt_graph_global_avg_pool(im->g, name, x->value);
  if (qt_imp_builder_check(im, y)) return -1;
  qt_imp_bind_act(im, 0, y)->pooled = keepdims != 0;
  return 0;
}

/* Squeeze of an activation: the pooled H and W of a global pool (axes 2 and 3). */
static int squeeze_act(imp *im, sym *x, const int64_t *axes, int n_axes) {
  if (!x->pooled || !(hw_axes(axes, n_axes) || n_axes == 0))
    return qt_imp_node_err(im, "only Squeeze of the H and W of a global average pool's [N, C, 1, 1] is supported");
  qt_imp_alias(im, 0, x)->pooled = 0;
  im->info->dropped++;
  return 0;
}

/* Squeeze of an activation (squeeze_act) or of a shape computation (qt_imp_squeeze_ints). */
static int op_squeeze(imp *im) {
  const int r = qt_imp_tokens_squeeze(im);
  if (r) return r < 0 ? -1 : 0;
  int64_t axes[MAX_INTS];
  int n_axes = 0;
  sym *x = qt_imp_input(im, 0, "data");
  if (!x || qt_imp_axes(im, 1, axes, &n_axes)) return -1;
  return x->kind == S_ACT ? squeeze_act(im, x, axes, n_axes) : qt_imp_squeeze_ints(im, axes, n_axes);
}

/* (N, C, H, W) -> (N, C*H*W): a flatten node (its order differs from PyTorch's unless H*W or C
 * is 1: remembered for the linear layer reading it); a flat tensor stays as it is. */
static int flatten(imp *im, sym *x) {
  if (!is_image(im, x)) {
    sym *s = qt_imp_alias(im, 0, x);
    s->pooled = 0;
    im->info->dropped++;
    return 0;
  }
  const qt_value *xv = val(im, x);
  const int H = (int)xv->shape[0], W = (int)xv->shape[1], C = (int)xv->shape[2];
  char name[QT_NAME_LEN];
  qt_imp_node_name(im, NULL, name);
  const int y = qt_graph_flatten(im->g, name, x->value);
  if (qt_imp_builder_check(im, y)) return -1;
  sym *s = qt_imp_bind_act(im, 0, y);
  if (H * W > 1 && C > 1) s->perm_h = H, s->perm_w = W, s->perm_c = C;
  return 0;
}

static int op_flatten(imp *im) {
  sym *x = qt_imp_act_input(im, 0, "input", 0);
  if (!x) return -1;
  int64_t axis = 1;
  if (qt_imp_attr_int(im, "axis", 1, &axis)) return -1;
  if (axis != 1)
    return qt_imp_node_err(im, "axis = %lld is not supported (only 1: keep the batch, flatten the rest)",
                           (long long)axis);
  return flatten(im, x);
}

/* ---- channel shuffle: Reshape to [N, g, C / g, H, W], Transpose [0, 2, 1, 3, 4], Reshape back -- */

static const char shuffle_what[] =
    "a grouped view of channels (a channel shuffle's Reshape to [N, g, C / g, H, W], Transpose [0, 2, 1, 3, 4], "
    "Reshape to [N, C, H, W])";

/* Whether n shape entries are each in [1, 2^15]: their product cannot overflow. */
static int dims_fit(const int64_t *d, int n) {
  for (int i = 0; i < n; i++)
    if (d[i] < 1 || d[i] > 32768) return 0;
  return 1;
}

/* The current node's output as step `step` of the channel shuffle of x by `groups` (x's fields kept). */
static void shuffle_pending(imp *im, const sym *x, int step, int groups) {
  sym *s = qt_imp_pending(im, x, shuffle_what);
  s->shuffle = step;
  s->groups = groups;
}

/* Reshape of an image to [N, g, C / g, H, W]: the start of a channel shuffle. */
static int shuffle_begin(imp *im, sym *x, const int64_t *s, int64_t allowzero) {
  const qt_value *v = val(im, x);
  const int64_t H = v->shape[0], W = v->shape[1], C = v->shape[2];
  if (!dims_fit(s + 1, 4) || !qt_imp_batch_entry(im, s[0], allowzero, s[1] * s[2] * s[3] * s[4], C * H * W) ||
      s[1] * s[2] != C || s[3] != H || s[4] != W)
    return qt_imp_node_err(im,
                           "Reshape of an image [N, %lld, %lld, %lld] to 5 dims: only [N, g, C / g, H, W], a "
                           "channel shuffle's grouping, is supported",
                           (long long)C, (long long)H, (long long)W);
  shuffle_pending(im, x, 1, (int)s[1]);
  return 0;
}

/* Reshape back to [N, C, H, W] after the Transpose: one channel_shuffle node. */
static int shuffle_end(imp *im, sym *p, const sym *shape, int64_t allowzero) {
  sym x = *p;
  x.kind = S_ACT;
  const qt_value *v = val(im, &x);
  const int64_t H = v->shape[0], W = v->shape[1], C = v->shape[2], *s = shape->ints;
  if (shape->n_ints != 4 || !dims_fit(s + 1, 3) ||
      !qt_imp_batch_entry(im, s[0], allowzero, s[1] * s[2] * s[3], C * H * W) || s[1] != C || s[2] != H || s[3] != W)
    return qt_imp_node_err(im, "Reshape of %s: only back to [N, %lld, %lld, %lld] is supported", shuffle_what,
                           (long long)C, (long long)H, (long long)W);
  char name[QT_NAME_LEN];
  qt_imp_node_name(im, NULL, name);
  const int y = qt_graph_channel_shuffle(im->g, name, x.value, p->groups);
  if (qt_imp_builder_check(im, y)) return -1;
  qt_imp_bind_act(im, 0, y);
  return 0;
}

/* Transpose of a constant matrix (a linear layer's weight as torch's exporter writes it without
 * constant folding: MatMul(x, Transpose(W))): the transposed constant, made at import. */
static int transpose_const(imp *im, sym *p) {
  const Onnx__TensorProto *t = p->t;
  int64_t perm[2] = {1, 0};
  int found = 0;
  if (qt_imp_attr_ints(im, "perm", perm, 2, &found)) return -1;
  if (t->n_dims != 2 || perm[0] != 1 || perm[1] != 0)
    return qt_imp_node_err(im, "Transpose of the constant '%s' (%zu dims): only a matrix's (perm [1, 0]) is supported",
                           str(t->name), t->n_dims);
  if (qt_imp_check_float_tensor(im, t, "matrix", 2, NULL)) return -1;
  if (p->user)
    return qt_imp_node_err(im,
                           "the constant '%s' is also a parameter of node '%s'; shared parameters are not supported",
                           str(t->name), p->user);
  p->user = im->node->name && im->node->name[0] ? im->node->name : "(unnamed)";
  const int64_t R = t->dims[0], C = t->dims[1], dims[2] = {C, R};
  float *x = malloc((size_t)(R * C + 1) * sizeof *x);
  QT_ASSERT(x, "out of memory");
  qt_imp_float_data(t, x, R * C);
  Onnx__TensorProto *y =
      qt_imp_new_tensor(im, im->node->output[0], ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, dims, (size_t)2);
  float *out = (float *)y->raw_data.data;
  for (int64_t i = 0; i < R; i++)
    for (int64_t j = 0; j < C; j++) out[j * R + i] = x[i * C + j];
  free(x);
  sym *s = qt_imp_add_sym(im, im->node->output[0], S_CONST);
  s->t = y;
  s->computed = 1;
  return 0;
}

/* Transpose: the swap of a channel shuffle's groups and channels; the tokens' and attention's
 * (import_tokens.c); a constant matrix. */
static int op_transpose(imp *im) {
  const int r = qt_imp_tokens_transpose(im);
  if (r) return r < 0 ? -1 : 0;
  sym *p = in_name(im->node, 0) ? qt_imp_find(im, im->node->input[0]) : NULL;
  if (p && p->kind == S_CONST) return transpose_const(im, p);
  int64_t perm[5];
  int found = 0;
  if (p && p->kind == S_NONE && p->shuffle == 1) {
    if (qt_imp_attr_ints(im, "perm", perm, 5, &found)) return -1;
    if (found && perm[0] == 0 && perm[1] == 2 && perm[2] == 1 && perm[3] == 3 && perm[4] == 4) {
      shuffle_pending(im, p, 2, p->groups);
      return 0;
    }
  }
  return qt_imp_node_err(im,
                         "Transpose is supported only as a channel shuffle's (perm [0, 2, 1, 3, 4] of %s), "
                         "between an image's [N, C, H * W] and its tokens, and within multi-head attention",
                         shuffle_what);
}

/* Reshape to (batch, -1) or (batch, features): x.view(n, -1) or flatten(1); the two Reshapes of a
 * channel shuffle; shape arithmetic. */
static int op_reshape(imp *im) {
  sym *raw = in_name(im->node, 0) ? qt_imp_find(im, im->node->input[0]) : NULL, tmp;
  if (raw && raw->kind == S_NONE && raw->shuffle == 2) {
    int64_t allowzero = 0;
    const sym *shape = qt_imp_ints_input(im, 1, "shape", &tmp);
    if (!shape || qt_imp_attr_int(im, "allowzero", 0, &allowzero)) return -1;
    return shuffle_end(im, raw, shape, allowzero);
  }
  const int r = qt_imp_tokens_reshape(im);
  if (r) return r < 0 ? -1 : 0;
  const sym *data = qt_imp_input(im, 0, "data");
  if (data && data->kind != S_ACT) return qt_imp_reshape_ints(im);
  sym *x = qt_imp_act_input(im, 0, "data", 0);
  if (!x) return -1;
  const sym *shape = qt_imp_ints_input(im, 1, "shape", &tmp);
  if (!shape) return -1;
  int64_t allowzero = 0;
  if (qt_imp_attr_int(im, "allowzero", 0, &allowzero)) return -1;
  if (shape->n_ints == 5 && is_image(im, x) && !x->perm_c) return shuffle_begin(im, x, shape->ints, allowzero);
  const int64_t F = features(im, x);
  const int64_t *s = shape->ints;
  char d[96];
  qt_imp_ints_str(s, shape->n_ints, d, sizeof d);
  const int batch_ok = shape->n_ints == 2 && qt_imp_batch_entry(im, s[0], allowzero, s[1], F);
  if (!batch_ok || !(s[1] == -1 || s[1] == F))
    return qt_imp_node_err(im,
                           "Reshape to %s of a tensor with %lld features per sample: only the flatten x.view(n, -1) "
                           "(batch, -1) is supported",
                           d, (long long)F);
  return flatten(im, x);
}

/* ---- channel ranges: Split, Slice ----------------------------------------------------------- */

/* The channel axis of x as ONNX numbers it: 1 of [N, C, H, W] (-3) or of [N, F] (-1). */
static int channel_axis(imp *im, const sym *x, int64_t axis) {
  const int rank = is_image(im, x) || x->pooled ? 4 : 2;
  return axis == 1 || axis == 1 - rank;
}

/* Output k of the current node as channels [begin, end) of x. */
static int bind_slice(imp *im, size_t k, const sym *x, int64_t begin, int64_t end) {
  char name[QT_NAME_LEN];
  qt_imp_node_name(im, NULL, name);
  const int y = qt_graph_channel_slice(im->g, name, x->value, (int)begin, (int)end);
  if (qt_imp_builder_check(im, y)) return -1;
  qt_imp_bind_act(im, k, y)->pooled = x->pooled;
  return 0;
}

/* Split along channels into the sizes of `split` (an input from opset 13, an attribute before),
 * or into equal parts (num_outputs from opset 18, else the outputs' count). */
static int op_split(imp *im) {
  const int r = qt_imp_tokens_split(im);
  if (r) return r < 0 ? -1 : 0;
  sym *x = qt_imp_act_input(im, 0, "input", 0);
  if (!x) return -1;
  int64_t axis = 0, sizes[MAX_INTS];
  int n = 0;
  if (qt_imp_attr_int(im, "axis", 0, &axis) || qt_imp_ints_arg(im, "split", 1, sizes, &n)) return -1;
  if (x->perm_c || !channel_axis(im, x, axis))
    return qt_imp_node_err(im, "Split along axis %lld: only along channels (axis 1) is supported", (long long)axis);
  const int64_t C = val(im, x)->shape[val(im, x)->ndim - 1];
  const int outs = (int)im->node->n_output;
  if (!n) { /* equal parts, the last smaller, as ONNX's num_outputs */
    if (outs > MAX_INTS) return qt_imp_node_err(im, "Split into %d outputs (at most %d)", outs, MAX_INTS);
    const int64_t part = (C + outs - 1) / outs;
    for (int k = 0; k < outs; k++) sizes[k] = k + 1 < outs ? part : C - part * (outs - 1);
    n = outs;
  }
  int64_t sum = 0;
  for (int k = 0; k < n; k++) sum += sizes[k] > 0 ? sizes[k] : -1;
  if (n != outs || sum != C)
    return qt_imp_node_err(im, "Split of %lld channels into %d positive sizes for %d outputs: they do not add up",
                           (long long)C, n, outs);
  int64_t at = 0;
  for (int k = 0; k < n; k++) {
    if (in_name(im->node, 0) && im->node->output[k] && im->node->output[k][0] &&
        bind_slice(im, (size_t)k, x, at, at + sizes[k]))
      return -1;
    at += sizes[k];
  }
  return 0;
}

/* Slice of one range of channels, step 1 (x[:, a:b] and chunk as torch exports them). */
static int op_slice(imp *im) {
  const int r = qt_imp_tokens_split(im);
  if (r) return r < 0 ? -1 : 0;
  int64_t starts[MAX_INTS], ends[MAX_INTS], axes[MAX_INTS] = {0}, steps[MAX_INTS] = {1};
  int ns, ne, na, nt;
  const sym *data = qt_imp_input(im, 0, "data");
  if (!data) return -1;
  if (data->kind == S_INTS && !data->scalar) { /* a range of a shape: x.shape[:2] */
    sym d = *data;
    if (qt_imp_ints_arg(im, "starts", 1, starts, &ns) || qt_imp_ints_arg(im, "ends", 2, ends, &ne) ||
        qt_imp_ints_arg(im, "axes", 3, axes, &na) || qt_imp_ints_arg(im, "steps", 4, steps, &nt))
      return -1;
    if (ns != 1 || ne != 1 || na > 1 || (na && axes[0] != 0 && axes[0] != -1) || nt > 1 || (nt && steps[0] != 1))
      return qt_imp_node_err(im, "Slice of a shape: only one range, step 1, is supported");
    const int64_t n = d.n_ints;
    int64_t b = starts[0] < 0 ? starts[0] + n : starts[0], e = ends[0] < 0 ? ends[0] + n : ends[0];
    b = b < 0 ? 0 : b > n ? n : b;
    e = e < b ? b : e > n ? n : e;
    sym *s = qt_imp_add_sym(im, im->node->output[0], S_INTS);
    s->n_ints = (int)(e - b);
    qt_imp_copy(s->ints, d.ints + b, (size_t)s->n_ints * sizeof *s->ints);
    return 0;
  }
  sym *x = qt_imp_act_input(im, 0, "data", 0);
  if (!x) return -1;
  if (qt_imp_ints_arg(im, "starts", 1, starts, &ns) || qt_imp_ints_arg(im, "ends", 2, ends, &ne) ||
      qt_imp_ints_arg(im, "axes", 3, axes, &na) || qt_imp_ints_arg(im, "steps", 4, steps, &nt))
    return -1;
  if (ns != 1 || ne != 1 || na > 1 || nt > 1 || (nt && steps[0] != 1) || x->perm_c ||
      !channel_axis(im, x, na ? axes[0] : 0))
    return qt_imp_node_err(im, "only a Slice of one range of channels (axis 1), step 1, is supported");
  const int64_t C = val(im, x)->shape[val(im, x)->ndim - 1];
  int64_t b = starts[0] < 0 ? starts[0] + C : starts[0], e = ends[0] < 0 ? ends[0] + C : ends[0];
  if (b < 0) b = 0;
  if (e > C) e = C;
  if (b >= e)
    return qt_imp_node_err(im, "Slice of channels [%lld, %lld) of %lld is empty", (long long)b, (long long)e,
                           (long long)C);
  return bind_slice(im, 0, x, b, e);
}

/* W (OUT, IN) of a linear layer reading x; transposed: W is stored (IN, OUT). */
static int linear(imp *im, sym *x, const Onnx__TensorProto *w, int transposed, const Onnx__TensorProto *b,
                  const char *role) {
  if (is_image(im, x))
    return qt_imp_node_err(im, "input '%s' is an image (N, C, H, W); %s needs a flat (N, F) input (Flatten first)",
                           x->name, role);
  const int64_t IN = features(im, x);
  char d[96];
  qt_imp_dims_str(w->dims, w->n_dims, d, sizeof d);
  if (w->n_dims != 2) return qt_imp_node_err(im, "the weight '%s' has dims %s, expected a matrix", str(w->name), d);
  const int64_t OUT = transposed ? w->dims[1] : w->dims[0], w_in = transposed ? w->dims[0] : w->dims[1];
  if (w_in != IN)
    return qt_imp_node_err(im, "the weight '%s' %s takes %lld input features, but its input '%s' has %lld%s",
                           str(w->name), d, (long long)w_in, x->name, (long long)IN, qt_imp_dyn_note(im));
  const int64_t want_w[2] = {w->dims[0], w->dims[1]}, want_b[1] = {OUT};
  if (qt_imp_check_float_tensor(im, w, "weight", 2, want_w)) return -1;
  if (b) {
    const int64_t row[2] = {1, OUT};
    if (b->n_dims == 2 ? qt_imp_check_float_tensor(im, b, "bias", 2, row)
                       : qt_imp_check_float_tensor(im, b, "bias", 1, want_b))
      return -1;
  }
  return add_linear(im, x, w, transposed ? COPY_TRANSPOSE : COPY_AS_IS, b, OUT) ? 0 : -1;
}

static int op_gemm(imp *im) {
  sym *x = qt_imp_act_input(im, 0, "A", 0);
  if (!x) return -1;
  int64_t ta, tb;
  float alpha, beta;
  if (qt_imp_attr_int(im, "transA", 0, &ta) || qt_imp_attr_int(im, "transB", 0, &tb) ||
      qt_imp_attr_float(im, "alpha", 1.0f, &alpha) || qt_imp_attr_float(im, "beta", 1.0f, &beta))
    return -1;
  if (ta) return qt_imp_node_err(im, "transA = 1 is not supported");
  if (alpha != 1.0f || beta != 1.0f)
    return qt_imp_node_err(im, "alpha %g, beta %g: only 1 is supported", (double)alpha, (double)beta);
  const Onnx__TensorProto *w = qt_imp_param_input(im, 1, "weight", 0), *b = NULL;
  if (!w) return -1;
  if (in_name(im->node, 2) && !(b = qt_imp_param_input(im, 2, "bias", 1))) return -1;
  if (x->tokens == TOK_TNF) return qt_imp_tokens_linear(im, x, w, b, (int)tb);
  return linear(im, x, w, !tb, b, "Gemm");
}

/* The node reading output `name` when it is the only reader, else -1. */
static int sole_reader(imp *im, const char *name, int *count) {
  int who = -1;
  *count = 0;
  for (size_t i = 0; i < im->gp->n_node; i++) {
    const Onnx__NodeProto *n = im->gp->node[i];
    for (size_t k = 0; k < n->n_input; k++)
      if (n->input[k] && strcmp(n->input[k], name) == 0) {
        (*count)++;
        who = (int)i;
      }
  }
  for (size_t k = 0; k < im->gp->n_output; k++)
    if (strcmp(str(im->gp->output[k]->name), name) == 0) (*count)++;
  return *count == 1 ? who : -1;
}

/* MatMul(A, W) [+ bias]: an Add of a constant right after it becomes the layer's bias. */
static int op_matmul(imp *im) {
  const int r = qt_imp_tokens_matmul(im);
  if (r) return r < 0 ? -1 : 0;
  sym *x = qt_imp_act_input(im, 0, "A", 0);
  if (!x) return -1;
  const Onnx__TensorProto *w = qt_imp_param_input(im, 1, "weight", 0), *b = NULL;
  if (!w) return -1;
  int count;
  const int add = sole_reader(im, im->node->output[0], &count);
  if (add > im->node_index && strcmp(str(im->gp->node[add]->op_type), "Add") == 0 && im->gp->node[add]->n_input == 2) {
    const Onnx__NodeProto *an = im->gp->node[add];
    const char *other = strcmp(an->input[0], im->node->output[0]) == 0 ? an->input[1] : an->input[0];
    sym *o = qt_imp_find(im, other);
    if (o && o->kind == S_CONST && !o->user) {
      b = o->t;
      o->user = str(an->name);
      im->absorbed[add] = 1;
    }
  }
  if (x->tokens == TOK_TC || x->tokens == TOK_TN || x->tokens == TOK_TNF ? qt_imp_tokens_linear(im, x, w, b, 0)
                                                                         : linear(im, x, w, 1, b, "MatMul"))
    return -1;
  if (b) { /* the Add's output is the layer's */
    const sym y = im->syms[im->n_syms - 1];
    sym *s = qt_imp_add_sym(im, im->gp->node[add]->output[0], S_ACT);
    s->value = y.value;
    s->tokens = y.tokens;
    im->info->folded++;
  }
  return 0;
}

/* Dropout's ratio into *ratio when it drops anything in training, else 0 there: the ratio (the attribute before
 * opset 12, then input 1, a constant; 0.5 when absent) and, from opset 12 on, a training_mode
 * input that is a constant true (an exporter in training mode writes it; absent, Dropout is the
 * identity); before opset 12 training was the runtime's mode. -1 after an error. */
static int dropout_ratio(imp *im, float *ratio) {
  *ratio = 0.5f;
  if (im->opset < 12) {
    const Onnx__AttributeProto *a = qt_imp_attr(im->node, "ratio");
    if (a && a->type != ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT)
      return qt_imp_node_err(im, "attribute ratio: expected a float");
    if (a) *ratio = a->f;
  } else {
    const sym *t = in_name(im->node, 2) ? qt_imp_find(im, in_name(im->node, 2)) : NULL;
    const Onnx__TensorProto *c = t && t->kind == S_CONST ? t->t : NULL;
    if (!c || !(c->has_raw_data ? c->raw_data.len > 0 && c->raw_data.data[0] != 0
                                : c->n_int32_data > 0 && c->int32_data[0] != 0)) {
      *ratio = 0.0f; /* inference mode: the identity whatever the ratio */
      return 0;
    }
    const sym *r = in_name(im->node, 1) ? qt_imp_find(im, in_name(im->node, 1)) : NULL;
    if (r && !qt_imp_const_scalar(r, ratio)) return qt_imp_node_err(im, "input ratio: expected a constant scalar");
  }
  if (!(*ratio >= 0.0f && *ratio < 1.0f)) return qt_imp_node_err(im, "ratio %g is not in [0, 1)", (double)*ratio);
  return 0;
}

/* Identity: dropped. Dropout: a dropout node of the graph where it drops in training (of an
 * activation), else dropped (its mask output must be unused). */
static int op_identity(imp *im) {
  sym *x = qt_imp_input(im, 0, "input");
  if (!x) return -1;
  float ratio = 0.0f;
  if (strcmp(str(im->node->op_type), "Dropout") == 0 && dropout_ratio(im, &ratio)) return -1;
  qt_imp_outputs_unused(im, 1, "Dropout's mask output");
  if (ratio > 0.0f && x->kind == S_ACT && !x->padded) {
    char name[QT_NAME_LEN];
    qt_imp_node_name(im, NULL, name);
    const int y = qt_graph_dropout(im->g, name, x->value, ratio);
    if (qt_imp_builder_check(im, y)) return -1;
    qt_imp_alias(im, 0, x)->value = y; /* x's layout fields carry over */
    im->info->dropouts++;
    return 0;
  }
  qt_imp_alias(im, 0, x);
  im->info->dropped++;
  return 0;
}

/* A zero Pad of the spatial dims, pending until the Conv or AveragePool it feeds. */
static int op_pad(imp *im) {
  sym *x = qt_imp_act_input(im, 0, "data", 0), tmp;
  if (!x) return -1;
  const Onnx__AttributeProto *mode = qt_imp_attr(im->node, "mode");
  if (mode && !(mode->s.len == 8 && memcmp(mode->s.data, "constant", 8) == 0))
    return qt_imp_node_err(im, "mode '%.*s' is not supported (only constant zero padding)", (int)mode->s.len,
                           mode->s.data);
  if (!is_image(im, x)) return qt_imp_node_err(im, "input '%s' is not an image (N, C, H, W)", x->name);
  const sym *p = qt_imp_ints_input(im, 1, "pads", &tmp);
  if (!p) return -1;
  int64_t pads[8] = {0}, axes[MAX_INTS];
  int n_axes = 0;
  if (p->n_ints > 8) return qt_imp_node_err(im, "pads of %d values; an image has 4 dims", p->n_ints);
  if (qt_imp_axes(im, 3, axes, &n_axes)) return -1; /* opset 18: the dims pads applies to */
  if (n_axes) {
    if (p->n_ints != 2 * n_axes)
      return qt_imp_node_err(im, "pads of %d values for %d axes (2 per axis expected)", p->n_ints, n_axes);
    for (int i = 0; i < n_axes; i++) {
      const int64_t a = axes[i] < 0 ? axes[i] + 4 : axes[i];
      if (a < 0 || a > 3) return qt_imp_node_err(im, "axis %lld out of range for an image", (long long)axes[i]);
      pads[a] = p->ints[i], pads[a + 4] = p->ints[i + n_axes];
    }
  } else if (p->n_ints == 8) {
    memcpy(pads, p->ints, sizeof pads);
  } else {
    return qt_imp_node_err(im, "pads of %d values; 8 expected (begin and end of N, C, H, W)", p->n_ints);
  }
  float value = 0;
  int has_value;
  if (qt_imp_scalar_input(im, 2, "constant_value", &value, &has_value)) return -1;
  if (value != 0.0f || pads[0] || pads[1] || pads[4] || pads[5])
    return qt_imp_node_err(im, "only zero padding of H and W is supported (constant %g)", (double)value);
  for (int k = 0; k < 8; k++)
    if (pads[k] < 0 || pads[k] > 64) return qt_imp_node_err(im, "pads out of range");
  sym *s = qt_imp_alias(im, 0, x);
  const int64_t add[4] = {pads[2], pads[3], pads[6], pads[7]}; /* top, left, bottom, right */
  for (int k = 0; k < 4; k++) s->pad[k] += (int)add[k];
  s->padded = s->pad[0] || s->pad[1] || s->pad[2] || s->pad[3];
  if (!s->padded) im->info->dropped++;
  return 0;
}

/* Whether string attribute `name` of the node is absent (then def counts) or equals one of
 * the values a, b (b may be NULL). */
static int attr_is(imp *im, const char *name, const char *def, const char *a, const char *b) {
  const Onnx__AttributeProto *at = qt_imp_attr(im->node, name);
  const char *v = def;
  size_t len = def ? strlen(def) : 0;
  if (at) v = (const char *)at->s.data, len = at->s.len;
  if (!v) return 0;
  return (len == strlen(a) && memcmp(v, a, len) == 0) || (b && len == strlen(b) && memcmp(v, b, len) == 0);
}

/* Resize of an image by scales [1, 1, 2, 2] (F.interpolate(scale_factor=2), nn.Upsample):
 * mode nearest with asymmetric coordinates rounded down (torch's 'nearest'), or mode linear with
 * pytorch_half_pixel or half_pixel coordinates (torch's 'bilinear', align_corners=False). */
static int op_resize(imp *im) {
  sym *x = qt_imp_act_input(im, 0, "X", 0);
  if (!x) return -1;
  if (!is_image(im, x)) return qt_imp_node_err(im, "input '%s' is not an image (N, C, H, W)", x->name);
  const size_t k_scales = im->opset < 11 ? 1 : 2;
  if (im->node->n_input > 3 && in_name(im->node, 3))
    return qt_imp_node_err(im, "Resize to sizes is not supported: give scales [1, 1, 2, 2] (scale_factor=2)");
  const sym *s = in_name(im->node, k_scales) ? qt_imp_input(im, k_scales, "scales") : NULL;
  float sc[4] = {0};
  if (!s || s->kind != S_CONST || s->t->data_type != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT || s->t->n_dims != 1 ||
      s->t->dims[0] != 4)
    return qt_imp_node_err(im, "Resize needs constant float scales [1, 1, 2, 2]");
  qt_imp_float_data(s->t, sc, 4);
  if (sc[0] != 1.0f || sc[1] != 1.0f || sc[2] != 2.0f || sc[3] != 2.0f)
    return qt_imp_node_err(im, "scales [%g, %g, %g, %g]: only [1, 1, 2, 2] (upsampling by 2) is supported",
                           (double)sc[0], (double)sc[1], (double)sc[2], (double)sc[3]);
  int mode;
  if (attr_is(im, "mode", "nearest", "nearest", NULL) &&
      attr_is(im, "coordinate_transformation_mode", "half_pixel", "asymmetric", NULL) &&
      attr_is(im, "nearest_mode", "round_prefer_floor", "floor", NULL))
    mode = QT_RESIZE_NEAREST;
  else if (attr_is(im, "mode", "nearest", "linear", NULL) &&
           attr_is(im, "coordinate_transformation_mode", "half_pixel", "pytorch_half_pixel", "half_pixel"))
    mode = QT_RESIZE_BILINEAR;
  else
    return qt_imp_node_err(im,
                           "this Resize is not supported: mode nearest with asymmetric coordinates and nearest_mode "
                           "floor (torch's 'nearest'), or mode linear with pytorch_half_pixel or half_pixel "
                           "coordinates (torch's 'bilinear', align_corners=False)");
  char name[QT_NAME_LEN];
  qt_imp_node_name(im, NULL, name);
  const int y = qt_graph_resize(im->g, name, x->value, mode);
  if (qt_imp_builder_check(im, y)) return -1;
  qt_imp_bind_act(im, 0, y);
  return 0;
}

static int f_maxpool(imp *im) { return op_pool(im, 1); }
static int f_avgpool(imp *im) { return op_pool(im, 0); }

const qt_imp_op qt_imp_layer_ops[] = {
    {"Conv", op_conv, 2, 3, 1, 1},
    {"BatchNormalization", op_batch_norm, 5, 5, 1, 5}, /* 5 outputs in training mode before opset 14 */
    {"MaxPool", f_maxpool, 1, 1, 1, 2},
    {"AveragePool", f_avgpool, 1, 1, 1, 1},
    {"GlobalAveragePool", op_global_pool, 1, 1, 1, 1},
    {"ReduceMean", op_reduce_mean, 1, 2, 1, 1},
    {"Flatten", op_flatten, 1, 1, 1, 1},
    {"Squeeze", op_squeeze, 1, 2, 1, 1},
    {"Reshape", op_reshape, 2, 2, 1, 1},
    {"Gemm", op_gemm, 2, 3, 1, 1},
    {"MatMul", op_matmul, 2, 2, 1, 1},
    {"Transpose", op_transpose, 1, 1, 1, 1},
    {"Split", op_split, 1, 2, 1, MAX_INTS},
    {"Slice", op_slice, 3, 5, 1, 1},
    {"Identity", op_identity, 1, 1, 1, 1},
    {"Dropout", op_identity, 1, 3, 1, 2},
    {"Pad", op_pad, 1, 4, 1, 1},
    {"Resize", op_resize, 1, 4, 1, 1},
    {NULL, NULL, 0, 0, 0, 0},
};
