/* Quantizer, prepare, convert and the consistency check on FashionCNN and ResCNN:
 * - the onednn Quantizer's annotations (points, shared qparams, 7-bit weights without VNNI; a
 *   relu6 fused into its conv's unit, an fp32 op outside one);
 * - PTQ and QAT prepared graphs convert to Q/DQ graphs that pass the check;
 * - negative cases the check must catch: a changed scale, a missing Q/DQ pair, a quantization
 *   point moved past a ReLU, BN folded with the wrong statistics, an integer outside the range;
 * - folding a weight shared by two conv->BN chains is refused; NaN reaching an observer is an
 *   error naming the node;
 * - LSQ scales: trained and followed by convert; initialized from a whole calibration pass. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qat/qat.h"
#include "tests/common/testutil.h"
#include "tests/common/quantizer_util.h"

enum { N = 16 };

static float *batch(uint64_t seed) {
  float *x = malloc(sizeof(float) * N * 784);
  qt_test_fill_uniform(x, N * 784, -0.8f, 2.0f, seed);
  return x;
}

static int g_lsq; /* prepared_model: learnable scales */

static qt_graph *prepared_model(const char *model, qt_prepare_mode mode, int wbits, int abits, int vnni) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_model_build(model, err);
  qt_graph_init_params(g, 11);
  /* non-trivial BN statistics, so folding matters */
  for (int64_t i = 0; i < g->n_buffers; i++) g->buffers[i] = 0.3f + 0.2f * (float)(i % 7);
  qt_quantizer_config qc = qt_test_quantizer_config(wbits, abits);
  qc.weight_observer = mode == QT_PREPARE_QAT ? QT_OBSERVER_MOVING_AVERAGE : QT_OBSERVER_MINMAX;
  qc.learnable_scale = g_lsq;
  qt_annotations a;
  if (qt_test_quantizer_onednn(g, &qc, vnni ? QT_ISA_VNNI : QT_ISA_NO_VNNI, &a, err)) qt_test_fail("quantizer: %s", err);
  qt_graph *p = qt_prepare(g, &a, mode, err);
  if (!p) qt_test_fail("prepare %s: %s", model, err);
  qt_annotations_free(&a);
  qt_graph_free(g);
  return p;
}

/* Calibrate (PTQ) or train a few SGD steps (QAT) on random batches. */
static void exercise(qt_graph *p, qt_prepare_mode mode) {
  qt_ctx *ctx = qt_ctx_create();
  int32_t labels[N];
  for (int i = 0; i < N; i++) labels[i] = i % 10;
  int64_t shape[4] = {N, 28, 28, 1};
  for (int s = 0; s < 4; s++) {
    float *x = batch(100 + (uint64_t)s);
    qt_ctx_reset(ctx);
    qt_graph_set_mode(p, QT_MODE_TRAIN);
    qt_ctx_set_grad(ctx, mode == QT_PREPARE_QAT);
    qt_tensor *out = qt_graph_forward(p, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, x));
    if (!out) qt_test_fail("forward of prepared %s: %s", p->name, p->error);
    if (out && mode == QT_PREPARE_QAT) {
      qt_tensor *loss = qt_cross_entropy(ctx, out, labels, NULL);
      qt_graph_zero_grad(p);
      qt_backward(ctx, loss);
      for (int64_t i = 0; i < p->n_params; i++) p->params[i] -= 0.01f * p->grads[i];
    }
    free(x);
  }
  qt_ctx_free(ctx);
}

static qt_check_report check(qt_graph *t, qt_graph *c) {
  char err[QT_ERR_LEN];
  qt_check_report r;
  float *x = batch(7);
  if (qt_check(t, c, x, N, &r, err)) qt_test_fail("check could not run: %s", err);
  free(x);
  return r;
}

static void annotations(void) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_model_build("fashion_cnn", err);
  qt_quantizer_config qc;
  qt_quantizer_config_default(&qc);
  qt_annotations a;
  QT_CHECK(qt_test_quantizer_onednn(g, &qc, QT_ISA_NO_VNNI, &a, err) == 0);
  const char *points[] = {"input", "relu1", "relu2", "relu3", "fc2"};
  const char *shared[] = {"pool1", "pool2", "flatten"};
  int n_points = 0;
  for (int v = 0; v < g->n_values; v++) n_points += a.act[v];
  QT_CHECK(n_points == 5);
  for (int i = 0; i < 5; i++) {
    int v = g->nodes[qt_graph_find_node(g, points[i])].output;
    if (!a.act[v]) qt_test_fail("quantizer: %s is not a quantization point", points[i]);
    else if (a.act_spec[v].qmin != 0 || a.act_spec[v].qmax != 255 || a.act_spec[v].symmetric)
      qt_test_fail("quantizer: %s is not u8 affine", points[i]);
  }
  for (int i = 0; i < 3; i++) {
    int v = g->nodes[qt_graph_find_node(g, shared[i])].output;
    if (a.act[v] || a.share[v] < 0) qt_test_fail("quantizer: %s should share its input's qparams", shared[i]);
  }
  const char *weights[] = {"conv1", "conv2", "fc1", "fc2"};
  for (int i = 0; i < 4; i++) {
    int n = qt_graph_find_node(g, weights[i]);
    if (!a.weight[n] || a.weight_spec[n].qmin != -64 || a.weight_spec[n].qmax != 63 || !a.weight_spec[n].per_channel)
      qt_test_fail("quantizer: %s weight is not s7 per-channel symmetric without VNNI", weights[i]);
  }
  /* conv -> bn -> relu is one unit: no point between them */
  QT_CHECK(!a.act[g->nodes[qt_graph_find_node(g, "conv1")].output]);
  QT_CHECK(!a.act[g->nodes[qt_graph_find_node(g, "bn1")].output]);
  qt_annotations_free(&a);
  QT_CHECK(qt_parse_overrides(&qc, "fc2=fp32;conv1=w4a8", err) == 0);
  QT_CHECK(qt_test_quantizer_onednn(g, &qc, QT_ISA_VNNI, &a, err) == 0);
  int c1 = qt_graph_find_node(g, "conv1"), f2 = qt_graph_find_node(g, "fc2");
  QT_CHECK(a.weight_spec[c1].qmin == -8 && a.weight_spec[c1].qmax == 7);
  QT_CHECK(a.weight_spec[qt_graph_find_node(g, "conv2")].qmin == -128);
  QT_CHECK(!a.weight[f2] && !a.act[g->nodes[f2].output]);
  qt_annotations_free(&a);
  QT_CHECK(qt_parse_overrides(&qc, "fc9=fp32", err) == 0);
  QT_CHECK(qt_test_quantizer_onednn(g, &qc, QT_ISA_VNNI, &a, err) != 0 && strstr(err, "fc9"));
  QT_CHECK(qt_parse_overrides(&qc, "fc2=w9", err) != 0 && strstr(err, "fc2=w9"));
  qt_graph_free(g);
}

/* relu6: fused into a conv -> bn unit (the unit's point after it) like relu; outside a unit it
 * is an fp32 op, not a pass-through (6 need not lie on its input's grid), so the conv reading
 * it quantizes its output. */
static void relu6_units(void) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_graph_create("relu6_units");
  int x = qt_graph_input(g, "input", 8, 8, 2);
  x = qt_graph_conv2d(g, "conv1", x, 4, 3, 1, 1, 1, 0);
  x = qt_graph_batch_norm(g, "bn1", x);
  x = qt_graph_relu6(g, "relu1", x);
  x = qt_graph_max_pool2d(g, "pool", x, 2, 2, 0);
  x = qt_graph_relu6(g, "relu2", x);
  x = qt_graph_conv2d(g, "conv2", x, 4, 1, 1, 0, 4, 1); /* depthwise */
  x = qt_graph_relu6(g, "relu3", x);
  x = qt_graph_flatten(g, "flatten", x);
  QT_ASSERT(qt_graph_finalize(g, x, err) == 0, "%s", err);
  qt_quantizer_config qc = qt_test_quantizer_config(8, 8);
  qt_annotations a;
  QT_CHECK(qt_test_quantizer_onednn(g, &qc, QT_ISA_VNNI, &a, err) == 0);
#define V(name) g->nodes[qt_graph_find_node(g, name)].output
#define U(name) a.unit[qt_graph_find_node(g, name)]
  QT_CHECK(U("bn1") == qt_graph_find_node(g, "conv1") && U("relu1") == qt_graph_find_node(g, "conv1"));
  QT_CHECK(!a.act[V("bn1")] && a.act[V("relu1")] && a.share[V("pool")] == V("relu1"));
  QT_CHECK(U("relu2") == qt_graph_find_node(g, "relu2") && a.share[V("relu2")] < 0 && a.act[V("relu2")]);
  QT_CHECK(U("relu3") == qt_graph_find_node(g, "conv2") && a.act[V("relu3")] && !a.act[V("conv2")]);
#undef V
#undef U
  qt_annotations_free(&a);
  /* a backend without relu6 in its op list fuses nothing: the point is the conv's output */
  qt_backend_desc d;
  qt_backend_desc_onednn_cpu(&d, QT_ISA_VNNI);
  d.ops[QT_OP_RELU6] = 0;
  QT_CHECK(qt_quantizer(g, &d, &qc, &a, err) == 0);
  QT_CHECK(a.unit[qt_graph_find_node(g, "relu1")] == qt_graph_find_node(g, "relu1"));
  QT_CHECK(a.act[g->nodes[qt_graph_find_node(g, "bn1")].output]);
  qt_annotations_free(&a);
  qt_graph_free(g);
}

static void round_trip(const char *model, qt_prepare_mode mode, int wbits, int abits) {
  char err[QT_ERR_LEN];
  qt_graph *p = prepared_model(model, mode, wbits, abits, 0);
  if (!p) return;
  exercise(p, mode);
  qt_graph *c = qt_convert(p, err);
  if (!c) {
    qt_test_fail("convert %s: %s", model, err);
    qt_graph_free(p);
    return;
  }
  qt_check_report r = check(p, c);
  if (!r.ok)
    qt_test_fail("%s %s W%dA%d: check failed:\n%s", model, mode == QT_PREPARE_QAT ? "QAT" : "PTQ", wbits, abits,
                 r.reason);
  if (r.max_lsb > 1.0) qt_test_fail("%s: max %.2f LSB", model, r.max_lsb);
  qt_graph_free(c);
  qt_graph_free(p);
}

static void lsq_moves_scales(void) {
  qt_graph *p = prepared_model("fashion_cnn", QT_PREPARE_QAT, 4, 4, 1);
  exercise(p, QT_PREPARE_QAT); /* first forward initializes, later steps train */
  int t = qt_graph_find_tensor(p, "relu1.fq.scale"), w = qt_graph_find_tensor(p, "conv2.weight_scale");
  QT_CHECK(t >= 0 && w >= 0);
  if (t < 0 || w < 0) return;
  const qt_node *fq = &p->nodes[qt_graph_find_node(p, "relu1.fq")];
  qt_graph_sync_learned_scales(p);
  QT_CHECK(fq->q->scale[0] == qt_graph_tensor_data(p, t)[0]);
  /* the observer's running min/max would give another scale than the learned one */
  float obs_scale;
  int32_t obs_zp;
  char err[QT_ERR_LEN];
  QT_CHECK(qt_observer_qparams(&fq->q->obs, fq->q->spec.qmin, fq->q->spec.qmax, 0, &obs_scale, &obs_zp, err) == 0);
  if (obs_scale == fq->q->scale[0]) qt_test_fail("LSQ: relu1.fq scale did not move from its initialization");
  qt_graph *c = qt_convert(p, err);
  QT_CHECK(c != NULL);
  const qt_node *qn = &c->nodes[qt_graph_find_node(c, "relu1.fq.quantize")];
  QT_CHECK(qn->q->scale[0] == qt_graph_tensor_data(p, t)[0] && qn->q->scale_param == -1);
  qt_graph_free(c);
  qt_graph_free(p);
}

static void negatives(void) {
  char err[QT_ERR_LEN];
  qt_graph *p = prepared_model("fashion_cnn", QT_PREPARE_QAT, 4, 4, 1);
  exercise(p, QT_PREPARE_QAT);
  qt_graph *c = qt_convert(p, err);
  QT_CHECK(c != NULL);
  qt_check_report r = check(p, c);
  QT_CHECK(r.ok);

  /* a changed scale */
  int q = qt_graph_find_node(c, "relu2.fq.quantize");
  QT_CHECK(q >= 0);
  float saved = c->nodes[q].q->scale[0];
  c->nodes[q].q->scale[0] *= 1.0001f;
  r = check(p, c);
  if (r.ok || !strstr(r.reason, "relu2.fq.quantize")) qt_test_fail("changed scale not caught:\n%s", r.reason);
  c->nodes[q].q->scale[0] = saved;

  /* a missing Q/DQ pair */
  int d = qt_graph_find_node(c, "relu3.fq.dequantize");
  snprintf(c->nodes[d].name, sizeof c->nodes[d].name, "somewhere.else");
  r = check(p, c);
  if (r.ok || !strstr(r.reason, "relu3.fq")) qt_test_fail("missing pair not caught:\n%s", r.reason);
  snprintf(c->nodes[d].name, sizeof c->nodes[d].name, "relu3.fq.dequantize");

  /* an integer weight outside the range training used (PyTorch 1.13's 4-bit convert bug) */
  int f1 = qt_graph_find_node(c, "fc1");
  int32_t w0 = c->nodes[f1].wq->qweight[0];
  c->nodes[f1].wq->qweight[0] = 10;
  r = check(p, c);
  if (r.ok || !strstr(r.reason, "outside [-8, 7]")) qt_test_fail("out-of-range weight not caught:\n%s", r.reason);
  c->nodes[f1].wq->qweight[0] = w0;

  /* a folded bias off by 3 LSB of the next quantization point: only the numbers show it */
  int b2 = qt_graph_find_tensor(c, "conv2.bias");
  QT_CHECK(b2 >= 0);
  float *b2d = qt_graph_tensor_data(c, b2);
  float bkeep = b2d[0];
  b2d[0] += 3.0f * c->nodes[qt_graph_find_node(c, "relu2.fq.quantize")].q->scale[0];
  r = check(p, c);
  if (r.ok || !strstr(r.reason, "relu2.fq: ") || !strstr(r.reason, "differ"))
    qt_test_fail("a wrong bias was not caught numerically:\n%s", r.reason);
  b2d[0] = bkeep;

  /* BN folded with the wrong statistics: convert from a copy whose running_var differs */
  int rv = qt_graph_find_tensor(p, "conv2.bn.running_var");
  QT_CHECK(rv >= 0);
  float *rvd = qt_graph_tensor_data(p, rv);
  float keep = rvd[3];
  rvd[3] *= 1.5f;
  qt_graph *bad = qt_convert(p, err);
  rvd[3] = keep;
  r = check(p, bad);
  if (r.ok || !strstr(r.reason, "weight of conv2")) qt_test_fail("wrong BN statistics not caught:\n%s", r.reason);
  qt_graph_free(bad);
  qt_graph_free(c);
  qt_graph_free(p);

  /* a quantization point moved past a ReLU: the convert graph quantizes bn1's output (before
   * relu1) where training quantized relu1's. Build it from a training graph whose quantizer
   * put the point there, then compare with the real training graph. */
  qt_graph *g = qt_model_build("fashion_cnn", err);
  qt_graph_init_params(g, 11);
  qt_quantizer_config qc;
  qt_quantizer_config_default(&qc);
  qt_annotations a;
  qt_test_quantizer_onednn(g, &qc, QT_ISA_AUTO, &a, err);
  qt_graph *good = qt_prepare(g, &a, QT_PREPARE_PTQ, err);
  int relu1 = g->nodes[qt_graph_find_node(g, "relu1")].output, bn1 = g->nodes[qt_graph_find_node(g, "bn1")].output;
  a.act[relu1] = 0;
  a.act[bn1] = 1;
  a.act_spec[bn1] = a.act_spec[relu1];
  snprintf(g->values[bn1].name, sizeof g->values[bn1].name, "relu1"); /* same point name, earlier place */
  qt_graph *moved = qt_prepare(g, &a, QT_PREPARE_PTQ, err);
  QT_CHECK(good && moved);
  exercise(good, QT_PREPARE_PTQ);
  exercise(moved, QT_PREPARE_PTQ);
  qt_graph *cm = qt_convert(moved, err);
  r = check(good, cm);
  if (r.ok || !strstr(r.reason, "moved")) qt_test_fail("moved quantization point not caught:\n%s", r.reason);
  qt_graph_free(cm);
  qt_graph_free(moved);
  qt_graph_free(good);
  qt_annotations_free(&a);
  qt_graph_free(g);
}

static void shared_weight_refused(void) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_graph_create("shared");
  int x = qt_graph_input(g, "input", 8, 8, 4);
  int a = qt_graph_conv2d(g, "convA", x, 4, 3, 1, 1, 1, 0);
  a = qt_graph_batch_norm(g, "bnA", a);
  int b = qt_graph_conv2d(g, "convB", a, 4, 3, 1, 1, 1, 0);
  QT_CHECK(qt_graph_share_weight(g, qt_graph_find_node(g, "convB"), qt_graph_find_node(g, "convA")) == 0);
  b = qt_graph_batch_norm(g, "bnB", b);
  int y = qt_graph_global_avg_pool(g, "gap", b);
  QT_CHECK(qt_graph_finalize(g, y, err) == 0);
  qt_quantizer_config qc;
  qt_quantizer_config_default(&qc);
  qt_annotations an;
  QT_CHECK(qt_test_quantizer_onednn(g, &qc, QT_ISA_AUTO, &an, err) == 0);
  for (int mode = 0; mode < 2; mode++) {
    qt_graph *p = qt_prepare(g, &an, (qt_prepare_mode)mode, err);
    if (p || !strstr(err, "convA.weight") || !strstr(err, "shared")) {
      qt_test_fail("shared weight folding not refused (mode %d): %s", mode, p ? "prepared" : err);
      qt_graph_free(p);
    }
  }
  qt_annotations_free(&an);
  qt_graph_free(g);
}

static void nan_in_observer(void) {
  qt_graph *p = prepared_model("fashion_cnn", QT_PREPARE_PTQ, 8, 8, 1);

  qt_ctx *ctx = qt_ctx_create();
  qt_ctx_set_grad(ctx, 0);
  float *x = batch(3);
  x[100] = NAN;
  int64_t shape[4] = {N, 28, 28, 1};
  qt_graph_set_mode(p, QT_MODE_CALIBRATE);
  qt_tensor *y = qt_graph_forward(p, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, x));
  if (y || !strstr(p->error, "input.fq") || !strstr(p->error, "NaN"))
    qt_test_fail("NaN not reported naming the node: '%s'", p->error);
  free(x);
  qt_ctx_free(ctx);
  qt_graph_free(p);
}
/* QAT initialized from a calibration pass (quant.qat_init = calibration) with LSQ: while fake
 * quant is off every batch is observed and the learned scale follows the observer; once fake
 * quant is on (observers off) the scale is the trained parameter and is left alone. */
static void lsq_from_calibration(void) {
  qt_graph *p = prepared_model("fashion_cnn", QT_PREPARE_QAT, 4, 4, 1);
  int t = qt_graph_find_tensor(p, "relu1.fq.scale");
  QT_CHECK(t >= 0);
  if (t < 0) return;
  const qt_node *fq = &p->nodes[qt_graph_find_node(p, "relu1.fq")];
  qt_ctx *ctx = qt_ctx_create();
  qt_ctx_set_grad(ctx, 0);
  qt_graph_set_mode(p, QT_MODE_CALIBRATE);
  int64_t shape[4] = {N, 28, 28, 1};
  float first = 0;
  const float gain[3] = {1.0f, 3.0f, 0.5f}; /* batches of different ranges */
  for (int s = 0; s < 3; s++) {
    float *x = batch(200 + (uint64_t)s);
    for (int i = 0; i < N * 784; i++) x[i] *= gain[s];
    qt_ctx_reset(ctx);
    if (!qt_graph_forward(p, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, x)))
      qt_test_fail("calibration forward: %s", p->error);
    free(x);
    if (s == 0) first = qt_graph_tensor_data(p, t)[0];
  }
  float obs_scale;
  int32_t obs_zp;
  char err[QT_ERR_LEN];
  QT_CHECK(qt_observer_qparams(&fq->q->obs, fq->q->spec.qmin, fq->q->spec.qmax, 0, &obs_scale, &obs_zp, err) == 0);
  const float calibrated = qt_graph_tensor_data(p, t)[0];
  QT_CHECK(calibrated == obs_scale);
  if (calibrated == first) qt_test_fail("LSQ calibration: the scale stayed at the first batch's (%g)", first);
  /* training: observers off, fake quant on; a forward must not re-initialize the scale */
  qt_set_observers(p, 0);
  qt_graph_set_mode(p, QT_MODE_TRAIN);
  qt_graph_tensor_data(p, t)[0] = 0.75f * calibrated; /* as if an optimizer step moved it */
  float *x = batch(300);
  qt_ctx_reset(ctx);
  QT_CHECK(qt_graph_forward(p, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, x)) != NULL);
  free(x);
  QT_CHECK(qt_graph_tensor_data(p, t)[0] == 0.75f * calibrated && fq->q->scale[0] == 0.75f * calibrated);
  qt_ctx_free(ctx);
  qt_graph_free(p);
}


int main(void) {
  annotations();
  relu6_units();
  round_trip("fashion_cnn", QT_PREPARE_PTQ, 8, 8);
  round_trip("fashion_cnn", QT_PREPARE_QAT, 4, 8);
  round_trip("fashion_cnn", QT_PREPARE_QAT, 4, 4);
  round_trip("res_cnn", QT_PREPARE_QAT, 8, 8);
  round_trip("res_cnn", QT_PREPARE_PTQ, 3, 3);
  round_trip("fashion_mlp", QT_PREPARE_QAT, 2, 8);
  /* LSQ: scales are parameters that training moves; convert and check follow them */
  g_lsq = 1;
  round_trip("fashion_cnn", QT_PREPARE_QAT, 4, 4);
  round_trip("res_cnn", QT_PREPARE_QAT, 4, 8);
  lsq_moves_scales();
  lsq_from_calibration();
  g_lsq = 0;
  negatives();
  shared_weight_refused();
  nan_in_observer();
  return qt_test_finish();
}
