/* ONNX QDQ export (onnx_export.h): walks the Q/DQ graph in topological order and builds the
 * ONNX ModelProto with the protobuf-c structs generated from Debian's onnx.proto, then packs it
 * with onnx__model_proto__pack and writes it atomically.
 *
 * Every protobuf struct, array and string is allocated from one pool freed at the end, so the
 * model is a plain tree of pool memory (no protobuf-c free functions: they are for unpacked
 * messages). Per value the export tracks how the ONNX tensor orders a flattened image, so that
 * the linear layer reading it gets its columns permuted. */
#include "onnx/export_int.h"
#include "base/base.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define ONNX_MAX_BYTES ((size_t)2000 << 20) /* protobuf's 2 GB message limit, with room */

/* ---- values ---------------------------------------------------------------------------------- */

/* The ONNX tensor name of value v. */
static const char *vname(const exporter *e, int v) {
  if (v == e->g->input) return "input";
  if (v == e->g->output) return "logits";
  return e->g->values[v].name;
}

static const char *in0(const exporter *e) { return vname(e, e->node->inputs[0]); }
static const char *out(const exporter *e) { return vname(e, e->node->output); }
static value_info *vin(exporter *e, int k) { return &e->vi[e->node->inputs[k]]; }

/* The current node's output in its input's ONNX layout (its flatten order); 0. */
static int keep_layout(exporter *e) {
  e->vi[e->node->output] = *vin(e, 0);
  return 0;
}

/* The 8-bit container of an integer range: uint8 for an unsigned one, int8 for a signed one;
 * 0 when none holds it. */
static int container_of(int is_signed, int qmin, int qmax) {
  if (!is_signed && qmin >= 0 && qmax <= 255) return T_UINT8;
  if (qmin >= -128 && qmax <= 127) return T_INT8;
  if (qmin >= 0 && qmax <= 255) return T_UINT8;
  return 0;
}

static const char *type_name(int t) { return t == T_INT8 ? "int8" : "uint8"; }

/* Scale and zero point initializers "<prefix>_scale"-style names: per tensor as scalars, per
 * channel as vectors. */
static void add_qparams(exporter *e, const qt_qstate *q, int container, const char *scale_name, const char *zp_name) {
  const int64_t ch = q->channels;
  if (ch == 1) {
    qt_exp_add_float(e, scale_name, 0, NULL, q->scale, 1);
    qt_exp_add_int8(e, zp_name, container, 0, NULL, q->zero_point, 1);
  } else {
    qt_exp_add_float(e, scale_name, 1, &ch, q->scale, ch);
    qt_exp_add_int8(e, zp_name, container, 1, &ch, q->zero_point, ch);
  }
}

static int check_zero_points(exporter *e, const qt_qstate *q, int container, const char *what) {
  const int lo = container == T_INT8 ? -128 : 0, hi = container == T_INT8 ? 127 : 255;
  for (int c = 0; c < q->channels; c++)
    if (q->zero_point[c] < lo || q->zero_point[c] > hi)
      return qt_exp_node_err(e, "%s zero point %d (channel %d) does not fit its %s container", what, q->zero_point[c],
                             c, type_name(container));
  return 0;
}

/* ---- ops ------------------------------------------------------------------------------------- */

/* The node reading value v when exactly one node reads it, else NULL. */
static const qt_node *sole_reader(const qt_graph *g, int v) {
  if (g->values[v].consumers != 1) return NULL;
  for (int i = 0; i < g->n_nodes; i++)
    for (int k = 0; k < g->nodes[i].n_inputs; k++)
      if (g->nodes[i].inputs[k] == v) return &g->nodes[i];
  return NULL;
}

/* Whether quantize node n narrows its container's range (a sub-8-bit or narrowed record). */
static int narrows(const qt_qstate *q, int container) {
  return q->spec.qmin > (container == T_INT8 ? -128 : 0) || q->spec.qmax < (container == T_INT8 ? 127 : 255);
}

/* The dequantize reading narrowing quantize n, when only it reads n and only a max pool reads
 * it (and every scale is positive), else NULL. The export then pools the integers and puts the
 * Clip and the dequantize after the pool: max commutes with the monotonic clamp and
 * dequantization, so the values are the same, and the Clip then sits where ONNX Runtime's
 * layout pass leaves the conv -> pool chain in NHWC (a Clip between them makes it transpose
 * back to NCHW for a slow uint8 MaxPool). */
static const qt_node *dequantize_before_pool(const qt_graph *g, const qt_node *n) {
  const qt_node *dq = sole_reader(g, n->output);
  if (!dq || dq->op != QT_OP_DEQUANTIZE || !dq->q) return NULL;
  const qt_node *pool = sole_reader(g, dq->output);
  if (!pool || pool->op != QT_OP_MAX_POOL2D) return NULL;
  for (int c = 0; c < dq->q->channels; c++)
    if (!(dq->q->scale[c] > 0.0f)) return NULL;
  return dq;
}

/* The Clip narrowing quantize node q's integers from its container to [qmin, qmax]: named
 * "<q>.clip", bounds "<q>.clip_min" / "<q>.clip_max" of the container's type. */
static void emit_clip(exporter *e, const qt_node *q, int container, const char *x, const char *y) {
  char *mn = qt_exp_str(e, "%s.clip_min", q->name), *mx = qt_exp_str(e, "%s.clip_max", q->name);
  const int32_t lo = q->q->spec.qmin, hi = q->q->spec.qmax;
  qt_exp_add_int8(e, mn, container, 0, NULL, &lo, 1);
  qt_exp_add_int8(e, mx, container, 0, NULL, &hi, 1);
  qt_exp_add_node(e, "Clip", qt_exp_str(e, "%s.clip", q->name), y, 3, x, mn, mx);
  e->info.clips++;
}

static void emit_dequantize(exporter *e, const qt_node *dq, int container, const char *x, const char *y) {
  char *s = qt_exp_str(e, "%s.scale", dq->name), *z = qt_exp_str(e, "%s.zero_point", dq->name);
  add_qparams(e, dq->q, container, s, z);
  Onnx__NodeProto *o = qt_exp_add_node(e, "DequantizeLinear", dq->name, y, 3, x, s, z);
  if (dq->q->channels > 1) qt_exp_attr_int(e, o, "axis", 1);
  e->info.dequantize++;
}

static int op_quantize(exporter *e) {
  const qt_node *n = e->node;
  const qt_qstate *q = n->q;
  QT_ASSERT(q && q->calibrated, "onnx export: quantize node '%s' without qparams", n->name);
  const int container = container_of(q->spec.is_signed, q->spec.qmin, q->spec.qmax);
  if (!container)
    return qt_exp_node_err(
        e,
        "range [%d, %d] (%d bits) fits no 8-bit container; ONNX QuantizeLinear (opset 13) writes only "
        "int8 and uint8",
        q->spec.qmin, q->spec.qmax, q->spec.bits);
  if (check_zero_points(e, q, container, "the")) return -1;
  if (q->channels > 1 && vin(e, 0)->perm_c)
    return qt_exp_node_err(
        e,
        "per-channel quantization of a flattened image: ONNX orders its features (c, h, w), the graph "
        "(h, w, c)");
  /* A narrower range than the container's (sub-8-bit): QuantizeLinear saturates to the
   * container, then a Clip on its integers (bounds of the container's type) narrows to
   * [qmin, qmax]: clamp(clamp(v, cmin, cmax), qmin, qmax) = clamp(v, qmin, qmax), so the integers
   * are the graph's. The Clip sits between QuantizeLinear and the DequantizeLinear that reads it
   * (after a max pool between them: dequantize_before_pool), where ONNX Runtime's QDQ fusion
   * still sees op -> QuantizeLinear (a float Clip before the QuantizeLinear hides the op from
   * it). */
  const int narrow = narrows(q, container), later = narrow && dequantize_before_pool(e->g, n);
  char *s = qt_exp_str(e, "%s.scale", n->name), *z = qt_exp_str(e, "%s.zero_point", n->name);
  add_qparams(e, q, container, s, z);
  const char *q_out = narrow && !later ? qt_exp_str(e, "%s.saturated", n->name) : out(e);
  Onnx__NodeProto *o = qt_exp_add_node(e, "QuantizeLinear", n->name, q_out, 3, in0(e), s, z);
  if (q->channels > 1) qt_exp_attr_int(e, o, "axis", 1); /* channels: axis 1 of NCHW and of (N, F) */
  if (narrow && !later) emit_clip(e, n, container, q_out, out(e));
  e->vi[n->output] = *vin(e, 0);
  e->vi[n->output].container = container;
  e->info.quantize++;
  return 0;
}

static int op_dequantize(exporter *e) {
  const qt_node *n = e->node;
  const qt_qstate *q = n->q;
  QT_ASSERT(q && q->calibrated, "onnx export: dequantize node '%s' without qparams", n->name);
  const int container = vin(e, 0)->container;
  QT_ASSERT(container, "onnx export: dequantize node '%s' reads no quantize output", n->name);
  if (check_zero_points(e, q, container, "the")) return -1;
  if (q->channels > 1 && vin(e, 0)->perm_c)
    return qt_exp_node_err(
        e,
        "per-channel dequantization of a flattened image: ONNX orders its features (c, h, w), the graph "
        "(h, w, c)");
  const qt_node *qn = &e->g->nodes[e->g->values[n->inputs[0]].producer];
  e->vi[n->output] = *vin(e, 0);
  if (qn->op == QT_OP_QUANTIZE && narrows(qn->q, container) && dequantize_before_pool(e->g, qn) == n) {
    e->vi[n->output].pool_dq = (int)(n - e->g->nodes) + 1; /* written by op_pool, after the pool */
    return 0;
  }
  emit_dequantize(e, n, container, in0(e), out(e));
  e->vi[n->output].container = 0;
  return 0;
}

/* The weight of a conv2d or linear as an ONNX tensor name: integers through a DequantizeLinear,
 * or the float weight. perm (linear after a flatten): columns from (h, w, c) to (c, h, w). */
static const char *weight(exporter *e, const value_info *perm) {
  const qt_node *n = e->node;
  const qt_param *p = &e->g->tensors[n->param[QT_P_WEIGHT]];
  const int64_t numel = p->numel, rows = p->shape[0], cols = numel / rows;
  const qt_qstate *wq = n->wq;
  int32_t *qi = NULL;
  float *wf = NULL;
  if (wq) {
    QT_ASSERT(wq->qweight && wq->n_qweight == numel, "onnx export: node '%s': integer weights missing", n->name);
    qi = malloc((size_t)numel * sizeof *qi);
    QT_ASSERT(qi, "onnx export: out of memory");
    memcpy(qi, wq->qweight, (size_t)numel * sizeof *qi);
  } else {
    wf = malloc((size_t)numel * sizeof *wf);
    QT_ASSERT(wf, "onnx export: out of memory");
    memcpy(wf, e->g->params + p->offset, (size_t)numel * sizeof *wf);
  }
  if (perm && perm->perm_c) {
    const int64_t H = perm->perm_h, W = perm->perm_w, C = perm->perm_c;
    QT_ASSERT(H * W * C == cols, "onnx export: node '%s': permutation %lldx%lldx%lld of %lld columns", n->name,
              (long long)H, (long long)W, (long long)C, (long long)cols);
    for (int64_t o = 0; o < rows; o++)
      for (int64_t c = 0; c < C; c++)
        for (int64_t h = 0; h < H; h++)
          for (int64_t w = 0; w < W; w++) {
            const int64_t dst = o * cols + c * H * W + h * W + w, src = o * cols + (h * W + w) * C + c;
            if (qi)
              qi[dst] = wq->qweight[src];
            else
              wf[dst] = e->g->params[p->offset + src];
          }
    e->info.permuted++;
  }
  const char *name;
  if (wq) {
    const int container = container_of(wq->spec.is_signed, wq->spec.qmin, wq->spec.qmax);
    if (!container) {
      free(qi);
      return qt_exp_node_err(e, "weight range [%d, %d] (%d bits) fits no 8-bit container", wq->spec.qmin, wq->spec.qmax,
                             wq->spec.bits),
             NULL;
    }
    if (check_zero_points(e, wq, container, "weight")) {
      free(qi);
      return NULL;
    }
    const int lo = container == T_INT8 ? -128 : 0, hi = container == T_INT8 ? 127 : 255;
    for (int64_t i = 0; i < numel; i++)
      QT_ASSERT(qi[i] >= lo && qi[i] <= hi, "onnx export: node '%s': integer weight %d outside %s", n->name, qi[i],
                type_name(container));
    if (wq->channels != 1 && wq->channels != rows) {
      free(qi);
      return qt_exp_node_err(e, "%d weight scales for %lld output channels", wq->channels, (long long)rows), NULL;
    }
    char *wi = qt_exp_str(e, "%s.weight_int", n->name), *s = qt_exp_str(e, "%s.weight_scale", n->name);
    char *z = qt_exp_str(e, "%s.weight_zero_point", n->name);
    qt_exp_add_int8(e, wi, container, p->ndim, p->shape, qi, numel);
    add_qparams(e, wq, container, s, z);
    name = qt_exp_str(e, "%s.weight", n->name);
    Onnx__NodeProto *o =
        qt_exp_add_node(e, "DequantizeLinear", qt_exp_str(e, "%s.weight.dequantize", n->name), name, 3, wi, s, z);
    if (wq->channels > 1) qt_exp_attr_int(e, o, "axis", 0);
    e->info.int_weights++;
  } else {
    name = qt_exp_str(e, "%s.weight", n->name);
    qt_exp_add_float(e, name, p->ndim, p->shape, wf, numel);
    e->info.float_weights++;
  }
  free(qi);
  free(wf);
  return name;
}

/* The per-tensor scale of the integers a layer's input holds: its input is a dequantize (through
 * max pooling and flatten, which ONNX Runtime's QDQ propagation sees through) with one scale.
 * 0 when it is not (an fp32 input). */
static float input_int_scale(const exporter *e) {
  const qt_graph *g = e->g;
  int v = e->node->inputs[0];
  while (v != g->input) {
    const qt_node *p = &g->nodes[g->values[v].producer];
    if (p->op == QT_OP_MAX_POOL2D || p->op == QT_OP_FLATTEN)
      v = p->inputs[0];
    else
      return p->op == QT_OP_DEQUANTIZE && p->q->channels == 1 ? p->q->scale[0] : 0.0f;
  }
  return 0.0f;
}

/* An int32 bias q with scales sc (zero point 0, axis 0): the initializers and the
 * DequantizeLinear reading them; returns its output name. */
static const char *int32_bias_node(exporter *e, const int32_t *q, const float *sc, int64_t n) {
  const qt_node *nd = e->node;
  int32_t *zp = calloc((size_t)n, sizeof *zp);
  QT_ASSERT(zp, "onnx export: out of memory");
  char *bi = qt_exp_str(e, "%s.bias_int", nd->name), *bs = qt_exp_str(e, "%s.bias_scale", nd->name);
  char *bz = qt_exp_str(e, "%s.bias_zero_point", nd->name);
  qt_exp_add_init(e, bi, T_INT32, 1, &n, q, (size_t)n * sizeof *q);
  qt_exp_add_float(e, bs, 1, &n, sc, n);
  qt_exp_add_init(e, bz, T_INT32, 1, &n, zp, (size_t)n * sizeof *zp);
  free(zp);
  const char *name = qt_exp_str(e, "%s.bias", nd->name);
  Onnx__NodeProto *o =
      qt_exp_add_node(e, "DequantizeLinear", qt_exp_str(e, "%s.bias.dequantize", nd->name), name, 3, bi, bs, bz);
  qt_exp_attr_int(e, o, "axis", 0);
  e->info.int32_biases++;
  return name;
}

/* opt.int32_bias: the bias as int32 in accumulator units, b_q = round_half_even(b / (s_x * s_w[c]))
 * with the float32 product s_x * s_w[c] (what ONNX Runtime's integer kernels assume), read by a
 * DequantizeLinear of that scale (per channel, axis 0). Returns the dequantized name, or NULL when
 * the layer does not qualify (no integer weights, an fp32 input, a bias beyond int32). */
static const char *bias_int32(exporter *e, const float *b, int64_t n) {
  const qt_node *nd = e->node;
  const qt_qstate *wq = nd->wq && nd->wq->qweight ? nd->wq : NULL;
  const float s_x = input_int_scale(e);
  if (!wq || s_x <= 0) return NULL;
  int32_t *q = malloc((size_t)n * sizeof *q);
  float *sc = malloc((size_t)n * sizeof *sc);
  int32_t *zp = calloc((size_t)n, sizeof *zp);
  QT_ASSERT(q && sc && zp, "onnx export: out of memory");
  int ok = 1;
  for (int64_t c = 0; c < n && ok; c++) {
    sc[c] = s_x * wq->scale[wq->channels == 1 ? 0 : c];
    const double v = nearbyint((double)b[c] / (double)sc[c]);
    ok = sc[c] > 0 && v >= -2147483648.0 && v <= 2147483647.0;
    q[c] = ok ? (int32_t)v : 0;
  }
  const char *name = ok ? int32_bias_node(e, q, sc, n) : NULL;
  QT_FREE_ALL(q, sc, zp);
  return name;
}

/* The bias as an initializer name (the graph's int32 bias, or fp32, or int32 rounded here with
 * opt.int32_bias), or NULL when the layer has none. */
static const char *bias(exporter *e) {
  const qt_node *n = e->node;
  if (n->param[QT_P_BIAS] < 0) return NULL;
  const qt_param *p = &e->g->tensors[n->param[QT_P_BIAS]];
  if (n->wq && n->wq->qbias) { /* the graph's own integers, at the scales they were made with */
    float *sc = malloc((size_t)p->numel * sizeof *sc);
    char why[QT_ERR_LEN];
    QT_ASSERT(sc && n->wq->n_qbias == p->numel, "onnx export: int32 bias of %s", n->name);
    QT_ASSERT(qt_bias_scales(e->g, (int)(n - e->g->nodes), sc, why) == 0, "onnx export: %s", why);
    const char *name = int32_bias_node(e, n->wq->qbias, sc, p->numel);
    free(sc);
    return name;
  }
  if (e->opt.int32_bias) {
    const char *q = bias_int32(e, e->g->params + p->offset, p->numel);
    if (q) return q;
  }
  char *name = qt_exp_str(e, "%s.bias", n->name);
  qt_exp_add_float(e, name, 1, &p->numel, e->g->params + p->offset, p->numel);
  e->info.float_biases++;
  return name;
}

static int op_conv(exporter *e) {
  const qt_node *n = e->node;
  if (e->g->values[n->inputs[0]].ndim != 3) return qt_exp_node_err(e, "input is not an image");
  const char *w = weight(e, NULL);
  if (!w) return -1;
  const char *b = bias(e);
  Onnx__NodeProto *o = b ? qt_exp_add_node(e, "Conv", n->name, out(e), 3, in0(e), w, b)
                         : qt_exp_add_node(e, "Conv", n->name, out(e), 2, in0(e), w);
  qt_exp_attr_window(e, o, &n->attr);
  qt_exp_attr_ints(e, o, "dilations", 2, (int64_t)1, (int64_t)1);
  qt_exp_attr_int(e, o, "group", n->attr.groups);
  return 0;
}

static int op_linear(exporter *e) {
  const qt_node *n = e->node;
  if (e->g->values[n->inputs[0]].ndim != 1) return qt_exp_node_err(e, "input is not a flat (N, F) value");
  const char *w = weight(e, vin(e, 0));
  if (!w) return -1;
  const char *b = bias(e);
  Onnx__NodeProto *o = b ? qt_exp_add_node(e, "Gemm", n->name, out(e), 3, in0(e), w, b)
                         : qt_exp_add_node(e, "Gemm", n->name, out(e), 2, in0(e), w);
  qt_exp_attr_int(e, o, "transB", 1);
  return 0;
}

/* Whether relu6 node n's upper bound is already the quantize that alone reads it: a narrowed
 * (sub-8-bit) range whose top, for every channel, is at most 6 in the units of ONNX's
 * QuantizeLinear (qmax - zp <= fl(6 / s)). Then any x > 6 quantizes to qmax with or without the
 * min(., 6), since fl(x / s) >= fl(6 / s) and rounding is monotonic, so max(x, 0) gives the same
 * integers. With an 8-bit range ONNX Runtime finds this itself (its Clip -> QuantizeLinear
 * fusion, from the container's range); with a narrowed one it cannot, and the float Clip left
 * between the convolution and its QuantizeLinear keeps the layer out of its integer kernels. */
static int relu6_bound_by_quantize(const qt_graph *g, const qt_node *n) {
  if (g->values[n->output].consumers != 1) return 0;
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *c = &g->nodes[i];
    if (c->n_inputs < 1 || c->inputs[0] != n->output) continue;
    const qt_qstate *q = c->q;
    if (c->op != QT_OP_QUANTIZE || !q || !q->calibrated) return 0;
    const int container = container_of(q->spec.is_signed, q->spec.qmin, q->spec.qmax);
    if (!container || !narrows(q, container)) return 0;
    for (int ch = 0; ch < q->channels; ch++)
      if (!(q->scale[ch] > 0.0f) || (float)(q->spec.qmax - q->zero_point[ch]) > 6.0f / q->scale[ch]) return 0;
    return 1;
  }
  return 0;
}

static int op_relu6(exporter *e) {
  const qt_node *n = e->node;
  if (relu6_bound_by_quantize(e->g, n)) {
    /* written as a Relu (named as the node), which ONNX Runtime folds into the QuantizeLinear */
    qt_exp_add_node(e, "Relu", n->name, out(e), 1, in0(e));
    e->vi[n->output] = *vin(e, 0);
    e->info.relu6_as_relu++;
    return 0;
  }
  char *mn = qt_exp_str(e, "%s.min", n->name), *mx = qt_exp_str(e, "%s.max", n->name);
  qt_exp_add_scalar_float(e, mn, 0.0f);
  qt_exp_add_scalar_float(e, mx, 6.0f);
  qt_exp_add_node(e, "Clip", n->name, out(e), 3, in0(e), mn, mx);
  return keep_layout(e);
}

/* An activation in opset 13's ops: Sigmoid, Tanh, HardSigmoid, LeakyRelu and Elu as themselves;
 * SiLU as x * Sigmoid(x), hard swish as x * HardSigmoid(x) (HardSwish is opset 14), GELU as
 * x * 0.5 * (1 + Erf(x / sqrt 2)) or, with the tanh approximation, 0.5 x (1 + Tanh(sqrt(2 / pi)
 * (x + 0.044715 x^3))) (Gelu is opset 20). The layout of the input carries over. */
static int op_activation(exporter *e) {
  const qt_node *n = e->node;
  const qt_node_attrs *a = &n->attr;
  const char *x = in0(e), *y = out(e), *name = n->name;
  e->vi[n->output] = *vin(e, 0);
  switch ((qt_act_kind)a->act) {
    case QT_ACT_SIGMOID: qt_exp_add_node(e, "Sigmoid", name, y, 1, x); return 0;
    case QT_ACT_TANH: qt_exp_add_node(e, "Tanh", name, y, 1, x); return 0;
    case QT_ACT_LEAKY_RELU:
      qt_exp_attr_float(e, qt_exp_add_node(e, "LeakyRelu", name, y, 1, x), "alpha", a->alpha);
      return 0;
    case QT_ACT_ELU: qt_exp_attr_float(e, qt_exp_add_node(e, "Elu", name, y, 1, x), "alpha", a->alpha); return 0;
    case QT_ACT_DIV: {
      char *c = qt_exp_str(e, "%s.divisor", name);
      qt_exp_add_scalar_float(e, c, a->alpha);
      qt_exp_add_node(e, "Div", name, y, 2, x, c);
      return 0;
    }
    case QT_ACT_AFFINE: { /* Mul by alpha unless it is 1, then Add of beta unless it is 0 */
      const int mul = a->alpha != 1.0f || a->beta == 0.0f, add = a->beta != 0.0f;
      const char *m = add && mul ? qt_exp_str(e, "%s.scaled", name) : y;
      if (mul) {
        char *c = qt_exp_str(e, "%s.alpha", name);
        qt_exp_add_scalar_float(e, c, a->alpha);
        qt_exp_add_node(e, "Mul", add ? m : name, m, 2, x, c);
      }
      if (add) {
        char *c = qt_exp_str(e, "%s.beta", name);
        qt_exp_add_scalar_float(e, c, a->beta);
        qt_exp_add_node(e, "Add", name, y, 2, mul ? m : x, c);
      }
      return 0;
    }
    case QT_ACT_HARDSIGMOID:
    case QT_ACT_HARDSWISH: {
      const int swish = a->act == QT_ACT_HARDSWISH;
      const char *h = swish ? qt_exp_str(e, "%s.hardsigmoid", name) : y;
      Onnx__NodeProto *hs = qt_exp_add_node(e, "HardSigmoid", swish ? h : name, h, 1, x);
      qt_exp_attr_float(e, hs, "alpha", swish ? 1.0f / 6.0f : a->alpha);
      qt_exp_attr_float(e, hs, "beta", swish ? 0.5f : a->beta);
      if (swish) qt_exp_add_node(e, "Mul", name, y, 2, x, h);
      return 0;
    }
    case QT_ACT_SILU: {
      const char *sg = qt_exp_str(e, "%s.sigmoid", name);
      qt_exp_add_node(e, "Sigmoid", sg, sg, 1, x);
      qt_exp_add_node(e, "Mul", name, y, 2, x, sg);
      return 0;
    }
    case QT_ACT_GELU:
    case QT_ACT_GELU_TANH: {
      const int th = a->act == QT_ACT_GELU_TANH;
      char *c1 = qt_exp_str(e, "%s.one", name), *ch = qt_exp_str(e, "%s.half", name);
      char *u = qt_exp_str(e, "%s.u", name), *f = qt_exp_str(e, "%s.f", name), *p = qt_exp_str(e, "%s.p", name),
           *xh = qt_exp_str(e, "%s.xh", name);
      qt_exp_add_scalar_float(e, c1, 1.0f);
      qt_exp_add_scalar_float(e, ch, 0.5f);
      if (th) { /* u = sqrt(2 / pi) (x + 0.044715 x^3) */
        char *x2 = qt_exp_str(e, "%s.x2", name), *x3 = qt_exp_str(e, "%s.x3", name),
             *k = qt_exp_str(e, "%s.kappa", name), *kx3 = qt_exp_str(e, "%s.kx3", name),
             *sm = qt_exp_str(e, "%s.sum", name), *b = qt_exp_str(e, "%s.beta", name);
        qt_exp_add_scalar_float(e, k, 0.044715f);
        qt_exp_add_scalar_float(e, b, 0.7978845608028654f);
        qt_exp_add_node(e, "Mul", x2, x2, 2, x, x);
        qt_exp_add_node(e, "Mul", x3, x3, 2, x2, x);
        qt_exp_add_node(e, "Mul", kx3, kx3, 2, x3, k);
        qt_exp_add_node(e, "Add", sm, sm, 2, x, kx3);
        qt_exp_add_node(e, "Mul", u, u, 2, sm, b);
      } else { /* u = x / sqrt 2 */
        char *r = qt_exp_str(e, "%s.sqrt2", name);
        qt_exp_add_scalar_float(e, r, 1.4142135623730951f);
        qt_exp_add_node(e, "Div", u, u, 2, x, r);
      }
      qt_exp_add_node(e, th ? "Tanh" : "Erf", f, f, 1, u);
      qt_exp_add_node(e, "Add", p, p, 2, f, c1);
      qt_exp_add_node(e, "Mul", xh, xh, 2, x, ch);
      qt_exp_add_node(e, "Mul", name, y, 2, xh, p);
      return 0;
    }
    case QT_ACT_COUNT: break;
  }
  return qt_exp_node_err(e, "activation kind %d has no ONNX form", a->act);
}

static int op_pool(exporter *e, const char *op_type) {
  const qt_node *n = e->node;
  if (e->g->values[n->inputs[0]].ndim != 3) return qt_exp_node_err(e, "input is not an image");
  const value_info x = *vin(e, 0);
  if (x.pool_dq) { /* quantize -> [max pool -> Clip -> dequantize] (dequantize_before_pool) */
    const qt_node *dq = &e->g->nodes[x.pool_dq - 1], *q = &e->g->nodes[e->g->values[dq->inputs[0]].producer];
    char *pooled = qt_exp_str(e, "%s.pooled", n->name), *clipped = qt_exp_str(e, "%s.clipped", q->name);
    Onnx__NodeProto *o = qt_exp_add_node(e, op_type, n->name, pooled, 1, vname(e, dq->inputs[0]));
    qt_exp_attr_window(e, o, &n->attr);
    if (n->attr.ceil) qt_exp_attr_int(e, o, "ceil_mode", 1);
    emit_clip(e, q, x.container, pooled, clipped);
    emit_dequantize(e, dq, x.container, clipped, out(e));
    e->vi[n->output] = x;
    e->vi[n->output].container = 0;
    e->vi[n->output].pool_dq = 0;
    return 0;
  }
  Onnx__NodeProto *o = qt_exp_add_node(e, op_type, n->name, out(e), 1, in0(e));
  qt_exp_attr_window(e, o, &n->attr);
  if (n->op == QT_OP_AVG_POOL2D) qt_exp_attr_int(e, o, "count_include_pad", 1);
  if (n->attr.ceil) qt_exp_attr_int(e, o, "ceil_mode", 1);
  return 0;
}

static int op_global_avg_pool(exporter *e) {
  const qt_node *n = e->node;
  if (e->g->values[n->inputs[0]].ndim != 3) return qt_exp_node_err(e, "input is not an image");
  char *pooled = qt_exp_str(e, "%s.pooled", n->name); /* [N, C, 1, 1]; the graph's value is (C) */
  qt_exp_add_node(e, "GlobalAveragePool", n->name, pooled, 1, in0(e));
  qt_exp_attr_int(e, qt_exp_add_node(e, "Flatten", qt_exp_str(e, "%s.flatten", n->name), out(e), 1, pooled), "axis", 1);
  return 0;
}

static int op_flatten(exporter *e) {
  const qt_node *n = e->node;
  const qt_value *x = &e->g->values[n->inputs[0]];
  /* Reshape to [N, -1] (ONNX's Flatten with axis 1): ONNX Runtime moves a dequantize past a
   * Reshape, not past a Flatten, and so fuses the linear layer after it into its integer kernel */
  char *shape = qt_exp_str(e, "%s.shape", n->name);
  const int64_t two = 2, dims[2] = {0, -1};
  qt_exp_add_int64(e, shape, 1, &two, dims, 2);
  qt_exp_add_node(e, "Reshape", n->name, out(e), 2, in0(e), shape);
  value_info *o = &e->vi[n->output];
  if (x->ndim == 3) {
    const int H = (int)x->shape[0], W = (int)x->shape[1], C = (int)x->shape[2];
    if (H * W > 1 && C > 1) o->perm_h = H, o->perm_w = W, o->perm_c = C;
  } else {
    *o = *vin(e, 0);
  }
  return 0;
}

static int op_add(exporter *e) {
  const qt_node *n = e->node;
  const value_info *a = vin(e, 0), *b = vin(e, 1);
  if (a->perm_c != b->perm_c || a->perm_h != b->perm_h || a->perm_w != b->perm_w)
    return qt_exp_node_err(e, "adds a flattened image (ONNX order (c, h, w)) to a value in another order");
  qt_exp_add_node(e, "Add", n->name, out(e), 2, in0(e), vname(e, n->inputs[1]));
  e->vi[n->output] = *a;
  return 0;
}

/* a * b; a (C) vector b scaling an image a becomes [N, C, 1, 1] first (ONNX broadcasts from the
 * right). */
static int op_mul(exporter *e) {
  const qt_node *n = e->node;
  const value_info *a = vin(e, 0), *b = vin(e, 1);
  const char *bn = vname(e, n->inputs[1]);
  if (e->g->values[n->inputs[0]].ndim == 3 && e->g->values[n->inputs[1]].ndim == 1) {
    char *shape = qt_exp_str(e, "%s.shape", n->name), *b4 = qt_exp_str(e, "%s.b", n->name);
    const int64_t four = 4, dims[4] = {0, -1, 1, 1};
    qt_exp_add_int64(e, shape, 1, &four, dims, 4);
    qt_exp_add_node(e, "Reshape", b4, b4, 2, bn, shape);
    bn = b4;
  } else if (a->perm_c != b->perm_c || a->perm_h != b->perm_h || a->perm_w != b->perm_w) {
    return qt_exp_node_err(e, "multiplies a flattened image (ONNX order (c, h, w)) by a value in another order");
  }
  qt_exp_add_node(e, "Mul", n->name, out(e), 2, in0(e), bn);
  e->vi[n->output] = *a;
  return 0;
}

/* concat -> Concat along axis 1 (channels of [N, C, H, W], features of [N, F]). */
static int op_concat(exporter *e) {
  const qt_node *n = e->node;
  for (int k = 0; k < n->n_inputs; k++)
    if (vin(e, k)->perm_c)
      return qt_exp_node_err(e, "joins a flattened image (ONNX order (c, h, w)); the graph's is (h, w, c)");
  const char *in[QT_MAX_INPUTS] = {0};
  for (int k = 0; k < n->n_inputs; k++) in[k] = vname(e, n->inputs[k]);
  _Static_assert(QT_MAX_INPUTS == 4, "concat's inputs below");
  qt_exp_attr_int(e, qt_exp_add_node(e, "Concat", n->name, out(e), n->n_inputs, in[0], in[1], in[2], in[3]), "axis", 1);
  return keep_layout(e);
}

/* channel_shuffle -> Reshape to [N, g, C / g, (H, W)], Transpose of the two, Reshape back. */
static int op_channel_shuffle(exporter *e) {
  const qt_node *n = e->node;
  const qt_value *x = &e->g->values[n->inputs[0]];
  if (vin(e, 0)->perm_c)
    return qt_exp_node_err(e, "shuffles a flattened image (ONNX order (c, h, w)); the graph's is (h, w, c)");
  const int img = x->ndim == 3, G = n->attr.groups;
  const int64_t C = x->shape[x->ndim - 1];
  const int64_t grouped[5] = {0, G, C / G, x->shape[0], x->shape[1]}, back[4] = {0, C, x->shape[0], x->shape[1]};
  const int64_t n1 = img ? 5 : 3, n2 = img ? 4 : 2;
  char *s1 = qt_exp_str(e, "%s.grouped_shape", n->name), *s2 = qt_exp_str(e, "%s.shape", n->name),
       *t1 = qt_exp_str(e, "%s.grouped", n->name), *t2 = qt_exp_str(e, "%s.transposed", n->name);
  qt_exp_add_int64(e, s1, 1, &n1, grouped, n1);
  qt_exp_add_int64(e, s2, 1, &n2, back, n2);
  qt_exp_add_node(e, "Reshape", t1, t1, 2, in0(e), s1);
  Onnx__NodeProto *t = qt_exp_add_node(e, "Transpose", t2, t2, 1, t1);
  if (img)
    qt_exp_attr_ints(e, t, "perm", 5, 0, 2, 1, 3, 4);
  else
    qt_exp_attr_ints(e, t, "perm", 3, 0, 2, 1);
  qt_exp_add_node(e, "Reshape", n->name, out(e), 2, t2, s2);
  return keep_layout(e);
}

/* channel_slice -> Slice of axis 1 (channels or features) from begin to end. */
static int op_channel_slice(exporter *e) {
  const qt_node *n = e->node;
  if (vin(e, 0)->perm_c)
    return qt_exp_node_err(e, "slices a flattened image (ONNX order (c, h, w)); the graph's is (h, w, c)");
  const int64_t one = 1, b = n->attr.begin, en = n->attr.end, axis = 1;
  char *sb = qt_exp_str(e, "%s.starts", n->name), *se = qt_exp_str(e, "%s.ends", n->name),
       *sa = qt_exp_str(e, "%s.axes", n->name);
  qt_exp_add_int64(e, sb, 1, &one, &b, 1);
  qt_exp_add_int64(e, se, 1, &one, &en, 1);
  qt_exp_add_int64(e, sa, 1, &one, &axis, 1);
  qt_exp_add_node(e, "Slice", n->name, out(e), 4, in0(e), sb, se, sa);
  return keep_layout(e);
}

static int op_batch_norm(exporter *e) {
  const qt_node *n = e->node;
  if (vin(e, 0)->perm_c)
    return qt_exp_node_err(e,
                           "batch norm of a flattened image: ONNX orders its features (c, h, w), the graph (h, w, c)");
  const char *names[4];
  const int slots[4] = {n->param[QT_P_GAMMA], n->param[QT_P_BETA], n->buffer[QT_B_RUNNING_MEAN],
                        n->buffer[QT_B_RUNNING_VAR]};
  for (int k = 0; k < 4; k++) {
    const qt_param *p = &e->g->tensors[slots[k]];
    const float *d = (p->is_buffer ? e->g->buffers : e->g->params) + p->offset;
    names[k] = p->name;
    qt_exp_add_float(e, p->name, 1, &p->numel, d, p->numel);
  }
  Onnx__NodeProto *o =
      qt_exp_add_node(e, "BatchNormalization", n->name, out(e), 5, in0(e), names[0], names[1], names[2], names[3]);
  qt_exp_attr_float(e, o, "epsilon", n->attr.eps);
  return 0;
}

/* The data of node n's parameter in slot k. */
static const float *param_data(const exporter *e, const qt_node *n, int k) {
  return e->g->params + e->g->tensors[n->param[k]].offset;
}

/* A node "<node>.<what>" of op_type with inputs a (and b), its name also its output's; *node (when
 * not NULL) receives it, for attributes. */
static char *step(exporter *e, const char *op_type, const char *what, const char *a, const char *b,
                  Onnx__NodeProto **node) {
  char *t = qt_exp_str(e, "%s.%s", e->node->name, what);
  Onnx__NodeProto *o = b ? qt_exp_add_node(e, op_type, t, t, 2, a, b) : qt_exp_add_node(e, op_type, t, t, 1, a);
  if (node) *node = o;
  return t;
}
static char *reduce_mean_channels(exporter *e, const char *what, const char *x) {
  Onnx__NodeProto *o;
  char *t = step(e, "ReduceMean", what, x, NULL, &o);
  qt_exp_attr_ints(e, o, "axes", 1, 1);
  return t;
}

/* add_param -> Add of the parameter as [1, C, H, W] (an image's) or [1, F]. */
static int op_add_param(exporter *e) {
  const qt_node *n = e->node;
  const qt_value *x = &e->g->values[n->inputs[0]];
  if (vin(e, 0)->perm_c) return qt_exp_node_err(e, "adds a parameter to a flattened image");
  const qt_param *p = &e->g->tensors[n->param[QT_P_WEIGHT]];
  const float *d = param_data(e, n, QT_P_WEIGHT);
  if (x->ndim == 3) {
    const int64_t H = x->shape[0], W = x->shape[1], C = x->shape[2], dims[4] = {1, C, H, W};
    float *t = qt_exp_alloc(e, (size_t)(H * W * C) * sizeof *t);
    for (int64_t c = 0; c < C; c++)
      for (int64_t k = 0; k < H * W; k++) t[c * H * W + k] = d[k * C + c];
    qt_exp_add_float(e, p->name, 4, dims, t, H * W * C);
  } else {
    const int64_t dims[2] = {1, p->numel};
    qt_exp_add_float(e, p->name, 2, dims, d, p->numel);
  }
  qt_exp_add_node(e, "Add", n->name, out(e), 2, in0(e), p->name);
  return keep_layout(e);
}

/* resize -> Resize by scales [1, 1, 2, 2], as torch writes F.interpolate(scale_factor=2):
 * nearest with asymmetric coordinates rounded down, bilinear ('linear') with pytorch_half_pixel. */
static int op_resize(exporter *e) {
  const qt_node *n = e->node;
  const int64_t four = 4;
  const float scales[4] = {1.0f, 1.0f, 2.0f, 2.0f};
  char *sc = qt_exp_str(e, "%s.scales", n->name);
  qt_exp_add_float(e, sc, 1, &four, scales, 4);
  Onnx__NodeProto *o = qt_exp_add_node(e, "Resize", n->name, out(e), 3, in0(e), "", sc);
  const int bil = n->attr.mode == QT_RESIZE_BILINEAR;
  qt_exp_attr_str(e, o, "mode", bil ? "linear" : "nearest");
  qt_exp_attr_str(e, o, "coordinate_transformation_mode", bil ? "pytorch_half_pixel" : "asymmetric");
  if (!bil) qt_exp_attr_str(e, o, "nearest_mode", "floor");
  return keep_layout(e);
}

/* prelu -> PRelu with the slopes as [C, 1, 1] (an image's channels), [F] (a flat value's) or [1]
 * (one shared slope). */
static int op_prelu(exporter *e) {
  const qt_node *n = e->node;
  const qt_value *x = &e->g->values[n->inputs[0]];
  const qt_param *p = &e->g->tensors[n->param[QT_P_WEIGHT]];
  if (vin(e, 0)->perm_c && p->numel > 1) return qt_exp_node_err(e, "per-channel slopes of a flattened image");
  const int64_t C = x->shape[x->ndim - 1], img[3] = {C, 1, 1}, flat[1] = {p->numel};
  const int image = p->numel > 1 && x->ndim == 3;
  qt_exp_add_float(e, p->name, image ? 3 : 1, image ? img : flat, param_data(e, n, QT_P_WEIGHT), p->numel);
  qt_exp_add_node(e, "PRelu", n->name, out(e), 2, in0(e), p->name);
  return keep_layout(e);
}

/* layer_norm -> opset 13's ReduceMean over axis 1 (channels of [N, C, H, W], features of [N, F]),
 * Sub, Mul, ReduceMean, Add eps, Sqrt, Div, Mul weight, Add bias (weight and bias [C, 1, 1] for an
 * image, [F] for a flat value), as PyTorch writes LayerNorm before opset 17. */
static int op_layer_norm(exporter *e) {
  const qt_node *n = e->node;
  const qt_value *x = &e->g->values[n->inputs[0]];
  if (vin(e, 0)->perm_c)
    return qt_exp_node_err(e,
                           "layer norm of a flattened image: ONNX orders its features (c, h, w), the graph (h, w, c)");
  const int img = x->ndim == 3;
  const int64_t C = x->shape[x->ndim - 1], dims[3] = {C, 1, 1}, none = 0;
  const qt_param *w = &e->g->tensors[n->param[QT_P_GAMMA]], *b = &e->g->tensors[n->param[QT_P_BETA]];
  qt_exp_add_float(e, w->name, img ? 3 : 1, dims, param_data(e, n, QT_P_GAMMA), C);
  qt_exp_add_float(e, b->name, img ? 3 : 1, dims, param_data(e, n, QT_P_BETA), C);
  char *eps = qt_exp_str(e, "%s.eps", n->name);
  qt_exp_add_float(e, eps, 0, &none, &n->attr.eps, 1);
  char *mean = reduce_mean_channels(e, "mean", in0(e));
  char *d = step(e, "Sub", "centered", in0(e), mean, NULL);
  char *var = reduce_mean_channels(e, "var", step(e, "Mul", "squared", d, d, NULL));
  char *sd = step(e, "Sqrt", "std", step(e, "Add", "var_eps", var, eps, NULL), NULL, NULL);
  char *scaled = step(e, "Mul", "scaled", step(e, "Div", "normalized", d, sd, NULL), w->name, NULL);
  qt_exp_add_node(e, "Add", n->name, out(e), 2, scaled, b->name);
  return keep_layout(e);
}

/* attention -> per head MatMul(Q, K^T), Mul by 1 / sqrt(C / heads), Softmax over the last axis,
 * MatMul with V, and the heads and tokens back to [N, C, H, W] (Transposes and Reshapes). */
static int op_attention(exporter *e) {
  const qt_node *n = e->node;
  const qt_value *x = &e->g->values[n->inputs[0]];
  const int64_t H = x->shape[0], W = x->shape[1], C = x->shape[2], h = n->attr.heads, T = H * W;
  const int64_t three = 3, four = 4, none = 0;
  const int64_t flat[3] = {0, C, T}, heads[4] = {0, T, h, C / h}, tokens[3] = {0, T, C}, image[4] = {0, C, H, W};
  char *fs = qt_exp_str(e, "%s.flat_shape", n->name), *hs = qt_exp_str(e, "%s.heads_shape", n->name),
       *ts = qt_exp_str(e, "%s.tokens_shape", n->name), *is = qt_exp_str(e, "%s.image_shape", n->name);
  qt_exp_add_int64(e, fs, 1, &three, flat, 3);
  qt_exp_add_int64(e, hs, 1, &four, heads, 4);
  qt_exp_add_int64(e, ts, 1, &three, tokens, 3);
  qt_exp_add_int64(e, is, 1, &four, image, 4);
  const char *in[3];
  for (int k = 0; k < 3; k++) {
    if (vin(e, k)->perm_c) return qt_exp_node_err(e, "attention of a flattened image");
    in[k] = vname(e, n->inputs[k]);
  }
  static const char *const names[3] = {"q", "k", "v"};
  char *hd[3];
  for (int k = 0; k < 3; k++) {
    Onnx__NodeProto *t;
    char *flat_t = step(e, "Reshape", qt_exp_str(e, "%s_flat", names[k]), in[k], fs, NULL);
    char *tok = step(e, "Transpose", qt_exp_str(e, "%s_tokens", names[k]), flat_t, NULL, &t);
    qt_exp_attr_ints(e, t, "perm", 3, 0, 2, 1);
    char *split = step(e, "Reshape", qt_exp_str(e, "%s_split", names[k]), tok, hs, NULL);
    hd[k] = step(e, "Transpose", qt_exp_str(e, "%s_heads", names[k]), split, NULL, &t);
    if (k == 1) /* K^T */
      qt_exp_attr_ints(e, t, "perm", 4, 0, 2, 3, 1);
    else
      qt_exp_attr_ints(e, t, "perm", 4, 0, 2, 1, 3);
  }
  const float scale = (float)(1.0 / sqrt((double)(C / h)));
  char *sc = qt_exp_str(e, "%s.scale", n->name);
  qt_exp_add_float(e, sc, 0, &none, &scale, 1);
  Onnx__NodeProto *t;
  char *scores = step(e, "Mul", "scores", step(e, "MatMul", "qk", hd[0], hd[1], NULL), sc, NULL);
  char *probs = step(e, "Softmax", "probs", scores, NULL, &t);
  qt_exp_attr_int(e, t, "axis", -1);
  char *o = step(e, "Transpose", "out_tokens", step(e, "MatMul", "out_heads", probs, hd[2], NULL), NULL, &t);
  qt_exp_attr_ints(e, t, "perm", 4, 0, 2, 1, 3);
  char *ot = step(e, "Transpose", "out_channels", step(e, "Reshape", "out_merged", o, ts, NULL), NULL, &t);
  qt_exp_attr_ints(e, t, "perm", 3, 0, 2, 1);
  qt_exp_add_node(e, "Reshape", n->name, out(e), 2, ot, is);
  return keep_layout(e);
}

/* prepend_token -> the token [1, C, 1] Expand'ed to [N, C, 1] (N from Shape and Gather),
 * Concat'ed before the image's tokens [N, C, H * W] along axis 2 (torch's cat of class tokens),
 * Reshape'd to the graph's [N, C, 1, 1 + H * W]. */
static int op_prepend_token(exporter *e) {
  const qt_node *n = e->node;
  const qt_value *x = &e->g->values[n->inputs[0]];
  if (vin(e, 0)->perm_c) return qt_exp_node_err(e, "prepends a token to a flattened image");
  const int64_t C = x->shape[2], T = x->shape[0] * x->shape[1], three = 3, four = 4, one = 1, zero = 0;
  const int64_t flat[3] = {0, C, T}, image[4] = {0, C, 1, 1 + T}, rest[2] = {C, 1}, tdims[3] = {1, C, 1};
  const qt_param *p = &e->g->tensors[n->param[QT_P_WEIGHT]];
  qt_exp_add_float(e, p->name, 3, tdims, param_data(e, n, QT_P_WEIGHT), C);
  char *fs = qt_exp_str(e, "%s.flat_shape", n->name), *is = qt_exp_str(e, "%s.image_shape", n->name),
       *rs = qt_exp_str(e, "%s.rest", n->name), *b0 = qt_exp_str(e, "%s.batch_axis", n->name);
  qt_exp_add_int64(e, fs, 1, &three, flat, 3);
  qt_exp_add_int64(e, is, 1, &four, image, 4);
  const int64_t two = 2;
  qt_exp_add_int64(e, rs, 1, &two, rest, 2);
  qt_exp_add_int64(e, b0, 1, &one, &zero, 1);
  Onnx__NodeProto *t;
  char *batch = step(e, "Gather", "batch", step(e, "Shape", "shape", in0(e), NULL, NULL), b0, &t);
  qt_exp_attr_int(e, t, "axis", 0);
  char *es = step(e, "Concat", "expand_shape", batch, rs, &t);
  qt_exp_attr_int(e, t, "axis", 0);
  char *tok = step(e, "Expand", "tokens", p->name, es, NULL);
  char *cat = step(e, "Concat", "cat", tok, step(e, "Reshape", "flat", in0(e), fs, NULL), &t);
  qt_exp_attr_int(e, t, "axis", 2);
  qt_exp_add_node(e, "Reshape", n->name, out(e), 2, cat, is);
  return 0;
}

/* first_token -> the image's tokens [N, C, H * W], Gather of index 0 along axis 2: [N, C]. */
static int op_first_token(exporter *e) {
  const qt_node *n = e->node;
  const qt_value *x = &e->g->values[n->inputs[0]];
  if (vin(e, 0)->perm_c) return qt_exp_node_err(e, "takes a token of a flattened image");
  const int64_t three = 3, none = 0, zero = 0, flat[3] = {0, x->shape[2], x->shape[0] * x->shape[1]};
  char *fs = qt_exp_str(e, "%s.flat_shape", n->name), *ix = qt_exp_str(e, "%s.index", n->name);
  qt_exp_add_int64(e, fs, 1, &three, flat, 3);
  qt_exp_add_int64(e, ix, 0, &none, &zero, 1);
  Onnx__NodeProto *g =
      qt_exp_add_node(e, "Gather", n->name, out(e), 2, step(e, "Reshape", "flat", in0(e), fs, NULL), ix);
  qt_exp_attr_int(e, g, "axis", 2);
  return 0;
}

static int export_node(exporter *e) {
  const qt_node *n = e->node;
  switch (n->op) {
    case QT_OP_INPUT: return 0;
    case QT_OP_QUANTIZE: return op_quantize(e);
    case QT_OP_DEQUANTIZE: return op_dequantize(e);
    case QT_OP_CONV2D: return op_conv(e);
    case QT_OP_LINEAR: return op_linear(e);
    case QT_OP_RELU:
      qt_exp_add_node(e, "Relu", n->name, out(e), 1, in0(e));
      e->vi[n->output] = *vin(e, 0);
      return 0;
    case QT_OP_RELU6: return op_relu6(e);
    case QT_OP_MAX_POOL2D: return op_pool(e, "MaxPool");
    case QT_OP_AVG_POOL2D: return op_pool(e, "AveragePool");
    case QT_OP_GLOBAL_AVG_POOL: return op_global_avg_pool(e);
    case QT_OP_FLATTEN: return op_flatten(e);
    case QT_OP_ADD: return op_add(e);
    case QT_OP_ACTIVATION: return op_activation(e);
    case QT_OP_MUL: return op_mul(e);
    case QT_OP_CONCAT: return op_concat(e);
    case QT_OP_CHANNEL_SHUFFLE: return op_channel_shuffle(e);
    case QT_OP_CHANNEL_SLICE: return op_channel_slice(e);
    case QT_OP_BATCH_NORM: return op_batch_norm(e);
    case QT_OP_LAYER_NORM: return op_layer_norm(e);
    case QT_OP_ATTENTION: return op_attention(e);
    case QT_OP_ADD_PARAM: return op_add_param(e);
    case QT_OP_PREPEND_TOKEN: return op_prepend_token(e);
    case QT_OP_FIRST_TOKEN: return op_first_token(e);
    case QT_OP_PRELU: return op_prelu(e);
    case QT_OP_RESIZE: return op_resize(e);
    case QT_OP_DROPOUT: /* an fp32 graph's: the inference model has none (a Q/DQ graph holds no dropout) */
      qt_exp_add_node(e, "Identity", n->name, out(e), 1, in0(e));
      return keep_layout(e);
    case QT_OP_FAKE_QUANT:
    case QT_OP_CONV_BN:
    case QT_OP_COUNT: break;
  }
  return qt_exp_node_err(e, "op '%s' has no ONNX QDQ form", qt_op_name(n->op));
}

/* ---- the model ------------------------------------------------------------------------------- */

/* A prepared (training) graph holds fake_quant / conv_bn nodes or weight qparams without
 * integers: it is not what the export writes. */
static int refuse_prepared(exporter *e) {
  for (int i = 0; i < e->g->n_nodes; i++) {
    const qt_node *n = &e->g->nodes[i];
    e->node = n;
    if (n->op == QT_OP_FAKE_QUANT || n->op == QT_OP_CONV_BN)
      return qt_exp_node_err(
          e,
          "this is a prepared (training) graph, such as model_trained.h5; the export takes the Q/DQ graph "
          "that convert writes (model_qdq.h5)");
    if (n->wq && !n->wq->qweight)
      return qt_exp_node_err(
          e,
          "the weight has qparams but no integers: a prepared (training) graph, such as model_trained.h5; "
          "the export takes the Q/DQ graph that convert writes (model_qdq.h5)");
    if ((n->op == QT_OP_QUANTIZE || n->op == QT_OP_DEQUANTIZE) && (!n->q || !n->q->calibrated))
      return qt_exp_node_err(e, "no qparams");
  }
  e->node = NULL;
  return 0;
}

/* [batch, C, H, W] for an image value, [batch, F] for a flat one. */
static Onnx__ValueInfoProto *value_info_proto(exporter *e, int v) {
  const qt_value *val = &e->g->values[v];
  Onnx__TensorShapeProto *shape = qt_exp_alloc(e, sizeof *shape);
  onnx__tensor_shape_proto__init(shape);
  int64_t d[4];
  int nd = 1;
  if (val->ndim == 3) {
    d[1] = val->shape[2], d[2] = val->shape[0], d[3] = val->shape[1];
    nd = 4;
  } else {
    for (int k = 0; k < val->ndim; k++) d[1 + k] = val->shape[k];
    nd = 1 + val->ndim;
  }
  shape->n_dim = (size_t)nd;
  shape->dim = qt_exp_alloc(e, (size_t)nd * sizeof *shape->dim);
  for (int k = 0; k < nd; k++) {
    Onnx__TensorShapeProto__Dimension *dim = qt_exp_alloc(e, sizeof *dim);
    onnx__tensor_shape_proto__dimension__init(dim);
    if (k == 0) {
      dim->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
      dim->dim_param = qt_exp_str(e, "batch");
    } else {
      dim->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
      dim->dim_value = d[k];
    }
    shape->dim[k] = dim;
  }
  Onnx__TypeProto__Tensor *tt = qt_exp_alloc(e, sizeof *tt);
  onnx__type_proto__tensor__init(tt);
  tt->has_elem_type = 1;
  tt->elem_type = T_FLOAT;
  tt->shape = shape;
  Onnx__TypeProto *type = qt_exp_alloc(e, sizeof *type);
  onnx__type_proto__init(type);
  type->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
  type->tensor_type = tt;
  Onnx__ValueInfoProto *vi = qt_exp_alloc(e, sizeof *vi);
  onnx__value_info_proto__init(vi);
  vi->name = qt_exp_str(e, "%s", vname(e, v));
  vi->type = type;
  return vi;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* Every tensor name (graph input, node outputs, initializers) defined once. */
static int check_names(exporter *e) {
  const size_t n = 1 + e->n_nodes + e->n_inits;
  const char **names = malloc(n * sizeof *names);
  QT_ASSERT(names, "onnx export: out of memory");
  size_t k = 0;
  names[k++] = "input";
  for (size_t i = 0; i < e->n_nodes; i++) names[k++] = e->nodes[i]->output[0];
  for (size_t i = 0; i < e->n_inits; i++) names[k++] = e->inits[i]->name;
  qsort(names, n, sizeof *names, cmp_str);
  int rc = 0;
  for (size_t i = 1; i < n && !rc; i++)
    if (strcmp(names[i - 1], names[i]) == 0)
      rc = qt_exp_node_err(e,
                           "the ONNX tensor name '%s' would be defined twice (a node named like another node's tensor, "
                           "or like the graph input 'input' or output 'logits'); rename the node",
                           names[i]);
  free(names);
  return rc;
}

static Onnx__StringStringEntryProto *meta(exporter *e, const char *key, const char *value) {
  Onnx__StringStringEntryProto *m = qt_exp_alloc(e, sizeof *m);
  onnx__string_string_entry_proto__init(m);
  m->key = qt_exp_str(e, "%s", key);
  m->value = qt_exp_str(e, "%s", value);
  return m;
}

static char *preprocessing_text(exporter *e) {
  const qt_input_preprocessing *p = &e->g->input_pre;
  qt_strbuf b = {0};
  qt_strbuf_printf(&b, "input[n, c, h, w] = (float32(pixel[n, h, w, c]) / 255 - mean[c]) / std[c] in float32; mean [");
  for (int c = 0; c < p->channels; c++) qt_strbuf_printf(&b, "%s%.9g", c ? ", " : "", p->mean[c]);
  qt_strbuf_printf(&b, "], std [");
  for (int c = 0; c < p->channels; c++) qt_strbuf_printf(&b, "%s%.9g", c ? ", " : "", p->std[c]);
  qt_strbuf_printf(&b, "]");
  char *s = qt_exp_str(e, "%s", b.s);
  free(b.s);
  return s;
}

static int write_model(exporter *e) {
  const qt_graph *g = e->g;
  Onnx__GraphProto *gp = qt_exp_alloc(e, sizeof *gp);
  onnx__graph_proto__init(gp);
  gp->name = qt_exp_str(e, "%s", g->name);
  gp->n_node = e->n_nodes;
  gp->node = e->nodes;
  gp->n_initializer = e->n_inits;
  gp->initializer = e->inits;
  gp->n_input = 1;
  gp->input = qt_exp_alloc(e, sizeof *gp->input);
  gp->input[0] = value_info_proto(e, g->input);
  gp->n_output = 1;
  gp->output = qt_exp_alloc(e, sizeof *gp->output);
  gp->output[0] = value_info_proto(e, g->output);
  gp->doc_string =
      qt_exp_str(e,
                 "Q/DQ graph '%s' exported by qat (onnx/export.c): activations NCHW, QuantizeLinear / "
                 "DequantizeLinear at every quantization point, integer weights through DequantizeLinear, fp32 "
                 "biases",
                 g->name);

  Onnx__OperatorSetIdProto *ops = qt_exp_alloc(e, sizeof *ops);
  onnx__operator_set_id_proto__init(ops);
  ops->domain = qt_exp_str(e, "%s", "");
  ops->has_version = 1;
  ops->version = QT_ONNX_EXPORT_OPSET;

  Onnx__ModelProto m;
  onnx__model_proto__init(&m);
  m.has_ir_version = 1;
  m.ir_version = QT_ONNX_EXPORT_IR_VERSION;
  m.n_opset_import = 1;
  m.opset_import = qt_exp_alloc(e, sizeof *m.opset_import);
  m.opset_import[0] = ops;
  m.producer_name = qt_exp_str(e, "qat");
  m.producer_version = qt_exp_str(e, "1");
  m.graph = gp;
  m.n_metadata_props = g->input_pre.set ? 2 : 1;
  m.metadata_props = qt_exp_alloc(e, m.n_metadata_props * sizeof *m.metadata_props);
  m.metadata_props[0] = meta(e, "qt.layout", "input NCHW [batch, C, H, W]; the Q/DQ graph it came from is NHWC");
  if (g->input_pre.set) m.metadata_props[1] = meta(e, "qt.input_preprocessing", preprocessing_text(e));

  const size_t len = onnx__model_proto__get_packed_size(&m);
  if (len > ONNX_MAX_BYTES)
    return qt_exp_node_err(e, "the model would take %zu bytes, above protobuf's 2 GB limit", len);
  uint8_t *buf = malloc(len ? len : 1);
  QT_ASSERT(buf, "onnx export: out of memory (%zu bytes)", len);
  const size_t packed = onnx__model_proto__pack(&m, buf);
  QT_ASSERT(packed == len, "onnx export: packed %zu bytes, expected %zu", packed, len);
  char err[QT_ERR_LEN];
  /* The atomic write renames a new file over path: a device or symlink such as /dev/stdout would
   * be replaced by a regular file. */
  struct stat sb;
  if (lstat(e->path, &sb) == 0 && !S_ISREG(sb.st_mode)) {
    free(buf);
    return qt_err(e->err,
                  "onnx export: %s exists and is not a regular file (the model is written to a new file "
                  "renamed over the path)",
                  e->path);
  }
  const int rc = qt_write_file_atomic(e->path, (const char *)buf, len, err);
  free(buf);
  if (rc) {
    e->info.io_error = 1;
    return qt_err(e->err, "onnx export: %s", err);
  }
  e->info.bytes = (int64_t)len;
  e->info.nodes = (int)e->n_nodes;
  e->info.initializers = (int)e->n_inits;
  return 0;
}

int qt_onnx_export_qdq(const qt_graph *g, const char *path, qt_onnx_export_info *info, char *err) {
  return qt_onnx_export_qdq_opt(g, path, NULL, info, err);
}

int qt_onnx_export_qdq_opt(const qt_graph *g, const char *path, const qt_onnx_export_options *opt,
                           qt_onnx_export_info *info, char *err) {
  const uint32_t one = 1;
  QT_ASSERT(*(const unsigned char *)&one == 1, "onnx export: raw tensor data is written little-endian only");
  QT_ASSERT(g && g->finalized, "onnx export: graph not finalized");
  exporter e;
  memset(&e, 0, sizeof e);
  e.g = g;
  e.path = path;
  e.err = err;
  if (opt) e.opt = *opt;
  e.info.ir_version = QT_ONNX_EXPORT_IR_VERSION;
  e.info.opset = QT_ONNX_EXPORT_OPSET;
  e.vi = calloc((size_t)g->n_values, sizeof *e.vi);
  QT_ASSERT(e.vi, "onnx export: out of memory");
  int rc = refuse_prepared(&e);
  if (!rc && g->output == g->input) rc = qt_exp_node_err(&e, "the graph output is its input: nothing to export");
  for (int i = 0; !rc && i < g->n_nodes; i++) {
    e.node = &g->nodes[i];
    rc = export_node(&e);
  }
  if (!rc) {
    e.node = &g->nodes[g->values[g->output].producer];
    if (e.vi[g->output].perm_c)
      rc = qt_exp_node_err(&e,
                           "the graph output is a flattened image: ONNX would order it (c, h, w), the graph (h, w, c)");
    else if (e.vi[g->output].container)
      rc = qt_exp_node_err(&e, "the graph output is a quantize output (integers); a Q/DQ graph ends in fp32");
  }
  if (!rc) rc = check_names(&e);
  e.node = NULL;
  if (!rc) rc = write_model(&e);
  if (info) *info = e.info;
  qt_exp_pool_free(&e);
  return rc;
}
