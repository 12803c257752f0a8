/* Batch norm and the ops fused around it (ops_int.h): batch norm (plain, with its relu, of x / s),
 * batch norm + relu (+ fake quant) + max pool, conv2d of an image + batch norm + relu + max pool,
 * and BN folding. */
#include "autograd/ops_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A max pool whose windows tile its input x (stride = kernel, no padding) may skip x's gradient
 * when x is the output of a batch norm in training mode recorded just before it (the tape's last
 * entry): nothing recorded between them reads x, so when the pool's backward runs and x has no
 * gradient yet (every later consumer's backward has run), the pool is x's only consumer with a
 * gradient and the batch norm's backward runs next. It then hands the batch norm the gradient as
 * each window's argmax value (qt_pool_hand_to_bn), and the batch norm's backward selects it row by
 * row (qt_batch_norm_relu_backward_pooled): the same numbers without the input-sized gradient,
 * which only the batch norm would read. Returns that batch norm's state, else NULL. */
bn_saved *qt_bn_before_pool(const qt_ctx *ctx, const qt_tensor *x, int tiles) {
  if (!tiles || ctx->tape_len == 0) return NULL;
  const qt_tape_entry *e = &ctx->tape[ctx->tape_len - 1];
  if (e->out != x || e->fn != qt_batch_norm_tape_backward) return NULL;
  bn_saved *b = e->saved;
  return b->training && x->ndim == 4 ? b : NULL;
}

/* In the pool's backward: whether its gradient goes to bn (qt_bn_before_pool) as val, arena memory
 * of one float per pool output, the value at each window's argmax input (the caller fills it
 * after a yes). Only with backward frees on: then no caller reads x's gradient after backward. */
int qt_pool_hand_to_bn(qt_ctx *ctx, bn_saved *bn, const qt_tensor *x, float *val, size_t val_bytes,
                       const int32_t *argmax, int kernel) {
  if (!bn || x->grad || !ctx->backward_frees) return 0;
  bn->pooled = 1;
  bn->pool = (qt_pool_grad){val, argmax, (int)x->shape[0], (int)x->shape[1], (int)x->shape[2], kernel, kernel, 0};
  bn->pool_bytes = val_bytes;
  return 1;
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
     * the sums behind s's (qt_channel_scale_grads' last step) */
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
  float *dq = !want_q                             ? NULL
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
  qt_channel_scale_grads(dx, in_place, ds, dq, qt_f32(b->x), qt_f32(b->s), n / b->C, b->C, 0, 1);
  if (in_place)
    b->x->grad = dq;
  else if (qt_arena_owns(ctx, dq))
    qt_arena_free(ctx, dq, (size_t)n * sizeof(float));
}

void qt_batch_norm_tape_backward(qt_ctx *ctx, void *p) {
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
  const qt_batch_sync *sync =
      training && qt_ctx_batch_sync(ctx) && qt_ctx_batch_sync(ctx)->size > 1 ? qt_ctx_batch_sync(ctx) : NULL;
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
    bn_saved *sv = qt_tape_push(ctx, QT_PROFILE_BATCH_NORM, qt_batch_norm_tape_backward, sizeof *sv, y);
    *sv = (bn_saved){x, s, gamma, beta, y, mean, invstd, mask, training, M, C, sync, M_total, 0, {0}, 0};
    x->saved = gamma->saved = 1;
    if (s) s->saved = 1;
  }
  return y;
}

qt_tensor *qt_batch_norm(qt_ctx *ctx, qt_tensor *x, qt_tensor *gamma, qt_tensor *beta, float *running_mean,
                         float *running_var, int training, float momentum, float eps, int inplace) {
  PROFILED(ctx, QT_PROFILE_BATCH_NORM,
           batch_norm_op(ctx, "batch_norm", x, NULL, gamma, beta, running_mean, running_var, training, momentum, eps, 0,
                         inplace));
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
                               const uint8_t *qmask, float *dscale, const qt_fq_params *fq, float grad_factor, int relu,
                               int N, int per_image, int C, int64_t n_in, int64_t m) {
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
  float *val = pool_grad_values(
      ctx, s->kind, s->y->grad, qt_f32(s->y), s->yarg, s->qmask,
      s->kind == BN_POOL_LSQ && s->lsq_scale->requires_grad ? qt_tensor_grad(ctx, s->lsq_scale) : NULL, &s->fq,
      s->grad_factor, s->relu, s->N, (s->H / s->K) * (s->W / s->K), C, (int64_t)s->N * s->H * s->W * C, m);
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
  QT_ASSERT(
      !fq || (fq->zero_point && (fq->lsq_scale ? fq->lsq_scale->dtype == QT_F32 && qt_tensor_numel(fq->lsq_scale) == 1
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
  const qt_batch_sync *sync =
      qt_ctx_batch_sync(ctx) && qt_ctx_batch_sync(ctx)->size > 1 ? qt_ctx_batch_sync(ctx) : NULL;
  const int M = N * H * W;
  QT_ASSERT(M > (sync ? 0 : 1), "%s: training needs more than one value per channel (got %d)", name, M);
  int64_t M_total = M;
  qt_batch_norm_relu_pool_forward_train(qt_f32(y), argmax, yarg, qmask, mean, invstd, qt_f32(x),
                                        div ? qt_f32(div) : NULL, qt_f32(gamma), qt_f32(beta), running_mean,
                                        running_var, momentum, eps, N, H, W, C, x->blocked16, kernel, relu,
                                        fq ? &fp : NULL, sync, &M_total);
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
  const qt_batch_sync *sync; /* SyncBN: the forward's processes */
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
    qt_fake_quant_lsq_scale_coef(coef, qt_f32(s->x), n_img, qt_f32(s->xq.lsq_scale)[0], s->xq.zero_point[0], s->xq.qmin,
                                 s->xq.qmax);
  const int want_w = s->w->requires_grad || (s->div && s->div->requires_grad);
  double *dwe = want_w ? qt_arena_alloc(ctx, (size_t)OC * K * sizeof(double)) : NULL, dscale = 0;
  float *dg = s->gamma->requires_grad ? qt_tensor_grad(ctx, s->gamma) : NULL;
  float *dbeta = s->beta->requires_grad ? qt_tensor_grad(ctx, s->beta) : NULL;
  qt_conv1_bn_relu_pool_backward(dwe, dg, dbeta, coef ? &dscale : NULL, &pg, s->argmax, s->stats, s->img, s->weff,
                                 qt_f32(s->gamma), coef, s->sync, sh);
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
  qt_conv1_pool_shape sh = {(int)x->shape[0],
                            (int)x->shape[1],
                            (int)x->shape[2],
                            (int)w->shape[0],
                            (int)w->shape[2],
                            (int)w->shape[3],
                            pad_h,
                            pad_w,
                            kernel,
                            relu,
                            out_blocked != 0,
                            0,
                            0};
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
  const qt_batch_sync *sync =
      qt_ctx_batch_sync(ctx) && qt_ctx_batch_sync(ctx)->size > 1 ? qt_ctx_batch_sync(ctx) : NULL;
  for (int q = 0; q < 2; q++) {
    const qt_pool_fake_quant *f = q ? fq : xq;
    QT_ASSERT(
        !f || (f->zero_point &&
               (f->lsq_scale ? f->lsq_scale->dtype == QT_F32 && qt_tensor_numel(f->lsq_scale) == 1 : f->scale != NULL)),
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
  qt_conv1_bn_relu_pool_forward_train(qt_f32(y), argmax, yarg, qmask, stats, img, weff, b ? qt_f32(b) : NULL,
                                      qt_f32(gamma), qt_f32(beta), running_mean, running_var, momentum, eps,
                                      fq ? &fp : NULL, sync, &sh);
  if (rec) {
    y->requires_grad = 1;
    conv1_pool_saved *sv = qt_tape_push(ctx, QT_PROFILE_CONV1_BN_MAX_POOL2D, conv1_pool_backward, sizeof *sv, y);
    *sv =
        (conv1_pool_saved){x,      w,     b,    div,   gamma, beta, y,  xq ? *xq : (qt_pool_fake_quant){0}, img, weff,
                           argmax, qmask, yarg, stats, kind,  as,   fp, fq ? fq->grad_factor : 0.0f,        sh,  sync};
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
                                       int pad_w, int relu, const qt_pool_fake_quant *fq, int kernel, int out_blocked) {
  PROFILED(ctx, QT_PROFILE_CONV1_BN_MAX_POOL2D,
           conv1_pool_op(ctx, x, xq, w, b, div, gamma, beta, running_mean, running_var, momentum, eps, pad_h, pad_w,
                         relu, fq, kernel, out_blocked));
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

/* ---- the gradients of a per-channel scale (channel_scale, and batch norm of x / s) ----------- */

/* Rows per chunk of the last-axis reductions: fixed, so sums do not depend on threads (the batch
 * norm's pooled backward sums x / s's gradient in the same chunks, kernels.h). */
#define CS_CHUNK QT_CHANNEL_SUM_ROWS

void qt_channel_scale_grads(float *dx, int in_place, float *ds, const float *dy, const float *x, const float *s,
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
