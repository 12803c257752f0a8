/* convert: the prepared graph (after calibration or training) -> the Q/DQ graph. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "qat/qat.h"
#include "base/base.h"

static int add_tensor_copy(qt_graph *c, int node, const char *suffix, const qt_param *src, int **pending, int *n,
                           const float **srcdata, const float *data) {
  int t = qt_graph_add_tensor(c, node, suffix, src->ndim, src->shape, src->is_buffer);
  (*pending)[*n] = t;
  srcdata[*n] = data;
  (*n)++;
  return t;
}

/* The same for tensor t of p (a parameter or buffer), keeping its suffix ("weight",
 * "running_mean", ...); -1 stays -1. */
static int copy_tensor(qt_graph *c, int node, qt_graph *p, int t, int **pending, int *n, const float **srcdata) {
  if (t < 0) return -1;
  const qt_param *src = &p->tensors[t];
  const char *dot = strrchr(src->name, '.');
  return add_tensor_copy(c, node, dot ? dot + 1 : src->name, src, pending, n, srcdata, qt_graph_tensor_data(p, t));
}

/* Quantizes a weight (OC, ...) with its per-channel (or per-tensor) qparams into integers. */
static void quantize_weight(qt_qstate *q, const float *w, int64_t numel) {
  q->n_qweight = numel;
  q->qweight = malloc((size_t)numel * sizeof(int32_t));
  QT_ASSERT(q->qweight, "out of memory");
  qt_quantize(q->qweight, w, 1, q->channels, numel / q->channels, q->scale, q->zero_point, q->spec.qmin, q->spec.qmax);
}

/* The int32 bias of layer `node` of the convert graph (its weight spec has bias_int32): the
 * float bias (for conv_bn the folded one) quantized with the derived scales s_x * s_w[c], the
 * formula training's fake quant used. */
static int quantize_bias(qt_graph *c, int node, char *err) {
  qt_node *m = &c->nodes[node];
  const int OC = m->attr.out_channels;
  float *scale = malloc((size_t)OC * sizeof(float));
  int32_t *zero = calloc((size_t)OC, sizeof(int32_t));
  m->wq->qbias = malloc((size_t)OC * sizeof(int32_t));
  QT_ASSERT(scale && zero && m->wq->qbias, "out of memory");
  m->wq->n_qbias = OC;
  char why[QT_ERR_LEN];
  int rc = qt_bias_scales(c, node, scale, why);
  if (rc)
    snprintf(err, QT_ERR_LEN, "convert: %s", why);
  else
    qt_quantize(m->wq->qbias, qt_graph_tensor_data(c, m->param[QT_P_BIAS]), 1, OC, 1, scale, zero, QT_BIAS_QMIN,
                QT_BIAS_QMAX);
  free(scale);
  free(zero);
  return rc;
}

/* A copy of q for the convert graph: LSQ scales come from their (clamped) parameter, the way
 * training's last forward used them; the copy owns no parameter. */
static qt_qstate *convert_state(qt_graph *p, const qt_qstate *q) {
  qt_qstate *c = qt_qstate_clone(q);
  if (q->scale_param >= 0) {
    const float *s = qt_graph_tensor_data(p, q->scale_param);
    for (int k = 0; k < q->channels; k++) c->scale[k] = s[k] >= FLT_EPSILON ? s[k] : FLT_EPSILON;
  }
  c->scale_param = -1;
  return c;
}

int qt_lost_weight_channels(const qt_graph *c, char *detail, size_t cap) {
  int total = 0;
  size_t used = 0;
  if (detail && cap) detail[0] = 0;
  for (int i = 0; i < c->n_nodes; i++) {
    const qt_node *n = &c->nodes[i];
    const qt_qstate *q = n->wq;
    if (!q || !q->qweight || q->channels < 1 || n->param[QT_P_WEIGHT] < 0) continue;
    const int64_t inner = q->n_qweight / q->channels;
    const float *w = c->params + c->tensors[n->param[QT_P_WEIGHT]].offset; /* the float weight it quantized */
    int lost = 0, worst = -1;
    double worst_db = 0;
    for (int ch = 0; ch < q->channels; ch++) {
      const float *wc = w + (int64_t)ch * inner;
      const int32_t *qi = q->qweight + (int64_t)ch * inner;
      double sig = 0, err = 0;
      for (int64_t k = 0; k < inner; k++) {
        const double d = (double)(qi[k] - q->zero_point[ch]) * (double)q->scale[ch] - (double)wc[k];
        sig += (double)wc[k] * wc[k];
        err += d * d;
      }
      if (sig == 0) continue; /* an all-zero channel loses nothing */
      const double db = err > 0 ? 10 * log10(sig / err) : INFINITY;
      if (db > QT_LOST_CHANNEL_DB) continue;
      if (lost++ == 0 || db < worst_db) worst = ch, worst_db = db;
    }
    if (!lost) continue;
    total += lost;
    if (detail && used < cap) {
      float m = 0;
      for (int64_t k = 0; k < inner; k++) m = fmaxf(m, fabsf(w[(int64_t)worst * inner + k]));
      const int len = snprintf(detail + used, cap - used,
                               "  %s: %d of %d channels (worst %d: SQNR %.1f dB, scale %g, max |w| %g)\n", n->name,
                               lost, q->channels, worst, worst_db, (double)q->scale[worst], (double)m);
      used = len < 0 ? cap : used + (size_t)len;
    }
  }
  return total;
}

qt_graph *qt_convert(const qt_graph *pg, char *err) {
  qt_graph *p = (qt_graph *)pg;
  err[0] = 0;
  qt_graph *c = qt_graph_create(p->name);
  c->input_pre = p->input_pre;
  int *vmap = malloc((size_t)p->n_values * sizeof(int));
  int cap = 2 * p->n_tensors + 8, n_pending = 0;
  int *pending = malloc((size_t)cap * sizeof(int));
  const float **srcdata = malloc((size_t)cap * sizeof(float *));
  float **owned = calloc((size_t)cap, sizeof(float *)); /* folded data computed here */
  int n_owned = 0;
  int *qweight_nodes = malloc((size_t)(p->n_nodes + 1) * sizeof(int)); /* new conv nodes needing qweight */
  int n_qweight_nodes = 0;
  QT_ASSERT(vmap && pending && srcdata && owned && qweight_nodes, "out of memory");

  for (int i = 0; i < p->n_nodes && !err[0]; i++) {
    const qt_node *n = &p->nodes[i];
    const qt_value *v = &p->values[n->output];
    int inputs[QT_MAX_INPUTS];
    for (int k = 0; k < n->n_inputs; k++) inputs[k] = vmap[n->inputs[k]];
    if (n->op == QT_OP_FAKE_QUANT) {
      if (!n->q->calibrated) {
        snprintf(err, QT_ERR_LEN, "convert: fake_quant %s has no qparams (calibrate or train first)", n->name);
        break;
      }
      char name[QT_NAME_LEN + 16];
      snprintf(name, sizeof name, "%s.quantize", n->name);
      int qn = qt_graph_add_node(c, QT_OP_QUANTIZE, name, inputs, 1, NULL, v->ndim, v->shape);
      if (qn < 0) break;
      c->nodes[qn].q = convert_state(p, n->q);
      int qv = c->nodes[qn].output;
      snprintf(name, sizeof name, "%s.dequantize", n->name);
      int dn = qt_graph_add_node(c, QT_OP_DEQUANTIZE, name, &qv, 1, NULL, v->ndim, v->shape);
      if (dn < 0) break;
      c->nodes[dn].q = convert_state(p, n->q);
      vmap[n->output] = c->nodes[dn].output;
      continue;
    }
    if (n->op == QT_OP_DROPOUT) { /* the identity in eval: its consumers read its input */
      vmap[n->output] = inputs[0];
      continue;
    }
    qt_op op = n->op == QT_OP_CONV_BN ? QT_OP_CONV2D : n->op;
    int id = qt_graph_add_node(c, op, n->name, inputs, n->n_inputs, &n->attr, v->ndim, v->shape);
    if (id < 0) break;
    vmap[n->output] = c->nodes[id].output;
    /* eps, momentum and bn_frozen are BN's (eps also layer norm's): the conv2d that conv_bn folds
     * into carries none (0, as docs/qdq_format.md says of attributes an op does not use). */
    if (op == QT_OP_BATCH_NORM) {
      c->nodes[id].bn_frozen = n->bn_frozen;
    } else if (op != QT_OP_LAYER_NORM) {
      c->nodes[id].attr.eps = c->nodes[id].attr.momentum = 0.0f;
      c->nodes[id].bn_frozen = 0;
    }
    if (n->op == QT_OP_CONV_BN) {
      /* Fold with exactly the numbers training used (qt_bn_fold). */
      const qt_param *w = &p->tensors[n->param[QT_P_WEIGHT]];
      const int OC = (int)w->shape[0];
      const int64_t inner = w->numel / OC;
      const float *W = qt_graph_tensor_data(p, n->param[QT_P_WEIGHT]);
      const float *b = n->param[QT_P_BIAS] >= 0 ? qt_graph_tensor_data(p, n->param[QT_P_BIAS]) : NULL;
      float *Wf = malloc((size_t)w->numel * sizeof(float)), *bf = malloc((size_t)OC * sizeof(float));
      QT_ASSERT(Wf && bf, "out of memory");
      qt_bn_fold(Wf, bf, W, b, qt_graph_tensor_data(p, n->param[QT_P_BN_GAMMA]),
                 qt_graph_tensor_data(p, n->param[QT_P_BN_BETA]), qt_graph_tensor_data(p, n->buffer[QT_B_RUNNING_MEAN]),
                 qt_graph_tensor_data(p, n->buffer[QT_B_RUNNING_VAR]), n->attr.eps, OC, inner);
      owned[n_owned++] = Wf;
      owned[n_owned++] = bf;
      c->nodes[id].param[QT_P_WEIGHT] = add_tensor_copy(c, id, "weight", w, &pending, &n_pending, srcdata, Wf);
      qt_param bp = {.ndim = 1, .shape = {OC}, .numel = OC};
      c->nodes[id].param[QT_P_BIAS] = add_tensor_copy(c, id, "bias", &bp, &pending, &n_pending, srcdata, bf);
    } else {
      for (int k = 0; k < QT_MAX_PARAMS; k++) {
        c->nodes[id].param[k] = copy_tensor(c, id, p, n->param[k], &pending, &n_pending, srcdata);
        c->nodes[id].buffer[k] = copy_tensor(c, id, p, n->buffer[k], &pending, &n_pending, srcdata);
      }
    }
    if (n->wq) {
      if (!n->wq->calibrated) {
        snprintf(err, QT_ERR_LEN, "convert: weight quantization of %s has no qparams (calibrate or train first)",
                 n->name);
        break;
      }
      c->nodes[id].wq = convert_state(p, n->wq);
      qweight_nodes[n_qweight_nodes++] = id;
    }
  }
  if (!err[0] && c->error[0]) snprintf(err, QT_ERR_LEN, "convert: %s", c->error);
  if (!err[0]) {
    c->output = vmap[p->output];
    if (qt_graph_alloc(c, err) == 0) {
      for (int k = 0; k < n_pending; k++)
        memcpy(qt_graph_tensor_data(c, pending[k]), srcdata[k], (size_t)c->tensors[pending[k]].numel * sizeof(float));
      for (int k = 0; k < n_qweight_nodes; k++) {
        qt_node *m = &c->nodes[qweight_nodes[k]];
        const qt_param *w = &c->tensors[m->param[QT_P_WEIGHT]];
        quantize_weight(m->wq, qt_graph_tensor_data(c, m->param[QT_P_WEIGHT]), w->numel);
        if (m->wq->spec.bias_int32 && m->param[QT_P_BIAS] >= 0 && quantize_bias(c, qweight_nodes[k], err)) break;
      }
    }
  }
  for (int k = 0; k < n_owned; k++) free(owned[k]);
  QT_FREE_ALL(owned, vmap, pending, srcdata, qweight_nodes);
  if (err[0]) {
    qt_graph_free(c);
    return NULL;
  }
  qt_graph_set_mode(c, QT_MODE_EVAL);
  qt_freeze_bn(c, 1);
  for (int i = 0; i < c->n_nodes; i++) {
    if (c->nodes[i].q) c->nodes[i].q->observe = 0;
    if (c->nodes[i].wq) c->nodes[i].wq->observe = 0;
  }
  return c;
}
