/* Empirical bias correction (Nagel et al., 2019, section 4.2): quantizing a layer's weights and
 * inputs shifts the mean of its outputs, channel by channel; the bias absorbs the shift. On
 * calibration images, E[y_c] of each conv/linear layer's output (before its activation) is taken
 * twice: from the float graph (fake quant off; with the parameters it had before AdaRound moved its
 * weights onto their grid, when it ran) and from the quantized one (fake quant on, every
 * earlier layer already corrected), and b_c += E[y_float,c] - E[y_quant,c]. Layers are corrected
 * in graph order, each after the ones before it, since their inputs carry the earlier layers'
 * shifts. A layer's output is recomputed from its kept input with qt_node_forward, so what is
 * measured is the layer's own pre-activation output whatever the executor fuses or runs in place. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "qat/qat.h"

typedef struct {
  qt_graph *g;
  qt_ctx *ctx;
  const float *images;
  int n, batch;
  int *layers, n_layers;
  unsigned char *keep; /* per value: the layers' inputs */
} bc_run;

static int is_corrected(const qt_node *n) {
  return (n->op == QT_OP_CONV2D || n->op == QT_OP_LINEAR) && n->param[QT_P_BIAS] >= 0;
}

/* Adds to sum[layer k][c] the per-channel sums of the outputs of layers[k] for k in [k0, k1),
 * over every image, with the graph in `mode`; *count: the values per channel. */
static int output_sums(bc_run *r, qt_graph_mode mode, int k0, int k1, double **sum, int64_t *count, char *err) {
  qt_graph *g = r->g;
  const qt_value *in = &g->values[g->input];
  const int64_t per_image = qt_value_numel(in);
  qt_graph_set_mode(g, mode);
  for (int k = k0; k < k1; k++) count[k] = 0;
  for (int i0 = 0; i0 < r->n; i0 += r->batch) {
    const int B = r->n - i0 < r->batch ? r->n - i0 : r->batch;
    const int64_t shape[4] = {B, in->shape[0], in->shape[1], in->shape[2]};
    qt_ctx_reset(r->ctx);
    qt_tensor **values = NULL;
    qt_tensor *x = qt_tensor_wrap(r->ctx, QT_F32, 4, shape, (void *)(r->images + (int64_t)i0 * per_image));
    if (!qt_graph_forward_keep(g, r->ctx, x, &values, NULL, r->keep))
      return qt_err(err, "bias correction: forward: %s", g->error);
    for (int k = k0; k < k1; k++) {
      const int node = r->layers[k];
      qt_tensor *xin = values[g->nodes[node].inputs[0]];
      qt_tensor *y = qt_node_forward(g, r->ctx, node, &xin, 0, err);
      if (!y) return -1;
      const int C = g->nodes[node].attr.out_channels;
      const int64_t rows = qt_tensor_numel(y) / C;
      const float *yd = qt_f32(y);
      for (int64_t i = 0; i < rows; i++)
        for (int c = 0; c < C; c++) sum[k][c] += yd[i * C + c];
      count[k] += rows;
    }
  }
  qt_ctx_reset(r->ctx);
  return 0;
}

/* The largest |E[y_float] - E[y_quant]| over the layers' channels, and the layer it is in. */
static double worst_error(const bc_run *r, double **fsum, double **qsum, const int64_t *count, int *at) {
  double worst = 0;
  for (int k = 0; k < r->n_layers; k++) {
    const int C = r->g->nodes[r->layers[k]].attr.out_channels;
    for (int c = 0; c < C; c++) {
      const double e = fabs((fsum[k][c] - qsum[k][c]) / (double)count[k]);
      if (e > worst) {
        worst = e;
        *at = k;
      }
    }
  }
  return worst;
}

static double **sums_new(const bc_run *r) {
  double **s = calloc((size_t)(r->n_layers ? r->n_layers : 1), sizeof *s);
  QT_ASSERT(s, "out of memory");
  for (int k = 0; k < r->n_layers; k++) {
    s[k] = calloc((size_t)r->g->nodes[r->layers[k]].attr.out_channels, sizeof **s);
    QT_ASSERT(s[k], "out of memory");
  }
  return s;
}

static void sums_zero(const bc_run *r, double **s) {
  for (int k = 0; k < r->n_layers; k++)
    memset(s[k], 0, (size_t)r->g->nodes[r->layers[k]].attr.out_channels * sizeof **s);
}

static void sums_free(const bc_run *r, double **s) {
  for (int k = 0; k < r->n_layers; k++) free(s[k]);
  free(s);
}

/* The float model's sums, with the reference parameters in g when given. */
static int float_sums(bc_run *r, const float *reference, double **fsum, int64_t *count, char *err) {
  qt_graph *g = r->g;
  float *other = reference ? malloc((size_t)g->n_params * sizeof(float)) : NULL;
  if (reference) {
    QT_ASSERT(other, "out of memory");
    memcpy(other, reference, (size_t)g->n_params * sizeof(float));
    qt_graph_exchange_params(g, other);
  }
  const int rc = output_sums(r, QT_MODE_EVAL_FLOAT, 0, r->n_layers, fsum, count, err);
  if (reference) qt_graph_exchange_params(g, other);
  free(other);
  return rc;
}

int qt_bias_correct(qt_graph *g, qt_ctx *ctx, const float *reference, const float *images, int n, int batch,
                    qt_bias_correction_result *res, char *err) {
  memset(res, 0, sizeof *res);
  if (n < 1 || batch < 1) return qt_err(err, "bias correction: needs images (got %d, batch %d)", n, batch);
  bc_run r = {g, ctx, images, n, batch, malloc((size_t)g->n_nodes * sizeof(int)), 0, calloc((size_t)g->n_values, 1)};
  QT_ASSERT(r.layers && r.keep, "out of memory");
  for (int i = 0; i < g->n_nodes; i++)
    if (is_corrected(&g->nodes[i])) {
      r.layers[r.n_layers++] = i;
      r.keep[g->nodes[i].inputs[0]] = 1;
    }
  double **fsum = sums_new(&r), **qsum = sums_new(&r);
  int64_t *count = calloc((size_t)(r.n_layers ? r.n_layers : 1), sizeof *count);
  QT_ASSERT(count, "out of memory");
  int rc =
      float_sums(&r, reference, fsum, count, err) || output_sums(&r, QT_MODE_EVAL, 0, r.n_layers, qsum, count, err);
  int at = 0;
  if (!rc) res->before = worst_error(&r, fsum, qsum, count, &at);
  for (int k = 0; k < r.n_layers && !rc; k++) {
    if (k > 0) { /* the earlier corrections moved this layer's inputs: measure it again */
      memset(qsum[k], 0, (size_t)g->nodes[r.layers[k]].attr.out_channels * sizeof **qsum);
      rc = output_sums(&r, QT_MODE_EVAL, k, k + 1, qsum, count, err);
    }
    const qt_node *nd = &g->nodes[r.layers[k]];
    float *b = qt_graph_tensor_data(g, nd->param[QT_P_BIAS]);
    for (int c = 0; c < nd->attr.out_channels && !rc; c++)
      b[c] = (float)((double)b[c] + (fsum[k][c] - qsum[k][c]) / (double)count[k]);
  }
  if (!rc) {
    sums_zero(&r, qsum);
    rc = output_sums(&r, QT_MODE_EVAL, 0, r.n_layers, qsum, count, err);
  }
  if (!rc) {
    res->layers = r.n_layers;
    res->after = worst_error(&r, fsum, qsum, count, &at);
    if (r.n_layers) snprintf(res->worst_after, sizeof res->worst_after, "%s", g->nodes[r.layers[at]].name);
  }
  qt_graph_set_mode(g, QT_MODE_TRAIN);
  sums_free(&r, fsum);
  sums_free(&r, qsum);
  QT_FREE_ALL(count, r.layers, r.keep);
  return rc ? -1 : 0;
}

/* ---- the analytical form (Nagel et al., 2019, section 4.2) ---------------------------------- */
/* E[relu(X)] for X ~ N(mu, sigma^2): mu Phi(mu / sigma) + sigma phi(mu / sigma). */
static double relu_mean(double mu, double sigma) {
  if (!(sigma > 0)) return mu > 0 ? mu : 0;
  const double z = mu / sigma;
  return mu * 0.5 * erfc(-z / sqrt(2.0)) + sigma * exp(-0.5 * z * z) * 0.3989422804014327; /* 1 / sqrt(2 pi) */
}

/* The expected value of each channel of layer L's input (C of them, into mean), from the batch
 * norm that produced it in the fp32 graph: the input must come from a conv/linear -> batch norm
 * (-> relu | relu6) of fp32, through fake quants, average pools and a flatten only, so that it is
 * N(beta_c, gamma_c^2) before the activation. 0 with *C set, or -1 when it does not. */
static int input_means(const qt_graph *fp32, const qt_graph *p, const qt_node *L, double *mean, int cap, int *C) {
  int v = L->inputs[0];
  qt_op act = QT_OP_INPUT; /* none */
  for (;;) {
    const qt_node *pr = &p->nodes[p->values[v].producer];
    if (pr->op == QT_OP_FAKE_QUANT || pr->op == QT_OP_AVG_POOL2D || pr->op == QT_OP_GLOBAL_AVG_POOL ||
        pr->op == QT_OP_FLATTEN) {
      v = pr->inputs[0];
      continue;
    }
    if ((pr->op == QT_OP_RELU || pr->op == QT_OP_RELU6) && act == QT_OP_INPUT) {
      act = pr->op;
      v = pr->inputs[0];
      continue;
    }
    if (pr->op != QT_OP_CONV2D && pr->op != QT_OP_LINEAR) return -1;
    const int f = qt_graph_find_node(fp32, pr->name);
    if (f < 0) return -1;
    const int out = fp32->nodes[f].output;
    if (fp32->values[out].consumers != 1) return -1;
    for (int i = f + 1; i < fp32->n_nodes; i++) {
      const qt_node *b = &fp32->nodes[i];
      if (b->n_inputs < 1 || b->inputs[0] != out) continue;
      if (b->op != QT_OP_BATCH_NORM) return -1;
      const qt_param *gp = &fp32->tensors[b->param[QT_P_GAMMA]];
      if (gp->numel > cap) return -1;
      const float *gamma = fp32->params + gp->offset, *beta = fp32->params + fp32->tensors[b->param[QT_P_BETA]].offset;
      *C = (int)gp->numel;
      for (int c = 0; c < *C; c++) {
        const double mu = beta[c], sigma = fabs((double)gamma[c]);
        mean[c] = act == QT_OP_RELU    ? relu_mean(mu, sigma)
                  : act == QT_OP_RELU6 ? relu_mean(mu, sigma) - relu_mean(mu - 6.0, sigma)
                                       : mu;
      }
      return 0;
    }
    return -1;
  }
}

int qt_bias_correct_analytical(const qt_graph *fp32, qt_graph *p, const float *reference,
                               qt_bias_correction_result *res, char *err) {
  memset(res, 0, sizeof *res);
  enum { CAP = 1 << 16 };
  double *mean = malloc(CAP * sizeof *mean);
  QT_ASSERT(mean, "out of memory");
  for (int i = 0; i < p->n_nodes; i++) {
    const qt_node *L = &p->nodes[i];
    if (!is_corrected(L) || !L->wq || !L->wq->calibrated) continue;
    int C;
    if (input_means(fp32, p, L, mean, CAP, &C)) {
      res->skipped++;
      continue;
    }
    const qt_qstate *q = L->wq;
    const qt_param *wp = &p->tensors[L->param[QT_P_WEIGHT]];
    const float *w = p->params + wp->offset, *w0 = reference ? reference + wp->offset : w;
    const int OC = L->attr.out_channels;
    const int64_t inner = wp->numel / OC; /* per output channel: (C / groups) K  or IN */
    const int groups = L->op == QT_OP_CONV2D ? L->attr.groups : 1;
    const int64_t K = L->op == QT_OP_CONV2D ? wp->shape[2] * wp->shape[3] : 1;
    const int64_t per_group_in = L->op == QT_OP_CONV2D ? wp->shape[1] : inner;
    if (L->op == QT_OP_CONV2D ? per_group_in * groups != C : inner % C != 0) {
      res->skipped++;
      continue;
    }
    int32_t *qi = malloc((size_t)wp->numel * sizeof *qi);
    float *wq = malloc((size_t)wp->numel * sizeof *wq);
    QT_ASSERT(qi && wq, "out of memory");
    qt_quantize(qi, w, 1, q->channels, wp->numel / q->channels, q->scale, q->zero_point, q->spec.qmin, q->spec.qmax);
    qt_dequantize(wq, qi, 1, q->channels, wp->numel / q->channels, q->scale, q->zero_point);
    float *b = qt_graph_tensor_data(p, L->param[QT_P_BIAS]);
    for (int oc = 0; oc < OC; oc++) {
      const int64_t g0 = L->op == QT_OP_CONV2D ? (int64_t)(oc / (OC / groups)) * per_group_in : 0;
      double shift = 0; /* E[(W_q - W) x] for this output channel */
      for (int64_t j = 0; j < inner; j++) {
        const int64_t at = (int64_t)oc * inner + j;
        const int ch = L->op == QT_OP_CONV2D ? (int)(g0 + j / K) : (int)(j % C);
        shift += ((double)wq[at] - w0[at]) * mean[ch];
      }
      res->before = fmax(res->before, fabs(shift));
      b[oc] = (float)((double)b[oc] - shift);
    }
    res->layers++;
    QT_FREE_ALL(qi, wq);
  }
  free(mean);
  (void)err; /* nothing here fails: a layer whose input the batch norms do not describe is skipped */
  return 0;
}
