/* One node's computation, shared by the executor (exec.c) and qt_node_forward: parameters as
 * tensors, the weights and biases a layer computes with (fp32, fake-quantized, LSQ or the
 * dequantized integers of a convert graph), and the fp32 ops a node runs alone. */
#include "nn/node.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* A parameter as an arena tensor header over the slabs. */
qt_tensor *qt_param_tensor(qt_graph *g, qt_ctx *ctx, int idx) {
  if (idx < 0) return NULL;
  qt_param *p = &g->tensors[idx];
  QT_ASSERT(!p->is_buffer, "parameter %s is a buffer", p->name);
  if (p->tape_at < 0) p->tape_at = (int64_t)qt_ctx_tape_length(ctx);
  qt_tensor *t = qt_tensor_wrap(ctx, QT_F32, p->ndim, p->shape, g->params + p->offset);
  t->grad = g->grads + p->offset;
  t->requires_grad = 1;
  return t;
}

/* LSQ: once fake quant runs on calibrated qparams the learned scale is the source of truth and
 * observers no longer touch it. Before that (a calibration pass, fake quant off) every batch is
 * observed and the scale follows the observer; in QAT started from observers the first training
 * batch initializes it. */
int qt_lsq_initialized(const qt_qstate *q) { return q->scale_param >= 0 && q->calibrated && q->fake_quant; }

/* LSQ: the observer's qparams initialize the learned scale. */
void qt_lsq_init(qt_graph *g, qt_qstate *q) {
  memcpy(qt_graph_tensor_data(g, q->scale_param), q->scale, (size_t)q->channels * sizeof(float));
}

/* LSQ: the learned scale as a parameter tensor, clamped to >= FLT_EPSILON (as PyTorch's
 * _LearnableFakeQuantize clamps it), mirrored into q->scale so convert and the check see the
 * qparams training used. */
qt_tensor *qt_lsq_scale(qt_graph *g, qt_ctx *ctx, qt_qstate *q) {
  float *s = qt_graph_tensor_data(g, q->scale_param);
  for (int c = 0; c < q->channels; c++) {
    if (!(s[c] >= FLT_EPSILON)) s[c] = FLT_EPSILON;
    q->scale[c] = s[c];
  }
  return qt_param_tensor(g, ctx, q->scale_param);
}

void qt_graph_sync_learned_scales(qt_graph *g) {
  for (int i = 0; i < g->n_nodes; i++) {
    qt_qstate *qs[2] = {g->nodes[i].q, g->nodes[i].wq};
    for (int k = 0; k < 2; k++) {
      qt_qstate *q = qs[k];
      if (!q || q->scale_param < 0 || !q->calibrated) continue;
      float *s = qt_graph_tensor_data(g, q->scale_param);
      for (int c = 0; c < q->channels; c++) {
        if (!(s[c] >= FLT_EPSILON)) s[c] = FLT_EPSILON;
        q->scale[c] = s[c];
      }
    }
  }
}

/* The weight a conv/linear computes with: the parameter itself (fp32), its fake-quantized
 * version (prepared graphs; observed first in training mode), or the dequantized integer
 * weights of a convert graph. */
qt_tensor *qt_effective_weight(qt_graph *g, qt_ctx *ctx, qt_node *n, qt_tensor *w, char *err) {
  qt_qstate *q = n->wq;
  if (!q) return w;
  const int64_t numel = qt_tensor_numel(w), inner = numel / q->channels;
  if (q->qweight) {
    qt_tensor *t = qt_tensor_new(ctx, QT_F32, w->ndim, w->shape);
    qt_dequantize(qt_f32(t), q->qweight, 1, q->channels, inner, q->scale, q->zero_point);
    return t;
  }
  if (n->training && q->observe && !qt_lsq_initialized(q)) {
    char why[QT_ERR_LEN];
    const double t0 = qt_ctx_profile(ctx) ? qt_now_seconds() : 0;
    if (qt_qstate_observe(q, qt_f32(w), 1, inner, why)) {
      qt_err(err, "weight quantization of %s: %s", n->name, why);
      return NULL;
    }
    if (q->scale_param >= 0) qt_lsq_init(g, q);
    if (qt_ctx_profile(ctx)) qt_profile_add_phase(qt_ctx_profile(ctx), QT_PROFILE_OBSERVER, qt_now_seconds() - t0);
  }
  if (!q->fake_quant) return w;
  if (!q->calibrated) {
    qt_err(err, "weight quantization of %s: %s", n->name, "no qparams yet (observer never ran)");
    return NULL;
  }
  if (q->scale_param >= 0) {
    qt_tensor *st = qt_lsq_scale(g, ctx, q);
    /* LSQ's gradient scale 1/sqrt(N Qp) with N the whole weight tensor's element count, per
     * channel too (PyTorch's _LearnableFakeQuantize with use_grad_scaling; the LSQ paper's N for
     * a layer's weights). N = one channel's count made each channel's scale step sqrt(channels)
     * times larger, and at 8 bits scales overshot into the range where every weight of the
     * channel rounds to 0, where their gradient vanishes (ResCNN W8A8: scales 200x the channel's
     * max/Qp, 84.17% after one epoch against 89.14% with this N; docs/experiments.md, "LSQ at 8 bits"). */
    return qt_fake_quant_lsq(ctx, w, 1, q->channels, inner, st, q->zero_point, q->spec.qmin, q->spec.qmax,
                             1.0f / sqrtf((float)numel * (float)q->spec.qmax));
  }
  return qt_fake_quant(ctx, w, 1, q->channels, inner, q->scale, q->zero_point, q->spec.qmin, q->spec.qmax);
}

/* The bias a conv/linear computes with: the parameter itself (fp32, or a float bias), or, with
 * an int32 bias (weight spec bias_int32), the dequantized integers of a convert graph or the
 * fake-quantized bias of a prepared graph (scale s_x * s_w[c], zero point 0; the straight-through
 * estimator passes its gradient, which the int32 range never clips in practice). */
qt_tensor *qt_effective_bias(qt_graph *g, qt_ctx *ctx, int node, qt_tensor *b, char *err) {
  qt_node *n = &g->nodes[node];
  qt_qstate *q = n->wq;
  if (!b || !q || !q->spec.bias_int32 || (!q->qbias && !q->fake_quant)) return b;
  const int OC = n->attr.out_channels;
  float *scale = qt_arena_calloc(ctx, (size_t)OC * sizeof(float));
  if (qt_bias_scales(g, node, scale, err)) return NULL;
  if (q->qbias) {
    QT_ASSERT(q->n_qbias == OC, "%s: %lld integer biases for %d channels", n->name, (long long)q->n_qbias, OC);
    qt_tensor *t = qt_tensor_new(ctx, QT_F32, b->ndim, b->shape);
    int32_t *zero = qt_arena_calloc(ctx, (size_t)OC * sizeof(int32_t));
    qt_dequantize(qt_f32(t), q->qbias, 1, OC, 1, scale, zero);
    return t;
  }
  int32_t *zero = qt_arena_calloc(ctx, (size_t)OC * sizeof(int32_t));
  return qt_fake_quant(ctx, b, 1, OC, 1, scale, zero, QT_BIAS_QMIN, QT_BIAS_QMAX);
}

/* conv_bn in eval mode with an int32 bias: what its folded bias loses to the int32 grid,
 * fq(bf) - bf per channel (bf = beta + (b - running_mean) * sf, qt_bn_fold), so that the eval
 * forward computes what convert's conv2d with the integer bias computes (training mode keeps
 * the float BN, as delayed folding does). NULL with nothing to add. */
qt_tensor *qt_conv_bn_bias_rounding(qt_graph *g, qt_ctx *ctx, int node, char *err, int *failed) {
  qt_node *n = &g->nodes[node];
  *failed = 0;
  if (n->training || !n->wq || !n->wq->spec.bias_int32 || !n->wq->fake_quant) return NULL;
  const int OC = n->attr.out_channels;
  float *scale = qt_arena_calloc(ctx, (size_t)OC * sizeof(float));
  if (qt_bias_scales(g, node, scale, err)) {
    *failed = 1;
    return NULL;
  }
  const int64_t shape[1] = {OC};
  qt_tensor *bf = qt_tensor_new(ctx, QT_F32, 1, shape);
  qt_bn_fold(NULL, qt_f32(bf), NULL, n->param[QT_P_BIAS] >= 0 ? qt_graph_tensor_data(g, n->param[QT_P_BIAS]) : NULL,
             qt_graph_tensor_data(g, n->param[QT_P_BN_GAMMA]), qt_graph_tensor_data(g, n->param[QT_P_BN_BETA]),
             qt_graph_tensor_data(g, n->buffer[QT_B_RUNNING_MEAN]),
             qt_graph_tensor_data(g, n->buffer[QT_B_RUNNING_VAR]), n->attr.eps, OC, 0);
  int32_t *zero = qt_arena_calloc(ctx, (size_t)OC * sizeof(int32_t));
  int32_t *qb = qt_arena_calloc(ctx, (size_t)OC * sizeof(int32_t));
  qt_quantize(qb, qt_f32(bf), 1, OC, 1, scale, zero, QT_BIAS_QMIN, QT_BIAS_QMAX);
  qt_tensor *d = qt_tensor_new(ctx, QT_F32, 1, shape);
  qt_dequantize(qt_f32(d), qb, 1, OC, 1, scale, zero);
  for (int c = 0; c < OC; c++) qt_f32(d)[c] -= qt_f32(bf)[c];
  return d;
}

/* Without grad nothing is recorded: a temporary a node made (a fake-quantized or dequantized
 * weight, conv_bn's intermediate activations) is dead once the op that read it has run, and its
 * memory goes back to the arena, unless it is `keep` or lies in keep's memory (a weight that
 * is the parameter itself, an op that returned its input). Grad mode keeps everything. */
void qt_drop_unless(qt_ctx *ctx, qt_tensor *dead, const qt_tensor *keep) {
  if (dead && dead != keep && !(keep && dead->data == keep->data) && !qt_ctx_grad_enabled(ctx))
    qt_tensor_free(ctx, dead);
}

qt_tensor *qt_apply_simple_op(qt_ctx *ctx, qt_op op, const qt_node_attrs *a, qt_tensor *const *in, int n_in,
                              int inplace) {
  qt_tensor *x = in[0], *x2 = n_in > 1 ? in[1] : NULL;
  switch (op) {
    case QT_OP_RELU: return qt_relu(ctx, x, inplace);
    case QT_OP_RELU6: return qt_relu6(ctx, x, inplace);
    case QT_OP_MAX_POOL2D: return qt_max_pool2d(ctx, x, a->kernel_h, a->stride_h, a->pad_h, a->ceil);
    case QT_OP_AVG_POOL2D: return qt_avg_pool2d(ctx, x, a->kernel_h, a->stride_h, a->pad_h, a->ceil);
    case QT_OP_GLOBAL_AVG_POOL: return qt_global_avg_pool(ctx, x);
    case QT_OP_FLATTEN: return qt_flatten(ctx, x);
    case QT_OP_ADD: return x2 ? qt_add(ctx, x, x2) : NULL;
    case QT_OP_ACTIVATION: return qt_activation(ctx, x, (qt_act){(qt_act_kind)a->act, a->alpha, a->beta});
    case QT_OP_MUL: return x2 ? qt_mul(ctx, x, x2) : NULL;
    case QT_OP_CONCAT: return qt_concat(ctx, in, n_in);
    case QT_OP_CHANNEL_SHUFFLE: return qt_channel_shuffle(ctx, x, a->groups);
    case QT_OP_CHANNEL_SLICE: return qt_channel_slice(ctx, x, a->begin, a->end);
    case QT_OP_RESIZE: return qt_resize2x(ctx, x, a->mode == QT_RESIZE_BILINEAR);
    case QT_OP_ATTENTION: return n_in == 3 ? qt_attention(ctx, x, in[1], in[2], a->heads) : NULL;
    case QT_OP_FIRST_TOKEN: return qt_first_token(ctx, x);
    default: return NULL;
  }
}

/* A dropout node's key for a step's seed: FNV-1a of its name mixed into the seed, so that each
 * node draws its own mask, the same in the fp32 and the prepared graph (names carry over). */
static uint64_t dropout_key(uint64_t seed, const char *name) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (const unsigned char *c = (const unsigned char *)name; *c; c++) h = (h ^ *c) * 0x100000001B3ull;
  return seed ^ (h * 0x9E3779B97F4A7C15ull);
}

qt_tensor *qt_node_forward(qt_graph *g, qt_ctx *ctx, int node, qt_tensor *const *inputs, int inplace, char *err) {
  QT_ASSERT(node >= 0 && node < g->n_nodes && g->finalized, "node %d of graph %s", node, g->name);
  qt_node *n = &g->nodes[node];
  const qt_node_attrs *a = &n->attr;
  qt_tensor *x = n->n_inputs > 0 ? inputs[0] : NULL, *w = NULL, *b = NULL;
  switch (n->op) {
    case QT_OP_CONV2D:
    case QT_OP_LINEAR: {
      qt_tensor *wp = qt_param_tensor(g, ctx, n->param[QT_P_WEIGHT]),
                *bp = qt_param_tensor(g, ctx, n->param[QT_P_BIAS]);
      if (!(w = qt_effective_weight(g, ctx, n, wp, err))) return NULL;
      if (!(b = qt_effective_bias(g, ctx, node, bp, err)) && bp) return NULL;
      qt_tensor *y = n->op == QT_OP_CONV2D
                         ? qt_conv2d(ctx, x, w, b, a->stride_h, a->stride_w, a->pad_h, a->pad_w, a->groups)
                         : qt_linear(ctx, x, w, b);
      qt_drop_unless(ctx, b, bp);
      qt_drop_unless(ctx, w, wp);
      return y;
    }
    case QT_OP_BATCH_NORM:
      return qt_batch_norm(ctx, x, qt_param_tensor(g, ctx, n->param[QT_P_GAMMA]),
                           qt_param_tensor(g, ctx, n->param[QT_P_BETA]),
                           g->buffers + g->tensors[n->buffer[QT_B_RUNNING_MEAN]].offset,
                           g->buffers + g->tensors[n->buffer[QT_B_RUNNING_VAR]].offset, n->training && !n->bn_frozen,
                           a->momentum, a->eps, inplace);
    case QT_OP_LAYER_NORM:
      return qt_layer_norm(ctx, x, qt_param_tensor(g, ctx, n->param[QT_P_GAMMA]),
                           qt_param_tensor(g, ctx, n->param[QT_P_BETA]), a->eps);
    case QT_OP_ADD_PARAM: return qt_channel_add(ctx, x, qt_param_tensor(g, ctx, n->param[QT_P_WEIGHT]));
    case QT_OP_PREPEND_TOKEN: return qt_prepend_token(ctx, x, qt_param_tensor(g, ctx, n->param[QT_P_WEIGHT]));
    case QT_OP_PRELU: return qt_prelu(ctx, x, qt_param_tensor(g, ctx, n->param[QT_P_WEIGHT]));
    case QT_OP_DROPOUT:
      if (!n->training || a->ratio == 0.0f) return x; /* the identity: the value aliases its input */
      return qt_dropout(ctx, x, a->ratio, dropout_key(qt_ctx_random_seed(ctx), n->name), qt_ctx_random_row0(ctx));
    default:
      if (qt_op_is_param_free(n->op))
        return qt_apply_simple_op(ctx, n->op, a, inputs, n->n_inputs,
                                  inplace && (n->op == QT_OP_RELU || n->op == QT_OP_RELU6));
      qt_err(err,
             "node %s: op '%s' is not an fp32 op (qt_node_forward computes conv2d, linear, batch_norm, layer_norm, "
             "add_param, prepend_token, prelu, dropout and the parameter-free ops)",
             n->name, qt_op_name(n->op));
      return NULL;
  }
}
