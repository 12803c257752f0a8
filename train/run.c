/* `qat_train` as a table of contents of stage calls (train/pipeline.h), with the run's own
 * files: metrics.csv, checkpoints, model.dot and summary.json.
 *
 * Under mpirun (dist/dist.h) every process runs the same stages on its share of the data
 * (trainer.c: data-parallel training, evaluation split and combined), and process 0 alone is the
 * writer: it holds the output folder's lock and writes every file, prints the progress and
 * reads the checkpoint it resumes from, whose state it then sends to the others. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dist/dist.h"
#include "train/analysis.h"
#include "train/pipeline.h"

typedef struct {
  const qt_options *o;
  int verbose, quant, resuming;
  char ckpt[QT_OPT_STR + 32], csv[QT_OPT_STR + 32], summary[QT_OPT_STR + 32], analysis[QT_OPT_STR + 32];
  qt_dataset train, test;
  qt_graph *g;  /* the fp32 model */
  qt_graph *tg; /* the graph trained: g, or the prepared graph */
  qt_ctx *ctx;
  qt_trainer *trainer;
  qt_epoch_stats *rows;
  int n_rows, start_epoch;
  qt_eval_result fp32, final;
  qt_fp32_origin fp32_origin; /* where a quantized run's fp32 model came from */
  qt_quant_result q;
  qt_ptq_methods methods; /* what CLE, AdaRound and bias correction did (PTQ) */
  double arena_mb;
  int lock_fd; /* <output.dir>/.lock, held while the run writes there (-1: none) */
  int ranks;   /* processes of the job (dist.h) */
  int writer;  /* this process writes the files and prints (process 0) */
} run;

/* ---- the job's processes --------------------------------------------------------------------- */
/* The same config can still read other data on another host (other files at the same paths):
 * every process compares a hash of the images and labels it loaded with process 0's. */
static uint64_t dataset_hash(uint64_t h, const qt_dataset *d) {
  const int64_t shape[4] = {d->n, d->h, d->w, d->c}, row = (int64_t)d->h * d->w * d->c;
  h = qt_dist_hash(h, shape, sizeof shape);
  h = qt_dist_hash(h, d->labels, (size_t)d->n * sizeof *d->labels);
  if (!d->in_file) return qt_dist_hash(h, d->images, (size_t)(d->n * row));
  enum { CHUNK = 256 };
  uint8_t *buf = malloc((size_t)(CHUNK * row));
  QT_ASSERT(buf, "out of memory");
  for (int64_t i = 0; i < d->n; i += CHUNK) {
    const int64_t k = d->n - i < CHUNK ? d->n - i : CHUNK;
    h = qt_dist_hash(h, qt_dataset_images(d, i, k, buf), (size_t)(k * row));
  }
  free(buf);
  return h;
}

static int data_agree(const run *r, qt_status *st) {
  if (r->ranks == 1) return 0;
  const int other =
      qt_dist_first_differing(dataset_hash(dataset_hash(QT_DIST_HASH_INIT, &r->train), &r->test), NULL, NULL);
  if (other < 0) return 0;
  return qt_status_set(st, QT_STATUS_INPUT,
                       "data: the images or labels process %d loaded differ from process 0's, with the same config "
                       "(every host must hold the same data files at the [data] paths)",
                       other);
}

/* Every process gets process 0's parameters and buffers (the same model, whatever each read). */
static void share_model(const run *r, qt_graph *g) {
  if (r->ranks == 1) return;
  qt_dist_broadcast(g->params, (size_t)g->n_params * sizeof(float), 0);
  qt_dist_broadcast(g->buffers, (size_t)g->n_buffers * sizeof(float), 0);
}

/* ---- files ----------------------------------------------------------------------------------- */
static void csv_write(const run *r) {
  qt_strbuf b = {0};
  char err[QT_ERR_LEN];
  qt_strbuf_printf(&b,
                   "epoch,lr,train_loss,train_accuracy,test_loss,test_accuracy,images_per_s,epoch_seconds,images\n");
  for (int i = 0; i < r->n_rows; i++) {
    const qt_epoch_stats *e = &r->rows[i];
    qt_strbuf_printf(&b, "%d,%.8g,%.6f,%.6f,%.6f,%.6f,%.1f,%.3f,%lld\n", e->epoch, e->lr, e->train_loss, e->train_acc,
                     e->test_loss, e->test_acc, e->images_per_s, e->seconds, (long long)e->images);
  }
  if (qt_write_file_atomic(r->csv, b.s, b.len, err)) fprintf(stderr, "warning: %s\n", err);
  free(b.s);
}

/* Rows of an earlier run's metrics.csv for epochs <= upto (resume), at most max. */
static int csv_read(const char *path, qt_epoch_stats *rows, int max, int upto) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  char line[1024];
  int n = 0;
  if (fgets(line, sizeof line, f))
    while (n < max && fgets(line, sizeof line, f)) {
      qt_epoch_stats e;
      long long images = 0;
      if (sscanf(line, "%d,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lld", &e.epoch, &e.lr, &e.train_loss, &e.train_acc,
                 &e.test_loss, &e.test_acc, &e.images_per_s, &e.seconds, &images) == 9 &&
          e.epoch <= upto) {
        e.images = images;
        rows[n++] = e;
      }
    }
  fclose(f);
  return n;
}

/* What a memory stream (open_memstream) holds, written to <output.dir>/file atomically (as
 * every output: never through a link planted at a predictable name); a warning on failure. */
static void write_stream(const run *r, FILE *f, char **buf, size_t *len, const char *file) {
  /* fclose sets *buf and *len: they are read only after it */
  fclose(f);
  char path[QT_OPT_STR + 64], err[QT_ERR_LEN];
  snprintf(path, sizeof path, "%s/%s", r->o->output.dir, file);
  if (qt_write_file_atomic(path, *buf, *len, err)) fprintf(stderr, "warning: %s\n", err);
  free(*buf);
  *buf = NULL;
}

static void write_dot(const run *r, const qt_graph *g, const char *file) {
  if (!r->o->output.dot || !r->writer) return;
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return;
  qt_graph_write_dot(g, f);
  write_stream(r, f, &buf, &len, file);
}

static void summary_stage(qt_strbuf *b, const char *name, const qt_eval_result *e, int with_loss) {
  qt_strbuf_printf(b, ",\n    \"%s\": {\"test_accuracy\": %.6f", name, e->accuracy);
  if (with_loss) qt_strbuf_printf(b, ", \"test_loss\": %.6f", e->loss);
  qt_strbuf_printf(b, ", \"test_images\": %lld}", (long long)e->n);
}

/* ", "key": v" with v in dB, null when not finite (an output without error). */
static void json_db(qt_strbuf *b, const char *key, double v) {
  if (isfinite(v))
    qt_strbuf_printf(b, ", \"%s\": %.3f", key, v);
  else
    qt_strbuf_printf(b, ", \"%s\": null", key);
}

static void summary_quant(qt_strbuf *b, const run *r) {
  const qt_quant_result *q = &r->q;
  const qt_ptq_methods *m = &r->methods;
  qt_strbuf_printf(b, "  \"quant\": {\"mode\": \"%s\", \"weight_bits\": %d, \"activation_bits\": %d",
                   r->o->quant.mode == QT_QUANT_PTQ ? "ptq" : "qat", r->o->quant.weight_bits,
                   r->o->quant.activation_bits);
  if (r->o->quant.cle)
    qt_strbuf_printf(b, ", \"cle\": {\"pairs\": %d, \"passes\": %d, \"relu6_made_relu\": %d}", m->cle.pairs,
                     m->cle.iterations, m->cle.relu6_replaced);
  if (r->o->quant.bias_correction == QT_BIAS_CORRECTION_EMPIRICAL)
    qt_strbuf_printf(b,
                     ", \"bias_correction\": {\"form\": \"empirical\", \"layers\": %d, \"mean_error_before\": %.6g, "
                     "\"mean_error_after\": %.6g}",
                     m->bias_correction.layers, m->bias_correction.before, m->bias_correction.after);
  if (r->o->quant.bias_correction == QT_BIAS_CORRECTION_ANALYTICAL)
    qt_strbuf_printf(b,
                     ", \"bias_correction\": {\"form\": \"analytical\", \"layers\": %d, \"skipped\": %d, "
                     "\"expected_shift_removed\": %.6g}",
                     m->bias_correction.layers, m->bias_correction.skipped, m->bias_correction.before);
  if (r->o->quant.adaround) {
    const qt_adaround_result *a = &m->adaround;
    qt_strbuf_printf(b,
                     ", \"adaround\": {\"unit\": \"%s\", \"units\": %d, \"layers\": %d, \"seconds\": %.2f, "
                     "\"iterations\": %d, \"images\": %d, \"per_unit\": [",
                     r->o->quant.adaround_unit == QT_ADAROUND_UNIT_BLOCK ? "block" : "layer", a->units, a->layers,
                     a->seconds, r->o->quant.adaround_iterations, r->o->quant.adaround_images);
    for (int i = 0; i < a->listed; i++) {
      const qt_adaround_unit *u = &a->unit[i];
      qt_strbuf_printf(b, "%s{\"name\": ", i ? ", " : "");
      qt_strbuf_json_string(b, u->name);
      qt_strbuf_printf(b, ", \"layers\": %d, \"activation_scales\": %d, \"weights\": %lld, \"flipped\": %.4f",
                       u->layers, u->activations, (long long)u->weights, u->flipped);
      json_db(b, "sqnr_nearest_db", u->sqnr_nearest_db);
      json_db(b, "sqnr_adaround_db", u->sqnr_adaround_db);
      qt_strbuf_printf(b, "}");
    }
    qt_strbuf_printf(b, "]}");
  }
  qt_strbuf_printf(b, "},\n");
  const qt_fp32_origin *f = &r->fp32_origin;
  qt_strbuf_printf(b, "  \"fp32_model\": {\"how\": ");
  qt_strbuf_json_string(b, f->how ? f->how : "initialization");
  if (f->from_checkpoint) {
    qt_strbuf_printf(b, ", \"checkpoint\": ");
    qt_strbuf_json_string(b, f->checkpoint);
    qt_strbuf_printf(b, ", \"epochs\": %d, \"train_limit\": %d, \"train_images\": ", f->epochs, f->train_limit);
    qt_strbuf_json_string(b, f->train_images);
  }
  qt_strbuf_printf(b, "},\n");
  qt_strbuf_printf(b, "  \"convert\": {\"qdq_model\": ");
  qt_strbuf_json_string(b, q->qdq_path);
  qt_strbuf_printf(b, ", \"trained_model\": ");
  qt_strbuf_json_string(b, q->trained_path);
  qt_strbuf_printf(b, ", \"onnx_model\": ");
  if (q->onnx_path[0]) {
    qt_strbuf_json_string(b, q->onnx_path);
  } else { /* the export refused the graph: why */
    qt_strbuf_printf(b, "null, \"onnx_error\": ");
    qt_strbuf_json_string(b, q->onnx_error);
  }
  qt_strbuf_printf(b, ", \"lost_weight_channels\": %d", q->lost_channels);
  qt_strbuf_printf(b,
                   "},\n  \"check\": {\"ok\": %s, \"quantization_points\": %d, \"weights\": %d, \"max_lsb\": %.3f, "
                   "\"tie_flips\": %lld, \"reason\": ",
                   q->check.ok ? "true" : "false", q->check.n_checked_points, q->check.n_checked_weights,
                   q->check.max_lsb, (long long)q->check.tie_mismatches);
  qt_strbuf_json_string(b, q->check.reason);
  qt_strbuf_printf(b, "},\n");
  if (!q->deployed) return;
  qt_strbuf_printf(b, "  \"backend\": ");
  qt_strbuf_json_string(b, q->report.backend);
  qt_strbuf_printf(b, ",\n");
  char *rep = qt_report_json(&q->report, "  ");
  qt_strbuf_printf(b, "%s,\n", rep);
  free(rep);
  if (q->speed.batch > 0) /* absent with output.timing = false */
    qt_strbuf_printf(b,
                     "  \"inference\": {\"batch_size\": %d, \"fp32_images_per_s\": %.1f, \"int8_images_per_s\": %.1f, "
                     "\"int8_vs_fp32\": %.3f},\n",
                     q->speed.batch, q->speed.fp32_images_per_s, q->speed.int8_images_per_s,
                     q->speed.fp32_images_per_s > 0 ? q->speed.int8_images_per_s / q->speed.fp32_images_per_s : 0.0);
  qt_strbuf_printf(b, "  \"report\": ");
  qt_strbuf_json_string(b, q->report_path);
  qt_strbuf_printf(b, ",\n");
}

static int write_summary(const run *r, char *err) {
  qt_strbuf b = {0};
  double secs = 0;
  int64_t imgs = 0;
  for (int i = 0; i < r->n_rows; i++) {
    secs += r->rows[i].seconds;
    imgs += r->rows[i].images;
  }
  qt_strbuf_printf(&b, "{\n  \"model\": ");
  qt_strbuf_json_string(&b, r->g->name);
  qt_strbuf_printf(&b,
                   ",\n  \"parameters\": %lld,\n  \"stages\": {\n    \"fp32\": {\"test_accuracy\": %.6f, "
                   "\"test_loss\": %.6f, \"test_images\": %lld}",
                   (long long)qt_graph_param_count(r->g), r->fp32.accuracy, r->fp32.loss, (long long)r->fp32.n);
  if (r->quant) {
    summary_stage(&b, "fake_quant", &r->q.fake_quant, 1);
    summary_stage(&b, "qdq", &r->q.qdq, 1);
    if (r->q.deployed) {
      /* "qdq" is the float32 executor's evaluation (with the loss); the report's stages judge with
       * the Q/DQ graph's exact integer reference (eval/exact.h), whose accuracy is "qdq_exact". */
      qt_eval_result exact = {.accuracy = r->q.report.qdq_accuracy, .n = r->q.report.images};
      summary_stage(&b, "qdq_exact", &exact, 0);
      qt_eval_result dev = {.accuracy = r->q.report.device_accuracy, .n = r->q.report.images};
      summary_stage(&b, "int8", &dev, 0);
    }
  }
  qt_strbuf_printf(&b, "\n  },\n");
  if (r->quant) summary_quant(&b, r);
  qt_strbuf_printf(&b, "  \"train\": {\n    \"epochs\": %d,\n    \"images_per_s\": %.1f,\n    \"epoch_seconds\": [",
                   r->n_rows ? r->rows[r->n_rows - 1].epoch : r->start_epoch, secs > 0 ? (double)imgs / secs : 0.0);
  for (int i = 0; i < r->n_rows; i++) qt_strbuf_printf(&b, "%s%.3f", i ? ", " : "", r->rows[i].seconds);
  qt_strbuf_printf(&b, "],\n    \"peak_rss_mb\": %.1f,\n    \"arena_peak_mb\": %.1f,\n", qt_peak_rss_mb(), r->arena_mb);
  if (r->n_rows)
    qt_strbuf_printf(&b, "    \"final_train_loss\": %.6f,\n    \"final_train_accuracy\": %.6f,\n",
                     r->rows[r->n_rows - 1].train_loss, r->rows[r->n_rows - 1].train_acc);
  qt_strbuf_printf(&b, "    \"batch_size\": %d,\n    \"threads\": %d", r->o->train.batch_size, omp_get_max_threads());
  if (r->ranks > 1) qt_strbuf_printf(&b, ",\n    \"processes\": %d", r->ranks); /* threads is per process */
  qt_strbuf_printf(&b, "\n  },\n");
  if (r->analysis[0]) {
    qt_strbuf_printf(&b, "  \"analysis\": ");
    qt_strbuf_json_string(&b, r->analysis);
    qt_strbuf_printf(&b, ",\n");
  }
  qt_strbuf_printf(&b, "  \"checkpoint\": ");
  qt_strbuf_json_string(&b, r->ckpt);
  qt_strbuf_printf(&b, "\n}\n");
  int rc = qt_write_file_atomic(r->summary, b.s, b.len, err);
  free(b.s);
  return rc;
}

/* One run per output folder: a write lock on <dir>/.lock (released when the process ends or the
 * run closes it). A second run on the same folder is refused, naming the first one's process. */
static int lock_dir(run *r, const char *dir, qt_status *st) {
  char path[QT_OPT_STR + 16];
  snprintf(path, sizeof path, "%s/.lock", dir);
  /* O_NOFOLLOW: a planted (even dangling) symlink is refused, not followed to create its target */
  r->lock_fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (r->lock_fd < 0 && errno == ELOOP)
    return qt_status_set(st, QT_STATUS_INPUT, "output.dir: '%s' is a symbolic link; remove it (runs create it)", path);
  if (r->lock_fd < 0) return qt_status_set(st, QT_STATUS_IO, "output.dir: cannot open '%s': %s", path, strerror(errno));
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
  if (fcntl(r->lock_fd, F_SETLK, &fl) != 0) {
    struct flock who = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    const long pid = fcntl(r->lock_fd, F_GETLK, &who) == 0 && who.l_type != F_UNLCK ? (long)who.l_pid : -1;
    close(r->lock_fd);
    r->lock_fd = -1;
    return qt_status_set(st, QT_STATUS_INPUT,
                         "output.dir '%s' is in use by another run (process %ld); wait for it or choose another "
                         "output.dir",
                         dir, pid);
  }
  return 0;
}

/* ---- the job's steps ------------------------------------------------------------------------- */
/* Output folder, file names, threads, and the checks that come before any work. */
static int run_open(run *r, const qt_options *o, qt_status *st) {
  r->o = o;
  r->ranks = qt_dist_size();
  r->writer = qt_dist_rank() == 0;
  r->verbose = r->writer && o->output.progress != QT_PROGRESS_NONE;
  r->quant = o->quant.mode != QT_QUANT_NONE;
  /* before any other collective: processes with other options would meet in different ones */
  if (qt_options_ranks_agree(o, st->msg)) return qt_status_fail(st, QT_STATUS_INPUT);
  if (r->ranks > 1 && qt_analysis_wanted(o))
    return qt_status_set(st, QT_STATUS_INPUT,
                         "the [analysis] keys (PTQ / QAT debugging) with %d processes: not done data-parallel yet; "
                         "run the analysis as one process (without mpirun)",
                         r->ranks);
  if (o->train.threads > 0) omp_set_num_threads(o->train.threads);
  snprintf(r->ckpt, sizeof r->ckpt, "%s/checkpoint.h5", o->output.dir);
  snprintf(r->csv, sizeof r->csv, "%s/metrics.csv", o->output.dir);
  snprintf(r->summary, sizeof r->summary, "%s/summary.json", o->output.dir);
  if (!r->writer) { /* whether process 0 resumes (it alone looks into output.dir) */
    qt_dist_broadcast(&r->resuming, sizeof r->resuming, 0);
    return 0;
  }
  char derr[QT_ERR_LEN];
  if (qt_mkdir_p(o->output.dir, derr)) return qt_status_set(st, QT_STATUS_IO, "output.dir: %s", derr);
  if (qt_dir_trusted(o->output.dir, derr)) return qt_status_set(st, QT_STATUS_INPUT, "output.dir: %s", derr);
  if (lock_dir(r, o->output.dir, st)) return -1;
  /* train.resume: a PTQ run has no epochs and simply calibrates again; any other run must
   * match the checkpoint's [quant] settings (checked before any work). */
  const int ptq = o->quant.mode == QT_QUANT_PTQ;
  r->resuming = o->train.resume && access(r->ckpt, F_OK) == 0 && !ptq;
  if (o->train.resume && ptq && r->verbose)
    fprintf(stderr, "train.resume: a PTQ run has no epochs to resume; calibrating again\n");
  if (r->resuming) {
    qt_checkpoint_meta meta;
    if (qt_checkpoint_read_meta(r->ckpt, &meta, st->msg)) return qt_status_fail(st, QT_STATUS_FORMAT);
    int bad = qt_options_resume_matches(o, meta.config_ini, r->ckpt, st->msg);
    free(meta.config_ini);
    if (bad) return qt_status_fail(st, QT_STATUS_INPUT);
  }
  if (r->ranks > 1) qt_dist_broadcast(&r->resuming, sizeof r->resuming, 0);
  const char *fp32 = o->quant.fp32_checkpoint, *base = strrchr(fp32, '/') ? strrchr(fp32, '/') + 1 : fp32;
  if (r->quant && fp32[0] && strcmp(base, "checkpoint.h5") == 0 && qt_file_in_dir(fp32, o->output.dir))
    return qt_status_set(st, QT_STATUS_INPUT,
                         "quant.fp32_checkpoint '%s' is this run's own checkpoint in output.dir '%s': the quantized "
                         "run would overwrite it; give the quantized run another output.dir",
                         fp32, o->output.dir);
  return 0;
}

/* The fp32 model: built, its fp32 checkpoint obtained (trained first if need be, before this
 * run's data is loaded), then the data, checked against the model. */
static int run_model_and_data(run *r, qt_status *st) {
  const qt_options *o = r->o;
  if (!(r->g = qt_stage_build_model(o, NULL, st))) return -1;
  if (r->quant && qt_stage_obtain_fp32(o, r->g, r->verbose, &r->fp32_origin, st)) return -1;
  share_model(r, r->g);
  if (qt_stage_load_data(&o->data, QT_SPLIT_BOTH, &r->train, &r->test, st) || data_agree(r, st) ||
      qt_stage_model_fits(o, r->g, &r->train, st) || qt_stage_model_fits(o, r->g, &r->test, st))
    return -1;
  write_dot(r, r->g, "model.dot");
  r->ctx = qt_ctx_create();
  r->tg = r->g;
  return 0;
}

/* PTQ / QAT before training: the fp32 accuracy, prepare, calibrate, PTQ debugging. */
static int run_prepare(run *r, qt_status *st) {
  const qt_options *o = r->o;
  const qt_loader_config ec = qt_stage_loader_config(o, QT_LOADER_EVAL);
  if (qt_evaluate_distributed(r->g, r->ctx, &r->test, &ec, &r->fp32, st->msg))
    return qt_status_fail(st, QT_STATUS_RUNTIME);
  if (r->verbose) fprintf(stderr, "quant: fp32 test accuracy %.2f%%\n", 100 * r->fp32.accuracy);
  char *rep_buf = NULL;
  size_t rep_len = 0;
  FILE *rep = r->writer ? open_memstream(&rep_buf, &rep_len) : NULL;
  r->tg = qt_stage_prepare(o, r->g, rep, &r->methods.cle, st);
  if (rep) write_stream(r, rep, &rep_buf, &rep_len, "quantizer.txt");
  if (!r->tg) return -1;
  if (r->verbose && o->quant.cle)
    fprintf(stderr, "quant: cross-layer equalization of %d layer pairs in %d passes\n", r->methods.cle.pairs,
            r->methods.cle.iterations);
  write_dot(r, r->tg, "model_prepared.dot");
  const int ptq = o->quant.mode == QT_QUANT_PTQ;
  if ((ptq || (!r->resuming && o->quant.qat_init == QT_QAT_INIT_CALIBRATION)) &&
      qt_stage_calibrate(o, r->tg, &r->train, r->ctx, NULL, r->verbose, st))
    return -1;
  float *reference = NULL;
  if (ptq && (qt_stage_adaround(o, r->tg, &r->train, r->ctx, &r->methods.adaround, &reference, r->verbose, st) ||
              qt_stage_bias_correct(o, r->g, r->tg, &r->train, r->ctx, reference, &r->methods.bias_correction,
                                    r->verbose, st))) {
    free(reference);
    return -1;
  }
  free(reference);
  if (!ptq || !qt_analysis_wanted(o)) return 0;
  const qt_loader_config lc = qt_stage_loader_config(o, QT_LOADER_CALIBRATE);
  const int methods = o->quant.cle || o->quant.adaround || o->quant.bias_correction != QT_BIAS_CORRECTION_NONE;
  if (qt_analysis_run(o, r->g, methods ? r->tg : NULL, &r->train, &r->test, &lc, &ec, r->ctx, o->output.dir,
                      r->analysis, sizeof r->analysis, r->verbose, st->msg))
    return qt_status_fail(st, QT_STATUS_RUNTIME);
  return 0;
}

/* The trainer, and on resume the checkpoint's state and the earlier epochs' rows. */
static int run_trainer(run *r, qt_status *st) {
  const qt_options *o = r->o;
  const int epochs = o->quant.mode == QT_QUANT_PTQ ? 0 : o->train.epochs;
  if (!(r->trainer = qt_trainer_create(o, r->tg, &r->train, st))) return -1;
  r->rows = calloc((size_t)epochs + 1, sizeof *r->rows);
  QT_ASSERT(r->rows, "out of memory");
  if (r->resuming) {
    /* process 0 reads it, every process loads it (the process count may differ from the run that
     * wrote it) */
    qt_checkpoint_meta meta;
    if (qt_checkpoint_load_shared(r->ckpt, r->tg, qt_trainer_optim(r->trainer), &meta, st->msg))
      return qt_status_fail(st, QT_STATUS_FORMAT);
    free(meta.config_ini);
    if (meta.epoch < 0 || meta.step < 0)
      return qt_status_set(st, QT_STATUS_FORMAT, "train.resume: checkpoint '%s' holds epoch %d, step %lld", r->ckpt,
                           meta.epoch, (long long)meta.step);
    if (meta.epoch > epochs)
      return qt_status_set(st, QT_STATUS_INPUT,
                           "train.resume: checkpoint '%s' holds %d epochs, more than train.epochs = %d: raise "
                           "train.epochs to go on, or give the new run another output.dir",
                           r->ckpt, meta.epoch, epochs);
    r->start_epoch = meta.epoch;
    qt_trainer_set_step(r->trainer, meta.step);
    if (!r->writer) return 0;
    if (meta.seed != (uint64_t)o->train.seed)
      fprintf(stderr, "warning: resuming %s trained with seed %llu under train.seed = %d\n", r->ckpt,
              (unsigned long long)meta.seed, o->train.seed);
    /* at most one row per finished epoch, whatever metrics.csv holds (a repeated row must not
     * leave rows[] too small for the epochs still to run) */
    r->n_rows = csv_read(r->csv, r->rows, r->start_epoch < epochs ? r->start_epoch : epochs, r->start_epoch);
    fprintf(stderr, "resuming from %s: %d epoch(s) done, step %lld\n", r->ckpt, r->start_epoch, (long long)meta.step);
  }
  if (r->verbose && r->ranks == 1)
    fprintf(stderr, "%s: %lld parameters; %lld training / %lld test images; %d epochs of %lld batches; %d threads\n",
            r->g->name, (long long)qt_graph_param_count(r->g), (long long)r->train.n, (long long)r->test.n, epochs,
            (long long)qt_trainer_batches(r->trainer), omp_get_max_threads());
  else if (r->verbose)
    fprintf(stderr,
            "%s: %lld parameters; %lld training / %lld test images; %d epochs of %lld batches; %d processes x %d "
            "threads (data parallel)\n",
            r->g->name, (long long)qt_graph_param_count(r->g), (long long)r->train.n, (long long)r->test.n, epochs,
            (long long)qt_trainer_batches(r->trainer), r->ranks, omp_get_max_threads());
  return 0;
}

/* Epochs: train, evaluate, metrics.csv (then the checkpoint), until train.epochs or
 * train.stop_after_epochs. */
static int run_epochs(run *r, qt_status *st) {
  const qt_options *o = r->o;
  const int epochs = o->quant.mode == QT_QUANT_PTQ ? 0 : o->train.epochs, stop = o->train.stop_after_epochs;
  const qt_loader_config ec = qt_stage_loader_config(o, QT_LOADER_EVAL);
  char *ini = qt_options_to_ini(o);
  int rc = 0, ran = 0;
  if (r->start_epoch < epochs) qt_dist_watchdog_start(o->dist.timeout); /* with processes only */
  for (int epoch = r->start_epoch; epoch < epochs && !rc; epoch++, ran++) {
    if (stop > 0 && ran >= stop) {
      if (r->verbose) fprintf(stderr, "stopping after %d epoch(s) as train.stop_after_epochs says\n", ran);
      break;
    }
    qt_epoch_stats *e = &r->rows[r->n_rows];
    if (qt_trainer_epoch(r->trainer, r->ctx, epoch, e, st))
      rc = -1;
    else if (qt_evaluate_distributed(r->tg, r->ctx, &r->test, &ec, &r->final, st->msg))
      rc = qt_status_fail(st, QT_STATUS_RUNTIME);
    if (rc) break;
    qt_dist_watchdog_beat();
    e->test_loss = r->final.loss;
    e->test_acc = r->final.accuracy;
    r->n_rows++;
    if (!r->writer) continue;
    if (r->verbose)
      fprintf(stderr,
              "epoch %d/%d  train loss %.4f acc %.2f%%  test loss %.4f acc %.2f%%  %.0f img/s  %.1f s  lr %.4g\n",
              e->epoch, epochs, e->train_loss, 100 * e->train_acc, e->test_loss, 100 * e->test_acc, e->images_per_s,
              e->seconds, e->lr);
    /* metrics.csv first: a kill between the two writes leaves a row for an epoch whose
     * checkpoint is missing, which a resume drops and writes again, never a checkpoint whose
     * row is lost */
    csv_write(r);
    qt_fault_point("between_metrics_and_checkpoint");
    qt_checkpoint_meta meta = {epoch + 1, qt_trainer_step(r->trainer), (uint64_t)o->train.seed, ini};
    if (qt_checkpoint_save(r->ckpt, r->tg, qt_trainer_optim(r->trainer), &meta, st->msg))
      rc = qt_status_fail(st, QT_STATUS_IO);
    qt_dist_watchdog_beat();
  }
  qt_dist_watchdog_stop();
  free(ini);
  if (!rc && !r->quant && (ran == 0 || r->final.n == 0) &&
      qt_evaluate_distributed(r->g, r->ctx, &r->test, &ec, &r->final, st->msg))
    rc = qt_status_fail(st, QT_STATUS_RUNTIME);
  if (!r->quant) r->fp32 = r->final;
  r->arena_mb = (double)qt_ctx_peak_bytes(r->ctx) / 1048576.0;
  return rc;
}

/* After training: QAT debugging, convert + check, deploy (process 0 alone: every process holds
 * the same trained graph). */
static int run_finish_quant(run *r, qt_status *st) {
  const qt_options *o = r->o;
  if (!r->writer) return 0;
  if (o->quant.mode == QT_QUANT_QAT && qt_analysis_wanted(o)) {
    const qt_loader_config ec = qt_stage_loader_config(o, QT_LOADER_EVAL);
    if (qt_analysis_run_qat(o, r->tg, &r->test, &ec, r->ctx, o->output.dir, r->analysis, sizeof r->analysis, r->verbose,
                            st->msg))
      return qt_status_fail(st, QT_STATUS_RUNTIME);
  }
  qt_ctx_release(r->ctx); /* the training step's memory is not needed by convert and the check */
  /* nor the training set and the optimizer's state: convert, the check and deploy read the test
   * set, so the peak of those stages does not hold the training images */
  qt_trainer_free(r->trainer);
  r->trainer = NULL;
  qt_dataset_free(&r->train);
  if (qt_stage_convert(o, r->tg, &r->test, r->ctx, o->output.dir, &r->q, r->verbose, st)) return -1;
  qt_ctx_release(r->ctx);
  return qt_stage_deploy(o, r->g, &r->test, o->output.dir, &r->q, r->verbose, st);
}

static void run_close(run *r) {
  if (r->lock_fd >= 0) close(r->lock_fd);
  free(r->rows);
  qt_ctx_free(r->ctx);
  qt_trainer_free(r->trainer);
  if (r->tg != r->g) qt_graph_free(r->tg);
  qt_graph_free(r->g);
  qt_dataset_free(&r->train);
  qt_dataset_free(&r->test);
}

static void print_result(const run *r) {
  if (!r->verbose) return;
  if (!r->quant)
    fprintf(stderr, "fp32 test accuracy %.2f%%; summary in %s; peak RSS %.0f MB\n", 100 * r->final.accuracy, r->summary,
            qt_peak_rss_mb());
  else
    fprintf(stderr,
            "test accuracy: fp32 %.2f%%, fake quant %.2f%%, Q/DQ graph %.2f%%, int8 device %.2f%%; summary in %s; "
            "peak RSS %.0f MB\n",
            100 * r->fp32.accuracy, 100 * r->q.fake_quant.accuracy, 100 * r->q.qdq.accuracy,
            100 * r->q.report.device_accuracy, r->summary, qt_peak_rss_mb());
}

int qt_train_run(const qt_options *o, qt_status *st) {
  run *r = calloc(1, sizeof *r);
  QT_ASSERT(r, "out of memory");
  r->lock_fd = -1;
  st->code = QT_OK;
  st->msg[0] = 0;
  int rc = run_open(r, o, st) || run_model_and_data(r, st) || (r->quant && run_prepare(r, st)) || run_trainer(r, st) ||
           run_epochs(r, st) || (r->quant && run_finish_quant(r, st));
  if (!rc && r->writer && write_summary(r, st->msg)) rc = qt_status_fail(st, QT_STATUS_IO);
  if (!rc) print_result(r);
  if (!rc && r->writer && r->quant && !r->q.check.ok)
    rc = qt_status_set(st, QT_STATUS_RUNTIME,
                       "the training graph and the convert graph disagree (see summary.json check.reason):\n%s",
                       r->q.check.reason);
  run_close(r);
  free(r);
  return rc ? -1 : 0;
}

/* ---- the fp32 model a quantized run starts from ------------------------------------------------
 * Here, beside qt_train_run, because training a missing fp32 model is a run of its own. */

/* What to do with the fp32 checkpoint ck before quantizing: 0 use it as it is, 1 train it with
 * the recipe (it does not exist, or quant.fp32_reuse = retrain and its stored config is not the
 * recipe), -1 stop (st set). Decided by process 0 (under mpirun), which reads the file. */
static int fp32_decision(const qt_options *o, const char *ck, const qt_options *recipe, int exists, int verbose,
                         const char **how, qt_status *st) {
  if (!exists) return 1;
  qt_checkpoint_meta meta;
  if (qt_checkpoint_read_meta(ck, &meta, st->msg)) return qt_status_fail(st, QT_STATUS_IO);
  char what[2 * QT_OPT_STR + 128];
  const int same = qt_options_fp32_matches(recipe, meta.config_ini, what, sizeof what);
  free(meta.config_ini);
  if (same == 0) return 0;
  switch (o->quant.fp32_reuse) {
    case QT_FP32_REUSE_ANY:
      *how = "reused with quant.fp32_reuse = any";
      fprintf(stderr,
              "warning: fp32 checkpoint '%s' is not what quant.fp32_config '%s' trains (%s); using it "
              "anyway (quant.fp32_reuse = any)\n",
              ck, o->quant.fp32_config, what);
      return 0;
    case QT_FP32_REUSE_RETRAIN:
      if (verbose)
        fprintf(stderr, "quant: %s is not what %s trains (%s): training it again (quant.fp32_reuse = retrain)\n", ck,
                o->quant.fp32_config, what);
      return 1;
    default:
      return qt_status_set(st, QT_STATUS_INPUT,
                           "fp32 checkpoint '%s' was not trained by quant.fp32_config '%s' with this run's [data] "
                           "(%s): set quant.fp32_reuse = retrain to train it again, or = any to quantize it anyway",
                           ck, o->quant.fp32_config, what);
  }
}

/* The fp32 checkpoint (origin->checkpoint, see qt_options_fp32_recipe): kept when its stored
 * config is quant.fp32_config's recipe (or there is no fp32_config to compare with), else
 * decided by quant.fp32_reuse; trained with the recipe when it does not exist yet (under
 * mpirun all processes train it together). */
static int ensure_fp32(const qt_options *o, int verbose, qt_fp32_origin *origin, qt_status *st) {
  char *ck = origin->checkpoint;
  const size_t ck_n = sizeof origin->checkpoint;
  snprintf(ck, ck_n, "%s", o->quant.fp32_checkpoint);
  qt_options *sub = malloc(sizeof *sub);
  QT_ASSERT(sub, "out of memory");
  char why[QT_ERR_LEN];
  int rc = o->quant.fp32_config[0] ? qt_options_fp32_recipe(o, sub, ck, ck_n, why, sizeof why, st->msg) : 1;
  if (rc == 0 && why[0] && qt_dist_rank() == 0) /* said even without progress: it decides where files go */
    fprintf(stderr,
            "note: this run's [data] is not quant.fp32_config's (%s): its fp32 model is %s, not the shared %s\n", why,
            ck, o->quant.fp32_checkpoint);
  int exists = qt_dist_rank() == 0 && access(ck, F_OK) == 0;
  qt_dist_broadcast(&exists, sizeof exists, 0);
  origin->how = "reused, not compared";
  if (rc && exists) { /* nothing to compare with: an existing checkpoint is used */
    if (o->quant.fp32_config[0])
      fprintf(stderr, "warning: fp32 checkpoint '%s' cannot be compared with quant.fp32_config: %s\n", ck, st->msg);
    st->msg[0] = 0;
    free(sub);
    return 0;
  }
  if (rc) {
    if (!o->quant.fp32_config[0])
      qt_status_set(st, QT_STATUS_INPUT,
                    "quant.fp32_checkpoint '%s' does not exist (set quant.fp32_config to train it first)", ck);
    free(sub);
    return qt_status_fail(st, QT_STATUS_INPUT);
  }
  origin->how = "reused";
  int decision = qt_dist_rank() == 0 ? fp32_decision(o, ck, sub, exists, verbose, &origin->how, st) : 0;
  qt_dist_broadcast(&decision, sizeof decision, 0);
  if (decision < 0) {
    if (qt_dist_rank() != 0) qt_status_set(st, QT_STATUS_INPUT, "fp32 checkpoint '%s': refused by process 0", ck);
    rc = -1;
  } else if (decision == 1) {
    origin->how = "trained";
    if (verbose && !exists)
      fprintf(stderr, "quant: %s does not exist yet: training it with %s first\n", ck, o->quant.fp32_config);
    rc = qt_train_run(sub, st);
  }
  free(sub);
  return rc;
}

int qt_stage_obtain_fp32(const qt_options *o, qt_graph *g, int verbose, qt_fp32_origin *origin, qt_status *st) {
  qt_fp32_origin local;
  if (!origin) origin = &local;
  memset(origin, 0, sizeof *origin);
  origin->how = "initialization";
  if (!o->quant.fp32_checkpoint[0]) {
    if (verbose) fprintf(stderr, "quant: no quant.fp32_checkpoint: quantizing from the initialization\n");
    return 0;
  }
  if (ensure_fp32(o, verbose, origin, st)) return -1;
  const char *ck = origin->checkpoint;
  qt_checkpoint_meta meta;
  if (qt_checkpoint_load_shared(ck, g, NULL, &meta, st->msg)) return qt_status_fail(st, QT_STATUS_IO);
  origin->from_checkpoint = 1;
  origin->epochs = meta.epoch;
  origin->train_limit = -1;
  qt_options *stored = calloc(1, sizeof *stored);
  QT_ASSERT(stored, "out of memory");
  char err[QT_ERR_LEN];
  if (qt_options_stored(meta.config_ini, stored, err) == 0) {
    origin->train_limit = stored->data.train_limit;
    snprintf(origin->train_images, sizeof origin->train_images, "%s",
             stored->data.train_images[0] ? stored->data.train_images : stored->data.train_path);
  }
  free(stored);
  free(meta.config_ini);
  if (verbose) fprintf(stderr, "quant: starting from %s (%d fp32 epochs)\n", ck, meta.epoch);
  return 0;
}

int qt_stage_ptq_to_file(const qt_options *o, const char *out_path, FILE *report, qt_status *st) {
  int rc = -1;
  qt_dataset train = {0}, test = {0};
  qt_graph *g = NULL, *p = NULL, *c = NULL;
  qt_ctx *ctx = NULL;
  float *reference = NULL;
  if (!o->quant.fp32_checkpoint[0]) {
    qt_status_set(st, QT_STATUS_INPUT, "the config sets no quant.fp32_checkpoint (the fp32 model to quantize)");
    goto done;
  }
  if (!(g = qt_stage_build_model(o, NULL, st)) || qt_stage_obtain_fp32(o, g, 0, NULL, st) ||
      !(p = qt_stage_prepare(o, g, report, NULL, st)) ||
      qt_stage_load_data(&o->data, QT_SPLIT_TRAIN, &train, &test, st) || qt_stage_model_fits(o, g, &train, st))
    goto done;
  ctx = qt_ctx_create();
  int batches = 0;
  qt_bias_correction_result bc;
  qt_adaround_result *ar = malloc(sizeof *ar);
  QT_ASSERT(ar, "out of memory");
  if (qt_stage_calibrate(o, p, &train, ctx, &batches, 0, st) ||
      qt_stage_adaround(o, p, &train, ctx, ar, &reference, 0, st) ||
      qt_stage_bias_correct(o, g, p, &train, ctx, reference, &bc, 0, st)) {
    free(ar);
    goto done;
  }
  free(ar);
  qt_graph_set_mode(p, QT_MODE_EVAL);
  if (!(c = qt_convert(p, st->msg))) {
    qt_status_fail(st, QT_STATUS_RUNTIME);
    goto done;
  }
  if (qt_mkdir_parent(out_path, st->msg) || qt_qdq_save(out_path, c, st->msg)) {
    qt_status_fail(st, QT_STATUS_IO);
    goto done;
  }
  if (report) fprintf(report, "calibrated on %d batches; wrote %s\n", batches, out_path);
  rc = 0;
done:
  free(reference);
  qt_ctx_free(ctx);
  qt_dataset_free(&train);
  qt_dataset_free(&test);
  qt_graph_free(c);
  qt_graph_free(p);
  qt_graph_free(g);
  return rc;
}
