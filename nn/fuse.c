/* The executor's fusion pass: per forward call, which nodes run fused with their producer or
 * consumer, with which partners and in which layout (fuse.h). The decisions read the graph, the
 * call's mode and values (grad, forced and kept values) and, per value, the tensor the executor
 * will hold: its shape and whether it needs a gradient, as the ops compute it (an op's output
 * needs one when grad is on and an input or parameter it reads does). Nodes are planned in order,
 * each seeing what its producers' fusions left it. Each fused op gives the separate ops' bits or
 * says which sum it orders differently (docs/performance.md). */
#include "nn/fuse.h"
#include "nn/node.h"

#include <stdlib.h>
#include <string.h>

/* In the training forward (grad on, values not kept), a batch norm or conv_bn in training mode
 * whose only consumer is a relu or relu6 runs with it as one op (qt_batch_norm_relu: one pass
 * over memory each way instead of two, the same numbers): returns that relu node, else -1. The
 * batch norm's value then holds the relu's output, which only the relu (skipped) reads. */
static int relu_fused_after(const qt_graph *g, int node) {
  const qt_node *n = &g->nodes[node];
  if ((n->op != QT_OP_BATCH_NORM && n->op != QT_OP_CONV_BN) || !n->training || n->bn_frozen) return -1;
  const int j = qt_graph_sole_consumer(g, n->output);
  if (j < 0) return -1;
  return g->nodes[j].op == QT_OP_RELU || g->nodes[j].op == QT_OP_RELU6 ? j : -1;
}

/* In the training forward, a per-tensor fake quant whose only consumer is a max pool with windows
 * tiling its input (stride = kernel, no padding) runs with it as one op (LSQ:
 * qt_fake_quant_lsq_max_pool2d, its backward on the windows' argmax inputs only; fixed qparams:
 * qt_fake_quant_max_pool2d; the fake-quantized tensor is never in memory): returns that pool
 * node, else -1. The fake quant's value then holds the pool's output, which only the pool
 * (skipped) reads. */
static int pool_fused_after(const qt_graph *g, int node, const qt_tensor *x, qt_tensor *const *force,
                            const unsigned char *keep) {
  const qt_node *n = &g->nodes[node];
  const qt_qstate *q = n->q;
  if (n->op != QT_OP_FAKE_QUANT || !q || q->channels != 1 || x->ndim != 4) return -1;
  const int j = qt_graph_sole_consumer(g, n->output);
  if (j < 0 || g->nodes[j].op != QT_OP_MAX_POOL2D) return -1;
  const qt_node_attrs *a = &g->nodes[j].attr;
  const int k = a->kernel_h;
  if (a->stride_h != k || a->pad_h != 0 || x->shape[1] % k || x->shape[2] % k || x->shape[1] < k || x->shape[2] < k)
    return -1;
  if (keep && (keep[n->output] || keep[g->nodes[j].output])) return -1;
  if (force && (force[n->output] || force[g->nodes[j].output])) return -1;
  return j;
}

/* In the training forward, a per-tensor LSQ fake quant of a value that needs no gradient (the
 * image) whose only consumer is a conv2d or conv_bn with groups 1 and at most 4 input channels
 * runs inside that convolution (qt_conv2d_lsq_input: the scale's gradient without the
 * convolution's input gradient): returns the convolution node, else -1. The fake quant's value
 * is then its input, which only the convolution (given the fake quant's node) reads. */
static int conv_fused_after(const qt_graph *g, int node, const qt_tensor *x, qt_tensor *const *force,
                            const unsigned char *keep) {
  const qt_node *n = &g->nodes[node];
  const qt_qstate *q = n->q;
  if (n->op != QT_OP_FAKE_QUANT || !q || q->scale_param < 0 || q->channels != 1 || x->requires_grad || x->ndim != 4 ||
      x->shape[3] > 4)
    return -1;
  const int j = qt_graph_sole_consumer(g, n->output);
  if (j < 0 || (g->nodes[j].op != QT_OP_CONV2D && g->nodes[j].op != QT_OP_CONV_BN) || g->nodes[j].attr.groups != 1)
    return -1;
  if ((keep && keep[n->output]) || (force && force[n->output])) return -1;
  return j;
}

/* In the training forward, a batch norm (or conv_bn's) fused with its relu (relu_fused_after: relu
 * is that node), whose relu's only consumer is a max pool with windows tiling it (stride = kernel,
 * no padding), or a per-tensor fake quant that does not observe in this step and whose only
 * consumer is such a pool, runs with them as one op (qt_batch_norm_relu_max_pool2d: neither the
 * normalized, the relu'd nor the quantized tensor is ever in memory): returns the pool node and
 * sets *fq_node (-1: none), else -1. The batch norm's value then holds the pool's output, which
 * only the skipped nodes read. */
static int bn_pool_fused_after(const qt_graph *g, int relu, qt_tensor *const *force, const unsigned char *keep,
                               int *fq_node) {
  *fq_node = -1;
  const qt_value *v = &g->values[g->nodes[relu].output];
  int j = qt_graph_sole_consumer(g, g->nodes[relu].output);
  if (j < 0 || (keep && keep[g->nodes[relu].output]) || (force && force[g->nodes[relu].output])) return -1;
  if (g->nodes[j].op == QT_OP_FAKE_QUANT) {
    const qt_node *f = &g->nodes[j];
    const qt_qstate *q = f->q;
    if (!q || q->channels != 1 || !q->fake_quant || !q->calibrated ||
        (f->training && q->observe && !qt_lsq_initialized(q)))
      return -1;
    if ((keep && keep[f->output]) || (force && force[f->output])) return -1;
    *fq_node = j;
    j = qt_graph_sole_consumer(g, f->output);
    if (j < 0) return -1;
  }
  const qt_node *pn = &g->nodes[j];
  const qt_node_attrs *a = &pn->attr;
  const int k = a->kernel_h;
  if (pn->op != QT_OP_MAX_POOL2D || v->ndim != 3 || a->kernel_w != k || a->stride_h != k || a->stride_w != k ||
      a->pad_h != 0 || a->pad_w != 0 || v->shape[0] % k || v->shape[1] % k || v->shape[0] < k || v->shape[1] < k)
    return -1;
  if ((keep && keep[pn->output]) || (force && force[pn->output])) return -1;
  return j;
}

/* Whether node `node`'s convolution (conv2d or conv_bn: stride 1, groups 1) of x, a one-channel
 * value that needs no gradient (the image), followed by relu node `relu` and pool node `pool`,
 * has a shape qt_conv1_bn_relu_max_pool2d takes (under SyncBN too). */
static int conv1_pool_takes(const qt_graph *g, int node, const qt_tensor *x, int relu, int pool) {
  const qt_node_attrs *a = &g->nodes[node].attr;
  if (a->groups != 1 || a->stride_h != 1 || a->stride_w != 1 || !x || x->ndim != 4 || x->shape[3] != 1 ||
      x->requires_grad)
    return 0;
  return qt_conv1_bn_relu_max_pool2d_takes((int)x->shape[0], (int)x->shape[1], (int)x->shape[2], a->out_channels,
                                           a->kernel_h, a->kernel_w, a->pad_h, a->pad_w,
                                           g->nodes[relu].op == QT_OP_RELU6 ? 2 : 1, g->nodes[pool].attr.kernel_h);
}

/* In the training forward, a conv2d of the image (conv1_pool_takes) with plain weights (no fake
 * quant) whose only consumer is a training batch norm fused with its relu and a max pool
 * (bn_pool_fused_after, no fake quant between) runs with them as one op
 * (qt_conv1_bn_relu_max_pool2d: the convolution's output is never in memory): returns the pool
 * node and sets *bn and *relu, else -1. The convolution's value then holds the pool's output,
 * which only the skipped nodes read. (QAT's conv_bn takes the op in plan_conv_bn, with its
 * image's LSQ fake quant, sf and the activations' fake quant.) */
static int conv1_pool_fused_after(const qt_graph *g, int node, const qt_tensor *x, qt_tensor *const *force,
                                  const unsigned char *keep, int *bn, int *relu) {
  const qt_node *n = &g->nodes[node];
  if (n->op != QT_OP_CONV2D || n->wq) return -1;
  const int j = qt_graph_sole_consumer(g, n->output);
  if (j < 0 || g->nodes[j].op != QT_OP_BATCH_NORM) return -1;
  if ((keep && (keep[n->output] || keep[g->nodes[j].output])) ||
      (force && (force[n->output] || force[g->nodes[j].output])))
    return -1;
  const int r = relu_fused_after(g, j);
  int fq = -1;
  const int pool = r >= 0 ? bn_pool_fused_after(g, r, force, keep, &fq) : -1;
  if (pool < 0 || fq >= 0 || !conv1_pool_takes(g, node, x, r, pool)) return -1;
  *bn = j;
  *relu = r;
  return pool;
}

/* In the training forward, whether value v, an (H, W, C) activation of N samples a fused op writes, goes to
 * a convolution blocked (qt_conv1_bn_relu_max_pool2d's out_blocked): its sole consumer is a conv2d
 * or conv_bn node whose convolution takes it so in this step (qt_conv2d_takes_blocked: it reaches
 * the convolution unchanged, since a fake quant between would be that sole consumer), and the
 * value is neither kept nor forced. */
static int value_to_blocked_conv(const qt_graph *g, const qt_ctx *ctx, int v, int64_t N, qt_tensor *const *force,
                                 const unsigned char *keep) {
  const int j = qt_graph_sole_consumer(g, v);
  if (j < 0 || (keep && keep[v]) || (force && force[v]) || g->values[v].ndim != 3) return 0;
  const int64_t shape[4] = {N, g->values[v].shape[0], g->values[v].shape[1], g->values[v].shape[2]};
  const qt_node_attrs *a = &g->nodes[j].attr;
  if ((g->nodes[j].op != QT_OP_CONV2D && g->nodes[j].op != QT_OP_CONV_BN) || a->groups < 1 || shape[3] % a->groups)
    return 0;
  const int64_t w_shape[4] = {a->out_channels, shape[3] / a->groups, a->kernel_h, a->kernel_w};
  return qt_conv2d_takes_blocked(ctx, shape, w_shape, a->stride_h, a->stride_w, a->pad_h, a->pad_w, a->groups);
}

/* In the training forward, whether conv2d node `node`'s output goes blocked (qt_conv2d_to_blocked)
 * to the batch norm that is its sole consumer: that batch norm runs with its relu and pool as one
 * op (bn_pool_fused_after), which takes a blocked input of the convolution's channels
 * (qt_batch_norm_relu_max_pool2d_takes_blocked), and the value is neither kept nor forced. */
static int conv_to_bn_pool(const qt_graph *g, int node, qt_tensor *const *force, const unsigned char *keep) {
  const int v = g->nodes[node].output, j = qt_graph_sole_consumer(g, v);
  if (j < 0 || g->nodes[j].op != QT_OP_BATCH_NORM || (keep && keep[v]) || (force && force[v]) ||
      !qt_batch_norm_relu_max_pool2d_takes_blocked(g->nodes[node].attr.out_channels))
    return 0;
  const int r = relu_fused_after(g, j);
  int fq;
  return r >= 0 && bn_pool_fused_after(g, r, force, keep, &fq) >= 0;
}

typedef struct {
  const qt_graph *g;
  qt_ctx *ctx;
  qt_tensor *const *force;
  const unsigned char *keep;
  qt_tensor *view; /* per value: the executor's tensor for it (ndim, shape, requires_grad; no data) */
  qt_fuse_mark *m;
} fuse_pass;

/* Node `node` (when >= 0) is computed by a fused producer. */
static void mark_done(fuse_pass *p, int node) {
  if (node >= 0) p->m[node].kind = QT_FUSE_DONE;
}

static void plan_conv2d(fuse_pass *p, int node, const qt_tensor *x) {
  qt_fuse_mark *m = &p->m[node];
  if (m->lsq_input >= 0) {
    m->kind = QT_FUSE_CONV;
    return;
  }
  int bn = -1, relu = -1;
  const int pool = conv1_pool_fused_after(p->g, node, x, p->force, p->keep, &bn, &relu);
  if (pool >= 0) {
    m->kind = QT_FUSE_CONV1;
    m->bn = bn;
    m->relu = relu;
    m->pool = pool;
    m->to_blocked = value_to_blocked_conv(p->g, p->ctx, p->g->nodes[pool].output, x->shape[0], p->force, p->keep);
    mark_done(p, bn);
    mark_done(p, relu);
    mark_done(p, pool);
  } else if (conv_to_bn_pool(p->g, node, p->force, p->keep)) {
    m->kind = QT_FUSE_CONV;
    m->to_blocked = 1;
  }
}

static void plan_batch_norm(fuse_pass *p, int node) {
  qt_fuse_mark *m = &p->m[node];
  int fq = -1;
  const int relu = relu_fused_after(p->g, node);
  const int pool = relu >= 0 ? bn_pool_fused_after(p->g, relu, p->force, p->keep, &fq) : -1;
  if (relu < 0) return;
  m->kind = pool >= 0 ? QT_FUSE_BN_RELU_POOL : QT_FUSE_BN_RELU;
  m->relu = relu;
  mark_done(p, relu);
  if (pool < 0) return;
  m->fq = fq;
  m->pool = pool;
  mark_done(p, fq);
  mark_done(p, pool);
}

/* conv_bn: delayed folding's conv(x, fq(W * sf)) / sf (+ b), then a real BN; in the training
 * forward without a bias, the BN of conv / sf as one op, or the whole chain from the image's
 * convolution to the pool as one op. */
static void plan_conv_bn(fuse_pass *p, int node, const qt_tensor *x) {
  const qt_node *n = &p->g->nodes[node];
  qt_fuse_mark *m = &p->m[node];
  int fq = -1;
  const int relu = relu_fused_after(p->g, node);
  const int pool = relu >= 0 ? bn_pool_fused_after(p->g, relu, p->force, p->keep, &fq) : -1;
  const int train = n->training && n->param[QT_P_BIAS] < 0;
  m->relu = relu;
  mark_done(p, relu);
  if (!train) return;
  m->kind = QT_FUSE_CONV_BN_TRAIN;
  if (pool < 0) return;
  m->fq = fq;
  m->pool = pool;
  mark_done(p, fq);
  mark_done(p, pool);
  if (conv1_pool_takes(p->g, node, x, relu, pool)) {
    m->kind = QT_FUSE_CONV1;
    m->to_blocked = value_to_blocked_conv(p->g, p->ctx, p->g->nodes[pool].output, x->shape[0], p->force, p->keep);
  } else {
    m->to_blocked = m->lsq_input < 0 && qt_batch_norm_relu_max_pool2d_takes_blocked(n->attr.out_channels);
  }
}

static void plan_fake_quant(fuse_pass *p, int node, const qt_tensor *x) {
  const qt_qstate *q = p->g->nodes[node].q;
  qt_fuse_mark *m = &p->m[node];
  if (!q || !q->fake_quant) return; /* its value is its input */
  const int pool = pool_fused_after(p->g, node, x, p->force, p->keep);
  const int conv = pool < 0 && q->scale_param >= 0 ? conv_fused_after(p->g, node, x, p->force, p->keep) : -1;
  if (pool >= 0) {
    m->kind = QT_FUSE_FQ_POOL;
    m->pool = pool;
    mark_done(p, pool);
  } else if (conv >= 0) {
    m->kind = QT_FUSE_FQ_TO_CONV;
    m->conv = conv;
    p->m[conv].lsq_input = node;
  }
}

/* Whether node `node`'s output needs a gradient (grad on), from its inputs' views and its marks. */
static int output_needs_grad(const fuse_pass *p, int node) {
  const qt_node *n = &p->g->nodes[node];
  const qt_fuse_mark *m = &p->m[node];
  int in = 0;
  for (int k = 0; k < n->n_inputs; k++) in |= p->view[n->inputs[k]].requires_grad;
  if (m->kind == QT_FUSE_DONE || m->kind == QT_FUSE_FQ_TO_CONV) return p->view[n->inputs[0]].requires_grad;
  const qt_qstate *q = n->wq;
  switch (n->op) {
    case QT_OP_CONV2D:
    case QT_OP_LINEAR: /* a dequantized integer weight or bias is a constant, a parameter is not */
      return in || !(q && q->qweight) || (n->param[QT_P_BIAS] >= 0 && !(q && q->spec.bias_int32 && q->qbias)) ||
             m->lsq_input >= 0 || m->kind == QT_FUSE_CONV1;
    case QT_OP_BATCH_NORM:
    case QT_OP_CONV_BN: return 1;
    case QT_OP_FAKE_QUANT: return (n->q->fake_quant && n->q->scale_param >= 0) || in;
    case QT_OP_QUANTIZE:
    case QT_OP_DEQUANTIZE: return 0;
    default: return in;
  }
}

/* The view of node `node`'s output: the caller's tensor for the input and forced values, else
 * the value's shape behind its first input's batch. */
static void view_output(fuse_pass *p, int node, const qt_tensor *input) {
  const qt_node *n = &p->g->nodes[node];
  const qt_value *v = &p->g->values[n->output];
  qt_tensor *t = &p->view[n->output];
  const qt_tensor *src = n->op == QT_OP_INPUT ? input : p->force && p->force[n->output] ? p->force[n->output] : NULL;
  if (src) {
    t->ndim = src->ndim;
    memcpy(t->shape, src->shape, sizeof t->shape);
    t->requires_grad = src->requires_grad;
    return;
  }
  t->ndim = v->ndim + 1;
  t->shape[0] = n->n_inputs > 0 ? p->view[n->inputs[0]].shape[0] : 0;
  for (int d = 0; d < v->ndim; d++) t->shape[d + 1] = v->shape[d];
  t->requires_grad = output_needs_grad(p, node);
}

qt_fuse_mark *qt_fuse_plan(const qt_graph *g, qt_ctx *ctx, const qt_tensor *input, qt_tensor *const *force,
                           const unsigned char *keep, int keep_all) {
  qt_fuse_mark *m = qt_arena_alloc(ctx, (size_t)g->n_nodes * sizeof *m);
  for (int i = 0; i < g->n_nodes; i++) m[i] = (qt_fuse_mark){QT_FUSE_NONE, -1, -1, -1, -1, -1, -1, 0};
  if (keep_all || !qt_ctx_grad_enabled(ctx)) return m;
  fuse_pass p = {g, ctx, force, keep, calloc((size_t)g->n_values, sizeof(qt_tensor)), m};
  QT_ASSERT(p.view, "out of memory");
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    const qt_tensor *x = n->n_inputs > 0 ? &p.view[n->inputs[0]] : NULL;
    if (m[i].kind != QT_FUSE_DONE) {
      if (n->op == QT_OP_CONV2D)
        plan_conv2d(&p, i, x);
      else if (n->op == QT_OP_CONV_BN)
        plan_conv_bn(&p, i, x);
      else if (n->op == QT_OP_BATCH_NORM)
        plan_batch_norm(&p, i);
      else if (n->op == QT_OP_FAKE_QUANT)
        plan_fake_quant(&p, i, x);
    }
    view_output(&p, i, input);
  }
  free(p.view);
  return m;
}
