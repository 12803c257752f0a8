/* One node's computation (node.c), private to nn/: what the executor (exec.c) and
 * qt_node_forward share. */
#ifndef QT_NN_NODE_H
#define QT_NN_NODE_H

#include "nn/nn.h"

/* Tensor idx of the parameter slab as an arena tensor header (requires_grad, its gradient in the
 * gradient slab); NULL for idx < 0. */
qt_tensor *qt_param_tensor(qt_graph *g, qt_ctx *ctx, int idx);

/* LSQ: whether the learned scale is the source of truth (the observers no longer touch it). */
int qt_lsq_initialized(const qt_qstate *q);
/* LSQ: the observer's qparams initialize the learned scale. */
void qt_lsq_init(qt_graph *g, qt_qstate *q);
/* LSQ: the learned scale as a parameter tensor, clamped to >= FLT_EPSILON and mirrored into
 * q->scale. */
qt_tensor *qt_lsq_scale(qt_graph *g, qt_ctx *ctx, qt_qstate *q);

/* The weight conv/linear/conv_bn node n computes with, given its parameter (or conv_bn's scaled
 * weight) w; NULL with err set on failure. */
qt_tensor *qt_effective_weight(qt_graph *g, qt_ctx *ctx, qt_node *n, qt_tensor *w, char *err);
/* The bias node `node` computes with, given its parameter b; NULL with err set on failure (or
 * when b is NULL). */
qt_tensor *qt_effective_bias(qt_graph *g, qt_ctx *ctx, int node, qt_tensor *b, char *err);
/* conv_bn in eval mode with an int32 bias: per channel, what its folded bias loses to the int32
 * grid; NULL with nothing to add, or with *failed set and err on failure. */
qt_tensor *qt_conv_bn_bias_rounding(qt_graph *g, qt_ctx *ctx, int node, char *err, int *failed);
/* Without grad: hands a node's temporary `dead` back to the arena unless it is `keep` or lies in
 * keep's memory. */
void qt_drop_unless(qt_ctx *ctx, qt_tensor *dead, const qt_tensor *keep);

#endif
