/* The ops joining activations: concatenation along channels (autograd.h qt_concat), and
 * element-wise multiplication of two activations (qt_mul), with the squeeze-excite
 * broadcast: b either has a's shape, or a is an image (N, H, W, C) and b holds one value per
 * sample and channel (N, C), applied at every pixel. Its kernels (kernels.h qt_mul_forward /
 * qt_mul_backward) view a as (N, P, C) and b as (N, C) with P = H * W under the broadcast, P = 1
 * otherwise (C then stands for all of a sample's values). The forward is one float product per
 * element, as PyTorch's; the broadcast's gradient of b sums a sample's P products in float in
 * pixel order (PyTorch's reduction orders its sum differently: a few units in the last place). */
#include "autograd/ops_int.h"

#include <string.h>

#define MUL_PARALLEL_MIN 16384

void qt_mul_forward(float *y, const float *a, const float *b, int64_t N, int64_t P, int64_t C) {
#pragma omp parallel for collapse(2) schedule(static) if (N * P * C >= MUL_PARALLEL_MIN)
  for (int64_t n = 0; n < N; n++)
    for (int64_t p = 0; p < P; p++) {
      const float *an = a + (n * P + p) * C, *bn = b + n * C;
      float *yn = y + (n * P + p) * C;
      for (int64_t c = 0; c < C; c++) yn[c] = an[c] * bn[c];
    }
}

void qt_mul_backward(float *da, float *db, const float *dy, const float *a, const float *b, int64_t N, int64_t P,
                     int64_t C) {
#pragma omp parallel for schedule(static) if (N * P * C >= MUL_PARALLEL_MIN)
  for (int64_t n = 0; n < N; n++) {
    const float *bn = b + n * C;
    float *dbn = db ? db + n * C : NULL;
    for (int64_t p = 0; p < P; p++) {
      const int64_t o = (n * P + p) * C;
      if (da)
        for (int64_t c = 0; c < C; c++) da[o + c] += dy[o + c] * bn[c];
      if (dbn && P == 1)
        for (int64_t c = 0; c < C; c++) dbn[c] += dy[o + c] * a[o + c];
    }
    if (dbn && P > 1)
      for (int64_t c = 0; c < C; c++) {
        float s = 0.0f;
        for (int64_t p = 0; p < P; p++) s += dy[(n * P + p) * C + c] * a[(n * P + p) * C + c];
        dbn[c] += s;
      }
  }
}

typedef struct {
  qt_tensor *a, *b, *y;
  int64_t N, P, C;
} mul_saved;

/* t's gradient buffer when t takes one, else NULL. */
static float *grad_of(qt_ctx *ctx, qt_tensor *t) { return t->requires_grad ? qt_tensor_grad(ctx, t) : NULL; }

static void mul_backward(qt_ctx *ctx, void *p) {
  const mul_saved *s = p;
  if (s->y->grad)
    qt_mul_backward(grad_of(ctx, s->a), grad_of(ctx, s->b), s->y->grad, qt_f32(s->a), qt_f32(s->b), s->N, s->P, s->C);
}

static qt_tensor *mul_op(qt_ctx *ctx, qt_tensor *a, qt_tensor *b) {
  check_f32(a, -1, "mul", "first input");
  check_f32(b, -1, "mul", "second input");
  int same = a->ndim == b->ndim;
  for (int i = 0; same && i < a->ndim; i++) same = a->shape[i] == b->shape[i];
  const int bcast = !same && a->ndim == 4 && b->ndim == 2 && b->shape[0] == a->shape[0] && b->shape[1] == a->shape[3];
  QT_ASSERT(same || bcast, "mul: shapes of rank %d and %d neither match nor broadcast (N, H, W, C) by (N, C)", a->ndim,
            b->ndim);
  const int64_t N = a->shape[0], numel = qt_tensor_numel(a);
  const int64_t C = bcast ? a->shape[3] : (N ? numel / N : 0), P = bcast ? a->shape[1] * a->shape[2] : 1;
  qt_tensor *y = qt_tensor_new(ctx, QT_F32, a->ndim, a->shape);
  qt_mul_forward(qt_f32(y), qt_f32(a), qt_f32(b), N, P, C);
  if (qt_tape_recording(ctx, a, b, NULL)) {
    y->requires_grad = 1;
    mul_saved *sv = qt_tape_push(ctx, QT_PROFILE_MUL, mul_backward, sizeof *sv, y);
    *sv = (mul_saved){a, b, y, N, P, C};
    a->saved = b->saved = 1;
  }
  return y;
}

qt_tensor *qt_mul(qt_ctx *ctx, qt_tensor *a, qt_tensor *b) { PROFILED(ctx, QT_PROFILE_MUL, mul_op(ctx, a, b)); }

/* ---- concat ---------------------------------------------------------------------------------- */
typedef struct {
  qt_tensor *xs[QT_CONCAT_MAX], *y;
  int n;
} concat_saved;

/* The rows (all dims but the last) of x's, and each input's share of a row of y. */
static void concat_backward(qt_ctx *ctx, void *p) {
  concat_saved *s = p;
  if (!s->y->grad) return;
  const int64_t Y = s->y->shape[s->y->ndim - 1], rows = qt_tensor_numel(s->y) / (Y ? Y : 1);
  int64_t off = 0;
  for (int k = 0; k < s->n; k++) {
    qt_tensor *x = s->xs[k];
    const int64_t C = x->shape[x->ndim - 1];
    if (x->requires_grad) {
      float *dx = qt_tensor_grad(ctx, x);
      const float *dy = s->y->grad;
#pragma omp parallel for schedule(static) if (rows * C >= MUL_PARALLEL_MIN)
      for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < C; c++) dx[r * C + c] += dy[r * Y + off + c];
    }
    off += C;
  }
}

static qt_tensor *concat_op(qt_ctx *ctx, qt_tensor *const *xs, int n) {
  QT_ASSERT(n >= 1 && n <= QT_CONCAT_MAX, "concat: %d inputs (1..%d)", n, QT_CONCAT_MAX);
  const qt_tensor *x0 = xs[0];
  int64_t shape[8], Y = 0;
  for (int k = 0; k < n; k++) {
    check_f32(xs[k], x0->ndim, "concat", "an input");
    for (int d = 0; d + 1 < x0->ndim; d++)
      QT_ASSERT(xs[k]->shape[d] == x0->shape[d], "concat: input %d differs in dimension %d (%lld vs %lld)", k, d,
                (long long)xs[k]->shape[d], (long long)x0->shape[d]);
    Y += xs[k]->shape[x0->ndim - 1];
  }
  memcpy(shape, x0->shape, (size_t)x0->ndim * sizeof *shape);
  shape[x0->ndim - 1] = Y;
  qt_tensor *y = qt_tensor_new(ctx, QT_F32, x0->ndim, shape);
  const int64_t rows = qt_tensor_numel(y) / (Y ? Y : 1);
  float *yd = qt_f32(y);
  int64_t off = 0;
  for (int k = 0; k < n; k++) {
    const int64_t C = xs[k]->shape[x0->ndim - 1];
    const float *xd = qt_f32(xs[k]);
#pragma omp parallel for schedule(static) if (rows * C >= MUL_PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++) memcpy(yd + r * Y + off, xd + r * C, (size_t)C * sizeof *yd);
    off += C;
  }
  int rec = 0;
  for (int k = 0; k < n; k++) rec |= qt_tape_recording(ctx, xs[k], NULL, NULL);
  if (rec) {
    y->requires_grad = 1;
    concat_saved *sv = qt_tape_push(ctx, QT_PROFILE_CONCAT, concat_backward, sizeof *sv, y);
    memset(sv, 0, sizeof *sv);
    for (int k = 0; k < n; k++) sv->xs[k] = xs[k];
    sv->y = y;
    sv->n = n;
  }
  return y;
}

qt_tensor *qt_concat(qt_ctx *ctx, qt_tensor *const *xs, int n) {
  PROFILED(ctx, QT_PROFILE_CONCAT, concat_op(ctx, xs, n));
}
