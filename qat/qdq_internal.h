/* Private to the Q/DQ file code (docs/qdq_format.md), shared by its four parts:
 *   qdq_validate.c  what a file may hold: graph kinds, structure and quantization records,
 *                   checked on save (the graph in memory) and on load (the rebuilt graph),
 *                   driven by the op table (nn/ops.c)
 *   qdq_write.c     qt_qdq_save and the record writer
 *   qdq_read.c      qt_qdq_load and the record reader
 *   qstate_file.c   the quantization training state in checkpoints (qat/qstate_file.h)
 * Attributes and datasets go through base/h5.h; messages name the object ("/nodes/0003_conv1")
 * and the caller adds the file. */
#ifndef QT_QDQ_INTERNAL_H
#define QT_QDQ_INTERNAL_H

#include <hdf5.h>
#include <stddef.h>
#include <stdint.h>

#include "base/h5.h"
#include "qat/qat.h"

#define QDQ_FORMAT "qt-qdq-graph"
#define QDQ_VERSION 1
#define QDQ_MAX_NODES 1000000
#define QDQ_MAX_DIM ((int64_t)1 << 24)
#define QDQ_MAX_NUMEL ((int64_t)1 << 28) /* per tensor or per-sample value */
#define QDQ_MAX_CHANNELS (1 << 24)
#define QDQ_MAX_BITS 16
#define NODE_LINK_LEN (QT_NAME_LEN + 16)
/* The optional input description (qt_input_preprocessing). */
#define QDQ_INPUT_PRE_GROUP "input_preprocessing"
#define QDQ_INPUT_PRE_FORMULA "x[n, h, w, c] = (float32(raw[n, h, w, c]) / 255 - mean[c]) / std[c], in float32"

/* Node attributes naming the tensors in param[] / buffer[] slots (file keys, fixed by the
 * format; the tensors' own names carry the op table's PyTorch suffixes: conv_bn's BN gamma and
 * beta are its BatchNorm's weight and bias). */
extern const char *const qt_qdq_param_slot_names[QT_MAX_PARAMS];
extern const char *const qt_qdq_buffer_slot_names[QT_MAX_PARAMS];

/* What a file holds (root attribute `kind`): a convert graph (quantize/dequantize, integer
 * weights) or a prepared graph in eval mode (fake_quant, conv_bn, fake-quantized float weights). */
typedef enum { KIND_QDQ, KIND_PREPARED, KIND_COUNT } graph_kind;
extern const char *const qt_qdq_kind_names[KIND_COUNT];  /* "qdq", "prepared" */
extern const char *const qt_qdq_kind_titles[KIND_COUNT]; /* "Q/DQ graphs", "prepared graphs" */

/* The two kinds of quantization record, /quant/<name>/<node>. */
typedef enum { QDQ_RECORD_ACTIVATION, QDQ_RECORD_WEIGHT, QDQ_RECORD_COUNT } qdq_record_kind;
extern const char *const qt_qdq_record_names[QDQ_RECORD_COUNT]; /* "activation", "weight" */

/* ---- qdq_validate.c ------------------------------------------------------------------------- */
void qt_qdq_shape_str(char *buf, size_t n, int ndim, const int64_t *s);
/* Node names become HDF5 link names: not empty, not ".", no '/'. */
int qt_qdq_bad_link_name(const char *name);
/* The kind of an in-memory graph: prepared when any node is, else qdq (an fp32 graph is a
 * valid Q/DQ graph). A graph holding parts of both is refused. */
int qt_qdq_infer_kind(const qt_graph *g, graph_kind *kind, char *msg);
/* Shapes, ids, topological order and slots: everything but quantization records. */
int qt_qdq_validate_structure(const qt_graph *g, graph_kind kind, char *msg);
/* Tensor values (finite) and quantization records: ranges, channels, scales, zero points, integer
 * weights. */
int qt_qdq_validate_quant(const qt_graph *g, graph_kind kind, char *msg);
/* The quantization axis of a record: -1 per tensor; weights: 0 (OIHW output channels);
 * activations: the last axis of the (N, ...) tensor, the channel of NHWC. */
int qt_qdq_record_axis(const qt_qspec *s, int is_weight, int value_ndim);

/* ---- qdq_write.c ---------------------------------------------------------------------------- */
typedef struct {
  char where[2 * QT_NAME_LEN + 64];
} writer;

/* Integer weights are stored in the narrowest type holding [qmin, qmax]. */
typedef enum { WI_U8, WI_I8, WI_I16, WI_I32 } weight_int_kind;

/* One quantization record of node `node`; with_state adds the training state (checkpoints). */
int qt_qdq_write_qrecord(writer *w, hid_t parent, const qt_graph *g, int node, const qt_qstate *q, int is_weight,
                         int with_state);

/* ---- qdq_read.c ----------------------------------------------------------------------------- */
/* Reads /quant/<kind>/<node name> of node `node` of g into a new qstate (*out); weight records
 * hold integer weights in Q/DQ graphs and none in prepared graphs. */
int qt_qdq_read_qrecord_new(hid_t parent, qdq_record_kind kind, graph_kind graph, const qt_graph *g, int node,
                            qt_qstate **out, char *msg);
/* Every record in /quant/<kind> must belong to a node that has it. */
int qt_qdq_check_records_claimed(hid_t gk, qdq_record_kind kind, const qt_graph *g, char *msg);

/* Attribute and dataset readers (base/h5.h without a file prefix: the caller adds it). */
static inline int read_attr_ints(hid_t loc, const char *obj, const char *name, int *v, int min_n, int max_n, int *n,
                                 char *msg) {
  return qt_h5_attr_read_ints(loc, NULL, obj, name, v, min_n, max_n, n, msg);
}
static inline int read_attr_int(hid_t loc, const char *obj, const char *name, int *v, char *msg) {
  return qt_h5_attr_read_int(loc, NULL, obj, name, v, msg);
}
static inline int read_attr_flag(hid_t loc, const char *obj, const char *name, int *v, char *msg) {
  if (read_attr_int(loc, obj, name, v, msg)) return -1;
  return *v == 0 || *v == 1 ? 0 : qt_err(msg, "%s: attribute '%s' is %d, want 0 or 1", obj, name, *v);
}
static inline int read_attr_float(hid_t loc, const char *obj, const char *name, float *v, char *msg) {
  return qt_h5_attr_read_float(loc, NULL, obj, name, v, msg);
}
static inline int read_attr_str(hid_t loc, const char *obj, const char *name, char *buf, size_t cap, char *msg) {
  return qt_h5_attr_read_str(loc, NULL, obj, name, buf, cap, msg);
}
static inline void *qdq_read_dataset(hid_t loc, const char *obj, const char *name, H5T_class_t cls, hid_t mtype,
                                     int want_ndim, const int64_t *want_dims, int max_ndim, int *ndim_out,
                                     int64_t *dims_out, char *msg) {
  return qt_h5_dataset_read(loc, NULL, obj, name, cls, mtype, want_ndim, want_dims, max_ndim, QDQ_MAX_NUMEL, ndim_out,
                            dims_out, msg);
}
static inline hid_t qdq_group_open(hid_t loc, const char *obj, const char *name, char *msg) {
  return qt_h5_group_open(loc, NULL, obj, name, msg);
}

#endif
