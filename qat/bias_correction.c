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
  const size_t bytes = (size_t)g->n_params * sizeof(float);
  float *own = reference ? malloc(bytes) : NULL;
  if (reference) {
    QT_ASSERT(own, "out of memory");
    memcpy(own, g->params, bytes);
    memcpy(g->params, reference, bytes);
  }
  const int rc = output_sums(r, QT_MODE_EVAL_FLOAT, 0, r->n_layers, fsum, count, err);
  if (reference) memcpy(g->params, own, bytes);
  free(own);
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
