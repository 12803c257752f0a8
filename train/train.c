/* The training job: data, model, optimizer, loop with progress, CSV log, checkpoints,
 * evaluation and summary.json. */
#include "train/train.h"
#include "train/quant_job.h"
#include "train/analysis.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- data ----------------------------------------------------------------------------------- */
int qt_train_load_data(const qt_config *cfg, qt_dataset *train, qt_dataset *test, char *err) {
  const char *fmt = qt_config_string(cfg, "data", "format");
  memset(train, 0, sizeof *train);
  memset(test, 0, sizeof *test);
  int rc;
  if (strcmp(fmt, "idx") == 0) {
    rc = qt_dataset_load_idx(train, qt_config_string(cfg, "data", "train_images"),
                             qt_config_string(cfg, "data", "train_labels"), err);
    if (!rc)
      rc = qt_dataset_load_idx(test, qt_config_string(cfg, "data", "test_images"),
                               qt_config_string(cfg, "data", "test_labels"), err);
  } else {
    const char *tr = qt_config_string(cfg, "data", "train_path"), *te = qt_config_string(cfg, "data", "test_path");
    if (!tr[0] || !te[0]) {
      snprintf(err, QT_ERR_LEN, "data.format = %s needs data.train_path and data.test_path", fmt);
      return -1;
    }
    if (strcmp(fmt, "hdf5") == 0) {
      rc = qt_dataset_load_hdf5(train, tr, err);
      if (!rc) rc = qt_dataset_load_hdf5(test, te, err);
    } else {
      int ch = qt_config_int(cfg, "data", "channels");
      rc = qt_dataset_load_folder(train, tr, ch, err);
      if (!rc) rc = qt_dataset_load_folder(test, te, ch, err);
    }
  }
  if (rc) {
    qt_dataset_free(train);
    qt_dataset_free(test);
    return -1;
  }
  qt_dataset_limit(train, qt_config_int(cfg, "data", "train_limit"));
  qt_dataset_limit(test, qt_config_int(cfg, "data", "test_limit"));
  if (train->h != test->h || train->w != test->w || train->c != test->c) {
    snprintf(err, QT_ERR_LEN, "data: training images are %dx%dx%d but test images are %dx%dx%d", train->h, train->w,
             train->c, test->h, test->w, test->c);
    qt_dataset_free(train);
    qt_dataset_free(test);
    return -1;
  }
  return 0;
}

qt_loader_config qt_train_loader_config(const qt_config *cfg, int batch, int shuffle, int augment) {
  qt_loader_config lc;
  memset(&lc, 0, sizeof lc);
  lc.batch_size = batch;
  lc.shuffle = shuffle;
  lc.seed = (uint64_t)qt_config_int(cfg, "train", "seed");
  lc.drop_last = 0;
  for (int c = 0; c < 4; c++) {
    lc.mean[c] = (float)qt_config_float(cfg, "data", "mean");
    lc.std[c] = (float)qt_config_float(cfg, "data", "std");
  }
  if (augment) {
    lc.crop_pad = qt_config_int(cfg, "data", "crop_pad");
    lc.flip = qt_config_bool(cfg, "data", "flip");
  }
  return lc;
}

/* ---- evaluation ----------------------------------------------------------------------------- */
int qt_evaluate(qt_graph *g, qt_ctx *shared, const qt_dataset *ds, const qt_loader_config *lc, qt_eval_result *out,
                char *err) {
  memset(out, 0, sizeof *out);
  int rc = 0;
  qt_loader *l = qt_loader_create(ds, lc, err);
  if (!l) return -1;
  qt_ctx *ctx = shared ? shared : qt_ctx_create();
  int grad = qt_ctx_grad_enabled(ctx);
  qt_ctx_set_grad(ctx, 0);
  qt_graph_set_training(g, 0);
  double t0 = qt_now_seconds(), loss_sum = 0;
  int64_t correct = 0, n = 0;
  qt_loader_start_epoch(l, 0);
  const float *images;
  const int32_t *labels;
  int B;
  while ((B = qt_loader_next(l, &images, &labels)) > 0) {
    qt_ctx_reset(ctx);
    int64_t shape[4] = {B, ds->h, ds->w, ds->c};
    qt_tensor *x = qt_tensor_wrap(ctx, QT_F32, 4, shape, (void *)images);
    qt_tensor *logits = qt_graph_forward(g, ctx, x);
    if (!logits) {
      snprintf(err, QT_ERR_LEN, "evaluating: %s", g->error);
      rc = -1;
      break;
    }
    float *probs;
    int C = (int)logits->shape[1];
    qt_tensor *loss = qt_cross_entropy(ctx, logits, labels, &probs);
    loss_sum += (double)qt_f32(loss)[0] * B;
    for (int i = 0; i < B; i++) correct += qt_argmax(probs + (size_t)i * C, C) == labels[i];
    n += B;
  }
  out->seconds = qt_now_seconds() - t0;
  out->n = n;
  out->accuracy = n ? (double)correct / (double)n : 0;
  out->loss = n ? loss_sum / (double)n : 0;
  qt_ctx_reset(ctx);
  qt_ctx_set_grad(ctx, grad);
  if (!shared) qt_ctx_free(ctx);
  qt_loader_free(l);
  qt_graph_set_training(g, 1);
  return rc;
}

/* ---- progress ------------------------------------------------------------------------------- */
typedef struct {
  int mode; /* 0 none, 1 lines, 2 bar */
  double last_draw;
} progress;

static void fmt_eta(char *buf, size_t n, double s) {
  if (!(s >= 0) || s > 360000) s = 0;
  int t = (int)(s + 0.5);
  snprintf(buf, n, "%d:%02d:%02d", t / 3600, t / 60 % 60, t % 60);
}

static void progress_draw(progress *p, int epoch, int epochs, int64_t b, int64_t nb, double loss, double acc,
                          double ips, double elapsed, int final) {
  if (p->mode != 2) return;
  double t = qt_now_seconds();
  if (!final && t - p->last_draw < 0.2) return;
  p->last_draw = t;
  int width = 24, filled = nb ? (int)(width * b / nb) : width;
  char bar[32], eta[32];
  for (int i = 0; i < width; i++) bar[i] = i < filled ? '#' : '.';
  bar[width] = 0;
  fmt_eta(eta, sizeof eta, b ? elapsed / (double)b * (double)(nb - b) : 0);
  fprintf(stderr, "\repoch %d/%d [%s] %3d%% %lld/%lld loss %.4f acc %5.2f%% %6.0f img/s ETA %s ", epoch, epochs, bar,
          nb ? (int)(100 * b / nb) : 100, (long long)b, (long long)nb, loss, 100 * acc, ips, eta);
  if (final) fputc('\n', stderr);
  fflush(stderr);
}

/* ---- the job -------------------------------------------------------------------------------- */
typedef struct {
  int epoch;
  double lr, train_loss, train_acc, test_loss, test_acc, images_per_s, seconds;
  int64_t images;
} epoch_row;

static void csv_write(const char *path, const epoch_row *rows, int n, char *err) {
  qt_strbuf b = {0};
  qt_strbuf_printf(&b, "epoch,lr,train_loss,train_accuracy,test_loss,test_accuracy,images_per_s,epoch_seconds,images\n");
  for (int i = 0; i < n; i++)
    qt_strbuf_printf(&b, "%d,%.8g,%.6f,%.6f,%.6f,%.6f,%.1f,%.3f,%lld\n", rows[i].epoch, rows[i].lr, rows[i].train_loss,
              rows[i].train_acc, rows[i].test_loss, rows[i].test_acc, rows[i].images_per_s, rows[i].seconds,
              (long long)rows[i].images);
  if (qt_write_file_atomic(path, b.s, b.len, err)) fprintf(stderr, "warning: %s\n", err);
  free(b.s);
}

/* Rows of an earlier run's metrics.csv for epochs <= upto (resume). */
static int csv_read(const char *path, epoch_row *rows, int max, int upto) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  char line[1024];
  int n = 0;
  if (!fgets(line, sizeof line, f)) {
    fclose(f);
    return 0;
  }
  while (n < max && fgets(line, sizeof line, f)) {
    epoch_row r;
    long long images = 0;
    if (sscanf(line, "%d,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lld", &r.epoch, &r.lr, &r.train_loss, &r.train_acc,
               &r.test_loss, &r.test_acc, &r.images_per_s, &r.seconds, &images) == 9 &&
        r.epoch <= upto) {
      r.images = images;
      rows[n++] = r;
    }
  }
  fclose(f);
  return n;
}

static int write_summary(const char *path, const qt_config *cfg, const qt_graph *g, double arena_mb,
                         const epoch_row *rows, int n, const qt_eval_result *test, const qt_quant_result *q,
                         int epochs_done, const char *ckpt, const char *analysis, char *err) {
  qt_strbuf b = {0};
  double secs = 0;
  int64_t imgs = 0;
  for (int i = 0; i < n; i++) {
    secs += rows[i].seconds;
    imgs += rows[i].images;
  }
  qt_strbuf_printf(&b, "{\n  \"model\": \"%s\",\n  \"parameters\": %lld,\n", g->name, (long long)qt_graph_param_count(g));
  qt_strbuf_printf(&b, "  \"stages\": {\n    \"fp32\": {\"test_accuracy\": %.6f, \"test_loss\": %.6f, \"test_images\": %lld}",
            test->accuracy, test->loss, (long long)test->n);
  if (q) {
    qt_strbuf_printf(&b, ",\n    \"fake_quant\": {\"test_accuracy\": %.6f, \"test_loss\": %.6f, \"test_images\": %lld}",
              q->fake_quant.accuracy, q->fake_quant.loss, (long long)q->fake_quant.n);
    qt_strbuf_printf(&b, ",\n    \"qdq\": {\"test_accuracy\": %.6f, \"test_loss\": %.6f, \"test_images\": %lld}",
              q->qdq.accuracy, q->qdq.loss, (long long)q->qdq.n);    if (q->deployed)
      qt_strbuf_printf(&b, ",\n    \"int8\": {\"test_accuracy\": %.6f, \"test_images\": %lld}", q->report.device_accuracy,
                (long long)q->report.images);
  }
  qt_strbuf_printf(&b, "\n  },\n");
  if (q) {
    qt_strbuf_printf(&b, "  \"quant\": {\"mode\": \"%s\", \"weight_bits\": %d, \"activation_bits\": %d},\n",
              qt_config_string(cfg, "quant", "mode"), qt_config_int(cfg, "quant", "weight_bits"),
              qt_config_int(cfg, "quant", "activation_bits"));
    qt_strbuf_printf(&b, "  \"convert\": {\"qdq_model\": \"%s\", \"trained_model\": \"%s\"},\n", q->qdq_path,
              q->trained_path);
    qt_strbuf_printf(&b, "  \"check\": {\"ok\": %s, \"quantization_points\": %d, \"weights\": %d, \"max_lsb\": %.3f, "
                  "\"tie_flips\": %lld, \"reason\": ",
              q->check.ok ? "true" : "false", q->check.n_checked_points, q->check.n_checked_weights, q->check.max_lsb,
              (long long)q->check.tie_mismatches);
    qt_strbuf_json_string(&b, q->check.reason);
    qt_strbuf_printf(&b, "},\n");
    if (q->deployed) {
      char *rep = qt_report_json(&q->report, "  ");
      qt_strbuf_printf(&b, "%s,\n", rep);
      free(rep);
      qt_strbuf_printf(&b, "  \"inference\": {\"batch_size\": %d, \"fp32_images_per_s\": %.1f, \"int8_images_per_s\": %.1f, "
                    "\"int8_vs_fp32\": %.3f},\n  \"report\": \"%s\",\n",
                q->speed.batch, q->speed.fp32_images_per_s, q->speed.int8_images_per_s,
                q->speed.fp32_images_per_s > 0 ? q->speed.int8_images_per_s / q->speed.fp32_images_per_s : 0.0,
                q->report_path);
    }
  }
  qt_strbuf_printf(&b, "  \"train\": {\n    \"epochs\": %d,\n    \"images_per_s\": %.1f,\n    \"epoch_seconds\": [", epochs_done,
            secs > 0 ? (double)imgs / secs : 0.0);
  for (int i = 0; i < n; i++) qt_strbuf_printf(&b, "%s%.3f", i ? ", " : "", rows[i].seconds);
  qt_strbuf_printf(&b, "],\n    \"peak_rss_mb\": %.1f,\n    \"arena_peak_mb\": %.1f,\n", qt_peak_rss_mb(),
            arena_mb);
  if (n)
    qt_strbuf_printf(&b, "    \"final_train_loss\": %.6f,\n    \"final_train_accuracy\": %.6f,\n", rows[n - 1].train_loss,
              rows[n - 1].train_acc);
  qt_strbuf_printf(&b, "    \"batch_size\": %d,\n    \"threads\": %d\n  },\n", qt_config_int(cfg, "train", "batch_size"),
            omp_get_max_threads());
  if (analysis && analysis[0]) qt_strbuf_printf(&b, "  \"analysis\": \"%s\",\n", analysis);
  qt_strbuf_printf(&b, "  \"checkpoint\": \"%s\"\n}\n", ckpt);
  int rc = qt_write_file_atomic(path, b.s, b.len, err);
  free(b.s);
  return rc;
}

/* train.resume: the checkpoint's stored config must agree with this run on quant.mode and, for
 * a quantized run, on every [quant] key that shaped the prepared graph or its training so far
 * (all but the post-training check_batch and fp32_config, which only says how to make the fp32
 * checkpoint). [train] keys may change on resume, as for fp32 runs. The graph itself is compared
 * again when the checkpoint is loaded (qt_checkpoint_load). */
static int resume_config_matches(const qt_config *cfg, const char *ini, const char *path, char *err) {
  if (!ini || !ini[0]) {
    fprintf(stderr, "warning: %s stores no config; comparing its graph with this run's only\n", path);
    return 0;
  }
  qt_config *old = qt_train_config_create();
  char lerr[QT_ERR_LEN];
  if (qt_config_load_string(old, ini, path, lerr)) {
    fprintf(stderr, "warning: cannot read the config stored in %s (%s); comparing its graph with this run's only\n",
            path, lerr);
    qt_config_free(old);
    return 0;
  }
  const int quant = strcmp(qt_config_string(cfg, "quant", "mode"), "none") != 0;
  int n, rc = 0;
  const qt_cfg_key *schema = qt_train_schema(&n);
  for (int i = 0; i < n && !rc; i++) {
    const qt_cfg_key *k = &schema[i];
    if (strcmp(k->section, "quant") != 0 || (!quant && strcmp(k->key, "mode") != 0) ||
        strcmp(k->key, "check_batch") == 0 || strcmp(k->key, "fp32_config") == 0)
      continue;
    int same;
    switch (k->type) {
      case QT_CFG_INT: same = qt_config_int64(old, k->section, k->key) == qt_config_int64(cfg, k->section, k->key); break;
      case QT_CFG_FLOAT: same = qt_config_float(old, k->section, k->key) == qt_config_float(cfg, k->section, k->key); break;
      case QT_CFG_BOOL: same = qt_config_bool(old, k->section, k->key) == qt_config_bool(cfg, k->section, k->key); break;
      case QT_CFG_ENUM: same = qt_config_enum(old, k->section, k->key) == qt_config_enum(cfg, k->section, k->key); break;
      default: same = strcmp(qt_config_string(old, k->section, k->key), qt_config_string(cfg, k->section, k->key)) == 0;
    }
    if (!same) {
      snprintf(err, QT_ERR_LEN,
               "train.resume: checkpoint '%s' was written with quant.%s = '%s', this run has quant.%s = '%s'; a "
               "resumed run keeps its [quant] settings (restore the setting, or start again in another output.dir)",
               path, k->key, qt_config_value(old, k->section, k->key), k->key, qt_config_value(cfg, k->section, k->key));
      rc = -1;
    }
  }
  qt_config_free(old);
  return rc;
}

int qt_train_run(qt_config *cfg, char *err) {
  int rc = -1;
  qt_dataset train = {0}, test = {0};
  qt_graph *g = NULL, *prepared = NULL;
  qt_optim *opt = NULL;
  qt_loader *loader = NULL;
  qt_ctx *ctx = NULL;
  epoch_row *rows = NULL;
  char *ini = NULL;

  int threads = qt_config_int(cfg, "train", "threads");
  if (threads > 0) omp_set_num_threads(threads);
  const char *dir = qt_config_string(cfg, "output", "dir");
  {
    char derr[QT_ERR_LEN];
    if (qt_mkdir_p(dir, derr)) return qt_err(err, "output.dir: %s", derr);
  }
  char ckpt_path[4096], csv_path[4096], summary_path[4096], dot_path[4096];
  snprintf(ckpt_path, sizeof ckpt_path, "%s/checkpoint.h5", dir);
  snprintf(csv_path, sizeof csv_path, "%s/metrics.csv", dir);
  snprintf(summary_path, sizeof summary_path, "%s/summary.json", dir);
  snprintf(dot_path, sizeof dot_path, "%s/model.dot", dir);

  const char *pmode = qt_config_string(cfg, "output", "progress");
  progress prog = {.mode = strcmp(pmode, "none") == 0    ? 0
                           : strcmp(pmode, "lines") == 0 ? 1
                           : strcmp(pmode, "bar") == 0   ? 2
                                                         : (isatty(2) ? 2 : 1)};

  /* settings that contradict each other, before any work */
  const int analysis = qt_analysis_wanted(cfg, err);
  if (analysis < 0) goto out;
  if (strcmp(qt_config_string(cfg, "quant", "mode"), "qat") == 0 &&
      strcmp(qt_config_string(cfg, "quant", "qat_init"), "calibration") == 0 &&
      qt_config_float(cfg, "quant", "freeze_observers_after") > 0) {
    snprintf(err, QT_ERR_LEN, "quant.freeze_observers_after = %g has no effect with quant.qat_init = calibration: "
                              "the calibrated qparams stay fixed (or are learned with LSQ) from the start",
             qt_config_float(cfg, "quant", "freeze_observers_after"));
    goto out;
  }
  /* train.resume with a checkpoint: a PTQ run has no epochs and simply calibrates again; any
   * other run must match the checkpoint's [quant] settings (checked before any work). */
  const int ptq_run = strcmp(qt_config_string(cfg, "quant", "mode"), "ptq") == 0;
  const int resuming = qt_config_bool(cfg, "train", "resume") && access(ckpt_path, F_OK) == 0 && !ptq_run;
  if (qt_config_bool(cfg, "train", "resume") && ptq_run && prog.mode)
    fprintf(stderr, "train.resume: a PTQ run has no epochs to resume; calibrating again\n");
  if (resuming) {
    qt_checkpoint_meta meta;
    if (qt_checkpoint_read_meta(ckpt_path, &meta, err)) goto out;
    int bad = resume_config_matches(cfg, meta.config_ini, ckpt_path, err);
    free(meta.config_ini);
    if (bad) goto out;
  }
  if (strcmp(qt_config_string(cfg, "quant", "mode"), "none") != 0 &&
      qt_quant_ensure_fp32(cfg, prog.mode != 0, err))
    goto out;
  if (qt_train_load_data(cfg, &train, &test, err)) goto out;
  g = qt_model_build(qt_config_string(cfg, "model", "name"), err);
  if (!g) goto out;
  {
    const qt_value *in = &g->values[g->input];
    if (in->shape[0] != train.h || in->shape[1] != train.w || in->shape[2] != train.c) {
      snprintf(err, QT_ERR_LEN, "model %s takes %lldx%lldx%lld images, data.%s gives %dx%dx%d", g->name,
               (long long)in->shape[0], (long long)in->shape[1], (long long)in->shape[2],
               qt_config_string(cfg, "data", "format"), train.h, train.w, train.c);
      goto out;
    }
    int C = (int)g->values[g->output].shape[0];
    if (train.num_classes > C || test.num_classes > C) {
      snprintf(err, QT_ERR_LEN, "model %s has %d outputs but the data has %d classes", g->name, C,
               train.num_classes > test.num_classes ? train.num_classes : test.num_classes);
      goto out;
    }
  }
  uint64_t seed = (uint64_t)qt_config_int(cfg, "train", "seed");
  qt_graph_init_params(g, seed);
  if (qt_config_bool(cfg, "output", "dot")) {
    FILE *f = fopen(dot_path, "w");
    if (f) {
      qt_graph_write_dot(g, f);
      fclose(f);
    }
  }

  ctx = qt_ctx_create();
  int batch = qt_config_int(cfg, "train", "batch_size");
  qt_loader_config lc = qt_train_loader_config(cfg, batch, 1, 1);
  qt_loader_config ec = qt_train_loader_config(cfg, qt_config_int(cfg, "train", "eval_batch_size"), 0, 0);
  const char *qmode = qt_config_string(cfg, "quant", "mode");
  const int quant = strcmp(qmode, "none") != 0, ptq = strcmp(qmode, "ptq") == 0;
  qt_graph *tg = g; /* the graph trained: fp32, or the prepared graph */
  qt_eval_result ev_fp32 = {0};
  qt_quant_result qres;
  memset(&qres, 0, sizeof qres);
  char analysis_path[4200] = "";
  if (quant) {
    /* Resuming QAT: the fp32 model is obtained and prepared exactly as at the start; the
     * checkpoint then replaces the prepared graph's state (below), calibration included. */
    if (qt_quant_obtain_fp32(cfg, g, prog.mode != 0, err)) goto out;
    if (qt_evaluate(g, ctx, &test, &ec, &ev_fp32, err)) goto out;
    if (prog.mode) fprintf(stderr, "quant: fp32 test accuracy %.2f%%\n", 100 * ev_fp32.accuracy);
    char rep_path[4200];
    snprintf(rep_path, sizeof rep_path, "%s/quantizer.txt", dir);
    FILE *rep = fopen(rep_path, "w");
    prepared = qt_quant_prepare(cfg, g, rep, err);
    if (rep) fclose(rep);
    if (!prepared) goto out;
    tg = prepared;
    if (qt_config_bool(cfg, "output", "dot")) {
      snprintf(rep_path, sizeof rep_path, "%s/model_prepared.dot", dir);
      FILE *f = fopen(rep_path, "w");
      if (f) {
        qt_graph_write_dot(tg, f);
        fclose(f);
      }
    }
    const int calibrate =
        ptq || (!resuming && strcmp(qt_config_string(cfg, "quant", "qat_init"), "calibration") == 0);
    if (calibrate && qt_quant_calibrate(cfg, tg, &train, &lc, ctx, prog.mode != 0, err)) goto out;
    if (ptq && analysis &&
        qt_analysis_run(cfg, g, &train, &test, &lc, &ec, ctx, dir, analysis_path, sizeof analysis_path, prog.mode != 0,
                        err))
      goto out;
  }

  qt_optim_config oc = {0};
  if (qt_optim_kind_parse(qt_config_string(cfg, "train", "optimizer"), &oc.kind)) {
    snprintf(err, QT_ERR_LEN, "train.optimizer: unknown '%s'", qt_config_string(cfg, "train", "optimizer"));
    goto out;
  }
  oc.momentum = (float)qt_config_float(cfg, "train", "momentum");
  oc.nesterov = qt_config_bool(cfg, "train", "nesterov");
  oc.weight_decay = (float)qt_config_float(cfg, "train", "weight_decay");
  oc.beta1 = (float)qt_config_float(cfg, "train", "beta1");
  oc.beta2 = (float)qt_config_float(cfg, "train", "beta2");
  oc.eps = (float)qt_config_float(cfg, "train", "adam_eps");
  if (oc.kind == QT_OPTIM_ADAMW) oc.momentum = 0;
  if (qt_optim_config_check(&oc, err)) goto out;
  opt = qt_optim_create(&oc, tg->n_params);
  loader = qt_loader_create(&train, &lc, err);
  if (!loader) goto out;
  int64_t nb = qt_loader_num_batches(loader);
  int epochs = ptq ? 0 : qt_config_int(cfg, "train", "epochs");
  qt_lr_schedule sched = {0};
  if (qt_lr_kind_parse(qt_config_string(cfg, "train", "schedule"), &sched.kind)) {
    snprintf(err, QT_ERR_LEN, "train.schedule: unknown '%s'", qt_config_string(cfg, "train", "schedule"));
    goto out;
  }
  sched.base_lr = (float)qt_config_float(cfg, "train", "lr");
  sched.min_lr = (float)qt_config_float(cfg, "train", "min_lr");
  sched.total_steps = nb * (epochs > 0 ? epochs : 1);
  sched.warmup_steps = (int64_t)llround(qt_config_float(cfg, "train", "warmup_epochs") * (double)nb);
  sched.step_size = (int64_t)llround(qt_config_float(cfg, "train", "step_epochs") * (double)nb);
  if (sched.step_size < 1) sched.step_size = 1;
  sched.gamma = (float)qt_config_float(cfg, "train", "gamma");
  if (epochs > 0 && sched.warmup_steps >= sched.total_steps) {
    snprintf(err, QT_ERR_LEN, "train.warmup_epochs = %g covers the whole run of %d epochs",
             qt_config_float(cfg, "train", "warmup_epochs"), epochs);
    goto out;
  }
  if (qt_lr_schedule_check(&sched, err)) goto out;

  ini = qt_config_to_ini_string(cfg);
  int start_epoch = 0;
  int64_t step = 0;
  rows = calloc((size_t)epochs + 1, sizeof *rows);
  int n_rows = 0;
  if (resuming) {
    qt_checkpoint_meta meta;
    if (qt_checkpoint_load(ckpt_path, tg, opt, &meta, err)) goto out;
    if (meta.seed != seed)
      fprintf(stderr, "warning: resuming %s trained with seed %llu under train.seed = %llu\n", ckpt_path,
              (unsigned long long)meta.seed, (unsigned long long)seed);
    free(meta.config_ini);
    start_epoch = meta.epoch;
    step = meta.step;
    n_rows = csv_read(csv_path, rows, epochs, start_epoch);
    fprintf(stderr, "resuming from %s: %d epoch(s) done, step %lld\n", ckpt_path, start_epoch, (long long)step);
  }

  if (prog.mode)
    fprintf(stderr, "%s: %lld parameters; %lld training / %lld test images; %d epochs of %lld batches; %d threads\n",
            g->name, (long long)qt_graph_param_count(g), (long long)train.n, (long long)test.n, epochs, (long long)nb,
            omp_get_max_threads());
  int stop_after = qt_config_int(cfg, "train", "stop_after_epochs");
  const double freeze_obs = qt_config_float(cfg, "quant", "freeze_observers_after"),
               freeze_bn = qt_config_float(cfg, "quant", "freeze_bn_after");
  qt_eval_result ev = {0};
  int ran = 0;
  for (int epoch = start_epoch; epoch < epochs; epoch++) {
    if (stop_after > 0 && ran >= stop_after) {
      if (prog.mode) fprintf(stderr, "stopping after %d epoch(s) as train.stop_after_epochs says\n", ran);
      break;
    }
    qt_graph_set_training(tg, 1);
    qt_loader_start_epoch(loader, epoch);
    double t0 = qt_now_seconds(), loss_sum = 0;
    int64_t correct = 0, seen = 0, b = 0;
    float lr = 0;
    const float *images;
    const int32_t *labels;
    int B;
    while ((B = qt_loader_next(loader, &images, &labels)) > 0) {
      if (quant) { /* the freeze schedules, in (fractional) epochs, checked before every step */
        double at = epoch + (double)b / (double)nb;
        if (freeze_obs > 0 && at >= freeze_obs) qt_set_observers(tg, 0);
        if (freeze_bn > 0 && at >= freeze_bn) qt_freeze_bn(tg, 1);
      }
      qt_ctx_reset(ctx);
      qt_ctx_set_grad(ctx, 1);
      int64_t shape[4] = {B, train.h, train.w, train.c};
      qt_tensor *x = qt_tensor_wrap(ctx, QT_F32, 4, shape, (void *)images);
      qt_tensor *logits = qt_graph_forward(tg, ctx, x);
      if (!logits) {
        snprintf(err, QT_ERR_LEN, "epoch %d, batch %lld: %s", epoch + 1, (long long)b + 1, tg->error);
        goto out;
      }
      float *probs;
      qt_tensor *loss = qt_cross_entropy(ctx, logits, labels, &probs);
      float lv = qt_f32(loss)[0];
      if (!isfinite(lv)) {
        if (prog.mode == 2) fputc('\n', stderr);
        snprintf(err, QT_ERR_LEN,
                 "training diverged: loss is %s at epoch %d, batch %lld (step %lld, lr %g); stopped without "
                 "updating. The last good checkpoint (%s) is kept; try a lower train.lr",
                 isnan(lv) ? "NaN" : "Inf", epoch + 1, (long long)b + 1, (long long)step, (double)lr,
                 access(ckpt_path, F_OK) == 0 ? ckpt_path : "none written yet");
        goto out;
      }
      qt_graph_zero_grad(tg);
      qt_backward(ctx, loss);
      lr = qt_lr_at(&sched, step);
      qt_optim_step(opt, tg->params, tg->grads, lr);
      step++;
      b++;
      loss_sum += (double)lv * B;
      int C = (int)logits->shape[1];
      for (int i = 0; i < B; i++) correct += qt_argmax(probs + (size_t)i * C, C) == labels[i];
      seen += B;
      double el = qt_now_seconds() - t0;
      progress_draw(&prog, epoch + 1, epochs, b, nb, loss_sum / (double)seen, (double)correct / (double)seen,
                    (double)seen / el, el, 0);
    }
    double secs = qt_now_seconds() - t0;
    progress_draw(&prog, epoch + 1, epochs, b, nb, seen ? loss_sum / (double)seen : 0,
                  seen ? (double)correct / (double)seen : 0, seen / secs, secs, 1);
    if (qt_evaluate(tg, ctx, &test, &ec, &ev, err)) goto out;
    epoch_row r = {epoch + 1, lr, seen ? loss_sum / (double)seen : 0, seen ? (double)correct / (double)seen : 0,
                   ev.loss, ev.accuracy, seen / secs, secs, seen};
    rows[n_rows++] = r;
    if (prog.mode)
      fprintf(stderr,
              "epoch %d/%d  train loss %.4f acc %.2f%%  test loss %.4f acc %.2f%%  %.0f img/s  %.1f s  lr %.4g\n",
              epoch + 1, epochs, r.train_loss, 100 * r.train_acc, r.test_loss, 100 * r.test_acc, r.images_per_s,
              r.seconds, r.lr);
    qt_checkpoint_meta meta = {epoch + 1, step, seed, ini};
    if (qt_checkpoint_save(ckpt_path, tg, opt, &meta, err)) goto out;
    csv_write(csv_path, rows, n_rows, err);
    ran++;
  }
  if (!quant && (ran == 0 || ev.n == 0)) {
    if (qt_evaluate(g, ctx, &test, &ec, &ev, err)) goto out;
  }
  double arena_mb = (double)qt_ctx_peak_bytes(ctx) / 1048576.0;
  if (quant && !ptq && analysis &&
      qt_analysis_run_qat(cfg, tg, &test, &ec, ctx, dir, analysis_path, sizeof analysis_path, prog.mode != 0, err))
    goto out;
  if (quant) {
    qt_ctx_release(ctx); /* the training step's memory is not needed by convert and the check */
    if (qt_quant_finish(cfg, tg, &test, &ec, ctx, dir, &qres, prog.mode != 0, err)) goto out;
    qt_ctx_release(ctx);
    if (qt_quant_deploy(g, &test, &ec, dir, &qres, prog.mode != 0, err)) goto out;
  }
  if (write_summary(summary_path, cfg, g, arena_mb, rows, n_rows,
                    quant ? &ev_fp32 : &ev, quant ? &qres : NULL, n_rows ? rows[n_rows - 1].epoch : start_epoch,
                    ckpt_path, analysis_path, err))
    goto out;
  if (prog.mode && !quant)
    fprintf(stderr, "fp32 test accuracy %.2f%%; summary in %s; peak RSS %.0f MB\n", 100 * ev.accuracy, summary_path,
            qt_peak_rss_mb());
  if (prog.mode && quant)
    fprintf(stderr, "test accuracy: fp32 %.2f%%, fake quant %.2f%%, Q/DQ graph %.2f%%, int8 device %.2f%%; summary in %s; "
                    "peak RSS %.0f MB\n",
            100 * ev_fp32.accuracy, 100 * qres.fake_quant.accuracy, 100 * qres.qdq.accuracy,
            100 * qres.report.device_accuracy, summary_path, qt_peak_rss_mb());
  if (quant && !qres.check.ok) {
    snprintf(err, QT_ERR_LEN, "the training graph and the convert graph disagree (see summary.json check.reason):\n%s",
             qres.check.reason);
    goto out;
  }
  rc = 0;
out:
  free(ini);
  free(rows);
  qt_ctx_free(ctx);
  qt_loader_free(loader);
  if (opt) qt_optim_free(opt);
  qt_graph_free(g);
  qt_graph_free(prepared);
  qt_dataset_free(&train);
  qt_dataset_free(&test);
  return rc;
}
