/* The executor: runs a graph node by node in its mode, each node as the fusion pass marked it
 * (fuse.h: alone, fused with its producer or consumer, in which layout), with the no-grad memory
 * planner. */
#include "nn/fuse.h"
#include "nn/node.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Whether relu (or an unrecorded batch norm) may overwrite its input: the input has no other
 * reader, and its producer owns the buffer and does not need its own output for backward. */
static int relu_inplace_ok(const qt_graph *g, int x) {
  const qt_value *v = &g->values[x];
  if (v->consumers != 1 || x == g->output) return 0;
  qt_op p = g->nodes[v->producer].op;
  return p == QT_OP_CONV2D || p == QT_OP_BATCH_NORM || p == QT_OP_LINEAR || p == QT_OP_ADD || p == QT_OP_CONV_BN;
}

static qt_tensor *fail(qt_graph *g, const char *fmt, const char *node, const char *why) {
  snprintf(g->error, sizeof g->error, fmt, node, why);
  return NULL;
}

/* The no-grad memory planner.
 *
 * With ctx's grad mode off nothing is recorded, so a value is dead once the last node reading
 * it has run (nodes run in order). The planner hands its memory back to the arena
 * (qt_arena_free), whose later allocations take the smallest freed range that fits: a forward
 * then spans about the largest set of values alive at once instead of the sum of all of them
 * (FashionCNN at batch 256: tests/nn/test_forward_memory.c). Memory is tracked per buffer,
 * not per value: in-place relu/relu6/batch_norm, flatten views and a disabled fake quant return
 * a tensor over their input's buffer, so a buffer (its first value, the root) goes back once
 * every value over it is dead. Never handed back: the graph input (the caller's), forced values
 * (another arena's), the output and the values the caller keeps. Whether an op runs in place
 * is decided as without the planner (relu_inplace_ok: the input's only consumer), so the
 * planner changes where values live, never what is computed. Temporaries inside a node (a
 * fake-quantized weight, conv_bn's intermediate activations) go back as soon as the node has
 * used them (qt_drop_unless). With grad on and the ctx's frees on (qt_ctx_set_backward_frees, as
 * the trainer runs), a buffer goes back once its values are dead unless one of them was saved
 * for backward (qt_tensor.saved, set by the ops that recorded it; read when the value dies,
 * after all its consumers recorded): a relu's output that only a max pool read, a fake quant's
 * input that only an STE fake quant read. With grad on and frees off, every value is kept. */
typedef struct {
  int *last;            /* per value: the last node reading it (its producer when none does) */
  int *root;            /* per value: the value whose buffer it lives in, -1 when not ours */
  int *refs;            /* per root: live values over its buffer */
  qt_tensor **owner;    /* per root: the tensor its buffer was made for (size and pointer) */
  unsigned char *saved; /* per root: a value over its buffer is saved for backward (grad mode) */
  const unsigned char *keep;
} forward_plan;

static void plan_init(forward_plan *p, const qt_graph *g, qt_ctx *ctx, const unsigned char *keep) {
  p->last = qt_arena_alloc(ctx, (size_t)g->n_values * sizeof *p->last);
  p->root = qt_arena_alloc(ctx, (size_t)g->n_values * sizeof *p->root);
  p->refs = qt_arena_calloc(ctx, (size_t)g->n_values * sizeof *p->refs);
  p->owner = qt_arena_calloc(ctx, (size_t)g->n_values * sizeof *p->owner);
  p->saved = qt_arena_calloc(ctx, (size_t)g->n_values);
  p->keep = keep;
  for (int v = 0; v < g->n_values; v++) {
    p->last[v] = g->values[v].producer;
    p->root[v] = -1;
  }
  for (int i = 0; i < g->n_nodes; i++)
    for (int k = 0; k < g->nodes[i].n_inputs; k++)
      if (p->last[g->nodes[i].inputs[k]] < i) p->last[g->nodes[i].inputs[k]] = i;
}

/* Value v is now vals[v], computed by node `node` (y its tensor, which vals[v] is unless v was
 * forced): note which buffer it lives in; a computed tensor that was replaced by a forced one
 * is dead at once. */
static void plan_produced(forward_plan *p, const qt_graph *g, qt_ctx *ctx, int node, int v, qt_tensor *y,
                          qt_tensor **vals) {
  const qt_node *n = &g->nodes[node];
  int alias = -2; /* -2: a buffer of its own */
  for (int k = 0; k < n->n_inputs && alias == -2; k++)
    if (vals[n->inputs[k]] && y->data == vals[n->inputs[k]]->data) alias = p->root[n->inputs[k]];
  const int own = alias == -2 && y->data && qt_arena_owns(ctx, y->data);
  if (vals[v] != y) { /* forced */
    if (own) qt_tensor_free(ctx, y);
    return;
  }
  p->root[v] = alias != -2 ? alias : own ? v : -1;
  if (own) p->owner[v] = y;
  if (p->root[v] >= 0) p->refs[p->root[v]]++;
}

static void plan_dead(forward_plan *p, const qt_graph *g, qt_ctx *ctx, int v, qt_tensor **vals) {
  if (v == g->output || (p->keep && p->keep[v])) return;
  const int r = p->root[v];
  /* every consumer has run, and recorded what its backward reads */
  if (r >= 0 && vals[v]->saved) p->saved[r] = 1;
  vals[v] = NULL;
  if (r >= 0 && --p->refs[r] == 0 && !p->saved[r]) qt_tensor_free(ctx, p->owner[r]);
}

/* After node `node`: its inputs it was the last to read, and its output if nothing reads it. */
static void plan_after(forward_plan *p, const qt_graph *g, qt_ctx *ctx, int node, qt_tensor **vals) {
  const qt_node *n = &g->nodes[node];
  for (int k = 0; k < n->n_inputs; k++) {
    const int u = n->inputs[k];
    int seen = 0; /* add(x, x) reads x twice: dead once */
    for (int j = 0; j < k; j++) seen |= n->inputs[j] == u;
    if (!seen && p->last[u] == node && u != g->input) plan_dead(p, g, ctx, u, vals);
  }
  if (p->last[n->output] == node) plan_dead(p, g, ctx, n->output, vals);
}

/* Node fq_node's per-tensor fake quant as a fused op takes it, for a tensor of per_sample values
 * per sample (LSQ's gradient scale). */
static qt_pool_fake_quant fused_fake_quant(qt_graph *g, qt_ctx *ctx, int fq_node, int64_t per_sample) {
  qt_qstate *q = g->nodes[fq_node].q;
  return (qt_pool_fake_quant){
      q->scale_param >= 0 ? qt_lsq_scale(g, ctx, q) : NULL, q->scale, q->zero_point, q->spec.qmin, q->spec.qmax,
      1.0f / sqrtf((float)per_sample * (float)q->spec.qmax)};
}

/* conv2d(fq(x), w, b) for a convolution whose input's fake quant, node fq_node, it runs
 * (QT_FUSE_FQ_TO_CONV). */
static qt_tensor *conv_of_lsq_input(qt_graph *g, qt_ctx *ctx, int fq_node, qt_tensor *x, qt_tensor *w, qt_tensor *b,
                                    const qt_node_attrs *a) {
  qt_qstate *q = g->nodes[fq_node].q;
  const int64_t per_sample = qt_tensor_numel(x) / (x->shape[0] > 0 ? x->shape[0] : 1);
  return qt_conv2d_lsq_input(ctx, x, qt_lsq_scale(g, ctx, q), q->zero_point, q->spec.qmin, q->spec.qmax,
                             1.0f / sqrtf((float)per_sample * (float)q->spec.qmax), w, b, a->stride_h, a->stride_w,
                             a->pad_h, a->pad_w);
}

static float *running_mean(const qt_graph *g, const qt_node *n) {
  return g->buffers + g->tensors[n->buffer[QT_B_RUNNING_MEAN]].offset;
}

static float *running_var(const qt_graph *g, const qt_node *n) {
  return g->buffers + g->tensors[n->buffer[QT_B_RUNNING_VAR]].offset;
}

/* relu 1, relu6 2: the fused kernels' code for node relu. */
static int relu_code(const qt_graph *g, int relu) { return g->nodes[relu].op == QT_OP_RELU6 ? 2 : 1; }

/* The batch norm (or conv_bn's BN, of x / div when div is set) of node `node` with its relu, fake
 * quant and pool (m) as one op. */
static qt_tensor *bn_relu_pool(qt_graph *g, qt_ctx *ctx, int node, qt_tensor *x, qt_tensor *div, qt_tensor *gamma,
                               qt_tensor *beta, const qt_fuse_mark *m) {
  const qt_node *n = &g->nodes[node];
  qt_pool_fake_quant fq;
  if (m->fq >= 0) fq = fused_fake_quant(g, ctx, m->fq, qt_tensor_numel(x) / (x->shape[0] > 0 ? x->shape[0] : 1));
  return qt_batch_norm_relu_max_pool2d(ctx, x, div, gamma, beta, running_mean(g, n), running_var(g, n),
                                       n->attr.momentum, n->attr.eps, relu_code(g, m->relu), m->fq >= 0 ? &fq : NULL,
                                       g->nodes[m->pool].attr.kernel_h);
}

/* QT_FUSE_CONV1 of a conv2d: the image's convolution, its batch norm, relu and pool as one op. */
static qt_tensor *run_conv1(qt_graph *g, qt_ctx *ctx, int node, qt_tensor *x, const qt_fuse_mark *m) {
  const qt_node *n = &g->nodes[node], *b = &g->nodes[m->bn];
  const qt_node_attrs *a = &n->attr;
  return qt_conv1_bn_relu_max_pool2d(
      ctx, x, NULL, qt_param_tensor(g, ctx, n->param[QT_P_WEIGHT]), qt_param_tensor(g, ctx, n->param[QT_P_BIAS]), NULL,
      qt_param_tensor(g, ctx, b->param[QT_P_GAMMA]), qt_param_tensor(g, ctx, b->param[QT_P_BETA]), running_mean(g, b),
      running_var(g, b), b->attr.momentum, b->attr.eps, a->pad_h, a->pad_w, relu_code(g, m->relu), NULL,
      g->nodes[m->pool].attr.kernel_h, m->to_blocked);
}

/* QT_FUSE_CONV: a conv2d quantizing its input with fake quant m->lsq_input, or writing blocked. */
static qt_tensor *run_conv(qt_graph *g, qt_ctx *ctx, int node, qt_tensor *x, const qt_fuse_mark *m) {
  qt_node *n = &g->nodes[node];
  const qt_node_attrs *a = &n->attr;
  qt_tensor *wp = qt_param_tensor(g, ctx, n->param[QT_P_WEIGHT]), *bp = qt_param_tensor(g, ctx, n->param[QT_P_BIAS]);
  qt_tensor *w = qt_effective_weight(g, ctx, n, wp, g->error),
            *b = w ? qt_effective_bias(g, ctx, node, bp, g->error) : NULL;
  if (!w || (!b && bp)) return NULL;
  qt_tensor *y = m->lsq_input >= 0
                     ? conv_of_lsq_input(g, ctx, m->lsq_input, x, w, b, a)
                     : qt_conv2d_to_blocked(ctx, x, w, b, a->stride_h, a->stride_w, a->pad_h, a->pad_w, a->groups);
  qt_drop_unless(ctx, b, bp);
  qt_drop_unless(ctx, w, wp);
  return y;
}

/* QT_FUSE_BN_RELU: a batch norm with its relu. */
static qt_tensor *run_bn_relu(qt_graph *g, qt_ctx *ctx, int node, qt_tensor *x, const qt_fuse_mark *m) {
  const qt_node *n = &g->nodes[node];
  return qt_batch_norm_relu(ctx, x, qt_param_tensor(g, ctx, n->param[QT_P_GAMMA]),
                            qt_param_tensor(g, ctx, n->param[QT_P_BETA]), running_mean(g, n), running_var(g, n),
                            n->attr.momentum, n->attr.eps, g->nodes[m->relu].op == QT_OP_RELU6);
}

/* conv_bn's QT_FUSE_CONV1: the image's convolution with weight w (its LSQ fake quant too with
 * m->lsq_input), the division by sf, BN, relu, the activations' fake quant and the pool as one op. */
static qt_tensor *conv_bn_conv1(qt_graph *g, qt_ctx *ctx, int node, qt_tensor *x, qt_tensor *w, qt_tensor *sf,
                                qt_tensor *gamma, const qt_fuse_mark *m) {
  const qt_node *n = &g->nodes[node];
  const qt_node_attrs *a = &n->attr;
  const int64_t oh = x->shape[1] + 2 * a->pad_h - a->kernel_h + 1, ow = x->shape[2] + 2 * a->pad_w - a->kernel_w + 1;
  qt_pool_fake_quant xq, aq;
  if (m->lsq_input >= 0) xq = fused_fake_quant(g, ctx, m->lsq_input, x->shape[1] * x->shape[2]);
  if (m->fq >= 0) aq = fused_fake_quant(g, ctx, m->fq, oh * ow * a->out_channels);
  return qt_conv1_bn_relu_max_pool2d(ctx, x, m->lsq_input >= 0 ? &xq : NULL, w, NULL, sf, gamma,
                                     qt_param_tensor(g, ctx, n->param[QT_P_BN_BETA]), running_mean(g, n),
                                     running_var(g, n), a->momentum, a->eps, a->pad_h, a->pad_w, relu_code(g, m->relu),
                                     m->fq >= 0 ? &aq : NULL, g->nodes[m->pool].attr.kernel_h, m->to_blocked);
}

/* conv_bn's QT_FUSE_CONV_BN_TRAIN after its convolution t: BN of t / sf without the quotient in
 * memory (the same numbers; training mode: no bias rounding), with relu (and pool). */
static qt_tensor *conv_bn_train(qt_graph *g, qt_ctx *ctx, int node, qt_tensor *t, qt_tensor *sf, qt_tensor *gamma,
                                const qt_fuse_mark *m) {
  const qt_node *n = &g->nodes[node];
  qt_tensor *beta = qt_param_tensor(g, ctx, n->param[QT_P_BN_BETA]);
  if (m->pool >= 0) return bn_relu_pool(g, ctx, node, t, sf, gamma, beta, m);
  return qt_batch_norm_div(ctx, t, sf, gamma, beta, running_mean(g, n), running_var(g, n), !n->bn_frozen,
                           n->attr.momentum, n->attr.eps, m->relu < 0 ? 0 : relu_code(g, m->relu));
}

/* conv_bn after its convolution t without the training forward's fusions: t / sf (+ b), BN
 * (with its relu when fused: training mode), and in eval mode the int32 bias's rounding. */
static qt_tensor *conv_bn_unfused(qt_graph *g, qt_ctx *ctx, int node, qt_tensor *t, qt_tensor *sf, qt_tensor *gamma,
                                  const qt_fuse_mark *m) {
  const qt_node *n = &g->nodes[node];
  const qt_node_attrs *a = &n->attr;
  qt_tensor *y = qt_channel_scale(ctx, t, sf, 0, 1);
  qt_drop_unless(ctx, t, y);
  if (n->param[QT_P_BIAS] >= 0) {
    t = y;
    y = qt_channel_add(ctx, t, qt_param_tensor(g, ctx, n->param[QT_P_BIAS]));
    qt_drop_unless(ctx, t, y);
  }
  t = y;
  if (m->relu >= 0) { /* training mode: no bias rounding below */
    y = qt_batch_norm_relu(ctx, t, gamma, qt_param_tensor(g, ctx, n->param[QT_P_BN_BETA]), running_mean(g, n),
                           running_var(g, n), a->momentum, a->eps, g->nodes[m->relu].op == QT_OP_RELU6);
  } else {
    y = qt_batch_norm(ctx, t, gamma, qt_param_tensor(g, ctx, n->param[QT_P_BN_BETA]), running_mean(g, n),
                      running_var(g, n), n->training && !n->bn_frozen, a->momentum, a->eps, 0);
  }
  qt_drop_unless(ctx, t, y);
  int failed;
  qt_tensor *round = qt_conv_bn_bias_rounding(g, ctx, node, g->error, &failed);
  if (failed) return NULL;
  if (round) {
    t = y;
    y = qt_channel_add(ctx, t, round);
    qt_drop_unless(ctx, t, y);
  }
  return y;
}

/* conv_bn (docs/design.md: delayed folding): conv(x, fq(W * sf)) / sf (+ b), then a real BN. */
static qt_tensor *run_conv_bn(qt_graph *g, qt_ctx *ctx, int node, qt_tensor *x, const qt_fuse_mark *m) {
  qt_node *n = &g->nodes[node];
  const qt_node_attrs *a = &n->attr;
  qt_tensor *gamma = qt_param_tensor(g, ctx, n->param[QT_P_BN_GAMMA]);
  qt_tensor *sf = qt_bn_scale_factor(ctx, gamma, running_var(g, n), a->eps);
  qt_tensor *wp = qt_param_tensor(g, ctx, n->param[QT_P_WEIGHT]);
  qt_tensor *ws = qt_channel_scale(ctx, wp, sf, 1, 0);
  qt_tensor *w = qt_effective_weight(g, ctx, n, ws, g->error);
  if (!w) return NULL;
  qt_tensor *t;
  if (m->kind == QT_FUSE_CONV1)
    t = conv_bn_conv1(g, ctx, node, x, w, sf, gamma, m);
  else if (m->lsq_input >= 0)
    t = conv_of_lsq_input(g, ctx, m->lsq_input, x, w, NULL, a);
  else if (m->to_blocked)
    t = qt_conv2d_to_blocked(ctx, x, w, NULL, a->stride_h, a->stride_w, a->pad_h, a->pad_w, a->groups);
  else
    t = qt_conv2d(ctx, x, w, NULL, a->stride_h, a->stride_w, a->pad_h, a->pad_w, a->groups);
  qt_drop_unless(ctx, w, ws);
  qt_drop_unless(ctx, ws, wp);
  if (m->kind == QT_FUSE_CONV1) return t;
  if (m->kind == QT_FUSE_CONV_BN_TRAIN) return conv_bn_train(g, ctx, node, t, sf, gamma, m);
  return conv_bn_unfused(g, ctx, node, t, sf, gamma, m);
}

/* A fake quant node: observes (training mode, observer on, LSQ not yet initialized), then
 * quantizes alone, with its pool (QT_FUSE_FQ_POOL), or leaves x to the convolution that
 * quantizes it (QT_FUSE_FQ_TO_CONV). */
static qt_tensor *run_fake_quant(qt_graph *g, qt_ctx *ctx, int node, qt_tensor *x, const qt_fuse_mark *m) {
  qt_node *n = &g->nodes[node];
  qt_qstate *q = n->q;
  const int64_t numel = qt_tensor_numel(x), outer = numel / q->channels;
  if (n->training && q->observe && !qt_lsq_initialized(q)) {
    char err[QT_ERR_LEN];
    const double t0 = qt_ctx_profile(ctx) ? qt_now_seconds() : 0;
    /* activations: the whole batch's, when the batch is split across processes (weights
     * are the same on every process and need no synchronization) */
    if (qt_qstate_observe_sync(q, qt_f32(x), outer, 1, qt_ctx_batch_sync(ctx), err))
      return fail(g, "fake_quant %s: %s", n->name, err);
    if (q->scale_param >= 0) qt_lsq_init(g, q);
    if (qt_ctx_profile(ctx)) qt_profile_add_phase(qt_ctx_profile(ctx), QT_PROFILE_OBSERVER, qt_now_seconds() - t0);
  }
  if (!q->fake_quant) return x;
  if (!q->calibrated) return fail(g, "fake_quant %s: %s", n->name, "no qparams yet (observer never ran)");
  if (m->kind == QT_FUSE_FQ_TO_CONV) return x; /* the convolution quantizes it (conv_of_lsq_input) */
  const int pooled = m->kind == QT_FUSE_FQ_POOL, k = pooled ? g->nodes[m->pool].attr.kernel_h : 0;
  if (q->scale_param >= 0) {
    const int64_t per_sample = numel / (x->shape[0] > 0 ? x->shape[0] : 1);
    const float gf = 1.0f / sqrtf((float)per_sample * (float)q->spec.qmax);
    if (pooled)
      return qt_fake_quant_lsq_max_pool2d(ctx, x, qt_lsq_scale(g, ctx, q), q->zero_point, q->spec.qmin, q->spec.qmax,
                                          gf, k);
    return qt_fake_quant_lsq(ctx, x, outer, q->channels, 1, qt_lsq_scale(g, ctx, q), q->zero_point, q->spec.qmin,
                             q->spec.qmax, gf);
  }
  if (pooled) return qt_fake_quant_max_pool2d(ctx, x, q->scale, q->zero_point, q->spec.qmin, q->spec.qmax, k);
  return qt_fake_quant(ctx, x, outer, q->channels, 1, q->scale, q->zero_point, q->spec.qmin, q->spec.qmax);
}

static qt_tensor *run_quantize(qt_ctx *ctx, const qt_node *n, qt_tensor *x) {
  qt_qstate *q = n->q;
  const int64_t numel = qt_tensor_numel(x);
  qt_tensor *y = qt_tensor_new(ctx, QT_I32, x->ndim, x->shape);
  qt_quantize((int32_t *)y->data, qt_f32(x), numel / q->channels, q->channels, 1, q->scale, q->zero_point, q->spec.qmin,
              q->spec.qmax);
  return y;
}

static qt_tensor *run_dequantize(qt_ctx *ctx, const qt_node *n, qt_tensor *x) {
  qt_qstate *q = n->q;
  QT_ASSERT(x->dtype == QT_I32, "dequantize %s: input is %s", n->name, qt_dtype_name(x->dtype));
  const int64_t numel = qt_tensor_numel(x);
  qt_tensor *y = qt_tensor_new(ctx, QT_F32, x->ndim, x->shape);
  qt_dequantize(qt_f32(y), (const int32_t *)x->data, numel / q->channels, q->channels, 1, q->scale, q->zero_point);
  return y;
}

/* An fp32 op alone (qt_node_forward); relu, relu6 and batch norm in place where relu_inplace_ok. */
static qt_tensor *run_alone(qt_graph *g, qt_ctx *ctx, int node, qt_tensor **vals) {
  const qt_node *n = &g->nodes[node];
  qt_tensor *ins[QT_MAX_INPUTS];
  for (int k = 0; k < n->n_inputs; k++) ins[k] = vals[n->inputs[k]];
  const int inplace =
      (n->op == QT_OP_RELU || n->op == QT_OP_RELU6 || n->op == QT_OP_BATCH_NORM) && relu_inplace_ok(g, n->inputs[0]);
  return qt_node_forward(g, ctx, node, ins, inplace, g->error);
}

/* Node `node`'s output as its mark m says; NULL with g->error set on failure. */
static qt_tensor *run_node(qt_graph *g, qt_ctx *ctx, int node, qt_tensor **vals, const qt_fuse_mark *m) {
  const qt_node *n = &g->nodes[node];
  qt_tensor *x = n->n_inputs > 0 ? vals[n->inputs[0]] : NULL;
  switch (m->kind) {
    case QT_FUSE_DONE: /* its producer wrote this node's output */ return x;
    case QT_FUSE_CONV1: return n->op == QT_OP_CONV2D ? run_conv1(g, ctx, node, x, m) : run_conv_bn(g, ctx, node, x, m);
    case QT_FUSE_CONV: return run_conv(g, ctx, node, x, m);
    case QT_FUSE_BN_RELU_POOL:
      return bn_relu_pool(g, ctx, node, x, NULL, qt_param_tensor(g, ctx, n->param[QT_P_GAMMA]),
                          qt_param_tensor(g, ctx, n->param[QT_P_BETA]), m);
    case QT_FUSE_BN_RELU: return run_bn_relu(g, ctx, node, x, m);
    case QT_FUSE_NONE:
    case QT_FUSE_CONV_BN_TRAIN:
    case QT_FUSE_FQ_POOL:
    case QT_FUSE_FQ_TO_CONV: break;
  }
  switch (n->op) {
    case QT_OP_CONV_BN: return run_conv_bn(g, ctx, node, x, m);
    case QT_OP_FAKE_QUANT: return run_fake_quant(g, ctx, node, x, m);
    case QT_OP_QUANTIZE: return run_quantize(ctx, n, x);
    case QT_OP_DEQUANTIZE: return run_dequantize(ctx, n, x);
    case QT_OP_CONV2D:
    case QT_OP_LINEAR:
    case QT_OP_BATCH_NORM:
    case QT_OP_RELU:
    case QT_OP_RELU6:
    case QT_OP_MAX_POOL2D:
    case QT_OP_AVG_POOL2D:
    case QT_OP_GLOBAL_AVG_POOL:
    case QT_OP_FLATTEN:
    case QT_OP_ADD:
    case QT_OP_ACTIVATION:
    case QT_OP_MUL:
    case QT_OP_CONCAT:
    case QT_OP_CHANNEL_SHUFFLE:
    case QT_OP_CHANNEL_SLICE:
    case QT_OP_RESIZE:
    case QT_OP_LAYER_NORM:
    case QT_OP_ATTENTION:
    case QT_OP_ADD_PARAM:
    case QT_OP_PREPEND_TOKEN:
    case QT_OP_FIRST_TOKEN:
    case QT_OP_PRELU:
    case QT_OP_DROPOUT: return run_alone(g, ctx, node, vals);
    case QT_OP_INPUT:
    case QT_OP_COUNT: break;
  }
  return NULL;
}

static qt_tensor *graph_forward(qt_graph *g, qt_ctx *ctx, qt_tensor *input, qt_tensor ***values,
                                qt_tensor *const *force, int keep_all, const unsigned char *keep) {
  QT_ASSERT(g->finalized, "forward of graph %s before finalize", g->name);
  const qt_value *in = &g->values[g->input];
  if (!(input->ndim == 4 && input->shape[1] == in->shape[0] && input->shape[2] == in->shape[1] &&
        input->shape[3] == in->shape[2])) {
    snprintf(g->error, sizeof g->error, "graph %s: input of shape (%lld, %lld, %lld, %lld), want (N, %lld, %lld, %lld)",
             g->name, (long long)input->shape[0], (long long)input->shape[1], (long long)input->shape[2],
             (long long)input->shape[3], (long long)in->shape[0], (long long)in->shape[1], (long long)in->shape[2]);
    return NULL;
  }
  g->error[0] = 0;
  for (int i = 0; i < g->n_tensors; i++) g->tensors[i].tape_at = -1;
  qt_tensor **vals = qt_arena_calloc(ctx, (size_t)g->n_values * sizeof *vals);
  if (values) *values = vals;
  vals[g->input] = input;
  forward_plan plan;
  memset(&plan, 0, sizeof plan);
  const int planned = !keep_all && (!qt_ctx_grad_enabled(ctx) || qt_ctx_backward_frees(ctx));
  if (planned) plan_init(&plan, g, ctx, keep);
  const qt_fuse_mark *marks = qt_fuse_plan(g, ctx, input, force, keep, keep_all);
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    if (n->op == QT_OP_INPUT) continue;
    qt_tensor *y = run_node(g, ctx, i, vals, &marks[i]);
    QT_ASSERT(y || g->error[0], "graph %s: node %s has op %d with no executor", g->name, n->name, (int)n->op);
    if (!y) return NULL;
    vals[n->output] = force && force[n->output] ? force[n->output] : y;
    if (planned) {
      plan_produced(&plan, g, ctx, i, n->output, y, vals);
      plan_after(&plan, g, ctx, i, vals);
    }
  }
  return vals[g->output];
}

qt_tensor *qt_graph_forward(qt_graph *g, qt_ctx *ctx, qt_tensor *input) {
  return graph_forward(g, ctx, input, NULL, NULL, 0, NULL);
}

qt_tensor *qt_graph_forward_values(qt_graph *g, qt_ctx *ctx, qt_tensor *input, qt_tensor ***values) {
  return graph_forward(g, ctx, input, values, NULL, 1, NULL);
}

qt_tensor *qt_graph_forward_forced(qt_graph *g, qt_ctx *ctx, qt_tensor *input, qt_tensor ***values,
                                   qt_tensor *const *force) {
  return graph_forward(g, ctx, input, values, force, 1, NULL);
}

qt_tensor *qt_graph_forward_keep(qt_graph *g, qt_ctx *ctx, qt_tensor *input, qt_tensor ***values,
                                 qt_tensor *const *force, const unsigned char *keep) {
  return graph_forward(g, ctx, input, values, force, 0, keep);
}
