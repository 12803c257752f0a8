/* Dropout: the op (qt_dropout) and the graph's dropout node through the Quantizer, prepare,
 * convert, the check and the file.
 *
 * The op: about p of the elements zeroed (within 5 standard deviations), the others scaled by
 * PyTorch's factor exactly (the float32 that torch 1.13's F.dropout gives a kept element of ones:
 * 0x3f8e38e4 for p = 0.1, 0x3fb6db6e for 0.3, 2 for 0.5, printed by
 *     /usr/bin/python3 -c "import torch; y = torch.nn.functional.dropout(torch.ones(99), 0.3); print(y[y !=
 * 0][0].item())"
 * ), the gradient dy times the same factor where kept and 0 elsewhere (exact), the same mask for 1
 * and 2 threads and for a batch split in two at any row (row0), and another mask for another key.
 * The graph: training mode drops and eval mode is the identity (the node's value is its input's);
 * two steps with one random stream are bit-identical, another stream differs; the Quantizer puts
 * the fake quant before a dropout (the observer sees eval's values), convert leaves the dropout
 * out, the check passes, and a prepared graph's file keeps the node and its ratio. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "qat/qat.h"
#include "tests/common/quantizer_util.h"
#include "tests/common/testutil.h"

/* n uniform values in [-1, 1), none 0 (an element is kept iff its output is non-zero) */
static float *nonzero_uniform(int64_t n, uint64_t seed) {
  float *x = qt_test_uniform(n, seed);
  for (int64_t i = 0; i < n; i++)
    if (x[i] == 0.0f) x[i] = 1e-3f;
  return x;
}

static qt_tensor *dropout_of(qt_ctx *ctx, float *x, int64_t rows, int64_t S, float p, uint64_t key, int64_t row0) {
  return qt_dropout(ctx, qt_tensor_wrap(ctx, QT_F32, 2, (int64_t[]){rows, S}, x), p, key, row0);
}

static void test_op(void) {
  enum { ROWS = 6, S = 5000 };
  const int64_t n = (int64_t)ROWS * S;
  float *x = nonzero_uniform(n, 1), *dy = nonzero_uniform(n, 2);
  const struct {
    float p;
    uint32_t scale_bits;
  } cases[] = {{0.1f, 0x3f8e38e4u}, {0.3f, 0x3fb6db6eu}, {0.5f, 0x40000000u}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const float p = cases[c].p;
    float scale;
    memcpy(&scale, &cases[c].scale_bits, sizeof scale);
    qt_ctx *ctx = qt_ctx_create();
    qt_ctx_set_grad(ctx, 1);
    qt_tensor *t = qt_tensor_wrap(ctx, QT_F32, 2, (int64_t[]){ROWS, S}, x);
    t->requires_grad = 1;
    qt_tensor *y = qt_dropout(ctx, t, p, 77, 0);
    int64_t dropped = 0, bad = 0;
    for (int64_t i = 0; i < n; i++) {
      const float v = qt_f32(y)[i];
      if (v == 0.0f)
        dropped++;
      else if (v != x[i] * scale)
        bad++;
    }
    const double sd = sqrt((double)n * p * (1 - p));
    if (fabs((double)dropped - (double)n * p) > 5 * sd)
      qt_test_fail("p %g: %lld of %lld dropped (expected %.0f +- %.0f)", (double)p, (long long)dropped, (long long)n,
                   (double)n * p, 5 * sd);
    if (bad) qt_test_fail("p %g: %lld kept elements are not x * %.9g", (double)p, (long long)bad, (double)scale);
    /* the backward: dy * scale where kept, 0 where dropped (dy: the gradient of sum((y - t)^2) / 2) */
    qt_backward(ctx, qt_squared_error(ctx, y, dy, 2.0));
    int64_t badg = 0;
    for (int64_t i = 0; i < n; i++) {
      const float want = qt_f32(y)[i] != 0.0f ? y->grad[i] * scale : 0.0f;
      if (t->grad[i] != want) badg++;
    }
    if (badg) qt_test_fail("p %g: %lld gradients are not dy * mask * scale", (double)p, (long long)badg);
    qt_ctx_free(ctx);
  }

  /* one mask for any thread count, any split of the batch; another key, another mask */
  qt_ctx *ctx = qt_ctx_create();
  omp_set_num_threads(1);
  float *one = malloc((size_t)n * sizeof *one);
  memcpy(one, qt_f32(dropout_of(ctx, x, ROWS, S, 0.5f, 5, 0)), (size_t)n * sizeof *one);
  omp_set_num_threads(2);
  qt_test_close("2 threads", qt_f32(dropout_of(ctx, x, ROWS, S, 0.5f, 5, 0)), one, n, 0, 0);
  for (int split = 1; split < ROWS; split += 2) {
    qt_test_close("rows before the split", qt_f32(dropout_of(ctx, x, split, S, 0.5f, 5, 0)), one, (int64_t)split * S, 0,
                  0);
    qt_test_close("rows after the split",
                  qt_f32(dropout_of(ctx, x + (int64_t)split * S, ROWS - split, S, 0.5f, 5, split)),
                  one + (int64_t)split * S, (int64_t)(ROWS - split) * S, 0, 0);
  }
  const float *other = qt_f32(dropout_of(ctx, x, ROWS, S, 0.5f, 6, 0));
  int64_t same = 0;
  for (int64_t i = 0; i < n; i++) same += (other[i] == 0.0f) == (one[i] == 0.0f);
  if (same > n * 6 / 10) qt_test_fail("keys 5 and 6: %lld of %lld mask elements agree", (long long)same, (long long)n);
  /* p = 0 keeps everything unscaled; p = 1 zeroes everything */
  qt_test_close("p 0", qt_f32(dropout_of(ctx, x, ROWS, S, 0.0f, 5, 0)), x, n, 0, 0);
  const float *z = qt_f32(dropout_of(ctx, x, ROWS, S, 1.0f, 5, 0));
  for (int64_t i = 0; i < n; i++)
    if (z[i] != 0.0f) {
      qt_test_fail("p 1: element %lld is %g", (long long)i, (double)z[i]);
      break;
    }
  qt_ctx_free(ctx);
  free(one);
  free(x);
  free(dy);
}

/* input 6x6x2 -> dropout(0.5) -> conv 3x3 (4) -> relu -> flatten -> dropout(0.2) -> linear (10) */
static qt_graph *model(void) {
  qt_graph *g = qt_graph_create("dropout_net");
  int x = qt_graph_input(g, "input", 6, 6, 2);
  x = qt_graph_dropout(g, "drop_in", x, 0.5f);
  x = qt_graph_conv2d(g, "conv", x, 4, 3, 1, 1, 1, 1);
  x = qt_graph_relu(g, "relu", x);
  x = qt_graph_flatten(g, "flat", x);
  x = qt_graph_dropout(g, "drop_fc", x, 0.2f);
  x = qt_graph_linear(g, "fc", x, 10, 1);
  char err[QT_ERR_LEN];
  QT_ASSERT(qt_graph_finalize(g, x, err) == 0, "%s", err);
  qt_graph_init_params(g, 3);
  return g;
}

static float *forward(qt_graph *g, const float *x, int n, uint64_t seed, int training) {
  qt_ctx *ctx = qt_ctx_create();
  qt_ctx_set_random(ctx, seed, 0);
  qt_graph_set_training(g, training);
  qt_tensor *in = qt_tensor_wrap(ctx, QT_F32, 4, (int64_t[]){n, 6, 6, 2}, (void *)x);
  qt_tensor *y = qt_graph_forward(g, ctx, in);
  QT_ASSERT(y, "%s", g->error);
  float *out = malloc((size_t)n * 10 * sizeof *out);
  memcpy(out, qt_f32(y), (size_t)n * 10 * sizeof *out);
  qt_ctx_free(ctx);
  return out;
}

static int count_op(const qt_graph *g, qt_op op) {
  int k = 0;
  for (int i = 0; i < g->n_nodes; i++) k += g->nodes[i].op == op;
  return k;
}

static void test_graph(void) {
  enum { N = 8 };
  char err[QT_ERR_LEN];
  qt_graph *g = model();
  float *x = nonzero_uniform(N * 72, 9);
  float *a = forward(g, x, N, 11, 1), *b = forward(g, x, N, 11, 1), *c = forward(g, x, N, 12, 1);
  float *e = forward(g, x, N, 11, 0);
  qt_test_close("two steps of one random stream", a, b, N * 10, 0, 0);
  if (memcmp(a, c, N * 10 * sizeof *a) == 0) qt_test_fail("seeds 11 and 12 drew the same masks");
  if (memcmp(a, e, N * 10 * sizeof *a) == 0) qt_test_fail("training mode dropped nothing");
  /* eval: each dropout's value is its input's */
  qt_ctx *ctx = qt_ctx_create();
  qt_graph_set_training(g, 0);
  qt_tensor **vals;
  QT_ASSERT(qt_graph_forward_values(g, ctx, qt_tensor_wrap(ctx, QT_F32, 4, (int64_t[]){N, 6, 6, 2}, x), &vals), "%s",
            g->error);
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    if (n->op != QT_OP_DROPOUT) continue;
    qt_test_close(n->name, qt_f32(vals[n->output]), qt_f32(vals[n->inputs[0]]), qt_tensor_numel(vals[n->output]), 0, 0);
  }
  qt_ctx_free(ctx);

  /* the fake quant of the input comes before drop_in; drop_fc shares relu's quantization */
  qt_quantizer_config qc = qt_test_quantizer_config(8, 8);
  qt_graph *p = qt_test_prepare_onednn(g, &qc, QT_PREPARE_QAT);
  QT_CHECK(count_op(p, QT_OP_DROPOUT) == 2);
  const int din = qt_graph_find_node(p, "drop_in"), dfc = qt_graph_find_node(p, "drop_fc");
  QT_CHECK(din >= 0 && dfc >= 0);
  if (din >= 0 && dfc >= 0) {
    QT_CHECK(p->nodes[p->values[p->nodes[din].inputs[0]].producer].op == QT_OP_FAKE_QUANT);
    QT_CHECK(p->nodes[qt_graph_sole_consumer(p, p->nodes[din].output)].op != QT_OP_FAKE_QUANT);
    QT_CHECK(p->nodes[qt_graph_sole_consumer(p, p->nodes[dfc].output)].op == QT_OP_LINEAR);
    QT_CHECK(p->nodes[dfc].attr.ratio == 0.2f && p->nodes[din].attr.ratio == 0.5f);
  }
  qt_test_calibrate(p, x, N);
  float *pt = forward(p, x, N, 11, 1), *pe = forward(p, x, N, 11, 0);
  if (memcmp(pt, pe, N * 10 * sizeof *pt) == 0) qt_test_fail("the prepared graph dropped nothing in training");
  /* convert leaves the dropouts out; the check passes */
  qt_graph_set_mode(p, QT_MODE_EVAL);
  qt_graph *q = qt_convert(p, err);
  QT_ASSERT(q, "%s", err);
  QT_CHECK(count_op(q, QT_OP_DROPOUT) == 0);
  qt_check_report r;
  QT_ASSERT(qt_check(p, q, x, N, &r, err) == 0, "%s", err);
  if (!r.ok) qt_test_fail("check: %s", r.reason);
  float *qe = forward(q, x, N, 11, 0);
  qt_test_close("convert graph = prepared graph in eval", qe, pe, N * 10, 1e-5f, 1e-4f);
  /* the prepared graph's file keeps the nodes and their ratios */
  qt_graph *l = qt_test_qdq_reload(p);
  const int k = qt_graph_find_node(l, "drop_fc");
  QT_CHECK(k >= 0 && l->nodes[k].op == QT_OP_DROPOUT && l->nodes[k].attr.ratio == 0.2f);
  /* a ratio outside [0, 1) is refused at build */
  qt_graph *bad = qt_graph_create("bad");
  qt_graph_dropout(bad, "d", qt_graph_input(bad, "input", 2, 2, 1), 1.0f);
  if (!strstr(bad->error, "dropout: ratio 1 is not in [0, 1)")) qt_test_fail("ratio 1: '%s'", bad->error);
  qt_graph_free(bad);
  QT_FREE_ALL(a, b, c, e, pt, pe, qe, x);
  qt_graph_free(l);
  qt_graph_free(q);
  qt_graph_free(p);
  qt_graph_free(g);
}

int main(void) {
  test_op();
  test_graph();
  return qt_test_finish();
}
