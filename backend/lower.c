/* Lowering of a Q/DQ graph to oneDNN int8 kernels and fp32 fallback partitions, and the
 * runtime that executes the result (see backend.h).
 *
 * The walk, the value representations, the boundaries and the fallbacks are the lowering
 * skeleton's (lowering.h), with u8 as the 8-bit representation: every range within [0, 255] is
 * held as u8, any other as i32. The patterns here: conv / linear units become one int8 kernel,
 * max pooling keeps a u8 representation (dequantize is monotone and elementwise), so the int8
 * kernels chain over u8 NHWC tensors, and a residual add of two u8 tensors requantizes straight
 * to u8 (lower_add_u8). Each runtime buffer ("slot") is allocated from the context's arena at
 * every run. */
#include "backend/runtimes.h"
#include "base/base.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/int8.h"
#include "backend/lowering.h"

/* The kernels of QT_STEP_KERNEL steps (qt_step.op_kind). */
typedef enum { K_INT8, K_REQUANTIZE, K_ADD_U8 } kernel_kind;

/* A u8 add's data (qt_step.aux): each input's dequantized values by integer, a fused relu or
 * relu6. */
typedef struct {
  float lut[2][256];
  int relu, relu6;
} u8_add;

struct qt_lowered {
  qt_program prog;
  int in_h, in_w, in_c;
};

static int fits_u8(int qmin, int qmax) { return qmin >= 0 && qmax <= 255; }

static const char *output_range_problem(qt_lowering *L, const qt_qstate *q) {
  (void)L;
  return fits_u8(q->spec.qmin, q->spec.qmax) ? NULL : "output range does not fit u8";
}

/* Whether the layer's u8 x s8 products, summed in pairs, fit the saturating int16 in which oneDNN
 * adds them on a CPU without VNNI (docs/design.md: no VNNI): 2 * max(u8) * max|w| <= 32767. */
static int pair_sums_fit(const qt_value_rep *in, const qt_qstate *wq) {
  return qt_cpu_has_vnni() || 2 * (int64_t)in->qmax * qt_max_abs_weight(wq) <= 32767;
}

/* Whether node i starts dq -> conv/linear [-> relu | relu6] -> q with u8 activations and s8
 * per-channel symmetric weights whose pair sums fit. Returns NULL and fills relu/quant, or the
 * reason not. */
static const char *match_int8_layer(qt_lowering *L, int i, int *relu, int *quant) {
  const qt_node *n = &L->g->nodes[i];
  const qt_value_rep *in = &L->rep[n->inputs[0]];
  *relu = -1;
  *quant = -1;
  if (!n->wq || !n->wq->qweight) return "weights are not quantized (fp32 layer)";
  if (in->kind != QT_REP_INT8) return "input is not a u8-quantized tensor (no dequantize before it)";
  if (in->channels != 1) return "input has per-channel activation qparams";
  if (n->wq->spec.qmin < -128 || n->wq->spec.qmax > 127) return "weight range does not fit s8";
  for (int c = 0; c < n->wq->channels; c++)
    if (n->wq->zero_point[c] != 0) return "weights have a non-zero zero point";
  if (!pair_sums_fit(in, n->wq))
    return "u8 x s8 pair sums can pass 32767, and without VNNI oneDNN adds them in a saturating int16 (7-bit "
           "weights or activations in [0, 127] run in int8)";
  return qt_match_output(L, i, relu, quant);
}

/* The int8 kernel's parameters for the unit i [-> relu] -> quant. */
static void layer_params(const qt_lowering *L, int i, int relu, int quant, qt_int8_params *p) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  const qt_qstate *qo = g->nodes[quant].q;
  const qt_value *xv = &g->values[n->inputs[0]], *yv = &g->values[n->output];
  const int is_conv = n->op == QT_OP_CONV2D;
  const int zp_out = qo->zero_point[0], qmin = qo->spec.qmin, qmax = qo->spec.qmax;
  memset(p, 0, sizeof *p);
  p->kind = is_conv ? QT_INT8_CONV : QT_INT8_LINEAR;
  if (is_conv) {
    p->H = (int)xv->shape[0], p->W = (int)xv->shape[1], p->C = (int)xv->shape[2];
    p->OH = (int)yv->shape[0], p->OW = (int)yv->shape[1];
    p->KH = n->attr.kernel_h, p->KW = n->attr.kernel_w, p->stride_h = n->attr.stride_h, p->stride_w = n->attr.stride_w;
    p->pad_h = n->attr.pad_h, p->pad_w = n->attr.pad_w;
    p->groups = n->attr.groups;
    p->zp_src = L->rep[n->inputs[0]].zero_point[0];
    /* oneDNN rounds (x + zp), the reference round(x) + zp: equal on exact ties only for an
     * even zp. An odd one takes an f32 dst and the reference's requantization. */
    p->dst_f32 = zp_out & 1;
    p->zp_dst = p->dst_f32 ? 0 : zp_out;
  } else {
    p->H = p->W = p->OH = p->OW = 1;
    p->C = (int)qt_value_numel(xv);
    p->dst_f32 = zp_out != 0; /* inner product takes no zero points in oneDNN 2.6 */
  }
  p->OC = n->attr.out_channels;
  const int six = relu >= 0 && g->nodes[relu].op == QT_OP_RELU6;
  p->relu = relu >= 0 && !six;
  p->relu6 = six;
  p->relu6_hi = (float)(6.0 / (double)qo->scale[0]); /* relu6 in output units, before the zero point */
  if (!p->dst_f32 && (qmin > 0 || qmax < 255)) {
    p->clip = 1;
    p->clip_lo = qmin - zp_out;
    p->clip_hi = qmax - zp_out;
  }
}

/* The int8 kernel of layer i with the parameters p: s8 weights, the bias in accumulator units
 * and the output scales. NULL with err when oneDNN refuses it. */
static qt_int8_op *layer_op(const qt_lowering *L, int i, int quant, const qt_int8_params *p, char *err) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  const qt_value_rep *in = &L->rep[n->inputs[0]];
  const qt_qstate *wq = n->wq;
  const int is_conv = n->op == QT_OP_CONV2D;
  const int OC = n->attr.out_channels;
  const int64_t inner = wq->n_qweight / OC;
  const float s_x = in->scale[0], s_out = g->nodes[quant].q->scale[0];
  const int zp_x = in->zero_point[0];
  int8_t *w8 = malloc((size_t)wq->n_qweight);
  float *bias = malloc((size_t)OC * sizeof(float)), *oscale = malloc((size_t)OC * sizeof(float));
  QT_ASSERT(w8 && bias && oscale, "out of memory");
  for (int64_t k = 0; k < wq->n_qweight; k++) w8[k] = (int8_t)wq->qweight[k];
  const float *b = qt_param_data(g, n->param[QT_P_BIAS]);
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
  qt_int8_op *op = qt_int8_op_create(p, w8, bias, oscale, err);
  QT_FREE_ALL(w8, bias, oscale);
  return op;
}

/* oneDNN's message as the reason of a fallback. */
static const char *refused(const char *err) {
  static char reason[QT_ERR_LEN];
  snprintf(reason, sizeof reason, "%s", err);
  return reason;
}

static const char *lower_int8_layer(qt_lowering *L, int i, int relu, int quant) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  const qt_node *qn = &g->nodes[quant];
  const qt_value *xv = &g->values[n->inputs[0]], *yv = &g->values[n->output];
  const int is_conv = n->op == QT_OP_CONV2D;
  qt_int8_params p;
  layer_params(L, i, relu, quant, &p);
  char err[QT_ERR_LEN];
  qt_int8_op *op = layer_op(L, i, quant, &p, err);
  if (!op) return refused(err);
  const int64_t out_numel = qt_value_numel(yv);
  const qt_step *s = qt_kernel_step(L->p, K_INT8, op, L->rep[n->inputs[0]].slot, qt_value_numel(xv),
                                    (size_t)out_numel * (p.dst_f32 ? sizeof(float) : 1));
  int out_slot = s->out;
  if (p.dst_f32) {
    const int zp_out = qn->q->zero_point[0];
    qt_step *r = qt_kernel_step(L->p, K_REQUANTIZE, NULL, out_slot, out_numel, (size_t)out_numel);
    r->qmin = qn->q->spec.qmin;
    r->qmax = qn->q->spec.qmax;
    r->zero_point = qt_keep_copy(L->p, &zp_out, sizeof zp_out);
    out_slot = r->out;
  }
  qt_unit_done(L, i, relu, quant, out_slot);
  char nodes[256];
  qt_unit_nodes(L, i, 1, relu, quant, nodes, sizeof nodes);
  qt_part_add(&L->p->parts, QT_PART_INT8, nodes, "%s u8 x s8 -> u8%s%s (%s)",
              !is_conv                                                       ? "inner product"
              : n->attr.groups == n->attr.out_channels && n->attr.groups > 1 ? "depthwise conv"
              : n->attr.groups > 1                                           ? "grouped conv"
                                                                             : "conv",
              p.relu6     ? ", fused relu6"
              : relu >= 0 ? ", fused relu"
                          : "",
              p.dst_f32  ? (is_conv ? ", f32 dst requantized (odd output zero point)"
                                    : ", f32 dst requantized (output zero point)")
              : p.zp_dst ? ", output zero point"
                         : "",
              qt_int8_op_impl(op));
  return NULL;
}

static const char *lower_max_pool_u8(qt_lowering *L, int i) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  if (n->attr.ceil) return "ceil-mode max pool: this lowering has no u8 form of it";
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
  if (!op) return refused(err);
  const qt_step *s =
      qt_kernel_step(L->p, K_INT8, op, L->rep[n->inputs[0]].slot, qt_value_numel(xv), (size_t)qt_value_numel(yv));
  qt_same_qparams(L, i, s->out); /* max commutes with a monotone dequantize */
  qt_part_add(&L->p->parts, QT_PART_INT8, n->name, "max pool on u8 (%s)", qt_int8_op_impl(op));
  return NULL;
}

/* dq(a) + dq(b) [-> relu | relu6] -> q on u8 tensors, each input with its own scale and zero
 * point. The step computes per element what the Q/DQ graph computes, in the same float operations:
 * (float)(q - zp) * s for each input (a 256-entry table), one float add, the relu (relu6), then the
 * reference quantize; so it is bit-exact, and no fp32 tensor is materialized. */
static const char *lower_add_u8(qt_lowering *L, int i) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  const qt_value_rep *in[2] = {&L->rep[n->inputs[0]], &L->rep[n->inputs[1]]};
  for (int k = 0; k < 2; k++) {
    if (in[k]->kind != QT_REP_INT8) return "an input is not a u8-quantized tensor (no dequantize before it)";
    if (in[k]->channels != 1) return "an input has per-channel activation qparams";
  }
  int relu, quant;
  const char *why = qt_match_output(L, i, &relu, &quant);
  if (why) return why;
  const qt_node *qn = &g->nodes[quant];
  u8_add *a = qt_keep(L->p, sizeof *a);
  for (int k = 0; k < 2; k++)
    for (int q = 0; q < 256; q++) a->lut[k][q] = (float)(q - in[k]->zero_point[0]) * in[k]->scale[0];
  a->relu6 = relu >= 0 && g->nodes[relu].op == QT_OP_RELU6;
  a->relu = relu >= 0 && !a->relu6;
  const int64_t numel = qt_value_numel(&g->values[n->output]);
  qt_step *s = qt_kernel_step(L->p, K_ADD_U8, NULL, in[0]->slot, numel, (size_t)numel);
  s->in[1] = in[1]->slot;
  s->aux = a;
  s->qmin = qn->q->spec.qmin;
  s->qmax = qn->q->spec.qmax;
  qt_unit_done(L, i, relu, quant, s->out);
  const qt_value_rep *r = &L->rep[qn->output];
  s->channels = 1;
  s->scale = r->scale;
  s->zero_point = r->zero_point;
  char nodes[256];
  qt_unit_nodes(L, i, 2, relu, quant, nodes, sizeof nodes);
  qt_part_add(&L->p->parts, QT_PART_INT8, nodes, "add u8 + u8 -> u8%s (own scales and zero points, requantized)",
              a->relu6    ? ", fused relu6"
              : relu >= 0 ? ", fused relu"
                          : "");
  return NULL;
}

/* The oneDNN patterns starting at node i (qt_lowering_ops.lower_node). */
static const char *lower_node(qt_lowering *L, int i) {
  const qt_node *n = &L->g->nodes[i];
  switch (n->op) {
    case QT_OP_CONV2D:
    case QT_OP_LINEAR: {
      int relu, quant;
      const char *why = match_int8_layer(L, i, &relu, &quant);
      return why ? why : lower_int8_layer(L, i, relu, quant);
    }
    case QT_OP_MAX_POOL2D:
      if (L->rep[n->inputs[0]].kind != QT_REP_INT8) return "input is not a u8-quantized tensor";
      return lower_max_pool_u8(L, i);
    case QT_OP_ADD: return lower_add_u8(L, i);
    default: return "no int8 pattern for this op";
  }
}

static const qt_lowering_ops onednn_ops = {"lower", "lower", "u8", "i32", fits_u8, output_range_problem, lower_node};

qt_lowered *qt_lower(const qt_graph *g, char *err) {
  if (qt_lowering_check(g, &onednn_ops, err)) return NULL;
  qt_lowered *m = calloc(1, sizeof *m);
  QT_ASSERT(m, "out of memory");
  qt_lowering_build(&m->prog, g, &onednn_ops);
  const qt_value *inv = &g->values[g->input];
  m->in_h = (int)inv->shape[0], m->in_w = (int)inv->shape[1], m->in_c = (int)inv->shape[2];
  return m;
}

void qt_lowered_free(qt_lowered *m) {
  if (!m) return;
  for (int i = 0; i < m->prog.n_steps; i++)
    if (m->prog.steps[i].kind == QT_STEP_KERNEL && m->prog.steps[i].op_kind == K_INT8)
      qt_int8_op_free(m->prog.steps[i].op);
  qt_program_free(&m->prog);
  free(m);
}

/* ---- runtime ------------------------------------------------------------------------------ */

static void run_quantize(const qt_step *s, void *out, const float *in, int64_t n, qt_ctx *ctx) {
  const int64_t outer = n / s->channels;
  if (!s->int8) {
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

static void run_dequantize(const qt_step *s, float *out, const void *in, int64_t n) {
  const int C = s->channels;
  if (!s->int8) {
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
static void run_add_u8(const qt_step *s, uint8_t *out, const uint8_t *a, const uint8_t *b, int64_t n) {
  enum { BLOCK = 4096 };
  const u8_add *d = s->aux;
  const int64_t blocks = (n + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static) if (n >= 65536)
  for (int64_t blk = 0; blk < blocks; blk++) {
    float y[BLOCK];
    int32_t q[BLOCK];
    const int64_t i0 = blk * BLOCK, len = n - i0 < BLOCK ? n - i0 : BLOCK;
    for (int64_t k = 0; k < len; k++) {
      const float v = d->lut[0][a[i0 + k]] + d->lut[1][b[i0 + k]];
      y[k] = (d->relu || d->relu6) && v < 0.0f ? 0.0f : d->relu6 && v > 6.0f ? 6.0f : v;
    }
    qt_quantize(q, y, len, 1, 1, s->scale, s->zero_point, s->qmin, s->qmax);
    for (int64_t k = 0; k < len; k++) out[i0 + k] = (uint8_t)q[k];
  }
}

/* round half even, add the zero point in float, clamp (NaN -> qmin), as the Q node does. */
static void run_requantize(const qt_step *s, uint8_t *out, const float *in, int64_t n) {
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
static void *run_fallback(qt_program *p, const qt_step *s, int N) {
  const qt_node *n = &p->g->nodes[s->node];
  qt_tensor *ins[QT_MAX_INPUTS] = {NULL};
  qt_fallback_inputs(p, s, N, ins);
  char err[QT_ERR_LEN];
  qt_tensor *y = qt_node_forward((qt_graph *)p->g, p->ctx, s->node, ins, 0, err);
  QT_ASSERT(y, "lowered fallback %s (%s): %s", n->name, qt_op_name(n->op), err);
  return y->data;
}

static void run_kernel(const qt_step *s, void *o, void *in, void *in2, int64_t numel, int n) {
  switch ((kernel_kind)s->op_kind) {
    case K_INT8: qt_int8_op_run(s->op, o, in, n); break;
    case K_REQUANTIZE: run_requantize(s, o, in, numel); break;
    case K_ADD_U8: run_add_u8(s, o, in, in2, numel); break;
  }
}

int qt_lowered_run(qt_lowered *m, float *out, const float *input, int n, char *err) {
  qt_program *p = &m->prog;
  if (n <= 0) {
    snprintf(err, QT_ERR_LEN, "run %s: batch of %d images", p->name, n);
    return -1;
  }
  qt_ctx_reset(p->ctx);
  p->bufs[p->input_slot] = (void *)input; /* read only: no step writes its input */
  for (int i = 0; i < p->n_steps; i++) {
    const qt_step *s = &p->steps[i];
    void *in = s->in[0] >= 0 ? p->bufs[s->in[0]] : NULL;
    const int64_t numel = s->in_numel * n;
    if (s->kind == QT_STEP_FALLBACK) {
      p->bufs[s->out] = run_fallback(p, s, n);
      continue;
    }
    void *o = qt_arena_alloc(p->ctx, p->slot_bytes[s->out] * (size_t)n);
    p->bufs[s->out] = o;
    switch (s->kind) {
      case QT_STEP_QUANTIZE: run_quantize(s, o, in, numel, p->ctx); break;
      case QT_STEP_DEQUANTIZE: run_dequantize(s, o, in, numel); break;
      case QT_STEP_KERNEL: run_kernel(s, o, in, s->in[1] >= 0 ? p->bufs[s->in[1]] : NULL, numel, n); break;
      case QT_STEP_FALLBACK: break;
    }
  }
  memcpy(out, p->bufs[p->output_slot], (size_t)(p->out_numel * n) * sizeof(float));
  return 0;
}

int64_t qt_lowered_output_numel(const qt_lowered *m) { return m->prog.out_numel; }

void qt_lowered_input_shape(const qt_lowered *m, int *h, int *w, int *c) {
  *h = m->in_h;
  *w = m->in_w;
  *c = m->in_c;
}

int qt_lowered_partition_count(const qt_lowered *m) { return m->prog.parts.n; }

qt_partition_kind qt_lowered_partition(const qt_lowered *m, int i, const char **nodes, const char **detail) {
  return qt_part_get(&m->prog.parts, i, nodes, detail);
}

int qt_lowered_count(const qt_lowered *m, qt_partition_kind k) { return qt_part_count(&m->prog.parts, k); }

void qt_lowered_report(const qt_lowered *m, FILE *f) {
  fprintf(f, "partitions of %s: %d int8, %d fallback, %d boundary\n", m->prog.name, qt_lowered_count(m, QT_PART_INT8),
          qt_lowered_count(m, QT_PART_FALLBACK), qt_lowered_count(m, QT_PART_BOUNDARY));
  qt_part_print(&m->prog.parts, f);
}
