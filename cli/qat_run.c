/* qat_run MODEL_QDQ.h5 [--config CFG.ini] [--batch N] [--images N] [--compare] [--quiet]:
 * lowers a Q/DQ graph (qat_train's model_qdq.h5) to int8 oneDNN kernels with fp32 fallback
 * partitions, prints the partition report, runs it on the config's test set (default:
 * Fashion-MNIST) and prints top-1 accuracy and images/s (model time only, data loading
 * excluded). --compare also runs the Q/DQ reference interpreter on the same batches and
 * reports the largest logit difference in output LSB and the top-1 agreement.
 * Exit 0: ran (and, with --compare, within 1 LSB and >= 99.9% identical top-1); 1: --compare
 * outside those bounds; 2: bad input (unreadable, truncated or corrupt model file, unknown
 * op, bad option, missing data). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "qat/qat.h"
#include "config/config.h"
#include "train/pipeline.h"

static int usage(void) {
  fprintf(stderr, "usage: qat_run MODEL_QDQ.h5 [--config CFG.ini] [--batch N] [--images N] [--compare] [--quiet]\n");
  return 2;
}

int main(int argc, char **argv) {
  if (argc < 2 || argv[1][0] == '-') return usage();
  const char *model_path = argv[1], *config_path = NULL;
  int batch = 256, images = 0, compare = 0, quiet = 0;
  for (int i = 2; i < argc; i++) {
    if (strcmp(argv[i], "--config") == 0 && i + 1 < argc) {
      config_path = argv[++i];
    } else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc) {
      if (qt_cli_parse_int("qat_run", "--batch", argv[++i], 1, 65536, &batch)) return 2;
    } else if (strcmp(argv[i], "--images") == 0 && i + 1 < argc) {
      if (qt_cli_parse_int("qat_run", "--images", argv[++i], 1, 1000000000, &images)) return 2;
    } else if (strcmp(argv[i], "--compare") == 0) {
      compare = 1;
    } else if (strcmp(argv[i], "--quiet") == 0) {
      quiet = 1;
    } else {
      return usage();
    }
  }
  char err[QT_ERR_LEN];
  qt_graph *g = qt_qdq_load(model_path, err);
  if (!g) {
    fprintf(stderr, "qat_run: %s\n", err);
    return 2;
  }
  qt_lowered *m = qt_lower(g, err);
  if (!m) {
    fprintf(stderr, "qat_run: %s\n", err);
    qt_graph_free(g);
    return 2;
  }
  if (!quiet) qt_lowered_report(m, stdout);
  /* Output LSB: the scale of the final dequantize (per tensor), if the output is one. */
  const qt_node *out_node = &g->nodes[g->values[g->output].producer];
  const float out_lsb = out_node->op == QT_OP_DEQUANTIZE && out_node->q->channels == 1 ? out_node->q->scale[0] : 0;
  if (!compare) {
    qt_graph_free(g);
    g = NULL;
  } else {
    qt_graph_set_training(g, 0);
  }

  int status = 2;
  static qt_options opts;
  qt_status st = {0};
  qt_dataset train, test;
  memset(&train, 0, sizeof train);
  memset(&test, 0, sizeof test);
  qt_loader *l = NULL;
  qt_ctx *ctx = NULL;
  float *out = NULL;
  if (qt_options_load(config_path, NULL, 0, &opts, err)) goto fail;
  if (qt_stage_load_data(&opts.data, QT_SPLIT_TEST, &train, &test, &st)) {
    snprintf(err, sizeof err, "%s", st.msg);
    goto fail;
  }
  if (images > 0) qt_dataset_limit(&test, images);
  int h, w, c;
  qt_lowered_input_shape(m, &h, &w, &c);
  if (test.h != h || test.w != w || test.c != c) {
    snprintf(err, sizeof err, "model %s wants %dx%dx%d images, the test set holds %dx%dx%d", model_path, h, w, c,
             test.h, test.w, test.c);
    goto fail;
  }
  const int64_t classes = qt_lowered_output_numel(m);
  qt_loader_config lc = qt_stage_loader_config(&opts, QT_LOADER_EVAL);
  lc.batch_size = batch;
  l = qt_loader_create(&test, &lc, err);
  if (!l) goto fail;
  out = malloc((size_t)batch * (size_t)classes * sizeof(float));
  if (!out) {
    snprintf(err, sizeof err, "out of memory for a batch of %d outputs", batch);
    goto fail;
  }
  ctx = compare ? qt_ctx_create() : NULL;
  /* Warm-up: primitives for the batch size are created on first use, not timed. */
  {
    qt_loader_start_epoch(l, 0);
    const float *x;
    const int32_t *labels;
    int n = qt_loader_next(l, &x, &labels);
    if (n > 0 && qt_lowered_run(m, out, x, n, err)) goto fail;
  }
  qt_loader_start_epoch(l, 0);
  int64_t seen = 0, correct = 0, ref_correct = 0, agree = 0, lsb_over_1 = 0;
  double seconds = 0, max_diff = 0;
  for (;;) {
    const float *x;
    const int32_t *labels;
    int n = qt_loader_next(l, &x, &labels);
    if (n == 0) break;
    double t0 = qt_now_seconds();
    if (qt_lowered_run(m, out, x, n, err)) goto fail;
    seconds += qt_now_seconds() - t0;
    const float *ref = NULL;
    if (compare) {
      qt_ctx_reset(ctx);
      const int64_t shape[4] = {n, h, w, c};
      qt_tensor *y = qt_graph_forward(g, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, (void *)x));
      if (!y) {
        snprintf(err, sizeof err, "Q/DQ reference: %s", g->error);
        goto fail;
      }
      ref = qt_f32(y);
    }
    for (int i = 0; i < n; i++) {
      const float *o = out + (int64_t)i * classes;
      const int p = (int)qt_argmax(o, (int)classes);
      correct += p == labels[i];
      if (ref) {
        const float *r = ref + (int64_t)i * classes;
        const int pr = (int)qt_argmax(r, (int)classes);
        ref_correct += pr == labels[i];
        agree += pr == p;
        for (int k = 0; k < classes; k++) {
          double d = fabs((double)o[k] - (double)r[k]);
          if (out_lsb > 0) d /= out_lsb;
          if (d > max_diff) max_diff = d;
          if (out_lsb > 0 && d > 1.0001) lsb_over_1++;
        }
      }
    }
    seen += n;
  }
  printf("qat_run: %s on %lld images, batch %d: top-1 %.2f%%, %.0f images/s (model time %.3f s)\n", model_path,
         (long long)seen, batch, 100.0 * (double)correct / (double)seen, (double)seen / seconds, seconds);
  status = 0;
  if (compare) {
    const double agreement = (double)agree / (double)seen;
    printf("qat_run: Q/DQ reference top-1 %.2f%%; device vs Q/DQ: max logit difference %.3g %s, %lld logits over "
           "1 LSB, identical top-1 on %.3f%% of images\n",
           100.0 * (double)ref_correct / (double)seen, max_diff, out_lsb > 0 ? "LSB" : "(absolute)",
           (long long)lsb_over_1, 100.0 * agreement);
    if ((out_lsb > 0 && lsb_over_1 > 0) || agreement < 0.999) {
      printf("qat_run: FAIL: the device must stay within 1 LSB and agree on >= 99.9%% of images\n");
      status = 1;
    }
  }
  goto done;
fail:
  fprintf(stderr, "qat_run: %s\n", err);
  status = 2;
done:
  free(out);
  qt_ctx_free(ctx);
  qt_loader_free(l);
  qt_dataset_free(&train);
  qt_dataset_free(&test);
  qt_lowered_free(m);
  qt_graph_free(g);
  return status;
}
