/* Tensors, the per-step arena, the tape and the differentiable ops.
 *
 * A qt_ctx owns one training step's memory: an arena from which activations, their
 * gradients and the tape's saved state are bump-allocated, rewound by qt_ctx_reset. Memory
 * that is dead before the reset may be handed back (qt_arena_free) and is then reused by the
 * step's later allocations: the no-grad graph executor does it for values after their last
 * consumer, backward for gradients (qt_ctx_set_backward_frees). With gradients enabled,
 * every op whose inputs require grad appends a backward record to the tape; qt_backward
 * replays it in reverse. Parameters live outside the
 * arena (long-lived slabs owned by the graph) and their gradients ACCUMULATE.
 * Activations are NHWC: (N, H, W, C); flattened features are (N, F). */
#ifndef QT_AUTOGRAD_H
#define QT_AUTOGRAD_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

#define QT_MAX_DIMS 4

typedef enum { QT_F32, QT_I8, QT_U8, QT_I32, QT_DTYPE_COUNT } qt_dtype;
const char *qt_dtype_name(qt_dtype t);
size_t qt_dtype_size(qt_dtype t);

typedef struct qt_tensor {
  qt_dtype dtype;
  int ndim;
  int64_t shape[QT_MAX_DIMS];
  void *data;
  float *grad; /* same numel as data (f32 only); NULL until backward needs it */
  int requires_grad;
  int owns_data; /* data was allocated for this tensor (qt_tensor_new), not wrapped */
  int saved;     /* a tape entry reads its data in backward (set by the op that recorded it):
                  * a value not saved is dead once its consumers ran (nn/exec.c frees it) */
  int blocked16; /* (N, H, W, C) data and grad in oneDNN's nChw16c layout (kernels.h), not NHWC:
                  * from an op asked for it (qt_conv1_bn_relu_max_pool2d's out_blocked) to one
                  * that takes it (qt_conv2d); every other op refuses such a tensor */
} qt_tensor;

static inline float *qt_f32(const qt_tensor *t) { return (float *)t->data; }
int64_t qt_tensor_numel(const qt_tensor *t);

typedef struct qt_ctx qt_ctx;

qt_ctx *qt_ctx_create(void);
void qt_ctx_free(qt_ctx *ctx);
/* Rewinds the arena and clears the tape: every tensor made since is gone. */
void qt_ctx_reset(qt_ctx *ctx);
/* Rewinds like qt_ctx_reset and also returns the arena's memory to the system. */
void qt_ctx_release(qt_ctx *ctx);
void qt_ctx_set_grad(qt_ctx *ctx, int enabled);
int qt_ctx_grad_enabled(const qt_ctx *ctx);
/* With enabled, convolutions recorded on the tape (training steps) may run oneDNN's Winograd
 * kernels where oneDNN has them (3x3, stride 1, at least 16 input and output channels, on
 * AVX-512): about twice as fast as the direct ones for FashionCNN's conv2, with the rounding of
 * Winograd's transforms (relative errors around 1e-6 instead of 1e-7). Convolutions not recorded
 * (evaluation, calibration, the check, the report) stay direct. Off by default; the trainer sets
 * it from train.conv_algorithm. The ctx keeps the setting across qt_ctx_reset. */
void qt_ctx_set_conv_winograd(qt_ctx *ctx, int enabled);
int qt_ctx_conv_winograd(const qt_ctx *ctx);
/* With enabled (the default), fused ops write their output in oneDNN's blocked layout for a
 * convolution that takes it so (qt_conv2d_takes_blocked), instead of NHWC reordered around it:
 * the same numbers (bit for bit in fp32; an LSQ scale's gradient summed in another order). Off:
 * bench_profile --nhwc-handoff, for comparison. The ctx keeps the setting across qt_ctx_reset. */
void qt_ctx_set_blocked_handoff(qt_ctx *ctx, int enabled);
/* Frees the buffers ops share between calls, outside any ctx (the convolutions' oneDNN scratchpad
 * and Winograd's blocked activations, about 19 MB after FashionCNN's training steps); the next
 * op that needs them allocates them again. The trainer calls it after each epoch. */
void qt_ops_release_scratch(void);
/* Bytes the arena spanned at its fullest so far (memory reused through qt_arena_free counted
 * once). */
size_t qt_ctx_peak_bytes(const qt_ctx *ctx);
/* With enabled, qt_backward hands each op's output back to the arena once the op's own tape
 * entry has run: its gradient (the inputs' gradients are computed from it) and its data (the
 * entries that read it, its consumers' and its own, have run), so later gradients reuse the
 * memory. After qt_backward only the gradients of tensors no op produced (leaves, parameters)
 * remain, and no op's output holds data: the caller reads what it needs (the loss, the
 * predictions) before. Off by default; the trainer turns it on. */
void qt_ctx_set_backward_frees(qt_ctx *ctx, int enabled);
int qt_ctx_backward_frees(const qt_ctx *ctx);

/* The batch's processes (qt_batch_sync, base.h) for what ctx computes from now on: batch norm in
 * training mode normalizes with the whole batch's statistics (SyncBN) and the graph executor's
 * activation observers observe the whole batch. NULL: this process holds the whole batch (the
 * default). The ctx keeps the pointer; qt_ctx_reset keeps the setting. */
void qt_ctx_set_batch_sync(qt_ctx *ctx, const qt_batch_sync *sync);
const qt_batch_sync *qt_ctx_batch_sync(const qt_ctx *ctx);

/* The random stream of the stochastic ops (dropout) for what ctx computes from now on: `seed`
 * (the trainer's: the run's seed mixed with the step) and `row0`, the row of the whole batch that
 * this process's first row is (data parallel: its shard's offset; else 0). A draw is a function of
 * (seed, op key, row0 + row, element) alone, so a batch split across processes draws what one
 * process would for the whole batch. Both 0 by default; qt_ctx_reset keeps the setting. */
void qt_ctx_set_random(qt_ctx *ctx, uint64_t seed, int64_t row0);
uint64_t qt_ctx_random_seed(const qt_ctx *ctx);
int64_t qt_ctx_random_row0(const qt_ctx *ctx);

/* The tape's entries are numbered in the order the ops recorded them, from 0 after
 * qt_ctx_reset; the next op recorded gets qt_ctx_tape_length. A tensor made when the length was
 * k has its gradient written only by entries k and later. */
size_t qt_ctx_tape_length(const qt_ctx *ctx);
/* fn(user, entry) runs after each tape entry's backward (entries run from the last to 0): once
 * entry k has run, so have all entries from k on, and a gradient only they write is final (the
 * trainer starts summing those across processes while the backward goes on). NULL: none (the
 * default). The ctx keeps the setting across qt_ctx_reset. */
typedef void (*qt_backward_hook)(void *user, size_t entry);
void qt_ctx_set_backward_hook(qt_ctx *ctx, qt_backward_hook fn, void *user);

/* ---- profiling (off by default) ------------------------------------------------------- */
/* The kinds of differentiable op below, one bucket each. */
typedef enum {
  QT_PROFILE_CONV2D,
  QT_PROFILE_BATCH_NORM,
  QT_PROFILE_RELU,
  QT_PROFILE_RELU6,
  QT_PROFILE_MAX_POOL2D,
  QT_PROFILE_AVG_POOL2D,
  QT_PROFILE_GLOBAL_AVG_POOL,
  QT_PROFILE_FLATTEN,
  QT_PROFILE_LINEAR,
  QT_PROFILE_ADD,
  QT_PROFILE_CROSS_ENTROPY,
  QT_PROFILE_FAKE_QUANT,
  QT_PROFILE_FAKE_QUANT_LSQ,
  QT_PROFILE_LSQ_MAX_POOL2D,
  QT_PROFILE_FQ_MAX_POOL2D,
  QT_PROFILE_CONV2D_LSQ_INPUT,
  QT_PROFILE_CHANNEL_SCALE,
  QT_PROFILE_CHANNEL_ADD,
  QT_PROFILE_BN_SCALE_FACTOR,
  QT_PROFILE_BN_MAX_POOL2D,
  QT_PROFILE_CONV1_BN_MAX_POOL2D,
  QT_PROFILE_ADAROUND_WEIGHT,
  QT_PROFILE_ADAROUND_ROUND_LOSS,
  QT_PROFILE_SQUARED_ERROR,
  QT_PROFILE_QDROP,
  QT_PROFILE_DROPOUT,
  QT_PROFILE_ACTIVATION,
  QT_PROFILE_MUL,
  QT_PROFILE_CONCAT,
  QT_PROFILE_CHANNELS,
  QT_PROFILE_LAYER_NORM,
  QT_PROFILE_ATTENTION,
  QT_PROFILE_OP_COUNT
} qt_profile_op;
/* The parts of a training step that are not ops, timed by their callers (train/trainer.c,
 * nn/exec.c's observers) when the ctx they run on has a profile. STEP is the whole step. */
typedef enum {
  QT_PROFILE_DATA,      /* waiting in qt_loader_next for the next batch */
  QT_PROFILE_ZERO_GRAD, /* qt_graph_zero_grad */
  QT_PROFILE_OPTIMIZER, /* qt_optim_step */
  QT_PROFILE_OBSERVER,  /* quantization observers in the graph executor's forward */
  QT_PROFILE_GRAD_SUM,  /* data parallel: the gradient sum across processes */
  QT_PROFILE_STEP,      /* one training step, wall clock, the above and the ops included */
  QT_PROFILE_PHASE_COUNT
} qt_profile_phase;
/* "conv2d", "batch_norm", ... and "data", "zero_grad", ... */
const char *qt_profile_op_name(qt_profile_op op);
const char *qt_profile_phase_name(qt_profile_phase ph);

typedef struct {
  double seconds;
  int64_t calls;
} qt_profile_bucket;
/* Wall time (CLOCK_MONOTONIC) and calls per op kind, forward (the op's call) and backward (its
 * tape entry's replay) apart, and per step phase. Owned by the caller; buckets accumulate until
 * qt_profile_clear. */
typedef struct {
  qt_profile_bucket forward[QT_PROFILE_OP_COUNT], backward[QT_PROFILE_OP_COUNT];
  qt_profile_bucket phase[QT_PROFILE_PHASE_COUNT];
  int active; /* an op or tape entry is being timed (the nesting check) */
} qt_profile;
void qt_profile_clear(qt_profile *p);
/* Adds `seconds` and one call to phase ph (p may be NULL: nothing). */
void qt_profile_add_phase(qt_profile *p, qt_profile_phase ph, double seconds);

/* Ops run on ctx from now on accumulate into p; NULL (the default) turns profiling off, which
 * costs one predictable branch per op and per backward replay, no clock reads. The ctx keeps
 * the pointer; qt_ctx_reset keeps the setting. */
void qt_ctx_set_profile(qt_ctx *ctx, qt_profile *p);
qt_profile *qt_ctx_profile(const qt_ctx *ctx);

/* 64-byte aligned arena memory, uninitialized (or zeroed): a range handed back by qt_arena_free
 * when one fits (the smallest), else the next bytes of the current block. */
void *qt_arena_alloc(qt_ctx *ctx, size_t bytes);
void *qt_arena_calloc(qt_ctx *ctx, size_t bytes);
/* Hands back `bytes` at p, which qt_arena_alloc returned for that size and which nothing reads
 * again (a dead value, a used temporary): later allocations before the next reset reuse it.
 * Memory the arena did not hand out, or handed back twice, aborts. */
void qt_arena_free(qt_ctx *ctx, void *p, size_t bytes);
/* Whether p lies in memory this arena has handed out since the last reset. */
int qt_arena_owns(const qt_ctx *ctx, const void *p);

/* A new arena tensor (uninitialized data). */
qt_tensor *qt_tensor_new(qt_ctx *ctx, qt_dtype dtype, int ndim, const int64_t *shape);
/* An arena tensor header over caller-owned data (e.g. a parameter slab or a loader batch). */
qt_tensor *qt_tensor_wrap(qt_ctx *ctx, qt_dtype dtype, int ndim, const int64_t *shape, void *data);
/* Hands back the data of t, a tensor qt_tensor_new made on ctx (qt_arena_free); t->data is NULL
 * after. */
void qt_tensor_free(qt_ctx *ctx, qt_tensor *t);
/* The gradient buffer of t, allocated zeroed in the arena on first use. */
float *qt_tensor_grad(qt_ctx *ctx, qt_tensor *t);
/* The same for a backward that can write the whole gradient instead of adding to it: on first
 * use the buffer is allocated uninitialized and *fresh is 1 (the caller must then write every
 * element); otherwise *fresh is 0 and the caller adds, as with qt_tensor_grad. Saves the zero
 * fill and an accumulate pass where a kernel produces the gradient in a buffer of its own. */
float *qt_tensor_grad_for_write(qt_ctx *ctx, qt_tensor *t, int *fresh);

/* Seeds d(loss) = 1 for a one-element loss and replays the tape in reverse. */
void qt_backward(qt_ctx *ctx, qt_tensor *loss);
/* The same with d(loss) = seed: a process holding n of a batch's N samples seeds n/N, so that the
 * sum of the processes' gradients of their mean losses is the gradient of the batch's mean. */
void qt_backward_seeded(qt_ctx *ctx, qt_tensor *loss, float seed);

/* ---- differentiable ops: each returns a new arena tensor ------------------------------ */
/* x (N,H,W,C), w (OC, C/groups, KH, KW), b (OC) or NULL -> (N, OH, OW, OC). x may be blocked
 * (x->blocked16; its gradient is then blocked too) where qt_conv2d_takes_blocked says so. */
qt_tensor *qt_conv2d(qt_ctx *ctx, qt_tensor *x, qt_tensor *w, qt_tensor *b, int stride_h, int stride_w, int pad_h,
                     int pad_w, int groups);
/* Whether a convolution of an (N, H, W, C) input by (OC, C/groups, KH, KW) weights, recorded in
 * this ctx (a training step), takes its input blocked: it runs on oneDNN's Winograd kernels over
 * nChw16c (qt_ctx_set_conv_winograd) and the ctx hands activations over blocked
 * (qt_ctx_set_blocked_handoff), so a producer writing that layout saves the reorders of its input
 * and input gradient to and from NHWC (one in forward, two in backward). Creates the convolution's
 * primitives. */
int qt_conv2d_takes_blocked(const qt_ctx *ctx, const int64_t x_shape[4], const int64_t w_shape[4], int stride_h,
                            int stride_w, int pad_h, int pad_w, int groups);
/* qt_conv2d whose output (and so its gradient) is blocked (y->blocked16) where the convolution is
 * recorded, runs on oneDNN's Winograd kernels writing nChw16c and the ctx hands activations over
 * blocked; NHWC otherwise, as qt_conv2d. For a sole consumer that takes either layout
 * (qt_batch_norm_relu_max_pool2d): saves the reorder of the output to NHWC and of its gradient
 * back. */
qt_tensor *qt_conv2d_to_blocked(qt_ctx *ctx, qt_tensor *x, qt_tensor *w, qt_tensor *b, int stride_h, int stride_w,
                                int pad_h, int pad_w, int groups);
/* BatchNorm over the last dim. training: batch statistics, running stats updated in place
 * (momentum, unbiased variance), over every process's slice of the batch when ctx has a batch
 * sync (qt_ctx_set_batch_sync); otherwise running stats. inplace: when nothing is recorded
 * (no grad), the output may reuse x's memory (x must have no other consumer). */
qt_tensor *qt_batch_norm(qt_ctx *ctx, qt_tensor *x, qt_tensor *gamma, qt_tensor *beta, float *running_mean,
                         float *running_var, int training, float momentum, float eps, int inplace);
/* Batch norm in training mode (as qt_batch_norm with training set) followed by relu (six:
 * relu6), in one pass over memory each way: the output is the relu's, bit for bit the two ops in
 * turn, and so are the gradients. The tape gets one entry (profiled as batch_norm); its backward
 * masks the output's gradient in place before using it. For a batch norm whose only consumer is
 * the relu (nn/fuse.c fuses them in the training forward). */
qt_tensor *qt_batch_norm_relu(qt_ctx *ctx, qt_tensor *x, qt_tensor *gamma, qt_tensor *beta, float *running_mean,
                              float *running_var, float momentum, float eps, int six);
/* Batch norm of x / s, s (C) per channel of x's last axis, without the quotient in memory: the
 * numbers, bit for bit, of qt_channel_scale(x, s, 0, 1) followed by qt_batch_norm (training or
 * running statistics) and, with relu (1: relu, 2: relu6; training only), qt_batch_norm_relu;
 * gradients reach x, s, gamma and beta. Saves x, not the quotient: QAT's conv_bn (docs/design.md: delayed folding,
 * conv / sf then BN) keeps one activation per layer instead of two (nn/fuse.c, training forward). */
qt_tensor *qt_batch_norm_div(qt_ctx *ctx, qt_tensor *x, qt_tensor *s, qt_tensor *gamma, qt_tensor *beta,
                             float *running_mean, float *running_var, int training, float momentum, float eps,
                             int relu);
/* inplace: the output reuses x's memory (x must have no other consumer). */
qt_tensor *qt_relu(qt_ctx *ctx, qt_tensor *x, int inplace);
/* min(max(x, 0), 6) (PyTorch's ReLU6 / hardtanh(0, 6)); inplace as relu. */
qt_tensor *qt_relu6(qt_ctx *ctx, qt_tensor *x, int inplace);
/* Element-wise activations (autograd/ops_act.c), each PyTorch's formula and backward: sigmoid,
 * tanh, SiLU (x sigmoid(x)), hard sigmoid (alpha, beta: PyTorch's relu6(x + 3) / 6 for (1/6,
 * 1/2), else ONNX's clamp(alpha x + beta, 0, 1)), hard swish (x relu6(x + 3) / 6), GELU with erf
 * and with the tanh approximation, leaky ReLU (negative slope alpha) and ELU (alpha); and the
 * arithmetic with a constant: affine (alpha x + beta, computed as x * alpha when beta is 0 and as
 * x + beta when alpha is 1: PyTorch's x * c, x + c, x - c, c - x) and div (x / alpha). */
typedef enum {
  QT_ACT_SIGMOID,
  QT_ACT_TANH,
  QT_ACT_SILU,
  QT_ACT_HARDSIGMOID,
  QT_ACT_HARDSWISH,
  QT_ACT_GELU,
  QT_ACT_GELU_TANH,
  QT_ACT_LEAKY_RELU,
  QT_ACT_ELU,
  QT_ACT_AFFINE,
  QT_ACT_DIV,
  QT_ACT_COUNT
} qt_act_kind;
typedef struct qt_act {
  qt_act_kind kind;
  float alpha, beta; /* hardsigmoid: slope and offset; leaky_relu: negative slope; elu: alpha; affine: factor and
                      * offset; div: divisor */
} qt_act;
/* PyTorch's defaults: hardsigmoid (1/6, 1/2), leaky_relu 0.01, elu 1; affine (1, 0); div 1. */
qt_act qt_act_default(qt_act_kind kind);
/* "sigmoid", "tanh", "silu", "hardsigmoid", "hardswish", "gelu", "gelu_tanh", "leaky_relu",
 * "elu", "affine", "div"; qt_act_parse: -1 for another name. */
const char *qt_act_name(qt_act_kind kind);
/* Whether a hard sigmoid's (alpha, beta) are PyTorch's (1/6, 1/2), computed as relu6(x + 3) / 6;
 * otherwise as ONNX's max(0, min(1, alpha x + beta)). */
int qt_act_torch_hardsigmoid(float alpha, float beta);
int qt_act_parse(const char *name, qt_act_kind *out);
qt_tensor *qt_activation(qt_ctx *ctx, qt_tensor *x, qt_act a);
/* PReLU (PyTorch's): x > 0 ? x : w[c] x with w one slope for every channel (numel 1) or one per
 * channel of x's last axis (numel C); dx = x > 0 ? dy : w dy, dw[c] = sum of x dy where x <= 0. */
qt_tensor *qt_prelu(qt_ctx *ctx, qt_tensor *x, qt_tensor *w);
/* One side of a pool's output, as PyTorch's pooling_output_shape (dilation 1): floor mode, or in
 * ceil mode the last window may hang over the end but starts inside the input or its left
 * padding; -1 when the window does not fit (or kernel, stride or pad is out of range). */
int64_t qt_pool_output_size(int64_t in, int kernel, int stride, int pad, int ceil_mode);
/* Square windows; ceil_mode as PyTorch's (0: floor mode, its default). */
qt_tensor *qt_max_pool2d(qt_ctx *ctx, qt_tensor *x, int kernel, int stride, int pad, int ceil_mode);
qt_tensor *qt_avg_pool2d(qt_ctx *ctx, qt_tensor *x, int kernel, int stride, int pad, int ceil_mode);
/* (N,H,W,C) -> (N,C) */
qt_tensor *qt_global_avg_pool(qt_ctx *ctx, qt_tensor *x);
/* (N, ...) -> (N, prod(...)); a view sharing memory, in NHWC order. */
qt_tensor *qt_flatten(qt_ctx *ctx, qt_tensor *x);
/* x (N, IN), w (OUT, IN), b (OUT) or NULL -> (N, OUT) */
qt_tensor *qt_linear(qt_ctx *ctx, qt_tensor *x, qt_tensor *w, qt_tensor *b);
qt_tensor *qt_add(qt_ctx *ctx, qt_tensor *a, qt_tensor *b);
/* a * b element-wise: b of a's shape, or a (N, H, W, C) and b (N, C), one factor per sample and
 * channel (squeeze-excite) -> a's shape (autograd/ops_binary.c) */
qt_tensor *qt_mul(qt_ctx *ctx, qt_tensor *a, qt_tensor *b);
/* xs[0..n-1] of one rank and equal dims but the last, joined along the last (channels of an
 * image, features of a flat tensor), in order (autograd/ops_binary.c) */
#define QT_CONCAT_MAX 8
qt_tensor *qt_concat(qt_ctx *ctx, qt_tensor *const *xs, int n);
/* The last dim's C channels as (groups, C / groups), transposed: ShuffleNet's channel shuffle
 * (autograd/ops_channels.c) */
qt_tensor *qt_channel_shuffle(qt_ctx *ctx, qt_tensor *x, int groups);
/* x (N, H, W, C) upsampled by 2 in H and W, nearest or bilinear (PyTorch's, align_corners=False)
 * -> (N, 2H, 2W, C) (autograd/ops_resize.c) */
qt_tensor *qt_resize2x(qt_ctx *ctx, qt_tensor *x, int bilinear);
/* Channels [begin, end) of the last dim (a Split or Slice along channels) */
qt_tensor *qt_channel_slice(qt_ctx *ctx, qt_tensor *x, int begin, int end);
/* Layer norm of x's last dim (C): (x - mean) / sqrt(var + eps) * gamma (C) + beta (C, or NULL),
 * per row (autograd/ops_tokens.c) */
qt_tensor *qt_layer_norm(qt_ctx *ctx, qt_tensor *x, qt_tensor *gamma, qt_tensor *beta, float eps);
/* Multi-head scaled dot-product attention of q, k, v (N, ..., D), one shape, the dims between N
 * and D being T tokens (an image's pixels): per sample and head (D / heads features each),
 * softmax(Q K^T / sqrt(D / heads)) V -> (N, ..., D) (autograd/ops_tokens.c) */
qt_tensor *qt_attention(qt_ctx *ctx, qt_tensor *q, qt_tensor *k, qt_tensor *v, int heads);
/* A class token: the learned (C) token w put before the H W tokens of x (N, H, W, C), giving
 * (N, 1, 1 + H W, C) (PyTorch's cat([w.expand(N, 1, C), x.flatten], 1)); and the first token of
 * x (N, H, W, C) as (N, C) (x[:, 0]). */
qt_tensor *qt_prepend_token(qt_ctx *ctx, qt_tensor *x, qt_tensor *w);
qt_tensor *qt_first_token(qt_ctx *ctx, qt_tensor *x);
/* Mean softmax cross-entropy of logits (N, C) against labels (N) in [0, C): a (1) tensor.
 * If probs_out is not NULL it receives the arena softmax (N, C). */
qt_tensor *qt_cross_entropy(qt_ctx *ctx, qt_tensor *logits, const int32_t *labels, float **probs_out);

/* ---- quantization-aware training ops --------------------------------------------------- */
/* Fake quant of x viewed as (outer, channels, inner) with per-channel scale/zero_point
 * (channels == 1: per tensor); the clipped straight-through estimator in backward. */
qt_tensor *qt_fake_quant(qt_ctx *ctx, qt_tensor *x, int64_t outer, int channels, int64_t inner, const float *scale,
                         const int32_t *zero_point, int qmin, int qmax);
/* LSQ: fake quant with a learned per-channel scale tensor (C); the gradient reaches x (clipped
 * STE) and the scale (PyTorch's _fake_quantize_learnable_*_affine, scaled by grad_factor). */
qt_tensor *qt_fake_quant_lsq(qt_ctx *ctx, qt_tensor *x, int64_t outer, int channels, int64_t inner, qt_tensor *scale,
                             const int32_t *zero_point, int qmin, int qmax, float grad_factor);
/* max_pool2d(fake_quant_lsq(x)) for a per-tensor scale (1) and windows that tile x (stride =
 * kernel, no padding) as one op: the same output and gradients (the scale's summed in another
 * order: qt_fake_quant_lsq_max_pool_backward) without the fake-quantized tensor in memory, and
 * the LSQ backward computed for the windows' argmax inputs only (the rest get zero). */
qt_tensor *qt_fake_quant_lsq_max_pool2d(qt_ctx *ctx, qt_tensor *x, qt_tensor *scale, const int32_t *zero_point,
                                        int qmin, int qmax, float grad_factor, int kernel);
/* The same for a fake quant with fixed per-tensor qparams (the clipped STE): max_pool2d(
 * fake_quant(x)) with the composition's output and input gradient, bit for bit; it saves one
 * mask byte per output instead of one per input. */
qt_tensor *qt_fake_quant_max_pool2d(qt_ctx *ctx, qt_tensor *x, const float *scale, const int32_t *zero_point, int qmin,
                                    int qmax, int kernel);
/* The fake quant between qt_batch_norm_relu_max_pool2d's relu and pool: per tensor, LSQ with
 * lsq_scale (1 element) and grad_factor, else fixed qparams (scale[0]; the clipped STE). */
typedef struct {
  qt_tensor *lsq_scale;
  const float *scale;
  const int32_t *zero_point;
  int qmin, qmax;
  float grad_factor;
} qt_pool_fake_quant;
/* Batch norm in training mode of x (or of x / div, div per channel, NULL: none: QAT's conv_bn),
 * then relu (relu 1), relu6 (2) or none (0), then fq (NULL: none), then a max pool whose
 * kernel x kernel windows tile x (stride = kernel, no padding), as one op: the output and every
 * gradient (x, div, gamma, beta, the LSQ scale) and the running statistics are bit for bit those
 * of the ops in turn (qt_batch_norm_relu or qt_batch_norm_div, then qt_max_pool2d or the fused
 * fake quant + max pool), while neither the normalized tensor, nor its relu's, nor its fake
 * quant's is ever in memory (qt_batch_norm_relu_pool_forward_train), nor its gradient
 * (qt_batch_norm_relu_backward_pooled), nor the quotient x / div's (its backward into x and div
 * runs in the same pass: div's gradient bit for bit for C = 16, 32, 64 or 128, summed in another
 * order otherwise). Saved for backward: argmax, and for LSQ the relu's output at each argmax; for
 * fixed qparams a mask byte per output. x may be blocked (x->blocked16: qt_conv2d_to_blocked's
 * output) where qt_batch_norm_relu_max_pool2d_takes_blocked says so: its gradient is then blocked
 * too, every number the same; the output is NHWC either way. */
qt_tensor *qt_batch_norm_relu_max_pool2d(qt_ctx *ctx, qt_tensor *x, qt_tensor *div, qt_tensor *gamma, qt_tensor *beta,
                                         float *running_mean, float *running_var, float momentum, float eps, int relu,
                                         const qt_pool_fake_quant *fq, int kernel);
/* Whether qt_batch_norm_relu_max_pool2d takes a blocked x of C channels in this build. */
int qt_batch_norm_relu_max_pool2d_takes_blocked(int C);
/* conv2d(x', w / div, b) of a one-channel x that needs no gradient (an image; x' = x, or its
 * per-tensor fake quant xq: LSQ or fixed qparams; stride 1, groups 1, w (OC, 1, KH, KW) with
 * OC % 16 == 0 and at most 25 taps; b and div (per output channel: QAT's conv_bn) may be NULL),
 * then batch norm in training mode, relu (relu 1) or relu6 (2), a per-tensor fake quant fq (NULL:
 * none) and a max pool whose kernel x kernel windows tile the convolution's output, as one op.
 * The gradients of w, b, div, gamma, beta and both LSQ scales and the running statistics are the
 * ops' in turn (qt_fake_quant_lsq or qt_conv2d_lsq_input, qt_conv2d, qt_batch_norm_div or
 * qt_batch_norm_relu, qt_batch_norm_relu_max_pool2d) summed in another order
 * (autograd/cpu_conv1_pool.c), while nothing the size of the convolution's output is in memory,
 * in forward or backward. Saved for backward: one byte per output (the argmax's window position),
 * for LSQ the relu's output at each argmax, for fixed qparams a mask byte per output, the
 * quantized image and O(taps^2 + OC) doubles. Under SyncBN (the ctx's batch sync) the
 * statistics are the batch's (the processes' pixel sums summed in the forward, batch norm's two
 * per-channel gradient sums in the backward) and the gradients this process's terms of the batch's.
 * With out_blocked, the output (and so its gradient) is blocked (y->blocked16; kernels.h), for a
 * convolution that takes it so (qt_conv2d_takes_blocked). */
qt_tensor *qt_conv1_bn_relu_max_pool2d(qt_ctx *ctx, qt_tensor *x, const qt_pool_fake_quant *xq, qt_tensor *w,
                                       qt_tensor *b, qt_tensor *div, qt_tensor *gamma, qt_tensor *beta,
                                       float *running_mean, float *running_var, float momentum, float eps, int pad_h,
                                       int pad_w, int relu, const qt_pool_fake_quant *fq, int kernel, int out_blocked);
/* Whether qt_conv1_bn_relu_max_pool2d takes an (N, H, W, 1) input, OC x KH x KW weights, that
 * padding and pool kernel (relu 1 or 2). */
int qt_conv1_bn_relu_max_pool2d_takes(int N, int H, int W, int OC, int KH, int KW, int pad_h, int pad_w, int relu,
                                      int kernel);
/* conv2d(fake_quant_lsq(x), w, b) with groups 1 for an x that needs no gradient (an image): the
 * output of the two ops, and the gradients of w, b and the per-tensor scale (1) without the
 * convolution's input gradient: the scale's is read off a backward-weights pass over
 * [fq(x), its LSQ coefficients] (qt_fake_quant_lsq_scale_coef), the same sum in another order.
 * Worth it for a few input channels (the graph uses it up to 4). */
qt_tensor *qt_conv2d_lsq_input(qt_ctx *ctx, qt_tensor *x, qt_tensor *scale, const int32_t *zero_point, int qmin,
                               int qmax, float grad_factor, qt_tensor *w, qt_tensor *b, int stride_h, int stride_w,
                               int pad_h, int pad_w);
/* ---- AdaRound (Nagel et al., 2020, "Up or Down? Adaptive Rounding for Post-Training
 * Quantization"; ops_adaround.c). A weight w with scale s rounds down or up: floor(w / s) + h(v),
 * h the rectified sigmoid of a learned v, pushed to 0 or 1 by the rounding regularizer. */
#define QT_ADAROUND_ZETA 1.1f
#define QT_ADAROUND_GAMMA (-0.1f)
/* h(v) = clamp(sigmoid(v) * (zeta - gamma) + gamma, 0, 1) and dh/dv: the sigmoid's slope times
 * (zeta - gamma) where the clamp passes its input (bounds included, as torch.clamp), else 0. */
float qt_adaround_h(float v);
float qt_adaround_dh(float v);
/* The v that gives h(v) = r for a fraction r in [0, 1) (r = w / s - floor(w / s): AdaRound's
 * start at the weight's own position between its two grid points); r = 0 is taken as the
 * smallest r whose v is finite. */
float qt_adaround_v_init(float r);
/* The soft-quantized weight: w~ = (clamp(w_floor + h(v) + zp, qmin, qmax) - zp) * s for each
 * element of v viewed as (outer, channels, inner), with its channel's scale and zero point;
 * w_floor (the same numel) holds floor(w / s) of the weight being rounded. The gradient flows to
 * v only: s * dh/dv where the clamp to [qmin, qmax] passes (bounds included). */
qt_tensor *qt_adaround_weight(qt_ctx *ctx, qt_tensor *v, const float *w_floor, int64_t outer, int channels,
                              int64_t inner, const float *scale, const int32_t *zero_point, int qmin, int qmax);
/* The rounding regularizer lambda * sum_i (1 - |2 h(v_i) - 1|^beta) (one element); gradient to v. */
qt_tensor *qt_adaround_round_loss(qt_ctx *ctx, qt_tensor *v, float beta, float lambda);
/* QDrop (Wei et al., 2022): y_i = x_i (the float activation) with probability `drop`, else xq_i
 * (its fake-quantized value), drawn per element from (seed, i) alone, so the same for any thread
 * count; x and xq of one shape; the gradient goes to whichever was taken. */
qt_tensor *qt_qdrop(qt_ctx *ctx, qt_tensor *x, qt_tensor *xq, float drop, uint64_t seed);
/* Dropout of x (batch first) in training, as PyTorch's: each element is zeroed with probability p
 * (0 <= p <= 1), the others scaled by 1 / (1 - p) (that float32 factor, as PyTorch multiplies);
 * p = 1 zeroes every element. Element e of row r is kept when a uniform draw in [0, 1) from
 * qt_mix64 (base.h) of key and (row0 + r) * S + e, S the elements per row, is at least p: the mask
 * is a function of (key, row0 + r, e) alone, so any thread count and any split of the batch draw
 * the same one. The gradient is dy times the same factor where kept, 0 elsewhere. */
qt_tensor *qt_dropout(qt_ctx *ctx, qt_tensor *x, float p, uint64_t key, int64_t row0);
/* sum_i (x_i - target_i)^2 / divisor (one element; summed in double); gradient to x only. With
 * divisor = numel / channels it is the squared error summed over the last axis and averaged over
 * the others, the reconstruction loss of AdaRound's and BRECQ's implementations. */
qt_tensor *qt_squared_error(qt_ctx *ctx, qt_tensor *x, const float *target, double divisor);

/* y = x * s (divide: x / s) with s (C) along x's first axis (weights (C, ...)) or its last
 * axis (activations (..., C)); gradients flow to x and s. */
qt_tensor *qt_channel_scale(qt_ctx *ctx, qt_tensor *x, qt_tensor *s, int first_axis, int divide);
/* y = x + b with b of x's last dims: (C) along the last axis, or one sample's shape (a learned
 * position embedding); b's gradient sums over the rest, in double. */
qt_tensor *qt_channel_add(qt_ctx *ctx, qt_tensor *x, qt_tensor *b);
/* BN scale factor sf = gamma / sqrt(running_var + eps) (C); gradient flows to gamma. */
qt_tensor *qt_bn_scale_factor(qt_ctx *ctx, qt_tensor *gamma, const float *running_var, float eps);
/* The same numbers without autograd: convert folds with exactly what training computed. */
void qt_bn_scale_factor_values(float *sf, const float *gamma, const float *running_var, float eps, int C);
/* The BN fold (docs/design.md: delayed folding) with exactly the float operations QAT training uses:
 * sf = gamma / sqrt(var + eps) (qt_bn_scale_factor_values), Wf = W * sf per output channel,
 * bf = beta + (b - mean) * sf. W and Wf are (OC, inner); b may be NULL (no conv bias); bf may
 * be NULL (weights only, as the check needs); Wf and W may be NULL (the bias only). PTQ
 * prepare, convert, the check and conv_bn's eval forward with an int32 bias (nn/node.c) all
 * fold with this one function, so their numbers cannot drift apart. */
void qt_bn_fold(float *Wf, float *bf, const float *W, const float *b, const float *gamma, const float *beta,
                const float *mean, const float *var, float eps, int OC, int64_t inner);

#endif
