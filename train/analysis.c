/* PTQ debugging (train/analysis.h): calibration sweep, per-node SQNR, one-layer sensitivity,
 * mixed precision. Each variant is a copy of the run's options with other [quant] settings,
 * prepared with qt_stage_prepare and calibrated with qt_calibrate_until. */
#include "train/analysis.h"
#include "base/base.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "qat/qat.h"
#include "train/pipeline.h"

#define MAX_LIST 16
#define MAX_LAYERS 64

/* ---- per-node SQNR ------------------------------------------------------------------------- */
static int consumer_of(const qt_graph *g, int value, qt_op op) {
  for (int i = 0; i < g->n_nodes; i++)
    if (g->nodes[i].op == op)
      for (int k = 0; k < g->nodes[i].n_inputs; k++)
        if (g->nodes[i].inputs[k] == value) return i;
  return -1;
}

/* The nodes of fq with a counterpart in fp32: rows (named), and the value ids compared. */
static int match_nodes(const qt_graph *fp32, const qt_graph *fq, qt_node_sqnr **rows_out, int **ref_out, int **fq_out) {
  qt_node_sqnr *rows = calloc((size_t)fq->n_nodes + 1, sizeof *rows);
  int *ref_value = malloc(((size_t)fq->n_nodes + 1) * sizeof(int)),
      *fq_value = malloc(((size_t)fq->n_nodes + 1) * sizeof(int));
  QT_ASSERT(rows && ref_value && fq_value, "out of memory");
  *rows_out = rows;
  *ref_out = ref_value;
  *fq_out = fq_value;
  int n = 0;
  for (int i = 0; i < fq->n_nodes; i++) {
    const qt_node *p = &fq->nodes[i];
    if (p->op == QT_OP_FAKE_QUANT) continue;
    int j = qt_graph_find_node(fp32, p->name);
    if (j < 0) continue;
    int rv = fp32->nodes[j].output;
    qt_node_sqnr *r = &rows[n];
    snprintf(r->node, sizeof r->node, "%s", p->name);
    if (fp32->nodes[j].op == QT_OP_CONV2D && p->op == QT_OP_CONV2D) {
      int bn = consumer_of(fp32, rv, QT_OP_BATCH_NORM);
      if (bn >= 0 && qt_graph_find_node(fq, fp32->nodes[bn].name) < 0) rv = fp32->nodes[bn].output; /* folded */
    }
    if (fp32->values[rv].ndim != fq->values[p->output].ndim) continue;
    snprintf(r->ref, sizeof r->ref, "%s", fp32->values[rv].name);
    snprintf(r->op, sizeof r->op, "%s", qt_op_name(p->op));
    r->weight_bits = p->wq ? p->wq->spec.bits : 0;
    int v = p->output, f = consumer_of(fq, v, QT_OP_FAKE_QUANT);
    if (f >= 0) {
      v = fq->nodes[f].output;
      r->act_quantized = 1;
    }
    ref_value[n] = rv;
    fq_value[n] = v;
    n++;
  }
  return n;
}

/* Both graphs on one batch; adds each compared pair to its row's SQNR sum. */
static int sqnr_batch(qt_graph *fp32, qt_graph *fq, qt_ctx *ctx, const int64_t *shape, const float *x,
                      qt_node_sqnr *rows, const int *ref_value, const int *fq_value, int n, char *err) {
  const int same = fp32 == fq; /* one QAT graph: the reference pass runs with fake quant off */
  qt_ctx_reset(ctx);
  qt_tensor **va = NULL, **vb = NULL;
  if (same) qt_graph_set_mode(fq, QT_MODE_EVAL_FLOAT);
  qt_tensor *ya = qt_graph_forward_values(fp32, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, (void *)x), &va);
  if (same) qt_graph_set_mode(fq, QT_MODE_EVAL);
  if (!ya) return qt_err(err, "SQNR: fp32 graph: %s", fp32->error);
  if (!qt_graph_forward_values(fq, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, (void *)x), &vb))
    return qt_err(err, "SQNR: fake-quant graph: %s", fq->error);
  for (int k = 0; k < n; k++) {
    qt_tensor *a = va[ref_value[k]], *b = vb[fq_value[k]];
    if (!a || !b || qt_tensor_numel(a) != qt_tensor_numel(b)) continue;
    qt_sqnr_add(&rows[k].sqnr, qt_f32(a), qt_f32(b), qt_tensor_numel(a));
  }
  return 0;
}

int qt_analysis_node_sqnr(qt_graph *fp32, qt_graph *fq, qt_ctx *ctx, const qt_dataset *ds, const qt_loader_config *lc,
                          int64_t images, qt_node_sqnr **rows_out, int *n_out, char *err) {
  *rows_out = NULL;
  *n_out = 0;
  qt_node_sqnr *rows;
  int *ref_value, *fq_value;
  const int n = match_nodes(fp32, fq, &rows, &ref_value, &fq_value);
  qt_loader_config c = *lc;
  c.shuffle = 0;
  c.crop_pad = 0;
  c.flip = 0;
  qt_dataset sub = qt_dataset_view(ds, 0, images > 0 && images < ds->n ? images : ds->n);
  int rc = 0;
  qt_loader *l = qt_loader_create(&sub, &c, err);
  if (!l) rc = -1;
  int grad = qt_ctx_grad_enabled(ctx);
  qt_ctx_set_grad(ctx, 0);
  qt_graph_set_mode(fp32, QT_MODE_EVAL);
  qt_graph_set_mode(fq, QT_MODE_EVAL);
  if (l) {
    qt_loader_start_epoch(l, 0);
    const float *x;
    const int32_t *labels;
    int B;
    while (!rc && (B = qt_loader_next(l, &x, &labels)) > 0) {
      const int64_t shape[4] = {B, sub.h, sub.w, sub.c};
      rc = sqnr_batch(fp32, fq, ctx, shape, x, rows, ref_value, fq_value, n, err);
    }
    qt_loader_free(l);
  }
  qt_ctx_reset(ctx);
  qt_ctx_set_grad(ctx, grad);
  qt_graph_set_mode(fp32, QT_MODE_TRAIN);
  qt_graph_set_mode(fq, QT_MODE_TRAIN);
  free(ref_value);
  free(fq_value);
  if (rc) {
    free(rows);
    return -1;
  }
  *rows_out = rows;
  *n_out = n;
  return 0;
}

int64_t qt_analysis_model_bytes(const qt_graph *g) {
  int64_t bytes = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    if (!qt_op_has_weight(n->op)) continue;
    int bits = n->wq ? n->wq->spec.bits : 32;
    if (n->param[QT_P_WEIGHT] >= 0) bytes += (g->tensors[n->param[QT_P_WEIGHT]].numel * bits + 7) / 8;
    if (n->param[QT_P_BIAS] >= 0)
      bytes += 4 * g->tensors[n->param[QT_P_BIAS]].numel;
    else if (n->op == QT_OP_CONV2D && consumer_of(g, n->output, QT_OP_BATCH_NORM) >= 0)
      bytes += 4 * (int64_t)n->attr.out_channels; /* the bias BN folds into it */
  }
  return bytes;
}

/* ---- config helpers ------------------------------------------------------------------------ */
static int split_list(const char *text, char items[][64], int max) {
  int n = 0;
  const char *p = text;
  while (*p && n < max) {
    while (*p == ' ' || *p == ',' || *p == ';') p++;
    if (!*p) break;
    const char *e = p;
    while (*e && *e != ',' && *e != ';') e++;
    size_t len = (size_t)(e - p);
    while (len && p[len - 1] == ' ') len--;
    if (len >= 64) len = 63;
    memcpy(items[n], p, len);
    items[n][len] = 0;
    n++;
    p = e;
  }
  return n;
}

static int int_list(const char *key, const char *text, int *out, int max, int lo, char *err) {
  char items[MAX_LIST][64];
  int n = split_list(text, items, max);
  for (int i = 0; i < n; i++) {
    char *end;
    long v = strtol(items[i], &end, 10);
    if (*end || v < lo || v > 1000000) {
      snprintf(err, QT_ERR_LEN, "analysis.%s: '%s' is not an integer >= %d", key, items[i], lo);
      return -1;
    }
    out[i] = (int)v;
  }
  return n;
}

int qt_analysis_wanted(const qt_options *o) {
  const qt_analysis_options *a = &o->analysis;
  return a->calibration_methods[0] || a->calibration_batches[0] || a->sensitivity || a->mixed_precision_k[0] ||
         a->layer_sqnr;
}

int qt_analysis_check_mode(const qt_options *o, char *err) {
  const qt_analysis_options *a = &o->analysis;
  const char *ptq_only = a->calibration_methods[0]   ? "calibration_methods"
                         : a->calibration_batches[0] ? "calibration_batches"
                         : a->sensitivity            ? "sensitivity"
                         : a->mixed_precision_k[0]   ? "mixed_precision_k"
                                                     : NULL;
  const qt_quant_mode m = o->quant.mode;
  const char *mode = m == QT_QUANT_PTQ ? "ptq" : m == QT_QUANT_QAT ? "qat" : "none";
  if (m == QT_QUANT_PTQ) return 0;
  if (ptq_only)
    return qt_err(err, "analysis.%s is a PTQ debugging tool: it needs quant.mode = ptq (this run: %s)%s", ptq_only,
                  mode, m == QT_QUANT_QAT ? "; a QAT run supports analysis.layer_sqnr" : "");
  if (a->layer_sqnr && m != QT_QUANT_QAT)
    return qt_err(err, "analysis.layer_sqnr needs quant.mode = ptq or qat (this run: %s)", mode);
  return 0;
}

/* A copy of the options for one variant. */
static qt_options *clone_options(const qt_options *o) {
  qt_options *c = malloc(sizeof *c);
  QT_ASSERT(c, "out of memory");
  *c = *o;
  return c;
}

static int set_method(qt_options *c, const char *method, char *err) {
  qt_observer_kind k;
  qt_range_method r;
  if (qt_observer_kind_parse(method, &k) == 0 && k != QT_OBSERVER_HISTOGRAM) {
    c->quant.activation_observer = k;
    return 0;
  }
  if (qt_range_method_parse(method, &r) == 0 && r != QT_RANGE_MINMAX) {
    c->quant.activation_observer = QT_OBSERVER_HISTOGRAM;
    c->quant.activation_range = r;
    return 0;
  }
  return qt_err(err, "analysis.calibration_methods: unknown '%s' (minmax|moving_average|percentile|mse)", method);
}

static int set_overrides(qt_options *c, const char *ov, char *err) {
  if (strlen(ov) >= sizeof c->quant.layer_overrides)
    return qt_err(err, "analysis: layer overrides of %zu characters (at most %zu)", strlen(ov),
                  sizeof c->quant.layer_overrides - 1);
  snprintf(c->quant.layer_overrides, sizeof c->quant.layer_overrides, "%s", ov);
  return 0;
}

/* The configured method's name. */
static const char *config_method(const qt_options *o) {
  if (o->quant.activation_observer == QT_OBSERVER_HISTOGRAM) return qt_range_method_name(o->quant.activation_range);
  return qt_observer_kind_name(o->quant.activation_observer);
}

/* Prepares c's variant of fp32, calibrates it on lc's batches and evaluates it on `sub` after
 * each count in `counts` (ascending, cumulative: one pass). acc[i], used[i]: accuracy and
 * batches actually seen at counts[i]. Returns the calibrated graph when keep, else frees it. */
static qt_graph *calibrate_eval(const qt_options *c, const qt_graph *fp32, const qt_dataset *train,
                                const qt_loader_config *lc, const qt_dataset *sub, const qt_loader_config *ec,
                                qt_ctx *ctx, const int *counts, int n_counts, double *acc, int *used, int keep,
                                char *err) {
  qt_status st = {0};
  qt_graph *p = qt_stage_prepare(c, fp32, NULL, NULL, &st);
  if (!p) {
    snprintf(err, QT_ERR_LEN, "%s", st.msg);
    return NULL;
  }
  qt_loader *l = qt_loader_create(train, lc, err);
  if (!l) {
    qt_graph_free(p);
    return NULL;
  }
  qt_loader_start_epoch(l, 0);
  int done = 0, rc = 0;
  for (int k = 0; k < n_counts && !rc; k++) {
    if (qt_calibrate_until(p, l, train, ctx, counts[k], &done, err)) {
      char why[QT_ERR_LEN];
      snprintf(why, sizeof why, "%s", err);
      snprintf(err, QT_ERR_LEN, "analysis: %s", why);
      rc = -1;
      break;
    }
    qt_eval_result r;
    if (qt_evaluate(p, ctx, sub, ec, &r, err)) {
      rc = -1;
      break;
    }
    acc[k] = r.accuracy;
    used[k] = done;
  }
  qt_loader_free(l);
  if (rc || !keep) {
    qt_graph_free(p);
    return rc ? NULL : (qt_graph *)fp32; /* non-NULL: success */
  }
  return p;
}

/* ---- output helpers --------------------------------------------------------------------------- */
/* A decibel figure: `nan` for NaN, `inf` / `minus_inf` for infinities, else with `decimals`. */
static void print_db(qt_strbuf *b, double db, const char *nan, const char *inf, const char *minus_inf, int decimals) {
  if (isnan(db) || isinf(db))
    qt_strbuf_printf(b, "%s", isnan(db) ? nan : db > 0 ? inf : minus_inf);
  else
    qt_strbuf_printf(b, "%.*f", decimals, db);
}
static void json_db(qt_strbuf *b, double db) { print_db(b, db, "null", "999.0", "-999.0", 3); }
static void md_db(qt_strbuf *b, double db) { print_db(b, db, "n/a", "inf (exact)", "-inf", 2); }

typedef struct {
  char name[QT_NAME_LEN];
  double acc, drop;
} layer_sens;

/* The per-node SQNR section of analysis.md (a table under `title`) and the "sqnr" member of
 * analysis.json; ref_name names the reference graph ("fp32"). */
static void write_sqnr(qt_strbuf *md, qt_strbuf *js, const char *key, const char *title, const char *ref_name,
                       double acc, const qt_node_sqnr *rows, int n_rows) {
  qt_strbuf_printf(md, "## Per-node SQNR, %s (accuracy %.2f%%)\n\n", title, 100 * acc);
  qt_strbuf_printf(md,
                   "Each row compares the %s value with what the fake-quant graph's consumers see (after the "
                   "node's fake quant, if any); errors accumulate along the graph.\n\n",
                   ref_name);
  qt_strbuf_printf(md,
                   "| node | op | %s value | weight bits | output quantized | SQNR (dB) |\n"
                   "|---|---|---|---:|---|---:|\n",
                   ref_name);
  qt_strbuf_printf(js, ",\n  \"%s\": {\"accuracy\": %.6f, \"reference\": ", key, acc);
  qt_strbuf_json_string(js, ref_name);
  qt_strbuf_printf(js, ", \"nodes\": [");
  for (int i = 0; i < n_rows; i++) {
    const qt_node_sqnr *r = &rows[i];
    double db = qt_sqnr_sum_db(&r->sqnr);
    char wbits[16] = "-";
    if (r->weight_bits) snprintf(wbits, sizeof wbits, "%d", r->weight_bits);
    qt_strbuf_printf(md, "| %s | %s | %s | %s | %s | ", r->node, r->op, r->ref, wbits, r->act_quantized ? "yes" : "no");
    md_db(md, db);
    qt_strbuf_printf(md, " |\n");
    qt_strbuf_printf(js, "%s\n    {\"node\": ", i ? "," : "");
    qt_strbuf_json_string(js, r->node);
    qt_strbuf_printf(js, ", \"op\": \"%s\", \"fp32_value\": ", r->op);
    qt_strbuf_json_string(js, r->ref);
    qt_strbuf_printf(js, ", \"weight_bits\": %d, \"output_quantized\": %s, \"sqnr_db\": ", r->weight_bits,
                     r->act_quantized ? "true" : "false");
    json_db(js, db);
    qt_strbuf_printf(js, "}");
  }
  qt_strbuf_printf(md, "\n");
  qt_strbuf_printf(js, "\n  ]}");
}

/* <dir>/analysis.md and <dir>/analysis.json, each written atomically; json_path gets the latter. */
static int write_outputs(const char *dir, const qt_strbuf *md, const qt_strbuf *js, char *json_path,
                         size_t json_path_len, int verbose, char *err) {
  char path[4200];
  snprintf(path, sizeof path, "%s/analysis.md", dir);
  if (qt_write_file_atomic(path, md->s, md->len, err)) return -1;
  snprintf(json_path, json_path_len, "%s/analysis.json", dir);
  if (qt_write_file_atomic(json_path, js->s, js->len, err)) return -1;
  if (verbose) fprintf(stderr, "analysis: written to %s and %s\n", path, json_path);
  return 0;
}

/* What every section of the PTQ analysis shares. */
typedef struct {
  const qt_options *o;
  qt_graph *fp32;
  const qt_dataset *train;
  qt_dataset sub; /* the first analysis.images test images */
  const qt_loader_config *lc, *ec;
  qt_ctx *ctx;
  int wb, ab, cal, verbose;
  const char *keep;
  char layers[MAX_LAYERS][QT_NAME_LEN]; /* conv2d / linear of the fp32 model */
  int n_layers;
  qt_eval_result ref;
  int64_t fp32_bytes;
  qt_strbuf md, js;
  qt_graph *methods; /* the run's prepared graph after its PTQ methods (CLE, AdaRound, bias correction), or NULL */
} analysis;

/* 1. calibration methods x batches: one cumulative calibration pass per method */
static int section_calibration(analysis *A, char methods[][64], int n_methods, const int *counts, int n_counts,
                               char *err) {
  qt_strbuf *md = &A->md, *js = &A->js;
  qt_strbuf_printf(md, "## Calibration method x calibration batches (accuracy %%)\n\n| method |");
  for (int k = 0; k < n_counts; k++) qt_strbuf_printf(md, " %d |", counts[k]);
  qt_strbuf_printf(md, "\n|---|");
  for (int k = 0; k < n_counts; k++) qt_strbuf_printf(md, "---:|");
  qt_strbuf_printf(md, "\n");
  qt_strbuf_printf(js, ",\n  \"calibration\": [");
  for (int m = 0; m < n_methods; m++) {
    qt_options *c = clone_options(A->o);
    double acc[MAX_LIST];
    int used[MAX_LIST];
    int bad = set_method(c, methods[m], err) ||
              !calibrate_eval(c, A->fp32, A->train, A->lc, &A->sub, A->ec, A->ctx, counts, n_counts, acc, used, 0, err);
    free(c);
    if (bad) return -1;
    qt_strbuf_printf(md, "| %s |", methods[m]);
    for (int k = 0; k < n_counts; k++) {
      qt_strbuf_printf(md, " %.2f%s |", 100 * acc[k], used[k] < counts[k] ? "*" : "");
      qt_strbuf_printf(js, "%s\n    {\"method\": \"%s\", \"batches\": %d, \"batches_used\": %d, \"accuracy\": %.6f}",
                       m || k ? "," : "", methods[m], counts[k], used[k], acc[k]);
    }
    qt_strbuf_printf(md, "\n");
    if (A->verbose) {
      fprintf(stderr, "analysis: calibration %s:", methods[m]);
      for (int k = 0; k < n_counts; k++) fprintf(stderr, " %d batches %.2f%%", counts[k], 100 * acc[k]);
      fprintf(stderr, "\n");
    }
  }
  qt_strbuf_printf(md, "\n");
  qt_strbuf_printf(js, "\n  ]");
  return 0;
}

/* The PTQ methods the run applies, as text ("CLE, AdaRound, empirical bias correction"). */
static void methods_text(const qt_options *o, char *buf, size_t n) {
  const qt_quant_options *q = &o->quant;
  snprintf(buf, n, "%s%s%s%s%s", q->cle ? "CLE" : "", q->adaround && q->cle ? ", " : "",
           !q->adaround                                 ? ""
           : q->adaround_unit == QT_ADAROUND_UNIT_BLOCK ? "block reconstruction"
                                                        : "AdaRound",
           q->bias_correction != QT_BIAS_CORRECTION_NONE && (q->cle || q->adaround) ? ", " : "",
           q->bias_correction == QT_BIAS_CORRECTION_EMPIRICAL    ? "empirical bias correction"
           : q->bias_correction == QT_BIAS_CORRECTION_ANALYTICAL ? "analytical bias correction"
                                                                 : "");
}

/* The methods' table: per node, the SQNR of plain PTQ (`without`) and of the run's graph. */
static void write_methods(analysis *A, const char *methods, double acc0, double acc1, const qt_node_sqnr *without,
                          int n0, const qt_node_sqnr *with, int n1) {
  qt_strbuf *md = &A->md;
  qt_strbuf_printf(md, "## Per-node SQNR before and after the PTQ methods (%s)\n\n", methods);
  qt_strbuf_printf(
      md,
      "Before: the same calibration without them (accuracy %.2f%%); after: the run's model "
      "(accuracy %.2f%%).\n\n| node | op | weight bits | SQNR before (dB) | SQNR after (dB) | change (dB) |\n"
      "|---|---|---:|---:|---:|---:|\n",
      100 * acc0, 100 * acc1);
  for (int i = 0; i < n1; i++) {
    const qt_node_sqnr *r = &with[i], *b = NULL;
    for (int j = 0; j < n0 && !b; j++)
      if (strcmp(without[j].node, r->node) == 0) b = &without[j];
    const double d1 = qt_sqnr_sum_db(&r->sqnr), d0 = b ? qt_sqnr_sum_db(&b->sqnr) : NAN;
    char wbits[16] = "-";
    if (r->weight_bits) snprintf(wbits, sizeof wbits, "%d", r->weight_bits);
    qt_strbuf_printf(md, "| %s | %s | %s | ", r->node, r->op, wbits);
    md_db(md, d0);
    qt_strbuf_printf(md, " | ");
    md_db(md, d1);
    qt_strbuf_printf(md, " | ");
    if (isfinite(d0) && isfinite(d1))
      qt_strbuf_printf(md, "%+.2f", d1 - d0);
    else
      qt_strbuf_printf(md, "n/a");
    qt_strbuf_printf(md, " |\n");
  }
  qt_strbuf_printf(md, "\n");
}

/* 2. per-node SQNR of the configured variant; with PTQ methods, of the run's graph after them and
 * of the same calibration without them */
static int section_sqnr(analysis *A, char *err) {
  double acc;
  int used;
  qt_node_sqnr *rows = NULL, *rows0 = NULL;
  int n_rows = 0, n0 = 0;
  if (!A->methods) {
    qt_graph *p =
        calibrate_eval(A->o, A->fp32, A->train, A->lc, &A->sub, A->ec, A->ctx, &A->cal, 1, &acc, &used, 1, err);
    if (!p) return -1;
    int r = qt_analysis_node_sqnr(A->fp32, p, A->ctx, &A->sub, A->ec, A->sub.n, &rows, &n_rows, err);
    qt_graph_free(p);
    if (!r) write_sqnr(&A->md, &A->js, "sqnr", "fp32 vs fake quant (configured settings)", "fp32", acc, rows, n_rows);
    free(rows);
    return r;
  }
  qt_options *c = clone_options(A->o);
  c->quant.cle = 0; /* prepare would equalize; AdaRound and bias correction run only in the pipeline */
  double acc0;
  qt_eval_result e1;
  qt_graph *p0 = calibrate_eval(c, A->fp32, A->train, A->lc, &A->sub, A->ec, A->ctx, &A->cal, 1, &acc0, &used, 1, err);
  int r = p0 ? qt_analysis_node_sqnr(A->fp32, p0, A->ctx, &A->sub, A->ec, A->sub.n, &rows0, &n0, err) : -1;
  if (!r) r = qt_evaluate(A->methods, A->ctx, &A->sub, A->ec, &e1, err);
  if (!r) r = qt_analysis_node_sqnr(A->fp32, A->methods, A->ctx, &A->sub, A->ec, A->sub.n, &rows, &n_rows, err);
  if (!r) {
    char methods[160];
    methods_text(A->o, methods, sizeof methods);
    write_methods(A, methods, acc0, e1.accuracy, rows0, n0, rows, n_rows);
    write_sqnr(&A->md, &A->js, "sqnr", "fp32 vs fake quant (configured settings, the PTQ methods applied)", "fp32",
               e1.accuracy, rows, n_rows);
    write_sqnr(&A->md, &A->js, "sqnr_without_methods", "fp32 vs fake quant (the same calibration, no PTQ method)",
               "fp32", acc0, rows0, n0);
  }
  qt_graph_free(p0);
  QT_FREE_ALL(rows, rows0, c);
  return r;
}

/* Accuracy of the configured variant with layer overrides ov; *bytes (may be NULL) gets its
 * model size. */
static int variant_accuracy(analysis *A, const char *ov, double *acc, int64_t *bytes, char *err) {
  qt_options *c = clone_options(A->o);
  int used, rc = set_overrides(c, ov, err);
  if (!rc) {
    qt_graph *p =
        calibrate_eval(c, A->fp32, A->train, A->lc, &A->sub, A->ec, A->ctx, &A->cal, 1, acc, &used, bytes != NULL, err);
    if (!p)
      rc = -1;
    else if (bytes) {
      *bytes = qt_analysis_model_bytes(p);
      qt_graph_free(p);
    }
  }
  free(c);
  return rc;
}

/* 3. sensitivity: only one layer quantized */
static int section_sensitivity(analysis *A, layer_sens *sens, char *err) {
  qt_strbuf *md = &A->md, *js = &A->js;
  qt_strbuf_printf(md,
                   "## Sensitivity: only one layer quantized at W%dA%d\n\n| layer | accuracy %% | drop (points) |\n"
                   "|---|---:|---:|\n",
                   A->wb, A->ab);
  qt_strbuf_printf(js, ",\n  \"sensitivity\": [");
  for (int L = 0; L < A->n_layers; L++) {
    char ov[QT_NAME_LEN + 32]; /* every other unit in fp32, however many the model has */
    snprintf(ov, sizeof ov, "%s=fp32;%s=w%da%d", QT_OVERRIDE_ANY, A->layers[L], A->wb, A->ab);
    if (variant_accuracy(A, ov, &sens[L].acc, NULL, err)) return -1;
    snprintf(sens[L].name, sizeof sens[L].name, "%s", A->layers[L]);
    sens[L].drop = 100 * (A->ref.accuracy - sens[L].acc);
    qt_strbuf_printf(md, "| %s | %.2f | %.2f |\n", A->layers[L], 100 * sens[L].acc, sens[L].drop);
    qt_strbuf_printf(js, "%s\n    {\"layer\": ", L ? "," : "");
    qt_strbuf_json_string(js, A->layers[L]);
    qt_strbuf_printf(js, ", \"accuracy\": %.6f, \"drop_points\": %.4f}", sens[L].acc, sens[L].drop);
    if (A->verbose) fprintf(stderr, "analysis: only %s quantized: %.2f%%\n", A->layers[L], 100 * sens[L].acc);
  }
  qt_strbuf_printf(md, "\n");
  qt_strbuf_printf(js, "\n  ]");
  return 0;
}

/* 4. mixed precision: the k most sensitive layers kept at analysis.mixed_precision_keep */
static int section_mixed(analysis *A, const layer_sens *sens, const int *ks, int n_ks, char *err) {
  qt_strbuf *md = &A->md, *js = &A->js;
  const char *keep = A->keep;
  int order[MAX_LAYERS];
  for (int i = 0; i < A->n_layers; i++) order[i] = i;
  for (int i = 1; i < A->n_layers; i++) /* stable insertion sort, largest drop first */
    for (int j = i; j > 0 && sens[order[j]].drop > sens[order[j - 1]].drop; j--) {
      int t = order[j];
      order[j] = order[j - 1];
      order[j - 1] = t;
    }
  qt_strbuf_printf(md, "## Mixed precision: the k most sensitive layers at %s, the rest at W%dA%d\n\n", keep, A->wb,
                   A->ab);
  qt_strbuf_printf(
      md, "Model size: conv/linear weights at their bit widths plus 4-byte biases (BN folded); fp32: %lld bytes.\n\n",
      (long long)A->fp32_bytes);
  qt_strbuf_printf(md, "| k | layers kept at %s | accuracy %% | model bytes | vs fp32 |\n|---:|---|---:|---:|---:|\n",
                   keep);
  qt_strbuf_printf(js, ",\n  \"mixed_precision\": {\"keep\": \"%s\", \"rows\": [", keep);
  for (int q = 0; q < n_ks; q++) {
    int k = ks[q] > A->n_layers ? A->n_layers : ks[q];
    char ov[4096] = "", names[4096] = "";
    size_t len = 0, nl = 0;
    for (int i = 0; i < k; i++) {
      const char *nm = A->layers[order[i]];
      len += (size_t)snprintf(ov + len, sizeof ov - len, "%s%s=%s", len ? ";" : "", nm, keep);
      nl += (size_t)snprintf(names + nl, sizeof names - nl, "%s%s", nl ? ", " : "", nm);
    }
    double acc;
    int64_t bytes;
    if (variant_accuracy(A, ov, &acc, &bytes, err)) return -1;
    qt_strbuf_printf(md, "| %d | %s | %.2f | %lld | %.1f%% |\n", k, k ? names : "(none)", 100 * acc, (long long)bytes,
                     100.0 * (double)bytes / (double)A->fp32_bytes);
    qt_strbuf_printf(js, "%s\n    {\"k\": %d, \"kept\": [", q ? "," : "", k);
    for (int i = 0; i < k; i++) {
      if (i) qt_strbuf_printf(js, ", ");
      qt_strbuf_json_string(js, A->layers[order[i]]);
    }
    qt_strbuf_printf(js, "], \"accuracy\": %.6f, \"model_bytes\": %lld}", acc, (long long)bytes);
    if (A->verbose)
      fprintf(stderr, "analysis: mixed precision k=%d: %.2f%%, %lld bytes\n", k, 100 * acc, (long long)bytes);
  }
  qt_strbuf_printf(md, "\n");
  qt_strbuf_printf(js, "\n  ]}");
  return 0;
}

/* The header of analysis.md / .json: the fp32 model on the analysis images. */
static int section_header(analysis *A, char *err) {
  if (qt_evaluate(A->fp32, A->ctx, &A->sub, A->ec, &A->ref, err)) return -1;
  A->fp32_bytes = qt_analysis_model_bytes(A->fp32);
  if (A->verbose)
    fprintf(stderr, "analysis: fp32 accuracy %.2f%% on %lld test images\n", 100 * A->ref.accuracy, (long long)A->sub.n);
  qt_strbuf_printf(&A->md, "# PTQ debugging: %s, W%dA%d\n\n", A->fp32->name, A->wb, A->ab);
  qt_strbuf_printf(&A->md,
                   "Evaluated on the first %lld test images. fp32 accuracy: **%.2f%%**. Configured calibration: %s, "
                   "%d batches of %d.\n\n",
                   (long long)A->sub.n, 100 * A->ref.accuracy, config_method(A->o), A->cal, A->lc->batch_size);
  qt_strbuf_printf(&A->js, "{\n  \"model\": ");
  qt_strbuf_json_string(&A->js, A->fp32->name);
  qt_strbuf_printf(&A->js,
                   ",\n  \"weight_bits\": %d,\n  \"activation_bits\": %d,\n  \"images\": %lld,\n"
                   "  \"fp32_accuracy\": %.6f,\n  \"fp32_model_bytes\": %lld",
                   A->wb, A->ab, (long long)A->sub.n, A->ref.accuracy, (long long)A->fp32_bytes);
  return 0;
}

int qt_analysis_run(const qt_options *o, qt_graph *fp32, qt_graph *ptq_methods, const qt_dataset *train,
                    const qt_dataset *test, const qt_loader_config *lc, const qt_loader_config *ec, qt_ctx *ctx,
                    const char *dir, char *json_path, size_t json_path_len, int verbose, char *err) {
  analysis *A = calloc(1, sizeof *A);
  QT_ASSERT(A, "out of memory");
  const int64_t images = o->analysis.images > 0 && o->analysis.images < test->n ? o->analysis.images : test->n;
  *A = (analysis){.o = o,
                  .fp32 = fp32,
                  .train = train,
                  .sub = qt_dataset_view(test, 0, images),
                  .lc = lc,
                  .ec = ec,
                  .ctx = ctx,
                  .wb = o->quant.weight_bits,
                  .ab = o->quant.activation_bits,
                  .cal = o->quant.calibration_batches,
                  .verbose = verbose,
                  .keep = o->analysis.mixed_precision_keep == QT_KEEP_FP32 ? "fp32" : "w8a8",
                  .methods = ptq_methods};
  char cal_methods[MAX_LIST][64];
  const int n_methods = split_list(o->analysis.calibration_methods, cal_methods, MAX_LIST);
  int counts[MAX_LIST], ks[MAX_LIST], rc = -1;
  int n_counts = int_list("calibration_batches", o->analysis.calibration_batches, counts, MAX_LIST, 1, err);
  const int n_ks = int_list("mixed_precision_k", o->analysis.mixed_precision_k, ks, MAX_LIST, 0, err);
  if (n_counts < 0 || n_ks < 0) goto out;
  if (n_counts == 0) counts[n_counts++] = A->cal;
  for (int i = 1; i < n_counts; i++)
    if (counts[i] <= counts[i - 1]) {
      qt_err(err, "analysis.calibration_batches must be ascending (e.g. 1,8,32)");
      goto out;
    }
  for (int i = 0; i < fp32->n_nodes && A->n_layers < MAX_LAYERS; i++)
    if (qt_op_has_weight(fp32->nodes[i].op)) snprintf(A->layers[A->n_layers++], QT_NAME_LEN, "%s", fp32->nodes[i].name);
  layer_sens sens[MAX_LAYERS];
  if (section_header(A, err) ||
      (n_methods > 0 && section_calibration(A, cal_methods, n_methods, counts, n_counts, err)) ||
      (o->analysis.layer_sqnr && section_sqnr(A, err)) ||
      ((o->analysis.sensitivity || n_ks > 0) && section_sensitivity(A, sens, err)) ||
      (n_ks > 0 && section_mixed(A, sens, ks, n_ks, err)))
    goto out;
  qt_strbuf_printf(&A->js, "\n}\n");
  rc = write_outputs(dir, &A->md, &A->js, json_path, json_path_len, verbose, err);
out:
  QT_FREE_ALL(A->md.s, A->js.s, A);
  qt_graph_set_mode(fp32, QT_MODE_TRAIN);
  return rc;
}

int qt_analysis_run_qat(const qt_options *o, qt_graph *qat, const qt_dataset *test, const qt_loader_config *ec,
                        qt_ctx *ctx, const char *dir, char *json_path, size_t json_path_len, int verbose, char *err) {
  int rc = -1;
  qt_strbuf md = {0}, js = {0};
  qt_node_sqnr *rows = NULL;
  int n_rows = 0;
  const int64_t images = o->analysis.images;
  qt_dataset sub = qt_dataset_view(test, 0, images > 0 && images < test->n ? images : test->n);
  const int wb = o->quant.weight_bits, ab = o->quant.activation_bits;
  qt_eval_result on, off;
  qt_graph_sync_learned_scales(qat);
  if (qt_evaluate(qat, ctx, &sub, ec, &on, err)) goto out;
  qt_graph_set_mode(qat, QT_MODE_EVAL_FLOAT);
  rc = qt_evaluate(qat, ctx, &sub, ec, &off, err);
  qt_graph_set_mode(qat, QT_MODE_TRAIN);
  if (rc) goto out;
  rc = -1;
  if (qt_analysis_node_sqnr(qat, qat, ctx, &sub, ec, sub.n, &rows, &n_rows, err)) goto out;
  qt_strbuf_printf(&md, "# QAT debugging: %s, W%dA%d\n\n", qat->name, wb, ab);
  qt_strbuf_printf(&md,
                   "The QAT-trained model on the first %lld test images: with fake quant **%.2f%%**, with fake quant "
                   "off (the float model QAT trained, BN statistics as trained) **%.2f%%**.\n\n",
                   (long long)sub.n, 100 * on.accuracy, 100 * off.accuracy);
  qt_strbuf_printf(&js, "{\n  \"model\": ");
  qt_strbuf_json_string(&js, qat->name);
  qt_strbuf_printf(&js,
                   ",\n  \"mode\": \"qat\",\n  \"weight_bits\": %d,\n  \"activation_bits\": %d,\n"
                   "  \"images\": %lld,\n  \"accuracy\": %.6f,\n  \"float_accuracy\": %.6f",
                   wb, ab, (long long)sub.n, on.accuracy, off.accuracy);
  write_sqnr(&md, &js, "sqnr", "the QAT model without vs with fake quant", "float (fake quant off)", on.accuracy, rows,
             n_rows);
  qt_strbuf_printf(&js, "\n}\n");
  if (write_outputs(dir, &md, &js, json_path, json_path_len, verbose, err)) goto out;
  rc = 0;
out:
  QT_FREE_ALL(rows, md.s, js.s);
  qt_graph_set_mode(qat, QT_MODE_TRAIN);
  return rc;
}
