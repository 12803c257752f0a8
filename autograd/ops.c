/* Plain differentiable ops (ops_int.h): conv2d, relu / relu6, pooling, flatten, linear, add,
 * channel add, softmax cross-entropy. */
#include "autograd/ops_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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
  qt_conv2d_shape s = conv_shape_of(x, w, stride_h, stride_w, pad_h, pad_w, groups);
  QT_ASSERT(groups >= 1 && w->shape[1] * groups == x->shape[3],
            "conv2d: weight in-channels %lld x groups %d != input channels %lld", (long long)w->shape[1], groups,
            (long long)x->shape[3]);
  QT_ASSERT(!b || (b->ndim == 1 && b->shape[0] == w->shape[0]), "conv2d: bias shape does not match %d outputs", s.OC);
  QT_ASSERT(qt_conv2d_shape_init(&s) == 0, "conv2d: invalid shape (input %dx%d, kernel %dx%d, stride %d, pad %d)", s.H,
            s.W, s.KH, s.KW, stride_h, pad_h);
  int64_t shape[4] = {s.N, s.OH, s.OW, s.OC};
  qt_tensor *y = qt_tensor_new(ctx, QT_F32, 4, shape);
  const int recording = qt_tape_recording(ctx, x, w, b);
  /* a blocked input came from a producer that asked qt_conv2d_takes_blocked: the Winograd kernels
   * then, recorded or not (every parameter frozen) */
  s.winograd = (recording || x->blocked16) && ctx->conv_winograd;
  s.src_blocked = x->blocked16; /* the kernel refuses it where its primitives do not run on it */
  /* a blocked output only where recorded (nothing but the backward reads the layout's choice) */
  y->blocked16 = s.dst_blocked =
      to_blocked && recording && s.winograd && ctx->blocked_handoff && s.OC % 16 == 0 && qt_conv2d_dst_blocked16(&s);
  qt_conv2d_forward(qt_f32(y), qt_f32(x), qt_f32(w), b ? qt_f32(b) : NULL, &s);
  if (recording) {
    y->requires_grad = 1;
    conv_saved *sv = qt_tape_push(ctx, QT_PROFILE_CONV2D, conv2d_backward, sizeof *sv, y);
    *sv = (conv_saved){x, w, b, y, s};
    x->saved = w->saved = 1;
  }
  return y;
}

qt_tensor *qt_conv2d(qt_ctx *ctx, qt_tensor *x, qt_tensor *w, qt_tensor *b, int stride_h, int stride_w, int pad_h,
                     int pad_w, int groups) {
  PROFILED(ctx, QT_PROFILE_CONV2D, conv2d_op(ctx, x, w, b, stride_h, stride_w, pad_h, pad_w, groups, 0));
}

qt_tensor *qt_conv2d_to_blocked(qt_ctx *ctx, qt_tensor *x, qt_tensor *w, qt_tensor *b, int stride_h, int stride_w,
                                int pad_h, int pad_w, int groups) {
  PROFILED(ctx, QT_PROFILE_CONV2D, conv2d_op(ctx, x, w, b, stride_h, stride_w, pad_h, pad_w, groups, 1));
}

int qt_conv2d_takes_blocked(const qt_ctx *ctx, const int64_t x_shape[4], const int64_t w_shape[4], int stride_h,
                            int stride_w, int pad_h, int pad_w, int groups) {
  qt_conv2d_shape s = {.N = (int)x_shape[0],
                       .H = (int)x_shape[1],
                       .W = (int)x_shape[2],
                       .C = (int)x_shape[3],
                       .OC = (int)w_shape[0],
                       .KH = (int)w_shape[2],
                       .KW = (int)w_shape[3],
                       .stride_h = stride_h,
                       .stride_w = stride_w,
                       .pad_h = pad_h,
                       .pad_w = pad_w,
                       .groups = groups,
                       .winograd = 1};
  return ctx->grad_enabled && ctx->conv_winograd && ctx->blocked_handoff && groups >= 1 &&
         w_shape[1] * groups == x_shape[3] && qt_conv2d_shape_init(&s) == 0 && qt_conv2d_src_blocked16(&s);
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
  qt_tensor *y =
      inplace ? qt_tensor_wrap(ctx, QT_F32, x->ndim, x->shape, x->data) : qt_tensor_new(ctx, QT_F32, x->ndim, x->shape);
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

typedef struct {
  qt_tensor *x, *y;
  int32_t *argmax;
  qt_pool2d_shape s;
  int avg;
  bn_saved *bn; /* qt_bn_before_pool */
} pool_saved;

static void pool2d_backward(qt_ctx *ctx, void *p) {
  pool_saved *s = p;
  if (!s->y->grad || !s->x->requires_grad) return;
  const int64_t m = qt_tensor_numel(s->y);
  if (s->avg) {
    qt_avg_pool2d_backward(qt_tensor_grad(ctx, s->x), s->y->grad, &s->s);
  } else if (qt_pool_hand_to_bn(ctx, s->bn, s->x, s->y->grad, (size_t)m * sizeof(float), s->argmax, s->s.KH)) {
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

static qt_tensor *pool2d(qt_ctx *ctx, qt_tensor *x, int kernel, int stride, int pad, int ceil_mode, int avg) {
  const char *op = avg ? "avg_pool2d" : "max_pool2d";
  check_f32(x, 4, op, "input");
  qt_pool2d_shape s = {.N = (int)x->shape[0],
                       .H = (int)x->shape[1],
                       .W = (int)x->shape[2],
                       .C = (int)x->shape[3],
                       .KH = kernel,
                       .KW = kernel,
                       .stride_h = stride,
                       .stride_w = stride,
                       .pad_h = pad,
                       .pad_w = pad,
                       .ceil_mode = ceil_mode};
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
    bn_saved *bn = qt_bn_before_pool(ctx, x, tiles);
    y->requires_grad = 1;
    pool_saved *sv =
        qt_tape_push(ctx, avg ? QT_PROFILE_AVG_POOL2D : QT_PROFILE_MAX_POOL2D, pool2d_backward, sizeof *sv, y);
    *sv = (pool_saved){x, y, argmax, s, avg, bn};
  }
  return y;
}

qt_tensor *qt_max_pool2d(qt_ctx *ctx, qt_tensor *x, int kernel, int stride, int pad, int ceil_mode) {
  PROFILED(ctx, QT_PROFILE_MAX_POOL2D, pool2d(ctx, x, kernel, stride, pad, ceil_mode, 0));
}
qt_tensor *qt_avg_pool2d(qt_ctx *ctx, qt_tensor *x, int kernel, int stride, int pad, int ceil_mode) {
  PROFILED(ctx, QT_PROFILE_AVG_POOL2D, pool2d(ctx, x, kernel, stride, pad, ceil_mode, 1));
}

typedef struct {
  qt_tensor *x, *y;
} unary_saved;

static void global_avg_pool_backward(qt_ctx *ctx, void *p) {
  unary_saved *s = p;
  if (!s->y->grad || !s->x->requires_grad) return;
  int fresh = 0;
  float *dx = qt_tensor_grad_for_write(ctx, s->x, &fresh);
  qt_global_avg_pool_backward(dx, fresh, s->y->grad, (int)s->x->shape[0], (int)(s->x->shape[1] * s->x->shape[2]),
                              (int)s->x->shape[3]);
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
    s->x->grad = s->y->grad;                    /* same memory order: share the gradient buffer */
    if (ctx->backward_frees) s->y->grad = NULL; /* the buffer is the input's now */
    return;
  }
  qt_add_backward(s->x->grad, 0, NULL, 0, s->y->grad, qt_tensor_numel(s->y));
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

/* Both inputs' gradients are the output's. With frees on, the output's gradient is dead after
 * this entry: the first input without a gradient yet takes its buffer, and the other input's is
 * written (fresh) or added to. */
static void add_backward(qt_ctx *ctx, void *p) {
  add_saved *s = p;
  if (!s->y->grad) return;
  const float *dout = s->y->grad;
  const int64_t n = qt_tensor_numel(s->y);
  if (s->a == s->b) { /* a + a */
    if (s->a->requires_grad) qt_add_backward(qt_tensor_grad(ctx, s->a), 0, qt_tensor_grad(ctx, s->a), 0, dout, n);
    return;
  }
  qt_tensor *a = s->a->requires_grad ? s->a : NULL, *b = s->b->requires_grad ? s->b : NULL;
  qt_tensor **take = !ctx->backward_frees ? NULL : a && !a->grad ? &a : b && !b->grad ? &b : NULL;
  if (take) {
    (*take)->grad = s->y->grad;
    s->y->grad = NULL; /* the buffer is the input's now */
    *take = NULL;
  }
  int a_fresh = 0, b_fresh = 0;
  float *da = a ? qt_tensor_grad_for_write(ctx, a, &a_fresh) : NULL;
  float *db = b ? qt_tensor_grad_for_write(ctx, b, &b_fresh) : NULL;
  if (da || db) qt_add_backward(da, a_fresh, db, b_fresh, dout, n);
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
    QT_ASSERT(labels[i] >= 0 && labels[i] < C, "cross_entropy: label %d of sample %d outside [0, %d)", labels[i], i, C);
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

typedef struct {
  qt_tensor *x, *b, *y;
} ca_saved;

static void channel_add_backward(qt_ctx *ctx, void *p) {
  ca_saved *sv = p;
  if (!sv->y->grad) return;
  const int C = (int)qt_tensor_numel(sv->b);
  const int64_t n = qt_tensor_numel(sv->y), rows = n / C;
  if (sv->x->requires_grad) qt_add_backward(qt_tensor_grad(ctx, sv->x), 0, NULL, 0, sv->y->grad, n);
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
  QT_ASSERT(b->ndim >= 1 && b->ndim < x->ndim, "channel_add: an addend of rank %d for an input of rank %d", b->ndim,
            x->ndim);
  for (int d = 0; d < b->ndim; d++)
    QT_ASSERT(b->shape[d] == x->shape[x->ndim - b->ndim + d],
              "channel_add: the addend's dim %d is %lld, the input's matching dim %lld", d, (long long)b->shape[d],
              (long long)x->shape[x->ndim - b->ndim + d]);
  const int C = (int)qt_tensor_numel(b);
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
