/* The quantization training state in checkpoints (qat/qstate_file.h): the Q/DQ file's records
 * plus what training needs to continue bit for bit (flags, LSQ tensor, observer state). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qat/qdq_internal.h"
#include "base/h5.h"
#include "base/base.h"
#include "qat/qstate_file.h"

/* ---- training state in checkpoints (qat/qstate_file.h) ------------------------------------ */

#define QSTATE_FORMAT "qt-quant-state"
#define QSTATE_VERSION 1

/* batch_norm and conv_bn: the nodes with BN running statistics (and a bn_frozen flag). */
static int is_bn_node(const qt_node *n) {
  return qt_op_info_get(n->op)->buffer_use[QT_B_RUNNING_VAR] == QT_SLOT_REQUIRED;
}

int qt_graph_has_quant_state(const qt_graph *g) {
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    if (n->q || n->wq || qt_op_info_get(n->op)->graphs == QT_OP_PREPARED_ONLY) return 1;
  }
  return 0;
}

int qt_quant_state_write(hid_t f, const qt_graph *g, char *err) {
  qt_h5_quiet();
  for (int i = 0; i < g->n_nodes; i++)
    if (qt_qdq_bad_link_name(g->nodes[i].name))
      return qt_err(err, "/quant: node %d name '%s' is empty, '.' or holds '/', which an HDF5 name cannot", i,
                    g->nodes[i].name);
  writer w;
  snprintf(w.where, sizeof w.where, "/quant");
  hid_t gq = qt_h5_group_create(f, "quant");
  int bad = gq < 0 || qt_h5_attr_write_str(gq, "format", QSTATE_FORMAT) ||
            qt_h5_attr_write_int(gq, "format_version", QSTATE_VERSION);
  hid_t ga = bad ? -1 : qt_h5_group_create(gq, qt_qdq_record_names[QDQ_RECORD_ACTIVATION]),
        gw = bad ? -1 : qt_h5_group_create(gq, qt_qdq_record_names[QDQ_RECORD_WEIGHT]);
  bad = bad || ga < 0 || gw < 0;
  for (int i = 0; i < g->n_nodes && !bad; i++) {
    if (g->nodes[i].q) bad = qt_qdq_write_qrecord(&w, ga, g, i, g->nodes[i].q, 0, 1);
    if (!bad && g->nodes[i].wq) bad = qt_qdq_write_qrecord(&w, gw, g, i, g->nodes[i].wq, 1, 1);
  }
  if (!bad) snprintf(w.where, sizeof w.where, "/quant/bn");
  hid_t gb = bad ? -1 : qt_h5_group_create(gq, "bn");
  bad = bad || gb < 0;
  for (int i = 0; i < g->n_nodes && !bad; i++)
    if (is_bn_node(&g->nodes[i])) bad = qt_h5_attr_write_int(gb, g->nodes[i].name, g->nodes[i].bn_frozen ? 1 : 0);
  if (gb >= 0) bad |= H5Gclose(gb) < 0;
  if (ga >= 0) bad |= H5Gclose(ga) < 0;
  if (gw >= 0) bad |= H5Gclose(gw) < 0;
  if (gq >= 0) bad |= H5Gclose(gq) < 0;
  return bad ? qt_err(err, "writing %s failed", w.where) : 0;
}

struct qt_quant_state {
  int n_nodes;
  qt_qstate **act, **wt; /* per node, NULL where the node has none */
  int *bn_frozen;
};

void qt_quant_state_free(qt_quant_state *s) {
  if (!s) return;
  for (int i = 0; i < s->n_nodes; i++) {
    qt_qstate_free(s->act[i]);
    qt_qstate_free(s->wt[i]);
  }
  QT_FREE_ALL(s->act, s->wt, s->bn_frozen, s);
}

/* The stored spec must be the one this graph quantizes with. */
static int same_spec(const char *obj, const qt_qstate *got, const qt_qstate *want, char *msg) {
  const qt_qspec *a = &got->spec, *b = &want->spec;
  const char *tail = "in the checkpoint, but this run's prepared graph has";
#define SAME_INT(field, name) \
  if (a->field != b->field) return qt_err(msg, "%s: %s is %d %s %d", obj, name, (int)a->field, tail, (int)b->field)
  SAME_INT(bits, "bits");
  SAME_INT(qmin, "qmin");
  SAME_INT(qmax, "qmax");
  SAME_INT(is_signed, "signed");
  SAME_INT(symmetric, "symmetric");
  SAME_INT(per_channel, "per_channel");
  SAME_INT(bias_int32, "bias int32");
#undef SAME_INT
  if (got->channels != want->channels)
    return qt_err(msg, "%s: channels is %d %s %d", obj, got->channels, tail, want->channels);
  if (a->observer != b->observer)
    return qt_err(msg, "%s: observer is '%s' %s '%s'", obj, qt_observer_kind_name(a->observer), tail,
                  qt_observer_kind_name(b->observer));
  if (a->method != b->method)
    return qt_err(msg, "%s: method is '%s' %s '%s'", obj, qt_range_method_name(a->method), tail,
                  qt_range_method_name(b->method));
  if (memcmp(&a->percentile, &b->percentile, sizeof(float)) != 0)
    return qt_err(msg, "%s: percentile is %g %s %g", obj, a->percentile, tail, b->percentile);
  return 0;
}

/* The observer's running state must be one an observer can be in: a fresh one (min +inf, max
 * -inf, an empty histogram over [0, 0]), or one that has seen data (finite min <= max per
 * channel; a histogram over a finite range hist_min <= hist_max whose counts add up without
 * overflow). Anything else (a NaN or infinite range, an inverted one) would make the next
 * update write outside the histogram or never finish. */
static int observer_state_check(const char *obj, qt_observer_kind k, int initialized, int channels, const float *mn,
                                const float *mx, float hist_min, float hist_max, const int64_t *hist, int bins,
                                char *msg) {
  for (int c = 0; c < channels; c++) {
    if (!initialized && !(mn[c] == INFINITY && mx[c] == -INFINITY))
      return qt_err(msg, "%s: channel %d: min %g, max %g in an observer that has seen no data (expected inf, -inf)",
                    obj, c, mn[c], mx[c]);
    if (initialized && !(isfinite(mn[c]) && isfinite(mx[c]) && mn[c] <= mx[c]))
      return qt_err(msg, "%s: channel %d: min %g, max %g is not a finite range (min <= max)", obj, c, mn[c], mx[c]);
  }
  if (k != QT_OBSERVER_HISTOGRAM) return 0;
  if (!initialized && !(hist_min == 0 && hist_max == 0))
    return qt_err(msg, "%s: histogram range [%g, %g] in an observer that has seen no data (expected [0, 0])", obj,
                  hist_min, hist_max);
  if (!(isfinite(hist_min) && isfinite(hist_max) && hist_min <= hist_max))
    return qt_err(msg, "%s: histogram range [%g, %g] is not a finite range (hist_min <= hist_max)", obj, hist_min,
                  hist_max);
  int64_t total = 0;
  for (int b = 0; hist && b < bins; b++) {
    if (hist[b] < 0) return qt_err(msg, "%s: hist[%d] = %lld is negative", obj, b, (long long)hist[b]);
    if (hist[b] > INT64_MAX / 4 - total)
      return qt_err(msg, "%s: the histogram's counts add up to more than %lld", obj, (long long)(INT64_MAX / 4));
    total += hist[b];
  }
  if (!initialized && total)
    return qt_err(msg, "%s: the histogram holds %lld counts in an observer that has seen no data", obj,
                  (long long)total);
  return 0;
}

/* The record's flags, its learned scale (LSQ) and qparams: the same pow2_scale and LSQ tensor
 * as the graph's own state `want`, and qparams of the spec once calibrated. */
static int read_train_flags(hid_t r, const char *obj, const qt_graph *g, qt_qstate *q, const qt_qstate *want,
                            char *msg) {
  int pow2 = 0;
  if (read_attr_flag(r, obj, "observe", &q->observe, msg) ||
      read_attr_flag(r, obj, "fake_quant", &q->fake_quant, msg) ||
      read_attr_flag(r, obj, "calibrated", &q->calibrated, msg) || read_attr_flag(r, obj, "pow2_scale", &pow2, msg))
    return -1;
  if (pow2 != (want->spec.pow2_scale ? 1 : 0))
    return qt_err(msg, "%s: pow2_scale is %d in the checkpoint, but this run's prepared graph has %d", obj, pow2,
                  want->spec.pow2_scale ? 1 : 0);
  htri_t has = H5Aexists(r, "learned_scale");
  if (has < 0) return qt_err(msg, "%s: cannot read the attributes (corrupt file?)", obj);
  char lsq[2 * QT_NAME_LEN] = "";
  if (has && read_attr_str(r, obj, "learned_scale", lsq, sizeof lsq, msg)) return -1;
  const char *want_lsq = want->scale_param >= 0 ? g->tensors[want->scale_param].name : "";
  if (strcmp(lsq, want_lsq) != 0)
    return qt_err(msg, "%s: learned scale (LSQ) %s%s%s in the checkpoint, but %s%s%s in this run's prepared graph", obj,
                  lsq[0] ? "'" : "", lsq[0] ? lsq : "none", lsq[0] ? "'" : "", want_lsq[0] ? "'" : "",
                  want_lsq[0] ? want_lsq : "none", want_lsq[0] ? "'" : "");
  q->scale_param = want->scale_param;
  q->spec.pow2_scale = want->spec.pow2_scale;
  q->spec.learnable = want->spec.learnable;
  q->spec.fixed_scale = want->spec.fixed_scale;
  q->spec.fixed_zero_point = want->spec.fixed_zero_point;
  if (q->calibrated && q->spec.fixed_scale > 0 &&
      (q->scale[0] != q->spec.fixed_scale || q->zero_point[0] != q->spec.fixed_zero_point))
    return qt_err(msg, "%s: scale %g, zero point %d in the checkpoint, but this run's Quantizer fixes them at %g, %d",
                  obj, q->scale[0], q->zero_point[0], q->spec.fixed_scale, q->spec.fixed_zero_point);
  if (q->calibrated)
    for (int c = 0; c < q->channels; c++)
      if (!isfinite(q->scale[c]) || !(q->scale[c] > 0) || q->zero_point[c] < q->spec.qmin ||
          q->zero_point[c] > q->spec.qmax)
        return qt_err(msg, "%s: channel %d: scale %g, zero point %d are not qparams of [%d, %d]", obj, c, q->scale[c],
                      q->zero_point[c], q->spec.qmin, q->spec.qmax);
  return 0;
}

/* The settings of a stored observer (subgroup `observer` of a record). */
typedef struct {
  char kind_name[64], method_name[64];
  qt_observer_kind kind;
  qt_range_method method;
  int channels, bins, initialized;
  float averaging_constant, percentile;
} observer_attrs;

/* The observer's attributes into oa (its histogram range into o), which must describe the
 * graph's own observer wo. */
static int read_observer_attrs(hid_t og, const char *oobj, qt_observer *o, const qt_observer *wo, observer_attrs *oa,
                               char *msg) {
  if (read_attr_str(og, oobj, "kind", oa->kind_name, sizeof oa->kind_name, msg) ||
      read_attr_int(og, oobj, "channels", &oa->channels, msg) ||
      read_attr_float(og, oobj, "averaging_constant", &oa->averaging_constant, msg) ||
      read_attr_str(og, oobj, "method", oa->method_name, sizeof oa->method_name, msg) ||
      read_attr_float(og, oobj, "percentile", &oa->percentile, msg) ||
      read_attr_int(og, oobj, "bins", &oa->bins, msg) ||
      read_attr_flag(og, oobj, "initialized", &oa->initialized, msg) ||
      read_attr_float(og, oobj, "hist_min", &o->hist_min, msg) ||
      read_attr_float(og, oobj, "hist_max", &o->hist_max, msg))
    return -1;
  if (qt_observer_kind_parse(oa->kind_name, &oa->kind) || qt_range_method_parse(oa->method_name, &oa->method))
    return qt_err(msg, "%s: unknown observer '%s' or range method '%s'", oobj, oa->kind_name, oa->method_name);
  if (oa->kind != wo->kind || oa->channels != wo->channels || oa->method != wo->method ||
      memcmp(&oa->averaging_constant, &wo->averaging_constant, sizeof oa->averaging_constant) ||
      memcmp(&oa->percentile, &wo->percentile, sizeof oa->percentile) || oa->bins != wo->bins)
    return qt_err(
        msg,
        "%s: a %s observer (%d channels, averaging constant %g, method %s, percentile %g, %d bins) in the checkpoint, "
        "but this run's prepared graph has a %s observer (%d channels, averaging constant %g, method %s, percentile "
        "%g, %d bins)",
        oobj, oa->kind_name, oa->channels, oa->averaging_constant, oa->method_name, oa->percentile, oa->bins,
        qt_observer_kind_name(wo->kind), wo->channels, wo->averaging_constant, qt_range_method_name(wo->method),
        wo->percentile, wo->bins);
  return 0;
}

/* The optional dataset `hist`: histogram observers only. NULL in *hist when absent. */
static int read_observer_hist(hid_t og, const char *oobj, const observer_attrs *oa, int64_t **hist, char *msg) {
  htri_t has = H5Lexists(og, "hist", H5P_DEFAULT);
  if (has < 0) return qt_err(msg, "%s: cannot look up dataset 'hist' (corrupt file?)", oobj);
  if (has && oa->kind != QT_OBSERVER_HISTOGRAM)
    return qt_err(msg, "%s: a %s observer holds no histogram", oobj, oa->kind_name);
  if (!has) return 0;
  const int64_t nb[1] = {oa->bins};
  *hist = qdq_read_dataset(og, oobj, "hist", H5T_INTEGER, H5T_NATIVE_INT64, 1, nb, 1, NULL, NULL, msg);
  return *hist ? 0 : -1;
}

/* The observer's running state (subgroup `observer` of the record group r) into q->obs, checked
 * against the graph's own observer and for being a state an observer can be in. */
static int read_observer_state(hid_t r, const char *obj, qt_qstate *q, const qt_qstate *want, char *msg) {
  char oobj[QT_NAME_LEN + 48];
  snprintf(oobj, sizeof oobj, "%s/observer", obj);
  hid_t og = qdq_group_open(r, obj, "observer", msg);
  if (og < 0) return -1;
  qt_observer *o = &q->obs;
  observer_attrs oa;
  memset(&oa, 0, sizeof oa);
  int rc = -1;
  float *mn = NULL, *mx = NULL;
  int64_t *hist = NULL;
  if (read_observer_attrs(og, oobj, o, &want->obs, &oa, msg)) goto done;
  const int64_t ch[1] = {oa.channels};
  if (!(mn = qdq_read_dataset(og, oobj, "min", H5T_FLOAT, H5T_NATIVE_FLOAT, 1, ch, 1, NULL, NULL, msg)) ||
      !(mx = qdq_read_dataset(og, oobj, "max", H5T_FLOAT, H5T_NATIVE_FLOAT, 1, ch, 1, NULL, NULL, msg)) ||
      read_observer_hist(og, oobj, &oa, &hist, msg) ||
      observer_state_check(oobj, oa.kind, oa.initialized, oa.channels, mn, mx, o->hist_min, o->hist_max, hist, oa.bins,
                           msg))
    goto done;
  o->averaging_constant = oa.averaging_constant;
  o->method = oa.method;
  o->percentile = oa.percentile;
  o->bins = oa.bins;
  o->initialized = oa.initialized;
  memcpy(o->min, mn, (size_t)oa.channels * sizeof(float));
  memcpy(o->max, mx, (size_t)oa.channels * sizeof(float));
  free(o->hist);
  o->hist = hist;
  hist = NULL;
  rc = 0;
done:
  QT_FREE_ALL(mn, mx, hist);
  H5Gclose(og);
  return rc;
}

/* Reads the training state of the record group r into q (made by qt_qdq_read_qrecord_new from the
 * same group) and checks it against the graph's own state `want`. */
static int read_train_state(hid_t r, const char *obj, const qt_graph *g, qt_qstate *q, const qt_qstate *want,
                            char *msg) {
  if (read_train_flags(r, obj, g, q, want, msg)) return -1;
  return read_observer_state(r, obj, q, want, msg);
}

/* One record of node i: read, compared with the graph's, its training state added. */
static int read_state_record(hid_t gk, qdq_record_kind kind, const qt_graph *g, int i, qt_qstate **out, char *msg) {
  const qt_node *n = &g->nodes[i];
  const qt_qstate *want = kind == QDQ_RECORD_WEIGHT ? n->wq : n->q;
  char obj[QT_NAME_LEN + 32];
  snprintf(obj, sizeof obj, "/quant/%s/%s", qt_qdq_record_names[kind], n->name);
  htri_t has = H5Lexists(gk, n->name, H5P_DEFAULT);
  if (has < 0) return qt_err(msg, "%s: cannot look up the record (corrupt file?)", obj);
  if (!has)
    return qt_err(msg, "%s: missing: this run's prepared graph quantizes %s %s, the checkpoint does not", obj,
                  kind == QDQ_RECORD_WEIGHT ? "the weight of" : "the activation at", n->name);
  qt_qstate *q = NULL;
  if (qt_qdq_read_qrecord_new(gk, kind, KIND_PREPARED, g, i, &q, msg)) return -1;
  hid_t r = -1;
  int rc = same_spec(obj, q, want, msg);
  if (!rc && (r = qdq_group_open(gk, "/quant", n->name, msg)) < 0) rc = -1;
  if (!rc) rc = read_train_state(r, obj, g, q, want, msg);
  if (r >= 0) H5Gclose(r);
  if (rc) {
    qt_qstate_free(q);
    return -1;
  }
  *out = q;
  return 0;
}

typedef struct {
  const qt_graph *g;
  char *msg;
} bn_check;

static herr_t bn_attr_known(hid_t loc, const char *name, const H5A_info_t *info, void *data) {
  (void)loc;
  (void)info;
  bn_check *c = data;
  int i = qt_graph_find_node(c->g, name);
  if (i < 0 || !is_bn_node(&c->g->nodes[i])) {
    qt_err(c->msg, "/quant/bn: a flag for '%s', which is no batch_norm or conv_bn node of this run's prepared graph",
           name);
    return -1;
  }
  return 0;
}

qt_quant_state *qt_quant_state_read(hid_t f, const qt_graph *g, char *err) {
  qt_h5_quiet();
  err[0] = 0;
  qt_quant_state *s = calloc(1, sizeof *s);
  QT_ASSERT(s, "out of memory");
  s->n_nodes = g->n_nodes;
  s->act = calloc((size_t)g->n_nodes + 1, sizeof *s->act);
  s->wt = calloc((size_t)g->n_nodes + 1, sizeof *s->wt);
  s->bn_frozen = calloc((size_t)g->n_nodes + 1, sizeof *s->bn_frozen);
  QT_ASSERT(s->act && s->wt && s->bn_frozen, "out of memory");
  hid_t gq = -1, ga = -1, gw = -1, gb = -1;
  int ok = 0, version = 0;
  char format[64];
  if ((gq = qdq_group_open(f, "/", "quant", err)) < 0 ||
      read_attr_str(gq, "/quant", "format", format, sizeof format, err) ||
      read_attr_int(gq, "/quant", "format_version", &version, err))
    goto done;
  if (strcmp(format, QSTATE_FORMAT) != 0 || version != QSTATE_VERSION) {
    qt_err(err, "/quant: format '%s' version %d; this build reads '%s' version %d", format, version, QSTATE_FORMAT,
           QSTATE_VERSION);
    goto done;
  }
  if ((ga = qdq_group_open(gq, "/quant", qt_qdq_record_names[QDQ_RECORD_ACTIVATION], err)) < 0 ||
      (gw = qdq_group_open(gq, "/quant", qt_qdq_record_names[QDQ_RECORD_WEIGHT], err)) < 0 ||
      (gb = qdq_group_open(gq, "/quant", "bn", err)) < 0)
    goto done;
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    if (n->q && read_state_record(ga, QDQ_RECORD_ACTIVATION, g, i, &s->act[i], err)) goto done;
    if (n->wq && read_state_record(gw, QDQ_RECORD_WEIGHT, g, i, &s->wt[i], err)) goto done;
    if (is_bn_node(n)) {
      htri_t has = H5Aexists(gb, n->name);
      if (has < 0) {
        qt_err(err, "/quant/bn: cannot read the attributes (corrupt file?)");
        goto done;
      }
      if (!has) {
        qt_err(err, "/quant/bn: no flag for %s node '%s' of this run's prepared graph", qt_op_name(n->op), n->name);
        goto done;
      }
      if (read_attr_flag(gb, "/quant/bn", n->name, &s->bn_frozen[i], err)) goto done;
    }
  }
  if (qt_qdq_check_records_claimed(ga, QDQ_RECORD_ACTIVATION, g, err) ||
      qt_qdq_check_records_claimed(gw, QDQ_RECORD_WEIGHT, g, err))
    goto done;
  bn_check bc = {g, err};
  hsize_t idx = 0;
  if (H5Aiterate2(gb, H5_INDEX_NAME, H5_ITER_NATIVE, &idx, bn_attr_known, &bc) < 0) {
    if (!err[0]) qt_err(err, "/quant/bn: cannot list the attributes (corrupt file?)");
    goto done;
  }
  ok = 1;
done:
  QT_H5_CLOSE_ALL(gb, ga, gw, gq);
  if (!ok) {
    qt_quant_state_free(s);
    return NULL;
  }
  return s;
}

/* Copies src's qparams, flags and observer state into dst (the same spec). */
static void qstate_assign(qt_qstate *dst, const qt_qstate *src) {
  char err[QT_ERR_LEN];
  memcpy(dst->scale, src->scale, (size_t)src->channels * sizeof(float));
  memcpy(dst->zero_point, src->zero_point, (size_t)src->channels * sizeof(int32_t));
  dst->observe = src->observe;
  dst->fake_quant = src->fake_quant;
  dst->calibrated = src->calibrated;
  QT_ASSERT(qt_observer_copy(&dst->obs, &src->obs, err) == 0, "copying an observer: %s", err);
}

void qt_quant_state_apply(qt_graph *g, qt_quant_state *s) {
  QT_ASSERT(s->n_nodes == g->n_nodes, "quant state of %d nodes applied to a graph of %d", s->n_nodes, g->n_nodes);
  for (int i = 0; i < g->n_nodes; i++) {
    qt_node *n = &g->nodes[i];
    if (s->act[i]) qstate_assign(n->q, s->act[i]);
    if (s->wt[i]) qstate_assign(n->wq, s->wt[i]);
    if (is_bn_node(n)) n->bn_frozen = s->bn_frozen[i];
  }
  qt_quant_state_free(s);
}
