/* ONNX import (onnx_import.h): the protobuf is parsed by the protobuf-c code generated from
 * Debian's onnx.proto; this file walks the parsed model, checks every node against what the graph
 * IR can express and builds the graph with the nn builder.
 *
 * Every ONNX tensor name maps to a symbol: an activation (an IR value, with how it stands for the
 * ONNX tensor: an NCHW image as an NHWC value, a flat (N, F) tensor, a pending zero Pad, a flatten
 * whose order differs from PyTorch's), a constant (an initializer or a Constant node), or a small
 * integer vector (the shape arithmetic of x.view(n, -1)). Parameters are copied into the graph's
 * slabs after it is finalized, converted to the graph's layouts on the way. */
#define _GNU_SOURCE /* hsearch_r: glibc's reentrant hash tables */
#include "onnx/onnx_import.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <search.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx.pb-c.h"
#include "onnx/wire.h"

#define BATCH INT64_MIN /* the batch dimension in shape arithmetic */
#define MAX_INTS 8
#define ONNX_MAX_BYTES ((long)1 << 30)
#define ONNX_MAX_DEPTH 64          /* nested messages (a real model: under 10) */
#define ONNX_MAX_MESSAGES 2000000L /* nodes, attributes, tensors, value infos, ... in all */

typedef enum { S_NONE, S_ACT, S_CONST, S_INTS } sym_kind;

typedef struct {
  const char *name;
  sym_kind kind;
  /* S_ACT */
  int value;                 /* IR value id */
  int pooled;                /* an IR (C) vector standing for ONNX [N, C, 1, 1] (GlobalAveragePool) */
  int perm_h, perm_w, perm_c;/* a flat value in (h, w, c) order standing for PyTorch's (c, h, w) flatten */
  int pad[4];                /* a pending zero Pad (top, left, bottom, right) of the image `value` */
  int padded;
  /* S_CONST */
  const Onnx__TensorProto *t;
  const char *user;          /* first node using it as a parameter (shared parameters are refused) */
  /* S_INTS */
  int64_t ints[MAX_INTS];
  int n_ints, scalar;
  /* S_NONE: an output no supported consumer reads */
  const char *what;
} sym;

typedef enum { COPY_AS_IS, COPY_TRANSPOSE } copy_kind;

typedef struct {
  int tensor;                      /* in the graph */
  const Onnx__TensorProto *src;
  copy_kind kind;                  /* COPY_TRANSPOSE: src is (IN, OUT), the graph wants (OUT, IN) */
  int perm_h, perm_w, perm_c;      /* columns from (c, h, w) to (h, w, c) order */
} param_copy;

typedef struct {
  const char *path;
  char *err;
  qt_onnx_info *info;
  const Onnx__GraphProto *gp;
  int64_t opset;
  qt_graph *g;
  sym *syms;
  int n_syms, cap_syms;
  struct hsearch_data sym_index;   /* name -> the latest symbol of that name (data: index + 1) */
  struct hsearch_data next_suffix; /* a taken node name -> the next "_k" to try after it */
  char **suffix_keys;              /* next_suffix's keys, owned */
  int n_suffix_keys, cap_suffix_keys;
  param_copy *copies;
  int n_copies, cap_copies;
  const Onnx__NodeProto *node;     /* being imported (messages) */
  int node_index;
  unsigned char *absorbed;         /* per node: folded into an earlier node (an Add into a MatMul) */
  int dynamic;                     /* input dims from the data */
  int64_t static_batch;            /* the batch the input declares, 0 = dynamic */
} imp;

/* ---- messages -------------------------------------------------------------------------------- */

static const char *str(const char *s) { return s ? s : ""; }

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
    if (*p < 0x20 || *p == 0x7f) k += (size_t)snprintf(out + k, sizeof out - k, "\\x%02x", *p);
    else out[k++] = (char)*p;
  }
  out[k] = 0;
  memcpy(err, out, k + 1);
  return -1;
}

/* "onnx: <path>: node '<name>' (<OpType>, opset <n>): <what>" */
static int node_err(imp *im, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int node_err(imp *im, const char *fmt, ...) {
  char what[QT_ERR_LEN], label[32];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  const Onnx__NodeProto *n = im->node;
  qt_err(im->err, "onnx: %s: node '%s' (%s, opset %lld): %s", im->path, node_label(n, im->node_index, label, sizeof label),
         str(n->op_type), (long long)im->opset, what);
  return escaped(im->err);
}

static int file_err(imp *im, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int file_err(imp *im, const char *fmt, ...) {
  char what[QT_ERR_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  qt_err(im->err, "onnx: %s: %s", im->path, what);
  return escaped(im->err);
}

static void dims_str(const int64_t *d, size_t n, char *buf, size_t len) {
  size_t k = (size_t)snprintf(buf, len, "[");
  for (size_t i = 0; i < n && k < len; i++) k += (size_t)snprintf(buf + k, len - k, "%s%lld", i ? ", " : "", (long long)d[i]);
  if (k < len) snprintf(buf + k, len - k, "]");
}

/* ---- symbols --------------------------------------------------------------------------------- */

/* Symbols are found through a hash (glibc's hsearch_r), so that import is linear in the model's
 * size: the latest symbol of a name. */
static sym *find(imp *im, const char *name) {
  ENTRY want = {.key = (char *)name}, *got = NULL;
  if (!hsearch_r(want, FIND, &got, &im->sym_index)) return NULL;
  return &im->syms[(intptr_t)got->data - 1];
}

/* The table is allocated once for every name the model can define (import_graph), so symbol
 * pointers stay valid while nodes add symbols. A later symbol of a name hides the earlier one. */
static sym *add_sym(imp *im, const char *name, sym_kind kind) {
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

/* The node's input k (NULL when absent or empty: an optional input left out). */
static const char *in_name(const Onnx__NodeProto *n, size_t k) {
  return k < n->n_input && n->input[k] && n->input[k][0] ? n->input[k] : NULL;
}

static const char *kind_text(const sym *s) {
  switch (s->kind) {
    case S_ACT: return "an activation";
    case S_CONST: return "a constant";
    case S_INTS: return "a shape computation";
    default: return "?";
  }
}

/* Input k of the current node, which must exist (role names it in messages). */
static sym *input(imp *im, size_t k, const char *role) {
  const char *name = in_name(im->node, k);
  if (!name) return node_err(im, "input %zu (%s) is missing", k, role), NULL;
  sym *s = find(im, name);
  if (!s)
    return node_err(im, "input %zu (%s) '%s' is neither the graph input, an initializer nor an earlier node's output "
                        "(a missing initializer?)", k, role, name), NULL;
  if (s->kind == S_NONE) return node_err(im, "input %zu (%s) '%s' is %s, which is not supported", k, role, name, s->what), NULL;
  return s;
}

/* An activation input (a pending Pad only where allow_pad). */
static sym *act_input(imp *im, size_t k, const char *role, int allow_pad) {
  sym *s = input(im, k, role);
  if (!s) return NULL;
  if (s->kind != S_ACT)
    return node_err(im, "input %zu (%s) '%s' is %s, expected an activation computed from the graph input", k, role,
                    s->name, kind_text(s)), NULL;
  if (s->padded && !allow_pad)
    return node_err(im, "input '%s' comes from a Pad; a zero Pad is supported only right before a Conv or an "
                        "AveragePool (it becomes their padding)", s->name), NULL;
  return s;
}

/* A parameter input: an initializer (or a Constant), used by no other node. */
static const Onnx__TensorProto *param_input(imp *im, size_t k, const char *role, int optional) {
  const char *name = in_name(im->node, k);
  if (!name) {
    if (!optional) node_err(im, "input %zu (the %s) is missing", k, role);
    return NULL;
  }
  sym *s = find(im, name);
  if (!s) return node_err(im, "the %s '%s' is missing: no initializer or Constant of that name", role, name), NULL;
  if (s->kind != S_CONST)
    return node_err(im, "the %s '%s' is %s; only initializers (constant tensors) are supported as %ss", role, name,
                    kind_text(s), role), NULL;
  if (s->user)
    return node_err(im, "the %s '%s' is also a parameter of node '%s'; shared parameters are not supported", role, name,
                    s->user), NULL;
  s->user = im->node->name && im->node->name[0] ? im->node->name : "(unnamed)";
  return s->t;
}

/* ---- attributes ------------------------------------------------------------------------------ */

static const Onnx__AttributeProto *attr(const Onnx__NodeProto *n, const char *name) {
  for (size_t i = 0; i < n->n_attribute; i++)
    if (n->attribute[i]->name && strcmp(n->attribute[i]->name, name) == 0) return n->attribute[i];
  return NULL;
}

static int attr_int(imp *im, const char *name, int64_t def, int64_t *v) {
  const Onnx__AttributeProto *a = attr(im->node, name);
  *v = def;
  if (!a) return 0;
  if (a->type != ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT) return node_err(im, "attribute %s is not an integer", name);
  *v = a->i;
  return 0;
}

static int attr_float(imp *im, const char *name, float def, float *v) {
  const Onnx__AttributeProto *a = attr(im->node, name);
  *v = def;
  if (!a) return 0;
  if (a->type != ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT) return node_err(im, "attribute %s is not a float", name);
  *v = a->f;
  return 0;
}

/* An INTS attribute of exactly `want` values (absent: *found = 0). */
static int attr_ints(imp *im, const char *name, int64_t *v, size_t want, int *found) {
  const Onnx__AttributeProto *a = attr(im->node, name);
  *found = 0;
  if (!a) return 0;
  if (a->type != ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS || a->n_ints != want)
    return node_err(im, "attribute %s: expected %zu integers (2-D %s), found %zu", name, want,
                    want == 4 ? "pads begin and end" : "spatial", a->n_ints);
  memcpy(v, a->ints, want * sizeof *v);
  *found = 1;
  return 0;
}

/* auto_pad must be absent or NOTSET (explicit pads). */
static int check_auto_pad(imp *im) {
  const Onnx__AttributeProto *a = attr(im->node, "auto_pad");
  if (!a) return 0;
  const size_t len = a->s.len;
  if (a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING && len == 6 && memcmp(a->s.data, "NOTSET", 6) == 0) return 0;
  return node_err(im, "attribute auto_pad = '%.*s' is not supported (only NOTSET, with explicit pads)",
                  (int)(len < 32 ? len : 32), a->s.data ? (const char *)a->s.data : "");
}

typedef struct {
  int64_t kernel[2], stride[2], pad[4];
  int has_kernel;
} window;

/* kernel_shape, strides, pads (symmetric), dilations (1), auto_pad (NOTSET). */
static int read_window(imp *im, window *w) {
  int found;
  w->stride[0] = w->stride[1] = 1;
  memset(w->pad, 0, sizeof w->pad);
  if (check_auto_pad(im) || attr_ints(im, "kernel_shape", w->kernel, 2, &w->has_kernel) ||
      attr_ints(im, "strides", w->stride, 2, &found) || attr_ints(im, "pads", w->pad, 4, &found))
    return -1;
  int64_t dil[2] = {1, 1};
  if (attr_ints(im, "dilations", dil, 2, &found)) return -1;
  if (dil[0] != 1 || dil[1] != 1)
    return node_err(im, "dilations [%lld, %lld] are not supported (only 1)", (long long)dil[0], (long long)dil[1]);
  for (int i = 0; i < 2; i++)
    if (w->stride[i] < 1 || w->stride[i] > 64) return node_err(im, "strides [%lld, %lld] out of range", (long long)w->stride[0], (long long)w->stride[1]);
  for (int i = 0; i < 4; i++)
    if (w->pad[i] < 0 || w->pad[i] > 64) return node_err(im, "pads %lld out of range", (long long)w->pad[i]);
  if (w->has_kernel && (w->kernel[0] < 1 || w->kernel[1] < 1 || w->kernel[0] > 64 || w->kernel[1] > 64))
    return node_err(im, "kernel_shape [%lld, %lld] out of range", (long long)w->kernel[0], (long long)w->kernel[1]);
  return 0;
}

/* Adds a pending Pad of x to the window's pads, then requires them symmetric. */
static int window_pads(imp *im, window *w, const sym *x) {
  if (x->padded)
    for (int i = 0; i < 4; i++) w->pad[i] += x->pad[i];
  if (w->pad[0] != w->pad[2] || w->pad[1] != w->pad[3])
    return node_err(im, "asymmetric pads [%lld, %lld, %lld, %lld] (top, left, bottom, right%s): the graph IR pads top "
                    "and bottom, left and right alike", (long long)w->pad[0], (long long)w->pad[1],
                    (long long)w->pad[2], (long long)w->pad[3], x->padded ? ", with the Pad before it" : "");
  return 0;
}

/* ---- tensors --------------------------------------------------------------------------------- */

static int64_t numel_of(const Onnx__TensorProto *t) {
  int64_t n = 1;
  for (size_t i = 0; i < t->n_dims; i++) {
    if (t->dims[i] < 0 || (t->dims[i] > 0 && n > INT64_MAX / t->dims[i])) return -1;
    n *= t->dims[i];
  }
  return n;
}

/* A float32 tensor whose stored data holds exactly its dims' element count and, when want_dims
 * is given, has those dims. */
static int check_float_tensor(imp *im, const Onnx__TensorProto *t, const char *role, int want_ndim,
                              const int64_t *want_dims) {
  char d[96], w[96];
  dims_str(t->dims, t->n_dims, d, sizeof d);
  if (t->data_type != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT)
    return node_err(im, "the %s '%s' has ONNX data type %d; only float32 (1) parameters are supported", role, str(t->name),
                    (int)t->data_type);
  if (t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL || t->n_external_data)
    return node_err(im, "the %s '%s' is stored in an external file; only data inside the model is supported", role,
                    str(t->name));
  const int64_t n = numel_of(t);
  const int64_t stored = t->has_raw_data ? (int64_t)(t->raw_data.len / 4) : (int64_t)t->n_float_data;
  if (n < 0 || (t->has_raw_data && t->raw_data.len % 4) || stored != n)
    return node_err(im, "the %s '%s' has dims %s (%lld values) but holds %lld%s", role, str(t->name), d, (long long)n,
                    (long long)stored, t->has_raw_data && t->raw_data.len % 4 ? " and a partial value (raw_data length not a multiple of 4)" : " values (wrong size)");
  if (want_dims) {
    int same = (int)t->n_dims == want_ndim;
    for (int i = 0; same && i < want_ndim; i++) same = t->dims[i] == want_dims[i];
    if (!same) {
      dims_str(want_dims, (size_t)want_ndim, w, sizeof w);
      return node_err(im, "the %s '%s' has dims %s, expected %s", role, str(t->name), d, w);
    }
  }
  return 0;
}

/* The values of a float tensor checked by check_float_tensor (raw_data may be unaligned). */
static void float_data(const Onnx__TensorProto *t, float *out, int64_t n) {
  if (t->has_raw_data)
    memcpy(out, t->raw_data.data, (size_t)n * sizeof(float)); /* little-endian, as ONNX stores it */
  else
    memcpy(out, t->float_data, (size_t)n * sizeof(float));
}

/* An integer tensor (int64 or int32) of at most MAX_INTS values as S_INTS data. */
static int const_ints(imp *im, const Onnx__TensorProto *t, int64_t *v, int *n, int *scalar) {
  const int64_t count = numel_of(t);
  if (count < 0 || count > MAX_INTS || t->n_dims > 1)
    return node_err(im, "constant '%s': expected at most %d integers in one dimension", str(t->name), MAX_INTS);
  *n = (int)count;
  *scalar = t->n_dims == 0;
  if (t->data_type == ONNX__TENSOR_PROTO__DATA_TYPE__INT64) {
    if (t->has_raw_data) {
      if ((int64_t)t->raw_data.len != 8 * count) return node_err(im, "constant '%s': raw data of the wrong size", str(t->name));
      memcpy(v, t->raw_data.data, (size_t)count * 8);
    } else {
      if ((int64_t)t->n_int64_data != count) return node_err(im, "constant '%s': data of the wrong size", str(t->name));
      memcpy(v, t->int64_data, (size_t)count * 8);
    }
    return 0;
  }
  if (t->data_type == ONNX__TENSOR_PROTO__DATA_TYPE__INT32) {
    int32_t tmp[MAX_INTS];
    if (t->has_raw_data) {
      if ((int64_t)t->raw_data.len != 4 * count) return node_err(im, "constant '%s': raw data of the wrong size", str(t->name));
      memcpy(tmp, t->raw_data.data, (size_t)count * 4);
    } else {
      if ((int64_t)t->n_int32_data != count) return node_err(im, "constant '%s': data of the wrong size", str(t->name));
      memcpy(tmp, t->int32_data, (size_t)count * 4);
    }
    for (int i = 0; i < count; i++) v[i] = tmp[i];
    return 0;
  }
  return node_err(im, "constant '%s': ONNX data type %d, expected integers", str(t->name), (int)t->data_type);
}

/* Input k as a small integer vector (a constant or a shape computation). */
static sym *ints_input(imp *im, size_t k, const char *role, sym *tmp) {
  sym *s = input(im, k, role);
  if (!s) return NULL;
  if (s->kind == S_INTS) return s;
  if (s->kind == S_CONST) {
    memset(tmp, 0, sizeof *tmp);
    tmp->kind = S_INTS;
    tmp->name = s->name;
    return const_ints(im, s->t, tmp->ints, &tmp->n_ints, &tmp->scalar) ? NULL : tmp;
  }
  return node_err(im, "input %zu (%s) '%s' is an activation; only constant shapes are supported", k, role, s->name), NULL;
}

/* A float scalar constant (Clip's min and max); *present = 0 when the input is left out. */
static int scalar_input(imp *im, size_t k, const char *role, float *v, int *present) {
  *present = 0;
  if (!in_name(im->node, k)) return 0;
  sym *s = input(im, k, role);
  if (!s) return -1;
  if (s->kind != S_CONST || s->t->data_type != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT || numel_of(s->t) != 1)
    return node_err(im, "%s '%s' must be a constant float scalar", role, s->name);
  const Onnx__TensorProto *t = s->t;
  if (t->has_raw_data ? t->raw_data.len != 4 : t->n_float_data != 1)
    return node_err(im, "%s '%s' holds no float", role, s->name);
  float_data(t, v, 1);
  *present = 1;
  return 0;
}

/* ---- names ----------------------------------------------------------------------------------- */

static void sanitize(const char *in, char *out, size_t n) {
  size_t k = 0;
  for (const char *p = in; *p && k + 1 < n; p++) {
    const char c = *p;
    const int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
                   c == '.';
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
  sanitize(tmp, name, n);
  if (!name[0] || strcmp(name, ".") == 0) snprintf(name, n, "onnx_model");
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
  sanitize(s, out, len);
}

/* The IR name of the current node: after its weight's PyTorch name ("conv1.weight" -> "conv1"),
 * else its scope; made unique. */
static void node_name(imp *im, const char *weight, char *out) {
  char cand[QT_NAME_LEN] = "";
  if (weight) {
    const size_t wl = strlen(weight);
    if (wl > 7 && strcmp(weight + wl - 7, ".weight") == 0 && !strstr(weight, "::") && wl - 7 < sizeof cand) {
      char tmp[QT_NAME_LEN];
      snprintf(tmp, sizeof tmp, "%.*s", (int)(wl - 7), weight);
      sanitize(tmp, cand, sizeof cand);
    }
  }
  if (!cand[0]) scope_name(im->node, cand, sizeof cand);
  if (!cand[0]) snprintf(cand, sizeof cand, "%s_%d", str(im->node->op_type), im->node_index);
  if (qt_graph_find_node(im->g, cand) < 0) {
    snprintf(out, QT_NAME_LEN, "%s", cand);
    return;
  }
  char full[QT_NAME_LEN]; /* the whole scope: "/block1/Add_1" -> "block1.Add_1" */
  char buf[256];
  snprintf(buf, sizeof buf, "%s", str(im->node->name));
  for (char *p = buf; *p; p++)
    if (*p == '/') *p = '.';
  sanitize(buf, full, sizeof full);
  if (full[0] && qt_graph_find_node(im->g, full) < 0) {
    snprintf(out, QT_NAME_LEN, "%s", full);
    return;
  }
  ENTRY *memo = next_suffix(im, cand); /* entries stay put: the table never grows */
  for (intptr_t k = (intptr_t)memo->data;; k++) {
    char tail[24];
    snprintf(tail, sizeof tail, "_%ld", (long)k);
    snprintf(out, QT_NAME_LEN, "%.*s%s", (int)(QT_NAME_LEN - 1 - strlen(tail)), cand, tail);
    if (qt_graph_find_node(im->g, out) < 0) {
      memo->data = (void *)(k + 1);
      return;
    }
  }
}

/* ---- building -------------------------------------------------------------------------------- */

static int builder_check(imp *im, int v) {
  if (v >= 0) return 0;
  return node_err(im, "the graph IR refused it: %s", im->g->error);
}

static sym *bind_act(imp *im, size_t out_k, int value) {
  sym *s = add_sym(im, im->node->output[out_k], S_ACT);
  s->value = value;
  return s;
}

/* Output k of the current node aliases x (Identity, Dropout, a flatten of a flat tensor). */
static sym *alias(imp *im, size_t out_k, const sym *x) {
  const char *name = im->node->output[out_k];
  sym *s = add_sym(im, name, S_NONE);
  *s = *x;
  s->name = name;
  return s;
}

static void add_copy(imp *im, int tensor, const Onnx__TensorProto *src, copy_kind kind, const sym *perm) {
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

static const qt_value *val(imp *im, const sym *s) { return &im->g->values[s->value]; }
static int is_image(imp *im, const sym *s) { return val(im, s)->ndim == 3; }
static int64_t features(imp *im, const sym *s) { return qt_value_numel(val(im, s)); }
static int node_of(imp *im, int value) { return im->g->values[value].producer; }

static const char *dyn_note(imp *im) {
  return im->dynamic ? " (the input's dynamic dims were taken from the data's images)" : "";
}

static int op_conv(imp *im) {
  sym *x = act_input(im, 0, "X", 1);
  if (!x) return -1;
  if (!is_image(im, x))
    return node_err(im, "input '%s' is a flat (N, F) tensor%s; Conv needs an image (N, C, H, W)", x->name,
                    x->pooled ? " (GlobalAveragePool's output is a (C) vector in the graph IR)" : "");
  const Onnx__TensorProto *w = param_input(im, 1, "weight", 0), *b = NULL;
  if (!w) return -1;
  if (in_name(im->node, 2) && !(b = param_input(im, 2, "bias", 1))) return -1;
  int64_t group = 1;
  window win;
  if (attr_int(im, "group", 1, &group) || read_window(im, &win) || window_pads(im, &win, x)) return -1;
  const qt_value *xv = val(im, x);
  const int64_t C = xv->shape[2];
  if (group < 1 || C % group) return node_err(im, "group %lld does not divide the input's %lld channels", (long long)group, (long long)C);
  if (w->n_dims != 4)
    return node_err(im, "the weight '%s' has %zu dims, expected 4 (OC, C/group, KH, KW)", str(w->name), w->n_dims);
  const int64_t OC = w->dims[0], KH = win.has_kernel ? win.kernel[0] : w->dims[2], KW = win.has_kernel ? win.kernel[1] : w->dims[3];
  const int64_t want_w[4] = {OC, C / group, KH, KW}, want_b[1] = {OC};
  if (OC < 1 || OC % group) return node_err(im, "%lld output channels are not a multiple of group %lld", (long long)OC, (long long)group);
  if (check_float_tensor(im, w, "weight", 4, want_w) || (b && check_float_tensor(im, b, "bias", 1, want_b))) return -1;
  const qt_node_attrs a = {.kernel_h = (int)KH, .kernel_w = (int)KW, .stride_h = (int)win.stride[0],
                           .stride_w = (int)win.stride[1], .pad_h = (int)win.pad[0], .pad_w = (int)win.pad[1],
                           .groups = (int)group, .out_channels = (int)OC};
  char name[QT_NAME_LEN];
  node_name(im, w->name, name);
  const int y = qt_graph_conv2d_attr(im->g, name, x->value, &a, b != NULL);
  if (builder_check(im, y)) return -1;
  const qt_node *nd = &im->g->nodes[node_of(im, y)];
  add_copy(im, nd->param[QT_P_WEIGHT], w, COPY_AS_IS, NULL);
  if (b) add_copy(im, nd->param[QT_P_BIAS], b, COPY_AS_IS, NULL);
  if (x->padded) im->info->folded++;
  bind_act(im, 0, y);
  return 0;
}

/* ONNX stores momentum as the running statistics' weight (0.9); the graph (PyTorch) the batch's
 * (0.1). 1 - 0.9f is 0.100000024: the 7-digit value it stands for is kept. */
static float momentum_of(float onnx_momentum) {
  char buf[32];
  snprintf(buf, sizeof buf, "%.6g", 1.0 - (double)onnx_momentum);
  return strtof(buf, NULL);
}

static int extra_outputs_unused(imp *im, size_t from, const char *what) {
  for (size_t k = from; k < im->node->n_output; k++)
    if (im->node->output[k] && im->node->output[k][0]) add_sym(im, im->node->output[k], S_NONE)->what = what;
  return 0;
}

static int op_batch_norm(imp *im) {
  sym *x = act_input(im, 0, "X", 0);
  if (!x) return -1;
  if (x->perm_c) return node_err(im, "BatchNormalization of a flattened image ('%s') is not supported", x->name);
  const qt_value *xv = val(im, x);
  const int64_t C = xv->shape[xv->ndim - 1], want[1] = {C};
  const char *roles[4] = {"scale", "B", "mean", "var"};
  const Onnx__TensorProto *t[4];
  for (int k = 0; k < 4; k++)
    if (!(t[k] = param_input(im, (size_t)k + 1, roles[k], 0)) || check_float_tensor(im, t[k], roles[k], 1, want)) return -1;
  float eps, mom;
  if (attr_float(im, "epsilon", 1e-5f, &eps) || attr_float(im, "momentum", 0.9f, &mom)) return -1;
  if (!(eps > 0) || !(mom >= 0 && mom <= 1))
    return node_err(im, "epsilon %g / momentum %g out of range", (double)eps, (double)mom);
  char name[QT_NAME_LEN];
  node_name(im, t[0]->name, name);
  const int y = qt_graph_batch_norm(im->g, name, x->value);
  if (builder_check(im, y)) return -1;
  qt_node *nd = &im->g->nodes[node_of(im, y)];
  nd->attr.eps = eps;
  nd->attr.momentum = momentum_of(mom);
  add_copy(im, nd->param[QT_P_GAMMA], t[0], COPY_AS_IS, NULL);
  add_copy(im, nd->param[QT_P_BETA], t[1], COPY_AS_IS, NULL);
  add_copy(im, nd->buffer[QT_B_RUNNING_MEAN], t[2], COPY_AS_IS, NULL);
  add_copy(im, nd->buffer[QT_B_RUNNING_VAR], t[3], COPY_AS_IS, NULL);
  sym *s = bind_act(im, 0, y);
  s->pooled = x->pooled;
  return extra_outputs_unused(im, 1, "a training statistics output of BatchNormalization");
}

/* Relu, Clip(0, 6) -> relu6, Clip(0, inf) -> relu. */
static int op_relu(imp *im, int clip) {
  sym *x = act_input(im, 0, "X", 0);
  if (!x) return -1;
  int six = 0;
  if (clip) {
    float lo = -INFINITY, hi = INFINITY;
    int has_lo = 0, has_hi = 0;
    if (scalar_input(im, 1, "min", &lo, &has_lo) || scalar_input(im, 2, "max", &hi, &has_hi)) return -1;
    const Onnx__AttributeProto *a_lo = attr(im->node, "min"), *a_hi = attr(im->node, "max");
    if (a_lo) lo = a_lo->f, has_lo = 1;
    if (a_hi) hi = a_hi->f, has_hi = 1;
    if (!has_lo || lo != 0.0f || (has_hi && hi != 6.0f && hi != INFINITY))
      return node_err(im, "Clip(min %g, max %g) is not supported: only Clip(0, 6) (ReLU6) and Clip(0) (ReLU)",
                      has_lo ? (double)lo : -INFINITY, has_hi ? (double)hi : INFINITY);
    six = has_hi && hi == 6.0f;
  }
  char name[QT_NAME_LEN];
  node_name(im, NULL, name);
  const int y = six ? qt_graph_relu6(im->g, name, x->value) : qt_graph_relu(im->g, name, x->value);
  if (builder_check(im, y)) return -1;
  sym *s = bind_act(im, 0, y);
  s->pooled = x->pooled;
  s->perm_h = x->perm_h, s->perm_w = x->perm_w, s->perm_c = x->perm_c;
  return 0;
}

static int op_pool(imp *im, int max) {
  sym *x = act_input(im, 0, "X", !max);
  if (!x) return -1;
  if (!is_image(im, x)) return node_err(im, "input '%s' is not an image (N, C, H, W)", x->name);
  window win;
  int64_t ceil_mode = 0, count_pad = 0, storage = 0;
  if (read_window(im, &win) || attr_int(im, "ceil_mode", 0, &ceil_mode) ||
      attr_int(im, "count_include_pad", 0, &count_pad) || attr_int(im, "storage_order", 0, &storage))
    return -1;
  if (!win.has_kernel) return node_err(im, "no kernel_shape");
  if (ceil_mode) return node_err(im, "ceil_mode = %lld is not supported (the graph IR pools in floor mode)", (long long)ceil_mode);
  if (!max && !count_pad && (win.pad[0] || win.pad[1] || win.pad[2] || win.pad[3]))
    return node_err(im, "count_include_pad = 0 with pads is not supported (the graph IR divides by the whole window, "
                    "PyTorch's count_include_pad = True)");
  if (window_pads(im, &win, x)) return -1;
  if (win.kernel[0] != win.kernel[1] || win.stride[0] != win.stride[1] || win.pad[0] != win.pad[1])
    return node_err(im, "kernel [%lld, %lld], strides [%lld, %lld], pads [%lld, %lld]: the graph IR pools with square "
                    "kernels, strides and pads", (long long)win.kernel[0], (long long)win.kernel[1],
                    (long long)win.stride[0], (long long)win.stride[1], (long long)win.pad[0], (long long)win.pad[1]);
  char name[QT_NAME_LEN];
  node_name(im, NULL, name);
  const int k = (int)win.kernel[0], s = (int)win.stride[0], p = (int)win.pad[0];
  const int y = max ? qt_graph_max_pool2d(im->g, name, x->value, k, s, p) : qt_graph_avg_pool2d(im->g, name, x->value, k, s, p);
  if (builder_check(im, y)) return -1;
  if (x->padded) im->info->folded++;
  bind_act(im, 0, y);
  return extra_outputs_unused(im, 1, "MaxPool's Indices output");
}

static int op_global_pool(imp *im) {
  sym *x = act_input(im, 0, "X", 0);
  if (!x) return -1;
  if (!is_image(im, x)) return node_err(im, "input '%s' is not an image (N, C, H, W)", x->name);
  char name[QT_NAME_LEN];
  node_name(im, NULL, name);
  const int y = qt_graph_global_avg_pool(im->g, name, x->value);
  if (builder_check(im, y)) return -1;
  bind_act(im, 0, y)->pooled = 1;
  return 0;
}

/* (N, C, H, W) -> (N, C*H*W): a flatten node (its order differs from PyTorch's unless H*W or C
 * is 1: remembered for the linear layer reading it); a flat tensor stays as it is. */
static int flatten(imp *im, sym *x) {
  if (!is_image(im, x)) {
    sym *s = alias(im, 0, x);
    s->pooled = 0;
    im->info->dropped++;
    return 0;
  }
  const qt_value *xv = val(im, x);
  const int H = (int)xv->shape[0], W = (int)xv->shape[1], C = (int)xv->shape[2];
  char name[QT_NAME_LEN];
  node_name(im, NULL, name);
  const int y = qt_graph_flatten(im->g, name, x->value);
  if (builder_check(im, y)) return -1;
  sym *s = bind_act(im, 0, y);
  if (H * W > 1 && C > 1) s->perm_h = H, s->perm_w = W, s->perm_c = C;
  return 0;
}

static int op_flatten(imp *im) {
  sym *x = act_input(im, 0, "input", 0);
  if (!x) return -1;
  int64_t axis = 1;
  if (attr_int(im, "axis", 1, &axis)) return -1;
  if (axis != 1) return node_err(im, "axis = %lld is not supported (only 1: keep the batch, flatten the rest)", (long long)axis);
  return flatten(im, x);
}

/* Reshape to (batch, -1) or (batch, features): x.view(n, -1) or flatten(1). */
static int op_reshape(imp *im) {
  sym *x = act_input(im, 0, "data", 0), tmp;
  if (!x) return -1;
  const sym *shape = ints_input(im, 1, "shape", &tmp);
  if (!shape) return -1;
  int64_t allowzero = 0;
  if (attr_int(im, "allowzero", 0, &allowzero)) return -1;
  const int64_t F = features(im, x);
  const int64_t *s = shape->ints;
  char d[96];
  {
    size_t k = (size_t)snprintf(d, sizeof d, "[");
    for (int i = 0; i < shape->n_ints && k < sizeof d; i++)
      k += (size_t)(s[i] == BATCH ? snprintf(d + k, sizeof d - k, "%sbatch", i ? ", " : "")
                                  : snprintf(d + k, sizeof d - k, "%s%lld", i ? ", " : "", (long long)s[i]));
    if (k < sizeof d) snprintf(d + k, sizeof d - k, "]");
  }
  const int batch_ok = shape->n_ints == 2 && (s[0] == BATCH || (s[0] == 0 && !allowzero) ||
                                              (im->static_batch > 0 && s[0] == im->static_batch) || (s[0] == -1 && s[1] == F));
  if (!batch_ok || !(s[1] == -1 || s[1] == F))
    return node_err(im, "Reshape to %s of a tensor with %lld features per sample: only the flatten x.view(n, -1) "
                    "(batch, -1) is supported", d, (long long)F);
  return flatten(im, x);
}

/* W (OUT, IN) of a linear layer reading x; transposed: W is stored (IN, OUT). */
static int linear(imp *im, sym *x, const Onnx__TensorProto *w, int transposed, const Onnx__TensorProto *b,
                  const char *role) {
  if (is_image(im, x))
    return node_err(im, "input '%s' is an image (N, C, H, W); %s needs a flat (N, F) input (Flatten first)", x->name,
                    role);
  const int64_t IN = features(im, x);
  char d[96];
  dims_str(w->dims, w->n_dims, d, sizeof d);
  if (w->n_dims != 2)
    return node_err(im, "the weight '%s' has dims %s, expected a matrix", str(w->name), d);
  const int64_t OUT = transposed ? w->dims[1] : w->dims[0], w_in = transposed ? w->dims[0] : w->dims[1];
  if (w_in != IN)
    return node_err(im, "the weight '%s' %s takes %lld input features, but its input '%s' has %lld%s", str(w->name), d,
                    (long long)w_in, x->name, (long long)IN, dyn_note(im));
  const int64_t want_w[2] = {w->dims[0], w->dims[1]}, want_b[1] = {OUT};
  if (check_float_tensor(im, w, "weight", 2, want_w)) return -1;
  if (b) {
    const int64_t row[2] = {1, OUT};
    if (b->n_dims == 2 ? check_float_tensor(im, b, "bias", 2, row) : check_float_tensor(im, b, "bias", 1, want_b)) return -1;
  }
  char name[QT_NAME_LEN];
  node_name(im, w->name, name);
  const int y = qt_graph_linear(im->g, name, x->value, (int)OUT, b != NULL);
  if (builder_check(im, y)) return -1;
  const qt_node *nd = &im->g->nodes[node_of(im, y)];
  add_copy(im, nd->param[QT_P_WEIGHT], w, transposed ? COPY_TRANSPOSE : COPY_AS_IS, x->perm_c ? x : NULL);
  if (b) add_copy(im, nd->param[QT_P_BIAS], b, COPY_AS_IS, NULL);
  if (x->perm_c) im->info->permuted++;
  bind_act(im, 0, y);
  return 0;
}

static int op_gemm(imp *im) {
  sym *x = act_input(im, 0, "A", 0);
  if (!x) return -1;
  int64_t ta, tb;
  float alpha, beta;
  if (attr_int(im, "transA", 0, &ta) || attr_int(im, "transB", 0, &tb) || attr_float(im, "alpha", 1.0f, &alpha) ||
      attr_float(im, "beta", 1.0f, &beta))
    return -1;
  if (ta) return node_err(im, "transA = 1 is not supported");
  if (alpha != 1.0f || beta != 1.0f)
    return node_err(im, "alpha %g, beta %g: only 1 is supported", (double)alpha, (double)beta);
  const Onnx__TensorProto *w = param_input(im, 1, "weight", 0), *b = NULL;
  if (!w) return -1;
  if (in_name(im->node, 2) && !(b = param_input(im, 2, "bias", 1))) return -1;
  return linear(im, x, w, !tb, b, "Gemm");
}

/* The node reading output `name` when it is the only reader, else -1. */
static int sole_reader(imp *im, const char *name, int *count) {
  int who = -1;
  *count = 0;
  for (size_t i = 0; i < im->gp->n_node; i++) {
    const Onnx__NodeProto *n = im->gp->node[i];
    for (size_t k = 0; k < n->n_input; k++)
      if (n->input[k] && strcmp(n->input[k], name) == 0) {
        (*count)++;
        who = (int)i;
      }
  }
  for (size_t k = 0; k < im->gp->n_output; k++)
    if (strcmp(str(im->gp->output[k]->name), name) == 0) (*count)++;
  return *count == 1 ? who : -1;
}

/* MatMul(A, W) [+ bias]: an Add of a constant right after it becomes the layer's bias. */
static int op_matmul(imp *im) {
  sym *x = act_input(im, 0, "A", 0);
  if (!x) return -1;
  const Onnx__TensorProto *w = param_input(im, 1, "weight", 0), *b = NULL;
  if (!w) return -1;
  int count;
  const int add = sole_reader(im, im->node->output[0], &count);
  if (add > im->node_index && strcmp(str(im->gp->node[add]->op_type), "Add") == 0 && im->gp->node[add]->n_input == 2) {
    const Onnx__NodeProto *an = im->gp->node[add];
    const char *other = strcmp(an->input[0], im->node->output[0]) == 0 ? an->input[1] : an->input[0];
    sym *o = find(im, other);
    if (o && o->kind == S_CONST && !o->user) {
      b = o->t;
      o->user = str(an->name);
      im->absorbed[add] = 1;
    }
  }
  if (linear(im, x, w, 1, b, "MatMul")) return -1;
  if (b) { /* the Add's output is the layer's */
    const sym *y = &im->syms[im->n_syms - 1];
    const int value = y->value;
    add_sym(im, im->gp->node[add]->output[0], S_ACT)->value = value;
    im->info->folded++;
  }
  return 0;
}

static int op_add(imp *im) {
  sym *a = input(im, 0, "A"), *b = a ? input(im, 1, "B") : NULL;
  if (!b) return -1;
  if (a->kind != S_ACT || b->kind != S_ACT)
    return node_err(im, "Add of '%s' (%s) and '%s' (%s): only the residual Add of two activations, and the bias Add "
                    "right after a MatMul, are supported", a->name, kind_text(a), b->name, kind_text(b));
  if (!(a = act_input(im, 0, "A", 0)) || !(b = act_input(im, 1, "B", 0))) return -1;
  if (a->perm_c != b->perm_c || a->perm_h != b->perm_h || a->perm_w != b->perm_w || a->pooled != b->pooled)
    return node_err(im, "Add of '%s' and '%s', laid out differently in the graph IR", a->name, b->name);
  const qt_value *va = val(im, a), *vb = val(im, b);
  int same = va->ndim == vb->ndim;
  for (int d = 0; same && d < va->ndim; d++) same = va->shape[d] == vb->shape[d];
  if (!same) return node_err(im, "Add of '%s' and '%s' of different shapes (broadcasting is not supported)", a->name, b->name);
  char name[QT_NAME_LEN];
  node_name(im, NULL, name);
  const int y = qt_graph_add(im->g, name, a->value, b->value);
  if (builder_check(im, y)) return -1;
  sym *s = bind_act(im, 0, y);
  s->pooled = a->pooled;
  s->perm_h = a->perm_h, s->perm_w = a->perm_w, s->perm_c = a->perm_c;
  return 0;
}

/* Identity, Dropout: dropped (Dropout's mask output must be unused). */
static int op_identity(imp *im) {
  sym *x = input(im, 0, "input");
  if (!x) return -1;
  alias(im, 0, x);
  im->info->dropped++;
  return extra_outputs_unused(im, 1, "Dropout's mask output");
}

/* A zero Pad of the spatial dims, pending until the Conv or AveragePool it feeds. */
static int op_pad(imp *im) {
  sym *x = act_input(im, 0, "data", 0), tmp;
  if (!x) return -1;
  const Onnx__AttributeProto *mode = attr(im->node, "mode");
  if (mode && !(mode->s.len == 8 && memcmp(mode->s.data, "constant", 8) == 0))
    return node_err(im, "mode '%.*s' is not supported (only constant zero padding)", (int)mode->s.len, mode->s.data);
  if (!is_image(im, x)) return node_err(im, "input '%s' is not an image (N, C, H, W)", x->name);
  const sym *p = ints_input(im, 1, "pads", &tmp);
  if (!p) return -1;
  float value = 0;
  int has_value;
  if (in_name(im->node, 3)) return node_err(im, "the axes input is not supported");
  if (scalar_input(im, 2, "constant_value", &value, &has_value)) return -1;
  if (p->n_ints != 8 || value != 0.0f || p->ints[0] || p->ints[1] || p->ints[4] || p->ints[5])
    return node_err(im, "only zero padding of H and W is supported (pads of %d values, constant %g)", p->n_ints, (double)value);
  for (int k = 0; k < 8; k++)
    if (p->ints[k] < 0 || p->ints[k] > 64) return node_err(im, "pads out of range");
  sym *s = alias(im, 0, x);
  const int64_t add[4] = {p->ints[2], p->ints[3], p->ints[6], p->ints[7]}; /* top, left, bottom, right */
  for (int k = 0; k < 4; k++) s->pad[k] += (int)add[k];
  s->padded = s->pad[0] || s->pad[1] || s->pad[2] || s->pad[3];
  if (!s->padded) im->info->dropped++;
  return 0;
}

static int op_constant(imp *im) {
  const Onnx__AttributeProto *a = attr(im->node, "value");
  if (!a || a->type != ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR || !a->t)
    return node_err(im, "only a Constant with a tensor 'value' is supported");
  add_sym(im, im->node->output[0], S_CONST)->t = a->t;
  return 0;
}

/* ---- shape arithmetic of x.view(n, -1) -------------------------------------------------------- */

static int op_shape(imp *im) {
  sym *x = act_input(im, 0, "data", 0);
  if (!x) return -1;
  int64_t start = 0, end = INT64_MAX;
  if (attr_int(im, "start", 0, &start) || attr_int(im, "end", INT64_MAX, &end)) return -1;
  const qt_value *v = val(im, x);
  int64_t full[4];
  int n;
  if (v->ndim == 3) {
    full[0] = BATCH, full[1] = v->shape[2], full[2] = v->shape[0], full[3] = v->shape[1], n = 4;
  } else {
    full[0] = BATCH, full[1] = v->shape[0], n = 2;
    if (x->pooled) full[2] = full[3] = 1, n = 4;
  }
  if (start < 0) start += n;
  if (end > n) end = n;
  if (end < 0) end += n;
  if (start < 0 || start > end) return node_err(im, "start %lld / end %lld out of range", (long long)start, (long long)end);
  sym *s = add_sym(im, im->node->output[0], S_INTS);
  s->n_ints = (int)(end - start);
  memcpy(s->ints, full + start, (size_t)s->n_ints * sizeof *s->ints);
  return 0;
}

static int op_gather(imp *im) {
  sym tmp_d, tmp_i;
  const sym *d = ints_input(im, 0, "data", &tmp_d);
  if (!d) return -1;
  sym saved_d = *d;
  const sym *ix = ints_input(im, 1, "indices", &tmp_i);
  if (!ix) return -1;
  int64_t axis = 0;
  if (attr_int(im, "axis", 0, &axis)) return -1;
  if (axis != 0 || saved_d.scalar) return node_err(im, "only Gather along axis 0 of a shape is supported");
  sym *s = add_sym(im, im->node->output[0], S_INTS);
  s->scalar = ix->scalar;
  s->n_ints = ix->n_ints;
  for (int i = 0; i < ix->n_ints; i++) {
    int64_t k = ix->ints[i];
    if (k < 0) k += saved_d.n_ints;
    if (k < 0 || k >= saved_d.n_ints) return node_err(im, "index %lld out of range", (long long)ix->ints[i]);
    s->ints[i] = saved_d.ints[k];
  }
  return 0;
}

static int op_unsqueeze(imp *im) {
  sym tmp, tmp_a;
  const sym *d = ints_input(im, 0, "data", &tmp);
  if (!d) return -1;
  const sym saved = *d;
  int64_t axes[MAX_INTS];
  int n_axes = 0;
  const Onnx__AttributeProto *a = attr(im->node, "axes");
  if (a) {
    n_axes = (int)(a->n_ints < MAX_INTS ? a->n_ints : MAX_INTS);
    memcpy(axes, a->ints, (size_t)n_axes * sizeof *axes);
  } else if (in_name(im->node, 1)) {
    const sym *ax = ints_input(im, 1, "axes", &tmp_a);
    if (!ax) return -1;
    n_axes = ax->n_ints;
    memcpy(axes, ax->ints, (size_t)n_axes * sizeof *axes);
  }
  if (!saved.scalar || n_axes != 1 || axes[0] != 0)
    return node_err(im, "only Unsqueeze of a scalar at axis 0 (a shape entry) is supported");
  sym *s = add_sym(im, im->node->output[0], S_INTS);
  *s = saved;
  s->name = im->node->output[0];
  s->scalar = 0;
  return 0;
}

static int op_concat(imp *im) {
  int64_t axis = 0;
  if (attr_int(im, "axis", 0, &axis)) return -1;
  if (axis != 0) return node_err(im, "only Concat of shapes (axis 0) is supported");
  int64_t v[MAX_INTS];
  int n = 0;
  for (size_t k = 0; k < im->node->n_input; k++) {
    sym tmp;
    const sym *p = ints_input(im, k, "input", &tmp);
    if (!p) return -1;
    if (p->scalar || n + p->n_ints > MAX_INTS) return node_err(im, "only Concat of short 1-D shapes is supported");
    memcpy(v + n, p->ints, (size_t)p->n_ints * sizeof *v);
    n += p->n_ints;
  }
  sym *s = add_sym(im, im->node->output[0], S_INTS);
  s->n_ints = n;
  memcpy(s->ints, v, (size_t)n * sizeof *v);
  return 0;
}

/* ---- the model ------------------------------------------------------------------------------- */

typedef struct {
  const char *op;
  int (*fn)(imp *im);
  int min_in, max_in, min_out, max_out; /* the arity the ONNX operator allows (opsets 11 to 17) */
} op_row;

static int f_conv(imp *im) { return op_conv(im); }
static int f_bn(imp *im) { return op_batch_norm(im); }
static int f_relu(imp *im) { return op_relu(im, 0); }
static int f_clip(imp *im) { return op_relu(im, 1); }
static int f_maxpool(imp *im) { return op_pool(im, 1); }
static int f_avgpool(imp *im) { return op_pool(im, 0); }

static const op_row ops[] = {
    {"Conv", f_conv, 2, 3, 1, 1},
    {"BatchNormalization", f_bn, 5, 5, 1, 5}, /* 5 outputs in training mode before opset 14 */
    {"Relu", f_relu, 1, 1, 1, 1},
    {"Clip", f_clip, 1, 3, 1, 1},
    {"MaxPool", f_maxpool, 1, 1, 1, 2},
    {"AveragePool", f_avgpool, 1, 1, 1, 1},
    {"GlobalAveragePool", op_global_pool, 1, 1, 1, 1},
    {"Flatten", op_flatten, 1, 1, 1, 1},
    {"Reshape", op_reshape, 2, 2, 1, 1},
    {"Gemm", op_gemm, 2, 3, 1, 1},
    {"MatMul", op_matmul, 2, 2, 1, 1},
    {"Add", op_add, 2, 2, 1, 1},
    {"Identity", op_identity, 1, 1, 1, 1},
    {"Dropout", op_identity, 1, 3, 1, 2},
    {"Pad", op_pad, 1, 4, 1, 1},
    {"Constant", op_constant, 0, 0, 1, 1},
    {"Shape", op_shape, 1, 1, 1, 1},
    {"Gather", op_gather, 2, 2, 1, 1},
    {"Unsqueeze", op_unsqueeze, 1, 2, 1, 1},
    {"Concat", op_concat, 1, MAX_INTS, 1, 1}, /* only a Reshape's shape: a few integer vectors */
};

static const op_row *op_lookup(const char *op) {
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
    if (strcmp(ops[i].op, op) == 0) return &ops[i];
  return NULL;
}

/* The file's bytes (malloc'd), or NULL with err. */
static uint8_t *read_file(imp *im, size_t *len) {
  FILE *f = fopen(im->path, "rb");
  if (!f) return file_err(im, "cannot open: %s", strerror(errno)), NULL;
  uint8_t *buf = NULL;
  long size = -1;
  if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
  if (size < 0 || fseek(f, 0, SEEK_SET) != 0) {
    fclose(f);
    return file_err(im, "cannot read (not a regular file?)"), NULL;
  }
  if (size == 0 || size > ONNX_MAX_BYTES) {
    fclose(f);
    return file_err(im, "%ld bytes: not an ONNX model (empty, or larger than 1 GiB)", size), NULL;
  }
  buf = malloc((size_t)size);
  QT_ASSERT(buf, "out of memory reading %ld bytes", size);
  if (fread(buf, 1, (size_t)size, f) != (size_t)size) {
    fclose(f);
    free(buf);
    return file_err(im, "read error: %s", strerror(errno)), NULL;
  }
  fclose(f);
  *len = (size_t)size;
  return buf;
}

/* ir_version, the default domain's opset, one graph with one input and one output; every node's
 * op type supported (before any graph is built). */
static int check_model(imp *im, const Onnx__ModelProto *m) {
  if (!m->has_ir_version || !m->graph)
    return file_err(im, "not an ONNX model (no %s): a truncated file or another format?",
                    !m->has_ir_version ? "ir_version" : "graph");
  im->info->ir_version = m->ir_version;
  snprintf(im->info->producer, sizeof im->info->producer, "%s %s", str(m->producer_name), str(m->producer_version));
  int64_t opset = -1;
  for (size_t i = 0; i < m->n_opset_import; i++) {
    const Onnx__OperatorSetIdProto *o = m->opset_import[i];
    if ((!o->domain || !o->domain[0] || strcmp(o->domain, "ai.onnx") == 0) && o->has_version) opset = o->version;
  }
  im->opset = im->info->opset = opset;
  if (m->ir_version < 6 || m->ir_version > 8)
    return file_err(im, "IR version %lld is not supported (6 to 8: PyTorch 1.13 writes 6 for opset 11, 7 for opsets "
                    "12-14, 8 for 15-17)", (long long)m->ir_version);
  if (opset < 11 || opset > 17)
    return file_err(im, "opset %lld of the default domain is not supported (11 to 17)", (long long)opset);
  const Onnx__GraphProto *gp = m->graph;
  im->gp = gp;
  for (size_t i = 0; i < gp->n_node; i++) {
    const Onnx__NodeProto *n = gp->node[i];
    im->node = n;
    im->node_index = (int)i;
    if (n->domain && n->domain[0] && strcmp(n->domain, "ai.onnx") != 0)
      return node_err(im, "domain '%s' is not supported (only the default ONNX domain)", n->domain);
    if (!n->op_type || !op_lookup(n->op_type))
      return node_err(im, "op type not supported (supported: Conv, BatchNormalization, Relu, Clip(0, 6), MaxPool, "
                      "AveragePool, GlobalAveragePool, Flatten, Reshape (flatten), Gemm, MatMul, Add, Identity, "
                      "Dropout, Pad (zeros before Conv / AveragePool), and Constant / Shape / Gather / Unsqueeze / "
                      "Concat computing a Reshape's shape)");
    const op_row *row = op_lookup(n->op_type);
    if (n->n_input < (size_t)row->min_in || n->n_input > (size_t)row->max_in)
      return node_err(im, "%zu inputs; %s takes %d to %d", n->n_input, row->op, row->min_in, row->max_in);
    if (n->n_output < (size_t)row->min_out || n->n_output > (size_t)row->max_out)
      return node_err(im, "%zu outputs; %s gives %d to %d", n->n_output, row->op, row->min_out, row->max_out);
    if (n->n_output < 1 || !n->output[0] || !n->output[0][0]) return node_err(im, "no output");
  }
  if (gp->n_output != 1)
    return file_err(im, "graph '%s' has %zu outputs; one (the logits) is supported", str(gp->name), gp->n_output);
  for (size_t i = 0; i < gp->n_input; i++)
    if (!gp->input[i]->name || !gp->input[i]->name[0]) return file_err(im, "graph input %zu has no name", i);
  if (!gp->output[0]->name || !gp->output[0]->name[0]) return file_err(im, "the graph output has no name");
  return 0;
}

/* The graph input: the one input that is not an initializer; NCHW float32. */
static int make_input(imp *im, const int *data_hwc) {
  const Onnx__GraphProto *gp = im->gp;
  const Onnx__ValueInfoProto *in = NULL;
  for (size_t i = 0; i < gp->n_input; i++) {
    const sym *s = find(im, str(gp->input[i]->name));
    if (s && s->kind == S_CONST) continue;
    if (in) return file_err(im, "graph inputs '%s' and '%s': one image input is supported", str(in->name), str(gp->input[i]->name));
    in = gp->input[i];
  }
  if (!in) return file_err(im, "the graph has no input (other than initializers)");
  qt_onnx_info *info = im->info;
  snprintf(info->input_name, sizeof info->input_name, "%s", str(in->name));
  const Onnx__TypeProto *tp = in->type;
  if (!tp || tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !tp->tensor_type)
    return file_err(im, "input '%s' is not a tensor", str(in->name));
  const Onnx__TypeProto__Tensor *tt = tp->tensor_type;
  if (tt->elem_type != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT)
    return file_err(im, "input '%s' has element type %d; float32 (1) is supported", str(in->name), (int)tt->elem_type);
  if (!tt->shape || tt->shape->n_dim != 4)
    return file_err(im, "input '%s' has %s; an image input (N, C, H, W) is supported", str(in->name),
                    tt->shape ? "another rank" : "no shape");
  int64_t dims[4];
  size_t k = (size_t)snprintf(info->input_decl, sizeof info->input_decl, "[");
  const char *dyn_names[3] = {0};
  for (int d = 0; d < 4; d++) {
    const Onnx__TensorShapeProto__Dimension *dim = tt->shape->dim[d];
    if (dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE && dim->dim_value < 0)
      return file_err(im, "input '%s': dimension %d is %lld (negative)", str(in->name), d, (long long)dim->dim_value);
    const int fixed = dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE && dim->dim_value > 0;
    dims[d] = fixed ? dim->dim_value : -1;
    const char *p = dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM && dim->dim_param ? dim->dim_param : "?";
    if (fixed)
      k += (size_t)snprintf(info->input_decl + k, k < sizeof info->input_decl ? sizeof info->input_decl - k : 0, "%s%lld",
                            d ? ", " : "", (long long)dims[d]);
    else
      k += (size_t)snprintf(info->input_decl + k, k < sizeof info->input_decl ? sizeof info->input_decl - k : 0, "%s%s",
                            d ? ", " : "", p);
    if (d > 0 && !fixed) dyn_names[d - 1] = p;
  }
  if (k < sizeof info->input_decl) snprintf(info->input_decl + k, sizeof info->input_decl - k, "] (NCHW)");
  im->static_batch = dims[0] > 0 ? dims[0] : 0;
  const int want[3] = {data_hwc ? data_hwc[2] : 0, data_hwc ? data_hwc[0] : 0, data_hwc ? data_hwc[1] : 0};
  for (int d = 1; d < 4; d++)
    if (dims[d] < 0) {
      im->dynamic = info->dynamic_dims = 1;
      if (!data_hwc || want[d - 1] < 1) {
        info->needs_shape = 1;
        return file_err(im, "input '%s' %s has a dynamic %s ('%s'); its size must come from the data", str(in->name),
                        info->input_decl, d == 1 ? "channel count" : d == 2 ? "height" : "width", dyn_names[d - 1]);
      }
      dims[d] = want[d - 1];
    }
  if (dims[1] > 64 || dims[2] > 65536 || dims[3] > 65536)
    return file_err(im, "input '%s' %s is too large", str(in->name), info->input_decl);
  char name[QT_NAME_LEN];
  sanitize(str(in->name), name, sizeof name);
  if (!name[0]) snprintf(name, sizeof name, "input");
  const int v = qt_graph_input(im->g, name, (int)dims[2], (int)dims[3], (int)dims[1]);
  if (v < 0) return file_err(im, "input '%s': %s", str(in->name), im->g->error);
  add_sym(im, in->name, S_ACT)->value = v;
  return 0;
}

/* Copies (and converts) every parameter into the finalized graph's slabs. */
static void copy_params(imp *im) {
  for (int i = 0; i < im->n_copies; i++) {
    const param_copy *c = &im->copies[i];
    const qt_param *p = &im->g->tensors[c->tensor];
    float *dst = qt_graph_tensor_data(im->g, c->tensor);
    float *src = malloc((size_t)p->numel * sizeof(float));
    QT_ASSERT(src, "out of memory");
    float_data(c->src, src, p->numel);
    if (c->kind == COPY_TRANSPOSE) { /* (IN, OUT) -> (OUT, IN) */
      const int64_t OUT = p->shape[0], IN = p->shape[1];
      for (int64_t o = 0; o < OUT; o++)
        for (int64_t k = 0; k < IN; k++) dst[o * IN + k] = src[k * OUT + o];
    } else {
      memcpy(dst, src, (size_t)p->numel * sizeof(float));
    }
    if (c->perm_c) { /* each row: PyTorch's (c, h, w) flatten order -> the graph's (h, w, c) */
      const int64_t H = c->perm_h, W = c->perm_w, C = c->perm_c, IN = H * W * C, OUT = p->numel / IN;
      for (int64_t o = 0; o < OUT; o++) {
        memcpy(src, dst + o * IN, (size_t)IN * sizeof(float));
        for (int64_t h = 0; h < H; h++)
          for (int64_t w = 0; w < W; w++)
            for (int64_t ch = 0; ch < C; ch++) dst[o * IN + (h * W + w) * C + ch] = src[ch * H * W + h * W + w];
      }
    }
    free(src);
  }
}

static qt_graph *import_graph(imp *im, const int *data_hwc) {
  const Onnx__GraphProto *gp = im->gp;
  im->cap_syms = (int)(gp->n_initializer + gp->n_input + 2 * gp->n_node + 8);
  for (size_t i = 0; i < gp->n_node; i++) im->cap_syms += (int)gp->node[i]->n_output;
  im->syms = calloc((size_t)im->cap_syms, sizeof *im->syms);
  QT_ASSERT(im->syms, "out of memory");
  /* room for every symbol, and for a memo per ONNX node's name */
  QT_ASSERT(hcreate_r(2 * (size_t)im->cap_syms, &im->sym_index) &&
                hcreate_r(2 * gp->n_node + 64, &im->next_suffix),
            "out of memory");
  for (size_t i = 0; i < gp->n_initializer; i++) {
    const Onnx__TensorProto *t = gp->initializer[i];
    if (!t->name || !t->name[0]) return file_err(im, "initializer %zu has no name", i), NULL;
    if (find(im, t->name)) return file_err(im, "initializer '%s' is defined twice", t->name), NULL;
    for (size_t d = 0; d < t->n_dims; d++)
      if (t->dims[d] < 0)
        return file_err(im, "initializer '%s': dimension %zu is %lld (negative)", t->name, d, (long long)t->dims[d]),
               NULL;
    add_sym(im, t->name, S_CONST)->t = t;
  }
  char gname[QT_NAME_LEN];
  qt_onnx_graph_name(im->path, gname, sizeof gname);
  im->g = qt_graph_create(gname);
  if (make_input(im, data_hwc)) return NULL;
  im->absorbed = calloc(gp->n_node + 1, 1);
  QT_ASSERT(im->absorbed, "out of memory");
  for (size_t i = 0; i < gp->n_node; i++) {
    im->node = gp->node[i];
    im->node_index = (int)i;
    im->info->nodes++;
    if (im->absorbed[i]) continue;
    if (op_lookup(im->node->op_type)->fn(im)) return NULL;
  }
  const char *out_name = str(gp->output[0]->name);
  const sym *out = find(im, out_name);
  if (!out || out->kind != S_ACT)
    return file_err(im, "the graph output '%s' is %s", out_name, out ? kind_text(out) : "not computed by any node"), NULL;
  if (is_image(im, out))
    return file_err(im, "the graph output '%s' is an image (N, C, H, W); a classifier's (N, classes) output is "
                    "supported (Flatten it)", out_name), NULL;
  if (out->perm_c)
    return file_err(im, "the graph output '%s' is a flattened image, whose order in the graph IR (h, w, c) differs "
                    "from PyTorch's (c, h, w)", out_name), NULL;
  if (qt_graph_finalize(im->g, out->value, im->err)) return NULL;
  copy_params(im);
  return im->g;
}

qt_graph *qt_onnx_import(const char *path, const int *data_hwc, qt_onnx_info *info, char *err) {
  qt_onnx_info local;
  if (!info) info = &local;
  memset(info, 0, sizeof *info);
  imp im = {.path = path, .err = err, .info = info};
  size_t len = 0;
  uint8_t *buf = read_file(&im, &len);
  if (!buf) return NULL;
  char what[256];
  if (qt_onnx_wire_check(buf, len, &onnx__model_proto__descriptor, ONNX_MAX_DEPTH, ONNX_MAX_MESSAGES, what,
                         sizeof what)) {
    free(buf);
    file_err(&im, "not a readable ONNX model: %s", what);
    return NULL;
  }
  Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, len, buf);
  free(buf);
  if (!m) {
    file_err(&im, "not a readable ONNX model (the protobuf does not parse: a truncated file or another format?)");
    return NULL;
  }
  qt_graph *g = NULL;
  if (check_model(&im, m) == 0) g = import_graph(&im, data_hwc);
  if (!g) qt_graph_free(im.g);
  onnx__model_proto__free_unpacked(m, NULL);
  free(im.syms);
  hdestroy_r(&im.sym_index);
  hdestroy_r(&im.next_suffix);
  for (int i = 0; i < im.n_suffix_keys; i++) free(im.suffix_keys[i]);
  free(im.suffix_keys);
  free(im.copies);
  free(im.absorbed);
  return g;
}
