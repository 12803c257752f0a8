/* qat_check TRAINED.h5 CONVERTED.h5 [--images N] [--config CFG.ini]: the training graph =
 * convert graph check as a command. TRAINED is the eval-mode training graph qat_train saves
 * (model_trained.h5), CONVERTED the Q/DQ graph (model_qdq.h5); the batch is the first N test
 * images of the config's data (default: Fashion-MNIST). Exit 0: consistent; 1: a mismatch
 * (each named with its node and reason); 2: bad input. */
#include <stdio.h>
#include <string.h>

#include "train/pipeline.h"

static int usage(void) {
  fprintf(stderr, "usage: qat_check TRAINED.h5 CONVERTED.h5 [--images N] [--config CFG.ini]\n");
  return 2;
}

/* Whether g holds a node of op. */
static int has_op(const qt_graph *g, qt_op op) {
  for (int i = 0; i < g->n_nodes; i++)
    if (g->nodes[i].op == op) return 1;
  return 0;
}

/* The trained graph holds fake quant and no quantize nodes, the Q/DQ graph the opposite: two files
 * of the wrong kind (given in the wrong order, say) are bad input, not a failed check. */
static int kinds_fit(const qt_graph *t, const qt_graph *c, const char *tp, const char *cp, char *err) {
  if (!has_op(t, QT_OP_FAKE_QUANT) || has_op(t, QT_OP_QUANTIZE))
    return qt_err(err, "'%s' is not a trained (prepared) graph: it holds no fake quant%s; give model_trained.h5 first",
                  tp,
                  has_op(t, QT_OP_QUANTIZE) ? " but quantize nodes (a Q/DQ graph: are the two files swapped?)" : "");
  if (has_op(c, QT_OP_FAKE_QUANT) || !has_op(c, QT_OP_QUANTIZE))
    return qt_err(err, "'%s' is not a Q/DQ graph: %s; give model_qdq.h5 second", cp,
                  has_op(c, QT_OP_FAKE_QUANT) ? "it holds fake quant (a trained graph: are the two files swapped?)"
                                              : "it holds no quantize nodes");
  return 0;
}

static int check(const char *trained_path, const char *converted_path, const qt_options *o, int images) {
  qt_status st = {0};
  qt_dataset train = {0}, test = {0};
  qt_graph *t = NULL, *c = NULL;
  qt_loader *l = NULL;
  int status = 2, n = 0;
  const float *x;
  qt_check_report r;
  if (!(t = qt_qdq_load(trained_path, st.msg)) || !(c = qt_qdq_load(converted_path, st.msg)) ||
      kinds_fit(t, c, trained_path, converted_path, st.msg) ||
      qt_stage_load_data(&o->data, QT_SPLIT_TEST, &train, &test, &st) ||
      !(l = qt_stage_first_images(o, &test, images, &x, &n, &st)) || qt_check(t, c, x, n, &r, st.msg)) {
    fprintf(stderr, "qat_check: %s\n", st.msg);
  } else {
    printf("qat_check: %s vs %s on %d images: %s\n", trained_path, converted_path, n, r.ok ? "PASS" : "FAIL");
    printf(
        "  %d quantization points, %d quantized weights checked; max difference %.1f LSB; %lld rounding-tie "
        "flips\n",
        r.n_checked_points, r.n_checked_weights, r.max_lsb, (long long)r.tie_mismatches);
    if (!r.ok) printf("%s", r.reason);
    status = r.ok ? 0 : 1;
  }
  qt_loader_free(l);
  qt_dataset_free(&train);
  qt_dataset_free(&test);
  qt_graph_free(t);
  qt_graph_free(c);
  return status;
}

int main(int argc, char **argv) {
  qt_memory_policy_init();
  if (argc < 3) return usage();
  qt_cli_data_options D = {.images = 256};
  for (int i = 3; i < argc; i++) {
    const int c = qt_cli_data_option("qat_check", "--images --config", argc, argv, &i, &D);
    if (c <= 0) return c < 0 ? 2 : usage();
  }
  static qt_options o;
  char err[QT_ERR_LEN];
  if (qt_options_load(D.config_path, NULL, 0, &o, err)) {
    fprintf(stderr, "qat_check: %s\n", err);
    return 2;
  }
  return check(argv[1], argv[2], &o, D.images);
}
