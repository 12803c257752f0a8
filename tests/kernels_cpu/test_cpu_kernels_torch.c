/* CPU kernels against PyTorch 1.13 (tests/ref/cpu_ops.h5, written by
 * tests/ref/make_ref_cpu_ops.py): BatchNorm2d train (output, batch mean/invstd, running stats
 * after one step, gradients) and eval, max_pool2d k2s2 and k3s2p1 (values, indices, input
 * gradient; ties and NaNs), avg_pool2d k3s1p1, adaptive_avg_pool2d(1), relu, relu6 and mean
 * cross-entropy. Both the optimized kernels and their `_ref` twins are checked.
 * Tolerances: 1e-5 abs + 1e-4 rel for values and gradients (float32 rounding in a different
 * order than torch's); max pool indices and values exact. */
#include "autograd/kernels.h"
#include "tests/common/testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ATOL 1e-5f
#define RTOL 1e-4f

static const char *ref_file(void) {
  static char path[4096];
  snprintf(path, sizeof path, "%s", qt_test_path("tests/ref/cpu_ops.h5"));
  return path;
}

static float *load(const char *name, int64_t *shape) {
  int ndim;
  return qt_test_load_f32(ref_file(), name, shape, &ndim);
}

static float *load_n(const char *name, int64_t *n) {
  int64_t shape[8];
  int ndim;
  float *p = qt_test_load_f32(ref_file(), name, shape, &ndim);
  *n = qt_test_numel(shape, ndim);
  return p;
}


/* ---- batch norm -------------------------------------------------------------------------- */

static void test_batch_norm(int use_ref) {
  char what[64];
  int64_t sx[8], n, nc;
  float *x = load("bn_x", sx);
  n = sx[0] * sx[1] * sx[2] * sx[3];
  const int C = (int)sx[3], M = (int)(n / C);
  float *gamma = load_n("bn_gamma", &nc), *beta = load_n("bn_beta", &nc);
  float *rm = load_n("bn_rm0", &nc), *rv = load_n("bn_rv0", &nc), *dy = load_n("bn_dy", &n);
  float *y = qt_test_zeros(n), *mean = qt_test_zeros(C), *invstd = qt_test_zeros(C), *dx = qt_test_zeros(n), *dg = qt_test_zeros(C), *db = qt_test_zeros(C);
#define W(s) (snprintf(what, sizeof what, "%s bn %s", use_ref ? "ref" : "opt", s), what)
#define CMP(got, name, count)                          \
  do {                                                 \
    int64_t n_;                                        \
    float *want_ = load_n(name, &n_);                  \
    QT_CHECK(n_ == (count));                           \
    qt_test_close(W(name), got, want_, count, ATOL, RTOL); \
    free(want_);                                       \
  } while (0)
  (use_ref ? qt_batch_norm_forward_train_ref : qt_batch_norm_forward_train)(y, mean, invstd, x, gamma, beta, rm, rv,
                                                                            0.1f, 1e-5f, M, C);
  CMP(y, "bn_y_train", n);
  CMP(mean, "bn_mean", C);
  CMP(invstd, "bn_invstd", C);
  CMP(rm, "bn_rm1", C);
  CMP(rv, "bn_rv1", C);
  (use_ref ? qt_batch_norm_backward_ref : qt_batch_norm_backward)(dx, dg, db, dy, x, mean, invstd, gamma, M, C);
  CMP(dx, "bn_dx_train", n);
  CMP(dg, "bn_dgamma_train", C);
  CMP(db, "bn_dbeta_train", C);

  free(rm), free(rv);
  rm = load_n("bn_rm0", &nc), rv = load_n("bn_rv0", &nc);
  (use_ref ? qt_batch_norm_forward_eval_ref : qt_batch_norm_forward_eval)(y, x, gamma, beta, rm, rv, 1e-5f, M, C);
  CMP(y, "bn_y_eval", n);
  for (int c = 0; c < C; c++) invstd[c] = 1.0f / sqrtf(rv[c] + 1e-5f);
  memset(dx, 0, n * 4), memset(dg, 0, C * 4), memset(db, 0, C * 4);
  (use_ref ? qt_batch_norm_backward_eval_ref : qt_batch_norm_backward_eval)(dx, dg, db, dy, x, rm, invstd, gamma, M,
                                                                            C);
  CMP(dx, "bn_dx_eval", n);
  CMP(dg, "bn_dgamma_eval", C);
  CMP(db, "bn_dbeta_eval", C);
#undef W
  free(x), free(gamma), free(beta), free(rm), free(rv), free(dy), free(y), free(mean), free(invstd);
  free(dx), free(dg), free(db);
}

/* ---- pooling ------------------------------------------------------------------------------ */

static void test_max_pool(const char *prefix, int K, int S, int P, int with_grad, int use_ref) {
  char name[64], what[96];
  int64_t sx[8], sy[8];
  snprintf(name, sizeof name, "%s_x", prefix);
  float *x = load(name, sx);
  snprintf(name, sizeof name, "%s_y", prefix);
  float *want = load(name, sy);
  snprintf(name, sizeof name, "%s_idx", prefix);
  int32_t *want_idx = qt_test_load_i32(ref_file(), name, NULL, NULL);
  qt_pool2d_shape s = {.N = (int)sx[0], .H = (int)sx[1], .W = (int)sx[2], .C = (int)sx[3], .KH = K, .KW = K,
                       .stride_h = S, .stride_w = S, .pad_h = P, .pad_w = P};
  QT_CHECK(qt_pool2d_shape_init(&s) == 0);
  QT_CHECK(s.OH == sy[1] && s.OW == sy[2]);
  const int64_t nin = sx[0] * sx[1] * sx[2] * sx[3], nout = sy[0] * sy[1] * sy[2] * sy[3];
  float *y = qt_test_zeros(nout);
  int32_t *idx = calloc(nout, 4);
  (use_ref ? qt_max_pool2d_forward_ref : qt_max_pool2d_forward)(y, idx, x, &s);
  snprintf(what, sizeof what, "%s %s", use_ref ? "ref" : "opt", prefix);
  for (int64_t i = 0; i < nout; i++) {
    if (idx[i] != want_idx[i] || (isnan(want[i]) != isnan(y[i])) || (!isnan(want[i]) && y[i] != want[i])) {
      qt_test_fail("%s: output %lld: got %g at %d, torch %g at %d", what, (long long)i, y[i], idx[i], want[i],
                   want_idx[i]);
      break;
    }
  }
  if (with_grad) {
    snprintf(name, sizeof name, "%s_dy", prefix);
    float *dy = load(name, sy);
    snprintf(name, sizeof name, "%s_dx", prefix);
    float *want_dx = load(name, sx);
    float *dx = qt_test_zeros(nin);
    (use_ref ? qt_max_pool2d_backward_ref : qt_max_pool2d_backward)(dx, dy, idx, &s);
    qt_test_close(what, dx, want_dx, nin, ATOL, RTOL);
    free(dy), free(want_dx), free(dx);
  }
  free(x), free(want), free(want_idx), free(y), free(idx);
}

static void test_avg_pool(int use_ref) {
  int64_t sx[8], sy[8];
  float *x = load("ap_x", sx), *want = load("ap_y", sy), *dy = load("ap_dy", sy), *want_dx = load("ap_dx", sx);
  qt_pool2d_shape s = {.N = (int)sx[0], .H = (int)sx[1], .W = (int)sx[2], .C = (int)sx[3], .KH = 3, .KW = 3,
                       .stride_h = 1, .stride_w = 1, .pad_h = 1, .pad_w = 1};
  QT_CHECK(qt_pool2d_shape_init(&s) == 0);
  const int64_t nin = sx[0] * sx[1] * sx[2] * sx[3], nout = sy[0] * sy[1] * sy[2] * sy[3];
  float *y = qt_test_zeros(nout), *dx = qt_test_zeros(nin);
  (use_ref ? qt_avg_pool2d_forward_ref : qt_avg_pool2d_forward)(y, x, &s);
  qt_test_close(use_ref ? "ref avg_pool y" : "opt avg_pool y", y, want, nout, ATOL, RTOL);
  (use_ref ? qt_avg_pool2d_backward_ref : qt_avg_pool2d_backward)(dx, dy, &s);
  qt_test_close(use_ref ? "ref avg_pool dx" : "opt avg_pool dx", dx, want_dx, nin, ATOL, RTOL);
  free(x), free(want), free(dy), free(want_dx), free(y), free(dx);

  x = load("gap_x", sx), want = load("gap_y", sy), dy = load("gap_dy", sy), want_dx = load("gap_dx", sx);
  const int N = (int)sx[0], HW = (int)(sx[1] * sx[2]), C = (int)sx[3];
  y = qt_test_zeros((int64_t)N * C), dx = qt_test_zeros((int64_t)N * HW * C);
  (use_ref ? qt_global_avg_pool_forward_ref : qt_global_avg_pool_forward)(y, x, N, HW, C);
  qt_test_close(use_ref ? "ref global_avg_pool y" : "opt global_avg_pool y", y, want, (int64_t)N * C, ATOL, RTOL);
  (use_ref ? qt_global_avg_pool_backward_ref : qt_global_avg_pool_backward)(dx, 0, dy, N, HW, C);
  qt_test_close(use_ref ? "ref global_avg_pool dx" : "opt global_avg_pool dx", dx, want_dx, (int64_t)N * HW * C,
                ATOL, RTOL);
  free(x), free(want), free(dy), free(want_dx), free(y), free(dx);
}

/* ---- relu, cross-entropy ------------------------------------------------------------------ */

static void test_relu(int use_ref) {
  int64_t n;
  float *x = load_n("relu_x", &n), *want = load_n("relu_y", &n), *dy = load_n("relu_dy", &n);
  float *want_dx = load_n("relu_dx", &n), *y = qt_test_zeros(n), *dx = qt_test_zeros(n);
  (use_ref ? qt_relu_forward_ref : qt_relu_forward)(y, x, n);
  qt_test_close(use_ref ? "ref relu y" : "opt relu y", y, want, n, 0, 0);
  (use_ref ? qt_relu_backward_ref : qt_relu_backward)(dx, dy, y, n);
  qt_test_close(use_ref ? "ref relu dx" : "opt relu dx", dx, want_dx, n, 0, 0);
  free(x), free(want), free(dy), free(want_dx), free(y), free(dx);
}

static void test_relu6(int use_ref) {
  int64_t n;
  float *x = load_n("relu6_x", &n), *want = load_n("relu6_y", &n), *dy = load_n("relu6_dy", &n);
  float *want_dx = load_n("relu6_dx", &n), *y = qt_test_zeros(n), *dx = qt_test_zeros(n);
  (use_ref ? qt_relu6_forward_ref : qt_relu6_forward)(y, x, n);
  qt_test_close(use_ref ? "ref relu6 y" : "opt relu6 y", y, want, n, 0, 0);
  (use_ref ? qt_relu6_backward_ref : qt_relu6_backward)(dx, dy, y, n);
  qt_test_close(use_ref ? "ref relu6 dx" : "opt relu6 dx", dx, want_dx, n, 0, 0);
  free(x), free(want), free(dy), free(want_dx), free(y), free(dx);
}

static void test_cross_entropy(int use_ref) {
  int64_t shape[8], n, one;
  float *logits = load("ce_logits", shape);
  const int N = (int)shape[0], C = (int)shape[1];
  int32_t *labels = qt_test_load_i32(ref_file(), "ce_labels", NULL, NULL);
  float *want_loss = load_n("ce_loss", &one), *want_p = load_n("ce_probs", &n);
  float *want_d = load_n("ce_dlogits", &n), *want_d2 = load_n("ce_dlogits_scaled", &n);
  float *p = qt_test_zeros(n), *d = qt_test_zeros(n), *d2 = qt_test_zeros(n);
  float loss = (use_ref ? qt_cross_entropy_forward_ref : qt_cross_entropy_forward)(p, logits, labels, N, C);
  qt_test_close(use_ref ? "ref ce loss" : "opt ce loss", &loss, want_loss, 1, ATOL, RTOL);
  qt_test_close(use_ref ? "ref ce probs" : "opt ce probs", p, want_p, n, ATOL, RTOL);
  (use_ref ? qt_cross_entropy_backward_ref : qt_cross_entropy_backward)(d, p, labels, 1.0f, N, C);
  qt_test_close(use_ref ? "ref ce dlogits" : "opt ce dlogits", d, want_d, n, ATOL, RTOL);
  (use_ref ? qt_cross_entropy_backward_ref : qt_cross_entropy_backward)(d2, p, labels, 2.5f, N, C);
  qt_test_close(use_ref ? "ref ce dlogits (dloss 2.5)" : "opt ce dlogits (dloss 2.5)", d2, want_d2, n, ATOL, RTOL);
  free(logits), free(labels), free(want_loss), free(want_p), free(want_d), free(want_d2), free(p), free(d), free(d2);
}

int main(void) {
  for (int use_ref = 0; use_ref < 2; use_ref++) {
    test_batch_norm(use_ref);
    test_max_pool("mp2", 2, 2, 0, 1, use_ref);
    test_max_pool("mp3", 3, 2, 1, 1, use_ref);
    test_max_pool("mpt", 3, 2, 1, 0, use_ref);
    test_avg_pool(use_ref);
    test_relu(use_ref);
    test_relu6(use_ref);
    test_cross_entropy(use_ref);
  }
  return qt_test_finish();
}
