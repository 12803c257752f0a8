/* AdaRound's ops (autograd.h): the soft-quantized weight, the rounding regularizer, the
 * squared-error reconstruction loss they are trained against, and QDrop's random mix of float and
 * fake-quantized activations. Elementwise, parallel with OpenMP;
 * the loss sums in double (their order follows the thread count; the gradients do not depend on it). */
#include "autograd/ops_int.h"

#include <math.h>

/* h(v) and dh/dv from one sigmoid. */
static inline float h_and_slope(float v, float *dh) {
  const float sig = 1.0f / (1.0f + expf(-v));
  const float h = sig * (QT_ADAROUND_ZETA - QT_ADAROUND_GAMMA) + QT_ADAROUND_GAMMA;
  if (h < 0.0f || h > 1.0f) {
    *dh = 0.0f;
    return h < 0.0f ? 0.0f : 1.0f;
  }
  *dh = sig * (1.0f - sig) * (QT_ADAROUND_ZETA - QT_ADAROUND_GAMMA);
  return h;
}

float qt_adaround_h(float v) {
  float dh;
  return h_and_slope(v, &dh);
}

float qt_adaround_dh(float v) {
  float dh;
  h_and_slope(v, &dh);
  return dh;
}

float qt_adaround_v_init(float r) {
  /* sigmoid(v) = (r - gamma) / (zeta - gamma), so v = -log((zeta - gamma) / (r - gamma) - 1);
   * r in [0, 1) keeps the argument of the log in (0.1 / 1.1, 11]: finite. */
  if (!(r >= 0.0f)) r = 0.0f;
  if (r >= 1.0f) r = nextafterf(1.0f, 0.0f);
  return -logf((QT_ADAROUND_ZETA - QT_ADAROUND_GAMMA) / (r - QT_ADAROUND_GAMMA) - 1.0f);
}

/* ---- the soft-quantized weight -------------------------------------------------------------- */
typedef struct {
  qt_tensor *v, *y;
  float *slope; /* dw~/dv per element: s * dh/dv where the clamp passes, else 0 */
} adaround_weight_saved;

static void adaround_weight_backward(qt_ctx *ctx, void *p) {
  adaround_weight_saved *s = p;
  if (!s->y->grad || !s->v->requires_grad) return;
  float *dv = qt_tensor_grad(ctx, s->v);
  const float *dy = s->y->grad, *slope = s->slope;
  const int64_t n = qt_tensor_numel(s->v);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) dv[i] += dy[i] * slope[i];
}

static qt_tensor *adaround_weight_op(qt_ctx *ctx, qt_tensor *v, const float *w_floor, int64_t outer, int channels,
                                     int64_t inner, const float *scale, const int32_t *zp, int qmin, int qmax) {
  check_f32(v, -1, "adaround_weight", "v");
  QT_ASSERT(outer * channels * inner == qt_tensor_numel(v), "adaround_weight: view %lld x %d x %lld of %lld elements",
            (long long)outer, channels, (long long)inner, (long long)qt_tensor_numel(v));
  QT_ASSERT(qmin < qmax, "adaround_weight: range [%d, %d]", qmin, qmax);
  qt_tensor *y = qt_tensor_new(ctx, QT_F32, v->ndim, v->shape);
  const int recording = qt_tape_recording(ctx, v, NULL, NULL);
  float *slope = recording ? qt_arena_alloc(ctx, (size_t)qt_tensor_numel(v) * sizeof(float)) : NULL;
  const float *vd = qt_f32(v);
  float *yd = qt_f32(y);
  const int64_t rows = outer * channels;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    const int c = (int)(r % channels);
    for (int64_t i = r * inner; i < (r + 1) * inner; i++) {
      float dh;
      float q = w_floor[i] + h_and_slope(vd[i], &dh) + (float)zp[c];
      /* torch.clamp's gradient: passed at the bounds too */
      if (slope) slope[i] = q >= (float)qmin && q <= (float)qmax ? scale[c] * dh : 0.0f;
      q = q < (float)qmin ? (float)qmin : q > (float)qmax ? (float)qmax : q;
      yd[i] = (q - (float)zp[c]) * scale[c];
    }
  }
  if (recording) {
    y->requires_grad = 1;
    adaround_weight_saved *sv = qt_tape_push(ctx, QT_PROFILE_ADAROUND_WEIGHT, adaround_weight_backward, sizeof *sv, y);
    *sv = (adaround_weight_saved){v, y, slope};
  }
  return y;
}

qt_tensor *qt_adaround_weight(qt_ctx *ctx, qt_tensor *v, const float *w_floor, int64_t outer, int channels,
                              int64_t inner, const float *scale, const int32_t *zero_point, int qmin, int qmax) {
  PROFILED(ctx, QT_PROFILE_ADAROUND_WEIGHT,
           adaround_weight_op(ctx, v, w_floor, outer, channels, inner, scale, zero_point, qmin, qmax));
}

/* ---- the two losses: their gradient per element is computed with the loss ------------------ */
typedef struct {
  qt_tensor *x, *loss;
  float *d; /* d(loss)/dx per element */
} loss_saved;

static void loss_backward(qt_ctx *ctx, void *p) {
  loss_saved *s = p;
  if (!s->loss->grad || !s->x->requires_grad) return;
  float *dx = qt_tensor_grad(ctx, s->x);
  const float g = s->loss->grad[0], *d = s->d;
  const int64_t n = qt_tensor_numel(s->x);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) dx[i] += g * d[i];
}

/* ---- the rounding regularizer --------------------------------------------------------------- */
static qt_tensor *round_loss_op(qt_ctx *ctx, qt_tensor *v, float beta, float lambda) {
  check_f32(v, -1, "adaround_round_loss", "v");
  QT_ASSERT(beta >= 1.0f && isfinite(beta), "adaround_round_loss: beta %g (want >= 1)", (double)beta);
  const int64_t one = 1, n = qt_tensor_numel(v);
  qt_tensor *loss = qt_tensor_new(ctx, QT_F32, 1, &one);
  const int recording = qt_tape_recording(ctx, v, NULL, NULL);
  float *d = recording ? qt_arena_alloc(ctx, (size_t)n * sizeof(float)) : NULL;
  const float *vd = qt_f32(v);
  double sum = 0;
#pragma omp parallel for schedule(static) reduction(+ : sum)
  for (int64_t i = 0; i < n; i++) {
    float dh;
    const float u = 2.0f * h_and_slope(vd[i], &dh) - 1.0f, au = fabsf(u);
    const float p = au > 0.0f ? powf(au, beta - 1.0f) : 0.0f; /* |u|^(beta - 1) */
    sum += 1.0 - (double)(p * au);
    /* d/dv (1 - |u|^beta) = -beta |u|^(beta - 1) sign(u) * 2 dh/dv */
    if (d) d[i] = u == 0.0f ? 0.0f : lambda * -beta * p * (u > 0.0f ? 1.0f : -1.0f) * 2.0f * dh;
  }
  qt_f32(loss)[0] = (float)(lambda * sum);
  if (recording) {
    loss->requires_grad = 1;
    loss_saved *sv = qt_tape_push(ctx, QT_PROFILE_ADAROUND_ROUND_LOSS, loss_backward, sizeof *sv, loss);
    *sv = (loss_saved){v, loss, d};
  }
  return loss;
}

qt_tensor *qt_adaround_round_loss(qt_ctx *ctx, qt_tensor *v, float beta, float lambda) {
  PROFILED(ctx, QT_PROFILE_ADAROUND_ROUND_LOSS, round_loss_op(ctx, v, beta, lambda));
}

/* ---- the squared error ---------------------------------------------------------------------- */
static qt_tensor *squared_error_op(qt_ctx *ctx, qt_tensor *x, const float *target, double divisor) {
  check_f32(x, -1, "squared_error", "input");
  QT_ASSERT(divisor > 0 && isfinite(divisor), "squared_error: divisor %g", divisor);
  const int64_t one = 1, n = qt_tensor_numel(x);
  qt_tensor *loss = qt_tensor_new(ctx, QT_F32, 1, &one);
  const int recording = qt_tape_recording(ctx, x, NULL, NULL);
  float *d = recording ? qt_arena_alloc(ctx, (size_t)n * sizeof(float)) : NULL;
  const float *xd = qt_f32(x), k = (float)(2.0 / divisor);
  double sum = 0;
#pragma omp parallel for schedule(static) reduction(+ : sum)
  for (int64_t i = 0; i < n; i++) {
    const double e = (double)xd[i] - (double)target[i];
    sum += e * e;
    if (d) d[i] = k * (xd[i] - target[i]);
  }
  qt_f32(loss)[0] = (float)(sum / divisor);
  if (recording) {
    loss->requires_grad = 1;
    loss_saved *sv = qt_tape_push(ctx, QT_PROFILE_SQUARED_ERROR, loss_backward, sizeof *sv, loss);
    *sv = (loss_saved){x, loss, d};
  }
  return loss;
}

qt_tensor *qt_squared_error(qt_ctx *ctx, qt_tensor *x, const float *target, double divisor) {
  PROFILED(ctx, QT_PROFILE_SQUARED_ERROR, squared_error_op(ctx, x, target, divisor));
}

/* ---- QDrop ---------------------------------------------------------------------------------- */
typedef struct {
  qt_tensor *x, *xq, *y;
  unsigned char *took_x;
} qdrop_saved;

static void qdrop_backward(qt_ctx *ctx, void *p) {
  qdrop_saved *s = p;
  if (!s->y->grad) return;
  qt_tensor *from[2] = {s->xq, s->x}; /* indexed by took_x */
  float *to[2] = {NULL, NULL};
  for (int k = 0; k < 2; k++)
    if (from[k]->requires_grad) to[k] = qt_tensor_grad(ctx, from[k]);
  const float *dy = s->y->grad;
  const int64_t n = qt_tensor_numel(s->y);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) {
    float *t = to[s->took_x[i]];
    if (t) t[i] += dy[i];
  }
}

static qt_tensor *qdrop_op(qt_ctx *ctx, qt_tensor *x, qt_tensor *xq, float drop, uint64_t seed) {
  check_f32(x, -1, "qdrop", "float input");
  check_f32(xq, x->ndim, "qdrop", "quantized input");
  for (int d = 0; d < x->ndim; d++)
    QT_ASSERT(x->shape[d] == xq->shape[d], "qdrop: dimension %d differs (%lld vs %lld)", d, (long long)x->shape[d],
              (long long)xq->shape[d]);
  QT_ASSERT(drop >= 0.0f && drop <= 1.0f, "qdrop: probability %g", (double)drop);
  const int64_t n = qt_tensor_numel(x);
  qt_tensor *y = qt_tensor_new(ctx, QT_F32, x->ndim, x->shape);
  const int recording = qt_tape_recording(ctx, x, xq, NULL);
  unsigned char *took_x = recording ? qt_arena_alloc(ctx, (size_t)n) : NULL;
  const float *a = qt_f32(x), *b = qt_f32(xq);
  float *yd = qt_f32(y);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) {
    const int t = qt_uniform_at(seed, i) < drop;
    yd[i] = t ? a[i] : b[i];
    if (took_x) took_x[i] = (unsigned char)t;
  }
  if (recording) {
    y->requires_grad = 1;
    qdrop_saved *sv = qt_tape_push(ctx, QT_PROFILE_QDROP, qdrop_backward, sizeof *sv, y);
    *sv = (qdrop_saved){x, xq, y, took_x};
  }
  return y;
}

qt_tensor *qt_qdrop(qt_ctx *ctx, qt_tensor *x, qt_tensor *xq, float drop, uint64_t seed) {
  PROFILED(ctx, QT_PROFILE_QDROP, qdrop_op(ctx, x, xq, drop, seed));
}
