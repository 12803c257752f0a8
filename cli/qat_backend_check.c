/* qat_backend_check MODEL_QDQ.h5 [--backend onednn_cpu|DESC.ini] [--isa auto|vnni|no_vnni] [--warn]
 *                   [--partition] [--run] [--config CFG.ini] [--images N] [--batch N]
 * qat_backend_check --quantize CFG.ini OUT_QDQ.h5 --backend DESC.ini [...the options above]
 *
 * The backend check pass as a command: reads the Q/DQ graph file and lists every violation of
 * the backend's constraints (ops, bit widths, sign, symmetry, per-channel, power-of-two scales,
 * channels, and on x86 without VNNI the u8 x s8 pair sums that saturate int16), each with its
 * node and reason. The backend is the built-in onednn_cpu (its ISA from oneDNN, or forced with
 * --isa) or an accelerator described by an INI file (experiments/accel_fictional.ini).
 * --partition prints which parts run on the backend and which fall back to the CPU, with
 * reasons; --run also runs the partitioned model on the config's test set (default:
 * Fashion-MNIST) against the Q/DQ reference: accuracy, largest output difference in LSB, top-1
 * agreement. --quantize first makes OUT_QDQ.h5 from a qat_train config: the fp32 checkpoint it
 * names (quant.fp32_checkpoint), quantized with the Quantizer derived from the backend
 * description (quant.weight_bits, activation_bits, observers, layer_overrides), PTQ-calibrated
 * on quant.calibration_batches training batches, converted and saved.
 * Exit 0: no violations (or --warn) and, with --run, within 2 LSB and >= 99% identical top-1;
 * 1: violations, or --run outside those bounds; 2: bad input. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend/backend.h"
#include "qat/qat.h"
#include "config/config.h"
#include "train/train.h"
#include "cli/backend_check_quantize.h"

static int usage(void) {
  fprintf(stderr,
          "usage: qat_backend_check MODEL_QDQ.h5 [--backend onednn_cpu|DESC.ini] [--isa auto|vnni|no_vnni] [--warn]\n"
          "                         [--partition] [--run] [--config CFG.ini] [--images N] [--batch N]\n"
          "       qat_backend_check --quantize CFG.ini OUT_QDQ.h5 --backend DESC.ini [options above]\n");
  return 2;
}

/* The partitioned model (accelerator or lowered oneDNN) against the Q/DQ reference on the
 * test set. Returns 0 within bounds, 1 outside, 2 on error. */
static int run_compare(qt_graph *g, qt_accel *acc, qt_lowered *low, const qt_config *cfg, int images, int batch,
                       char *err) {
  int status = 2;
  qt_dataset train, test;
  memset(&train, 0, sizeof train);
  memset(&test, 0, sizeof test);
  qt_loader *l = NULL;
  qt_ctx *ctx = qt_ctx_create();
  float *out = NULL;
  if (qt_train_load_data(cfg, &train, &test, err)) goto done;
  if (images > 0) qt_dataset_limit(&test, images);
  const qt_value *in = &g->values[g->input];
  if (test.h != in->shape[0] || test.w != in->shape[1] || test.c != in->shape[2]) {
    snprintf(err, QT_ERR_LEN, "model %s wants %lldx%lldx%lld images, the test set holds %dx%dx%d", g->name,
             (long long)in->shape[0], (long long)in->shape[1], (long long)in->shape[2], test.h, test.w, test.c);
    goto done;
  }
  const int64_t classes = acc ? qt_accel_output_numel(acc) : qt_lowered_output_numel(low);
  qt_loader_config lc = qt_train_loader_config(cfg, batch, 0, 0);
  l = qt_loader_create(&test, &lc, err);
  out = malloc((size_t)batch * (size_t)classes * sizeof(float));
  if (!l || !out) goto done;
  const qt_node *on = &g->nodes[g->values[g->output].producer];
  const float lsb = on->op == QT_OP_DEQUANTIZE && on->q->channels == 1 ? on->q->scale[0] : 0;
  qt_graph_set_training(g, 0);
  qt_loader_start_epoch(l, 0);
  int64_t seen = 0, correct = 0, ref_correct = 0, agree = 0, differ = 0;
  double max_diff = 0;
  const float *x;
  const int32_t *labels;
  int n;
  while ((n = qt_loader_next(l, &x, &labels)) > 0) {
    if (acc ? qt_accel_run(acc, out, x, n, err) : qt_lowered_run(low, out, x, n, err)) goto done;
    qt_ctx_reset(ctx);
    const int64_t shape[4] = {n, test.h, test.w, test.c};
    qt_tensor *y = qt_graph_forward(g, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, (void *)x));
    if (!y) {
      snprintf(err, QT_ERR_LEN, "Q/DQ reference: %s", g->error);
      goto done;
    }
    for (int i = 0; i < n; i++) {
      const float *o = out + (int64_t)i * classes, *r = qt_f32(y) + (int64_t)i * classes;
      const int p = (int)qt_argmax(o, (int)classes), pr = (int)qt_argmax(r, (int)classes);
      correct += p == labels[i];
      ref_correct += pr == labels[i];
      agree += p == pr;
      for (int k = 0; k < classes; k++) {
        double dd = fabs((double)o[k] - (double)r[k]) / (lsb > 0 ? lsb : 1.0);
        differ += dd > 0;
        if (dd > max_diff) max_diff = dd;
      }
    }
    seen += n;
  }
  const double agreement = seen ? (double)agree / (double)seen : 1.0;
  printf("run: %lld test images: device top-1 %.2f%%, Q/DQ reference top-1 %.2f%%; outputs: max difference %.3g %s, "
         "%lld of %lld differ; identical top-1 on %.2f%%\n",
         (long long)seen, seen ? 100.0 * (double)correct / (double)seen : 0.0,
         seen ? 100.0 * (double)ref_correct / (double)seen : 0.0, max_diff, lsb > 0 ? "LSB" : "(absolute)",
         (long long)differ, (long long)(seen * classes), 100.0 * agreement);
  status = (lsb > 0 && max_diff > 2.0001) || agreement < 0.99 ? 1 : 0;
  if (status) printf("run: FAIL: the device must stay within 2 output LSB and agree on >= 99%% of images\n");
done:
  free(out);
  qt_ctx_free(ctx);
  qt_loader_free(l);
  qt_dataset_free(&train);
  qt_dataset_free(&test);
  return status;
}

int main(int argc, char **argv) {
  const char *model_path = NULL, *backend = "onednn_cpu", *config_path = NULL, *quant_config = NULL;
  qt_isa_choice isa = QT_ISA_AUTO;
  int warn = 0, partition = 0, run = 0, images = 0, batch = 256;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc) {
      backend = argv[++i];
    } else if (strcmp(argv[i], "--isa") == 0 && i + 1 < argc) {
      const char *v = argv[++i];
      if (strcmp(v, "auto") == 0) isa = QT_ISA_AUTO;
      else if (strcmp(v, "vnni") == 0) isa = QT_ISA_VNNI;
      else if (strcmp(v, "no_vnni") == 0) isa = QT_ISA_NO_VNNI;
      else {
        fprintf(stderr, "qat_backend_check: --isa expects auto, vnni or no_vnni, found '%s'\n", v);
        return 2;
      }
    } else if (strcmp(argv[i], "--warn") == 0) {
      warn = 1;
    } else if (strcmp(argv[i], "--partition") == 0) {
      partition = 1;
    } else if (strcmp(argv[i], "--run") == 0) {
      run = partition = 1;
    } else if (strcmp(argv[i], "--config") == 0 && i + 1 < argc) {
      config_path = argv[++i];
    } else if (strcmp(argv[i], "--images") == 0 && i + 1 < argc) {
      if (qt_cli_parse_int("qat_backend_check", "--images", argv[++i], 1, 1000000000, &images)) return 2;
    } else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc) {
      if (qt_cli_parse_int("qat_backend_check", "--batch", argv[++i], 1, 65536, &batch)) return 2;
    } else if (strcmp(argv[i], "--quantize") == 0 && i + 2 < argc) {
      quant_config = argv[++i];
      model_path = argv[++i];
    } else if (argv[i][0] != '-' && !model_path) {
      model_path = argv[i];
    } else {
      return usage();
    }
  }
  if (!model_path) return usage();
  char err[QT_ERR_LEN];
  qt_backend_desc d;
  const int is_onednn = strcmp(backend, "onednn_cpu") == 0;
  if (is_onednn) {
    qt_backend_desc_onednn_cpu(&d, isa);
  } else {
    if (isa != QT_ISA_AUTO) {
      fprintf(stderr, "qat_backend_check: --isa applies to the onednn_cpu backend, not to %s\n", backend);
      return 2;
    }
    if (qt_backend_desc_load(&d, backend, err)) {
      fprintf(stderr, "qat_backend_check: %s\n", err);
      return 2;
    }
  }
  qt_config *cfg = qt_train_config_create();
  if (quant_config && config_path) {
    fprintf(stderr, "qat_backend_check: --quantize takes its data from CFG.ini; drop --config\n");
    qt_config_free(cfg);
    return 2;
  }
  if ((quant_config || config_path) && qt_config_load_file(cfg, quant_config ? quant_config : config_path, err)) {
    fprintf(stderr, "qat_backend_check: %s\n", err);
    qt_config_free(cfg);
    return 2;
  }
  if (quant_config && qt_backend_check_quantize(cfg, &d, model_path, err)) {
    fprintf(stderr, "qat_backend_check: --quantize %s: %s\n", quant_config, err);
    qt_config_free(cfg);
    return 2;
  }
  qt_graph *g = qt_qdq_load(model_path, err);
  if (!g) {
    fprintf(stderr, "qat_backend_check: %s\n", err);
    qt_config_free(cfg);
    return 2;
  }
  int status = 2;
  qt_accel *acc = NULL;
  qt_lowered *low = NULL;
  qt_backend_check_result r;
  memset(&r, 0, sizeof r);
  if (qt_backend_check(g, &d, &r, err)) goto fail;
  qt_backend_desc_print(&d, stdout);
  qt_backend_check_print(&r, stdout);
  status = r.n && !warn ? 1 : 0;
  if (r.n && warn) printf("(--warn: violations reported as warnings)\n");
  if (partition) {
    if (is_onednn) {
      low = qt_lower(g, err);
      if (!low) goto fail;
      qt_lowered_report(low, stdout);
    } else {
      acc = qt_accel_partition(g, &d, err);
      if (!acc) goto fail;
      qt_accel_report(acc, stdout);
    }
  }
  if (run) {
    if (!quant_config) qt_config_set(cfg, "data", "train_limit", "1", err);
    int rs = run_compare(g, acc, low, cfg, images, batch, err);
    if (rs == 2) goto fail;
    if (rs) status = 1;
  }
  goto done;
fail:
  fprintf(stderr, "qat_backend_check: %s\n", err);
  status = 2;
done:
  qt_backend_check_result_free(&r);
  qt_accel_free(acc);
  qt_lowered_free(low);
  qt_graph_free(g);
  qt_config_free(cfg);
  return status;
}
