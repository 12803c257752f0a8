/* qt_conv2d_lsq_input (conv2d of a per-tensor LSQ fake-quantized input that needs no gradient)
 * against the two ops it replaces, qt_fake_quant_lsq then qt_conv2d, through one training step
 * (a linear layer and cross-entropy after the convolution, so the output gradient is not
 * uniform):
 * - output: bit for bit (the same fake quant kernel, the same convolution primitive);
 * - weight and bias gradients: a backward-weights pass over 2C input channels instead of C, so
 *   oneDNN may block the sums differently: within 1e-5 of the largest |gradient|;
 * - the scale gradient: the composition sums grad_factor * dxq_i * coef_i over the convolution's
 *   input gradient dxq; the fused op forms sum w * corr(coef, dy) with oneDNN's float sums over
 *   the pixels: within 2e-6 * grad_factor * sum |dxq_i * coef_i| (seen: up to 6e-8 with 1 and
 *   2 threads, AVX-512), and not zero;
 * - with the weights frozen the scale gradient is the same value; with the scale frozen the
 *   weight gradient is.
 * Shapes: FashionCNN's conv1 (one channel, 3x3, pad 1), three channels with stride 2 and a bias,
 * a 5x5 kernel without padding; 4-bit unsigned, 8-bit signed and a zero point; inputs past both
 * clamp edges, on rounding ties and on the grid. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd.h"
#include "quant/quant.h"
#include "tests/common/testutil.h"

typedef struct {
  int N, H, W, C, OC, K, stride, pad, bias, qmin, qmax, zp;
} lsq_case;

typedef struct {
  float *y, *dw, *db, ds, *dxq; /* dxq: the composition's convolution input gradient */
} step_result;

/* One step: fused (qt_conv2d_lsq_input) or the composition; grads[0..2]: whether w, b and the
 * scale learn. */
static step_result step(const lsq_case *k, int fused, const float *xd, const float *wd, const float *bd, float s,
                        const float *lw, const int *grads) {
  qt_ctx *ctx = qt_ctx_create();
  const int64_t xs[4] = {k->N, k->H, k->W, k->C}, ws[4] = {k->OC, k->C, k->K, k->K}, bs[1] = {k->OC}, ss[1] = {1};
  float sd = s;
  qt_tensor *x = qt_tensor_wrap(ctx, QT_F32, 4, xs, (void *)xd);
  qt_tensor *w = qt_tensor_wrap(ctx, QT_F32, 4, ws, (void *)wd);
  qt_tensor *b = k->bias ? qt_tensor_wrap(ctx, QT_F32, 1, bs, (void *)bd) : NULL;
  qt_tensor *scale = qt_tensor_wrap(ctx, QT_F32, 1, ss, &sd);
  w->requires_grad = grads[0];
  if (b) b->requires_grad = grads[1];
  scale->requires_grad = grads[2];
  const int32_t zp = k->zp;
  const float gf = 1.0f / sqrtf((float)(k->H * k->W * k->C) * (float)k->qmax);
  qt_tensor *xq = NULL, *y;
  if (fused) {
    y = qt_conv2d_lsq_input(ctx, x, scale, &zp, k->qmin, k->qmax, gf, w, b, k->stride, k->stride, k->pad, k->pad);
  } else {
    xq = qt_fake_quant_lsq(ctx, x, qt_tensor_numel(x), 1, 1, scale, &zp, k->qmin, k->qmax, gf);
    y = qt_conv2d(ctx, xq, w, b, k->stride, k->stride, k->pad, k->pad, 1);
  }
  const int64_t per = qt_tensor_numel(y) / k->N, ls[2] = {10, per};
  qt_tensor *lin = qt_tensor_wrap(ctx, QT_F32, 2, ls, (void *)lw);
  qt_tensor *logits = qt_linear(ctx, qt_flatten(ctx, y), lin, NULL);
  int32_t labels[64];
  for (int i = 0; i < k->N; i++) labels[i] = (i * 3) % 10;
  qt_backward(ctx, qt_cross_entropy(ctx, logits, labels, NULL));
  step_result r = {0};
  r.y = qt_test_copy_f32(qt_f32(y), qt_tensor_numel(y));
  r.dw = w->grad ? qt_test_copy_f32(w->grad, qt_tensor_numel(w)) : NULL;
  r.db = b && b->grad ? qt_test_copy_f32(b->grad, k->OC) : NULL;
  r.ds = scale->grad ? scale->grad[0] : 0.0f;
  r.dxq = xq && xq->grad ? qt_test_copy_f32(xq->grad, qt_tensor_numel(xq)) : NULL;
  qt_ctx_free(ctx);
  return r;
}

static void free_result(step_result *r) { free(r->y), free(r->dw), free(r->db), free(r->dxq); }

static float max_abs(const float *a, int64_t n) {
  float m = 0;
  for (int64_t i = 0; i < n; i++) m = fabsf(a[i]) > m ? fabsf(a[i]) : m;
  return m;
}

static void run(const lsq_case *k, uint64_t seed) {
  char what[160];
  snprintf(what, sizeof what, "N%d %dx%dx%d -> %d k%d s%d p%d%s q[%d,%d] zp %d", k->N, k->H, k->W, k->C, k->OC, k->K,
           k->stride, k->pad, k->bias ? " bias" : "", k->qmin, k->qmax, k->zp);
  const int64_t nx = (int64_t)k->N * k->H * k->W * k->C, nw = (int64_t)k->OC * k->C * k->K * k->K;
  const float s = 0.05f;
  float *x = malloc((size_t)nx * sizeof(float));
  qt_test_fill_uniform(x, nx, 0.0f, 1.0f, seed);
  for (int64_t i = 0; i < nx; i++) {
    const int q = k->qmin - 3 - k->zp + (int)(x[i] * (float)(k->qmax - k->qmin + 6)); /* past both edges */
    x[i] = i % 4 == 0 ? ((float)q + 0.5f) * s : i % 4 == 1 ? (float)q * s : ((float)q + x[i] - 0.5f) * s;
  }
  float *w = qt_test_uniform(nw, seed + 1), *b = qt_test_uniform(k->OC, seed + 2);
  const int OH = (k->H + 2 * k->pad - k->K) / k->stride + 1, OW = (k->W + 2 * k->pad - k->K) / k->stride + 1;
  float *lw = qt_test_uniform(10 * (int64_t)OH * OW * k->OC, seed + 3);
  const int all[3] = {1, 1, 1};
  step_result a = step(k, 0, x, w, b, s, lw, all), f = step(k, 1, x, w, b, s, lw, all);
  const int64_t ny = (int64_t)k->N * OH * OW * k->OC;
  if (memcmp(a.y, f.y, (size_t)ny * sizeof(float)) != 0) qt_test_fail("%s: outputs differ", what);
  char w2[220];
  snprintf(w2, sizeof w2, "%s: weight gradient", what);
  qt_test_close(w2, f.dw, a.dw, nw, 1e-5f * max_abs(a.dw, nw), 0.0f);
  if (k->bias) {
    snprintf(w2, sizeof w2, "%s: bias gradient", what);
    qt_test_close(w2, f.db, a.db, k->OC, 1e-5f * max_abs(a.db, k->OC), 0.0f);
  }
  /* the scale gradient's tolerance from the composition's terms */
  float *coef = malloc((size_t)nx * sizeof(float));
  qt_fake_quant_lsq_scale_coef(coef, x, nx, s, k->zp, k->qmin, k->qmax);
  const float gf = 1.0f / sqrtf((float)(k->H * k->W * k->C) * (float)k->qmax);
  double sum_abs = 0;
  for (int64_t i = 0; i < nx; i++) sum_abs += fabs((double)a.dxq[i] * coef[i]) * gf;
  const double tol = 2e-6 * sum_abs;
  if (!(fabs((double)f.ds - a.ds) <= tol))
    qt_test_fail("%s: scale gradient %.9g, composition %.9g (tolerance %.3g)", what, f.ds, a.ds, tol);
  if (a.ds == 0.0f) qt_test_fail("%s: the scale gradient is zero; the case tests nothing", what);
  if (getenv("QT_TEST_VERBOSE"))
    fprintf(stderr, "%s: scale gradient %.9g vs %.9g: %.3g of sum |terms|\n", what, f.ds, a.ds,
            fabs((double)f.ds - a.ds) / sum_abs);
  /* frozen weights: the same scale gradient; frozen scale: the same weight gradient */
  const int no_w[3] = {0, 0, 1}, no_s[3] = {1, 1, 0};
  step_result fw = step(k, 1, x, w, b, s, lw, no_w), fs = step(k, 1, x, w, b, s, lw, no_s);
  if (memcmp(&fw.ds, &f.ds, sizeof f.ds) != 0 || fw.dw)
    qt_test_fail("%s: scale gradient %.9g with the weights frozen, %.9g learning them", what, fw.ds, f.ds);
  if (memcmp(fs.dw, f.dw, (size_t)nw * sizeof(float)) != 0 || fs.ds != 0.0f)
    qt_test_fail("%s: the weight gradient changes when the scale is frozen", what);
  free_result(&a), free_result(&f), free_result(&fw), free_result(&fs);
  free(x), free(w), free(b), free(lw), free(coef);
}

int main(void) {
  const lsq_case cases[] = {
      /* N   H   W  C  OC K  s  p  bias qmin qmax zp */
      {16, 28, 28, 1, 32, 3, 1, 1, 0, 0, 15, 0},       /* FashionCNN conv1, 4-bit */
      {32, 28, 28, 1, 32, 3, 1, 1, 0, 0, 255, 0},      /* 8-bit unsigned, 25,088 pixels */
      {4, 9, 11, 3, 8, 3, 2, 1, 1, -128, 127, 0},      /* RGB, stride 2, a bias, signed */
      {3, 12, 10, 2, 5, 5, 1, 0, 1, 0, 15, 3},         /* 5x5 without padding, a zero point */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run(&cases[i], 500 + 10 * i);
  return qt_test_finish();
}
