/* Quantization-aware training ops (ops_int.h): fake quant with fixed and learned (LSQ) scales,
 * fake quant fused with a max pool, conv2d of a fake-quantized input, channel scale. */
#include "autograd/ops_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- conv2d of a fake-quantized input whose only gradient is its learned scale ----------- */
typedef struct {
  qt_tensor *x, *scale, *w, *b, *y;
  float *xq; /* fq(x), the convolution's input */
  const int32_t *zp;
  int qmin, qmax;
  float grad_factor;
  qt_conv2d_shape s;
} conv_lsq_saved;

/* The input quantizer's scale gradient is grad_factor * sum_i dxq_i * coef_i with dxq the
 * convolution's input gradient: dxq = conv_backward_data(dy, w), so the sum is
 * sum_{oc, ic, tap} w[oc, ic, tap] * corr(coef_ic, dy_oc)[tap], the weight gradient the input
 * coef would get. One backward-weights pass over the input [fq(x), coef] (2C channels per
 * pixel) yields both that and the weight gradient (its first C channels), and dxq, for a
 * one-channel image a full pass over dy that needs horizontal sums, is never formed. */
static void conv2d_lsq_input_backward(qt_ctx *ctx, void *p) {
  conv_lsq_saved *s = p;
  if (!s->y->grad) return;
  float *dw = s->w->requires_grad ? qt_tensor_grad(ctx, s->w) : NULL;
  float *db = s->b && s->b->requires_grad ? qt_tensor_grad(ctx, s->b) : NULL;
  float *ds = s->scale->requires_grad ? qt_tensor_grad(ctx, s->scale) : NULL;
  if (!dw && !ds) {
    if (db) qt_conv2d_backward_ex(NULL, 0, NULL, db, s->y->grad, s->xq, qt_f32(s->w), &s->s);
    return;
  }
  const int C = s->s.C, C2 = 2 * C, OC = s->s.OC, K = s->s.KH * s->s.KW;
  const int64_t pixels = (int64_t)s->s.N * s->s.H * s->s.W;
  const size_t src_bytes = (size_t)(pixels * C2) * sizeof(float), dw2_bytes = (size_t)OC * C2 * K * sizeof(float);
  float *src = qt_arena_alloc(ctx, src_bytes), *dw2 = qt_arena_calloc(ctx, dw2_bytes);
  float *coef = qt_arena_alloc(ctx, (size_t)(pixels * C) * sizeof(float));
  qt_fake_quant_lsq_scale_coef(coef, qt_f32(s->x), pixels * C, qt_f32(s->scale)[0], s->zp[0], s->qmin, s->qmax);
  for (int64_t i = 0; i < pixels; i++)
    for (int c = 0; c < C; c++) {
      src[i * C2 + c] = s->xq[i * C + c];
      src[i * C2 + C + c] = coef[i * C + c];
    }
  qt_arena_free(ctx, coef, (size_t)(pixels * C) * sizeof(float));
  qt_conv2d_shape s2 = s->s;
  s2.C = C2;
  QT_ASSERT(qt_conv2d_shape_init(&s2) == 0, "conv2d_lsq_input: shape");
  qt_conv2d_backward_ex(NULL, 0, dw2, db, s->y->grad, src, NULL, &s2);
  const float *w = qt_f32(s->w);
  double sum = 0;
  for (int oc = 0; oc < OC; oc++)
    for (int c = 0; c < C; c++)
      for (int k = 0; k < K; k++) {
        const float *g = dw2 + ((size_t)oc * C2 + c) * K + k;
        if (dw) dw[((size_t)oc * C + c) * K + k] += g[0];
        sum += (double)w[((size_t)oc * C + c) * K + k] * g[(size_t)C * K];
      }
  if (ds) ds[0] += (float)(sum * s->grad_factor);
  qt_arena_free(ctx, dw2, dw2_bytes);
  qt_arena_free(ctx, src, src_bytes);
}

static qt_tensor *conv2d_lsq_input_op(qt_ctx *ctx, qt_tensor *x, qt_tensor *scale, const int32_t *zero_point, int qmin,
                                      int qmax, float grad_factor, qt_tensor *w, qt_tensor *b, int stride_h,
                                      int stride_w, int pad_h, int pad_w) {
  check_f32(x, 4, "conv2d_lsq_input", "input");
  check_f32(w, 4, "conv2d_lsq_input", "weight");
  check_f32(scale, 1, "conv2d_lsq_input", "scale");
  QT_ASSERT(!x->requires_grad, "conv2d_lsq_input: the input needs a gradient (use fake_quant_lsq and conv2d)");
  QT_ASSERT(scale->shape[0] == 1, "conv2d_lsq_input: %lld scales (one, per tensor)", (long long)scale->shape[0]);
  qt_conv2d_shape s = conv_shape_of(x, w, stride_h, stride_w, pad_h, pad_w, 1);
  QT_ASSERT(w->shape[1] == x->shape[3], "conv2d_lsq_input: weight in-channels %lld != input channels %lld",
            (long long)w->shape[1], (long long)x->shape[3]);
  QT_ASSERT(!b || (b->ndim == 1 && b->shape[0] == w->shape[0]),
            "conv2d_lsq_input: bias shape does not match %d outputs", s.OC);
  QT_ASSERT(qt_conv2d_shape_init(&s) == 0, "conv2d_lsq_input: invalid shape (input %dx%d, kernel %dx%d, stride %d)",
            s.H, s.W, s.KH, s.KW, stride_h);
  const int64_t n = qt_tensor_numel(x);
  float *xq = qt_arena_alloc(ctx, (size_t)n * sizeof(float));
  qt_fake_quant_forward(xq, NULL, qt_f32(x), n, 1, 1, qt_f32(scale), zero_point, qmin, qmax);
  int64_t shape[4] = {s.N, s.OH, s.OW, s.OC};
  qt_tensor *y = qt_tensor_new(ctx, QT_F32, 4, shape);
  qt_conv2d_forward(qt_f32(y), xq, qt_f32(w), b ? qt_f32(b) : NULL, &s);
  if (qt_tape_recording(ctx, scale, w, b)) {
    y->requires_grad = 1;
    conv_lsq_saved *sv = qt_tape_push(ctx, QT_PROFILE_CONV2D_LSQ_INPUT, conv2d_lsq_input_backward, sizeof *sv, y);
    *sv = (conv_lsq_saved){x, scale, w, b, y, xq, zero_point, qmin, qmax, grad_factor, s};
    x->saved = scale->saved = w->saved = 1;
  } else {
    qt_arena_free(ctx, xq, (size_t)n * sizeof(float));
  }
  return y;
}

qt_tensor *qt_conv2d_lsq_input(qt_ctx *ctx, qt_tensor *x, qt_tensor *scale, const int32_t *zero_point, int qmin,
                               int qmax, float grad_factor, qt_tensor *w, qt_tensor *b, int stride_h, int stride_w,
                               int pad_h, int pad_w) {
  PROFILED(
      ctx, QT_PROFILE_CONV2D_LSQ_INPUT,
      conv2d_lsq_input_op(ctx, x, scale, zero_point, qmin, qmax, grad_factor, w, b, stride_h, stride_w, pad_h, pad_w));
}

/* ---- quantization-aware training ops ---------------------------------------------------- */
typedef struct {
  qt_tensor *x, *y;
  uint8_t *mask;
} fq_saved;

static void fake_quant_backward(qt_ctx *ctx, void *p) {
  fq_saved *s = p;
  if (!s->y->grad || !s->x->requires_grad) return;
  const int64_t n = qt_tensor_numel(s->y);
  if (!s->x->grad) {
    /* The output's gradient is final (its consumers ran first) and needed by no one else:
     * mask it in place and hand it to the input, saving a zeroed buffer and a pass. */
    float *g = s->y->grad;
    const uint8_t *m = s->mask;
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; i++) g[i] = m[i] ? g[i] : 0.0f;
    s->x->grad = g;
    if (ctx->backward_frees) s->y->grad = NULL; /* the buffer is the input's now */
    return;
  }
  qt_fake_quant_backward(qt_tensor_grad(ctx, s->x), s->y->grad, s->mask, n);
}

static qt_tensor *fake_quant_op(qt_ctx *ctx, qt_tensor *x, int64_t outer, int channels, int64_t inner,
                                const float *scale, const int32_t *zero_point, int qmin, int qmax) {
  check_f32(x, -1, "fake_quant", "input");
  QT_ASSERT(outer * channels * inner == qt_tensor_numel(x), "fake_quant: view (%lld, %d, %lld) of %lld elements",
            (long long)outer, channels, (long long)inner, (long long)qt_tensor_numel(x));
  qt_tensor *y = qt_tensor_new(ctx, QT_F32, x->ndim, x->shape);
  int rec = qt_tape_recording(ctx, x, NULL, NULL);
  uint8_t *mask = rec ? qt_arena_alloc(ctx, (size_t)qt_tensor_numel(x)) : NULL;
  qt_fake_quant_forward(qt_f32(y), mask, qt_f32(x), outer, channels, inner, scale, zero_point, qmin, qmax);
  if (rec) {
    y->requires_grad = 1;
    fq_saved *sv = qt_tape_push(ctx, QT_PROFILE_FAKE_QUANT, fake_quant_backward, sizeof *sv, y);
    *sv = (fq_saved){x, y, mask};
  }
  return y;
}

qt_tensor *qt_fake_quant(qt_ctx *ctx, qt_tensor *x, int64_t outer, int channels, int64_t inner, const float *scale,
                         const int32_t *zero_point, int qmin, int qmax) {
  PROFILED(ctx, QT_PROFILE_FAKE_QUANT, fake_quant_op(ctx, x, outer, channels, inner, scale, zero_point, qmin, qmax));
}

typedef struct {
  qt_tensor *x, *scale, *y;
  int64_t outer, inner;
  int channels, qmin, qmax;
  const int32_t *zp;
  float grad_factor;
} lsq_saved;

static void fake_quant_lsq_backward(qt_ctx *ctx, void *p) {
  lsq_saved *s = p;
  if (!s->y->grad) return;
  /* No input gradient yet: the output's final gradient becomes it, written in place (as
   * fake_quant does), saving a zeroed buffer and a pass. */
  const int in_place = s->x->requires_grad && !s->x->grad;
  float *dx = in_place ? s->y->grad : s->x->requires_grad ? qt_tensor_grad(ctx, s->x) : NULL;
  float *ds = s->scale->requires_grad ? qt_tensor_grad(ctx, s->scale) : NULL;
  if (!dx && !ds) return;
  /* the kernel writes both gradients; route a missing one to scratch */
  float *dx_scratch = dx ? NULL : qt_arena_calloc(ctx, (size_t)qt_tensor_numel(s->x) * sizeof(float));
  float *ds_scratch = ds ? NULL : qt_arena_calloc(ctx, (size_t)s->channels * sizeof(float));
  qt_fake_quant_lsq_backward_ex(dx ? dx : dx_scratch, in_place, ds ? ds : ds_scratch, NULL, s->y->grad, qt_f32(s->x),
                                s->outer, s->channels, s->inner, qt_f32(s->scale), s->zp, s->qmin, s->qmax,
                                s->grad_factor);
  if (in_place) {
    s->x->grad = dx;
    if (ctx->backward_frees) s->y->grad = NULL; /* the buffer is the input's now */
  }
  if (ds_scratch) qt_arena_free(ctx, ds_scratch, (size_t)s->channels * sizeof(float));
  if (dx_scratch) qt_arena_free(ctx, dx_scratch, (size_t)qt_tensor_numel(s->x) * sizeof(float));
}

static qt_tensor *fake_quant_lsq_op(qt_ctx *ctx, qt_tensor *x, int64_t outer, int channels, int64_t inner,
                                    qt_tensor *scale, const int32_t *zero_point, int qmin, int qmax,
                                    float grad_factor) {
  check_f32(x, -1, "fake_quant_lsq", "input");
  check_f32(scale, 1, "fake_quant_lsq", "scale");
  QT_ASSERT(outer * channels * inner == qt_tensor_numel(x) && scale->shape[0] == channels,
            "fake_quant_lsq: view (%lld, %d, %lld) of %lld elements with %lld scales", (long long)outer, channels,
            (long long)inner, (long long)qt_tensor_numel(x), (long long)scale->shape[0]);
  qt_tensor *y = qt_tensor_new(ctx, QT_F32, x->ndim, x->shape);
  qt_fake_quant_forward(qt_f32(y), NULL, qt_f32(x), outer, channels, inner, qt_f32(scale), zero_point, qmin, qmax);
  if (qt_tape_recording(ctx, x, scale, NULL)) {
    y->requires_grad = 1;
    lsq_saved *sv = qt_tape_push(ctx, QT_PROFILE_FAKE_QUANT_LSQ, fake_quant_lsq_backward, sizeof *sv, y);
    *sv = (lsq_saved){x, scale, y, outer, inner, channels, qmin, qmax, zero_point, grad_factor};
    x->saved = scale->saved = 1;
  }
  return y;
}

qt_tensor *qt_fake_quant_lsq(qt_ctx *ctx, qt_tensor *x, int64_t outer, int channels, int64_t inner, qt_tensor *scale,
                             const int32_t *zero_point, int qmin, int qmax, float grad_factor) {
  PROFILED(ctx, QT_PROFILE_FAKE_QUANT_LSQ,
           fake_quant_lsq_op(ctx, x, outer, channels, inner, scale, zero_point, qmin, qmax, grad_factor));
}

typedef struct {
  qt_tensor *x, *y;
  int32_t *argmax;
  uint8_t *mask;
  int N, H, W, C, kernel;
  bn_saved *bn; /* qt_bn_before_pool */
} fq_pool_saved;

static void fake_quant_max_pool2d_backward(qt_ctx *ctx, void *p) {
  fq_pool_saved *s = p;
  if (!s->y->grad || !s->x->requires_grad) return;
  const int64_t m = qt_tensor_numel(s->y);
  if (qt_pool_hand_to_bn(ctx, s->bn, s->x, s->y->grad, (size_t)m * sizeof(float), s->argmax, s->kernel)) {
    /* the values in place: what qt_fake_quant_max_pool_backward writes at the argmax input */
    float *v = s->y->grad;
    const uint8_t *mask = s->mask;
#pragma omp parallel for simd schedule(static) if (m >= 32768)
    for (int64_t i = 0; i < m; i++) v[i] = mask[i] ? 0.0f + v[i] : 0.0f;
    s->y->grad = NULL; /* the batch norm's now */
    return;
  }
  int fresh = 0;
  float *dx = qt_tensor_grad_for_write(ctx, s->x, &fresh);
  qt_fake_quant_max_pool_backward(dx, fresh, s->y->grad, s->argmax, s->mask, s->N, s->H, s->W, s->C, s->kernel,
                                  s->kernel);
}

static qt_tensor *fake_quant_max_pool2d_op(qt_ctx *ctx, qt_tensor *x, const float *scale, const int32_t *zero_point,
                                           int qmin, int qmax, int kernel) {
  check_f32(x, 4, "fake_quant_max_pool2d", "input");
  const int N = (int)x->shape[0], H = (int)x->shape[1], W = (int)x->shape[2], C = (int)x->shape[3];
  QT_ASSERT(kernel >= 1 && H >= kernel && W >= kernel && H % kernel == 0 && W % kernel == 0,
            "fake_quant_max_pool2d: %dx%d input not tiled by %dx%d windows", H, W, kernel, kernel);
  const int64_t shape[4] = {N, H / kernel, W / kernel, C};
  qt_tensor *y = qt_tensor_new(ctx, QT_F32, 4, shape);
  const int64_t m = qt_tensor_numel(y);
  const size_t idx_bytes = (size_t)m * sizeof(int32_t);
  int32_t *argmax = qt_arena_alloc(ctx, idx_bytes);
  const int rec = qt_tape_recording(ctx, x, NULL, NULL);
  uint8_t *mask = rec ? qt_arena_alloc(ctx, (size_t)m) : NULL;
  qt_fake_quant_max_pool_forward(qt_f32(y), argmax, mask, qt_f32(x), N, H, W, C, kernel, kernel, scale[0],
                                 zero_point[0], qmin, qmax);
  if (rec) {
    y->requires_grad = 1;
    bn_saved *bn = qt_bn_before_pool(ctx, x, 1);
    fq_pool_saved *sv = qt_tape_push(ctx, QT_PROFILE_FQ_MAX_POOL2D, fake_quant_max_pool2d_backward, sizeof *sv, y);
    *sv = (fq_pool_saved){x, y, argmax, mask, N, H, W, C, kernel, bn};
  } else {
    qt_arena_free(ctx, argmax, idx_bytes); /* only backward reads the indices */
  }
  return y;
}

qt_tensor *qt_fake_quant_max_pool2d(qt_ctx *ctx, qt_tensor *x, const float *scale, const int32_t *zero_point, int qmin,
                                    int qmax, int kernel) {
  PROFILED(ctx, QT_PROFILE_FQ_MAX_POOL2D, fake_quant_max_pool2d_op(ctx, x, scale, zero_point, qmin, qmax, kernel));
}

typedef struct {
  qt_tensor *x, *scale, *y;
  int32_t *argmax;
  const int32_t *zp;
  int N, H, W, C, kernel, qmin, qmax;
  float grad_factor;
  bn_saved *bn; /* qt_bn_before_pool */
} lsq_pool_saved;

static void lsq_max_pool2d_backward(qt_ctx *ctx, void *p) {
  lsq_pool_saved *s = p;
  if (!s->y->grad) return;
  const int64_t m = qt_tensor_numel(s->y);
  const size_t val_bytes = (size_t)m * sizeof(float);
  if (s->x->requires_grad && s->bn && !s->x->grad && ctx->backward_frees) {
    float *val = qt_arena_alloc(ctx, val_bytes);
    QT_ASSERT(qt_pool_hand_to_bn(ctx, s->bn, s->x, val, val_bytes, s->argmax, s->kernel), "lsq_max_pool2d: hand-over");
    qt_fake_quant_lsq_max_pool_backward_val(val, s->scale->requires_grad ? qt_tensor_grad(ctx, s->scale) : NULL,
                                            s->y->grad, s->argmax, qt_f32(s->x), s->N, s->H, s->W, s->C, s->kernel,
                                            s->kernel, qt_f32(s->scale)[0], s->zp[0], s->qmin, s->qmax, s->grad_factor);
    return;
  }
  int fresh = 0;
  float *dx = s->x->requires_grad ? qt_tensor_grad_for_write(ctx, s->x, &fresh) : NULL;
  float *ds = s->scale->requires_grad ? qt_tensor_grad(ctx, s->scale) : NULL;
  if (!dx && !ds) return;
  qt_fake_quant_lsq_max_pool_backward(dx, fresh, ds, s->y->grad, s->argmax, qt_f32(s->x), s->N, s->H, s->W, s->C,
                                      s->kernel, s->kernel, qt_f32(s->scale)[0], s->zp[0], s->qmin, s->qmax,
                                      s->grad_factor);
}

static qt_tensor *lsq_max_pool2d_op(qt_ctx *ctx, qt_tensor *x, qt_tensor *scale, const int32_t *zero_point, int qmin,
                                    int qmax, float grad_factor, int kernel) {
  check_f32(x, 4, "lsq_max_pool2d", "input");
  check_f32(scale, 1, "lsq_max_pool2d", "scale");
  const int N = (int)x->shape[0], H = (int)x->shape[1], W = (int)x->shape[2], C = (int)x->shape[3];
  QT_ASSERT(scale->shape[0] == 1, "lsq_max_pool2d: %lld scales (one, per tensor)", (long long)scale->shape[0]);
  QT_ASSERT(kernel >= 1 && H >= kernel && W >= kernel && H % kernel == 0 && W % kernel == 0,
            "lsq_max_pool2d: %dx%d input not tiled by %dx%d windows", H, W, kernel, kernel);
  const int64_t shape[4] = {N, H / kernel, W / kernel, C};
  qt_tensor *y = qt_tensor_new(ctx, QT_F32, 4, shape);
  const size_t idx_bytes = (size_t)qt_tensor_numel(y) * sizeof(int32_t);
  int32_t *argmax = qt_arena_alloc(ctx, idx_bytes);
  qt_fake_quant_max_pool_forward(qt_f32(y), argmax, NULL, qt_f32(x), N, H, W, C, kernel, kernel, qt_f32(scale)[0],
                                 zero_point[0], qmin, qmax);
  if (qt_tape_recording(ctx, x, scale, NULL)) {
    y->requires_grad = 1;
    bn_saved *bn = qt_bn_before_pool(ctx, x, 1);
    lsq_pool_saved *sv = qt_tape_push(ctx, QT_PROFILE_LSQ_MAX_POOL2D, lsq_max_pool2d_backward, sizeof *sv, y);
    *sv = (lsq_pool_saved){x, scale, y, argmax, zero_point, N, H, W, C, kernel, qmin, qmax, grad_factor, bn};
    x->saved = scale->saved = 1;
  } else {
    qt_arena_free(ctx, argmax, idx_bytes); /* only backward reads the indices */
  }
  return y;
}

qt_tensor *qt_fake_quant_lsq_max_pool2d(qt_ctx *ctx, qt_tensor *x, qt_tensor *scale, const int32_t *zero_point,
                                        int qmin, int qmax, float grad_factor, int kernel) {
  PROFILED(ctx, QT_PROFILE_LSQ_MAX_POOL2D,
           lsq_max_pool2d_op(ctx, x, scale, zero_point, qmin, qmax, grad_factor, kernel));
}

typedef struct {
  qt_tensor *x, *s, *y;
  int first_axis, divide;
} cs_saved;

static void channel_scale_backward(qt_ctx *ctx, void *p) {
  cs_saved *sv = p;
  if (!sv->y->grad) return;
  const int64_t n = qt_tensor_numel(sv->x);
  const int C = (int)sv->s->shape[0];
  const int64_t rows = n / C; /* first axis: C rows of `rows` elements; last axis: rows of C */
  const float *dy = sv->y->grad, *x = qt_f32(sv->x), *s = qt_f32(sv->s);
  /* Last axis with no input gradient yet: overwrite the output's (final) gradient in place
   * and hand it to the input, as relu and fake_quant do. */
  const int in_place = !sv->first_axis && sv->x->requires_grad && !sv->x->grad;
  float *dx = in_place ? sv->y->grad : sv->x->requires_grad ? qt_tensor_grad(ctx, sv->x) : NULL;
  float *ds = sv->s->requires_grad ? qt_tensor_grad(ctx, sv->s) : NULL;
  qt_channel_scale_grads(dx, in_place, ds, dy, x, s, rows, C, sv->first_axis, sv->divide);
  if (in_place) {
    sv->x->grad = dx;
    if (ctx->backward_frees) sv->y->grad = NULL; /* the buffer is the input's now */
  }
}

/* Below this many elements (a layer's weights) a team costs more than the loop. */
#define CS_PARALLEL_MIN 65536

static qt_tensor *channel_scale_op(qt_ctx *ctx, qt_tensor *x, qt_tensor *s, int first_axis, int divide) {
  check_f32(x, -1, "channel_scale", "input");
  check_f32(s, 1, "channel_scale", "scale");
  const int C = (int)s->shape[0];
  QT_ASSERT(first_axis ? x->shape[0] == C : x->shape[x->ndim - 1] == C,
            "channel_scale: %d scales for a tensor whose %s axis has %lld", C, first_axis ? "first" : "last",
            (long long)(first_axis ? x->shape[0] : x->shape[x->ndim - 1]));
  qt_tensor *y = qt_tensor_new(ctx, QT_F32, x->ndim, x->shape);
  const int64_t n = qt_tensor_numel(x), rows = n / C;
  float *yd = qt_f32(y);
  const float *xd = qt_f32(x), *sd = qt_f32(s);
  if (first_axis) {
#pragma omp parallel for schedule(static) if (n >= CS_PARALLEL_MIN)
    for (int c = 0; c < C; c++)
      for (int64_t i = 0; i < rows; i++)
        yd[(int64_t)c * rows + i] = divide ? xd[(int64_t)c * rows + i] / sd[c] : xd[(int64_t)c * rows + i] * sd[c];
  } else if (divide) {
#pragma omp parallel for schedule(static) if (n >= CS_PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++) {
#pragma omp simd
      for (int c = 0; c < C; c++) yd[r * C + c] = xd[r * C + c] / sd[c];
    }
  } else {
#pragma omp parallel for schedule(static) if (n >= CS_PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++) {
#pragma omp simd
      for (int c = 0; c < C; c++) yd[r * C + c] = xd[r * C + c] * sd[c];
    }
  }
  if (qt_tape_recording(ctx, x, s, NULL)) {
    y->requires_grad = 1;
    cs_saved *sv = qt_tape_push(ctx, QT_PROFILE_CHANNEL_SCALE, channel_scale_backward, sizeof *sv, y);
    *sv = (cs_saved){x, s, y, first_axis, divide};
    x->saved = s->saved = 1;
  }
  return y;
}

qt_tensor *qt_channel_scale(qt_ctx *ctx, qt_tensor *x, qt_tensor *s, int first_axis, int divide) {
  PROFILED(ctx, QT_PROFILE_CHANNEL_SCALE, channel_scale_op(ctx, x, s, first_axis, divide));
}
