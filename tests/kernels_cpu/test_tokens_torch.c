/* The transformer's ops (autograd/ops_tokens.c) against PyTorch 1.13 (tests/ref/tokens.h5, written
 * by tests/ref/make_ref_tokens.py), each run as an op on a tape: the output, then every gradient
 * under loss = sum (y - t)^2 with t = y - dy / 2, whose gradient at the output is the reference's
 * upstream dy up to the rounding of t.
 *   - layer norm over the last dim of a (3, 5, 4, 24) image whose rows' means lie up to 8 from
 *     0 (eps 1e-6): y, dx, dgamma, dbeta;
 *   - multi-head attention, (2, 7, 7, 32) with 4 heads (49 tokens) and (3, 5, 16) with 1 head:
 *     y, dq, dk, dv;
 *   - the addition of a learned (7, 7, 8) tensor to a (3, 7, 7, 8) batch (qt_channel_add, a
 *     position embedding): y, dx, dp.
 * Each comparison is max |ours - torch| over max |torch|, at most 2e-6 (float sums in other
 * orders: oneDNN's sgemm against PyTorch's bmm, a double mean and variance against PyTorch's
 * float ones; the figures measured are printed). Then the mutations a test must see: a head
 * split wrongly (2 heads for 4) and layer norm's eps off by 1000x both fail the same checks. */
#include "autograd/autograd.h"
#include "tests/common/testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL 2e-6

static float *load(const char *name, int64_t *shape, int *ndim) {
  return qt_test_load_f32(qt_test_path("tests/ref/tokens.h5"), name, shape, ndim);
}
static float *load_named(const char *prefix, const char *what, int64_t *shape, int *ndim) {
  char name[64];
  snprintf(name, sizeof name, "%s_%s", prefix, what);
  return load(name, shape, ndim);
}

static double max_rel(const float *got, const float *want, int64_t n) {
  double worst = 0, top = 0;
  for (int64_t i = 0; i < n; i++) {
    const double d = fabs((double)got[i] - want[i]);
    worst = d > worst || d != d ? d : worst;
    top = fmax(top, fabs((double)want[i]));
  }
  return top > 0 ? worst / top : worst;
}

/* Compares got with the reference prefix_what; returns the relative error (failure counted above
 * TOL unless quiet, which only measures). */
static double compare(const char *prefix, const char *what, const float *got, int quiet) {
  int64_t shape[8];
  int ndim;
  float *want = load_named(prefix, what, shape, &ndim);
  const double r = got ? max_rel(got, want, qt_test_numel(shape, ndim)) : INFINITY;
  if (!quiet) {
    printf("%s %s: max |ours - torch| / max |torch| = %.2e\n", prefix, what, r);
    if (!(r <= TOL)) qt_test_fail("%s %s: %.3g relative > %g", prefix, what, r, TOL);
  }
  free(want);
  return r;
}

/* loss = sum (y - t)^2, t = y - dy / 2 (gradient dy at y); backward. */
static void backward_with(qt_ctx *ctx, qt_tensor *y, const float *dy) {
  const int64_t n = qt_tensor_numel(y);
  float *t = malloc((size_t)n * sizeof *t);
  for (int64_t i = 0; i < n; i++) t[i] = qt_f32(y)[i] - 0.5f * dy[i];
  qt_backward(ctx, qt_squared_error(ctx, y, t, 1.0));
  free(t);
}

static qt_tensor *leaf(qt_ctx *ctx, const char *prefix, const char *what, float **keep) {
  int64_t shape[8];
  int ndim;
  *keep = load_named(prefix, what, shape, &ndim);
  qt_tensor *t = qt_tensor_wrap(ctx, QT_F32, ndim, shape, *keep);
  t->requires_grad = 1;
  return t;
}

/* Layer norm with eps; returns the worst relative error over y and the gradients. */
static double check_layer_norm(float eps, int quiet) {
  qt_ctx *ctx = qt_ctx_create();
  qt_ctx_set_grad(ctx, 1);
  float *xd, *gd, *bd, *dy;
  qt_tensor *x = leaf(ctx, "ln", "x", &xd), *g = leaf(ctx, "ln", "gamma", &gd), *b = leaf(ctx, "ln", "beta", &bd);
  int64_t shape[8];
  int ndim;
  dy = load("ln_dy", shape, &ndim);
  qt_tensor *y = qt_layer_norm(ctx, x, g, b, eps);
  double worst = compare("ln", "y", qt_f32(y), quiet);
  backward_with(ctx, y, dy);
  worst = fmax(worst, compare("ln", "dx", x->grad, quiet));
  worst = fmax(worst, compare("ln", "dgamma", g->grad, quiet));
  worst = fmax(worst, compare("ln", "dbeta", b->grad, quiet));
  qt_ctx_free(ctx);
  free(xd), free(gd), free(bd), free(dy);
  return worst;
}

static double check_attention(const char *prefix, int heads, int quiet) {
  qt_ctx *ctx = qt_ctx_create();
  qt_ctx_set_grad(ctx, 1);
  float *qd, *kd, *vd, *dy;
  qt_tensor *q = leaf(ctx, prefix, "q", &qd), *k = leaf(ctx, prefix, "k", &kd), *v = leaf(ctx, prefix, "v", &vd);
  int64_t shape[8];
  int ndim;
  dy = load_named(prefix, "dy", shape, &ndim);
  qt_tensor *y = qt_attention(ctx, q, k, v, heads);
  double worst = compare(prefix, "y", qt_f32(y), quiet);
  backward_with(ctx, y, dy);
  worst = fmax(worst, compare(prefix, "dq", q->grad, quiet));
  worst = fmax(worst, compare(prefix, "dk", k->grad, quiet));
  worst = fmax(worst, compare(prefix, "dv", v->grad, quiet));
  qt_ctx_free(ctx);
  free(qd), free(kd), free(vd), free(dy);
  return worst;
}

static void check_add_param(void) {
  qt_ctx *ctx = qt_ctx_create();
  qt_ctx_set_grad(ctx, 1);
  float *xd, *pd, *dy;
  qt_tensor *x = leaf(ctx, "addp", "x", &xd), *p = leaf(ctx, "addp", "p", &pd);
  int64_t shape[8];
  int ndim;
  dy = load("addp_dy", shape, &ndim);
  qt_tensor *y = qt_channel_add(ctx, x, p);
  compare("addp", "y", qt_f32(y), 0);
  backward_with(ctx, y, dy);
  compare("addp", "dx", x->grad, 0);
  compare("addp", "dp", p->grad, 0);
  qt_ctx_free(ctx);
  free(xd), free(pd), free(dy);
}

int main(void) {
  check_layer_norm(1e-6f, 0);
  check_attention("attn4", 4, 0);
  check_attention("attn1", 1, 0);
  check_add_param();
  /* mutations: each must be far outside the tolerance */
  const double wrong_heads = check_attention("attn4", 2, 1), wrong_eps = check_layer_norm(1e-3f, 1);
  printf("mutations: 2 heads for 4 %.2e, eps 1e-3 for 1e-6 %.2e (each must exceed %g)\n", wrong_heads, wrong_eps,
         100 * TOL);
  QT_CHECK(wrong_heads > 100 * TOL && wrong_eps > 100 * TOL);
  return qt_test_finish();
}
