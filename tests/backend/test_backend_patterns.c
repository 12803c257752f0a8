/* Each lowered pattern against the Q/DQ reference interpreter (qt_graph_forward) on random
 * data: dq -> conv [-> relu | relu6] -> q (input zero point, padding, stride, output zero point, a
 * 4-bit output range, relu6 into a 4-bit range narrower than 6; grouped and depthwise convs too), dq -> flatten ->
 * linear [-> relu | relu6] -> q (folded input zero point, f32 requantization for an output zero point), conv / linear
 * -> activation -> q (SiLU, hard swish, sigmoid, GELU on the layer's f32 output), max pooling on u8, a fallback
 * partition (average pooling), conv -> add(dq(r)) [-> relu | relu6] -> q (quant.fuse_add's unit), linear -> sigmoid /
 * hard sigmoid -> mul(dq(r), .) -> q (quant.fuse_gate's squeeze-excite unit), FashionCNN and ResCNN
 * (with and without quant.fuse_add) converted end to end (W8A8 and W4A4), batch sizes changing between runs, and
 * a prepared graph refused. Int8 partitions: at most 1 output LSB with realistic scales, 0 with power-of-two scales and
 * small integers (exact arithmetic); max pooling and fallbacks: identical. */
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

/* ---- building small Q/DQ graphs ----------------------------------------------------------- */

static qt_qstate *act_state(float scale, int zp, int qmax) {
  qt_qspec s;
  memset(&s, 0, sizeof s);
  s.bits = qmax == 255 ? 8 : qmax == 15 ? 4 : 8;
  s.qmin = 0;
  s.qmax = qmax;
  s.observer = QT_OBSERVER_MOVING_AVERAGE;
  return qt_test_qstate(&s, 1, scale, zp);
}

/* Appends quantize -> dequantize (range [0, qmax]) after x; returns the dequantized value. */
static int qdq(qt_graph *g, const char *prefix, int x, float scale, int zp, int qmax) {
  return qt_test_append_qdq(g, prefix, x, act_state(scale, zp, qmax), act_state(scale, zp, qmax));
}

static uint64_t rng_state = 12345;
static uint32_t rnd(void) {
  rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
  return (uint32_t)(rng_state >> 33);
}
static float rnd_uniform(float lo, float hi) { return lo + (hi - lo) * (float)(rnd() & 0xffffff) / 16777216.0f; }

/* Integer weights in [-wmax, wmax] (s8 per-channel symmetric) with per-channel scales; the
 * bias, if any, random (or, exact, an integer multiple of s_x * s_w[c]). */
static void quantize_weights(qt_graph *g, const char *name, int wmax, float s_x, int exact) {
  char err[QT_ERR_LEN];
  qt_node *n = &g->nodes[qt_graph_find_node(g, name)];
  const qt_param *w = &g->tensors[n->param[QT_P_WEIGHT]];
  const int OC = (int)w->shape[0];
  qt_qspec s;
  memset(&s, 0, sizeof s);
  s.bits = 8;
  s.is_signed = 1;
  s.qmin = -128;
  s.qmax = 127;
  s.symmetric = 1;
  s.per_channel = 1;
  s.observer = QT_OBSERVER_MINMAX;
  n->wq = qt_qstate_create(&s, OC, err);
  QT_ASSERT(n->wq, "%s", err);
  n->wq->n_qweight = w->numel;
  n->wq->qweight = malloc((size_t)w->numel * sizeof(int32_t));
  for (int64_t k = 0; k < w->numel; k++) n->wq->qweight[k] = (int32_t)(rnd() % (2 * wmax + 1)) - wmax;
  float *b = n->param[QT_P_BIAS] >= 0 ? qt_graph_tensor_data(g, n->param[QT_P_BIAS]) : NULL;
  for (int c = 0; c < OC; c++) {
    n->wq->scale[c] = exact ? ldexpf(1.0f, -6 - (int)(rnd() % 3)) : rnd_uniform(0.002f, 0.02f);
    if (b) b[c] = exact ? (float)((int)(rnd() % 401) - 200) * s_x * n->wq->scale[c] : rnd_uniform(-0.5f, 0.5f);
  }
  n->wq->calibrated = 1;
  n->wq->observe = 0;
}

/* Calibrates every quantize after the first (the graph input's) from the range its input
 * takes on x, in order (affine, [0, qmax]); exact: the scale rounded up to a power of two. */
static void calibrate(qt_graph *g, const float *x, int n, int exact) {
  qt_ctx *ctx = qt_ctx_create();
  const qt_value *in = &g->values[g->input];
  const int64_t shape[4] = {n, in->shape[0], in->shape[1], in->shape[2]};
  int first = 1;
  for (int i = 0; i < g->n_nodes; i++) {
    qt_node *q = &g->nodes[i];
    if (q->op != QT_OP_QUANTIZE) continue;
    if (first) {
      first = 0;
      continue;
    }
    qt_ctx_reset(ctx);
    qt_tensor **vals;
    QT_ASSERT(qt_graph_forward_values(g, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, (void *)x), &vals), "%s", g->error);
    const qt_tensor *v = vals[q->inputs[0]];
    float lo = 0, hi = 0;
    for (int64_t k = 0; k < qt_tensor_numel(v); k++) {
      lo = fminf(lo, qt_f32(v)[k]);
      hi = fmaxf(hi, qt_f32(v)[k]);
    }
    const int qmax = q->q->spec.qmax;
    float s = fmaxf(hi - lo, 1e-3f) / (float)qmax;
    if (exact) s = ldexpf(1.0f, (int)ceilf(log2f(s)));
    int zp = (int)nearbyintf(-lo / s);
    if (zp > qmax) zp = qmax;
    qt_node *d = &g->nodes[q->output + 1]; /* qdq() appends the pair together */
    QT_ASSERT(d->op == QT_OP_DEQUANTIZE, "pair of %s", q->name);
    q->q->scale[0] = d->q->scale[0] = s;
    q->q->zero_point[0] = d->q->zero_point[0] = zp;
  }
  qt_ctx_free(ctx);
}

static float *random_input(const qt_graph *g, int n, float lo, float hi) {
  const int64_t numel = n * g->values[g->input].shape[0] * g->values[g->input].shape[1] * g->values[g->input].shape[2];
  float *x = malloc((size_t)numel * sizeof(float));
  for (int64_t i = 0; i < numel; i++) x[i] = rnd_uniform(lo, hi);
  return x;
}

/* Output LSB: the scale of the final dequantize, or 0 when the output is fp32. */
static float output_lsb(const qt_graph *g) {
  const qt_node *o = &g->nodes[g->values[g->output].producer];
  return o->op == QT_OP_DEQUANTIZE ? o->q->scale[0] : 0.0f;
}

/* Lowers g, runs both on x; checks the partition counts and max_lsb (0: bit-identical).
 * Returns the max difference in LSB (absolute for fp32 outputs). */
static double compare(const char *what, qt_graph *g, const float *x, int n, int want_int8, int want_fallback,
                      double max_lsb) {
  char err[QT_ERR_LEN];
  qt_graph_set_mode(g, QT_MODE_EVAL);
  qt_device *m = qt_device_open(g, NULL, err);
  if (!m) {
    qt_test_fail("%s: lower: %s", what, err);
    return 1e9;
  }
  if ((want_int8 >= 0 && qt_device_count(m, QT_PART_INT8) != want_int8) ||
      qt_device_count(m, QT_PART_FALLBACK) != want_fallback) {
    qt_test_fail("%s: %d int8 / %d fallback partitions, want %d / %d", what, qt_device_count(m, QT_PART_INT8),
                 qt_device_count(m, QT_PART_FALLBACK), want_int8, want_fallback);
    qt_device_report(m, stderr);
  }
  const int64_t on = qt_device_output_numel(m) * n;
  float *got = malloc((size_t)on * sizeof(float));
  if (qt_device_run(m, got, x, n, err)) qt_test_fail("%s: run: %s", what, err);
  qt_ctx *ctx = qt_ctx_create();
  const qt_value *in = &g->values[g->input];
  const int64_t shape[4] = {n, in->shape[0], in->shape[1], in->shape[2]};
  qt_tensor *y = qt_graph_forward(g, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, (void *)x));
  QT_ASSERT(y && qt_tensor_numel(y) == on, "%s: reference forward: %s", what, g->error);
  const float lsb = output_lsb(g);
  double worst = 0;
  int64_t bad = 0, diff = 0;
  for (int64_t i = 0; i < on; i++) {
    double d = fabs((double)got[i] - (double)qt_f32(y)[i]);
    if (lsb > 0) d /= lsb;
    if (d > 0) diff++;
    if (d > max_lsb + 1e-4) {
      if (bad++ < 5)
        fprintf(stderr, "%s: element %lld: lowered %.7g, Q/DQ %.7g (%.3g %s)\n", what, (long long)i, got[i],
                qt_f32(y)[i], d, lsb > 0 ? "LSB" : "abs");
    }
    if (d > worst) worst = d;
  }
  if (bad)
    qt_test_fail("%s: %lld of %lld outputs beyond %.0f LSB (max %.3g)", what, (long long)bad, (long long)on, max_lsb,
                 worst);
  if (getenv("QT_TEST_VERBOSE"))
    fprintf(stderr, "%s: max %.3g LSB, %lld of %lld differ\n", what, worst, (long long)diff, (long long)on);
  free(got);
  qt_ctx_free(ctx);
  qt_device_free(m);
  return worst;
}

/* The device's int8 partitions whose node list holds `nodes` and whose detail holds `detail` and
 * `detail2` (NULL: anything). */
static int int8_partitions(const qt_device *m, const char *nodes, const char *detail, const char *detail2) {
  int n = 0;
  for (int k = 0; k < qt_device_partition_count(m); k++) {
    const char *nd, *dt;
    n += qt_device_partition(m, k, &nd, &dt) == QT_PART_INT8 && (!nodes || strstr(nd, nodes)) &&
         (!detail || strstr(dt, detail)) && (!detail2 || strstr(dt, detail2));
  }
  return n;
}

static qt_graph *finalize(qt_graph *g, int y) {
  char err[QT_ERR_LEN];
  QT_ASSERT(qt_graph_finalize(g, y, err) == 0, "%s", err);
  for (int t = 0; t < g->n_tensors; t++)
    if (!g->tensors[t].is_buffer) qt_test_fill_uniform(qt_graph_tensor_data(g, t), g->tensors[t].numel, -0.5f, 0.5f, 3);
  return g;
}

/* ---- patterns ----------------------------------------------------------------------------- */

/* input 10x10x3 -> q/dq (zp 100) -> conv 3x3 [stride] pad 1 -> [relu] -> q/dq [0, qmax] */
static void set_output_zero_point(qt_graph *g, int zp) {
  qt_node *d = &g->nodes[g->values[g->output].producer];
  qt_node *q = &g->nodes[g->values[d->inputs[0]].producer];
  d->q->zero_point[0] = q->q->zero_point[0] = zp;
}

/* Fails unless some output of the reference reaches 6 (the relu6 clamp took part). */
static void expect_clamped(const char *what, qt_graph *g, const float *x, int n) {
  qt_ctx *ctx = qt_ctx_create();
  const qt_value *in = &g->values[g->input];
  const int64_t shape[4] = {n, in->shape[0], in->shape[1], in->shape[2]};
  qt_graph_set_mode(g, QT_MODE_EVAL);
  qt_tensor *y = qt_graph_forward(g, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, (void *)x));
  QT_ASSERT(y, "%s", g->error);
  float hi = 0;
  for (int64_t i = 0; i < qt_tensor_numel(y); i++) hi = fmaxf(hi, qt_f32(y)[i]);
  if (fabsf(hi - 6.0f) > output_lsb(g)) qt_test_fail("%s: the outputs never reach the relu6 bound (max %g)", what, hi);
  qt_ctx_free(ctx);
}

static const char *const act_names[] = {"", "+relu", "+relu6"};

/* act: 0 none, 1 relu, 2 relu6. zp_out >= 0 forces the output zero point (even: oneDNN's dst
 * zero point; odd: f32 dst and requantization, see backend/lower.c), else it comes from
 * calibration. */
static float g_out_scale = 1.0f; /* conv_pattern: the calibrated output scale times this */
/* The largest integer weight of the patterns: the full s8 range with VNNI; without it the 7-bit
 * range the Quantizer gives such a CPU (docs/design.md: no VNNI), whose pair sums fit int16. */
static int g_wmax = 127;

static void conv_pattern(int relu, int stride, int qmax, int zp_out, int exact) {
  char what[160];
  snprintf(what, sizeof what, "conv%s stride %d out [0,%d] zp %d%s%s", act_names[relu], stride, qmax, zp_out,
           exact ? " exact" : "", g_out_scale != 1.0f ? ", output scale x 0.5 (6 / s_out beyond the range)" : "");
  const float s_in = exact ? 1.0f / 64 : 0.0123f;
  qt_graph *g = qt_graph_create("conv_pattern");
  int x = qt_graph_input(g, "input", 10, 10, 3);
  x = qdq(g, "input.fq", x, s_in, 100, 255);
  x = qt_graph_conv2d(g, "conv", x, 16, 3, stride, 1, 1, 1);
  if (relu == 1) x = qt_graph_relu(g, "relu", x);
  if (relu == 2) x = qt_graph_relu6(g, "relu6", x);
  x = qdq(g, "out.fq", x, 1.0f, 0, qmax);
  finalize(g, x);
  quantize_weights(g, "conv", exact ? 7 : g_wmax, s_in, exact);
  float *in = random_input(g, 8, -100 * s_in - 0.1f, 155 * s_in + 0.1f);
  calibrate(g, in, 8, exact);
  if (zp_out >= 0) set_output_zero_point(g, zp_out);
  if (g_out_scale != 1.0f) { /* both the relu6 bound and the range clamp take part */
    qt_node *d = &g->nodes[g->values[g->output].producer];
    qt_node *q = &g->nodes[g->values[d->inputs[0]].producer];
    d->q->scale[0] = q->q->scale[0] = d->q->scale[0] * g_out_scale;
  }
  if (relu == 2 && !exact && zp_out < 0 && g_out_scale == 1.0f) expect_clamped(what, g, in, 8);
  compare(what, g, in, 8, 1, 0, exact ? 0 : 1);
  free(in);
  qt_graph_free(g);
}

/* input 9x9x8 -> q/dq (zp 77) -> grouped conv 3x3 pad 1 (8 -> oc, groups; depthwise when
 * groups = oc = 8) [stride] -> [relu | relu6] -> q/dq */
static void grouped_pattern(int groups, int oc, int relu, int stride, int exact) {
  char what[128];
  snprintf(what, sizeof what, "%s conv (groups %d, %d outputs)%s stride %d%s", groups == oc ? "depthwise" : "grouped",
           groups, oc, act_names[relu], stride, exact ? " exact" : "");
  const float s_in = exact ? 1.0f / 64 : 0.0123f;
  qt_graph *g = qt_graph_create("grouped_pattern");
  int x = qt_graph_input(g, "input", 9, 9, 8);
  x = qdq(g, "input.fq", x, s_in, 77, 255);
  x = qt_graph_conv2d(g, "conv", x, oc, 3, stride, 1, groups, 1);
  if (relu == 1) x = qt_graph_relu(g, "relu", x);
  if (relu == 2) x = qt_graph_relu6(g, "relu6", x);
  x = qdq(g, "out.fq", x, 1.0f, 0, 255);
  finalize(g, x);
  quantize_weights(g, "conv", exact ? 7 : g_wmax, s_in, exact);
  float *in = random_input(g, 8, -77 * s_in - 0.1f, 178 * s_in + 0.1f);
  calibrate(g, in, 8, exact);
  compare(what, g, in, 8, 1, 0, exact ? 0 : 1);
  free(in);
  qt_graph_free(g);
}

/* input 4x4x5 -> q/dq (zp_in) -> flatten -> linear 12 -> [relu] -> q/dq */
static void linear_pattern(int relu, int zp_in, int exact) {
  char what[128];
  snprintf(what, sizeof what, "flatten+linear%s zp_in %d%s", act_names[relu], zp_in, exact ? " exact" : "");
  const float s_in = exact ? 1.0f / 32 : 0.0171f;
  qt_graph *g = qt_graph_create("linear_pattern");
  int x = qt_graph_input(g, "input", 4, 4, 5);
  x = qdq(g, "input.fq", x, s_in, zp_in, 255);
  x = qt_graph_flatten(g, "flatten", x);
  x = qt_graph_linear(g, "fc", x, 12, 1);
  if (relu == 1) x = qt_graph_relu(g, "relu", x);
  if (relu == 2) x = qt_graph_relu6(g, "relu6", x);
  x = qdq(g, "out.fq", x, 1.0f, 0, 255);
  finalize(g, x);
  quantize_weights(g, "fc", exact ? 7 : g_wmax, s_in, exact);
  float *in = random_input(g, 16, -(float)zp_in * s_in - 0.1f, (float)(255 - zp_in) * s_in + 0.1f);
  calibrate(g, in, 16, exact);
  if (relu == 2 && !exact) expect_clamped(what, g, in, 16);
  /* int8: the layer and the flatten view */
  compare(what, g, in, 16, 2, 0, exact ? 0 : 1);
  free(in);
  qt_graph_free(g);
}

/* dq -> conv (groups: 1, or depthwise) | flatten -> linear -> activation [-> relu6] -> q: one int8
 * partition, the layer's f32 output, the activation and the quantize in f32 (the Quantizer's
 * unit for onednn_cpu's fused SiLU and hard swish; any kind lowers so). */
static void act_pattern(int linear, int depthwise, qt_act_kind kind, int relu6, int qmax) {
  char what[160];
  snprintf(what, sizeof what, "%s + %s%s -> [0, %d]",
           linear      ? "linear"
           : depthwise ? "depthwise conv"
                       : "conv",
           qt_act_name(kind), relu6 ? " + relu6" : "", qmax);
  const float s_in = 0.0123f;
  qt_graph *g = qt_graph_create("act_pattern");
  int x = qt_graph_input(g, "input", 6, 6, 8);
  x = qdq(g, "input.fq", x, s_in, 90, 255);
  if (linear)
    x = qt_graph_linear(g, "layer", qt_graph_flatten(g, "flatten", x), 24, 1);
  else
    x = qt_graph_conv2d(g, "layer", x, 8, 3, 1, 1, depthwise ? 8 : 1, 1);
  x = qt_graph_activation(g, "act", x, (qt_act){kind, 0.0f, 0.0f});
  if (relu6) x = qt_graph_relu6(g, "relu6", x);
  x = qdq(g, "out.fq", x, 1.0f, 0, qmax);
  finalize(g, x);
  quantize_weights(g, "layer", g_wmax, s_in, 0);
  float *in = random_input(g, 8, -90 * s_in - 0.1f, 165 * s_in + 0.1f);
  calibrate(g, in, 8, 0);
  compare(what, g, in, 8, linear ? 2 : 1, 0, 1);
  char err[QT_ERR_LEN];
  qt_device *m = qt_device_open(g, NULL, err);
  QT_ASSERT(m, "%s", err);
  if (!int8_partitions(m, "layer -> act", qt_act_name(kind), "in f32 -> u8")) {
    qt_test_fail("%s: no int8 partition 'layer -> act' running %s in f32", what, qt_act_name(kind));
    qt_device_report(m, stderr);
  }
  qt_device_free(m);
  free(in);
  qt_graph_free(g);
}

/* The Quantizer's conv + add unit (quant.fuse_add): input -> q/dq (zp 100) -> conv 3x3 (8 -> 8)
 * -> add(., the dequantized input) [-> relu | relu6] -> q/dq, one int8 partition: the conv's f32
 * output plus the other input's dequantized value, requantized. */
static void add_pattern(int relu, int qmax) {
  char what[160];
  snprintf(what, sizeof what, "conv + add%s -> [0, %d]", act_names[relu], qmax);
  const float s_in = 0.0123f;
  qt_graph *g = qt_graph_create("add_pattern");
  int x = qt_graph_input(g, "input", 7, 7, 8);
  x = qdq(g, "input.fq", x, s_in, 100, 255);
  int y = qt_graph_conv2d(g, "conv", x, 8, 3, 1, 1, 1, 1);
  y = qt_graph_add(g, "add", y, x);
  if (relu == 1) y = qt_graph_relu(g, "relu", y);
  if (relu == 2) y = qt_graph_relu6(g, "relu6", y);
  y = qdq(g, "out.fq", y, 1.0f, 0, qmax);
  finalize(g, y);
  quantize_weights(g, "conv", g_wmax, s_in, 0);
  float *in = random_input(g, 8, -100 * s_in - 0.1f, 155 * s_in + 0.1f);
  calibrate(g, in, 8, 0);
  compare(what, g, in, 8, 1, 0, 1);
  char err[QT_ERR_LEN];
  qt_device *m = qt_device_open(g, NULL, err);
  QT_ASSERT(m, "%s", err);
  if (qt_device_count(m, QT_PART_INT8) != 1 ||
      int8_partitions(m, "conv + input.fq.dequantize -> add", "+ u8 input", NULL) != 1) {
    qt_test_fail("%s: the one int8 partition is not 'conv + ... -> add'", what);
    qt_device_report(m, stderr);
  }
  qt_device_free(m);
  free(in);
  qt_graph_free(g);
}

/* The Quantizer's gate unit (quant.fuse_gate), squeeze-excite as EfficientNet and MobileNetV3
 * have it: input -> q/dq (zp 100) -> global average pool -> q/dq -> linear (8 -> 8) -> sigmoid or
 * hard sigmoid -> mul(the dequantized input, .) -> q/dq; the linear, the activation and the
 * product one int8 partition. */
static void gate_pattern(qt_act_kind kind) {
  char what[160];
  snprintf(what, sizeof what, "linear -> %s -> mul (gate)", qt_act_name(kind));
  const float s_in = 0.0123f;
  qt_graph *g = qt_graph_create("gate_pattern");
  int x = qt_graph_input(g, "input", 5, 5, 8);
  x = qdq(g, "input.fq", x, s_in, 100, 255);
  int z = qt_graph_global_avg_pool(g, "pool", x);
  z = qdq(g, "pool.fq", z, s_in, 100, 255);
  z = qt_graph_linear(g, "fc", z, 8, 1);
  z = qt_graph_activation(g, "act", z, (qt_act){kind, 0.0f, 0.0f});
  int y = qt_graph_mul(g, "mul", x, z);
  y = qdq(g, "out.fq", y, 1.0f, 0, 255);
  finalize(g, y);
  quantize_weights(g, "fc", g_wmax, s_in, 0);
  float *in = random_input(g, 8, -100 * s_in - 0.1f, 155 * s_in + 0.1f);
  calibrate(g, in, 8, 0);
  compare(what, g, in, 8, 2, 0, 1);
  char err[QT_ERR_LEN];
  qt_device *m = qt_device_open(g, NULL, err);
  QT_ASSERT(m, "%s", err);
  if (!int8_partitions(m, "fc -> act * input.fq.dequantize -> mul", "* u8 input in f32 -> u8", NULL)) {
    qt_test_fail("%s: no int8 partition 'fc -> act * ... -> mul'", what);
    qt_device_report(m, stderr);
  }
  qt_device_free(m);
  free(in);
  qt_graph_free(g);
}

/* A conv with full-range s8 weights on u8 inputs: an int8 kernel where the CPU has VNNI; without
 * it (this machine, or ONEDNN_MAX_CPU_ISA=AVX2: test_backend_patterns_avx2) its pair sums could
 * saturate oneDNN's int16, so it runs in an fp32 fallback naming that, identical to the Q/DQ
 * graph (it was 949 of 12800 outputs beyond 1 LSB, up to 58, as an int8 kernel). */
static void saturation_pattern(void) {
  const float s_in = 0.0123f;
  qt_graph *g = qt_graph_create("saturation_pattern");
  int x = qt_graph_input(g, "input", 10, 10, 3);
  x = qdq(g, "input.fq", x, s_in, 100, 255);
  x = qdq(g, "out.fq", qt_graph_conv2d(g, "conv", x, 16, 3, 1, 1, 1, 1), 1.0f, 0, 255);
  finalize(g, x);
  quantize_weights(g, "conv", 127, s_in, 0);
  float *in = random_input(g, 8, -100 * s_in - 0.1f, 155 * s_in + 0.1f);
  calibrate(g, in, 8, 0);
  const int vnni = qt_cpu_has_vnni();
  compare(vnni ? "s8 weights [-127, 127], VNNI: int8" : "s8 weights [-127, 127], no VNNI: fp32 fallback", g, in, 8,
          vnni ? 1 : 0, vnni ? 0 : 1, vnni ? 1 : 0);
  if (!vnni) {
    char err[QT_ERR_LEN];
    qt_device *m = qt_device_open(g, NULL, err);
    QT_ASSERT(m, "%s", err);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    qt_device_report(m, f);
    fclose(f);
    if (!strstr(text, "without VNNI oneDNN adds them in a saturating int16"))
      qt_test_fail("the saturating conv's fallback does not say why:\n%s", text);
    free(text);
    qt_device_free(m);
  }
  free(in);
  qt_graph_free(g);
}

/* input 9x9x4 -> q/dq -> max_pool (k3 s2 p1: padding) -> fp32 output: identical. */
static void max_pool_pattern(void) {
  qt_graph *g = qt_graph_create("max_pool_pattern");
  int x = qt_graph_input(g, "input", 9, 9, 4);
  x = qdq(g, "input.fq", x, 0.02f, 37, 255);
  x = qt_graph_max_pool2d(g, "pool", x, 3, 2, 1);
  finalize(g, x);
  float *in = random_input(g, 8, -1.0f, 4.5f);
  compare("max pool on u8", g, in, 8, 1, 0, 0);
  free(in);
  qt_graph_free(g);
}

/* dq -> avg_pool -> q: no int8 pattern, runs in fp32, bit-identical; the report names it. */
static void fallback_pattern(void) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_graph_create("fallback_pattern");
  int x = qt_graph_input(g, "input", 8, 8, 4);
  x = qdq(g, "input.fq", x, 0.015f, 90, 255);
  x = qt_graph_avg_pool2d(g, "avgpool", x, 3, 2, 1);
  x = qdq(g, "avgpool.fq", x, 0.011f, 80, 255);
  finalize(g, x);
  float *in = random_input(g, 8, -1.5f, 2.5f);
  compare("avg pool fallback", g, in, 8, 0, 1, 0);
  qt_device *m = qt_device_open(g, NULL, err);
  int found = 0;
  for (int i = 0; m && i < qt_device_partition_count(m); i++) {
    const char *nodes, *detail;
    if (qt_device_partition(m, i, &nodes, &detail) == QT_PART_FALLBACK)
      found = strcmp(nodes, "avgpool") == 0 && strstr(detail, "avg_pool2d") && strstr(detail, "no int8");
  }
  if (!found) qt_test_fail("fallback: the report does not list avgpool as an avg_pool2d fallback with its reason");
  qt_device_free(m);
  free(in);
  qt_graph_free(g);
}

/* FashionCNN through the real pipeline: quantizer -> PTQ prepare -> calibration -> convert; mode 1
 * with quant.fuse_add, 2 with quant.fp32_output. */
static qt_graph *converted_model(const char *model, int wbits, int abits, int mode) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_model_build(model, err);
  qt_graph_init_params(g, 5);
  for (int64_t i = 0; i < g->n_buffers; i++) g->buffers[i] = 0.3f + 0.2f * (float)(i % 7);
  qt_quantizer_config qc = qt_test_quantizer_config(wbits, abits);
  qc.fuse_add = mode == 1;
  qc.fp32_output = mode == 2;
  qt_annotations a;
  QT_ASSERT(qt_test_quantizer_onednn(g, &qc, QT_ISA_AUTO, &a, err) == 0, "%s", err);
  return qt_test_ptq_convert(g, &a);
}

static void fashion_cnn(int wbits, int abits) {
  char what[64];
  snprintf(what, sizeof what, "fashion_cnn W%dA%d", wbits, abits);
  qt_graph *g = converted_model("fashion_cnn", wbits, abits, 0);
  float *x = malloc(sizeof(float) * 256 * 784);
  qt_test_fill_uniform(x, 256 * 784, -0.8f, 2.0f, 99);
  /* conv1, pool1, conv2, pool2, flatten, fc1, fc2: all int8 */
  compare(what, g, x, 256, 7, 0, 1);
  /* batch sizes changing between runs reuse and rebuild cached primitives */
  compare(what, g, x, 3, 7, 0, 1);
  compare(what, g, x + 5 * 784, 17, 7, 0, 1);
  free(x);
  qt_graph_free(g);
}

/* ResCNN: its residual adds on u8 between int8 convs, or (fuse_add) each in the unit of the conv
 * before it: 8 int8 partitions, two of them conv + add + relu. */
static void res_cnn(int fuse_add) {
  qt_graph *g = converted_model("res_cnn", 8, 8, fuse_add);
  float *x = malloc(sizeof(float) * 64 * 784);
  qt_test_fill_uniform(x, 64 * 784, -0.8f, 2.0f, 98);
  char err[QT_ERR_LEN];
  qt_device *m = qt_device_open(g, NULL, err);
  QT_ASSERT(m, "%s", err);
  if (getenv("QT_TEST_VERBOSE")) qt_device_report(m, stderr);
  const int fallbacks = qt_device_count(m, QT_PART_FALLBACK);
  const int fused = int8_partitions(m, NULL, "+ u8 input", NULL);
  if (fused != (fuse_add ? 2 : 0)) qt_test_fail("res_cnn fuse_add %d: %d conv + add partitions", fuse_add, fused);
  if (fuse_add && (fallbacks || qt_device_count(m, QT_PART_INT8) != 8))
    qt_test_fail("res_cnn fuse_add: %d int8 / %d fallback partitions, want 8 / 0", qt_device_count(m, QT_PART_INT8),
                 fallbacks);
  qt_device_free(m);
  compare(fuse_add ? "res_cnn W8A8 fuse_add" : "res_cnn W8A8", g, x, 64, -1, fallbacks, 1);
  free(x);
  qt_graph_free(g);
}

/* quant.fp32_output: dq -> [flatten ->] linear | conv -> the graph's fp32 output, the layer's
 * kernel writing real values (f32 destination, s_x * s_w[c] per channel); one int8 partition (and
 * the flatten view) within FP32_OUTPUT_TOL of the Q/DQ graph's float32 (the same products summed in
 * another order); then FashionCNN converted with it end to end. */
#define FP32_OUTPUT_TOL 1e-4
static void fp32_output_pattern(int linear, int zp_in) {
  char what[128];
  snprintf(what, sizeof what, "%s -> fp32 output, zp_in %d", linear ? "flatten+linear" : "conv", zp_in);
  const float s_in = 0.0171f;
  qt_graph *g = qt_graph_create("fp32_output_pattern");
  int x = qt_graph_input(g, "input", 4, 4, 5);
  x = qdq(g, "input.fq", x, s_in, zp_in, 255);
  x = linear ? qt_graph_linear(g, "fc", qt_graph_flatten(g, "flatten", x), 12, 1)
             : qt_graph_conv2d(g, "fc", x, 12, 3, 1, 1, 1, 1);
  finalize(g, x);
  quantize_weights(g, "fc", g_wmax, s_in, 0);
  float *in = random_input(g, 16, -(float)zp_in * s_in - 0.1f, (float)(255 - zp_in) * s_in + 0.1f);
  char err[QT_ERR_LEN];
  qt_device *m = qt_device_open(g, NULL, err);
  QT_ASSERT(m, "%s", err);
  if (!int8_partitions(m, linear ? "flatten -> fc" : "input.fq.dequantize -> fc", "the model's fp32 output", NULL)) {
    qt_test_fail("%s: no int8 partition writing the fp32 output", what);
    qt_device_report(m, stderr);
  }
  qt_device_free(m);
  compare(what, g, in, 16, linear ? 2 : 1, 0, FP32_OUTPUT_TOL);
  free(in);
  qt_graph_free(g);

  if (linear) return;
  g = converted_model("fashion_cnn", 8, 8, 2);
  const qt_node *o = &g->nodes[g->values[g->output].producer];
  if (o->op != QT_OP_LINEAR)
    qt_test_fail("fashion_cnn with fp32_output: the output is made by a %s", qt_op_name(o->op));
  float *xs = malloc(sizeof(float) * 64 * 784);
  qt_test_fill_uniform(xs, 64 * 784, -0.8f, 2.0f, 97);
  compare("fashion_cnn W8A8 fp32 output", g, xs, 64, 7, 0, FP32_OUTPUT_TOL);
  free(xs);
  qt_graph_free(g);
}

static void prepared_refused(void) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_model_build("fashion_cnn", err);
  qt_graph *p = qt_test_prepare_ptq_onednn(g);
  err[0] = 0;
  qt_device *m = qt_device_open(p, NULL, err);
  if (m || !strstr(err, "prepared")) qt_test_fail("a prepared graph must be refused naming it, got '%s'", err);
  qt_device_free(m);
  qt_graph_free(p);
  qt_graph_free(g);
}

int main(void) {
  g_wmax = qt_cpu_has_vnni() ? 127 : 63;
  printf("oneDNN ISA %s VNNI: pattern weights in [-%d, %d]\n", qt_cpu_has_vnni() ? "with" : "without", g_wmax, g_wmax);
  saturation_pattern();
  for (int exact = 0; exact <= 1; exact++) {
    conv_pattern(1, 1, 255, -1, exact);
    conv_pattern(0, 2, 255, -1, exact);  /* output zero point from calibration */
    conv_pattern(0, 2, 255, 100, exact); /* even: oneDNN's dst zero point */
    conv_pattern(0, 1, 255, 101, exact); /* odd: f32 dst, requantized */
    conv_pattern(1, 1, 15, -1, exact);   /* 4-bit output: clip post-op */
    conv_pattern(0, 1, 15, 6, exact);    /* 4-bit, dst zero point and clip */
    conv_pattern(0, 1, 15, 7, exact);
    linear_pattern(1, 0, exact);
    linear_pattern(1, 77, exact);        /* input zero point folded into the bias */
    linear_pattern(0, 77, exact);        /* output zero point: f32 dst, requantized */
    conv_pattern(2, 1, 255, -1, exact);  /* relu6: clip post-op at 6 / s_out */
    conv_pattern(2, 1, 255, 101, exact); /* relu6 with an f32 dst */
    linear_pattern(2, 77, exact);
    grouped_pattern(8, 8, 2, 1, exact);  /* depthwise + relu6 (MobileNet) */
    grouped_pattern(8, 8, 0, 2, exact);  /* depthwise, stride 2 */
    grouped_pattern(2, 16, 1, 1, exact); /* two groups */
    /* relu6 into a 4-bit output whose 6 / s_out lies beyond 15: the relu6 bound and the range
     * clamp in one post-op (two clip post-ops: oneDNN 2.6 dropped the second, outputs 16, 17) */
    g_out_scale = 0.5f;
    conv_pattern(2, 1, 15, -1, exact);
    g_out_scale = 1.0f;
  }
  act_pattern(0, 0, QT_ACT_SILU, 0, 255);
  act_pattern(0, 1, QT_ACT_SILU, 0, 255); /* EfficientNet's depthwise conv -> bn -> SiLU */
  act_pattern(0, 0, QT_ACT_HARDSWISH, 0, 15);
  act_pattern(1, 0, QT_ACT_SIGMOID, 1, 255);
  act_pattern(0, 0, QT_ACT_GELU, 0, 255);
  max_pool_pattern();
  fallback_pattern();
  fashion_cnn(8, 8);
  fashion_cnn(4, 4);
  add_pattern(0, 255);
  add_pattern(1, 255);
  add_pattern(2, 15); /* relu6 into a 4-bit range */
  gate_pattern(QT_ACT_SIGMOID);
  gate_pattern(QT_ACT_HARDSIGMOID);
  res_cnn(0);
  res_cnn(1);
  fp32_output_pattern(1, 77);
  fp32_output_pattern(0, 5);
  prepared_refused();
  return qt_test_finish();
}
