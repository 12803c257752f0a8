/* Lowering of a Q/DQ graph onto XNNPACK's operators (the built-in xnnpack backend, backend.h)
 * and the runtime that executes the result, behind qt_device (device.c).
 *
 * The same walk as lower.c: every value gets a representation, fp32 or integers (int8 for the
 * ranges XNNPACK's qs8 operators take, int32 otherwise) with the qparams that turn them into
 * the value the Q/DQ graph computes; a dequantize is free until an fp32 consumer needs it.
 * The runtime is xnnpack_run.c. Patterns become one XNNPACK operator each (operator API: created once with their
 * weights and qparams, set up for the batch and buffers at every run): dq -> conv2d [-> relu | relu6] -> q
 * xnn_create_convolution2d_nhwc_qc8 (OHWI weights, one scale per output channel, int32 bias; relu / relu6 / a < 8-bit
 * range as the output clamp) dq -> linear [-> relu | relu6] -> q     xnn_create_fully_connected_nc_qs8 (one weight
 * scale) dq + dq -> add [-> relu | relu6] -> q   xnn_create_add_nd_qs8 dq -> global_avg_pool -> q
 * xnn_create_global_average_pooling_nwc_qs8 max_pool2d on int8                      xnn_create_max_pooling2d_nhwc_s8
 * (same qparams) relu on int8 (same qparams)             xnn_create_clamp_nc_s8 at the zero point flatten a view
 * Everything else (and a pattern whose records XNNPACK cannot take: u8 activations, per-channel
 * linear weights, an operator XNNPACK refuses) runs as dq -> fp32 op -> q with the framework's
 * own fp32 node forward: a fallback partition with its reason. A quantize of fp32 data and a
 * dequantize for an fp32 consumer are boundaries, computed with the reference formulas.
 *
 * Threads: XNNPACK's operators and the boundaries run on a pthreadpool, the fallbacks on
 * OpenMP (the framework's kernels). Each runtime's idle workers spin-wait for milliseconds
 * before they sleep, and a spinning worker of one takes a core from the other's: the pool is
 * told to yield its workers before a fallback, and a fallback runs on one OpenMP thread unless
 * libgomp's workers sleep at once (OMP_WAIT_POLICY=PASSIVE or GOMP_SPINCOUNT=0), since libgomp
 * has no call that stops its workers' spinning (fallback_threads below).
 *
 * Numerics: XNNPACK requantizes acc + bias (int32, accumulator units) by one float32
 * multiplier (s_x * s_w / s_out), rounds to nearest even and adds the zero point (the "fp32"
 * scheme of the 2022 x86 kernels); the exact reference (eval/exact.h) computes
 * (acc + bias) * s_x * s_w in float64. With the graph's own int32 bias (XNNPACK's Quantizer
 * always asks for one: bias_int32_only) the two differ only by the float32 multiplier's
 * rounding, at near-ties. A float bias (a graph quantized for another backend) is rounded to
 * accumulator units here, which the Q/DQ graph does not do: up to that rounding more. */
#include "backend/runtimes.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "autograd/autograd.h"

#ifdef QT_HAVE_XNNPACK
#include "backend/xnnpack_int.h"
#endif

#ifndef QT_HAVE_XNNPACK
/* Built without XNNPACK: the backend exists (its description, the check against it) but cannot
 * deploy. */
struct qt_xnnpack {
  int unused;
};
qt_xnnpack *qt_xnnpack_lower(const qt_graph *g, char *err) {
  qt_err(err,
         "device xnnpack: this build has no XNNPACK runtime (xnnpack.h, libXNNPACK, pthreadpool.h or libpthreadpool "
         "were not found when CMake configured it): install libxnnpack-dev and libpthreadpool-dev (scripts/setup.sh), "
         "reconfigure and rebuild; graph %s was not deployed",
         g->name);
  return NULL;
}
void qt_xnnpack_free(qt_xnnpack *m) { (void)m; }
int qt_xnnpack_run(qt_xnnpack *m, float *out, const float *input, int n, char *err) {
  (void)m, (void)out, (void)input, (void)n;
  return qt_err(err, "device xnnpack: not built");
}
int qt_xnnpack_partition_count(const qt_xnnpack *m) {
  (void)m;
  return 0;
}
qt_partition_kind qt_xnnpack_partition(const qt_xnnpack *m, int i, const char **nodes, const char **detail) {
  (void)m, (void)i, (void)nodes, (void)detail;
  QT_ASSERT(0, "xnnpack: not built");
  return QT_PART_FALLBACK;
}
void qt_xnnpack_report(const qt_xnnpack *m, FILE *f) { (void)m, (void)f; }
int qt_xnnpack_available(char *err) {
  return qt_err(err, "this build has no XNNPACK runtime (install libxnnpack-dev and libpthreadpool-dev, reconfigure)");
}
#else

typedef enum { REP_F32, REP_S8, REP_I32 } rep_kind;

typedef struct {
  rep_kind kind;
  int slot;     /* buffer holding the value's representation */
  int f32_slot; /* its fp32 form once materialized, else -1 (REP_F32: = slot) */
  int channels; /* integers: qparams (per tensor: 1) along the last axis */
  float *scale; /* owned by the model (kept list) */
  int32_t *zero_point;
  int qmin, qmax; /* integers: the range of the quantize that made them */
  int fallback;   /* fp32 made by a fallback partition: the partition whose reason is the
                   * first cause of the chain of fallbacks it ends, else -1 */
} value_rep;

int qt_xnnpack_available(char *err) {
  const enum xnn_status s = xnn_initialize(NULL); /* idempotent */
  if (s != xnn_status_success) return qt_err(err, "xnn_initialize failed: %s", qt_xnn_status_name(s));
  return 0;
}

static void *keep_copy(qt_xnnpack *m, const void *src, size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  QT_ASSERT(p, "out of memory");
  memcpy(p, src, bytes);
  m->kept = qt_grow(m->kept, &m->cap_kept, m->n_kept + 1, sizeof *m->kept, "an xnnpack model table");
  m->kept[m->n_kept++] = p;
  return p;
}

static int new_slot(qt_xnnpack *m, size_t bytes_per_sample) {
  m->slot_bytes =
      qt_grow(m->slot_bytes, &m->cap_slots, m->n_slots + 1, sizeof *m->slot_bytes, "an xnnpack model table");
  m->slot_bytes[m->n_slots] = bytes_per_sample;
  return m->n_slots++;
}

static step *new_step(qt_xnnpack *m, step_kind kind) {
  m->steps = qt_grow(m->steps, &m->cap_steps, m->n_steps + 1, sizeof *m->steps, "an xnnpack model table");
  step *s = &m->steps[m->n_steps++];
  memset(s, 0, sizeof *s);
  s->kind = kind;
  s->in[0] = s->in[1] = s->out = -1;
  return s;
}

/* ---- lowering ----------------------------------------------------------------------------- */

typedef struct {
  const qt_graph *g;
  qt_xnnpack *m;
  value_rep *rep; /* per value */
  int *consumer;  /* per value: its only consuming node, or -1 (none or several) */
  int *done;      /* per node: lowered as part of an earlier pattern */
  char why[320];  /* the last reason a pattern was not lowered */
  int cause;      /* the first cause (a partition) when that reason is an fp32 input, else -1 */
} lowering;

static const float *param_data(const qt_graph *g, int t) { return t >= 0 ? g->params + g->tensors[t].offset : NULL; }

static const char *node_of(const qt_graph *g, int v) { return g->nodes[g->values[v].producer].name; }

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
  s->int8 = r->kind == REP_S8;
  r->f32_slot = s->out;
  qt_part_add(&L->m->parts, QT_PART_BOUNDARY, val->name, "dequantize %s -> fp32 (for an fp32 consumer)",
              r->kind == REP_S8 ? "int8" : "int32");
  return s->out;
}

static void set_qparams(lowering *L, value_rep *r, const qt_qstate *q) {
  r->channels = q->channels;
  r->scale = keep_copy(L->m, q->scale, (size_t)q->channels * sizeof(float));
  r->zero_point = keep_copy(L->m, q->zero_point, (size_t)q->channels * sizeof(int32_t));
  r->qmin = q->spec.qmin;
  r->qmax = q->spec.qmax;
}

static int fits_int8(int qmin, int qmax) { return qmin >= -128 && qmax <= 127; }

static void lower_quantize(lowering *L, int i) {
  const qt_node *n = &L->g->nodes[i];
  const qt_qstate *q = n->q;
  const int x = f32_slot(L, n->inputs[0]);
  step *s = new_step(L->m, ST_QUANTIZE);
  s->in[0] = x;
  s->in_numel = qt_value_numel(&L->g->values[n->output]);
  s->int8 = fits_int8(q->spec.qmin, q->spec.qmax);
  s->out = new_slot(L->m, (size_t)s->in_numel * (s->int8 ? 1 : sizeof(int32_t)));
  s->qmin = q->spec.qmin;
  s->qmax = q->spec.qmax;
  value_rep *r = &L->rep[n->output];
  r->kind = s->int8 ? REP_S8 : REP_I32;
  r->slot = s->out;
  r->f32_slot = -1;
  set_qparams(L, r, q);
  s->channels = r->channels;
  s->scale = r->scale;
  s->zero_point = r->zero_point;
  qt_part_add(&L->m->parts, QT_PART_BOUNDARY, n->name, "quantize fp32 -> %s [%d, %d]", s->int8 ? "int8" : "int32",
              q->spec.qmin, q->spec.qmax);
}

/* Why value v cannot feed a qs8 operator, written to L->why; NULL when it can. */
static const char *int8_input_problem(lowering *L, int v) {
  const value_rep *r = &L->rep[v];
  if (r->kind == REP_F32) {
    if (r->fallback >= 0) { /* the cause is upstream: name its first partition */
      L->cause = r->fallback;
      snprintf(L->why, sizeof L->why, "input '%s' is fp32 (first cause: %s: %s)", L->g->values[v].name,
               L->m->parts.parts[r->fallback].nodes, L->m->parts.parts[r->fallback].detail);
    } else {
      snprintf(L->why, sizeof L->why, "input '%s' is fp32 (no dequantize of integers before it)", L->g->values[v].name);
    }
    return L->why;
  }
  if (r->kind == REP_I32) {
    snprintf(L->why, sizeof L->why, "input '%s' holds [%d, %d] integers; XNNPACK's qs8 operators take int8 [-128, 127]",
             L->g->values[v].name, r->qmin, r->qmax);
    return L->why;
  }
  if (r->channels != 1) {
    snprintf(L->why, sizeof L->why, "input '%s' has per-channel activation qparams", L->g->values[v].name);
    return L->why;
  }
  return NULL;
}

/* The quantize that ends node i's unit: i [-> relu | relu6] -> q with a per-tensor int8 range.
 * Fills act (the relu / relu6 node or -1) and quant; NULL, or the reason in L->why. */
static const char *match_output(lowering *L, int i, int *act, int *quant) {
  const qt_graph *g = L->g;
  int v = g->nodes[i].output, c = L->consumer[v];
  *act = *quant = -1;
  if (v == g->output || c < 0) return "output is not consumed by exactly one node (no requantization point)";
  if (g->nodes[c].op == QT_OP_RELU || g->nodes[c].op == QT_OP_RELU6) {
    *act = c;
    v = g->nodes[c].output;
    c = L->consumer[v];
    if (v == g->output || c < 0) return "relu output is not consumed by exactly one quantize";
  }
  if (g->nodes[c].op != QT_OP_QUANTIZE) return "output is not followed by a quantize (no requantization point)";
  const qt_qstate *q = g->nodes[c].q;
  if (q->channels != 1) return "output has per-channel activation qparams";
  if (!fits_int8(q->spec.qmin, q->spec.qmax)) {
    snprintf(L->why, sizeof L->why, "output range [%d, %d] does not fit int8 (XNNPACK's qs8 operators)", q->spec.qmin,
             q->spec.qmax);
    return L->why;
  }
  *quant = c;
  return NULL;
}

/* The output clamp of an operator: the quantize's range, narrowed by a fused relu (zero point)
 * or relu6 (6 quantized as the exact reference does: round_half_even(6 / s) + zp). Clamping the
 * integers equals quantizing the clamped value: rounding is monotone. */
static void output_clamp(const qt_graph *g, int act, const qt_qstate *q, int8_t *lo, int8_t *hi) {
  int a = q->spec.qmin, b = q->spec.qmax;
  const int zp = q->zero_point[0];
  if (act >= 0) {
    if (zp > a) a = zp;
    if (g->nodes[act].op == QT_OP_RELU6) {
      const double six = nearbyint(6.0 / (double)q->scale[0]) + zp;
      if (six < b) b = (int)six;
    }
  }
  if (b < a) b = a;
  *lo = (int8_t)a;
  *hi = (int8_t)b;
}

/* Output value of the unit, now int8 in slot `slot` with q's qparams; the unit's nodes done. */
static void unit_done(lowering *L, int first, int act, int quant, int slot) {
  const qt_node *qn = &L->g->nodes[quant];
  value_rep *r = &L->rep[qn->output];
  r->kind = REP_S8;
  r->slot = slot;
  r->f32_slot = -1;
  set_qparams(L, r, qn->q);
  L->done[first] = 1;
  if (act >= 0) L->done[act] = 1;
  L->done[quant] = 1;
}

static const char *act_text(const qt_graph *g, int act) {
  return act < 0 ? "" : g->nodes[act].op == QT_OP_RELU6 ? ", fused relu6 (clamp)" : ", fused relu (clamp)";
}

static const char *lower_layer(lowering *L, int i) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  const qt_qstate *wq = n->wq;
  const int is_conv = n->op == QT_OP_CONV2D;
  if (!wq || !wq->qweight) return "weights are not quantized (fp32 layer)";
  const char *why;
  if (wq->spec.qmin < -128 || wq->spec.qmax > 127) return "weight range does not fit int8";
  for (int c = 0; c < wq->channels; c++)
    if (wq->zero_point[c] != 0) {
      snprintf(L->why, sizeof L->why, "weights have a zero point (%d in channel %d); XNNPACK takes symmetric weights",
               wq->zero_point[c], c);
      return L->why;
    }
  if (!is_conv && wq->channels > 1) {
    snprintf(L->why, sizeof L->why,
             "per-channel linear weights (%d scales); XNNPACK's qs8 fully connected takes one "
             "weight scale",
             wq->channels);
    return L->why;
  }
  if ((why = int8_input_problem(L, n->inputs[0]))) return why;
  int act, quant;
  if ((why = match_output(L, i, &act, &quant))) return why;
  const qt_qstate *qo = g->nodes[quant].q;
  const value_rep *in = &L->rep[n->inputs[0]];
  const qt_value *xv = &g->values[n->inputs[0]], *yv = &g->values[n->output];
  const int OC = n->attr.out_channels;
  const int64_t inner = wq->n_qweight / OC;
  const double s_x = in->scale[0], s_out = qo->scale[0];
  const int zp_x = in->zero_point[0], zp_out = qo->zero_point[0];
  int8_t lo, hi;
  output_clamp(g, act, qo, &lo, &hi);

  int8_t *w8 = malloc((size_t)wq->n_qweight);
  int32_t *bias = malloc((size_t)OC * sizeof(int32_t));
  float *wscale = malloc((size_t)OC * sizeof(float));
  QT_ASSERT(w8 && bias && wscale, "out of memory");
  const float *b = param_data(g, n->param[QT_P_BIAS]);
  const char *bias_problem = NULL;
  for (int c = 0; c < OC; c++) {
    wscale[c] = wq->scale[wq->channels == 1 ? 0 : c];
    /* the graph's int32 bias as it is; a float bias rounded to accumulator units here (the
     * Q/DQ graph then computes with a bias XNNPACK does not have: quant.bias = int32 avoids it) */
    const double acc_bias = wq->qbias ? (double)wq->qbias[c]
                            : b       ? nearbyint((double)b[c] / (s_x * (double)wscale[c]))
                                      : 0.0;
    if (!(fabs(acc_bias) < 2147483647.0)) bias_problem = "bias does not fit int32 in accumulator units";
    bias[c] = bias_problem ? 0 : (int32_t)acc_bias;
  }
  int KH = 1, KW = 1, C = (int)qt_value_numel(xv), groups = 1;
  if (is_conv) {
    KH = n->attr.kernel_h, KW = n->attr.kernel_w, C = (int)xv->shape[2];
    groups = n->attr.groups > 1 ? n->attr.groups : 1;
    /* OIHW (OC, C/groups, KH, KW) -> XNNPACK's OHWI per group (the same for depthwise without
     * XNN_FLAG_DEPTHWISE_CONVOLUTION) */
    const int IC = C / groups;
    for (int o = 0; o < OC; o++)
      for (int ic = 0; ic < IC; ic++)
        for (int k = 0; k < KH * KW; k++)
          w8[(int64_t)o * inner + (int64_t)k * IC + ic] =
              (int8_t)wq->qweight[(int64_t)o * inner + (int64_t)ic * KH * KW + k];
  } else {
    for (int64_t k = 0; k < wq->n_qweight; k++) w8[k] = (int8_t)wq->qweight[k];
  }
  xnn_operator_t op = NULL;
  enum xnn_status st = xnn_status_success;
  const char *api = is_conv ? "xnn_create_convolution2d_nhwc_qc8" : "xnn_create_fully_connected_nc_qs8";
  if (!bias_problem) {
    if (is_conv)
      st = xnn_create_convolution2d_nhwc_qc8(
          (uint32_t)n->attr.pad_h, (uint32_t)n->attr.pad_w, (uint32_t)n->attr.pad_h, (uint32_t)n->attr.pad_w,
          (uint32_t)KH, (uint32_t)KW, (uint32_t)n->attr.stride_h, (uint32_t)n->attr.stride_w, 1, 1, (uint32_t)groups,
          (size_t)(C / groups), (size_t)(OC / groups), (size_t)C, (size_t)OC, (int8_t)zp_x, (float)s_x, wscale, w8,
          bias, (int8_t)zp_out, (float)s_out, lo, hi, 0, &op);
    else
      st = xnn_create_fully_connected_nc_qs8((size_t)C, (size_t)OC, (size_t)C, (size_t)OC, (int8_t)zp_x, (float)s_x,
                                             wscale[0], w8, bias, (int8_t)zp_out, (float)s_out, lo, hi, 0, &op);
  }
  free(w8);
  free(bias);
  if (bias_problem || st != xnn_status_success) {
    float rmax = 0;
    for (int c = 0; c < OC; c++) rmax = fmaxf(rmax, (float)(s_x * wscale[c] / s_out));
    free(wscale);
    if (bias_problem) return bias_problem;
    snprintf(L->why, sizeof L->why, "%s refused it (%s; largest requantization scale s_x * s_w / s_out = %.4g)", api,
             qt_xnn_status_name(st), rmax);
    return L->why;
  }
  free(wscale);
  qt_xnnpack *m = L->m;
  step *s = new_step(m, ST_XNN);
  s->xk = is_conv ? XK_CONV : XK_FC;
  s->op = op;
  s->in[0] = in->slot;
  s->in_numel = qt_value_numel(xv);
  if (is_conv) s->H = (int)xv->shape[0], s->W = (int)xv->shape[1];
  s->out = new_slot(m, (size_t)qt_value_numel(yv));
  unit_done(L, i, act, quant, s->out);
  char nodes[256];
  snprintf(nodes, sizeof nodes, "%s -> %s%s%s -> %s", node_of(g, n->inputs[0]), n->name, act >= 0 ? " -> " : "",
           act >= 0 ? g->nodes[act].name : "", g->nodes[quant].name);
  qt_part_add(&m->parts, QT_PART_INT8, nodes, "%s qs8 x %s -> qs8%s, out [%d, %d]",
              !is_conv                                    ? "fully connected"
              : groups == OC && groups > 1 && groups == C ? "depthwise conv"
              : groups > 1                                ? "grouped conv"
                                                          : "conv",
              is_conv ? "qc8 (per-channel)" : "qs8 (per-tensor)", act_text(g, act), lo, hi);
  return NULL;
}

static const char *lower_add(lowering *L, int i) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  const char *why;
  for (int k = 0; k < 2; k++)
    if ((why = int8_input_problem(L, n->inputs[k]))) return why;
  int act, quant;
  if ((why = match_output(L, i, &act, &quant))) return why;
  const qt_qstate *qo = g->nodes[quant].q;
  const value_rep *a = &L->rep[n->inputs[0]], *b = &L->rep[n->inputs[1]];
  int8_t lo, hi;
  output_clamp(g, act, qo, &lo, &hi);
  xnn_operator_t op = NULL;
  const enum xnn_status st =
      xnn_create_add_nd_qs8((int8_t)a->zero_point[0], a->scale[0], (int8_t)b->zero_point[0], b->scale[0],
                            (int8_t)qo->zero_point[0], qo->scale[0], lo, hi, 0, &op);
  if (st != xnn_status_success) {
    snprintf(L->why, sizeof L->why, "xnn_create_add_nd_qs8 refused it (%s; input / output scale ratios %.4g, %.4g)",
             qt_xnn_status_name(st), a->scale[0] / qo->scale[0], b->scale[0] / qo->scale[0]);
    return L->why;
  }
  step *s = new_step(L->m, ST_XNN);
  s->xk = XK_ADD;
  s->op = op;
  s->in[0] = a->slot;
  s->in[1] = b->slot;
  s->in_numel = qt_value_numel(&g->values[n->output]);
  s->out = new_slot(L->m, (size_t)s->in_numel);
  unit_done(L, i, act, quant, s->out);
  char nodes[256];
  snprintf(nodes, sizeof nodes, "%s + %s -> %s%s%s -> %s", node_of(g, n->inputs[0]), node_of(g, n->inputs[1]), n->name,
           act >= 0 ? " -> " : "", act >= 0 ? g->nodes[act].name : "", g->nodes[quant].name);
  qt_part_add(&L->m->parts, QT_PART_INT8, nodes, "add qs8 + qs8 -> qs8%s (own scales and zero points)",
              act_text(g, act));
  return NULL;
}

static const char *lower_global_avg_pool(lowering *L, int i) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  const char *why = int8_input_problem(L, n->inputs[0]);
  if (why) return why;
  int act, quant;
  if ((why = match_output(L, i, &act, &quant))) return why;
  const qt_qstate *qo = g->nodes[quant].q;
  const value_rep *in = &L->rep[n->inputs[0]];
  const qt_value *xv = &g->values[n->inputs[0]];
  const int C = (int)xv->shape[2];
  int8_t lo, hi;
  output_clamp(g, act, qo, &lo, &hi);
  xnn_operator_t op = NULL;
  const enum xnn_status st =
      xnn_create_global_average_pooling_nwc_qs8((size_t)C, (size_t)C, (size_t)C, (int8_t)in->zero_point[0],
                                                in->scale[0], (int8_t)qo->zero_point[0], qo->scale[0], lo, hi, 0, &op);
  if (st != xnn_status_success) {
    snprintf(L->why, sizeof L->why, "xnn_create_global_average_pooling_nwc_qs8 refused it (%s)",
             qt_xnn_status_name(st));
    return L->why;
  }
  step *s = new_step(L->m, ST_XNN);
  s->xk = XK_GAVG_POOL;
  s->op = op;
  s->in[0] = in->slot;
  s->in_numel = qt_value_numel(xv);
  s->H = (int)xv->shape[0], s->W = (int)xv->shape[1];
  s->out = new_slot(L->m, (size_t)C);
  unit_done(L, i, act, quant, s->out);
  char nodes[256];
  snprintf(nodes, sizeof nodes, "%s -> %s%s%s -> %s", node_of(g, n->inputs[0]), n->name, act >= 0 ? " -> " : "",
           act >= 0 ? g->nodes[act].name : "", g->nodes[quant].name);
  qt_part_add(&L->m->parts, QT_PART_INT8, nodes, "global average pooling qs8 -> qs8%s", act_text(g, act));
  return NULL;
}

/* Max pooling and relu on int8 keep the input's qparams (max and relu commute with a monotone
 * dequantize; relu is the clamp at the zero point). */
static const char *lower_same_qparams(lowering *L, int i) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  const char *why = int8_input_problem(L, n->inputs[0]);
  if (why) return why;
  const value_rep *in = &L->rep[n->inputs[0]];
  const qt_value *xv = &g->values[n->inputs[0]], *yv = &g->values[n->output];
  const int pool = n->op == QT_OP_MAX_POOL2D;
  xnn_operator_t op = NULL;
  enum xnn_status st;
  const int C = (int)xv->shape[xv->ndim - 1];
  if (pool)
    st = xnn_create_max_pooling2d_nhwc_s8(
        (uint32_t)n->attr.pad_h, (uint32_t)n->attr.pad_w, (uint32_t)n->attr.pad_h, (uint32_t)n->attr.pad_w,
        (uint32_t)n->attr.kernel_h, (uint32_t)n->attr.kernel_w, (uint32_t)n->attr.stride_h, (uint32_t)n->attr.stride_w,
        1, 1, (size_t)C, (size_t)C, (size_t)C, -128, 127, 0, &op);
  else {
    const int zp = in->zero_point[0] < -128 ? -128 : in->zero_point[0];
    st = xnn_create_clamp_nc_s8((size_t)qt_value_numel(xv), (size_t)qt_value_numel(xv), (size_t)qt_value_numel(xv),
                                (int8_t)zp, 127, 0, &op);
  }
  if (st != xnn_status_success) {
    snprintf(L->why, sizeof L->why, "%s refused it (%s)",
             pool ? "xnn_create_max_pooling2d_nhwc_s8" : "xnn_create_clamp_nc_s8", qt_xnn_status_name(st));
    return L->why;
  }
  step *s = new_step(L->m, ST_XNN);
  s->xk = pool ? XK_MAX_POOL : XK_CLAMP;
  s->op = op;
  s->in[0] = in->slot;
  s->in_numel = qt_value_numel(xv);
  if (pool) s->H = (int)xv->shape[0], s->W = (int)xv->shape[1];
  s->out = new_slot(L->m, (size_t)qt_value_numel(yv));
  value_rep *r = &L->rep[n->output];
  *r = *in;
  r->slot = s->out;
  r->f32_slot = -1;
  qt_part_add(&L->m->parts, QT_PART_INT8, n->name,
              pool ? "max pooling on int8 (same qparams)"
                   : "relu on int8: clamp at the "
                     "zero point (same qparams)");
  return NULL;
}

/* dq -> fp32 op: the node runs with the framework's fp32 kernels on fp32 inputs. */
static void lower_fallback(lowering *L, int i, const char *reason) {
  const qt_graph *g = L->g;
  qt_xnnpack *m = L->m;
  const qt_node *n = &g->nodes[i];
  int in_slots[2] = {-1, -1};
  for (int k = 0; k < n->n_inputs && k < 2; k++) in_slots[k] = f32_slot(L, n->inputs[k]);
  step *s = new_step(m, ST_FALLBACK);
  s->node = i;
  for (int k = 0; k < n->n_inputs && k < 2; k++) {
    const qt_value *v = &g->values[n->inputs[k]];
    s->in[k] = in_slots[k];
    s->in_ndim[k] = v->ndim;
    for (int d = 0; d < 3; d++) s->in_shape[k][d] = v->shape[d];
  }
  s->out = new_slot(m, (size_t)qt_value_numel(&g->values[n->output]) * sizeof(float));
  value_rep *r = &L->rep[n->output];
  r->kind = REP_F32;
  r->slot = r->f32_slot = s->out;
  r->fallback = L->cause >= 0 ? L->cause : m->parts.n;
  qt_part_add(&m->parts, QT_PART_FALLBACK, n->name, "%s in fp32: %s", qt_op_name(n->op), reason);
}

/* Whether libgomp's workers spin-wait after a parallel region before they sleep: its default
 * (GOMP_SPINCOUNT 300,000 pauses, milliseconds; OMP_WAIT_POLICY=ACTIVE: far longer), unless
 * GOMP_SPINCOUNT is 0, or OMP_WAIT_POLICY is PASSIVE without a GOMP_SPINCOUNT (libgomp reads
 * both once, at start-up; there is no call to change them afterwards). While they spin, they
 * compete with the pool's workers for the cores: FashionCNN W8A8 for XNNPACK with conv2 left in
 * fp32 (conv2, relu2, pool2 as fallbacks), batch 256, 2 threads, libgomp's default policy, on a
 * loaded machine (load 9 on 2 cores): 1.9k images/s and 284 CPU ms per 1000 images with the
 * fallbacks on two OpenMP threads and no pool yield, 2.7k and 146 ms now (PASSIVE, fallbacks on
 * two threads: 2.5k -> 4.1k, 222 -> 142 ms with the yield; docs/deployment.md, XNNPACK). */
static int omp_workers_spin(void) {
  const char *count = getenv("GOMP_SPINCOUNT"), *policy = getenv("OMP_WAIT_POLICY");
  if (count && *count) return strtod(count, NULL) != 0; /* "infinity" and the like: spins */
  return !(policy && strncasecmp(policy + strspn(policy, " \t"), "passive", 7) == 0);
}

qt_xnnpack *qt_xnnpack_lower(const qt_graph *g, char *err) {
  if (!g->finalized) {
    qt_err(err, "device xnnpack: graph %s is not finalized", g->name);
    return NULL;
  }
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    if (n->op == QT_OP_FAKE_QUANT || n->op == QT_OP_CONV_BN || (n->wq && !n->wq->qweight)) {
      qt_err(err,
             "device xnnpack: graph %s: node %d '%s' (%s) belongs to a prepared (training) graph; deploy the Q/DQ "
             "graph from qt_convert (model_qdq.h5)",
             g->name, i, n->name, qt_op_name(n->op));
      return NULL;
    }
    if (n->op == QT_OP_QUANTIZE && n->q->spec.qmin < INT32_MIN / 2) {
      qt_err(err, "device xnnpack: node '%s': integer range out of bounds", n->name);
      return NULL;
    }
  }
  if (g->nodes[g->values[g->output].producer].op == QT_OP_QUANTIZE) {
    qt_err(err, "device xnnpack: graph %s: the output '%s' is integers (a quantize); the runtime returns fp32", g->name,
           g->values[g->output].name);
    return NULL;
  }
  char why[QT_ERR_LEN];
  if (qt_xnnpack_available(why)) {
    qt_err(err, "device xnnpack: %s", why);
    return NULL;
  }
  qt_xnnpack *m = calloc(1, sizeof *m);
  QT_ASSERT(m, "out of memory");
  m->g = g;
  snprintf(m->name, sizeof m->name, "%s", g->name);
  lowering L = {g,
                m,
                calloc((size_t)g->n_values, sizeof(value_rep)),
                malloc((size_t)g->n_values * sizeof(int)),
                calloc((size_t)g->n_nodes, sizeof(int)),
                "",
                -1};
  QT_ASSERT(L.rep && L.consumer && L.done, "out of memory");
  for (int v = 0; v < g->n_values; v++) {
    L.consumer[v] = -1;
    L.rep[v].slot = L.rep[v].f32_slot = L.rep[v].fallback = -1;
  }
  for (int i = 0; i < g->n_nodes; i++)
    for (int k = 0; k < g->nodes[i].n_inputs; k++) {
      const int v = g->nodes[i].inputs[k];
      L.consumer[v] = g->values[v].consumers == 1 ? i : -1;
    }
  const qt_value *inv = &g->values[g->input];
  for (int i = 0; i < g->n_nodes; i++) {
    if (L.done[i]) continue;
    const qt_node *n = &g->nodes[i];
    value_rep *out = &L.rep[n->output];
    const char *reason = NULL;
    L.cause = -1;
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
      case QT_OP_LINEAR: reason = lower_layer(&L, i); break;
      case QT_OP_ADD: reason = lower_add(&L, i); break;
      case QT_OP_GLOBAL_AVG_POOL: reason = lower_global_avg_pool(&L, i); break;
      case QT_OP_MAX_POOL2D:
      case QT_OP_RELU: reason = lower_same_qparams(&L, i); break;
      case QT_OP_FLATTEN:
        /* NHWC flatten is a view of the same buffer, whatever the representation */
        *out = L.rep[n->inputs[0]];
        qt_part_add(&m->parts, out->kind == REP_S8 ? QT_PART_INT8 : QT_PART_FALLBACK, n->name,
                    "flatten: a view of the %s tensor",
                    out->kind == REP_S8    ? "int8"
                    : out->kind == REP_I32 ? "int32"
                                           : "fp32");
        break;
      case QT_OP_AVG_POOL2D: reason = "no qs8 average pooling in this XNNPACK (only qu8)"; break;
      default: reason = "XNNPACK has no operator for this op here"; break;
    }
    if (reason) lower_fallback(&L, i, reason);
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
  const int threads = omp_get_max_threads();
  m->pool = threads > 1 ? pthreadpool_create((size_t)threads) : NULL;
  m->fallback_threads = m->pool && omp_workers_spin() ? 1 : 0;
  return m;
}

void qt_xnnpack_free(qt_xnnpack *m) {
  if (!m) return;
  for (int i = 0; i < m->n_steps; i++)
    if (m->steps[i].op) xnn_delete_operator(m->steps[i].op);
  for (int i = 0; i < m->n_kept; i++) free(m->kept[i]);
  if (m->pool) pthreadpool_destroy(m->pool);
  free(m->kept);
  free(m->steps);
  free(m->slot_bytes);
  qt_part_list_free(&m->parts);
  free(m->bufs);
  qt_ctx_free(m->ctx);
  free(m);
}

#endif
