/* Graph helpers for tests (header only; include in programs that link the nn library). */
#ifndef QT_TEST_GRAPH_UTIL_H
#define QT_TEST_GRAPH_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/nn.h"
#include "tests/common/testutil.h"

/* Loads every tensor of g from dataset <prefix><tensor name> of the HDF5 file `path`; a count
 * that differs from the tensor's is a failed check (and the tensor is left as it was). */
static inline void qt_test_load_graph_tensors(qt_graph *g, const char *path, const char *prefix) {
  for (int i = 0; i < g->n_tensors; i++) {
    char name[256];
    snprintf(name, sizeof name, "%s%s", prefix, g->tensors[i].name);
    int64_t shape[8];
    int nd;
    float *v = qt_test_load_f32(path, name, shape, &nd);
    QT_CHECK(qt_test_numel(shape, nd) == g->tensors[i].numel);
    if (qt_test_numel(shape, nd) == g->tensors[i].numel)
      memcpy(qt_graph_tensor_data(g, i), v, (size_t)g->tensors[i].numel * sizeof(float));
    free(v);
  }
}

/* A calibrated, non-observing quantization state of spec s with the same scale and zero point
 * on every channel; aborts on an error. */
static inline qt_qstate *qt_test_qstate(const qt_qspec *s, int channels, float scale, int zp) {
  char err[QT_ERR_LEN];
  qt_qstate *q = qt_qstate_create(s, channels, err);
  QT_ASSERT(q, "%s", err);
  for (int c = 0; c < channels; c++) {
    q->scale[c] = scale;
    q->zero_point[c] = zp;
  }
  q->calibrated = 1;
  q->observe = 0;
  return q;
}

/* Appends <prefix>.quantize (state q) -> <prefix>.dequantize (state dq) after value x; the
 * graph owns both states. Returns the dequantized value. */
static inline int qt_test_append_qdq(qt_graph *g, const char *prefix, int x, qt_qstate *q, qt_qstate *dq) {
  char name[QT_NAME_LEN];
  const qt_value *v = &g->values[x];
  const int nd = v->ndim;
  const int64_t shape[3] = {v->shape[0], v->shape[1], v->shape[2]};
  snprintf(name, sizeof name, "%s.quantize", prefix);
  int qn = qt_graph_add_node(g, QT_OP_QUANTIZE, name, &x, 1, NULL, nd, shape);
  QT_ASSERT(qn >= 0, "%s", g->error);
  g->nodes[qn].q = q;
  const int qv = g->nodes[qn].output;
  snprintf(name, sizeof name, "%s.dequantize", prefix);
  int dn = qt_graph_add_node(g, QT_OP_DEQUANTIZE, name, &qv, 1, NULL, nd, shape);
  QT_ASSERT(dn >= 0, "%s", g->error);
  g->nodes[dn].q = dq;
  return g->nodes[dn].output;
}

#endif
