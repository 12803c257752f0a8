/* PTQ for tests (header only; include in programs that link the qat library): prepare a model
 * with given annotations, calibrate it on three random batches shaped like normalized images
 * (32 x 28 x 28 x 1, uniform in [-0.8, 2.0], seeds 40..42) and convert it. */
#ifndef QT_TEST_PTQ_UTIL_H
#define QT_TEST_PTQ_UTIL_H

#include <stdlib.h>

#include "qat/qat.h"
#include "tests/common/testutil.h"

/* Consumes g and a (both freed); returns the convert graph. */
static inline qt_graph *qt_test_ptq_convert(qt_graph *g, qt_annotations *a) {
  char err[QT_ERR_LEN];
  qt_graph *p = qt_prepare(g, a, QT_PREPARE_PTQ, err);
  QT_ASSERT(p, "%s", err);
  qt_annotations_free(a);
  qt_graph_free(g);
  qt_ctx *ctx = qt_ctx_create();
  const int64_t shape[4] = {32, 28, 28, 1};
  float *x = malloc(sizeof(float) * 32 * 784);
  QT_ASSERT(x, "out of memory");
  qt_graph_set_mode(p, QT_MODE_CALIBRATE);
  for (int s = 0; s < 3; s++) {
    qt_test_fill_uniform(x, 32 * 784, -0.8f, 2.0f, 40 + (uint64_t)s);
    qt_ctx_reset(ctx);
    QT_ASSERT(qt_graph_forward(p, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, x)), "%s", p->error);
  }
  free(x);
  qt_ctx_free(ctx);
  qt_set_observers(p, 0);
  qt_graph_set_mode(p, QT_MODE_EVAL);
  qt_graph *c = qt_convert(p, err);
  QT_ASSERT(c, "%s", err);
  qt_graph_free(p);
  return c;
}

#endif
