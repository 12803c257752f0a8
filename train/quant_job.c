/* The quantization half of the training job: obtain the fp32 model, prepare (PTQ/QAT),
 * calibrate, and after training convert, save, reload, evaluate and check; then lower the
 * saved Q/DQ graph and make the three-stage report (eval/report.h). */
#include <libgen.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "qat/qat.h"
#include "train/quant_job.h"

int qt_quant_ensure_fp32(const qt_config *cfg, int verbose, char *err) {
  const char *ck = qt_config_string(cfg, "quant", "fp32_checkpoint");
  if (ck[0] && access(ck, F_OK) != 0) {
    const char *fc = qt_config_string(cfg, "quant", "fp32_config");
    if (!fc[0]) {
      snprintf(err, QT_ERR_LEN, "quant.fp32_checkpoint '%s' does not exist (set quant.fp32_config to train it first)",
               ck);
      return -1;
    }
    char dirbuf[4096];
    snprintf(dirbuf, sizeof dirbuf, "%s", ck);
    const char *dir = dirname(dirbuf);
    const char *base = strrchr(ck, '/') ? strrchr(ck, '/') + 1 : ck;
    if (strcmp(base, "checkpoint.h5") != 0) {
      snprintf(err, QT_ERR_LEN, "quant.fp32_checkpoint '%s': to train it from quant.fp32_config it must be named "
                                "<output dir>/checkpoint.h5", ck);
      return -1;
    }
    if (verbose) fprintf(stderr, "quant: %s does not exist yet: training it with %s first\n", ck, fc);
    qt_config *sub = qt_train_config_create();
    int rc = qt_config_load_file(sub, fc, err);
    /* the same data, threads and terminal as this run; the fp32 recipe from its config */
    int n;
    const qt_cfg_key *schema = qt_train_schema(&n);
    for (int i = 0; i < n && !rc; i++)
      if (strcmp(schema[i].section, "data") == 0)
        rc = qt_config_set(sub, "data", schema[i].key, qt_config_value(cfg, "data", schema[i].key), err);
    if (!rc) rc = qt_config_set(sub, "train", "threads", qt_config_value(cfg, "train", "threads"), err);
    if (!rc) rc = qt_config_set(sub, "output", "progress", qt_config_value(cfg, "output", "progress"), err);
    if (!rc) rc = qt_config_set(sub, "output", "dir", dir, err);
    if (!rc && strcmp(qt_config_string(sub, "quant", "mode"), "none") != 0) {
      snprintf(err, QT_ERR_LEN, "quant.fp32_config '%s' is itself a quantized run (quant.mode = %s)", fc,
               qt_config_string(sub, "quant", "mode"));
      rc = -1;
    }
    if (!rc) rc = qt_train_run(sub, err);
    qt_config_free(sub);
    if (rc) return -1;
  }
  return 0;
}

int qt_quant_obtain_fp32(const qt_config *cfg, qt_graph *g, int verbose, char *err) {
  const char *ck = qt_config_string(cfg, "quant", "fp32_checkpoint");
  if (!ck[0]) {
    if (verbose) fprintf(stderr, "quant: no quant.fp32_checkpoint: quantizing from the initialization\n");
    return 0;
  }
  if (qt_quant_ensure_fp32(cfg, verbose, err)) return -1;
  qt_checkpoint_meta meta;
  if (qt_checkpoint_load(ck, g, NULL, &meta, err)) return -1;
  free(meta.config_ini);
  if (verbose) fprintf(stderr, "quant: starting from %s (%d fp32 epochs)\n", ck, meta.epoch);
  return 0;
}



qt_graph *qt_quant_prepare(const qt_config *cfg, const qt_graph *g, FILE *report, char *err) {
  qt_quantizer_config qc;
  qt_quantizer_config_default(&qc);
  const char *mode = qt_config_string(cfg, "quant", "mode");
  int qat = strcmp(mode, "qat") == 0;
  qc.weight_bits = qt_config_int(cfg, "quant", "weight_bits");
  qc.activation_bits = qt_config_int(cfg, "quant", "activation_bits");
  const char *wo = qt_config_string(cfg, "quant", "weight_observer");
  if (strcmp(wo, "auto") == 0) wo = qat ? "moving_average" : "minmax";

  if (qt_observer_kind_parse(wo, &qc.weight_observer) ||
      qt_observer_kind_parse(qt_config_string(cfg, "quant", "activation_observer"), &qc.activation_observer) ||
      qt_range_method_parse(qt_config_string(cfg, "quant", "activation_range"), &qc.activation_method)) {
    snprintf(err, QT_ERR_LEN, "quant: unknown observer or range method");
    return NULL;
  }
  qc.percentile = (float)qt_config_float(cfg, "quant", "percentile");
  qc.learnable_scale = qt_config_bool(cfg, "quant", "learnable_scale");
  if (qc.learnable_scale && !qat) {
    snprintf(err, QT_ERR_LEN, "quant.learnable_scale needs quant.mode = qat (PTQ learns nothing)");
    return NULL;
  }
  if (qt_parse_overrides(&qc, qt_config_string(cfg, "quant", "layer_overrides"), err)) return NULL;
  qt_annotations ann;
  qt_backend_desc d;
  const char *path = "built in";
  if (strcmp(qt_config_string(cfg, "quant", "quantizer"), "backend") == 0) {
    path = qt_config_string(cfg, "quant", "backend");
    if (!path[0]) {
      snprintf(err, QT_ERR_LEN, "quant.quantizer = backend needs quant.backend (a backend description file)");
      return NULL;
    }
    if (qt_backend_desc_load(&d, path, err)) return NULL;
  } else {
    const char *isa = qt_config_string(cfg, "quant", "isa");
    qt_backend_desc_onednn_cpu(&d, strcmp(isa, "vnni") == 0      ? QT_ISA_VNNI
                                   : strcmp(isa, "no_vnni") == 0 ? QT_ISA_NO_VNNI
                                                                 : QT_ISA_AUTO);
  }
  if (qt_quantizer(g, &d, &qc, &ann, err)) return NULL;
  if (report) {
    fprintf(report, "quantizer from backend %s (%s; %s) (W%d A%d%s):\n", d.name, d.isa, path, qc.weight_bits,
            qc.activation_bits, d.weight_8bit_as_7bit ? ", 8-bit weights restricted to 7 bits" : "");
    qt_annotations_print(g, &ann, report);
  }
  qt_graph *p = qt_prepare(g, &ann, qat ? QT_PREPARE_QAT : QT_PREPARE_PTQ, err);
  qt_annotations_free(&ann);
  return p;
}

/* Observers run, fake quant is off, BN stays in eval (its running statistics are used). */
static void calibration_mode(qt_graph *p) {
  qt_graph_set_training(p, 0);
  for (int i = 0; i < p->n_nodes; i++)
    if (p->nodes[i].q || p->nodes[i].wq) p->nodes[i].training = 1;
  qt_set_observers(p, 1);
  qt_set_fake_quant(p, 0);
}

int qt_quant_calibrate_until(qt_graph *p, qt_loader *l, const qt_dataset *train, qt_ctx *ctx, int until, int *done,
                             char *err) {
  calibration_mode(p);
  qt_ctx_set_grad(ctx, 0);
  const float *images;
  const int32_t *labels;
  int B, rc = 0;
  while (*done < until && (B = qt_loader_next(l, &images, &labels)) > 0) {
    qt_ctx_reset(ctx);
    int64_t shape[4] = {B, train->h, train->w, train->c};
    if (!qt_graph_forward(p, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, (void *)images))) {
      snprintf(err, QT_ERR_LEN, "calibration batch %d: %s", *done + 1, p->error);
      rc = -1;
      break;
    }
    (*done)++;
  }
  qt_ctx_reset(ctx);
  qt_ctx_set_grad(ctx, 1);
  qt_set_observers(p, 0);
  qt_set_fake_quant(p, 1);
  qt_graph_set_training(p, 1);
  return rc;
}

int qt_quant_calibrate(const qt_config *cfg, qt_graph *p, const qt_dataset *train, const qt_loader_config *lc,
                       qt_ctx *ctx, int verbose, char *err) {
  qt_loader *l = qt_loader_create(train, lc, err);
  if (!l) return -1;
  qt_loader_start_epoch(l, 0);
  int done = 0;
  int rc = qt_quant_calibrate_until(p, l, train, ctx, qt_config_int(cfg, "quant", "calibration_batches"), &done, err);
  qt_loader_free(l);
  if (!rc && verbose) fprintf(stderr, "quant: calibrated on %d batches\n", done);
  return rc;
}

int qt_quant_finish(const qt_config *cfg, qt_graph *p, const qt_dataset *test, const qt_loader_config *ec,
                    qt_ctx *ctx, const char *dir, qt_quant_result *res, int verbose, char *err) {
  memset(res, 0, sizeof *res);
  qt_graph_sync_learned_scales(p);
  if (qt_evaluate(p, ctx, test, ec, &res->fake_quant, err)) return -1;
  qt_graph *c = qt_convert(p, err);
  if (!c) return -1;
  /* The eval-mode training graph too, so qat_check can compare the two files later. */
  snprintf(res->trained_path, sizeof res->trained_path, "%s/model_trained.h5", dir);
  qt_graph_set_training(p, 0);
  if (qt_qdq_save(res->trained_path, p, err)) {
    qt_graph_free(c);
    return -1;
  }
  snprintf(res->qdq_path, sizeof res->qdq_path, "%s/model_qdq.h5", dir);
  int rc = qt_qdq_save(res->qdq_path, c, err);
  qt_graph_free(c);
  if (rc) return -1;
  /* Everything downstream uses the file, as a deployment tool would. */
  qt_graph *loaded = qt_qdq_load(res->qdq_path, err);
  if (!loaded) return -1;
  rc = qt_evaluate(loaded, ctx, test, ec, &res->qdq, err);
  qt_graph_set_training(loaded, 0);
  if (!rc) {
    /* the check runs both graphs in arenas of its own: hand the evaluation arena back first */
    qt_ctx_release(ctx);
    int n = qt_config_int(cfg, "quant", "check_batch");
    if (n > test->n) n = (int)test->n;
    qt_loader_config lc = *ec;
    lc.batch_size = n;
    lc.shuffle = 0;
    qt_loader *l = qt_loader_create(test, &lc, err);
    if (!l) {
      rc = -1;
    } else {
      const float *images;
      const int32_t *labels;
      qt_loader_start_epoch(l, 0);
      int B = qt_loader_next(l, &images, &labels);
      rc = qt_check(p, loaded, images, B, &res->check, err);
      qt_loader_free(l);
    }
  }
  qt_graph_free(loaded);
  if (!rc && verbose) {
    fprintf(stderr, "quant: fake-quant %.2f%%, Q/DQ graph %.2f%% (%s)\n", 100 * res->fake_quant.accuracy,
            100 * res->qdq.accuracy, res->qdq_path);
    fprintf(stderr, "check (training graph = convert graph): %s; %d quantization points, %d weights, max %.1f LSB, "
                    "%lld tie flips\n%s",
            res->check.ok ? "PASS" : "FAIL", res->check.n_checked_points, res->check.n_checked_weights,
            res->check.max_lsb, (long long)res->check.tie_mismatches, res->check.reason);
  }

  return rc;
}

/* Inference timing: batch 256 (the deployment target), best of 3 rounds of 8 batches. The
 * device is read inside the graph on the first 1024 test images. */
enum { QT_INFER_BATCH = 256, QT_INFER_BATCHES = 8, QT_INFER_ROUNDS = 3, QT_PROBE_IMAGES = 1024 };

static void print_deploy(FILE *f, const qt_device *m, const qt_quant_result *res) {
  qt_device_report(m, f);
  qt_report_print(&res->report, f);
  fprintf(f, "inference at batch %d (best of %d rounds of %lld images): fp32 %.0f images/s, int8 %.0f images/s (%.2fx)\n",
          res->speed.batch, QT_INFER_ROUNDS, (long long)res->speed.images, res->speed.fp32_images_per_s,
          res->speed.int8_images_per_s,
          res->speed.fp32_images_per_s > 0 ? res->speed.int8_images_per_s / res->speed.fp32_images_per_s : 0.0);
}

int qt_quant_deploy(qt_graph *fp32, const qt_dataset *test, const qt_loader_config *ec, const char *dir,
                    qt_quant_result *res, int verbose, char *err) {
  /* From the file, as a deployment tool would. */
  qt_graph *qdq = qt_qdq_load(res->qdq_path, err);
  if (!qdq) return -1;
  qt_device *m = qt_device_open(qdq, NULL, err);
  int rc = -1;
  if (!m) goto out;
  if (qt_report_run(fp32, qdq, m, test, ec, QT_PROBE_IMAGES, &res->report, err)) goto out;
  if (qt_inference_measure(fp32, m, test, ec, QT_INFER_BATCH, QT_INFER_BATCHES, QT_INFER_ROUNDS, &res->speed, err))
    goto out;
  snprintf(res->report_path, sizeof res->report_path, "%s/report.txt", dir);
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  QT_ASSERT(f, "out of memory for the report");
  print_deploy(f, m, res);
  fclose(f);
  rc = qt_write_file_atomic(res->report_path, text, len, err);
  free(text);
  if (rc) goto out;
  res->deployed = 1;
  if (verbose) print_deploy(stderr, m, res);
out:
  qt_device_free(m);
  qt_graph_free(qdq);
  if (fp32) qt_graph_set_training(fp32, 1); /* as qt_evaluate leaves graphs */
  return rc;
}
