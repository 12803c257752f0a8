/* qt_conv1_bn_relu_max_pool2d (a one-channel image's convolution + training batch norm + relu (+
 * fake quant) + max pool as one op, autograd/cpu_conv1_pool.c) against the ops in turn, one
 * training step each through a linear layer and cross-entropy (so the pool's gradient is not
 * uniform). fp32: qt_conv2d, qt_batch_norm_relu, qt_max_pool2d. QAT (FashionCNN's conv_bn under
 * LSQ or the clipped STE): the image's fake quant with the convolution (qt_conv2d_lsq_input, or
 * qt_fake_quant then qt_conv2d), then qt_batch_norm_relu_max_pool2d of conv / div with the
 * activations' fake quant (itself bit for bit the ops in turn: test_bn_pool_ops).
 *
 * The fused op sums in another order (the batch statistics and the gradients from the image's
 * patch moments, in double), so the comparison has tolerances, each relative to the largest
 * magnitude of the quantity: output 2e-5 (quantized outputs: at most 1 in 1000 one step apart, a
 * value within rounding of a step boundary), running statistics 1e-5, the gradients of w, gamma,
 * beta 2e-4 (an argmax flipped by rounding between two near-equal window inputs moves one
 * window's gradient to its neighbour, a small part of sums over every window), the divisor's
 * 2e-4 of the largest channel's sum of |dw w / div| (it cancels to batch norm's eps term; one
 * shape has eps 1, where that term is large and its sign is checked), the LSQ scales' gradients
 * 1e-3 of their value. The bias gradient is exactly 0 in the fused op (batch norm removes the
 * mean) and within 2e-4 of the gamma gradient's scale in the ops. The fused op must give the
 * same bits under 1 and 2 threads and with backward frees on and off. Shapes: FashionCNN's first
 * layer (28x28, 32 channels, 3x3 pad 1, 2x2 pool) with relu and relu6, fp32 and as QAT's conv_bn
 * (LSQ, clipped STE); 5x3 kernels with padding 2, 1 and a bias; a 3x3 pool over 48 channels; no
 * padding with one 7x7 window per image. The images have a constant background (28% of the
 * pixels), so that patches and window maxima tie as in real images.
 *
 * Then the backward kernel alone (check_formed_values): the values it forms from the pool
 * output's gradient inside its pass (no fake quant, fixed qparams, LSQ) against the same kernel
 * given them as autograd/ops.c formed them before (the relu's select, the mask, or
 * qt_fake_quant_lsq_pool_val_backward), bit for bit: the weights', gamma's, beta's and the
 * image scale's gradients and the LSQ activation scale's gradient sum, NHWC and blocked
 * outputs, FashionCNN's 3x3 taps and 2x2 pool and a 5x3 kernel with a 3x3 pool, 1 and 2
 * threads, enough elements that the LSQ sums run on two threads. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd.h"
#include "autograd/kernels.h"
#include "quant/quant.h"
#include "tests/common/testutil.h"

typedef struct {
  int N, H, W, OC, KH, KW, ph, pw, pool, relu, bias;
  int xq;    /* the image's fake quant: 0 none, 1 LSQ, 2 fixed qparams */
  int div;   /* conv_bn's per-channel divisor */
  int aq;    /* the activations' fake quant: 0 none, 1 LSQ, 2 fixed qparams */
  float eps; /* batch norm's (0: 1e-5) */
} shape;

typedef struct {
  float *y, *dw, *dbias, *dg, *db, *dd, *rm, *rv, dxs, das;
  int64_t ny;
} result;

static float *copy_or_null(const float *p, int64_t n) { return p ? qt_test_copy_f32(p, n) : NULL; }

/* Where output i of one sample (NHWC: pixel i / OC, channel i % OC) sits in the blocked layout
 * (kernels.h) of a sample of `pixels` pixels. */
static int64_t blocked_at(int64_t i, int64_t pixels, int OC) {
  const int64_t p = i / OC, c = i % OC;
  return (c / 16 * pixels + p) * 16 + c % 16;
}

/* fused 0: the ops in turn; 1: the fused op; 2: the fused op writing its output blocked, read as
 * flat data through linear weights permuted to match (so the loss is the NHWC one's, summed in
 * another order), r.y unblocked */
static result step(const shape *s, int fused, int frees, const float *xd, const float *wd, const float *bd,
                   const float *gd, const float *betad, const float *dd, const float *lw, int64_t per) {
  qt_ctx *ctx = qt_ctx_create();
  qt_ctx_set_backward_frees(ctx, frees);
  const int OC = s->OC, K = s->KH * s->KW;
  const int64_t xs[4] = {s->N, s->H, s->W, 1}, ws[4] = {OC, 1, s->KH, s->KW}, cs[1] = {OC}, ss[1] = {1};
  qt_tensor *x = qt_tensor_wrap(ctx, QT_F32, 4, xs, (void *)xd);
  qt_tensor *w = qt_tensor_wrap(ctx, QT_F32, 4, ws, (void *)wd);
  qt_tensor *b = s->bias ? qt_tensor_wrap(ctx, QT_F32, 1, cs, (void *)bd) : NULL;
  qt_tensor *div = s->div ? qt_tensor_wrap(ctx, QT_F32, 1, cs, (void *)dd) : NULL;
  qt_tensor *gamma = qt_tensor_wrap(ctx, QT_F32, 1, cs, (void *)gd);
  qt_tensor *beta = qt_tensor_wrap(ctx, QT_F32, 1, cs, (void *)betad);
  /* the image's quantizer: 8 bits over [-0.8, 2.8] (zero point 57); the activations': 4 bits */
  float xsv = 3.6f / 255.0f, asv = s->relu == 2 ? 0.45f : 0.07f;
  const int32_t xzp = 57, azp = 2;
  qt_tensor *xscale = qt_tensor_wrap(ctx, QT_F32, 1, ss, &xsv), *ascale = qt_tensor_wrap(ctx, QT_F32, 1, ss, &asv);
  w->requires_grad = gamma->requires_grad = beta->requires_grad = xscale->requires_grad = ascale->requires_grad = 1;
  if (b) b->requires_grad = 1;
  if (div) div->requires_grad = 1;
  const qt_pool_fake_quant xq = {
      s->xq == 1 ? xscale : NULL, &xsv, &xzp, 0, 255, 1.0f / sqrtf((float)(s->H * s->W) * 255.0f)};
  const int OH = s->H + 2 * s->ph - s->KH + 1, OW = s->W + 2 * s->pw - s->KW + 1;
  const qt_pool_fake_quant aq = {
      s->aq == 1 ? ascale : NULL, &asv, &azp, 0, 15, 1.0f / sqrtf((float)(OH * OW * OC) * 15.0f)};
  const float eps = s->eps > 0 ? s->eps : 1e-5f;
  result r = {0};
  r.rm = qt_test_uniform_range(OC, -0.1f, 0.1f, 77);
  r.rv = qt_test_uniform_range(OC, 0.5f, 1.5f, 78);
  qt_tensor *y;
  if (fused) {
    y = qt_conv1_bn_relu_max_pool2d(ctx, x, s->xq ? &xq : NULL, w, b, div, gamma, beta, r.rm, r.rv, 0.1f, eps, s->ph,
                                    s->pw, s->relu, s->aq ? &aq : NULL, s->pool, fused == 2);
    QT_CHECK(y->blocked16 == (fused == 2));
  } else {
    qt_tensor *c;
    if (s->xq == 1) {
      c = qt_conv2d_lsq_input(ctx, x, xscale, &xzp, 0, 255, xq.grad_factor, w, b, 1, 1, s->ph, s->pw);
    } else {
      qt_tensor *xin = x;
      if (s->xq == 2) xin = qt_fake_quant(ctx, x, qt_tensor_numel(x), 1, 1, &xsv, &xzp, 0, 255);
      c = qt_conv2d(ctx, xin, w, b, 1, 1, s->ph, s->pw, 1);
    }
    if (s->div || s->aq) {
      y = qt_batch_norm_relu_max_pool2d(ctx, c, div, gamma, beta, r.rm, r.rv, 0.1f, eps, s->relu, s->aq ? &aq : NULL,
                                        s->pool);
    } else {
      qt_tensor *n = qt_batch_norm_relu(ctx, c, gamma, beta, r.rm, r.rv, 0.1f, eps, s->relu == 2);
      y = qt_max_pool2d(ctx, n, s->pool, s->pool, 0, 0);
    }
  }
  r.ny = qt_tensor_numel(y);
  QT_CHECK(r.ny == per * s->N);
  r.y = qt_test_copy_f32(qt_f32(y), r.ny);
  const int64_t ls[2] = {10, per};
  float *lwb = NULL;
  if (fused == 2) {
    const int64_t pixels = per / OC;
    lwb = malloc((size_t)(10 * per) * sizeof *lwb);
    for (int64_t i = 0; i < r.ny; i++) r.y[i] = qt_f32(y)[i / per * per + blocked_at(i % per, pixels, OC)];
    for (int o = 0; o < 10; o++)
      for (int64_t i = 0; i < per; i++) lwb[o * per + blocked_at(i, pixels, OC)] = lw[o * per + i];
    y->blocked16 = 0; /* flat data from here: qt_flatten takes no blocked tensor */
  }
  qt_tensor *lin = qt_tensor_wrap(ctx, QT_F32, 2, ls, (void *)(lwb ? lwb : lw));
  /* the loss's linear layer on one thread: oneDNN's sgemm splits its long reduction between threads
   * on AVX2 (57 of 60 logits other bits on 2 threads), which would change the gradient the op under
   * test receives; its backward sums are the same on any thread count */
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  qt_tensor *logits = qt_linear(ctx, qt_flatten(ctx, y), lin, NULL);
  omp_set_num_threads(threads);
  int32_t labels[64];
  for (int i = 0; i < s->N; i++) labels[i] = (i * 3) % 10;
  qt_backward(ctx, qt_cross_entropy(ctx, logits, labels, NULL));
  r.dw = copy_or_null(w->grad, (int64_t)OC * K);
  r.dbias = b ? copy_or_null(b->grad, OC) : NULL;
  r.dd = div ? copy_or_null(div->grad, OC) : NULL;
  r.dg = copy_or_null(gamma->grad, OC);
  r.db = copy_or_null(beta->grad, OC);
  r.dxs = xscale->grad ? xscale->grad[0] : 0.0f;
  r.das = ascale->grad ? ascale->grad[0] : 0.0f;
  qt_ctx_free(ctx);
  free(lwb);
  return r;
}

static void free_result(result *r) {
  free(r->y), free(r->dw), free(r->dbias), free(r->dd), free(r->dg), free(r->db), free(r->rm), free(r->rv);
}

static float amax(const float *p, int64_t n) {
  float m = 0;
  for (int64_t i = 0; i < n; i++) m = fabsf(p[i]) > m ? fabsf(p[i]) : m;
  return m;
}

/* max |got - want| <= tol * max |want| */
static void near(const char *what, const float *got, const float *want, int64_t n, float tol) {
  if (!got || !want) {
    qt_test_fail("%s: missing (got %p, want %p)", what, (const void *)got, (const void *)want);
    return;
  }
  const float ref = amax(want, n);
  if (!(ref > 0)) {
    qt_test_fail("%s: all zero in the ops in turn", what);
    return;
  }
  for (int64_t i = 0; i < n; i++)
    if (!(fabsf(got[i] - want[i]) <= tol * ref)) {
      qt_test_fail("%s: at %lld of %lld got %.9g want %.9g (tolerance %g x %g)", what, (long long)i, (long long)n,
                   got[i], want[i], tol, ref);
      return;
    }
}

static void same(const char *what, const float *got, const float *want, int64_t n) {
  if (!got || !want || memcmp(got, want, (size_t)n * sizeof *got) != 0) qt_test_fail("%s: bits differ", what);
}

/* Quantized outputs: a value within rounding of a quantization boundary may land one step apart
 * (the convolution summed in another order): at most 1 in 1000 outputs (and at least 1) may
 * differ, by at most one step; the rest within tol of the largest. */
static void near_quantized(const char *what, const float *got, const float *want, int64_t n, float tol, float step) {
  const float ref = amax(want, n);
  int64_t off = 0;
  for (int64_t i = 0; i < n; i++) {
    const float d = fabsf(got[i] - want[i]);
    if (d <= tol * ref) continue;
    off++;
    if (!(d <= 1.01f * step + tol * ref)) {
      qt_test_fail("%s: at %lld got %.9g want %.9g (more than one step %g apart)", what, (long long)i, got[i], want[i],
                   step);
      return;
    }
  }
  if (off > (n / 1000 > 1 ? n / 1000 : 1))
    qt_test_fail("%s: %lld of %lld outputs a step apart", what, (long long)off, (long long)n);
  if (getenv("QT_TEST_VERBOSE") && off)
    fprintf(stderr, "%s: %lld of %lld outputs a step apart\n", what, (long long)off, (long long)n);
}

static void near_scalar(const char *what, float got, float want, float tol) {
  if (!(want != 0.0f)) qt_test_fail("%s: zero in the ops in turn", what);
  if (!(fabsf(got - want) <= tol * fabsf(want)))
    qt_test_fail("%s: got %.9g want %.9g (tolerance %g)", what, got, want, tol);
  if (getenv("QT_TEST_VERBOSE")) fprintf(stderr, "%s: %.3g relative\n", what, fabsf(got - want) / fabsf(want));
}

static void run(const shape *s, uint64_t seed) {
  const int OC = s->OC, K = s->KH * s->KW;
  const int OH = s->H + 2 * s->ph - s->KH + 1, OW = s->W + 2 * s->pw - s->KW + 1;
  const int64_t per = (int64_t)(OH / s->pool) * (OW / s->pool) * OC;
  const int64_t nx = (int64_t)s->N * s->H * s->W;
  float *x = qt_test_uniform_range(nx, -0.8f, 2.8f, seed);
  for (int64_t i = 0; i < nx; i++) /* a background, as images have: equal patches, tied windows */
    if (x[i] < 0.2f) x[i] = -0.81f;
  float *w = qt_test_uniform_range((int64_t)OC * K, -0.5f, 0.5f, seed + 1);
  float *bias = qt_test_uniform_range(OC, -0.5f, 0.5f, seed + 2);
  float *g = qt_test_uniform_range(OC, 0.5f, 1.5f, seed + 3);
  /* relu6: betas near 6, so that some outputs clamp at 6 (and their gradient stops) */
  float *beta =
      s->relu == 2 ? qt_test_uniform_range(OC, 4.5f, 6.5f, seed + 4) : qt_test_uniform_range(OC, -0.3f, 0.6f, seed + 4);
  float *d = qt_test_uniform_range(OC, 0.5f, 2.0f, seed + 6);
  float *lw = qt_test_uniform_range(10 * per, -0.2f, 0.2f, seed + 5);
  result ref = step(s, 0, 0, x, w, bias, g, beta, d, lw, per);
  result got = step(s, 1, 1, x, w, bias, g, beta, d, lw, per);
  char what[240];
#define WHAT(q)                                                                                                        \
  (snprintf(what, sizeof what, "N%d %dx%d OC%d k%dx%d pad %d,%d pool %d relu %d bias %d xq %d div %d aq %d: %s", s->N, \
            s->H, s->W, OC, s->KH, s->KW, s->ph, s->pw, s->pool, s->relu, s->bias, s->xq, s->div, s->aq, q),           \
   what)
  if (s->aq)
    near_quantized(WHAT("output"), got.y, ref.y, ref.ny, 2e-5f, s->relu == 2 ? 0.45f : 0.07f);
  else
    near(WHAT("output"), got.y, ref.y, ref.ny, 2e-5f);
  near(WHAT("running mean"), got.rm, ref.rm, OC, 1e-5f);
  near(WHAT("running var"), got.rv, ref.rv, OC, 1e-5f);
  near(WHAT("weight gradient"), got.dw, ref.dw, (int64_t)OC * K, 2e-4f);
  near(WHAT("gamma gradient"), got.dg, ref.dg, OC, 2e-4f);
  near(WHAT("beta gradient"), got.db, ref.db, OC, 2e-4f);
  if (s->div) {
    /* d/d div is a sum over the taps of dw * w / div that cancels to batch norm's eps term (the
     * normalization does not see a channel's scale otherwise): 2e-4 of the terms' size */
    float terms = 0;
    for (int c = 0; c < OC; c++) {
      float t = 0;
      for (int k = 0; k < K; k++) t += fabsf(ref.dw[(size_t)c * K + k] * w[(size_t)c * K + k]) / d[c];
      terms = t > terms ? t : terms;
    }
    for (int c = 0; c < OC; c++)
      if (!(fabsf(got.dd[c] - ref.dd[c]) <= 2e-4f * terms)) {
        qt_test_fail("%s: at %d got %.9g want %.9g (tolerance 2e-4 x %g)", WHAT("divisor gradient"), c, got.dd[c],
                     ref.dd[c], terms);
        break;
      }
  }
  if (s->xq == 1) near_scalar(WHAT("image LSQ scale gradient"), got.dxs, ref.dxs, 1e-3f);
  if (s->aq == 1) near_scalar(WHAT("activations' LSQ scale gradient"), got.das, ref.das, 1e-3f);
  if (s->bias) {
    const float scale = amax(ref.dg, OC);
    for (int c = 0; c < OC; c++) {
      if (got.dbias[c] != 0.0f) qt_test_fail("%s: %g at %d, want exactly 0", WHAT("bias gradient"), got.dbias[c], c);
      if (!(fabsf(ref.dbias[c]) <= 2e-4f * scale))
        qt_test_fail("%s: the ops in turn give %g at %d", WHAT("bias gradient"), ref.dbias[c], c);
    }
  }
  /* the same bits: one thread, and backward frees off */
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  result one = step(s, 1, 1, x, w, bias, g, beta, d, lw, per);
  omp_set_num_threads(saved > 1 ? saved : 2);
  result two = step(s, 1, 0, x, w, bias, g, beta, d, lw, per);
  omp_set_num_threads(saved);
  const result *alt[2] = {&one, &two};
  const char *alt_name[2] = {"1 thread", "2 threads, frees off"};
  for (int a = 0; a < 2; a++) {
    char tag[80];
    snprintf(tag, sizeof tag, "%s: output", alt_name[a]);
    same(WHAT(tag), alt[a]->y, got.y, got.ny);
    snprintf(tag, sizeof tag, "%s: weight gradient", alt_name[a]);
    same(WHAT(tag), alt[a]->dw, got.dw, (int64_t)OC * K);
    snprintf(tag, sizeof tag, "%s: gamma, beta gradients", alt_name[a]);
    same(WHAT(tag), alt[a]->dg, got.dg, OC);
    same(WHAT(tag), alt[a]->db, got.db, OC);
    snprintf(tag, sizeof tag, "%s: divisor and scale gradients", alt_name[a]);
    if (s->div) same(WHAT(tag), alt[a]->dd, got.dd, OC);
    same(WHAT(tag), &alt[a]->dxs, &got.dxs, 1);
    same(WHAT(tag), &alt[a]->das, &got.das, 1);
    snprintf(tag, sizeof tag, "%s: running statistics", alt_name[a]);
    same(WHAT(tag), alt[a]->rm, got.rm, OC);
    same(WHAT(tag), alt[a]->rv, got.rv, OC);
  }
  /* blocked output: the same outputs, bit for bit; gradients within 1e-5 of the largest (the loss's
   * linear layer sums its products in another order; the activations' LSQ scale's also sums its
   * terms in another order, 1e-5 of its value) */
  result blk = step(s, 2, 1, x, w, bias, g, beta, d, lw, per);
  same(WHAT("blocked: output"), blk.y, got.y, got.ny);
  near(WHAT("blocked: weight gradient"), blk.dw, got.dw, (int64_t)OC * K, 1e-5f);
  near(WHAT("blocked: gamma gradient"), blk.dg, got.dg, OC, 1e-5f);
  near(WHAT("blocked: beta gradient"), blk.db, got.db, OC, 1e-5f);
  if (s->div) near(WHAT("blocked: divisor gradient"), blk.dd, got.dd, OC, 1e-5f);
  if (s->xq == 1) near_scalar(WHAT("blocked: image LSQ scale gradient"), blk.dxs, got.dxs, 1e-5f);
  if (s->aq == 1) near_scalar(WHAT("blocked: activations' LSQ scale gradient"), blk.das, got.das, 1e-5f);
  same(WHAT("blocked: running statistics"), blk.rm, got.rm, OC);
  same(WHAT("blocked: running statistics"), blk.rv, got.rv, OC);
#undef WHAT
  free_result(&ref), free_result(&got), free_result(&one), free_result(&two), free_result(&blk);
  free(x), free(w), free(bias), free(g), free(beta), free(d), free(lw);
}

/* g as ops.c's pool_grad_values formed it for the kernel (kind 0 none, 1 fixed qparams, 2 LSQ;
 * *ds gets the LSQ scale's sum added as there) */
static void values_as_ops_did(float *g, float *ds, int kind, const float *d, const float *out, const float *yarg,
                              const uint8_t *qmask, const qt_fq_params *fq, float gf, int relu, int N, int per_image,
                              int C, int64_t inputs, int64_t m) {
  if (kind == 0)
    for (int64_t i = 0; i < m; i++) g[i] = qt_relu_passes(out[i], relu) ? 0.0f + d[i] : 0.0f;
  else if (kind == 1)
    for (int64_t i = 0; i < m; i++) g[i] = qmask[i] ? 0.0f + d[i] : 0.0f;
  else
    qt_fake_quant_lsq_pool_val_backward(g, ds, d, yarg, N, per_image, C, inputs, fq->scale, fq->zero_point, fq->qmin,
                                        fq->qmax, gf, relu);
}

static void check_formed_values(int OC, int KH, int KW, int pool, int relu, int blocked, int kind, int image_lsq,
                                int threads, uint64_t seed) {
  qt_conv1_pool_shape sh = {8, 12, 12, OC, KH, KW, KH / 2, KW / 2, pool, relu, blocked, 0, 0};
  QT_CHECK(qt_conv1_pool_shape_init(&sh) == 0);
  const int N = sh.N, K = KH * KW, per_image = (sh.OH / pool) * (sh.OW / pool);
  const int64_t m = (int64_t)N * per_image * OC, n_img = (int64_t)N * sh.H * sh.W;
  const int64_t inputs = (int64_t)N * sh.OH * sh.OW * OC;
  float *img = qt_test_uniform_range(n_img, -1.0f, 2.0f, seed), *w = qt_test_uniform_range((int64_t)OC * K, -0.5f, 0.5f, seed + 1);
  float *gamma = qt_test_uniform_range(OC, 0.5f, 1.5f, seed + 2), *beta = qt_test_uniform_range(OC, -0.3f, 0.3f, seed + 3);
  float *coef = image_lsq ? qt_test_uniform_range(n_img, -0.5f, 0.5f, seed + 4) : NULL;
  float *d = qt_test_uniform_range(m, -1.0f, 1.0f, seed + 5);
  for (int64_t i = 0; i < m; i += 7) d[i] = 0.0f;
  for (int64_t i = 3; i < m; i += 11) d[i] = -0.0f;
  float *out = malloc((size_t)m * 4), *yarg = malloc((size_t)m * 4), *g = malloc((size_t)m * 4);
  float *rm = calloc((size_t)OC, 4), *rv = calloc((size_t)OC, 4);
  uint8_t *argmax = malloc((size_t)m), *qmask = malloc((size_t)m);
  double *stats = malloc(qt_conv1_pool_stats_len(&sh) * sizeof(double));
  const qt_fq_params fq = {0.07f, 2, 0, 15};
  omp_set_num_threads(threads);
  qt_conv1_bn_relu_pool_forward_train(out, argmax, kind == 2 ? yarg : NULL, kind == 1 ? qmask : NULL, stats, img, w,
                                      NULL, gamma, beta, rm, rv, 0.1f, 1e-5f, kind ? &fq : NULL, NULL, &sh);
  const float gf = 0.003f;
  float ds_ref = 0.25f;
  values_as_ops_did(g, &ds_ref, kind, d, out, yarg, qmask, &fq, gf, relu, N, per_image, OC, inputs, m);
  double *dw1 = malloc((size_t)OC * K * 8), *dw2 = malloc((size_t)OC * K * 8), dsc1 = 0, dsc2 = 0, sum = 0;
  float *dg1 = calloc((size_t)OC, 4), *db1 = calloc((size_t)OC, 4), *dg2 = calloc((size_t)OC, 4),
        *db2 = calloc((size_t)OC, 4);
  const qt_conv1_pool_grad given = {.g = g};
  qt_conv1_bn_relu_pool_backward(dw1, dg1, db1, coef ? &dsc1 : NULL, &given, argmax, stats, img, w, gamma, coef, NULL, &sh);
  const qt_conv1_pool_grad formed = {NULL,   d,  out, kind == 1 ? qmask : NULL, kind == 2 ? yarg : NULL,
                                     fq,     gf, kind == 2 ? &sum : NULL,      inputs};
  qt_conv1_bn_relu_pool_backward(dw2, dg2, db2, coef ? &dsc2 : NULL, &formed, argmax, stats, img, w, gamma, coef, NULL, &sh);
  char what[160];
  snprintf(what, sizeof what, "formed values OC %d %dx%d pool %d relu %d %s kind %d image LSQ %d threads %d", OC, KH,
           KW, pool, relu, blocked ? "blocked" : "NHWC", kind, image_lsq, threads);
  if (memcmp(dw1, dw2, (size_t)OC * K * 8) != 0) qt_test_fail("%s: dw differs", what);
  if (memcmp(dg1, dg2, (size_t)OC * 4) != 0 || memcmp(db1, db2, (size_t)OC * 4) != 0)
    qt_test_fail("%s: dgamma or dbeta differs", what);
  if (memcmp(&dsc1, &dsc2, 8) != 0) qt_test_fail("%s: the image scale's gradient differs", what);
  if (kind == 2) {
    const float ds_got = 0.25f + (float)sum;
    if (memcmp(&ds_got, &ds_ref, 4) != 0)
      qt_test_fail("%s: LSQ activation scale sum %.9g, want %.9g", what, (double)ds_got, (double)ds_ref);
    QT_CHECK(ds_ref != 0.25f); /* the sum is not trivially zero */
  }
  omp_set_num_threads(2);
  free(img), free(w), free(gamma), free(beta), free(coef), free(d), free(out), free(yarg), free(g), free(rm), free(rv);
  free(argmax), free(qmask), free(stats), free(dw1), free(dw2), free(dg1), free(db1), free(dg2), free(db2);
}

int main(void) {
  const shape shapes[] = {
      /* N   H   W  OC KH KW ph pw pool relu bias xq div aq eps */
      {6, 28, 28, 32, 3, 3, 1, 1, 2, 1, 0, 0, 0, 0, 0}, /* FashionCNN's conv1, fp32 */
      {4, 28, 28, 32, 3, 3, 1, 1, 2, 2, 0, 0, 0, 0, 0}, /* relu6 */
      {3, 10, 12, 16, 5, 3, 2, 1, 2, 1, 1, 0, 0, 0, 0}, /* 5x3 kernel, bias, OW 12 (a 16-lane tail) */
      {2, 9, 9, 48, 3, 3, 1, 1, 3, 2, 1, 0, 0, 0, 0},   /* 3x3 pool, three channel blocks */
      {5, 9, 9, 16, 3, 3, 0, 0, 7, 1, 0, 0, 0, 0, 0},   /* no padding, one window per image */
      {6, 28, 28, 32, 3, 3, 1, 1, 2, 1, 0, 1, 1, 1, 0}, /* FashionCNN's conv_bn under LSQ */
      {4, 28, 28, 32, 3, 3, 1, 1, 2, 2, 0, 1, 1, 1, 0}, /* the same with relu6 */
      {6, 28, 28, 32, 3, 3, 1, 1, 2, 1, 0, 2, 1, 2, 0}, /* ... under the clipped STE */
      {3, 10, 12, 16, 5, 3, 2, 1, 2, 1, 1, 1, 0, 2, 0}, /* LSQ image, fixed activations, no divisor */
      {2, 9, 9, 48, 3, 3, 1, 1, 3, 2, 0, 2, 1, 1, 0},   /* fixed image, LSQ activations, 3x3 pool */
      /* eps 1, near the variance: the divisor's gradient is batch norm's eps term, not lost in
       * the cancelled sum, so the tolerance sees its sign and size */
      {4, 28, 28, 32, 3, 3, 1, 1, 2, 1, 0, 1, 1, 1, 1.0f},
  };
  uint64_t seed = 11;
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) run(&shapes[i], seed += 10);
  for (int kind = 0; kind <= 2; kind++)
    for (int blocked = 0; blocked <= 1; blocked++)
      for (int threads = 1; threads <= 2; threads++) {
        check_formed_values(32, 3, 3, 2, 1, blocked, kind, kind == 2, threads, seed += 10);
        check_formed_values(48, 5, 3, 3, 2, blocked, kind, kind != 1, threads, seed += 10);
      }
  /* the op refuses what its kernels do not take */
  QT_CHECK(!qt_conv1_bn_relu_max_pool2d_takes(2, 28, 28, 24, 3, 3, 1, 1, 1, 2)); /* OC % 16 */
  QT_CHECK(!qt_conv1_bn_relu_max_pool2d_takes(2, 28, 28, 32, 3, 3, 1, 1, 1, 3)); /* 28 not tiled by 3 */
  QT_CHECK(!qt_conv1_bn_relu_max_pool2d_takes(2, 28, 28, 32, 7, 7, 3, 3, 1, 2)); /* 49 taps */
  QT_CHECK(!qt_conv1_bn_relu_max_pool2d_takes(2, 28, 28, 32, 3, 3, 3, 1, 1, 2)); /* padding past the kernel */
  QT_CHECK(!qt_conv1_bn_relu_max_pool2d_takes(2, 32, 32, 32, 1, 1, 0, 0, 1, 8)); /* an 8x8 pool */
  QT_CHECK(qt_conv1_bn_relu_max_pool2d_takes(2, 28, 28, 32, 3, 3, 1, 1, 1, 2));
  return qt_test_finish();
}
