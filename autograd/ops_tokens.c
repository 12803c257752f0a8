/* The transformer's ops (autograd.h): layer norm over the last dim, multi-head scaled dot-product
 * attention and the class token's prepend and pick (a position embedding is qt_channel_add of one
 * sample's shape). Tokens are the pixels
 * of an (N, H, W, C) image (or the rows of (N, T, C)): T = H * W tokens of C features, in
 * row-major pixel order.
 *
 * Layer norm accumulates a row's mean and variance in double (PyTorch's CPU kernel in float with
 * its own order: a few units in the last place). Attention runs each (sample, head) through
 * oneDNN's row-major sgemm: S = scale * Q_h K_h^T (T x T), P = softmax(S) row by row (kept for
 * the backward), O_h = P V_h; its backward is dV_h = P^T dO_h, dP = dO_h V_h^T,
 * dS = P * (dP - rowsum(dP * P)), dQ_h = scale * dS K_h, dK_h = scale * dS^T Q_h. */
#include "autograd/dnnl_util.h"
#include "autograd/ops_int.h"

#include <math.h>
#include <string.h>

#define TOKENS_PARALLEL_MIN 16384

/* ---- layer norm ------------------------------------------------------------------------------ */

void qt_layer_norm_forward(float *y, float *mean, float *rstd, const float *x, const float *gamma, const float *beta,
                           int64_t rows, int64_t C, float eps) {
#pragma omp parallel for schedule(static) if (rows * C >= TOKENS_PARALLEL_MIN)
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * C;
    double s = 0.0, ss = 0.0;
    for (int64_t c = 0; c < C; c++) s += xr[c];
    const double m = s / (double)C;
    for (int64_t c = 0; c < C; c++) ss += ((double)xr[c] - m) * ((double)xr[c] - m);
    const float mf = (float)m, rs = (float)(1.0 / sqrt(ss / (double)C + (double)eps));
    if (mean) mean[r] = mf;
    if (rstd) rstd[r] = rs;
    float *yr = y + r * C;
    for (int64_t c = 0; c < C; c++) yr[c] = (xr[c] - mf) * rs * gamma[c] + (beta ? beta[c] : 0.0f);
  }
}

void qt_layer_norm_backward(float *dx, float *dgamma, float *dbeta, const float *dy, const float *x, const float *gamma,
                            const float *mean, const float *rstd, int64_t rows, int64_t C) {
  if (dx) {
#pragma omp parallel for schedule(static) if (rows * C >= TOKENS_PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++) {
      const float *xr = x + r * C, *dyr = dy + r * C;
      const float m = mean[r], rs = rstd[r];
      double a = 0.0, b = 0.0; /* mean of dy * gamma and of dy * gamma * xhat */
      for (int64_t c = 0; c < C; c++) {
        const double g = (double)dyr[c] * gamma[c];
        a += g;
        b += g * (double)((xr[c] - m) * rs);
      }
      const float am = (float)(a / (double)C), bm = (float)(b / (double)C);
      float *dxr = dx + r * C;
      for (int64_t c = 0; c < C; c++) dxr[c] += rs * (dyr[c] * gamma[c] - am - (xr[c] - m) * rs * bm);
    }
  }
  if (dgamma || dbeta) {
#pragma omp parallel for schedule(static) if (rows * C >= TOKENS_PARALLEL_MIN)
    for (int64_t c = 0; c < C; c++) {
      float sg = 0.0f, sb = 0.0f;
      for (int64_t r = 0; r < rows; r++) {
        sg += dy[r * C + c] * ((x[r * C + c] - mean[r]) * rstd[r]);
        sb += dy[r * C + c];
      }
      if (dgamma) dgamma[c] += sg;
      if (dbeta) dbeta[c] += sb;
    }
  }
}

typedef struct {
  qt_tensor *x, *gamma, *beta, *y;
  float *mean, *rstd;
  int64_t rows, C;
} ln_saved;

static float *grad_of(qt_ctx *ctx, qt_tensor *t) { return t && t->requires_grad ? qt_tensor_grad(ctx, t) : NULL; }

static void ln_backward(qt_ctx *ctx, void *p) {
  const ln_saved *s = p;
  if (!s->y->grad) return;
  qt_layer_norm_backward(grad_of(ctx, s->x), grad_of(ctx, s->gamma), grad_of(ctx, s->beta), s->y->grad, qt_f32(s->x),
                         qt_f32(s->gamma), s->mean, s->rstd, s->rows, s->C);
}

static qt_tensor *layer_norm_op(qt_ctx *ctx, qt_tensor *x, qt_tensor *gamma, qt_tensor *beta, float eps) {
  check_f32(x, -1, "layer_norm", "input");
  check_f32(gamma, 1, "layer_norm", "gamma");
  const int64_t C = x->shape[x->ndim - 1], rows = C ? qt_tensor_numel(x) / C : 0;
  QT_ASSERT(gamma->shape[0] == C, "layer_norm: gamma has %lld values, the last dim %lld", (long long)gamma->shape[0],
            (long long)C);
  if (beta) {
    check_f32(beta, 1, "layer_norm", "beta");
    QT_ASSERT(beta->shape[0] == C, "layer_norm: beta has %lld values, the last dim %lld", (long long)beta->shape[0],
              (long long)C);
  }
  qt_tensor *y = qt_tensor_new(ctx, QT_F32, x->ndim, x->shape);
  const int rec = qt_tape_recording(ctx, x, gamma, beta);
  float *mean = rec ? qt_arena_alloc(ctx, (size_t)rows * sizeof(float)) : NULL;
  float *rstd = rec ? qt_arena_alloc(ctx, (size_t)rows * sizeof(float)) : NULL;
  qt_layer_norm_forward(qt_f32(y), mean, rstd, qt_f32(x), qt_f32(gamma), beta ? qt_f32(beta) : NULL, rows, C, eps);
  if (rec) {
    y->requires_grad = 1;
    ln_saved *sv = qt_tape_push(ctx, QT_PROFILE_LAYER_NORM, ln_backward, sizeof *sv, y);
    *sv = (ln_saved){x, gamma, beta, y, mean, rstd, rows, C};
    x->saved = 1;
  }
  return y;
}

qt_tensor *qt_layer_norm(qt_ctx *ctx, qt_tensor *x, qt_tensor *gamma, qt_tensor *beta, float eps) {
  PROFILED(ctx, QT_PROFILE_LAYER_NORM, layer_norm_op(ctx, x, gamma, beta, eps));
}

/* ---- attention ------------------------------------------------------------------------------- */

void qt_attention_forward(float *y, float *probs, const float *q, const float *k, const float *v, int64_t N, int64_t T,
                          int64_t D, int heads) {
  const int64_t dh = D / heads;
  const float scale = (float)(1.0 / sqrt((double)dh));
#pragma omp parallel for schedule(static) if (N * heads * T * T * dh >= TOKENS_PARALLEL_MIN)
  for (int64_t nh = 0; nh < N * heads; nh++) {
    const int64_t n = nh / heads, o = n * T * D + (nh % heads) * dh;
    float *p = probs + nh * T * T;
    QT_DNNL_CHECK(dnnl_sgemm('N', 'T', T, T, dh, scale, q + o, D, k + o, D, 0.0f, p, T));
    for (int64_t i = 0; i < T; i++) qt_softmax_row(p + i * T, p + i * T, T, NULL, NULL);
    QT_DNNL_CHECK(dnnl_sgemm('N', 'N', T, dh, T, 1.0f, p, T, v + o, D, 0.0f, y + o, D));
  }
}

void qt_attention_backward(float *dq, float *dk, float *dv, float *scratch, const float *dy, const float *q,
                           const float *k, const float *v, const float *probs, int64_t N, int64_t T, int64_t D,
                           int heads) {
  const int64_t dh = D / heads;
  const float scale = (float)(1.0 / sqrt((double)dh));
#pragma omp parallel for schedule(static) if (N * heads * T * T * dh >= TOKENS_PARALLEL_MIN)
  for (int64_t nh = 0; nh < N * heads; nh++) {
    const int64_t n = nh / heads, o = n * T * D + (nh % heads) * dh;
    const float *p = probs + nh * T * T;
    float *ds = scratch + nh * T * T;
    if (dv) QT_DNNL_CHECK(dnnl_sgemm('T', 'N', T, dh, T, 1.0f, p, T, dy + o, D, 1.0f, dv + o, D));
    if (!dq && !dk) continue;
    QT_DNNL_CHECK(dnnl_sgemm('N', 'T', T, T, dh, 1.0f, dy + o, D, v + o, D, 0.0f, ds, T));
    for (int64_t i = 0; i < T; i++) {
      float *r = ds + i * T;
      const float *pr = p + i * T;
      float dot = 0.0f;
      for (int64_t j = 0; j < T; j++) dot += r[j] * pr[j];
      for (int64_t j = 0; j < T; j++) r[j] = pr[j] * (r[j] - dot);
    }
    if (dq) QT_DNNL_CHECK(dnnl_sgemm('N', 'N', T, dh, T, scale, ds, T, k + o, D, 1.0f, dq + o, D));
    if (dk) QT_DNNL_CHECK(dnnl_sgemm('T', 'N', T, dh, T, scale, ds, T, q + o, D, 1.0f, dk + o, D));
  }
}

typedef struct {
  qt_tensor *q, *k, *v, *y;
  float *probs;
  int64_t N, T, D;
  int heads;
} attn_saved;

static void attn_backward(qt_ctx *ctx, void *p) {
  const attn_saved *s = p;
  if (!s->y->grad) return;
  const size_t bytes = (size_t)(s->N * s->heads * s->T * s->T) * sizeof(float);
  float *scratch = qt_arena_alloc(ctx, bytes);
  qt_attention_backward(grad_of(ctx, s->q), grad_of(ctx, s->k), grad_of(ctx, s->v), scratch, s->y->grad, qt_f32(s->q),
                        qt_f32(s->k), qt_f32(s->v), s->probs, s->N, s->T, s->D, s->heads);
  qt_arena_free(ctx, scratch, bytes);
}

static qt_tensor *attention_op(qt_ctx *ctx, qt_tensor *q, qt_tensor *k, qt_tensor *v, int heads) {
  check_f32(q, -1, "attention", "q");
  check_f32(k, q->ndim, "attention", "k");
  check_f32(v, q->ndim, "attention", "v");
  QT_ASSERT(q->ndim >= 2, "attention: q has rank %d, want (N, ..., D)", q->ndim);
  for (int d = 0; d < q->ndim; d++)
    QT_ASSERT(k->shape[d] == q->shape[d] && v->shape[d] == q->shape[d], "attention: q, k, v differ in dimension %d", d);
  const int64_t N = q->shape[0], D = q->shape[q->ndim - 1], T = N ? qt_tensor_numel(q) / N / (D ? D : 1) : 0;
  QT_ASSERT(heads >= 1 && D % heads == 0, "attention: %d heads do not divide %lld features", heads, (long long)D);
  qt_tensor *y = qt_tensor_new(ctx, QT_F32, q->ndim, q->shape);
  float *probs = qt_arena_alloc(ctx, (size_t)(N * heads * T * T) * sizeof(float));
  qt_attention_forward(qt_f32(y), probs, qt_f32(q), qt_f32(k), qt_f32(v), N, T, D, heads);
  if (qt_tape_recording(ctx, q, k, v)) {
    y->requires_grad = 1;
    attn_saved *sv = qt_tape_push(ctx, QT_PROFILE_ATTENTION, attn_backward, sizeof *sv, y);
    *sv = (attn_saved){q, k, v, y, probs, N, T, D, heads};
    q->saved = k->saved = v->saved = 1;
  } else {
    qt_arena_free(ctx, probs, (size_t)(N * heads * T * T) * sizeof(float));
  }
  return y;
}

qt_tensor *qt_attention(qt_ctx *ctx, qt_tensor *q, qt_tensor *k, qt_tensor *v, int heads) {
  PROFILED(ctx, QT_PROFILE_ATTENTION, attention_op(ctx, q, k, v, heads));
}

/* ---- the class token ------------------------------------------------------------------------- */

typedef struct {
  qt_tensor *x, *w, *y;
} token_saved;

static void prepend_token_backward(qt_ctx *ctx, void *p) {
  const token_saved *s = p;
  if (!s->y->grad) return;
  const int64_t N = s->x->shape[0], C = s->w->shape[0], per = qt_tensor_numel(s->x) / (N ? N : 1);
  float *dx = grad_of(ctx, s->x), *dw = grad_of(ctx, s->w);
  const float *dy = s->y->grad;
  for (int64_t n = 0; dx && n < N; n++) { /* the pixels' tokens follow the class token */
    const float *src = dy + n * (per + C) + C;
    float *dst = dx + n * per;
    for (int64_t i = 0; i < per; i++) dst[i] += src[i];
  }
  for (int64_t c = 0; dw && c < C; c++) {
    double acc = 0.0;
    for (int64_t n = 0; n < N; n++) acc += dy[n * (per + C) + c];
    dw[c] += (float)acc;
  }
}

static qt_tensor *prepend_token_op(qt_ctx *ctx, qt_tensor *x, qt_tensor *w) {
  check_f32(x, 4, "prepend_token", "input");
  check_f32(w, 1, "prepend_token", "token");
  const int64_t N = x->shape[0], C = x->shape[3], per = qt_tensor_numel(x) / (N ? N : 1);
  QT_ASSERT(w->shape[0] == C, "prepend_token: a token of %lld features for tokens of %lld", (long long)w->shape[0],
            (long long)C);
  const int64_t shape[4] = {N, 1, 1 + x->shape[1] * x->shape[2], C};
  qt_tensor *y = qt_tensor_new(ctx, QT_F32, 4, shape);
  float *yd = qt_f32(y);
  const float *xd = qt_f32(x), *wd = qt_f32(w);
  for (int64_t n = 0; n < N; n++) {
    memcpy(yd + n * (per + C), wd, (size_t)C * sizeof(float));
    memcpy(yd + n * (per + C) + C, xd + n * per, (size_t)per * sizeof(float));
  }
  if (qt_tape_recording(ctx, x, w, NULL)) {
    y->requires_grad = 1;
    token_saved *sv = qt_tape_push(ctx, QT_PROFILE_CHANNELS, prepend_token_backward, sizeof *sv, y);
    *sv = (token_saved){x, w, y};
  }
  return y;
}

qt_tensor *qt_prepend_token(qt_ctx *ctx, qt_tensor *x, qt_tensor *w) {
  PROFILED(ctx, QT_PROFILE_CHANNELS, prepend_token_op(ctx, x, w));
}

static void first_token_backward(qt_ctx *ctx, void *p) {
  const token_saved *s = p;
  if (!s->y->grad || !s->x->requires_grad) return;
  const int64_t N = s->x->shape[0], C = s->y->shape[1], per = qt_tensor_numel(s->x) / (N ? N : 1);
  float *dx = qt_tensor_grad(ctx, s->x);
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++) dx[n * per + c] += s->y->grad[n * C + c];
}

static qt_tensor *first_token_op(qt_ctx *ctx, qt_tensor *x) {
  check_f32(x, 4, "first_token", "input");
  const int64_t N = x->shape[0], C = x->shape[3], per = qt_tensor_numel(x) / (N ? N : 1);
  const int64_t shape[2] = {N, C};
  qt_tensor *y = qt_tensor_new(ctx, QT_F32, 2, shape);
  for (int64_t n = 0; n < N; n++) memcpy(qt_f32(y) + n * C, qt_f32(x) + n * per, (size_t)C * sizeof(float));
  if (qt_tape_recording(ctx, x, NULL, NULL)) {
    y->requires_grad = 1;
    token_saved *sv = qt_tape_push(ctx, QT_PROFILE_CHANNELS, first_token_backward, sizeof *sv, y);
    *sv = (token_saved){x, NULL, y};
  }
  return y;
}

qt_tensor *qt_first_token(qt_ctx *ctx, qt_tensor *x) { PROFILED(ctx, QT_PROFILE_CHANNELS, first_token_op(ctx, x)); }
