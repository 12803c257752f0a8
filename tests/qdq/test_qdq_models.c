/* Q/DQ file round trip of real convert graphs: every preset model (FashionCNN, FashionMLP,
 * the residual CNN) through the oneDNN quantizer, prepare (PTQ: BN folded; QAT: conv_bn with
 * delayed folding), one observing forward pass in training mode on a random batch, and
 * convert; the saved and loaded graph must equal the converted one and give bit-identical
 * outputs. Keeps qdq_model_<model>_{ptq,qat}.h5 and their _io.h5 files for read_qdq.py. */
#include <hdf5.h>
#include <hdf5_hl.h>
#include <unistd.h>

#include "tests/qdq/qdq_common.h"

/* Keeps the file and writes <file>_io.h5 for read_qdq.py's reference interpreter: /raw, 4
 * random uint8 samples (N, H, W, C); /input, those pixels preprocessed as the graph's input
 * description says, (pixel / 255 - mean[c]) / std[c] in float32 (the data loader's formula);
 * /output, the graph's output on /input. */
static void write_io(const char *path, qt_graph *g) {
  const qt_value *in = &g->values[g->input];
  const qt_input_preprocessing *pre = &g->input_pre;
  QT_ASSERT(pre->set && pre->channels == in->shape[2], "%s: no input preprocessing", path);
  const int n = 4;
  int64_t numel = 0, xn = n * in->shape[0] * in->shape[1] * in->shape[2];
  float *u = malloc((size_t)xn * sizeof(float)), *x = malloc((size_t)xn * sizeof(float));
  unsigned char *raw = malloc((size_t)xn);
  QT_ASSERT(u && x && raw, "out of memory");
  qt_test_fill_uniform(u, xn, 0.0f, 256.0f, 99);
  for (int64_t k = 0; k < xn; k++) {
    const int c = (int)(k % pre->channels);
    raw[k] = (unsigned char)(u[k] >= 255.0f ? 255 : (int)u[k]);
    x[k] = ((float)raw[k] / 255.0f - pre->mean[c]) / pre->std[c];
  }
  qt_ctx *ctx = qt_ctx_create();
  qt_ctx_set_grad(ctx, 0);
  const int64_t xs[4] = {n, in->shape[0], in->shape[1], in->shape[2]};
  qt_tensor *xt = qt_tensor_wrap(ctx, QT_F32, 4, xs, x);
  qt_tensor *yt = qt_graph_forward(g, ctx, xt);
  QT_ASSERT(yt, "%s: forward: %s", path, g->error);
  numel = qt_tensor_numel(yt);
  char io[200];
  snprintf(io, sizeof io, "%.*s_io.h5", (int)(strlen(path) - 3), path);
  hid_t f = H5Fcreate(io, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  hsize_t xd[4] = {(hsize_t)n, (hsize_t)in->shape[0], (hsize_t)in->shape[1], (hsize_t)in->shape[2]};
  hsize_t yd[2] = {(hsize_t)n, (hsize_t)(numel / n)};
  QT_CHECK(f >= 0 && H5LTmake_dataset_float(f, "input", 4, xd, x) >= 0 &&
           H5LTmake_dataset(f, "raw", 4, xd, H5T_NATIVE_UINT8, raw) >= 0 &&
           H5LTmake_dataset_float(f, "output", 2, yd, qt_f32(yt)) >= 0);
  if (f >= 0) H5Fclose(f);
  qt_ctx_free(ctx);
  free(u);
  free(x);
  free(raw);
}

/* eps, momentum and bn_frozen belong to batch_norm / conv_bn; every other node has them 0
 * (docs/qdq_format.md: attributes an op does not use are 0). */
static void check_bn_attrs_zero(const char *what, const qt_graph *g) {
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    if (n->op == QT_OP_BATCH_NORM || n->op == QT_OP_CONV_BN) continue;
    if (n->attr.eps != 0.0f || n->attr.momentum != 0.0f || n->bn_frozen != 0)
      qt_test_fail("%s: node %d '%s' (%s) has eps %g, momentum %g, bn_frozen %d; want 0", what, i, n->name,
                   qt_op_name(n->op), n->attr.eps, n->attr.momentum, n->bn_frozen);
  }
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
  /* The pipeline records the input preprocessing; prepare and convert carry it to the file. */
  const int C = (int)g->values[g->input].shape[2];
  float mean[QT_MAX_INPUT_CHANNELS], std[QT_MAX_INPUT_CHANNELS];
  for (int c = 0; c < C; c++) {
    mean[c] = 0.2860f + 0.05f * (float)c;
    std[c] = 0.3530f - 0.02f * (float)c;
  }
  if (qt_graph_set_input_preprocessing(g, mean, std, C, err)) qt_test_fail("%s: set preprocessing: %s", what, err);
  if (qt_graph_set_input_preprocessing(g, mean, std, C + 1, err) == 0 || !strstr(err, "channels"))
    qt_test_fail("%s: %d preprocessing channels for a %d-channel input accepted ('%s')", what, C + 1, C, err);
  qt_quantizer_config qc = qt_test_quantizer_config(weight_bits, activation_bits);
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
  if (memcmp(&p->input_pre, &g->input_pre, sizeof g->input_pre) || memcmp(&c->input_pre, &g->input_pre, sizeof g->input_pre))
    qt_test_fail("%s: prepare or convert lost the input preprocessing", what);
  check_bn_attrs_zero(what, c);
  if (mode == QT_PREPARE_PTQ) check_bn_attrs_zero(what, p);
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
  qdq_same_graph(what, c, h); /* includes the input preprocessing */
  check_bn_attrs_zero(what, h);
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
