/* PTQ debugging (train/analysis.h): calibration sweep, per-node SQNR, one-layer sensitivity,
 * mixed precision. Each variant is a sub-config of the run's config (different [quant] keys)
 * prepared with qt_quant_prepare and calibrated with qt_quant_calibrate_until. */
#include "train/analysis.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "qat/qat.h"
#include "train/quant_job.h"

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

int qt_analysis_node_sqnr(qt_graph *fp32, qt_graph *fq, qt_ctx *ctx, const qt_dataset *ds,
                          const qt_loader_config *lc, int64_t images, qt_node_sqnr **rows_out, int *n_out,
                          char *err) {
  *rows_out = NULL;
  *n_out = 0;
  qt_node_sqnr *rows = calloc((size_t)fq->n_nodes + 1, sizeof *rows);
  int *ref_value = malloc(((size_t)fq->n_nodes + 1) * sizeof(int)), *fq_value = malloc(((size_t)fq->n_nodes + 1) * sizeof(int));
  QT_ASSERT(rows && ref_value && fq_value, "out of memory");
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
  qt_loader_config c = *lc;
  c.shuffle = 0;
  c.crop_pad = 0;
  c.flip = 0;
  qt_dataset sub = *ds;
  if (images > 0 && images < sub.n) sub.n = images;
  int rc = 0;
  qt_loader *l = qt_loader_create(&sub, &c, err);
  if (!l) rc = -1;
  int grad = qt_ctx_grad_enabled(ctx);
  const int same = fp32 == fq; /* one QAT graph: the reference pass runs with fake quant off */
  qt_ctx_set_grad(ctx, 0);
  qt_graph_set_training(fp32, 0);
  qt_graph_set_training(fq, 0);
  if (l) {
    qt_loader_start_epoch(l, 0);
    const float *x;
    const int32_t *labels;
    int B;
    while ((B = qt_loader_next(l, &x, &labels)) > 0) {
      qt_ctx_reset(ctx);
      int64_t shape[4] = {B, sub.h, sub.w, sub.c};
      qt_tensor **va = NULL, **vb = NULL;
      if (same) qt_set_fake_quant(fq, 0);
      qt_tensor *ya = qt_graph_forward_values(fp32, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, (void *)x), &va);
      if (same) qt_set_fake_quant(fq, 1);
      if (!ya) {
        snprintf(err, QT_ERR_LEN, "SQNR: fp32 graph: %s", fp32->error);
        rc = -1;
        break;
      }
      if (!qt_graph_forward_values(fq, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, (void *)x), &vb)) {
        snprintf(err, QT_ERR_LEN, "SQNR: fake-quant graph: %s", fq->error);
        rc = -1;
        break;
      }
      for (int k = 0; k < n; k++) {
        qt_tensor *a = va[ref_value[k]], *b = vb[fq_value[k]];
        if (!a || !b || qt_tensor_numel(a) != qt_tensor_numel(b)) continue;
        qt_sqnr_add(&rows[k].sqnr, qt_f32(a), qt_f32(b), qt_tensor_numel(a));
      }
    }
    qt_loader_free(l);
  }
  qt_ctx_reset(ctx);
  qt_ctx_set_grad(ctx, grad);
  qt_graph_set_training(fp32, 1);
  qt_graph_set_training(fq, 1);
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
    if (n->op != QT_OP_CONV2D && n->op != QT_OP_LINEAR && n->op != QT_OP_CONV_BN) continue;
    int bits = n->wq ? n->wq->spec.bits : 32;
    if (n->param[QT_P_WEIGHT] >= 0) bytes += (g->tensors[n->param[QT_P_WEIGHT]].numel * bits + 7) / 8;
    if (n->param[QT_P_BIAS] >= 0) bytes += 4 * g->tensors[n->param[QT_P_BIAS]].numel;
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

int qt_analysis_wanted(const qt_config *cfg, char *err) {
  const char *mode = qt_config_string(cfg, "quant", "mode");
  const char *ptq_only = qt_config_string(cfg, "analysis", "calibration_methods")[0]  ? "calibration_methods"
                         : qt_config_string(cfg, "analysis", "calibration_batches")[0] ? "calibration_batches"
                         : qt_config_bool(cfg, "analysis", "sensitivity")              ? "sensitivity"
                         : qt_config_string(cfg, "analysis", "mixed_precision_k")[0]   ? "mixed_precision_k"
                                                                                       : NULL;
  const int sqnr = qt_config_bool(cfg, "analysis", "layer_sqnr");
  if (strcmp(mode, "ptq") == 0) return ptq_only || sqnr;
  if (ptq_only) {
    snprintf(err, QT_ERR_LEN, "analysis.%s is a PTQ debugging tool: it needs quant.mode = ptq (this run: %s)%s", ptq_only,
             mode, strcmp(mode, "qat") == 0 ? "; a QAT run supports analysis.layer_sqnr" : "");
    return -1;
  }
  if (sqnr && strcmp(mode, "qat") != 0) {
    snprintf(err, QT_ERR_LEN, "analysis.layer_sqnr needs quant.mode = ptq or qat (this run: %s)", mode);
    return -1;
  }
  return sqnr;
}

/* A copy of cfg (all keys) for one variant. */
static qt_config *clone_config(const qt_config *cfg, char *err) {
  qt_config *c = qt_train_config_create();
  char *ini = qt_config_to_ini_string(cfg);
  int rc = qt_config_load_string(c, ini, "analysis", err);
  free(ini);
  if (rc) {
    qt_config_free(c);
    return NULL;
  }
  return c;
}

static int set_method(qt_config *c, const char *method, char *err) {
  if (strcmp(method, "minmax") == 0 || strcmp(method, "moving_average") == 0)
    return qt_config_set(c, "quant", "activation_observer", method, err);
  if (strcmp(method, "percentile") == 0 || strcmp(method, "mse") == 0) {
    if (qt_config_set(c, "quant", "activation_observer", "histogram", err)) return -1;
    return qt_config_set(c, "quant", "activation_range", method, err);
  }
  snprintf(err, QT_ERR_LEN, "analysis.calibration_methods: unknown '%s' (minmax|moving_average|percentile|mse)", method);
  return -1;
}

/* The configured method's name. */
static const char *config_method(const qt_config *cfg) {
  const char *o = qt_config_string(cfg, "quant", "activation_observer");
  if (strcmp(o, "histogram") == 0) return qt_config_string(cfg, "quant", "activation_range");
  return o;
}

/* Prepares c's variant of fp32, calibrates it on lc's batches and evaluates it on `sub` after
 * each count in `counts` (ascending, cumulative: one pass). acc[i], used[i]: accuracy and
 * batches actually seen at counts[i]. Returns the calibrated graph when keep, else frees it. */
static qt_graph *calibrate_eval(const qt_config *c, const qt_graph *fp32, const qt_dataset *train,
                                const qt_loader_config *lc, const qt_dataset *sub, const qt_loader_config *ec,
                                qt_ctx *ctx, const int *counts, int n_counts, double *acc, int *used, int keep,
                                char *err) {
  qt_graph *p = qt_quant_prepare(c, fp32, NULL, err);
  if (!p) return NULL;
  qt_loader *l = qt_loader_create(train, lc, err);
  if (!l) {
    qt_graph_free(p);
    return NULL;
  }
  qt_loader_start_epoch(l, 0);
  int done = 0, rc = 0;
  for (int k = 0; k < n_counts && !rc; k++) {
    if (qt_quant_calibrate_until(p, l, train, ctx, counts[k], &done, err)) {
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
static void json_db(qt_strbuf *b, double db) {
  if (isnan(db)) qt_strbuf_printf(b, "null");
  else if (isinf(db)) qt_strbuf_printf(b, "%s", db > 0 ? "999.0" : "-999.0");
  else qt_strbuf_printf(b, "%.3f", db);
}
static void md_db(qt_strbuf *b, double db) {
  if (isnan(db)) qt_strbuf_printf(b, "n/a");
  else if (isinf(db)) qt_strbuf_printf(b, "%s", db > 0 ? "inf (exact)" : "-inf");
  else qt_strbuf_printf(b, "%.2f", db);
}

typedef struct {
  char name[QT_NAME_LEN];
  double acc, drop;
} layer_sens;

/* The per-node SQNR section of analysis.md (a table under `title`) and the "sqnr" member of
 * analysis.json; ref_name names the reference graph ("fp32"). */
static void write_sqnr(qt_strbuf *md, qt_strbuf *js, const char *title, const char *ref_name, double acc,
                       const qt_node_sqnr *rows, int n_rows) {
  qt_strbuf_printf(md, "## Per-node SQNR, %s (accuracy %.2f%%)\n\n", title, 100 * acc);
  qt_strbuf_printf(md, "Each row compares the %s value with what the fake-quant graph's consumers see (after the "
                       "node's fake quant, if any); errors accumulate along the graph.\n\n", ref_name);
  qt_strbuf_printf(md, "| node | op | %s value | weight bits | output quantized | SQNR (dB) |\n"
                       "|---|---|---|---:|---|---:|\n", ref_name);
  qt_strbuf_printf(js, ",\n  \"sqnr\": {\"accuracy\": %.6f, \"reference\": ", acc);
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
static int write_outputs(const char *dir, const qt_strbuf *md, const qt_strbuf *js, char *json_path, size_t json_path_len,
                         int verbose, char *err) {
  char path[4200];
  snprintf(path, sizeof path, "%s/analysis.md", dir);
  if (qt_write_file_atomic(path, md->s, md->len, err)) return -1;
  snprintf(json_path, json_path_len, "%s/analysis.json", dir);
  if (qt_write_file_atomic(json_path, js->s, js->len, err)) return -1;
  if (verbose) fprintf(stderr, "analysis: written to %s and %s\n", path, json_path);
  return 0;
}

int qt_analysis_run(const qt_config *cfg, qt_graph *fp32, const qt_dataset *train, const qt_dataset *test,
                    const qt_loader_config *lc, const qt_loader_config *ec, qt_ctx *ctx, const char *dir,
                    char *json_path, size_t json_path_len, int verbose, char *err) {
  int rc = -1;
  qt_strbuf md = {0}, js = {0};
  qt_node_sqnr *srows = NULL;
  int n_srows = 0;
  qt_config *c = NULL;
  qt_dataset sub = *test;
  int64_t images = qt_config_int(cfg, "analysis", "images");
  if (images > 0 && images < sub.n) sub.n = images;
  const int wb = qt_config_int(cfg, "quant", "weight_bits"), ab = qt_config_int(cfg, "quant", "activation_bits");
  const int cal = qt_config_int(cfg, "quant", "calibration_batches");
  const char *keep = qt_config_string(cfg, "analysis", "mixed_precision_keep");

  char methods[MAX_LIST][64];
  int n_methods = split_list(qt_config_string(cfg, "analysis", "calibration_methods"), methods, MAX_LIST);
  int counts[MAX_LIST], n_counts = int_list("calibration_batches", qt_config_string(cfg, "analysis", "calibration_batches"),
                                            counts, MAX_LIST, 1, err);
  if (n_counts < 0) return -1;
  if (n_counts == 0) counts[n_counts++] = cal;
  for (int i = 1; i < n_counts; i++)
    if (counts[i] <= counts[i - 1]) {
      snprintf(err, QT_ERR_LEN, "analysis.calibration_batches must be ascending (e.g. 1,8,32)");
      return -1;
    }
  int ks[MAX_LIST], n_ks = int_list("mixed_precision_k", qt_config_string(cfg, "analysis", "mixed_precision_k"), ks,
                                    MAX_LIST, 0, err);
  if (n_ks < 0) return -1;
  int want_sens = qt_config_bool(cfg, "analysis", "sensitivity") || n_ks > 0;

  /* layers: conv2d / linear of the fp32 model */
  char layers[MAX_LAYERS][QT_NAME_LEN];
  int n_layers = 0;
  for (int i = 0; i < fp32->n_nodes && n_layers < MAX_LAYERS; i++)
    if (fp32->nodes[i].op == QT_OP_CONV2D || fp32->nodes[i].op == QT_OP_LINEAR)
      snprintf(layers[n_layers++], QT_NAME_LEN, "%s", fp32->nodes[i].name);

  qt_eval_result ref;
  if (qt_evaluate(fp32, ctx, &sub, ec, &ref, err)) return -1;
  const int64_t fp32_bytes = qt_analysis_model_bytes(fp32);
  if (verbose)
    fprintf(stderr, "analysis: fp32 accuracy %.2f%% on %lld test images\n", 100 * ref.accuracy, (long long)sub.n);

  qt_strbuf_printf(&md, "# PTQ debugging: %s, W%dA%d\n\n", fp32->name, wb, ab);
  qt_strbuf_printf(&md, "Evaluated on the first %lld test images. fp32 accuracy: **%.2f%%**. Configured calibration: %s, %d batches "
          "of %d.\n\n",
     (long long)sub.n, 100 * ref.accuracy, config_method(cfg), cal, lc->batch_size);
  qt_strbuf_printf(&js, "{\n  \"model\": ");
  qt_strbuf_json_string(&js, fp32->name);
  qt_strbuf_printf(&js, ",\n  \"weight_bits\": %d,\n  \"activation_bits\": %d,\n  \"images\": %lld,\n"
          "  \"fp32_accuracy\": %.6f,\n  \"fp32_model_bytes\": %lld",
     wb, ab, (long long)sub.n, ref.accuracy, (long long)fp32_bytes);

  /* 1. calibration methods x batches: one cumulative calibration pass per method */
  if (n_methods > 0) {
    qt_strbuf_printf(&md, "## Calibration method x calibration batches (accuracy %%)\n\n| method |");
    for (int k = 0; k < n_counts; k++) qt_strbuf_printf(&md, " %d |", counts[k]);
    qt_strbuf_printf(&md, "\n|---|");
    for (int k = 0; k < n_counts; k++) qt_strbuf_printf(&md, "---:|");
    qt_strbuf_printf(&md, "\n");
    qt_strbuf_printf(&js, ",\n  \"calibration\": [");
    for (int m = 0; m < n_methods; m++) {
      c = clone_config(cfg, err);
      if (!c || set_method(c, methods[m], err)) goto out;
      double acc[MAX_LIST];
      int used[MAX_LIST];
      if (!calibrate_eval(c, fp32, train, lc, &sub, ec, ctx, counts, n_counts, acc, used, 0, err)) goto out;
      qt_config_free(c);
      c = NULL;
      qt_strbuf_printf(&md, "| %s |", methods[m]);
      for (int k = 0; k < n_counts; k++) {
        qt_strbuf_printf(&md, " %.2f%s |", 100 * acc[k], used[k] < counts[k] ? "*" : "");
        qt_strbuf_printf(&js, "%s\n    {\"method\": \"%s\", \"batches\": %d, \"batches_used\": %d, \"accuracy\": %.6f}",
           m || k ? "," : "", methods[m], counts[k], used[k], acc[k]);
      }
      qt_strbuf_printf(&md, "\n");
      if (verbose) {
        fprintf(stderr, "analysis: calibration %s:", methods[m]);
        for (int k = 0; k < n_counts; k++) fprintf(stderr, " %d batches %.2f%%", counts[k], 100 * acc[k]);
        fprintf(stderr, "\n");
      }
    }
    qt_strbuf_printf(&md, "\n");
    qt_strbuf_printf(&js, "\n  ]");
  }

  /* 2. per-node SQNR of the configured variant */
  if (qt_config_bool(cfg, "analysis", "layer_sqnr")) {
    double acc;
    int used;
    qt_graph *p = calibrate_eval(cfg, fp32, train, lc, &sub, ec, ctx, &cal, 1, &acc, &used, 1, err);
    if (!p) goto out;
    int r = qt_analysis_node_sqnr(fp32, p, ctx, &sub, ec, sub.n, &srows, &n_srows, err);
    qt_graph_free(p);
    if (r) goto out;
    write_sqnr(&md, &js, "fp32 vs fake quant (configured settings)", "fp32", acc, srows, n_srows);
  }

  /* 3. sensitivity: only one layer quantized */
  layer_sens sens[MAX_LAYERS];
  if (want_sens) {
    qt_strbuf_printf(&md, "## Sensitivity: only one layer quantized at W%dA%d\n\n| layer | accuracy %% | drop (points) |\n"
            "|---|---:|---:|\n", wb, ab);
    qt_strbuf_printf(&js, ",\n  \"sensitivity\": [");
    for (int L = 0; L < n_layers; L++) {
      char ov[4096] = "";
      size_t len = 0;
      for (int o = 0; o < n_layers; o++)
        if (o != L) len += (size_t)snprintf(ov + len, sizeof ov - len, "%s%s=fp32", len ? ";" : "", layers[o]);
      c = clone_config(cfg, err);
      if (!c || qt_config_set(c, "quant", "layer_overrides", ov, err)) goto out;
      int used;
      if (!calibrate_eval(c, fp32, train, lc, &sub, ec, ctx, &cal, 1, &sens[L].acc, &used, 0, err)) goto out;
      qt_config_free(c);
      c = NULL;
      snprintf(sens[L].name, sizeof sens[L].name, "%s", layers[L]);
      sens[L].drop = 100 * (ref.accuracy - sens[L].acc);
      qt_strbuf_printf(&md, "| %s | %.2f | %.2f |\n", layers[L], 100 * sens[L].acc, sens[L].drop);
      qt_strbuf_printf(&js, "%s\n    {\"layer\": ", L ? "," : "");
      qt_strbuf_json_string(&js, layers[L]);
      qt_strbuf_printf(&js, ", \"accuracy\": %.6f, \"drop_points\": %.4f}", sens[L].acc, sens[L].drop);
      if (verbose) fprintf(stderr, "analysis: only %s quantized: %.2f%%\n", layers[L], 100 * sens[L].acc);
    }
    qt_strbuf_printf(&md, "\n");
    qt_strbuf_printf(&js, "\n  ]");
  }

  /* 4. mixed precision: the k most sensitive layers kept at `keep` */
  if (n_ks > 0) {
    int order[MAX_LAYERS];
    for (int i = 0; i < n_layers; i++) order[i] = i;
    for (int i = 1; i < n_layers; i++) /* stable insertion sort, largest drop first */
      for (int j = i; j > 0 && sens[order[j]].drop > sens[order[j - 1]].drop; j--) {
        int t = order[j];
        order[j] = order[j - 1];
        order[j - 1] = t;
      }
    qt_strbuf_printf(&md, "## Mixed precision: the k most sensitive layers at %s, the rest at W%dA%d\n\n", keep, wb, ab);
    qt_strbuf_printf(&md, "Model size: conv/linear weights at their bit widths plus 4-byte biases (BN folded); fp32: %lld bytes.\n\n",
       (long long)fp32_bytes);
    qt_strbuf_printf(&md, "| k | layers kept at %s | accuracy %% | model bytes | vs fp32 |\n|---:|---|---:|---:|---:|\n", keep);
    qt_strbuf_printf(&js, ",\n  \"mixed_precision\": {\"keep\": \"%s\", \"rows\": [", keep);
    for (int q = 0; q < n_ks; q++) {
      int k = ks[q] > n_layers ? n_layers : ks[q];
      char ov[4096] = "", names[4096] = "";
      size_t len = 0, nl = 0;
      for (int i = 0; i < k; i++) {
        const char *nm = layers[order[i]];
        len += (size_t)snprintf(ov + len, sizeof ov - len, "%s%s=%s", len ? ";" : "", nm, keep);
        nl += (size_t)snprintf(names + nl, sizeof names - nl, "%s%s", nl ? ", " : "", nm);
      }
      c = clone_config(cfg, err);
      if (!c || qt_config_set(c, "quant", "layer_overrides", ov, err)) goto out;
      double acc;
      int used;
      qt_graph *p = calibrate_eval(c, fp32, train, lc, &sub, ec, ctx, &cal, 1, &acc, &used, 1, err);
      if (!p) goto out;
      int64_t bytes = qt_analysis_model_bytes(p);
      qt_graph_free(p);
      qt_config_free(c);
      c = NULL;
      qt_strbuf_printf(&md, "| %d | %s | %.2f | %lld | %.1f%% |\n", k, k ? names : "(none)", 100 * acc, (long long)bytes,
         100.0 * (double)bytes / (double)fp32_bytes);
      qt_strbuf_printf(&js, "%s\n    {\"k\": %d, \"kept\": [", q ? "," : "", k);
      for (int i = 0; i < k; i++) {
        if (i) qt_strbuf_printf(&js, ", ");
        qt_strbuf_json_string(&js, layers[order[i]]);
      }
      qt_strbuf_printf(&js, "], \"accuracy\": %.6f, \"model_bytes\": %lld}", acc, (long long)bytes);
      if (verbose) fprintf(stderr, "analysis: mixed precision k=%d: %.2f%%, %lld bytes\n", k, 100 * acc, (long long)bytes);
    }
    qt_strbuf_printf(&md, "\n");
    qt_strbuf_printf(&js, "\n  ]}");
  }
  qt_strbuf_printf(&js, "\n}\n");

  if (write_outputs(dir, &md, &js, json_path, json_path_len, verbose, err)) goto out;
  rc = 0;
out:
  if (c) qt_config_free(c);
  free(srows);
  free(md.s);
  free(js.s);
  qt_graph_set_training(fp32, 1);
  return rc;
}

int qt_analysis_run_qat(const qt_config *cfg, qt_graph *qat, const qt_dataset *test, const qt_loader_config *ec,
                        qt_ctx *ctx, const char *dir, char *json_path, size_t json_path_len, int verbose, char *err) {
  int rc = -1;
  qt_strbuf md = {0}, js = {0};
  qt_node_sqnr *rows = NULL;
  int n_rows = 0;
  qt_dataset sub = *test;
  int64_t images = qt_config_int(cfg, "analysis", "images");
  if (images > 0 && images < sub.n) sub.n = images;
  const int wb = qt_config_int(cfg, "quant", "weight_bits"), ab = qt_config_int(cfg, "quant", "activation_bits");
  qt_eval_result on, off;
  qt_graph_sync_learned_scales(qat);
  if (qt_evaluate(qat, ctx, &sub, ec, &on, err)) goto out;
  qt_set_fake_quant(qat, 0);
  rc = qt_evaluate(qat, ctx, &sub, ec, &off, err);
  qt_set_fake_quant(qat, 1);
  if (rc) goto out;
  rc = -1;
  if (qt_analysis_node_sqnr(qat, qat, ctx, &sub, ec, sub.n, &rows, &n_rows, err)) goto out;
  qt_strbuf_printf(&md, "# QAT debugging: %s, W%dA%d\n\n", qat->name, wb, ab);
  qt_strbuf_printf(&md, "The QAT-trained model on the first %lld test images: with fake quant **%.2f%%**, with fake quant "
                        "off (the float model QAT trained, BN statistics as trained) **%.2f%%**.\n\n",
                   (long long)sub.n, 100 * on.accuracy, 100 * off.accuracy);
  qt_strbuf_printf(&js, "{\n  \"model\": ");
  qt_strbuf_json_string(&js, qat->name);
  qt_strbuf_printf(&js, ",\n  \"mode\": \"qat\",\n  \"weight_bits\": %d,\n  \"activation_bits\": %d,\n"
                        "  \"images\": %lld,\n  \"accuracy\": %.6f,\n  \"float_accuracy\": %.6f",
                   wb, ab, (long long)sub.n, on.accuracy, off.accuracy);
  write_sqnr(&md, &js, "the QAT model without vs with fake quant", "float (fake quant off)", on.accuracy, rows, n_rows);
  qt_strbuf_printf(&js, "\n}\n");
  if (write_outputs(dir, &md, &js, json_path, json_path_len, verbose, err)) goto out;
  rc = 0;
out:
  free(rows);
  free(md.s);
  free(js.s);
  qt_graph_set_training(qat, 1);
  return rc;
}
