/* Lowering of a Q/DQ graph to int8 kernels and fp32 fallback partitions, and the runtime
 * that executes the result (see backend.h).
 *
 * Lowering walks the graph in topological order and gives every value a representation:
 * fp32 (a float buffer), or u8 / i32 integers with the qparams that turn them into the value
 * the Q/DQ graph computes. A dequantize is free (it only records qparams on the integer
 * buffer); its fp32 form is materialized only when an fp32 consumer needs it. Max pooling
 * and flatten keep a u8 representation (dequantize is monotone and elementwise), so the
 * int8 kernels chain over u8 NHWC tensors; a residual add of two u8 tensors requantizes
 * straight to u8 (lower_add_u8). Each runtime buffer ("slot") is allocated from the
 * context's arena at every run. */
#include "backend/runtimes.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/int8.h"

typedef enum { REP_F32, REP_U8, REP_I32 } rep_kind;

typedef struct {
  rep_kind kind;
  int slot;     /* buffer holding the value's representation */
  int f32_slot; /* its fp32 form once materialized, else -1 (REP_F32: = slot) */
  int channels; /* REP_U8 / REP_I32: qparams (per tensor: 1) along the last axis */
  float *scale; /* owned by the model (kept list) */
  int32_t *zero_point;
} value_rep;

typedef enum { ST_QUANTIZE, ST_DEQUANTIZE, ST_INT8, ST_REQUANTIZE, ST_FALLBACK, ST_ADD_U8 } step_kind;

typedef struct {
  step_kind kind;
  int in[2], out;   /* slots */
  int64_t in_numel; /* per sample, of in[0] */
  /* quantize / dequantize / requantize */
  int channels;
  float *scale;
  int32_t *zero_point;
  int qmin, qmax;
  int int_u8; /* the integer side is u8 (else i32) */
  /* int8 kernel */
  qt_int8_op *op;
  /* u8 add: each input's dequantized values by integer (256 entries), a fused relu or relu6 */
  float *lut[2];
  int relu, relu6;
  /* fallback: the node of the Q/DQ graph, run by qt_node_forward */
  int node;
  int in_ndim[2];
  int64_t in_shape[2][3];
} step;

typedef struct {
  size_t bytes; /* per sample */
} slot_info;

struct qt_lowered {
  char name[QT_NAME_LEN];
  int in_h, in_w, in_c;
  int64_t out_numel;
  int input_slot, output_slot;
  step *steps;
  int n_steps, cap_steps;
  slot_info *slots;
  int n_slots, cap_slots;
  qt_part_list parts;
  void **kept; /* owned allocations (qparam copies) */
  int n_kept, cap_kept;
  qt_ctx *ctx;
  void **bufs;       /* per slot, during a run */
  const qt_graph *g; /* the Q/DQ graph (borrowed): the fallbacks' nodes and parameters */
};

static void *keep(qt_lowered *m, size_t bytes) {
  void *p = calloc(1, bytes ? bytes : 1);
  QT_ASSERT(p, "out of memory");
  m->kept = qt_grow(m->kept, &m->cap_kept, m->n_kept + 1, sizeof *m->kept, "a lowered model table");
  m->kept[m->n_kept++] = p;
  return p;
}

static void *keep_copy(qt_lowered *m, const void *src, size_t bytes) {
  void *p = keep(m, bytes);
  memcpy(p, src, bytes);
  return p;
}

static int new_slot(qt_lowered *m, size_t bytes_per_sample) {
  m->slots = qt_grow(m->slots, &m->cap_slots, m->n_slots + 1, sizeof *m->slots, "a lowered model table");
  m->slots[m->n_slots].bytes = bytes_per_sample;
  return m->n_slots++;
}

static step *new_step(qt_lowered *m, step_kind kind) {
  m->steps = qt_grow(m->steps, &m->cap_steps, m->n_steps + 1, sizeof *m->steps, "a lowered model table");
  step *s = &m->steps[m->n_steps++];
  memset(s, 0, sizeof *s);
  s->kind = kind;
  s->in[0] = s->in[1] = s->out = -1;
  return s;
}

/* ---- lowering ----------------------------------------------------------------------------- */

typedef struct {
  const qt_graph *g;
  qt_lowered *m;
  value_rep *rep; /* per value */
  int *consumer;  /* per value: its only consuming node, or -1 (none or several) */
  int *done;      /* per node: lowered as part of an earlier pattern */
  char *err;
} lowering;

static const float *param_data(const qt_graph *g, int t) { return t >= 0 ? g->params + g->tensors[t].offset : NULL; }

/* The fp32 form of value v, materializing it with a dequantize step on first use. */
static int f32_slot(lowering *L, int v) {
  value_rep *r = &L->rep[v];
  if (r->f32_slot >= 0) return r->f32_slot;
  const qt_value *val = &L->g->values[v];
  step *s = new_step(L->m, ST_DEQUANTIZE);
  s->in[0] = r->slot;
  s->in_numel = qt_value_numel(val);
  s->out = new_slot(L->m, (size_t)s->in_numel * sizeof(float));
  s->channels = r->channels;
  s->scale = r->scale;
  s->zero_point = r->zero_point;
  s->int_u8 = r->kind == REP_U8;
  r->f32_slot = s->out;
  qt_part_add(&L->m->parts, QT_PART_BOUNDARY, val->name, "dequantize %s -> fp32 (for an fp32 consumer)",
              r->kind == REP_U8 ? "u8" : "i32");
  return s->out;
}

static void set_qparams(lowering *L, value_rep *r, const qt_qstate *q) {
  r->channels = q->channels;
  r->scale = keep_copy(L->m, q->scale, (size_t)q->channels * sizeof(float));
  r->zero_point = keep_copy(L->m, q->zero_point, (size_t)q->channels * sizeof(int32_t));
}

static void lower_quantize(lowering *L, int i) {
  const qt_node *n = &L->g->nodes[i];
  const qt_qstate *q = n->q;
  const int x = f32_slot(L, n->inputs[0]);
  step *s = new_step(L->m, ST_QUANTIZE);
  s->in[0] = x;
  s->in_numel = qt_value_numel(&L->g->values[n->output]);
  s->int_u8 = q->spec.qmin >= 0 && q->spec.qmax <= 255;
  s->out = new_slot(L->m, (size_t)s->in_numel * (s->int_u8 ? 1 : sizeof(int32_t)));
  s->qmin = q->spec.qmin;
  s->qmax = q->spec.qmax;
  value_rep *r = &L->rep[n->output];
  r->kind = s->int_u8 ? REP_U8 : REP_I32;
  r->slot = s->out;
  r->f32_slot = -1;
  set_qparams(L, r, q);
  s->channels = r->channels;
  s->scale = r->scale;
  s->zero_point = r->zero_point;
  qt_part_add(&L->m->parts, QT_PART_BOUNDARY, n->name, "quantize fp32 -> %s [%d, %d]", s->int_u8 ? "u8" : "i32",
              q->spec.qmin, q->spec.qmax);
}

/* Whether node i starts dq -> conv/linear [-> relu | relu6] -> q with u8 activations and s8
 * per-channel symmetric weights. Returns NULL and fills relu/quant, or the reason not. */
static const char *match_int8_layer(lowering *L, int i, int *relu, int *quant) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  const value_rep *in = &L->rep[n->inputs[0]];
  *relu = -1;
  *quant = -1;
  if (!n->wq || !n->wq->qweight) return "weights are not quantized (fp32 layer)";
  if (in->kind != REP_U8) return "input is not a u8-quantized tensor (no dequantize before it)";
  if (in->channels != 1) return "input has per-channel activation qparams";
  if (n->wq->spec.qmin < -128 || n->wq->spec.qmax > 127) return "weight range does not fit s8";
  for (int c = 0; c < n->wq->channels; c++)
    if (n->wq->zero_point[c] != 0) return "weights have a non-zero zero point";
  int v = n->output;
  int c = L->consumer[v];
  if (v == g->output || c < 0) return "output is not consumed by exactly one node (no requantization point)";
  if (g->nodes[c].op == QT_OP_RELU || g->nodes[c].op == QT_OP_RELU6) {
    *relu = c;
    v = g->nodes[c].output;
    c = L->consumer[v];
    if (v == g->output || c < 0) return "relu output is not consumed by exactly one quantize";
  }
  if (g->nodes[c].op != QT_OP_QUANTIZE) return "output is not followed by a quantize (no requantization point)";
  const qt_qstate *q = g->nodes[c].q;
  if (q->channels != 1) return "output has per-channel activation qparams";
  if (q->spec.qmin < 0 || q->spec.qmax > 255) return "output range does not fit u8";
  *quant = c;
  return NULL;
}

static void lower_int8_layer(lowering *L, int i, int relu, int quant, const char **why) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  const qt_node *qn = &g->nodes[quant];
  const value_rep *in = &L->rep[n->inputs[0]];
  const qt_qstate *wq = n->wq;
  const qt_value *xv = &g->values[n->inputs[0]], *yv = &g->values[n->output];
  const int is_conv = n->op == QT_OP_CONV2D;
  const int OC = n->attr.out_channels;
  const int64_t inner = wq->n_qweight / OC;
  const float s_x = in->scale[0], s_out = qn->q->scale[0];
  const int zp_x = in->zero_point[0], zp_out = qn->q->zero_point[0];
  const int qmin = qn->q->spec.qmin, qmax = qn->q->spec.qmax;

  qt_int8_params p;
  memset(&p, 0, sizeof p);
  p.kind = is_conv ? QT_INT8_CONV : QT_INT8_LINEAR;
  if (is_conv) {
    p.H = (int)xv->shape[0], p.W = (int)xv->shape[1], p.C = (int)xv->shape[2];
    p.OH = (int)yv->shape[0], p.OW = (int)yv->shape[1];
    p.KH = n->attr.kernel_h, p.KW = n->attr.kernel_w, p.stride_h = n->attr.stride_h, p.stride_w = n->attr.stride_w;
    p.pad_h = n->attr.pad_h, p.pad_w = n->attr.pad_w;
    p.groups = n->attr.groups;
    p.zp_src = zp_x;
    /* oneDNN rounds (x + zp), the reference round(x) + zp: equal on exact ties only for an
     * even zp. An odd one takes an f32 dst and the reference's requantization. */
    p.dst_f32 = zp_out & 1;
    p.zp_dst = p.dst_f32 ? 0 : zp_out;
  } else {
    p.H = p.W = p.OH = p.OW = 1;
    p.C = (int)qt_value_numel(xv);
    p.dst_f32 = zp_out != 0; /* inner product takes no zero points in oneDNN 2.6 */
  }
  p.OC = OC;
  const int six = relu >= 0 && g->nodes[relu].op == QT_OP_RELU6;
  p.relu = relu >= 0 && !six;
  p.relu6 = six;
  p.relu6_hi = (float)(6.0 / (double)s_out); /* relu6 in output units, before the zero point */
  if (!p.dst_f32 && (qmin > 0 || qmax < 255)) {
    p.clip = 1;
    p.clip_lo = qmin - zp_out;
    p.clip_hi = qmax - zp_out;
  }
  int8_t *w8 = malloc((size_t)wq->n_qweight);
  float *bias = malloc((size_t)OC * sizeof(float)), *oscale = malloc((size_t)OC * sizeof(float));
  QT_ASSERT(w8 && bias && oscale, "out of memory");
  for (int64_t k = 0; k < wq->n_qweight; k++) w8[k] = (int8_t)wq->qweight[k];
  const float *b = param_data(g, n->param[QT_P_BIAS]);
  for (int c = 0; c < OC; c++) {
    const double s_w = wq->scale[wq->channels == 1 ? 0 : c];
    /* the bias in accumulator units: an int32 bias is that already (exact in the f32 bias while
     * |qb - zp_x * sum| < 2^24); a float one is divided by s_x * s_w */
    double acc_bias = wq->qbias ? (double)wq->qbias[c] : b ? (double)b[c] / ((double)s_x * s_w) : 0.0;
    if (!is_conv && zp_x) { /* inner product takes no zero point: fold -zp_x * sum_k W[c, k] */
      int64_t sum = 0;
      for (int64_t k = 0; k < inner; k++) sum += wq->qweight[c * inner + k];
      acc_bias -= (double)zp_x * (double)sum;
    }
    bias[c] = (float)acc_bias;
    oscale[c] = (float)((double)s_x * s_w / (double)s_out);
  }
  char err[QT_ERR_LEN];
  qt_int8_op *op = qt_int8_op_create(&p, w8, bias, oscale, err);
  free(w8);
  free(bias);
  free(oscale);
  if (!op) {
    static char reason[QT_ERR_LEN];
    snprintf(reason, sizeof reason, "%s", err);
    *why = reason;
    return;
  }
  *why = NULL;
  step *s = new_step(L->m, ST_INT8);
  s->op = op;
  s->in[0] = in->slot;
  s->in_numel = qt_value_numel(xv);
  const int64_t out_numel = qt_value_numel(yv);
  s->out = new_slot(L->m, (size_t)out_numel * (p.dst_f32 ? sizeof(float) : 1));
  int out_slot = s->out;
  if (p.dst_f32) {
    step *r = new_step(L->m, ST_REQUANTIZE);
    r->in[0] = out_slot;
    r->in_numel = out_numel;
    r->out = new_slot(L->m, (size_t)out_numel);
    r->qmin = qmin;
    r->qmax = qmax;
    r->zero_point = keep_copy(L->m, &zp_out, sizeof zp_out);
    out_slot = r->out;
  }
  value_rep *r = &L->rep[qn->output];
  r->kind = REP_U8;
  r->slot = out_slot;
  r->f32_slot = -1;
  set_qparams(L, r, qn->q);
  L->done[i] = 1;
  if (relu >= 0) L->done[relu] = 1;
  L->done[quant] = 1;
  char nodes[256];
  snprintf(nodes, sizeof nodes, "%s -> %s%s%s -> %s", g->nodes[g->values[n->inputs[0]].producer].name, n->name,
           relu >= 0 ? " -> " : "", relu >= 0 ? g->nodes[relu].name : "", qn->name);
  qt_part_add(&L->m->parts, QT_PART_INT8, nodes, "%s u8 x s8 -> u8%s%s (%s)",
              !is_conv                                                       ? "inner product"
              : n->attr.groups == n->attr.out_channels && n->attr.groups > 1 ? "depthwise conv"
              : n->attr.groups > 1                                           ? "grouped conv"
                                                                             : "conv",
              six         ? ", fused relu6"
              : relu >= 0 ? ", fused relu"
                          : "",
              p.dst_f32  ? (is_conv ? ", f32 dst requantized (odd output zero point)"
                                    : ", f32 dst requantized (output zero point)")
              : p.zp_dst ? ", output zero point"
                         : "",
              qt_int8_op_impl(op));
}

static const char *lower_max_pool_u8(lowering *L, int i) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  const value_rep *in = &L->rep[n->inputs[0]];
  const qt_value *xv = &g->values[n->inputs[0]], *yv = &g->values[n->output];
  qt_int8_params p;
  memset(&p, 0, sizeof p);
  p.kind = QT_INT8_MAX_POOL;
  p.H = (int)xv->shape[0], p.W = (int)xv->shape[1], p.C = (int)xv->shape[2];
  p.OH = (int)yv->shape[0], p.OW = (int)yv->shape[1], p.OC = p.C;
  p.KH = n->attr.kernel_h, p.KW = n->attr.kernel_w, p.stride_h = n->attr.stride_h, p.stride_w = n->attr.stride_w;
  p.pad_h = n->attr.pad_h, p.pad_w = n->attr.pad_w;
  char err[QT_ERR_LEN];
  qt_int8_op *op = qt_int8_op_create(&p, NULL, NULL, NULL, err);
  if (!op) {
    static char reason[QT_ERR_LEN];
    snprintf(reason, sizeof reason, "%s", err);
    return reason;
  }
  step *s = new_step(L->m, ST_INT8);
  s->op = op;
  s->in[0] = in->slot;
  s->in_numel = qt_value_numel(xv);
  s->out = new_slot(L->m, (size_t)qt_value_numel(yv));
  value_rep *r = &L->rep[n->output];
  *r = *in; /* same qparams: max commutes with a monotone dequantize */
  r->slot = s->out;
  r->f32_slot = -1;
  qt_part_add(&L->m->parts, QT_PART_INT8, n->name, "max pool on u8 (%s)", qt_int8_op_impl(op));
  return NULL;
}

/* dq(a) + dq(b) [-> relu | relu6] -> q on u8 tensors, each input with its own scale and zero
 * point. The step computes per element what the Q/DQ graph computes, in the same float operations:
 * (float)(q - zp) * s for each input (a 256-entry table), one float add, the relu (relu6), then the
 * reference quantize; so it is bit-exact, and no fp32 tensor is materialized. */
static const char *lower_add_u8(lowering *L, int i) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  const value_rep *in[2] = {&L->rep[n->inputs[0]], &L->rep[n->inputs[1]]};
  for (int k = 0; k < 2; k++) {
    if (in[k]->kind != REP_U8) return "an input is not a u8-quantized tensor (no dequantize before it)";
    if (in[k]->channels != 1) return "an input has per-channel activation qparams";
  }
  int v = n->output, c = L->consumer[v], relu = -1;
  if (v == g->output || c < 0) return "output is not consumed by exactly one node (no requantization point)";
  if (g->nodes[c].op == QT_OP_RELU || g->nodes[c].op == QT_OP_RELU6) {
    relu = c;
    v = g->nodes[c].output;
    c = L->consumer[v];
    if (v == g->output || c < 0) return "relu output is not consumed by exactly one quantize";
  }
  if (g->nodes[c].op != QT_OP_QUANTIZE) return "output is not followed by a quantize (no requantization point)";
  const qt_node *qn = &g->nodes[c];
  if (qn->q->channels != 1) return "output has per-channel activation qparams";
  if (qn->q->spec.qmin < 0 || qn->q->spec.qmax > 255) return "output range does not fit u8";
  qt_lowered *m = L->m;
  step *s = new_step(m, ST_ADD_U8);
  s->in[0] = in[0]->slot;
  s->in[1] = in[1]->slot;
  s->in_numel = qt_value_numel(&g->values[n->output]);
  s->out = new_slot(m, (size_t)s->in_numel);
  for (int k = 0; k < 2; k++) {
    s->lut[k] = keep(m, 256 * sizeof(float));
    for (int q = 0; q < 256; q++) s->lut[k][q] = (float)(q - in[k]->zero_point[0]) * in[k]->scale[0];
  }
  s->relu6 = relu >= 0 && g->nodes[relu].op == QT_OP_RELU6;
  s->relu = relu >= 0 && !s->relu6;
  s->qmin = qn->q->spec.qmin;
  s->qmax = qn->q->spec.qmax;
  value_rep *r = &L->rep[qn->output];
  r->kind = REP_U8;
  r->slot = s->out;
  r->f32_slot = -1;
  set_qparams(L, r, qn->q);
  s->channels = 1;
  s->scale = r->scale;
  s->zero_point = r->zero_point;
  L->done[i] = 1;
  if (relu >= 0) L->done[relu] = 1;
  L->done[c] = 1;
  char nodes[256];
  snprintf(nodes, sizeof nodes, "%s + %s -> %s%s%s -> %s", g->nodes[g->values[n->inputs[0]].producer].name,
           g->nodes[g->values[n->inputs[1]].producer].name, n->name, relu >= 0 ? " -> " : "",
           relu >= 0 ? g->nodes[relu].name : "", qn->name);
  qt_part_add(&m->parts, QT_PART_INT8, nodes, "add u8 + u8 -> u8%s (own scales and zero points, requantized)",
              s->relu6    ? ", fused relu6"
              : relu >= 0 ? ", fused relu"
                          : "");
  return NULL;
}

/* dq -> fp32 op: the node runs with the framework's fp32 kernels on fp32 inputs. */
static void lower_fallback(lowering *L, int i, const char *reason) {
  const qt_graph *g = L->g;
  qt_lowered *m = L->m;
  const qt_node *n = &g->nodes[i];
  int in_slots[2] = {-1, -1};
  for (int k = 0; k < n->n_inputs; k++) in_slots[k] = f32_slot(L, n->inputs[k]);
  step *s = new_step(m, ST_FALLBACK);
  s->node = i;
  for (int k = 0; k < n->n_inputs; k++) {
    const qt_value *v = &g->values[n->inputs[k]];
    s->in[k] = in_slots[k];
    s->in_ndim[k] = v->ndim;
    for (int d = 0; d < 3; d++) s->in_shape[k][d] = v->shape[d];
  }
  const qt_value *yv = &g->values[n->output];
  s->out = new_slot(m, (size_t)qt_value_numel(yv) * sizeof(float));
  value_rep *r = &L->rep[n->output];
  r->kind = REP_F32;
  r->slot = r->f32_slot = s->out;
  qt_part_add(&m->parts, QT_PART_FALLBACK, n->name, "%s in fp32: %s", qt_op_name(n->op), reason);
}

qt_lowered *qt_lower(const qt_graph *g, char *err) {
  if (!g->finalized) {
    snprintf(err, QT_ERR_LEN, "lower: graph %s is not finalized", g->name);
    return NULL;
  }
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    if (n->op == QT_OP_FAKE_QUANT || n->op == QT_OP_CONV_BN || (n->wq && !n->wq->qweight)) {
      snprintf(err, QT_ERR_LEN,
               "lower: graph %s: node %d '%s' (%s) belongs to a prepared (training) graph; lower the Q/DQ graph "
               "from qt_convert (model_qdq.h5)",
               g->name, i, n->name, qt_op_name(n->op));
      return NULL;
    }
    if (n->op == QT_OP_QUANTIZE && n->q->spec.qmin < INT32_MIN / 2) {
      snprintf(err, QT_ERR_LEN, "lower: node '%s': integer range out of bounds", n->name);
      return NULL;
    }
  }
  if (g->nodes[g->values[g->output].producer].op == QT_OP_QUANTIZE) {
    snprintf(err, QT_ERR_LEN, "lower: graph %s: the output '%s' is integers (a quantize); the runtime returns fp32",
             g->name, g->values[g->output].name);
    return NULL;
  }
  qt_lowered *m = calloc(1, sizeof *m);
  QT_ASSERT(m, "out of memory");
  m->g = g;
  snprintf(m->name, sizeof m->name, "%s", g->name);
  lowering L = {g,
                m,
                calloc((size_t)g->n_values, sizeof(value_rep)),
                malloc((size_t)g->n_values * sizeof(int)),
                calloc((size_t)g->n_nodes, sizeof(int)),
                err};
  QT_ASSERT(L.rep && L.consumer && L.done, "out of memory");
  for (int v = 0; v < g->n_values; v++) {
    L.consumer[v] = -1;
    L.rep[v].slot = L.rep[v].f32_slot = -1;
  }
  for (int i = 0; i < g->n_nodes; i++)
    for (int k = 0; k < g->nodes[i].n_inputs; k++) {
      int v = g->nodes[i].inputs[k];
      L.consumer[v] = g->values[v].consumers == 1 ? i : -1;
    }
  const qt_value *inv = &g->values[g->input];
  m->in_h = (int)inv->shape[0], m->in_w = (int)inv->shape[1], m->in_c = (int)inv->shape[2];

  for (int i = 0; i < g->n_nodes; i++) {
    if (L.done[i]) continue;
    const qt_node *n = &g->nodes[i];
    value_rep *out = &L.rep[n->output];
    switch (n->op) {
      case QT_OP_INPUT:
        m->input_slot = new_slot(m, (size_t)qt_value_numel(inv) * sizeof(float));
        out->kind = REP_F32;
        out->slot = out->f32_slot = m->input_slot;
        break;
      case QT_OP_QUANTIZE: lower_quantize(&L, i); break;
      case QT_OP_DEQUANTIZE: {
        const value_rep *in = &L.rep[n->inputs[0]];
        QT_ASSERT(in->kind != REP_F32, "dequantize %s reads an fp32 value", n->name);
        out->kind = in->kind;
        out->slot = in->slot;
        out->f32_slot = -1;
        set_qparams(&L, out, n->q);
        break;
      }
      case QT_OP_CONV2D:
      case QT_OP_LINEAR: {
        int relu, quant;
        const char *why = match_int8_layer(&L, i, &relu, &quant);
        if (!why) lower_int8_layer(&L, i, relu, quant, &why);
        if (why) lower_fallback(&L, i, why);
        break;
      }
      case QT_OP_MAX_POOL2D: {
        const char *why = "input is not a u8-quantized tensor";
        if (L.rep[n->inputs[0]].kind == REP_U8) why = lower_max_pool_u8(&L, i);
        if (why) lower_fallback(&L, i, why);
        break;
      }
      case QT_OP_FLATTEN: {
        /* NHWC flatten is a view of the same buffer, whatever the representation. */
        *out = L.rep[n->inputs[0]];
        qt_part_add(&m->parts, out->kind == REP_U8 ? QT_PART_INT8 : QT_PART_FALLBACK, n->name,
                    "flatten: a view of the %s tensor",
                    out->kind == REP_U8    ? "u8"
                    : out->kind == REP_I32 ? "i32"
                                           : "fp32");
        break;
      }
      case QT_OP_ADD: {
        const char *why = lower_add_u8(&L, i);
        if (why) lower_fallback(&L, i, why);
        break;
      }
      default: lower_fallback(&L, i, "no int8 pattern for this op"); break;
    }
  }
  m->output_slot = f32_slot(&L, g->output);
  m->out_numel = qt_value_numel(&g->values[g->output]);
  free(L.rep);
  free(L.consumer);
  free(L.done);
  m->ctx = qt_ctx_create();
  qt_ctx_set_grad(m->ctx, 0);
  m->bufs = calloc((size_t)m->n_slots, sizeof *m->bufs);
  QT_ASSERT(m->bufs, "out of memory");
  return m;
}

void qt_lowered_free(qt_lowered *m) {
  if (!m) return;
  for (int i = 0; i < m->n_steps; i++) qt_int8_op_free(m->steps[i].op);
  for (int i = 0; i < m->n_kept; i++) free(m->kept[i]);
  free(m->kept);
  free(m->steps);
  free(m->slots);
  qt_part_list_free(&m->parts);
  free(m->bufs);
  qt_ctx_free(m->ctx);
  free(m);
}

/* ---- runtime ------------------------------------------------------------------------------ */

static qt_tensor *wrap(qt_ctx *ctx, void *data, int N, int ndim, const int64_t *shape) {
  int64_t s[4] = {N, 0, 0, 0};
  for (int d = 0; d < ndim; d++) s[d + 1] = shape[d];
  return qt_tensor_wrap(ctx, QT_F32, ndim + 1, s, data);
}

static void run_quantize(const step *s, void *out, const float *in, int64_t n, qt_ctx *ctx) {
  const int64_t outer = n / s->channels;
  if (!s->int_u8) {
    qt_quantize(out, in, outer, s->channels, 1, s->scale, s->zero_point, s->qmin, s->qmax);
    return;
  }
  /* The reference kernel into i32 scratch, narrowed: bit-identical by construction. */
  int32_t *tmp = qt_arena_alloc(ctx, (size_t)n * sizeof(int32_t));
  qt_quantize(tmp, in, outer, s->channels, 1, s->scale, s->zero_point, s->qmin, s->qmax);
  uint8_t *o = out;
#pragma omp parallel for simd schedule(static) if (n >= 65536)
  for (int64_t i = 0; i < n; i++) o[i] = (uint8_t)tmp[i];
}

static void run_dequantize(const step *s, float *out, const void *in, int64_t n) {
  const int C = s->channels;
  if (!s->int_u8) {
    qt_dequantize(out, in, n / C, C, 1, s->scale, s->zero_point);
    return;
  }
  const uint8_t *q = in;
  if (C == 1) {
    const float sc = s->scale[0];
    const int32_t zp = s->zero_point[0];
#pragma omp parallel for simd schedule(static) if (n >= 65536)
    for (int64_t i = 0; i < n; i++) out[i] = (float)((int32_t)q[i] - zp) * sc;
  } else {
#pragma omp parallel for schedule(static) if (n >= 65536)
    for (int64_t i = 0; i < n; i++) out[i] = (float)((int32_t)q[i] - s->zero_point[i % C]) * s->scale[i % C];
  }
}

/* u8 add: per block, the reference's float operations into a small buffer, then the
 * reference quantize (so every rounding is the Q/DQ graph's own). */
static void run_add_u8(const step *s, uint8_t *out, const uint8_t *a, const uint8_t *b, int64_t n) {
  enum { BLOCK = 4096 };
  const int64_t blocks = (n + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static) if (n >= 65536)
  for (int64_t blk = 0; blk < blocks; blk++) {
    float y[BLOCK];
    int32_t q[BLOCK];
    const int64_t i0 = blk * BLOCK, len = n - i0 < BLOCK ? n - i0 : BLOCK;
    for (int64_t k = 0; k < len; k++) {
      const float v = s->lut[0][a[i0 + k]] + s->lut[1][b[i0 + k]];
      y[k] = (s->relu || s->relu6) && v < 0.0f ? 0.0f : s->relu6 && v > 6.0f ? 6.0f : v;
    }
    qt_quantize(q, y, len, 1, 1, s->scale, s->zero_point, s->qmin, s->qmax);
    for (int64_t k = 0; k < len; k++) out[i0 + k] = (uint8_t)q[k];
  }
}

/* round half even, add the zero point in float, clamp (NaN -> qmin), as the Q node does. */
static void run_requantize(const step *s, uint8_t *out, const float *in, int64_t n) {
  const float zp = (float)s->zero_point[0], lo = (float)s->qmin, hi = (float)s->qmax;
  for (int64_t i = 0; i < n; i++) {
    float r = nearbyintf(in[i]) + zp;
    if (!(r >= lo)) r = lo;
    if (r > hi) r = hi;
    out[i] = (uint8_t)r;
  }
}

/* The fallback node with the executor's own node forward (the graph is a finalized Q/DQ graph in
 * eval mode, which the forward reads and never changes). */
static void *run_fallback(const qt_lowered *m, const step *s, qt_ctx *ctx, void **bufs, int N) {
  const qt_node *n = &m->g->nodes[s->node];
  qt_tensor *ins[QT_MAX_INPUTS] = {NULL};
  for (int k = 0; k < n->n_inputs && k < 2; k++) ins[k] = wrap(ctx, bufs[s->in[k]], N, s->in_ndim[k], s->in_shape[k]);
  char err[QT_ERR_LEN];
  qt_tensor *y = qt_node_forward((qt_graph *)m->g, ctx, s->node, ins, 0, err);
  QT_ASSERT(y, "lowered fallback %s (%s): %s", n->name, qt_op_name(n->op), err);
  return y->data;
}

int qt_lowered_run(qt_lowered *m, float *out, const float *input, int n, char *err) {
  if (n <= 0) {
    snprintf(err, QT_ERR_LEN, "run %s: batch of %d images", m->name, n);
    return -1;
  }
  qt_ctx_reset(m->ctx);
  m->bufs[m->input_slot] = (void *)input; /* read only: no step writes its input */
  for (int i = 0; i < m->n_steps; i++) {
    const step *s = &m->steps[i];
    void *in = s->in[0] >= 0 ? m->bufs[s->in[0]] : NULL;
    const int64_t numel = s->in_numel * n;
    if (s->kind == ST_FALLBACK) {
      m->bufs[s->out] = run_fallback(m, s, m->ctx, m->bufs, n);
      continue;
    }
    void *o = qt_arena_alloc(m->ctx, m->slots[s->out].bytes * (size_t)n);
    m->bufs[s->out] = o;
    switch (s->kind) {
      case ST_QUANTIZE: run_quantize(s, o, in, numel, m->ctx); break;
      case ST_DEQUANTIZE: run_dequantize(s, o, in, numel); break;
      case ST_INT8: qt_int8_op_run(s->op, o, in, n); break;
      case ST_REQUANTIZE: run_requantize(s, o, in, numel); break;
      case ST_ADD_U8: run_add_u8(s, o, in, m->bufs[s->in[1]], numel); break;
      case ST_FALLBACK: break;
    }
  }
  memcpy(out, m->bufs[m->output_slot], (size_t)(m->out_numel * n) * sizeof(float));
  return 0;
}

int64_t qt_lowered_output_numel(const qt_lowered *m) { return m->out_numel; }

void qt_lowered_input_shape(const qt_lowered *m, int *h, int *w, int *c) {
  *h = m->in_h;
  *w = m->in_w;
  *c = m->in_c;
}

int qt_lowered_partition_count(const qt_lowered *m) { return m->parts.n; }

qt_partition_kind qt_lowered_partition(const qt_lowered *m, int i, const char **nodes, const char **detail) {
  return qt_part_get(&m->parts, i, nodes, detail);
}

int qt_lowered_count(const qt_lowered *m, qt_partition_kind k) { return qt_part_count(&m->parts, k); }

void qt_lowered_report(const qt_lowered *m, FILE *f) {
  fprintf(f, "partitions of %s: %d int8, %d fallback, %d boundary\n", m->name, qt_lowered_count(m, QT_PART_INT8),
          qt_lowered_count(m, QT_PART_FALLBACK), qt_lowered_count(m, QT_PART_BOUNDARY));
  qt_part_print(&m->parts, f);
}
