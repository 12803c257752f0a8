/* Quantizer, prepare, convert and the consistency check on FashionCNN and ResCNN:
 * - the onednn Quantizer's annotations (points, shared qparams, 7-bit weights without VNNI; a
 *   relu6 fused into its conv's unit, an fp32 op outside one; SiLU and hard swish fused into a
 *   quantized conv's or linear's unit, not sigmoid, not after an fp32 layer, none for XNNPACK;
 *   that QAT graph converts, passes the check and deploys with the fused units on oneDNN; with
 *   quant.fuse_add, ResCNN's conv -> bn -> add -> relu units, through QAT and PTQ and the check;
 *   with quant.fuse_gate, a squeeze-excite block's fc -> sigmoid -> mul unit; XNNPACK's fixed
 *   output qparams of sigmoid and tanh, kept through LSQ training and convert, run in int8);
 * - PTQ and QAT prepared graphs convert to Q/DQ graphs that pass the check;
 * - negative cases the check must catch: a changed scale, a missing Q/DQ pair, a quantization
 *   point moved past a ReLU, BN folded with the wrong statistics, an integer outside the range;
 * - folding a weight shared by two conv->BN chains is refused; NaN reaching an observer is an
 *   error naming the node;
 * - LSQ scales: trained and followed by convert; initialized from a whole calibration pass;
 * - int32 biases (quant.bias = int32, and XNNPACK's Quantizer): every quantized layer's bias
 *   (conv_bn: the folded one) becomes integers at s_x * s_w[c] within half a step of the float
 *   bias, the check passes and catches a changed integer bias, Q/DQ and prepared files keep them,
 *   and float biases are refused for XNNPACK. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qat/qat.h"
#include "tests/common/testutil.h"
#include "tests/common/quantizer_util.h"

enum { N = 16 };

static int g_lsq;        /* prepared_model: learnable scales */
static int g_bias_int32; /* prepared_model: int32 biases */
static int g_fuse_add;   /* prepared_model: quant.fuse_add */
static qt_lsq_weights g_lsq_weights;   /* prepared_model: which weights learn their scales */
static const char *g_overrides = ""; /* prepared_model: quant.layer_overrides */

static qt_graph *prepared_model(const char *model, qt_prepare_mode mode, int wbits, int abits, int vnni) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_model_build(model, err);
  qt_graph_init_params(g, 11);
  /* non-trivial BN statistics, so folding matters */
  for (int64_t i = 0; i < g->n_buffers; i++) g->buffers[i] = 0.3f + 0.2f * (float)(i % 7);
  qt_quantizer_config qc = qt_test_quantizer_config(wbits, abits);
  qc.weight_observer = mode == QT_PREPARE_QAT ? QT_OBSERVER_MOVING_AVERAGE : QT_OBSERVER_MINMAX;
  qc.learnable_scale = g_lsq;
  qc.learnable_weights = g_lsq_weights;
  if (qt_parse_overrides(&qc, g_overrides, err)) qt_test_fail("overrides %s: %s", g_overrides, err);
  qc.bias = g_bias_int32 ? QT_BIAS_INT32 : QT_BIAS_AUTO;
  qc.fuse_add = g_fuse_add;
  qt_annotations a;
  if (qt_test_quantizer_onednn(g, &qc, vnni ? QT_ISA_VNNI : QT_ISA_NO_VNNI, &a, err)) qt_test_fail("quantizer: %s", err);
  qt_graph *p = qt_prepare(g, &a, mode, err);
  if (!p) qt_test_fail("prepare %s: %s", model, err);
  qt_annotations_free(&a);
  qt_graph_free(g);
  return p;
}

static qt_check_report check(qt_graph *t, qt_graph *c) {
  char err[QT_ERR_LEN];
  qt_check_report r;
  float *x = qt_test_images(N, 7);
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
  /* "*" sets every layer without an override of its own: only conv1's unit quantized (its
   * input and its output the only points), and "*=w4" narrows every other layer's weights */
  QT_CHECK(qt_parse_overrides(&qc, "*=fp32;conv1=w8a8", err) == 0);
  QT_CHECK(qt_test_quantizer_onednn(g, &qc, QT_ISA_VNNI, &a, err) == 0);
  n_points = 0;
  for (int v = 0; v < g->n_values; v++) n_points += a.act[v];
  QT_CHECK(n_points == 2 && a.act[g->nodes[qt_graph_find_node(g, "relu1")].output]);
  QT_CHECK(a.weight[c1] && a.weight_spec[c1].qmin == -128);
  for (int i = 1; i < 4; i++) QT_CHECK(!a.weight[qt_graph_find_node(g, weights[i])]);
  qt_annotations_free(&a);
  QT_CHECK(qt_parse_overrides(&qc, "conv1=w8;*=w4", err) == 0);
  QT_CHECK(qt_test_quantizer_onednn(g, &qc, QT_ISA_VNNI, &a, err) == 0);
  QT_CHECK(a.weight_spec[c1].qmin == -128 && a.weight_spec[f2].qmin == -8 &&
           a.weight_spec[qt_graph_find_node(g, "conv2")].qmin == -8);
  qt_annotations_free(&a);
  /* patterns: "fc?=fp32" leaves fc1 and fc2 fp32; a layer's own name wins over a pattern, the
   * first matching pattern over a later one and over "*"; a pattern that matches no layer (or
   * only nodes that start no unit) is refused */
  QT_CHECK(qt_parse_overrides(&qc, "*=w4;fc?=fp32;conv[12]=w6;conv1=w8", err) == 0);
  QT_CHECK(qt_test_quantizer_onednn(g, &qc, QT_ISA_VNNI, &a, err) == 0);
  QT_CHECK(!a.weight[f2] && !a.weight[qt_graph_find_node(g, "fc1")] && a.weight_spec[c1].qmin == -128 &&
           a.weight_spec[qt_graph_find_node(g, "conv2")].qmin == -32);
  qt_annotations_free(&a);
  QT_CHECK(qt_parse_overrides(&qc, "block*=fp32", err) == 0);
  QT_CHECK(qt_test_quantizer_onednn(g, &qc, QT_ISA_VNNI, &a, err) != 0 && strstr(err, "'block*' matches no layer"));
  QT_CHECK(qt_parse_overrides(&qc, "bn*=fp32", err) == 0);
  QT_CHECK(qt_test_quantizer_onednn(g, &qc, QT_ISA_VNNI, &a, err) != 0 && strstr(err, "'bn*' matches no layer"));
  QT_CHECK(qt_parse_overrides(&qc, "*=fp32;*=w8", err) != 0 && strstr(err, "'*' is set twice"));
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

/* SiLU and hard swish after a quantized conv or linear join its unit on onednn_cpu (its
 * fused_act_kinds: the point after the activation, none on the layer's output), sigmoid does
 * not; an fp32 layer (an override) or XNNPACK's description fuses none. The QAT graph converts,
 * passes the check and deploys on oneDNN with no fallback partition, the fused units within 1
 * LSB of the float32 Q/DQ executor. */
static void fused_activation_units(void) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_graph_create("fused_acts");
  int x = qt_graph_input(g, "input", 28, 28, 1);
  x = qt_graph_conv2d(g, "conv1", x, 8, 3, 2, 1, 1, 0);
  x = qt_graph_batch_norm(g, "bn1", x);
  x = qt_graph_activation(g, "silu1", x, (qt_act){QT_ACT_SILU, 0, 0});
  x = qt_graph_conv2d(g, "conv2", x, 8, 3, 1, 1, 8, 0); /* depthwise */
  x = qt_graph_batch_norm(g, "bn2", x);
  x = qt_graph_activation(g, "hswish2", x, (qt_act){QT_ACT_HARDSWISH, 0, 0});
  x = qt_graph_conv2d(g, "conv3", x, 8, 1, 1, 0, 1, 1);
  x = qt_graph_activation(g, "sig3", x, (qt_act){QT_ACT_SIGMOID, 0, 0});
  x = qt_graph_flatten(g, "flatten", x);
  x = qt_graph_linear(g, "fc", x, 10, 1);
  x = qt_graph_activation(g, "silu4", x, (qt_act){QT_ACT_SILU, 0, 0});
  QT_ASSERT(qt_graph_finalize(g, x, err) == 0, "%s", err);
  qt_graph_init_params(g, 5);
  for (int64_t i = 0; i < g->n_buffers; i++) g->buffers[i] = 0.3f + 0.2f * (float)(i % 7);
  qt_quantizer_config qc = qt_test_quantizer_config(8, 8);
  qt_annotations a;
  QT_CHECK(qt_test_quantizer_onednn(g, &qc, QT_ISA_VNNI, &a, err) == 0);
#define N_(name) qt_graph_find_node(g, name)
#define V(name) g->nodes[N_(name)].output
  QT_CHECK(a.unit[N_("silu1")] == N_("conv1") && !a.act[V("bn1")] && a.act[V("silu1")]);
  QT_CHECK(a.unit[N_("hswish2")] == N_("conv2") && !a.act[V("bn2")] && a.act[V("hswish2")]);
  QT_CHECK(a.unit[N_("sig3")] == N_("sig3") && a.act[V("conv3")] && a.act[V("sig3")]);
  QT_CHECK(a.unit[N_("silu4")] == N_("fc") && !a.act[V("fc")] && a.act[V("silu4")]);
  /* the unit's point after the activation, through prepare (QAT), training steps and convert */
  qt_graph *p = qt_prepare(g, &a, QT_PREPARE_QAT, err);
  qt_annotations_free(&a);
  QT_ASSERT(p, "prepare: %s", err);
  qt_test_exercise(p, QT_PREPARE_QAT, N);
  qt_graph *c = qt_convert(p, err);
  QT_ASSERT(c, "convert: %s", err);
  qt_check_report r = check(p, c);
  if (!r.ok || r.max_lsb > 1.0)
    qt_test_fail("fused activations: check %s, max %.2f LSB:\n%s", r.ok ? "ok" : "failed", r.max_lsb, r.reason);
  qt_device *m = qt_device_open(c, NULL, err);
  QT_ASSERT(m, "%s", err);
  int fused = 0;
  for (int k = 0; k < qt_device_partition_count(m); k++) {
    const char *nodes, *detail;
    qt_device_partition(m, k, &nodes, &detail);
    fused += strstr(detail, "in f32 -> u8") != NULL;
  }
  if (fused != 3 || qt_device_count(m, QT_PART_FALLBACK) != 0) {
    qt_test_fail("fused activations: %d fused partitions (want 3), %d fallbacks", fused,
                 qt_device_count(m, QT_PART_FALLBACK));
    qt_device_report(m, stderr);
  }
  float *xb = qt_test_images(N, 9);
  qt_test_device_near_qdq("fused activations", m, c, xb, N);
  free(xb);
  qt_device_free(m);
  qt_graph_free(c);
  qt_graph_free(p);
  /* an fp32 conv1 keeps its SiLU out of its unit; XNNPACK fuses none */
  QT_CHECK(qt_parse_overrides(&qc, "conv1=fp32", err) == 0);
  QT_CHECK(qt_test_quantizer_onednn(g, &qc, QT_ISA_VNNI, &a, err) == 0);
  QT_CHECK(a.unit[N_("silu1")] == N_("silu1"));
  qt_annotations_free(&a);
  qc = qt_test_quantizer_config(8, 8);
  qt_backend_desc d;
  qt_backend_desc_xnnpack(&d);
  QT_CHECK(qt_quantizer(g, &d, &qc, &a, err) == 0);
  QT_CHECK(a.unit[N_("silu1")] == N_("silu1") && a.act[V("bn1")] && a.unit[N_("silu4")] == N_("silu4"));
  qt_annotations_free(&a);
#undef N_
#undef V
  qt_graph_free(g);
}

/* XNNPACK's Quantizer gives sigmoid's and tanh's outputs the fixed qparams of its qs8 operators
 * (1/256, -128 and 1/128, 0 at 8 bits; 1/16, -8 and 1/8, 0 at 4), even with LSQ: no learned
 * scale, unchanged by training's observers and by convert. At 8 bits XNNPACK runs both in int8
 * within 1 LSB of the Q/DQ graph; at 4 bits it runs them as fallbacks, naming the output scale.
 * onednn_cpu's Quantizer observes them. */
static void fixed_act_qparams(int abits) {
  char err[QT_ERR_LEN], what[32];
  snprintf(what, sizeof what, "fixed qparams A%d", abits);
  qt_graph *g = qt_graph_create("fixed_acts");
  int x = qt_graph_input(g, "input", 28, 28, 1);
  x = qt_graph_conv2d(g, "conv1", x, 8, 3, 2, 1, 1, 1);
  x = qt_graph_activation(g, "sig", x, (qt_act){QT_ACT_SIGMOID, 0, 0});
  x = qt_graph_conv2d(g, "conv2", x, 8, 3, 1, 1, 1, 1);
  x = qt_graph_activation(g, "tanh", x, (qt_act){QT_ACT_TANH, 0, 0});
  x = qt_graph_flatten(g, "flatten", x);
  x = qt_graph_linear(g, "fc", x, 10, 1);
  QT_ASSERT(qt_graph_finalize(g, x, err) == 0, "%s", err);
  qt_graph_init_params(g, 3);
  qt_quantizer_config qc = qt_test_quantizer_config(8, abits);
  qc.learnable_scale = 1;
  qt_annotations a;
  const int sig = g->nodes[qt_graph_find_node(g, "sig")].output, th = g->nodes[qt_graph_find_node(g, "tanh")].output;
  QT_CHECK(qt_test_quantizer_onednn(g, &qc, QT_ISA_VNNI, &a, err) == 0);
  QT_CHECK(a.act[sig] && a.act_spec[sig].fixed_scale == 0 && a.act_spec[sig].learnable);
  qt_annotations_free(&a);
  qt_backend_desc d;
  qt_backend_desc_xnnpack(&d);
  QT_ASSERT(qt_quantizer(g, &d, &qc, &a, err) == 0, "%s", err);
  const float want_s[2] = {ldexpf(1.0f, -abits), ldexpf(1.0f, 1 - abits)};
  const int want_z[2] = {-(1 << (abits - 1)), 0};
  for (int k = 0; k < 2; k++) {
    const qt_qspec *s = &a.act_spec[k ? th : sig];
    if (!a.act[k ? th : sig] || s->fixed_scale != want_s[k] || s->fixed_zero_point != want_z[k] || s->learnable)
      qt_test_fail("%s: %s's spec: point %d, fixed %g, %d, learnable %d (want %g, %d, 0)", what, k ? "tanh" : "sigmoid",
                   a.act[k ? th : sig], s->fixed_scale, s->fixed_zero_point, s->learnable, want_s[k], want_z[k]);
  }
  qt_graph *p = qt_prepare(g, &a, QT_PREPARE_QAT, err);
  qt_annotations_free(&a);
  QT_ASSERT(p, "prepare: %s", err);
  qt_test_exercise(p, QT_PREPARE_QAT, N);
  qt_graph *c = qt_convert(p, err);
  QT_ASSERT(c, "convert: %s", err);
  for (int k = 0; k < 2; k++) {
    char fq[32], quantize[48];
    snprintf(fq, sizeof fq, "%s.fq", k ? "tanh" : "sig");
    snprintf(quantize, sizeof quantize, "%s.quantize", fq);
    const int ip = qt_graph_find_node(p, fq), ic = qt_graph_find_node(c, quantize);
    QT_ASSERT(ip >= 0 && ic >= 0, "%s: no %s in the prepared graph or no %s in the converted one", what, fq, quantize);
    const qt_qstate *qp = p->nodes[ip].q, *qq = c->nodes[ic].q;
    if (qp->scale_param >= 0 || qp->scale[0] != want_s[k] || qp->zero_point[0] != want_z[k] ||
        qq->scale[0] != want_s[k] || qq->zero_point[0] != want_z[k])
      qt_test_fail("%s: after training, %s: LSQ %d, scale %g, zp %d; converted %g, %d (want %g, %d)", what,
                   k ? "tanh" : "sigmoid", qp->scale_param, qp->scale[0], qp->zero_point[0], qq->scale[0],
                   qq->zero_point[0], want_s[k], want_z[k]);
  }
  qt_check_report r = check(p, c);
  if (!r.ok) qt_test_fail("%s: check failed: %s", what, r.reason);
  qt_device *m = qt_device_open(c, &d, err);
  QT_ASSERT(m, "%s", err);
  for (int k = 0; k < 2; k++) {
    const char *reason = NULL;
    const int on = qt_device_node_on_backend(m, k ? "tanh" : "sig", &reason);
    if (abits == 8 ? on != 1 : on != 0 || !reason || !strstr(reason, "takes only an output scale of 1/"))
      qt_test_fail("%s: %s on the backend: %d (%s)", what, k ? "tanh" : "sigmoid", on, reason ? reason : "");
  }
  float *xb = qt_test_images(N, 9);
  qt_test_device_near_qdq(what, m, c, xb, N);
  free(xb);
  qt_device_free(m);
  qt_graph_free(c);
  qt_graph_free(p);
  qt_graph_free(g);
}

/* XNNPACK's Quantizer refuses qc, naming the setting `key` and the backend. */
static void xnnpack_refuses(const qt_graph *g, const qt_quantizer_config *qc, const char *key) {
  char err[QT_ERR_LEN];
  qt_backend_desc d;
  qt_backend_desc_xnnpack(&d);
  qt_annotations a;
  if (qt_quantizer(g, &d, qc, &a, err) == 0) {
    qt_test_fail("%s: XNNPACK's Quantizer accepted it", key);
    qt_annotations_free(&a);
  } else if (!strstr(err, key) || !strstr(err, "xnnpack")) {
    qt_test_fail("%s: XNNPACK's refusal does not name it and the backend: %s", key, err);
  }
}

/* quant.fuse_add on ResCNN: each block's conv2 -> bn2 -> add -> relu2 is one unit (no point on
 * bn2's output; the add's other input, stem.relu / down.relu, a point); an add left fp32 by an
 * override of its own is not fused; a backend without conv_add (XNNPACK) refuses the setting. */
static void fused_add_units(void) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_model_build("res_cnn", err);
#define N_(name) qt_graph_find_node(g, name)
#define V(name) g->nodes[N_(name)].output
  qt_quantizer_config qc = qt_test_quantizer_config(8, 8);
  qc.fuse_add = 1;
  qt_annotations a;
  QT_CHECK(qt_test_quantizer_onednn(g, &qc, QT_ISA_VNNI, &a, err) == 0);
  QT_CHECK(a.unit[N_("block1.add")] == N_("block1.conv2") && a.unit[N_("block1.relu2")] == N_("block1.conv2"));
  QT_CHECK(a.unit[N_("block2.add")] == N_("block2.conv2") && a.unit[N_("block2.relu2")] == N_("block2.conv2"));
  QT_CHECK(!a.act[V("block1.bn2")] && !a.act[V("block1.add")] && a.act[V("block1.relu2")] && a.act[V("stem.relu")]);
  QT_CHECK(!a.act[V("block2.bn2")] && a.act[V("block2.relu2")] && a.act[V("down.relu")]);
  qt_annotations_free(&a);
  QT_CHECK(qt_parse_overrides(&qc, "block1.add=fp32", err) == 0);
  QT_CHECK(qt_test_quantizer_onednn(g, &qc, QT_ISA_VNNI, &a, err) == 0);
  QT_CHECK(a.unit[N_("block1.add")] == N_("block1.add") && a.act[V("block1.bn2")]);
  QT_CHECK(a.unit[N_("block2.add")] == N_("block2.conv2"));
  qt_annotations_free(&a);
  qc = qt_test_quantizer_config(8, 8);
  QT_CHECK(qt_test_quantizer_onednn(g, &qc, QT_ISA_VNNI, &a, err) == 0); /* off by default */
  QT_CHECK(a.unit[N_("block1.add")] == N_("block1.add") && a.act[V("block1.bn2")]);
  qt_annotations_free(&a);
  qc.fuse_add = 1;
  xnnpack_refuses(g, &qc, "quant.fuse_add");
#undef N_
#undef V
  qt_graph_free(g);
}

/* quant.fuse_gate on a squeeze-excite block (conv -> relu -> pool -> fc -> sigmoid -> mul(relu,
 * .)): fc, the sigmoid and the mul one unit (no point on fc's or the sigmoid's output, the mul's
 * other input a point); off by default; an fp32 override on the mul keeps it out; XNNPACK refuses
 * the setting. */
static void fused_gate_units(void) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_graph_create("se");
  int x = qt_graph_input(g, "input", 6, 6, 3);
  x = qt_graph_relu(g, "relu", qt_graph_conv2d(g, "conv", x, 8, 3, 1, 1, 1, 1));
  int z = qt_graph_linear(g, "fc", qt_graph_global_avg_pool(g, "pool", x), 8, 1);
  z = qt_graph_activation(g, "sig", z, (qt_act){QT_ACT_SIGMOID, 0.0f, 0.0f});
  int y = qt_graph_mul(g, "mul", x, z);
  y = qt_graph_linear(g, "head", qt_graph_flatten(g, "flatten", y), 10, 1);
  QT_ASSERT(qt_graph_finalize(g, y, err) == 0, "%s", err);
#define N_(name) qt_graph_find_node(g, name)
#define V(name) g->nodes[N_(name)].output
  qt_quantizer_config qc = qt_test_quantizer_config(8, 8);
  qc.fuse_gate = 1;
  qt_annotations a;
  QT_CHECK(qt_test_quantizer_onednn(g, &qc, QT_ISA_VNNI, &a, err) == 0);
  QT_CHECK(a.unit[N_("sig")] == N_("fc") && a.unit[N_("mul")] == N_("fc"));
  QT_CHECK(!a.act[V("fc")] && !a.act[V("sig")] && a.act[V("mul")] && a.act[V("relu")] && a.act[V("pool")]);
  qt_annotations_free(&a);
  QT_CHECK(qt_parse_overrides(&qc, "mul=fp32", err) == 0);
  QT_CHECK(qt_test_quantizer_onednn(g, &qc, QT_ISA_VNNI, &a, err) == 0);
  QT_CHECK(a.unit[N_("mul")] == N_("mul") && a.act[V("fc")]);
  qt_annotations_free(&a);
  qc = qt_test_quantizer_config(8, 8);
  QT_CHECK(qt_test_quantizer_onednn(g, &qc, QT_ISA_VNNI, &a, err) == 0); /* off by default */
  QT_CHECK(a.unit[N_("mul")] == N_("mul") && a.act[V("fc")] && a.act[V("sig")]);
  qt_annotations_free(&a);
  qc.fuse_gate = 1;
  xnnpack_refuses(g, &qc, "quant.fuse_gate");
#undef N_
#undef V
  qt_graph_free(g);
}

/* qt_lost_weight_channels: none in a sane convert graph (2 bits included); a channel whose integers
 * were all set to its zero point, and one whose scale was blown up (a diverged LSQ scale), are
 * counted and named. Modifies c. */
static void lost_channels(qt_graph *c, const char *model, int wbits) {
  char detail[1024];
  const int none = qt_lost_weight_channels(c, detail, sizeof detail);
  if (none != 0) qt_test_fail("%s W%d: %d lost weight channels in a sane graph:\n%s", model, wbits, none, detail);
  qt_node *n = NULL;
  for (int i = 0; i < c->n_nodes && !n; i++)
    if (c->nodes[i].wq && c->nodes[i].wq->qweight && c->nodes[i].wq->channels >= 2) n = &c->nodes[i];
  if (!n) return; /* no per-channel weights (fashion_mlp's per-tensor linear weights) */
  qt_qstate *q = n->wq;
  const int64_t inner = q->n_qweight / q->channels;
  for (int64_t k = 0; k < inner; k++) q->qweight[inner + k] = q->zero_point[1]; /* channel 1: all zero point */
  q->scale[0] *= 1e4f;                                                             /* channel 0: scale diverged */
  const int lost = qt_lost_weight_channels(c, detail, sizeof detail);
  if (lost != 2) qt_test_fail("%s W%d: %d lost weight channels, want 2:\n%s", model, wbits, lost, detail);
  if (!strstr(detail, n->name) || !strstr(detail, "2 of ")) qt_test_fail("%s: lost channels detail: %s", model, detail);
}

static void round_trip(const char *model, qt_prepare_mode mode, int wbits, int abits) {
  char err[QT_ERR_LEN];
  qt_graph *p = prepared_model(model, mode, wbits, abits, 0);
  if (!p) return;
  qt_test_exercise(p, mode, N);
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
  lost_channels(c, model, wbits);
  qt_graph_free(c);
  qt_graph_free(p);
}

static void lsq_moves_scales(void) {
  qt_graph *p = prepared_model("fashion_cnn", QT_PREPARE_QAT, 4, 4, 1);
  qt_test_exercise(p, QT_PREPARE_QAT, N); /* first forward initializes, later steps train */
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

/* learnable_weights: with LSQ, which weight quantizers get a learned scale, by each layer's own
 * bits (conv1 at 4 through an override, the others at the model's 8); activations learn theirs
 * whatever it says. */
static void lsq_weight_choice(void) {
  static const struct {
    qt_lsq_weights choice;
    int conv1, conv2;
  } cases[] = {{QT_LSQ_WEIGHTS_ALL, 1, 1}, {QT_LSQ_WEIGHTS_BELOW_8, 1, 0}, {QT_LSQ_WEIGHTS_NONE, 0, 0}};
  g_lsq = 1;
  g_overrides = "conv1=w4";
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    g_lsq_weights = cases[k].choice;
    qt_graph *p = prepared_model("fashion_cnn", QT_PREPARE_QAT, 8, 8, 1);
    const int w1 = qt_graph_find_tensor(p, "conv1.weight_scale"), w2 = qt_graph_find_tensor(p, "conv2.weight_scale");
    const int a = qt_graph_find_tensor(p, "relu1.fq.scale");
    const qt_node *c2 = &p->nodes[qt_graph_find_node(p, "conv2")];
    if ((w1 >= 0) != cases[k].conv1 || (w2 >= 0) != cases[k].conv2 || a < 0 || c2->wq->spec.learnable != cases[k].conv2)
      qt_test_fail("learnable_weights %d: conv1 (4-bit) scale %s, conv2 (8-bit) %s, relu1.fq %s", (int)cases[k].choice,
                   w1 >= 0 ? "learned" : "observed", w2 >= 0 ? "learned" : "observed", a >= 0 ? "learned" : "observed");
    if (cases[k].choice == QT_LSQ_WEIGHTS_BELOW_8) {
      /* the observed 8-bit weights and the learned 4-bit ones train, convert and check alike */
      qt_test_exercise(p, QT_PREPARE_QAT, N);
      char err[QT_ERR_LEN];
      qt_graph *c = qt_convert(p, err);
      if (!c) qt_test_fail("convert: %s", err);
      qt_check_report r = check(p, c);
      if (!r.ok) qt_test_fail("learnable_weights below 8: check failed:\n%s", r.reason);
      qt_graph_free(c);
    }
    qt_graph_free(p);
  }
  g_lsq = 0;
  g_lsq_weights = QT_LSQ_WEIGHTS_ALL;
  g_overrides = "";
}

static void negatives(void) {
  char err[QT_ERR_LEN];
  qt_graph *p = prepared_model("fashion_cnn", QT_PREPARE_QAT, 4, 4, 1);
  qt_test_exercise(p, QT_PREPARE_QAT, N);
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
  qt_test_exercise(good, QT_PREPARE_PTQ, N);
  qt_test_exercise(moved, QT_PREPARE_PTQ, N);
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
  float *x = qt_test_images(N, 3);
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
    float *x = qt_test_images(N, 200 + (uint64_t)s);
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
  float *x = qt_test_images(N, 300);
  qt_ctx_reset(ctx);
  QT_CHECK(qt_graph_forward(p, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, x)) != NULL);
  free(x);
  QT_CHECK(qt_graph_tensor_data(p, t)[0] == 0.75f * calibrated && fq->q->scale[0] == 0.75f * calibrated);
  qt_ctx_free(ctx);
  qt_graph_free(p);
}


/* The int32 biases of convert graph c: one per output channel of every quantized layer with a
 * bias, each within half a step (s_x * s_w[c], s_x from the layer's input dequantize; plus
 * float32 rounding) of the float bias c keeps for audits. Returns the number of layers with an integer bias. */
static int int32_biases_ok(qt_graph *c, const char *what) {
  int layers = 0;
  for (int i = 0; i < c->n_nodes; i++) {
    const qt_node *n = &c->nodes[i];
    if (!n->wq || n->param[QT_P_BIAS] < 0) continue;
    if (!n->wq->spec.bias_int32 || !n->wq->qbias) {
      qt_test_fail("%s: %s has a bias but no integer bias", what, n->name);
      continue;
    }
    layers++;
    const int src = qt_graph_quant_source(c, n->inputs[0]);
    QT_CHECK(src >= 0 && c->nodes[src].op == QT_OP_DEQUANTIZE);
    if (src < 0) continue;
    const float *b = qt_graph_tensor_data(c, n->param[QT_P_BIAS]);
    int nonzero = 0;
    for (int o = 0; o < n->attr.out_channels; o++) {
      const double s = (double)c->nodes[src].q->scale[0] * (double)n->wq->scale[n->wq->channels == 1 ? 0 : o];
      const double err = fabs((double)n->wq->qbias[o] * s - (double)b[o]);
      /* half a step, plus what float32 costs at |q| (the formula forms b * (1 / s) and the
       * scale s_x * s_w in float32: 2^-22 of |q| covers both) */
      if (err > s * (0.5 + fabs((double)n->wq->qbias[o]) * 0x1p-22))
        qt_test_fail("%s: %s channel %d: integer bias %d x %.9g is %.3g from the float bias %.9g", what, n->name, o,
                     n->wq->qbias[o], s, err, (double)b[o]);
      nonzero += n->wq->qbias[o] != 0;
    }
    QT_CHECK(nonzero > 0);
  }
  return layers;
}

static void int32_bias(void) {
  char err[QT_ERR_LEN];
  g_bias_int32 = 1;
  const struct { const char *model; qt_prepare_mode mode; int w, a, lsq, layers; } cases[] = {
      {"fashion_cnn", QT_PREPARE_PTQ, 8, 8, 0, 4}, /* BN folded at prepare: conv biases */
      {"res_cnn", QT_PREPARE_QAT, 8, 8, 0, 5},     /* conv_bn: the folded bias at convert */
      {"fashion_cnn", QT_PREPARE_QAT, 4, 4, 1, 4}, /* LSQ: the derived scale follows learned scales */
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    g_lsq = cases[k].lsq;
    qt_graph *p = prepared_model(cases[k].model, cases[k].mode, cases[k].w, cases[k].a, 1);
    for (int i = 0; i < p->n_nodes; i++)
      if (p->nodes[i].wq) QT_CHECK(p->nodes[i].wq->spec.bias_int32 == 1);
    qt_test_exercise(p, cases[k].mode, N);
    qt_graph *c = qt_convert(p, err);
    if (!c) {
      qt_test_fail("convert %s: %s", cases[k].model, err);
      qt_graph_free(p);
      continue;
    }
    char what[64];
    snprintf(what, sizeof what, "%s W%dA%d int32 bias", cases[k].model, cases[k].w, cases[k].a);
    const int layers = int32_biases_ok(c, what);
    if (layers < cases[k].layers) qt_test_fail("%s: %d layers with integer biases, want >= %d", what, layers, cases[k].layers);
    qt_check_report r = check(p, c);
    if (!r.ok) qt_test_fail("%s: check failed:\n%s", what, r.reason);
    /* the Q/DQ file and the prepared file keep them */
    QT_CHECK(qt_qdq_save("int32_bias_qdq.h5", c, err) == 0);
    qt_graph *l = qt_qdq_load("int32_bias_qdq.h5", err);
    if (!l) qt_test_fail("%s: reload: %s", what, err);
    for (int i = 0; l && i < c->n_nodes; i++) {
      const qt_qstate *a = c->nodes[i].wq, *b = l->nodes[i].wq;
      if (!a) continue;
      QT_CHECK(b && b->spec.bias_int32 == a->spec.bias_int32 && b->n_qbias == a->n_qbias);
      if (b && a->qbias && b->qbias) QT_CHECK(memcmp(a->qbias, b->qbias, (size_t)a->n_qbias * sizeof(int32_t)) == 0);
    }
    qt_graph_free(l);
    qt_set_fake_quant(p, 1);
    QT_CHECK(qt_qdq_save("int32_bias_prepared.h5", p, err) == 0);
    l = qt_qdq_load("int32_bias_prepared.h5", err);
    if (!l) qt_test_fail("%s: reload prepared: %s", what, err);
    for (int i = 0; l && i < p->n_nodes; i++)
      if (p->nodes[i].wq) QT_CHECK(l->nodes[i].wq && l->nodes[i].wq->spec.bias_int32 && !l->nodes[i].wq->qbias);
    qt_graph_free(l);
    /* the check catches an integer bias that is not the trained one */
    for (int i = 0; i < c->n_nodes; i++)
      if (c->nodes[i].wq && c->nodes[i].wq->qbias) {
        c->nodes[i].wq->qbias[0] += 3;
        break;
      }
    r = check(p, c);
    if (r.ok || !strstr(r.reason, "integers differ from quantizing the trained bias"))
      qt_test_fail("%s: a changed integer bias passed the check (%s)", what, r.reason);
    qt_graph_free(c);
    qt_graph_free(p);
  }
  g_lsq = 0;
  g_bias_int32 = 0;
  /* XNNPACK: int32 biases chosen without asking, float ones refused */
  qt_graph *g = qt_model_build("fashion_cnn", err);
  qt_backend_desc d;
  qt_backend_desc_xnnpack(&d);
  qt_quantizer_config qc = qt_test_quantizer_config(8, 8);
  qt_annotations a;
  QT_CHECK(qt_quantizer(g, &d, &qc, &a, err) == 0);
  for (int i = 0; i < g->n_nodes; i++)
    if (a.weight[i]) QT_CHECK(a.weight_spec[i].bias_int32 == 1);
  qt_annotations_free(&a);
  qc.bias = QT_BIAS_FLOAT;
  QT_CHECK(qt_quantizer(g, &d, &qc, &a, err) == -1 && strstr(err, "int32 biases only"));
  /* oneDNN: float unless asked */
  qc.bias = QT_BIAS_AUTO;
  QT_CHECK(qt_test_quantizer_onednn(g, &qc, QT_ISA_VNNI, &a, err) == 0);
  for (int i = 0; i < g->n_nodes; i++) QT_CHECK(a.weight_spec[i].bias_int32 == 0);
  qt_annotations_free(&a);
  qt_graph_free(g);
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
  fused_activation_units();
  fused_add_units();
  fused_gate_units();
  fixed_act_qparams(8);
  fixed_act_qparams(4);
  g_fuse_add = 1; /* the conv + add units through QAT and PTQ, convert and the check */
  round_trip("res_cnn", QT_PREPARE_QAT, 4, 8);
  round_trip("res_cnn", QT_PREPARE_PTQ, 8, 8);
  g_fuse_add = 0;
  /* LSQ: scales are parameters that training moves; convert and check follow them */
  g_lsq = 1;
  round_trip("fashion_cnn", QT_PREPARE_QAT, 4, 4);
  round_trip("res_cnn", QT_PREPARE_QAT, 4, 8);
  lsq_moves_scales();
  lsq_from_calibration();
  g_lsq = 0;
  lsq_weight_choice();
  negatives();
  shared_weight_refused();
  nan_in_observer();
  int32_bias();
  return qt_test_finish();
}
