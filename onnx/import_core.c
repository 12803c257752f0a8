/* The ONNX importer's common parts (import_int.h): messages, symbols, attributes, tensors, IR
 * node names and the builder helpers every op uses. */
#define _GNU_SOURCE /* hsearch_r: glibc's reentrant hash tables */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx/import_int.h"

/* ---- messages -------------------------------------------------------------------------------- */

static const char *node_label(const Onnx__NodeProto *n, int index, char *buf, size_t len) {
  if (n->name && n->name[0]) return n->name;
  snprintf(buf, len, "#%d", index);
  return buf;
}

/* A message's control characters (a name from the file may hold terminal escapes) as \xNN. */
static int escaped(char *err) {
  char out[QT_ERR_LEN];
  size_t k = 0;
  for (const unsigned char *p = (const unsigned char *)err; *p && k + 5 < sizeof out; p++) {
    if (*p < 0x20 || *p == 0x7f)
      k += (size_t)snprintf(out + k, sizeof out - k, "\\x%02x", *p);
    else
      out[k++] = (char)*p;
  }
  out[k] = 0;
  memcpy(err, out, k + 1);
  return -1;
}

int qt_imp_node_err(imp *im, const char *fmt, ...) {
  char what[QT_ERR_LEN], label[32];
  QT_VFORMAT(what, fmt);
  const Onnx__NodeProto *n = im->node;
  qt_err(im->err, "onnx: %s: node '%s' (%s, opset %lld): %s", im->path,
         node_label(n, im->node_index, label, sizeof label), str(n->op_type), (long long)im->opset, what);
  return escaped(im->err);
}

int qt_imp_file_err(imp *im, const char *fmt, ...) {
  char what[QT_ERR_LEN];
  QT_VFORMAT(what, fmt);
  qt_err(im->err, "onnx: %s: %s", im->path, what);
  return escaped(im->err);
}

void qt_imp_dims_str(const int64_t *d, size_t n, char *buf, size_t len) {
  size_t k = (size_t)snprintf(buf, len, "[");
  for (size_t i = 0; i < n && k < len; i++)
    k += (size_t)snprintf(buf + k, len - k, "%s%lld", i ? ", " : "", (long long)d[i]);
  if (k < len) snprintf(buf + k, len - k, "]");
}

void qt_imp_ints_str(const int64_t *s, int n, char *buf, size_t len) {
  size_t k = (size_t)snprintf(buf, len, "[");
  for (int i = 0; i < n && k < len; i++) {
    const int64_t b = batch_factor(s[i]);
    k += (size_t)(b == 1  ? snprintf(buf + k, len - k, "%sbatch", i ? ", " : "")
                  : b > 1 ? snprintf(buf + k, len - k, "%sbatch * %lld", i ? ", " : "", (long long)b)
                          : snprintf(buf + k, len - k, "%s%lld", i ? ", " : "", (long long)s[i]));
  }
  if (k < len) snprintf(buf + k, len - k, "]");
}

/* ---- symbols --------------------------------------------------------------------------------- */

/* Symbols are found through a hash (glibc's hsearch_r), so that import is linear in the model's
 * size: the latest symbol of a name. */
sym *qt_imp_find(imp *im, const char *name) {
  ENTRY want = {.key = (char *)name}, *got = NULL;
  if (!hsearch_r(want, FIND, &got, &im->sym_index)) return NULL;
  return &im->syms[(intptr_t)got->data - 1];
}

/* The table is allocated once for every name the model can define (import_graph), so symbol
 * pointers stay valid while nodes add symbols. A later symbol of a name hides the earlier one. */
sym *qt_imp_add_sym(imp *im, const char *name, sym_kind kind) {
  QT_ASSERT(im->n_syms < im->cap_syms, "onnx import: symbol table of %d entries is full", im->cap_syms);
  sym *s = &im->syms[im->n_syms++];
  memset(s, 0, sizeof *s);
  s->name = name;
  s->kind = kind;
  s->value = -1;
  ENTRY e = {.key = (char *)name, .data = (void *)(intptr_t)im->n_syms}, *got = NULL;
  QT_ASSERT(hsearch_r(e, ENTER, &got, &im->sym_index), "onnx import: symbol index full");
  got->data = e.data;
  return s;
}

/* The next_suffix entry of a taken name (made with k = 2 the first time): where the last
 * search for a free "<name>_k" stopped, so that n nodes of one name cost O(n), not O(n^2).
 * Whether a name is taken, the graph's own index answers (qt_graph_find_node). */
static ENTRY *next_suffix(imp *im, const char *name) {
  ENTRY want = {.key = (char *)name}, *got = NULL;
  if (hsearch_r(want, FIND, &got, &im->next_suffix)) return got;
  if (im->n_suffix_keys == im->cap_suffix_keys) {
    im->cap_suffix_keys = im->cap_suffix_keys ? 2 * im->cap_suffix_keys : 256;
    im->suffix_keys = realloc(im->suffix_keys, (size_t)im->cap_suffix_keys * sizeof *im->suffix_keys);
    QT_ASSERT(im->suffix_keys, "out of memory");
  }
  char *key = strdup(name);
  QT_ASSERT(key, "out of memory");
  im->suffix_keys[im->n_suffix_keys++] = key;
  ENTRY e = {.key = key, .data = (void *)(intptr_t)2};
  QT_ASSERT(hsearch_r(e, ENTER, &got, &im->next_suffix), "onnx import: node name index full");
  return got;
}

/* Input k of the current node, which must exist (role names it in messages). */
sym *qt_imp_input(imp *im, size_t k, const char *role) {
  const char *name = in_name(im->node, k);
  if (!name) return qt_imp_node_err(im, "input %zu (%s) is missing", k, role), NULL;
  sym *s = qt_imp_find(im, name);
  if (!s)
    return qt_imp_node_err(
               im,
               "input %zu (%s) '%s' is neither the graph input, an initializer nor an earlier node's output "
               "(a missing initializer?)",
               k, role, name),
           NULL;
  if (s->kind == S_NONE)
    return qt_imp_node_err(im, "input %zu (%s) '%s' is %s, which is not supported", k, role, name, s->what), NULL;
  return s;
}

/* Whether the current op may read s: tokens (an image standing for [N, C, T] or [N, T, C],
 * import_tokens.c) only by the ops that take them as such. */
static int tokens_reader_ok(const imp *im, const sym *s) {
  static const char *const tc[] = {"Add",       "Mul",       "Div",       "LayerNormalization",
                                   "MatMul",    "Reshape",   "Transpose", "ReduceMean",
                                   "Shape",     "Identity",  "Dropout",   "Relu",
                                   "Clip",      "Sigmoid",   "Tanh",      "HardSigmoid",
                                   "HardSwish", "LeakyRelu", "Elu",       "Gelu",
                                   "Erf",       "Gather",    "Concat",    NULL};
  static const char *const ct[] = {"Transpose", "Shape", "Identity", "Dropout", NULL};
  static const char *const tn[] = {"Transpose", "MatMul", "Reshape", "Shape", "Identity", "Dropout", NULL};
  static const char *const tnf[] = {"Gemm", "MatMul", "Reshape", "Shape", "Identity", "Dropout", NULL};
  if (s->kind != S_ACT || !s->tokens) return 1;
  const char *const *ops = s->tokens == TOK_TC ? tc : s->tokens == TOK_CT ? ct : s->tokens == TOK_TN ? tn : tnf;
  for (const char *const *op = ops; *op; op++)
    if (strcmp(str(im->node->op_type), *op) == 0) return 1;
  return 0;
}

/* An activation input (a pending Pad only where allow_pad). */
sym *qt_imp_act_input(imp *im, size_t k, const char *role, int allow_pad) {
  sym *s = qt_imp_input(im, k, role);
  if (!s) return NULL;
  if (s->kind != S_ACT)
    return qt_imp_node_err(im, "input %zu (%s) '%s' is %s, expected an activation computed from the graph input", k,
                           role, s->name, kind_text(s)),
           NULL;
  if (!tokens_reader_ok(im, s))
    return qt_imp_node_err(im,
                           "input '%s' stands for %s; only element-wise ops, Add, LayerNormalization, MatMul, "
                           "ReduceMean over the tokens, multi-head attention's Reshape / Transpose and Shape read "
                           "tokens (sequence first: Transpose, MatMul, Gemm, Reshape, Shape)",
                           s->name,
                           s->tokens == TOK_TC   ? "tokens [N, T, C]"
                           : s->tokens == TOK_CT ? "an image as [N, C, H * W]"
                           : s->tokens == TOK_TN ? "tokens sequence first [T, N, C]"
                                                 : "tokens sequence first [T * N, C]"),
           NULL;
  if (s->padded && !allow_pad)
    return qt_imp_node_err(im,
                           "input '%s' comes from a Pad; a zero Pad is supported only right before a Conv or an "
                           "AveragePool (it becomes their padding)",
                           s->name),
           NULL;
  return s;
}

/* A parameter input: an initializer (or a Constant), used by no other node. */
const Onnx__TensorProto *qt_imp_param_input(imp *im, size_t k, const char *role, int optional) {
  const char *name = in_name(im->node, k);
  if (!name) {
    if (!optional) qt_imp_node_err(im, "input %zu (the %s) is missing", k, role);
    return NULL;
  }
  sym *s = qt_imp_find(im, name);
  if (!s)
    return qt_imp_node_err(im, "the %s '%s' is missing: no initializer or Constant of that name", role, name), NULL;
  if (s->kind != S_CONST)
    return qt_imp_node_err(im, "the %s '%s' is %s; only initializers (constant tensors) are supported as %ss", role,
                           name, kind_text(s), role),
           NULL;
  if (s->user)
    return qt_imp_node_err(im, "the %s '%s' is also a parameter of node '%s'; shared parameters are not supported",
                           role, name, s->user),
           NULL;
  s->user = im->node->name && im->node->name[0] ? im->node->name : "(unnamed)";
  return s->t;
}

/* ---- attributes ------------------------------------------------------------------------------ */

const Onnx__AttributeProto *qt_imp_attr(const Onnx__NodeProto *n, const char *name) {
  for (size_t i = 0; i < n->n_attribute; i++)
    if (n->attribute[i]->name && strcmp(n->attribute[i]->name, name) == 0) return n->attribute[i];
  return NULL;
}

/* The current node's attribute `name` when it is there with the given type; NULL with *rc 0 when
 * it is absent, NULL with *rc -1 (the error said, naming `what` it should be) for another type. */
static const Onnx__AttributeProto *typed_attr(imp *im, const char *name, Onnx__AttributeProto__AttributeType type,
                                              const char *what, int *rc) {
  const Onnx__AttributeProto *a = qt_imp_attr(im->node, name);
  *rc = a && a->type != type ? qt_imp_node_err(im, "attribute %s is not %s", name, what) : 0;
  return *rc ? NULL : a;
}

int qt_imp_attr_int(imp *im, const char *name, int64_t def, int64_t *v) {
  int rc;
  const Onnx__AttributeProto *a = typed_attr(im, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT, "an integer", &rc);
  *v = a ? a->i : def;
  return rc;
}

int qt_imp_attr_float(imp *im, const char *name, float def, float *v) {
  int rc;
  const Onnx__AttributeProto *a = typed_attr(im, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT, "a float", &rc);
  *v = a ? a->f : def;
  return rc;
}

/* An INTS attribute of exactly `want` values (absent: *found = 0). */
int qt_imp_attr_ints(imp *im, const char *name, int64_t *v, size_t want, int *found) {
  const Onnx__AttributeProto *a = qt_imp_attr(im->node, name);
  *found = 0;
  if (!a) return 0;
  if (a->type != ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS || a->n_ints != want)
    return qt_imp_node_err(im, "attribute %s: expected %zu integers (2-D %s), found %zu", name, want,
                           want == 4 ? "pads begin and end" : "spatial", a->n_ints);
  memcpy(v, a->ints, want * sizeof *v);
  *found = 1;
  return 0;
}

int qt_imp_axes(imp *im, size_t k, int64_t *axes, int *n) {
  const Onnx__AttributeProto *a = qt_imp_attr(im->node, "axes");
  *n = 0;
  if (a) {
    if (a->type != ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS || a->n_ints > MAX_INTS)
      return qt_imp_node_err(im, "attribute axes: expected at most %d integers", MAX_INTS);
    *n = (int)a->n_ints;
    qt_imp_copy(axes, a->ints, a->n_ints * sizeof *axes);
    return 0;
  }
  if (!in_name(im->node, k)) return 0;
  sym tmp;
  const sym *s = qt_imp_ints_input(im, k, "axes", &tmp);
  if (!s) return -1;
  *n = s->n_ints;
  qt_imp_copy(axes, s->ints, (size_t)s->n_ints * sizeof *axes);
  return 0;
}

/* auto_pad must be absent or NOTSET (explicit pads). */
static int check_auto_pad(imp *im) {
  const Onnx__AttributeProto *a = qt_imp_attr(im->node, "auto_pad");
  if (!a) return 0;
  const size_t len = a->s.len;
  if (a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING && len == 6 && memcmp(a->s.data, "NOTSET", 6) == 0)
    return 0;
  return qt_imp_node_err(im, "attribute auto_pad = '%.*s' is not supported (only NOTSET, with explicit pads)",
                         (int)(len < 32 ? len : 32), a->s.data ? (const char *)a->s.data : "");
}

/* kernel_shape, strides, pads (symmetric), dilations (1), auto_pad (NOTSET). */
int qt_imp_read_window(imp *im, window *w) {
  int found;
  w->stride[0] = w->stride[1] = 1;
  memset(w->pad, 0, sizeof w->pad);
  if (check_auto_pad(im) || qt_imp_attr_ints(im, "kernel_shape", w->kernel, 2, &w->has_kernel) ||
      qt_imp_attr_ints(im, "strides", w->stride, 2, &found) || qt_imp_attr_ints(im, "pads", w->pad, 4, &found))
    return -1;
  int64_t dil[2] = {1, 1};
  if (qt_imp_attr_ints(im, "dilations", dil, 2, &found)) return -1;
  if (dil[0] != 1 || dil[1] != 1)
    return qt_imp_node_err(im, "dilations [%lld, %lld] are not supported (only 1)", (long long)dil[0],
                           (long long)dil[1]);
  for (int i = 0; i < 2; i++)
    if (w->stride[i] < 1 || w->stride[i] > 64)
      return qt_imp_node_err(im, "strides [%lld, %lld] out of range", (long long)w->stride[0], (long long)w->stride[1]);
  for (int i = 0; i < 4; i++)
    if (w->pad[i] < 0 || w->pad[i] > 64) return qt_imp_node_err(im, "pads %lld out of range", (long long)w->pad[i]);
  if (w->has_kernel && (w->kernel[0] < 1 || w->kernel[1] < 1 || w->kernel[0] > 64 || w->kernel[1] > 64))
    return qt_imp_node_err(im, "kernel_shape [%lld, %lld] out of range", (long long)w->kernel[0],
                           (long long)w->kernel[1]);
  return 0;
}

/* Adds a pending Pad of x to the window's pads, then requires them symmetric. */
int qt_imp_window_pads(imp *im, window *w, const sym *x) {
  if (x->padded)
    for (int i = 0; i < 4; i++) w->pad[i] += x->pad[i];
  if (w->pad[0] != w->pad[2] || w->pad[1] != w->pad[3])
    return qt_imp_node_err(
        im,
        "asymmetric pads [%lld, %lld, %lld, %lld] (top, left, bottom, right%s): the graph IR pads top "
        "and bottom, left and right alike",
        (long long)w->pad[0], (long long)w->pad[1], (long long)w->pad[2], (long long)w->pad[3],
        x->padded ? ", with the Pad before it" : "");
  return 0;
}

/* ---- tensors --------------------------------------------------------------------------------- */

/* A float32 tensor whose stored data holds exactly its dims' element count and, when want_dims
 * is given, has those dims. */
int qt_imp_check_float_tensor(imp *im, const Onnx__TensorProto *t, const char *role, int want_ndim,
                              const int64_t *want_dims) {
  char d[96], w[96];
  qt_imp_dims_str(t->dims, t->n_dims, d, sizeof d);
  if (t->data_type != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT)
    return qt_imp_node_err(im, "the %s '%s' has ONNX data type %d; only float32 (1) parameters are supported", role,
                           str(t->name), (int)t->data_type);
  if (t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL) /* not loaded: a Constant node's */
    return qt_imp_node_err(im, "the %s '%s' is stored in an external file that was not read", role, str(t->name));
  const int64_t n = numel_of(t);
  const int64_t stored = t->has_raw_data ? (int64_t)(t->raw_data.len / 4) : (int64_t)t->n_float_data;
  if (n < 0 || (t->has_raw_data && t->raw_data.len % 4) || stored != n)
    return qt_imp_node_err(im, "the %s '%s' has dims %s (%lld values) but holds %lld%s", role, str(t->name), d,
                           (long long)n, (long long)stored,
                           t->has_raw_data && t->raw_data.len % 4
                               ? " and a partial value (raw_data length not a multiple of 4)"
                               : " values (wrong size)");
  if (want_dims) {
    int same = (int)t->n_dims == want_ndim;
    for (int i = 0; same && i < want_ndim; i++) same = t->dims[i] == want_dims[i];
    if (!same) {
      qt_imp_dims_str(want_dims, (size_t)want_ndim, w, sizeof w);
      return qt_imp_node_err(im, "the %s '%s' has dims %s, expected %s", role, str(t->name), d, w);
    }
  }
  return 0;
}

/* raw_data may be unaligned: copied. */
void qt_imp_float_data(const Onnx__TensorProto *t, float *out, int64_t n) {
  if (t->has_raw_data)
    qt_imp_copy(out, t->raw_data.data, (size_t)n * sizeof(float)); /* little-endian, as ONNX stores it */
  else
    qt_imp_copy(out, t->float_data, (size_t)n * sizeof(float));
}

/* An integer tensor (int64 or int32) of at most MAX_INTS values as S_INTS data. */
int qt_imp_const_ints(imp *im, const Onnx__TensorProto *t, int64_t *v, int *n, int *scalar) {
  const int64_t count = numel_of(t);
  if (count < 0 || count > MAX_INTS || t->n_dims > 1)
    return qt_imp_node_err(im, "constant '%s': expected at most %d integers in one dimension", str(t->name), MAX_INTS);
  *n = (int)count;
  *scalar = t->n_dims == 0;
  const int i64 = t->data_type == ONNX__TENSOR_PROTO__DATA_TYPE__INT64;
  if (!i64 && t->data_type != ONNX__TENSOR_PROTO__DATA_TYPE__INT32)
    return qt_imp_node_err(im, "constant '%s': ONNX data type %d, expected integers", str(t->name), (int)t->data_type);
  const int64_t size = i64 ? 8 : 4;
  const void *data = t->has_raw_data ? (const void *)t->raw_data.data
                     : i64           ? (const void *)t->int64_data
                                     : (const void *)t->int32_data;
  const int64_t bytes = t->has_raw_data ? (int64_t)t->raw_data.len
                        : i64           ? 8 * (int64_t)t->n_int64_data
                                        : 4 * (int64_t)t->n_int32_data;
  if (bytes != size * count)
    return qt_imp_node_err(im, "constant '%s': %s of the wrong size", str(t->name),
                           t->has_raw_data ? "raw data" : "data");
  if (i64) {
    qt_imp_copy(v, data, (size_t)count * 8);
  } else {
    int32_t tmp[MAX_INTS];
    qt_imp_copy(tmp, data, (size_t)count * 4);
    for (int i = 0; i < count; i++) v[i] = tmp[i];
  }
  return 0;
}

/* Input k as a small integer vector (a constant or a shape computation). */
int qt_imp_const_scalar(const sym *s, float *v) {
  if (!s || s->kind != S_CONST || s->t->data_type != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT || numel_of(s->t) != 1 ||
      (s->t->has_raw_data ? s->t->raw_data.len != 4 : s->t->n_float_data != 1))
    return 0;
  qt_imp_float_data(s->t, v, 1);
  return 1;
}

sym *qt_imp_ints_input(imp *im, size_t k, const char *role, sym *tmp) {
  sym *s = qt_imp_input(im, k, role);
  if (!s) return NULL;
  if (s->kind == S_INTS) return s;
  if (s->kind == S_CONST) {
    memset(tmp, 0, sizeof *tmp);
    tmp->kind = S_INTS;
    tmp->name = s->name;
    return qt_imp_const_ints(im, s->t, tmp->ints, &tmp->n_ints, &tmp->scalar) ? NULL : tmp;
  }
  return qt_imp_node_err(im, "input %zu (%s) '%s' is an activation; only constant shapes are supported", k, role,
                         s->name),
         NULL;
}

/* A float scalar constant (Clip's min and max); *present = 0 when the input is left out. */
/* A list of integers: the attribute `attr` (older opsets) or input k (a constant or computed);
 * *n = 0 when neither is there. */
int qt_imp_ints_arg(imp *im, const char *attr, size_t k, int64_t *v, int *n) {
  const Onnx__AttributeProto *a = qt_imp_attr(im->node, attr);
  *n = 0;
  if (a) {
    if (a->type != ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS || a->n_ints > MAX_INTS)
      return qt_imp_node_err(im, "attribute %s: expected at most %d integers", attr, MAX_INTS);
    *n = (int)a->n_ints;
    qt_imp_copy(v, a->ints, a->n_ints * sizeof *v);
    return 0;
  }
  if (!in_name(im->node, k)) return 0;
  sym tmp;
  const sym *s = qt_imp_ints_input(im, k, attr, &tmp);
  if (!s) return -1;
  *n = s->n_ints;
  qt_imp_copy(v, s->ints, (size_t)s->n_ints * sizeof *v);
  return 0;
}

int qt_imp_scalar_input(imp *im, size_t k, const char *role, float *v, int *present) {
  *present = 0;
  if (!in_name(im->node, k)) return 0;
  sym *s = qt_imp_input(im, k, role);
  if (!s) return -1;
  if (s->kind != S_CONST || s->t->data_type != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT || numel_of(s->t) != 1)
    return qt_imp_node_err(im, "%s '%s' must be a constant float scalar", role, s->name);
  const Onnx__TensorProto *t = s->t;
  if (t->has_raw_data ? t->raw_data.len != 4 : t->n_float_data != 1)
    return qt_imp_node_err(im, "%s '%s' holds no float", role, s->name);
  qt_imp_float_data(t, v, 1);
  *present = 1;
  return 0;
}

/* ---- names ----------------------------------------------------------------------------------- */

void qt_imp_sanitize(const char *in, char *out, size_t n) {
  size_t k = 0;
  for (const char *p = in; *p && k + 1 < n; p++) {
    const char c = *p;
    const int ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
    out[k++] = ok ? c : '_';
  }
  out[k] = 0;
  while (out[0] == '.') memmove(out, out + 1, strlen(out)); /* no leading dot: "<node>.<suffix>" stays readable */
}

void qt_onnx_graph_name(const char *path, char *name, size_t n) {
  const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
  char tmp[QT_NAME_LEN];
  snprintf(tmp, sizeof tmp, "%s", base);
  const size_t len = strlen(tmp);
  if (len > 5 && strcmp(tmp + len - 5, ".onnx") == 0) tmp[len - 5] = 0;
  qt_imp_sanitize(tmp, name, n);
  if (!name[0] || strcmp(name, ".") == 0) snprintf(name, n, "onnx_model");
}

/* The quoted items of a Python list's text, "['', 'stem', 'stem.relu']": up to max, each at most
 * len - 1 characters (longer ones cut); the count, or -1 when the text is not such a list. */
static int py_list(const char *s, size_t n, char (*items)[QT_NAME_LEN], int max) {
  size_t i = 0;
  int k = 0;
  while (i < n && s[i] == ' ') i++;
  if (i == n || s[i++] != '[') return -1;
  for (;;) {
    while (i < n && (s[i] == ' ' || s[i] == ',')) i++;
    if (i < n && s[i] == ']') return k;
    if (i == n || (s[i] != '\'' && s[i] != '"')) return -1;
    const char q = s[i++];
    size_t m = 0;
    while (i < n && s[i] != q) {
      if (k < max && m + 1 < QT_NAME_LEN) items[k][m++] = s[i];
      i++;
    }
    if (i == n) return -1;
    i++;
    if (k < max) items[k][m] = 0;
    k++;
  }
}

/* The metadata of a node that torch 2.x's exporter writes (NodeProto field 9, metadata_props,
 * which Debian's onnx.proto predates: protobuf-c keeps it as an unknown field): the value of
 * `key`, malloc'd, or NULL. */
static char *node_metadata(const Onnx__NodeProto *n, const char *key) {
  for (unsigned i = 0; i < n->base.n_unknown_fields; i++) {
    const ProtobufCMessageUnknownField *u = &n->base.unknown_fields[i];
    if (u->tag != 9 || u->wire_type != PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED) continue;
    size_t len = 0, used = 0; /* the field's bytes begin with its length */
    for (int shift = 0; used < u->len && used < 10; shift += 7) {
      len |= (size_t)(u->data[used] & 0x7f) << shift;
      if (!(u->data[used++] & 0x80)) break;
    }
    if (used > u->len || len != u->len - used) continue;
    Onnx__StringStringEntryProto *e = onnx__string_string_entry_proto__unpack(NULL, len, u->data + used);
    if (!e) continue;
    char *v = e->key && e->value && strcmp(e->key, key) == 0 ? strdup(e->value) : NULL;
    onnx__string_string_entry_proto__free_unpacked(e, NULL);
    if (v) return v;
  }
  return NULL;
}

/* The PyTorch module a torch 2.x node came from: its name_scopes (module paths from the root,
 * then the aten op: ['', 'stem', 'stem.relu', 'hardtanh']) cut to the modules its
 * class_hierarchy lists (those not "aten."): "stem.relu". Empty when unknown or the root. */
static void torch_module(const Onnx__NodeProto *n, char *out, size_t len) {
  enum { MAX_DEPTH = 32 };
  char scopes[MAX_DEPTH][QT_NAME_LEN], classes[MAX_DEPTH][QT_NAME_LEN];
  out[0] = 0;
  char *s = node_metadata(n, "pkg.torch.onnx.name_scopes"),
       *c = s ? node_metadata(n, "pkg.torch.onnx.class_hierarchy") : NULL;
  const int ns = s ? py_list(s, strlen(s), scopes, MAX_DEPTH) : -1,
            nc = c ? py_list(c, strlen(c), classes, MAX_DEPTH) : -1;
  int modules = 0;
  for (int k = 0; k < nc && k < MAX_DEPTH; k++) modules += strncmp(classes[k], "aten.", 5) != 0;
  if (ns > 0 && nc > 0 && modules >= 2 && modules <= ns && modules <= MAX_DEPTH)
    qt_imp_sanitize(scopes[modules - 1], out, len);
  free(s);
  free(c);
}

/* "/block1/relu2/Relu" -> "block1.relu2"; "/Relu_1" -> "Relu_1"; "Conv_0" -> "Conv_0". */
static void scope_name(const Onnx__NodeProto *n, char *out, size_t len) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", str(n->name));
  char *s = buf;
  while (*s == '/') s++;
  char *last = strrchr(s, '/');
  if (last) {
    const char *leaf = last + 1, *op = str(n->op_type);
    const size_t ol = strlen(op);
    int is_op = strncmp(leaf, op, ol) == 0 && (leaf[ol] == 0 || leaf[ol] == '_');
    for (const char *p = leaf + ol + (leaf[ol] == '_'); is_op && *p; p++) is_op = *p >= '0' && *p <= '9';
    if (is_op) *last = 0; /* the leaf only repeats the op type */
  }
  for (char *p = s; *p; p++)
    if (*p == '/') *p = '.';
  qt_imp_sanitize(s, out, len);
}

/* A name longer than IMP_NAME_MAX as its last characters after an FNV-1a hash of the whole
 * ("3f2a9c1b-block.0.2"): the names prepare and convert derive from it fit QT_NAME_LEN, and
 * names that differ only in their head stay apart. */
static void fit_name(char *s) {
  const size_t n = strlen(s);
  if (n <= IMP_NAME_MAX) return;
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
  char out[QT_NAME_LEN];
  const size_t keep = IMP_NAME_MAX - 9;
  snprintf(out, sizeof out, "%08x-%s", (unsigned)h, s + n - keep);
  snprintf(s, IMP_NAME_MAX + 1, "%s", out);
}

/* The IR name of the current node: after its weight's PyTorch name ("conv1.weight" -> "conv1"),
 * else its scope; at most IMP_NAME_MAX characters (fit_name); made unique. */
void qt_imp_node_name(imp *im, const char *weight, char *out) {
  char cand[QT_NAME_LEN] = "";
  if (weight) {
    const size_t wl = strlen(weight);
    if (wl > 7 && strcmp(weight + wl - 7, ".weight") == 0 && !strstr(weight, "::") && wl - 7 < sizeof cand) {
      char tmp[QT_NAME_LEN];
      snprintf(tmp, sizeof tmp, "%.*s", (int)(wl - 7), weight);
      qt_imp_sanitize(tmp, cand, sizeof cand);
    }
  }
  if (!cand[0]) torch_module(im->node, cand, sizeof cand);
  if (!cand[0]) scope_name(im->node, cand, sizeof cand);
  if (!cand[0]) snprintf(cand, sizeof cand, "%s_%d", str(im->node->op_type), im->node_index);
  fit_name(cand);
  if (qt_graph_find_node(im->g, cand) < 0) {
    snprintf(out, QT_NAME_LEN, "%s", cand);
    return;
  }
  char full[QT_NAME_LEN]; /* the whole scope: "/block1/Add_1" -> "block1.Add_1" */
  char buf[256];
  snprintf(buf, sizeof buf, "%s", str(im->node->name));
  for (char *p = buf; *p; p++)
    if (*p == '/') *p = '.';
  qt_imp_sanitize(buf, full, sizeof full);
  fit_name(full);
  if (full[0] && qt_graph_find_node(im->g, full) < 0) {
    snprintf(out, QT_NAME_LEN, "%s", full);
    return;
  }
  ENTRY *memo = next_suffix(im, cand); /* entries stay put: the table never grows */
  for (intptr_t k = (intptr_t)memo->data;; k++) {
    char tail[24];
    snprintf(tail, sizeof tail, "_%ld", (long)k);
    snprintf(out, QT_NAME_LEN, "%.*s%s", (int)(IMP_NAME_MAX - strlen(tail)), cand, tail);
    if (qt_graph_find_node(im->g, out) < 0) {
      memo->data = (void *)(k + 1);
      return;
    }
  }
}

/* ---- building -------------------------------------------------------------------------------- */

int qt_imp_builder_check(imp *im, int v) {
  if (v >= 0) return 0;
  return qt_imp_node_err(im, "the graph IR refused it: %s", im->g->error);
}

sym *qt_imp_bind_act(imp *im, size_t out_k, int value) {
  sym *s = qt_imp_add_sym(im, im->node->output[out_k], S_ACT);
  s->value = value;
  return s;
}

/* Output k of the current node aliases x (Identity, Dropout, a flatten of a flat tensor). */
sym *qt_imp_alias(imp *im, size_t out_k, const sym *x) {
  const char *name = im->node->output[out_k];
  sym *s = qt_imp_add_sym(im, name, S_NONE);
  *s = *x;
  s->name = name;
  return s;
}

sym *qt_imp_pending(imp *im, const sym *x, const char *what) {
  sym *s = qt_imp_alias(im, 0, x);
  s->kind = S_NONE;
  s->what = what;
  im->info->folded++;
  return s;
}

void qt_imp_add_copy(imp *im, int tensor, const Onnx__TensorProto *src, copy_kind kind, const sym *perm) {
  if (im->n_copies == im->cap_copies) {
    im->cap_copies = im->cap_copies ? 2 * im->cap_copies : 32;
    im->copies = realloc(im->copies, (size_t)im->cap_copies * sizeof *im->copies);
    QT_ASSERT(im->copies, "out of memory");
  }
  param_copy *c = &im->copies[im->n_copies++];
  memset(c, 0, sizeof *c);
  c->tensor = tensor;
  c->src = src;
  c->kind = kind;
  if (perm) {
    c->perm_h = perm->perm_h;
    c->perm_w = perm->perm_w;
    c->perm_c = perm->perm_c;
  }
}

const char *qt_imp_dyn_note(imp *im) {
  return im->dynamic ? " (the input's dynamic dims were taken from the data's images)" : "";
}
const sym *qt_imp_param_sym(imp *im, size_t k) { return qt_imp_find(im, in_name(im->node, k)); }

void qt_imp_outputs_unused(imp *im, size_t from, const char *what) {
  for (size_t k = from; k < im->node->n_output; k++)
    if (im->node->output[k] && im->node->output[k][0]) qt_imp_add_sym(im, im->node->output[k], S_NONE)->what = what;
}

Onnx__TensorProto *qt_imp_new_tensor(imp *im, const char *name, int data_type, const int64_t *dims, size_t n_dims) {
  QT_ASSERT(data_type == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT || data_type == ONNX__TENSOR_PROTO__DATA_TYPE__INT64,
            "onnx import: new tensor of type %d", data_type);
  Onnx__TensorProto *t = calloc(1, sizeof *t);
  QT_ASSERT(t, "out of memory");
  onnx__tensor_proto__init(t);
  t->name = (char *)name;
  t->data_type = data_type;
  t->has_data_type = 1;
  t->n_dims = n_dims;
  t->dims = calloc(n_dims + 1, sizeof *t->dims);
  QT_ASSERT(t->dims, "out of memory");
  int64_t n = 1;
  for (size_t i = 0; i < n_dims; i++) n *= (t->dims[i] = dims[i]);
  const size_t elem = data_type == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT ? 4 : 8;
  t->has_raw_data = 1;
  t->raw_data.len = (size_t)n * elem;
  t->raw_data.data = calloc((size_t)n + 1, elem);
  QT_ASSERT(t->raw_data.data, "out of memory");
  if (im->n_made == im->cap_made) {
    im->cap_made = im->cap_made ? 2 * im->cap_made : 32;
    im->made = realloc(im->made, (size_t)im->cap_made * sizeof *im->made);
    QT_ASSERT(im->made, "out of memory");
  }
  im->made[im->n_made++] = t;
  return t;
}
