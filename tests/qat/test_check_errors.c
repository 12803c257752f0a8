/* qat_check's inputs that cannot be compared get a message, not an abort: a training graph and
 * a convert graph of different models (by name; and, named alike, with a quantized value of
 * another shape, which was once forced into the other graph's executor), and a valid graph far
 * too big to run on the batch (a 1x1 conv with pad 8000 on 28x28 images: 16015x16015 values,
 * once an abort in the arena allocator). */
#include <string.h>

#include "tests/common/ptq_util.h"
#include "tests/common/quantizer_util.h"
#include "tests/common/testutil.h"

/* The PTQ training graph (prepared, calibrated, eval mode) and its convert graph of `model`. */
static void pair(qt_graph *g, qt_graph **t, qt_graph **c) {
  char err[QT_ERR_LEN];
  *t = qt_test_prepare_ptq_onednn(g);
  qt_annotations a;
  qt_quantizer_config qc;
  qt_quantizer_config_default(&qc);
  QT_ASSERT(qt_test_quantizer_onednn(g, &qc, QT_ISA_AUTO, &a, err) == 0, "%s", err);
  *c = qt_test_ptq_convert(g, &a); /* consumes g */
  /* the training graph calibrated as the convert graph was */
  qt_ctx *ctx = qt_ctx_create();
  const int64_t shape[4] = {32, 28, 28, 1};
  float *x = malloc(sizeof(float) * 32 * 784);
  qt_graph_set_mode(*t, QT_MODE_CALIBRATE);
  for (int s = 0; s < 3; s++) {
    qt_test_fill_uniform(x, 32 * 784, -0.8f, 2.0f, 40 + (uint64_t)s);
    qt_ctx_reset(ctx);
    QT_ASSERT(qt_graph_forward(*t, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, x)), "%s", (*t)->error);
  }
  free(x);
  qt_ctx_free(ctx);
  qt_set_observers(*t, 0);
  qt_graph_set_mode(*t, QT_MODE_EVAL);
}

static qt_graph *model(const char *name) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_model_build(name, err);
  QT_ASSERT(g, "%s", err);
  qt_graph_init_params(g, 1);
  return g;
}

int main(void) {
  char err[QT_ERR_LEN];
  float *batch = malloc(sizeof(float) * 8 * 784);
  qt_test_fill_uniform(batch, 8 * 784, -0.8f, 2.0f, 7);
  qt_graph *tc, *cc, *tr, *cr;
  pair(model("fashion_cnn"), &tc, &cc);
  pair(model("res_cnn"), &tr, &cr);
  qt_check_report r;

  /* The matching pair passes (the baseline of the cases below). */
  if (qt_check(tc, cc, batch, 8, &r, err) || !r.ok) qt_test_fail("fashion_cnn with its own convert graph: %s%s", err, r.reason);

  /* Different models: refused by name. */
  int rc = qt_check(tc, cr, batch, 8, &r, err);
  if (rc != -1 || !strstr(err, "the training graph is model 'fashion_cnn', the convert graph model 'res_cnn'"))
    qt_test_fail("fashion_cnn vs res_cnn: rc %d, '%s'", rc, err);

  /* Named alike: compared, and reported as failing, without running one graph's values
   * through the other. */
  snprintf(cr->name, sizeof cr->name, "%s", tc->name);
  rc = qt_check(tc, cr, batch, 8, &r, err);
  if (rc == 0 && r.ok) qt_test_fail("fashion_cnn vs res_cnn renamed: passed");
  if (rc != 0 && !err[0]) qt_test_fail("fashion_cnn vs res_cnn renamed: -1 without a message");

  /* A valid graph too big for the batch. */
  qt_graph *big = qt_graph_create("big_pad");
  int x = qt_graph_input(big, "input", 28, 28, 1);
  x = qt_graph_conv2d(big, "conv1", x, 4, 1, 1, 8000, 1, 1);
  x = qt_graph_global_avg_pool(big, "gap", x);
  x = qt_graph_linear(big, "fc", x, 10, 1);
  QT_ASSERT(qt_graph_finalize(big, x, err) == 0, "%s", err);
  rc = qt_graph_check_memory(big, 256, err);
  if (rc != -1 || !strstr(err, "graph 'big_pad' needs") || !strstr(err, "'conv1'"))
    qt_test_fail("big_pad at batch 256: rc %d, '%s'", rc, err);
  QT_CHECK(qt_graph_check_memory(tc, 256, err) == 0);
  qt_graph *tb = qt_test_prepare_ptq_onednn(big);
  rc = qt_check(tb, tb, batch, 8, &r, err);
  if (rc != -1 || !strstr(err, "needs")) qt_test_fail("check of big_pad: rc %d, '%s'", rc, err);

  qt_graph_free(big);
  qt_graph_free(tb);
  qt_graph_free(tc);
  qt_graph_free(cc);
  qt_graph_free(tr);
  qt_graph_free(cr);
  free(batch);
  return qt_test_finish();
}
