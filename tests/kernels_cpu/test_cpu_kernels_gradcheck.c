/* Finite-difference gradient checks of every differentiable CPU kernel: batch norm (training
 * statistics and eval), relu (inputs kept away from 0), max pool (distinct inputs spaced
 * wider than the step), avg pool, global avg pool, add and cross-entropy.
 *
 * Each check uses the scalar objective J = sum(w * y) with a fixed random upstream w, so the
 * backward kernel gets dout = w; it compares the analytic gradient with the central
 * difference (J(x+h) - J(x-h)) / 2h, J summed in double. With h = 1e-2 on O(1) float data the
 * float rounding of y contributes about 1e-5 / h = 1e-3 and the truncation O(h^2) about 1e-4,
 * hence the tolerance: |analytic - numeric| <= 2e-3 + 1e-2 * |numeric|. Piecewise-linear ops
 * (relu, max pool) and linear ones (pools, add) are exact up to rounding at these steps. */
#include "autograd/kernels.h"
#include "tests/common/testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STEP 1e-2f
#define ATOL 2e-3
#define RTOL 1e-2

static double dot(const float *w, const float *y, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += (double)w[i] * y[i];
  return s;
}

/* Forward closure: writes y (ny) from the current parameters. */
typedef void (*forward_fn)(void *ctx, float *y);

/* Perturbs each of the n entries of param, re-runs fwd and compares with grad. */
static void check_param(const char *what, forward_fn fwd, void *ctx, float *param, const float *grad, int64_t n,
                        const float *w, float *y, int64_t ny) {
  double worst = 0;
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) {
    const float keep = param[i];
    param[i] = keep + STEP;
    fwd(ctx, y);
    const double jp = dot(w, y, ny);
    param[i] = keep - STEP;
    fwd(ctx, y);
    const double jm = dot(w, y, ny);
    param[i] = keep;
    const double num = (jp - jm) / (2.0 * STEP), err = fabs(num - grad[i]);
    if (err > worst) worst = err;
    if (!(err <= ATOL + RTOL * fabs(num))) {
      if (bad < 5) fprintf(stderr, "%s: grad[%lld] analytic %.6g numeric %.6g\n", what, (long long)i, grad[i], num);
      bad++;
    }
  }
  if (bad) qt_test_fail("%s: %lld of %lld gradients off (max abs err %.3g)", what, (long long)bad, (long long)n, worst);
}

/* ---- batch norm --------------------------------------------------------------------------- */

typedef struct {
  float *x, *gamma, *beta, *rm, *rv, *mean, *invstd;
  int M, C, train;
} bn_ctx;

static void bn_forward(void *p, float *y) {
  bn_ctx *b = p;
  if (b->train)
    qt_batch_norm_forward_train(y, b->mean, b->invstd, b->x, b->gamma, b->beta, NULL, NULL, 0.1f, 1e-5f, b->M, b->C);
  else
    qt_batch_norm_forward_eval(y, b->x, b->gamma, b->beta, b->rm, b->rv, 1e-5f, b->M, b->C);
}

static void test_batch_norm(int train) {
  const int M = 12, C = 3;
  const int64_t n = (int64_t)M * C;
  bn_ctx b = {.x = qt_test_uniform_range(n, -2.0f, 2.0f, 1), .gamma = qt_test_uniform_range(C, 0.5f, 1.5f, 2), .beta = qt_test_uniform_range(C, -1, 1, 3),
              .rm = qt_test_uniform_range(C, -0.5f, 0.5f, 4), .rv = qt_test_uniform_range(C, 0.5f, 2.0f, 5), .mean = malloc(C * 4),
              .invstd = malloc(C * 4), .M = M, .C = C, .train = train};
  float *w = qt_test_uniform_range(n, -1.0f, 1.0f, 6), *y = malloc(n * 4);
  float *dx = calloc(n, 4), *dg = calloc(C, 4), *db = calloc(C, 4);
  bn_forward(&b, y);
  if (train) {
    qt_batch_norm_backward(dx, dg, db, w, b.x, b.mean, b.invstd, b.gamma, M, C);
  } else {
    for (int c = 0; c < C; c++) {
      b.mean[c] = b.rm[c];
      b.invstd[c] = 1.0f / sqrtf(b.rv[c] + 1e-5f);
    }
    qt_batch_norm_backward_eval(dx, dg, db, w, b.x, b.mean, b.invstd, b.gamma, M, C);
  }
  check_param(train ? "bn train dinp" : "bn eval dinp", bn_forward, &b, b.x, dx, n, w, y, n);
  check_param(train ? "bn train dgamma" : "bn eval dgamma", bn_forward, &b, b.gamma, dg, C, w, y, n);
  check_param(train ? "bn train dbeta" : "bn eval dbeta", bn_forward, &b, b.beta, db, C, w, y, n);
  free(b.x), free(b.gamma), free(b.beta), free(b.rm), free(b.rv), free(b.mean), free(b.invstd);
  free(w), free(y), free(dx), free(dg), free(db);
}

/* ---- relu, add ---------------------------------------------------------------------------- */

typedef struct {
  float *a, *b;
  int64_t n;
} ew_ctx;

static void relu_fwd(void *p, float *y) {
  ew_ctx *e = p;
  qt_relu_forward(y, e->a, e->n);
}
static void relu6_fwd(void *p, float *y) {
  ew_ctx *e = p;
  qt_relu6_forward(y, e->a, e->n);
}
static void add_fwd(void *p, float *y) {
  ew_ctx *e = p;
  qt_add_forward(y, e->a, e->b, e->n);
}

static void test_relu_add(void) {
  const int64_t n = 50;
  ew_ctx e = {.a = qt_test_uniform_range(n, 0.1f, 1.0f, 10), .b = qt_test_uniform_range(n, -1.0f, 1.0f, 11), .n = n};
  for (int64_t i = 0; i < n; i += 2) e.a[i] = -e.a[i]; /* |x| >= 0.1 > STEP */
  float *w = qt_test_uniform_range(n, -1.0f, 1.0f, 12), *y = malloc(n * 4), *da = calloc(n, 4), *db = calloc(n, 4);
  qt_relu_forward(y, e.a, n);
  qt_relu_backward(da, w, y, n);
  check_param("relu dinp", relu_fwd, &e, e.a, da, n, w, y, n);
  /* relu6: inputs in [-7, 7] kept at least 0.1 away from 0 and 6 */
  float *a6 = malloc(n * 4), *d6 = calloc(n, 4);
  for (int64_t i = 0; i < n; i++) a6[i] = e.a[i] * 7.0f + (i % 3 == 0 ? 5.0f : 0.0f);
  for (int64_t i = 0; i < n; i++)
    if (fabsf(a6[i] - 6.0f) < 0.1f || fabsf(a6[i]) < 0.1f) a6[i] += 0.25f;
  ew_ctx e6 = {.a = a6, .b = e.b, .n = n};
  qt_relu6_forward(y, a6, n);
  qt_relu6_backward(d6, w, y, n);
  check_param("relu6 dinp", relu6_fwd, &e6, a6, d6, n, w, y, n);
  free(a6), free(d6);
  memset(da, 0, n * 4);
  qt_add_backward(da, 0, db, 0, w, n);
  check_param("add da", add_fwd, &e, e.a, da, n, w, y, n);
  check_param("add db", add_fwd, &e, e.b, db, n, w, y, n);
  free(e.a), free(e.b), free(w), free(y), free(da), free(db);
}

/* ---- pooling ------------------------------------------------------------------------------ */

typedef struct {
  float *x;
  int32_t *argmax;
  qt_pool2d_shape s;
  int kind; /* 0 max, 1 avg, 2 global avg */
} pool_ctx;

static void pool_fwd(void *p, float *y) {
  pool_ctx *q = p;
  if (q->kind == 0) qt_max_pool2d_forward(y, q->argmax, q->x, &q->s);
  if (q->kind == 1) qt_avg_pool2d_forward(y, q->x, &q->s);
  if (q->kind == 2) qt_global_avg_pool_forward(y, q->x, q->s.N, q->s.H * q->s.W, q->s.C);
}

static void test_pool(int kind, int K, int S, int P) {
  char what[64];
  pool_ctx q = {.s = {.N = 2, .H = 7, .W = 6, .C = 3, .KH = K, .KW = K, .stride_h = S, .stride_w = S,
                      .pad_h = P, .pad_w = P},
                .kind = kind};
  if (qt_pool2d_shape_init(&q.s) != 0) {
    qt_test_fail("pool gradcheck: bad shape");
    return;
  }
  const int64_t nin = (int64_t)q.s.N * q.s.H * q.s.W * q.s.C;
  const int64_t nout = kind == 2 ? (int64_t)q.s.N * q.s.C : (int64_t)q.s.N * q.s.OH * q.s.OW * q.s.C;
  /* distinct values 0.05 apart (a permutation), so a step of 1e-2 never changes an argmax */
  q.x = malloc(nin * 4);
  for (int64_t i = 0; i < nin; i++) q.x[i] = 0.05f * (float)((i * 37) % nin) - 1.0f;
  q.argmax = malloc(nout * 4);
  float *w = qt_test_uniform_range(nout, -1.0f, 1.0f, 20 + kind), *y = malloc(nout * 4), *dx = calloc(nin, 4);
  pool_fwd(&q, y);
  if (kind == 0) qt_max_pool2d_backward(dx, w, q.argmax, &q.s);
  if (kind == 1) qt_avg_pool2d_backward(dx, w, &q.s);
  if (kind == 2) qt_global_avg_pool_backward(dx, 0, w, q.s.N, q.s.H * q.s.W, q.s.C);
  snprintf(what, sizeof what, "%s k%d s%d p%d dinp", kind == 0 ? "max_pool" : kind == 1 ? "avg_pool" : "global_avg",
           K, S, P);
  check_param(what, pool_fwd, &q, q.x, dx, nin, w, y, nout);
  free(q.x), free(q.argmax), free(w), free(y), free(dx);
}

/* ---- cross-entropy ------------------------------------------------------------------------ */

typedef struct {
  float *logits, *probs;
  int32_t *labels;
  int N, C;
} ce_ctx;

/* y = the loss itself (one value); w = dloss */
static void ce_fwd(void *p, float *y) {
  ce_ctx *c = p;
  y[0] = qt_cross_entropy_forward(c->probs, c->logits, c->labels, c->N, c->C);
}

static void test_cross_entropy(void) {
  ce_ctx c = {.N = 6, .C = 5};
  c.logits = qt_test_uniform_range(c.N * c.C, -3.0f, 3.0f, 30);
  c.probs = malloc(c.N * c.C * 4);
  c.labels = malloc(c.N * 4);
  for (int i = 0; i < c.N; i++) c.labels[i] = (i * 3) % c.C;
  float w = 1.7f, y, *dl = calloc(c.N * c.C, 4);
  ce_fwd(&c, &y);
  qt_cross_entropy_backward(dl, c.probs, c.labels, w, c.N, c.C);
  check_param("cross_entropy dlogits", ce_fwd, &c, c.logits, dl, c.N * c.C, &w, &y, 1);
  free(c.logits), free(c.probs), free(c.labels), free(dl);
}

int main(void) {
  test_batch_norm(1);
  test_batch_norm(0);
  test_relu_add();
  const int pools[][4] = {{0, 2, 2, 0}, {0, 3, 2, 1}, {1, 3, 1, 1}, {1, 3, 2, 1}, {2, 1, 1, 0}}; /* kind, K, S, P */
  for (int k = 0; k < 5; k++) test_pool(pools[k][0], pools[k][1], pools[k][2], pools[k][3]);
  test_cross_entropy();
  return qt_test_finish();
}
