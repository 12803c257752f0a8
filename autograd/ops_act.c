/* Element-wise activations beyond relu / relu6 (autograd.h qt_activation): sigmoid, tanh, SiLU,
 * hard sigmoid, hard swish, GELU (erf and tanh forms), leaky ReLU, ELU and the arithmetic with a
 * constant (affine, div), their kernels
 * (kernels.h qt_act_forward / qt_act_backward) and the differentiable op.
 *
 * Each formula is PyTorch's (aten/src/ATen/native/cpu/Activation.cpp and UnaryOpsKernel.cpp,
 * torch 1.13), including where a piecewise function's backward takes its boundary: hard sigmoid
 * passes the gradient strictly inside (-3, 3) (ONNX's form with other alpha, beta as
 * torch.clamp(alpha x + beta, 0, 1) does: the bounds included), hard swish takes (x / 3 + 1 / 2)
 * on [-3, 3) and 1 from 3 on (PyTorch's vectorized kernel, measured), leaky ReLU and ELU take
 * their negative branch at x <= 0. The forwards are computed in float with
 * libm's expf, tanhf and erff, one element at a time: PyTorch's vectorized kernels use other
 * approximations of those functions, so results agree to a few units in the last place, not bit
 * for bit (tests/kernels_cpu/test_activations_torch.c states the tolerances). Sigmoid and tanh
 * differentiate through their output, the others through their input. Also dropout in training
 * (qt_dropout), whose mask is a function of its key and each element's place in the whole batch. */
#include "autograd/ops_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ACT_PARALLEL_MIN 16384
/* <math.h>'s M_SQRT2, M_2_SQRTPI and M_SQRT1_2 (POSIX, not C11), the constants PyTorch uses */
#define SQRT2 1.41421356237309504880
#define TWO_OVER_SQRTPI 1.12837916709551257390
#define SQRT1_2 0.70710678118654752440

static const char *const act_names[QT_ACT_COUNT] = {
    "sigmoid", "tanh", "silu", "hardsigmoid", "hardswish", "gelu", "gelu_tanh", "leaky_relu", "elu", "affine", "div"};

const char *qt_act_name(qt_act_kind kind) { return kind >= 0 && kind < QT_ACT_COUNT ? act_names[kind] : "?"; }

int qt_act_parse(const char *name, qt_act_kind *out) {
  for (int k = 0; k < QT_ACT_COUNT; k++)
    if (strcmp(name, act_names[k]) == 0) {
      *out = (qt_act_kind)k;
      return 0;
    }
  return -1;
}

qt_act qt_act_default(qt_act_kind kind) {
  qt_act a = {kind, 0.0f, 0.0f};
  if (kind == QT_ACT_HARDSIGMOID) a.alpha = 1.0f / 6.0f, a.beta = 0.5f;
  if (kind == QT_ACT_LEAKY_RELU) a.alpha = 0.01f;
  if (kind == QT_ACT_ELU || kind == QT_ACT_AFFINE || kind == QT_ACT_DIV) a.alpha = 1.0f;
  return a;
}

int qt_act_torch_hardsigmoid(float alpha, float beta) { return alpha == 1.0f / 6.0f && beta == 0.5f; }

static const float GELU_TANH_BETA = (float)(SQRT2 * TWO_OVER_SQRTPI * 0.5), GELU_TANH_KAPPA = 0.044715f;

static inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

/* min(max(v, lo), hi) that keeps NaN, as PyTorch's clamps do (fminf / fmaxf would drop it) */
static inline float clampf(float v, float lo, float hi) {
  v = v < lo ? lo : v;
  return v > hi ? hi : v;
}

static inline float act_forward(float x, const qt_act *a, int torch_hs) {
  switch (a->kind) {
    case QT_ACT_SIGMOID: return sigmoidf(x);
    case QT_ACT_TANH: return tanhf(x);
    case QT_ACT_SILU: return x / (1.0f + expf(-x));
    case QT_ACT_HARDSIGMOID:
      if (torch_hs) return clampf(x + 3.0f, 0.0f, 6.0f) / 6.0f;
      return clampf(a->alpha * x + a->beta, 0.0f, 1.0f);
    case QT_ACT_HARDSWISH: return x * clampf(x + 3.0f, 0.0f, 6.0f) / 6.0f;
    case QT_ACT_GELU: return x * 0.5f * (1.0f + erff(x * (float)SQRT1_2));
    case QT_ACT_GELU_TANH: {
      const float x3 = x * x * x, inner = GELU_TANH_BETA * (x + GELU_TANH_KAPPA * x3);
      return 0.5f * x * (1.0f + tanhf(inner));
    }
    case QT_ACT_LEAKY_RELU: return x > 0.0f ? x : x * a->alpha;
    case QT_ACT_ELU: return x <= 0.0f ? a->alpha * (expf(x) - 1.0f) : x;
    case QT_ACT_AFFINE: /* one rounding, as PyTorch's x * c, x + c, c - x (-x exact) */
      if (a->beta == 0.0f) return x * a->alpha;
      if (a->alpha == 1.0f) return x + a->beta;
      return a->alpha * x + a->beta;
    case QT_ACT_DIV: return x / a->alpha;
    default: return NAN;
  }
}

/* d act / dx times g, from the input x and the output y. */
static inline float act_backward(float g, float x, float y, const qt_act *a, int torch_hs) {
  switch (a->kind) {
    case QT_ACT_SIGMOID: return g * (1.0f - y) * y;
    case QT_ACT_TANH: return g * (1.0f - y * y);
    case QT_ACT_SILU: {
      const float s = sigmoidf(x);
      return g * s * (1.0f + x * (1.0f - s));
    }
    case QT_ACT_HARDSIGMOID:
      if (torch_hs) return x > -3.0f && x < 3.0f ? g * (1.0f / 6.0f) : 0.0f;
      {
        const float v = a->alpha * x + a->beta; /* torch.clamp's backward: the bounds pass */
        return v >= 0.0f && v <= 1.0f ? g * a->alpha : 0.0f;
      }
    case QT_ACT_HARDSWISH:
      if (x < -3.0f) return 0.0f;
      if (x < 3.0f) return g * (x / 3.0f + 0.5f);
      return g;
    case QT_ACT_GELU: {
      const float cdf = 0.5f * (1.0f + erff(x * (float)SQRT1_2));
      const float pdf = expf(-0.5f * x * x) * (float)(TWO_OVER_SQRTPI * SQRT1_2 * 0.5);
      return g * (cdf + x * pdf);
    }
    case QT_ACT_GELU_TANH: {
      const float x2 = x * x, x3 = x2 * x;
      const float inner = GELU_TANH_BETA * (x + GELU_TANH_KAPPA * x3);
      const float t = tanhf(inner);
      const float left = 0.5f * x, right = 1.0f + t;
      const float left_d = 0.5f * right, tanh_d = 1.0f - t * t;
      const float inner_d = GELU_TANH_BETA * (1.0f + 3.0f * GELU_TANH_KAPPA * x2);
      return g * (left_d + left * tanh_d * inner_d);
    }
    case QT_ACT_LEAKY_RELU: return x > 0.0f ? g : g * a->alpha;
    case QT_ACT_ELU: return x <= 0.0f ? g * a->alpha * expf(x) : g;
    case QT_ACT_AFFINE: return g * a->alpha;
    case QT_ACT_DIV: return g / a->alpha;
    default: return NAN;
  }
}

void qt_act_forward(float *out, const float *inp, int64_t n, const qt_act *a) {
  const int hs = qt_act_torch_hardsigmoid(a->alpha, a->beta);
#pragma omp parallel for schedule(static) if (n >= ACT_PARALLEL_MIN)
  for (int64_t i = 0; i < n; i++) out[i] = act_forward(inp[i], a, hs);
}

void qt_act_backward(float *dinp, const float *dout, const float *inp, const float *out, int64_t n, const qt_act *a) {
  if (!dinp) return;
  const int hs = qt_act_torch_hardsigmoid(a->alpha, a->beta);
#pragma omp parallel for schedule(static) if (n >= ACT_PARALLEL_MIN)
  for (int64_t i = 0; i < n; i++) dinp[i] += act_backward(dout[i], inp ? inp[i] : 0.0f, out ? out[i] : 0.0f, a, hs);
}

int qt_act_backward_reads_input(int kind) {
  return kind != QT_ACT_SIGMOID && kind != QT_ACT_TANH && kind != QT_ACT_AFFINE && kind != QT_ACT_DIV;
}

/* ---- the op ---------------------------------------------------------------------------------- */
typedef struct {
  qt_tensor *x, *y;
  qt_act act;
} act_saved;

static void act_backward_entry(qt_ctx *ctx, void *p) {
  act_saved *s = p;
  if (!s->y->grad || !s->x->requires_grad) return;
  const int in = qt_act_backward_reads_input(s->act.kind);
  qt_act_backward(qt_tensor_grad(ctx, s->x), s->y->grad, in ? qt_f32(s->x) : NULL, in ? NULL : qt_f32(s->y),
                  qt_tensor_numel(s->y), &s->act);
}

static qt_tensor *act_op(qt_ctx *ctx, qt_tensor *x, qt_act a) {
  QT_ASSERT(a.kind >= 0 && a.kind < QT_ACT_COUNT, "activation: unknown kind %d", (int)a.kind);
  check_f32(x, -1, qt_act_name(a.kind), "input");
  qt_tensor *y = qt_tensor_new(ctx, QT_F32, x->ndim, x->shape);
  qt_act_forward(qt_f32(y), qt_f32(x), qt_tensor_numel(x), &a);
  if (qt_tape_recording(ctx, x, NULL, NULL)) {
    y->requires_grad = 1;
    act_saved *sv = qt_tape_push(ctx, QT_PROFILE_ACTIVATION, act_backward_entry, sizeof *sv, y);
    *sv = (act_saved){x, y, a};
    if (qt_act_backward_reads_input(a.kind))
      x->saved = 1;
    else
      y->saved = 1;
  }
  return y;
}

qt_tensor *qt_activation(qt_ctx *ctx, qt_tensor *x, qt_act a) {
  PROFILED(ctx, QT_PROFILE_ACTIVATION, act_op(ctx, x, a));
}

/* ---- PReLU ----------------------------------------------------------------------------------- */
typedef struct {
  qt_tensor *x, *w, *y;
} prelu_saved;

static void prelu_backward(qt_ctx *ctx, void *p) {
  prelu_saved *s = p;
  if (!s->y->grad) return;
  const int64_t n = qt_tensor_numel(s->x), K = qt_tensor_numel(s->w), C = s->x->shape[s->x->ndim - 1];
  const float *x = qt_f32(s->x), *w = qt_f32(s->w), *g = s->y->grad;
  if (s->x->requires_grad) {
    float *dx = qt_tensor_grad(ctx, s->x);
#pragma omp parallel for schedule(static) if (n >= ACT_PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++) dx[i] += x[i] > 0.0f ? g[i] : w[K == 1 ? 0 : i % C] * g[i];
  }
  if (s->w->requires_grad) { /* sums in double, one per slope */
    double *acc = calloc((size_t)K, sizeof *acc);
    QT_ASSERT(acc, "out of memory");
    for (int64_t i = 0; i < n; i++)
      if (!(x[i] > 0.0f)) acc[K == 1 ? 0 : i % C] += (double)x[i] * (double)g[i];
    float *dw = qt_tensor_grad(ctx, s->w);
    for (int64_t k = 0; k < K; k++) dw[k] += (float)acc[k];
    free(acc);
  }
}

static qt_tensor *prelu_op(qt_ctx *ctx, qt_tensor *x, qt_tensor *w) {
  check_f32(x, -1, "prelu", "input");
  check_f32(w, -1, "prelu", "slope");
  const int64_t n = qt_tensor_numel(x), K = qt_tensor_numel(w), C = x->shape[x->ndim - 1];
  QT_ASSERT(K == 1 || K == C, "prelu: %lld slopes for %lld channels (1 or one per channel)", (long long)K,
            (long long)C);
  qt_tensor *y = qt_tensor_new(ctx, QT_F32, x->ndim, x->shape);
  const float *xd = qt_f32(x), *wd = qt_f32(w);
  float *yd = qt_f32(y);
#pragma omp parallel for schedule(static) if (n >= ACT_PARALLEL_MIN)
  for (int64_t i = 0; i < n; i++) yd[i] = xd[i] > 0.0f ? xd[i] : wd[K == 1 ? 0 : i % C] * xd[i];
  if (qt_tape_recording(ctx, x, w, NULL)) {
    y->requires_grad = 1;
    prelu_saved *sv = qt_tape_push(ctx, QT_PROFILE_ACTIVATION, prelu_backward, sizeof *sv, y);
    *sv = (prelu_saved){x, w, y};
    x->saved = 1;
  }
  return y;
}

qt_tensor *qt_prelu(qt_ctx *ctx, qt_tensor *x, qt_tensor *w) {
  PROFILED(ctx, QT_PROFILE_ACTIVATION, prelu_op(ctx, x, w));
}

/* ---- dropout --------------------------------------------------------------------------------- */
typedef struct {
  qt_tensor *x, *y;
  float p, scale;
  uint64_t key;
  int64_t row0;
} dropout_saved;

/* y = x * scale where element i of the batch (row r, element e: i = r * S + e) is kept, else 0;
 * dy -> dx alike (x NULL: the backward, adding to y). */
static void dropout_apply(float *y, const float *x, const float *dy, int64_t n, int64_t S, float p, float scale,
                          uint64_t key, int64_t row0) {
#pragma omp parallel for schedule(static) if (n >= ACT_PARALLEL_MIN)
  for (int64_t i = 0; i < n; i++) {
    const int keep = p < 1.0f && qt_uniform_at(key, row0 * S + i) >= p;
    if (x)
      y[i] = keep ? x[i] * scale : 0.0f;
    else if (keep)
      y[i] += dy[i] * scale;
  }
}

static void dropout_backward(qt_ctx *ctx, void *p) {
  dropout_saved *s = p;
  if (!s->y->grad || !s->x->requires_grad) return;
  const int64_t n = qt_tensor_numel(s->y);
  dropout_apply(qt_tensor_grad(ctx, s->x), NULL, s->y->grad, n, s->x->shape[0] ? n / s->x->shape[0] : 0, s->p, s->scale,
                s->key, s->row0);
}

static qt_tensor *dropout_op(qt_ctx *ctx, qt_tensor *x, float p, uint64_t key, int64_t row0) {
  check_f32(x, -1, "dropout", "input");
  QT_ASSERT(p >= 0.0f && p <= 1.0f, "dropout: probability %g", (double)p);
  QT_ASSERT(x->ndim >= 1 && row0 >= 0, "dropout: rank %d, row %lld", x->ndim, (long long)row0);
  const float scale = p < 1.0f ? 1.0f / (float)(1.0 - (double)p) : 0.0f; /* PyTorch: x * (1 / float(1 - p)) */
  const int64_t n = qt_tensor_numel(x), S = x->shape[0] ? n / x->shape[0] : 0;
  qt_tensor *y = qt_tensor_new(ctx, QT_F32, x->ndim, x->shape);
  dropout_apply(qt_f32(y), qt_f32(x), NULL, n, S, p, scale, key, row0);
  if (qt_tape_recording(ctx, x, NULL, NULL)) {
    y->requires_grad = 1;
    dropout_saved *sv = qt_tape_push(ctx, QT_PROFILE_DROPOUT, dropout_backward, sizeof *sv, y);
    *sv = (dropout_saved){x, y, p, scale, key, row0};
  }
  return y;
}

qt_tensor *qt_dropout(qt_ctx *ctx, qt_tensor *x, float p, uint64_t key, int64_t row0) {
  PROFILED(ctx, QT_PROFILE_DROPOUT, dropout_op(ctx, x, p, key, row0));
}
