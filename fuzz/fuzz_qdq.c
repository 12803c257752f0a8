/* Fuzz target: the Q/DQ graph file loader (qat/qat.h qt_qdq_load; docs/qdq_format.md), for both
 * kinds of file (qdq: convert graphs; prepared: training graphs).
 *
 * Input: an HDF5 file; its metadata and Fletcher-32 checksums are recomputed first
 * (fuzz_util.h), so mutated attributes, tensors, scales and integer weights reach the
 * loader's validation instead of HDF5's checksum checks. The loader must return a graph or
 * NULL with a message naming the file, and close every HDF5 object. A loaded graph is what an
 * executor trusts: when its values are small (< 2^20 floats per image in all) it runs once on
 * two images in eval mode, which must succeed or fail with a message. */
#include <stdlib.h>
#include <string.h>

#include "fuzz/fuzz_graphs.h"
#include "fuzz/fuzz_util.h"

static qt_ctx *ctx;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  qt_fuzz_h5_init();
  ctx = qt_ctx_create();
  QT_ASSERT(ctx, "out of memory");
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 1 << 20) return 0;
  uint8_t *buf = malloc(size ? size : 1);
  QT_ASSERT(buf, "out of memory");
  memcpy(buf, data, size);
  qt_fuzz_h5_fix_checksums(buf, size);
  const char *path = qt_fuzz_path(0, "model.h5");
  qt_fuzz_write_file(path, buf, size);
  free(buf);

  char err[QT_ERR_LEN] = "";
  qt_graph *g = qt_qdq_load(path, err);
  qt_fuzz_h5_expect_closed("qt_qdq_load");
  if (!g) {
    QT_ASSERT(strstr(err, path), "refused without naming the file: '%s'", err);
    return 0;
  }
  int64_t floats = 0;
  for (int v = 0; v < g->n_values; v++) {
    int64_t numel = 1;
    for (int d = 0; d < g->values[v].ndim; d++) numel *= g->values[v].shape[d];
    floats += numel;
  }
  if (floats < (1 << 20)) {
    qt_graph_set_mode(g, QT_MODE_EVAL);
    if (qt_fuzz_forward(g, ctx, 2) != 0) QT_ASSERT(g->error[0], "forward failed without a message");
    qt_ctx_reset(ctx);
  }
  qt_graph_free(g);
  return 0;
}
