/* PTQ methods: cross-layer equalization (qat/cle.c) and bias correction (qat/bias_correction.c).
 * Cross-layer equalization:
 * - on a graph with every kind of pair (conv -> relu -> max pool -> depthwise conv, depthwise ->
 *   relu -> 1x1 conv, conv -> relu -> flatten -> linear, linear -> relu -> linear) whose channels
 *   differ in scale by up to 10^4, the outputs stay within 1e-5 of their largest magnitude, and
 *   afterwards every pair's r1_i and r2_i (largest |weight| of A's output channel i and of B's
 *   input channel i) agree within 1e-4;
 * - what is left alone: a chain through relu6 (unless relu6 is to become relu, which is then
 *   equalized and computes as the graph with relu would) or through an add, and a layer whose
 *   weight is shared; a graph with batch norm or with calibrated qparams is refused, naming the node;
 * - on FashionCNN prepared for PTQ (BN folded), the prepared graph's outputs are unchanged and the
 *   three pairs (conv1 -> conv2, conv2 -> fc1 through the flatten, fc1 -> fc2) are equalized.
 * Bias correction: the mean error of a quantized model's logits, measured by plain forwards on
 * the images it corrected on, falls below 1e-3 of what it was (test_bias_correction); the analytical
 * form removes at least 80% of the mean output shift the weights' rounding causes behind a
 * conv -> bn -> relu whose statistics are the data's (test_bias_correction_analytical). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qat/qat.h"
#include "tests/common/quantizer_util.h"
#include "tests/common/testutil.h"

enum { N = 4 };

/* Multiplies output channel c of node's weight (and bias) by 10^(4 (c mod 5) / 4 - 2). */
static void skew_channels(qt_graph *g, const char *node) {
  const qt_node *n = &g->nodes[qt_graph_find_node(g, node)];
  const qt_param *t = &g->tensors[n->param[QT_P_WEIGHT]];
  float *w = qt_graph_tensor_data(g, n->param[QT_P_WEIGHT]);
  float *b = n->param[QT_P_BIAS] >= 0 ? qt_graph_tensor_data(g, n->param[QT_P_BIAS]) : NULL;
  const int64_t per = t->numel / t->shape[0];
  for (int64_t c = 0; c < t->shape[0]; c++) {
    const float f = powf(10.0f, (float)(c % 5) - 2.0f);
    for (int64_t i = 0; i < per; i++) w[c * per + i] *= f;
    if (b) b[c] *= f;
  }
}

/* The graph's output on N fixed random images (h x w x c), copied. */
static float *outputs(qt_graph *g, qt_graph_mode mode, int h, int w, int c, int64_t *n_out) {
  qt_ctx *ctx = qt_ctx_create();
  int64_t shape[4] = {N, h, w, c};
  float *x = qt_test_uniform_range((int64_t)N * h * w * c, -1.0f, 1.0f, 5);
  qt_graph_set_mode(g, mode);
  qt_tensor *y = qt_graph_forward(g, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, x));
  if (!y) qt_test_fail("forward of %s: %s", g->name, g->error);
  *n_out = y ? qt_tensor_numel(y) : 0;
  float *out = malloc((size_t)(*n_out ? *n_out : 1) * sizeof *out);
  if (y) memcpy(out, qt_f32(y), (size_t)*n_out * sizeof *out);
  free(x);
  qt_ctx_free(ctx);
  return out;
}

/* max |a - b| / max |a| over n outputs. */
static double rel_diff(const float *a, const float *b, int64_t n) {
  double d = 0, m = 0;
  for (int64_t i = 0; i < n; i++) {
    d = fmax(d, fabs((double)a[i] - b[i]));
    m = fmax(m, fabs((double)a[i]));
  }
  return d / m;
}

/* The largest relative gap between A's output channel ranges and B's input channel ranges. For B
 * after a flatten of (H, W, C) its column j is channel j % C; a conv's input channel is group *
 * (C / groups) + the index within its weight. */
static double pair_gap(qt_graph *g, const char *a_name, const char *b_name) {
  const qt_node *a = &g->nodes[qt_graph_find_node(g, a_name)], *b = &g->nodes[qt_graph_find_node(g, b_name)];
  const qt_param *ta = &g->tensors[a->param[QT_P_WEIGHT]], *tb = &g->tensors[b->param[QT_P_WEIGHT]];
  const float *wa = qt_graph_tensor_data(g, a->param[QT_P_WEIGHT]),
              *wb = qt_graph_tensor_data(g, b->param[QT_P_WEIGHT]);
  const int C = (int)ta->shape[0];
  double r1[256] = {0}, r2[256] = {0};
  const int64_t per = ta->numel / C;
  for (int64_t i = 0; i < ta->numel; i++) r1[i / per] = fmax(r1[i / per], fabs(wa[i]));
  for (int64_t i = 0; i < tb->numel; i++) {
    int c;
    if (tb->ndim == 2) {
      c = (int)(i % tb->shape[1] % C);
    } else {
      const int64_t cg = tb->shape[1], k = tb->shape[2] * tb->shape[3], ocg = tb->shape[0] / b->attr.groups;
      c = (int)(i / (cg * k) / ocg * cg + i / k % cg);
    }
    r2[c] = fmax(r2[c], fabs(wb[i]));
  }
  double gap = 0;
  for (int c = 0; c < C; c++) gap = fmax(gap, fabs(r1[c] - r2[c]) / fmax(r1[c], r2[c]));
  return gap;
}

static int listed(const qt_cle_result *r, const char *a, const char *b) {
  for (int k = 0; k < r->pairs && k < QT_CLE_MAX_LISTED; k++)
    if (strcmp(r->a[k], a) == 0 && strcmp(r->b[k], b) == 0) return 1;
  return 0;
}

static qt_graph *finalized(qt_graph *g, int x) {
  char err[QT_ERR_LEN];
  if (qt_graph_finalize(g, x, err) || qt_graph_alloc(g, err)) qt_test_fail("graph: %s", err);
  qt_graph_init_params(g, 3);
  return g;
}

/* Every kind of pair, and the chains CLE must leave alone. */
static void test_pairs(void) {
  qt_graph *g = qt_graph_create("cle_pairs");
  int x = qt_graph_input(g, "input", 8, 8, 3);
  x = qt_graph_conv2d(g, "c1", x, 8, 3, 1, 1, 1, 1);
  x = qt_graph_relu(g, "r1", x);
  x = qt_graph_max_pool2d(g, "p1", x, 2, 2, 0);
  x = qt_graph_conv2d(g, "dw", x, 8, 3, 1, 1, 8, 1);
  x = qt_graph_relu(g, "r2", x);
  x = qt_graph_conv2d(g, "pw", x, 6, 1, 1, 0, 1, 1);
  x = qt_graph_relu(g, "r3", x);
  x = qt_graph_flatten(g, "flat", x);
  x = qt_graph_linear(g, "fc1", x, 12, 1);
  x = qt_graph_relu(g, "r4", x);
  x = qt_graph_linear(g, "fc2", x, 10, 1);
  x = qt_graph_relu6(g, "r5", x); /* fc2 -> fc3 through relu6: left alone */
  x = qt_graph_linear(g, "fc3", x, 10, 1);
  const int y = qt_graph_linear(g, "fc4", x, 10, 1);
  x = qt_graph_add(g, "add", x, y); /* fc3 feeds fc4 and the add: left alone */
  x = qt_graph_linear(g, "fc5", x, 5, 1);
  finalized(g, x);
  const char *skewed[] = {"c1", "pw", "fc1", "fc3"}; /* not their successors: the ranges then differ */
  for (size_t i = 0; i < sizeof skewed / sizeof *skewed; i++) skew_channels(g, skewed[i]);
  float *fc3_before = malloc(10 * 10 * sizeof(float));
  memcpy(fc3_before, qt_graph_tensor_data(g, g->nodes[qt_graph_find_node(g, "fc3")].param[QT_P_WEIGHT]),
         100 * sizeof(float));
  int64_t n0, n1;
  float *before = outputs(g, QT_MODE_EVAL_FLOAT, 8, 8, 3, &n0);
  const double gap0 = pair_gap(g, "c1", "dw");
  qt_cle_result r;
  char err[QT_ERR_LEN];
  if (qt_cross_layer_equalize(g, 0, &r, err)) qt_test_fail("cle: %s", err);
  float *after = outputs(g, QT_MODE_EVAL_FLOAT, 8, 8, 3, &n1);
  QT_CHECK(n0 == n1 && n0 == N * 5);
  const double d = rel_diff(before, after, n0);
  if (!(d <= 1e-5)) qt_test_fail("cle changed the outputs by %.3g of their largest magnitude (bound 1e-5)", d);
  QT_CHECK(r.pairs == 4);
  QT_CHECK(listed(&r, "c1", "dw") && listed(&r, "dw", "pw") && listed(&r, "pw", "fc1") && listed(&r, "fc1", "fc2"));
  QT_CHECK(r.last_change <= QT_CLE_TOLERANCE && r.iterations < QT_CLE_MAX_ITERATIONS);
  const char *pairs[4][2] = {{"c1", "dw"}, {"dw", "pw"}, {"pw", "fc1"}, {"fc1", "fc2"}};
  for (int k = 0; k < 4; k++) {
    const double gap = pair_gap(g, pairs[k][0], pairs[k][1]);
    if (!(gap <= 1e-4))
      qt_test_fail("%s -> %s: channel ranges differ by %.3g after CLE (bound 1e-4)", pairs[k][0], pairs[k][1], gap);
  }
  if (!(gap0 > 0.9)) qt_test_fail("the skewed graph's c1 -> dw ranges differed by only %.3g before CLE", gap0);
  QT_CHECK(memcmp(fc3_before, qt_graph_tensor_data(g, g->nodes[qt_graph_find_node(g, "fc3")].param[QT_P_WEIGHT]),
                  100 * sizeof(float)) == 0);
  if (getenv("QT_TEST_VERBOSE"))
    printf("pairs graph: %d pairs, %d passes, outputs moved %.3g; c1 -> dw gap %.3g -> %.3g\n", r.pairs, r.iterations,
           d, gap0, pair_gap(g, "c1", "dw"));
  QT_FREE_ALL(before, after, fc3_before);
  qt_graph_free(g);
}

/* With relu6_as_relu, fc2 -> fc3 through relu6 is equalized too, its relu6 made a relu: the
 * outputs are those of the graph with that relu in place of the relu6 (within 1e-5). */
static void test_relu6_as_relu(void) {
  qt_graph *g = qt_graph_create("cle_relu6");
  int x = qt_graph_input(g, "input", 1, 1, 6);
  x = qt_graph_flatten(g, "flat", x);
  x = qt_graph_linear(g, "fc1", x, 8, 1);
  x = qt_graph_relu6(g, "r1", x);
  x = qt_graph_linear(g, "fc2", x, 5, 1);
  finalized(g, x);
  skew_channels(g, "fc1");
  const int r1 = qt_graph_find_node(g, "r1");
  g->nodes[r1].op = QT_OP_RELU; /* the reference: the same graph with relu */
  int64_t n0, n1;
  float *before = outputs(g, QT_MODE_EVAL_FLOAT, 1, 1, 6, &n0);
  g->nodes[r1].op = QT_OP_RELU6;
  qt_cle_result r;
  char err[QT_ERR_LEN];
  if (qt_cross_layer_equalize(g, 0, &r, err)) qt_test_fail("cle: %s", err);
  QT_CHECK(r.pairs == 0 && r.relu6_replaced == 0 && g->nodes[r1].op == QT_OP_RELU6);
  if (qt_cross_layer_equalize(g, 1, &r, err)) qt_test_fail("cle: %s", err);
  QT_CHECK(r.pairs == 1 && r.relu6_replaced == 1 && g->nodes[r1].op == QT_OP_RELU && listed(&r, "fc1", "fc2"));
  float *after = outputs(g, QT_MODE_EVAL_FLOAT, 1, 1, 6, &n1);
  const double d = rel_diff(before, after, n0);
  if (!(d <= 1e-5)) qt_test_fail("cle with relu6 as relu: outputs moved %.3g (bound 1e-5)", d);
  const double gap = pair_gap(g, "fc1", "fc2");
  if (!(gap <= 1e-4)) qt_test_fail("fc1 -> fc2: channel ranges differ by %.3g after CLE (bound 1e-4)", gap);
  QT_FREE_ALL(before, after);
  qt_graph_free(g);
}

/* A shared weight is left alone; batch norm is refused. */
static void test_refusals(void) {
  char err[QT_ERR_LEN];
  qt_cle_result r;
  qt_graph *g = qt_graph_create("cle_shared");
  int x = qt_graph_input(g, "input", 1, 1, 4);
  x = qt_graph_flatten(g, "flat", x);
  x = qt_graph_linear(g, "fc1", x, 4, 1);
  x = qt_graph_relu(g, "r1", x);
  x = qt_graph_linear(g, "fc2", x, 4, 1);
  x = qt_graph_relu(g, "r2", x);
  x = qt_graph_linear(g, "fc3", x, 4, 0);
  qt_graph_share_weight(g, qt_graph_find_node(g, "fc3"), qt_graph_find_node(g, "fc2"));
  finalized(g, x);
  if (qt_cross_layer_equalize(g, 0, &r, err)) qt_test_fail("cle: %s", err);
  QT_CHECK(r.pairs == 0);
  qt_graph_free(g);

  g = qt_model_build("fashion_cnn", err);
  if (!g || qt_graph_alloc(g, err)) qt_test_fail("fashion_cnn: %s", err);
  QT_CHECK(qt_cross_layer_equalize(g, 0, &r, err) == -1 && strstr(err, "'bn1'") && strstr(err, "batch norm"));
  qt_graph_free(g);
}

/* FashionCNN initialized from seed, with non-trivial BN statistics, prepared for PTQ at
 * W<bits>A<bits> by the oneDNN Quantizer (BN folded). */
static qt_graph *prepared_fashion_cnn(uint64_t seed, int bits) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_model_build("fashion_cnn", err);
  if (!g || qt_graph_alloc(g, err)) qt_test_fail("fashion_cnn: %s", err);
  qt_graph_init_params(g, seed);
  for (int64_t i = 0; i < g->n_buffers; i++) g->buffers[i] = 0.3f + 0.2f * (float)(i % 7);
  const qt_quantizer_config qc = qt_test_quantizer_config(bits, bits);
  qt_graph *p = qt_test_prepare_onednn_isa(g, &qc, QT_PREPARE_PTQ, QT_ISA_VNNI);
  qt_graph_free(g);
  return p;
}

/* FashionCNN prepared for PTQ: unchanged outputs, three pairs; refused once calibrated. */
static void test_prepared(void) {
  char err[QT_ERR_LEN];
  qt_graph *p = prepared_fashion_cnn(7, 8);
  skew_channels(p, "conv1");
  int64_t n0, n1;
  float *before = outputs(p, QT_MODE_EVAL_FLOAT, 28, 28, 1, &n0);
  qt_cle_result r;
  if (qt_cross_layer_equalize(p, 0, &r, err)) qt_test_fail("cle on prepared fashion_cnn: %s", err);
  float *after = outputs(p, QT_MODE_EVAL_FLOAT, 28, 28, 1, &n1);
  const double d = rel_diff(before, after, n0);
  if (!(d <= 1e-5)) qt_test_fail("cle changed prepared fashion_cnn's outputs by %.3g (bound 1e-5)", d);
  QT_CHECK(r.pairs == 3 && listed(&r, "conv1", "conv2") && listed(&r, "conv2", "fc1") && listed(&r, "fc1", "fc2"));
  if (getenv("QT_TEST_VERBOSE"))
    printf("prepared fashion_cnn: %d pairs, %d passes, outputs moved %.3g\n", r.pairs, r.iterations, d);
  /* calibrated qparams: refused, naming a node */
  free(outputs(p, QT_MODE_CALIBRATE, 28, 28, 1, &n0));
  QT_CHECK(qt_cross_layer_equalize(p, 0, &r, err) == -1 && strstr(err, "calibrated"));
  QT_FREE_ALL(before, after);
  qt_graph_free(p);
}

/* The mean of each of fc2's outputs (before the output's fake quant) over the n images x, with p
 * in `mode`. */
static void mean_outputs(qt_graph *p, qt_graph_mode mode, float *x, int n, double *mean, int classes) {
  qt_ctx *ctx = qt_ctx_create();
  int64_t shape[4] = {n, 28, 28, 1};
  qt_graph_set_mode(p, mode);
  qt_tensor **values = NULL;
  qt_tensor *y = qt_graph_forward_values(p, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, x), &values);
  if (!y) qt_test_fail("forward: %s", p->error);
  y = y ? values[p->nodes[qt_graph_find_node(p, "fc2")].output] : NULL;
  for (int c = 0; c < classes; c++) {
    mean[c] = 0;
    for (int i = 0; y && i < n; i++) mean[c] += qt_f32(y)[i * classes + c] / n;
  }
  qt_ctx_free(ctx);
}

/* Bias correction on FashionCNN prepared for PTQ at W4A4 and calibrated on 64 random images: on
 * those images the mean of each logit (fc2's output before the output's fake quant, measured here
 * by plain forwards) of the quantized graph differs from the float graph's before; after qt_bias_correct
 * the difference is below 1e-3 of what it was. */
static void test_bias_correction(void) {
  enum { M = 64, K = 10 };
  char err[QT_ERR_LEN];
  qt_graph *p = prepared_fashion_cnn(9, 4);
  float *x = qt_test_uniform_range((int64_t)M * 784, -0.8f, 2.0f, 21);
  double mf[K], mq[K];
  mean_outputs(p, QT_MODE_CALIBRATE, x, M, mq, K);
  qt_set_observers(p, 0);
  mean_outputs(p, QT_MODE_EVAL_FLOAT, x, M, mf, K);
  mean_outputs(p, QT_MODE_EVAL, x, M, mq, K);
  double gap0 = 0, gap1 = 0;
  for (int c = 0; c < K; c++) gap0 = fmax(gap0, fabs(mf[c] - mq[c]));
  qt_ctx *ctx = qt_ctx_create();
  qt_bias_correction_result r;
  if (qt_bias_correct(p, ctx, NULL, x, M, 16, &r, err)) qt_test_fail("bias correction: %s", err);
  qt_ctx_free(ctx);
  mean_outputs(p, QT_MODE_EVAL, x, M, mq, K);
  for (int c = 0; c < K; c++) gap1 = fmax(gap1, fabs(mf[c] - mq[c]));
  if (!(gap0 > 1e-3)) qt_test_fail("bias correction: the W4A4 logits' mean error is only %.3g before", gap0);
  if (!(gap1 <= 1e-3 * gap0))
    qt_test_fail("bias correction: the logits' mean error went %.3g -> %.3g (bound: 1e-3 of before)", gap0, gap1);
  QT_CHECK(r.layers == 4 && r.before > 0 && r.after <= 1e-3 * r.before);
  if (getenv("QT_TEST_VERBOSE"))
    printf("bias correction: logits' mean error %.3g -> %.3g; layers' largest %.3g -> %.3g (%s)\n", gap0, gap1,
           r.before, r.after, r.worst_after);
  free(x);
  qt_graph_free(p);
}

/* The per-channel means of the graph's output over the n images x (hw x hw x 8) in eval mode with
 * only the weights quantized (weights_only) or in float (fake quant off). */
static void output_means(qt_graph *g, const float *x, int n, int hw, int weights_only, double *mean, int C) {
  qt_ctx *ctx = qt_ctx_create();
  const int64_t shape[4] = {n, hw, hw, 8};
  qt_graph_set_mode(g, weights_only ? QT_MODE_EVAL : QT_MODE_EVAL_FLOAT);
  for (int i = 0; weights_only && i < g->n_nodes; i++)
    if (g->nodes[i].op == QT_OP_FAKE_QUANT) g->nodes[i].q->fake_quant = 0;
  qt_tensor *y = qt_graph_forward(g, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, (void *)x));
  if (!y) qt_test_fail("forward: %s", g->error);
  const int64_t rows = y ? qt_tensor_numel(y) / C : 0;
  for (int c = 0; c < C; c++) {
    mean[c] = 0;
    for (int64_t i = 0; i < rows; i++) mean[c] += qt_f32(y)[i * C + c] / (double)rows;
  }
  qt_ctx_free(ctx);
}

/* Analytical bias correction: input (10, 10, 8) -> conv1 -> bn1 -> relu1 -> conv2 (16 channels each,
 * 3x3, no padding), bn1's statistics those of conv1's outputs on 512 random images, its gamma and
 * beta random. Prepared for PTQ at W3A8 and calibrated, the mean of each output channel with the
 * weights quantized (activations not) moves from the float one; the analytical correction of
 * conv2 (conv1, reading the image, is skipped) removes at least 80% of the largest such shift on
 * those images, the relu's rectified-normal means standing in for the data. */
static void test_bias_correction_analytical(void) {
  enum { M = 512, HW = 10, C = 16 };
  char err[QT_ERR_LEN];
  qt_graph *g = qt_graph_create("conv_bn_relu_conv");
  int v = qt_graph_input(g, "input", HW, HW, 8);
  v = qt_graph_conv2d(g, "conv1", v, C, 3, 1, 0, 1, 1);
  v = qt_graph_relu(g, "relu1", qt_graph_batch_norm(g, "bn1", v));
  v = qt_graph_conv2d(g, "conv2", v, C, 3, 1, 0, 1, 1);
  if (qt_graph_finalize(g, v, err)) qt_test_fail("graph: %s", err);
  qt_graph_init_params(g, 17);
  float *x = qt_test_uniform_range((int64_t)M * HW * HW * 8, -1.0f, 1.0f, 81);
  /* bn1's running statistics: conv1's outputs' own */
  const qt_node *conv1 = &g->nodes[qt_graph_find_node(g, "conv1")], *bn1 = &g->nodes[qt_graph_find_node(g, "bn1")];
  qt_ctx *ctx = qt_ctx_create();
  const int64_t shape[4] = {M, HW, HW, 8};
  qt_tensor **values = NULL;
  qt_graph_set_mode(g, QT_MODE_EVAL_FLOAT);
  if (!qt_graph_forward_values(g, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, x), &values)) qt_test_fail("%s", g->error);
  const qt_tensor *y1 = values[conv1->output];
  const int64_t rows = qt_tensor_numel(y1) / C;
  float *rm = qt_graph_tensor_data(g, bn1->buffer[QT_B_RUNNING_MEAN]),
        *rv = qt_graph_tensor_data(g, bn1->buffer[QT_B_RUNNING_VAR]);
  float *gamma = qt_graph_tensor_data(g, bn1->param[QT_P_GAMMA]),
        *beta = qt_graph_tensor_data(g, bn1->param[QT_P_BETA]);
  float *rnd = qt_test_uniform_range(2 * C, -1.0f, 1.0f, 82);
  for (int c = 0; c < C; c++) {
    double sum = 0, sum_sq = 0;
    for (int64_t i = 0; i < rows; i++) {
      const double t = qt_f32(y1)[i * C + c];
      sum += t;
      sum_sq += t * t;
    }
    rm[c] = (float)(sum / rows);
    rv[c] = (float)(sum_sq / rows - (sum / rows) * (sum / rows));
    gamma[c] = (rnd[c] < 0 ? -1.0f : 1.0f) * (0.5f + fabsf(rnd[c]));
    beta[c] = rnd[C + c];
  }
  qt_ctx_free(ctx);
  const qt_quantizer_config qc = qt_test_quantizer_config(3, 8);
  qt_graph *p = qt_test_prepare_onednn_isa(g, &qc, QT_PREPARE_PTQ, QT_ISA_VNNI);
  double mf[C], mq[C], gap0 = 0, gap1 = 0;
  output_means(p, x, M, HW, 0, mf, C);
  qt_test_calibrate(p, x, M);
  output_means(p, x, M, HW, 1, mq, C);
  for (int c = 0; c < C; c++) gap0 = fmax(gap0, fabs(mf[c] - mq[c]));
  qt_bias_correction_result r;
  if (qt_bias_correct_analytical(g, p, NULL, &r, err)) qt_test_fail("analytical bias correction: %s", err);
  output_means(p, x, M, HW, 1, mq, C);
  for (int c = 0; c < C; c++) gap1 = fmax(gap1, fabs(mf[c] - mq[c]));
  QT_CHECK(r.layers == 1 && r.skipped == 1 && r.before > 0);
  if (!(gap1 <= 0.2 * gap0))
    qt_test_fail("analytical bias correction: the largest mean output shift went %.3g -> %.3g (bound: 0.2 of before)",
                 gap0, gap1);
  if (getenv("QT_TEST_VERBOSE"))
    printf("analytical bias correction: largest mean output shift %.3g -> %.3g (expected %.3g)\n", gap0, gap1,
           r.before);
  QT_FREE_ALL(x, rnd);
  qt_graph_free(p);
  qt_graph_free(g);
}

int main(void) {
  test_pairs();
  test_refusals();
  test_relu6_as_relu();
  test_bias_correction();
  test_bias_correction_analytical();
  test_prepared();
  return qt_test_finish();
}
