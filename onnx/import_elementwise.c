/* The element-wise ONNX ops and those joining activations (import_int.h): Relu and Clip (ReLU, ReLU6), the activations
 * (Sigmoid, Tanh, HardSigmoid, HardSwish, LeakyRelu, Elu, Gelu), SiLU as x * Sigmoid(x), GELU as
 * torch exports it before opset 20 (x * (Erf(x / sqrt 2) + 1) * 0.5: Div, Erf, Add, Mul, Mul),
 * the residual Add of two activations, and Mul of two activations of one shape or of an image by
 * a per-channel vector (squeeze-excite: the vector is a global pool's [N, C, 1, 1] after its 1x1
 * convolutions), and Concat of activations along channels. */
#define _GNU_SOURCE /* struct hsearch_data in import_int.h */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx/import_int.h"

/* The output y (a builder result) of an element-wise op of x: bound with x's layout and pooling. */
static int bind_elementwise(imp *im, const sym *x, int y) {
  if (qt_imp_builder_check(im, y)) return -1;
  sym *s = qt_imp_bind_act(im, 0, y);
  s->pooled = x->pooled;
  s->perm_h = x->perm_h, s->perm_w = x->perm_w, s->perm_c = x->perm_c;
  s->tokens = x->tokens;
  return 0;
}

/* Relu, Clip(0, 6) -> relu6, Clip(0, inf) -> relu. */
static int op_relu(imp *im, int clip) {
  sym *x = qt_imp_act_input(im, 0, "X", 0);
  if (!x) return -1;
  int six = 0;
  if (clip) {
    float lo = -INFINITY, hi = INFINITY;
    int has_lo = 0, has_hi = 0;
    if (qt_imp_scalar_input(im, 1, "min", &lo, &has_lo) || qt_imp_scalar_input(im, 2, "max", &hi, &has_hi)) return -1;
    const Onnx__AttributeProto *a_lo = qt_imp_attr(im->node, "min"), *a_hi = qt_imp_attr(im->node, "max");
    if (a_lo) lo = a_lo->f, has_lo = 1;
    if (a_hi) hi = a_hi->f, has_hi = 1;
    if (!has_lo || lo != 0.0f || (has_hi && hi != 6.0f && hi != INFINITY))
      return qt_imp_node_err(im, "Clip(min %g, max %g) is not supported: only Clip(0, 6) (ReLU6) and Clip(0) (ReLU)",
                             has_lo ? (double)lo : -INFINITY, has_hi ? (double)hi : INFINITY);
    six = has_hi && hi == 6.0f;
  }
  char name[QT_NAME_LEN];
  qt_imp_node_name(im, NULL, name);
  return bind_elementwise(im, x, six ? qt_graph_relu6(im->g, name, x->value) : qt_graph_relu(im->g, name, x->value));
}

/* The element-wise activations (qt_activation): Sigmoid, Tanh, HardSigmoid (alpha 0.2, beta 0.5 by
 * default; PyTorch exports its own as 1/6, 1/2), HardSwish, LeakyRelu (alpha 0.01), Elu (alpha 1)
 * and Gelu (opset 20: approximate "none" or "tanh"). */
static int op_activation(imp *im, qt_act_kind kind) {
  sym *x = qt_imp_act_input(im, 0, "X", 0);
  if (!x) return -1;
  qt_act a = qt_act_default(kind);
  if (kind == QT_ACT_HARDSIGMOID &&
      (qt_imp_attr_float(im, "alpha", 0.2f, &a.alpha) || qt_imp_attr_float(im, "beta", 0.5f, &a.beta)))
    return -1;
  if ((kind == QT_ACT_LEAKY_RELU || kind == QT_ACT_ELU) &&
      qt_imp_attr_float(im, "alpha", kind == QT_ACT_ELU ? 1.0f : 0.01f, &a.alpha))
    return -1;
  if (kind == QT_ACT_GELU) {
    const Onnx__AttributeProto *ap = qt_imp_attr(im->node, "approximate");
    if (ap) {
      const size_t len = ap->s.len;
      if (len == 4 && memcmp(ap->s.data, "tanh", 4) == 0)
        a.kind = QT_ACT_GELU_TANH;
      else if (!(len == 4 && memcmp(ap->s.data, "none", 4) == 0))
        return qt_imp_node_err(im, "Gelu's approximate must be \"none\" or \"tanh\"");
    }
  }
  if (!isfinite(a.alpha) || !isfinite(a.beta))
    return qt_imp_node_err(im, "alpha %g, beta %g: not finite", (double)a.alpha, (double)a.beta);
  char name[QT_NAME_LEN];
  qt_imp_node_name(im, NULL, name);
  return bind_elementwise(im, x, qt_graph_activation(im->g, name, x->value, a));
}

/* ---- GELU as Div, Erf, Add, Mul, Mul --------------------------------------------------------- */

/* Each of the five nodes leaves its output pending (S_NONE, with x's value and layout and the
 * step reached in `gelu`); the last makes one gelu activation of x. A pending output read by any
 * other node is refused with what it is. */
static const char gelu_what[] = "a partial GELU (Div by sqrt 2, Erf, Add 1, Mul by x, Mul by 0.5)";

/* The current node's output as step `step` of the GELU of x (x's fields kept). */
static void gelu_pending(imp *im, const sym *x, int step) { qt_imp_pending(im, x, gelu_what)->gelu = step; }

/* Whether the current node (Div, Add or a Mul: two inputs) continues a GELU: one input is the
 * pending step `from` (for the Div: an activation, x), the other the constant c; for the Mul by x,
 * the other is x itself (c unused). 1 when it did, 0 when the node is no part of a GELU, -1 on an
 * error (a node that reads a pending step otherwise). */
static int gelu_step(imp *im, int from, float c, const char *op) {
  if (im->node->n_input != 2) return 0;
  for (int k = 0; k < 2; k++) {
    sym *p = qt_imp_raw_input(im, (size_t)k), *o = qt_imp_raw_input(im, (size_t)(1 - k));
    if (!p || !o || (from == 0 ? p->kind != S_ACT || p->padded : !(p->kind == S_NONE && p->gelu == from))) continue;
    if (from == 0 && k == 1) continue; /* x / c: x first */
    float v;
    if (from == 3) { /* (Erf(..) + 1) * x */
      if (o->kind != S_ACT || o->value != p->value)
        return qt_imp_node_err(im, "%s continues %s from '%s' but multiplies by '%s', not by the Div's input", op,
                               gelu_what, p->name, o->name);
      gelu_pending(im, o, 4);
      return 1;
    }
    if (!qt_imp_const_scalar(o, &v) || fabsf(v - c) > 1e-6f * c) {
      if (from == 0) return 0;
      return qt_imp_node_err(im, "%s continues %s of '%s' with '%s', not the constant %g", op, gelu_what, p->name,
                             o->name, (double)c);
    }
    if (from < 4) {
      gelu_pending(im, p, from + 1);
      return 1;
    }
    char name[QT_NAME_LEN];
    qt_imp_node_name(im, NULL, name);
    const int y = qt_graph_activation(im->g, name, p->value, qt_act_default(QT_ACT_GELU)); /* x's value */
    return bind_elementwise(im, p, y) ? -1 : 1;
  }
  return 0;
}

/* x op c of an activation x and a constant float scalar c: x * c, c * x, x + c, c + x and x - c (as
 * x + (-c)), c - x (as -x + c) become one `affine` activation, x / c one `div` (PyTorch's
 * arithmetic with a Python number). 1 when it did, 0 when the node is no such op, -1 on an error. */
static int const_arith(imp *im, char op) {
  if (im->node->n_input != 2) return 0;
  for (int k = 0; k < 2; k++) {
    const sym *xs = qt_imp_raw_input(im, (size_t)k), *cs = qt_imp_raw_input(im, (size_t)(1 - k));
    float c;
    if (!xs || xs->kind != S_ACT || !qt_imp_const_scalar(cs, &c)) continue;
    if (op == '/' && k == 1)
      return qt_imp_node_err(im,
                             "Div of the constant %g by '%s': only an activation divided by a constant is supported",
                             (double)c, xs->name);
    if (!isfinite(c) || (op == '/' && c == 0.0f))
      return qt_imp_node_err(im, "%s by the constant %g of '%s': the constant must be finite%s",
                             op == '/'   ? "Div"
                             : op == '*' ? "Mul"
                             : op == '+' ? "Add"
                                         : "Sub",
                             (double)c, cs->name, op == '/' ? " and not 0" : "");
    qt_act a = qt_act_default(op == '/' ? QT_ACT_DIV : QT_ACT_AFFINE);
    if (op == '*' || op == '/') a.alpha = c;
    if (op == '+') a.beta = c;
    if (op == '-') a.alpha = k ? -1.0f : 1.0f, a.beta = k ? c : -c;
    sym *x = qt_imp_act_input(im, (size_t)k, k ? "B" : "A", 0);
    if (!x) return -1;
    char name[QT_NAME_LEN];
    qt_imp_node_name(im, NULL, name);
    return bind_elementwise(im, x, qt_graph_activation(im->g, name, x->value, a)) ? -1 : 1;
  }
  return 0;
}

static int int_like(const sym *s) {
  return s && (s->kind == S_INTS || (s->kind == S_CONST && s->t->data_type != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT));
}

/* Whether the current binary op is shape arithmetic: its first input a shape computation, or both
 * integer (constants among them: torch's exporter adds two Constant nodes in x.unflatten). */
static int ints_operands(imp *im) {
  const sym *a = qt_imp_raw_input(im, 0), *b = qt_imp_raw_input(im, 1);
  return (a && a->kind == S_INTS) || (int_like(a) && int_like(b));
}

/* Div: x / sqrt 2, the start of a GELU, or shape arithmetic. */
static int op_div(imp *im) {
  if (ints_operands(im)) return qt_imp_ints_arith(im, '/');
  int r = qt_imp_floats_arith(im, '/');
  if (!r) r = gelu_step(im, 0, 1.41421356f, "Div");
  if (!r) r = qt_imp_tokens_scale(im, 1);
  if (!r) r = const_arith(im, '/');
  if (r) return r < 0 ? -1 : 0;
  return qt_imp_node_err(im,
                         "Div is supported only as an activation divided by a constant scalar, the x / sqrt(2) that "
                         "starts a GELU (%s) and the scaling of attention scores",
                         gelu_what);
}

/* Sub: shape arithmetic, or an activation and a constant scalar. */
static int op_sub(imp *im) {
  if (ints_operands(im)) return qt_imp_ints_arith(im, '-');
  int r = qt_imp_floats_arith(im, '-');
  if (!r) r = const_arith(im, '-');
  if (r) return r < 0 ? -1 : 0;
  return qt_imp_node_err(im, "Sub is supported only in shape computations and of an activation and a constant scalar");
}

static int op_erf(imp *im) {
  sym *p = qt_imp_raw_input(im, 0);
  if (p && p->kind == S_NONE && p->gelu == 1) {
    gelu_pending(im, p, 2);
    return 0;
  }
  return qt_imp_node_err(im, "Erf is supported only within a GELU (%s)", gelu_what);
}

/* ---- Add, Mul ------------------------------------------------------------------------------ */

/* The two inputs of an Add or Mul (op) as activations, or -1 with what is supported. */
static int two_activations(imp *im, const char *op, const char *supported, sym **a, sym **b) {
  if (!(*a = qt_imp_input(im, 0, "A")) || !(*b = qt_imp_input(im, 1, "B"))) return -1;
  if ((*a)->kind != S_ACT || (*b)->kind != S_ACT)
    return qt_imp_node_err(im, "%s of '%s' (%s) and '%s' (%s): only %s", op, (*a)->name, kind_text(*a), (*b)->name,
                           kind_text(*b), supported);
  return (*a = qt_imp_act_input(im, 0, "A", 0)) && (*b = qt_imp_act_input(im, 1, "B", 0)) ? 0 : -1;
}

static int op_add(imp *im) {
  if (ints_operands(im)) return qt_imp_ints_arith(im, '+');
  int r = qt_imp_floats_arith(im, '+');
  if (!r) r = gelu_step(im, 2, 1.0f, "Add");
  if (!r) r = const_arith(im, '+');
  if (!r) r = qt_imp_tokens_add(im);
  if (r) return r < 0 ? -1 : 0;
  sym *a, *b;
  if (two_activations(im, "Add",
                      "the residual Add of two activations, the Add of an activation and a constant scalar, and the "
                      "bias Add right after a MatMul, are supported",
                      &a, &b))
    return -1;
  if (a->perm_c != b->perm_c || a->perm_h != b->perm_h || a->perm_w != b->perm_w || a->pooled != b->pooled ||
      a->tokens != b->tokens)
    return qt_imp_node_err(im, "Add of '%s' and '%s', laid out differently in the graph IR", a->name, b->name);
  const qt_value *va = val(im, a), *vb = val(im, b);
  int same = va->ndim == vb->ndim;
  for (int d = 0; same && d < va->ndim; d++) same = va->shape[d] == vb->shape[d];
  if (!same)
    return qt_imp_node_err(im, "Add of '%s' and '%s' of different shapes (broadcasting is not supported)", a->name,
                           b->name);
  char name[QT_NAME_LEN];
  qt_imp_node_name(im, NULL, name);
  return bind_elementwise(im, a, qt_graph_add(im->g, name, a->value, b->value));
}

/* Mul: shape arithmetic, a step of a GELU, or a * b of two activations of one shape and layout, or an image scaled
 * by a per-channel vector (a global pool's [N, C, 1, 1]), either way round. */
static int op_mul(imp *im) {
  if (ints_operands(im)) return qt_imp_ints_arith(im, '*');
  int r = qt_imp_floats_arith(im, '*');
  if (!r) r = gelu_step(im, 3, 0.0f, "Mul");
  if (!r) r = gelu_step(im, 4, 0.5f, "Mul");
  if (!r) r = qt_imp_tokens_scale(im, 0);
  if (!r) r = const_arith(im, '*');
  if (r) return r < 0 ? -1 : 0;
  sym *a, *b;
  if (two_activations(im, "Mul", "Mul of two activations, or of an activation and a constant scalar, is supported", &a,
                      &b))
    return -1;
  if (b->pooled && is_image(im, a)) {
  } else if (a->pooled && is_image(im, b)) {
    sym *t = a;
    a = b, b = t;
  } else if (a->perm_c != b->perm_c || a->perm_h != b->perm_h || a->perm_w != b->perm_w || a->pooled != b->pooled ||
             a->tokens != b->tokens) {
    return qt_imp_node_err(im, "Mul of '%s' and '%s', laid out differently in the graph IR", a->name, b->name);
  }
  const qt_value *va = val(im, a), *vb = val(im, b);
  int same = va->ndim == vb->ndim;
  for (int d = 0; same && d < va->ndim; d++) same = va->shape[d] == vb->shape[d];
  if (!same && !(b->pooled && vb->shape[0] == va->shape[va->ndim - 1]))
    return qt_imp_node_err(im,
                           "Mul of '%s' and '%s': shapes neither equal nor an image and a [N, C, 1, 1] of its "
                           "channels",
                           a->name, b->name);
  char name[QT_NAME_LEN];
  qt_imp_node_name(im, NULL, name);
  return bind_elementwise(im, a, qt_graph_mul(im->g, name, a->value, b->value));
}

/* Sigmoid; with the Mul right after it taking its input and its output, x * Sigmoid(x) as one SiLU
 * (how torch exports nn.SiLU): the Mul is absorbed, and the Sigmoid's own output may have no other
 * reader (it is refused by name if one reads it). */
static int f_sigmoid(imp *im) {
  const int next = im->node_index + 1;
  const Onnx__NodeProto *n = im->node, *m = next < (int)im->gp->n_node ? im->gp->node[next] : NULL;
  if (!m || strcmp(str(m->op_type), "Mul") != 0 || m->n_input != 2 || !n->input[0] || !m->input[0] || !m->input[1])
    return op_activation(im, QT_ACT_SIGMOID);
  const char *x = n->input[0], *sg = n->output[0];
  if (!((strcmp(m->input[0], x) == 0 && strcmp(m->input[1], sg) == 0) ||
        (strcmp(m->input[1], x) == 0 && strcmp(m->input[0], sg) == 0)))
    return op_activation(im, QT_ACT_SIGMOID);
  if (op_activation(im, QT_ACT_SILU)) return -1;
  const sym y = im->syms[im->n_syms - 1]; /* the SiLU's value, bound to the Sigmoid's output */
  im->syms[im->n_syms - 1].kind = S_NONE;
  im->syms[im->n_syms - 1].what = "a Sigmoid folded into the SiLU x * Sigmoid(x)";
  sym *s = qt_imp_add_sym(im, m->output[0], S_ACT);
  const char *name = s->name;
  *s = y;
  s->name = name;
  im->absorbed[next] = 1;
  im->info->folded++;
  return 0;
}

/* PRelu of an activation by a learned slope: one shared slope ([1], nn.PReLU()), or one per channel
 * ([C, 1, 1] of an image, as torch exports nn.PReLU(C); [C]); the node is named after the slope's
 * module. */
static int op_prelu(imp *im) {
  sym *x = qt_imp_act_input(im, 0, "X", 0);
  if (!x) return -1;
  const Onnx__TensorProto *t = qt_imp_param_input(im, 1, "slope", 0);
  if (!t || qt_imp_check_float_tensor(im, t, "slope", (int)t->n_dims, NULL)) return -1;
  const qt_value *v = val(im, x);
  const int64_t C = v->shape[v->ndim - 1];
  int64_t numel = 1;
  for (size_t d = 0; d < t->n_dims; d++) numel *= t->dims[d];
  const int per_channel =
      numel == C && numel > 1 &&
      (t->n_dims == 1 || (t->n_dims == 3 && t->dims[1] == 1 && t->dims[2] == 1 && (is_image(im, x) || x->pooled)));
  if (numel != 1 && !per_channel) {
    char d[96];
    qt_imp_dims_str(t->dims, t->n_dims, d, sizeof d);
    return qt_imp_node_err(im,
                           "PRelu of '%s' (%lld channels) with the slope '%s' %s: one slope ([1]) or one per channel "
                           "([C, 1, 1] or [C]) is supported",
                           x->name, (long long)C, str(t->name), d);
  }
  if (per_channel && x->perm_c)
    return qt_imp_node_err(im, "PRelu with one slope per channel of a flattened image '%s'", x->name);
  char name[QT_NAME_LEN];
  qt_imp_node_name(im, str(t->name), name);
  const int y = qt_graph_prelu(im->g, name, x->value, (int)numel);
  if (bind_elementwise(im, x, y)) return -1;
  qt_imp_add_copy(im, im->g->nodes[node_of(im, y)].param[QT_P_WEIGHT], t, COPY_AS_IS, NULL);
  return 0;
}

/* Concat of 2 to QT_MAX_INPUTS activations along channels (images, axis 1) or features (flat
 * tensors and pooled vectors, axis 1), all laid out alike. */
static int concat_act(imp *im) {
  const int n = (int)im->node->n_input;
  if (n < 2 || n > QT_MAX_INPUTS)
    return qt_imp_node_err(im, "Concat of %d activations; 2 to %d are supported", n, QT_MAX_INPUTS);
  int64_t axis;
  if (qt_imp_attr_int(im, "axis", 0, &axis)) return -1;
  sym *x[QT_MAX_INPUTS] = {0};
  int ids[QT_MAX_INPUTS];
  for (int k = 0; k < n; k++) {
    if (!(x[k] = qt_imp_act_input(im, (size_t)k, "input", 0))) return -1;
    ids[k] = x[k]->value;
    if (x[k]->perm_c || x[k]->pooled != x[0]->pooled || is_image(im, x[k]) != is_image(im, x[0]))
      return qt_imp_node_err(im, "Concat of '%s' and '%s', laid out differently in the graph IR", x[0]->name,
                             x[k]->name);
  }
  const int rank = is_image(im, x[0]) || x[0]->pooled ? 4 : 2;
  if (axis != 1 && axis != 1 - rank)
    return qt_imp_node_err(im,
                           "Concat along axis %lld; only along channels (axis 1 of [N, C, H, W]) or features "
                           "(axis 1 of [N, F]) is supported",
                           (long long)axis);
  char name[QT_NAME_LEN];
  qt_imp_node_name(im, NULL, name);
  return bind_elementwise(im, x[0], qt_graph_concat(im->g, name, ids, n));
}

/* Concat of activations, or of shape computations (import_shape.c). */
static int op_concat(imp *im) {
  const int r = qt_imp_tokens_concat(im);
  if (r) return r < 0 ? -1 : 0;
  const sym *first = qt_imp_raw_input(im, 0);
  return first && first->kind == S_ACT ? concat_act(im) : qt_imp_concat_ints(im);
}

static int f_tanh(imp *im) { return op_activation(im, QT_ACT_TANH); }
static int f_hardsigmoid(imp *im) { return op_activation(im, QT_ACT_HARDSIGMOID); }
static int f_hardswish(imp *im) { return op_activation(im, QT_ACT_HARDSWISH); }
static int f_leaky_relu(imp *im) { return op_activation(im, QT_ACT_LEAKY_RELU); }
static int f_elu(imp *im) { return op_activation(im, QT_ACT_ELU); }
static int f_gelu(imp *im) { return op_activation(im, QT_ACT_GELU); }
static int f_relu(imp *im) { return op_relu(im, 0); }
static int f_clip(imp *im) { return op_relu(im, 1); }

const qt_imp_op qt_imp_elementwise_ops[] = {
    {"Relu", f_relu, 1, 1, 1, 1},
    {"Clip", f_clip, 1, 3, 1, 1},
    {"Sigmoid", f_sigmoid, 1, 1, 1, 1},
    {"Tanh", f_tanh, 1, 1, 1, 1},
    {"HardSigmoid", f_hardsigmoid, 1, 1, 1, 1},
    {"HardSwish", f_hardswish, 1, 1, 1, 1},
    {"LeakyRelu", f_leaky_relu, 1, 1, 1, 1},
    {"Elu", f_elu, 1, 1, 1, 1},
    {"Gelu", f_gelu, 1, 1, 1, 1},
    {"Div", op_div, 2, 2, 1, 1},
    {"Erf", op_erf, 1, 1, 1, 1},
    {"Sub", op_sub, 2, 2, 1, 1},
    {"Add", op_add, 2, 2, 1, 1},
    {"Mul", op_mul, 2, 2, 1, 1},
    {"Concat", op_concat, 1, MAX_INTS, 1, 1},
    {"PRelu", op_prelu, 2, 2, 1, 1},
    {NULL, NULL, 0, 0, 0, 0},
};
