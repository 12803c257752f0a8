/* Private to the differentiable ops (autograd.h), shared by their files:
 *   ops.c        plain ops: conv2d, relu / relu6, pooling, flatten, linear, add, channel add,
 *                softmax cross-entropy
 *   ops_quant.c  quantization-aware training ops: fake quant (fixed and LSQ scales), fake quant
 *                fused with a max pool, conv2d of a fake-quantized input, channel scale
 *   ops_bn.c     batch norm and the ops fused around it (with its relu, a max pool, a conv of the
 *                image), BN folding
 *   ops_adaround.c AdaRound's soft-quantized weight and rounding regularizer, the squared error,
 *                QDrop's mix
 *   ops_act.c    the element-wise activations; ops_binary.c  concat and the product of two
 *                activations; ops_channels.c  channel shuffle and slice
 *   ops_tokens.c the transformer's ops: layer norm, multi-head attention
 * Each op checks shapes, allocates its output, calls its kernel and records itself on the tape.
 * Shape errors here are programming errors (graphs validate shapes when they are built), so
 * they abort with file:line and both shapes. */
#ifndef QT_AUTOGRAD_OPS_INT_H
#define QT_AUTOGRAD_OPS_INT_H

#include "autograd/autograd.h"
#include "autograd/kernels.h"
#include "autograd/tape.h"
#include "quant/quant.h"

/* A float32 tensor of rank ndim (< 0: any), in either layout (for an op that takes blocked
 * activations, autograd.h's qt_tensor.blocked16); check_f32: and not blocked. */
static inline void check_f32_any(const qt_tensor *t, int ndim, const char *op, const char *what) {
  QT_ASSERT(t->dtype == QT_F32, "%s: %s is %s, want float32", op, what, qt_dtype_name(t->dtype));
  QT_ASSERT(ndim < 0 || t->ndim == ndim, "%s: %s has rank %d, want %d", op, what, t->ndim, ndim);
}
static inline void check_f32(const qt_tensor *t, int ndim, const char *op, const char *what) {
  check_f32_any(t, ndim, op, what);
  QT_ASSERT(!t->blocked16, "%s: %s is in the blocked (nChw16c) layout, which this op does not take", op, what);
}

/* The convolution of x (N, H, W, C) by w (OC, C / groups, KH, KW). */
static inline qt_conv2d_shape conv_shape_of(const qt_tensor *x, const qt_tensor *w, int stride_h, int stride_w,
                                            int pad_h, int pad_w, int groups) {
  return (qt_conv2d_shape){.N = (int)x->shape[0],
                           .H = (int)x->shape[1],
                           .W = (int)x->shape[2],
                           .C = (int)x->shape[3],
                           .OC = (int)w->shape[0],
                           .KH = (int)w->shape[2],
                           .KW = (int)w->shape[3],
                           .stride_h = stride_h,
                           .stride_w = stride_w,
                           .pad_h = pad_h,
                           .pad_w = pad_w,
                           .groups = groups};
}

/* Every public op is its static body behind PROFILED: with profiling off (ctx->profile NULL) one
 * branch; on, the op's wall time and one call go to its forward bucket. Timing is taken at this
 * level, which never nests: no op calls another (qt_profile_begin aborts if one did), so no
 * time is counted twice and nothing needs subtracting. */
#define PROFILED(ctx, kind, body)                       \
  do {                                                  \
    if (!(ctx)->profile) return body;                   \
    const double t0_ = qt_profile_begin((ctx), (kind)); \
    qt_tensor *y_ = body;                               \
    qt_profile_end((ctx), (kind), t0_);                 \
    return y_;                                          \
  } while (0)

/* A uniform draw in [0, 1) from (seed, i): splitmix64 of their mix, its top 24 bits. The same for
 * any thread count or batch split: QDrop's choice and dropout's mask are functions of it. */
static inline float qt_uniform_at(uint64_t seed, int64_t i) {
  return (float)(qt_mix64(seed + 0x9E3779B97F4A7C15ull * (uint64_t)i) >> 40) * (1.0f / 16777216.0f);
}

/* Batch norm's tape state (its ops are below), here for the max pools that hand it their gradient. */
typedef struct {
  qt_tensor *x, *s, *gamma, *beta, *y; /* s: the per-channel divisor of x (conv_bn), or NULL */
  float *mean, *invstd;
  uint8_t *mask; /* the fused relu's (training), or NULL */
  int training, M, C;
  const qt_batch_sync *sync; /* training over a batch split across processes (SyncBN), or NULL */
  int64_t M_total;           /* rows over all processes */
  /* pooled: a max pool consuming y handed its gradient over as `pool` (qt_pool_hand_to_bn) instead
   * of writing y's; pool.val is arena memory of pool_bytes that the backward hands back */
  int pooled;
  qt_pool_grad pool;
  size_t pool_bytes;
} bn_saved;

/* The gradients of y = x * s or x / s (divide) with s (C) along x's first axis (C rows of `rows`
 * elements) or its last (rows of C): dx written (in_place: over dy itself, last axis only) or
 * added to, ds added to; either may be NULL (ops_bn.c: batch norm of x / s, and channel_scale's backward). */
void qt_channel_scale_grads(float *dx, int in_place, float *ds, const float *dy, const float *x, const float *s,
                            int64_t rows, int C, int first_axis, int divide);

/* Batch norm's backward as recorded on the tape (ops_bn.c). */
void qt_batch_norm_tape_backward(qt_ctx *ctx, void *p);

/* A max pool whose windows tile its input x may hand its gradient to the batch norm recorded just
 * before it (ops_bn.c): that batch norm's state, else NULL. */
bn_saved *qt_bn_before_pool(const qt_ctx *ctx, const qt_tensor *x, int tiles);
/* In the pool's backward: whether its gradient goes to bn as val (see ops_bn.c). */
int qt_pool_hand_to_bn(qt_ctx *ctx, bn_saved *bn, const qt_tensor *x, float *val, size_t val_bytes,
                       const int32_t *argmax, int kernel);

#endif
