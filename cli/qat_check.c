/* qat_check TRAINED.h5 CONVERTED.h5 [--images N] [--config CFG.ini]: the training graph =
 * convert graph check as a command. TRAINED is the eval-mode training graph qat_train saves
 * (model_trained.h5), CONVERTED the Q/DQ graph (model_qdq.h5); the batch is the first N test
 * images of the config's data (default: Fashion-MNIST). Exit 0: consistent; 1: a mismatch
 * (each named with its node and reason); 2: bad input. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qat/qat.h"
#include "train/train.h"

static int usage(void) {
  fprintf(stderr, "usage: qat_check TRAINED.h5 CONVERTED.h5 [--images N] [--config CFG.ini]\n");
  return 2;
}

int main(int argc, char **argv) {
  if (argc < 3) return usage();
  const char *trained_path = argv[1], *converted_path = argv[2], *config_path = NULL;
  int images = 256;
  for (int i = 3; i < argc; i++) {
    if (strcmp(argv[i], "--images") == 0 && i + 1 < argc) {
      char *end;
      long v = strtol(argv[++i], &end, 10);
      if (*end || v < 1 || v > 100000) {
        fprintf(stderr, "qat_check: --images expects an integer in [1, 100000], found '%s'\n", argv[i]);
        return 2;
      }
      images = (int)v;
    } else if (strcmp(argv[i], "--config") == 0 && i + 1 < argc) {
      config_path = argv[++i];
    } else {
      return usage();
    }
  }
  char err[QT_ERR_LEN];
  qt_config *cfg = qt_train_config_create();
  if (config_path && qt_config_load_file(cfg, config_path, err)) {
    fprintf(stderr, "qat_check: %s\n", err);
    qt_config_free(cfg);
    return 2;
  }
  qt_graph *t = qt_qdq_load(trained_path, err);
  if (!t) {
    fprintf(stderr, "qat_check: %s\n", err);
    qt_config_free(cfg);
    return 2;
  }
  qt_graph *c = qt_qdq_load(converted_path, err);
  if (!c) {
    fprintf(stderr, "qat_check: %s\n", err);
    qt_graph_free(t);
    qt_config_free(cfg);
    return 2;
  }
  qt_dataset train, test;
  qt_config_set(cfg, "data", "train_limit", "1", err);
  int status = 2;
  if (qt_train_load_data(cfg, &train, &test, err)) {
    fprintf(stderr, "qat_check: %s\n", err);
    goto out;
  }
  qt_dataset_limit(&test, images);
  qt_loader_config lc;
  memset(&lc, 0, sizeof lc);
  lc.batch_size = (int)test.n;
  for (int ch = 0; ch < 4; ch++) {
    lc.mean[ch] = (float)qt_config_float(cfg, "data", "mean");
    lc.std[ch] = (float)qt_config_float(cfg, "data", "std");
  }
  qt_loader *l = qt_loader_create(&test, &lc, err);
  if (!l) {
    fprintf(stderr, "qat_check: %s\n", err);
    goto out_data;
  }
  qt_loader_start_epoch(l, 0);
  const float *x;
  const int32_t *labels;
  int n = qt_loader_next(l, &x, &labels);
  qt_check_report r;
  if (qt_check(t, c, x, n, &r, err)) {
    fprintf(stderr, "qat_check: %s\n", err);
  } else {
    printf("qat_check: %s vs %s on %d images: %s\n", trained_path, converted_path, n, r.ok ? "PASS" : "FAIL");
    printf("  %d quantization points, %d quantized weights checked; max difference %.1f LSB; %lld rounding-tie "
           "flips\n", r.n_checked_points, r.n_checked_weights, r.max_lsb, (long long)r.tie_mismatches);
    if (!r.ok) printf("%s", r.reason);
    status = r.ok ? 0 : 1;
  }
  qt_loader_free(l);
out_data:
  qt_dataset_free(&train);
  qt_dataset_free(&test);
out:
  qt_graph_free(t);
  qt_graph_free(c);
  qt_config_free(cfg);
  return status;
}
