/* Differentiable ops: shape checks, output allocation, the kernel call and the tape record.
 * Shape errors here are programming errors (graphs validate shapes when they are built), so
 * they abort with file:line and both shapes. */
#include "autograd/autograd.h"
#include "autograd/kernels.h"
#include "autograd/tape.h"
#include "qat/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A float32 tensor of rank ndim (< 0: any), in either layout (for an op that takes blocked
 * activations, autograd.h's qt_tensor.blocked16); check_f32: and not blocked. */
static void check_f32_any(const qt_tensor *t, int ndim, const char *op, const char *what) {
  QT_ASSERT(t->dtype == QT_F32, "%s: %s is %s, want float32", op, what, qt_dtype_name(t->dtype));
  QT_ASSERT(ndim < 0 || t->ndim == ndim, "%s: %s has rank %d, want %d", op, what, t->ndim, ndim);
}
static void check_f32(const qt_tensor *t, int ndim, const char *op, const char *what) {
  check_f32_any(t, ndim, op, what);
  QT_ASSERT(!t->blocked16, "%s: %s is in the blocked (nChw16c) layout, which this op does not take", op, what);
}

/* Every public op is its static body behind PROFILED: with profiling off (ctx->profile NULL) one
 * branch; on, the op's wall time and one call go to its forward bucket. Timing is taken at this
 * level, which never nests: no op calls another (qt_profile_begin aborts if one did), so no
 * time is counted twice and nothing needs subtracting. */
#define PROFILED(ctx, kind, body)                        \
  do {                                                   \
    if (!(ctx)->profile) return body;                    \
    const double t0_ = qt_profile_begin((ctx), (kind));  \
    qt_tensor *y_ = body;                                \
    qt_profile_end((ctx), (kind), t0_);                  \
    return y_;                                           \
  } while (0)

void qt_ops_release_scratch(void) { qt_conv2d_release_scratch(); }

/* ---- conv2d ----------------------------------------------------------------------------- */
typedef struct {
  qt_tensor *x, *w, *b, *y;
  qt_conv2d_shape s;
} conv_saved;

static void conv2d_backward(qt_ctx *ctx, void *p) {
  conv_saved *s = p;
  if (!s->y->grad) return;
  int dx_fresh = 0;
  float *dx = s->x->requires_grad ? qt_tensor_grad_for_write(ctx, s->x, &dx_fresh) : NULL;
  float *dw = s->w->requires_grad ? qt_tensor_grad(ctx, s->w) : NULL;
  float *db = s->b && s->b->requires_grad ? qt_tensor_grad(ctx, s->b) : NULL;
  qt_conv2d_backward_ex(dx, dx_fresh, dw, db, s->y->grad, qt_f32(s->x), qt_f32(s->w), &s->s);
}

static qt_tensor *conv2d_op(qt_ctx *ctx, qt_tensor *x, qt_tensor *w, qt_tensor *b, int stride_h, int stride_w,
                            int pad_h, int pad_w, int groups, int to_blocked) {
  check_f32_any(x, 4, "conv2d", "input");
  check_f32(w, 4, "conv2d", "weight");
  qt_conv2d_shape s = {
      .N = (int)x->shape[0], .H = (int)x->shape[1], .W = (int)x->shape[2], .C = (int)x->shape[3],
      .OC = (int)w->shape[0], .KH = (int)w->shape[2], .KW = (int)w->shape[3],
      .stride_h = stride_h, .stride_w = stride_w, .pad_h = pad_h, .pad_w = pad_w, .groups = groups};
  QT_ASSERT(groups >= 1 && w->shape[1] * groups == x->shape[3],
            "conv2d: weight in-channels %lld x groups %d != input channels %lld", (long long)w->shape[1], groups,
            (long long)x->shape[3]);
  QT_ASSERT(!b || (b->ndim == 1 && b->shape[0] == w->shape[0]), "conv2d: bias shape does not match %d outputs",
            s.OC);
  QT_ASSERT(qt_conv2d_shape_init(&s) == 0, "conv2d: invalid shape (input %dx%d, kernel %dx%d, stride %d, pad %d)",
            s.H, s.W, s.KH, s.KW, stride_h, pad_h);
  int64_t shape[4] = {s.N, s.OH, s.OW, s.OC};
  qt_tensor *y = qt_tensor_new(ctx, QT_F32, 4, shape);
  const int recording = qt_tape_recording(ctx, x, w, b);
  /* a blocked input came from a producer that asked qt_conv2d_takes_blocked: the Winograd kernels
   * then, recorded or not (every parameter frozen) */
  s.winograd = (recording || x->blocked16) && ctx->conv_winograd;
  s.src_blocked = x->blocked16; /* the kernel refuses it where its primitives do not run on it */
  /* a blocked output only where recorded (nothing but the backward reads the layout's choice) */
  y->blocked16 = s.dst_blocked = to_blocked && recording && s.winograd && ctx->blocked_handoff && s.OC % 16 == 0 &&
                                 qt_conv2d_dst_blocked16(&s);
  qt_conv2d_forward(qt_f32(y), qt_f32(x), qt_f32(w), b ? qt_f32(b) : NULL, &s);
  if (recording) {
    y->requires_grad = 1;
    conv_saved *sv = qt_tape_push(ctx, QT_PROFILE_CONV2D, conv2d_backward, sizeof *sv, y);
    *sv = (conv_saved){x, w, b, y, s};
    x->saved = w->saved = 1;
  }
  return y;
}

qt_tensor *qt_conv2d(qt_ctx *ctx, qt_tensor *x, qt_tensor *w, qt_tensor *b, int stride_h, int stride_w,
                     int pad_h, int pad_w, int groups) {
  PROFILED(ctx, QT_PROFILE_CONV2D, conv2d_op(ctx, x, w, b, stride_h, stride_w, pad_h, pad_w, groups, 0));
}

qt_tensor *qt_conv2d_to_blocked(qt_ctx *ctx, qt_tensor *x, qt_tensor *w, qt_tensor *b, int stride_h, int stride_w,
                                int pad_h, int pad_w, int groups) {
  PROFILED(ctx, QT_PROFILE_CONV2D, conv2d_op(ctx, x, w, b, stride_h, stride_w, pad_h, pad_w, groups, 1));
}

int qt_conv2d_takes_blocked(const qt_ctx *ctx, const int64_t x_shape[4], const int64_t w_shape[4], int stride_h,
                            int stride_w, int pad_h, int pad_w, int groups) {
  qt_conv2d_shape s = {.N = (int)x_shape[0], .H = (int)x_shape[1], .W = (int)x_shape[2], .C = (int)x_shape[3],
                       .OC = (int)w_shape[0], .KH = (int)w_shape[2], .KW = (int)w_shape[3], .stride_h = stride_h,
                       .stride_w = stride_w, .pad_h = pad_h, .pad_w = pad_w, .groups = groups, .winograd = 1};
  return ctx->grad_enabled && ctx->conv_winograd && ctx->blocked_handoff && groups >= 1 &&
         w_shape[1] * groups == x_shape[3] && qt_conv2d_shape_init(&s) == 0 && qt_conv2d_src_blocked16(&s);
}

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

static qt_tensor *conv2d_lsq_input_op(qt_ctx *ctx, qt_tensor *x, qt_tensor *scale, const int32_t *zero_point,
                                      int qmin, int qmax, float grad_factor, qt_tensor *w, qt_tensor *b, int stride_h,
                                      int stride_w, int pad_h, int pad_w) {
  check_f32(x, 4, "conv2d_lsq_input", "input");
  check_f32(w, 4, "conv2d_lsq_input", "weight");
  check_f32(scale, 1, "conv2d_lsq_input", "scale");
  QT_ASSERT(!x->requires_grad, "conv2d_lsq_input: the input needs a gradient (use fake_quant_lsq and conv2d)");
  QT_ASSERT(scale->shape[0] == 1, "conv2d_lsq_input: %lld scales (one, per tensor)", (long long)scale->shape[0]);
  qt_conv2d_shape s = {
      .N = (int)x->shape[0], .H = (int)x->shape[1], .W = (int)x->shape[2], .C = (int)x->shape[3],
      .OC = (int)w->shape[0], .KH = (int)w->shape[2], .KW = (int)w->shape[3],
      .stride_h = stride_h, .stride_w = stride_w, .pad_h = pad_h, .pad_w = pad_w, .groups = 1};
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
  PROFILED(ctx, QT_PROFILE_CONV2D_LSQ_INPUT, conv2d_lsq_input_op(ctx, x, scale, zero_point, qmin, qmax, grad_factor,
                                                                 w, b, stride_h, stride_w, pad_h, pad_w));
}

/* ---- relu, relu6 ------------------------------------------------------------------------ */
typedef struct {
  qt_tensor *x, *y;
  uint8_t *mask; /* where the gradient passes, one bit per element (qt_relu_forward_mask) */
  int inplace;   /* the output was written over the input */
} relu_saved;

static void relu_backward(qt_ctx *ctx, void *p) {
  relu_saved *s = p;
  if (!s->y->grad || !s->x->requires_grad) return;
  const int64_t n = qt_tensor_numel(s->y);
  if (!s->x->grad && s->inplace) {
    /* In place: the input's gradient is the output's, masked where the output is clamped. */
    qt_relu_backward_mask(s->y->grad, 1, s->y->grad, s->mask, n);
    s->x->grad = s->y->grad;
    if (ctx->backward_frees) s->y->grad = NULL; /* the buffer is the input's now */
    return;
  }
  qt_relu_backward_mask(qt_tensor_grad(ctx, s->x), 0, s->y->grad, s->mask, n);
}

/* Recorded, the forward also writes the mask backward needs, so neither the input's nor the
 * output's data is saved: the output can go back to the arena once its consumers ran. */
static qt_tensor *relu_op(qt_ctx *ctx, qt_tensor *x, int inplace, int six) {
  check_f32(x, -1, six ? "relu6" : "relu", "input");
  qt_tensor *y = inplace ? qt_tensor_wrap(ctx, QT_F32, x->ndim, x->shape, x->data)
                         : qt_tensor_new(ctx, QT_F32, x->ndim, x->shape);
  const int64_t n = qt_tensor_numel(x);
  if (qt_tape_recording(ctx, x, NULL, NULL)) {
    uint8_t *mask = qt_arena_alloc(ctx, (size_t)((n + 7) / 8));
    qt_relu_forward_mask(qt_f32(y), mask, qt_f32(x), n, six);
    y->requires_grad = 1;
    relu_saved *sv = qt_tape_push(ctx, six ? QT_PROFILE_RELU6 : QT_PROFILE_RELU, relu_backward, sizeof *sv, y);
    *sv = (relu_saved){x, y, mask, inplace};
  } else {
    (six ? qt_relu6_forward : qt_relu_forward)(qt_f32(y), qt_f32(x), n);
  }
  return y;
}

qt_tensor *qt_relu(qt_ctx *ctx, qt_tensor *x, int inplace) {
  PROFILED(ctx, QT_PROFILE_RELU, relu_op(ctx, x, inplace, 0));
}
qt_tensor *qt_relu6(qt_ctx *ctx, qt_tensor *x, int inplace) {
  PROFILED(ctx, QT_PROFILE_RELU6, relu_op(ctx, x, inplace, 1));
}

/* ---- pooling ---------------------------------------------------------------------------- */
/* Batch norm's tape state (its ops are below), here for the max pools that hand it their gradient. */
typedef struct {
  qt_tensor *x, *s, *gamma, *beta, *y; /* s: the per-channel divisor of x (conv_bn), or NULL */
  float *mean, *invstd;
  uint8_t *mask; /* the fused relu's (training), or NULL */
  int training, M, C;
  const qt_batch_sync *sync; /* training over a batch split across processes (SyncBN), or NULL */
  int64_t M_total;           /* rows over all processes */
  /* pooled: a max pool consuming y handed its gradient over as `pool` (pool_hand_to_bn) instead
   * of writing y's; pool.val is arena memory of pool_bytes that the backward hands back */
  int pooled;
  qt_pool_grad pool;
  size_t pool_bytes;
} bn_saved;
static void batch_norm_backward(qt_ctx *ctx, void *p);

/* A max pool whose windows tile its input x (stride = kernel, no padding) may skip x's gradient
 * when x is the output of a batch norm in training mode recorded just before it (the tape's last
 * entry): nothing recorded between them reads x, so when the pool's backward runs and x has no
 * gradient yet (every later consumer's backward has run), the pool is x's only consumer with a
 * gradient and the batch norm's backward runs next. It then hands the batch norm the gradient as
 * each window's argmax value (pool_hand_to_bn), and the batch norm's backward selects it row by
 * row (qt_batch_norm_relu_backward_pooled): the same numbers without the input-sized gradient,
 * which only the batch norm would read. Returns that batch norm's state, else NULL. */
static bn_saved *bn_before_pool(const qt_ctx *ctx, const qt_tensor *x, int tiles) {
  if (!tiles || ctx->tape_len == 0) return NULL;
  const qt_tape_entry *e = &ctx->tape[ctx->tape_len - 1];
  if (e->out != x || e->fn != batch_norm_backward) return NULL;
  bn_saved *b = e->saved;
  return b->training && x->ndim == 4 ? b : NULL;
}

/* In the pool's backward: whether its gradient goes to bn (bn_before_pool) as val, arena memory
 * of one float per pool output, the value at each window's argmax input (the caller fills it
 * after a yes). Only with backward frees on: then no caller reads x's gradient after backward. */
static int pool_hand_to_bn(qt_ctx *ctx, bn_saved *bn, const qt_tensor *x, float *val, size_t val_bytes,
                           const int32_t *argmax, int kernel) {
  if (!bn || x->grad || !ctx->backward_frees) return 0;
  bn->pooled = 1;
  bn->pool = (qt_pool_grad){val,
                            argmax,
                            (int)x->shape[0],
                            (int)x->shape[1],
                            (int)x->shape[2],
                            kernel,
                            kernel,
                            0};
  bn->pool_bytes = val_bytes;
  return 1;
}
typedef struct {
  qt_tensor *x, *y;
  int32_t *argmax;
  qt_pool2d_shape s;
  int avg;
  bn_saved *bn; /* bn_before_pool */
} pool_saved;

static void pool2d_backward(qt_ctx *ctx, void *p) {
  pool_saved *s = p;
  if (!s->y->grad || !s->x->requires_grad) return;
  const int64_t m = qt_tensor_numel(s->y);
  if (s->avg) {
    qt_avg_pool2d_backward(qt_tensor_grad(ctx, s->x), s->y->grad, &s->s);
  } else if (pool_hand_to_bn(ctx, s->bn, s->x, s->y->grad, (size_t)m * sizeof(float), s->argmax, s->s.KH)) {
    /* the output's gradient becomes the values, in place: 0 + d, what a fresh dx gets */
    float *v = s->y->grad;
#pragma omp parallel for simd schedule(static) if (m >= 32768)
    for (int64_t i = 0; i < m; i++) v[i] = 0.0f + v[i];
    s->y->grad = NULL; /* the batch norm's now */
  } else {
    int fresh = 0;
    float *dx = qt_tensor_grad_for_write(ctx, s->x, &fresh);
    qt_max_pool2d_backward_ex(dx, fresh, s->y->grad, s->argmax, &s->s);
  }
}

static qt_tensor *pool2d(qt_ctx *ctx, qt_tensor *x, int kernel, int stride, int pad, int avg) {
  const char *op = avg ? "avg_pool2d" : "max_pool2d";
  check_f32(x, 4, op, "input");
  qt_pool2d_shape s = {.N = (int)x->shape[0], .H = (int)x->shape[1], .W = (int)x->shape[2],
                       .C = (int)x->shape[3], .KH = kernel, .KW = kernel, .stride_h = stride,
                       .stride_w = stride, .pad_h = pad, .pad_w = pad};
  QT_ASSERT(qt_pool2d_shape_init(&s) == 0, "%s: invalid shape (input %dx%d, kernel %d, stride %d, pad %d)", op, s.H,
            s.W, kernel, stride, pad);
  int64_t shape[4] = {s.N, s.OH, s.OW, s.C};
  qt_tensor *y = qt_tensor_new(ctx, QT_F32, 4, shape);
  int rec = qt_tape_recording(ctx, x, NULL, NULL);
  int32_t *argmax = NULL;
  if (avg) {
    qt_avg_pool2d_forward(qt_f32(y), qt_f32(x), &s);
  } else if (rec) {
    argmax = qt_arena_alloc(ctx, (size_t)qt_tensor_numel(y) * sizeof(int32_t));
    qt_max_pool2d_forward(qt_f32(y), argmax, qt_f32(x), &s);
  } else {
    /* Only backward reads the indices: without a tape they are scratch, written for a slice
     * of the images at a time (at most 1 MB), not as large again as the output. Images are
     * independent, so the output is the same. */
    const int64_t per_out = (int64_t)s.OH * s.OW * s.C, per_in = (int64_t)s.H * s.W * s.C;
    int64_t chunk = per_out > 0 ? ((int64_t)1 << 18) / per_out : s.N;
    if (chunk < 1) chunk = 1;
    if (chunk > s.N) chunk = s.N;
    int32_t *scratch = qt_arena_alloc(ctx, (size_t)(chunk * per_out) * sizeof(int32_t));
    for (int64_t n0 = 0; n0 < s.N; n0 += chunk) {
      qt_pool2d_shape part = s;
      part.N = (int)(s.N - n0 < chunk ? s.N - n0 : chunk);
      qt_max_pool2d_forward(qt_f32(y) + n0 * per_out, scratch, qt_f32(x) + n0 * per_in, &part);
    }
    qt_arena_free(ctx, scratch, (size_t)(chunk * per_out) * sizeof(int32_t));
  }
  if (rec) {
    const int tiles = !avg && s.stride_h == s.KH && s.stride_w == s.KW && s.KH == s.KW && s.pad_h == 0 &&
                      s.pad_w == 0 && s.OH * s.KH == s.H && s.OW * s.KW == s.W;
    bn_saved *bn = bn_before_pool(ctx, x, tiles);
    y->requires_grad = 1;
    pool_saved *sv =
        qt_tape_push(ctx, avg ? QT_PROFILE_AVG_POOL2D : QT_PROFILE_MAX_POOL2D, pool2d_backward, sizeof *sv, y);
    *sv = (pool_saved){x, y, argmax, s, avg, bn};
  }
  return y;
}

qt_tensor *qt_max_pool2d(qt_ctx *ctx, qt_tensor *x, int kernel, int stride, int pad) {
  PROFILED(ctx, QT_PROFILE_MAX_POOL2D, pool2d(ctx, x, kernel, stride, pad, 0));
}
qt_tensor *qt_avg_pool2d(qt_ctx *ctx, qt_tensor *x, int kernel, int stride, int pad) {
  PROFILED(ctx, QT_PROFILE_AVG_POOL2D, pool2d(ctx, x, kernel, stride, pad, 1));
}

typedef struct {
  qt_tensor *x, *y;
} unary_saved;

static void global_avg_pool_backward(qt_ctx *ctx, void *p) {
  unary_saved *s = p;
  if (!s->y->grad || !s->x->requires_grad) return;
  qt_global_avg_pool_backward(qt_tensor_grad(ctx, s->x), s->y->grad, (int)s->x->shape[0],
                              (int)(s->x->shape[1] * s->x->shape[2]), (int)s->x->shape[3]);
}

static qt_tensor *global_avg_pool_op(qt_ctx *ctx, qt_tensor *x) {
  check_f32(x, 4, "global_avg_pool", "input");
  int64_t shape[2] = {x->shape[0], x->shape[3]};
  qt_tensor *y = qt_tensor_new(ctx, QT_F32, 2, shape);
  qt_global_avg_pool_forward(qt_f32(y), qt_f32(x), (int)x->shape[0], (int)(x->shape[1] * x->shape[2]),
                             (int)x->shape[3]);
  if (qt_tape_recording(ctx, x, NULL, NULL)) {
    y->requires_grad = 1;
    unary_saved *sv = qt_tape_push(ctx, QT_PROFILE_GLOBAL_AVG_POOL, global_avg_pool_backward, sizeof *sv, y);
    *sv = (unary_saved){x, y};
  }
  return y;
}

qt_tensor *qt_global_avg_pool(qt_ctx *ctx, qt_tensor *x) {
  PROFILED(ctx, QT_PROFILE_GLOBAL_AVG_POOL, global_avg_pool_op(ctx, x));
}

/* ---- flatten (a view) ------------------------------------------------------------------- */
static void flatten_backward(qt_ctx *ctx, void *p) {
  unary_saved *s = p;
  if (!s->y->grad || !s->x->requires_grad) return;
  if (!s->x->grad) {
    s->x->grad = s->y->grad; /* same memory order: share the gradient buffer */
    if (ctx->backward_frees) s->y->grad = NULL; /* the buffer is the input's now */
    return;
  }
  qt_add_backward(s->x->grad, NULL, s->y->grad, qt_tensor_numel(s->y));
}

static qt_tensor *flatten_op(qt_ctx *ctx, qt_tensor *x) {
  QT_ASSERT(!x->blocked16, "flatten: the input is in the blocked (nChw16c) layout, which this op does not take");
  int64_t shape[2] = {x->shape[0], x->shape[0] ? qt_tensor_numel(x) / x->shape[0] : 0};
  qt_tensor *y = qt_tensor_wrap(ctx, x->dtype, 2, shape, x->data);
  if (qt_tape_recording(ctx, x, NULL, NULL)) {
    y->requires_grad = 1;
    unary_saved *sv = qt_tape_push(ctx, QT_PROFILE_FLATTEN, flatten_backward, sizeof *sv, y);
    *sv = (unary_saved){x, y};
  }
  return y;
}

qt_tensor *qt_flatten(qt_ctx *ctx, qt_tensor *x) { PROFILED(ctx, QT_PROFILE_FLATTEN, flatten_op(ctx, x)); }

/* ---- linear ----------------------------------------------------------------------------- */
typedef struct {
  qt_tensor *x, *w, *b, *y;
} linear_saved;

static void linear_backward(qt_ctx *ctx, void *p) {
  linear_saved *s = p;
  if (!s->y->grad) return;
  float *dx = s->x->requires_grad ? qt_tensor_grad(ctx, s->x) : NULL;
  float *dw = s->w->requires_grad ? qt_tensor_grad(ctx, s->w) : NULL;
  float *db = s->b && s->b->requires_grad ? qt_tensor_grad(ctx, s->b) : NULL;
  qt_linear_backward(dx, dw, db, s->y->grad, qt_f32(s->x), qt_f32(s->w), (int)s->x->shape[0], (int)s->x->shape[1],
                     (int)s->w->shape[0]);
}

static qt_tensor *linear_op(qt_ctx *ctx, qt_tensor *x, qt_tensor *w, qt_tensor *b) {
  check_f32(x, 2, "linear", "input");
  check_f32(w, 2, "linear", "weight");
  QT_ASSERT(w->shape[1] == x->shape[1], "linear: weight has %lld inputs, input has %lld features",
            (long long)w->shape[1], (long long)x->shape[1]);
  QT_ASSERT(!b || b->shape[0] == w->shape[0], "linear: bias does not match %lld outputs", (long long)w->shape[0]);
  int64_t shape[2] = {x->shape[0], w->shape[0]};
  qt_tensor *y = qt_tensor_new(ctx, QT_F32, 2, shape);
  qt_linear_forward(qt_f32(y), qt_f32(x), qt_f32(w), b ? qt_f32(b) : NULL, (int)x->shape[0], (int)x->shape[1],
                    (int)w->shape[0]);
  if (qt_tape_recording(ctx, x, w, b)) {
    y->requires_grad = 1;
    linear_saved *sv = qt_tape_push(ctx, QT_PROFILE_LINEAR, linear_backward, sizeof *sv, y);
    *sv = (linear_saved){x, w, b, y};
    x->saved = w->saved = 1;
  }
  return y;
}

qt_tensor *qt_linear(qt_ctx *ctx, qt_tensor *x, qt_tensor *w, qt_tensor *b) {
  PROFILED(ctx, QT_PROFILE_LINEAR, linear_op(ctx, x, w, b));
}

/* ---- add -------------------------------------------------------------------------------- */
typedef struct {
  qt_tensor *a, *b, *y;
} add_saved;

static void add_backward(qt_ctx *ctx, void *p) {
  add_saved *s = p;
  if (!s->y->grad) return;
  float *da = s->a->requires_grad ? qt_tensor_grad(ctx, s->a) : NULL;
  float *db = s->b->requires_grad ? qt_tensor_grad(ctx, s->b) : NULL;
  qt_add_backward(da, db, s->y->grad, qt_tensor_numel(s->y));
}

static qt_tensor *add_op(qt_ctx *ctx, qt_tensor *a, qt_tensor *b) {
  check_f32(a, -1, "add", "first input");
  check_f32(b, a->ndim, "add", "second input");
  for (int i = 0; i < a->ndim; i++)
    QT_ASSERT(a->shape[i] == b->shape[i], "add: dimension %d differs (%lld vs %lld)", i, (long long)a->shape[i],
              (long long)b->shape[i]);
  qt_tensor *y = qt_tensor_new(ctx, QT_F32, a->ndim, a->shape);
  qt_add_forward(qt_f32(y), qt_f32(a), qt_f32(b), qt_tensor_numel(a));
  if (qt_tape_recording(ctx, a, b, NULL)) {
    y->requires_grad = 1;
    add_saved *sv = qt_tape_push(ctx, QT_PROFILE_ADD, add_backward, sizeof *sv, y);
    *sv = (add_saved){a, b, y};
  }
  return y;
}

qt_tensor *qt_add(qt_ctx *ctx, qt_tensor *a, qt_tensor *b) { PROFILED(ctx, QT_PROFILE_ADD, add_op(ctx, a, b)); }

/* ---- softmax cross-entropy -------------------------------------------------------------- */
typedef struct {
  qt_tensor *logits, *loss;
  float *probs;
  const int32_t *labels;
} ce_saved;

static void cross_entropy_backward(qt_ctx *ctx, void *p) {
  ce_saved *s = p;
  if (!s->loss->grad || !s->logits->requires_grad) return;
  qt_cross_entropy_backward(qt_tensor_grad(ctx, s->logits), s->probs, s->labels, s->loss->grad[0],
                            (int)s->logits->shape[0], (int)s->logits->shape[1]);
}

static qt_tensor *cross_entropy_op(qt_ctx *ctx, qt_tensor *logits, const int32_t *labels, float **probs_out) {
  check_f32(logits, 2, "cross_entropy", "logits");
  int N = (int)logits->shape[0], C = (int)logits->shape[1];
  for (int i = 0; i < N; i++)
    QT_ASSERT(labels[i] >= 0 && labels[i] < C, "cross_entropy: label %d of sample %d outside [0, %d)", labels[i], i,
              C);
  int64_t one = 1;
  qt_tensor *loss = qt_tensor_new(ctx, QT_F32, 1, &one);
  float *probs = qt_arena_alloc(ctx, (size_t)N * (size_t)C * sizeof(float));
  qt_f32(loss)[0] = qt_cross_entropy_forward(probs, qt_f32(logits), labels, N, C);
  if (probs_out) *probs_out = probs;
  if (qt_tape_recording(ctx, logits, NULL, NULL)) {
    loss->requires_grad = 1;
    /* labels are copied: the caller's batch buffer may be reused before backward runs. */
    int32_t *lab = qt_arena_alloc(ctx, (size_t)N * sizeof(int32_t));
    memcpy(lab, labels, (size_t)N * sizeof(int32_t));
    ce_saved *sv = qt_tape_push(ctx, QT_PROFILE_CROSS_ENTROPY, cross_entropy_backward, sizeof *sv, loss);
    *sv = (ce_saved){logits, loss, probs, lab};
  }
  return loss;
}

qt_tensor *qt_cross_entropy(qt_ctx *ctx, qt_tensor *logits, const int32_t *labels, float **probs_out) {
  PROFILED(ctx, QT_PROFILE_CROSS_ENTROPY, cross_entropy_op(ctx, logits, labels, probs_out));
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
  bn_saved *bn; /* bn_before_pool */
} fq_pool_saved;

static void fake_quant_max_pool2d_backward(qt_ctx *ctx, void *p) {
  fq_pool_saved *s = p;
  if (!s->y->grad || !s->x->requires_grad) return;
  const int64_t m = qt_tensor_numel(s->y);
  if (pool_hand_to_bn(ctx, s->bn, s->x, s->y->grad, (size_t)m * sizeof(float), s->argmax, s->kernel)) {
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
    bn_saved *bn = bn_before_pool(ctx, x, 1);
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
  bn_saved *bn; /* bn_before_pool */
} lsq_pool_saved;

static void lsq_max_pool2d_backward(qt_ctx *ctx, void *p) {
  lsq_pool_saved *s = p;
  if (!s->y->grad) return;
  const int64_t m = qt_tensor_numel(s->y);
  const size_t val_bytes = (size_t)m * sizeof(float);
  if (s->x->requires_grad && s->bn && !s->x->grad && ctx->backward_frees) {
    float *val = qt_arena_alloc(ctx, val_bytes);
    QT_ASSERT(pool_hand_to_bn(ctx, s->bn, s->x, val, val_bytes, s->argmax, s->kernel), "lsq_max_pool2d: hand-over");
    qt_fake_quant_lsq_max_pool_backward_val(val, s->scale->requires_grad ? qt_tensor_grad(ctx, s->scale) : NULL,
                                            s->y->grad, s->argmax, qt_f32(s->x), s->N, s->H, s->W, s->C, s->kernel,
                                            s->kernel, qt_f32(s->scale)[0], s->zp[0], s->qmin, s->qmax,
                                            s->grad_factor);
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
    bn_saved *bn = bn_before_pool(ctx, x, 1);
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

/* Rows per chunk of the last-axis reductions: fixed, so sums do not depend on threads (the batch
 * norm's pooled backward sums x / s's gradient in the same chunks, kernels.h). */
#define CS_CHUNK QT_CHANNEL_SUM_ROWS

/* The gradients of y = x * s or x / s (divide) with s (C) along x's first axis (C rows of `rows`
 * elements) or its last (rows of C): dx written (in_place: over dy itself, last axis only) or
 * added to, ds added to; either may be NULL. */
static void channel_scale_grads(float *dx, int in_place, float *ds, const float *dy, const float *x, const float *s,
                                int64_t rows, int C, int first_axis, int divide) {
  double *acc = calloc((size_t)C, sizeof(double));
  QT_ASSERT(acc, "out of memory");
  if (first_axis) {
    /* Weights (C, ...): small; one pass per channel. */
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
      const int64_t o = (int64_t)c * rows;
      double a = 0;
      for (int64_t i = 0; i < rows; i++) {
        if (dx) dx[o + i] += divide ? dy[o + i] / s[c] : dy[o + i] * s[c];
        a += (double)dy[o + i] * x[o + i];
      }
      acc[c] = a;
    }
  } else {
    /* Activations (..., C): one fused pass writes dx and per-chunk float sums of dy * x
     * (vectorized over channels), combined in double in chunk order. */
    const int64_t nchunks = (rows + CS_CHUNK - 1) / CS_CHUNK;
    float *part = ds ? malloc((size_t)(nchunks * C) * sizeof(float)) : NULL;
    QT_ASSERT(!ds || part, "out of memory");
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < nchunks; k++) {
      const int64_t r0 = k * CS_CHUNK, r1 = r0 + CS_CHUNK < rows ? r0 + CS_CHUNK : rows;
      float *pk = part ? part + k * C : NULL;
      if (pk)
        for (int c = 0; c < C; c++) pk[c] = 0.0f;
      for (int64_t r = r0; r < r1; r++) {
        const float *dyr = dy + r * C, *xr = x + r * C;
        if (pk) { /* before dx: in place, dx overwrites dy */
#pragma omp simd
          for (int c = 0; c < C; c++) pk[c] += dyr[c] * xr[c];
        }
        if (dx) {
          float *dxr = dx + r * C;
          if (in_place && divide) {
#pragma omp simd
            for (int c = 0; c < C; c++) dxr[c] = dyr[c] / s[c];
          } else if (in_place) {
#pragma omp simd
            for (int c = 0; c < C; c++) dxr[c] = dyr[c] * s[c];
          } else if (divide) {
#pragma omp simd
            for (int c = 0; c < C; c++) dxr[c] += dyr[c] / s[c];
          } else {
#pragma omp simd
            for (int c = 0; c < C; c++) dxr[c] += dyr[c] * s[c];
          }
        }
      }
    }
    if (part) {
      for (int64_t k = 0; k < nchunks; k++)
        for (int c = 0; c < C; c++) acc[c] += part[k * C + c];
      free(part);
    }
  }
  /* d/ds (x*s) = x; d/ds (x/s) = -x/s^2 */
  if (ds)
    for (int c = 0; c < C; c++) ds[c] += divide ? (float)(-acc[c] / ((double)s[c] * s[c])) : (float)acc[c];
  free(acc);
}

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
  channel_scale_grads(dx, in_place, ds, dy, x, s, rows, C, sv->first_axis, sv->divide);
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

/* ---- batch norm: plain, fused with its relu, and of x / s (conv_bn) --------------------- */

/* The kernels' backward into dinp (written, never read: dinp_write), gamma's and beta's grads:
 * training (with the fused relu's mask, if any, applied to dout in place first) or eval. A pooled
 * one with div_sums (and a divisor): dinp is x's gradient, not the quotient's, and div_sums the
 * sums the divisor's gradient needs (qt_batch_norm_relu_backward_pooled). */
static void bn_kernels_backward(const bn_saved *b, float *dinp, int dinp_write, float *dg, float *db,
                                double *div_sums) {
  const float *div = b->s ? qt_f32(b->s) : NULL;
  if (b->pooled)
    qt_batch_norm_relu_backward_pooled(dinp, dinp_write, dg, db, &b->pool, b->mask, qt_f32(b->x), div, div_sums,
                                       b->mean, b->invstd, qt_f32(b->gamma), b->M, b->C, b->sync, b->M_total);
  else if (b->training)
    qt_batch_norm_relu_backward(dinp, dinp_write, dg, db, b->y->grad, b->mask, qt_f32(b->x), div, b->mean, b->invstd,
                                qt_f32(b->gamma), b->M, b->C, b->sync, b->M_total);
  else
    qt_batch_norm_backward_eval_ex(dinp, dinp_write, dg, db, b->y->grad, qt_f32(b->x), div, b->mean, b->invstd,
                                   qt_f32(b->gamma), b->M, b->C);
}

/* Batch norm's backward. The output's gradient is final and, with frees on, dead after this
 * entry: with no input gradient yet, the input's is written over it (the kernels allow dinp ==
 * dout), saving a buffer; else a buffer of its own (qt_tensor_grad_for_write). Of x / s: the
 * quotient's gradient (over the output's, or a fresh buffer), then channel_scale's own backward
 * code in place: the same operations, buffers and order as the two ops' entries in turn. */
static void batch_norm_backward_of(qt_ctx *ctx, bn_saved *b) {
  /* SyncBN: every process joins the reduction of the backward sums, a zero gradient too */
  if (!b->pooled && !b->y->grad && b->training && b->sync) qt_tensor_grad(ctx, b->y);
  if (!b->pooled && !b->y->grad) return;
  /* the input side's buffer first, then gamma's and beta's (the arena's order); a pool's handed
   * gradient (b->pooled) has no output-sized buffer to write over */
  if (!b->s) {
    const int in_place = !b->pooled && b->x->requires_grad && !b->x->grad && ctx->backward_frees;
    int fresh = 0;
    float *dx = NULL;
    if (in_place)
      dx = b->y->grad, fresh = 1;
    else if (b->x->requires_grad)
      dx = qt_tensor_grad_for_write(ctx, b->x, &fresh);
    float *dg = b->gamma->requires_grad ? qt_tensor_grad(ctx, b->gamma) : NULL;
    float *db = b->beta->requires_grad ? qt_tensor_grad(ctx, b->beta) : NULL;
    bn_kernels_backward(b, dx, fresh, dg, db, NULL);
    if (in_place) { /* the buffer is the input's gradient now */
      b->x->grad = dx;
      b->y->grad = NULL;
    }
    return;
  }
  if (b->pooled && b->x->requires_grad) {
    /* x / s's backward in the batch norm's dinp pass: x's gradient written (or added) there, and
     * the sums behind s's (channel_scale_grads' last step) */
    int fresh = 0;
    float *dx = qt_tensor_grad_for_write(ctx, b->x, &fresh);
    float *dg = b->gamma->requires_grad ? qt_tensor_grad(ctx, b->gamma) : NULL;
    float *db = b->beta->requires_grad ? qt_tensor_grad(ctx, b->beta) : NULL;
    double *sums = qt_arena_alloc(ctx, (size_t)b->C * sizeof(double));
    bn_kernels_backward(b, dx, fresh, dg, db, sums);
    if (b->s->requires_grad) {
      float *ds = qt_tensor_grad(ctx, b->s);
      const float *s = qt_f32(b->s);
      for (int c = 0; c < b->C; c++) ds[c] += (float)(-sums[c] / ((double)s[c] * s[c]));
    }
    qt_arena_free(ctx, sums, (size_t)b->C * sizeof(double));
    return;
  }
  /* x / s's backward as its own pass below reads x as NHWC (a blocked x comes from a recorded
   * convolution, so it needs its gradient and takes the branch above) */
  QT_ASSERT(!b->pooled || !b->pool.blocked, "batch_norm: a blocked input without its gradient");
  const int64_t n = qt_tensor_numel(b->x);
  const int want_q = b->x->requires_grad || b->s->requires_grad;
  float *dq = !want_q                                ? NULL
              : ctx->backward_frees && !b->pooled ? b->y->grad
                                                  : qt_arena_alloc(ctx, (size_t)n * sizeof(float));
  float *dg = b->gamma->requires_grad ? qt_tensor_grad(ctx, b->gamma) : NULL;
  float *db = b->beta->requires_grad ? qt_tensor_grad(ctx, b->beta) : NULL;
  bn_kernels_backward(b, dq, 1, dg, db, NULL);
  if (!dq) return;
  if (!b->pooled && dq == b->y->grad) b->y->grad = NULL; /* the buffer is the quotient's now */
  const int in_place = b->x->requires_grad && !b->x->grad;
  float *dx = in_place ? dq : b->x->requires_grad ? qt_tensor_grad(ctx, b->x) : NULL;
  float *ds = b->s->requires_grad ? qt_tensor_grad(ctx, b->s) : NULL;
  channel_scale_grads(dx, in_place, ds, dq, qt_f32(b->x), qt_f32(b->s), n / b->C, b->C, 0, 1);
  if (in_place)
    b->x->grad = dq;
  else if (qt_arena_owns(ctx, dq))
    qt_arena_free(ctx, dq, (size_t)n * sizeof(float));
}

static void batch_norm_backward(qt_ctx *ctx, void *p) {
  bn_saved *b = p;
  batch_norm_backward_of(ctx, b);
  if (b->pooled) qt_arena_free(ctx, (void *)b->pool.val, b->pool_bytes);
}

/* Batch norm of x (or of x / s, s per channel, NULL: none) with batch statistics (training) or
 * running ones, followed in training by relu (1) or relu6 (2) when relu. inplace: an unrecorded
 * plain batch norm may write over x. */
static qt_tensor *batch_norm_op(qt_ctx *ctx, const char *name, qt_tensor *x, qt_tensor *s, qt_tensor *gamma,
                                qt_tensor *beta, float *running_mean, float *running_var, int training, float momentum,
                                float eps, int relu, int inplace) {
  check_f32(x, -1, name, "input");
  if (s) check_f32(s, 1, name, "divisor");
  const int C = (int)x->shape[x->ndim - 1];
  const int M = (int)(qt_tensor_numel(x) / (C ? C : 1));
  QT_ASSERT(gamma->shape[0] == C && beta->shape[0] == C && (!s || s->shape[0] == C),
            "%s: %lld/%lld parameters and %lld divisors for %d channels", name, (long long)gamma->shape[0],
            (long long)beta->shape[0], s ? (long long)s->shape[0] : 0LL, C);
  QT_ASSERT(!relu || training, "%s: a fused relu needs training mode", name);
  const int rec = qt_tape_recording(ctx, x, s, gamma) || qt_tape_recording(ctx, beta, NULL, NULL);
  /* Backward reads x, so only an unrecorded batch norm may overwrite it. */
  qt_tensor *y = inplace && !rec && !s && !relu ? qt_tensor_wrap(ctx, QT_F32, x->ndim, x->shape, x->data)
                                                 : qt_tensor_new(ctx, QT_F32, x->ndim, x->shape);
  float *mean = qt_arena_alloc(ctx, (size_t)C * sizeof(float));
  float *invstd = qt_arena_alloc(ctx, (size_t)C * sizeof(float));
  const int64_t n = qt_tensor_numel(x);
  const qt_batch_sync *sync = training && qt_ctx_batch_sync(ctx) && qt_ctx_batch_sync(ctx)->size > 1
                                  ? qt_ctx_batch_sync(ctx)
                                  : NULL;
  uint8_t *mask = relu && rec ? qt_arena_alloc(ctx, (size_t)((n + 7) / 8)) : NULL;
  const float *div = s ? qt_f32(s) : NULL;
  int64_t M_total = M;
  if (training) {
    QT_ASSERT(M > (sync ? 0 : 1), "%s: training needs more than one value per channel (got %d)", name, M);
    qt_batch_norm_relu_forward_train(qt_f32(y), mask, relu == 2, mean, invstd, qt_f32(x), div, qt_f32(gamma),
                                     qt_f32(beta), running_mean, running_var, momentum, eps, M, C, sync, &M_total);
    if (relu && !mask) (relu == 2 ? qt_relu6_forward : qt_relu_forward)(qt_f32(y), qt_f32(y), n);
  } else {
    qt_batch_norm_forward_eval_div(qt_f32(y), qt_f32(x), div, qt_f32(gamma), qt_f32(beta), running_mean, running_var,
                                   eps, M, C);
    if (rec)
      for (int c = 0; c < C; c++) {
        mean[c] = running_mean[c];
        invstd[c] = 1.0f / sqrtf(running_var[c] + eps);
      }
  }
  if (rec) {
    y->requires_grad = 1;
    bn_saved *sv = qt_tape_push(ctx, QT_PROFILE_BATCH_NORM, batch_norm_backward, sizeof *sv, y);
    *sv = (bn_saved){x, s, gamma, beta, y, mean, invstd, mask, training, M, C, sync, M_total, 0, {0}, 0};
    x->saved = gamma->saved = 1;
    if (s) s->saved = 1;
  }
  return y;
}

qt_tensor *qt_batch_norm(qt_ctx *ctx, qt_tensor *x, qt_tensor *gamma, qt_tensor *beta, float *running_mean,
                         float *running_var, int training, float momentum, float eps, int inplace) {
  PROFILED(ctx, QT_PROFILE_BATCH_NORM,
           batch_norm_op(ctx, "batch_norm", x, NULL, gamma, beta, running_mean, running_var, training, momentum, eps,
                         0, inplace));
}

qt_tensor *qt_batch_norm_relu(qt_ctx *ctx, qt_tensor *x, qt_tensor *gamma, qt_tensor *beta, float *running_mean,
                              float *running_var, float momentum, float eps, int six) {
  PROFILED(ctx, QT_PROFILE_BATCH_NORM,
           batch_norm_op(ctx, "batch_norm_relu", x, NULL, gamma, beta, running_mean, running_var, 1, momentum, eps,
                         six ? 2 : 1, 0));
}

qt_tensor *qt_batch_norm_div(qt_ctx *ctx, qt_tensor *x, qt_tensor *s, qt_tensor *gamma, qt_tensor *beta,
                             float *running_mean, float *running_var, int training, float momentum, float eps,
                             int relu) {
  PROFILED(ctx, QT_PROFILE_BATCH_NORM,
           batch_norm_op(ctx, "batch_norm_div", x, s, gamma, beta, running_mean, running_var, training, momentum, eps,
                         relu, 0));
}

/* ---- batch norm + relu (+ fake quant) + max pool as one op --------------------------------- */
typedef enum { BN_POOL_PLAIN, BN_POOL_FIXED, BN_POOL_LSQ } bn_pool_kind;
typedef struct {
  bn_saved bn; /* y NULL; its backward runs from the values handed to it (bn.pooled) */
  qt_tensor *y, *lsq_scale;
  int32_t *argmax;
  float *yarg;    /* LSQ: the relu's output at each argmax input */
  uint8_t *qmask; /* fixed qparams: the clipped STE's and the relu's pass at each argmax input */
  bn_pool_kind kind;
  int relu, N, H, W, K;
  qt_fq_params fq;
  float grad_factor;
} bn_pool_saved;

/* The values at each window's argmax input that the ops in turn would route to the batch norm:
 * the pool's 0 + d (d the pool output's gradient, NULL: none), through the fake quant's backward
 * (LSQ: its scale's gradient added to dscale, may be NULL), masked by the relu (a select, as its
 * backward). m outputs of N images, per_image windows each over C channels of n_in inputs. */
static float *pool_grad_values(qt_ctx *ctx, bn_pool_kind kind, const float *d, const float *out, const float *yarg,
                               const uint8_t *qmask, float *dscale, const qt_fq_params *fq, float grad_factor,
                               int relu, int N, int per_image, int C, int64_t n_in, int64_t m) {
  const size_t bytes = (size_t)m * sizeof(float);
  float *val = qt_arena_alloc(ctx, bytes);
  if (!d) {
    memset(val, 0, bytes);
  } else if (kind == BN_POOL_PLAIN) {
#pragma omp parallel for simd schedule(static) if (m >= 32768)
    for (int64_t i = 0; i < m; i++) val[i] = qt_relu_passes(out[i], relu) ? 0.0f + d[i] : 0.0f;
  } else if (kind == BN_POOL_FIXED) {
#pragma omp parallel for simd schedule(static) if (m >= 32768)
    for (int64_t i = 0; i < m; i++) val[i] = qmask[i] ? 0.0f + d[i] : 0.0f;
  } else {
    qt_fake_quant_lsq_pool_val_backward(val, dscale, d, yarg, N, per_image, C, n_in, fq->scale, fq->zero_point,
                                        fq->qmin, fq->qmax, grad_factor, relu);
  }
  return val;
}

static void bn_pool_backward(qt_ctx *ctx, void *p) {
  bn_pool_saved *s = p;
  /* SyncBN: every process joins the backward sums' reduction, with zeros when no gradient came */
  if (!s->y->grad && !s->bn.sync) return;
  const int64_t m = qt_tensor_numel(s->y);
  const size_t bytes = (size_t)m * sizeof(float);
  const int C = s->bn.C;
  float *val = pool_grad_values(ctx, s->kind, s->y->grad, qt_f32(s->y), s->yarg, s->qmask,
                                s->kind == BN_POOL_LSQ && s->lsq_scale->requires_grad ? qt_tensor_grad(ctx, s->lsq_scale)
                                                                                      : NULL,
                                &s->fq, s->grad_factor, s->relu, s->N, (s->H / s->K) * (s->W / s->K), C,
                                (int64_t)s->N * s->H * s->W * C, m);
  s->bn.pooled = 1;
  s->bn.pool = (qt_pool_grad){val, s->argmax, s->N, s->H, s->W, s->K, s->K, s->bn.x->blocked16};
  s->bn.pool_bytes = bytes;
  batch_norm_backward_of(ctx, &s->bn);
  qt_arena_free(ctx, val, bytes);
}

static qt_tensor *bn_pool_op(qt_ctx *ctx, qt_tensor *x, qt_tensor *div, qt_tensor *gamma, qt_tensor *beta,
                             float *running_mean, float *running_var, float momentum, float eps, int relu,
                             const qt_pool_fake_quant *fq, int kernel) {
  const char *name = "batch_norm_max_pool2d";
  check_f32_any(x, 4, name, "input");
  if (div) check_f32(div, 1, name, "divisor");
  const int N = (int)x->shape[0], H = (int)x->shape[1], W = (int)x->shape[2], C = (int)x->shape[3];
  QT_ASSERT(gamma->shape[0] == C && beta->shape[0] == C && (!div || div->shape[0] == C),
            "%s: %lld/%lld parameters and %lld divisors for %d channels", name, (long long)gamma->shape[0],
            (long long)beta->shape[0], div ? (long long)div->shape[0] : 0LL, C);
  QT_ASSERT(kernel >= 1 && H >= kernel && W >= kernel && H % kernel == 0 && W % kernel == 0 && relu >= 0 && relu <= 2,
            "%s: %dx%d input not tiled by %dx%d windows (or relu %d)", name, H, W, kernel, kernel, relu);
  QT_ASSERT(!fq || (fq->zero_point && (fq->lsq_scale ? fq->lsq_scale->dtype == QT_F32 &&
                                                           qt_tensor_numel(fq->lsq_scale) == 1
                                                     : fq->scale != NULL)),
            "%s: a fake quant needs a zero point and one scale", name);
  QT_ASSERT(!x->blocked16 || qt_batch_norm_pool_takes_blocked(C),
            "%s: a blocked (nChw16c) input of %d channels, which this build's kernels do not take", name, C);
  const int64_t shape[4] = {N, H / kernel, W / kernel, C};
  qt_tensor *y = qt_tensor_new(ctx, QT_F32, 4, shape);
  const int64_t m = qt_tensor_numel(y);
  const bn_pool_kind kind = !fq ? BN_POOL_PLAIN : fq->lsq_scale ? BN_POOL_LSQ : BN_POOL_FIXED;
  const int rec = qt_tape_recording(ctx, x, div, gamma) ||
                  qt_tape_recording(ctx, beta, kind == BN_POOL_LSQ ? fq->lsq_scale : NULL, NULL);
  float *mean = qt_arena_alloc(ctx, (size_t)C * sizeof(float));
  float *invstd = qt_arena_alloc(ctx, (size_t)C * sizeof(float));
  int32_t *argmax = qt_arena_alloc(ctx, (size_t)m * sizeof(int32_t));
  float *yarg = rec && kind == BN_POOL_LSQ ? qt_arena_alloc(ctx, (size_t)m * sizeof(float)) : NULL;
  uint8_t *qmask = rec && kind == BN_POOL_FIXED ? qt_arena_alloc(ctx, (size_t)m) : NULL;
  qt_fq_params fp = {0};
  if (fq)
    fp = (qt_fq_params){kind == BN_POOL_LSQ ? qt_f32(fq->lsq_scale)[0] : fq->scale[0], fq->zero_point[0], fq->qmin,
                        fq->qmax};
  const qt_batch_sync *sync = qt_ctx_batch_sync(ctx) && qt_ctx_batch_sync(ctx)->size > 1 ? qt_ctx_batch_sync(ctx) : NULL;
  const int M = N * H * W;
  QT_ASSERT(M > (sync ? 0 : 1), "%s: training needs more than one value per channel (got %d)", name, M);
  int64_t M_total = M;
  qt_batch_norm_relu_pool_forward_train(qt_f32(y), argmax, yarg, qmask, mean, invstd, qt_f32(x), div ? qt_f32(div) : NULL,
                                        qt_f32(gamma), qt_f32(beta), running_mean, running_var, momentum, eps, N, H, W,
                                        C, x->blocked16, kernel, relu, fq ? &fp : NULL, sync, &M_total);
  if (rec) {
    y->requires_grad = 1;
    bn_pool_saved *sv = qt_tape_push(ctx, QT_PROFILE_BN_MAX_POOL2D, bn_pool_backward, sizeof *sv, y);
    *sv = (bn_pool_saved){{x, div, gamma, beta, NULL, mean, invstd, NULL, 1, M, C, sync, M_total, 0, {0}, 0},
                          y,
                          kind == BN_POOL_LSQ ? fq->lsq_scale : NULL,
                          argmax,
                          yarg,
                          qmask,
                          kind,
                          relu,
                          N,
                          H,
                          W,
                          kernel,
                          fp,
                          fq ? fq->grad_factor : 0.0f};
    x->saved = gamma->saved = y->saved = 1; /* y: the plain pool's backward reads the relu's pass off it */
    if (div) div->saved = 1;
    if (kind == BN_POOL_LSQ) fq->lsq_scale->saved = 1;
  } else {
    qt_arena_free(ctx, argmax, (size_t)m * sizeof(int32_t)); /* only backward reads the indices */
  }
  return y;
}

int qt_batch_norm_relu_max_pool2d_takes_blocked(int C) { return qt_batch_norm_pool_takes_blocked(C); }

qt_tensor *qt_batch_norm_relu_max_pool2d(qt_ctx *ctx, qt_tensor *x, qt_tensor *div, qt_tensor *gamma, qt_tensor *beta,
                                         float *running_mean, float *running_var, float momentum, float eps, int relu,
                                         const qt_pool_fake_quant *fq, int kernel) {
  PROFILED(ctx, QT_PROFILE_BN_MAX_POOL2D,
           bn_pool_op(ctx, x, div, gamma, beta, running_mean, running_var, momentum, eps, relu, fq, kernel));
}

/* ---- conv2d of an image + batch norm + relu (+ fake quant) + max pool as one op ----------- */
typedef struct {
  qt_tensor *x, *w, *b, *div, *gamma, *beta, *y;
  qt_pool_fake_quant xq; /* the image's fake quant (xq.zero_point NULL: none) */
  const float *img;      /* the convolution's input: x, or its fake quant */
  const float *weff;     /* the convolution's weights: w, or w / div */
  uint8_t *argmax, *qmask;
  float *yarg;
  double *stats;
  bn_pool_kind kind;
  qt_tensor *lsq_scale; /* the activations' LSQ scale */
  qt_fq_params fq;
  float grad_factor;
  qt_conv1_pool_shape shape;
} conv1_pool_saved;

/* The kernels' backward gives the gradient of the weights the convolution ran with (w / div):
 * w's is that over div, div's minus the sum over the channel's taps of that times w / div^2. */
static void conv1_pool_backward(qt_ctx *ctx, void *p) {
  conv1_pool_saved *s = p;
  if (!s->y->grad) return;
  const qt_conv1_pool_shape *sh = &s->shape;
  const int OC = sh->OC, K = sh->KH * sh->KW;
  const int64_t n_img = (int64_t)sh->N * sh->H * sh->W;
  /* the values the pool's, the fake quant's and the relu's backward route to the batch norm are
   * formed inside the kernel's pass (pool_grad_values' operations, bit for bit), not in a buffer */
  float *das = s->kind == BN_POOL_LSQ && s->lsq_scale->requires_grad ? qt_tensor_grad(ctx, s->lsq_scale) : NULL;
  double das_sum = 0;
  const qt_conv1_pool_grad pg = {NULL,
                                 s->y->grad,
                                 qt_f32(s->y),
                                 s->kind == BN_POOL_FIXED ? s->qmask : NULL,
                                 s->kind == BN_POOL_LSQ ? s->yarg : NULL,
                                 s->fq,
                                 s->grad_factor,
                                 das ? &das_sum : NULL,
                                 (int64_t)sh->N * sh->OH * sh->OW * OC};
  const int want_s = s->xq.zero_point && s->xq.lsq_scale && s->xq.lsq_scale->requires_grad;
  float *coef = want_s ? qt_arena_alloc(ctx, (size_t)n_img * sizeof(float)) : NULL;
  if (coef)
    qt_fake_quant_lsq_scale_coef(coef, qt_f32(s->x), n_img, qt_f32(s->xq.lsq_scale)[0], s->xq.zero_point[0],
                                 s->xq.qmin, s->xq.qmax);
  const int want_w = s->w->requires_grad || (s->div && s->div->requires_grad);
  double *dwe = want_w ? qt_arena_alloc(ctx, (size_t)OC * K * sizeof(double)) : NULL, dscale = 0;
  float *dg = s->gamma->requires_grad ? qt_tensor_grad(ctx, s->gamma) : NULL;
  float *dbeta = s->beta->requires_grad ? qt_tensor_grad(ctx, s->beta) : NULL;
  qt_conv1_bn_relu_pool_backward(dwe, dg, dbeta, coef ? &dscale : NULL, &pg, s->argmax, s->stats, s->img, s->weff,
                                 qt_f32(s->gamma), coef, sh);
  if (das) das[0] += (float)das_sum;
  if (s->b && s->b->requires_grad) qt_tensor_grad(ctx, s->b); /* exactly 0: batch norm removes the mean */
  if (dwe) {
    const float *w = qt_f32(s->w), *div = s->div ? qt_f32(s->div) : NULL;
    float *dw = s->w->requires_grad ? qt_tensor_grad(ctx, s->w) : NULL;
    float *ddiv = s->div && s->div->requires_grad ? qt_tensor_grad(ctx, s->div) : NULL;
    for (int oc = 0; oc < OC; oc++) {
      const double d = div ? (double)div[oc] : 1.0;
      double sum = 0;
      for (int t = 0; t < K; t++) {
        const double v = dwe[(size_t)oc * K + t];
        if (dw) dw[(size_t)oc * K + t] += (float)(v / d);
        sum += v * (double)w[(size_t)oc * K + t];
      }
      if (ddiv) ddiv[oc] += (float)(-sum / (d * d));
    }
    qt_arena_free(ctx, dwe, (size_t)OC * K * sizeof(double));
  }
  if (coef) {
    qt_tensor_grad(ctx, s->xq.lsq_scale)[0] += (float)(dscale * s->xq.grad_factor);
    qt_arena_free(ctx, coef, (size_t)n_img * sizeof(float));
  }
}

int qt_conv1_bn_relu_max_pool2d_takes(int N, int H, int W, int OC, int KH, int KW, int pad_h, int pad_w, int relu,
                                      int kernel) {
  qt_conv1_pool_shape sh = {N, H, W, OC, KH, KW, pad_h, pad_w, kernel, relu, 0, 0, 0};
  return qt_conv1_pool_shape_init(&sh) == 0;
}

static qt_tensor *conv1_pool_op(qt_ctx *ctx, qt_tensor *x, const qt_pool_fake_quant *xq, qt_tensor *w, qt_tensor *b,
                                qt_tensor *div, qt_tensor *gamma, qt_tensor *beta, float *running_mean,
                                float *running_var, float momentum, float eps, int pad_h, int pad_w, int relu,
                                const qt_pool_fake_quant *fq, int kernel, int out_blocked) {
  const char *name = "conv1_bn_relu_max_pool2d";
  check_f32(x, 4, name, "input");
  check_f32(w, 4, name, "weight");
  if (b) check_f32(b, 1, name, "bias");
  if (div) check_f32(div, 1, name, "divisor");
  check_f32(gamma, 1, name, "gamma");
  check_f32(beta, 1, name, "beta");
  qt_conv1_pool_shape sh = {(int)x->shape[0], (int)x->shape[1], (int)x->shape[2], (int)w->shape[0], (int)w->shape[2],
                            (int)w->shape[3], pad_h, pad_w, kernel, relu, out_blocked != 0, 0, 0};
  QT_ASSERT(x->shape[3] == 1 && w->shape[1] == 1 && qt_conv1_pool_shape_init(&sh) == 0,
            "%s: input (%lld, %lld, %lld, %lld) and weight (%lld, %lld, %lld, %lld) with padding %d, %d, pool %d and "
            "relu %d: want one input channel, OC %% 16 == 0, at most %d taps and pool windows tiling the output",
            name, (long long)x->shape[0], (long long)x->shape[1], (long long)x->shape[2], (long long)x->shape[3],
            (long long)w->shape[0], (long long)w->shape[1], (long long)w->shape[2], (long long)w->shape[3], pad_h,
            pad_w, kernel, relu, QT_CONV1_POOL_MAX_TAPS);
  const int OC = sh.OC, K = sh.KH * sh.KW;
  QT_ASSERT(gamma->shape[0] == OC && beta->shape[0] == OC && (!b || b->shape[0] == OC) && (!div || div->shape[0] == OC),
            "%s: %lld/%lld batch norm parameters, %lld biases and %lld divisors for %d channels", name,
            (long long)gamma->shape[0], (long long)beta->shape[0], b ? (long long)b->shape[0] : 0LL,
            div ? (long long)div->shape[0] : 0LL, OC);
  QT_ASSERT(!x->requires_grad, "%s: computes no input gradient, and the input needs one", name);
  QT_ASSERT(!(qt_ctx_batch_sync(ctx) && qt_ctx_batch_sync(ctx)->size > 1),
            "%s: batch statistics across processes (SyncBN) are not implemented here", name);
  for (int q = 0; q < 2; q++) {
    const qt_pool_fake_quant *f = q ? fq : xq;
    QT_ASSERT(!f || (f->zero_point && (f->lsq_scale ? f->lsq_scale->dtype == QT_F32 && qt_tensor_numel(f->lsq_scale) == 1
                                                    : f->scale != NULL)),
              "%s: the %s fake quant needs a zero point and one scale", name, q ? "activations'" : "image's");
  }
  const int64_t shape[4] = {sh.N, sh.OH / kernel, sh.OW / kernel, OC};
  qt_tensor *y = qt_tensor_new(ctx, QT_F32, 4, shape);
  y->blocked16 = sh.out_blocked;
  const int64_t m = qt_tensor_numel(y), n_img = (int64_t)sh.N * sh.H * sh.W;
  const bn_pool_kind kind = !fq ? BN_POOL_PLAIN : fq->lsq_scale ? BN_POOL_LSQ : BN_POOL_FIXED;
  qt_tensor *xs = xq ? xq->lsq_scale : NULL, *as = kind == BN_POOL_LSQ ? fq->lsq_scale : NULL;
  const int rec = qt_tape_recording(ctx, w, b, div) || qt_tape_recording(ctx, gamma, beta, xs) ||
                  qt_tape_recording(ctx, as, NULL, NULL);
  /* the image and the weights the convolution runs with */
  float *img = xq ? qt_arena_alloc(ctx, (size_t)n_img * sizeof(float)) : qt_f32(x);
  if (xq)
    qt_fake_quant_forward(img, NULL, qt_f32(x), n_img, 1, 1, xs ? qt_f32(xs) : xq->scale, xq->zero_point, xq->qmin,
                          xq->qmax);
  float *weff = div ? qt_arena_alloc(ctx, (size_t)OC * K * sizeof(float)) : qt_f32(w);
  if (div)
    for (int oc = 0; oc < OC; oc++)
      for (int t = 0; t < K; t++) weff[(size_t)oc * K + t] = qt_f32(w)[(size_t)oc * K + t] / qt_f32(div)[oc];
  uint8_t *argmax = qt_arena_alloc(ctx, (size_t)m);
  float *yarg = rec && kind == BN_POOL_LSQ ? qt_arena_alloc(ctx, (size_t)m * sizeof(float)) : NULL;
  uint8_t *qmask = rec && kind == BN_POOL_FIXED ? qt_arena_alloc(ctx, (size_t)m) : NULL;
  qt_fq_params fp = {0};
  if (fq) fp = (qt_fq_params){as ? qt_f32(as)[0] : fq->scale[0], fq->zero_point[0], fq->qmin, fq->qmax};
  const size_t nstats = qt_conv1_pool_stats_len(&sh);
  double *stats = qt_arena_alloc(ctx, nstats * sizeof(double));
  qt_conv1_bn_relu_pool_forward_train(qt_f32(y), argmax, yarg, qmask, stats, img, weff,
                                      b ? qt_f32(b) : NULL, qt_f32(gamma), qt_f32(beta), running_mean, running_var,
                                      momentum, eps, fq ? &fp : NULL, &sh);
  if (rec) {
    y->requires_grad = 1;
    conv1_pool_saved *sv = qt_tape_push(ctx, QT_PROFILE_CONV1_BN_MAX_POOL2D, conv1_pool_backward, sizeof *sv, y);
    *sv = (conv1_pool_saved){x,      w,     b,    div,    gamma, beta, y,  xq ? *xq : (qt_pool_fake_quant){0},
                             img,    weff,  argmax, qmask, yarg,  stats, kind, as,
                             fp,     fq ? fq->grad_factor : 0.0f, sh};
    /* y: the plain pool's backward reads the relu's pass off it; img and weff: arena buffers
     * of this entry (or x's and w's data) */
    x->saved = w->saved = gamma->saved = beta->saved = y->saved = 1;
    if (b) b->saved = 1;
    if (div) div->saved = 1;
    if (xs) xs->saved = 1;
    if (as) as->saved = 1;
  } else {
    qt_arena_free(ctx, stats, nstats * sizeof(double));
    qt_arena_free(ctx, argmax, (size_t)m);
    if (div) qt_arena_free(ctx, weff, (size_t)OC * K * sizeof(float));
    if (xq) qt_arena_free(ctx, img, (size_t)n_img * sizeof(float));
  }
  return y;
}

qt_tensor *qt_conv1_bn_relu_max_pool2d(qt_ctx *ctx, qt_tensor *x, const qt_pool_fake_quant *xq, qt_tensor *w,
                                       qt_tensor *b, qt_tensor *div, qt_tensor *gamma, qt_tensor *beta,
                                       float *running_mean, float *running_var, float momentum, float eps, int pad_h,
                                       int pad_w, int relu, const qt_pool_fake_quant *fq, int kernel,
                                       int out_blocked) {
  PROFILED(ctx, QT_PROFILE_CONV1_BN_MAX_POOL2D,
           conv1_pool_op(ctx, x, xq, w, b, div, gamma, beta, running_mean, running_var, momentum, eps, pad_h, pad_w,
                         relu, fq, kernel, out_blocked));
}

typedef struct {
  qt_tensor *x, *b, *y;
} ca_saved;

static void channel_add_backward(qt_ctx *ctx, void *p) {
  ca_saved *sv = p;
  if (!sv->y->grad) return;
  const int C = (int)sv->b->shape[0];
  const int64_t n = qt_tensor_numel(sv->y), rows = n / C;
  if (sv->x->requires_grad) qt_add_backward(qt_tensor_grad(ctx, sv->x), NULL, sv->y->grad, n);
  if (sv->b->requires_grad) {
    float *db = qt_tensor_grad(ctx, sv->b);
    double *acc = calloc((size_t)C, sizeof(double));
    QT_ASSERT(acc, "out of memory");
    for (int64_t r = 0; r < rows; r++)
      for (int c = 0; c < C; c++) acc[c] += sv->y->grad[r * C + c];
    for (int c = 0; c < C; c++) db[c] += (float)acc[c];
    free(acc);
  }
}

static qt_tensor *channel_add_op(qt_ctx *ctx, qt_tensor *x, qt_tensor *b) {
  check_f32(x, -1, "channel_add", "input");
  const int C = (int)b->shape[0];
  QT_ASSERT(x->shape[x->ndim - 1] == C, "channel_add: %d biases for %lld channels", C,
            (long long)x->shape[x->ndim - 1]);
  qt_tensor *y = qt_tensor_new(ctx, QT_F32, x->ndim, x->shape);
  const int64_t rows = qt_tensor_numel(x) / C;
  float *yd = qt_f32(y);
  const float *xd = qt_f32(x), *bd = qt_f32(b);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; r++)
    for (int c = 0; c < C; c++) yd[r * C + c] = xd[r * C + c] + bd[c];
  if (qt_tape_recording(ctx, x, b, NULL)) {
    y->requires_grad = 1;
    ca_saved *sv = qt_tape_push(ctx, QT_PROFILE_CHANNEL_ADD, channel_add_backward, sizeof *sv, y);
    *sv = (ca_saved){x, b, y};
  }
  return y;
}

qt_tensor *qt_channel_add(qt_ctx *ctx, qt_tensor *x, qt_tensor *b) {
  PROFILED(ctx, QT_PROFILE_CHANNEL_ADD, channel_add_op(ctx, x, b));
}

void qt_bn_scale_factor_values(float *sf, const float *gamma, const float *running_var, float eps, int C) {
  for (int c = 0; c < C; c++) sf[c] = gamma[c] / sqrtf(running_var[c] + eps);
}

void qt_bn_fold(float *Wf, float *bf, const float *W, const float *b, const float *gamma, const float *beta,
                const float *mean, const float *var, float eps, int OC, int64_t inner) {
  float *sf = malloc((size_t)OC * sizeof(float));
  QT_ASSERT(sf, "out of memory");
  qt_bn_scale_factor_values(sf, gamma, var, eps, OC);
  for (int o = 0; o < OC; o++) {
    if (Wf)
      for (int64_t k = 0; k < inner; k++) Wf[o * inner + k] = W[o * inner + k] * sf[o];
    if (bf) bf[o] = beta[o] + ((b ? b[o] : 0.0f) - mean[o]) * sf[o];
  }
  free(sf);
}

typedef struct {
  qt_tensor *gamma, *sf;
  const float *running_var;
  float eps;
} sf_saved;

static void bn_scale_factor_backward(qt_ctx *ctx, void *p) {
  sf_saved *sv = p;
  if (!sv->sf->grad || !sv->gamma->requires_grad) return;
  float *dg = qt_tensor_grad(ctx, sv->gamma);
  const int C = (int)sv->gamma->shape[0];
  for (int c = 0; c < C; c++) dg[c] += sv->sf->grad[c] / sqrtf(sv->running_var[c] + sv->eps);
}

static qt_tensor *bn_scale_factor_op(qt_ctx *ctx, qt_tensor *gamma, const float *running_var, float eps) {
  check_f32(gamma, 1, "bn_scale_factor", "gamma");
  qt_tensor *sf = qt_tensor_new(ctx, QT_F32, 1, gamma->shape);
  qt_bn_scale_factor_values(qt_f32(sf), qt_f32(gamma), running_var, eps, (int)gamma->shape[0]);
  if (qt_tape_recording(ctx, gamma, NULL, NULL)) {
    sf->requires_grad = 1;
    /* running_var changes in place during the step's BN forward; backward needs the value
     * used here, so keep a copy. */
    float *rv = qt_arena_alloc(ctx, (size_t)gamma->shape[0] * sizeof(float));
    memcpy(rv, running_var, (size_t)gamma->shape[0] * sizeof(float));
    sf_saved *sv = qt_tape_push(ctx, QT_PROFILE_BN_SCALE_FACTOR, bn_scale_factor_backward, sizeof *sv, sf);
    *sv = (sf_saved){gamma, sf, rv, eps};
  }
  return sf;
}

qt_tensor *qt_bn_scale_factor(qt_ctx *ctx, qt_tensor *gamma, const float *running_var, float eps) {
  PROFILED(ctx, QT_PROFILE_BN_SCALE_FACTOR, bn_scale_factor_op(ctx, gamma, running_var, eps));
}
