/* qat_run MODEL_QDQ.h5 [--backend onednn|xnnpack|DESC.ini] [--config CFG.ini] [--batch N] [--images N]
 *         [--compare] [--quiet] [--write-outputs OUT.h5 [--values NAME,NAME...] [--reference]]:
 * deploys a Q/DQ graph (qat_train's model_qdq.h5) on a backend's device (backend.h; default the
 * oneDNN int8 device), prints
 * the partition report, runs it on the config's test set (default: Fashion-MNIST) and prints
 * top-1 accuracy and images/s (model time only). --compare also runs the Q/DQ reference
 * interpreter and judges the device by the one agreement rule (eval/report.h). --write-outputs
 * writes the device's logits, the labels and the named intermediate values to an HDF5 file;
 * with --reference, what the exact integer reference (eval/exact.h) computes there instead.
 * Exit 0: ran (and, with --compare, the device passed the rule); 1: --compare failed the rule;
 * 2: bad input (unreadable, truncated or corrupt model file, unknown op, bad option, missing
 * data) or a failure while running. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/pipeline.h"

static int usage(void) {
  fprintf(stderr,
          "usage: qat_run MODEL_QDQ.h5 [--backend onednn|xnnpack|DESC.ini] [--config CFG.ini] [--batch N]\n"
          "               [--images N] [--compare] [--quiet] [--write-outputs OUT.h5 [--values NAME,NAME...]\n"
          "               [--reference]]\n");
  return 2;
}

int main(int argc, char **argv) {
  qt_memory_policy_init();
  if (argc < 2 || argv[1][0] == '-') return usage();
  const char *model_path = argv[1];
  qt_cli_data_options D = {.batch = 256};
  int compare = 0, quiet = 0, reference = 0, c;
  const char *backend = "onednn";
  for (int i = 2; i < argc; i++) {
    c = qt_cli_data_option("qat_run", "--config --images --batch --write-outputs --values", argc, argv, &i, &D);
    if (c != 0) {
      if (c < 0) return 2;
    } else if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc)
      backend = argv[++i];
    else if (strcmp(argv[i], "--compare") == 0)
      compare = 1;
    else if (strcmp(argv[i], "--quiet") == 0)
      quiet = 1;
    else if (strcmp(argv[i], "--reference") == 0)
      reference = 1;
    else
      return usage();
  }
  if (qt_cli_data_finish("qat_run", &D)) return 2;
  if (reference && !D.outputs_path) {
    fprintf(stderr, "qat_run: --reference names what --write-outputs writes; give --write-outputs OUT.h5\n");
    return 2;
  }

  static qt_options o;
  qt_status st = {0};
  char *err = st.msg;
  int status = 2;
  qt_device *dev = NULL;
  qt_dataset test = {0};
  qt_loader_config lc;
  qt_backend_desc d;
  qt_graph *g = NULL;
  if (qt_backend_desc_named(&d, backend, QT_ISA_AUTO, err)) goto fail;
  g = qt_qdq_load(model_path, err);
  if (!g || !(dev = qt_device_open(g, &d, err))) goto fail;
  if (!quiet) qt_device_report(dev, stdout);
  if (qt_stage_test_data(D.config_path, D.images, D.batch, &o, &test, &lc, &st)) goto fail;
  qt_device_agreement a;
  if (qt_device_compare(dev, compare ? g : NULL, &test, &lc, &a, err)) goto fail;
  printf("qat_run: %s on %lld images, batch %d: top-1 %.2f%%, %.0f images/s (model time %.3f s)\n", model_path,
         (long long)a.images, D.batch, 100.0 * (double)a.device_correct / (double)a.images,
         (double)a.images / a.device_seconds, a.device_seconds);
  status = 0;
  if (compare && !qt_device_agreement_print(&a, "qat_run", stdout)) status = 1;
  if (D.outputs_path) {
    if (qt_device_write_outputs(dev, reference, &test, &lc, D.names, D.n_names, D.outputs_path, err)) goto fail;
    printf("qat_run: wrote the %s's logits%s to %s\n", reference ? "exact reference" : "device",
           D.n_names ? " and values" : "", D.outputs_path);
  }
  goto done;
fail:
  fprintf(stderr, "qat_run: %s\n", err);
  status = 2;
done:
  qt_dataset_free(&test);
  qt_device_free(dev);
  qt_graph_free(g);
  return status;
}
