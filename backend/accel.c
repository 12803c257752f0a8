/* A fictional accelerator as a second backend (backend.h): the partitioning of a Q/DQ graph
 * between it and the CPU, and a simulator that runs the result (its description, an INI file, is
 * read by desc.c).
 *
 * The accelerator computes on int8 tensors with power-of-two, zero-point-free qparams, so a
 * tensor is (integers q, exponent e) meaning q * 2^e. A layer multiplies int8 by int8 into an
 * int32 accumulator, adds the bias rounded to accumulator units (2^(e_in + e_w)), then
 * requantizes by an arithmetic shift of e_out - e_in - e_w with round-half-to-even, applies a
 * fused ReLU (or ReLU6: clamped at 6 / 2^e_out rounded half to even, which equals rounding the
 * clamped real value since rounding is monotone) and saturates to the output range. That is integer arithmetic
 * throughout; against the Q/DQ graph's fp32 semantics it differs only through the bias rounding (at most 1 LSB of the
 * layer's output, on values within half an accumulator unit of a rounding tie). Pooling, ReLU, flatten and add are
 * exact.
 *
 * Planning walks the graph in topological order and marks which values exist as accelerator
 * int8 tensors; a node runs on the accelerator when its op is listed, its records are
 * acceptable to the description and its inputs are such tensors; otherwise it runs in fp32 on
 * the CPU with the reason recorded. Values cross between the two by quantizing on the way in
 * and dequantizing on the way out (transfers). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/runtimes.h"
#include "base/base.h"
#include "config/config.h"

/* ---- growable strings and partitions ----------------------------------------------------- */

static const char *str_get(const qt_strbuf *b) { return b->s ? b->s : ""; }

typedef struct {
  qt_partition_kind kind;
  qt_strbuf nodes, detail;
} part;

typedef enum { PL_CPU, PL_ACCEL, PL_FUSED, PL_TRANSFER_IN } placement;

typedef struct {
  placement place;
  char reason[320]; /* CPU: why not the accelerator */
  int relu, quant;  /* accelerator layer / add: fused relu or relu6 (or -1) and quantize */
  int64_t relu_hi;  /* fused relu6: 6 in output units (else INT64_MAX) */
  /* accelerator layer: geometry, OHWI integer weights, bias in accumulator units */
  int H, W, C, OH, OW, OC, KH, KW, sh, sw, ph, pw, groups;
  int32_t *w, *bias;
  int shift;            /* layer: e_out - e_in - e_w; add: e_out - min(e_a, e_b) */
  int align_a, align_b; /* add: left shifts aligning the inputs */
  int qmin, qmax;       /* output range */
} node_plan;

struct qt_accel {
  const qt_graph *g;
  qt_backend_desc d;
  node_plan *plan; /* per node */
  int *pull;       /* per value: 1 = dequantized to the CPU for a CPU consumer */
  part *parts;
  int n_parts, cap_parts;
  qt_ctx *ctx;
};

static part *part_push(qt_accel *a, qt_partition_kind kind, int merge) {
  if (merge && a->n_parts && a->parts[a->n_parts - 1].kind == kind) return &a->parts[a->n_parts - 1];
  if (a->n_parts == a->cap_parts) {
    a->cap_parts = a->cap_parts ? 2 * a->cap_parts : 16;
    a->parts = realloc(a->parts, (size_t)a->cap_parts * sizeof *a->parts);
    QT_ASSERT(a->parts, "out of memory");
  }
  part *p = &a->parts[a->n_parts++];
  memset(p, 0, sizeof *p);
  p->kind = kind;
  return p;
}

static void part_node(part *p, const char *name) {
  qt_strbuf_printf(&p->nodes, "%s%s", p->nodes.len ? " -> " : "", name);
}

/* ---- planning ---------------------------------------------------------------------------- */

/* scale = 2^e exactly */
static int exponent(float s) {
  int e;
  QT_ASSERT(frexpf(s, &e) == 0.5f, "scale %g is not a power of two", s);
  return e - 1;
}

/* What the description requires of a record, and what the simulated device needs whatever the
 * description says: one power-of-two scale, zero point 0 (its requantizer only shifts). */
static const char *record_problem(const qt_backend_desc *d, const qt_qstate *q, int is_weight, char *why, size_t n) {
  if (qt_backend_record_problem(d, q, is_weight, why, n)) return why;
  int e;
  if (q->channels != 1 || q->zero_point[0] != 0 || frexpf(q->scale[0], &e) != 0.5f) {
    snprintf(why, n,
             "the simulated device needs one power-of-two scale and zero point 0 (found %d channel%s, scale "
             "%.9g, zero point %d)",
             q->channels, q->channels == 1 ? "" : "s", q->scale[0], q->zero_point[0]);
    return why;
  }
  return NULL;
}

typedef struct {
  qt_accel *a;
  int *acc;              /* per value: an accelerator int8 tensor */
  const qt_qstate **rec; /* per value on the accelerator: its qparams */
  int *listed;           /* per node: a dequantize view already named in a partition */
} planner;

/* The output side of an accelerator kernel: out -> [relu | relu6] -> quantize with an acceptable
 * record. Returns NULL and fills relu / quant, or the reason. */
static const char *match_output(planner *P, int i, int *relu, int *quant, char *why, size_t n) {
  const qt_graph *g = P->a->g;
  const qt_backend_desc *d = &P->a->d;
  int v = g->nodes[i].output, c = qt_graph_sole_consumer(g, v);
  *relu = -1;
  if (c >= 0 && (g->nodes[c].op == QT_OP_RELU || g->nodes[c].op == QT_OP_RELU6)) {
    if (!d->ops[g->nodes[c].op]) {
      snprintf(why, n, "the %s after it is not in %s's op list (nothing requantizes the output on the device)",
               qt_op_name(g->nodes[c].op), d->name);
      return why;
    }
    *relu = c;
    v = g->nodes[c].output;
    c = qt_graph_sole_consumer(g, v);
  }
  if (c < 0 || g->nodes[c].op != QT_OP_QUANTIZE) {
    snprintf(why, n, "its output is not requantized (no quantize after it): the accelerator produces int8 only");
    return why;
  }
  char rw[320];
  if (record_problem(d, g->nodes[c].q, 0, rw, sizeof rw)) {
    snprintf(why, n, "output %s: %s", g->nodes[c].name, rw);
    return why;
  }
  *quant = c;
  return NULL;
}

static const char *input_problem(planner *P, int v, char *why, size_t n) {
  if (P->acc[v]) return NULL;
  snprintf(why, n, "input '%s' is not an accelerator int8 tensor (it is computed on the CPU)", P->a->g->values[v].name);
  return why;
}

/* A fused relu6's upper bound in output units (scale 2^e): 6 / 2^e, exact in double, rounded
 * half to even; INT64_MAX for a relu or none. */
static int64_t relu6_bound(const qt_graph *g, int relu, int e) {
  if (relu < 0 || g->nodes[relu].op != QT_OP_RELU6) return INT64_MAX;
  return (int64_t)nearbyint(ldexp(6.0, -e));
}

/* dq -> conv2d | linear [-> relu | relu6] -> q */
static const char *plan_layer(planner *P, int i, char *why, size_t wn) {
  qt_accel *a = P->a;
  const qt_graph *g = a->g;
  const qt_backend_desc *d = &a->d;
  const qt_node *n = &g->nodes[i];
  node_plan *p = &a->plan[i];
  const int is_conv = n->op == QT_OP_CONV2D;
  const char *unit = is_conv ? "output channels" : "output features";
  const int too_wide = d->max_channels > 0 && n->attr.out_channels > d->max_channels;
  if (!d->ops[n->op]) {
    snprintf(why, wn, "op %s is not in %s's op list", qt_op_name(n->op), d->name);
    return why;
  }
  if (!n->wq) {
    if (too_wide)
      snprintf(why, wn, "fp32 layer (weights not quantized): %d %s > max_channels %d", n->attr.out_channels, unit,
               d->max_channels);
    else
      snprintf(why, wn, "fp32 layer (weights not quantized)");
    return why;
  }
  if (too_wide) {
    snprintf(why, wn, "%d %s > max_channels %d", n->attr.out_channels, unit, d->max_channels);
    return why;
  }
  char rw[320];
  if (record_problem(d, n->wq, 1, rw, sizeof rw)) {
    snprintf(why, wn, "weights: %s", rw);
    return why;
  }
  if (input_problem(P, n->inputs[0], why, wn)) return why;
  int relu, quant;
  if (match_output(P, i, &relu, &quant, why, wn)) return why;
  const qt_value *xv = &g->values[n->inputs[0]], *yv = &g->values[n->output];
  const qt_qstate *in = P->rec[n->inputs[0]], *wq = n->wq, *out = g->nodes[quant].q;
  const int e_in = exponent(in->scale[0]), e_w = exponent(wq->scale[0]), e_out = exponent(out->scale[0]);
  p->shift = e_out - e_in - e_w;
  if (p->shift < -30 || p->shift > 30) {
    snprintf(why, wn, "requantization shift %d outside the shifter's [-30, 30]", p->shift);
    return why;
  }
  if (is_conv) {
    p->H = (int)xv->shape[0], p->W = (int)xv->shape[1], p->C = (int)xv->shape[2];
    p->OH = (int)yv->shape[0], p->OW = (int)yv->shape[1];
    p->KH = n->attr.kernel_h, p->KW = n->attr.kernel_w, p->sh = n->attr.stride_h, p->sw = n->attr.stride_w;
    p->ph = n->attr.pad_h, p->pw = n->attr.pad_w, p->groups = n->attr.groups;
  } else { /* a 1x1 convolution of a 1x1 image */
    p->H = p->W = p->OH = p->OW = p->KH = p->KW = p->sh = p->sw = p->groups = 1;
    p->C = (int)qt_value_numel(xv);
  }
  p->OC = n->attr.out_channels;
  const int Cg = p->C / p->groups, K = Cg * p->KH * p->KW;
  /* OIHW -> OHWI so the reduction runs over contiguous channels in both operands */
  p->w = malloc((size_t)p->OC * (size_t)K * sizeof(int32_t));
  p->bias = malloc((size_t)p->OC * sizeof(int32_t));
  QT_ASSERT(p->w && p->bias, "out of memory");
  int64_t w_max = 0;
  for (int o = 0; o < p->OC; o++)
    for (int c = 0; c < Cg; c++)
      for (int kh = 0; kh < p->KH; kh++)
        for (int kw = 0; kw < p->KW; kw++) {
          const int32_t w = wq->qweight[((int64_t)(o * Cg + c) * p->KH + kh) * p->KW + kw];
          p->w[((int64_t)(o * p->KH + kh) * p->KW + kw) * Cg + c] = w;
          if (llabs(w) > w_max) w_max = llabs(w);
        }
  const float *b = n->param[QT_P_BIAS] >= 0 ? g->params + g->tensors[n->param[QT_P_BIAS]].offset : NULL;
  const int64_t a_max = in->spec.qmax > -in->spec.qmin ? in->spec.qmax : -in->spec.qmin;
  for (int o = 0; o < p->OC; o++) {
    /* an int32 bias (2^(e_in + e_w) is its scale) as it is; a float one: exact scaling, one rounding */
    const double bias = wq->qbias ? (double)wq->qbias[o] : b ? nearbyint(ldexp((double)b[o], -(e_in + e_w))) : 0.0;
    if (fabs(bias) + (double)K * (double)a_max * (double)w_max > 2147483647.0) {
      snprintf(why, wn,
               "the int32 accumulator could overflow (channel %d: bias %.0f accumulator units, %d products "
               "up to %lld)",
               o, bias, K, (long long)(a_max * w_max));
      return why;
    }
    p->bias[o] = (int32_t)bias;
  }
  p->relu = relu;
  p->relu_hi = relu6_bound(g, relu, e_out);
  p->quant = quant;
  p->qmin = out->spec.qmin;
  p->qmax = out->spec.qmax;
  return NULL;
}

/* dq(a) + dq(b) [-> relu] -> q */
static const char *plan_add(planner *P, int i, char *why, size_t wn) {
  qt_accel *a = P->a;
  const qt_graph *g = a->g;
  const qt_node *n = &g->nodes[i];
  node_plan *p = &a->plan[i];
  if (!a->d.ops[QT_OP_ADD]) {
    snprintf(why, wn, "op add is not in %s's op list", a->d.name);
    return why;
  }
  if (input_problem(P, n->inputs[0], why, wn) || input_problem(P, n->inputs[1], why, wn)) return why;
  int relu, quant;
  if (match_output(P, i, &relu, &quant, why, wn)) return why;
  const int ea = exponent(P->rec[n->inputs[0]]->scale[0]), eb = exponent(P->rec[n->inputs[1]]->scale[0]);
  const int eo = exponent(g->nodes[quant].q->scale[0]), m = ea < eb ? ea : eb;
  if (abs(ea - eb) > 15 || eo - m > 30 || eo - m < -15) {
    snprintf(why, wn, "scales 2^%d + 2^%d -> 2^%d need shifts beyond the aligner's 15 bits", ea, eb, eo);
    return why;
  }
  p->align_a = ea - m;
  p->align_b = eb - m;
  p->shift = eo - m;
  p->relu = relu;
  p->relu_hi = relu6_bound(g, relu, eo);
  p->quant = quant;
  p->qmin = g->nodes[quant].q->spec.qmin;
  p->qmax = g->nodes[quant].q->spec.qmax;
  return NULL;
}

static void kernel_desc(qt_accel *a, part *pt, int i) {
  const qt_graph *g = a->g;
  const qt_node *n = &g->nodes[i];
  const node_plan *p = &a->plan[i];
  qt_strbuf *s = &pt->detail;
  if (s->len) qt_strbuf_printf(s, "\n");
  if (n->op == QT_OP_CONV2D || n->op == QT_OP_LINEAR || n->op == QT_OP_ADD)
    qt_strbuf_printf(s, "%s %s%s%s (shift %d)", n->name, qt_op_name(n->op), p->relu >= 0 ? "+" : "",
                     p->relu >= 0 ? qt_op_name(g->nodes[p->relu].op) : "", p->shift);
  else
    qt_strbuf_printf(s, "%s %s", n->name, qt_op_name(n->op));
}

/* Dequantizes value v to the CPU (once), listed as a transfer. */
static void plan_pull(planner *P, int v) {
  qt_accel *a = P->a;
  if (!P->acc[v] || a->pull[v]) return;
  a->pull[v] = 1;
  P->listed[a->g->values[v].producer] = 1;
  part *pt = part_push(a, QT_PART_BOUNDARY, 0);
  part_node(pt, a->g->values[v].name);
  qt_strbuf_printf(&pt->detail, "to the CPU: dequantize s%d 2^%d -> fp32", P->rec[v]->spec.bits,
                   exponent(P->rec[v]->scale[0]));
}

static void plan_cpu(planner *P, int i, const char *reason) {
  qt_accel *a = P->a;
  const qt_node *n = &a->g->nodes[i];
  for (int k = 0; k < n->n_inputs; k++) plan_pull(P, n->inputs[k]);
  node_plan *p = &a->plan[i];
  p->place = PL_CPU;
  snprintf(p->reason, sizeof p->reason, "%s", reason);
  part *pt = part_push(a, QT_PART_FALLBACK, 1);
  part_node(pt, n->name);
  qt_strbuf_printf(&pt->detail, "%s%s: %s", pt->detail.len ? "\n" : "", n->name, reason);
}

/* A dequantize on the accelerator is a view, listed in the partition of its first device
 * consumer (a CPU consumer lists it as a transfer instead). */
static void plan_accel(planner *P, int i, int out_value, const qt_qstate *rec) {
  qt_accel *a = P->a;
  const qt_node *n = &a->g->nodes[i];
  a->plan[i].place = PL_ACCEL;
  P->acc[out_value] = 1;
  P->rec[out_value] = rec;
  if (n->op == QT_OP_DEQUANTIZE) return;
  part *pt = part_push(a, QT_PART_INT8, 1);
  for (int k = 0; k < n->n_inputs; k++) {
    const int src = a->g->values[n->inputs[k]].producer;
    if (a->g->nodes[src].op == QT_OP_DEQUANTIZE && !P->listed[src]) {
      P->listed[src] = 1;
      part_node(pt, a->g->nodes[src].name);
    }
  }
  part_node(pt, n->name);
  kernel_desc(a, pt, i);
}

/* The relu / quantize of a kernel headed by an earlier node: part of its partition. */
static void plan_fused(planner *P, int node) {
  qt_accel *a = P->a;
  a->plan[node].place = PL_FUSED;
  part_node(part_push(a, QT_PART_INT8, 1), a->g->nodes[node].name);
}

qt_accel *qt_accel_partition(const qt_graph *g, const qt_backend_desc *d, char *err) {
  if (!g->finalized) {
    snprintf(err, QT_ERR_LEN, "accelerator %s: graph %s is not finalized", d->name, g->name);
    return NULL;
  }
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    if (n->op == QT_OP_FAKE_QUANT || n->op == QT_OP_CONV_BN || (n->wq && !n->wq->qweight)) {
      snprintf(err, QT_ERR_LEN,
               "accelerator %s: graph %s: node %d '%s' (%s) belongs to a prepared (training) graph; partition the "
               "Q/DQ graph from qt_convert (model_qdq.h5)",
               d->name, g->name, i, n->name, qt_op_name(n->op));
      return NULL;
    }
  }
  if (g->nodes[g->values[g->output].producer].op == QT_OP_QUANTIZE) {
    snprintf(err, QT_ERR_LEN,
             "accelerator %s: graph %s: the output '%s' is integers (a quantize); the runtime returns "
             "fp32",
             d->name, g->name, g->values[g->output].name);
    return NULL;
  }
  qt_accel *a = calloc(1, sizeof *a);
  QT_ASSERT(a, "out of memory");
  a->g = g;
  a->d = *d;
  a->plan = calloc((size_t)g->n_nodes, sizeof *a->plan);
  a->pull = calloc((size_t)g->n_values, sizeof *a->pull);
  planner P = {a, calloc((size_t)g->n_values, sizeof(int)), calloc((size_t)g->n_values, sizeof(qt_qstate *)),
               calloc((size_t)g->n_nodes, sizeof(int))};
  QT_ASSERT(a->plan && a->pull && P.acc && P.rec && P.listed, "out of memory");
  for (int i = 0; i < g->n_nodes; i++) a->plan[i].relu = a->plan[i].quant = -1;
  char why[320], rw[320];
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    if (a->plan[i].place == PL_FUSED) {
      plan_fused(&P, i);
      continue;
    }
    switch (n->op) {
      case QT_OP_INPUT: plan_cpu(&P, i, "the graph input (host memory)"); break;
      case QT_OP_QUANTIZE:
        if (record_problem(d, n->q, 0, rw, sizeof rw)) {
          snprintf(why, sizeof why, "quantize on the CPU: %s", rw);
          plan_cpu(&P, i, why);
        } else {
          a->plan[i].place = PL_TRANSFER_IN;
          part *pt = part_push(a, QT_PART_BOUNDARY, 0);
          part_node(pt, n->name);
          qt_strbuf_printf(&pt->detail, "to the accelerator: quantize fp32 -> s%d 2^%d on the CPU", n->q->spec.bits,
                           exponent(n->q->scale[0]));
          P.acc[n->output] = 1;
          P.rec[n->output] = n->q;
        }
        break;
      case QT_OP_DEQUANTIZE:
        /* a view: the integers with this record's qparams */
        if (!P.acc[n->inputs[0]]) {
          plan_cpu(&P, i, "dequantize of integers quantized on the CPU");
        } else if (record_problem(d, n->q, 0, rw, sizeof rw)) {
          snprintf(why, sizeof why, "dequantize on the CPU: %s", rw);
          plan_cpu(&P, i, why);
        } else {
          plan_accel(&P, i, n->output, n->q);
        }
        break;
      case QT_OP_CONV2D:
      case QT_OP_LINEAR:
      case QT_OP_ADD: {
        const char *r = n->op == QT_OP_ADD ? plan_add(&P, i, why, sizeof why) : plan_layer(&P, i, why, sizeof why);
        if (r) {
          plan_cpu(&P, i, r);
          break;
        }
        const node_plan *p = &a->plan[i];
        plan_accel(&P, i, g->nodes[p->quant].output, g->nodes[p->quant].q);
        P.acc[n->output] = 0; /* the fp32 result never exists on the device */
        if (p->relu >= 0) a->plan[p->relu].place = PL_FUSED;
        a->plan[p->quant].place = PL_FUSED;
        break;
      }
      case QT_OP_RELU:
      case QT_OP_MAX_POOL2D:
      case QT_OP_FLATTEN:
        if (!d->ops[n->op]) {
          snprintf(why, sizeof why, "op %s is not in %s's op list", qt_op_name(n->op), d->name);
          plan_cpu(&P, i, why);
        } else if (input_problem(&P, n->inputs[0], why, sizeof why)) {
          plan_cpu(&P, i, why);
        } else {
          plan_accel(&P, i, n->output, P.rec[n->inputs[0]]);
        }
        break;
      default:
        if (d->ops[n->op])
          snprintf(why, sizeof why, "op %s is listed but the simulator has no kernel for it", qt_op_name(n->op));
        else
          snprintf(why, sizeof why, "op %s is not in %s's op list", qt_op_name(n->op), d->name);
        plan_cpu(&P, i, why);
        break;
    }
  }
  plan_pull(&P, g->output);
  QT_FREE_ALL(P.acc, P.rec, P.listed);
  a->ctx = qt_ctx_create();
  qt_ctx_set_grad(a->ctx, 0);
  return a;
}

void qt_accel_free(qt_accel *a) {
  if (!a) return;
  for (int i = 0; i < a->g->n_nodes; i++) {
    free(a->plan[i].w);
    free(a->plan[i].bias);
  }
  for (int i = 0; i < a->n_parts; i++) {
    free(a->parts[i].nodes.s);
    free(a->parts[i].detail.s);
  }
  QT_FREE_ALL(a->parts, a->plan, a->pull);
  qt_ctx_free(a->ctx);
  free(a);
}

/* ---- integer kernels (the device) -------------------------------------------------------- */

/* v / 2^s rounded half to even (s > 0), or v * 2^-s: the requantization shifter. */
static inline int64_t shift_round(int64_t v, int s) {
  if (s <= 0) return v * ((int64_t)1 << -s);
  const int64_t q = v >> s; /* floor */
  const int64_t r = v - q * ((int64_t)1 << s), half = (int64_t)1 << (s - 1);
  return q + (r > half || (r == half && (q & 1)));
}

static inline int32_t saturate(int64_t v, int relu, int64_t relu_hi, int qmin, int qmax) {
  if (relu && v < 0) v = 0;
  if (v > relu_hi) v = relu_hi;
  return (int32_t)(v < qmin ? qmin : v > qmax ? qmax : v);
}

/* y (N, OH, OW, OC) from x (N, H, W, C): int8 x int8 -> int32, + bias, shift, relu(6), saturate. */
static void device_layer(int32_t *y, const int32_t *x, const node_plan *p, int N) {
  const int Cg = p->C / p->groups, OCg = p->OC / p->groups, relu = p->relu >= 0;
#pragma omp parallel for collapse(2) schedule(static)
  for (int n = 0; n < N; n++)
    for (int oh = 0; oh < p->OH; oh++)
      for (int ow = 0; ow < p->OW; ow++) {
        int32_t *out = y + (((int64_t)n * p->OH + oh) * p->OW + ow) * p->OC;
        for (int o = 0; o < p->OC; o++) {
          const int c0 = (o / OCg) * Cg;
          int32_t acc = 0;
          for (int kh = 0; kh < p->KH; kh++) {
            const int ih = oh * p->sh - p->ph + kh;
            if (ih < 0 || ih >= p->H) continue;
            for (int kw = 0; kw < p->KW; kw++) {
              const int iw = ow * p->sw - p->pw + kw;
              if (iw < 0 || iw >= p->W) continue;
              const int32_t *xp = x + (((int64_t)n * p->H + ih) * p->W + iw) * p->C + c0;
              const int32_t *wp = p->w + (((int64_t)o * p->KH + kh) * p->KW + kw) * Cg;
              for (int c = 0; c < Cg; c++) acc += xp[c] * wp[c];
            }
          }
          out[o] = saturate(shift_round((int64_t)acc + p->bias[o], p->shift), relu, p->relu_hi, p->qmin, p->qmax);
        }
      }
}

static void device_add(int32_t *y, const int32_t *x0, const int32_t *x1, const node_plan *p, int64_t n) {
  const int relu = p->relu >= 0;
#pragma omp parallel for schedule(static) if (n >= 65536)
  for (int64_t i = 0; i < n; i++) {
    const int64_t v = (int64_t)x0[i] * ((int64_t)1 << p->align_a) + (int64_t)x1[i] * ((int64_t)1 << p->align_b);
    y[i] = saturate(shift_round(v, p->shift), relu, p->relu_hi, p->qmin, p->qmax);
  }
}

static void device_max_pool(int32_t *y, const int32_t *x, const qt_value *xv, const qt_value *yv,
                            const qt_node_attrs *at, int N) {
  const int H = (int)xv->shape[0], W = (int)xv->shape[1], C = (int)xv->shape[2];
  const int OH = (int)yv->shape[0], OW = (int)yv->shape[1], K = at->kernel_h, S = at->stride_h, P = at->pad_h;
#pragma omp parallel for collapse(2) schedule(static)
  for (int n = 0; n < N; n++)
    for (int oh = 0; oh < OH; oh++)
      for (int ow = 0; ow < OW; ow++)
        for (int c = 0; c < C; c++) {
          int32_t m = INT32_MIN;
          for (int kh = 0; kh < K; kh++) {
            const int ih = oh * S - P + kh;
            if (ih < 0 || ih >= H) continue;
            for (int kw = 0; kw < K; kw++) {
              const int iw = ow * S - P + kw;
              if (iw < 0 || iw >= W) continue;
              const int32_t v = x[(((int64_t)n * H + ih) * W + iw) * C + c];
              if (v > m) m = v;
            }
          }
          y[(((int64_t)n * OH + oh) * OW + ow) * C + c] = m;
        }
}

/* ---- the runtime ------------------------------------------------------------------------- */

typedef struct {
  float *f;             /* fp32 form (CPU), or NULL until needed */
  int32_t *q;           /* integers, or NULL for fp32 values */
  const qt_qstate *rec; /* qparams of q */
} rt_value;

static qt_tensor *wrap(qt_ctx *ctx, void *data, int N, const qt_value *v) {
  int64_t s[4] = {N, 0, 0, 0};
  for (int d = 0; d < v->ndim; d++) s[d + 1] = v->shape[d];
  return qt_tensor_wrap(ctx, QT_F32, v->ndim + 1, s, data);
}

static float *fp32_of(qt_accel *a, rt_value *rt, int v, int N) {
  rt_value *r = &rt[v];
  if (r->f) return r->f;
  QT_ASSERT(r->q && r->rec, "value %s has no representation", a->g->values[v].name);
  const int64_t numel = qt_value_numel(&a->g->values[v]) * N;
  r->f = qt_arena_alloc(a->ctx, (size_t)numel * sizeof(float));
  qt_dequantize(r->f, r->q, numel / r->rec->channels, r->rec->channels, 1, r->rec->scale, r->rec->zero_point);
  return r->f;
}

/* One node of the Q/DQ graph in fp32, as the reference interpreter computes it. */
static void run_cpu(qt_accel *a, rt_value *rt, int i, const float *input, int N) {
  const qt_graph *g = a->g;
  const qt_node *n = &g->nodes[i];
  qt_ctx *ctx = a->ctx;
  rt_value *out = &rt[n->output];
  if (n->op == QT_OP_INPUT) {
    out->f = (float *)input;
    return;
  }
  if (n->op == QT_OP_DEQUANTIZE) {
    out->q = rt[n->inputs[0]].q;
    out->rec = n->q;
    return;
  }
  qt_tensor *x = wrap(ctx, fp32_of(a, rt, n->inputs[0], N), N, &g->values[n->inputs[0]]);
  if (n->op == QT_OP_QUANTIZE) {
    const int64_t numel = qt_tensor_numel(x);
    out->q = qt_arena_alloc(ctx, (size_t)numel * sizeof(int32_t));
    out->rec = n->q;
    qt_quantize(out->q, qt_f32(x), numel / n->q->channels, n->q->channels, 1, n->q->scale, n->q->zero_point,
                n->q->spec.qmin, n->q->spec.qmax);
    return;
  }
  /* the executor's own node forward (nn.h); the graph is a finalized Q/DQ graph in eval mode,
   * which the forward reads and never changes */
  qt_tensor *ins[QT_MAX_INPUTS] = {x, NULL};
  for (int k = 1; k < n->n_inputs; k++)
    ins[k] = wrap(ctx, fp32_of(a, rt, n->inputs[k], N), N, &g->values[n->inputs[k]]);
  char err[QT_ERR_LEN];
  qt_tensor *y = qt_node_forward((qt_graph *)g, ctx, i, ins, 0, err);
  QT_ASSERT(y, "accelerator runtime: node %s (%s): %s", n->name, qt_op_name(n->op), err);
  out->f = qt_f32(y);
}

static void run_accel(qt_accel *a, rt_value *rt, int i, int N) {
  const qt_graph *g = a->g;
  const qt_node *n = &g->nodes[i];
  const node_plan *p = &a->plan[i];
  qt_ctx *ctx = a->ctx;
  rt_value *in = &rt[n->inputs[0]];
  QT_ASSERT(n->op == QT_OP_DEQUANTIZE || in->q, "accelerator node %s reads no integers", n->name);
  switch (n->op) {
    case QT_OP_DEQUANTIZE: /* a view with this record's qparams */
      rt[n->output].q = in->q;
      rt[n->output].rec = n->q;
      return;
    case QT_OP_CONV2D:
    case QT_OP_LINEAR:
    case QT_OP_ADD: {
      rt_value *out = &rt[g->nodes[p->quant].output];
      const int64_t numel = qt_value_numel(&g->values[n->output]) * N;
      out->q = qt_arena_alloc(ctx, (size_t)numel * sizeof(int32_t));
      out->rec = g->nodes[p->quant].q;
      if (n->op == QT_OP_ADD)
        device_add(out->q, in->q, rt[n->inputs[1]].q, p, numel);
      else
        device_layer(out->q, in->q, p, N);
      return;
    }
    case QT_OP_RELU: {
      const int64_t numel = qt_value_numel(&g->values[n->output]) * N;
      int32_t *y = qt_arena_alloc(ctx, (size_t)numel * sizeof(int32_t));
      for (int64_t k = 0; k < numel; k++) y[k] = in->q[k] > 0 ? in->q[k] : 0; /* zero point 0 */
      rt[n->output].q = y;
      break;
    }
    case QT_OP_MAX_POOL2D: {
      int32_t *y = qt_arena_alloc(ctx, (size_t)(qt_value_numel(&g->values[n->output]) * N) * sizeof(int32_t));
      device_max_pool(y, in->q, &g->values[n->inputs[0]], &g->values[n->output], &n->attr, N);
      rt[n->output].q = y;
      break;
    }
    case QT_OP_FLATTEN: /* NHWC flatten: the same buffer */ rt[n->output].q = in->q; break;
    default: QT_ASSERT(0, "accelerator node %s (%s) has no device kernel", n->name, qt_op_name(n->op));
  }
  rt[n->output].rec = in->rec;
}

int qt_accel_run(qt_accel *a, float *out, const float *input, int n, char *err) {
  if (n <= 0) {
    snprintf(err, QT_ERR_LEN, "run %s on %s: batch of %d images", a->g->name, a->d.name, n);
    return -1;
  }
  const qt_graph *g = a->g;
  qt_ctx_reset(a->ctx);
  rt_value *rt = qt_arena_calloc(a->ctx, (size_t)g->n_values * sizeof *rt);
  for (int i = 0; i < g->n_nodes; i++) {
    switch (a->plan[i].place) {
      case PL_FUSED: break;
      case PL_ACCEL: run_accel(a, rt, i, n); break;
      case PL_CPU:
      case PL_TRANSFER_IN: run_cpu(a, rt, i, input, n); break;
    }
  }
  memcpy(out, fp32_of(a, rt, g->output, n), (size_t)(qt_value_numel(&g->values[g->output]) * n) * sizeof(float));
  return 0;
}

int64_t qt_accel_output_numel(const qt_accel *a) { return qt_value_numel(&a->g->values[a->g->output]); }

int qt_accel_partition_count(const qt_accel *a) { return a->n_parts; }

qt_partition_kind qt_accel_partition_get(const qt_accel *a, int i, const char **nodes, const char **detail) {
  QT_ASSERT(i >= 0 && i < a->n_parts, "partition %d of %d", i, a->n_parts);
  if (nodes) *nodes = str_get(&a->parts[i].nodes);
  if (detail) *detail = str_get(&a->parts[i].detail);
  return a->parts[i].kind;
}

int qt_accel_count(const qt_accel *a, qt_partition_kind k) {
  int c = 0;
  for (int i = 0; i < a->n_parts; i++) c += a->parts[i].kind == k;
  return c;
}

int qt_accel_node_on_accel(const qt_accel *a, const char *name, const char **reason) {
  const int i = qt_graph_find_node(a->g, name);
  if (i < 0) return -1;
  const node_plan *p = &a->plan[i];
  if (reason) *reason = p->place == PL_CPU ? p->reason : "";
  return p->place == PL_ACCEL || p->place == PL_FUSED;
}

void qt_accel_report(const qt_accel *a, FILE *f) {
  static const char *const names[] = {"accel", "cpu", "transfer"};
  _Static_assert(sizeof names / sizeof names[0] == QT_PART_COUNT, "partition names out of sync");
  int on = 0, total = 0;
  for (int i = 0; i < a->g->n_nodes; i++) {
    if (a->g->nodes[i].op == QT_OP_INPUT) continue;
    total++;
    on += a->plan[i].place == PL_ACCEL || a->plan[i].place == PL_FUSED;
  }
  fprintf(f, "partitions of %s on %s: %d accelerator, %d cpu, %d transfers; %d of %d nodes on the accelerator\n",
          a->g->name, a->d.name, qt_accel_count(a, QT_PART_INT8), qt_accel_count(a, QT_PART_FALLBACK),
          qt_accel_count(a, QT_PART_BOUNDARY), on, total);
  for (int i = 0; i < a->n_parts; i++) {
    fprintf(f, "  %2d %-8s %s\n", i, names[a->parts[i].kind], str_get(&a->parts[i].nodes));
    for (const char *line = str_get(&a->parts[i].detail); *line;) {
      const char *end = strchr(line, '\n');
      const int len = end ? (int)(end - line) : (int)strlen(line);
      fprintf(f, "%14s%.*s\n", "", len, line);
      line += len + (end != NULL);
    }
  }
}
