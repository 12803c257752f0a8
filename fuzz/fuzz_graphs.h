/* The tiny models of the Q/DQ and checkpoint fuzz targets and of their seed maker
 * (make_seeds.c): small enough that a checkpoint or a Q/DQ file is a few kilobytes, and built
 * the same way every time (fixed ISA, fixed initialization), so that the committed seeds match
 * the graphs the targets load them into. Header only; link qt_qat and qt_backend. */
#ifndef QT_FUZZ_GRAPHS_H
#define QT_FUZZ_GRAPHS_H

#include <stdlib.h>
#include <string.h>

#include "autograd/autograd.h"
#include "backend/backend.h"
#include "qat/qat.h"

/* Histogram observers of the fuzz graphs use this many bins (2048 by default): a checkpoint
 * stores the histogram, and the seeds stay small. */
#define QT_FUZZ_HIST_BINS 64

/* input 6x6x1 -> conv1 (3 channels, 3x3, no bias) -> bn1 -> relu1 -> pool1 (2x2) -> flatten ->
 * fc (4 outputs): 181 parameters. */
static inline qt_graph *qt_fuzz_tiny_graph(void) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_graph_create("fuzz_tiny");
  int x = qt_graph_input(g, "input", 6, 6, 1);
  x = qt_graph_conv2d(g, "conv1", x, 3, 3, 1, 1, 1, 0);
  x = qt_graph_batch_norm(g, "bn1", x);
  x = qt_graph_relu(g, "relu1", x);
  x = qt_graph_max_pool2d(g, "pool1", x, 2, 2, 0);
  x = qt_graph_flatten(g, "flatten", x);
  x = qt_graph_linear(g, "fc", x, 4, 1);
  QT_ASSERT(qt_graph_finalize(g, x, err) == 0, "%s", err);
  qt_graph_init_params(g, 1);
  return g;
}

/* Every other op: input 5x5x2 -> conv_a (4 channels, 3x3, 2 groups) -> bn_a -> relu_a -> avg
 * (3x3, stride 1, pad 1) -> conv_b (1x1, bias) -> add(avg, conv_b) -> gap -> head (3 outputs). */
static inline qt_graph *qt_fuzz_all_ops_graph(void) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_graph_create("fuzz_all_ops");
  int x = qt_graph_input(g, "image", 5, 5, 2);
  int c = qt_graph_conv2d(g, "conv_a", x, 4, 3, 1, 1, 2, 0);
  c = qt_graph_batch_norm(g, "bn_a", c);
  c = qt_graph_relu(g, "relu_a", c);
  int p = qt_graph_avg_pool2d(g, "avg", c, 3, 1, 1);
  int s = qt_graph_conv2d(g, "conv_b", p, 4, 1, 1, 0, 1, 1);
  int a = qt_graph_add(g, "residual", p, s);
  int gp = qt_graph_global_avg_pool(g, "gap", a);
  int y = qt_graph_linear(g, "head", gp, 3, 1);
  QT_ASSERT(qt_graph_finalize(g, y, err) == 0, "%s", err);
  qt_graph_init_params(g, 2);
  return g;
}

/* The QAT settings of the checkpoint target's prepared graph: W4A4, histogram (MSE) activation
 * observers, moving-average weight observers, LSQ scales. */
static inline qt_quantizer_config qt_fuzz_qat_config(void) {
  qt_quantizer_config qc;
  qt_quantizer_config_default(&qc);
  qc.weight_bits = 4;
  qc.activation_bits = 4;
  qc.weight_observer = QT_OBSERVER_MOVING_AVERAGE;
  qc.activation_observer = QT_OBSERVER_HISTOGRAM;
  qc.activation_method = QT_RANGE_MSE;
  qc.learnable_scale = 1;
  return qc;
}

/* g prepared for mode with the onednn quantizer (VNNI ISA, whatever this CPU has) and qc;
 * histogram observers get QT_FUZZ_HIST_BINS bins. Aborts on an error. */
static inline qt_graph *qt_fuzz_prepare(const qt_graph *g, const qt_quantizer_config *qc, qt_prepare_mode mode) {
  char err[QT_ERR_LEN];
  qt_backend_desc d;
  qt_backend_desc_onednn_cpu(&d, QT_ISA_VNNI);
  qt_annotations a;
  QT_ASSERT(qt_quantizer(g, &d, qc, &a, err) == 0, "%s", err);
  qt_graph *p = qt_prepare(g, &a, mode, err);
  QT_ASSERT(p, "%s", err);
  qt_annotations_free(&a);
  for (int i = 0; i < p->n_nodes; i++) {
    qt_qstate *q[2] = {p->nodes[i].q, p->nodes[i].wq};
    for (int k = 0; k < 2; k++)
      if (q[k] && q[k]->obs.kind == QT_OBSERVER_HISTOGRAM) q[k]->obs.bins = QT_FUZZ_HIST_BINS;
  }
  return p;
}

/* One forward pass of g on n images whose pixels are a fixed pattern in [-1, 1]. Returns 0, or
 * -1 with g->error (e.g. an observer saw a NaN). */
static inline int qt_fuzz_forward(qt_graph *g, qt_ctx *ctx, int n) {
  const qt_value *in = &g->values[g->input];
  const int64_t shape[4] = {n, in->shape[0], in->shape[1], in->shape[2]};
  const int64_t count = shape[0] * shape[1] * shape[2] * shape[3];
  float *x = malloc((size_t)count * sizeof(float));
  QT_ASSERT(x, "out of memory");
  for (int64_t i = 0; i < count; i++) x[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
  qt_ctx_reset(ctx);
  qt_ctx_set_grad(ctx, 0);
  qt_tensor *out = qt_graph_forward(g, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, x));
  free(x);
  return out ? 0 : -1;
}

#endif
