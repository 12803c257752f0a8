/* The ONNX QDQ export's protobuf side (export_int.h): every protobuf struct, array and string is
 * allocated from one pool freed at the end, so the model is a plain tree of pool memory (no
 * protobuf-c free functions: they are for unpacked messages); initializers, nodes and their
 * attributes; the messages that name the node being exported. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx/export_int.h"
#include "base/base.h"

/* ---- messages -------------------------------------------------------------------------------- */

int qt_exp_node_err(exporter *e, const char *fmt, ...) {
  char what[QT_ERR_LEN];
  QT_VFORMAT(what, fmt);
  if (!e->node) return qt_err(e->err, "onnx export: %s: %s", e->path, what);
  return qt_err(e->err, "onnx export: %s: node '%s' (%s): %s", e->path, e->node->name, qt_op_name(e->node->op), what);
}

/* ---- the pool -------------------------------------------------------------------------------- */

void *qt_exp_alloc(exporter *e, size_t n) {
  if (e->n_mem == e->cap_mem) {
    e->cap_mem = e->cap_mem ? 2 * e->cap_mem : 256;
    e->mem = realloc(e->mem, e->cap_mem * sizeof *e->mem);
    QT_ASSERT(e->mem, "onnx export: out of memory");
  }
  void *p = calloc(1, n ? n : 1);
  QT_ASSERT(p, "onnx export: out of memory (%zu bytes)", n);
  e->mem[e->n_mem++] = p;
  return p;
}

char *qt_exp_str(exporter *e, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  const int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  QT_ASSERT(n >= 0, "onnx export: bad format");
  char *s = qt_exp_alloc(e, (size_t)n + 1);
  va_start(ap, fmt);
  vsnprintf(s, (size_t)n + 1, fmt, ap);
  va_end(ap);
  return s;
}

void qt_exp_pool_free(exporter *e) {
  for (size_t i = 0; i < e->n_mem; i++) free(e->mem[i]);
  QT_FREE_ALL(e->mem, e->nodes, e->inits, e->vi);
}

/* ---- tensors --------------------------------------------------------------------------------- */

/* arr (n elements of elsize bytes, room for *cap) with room for one more: doubled when full. */
static void *room_for_one(void *arr, size_t n, size_t *cap, size_t elsize) {
  if (n < *cap) return arr;
  *cap = *cap ? 2 * *cap : 64;
  arr = realloc(arr, *cap * elsize);
  QT_ASSERT(arr, "onnx export: out of memory");
  return arr;
}

Onnx__TensorProto *qt_exp_add_init(exporter *e, const char *name, int type, int ndim, const int64_t *dims,
                                   const void *data, size_t bytes) {
  Onnx__TensorProto *t = qt_exp_alloc(e, sizeof *t);
  onnx__tensor_proto__init(t);
  t->name = qt_exp_str(e, "%s", name);
  t->has_data_type = 1;
  t->data_type = type;
  t->n_dims = (size_t)ndim;
  t->dims = qt_exp_alloc(e, (size_t)(ndim ? ndim : 1) * sizeof *t->dims);
  if (ndim) memcpy(t->dims, dims, (size_t)ndim * sizeof *dims);
  t->has_raw_data = 1;
  t->raw_data.len = bytes;
  t->raw_data.data = qt_exp_alloc(e, bytes);
  if (bytes) memcpy(t->raw_data.data, data, bytes); /* little-endian, as ONNX stores raw data */
  e->inits = room_for_one(e->inits, e->n_inits, &e->cap_inits, sizeof *e->inits);
  e->inits[e->n_inits++] = t;
  return t;
}

void qt_exp_add_float(exporter *e, const char *name, int ndim, const int64_t *dims, const float *data, int64_t n) {
  qt_exp_add_init(e, name, T_FLOAT, ndim, dims, data, (size_t)n * sizeof(float));
}

void qt_exp_add_scalar_float(exporter *e, const char *name, float v) { qt_exp_add_float(e, name, 0, NULL, &v, 1); }

void qt_exp_add_int64(exporter *e, const char *name, int ndim, const int64_t *dims, const int64_t *v, int64_t n) {
  qt_exp_add_init(e, name, ONNX__TENSOR_PROTO__DATA_TYPE__INT64, ndim, dims, v, (size_t)n * sizeof *v);
}

/* Integers known to fit the container (checked by the caller) as int8 / uint8. */
void qt_exp_add_int8(exporter *e, const char *name, int type, int ndim, const int64_t *dims, const int32_t *v,
                     int64_t n) {
  unsigned char *b = malloc((size_t)(n ? n : 1));
  QT_ASSERT(b, "onnx export: out of memory");
  for (int64_t i = 0; i < n; i++) b[i] = type == T_INT8 ? (unsigned char)(int8_t)v[i] : (unsigned char)v[i];
  qt_exp_add_init(e, name, type, ndim, dims, b, (size_t)n);
  free(b);
}

/* ---- nodes ----------------------------------------------------------------------------------- */

Onnx__NodeProto *qt_exp_add_node(exporter *e, const char *op_type, const char *name, const char *out, int n_in, ...) {
  Onnx__NodeProto *n = qt_exp_alloc(e, sizeof *n);
  onnx__node_proto__init(n);
  n->op_type = qt_exp_str(e, "%s", op_type);
  n->name = qt_exp_str(e, "%s", name);
  n->n_input = (size_t)n_in;
  n->input = qt_exp_alloc(e, (size_t)n_in * sizeof *n->input);
  va_list ap;
  va_start(ap, n_in);
  for (int i = 0; i < n_in; i++) n->input[i] = qt_exp_str(e, "%s", va_arg(ap, const char *));
  va_end(ap);
  n->n_output = 1;
  n->output = qt_exp_alloc(e, sizeof *n->output);
  n->output[0] = qt_exp_str(e, "%s", out);
  e->nodes = room_for_one(e->nodes, e->n_nodes, &e->cap_nodes, sizeof *e->nodes);
  e->nodes[e->n_nodes++] = n;
  return n;
}

Onnx__AttributeProto *qt_exp_add_attr(exporter *e, Onnx__NodeProto *n, const char *name) {
  Onnx__AttributeProto **a = qt_exp_alloc(e, (n->n_attribute + 1) * sizeof *a);
  if (n->n_attribute) memcpy(a, n->attribute, n->n_attribute * sizeof *a); /* the old array stays in the pool */
  n->attribute = a;
  Onnx__AttributeProto *at = qt_exp_alloc(e, sizeof *at);
  onnx__attribute_proto__init(at);
  at->name = qt_exp_str(e, "%s", name);
  at->has_type = 1;
  n->attribute[n->n_attribute++] = at;
  return at;
}

void qt_exp_attr_int(exporter *e, Onnx__NodeProto *n, const char *name, int64_t v) {
  Onnx__AttributeProto *a = qt_exp_add_attr(e, n, name);
  a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
  a->has_i = 1;
  a->i = v;
}

void qt_exp_attr_float(exporter *e, Onnx__NodeProto *n, const char *name, float v) {
  Onnx__AttributeProto *a = qt_exp_add_attr(e, n, name);
  a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT;
  a->has_f = 1;
  a->f = v;
}

void qt_exp_attr_str(exporter *e, Onnx__NodeProto *n, const char *name, const char *v) {
  Onnx__AttributeProto *a = qt_exp_add_attr(e, n, name);
  a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING;
  a->has_s = 1;
  a->s.len = strlen(v);
  a->s.data = (uint8_t *)qt_exp_str(e, "%s", v);
}

void qt_exp_attr_ints(exporter *e, Onnx__NodeProto *n, const char *name, int count, ...) {
  Onnx__AttributeProto *a = qt_exp_add_attr(e, n, name);
  a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS;
  a->n_ints = (size_t)count;
  a->ints = qt_exp_alloc(e, (size_t)count * sizeof *a->ints);
  va_list ap;
  va_start(ap, count);
  for (int i = 0; i < count; i++) a->ints[i] = va_arg(ap, int64_t);
  va_end(ap);
}

/* kernel_shape, strides, pads (top, left, bottom, right) of conv and pools. */
void qt_exp_attr_window(exporter *e, Onnx__NodeProto *n, const qt_node_attrs *a) {
  qt_exp_attr_ints(e, n, "kernel_shape", 2, (int64_t)a->kernel_h, (int64_t)a->kernel_w);
  qt_exp_attr_ints(e, n, "strides", 2, (int64_t)a->stride_h, (int64_t)a->stride_w);
  qt_exp_attr_ints(e, n, "pads", 4, (int64_t)a->pad_h, (int64_t)a->pad_w, (int64_t)a->pad_h, (int64_t)a->pad_w);
}
