/* Contracts and edge cases of the CPU kernels:
 * - qt_pool2d_shape_init follows PyTorch's output-size rule and refusals, case by case
 *   against torch (tests/ref/cpu_ops.h5: shape_cases/shape_out), plus invalid sizes;
 * - broken invariants abort (checked in a forked child): batch norm training with one value
 *   per channel (M = 1, which PyTorch refuses too: its unbiased variance would be 0/0),
 *   cross-entropy labels outside [0, C) in forward and backward;
 * - numerics: a constant channel gives out = beta and invstd = 1/sqrt(eps) (no NaN); M = 2;
 *   cross-entropy with logits of +-1e30 stays finite; relu passes NaN forward and passes the
 *   gradient where its output is NaN (PyTorch's threshold_backward);
 * - the add op's gradients on a tape (add_on_tape), where its backward hands the output's
 *   gradient buffer to an input or writes a fresh one: x + x, an input that already has a
 *   gradient, an input without one, and one that needs none, the same bits with frees on and off. */
#include "autograd/autograd.h"
#include "autograd/kernels.h"
#include "tests/common/testutil.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Runs fn in a child process with stderr silenced; passes when the child dies of SIGABRT. */
static void expect_abort(const char *what, void (*fn)(void)) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    qt_test_fail("%s: fork failed", what);
    return;
  }
  if (pid == 0) {
    if (!freopen("/dev/null", "w", stderr)) _exit(3);
    fn();
    _exit(0);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) {
    qt_test_fail("%s: waitpid failed", what);
    return;
  }
  if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT))
    qt_test_fail("%s: expected an abort, child %s %d", what, WIFSIGNALED(status) ? "died of signal" : "exited with",
                 WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
}

static void bn_train_m1(void) {
  float x[3] = {1, 2, 3}, y[3], mean[3], invstd[3];
  qt_batch_norm_forward_train(y, mean, invstd, x, NULL, NULL, NULL, NULL, 0.1f, 1e-5f, 1, 3);
}
static void bn_train_ref_m1(void) {
  float x[3] = {1, 2, 3}, y[3], mean[3], invstd[3];
  qt_batch_norm_forward_train_ref(y, mean, invstd, x, NULL, NULL, NULL, NULL, 0.1f, 1e-5f, 1, 3);
}
static const float ce_logits[6] = {1, 2, 3, 4, 5, 6};
static void ce_forward_label_high(void) {
  float p[6];
  int32_t labels[2] = {0, 3};
  qt_cross_entropy_forward(p, ce_logits, labels, 2, 3);
}
static void ce_forward_label_negative(void) {
  float p[6];
  int32_t labels[2] = {-1, 0};
  qt_cross_entropy_forward(p, ce_logits, labels, 2, 3);
}
static void ce_forward_ref_label_high(void) {
  float p[6];
  int32_t labels[2] = {0, 3};
  qt_cross_entropy_forward_ref(p, ce_logits, labels, 2, 3);
}
static void ce_backward_label_high(void) {
  float d[6] = {0};
  int32_t labels[2] = {0, 3};
  qt_cross_entropy_backward(d, ce_logits, labels, 1.0f, 2, 3);
}
static void ce_backward_ref_label_high(void) {
  float d[6] = {0};
  int32_t labels[2] = {0, 3};
  qt_cross_entropy_backward_ref(d, ce_logits, labels, 1.0f, 2, 3);
}

static void test_pool_shapes(void) {
  int64_t shape[8], shape2[8];
  int nd;
  const char *file = qt_test_path("tests/ref/cpu_ops.h5");
  int32_t *cases = qt_test_load_i32(file, "shape_cases", shape, &nd);
  int32_t *outs = qt_test_load_i32(file, "shape_out", shape2, &nd);
  QT_CHECK(shape[0] == shape2[0] && shape[1] == 8 && shape2[1] == 2);
  for (int64_t i = 0; i < shape[0]; i++) {
    const int32_t *k = cases + 8 * i;
    qt_pool2d_shape s = {.N = 2, .H = k[0], .W = k[1], .C = 3, .KH = k[2], .KW = k[3], .stride_h = k[4],
                         .stride_w = k[5], .pad_h = k[6], .pad_w = k[7]};
    const int rc = qt_pool2d_shape_init(&s);
    const int oh = rc == 0 ? s.OH : -1, ow = rc == 0 ? s.OW : -1;
    if (rc != 0 && rc != -1) qt_test_fail("pool shape case %lld: return code %d", (long long)i, rc);
    if (oh != outs[2 * i] || ow != outs[2 * i + 1])
      qt_test_fail("pool shape H%d W%d k%dx%d s%dx%d p%dx%d: got %dx%d, torch %dx%d", k[0], k[1], k[2], k[3], k[4],
                   k[5], k[6], k[7], oh, ow, outs[2 * i], outs[2 * i + 1]);
  }
  free(cases), free(outs);
  /* sizes torch rejects before the rule: empty input, zero kernel or stride, negative pad */
  const qt_pool2d_shape bad[] = {
      {.N = 0, .H = 4, .W = 4, .C = 1, .KH = 2, .KW = 2, .stride_h = 2, .stride_w = 2},
      {.N = 1, .H = 4, .W = 4, .C = 0, .KH = 2, .KW = 2, .stride_h = 2, .stride_w = 2},
      {.N = 1, .H = 4, .W = 4, .C = 1, .KH = 0, .KW = 2, .stride_h = 2, .stride_w = 2},
      {.N = 1, .H = 4, .W = 4, .C = 1, .KH = 2, .KW = 2, .stride_h = 0, .stride_w = 2},
      {.N = 1, .H = 4, .W = 4, .C = 1, .KH = 3, .KW = 3, .stride_h = 1, .stride_w = 1, .pad_h = -1},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    qt_pool2d_shape s = bad[i];
    if (qt_pool2d_shape_init(&s) != -1) qt_test_fail("pool shape: invalid case %zu accepted", i);
  }
}

static void test_batch_norm_edges(void) {
  /* channel 0 constant, channel 1 two distinct values, M = 2 */
  float x[4] = {5.0f, -1.0f, 5.0f, 3.0f}, y[4], mean[2], invstd[2], gamma[2] = {2.0f, 0.5f}, beta[2] = {0.25f, 1.0f};
  float rm[2] = {0, 0}, rv[2] = {1, 1};
  qt_batch_norm_forward_train(y, mean, invstd, x, gamma, beta, rm, rv, 0.1f, 1e-5f, 2, 2);
  QT_CHECK(y[0] == 0.25f && y[2] == 0.25f);
  QT_CHECK(fabsf(invstd[0] - 1.0f / sqrtf(1e-5f)) <= 1e-3f);
  QT_CHECK(mean[0] == 5.0f && mean[1] == 1.0f);
  /* channel 1: var_biased = 4, unbiased = 8 */
  QT_CHECK(fabsf(invstd[1] - 1.0f / sqrtf(4.0f + 1e-5f)) <= 1e-6f);
  QT_CHECK(fabsf(y[1] - 0.5f) <= 1e-5f && fabsf(y[3] - 1.5f) <= 1e-5f);
  QT_CHECK(fabsf(rm[0] - 0.5f) <= 1e-6f && fabsf(rm[1] - 0.1f) <= 1e-6f);
  QT_CHECK(fabsf(rv[0] - 0.9f) <= 1e-6f && fabsf(rv[1] - (0.9f + 0.8f)) <= 1e-5f);
  /* the gradient through a constant channel is finite */
  float dy[4] = {1, 2, 3, 4}, dx[4] = {0}, dg[2] = {0}, db[2] = {0};
  qt_batch_norm_backward(dx, dg, db, dy, x, mean, invstd, gamma, 2, 2);
  for (int i = 0; i < 4; i++) QT_CHECK(isfinite(dx[i]));
  QT_CHECK(db[0] == 4.0f && db[1] == 6.0f && dg[0] == 0.0f);
}

static void test_cross_entropy_extremes(void) {
  const float logits[6] = {1e30f, 0.0f, -1e30f, -1e30f, -1e30f, 1e30f};
  const int32_t labels[2] = {0, 2};
  float p[6], d[6] = {0};
  float loss = qt_cross_entropy_forward(p, logits, labels, 2, 3);
  QT_CHECK(loss == 0.0f);
  QT_CHECK(p[0] == 1.0f && p[1] == 0.0f && p[5] == 1.0f);
  qt_cross_entropy_backward(d, p, labels, 1.0f, 2, 3);
  for (int i = 0; i < 6; i++) QT_CHECK(isfinite(d[i]));
  const float l2[3] = {1000.0f, 0.0f, -1000.0f};
  const int32_t lab2 = 1;
  QT_CHECK(fabsf(qt_cross_entropy_forward(p, l2, &lab2, 1, 3) - 1000.0f) <= 1e-3f);
}

static void test_relu_nan(void) {
  float x[4] = {NAN, -1.0f, 2.0f, 0.0f}, y[4], dy[4] = {1, 1, 1, 1}, dx[4] = {0};
  qt_relu_forward(y, x, 4);
  QT_CHECK(isnan(y[0]) && y[1] == 0.0f && y[2] == 2.0f && y[3] == 0.0f);
  qt_relu_backward(dx, dy, y, 4);
  QT_CHECK(dx[0] == 1.0f && dx[1] == 0.0f && dx[2] == 1.0f && dx[3] == 0.0f);
  float dinf[4] = {INFINITY, INFINITY, 1, INFINITY}, dx2[4] = {0};
  qt_relu_backward(dx2, dinf, y, 4);
  QT_CHECK(dx2[1] == 0.0f && dx2[3] == 0.0f); /* no inf * 0 = NaN leak */
}

static void test_relu6_edges(void) {
  float x[6] = {NAN, -1.0f, 2.0f, 0.0f, 6.0f, 7.0f}, y[6], dy[6] = {1, 1, 1, 1, 1, 1}, dx[6] = {0};
  qt_relu6_forward(y, x, 6);
  QT_CHECK(isnan(y[0]) && y[1] == 0.0f && y[2] == 2.0f && y[3] == 0.0f && y[4] == 6.0f && y[5] == 6.0f);
  qt_relu6_backward(dx, dy, y, 6); /* hardtanh_backward: zero at and beyond both bounds, NaN passes */
  QT_CHECK(dx[0] == 1.0f && dx[1] == 0.0f && dx[2] == 1.0f && dx[3] == 0.0f && dx[4] == 0.0f && dx[5] == 0.0f);
  float dinf[6] = {1, INFINITY, 1, INFINITY, INFINITY, INFINITY}, dx2[6] = {0};
  qt_relu6_backward(dx2, dinf, y, 6);
  QT_CHECK(dx2[1] == 0.0f && dx2[3] == 0.0f && dx2[4] == 0.0f && dx2[5] == 0.0f);
}

/* u = (x + w) + x, v = u + u, loss = sum (v - t)^2; with g = dloss/dv: dw = 2g, dx = 4g (sums
 * of equal terms, exact in float); and y = x + c with c needing no gradient: dx = dy. Returns
 * x's gradient of the first (the caller frees it). */
static float *add_grads(int frees) {
  enum { N = 4096 };
  qt_ctx *ctx = qt_ctx_create();
  qt_ctx_set_grad(ctx, 1);
  qt_ctx_set_backward_frees(ctx, frees);
  float *xd = qt_test_uniform_range(N, -1.0f, 1.0f, 11), *wd = qt_test_uniform_range(N, -1.0f, 1.0f, 12);
  float *t = qt_test_uniform_range(N, -1.0f, 1.0f, 13), *g = qt_test_zeros(N), *out = qt_test_zeros(N);
  const int64_t shape[2] = {N / 16, 16};
  qt_tensor *x = qt_tensor_wrap(ctx, QT_F32, 2, shape, xd), *w = qt_tensor_wrap(ctx, QT_F32, 2, shape, wd);
  x->requires_grad = w->requires_grad = 1;
  qt_tensor *u = qt_add(ctx, qt_add(ctx, x, w), x);
  qt_tensor *v = qt_add(ctx, u, u);
  for (int i = 0; i < N; i++) g[i] = 2.0f * (qt_f32(v)[i] - t[i]);
  qt_backward(ctx, qt_squared_error(ctx, v, t, 1.0));
  QT_CHECK(x->grad && w->grad && x->grad != w->grad);
  if (x->grad && w->grad) {
    int exact = 1;
    for (int i = 0; i < N; i++) exact &= x->grad[i] == 2.0f * w->grad[i];
    if (!exact) qt_test_fail("add on tape (frees %d): dx != 2 dw", frees);
    for (int i = 0; i < N; i++) g[i] *= 2.0f;
    qt_test_close(frees ? "add on tape dw (frees)" : "add on tape dw", w->grad, g, N, 1e-6f, 1e-6f);
    memcpy(out, x->grad, N * sizeof *out);
  }
  qt_ctx_free(ctx);
  ctx = qt_ctx_create();
  qt_ctx_set_grad(ctx, 1);
  qt_ctx_set_backward_frees(ctx, frees);
  x = qt_tensor_wrap(ctx, QT_F32, 2, shape, xd);
  x->requires_grad = 1;
  qt_tensor *c = qt_tensor_wrap(ctx, QT_F32, 2, shape, wd);
  qt_tensor *y = qt_add(ctx, x, c);
  for (int i = 0; i < N; i++) g[i] = 2.0f * (qt_f32(y)[i] - t[i]);
  qt_backward(ctx, qt_squared_error(ctx, y, t, 1.0));
  QT_CHECK(x->grad && !c->grad);
  if (x->grad) qt_test_close(frees ? "add on tape, c without gradient (frees)" : "add on tape, c without gradient",
                             x->grad, g, N, 1e-6f, 1e-6f);
  qt_ctx_free(ctx);
  free(xd), free(wd), free(t), free(g);
  return out;
}

static void add_on_tape(void) {
  float *kept = add_grads(0), *freed = add_grads(1);
  qt_test_close("add on tape: dx with frees on and off", freed, kept, 4096, 0, 0);
  free(kept), free(freed);
}

int main(void) {
  /* forked children first, before this process starts OpenMP threads */
  expect_abort("batch_norm_forward_train M=1", bn_train_m1);
  expect_abort("batch_norm_forward_train_ref M=1", bn_train_ref_m1);
  expect_abort("cross_entropy_forward label >= C", ce_forward_label_high);
  expect_abort("cross_entropy_forward label < 0", ce_forward_label_negative);
  expect_abort("cross_entropy_forward_ref label >= C", ce_forward_ref_label_high);
  expect_abort("cross_entropy_backward label >= C", ce_backward_label_high);
  expect_abort("cross_entropy_backward_ref label >= C", ce_backward_ref_label_high);
  test_pool_shapes();
  test_batch_norm_edges();
  test_cross_entropy_extremes();
  test_relu_nan();
  test_relu6_edges();
  add_on_tape();
  return qt_test_finish();
}
