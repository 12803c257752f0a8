/* Constants and the small integer shape arithmetic that exporters write around a Reshape
 * (import_int.h): Constant, Shape, Gather, Unsqueeze, Expand, Cast, CastLike, Mod; Concat, Add,
 * Sub, Mul and Div of shapes (import_elementwise.c reads those ops); Sqrt and the arithmetic of
 * small float constants (an attention's scale from its head size); and the shape computations of
 * Squeeze and Reshape (import_ops.c reads those ops). They are evaluated
 * at import; none of them reaches the graph IR. */
#define _GNU_SOURCE /* struct hsearch_data in import_int.h */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx/import_int.h"

static sym *new_ints(imp *im, const int64_t *v, int n, int scalar) {
  sym *s = qt_imp_add_sym(im, im->node->output[0], S_INTS);
  s->n_ints = n;
  s->scalar = scalar;
  qt_imp_copy(s->ints, v, (size_t)n * sizeof *v);
  return s;
}

/* A float constant made at import (value_float(s), an Expand of a scalar), n values of v. */
static sym *new_floats(imp *im, const int64_t *dims, int n_dims, const float *v, int64_t n, int broadcast) {
  Onnx__TensorProto *t =
      qt_imp_new_tensor(im, im->node->output[0], ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, dims, (size_t)n_dims);
  float *out = (float *)t->raw_data.data;
  for (int64_t i = 0; i < n; i++) out[i] = broadcast ? v[0] : v[i];
  sym *s = qt_imp_add_sym(im, im->node->output[0], S_CONST);
  s->t = t;
  s->computed = 1;
  return s;
}

/* Constant: value (a tensor), value_int(s), value_float(s). */
static int op_constant(imp *im) {
  const Onnx__AttributeProto *a = im->node->n_attribute == 1 ? im->node->attribute[0] : NULL;
  const char *what = a ? str(a->name) : "";
  if (!a)
    return qt_imp_node_err(im, "%zu attributes; a Constant has one (value, value_int(s) or value_float(s))",
                           im->node->n_attribute);
  if (strcmp(what, "value") == 0 && a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR && a->t) {
    qt_imp_add_sym(im, im->node->output[0], S_CONST)->t = a->t;
    return 0;
  }
  if (strcmp(what, "value_int") == 0 && a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT)
    return new_ints(im, &a->i, 1, 1), 0;
  if (strcmp(what, "value_ints") == 0 && a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS) {
    if (a->n_ints > MAX_INTS)
      return qt_imp_node_err(im, "value_ints of %zu integers; at most %d are supported", a->n_ints, MAX_INTS);
    return new_ints(im, a->ints, (int)a->n_ints, 0), 0;
  }
  if (strcmp(what, "value_float") == 0 && a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT)
    return new_floats(im, NULL, 0, &a->f, 1, 0), 0;
  if (strcmp(what, "value_floats") == 0 && a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS) {
    const int64_t n = (int64_t)a->n_floats;
    if (n > ((int64_t)1 << 24)) return qt_imp_node_err(im, "value_floats of %lld values is too large", (long long)n);
    return new_floats(im, &n, 1, a->floats, n, 0), 0;
  }
  return qt_imp_node_err(im, "attribute '%s' (type %d) is not supported (value, value_int(s), value_float(s))", what,
                         (int)a->type);
}

/* ---- shape arithmetic (x.view(n, -1), torch 2.x's zero conv bias) ------------------------------ */

/* The shape of an activation (its batch as BATCH), of a constant, or of a shape computation. */
static int op_shape(imp *im) {
  sym *x = qt_imp_raw_input(im, 0);
  if (!(x && x->kind == S_NONE && x->attn) && !(x = qt_imp_input(im, 0, "data"))) return -1;
  int64_t start = 0, end = INT64_MAX;
  if (qt_imp_attr_int(im, "start", 0, &start) || qt_imp_attr_int(im, "end", INT64_MAX, &end)) return -1;
  int64_t full[MAX_INTS];
  int n;
  if (x->kind == S_NONE) {
    qt_imp_attn_shape(im, x, full, &n);
  } else if (x->kind == S_CONST) {
    if (x->t->n_dims > MAX_INTS) return qt_imp_node_err(im, "Shape of a constant of rank %zu", x->t->n_dims);
    n = (int)x->t->n_dims;
    qt_imp_copy(full, x->t->dims, (size_t)n * sizeof *full);
  } else if (x->kind == S_INTS) {
    n = x->scalar ? 0 : 1;
    full[0] = x->n_ints;
  } else if (!(x = qt_imp_act_input(im, 0, "data", 0))) {
    return -1;
  } else if (x->tokens) { /* [N, C, T], [N, T, C], [T, N, C] or [T * N, C] */
    const qt_value *v = val(im, x);
    const int64_t T = v->shape[0] * v->shape[1], C = v->shape[2];
    if (x->tokens == TOK_TNF)
      full[0] = batch_times(T), full[1] = C, n = 2;
    else if (x->tokens == TOK_TN)
      full[0] = T, full[1] = BATCH, full[2] = C, n = 3;
    else
      full[0] = BATCH, full[1] = x->tokens == TOK_CT ? C : T, full[2] = x->tokens == TOK_CT ? T : C, n = 3;
  } else if (val(im, x)->ndim == 3) {
    const qt_value *v = val(im, x);
    full[0] = BATCH, full[1] = v->shape[2], full[2] = v->shape[0], full[3] = v->shape[1], n = 4;
  } else {
    const qt_value *v = val(im, x);
    full[0] = BATCH, full[1] = v->shape[0], n = 2;
    if (x->pooled) full[2] = full[3] = 1, n = 4;
  }
  if (start < 0) start += n;
  if (end > n) end = n;
  if (end < 0) end += n;
  if (start < 0 || start > end)
    return qt_imp_node_err(im, "start %lld / end %lld out of range", (long long)start, (long long)end);
  sym *s = qt_imp_add_sym(im, im->node->output[0], S_INTS);
  s->n_ints = (int)(end - start);
  qt_imp_copy(s->ints, full + start, (size_t)s->n_ints * sizeof *s->ints);
  return 0;
}

static int op_gather(imp *im) {
  const int r = qt_imp_tokens_gather(im);
  if (r) return r < 0 ? -1 : 0;
  sym tmp_d, tmp_i;
  const sym *d = qt_imp_ints_input(im, 0, "data", &tmp_d);
  if (!d) return -1;
  sym saved_d = *d;
  const sym *ix = qt_imp_ints_input(im, 1, "indices", &tmp_i);
  if (!ix) return -1;
  int64_t axis = 0;
  if (qt_imp_attr_int(im, "axis", 0, &axis)) return -1;
  if (axis != 0 || saved_d.scalar) return qt_imp_node_err(im, "only Gather along axis 0 of a shape is supported");
  sym *s = qt_imp_add_sym(im, im->node->output[0], S_INTS);
  s->scalar = ix->scalar;
  s->n_ints = ix->n_ints;
  for (int i = 0; i < ix->n_ints; i++) {
    int64_t k = ix->ints[i];
    if (k < 0) k += saved_d.n_ints;
    if (k < 0 || k >= saved_d.n_ints) return qt_imp_node_err(im, "index %lld out of range", (long long)ix->ints[i]);
    s->ints[i] = saved_d.ints[k];
  }
  return 0;
}

/* Inputs 0 and 1 as small integer vectors (qt_imp_ints_input), copied out. */
static int two_ints(imp *im, const char *role0, const char *role1, sym *a, sym *b) {
  sym tmp;
  const sym *p = qt_imp_ints_input(im, 0, role0, &tmp);
  if (!p) return -1;
  *a = *p;
  if (!(p = qt_imp_ints_input(im, 1, role1, &tmp))) return -1;
  *b = *p;
  return 0;
}

/* Add, Sub, Mul, Div and Mod of shape computations (ShuffleNet's chunk: (channels + 1) / 2 * k),
 * element by element or by one integer; integer Div rounds toward zero, as ONNX's, and Mod takes
 * the divisor's sign (fmod 0). The batch takes part only in a product with a positive integer (a
 * batch multiple: the batch times the heads of an attention), and a Div or Mod by anything but a
 * positive integer is refused. */
int qt_imp_ints_arith(imp *im, char op) {
  sym sa, sb;
  if (two_ints(im, "A", "B", &sa, &sb)) return -1;
  const int n = sa.n_ints > sb.n_ints ? sa.n_ints : sb.n_ints;
  if ((sa.n_ints != n && sa.n_ints != 1) || (sb.n_ints != n && sb.n_ints != 1))
    return qt_imp_node_err(im, "shape computations of %d and %d entries do not broadcast", sa.n_ints, sb.n_ints);
  sym *s = qt_imp_add_sym(im, im->node->output[0], S_INTS);
  s->scalar = sa.scalar && sb.scalar;
  s->n_ints = n;
  for (int i = 0; i < n; i++) {
    const int64_t x = sa.ints[sa.n_ints == 1 ? 0 : i], y = sb.ints[sb.n_ints == 1 ? 0 : i];
    const int64_t bx = batch_factor(x), by = batch_factor(y);
    if (bx || by) {
      const int64_t k = bx ? bx : by, m = bx ? y : x;
      if (op != '*' || (bx && by) || m < 1 || m >= BATCH_MAX_FACTOR / k)
        return qt_imp_node_err(im,
                               "arithmetic on the batch dimension is supported only as its product with a "
                               "positive integer");
      s->ints[i] = batch_times(k * m);
      continue;
    }
    if ((x > ((int64_t)1 << 31) || x < -((int64_t)1 << 31)) || (y > ((int64_t)1 << 31) || y < -((int64_t)1 << 31)))
      return qt_imp_node_err(im, "shape entries %lld, %lld out of range", (long long)x, (long long)y);
    if ((op == '/' || op == '%') && y <= 0)
      return qt_imp_node_err(im, "%s of a shape by %lld (positive only)", op == '/' ? "Div" : "Mod", (long long)y);
    s->ints[i] = op == '+' ? x + y : op == '-' ? x - y : op == '*' ? x * y : op == '/' ? x / y : ((x % y) + y) % y;
  }
  return 0;
}

static int op_mod(imp *im) {
  int64_t fmod = 0;
  if (qt_imp_attr_int(im, "fmod", 0, &fmod)) return -1;
  if (fmod) return qt_imp_node_err(im, "Mod with fmod 1 is supported only on floats, which shapes are not");
  return qt_imp_ints_arith(im, '%');
}

/* ConstantOfShape of a short shape: its `value` (an integer, 0 when absent) repeated, as a shape
 * computation (torch's expand(n, -1, -1) writes one). */
static int op_constant_of_shape(imp *im) {
  sym tmp;
  const sym *shape = qt_imp_ints_input(im, 0, "input", &tmp);
  if (!shape) return -1;
  const sym sh = shape->scalar ? (sym){0} : *shape;
  const Onnx__AttributeProto *a = qt_imp_attr(im->node, "value");
  int64_t v = 0;
  if (a) {
    int64_t got[MAX_INTS];
    int n = 0, scalar = 0;
    if (a->type != ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR || !a->t ||
        a->t->data_type == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT || qt_imp_const_ints(im, a->t, got, &n, &scalar) ||
        n != 1)
      return qt_imp_node_err(im, "ConstantOfShape is supported only with an integer value (a shape computation)");
    v = got[0];
  }
  if (shape->scalar || sh.n_ints != 1 || sh.ints[0] < 0 || sh.ints[0] > MAX_INTS)
    return qt_imp_node_err(im, "ConstantOfShape is supported only of a 1-D shape of at most %d entries", MAX_INTS);
  int64_t out[MAX_INTS];
  for (int i = 0; i < (int)sh.ints[0]; i++) out[i] = v;
  new_ints(im, out, (int)sh.ints[0], 0);
  return 0;
}

/* Equal of shape computations, element by element: 1 or 0 (the batch equals only itself). */
static int op_equal(imp *im) {
  sym a, b;
  if (two_ints(im, "A", "B", &a, &b)) return -1;
  const int n = a.n_ints > b.n_ints ? a.n_ints : b.n_ints;
  if ((a.n_ints != n && a.n_ints != 1) || (b.n_ints != n && b.n_ints != 1))
    return qt_imp_node_err(im, "shape computations of %d and %d entries do not broadcast", a.n_ints, b.n_ints);
  int64_t out[MAX_INTS];
  for (int i = 0; i < n; i++) out[i] = a.ints[a.n_ints == 1 ? 0 : i] == b.ints[b.n_ints == 1 ? 0 : i];
  new_ints(im, out, n, a.scalar && b.scalar);
  return 0;
}

/* Where(condition, X, Y) of shape computations of one length. */
static int op_where(imp *im) {
  sym c, x, y, tmp;
  const sym *p = qt_imp_ints_input(im, 0, "condition", &tmp);
  if (!p) return -1;
  c = *p;
  if (!(p = qt_imp_ints_input(im, 1, "X", &tmp))) return -1;
  x = *p;
  if (!(p = qt_imp_ints_input(im, 2, "Y", &tmp))) return -1;
  y = *p;
  if (c.n_ints != x.n_ints || c.n_ints != y.n_ints)
    return qt_imp_node_err(im, "Where of shape computations of %d, %d and %d entries: only of one length", c.n_ints,
                           x.n_ints, y.n_ints);
  int64_t out[MAX_INTS];
  for (int i = 0; i < c.n_ints; i++) out[i] = c.ints[i] ? x.ints[i] : y.ints[i];
  new_ints(im, out, c.n_ints, c.scalar);
  return 0;
}

/* ---- small float constants (the attention's scale, 1 / sqrt(sqrt(head size)) each for q and k) -- */

#define MAX_FOLD 16 /* values of a float constant folded at import */

/* s as at most MAX_FOLD floats in v (*n of them); 0 when s is no such constant. */
static int small_floats(const sym *s, float *v, int64_t *n) {
  if (!s || s->kind != S_CONST || s->t->data_type != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT) return 0;
  const int64_t k = numel_of(s->t);
  if (k < 1 || k > MAX_FOLD ||
      (s->t->has_raw_data ? s->t->raw_data.len != (size_t)k * 4 : s->t->n_float_data != (size_t)k))
    return 0;
  qt_imp_float_data(s->t, v, k);
  *n = k;
  return 1;
}

int qt_imp_floats_arith(imp *im, char op) {
  float a[MAX_FOLD], b[MAX_FOLD], y[MAX_FOLD];
  int64_t na, nb;
  const sym *sa = qt_imp_raw_input(im, 0), *sb = qt_imp_raw_input(im, 1);
  if (!small_floats(sa, a, &na) || !small_floats(sb, b, &nb)) return 0;
  const sym *big = na >= nb ? sa : sb;
  const int64_t n = na > nb ? na : nb;
  if ((na != n && na != 1) || (nb != n && nb != 1))
    return qt_imp_node_err(im, "float constants of %lld and %lld values do not broadcast", (long long)na,
                           (long long)nb);
  for (int64_t i = 0; i < n; i++) {
    const float x = a[na == 1 ? 0 : i], z = b[nb == 1 ? 0 : i]; /* float32 arithmetic, as a runtime's */
    y[i] = op == '+' ? x + z : op == '-' ? x - z : op == '*' ? x * z : x / z;
  }
  new_floats(im, big->t->dims, (int)big->t->n_dims, y, n, 0);
  return 1;
}

/* Sqrt of a small float constant. */
static int op_sqrt(imp *im) {
  float v[MAX_FOLD];
  int64_t n;
  const sym *x = qt_imp_raw_input(im, 0);
  if (!small_floats(x, v, &n))
    return qt_imp_node_err(im,
                           "Sqrt is supported only of a float constant of at most %d values (an attention's "
                           "scale computed from its head size)",
                           MAX_FOLD);
  for (int64_t i = 0; i < n; i++) v[i] = sqrtf(v[i]);
  new_floats(im, x->t->dims, (int)x->t->n_dims, v, n, 0);
  return 0;
}

static int op_unsqueeze(imp *im) {
  const int r = qt_imp_tokens_unsqueeze(im);
  if (r) return r < 0 ? -1 : 0;
  sym tmp;
  const sym *d = qt_imp_ints_input(im, 0, "data", &tmp);
  if (!d) return -1;
  const sym saved = *d;
  int64_t axes[MAX_INTS];
  int n_axes = 0;
  if (qt_imp_axes(im, 1, axes, &n_axes)) return -1;
  if (!saved.scalar || n_axes != 1 || axes[0] != 0)
    return qt_imp_node_err(im, "only Unsqueeze of a scalar at axis 0 (a shape entry) is supported");
  sym *s = qt_imp_add_sym(im, im->node->output[0], S_INTS);
  *s = saved;
  s->name = im->node->output[0];
  s->scalar = 0;
  return 0;
}

int qt_imp_concat_ints(imp *im) {
  int64_t axis = 0;
  if (qt_imp_attr_int(im, "axis", 0, &axis)) return -1;
  if (axis != 0) return qt_imp_node_err(im, "only Concat of shapes (axis 0) is supported");
  int64_t v[MAX_INTS];
  int n = 0;
  for (size_t k = 0; k < im->node->n_input; k++) {
    sym tmp;
    const sym *p = qt_imp_ints_input(im, k, "input", &tmp);
    if (!p) return -1;
    if (p->scalar || n + p->n_ints > MAX_INTS)
      return qt_imp_node_err(im, "only Concat of short 1-D shapes is supported");
    qt_imp_copy(v + n, p->ints, (size_t)p->n_ints * sizeof *v);
    n += p->n_ints;
  }
  sym *s = qt_imp_add_sym(im, im->node->output[0], S_INTS);
  s->n_ints = n;
  qt_imp_copy(s->ints, v, (size_t)n * sizeof *v);
  return 0;
}

/* ---- the model ------------------------------------------------------------------------------- */

int qt_imp_squeeze_ints(imp *im, const int64_t *axes, int n_axes) {
  sym tmp;
  const sym *d = qt_imp_ints_input(im, 0, "data", &tmp);
  if (!d) return -1;
  if (d->scalar || d->n_ints != 1 || n_axes > 1 || (n_axes == 1 && axes[0] != 0 && axes[0] != -1))
    return qt_imp_node_err(im, "only Squeeze of a one-entry shape to a scalar is supported");
  new_ints(im, d->ints, 1, 1);
  return 0;
}

/* Reshape of a shape computation: to a vector ([-1] or [n]), or of one entry to a scalar ([]). */
int qt_imp_reshape_ints(imp *im) {
  sym data, shape_v;
  if (two_ints(im, "data", "shape", &data, &shape_v)) return -1;
  const sym *shape = &shape_v;
  const int n = data.scalar ? 1 : data.n_ints;
  const int vector = shape->n_ints == 1 && (shape->ints[0] == -1 || shape->ints[0] == n);
  if (!vector && !(shape->n_ints == 0 && n == 1))
    return qt_imp_node_err(im, "Reshape of a shape computation of %d entries: only to one dimension is supported", n);
  new_ints(im, data.ints, n, !vector);
  return 0;
}

/* Expand of a shape entry (1-D) or of a float scalar (a constant tensor of the given shape, such
 * as the zero bias torch 2.x writes for a Conv without one). */
static int op_expand(imp *im) {
  const int r = qt_imp_tokens_expand(im);
  if (r) return r < 0 ? -1 : 0;
  sym tmp_s, tmp_d;
  const sym *shape = qt_imp_ints_input(im, 1, "shape", &tmp_s);
  if (!shape) return -1;
  const sym sh = *shape;
  int64_t numel = 1;
  for (int i = 0; i < sh.n_ints; i++) {
    if (sh.ints[i] == BATCH) return qt_imp_node_err(im, "Expand to the batch dimension is not supported");
    if (sh.ints[i] < 1 || sh.ints[i] > ((int64_t)1 << 24) || numel * sh.ints[i] > ((int64_t)1 << 24))
      return qt_imp_node_err(im, "Expand to dimension %lld is not supported", (long long)sh.ints[i]);
    numel *= sh.ints[i];
  }
  sym *x = qt_imp_input(im, 0, "input");
  if (!x) return -1;
  if (x->kind == S_CONST && x->t->data_type == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT && numel_of(x->t) == 1) {
    float v;
    if (qt_imp_check_float_tensor(im, x->t, "input", 0, NULL)) return -1;
    qt_imp_float_data(x->t, &v, 1);
    new_floats(im, sh.ints, sh.n_ints, &v, numel, 1);
    return 0;
  }
  if (x->kind == S_ACT) return qt_imp_node_err(im, "Expand of an activation is not supported");
  const sym *d = qt_imp_ints_input(im, 0, "input", &tmp_d);
  if (!d) return -1;
  const int n = d->scalar ? 1 : d->n_ints;
  if (sh.n_ints > 1 || (sh.n_ints == 1 && n != 1 && n != sh.ints[0]) || numel > MAX_INTS)
    return qt_imp_node_err(im, "Expand of a shape computation of %d entries to %d dimensions is not supported", n,
                           sh.n_ints);
  int64_t v[MAX_INTS];
  const int out = sh.n_ints ? (int)sh.ints[0] : n;
  for (int i = 0; i < out; i++) v[i] = d->ints[n == 1 ? 0 : i];
  new_ints(im, v, out, sh.n_ints == 0 && d->scalar);
  return 0;
}

/* Cast and CastLike of a constant or a shape computation to its own kind: float stays float,
 * integers stay integers (the importer holds them as int64). */
static int cast_to(imp *im, int to) {
  sym *x = qt_imp_input(im, 0, "input");
  if (!x) return -1;
  const int is_float = to == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
  const int is_int = to == ONNX__TENSOR_PROTO__DATA_TYPE__INT64 || to == ONNX__TENSOR_PROTO__DATA_TYPE__INT32;
  const int x_float = x->kind == S_CONST && x->t->data_type == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
  const int x_int = x->kind == S_INTS || (x->kind == S_CONST && !x_float);
  if ((is_float && x_float) || (is_int && x_int)) {
    qt_imp_alias(im, 0, x);
    return 0;
  }
  if (is_float && x->kind == S_INTS) { /* a head's size as a float (its scale follows) */
    float v[MAX_INTS];
    for (int i = 0; i < x->n_ints; i++) {
      if (batch_factor(x->ints[i]) || x->ints[i] < -((int64_t)1 << 24) || x->ints[i] > ((int64_t)1 << 24))
        return qt_imp_node_err(im, "cast of the shape entry %s to float is not supported",
                               batch_factor(x->ints[i]) ? "of the batch" : "out of range");
      v[i] = (float)x->ints[i];
    }
    const int64_t d = x->n_ints;
    new_floats(im, &d, x->scalar ? 0 : 1, v, x->n_ints, 0);
    return 0;
  }
  return qt_imp_node_err(im,
                         "cast of '%s' (%s) to ONNX type %d: only constants and shape computations cast to their "
                         "own kind (float to float, integers to integers) and shapes to float are supported",
                         x->name, kind_text(x), to);
}

static int op_cast(imp *im) {
  int64_t to = 0;
  if (qt_imp_attr_int(im, "to", 0, &to)) return -1;
  return cast_to(im, (int)to);
}

static int op_cast_like(imp *im) {
  const sym *like = qt_imp_input(im, 1, "target_type");
  if (!like) return -1;
  const int to = like->kind == S_ACT    ? ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT
                 : like->kind == S_INTS ? ONNX__TENSOR_PROTO__DATA_TYPE__INT64
                                        : like->t->data_type;
  return cast_to(im, to);
}

const qt_imp_op qt_imp_shape_ops[] = {
    {"Constant", op_constant, 0, 0, 1, 1},
    {"Shape", op_shape, 1, 1, 1, 1},
    {"Gather", op_gather, 2, 2, 1, 1},
    {"Unsqueeze", op_unsqueeze, 1, 2, 1, 1},
    {"Expand", op_expand, 2, 2, 1, 1},
    {"Cast", op_cast, 1, 1, 1, 1},
    {"CastLike", op_cast_like, 2, 2, 1, 1},
    {"Mod", op_mod, 2, 2, 1, 1},
    {"Sqrt", op_sqrt, 1, 1, 1, 1},
    {"ConstantOfShape", op_constant_of_shape, 1, 1, 1, 1},
    {"Equal", op_equal, 2, 2, 1, 1},
    {"Where", op_where, 3, 3, 1, 1},
    {NULL, NULL, 0, 0, 0, 0},
};
