/* Compute kernels: plain functions over raw float buffers (outputs first, then inputs, then
 * sizes). Activations are NHWC. Every optimized kernel has a plain-C reference twin with the
 * same signature and a `_ref` suffix; tests compare the two and check gradients by finite
 * differences. Backward kernels ACCUMULATE into their gradient outputs (+=); a NULL gradient
 * output is skipped. Private to the library and its tests: the public API is autograd.h. */
#ifndef QT_KERNELS_H
#define QT_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "quant/quant_elem.h"

struct qt_batch_sync; /* base.h */

/* Blocked activations: where a kernel says so, an (N, H, W, C) tensor with C % 16 == 0 stored in
 * oneDNN's nChw16c layout, element (n, h, w, c) at (((n * C/16 + c/16) * H + h) * W + w) * 16 +
 * c % 16: the layout oneDNN's Winograd convolutions run on, handed between a convolution and the
 * kernels beside it in a training step without reorders (qt_tensor.blocked16, autograd.h). */

/* ---- conv2d (oneDNN fp32 primitives, cached per shape) --------------------------------- */
typedef struct {
  int N, H, W, C; /* input (N, H, W, C) */
  int OC, KH, KW; /* weight (OC, C/groups, KH, KW), PyTorch's OIHW layout */
  int stride_h, stride_w;
  int pad_h, pad_w; /* symmetric zero padding */
  int groups;       /* C % groups == 0 and OC % groups == 0; depthwise: groups == C */
  int winograd;     /* 1: may run oneDNN's Winograd kernels where it has them (3x3,
                     * stride 1, C and OC >= 16): the caller accepts their rounding
                     * (training steps) */
  int OH, OW;       /* derived by qt_conv2d_shape_init */
  int src_blocked;  /* the caller's input and its gradient are blocked (above), not
                     * NHWC: only where qt_conv2d_src_blocked16 says so (not part of
                     * the primitive cache's key) */
  int dst_blocked;  /* the output and its gradient blocked: only where
                     * qt_conv2d_dst_blocked16 says so (not part of the key) */
} qt_conv2d_shape;

/* Fills OH/OW; returns 0, or -1 when the shape is invalid (non-positive output, bad groups). */
int qt_conv2d_shape_init(qt_conv2d_shape *s);
/* Frees the buffers the oneDNN path shares between calls (its primitives' scratchpad, Winograd's
 * blocked activations): the next call that needs them allocates them again
 * (qt_ops_release_scratch, autograd.h). */
void qt_conv2d_release_scratch(void);
/* The bytes those buffers hold now: Winograd's source-shaped and destination-shaped activations
 * and the scratchpad (a source-shaped buffer is only needed where an input comes in NHWC). */
void qt_conv2d_scratch_bytes(size_t *src, size_t *dst, size_t *pad);

/* Whether the shape's primitives run on a blocked input (the layout above): a caller may then set
 * src_blocked. Creates the shape's cached primitives if needed. */
int qt_conv2d_src_blocked16(const qt_conv2d_shape *s);
/* The same for the output: a caller may then set dst_blocked. */
int qt_conv2d_dst_blocked16(const qt_conv2d_shape *s);
/* out (N, OH, OW, OC) = conv(inp (N, H, W, C), weight (OC, C/groups, KH, KW)) + bias (OC) or NULL */
void qt_conv2d_forward(float *out, const float *inp, const float *weight, const float *bias, const qt_conv2d_shape *s);
void qt_conv2d_forward_ref(float *out, const float *inp, const float *weight, const float *bias,
                           const qt_conv2d_shape *s);
/* dinp (N,H,W,C) += ..., dweight (OC, C/groups, KH, KW) += ..., dbias (OC) += ... */
void qt_conv2d_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                        const float *weight, const qt_conv2d_shape *s);
/* The same with dinp written (=) instead of added to when dinp_write is set (its old contents
 * are never read: a fresh gradient buffer needs no zero fill, and oneDNN writes it directly). */
void qt_conv2d_backward_ex(float *dinp, int dinp_write, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, const qt_conv2d_shape *s);
void qt_conv2d_backward_ref(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, const qt_conv2d_shape *s);

/* ---- linear (fully connected) ---------------------------------------------------------- */
/* out (N, OUT) = inp (N, IN) @ weight (OUT, IN)^T + bias (OUT) or NULL */
void qt_linear_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int IN, int OUT);
void qt_linear_forward_ref(float *out, const float *inp, const float *weight, const float *bias, int N, int IN,
                           int OUT);
void qt_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                        const float *weight, int N, int IN, int OUT);
void qt_linear_backward_ref(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, int N, int IN, int OUT);

/* ---- batch norm over NHWC: M = N*H*W rows, C channels ----------------------------------- */
/* Training (out may equal inp): normalizes with the biased batch variance; writes the batch mean and
 * invstd = 1/sqrt(var_biased + eps) (C each) for backward; updates running stats with
 * running = (1-momentum)*running + momentum*batch, using the UNBIASED variance (M/(M-1)).
 * running_mean/running_var may be NULL (no update); gamma/beta may be NULL (affine=False).
 * Training needs M >= 2 (aborts otherwise, as PyTorch refuses it). */
void qt_batch_norm_forward_train(float *out, float *mean, float *invstd, const float *inp, const float *gamma,
                                 const float *beta, float *running_mean, float *running_var, float momentum, float eps,
                                 int M, int C);
void qt_batch_norm_forward_train_ref(float *out, float *mean, float *invstd, const float *inp, const float *gamma,
                                     const float *beta, float *running_mean, float *running_var, float momentum,
                                     float eps, int M, int C);
/* Eval: y = (x - running_mean) / sqrt(running_var + eps) * gamma + beta; out may equal inp. */
void qt_batch_norm_forward_eval(float *out, const float *inp, const float *gamma, const float *beta,
                                const float *running_mean, const float *running_var, float eps, int M, int C);
void qt_batch_norm_forward_eval_ref(float *out, const float *inp, const float *gamma, const float *beta,
                                    const float *running_mean, const float *running_var, float eps, int M, int C);
/* Backward of the training forward (batch statistics): mean/invstd as saved by forward. */
void qt_batch_norm_backward(float *dinp, float *dgamma, float *dbeta, const float *dout, const float *inp,
                            const float *mean, const float *invstd, const float *gamma, int M, int C);
/* Synchronized batch norm (SyncBN): the batch's rows are split across the processes of sync
 * (base.h), each passing its own M >= 1 rows. The forward gathers every process's per-channel
 * row count, mean and centred sum of squares and merges them in process order (the exact
 * parallel-variance identity, as PyTorch's SyncBatchNorm), so that mean, invstd and the running
 * statistics are the whole batch's on every process (the unbiased variance divides by the total
 * rows - 1, which must be >= 1); *M_total gets the total rows. The backward sums sum(dout) and
 * sum(dout * (x - mean)) over the processes for dinp (divided by M_total); dgamma and dbeta get
 * this process's sums only, for the caller's gradient reduction to add up like any parameter's.
 * sync NULL or of size <= 1: exactly the two kernels above (*M_total = M). */
void qt_batch_norm_forward_train_sync(float *out, float *mean, float *invstd, const float *inp, const float *gamma,
                                      const float *beta, float *running_mean, float *running_var, float momentum,
                                      float eps, int M, int C, const struct qt_batch_sync *sync, int64_t *M_total);
/* dinp_write: dinp is written, never read (a fresh gradient buffer, qt_tensor_grad_for_write),
 * and may be dout itself (in place: dout is summed first, then each element of dinp written
 * from the same element of dout); otherwise added to, as every backward here does. */
void qt_batch_norm_backward_sync(float *dinp, int dinp_write, float *dgamma, float *dbeta, const float *dout,
                                 const float *inp, const float *mean, const float *invstd, const float *gamma, int M,
                                 int C, const struct qt_batch_sync *sync, int64_t M_total);
/* Batch norm followed by relu (six: relu6) as one op: the training forward whose apply pass
 * also clamps each pattern of rows and writes relu_mask as qt_relu_forward_mask does, while the
 * rows are in cache (out: the relu's output, bit for bit the two kernels in turn); and its
 * backward, which first masks dout in place (dout becomes the batch norm output's gradient, so
 * it must be a buffer the caller no longer needs), one reduction chunk at a time while the chunk
 * is in cache, then runs qt_batch_norm_backward_sync. */
/* relu_mask may be NULL (no relu: plain batch norm). in_div, when not NULL, holds C per-channel
 * divisors of the input: the kernels normalize inp / in_div, computing each division on the fly in
 * every pass (the float operation qt_channel_scale's division performs, so the numbers are those
 * of dividing into a buffer first, bit for bit) without the buffer: QAT's conv_bn (docs/design.md: delayed folding)
 * normalizes conv / sf this way. */
void qt_batch_norm_relu_forward_train(float *out, uint8_t *relu_mask, int six, float *mean, float *invstd,
                                      const float *inp, const float *in_div, const float *gamma, const float *beta,
                                      float *running_mean, float *running_var, float momentum, float eps, int M, int C,
                                      const struct qt_batch_sync *sync, int64_t *M_total);
void qt_batch_norm_relu_backward(float *dinp, int dinp_write, float *dgamma, float *dbeta, float *dout,
                                 const uint8_t *relu_mask, const float *inp, const float *in_div, const float *mean,
                                 const float *invstd, const float *gamma, int M, int C,
                                 const struct qt_batch_sync *sync, int64_t M_total);
/* A max pool's output gradient as its input's gradient without the input-sized buffer: windows
 * tile the (N, H, W, C) input (stride = kernel, no padding), each output routes val to its
 * window's argmax input (argmax: ih * W + iw within the image) and every other input gets +0.
 * val holds what the pool's backward writes there into a fresh buffer (0 + its gradient, after any
 * fake quant's backward between). */
typedef struct {
  const float *val;      /* (N, H / KH, W / KW, C) */
  const int32_t *argmax; /* the same shape */
  int N, H, W, KH, KW;
  int blocked; /* the batch norm's input and its gradient are blocked (above; needs
                * qt_batch_norm_pool_takes_blocked), not NHWC; val and argmax are NHWC either way */
} qt_pool_grad;
/* Whether qt_batch_norm_relu_backward_pooled takes a blocked input of C channels in this build
 * (its AVX-512 kernels; qt_batch_norm_relu_pool_forward_train takes one wherever C % 16 == 0). */
int qt_batch_norm_pool_takes_blocked(int C);
/* Rows per float partial of a per-channel sum over activations (..., C): channel_scale's backward
 * (autograd/ops.c) and qt_batch_norm_relu_backward_pooled's div_sums, which then agree bit for bit
 * where the batch norm's reduction chunks are whole multiples of it. */
#define QT_CHANNEL_SUM_ROWS 256
/* qt_batch_norm_relu_backward of the dout that pg expands to (N * H * W = M rows), bit for bit,
 * without dout in memory: each row's gradient is selected in registers (AVX-512 and C % 16 == 0)
 * or each reduction chunk of it expanded and masked in thread scratch while the chunk is in cache,
 * once for the sums and once for dinp. With in_div, dinp is the gradient of inp / in_div (the
 * quotient); with div_sums too (C doubles; needs dinp), dinp is inp's own gradient instead, that
 * divided by in_div (bit for bit channel_scale's backward of the quotient written into a fresh
 * buffer), and div_sums gets per channel the sum of the quotient's gradient times inp (in_div's
 * gradient is -div_sums / in_div^2), in the same pass: float partials over QT_CHANNEL_SUM_ROWS rows
 * from each reduction chunk's start, then double in order (channel_scale's sum, bit for bit, where
 * the chunks are whole multiples of those rows: C = 16, 32, 64 or 128). */
void qt_batch_norm_relu_backward_pooled(float *dinp, int dinp_write, float *dgamma, float *dbeta,
                                        const qt_pool_grad *pg, const uint8_t *relu_mask, const float *inp,
                                        const float *in_div, double *div_sums, const float *mean, const float *invstd,
                                        const float *gamma, int M, int C, const struct qt_batch_sync *sync,
                                        int64_t M_total);
/* A per-tensor fake quant (qt_batch_norm_relu_pool_forward_train's, between its relu and pool). */
typedef struct {
  float scale;
  int32_t zero_point;
  int qmin, qmax;
} qt_fq_params;
/* Batch norm in training mode (qt_batch_norm_relu_forward_train's statistics and running-statistic
 * updates, of inp / in_div when in_div is not NULL), then relu (relu 1), relu6 (2) or none (0),
 * then a per-tensor fake quant (fq; NULL: none), then a max pool whose K x K windows tile the
 * (N, H, W, C) input: one pass after the statistics, without the normalized, relu'd or quantized
 * tensors in memory. out and argmax are bit for bit those of the ops in turn
 * (qt_batch_norm_relu_forward_train, then qt_fake_quant_max_pool_forward or
 * qt_max_pool2d_forward). yarg (may be NULL; needs fq) gets the relu's output at each window's
 * argmax input (the fake quant's input there); qmask (may be NULL; needs fq) gets 1 where that
 * value's fake quant is in range and the relu passes it (the clipped STE's mask and the relu's
 * mask there). */
void qt_batch_norm_relu_pool_forward_train(float *out, int32_t *argmax, float *yarg, uint8_t *qmask, float *mean,
                                           float *invstd, const float *inp, const float *in_div, const float *gamma,
                                           const float *beta, float *running_mean, float *running_var, float momentum,
                                           float eps, int N, int H, int W, int C, int blocked, int K, int relu,
                                           const qt_fq_params *fq, const struct qt_batch_sync *sync, int64_t *M_total);
/* Convolution of a one-channel image (stride 1, groups 1, OC % 16 == 0, at most
 * QT_CONV1_POOL_MAX_TAPS taps), training batch norm, relu (relu 1) or relu6 (2), max pool over
 * pool x pool windows (pool <= QT_CONV1_POOL_MAX_WINDOW) tiling the convolution's output, as one
 * kernel pair (cpu_conv1_pool.c): nothing the size of the convolution's output is written. */
#define QT_CONV1_POOL_MAX_TAPS 25
#define QT_CONV1_POOL_MAX_WINDOW 7
typedef struct {
  int N, H, W, OC, KH, KW, pad_h, pad_w, pool, relu;
  int out_blocked; /* the outputs (out, argmax, yarg, qmask; g in backward) blocked (above), not NHWC */
  int OH, OW;      /* set by qt_conv1_pool_shape_init */
} qt_conv1_pool_shape;
/* 0 and OH, OW set when the kernels take the shape, else -1. */
int qt_conv1_pool_shape_init(qt_conv1_pool_shape *s);
/* Doubles of the statistics the forward hands the backward. */
size_t qt_conv1_pool_stats_len(const qt_conv1_pool_shape *s);
/* out (N, OH/pool, OW/pool, OC) and argmax (the same count of window positions, row-major in the
 * window) from img (N, H, W), w (OC, 1, KH, KW), bias (OC or NULL), gamma and beta (NULL: 1, 0),
 * with a per-tensor fake quant between the relu and the pool when fq is not NULL (yarg: the
 * relu's output at each argmax; qmask: 1 where that value's fake quant is in range and the relu
 * passes it; either may be NULL), as qt_batch_norm_relu_pool_forward_train does; the running
 * statistics updated as qt_batch_norm_relu_forward_train does; stats (qt_conv1_pool_stats_len
 * doubles: the batch statistics among them) for the backward. sync (NULL or size <= 1: none):
 * the batch is shared with other processes, whose pixel sums are summed with these (SyncBN: the
 * statistics, the normalization and the running statistics are the batch's). */
void qt_conv1_bn_relu_pool_forward_train(float *out, uint8_t *argmax, float *yarg, uint8_t *qmask, double *stats,
                                         const float *img, const float *w, const float *bias, const float *gamma,
                                         const float *beta, float *running_mean, float *running_var, float momentum,
                                         float eps, const qt_fq_params *fq, const struct qt_batch_sync *sync,
                                         const qt_conv1_pool_shape *s);
/* Where the backward gets g, one value per output: the gradient batch norm's output receives at
 * that window's argmax input (the relu's and any fake quant's backward applied). Either given
 * (g), or formed in the backward's pass from the pool output's gradient dout as the ops in turn
 * would (autograd/ops.c's pool_grad_values, bit for bit): with yarg (LSQ; yarg the forward's, fq
 * its parameters) the fake quant's LSQ backward at yarg, masked by the relu at yarg, its scale
 * terms summed as qt_fake_quant_lsq_pool_val_backward sums them (the same threads, order and
 * bits: into *lsq_dscale when not NULL; pool_inputs is the pool input's element count it takes);
 * with qmask (fixed qparams) 0 + dout where the mask is set; else (no fake quant) 0 + dout where
 * the relu passed the output out. All in the outputs' layout (NHWC or blocked). */
typedef struct {
  const float *g;
  const float *dout, *out;
  const uint8_t *qmask;
  const float *yarg;
  qt_fq_params fq;
  float grad_factor;
  double *lsq_dscale;
  int64_t pool_inputs;
} qt_conv1_pool_grad;
/* From the values pg gives, writes dw (OC x K, may be NULL), the weights' gradient, and adds
 * gamma's and beta's (may be NULL); the bias's gradient is exactly 0. With coef (N, H, W: d img /
 * d s per pixel, the image a fake quant's output with scale s), writes *dscale = the sum over
 * pixels of coef times img's gradient. sync: the forward's; then the gradients are this process's
 * terms of the batch's (batch norm's per-channel sums of the batch inside), which the processes'
 * gradient sum completes. */
void qt_conv1_bn_relu_pool_backward(double *dw, float *dgamma, float *dbeta, double *dscale,
                                    const qt_conv1_pool_grad *pg, const uint8_t *argmax, const double *stats,
                                    const float *img, const float *w, const float *gamma, const float *coef,
                                    const struct qt_batch_sync *sync, const qt_conv1_pool_shape *s);
/* Whether a relu (relu 1), relu6 (2) or none (0, always) passes the gradient at a value y it
 * output: its mask bit (qt_relu_forward_mask's test); the one statement of it, quant_relu_pass
 * (quant/quant_elem.h), which the fake-quant kernels below autograd share. */
static inline int qt_relu_passes(float y, int relu) { return quant_relu_pass(y, relu); }
/* The eval forward of inp / in_div (in_div NULL: qt_batch_norm_forward_eval). */
void qt_batch_norm_forward_eval_div(float *out, const float *inp, const float *in_div, const float *gamma,
                                    const float *beta, const float *running_mean, const float *running_var, float eps,
                                    int M, int C);
void qt_batch_norm_backward_ref(float *dinp, float *dgamma, float *dbeta, const float *dout, const float *inp,
                                const float *mean, const float *invstd, const float *gamma, int M, int C);
/* Backward of the eval forward (statistics are constants, e.g. frozen BN during QAT):
 * pass invstd = 1/sqrt(running_var + eps) and mean = running_mean. */
void qt_batch_norm_backward_eval(float *dinp, float *dgamma, float *dbeta, const float *dout, const float *inp,
                                 const float *mean, const float *invstd, const float *gamma, int M, int C);
/* The same with dinp written (never read) when dinp_write: a fresh gradient buffer, or dout
 * itself (in place); in_div as above (NULL: none). */
void qt_batch_norm_backward_eval_ex(float *dinp, int dinp_write, float *dgamma, float *dbeta, const float *dout,
                                    const float *inp, const float *in_div, const float *mean, const float *invstd,
                                    const float *gamma, int M, int C);
void qt_batch_norm_backward_eval_ref(float *dinp, float *dgamma, float *dbeta, const float *dout, const float *inp,
                                     const float *mean, const float *invstd, const float *gamma, int M, int C);

/* ---- relu (out may alias inp) ---------------------------------------------------------- */
void qt_relu_forward(float *out, const float *inp, int64_t n);
void qt_relu_forward_ref(float *out, const float *inp, int64_t n);
/* dinp += (out <= 0) ? 0 : dout (PyTorch's threshold_backward); uses the forward OUTPUT so
 * relu can run in place. */
void qt_relu_backward(float *dinp, const float *dout, const float *out, int64_t n);
void qt_relu_backward_ref(float *dinp, const float *dout, const float *out, int64_t n);

/* ---- relu6 = min(max(x, 0), 6) (out may alias inp) -------------------------------------- */
void qt_relu6_forward(float *out, const float *inp, int64_t n);
void qt_relu6_forward_ref(float *out, const float *inp, int64_t n);
/* dinp += (out <= 0 || out >= 6) ? 0 : dout (PyTorch's hardtanh_backward, judged on the OUTPUT
 * so relu6 can run in place; NaN passes the gradient). */
void qt_relu6_backward(float *dinp, const float *dout, const float *out, int64_t n);
void qt_relu6_backward_ref(float *dinp, const float *dout, const float *out, int64_t n);

/* ---- the activations of qt_activation (autograd/ops_act.c; out may alias inp) ----------- */
struct qt_act; /* autograd.h */
void qt_act_forward(float *out, const float *inp, int64_t n, const struct qt_act *a);
/* dinp += dout * act'(x): from the input inp, or for sigmoid and tanh from the output out
 * (qt_act_backward_reads_input says which of the qt_act_kind; the other may be NULL). */
void qt_act_backward(float *dinp, const float *dout, const float *inp, const float *out, int64_t n,
                     const struct qt_act *a);
int qt_act_backward_reads_input(int kind);

/* ---- channel shuffle (autograd/ops_channels.c): rows of C channels, output channel c from
 * input channel (c % groups) * (C / groups) + c / groups; the backward adds dy back there ---- */
/* Output channel c of a shuffle by `groups` of C channels reads input channel
 * qt_channel_shuffle_src(c): the input viewed as (groups, C / groups), transposed to
 * (C / groups, groups). */
int64_t qt_channel_shuffle_src(int64_t c, int64_t C, int groups);
void qt_channel_shuffle_forward(float *y, const float *x, int64_t rows, int64_t C, int groups);
/* x (N, H, W, C) -> y (N, 2H, 2W, C), nearest or bilinear (autograd/ops_resize.c); the backward
 * adds to dx. */
void qt_resize2x_forward(float *y, const float *x, int64_t N, int64_t H, int64_t W, int64_t C, int bilinear);
void qt_resize2x_backward(float *dx, const float *dy, int64_t N, int64_t H, int64_t W, int64_t C, int bilinear);
void qt_channel_shuffle_backward(float *dx, const float *dy, int64_t rows, int64_t C, int groups);

/* ---- multiplication (autograd/ops_binary.c): a (N, P, C) times b (N, C) at every p --------- */
void qt_mul_forward(float *y, const float *a, const float *b, int64_t N, int64_t P, int64_t C);
/* da += dy * b, db += sum over p of dy * a (either may be NULL) */
void qt_mul_backward(float *da, float *db, const float *dy, const float *a, const float *b, int64_t N, int64_t P,
                     int64_t C);

/* ---- the transformer's kernels (autograd/ops_tokens.c) ------------------------------------ */
/* Layer norm of rows (rows, C); mean and rstd (rows) written when not NULL; beta may be NULL. */
void qt_layer_norm_forward(float *y, float *mean, float *rstd, const float *x, const float *gamma, const float *beta,
                           int64_t rows, int64_t C, float eps);
/* dx, dgamma, dbeta += (each may be NULL), from the forward's mean and rstd. */
void qt_layer_norm_backward(float *dx, float *dgamma, float *dbeta, const float *dy, const float *x, const float *gamma,
                            const float *mean, const float *rstd, int64_t rows, int64_t C);
/* q, k, v, y (N, T, D); probs (N, heads, T, T) receives the softmax of the scaled scores. */
void qt_attention_forward(float *y, float *probs, const float *q, const float *k, const float *v, int64_t N, int64_t T,
                          int64_t D, int heads);
/* dq, dk, dv += (each may be NULL); scratch holds (N, heads, T, T) floats. */
void qt_attention_backward(float *dq, float *dk, float *dv, float *scratch, const float *dy, const float *q,
                           const float *k, const float *v, const float *probs, int64_t N, int64_t T, int64_t D,
                           int heads);

/* ---- relu / relu6 with the backward's mask as bits ------------------------------------- */
/* The training forward: out as qt_relu_forward (six: qt_relu6_forward) and mask, (n + 7) / 8
 * bytes, bit i % 8 of mask[i / 8] set where the gradient passes: the test the _backward kernels
 * above apply to the output (relu: !(out <= 0); relu6: also !(out >= 6); NaN passes). Backward
 * then reads n/8 bytes instead of the n floats of the output, and the output may be freed once
 * its consumers ran. out may alias inp. Bits past n in the last byte are 0. */
void qt_relu_forward_mask(float *out, uint8_t *mask, const float *inp, int64_t n, int six);
void qt_relu_forward_mask_ref(float *out, uint8_t *mask, const float *inp, int64_t n, int six);
/* write: dinp[i] = bit ? dout[i] : 0 (dinp may be dout: in place; -0 stays -0); otherwise
 * dinp[i] += bit ? dout[i] : 0 (the _backward kernels' sums, bit for bit). */
void qt_relu_backward_mask(float *dinp, int write, const float *dout, const uint8_t *mask, int64_t n);
void qt_relu_backward_mask_ref(float *dinp, int write, const float *dout, const uint8_t *mask, int64_t n);
/* The same over elements [i0, i1) of the whole arrays (indices absolute, i0 a multiple of 8), on
 * the calling thread: for kernels that fuse relu into a pass of their own (batch norm). */
void qt_relu_mask_span(float *out, uint8_t *mask, const float *inp, int64_t i0, int64_t i1, int six);
void qt_relu_grad_span(float *dinp, int write, const float *dout, const uint8_t *mask, int64_t i0, int64_t i1);
/* The same masking in place (written) of d, n elements of a gradient starting at element i0 (a
 * multiple of 8) of the whole array that mask covers: for a gradient held in scratch. */
void qt_relu_grad_span_at(float *d, const uint8_t *mask, int64_t i0, int64_t n);

/* ---- pooling over NHWC ------------------------------------------------------------------ */
typedef struct {
  int N, H, W, C;
  int KH, KW, stride_h, stride_w, pad_h, pad_w;
  int ceil_mode; /* 0: floor mode (PyTorch's default); 1: ceil mode (the last window may hang over) */
  int OH, OW;    /* derived by qt_pool2d_shape_init, as PyTorch's pooling_output_shape */
} qt_pool2d_shape;
int qt_pool2d_shape_init(qt_pool2d_shape *s);

/* Max pool; argmax (N, OH, OW, C) holds the flat index h*W+w of the chosen input (padding is
 * -inf, ties pick the first in row-major window order, as PyTorch). */
void qt_max_pool2d_forward(float *out, int32_t *argmax, const float *inp, const qt_pool2d_shape *s);
void qt_max_pool2d_forward_ref(float *out, int32_t *argmax, const float *inp, const qt_pool2d_shape *s);
void qt_max_pool2d_backward(float *dinp, const float *dout, const int32_t *argmax, const qt_pool2d_shape *s);
/* The same with dinp written (=) when dinp_write (a fresh gradient buffer: never read). */
void qt_max_pool2d_backward_ex(float *dinp, int dinp_write, const float *dout, const int32_t *argmax,
                               const qt_pool2d_shape *s);
void qt_max_pool2d_backward_ref(float *dinp, const float *dout, const int32_t *argmax, const qt_pool2d_shape *s);
/* Average pool, count_include_pad = true (PyTorch's default). */
void qt_avg_pool2d_forward(float *out, const float *inp, const qt_pool2d_shape *s);
void qt_avg_pool2d_forward_ref(float *out, const float *inp, const qt_pool2d_shape *s);
void qt_avg_pool2d_backward(float *dinp, const float *dout, const qt_pool2d_shape *s);
void qt_avg_pool2d_backward_ref(float *dinp, const float *dout, const qt_pool2d_shape *s);
/* Global average pool: out (N, C) = mean over H*W of inp (N, HW, C). */
void qt_global_avg_pool_forward(float *out, const float *inp, int N, int HW, int C);
void qt_global_avg_pool_forward_ref(float *out, const float *inp, int N, int HW, int C);
/* dinp += dout / HW over each image's HW positions; with write set, = instead of += */
void qt_global_avg_pool_backward(float *dinp, int write, const float *dout, int N, int HW, int C);
void qt_global_avg_pool_backward_ref(float *dinp, int write, const float *dout, int N, int HW, int C);

/* ---- add (residual) --------------------------------------------------------------------- */
void qt_add_forward(float *out, const float *a, const float *b, int64_t n);
void qt_add_forward_ref(float *out, const float *a, const float *b, int64_t n);
/* da += dout; db += dout (either may be NULL); with da_write / db_write set, = instead of +=
 * (a gradient buffer not yet written) */
void qt_add_backward(float *da, int da_write, float *db, int db_write, const float *dout, int64_t n);
void qt_add_backward_ref(float *da, int da_write, float *db, int db_write, const float *dout, int64_t n);

/* ---- softmax cross-entropy (mean over the batch) ---------------------------------------- */
/* probs (N, C) receives softmax(logits); returns the mean negative log-likelihood.
 * Labels must lie in [0, C). */
/* p = softmax(x) of one row of C (max subtracted; p may be x); the max and the sum of the
 * exponentials in *max and *sum when not NULL. */
void qt_softmax_row(float *p, const float *x, int64_t C, float *max, float *sum);
float qt_cross_entropy_forward(float *probs, const float *logits, const int32_t *labels, int N, int C);
float qt_cross_entropy_forward_ref(float *probs, const float *logits, const int32_t *labels, int N, int C);
/* dlogits += dloss * (probs - onehot(labels)) / N */
void qt_cross_entropy_backward(float *dlogits, const float *probs, const int32_t *labels, float dloss, int N, int C);
void qt_cross_entropy_backward_ref(float *dlogits, const float *probs, const int32_t *labels, float dloss, int N,
                                   int C);

#endif
