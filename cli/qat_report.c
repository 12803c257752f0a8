/* qat_report MODEL_QDQ.h5 [--fp32 CHECKPOINT.h5 [--model NAME | --model PATH.onnx]] [--config CFG.ini] [--images N]
 *            [--batch N] [--probe-images N] [--no-timing] [--timing-rounds R] [--timing-batch B]
 *            [--backend onednn|xnnpack|DESC.ini]:
 * the three-stage accuracy report as a command (eval/report.h). Lowers the Q/DQ graph to the
 * backend's int8 kernels (default oneDNN), runs the config's test set (default: Fashion-MNIST) through the fp32 model
 * (the checkpoint loaded into the preset NAME or the model imported from PATH.onnx, by default the preset named as the
 * Q/DQ graph's model), the Q/DQ graph and the device, and prints the partition report, accuracies, Q/DQ-vs-device top-1
 * agreement and output LSB histogram, per-point SQNR, which stage lost accuracy, and fp32 /
 * int8 inference images/s at batch 256. --images N: the first N test images; --batch N: the
 * report's batch size (default 256; timing uses --timing-batch); --probe-images N: the device is
 * read inside the graph on the first N images (default 1024; 0: only at the output), and each
 * partition is judged alone on the first of them (at most 256: the column "alone");
 * --no-timing: skip the speed measurement; --timing-rounds R: best of R rounds (default 3);
 * --timing-batch B: the images per timed run (default 256; 1 for latency), max(8, 2048 / B) runs
 * per round;
 * --write-outputs OUT.h5 [--values NAME,...]: also writes the device's logits, the labels and the
 * named intermediate values (qt_device_write_outputs) to an HDF5 file.
 * Exit 0: reported; 1: a failure while running; 2: bad input (unreadable model or checkpoint,
 * bad option, missing data). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx/onnx_import.h"
#include "train/pipeline.h"

static int usage(void) {
  fprintf(stderr,
          "usage: qat_report MODEL_QDQ.h5 [--fp32 CHECKPOINT.h5 [--model NAME|PATH.onnx]] [--config CFG.ini] "
          "[--images N] [--batch N] [--probe-images N] [--no-timing] [--timing-rounds R] [--timing-batch B] "
          "[--write-outputs OUT.h5 [--values NAME,NAME...]] [--backend onednn|xnnpack|DESC.ini]\n");
  return 2;
}

typedef struct {
  const char *qdq_path, *fp32_path, *model_name, *backend;
  qt_cli_data_options D;
  int probe, timing, rounds, timing_batch;
} report_args;

/* The command line into a; 0, or 2 (the exit status) after a message. */
static int parse_args(int argc, char **argv, report_args *a) {
  *a = (report_args){.qdq_path = argv[1],
                     .backend = "onednn",
                     .D = {.batch = 256},
                     .probe = 1024,
                     .timing = 1,
                     .rounds = 3,
                     .timing_batch = 256};
  for (int i = 2; i < argc; i++) {
    const int c =
        qt_cli_data_option("qat_report", "--config --images --batch --write-outputs --values", argc, argv, &i, &a->D);
    if (c != 0) {
      if (c < 0) return 2;
    } else if (strcmp(argv[i], "--fp32") == 0 && i + 1 < argc)
      a->fp32_path = argv[++i];
    else if (strcmp(argv[i], "--model") == 0 && i + 1 < argc)
      a->model_name = argv[++i];
    else if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc)
      a->backend = argv[++i];
    else if (strcmp(argv[i], "--timing-rounds") == 0 && i + 1 < argc) {
      if (qt_cli_parse_int("qat_report", "--timing-rounds", argv[++i], 1, 1000, &a->rounds)) return 2;
    } else if (strcmp(argv[i], "--timing-batch") == 0 && i + 1 < argc) {
      if (qt_cli_parse_int("qat_report", "--timing-batch", argv[++i], 1, 4096, &a->timing_batch)) return 2;
    } else if (strcmp(argv[i], "--probe-images") == 0 && i + 1 < argc) {
      if (qt_cli_parse_int("qat_report", "--probe-images", argv[++i], 0, 1000000000, &a->probe)) return 2;
    } else if (strcmp(argv[i], "--no-timing") == 0)
      a->timing = 0;
    else
      return usage();
  }
  if (a->model_name && !a->fp32_path) {
    fprintf(stderr, "qat_report: --model names the architecture of the --fp32 checkpoint; give --fp32 too\n");
    return 2;
  }
  if (qt_cli_data_finish("qat_report", &a->D)) return 2;
  const char *out = a->D.outputs_path;
  if (out && (qt_same_file(out, a->qdq_path) || (a->fp32_path && qt_same_file(out, a->fp32_path)))) {
    fprintf(stderr, "qat_report: --write-outputs %s is an input file of the report; it would be replaced\n", out);
    return 2;
  }
  return 0;
}

/* The fp32 model of --fp32 (its architecture: --model, else the Q/DQ graph's name), or NULL with err. */
static qt_graph *load_fp32(const report_args *a, const qt_graph *qdq, char *err) {
  const char *model_name = a->model_name;
  const size_t ml = model_name ? strlen(model_name) : 0;
  qt_graph *fp32;
  if (ml > 5 && strcmp(model_name + ml - 5, ".onnx") == 0) { /* dynamic dims: the Q/DQ graph's input */
    const qt_value *in = &qdq->values[qdq->input];
    const int hwc[3] = {(int)in->shape[0], (int)in->shape[1], (int)in->shape[2]};
    if (!(fp32 = qt_onnx_import(model_name, hwc, NULL, err))) return NULL;
  } else if (!(fp32 = qt_model_build(model_name ? model_name : qdq->name, err))) {
    if (!model_name) /* an imported model is named after its file */
      snprintf(err + strlen(err), QT_ERR_LEN - strlen(err), "; for a model imported from ONNX give --model PATH.onnx");
    return NULL;
  }
  if (qt_checkpoint_load(a->fp32_path, fp32, NULL, NULL, err)) {
    qt_graph_free(fp32);
    return NULL;
  }
  return fp32;
}

static int print_timing(const report_args *a, qt_graph *fp32, qt_device *m, const qt_dataset *test,
                        const qt_loader_config *lc, char *err) {
  qt_inference_speed s;
  const int runs = a->timing_batch >= 256 ? 8 : 2048 / a->timing_batch;
  if (qt_inference_measure(fp32, m, test, lc, a->timing_batch, runs, a->rounds, &s, err)) return -1;
  if (fp32)
    printf(
        "inference at batch %d (best of %d rounds of %lld images): fp32 %.0f images/s, int8 %.0f images/s "
        "(%.2fx)\n",
        s.batch, a->rounds, (long long)s.images, s.fp32_images_per_s, s.int8_images_per_s,
        s.int8_images_per_s / s.fp32_images_per_s);
  else
    printf("inference at batch %d (best of %d rounds of %lld images): int8 %.0f images/s (no fp32 model given)\n",
           s.batch, a->rounds, (long long)s.images, s.int8_images_per_s);
  return 0;
}

int main(int argc, char **argv) {
  qt_memory_policy_init();
  if (argc < 2 || argv[1][0] == '-') return usage();
  report_args a;
  int status = parse_args(argc, argv, &a);
  if (status) return status;
  static qt_options o;
  qt_status st = {0};
  char *err = st.msg;
  qt_graph *qdq = NULL, *fp32 = NULL;
  qt_device *m = NULL;
  qt_dataset test = {0};
  qt_loader_config lc;
  const qt_cli_data_options *D = &a.D;

  /* Bad input: exit 2. */
  status = 2;
  qt_backend_desc d;
  if (!(qdq = qt_qdq_load(a.qdq_path, err)) || (a.fp32_path && !(fp32 = load_fp32(&a, qdq, err))) ||
      qt_backend_desc_named(&d, a.backend, QT_ISA_AUTO, err) || !(m = qt_device_open(qdq, &d, err)) ||
      qt_stage_test_data(D->config_path, D->images, D->batch, &o, &test, &lc, &st))
    goto fail;

  /* Running: exit 1 on failure. */
  status = 1;
  static qt_report r;
  if (qt_report_run(fp32, qdq, m, &test, &lc, a.probe, &r, err)) goto fail;
  printf("qat_report: %s%s%s\n", a.qdq_path, a.fp32_path ? " against fp32 " : "", a.fp32_path ? a.fp32_path : "");
  qt_device_report(m, stdout);
  qt_report_print(&r, stdout);
  if (a.timing && print_timing(&a, fp32, m, &test, &lc, err)) goto fail;
  if (D->outputs_path) {
    if (qt_device_write_outputs(m, 0, &test, &lc, D->names, D->n_names, D->outputs_path, err)) goto fail;
    printf("qat_report: wrote the device's logits%s to %s\n", D->n_names ? " and values" : "", D->outputs_path);
  }
  status = 0;
  goto done;
fail:
  fprintf(stderr, "qat_report: %s\n", err);
done:
  qt_device_free(m);
  qt_graph_free(qdq);
  qt_graph_free(fp32);
  qt_dataset_free(&test);
  return status;
}
