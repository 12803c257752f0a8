/* Batch norm + relu + (fake quant +) max pool as one pass (qt_batch_norm_relu_pool_forward_train)
 * against the ops in turn: output, argmax, statistics, the relu's output at each argmax (LSQ) and
 * the STE + relu mask there. Batch norm's backward from a max pool's handed-over gradient
 * (qt_batch_norm_relu_backward_pooled, the value at each window's argmax input; for LSQ also from
 * the argmax values alone, qt_fake_quant_lsq_pool_val_backward) against the dense composition it
 * replaces: the pool's
 * backward into a fresh input-sized buffer (plain max pool, fake quant with fixed qparams + max
 * pool, LSQ + max pool), then qt_batch_norm_relu_backward on it. Everything is compared bit for
 * bit (dinp written or added to, dgamma, dbeta, and the LSQ scale's gradient between the two LSQ
 * backwards), for relu / relu6 / no relu, with and without the per-channel divisor, over shapes
 * whose reduction chunks cross images, with tail rows (M not a multiple of the pattern's rows),
 * 2x2 and 3x3 windows, C = 3, 16, 32, 64, and under 1 and 2 threads. Where C % 16 == 0, the same
 * kernels on the input (and its gradient) in the blocked layout (kernels.h) give the same bits:
 * the forward's every output, and (where the build's kernels take it,
 * qt_batch_norm_pool_takes_blocked) the backward's dinp, dgamma, dbeta and the divisor's sums. */
#include "autograd/kernels.h"
#include "quant/quant.h"
#include "tests/common/testutil.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_exact(const char *what, const float *got, const float *want, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      qt_test_fail("%s: differs at %lld of %lld: got %.9g want %.9g", what, (long long)i, (long long)n, got[i],
                   want[i]);
      return 1;
    }
  return 0;
}

/* (N, H, W, C) NHWC to the blocked layout (kernels.h; C % 16 == 0), and back */
static float *to_blocked(const float *x, int N, int H, int W, int C) {
  float *b = malloc((size_t)N * H * W * C * sizeof *b);
  for (int64_t r = 0; r < (int64_t)N * H * W; r++)
    for (int c = 0; c < C; c++)
      b[((r / (H * W) * (C / 16) + c / 16) * H * W + r % (H * W)) * 16 + c % 16] = x[r * C + c];
  return b;
}
static float *from_blocked(const float *b, int N, int H, int W, int C) {
  float *x = malloc((size_t)N * H * W * C * sizeof *x);
  for (int64_t r = 0; r < (int64_t)N * H * W; r++)
    for (int c = 0; c < C; c++) x[r * C + c] = b[((r / (H * W) * (C / 16) + c / 16) * H * W + r % (H * W)) * 16 + c % 16];
  return x;
}

enum { PLAIN, STE, LSQ };
static const char *const kind_name[] = {"max_pool", "fake_quant+max_pool", "lsq+max_pool"};

/* One case: batch norm (+ relu) forward, the pool of `kind` on its output, then both backwards. */
static void run_case(int N, int H, int W, int C, int K, int relu, int with_div, int kind, int dinp_write,
                     uint64_t seed) {
  char what[200];
#define WHAT(s)                                                                                                 \
  (snprintf(what, sizeof what, "%s N=%d H=%d W=%d C=%d K=%d relu=%d div=%d write=%d threads=%d: %s",           \
            kind_name[kind], N, H, W, C, K, relu, with_div, dinp_write, omp_get_max_threads(), s),               \
   what)
  const int M = N * H * W, OH = H / K, OW = W / K;
  const int64_t n = (int64_t)M * C, m = (int64_t)N * OH * OW * C;
  float *x = qt_test_uniform_range(n, -2.0f, 3.0f, seed);
  float *div = with_div ? qt_test_uniform_range(C, 0.4f, 2.5f, seed + 1) : NULL;
  float *gamma = qt_test_uniform_range(C, 0.5f, 2.0f, seed + 2), *beta = qt_test_uniform_range(C, -0.5f, 1.0f, seed + 3);
  float *rm = qt_test_uniform_range(C, -0.2f, 0.2f, seed + 4), *rv = qt_test_uniform_range(C, 0.5f, 2.0f, seed + 5);
  float *y = malloc((size_t)n * 4), *mean = malloc((size_t)C * 4), *invstd = malloc((size_t)C * 4);
  uint8_t *mask = relu ? malloc((size_t)(n + 7) / 8) : NULL;
  int64_t total;
  qt_batch_norm_relu_forward_train(y, mask, relu == 2, mean, invstd, x, div, gamma, beta, rm, rv, 0.1f, 1e-5f, M, C,
                                   NULL, &total);
  /* the pool: its output, argmax and (STE) clamp mask */
  float *out = malloc((size_t)m * 4);
  int32_t *argmax = malloc((size_t)m * 4);
  uint8_t *qmask = malloc((size_t)m);
  const float scale = 0.05f;
  const int32_t zp = 3;
  const int qmin = 0, qmax = 63;
  if (kind == PLAIN) {
    qt_pool2d_shape s = {.N = N, .H = H, .W = W, .C = C, .KH = K, .KW = K, .stride_h = K, .stride_w = K};
    QT_ASSERT(qt_pool2d_shape_init(&s) == 0, "pool shape");
    qt_max_pool2d_forward(out, argmax, y, &s);
  } else {
    qt_fake_quant_max_pool_forward(out, argmax, kind == STE ? qmask : NULL, y, N, H, W, C, K, K, scale, zp, qmin, qmax);
  }
  /* the fused forward (qt_batch_norm_relu_pool_forward_train) against the ops in turn: output,
   * argmax, statistics and running statistics bit for bit; the relu's output at each argmax and
   * the STE mask (clamp range and relu pass there) */
  {
    float *rm2 = qt_test_uniform_range(C, -0.2f, 0.2f, seed + 4), *rv2 = qt_test_uniform_range(C, 0.5f, 2.0f, seed + 5);
    float *out2 = malloc((size_t)m * 4), *yarg = malloc((size_t)m * 4), *mean2 = malloc((size_t)C * 4);
    float *invstd2 = malloc((size_t)C * 4);
    int32_t *argmax2 = malloc((size_t)m * 4);
    uint8_t *qmask2 = malloc((size_t)m);
    const qt_fq_params fp = {scale, zp, qmin, qmax};
    int64_t total2;
    qt_batch_norm_relu_pool_forward_train(out2, argmax2, kind == PLAIN ? NULL : yarg, kind == STE ? qmask2 : NULL,
                                          mean2, invstd2, x, div, gamma, beta, rm2, rv2, 0.1f, 1e-5f, N, H, W, C, 0, K,
                                          relu, kind == PLAIN ? NULL : &fp, NULL, &total2);
    check_exact(WHAT("fused forward out"), out2, out, m);
    for (int64_t i = 0; i < m; i++)
      if (argmax2[i] != argmax[i]) {
        qt_test_fail("%s: at %lld: %d vs %d", WHAT("fused forward argmax"), (long long)i, argmax2[i], argmax[i]);
        break;
      }
    check_exact(WHAT("fused forward mean"), mean2, mean, C);
    check_exact(WHAT("fused forward invstd"), invstd2, invstd, C);
    check_exact(WHAT("fused forward running mean"), rm2, rm, C);
    check_exact(WHAT("fused forward running var"), rv2, rv, C);
    if (total2 != M) qt_test_fail("%s", WHAT("fused forward row count"));
    for (int64_t o = 0; o < m && kind != PLAIN; o++) {
      const int64_t img = o / ((int64_t)OH * OW * C), c = o % C;
      const float ya = y[(img * H * W + argmax[o]) * C + c];
      const int pass = !mask || ((mask[((img * H * W + argmax[o]) * C + c) / 8] >>
                                  (((img * H * W + argmax[o]) * C + c) % 8)) & 1);
      if (memcmp(&yarg[o], &ya, 4) != 0) {
        qt_test_fail("%s: at %lld: %g vs %g", WHAT("fused forward yarg"), (long long)o, yarg[o], ya);
        break;
      }
      if (kind == STE && qmask2[o] != (qmask[o] & pass)) {
        qt_test_fail("%s: at %lld: %d vs %d & %d", WHAT("fused forward STE mask"), (long long)o, qmask2[o], qmask[o],
                     pass);
        break;
      }
      if (pass != qt_relu_passes(ya, relu)) {
        qt_test_fail("%s: at %lld", WHAT("qt_relu_passes differs from the relu's mask"), (long long)o);
        break;
      }
    }
    if (C % 16 == 0) { /* the same from the blocked input: every output bit for bit */
      float *xb = to_blocked(x, N, H, W, C);
      float *rm3 = qt_test_uniform_range(C, -0.2f, 0.2f, seed + 4), *rv3 = qt_test_uniform_range(C, 0.5f, 2.0f, seed + 5);
      float *out3 = malloc((size_t)m * 4), *yarg3 = malloc((size_t)m * 4), *mean3 = malloc((size_t)C * 4);
      float *invstd3 = malloc((size_t)C * 4);
      int32_t *argmax3 = malloc((size_t)m * 4);
      uint8_t *qmask3 = malloc((size_t)m);
      int64_t total3;
      qt_batch_norm_relu_pool_forward_train(out3, argmax3, kind == PLAIN ? NULL : yarg3, kind == STE ? qmask3 : NULL,
                                            mean3, invstd3, xb, div, gamma, beta, rm3, rv3, 0.1f, 1e-5f, N, H, W, C, 1,
                                            K, relu, kind == PLAIN ? NULL : &fp, NULL, &total3);
      check_exact(WHAT("blocked forward out"), out3, out2, m);
      if (memcmp(argmax3, argmax2, (size_t)m * 4) != 0) qt_test_fail("%s", WHAT("blocked forward argmax"));
      if (kind != PLAIN) check_exact(WHAT("blocked forward yarg"), yarg3, yarg, m);
      if (kind == STE && memcmp(qmask3, qmask2, (size_t)m) != 0) qt_test_fail("%s", WHAT("blocked forward STE mask"));
      check_exact(WHAT("blocked forward mean"), mean3, mean2, C);
      check_exact(WHAT("blocked forward invstd"), invstd3, invstd2, C);
      check_exact(WHAT("blocked forward running mean"), rm3, rm2, C);
      check_exact(WHAT("blocked forward running var"), rv3, rv2, C);
      free(xb), free(rm3), free(rv3), free(out3), free(yarg3), free(mean3), free(invstd3), free(argmax3), free(qmask3);
    }
    free(rm2), free(rv2), free(out2), free(yarg), free(mean2), free(invstd2), free(argmax2), free(qmask2);
  }
  /* the pool output's gradient, with exact zeros and negative zeros among it */
  float *dout = qt_test_uniform_range(m, -1.0f, 1.0f, seed + 6);
  for (int64_t i = 0; i < m; i += 11) dout[i] = 0.0f;
  for (int64_t i = 5; i < m; i += 13) dout[i] = -0.0f;

  /* dense: the pool's backward into a fresh buffer, then batch norm's (which masks it in place) */
  float *dense = malloc((size_t)n * 4), *val = malloc((size_t)m * 4);
  float ds_dense = 0.25f, ds_val = 0.25f;
  const float gf = 0.01f;
  if (kind == PLAIN) {
    qt_pool2d_shape s = {.N = N, .H = H, .W = W, .C = C, .KH = K, .KW = K, .stride_h = K, .stride_w = K};
    QT_ASSERT(qt_pool2d_shape_init(&s) == 0, "pool shape");
    qt_max_pool2d_backward_ex(dense, 1, dout, argmax, &s);
    for (int64_t i = 0; i < m; i++) val[i] = 0.0f + dout[i];
  } else if (kind == STE) {
    qt_fake_quant_max_pool_backward(dense, 1, dout, argmax, qmask, N, H, W, C, K, K);
    for (int64_t i = 0; i < m; i++) val[i] = qmask[i] ? 0.0f + dout[i] : 0.0f;
  } else {
    qt_fake_quant_lsq_max_pool_backward(dense, 1, &ds_dense, dout, argmax, y, N, H, W, C, K, K, scale, zp, qmin, qmax,
                                        gf);
    qt_fake_quant_lsq_max_pool_backward_val(val, &ds_val, dout, argmax, y, N, H, W, C, K, K, scale, zp, qmin, qmax,
                                            gf);
    check_exact(WHAT("LSQ scale gradient"), &ds_val, &ds_dense, 1);
    /* from the argmax inputs' values alone (the fused op's yarg) */
    float *val2 = malloc((size_t)m * 4), *xarg = malloc((size_t)m * 4), ds_arg = 0.25f;
    for (int64_t o = 0; o < m; o++) xarg[o] = y[((o / ((int64_t)OH * OW * C)) * H * W + argmax[o]) * C + o % C];
    qt_fake_quant_lsq_pool_val_backward(val2, &ds_arg, dout, xarg, N, OH * OW, C, n, scale, zp, qmin, qmax, gf, 0);
    check_exact(WHAT("LSQ scale gradient from xarg"), &ds_arg, &ds_dense, 1);
    check_exact(WHAT("LSQ values from xarg"), val2, val, m);
    /* with the relu folded in (the fused ops' pool_grad_values): val where qt_relu_passes, else +0 */
    float ds_relu = 0.25f;
    qt_fake_quant_lsq_pool_val_backward(val2, &ds_relu, dout, xarg, N, OH * OW, C, n, scale, zp, qmin, qmax, gf, relu);
    check_exact(WHAT("LSQ scale gradient from xarg, relu folded"), &ds_relu, &ds_dense, 1);
    for (int64_t o = 0; o < m; o++) xarg[o] = qt_relu_passes(xarg[o], relu) ? val[o] : 0.0f; /* the expected values */
    check_exact(WHAT("LSQ values from xarg, relu folded"), val2, xarg, m);
    free(val2), free(xarg);
  }
  float *dx1 = qt_test_uniform_range(n, -1.0f, 1.0f, seed + 7), *dx2 = qt_test_copy_f32(dx1, n);
  if (dinp_write)
    for (int64_t i = 0; i < n; i++) dx1[i] = dx2[i] = NAN; /* written, never read */
  float *dg1 = qt_test_uniform_range(C, -1.0f, 1.0f, seed + 8), *db1 = qt_test_uniform_range(C, -1.0f, 1.0f, seed + 9);
  float *dg2 = qt_test_copy_f32(dg1, C), *db2 = qt_test_copy_f32(db1, C);
  qt_batch_norm_relu_backward(dx1, dinp_write, dg1, db1, dense, mask, x, div, mean, invstd, gamma, M, C, NULL, M);
  const qt_pool_grad pg = {val, argmax, N, H, W, K, K, 0};
  qt_batch_norm_relu_backward_pooled(dx2, dinp_write, dg2, db2, &pg, mask, x, div, NULL, mean, invstd, gamma, M, C,
                                     NULL, M);
  check_exact(WHAT("dinp"), dx2, dx1, n);
  check_exact(WHAT("dgamma"), dg2, dg1, C);
  check_exact(WHAT("dbeta"), db2, db1, C);
  /* the sums alone (no dinp wanted) */
  float *dg3 = qt_test_uniform_range(C, -1.0f, 1.0f, seed + 8), *db3 = qt_test_uniform_range(C, -1.0f, 1.0f, seed + 9);
  qt_batch_norm_relu_backward_pooled(NULL, 0, dg3, db3, &pg, mask, x, div, NULL, mean, invstd, gamma, M, C, NULL, M);
  check_exact(WHAT("dgamma without dinp"), dg3, dg1, C);
  check_exact(WHAT("dbeta without dinp"), db3, db1, C);
  if (C % 16 == 0 && qt_batch_norm_pool_takes_blocked(C)) {
    /* x and dinp blocked: the same bits, and with the divisor the divisor's sums too (x's own
     * gradient then, the quotient's divided by the divisor) */
    const qt_pool_grad pgb = {val, argmax, N, H, W, K, K, 1};
    float *xb = to_blocked(x, N, H, W, C), *dx0 = qt_test_uniform_range(n, -1.0f, 1.0f, seed + 7);
    for (int with_sums = 0; with_sums <= (div != NULL); with_sums++) {
      float *dxa = qt_test_copy_f32(dx0, n), *dxb = to_blocked(dx0, N, H, W, C);
      if (dinp_write)
        for (int64_t i = 0; i < n; i++) dxa[i] = dxb[i] = NAN;
      float *dga = qt_test_uniform_range(C, -1.0f, 1.0f, seed + 8), *dba = qt_test_uniform_range(C, -1.0f, 1.0f, seed + 9);
      float *dgb = qt_test_copy_f32(dga, C), *dbb = qt_test_copy_f32(dba, C);
      double *sa = with_sums ? calloc((size_t)C, sizeof(double)) : NULL, *sb = with_sums ? calloc((size_t)C, sizeof(double)) : NULL;
      qt_batch_norm_relu_backward_pooled(dxa, dinp_write, dga, dba, &pg, mask, x, div, sa, mean, invstd, gamma, M, C,
                                         NULL, M);
      qt_batch_norm_relu_backward_pooled(dxb, dinp_write, dgb, dbb, &pgb, mask, xb, div, sb, mean, invstd, gamma, M, C,
                                         NULL, M);
      float *dxu = from_blocked(dxb, N, H, W, C);
      check_exact(with_sums ? WHAT("blocked dinp (divided)") : WHAT("blocked dinp"), dxu, dxa, n);
      check_exact(WHAT("blocked dgamma"), dgb, dga, C);
      check_exact(WHAT("blocked dbeta"), dbb, dba, C);
      if (with_sums && memcmp(sa, sb, (size_t)C * sizeof(double)) != 0) qt_test_fail("%s", WHAT("blocked divisor sums"));
      free(dxa), free(dxb), free(dga), free(dba), free(dgb), free(dbb), free(sa), free(sb), free(dxu);
    }
    free(xb), free(dx0);
  }
  /* the test has teeth: the expanded gradient is not all zeros */
  int nonzero = 0;
  for (int64_t i = 0; i < n && !nonzero; i++) nonzero = dense[i] != 0.0f;
  if (!nonzero) qt_test_fail("%s", WHAT("the dense gradient is all zeros (nothing compared)"));
  free(x), free(div), free(gamma), free(beta), free(rm), free(rv), free(y), free(mean), free(invstd), free(mask);
  free(out), free(argmax), free(qmask), free(dout), free(dense), free(val), free(dx1), free(dx2);
  free(dg1), free(db1), free(dg2), free(db2), free(dg3), free(db3);
#undef WHAT
}

int main(void) {
  if (!qt_batch_norm_pool_takes_blocked(16))
    printf("note: this build's pooled backward does not take blocked inputs (no AVX-512): only the blocked forward "
           "is compared\n");
  /* N, H, W, C, K: FashionCNN's two layers at a small batch (chunks of 1024 / 512 rows cross the
   * 784 / 196-row images); C = 3 (patterns of 32 rows: 3 * 8 * 6 = 144 rows, a 16-row tail);
   * C = 16 with 3x3 windows; one image smaller than a chunk */
  const int shapes[][5] = {{3, 28, 28, 32, 2}, {5, 14, 14, 64, 2}, {3, 8, 6, 3, 2}, {2, 9, 6, 16, 3}, {1, 4, 4, 32, 2}};
  const int nthreads[] = {1, 2};
  uint64_t seed = 1;
  for (size_t t = 0; t < sizeof nthreads / sizeof *nthreads; t++) {
    omp_set_num_threads(nthreads[t]);
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
      for (int kind = PLAIN; kind <= LSQ; kind++)
        for (int relu = 0; relu <= 2; relu++)
          for (int with_div = 0; with_div <= 1; with_div++)
            for (int write = 0; write <= 1; write++)
              run_case(shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], shapes[i][4], relu, with_div, kind,
                       write, seed += 10);
  }
  return qt_test_finish();
}
