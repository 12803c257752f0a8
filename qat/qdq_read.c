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

/* ---- reading ------------------------------------------------------------------------------ */

/* Number of links in a group, bounded. */
static int group_count(hid_t g, const char *obj, int max, char *msg) {
  H5G_info_t info;
  if (H5Gget_info(g, &info) < 0) return qt_err(msg, "%s: cannot list the group (corrupt file?)", obj);
  if (info.nlinks > (hsize_t)max) return qt_err(msg, "%s: %llu entries, more than %d", obj, (unsigned long long)info.nlinks, max);
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
    if (l.too_long) qt_err(msg, "%s: an entry has a name longer than %zu characters", obj, stride - 1);
    else qt_err(msg, "%s: cannot list the entries (corrupt file?)", obj);
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
  int index = -1, rc = -1;
  char op[64];
  qt_node_attrs *a = &r->attr;
  if (read_attr_int(g, obj, "index", &index, msg) || read_attr_str(g, obj, "name", r->name, sizeof r->name, msg) ||
      read_attr_str(g, obj, "op", op, sizeof op, msg))
    goto done;
  if (index != idx) {
    qt_err(msg, "%s: attribute index is %d, the group name says %ld", obj, index, idx);
    goto done;
  }
  if (qt_qdq_bad_link_name(r->name)) {
    qt_err(msg, "%s: node name '%s' is empty, '.' or holds '/'", obj, r->name);
    goto done;
  }
  if (strcmp(end + 1, r->name) != 0) {
    qt_err(msg, "%s: attribute name is '%s', the group name says '%s'", obj, r->name, end + 1);
    goto done;
  }
  if (qt_op_parse(op, &r->op)) {
    qt_err(msg, "node %d '%s': unknown op '%s'", index, r->name, op);
    goto done;
  }
  if (read_attr_ints(g, obj, "inputs", r->inputs, 0, QT_MAX_INPUTS, &r->n_inputs, msg) ||
      read_attr_int(g, obj, "output", &r->output, msg) || read_attr_int(g, obj, "kernel_h", &a->kernel_h, msg) ||
      read_attr_int(g, obj, "kernel_w", &a->kernel_w, msg) || read_attr_int(g, obj, "stride_h", &a->stride_h, msg) ||
      read_attr_int(g, obj, "stride_w", &a->stride_w, msg) || read_attr_int(g, obj, "pad_h", &a->pad_h, msg) ||
      read_attr_int(g, obj, "pad_w", &a->pad_w, msg) || read_attr_int(g, obj, "groups", &a->groups, msg) ||
      read_attr_int(g, obj, "out_channels", &a->out_channels, msg) || read_attr_float(g, obj, "eps", &a->eps, msg) ||
      read_attr_float(g, obj, "momentum", &a->momentum, msg) || read_attr_flag(g, obj, "bn_frozen", &r->bn_frozen, msg))
    goto done;
  for (int k = 0; k < QT_MAX_PARAMS; k++) {
    if (H5Aexists(g, qt_qdq_param_slot_names[k]) != 0 &&
        read_attr_str(g, obj, qt_qdq_param_slot_names[k], r->param[k], sizeof r->param[k], msg))
      goto done;
    if (H5Aexists(g, qt_qdq_buffer_slot_names[k]) != 0 &&
        read_attr_str(g, obj, qt_qdq_buffer_slot_names[k], r->buffer[k], sizeof r->buffer[k], msg))
      goto done;
  }
  rc = 0;
done:
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
  if (index < 0 || index >= n_tensors) return qt_err(msg, "%s: index %d out of range (%d tensors)", obj, index, n_tensors);
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

/* Reads /quant/<kind>/<node name> of node `node` of g into a new qstate (*out); weight records
 * hold integer weights in Q/DQ graphs and none in prepared graphs. read_qrecord puts it on the
 * node. */
int qt_qdq_read_qrecord_new(hid_t parent, qdq_record_kind kind, graph_kind graph, const qt_graph *g, int node,
                           qt_qstate **out, char *msg) {
  const qt_node *n = &g->nodes[node];
  const int is_weight = kind == QDQ_RECORD_WEIGHT;
  char obj[QT_NAME_LEN + 32];
  snprintf(obj, sizeof obj, "/quant/%s/%s", qt_qdq_record_names[kind], n->name);
  hid_t r = qdq_group_open(parent, "/quant", n->name, msg);
  if (r < 0) return -1;
  int rc = -1, at_node = -1, axis = 0, channels = 0;
  qt_qspec s;
  memset(&s, 0, sizeof s);
  char observer[64], method[64];
  float *scale = NULL;
  int32_t *zp = NULL, *qw = NULL, *qb = NULL;
  qt_qstate *q = NULL;
  if (read_attr_int(r, obj, "node", &at_node, msg) || read_attr_int(r, obj, "bits", &s.bits, msg) ||
      read_attr_int(r, obj, "qmin", &s.qmin, msg) || read_attr_int(r, obj, "qmax", &s.qmax, msg) ||
      read_attr_flag(r, obj, "signed", &s.is_signed, msg) || read_attr_flag(r, obj, "symmetric", &s.symmetric, msg) ||
      read_attr_flag(r, obj, "per_channel", &s.per_channel, msg) || read_attr_int(r, obj, "axis", &axis, msg) ||
      read_attr_int(r, obj, "channels", &channels, msg) ||
      read_attr_str(r, obj, "observer", observer, sizeof observer, msg) ||
      read_attr_str(r, obj, "method", method, sizeof method, msg) ||
      read_attr_float(r, obj, "percentile", &s.percentile, msg))
    goto done;
  if (at_node != node) {
    qt_err(msg, "%s: attribute node is %d, the record belongs to node %d", obj, at_node, node);
    goto done;
  }
  if (qt_observer_kind_parse(observer, &s.observer) || qt_range_method_parse(method, &s.method)) {
    qt_err(msg, "%s: unknown observer '%s' or range method '%s'", obj, observer, method);
    goto done;
  }
  const qt_value *x = &g->values[n->n_inputs ? n->inputs[0] : n->output];
  if (axis != qt_qdq_record_axis(&s, is_weight, x->ndim)) {
    qt_err(msg, "%s: axis %d, want %d for a %s %s record", obj, axis, qt_qdq_record_axis(&s, is_weight, x->ndim),
         s.per_channel ? "per-channel" : "per-tensor", qt_qdq_record_names[kind]);
    goto done;
  }
  if (channels < 1 || channels > QDQ_MAX_CHANNELS) {
    qt_err(msg, "%s: channels %d out of range", obj, channels);
    goto done;
  }
  const int64_t ch[1] = {channels};
  if (!(scale = qdq_read_dataset(r, obj, "scale", H5T_FLOAT, H5T_NATIVE_FLOAT, 1, ch, 1, NULL, NULL, msg)) ||
      !(zp = qdq_read_dataset(r, obj, "zero_point", H5T_INTEGER, H5T_NATIVE_INT32, 1, ch, 1, NULL, NULL, msg)))
    goto done;
  int64_t n_qweight = 0, n_qbias = 0;
  if (is_weight) {
    htri_t has_bias = H5Aexists(r, "bias");
    if (has_bias < 0) {
      qt_err(msg, "%s: cannot look up attribute 'bias' (corrupt file?)", obj);
      goto done;
    }
    if (has_bias) {
      char bias[16];
      if (read_attr_str(r, obj, "bias", bias, sizeof bias, msg)) goto done;
      if (strcmp(bias, "int32") != 0 && strcmp(bias, "float") != 0) {
        qt_err(msg, "%s: attribute bias is '%s', want 'int32' or 'float'", obj, bias);
        goto done;
      }
      s.bias_int32 = strcmp(bias, "int32") == 0;
    }
    htri_t has_qb = H5Lexists(r, "bias_int", H5P_DEFAULT);
    if (has_qb < 0) {
      qt_err(msg, "%s: cannot look up dataset 'bias_int' (corrupt file?)", obj);
      goto done;
    }
    if (has_qb && (graph == KIND_PREPARED || !s.bias_int32 || n->param[QT_P_BIAS] < 0)) {
      qt_err(msg, "%s: holds 'bias_int', but %s", obj,
             graph == KIND_PREPARED ? "a prepared graph fake-quantizes its float bias (kind 'prepared' has no integer biases)"
             : !s.bias_int32    ? "its attribute bias does not say int32"
                                : "the node has no bias");
      goto done;
    }
    if (graph != KIND_PREPARED && s.bias_int32 && n->param[QT_P_BIAS] >= 0) {
      const int64_t oc[1] = {g->tensors[n->param[QT_P_BIAS]].numel};
      if (!(qb = qdq_read_dataset(r, obj, "bias_int", H5T_INTEGER, H5T_NATIVE_INT32, 1, oc, 1, NULL, NULL, msg)))
        goto done;
      n_qbias = oc[0];
    }
    if (n->param[QT_P_WEIGHT] < 0) {
      qt_err(msg, "%s: node %d '%s' (%s) has no weight to quantize", obj, node, n->name, qt_op_name(n->op));
      goto done;
    }
    const qt_param *W = &g->tensors[n->param[QT_P_WEIGHT]];
    char tensor[2 * QT_NAME_LEN];
    if (read_attr_str(r, obj, "tensor", tensor, sizeof tensor, msg)) goto done;
    if (strcmp(tensor, W->name) != 0) {
      qt_err(msg, "%s: quantizes tensor '%s', the node's weight is '%s'", obj, tensor, W->name);
      goto done;
    }
    if (graph == KIND_PREPARED) {
      htri_t has = H5Lexists(r, "weight_int", H5P_DEFAULT);
      if (has != 0) {
        qt_err(msg, has < 0 ? "%s: cannot look up dataset 'weight_int' (corrupt file?)"
                          : "%s: holds 'weight_int', but a prepared graph fake-quantizes its float weight (kind "
                            "'prepared' has no integer weights)",
             obj);
        goto done;
      }
    } else {
      if (!(qw = qdq_read_dataset(r, obj, "weight_int", H5T_INTEGER, H5T_NATIVE_INT32, W->ndim, W->shape, 4, NULL, NULL,
                              msg)))
        goto done;
      n_qweight = W->numel;
    }
  }
  char cerr[QT_ERR_LEN];
  if (!(q = qt_qstate_create(&s, channels, cerr))) {
    qt_err(msg, "%s: %s", obj, cerr);
    goto done;
  }
  memcpy(q->scale, scale, (size_t)channels * sizeof(float));
  memcpy(q->zero_point, zp, (size_t)channels * sizeof(int32_t));
  q->calibrated = 1;
  q->observe = 0;
  q->fake_quant = 1;
  q->qweight = qw;
  q->n_qweight = n_qweight;
  qw = NULL;
  q->qbias = qb;
  q->n_qbias = n_qbias;
  qb = NULL;
  *out = q;
  rc = 0;
done:
  free(scale);
  free(zp);
  free(qw);
  free(qb);
  H5Gclose(r);
  return rc;
}

static int read_qrecord(hid_t parent, qdq_record_kind kind, graph_kind graph, qt_graph *g, int node, char *msg) {
  qt_qstate *q = NULL;
  if (qt_qdq_read_qrecord_new(parent, kind, graph, g, node, &q, msg)) return -1;
  if (kind == QDQ_RECORD_WEIGHT) g->nodes[node].wq = q;
  else g->nodes[node].q = q;
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

static qt_graph *load_graph(hid_t f, char *msg) {
  qt_graph *g = NULL;
  node_rec *nodes = NULL;
  tensor_rec *tensors = NULL;
  char *vname = NULL, *links = NULL;
  int *vndim = NULL, *vprod = NULL;
  int64_t *vshape = NULL;
  hid_t gn = -1, gt = -1, gv = -1, gq = -1, ga = -1, gw = -1;
  int n_nodes = 0, n_tensors = 0, n_values = 0, ok = 0;

  char format[64], name[QT_NAME_LEN];
  int version = 0, input = -1, output = -1, a_nodes = 0, a_values = 0, a_tensors = 0;
  if (read_attr_str(f, "/", "format", format, sizeof format, msg)) {
    qt_err(msg, "no 'format' attribute: not a Q/DQ graph file");
    goto done;
  }
  if (strcmp(format, QDQ_FORMAT) != 0) {
    qt_err(msg, "format is '%s', want '%s'", format, QDQ_FORMAT);
    goto done;
  }
  if (read_attr_int(f, "/", "format_version", &version, msg)) goto done;
  if (version != QDQ_VERSION) {
    qt_err(msg, "format version %d; this build reads version %d", version, QDQ_VERSION);
    goto done;
  }
  graph_kind kind = KIND_QDQ; /* files written before `kind` existed hold Q/DQ graphs */
  {
    htri_t has = H5Aexists(f, "kind");
    char ks[64];
    if (has < 0) {
      qt_err(msg, "/: cannot read the attributes (corrupt file: checksum or decoding failed)");
      goto done;
    }
    if (has > 0) {
      if (read_attr_str(f, "/", "kind", ks, sizeof ks, msg)) goto done;
      if (strcmp(ks, qt_qdq_kind_names[KIND_QDQ]) == 0) {
        kind = KIND_QDQ;
      } else if (strcmp(ks, qt_qdq_kind_names[KIND_PREPARED]) == 0) {
        kind = KIND_PREPARED;
      } else {
        qt_err(msg, "kind is '%s', want '%s' or '%s'", ks, qt_qdq_kind_names[KIND_QDQ], qt_qdq_kind_names[KIND_PREPARED]);
        goto done;
      }
    }
  }
  if (read_attr_str(f, "/", "name", name, sizeof name, msg) || read_attr_int(f, "/", "input", &input, msg) ||
      read_attr_int(f, "/", "output", &output, msg) || read_attr_int(f, "/", "n_nodes", &a_nodes, msg) ||
      read_attr_int(f, "/", "n_values", &a_values, msg) || read_attr_int(f, "/", "n_tensors", &a_tensors, msg))
    goto done;
  if (!name[0]) {
    qt_err(msg, "/: attribute 'name' is empty (the graph's name)");
    goto done;
  }

  /* Nodes. */
  if ((gn = qdq_group_open(f, "/", "nodes", msg)) < 0 || (n_nodes = group_count(gn, "/nodes", QDQ_MAX_NODES, msg)) < 0)
    goto done;
  if (n_nodes != a_nodes || n_nodes < 1) {
    qt_err(msg, "/nodes holds %d groups, attribute n_nodes says %d", n_nodes, a_nodes);
    goto done;
  }
  nodes = calloc((size_t)n_nodes, sizeof *nodes);
  QT_ASSERT(nodes, "out of memory");
  if (!(links = list_links(gn, "/nodes", n_nodes, NODE_LINK_LEN, msg))) goto done;
  for (int k = 0; k < n_nodes; k++)
    if (read_node(gn, links + (size_t)k * NODE_LINK_LEN, n_nodes, nodes, msg)) goto done;
  free(links);
  links = NULL;

  /* Values. */
  if ((gv = qdq_group_open(f, "/", "values", msg)) < 0) goto done;
  int64_t vd[8];
  int vnd = 0;
  if (!(vndim = qdq_read_dataset(gv, "/values", "ndim", H5T_INTEGER, H5T_NATIVE_INT, 0, NULL, 1, &vnd, vd, msg))) goto done;
  n_values = (int)vd[0];
  if (n_values != a_values) {
    qt_err(msg, "/values/ndim has %d entries, attribute n_values says %d", n_values, a_values);
    goto done;
  }
  const int64_t want_n[1] = {n_values}, want_s[2] = {n_values, 3};
  if (!(vprod = qdq_read_dataset(gv, "/values", "producer", H5T_INTEGER, H5T_NATIVE_INT, 1, want_n, 1, NULL, NULL, msg)) ||
      !(vshape = qdq_read_dataset(gv, "/values", "shape", H5T_INTEGER, H5T_NATIVE_INT64, 2, want_s, 2, NULL, NULL, msg)))
    goto done;
  {
    hid_t st = H5Tcopy(H5T_C_S1);
    if (st < 0 || H5Tset_size(st, QT_NAME_LEN) < 0 || H5Tset_strpad(st, H5T_STR_NULLTERM) < 0) {
      qt_err(msg, "/values: cannot make a string type");
      if (st >= 0) H5Tclose(st);
      goto done;
    }
    vname = qdq_read_dataset(gv, "/values", "name", H5T_STRING, st, 1, want_n, 1, NULL, NULL, msg);
    H5Tclose(st);
    if (!vname) goto done;
  }
  for (int v = 0; v < n_values; v++) {
    vname[(size_t)v * QT_NAME_LEN + QT_NAME_LEN - 1] = 0;
    if (vndim[v] < 1 || vndim[v] > 3) {
      qt_err(msg, "/values: value %d has rank %d, want 1..3", v, vndim[v]);
      goto done;
    }
  }

  /* Tensors. */
  if ((gt = qdq_group_open(f, "/", "tensors", msg)) < 0 ||
      (n_tensors = group_count(gt, "/tensors", 4 * QDQ_MAX_NODES, msg)) < 0)
    goto done;
  if (n_tensors != a_tensors) {
    qt_err(msg, "/tensors holds %d datasets, attribute n_tensors says %d", n_tensors, a_tensors);
    goto done;
  }
  tensors = calloc((size_t)n_tensors + 1, sizeof *tensors);
  QT_ASSERT(tensors, "out of memory");
  if (!(links = list_links(gt, "/tensors", n_tensors, 2 * QT_NAME_LEN, msg))) goto done;
  for (int k = 0; k < n_tensors; k++)
    if (read_tensor(gt, links + (size_t)k * 2 * QT_NAME_LEN, n_tensors, n_nodes, tensors, msg)) goto done;
  free(links);
  links = NULL;

  /* Rebuild with the builder: nodes in order, then tensors in index order. */
  g = qt_graph_create(name);
  for (int i = 0; i < n_nodes; i++) {
    node_rec *r = &nodes[i];
    for (int k = 0; k < r->n_inputs; k++)
      if (r->inputs[k] < 0 || r->inputs[k] >= g->n_values) {
        if (r->inputs[k] < 0 || r->inputs[k] >= n_values)
          qt_err(msg, "node %d '%s': input value id %d out of range (%d values)", i, r->name, r->inputs[k], n_values);
        else
          qt_err(msg, "node %d '%s': input value %d is produced by a later node (nodes must be in topological order)", i,
               r->name, r->inputs[k]);
        goto done;
      }
    if (r->output < 0 || r->output >= n_values) {
      qt_err(msg, "node %d '%s': output value id %d out of range (%d values)", i, r->name, r->output, n_values);
      goto done;
    }
    const int o = r->output;
    if (qt_graph_add_node(g, r->op, r->name, r->inputs, r->n_inputs, &r->attr, vndim[o], vshape + (size_t)o * 3) < 0) {
      qt_err(msg, "node %d '%s': %s", i, r->name, g->error);
      goto done;
    }
    if (g->nodes[i].output != o) {
      qt_err(msg, "node %d '%s': output value id %d, but it produces value %d (one value per node, in node order)", i,
           r->name, o, g->nodes[i].output);
      goto done;
    }
    g->nodes[i].bn_frozen = r->bn_frozen;
  }
  if (g->n_values != n_values) {
    qt_err(msg, "/values has %d entries, the %d nodes produce %d", n_values, n_nodes, g->n_values);
    goto done;
  }
  for (int v = 0; v < n_values; v++) {
    const qt_value *val = &g->values[v];
    int same = strcmp(val->name, vname + (size_t)v * QT_NAME_LEN) == 0 && vprod[v] == val->producer;
    for (int d = 0; d < 3; d++) same = same && vshape[v * 3 + d] == (d < val->ndim ? val->shape[d] : 0);
    if (!same) {
      qt_err(msg, "/values: entry %d ('%s', producer %d) disagrees with node %d '%s'", v, vname + (size_t)v * QT_NAME_LEN,
           vprod[v], val->producer, val->name);
      goto done;
    }
  }
  if (input != g->input) {
    qt_err(msg, "graph input is value %d, the input node produces value %d", input, g->input);
    goto done;
  }
  if (output < 0 || output >= n_values) {
    qt_err(msg, "graph output value id %d out of range (%d values)", output, n_values);
    goto done;
  }
  g->output = output;
  for (int t = 0; t < n_tensors; t++) {
    tensor_rec *r = &tensors[t];
    const char *owner = g->nodes[r->node].name;
    size_t len = strlen(owner);
    if (strncmp(r->name, owner, len) != 0 || r->name[len] != '.' || !r->name[len + 1]) {
      qt_err(msg, "/tensors/%s: the name must be '<owner node>.<suffix>' with owner node %d '%s'", r->name, r->node, owner);
      goto done;
    }
    int id = qt_graph_add_tensor(g, r->node, r->name + len + 1, r->ndim, r->shape, r->is_buffer);
    QT_ASSERT(id == t && strcmp(g->tensors[id].name, r->name) == 0, "rebuilding tensor %s", r->name);
  }
  for (int i = 0; i < n_nodes; i++)
    for (int k = 0; k < QT_MAX_PARAMS; k++)
      for (int b = 0; b < 2; b++) {
        const char *ref = b ? nodes[i].buffer[k] : nodes[i].param[k];
        if (!ref[0]) continue;
        int t = qt_graph_find_tensor(g, ref);
        if (t < 0) {
          qt_err(msg, "node %d '%s': %s tensor '%s' is not in /tensors", i, nodes[i].name,
               b ? qt_qdq_buffer_slot_names[k] : qt_qdq_param_slot_names[k], ref);
          goto done;
        }
        if (b) g->nodes[i].buffer[k] = t;
        else g->nodes[i].param[k] = t;
      }
  if (qt_qdq_validate_structure(g, kind, msg)) goto done;
  for (int t = 0; t < n_tensors; t++) {
    const qt_node *n = &g->nodes[g->tensors[t].node];
    int used = 0;
    for (int k = 0; k < QT_MAX_PARAMS; k++) used |= n->param[k] == t || n->buffer[k] == t;
    if (!used && kind == KIND_PREPARED) used = lsq_scale_tensor(g, n, &g->tensors[t]);
    if (!used) {
      qt_err(msg, "/tensors/%s: no slot of its owner node %d '%s' names it (a tensor no node uses)", g->tensors[t].name,
             g->tensors[t].node, n->name);
      goto done;
    }
  }
  /* Only now, with every tensor's shape what its node's op needs, is anything big read. */
  char aerr[QT_ERR_LEN];
  if (qt_graph_alloc(g, aerr)) {
    qt_err(msg, "%s", aerr);
    goto done;
  }
  for (int t = 0; t < n_tensors; t++)
    if (qt_h5_dataset_read_f32(gt, NULL, "/tensors", g->tensors[t].name, g->tensors[t].ndim, g->tensors[t].shape,
                               qt_graph_tensor_data(g, t), msg))
      goto done;

  /* Quantization records. */
  if ((gq = qdq_group_open(f, "/", "quant", msg)) < 0 || (ga = qdq_group_open(gq, "/quant", "activation", msg)) < 0 ||
      (gw = qdq_group_open(gq, "/quant", "weight", msg)) < 0)
    goto done;
  for (int i = 0; i < n_nodes; i++) {
    if (H5Lexists(ga, g->nodes[i].name, H5P_DEFAULT) != 0 && read_qrecord(ga, QDQ_RECORD_ACTIVATION, kind, g, i, msg))
      goto done;
    if (H5Lexists(gw, g->nodes[i].name, H5P_DEFAULT) != 0 && read_qrecord(gw, QDQ_RECORD_WEIGHT, kind, g, i, msg)) goto done;
  }
  if (qt_qdq_check_records_claimed(ga, QDQ_RECORD_ACTIVATION, g, msg) || qt_qdq_check_records_claimed(gw, QDQ_RECORD_WEIGHT, g, msg) ||
      qt_qdq_validate_quant(g, kind, msg))
    goto done;
  if (read_input_preprocessing(f, g, msg)) goto done;
  qt_graph_set_training(g, 0);
  ok = 1;
done:
  if (gn >= 0) H5Gclose(gn);
  if (gt >= 0) H5Gclose(gt);
  if (gv >= 0) H5Gclose(gv);
  if (ga >= 0) H5Gclose(ga);
  if (gw >= 0) H5Gclose(gw);
  if (gq >= 0) H5Gclose(gq);
  free(tensors);
  free(nodes);
  free(links);
  free(vname);
  free(vndim);
  free(vprod);
  free(vshape);
  if (!ok) {
    qt_graph_free(g);
    return NULL;
  }
  return g;
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

