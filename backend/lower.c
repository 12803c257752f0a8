/* Lowering of a Q/DQ graph to oneDNN int8 kernels and fp32 fallback partitions, and the
 * runtime that executes the result (see backend.h).
 *
 * The walk, the value representations, the boundaries and the fallbacks are the lowering
 * skeleton's (lowering.h), with u8 as the 8-bit representation: every range within [0, 255] is
 * held as u8, any other as i32. The patterns here: conv / linear units become one int8 kernel,
 * max pooling keeps a u8 representation (dequantize is monotone and elementwise), so the int8
 * kernels chain over u8 NHWC tensors. The other ops without weights run on u8 in the Q/DQ graph's
 * own float operations, so each is bit for bit the Q/DQ graph's dq -> op -> q: a residual add or
 * a mul of two u8 tensors (lower_binary_u8), element-wise activations as a 256-entry table,
 * concat as a table per input, relu, the channel shuffle and slice as copies, the global average
 * pool as the fp32 kernel's sums. Each runtime buffer ("slot") is allocated from the context's
 * arena at every run. */
#include "backend/runtimes.h"
#include "base/base.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/kernels.h"
#include "backend/int8.h"
#include "backend/lowering.h"

/* The kernels of QT_STEP_KERNEL steps (qt_step.op_kind). */
typedef enum {
  K_INT8,
  K_REQUANTIZE,
  K_ACT_REQUANTIZE,
  K_ADD_REQUANTIZE,
  K_GATE_REQUANTIZE,
  K_ADD_U8,
  K_TABLE_U8,
  K_CHANNEL_TABLE_U8,
  K_CONCAT_U8,
  K_GATHER_U8,
  K_RESIZE_U8,
  K_GAP_U8
} kernel_kind;

/* A layer's fused activation (qt_step.aux of K_ACT_REQUANTIZE): the activation of the f32 layer
 * output (real values), a relu or relu6 after it, then the quantize: 1/s as the format's
 * quantize multiplies (the zero point and range are the step's). */
typedef struct {
  qt_act act;
  int relu, relu6;
  float inv_scale;
} act_requant;

/* A conv's fused add (qt_step.aux of K_ADD_REQUANTIZE): the conv's f32 output (real values) plus
 * the other input's dequantized value (a table by integer), a relu or relu6, then the quantize. */
typedef struct {
  float lut[256];
  int relu, relu6;
  float inv_scale;
} add_requant;

/* A layer's fused gate (qt_step.aux of K_GATE_REQUANTIZE): per sample, the activation of the
 * layer's C real f32 outputs, each multiplying channel c of the other input's P pixels
 * (dequantized by a table; P = 1: one shape), then the quantize. */
typedef struct {
  qt_act act;
  float lut[256];
  int64_t P, C;
  int relu, relu6;
  float inv_scale;
} gate_requant;

/* A u8 add's or mul's data (qt_step.aux): each input's scale and zero point; a fused relu or
 * relu6. mul: a * b, where b holds one value per sample and channel of C, applied at each of a's
 * P pixels (P = 1: b has a's shape); add: a + b of one shape. */
typedef struct {
  float scale[2];
  int32_t zero_point[2];
  int relu, relu6;
  int mul;
  int64_t P, C;
} u8_add;

/* A u8 -> u8 table (activations, relu) or one per input (concat: input k's channels C[k] at
 * offset off[k] of the output's Y channels per row). */
typedef struct {
  uint8_t map[QT_MAX_INPUTS][256];
  int n;
  int64_t C[QT_MAX_INPUTS], off[QT_MAX_INPUTS], Y;
} u8_table;

/* One u8 -> u8 table per channel of C (PReLU's slopes): C x 256 entries, channel-last rows. */
typedef struct {
  int64_t C;
  uint8_t *maps;
} u8_channel_table;

/* A copy of channels (shuffle, slice): output channel c of OC reads input channel src[c] of IC. */
typedef struct {
  int64_t IC, OC;
  int32_t *src;
} u8_gather;

/* A global average pool of HW pixels of C channels: the input's scale and zero point, a fused
 * relu or relu6. */
typedef struct {
  float scale;
  int32_t zero_point;
  int64_t HW, C;
  int relu, relu6;
} u8_gap;

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

static const char *u8_input(const qt_lowering *L, int v);
static void dequantized(const qt_value_rep *r, float *lut);

/* Whether node i starts dq -> conv/linear [-> activation [-> mul(dq(r), .)] | -> add(dq(r), .)]
 * [-> relu | relu6] -> q, or dq -> conv/linear whose output is the graph's (quant.fp32_output: real
 * values), with u8 activations and s8 per-channel symmetric weights whose pair sums fit. Returns
 * NULL and fills act (the activation node, or -1), bin (the fused binary node: a conv's add, or a
 * gate's mul after act; or -1), relu and quant (-1: the fp32 output), or the reason not. */
static const char *match_int8_layer(qt_lowering *L, int i, int *act, int *bin, int *relu, int *quant) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  const qt_value_rep *in = &L->rep[n->inputs[0]];
  *act = *bin = -1;
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
  /* an activation fused after the layer (the Quantizer's units for onednn_cpu: SiLU, hard swish) */
  const int c = L->consumer[n->output];
  if (n->output != g->output && c >= 0 && g->nodes[c].op == QT_OP_ACTIVATION) {
    const int gate = g->nodes[c].output, m = gate == g->output ? -1 : L->consumer[gate];
    const char *why;
    if (m >= 0 && g->nodes[m].op == QT_OP_MUL) { /* a gate (quant.fuse_gate): the mul's other input u8 */
      const int r = qt_graph_other_input(g, m, gate);
      const int64_t ng = qt_value_numel(&g->values[gate]), nr = qt_value_numel(&g->values[r]);
      const qt_value *rv = &g->values[r];
      why = r == gate ? "the gate multiplies itself" : u8_input(L, r);
      if (!why && !(ng == nr || (rv->shape[rv->ndim - 1] == ng && nr % ng == 0)))
        why = "the gate is neither of the other input's shape nor one value per channel";
      if (!why) why = qt_match_output(L, m, relu, quant);
      if (!why) *bin = m;
    } else {
      why = qt_match_output(L, c, relu, quant);
    }
    if (!why) *act = c;
    return why;
  }
  /* an add the conv's output goes to alone, the other input u8 (the Quantizer's conv + add unit,
   * quant.fuse_add) */
  if (n->op == QT_OP_CONV2D && n->output != g->output && c >= 0 && g->nodes[c].op == QT_OP_ADD) {
    const int r = qt_graph_other_input(g, c, n->output);
    const char *why = r == n->output ? "its output is added to itself" : u8_input(L, r);
    if (!why) why = qt_match_output(L, c, relu, quant);
    if (!why) *bin = c;
    return why;
  }
  if (n->output == g->output) return NULL; /* the graph's fp32 output: the kernel dequantizes */
  return qt_match_output(L, i, relu, quant);
}

/* The int8 kernel's parameters for the unit i [-> act | -> add] [-> relu] -> quant: real (an
 * activation or an add follows, or the output is the graph's: quant -1), an f32 output of real
 * values (the activation or add, relu and quantize follow in K_ACT_REQUANTIZE / K_ADD_REQUANTIZE). */
static void layer_params(const qt_lowering *L, int i, int real, int relu, int quant, qt_int8_params *p) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  const qt_qstate *qo = quant >= 0 ? g->nodes[quant].q : NULL;
  const qt_value *xv = &g->values[n->inputs[0]], *yv = &g->values[n->output];
  const int is_conv = n->op == QT_OP_CONV2D;
  const int zp_out = qo ? qo->zero_point[0] : 0, qmin = qo ? qo->spec.qmin : 0, qmax = qo ? qo->spec.qmax : 0;
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
    p->dst_f32 = (zp_out & 1) || real;
    p->zp_dst = p->dst_f32 ? 0 : zp_out;
  } else {
    p->H = p->W = p->OH = p->OW = 1;
    p->C = (int)qt_value_numel(xv);
    p->dst_f32 = zp_out != 0 || real; /* inner product takes no zero points in oneDNN 2.6 */
  }
  p->OC = n->attr.out_channels;
  if (real) return; /* no post-op: the activation or add, relu and range follow in f32 */
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

static const char *fused_name(const qt_lowering *L, int relu) {
  return relu < 0 ? "" : L->g->nodes[relu].op == QT_OP_RELU6 ? ", fused relu6" : ", fused relu";
}

/* The int8 kernel of layer i with the parameters p: s8 weights, the bias in accumulator units
 * and the output scales (to the quantize's units; real: to real values, for a fused
 * activation). NULL with err when oneDNN refuses it. */
static qt_int8_op *layer_op(const qt_lowering *L, int i, int quant, int real, const qt_int8_params *p, char *err) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  const qt_value_rep *in = &L->rep[n->inputs[0]];
  const qt_qstate *wq = n->wq;
  const int is_conv = n->op == QT_OP_CONV2D;
  const int OC = n->attr.out_channels;
  const int64_t inner = wq->n_qweight / OC;
  const float s_x = in->scale[0], s_out = real ? 1.0f : g->nodes[quant].q->scale[0];
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

/* The graph's output written by layer i's kernel as real values (quant.fp32_output). */
static void fp32_output_done(qt_lowering *L, int i, int slot, const char *kind, const qt_int8_op *op) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  qt_value_rep *r = &L->rep[n->output];
  r->kind = QT_REP_F32;
  r->slot = r->f32_slot = slot;
  r->fallback = -1;
  L->done[i] = 1;
  char nodes[2 * QT_NAME_LEN + 8];
  snprintf(nodes, sizeof nodes, "%s -> %s", g->nodes[g->values[n->inputs[0]].producer].name, n->name);
  qt_part_add(&L->p->parts, QT_PART_INT8, nodes, "%s u8 x s8 -> f32, the model's fp32 output (%s)", kind,
              qt_int8_op_impl(op));
}

static const char *lower_int8_layer(qt_lowering *L, int i, int act, int bin, int relu, int quant) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  const qt_value *xv = &g->values[n->inputs[0]], *yv = &g->values[n->output];
  const int is_conv = n->op == QT_OP_CONV2D;
  const int real = act >= 0 || bin >= 0 || quant < 0;
  qt_int8_params p;
  layer_params(L, i, real, relu, quant, &p);
  char err[QT_ERR_LEN];
  qt_int8_op *op = layer_op(L, i, quant, real, &p, err);
  if (!op) return refused(err);
  const int64_t out_numel = qt_value_numel(yv);
  const qt_step *s = qt_kernel_step(L->p, K_INT8, op, L->rep[n->inputs[0]].slot, qt_value_numel(xv),
                                    (size_t)out_numel * (p.dst_f32 ? sizeof(float) : 1));
  int out_slot = s->out;
  const char *kind = !is_conv                                                       ? "inner product"
                     : n->attr.groups == n->attr.out_channels && n->attr.groups > 1 ? "depthwise conv"
                     : n->attr.groups > 1                                           ? "grouped conv"
                                                                                    : "conv";
  if (quant < 0) {
    fp32_output_done(L, i, out_slot, kind, op);
    return NULL;
  }
  const qt_node *qn = &g->nodes[quant];
  if (p.dst_f32) {
    const int zp_out = qn->q->zero_point[0];
    const int gate = act >= 0 && bin >= 0;
    const int64_t unit_numel = bin >= 0 ? qt_value_numel(&g->values[g->nodes[bin].output]) : out_numel;
    qt_step *r = qt_kernel_step(L->p,
                                gate       ? K_GATE_REQUANTIZE
                                : act >= 0 ? K_ACT_REQUANTIZE
                                : bin >= 0 ? K_ADD_REQUANTIZE
                                           : K_REQUANTIZE,
                                NULL, out_slot, out_numel, (size_t)unit_numel);
    r->qmin = qn->q->spec.qmin;
    r->qmax = qn->q->spec.qmax;
    r->zero_point = qt_keep_copy(L->p, &zp_out, sizeof zp_out);
    if (gate) {
      const qt_node *a = &g->nodes[act];
      gate_requant *gr = qt_keep(L->p, sizeof *gr);
      const int res = qt_graph_other_input(g, bin, a->output);
      gr->act = (qt_act){(qt_act_kind)a->attr.act, a->attr.alpha, a->attr.beta};
      dequantized(&L->rep[res], gr->lut);
      gr->C = out_numel;
      gr->P = unit_numel / out_numel;
      gr->relu6 = relu >= 0 && g->nodes[relu].op == QT_OP_RELU6;
      gr->relu = relu >= 0 && !gr->relu6;
      gr->inv_scale = 1.0f / qn->q->scale[0];
      r->in[1] = L->rep[res].slot;
      r->aux = gr;
      L->done[act] = L->done[bin] = 1;
    } else if (act >= 0) {
      const qt_node *a = &g->nodes[act];
      act_requant *ar = qt_keep(L->p, sizeof *ar);
      ar->act = (qt_act){(qt_act_kind)a->attr.act, a->attr.alpha, a->attr.beta};
      ar->relu6 = relu >= 0 && g->nodes[relu].op == QT_OP_RELU6;
      ar->relu = relu >= 0 && !ar->relu6;
      ar->inv_scale = 1.0f / qn->q->scale[0];
      r->aux = ar;
      L->done[act] = 1;
    }
    if (bin >= 0 && !gate) {
      add_requant *ad = qt_keep(L->p, sizeof *ad);
      const int res = qt_graph_other_input(g, bin, n->output);
      dequantized(&L->rep[res], ad->lut);
      ad->relu6 = relu >= 0 && g->nodes[relu].op == QT_OP_RELU6;
      ad->relu = relu >= 0 && !ad->relu6;
      ad->inv_scale = 1.0f / qn->q->scale[0];
      r->in[1] = L->rep[res].slot;
      r->aux = ad;
      L->done[bin] = 1;
    }
    out_slot = r->out;
  }
  qt_unit_done(L, i, relu, quant, out_slot);
  char nodes[320];
  if (real) { /* "x -> layer -> act [* r -> mul] [-> relu] -> q", "x -> layer + r -> add [-> relu] -> q" */
    const int gate = act >= 0 && bin >= 0;
    const int r = bin < 0 ? -1 : qt_graph_other_input(g, bin, gate ? g->nodes[act].output : n->output);
    const char *rname = r >= 0 ? g->nodes[g->values[r].producer].name : "";
    size_t len = (size_t)snprintf(nodes, sizeof nodes, "%s -> %s%s%s -> %s", g->nodes[xv->producer].name, n->name,
                                  r >= 0 && !gate ? " + " : "", r >= 0 && !gate ? rname : "",
                                  g->nodes[act >= 0 ? act : bin].name);
    if (gate && len < sizeof nodes)
      len += (size_t)snprintf(nodes + len, sizeof nodes - len, " * %s -> %s", rname, g->nodes[bin].name);
    if (len < sizeof nodes)
      snprintf(nodes + len, sizeof nodes - len, "%s%s -> %s", relu >= 0 ? " -> " : "",
               relu >= 0 ? g->nodes[relu].name : "", qn->name);
  } else
    qt_unit_nodes(L, i, 1, relu, quant, nodes, sizeof nodes);
  if (act >= 0)
    qt_part_add(&L->p->parts, QT_PART_INT8, nodes, "%s u8 x s8 -> f32, %s%s%s in f32 -> u8 (%s)", kind,
                qt_act_name((qt_act_kind)g->nodes[act].attr.act), bin >= 0 ? ", * u8 input" : "", fused_name(L, relu),
                qt_int8_op_impl(op));
  else if (bin >= 0)
    qt_part_add(&L->p->parts, QT_PART_INT8, nodes, "%s u8 x s8 -> f32, + u8 input%s in f32 -> u8 (%s)", kind,
                fused_name(L, relu), qt_int8_op_impl(op));
  else
    qt_part_add(&L->p->parts, QT_PART_INT8, nodes, "%s u8 x s8 -> u8%s%s (%s)", kind,
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

/* ---- the ops without weights on u8 -------------------------------------------------------- */

/* NULL when value v is held as u8 with one scale and zero point (a dequantize's output). */
static const char *u8_input(const qt_lowering *L, int v) {
  const qt_value_rep *r = &L->rep[v];
  if (r->kind != QT_REP_INT8) return "an input is not a u8-quantized tensor (no dequantize before it)";
  if (r->channels != 1) return "an input has per-channel activation qparams";
  return NULL;
}

/* A u8 integer's dequantized value, as the Q/DQ graph's dequantize computes it. */
static inline float dequantized_u8(int32_t q, int32_t zero_point, float scale) {
  return (float)(q - zero_point) * scale;
}

/* Each u8 integer's dequantized value (dequantized_u8). */
static void dequantized(const qt_value_rep *r, float *lut) {
  for (int q = 0; q < 256; q++) lut[q] = dequantized_u8(q, r->zero_point[0], r->scale[0]);
}

static float fused_relu(float v, int relu, int relu6) {
  return (relu || relu6) && v < 0.0f ? 0.0f : relu6 && v > 6.0f ? 6.0f : v;
}

/* y[0..255] (after the unit's relu / relu6) quantized by the unit's quantize: the u8 table. */
static void table_of(const qt_lowering *L, const float *y, int relu, int quant, uint8_t *map) {
  const qt_node *qn = &L->g->nodes[quant];
  const qt_value_rep *r = &L->rep[qn->output];
  const int relu6 = relu >= 0 && L->g->nodes[relu].op == QT_OP_RELU6;
  float v[256];
  int32_t q[256];
  for (int k = 0; k < 256; k++) v[k] = fused_relu(y[k], relu >= 0 && !relu6, relu6);
  qt_quantize(q, v, 256, 1, 1, r->scale, r->zero_point, qn->q->spec.qmin, qn->q->spec.qmax);
  for (int k = 0; k < 256; k++) map[k] = (uint8_t)q[k];
}

/* A unit's kernel step reading node i's inputs, into the quantize's u8 value; requant: the step
 * quantizes floats itself (the quantize's range and qparams on the step). */
static qt_step *u8_unit_step(qt_lowering *L, int i, int kind, int relu, int quant, int requant) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  const int64_t numel = qt_value_numel(&g->values[n->output]);
  qt_step *s = qt_kernel_step(L->p, kind, NULL, L->rep[n->inputs[0]].slot, qt_value_numel(&g->values[n->inputs[0]]),
                              (size_t)numel);
  for (int k = 1; k < n->n_inputs; k++) s->in[k] = L->rep[n->inputs[k]].slot;
  qt_unit_done(L, i, relu, quant, s->out);
  if (requant) {
    const qt_node *qn = &g->nodes[quant];
    const qt_value_rep *r = &L->rep[qn->output];
    s->qmin = qn->q->spec.qmin;
    s->qmax = qn->q->spec.qmax;
    s->channels = 1;
    s->scale = r->scale;
    s->zero_point = r->zero_point;
  }
  return s;
}

/* dq(a) + dq(b) or dq(a) * dq(b) [-> relu | relu6] -> q on u8 tensors, each input with its own
 * scale and zero point. The step computes per element what the Q/DQ graph computes, in the same
 * float operations: (float)(q - zp) * s for each input (dequantized_u8), one float add or
 * multiply, the relu (relu6), then the reference quantize; so it is bit-exact, and no fp32 tensor
 * is materialized. Inputs of one shape compute them element by element in vector registers,
 * dequantize included (faster than a lookup in a 65,536-entry table of every pair: a byte
 * gather per element). */
static const char *lower_binary_u8(qt_lowering *L, int i) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  for (int k = 0; k < 2; k++) {
    const char *why = u8_input(L, n->inputs[k]);
    if (why) return why;
  }
  int relu, quant;
  const char *why = qt_match_output(L, i, &relu, &quant);
  if (why) return why;
  u8_add *a = qt_keep(L->p, sizeof *a);
  for (int k = 0; k < 2; k++) {
    a->scale[k] = L->rep[n->inputs[k]].scale[0];
    a->zero_point[k] = L->rep[n->inputs[k]].zero_point[0];
  }
  a->relu6 = relu >= 0 && g->nodes[relu].op == QT_OP_RELU6;
  a->relu = relu >= 0 && !a->relu6;
  a->mul = n->op == QT_OP_MUL;
  const qt_value *av = &g->values[n->inputs[0]], *bv = &g->values[n->inputs[1]];
  const int64_t numel = qt_value_numel(av);
  a->P = numel == qt_value_numel(bv) ? 1 : av->shape[0] * av->shape[1]; /* else an image by a (C) vector */
  a->C = numel / a->P;
  qt_step *s = u8_unit_step(L, i, K_ADD_U8, relu, quant, 1);
  s->aux = a;
  char nodes[256];
  qt_unit_nodes(L, i, 2, relu, quant, nodes, sizeof nodes);
  qt_part_add(&L->p->parts, QT_PART_INT8, nodes, "%s u8 %s u8 -> u8%s (own scales and zero points, requantized)",
              a->mul ? "mul" : "add", a->mul ? "*" : "+", fused_name(L, relu));
  return NULL;
}

/* dq -> activation [-> relu | relu6] -> q: the activation of each of the 256 dequantized values,
 * by the fp32 kernel itself (qt_act_forward), quantized: a table, bit for bit the Q/DQ graph. */
static const char *lower_activation_u8(qt_lowering *L, int i) {
  const qt_node *n = &L->g->nodes[i];
  const char *why = u8_input(L, n->inputs[0]);
  int relu, quant;
  if (why || (why = qt_match_output(L, i, &relu, &quant))) return why;
  float x[256], y[256];
  dequantized(&L->rep[n->inputs[0]], x);
  const qt_act a = {(qt_act_kind)n->attr.act, n->attr.alpha, n->attr.beta};
  qt_act_forward(y, x, 256, &a);
  u8_table *t = qt_keep(L->p, sizeof *t);
  qt_step *s = u8_unit_step(L, i, K_TABLE_U8, relu, quant, 0);
  table_of(L, y, relu, quant, t->map[0]);
  s->aux = t;
  char nodes[256];
  qt_unit_nodes(L, i, 1, relu, quant, nodes, sizeof nodes);
  qt_part_add(&L->p->parts, QT_PART_INT8, nodes, "%s on u8: a 256-entry table%s", qt_act_name(a.kind),
              fused_name(L, relu));
  return NULL;
}

/* Inputs on one grid with no quantize after the concat (the inputs tied by a Quantizer with
 * concat_shared, XNNPACK's): a copy into the channels, the qparams kept (identity tables). */
static const char *lower_concat_copy_u8(qt_lowering *L, int i, const char *no_output) {
  const qt_node *n = &L->g->nodes[i];
  if (qt_off_grid_input(L, n) >= 0) return no_output;
  u8_table *t = qt_keep(L->p, sizeof *t);
  t->n = n->n_inputs;
  for (int k = 0; k < n->n_inputs; k++)
    for (int q = 0; q < 256; q++) t->map[k][q] = (uint8_t)q;
  qt_concat_copy_step(L, i, K_CONCAT_U8, t->C, t->off, &t->Y)->aux = t;
  qt_part_add(&L->p->parts, QT_PART_INT8, n->name, "concat of %d u8 tensors (a copy, same qparams)", n->n_inputs);
  return NULL;
}

/* dq -> prelu [-> relu | relu6] -> q: per slope, the fp32 kernel's PReLU (qt_prelu) of each of
 * the 256 dequantized values, quantized: a table per channel (one table for a shared slope), bit
 * for bit the Q/DQ graph. */
static const char *lower_prelu_u8(qt_lowering *L, int i) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  const char *why = u8_input(L, n->inputs[0]);
  int relu, quant;
  if (why || (why = qt_match_output(L, i, &relu, &quant))) return why;
  const qt_param *w = &g->tensors[n->param[QT_P_WEIGHT]];
  const float *slope = qt_param_data(g, n->param[QT_P_WEIGHT]);
  float x[256];
  dequantized(&L->rep[n->inputs[0]], x);
  uint8_t *maps;
  if (w->numel == 1) {
    u8_table *t = qt_keep(L->p, sizeof *t);
    u8_unit_step(L, i, K_TABLE_U8, relu, quant, 0)->aux = t;
    maps = t->map[0];
  } else {
    u8_channel_table *t = qt_keep(L->p, sizeof *t);
    t->C = w->numel;
    t->maps = maps = qt_keep(L->p, (size_t)w->numel * 256);
    u8_unit_step(L, i, K_CHANNEL_TABLE_U8, relu, quant, 0)->aux = t;
  }
  qt_ctx *ctx = qt_ctx_create(); /* the tables, once the step gave the quantize's value its qparams */
  qt_ctx_set_grad(ctx, 0);
  const int64_t one = 1, xs[1] = {256};
  for (int64_t c = 0; c < w->numel; c++) {
    qt_ctx_reset(ctx);
    qt_tensor *y =
        qt_prelu(ctx, qt_tensor_wrap(ctx, QT_F32, 1, xs, x), qt_tensor_wrap(ctx, QT_F32, 1, &one, (void *)(slope + c)));
    table_of(L, qt_f32(y), relu, quant, maps + c * 256);
  }
  qt_ctx_free(ctx);
  char nodes[256];
  qt_unit_nodes(L, i, 1, relu, quant, nodes, sizeof nodes);
  qt_part_add(&L->p->parts, QT_PART_INT8, nodes, "prelu on u8: a 256-entry table%s%s",
              w->numel > 1 ? " per channel" : "", fused_name(L, relu));
  return NULL;
}

/* dq(x1), dq(x2), ... -> concat [-> relu] -> q: each input's integers requantized to the
 * output's by a table (the Q/DQ graph quantizes the dequantized values it copies), copied into
 * its channels. Without the quantize, inputs on one grid are copied (lower_concat_copy_u8). */
static const char *lower_concat_u8(qt_lowering *L, int i) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  for (int k = 0; k < n->n_inputs; k++) {
    const char *why = u8_input(L, n->inputs[k]);
    if (why) return why;
  }
  int relu, quant;
  const char *why = qt_match_output(L, i, &relu, &quant);
  if (why) return lower_concat_copy_u8(L, i, why);
  const qt_value *yv = &g->values[n->output];
  u8_table *t = qt_keep(L->p, sizeof *t);
  t->n = n->n_inputs;
  t->Y = yv->shape[yv->ndim - 1];
  float x[QT_MAX_INPUTS][256];
  for (int k = 0; k < n->n_inputs; k++) {
    const qt_value *xv = &g->values[n->inputs[k]];
    t->C[k] = xv->shape[xv->ndim - 1];
    t->off[k] = k ? t->off[k - 1] + t->C[k - 1] : 0;
    dequantized(&L->rep[n->inputs[k]], x[k]);
  }
  qt_step *s = u8_unit_step(L, i, K_CONCAT_U8, relu, quant, 0);
  for (int k = 0; k < n->n_inputs; k++) table_of(L, x[k], relu, quant, t->map[k]);
  s->in_numel = qt_value_numel(yv); /* rows * Y per sample */
  s->aux = t;
  char nodes[256];
  qt_unit_nodes(L, i, n->n_inputs, relu, quant, nodes, sizeof nodes);
  qt_part_add(&L->p->parts, QT_PART_INT8, nodes, "concat of %d u8 tensors -> u8 (each requantized by a table)%s",
              n->n_inputs, fused_name(L, relu));
  return NULL;
}

/* channel_shuffle, channel_slice on u8: a copy of channels, the input's qparams kept. */
static const char *lower_gather_u8(qt_lowering *L, int i) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  const char *why = u8_input(L, n->inputs[0]);
  if (why) return why;
  const qt_value *xv = &g->values[n->inputs[0]], *yv = &g->values[n->output];
  u8_gather *c = qt_keep(L->p, sizeof *c);
  c->IC = xv->shape[xv->ndim - 1];
  c->OC = yv->shape[yv->ndim - 1];
  c->src = qt_keep(L->p, (size_t)c->OC * sizeof *c->src);
  for (int64_t k = 0; k < c->OC; k++)
    c->src[k] = (int32_t)(n->op == QT_OP_CHANNEL_SHUFFLE ? qt_channel_shuffle_src(k, c->IC, n->attr.groups)
                                                         : n->attr.begin + k);
  qt_step *s = qt_kernel_step(L->p, K_GATHER_U8, NULL, L->rep[n->inputs[0]].slot, qt_value_numel(xv),
                              (size_t)qt_value_numel(yv));
  s->aux = c;
  qt_same_qparams(L, i, s->out);
  qt_part_add(&L->p->parts, QT_PART_INT8, n->name, "%s on u8 (a copy, same qparams)", qt_op_name(n->op));
  return NULL;
}

/* resize nearest on u8: a copy of each pixel into a 2 x 2 block, the input's qparams kept; the
 * bilinear one has no u8 kernel here (its fallback sits between quantize and dequantize). */
static const char *lower_resize_u8(qt_lowering *L, int i) {
  const qt_node *n = &L->g->nodes[i];
  if (n->attr.mode != QT_RESIZE_NEAREST) return "bilinear resize has no u8 kernel here";
  const char *why = u8_input(L, n->inputs[0]);
  if (why) return why;
  qt_resize_nearest_step(L, i, K_RESIZE_U8);
  qt_part_add(&L->p->parts, QT_PART_INT8, n->name, "resize (nearest, x2) on u8 (a copy, same qparams)");
  return NULL;
}

/* relu on u8 (outside a unit: after a max pool or a concat): max(q, zp), the input's qparams
 * kept, since zero is on the grid and dequantize is monotone. */
static const char *lower_relu_u8(qt_lowering *L, int i) {
  const qt_node *n = &L->g->nodes[i];
  const char *why = u8_input(L, n->inputs[0]);
  if (why) return why;
  const qt_value_rep *in = &L->rep[n->inputs[0]];
  u8_table *t = qt_keep(L->p, sizeof *t);
  for (int q = 0; q < 256; q++) t->map[0][q] = (uint8_t)(q < in->zero_point[0] ? in->zero_point[0] : q);
  const int64_t numel = qt_value_numel(&L->g->values[n->output]);
  qt_step *s = qt_kernel_step(L->p, K_TABLE_U8, NULL, in->slot, numel, (size_t)numel);
  s->aux = t;
  qt_same_qparams(L, i, s->out);
  qt_part_add(&L->p->parts, QT_PART_INT8, n->name, "relu on u8: max(q, zero point)");
  return NULL;
}

/* dq -> global_avg_pool [-> relu | relu6] -> q: per channel, the dequantized values summed in
 * float in the fp32 kernel's order (qt_global_avg_pool_forward: pixel by pixel) and divided by
 * the pixel count, then the reference quantize: bit for bit the Q/DQ graph. */
static const char *lower_gap_u8(qt_lowering *L, int i) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  const char *why = u8_input(L, n->inputs[0]);
  int relu, quant;
  if (why || (why = qt_match_output(L, i, &relu, &quant))) return why;
  const qt_value *xv = &g->values[n->inputs[0]];
  u8_gap *a = qt_keep(L->p, sizeof *a);
  a->scale = L->rep[n->inputs[0]].scale[0];
  a->zero_point = L->rep[n->inputs[0]].zero_point[0];
  a->HW = xv->shape[0] * xv->shape[1];
  a->C = xv->shape[2];
  a->relu6 = relu >= 0 && g->nodes[relu].op == QT_OP_RELU6;
  a->relu = relu >= 0 && !a->relu6;
  qt_step *s = u8_unit_step(L, i, K_GAP_U8, relu, quant, 1);
  s->aux = a;
  char nodes[256];
  qt_unit_nodes(L, i, 1, relu, quant, nodes, sizeof nodes);
  qt_part_add(&L->p->parts, QT_PART_INT8, nodes, "global average pool u8 -> u8 (float sums, requantized)%s",
              fused_name(L, relu));
  return NULL;
}

/* The oneDNN patterns starting at node i (qt_lowering_ops.lower_node). */
static const char *lower_node(qt_lowering *L, int i) {
  const qt_node *n = &L->g->nodes[i];
  switch (n->op) {
    case QT_OP_CONV2D:
    case QT_OP_LINEAR: {
      int act, bin, relu, quant;
      const char *why = match_int8_layer(L, i, &act, &bin, &relu, &quant);
      return why ? why : lower_int8_layer(L, i, act, bin, relu, quant);
    }
    case QT_OP_MAX_POOL2D:
      if (L->rep[n->inputs[0]].kind != QT_REP_INT8) return "input is not a u8-quantized tensor";
      return lower_max_pool_u8(L, i);
    case QT_OP_RELU: return lower_relu_u8(L, i);
    case QT_OP_ADD:
    case QT_OP_MUL: return lower_binary_u8(L, i);
    case QT_OP_ACTIVATION: return lower_activation_u8(L, i);
    case QT_OP_PRELU: return lower_prelu_u8(L, i);
    case QT_OP_CONCAT: return lower_concat_u8(L, i);
    case QT_OP_CHANNEL_SHUFFLE:
    case QT_OP_CHANNEL_SLICE: return lower_gather_u8(L, i);
    case QT_OP_GLOBAL_AVG_POOL: return lower_gap_u8(L, i);
    case QT_OP_RESIZE: return lower_resize_u8(L, i);
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
    for (int64_t i = 0; i < n; i++) out[i] = dequantized_u8(q[i], zp, sc);
  } else {
#pragma omp parallel for schedule(static) if (n >= 65536)
    for (int64_t i = 0; i < n; i++) out[i] = dequantized_u8(q[i], s->zero_point[i % C], s->scale[i % C]);
  }
}

/* u8 add / mul: per block, the reference's float operations into a small buffer, then the
 * reference quantize (so every rounding is the Q/DQ graph's own). */
static void run_binary_u8(const qt_step *s, uint8_t *out, const uint8_t *a, const uint8_t *b, int64_t n) {
  enum { BLOCK = 4096 };
  const u8_add *d = s->aux;
  const float sa = d->scale[0], sb = d->scale[1];
  const int32_t za = d->zero_point[0], zb = d->zero_point[1];
  if (d->P == 1) { /* the Q/DQ graph's float operations (lower_binary_u8), element by element */
    const float inv_s = 1.0f / s->scale[0], zpf = (float)s->zero_point[0];
    const float lo = (float)s->qmin, hi = (float)s->qmax;
    const int mul = d->mul, relu = d->relu, relu6 = d->relu6;
#pragma omp parallel for simd schedule(static) if (n >= 65536)
    for (int64_t i = 0; i < n; i++) {
      const float u = dequantized_u8(a[i], za, sa), v = dequantized_u8(b[i], zb, sb);
      const float y = fused_relu(mul ? u * v : u + v, relu, relu6);
      out[i] = (uint8_t)(int32_t)quant_clamp(quant_round(y, inv_s, zpf), lo, hi);
    }
    return;
  }
  const int64_t blocks = (n + BLOCK - 1) / BLOCK, PC = d->P * d->C;
#pragma omp parallel for schedule(static) if (n >= 65536)
  for (int64_t blk = 0; blk < blocks; blk++) { /* an image and a per-channel vector */
    float y[BLOCK];
    int32_t q[BLOCK];
    const int64_t i0 = blk * BLOCK, len = n - i0 < BLOCK ? n - i0 : BLOCK;
    for (int64_t k = 0; k < len; k++) {
      const int64_t i = i0 + k;
      const float u = dequantized_u8(a[i], za, sa), v = dequantized_u8(b[i / PC * d->C + i % d->C], zb, sb);
      y[k] = d->mul ? u * v : u + v;
    }
    for (int64_t k = 0; k < len; k++) y[k] = fused_relu(y[k], d->relu, d->relu6);
    qt_quantize(q, y, len, 1, 1, s->scale, s->zero_point, s->qmin, s->qmax);
    for (int64_t k = 0; k < len; k++) out[i0 + k] = (uint8_t)q[k];
  }
}

static void run_table_u8(const qt_step *s, uint8_t *out, const uint8_t *in, int64_t n) {
  const uint8_t *map = ((const u8_table *)s->aux)->map[0];
#pragma omp parallel for schedule(static) if (n >= 65536)
  for (int64_t i = 0; i < n; i++) out[i] = map[in[i]];
}

static void run_channel_table_u8(const qt_step *s, uint8_t *out, const uint8_t *in, int64_t n) {
  const u8_channel_table *t = s->aux;
  const int64_t rows = n / t->C;
#pragma omp parallel for schedule(static) if (n >= 65536)
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < t->C; c++) out[r * t->C + c] = t->maps[c * 256 + in[r * t->C + c]];
}

/* numel: of the output (rows of Y channels) */
static void run_concat_u8(const qt_step *s, uint8_t *out, uint8_t *const *in, int64_t numel) {
  const u8_table *t = s->aux;
  const int64_t rows = numel / t->Y;
#pragma omp parallel for schedule(static) if (numel >= 65536)
  for (int64_t r = 0; r < rows; r++)
    for (int k = 0; k < t->n; k++) {
      const uint8_t *x = in[k] + r * t->C[k], *map = t->map[k];
      uint8_t *y = out + r * t->Y + t->off[k];
      for (int64_t c = 0; c < t->C[k]; c++) y[c] = map[x[c]];
    }
}

/* N images (n input values in all), output rows in parallel. */
static void run_resize_u8(const qt_step *s, uint8_t *out, const uint8_t *in, int64_t n) {
  const int64_t rows = 2 * (n / (s->in_numel / s->H)); /* output rows: N 2H */
#pragma omp parallel if (n >= 65536)
  {
    const int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
    qt_resize_nearest_rows(s, out, in, rows * t / T, rows * (t + 1) / T);
  }
}

static void run_gather_u8(const qt_step *s, uint8_t *out, const uint8_t *in, int64_t n) {
  const u8_gather *c = s->aux;
  const int64_t rows = n / c->IC;
#pragma omp parallel for schedule(static) if (n >= 65536)
  for (int64_t r = 0; r < rows; r++)
    for (int64_t k = 0; k < c->OC; k++) out[r * c->OC + k] = in[r * c->IC + c->src[k]];
}

/* N images: per channel, acc += the dequantized value (dequantized_u8), pixel by pixel, then
 * acc / HW (as qt_global_avg_pool_forward), the relu, the reference quantize. */
static void run_gap_u8(const qt_step *s, uint8_t *out, const uint8_t *in, int N) {
  const u8_gap *d = s->aux;
  const int64_t HW = d->HW, C = d->C;
#pragma omp parallel for schedule(static) if ((int64_t)N * HW * C >= 65536)
  for (int n = 0; n < N; n++) {
    float *acc = malloc((size_t)C * sizeof *acc);
    int32_t *q = malloc((size_t)C * sizeof *q);
    QT_ASSERT(acc && q, "out of memory");
    const uint8_t *img = in + (int64_t)n * HW * C;
    for (int64_t c = 0; c < C; c++) acc[c] = 0.0f;
    const float sc = d->scale;
    const int32_t zp = d->zero_point;
    for (int64_t i = 0; i < HW; i++) {
      const uint8_t *px = img + i * C;
#pragma omp simd
      for (int64_t c = 0; c < C; c++) acc[c] += dequantized_u8(px[c], zp, sc);
    }
    for (int64_t c = 0; c < C; c++) acc[c] = fused_relu(acc[c] / (float)HW, d->relu, d->relu6);
    qt_quantize(q, acc, C, 1, 1, s->scale, s->zero_point, s->qmin, s->qmax);
    for (int64_t c = 0; c < C; c++) out[(int64_t)n * C + c] = (uint8_t)q[c];
    free(acc);
    free(q);
  }
}

/* A value already in output units (divided by the scale) as the Q node makes it an integer:
 * round half even, add the zero point in float, clamp (NaN -> qmin). */
static inline uint8_t quantized_u8(float v, float zp, float lo, float hi) {
  float r = nearbyintf(v) + zp;
  if (!(r >= lo)) r = lo;
  if (r > hi) r = hi;
  return (uint8_t)r;
}

static void run_requantize(const qt_step *s, uint8_t *out, const float *in, int64_t n) {
  const float zp = (float)s->zero_point[0], lo = (float)s->qmin, hi = (float)s->qmax;
#pragma omp parallel for simd schedule(static) if (n >= 65536)
  for (int64_t i = 0; i < n; i++) out[i] = quantized_u8(in[i], zp, lo, hi);
}

/* A fused activation on the layer's real f32 output, then relu / relu6 and the quantize, in
 * blocks: the fp32 kernel's activation (qt_act_forward) and the format's quantize formula. */
static void run_act_requantize(const qt_step *s, uint8_t *out, const float *in, int64_t n) {
  enum { BLOCK = 1024 };
  const act_requant *a = s->aux;
  const float zp = (float)s->zero_point[0], lo = (float)s->qmin, hi = (float)s->qmax;
  const int64_t blocks = (n + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static) if (n >= 65536)
  for (int64_t b = 0; b < blocks; b++) {
    float y[BLOCK];
    const int64_t k0 = b * BLOCK, len = n - k0 < BLOCK ? n - k0 : BLOCK;
    qt_act_forward(y, in + k0, len, &a->act);
#pragma omp simd
    for (int64_t k = 0; k < len; k++)
      out[k0 + k] = quantized_u8(fused_relu(y[k], a->relu, a->relu6) * a->inv_scale, zp, lo, hi);
  }
}

/* A conv's fused add on its real f32 output: + the other input's dequantized value (table), the
 * relu / relu6, then the quantize formula; per element the Q/DQ graph's float add, relu and
 * quantize. */
static void run_add_requantize(const qt_step *s, uint8_t *out, const float *in, const uint8_t *r, int64_t n) {
  const add_requant *a = s->aux;
  const float zp = (float)s->zero_point[0], lo = (float)s->qmin, hi = (float)s->qmax;
#pragma omp parallel for simd schedule(static) if (n >= 65536)
  for (int64_t k = 0; k < n; k++)
    out[k] = quantized_u8(fused_relu(in[k] + a->lut[r[k]], a->relu, a->relu6) * a->inv_scale, zp, lo, hi);
}

/* A layer's fused gate on its real f32 outputs z (C per sample, numel of them in all): per
 * sample the activation of the C values (the fp32 kernel's, qt_act_forward), each times channel
 * c of the other input's P pixels (dequantized by the table), the relu / relu6, then the quantize
 * formula: per element the Q/DQ graph's activation, float multiply and quantize. */
static void run_gate_requantize(const qt_step *s, uint8_t *out, const float *z, const uint8_t *x, int64_t numel) {
  const gate_requant *a = s->aux;
  const int64_t C = a->C, P = a->P, N = numel / C;
  const float zp = (float)s->zero_point[0], lo = (float)s->qmin, hi = (float)s->qmax;
  float *gates = malloc((size_t)numel * sizeof(float));
  QT_ASSERT(gates, "out of memory");
  qt_act_forward(gates, z, numel, &a->act);
#pragma omp parallel for schedule(static) if (numel * P >= 65536)
  for (int64_t row = 0; row < N * P; row++) { /* one pixel of one sample */
    const float *gate = gates + (row / P) * C;
    const uint8_t *xs = x + row * C;
    uint8_t *os = out + row * C;
#pragma omp simd
    for (int64_t c = 0; c < C; c++)
      os[c] = quantized_u8(fused_relu(a->lut[xs[c]] * gate[c], a->relu, a->relu6) * a->inv_scale, zp, lo, hi);
  }
  free(gates);
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

static void run_kernel(const qt_program *p, const qt_step *s, void *o, int64_t numel, int n) {
  uint8_t *in[QT_MAX_INPUTS] = {NULL};
  for (int k = 0; k < QT_MAX_INPUTS; k++) in[k] = s->in[k] >= 0 ? p->bufs[s->in[k]] : NULL;
  switch ((kernel_kind)s->op_kind) {
    case K_INT8: qt_int8_op_run(s->op, o, in[0], n); break;
    case K_REQUANTIZE: run_requantize(s, o, (const float *)(void *)in[0], numel); break;
    case K_ACT_REQUANTIZE: run_act_requantize(s, o, (const float *)(void *)in[0], numel); break;
    case K_ADD_REQUANTIZE: run_add_requantize(s, o, (const float *)(void *)in[0], in[1], numel); break;
    case K_GATE_REQUANTIZE: run_gate_requantize(s, o, (const float *)(void *)in[0], in[1], numel); break;
    case K_ADD_U8: run_binary_u8(s, o, in[0], in[1], numel); break;
    case K_TABLE_U8: run_table_u8(s, o, in[0], numel); break;
    case K_CHANNEL_TABLE_U8: run_channel_table_u8(s, o, in[0], numel); break;
    case K_CONCAT_U8: run_concat_u8(s, o, in, numel); break;
    case K_GATHER_U8: run_gather_u8(s, o, in[0], numel); break;
    case K_RESIZE_U8: run_resize_u8(s, o, in[0], numel); break;
    case K_GAP_U8: run_gap_u8(s, o, in[0], n); break;
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
      case QT_STEP_KERNEL: run_kernel(p, s, o, numel, n); break;
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
