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

#endif
