/* Deployment backends (docs/design.md: pipeline): a device (qt_device, below) deploys a Q/DQ graph
 * (docs/qdq_format.md, from qt_convert or qt_qdq_load) on a backend and runs it on batches.
 * The built-in backend, onednn_cpu, lowers it to int8 oneDNN kernels where a pattern matches
 * and fp32 fallback partitions elsewhere (backend/lower.c); the built-in xnnpack backend lowers
 * it to XNNPACK's qs8 / qc8 operators the same way (backend/xnnpack.c: conv incl. depthwise and
 * grouped, fully connected with per-tensor weights, add, global average pooling, max pooling,
 * relu / relu6 as output clamps, flatten as a view; XNNPACK's int32 bias and float32
 * requantization keep each operator within 1 output LSB of the exact reference); an
 * accelerator described by a file is simulated (backend/accel.c, described below).
 *
 * Lowered patterns (u8 affine activations, s8 per-channel symmetric weights):
 *   dq -> conv2d [-> relu] -> q     one oneDNN int8 convolution (runtime zero points, fused
 *                                   ReLU, per-channel output scales, clip for < 8-bit ranges)
 *   dq -> linear [-> relu] -> q     one oneDNN int8 inner product (source zero point folded
 *                                   into the bias; a non-zero output zero point requantizes
 *                                   the f32 result in a small loop)
 *   max_pool2d / flatten of a dq    run on the u8 tensor (dequantize is monotone: exact)
 *   dq + dq -> add [-> relu] -> q   u8 + u8 -> u8, each input with its own scale and zero
 *                                   point, requantized in the reference's float operations
 *                                   (bit-exact; ResCNN's residual blocks stay on u8)
 *   q of the fp32 graph input       quantize straight to u8
 * Anything else runs as dq -> fp32 op -> q with the framework's fp32 kernels: a fallback
 * partition, listed in the partition report with its reason. Activations stay NHWC u8
 * between int8 kernels; primitives are created once per batch size, weights reordered once.
 *
 * Numerics: int8 partitions match the Q/DQ graph's exact reference (eval/exact.h, which the
 * report and --compare judge with) to 1 LSB of the output quantization (float rounding of
 * scales), exactly where the arithmetic is exact; fallback partitions compute what the float32
 * executor (qt_graph_forward) computes, bit for bit. */
#ifndef QT_BACKEND_H
#define QT_BACKEND_H

#include <stdint.h>
#include <stdio.h>

#include "nn/nn.h"
#include "qat/qat.h" /* qt_backend_desc */

/* ==== the device: one handle for every backend ================================================ */
/* A device is a backend (its description, qat.h) plus a deployed model: a Q/DQ graph lowered to
 * oneDNN int8 kernels with fp32 fallbacks (the built-in onednn_cpu backend), or partitioned
 * between an accelerator simulated in its integer arithmetic and the CPU (a description loaded
 * from a file). Callers hold a qt_device and never ask which kind it is. */
typedef struct qt_device qt_device; /* opaque */

typedef enum {
  QT_PART_INT8,     /* on the backend's integer kernels (oneDNN int8, or the accelerator) */
  QT_PART_FALLBACK, /* on the CPU in fp32 (dq -> fp32 op -> q), with its reason */
  QT_PART_BOUNDARY, /* a quantize of an fp32 value or a dequantize materializing fp32 (a transfer) */
  QT_PART_COUNT
} qt_partition_kind;
const char *qt_partition_kind_name(qt_partition_kind k);

/* Deploys the finalized Q/DQ graph g (qt_convert / qt_qdq_load) on the backend d (NULL: onednn_cpu
 * with the ISA read from oneDNN). g must outlive the device and stay unchanged. NULL with err for
 * a graph that is not a Q/DQ graph (fake_quant / conv_bn nodes or weights without integers: a
 * prepared graph, convert it first) or whose output is integers. */
qt_device *qt_device_open(const qt_graph *g, const qt_backend_desc *d, char *err);
void qt_device_free(qt_device *dev);
/* The backend's description and the graph the device runs. */
const qt_backend_desc *qt_device_desc(const qt_device *dev);
const qt_graph *qt_device_graph(const qt_device *dev);

/* Runs the model on input (n, H, W, C) fp32 NHWC; writes out (n, qt_device_output_numel) fp32:
 * the graph output as the Q/DQ graph defines it (the dequantized integers when the output is a
 * dq). Returns 0, or -1 with err set. */
int qt_device_run(qt_device *dev, float *out, const float *input, int n, char *err);
int64_t qt_device_output_numel(const qt_device *dev);
void qt_device_input_shape(const qt_device *dev, int *h, int *w, int *c);

/* Any value of the Q/DQ graph, by value name or node name (the node's output), as the device
 * computes it, dequantized to fp32: out (n, qt_device_value_numel); a quantize's output is read
 * through its dequantize (the same integers). The value is read from a second deployment of the
 * same graph with that value as its output (the last one read is kept, so reading one value over
 * many batches deploys once): every node before it deploys as in the first, except that a value
 * the device never materializes (a conv's output inside a fused conv -> relu -> q kernel) makes
 * its unit run differently to return it. qt_device_value_numel: elements per sample, or -1 for
 * no such value. read_value returns 0, or -1 with err (no such value). */
int64_t qt_device_value_numel(const qt_device *dev, const char *name);
int qt_device_read_value(qt_device *dev, const char *name, float *out, const float *input, int n, char *err);

/* Partitions in execution order: kind, the Q/DQ graph nodes covered ("a -> b -> c") and a
 * detail (the kernels; for a fallback the reason). */
int qt_device_partition_count(const qt_device *dev);
qt_partition_kind qt_device_partition(const qt_device *dev, int i, const char **nodes, const char **detail);
int qt_device_count(const qt_device *dev, qt_partition_kind k);
/* Where node `name` runs: 1 on the backend's integer kernels, 0 on the CPU in fp32 (reason set,
 * "" when none is known), -1 no such node. */
int qt_device_node_on_backend(const qt_device *dev, const char *name, const char **reason);
/* The partition report: a header line, then one line (or more) per partition. */
void qt_device_report(const qt_device *dev, FILE *f);

/* ==== backend descriptions and the check pass (backend/check.c) ============================== */
/* qt_backend_desc (qat/qat.h) says what a backend's integer kernels accept. */

typedef enum { QT_ISA_AUTO, QT_ISA_VNNI, QT_ISA_NO_VNNI } qt_isa_choice;
/* Whether oneDNN's effective ISA on this CPU has VNNI (u8 x s8 dot products without 16-bit
 * saturation). */
int qt_cpu_has_vnni(void);
/* The largest |integer weight - zero point| of a layer's weight state (the pair-sum bound's). */
int64_t qt_max_abs_weight(const qt_qstate *wq);

/* The built-in backend above: oneDNN int8 on this CPU. Ops it lowers to integers (conv2d,
 * linear, relu, max_pool2d, flatten, add), 2..8-bit signed symmetric weights (per channel or per
 * tensor), 2..8-bit unsigned per-tensor activations, any scale; average pools quantized at
 * their boundaries (fp32 fallbacks); without VNNI, 8-bit weights given 7 bits. isa: AUTO reads oneDNN's
 * effective ISA (dnnl_get_effective_cpu_isa); VNNI / NO_VNNI force it (docs/design.md: no VNNI describes an
 * AVX2 machine without VNNI, where u8 x s8 pairs saturate a 16-bit sum). */
void qt_backend_desc_onednn_cpu(qt_backend_desc *d, qt_isa_choice isa);

/* The built-in xnnpack backend (backend/xnnpack.c): XNNPACK's operators as Debian's 2022-02
 * snapshot declares them. Ops it runs on integers (conv2d incl. grouped and depthwise, linear,
 * relu / relu6 fused as the operator's output clamp, max_pool2d, global_avg_pool, add, flatten as
 * a view); 2..8-bit signed affine activations (qs8: int8 with a zero point), per tensor; 2..8-bit
 * signed symmetric weights, per channel for conv2d (qc8) and per tensor for linear (qs8 fully
 * connected has one weight scale in this version); average pools quantized at their boundaries
 * (XNNPACK has only a qu8 average pooling: fp32 fallbacks). */
void qt_backend_desc_xnnpack(qt_backend_desc *d);

/* A backend by name, as quant.backend and the programs' --backend take it: "onednn" or
 * "onednn_cpu" (with isa), "xnnpack", or else the path of an accelerator description file
 * (qt_backend_desc_load). isa other than AUTO applies to oneDNN only. 0, or -1 with err. */
int qt_backend_desc_named(qt_backend_desc *d, const char *name, qt_isa_choice isa, char *err);

/* An accelerator described by an INI file (experiments/accel_fictional.ini):
 *   [accelerator]
 *   name = ...                 ops = conv2d, linear, relu, ...   (op names, comma-separated)
 *   weight_bits = 8            activation_bits = 8               (comma lists of 2..8)
 *   per_tensor_only = true     symmetric = true                  power_of_two_scales = true
 *   max_channels = 64          (output channels / features; 0 = any)
 * per_tensor_only applies to weights and activations; symmetric means signed ranges with zero
 * point 0 for both. Returns 0, or -1 with err naming the file, line and key. */
int qt_backend_desc_load(qt_backend_desc *d, const char *path, char *err);
/* The same from INI text; origin names it in messages. */
int qt_backend_desc_parse(qt_backend_desc *d, const char *text, const char *origin, char *err);
/* One paragraph: name, ops, bit widths, requirements, ISA. */
void qt_backend_desc_print(const qt_backend_desc *d, FILE *f);

/* Whether one quantization record (a quantize node's activation record, or a layer's weight
 * record) is acceptable to the backend: NULL, or the first reason it is not, written to why. */
const char *qt_backend_record_problem(const qt_backend_desc *d, const qt_qstate *q, int is_weight, char *why, size_t n);

typedef enum {
  QT_VIOLATION_OP,          /* op not run by the backend, on quantized data */
  QT_VIOLATION_BITS,        /* bit width not allowed */
  QT_VIOLATION_SIGN,        /* signed / unsigned range not accepted */
  QT_VIOLATION_SYMMETRIC,   /* non-zero zero point where symmetric is required */
  QT_VIOLATION_GRANULARITY, /* per-channel qparams where per-tensor is required */
  QT_VIOLATION_POW2,        /* scale not a power of two */
  QT_VIOLATION_CHANNELS,    /* more output channels than the backend has */
  QT_VIOLATION_SATURATION,  /* u8 x s8 pair sums can leave int16 (non-VNNI x86) */
  QT_VIOLATION_INPUT,       /* quantized weights on an unquantized input (weight-only) */
  QT_VIOLATION_BIAS,        /* a float bias where the backend takes int32 biases only */
  QT_VIOLATION_COUNT
} qt_violation_kind;
const char *qt_violation_kind_name(qt_violation_kind k);

typedef struct {
  qt_violation_kind kind;
  int node; /* node id in the checked graph */
  char node_name[QT_NAME_LEN];
  char reason[320];
} qt_violation;

/* The check's findings: violations (the backend cannot run this as the graph says: a CPU
 * fallback, or on non-VNNI x86 a silently wrong result) and notes (facts worth knowing that
 * break no constraint, e.g. a layer left in fp32). */
typedef struct {
  char graph[QT_NAME_LEN], backend[QT_NAME_LEN], isa[40];
  qt_violation *items;
  int n, cap;
  int count[QT_VIOLATION_COUNT];
  char (*notes)[320];
  int n_notes, cap_notes;
  int n_records, n_layers; /* activation records and integer-weight layers checked */
} qt_backend_check_result;

/* Reads only the Q/DQ graph g (qt_qdq_load / qt_convert): every quantize node's record, every
 * integer-weight layer (its record, integer range, channels, input quantization and, with
 * pair_sum_int16, the largest u8 x s8 pair sum from the actual integer weights and the input's
 * range), and every op on quantized data. Returns 0 (result filled, possibly with violations),
 * or -1 with err for a graph that is not a Q/DQ graph. Free the result with _free. */
int qt_backend_check(const qt_graph *g, const qt_backend_desc *d, qt_backend_check_result *r, char *err);
void qt_backend_check_result_free(qt_backend_check_result *r);
/* Violations one per line ("node: [kind] reason"), then notes, then a verdict line. */
void qt_backend_check_print(const qt_backend_check_result *r, FILE *f);

/* ==== the accelerator runtime (backend/accel.c, behind qt_device) ==================== */
/* Partitions a Q/DQ graph between an accelerator (per its description) and the CPU, and runs
 * it: accelerator partitions are simulated in integer arithmetic as the device would compute
 * them (int8 tensors, int32 accumulators, the bias in accumulator units, power-of-two
 * requantization by a rounding shift, saturation), CPU partitions run the fp32 ops of the
 * Q/DQ graph, and transfers quantize / dequantize at the boundaries. The accelerator runs:
 *   dq -> conv2d | linear [-> relu] -> q    integer weights, output requantized
 *   dq -> add [-> relu] -> q                inputs aligned by shifting, requantized
 *   relu, max_pool2d, flatten on its int8 tensors (same qparams)
 * when the op is listed, every record involved is acceptable (qt_backend_record_problem) and
 * the layer fits max_channels; every other node runs on the CPU, with its reason. */

#endif
