/* Reading the Q/DQ graph file (docs/qdq_format.md): qt_qdq_load rebuilds the graph with the
 * graph builder and validates everything an executor would trust (op names, value ids and
 * their order, tensor shapes against each op, quantization ranges, scales, integer weights).
 * The root attribute `kind` says which of the two graphs a file holds; each kind admits only its
 * own ops and records, so a reader of Q/DQ graphs never mistakes fake-quantized float weights
 * for integer ones. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qat/qdq_internal.h"
#include "base/h5.h"
#include "base/base.h"

/* ---- reading ------------------------------------------------------------------------------ */

/* Number of links in a group, bounded. */
static int group_count(hid_t g, const char *obj, int max, char *msg) {
  H5G_info_t info;
  if (H5Gget_info(g, &info) < 0) return qt_err(msg, "%s: cannot list the group (corrupt file?)", obj);
  if (info.nlinks > (hsize_t)max)
    return qt_err(msg, "%s: %llu entries, more than %d", obj, (unsigned long long)info.nlinks, max);
  return (int)info.nlinks;
}

/* The names of a group's links, in HDF5's native order (not sorted): H5Literate walks the
 * link index directly. (H5Lget_name_by_idx in name order builds a sorted table instead, and
 * HDF5 1.10.8 frees uninitialized entries of that table when a corrupt link fails to decode.)
 * Returns n names of `stride` bytes each in a new buffer, or NULL. */
typedef struct {
  char *names;
  int n, max;
  size_t stride;
  int too_long;
} link_list;

static herr_t link_list_add(hid_t g, const char *name, const H5L_info_t *info, void *data) {
  (void)g;
  (void)info;
  link_list *l = data;
  if (l->n >= l->max) return -1;
  if (strlen(name) >= l->stride) {
    l->too_long = 1;
    return -1;
  }
  memcpy(l->names + (size_t)l->n * l->stride, name, strlen(name) + 1);
  l->n++;
  return 0;
}

static char *list_links(hid_t g, const char *obj, int count, size_t stride, char *msg) {
  link_list l = {.names = calloc((size_t)count + 1, stride), .max = count, .stride = stride};
  QT_ASSERT(l.names, "out of memory listing %d links", count);
  hsize_t idx = 0;
  herr_t r = H5Literate(g, H5_INDEX_NAME, H5_ITER_NATIVE, &idx, link_list_add, &l);
  if (r < 0 || l.n != count) {
    if (l.too_long)
      qt_err(msg, "%s: an entry has a name longer than %zu characters", obj, stride - 1);
    else
      qt_err(msg, "%s: cannot list the entries (corrupt file?)", obj);
    free(l.names);
    return NULL;
  }
  return l.names;
}

typedef struct {
  qt_op op;
  char name[QT_NAME_LEN];
  int inputs[QT_MAX_INPUTS], n_inputs, output, bn_frozen;
  qt_node_attrs attr;
  char param[QT_MAX_PARAMS][2 * QT_NAME_LEN], buffer[QT_MAX_PARAMS][2 * QT_NAME_LEN];
  int seen;
} node_rec;

typedef struct {
  char name[2 * QT_NAME_LEN];
  int node, is_buffer, ndim, seen;
  int64_t shape[4];
} tensor_rec;

/* A node group's identity: attributes index and name as its link name `<index>_<name>` says,
 * and a known op. */
static int read_node_identity(hid_t g, const char *obj, long idx, const char *link_name, node_rec *r, char *msg) {
  int index = -1;
  char op[64];
  if (read_attr_int(g, obj, "index", &index, msg) || read_attr_str(g, obj, "name", r->name, sizeof r->name, msg) ||
      read_attr_str(g, obj, "op", op, sizeof op, msg))
    return -1;
  if (index != idx) return qt_err(msg, "%s: attribute index is %d, the group name says %ld", obj, index, idx);
  if (qt_qdq_bad_link_name(r->name)) return qt_err(msg, "%s: node name '%s' is empty, '.' or holds '/'", obj, r->name);
  if (strcmp(link_name, r->name) != 0)
    return qt_err(msg, "%s: attribute name is '%s', the group name says '%s'", obj, r->name, link_name);
  if (qt_op_parse(op, &r->op)) return qt_err(msg, "node %d '%s': unknown op '%s'", index, r->name, op);
  return 0;
}

/* A node's value ids, op attributes and the slot attributes it has. */
static int read_node_attrs(hid_t g, const char *obj, node_rec *r, char *msg) {
  qt_node_attrs *a = &r->attr;
  if (read_attr_ints(g, obj, "inputs", r->inputs, 0, QT_MAX_INPUTS, &r->n_inputs, msg) ||
      read_attr_int(g, obj, "output", &r->output, msg) || read_attr_int(g, obj, "kernel_h", &a->kernel_h, msg) ||
      read_attr_int(g, obj, "kernel_w", &a->kernel_w, msg) || read_attr_int(g, obj, "stride_h", &a->stride_h, msg) ||
      read_attr_int(g, obj, "stride_w", &a->stride_w, msg) || read_attr_int(g, obj, "pad_h", &a->pad_h, msg) ||
      read_attr_int(g, obj, "pad_w", &a->pad_w, msg) || read_attr_int(g, obj, "groups", &a->groups, msg) ||
      read_attr_int(g, obj, "out_channels", &a->out_channels, msg) || read_attr_float(g, obj, "eps", &a->eps, msg) ||
      read_attr_float(g, obj, "momentum", &a->momentum, msg) || read_attr_flag(g, obj, "bn_frozen", &r->bn_frozen, msg))
    return -1;
  if (r->op == QT_OP_ACTIVATION) { /* its kind by name, and its parameters */
    char act[QT_NAME_LEN];
    qt_act_kind kind;
    if (read_attr_str(g, obj, "act", act, sizeof act, msg) || read_attr_float(g, obj, "alpha", &a->alpha, msg) ||
        read_attr_float(g, obj, "beta", &a->beta, msg))
      return -1;
    if (qt_act_parse(act, &kind)) return qt_err(msg, "%s: unknown activation '%s'", obj, act);
    a->act = (int)kind;
  }
  if ((r->op == QT_OP_MAX_POOL2D || r->op == QT_OP_AVG_POOL2D) && H5Aexists(g, "ceil") > 0 &&
      read_attr_flag(g, obj, "ceil", &a->ceil, msg))
    return -1;
  if (r->op == QT_OP_CHANNEL_SLICE &&
      (read_attr_int(g, obj, "begin", &a->begin, msg) || read_attr_int(g, obj, "end", &a->end, msg)))
    return -1;
  if (r->op == QT_OP_ATTENTION && read_attr_int(g, obj, "heads", &a->heads, msg)) return -1;
  if (r->op == QT_OP_DROPOUT && read_attr_float(g, obj, "ratio", &a->ratio, msg)) return -1;
  if (r->op == QT_OP_RESIZE) { /* its mode by name */
    char mode[QT_NAME_LEN];
    if (read_attr_str(g, obj, "mode", mode, sizeof mode, msg)) return -1;
    if (strcmp(mode, "nearest") && strcmp(mode, "bilinear"))
      return qt_err(msg, "%s: resize mode '%s' (nearest or bilinear)", obj, mode);
    a->mode = strcmp(mode, "bilinear") == 0 ? QT_RESIZE_BILINEAR : QT_RESIZE_NEAREST;
  }
  for (int k = 0; k < QT_MAX_PARAMS; k++) {
    if (H5Aexists(g, qt_qdq_param_slot_names[k]) != 0 &&
        read_attr_str(g, obj, qt_qdq_param_slot_names[k], r->param[k], sizeof r->param[k], msg))
      return -1;
    if (H5Aexists(g, qt_qdq_buffer_slot_names[k]) != 0 &&
        read_attr_str(g, obj, qt_qdq_buffer_slot_names[k], r->buffer[k], sizeof r->buffer[k], msg))
      return -1;
  }
  return 0;
}

/* The node group `link` of /nodes into recs[index]. */
static int read_node(hid_t gn, const char *link, int n_nodes, node_rec *recs, char *msg) {
  char obj[QT_NAME_LEN + 64];
  snprintf(obj, sizeof obj, "/nodes/%s", link);
  char *end = NULL;
  long idx = strtol(link, &end, 10);
  if (end == link || *end != '_' || idx < 0 || idx >= n_nodes)
    return qt_err(msg, "%s: a node group must be named <index>_<name> with index < %d", obj, n_nodes);
  node_rec *r = &recs[idx];
  if (r->seen) return qt_err(msg, "%s: a second group for node %ld", obj, idx);
  r->seen = 1;
  hid_t g = qdq_group_open(gn, "/nodes", link, msg);
  if (g < 0) return -1;
  const int rc = read_node_identity(g, obj, idx, end + 1, r, msg) || read_node_attrs(g, obj, r, msg) ? -1 : 0;
  H5Gclose(g);
  return rc;
}

static int read_tensor(hid_t gt, const char *name, int n_tensors, int n_nodes, tensor_rec *recs, char *msg) {
  char obj[2 * QT_NAME_LEN + 16];
  snprintf(obj, sizeof obj, "/tensors/%s", name);
  hid_t d = H5Dopen2(gt, name, H5P_DEFAULT);
  if (d < 0) return qt_err(msg, "%s: not a readable dataset (corrupt file?)", obj);
  int index = -1, node = -1, is_buffer = 0;
  int bad = read_attr_int(d, obj, "index", &index, msg) || read_attr_int(d, obj, "node", &node, msg) ||
            read_attr_flag(d, obj, "is_buffer", &is_buffer, msg);
  H5Dclose(d);
  if (bad) return -1;
  if (index < 0 || index >= n_tensors)
    return qt_err(msg, "%s: index %d out of range (%d tensors)", obj, index, n_tensors);
  if (node < 0 || node >= n_nodes) return qt_err(msg, "%s: owner node %d out of range (%d nodes)", obj, node, n_nodes);
  tensor_rec *r = &recs[index];
  if (r->seen) return qt_err(msg, "%s: index %d is taken by '%s'", obj, index, r->name);
  r->seen = 1;
  snprintf(r->name, sizeof r->name, "%s", name);
  r->node = node;
  r->is_buffer = is_buffer;
  /* the shape only: the data is read once the graph is validated, and only for the tensors its
   * nodes use */
  return qt_h5_dataset_shape(gt, NULL, "/tensors", name, H5T_FLOAT, 4, QDQ_MAX_NUMEL, &r->ndim, r->shape, msg);
}

/* A record's attributes into s: the owner node (which must be `node`), the spec, the axis and
 * the number of channels. */
static int read_record_attrs(hid_t r, const char *obj, int node, qt_qspec *s, int *axis, int *channels, char *msg) {
  int at_node = -1;
  char observer[64], method[64];
  if (read_attr_int(r, obj, "node", &at_node, msg) || read_attr_int(r, obj, "bits", &s->bits, msg) ||
      read_attr_int(r, obj, "qmin", &s->qmin, msg) || read_attr_int(r, obj, "qmax", &s->qmax, msg) ||
      read_attr_flag(r, obj, "signed", &s->is_signed, msg) || read_attr_flag(r, obj, "symmetric", &s->symmetric, msg) ||
      read_attr_flag(r, obj, "per_channel", &s->per_channel, msg) || read_attr_int(r, obj, "axis", axis, msg) ||
      read_attr_int(r, obj, "channels", channels, msg) ||
      read_attr_str(r, obj, "observer", observer, sizeof observer, msg) ||
      read_attr_str(r, obj, "method", method, sizeof method, msg) ||
      read_attr_float(r, obj, "percentile", &s->percentile, msg))
    return -1;
  if (at_node != node)
    return qt_err(msg, "%s: attribute node is %d, the record belongs to node %d", obj, at_node, node);
  if (qt_observer_kind_parse(observer, &s->observer) || qt_range_method_parse(method, &s->method))
    return qt_err(msg, "%s: unknown observer '%s' or range method '%s'", obj, observer, method);
  return 0;
}

/* The axis the record's spec implies for its node's value, and a bounded channel count. */
static int check_record_layout(const qt_graph *g, const qt_node *n, qdq_record_kind kind, const qt_qspec *s, int axis,
                               int channels, const char *obj, char *msg) {
  const int is_weight = kind == QDQ_RECORD_WEIGHT;
  const qt_value *x = &g->values[n->n_inputs ? n->inputs[0] : n->output];
  const int want = qt_qdq_record_axis(s, is_weight, x->ndim);
  if (axis != want)
    return qt_err(msg, "%s: axis %d, want %d for a %s %s record", obj, axis, want,
                  s->per_channel ? "per-channel" : "per-tensor", qt_qdq_record_names[kind]);
  if (channels < 1 || channels > QDQ_MAX_CHANNELS) return qt_err(msg, "%s: channels %d out of range", obj, channels);
  return 0;
}

/* What a weight record reads besides its qparams: integer weights and biases (Q/DQ graphs). */
typedef struct {
  int32_t *qweight, *qbias;
  int64_t n_qweight, n_qbias;
} weight_ints;

/* The optional attribute `bias` (int32 or float) into s->bias_int32. */
static int read_bias_attr(hid_t r, const char *obj, qt_qspec *s, char *msg) {
  htri_t has_bias = H5Aexists(r, "bias");
  if (has_bias < 0) return qt_err(msg, "%s: cannot look up attribute 'bias' (corrupt file?)", obj);
  if (!has_bias) return 0;
  char bias[16];
  if (read_attr_str(r, obj, "bias", bias, sizeof bias, msg)) return -1;
  if (strcmp(bias, "int32") != 0 && strcmp(bias, "float") != 0)
    return qt_err(msg, "%s: attribute bias is '%s', want 'int32' or 'float'", obj, bias);
  s->bias_int32 = strcmp(bias, "int32") == 0;
  return 0;
}

/* `bias_int`: required in a Q/DQ graph's record with bias = int32 on a node with a bias,
 * refused anywhere else. */
static int read_bias_int(hid_t r, const char *obj, graph_kind graph, const qt_graph *g, const qt_node *n,
                         const qt_qspec *s, weight_ints *wi, char *msg) {
  htri_t has_qb = H5Lexists(r, "bias_int", H5P_DEFAULT);
  if (has_qb < 0) return qt_err(msg, "%s: cannot look up dataset 'bias_int' (corrupt file?)", obj);
  if (has_qb && (graph == KIND_PREPARED || !s->bias_int32 || n->param[QT_P_BIAS] < 0))
    return qt_err(msg, "%s: holds 'bias_int', but %s", obj,
                  graph == KIND_PREPARED
                      ? "a prepared graph fake-quantizes its float bias (kind 'prepared' has no integer biases)"
                  : !s->bias_int32 ? "its attribute bias does not say int32"
                                   : "the node has no bias");
  if (graph == KIND_PREPARED || !s->bias_int32 || n->param[QT_P_BIAS] < 0) return 0;
  const int64_t oc[1] = {g->tensors[n->param[QT_P_BIAS]].numel};
  if (!(wi->qbias = qdq_read_dataset(r, obj, "bias_int", H5T_INTEGER, H5T_NATIVE_INT32, 1, oc, 1, NULL, NULL, msg)))
    return -1;
  wi->n_qbias = oc[0];
  return 0;
}

/* The quantized tensor (the node's weight) and `weight_int`: required in a Q/DQ graph, refused
 * in a prepared one. */
static int read_weight_int(hid_t r, const char *obj, graph_kind graph, const qt_graph *g, int node, weight_ints *wi,
                           char *msg) {
  const qt_node *n = &g->nodes[node];
  if (n->param[QT_P_WEIGHT] < 0)
    return qt_err(msg, "%s: node %d '%s' (%s) has no weight to quantize", obj, node, n->name, qt_op_name(n->op));
  const qt_param *W = &g->tensors[n->param[QT_P_WEIGHT]];
  char tensor[2 * QT_NAME_LEN];
  if (read_attr_str(r, obj, "tensor", tensor, sizeof tensor, msg)) return -1;
  if (strcmp(tensor, W->name) != 0)
    return qt_err(msg, "%s: quantizes tensor '%s', the node's weight is '%s'", obj, tensor, W->name);
  if (graph == KIND_PREPARED) {
    htri_t has = H5Lexists(r, "weight_int", H5P_DEFAULT);
    if (has != 0)
      return qt_err(msg,
                    has < 0 ? "%s: cannot look up dataset 'weight_int' (corrupt file?)"
                            : "%s: holds 'weight_int', but a prepared graph fake-quantizes its float weight (kind "
                              "'prepared' has no integer weights)",
                    obj);
    return 0;
  }
  if (!(wi->qweight = qdq_read_dataset(r, obj, "weight_int", H5T_INTEGER, H5T_NATIVE_INT32, W->ndim, W->shape, 4, NULL,
                                       NULL, msg)))
    return -1;
  wi->n_qweight = W->numel;
  return 0;
}

/* A weight record's parts after its qparams: bias attribute, integer biases, tensor, integer
 * weights. */
static int read_weight_parts(hid_t r, const char *obj, graph_kind graph, const qt_graph *g, int node, qt_qspec *s,
                             weight_ints *wi, char *msg) {
  if (read_bias_attr(r, obj, s, msg) || read_bias_int(r, obj, graph, g, &g->nodes[node], s, wi, msg)) return -1;
  return read_weight_int(r, obj, graph, g, node, wi, msg);
}

/* A loaded record: calibrated, observer off, fake quant on, owning the integers of wi. */
static qt_qstate *record_state(const qt_qspec *s, int channels, const float *scale, const int32_t *zp, weight_ints *wi,
                               const char *obj, char *msg) {
  char cerr[QT_ERR_LEN];
  qt_qstate *q = qt_qstate_create(s, channels, cerr);
  if (!q) {
    qt_err(msg, "%s: %s", obj, cerr);
    return NULL;
  }
  memcpy(q->scale, scale, (size_t)channels * sizeof(float));
  memcpy(q->zero_point, zp, (size_t)channels * sizeof(int32_t));
  q->calibrated = 1;
  q->observe = 0;
  q->fake_quant = 1;
  q->qweight = wi->qweight;
  q->n_qweight = wi->n_qweight;
  q->qbias = wi->qbias;
  q->n_qbias = wi->n_qbias;
  *wi = (weight_ints){0};
  return q;
}

/* Reads /quant/<kind>/<node name> of node `node` of g into a new qstate (*out); weight records
 * hold integer weights in Q/DQ graphs and none in prepared graphs. read_qrecord puts it on the
 * node. */
int qt_qdq_read_qrecord_new(hid_t parent, qdq_record_kind kind, graph_kind graph, const qt_graph *g, int node,
                            qt_qstate **out, char *msg) {
  const qt_node *n = &g->nodes[node];
  char obj[QT_NAME_LEN + 32];
  snprintf(obj, sizeof obj, "/quant/%s/%s", qt_qdq_record_names[kind], n->name);
  hid_t r = qdq_group_open(parent, "/quant", n->name, msg);
  if (r < 0) return -1;
  int rc = -1, axis = 0, channels = 0;
  qt_qspec s;
  memset(&s, 0, sizeof s);
  float *scale = NULL;
  int32_t *zp = NULL;
  weight_ints wi = {0};
  if (read_record_attrs(r, obj, node, &s, &axis, &channels, msg) ||
      check_record_layout(g, n, kind, &s, axis, channels, obj, msg))
    goto done;
  const int64_t ch[1] = {channels};
  if (!(scale = qdq_read_dataset(r, obj, "scale", H5T_FLOAT, H5T_NATIVE_FLOAT, 1, ch, 1, NULL, NULL, msg)) ||
      !(zp = qdq_read_dataset(r, obj, "zero_point", H5T_INTEGER, H5T_NATIVE_INT32, 1, ch, 1, NULL, NULL, msg)))
    goto done;
  if (kind == QDQ_RECORD_WEIGHT && read_weight_parts(r, obj, graph, g, node, &s, &wi, msg)) goto done;
  qt_qstate *q = record_state(&s, channels, scale, zp, &wi, obj, msg);
  if (!q) goto done;
  *out = q;
  rc = 0;
done:
  QT_FREE_ALL(scale, zp, wi.qweight, wi.qbias);
  H5Gclose(r);
  return rc;
}

static int read_qrecord(hid_t parent, qdq_record_kind kind, graph_kind graph, qt_graph *g, int node, char *msg) {
  qt_qstate *q = NULL;
  if (qt_qdq_read_qrecord_new(parent, kind, graph, g, node, &q, msg)) return -1;
  if (kind == QDQ_RECORD_WEIGHT)
    g->nodes[node].wq = q;
  else
    g->nodes[node].q = q;
  return 0;
}

/* Every record in /quant/<kind> must belong to a node that has it. */
int qt_qdq_check_records_claimed(hid_t gk, qdq_record_kind kind, const qt_graph *g, char *msg) {
  char obj[32];
  snprintf(obj, sizeof obj, "/quant/%s", qt_qdq_record_names[kind]);
  int count = group_count(gk, obj, QDQ_MAX_NODES, msg);
  char *names = count < 0 ? NULL : list_links(gk, obj, count, QT_NAME_LEN, msg);
  if (!names) return -1;
  int rc = 0;
  for (int k = 0; k < count && !rc; k++) {
    const char *name = names + (size_t)k * QT_NAME_LEN;
    int i = qt_graph_find_node(g, name);
    if (i < 0 || !(kind == QDQ_RECORD_WEIGHT ? g->nodes[i].wq : g->nodes[i].q))
      rc = qt_err(msg, "%s/%s: a record for no node of that name", obj, name);
  }
  free(names);
  return rc;
}

/* The optional /input_preprocessing group: absent means not recorded. */
static int read_input_preprocessing(hid_t f, qt_graph *g, char *msg) {
  const char *obj = "/" QDQ_INPUT_PRE_GROUP;
  htri_t has = H5Lexists(f, QDQ_INPUT_PRE_GROUP, H5P_DEFAULT);
  if (has < 0) return qt_err(msg, "%s: cannot look up the group (corrupt file?)", obj);
  if (!has) return 0;
  hid_t gp = qdq_group_open(f, "/", QDQ_INPUT_PRE_GROUP, msg);
  if (gp < 0) return -1;
  const qt_value *x = &g->values[g->input];
  qt_input_preprocessing p = {.set = 1, .channels = (int)x->shape[2]};
  char layout[16];
  int shape[3] = {0, 0, 0}, rc = -1;
  float raw_min = 0, raw_max = 0, divisor = 0;
  if (p.channels > QT_MAX_INPUT_CHANNELS) {
    qt_err(msg, "%s: the input has %d channels, this build reads up to %d", obj, p.channels, QT_MAX_INPUT_CHANNELS);
    goto done;
  }
  if (read_attr_str(gp, obj, "layout", layout, sizeof layout, msg) ||
      read_attr_ints(gp, obj, "shape", shape, 3, 3, NULL, msg) || read_attr_float(gp, obj, "raw_min", &raw_min, msg) ||
      read_attr_float(gp, obj, "raw_max", &raw_max, msg) || read_attr_float(gp, obj, "divisor", &divisor, msg) ||
      qt_h5_attr_read_floats(gp, NULL, obj, "mean", p.mean, p.channels, msg) ||
      qt_h5_attr_read_floats(gp, NULL, obj, "std", p.std, p.channels, msg))
    goto done;
  if (strcmp(layout, "NHWC") != 0) {
    qt_err(msg, "%s: layout '%s', expected 'NHWC'", obj, layout);
    goto done;
  }
  if (shape[0] != x->shape[0] || shape[1] != x->shape[1] || shape[2] != x->shape[2]) {
    qt_err(msg, "%s: shape (%d, %d, %d), expected the input's (%lld, %lld, %lld)", obj, shape[0], shape[1], shape[2],
           (long long)x->shape[0], (long long)x->shape[1], (long long)x->shape[2]);
    goto done;
  }
  if (raw_min != 0.0f || raw_max != 255.0f || divisor != 255.0f) {
    qt_err(msg, "%s: raw range [%g, %g] / %g, expected [0, 255] / 255", obj, raw_min, raw_max, divisor);
    goto done;
  }
  if (qt_input_preprocessing_check(g, &p, msg)) goto done;
  g->input_pre = p;
  rc = 0;
done:
  H5Gclose(gp);
  return rc;
}

/* A prepared graph's learned (LSQ) scale, which no slot names: "<fake_quant>.scale" of one
 * element, or "<conv/linear/conv_bn>.weight_scale" of 1 or out-channels elements. */
static int lsq_scale_tensor(const qt_graph *g, const qt_node *n, const qt_param *p) {
  const char *suffix = p->name + strlen(n->name) + 1;
  if (n->op == QT_OP_FAKE_QUANT && strcmp(suffix, "scale") == 0) return p->ndim == 1 && p->numel == 1;
  if (!qt_op_has_weight(n->op) || strcmp(suffix, "weight_scale") != 0 || n->param[QT_P_WEIGHT] < 0) return 0;
  return p->ndim == 1 && (p->numel == 1 || p->numel == g->tensors[n->param[QT_P_WEIGHT]].shape[0]);
}

/* The root attributes. */
typedef struct {
  char name[QT_NAME_LEN];
  graph_kind kind;
  int input, output, n_nodes, n_values, n_tensors;
} root_attrs;

/* /values as the file declares it (parallel arrays by value id), checked against the rebuilt
 * graph. */
typedef struct {
  int n;
  char *name; /* n names of QT_NAME_LEN bytes */
  int *ndim, *producer;
  int64_t *shape; /* (n, 3) */
} value_table;

/* What load_graph has read so far. */
typedef struct {
  root_attrs root;
  node_rec *nodes;
  int n_nodes;
  value_table values;
  hid_t gt; /* /tensors, open until the tensor data is read */
  tensor_rec *tensors;
  int n_tensors;
  qt_graph *g;
} loader;

/* The root attribute `kind`; absent means qdq (files written before it existed hold Q/DQ
 * graphs). */
static int read_kind(hid_t f, graph_kind *kind, char *msg) {
  *kind = KIND_QDQ;
  htri_t has = H5Aexists(f, "kind");
  char ks[64];
  if (has < 0) return qt_err(msg, "/: cannot read the attributes (corrupt file: checksum or decoding failed)");
  if (!has) return 0;
  if (read_attr_str(f, "/", "kind", ks, sizeof ks, msg)) return -1;
  for (int k = 0; k < KIND_COUNT; k++)
    if (strcmp(ks, qt_qdq_kind_names[k]) == 0) {
      *kind = (graph_kind)k;
      return 0;
    }
  return qt_err(msg, "kind is '%s', want '%s' or '%s'", ks, qt_qdq_kind_names[KIND_QDQ],
                qt_qdq_kind_names[KIND_PREPARED]);
}

/* format, format_version, kind, name, the graph's input and output and the counts. */
static int read_root(hid_t f, root_attrs *r, char *msg) {
  char format[64];
  int version = 0;
  if (read_attr_str(f, "/", "format", format, sizeof format, msg))
    return qt_err(msg, "no 'format' attribute: not a Q/DQ graph file");
  if (strcmp(format, QDQ_FORMAT) != 0) return qt_err(msg, "format is '%s', want '%s'", format, QDQ_FORMAT);
  if (read_attr_int(f, "/", "format_version", &version, msg)) return -1;
  if (version != QDQ_VERSION)
    return qt_err(msg, "format version %d; this build reads version %d", version, QDQ_VERSION);
  if (read_kind(f, &r->kind, msg)) return -1;
  if (read_attr_str(f, "/", "name", r->name, sizeof r->name, msg) || read_attr_int(f, "/", "input", &r->input, msg) ||
      read_attr_int(f, "/", "output", &r->output, msg) || read_attr_int(f, "/", "n_nodes", &r->n_nodes, msg) ||
      read_attr_int(f, "/", "n_values", &r->n_values, msg) || read_attr_int(f, "/", "n_tensors", &r->n_tensors, msg))
    return -1;
  if (!r->name[0]) return qt_err(msg, "/: attribute 'name' is empty (the graph's name)");
  return 0;
}

/* /nodes: one group per node, as many as n_nodes says. */
static int read_nodes(hid_t f, loader *ld, char *msg) {
  hid_t gn = qdq_group_open(f, "/", "nodes", msg);
  if (gn < 0) return -1;
  char *links = NULL;
  int rc = -1;
  if ((ld->n_nodes = group_count(gn, "/nodes", QDQ_MAX_NODES, msg)) < 0) goto done;
  if (ld->n_nodes != ld->root.n_nodes || ld->n_nodes < 1) {
    qt_err(msg, "/nodes holds %d groups, attribute n_nodes says %d", ld->n_nodes, ld->root.n_nodes);
    goto done;
  }
  ld->nodes = calloc((size_t)ld->n_nodes, sizeof *ld->nodes);
  QT_ASSERT(ld->nodes, "out of memory");
  if (!(links = list_links(gn, "/nodes", ld->n_nodes, NODE_LINK_LEN, msg))) goto done;
  for (int k = 0; k < ld->n_nodes; k++)
    if (read_node(gn, links + (size_t)k * NODE_LINK_LEN, ld->n_nodes, ld->nodes, msg)) goto done;
  rc = 0;
done:
  free(links);
  H5Gclose(gn);
  return rc;
}

/* /values/name: fixed-length strings of QT_NAME_LEN bytes. */
static char *read_value_names(hid_t gv, const int64_t *want_n, char *msg) {
  hid_t st = H5Tcopy(H5T_C_S1);
  if (st < 0 || H5Tset_size(st, QT_NAME_LEN) < 0 || H5Tset_strpad(st, H5T_STR_NULLTERM) < 0) {
    qt_err(msg, "/values: cannot make a string type");
    if (st >= 0) H5Tclose(st);
    return NULL;
  }
  char *names = qdq_read_dataset(gv, "/values", "name", H5T_STRING, st, 1, want_n, 1, NULL, NULL, msg);
  H5Tclose(st);
  return names;
}

/* /values: ndim (as many entries as n_values says), producer, shape, name; ranks 1..3. */
static int read_value_table(hid_t gv, int a_values, value_table *vt, char *msg) {
  int64_t vd[8];
  int vnd = 0;
  if (!(vt->ndim = qdq_read_dataset(gv, "/values", "ndim", H5T_INTEGER, H5T_NATIVE_INT, 0, NULL, 1, &vnd, vd, msg)))
    return -1;
  vt->n = (int)vd[0];
  if (vt->n != a_values) return qt_err(msg, "/values/ndim has %d entries, attribute n_values says %d", vt->n, a_values);
  const int64_t want_n[1] = {vt->n}, want_s[2] = {vt->n, 3};
  if (!(vt->producer =
            qdq_read_dataset(gv, "/values", "producer", H5T_INTEGER, H5T_NATIVE_INT, 1, want_n, 1, NULL, NULL, msg)) ||
      !(vt->shape =
            qdq_read_dataset(gv, "/values", "shape", H5T_INTEGER, H5T_NATIVE_INT64, 2, want_s, 2, NULL, NULL, msg)) ||
      !(vt->name = read_value_names(gv, want_n, msg)))
    return -1;
  for (int v = 0; v < vt->n; v++) {
    vt->name[(size_t)v * QT_NAME_LEN + QT_NAME_LEN - 1] = 0;
    if (vt->ndim[v] < 1 || vt->ndim[v] > 3)
      return qt_err(msg, "/values: value %d has rank %d, want 1..3", v, vt->ndim[v]);
  }
  return 0;
}

static int read_values(hid_t f, loader *ld, char *msg) {
  hid_t gv = qdq_group_open(f, "/", "values", msg);
  if (gv < 0) return -1;
  int rc = read_value_table(gv, ld->root.n_values, &ld->values, msg);
  H5Gclose(gv);
  return rc;
}

/* /tensors: every dataset's attributes and shape (the data comes later, read_tensor_data). */
static int read_tensor_table(hid_t f, loader *ld, char *msg) {
  if ((ld->gt = qdq_group_open(f, "/", "tensors", msg)) < 0 ||
      (ld->n_tensors = group_count(ld->gt, "/tensors", 4 * QDQ_MAX_NODES, msg)) < 0)
    return -1;
  if (ld->n_tensors != ld->root.n_tensors)
    return qt_err(msg, "/tensors holds %d datasets, attribute n_tensors says %d", ld->n_tensors, ld->root.n_tensors);
  ld->tensors = calloc((size_t)ld->n_tensors + 1, sizeof *ld->tensors);
  QT_ASSERT(ld->tensors, "out of memory");
  char *links = list_links(ld->gt, "/tensors", ld->n_tensors, 2 * QT_NAME_LEN, msg);
  if (!links) return -1;
  int rc = 0;
  for (int k = 0; k < ld->n_tensors && !rc; k++)
    rc = read_tensor(ld->gt, links + (size_t)k * 2 * QT_NAME_LEN, ld->n_tensors, ld->n_nodes, ld->tensors, msg);
  free(links);
  return rc;
}

/* Node i of the file added to g with the builder: its value ids in range and in topological
 * order, its output the value the builder gives it. */
static int add_node(qt_graph *g, int i, node_rec *r, const value_table *vt, char *msg) {
  for (int k = 0; k < r->n_inputs; k++)
    if (r->inputs[k] < 0 || r->inputs[k] >= g->n_values) {
      if (r->inputs[k] < 0 || r->inputs[k] >= vt->n)
        return qt_err(msg, "node %d '%s': input value id %d out of range (%d values)", i, r->name, r->inputs[k], vt->n);
      return qt_err(msg,
                    "node %d '%s': input value %d is produced by a later node (nodes must be in topological order)", i,
                    r->name, r->inputs[k]);
    }
  if (r->output < 0 || r->output >= vt->n)
    return qt_err(msg, "node %d '%s': output value id %d out of range (%d values)", i, r->name, r->output, vt->n);
  const int o = r->output;
  if (qt_graph_add_node(g, r->op, r->name, r->inputs, r->n_inputs, &r->attr, vt->ndim[o], vt->shape + (size_t)o * 3) <
      0)
    return qt_err(msg, "node %d '%s': %s", i, r->name, g->error);
  if (g->nodes[i].output != o)
    return qt_err(msg, "node %d '%s': output value id %d, but it produces value %d (one value per node, in node order)",
                  i, r->name, o, g->nodes[i].output);
  g->nodes[i].bn_frozen = r->bn_frozen;
  return 0;
}

/* The values table against the rebuilt graph's values, then the graph's input and output. */
static int check_value_table(qt_graph *g, const root_attrs *root, const value_table *vt, int n_nodes, char *msg) {
  if (g->n_values != vt->n)
    return qt_err(msg, "/values has %d entries, the %d nodes produce %d", vt->n, n_nodes, g->n_values);
  for (int v = 0; v < vt->n; v++) {
    const qt_value *val = &g->values[v];
    const char *name = vt->name + (size_t)v * QT_NAME_LEN;
    int same = strcmp(val->name, name) == 0 && vt->producer[v] == val->producer;
    for (int d = 0; d < 3; d++) same = same && vt->shape[v * 3 + d] == (d < val->ndim ? val->shape[d] : 0);
    if (!same)
      return qt_err(msg, "/values: entry %d ('%s', producer %d) disagrees with node %d '%s'", v, name, vt->producer[v],
                    val->producer, val->name);
  }
  if (root->input != g->input)
    return qt_err(msg, "graph input is value %d, the input node produces value %d", root->input, g->input);
  if (root->output < 0 || root->output >= vt->n)
    return qt_err(msg, "graph output value id %d out of range (%d values)", root->output, vt->n);
  g->output = root->output;
  return 0;
}

/* The tensors in index order, each named '<owner node>.<suffix>'. */
static int add_tensors(qt_graph *g, const tensor_rec *tensors, int n_tensors, char *msg) {
  for (int t = 0; t < n_tensors; t++) {
    const tensor_rec *r = &tensors[t];
    const char *owner = g->nodes[r->node].name;
    size_t len = strlen(owner);
    if (strncmp(r->name, owner, len) != 0 || r->name[len] != '.' || !r->name[len + 1])
      return qt_err(msg, "/tensors/%s: the name must be '<owner node>.<suffix>' with owner node %d '%s'", r->name,
                    r->node, owner);
    int id = qt_graph_add_tensor(g, r->node, r->name + len + 1, r->ndim, r->shape, r->is_buffer);
    QT_ASSERT(id == t && strcmp(g->tensors[id].name, r->name) == 0, "rebuilding tensor %s", r->name);
  }
  return 0;
}

/* The nodes' slot attributes resolved to tensor ids. */
static int link_slots(qt_graph *g, const node_rec *nodes, int n_nodes, char *msg) {
  for (int i = 0; i < n_nodes; i++)
    for (int k = 0; k < QT_MAX_PARAMS; k++)
      for (int b = 0; b < 2; b++) {
        const char *ref = b ? nodes[i].buffer[k] : nodes[i].param[k];
        if (!ref[0]) continue;
        int t = qt_graph_find_tensor(g, ref);
        if (t < 0)
          return qt_err(msg, "node %d '%s': %s tensor '%s' is not in /tensors", i, nodes[i].name,
                        b ? qt_qdq_buffer_slot_names[k] : qt_qdq_param_slot_names[k], ref);
        if (b)
          g->nodes[i].buffer[k] = t;
        else
          g->nodes[i].param[k] = t;
      }
  return 0;
}

/* The graph from the file's tables: nodes, values, tensors, slots, validated as a graph of the
 * file's kind. */
static int rebuild_graph(loader *ld, char *msg) {
  qt_graph *g = ld->g = qt_graph_create(ld->root.name);
  for (int i = 0; i < ld->n_nodes; i++)
    if (add_node(g, i, &ld->nodes[i], &ld->values, msg)) return -1;
  if (check_value_table(g, &ld->root, &ld->values, ld->n_nodes, msg) ||
      add_tensors(g, ld->tensors, ld->n_tensors, msg) || link_slots(g, ld->nodes, ld->n_nodes, msg))
    return -1;
  return qt_qdq_validate_structure(g, ld->root.kind, msg);
}

/* Every tensor is named by a slot of its owner node, or is a prepared graph's learned scale. */
static int check_tensors_used(const qt_graph *g, graph_kind kind, char *msg) {
  for (int t = 0; t < g->n_tensors; t++) {
    const qt_node *n = &g->nodes[g->tensors[t].node];
    int used = 0;
    for (int k = 0; k < QT_MAX_PARAMS; k++) used |= n->param[k] == t || n->buffer[k] == t;
    if (!used && kind == KIND_PREPARED) used = lsq_scale_tensor(g, n, &g->tensors[t]);
    if (!used)
      return qt_err(msg, "/tensors/%s: no slot of its owner node %d '%s' names it (a tensor no node uses)",
                    g->tensors[t].name, g->tensors[t].node, n->name);
  }
  return 0;
}

/* The tensor data, into the graph's slabs. */
static int read_tensor_data(qt_graph *g, hid_t gt, char *msg) {
  char aerr[QT_ERR_LEN];
  if (qt_graph_alloc(g, aerr)) return qt_err(msg, "%s", aerr);
  for (int t = 0; t < g->n_tensors; t++)
    if (qt_h5_dataset_read_f32(gt, NULL, "/tensors", g->tensors[t].name, g->tensors[t].ndim, g->tensors[t].shape,
                               qt_graph_tensor_data(g, t), msg))
      return -1;
  return 0;
}

/* /quant/activation and /quant/weight: each node's records, no record without its node, and
 * the records validated. */
static int read_records(hid_t f, qt_graph *g, graph_kind kind, char *msg) {
  hid_t gq = -1, ga = -1, gw = -1;
  int rc = -1;
  if ((gq = qdq_group_open(f, "/", "quant", msg)) < 0 || (ga = qdq_group_open(gq, "/quant", "activation", msg)) < 0 ||
      (gw = qdq_group_open(gq, "/quant", "weight", msg)) < 0)
    goto done;
  for (int i = 0; i < g->n_nodes; i++) {
    if (H5Lexists(ga, g->nodes[i].name, H5P_DEFAULT) != 0 && read_qrecord(ga, QDQ_RECORD_ACTIVATION, kind, g, i, msg))
      goto done;
    if (H5Lexists(gw, g->nodes[i].name, H5P_DEFAULT) != 0 && read_qrecord(gw, QDQ_RECORD_WEIGHT, kind, g, i, msg))
      goto done;
  }
  if (qt_qdq_check_records_claimed(ga, QDQ_RECORD_ACTIVATION, g, msg) ||
      qt_qdq_check_records_claimed(gw, QDQ_RECORD_WEIGHT, g, msg) || qt_qdq_validate_quant(g, kind, msg))
    goto done;
  rc = 0;
done:
  QT_H5_CLOSE_ALL(ga, gw, gq);
  return rc;
}

/* The file's tables in order (root, nodes, values, tensors), the graph rebuilt and validated;
 * only then, with every tensor's shape what its node's op needs, is anything big read. */
static int load_into(hid_t f, loader *ld, char *msg) {
  if (read_root(f, &ld->root, msg) || read_nodes(f, ld, msg) || read_values(f, ld, msg) ||
      read_tensor_table(f, ld, msg) || rebuild_graph(ld, msg) || check_tensors_used(ld->g, ld->root.kind, msg) ||
      read_tensor_data(ld->g, ld->gt, msg) || read_records(f, ld->g, ld->root.kind, msg) ||
      read_input_preprocessing(f, ld->g, msg))
    return -1;
  qt_graph_set_training(ld->g, 0);
  return 0;
}

static qt_graph *load_graph(hid_t f, char *msg) {
  loader ld = {.gt = -1};
  const int rc = load_into(f, &ld, msg);
  if (ld.gt >= 0) H5Gclose(ld.gt);
  QT_FREE_ALL(ld.tensors, ld.nodes, ld.values.name, ld.values.ndim, ld.values.producer, ld.values.shape);
  if (rc) {
    qt_graph_free(ld.g);
    return NULL;
  }
  return ld.g;
}

typedef struct {
  const char *path;
  qt_graph *g;
} qdq_job;

static int qdq_parse(void *ctx, char *err) {
  qdq_job *j = ctx;
  err[0] = 0;
  hid_t f = qt_h5_open_read(j->path, "qdq file", H5P_DEFAULT, err);
  if (f < 0) return -1;
  char msg[QT_ERR_LEN] = "";
  j->g = load_graph(f, msg);
  H5Fclose(f);
  if (!j->g) return qt_err(err, "qdq file '%s': %s", j->path, msg[0] ? msg : "unreadable");
  return 0;
}

qt_graph *qt_qdq_load(const char *path, char *err) {
  qdq_job j = {path, NULL};
  if (qt_h5_contained(path, "Q/DQ", qdq_parse, &j, err)) return NULL; /* a file from anywhere */
  return j.g;
}
