/* Writing the Q/DQ graph file (docs/qdq_format.md): qt_qdq_save writes a convert graph, or an
 * eval-mode prepared (training) graph, to HDF5 in a layout any HDF5 reader (h5py) can use
 * without this code, after validating it as the reader will. The bytes depend only on the
 * graph (object times off): saving the same graph twice gives identical files. Datasets carry
 * Fletcher-32 checksums and metadata uses HDF5 1.10's checksummed object headers, so flipped
 * bytes are caught rather than loaded as other numbers. */
#include <unistd.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qat/qdq_internal.h"
#include "base/base.h"

/* ---- writing ------------------------------------------------------------------------------ */

/* Integer weights are stored in the narrowest type holding [qmin, qmax]: uint8 for an unsigned
 * spec up to 255, int8, uint8, int16, else int32. */
static weight_int_kind weight_int_pick(const qt_qspec *s) {
  if (!s->is_signed && s->qmin >= 0 && s->qmax <= 255) return WI_U8;
  if (s->qmin >= -128 && s->qmax <= 127) return WI_I8;
  if (s->qmin >= 0 && s->qmax <= 255) return WI_U8;
  if (s->qmin >= -32768 && s->qmax <= 32767) return WI_I16;
  return WI_I32;
}

/* Training state of a record (checkpoints only, see qt_quant_state_write): the enable flags,
 * the LSQ tensor and the observer's running state in a subgroup `observer`. */
static int write_train_state(hid_t r, const qt_graph *g, const qt_qstate *q) {
  const qt_observer *o = &q->obs;
  int bad = qt_h5_attr_write_int(r, "observe", q->observe ? 1 : 0) ||
            qt_h5_attr_write_int(r, "fake_quant", q->fake_quant ? 1 : 0) ||
            qt_h5_attr_write_int(r, "calibrated", q->calibrated ? 1 : 0) ||
            qt_h5_attr_write_int(r, "pow2_scale", q->spec.pow2_scale ? 1 : 0);
  if (!bad && q->scale_param >= 0) bad = qt_h5_attr_write_str(r, "learned_scale", g->tensors[q->scale_param].name);
  if (bad) return -1;
  hid_t og = qt_h5_group_create(r, "observer");
  if (og < 0) return -1;
  hsize_t ch[1] = {(hsize_t)o->channels}, nb[1] = {(hsize_t)o->bins};
  bad = qt_h5_attr_write_str(og, "kind", qt_observer_kind_name(o->kind)) ||
        qt_h5_attr_write_int(og, "channels", o->channels) ||
        qt_h5_attr_write_float(og, "averaging_constant", o->averaging_constant) ||
        qt_h5_attr_write_str(og, "method", qt_range_method_name(o->method)) ||
        qt_h5_attr_write_float(og, "percentile", o->percentile) || qt_h5_attr_write_int(og, "bins", o->bins) ||
        qt_h5_attr_write_int(og, "initialized", o->initialized ? 1 : 0) ||
        qt_h5_attr_write_float(og, "hist_min", o->hist_min) || qt_h5_attr_write_float(og, "hist_max", o->hist_max) ||
        qt_h5_dataset_write(og, "min", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 1, ch, o->min) ||
        qt_h5_dataset_write(og, "max", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 1, ch, o->max);
  if (!bad && o->hist) bad = qt_h5_dataset_write(og, "hist", H5T_STD_I64LE, H5T_NATIVE_INT64, 1, nb, o->hist);
  bad |= H5Gclose(og) < 0;
  return bad ? -1 : 0;
}

/* `weight_int`: the integer weights of a Q/DQ graph's weight record, in the narrowest type
 * holding [qmin, qmax] and the weight's shape. */
static int write_weight_int(hid_t r, const qt_param *W, const qt_qstate *q) {
  const weight_int_kind kind = weight_int_pick(&q->spec);
  const hid_t ftypes[] = {H5T_STD_U8LE, H5T_STD_I8LE, H5T_STD_I16LE, H5T_STD_I32LE};
  const hid_t mtypes[] = {H5T_NATIVE_UINT8, H5T_NATIVE_INT8, H5T_NATIVE_INT16, H5T_NATIVE_INT32};
  const size_t sizes[] = {1, 1, 2, 4};
  void *buf = malloc((size_t)W->numel * sizes[kind]);
  QT_ASSERT(buf, "out of memory packing %lld integer weights", (long long)W->numel);
  for (int64_t k = 0; k < W->numel; k++) {
    const int32_t v = q->qweight[k];
    switch (kind) {
      case WI_U8: ((uint8_t *)buf)[k] = (uint8_t)v; break;
      case WI_I8: ((int8_t *)buf)[k] = (int8_t)v; break;
      case WI_I16: ((int16_t *)buf)[k] = (int16_t)v; break;
      case WI_I32: ((int32_t *)buf)[k] = v; break;
    }
  }
  hsize_t dims[4];
  for (int d = 0; d < W->ndim; d++) dims[d] = (hsize_t)W->shape[d];
  const int bad = qt_h5_dataset_write(r, "weight_int", ftypes[kind], mtypes[kind], W->ndim, dims, buf);
  free(buf);
  return bad;
}

/* A record's spec attributes and its qparams. */
static int write_qparams(hid_t r, const qt_graph *g, int node, const qt_qstate *q, int is_weight) {
  const qt_node *n = &g->nodes[node];
  const qt_qspec *s = &q->spec;
  const qt_value *x = &g->values[n->n_inputs ? n->inputs[0] : n->output];
  hsize_t ch[1] = {(hsize_t)q->channels};
  return qt_h5_attr_write_int(r, "node", node) || qt_h5_attr_write_int(r, "bits", s->bits) ||
         qt_h5_attr_write_int(r, "qmin", s->qmin) || qt_h5_attr_write_int(r, "qmax", s->qmax) ||
         qt_h5_attr_write_int(r, "signed", s->is_signed ? 1 : 0) ||
         qt_h5_attr_write_int(r, "symmetric", s->symmetric ? 1 : 0) ||
         qt_h5_attr_write_int(r, "per_channel", s->per_channel ? 1 : 0) ||
         qt_h5_attr_write_int(r, "axis", qt_qdq_record_axis(s, is_weight, x->ndim)) ||
         qt_h5_attr_write_int(r, "channels", q->channels) ||
         qt_h5_attr_write_str(r, "observer", qt_observer_kind_name(s->observer)) ||
         qt_h5_attr_write_str(r, "method", qt_range_method_name(s->method)) ||
         qt_h5_attr_write_float(r, "percentile", s->percentile) ||
         qt_h5_dataset_write(r, "scale", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 1, ch, q->scale) ||
         qt_h5_dataset_write(r, "zero_point", H5T_STD_I32LE, H5T_NATIVE_INT32, 1, ch, q->zero_point);
}

/* A weight record's parts after its qparams: the quantized tensor's name, the integer weights
 * (Q/DQ graphs; a prepared graph fake-quantizes the float weight) and the int32 bias (absent:
 * the bias is float). */
static int write_weight_parts(hid_t r, const qt_graph *g, const qt_node *n, const qt_qstate *q) {
  const qt_param *W = &g->tensors[n->param[QT_P_WEIGHT]];
  if (qt_h5_attr_write_str(r, "tensor", W->name)) return -1;
  if (q->qweight && write_weight_int(r, W, q)) return -1;
  if (q->spec.bias_int32 && qt_h5_attr_write_str(r, "bias", "int32")) return -1;
  hsize_t nb[1] = {(hsize_t)q->n_qbias};
  if (q->qbias && qt_h5_dataset_write(r, "bias_int", H5T_STD_I32LE, H5T_NATIVE_INT32, 1, nb, q->qbias)) return -1;
  return 0;
}

/* One quantization record; with_state adds the training state (checkpoints). */
int qt_qdq_write_qrecord(writer *w, hid_t parent, const qt_graph *g, int node, const qt_qstate *q, int is_weight,
                         int with_state) {
  const qt_node *n = &g->nodes[node];
  snprintf(w->where, sizeof w->where, "/quant/%s/%s", is_weight ? "weight" : "activation", n->name);
  hid_t r = qt_h5_group_create(parent, n->name);
  if (r < 0) return -1;
  int bad = write_qparams(r, g, node, q, is_weight);
  if (!bad && is_weight) bad = write_weight_parts(r, g, n, q);
  if (!bad && with_state) bad = write_train_state(r, g, q);
  bad |= H5Gclose(r) < 0;
  return bad ? -1 : 0;
}

/* /input_preprocessing (only when the graph has it, so files without it keep their bytes). */
static int write_input_preprocessing(writer *w, hid_t f, const qt_graph *g) {
  const qt_input_preprocessing *p = &g->input_pre;
  const qt_value *x = &g->values[g->input];
  const int shape[3] = {(int)x->shape[0], (int)x->shape[1], (int)x->shape[2]};
  snprintf(w->where, sizeof w->where, "/%s", QDQ_INPUT_PRE_GROUP);
  hid_t gp = qt_h5_group_create(f, QDQ_INPUT_PRE_GROUP);
  if (gp < 0) return -1;
  int bad = qt_h5_attr_write_str(gp, "layout", "NHWC") ||
            qt_h5_attr_write(gp, "shape", H5T_STD_I32LE, H5T_NATIVE_INT, 3, shape) ||
            qt_h5_attr_write_float(gp, "raw_min", 0.0f) || qt_h5_attr_write_float(gp, "raw_max", 255.0f) ||
            qt_h5_attr_write_float(gp, "divisor", 255.0f) ||
            qt_h5_attr_write_floats(gp, "mean", p->mean, p->channels) ||
            qt_h5_attr_write_floats(gp, "std", p->std, p->channels) ||
            qt_h5_attr_write_str(gp, "formula", QDQ_INPUT_PRE_FORMULA);
  bad |= H5Gclose(gp) < 0;
  return bad ? -1 : 0;
}

/* The root attributes. */
static int write_root(writer *w, hid_t f, const qt_graph *g, graph_kind kind) {
  snprintf(w->where, sizeof w->where, "the root attributes");
  return qt_h5_attr_write_str(f, "format", QDQ_FORMAT) || qt_h5_attr_write_int(f, "format_version", QDQ_VERSION) ||
         qt_h5_attr_write_str(f, "kind", qt_qdq_kind_names[kind]) || qt_h5_attr_write_str(f, "name", g->name) ||
         qt_h5_attr_write_int(f, "input", g->input) || qt_h5_attr_write_int(f, "output", g->output) ||
         qt_h5_attr_write_int(f, "n_nodes", g->n_nodes) || qt_h5_attr_write_int(f, "n_values", g->n_values) ||
         qt_h5_attr_write_int(f, "n_tensors", g->n_tensors) ||
         qt_h5_attr_write_str(f, "layout", "activations NHWC, weights OIHW, per-sample value shapes");
}

/* /values: parallel arrays indexed by value id. */
static int write_values(writer *w, hid_t f, const qt_graph *g) {
  snprintf(w->where, sizeof w->where, "/values");
  hid_t gv = qt_h5_group_create(f, "values");
  if (gv < 0) return -1;
  const int nv = g->n_values;
  char *names = calloc((size_t)nv, QT_NAME_LEN);
  int *ndim = calloc((size_t)nv, sizeof(int)), *producer = calloc((size_t)nv, sizeof(int));
  int64_t *shape = calloc((size_t)nv * 3, sizeof(int64_t));
  QT_ASSERT(names && ndim && producer && shape, "out of memory");
  for (int v = 0; v < nv; v++) {
    snprintf(names + (size_t)v * QT_NAME_LEN, QT_NAME_LEN, "%s", g->values[v].name);
    ndim[v] = g->values[v].ndim;
    producer[v] = g->values[v].producer;
    for (int d = 0; d < g->values[v].ndim; d++) shape[v * 3 + d] = g->values[v].shape[d];
  }
  hid_t st = H5Tcopy(H5T_C_S1);
  int bad = st < 0 || H5Tset_size(st, QT_NAME_LEN) < 0 || H5Tset_strpad(st, H5T_STR_NULLTERM) < 0;
  hsize_t d1[1] = {(hsize_t)nv}, d2[2] = {(hsize_t)nv, 3};
  bad = bad || qt_h5_dataset_write(gv, "name", st, st, 1, d1, names) ||
        qt_h5_dataset_write(gv, "ndim", H5T_STD_I32LE, H5T_NATIVE_INT, 1, d1, ndim) ||
        qt_h5_dataset_write(gv, "shape", H5T_STD_I64LE, H5T_NATIVE_INT64, 2, d2, shape) ||
        qt_h5_dataset_write(gv, "producer", H5T_STD_I32LE, H5T_NATIVE_INT, 1, d1, producer);
  if (st >= 0) H5Tclose(st);
  QT_FREE_ALL(names, ndim, producer, shape);
  bad |= H5Gclose(gv) < 0;
  return bad ? -1 : 0;
}

/* /tensors/<name>: float32 in the tensor's own shape. */
static int write_tensors(writer *w, hid_t f, const qt_graph *g) {
  hid_t gt = qt_h5_group_create(f, "tensors");
  if (gt < 0) return -1;
  int bad = 0;
  for (int t = 0; t < g->n_tensors && !bad; t++) {
    const qt_param *p = &g->tensors[t];
    snprintf(w->where, sizeof w->where, "/tensors/%s", p->name);
    hsize_t dims[4];
    for (int d = 0; d < p->ndim; d++) dims[d] = (hsize_t)p->shape[d];
    const float *data = (p->is_buffer ? g->buffers : g->params) + p->offset;
    hid_t d = -1;
    bad = qt_h5_dataset_write(gt, p->name, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, p->ndim, dims, data) ||
          (d = H5Dopen2(gt, p->name, H5P_DEFAULT)) < 0 || qt_h5_attr_write_int(d, "index", t) ||
          qt_h5_attr_write_int(d, "node", p->node) || qt_h5_attr_write_int(d, "is_buffer", p->is_buffer ? 1 : 0);
    if (d >= 0) bad |= H5Dclose(d) < 0;
  }
  bad |= H5Gclose(gt) < 0;
  return bad ? -1 : 0;
}

/* /nodes/<index>_<name> of node i: all attributes, and the slots the node uses. */
static int write_node(writer *w, hid_t gn, const qt_graph *g, int i) {
  const qt_node *n = &g->nodes[i];
  char gname[QT_NAME_LEN + 16];
  snprintf(gname, sizeof gname, "%04d_%s", i, n->name);
  snprintf(w->where, sizeof w->where, "/nodes/%s", gname);
  hid_t ng = qt_h5_group_create(gn, gname);
  if (ng < 0) return -1;
  const qt_node_attrs *a = &n->attr;
  int bad = qt_h5_attr_write_int(ng, "index", i) || qt_h5_attr_write_str(ng, "name", n->name) ||
            qt_h5_attr_write_str(ng, "op", qt_op_name(n->op)) ||
            qt_h5_attr_write(ng, "inputs", H5T_STD_I32LE, H5T_NATIVE_INT, n->n_inputs, n->inputs) ||
            qt_h5_attr_write_int(ng, "output", n->output) || qt_h5_attr_write_int(ng, "kernel_h", a->kernel_h) ||
            qt_h5_attr_write_int(ng, "kernel_w", a->kernel_w) || qt_h5_attr_write_int(ng, "stride_h", a->stride_h) ||
            qt_h5_attr_write_int(ng, "stride_w", a->stride_w) || qt_h5_attr_write_int(ng, "pad_h", a->pad_h) ||
            qt_h5_attr_write_int(ng, "pad_w", a->pad_w) || qt_h5_attr_write_int(ng, "groups", a->groups) ||
            qt_h5_attr_write_int(ng, "out_channels", a->out_channels) || qt_h5_attr_write_float(ng, "eps", a->eps) ||
            qt_h5_attr_write_float(ng, "momentum", a->momentum) || qt_h5_attr_write_int(ng, "bn_frozen", n->bn_frozen);
  if (!bad && n->op == QT_OP_ACTIVATION) /* only there: files without activations keep their bytes */
    bad = qt_h5_attr_write_str(ng, "act", qt_act_name((qt_act_kind)a->act)) ||
          qt_h5_attr_write_float(ng, "alpha", a->alpha) || qt_h5_attr_write_float(ng, "beta", a->beta);
  if (!bad && a->ceil && (n->op == QT_OP_MAX_POOL2D || n->op == QT_OP_AVG_POOL2D)) /* likewise */
    bad = qt_h5_attr_write_int(ng, "ceil", a->ceil);
  if (!bad && n->op == QT_OP_CHANNEL_SLICE) /* likewise */
    bad = qt_h5_attr_write_int(ng, "begin", a->begin) || qt_h5_attr_write_int(ng, "end", a->end);
  if (!bad && n->op == QT_OP_ATTENTION) /* likewise */
    bad = qt_h5_attr_write_int(ng, "heads", a->heads);
  if (!bad && n->op == QT_OP_DROPOUT) /* likewise */
    bad = qt_h5_attr_write_float(ng, "ratio", a->ratio);
  if (!bad && n->op == QT_OP_RESIZE) /* likewise */
    bad = qt_h5_attr_write_str(ng, "mode", a->mode == QT_RESIZE_BILINEAR ? "bilinear" : "nearest");
  for (int k = 0; k < QT_MAX_PARAMS && !bad; k++) {
    if (n->param[k] >= 0) bad = qt_h5_attr_write_str(ng, qt_qdq_param_slot_names[k], g->tensors[n->param[k]].name);
    if (!bad && n->buffer[k] >= 0)
      bad = qt_h5_attr_write_str(ng, qt_qdq_buffer_slot_names[k], g->tensors[n->buffer[k]].name);
  }
  bad |= H5Gclose(ng) < 0;
  return bad ? -1 : 0;
}

/* /nodes: one group per node. */
static int write_nodes(writer *w, hid_t f, const qt_graph *g) {
  snprintf(w->where, sizeof w->where, "/nodes");
  hid_t gn = qt_h5_group_create(f, "nodes");
  if (gn < 0) return -1;
  int bad = 0;
  for (int i = 0; i < g->n_nodes && !bad; i++) bad = write_node(w, gn, g, i) != 0;
  bad |= H5Gclose(gn) < 0;
  return bad ? -1 : 0;
}

/* /quant/activation/<node>, /quant/weight/<node>. */
static int write_records(writer *w, hid_t f, const qt_graph *g) {
  snprintf(w->where, sizeof w->where, "/quant");
  hid_t gq = qt_h5_group_create(f, "quant");
  if (gq < 0) return -1;
  hid_t ga = qt_h5_group_create(gq, "activation"), gw = qt_h5_group_create(gq, "weight");
  int bad = ga < 0 || gw < 0;
  for (int i = 0; i < g->n_nodes && !bad; i++) {
    if (g->nodes[i].q) bad = qt_qdq_write_qrecord(w, ga, g, i, g->nodes[i].q, 0, 0);
    if (!bad && g->nodes[i].wq) bad = qt_qdq_write_qrecord(w, gw, g, i, g->nodes[i].wq, 1, 0);
  }
  if (ga >= 0) bad |= H5Gclose(ga) < 0;
  if (gw >= 0) bad |= H5Gclose(gw) < 0;
  bad |= H5Gclose(gq) < 0;
  return bad ? -1 : 0;
}

static int write_graph(writer *w, hid_t f, const qt_graph *g, graph_kind kind) {
  if (write_root(w, f, g, kind) || write_values(w, f, g) || write_tensors(w, f, g) || write_nodes(w, f, g) ||
      write_records(w, f, g))
    return -1;
  return g->input_pre.set ? write_input_preprocessing(w, f, g) : 0;
}

int qt_qdq_save(const char *path, const qt_graph *g, char *err) {
  qt_h5_quiet();
  err[0] = 0;
  char msg[QT_ERR_LEN];
  if (!g->finalized) return qt_err(err, "qdq save '%s': graph '%s' is not finalized", path, g->name);
  for (int i = 0; i < g->n_nodes; i++)
    if (qt_qdq_bad_link_name(g->nodes[i].name))
      return qt_err(err, "qdq save '%s': node %d name '%s' is empty, '.' or holds '/', which an HDF5 name cannot", path,
                    i, g->nodes[i].name);
  for (int t = 0; t < g->n_tensors; t++) {
    const qt_param *p = &g->tensors[t];
    if (strchr(p->name, '/'))
      return qt_err(err, "qdq save '%s': tensor name '%s' holds '/', which an HDF5 name cannot", path, p->name);
    const size_t len = p->node >= 0 && p->node < g->n_nodes ? strlen(g->nodes[p->node].name) : 0;
    if (!len || strncmp(p->name, g->nodes[p->node].name, len) != 0 || p->name[len] != '.' || !p->name[len + 1])
      return qt_err(err, "qdq save '%s': tensor '%s' is not named '<owner node>.<suffix>' (owner node %d)", path,
                    p->name, p->node);
  }
  graph_kind kind = KIND_QDQ;
  if (qt_qdq_infer_kind(g, &kind, msg) || qt_qdq_validate_structure(g, kind, msg) ||
      qt_qdq_validate_quant(g, kind, msg) || (g->input_pre.set && qt_input_preprocessing_check(g, &g->input_pre, msg)))
    return qt_err(err, "qdq save '%s': %s", path, msg);

  char cmsg[QT_ERR_LEN];
  qt_h5_image *img;
  hid_t f = qt_h5_create_checksummed(path, &img, cmsg);
  if (f < 0) return qt_err(err, "qdq save '%s': %s", path, cmsg);
  writer w;
  snprintf(w.where, sizeof w.where, "the file");
  if (write_graph(&w, f, g, kind)) {
    qt_h5_discard(f, img);
    return qt_err(err, "qdq save '%s': writing %s failed (HDF5 failed in memory); '%s' is unchanged", path, w.where,
                  path);
  }
  if (qt_h5_commit(f, img, path, cmsg))
    return qt_err(err, "qdq save '%s': %s (disk full or not writable?); '%s' is unchanged", path, cmsg, path);
  return 0;
}
