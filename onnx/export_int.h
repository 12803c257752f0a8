/* Private to the ONNX QDQ export (onnx_export.h), shared by its two parts:
 *   export.c        the walk over the Q/DQ graph: values, ops, the model
 *   export_proto.c  the pool every protobuf struct is allocated from, initializers, nodes and
 *                   their attributes, messages */
#ifndef QT_ONNX_EXPORT_INT_H
#define QT_ONNX_EXPORT_INT_H

#include <stddef.h>
#include <stdint.h>

#include "onnx.pb-c.h"
#include "onnx/onnx_export.h"

#define T_FLOAT ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT
#define T_UINT8 ONNX__TENSOR_PROTO__DATA_TYPE__UINT8
#define T_INT8 ONNX__TENSOR_PROTO__DATA_TYPE__INT8
#define T_INT32 ONNX__TENSOR_PROTO__DATA_TYPE__INT32

typedef struct {
  int perm_h, perm_w, perm_c; /* a flat value whose ONNX order is (c, h, w), the graph's (h, w, c) */
  int container;              /* quantize outputs: T_UINT8 / T_INT8 */
  int pool_dq;                /* a dequantize whose output only a max pool reads, deferred to after it
                               * (op_pool): that dequantize node's index + 1, else 0 */
} value_info;

typedef struct {
  const qt_graph *g;
  const char *path;
  char *err;
  void **mem; /* the pool */
  size_t n_mem, cap_mem;
  Onnx__NodeProto **nodes;
  size_t n_nodes, cap_nodes;
  Onnx__TensorProto **inits;
  size_t n_inits, cap_inits;
  value_info *vi;
  const qt_node *node; /* being exported (messages) */
  qt_onnx_export_options opt;
  qt_onnx_export_info info;
} exporter;

/* "onnx export: <path>: node '<name>' (<op>): <what>" (without a node: "onnx export: <path>: <what>"); -1. */
int qt_exp_node_err(exporter *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Pool memory (zeroed), freed by qt_exp_pool_free. */
void *qt_exp_alloc(exporter *e, size_t n);
/* A formatted string in the pool. */
char *qt_exp_str(exporter *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void qt_exp_pool_free(exporter *e);
/* Initializers (raw data in the pool). */
Onnx__TensorProto *qt_exp_add_init(exporter *e, const char *name, int type, int ndim, const int64_t *dims,
                                   const void *data, size_t bytes);
void qt_exp_add_float(exporter *e, const char *name, int ndim, const int64_t *dims, const float *data, int64_t n);
void qt_exp_add_scalar_float(exporter *e, const char *name, float v);
void qt_exp_add_int64(exporter *e, const char *name, int ndim, const int64_t *dims, const int64_t *v, int64_t n);
void qt_exp_add_int8(exporter *e, const char *name, int type, int ndim, const int64_t *dims, const int32_t *v,
                     int64_t n);
/* A node with n_in input names (varargs) and one output. */
Onnx__NodeProto *qt_exp_add_node(exporter *e, const char *op_type, const char *name, const char *out, int n_in, ...);
/* Attributes of a node. */
Onnx__AttributeProto *qt_exp_add_attr(exporter *e, Onnx__NodeProto *n, const char *name);
void qt_exp_attr_int(exporter *e, Onnx__NodeProto *n, const char *name, int64_t v);
void qt_exp_attr_float(exporter *e, Onnx__NodeProto *n, const char *name, float v);
void qt_exp_attr_str(exporter *e, Onnx__NodeProto *n, const char *name, const char *v);
void qt_exp_attr_ints(exporter *e, Onnx__NodeProto *n, const char *name, int count, ...);
void qt_exp_attr_window(exporter *e, Onnx__NodeProto *n, const qt_node_attrs *a);

#endif
