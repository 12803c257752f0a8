/* Lowering of a Q/DQ graph onto XNNPACK's operators (the built-in xnnpack backend, backend.h)
 * behind qt_device (device.c).
 *
 * The walk, the value representations, the boundaries and the fallbacks are the lowering
 * skeleton's (lowering.h), with int8 as the 8-bit representation (the ranges XNNPACK's qs8
 * operators take; int32 otherwise); a dequantize is free until an fp32 consumer needs it.
 * The runtime is xnnpack_run.c. Patterns become one XNNPACK operator each (operator API:
 * created once with their weights and qparams, set up for the batch and buffers at every run):
 *   dq -> conv2d [-> relu | relu6] -> q   xnn_create_convolution2d_nhwc_qc8 (OHWI weights, one
 *                                         scale per output channel, int32 bias; relu / relu6 /
 *                                         a < 8-bit range as the output clamp)
 *   dq -> linear [-> relu | relu6] -> q   xnn_create_fully_connected_nc_qs8 (one weight scale)
 *   dq + dq -> add [-> relu | relu6] -> q xnn_create_add_nd_qs8
 *   dq -> global_avg_pool -> q            xnn_create_global_average_pooling_nwc_qs8
 *   dq -> sigmoid | tanh | elu -> q       xnn_create_{sigmoid,tanh,elu}_nc_qs8
 *   dq -> leaky_relu -> q                 xnn_create_leaky_relu_nc_qu8 (*)
 *   dq -> avg_pool2d -> q                 xnn_create_average_pooling2d_nhwc_qu8 (*)
 *   max_pool2d on int8 (same qparams)     xnn_create_max_pooling2d_nhwc_s8
 *   relu on int8 (same qparams)           xnn_create_clamp_nc_s8 at the zero point
 *   channel shuffle, channel slice        xnn_create_channel_shuffle_nc_x8, xnn_create_copy_nc_x8
 *   concat on one grid, resize nearest    copies of ours (same qparams)
 *   dq -> resize bilinear -> q (tied)     xnn_create_resize_bilinear2d_nhwc_s8 (same qparams)
 *   flatten                               a view (the skeleton's)
 * (*) qu8 operators, which this XNNPACK has and its qs8 set lacks, on the int8 data with the top
 * bit flipped (x + 128, with the zero point + 128: the same real numbers; xnnpack_int.h).
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

int qt_xnnpack_available(char *err) {
  const enum xnn_status s = xnn_initialize(NULL); /* idempotent */
  if (s != xnn_status_success) return qt_err(err, "xnn_initialize failed: %s", qt_xnn_status_name(s));
  return 0;
}

static int fits_int8(int qmin, int qmax) { return qmin >= -128 && qmax <= 127; }

static const char *output_range_problem(qt_lowering *L, const qt_qstate *q) {
  if (fits_int8(q->spec.qmin, q->spec.qmax)) return NULL;
  snprintf(L->why, sizeof L->why, "output range [%d, %d] does not fit int8 (XNNPACK's qs8 operators)", q->spec.qmin,
           q->spec.qmax);
  return L->why;
}

/* Why value v cannot feed a qs8 operator, written to L->why; NULL when it can. */
static const char *int8_input_problem(qt_lowering *L, int v) {
  const qt_value_rep *r = &L->rep[v];
  const qt_part *parts = L->p->parts.parts;
  if (r->kind == QT_REP_F32) {
    if (r->fallback >= 0) { /* the cause is upstream: name its first partition */
      L->cause = r->fallback;
      snprintf(L->why, sizeof L->why, "input '%s' is fp32 (first cause: %s: %s)", L->g->values[v].name,
               parts[r->fallback].nodes, parts[r->fallback].detail);
    } else {
      snprintf(L->why, sizeof L->why, "input '%s' is fp32 (no dequantize of integers before it)", L->g->values[v].name);
    }
    return L->why;
  }
  if (r->kind == QT_REP_I32) {
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

static const char *act_text(const qt_graph *g, int act) {
  return act < 0 ? "" : g->nodes[act].op == QT_OP_RELU6 ? ", fused relu6 (clamp)" : ", fused relu (clamp)";
}

/* Why layer i's weights or input do not suit XNNPACK's qc8 / qs8 operators; NULL when they do. */
static const char *layer_problem(qt_lowering *L, int i) {
  const qt_node *n = &L->g->nodes[i];
  const qt_qstate *wq = n->wq;
  if (!wq || !wq->qweight) return "weights are not quantized (fp32 layer)";
  if (wq->spec.qmin < -128 || wq->spec.qmax > 127) return "weight range does not fit int8";
  for (int c = 0; c < wq->channels; c++)
    if (wq->zero_point[c] != 0) {
      snprintf(L->why, sizeof L->why, "weights have a zero point (%d in channel %d); XNNPACK takes symmetric weights",
               wq->zero_point[c], c);
      return L->why;
    }
  if (n->op != QT_OP_CONV2D && wq->channels > 1) {
    snprintf(L->why, sizeof L->why,
             "per-channel linear weights (%d scales); XNNPACK's qs8 fully connected takes one "
             "weight scale",
             wq->channels);
    return L->why;
  }
  return int8_input_problem(L, n->inputs[0]);
}

/* Layer i's weights as XNNPACK takes them: int8 (conv: OHWI per group), per-channel scales and
 * the bias in int32 accumulator units. The reason when the bias does not fit, else NULL. */
static const char *layer_weights(const qt_lowering *L, int i, int8_t *w8, int32_t *bias, float *wscale) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  const qt_qstate *wq = n->wq;
  const qt_value *xv = &g->values[n->inputs[0]];
  const int OC = n->attr.out_channels;
  const int64_t inner = wq->n_qweight / OC;
  const double s_x = L->rep[n->inputs[0]].scale[0];
  const float *b = qt_param_data(g, n->param[QT_P_BIAS]);
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
  if (n->op == QT_OP_CONV2D) {
    const int KH = n->attr.kernel_h, KW = n->attr.kernel_w, C = (int)xv->shape[2];
    const int groups = n->attr.groups > 1 ? n->attr.groups : 1;
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
  return bias_problem;
}

/* The operator of the unit i [-> act] -> quant: NULL (reason set) when XNNPACK refuses it. */
static xnn_operator_t layer_op(qt_lowering *L, int i, int quant, int8_t lo, int8_t hi, const char **why) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  const qt_qstate *qo = g->nodes[quant].q;
  const qt_value_rep *in = &L->rep[n->inputs[0]];
  const qt_value *xv = &g->values[n->inputs[0]];
  const int is_conv = n->op == QT_OP_CONV2D, OC = n->attr.out_channels;
  const double s_x = in->scale[0], s_out = qo->scale[0];
  const int zp_x = in->zero_point[0], zp_out = qo->zero_point[0];
  int8_t *w8 = malloc((size_t)n->wq->n_qweight);
  int32_t *bias = malloc((size_t)OC * sizeof(int32_t));
  float *wscale = malloc((size_t)OC * sizeof(float));
  QT_ASSERT(w8 && bias && wscale, "out of memory");
  const char *bias_problem = layer_weights(L, i, w8, bias, wscale);
  const int KH = is_conv ? n->attr.kernel_h : 1, KW = is_conv ? n->attr.kernel_w : 1;
  const int C = is_conv ? (int)xv->shape[2] : (int)qt_value_numel(xv);
  const int groups = is_conv && n->attr.groups > 1 ? n->attr.groups : 1;
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
  *why = bias_problem;
  if (!bias_problem && st != xnn_status_success) {
    float rmax = 0;
    for (int c = 0; c < OC; c++) rmax = fmaxf(rmax, (float)(s_x * wscale[c] / s_out));
    snprintf(L->why, sizeof L->why, "%s refused it (%s; largest requantization scale s_x * s_w / s_out = %.4g)", api,
             qt_xnn_status_name(st), rmax);
    *why = L->why;
  }
  free(wscale);
  return *why ? NULL : op;
}

/* A qs8 operator created by `what`: NULL, or its refusal in L->why. */
static const char *created(qt_lowering *L, const char *what, enum xnn_status st) {
  if (st == xnn_status_success) return NULL;
  snprintf(L->why, sizeof L->why, "%s refused it (%s)", what, qt_xnn_status_name(st));
  return L->why;
}

/* The start of a one-input unit i [-> relu | relu6] -> q: its int8 input and its output
 * quantize (act, quant, qo), with the input's representation in *in; NULL, or the reason. */
static const char *unary_unit(qt_lowering *L, int i, int *act, int *quant, const qt_qstate **qo,
                              const qt_value_rep **in) {
  const qt_node *n = &L->g->nodes[i];
  const char *why = int8_input_problem(L, n->inputs[0]);
  if (!why) why = qt_match_output(L, i, act, quant);
  if (why) return why;
  *qo = L->g->nodes[*quant].q;
  *in = &L->rep[n->inputs[0]];
  return NULL;
}

/* Unit i [-> act] -> quant of n_in inputs lowered to step s: its output, and its partition with
 * `detail` and the fused activation. */
static void unit_lowered(qt_lowering *L, int i, int n_in, int act, int quant, const qt_step *s, const char *detail) {
  qt_unit_done(L, i, act, quant, s->out);
  char nodes[256];
  qt_unit_nodes(L, i, n_in, act, quant, nodes, sizeof nodes);
  qt_part_add(&L->p->parts, QT_PART_INT8, nodes, "%s%s", detail, act_text(L->g, act));
}

/* One-input unit i [-> act] -> quant on an image lowered to operator op of kind `kind`: its step
 * (the input's H and W set) and partition. */
static void image_unit_lowered(qt_lowering *L, int i, int kind, xnn_operator_t op, int act, int quant,
                               const char *detail) {
  const qt_node *n = &L->g->nodes[i];
  const qt_value *xv = &L->g->values[n->inputs[0]], *yv = &L->g->values[n->output];
  qt_step *s =
      qt_kernel_step(L->p, kind, op, L->rep[n->inputs[0]].slot, qt_value_numel(xv), (size_t)qt_value_numel(yv));
  s->H = (int)xv->shape[0], s->W = (int)xv->shape[1];
  unit_lowered(L, i, 1, act, quant, s, detail);
}

static const char *lower_layer(qt_lowering *L, int i) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  const int is_conv = n->op == QT_OP_CONV2D;
  const char *why;
  if ((why = layer_problem(L, i))) return why;
  int act, quant;
  if ((why = qt_match_output(L, i, &act, &quant))) return why;
  const qt_value *xv = &g->values[n->inputs[0]], *yv = &g->values[n->output];
  int8_t lo, hi;
  output_clamp(g, act, g->nodes[quant].q, &lo, &hi);
  xnn_operator_t op = layer_op(L, i, quant, lo, hi, &why);
  if (!op) return why;
  qt_step *s = qt_kernel_step(L->p, is_conv ? XK_CONV : XK_FC, op, L->rep[n->inputs[0]].slot, qt_value_numel(xv),
                              (size_t)qt_value_numel(yv));
  if (is_conv) s->H = (int)xv->shape[0], s->W = (int)xv->shape[1];
  qt_unit_done(L, i, act, quant, s->out);
  char nodes[256];
  qt_unit_nodes(L, i, 1, act, quant, nodes, sizeof nodes);
  const int OC = n->attr.out_channels, C = is_conv ? (int)xv->shape[2] : (int)qt_value_numel(xv);
  const int groups = is_conv && n->attr.groups > 1 ? n->attr.groups : 1;
  qt_part_add(&L->p->parts, QT_PART_INT8, nodes, "%s qs8 x %s -> qs8%s, out [%d, %d]",
              !is_conv                                    ? "fully connected"
              : groups == OC && groups > 1 && groups == C ? "depthwise conv"
              : groups > 1                                ? "grouped conv"
                                                          : "conv",
              is_conv ? "qc8 (per-channel)" : "qs8 (per-tensor)", act_text(g, act), lo, hi);
  return NULL;
}

/* dq(a) + dq(b) or dq(a) * dq(b) [-> relu] -> q, each input with its own qparams: add, b of a's
 * shape; mul, b of a's shape or a per-channel vector of an image (squeeze-excite), broadcast over
 * its pixels. */
static const char *lower_binary(qt_lowering *L, int i) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  const int mul = n->op == QT_OP_MUL;
  const char *why;
  for (int k = 0; k < 2; k++)
    if ((why = int8_input_problem(L, n->inputs[k]))) return why;
  int act, quant;
  if ((why = qt_match_output(L, i, &act, &quant))) return why;
  const qt_qstate *qo = g->nodes[quant].q;
  const qt_value_rep *a = &L->rep[n->inputs[0]], *b = &L->rep[n->inputs[1]];
  int8_t lo, hi;
  output_clamp(g, act, qo, &lo, &hi);
  xnn_operator_t op = NULL;
  const enum xnn_status st = (mul ? xnn_create_multiply_nd_qs8 : xnn_create_add_nd_qs8)(
      (int8_t)a->zero_point[0], a->scale[0], (int8_t)b->zero_point[0], b->scale[0], (int8_t)qo->zero_point[0],
      qo->scale[0], lo, hi, 0, &op);
  if (st != xnn_status_success) {
    snprintf(L->why, sizeof L->why, "%s refused it (%s; input / output scale ratios %.4g, %.4g)",
             mul ? "xnn_create_multiply_nd_qs8" : "xnn_create_add_nd_qs8", qt_xnn_status_name(st),
             a->scale[0] / qo->scale[0], b->scale[0] / qo->scale[0]);
    return L->why;
  }
  const int64_t numel = qt_value_numel(&g->values[n->inputs[0]]), bn = qt_value_numel(&g->values[n->inputs[1]]);
  qt_step *s = qt_kernel_step(L->p, mul ? XK_MUL : XK_ADD, op, a->slot, numel, (size_t)numel);
  s->in[1] = b->slot;
  s->W = (int)bn;           /* b's values per sample: C, or all of a's */
  s->H = (int)(numel / bn); /* the pixels b is applied at */
  qt_unit_done(L, i, act, quant, s->out);
  char nodes[256];
  qt_unit_nodes(L, i, 2, act, quant, nodes, sizeof nodes);
  qt_part_add(&L->p->parts, QT_PART_INT8, nodes, "%s qs8 %s qs8 -> qs8%s (own scales and zero points)",
              mul ? "multiply" : "add", mul ? "*" : "+", act_text(g, act));
  return NULL;
}

static const char *lower_global_avg_pool(qt_lowering *L, int i) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  int act, quant;
  const qt_qstate *qo;
  const qt_value_rep *in;
  const char *why = unary_unit(L, i, &act, &quant, &qo, &in);
  if (why) return why;
  const qt_value *xv = &g->values[n->inputs[0]];
  const int C = (int)xv->shape[2];
  int8_t lo, hi;
  output_clamp(g, act, qo, &lo, &hi);
  xnn_operator_t op = NULL;
  if ((why = created(L, "xnn_create_global_average_pooling_nwc_qs8",
                     xnn_create_global_average_pooling_nwc_qs8(
                         (size_t)C, (size_t)C, (size_t)C, (int8_t)in->zero_point[0], in->scale[0],
                         (int8_t)qo->zero_point[0], qo->scale[0], lo, hi, 0, &op))))
    return why;
  image_unit_lowered(L, i, XK_GAVG_POOL, op, act, quant, "global average pooling qs8 -> qs8");
  return NULL;
}

/* Max pooling and relu on int8 keep the input's qparams (max and relu commute with a monotone
 * dequantize; relu is the clamp at the zero point). */
static const char *lower_same_qparams(qt_lowering *L, int i) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  const char *why = int8_input_problem(L, n->inputs[0]);
  if (why) return why;
  const qt_value_rep *in = &L->rep[n->inputs[0]];
  const qt_value *xv = &g->values[n->inputs[0]], *yv = &g->values[n->output];
  const int pool = n->op == QT_OP_MAX_POOL2D;
  xnn_operator_t op = NULL;
  enum xnn_status st;
  const int C = (int)xv->shape[xv->ndim - 1];
  /* ceil mode: the last windows hang over the bottom and right, as extra padding there */
  const int64_t over_h =
                    pool ? (yv->shape[0] - 1) * n->attr.stride_h + n->attr.kernel_h - xv->shape[0] - 2 * n->attr.pad_h
                         : 0,
                over_w =
                    pool ? (yv->shape[1] - 1) * n->attr.stride_w + n->attr.kernel_w - xv->shape[1] - 2 * n->attr.pad_w
                         : 0;
  if (pool)
    st = xnn_create_max_pooling2d_nhwc_s8(
        (uint32_t)n->attr.pad_h, (uint32_t)(n->attr.pad_w + (over_w > 0 ? over_w : 0)),
        (uint32_t)(n->attr.pad_h + (over_h > 0 ? over_h : 0)), (uint32_t)n->attr.pad_w, (uint32_t)n->attr.kernel_h,
        (uint32_t)n->attr.kernel_w, (uint32_t)n->attr.stride_h, (uint32_t)n->attr.stride_w, 1, 1, (size_t)C, (size_t)C,
        (size_t)C, -128, 127, 0, &op);
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
  qt_step *s =
      qt_kernel_step(L->p, pool ? XK_MAX_POOL : XK_CLAMP, op, in->slot, qt_value_numel(xv), (size_t)qt_value_numel(yv));
  if (pool) s->H = (int)xv->shape[0], s->W = (int)xv->shape[1];
  qt_same_qparams(L, i, s->out);
  qt_part_add(&L->p->parts, QT_PART_INT8, n->name,
              pool ? "max pooling on int8 (same qparams)"
                   : "relu on int8: clamp at the "
                     "zero point (same qparams)");
  return NULL;
}

/* dq -> sigmoid | tanh | elu | leaky_relu [-> relu] -> q: XNNPACK's operator of that kind, per row
 * of C channels (sigmoid and tanh only with their fixed output qparams; leaky ReLU in qu8, on the
 * int8 data with the top bit flipped); the other kinds have none in this XNNPACK. */
static const char *lower_activation(qt_lowering *L, int i) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  const qt_act_kind kind = (qt_act_kind)n->attr.act;
  if (kind != QT_ACT_SIGMOID && kind != QT_ACT_TANH && kind != QT_ACT_ELU && kind != QT_ACT_LEAKY_RELU) {
    snprintf(L->why, sizeof L->why, "no qs8 or qu8 %s in this XNNPACK (sigmoid, tanh, elu and leaky ReLU only)",
             qt_act_name(kind));
    return L->why;
  }
  int act, quant;
  const qt_qstate *qo;
  const qt_value_rep *in;
  const char *why = unary_unit(L, i, &act, &quant, &qo, &in);
  if (why) return why;
  /* XNNPACK's qs8 sigmoid and tanh produce fixed qparams (TFLite's): scale 1/256, zero point -128
   * for [0, 1); scale 1/128, zero point 0 for [-1, 1) */
  const int sig = kind == QT_ACT_SIGMOID;
  if ((sig || kind == QT_ACT_TANH) &&
      (qo->scale[0] != (sig ? 0x1p-8f : 0x1p-7f) || qo->zero_point[0] != (sig ? -128 : 0))) {
    snprintf(L->why, sizeof L->why,
             "XNNPACK's qs8 %s takes only an output scale of 1/%d with zero point %d; this output has scale %g, zero "
             "point %d",
             qt_act_name(kind), sig ? 256 : 128, sig ? -128 : 0, qo->scale[0], qo->zero_point[0]);
    return L->why;
  }
  const qt_value *xv = &g->values[n->inputs[0]];
  const size_t C = (size_t)xv->shape[xv->ndim - 1];
  int8_t lo, hi;
  output_clamp(g, act, qo, &lo, &hi);
  const int8_t izp = (int8_t)in->zero_point[0], ozp = (int8_t)qo->zero_point[0];
  xnn_operator_t op = NULL;
  enum xnn_status st;
  xnn_kind xk;
  if (kind == QT_ACT_SIGMOID)
    st = xnn_create_sigmoid_nc_qs8(C, C, C, izp, in->scale[0], ozp, qo->scale[0], lo, hi, 0, &op), xk = XK_SIGMOID;
  else if (kind == QT_ACT_TANH)
    st = xnn_create_tanh_nc_qs8(C, C, C, izp, in->scale[0], ozp, qo->scale[0], lo, hi, 0, &op), xk = XK_TANH;
  else if (kind == QT_ACT_ELU)
    st = xnn_create_elu_nc_qs8(C, C, C, n->attr.alpha, izp, in->scale[0], ozp, qo->scale[0], lo, hi, 0, &op),
    xk = XK_ELU;
  else
    st = xnn_create_leaky_relu_nc_qu8(C, C, C, n->attr.alpha, (uint8_t)(izp + 128), in->scale[0], (uint8_t)(ozp + 128),
                                      qo->scale[0], (uint8_t)(lo + 128), (uint8_t)(hi + 128), 0, &op),
    xk = XK_LEAKY_RELU_U8;
  if ((why = created(L, xk == XK_LEAKY_RELU_U8 ? "XNNPACK's qu8 leaky ReLU" : "XNNPACK's qs8 activation operator", st)))
    return why;
  const int64_t numel = qt_value_numel(xv);
  qt_step *s = qt_kernel_step(L->p, xk, op, in->slot, numel, (size_t)numel);
  s->H = (int)(numel / (int64_t)C); /* rows per sample */
  char detail[96];
  snprintf(detail, sizeof detail, "%s %s", qt_act_name(kind),
           xk == XK_LEAKY_RELU_U8 ? "qu8 -> qu8 (int8 with the top bit flipped)" : "qs8 -> qs8");
  unit_lowered(L, i, 1, act, quant, s, detail);
  return NULL;
}

/* dq -> avg_pool2d [-> relu] -> q: XNNPACK's qu8 average pooling on the int8 data with the top
 * bit flipped. Its padding holds the zero point and every window divides by the pool's size:
 * PyTorch's count_include_pad, in floor mode (a ceil-mode window hanging over the input falls
 * back). */
static const char *lower_avg_pool(qt_lowering *L, int i) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  const qt_value *xv = &g->values[n->inputs[0]], *yv = &g->values[n->output];
  const qt_node_attrs *a = &n->attr;
  if (qt_pool_output_size(xv->shape[0], a->kernel_h, a->stride_h, a->pad_h, 0) != yv->shape[0] ||
      qt_pool_output_size(xv->shape[1], a->kernel_w, a->stride_w, a->pad_w, 0) != yv->shape[1])
    return "ceil mode adds a window past the input: XNNPACK's average pooling has floor mode only";
  int act, quant;
  const qt_qstate *qo;
  const qt_value_rep *in;
  const char *why = unary_unit(L, i, &act, &quant, &qo, &in);
  if (why) return why;
  const size_t C = (size_t)xv->shape[2];
  int8_t lo, hi;
  output_clamp(g, act, qo, &lo, &hi);
  xnn_operator_t op = NULL;
  const uint32_t ph = (uint32_t)a->pad_h, pw = (uint32_t)a->pad_w;
  if ((why = created(L, "xnn_create_average_pooling2d_nhwc_qu8",
                     xnn_create_average_pooling2d_nhwc_qu8(ph, pw, ph, pw, (uint32_t)a->kernel_h, (uint32_t)a->kernel_w,
                                                           (uint32_t)a->stride_h, (uint32_t)a->stride_w, C, C, C,
                                                           (uint8_t)(in->zero_point[0] + 128), in->scale[0],
                                                           (uint8_t)(qo->zero_point[0] + 128), qo->scale[0],
                                                           (uint8_t)(lo + 128), (uint8_t)(hi + 128), 0, &op))))
    return why;
  image_unit_lowered(L, i, XK_AVG_POOL_U8, op, act, quant,
                     "average pooling qu8 -> qu8 (int8 with the top bit flipped)");
  return NULL;
}

/* resize by 2 on int8, the input's qparams kept: nearest as our copy; bilinear by XNNPACK's s8
 * resize (half-pixel centers, PyTorch's align_corners=False), whose output quantize must hold the
 * input's qparams (the Quantizer ties them: resize_tied): it interpolates the integers and rounds
 * to them, where the Q/DQ graph interpolates the dequantized values and rounds half to even. */
static const char *lower_resize(qt_lowering *L, int i) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  if (n->attr.mode == QT_RESIZE_NEAREST) {
    const char *why = int8_input_problem(L, n->inputs[0]);
    if (why) return why;
    qt_resize_nearest_step(L, i, XK_RESIZE);
    qt_part_add(&L->p->parts, QT_PART_INT8, n->name, "resize (nearest, x2) on int8 (a copy, same qparams)");
    return NULL;
  }
  int act, quant;
  const qt_qstate *qo;
  const qt_value_rep *in;
  const char *why = unary_unit(L, i, &act, &quant, &qo, &in);
  if (why) return why;
  if (act >= 0 || qo->scale[0] != in->scale[0] || qo->zero_point[0] != in->zero_point[0] || qo->spec.qmin != in->qmin ||
      qo->spec.qmax != in->qmax) {
    snprintf(L->why, sizeof L->why,
             "bilinear resize: XNNPACK's s8 resize keeps the input's qparams (scale %g, zero point %d), and this "
             "output has its own (scale %g, zero point %d%s)",
             in->scale[0], in->zero_point[0], qo->scale[0], qo->zero_point[0], act >= 0 ? ", a relu after it" : "");
    return L->why;
  }
  const size_t C = (size_t)g->values[n->inputs[0]].shape[2];
  xnn_operator_t op = NULL;
  if ((why = created(L, "xnn_create_resize_bilinear2d_nhwc_s8", xnn_create_resize_bilinear2d_nhwc_s8(C, C, C, 0, &op))))
    return why;
  image_unit_lowered(L, i, XK_RESIZE_BILINEAR, op, act, quant, "resize (bilinear, x2) s8 -> s8 (the input's qparams)");
  return NULL;
}

/* channel_shuffle and channel_slice on int8: x8 copies, the input's qparams kept. */
static const char *lower_channels(qt_lowering *L, int i) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  const char *why = int8_input_problem(L, n->inputs[0]);
  if (why) return why;
  const qt_value_rep *in = &L->rep[n->inputs[0]];
  const qt_value *xv = &g->values[n->inputs[0]], *yv = &g->values[n->output];
  const size_t IC = (size_t)xv->shape[xv->ndim - 1], OC = (size_t)yv->shape[yv->ndim - 1];
  const int shuffle = n->op == QT_OP_CHANNEL_SHUFFLE;
  xnn_operator_t op = NULL;
  if (shuffle)
    why =
        created(L, "xnn_create_channel_shuffle_nc_x8",
                xnn_create_channel_shuffle_nc_x8((size_t)n->attr.groups, IC / (size_t)n->attr.groups, IC, IC, 0, &op));
  else
    why = created(L, "xnn_create_copy_nc_x8", xnn_create_copy_nc_x8(OC, IC, OC, 0, &op));
  if (why) return why;
  qt_step *s = qt_kernel_step(L->p, shuffle ? XK_SHUFFLE : XK_COPY, op, in->slot, qt_value_numel(xv),
                              (size_t)qt_value_numel(yv));
  if (shuffle)
    s->H = (int)(qt_value_numel(xv) / (int64_t)IC); /* rows per sample */
  else
    s->H = n->attr.begin, s->W = (int)IC;
  qt_same_qparams(L, i, s->out);
  qt_part_add(&L->p->parts, QT_PART_INT8, n->name, "%s on int8 (%s, same qparams)", qt_op_name(n->op),
              shuffle ? "channel shuffle x8" : "copy x8");
  return NULL;
}

/* concat of int8 inputs that share one set of qparams (the Quantizer ties them: concat_shared):
 * each input's rows copied into its channels, the qparams kept: exact. Inputs on different grids
 * would need a requantizing copy, which this XNNPACK lacks: the concat then falls back. */
static const char *lower_concat(qt_lowering *L, int i) {
  const qt_graph *g = L->g;
  const qt_node *n = &g->nodes[i];
  for (int k = 0; k < n->n_inputs; k++) {
    const char *why = int8_input_problem(L, n->inputs[k]);
    if (why) return why;
  }
  const int k = qt_off_grid_input(L, n);
  if (k >= 0) {
    const qt_value_rep *r0 = &L->rep[n->inputs[0]], *r = &L->rep[n->inputs[k]];
    snprintf(L->why, sizeof L->why,
             "inputs on different grids ('%s': scale %g, zero point %d; '%s': scale %g, zero point %d): this "
             "XNNPACK has no requantizing copy (the Quantizer ties a concat's inputs when it can)",
             g->values[n->inputs[0]].name, r0->scale[0], r0->zero_point[0], g->values[n->inputs[k]].name, r->scale[0],
             r->zero_point[0]);
    return L->why;
  }
  xnn_concat *c = qt_keep(L->p, sizeof *c);
  c->n = n->n_inputs;
  qt_concat_copy_step(L, i, XK_CONCAT, c->C, c->off, &c->Y)->aux = c;
  qt_part_add(&L->p->parts, QT_PART_INT8, n->name, "concat of %d int8 tensors (copies, same qparams)", n->n_inputs);
  return NULL;
}

/* The XNNPACK patterns starting at node i (qt_lowering_ops.lower_node). */
static const char *lower_node(qt_lowering *L, int i) {
  switch (L->g->nodes[i].op) {
    case QT_OP_CONV2D:
    case QT_OP_LINEAR: return lower_layer(L, i);
    case QT_OP_ADD:
    case QT_OP_MUL: return lower_binary(L, i);
    case QT_OP_ACTIVATION: return lower_activation(L, i);
    case QT_OP_CHANNEL_SHUFFLE:
    case QT_OP_CHANNEL_SLICE: return lower_channels(L, i);
    case QT_OP_CONCAT: return lower_concat(L, i);
    case QT_OP_GLOBAL_AVG_POOL: return lower_global_avg_pool(L, i);
    case QT_OP_MAX_POOL2D:
    case QT_OP_RELU: return lower_same_qparams(L, i);
    case QT_OP_AVG_POOL2D: return lower_avg_pool(L, i);
    case QT_OP_RESIZE: return lower_resize(L, i);
    default: return "XNNPACK has no operator for this op here";
  }
}

static const qt_lowering_ops xnnpack_ops = {"device xnnpack",     "deploy",  "int8", "int32", fits_int8,
                                            output_range_problem, lower_node};

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
  if (qt_lowering_check(g, &xnnpack_ops, err)) return NULL;
  char why[QT_ERR_LEN];
  if (qt_xnnpack_available(why)) {
    qt_err(err, "device xnnpack: %s", why);
    return NULL;
  }
  qt_xnnpack *m = calloc(1, sizeof *m);
  QT_ASSERT(m, "out of memory");
  qt_lowering_build(&m->prog, g, &xnnpack_ops);
  const int threads = omp_get_max_threads();
  m->pool = threads > 1 ? pthreadpool_create((size_t)threads) : NULL;
  m->fallback_threads = m->pool && omp_workers_spin() ? 1 : 0;
  return m;
}

void qt_xnnpack_free(qt_xnnpack *m) {
  if (!m) return;
  for (int i = 0; i < m->prog.n_steps; i++)
    if (m->prog.steps[i].op) xnn_delete_operator(m->prog.steps[i].op);
  if (m->pool) pthreadpool_destroy(m->pool);
  qt_program_free(&m->prog);
  free(m);
}

#endif
