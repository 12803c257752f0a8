/* The three-stage accuracy report (report.h): one pass over the test set through the fp32
 * graph, the Q/DQ graph and the lowered int8 model, compared point by point. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eval/exact.h"
#include "base/base.h"
#include "eval/report.h"

enum { QT_REPORT_MAX_BATCH = 64 };

const char *qt_point_kind_name(qt_point_kind k) {
  static const char *const names[] = {"activation", "weight", "output"};
  _Static_assert(sizeof names / sizeof names[0] == QT_POINT_KIND_COUNT, "point kind names out of sync");
  return (unsigned)k < QT_POINT_KIND_COUNT ? names[k] : "?";
}

/* How one activation point (or the fp32 output) is measured in every batch. */
typedef struct {
  int point;          /* index into r->points */
  int qdq_value;      /* the Q/DQ graph's value at the point (the dequantize's output) */
  int fp32_value;     /* the fp32 graph's value of the same name, or -1 */
  int device_output;  /* the point is the graph output: compare with the device's output */
  int probe;          /* else read the device with a probe (probe_points) */
  int quant_value;    /* an activation point: the quantize's output (the integers), else -1 */
  const qt_qstate *q; /* and its qparams */
} point_plan;

/* The value of that name with that many elements per sample, or -1. */
static int find_value(const qt_graph *g, const char *name, int64_t numel) {
  for (int v = 0; v < g->n_values; v++)
    if (strcmp(g->values[v].name, name) == 0) return qt_value_numel(&g->values[v]) == numel ? v : -1;
  return -1;
}

/* Whether a consumer of value v overwrote it in place (the executor runs BN and ReLU in place
 * on a value nothing else reads): then values[v] no longer holds v. Flatten is a view. */
static int overwritten(const qt_graph *g, qt_tensor *const *values, int v) {
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    if (n->op == QT_OP_FLATTEN || !values[n->output]) continue;
    for (int k = 0; k < n->n_inputs; k++)
      if (n->inputs[k] == v && values[n->output]->data == values[v]->data) return 1;
  }
  return 0;
}

static qt_report_point *add_point(qt_report *r, const char *name, qt_point_kind kind, char *err) {
  if (r->n_points == QT_REPORT_MAX_POINTS) {
    snprintf(err, QT_ERR_LEN, "report: more than %d quantization points and weights (at '%s')", QT_REPORT_MAX_POINTS,
             name);
    return NULL;
  }
  qt_report_point *p = &r->points[r->n_points++];
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "%s", name);
  p->kind = kind;
  return p;
}

/* Each integer weight against the float weight convert quantized (kept in the Q/DQ slab). */
static int add_weight_points(const qt_graph *qdq, qt_report *r, char *err) {
  for (int i = 0; i < qdq->n_nodes; i++) {
    const qt_node *n = &qdq->nodes[i];
    if (!n->wq || !n->wq->qweight || n->param[QT_P_WEIGHT] < 0) continue;
    const qt_param *t = &qdq->tensors[n->param[QT_P_WEIGHT]];
    QT_ASSERT(n->wq->n_qweight == t->numel, "weight %s: %lld integers for %lld floats", t->name,
              (long long)n->wq->n_qweight, (long long)t->numel);
    qt_report_point *p = add_point(r, t->name, QT_POINT_WEIGHT, err);
    if (!p) return -1;
    float *deq = malloc((size_t)t->numel * sizeof(float));
    QT_ASSERT(deq, "out of memory for weight %s", t->name);
    const int ch = n->wq->channels; /* per channel: axis 0 (OIHW / (OUT, IN)) */
    qt_dequantize(deq, n->wq->qweight, 1, ch, t->numel / ch, n->wq->scale, n->wq->zero_point);
    qt_sqnr_add(&p->fp32_vs_qdq, qdq->params + t->offset, deq, t->numel);
    free(deq);
  }
  return 0;
}

/* Plans the activation points (and the output when it is fp32). */
static int plan_points(qt_graph *fp32, const qt_graph *qdq, qt_report *r, point_plan *plans, int *n_plans, char *err) {
  int output_covered = 0;
  *n_plans = 0;
  for (int i = 0; i < qdq->n_nodes; i++) {
    const qt_node *q = &qdq->nodes[i];
    if (q->op != QT_OP_QUANTIZE) continue;
    int dq = -1;
    for (int j = i + 1; j < qdq->n_nodes && dq < 0; j++)
      if (qdq->nodes[j].op == QT_OP_DEQUANTIZE && qdq->nodes[j].inputs[0] == q->output) dq = j;
    if (dq < 0) continue;
    const int v = qdq->nodes[dq].output;
    /* The point is named after the fp32 graph's value it quantizes: convert names the pair
     * "<value>.fq.quantize" after it. Not the quantize's input: PTQ folds conv -> bn, so there
     * the fp32 graph's "bn" value is read from the folded "conv" node. */
    char name[QT_NAME_LEN];
    const char *suffix = ".fq.quantize";
    const size_t len = strlen(q->name), sl = strlen(suffix);
    if (len > sl && strcmp(q->name + len - sl, suffix) == 0)
      snprintf(name, sizeof name, "%.*s", (int)(len - sl), q->name);
    else
      snprintf(name, sizeof name, "%s", qdq->values[q->inputs[0]].name);
    qt_report_point *p = add_point(r, name, QT_POINT_ACTIVATION, err);
    if (!p) return -1;
    point_plan *pl = &plans[(*n_plans)++];
    memset(pl, 0, sizeof *pl);
    pl->point = r->n_points - 1;
    pl->qdq_value = v;
    pl->quant_value = q->output;
    pl->q = q->q;
    pl->fp32_value = fp32 ? find_value(fp32, name, qt_value_numel(&qdq->values[v])) : -1;
    p->is_output = pl->device_output = v == qdq->output;
    output_covered |= p->is_output;
    pl->probe = !pl->device_output;
  }
  if (!output_covered) {
    const qt_value *ov = &qdq->values[qdq->output];
    qt_report_point *p = add_point(r, ov->name, QT_POINT_OUTPUT, err);
    if (!p) return -1;
    p->is_output = 1;
    point_plan *pl = &plans[(*n_plans)++];
    memset(pl, 0, sizeof *pl);
    pl->point = r->n_points - 1;
    pl->qdq_value = qdq->output;
    pl->quant_value = -1;
    pl->fp32_value = fp32 ? find_value(fp32, ov->name, qt_value_numel(ov)) : -1;
    pl->device_output = 1;
  }
  return 0;
}

/* The models agree with each other and with the test set: 0, or -1 with err. */
static int check_shapes(const qt_graph *fp32, const qt_graph *qdq, qt_device *device, const qt_dataset *ds, char *err) {
  int h, w, c;
  qt_device_input_shape(device, &h, &w, &c);
  const qt_value *qin = &qdq->values[qdq->input];
  if (qin->shape[0] != h || qin->shape[1] != w || qin->shape[2] != c) {
    snprintf(err, QT_ERR_LEN,
             "report: the lowered model takes %dx%dx%d images but the Q/DQ graph %s takes %lldx%lldx%lld", h, w, c,
             qdq->name, (long long)qin->shape[0], (long long)qin->shape[1], (long long)qin->shape[2]);
    return -1;
  }
  if (ds->h != h || ds->w != w || ds->c != c) {
    snprintf(err, QT_ERR_LEN, "report: model %s takes %dx%dx%d images, the test set holds %dx%dx%d", qdq->name, h, w, c,
             ds->h, ds->w, ds->c);
    return -1;
  }
  const int64_t classes = qt_device_output_numel(device);
  if (classes != qt_value_numel(&qdq->values[qdq->output])) {
    snprintf(err, QT_ERR_LEN, "report: the lowered model has %lld outputs, the Q/DQ graph %s %lld", (long long)classes,
             qdq->name, (long long)qt_value_numel(&qdq->values[qdq->output]));
    return -1;
  }
  if (fp32) {
    const qt_value *fin = &fp32->values[fp32->input], *fout = &fp32->values[fp32->output];
    if (fin->shape[0] != h || fin->shape[1] != w || fin->shape[2] != c || qt_value_numel(fout) != classes) {
      snprintf(err, QT_ERR_LEN,
               "report: the fp32 model %s (%lldx%lldx%lld -> %lld) does not match the Q/DQ graph %s "
               "(%dx%dx%d -> %lld)",
               fp32->name, (long long)fin->shape[0], (long long)fin->shape[1], (long long)fin->shape[2],
               (long long)qt_value_numel(fout), qdq->name, h, w, c, (long long)classes);
      return -1;
    }
  }
  return 0;
}

/* The device's partitions: counts, and the fallbacks it lists. */
static void add_partitions(qt_report *r, qt_device *device) {
  snprintf(r->backend, sizeof r->backend, "%s", qt_device_desc(device)->name);
  r->int8_partitions = qt_device_count(device, QT_PART_INT8);
  r->fallback_partitions = qt_device_count(device, QT_PART_FALLBACK);
  for (int i = 0; i < qt_device_partition_count(device) && r->n_fallbacks < QT_REPORT_MAX_FALLBACKS; i++) {
    const char *nodes, *detail;
    if (qt_device_partition(device, i, &nodes, &detail) != QT_PART_FALLBACK) continue;
    qt_report_fallback *f = &r->fallbacks[r->n_fallbacks++];
    snprintf(f->nodes, sizeof f->nodes, "%s", nodes);
    snprintf(f->reason, sizeof f->reason, "%s", detail);
  }
}

/* A report's run over the test set: the graphs, the device, what is kept and the buffers. */
typedef struct {
  qt_graph *fp32, *qdq;
  qt_device *device;
  qt_report *r;
  point_plan *plans;
  int n_plans, h, w, c;
  int64_t classes;
  qt_loader_config cfg;
  qt_loader *loader;
  qt_ctx *ctx;
  qt_exact *exact;
  float *out, *eo;                /* a batch of the device's and the exact reference's logits */
  unsigned char *keep_f, *keep_q; /* values the points compare, kept past their last consumer */
  int64_t forced_images;          /* images each partition is judged alone on */
  int32_t **forced;               /* per Q/DQ value: the device's integers there (forced_images), or NULL */
} report_run;

/* The values the points compare are kept; the graphs' others are reused after their last
 * consumer. overwritten() reads the outputs of a kept fp32 value's in-place consumers. */
static void keep_points(report_run *s) {
  const qt_graph *fp32 = s->fp32;
  s->keep_f = fp32 ? calloc((size_t)fp32->n_values, 1) : NULL;
  s->keep_q = calloc((size_t)s->qdq->n_values, 1);
  QT_ASSERT((!fp32 || s->keep_f) && s->keep_q, "out of memory");
  for (int k = 0; k < s->n_plans; k++) {
    s->keep_q[s->plans[k].qdq_value] = 1;
    if (s->plans[k].fp32_value >= 0) s->keep_f[s->plans[k].fp32_value] = 1;
  }
  for (int i = 0; fp32 && i < fp32->n_nodes; i++) {
    const qt_node *nd = &fp32->nodes[i];
    if ((nd->op == QT_OP_RELU || nd->op == QT_OP_RELU6 || nd->op == QT_OP_BATCH_NORM) && s->keep_f[nd->inputs[0]])
      s->keep_f[nd->output] = 1;
  }
}

/* The plans, the loader (in order, no augmentation), the kept values and the buffers. */
static int open_run(report_run *s, const qt_dataset *ds, const qt_loader_config *lc, char *err) {
  qt_report *r = s->r;
  s->plans = calloc((size_t)s->qdq->n_nodes + 1, sizeof *s->plans);
  QT_ASSERT(s->plans, "out of memory");
  if (!(s->exact = qt_exact_open(s->qdq, err))) return -1;
  qt_device_agreement_init(&r->float_vs_exact, r->output_scale);
  if (plan_points(s->fp32, s->qdq, r, s->plans, &s->n_plans, err) || add_weight_points(s->qdq, r, err)) return -1;
  s->cfg = *lc;
  s->cfg.shuffle = 0;
  s->cfg.crop_pad = 0;
  s->cfg.flip = 0;
  /* Every number here is per image, so the batch only sets the memory: the fp32 and Q/DQ graphs
   * keep all their values of a batch side by side (at 256 that was ~150 MB for FashionCNN). */
  if (s->cfg.batch_size > QT_REPORT_MAX_BATCH) s->cfg.batch_size = QT_REPORT_MAX_BATCH;
  if (qt_graph_check_memory(s->qdq, s->cfg.batch_size, err) ||
      (s->fp32 && qt_graph_check_memory(s->fp32, s->cfg.batch_size, err)))
    return -1;
  if (!(s->loader = qt_loader_create(ds, &s->cfg, err))) return -1;
  keep_points(s);
  s->out = malloc((size_t)s->cfg.batch_size * (size_t)s->classes * sizeof(float));
  s->eo = malloc((size_t)s->cfg.batch_size * (size_t)s->classes * sizeof(float));
  QT_ASSERT(s->out && s->eo, "out of memory for a batch of %d", s->cfg.batch_size);
  s->ctx = qt_ctx_create();
  qt_ctx_set_grad(s->ctx, 0);
  if (s->fp32) qt_graph_set_mode(s->fp32, QT_MODE_EVAL);
  qt_graph_set_mode(s->qdq, QT_MODE_EVAL);
  return 0;
}

static void close_run(report_run *s) {
  for (int v = 0; s->forced && v < s->qdq->n_values; v++) free(s->forced[v]);
  free(s->forced);
  qt_exact_free(s->exact);
  QT_FREE_ALL(s->plans, s->eo, s->out, s->keep_f, s->keep_q);
  qt_ctx_free(s->ctx);
  qt_loader_free(s->loader);
}

/* Whether the two largest of y[0..n) are equal (quantized logits on one integer). */
static int top2_tie(const float *y, int64_t n) {
  const int64_t k = qt_argmax(y, n);
  for (int64_t j = 0; j < n; j++)
    if (j != k && y[j] == y[k]) return 1;
  return 0;
}

/* Counts and compares one batch's answers: the fp32 graph's (fy, may be NULL), the exact
 * reference's (the Q/DQ graph's answer) and the device's; the points' SQNR. */
static void add_batch(report_run *s, const qt_tensor *fy, qt_tensor **fv, qt_tensor **qv, const int32_t *labels,
                      int n) {
  qt_report *r = s->r;
  const int64_t classes = s->classes;
  const float *qo = s->eo, *out = s->out;
  for (int i = 0; i < n; i++) {
    const int64_t off = (int64_t)i * classes;
    const int pq = (int)qt_argmax(qo + off, classes), pd = (int)qt_argmax(out + off, classes);
    if (fy) r->fp32_correct += (int)qt_argmax(qt_f32(fy) + off, classes) == labels[i];
    r->qdq_correct += pq == labels[i];
    if (r->output_scale > 0) r->qdq_top2_ties += top2_tie(qo + off, classes);
    r->device_correct += pd == labels[i];
    r->agree += pq == pd;
  }
  const int64_t numel = (int64_t)n * classes;
  for (int64_t k = 0; k < numel; k++) {
    const double d = fabs((double)out[k] - (double)qo[k]);
    if (d > r->max_abs_diff || d != d) r->max_abs_diff = d;
  }
  if (r->output_scale > 0) qt_lsb_histogram_add(&r->lsb, out, qo, numel, r->output_scale);
  qt_device_agreement_add(&r->agreement, out, qo, labels, n, classes);
  for (int k = 0; k < s->n_plans; k++) {
    const point_plan *pl = &s->plans[k];
    qt_report_point *p = &r->points[pl->point];
    const float *qd = pl->qdq_value == s->qdq->output ? qo : qt_f32(qv[pl->qdq_value]);
    const int64_t pn = (int64_t)n * qt_value_numel(&s->qdq->values[pl->qdq_value]);
    if (pl->fp32_value >= 0 && !overwritten(s->fp32, fv, pl->fp32_value))
      qt_sqnr_add(&p->fp32_vs_qdq, qt_f32(fv[pl->fp32_value]), qd, pn);
    if (pl->device_output) qt_sqnr_add(&p->qdq_vs_device, qd, out, pn);
  }
  r->images += n;
}

/* The whole test set through the fp32 graph, the Q/DQ graph, the exact reference and the device. */
static int run_test_set(report_run *s, char *err) {
  const float *x;
  const int32_t *labels;
  int n;
  qt_loader_start_epoch(s->loader, 0);
  while ((n = qt_loader_next(s->loader, &x, &labels)) > 0) {
    qt_ctx_reset(s->ctx);
    const int64_t shape[4] = {n, s->h, s->w, s->c};
    qt_tensor **fv = NULL, **qv = NULL;
    qt_tensor *fy = NULL;
    if (s->fp32 && !(fy = qt_graph_forward_keep(s->fp32, s->ctx, qt_tensor_wrap(s->ctx, QT_F32, 4, shape, (void *)x),
                                                &fv, NULL, s->keep_f))) {
      snprintf(err, QT_ERR_LEN, "report: fp32 model: %s", s->fp32->error);
      return -1;
    }
    qt_tensor *qy = qt_graph_forward_keep(s->qdq, s->ctx, qt_tensor_wrap(s->ctx, QT_F32, 4, shape, (void *)x), &qv,
                                          NULL, s->keep_q);
    if (!qy) {
      snprintf(err, QT_ERR_LEN, "report: Q/DQ graph: %s", s->qdq->error);
      return -1;
    }
    if (qt_device_run(s->device, s->out, x, n, err) || qt_exact_run(s->exact, s->eo, x, n, err)) return -1;
    /* The Q/DQ graph's answer is the exact reference's; the float executor is measured against it. */
    qt_device_agreement_add(&s->r->float_vs_exact, qt_f32(qy), s->eo, labels, n, s->classes);
    add_batch(s, fy, fv, qv, labels, n);
  }
  if (s->r->images == 0) {
    snprintf(err, QT_ERR_LEN, "report: the test set is empty");
    return -1;
  }
  return 0;
}

/* The integers behind n values a device dequantized with q (as a dequantize computes them in
 * float32, (i - zp) * s): i = round(v / s) + zp in float64 recovers them exactly. */
static void device_integers(int32_t *out, const float *v, int64_t n, const qt_qstate *q) {
  const int C = q->channels;
  for (int64_t k = 0; k < n; k++) {
    const int c = (int)(k % C);
    out[k] = (int32_t)(nearbyint((double)v[k] / (double)q->scale[c]) + q->zero_point[c]);
  }
}

/* The device at one point (qt_device_read_value): at an intermediate point, its SQNR against the
 * float32 Q/DQ executor over the first probe_images images; at an activation point, its integers
 * over the first forced_images images, kept for judging the partitions alone. */
static int probe_point(report_run *s, const point_plan *pl, int64_t probe_images, char *err) {
  qt_report_point *p = &s->r->points[pl->point];
  const char *value = s->qdq->values[pl->qdq_value].name;
  const int64_t per_sample = qt_value_numel(&s->qdq->values[pl->qdq_value]);
  QT_ASSERT(qt_device_value_numel(s->device, value) == per_sample, "probe %s: wrong value size", p->name);
  const int64_t forced = pl->quant_value >= 0 ? s->forced_images : 0;
  const int64_t images = pl->probe ? (probe_images > forced ? probe_images : forced) : forced;
  if (images == 0) return 0;
  if (forced) {
    s->forced[pl->quant_value] = malloc((size_t)(forced * per_sample) * sizeof(int32_t));
    QT_ASSERT(s->forced[pl->quant_value], "out of memory for %lld values", (long long)(forced * per_sample));
  }
  float *po = malloc((size_t)s->cfg.batch_size * (size_t)per_sample * sizeof(float));
  QT_ASSERT(po, "out of memory for a batch of %d", s->cfg.batch_size);
  int64_t seen = 0;
  int n, rc = 0;
  const float *x;
  const int32_t *labels;
  qt_loader_start_epoch(s->loader, 0);
  while (seen < images && (n = qt_loader_next(s->loader, &x, &labels)) > 0) {
    if (n > images - seen) n = (int)(images - seen);
    if ((rc = qt_device_read_value(s->device, value, po, x, n, err))) break;
    if (seen < forced) {
      const int64_t m = forced - seen < n ? forced - seen : n;
      device_integers(s->forced[pl->quant_value] + seen * per_sample, po, m * per_sample, pl->q);
    }
    const int64_t m = pl->probe && seen < probe_images ? (probe_images - seen < n ? probe_images - seen : n) : 0;
    if (m > 0) {
      qt_ctx_reset(s->ctx);
      const int64_t shape[4] = {m, s->h, s->w, s->c};
      qt_tensor **qv = NULL;
      if (!qt_graph_forward_keep(s->qdq, s->ctx, qt_tensor_wrap(s->ctx, QT_F32, 4, shape, (void *)x), &qv, NULL,
                                 s->keep_q)) {
        snprintf(err, QT_ERR_LEN, "report: Q/DQ graph: %s", s->qdq->error);
        rc = -1;
        break;
      }
      qt_sqnr_add(&p->qdq_vs_device, qt_f32(qv[pl->qdq_value]), po, m * per_sample);
    }
    seen += n;
  }
  if (!rc && pl->probe) s->r->probe_images = seen < probe_images ? seen : probe_images;
  free(po);
  return rc;
}

/* How many images each partition is judged alone on: the first probe images, at most
 * QT_REPORT_FORCED_IMAGES and QT_REPORT_FORCED_VALUES integers in all; 0 without probes. */
static int64_t forced_image_count(const report_run *s, int64_t probe_images) {
  int64_t per_image = 0;
  for (int k = 0; k < s->n_plans; k++)
    if (s->plans[k].quant_value >= 0) per_image += qt_value_numel(&s->qdq->values[s->plans[k].quant_value]);
  int64_t n = probe_images < QT_REPORT_FORCED_IMAGES ? probe_images : QT_REPORT_FORCED_IMAGES;
  if (per_image > 0 && n > QT_REPORT_FORCED_VALUES / per_image) n = QT_REPORT_FORCED_VALUES / per_image;
  return per_image > 0 && n > 0 ? n : 0;
}

/* Each partition alone: the exact reference run on the first forced_images images with the
 * device's integers forced at every activation point, its own integers there compared with the
 * device's. */
static int judge_partitions(report_run *s, char *err) {
  const qt_graph *g = s->qdq;
  int32_t **own = calloc((size_t)g->n_values, sizeof *own);
  const int32_t **forced = calloc((size_t)g->n_values, sizeof *forced);
  QT_ASSERT(own && forced, "out of memory");
  for (int k = 0; k < s->n_plans; k++) {
    const int v = s->plans[k].quant_value;
    if (v < 0) continue;
    own[v] = malloc((size_t)s->cfg.batch_size * (size_t)qt_value_numel(&g->values[v]) * sizeof(int32_t));
    QT_ASSERT(own[v], "out of memory for a batch of %d", s->cfg.batch_size);
  }
  int64_t seen = 0;
  int n, rc = 0;
  const float *x;
  const int32_t *labels;
  qt_loader_start_epoch(s->loader, 0);
  while (seen < s->forced_images && (n = qt_loader_next(s->loader, &x, &labels)) > 0) {
    if (n > s->forced_images - seen) n = (int)(s->forced_images - seen);
    for (int k = 0; k < s->n_plans; k++) {
      const int v = s->plans[k].quant_value;
      if (v >= 0) forced[v] = s->forced[v] + seen * qt_value_numel(&g->values[v]);
    }
    if ((rc = qt_exact_run_forced(s->exact, s->eo, x, n, forced, own, err))) break;
    for (int k = 0; k < s->n_plans; k++) {
      const int v = s->plans[k].quant_value;
      if (v < 0) continue;
      qt_report_point *p = &s->r->points[s->plans[k].point];
      const int64_t m = (int64_t)n * qt_value_numel(&g->values[v]);
      for (int64_t e = 0; e < m; e++) {
        const int64_t d = llabs((int64_t)own[v][e] - (int64_t)forced[v][e]);
        p->forced_differ += d != 0;
        p->forced_over += d > QT_AGREEMENT_MAX_LSB;
        if (d > p->forced_max) p->forced_max = d;
      }
      p->forced_n += m;
    }
    seen += n;
  }
  if (!rc) s->r->forced_images = seen;
  for (int v = 0; v < g->n_values; v++) free(own[v]);
  free(own);
  free((void *)forced);
  return rc;
}

int qt_report_run(qt_graph *fp32, qt_graph *qdq, qt_device *device, const qt_dataset *ds, const qt_loader_config *lc,
                  int64_t probe_images, qt_report *r, char *err) {
  memset(r, 0, sizeof *r);
  if (check_shapes(fp32, qdq, device, ds, err)) return -1;
  report_run s = {.fp32 = fp32, .qdq = qdq, .device = device, .r = r, .classes = qt_device_output_numel(device)};
  qt_device_input_shape(device, &s.h, &s.w, &s.c);
  r->has_fp32 = fp32 != NULL;
  add_partitions(r, device);
  r->output_scale = qt_output_lsb(qdq);
  qt_device_agreement_init(&r->agreement, r->output_scale);
  int rc = open_run(&s, ds, lc, err) || run_test_set(&s, err) ? -1 : 0;
  if (!rc && (s.forced_images = forced_image_count(&s, probe_images)) > 0) {
    s.forced = calloc((size_t)qdq->n_values, sizeof *s.forced);
    QT_ASSERT(s.forced, "out of memory");
  }
  for (int k = 0; !rc && k < s.n_plans && probe_images > 0; k++) rc = probe_point(&s, &s.plans[k], probe_images, err);
  if (!rc && s.forced_images > 0) rc = judge_partitions(&s, err);
  close_run(&s);
  if (rc) return -1;
  const double N = (double)r->images;
  r->fp32_accuracy = fp32 ? (double)r->fp32_correct / N : 0;
  r->qdq_accuracy = (double)r->qdq_correct / N;
  r->device_accuracy = (double)r->device_correct / N;
  r->top1_agreement = (double)r->agree / N;
  return 0;
}

/* ---- verdict, text and JSON ------------------------------------------------------------- */

double qt_report_stage1_loss(const qt_report *r) {
  if (!r->has_fp32 || r->images == 0) return NAN;
  return 100.0 * (double)(r->fp32_correct - r->qdq_correct) / (double)r->images;
}

double qt_report_stage2_loss(const qt_report *r) {
  if (r->images == 0) return NAN;
  return 100.0 * (double)(r->qdq_correct - r->device_correct) / (double)r->images;
}

void qt_report_verdict(const qt_report *r, char *buf, size_t len) {
  const double s1 = qt_report_stage1_loss(r), s2 = qt_report_stage2_loss(r);
  /* Judged on whole images: a stage lost accuracy when it got fewer images right. */
  const int64_t l1 = r->has_fp32 ? r->fp32_correct - r->qdq_correct : 0, l2 = r->qdq_correct - r->device_correct;
  char a[160], b[160];
  if (r->has_fp32)
    snprintf(a, sizeof a, "stage 1 (fp32 -> Q/DQ: quantization) lost %.2f points", s1);
  else
    snprintf(a, sizeof a, "stage 1 (fp32 -> Q/DQ: quantization) not measured (no fp32 model)");
  snprintf(b, sizeof b, "stage 2 (Q/DQ -> int8 device: lowering) lost %.2f points", s2);
  const char *who;
  if (l1 > 0 && l2 > 0)
    who = l1 >= l2 ? "both stages lost accuracy, stage 1 (quantization) the most"
                   : "both stages lost accuracy, stage 2 (lowering) the most";
  else if (l1 > 0)
    who = "the accuracy was lost in stage 1 (quantization: the quantizer settings or QAT)";
  else if (l2 > 0)
    who = "the accuracy was lost in stage 2 (lowering: the backend's integer kernels)";
  else if (r->has_fp32)
    who = "neither stage lost accuracy";
  else
    who = "stage 2 lost no accuracy";
  int k = snprintf(buf, len, "%s; %s: %s", a, b, who);
  /* Each partition judged alone: the first over the rule (graph order), and the largest difference. */
  const qt_report_point *bad = NULL;
  int64_t worst = 0;
  for (int i = 0; i < r->n_points; i++) {
    const qt_report_point *p = &r->points[i];
    if (p->forced_n == 0) continue;
    if (!bad && p->forced_over > 0) bad = p;
    if (p->forced_max > worst) worst = p->forced_max;
  }
  if (k >= 0 && (size_t)k < len && bad) {
    snprintf(buf + k, len - (size_t)k,
             "; judged alone on the device's own inputs (the first %lld images), the partition ending at '%s' is "
             "%lld LSB from the exact reference (%lld of %lld integers more than %g LSB apart): a lowering bug",
             (long long)r->forced_images, bad->name, (long long)bad->forced_max, (long long)bad->forced_over,
             (long long)bad->forced_n, QT_AGREEMENT_MAX_LSB);
    return;
  }
  if (k >= 0 && (size_t)k < len && r->forced_images > 0 && r->agreement.images > 0 &&
      !qt_device_agreement_pass(&r->agreement)) {
    char diff[96];
    if (r->output_scale > 0)
      snprintf(diff, sizeof diff, "is %.1f output LSB away from the Q/DQ graph", r->agreement.max_lsb);
    else
      snprintf(diff, sizeof diff, "differs from the Q/DQ graph");
    snprintf(buf + k, len - (size_t)k,
             "; the device %s with identical top-1 on %.2f%% of images (the rule: %s), but every partition ending "
             "at a quantization point, judged alone on the device's own inputs (the first %lld images), keeps within "
             "%lld LSB of the exact reference: rounding that grows through the layers, not a lowering bug",
             diff, 100 * qt_device_agreement_top1(&r->agreement), qt_device_agreement_rule(),
             (long long)r->forced_images, (long long)worst);
    return;
  }
  /* The framework's float32 executor as far from the exact reference as the device, or farther: the
   * graph's fp32 ops between quantizers (computed in float32 by both, in float64 by the reference)
   * move a value near a rounding tie to the other side, which no lowering avoids. The LSB counts
   * are whole numbers up to float rounding (2.000001 against 1.999997): compared to 0.01 LSB. */
  const qt_device_agreement *fe = &r->float_vs_exact;
  const int like_float = fe->images > 0 && !qt_device_agreement_pass(fe) && r->output_scale > 0 &&
                         fe->max_lsb + 0.01 >= r->agreement.max_lsb &&
                         qt_device_agreement_top1(fe) <= qt_device_agreement_top1(&r->agreement);
  if (k >= 0 && (size_t)k < len && r->agreement.images > 0 && !qt_device_agreement_pass(&r->agreement) && like_float) {
    snprintf(buf + k, len - (size_t)k,
             "; the device is %.1f output LSB away from the Q/DQ graph's exact reference with identical top-1 on "
             "%.2f%% of images, as the float32 Q/DQ executor is (%.1f LSB, %.2f%%): the graph's fp32 ops, in float32 "
             "there and in float64 in the reference, put values near a rounding tie on either side, which no "
             "lowering avoids (the rule: %s)",
             r->agreement.max_lsb, 100 * qt_device_agreement_top1(&r->agreement), fe->max_lsb,
             100 * qt_device_agreement_top1(fe), qt_device_agreement_rule());
  } else if (k >= 0 && (size_t)k < len && r->agreement.images > 0 && !qt_device_agreement_pass(&r->agreement)) {
    if (r->output_scale > 0)
      snprintf(buf + k, len - (size_t)k,
               "; the device is %.1f output LSB away from the Q/DQ graph with identical top-1 on %.2f%% of images "
               "(the rule: %s): a lowering bug",
               r->agreement.max_lsb, 100 * qt_device_agreement_top1(&r->agreement), qt_device_agreement_rule());
    else
      snprintf(buf + k, len - (size_t)k,
               "; the device has identical top-1 on %.2f%% of images (the rule: %s): a lowering bug",
               100 * qt_device_agreement_top1(&r->agreement), qt_device_agreement_rule());
  }
}

static void fmt_db(char *buf, size_t n, const qt_sqnr_sum *s, const char *none) {
  const double db = qt_sqnr_sum_db(s);
  if (s->n == 0)
    snprintf(buf, n, "%s", none);
  else if (isinf(db))
    snprintf(buf, n, db > 0 ? "inf (identical)" : "-inf");
  else
    snprintf(buf, n, "%.2f", db);
}

void qt_report_print(const qt_report *r, FILE *f) {
  fprintf(f, "three-stage report on %lld test images (backend %s: %d int8, %d fallback partitions):\n",
          (long long)r->images, r->backend, r->int8_partitions, r->fallback_partitions);
  if (r->has_fp32)
    fprintf(f, "  fp32 model      top-1 %6.2f%%\n", 100 * r->fp32_accuracy);
  else
    fprintf(f, "  fp32 model      not given\n");
  fprintf(f, "  Q/DQ graph      top-1 %6.2f%%", 100 * r->qdq_accuracy);
  if (r->has_fp32) fprintf(f, "   stage 1 (quantization) lost %.2f points", qt_report_stage1_loss(r));
  fprintf(f, "\n  int8 device     top-1 %6.2f%%   stage 2 (lowering) lost %.2f points\n", 100 * r->device_accuracy,
          qt_report_stage2_loss(r));
  fprintf(f, "  Q/DQ vs device: identical top-1 on %.2f%% of images; ", 100 * r->top1_agreement);
  if (r->output_scale > 0)
    fprintf(f, "logit differences in output LSB (%.6g): max %.2f; 0 LSB %lld, 1 LSB %lld, 2 LSB %lld, >2 LSB %lld\n",
            (double)r->output_scale, r->lsb.max_lsb, (long long)r->lsb.count[0], (long long)r->lsb.count[1],
            (long long)r->lsb.count[2], (long long)r->lsb.count[3]);
  else
    fprintf(f, "fp32 output (no LSB): max logit difference %.6g\n", r->max_abs_diff);
  if (r->qdq_top2_ties)
    fprintf(f,
            "  quantized logits: the two largest are equal on %lld of %lld images (%.2f%%), where the first class "
            "wins; quant.fp32_output = true keeps the logits in fp32\n",
            (long long)r->qdq_top2_ties, (long long)r->images, 100.0 * (double)r->qdq_top2_ties / (double)r->images);
  const qt_device_agreement *fe = &r->float_vs_exact;
  if (fe->images > 0) {
    fprintf(f, "  Q/DQ graph = its exact integer reference; the float32 Q/DQ executor against it: ");
    if (fe->output_scale > 0)
      fprintf(f, "max %.2f LSB, %lld of %lld logits differ", fe->max_lsb, (long long)fe->differ,
              (long long)fe->outputs);
    else
      fprintf(f, "max difference %.3g, %lld of %lld logits differ", fe->max_abs_diff, (long long)fe->differ,
              (long long)fe->outputs);
    fprintf(f, ", top-1 differs on %lld images\n", (long long)(fe->images - fe->agree));
  }
  if (r->forced_images > 0)
    fprintf(f,
            "  alone: each partition on the device's own inputs, the device's integers at its point against the exact "
            "reference's (max LSB; first %lld images)\n",
            (long long)r->forced_images);
  fprintf(f, "  SQNR (dB) at each quantization point   %-16s %-16s%s", "fp32 vs Q/DQ", "Q/DQ vs device",
          r->forced_images > 0 ? " alone" : "");
  if (r->probe_images > 0 && r->probe_images < r->images)
    fprintf(f, " (inside the graph: first %lld images)", (long long)r->probe_images);
  fprintf(f, "\n");
  for (int i = 0; i < r->n_points; i++) {
    const qt_report_point *p = &r->points[i];
    char a[32], b[32], name[160];
    fmt_db(a, sizeof a, &p->fp32_vs_qdq, r->has_fp32 ? "-" : "(no fp32)");
    fmt_db(b, sizeof b, &p->qdq_vs_device,
           p->kind == QT_POINT_WEIGHT ? "(same integers)"
           : r->probe_images          ? "-"
                                      : "(not probed)");
    snprintf(name, sizeof name, "%s (%s%s)", p->name, qt_point_kind_name(p->kind),
             p->is_output && p->kind != QT_POINT_OUTPUT ? ", output" : "");
    if (p->forced_n > 0)
      fprintf(f, "    %-38s %-16s %-16s %lld\n", name, a, b, (long long)p->forced_max);
    else
      fprintf(f, "    %-38s %-16s %s\n", name, a, b);
  }
  char v[1536];
  qt_report_verdict(r, v, sizeof v);
  fprintf(f, "  verdict: %s\n", v);
}

static void sb_json_db(qt_strbuf *b, const qt_sqnr_sum *s) {
  const double db = qt_sqnr_sum_db(s);
  if (s->n == 0 || isnan(db))
    qt_strbuf_printf(b, "null");
  else if (isinf(db))
    qt_strbuf_printf(b, "%.1f", db > 0 ? 999.0 : -999.0);
  else
    qt_strbuf_printf(b, "%.3f", db);
}

static void sb_json_number(qt_strbuf *b, double x) {
  if (isfinite(x))
    qt_strbuf_printf(b, "%.6f", x);
  else
    qt_strbuf_printf(b, "null");
}

char *qt_report_json(const qt_report *r, const char *in) {
  qt_strbuf b = {0};
  qt_strbuf_printf(&b,
                   "%s\"int8_vs_qdq\": {\"images\": %lld, \"probe_images\": %lld, \"alone_images\": %lld, "
                   "\"top1_agreement\": %.6f, \"max_lsb\": ",
                   in, (long long)r->images, (long long)r->probe_images, (long long)r->forced_images,
                   r->top1_agreement);
  if (r->output_scale > 0) {
    sb_json_number(&b, r->lsb.max_lsb);
    qt_strbuf_printf(&b,
                     ", \"output_scale\": %.9g, \"lsb_histogram\": {\"0\": %lld, \"1\": %lld, \"2\": %lld, "
                     "\"over_2\": %lld}",
                     (double)r->output_scale, (long long)r->lsb.count[0], (long long)r->lsb.count[1],
                     (long long)r->lsb.count[2], (long long)r->lsb.count[3]);
  } else {
    qt_strbuf_printf(&b, "null, \"output_scale\": null, \"lsb_histogram\": null");
  }
  qt_strbuf_printf(&b, ", \"max_abs_diff\": ");
  sb_json_number(&b, r->max_abs_diff);
  qt_strbuf_printf(&b, ", \"qdq_top2_ties\": %lld},\n", (long long)r->qdq_top2_ties);
  /* The float32 Q/DQ executor against the exact reference the report judges with. */
  const qt_device_agreement *fe = &r->float_vs_exact;
  qt_strbuf_printf(&b,
                   "%s\"qdq_reference\": \"exact\",\n%s\"qdq_float_vs_exact\": {\"images\": %lld, "
                   "\"top1_differs\": %lld, \"logits_differ\": %lld, \"max_lsb\": ",
                   in, in, (long long)fe->images, (long long)(fe->images - fe->agree), (long long)fe->differ);
  if (fe->output_scale > 0)
    sb_json_number(&b, fe->max_lsb);
  else
    qt_strbuf_printf(&b, "null");
  qt_strbuf_printf(&b, ", \"max_abs_diff\": ");
  sb_json_number(&b, fe->max_abs_diff);
  qt_strbuf_printf(&b, "},\n");
  qt_strbuf_printf(&b, "%s\"sqnr_db\": [", in);
  for (int i = 0; i < r->n_points; i++) {
    const qt_report_point *p = &r->points[i];
    qt_strbuf_printf(&b, "%s\n%s  {\"point\": ", i ? "," : "", in);
    qt_strbuf_json_string(&b, p->name);
    qt_strbuf_printf(&b, ", \"kind\": \"%s\", \"output\": %s, \"fp32_vs_qdq\": ", qt_point_kind_name(p->kind),
                     p->is_output ? "true" : "false");
    sb_json_db(&b, &p->fp32_vs_qdq);
    qt_strbuf_printf(&b, ", \"qdq_vs_int8\": ");
    sb_json_db(&b, &p->qdq_vs_device);
    if (p->forced_n > 0)
      qt_strbuf_printf(&b, ", \"alone\": {\"max_lsb\": %lld, \"differ\": %lld, \"over_max\": %lld, \"n\": %lld}",
                       (long long)p->forced_max, (long long)p->forced_differ, (long long)p->forced_over,
                       (long long)p->forced_n);
    qt_strbuf_printf(&b, "}");
  }
  qt_strbuf_printf(&b, "\n%s],\n%s\"stage_loss_points\": {\"quantization\": ", in, in);
  sb_json_number(&b, qt_report_stage1_loss(r));
  qt_strbuf_printf(&b, ", \"lowering\": ");
  sb_json_number(&b, qt_report_stage2_loss(r));
  qt_strbuf_printf(&b, "},\n%s\"verdict\": ", in);
  char v[1536];
  qt_report_verdict(r, v, sizeof v);
  qt_strbuf_json_string(&b, v);
  qt_strbuf_printf(&b, ",\n%s\"lowering\": {\"int8_partitions\": %d, \"fallback_partitions\": %d, \"fallbacks\": [", in,
                   r->int8_partitions, r->fallback_partitions);
  for (int i = 0; i < r->n_fallbacks; i++) {
    qt_strbuf_printf(&b, "%s{\"nodes\": ", i ? ", " : "");
    qt_strbuf_json_string(&b, r->fallbacks[i].nodes);
    qt_strbuf_printf(&b, ", \"reason\": ");
    qt_strbuf_json_string(&b, r->fallbacks[i].reason);
    qt_strbuf_printf(&b, "}");
  }
  qt_strbuf_printf(&b, "]}");
  return b.s;
}
