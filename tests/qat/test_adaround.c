/* AdaRound (autograd/ops_adaround.c, qat/adaround.c).
 * - The formulas against PyTorch 1.13 statements of them (tests/ref/adaround.h5,
 *   tests/ref/make_ref_adaround.py): the start v from a weight's fraction, the rectified sigmoid
 *   h and its slope, the soft-quantized weight w~ and the gradient of sum((w~ - w)^2) / n through
 *   it (w~'s backward composed with the squared error's), the rounding regularizer at beta 20, 8
 *   and 2 and its gradient, the squared error and its gradient: 4 cases (4-bit per channel,
 *   4-bit unsigned affine per tensor, 2-bit, 8-bit) with v reaching both clamps of h. Tolerances:
 *   1e-6 absolute + 1e-5 relative (expf against torch's sigmoid, one float rounding apart), the
 *   losses 1e-5 relative.
 * - One layer (a 3x3 conv, 8 -> 16 channels, and its relu, 3-bit per-channel weights, 8-bit
 *   activations) calibrated on 256 random images: AdaRound lowers the mean squared error of the
 *   quantized graph's output against the float graph's, measured here by plain forwards on 256
 *   other images, to at most 1/2 of rounding to nearest's; every weight ends on its grid (fake quant
 *   leaves it unchanged; convert's integers dequantize to it exactly), within one step of where
 *   it was, and some weights are rounded away from nearest.
 * - QDrop's mix: the share of float elements at the probability, the same draws for the same seed,
 *   each gradient to the input taken.
 * - Blocks: two conv groups (3-bit weights, 4-bit activations) reconstructed as blocks with their
 *   activation scales learned and QDrop: the output MSE on held-out images at most 2/3 of rounding
 *   to nearest's; ResCNN's five blocks (its residual blocks whole).
 * - Refusals: a graph not calibrated (naming the layer), settings out of range. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qat/qat.h"
#include "tests/common/quantizer_util.h"
#include "tests/common/testutil.h"

#define ATOL 1e-6f
#define RTOL 1e-5f

static float *load(const char *ref, const char *name, int64_t *n) { return qt_test_load_f32_n(ref, name, n); }

static void test_case(const char *ref, int i, const float *betas, int n_betas) {
  char name[64], what[96];
  int64_t n, k;
#define LOAD(var, suffix)                         \
  snprintf(name, sizeof name, "ar%d_" suffix, i); \
  float *var = load(ref, name, &k)
  snprintf(name, sizeof name, "ar%d_meta", i);
  int32_t *meta = qt_test_load_i32_n(ref, name, &k);
  snprintf(name, sizeof name, "ar%d_zp", i);
  int32_t *zp = qt_test_load_i32_n(ref, name, &k);
  LOAD(scale, "scale");
  LOAD(w, "w");
  n = k;
  LOAD(v, "v");
  LOAD(v_init, "v_init");
  LOAD(h, "h");
  LOAD(dh, "dh");
  LOAD(wsoft, "wsoft");
  LOAD(dv_w, "dv_w");
  LOAD(rl, "rl");
  LOAD(drl, "drl");
#undef LOAD
  const int64_t outer = meta[0], inner = meta[2];
  const int C = meta[1], qmin = meta[3], qmax = meta[4];
  QT_CHECK(outer * C * inner == n);
  float *got = malloc((size_t)n * sizeof(float)), *w_floor = malloc((size_t)n * sizeof(float));
  for (int64_t j = 0; j < n; j++) {
    const int c = (int)(j / inner % C);
    const float ws = w[j] / scale[c];
    w_floor[j] = floorf(ws);
    got[j] = qt_adaround_v_init(ws - w_floor[j]);
  }
  snprintf(what, sizeof what, "case %d: v start", i);
  qt_test_close(what, got, v_init, n, ATOL, RTOL);
  for (int64_t j = 0; j < n; j++) got[j] = qt_adaround_h(v[j]);
  snprintf(what, sizeof what, "case %d: h(v)", i);
  qt_test_close(what, got, h, n, ATOL, RTOL);
  for (int64_t j = 0; j < n; j++) got[j] = qt_adaround_dh(v[j]);
  snprintf(what, sizeof what, "case %d: dh/dv", i);
  qt_test_close(what, got, dh, n, ATOL, RTOL);
  int clamped = 0;
  for (int64_t j = 0; j < n; j++) clamped += dh[j] == 0.0f;
  if (!(clamped > 0 && clamped < n))
    qt_test_fail("case %d: the reference's v reach the clamps %d of %lld times", i, clamped, (long long)n);

  qt_ctx *ctx = qt_ctx_create();
  qt_ctx_set_grad(ctx, 1);
  float *vdata = qt_test_copy_f32(v, n), *dv = qt_test_zeros(n);
  qt_tensor *vt = qt_tensor_wrap(ctx, QT_F32, 1, &n, vdata);
  vt->grad = dv;
  vt->requires_grad = 1;
  qt_tensor *y = qt_adaround_weight(ctx, vt, w_floor, outer, C, inner, scale, zp, qmin, qmax);
  snprintf(what, sizeof what, "case %d: soft weight", i);
  qt_test_close(what, qt_f32(y), wsoft, n, ATOL, RTOL);
  qt_backward(ctx, qt_squared_error(ctx, y, w, (double)n));
  snprintf(what, sizeof what, "case %d: d sum((w~ - w)^2) / n / dv", i);
  qt_test_close(what, dv, dv_w, n, ATOL, RTOL);
  for (int b = 0; b < n_betas; b++) {
    qt_ctx_reset(ctx);
    memset(dv, 0, (size_t)n * sizeof(float));
    vt = qt_tensor_wrap(ctx, QT_F32, 1, &n, vdata);
    vt->grad = dv;
    vt->requires_grad = 1;
    qt_tensor *loss = qt_adaround_round_loss(ctx, vt, betas[b], 0.01f);
    snprintf(what, sizeof what, "case %d: regularizer at beta %g", i, (double)betas[b]);
    qt_test_close(what, qt_f32(loss), &rl[b], 1, 0.0f, RTOL);
    qt_backward(ctx, loss);
    snprintf(what, sizeof what, "case %d: regularizer's gradient at beta %g", i, (double)betas[b]);
    qt_test_close(what, dv, drl + b * n, n, ATOL, RTOL);
  }
  qt_ctx_free(ctx);
  QT_FREE_ALL(meta, zp, scale, w, v, v_init, h, dh, wsoft, dv_w, rl, drl, got, w_floor, vdata, dv);
}

static void test_formulas(void) {
  const char *ref = qt_test_path("tests/ref/adaround.h5");
  int64_t k;
  int32_t *count = qt_test_load_i32_n(ref, "ar_count", &k);
  float *betas = load(ref, "ar_betas", &k);
  for (int i = 0; i < count[0]; i++) test_case(ref, i, betas, (int)k);
  /* the squared error */
  int64_t n;
  float *x = load(ref, "se_x", &n), *t = load(ref, "se_t", &k), *want = load(ref, "se_loss", &k),
        *dx_want = load(ref, "se_dx", &k);
  qt_ctx *ctx = qt_ctx_create();
  qt_ctx_set_grad(ctx, 1);
  float *dx = qt_test_zeros(n);
  const int64_t shape[4] = {2, 3, 3, 4};
  qt_tensor *xt = qt_tensor_wrap(ctx, QT_F32, 4, shape, x);
  xt->grad = dx;
  xt->requires_grad = 1;
  qt_tensor *loss = qt_squared_error(ctx, xt, t, (double)n / 4);
  qt_test_close("squared error", qt_f32(loss), want, 1, 0.0f, RTOL);
  qt_backward(ctx, loss);
  qt_test_close("squared error's gradient", dx, dx_want, n, ATOL, RTOL);
  qt_ctx_free(ctx);
  QT_FREE_ALL(count, betas, x, t, want, dx_want, dx);
}

enum { H = 8, W = 8, CIN = 8, COUT = 16, M = 256 };

/* g (consumed) prepared for PTQ at WwA a bits as the oneDNN quantizer annotates it with VNNI (8-bit
 * weights keep 8 bits), calibrated on the n images x. */
static qt_graph *prepared_calibrated(qt_graph *g, int w, int a, const float *x, int64_t n) {
  const qt_quantizer_config qc = qt_test_quantizer_config(w, a);
  qt_graph *p = qt_test_prepare_onednn_isa(g, &qc, QT_PREPARE_PTQ, QT_ISA_VNNI);
  qt_graph_free(g);
  qt_test_calibrate(p, x, n);
  return p;
}

/* input (8, 8, 8) -> conv 3x3 (16) -> relu, prepared for PTQ at W3A8 and calibrated on x. */
static qt_graph *one_layer(const float *x) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_graph_create("one_layer");
  int v = qt_graph_input(g, "input", H, W, CIN);
  v = qt_graph_conv2d(g, "conv", v, COUT, 3, 1, 1, 1, 1);
  v = qt_graph_relu(g, "relu", v);
  if (qt_graph_finalize(g, v, err)) qt_test_fail("one_layer: %s", err);
  qt_graph_init_params(g, 11);
  return prepared_calibrated(g, 3, 8, x, M);
}

/* The graph's output on the M images x in `mode`, copied. */
static float *output(qt_graph *p, qt_graph_mode mode, const float *x, int64_t *n) {
  qt_ctx *ctx = qt_ctx_create();
  const int64_t shape[4] = {M, H, W, CIN};
  qt_graph_set_mode(p, mode);
  qt_tensor *y = qt_graph_forward(p, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, (void *)x));
  if (!y) qt_test_fail("forward: %s", p->error);
  *n = y ? qt_tensor_numel(y) : 0;
  float *out = qt_test_copy_f32(y ? qt_f32(y) : NULL, *n);
  qt_ctx_free(ctx);
  return out;
}

/* M images with correlated pixels, as real images have (with independent ones the rounding errors
 * of a layer's weights add up independently and rounding to nearest is already the best): a
 * random 4 x 4 pattern upsampled to H x W, times a per-channel gain, plus 10% noise. */
static float *images(uint64_t seed) {
  const int64_t numel = (int64_t)M * H * W * CIN;
  float *x = malloc((size_t)numel * sizeof(float));
  float *coarse = qt_test_uniform_range((int64_t)M * 16, -1.0f, 1.0f, seed);
  float *gain = qt_test_uniform_range(CIN, 0.5f, 1.5f, seed + 1);
  float *noise = qt_test_uniform_range(numel, -0.1f, 0.1f, seed + 2);
  for (int64_t m = 0; m < M; m++)
    for (int h = 0; h < H; h++)
      for (int w = 0; w < W; w++)
        for (int c = 0; c < CIN; c++) {
          const int64_t i = ((m * H + h) * W + w) * CIN + c;
          x[i] = coarse[m * 16 + (h * 4 / H) * 4 + w * 4 / W] * gain[c] + noise[i];
        }
  QT_FREE_ALL(coarse, gain, noise);
  return x;
}

static double mse(const float *a, const float *b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
  return s / (double)n;
}

static void test_one_layer(void) {
  char err[QT_ERR_LEN];
  float *calib = images(31), *test = images(41);
  qt_graph *p = one_layer(calib);
  int64_t n;
  float *want = output(p, QT_MODE_EVAL_FLOAT, test, &n), *nearest = output(p, QT_MODE_EVAL, test, &n);
  const qt_node *conv = &p->nodes[qt_graph_find_node(p, "conv")];
  const qt_param *wp = &p->tensors[conv->param[QT_P_WEIGHT]];
  float *w0 = qt_test_copy_f32(qt_graph_tensor_data(p, conv->param[QT_P_WEIGHT]), wp->numel);

  qt_adaround_config c;
  qt_adaround_config_default(&c);
  c.iterations = 1000;
  qt_adaround_result r;
  qt_ctx *ctx = qt_ctx_create();
  if (qt_adaround(p, ctx, NULL, calib, M, &c, &r, NULL, err)) qt_test_fail("adaround: %s", err);
  qt_ctx_free(ctx);
  float *rounded = output(p, QT_MODE_EVAL, test, &n);
  const double e_nearest = mse(want, nearest, n), e_ada = mse(want, rounded, n);
  if (!(e_ada <= 0.5 * e_nearest))
    qt_test_fail("adaround: output MSE %.4g against %.4g rounding to nearest (bound: 1/2 of it)", e_ada, e_nearest);
  QT_CHECK(r.units == 1 && r.layers == 1 && r.listed == 1 && strcmp(r.unit[0].name, "conv") == 0 &&
           r.unit[0].weights == wp->numel);
  QT_CHECK(r.unit[0].flipped > 0.01 && r.unit[0].sqnr_adaround_db > r.unit[0].sqnr_nearest_db);

  /* on the grid: fake quant leaves every weight as it is, within one step of where it was */
  const qt_qstate *q = conv->wq;
  const float *w = qt_graph_tensor_data(p, conv->param[QT_P_WEIGHT]);
  const int64_t inner = wp->numel / q->channels;
  int off_grid = 0, moved = 0;
  for (int64_t i = 0; i < wp->numel; i++) {
    const int ch = q->channels == 1 ? 0 : (int)(i / inner);
    const float s = q->scale[ch];
    const float fq =
        (fminf(fmaxf(nearbyintf(w[i] / s) + (float)q->zero_point[ch], (float)q->spec.qmin), (float)q->spec.qmax) -
         (float)q->zero_point[ch]) *
        s;
    off_grid += fq != w[i];
    moved += !(fabsf(w[i] - w0[i]) <= s * 1.0001f);
  }
  if (off_grid || moved)
    qt_test_fail("adaround: %d weights off their grid, %d moved more than a step", off_grid, moved);
  qt_graph_set_mode(p, QT_MODE_EVAL);
  qt_graph *cv = qt_convert(p, err);
  if (!cv) qt_test_fail("convert: %s", err);
  const qt_node *cc = cv ? &cv->nodes[qt_graph_find_node(cv, "conv")] : NULL;
  int differ = 0;
  for (int64_t i = 0; cc && i < wp->numel; i++) {
    const int ch = (int)(i / inner);
    differ += (float)(cc->wq->qweight[i] - cc->wq->zero_point[ch]) * cc->wq->scale[ch] != w[i];
  }
  if (differ) qt_test_fail("convert: %d integer weights do not dequantize to AdaRound's", differ);
  if (getenv("QT_TEST_VERBOSE"))
    printf(
        "one layer W3A8: output MSE %.4g (nearest) -> %.4g (adaround), %.1f%% flipped; layer SQNR %.2f -> %.2f "
        "dB\n",
        e_nearest, e_ada, 100 * r.unit[0].flipped, r.unit[0].sqnr_nearest_db, r.unit[0].sqnr_adaround_db);
  qt_graph_free(cv);
  qt_graph_free(p);
  QT_FREE_ALL(calib, test, want, nearest, w0, rounded);
}

/* QDrop's mix: each element from x with probability drop (binomial bounds at 5 sigma), the same for
 * the same seed, the gradient routed to the input taken. */
static void test_qdrop(void) {
  enum { NQ = 20000 };
  qt_ctx *ctx = qt_ctx_create();
  qt_ctx_set_grad(ctx, 1);
  const int64_t n = NQ;
  float *x = qt_test_uniform_range(n, 1.0f, 2.0f, 51), *xq = qt_test_uniform_range(n, -2.0f, -1.0f, 52);
  float *dx = qt_test_zeros(n), *dq = qt_test_zeros(n);
  qt_tensor *a = qt_tensor_wrap(ctx, QT_F32, 1, &n, x), *b = qt_tensor_wrap(ctx, QT_F32, 1, &n, xq);
  a->grad = dx;
  b->grad = dq;
  a->requires_grad = b->requires_grad = 1;
  qt_tensor *y = qt_qdrop(ctx, a, b, 0.3f, 77), *y2 = qt_qdrop(ctx, a, b, 0.3f, 77);
  int took = 0, same = 1;
  for (int64_t i = 0; i < n; i++) {
    took += qt_f32(y)[i] > 0;
    same &= qt_f32(y)[i] == qt_f32(y2)[i];
  }
  const double sigma = sqrt(n * 0.3 * 0.7);
  if (!(fabs(took - 0.3 * n) <= 5 * sigma)) qt_test_fail("qdrop: %d of %d float at probability 0.3", took, NQ);
  QT_CHECK(same);
  qt_backward(ctx, qt_squared_error(ctx, y, qt_f32(b), 2.0)); /* dL/dy = y - xq: x - xq where x was taken, else 0 */
  int wrong = 0;
  for (int64_t i = 0; i < n; i++) {
    const int tx = qt_f32(y)[i] > 0;
    wrong += tx ? !(fabsf(dx[i] - (x[i] - xq[i])) <= 1e-6f) || dq[i] != 0 : dx[i] != 0 || dq[i] != 0;
  }
  if (wrong) qt_test_fail("qdrop: %d gradients routed wrongly", wrong);
  qt_ctx_free(ctx);
  QT_FREE_ALL(x, xq, dx, dq);
}

/* input (8, 8, 8) -> conv 3x3 (16) -> relu -> conv 3x3 (16) -> relu, prepared at W3A4 and calibrated:
 * two blocks, each a conv group up to its output's fake quant, whose activation scales are learned;
 * block reconstruction with QDrop lowers the graph's output MSE against the float graph's on held
 * out images to at most 2/3 of rounding to nearest's. */
static void test_blocks(void) {
  char err[QT_ERR_LEN];
  float *calib = images(61), *test = images(62);
  qt_graph *g = qt_graph_create("two_layers");
  int v = qt_graph_input(g, "input", H, W, CIN);
  v = qt_graph_relu(g, "relu1", qt_graph_conv2d(g, "conv1", v, COUT, 3, 1, 1, 1, 1));
  v = qt_graph_relu(g, "relu2", qt_graph_conv2d(g, "conv2", v, COUT, 3, 1, 1, 1, 1));
  if (qt_graph_finalize(g, v, err)) qt_test_fail("two_layers: %s", err);
  qt_graph_init_params(g, 13);
  qt_graph *p = prepared_calibrated(g, 3, 4, calib, M);
  qt_ctx *ctx = qt_ctx_create();
  int64_t n;
  float *want = output(p, QT_MODE_EVAL_FLOAT, test, &n), *nearest = output(p, QT_MODE_EVAL, test, &n);
  const qt_qstate *q1 = p->nodes[qt_graph_find_node(p, "relu1.fq")].q;
  const float calibrated = q1->scale[0];
  qt_adaround_config c;
  qt_adaround_config_default(&c);
  c.unit = QT_RECON_BLOCK;
  c.iterations = 1000;
  qt_adaround_result r;
  if (qt_adaround(p, ctx, NULL, calib, M, &c, &r, NULL, err)) qt_test_fail("block reconstruction: %s", err);
  float *rounded = output(p, QT_MODE_EVAL, test, &n);
  const double e_nearest = mse(want, nearest, n), e_block = mse(want, rounded, n);
  if (!(e_block <= 2.0 / 3.0 * e_nearest))
    qt_test_fail("blocks: output MSE %.4g against %.4g rounding to nearest (bound: 2/3 of it)", e_block, e_nearest);
  QT_CHECK(r.units == 2 && r.layers == 2 && strcmp(r.unit[0].name, "conv1..relu1.fq") == 0 &&
           strcmp(r.unit[1].name, "conv2..relu2.fq") == 0 && r.unit[0].activations == 1 && r.unit[1].activations == 1);
  QT_CHECK(q1->scale[0] != calibrated && q1->scale[0] > 0);
  if (getenv("QT_TEST_VERBOSE"))
    printf("two blocks W3A4: output MSE %.4g (nearest) -> %.4g (blocks); relu1.fq scale %.5g -> %.5g\n", e_nearest,
           e_block, calibrated, q1->scale[0]);
  qt_ctx_free(ctx);
  qt_graph_free(p);
  QT_FREE_ALL(calib, test, want, nearest, rounded);
}

/* ResCNN's blocks: the stem group, each residual block whole (its add inside), the downsampling
 * group and the classifier (the global pool's quantization, with no layer before it, in none). */
static void test_res_cnn_blocks(void) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_model_build("res_cnn", err);
  if (!g || qt_graph_alloc(g, err)) qt_test_fail("res_cnn: %s", err);
  qt_graph_init_params(g, 3);
  enum { R = 16 };
  float *x = qt_test_uniform_range((int64_t)R * 28 * 28, -0.4f, 2.8f, 71);
  qt_graph *p = prepared_calibrated(g, 4, 4, x, R);
  qt_ctx *ctx = qt_ctx_create();
  qt_adaround_config c;
  qt_adaround_config_default(&c);
  c.unit = QT_RECON_BLOCK;
  c.iterations = 5;
  c.batch = 4;
  qt_adaround_result r;
  if (qt_adaround(p, ctx, NULL, x, R, &c, &r, NULL, err)) qt_test_fail("res_cnn blocks: %s", err);
  const char *names[] = {"stem.conv..stem.relu.fq", "block1.conv1..block1.relu2.fq", "down.conv..down.relu.fq",
                         "block2.conv1..block2.relu2.fq", "fc..fc.fq"};
  const int layers[] = {1, 2, 1, 2, 1}, acts[] = {1, 3, 1, 3, 1};
  if (getenv("QT_TEST_VERBOSE"))
    for (int k = 0; k < r.units; k++) printf("res_cnn block %d: %s\n", k, r.unit[k].name);
  QT_CHECK(r.units == 5 && r.layers == 7);
  for (int k = 0; k < 5 && k < r.units; k++)
    if (strcmp(r.unit[k].name, names[k]) != 0 || r.unit[k].layers != layers[k] || r.unit[k].activations != acts[k])
      qt_test_fail("res_cnn block %d: %s (%d layers, %d activation scales), want %s (%d, %d)", k, r.unit[k].name,
                   r.unit[k].layers, r.unit[k].activations, names[k], layers[k], acts[k]);
  qt_ctx_free(ctx);
  qt_graph_free(p);
  free(x);
}

static void test_refusals(void) {
  char err[QT_ERR_LEN];
  const int64_t numel = (int64_t)M * H * W * CIN;
  float *x = qt_test_uniform_range(numel, -1.0f, 1.0f, 33);
  qt_graph *p = one_layer(x);
  qt_adaround_config c;
  qt_adaround_config_default(&c);
  qt_adaround_result r;
  qt_ctx *ctx = qt_ctx_create();
  c.iterations = 0;
  QT_CHECK(qt_adaround(p, ctx, NULL, x, M, &c, &r, NULL, err) == -1 && strstr(err, "iterations 0"));
  qt_adaround_config_default(&c);
  c.beta_end = 0.5f;
  QT_CHECK(qt_adaround(p, ctx, NULL, x, M, &c, &r, NULL, err) == -1 && strstr(err, "beta"));
  qt_adaround_config_default(&c);
  QT_CHECK(qt_adaround(p, ctx, NULL, x, 0, &c, &r, NULL, err) == -1 && strstr(err, "images"));
  /* not calibrated */
  qt_node *conv = &p->nodes[qt_graph_find_node(p, "conv")];
  conv->wq->calibrated = 0;
  QT_CHECK(qt_adaround(p, ctx, NULL, x, M, &c, &r, NULL, err) == -1 && strstr(err, "conv") && strstr(err, "calibrate"));
  qt_ctx_free(ctx);
  qt_graph_free(p);
  free(x);
}

int main(void) {
  test_formulas();
  test_one_layer();
  test_qdrop();
  test_blocks();
  test_res_cnn_blocks();
  test_refusals();
  return qt_test_finish();
}
