/* The exact reference representation (eval/exact.h):
 * 1. integer-path layers (dq -> conv | linear [-> relu | relu6] -> q -> dq) on random data against
 *    an independent computation here (int64 sums over OIHW weights, float64 requantization):
 *    conv with padding, stride, input zero point, grouped and depthwise, 4-bit output; linear;
 *    conv and linear with an int32 bias (added to the integer sum).
 *    Output integers identical (0 LSB).
 * 2. Ties: a linear whose exact sum is an odd multiple of half the output scale, beyond 2^24
 *    (where float32 sums round), rounds half to even; one unit more rounds up.
 * 3. The answer does not depend on how images are split into calls (7 per call) or on the thread
 *    count (1 or the default).
 * 4. FashionCNN, ResCNN, a depthwise / relu6 / residual add / average-pool / global-pool graph and
 *    a graph of every activation (qt_activation, fp32 between quantized convolutions) and a vision
 *    transformer's block (fp32 position embedding, layer norm and attention), PTQ-converted
 *    W8A8, W4A8 and W4A4 with random weights: the float32 Q/DQ executor within 2 output
 *    LSB of the exact reference (the format's contract), the oneDNN device within 1 LSB; the
 *    counts of differing logits printed. FashionCNN and that graph at W8A8 with int32 biases too.
 * 5. A prepared graph is refused; an fp32 layer (no integer weights) runs in float64 and matches
 *    the float32 executor to float32 rounding (1e-5 relative). */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "eval/exact.h"
#include "eval/report.h"
#include "qat/qat.h"
#include "tests/common/graph_util.h"
#include "tests/common/ptq_util.h"
#include "tests/common/quantizer_util.h"
#include "tests/common/testutil.h"

static uint64_t rng_state = 777;
static uint32_t rnd(void) {
  rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
  return (uint32_t)(rng_state >> 33);
}
static float rnd_uniform(float lo, float hi) { return lo + (hi - lo) * (float)(rnd() & 0xffffff) / 16777216.0f; }

static qt_qstate *act_state(float scale, int zp, int qmax) {
  qt_qspec s;
  memset(&s, 0, sizeof s);
  s.bits = qmax == 15 ? 4 : 8;
  s.qmin = 0;
  s.qmax = qmax;
  s.observer = QT_OBSERVER_MINMAX;
  return qt_test_qstate(&s, 1, scale, zp);
}

static int qdq(qt_graph *g, const char *prefix, int x, float scale, int zp, int qmax) {
  return qt_test_append_qdq(g, prefix, x, act_state(scale, zp, qmax), act_state(scale, zp, qmax));
}

/* Integer weights in [-wmax, wmax], per-channel scales, a random bias. */
static void set_weights(qt_graph *g, const char *name, int wmax) {
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
  float *wf = qt_graph_tensor_data(g, n->param[QT_P_WEIGHT]);
  for (int c = 0; c < OC; c++) n->wq->scale[c] = rnd_uniform(0.002f, 0.02f);
  for (int64_t k = 0; k < w->numel; k++) {
    n->wq->qweight[k] = (int32_t)(rnd() % (2 * wmax + 1)) - wmax;
    wf[k] = (float)n->wq->qweight[k] * n->wq->scale[k / (w->numel / OC)];
  }
  if (n->param[QT_P_BIAS] >= 0) {
    float *b = qt_graph_tensor_data(g, n->param[QT_P_BIAS]);
    for (int c = 0; c < OC; c++) b[c] = rnd_uniform(-0.5f, 0.5f);
  }
  n->wq->calibrated = 1;
  n->wq->observe = 0;
}

static float *random_input(int64_t numel, float lo, float hi) {
  float *x = malloc((size_t)numel * sizeof(float));
  for (int64_t i = 0; i < numel; i++) x[i] = rnd_uniform(lo, hi);
  return x;
}

/* ---- 1. one layer against an independent computation ------------------------------------- */

typedef struct {
  const char *what;
  int linear, H, W, C, OC, K, stride, pad, groups, act; /* act: 0 none, 1 relu, 2 relu6 */
  int in_zp, out_zp, out_qmax;
  int bias_int32; /* an int32 bias (random integers in [-20000, 20000]) instead of a float one */
} layer_case;

static void check_layer(const layer_case *lc) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_graph_create("layer");
  int x = qt_graph_input(g, "input", lc->H, lc->W, lc->C);
  const float s_x = 0.0123f, s_y = lc->out_qmax == 15 ? 0.31f : 0.0437f;
  x = qdq(g, "input", x, s_x, lc->in_zp, 255);
  int y;
  if (lc->linear) {
    x = qt_graph_flatten(g, "flatten", x);
    y = qt_graph_linear(g, "layer", x, lc->OC, 1);
  } else {
    y = qt_graph_conv2d(g, "layer", x, lc->OC, lc->K, lc->stride, lc->pad, lc->groups, 1);
  }
  if (lc->act == 1) y = qt_graph_relu(g, "act", y);
  if (lc->act == 2) y = qt_graph_relu6(g, "act", y);
  y = qdq(g, "out", y, s_y, lc->out_zp, lc->out_qmax);
  QT_ASSERT(qt_graph_finalize(g, y, err) == 0, "%s", err);
  set_weights(g, "layer", 127);
  const qt_node *L = &g->nodes[qt_graph_find_node(g, "layer")];
  float *bias = qt_graph_tensor_data(g, L->param[QT_P_BIAS]);
  if (lc->bias_int32) { /* the integers rule; the float copy (an audit) is 1000 units off, so a
                         * reference that read it would differ */
    L->wq->spec.bias_int32 = 1;
    L->wq->n_qbias = lc->OC;
    L->wq->qbias = malloc((size_t)lc->OC * sizeof(int32_t));
    for (int oc = 0; oc < lc->OC; oc++) {
      L->wq->qbias[oc] = (int32_t)(rnd() % 40001) - 20000;
      bias[oc] = ((float)L->wq->qbias[oc] + 1000.0f) * (s_x * L->wq->scale[oc]);
    }
  }

  enum { N = 5 };
  const int64_t in_image = (int64_t)lc->H * lc->W * lc->C;
  float *input = random_input(N * in_image, -0.5f, 2.6f);
  int32_t *qx = malloc((size_t)(N * in_image) * sizeof *qx);
  qt_quantize(qx, input, N * in_image, 1, 1, &s_x, &(int32_t){lc->in_zp}, 0, 255);

  const qt_value *ov = &g->values[L->output];
  const int OH = lc->linear ? 1 : (int)ov->shape[0], OW = lc->linear ? 1 : (int)ov->shape[1];
  const int KH = lc->linear ? 1 : lc->K, KW = KH, Cg = lc->linear ? (int)in_image : lc->C / lc->groups;
  const int OCg = lc->OC / (lc->linear ? 1 : lc->groups);
  const int64_t out_image = (int64_t)OH * OW * lc->OC;
  float *want = malloc((size_t)(N * out_image) * sizeof *want), *got = malloc((size_t)(N * out_image) * sizeof *got);
  for (int b = 0; b < N; b++)
    for (int oh = 0; oh < OH; oh++)
      for (int ow = 0; ow < OW; ow++)
        for (int oc = 0; oc < lc->OC; oc++) {
          int64_t acc = 0;
          for (int c = 0; c < Cg; c++)
            for (int kh = 0; kh < KH; kh++)
              for (int kw = 0; kw < KW; kw++) {
                int64_t xi; /* the input integer, centred; 0 in the padding */
                if (lc->linear) {
                  xi = qx[b * in_image + c] - lc->in_zp;
                } else {
                  const int ih = oh * lc->stride - lc->pad + kh, iw = ow * lc->stride - lc->pad + kw;
                  const int ci = (oc / OCg) * Cg + c;
                  xi = ih < 0 || ih >= lc->H || iw < 0 || iw >= lc->W
                           ? 0
                           : qx[b * in_image + ((int64_t)ih * lc->W + iw) * lc->C + ci] - lc->in_zp;
                }
                acc += xi * L->wq->qweight[(((int64_t)oc * Cg + c) * KH + kh) * KW + kw];
              }
          /* an int32 bias is added in accumulator units */
          double v = lc->bias_int32 ? (double)(acc + L->wq->qbias[oc]) * ((double)s_x * (double)L->wq->scale[oc])
                                    : (double)acc * ((double)s_x * (double)L->wq->scale[oc]) + (double)bias[oc];
          if (lc->act >= 1) v = v > 0 ? v : 0;
          if (lc->act == 2) v = v < 6 ? v : 6;
          double q = nearbyint(v / (double)s_y) + lc->out_zp;
          q = q < 0 ? 0 : q > lc->out_qmax ? lc->out_qmax : q;
          want[b * out_image + ((int64_t)oh * OW + ow) * lc->OC + oc] = (float)(q - lc->out_zp) * s_y;
        }
  qt_exact *e = qt_exact_open(g, err);
  if (!e) {
    qt_test_fail("%s: open: %s", lc->what, err);
  } else {
    QT_CHECK(qt_exact_integer_layers(e) == 1);
    QT_CHECK(qt_exact_run(e, got, input, N, err) == 0);
    int64_t bad = 0;
    for (int64_t k = 0; k < N * out_image; k++) bad += got[k] != want[k];
    if (bad)
      qt_test_fail("%s: %lld of %lld outputs differ from the independent integer computation", lc->what, (long long)bad,
                   (long long)(N * out_image));
    else
      printf("%s: %lld outputs identical to the independent integer computation\n", lc->what,
             (long long)(N * out_image));
  }
  qt_exact_free(e);
  free(input);
  free(qx);
  free(want);
  free(got);
  qt_graph_free(g);
}

/* ---- 2. ties ----------------------------------------------------------------------------- */

/* A linear with s_x = s_w = 1 and output scale 2^18 whose inputs and weights make the sum
 * exactly `acc`; returns the output integer the exact reference computes (and the float32
 * executor's in *float_q). */
static int tie_case(int64_t target, int *float_q) {
  char err[QT_ERR_LEN];
  enum { IN = 1024 };
  qt_graph *g = qt_graph_create("ties");
  int x = qt_graph_input(g, "input", 1, 1, IN);
  x = qdq(g, "input", x, 1.0f, 0, 255);
  x = qt_graph_flatten(g, "flatten", x);
  int y = qt_graph_linear(g, "fc", x, 1, 0);
  y = qdq(g, "out", y, 262144.0f, 0, 255);
  QT_ASSERT(qt_graph_finalize(g, y, err) == 0, "%s", err);
  set_weights(g, "fc", 0);
  qt_node *n = &g->nodes[qt_graph_find_node(g, "fc")];
  n->wq->scale[0] = 1.0f;
  float *input = calloc(IN, sizeof *input);
  int64_t rest = target;
  int k = 0;
  for (; rest >= 255 * 127 && k < IN - 2; k++) { /* x = 255, w = 127 */
    input[k] = 255;
    n->wq->qweight[k] = 127;
    rest -= 255 * 127;
  }
  for (; rest > 0 && k < IN; k++) { /* then the remainder in pieces of at most 255 x 127 */
    const int64_t w = rest >= 255 ? (rest / 255 < 127 ? rest / 255 : 127) : 1;
    const int64_t xv = rest >= 255 ? 255 : rest;
    input[k] = (float)xv;
    n->wq->qweight[k] = (int32_t)w;
    rest -= xv * w;
  }
  QT_ASSERT(rest == 0, "tie case %lld: %lld left", (long long)target, (long long)rest);
  float *w = qt_graph_tensor_data(g, n->param[QT_P_WEIGHT]);
  for (int i = 0; i < IN; i++) w[i] = (float)n->wq->qweight[i];
  float out = 0;
  qt_exact *e = qt_exact_open(g, err);
  QT_ASSERT(e, "%s", err);
  QT_CHECK(qt_exact_run(e, &out, input, 1, err) == 0);
  qt_exact_free(e);
  qt_ctx *ctx = qt_ctx_create();
  const int64_t shape[4] = {1, 1, 1, IN};
  qt_graph_set_mode(g, QT_MODE_EVAL);
  qt_tensor *t = qt_graph_forward(g, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, input));
  QT_ASSERT(t, "%s", g->error);
  *float_q = (int)(qt_f32(t)[0] / 262144.0f);
  qt_ctx_free(ctx);
  free(input);
  qt_graph_free(g);
  return (int)(out / 262144.0f);
}

static void check_ties(void) {
  const int64_t half = 131072; /* half the output scale */
  struct {
    int64_t acc;
    int want;
  } cases[] = {{201 * half, 100}, {203 * half, 102}, {201 * half + 1, 101}, {203 * half - 1, 101}, {199 * half, 100}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int fq;
    const int q = tie_case(cases[i].acc, &fq);
    printf("ties: sum %lld = %.6f output steps: exact %d (want %d), float32 executor %d\n", (long long)cases[i].acc,
           (double)cases[i].acc / (2.0 * (double)half), q, cases[i].want, fq);
    if (q != cases[i].want)
      qt_test_fail("ties: sum %lld: exact reference gives %d, want %d", (long long)cases[i].acc, q, cases[i].want);
  }
}

/* ---- 3 and 4. whole models ---------------------------------------------------------------- */

static qt_graph *mobile_graph(void) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_graph_create("mobile_like");
  int x = qt_graph_input(g, "input", 28, 28, 1);
  int a = qt_graph_relu6(g, "relu1", qt_graph_conv2d(g, "conv1", x, 8, 3, 1, 1, 1, 1));
  int r = qt_graph_relu6(g, "relu2", qt_graph_conv2d(g, "dw", a, 8, 3, 2, 1, 8, 1));
  int p = qt_graph_conv2d(g, "pw", r, 8, 1, 1, 0, 1, 1);
  int s = qt_graph_add(g, "add", p, r);
  int ap = qt_graph_avg_pool2d(g, "avgpool", s, 2, 2, 0);
  int gp = qt_graph_global_avg_pool(g, "gap", ap);
  int y = qt_graph_linear(g, "fc", gp, 10, 1);
  QT_ASSERT(qt_graph_finalize(g, y, err) == 0, "%s", err);
  return g;
}

/* Every activation of qt_activation between convolutions, then a squeeze-excite mul, an image
 * times itself, a concat of three values, a channel shuffle and a channel slice (fp32 between
 * quantized neighbours). */
static qt_graph *act_graph(void) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_graph_create("act_like");
  const qt_act kinds[] = {
      qt_act_default(QT_ACT_HARDSWISH), qt_act_default(QT_ACT_SILU),      qt_act_default(QT_ACT_GELU),
      {QT_ACT_LEAKY_RELU, 0.2f, 0},     qt_act_default(QT_ACT_ELU),       qt_act_default(QT_ACT_GELU_TANH),
      qt_act_default(QT_ACT_TANH),      {QT_ACT_HARDSIGMOID, 0.2f, 0.5f}, qt_act_default(QT_ACT_SIGMOID)};
  int v = qt_graph_input(g, "input", 28, 28, 1);
  char name[32];
  for (int k = 0; k < (int)(sizeof kinds / sizeof kinds[0]); k++) {
    snprintf(name, sizeof name, "conv%d", k);
    v = qt_graph_conv2d(g, name, v, 8, 3, k % 3 == 1 ? 2 : 1, 1, k % 3 == 2 ? 8 : 1, 1);
    snprintf(name, sizeof name, "act%d", k);
    v = qt_graph_activation(g, name, v, kinds[k]);
  }
  /* squeeze-excite: the image times its channel gates (mul by a (C) vector), then by itself */
  int s = qt_graph_relu(g, "se.relu", qt_graph_linear(g, "se.fc1", qt_graph_global_avg_pool(g, "se.pool", v), 4, 1));
  s = qt_graph_activation(g, "se.gate", qt_graph_linear(g, "se.fc2", s, 8, 1), qt_act_default(QT_ACT_HARDSIGMOID));
  v = qt_graph_mul(g, "se", v, s);
  v = qt_graph_mul(g, "square", v, v);
  /* three values joined along channels: 8 + 8 + 4 */
  const int parts[3] = {v, qt_graph_relu(g, "cat.relu", v), qt_graph_conv2d(g, "cat.conv", v, 4, 1, 1, 0, 1, 1)};
  v = qt_graph_concat(g, "cat", parts, 3);
  /* its 20 channels shuffled in 4 groups, then channels [2, 14) */
  v = qt_graph_channel_slice(g, "slice", qt_graph_channel_shuffle(g, "shuffle", v, 4), 2, 14);
  int y = qt_graph_linear(g, "fc", qt_graph_global_avg_pool(g, "gap", v), 10, 1);
  QT_ASSERT(qt_graph_finalize(g, y, err) == 0, "%s", err);
  return g;
}

/* A vision transformer's block (fp32 add_param, layer_norm and attention between quantized 1x1
 * convolutions): 4x4 patches of 16 channels, a position embedding (random), a pre-norm attention
 * block of 4 heads with its residual, a layer norm, the mean token, a linear head. */
static qt_graph *vit_graph(void) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_graph_create("vit_like");
  int x = qt_graph_input(g, "input", 28, 28, 1);
  int t = qt_graph_add_param(g, "pos", qt_graph_conv2d(g, "patch", x, 16, 4, 4, 0, 1, 1));
  int n = qt_graph_layer_norm(g, "norm1", t, 1e-6f);
  int q = qt_graph_conv2d(g, "q", n, 16, 1, 1, 0, 1, 1), k = qt_graph_conv2d(g, "k", n, 16, 1, 1, 0, 1, 1),
      v = qt_graph_conv2d(g, "v", n, 16, 1, 1, 0, 1, 1);
  int a = qt_graph_conv2d(g, "proj", qt_graph_attention(g, "attn", q, k, v, 4), 16, 1, 1, 0, 1, 1);
  int r = qt_graph_layer_norm(g, "norm", qt_graph_add(g, "res", t, a), 1e-6f);
  int y = qt_graph_linear(g, "head", qt_graph_global_avg_pool(g, "mean", r), 10, 1);
  QT_ASSERT(qt_graph_finalize(g, y, err) == 0, "%s", err);
  qt_param *p = &g->tensors[g->nodes[qt_graph_find_node(g, "pos")].param[QT_P_WEIGHT]];
  for (int64_t i = 0; i < p->numel; i++) g->params[p->offset + i] = rnd_uniform(-0.5f, 0.5f);
  return g;
}

static int g_bias_int32; /* converted: quant.bias = int32 */

static qt_graph *converted(const char *model, int wbits, int abits, uint64_t seed) {
  char err[QT_ERR_LEN];
  qt_graph *g = strcmp(model, "mobile_like") == 0 ? mobile_graph()
                : strcmp(model, "act_like") == 0  ? act_graph()
                : strcmp(model, "vit_like") == 0  ? vit_graph()
                                                  : qt_model_build(model, err);
  QT_ASSERT(g, "%s", err);
  qt_graph_init_params(g, seed);
  qt_quantizer_config qc = qt_test_quantizer_config(wbits, abits);
  qc.bias = g_bias_int32 ? QT_BIAS_INT32 : QT_BIAS_FLOAT;
  qt_annotations a;
  QT_ASSERT(qt_test_quantizer_onednn(g, &qc, QT_ISA_AUTO, &a, err) == 0, "%s", err);
  qt_graph *c = qt_test_ptq_convert(g, &a);
  qt_graph_set_mode(c, QT_MODE_EVAL);
  return c;
}

static void check_model(const char *model, int wbits, int abits) {
  char err[QT_ERR_LEN];
  enum { N = 128 };
  qt_graph *g = converted(model, wbits, abits, 5);
  qt_exact *e = qt_exact_open(g, err);
  QT_ASSERT(e, "%s", err);
  const int64_t classes = qt_exact_output_numel(e);
  float *x = random_input((int64_t)N * 784, -0.8f, 2.0f);
  float *ref = malloc((size_t)(N * classes) * sizeof *ref), *tmp = malloc((size_t)(N * classes) * sizeof *tmp);
  double t0 = qt_now_seconds();
  QT_CHECK(qt_exact_run(e, ref, x, N, err) == 0);
  const double t_exact = qt_now_seconds() - t0;

  /* 3. split into calls of 7 images, and on 1 thread: bit-identical */
  int64_t moved = 0;
  for (int i = 0; i < N; i += 7)
    QT_CHECK(qt_exact_run(e, tmp + i * classes, x + i * 784, N - i < 7 ? N - i : 7, err) == 0);
  for (int64_t k = 0; k < N * classes; k++) moved += tmp[k] != ref[k];
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  QT_CHECK(qt_exact_run(e, tmp, x, N, err) == 0);
  omp_set_num_threads(threads);
  for (int64_t k = 0; k < N * classes; k++) moved += tmp[k] != ref[k];
  if (moved)
    qt_test_fail("%s W%dA%d: %lld outputs change with the split or the thread count", model, wbits, abits,
                 (long long)moved);

  /* 4. the float32 executor and the oneDNN device against it */
  const float lsb = qt_output_lsb(g);
  qt_device_agreement fl, dev;
  qt_device_agreement_init(&fl, lsb);
  qt_device_agreement_init(&dev, lsb);
  qt_ctx *ctx = qt_ctx_create();
  qt_ctx_set_grad(ctx, 0);
  const int64_t shape[4] = {N, 28, 28, 1};
  t0 = qt_now_seconds();
  qt_tensor *y = qt_graph_forward(g, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, x));
  const double t_float = qt_now_seconds() - t0;
  QT_ASSERT(y, "%s", g->error);
  qt_device_agreement_add(&fl, qt_f32(y), ref, NULL, N, classes);
  qt_device *d = qt_device_open(g, NULL, err);
  QT_ASSERT(d, "%s", err);
  QT_CHECK(qt_device_run(d, tmp, x, N, err) == 0);
  qt_device_agreement_add(&dev, tmp, ref, NULL, N, classes);
  printf(
      "%s W%dA%d%s: %d integer layers; float32 executor vs exact: max %.2f LSB, %lld of %lld differ; oneDNN vs "
      "exact: max %.2f LSB, %lld differ (%d images: exact %.3f s, float32 executor %.3f s)\n",
      model, wbits, abits, g_bias_int32 ? " int32 bias" : "", qt_exact_integer_layers(e), fl.max_lsb,
      (long long)fl.differ, (long long)fl.outputs, dev.max_lsb, (long long)dev.differ, N, t_exact, t_float);
  QT_CHECK(lsb > 0);
  QT_CHECK(qt_exact_integer_layers(e) >= 2);
  if (fl.max_lsb > 2.0 + 1e-4)
    qt_test_fail("%s: float32 executor %.2f LSB from exact (contract: 2)", model, fl.max_lsb);
  if (!qt_device_agreement_pass(&dev)) qt_test_fail("%s: the oneDNN device fails the rule against exact", model);
  qt_device_free(d);
  qt_ctx_free(ctx);
  qt_exact_free(e);
  free(x);
  free(ref);
  free(tmp);
  qt_graph_free(g);
}

/* ---- 5. refusals and fp32 layers --------------------------------------------------------- */

static void check_prepared_and_fp32(void) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_model_build("fashion_cnn", err);
  qt_graph_init_params(g, 3);
  qt_graph *p = qt_test_prepare_ptq_onednn(g);
  qt_exact *e = qt_exact_open(p, err);
  QT_CHECK(e == NULL);
  QT_CHECK(strstr(err, "prepared graph") != NULL);
  printf("prepared graph: %s\n", err);
  qt_graph_free(p);

  /* the fp32 model itself: every layer on the float64 path */
  e = qt_exact_open(g, err);
  QT_ASSERT(e, "%s", err);
  QT_CHECK(qt_exact_integer_layers(e) == 0);
  enum { N = 16 };
  float *x = random_input(N * 784, -0.8f, 2.0f), out[N * 10];
  QT_CHECK(qt_exact_run(e, out, x, N, err) == 0);
  qt_ctx *ctx = qt_ctx_create();
  const int64_t shape[4] = {N, 28, 28, 1};
  qt_graph_set_mode(g, QT_MODE_EVAL);
  qt_tensor *y = qt_graph_forward(g, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, x));
  QT_ASSERT(y, "%s", g->error);
  qt_test_close("fp32 model: exact (float64) vs float32 executor", out, qt_f32(y), N * 10, 1e-5f, 1e-5f);
  qt_ctx_free(ctx);
  qt_exact_free(e);
  free(x);
  qt_graph_free(g);
}

int main(void) {
  const layer_case layers[] = {
      {"conv 3x3 pad 1, input zp 37", 0, 9, 9, 5, 6, 3, 1, 1, 1, 0, 37, 0, 255, 0},
      {"conv 3x3 stride 2, relu, output zp 40", 0, 10, 10, 16, 8, 3, 2, 1, 1, 1, 0, 40, 255, 0},
      {"grouped conv (2 groups), relu6, 4-bit output", 0, 8, 8, 8, 4, 3, 1, 1, 2, 2, 12, 3, 15, 0},
      {"depthwise conv 3x3, relu6", 0, 12, 12, 8, 8, 3, 1, 1, 8, 2, 5, 0, 255, 0},
      {"linear 200 -> 10, input zp 90, relu", 1, 5, 5, 8, 10, 1, 1, 0, 1, 1, 90, 0, 255, 0},
      {"conv 3x3 pad 1, input zp 37, int32 bias", 0, 9, 9, 5, 6, 3, 1, 1, 1, 0, 37, 0, 255, 1},
      {"linear 200 -> 10, input zp 90, relu, int32 bias", 1, 5, 5, 8, 10, 1, 1, 0, 1, 1, 90, 0, 255, 1},
  };
  for (size_t i = 0; i < sizeof layers / sizeof layers[0]; i++) check_layer(&layers[i]);
  check_ties();
  const char *models[] = {"fashion_cnn", "res_cnn", "mobile_like", "act_like", "vit_like"};
  const int bits[][2] = {{8, 8}, {4, 8}, {4, 4}};
  for (int m = 0; m < 5; m++)
    for (int b = 0; b < 3; b++) check_model(models[m], bits[b][0], bits[b][1]);
  g_bias_int32 = 1;
  check_model("fashion_cnn", 8, 8);
  check_model("mobile_like", 8, 8);
  g_bias_int32 = 0;
  check_prepared_and_fp32();
  return qt_test_finish();
}
