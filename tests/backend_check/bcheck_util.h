/* Helpers shared by the backend-check tests (header only, each test is one program): PTQ of a
 * preset model with the onednn Quantizer or the one derived from a backend description, a
 * round trip through the Q/DQ file (the check reads only the file), small Q/DQ graph building,
 * and comparing a model's outputs with the Q/DQ reference interpreter. */
#ifndef QT_BCHECK_UTIL_H
#define QT_BCHECK_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "qat/qat.h"
#include "tests/common/graph_util.h"
#include "tests/common/ptq_util.h"
#include "tests/common/testutil.h"
#include "tests/common/quantizer_util.h"

/* The accelerator description shipped in experiments/. */
static inline void accel_desc(qt_backend_desc *d) {
  char err[QT_ERR_LEN];
  QT_ASSERT(qt_backend_desc_load(d, qt_test_path("experiments/accel_fictional.ini"), err) == 0, "%s", err);
}

/* model with PyTorch's init (seeded), BN statistics made non-trivial, quantized with the onednn
 * Quantizer (d == NULL; W wbits A abits, has_vnni) or the one derived from d, PTQ-calibrated on
 * three random batches shaped like normalized images, converted, saved to path and loaded back. */
static inline qt_graph *ptq_model(const char *model, const qt_backend_desc *d, int wbits, int abits, int has_vnni,
                                  const char *path) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_model_build(model, err);
  QT_ASSERT(g, "%s", err);
  qt_graph_init_params(g, 5);
  for (int t = 0; t < g->n_tensors; t++) { /* BN statistics of a trained net: folding is not the identity */
    const qt_param *p = &g->tensors[t];
    if (!p->is_buffer) continue;
    const int var = strstr(p->name, "running_var") != NULL;
    qt_test_fill_uniform(g->buffers + p->offset, p->numel, var ? 0.5f : -0.2f, var ? 1.5f : 0.2f, 30 + (uint64_t)t);
  }
  qt_quantizer_config qc = qt_test_quantizer_config(wbits, abits);
  qt_annotations a;
  if (d)
    QT_ASSERT(qt_quantizer(g, d, &qc, &a, err) == 0, "%s", err);
  else
    QT_ASSERT(qt_test_quantizer_onednn(g, &qc, has_vnni ? QT_ISA_VNNI : QT_ISA_NO_VNNI, &a, err) == 0, "%s", err);
  qt_graph *c = qt_test_ptq_convert(g, &a);
  QT_ASSERT(qt_qdq_save(path, c, err) == 0, "%s", err);
  qt_graph_free(c);
  qt_graph *loaded = qt_qdq_load(path, err);
  QT_ASSERT(loaded, "%s", err);
  return loaded;
}

/* Number of violations of kind k, and whether one of them (on node `node`, any node if NULL)
 * holds `text`. */
static inline int violations(const qt_backend_check_result *r, qt_violation_kind k, const char *node, const char *text) {
  int n = 0;
  for (int i = 0; i < r->n; i++)
    if (r->items[i].kind == k && (!node || strcmp(r->items[i].node_name, node) == 0) &&
        (!text || strstr(r->items[i].reason, text)))
      n++;
  return n;
}

/* The check pass of g against d; aborts when it cannot run. */
static inline qt_backend_check_result bcheck_run(const qt_graph *g, const qt_backend_desc *d) {
  char err[QT_ERR_LEN];
  qt_backend_check_result r;
  QT_ASSERT(qt_backend_check(g, d, &r, err) == 0, "%s", err);
  return r;
}

/* ---- small Q/DQ graphs ------------------------------------------------------------------- */

static inline qt_qstate *record(int qmin, int qmax, float scale, int zp, int channels) {
  qt_qspec s;
  memset(&s, 0, sizeof s);
  s.is_signed = qmin < 0;
  s.bits = 8;
  for (int b = 2; b <= 8; b++) {
    int lo, hi;
    qt_qrange(b, s.is_signed, &lo, &hi);
    if (lo <= qmin && qmax <= hi) {
      s.bits = b;
      break;
    }
  }
  s.qmin = qmin;
  s.qmax = qmax;
  s.symmetric = zp == 0;
  s.per_channel = channels > 1;
  s.observer = QT_OBSERVER_MINMAX;
  return qt_test_qstate(&s, channels, scale, zp);
}

/* Appends quantize -> dequantize after x; returns the dequantized value. */
static inline int qdq(qt_graph *g, const char *prefix, int x, int qmin, int qmax, float scale, int zp) {
  return qt_test_append_qdq(g, prefix, x, record(qmin, qmax, scale, zp, 1), record(qmin, qmax, scale, zp, 1));
}

/* Integer weights for layer `name` (after finalize): per-tensor symmetric s8 with `scale`,
 * uniform in [-wmax, wmax] from a seed. */
static inline void int_weights(qt_graph *g, const char *name, float scale, int wmax, uint64_t seed) {
  qt_node *n = &g->nodes[qt_graph_find_node(g, name)];
  const qt_param *w = &g->tensors[n->param[QT_P_WEIGHT]];
  n->wq = record(-128, 127, scale, 0, 1);
  n->wq->n_qweight = w->numel;
  n->wq->qweight = malloc((size_t)w->numel * sizeof(int32_t));
  float *u = malloc((size_t)w->numel * sizeof(float));
  qt_test_fill_uniform(u, w->numel, 0.0f, 1.0f, seed);
  for (int64_t k = 0; k < w->numel; k++) n->wq->qweight[k] = (int32_t)floorf(u[k] * (float)(2 * wmax + 1)) - wmax;
  free(u);
}

/* Max |a - b| / lsb over n outputs, and the share of rows (of `classes`) with the same argmax. */
static inline double max_lsb_diff(const float *a, const float *b, int64_t n, float lsb, int classes, double *agree) {
  double worst = 0;
  int64_t same = 0, rows = n / classes;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]) / (lsb > 0 ? lsb : 1.0f);
    if (d > worst) worst = d;
  }
  for (int64_t r = 0; r < rows; r++) {
    int ia = 0, ib = 0;
    for (int k = 1; k < classes; k++) {
      if (a[r * classes + k] > a[r * classes + ia]) ia = k;
      if (b[r * classes + k] > b[r * classes + ib]) ib = k;
    }
    same += ia == ib;
  }
  if (agree) *agree = rows ? (double)same / (double)rows : 1.0;
  return worst;
}

/* The Q/DQ reference interpreter's output on x (n, H, W, C), malloc'd. */
static inline float *reference(qt_graph *g, const float *x, int n) {
  qt_graph_set_mode(g, QT_MODE_EVAL);
  qt_ctx *ctx = qt_ctx_create();
  const qt_value *in = &g->values[g->input];
  const int64_t shape[4] = {n, in->shape[0], in->shape[1], in->shape[2]};
  qt_tensor *y = qt_graph_forward(g, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, (void *)x));
  QT_ASSERT(y, "reference forward: %s", g->error);
  float *out = malloc((size_t)qt_tensor_numel(y) * sizeof(float));
  memcpy(out, qt_f32(y), (size_t)qt_tensor_numel(y) * sizeof(float));
  qt_ctx_free(ctx);
  return out;
}

/* Output LSB: the scale of the final dequantize, or 0 when the output is fp32. */
static inline float output_lsb(const qt_graph *g) {
  const qt_node *o = &g->nodes[g->values[g->output].producer];
  return o->op == QT_OP_DEQUANTIZE ? o->q->scale[0] : 0.0f;
}

#endif
