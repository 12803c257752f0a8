/* The element-wise activations (autograd/ops_act.c) against PyTorch 1.13 (tests/ref/act.h5,
 * written by tests/ref/make_ref_act.py): outputs and input gradients of sigmoid, tanh, SiLU, hard
 * sigmoid (PyTorch's and ONNX's form), hard swish, GELU (erf and tanh), leaky ReLU (0.01, 0.2),
 * ELU (1, 0.5) and the arithmetic with a constant (affine: x * c, x + c, x - c, c - x; div: x / c)
 * on 2048 inputs, the piecewise functions' corners -3, 0 and 3 among them; mul (check_mul) and
 * PReLU with one slope and a slope per channel (check_prelu: forward and dx bit for bit, the
 * slopes' gradient within 1e-6 of its largest), and upsampling by 2 (check_resize: nearest bit for
 * bit, bilinear within 1e-6).
 *
 * Tolerances: the piecewise-linear ones (hard sigmoid, hard swish, leaky ReLU) must be exact (0);
 * the others agree within 4e-7 absolute plus 4e-6 relative (libm's expf, tanhf and erff against
 * PyTorch's vectorized approximations; measured at most 4.8e-7 where GELU is near 8, 2.5e-7
 * elsewhere), GELU's tanh form within 2e-6 absolute: below x = -5 its gradient is about 1e-6,
 * where PyTorch's tanh has saturated to -1 and gives 0 (measured 1.6e-6). Then the op (qt_activation) on a tape: its
 * output is the kernel's, bit for bit, and its input gradient under a squared-error loss the
 * kernel's backward of that loss's gradient; names parse back.
 *
 * The product of two activations (autograd/ops_binary.c, qt_mul), a (3, 5, 4, 6) times b of its
 * shape and times b (3, 6) broadcast over H and W (squeeze-excite): the output and a's gradient
 * exact (one float product each), b's within 1e-6 relative to its largest value (the broadcast's
 * sum over 20 pixels in another order; measured 1.1e-7); then the op on a tape against the
 * kernels. */
#include "autograd/autograd.h"
#include "autograd/kernels.h"
#include "tests/common/testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float *load_n(const char *name, int64_t *n) {
  int64_t shape[8];
  int ndim;
  float *p = qt_test_load_f32(qt_test_path("tests/ref/act.h5"), name, shape, &ndim);
  *n = qt_test_numel(shape, ndim);
  return p;
}

/* Dataset "<ref>_<part>" (a case's output, gradient or operand). */
static float *load_part(const char *ref, const char *part, int64_t *n) {
  char name[96];
  snprintf(name, sizeof name, "%s_%s", ref, part);
  return load_n(name, n);
}

typedef struct {
  const char *ref; /* the datasets' prefix */
  qt_act act;
  float atol, rtol; /* forward and backward */
} act_case;

static void check_case(const act_case *c, const float *x, const float *dy, int64_t n) {
  int64_t m;
  char what[128];
  float *want_y = load_part(c->ref, "y", &m);
  QT_CHECK(m == n);
  float *want_dx = load_part(c->ref, "dx", &m);
  QT_CHECK(m == n);
  float *y = qt_test_zeros(n), *dx = qt_test_zeros(n);
  qt_act_forward(y, x, n, &c->act);
  snprintf(what, sizeof what, "%s forward", c->ref);
  qt_test_close(what, y, want_y, n, c->atol, c->rtol);
  qt_act_backward(dx, dy, x, y, n, &c->act);
  snprintf(what, sizeof what, "%s backward", c->ref);
  qt_test_close(what, dx, want_dx, n, c->atol, c->rtol);
  free(want_y), free(want_dx), free(y), free(dx);
}

/* The backward of loss = sum (y - t)^2 with t = y - dy / 2 from the op's output y (n values) on
 * ctx's tape: the loss's gradient at y is dy up to rounding; returns it, 2 (y - t), for the
 * kernels' backward to be compared with the op's (the caller frees it). */
static float *backward_of_dy(qt_ctx *ctx, qt_tensor *y, const float *dy, int64_t n) {
  float *t = qt_test_zeros(n), *g = qt_test_zeros(n);
  for (int64_t i = 0; i < n; i++) t[i] = qt_f32(y)[i] - 0.5f * dy[i];
  for (int64_t i = 0; i < n; i++) g[i] = 2.0f * (qt_f32(y)[i] - t[i]);
  qt_backward(ctx, qt_squared_error(ctx, y, t, 1.0));
  free(t);
  return g;
}

/* The op on a tape (backward_of_dy): its output against the kernel's, bit for bit; x's gradient
 * against the kernel's backward of the loss's own gradient. */
static void check_op(const act_case *c, const float *x, const float *dy, int64_t n) {
  qt_ctx *ctx = qt_ctx_create();
  qt_ctx_set_grad(ctx, 1);
  const int64_t shape[2] = {n / 16, 16};
  qt_tensor *xt = qt_tensor_wrap(ctx, QT_F32, 2, shape, (void *)x);
  xt->requires_grad = 1;
  qt_tensor *y = qt_activation(ctx, xt, c->act);
  float *ky = qt_test_zeros(n), *kdx = qt_test_zeros(n);
  qt_act_forward(ky, x, n, &c->act);
  char what[128];
  snprintf(what, sizeof what, "%s op forward", c->ref);
  qt_test_close(what, qt_f32(y), ky, n, 0, 0);
  float *g = backward_of_dy(ctx, y, dy, n);
  qt_act_backward(kdx, g, x, ky, n, &c->act);
  snprintf(what, sizeof what, "%s op backward", c->ref);
  QT_CHECK(xt->grad != NULL);
  if (xt->grad) qt_test_close(what, xt->grad, kdx, n, 1e-6f, 1e-5f);
  free(ky), free(g), free(kdx);
  qt_ctx_free(ctx);
}

/* qt_mul against PyTorch (case "mul_same" or "mul_channel"), then on a tape against its kernels. */
static void check_mul(const char *ref) {
  int64_t na, nb, ny, n;
  float *a = load_n("mul_a", &na), *dy = load_n("mul_dy", &n);
  float *b = load_part(ref, "b", &nb);
  float *want_y = load_part(ref, "y", &ny);
  float *want_da = load_part(ref, "da", &n);
  float *want_db = load_part(ref, "db", &n);
  const int64_t N = 3, C = 6, P = nb == na ? 1 : na / N / C, K = nb == na ? na / N : C;
  float *y = qt_test_zeros(na), *da = qt_test_zeros(na), *db = qt_test_zeros(nb);
  qt_mul_forward(y, a, b, N, P, K);
  qt_mul_backward(da, db, dy, a, b, N, P, K);
  char what[128];
  snprintf(what, sizeof what, "%s forward", ref);
  qt_test_close(what, y, want_y, na, 0, 0);
  snprintf(what, sizeof what, "%s da", ref);
  qt_test_close(what, da, want_da, na, 0, 0);
  double worst = 0, top = 0;
  for (int64_t i = 0; i < nb; i++) {
    worst = fmax(worst, fabs((double)db[i] - want_db[i]));
    top = fmax(top, fabs((double)want_db[i]));
  }
  printf("%s: db max |ours - torch| / max |torch| = %.2e\n", ref, worst / top);
  if (!(worst <= 1e-6 * top)) qt_test_fail("%s db: %.3g relative > 1e-6", ref, worst / top);

  /* the op: loss = sum (y - t)^2, t = y - dy / 2; gradients = the kernels' of g = 2 (y - t) */
  qt_ctx *ctx = qt_ctx_create();
  qt_ctx_set_grad(ctx, 1);
  const int64_t sa[4] = {3, 5, 4, 6}, sb[2] = {3, 6};
  qt_tensor *at = qt_tensor_wrap(ctx, QT_F32, 4, sa, a),
            *bt = qt_tensor_wrap(ctx, QT_F32, nb == na ? 4 : 2, nb == na ? sa : sb, b);
  at->requires_grad = bt->requires_grad = 1;
  qt_tensor *yt = qt_mul(ctx, at, bt);
  snprintf(what, sizeof what, "%s op forward", ref);
  qt_test_close(what, qt_f32(yt), y, na, 0, 0);
  float *g = backward_of_dy(ctx, yt, dy, na);
  memset(da, 0, (size_t)na * sizeof *da);
  memset(db, 0, (size_t)nb * sizeof *db);
  qt_mul_backward(da, db, g, a, b, N, P, K);
  QT_CHECK(at->grad && bt->grad);
  snprintf(what, sizeof what, "%s op da", ref);
  if (at->grad) qt_test_close(what, at->grad, da, na, 0, 0);
  snprintf(what, sizeof what, "%s op db", ref);
  if (bt->grad) qt_test_close(what, bt->grad, db, nb, 0, 0);
  qt_ctx_free(ctx);
  free(a), free(b), free(dy), free(y), free(da), free(db), free(want_y), free(want_da), free(want_db), free(g);
}

/* PReLU's gradients for upstream g: dx = x > 0 ? g : w g, dw = sum of x g where x <= 0 (double). */
static void prelu_grads(const float *x, const float *w, const float *g, int64_t n, int64_t K, int64_t C, float *dx,
                        float *dw) {
  double acc[8] = {0};
  QT_ASSERT(K <= 8, "prelu test: %lld slopes", (long long)K);
  for (int64_t i = 0; i < n; i++) {
    const int64_t k = K == 1 ? 0 : i % C;
    dx[i] = x[i] > 0.0f ? g[i] : w[k] * g[i];
    if (!(x[i] > 0.0f)) acc[k] += (double)x[i] * (double)g[i];
  }
  for (int64_t k = 0; k < K; k++) dw[k] = (float)acc[k];
}

/* qt_prelu against PyTorch's F.prelu (case "prelu_one" or "prelu_channel"): the forward and dx
 * bit for bit, dw (a sum) within 1e-6 of its largest; then the op's gradients on a tape against
 * the same formulas for its upstream gradient, bit for bit. */
static void check_prelu(const char *ref) {
  char what[128];
  int64_t n, m, K;
  float *x = load_n("mul_a", &n), *dy = load_n("mul_dy", &m);
  float *w = load_part(ref, "w", &K);
  float *want_y = load_part(ref, "y", &m);
  float *want_dx = load_part(ref, "dx", &m);
  float *want_dw = load_part(ref, "dw", &m);
  const int64_t C = 6, shape[4] = {3, 5, 4, 6};
  float *dx = qt_test_zeros(n), dw[8];
  prelu_grads(x, w, dy, n, K, C, dx, dw);
  snprintf(what, sizeof what, "%s dx (formula)", ref);
  qt_test_close(what, dx, want_dx, n, 0, 0);
  snprintf(what, sizeof what, "%s dw (formula)", ref);
  qt_test_close(what, dw, want_dw, K, 1e-6f, 1e-6f);
  qt_ctx *ctx = qt_ctx_create();
  qt_ctx_set_grad(ctx, 1);
  const int64_t ws[1] = {K};
  qt_tensor *xt = qt_tensor_wrap(ctx, QT_F32, 4, shape, x), *wt = qt_tensor_wrap(ctx, QT_F32, 1, ws, w);
  xt->requires_grad = wt->requires_grad = 1;
  qt_tensor *yt = qt_prelu(ctx, xt, wt);
  snprintf(what, sizeof what, "%s forward", ref);
  qt_test_close(what, qt_f32(yt), want_y, n, 0, 0);
  float *g = backward_of_dy(ctx, yt, dy, n);
  prelu_grads(x, w, g, n, K, C, dx, dw);
  QT_CHECK(xt->grad && wt->grad);
  snprintf(what, sizeof what, "%s op dx", ref);
  if (xt->grad) qt_test_close(what, xt->grad, dx, n, 0, 0);
  snprintf(what, sizeof what, "%s op dw", ref);
  if (wt->grad) qt_test_close(what, wt->grad, dw, K, 0, 0);
  qt_ctx_free(ctx);
  free(x), free(dy), free(w), free(want_y), free(want_dx), free(want_dw), free(dx), free(g);
}

/* qt_resize2x against F.interpolate(scale_factor=2) of mul_a: nearest bit for bit; bilinear's
 * forward and input gradient within 1e-6 of the largest (float sums of 0.25 / 0.75 weights in
 * PyTorch's order); then the op on a tape against the kernels. */
static void check_resize(int bilinear) {
  char ref[32], what[128];
  const char *mode = bilinear ? "bilinear" : "nearest";
  snprintf(ref, sizeof ref, "resize_%s", mode);
  int64_t n, m, k;
  float *x = load_n("mul_a", &n), *dy = load_n("resize_dy", &m);
  float *want_y = load_part(ref, "y", &k), *want_dx = load_part(ref, "dx", &k);
  QT_CHECK(m == 4 * n);
  float *y = qt_test_zeros(m), *dx = qt_test_zeros(n);
  qt_resize2x_forward(y, x, 3, 5, 4, 6, bilinear);
  qt_resize2x_backward(dx, dy, 3, 5, 4, 6, bilinear);
  const float tol = bilinear ? 1e-6f : 0.0f;
  snprintf(what, sizeof what, "resize %s forward", mode);
  qt_test_close(what, y, want_y, m, tol, tol);
  snprintf(what, sizeof what, "resize %s dx", mode);
  qt_test_close(what, dx, want_dx, n, tol, tol);
  qt_ctx *ctx = qt_ctx_create();
  qt_ctx_set_grad(ctx, 1);
  const int64_t shape[4] = {3, 5, 4, 6};
  qt_tensor *xt = qt_tensor_wrap(ctx, QT_F32, 4, shape, x);
  xt->requires_grad = 1;
  qt_tensor *yt = qt_resize2x(ctx, xt, bilinear);
  snprintf(what, sizeof what, "resize %s op forward", mode);
  qt_test_close(what, qt_f32(yt), y, m, 0, 0);
  float *g = backward_of_dy(ctx, yt, dy, m);
  memset(dx, 0, (size_t)n * sizeof *dx);
  qt_resize2x_backward(dx, g, 3, 5, 4, 6, bilinear);
  QT_CHECK(xt->grad != NULL);
  snprintf(what, sizeof what, "resize %s op dx", mode);
  if (xt->grad) qt_test_close(what, xt->grad, dx, n, 0, 0);
  qt_ctx_free(ctx);
  free(x), free(dy), free(want_y), free(want_dx), free(y), free(dx), free(g);
}

int main(void) {
  int64_t n, m;
  float *x = load_n("x", &n), *dy = load_n("dy", &m);
  QT_CHECK(n == m && n % 16 == 0);
  const float A = 4e-7f, R = 4e-6f;
  const act_case cases[] = {
      {"sigmoid", qt_act_default(QT_ACT_SIGMOID), A, R},
      {"tanh", qt_act_default(QT_ACT_TANH), A, R},
      {"silu", qt_act_default(QT_ACT_SILU), A, R},
      {"hardsigmoid", qt_act_default(QT_ACT_HARDSIGMOID), 0, 0},
      {"hardswish", qt_act_default(QT_ACT_HARDSWISH), 0, 0},
      {"gelu", qt_act_default(QT_ACT_GELU), A, R},
      {"gelu_tanh", qt_act_default(QT_ACT_GELU_TANH), 2e-6f, R},
      {"leaky_relu_0.01", qt_act_default(QT_ACT_LEAKY_RELU), 0, 0},
      {"leaky_relu_0.2", {QT_ACT_LEAKY_RELU, 0.2f, 0.0f}, 0, 0},
      {"elu_1", qt_act_default(QT_ACT_ELU), A, R},
      {"elu_0.5", {QT_ACT_ELU, 0.5f, 0.0f}, A, R},
      {"hardsigmoid_onnx", {QT_ACT_HARDSIGMOID, 0.2f, 0.5f}, 0, 0},
      /* arithmetic with a constant: one rounding each, as PyTorch's: bit for bit */
      {"mul_0.3", {QT_ACT_AFFINE, 0.3f, 0.0f}, 0, 0},
      {"add_0.75", {QT_ACT_AFFINE, 1.0f, 0.75f}, 0, 0},
      {"sub_0.3", {QT_ACT_AFFINE, 1.0f, -0.3f}, 0, 0},
      {"rsub_0.3", {QT_ACT_AFFINE, -1.0f, 0.3f}, 0, 0},
      {"div_3", {QT_ACT_DIV, 3.0f, 0.0f}, 0, 0},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    check_case(&cases[k], x, dy, n);
    check_op(&cases[k], x, dy, n);
  }
  QT_CHECK_NAMES(qt_act_kind, QT_ACT_COUNT, qt_act_name, qt_act_parse);
  check_mul("mul_same");
  check_mul("mul_channel");
  check_prelu("prelu_one");
  check_prelu("prelu_channel");
  check_resize(0);
  check_resize(1);
  free(x), free(dy);
  return qt_test_finish();
}
