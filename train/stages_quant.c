/* The quantization stages: prepare (Quantizer + PTQ/QAT prepare), calibrate, and after training
 * convert, save, reload, evaluate and check; then deploy the saved Q/DQ graph and make the
 * three-stage report (eval/report.h). */
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "onnx/onnx_export.h"
#include "dist/dist.h"
#include "train/pipeline.h"

static int quantizer_config(const qt_quant_options *q, qt_quantizer_config *qc, char *err) {
  qt_quantizer_config_default(qc);
  qc->weight_bits = q->weight_bits;
  qc->activation_bits = q->activation_bits;
  qc->weight_observer = qt_options_weight_observer(q);
  qc->activation_observer = q->activation_observer;
  qc->activation_method = q->activation_range;
  qc->percentile = (float)q->percentile;
  qc->learnable_scale = q->learnable_scale;
  qc->learnable_weights = q->learnable_weight_scale == QT_LSQW_TRUE    ? QT_LSQ_WEIGHTS_ALL
                          : q->learnable_weight_scale == QT_LSQW_FALSE ? QT_LSQ_WEIGHTS_NONE
                                                                       : QT_LSQ_WEIGHTS_BELOW_8;
  qc->fuse_add = q->fuse_add;
  qc->fuse_gate = q->fuse_gate;
  qc->fp32_output = q->fp32_output;
  qc->bias = q->bias == QT_QUANT_BIAS_INT32   ? QT_BIAS_INT32
             : q->bias == QT_QUANT_BIAS_FLOAT ? QT_BIAS_FLOAT
                                              : QT_BIAS_AUTO;
  return qt_parse_overrides(qc, q->layer_overrides, err);
}

/* The backend the quant.* settings name, for the Quantizer and the deployment alike:
 * quant.backend = xnnpack (or onednn) names a built-in backend whatever quant.quantizer says;
 * quant.quantizer = backend takes quant.backend as a name or a description file; otherwise
 * oneDNN with quant.isa. origin: "built in" or the file. */
int qt_stage_backend_desc(const qt_quant_options *q, qt_backend_desc *d, const char **origin, char *err) {
  const qt_isa_choice isa = q->isa == QT_QUANT_ISA_VNNI      ? QT_ISA_VNNI
                            : q->isa == QT_QUANT_ISA_NO_VNNI ? QT_ISA_NO_VNNI
                                                             : QT_ISA_AUTO;
  const int builtin =
      strcmp(q->backend, "xnnpack") == 0 || strcmp(q->backend, "onednn") == 0 || strcmp(q->backend, "onednn_cpu") == 0;
  if (origin) *origin = builtin || q->quantizer != QT_QUANTIZER_BACKEND ? "built in" : q->backend;
  if (builtin || q->quantizer == QT_QUANTIZER_BACKEND) {
    char why[QT_ERR_LEN]; /* not err: qt_err would format err into itself */
    if (qt_backend_desc_named(d, q->backend, isa, why)) return qt_err(err, "quant.backend = %s: %s", q->backend, why);
    return 0;
  }
  qt_backend_desc_onednn_cpu(d, isa);
  return 0;
}

/* quant.cle: the prepared graph equalized, the pairs written to report. */
static int equalize(const qt_quant_options *q, qt_graph *p, FILE *report, qt_cle_result *res, char *err) {
  memset(res, 0, sizeof *res);
  if (!q->cle) return 0;
  if (qt_cross_layer_equalize(p, q->cle_relu6 == QT_CLE_RELU6_RELU, res, err)) return -1;
  if (report) {
    fprintf(report,
            "cross-layer equalization: %d layer pairs, %d passes (last change %.2g), %d relu6 made relu:", res->pairs,
            res->iterations, res->last_change, res->relu6_replaced);
    for (int k = 0; k < res->pairs && k < QT_CLE_MAX_LISTED; k++) fprintf(report, " %s->%s", res->a[k], res->b[k]);
    fprintf(report, "\n");
  }
  return 0;
}

qt_graph *qt_stage_prepare(const qt_options *o, const qt_graph *g, FILE *report, qt_cle_result *cle, qt_status *st) {
  const qt_quant_options *q = &o->quant;
  qt_quantizer_config qc;
  if (quantizer_config(q, &qc, st->msg)) {
    qt_status_fail(st, QT_STATUS_INPUT);
    return NULL;
  }
  /* the Quantizer is a function of the backend's description: oneDNN's (its ISA read by the
   * backend or forced by quant.isa) or one from a file */
  qt_annotations ann;
  qt_backend_desc d;
  const char *path;
  char why[QT_ERR_LEN];
  if (qt_stage_backend_desc(q, &d, &path, why)) {
    qt_status_set(st, QT_STATUS_INPUT, "%s", why);
    return NULL;
  }
  if (qt_quantizer(g, &d, &qc, &ann, st->msg)) {
    qt_status_fail(st, QT_STATUS_INPUT);
    return NULL;
  }
  if (report) {
    fprintf(report, "quantizer from backend %s (%s; %s) (W%d A%d%s):\n", d.name, d.isa, path, qc.weight_bits,
            qc.activation_bits, d.weight_8bit_as_7bit ? ", 8-bit weights restricted to 7 bits" : "");
    qt_annotations_print(g, &ann, report);
  }
  qt_graph *p = qt_prepare(g, &ann, q->mode == QT_QUANT_QAT ? QT_PREPARE_QAT : QT_PREPARE_PTQ, st->msg);
  qt_annotations_free(&ann);
  qt_cle_result local;
  if (p && equalize(q, p, report, cle ? cle : &local, st->msg)) {
    qt_graph_free(p);
    p = NULL;
  }
  if (!p) qt_status_fail(st, QT_STATUS_INPUT);
  return p;
}

int qt_calibrate_until(qt_graph *p, qt_loader *l, const qt_dataset *train, qt_ctx *ctx, int until, int *done,
                       char *err) {
  qt_graph_set_mode(p, QT_MODE_CALIBRATE);
  qt_ctx_set_grad(ctx, 0);
  const float *images;
  const int32_t *labels;
  int B, rc = 0;
  while (*done < until && (B = qt_loader_next(l, &images, &labels)) > 0) {
    qt_ctx_reset(ctx);
    int64_t shape[4] = {B, train->h, train->w, train->c};
    if (!qt_graph_forward(p, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, (void *)images))) {
      rc = qt_err(err, "calibration batch %d: %s", *done + 1, p->error);
      break;
    }
    (*done)++;
  }
  qt_ctx_reset(ctx);
  qt_ctx_set_grad(ctx, 1);
  qt_set_observers(p, 0); /* the calibrated qparams stay fixed */
  qt_graph_set_mode(p, QT_MODE_TRAIN);
  return rc;
}

int qt_stage_calibrate(const qt_options *o, qt_graph *p, const qt_dataset *train, qt_ctx *ctx, int *batches,
                       int verbose, qt_status *st) {
  qt_loader_config lc = qt_stage_loader_config(o, QT_LOADER_CALIBRATE);
  qt_loader *l = qt_loader_create(train, &lc, st->msg);
  if (!l) return qt_status_fail(st, QT_STATUS_INPUT);
  qt_loader_start_epoch(l, 0);
  int done = 0;
  const qt_batch_sync *was = qt_ctx_batch_sync(ctx);
  if (qt_dist_size() > 1) qt_ctx_set_batch_sync(ctx, qt_dist_batch_sync()); /* observers see every shard */
  int rc = qt_calibrate_until(p, l, train, ctx, o->quant.calibration_batches, &done, st->msg);
  qt_ctx_set_batch_sync(ctx, was);
  qt_loader_free(l);
  if (rc) return qt_status_fail(st, QT_STATUS_RUNTIME);
  if (verbose) fprintf(stderr, "quant: calibrated on %d batches\n", done);
  if (batches) *batches = done;
  return 0;
}

int qt_stage_adaround(const qt_options *o, qt_graph *p, const qt_dataset *train, qt_ctx *ctx, qt_adaround_result *res,
                      float **reference, int verbose, qt_status *st) {
  memset(res, 0, sizeof *res);
  *reference = NULL;
  if (!o->quant.adaround) return 0;
  const float *images;
  int got;
  qt_loader *l = qt_stage_first_images(o, train, o->quant.adaround_images, &images, &got, st);
  if (!l) return -1;
  qt_adaround_config c;
  qt_adaround_config_default(&c);
  c.iterations = o->quant.adaround_iterations;
  c.batch = o->quant.adaround_batch;
  c.lambda = (float)o->quant.adaround_lambda;
  c.lr = (float)o->quant.adaround_lr;
  c.unit = o->quant.adaround_unit == QT_ADAROUND_UNIT_BLOCK ? QT_RECON_BLOCK : QT_RECON_LAYER;
  c.drop = (float)o->quant.adaround_qdrop;
  c.seed = (uint64_t)o->train.seed;
  float *ref = malloc((size_t)p->n_params * sizeof(float));
  QT_ASSERT(ref, "out of memory");
  memcpy(ref, p->params, (size_t)p->n_params * sizeof(float));
  const char *per = c.unit == QT_RECON_BLOCK ? "block" : "layer";
  if (verbose)
    fprintf(stderr, "quant: adaround on %d images, %d steps of %d per %s\n", got, c.iterations, c.batch, per);
  const int rc = qt_adaround(p, ctx, ref, images, got, &c, res, verbose ? stderr : NULL, st->msg);
  qt_loader_free(l);
  if (rc) {
    free(ref);
    return qt_status_fail(st, QT_STATUS_RUNTIME);
  }
  if (verbose)
    fprintf(stderr, "quant: adaround of %d layers (%d %ss) in %.1f s\n", res->layers, res->units, per, res->seconds);
  *reference = ref;
  return 0;
}

int qt_stage_bias_correct(const qt_options *o, const qt_graph *fp32, qt_graph *p, const qt_dataset *train, qt_ctx *ctx,
                          const float *reference, qt_bias_correction_result *res, int verbose, qt_status *st) {
  memset(res, 0, sizeof *res);
  if (o->quant.bias_correction == QT_BIAS_CORRECTION_NONE) return 0;
  if (o->quant.bias_correction == QT_BIAS_CORRECTION_ANALYTICAL) {
    if (qt_bias_correct_analytical(fp32, p, reference, res, st->msg)) return qt_status_fail(st, QT_STATUS_RUNTIME);
    if (verbose)
      fprintf(stderr,
              "quant: analytical bias correction of %d layers (%d without a batch norm describing their input): "
              "largest expected output shift %.3g removed\n",
              res->layers, res->skipped, res->before);
    return 0;
  }
  const float *images;
  int got;
  qt_loader *l = qt_stage_first_images(o, train, o->quant.bias_correction_images, &images, &got, st);
  if (!l) return -1;
  const double t0 = qt_now_seconds();
  const int rc = qt_bias_correct(p, ctx, reference, images, got, o->train.batch_size, res, st->msg);
  qt_loader_free(l);
  if (rc) return qt_status_fail(st, QT_STATUS_RUNTIME);
  if (verbose)
    fprintf(stderr,
            "quant: bias correction of %d layers on %d images in %.1f s: largest mean output error %.3g -> %.3g\n",
            res->layers, got, qt_now_seconds() - t0, res->before, res->after);
  return 0;
}

/* The check on the first quant.check_batch test images; the evaluation arena is handed back
 * first (the check runs both graphs in arenas of its own). */
static int run_check(const qt_options *o, qt_graph *p, qt_graph *loaded, const qt_dataset *test, qt_ctx *ctx,
                     qt_check_report *check, qt_status *st) {
  qt_ctx_release(ctx);
  const float *images;
  int n;
  qt_loader *l = qt_stage_first_images(o, test, o->quant.check_batch, &images, &n, st);
  if (!l) return -1;
  int rc = qt_check(p, loaded, images, n, check, st->msg);
  qt_loader_free(l);
  return rc ? qt_status_fail(st, QT_STATUS_RUNTIME) : 0;
}

int qt_stage_convert(const qt_options *o, qt_graph *p, const qt_dataset *test, qt_ctx *ctx, const char *dir,
                     qt_quant_result *res, int verbose, qt_status *st) {
  memset(res, 0, sizeof *res);
  const qt_loader_config ec = qt_stage_loader_config(o, QT_LOADER_EVAL);
  qt_graph_sync_learned_scales(p);
  if (qt_evaluate(p, ctx, test, &ec, &res->fake_quant, st->msg)) return qt_status_fail(st, QT_STATUS_RUNTIME);
  qt_graph *c = qt_convert(p, st->msg);
  if (!c) return qt_status_fail(st, QT_STATUS_RUNTIME);
  res->lost_channels = qt_lost_weight_channels(c, res->lost_detail, sizeof res->lost_detail);
  /* The eval-mode training graph too, so qat_check can compare the two files later. */
  snprintf(res->trained_path, sizeof res->trained_path, "%s/model_trained.h5", dir);
  snprintf(res->qdq_path, sizeof res->qdq_path, "%s/model_qdq.h5", dir);
  qt_graph_set_mode(p, QT_MODE_EVAL);
  int rc = qt_qdq_save(res->trained_path, p, st->msg) || qt_qdq_save(res->qdq_path, c, st->msg);
  qt_graph_free(c);
  if (rc) return qt_status_fail(st, QT_STATUS_IO);
  /* Everything downstream uses the file, as a deployment tool would. */
  qt_graph *loaded = qt_qdq_load(res->qdq_path, st->msg);
  if (!loaded) return qt_status_fail(st, QT_STATUS_FORMAT);
  snprintf(res->onnx_path, sizeof res->onnx_path, "%s/model_qdq.onnx", dir);
  qt_onnx_export_info info;
  if (qt_onnx_export_qdq(loaded, res->onnx_path, &info, res->onnx_error)) {
    if (info.io_error) { /* the environment (a full disk): the run fails, as for the other files */
      snprintf(st->msg, sizeof st->msg, "%s", res->onnx_error);
      qt_graph_free(loaded);
      return qt_status_fail(st, QT_STATUS_IO);
    }
    /* a graph ONNX cannot express (docs/onnx_export.md): the run's other results stand */
    fprintf(stderr, "qat_train: warning: no model_qdq.onnx: %s\n", res->onnx_error);
    res->onnx_path[0] = 0;
  }
  rc = qt_evaluate(loaded, ctx, test, &ec, &res->qdq, st->msg);
  if (rc) qt_status_fail(st, QT_STATUS_RUNTIME);
  qt_graph_set_mode(loaded, QT_MODE_EVAL);
  if (!rc) rc = run_check(o, p, loaded, test, ctx, &res->check, st);
  qt_graph_free(loaded);
  if (rc) return -1;
  if (verbose) {
    fprintf(stderr, "quant: fake-quant %.2f%%, Q/DQ graph %.2f%% (%s; as QDQ ONNX: %s)\n",
            100 * res->fake_quant.accuracy, 100 * res->qdq.accuracy, res->qdq_path,
            res->onnx_path[0] ? res->onnx_path : "not written");
    fprintf(stderr,
            "check (training graph = convert graph): %s; %d quantization points, %d weights, max %.1f LSB, "
            "%lld tie flips\n%s",
            res->check.ok ? "PASS" : "FAIL", res->check.n_checked_points, res->check.n_checked_weights,
            res->check.max_lsb, (long long)res->check.tie_mismatches, res->check.reason);
  }
  if (res->lost_channels) /* printed whatever verbose says: the model lost these channels */
    fprintf(stderr,
            "quant: warning: %d weight channel(s) lost in quantization (SQNR <= %.0f dB: the integers keep little of "
            "the channel; a learned scale far from the channel's range does this):\n%s",
            res->lost_channels, QT_LOST_CHANNEL_DB, res->lost_detail);
  return 0;
}

/* Inference timing: batch 256 (the deployment target), best of 3 rounds of 8 batches. The
 * device is read inside the graph on the first 1024 test images. */
enum { QT_INFER_BATCH = 256, QT_INFER_BATCHES = 8, QT_INFER_ROUNDS = 3, QT_PROBE_IMAGES = 1024 };

static void print_deploy(FILE *f, const qt_device *m, const qt_quant_result *res) {
  qt_device_report(m, f);
  qt_report_print(&res->report, f);
  if (res->speed.batch == 0) {
    fprintf(f, "inference not timed (output.timing = false)\n");
    return;
  }
  fprintf(f,
          "inference at batch %d (best of %d rounds of %lld images): fp32 %.0f images/s, int8 %.0f images/s (%.2fx)\n",
          res->speed.batch, QT_INFER_ROUNDS, (long long)res->speed.images, res->speed.fp32_images_per_s,
          res->speed.int8_images_per_s,
          res->speed.fp32_images_per_s > 0 ? res->speed.int8_images_per_s / res->speed.fp32_images_per_s : 0.0);
}

int qt_stage_deploy(const qt_options *o, qt_graph *fp32, const qt_dataset *test, const char *dir, qt_quant_result *res,
                    int verbose, qt_status *st) {
  const qt_loader_config ec = qt_stage_loader_config(o, QT_LOADER_EVAL);
  /* From the file, as a deployment tool would. */
  qt_graph *qdq = qt_qdq_load(res->qdq_path, st->msg);
  if (!qdq) return qt_status_fail(st, QT_STATUS_FORMAT);
  /* on the backend it was quantized for */
  qt_backend_desc d;
  qt_device *m = NULL;
  int rc = -1;
  if (qt_stage_backend_desc(&o->quant, &d, NULL, st->msg) == 0) m = qt_device_open(qdq, &d, st->msg);
  memset(&res->speed, 0, sizeof res->speed); /* batch 0: not timed (output.timing = false) */
  if (!m || qt_report_run(fp32, qdq, m, test, &ec, QT_PROBE_IMAGES, &res->report, st->msg) ||
      (o->output.timing && qt_inference_measure(fp32, m, test, &ec, QT_INFER_BATCH, QT_INFER_BATCHES, QT_INFER_ROUNDS,
                                                &res->speed, st->msg))) {
    qt_status_fail(st, QT_STATUS_RUNTIME);
    goto out;
  }
  snprintf(res->report_path, sizeof res->report_path, "%s/report.txt", dir);
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  QT_ASSERT(f, "out of memory for the report");
  print_deploy(f, m, res);
  fclose(f);
  rc = qt_write_file_atomic(res->report_path, text, len, st->msg);
  free(text);
  if (rc) {
    qt_status_fail(st, QT_STATUS_IO);
    goto out;
  }
  res->deployed = 1;
  if (verbose) print_deploy(stderr, m, res);
out:
  qt_device_free(m);
  qt_graph_free(qdq);
  if (fp32) qt_graph_set_mode(fp32, QT_MODE_TRAIN); /* as qt_evaluate used to leave graphs */
  return rc;
}

int qt_stage_compare_device(const char *config_path, int images, int batch, qt_device *dev, qt_graph *qdq,
                            const char *prefix, qt_status *st) {
  static qt_options o;
  qt_dataset test = {0};
  qt_device_agreement a;
  qt_loader_config lc;
  int rc = -1;
  if (!qt_stage_test_data(config_path, images, batch, &o, &test, &lc, st)) {
    if (qt_device_compare(dev, qdq, &test, &lc, &a, st->msg))
      qt_status_fail(st, QT_STATUS_RUNTIME);
    else
      rc = !qt_device_agreement_print(&a, prefix, stdout);
  }
  qt_dataset_free(&test);
  return rc;
}
