/* The consistency check: the eval-mode training graph and the convert graph compute the same
 * quantized function. Structural (every fake quant has exactly one Q/DQ pair at the same
 * place with identical qparams; the weight convert quantized is the weight training
 * fake-quantized; every integer lies in the range training used) and numerical (both graphs
 * on one batch: every Q/DQ output equal to its fake quant's, to the LSB, except where a
 * value sits within 0.01 LSB of a rounding tie and the two graphs' float rounding differs).
 * Numbers are compared segment by segment: the convert graph runs teacher-forced, each
 * dequantize output replaced by the training graph's fake-quant output, so a legitimate tie
 * flip upstream cannot masquerade as a mismatch downstream. */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "qat/qat.h"
#include "base/base.h"

static void fail(qt_check_report *r, const char *fmt, ...) {
  r->ok = 0;
  size_t len = strlen(r->reason);
  if (len + 200 >= sizeof r->reason) return; /* first failures only */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->reason + len, sizeof r->reason - len - 1, fmt, ap);
  va_end(ap);
  strcat(r->reason, "\n");
}

static int find_node(const qt_graph *g, const char *name, const char *suffix) {
  char full[QT_NAME_LEN + 32];
  snprintf(full, sizeof full, "%s%s", name, suffix);
  return qt_graph_find_node(g, full);
}

static const char *producer_name(const qt_graph *g, int value) { return g->nodes[g->values[value].producer].name; }

static int same_qparams(qt_check_report *r, const char *what, const qt_qstate *a, const qt_qstate *b) {
  if (a->spec.qmin != b->spec.qmin || a->spec.qmax != b->spec.qmax) {
    fail(r, "%s: range [%d, %d] in the convert graph, [%d, %d] in training", what, b->spec.qmin, b->spec.qmax,
         a->spec.qmin, a->spec.qmax);
    return 0;
  }
  if (a->channels != b->channels || a->spec.per_channel != b->spec.per_channel) {
    fail(r, "%s: %d channels (axis %s) in the convert graph, %d in training", what, b->channels,
         b->spec.per_channel ? "0" : "none", a->channels);
    return 0;
  }
  for (int c = 0; c < a->channels; c++)
    if (memcmp(&a->scale[c], &b->scale[c], sizeof(float)) != 0 || a->zero_point[c] != b->zero_point[c]) {
      fail(r, "%s: channel %d has scale %.9g zero point %d in the convert graph, scale %.9g zero point %d in training",
           what, c, b->scale[c], b->zero_point[c], a->scale[c], a->zero_point[c]);
      return 0;
    }
  return 1;
}

/* The weight training fake-quantizes for node n (conv_bn: W * sf as its forward computes it). */
static float *trained_weight(qt_graph *t, const qt_node *n, int64_t *numel) {
  const qt_param *w = &t->tensors[n->param[QT_P_WEIGHT]];
  *numel = w->numel;
  float *out = malloc((size_t)w->numel * sizeof(float));
  QT_ASSERT(out, "out of memory");
  const float *W = qt_graph_tensor_data(t, n->param[QT_P_WEIGHT]);
  if (n->op == QT_OP_CONV_BN) {
    const int OC = (int)w->shape[0];
    qt_bn_fold(out, NULL, W, NULL, qt_graph_tensor_data(t, n->param[QT_P_BN_GAMMA]), NULL, NULL,
               qt_graph_tensor_data(t, n->buffer[QT_B_RUNNING_VAR]), n->attr.eps, OC, w->numel / OC);
  } else {
    memcpy(out, W, (size_t)w->numel * sizeof(float));
  }
  return out;
}

/* An int32 bias: the convert graph's integers are the bias training used (conv_bn: folded with
 * the running statistics, as its eval forward folds it) quantized with the derived scales. */
static void check_bias(qt_graph *t, int ti, qt_graph *c, int ci, qt_check_report *r) {
  const qt_node *n = &t->nodes[ti], *m = &c->nodes[ci];
  if (n->wq->spec.bias_int32 != m->wq->spec.bias_int32) {
    fail(r, "bias of %s: %s in training, %s in the convert graph", n->name, n->wq->spec.bias_int32 ? "int32" : "float",
         m->wq->spec.bias_int32 ? "int32" : "float");
    return;
  }
  const int has_bias = n->op == QT_OP_CONV_BN || n->param[QT_P_BIAS] >= 0;
  if (!n->wq->spec.bias_int32 || !has_bias) return;
  const int OC = n->attr.out_channels;
  if (!m->wq->qbias || m->wq->n_qbias != OC) {
    fail(r, "bias of %s: int32 in training, but the convert graph holds no %d integer biases", n->name, OC);
    return;
  }
  float *b = malloc((size_t)OC * sizeof(float)), *scale = malloc((size_t)OC * sizeof(float));
  int32_t *zero = calloc((size_t)OC, sizeof(int32_t)), *qb = malloc((size_t)OC * sizeof(int32_t));
  QT_ASSERT(b && scale && zero && qb, "out of memory");
  char why[QT_ERR_LEN];
  if (n->op == QT_OP_CONV_BN)
    qt_bn_fold(NULL, b, NULL, n->param[QT_P_BIAS] >= 0 ? qt_graph_tensor_data(t, n->param[QT_P_BIAS]) : NULL,
               qt_graph_tensor_data(t, n->param[QT_P_BN_GAMMA]), qt_graph_tensor_data(t, n->param[QT_P_BN_BETA]),
               qt_graph_tensor_data(t, n->buffer[QT_B_RUNNING_MEAN]),
               qt_graph_tensor_data(t, n->buffer[QT_B_RUNNING_VAR]), n->attr.eps, OC, 0);
  else
    memcpy(b, qt_graph_tensor_data(t, n->param[QT_P_BIAS]), (size_t)OC * sizeof(float));
  if (qt_bias_scales(t, ti, scale, why)) {
    fail(r, "bias of %s: %s", n->name, why);
  } else {
    qt_quantize(qb, b, 1, OC, 1, scale, zero, QT_BIAS_QMIN, QT_BIAS_QMAX);
    int bad = 0, first = -1;
    for (int o = 0; o < OC; o++)
      if (qb[o] != m->wq->qbias[o] && bad++ == 0) first = o;
    if (bad)
      fail(r, "bias of %s: %d of %d integers differ from quantizing the trained bias (first at %d: %d vs %d)", n->name,
           bad, OC, first, m->wq->qbias[first], qb[first]);
  }
  QT_FREE_ALL(b, scale, zero, qb);
}

static void check_structure(qt_graph *t, qt_graph *c, qt_check_report *r) {
  for (int i = 0; i < t->n_nodes; i++) {
    const qt_node *n = &t->nodes[i];
    if (n->op != QT_OP_FAKE_QUANT) continue;
    r->n_checked_points++;
    int qi = find_node(c, n->name, ".quantize"), di = find_node(c, n->name, ".dequantize");
    if (qi < 0 || di < 0) {
      fail(r, "%s: no quantize/dequantize pair in the convert graph", n->name);
      continue;
    }
    const qt_node *q = &c->nodes[qi], *d = &c->nodes[di];
    if (q->op != QT_OP_QUANTIZE || d->op != QT_OP_DEQUANTIZE || d->inputs[0] != q->output) {
      fail(r, "%s: %s and %s are not a quantize -> dequantize pair", n->name, q->name, d->name);
      continue;
    }
    const char *tp = producer_name(t, n->inputs[0]), *cp = producer_name(c, q->inputs[0]);
    if (strcmp(tp, cp) != 0) {
      fail(r, "%s: quantizes the output of %s in training but of %s in the convert graph (quantization point moved)",
           n->name, tp, cp);
      continue;
    }
    same_qparams(r, q->name, n->q, q->q);
    same_qparams(r, d->name, n->q, d->q);
  }
  for (int i = 0; i < c->n_nodes; i++) {
    const qt_node *n = &c->nodes[i];
    if (n->op != QT_OP_QUANTIZE) continue;
    char base[QT_NAME_LEN];
    snprintf(base, sizeof base, "%s", n->name);
    char *dot = strstr(base, ".quantize");
    if (dot) *dot = 0;
    int ti = qt_graph_find_node(t, base);
    if (ti < 0 || t->nodes[ti].op != QT_OP_FAKE_QUANT)
      fail(r, "%s: a quantize node with no fake quant '%s' in the training graph", n->name, base);
  }
  for (int i = 0; i < t->n_nodes; i++) {
    const qt_node *n = &t->nodes[i];
    if (!n->wq) continue;
    r->n_checked_weights++;
    int ci = qt_graph_find_node(c, n->name);
    if (ci < 0 || !c->nodes[ci].wq || !c->nodes[ci].wq->qweight) {
      fail(r, "weight of %s: not quantized in the convert graph", n->name);
      continue;
    }
    const qt_node *m = &c->nodes[ci];
    char what[QT_NAME_LEN + 16];
    snprintf(what, sizeof what, "weight of %s", n->name);
    if (!same_qparams(r, what, n->wq, m->wq)) continue;
    int64_t numel;
    float *w = trained_weight(t, n, &numel);
    const float *wc = qt_graph_tensor_data(c, m->param[QT_P_WEIGHT]);
    if (numel != m->wq->n_qweight) {
      fail(r, "%s: %lld integers in the convert graph, %lld weights in training", what, (long long)m->wq->n_qweight,
           (long long)numel);
      free(w);
      continue;
    }
    double maxd = 0;
    for (int64_t k = 0; k < numel; k++) maxd = fmax(maxd, fabs((double)w[k] - wc[k]));
    if (maxd != 0)
      fail(r,
           "%s: the folded weight convert quantized differs from the weight training fake-quantized by up to %.3g "
           "(BN folded with other statistics?)",
           what, maxd);
    int32_t *qw = malloc((size_t)numel * sizeof(int32_t));
    const int ch = m->wq->channels;
    qt_quantize(qw, w, 1, ch, numel / ch, n->wq->scale, n->wq->zero_point, n->wq->spec.qmin, n->wq->spec.qmax);
    int64_t bad = 0, out_of_range = 0, first = -1;
    for (int64_t k = 0; k < numel; k++) {
      int32_t v = m->wq->qweight[k];
      if (v < n->wq->spec.qmin || v > n->wq->spec.qmax) out_of_range++;
      if (v != qw[k] && bad++ == 0) first = k;
    }
    if (out_of_range)
      fail(r, "%s: %lld integers outside [%d, %d], the range training used", what, (long long)out_of_range,
           n->wq->spec.qmin, n->wq->spec.qmax);
    if (bad)
      fail(r, "%s: %lld integers differ from quantizing the trained weight (first at %lld: %d vs %d)", what,
           (long long)bad, (long long)first, m->wq->qweight[first], qw[first]);
    free(qw);
    free(w);
    check_bias(t, i, c, ci, r);
  }
}

static int same_shape(const qt_value *a, const qt_value *b) {
  if (a->ndim != b->ndim) return 0;
  for (int d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d]) return 0;
  return 1;
}

static double tie_distance(float x, float inv_s) {
  double v = (double)(x * inv_s);
  return fabs(fabs(v - floor(v)) - 0.5);
}

static int check_numbers(qt_graph *t, qt_graph *c, const float *batch, int n, qt_check_report *r, char *err) {
  const qt_value *in = &t->values[t->input];
  int64_t shape[4] = {n, in->shape[0], in->shape[1], in->shape[2]};
  qt_ctx *ct = qt_ctx_create(), *cc = qt_ctx_create();
  qt_ctx_set_grad(ct, 0);
  qt_ctx_set_grad(cc, 0);
  qt_tensor **vt, **vc;
  int rc = 0;
  /* Only what is compared below is kept: each fake quant's input and output, each quantize's
   * input and output; the graphs' other values are reused after their last consumer. */
  unsigned char *keep_t = calloc((size_t)t->n_values, 1), *keep_c = calloc((size_t)c->n_values, 1);
  QT_ASSERT(keep_t && keep_c, "out of memory");
  for (int i = 0; i < t->n_nodes; i++)
    if (t->nodes[i].op == QT_OP_FAKE_QUANT) keep_t[t->nodes[i].inputs[0]] = keep_t[t->nodes[i].output] = 1;
  for (int i = 0; i < c->n_nodes; i++)
    if (c->nodes[i].op == QT_OP_QUANTIZE) keep_c[c->nodes[i].inputs[0]] = keep_c[c->nodes[i].output] = 1;
  qt_tensor *yt = qt_graph_forward_keep(t, ct, qt_tensor_wrap(ct, QT_F32, 4, shape, (void *)batch), &vt, NULL, keep_t);
  qt_tensor *yc = NULL;
  qt_tensor **force = calloc((size_t)c->n_values, sizeof *force);
  QT_ASSERT(force, "out of memory");
  if (yt) {
    for (int i = 0; i < t->n_nodes; i++) {
      const qt_node *fq = &t->nodes[i];
      if (fq->op != QT_OP_FAKE_QUANT) continue;
      int di = find_node(c, fq->name, ".dequantize");
      if (di >= 0 && qt_tensor_numel(vt[fq->output]) == 0) continue;
      if (di < 0) continue;
      const qt_value *vc_di = &c->values[c->nodes[di].output], *vt_fq = &t->values[fq->output];
      if (!same_shape(vc_di, vt_fq)) {
        fail(r, "%s: its output has another shape in the convert graph (%s)", fq->name, c->nodes[di].name);
        continue; /* never forced: the convert graph keeps its own value */
      }
      force[c->nodes[di].output] = vt[fq->output];
    }
    yc = qt_graph_forward_keep(c, cc, qt_tensor_wrap(cc, QT_F32, 4, shape, (void *)batch), &vc, force, keep_c);
  }
  QT_FREE_ALL(force, keep_t, keep_c);
  if (!yt || !yc) {
    snprintf(err, QT_ERR_LEN, "check: running the %s graph: %s", !yt ? "training" : "convert",
             !yt ? t->error : c->error);
    rc = -1;
    goto done;
  }
  for (int i = 0; i < t->n_nodes; i++) {
    const qt_node *fq = &t->nodes[i];
    if (fq->op != QT_OP_FAKE_QUANT) continue;
    int qi = find_node(c, fq->name, ".quantize"), di = find_node(c, fq->name, ".dequantize");
    if (qi < 0 || di < 0) continue; /* reported structurally */
    const qt_node *q = &c->nodes[qi], *d = &c->nodes[di];
    const qt_tensor *xt = vt[fq->inputs[0]], *ot = vt[fq->output], *xc = vc[q->inputs[0]];
    const qt_tensor *ic = vc[q->output];
    (void)d;
    if (qt_tensor_numel(ot) != qt_tensor_numel(ic)) {
      fail(r, "%s: %lld outputs in training, %lld in the convert graph", fq->name, (long long)qt_tensor_numel(ot),
           (long long)qt_tensor_numel(ic));
      continue;
    }
    const int64_t numel = qt_tensor_numel(ot);
    const int C = q->q->channels;
    const int32_t *ints = (const int32_t *)ic->data;
    int64_t out_of_range = 0, bad = 0, first = -1;
    double maxlsb = 0;
    for (int64_t k = 0; k < numel; k++) {
      const int ch = (int)(k % C);
      const float s = q->q->scale[ch], inv = 1.0f / s;
      if (ints[k] < fq->q->spec.qmin || ints[k] > fq->q->spec.qmax) out_of_range++;
      /* the convert graph's own dequantized value (its dequantize output was replaced by the
       * training graph's for the segments downstream) */
      const float own = (float)(ints[k] - q->q->zero_point[ch]) * s;
      double lsb = fabs((double)qt_f32(ot)[k] - (double)own) / s;
      if (lsb > maxlsb) maxlsb = lsb;
      if (lsb > 0.5) {
        double tie = fmin(tie_distance(qt_f32(xt)[k], inv), tie_distance(qt_f32(xc)[k], inv));
        if (lsb < 1.5 && tie < 0.01)
          r->tie_mismatches++;
        else if (bad++ == 0)
          first = k;
      }
    }
    if (maxlsb > r->max_lsb) r->max_lsb = maxlsb;
    if (out_of_range)
      fail(r, "%s: %lld integers outside [%d, %d], the range training used", q->name, (long long)out_of_range,
           fq->q->spec.qmin, fq->q->spec.qmax);
    if (bad)
      fail(r,
           "%s: %lld outputs differ from training's fake quant (max %.1f LSB; first at %lld: %.9g vs %.9g, "
           "inputs %.9g vs %.9g)",
           fq->name, (long long)bad, maxlsb, (long long)first, qt_f32(ot)[first],
           (float)(ints[first] - q->q->zero_point[first % C]) * q->q->scale[first % C], qt_f32(xt)[first],
           qt_f32(xc)[first]);
  }
done:
  qt_ctx_free(ct);
  qt_ctx_free(cc);
  return rc;
}

int qt_check(qt_graph *t, qt_graph *c, const float *batch, int n, qt_check_report *r, char *err) {
  memset(r, 0, sizeof *r);
  r->ok = 1;
  err[0] = 0;
  const qt_value *ti = &t->values[t->input], *ci = &c->values[c->input];
  if (strcmp(t->name, c->name) != 0)
    return qt_err(err, "check: the training graph is model '%s', the convert graph model '%s': not the same model",
                  t->name, c->name);
  if (!same_shape(ti, ci))
    return qt_err(err, "check: the training graph's input '%s' and the convert graph's '%s' have different shapes",
                  ti->name, ci->name);
  if (qt_graph_check_memory(t, n, err) || qt_graph_check_memory(c, n, err)) return -1;
  qt_graph_set_mode(t, QT_MODE_EVAL);
  qt_graph_set_mode(c, QT_MODE_EVAL);
  qt_graph_sync_learned_scales(t);
  check_structure(t, c, r);
  if (r->n_checked_points == 0 && r->n_checked_weights == 0) fail(r, "the training graph has no quantization at all");
  return check_numbers(t, c, batch, n, r, err);
}
