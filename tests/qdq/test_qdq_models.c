/* Q/DQ file round trip of real convert graphs: every preset model (FashionCNN, FashionMLP,
 * the residual CNN) through the oneDNN quantizer, prepare (PTQ: BN folded; QAT: conv_bn with
 * delayed folding), one observing forward pass in training mode on a random batch, and
 * convert; the saved and loaded graph must equal the converted one and give bit-identical
 * outputs. Keeps qdq_model_<model>_{ptq,qat}.h5 and their _io.h5 files for read_qdq.py. */
#include <hdf5.h>
#include <hdf5_hl.h>
#include <unistd.h>

#include "tests/qdq/qdq_common.h"

/* Keeps the file and writes <file>_io.h5 (/input, /output of 4 random samples) for
 * read_qdq.py's reference interpreter. */
static void write_io(const char *path, qt_graph *g) {
  const qt_value *in = &g->values[g->input];
  const int n = 4;
  int64_t numel = 0, xn = n * in->shape[0] * in->shape[1] * in->shape[2];
  float *y = qdq_forward(g, n, 99, &numel);
  float *x = malloc((size_t)xn * sizeof(float));
  qt_test_fill_uniform(x, xn, -1.0f, 1.0f, 99);
  char io[200];
  snprintf(io, sizeof io, "%.*s_io.h5", (int)(strlen(path) - 3), path);
  hid_t f = H5Fcreate(io, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  hsize_t xd[4] = {(hsize_t)n, (hsize_t)in->shape[0], (hsize_t)in->shape[1], (hsize_t)in->shape[2]};
  hsize_t yd[2] = {(hsize_t)n, (hsize_t)(numel / n)};
  QT_CHECK(f >= 0 && y && H5LTmake_dataset_float(f, "input", 4, xd, x) >= 0 &&
           H5LTmake_dataset_float(f, "output", 2, yd, y) >= 0);
  if (f >= 0) H5Fclose(f);
  free(x);
  free(y);
}

static void one(const char *model, qt_prepare_mode mode, int weight_bits, int activation_bits) {
  char err[QT_ERR_LEN], what[128];
  snprintf(what, sizeof what, "%s %s W%dA%d", model, mode == QT_PREPARE_QAT ? "QAT" : "PTQ", weight_bits,
           activation_bits);
  qt_graph *g = qt_model_build(model, err);
  if (!g) {
    qt_test_fail("%s: %s", what, err);
    return;
  }
  qt_quantizer_config qc;
  qt_quantizer_config_default(&qc);
  qc.weight_bits = weight_bits;
  qc.activation_bits = activation_bits;
  qt_annotations ann;
  qt_graph *p = NULL, *c = NULL, *h = NULL;
  if (qt_test_quantizer_onednn(g, &qc, QT_ISA_AUTO, &ann, err)) {
    qt_test_fail("%s: quantizer: %s", what, err);
    goto done;
  }
  p = qt_prepare(g, &ann, mode, err);
  qt_annotations_free(&ann);
  if (!p) {
    qt_test_fail("%s: prepare: %s", what, err);
    goto done;
  }
  /* Observe one random batch in training mode (BN batch statistics for QAT). */
  qt_graph_set_mode(p, QT_MODE_TRAIN);
  qt_set_observers(p, 1);
  int64_t n = 0;
  float *y = qdq_forward(p, 16, 42, &n);
  free(y);
  if (!y) goto done;
  c = qt_convert(p, err);
  if (!c) {
    qt_test_fail("%s: convert: %s", what, err);
    goto done;
  }
  char path[160];
  snprintf(path, sizeof path, "qdq_model_%s_%s.h5", model, mode == QT_PREPARE_QAT ? "qat" : "ptq");
  if (qt_qdq_save(path, c, err)) {
    qt_test_fail("%s: save: %s", what, err);
    goto done;
  }
  h = qt_qdq_load(path, err);
  if (!h) {
    qt_test_fail("%s: load: %s", what, err);
    goto done;
  }
  int n_records = 0;
  for (int i = 0; i < c->n_nodes; i++) n_records += (c->nodes[i].q != NULL) + (c->nodes[i].wq != NULL);
  if (n_records < 3) qt_test_fail("%s: the convert graph has only %d quantization records", what, n_records);
  if (getenv("QT_TEST_VERBOSE"))
    fprintf(stderr, "%s: %d nodes, %d tensors, %d quantization records\n", what, c->n_nodes, c->n_tensors, n_records);
  qdq_same_graph(what, c, h);
  qdq_check_same_outputs(what, c, h, 8, 7);
  write_io(path, h);
done:
  qt_graph_free(h);
  qt_graph_free(c);
  qt_graph_free(p);
  qt_graph_free(g);
}

int main(void) {
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  char names[256];
  snprintf(names, sizeof names, "%s", qt_model_names());
  for (char *save = NULL, *m = strtok_r(names, "|", &save); m; m = strtok_r(NULL, "|", &save)) {
    one(m, QT_PREPARE_PTQ, 8, 8);
    one(m, QT_PREPARE_QAT, 4, 4);
  }
  return qt_test_finish();
}
