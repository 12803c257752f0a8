/* ONNX QDQ export: a Q/DQ graph (what qt_convert produces, or qt_qdq_load reads from model_qdq.h5)
 * written as a standard QDQ ONNX model (IR version 8, opset 13) that onnx.checker accepts with
 * full checking and ONNX Runtime runs. The protobuf is built from the protobuf-c code generated
 * from Debian's onnx.proto and packed with onnx__model_proto__pack; nothing is encoded by hand.
 *
 * What it writes (docs/onnx_export.md):
 * - every quantize -> dequantize pair as QuantizeLinear -> DequantizeLinear with the node's own
 *   scale and zero point (per tensor: scalars; per channel: axis 1, the channel axis of NCHW);
 *   8-bit containers: uint8 for an unsigned range, int8 for a signed one.
 * - integer weights as int8 / uint8 initializers ("<node>.weight_int") read by a
 *   DequantizeLinear ("<node>.weight.dequantize", per channel with axis 0, OIHW / (OUT, IN));
 *   a layer left in fp32 keeps its float weight.
 * - biases as the graph has them: an int32 bias (the Quantizer's bias_int32: quant.bias = int32,
 *   always for XNNPACK) as its integers ("<node>.bias_int", int32) read by a DequantizeLinear of
 *   scale s_x * s_w[c] (the float32 product, zero point 0, axis 0); a float bias in fp32, since
 *   an int32 form would compute something else (the bias rounded to accumulator units);
 *   qt_onnx_export_options.int32_bias writes that rounded int32 form on request. (ONNX Runtime 1.30 with optimizations
 * on quantizes an fp32 bias that way itself and fuses the layer into its integer kernels; docs/onnx_export.md.)
 * - bit widths below 8 (and narrowed ranges such as 7-bit weights) stay in 8-bit containers with
 *   their integers as they are. Weights need nothing more (their integers are already in range).
 *   An activation quantize whose [qmin, qmax] is narrower than its container's range (a 4-bit
 *   activation, [0, 15] in uint8) is QuantizeLinear -> Clip -> DequantizeLinear ("QCDQ"): the
 *   Clip, named "<quantize node>.clip", clamps the saturated integers to [qmin, qmax] with bounds
 *   of the container's type, and clamp(clamp(v, 0, 255), qmin, qmax) = clamp(v, qmin, qmax), so
 *   the integers are the graph's. ONNX Runtime's QDQ selectors see op -> QuantizeLinear as at
 *   8 bits and fuse the op into its integer kernels (a float Clip before the QuantizeLinear kept
 *   every such op in fp32). Where only a max pool reads the dequantized value, the pool runs on
 *   the integers and the Clip and DequantizeLinear follow it (the same values: max commutes with
 *   the monotonic clamp and dequantization), which keeps ONNX Runtime's conv -> pool chain in
 *   NHWC. A relu6 that only such a narrowed quantize reads, whose top (qmax - zp) * s is at most
 *   6, is written as Relu (the same integers; ONNX Runtime folds a Relu into the QuantizeLinear,
 *   not a Clip(0, 6) whose bound its 8-bit container exceeds).
 * - layout: the graph is NHWC, ONNX NCHW. The input is declared [batch, C, H, W] (a dynamic
 *   batch dim "batch"; a flat input [batch, F]); conv weights are OIHW in both; a flatten of an
 *   H x W x C image (H*W > 1, C > 1) yields ONNX's (c, h, w) order, so the linear layer reading it
 *   gets its weight columns permuted back: W_onnx[o, c*H*W + h*W + w] = W_ir[o, (h*W + w)*C + c]
 *   (the reverse of the import's permutation). An image output would be NCHW.
 * - ops: conv2d -> Conv, linear -> Gemm (transB = 1), relu -> Relu, relu6 -> Clip(0, 6) (bounds
 *   as inputs), max_pool2d -> MaxPool, avg_pool2d -> AveragePool (count_include_pad = 1),
 *   global_avg_pool -> GlobalAveragePool + Flatten, flatten -> Reshape to [N, -1] (ONNX Runtime
 *   moves a DequantizeLinear past a Reshape, not a Flatten, and so fuses the linear layer after
 *   it), add -> Add, batch_norm ->
 *   BatchNormalization. Node names are the graph's; the graph input is "input" and its output
 *   "logits". The input preprocessing, when the graph records it, is written as metadata
 *   ("qt.input_preprocessing").
 *
 * One difference is left to the ONNX definition: QuantizeLinear computes x / s, the Q/DQ graph
 * x * (1/s) in float32 (docs/design.md: rounding); the two round differently on rare inputs (1 LSB at that
 * quantization point). NaN inputs are ONNX Runtime's business.
 *
 * Refused, with err naming the node and its op: prepared (training) graphs (fake_quant, conv_bn,
 * weights without integers: export model_qdq.h5, not model_trained.h5), ranges that fit no 8-bit
 * container (16-bit records), a per-channel activation quantize that reads a permuted flatten,
 * a batch_norm of a flattened image, an add of two values in different
 * orders, an output that is a flattened image, names that would collide in the ONNX file, and an
 * output path that exists as something other than a regular file (a symlink or a device such as
 * /dev/stdout, which the atomic rename would replace). */
#ifndef QT_ONNX_EXPORT_H
#define QT_ONNX_EXPORT_H

#include <stdint.h>

#include "nn/nn.h"

#define QT_ONNX_EXPORT_IR_VERSION 8
#define QT_ONNX_EXPORT_OPSET 13

/* What the export wrote, for reports. */
typedef struct {
  int64_t ir_version, opset;
  int nodes; /* ONNX nodes */
  int initializers;
  int quantize;      /* QuantizeLinear of activations */
  int dequantize;    /* DequantizeLinear of activations */
  int int_weights;   /* integer weight initializers, each read by a DequantizeLinear */
  int float_weights; /* fp32 weights (layers left in fp32) */
  int float_biases;  /* fp32 biases */
  int int32_biases;  /* int32 biases (the graph's, or qt_onnx_export_options.int32_bias) */
  int clips;         /* integer Clips narrowing a sub-8-bit (or narrowed) activation range */
  int relu6_as_relu; /* relu6 written as Relu: the narrowed quantize reading it bounds it at 6 */
  int permuted;      /* linear weights whose columns were permuted to NCHW flatten order */
  int64_t bytes;     /* size of the file written */
  int io_error;      /* on failure: 1 when writing the file failed (the environment), 0 when the
                      * graph was refused (bad input) */
} qt_onnx_export_info;

/* Choices of the export (all off: the Q/DQ graph exactly). */
typedef struct {
  /* Float biases too as int32 in accumulator units (a graph's own int32 biases are written as
   * such anyway), read by a DequantizeLinear of scale s_x * s_w[c] (the float32 product, zero
   * point 0, axis 0), for every layer with integer weights whose input is a per-tensor
   * dequantize (through max pooling or flatten): b_q = round_half_even(b / (s_x * s_w[c])). ONNX Runtime fuses
   * dequantize -> Conv/Gemm -> quantize into its integer kernels (QLinearConv, QGemm) only when the bias is such an
   * int32; the fp32 bias the Q/DQ graph holds differs from b_q * s_x * s_w[c] by at most half of s_x * s_w[c], far
   * below an output LSB, but it is a change of the model: off by default (qat_export --int32-bias). */
  int int32_bias;
} qt_onnx_export_options;

/* Writes the Q/DQ graph g to path as a QDQ ONNX model (atomically: a qt_temp_create file, fsync, rename; a
 * failure leaves any previous file untouched). Returns 0, or -1 with err
 * ("onnx export: <path>: node '<name>' (<op>): <what>") and info->io_error set. info may be
 * NULL. */
int qt_onnx_export_qdq(const qt_graph *g, const char *path, qt_onnx_export_info *info, char *err);
/* The same with choices (opt NULL: none). */
int qt_onnx_export_qdq_opt(const qt_graph *g, const char *path, const qt_onnx_export_options *opt,
                           qt_onnx_export_info *info, char *err);

#endif
