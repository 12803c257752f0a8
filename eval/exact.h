/* The exact reference representation of a Q/DQ graph: what the quantized model computes as
 * mathematics, independent of any summation order, so that every device (oneDNN, the
 * accelerator, a future XNNPACK) and the float32 Q/DQ executor (qt_graph_forward) can be judged
 * against one answer.
 *
 * Arithmetic, node by node:
 *   - quantize of fp32 data (the graph input): the format's formula exactly, in float32
 *     (q = clamp(round_half_even(x * (1.0f/s)) + zp, qmin, qmax); docs/qdq_format.md): the data
 *     are float32, and that formula is the only definition of their quantization.
 *   - conv2d / linear whose input is a per-tensor dequantize of integers (directly, or through
 *     max pooling and flatten, which commute with it: the integers are pooled) and whose weights
 *     are integers: the integer math. acc = sum (q_x - zp_x) * (q_w - zp_w), exact (int32 partial
 *     sums over at most 16384 terms, added in int64; |q - zp| <= 255 by the format's ranges),
 *     then y = acc * (s_x * s_w[c]) + bias[c] in float64 (s_x * s_w[c] is exact in float64).
 *   - every other op (a conv or linear on fp32 data or with fp32 weights, batch norm, pools,
 *     add, relu, relu6, flatten, dequantize) in float64; dequantize ((q - zp) * s) and
 *     integer-weight dequantization are exact there.
 *   - quantize of a value computed here (requantization): q = clamp(round_half_even(y / s) + zp,
 *     qmin, qmax) with y and the division in float64.
 * The output is returned as float32: a dequantized output ((q - zp) * s) is then exactly what a
 * float32 dequantize of the same integers gives, so a device's output can be compared in LSB.
 *
 * What float64 leaves: the sums of avg/global-average pooling, batch norm and fp32-weight layers
 * are float64 sums (errors ~1e-16 relative, far below any quantization step); everything on the
 * integer path is exact up to the one float64 rounding of acc * scale + bias. */
#ifndef QT_EXACT_H
#define QT_EXACT_H

#include <stdint.h>

#include "nn/nn.h"

typedef struct qt_exact qt_exact; /* opaque */

/* Plans the finalized Q/DQ graph g (qt_convert / qt_qdq_load): integer weights reordered and
 * centred once. g must outlive the reference and its parameters stay unchanged. NULL with err for a
 * prepared graph (fake_quant / conv_bn nodes: convert it first) or a layer whose integer
 * weights lie outside the 8-bit range. */
qt_exact *qt_exact_open(const qt_graph *g, char *err);
void qt_exact_free(qt_exact *x);

/* Runs input (n, H, W, C) fp32 NHWC; writes out (n, qt_exact_output_numel) fp32. Images are
 * processed in chunks (memory does not grow with n) and in parallel (OpenMP); the result does not
 * depend on the thread count. Returns 0, or -1 with err (a non-finite value reaching a quantize
 * is quantized as qt_quantize does: NaN to the clamp's bound). */
int qt_exact_run(qt_exact *x, float *out, const float *input, int n, char *err);
int64_t qt_exact_output_numel(const qt_exact *x);

/* Teacher forcing, to judge a device one partition at a time: runs input as qt_exact_run does,
 * except at each quantize node whose output value v has forced[v] != NULL (forced and own are
 * indexed by value, g->n_values long). There the reference's own integers are written to own[v]
 * (n, numel of v), then replaced by forced[v] (n, numel: a device's integers at that point) for
 * every node after it. So own[v] is what the exact arithmetic makes of the device's own inputs to
 * the nodes between the quantization points before v and v: one partition, judged alone. */
int qt_exact_run_forced(qt_exact *x, float *out, const float *input, int n, const int32_t *const *forced,
                        int32_t *const *own, char *err);
/* Runs input as qt_exact_run does and also writes what the reference computes at values[k]
 * (value indices of g) to dst[k] (n, numel of that value) fp32: integers dequantized in float32,
 * (q - zp) * s, as a device returns a quantize's output (qt_device_read_value); float64 data
 * rounded to float32. */
int qt_exact_run_values(qt_exact *x, float *out, const float *input, int n, const int *values, float *const *dst,
                        int n_values, char *err);
/* Nodes computed on the integer path (conv2d / linear), for reports. */
int qt_exact_integer_layers(const qt_exact *x);

#endif
