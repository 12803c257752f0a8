/* The xnnpack device (backend/xnnpack.c) against the exact integer reference (eval/exact.h) on
 * random data, one pattern at a time: dq -> conv [-> relu | relu6] -> q (per-channel qc8 weights,
 * input and output zero points, stride, a 4-bit output), depthwise and grouped convs,
 * dq -> flatten -> linear [-> relu] -> q (per-tensor weights), max pooling, global average
 * pooling, a residual add with relu, elu, leaky ReLU, sigmoid and tanh with their fixed output
 * qparams, multiply (one shape, and an image by a per-channel vector), average pooling (padding
 * counted), the channel shuffle and slice and a nearest resize (exact): every output within 1
 * LSB, the share of 1-LSB differences printed. Sigmoid and tanh with calibrated output qparams,
 * the kinds without an operator and an average pool in ceil mode run as fallback partitions,
 * naming why. A bilinear resize on its input's grid runs on XNNPACK's s8 resize, within 1 LSB;
 * with an output grid of its own it runs as a fallback partition and equals the float Q/DQ
 * executor bit for bit; a model quantized for oneDNN (u8 activations, per-channel linear
 * weights) runs entirely in fallbacks, each with its reason, never a wrong number; FashionCNN and
 * ResCNN quantized for XNNPACK (W8A8, W4A8, W4A4) end to end with their biases on the
 * accumulator grid (the int32 bias XNNPACK takes; the Quantizer does not put them there yet):
 * no fallback, within 1 LSB of the exact reference, top-1 flips only on 1-LSB near-ties; and
 * as convert leaves them (fp32 bias), measured only: XNNPACK's bias rounding compounds. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "eval/exact.h"
#include "qat/qat.h"
#include "tests/common/graph_util.h"
#include "tests/common/ptq_util.h"
#include "tests/common/testutil.h"

static uint64_t rng_state = 4242;
static uint32_t rnd(void) {
  rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
  return (uint32_t)(rng_state >> 33);
}
static float rnd_uniform(float lo, float hi) { return lo + (hi - lo) * (float)(rnd() & 0xffffff) / 16777216.0f; }

/* ---- small Q/DQ graphs with qs8 activations ----------------------------------------------- */

static qt_qstate *act_state(int bits) {
  qt_qspec s;
  memset(&s, 0, sizeof s);
  s.bits = bits;
  s.is_signed = 1;
  qt_qrange(bits, 1, &s.qmin, &s.qmax);
  s.observer = QT_OBSERVER_MOVING_AVERAGE;
  return qt_test_qstate(&s, 1, 0.1f, 0); /* calibrated below */
}

static int qdq(qt_graph *g, const char *prefix, int x, int bits) {
  return qt_test_append_qdq(g, prefix, x, act_state(bits), act_state(bits));
}

/* Integer weights of layer `name`: symmetric int8 (the full [-128, 127]), per channel or per
 * tensor, random scales and bias. */
static void quantize_weights(qt_graph *g, const char *name, int per_channel) {
  char err[QT_ERR_LEN];
  qt_node *n = &g->nodes[qt_graph_find_node(g, name)];
  const qt_param *w = &g->tensors[n->param[QT_P_WEIGHT]];
  const int OC = (int)w->shape[0], channels = per_channel ? OC : 1;
  qt_qspec s;
  memset(&s, 0, sizeof s);
  s.bits = 8;
  s.is_signed = 1;
  s.qmin = -128;
  s.qmax = 127;
  s.symmetric = 1;
  s.per_channel = per_channel;
  s.observer = QT_OBSERVER_MINMAX;
  n->wq = qt_qstate_create(&s, channels, err);
  QT_ASSERT(n->wq, "%s", err);
  n->wq->n_qweight = w->numel;
  n->wq->qweight = malloc((size_t)w->numel * sizeof(int32_t));
  for (int64_t k = 0; k < w->numel; k++) n->wq->qweight[k] = (int32_t)(rnd() % 256) - 128;
  float *b = n->param[QT_P_BIAS] >= 0 ? qt_graph_tensor_data(g, n->param[QT_P_BIAS]) : NULL;
  for (int c = 0; c < channels; c++) n->wq->scale[c] = rnd_uniform(0.002f, 0.02f);
  for (int c = 0; b && c < OC; c++) b[c] = rnd_uniform(-0.5f, 0.5f);
  n->wq->calibrated = 1;
  n->wq->observe = 0;
}

/* Every quantize, in order, gets signed affine qparams from the range its input takes on x. */
static void calibrate(qt_graph *g, const float *x, int n) {
  qt_ctx *ctx = qt_ctx_create();
  const qt_value *in = &g->values[g->input];
  const int64_t shape[4] = {n, in->shape[0], in->shape[1], in->shape[2]};
  for (int i = 0; i < g->n_nodes; i++) {
    qt_node *q = &g->nodes[i];
    if (q->op != QT_OP_QUANTIZE) continue;
    qt_ctx_reset(ctx);
    qt_tensor **vals;
    QT_ASSERT(qt_graph_forward_values(g, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, (void *)x), &vals), "%s", g->error);
    const qt_tensor *v = vals[q->inputs[0]];
    float lo = 0, hi = 0;
    for (int64_t k = 0; k < qt_tensor_numel(v); k++) {
      lo = fminf(lo, qt_f32(v)[k]);
      hi = fmaxf(hi, qt_f32(v)[k]);
    }
    const int qmin = q->q->spec.qmin, qmax = q->q->spec.qmax;
    const float s = fmaxf(hi - lo, 1e-3f) / (float)(qmax - qmin);
    int zp = qmin - (int)nearbyintf(lo / s);
    zp = zp < qmin ? qmin : zp > qmax ? qmax : zp;
    qt_node *d = &g->nodes[i + 1]; /* qdq() appends the pair together */
    QT_ASSERT(d->op == QT_OP_DEQUANTIZE, "pair of %s", q->name);
    q->q->scale[0] = d->q->scale[0] = s;
    q->q->zero_point[0] = d->q->zero_point[0] = zp;
  }
  qt_ctx_free(ctx);
}

static float *random_input(const qt_graph *g, int n, float lo, float hi) {
  const qt_value *v = &g->values[g->input];
  const int64_t numel = n * v->shape[0] * v->shape[1] * v->shape[2];
  float *x = malloc((size_t)numel * sizeof(float));
  for (int64_t i = 0; i < numel; i++) x[i] = rnd_uniform(lo, hi);
  return x;
}

static qt_graph *finalize(qt_graph *g, int y) {
  char err[QT_ERR_LEN];
  QT_ASSERT(qt_graph_finalize(g, y, err) == 0, "%s", err);
  for (int t = 0; t < g->n_tensors; t++)
    if (!g->tensors[t].is_buffer) qt_test_fill_uniform(qt_graph_tensor_data(g, t), g->tensors[t].numel, -0.5f, 0.5f, 3);
  return g;
}

/* ---- comparing -------------------------------------------------------------------------------- */

static float output_lsb(const qt_graph *g) {
  const qt_node *o = &g->nodes[g->values[g->output].producer];
  return o->op == QT_OP_DEQUANTIZE ? o->q->scale[0] : 0.0f;
}

typedef struct {
  double max_lsb;
  int64_t n, differ;
  int64_t top1_same, rows;
  int64_t top1_unexplained; /* flips where the exact top two are more than max_lsb apart */
} agreement;

/* Runs the xnnpack device and the exact reference on x; fails beyond max_lsb (or, for an fp32
 * output, 1e-5 relative), and unless the partition counts match (-1: any). Prints the share of
 * 1-LSB differences. classes > 0: also top-1 agreement over rows of `classes` logits. */
static agreement compare(const char *what, qt_graph *g, const float *x, int n, int want_int8, int want_fallback,
                         double max_lsb, int classes) {
  char err[QT_ERR_LEN];
  agreement a = {0};
  qt_backend_desc d;
  qt_backend_desc_xnnpack(&d);
  qt_graph_set_mode(g, QT_MODE_EVAL);
  qt_device *m = qt_device_open(g, &d, err);
  if (!m) {
    qt_test_fail("%s: xnnpack device: %s", what, err);
    return a;
  }
  if ((want_int8 >= 0 && qt_device_count(m, QT_PART_INT8) != want_int8) ||
      (want_fallback >= 0 && qt_device_count(m, QT_PART_FALLBACK) != want_fallback)) {
    qt_test_fail("%s: %d int8 / %d fallback partitions, want %d / %d", what, qt_device_count(m, QT_PART_INT8),
                 qt_device_count(m, QT_PART_FALLBACK), want_int8, want_fallback);
    qt_device_report(m, stderr);
  }
  if (getenv("QT_TEST_VERBOSE")) qt_device_report(m, stderr);
  qt_exact *ex = qt_exact_open(g, err);
  QT_ASSERT(ex, "%s: exact reference: %s", what, err);
  const int64_t on = qt_device_output_numel(m) * n;
  float *got = malloc((size_t)on * sizeof(float)), *want = malloc((size_t)on * sizeof(float));
  QT_ASSERT(got && want, "out of memory");
  if (qt_device_run(m, got, x, n, err)) qt_test_fail("%s: run: %s", what, err);
  QT_ASSERT(qt_exact_run(ex, want, x, n, err) == 0, "%s: %s", what, err);
  const float lsb = output_lsb(g);
  int64_t bad = 0;
  for (int64_t i = 0; i < on; i++) {
    double diff = fabs((double)got[i] - (double)want[i]);
    diff = lsb > 0 ? diff / lsb : diff / fmax(1e-30, fabs((double)want[i]) * 1e-5);
    if (diff > 1e-6) a.differ++;
    if (diff > max_lsb + 1e-4 && bad++ < 5)
      fprintf(stderr, "%s: element %lld: xnnpack %.7g, exact %.7g (%.3g %s)\n", what, (long long)i, got[i], want[i],
              diff, lsb > 0 ? "LSB" : "x 1e-5 relative");
    if (diff > a.max_lsb) a.max_lsb = diff;
  }
  a.n = on;
  if (bad)
    qt_test_fail("%s: %lld of %lld outputs beyond %g LSB (max %.3g)", what, (long long)bad, (long long)on, max_lsb,
                 a.max_lsb);
  if (classes > 0) {
    a.rows = on / classes;
    for (int64_t r = 0; r < a.rows; r++) {
      int bg = 0, bw = 0;
      for (int k = 1; k < classes; k++) {
        if (got[r * classes + k] > got[r * classes + bg]) bg = k;
        if (want[r * classes + k] > want[r * classes + bw]) bw = k;
      }
      a.top1_same += bg == bw;
      /* a flip is explained only by a near-tie: the exact top two within the 1-LSB tolerance */
      if (bg != bw && fabs((double)want[r * classes + bw] - (double)want[r * classes + bg]) > max_lsb * lsb + 1e-7)
        a.top1_unexplained++;
    }
  }
  printf("%-44s max %.3g LSB, %lld of %lld outputs differ by 1 LSB (%.3f%%)", what, a.max_lsb, (long long)a.differ,
         (long long)on, 100.0 * (double)a.differ / (double)on);
  if (classes > 0) printf(", top-1 identical on %.2f%%", 100.0 * (double)a.top1_same / (double)a.rows);
  printf("\n");
  free(got);
  free(want);
  qt_exact_free(ex);
  qt_device_free(m);
  return a;
}

/* ---- patterns ----------------------------------------------------------------------------- */

static const char *const act_names[] = {"", "+relu", "+relu6"};

static int activation(qt_graph *g, int x, int act) {
  if (act == 1) return qt_graph_relu(g, "relu", x);
  if (act == 2) return qt_graph_relu6(g, "relu6", x);
  return x;
}

/* input 10x10x3 -> q/dq -> conv 3x3 pad 1 [stride] (groups) -> [relu | relu6] -> q/dq (out_bits) */
static void conv_pattern(int C, int OC, int groups, int act, int stride, int out_bits) {
  char what[128];
  snprintf(what, sizeof what, "%s %d->%d%s stride %d A%d",
           groups == C && groups == OC && groups > 1 ? "depthwise conv"
           : groups > 1                              ? "grouped conv"
                                                     : "conv",
           C, OC, act_names[act], stride, out_bits);
  qt_graph *g = qt_graph_create("conv_pattern");
  int x = qt_graph_input(g, "input", 10, 10, C);
  x = qdq(g, "input.fq", x, 8);
  x = qt_graph_conv2d(g, "conv", x, OC, 3, stride, 1, groups, 1);
  x = activation(g, x, act);
  x = qdq(g, "out.fq", x, out_bits);
  finalize(g, x);
  quantize_weights(g, "conv", 1);
  float *in = random_input(g, 16, -1.2f, 2.3f);
  calibrate(g, in, 16);
  if (act == 2) { /* make the relu6 bound take part: the output range reaches past 6 */
    qt_node *q = &g->nodes[qt_graph_find_node(g, "out.fq.quantize")];
    qt_node *dq = &g->nodes[qt_graph_find_node(g, "out.fq.dequantize")];
    const float s = 8.0f / (float)(q->q->spec.qmax - q->q->spec.qmin);
    q->q->scale[0] = dq->q->scale[0] = s;
    q->q->zero_point[0] = dq->q->zero_point[0] = q->q->spec.qmin;
  }
  compare(what, g, in, 16, 1, 0, 1, 0);
  free(in);
  qt_graph_free(g);
}

/* input 4x4x5 -> q/dq -> flatten -> linear 12 (per-tensor weights) -> [relu] -> q/dq */
static void linear_pattern(int act) {
  char what[128];
  snprintf(what, sizeof what, "flatten+linear%s", act_names[act]);
  qt_graph *g = qt_graph_create("linear_pattern");
  int x = qt_graph_input(g, "input", 4, 4, 5);
  x = qdq(g, "input.fq", x, 8);
  x = qt_graph_flatten(g, "flatten", x);
  x = qt_graph_linear(g, "fc", x, 12, 1);
  x = activation(g, x, act);
  x = qdq(g, "out.fq", x, 8);
  finalize(g, x);
  quantize_weights(g, "fc", 0);
  float *in = random_input(g, 32, -1.0f, 3.0f);
  calibrate(g, in, 32);
  compare(what, g, in, 32, 2, 0, 1, 0); /* the layer and the flatten view */
  free(in);
  qt_graph_free(g);
}

/* input 9x9x4 -> q/dq -> max_pool (k3 s2 p1) -> fp32 output: identical; ceil: 10x10x4, k3 s2 p0
 * in ceil mode (5x5 out, floor mode's 4x4 and the windows hanging over the bottom and right) */
static void max_pool_pattern(int ceil) {
  qt_graph *g = qt_graph_create("max_pool_pattern");
  int x = qt_graph_input(g, "input", 9 + ceil, 9 + ceil, 4);
  x = qdq(g, "input.fq", x, 8);
  x = qt_graph_pool2d(g, QT_OP_MAX_POOL2D, "pool", x, 3, 2, !ceil, ceil);
  finalize(g, x);
  QT_CHECK(!ceil || g->values[x].shape[0] == 5);
  float *in = random_input(g, 8, -1.0f, 4.5f);
  calibrate(g, in, 8);
  compare(ceil ? "max pool k3 s2 p0 ceil mode on int8" : "max pool k3 s2 p1 on int8", g, in, 8, 1, 0, 0, 0);
  free(in);
  qt_graph_free(g);
}

/* input 7x7x16 -> q/dq -> global_avg_pool -> q/dq */
static void global_avg_pool_pattern(int out_bits) {
  char what[64];
  snprintf(what, sizeof what, "global avg pool 7x7x16 A%d", out_bits);
  qt_graph *g = qt_graph_create("gap_pattern");
  int x = qt_graph_input(g, "input", 7, 7, 16);
  x = qdq(g, "input.fq", x, 8);
  x = qt_graph_global_avg_pool(g, "gap", x);
  x = qdq(g, "gap.fq", x, out_bits);
  finalize(g, x);
  float *in = random_input(g, 64, -2.0f, 3.0f);
  /* a narrow output range: averages of random data cluster near the mean */
  calibrate(g, in, 64);
  compare(what, g, in, 64, 1, 0, 1, 0);
  free(in);
  qt_graph_free(g);
}

/* input -> q/dq -> conv a -> q/dq, conv b -> q/dq; a + b -> relu -> q/dq */
static void add_pattern(int act) {
  char what[64];
  snprintf(what, sizeof what, "add%s (two convs' outputs)", act_names[act]);
  qt_graph *g = qt_graph_create("add_pattern");
  int x = qt_graph_input(g, "input", 6, 6, 4);
  x = qdq(g, "input.fq", x, 8);
  int a = qdq(g, "a.fq", qt_graph_conv2d(g, "conv_a", x, 8, 3, 1, 1, 1, 1), 8);
  int b = qdq(g, "b.fq", qt_graph_conv2d(g, "conv_b", x, 8, 1, 1, 0, 1, 1), 8);
  int y = activation(g, qt_graph_add(g, "add", a, b), act);
  y = qdq(g, "add.fq", y, 8);
  finalize(g, y);
  quantize_weights(g, "conv_a", 1);
  quantize_weights(g, "conv_b", 1);
  float *in = random_input(g, 32, -1.0f, 2.0f);
  calibrate(g, in, 32);
  compare(what, g, in, 32, 3, 0, 1, 0);
  free(in);
  qt_graph_free(g);
}

/* input -> q/dq -> activation -> q/dq (out_bits), calibrated: XNNPACK's qs8 elu; sigmoid and tanh
 * fall back (their qs8 operators take only fixed output qparams) unless `fixed` gives the output
 * those (1/256, -128; 1/128, 0); the kinds without a qs8 operator fall back. */
static void activation_pattern(qt_act_kind kind, int out_bits, int fixed) {
  char err[QT_ERR_LEN], what[64];
  snprintf(what, sizeof what, "%s A%d%s", qt_act_name(kind), out_bits, fixed ? " (fixed output qparams)" : "");
  qt_graph *g = qt_graph_create("act_pattern");
  int x = qdq(g, "input.fq", qt_graph_input(g, "input", 6, 5, 8), 8);
  x = qdq(g, "act.fq", qt_graph_activation(g, "act", x, qt_act_default(kind)), out_bits);
  finalize(g, x);
  float *in = random_input(g, 16, -4.0f, 4.0f);
  calibrate(g, in, 16);
  if (fixed)
    for (int i = 0; i < g->n_nodes; i++)
      if (strncmp(g->nodes[i].name, "act.fq.", 7) == 0) {
        g->nodes[i].q->scale[0] = kind == QT_ACT_SIGMOID ? 1.0f / 256 : 1.0f / 128;
        g->nodes[i].q->zero_point[0] = kind == QT_ACT_SIGMOID ? -128 : 0;
      }
  const int runs = kind == QT_ACT_ELU || kind == QT_ACT_LEAKY_RELU || fixed;
  compare(what, g, in, 16, runs, !runs, 1, 0);
  qt_backend_desc d;
  qt_backend_desc_xnnpack(&d);
  qt_device *m = qt_device_open(g, &d, err);
  QT_ASSERT(m, "%s", err);
  const char *reason = NULL, *want = kind == QT_ACT_SIGMOID || kind == QT_ACT_TANH ? "takes only an output scale of 1/"
                                                                                     : "no qs8 ";
  if (!runs && (qt_device_node_on_backend(m, "act", &reason) != 0 || !reason || !strstr(reason, want)))
    qt_test_fail("%s: the fallback's reason is '%s', want '%s...'", what, reason ? reason : "", want);
  qt_device_free(m);
  free(in);
  qt_graph_free(g);
}

/* a (an image) * b, each q/dq: b the per-channel global average pool of the input (squeeze-excite's
 * gate) or a second q/dq of the input (one shape) */
static void mul_pattern(int broadcast) {
  qt_graph *g = qt_graph_create("mul_pattern");
  const int x = qt_graph_input(g, "input", 6, 5, 8);
  const int a = qdq(g, "a.fq", x, 8);
  int b = qdq(g, "b.fq", x, 4); /* other qparams: a 4-bit range */
  if (broadcast) b = qdq(g, "gap.fq", qt_graph_global_avg_pool(g, "gap", b), 8);
  const int y = qdq(g, "mul.fq", qt_graph_mul(g, "mul", a, b), 8);
  finalize(g, y);
  float *in = random_input(g, 16, -1.5f, 2.0f);
  calibrate(g, in, 16);
  compare(broadcast ? "multiply image * per-channel vector" : "multiply of one shape", g, in, 16, 1 + broadcast, 0, 1,
          0);
  free(in);
  qt_graph_free(g);
}

/* q/dq -> channel_shuffle (4 groups) -> channel_slice [2, 7): x8 copies, exact */
static void channels_pattern(void) {
  qt_graph *g = qt_graph_create("channels_pattern");
  int x = qdq(g, "input.fq", qt_graph_input(g, "input", 6, 5, 8), 8);
  x = qt_graph_channel_slice(g, "slice", qt_graph_channel_shuffle(g, "shuffle", x, 4), 2, 7);
  finalize(g, x);
  float *in = random_input(g, 16, -1.5f, 2.0f);
  calibrate(g, in, 16);
  compare("channel shuffle and slice on int8", g, in, 16, 2, 0, 0, 0);
  free(in);
  qt_graph_free(g);
}

/* dq -> avg_pool2d -> q (kernel, stride, pad; out_bits): XNNPACK's qu8 average pooling on the
 * int8 data with the top bit flipped, padding counted (PyTorch's count_include_pad); in ceil mode
 * where a window hangs over the input, a fallback naming it. */
static void avg_pool_pattern(int kernel, int stride, int pad, int ceil, int out_bits) {
  char err[QT_ERR_LEN], what[80];
  snprintf(what, sizeof what, "avg pool %dx%d /%d pad %d%s A%d", kernel, kernel, stride, pad, ceil ? " ceil" : "",
           out_bits);
  qt_graph *g = qt_graph_create("avg_pool_pattern");
  int x = qdq(g, "input.fq", qt_graph_input(g, "input", 9, 9, 12), 8);
  x = qdq(g, "avgpool.fq", qt_graph_pool2d(g, QT_OP_AVG_POOL2D, "avgpool", x, kernel, stride, pad, ceil), out_bits);
  finalize(g, x);
  float *in = random_input(g, 16, -1.5f, 2.5f);
  calibrate(g, in, 16);
  compare(what, g, in, 16, !ceil, ceil, 1, 0);
  qt_backend_desc d;
  qt_backend_desc_xnnpack(&d);
  qt_device *m = qt_device_open(g, &d, err);
  QT_ASSERT(m, "%s", err);
  const char *reason = NULL;
  if (ceil && (qt_device_node_on_backend(m, "avgpool", &reason) != 0 || !strstr(reason, "ceil mode")))
    qt_test_fail("%s: the fallback's reason is '%s', want 'ceil mode ...'", what, reason ? reason : "");
  qt_device_free(m);
  free(in);
  qt_graph_free(g);
}

/* q/dq -> resize nearest x2 -> conv -> q/dq: the resize is our copy on int8 with the input's
 * qparams, exact (the conv reads it) */
static void resize_nearest_pattern(void) {
  qt_graph *g = qt_graph_create("resize_pattern");
  int x = qdq(g, "input.fq", qt_graph_input(g, "input", 5, 4, 8), 8);
  x = qt_graph_resize(g, "up", x, QT_RESIZE_NEAREST);
  x = qdq(g, "conv.fq", qt_graph_conv2d(g, "conv", x, 8, 3, 1, 1, 1, 1), 8);
  finalize(g, x);
  quantize_weights(g, "conv", 1);
  float *in = random_input(g, 16, -1.5f, 2.0f);
  calibrate(g, in, 16);
  compare("resize nearest x2 on int8 -> conv", g, in, 16, 2, 0, 1, 0);
  free(in);
  qt_graph_free(g);
}

/* dq -> resize bilinear x2 -> q on the input's grid (the Quantizer's tie for XNNPACK):
 * XNNPACK's s8 resize, within 1 LSB (it rounds its integer interpolation, the Q/DQ graph rounds
 * the interpolated reals half to even) */
static void resize_bilinear_pattern(int bits) {
  char what[64];
  snprintf(what, sizeof what, "resize bilinear x2, tied qparams, A%d", bits);
  qt_graph *g = qt_graph_create("bilinear_pattern");
  int x = qdq(g, "input.fq", qt_graph_input(g, "input", 7, 6, 8), bits);
  x = qdq(g, "up.fq", qt_graph_resize(g, "up", x, QT_RESIZE_BILINEAR), bits);
  finalize(g, x);
  float *in = random_input(g, 16, -1.5f, 2.5f);
  calibrate(g, in, 16);
  const qt_qstate *src = g->nodes[qt_graph_find_node(g, "input.fq.quantize")].q;
  for (int i = 0; i < g->n_nodes; i++)
    if (strncmp(g->nodes[i].name, "up.fq.", 6) == 0) {
      g->nodes[i].q->scale[0] = src->scale[0];
      g->nodes[i].q->zero_point[0] = src->zero_point[0];
    }
  compare(what, g, in, 16, 1, 0, 1, 0);
  free(in);
  qt_graph_free(g);
}

/* dq -> resize bilinear x2 -> q: its output on a grid of its own, which XNNPACK's s8 resize
 * cannot give: an fp32 fallback partition with its reason; the device equals the float Q/DQ
 * executor bit for bit and the exact reference within 1 LSB. */
static void fallback_pattern(void) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_graph_create("fallback_pattern");
  int x = qt_graph_input(g, "input", 8, 8, 4);
  x = qdq(g, "input.fq", x, 8);
  x = qt_graph_resize(g, "up", x, QT_RESIZE_BILINEAR);
  x = qdq(g, "up.fq", x, 8);
  finalize(g, x);
  float *in = random_input(g, 8, -1.5f, 2.5f);
  calibrate(g, in, 8);
  compare("resize bilinear (fallback)", g, in, 8, 0, 1, 1, 0);
  qt_backend_desc d;
  qt_backend_desc_xnnpack(&d);
  qt_device *m = qt_device_open(g, &d, err);
  QT_ASSERT(m, "%s", err);
  const char *reason = NULL;
  if (qt_device_node_on_backend(m, "up", &reason) != 0 || !strstr(reason, "resize in fp32") ||
      !strstr(reason, "bilinear resize: XNNPACK's s8 resize keeps"))
    qt_test_fail("fallback: up is not listed as an fp32 fallback with its reason (got '%s')", reason ? reason : "");
  const int64_t on = qt_device_output_numel(m) * 8;
  float *got = malloc((size_t)on * sizeof(float));
  QT_ASSERT(qt_device_run(m, got, in, 8, err) == 0, "%s", err);
  qt_ctx *ctx = qt_ctx_create();
  const int64_t shape[4] = {8, 8, 8, 4};
  qt_tensor *y = qt_graph_forward(g, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, in));
  QT_ASSERT(y, "%s", g->error);
  if (memcmp(got, y->data, (size_t)on * sizeof(float)))
    qt_test_fail("fallback: the xnnpack device differs from the float Q/DQ executor");
  qt_ctx_free(ctx);
  free(got);
  qt_device_free(m);
  free(in);
  qt_graph_free(g);
}

/* ---- whole models --------------------------------------------------------------------------- */

static qt_graph *converted_model(const char *model, const qt_backend_desc *d, int wbits, int abits) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_model_build(model, err);
  QT_ASSERT(g, "%s", err);
  qt_graph_init_params(g, 5);
  for (int t = 0; t < g->n_tensors; t++) { /* BN statistics of a trained net */
    const qt_param *p = &g->tensors[t];
    if (!p->is_buffer) continue;
    const int var = strstr(p->name, "running_var") != NULL;
    qt_test_fill_uniform(g->buffers + p->offset, p->numel, var ? 0.5f : -0.2f, var ? 1.5f : 0.2f, 30 + (uint64_t)t);
  }
  qt_quantizer_config qc;
  qt_quantizer_config_default(&qc);
  qc.weight_bits = wbits;
  qc.activation_bits = abits;
  qt_annotations a;
  QT_ASSERT(qt_quantizer(g, d, &qc, &a, err) == 0, "%s", err);
  return qt_test_ptq_convert(g, &a);
}

/* Diagnostic (QT_TEST_LAYERS): the device against the float Q/DQ executor at every dequantize. */
static void per_layer(qt_graph *g, const float *x, int n) {
  char err[QT_ERR_LEN];
  qt_backend_desc d;
  qt_backend_desc_xnnpack(&d);
  qt_device *m = qt_device_open(g, &d, err);
  QT_ASSERT(m, "%s", err);
  qt_ctx *ctx = qt_ctx_create();
  const int64_t shape[4] = {n, 28, 28, 1};
  qt_tensor **vals;
  qt_graph_set_mode(g, QT_MODE_EVAL);
  QT_ASSERT(qt_graph_forward_values(g, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, (void *)x), &vals), "%s", g->error);
  for (int i = 0; i < g->n_nodes; i++) {
    if (g->nodes[i].op != QT_OP_DEQUANTIZE) continue;
    const int64_t on = qt_device_value_numel(m, g->nodes[i].name) * n;
    float *a = malloc((size_t)on * 4);
    QT_ASSERT(qt_device_read_value(m, g->nodes[i].name, a, x, n, err) == 0, "%s", err);
    const float *b = qt_f32(vals[g->nodes[i].output]);
    int64_t diff = 0;
    double mx = 0;
    for (int64_t k = 0; k < on; k++) {
      const double dd = fabs((double)a[k] - b[k]) / g->nodes[i].q->scale[0];
      diff += dd > 1e-6;
      mx = fmax(mx, dd);
    }
    fprintf(stderr, "  %-28s max %.3g LSB, %.4f%% differ\n", g->nodes[i].name, mx, 100.0 * (double)diff / (double)on);
    free(a);
  }
  qt_ctx_free(ctx);
  qt_device_free(m);
}

/* Each integer-weight layer's fp32 bias moved to the nearest multiple of s_x * s_w[c], the
 * accumulator's unit: the int32 bias XNNPACK takes is then exactly the graph's bias. */
static void snap_biases(qt_graph *g) {
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    if (!n->wq || !n->wq->qweight || n->param[QT_P_BIAS] < 0) continue;
    int v = n->inputs[0];
    while (g->nodes[g->values[v].producer].op == QT_OP_FLATTEN ||
           g->nodes[g->values[v].producer].op == QT_OP_MAX_POOL2D)
      v = g->nodes[g->values[v].producer].inputs[0];
    const qt_node *dq = &g->nodes[g->values[v].producer];
    QT_ASSERT(dq->op == QT_OP_DEQUANTIZE, "%s: input not a dequantize", n->name);
    float *b = qt_graph_tensor_data(g, n->param[QT_P_BIAS]);
    for (int c = 0; c < n->attr.out_channels; c++) {
      const double unit = (double)dq->q->scale[0] * (double)n->wq->scale[n->wq->channels == 1 ? 0 : c];
      b[c] = (float)(nearbyint((double)b[c] / unit) * unit);
    }
  }
}

/* snap: biases on the accumulator grid (snap_biases), checked: within 1 LSB, and a top-1 flip
 * only where the exact logits' top two lie within 1 LSB. Without: the graph as convert leaves it
 * (fp32 bias, which XNNPACK rounds to int32 at s_x * s_w: one LSB per layer at most, but the
 * differences compound from layer to layer), measured and printed, not judged. */
static void model_end_to_end(const char *model, int wbits, int abits, int snap) {
  char what[80];
  snprintf(what, sizeof what, "%s W%dA%d%s", model, wbits, abits, snap ? ", bias on grid" : ", fp32 bias (measured)");
  qt_backend_desc d;
  qt_backend_desc_xnnpack(&d);
  qt_graph *g = converted_model(model, &d, wbits, abits);
  if (snap) snap_biases(g);
  enum { N = 1024 };
  float *x = malloc(sizeof(float) * N * 784);
  qt_test_fill_uniform(x, (int64_t)N * 784, -0.8f, 2.0f, 99);
  if (getenv("QT_TEST_LAYERS")) per_layer(g, x, 64);
  const agreement a = compare(what, g, x, N, -1, 0, snap ? 1 : 1e9, 10);
  if (snap && a.top1_unexplained)
    qt_test_fail("%s: %lld top-1 flips where the exact logits' top two are more than 1 LSB apart", what,
                 (long long)a.top1_unexplained);
  /* a batch size changing between runs */
  if (snap) compare(what, g, x + 7 * 784, 13, -1, 0, 1, 10);
  free(x);
  qt_graph_free(g);
}

/* Quantized for oneDNN: u8 activations and per-channel linear weights. Every conv / linear / pool
 * runs in fp32 with a reason naming what XNNPACK cannot take; the result equals the float Q/DQ
 * executor (no silent wrong number). */
static void onednn_model_on_xnnpack(const char *model) {
  char err[QT_ERR_LEN];
  qt_backend_desc o, d;
  qt_backend_desc_onednn_cpu(&o, QT_ISA_VNNI);
  qt_backend_desc_xnnpack(&d);
  qt_graph *g = converted_model(model, &o, 8, 8);
  qt_device *m = qt_device_open(g, &d, err);
  QT_ASSERT(m, "%s", err);
  if (getenv("QT_TEST_VERBOSE")) qt_device_report(m, stderr);
  if (qt_device_count(m, QT_PART_INT8) != 0)
    qt_test_fail("%s quantized for onednn: %d partitions on xnnpack's int8 operators, want 0", model,
                 qt_device_count(m, QT_PART_INT8));
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    if (n->op != QT_OP_CONV2D && n->op != QT_OP_LINEAR && n->op != QT_OP_ADD && n->op != QT_OP_MAX_POOL2D) continue;
    const char *reason = NULL;
    const int on = qt_device_node_on_backend(m, n->name, &reason);
    if (on != 0 || !reason ||
        (!strstr(reason, "XNNPACK's qs8 operators take int8") &&
         !strstr(reason, "XNNPACK's qs8 fully connected takes one weight scale")))
      qt_test_fail("%s quantized for onednn: node %s: on xnnpack %d, reason '%s'", model, n->name, on,
                   reason ? reason : "");
  }
  qt_device_free(m);
  float *x = malloc(sizeof(float) * 64 * 784);
  qt_test_fill_uniform(x, 64 * 784, -0.8f, 2.0f, 7);
  char what[64];
  snprintf(what, sizeof what, "%s for onednn, on xnnpack (fallbacks)", model);
  compare(what, g, x, 64, 0, -1, 1, 10);
  free(x);
  qt_graph_free(g);
}

/* "patterns" (the default): every pattern, the fallback, the oneDNN model on XNNPACK; "models":
 * the end-to-end models (registered separately, label slow: a minute in release, six under
 * ASan). */
int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  const int models_only = argc > 1 && strcmp(argv[1], "models") == 0;
  if (argc > 1 && !models_only && strcmp(argv[1], "patterns") != 0) {
    fprintf(stderr, "usage: test_backend_xnnpack [patterns|models]\n");
    return 2;
  }
  if (models_only) {
    const char *const models[] = {"fashion_cnn", "res_cnn"};
    const int bits[3][2] = {{8, 8}, {4, 8}, {4, 4}};
    for (int m = 0; m < 2; m++)
      for (int b = 0; b < 3; b++) model_end_to_end(models[m], bits[b][0], bits[b][1], 1);
    model_end_to_end("fashion_cnn", 8, 8, 0);
    model_end_to_end("res_cnn", 8, 8, 0);
    return qt_test_finish();
  }
  conv_pattern(3, 16, 1, 0, 1, 8);
  conv_pattern(3, 16, 1, 1, 1, 8);
  conv_pattern(3, 16, 1, 2, 1, 8); /* relu6 as the output clamp */
  conv_pattern(3, 16, 1, 0, 2, 8);
  conv_pattern(3, 16, 1, 1, 1, 4); /* 4-bit output range: the clamp */
  conv_pattern(8, 8, 8, 2, 1, 8);  /* depthwise + relu6 (MobileNet) */
  conv_pattern(8, 8, 8, 0, 2, 8);  /* depthwise, stride 2 */
  conv_pattern(8, 16, 2, 1, 1, 8); /* two groups */
  linear_pattern(0);
  linear_pattern(1);
  linear_pattern(2);
  max_pool_pattern(0);
  max_pool_pattern(1);
  global_avg_pool_pattern(8);
  global_avg_pool_pattern(4);
  add_pattern(0);
  add_pattern(1);
  for (int k = 0; k < QT_ACT_COUNT; k++) activation_pattern((qt_act_kind)k, 8, 0);
  activation_pattern(QT_ACT_ELU, 4, 0);
  activation_pattern(QT_ACT_LEAKY_RELU, 4, 0);
  activation_pattern(QT_ACT_SIGMOID, 8, 1);
  activation_pattern(QT_ACT_TANH, 8, 1);
  mul_pattern(1);
  mul_pattern(0);
  channels_pattern();
  avg_pool_pattern(3, 2, 1, 0, 8);
  avg_pool_pattern(2, 2, 0, 0, 8);
  avg_pool_pattern(3, 1, 1, 0, 4);
  avg_pool_pattern(2, 2, 0, 1, 8); /* 9 x 9: a fifth window over the edge */
  resize_nearest_pattern();
  resize_bilinear_pattern(8);
  resize_bilinear_pattern(4);
  fallback_pattern();
  onednn_model_on_xnnpack("fashion_cnn");
  onednn_model_on_xnnpack("res_cnn");
  return qt_test_finish();
}
