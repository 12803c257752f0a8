/* The graph IR: what a model is. Nodes (an op, input/output value ids, attributes, owned
 * parameters and buffers, a name) and values (per-sample shapes, NHWC). The op table (what
 * every op is: arity, slots, flags, shape inference), a builder API, model presets, the
 * executor for train and eval modes (one node at a time: qt_node_forward), and a Graphviz dump.
 *
 * Parameters and gradients each live in one slab (a flat float array) owned by the graph;
 * buffers (BN running statistics) in a third. Optimizers and checkpoints work on the slabs. */
#ifndef QT_NN_H
#define QT_NN_H

#include <stdint.h>
#include <stdio.h>

#include "autograd/autograd.h"
#include "quant/quant.h"

#include "base/base.h"

#define QT_NAME_LEN 64
#define QT_MAX_INPUTS 4
#define QT_MAX_PARAMS 4

typedef enum {
  QT_OP_INPUT,
  QT_OP_CONV2D,
  QT_OP_BATCH_NORM,
  QT_OP_RELU,
  QT_OP_RELU6, /* min(max(x, 0), 6): PyTorch's ReLU6, ONNX Clip(0, 6) */
  QT_OP_MAX_POOL2D,
  QT_OP_AVG_POOL2D,
  QT_OP_GLOBAL_AVG_POOL,
  QT_OP_FLATTEN,
  QT_OP_LINEAR,
  QT_OP_ADD,
  QT_OP_FAKE_QUANT,      /* observer + fake quant of its input (prepared graphs) */
  QT_OP_CONV_BN,         /* QAT conv + BN with delayed folding (docs/design.md: delayed folding) */
  QT_OP_QUANTIZE,        /* fp32 -> integers (convert graph) */
  QT_OP_DEQUANTIZE,      /* integers -> fp32 (convert graph) */
  QT_OP_ACTIVATION,      /* element-wise: attr.act (qt_act_kind), attr.alpha, attr.beta (qt_activation) */
  QT_OP_MUL,             /* a * b: b of a's shape, or a an image (H, W, C) and b a (C) vector (squeeze-excite) */
  QT_OP_CONCAT,          /* 2 to QT_MAX_INPUTS values joined along channels (images) or features (flat) */
  QT_OP_CHANNEL_SHUFFLE, /* attr.groups: the channels as (groups, C / groups), transposed (ShuffleNet) */
  QT_OP_CHANNEL_SLICE,   /* channels [attr.begin, attr.end) (Split, Slice) */
  QT_OP_LAYER_NORM,      /* over the channels of every pixel (token): params weight, bias; attr.eps */
  QT_OP_ATTENTION,       /* multi-head self-attention of q, k, v (the pixels are the tokens): attr.heads */
  QT_OP_ADD_PARAM,       /* x + a learned tensor of x's per-sample shape (a position embedding) */
  QT_OP_DROPOUT,         /* training: qt_dropout with probability attr.ratio; eval: x (convert removes it) */
  QT_OP_PRELU,           /* x > 0 ? x : w x, param weight: attr.out_channels slopes (1, or one per channel) */
  QT_OP_RESIZE,          /* an image upsampled by attr.stride_h = attr.stride_w = 2: attr.mode nearest or bilinear */
  QT_OP_PREPEND_TOKEN,   /* tokens (H, W, C) -> (1, 1 + H W, C): a learned token (param weight, C) first (a class
                          * token), then the pixels in row-major order */
  QT_OP_FIRST_TOKEN,     /* tokens (H, W, C) -> the first one's (C) features (x[:, 0]: the class token's) */
  QT_OP_COUNT
} qt_op;
const char *qt_op_name(qt_op op);
/* Parses an op name; returns -1 when unknown. */
int qt_op_parse(const char *name, qt_op *out);

/* Parameter roles within a node's param[] and buffer[] slots. */
enum { QT_P_WEIGHT = 0, QT_P_BIAS = 1 };      /* conv2d, linear, conv_bn */
enum { QT_P_GAMMA = 0, QT_P_BETA = 1 };       /* batch_norm ("weight", "bias" in PyTorch) */
enum { QT_P_BN_GAMMA = 2, QT_P_BN_BETA = 3 }; /* conv_bn */
enum { QT_B_RUNNING_MEAN = 0, QT_B_RUNNING_VAR = 1 };

/* How one edge or weight is quantized: the Quantizer's annotation. */
typedef struct {
  int bits;       /* 2..8 */
  int qmin, qmax; /* derived from bits and signedness, possibly restricted */
  int is_signed;
  int symmetric;   /* zero point 0 (signed) */
  int per_channel; /* weights: axis 0 (output channels) */
  qt_observer_kind observer;
  qt_range_method method; /* histogram observers */
  float percentile;
  int learnable;  /* LSQ: the scale is a trained parameter (initialized by the observer) */
  int pow2_scale; /* scales rounded up to a power of two when computed from a range
                   * (hardware that rescales by shifting); affine zero points follow */
  int bias_int32; /* weights of conv2d / linear / conv_bn: the layer's bias (conv_bn:
                   * its folded bias) is quantized too, to int32 with zero point 0 and
                   * the derived per-channel scale s_x * s_w[c] (qt_bias_scales): the
                   * bias in accumulator units, as integer kernels add it */
  /* fixed_scale > 0: fixed qparams with fixed_zero_point (an activation of known range whose
   * integer operator takes only these, e.g. sigmoid on XNNPACK): no observer, never learned */
  float fixed_scale;
  int fixed_zero_point;
} qt_qspec;

/* Quantization state living on a node: the spec, the observer, the qparams training uses and
 * the enable flags; in a convert graph also the integer weights. */
typedef struct qt_qstate {
  qt_qspec spec;
  int channels;        /* 1 = per-tensor */
  float *scale;        /* channels */
  int32_t *zero_point; /* channels */
  qt_observer obs;
  int observe;      /* observer enabled */
  int fake_quant;   /* fake quant enabled */
  int calibrated;   /* scale/zero_point hold qparams */
  int32_t *qweight; /* convert graphs: integer weights (numel of the weight), else NULL */
  int64_t n_qweight;
  int32_t *qbias; /* convert graphs with spec.bias_int32 and a bias: the integer bias
                   * (one per output channel), else NULL */
  int64_t n_qbias;
  int scale_param; /* LSQ: tensor holding the learned scale (channels), else -1 */
} qt_qstate;

/* New state for a spec with `channels` channels (observer initialized, flags on). NULL with err
 * set when the observer cannot be made (histogram per channel). */
qt_qstate *qt_qstate_create(const qt_qspec *spec, int channels, char *err);
qt_qstate *qt_qstate_clone(const qt_qstate *q);
void qt_qstate_free(qt_qstate *q);
/* Observes data (outer, channels, inner) and refreshes scale/zero_point from the observer. */
int qt_qstate_observe(qt_qstate *q, const float *data, int64_t outer, int64_t inner, char *err);
/* The same with the batch split across the processes of sync (qt_observer_update_sync): every
 * process ends with the qparams of the whole batch. */
int qt_qstate_observe_sync(qt_qstate *q, const float *data, int64_t outer, int64_t inner, const qt_batch_sync *sync,
                           char *err);

enum { QT_RESIZE_NEAREST = 0, QT_RESIZE_BILINEAR = 1 };

typedef struct {
  int kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, groups; /* conv2d, pools; resize: the scales */
  int out_channels;                                                 /* conv2d, linear */
  float eps, momentum;                                              /* batch_norm; layer_norm: eps */
  int act;                                                          /* activation: qt_act_kind */
  float alpha, beta;                                                /* activation: qt_act's */
  int begin, end;                                                   /* channel_slice: [begin, end) */
  int heads;                                                        /* attention */
  int ceil;    /* pools: PyTorch's ceil_mode (the last window may hang over; only where it adds one) */
  float ratio; /* dropout: the probability of zeroing an element, 0 <= ratio < 1 */
  int mode;    /* resize: QT_RESIZE_NEAREST or QT_RESIZE_BILINEAR */
} qt_node_attrs;

typedef struct {
  char name[QT_NAME_LEN];
  int ndim; /* per-sample rank: 3 (H, W, C) or 1 (F) */
  int64_t shape[3];
  int producer;  /* node id */
  int consumers; /* number of node inputs reading it */
} qt_value;

/* ---- the op table (nn/ops.c): what every op is, in one place --------------------------------- */

/* How an op uses a parameter or buffer slot. */
typedef enum { QT_SLOT_NONE = 0, QT_SLOT_OPTIONAL = 1, QT_SLOT_REQUIRED = 2 } qt_slot_use;

/* Per-sample output shape of a node from its inputs' values and attributes: 0 with *ndim and
 * shape[0..*ndim-1] set, or -1 with the reason in err (no node name: the caller adds it). */
typedef int (*qt_op_shape_fn)(const qt_node_attrs *attr, const qt_value *const *inputs, int *ndim, int64_t *shape,
                              char *err);

/* The graphs of the pipeline that may hold an op: every graph, prepared (training) graphs only
 * (qt_prepare's fake_quant and conv_bn), or convert graphs only (qt_convert's quantize and
 * dequantize). */
typedef enum { QT_OP_ANY_GRAPH = 0, QT_OP_PREPARED_ONLY = 1, QT_OP_CONVERT_ONLY = 2 } qt_op_graphs;

typedef struct {
  const char *name; /* as in files and reports: "conv2d" */
  int min_inputs, max_inputs;
  const char *param_suffix[QT_MAX_PARAMS]; /* tensor name "<node>.<suffix>" (PyTorch state_dict) */
  unsigned char param_use[QT_MAX_PARAMS];  /* qt_slot_use */
  const char *buffer_suffix[QT_MAX_PARAMS];
  unsigned char buffer_use[QT_MAX_PARAMS];
  int has_weight;       /* a weight in slot QT_P_WEIGHT that may be quantized */
  int weight_rank;      /* of that weight: 4 (OC, C/groups, KH, KW), 2 (OUT, IN) */
  int act_quant;        /* carries activation quantization (node->q) */
  unsigned char graphs; /* qt_op_graphs */
  int stateful;         /* follows the train/eval mode switch */
  int param_free;       /* no tensors, no quantization state: qt_apply_simple_op */
  int param_per_sample; /* the parameter in slot 0 has the output's per-sample shape (add_param) */
  int param_count_attr; /* the vectors of its slots hold attr.out_channels values (prelu: 1 or C) */
  qt_op_shape_fn shape; /* NULL for input (its shape is given) */
} qt_op_info;

/* The row of op (an invalid op is a broken invariant). */
const qt_op_info *qt_op_info_get(qt_op op);
/* conv2d, linear, conv_bn: the layers with a (quantizable) weight. */
int qt_op_has_weight(qt_op op);
/* batch_norm, conv_bn, fake_quant, dropout: nodes whose behaviour depends on node->training. */
int qt_op_is_stateful(qt_op op);
/* relu, relu6, pools, flatten, add, activation, mul, concat, channel shuffle and slice: computed
 * by qt_apply_simple_op. */
int qt_op_is_param_free(qt_op op);
/* Checks arity, then the table's shape function: the per-sample output shape, or -1 with err
 * ("op 'relu' takes 1 input(s), has 2", "kernel 3x3 ... do not fit input 2x2"). */
int qt_op_output_shape(qt_op op, const qt_node_attrs *attr, const qt_value *const *inputs, int n_inputs, int *ndim,
                       int64_t shape[3], char *err);

typedef struct {
  qt_op op;
  char name[QT_NAME_LEN];
  int inputs[QT_MAX_INPUTS];
  int n_inputs;
  int output; /* value id */
  qt_node_attrs attr;
  int param[QT_MAX_PARAMS]; /* indices into the graph's tensor table, -1 = none */
  int buffer[QT_MAX_PARAMS];
  int training;  /* mode of stateful nodes (batch_norm, conv_bn, fake_quant, dropout) */
  qt_qstate *q;  /* fake_quant / quantize / dequantize: activation quantization */
  int q_tied;    /* fake_quant: q is an earlier fake quant's (shared qparams), not owned here */
  qt_qstate *wq; /* conv2d / linear / conv_bn: weight quantization, NULL = fp32 */
  int bn_frozen; /* batch_norm / conv_bn: running statistics frozen */
} qt_node;

/* A parameter or buffer: a named region of a slab. */
typedef struct {
  char name[2 * QT_NAME_LEN]; /* "conv1.weight", "bn1.running_mean" (PyTorch's names) */
  int ndim;
  int64_t shape[4];
  int64_t numel;
  int64_t offset; /* in floats, into the params or buffers slab */
  int is_buffer;
  int node;
  /* Parameters: the tape's length (qt_ctx_tape_length) when the latest forward first made this
   * parameter's tensor, so every tape entry writing its gradient in that step's backward is this
   * one or a later one; -1 when that forward did not use it. The trainer starts summing a
   * gradient bucket once the backward has run past all of its parameters. */
  int64_t tape_at;
} qt_param;

/* How raw data becomes the graph input, so that a deployment tool reading the model file needs
 * nothing else: raw pixels in [raw_min, raw_max] = [0, 255], layout NHWC with the input value's
 * (H, W, C), each channel c computed in float32 as
 *     x = ((float)pixel / 255.0f - mean[c]) / std[c]
 * (exactly what data/loader.c does). `set` 0 means not recorded (files without it load so). */
#define QT_MAX_INPUT_CHANNELS 16
typedef struct {
  int set;
  int channels;                      /* = the input's C when set */
  float mean[QT_MAX_INPUT_CHANNELS]; /* applied to pixel/255 */
  float std[QT_MAX_INPUT_CHANNELS];  /* finite, > 0 */
} qt_input_preprocessing;

typedef struct qt_graph {
  char name[QT_NAME_LEN];
  qt_node *nodes;
  int n_nodes, cap_nodes;
  qt_value *values;
  int n_values, cap_values;
  qt_param *tensors;
  int n_tensors, cap_tensors;
  int input, output; /* value ids */
  int finalized;
  float *params, *grads; /* slabs: n_params floats each */
  int64_t n_params;
  float *buffers; /* slab: n_buffers floats */
  int64_t n_buffers;
  char error[QT_ERR_LEN];           /* first builder error */
  struct qt_node_names *names;      /* node name -> index (nn/names.c; built on first use) */
  qt_input_preprocessing input_pre; /* not set unless the pipeline records it */
} qt_graph;

qt_graph *qt_graph_create(const char *name);
void qt_graph_free(qt_graph *g);

/* Builder: each returns the new node's output value id, or -1 after recording an error in
 * g->error (later calls then fail too; qt_graph_finalize reports it). */
int qt_graph_input(qt_graph *g, const char *name, int h, int w, int c);
int qt_graph_conv2d(qt_graph *g, const char *name, int x, int out_channels, int kernel, int stride, int pad, int groups,
                    int bias);
/* The same with every attribute given (kernel, stride and padding per axis, groups, out_channels
 * in attr; the rest of attr ignored): rectangular kernels, strides and paddings. */
int qt_graph_conv2d_attr(qt_graph *g, const char *name, int x, const qt_node_attrs *attr, int bias);
int qt_graph_batch_norm(qt_graph *g, const char *name, int x);
int qt_graph_relu(qt_graph *g, const char *name, int x);
int qt_graph_relu6(qt_graph *g, const char *name, int x);
/* An element-wise activation (qt_activation): sigmoid, tanh, SiLU, hard sigmoid, hard swish,
 * GELU, leaky ReLU, ELU; no parameters, no int8 kernel (fp32 between quantized neighbours). */
int qt_graph_activation(qt_graph *g, const char *name, int x, qt_act a);
int qt_graph_max_pool2d(qt_graph *g, const char *name, int x, int kernel, int stride, int pad);
int qt_graph_avg_pool2d(qt_graph *g, const char *name, int x, int kernel, int stride, int pad);
/* Either pool (op max_pool2d or avg_pool2d) in floor mode or, ceil set, PyTorch's ceil mode. */
int qt_graph_pool2d(qt_graph *g, qt_op op, const char *name, int x, int kernel, int stride, int pad, int ceil);
int qt_graph_global_avg_pool(qt_graph *g, const char *name, int x);
int qt_graph_flatten(qt_graph *g, const char *name, int x);
int qt_graph_linear(qt_graph *g, const char *name, int x, int out_features, int bias);
int qt_graph_add(qt_graph *g, const char *name, int a, int b);
/* a * b: b of a's shape, or a (C) vector scaling the channels of the image a at every pixel. */
int qt_graph_mul(qt_graph *g, const char *name, int a, int b);
/* inputs[0..n-1] (2 to QT_MAX_INPUTS) of one rank and equal dims but the last, joined along it. */
int qt_graph_concat(qt_graph *g, const char *name, const int *inputs, int n);
/* x's channels as (groups, C / groups), transposed (ShuffleNet's channel shuffle). */
int qt_graph_channel_shuffle(qt_graph *g, const char *name, int x, int groups);
/* x's channels [begin, end). */
int qt_graph_channel_slice(qt_graph *g, const char *name, int x, int begin, int end);
/* Layer norm over the channels (features) of each pixel (of a flat value: of the sample), with a
 * learned scale (weight, 1 at first) and shift (bias, 0), eps as PyTorch's. */
int qt_graph_layer_norm(qt_graph *g, const char *name, int x, float eps);
/* Multi-head scaled dot-product attention of q, k, v (one shape, an image: the H * W pixels are
 * the tokens, C their features split into `heads` heads): softmax(Q K^T / sqrt(C / heads)) V. */
int qt_graph_attention(qt_graph *g, const char *name, int q, int k, int v, int heads);
/* x + a learned tensor of x's per-sample shape ("<name>.weight"; a position embedding). */
int qt_graph_add_param(qt_graph *g, const char *name, int x);
/* PReLU of x with `slopes` learned slopes (1, shared by every channel, or x's channel count),
 * initialized by qt_graph_init_params to PyTorch's 0.25. */
int qt_graph_prelu(qt_graph *g, const char *name, int x, int slopes);
/* x (an image) upsampled by 2, mode QT_RESIZE_NEAREST or QT_RESIZE_BILINEAR. */
int qt_graph_resize(qt_graph *g, const char *name, int x, int mode);
/* A vision transformer's class token: a learned (C) token put before the tokens of image x, and
 * the first token of tokens x as a (C) vector. */
int qt_graph_prepend_token(qt_graph *g, const char *name, int x);
int qt_graph_first_token(qt_graph *g, const char *name, int x);
/* Dropout with probability ratio (0 <= ratio < 1): in training mode each element is zeroed with
 * that probability and the rest scaled by 1 / (1 - ratio), the mask drawn from the ctx's random
 * stream (qt_ctx_set_random) and the node's name; in eval mode (and calibration) the identity.
 * qt_convert leaves it out: the Q/DQ graph computes the eval model. */
int qt_graph_dropout(qt_graph *g, const char *name, int x, float ratio);
/* Marks the output and allocates the slabs (zeroed; BN running_var = 1, gamma = 1). */
int qt_graph_finalize(qt_graph *g, int output, char *err);

/* Records the input preprocessing (see qt_input_preprocessing): per-channel mean and std as
 * applied to pixel/255 values, `channels` of them, which must equal the input's C; std finite
 * and > 0, mean finite. -1 with err otherwise (the graph is unchanged). qt_prepare and
 * qt_convert copy it to the graphs they make, and qt_qdq_save stores it (docs/qdq_format.md,
 * /input_preprocessing), so calling it once on the fp32 graph before qt_prepare puts it in both
 * model_trained.h5 and model_qdq.h5. Saving works without it (the group is then absent). */
int qt_graph_set_input_preprocessing(qt_graph *g, const float *mean, const float *std, int channels, char *err);
/* Checks a description against graph g's input (as the setter and the file loader do). */
int qt_input_preprocessing_check(const qt_graph *g, const qt_input_preprocessing *p, char *err);

/* PyTorch's default initialization (kaiming-uniform a=sqrt(5) for weights, uniform
 * +-1/sqrt(fan_in) for biases, gamma 1, beta 0, running mean 0, var 1), seeded. */
void qt_graph_init_params(qt_graph *g, uint64_t seed);

/* Number of trainable parameter elements (the slab also holds alignment padding). */
int64_t qt_graph_param_count(const qt_graph *g);
/* Exchanges the parameter slab's contents with other's (g->n_params floats): another set of
 * parameters for g (a reference model's, kept by a PTQ method) goes in, g's own come out; a second
 * call puts them back. */
void qt_graph_exchange_params(qt_graph *g, float *other);

/* Tensor table lookup by name; -1 when absent. */
int qt_graph_find_tensor(const qt_graph *g, const char *name);
float *qt_graph_tensor_data(qt_graph *g, int tensor);
int qt_graph_find_node(const qt_graph *g, const char *name);
/* Elements of a value per sample (the product of its shape). */
int64_t qt_value_numel(const qt_value *v);
/* The only node consuming value v (v not the graph output), else -1. */
int qt_graph_sole_consumer(const qt_graph *g, int v);
/* The input of the two-input node `node` that is not value v (v when both inputs are v). */
int qt_graph_other_input(const qt_graph *g, int node, int v);
/* Whether node n's output holds only values of its input (max_pool2d, flatten, relu, channel
 * shuffle and slice, a nearest resize: copies, or a maximum of them) or is the identity in eval
 * (dropout): it keeps its input's grid. */
int qt_node_keeps_grid(const qt_node *n);
/* The fake_quant or dequantize node on whose per-tensor grid the values of v lie: v's producer,
 * or the one reached through nodes that keep their input's grid (qt_node_keeps_grid) and a concat
 * whose inputs all lie on one grid (the first input's source); -1 when there is none (an fp32
 * value, a per-channel quantization). */
int qt_graph_quant_source(const qt_graph *g, int v);
/* The int32 bias's scales of layer `node` (conv2d / linear / conv_bn whose weight spec has
 * bias_int32): scale[c] = s_x * s_w[c] as a float32 product, for the OC output channels (a
 * per-tensor weight scale serves every c), s_x from qt_graph_quant_source of the layer's input.
 * Training, convert, the check and every backend derive the bias's scale with this one function.
 * -1 with err when the input has no per-tensor quantization source or a scale is not set yet. */
int qt_bias_scales(const qt_graph *g, int node, float *scale, char *err);
/* The int32 bias's integer range: +-(2^31 - 128), the widest symmetric range whose bounds are
 * exact in float32 (the quantize formula clamps in float32). */
#define QT_BIAS_QMAX 2147483520
#define QT_BIAS_QMIN (-2147483520)

/* LSQ: copies every learned scale parameter (clamped to >= FLT_EPSILON) into its state's
 * scale[], so the qparams stored on nodes are the ones the next forward uses. Call after an
 * optimizer step before reading qparams (the check and the training job do). */
void qt_graph_sync_learned_scales(qt_graph *g);

/* Mode switch: every stateful node follows it. */
void qt_graph_set_training(qt_graph *g, int training);

/* The parameter-free ops on tensors in[0..n_in-1]: relu and relu6 (in place when `inplace`),
 * max/avg/global-average pool, flatten, add, activation, mul, concat, channel shuffle and slice.
 * One definition for this
 * executor and the backends' fp32 fallbacks; NULL for any other op. */
qt_tensor *qt_apply_simple_op(qt_ctx *ctx, qt_op op, const qt_node_attrs *a, qt_tensor *const *in, int n_in,
                              int inplace);
/* One node of an fp32, prepared or Q/DQ graph, computed on its input tensors (inputs[k] holds
 * the value n->inputs[k], batch first) with the node's own parameters from g: conv2d and linear
 * with the weight the node computes with (the fp32 parameter; in a prepared graph its
 * fake-quantized version, observed first in training mode; in a convert graph the dequantized
 * integer weights), batch_norm (batch statistics and a running-statistics update when
 * n->training && !n->bn_frozen, else the running statistics), and the parameter-free ops through
 * qt_apply_simple_op. `inplace` lets relu, relu6 and batch_norm overwrite inputs[0]. Parameters take part
 * in the tape when ctx records one. The executor calls it for these ops; a backend's fp32
 * fallback that holds the node id, its graph and the input tensors calls it the same way (with
 * inplace 0 and the graph in eval mode). Returns the output (arena), or NULL with err set
 * (an observer saw NaN, or the op is fake_quant, conv_bn, quantize, dequantize or input,
 * which it does not compute). */
qt_tensor *qt_node_forward(qt_graph *g, qt_ctx *ctx, int node, qt_tensor *const *inputs, int inplace, char *err);
/* Runs the graph on input (N, H, W, C). With ctx's grad mode on, records the tape; parameter
 * gradients accumulate into g->grads. With it off, a value's memory is reused once its last
 * consumer has run (qt_graph_forward_keep). Returns the output tensor (arena), or NULL with the
 * reason in g->error (e.g. an observer saw NaN: the message names the node). */
qt_tensor *qt_graph_forward(qt_graph *g, qt_ctx *ctx, qt_tensor *input);
/* Like qt_graph_forward, also filling values[v] (arena tensors, n_values entries) for every
 * value, for per-node comparisons. */
qt_tensor *qt_graph_forward_values(qt_graph *g, qt_ctx *ctx, qt_tensor *input, qt_tensor ***values);
/* Like qt_graph_forward_values, but where force[v] is not NULL, value v takes that tensor
 * instead of what its node computed (teacher forcing: the check compares each segment of two
 * graphs from identical inputs). */
qt_tensor *qt_graph_forward_forced(qt_graph *g, qt_ctx *ctx, qt_tensor *input, qt_tensor ***values,
                                   qt_tensor *const *force);
/* Like qt_graph_forward_forced (force may be NULL), keeping only the output and the values v with
 * keep[v] != 0 (n_values flags; NULL: none). With ctx's grad mode off, every other value's
 * memory goes back to the arena after its last consumer (the no-grad memory planner, exec.c)
 * and values[v] is NULL for it on return; with grad on, every value is kept. In-place ops run
 * as in qt_graph_forward_values: a kept value whose only consumer is an in-place relu or
 * batch norm holds that consumer's output. */
qt_tensor *qt_graph_forward_keep(qt_graph *g, qt_ctx *ctx, qt_tensor *input, qt_tensor ***values,
                                 qt_tensor *const *force, const unsigned char *keep);

/* Low-level builder pieces for graph passes (prepare, convert): append a node with the given
 * op, inputs and attributes whose output has the given per-sample shape. Returns the node id. */
int qt_graph_add_node(qt_graph *g, qt_op op, const char *name, const int *inputs, int n_inputs,
                      const qt_node_attrs *attr, int out_ndim, const int64_t *out_shape);
/* Makes node use from_node's weight tensor (a shared weight); call right after adding the
 * node (a conv2d or linear without bias). */
int qt_graph_share_weight(qt_graph *g, int node, int from_node);
/* Adds a parameter (or buffer) tensor owned by node `node`, named "<node>.<suffix>". */
int qt_graph_add_tensor(qt_graph *g, int node, const char *suffix, int ndim, const int64_t *shape, int is_buffer);
/* Whether a forward of g over a batch fits this machine: qt_graph_forward_values keeps every
 * value of a batch (the no-grad planner needs less; this stays the bound), so the bytes are
 * batch x (the sum of every value's elements) x 4, compared with the
 * physical memory (or the address-space limit when lower). -1 with err naming the bytes, the
 * largest value and the memory; a file can describe a valid graph far too big to run (a 1x1
 * conv with pad 8000), and this is its message instead of an abort in an allocator. */
int qt_graph_check_memory(const qt_graph *g, int64_t batch, char *err);
/* Allocates slabs after passes (keeps g->output). Data must then be copied in by the pass. */
int qt_graph_alloc(qt_graph *g, char *err);
void qt_graph_zero_grad(qt_graph *g);

/* Graphviz dot: one box per node (op, name, output shape), parameters as labels. */
int qt_graph_write_dot(const qt_graph *g, FILE *f);
/* Human-readable summary (one line per node) with parameter counts. */
void qt_graph_print(const qt_graph *g, FILE *f);

/* Model presets (docs/training.md: presets); NULL with err set for an unknown name. */
qt_graph *qt_model_build(const char *name, char *err);
/* The names qt_model_build accepts, "a|b|c". */
const char *qt_model_names(void);

#endif
