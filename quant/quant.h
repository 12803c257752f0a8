/* Quantization numerics (docs/design.md: numerics): qparams from a range, observers, fake quant with
 * the clipped straight-through estimator, and the LSQ learnable-scale variant. Plain
 * functions over raw buffers, each optimized kernel with a `_ref` twin. Matches PyTorch 1.13
 * bit for bit where PyTorch defines the operation.
 *
 * Layout for per-channel operations: a tensor is viewed as (outer, channels, inner) with the
 * quantization axis in the middle: OIHW weights per output channel are (1, OC, C*KH*KW);
 * NHWC activations per channel are (N*H*W, C, 1); per-tensor is channels == 1. */
#ifndef QT_QUANT_H
#define QT_QUANT_H

#include <stdint.h>

#include "base/base.h"

/* ---- quantization spec ----------------------------------------------------------------- */
/* Integer range for a bit width: signed [-2^(b-1), 2^(b-1)-1] or unsigned [0, 2^b - 1],
 * bits in 2..8. Returns -1 for a bit width outside 2..8. */
int qt_qrange(int bits, int is_signed, int *qmin, int *qmax);

/* qparams from an observed range (docs/design.md: qparams), PyTorch's _calculate_qparams in float32:
 * the range is first widened to include 0; affine: s = (max-min)/(qmax-qmin),
 * zp = clamp(qmin - round_half_even(min/s), qmin, qmax); symmetric: s = max(-min, max) /
 * ((qmax-qmin)/2), zp = 0 for a signed range; s clamped to >= FLT_EPSILON. Real divisions,
 * as PyTorch (a reciprocal-multiply differs on some ranges; the tests hold such ranges).
 * Unsigned symmetric: PyTorch gives 128 for quint8 with its default range and the
 * down-rounded midpoint (qmin+qmax)/2 for a customized range; we give 128 for [0, 255] and
 * (qmin+qmax)/2 otherwise (so quant_min=0, quant_max=255 passed explicitly to PyTorch, which
 * yields 127, and reduce_range quint8 [0, 127], which keeps 128, are the two we do not match).
 * Returns -1 when min or max is not finite, min > max, or the width overflows float32;
 * qmin >= qmax is a broken invariant (abort). */
int qt_qparams_from_range(float min, float max, int qmin, int qmax, int symmetric, float *scale, int32_t *zp);

/* ---- fake quant ------------------------------------------------------------------------ */
/* out = (clamp(nearbyint(x * inv_s) + zp, qmin, qmax) - zp) * s with inv_s = 1.0f / s computed
 * in float32; mask[i] = 1 iff qmin <= nearbyint(x*inv_s) + zp <= qmax (the clipped STE), may be
 * NULL. One fused, vectorized OpenMP pass (static schedule). out may equal inp.
 * Bit-exact with PyTorch 1.13's fake_quantize_per_tensor_affine(_cachemask) and
 * fake_quantize_per_channel_affine(_cachemask) on x86: both compute x * (1.0f / s) (per channel
 * too: inv_s per element from the channel's float scale, no division of x), add the integer
 * zero point in float after rounding (zp + nearbyint(x * inv_s)), cast to int64 and judge the
 * mask on that. The cast turns NaN, +-Inf and |q| >= 2^63 into INT64_MIN, so those inputs give
 * quant_min with mask 0, +Inf and 1e30 included; values with |x * inv_s| < 2^63 clamp normally. */
void qt_fake_quant_forward(float *out, uint8_t *mask, const float *inp, int64_t outer, int channels, int64_t inner,
                           const float *scale, const int32_t *zero_point, int qmin, int qmax);
void qt_fake_quant_forward_ref(float *out, uint8_t *mask, const float *inp, int64_t outer, int channels, int64_t inner,
                               const float *scale, const int32_t *zero_point, int qmin, int qmax);
/* dinp += dout * mask (n = outer*channels*inner elements) */
void qt_fake_quant_backward(float *dinp, const float *dout, const uint8_t *mask, int64_t n);
void qt_fake_quant_backward_ref(float *dinp, const float *dout, const uint8_t *mask, int64_t n);

/* LSQ (PyTorch's _fake_quantize_learnable_per_{tensor,channel}_affine backward, grad_factor
 * applied): dinp += dout * in_range; dscale[c] += grad_factor * sum over the channel of
 * dout * (in_range ? (fq(x) - x) / s : (clamped_q - zp)); dzero_point[c] (may be NULL) +=
 * sum of (in_range ? 0 : -dout * s * grad_factor). Accumulates. The forward is
 * qt_fake_quant_forward. Per element bit-exact with PyTorch 1.13's AVX2 CPU kernel, which its
 * compiler contracts into FMAs: xq = nearbyint(fma(x, inv_s, zp)) (rounded *after* adding zp,
 * unlike the forward, so in_range can differ from the forward mask on near-ties) and
 * fq(x) - x = fma(xq - zp, s, -x); terms multiply left to right ((dout * d) * inv_s) * gf.
 * Sums are taken in double in a fixed order (deterministic for a thread count); PyTorch sums
 * float32, so sums agree to ~1e-6 of sum |term|. Zero points are int32 here, the same in both
 * passes; PyTorch's per-tensor backward uses trunc(zp + 0.5), which already disagrees with its
 * own forward for a negative zero point (-3 becomes -2): not reproduced. */
void qt_fake_quant_lsq_backward(float *dinp, float *dscale, float *dzero_point, const float *dout, const float *inp,
                                int64_t outer, int channels, int64_t inner, const float *scale,
                                const int32_t *zero_point, int qmin, int qmax, float grad_factor);
/* The same with dinp written (0 + dx, the bits of adding to zeros) when dinp_write: its old values
 * are read and ignored, so it must be initialized memory, typically dout itself (the output's
 * final gradient, overwritten in place and handed to the input). */
void qt_fake_quant_lsq_backward_ex(float *dinp, int dinp_write, float *dscale, float *dzero_point, const float *dout,
                                   const float *inp, int64_t outer, int channels, int64_t inner, const float *scale,
                                   const int32_t *zero_point, int qmin, int qmax, float grad_factor);
void qt_fake_quant_lsq_backward_ref(float *dinp, float *dscale, float *dzero_point, const float *dout, const float *inp,
                                    int64_t outer, int channels, int64_t inner, const float *scale,
                                    const int32_t *zero_point, int qmin, int qmax, float grad_factor);

/* Per element, what the per-tensor LSQ scale gradient multiplies the output gradient by (then
 * grad_factor): (fq(x) - x) / s in the clamp range (LSQ_ELEMENT's range test, as
 * qt_fake_quant_lsq_backward decides it), else qmax - zp or qmin - zp. So that dscale =
 * grad_factor * sum(dout * coef) can be formed where dout is never in memory: a first
 * convolution's input gradient is never computed when nothing but the input quantizer's scale
 * needs it (qt_conv2d_lsq_input, autograd.h). */
void qt_fake_quant_lsq_scale_coef(float *coef, const float *inp, int64_t n, float scale, int32_t zero_point, int qmin,
                                  int qmax);

/* A per-tensor fake quant followed by a max pool whose windows tile the input (stride = kernel,
 * no padding; (N, H, W, C) channels last, H and W multiples of KH and KW), as one pass: out and
 * argmax (an index ih * W + iw into the image, the first maximum in the window's row-major order)
 * are bit for bit what qt_fake_quant_forward then qt_max_pool2d_forward give, without the fake
 * quantized tensor in memory. The backward is the LSQ backward of that composition: the pool
 * routes the output gradient to each window's argmax, the other inputs get zero, so the LSQ terms
 * are those of the argmax inputs alone: dinp (written when dinp_write, else added to) has the
 * composition's bits; dscale (+=, may be NULL) sums the same terms in another order (each
 * thread's images in turn, in double), so it can differ from the composition's in the last bit
 * of the float when the double sums round differently. dinp may be NULL. */
void qt_fake_quant_max_pool_forward(float *out, int32_t *argmax, uint8_t *mask, const float *inp, int N, int H, int W,
                                    int C, int KH, int KW, float scale, int32_t zero_point, int qmin, int qmax);
void qt_fake_quant_lsq_max_pool_backward(float *dinp, int dinp_write, float *dscale, const float *dout,
                                         const int32_t *argmax, const float *inp, int N, int H, int W, int C, int KH,
                                         int KW, float scale, int32_t zero_point, int qmin, int qmax,
                                         float grad_factor);
/* The same backward without the input-sized gradient: dval (one float per output) gets what it
 * writes at each window's argmax input (0 + that input's gradient; qt_pool_grad in
 * autograd/kernels.h expands it), dscale the same bits as above. */
void qt_fake_quant_lsq_max_pool_backward_val(float *dval, float *dscale, const float *dout, const int32_t *argmax,
                                             const float *inp, int N, int H, int W, int C, int KH, int KW, float scale,
                                             int32_t zero_point, int qmin, int qmax, float grad_factor);
/* The same from the argmax inputs' values alone (xarg: one per output, as
 * qt_batch_norm_relu_pool_forward_train's yarg; per_image outputs per image; inputs: the pool
 * input's element count, which decides the threads as above so dscale has the same bits), with a
 * relu before the fake quant folded in: relu 1 (relu) or 2 (relu6) makes val +0 wherever the
 * relu's backward would block xarg's gradient (0: none). */
void qt_fake_quant_lsq_pool_val_backward(float *val, float *dscale, const float *dout, const float *xarg, int N,
                                         int per_image, int C, int64_t inputs, float scale, int32_t zero_point,
                                         int qmin, int qmax, float grad_factor, int relu);
/* The clipped STE's backward of that composition (a fake quant with fixed qparams), given the
 * forward's mask (may be NULL there when not needed: one byte per output, the argmax input's
 * clamp-range bit): dinp (written when dinp_write, else added to) has the composition's bits
 * (max_pool2d's backward into a fresh buffer, then qt_fake_quant's in place or added). */
void qt_fake_quant_max_pool_backward(float *dinp, int dinp_write, const float *dout, const int32_t *argmax,
                                     const uint8_t *mask, int N, int H, int W, int C, int KH, int KW);

/* Quantize to integers (the convert graph's Q node): q = clamp(nearbyint(x*inv_s) + zp, qmin,
 * qmax) stored as int32; dequantize: x = (q - zp) * s. dequantize(quantize(x)) equals
 * qt_fake_quant_forward bit for bit (non-finite inputs included), and quantize matches
 * torch.quantize_per_{tensor,channel}(...).int_repr() on finite inputs (8-bit ranges tested). */
void qt_quantize(int32_t *q, const float *inp, int64_t outer, int channels, int64_t inner, const float *scale,
                 const int32_t *zero_point, int qmin, int qmax);
void qt_dequantize(float *out, const int32_t *q, int64_t outer, int channels, int64_t inner, const float *scale,
                   const int32_t *zero_point);

/* ---- observers ------------------------------------------------------------------------- */
typedef enum {
  QT_OBSERVER_MINMAX,         /* running min/max over everything seen */
  QT_OBSERVER_MOVING_AVERAGE, /* min += c*(batch_min - min), c = averaging_constant, first batch initializes */
  QT_OBSERVER_HISTOGRAM,      /* per-tensor only: histogram of values, range by percentile or MSE */
  QT_OBSERVER_COUNT
} qt_observer_kind;
const char *qt_observer_kind_name(qt_observer_kind k);
int qt_observer_kind_parse(const char *name, qt_observer_kind *out);

typedef enum { QT_RANGE_MINMAX, QT_RANGE_PERCENTILE, QT_RANGE_MSE, QT_RANGE_COUNT } qt_range_method;
const char *qt_range_method_name(qt_range_method m);
int qt_range_method_parse(const char *name, qt_range_method *out);

/* Histogram (our design, documented in quant/quant_observer.c): `bins` equal bins, the range
 * grown on the old grid (whole old bins merge into new ones, no interpolation) when a batch
 * falls outside it. Percentile clips (100 - p)% of the counts from each tail. MSE minimizes the
 * modelled error of fake quant with the qparams each candidate range yields (clipped mass: exact
 * squared distance; in-range mass: s^2/12), over a 129 x 129 grid of [min, 0] x [0, max] refined
 * twice (symmetric grids: one dimension, max|x|); qt_observer_qparams searches with the grid
 * (affine or symmetric) it will use, qt_observer_range with an affine grid.
 * Init defaults: averaging_constant 0.01, percentile 99.99, bins 2048, method MSE for the
 * histogram and MINMAX otherwise. `bins` may change only before the first update or after a
 * reset (the histogram is allocated at the first update). */
typedef struct {
  qt_observer_kind kind;
  int channels;             /* 1 = per-tensor */
  float averaging_constant; /* moving average: 0.01 */
  qt_range_method method;   /* histogram: how calibrate picks the range */
  float percentile;         /* histogram + percentile: e.g. 99.99 (two-sided: both tails) */
  int bins;                 /* histogram: 2048 */
  /* state */
  int initialized;
  float *min, *max; /* channels each */
  int64_t *hist;    /* bins counts over [hist_min, hist_max] */
  float hist_min, hist_max;
} qt_observer;

/* Allocates state for `channels`; histogram requires channels == 1. Returns -1 with a message. */
int qt_observer_init(qt_observer *o, qt_observer_kind kind, int channels, char *err);
void qt_observer_free(qt_observer *o);
void qt_observer_reset(qt_observer *o);
/* Observes x viewed as (outer, channels, inner). A NaN or Inf in x is an error: returns -1
 * with "observer: input holds NaN at element i" (or +Inf / -Inf; i is the first bad element;
 * the caller prefixes the node name) and leaves the state unchanged. An empty x changes
 * nothing. Min-max and moving average match PyTorch's (PerChannel)MinMaxObserver and
 * MovingAverage(PerChannel)MinMaxObserver bit for bit: min = min(min, batch_min);
 * min = min + c * (batch_min - min) in two float32 roundings, the first batch initializing. */
int qt_observer_update(qt_observer *o, const float *x, int64_t outer, int64_t inner, char *err);
/* The same for a batch split across the processes of sync (base.h; NULL or size 1: exactly
 * qt_observer_update): x is this process's slice (it may be empty), and every process's state
 * becomes the one a single observer reaches from the whole batch, bit for bit: the slices'
 * min/max are gathered (order does not matter to them), the histogram grows to the same grid on
 * every process and the slices' counts on it are summed. A NaN or Inf in any slice is the same
 * error on every process, naming the process. Every process must call it. */
int qt_observer_update_sync(qt_observer *o, const float *x, int64_t outer, int64_t inner, const qt_batch_sync *sync,
                            char *err);
/* The observed range per channel (for the histogram: by its method, for the given qmin/qmax:
 * percentile clips both tails; MSE searches the clipping range minimizing the expected
 * quantization + clipping squared error over the histogram, as PyTorch's HistogramObserver's
 * L2 search does in spirit). Returns -1 when nothing was observed. */
int qt_observer_range(const qt_observer *o, int qmin, int qmax, float *min, float *max);
/* qparams per channel from the observed range (qt_qparams_from_range). Returns -1 with a
 * message when nothing was observed (PyTorch would return scale 1, zero point 0) or the
 * histogram's percentile lies outside (50, 100]. */
int qt_observer_qparams(const qt_observer *o, int qmin, int qmax, int symmetric, float *scale, int32_t *zp, char *err);
/* Copies state (for checkpoints/convert), deep: dst is a zeroed struct or an initialized
 * observer (whose buffers are freed). */
int qt_observer_copy(qt_observer *dst, const qt_observer *src, char *err);

#endif
