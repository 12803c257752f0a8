/* Optimized CPU kernels against their plain `_ref` twins on odd shapes (C = 3, 7, 32, ...;
 * odd H and W; padding; stride != kernel; sizes that cross the parallel and chunking
 * thresholds, with tail rows), including accumulation into pre-filled gradients and NULL
 * gradient outputs.
 * Tolerances: pooling max/argmax, relu and add are exact; avg pools 1e-6 abs + 1e-5 rel;
 * batch norm outputs 2e-5 abs + 2e-5 rel, its channel sums (dgamma, dbeta) 1e-4 abs + 1e-4 rel
 * (float vs double accumulation over up to 40000 rows); cross-entropy 1e-6 abs + 1e-5 rel. */
#include "autograd/kernels.h"
#include "tests/common/testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check_exact_f32(const char *what, const float *got, const float *want, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (memcmp(&got[i], &want[i], sizeof(float)) != 0 && !(isnan(got[i]) && isnan(want[i]))) {
      qt_test_fail("%s: differs at %lld: got %.9g want %.9g", what, (long long)i, got[i], want[i]);
      return;
    }
}

static void check_exact_i32(const char *what, const int32_t *got, const int32_t *want, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (got[i] != want[i]) {
      qt_test_fail("%s: differs at %lld: got %d want %d", what, (long long)i, got[i], want[i]);
      return;
    }
}

/* ---- batch norm -------------------------------------------------------------------------- */

static void test_batch_norm(int M, int C, float center, uint64_t seed) {
  char what[128];
  const int64_t n = (int64_t)M * C;
  float *x = qt_test_uniform_range(n, center - 2.0f, center + 2.0f, seed);
  float *gamma = qt_test_uniform_range(C, 0.5f, 1.5f, seed + 1), *beta = qt_test_uniform_range(C, -0.5f, 0.5f, seed + 2);
  float *rm0 = qt_test_uniform_range(C, -0.2f, 0.2f, seed + 3), *rv0 = qt_test_uniform_range(C, 0.5f, 2.0f, seed + 4);
  float *dy = qt_test_uniform_range(n, -1.0f, 1.0f, seed + 5), *dx0 = qt_test_uniform_range(n, -1.0f, 1.0f, seed + 6);
  float *dg0 = qt_test_uniform_range(C, -1.0f, 1.0f, seed + 7), *db0 = qt_test_uniform_range(C, -1.0f, 1.0f, seed + 8);

  /* training forward */
  float *y1 = malloc(n * 4), *y2 = malloc(n * 4), *m1 = malloc(C * 4), *m2 = malloc(C * 4);
  float *s1 = malloc(C * 4), *s2 = malloc(C * 4);
  float *rm1 = qt_test_copy_f32(rm0, C), *rv1 = qt_test_copy_f32(rv0, C), *rm2 = qt_test_copy_f32(rm0, C), *rv2 = qt_test_copy_f32(rv0, C);
  qt_batch_norm_forward_train(y1, m1, s1, x, gamma, beta, rm1, rv1, 0.1f, 1e-5f, M, C);
  qt_batch_norm_forward_train_ref(y2, m2, s2, x, gamma, beta, rm2, rv2, 0.1f, 1e-5f, M, C);
#define BN_WHAT(s) (snprintf(what, sizeof what, "bn M=%d C=%d center=%g: %s", M, C, center, s), what)
  qt_test_close(BN_WHAT("train out"), y1, y2, n, 2e-5f, 2e-5f);
  qt_test_close(BN_WHAT("train mean"), m1, m2, C, 1e-6f, 1e-6f);
  qt_test_close(BN_WHAT("train invstd"), s1, s2, C, 0, 1e-5f);
  qt_test_close(BN_WHAT("running mean"), rm1, rm2, C, 1e-6f, 1e-6f);
  qt_test_close(BN_WHAT("running var"), rv1, rv2, C, 0, 1e-5f);
  /* no running stats, no affine */
  qt_batch_norm_forward_train(y1, m1, s1, x, NULL, NULL, NULL, NULL, 0.1f, 1e-5f, M, C);
  qt_batch_norm_forward_train_ref(y2, m2, s2, x, NULL, NULL, NULL, NULL, 0.1f, 1e-5f, M, C);
  qt_test_close(BN_WHAT("train out (affine=False)"), y1, y2, n, 2e-5f, 2e-5f);

  /* training backward, accumulating, all outputs and each NULL pattern */
  for (int mask = 1; mask < 8; mask++) {
    float *dxa = mask & 1 ? qt_test_copy_f32(dx0, n) : NULL, *dxb = mask & 1 ? qt_test_copy_f32(dx0, n) : NULL;
    float *dga = mask & 2 ? qt_test_copy_f32(dg0, C) : NULL, *dgb = mask & 2 ? qt_test_copy_f32(dg0, C) : NULL;
    float *dba = mask & 4 ? qt_test_copy_f32(db0, C) : NULL, *dbb = mask & 4 ? qt_test_copy_f32(db0, C) : NULL;
    qt_batch_norm_backward(dxa, dga, dba, dy, x, m2, s2, gamma, M, C);
    qt_batch_norm_backward_ref(dxb, dgb, dbb, dy, x, m2, s2, gamma, M, C);
    if (dxa) qt_test_close(BN_WHAT("backward dinp"), dxa, dxb, n, 2e-5f, 2e-5f);
    if (dga) qt_test_close(BN_WHAT("backward dgamma"), dga, dgb, C, 1e-4f, 1e-4f);
    if (dba) qt_test_close(BN_WHAT("backward dbeta"), dba, dbb, C, 1e-4f, 1e-4f);
    qt_batch_norm_backward_eval(dxa, dga, dba, dy, x, rm0, s2, gamma, M, C);
    qt_batch_norm_backward_eval_ref(dxb, dgb, dbb, dy, x, rm0, s2, gamma, M, C);
    if (dxa) qt_test_close(BN_WHAT("backward_eval dinp"), dxa, dxb, n, 2e-5f, 2e-5f);
    if (dga) qt_test_close(BN_WHAT("backward_eval dgamma"), dga, dgb, C, 1e-4f, 1e-4f);
    if (dba) qt_test_close(BN_WHAT("backward_eval dbeta"), dba, dbb, C, 1e-4f, 1e-4f);
    free(dxa), free(dxb), free(dga), free(dgb), free(dba), free(dbb);
  }
  /* everything NULL is a no-op */
  qt_batch_norm_backward(NULL, NULL, NULL, dy, x, m2, s2, gamma, M, C);
  qt_batch_norm_backward_eval(NULL, NULL, NULL, dy, x, m2, s2, gamma, M, C);

  /* eval forward */
  qt_batch_norm_forward_eval(y1, x, gamma, beta, rm0, rv0, 1e-5f, M, C);
  qt_batch_norm_forward_eval_ref(y2, x, gamma, beta, rm0, rv0, 1e-5f, M, C);
  qt_test_close(BN_WHAT("eval out"), y1, y2, n, 2e-5f, 2e-5f);
#undef BN_WHAT
  free(x), free(gamma), free(beta), free(rm0), free(rv0), free(dy), free(dx0), free(dg0), free(db0);
  free(y1), free(y2), free(m1), free(m2), free(s1), free(s2), free(rm1), free(rv1), free(rm2), free(rv2);
}

/* Batch norm fused with relu / relu6 equals the two kernels in turn bit for bit: the output,
 * mask, statistics and running statistics of the forward; the input, gamma and beta gradients
 * of the backward (written into a NaN-filled buffer, and written in place over dout), and dout
 * left as the masked gradient. M*C with and without whole 64-element blocks and patterns. */
static void test_batch_norm_relu(int M, int C, int six, uint64_t seed) {
  char what[128];
#define BR_WHAT(s) (snprintf(what, sizeof what, "bn+relu%s M=%d C=%d: %s", six ? "6" : "", M, C, s), what)
  const int64_t n = (int64_t)M * C, nb = (n + 7) / 8;
  float *x = qt_test_uniform_range(n, -3.0f, 3.0f, seed);
  for (int64_t i = 0; i < n; i += 37) x[i] = NAN;
  float *gamma = qt_test_uniform_range(C, 0.5f, 4.0f, seed + 1), *beta = qt_test_uniform_range(C, -0.5f, 3.0f, seed + 2);
  float *rm1 = qt_test_uniform_range(C, -0.2f, 0.2f, seed + 3), *rv1 = qt_test_uniform_range(C, 0.5f, 2.0f, seed + 4);
  float *rm2 = qt_test_copy_f32(rm1, C), *rv2 = qt_test_copy_f32(rv1, C);
  float *y1 = malloc(n * 4), *y2 = malloc(n * 4), *m1 = malloc(C * 4), *m2 = malloc(C * 4);
  float *s1 = malloc(C * 4), *s2 = malloc(C * 4);
  uint8_t *k1 = malloc(nb), *k2 = malloc(nb);
  int64_t total;
  qt_batch_norm_relu_forward_train(y1, k1, six, m1, s1, x, NULL, gamma, beta, rm1, rv1, 0.1f, 1e-5f, M, C, NULL, &total);
  qt_batch_norm_forward_train(y2, m2, s2, x, gamma, beta, rm2, rv2, 0.1f, 1e-5f, M, C);
  qt_relu_forward_mask(y2, k2, y2, n, six);
  check_exact_f32(BR_WHAT("forward out"), y1, y2, n);
  check_exact_f32(BR_WHAT("mean"), m1, m2, C);
  check_exact_f32(BR_WHAT("invstd"), s1, s2, C);
  check_exact_f32(BR_WHAT("running mean"), rm1, rm2, C);
  check_exact_f32(BR_WHAT("running var"), rv1, rv2, C);
  if (memcmp(k1, k2, nb) != 0 || total != M) qt_test_fail("%s", BR_WHAT("mask or row count differ"));

  float *dy = qt_test_uniform_range(n, -1.0f, 1.0f, seed + 5);
  float *dy1 = qt_test_copy_f32(dy, n), *dy2 = qt_test_copy_f32(dy, n);
  float *dx1 = malloc(n * 4), *dx2 = malloc(n * 4);
  for (int64_t i = 0; i < n; i++) dx1[i] = NAN;
  float *dg1 = qt_test_uniform_range(C, -1.0f, 1.0f, seed + 6), *db1 = qt_test_uniform_range(C, -1.0f, 1.0f, seed + 7);
  float *dg2 = qt_test_copy_f32(dg1, C), *db2 = qt_test_copy_f32(db1, C);
  qt_batch_norm_relu_backward(dx1, 1, dg1, db1, dy1, k1, x, NULL, m1, s1, gamma, M, C, NULL, M);
  qt_relu_backward_mask(dy2, 1, dy2, k2, n);
  float *dbn = qt_test_copy_f32(dy2, n);
  qt_batch_norm_backward_sync(dx2, 1, dg2, db2, dy2, x, m2, s2, gamma, M, C, NULL, M);
  check_exact_f32(BR_WHAT("backward dinp"), dx1, dx2, n);
  check_exact_f32(BR_WHAT("backward dgamma"), dg1, dg2, C);
  check_exact_f32(BR_WHAT("backward dbeta"), db1, db2, C);
  check_exact_f32(BR_WHAT("dout left masked"), dy1, dbn, n);
  /* in place: dinp is dout */
  memcpy(dy1, dy, (size_t)n * sizeof(float));
  qt_batch_norm_relu_backward(dy1, 1, NULL, NULL, dy1, k1, x, NULL, m1, s1, gamma, M, C, NULL, M);
  check_exact_f32(BR_WHAT("backward dinp in place"), dy1, dx2, n);
#undef BR_WHAT
  free(x), free(gamma), free(beta), free(rm1), free(rv1), free(rm2), free(rv2), free(y1), free(y2), free(m1);
  free(m2), free(s1), free(s2), free(k1), free(k2), free(dy), free(dy1), free(dy2), free(dx1), free(dx2);
  free(dg1), free(db1), free(dg2), free(db2), free(dbn);
}

/* Batch norm of x / div with the division on the fly equals dividing into a buffer first
 * (x[i] / div[c], as qt_channel_scale) and normalizing that, bit for bit: training forward (with
 * relu, relu6 or neither) and backward, eval forward and backward (with and without the
 * gamma/beta sums), written into NaN-filled buffers. */
static void test_batch_norm_div(int M, int C, int relu, uint64_t seed) {
  char what[128];
#define BD_WHAT(s) (snprintf(what, sizeof what, "bn/div relu=%d M=%d C=%d: %s", relu, M, C, s), what)
  const int64_t n = (int64_t)M * C, nb = (n + 7) / 8;
  float *x = qt_test_uniform_range(n, -3.0f, 5.0f, seed), *div = qt_test_uniform_range(C, 0.3f, 3.0f, seed + 1), *q = malloc(n * 4);
  for (int64_t i = 0; i < n; i++) q[i] = x[i] / div[i % C];
  float *gamma = qt_test_uniform_range(C, 0.5f, 2.0f, seed + 2), *beta = qt_test_uniform_range(C, -0.5f, 1.0f, seed + 3);
  float *rm1 = qt_test_uniform_range(C, -0.2f, 0.2f, seed + 4), *rv1 = qt_test_uniform_range(C, 0.5f, 2.0f, seed + 5);
  float *rm2 = qt_test_copy_f32(rm1, C), *rv2 = qt_test_copy_f32(rv1, C);
  float *y1 = malloc(n * 4), *y2 = malloc(n * 4), *m1 = malloc(C * 4), *m2 = malloc(C * 4);
  float *s1 = malloc(C * 4), *s2 = malloc(C * 4);
  uint8_t *k1 = relu ? malloc(nb) : NULL, *k2 = relu ? malloc(nb) : NULL;
  int64_t total;
  qt_batch_norm_relu_forward_train(y1, k1, relu == 2, m1, s1, x, div, gamma, beta, rm1, rv1, 0.1f, 1e-5f, M, C, NULL,
                                   &total);
  qt_batch_norm_relu_forward_train(y2, k2, relu == 2, m2, s2, q, NULL, gamma, beta, rm2, rv2, 0.1f, 1e-5f, M, C, NULL,
                                   &total);
  check_exact_f32(BD_WHAT("train out"), y1, y2, n);
  check_exact_f32(BD_WHAT("train mean"), m1, m2, C);
  check_exact_f32(BD_WHAT("train invstd"), s1, s2, C);
  check_exact_f32(BD_WHAT("running mean"), rm1, rm2, C);
  check_exact_f32(BD_WHAT("running var"), rv1, rv2, C);
  if (relu && memcmp(k1, k2, nb) != 0) qt_test_fail("%s", BD_WHAT("relu mask differs"));
  float *dy = qt_test_uniform_range(n, -1.0f, 1.0f, seed + 6), *dy1 = qt_test_copy_f32(dy, n), *dy2 = qt_test_copy_f32(dy, n);
  float *dx1 = malloc(n * 4), *dx2 = malloc(n * 4);
  float *dg1 = qt_test_uniform_range(C, -1.0f, 1.0f, seed + 7), *db1 = qt_test_uniform_range(C, -1.0f, 1.0f, seed + 8);
  float *dg2 = qt_test_copy_f32(dg1, C), *db2 = qt_test_copy_f32(db1, C);
  for (int64_t i = 0; i < n; i++) dx1[i] = dx2[i] = NAN;
  qt_batch_norm_relu_backward(dx1, 1, dg1, db1, dy1, k1, x, div, m1, s1, gamma, M, C, NULL, M);
  qt_batch_norm_relu_backward(dx2, 1, dg2, db2, dy2, k2, q, NULL, m2, s2, gamma, M, C, NULL, M);
  check_exact_f32(BD_WHAT("train backward dinp"), dx1, dx2, n);
  check_exact_f32(BD_WHAT("train backward dgamma"), dg1, dg2, C);
  check_exact_f32(BD_WHAT("train backward dbeta"), db1, db2, C);
  /* eval: running statistics */
  qt_batch_norm_forward_eval_div(y1, x, div, gamma, beta, rm1, rv1, 1e-5f, M, C);
  qt_batch_norm_forward_eval(y2, q, gamma, beta, rm1, rv1, 1e-5f, M, C);
  check_exact_f32(BD_WHAT("eval out"), y1, y2, n);
  for (int params = 0; params < 2; params++) {
    for (int64_t i = 0; i < n; i++) dx1[i] = dx2[i] = NAN;
    qt_batch_norm_backward_eval_ex(dx1, 1, params ? dg1 : NULL, params ? db1 : NULL, dy, x, div, rm1, s1, gamma, M, C);
    qt_batch_norm_backward_eval_ex(dx2, 1, params ? dg2 : NULL, params ? db2 : NULL, dy, q, NULL, rm1, s1, gamma, M, C);
    check_exact_f32(BD_WHAT("eval backward dinp"), dx1, dx2, n);
    check_exact_f32(BD_WHAT("eval backward dgamma"), dg1, dg2, C);
    check_exact_f32(BD_WHAT("eval backward dbeta"), db1, db2, C);
  }
#undef BD_WHAT
  free(x), free(div), free(q), free(gamma), free(beta), free(rm1), free(rv1), free(rm2), free(rv2), free(y1);
  free(y2), free(m1), free(m2), free(s1), free(s2), free(k1), free(k2), free(dy), free(dy1), free(dy2), free(dx1);
  free(dx2), free(dg1), free(db1), free(dg2), free(db2);
}

/* ---- pooling ----------------------------------------------------------------------------- */

typedef struct {
  int N, H, W, C, KH, KW, sh, sw, ph, pw;
} pool_case;

/* kind 0: uniform values; 1: coarse values with many ties; 2: ties plus NaNs */
static void test_pool(pool_case pc, int kind, uint64_t seed) {
  char what[160];
  qt_pool2d_shape s = {.N = pc.N, .H = pc.H, .W = pc.W, .C = pc.C, .KH = pc.KH, .KW = pc.KW,
                       .stride_h = pc.sh, .stride_w = pc.sw, .pad_h = pc.ph, .pad_w = pc.pw};
  if (qt_pool2d_shape_init(&s) != 0) {
    qt_test_fail("pool shape init refused a valid case");
    return;
  }
  const int64_t nin = (int64_t)s.N * s.H * s.W * s.C, nout = (int64_t)s.N * s.OH * s.OW * s.C;
  float *x = qt_test_uniform_range(nin, -1.0f, 1.0f, seed);
  if (kind >= 1)
    for (int64_t i = 0; i < nin; i++) x[i] = roundf(x[i] * 2.0f) / 2.0f;
  if (kind == 2)
    for (int64_t i = 0; i < nin; i += 7) x[i] = NAN;
  float *dy = qt_test_uniform_range(nout, -1.0f, 1.0f, seed + 1), *dx0 = qt_test_uniform_range(nin, -1.0f, 1.0f, seed + 2);
  float *y1 = malloc(nout * 4), *y2 = malloc(nout * 4);
  int32_t *a1 = malloc(nout * 4), *a2 = malloc(nout * 4);
  float *dx1 = qt_test_copy_f32(dx0, nin), *dx2 = qt_test_copy_f32(dx0, nin);
#define P_WHAT(t) \
  (snprintf(what, sizeof what, "pool N%d H%d W%d C%d k%dx%d s%dx%d p%dx%d kind%d: %s", pc.N, pc.H, pc.W, pc.C, pc.KH, \
            pc.KW, pc.sh, pc.sw, pc.ph, pc.pw, kind, t), what)
  qt_max_pool2d_forward(y1, a1, x, &s);
  qt_max_pool2d_forward_ref(y2, a2, x, &s);
  check_exact_f32(P_WHAT("max out"), y1, y2, nout);
  check_exact_i32(P_WHAT("max argmax"), a1, a2, nout);
  if (kind < 2) { /* a NaN gradient path is not meaningful */
    qt_max_pool2d_backward(dx1, dy, a2, &s);
    qt_max_pool2d_backward_ref(dx2, dy, a2, &s);
    qt_test_close(P_WHAT("max dinp"), dx1, dx2, nin, 0, 0);
    /* written into a fresh (here NaN-filled) buffer: the bits of accumulating into zeros */
    for (int64_t i = 0; i < nin; i++) dx1[i] = NAN, dx2[i] = 0.0f;
    qt_max_pool2d_backward_ex(dx1, 1, dy, a2, &s);
    qt_max_pool2d_backward(dx2, dy, a2, &s);
    check_exact_f32(P_WHAT("max dinp written"), dx1, dx2, nin);

    qt_avg_pool2d_forward(y1, x, &s);
    qt_avg_pool2d_forward_ref(y2, x, &s);
    qt_test_close(P_WHAT("avg out"), y1, y2, nout, 1e-6f, 1e-5f);
    memcpy(dx1, dx0, nin * 4);
    memcpy(dx2, dx0, nin * 4);
    qt_avg_pool2d_backward(dx1, dy, &s);
    qt_avg_pool2d_backward_ref(dx2, dy, &s);
    qt_test_close(P_WHAT("avg dinp"), dx1, dx2, nin, 1e-6f, 1e-5f);
  }
#undef P_WHAT
  free(x), free(dy), free(dx0), free(y1), free(y2), free(a1), free(a2), free(dx1), free(dx2);
}

static void test_global_avg_pool(int N, int HW, int C, uint64_t seed) {
  char what[96];
  const int64_t nin = (int64_t)N * HW * C;
  float *x = qt_test_uniform_range(nin, -1.0f, 1.0f, seed), *dy = qt_test_uniform_range((int64_t)N * C, -1.0f, 1.0f, seed + 1);
  float *dx0 = qt_test_uniform_range(nin, -1.0f, 1.0f, seed + 2), *dx1 = qt_test_copy_f32(dx0, nin), *dx2 = qt_test_copy_f32(dx0, nin);
  float *y1 = malloc((size_t)N * C * 4), *y2 = malloc((size_t)N * C * 4);
  snprintf(what, sizeof what, "global_avg_pool N%d HW%d C%d", N, HW, C);
  qt_global_avg_pool_forward(y1, x, N, HW, C);
  qt_global_avg_pool_forward_ref(y2, x, N, HW, C);
  qt_test_close(what, y1, y2, (int64_t)N * C, 1e-6f, 1e-5f);
  qt_global_avg_pool_backward(dx1, 0, dy, N, HW, C);
  qt_global_avg_pool_backward_ref(dx2, 0, dy, N, HW, C);
  qt_test_close(what, dx1, dx2, nin, 0, 0);
  /* written over (a fresh buffer): what was there before must not count */
  qt_global_avg_pool_backward(dx1, 1, dy, N, HW, C);
  memset(dx2, 0, (size_t)nin * sizeof *dx2);
  qt_global_avg_pool_backward_ref(dx2, 0, dy, N, HW, C);
  qt_test_close(what, dx1, dx2, nin, 0, 0);
  memcpy(dx1, dx0, (size_t)nin * sizeof *dx1);
  qt_global_avg_pool_backward_ref(dx1, 1, dy, N, HW, C);
  qt_test_close(what, dx1, dx2, nin, 0, 0);
  free(x), free(dy), free(dx0), free(dx1), free(dx2), free(y1), free(y2);
}

/* ---- element-wise ------------------------------------------------------------------------ */

static void test_relu_add(int64_t n, uint64_t seed) {
  float *x = qt_test_uniform_range(n, -1.0f, 1.0f, seed), *b = qt_test_uniform_range(n, -1.0f, 1.0f, seed + 1);
  for (int64_t i = 0; i < n; i += 5) x[i] = 0.0f;
  for (int64_t i = 1; i < n; i += 11) x[i] = -0.0f;
  for (int64_t i = 2; i < n; i += 13) x[i] = NAN;
  float *y1 = malloc(n * 4), *y2 = malloc(n * 4), *dy = qt_test_uniform_range(n, -1.0f, 1.0f, seed + 2);
  float *dx0 = qt_test_uniform_range(n, -1.0f, 1.0f, seed + 3), *dx1 = qt_test_copy_f32(dx0, n), *dx2 = qt_test_copy_f32(dx0, n);
  qt_relu_forward(y1, x, n);
  qt_relu_forward_ref(y2, x, n);
  check_exact_f32("relu forward", y1, y2, n);
  float *inplace = qt_test_copy_f32(x, n);
  qt_relu_forward(inplace, inplace, n);
  check_exact_f32("relu forward in place", inplace, y2, n);
  qt_relu_backward(dx1, dy, y2, n);
  qt_relu_backward_ref(dx2, dy, y2, n);
  check_exact_f32("relu backward", dx1, dx2, n);

  for (int64_t i = 3; i < n; i += 7) x[i] = (float)(i % 3) * 3.0f + 4.5f; /* 4.5, 7.5, 10.5: at and above 6 */
  for (int64_t i = 4; i < n; i += 17) x[i] = 6.0f;
  qt_relu6_forward(y1, x, n);
  qt_relu6_forward_ref(y2, x, n);
  check_exact_f32("relu6 forward", y1, y2, n);
  memcpy(inplace, x, (size_t)n * sizeof(float));
  qt_relu6_forward(inplace, inplace, n);
  check_exact_f32("relu6 forward in place", inplace, y2, n);
  memcpy(dx1, dx0, (size_t)n * sizeof(float));
  memcpy(dx2, dx0, (size_t)n * sizeof(float));
  qt_relu6_backward(dx1, dy, y2, n);
  qt_relu6_backward_ref(dx2, dy, y2, n);
  check_exact_f32("relu6 backward", dx1, dx2, n);

  qt_add_forward(y1, x, b, n);
  qt_add_forward_ref(y2, x, b, n);
  check_exact_f32("add forward", y1, y2, n);
  float *ina = qt_test_copy_f32(x, n);
  qt_add_forward(ina, ina, b, n);
  check_exact_f32("add forward in place", ina, y2, n);
  float *da1 = qt_test_copy_f32(dx0, n), *db1 = qt_test_copy_f32(b, n), *da2 = qt_test_copy_f32(dx0, n), *db2 = qt_test_copy_f32(b, n);
  qt_add_backward(da1, 0, db1, 0, dy, n);
  qt_add_backward_ref(da2, 0, db2, 0, dy, n);
  check_exact_f32("add backward da", da1, da2, n);
  check_exact_f32("add backward db", db1, db2, n);
  qt_add_backward(NULL, 0, db1, 0, dy, n);
  qt_add_backward_ref(NULL, 0, db2, 0, dy, n);
  qt_add_backward(da1, 0, NULL, 0, dy, n);
  qt_add_backward_ref(da2, 0, NULL, 0, dy, n);
  check_exact_f32("add backward da (db NULL)", da1, da2, n);
  check_exact_f32("add backward db (da NULL)", db1, db2, n);
  /* written over (a fresh buffer) on one side, added on the other; the reference's write from
   * garbage equals its add to zeros */
  qt_add_backward(da1, 1, db1, 0, dy, n);
  qt_add_backward_ref(da2, 1, db2, 0, dy, n);
  check_exact_f32("add backward da written", da1, dy, n);
  check_exact_f32("add backward da written (ref)", da2, dy, n);
  check_exact_f32("add backward db added", db1, db2, n);
  memcpy(da1, dx0, (size_t)n * sizeof *da1);
  qt_add_backward(da1, 0, db1, 1, dy, n);
  qt_add_backward_ref(da2, 0, db2, 1, dy, n);
  check_exact_f32("add backward db written", db1, dy, n);
  check_exact_f32("add backward db written (ref)", db2, dy, n);
  free(x), free(b), free(y1), free(y2), free(dy), free(dx0), free(dx1), free(dx2), free(inplace), free(ina);
  free(da1), free(db1), free(da2), free(db2);
}

/* The training relu/relu6 (mask as bits): the output equals qt_relu_forward's (in place too), the
 * mask is the reference's bit for bit (bits past n zero), the accumulating backward equals the
 * output-based qt_relu_backward's sums bit for bit, the written one the reference's, into a
 * NaN-filled buffer and in place over dout. n: vector blocks of 64 with and without a tail. */
static void test_relu_mask(int64_t n, int six, uint64_t seed) {
  char what[96];
#define RM_WHAT(s) (snprintf(what, sizeof what, "relu%s mask n=%lld: %s", six ? "6" : "", (long long)n, s), what)
  float *x = qt_test_uniform_range(n, -8.0f, 8.0f, seed);
  for (int64_t i = 0; i < n; i += 5) x[i] = 0.0f;
  for (int64_t i = 1; i < n; i += 11) x[i] = -0.0f;
  for (int64_t i = 2; i < n; i += 13) x[i] = NAN;
  for (int64_t i = 4; i < n; i += 17) x[i] = 6.0f;
  for (int64_t i = 6; i < n; i += 19) x[i] = -NAN;
  const int64_t nb = (n + 7) / 8;
  float *y1 = malloc(n * 4), *y2 = malloc(n * 4), *y3 = malloc(n * 4), *dy = qt_test_uniform_range(n, -1.0f, 1.0f, seed + 1);
  for (int64_t i = 3; i < n; i += 23) dy[i] = -0.0f;
  uint8_t *m1 = malloc(nb), *m2 = malloc(nb);
  memset(m1, 0xA5, nb);
  qt_relu_forward_mask(y1, m1, x, n, six);
  qt_relu_forward_mask_ref(y2, m2, x, n, six);
  (six ? qt_relu6_forward : qt_relu_forward)(y3, x, n);
  check_exact_f32(RM_WHAT("forward vs reference"), y1, y2, n);
  check_exact_f32(RM_WHAT("forward vs the unmasked kernel"), y1, y3, n);
  if (memcmp(m1, m2, nb) != 0) qt_test_fail("%s", RM_WHAT("mask differs from the reference"));
  float *inplace = qt_test_copy_f32(x, n);
  memset(m1, 0x5A, nb);
  qt_relu_forward_mask(inplace, m1, inplace, n, six);
  check_exact_f32(RM_WHAT("forward in place"), inplace, y2, n);
  if (memcmp(m1, m2, nb) != 0) qt_test_fail("%s", RM_WHAT("mask (in place) differs"));

  float *dx0 = qt_test_uniform_range(n, -1.0f, 1.0f, seed + 2);
  for (int64_t i = 0; i < n; i += 29) dx0[i] = -0.0f;
  float *dx1 = qt_test_copy_f32(dx0, n), *dx2 = qt_test_copy_f32(dx0, n), *dx3 = qt_test_copy_f32(dx0, n);
  qt_relu_backward_mask(dx1, 0, dy, m1, n);
  qt_relu_backward_mask_ref(dx2, 0, dy, m2, n);
  (six ? qt_relu6_backward : qt_relu_backward)(dx3, dy, y2, n);
  check_exact_f32(RM_WHAT("backward (accumulate) vs reference"), dx1, dx2, n);
  check_exact_f32(RM_WHAT("backward (accumulate) vs the output-based kernel"), dx1, dx3, n);
  for (int64_t i = 0; i < n; i++) dx1[i] = NAN;
  qt_relu_backward_mask(dx1, 1, dy, m1, n);
  qt_relu_backward_mask_ref(dx2, 1, dy, m2, n);
  check_exact_f32(RM_WHAT("backward (written) vs reference"), dx1, dx2, n);
  memcpy(dx3, dy, (size_t)n * sizeof(float));
  qt_relu_backward_mask(dx3, 1, dx3, m1, n);
  check_exact_f32(RM_WHAT("backward (written in place over dout)"), dx3, dx2, n);
  for (int64_t i = 0; i < n; i++) {
    const int pass = six ? !(y2[i] <= 0.0f) && !(y2[i] >= 6.0f) : !(y2[i] <= 0.0f);
    if (((m2[i / 8] >> (i % 8)) & 1) != pass) {
      qt_test_fail("%s at %lld", RM_WHAT("reference mask disagrees with the backward test"), (long long)i);
      break;
    }
  }
  if (n % 8 && (m1[nb - 1] >> (n % 8)) != 0) qt_test_fail("%s", RM_WHAT("bits past n are set"));
#undef RM_WHAT
  free(x), free(y1), free(y2), free(y3), free(dy), free(m1), free(m2), free(inplace);
  free(dx0), free(dx1), free(dx2), free(dx3);
}

static void test_cross_entropy(int N, int C, float scale, uint64_t seed) {
  char what[96];
  const int64_t n = (int64_t)N * C;
  float *x = qt_test_uniform_range(n, -scale, scale, seed), *p1 = malloc(n * 4), *p2 = malloc(n * 4);
  float *d0 = qt_test_uniform_range(n, -1.0f, 1.0f, seed + 1), *d1 = qt_test_copy_f32(d0, n), *d2 = qt_test_copy_f32(d0, n);
  int32_t *labels = malloc((size_t)N * sizeof *labels);
  for (int i = 0; i < N; i++) labels[i] = (int32_t)((i * 7919u + (unsigned)seed) % (unsigned)C);
  snprintf(what, sizeof what, "cross_entropy N%d C%d scale%g", N, C, scale);
  float l1 = qt_cross_entropy_forward(p1, x, labels, N, C);
  float l2 = qt_cross_entropy_forward_ref(p2, x, labels, N, C);
  qt_test_close(what, &l1, &l2, 1, 1e-6f, 1e-5f);
  qt_test_close(what, p1, p2, n, 1e-6f, 1e-5f);
  qt_cross_entropy_backward(d1, p2, labels, 1.7f, N, C);
  qt_cross_entropy_backward_ref(d2, p2, labels, 1.7f, N, C);
  qt_test_close(what, d1, d2, n, 1e-7f, 1e-6f);
  free(x), free(p1), free(p2), free(d0), free(d1), free(d2), free(labels);
}

/* Training BN backward writing a fresh (NaN-filled) dinp: the bits of accumulating into zeros,
 * signed zeros included (dout 0 where it can make -0). */
static void test_batch_norm_written(int M, int C, uint64_t seed) {
  char what[96];
  const int64_t n = (int64_t)M * C;
  float *x = qt_test_uniform_range(n, -2.0f, 2.0f, seed), *dy = qt_test_uniform_range(n, -1.0f, 1.0f, seed + 1);
  float *gamma = qt_test_uniform_range(C, 0.5f, 1.5f, seed + 2), *beta = qt_test_uniform_range(C, -0.5f, 0.5f, seed + 3);
  for (int64_t i = 0; i < n; i += 5) dy[i] = 0.0f;
  float *y = malloc(n * 4), *mean = malloc(C * 4), *invstd = malloc(C * 4), *rm = calloc(C, 4), *rv = malloc(C * 4);
  for (int c = 0; c < C; c++) rv[c] = 1.0f;
  qt_batch_norm_forward_train(y, mean, invstd, x, gamma, beta, rm, rv, 0.1f, 1e-5f, M, C);
  float *dx1 = malloc(n * 4), *dx2 = calloc((size_t)n, 4), *dg1 = calloc(C, 4), *dg2 = calloc(C, 4);
  float *db1 = calloc(C, 4), *db2 = calloc(C, 4);
  for (int64_t i = 0; i < n; i++) dx1[i] = NAN;
  qt_batch_norm_backward_sync(dx1, 1, dg1, db1, dy, x, mean, invstd, gamma, M, C, NULL, M);
  qt_batch_norm_backward(dx2, dg2, db2, dy, x, mean, invstd, gamma, M, C);
  snprintf(what, sizeof what, "bn M%d C%d: dinp written", M, C);
  check_exact_f32(what, dx1, dx2, n);
  snprintf(what, sizeof what, "bn M%d C%d: dgamma beside a written dinp", M, C);
  check_exact_f32(what, dg1, dg2, C);
  /* eval mode (frozen BN), with and without the parameter gradients (two code paths) */
  for (int params = 0; params < 2; params++) {
    for (int64_t i = 0; i < n; i++) dx1[i] = NAN, dx2[i] = 0.0f;
    qt_batch_norm_backward_eval_ex(dx1, 1, params ? dg1 : NULL, params ? db1 : NULL, dy, x, NULL, mean, invstd, gamma, M,
                                   C);
    qt_batch_norm_backward_eval(dx2, params ? dg2 : NULL, params ? db2 : NULL, dy, x, mean, invstd, gamma, M, C);
    snprintf(what, sizeof what, "bn eval M%d C%d params %d: dinp written", M, C, params);
    check_exact_f32(what, dx1, dx2, n);
  }
  free(x), free(dy), free(gamma), free(beta), free(y), free(mean), free(invstd), free(rm), free(rv);
  free(dx1), free(dx2), free(dg1), free(dg2), free(db1), free(db2);
}

int main(void) {
  test_batch_norm_written(105, 3, 500);
  test_batch_norm_written(10007, 7, 501);
  test_batch_norm_written(40000, 32, 502);
  /* (M, C): tiny, odd C, multi-chunk with tail rows (C=7: 32-row patterns, 4672-row chunks),
   * the FashionCNN channel counts, and wide C (pattern of 2 rows; pattern of 1 row). */
  const int bn[][2] = {{105, 3}, {126, 7}, {429, 32}, {10007, 7}, {40000, 32}, {3 * 7 * 7 * 3, 64},
                       {77, 1000}, {40, 2500}, {2, 5}, {1037, 1}};
  for (size_t i = 0; i < sizeof bn / sizeof bn[0]; i++) test_batch_norm(bn[i][0], bn[i][1], 0.0f, 10 + i);
  test_batch_norm(10007, 7, 1000.0f, 99); /* large mean: the variance must not cancel */
  for (int six = 0; six < 2; six++) {
    test_batch_norm_relu(105, 3, six, 600);     /* tail rows, a partial last block */
    test_batch_norm_relu(40000, 32, six, 601);  /* FashionCNN's conv1 at batch 51: several chunks */
    test_batch_norm_relu(3 * 7 * 7 * 3, 64, six, 602);
    test_batch_norm_relu(10007, 7, six, 603);
    test_batch_norm_relu(2, 5, six, 604);
  }
  for (int relu = 0; relu < 3; relu++) {
    test_batch_norm_div(105, 3, relu, 700);
    test_batch_norm_div(40000, 32, relu, 701);
    test_batch_norm_div(10007, 7, relu, 702);
    test_batch_norm_div(3 * 7 * 7 * 3, 64, relu, 703);
  }
  test_batch_norm(40000, 32, -300.0f, 98);

  const pool_case pools[] = {
      {2, 7, 9, 3, 2, 2, 2, 2, 0, 0},   {3, 11, 13, 7, 3, 3, 2, 2, 1, 1},  {2, 9, 7, 32, 3, 3, 1, 1, 1, 1},
      {1, 5, 5, 7, 2, 2, 3, 3, 0, 0},   {2, 8, 8, 5, 3, 3, 3, 3, 1, 1},    {2, 6, 7, 3, 1, 1, 1, 1, 0, 0},
      {2, 9, 10, 4, 3, 2, 1, 2, 1, 1},  {2, 1, 9, 6, 1, 3, 1, 2, 0, 1},    {8, 28, 28, 32, 2, 2, 2, 2, 0, 0},
      {4, 15, 15, 64, 3, 3, 2, 2, 1, 1}, {3, 7, 7, 7, 5, 5, 2, 2, 2, 2},
  };
  for (size_t i = 0; i < sizeof pools / sizeof pools[0]; i++)
    for (int kind = 0; kind < 3; kind++) test_pool(pools[i], kind, 100 + i);

  test_global_avg_pool(3, 35, 7, 200);
  test_global_avg_pool(2, 1, 5, 201);
  test_global_avg_pool(16, 49, 64, 202);

  test_relu_add(13, 300);
  test_relu_add(1000003, 301);
  const int64_t relu_n[] = {1, 7, 8, 64, 65, 130, 1000, 1000003};
  for (size_t i = 0; i < sizeof relu_n / sizeof relu_n[0]; i++)
    for (int six = 0; six < 2; six++) test_relu_mask(relu_n[i], six, 310 + 2 * i + six);

  test_cross_entropy(5, 3, 3.0f, 400);
  test_cross_entropy(128, 10, 5.0f, 401);
  test_cross_entropy(7, 1000, 20.0f, 402);
  test_cross_entropy(300, 300, 50.0f, 403);
  return qt_test_finish();
}
