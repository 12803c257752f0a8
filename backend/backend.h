/* Deployment backend (DESIGN 1, "lower"): turns a Q/DQ graph (docs/qdq_format.md, from
 * qt_convert or qt_qdq_load) into a lowered model that runs int8 oneDNN kernels where a
 * pattern matches and fp32 fallback partitions elsewhere, and runs it on batches.
 *
 * Lowered patterns (u8 affine activations, s8 per-channel symmetric weights):
 *   dq -> conv2d [-> relu] -> q     one oneDNN int8 convolution (runtime zero points, fused
 *                                   ReLU, per-channel output scales, clip for < 8-bit ranges)
 *   dq -> linear [-> relu] -> q     one oneDNN int8 inner product (source zero point folded
 *                                   into the bias; a non-zero output zero point requantizes
 *                                   the f32 result in a small loop)
 *   max_pool2d / flatten of a dq    run on the u8 tensor (dequantize is monotone: exact)
 *   q of the fp32 graph input       quantize straight to u8
 * Anything else runs as dq -> fp32 op -> q with the framework's fp32 kernels: a fallback
 * partition, listed in the partition report with its reason. Activations stay NHWC u8
 * between int8 kernels; primitives are created once per batch size, weights reordered once.
 *
 * Numerics: int8 partitions match the Q/DQ reference interpreter (qt_graph_forward) to 1 LSB
 * of the output quantization (float rounding of scales), exactly where the arithmetic is
 * exact; fallback partitions compute what the interpreter computes, bit for bit. */
#ifndef QT_BACKEND_H
#define QT_BACKEND_H

#include <stdint.h>
#include <stdio.h>

#include "nn/nn.h"

typedef struct qt_lowered qt_lowered; /* opaque */

typedef enum {
  QT_PART_INT8,     /* one int8 kernel (or a u8 view) */
  QT_PART_FALLBACK, /* dq -> fp32 op -> q on the CPU */
  QT_PART_BOUNDARY, /* a quantize of an fp32 value or a dequantize materializing fp32 */
  QT_PART_COUNT
} qt_partition_kind;
const char *qt_partition_kind_name(qt_partition_kind k);

/* Lowers a finalized Q/DQ graph. Everything needed is copied: g may be freed afterwards.
 * NULL with err set for a graph that is not a Q/DQ graph (fake_quant / conv_bn nodes or
 * weights without integers: a prepared graph, convert it first). */
qt_lowered *qt_lower(const qt_graph *g, char *err);
void qt_lowered_free(qt_lowered *m);

/* Runs the model on input (n, H, W, C) fp32 NHWC; writes out (n, qt_lowered_output_numel)
 * fp32: the graph output as the Q/DQ graph defines it (the dequantized integers when the
 * output is a dq). Returns 0, or -1 with err set (shape mismatch). */
int qt_lowered_run(qt_lowered *m, float *out, const float *input, int n, char *err);
int64_t qt_lowered_output_numel(const qt_lowered *m);
void qt_lowered_input_shape(const qt_lowered *m, int *h, int *w, int *c);

/* Partitions in execution order: kind, the Q/DQ graph nodes covered ("a -> b -> c") and a
 * detail (the kernel, or for a fallback the reason). */
int qt_lowered_partition_count(const qt_lowered *m);
qt_partition_kind qt_lowered_partition(const qt_lowered *m, int i, const char **nodes, const char **detail);
/* Number of partitions of a kind. */
int qt_lowered_count(const qt_lowered *m, qt_partition_kind k);
/* The report: a header line, then one line per partition. */
void qt_lowered_report(const qt_lowered *m, FILE *f);

#endif
