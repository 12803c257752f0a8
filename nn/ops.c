/* The op table: one row per qt_op saying what a node of that op is (name, arity, parameter and
 * buffer slots with their PyTorch suffixes, flags) and how its output shape follows from its
 * inputs. The builder, the executor, the Q/DQ file validator and the passes read it instead of
 * keeping their own lists, so an op added to qt_op without its row breaks the build. */
#include "nn/nn.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

static int same_as_input(const qt_node_attrs *a, const qt_value *const *in, int *ndim, int64_t *shape, char *err) {
  (void)a;
  (void)err;
  *ndim = in[0]->ndim;
  memcpy(shape, in[0]->shape, 3 * sizeof *shape);
  return 0;
}

/* An activation's kind is one of qt_act_kind and its parameters finite. */
static int act_shape(const qt_node_attrs *a, const qt_value *const *in, int *ndim, int64_t *shape, char *err) {
  if (a->act < 0 || a->act >= QT_ACT_COUNT)
    return qt_err(err, "activation kind %d is not one of 0..%d", a->act, QT_ACT_COUNT - 1);
  if (!isfinite(a->alpha) || !isfinite(a->beta))
    return qt_err(err, "%s: alpha %g and beta %g must be finite", qt_act_name((qt_act_kind)a->act), (double)a->alpha,
                  (double)a->beta);
  if (a->act == QT_ACT_DIV && a->alpha == 0.0f) return qt_err(err, "div: the divisor (alpha) is 0");
  return same_as_input(a, in, ndim, shape, err);
}

/* PReLU's slopes: one, or one per channel. */
static int prelu_shape(const qt_node_attrs *a, const qt_value *const *in, int *ndim, int64_t *shape, char *err) {
  const int64_t C = in[0]->shape[in[0]->ndim - 1];
  if (a->out_channels != 1 && a->out_channels != C)
    return qt_err(err, "%d slopes for %lld channels (1, or one per channel)", a->out_channels, (long long)C);
  return same_as_input(a, in, ndim, shape, err);
}

/* Resize: an image, scales 2 and 2, nearest or bilinear. */
static int resize_shape(const qt_node_attrs *a, const qt_value *const *in, int *ndim, int64_t *shape, char *err) {
  if (in[0]->ndim != 3) return qt_err(err, "resize needs an image (H, W, C), has rank %d", in[0]->ndim);
  if (a->stride_h != 2 || a->stride_w != 2)
    return qt_err(err, "scales %d x %d; only 2 x 2 is supported", a->stride_h, a->stride_w);
  if (a->mode != QT_RESIZE_NEAREST && a->mode != QT_RESIZE_BILINEAR)
    return qt_err(err, "mode %d is neither nearest (0) nor bilinear (1)", a->mode);
  *ndim = 3;
  shape[0] = 2 * in[0]->shape[0];
  shape[1] = 2 * in[0]->shape[1];
  shape[2] = in[0]->shape[2];
  return 0;
}

/* Dropout's probability is in [0, 1) (ONNX's range: 1 would zero everything). */
static int dropout_shape(const qt_node_attrs *a, const qt_value *const *in, int *ndim, int64_t *shape, char *err) {
  if (!(a->ratio >= 0.0f && a->ratio < 1.0f))
    return qt_err(err, "dropout: ratio %g is not in [0, 1)", (double)a->ratio);
  return same_as_input(a, in, ndim, shape, err);
}

static int image_input(const char *op, const qt_value *x, char *err) {
  return x->ndim == 3 ? 0 : qt_err(err, "%s input '%s' is not an image (H, W, C)", op, x->name);
}

static int conv_shape(const qt_node_attrs *a, const qt_value *const *in, int *ndim, int64_t *shape, char *err) {
  const qt_value *x = in[0];
  if (image_input("conv2d", x, err)) return -1;
  const int64_t C = x->shape[2];
  if (a->groups < 1 || a->out_channels < 1 || C % a->groups || a->out_channels % a->groups)
    return qt_err(err, "groups %d must divide in-channels %lld and out-channels %d", a->groups, (long long)C,
                  a->out_channels);
  /* a convolution's windows are placed as a floor-mode pool's */
  shape[0] = qt_pool_output_size(x->shape[0], a->kernel_h, a->stride_h, a->pad_h, 0);
  shape[1] = qt_pool_output_size(x->shape[1], a->kernel_w, a->stride_w, a->pad_w, 0);
  if (shape[0] < 1 || shape[1] < 1)
    return qt_err(err, "kernel %dx%d stride %dx%d pad %dx%d do not fit input %lldx%lld", a->kernel_h, a->kernel_w,
                  a->stride_h, a->stride_w, a->pad_h, a->pad_w, (long long)x->shape[0], (long long)x->shape[1]);
  shape[2] = a->out_channels;
  *ndim = 3;
  return 0;
}

static int pool_shape(const char *op, const qt_node_attrs *a, const qt_value *x, int *ndim, int64_t *shape, char *err) {
  if (image_input(op, x, err)) return -1;
  if (a->kernel_h != a->kernel_w || a->stride_h != a->stride_w || a->pad_h != a->pad_w)
    return qt_err(err, "%s needs a square kernel, stride and padding (kernel %dx%d stride %dx%d pad %dx%d)", op,
                  a->kernel_h, a->kernel_w, a->stride_h, a->stride_w, a->pad_h, a->pad_w);
  shape[0] = qt_pool_output_size(x->shape[0], a->kernel_h, a->stride_h, a->pad_h, a->ceil);
  shape[1] = qt_pool_output_size(x->shape[1], a->kernel_w, a->stride_w, a->pad_w, a->ceil);
  if (shape[0] < 1 || shape[1] < 1 || 2 * a->pad_h > a->kernel_h)
    return qt_err(err, "kernel %d stride %d pad %d do not fit input %lldx%lld", a->kernel_h, a->stride_h, a->pad_h,
                  (long long)x->shape[0], (long long)x->shape[1]);
  shape[2] = x->shape[2];
  *ndim = 3;
  return 0;
}
static int max_pool_shape(const qt_node_attrs *a, const qt_value *const *in, int *ndim, int64_t *shape, char *err) {
  return pool_shape("max_pool2d", a, in[0], ndim, shape, err);
}
static int avg_pool_shape(const qt_node_attrs *a, const qt_value *const *in, int *ndim, int64_t *shape, char *err) {
  return pool_shape("avg_pool2d", a, in[0], ndim, shape, err);
}

static int global_pool_shape(const qt_node_attrs *a, const qt_value *const *in, int *ndim, int64_t *shape, char *err) {
  (void)a;
  if (image_input("global_avg_pool", in[0], err)) return -1;
  shape[0] = in[0]->shape[2];
  *ndim = 1;
  return 0;
}

static int flatten_shape(const qt_node_attrs *a, const qt_value *const *in, int *ndim, int64_t *shape, char *err) {
  (void)a;
  (void)err;
  shape[0] = 1;
  for (int d = 0; d < in[0]->ndim; d++) shape[0] *= in[0]->shape[d];
  *ndim = 1;
  return 0;
}

static int linear_shape(const qt_node_attrs *a, const qt_value *const *in, int *ndim, int64_t *shape, char *err) {
  const qt_value *x = in[0];
  if (x->ndim != 1)
    return qt_err(err, "linear input '%s' has rank %d, want flat features (F) (insert a flatten)", x->name, x->ndim);
  if (a->out_channels < 1) return qt_err(err, "%d output features", a->out_channels);
  shape[0] = a->out_channels;
  *ndim = 1;
  return 0;
}

static int add_shape(const qt_node_attrs *a, const qt_value *const *in, int *ndim, int64_t *shape, char *err) {
  int same = in[0]->ndim == in[1]->ndim;
  for (int d = 0; same && d < in[0]->ndim; d++) same = in[0]->shape[d] == in[1]->shape[d];
  if (!same) return qt_err(err, "add inputs '%s' and '%s' differ in shape", in[0]->name, in[1]->name);
  return same_as_input(a, in, ndim, shape, err);
}

/* mul: b of a's shape, or the image a (H, W, C) scaled per channel by the vector b (C). */
static int mul_shape(const qt_node_attrs *a, const qt_value *const *in, int *ndim, int64_t *shape, char *err) {
  const qt_value *x = in[0], *s = in[1];
  int same = x->ndim == s->ndim;
  for (int d = 0; same && d < x->ndim; d++) same = x->shape[d] == s->shape[d];
  if (!same && !(x->ndim == 3 && s->ndim == 1 && s->shape[0] == x->shape[2]))
    return qt_err(err, "mul inputs '%s' and '%s' neither have one shape nor are an image and a vector of its channels",
                  x->name, s->name);
  return same_as_input(a, in, ndim, shape, err);
}

/* concat: one rank, equal dims but the last, which adds up. */
static int concat_shape(const qt_node_attrs *a, const qt_value *const *in, int *ndim, int64_t *shape, char *err) {
  (void)a;
  const qt_value *x = in[0];
  shape[x->ndim - 1] = 0;
  for (int k = 0; k < QT_MAX_INPUTS && in[k]; k++) {
    int fits = in[k]->ndim == x->ndim;
    for (int d = 0; fits && d + 1 < x->ndim; d++) fits = in[k]->shape[d] == x->shape[d];
    if (!fits)
      return qt_err(err, "concat inputs '%s' and '%s' differ in rank or in a dimension other than the last", x->name,
                    in[k]->name);
    shape[x->ndim - 1] += in[k]->shape[x->ndim - 1];
  }
  for (int d = 0; d + 1 < x->ndim; d++) shape[d] = x->shape[d];
  *ndim = x->ndim;
  return 0;
}

static int shuffle_shape(const qt_node_attrs *a, const qt_value *const *in, int *ndim, int64_t *shape, char *err) {
  const int64_t C = in[0]->shape[in[0]->ndim - 1];
  if (a->groups < 1 || C % a->groups)
    return qt_err(err, "channel_shuffle: %d groups do not divide the %lld channels of '%s'", a->groups, (long long)C,
                  in[0]->name);
  return same_as_input(a, in, ndim, shape, err);
}

static int slice_shape(const qt_node_attrs *a, const qt_value *const *in, int *ndim, int64_t *shape, char *err) {
  const qt_value *x = in[0];
  const int64_t C = x->shape[x->ndim - 1];
  if (a->begin < 0 || a->begin >= a->end || a->end > C)
    return qt_err(err, "channel_slice: channels [%d, %d) of the %lld of '%s'", a->begin, a->end, (long long)C, x->name);
  same_as_input(a, in, ndim, shape, err);
  shape[x->ndim - 1] = a->end - a->begin;
  return 0;
}

static int layer_norm_shape(const qt_node_attrs *a, const qt_value *const *in, int *ndim, int64_t *shape, char *err) {
  if (!(a->eps > 0) || !isfinite(a->eps))
    return qt_err(err, "layer_norm: eps %g must be finite and > 0", (double)a->eps);
  return same_as_input(a, in, ndim, shape, err);
}

/* attention: q, k, v of one image shape, heads dividing the channels. */
static int attention_shape(const qt_node_attrs *a, const qt_value *const *in, int *ndim, int64_t *shape, char *err) {
  if (image_input("attention", in[0], err)) return -1;
  for (int k = 1; k < 3; k++)
    if (in[k]->ndim != 3 || memcmp(in[k]->shape, in[0]->shape, sizeof in[0]->shape))
      return qt_err(err, "attention inputs '%s' and '%s' differ in shape", in[0]->name, in[k]->name);
  if (a->heads < 1 || in[0]->shape[2] % a->heads)
    return qt_err(err, "attention: %d heads do not divide the %lld channels of '%s'", a->heads,
                  (long long)in[0]->shape[2], in[0]->name);
  return same_as_input(a, in, ndim, shape, err);
}

/* prepend_token: (1, 1 + H W, C) of an image; first_token: (C) of an image. */
static int prepend_token_shape(const qt_node_attrs *a, const qt_value *const *in, int *ndim, int64_t *shape,
                               char *err) {
  (void)a;
  if (image_input("prepend_token", in[0], err)) return -1;
  *ndim = 3;
  shape[0] = 1, shape[1] = 1 + in[0]->shape[0] * in[0]->shape[1], shape[2] = in[0]->shape[2];
  return 0;
}

static int first_token_shape(const qt_node_attrs *a, const qt_value *const *in, int *ndim, int64_t *shape, char *err) {
  (void)a;
  if (image_input("first_token", in[0], err)) return -1;
  *ndim = 1;
  shape[0] = in[0]->shape[2], shape[1] = shape[2] = 0;
  return 0;
}

enum { NONE = QT_SLOT_NONE, OPT = QT_SLOT_OPTIONAL, REQ = QT_SLOT_REQUIRED };

static const qt_op_info op_table[] = {
    [QT_OP_INPUT] = {.name = "input", .min_inputs = 0, .max_inputs = 0},
    [QT_OP_CONV2D] = {.name = "conv2d",
                      .min_inputs = 1,
                      .max_inputs = 1,
                      .param_suffix = {"weight", "bias"},
                      .param_use = {REQ, OPT},
                      .has_weight = 1,
                      .weight_rank = 4,
                      .shape = conv_shape},
    [QT_OP_BATCH_NORM] = {.name = "batch_norm",
                          .min_inputs = 1,
                          .max_inputs = 1,
                          .param_suffix = {"weight", "bias"},
                          .param_use = {REQ, REQ},
                          .buffer_suffix = {"running_mean", "running_var"},
                          .buffer_use = {REQ, REQ},
                          .stateful = 1,
                          .shape = same_as_input},
    [QT_OP_RELU] = {.name = "relu", .min_inputs = 1, .max_inputs = 1, .param_free = 1, .shape = same_as_input},
    [QT_OP_RELU6] = {.name = "relu6", .min_inputs = 1, .max_inputs = 1, .param_free = 1, .shape = same_as_input},
    [QT_OP_MAX_POOL2D] =
        {.name = "max_pool2d", .min_inputs = 1, .max_inputs = 1, .param_free = 1, .shape = max_pool_shape},
    [QT_OP_AVG_POOL2D] =
        {.name = "avg_pool2d", .min_inputs = 1, .max_inputs = 1, .param_free = 1, .shape = avg_pool_shape},
    [QT_OP_GLOBAL_AVG_POOL] =
        {.name = "global_avg_pool", .min_inputs = 1, .max_inputs = 1, .param_free = 1, .shape = global_pool_shape},
    [QT_OP_FLATTEN] = {.name = "flatten", .min_inputs = 1, .max_inputs = 1, .param_free = 1, .shape = flatten_shape},
    [QT_OP_LINEAR] = {.name = "linear",
                      .min_inputs = 1,
                      .max_inputs = 1,
                      .param_suffix = {"weight", "bias"},
                      .param_use = {REQ, OPT},
                      .has_weight = 1,
                      .weight_rank = 2,
                      .shape = linear_shape},
    [QT_OP_ADD] = {.name = "add", .min_inputs = 2, .max_inputs = 2, .param_free = 1, .shape = add_shape},
    [QT_OP_ACTIVATION] = {.name = "activation", .min_inputs = 1, .max_inputs = 1, .param_free = 1, .shape = act_shape},
    [QT_OP_MUL] = {.name = "mul", .min_inputs = 2, .max_inputs = 2, .param_free = 1, .shape = mul_shape},
    [QT_OP_CONCAT] =
        {.name = "concat", .min_inputs = 2, .max_inputs = QT_MAX_INPUTS, .param_free = 1, .shape = concat_shape},
    [QT_OP_CHANNEL_SHUFFLE] =
        {.name = "channel_shuffle", .min_inputs = 1, .max_inputs = 1, .param_free = 1, .shape = shuffle_shape},
    [QT_OP_CHANNEL_SLICE] =
        {.name = "channel_slice", .min_inputs = 1, .max_inputs = 1, .param_free = 1, .shape = slice_shape},
    [QT_OP_LAYER_NORM] = {.name = "layer_norm",
                          .min_inputs = 1,
                          .max_inputs = 1,
                          .param_suffix = {"weight", "bias"},
                          .param_use = {REQ, REQ},
                          .shape = layer_norm_shape},
    [QT_OP_ATTENTION] =
        {.name = "attention", .min_inputs = 3, .max_inputs = 3, .param_free = 1, .shape = attention_shape},
    [QT_OP_ADD_PARAM] = {.name = "add_param",
                         .min_inputs = 1,
                         .max_inputs = 1,
                         .param_suffix = {"weight"},
                         .param_use = {REQ},
                         .param_per_sample = 1,
                         .shape = same_as_input},
    [QT_OP_DROPOUT] = {.name = "dropout", .min_inputs = 1, .max_inputs = 1, .stateful = 1, .shape = dropout_shape},
    [QT_OP_RESIZE] = {.name = "resize", .min_inputs = 1, .max_inputs = 1, .param_free = 1, .shape = resize_shape},
    [QT_OP_PREPEND_TOKEN] = {.name = "prepend_token",
                             .min_inputs = 1,
                             .max_inputs = 1,
                             .param_suffix = {"weight"},
                             .param_use = {REQ},
                             .shape = prepend_token_shape},
    [QT_OP_FIRST_TOKEN] =
        {.name = "first_token", .min_inputs = 1, .max_inputs = 1, .param_free = 1, .shape = first_token_shape},
    [QT_OP_PRELU] = {.name = "prelu",
                     .min_inputs = 1,
                     .max_inputs = 1,
                     .param_suffix = {"weight"},
                     .param_use = {REQ},
                     .param_count_attr = 1,
                     .shape = prelu_shape},
    [QT_OP_FAKE_QUANT] = {.name = "fake_quant",
                          .min_inputs = 1,
                          .max_inputs = 1,
                          .stateful = 1,
                          .act_quant = 1,
                          .graphs = QT_OP_PREPARED_ONLY,
                          .shape = same_as_input},
    [QT_OP_CONV_BN] = {.name = "conv_bn",
                       .min_inputs = 1,
                       .max_inputs = 1,
                       .param_suffix = {"weight", "bias", "bn.weight", "bn.bias"},
                       .param_use = {REQ, OPT, REQ, REQ},
                       .buffer_suffix = {"bn.running_mean", "bn.running_var"},
                       .buffer_use = {REQ, REQ},
                       .has_weight = 1,
                       .weight_rank = 4,
                       .stateful = 1,
                       .graphs = QT_OP_PREPARED_ONLY,
                       .shape = conv_shape},
    [QT_OP_QUANTIZE] = {.name = "quantize",
                        .min_inputs = 1,
                        .max_inputs = 1,
                        .act_quant = 1,
                        .graphs = QT_OP_CONVERT_ONLY,
                        .shape = same_as_input},
    [QT_OP_DEQUANTIZE] = {.name = "dequantize",
                          .min_inputs = 1,
                          .max_inputs = 1,
                          .act_quant = 1,
                          .graphs = QT_OP_CONVERT_ONLY,
                          .shape = same_as_input},
};
_Static_assert(sizeof op_table / sizeof op_table[0] == QT_OP_COUNT, "op table out of sync with qt_op");
_Static_assert(QT_P_WEIGHT == 0 && QT_P_BIAS == 1 && QT_P_GAMMA == 0 && QT_P_BETA == 1 && QT_P_BN_GAMMA == 2 &&
                   QT_P_BN_BETA == 3 && QT_B_RUNNING_MEAN == 0 && QT_B_RUNNING_VAR == 1,
               "slot roles and the table's slot order");

const qt_op_info *qt_op_info_get(qt_op op) {
  QT_ASSERT((unsigned)op < QT_OP_COUNT && op_table[op].name, "op %d is not an op", (int)op);
  return &op_table[op];
}

const char *qt_op_name(qt_op op) { return (unsigned)op < QT_OP_COUNT ? op_table[op].name : "?"; }

int qt_op_parse(const char *name, qt_op *out) {
  for (int i = 0; i < QT_OP_COUNT; i++)
    if (strcmp(name, op_table[i].name) == 0) {
      *out = (qt_op)i;
      return 0;
    }
  return -1;
}

int qt_op_has_weight(qt_op op) { return (unsigned)op < QT_OP_COUNT && op_table[op].has_weight; }
int qt_op_is_stateful(qt_op op) { return (unsigned)op < QT_OP_COUNT && op_table[op].stateful; }
int qt_op_is_param_free(qt_op op) { return (unsigned)op < QT_OP_COUNT && op_table[op].param_free; }

int qt_op_output_shape(qt_op op, const qt_node_attrs *attr, const qt_value *const *inputs, int n_inputs, int *ndim,
                       int64_t shape[3], char *err) {
  const qt_op_info *info = qt_op_info_get(op);
  if (n_inputs < info->min_inputs || n_inputs > info->max_inputs) {
    if (info->min_inputs == info->max_inputs)
      return qt_err(err, "op '%s' takes %d input(s), has %d", info->name, info->min_inputs, n_inputs);
    return qt_err(err, "op '%s' takes %d to %d inputs, has %d", info->name, info->min_inputs, info->max_inputs,
                  n_inputs);
  }
  if (!info->shape) return qt_err(err, "op '%s' has no inferred output shape", info->name);
  memset(shape, 0, 3 * sizeof *shape);
  const qt_value *in[QT_MAX_INPUTS + 1] = {0}; /* NULL after the last (concat counts them) */
  for (int k = 0; k < n_inputs; k++) in[k] = inputs[k];
  return info->shape(attr, in, ndim, shape, err);
}
