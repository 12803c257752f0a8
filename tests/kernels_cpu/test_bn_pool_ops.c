/* Batch norm + relu + (fake quant +) max pool through the autograd ops, one training step each
 * (a linear layer and cross-entropy after the pool, so the pool's gradient is not uniform), in
 * four ways that must agree bit for bit:
 *   0. the ops in turn (qt_batch_norm_relu or qt_batch_norm_div, then qt_max_pool2d,
 *      qt_fake_quant_max_pool2d or qt_fake_quant_lsq_max_pool2d), backward frees off: the pool
 *      writes the batch norm output's gradient;
 *   1. the same with backward frees on: the pool hands the batch norm its gradient as each
 *      window's argmax value (bn_before_pool / pool_hand_to_bn in autograd/ops.c);
 *   2. qt_batch_norm_relu_max_pool2d (one op), frees on;
 *   3. the same, frees off.
 * Compared: the pool's output, the gradients of x, gamma, beta, the divisor and the LSQ scale,
 * and the running statistics. Relu and relu6, with and without the per-channel divisor (QAT's
 * conv_bn), 2x2 windows over 32 and 64 channels and 3x3 over 3. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd.h"
#include "tests/common/testutil.h"

enum { PLAIN, STE, LSQ };
static const char *const kind_name[] = {"max_pool", "fake_quant+max_pool", "lsq+max_pool"};

typedef struct {
  int N, H, W, C, K;
} shape;

typedef struct {
  float *y, *dx, *dg, *db, *dd, ds, *rm, *rv;
} result;

static float *copy_or_null(const float *p, int64_t n) { return p ? qt_test_copy_f32(p, n) : NULL; }

static result step(const shape *sh, int kind, int relu, int with_div, int mode, const float *xd, const float *gd,
                   const float *bd, const float *dd, const float *lw) {
  const int N = sh->N, C = sh->C, K = sh->K;
  qt_ctx *ctx = qt_ctx_create();
  qt_ctx_set_backward_frees(ctx, mode == 1 || mode == 2);
  const int64_t xs[4] = {N, sh->H, sh->W, C}, cs[1] = {C}, ss[1] = {1};
  qt_tensor *x = qt_tensor_wrap(ctx, QT_F32, 4, xs, (void *)xd);
  qt_tensor *gamma = qt_tensor_wrap(ctx, QT_F32, 1, cs, (void *)gd);
  qt_tensor *beta = qt_tensor_wrap(ctx, QT_F32, 1, cs, (void *)bd);
  qt_tensor *div = with_div ? qt_tensor_wrap(ctx, QT_F32, 1, cs, (void *)dd) : NULL;
  float sd = relu == 2 ? 0.45f : 0.07f; /* relu6: a grid up to (15 - 2) * 0.45 = 5.85, past most outputs */
  qt_tensor *scale = qt_tensor_wrap(ctx, QT_F32, 1, ss, &sd);
  x->requires_grad = gamma->requires_grad = beta->requires_grad = scale->requires_grad = 1;
  if (div) div->requires_grad = 1;
  const int32_t zp = 2;
  const int qmin = 0, qmax = 15;
  const float gf = 1.0f / sqrtf((float)(sh->H * sh->W * C) * (float)qmax);
  result r = {0};
  r.rm = qt_test_uniform_range(C, -0.1f, 0.1f, 77);
  r.rv = qt_test_uniform_range(C, 0.5f, 1.5f, 78);
  qt_tensor *y;
  if (mode >= 2) {
    const qt_pool_fake_quant fq = {kind == LSQ ? scale : NULL, &sd, &zp, qmin, qmax, gf};
    y = qt_batch_norm_relu_max_pool2d(ctx, x, div, gamma, beta, r.rm, r.rv, 0.1f, 1e-5f, relu, kind == PLAIN ? NULL : &fq,
                                      K);
  } else {
    qt_tensor *b = div ? qt_batch_norm_div(ctx, x, div, gamma, beta, r.rm, r.rv, 1, 0.1f, 1e-5f, relu)
                       : qt_batch_norm_relu(ctx, x, gamma, beta, r.rm, r.rv, 0.1f, 1e-5f, relu == 2);
    y = kind == PLAIN ? qt_max_pool2d(ctx, b, K, K, 0, 0)
        : kind == STE ? qt_fake_quant_max_pool2d(ctx, b, &sd, &zp, qmin, qmax, K)
                      : qt_fake_quant_lsq_max_pool2d(ctx, b, scale, &zp, qmin, qmax, gf, K);
  }
  const int64_t per = qt_tensor_numel(y) / N, ls[2] = {10, per};
  r.y = qt_test_copy_f32(qt_f32(y), qt_tensor_numel(y));
  qt_tensor *lin = qt_tensor_wrap(ctx, QT_F32, 2, ls, (void *)lw);
  qt_tensor *logits = qt_linear(ctx, qt_flatten(ctx, y), lin, NULL);
  int32_t labels[64];
  for (int i = 0; i < N; i++) labels[i] = (i * 3) % 10;
  qt_backward(ctx, qt_cross_entropy(ctx, logits, labels, NULL));
  r.dx = copy_or_null(x->grad, qt_tensor_numel(x));
  r.dg = copy_or_null(gamma->grad, C);
  r.db = copy_or_null(beta->grad, C);
  r.dd = div ? copy_or_null(div->grad, C) : NULL;
  r.ds = kind == LSQ && scale->grad ? scale->grad[0] : 0.0f;
  qt_ctx_free(ctx);
  return r;
}

static void free_result(result *r) { free(r->y), free(r->dx), free(r->dg), free(r->db), free(r->dd), free(r->rm), free(r->rv); }

static void same(const char *what, const float *got, const float *want, int64_t n) {
  if (!got || !want) {
    if (got != want) qt_test_fail("%s: present in one step only", what);
    return;
  }
  for (int64_t i = 0; i < n; i++)
    if (memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      qt_test_fail("%s: differs at %lld of %lld: got %.9g want %.9g", what, (long long)i, (long long)n, got[i],
                   want[i]);
      return;
    }
}

static void run(const shape *sh, int kind, int relu, int with_div, uint64_t seed) {
  const int64_t n = (int64_t)sh->N * sh->H * sh->W * sh->C, per = n / sh->N / (sh->K * sh->K);
  float *x = qt_test_uniform_range(n, -1.5f, 2.5f, seed), *g = qt_test_uniform_range(sh->C, 0.5f, 1.5f, seed + 1);
  /* relu6: betas near 6, so that some outputs clamp at 6 (and their gradient stops) */
  float *b = relu == 2 ? qt_test_uniform_range(sh->C, 4.5f, 6.5f, seed + 2) : qt_test_uniform_range(sh->C, -0.3f, 0.6f, seed + 2);
  float *d = qt_test_uniform_range(sh->C, 0.5f, 2.0f, seed + 3);
  float *lw = qt_test_uniform_range(10 * per, -0.2f, 0.2f, seed + 4);
  result r[4];
  for (int mode = 0; mode < 4; mode++) r[mode] = step(sh, kind, relu, with_div, mode, x, g, b, d, lw);
  char what[200];
  const int64_t m = n / (sh->K * sh->K);
  for (int mode = 1; mode < 4; mode++) {
#define WHAT(s)                                                                                                       \
  (snprintf(what, sizeof what, "%s %dx%dx%dx%d K=%d relu=%d div=%d way %d: %s", kind_name[kind], sh->N, sh->H, sh->W, \
            sh->C, sh->K, relu, with_div, mode, s),                                                                   \
   what)
    same(WHAT("output"), r[mode].y, r[0].y, m);
    same(WHAT("x gradient"), r[mode].dx, r[0].dx, n);
    same(WHAT("gamma gradient"), r[mode].dg, r[0].dg, sh->C);
    same(WHAT("beta gradient"), r[mode].db, r[0].db, sh->C);
    same(WHAT("divisor gradient"), r[mode].dd, r[0].dd, sh->C);
    same(WHAT("scale gradient"), &r[mode].ds, &r[0].ds, 1);
    same(WHAT("running mean"), r[mode].rm, r[0].rm, sh->C);
    same(WHAT("running var"), r[mode].rv, r[0].rv, sh->C);
#undef WHAT
  }
  /* teeth: gradients flowed */
  float amax = 0;
  for (int64_t i = 0; r[0].dx && i < n; i++) amax = fabsf(r[0].dx[i]) > amax ? fabsf(r[0].dx[i]) : amax;
  if (!(amax > 0)) qt_test_fail("%s: no x gradient", kind_name[kind]);
  if (kind == LSQ && !(r[0].ds != 0)) qt_test_fail("lsq: no scale gradient");
  for (int mode = 0; mode < 4; mode++) free_result(&r[mode]);
  free(x), free(g), free(b), free(d), free(lw);
}

int main(void) {
  /* FashionCNN's conv2 at batch 4 and a 2048-row shape: several reduction chunks and 256-row
   * sums (x / div's gradient: its divisor's sums, taken in the batch norm's pass when pooled) */
  const shape shapes[] = {{4, 8, 8, 32, 2}, {3, 6, 6, 3, 3}, {4, 14, 14, 64, 2}, {8, 16, 16, 32, 2}};
  uint64_t seed = 5;
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
    for (int kind = PLAIN; kind <= LSQ; kind++)
      for (int relu = 1; relu <= 2; relu++)
        for (int with_div = 0; with_div <= 1; with_div++) run(&shapes[i], kind, relu, with_div, seed += 10);
  return qt_test_finish();
}
