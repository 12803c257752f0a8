/* Prepared (training) graphs in the Q/DQ graph file, as qat_train saves model_trained.h5:
 * FashionCNN, ResCNN and a small graph through the oneDNN quantizer, prepare (PTQ: BN folded;
 * QAT: conv_bn with delayed folding), a few observing forward passes in training mode on
 * random batches, eval mode; then save (kind 'prepared', no integer weights) and load. The
 * loaded graph must equal the original field by field and tensor by tensor (flags as
 * documented: calibrated, observers off, fake quant on, observer state empty), give
 * bit-identical eval outputs, save to the same bytes, convert to the same Q/DQ graph as the
 * original, and pass qt_check against that Q/DQ graph read back from its file (what
 * `qat_check model_trained.h5 model_qdq.h5` does). Prepared-only validation errors are
 * checked on the small graph's file. Keeps qdq_prepared_*.h5 and their _io.h5 for read_qdq.py. */
#include <hdf5.h>
#include <hdf5_hl.h>
#include <unistd.h>

#include "tests/qdq/qdq_common.h"

/* The input and output of g for read_qdq.py, beside the file at `path` (<stem>_io.h5). */
static void write_io(const char *path, qt_graph *g) {
  char io[200];
  snprintf(io, sizeof io, "%.*s_io.h5", (int)(strlen(path) - 3), path);
  qdq_write_io(io, g, 99);
}

/* The root attribute `kind` of a file. */
static void expect_kind(const char *path, const char *want) {
  char kind[32] = "";
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0 || H5LTget_attribute_string(f, "/", "kind", kind) < 0 || strcmp(kind, want) != 0)
    qt_test_fail("%s: kind is '%s', want '%s'", path, kind, want);
  if (f >= 0) H5Fclose(f);
}

/* Every weight record of a prepared file has qparams but no weight_int. */
static void expect_no_weight_int(const char *path, const qt_graph *g) {
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  for (int i = 0; f >= 0 && i < g->n_nodes; i++) {
    if (!g->nodes[i].wq) continue;
    char rec[128], wi[160];
    snprintf(rec, sizeof rec, "/quant/weight/%s", g->nodes[i].name);
    snprintf(wi, sizeof wi, "%s/weight_int", rec);
    if (H5Lexists(f, rec, H5P_DEFAULT) <= 0 || H5Lexists(f, wi, H5P_DEFAULT) != 0)
      qt_test_fail("%s: %s missing, or it holds weight_int", path, rec);
  }
  if (f >= 0) H5Fclose(f);
}

/* What a loaded prepared graph must hold beyond the saved fields: calibrated records with
 * observers off and fake quant on, and empty observers of the saved kind and settings. */
static void expect_loaded_flags(const char *what, const qt_graph *p, const qt_graph *h) {
  for (int i = 0; i < h->n_nodes; i++)
    for (int w = 0; w < 2; w++) {
      const qt_qstate *a = w ? p->nodes[i].wq : p->nodes[i].q, *b = w ? h->nodes[i].wq : h->nodes[i].q;
      if (!a || !b) continue;
      if (!b->calibrated || b->observe || !b->fake_quant || b->qweight)
        qt_test_fail("%s: node '%s' %s: loaded flags calibrated %d observe %d fake_quant %d qweight %p", what,
                     h->nodes[i].name, w ? "weight" : "activation", b->calibrated, b->observe, b->fake_quant,
                     (void *)b->qweight);
      const qt_observer *x = &a->obs, *y = &b->obs;
      if (x->kind != y->kind || x->channels != y->channels || x->method != y->method ||
          memcmp(&x->percentile, &y->percentile, sizeof(float)) || memcmp(&x->averaging_constant,
                                                                          &y->averaging_constant, sizeof(float)) ||
          x->bins != y->bins || y->initialized)
        qt_test_fail("%s: node '%s' %s: observer settings differ or the loaded observer is not empty", what,
                     h->nodes[i].name, w ? "weight" : "activation");
    }
}

static int count_ops(const qt_graph *g, qt_op op) {
  int n = 0;
  for (int i = 0; i < g->n_nodes; i++) n += g->nodes[i].op == op;
  return n;
}

static void one(const char *what, qt_graph *g, const qt_quantizer_config *qc, qt_prepare_mode mode, const char *path) {
  char err[QT_ERR_LEN];
  qt_graph *p = qdq_prepared_graph(g, qc, mode, 2, 42), *h = NULL, *c1 = NULL, *c2 = NULL, *hc = NULL;
  if (!p) return;
  const int n_fq = count_ops(p, QT_OP_FAKE_QUANT), n_cbn = count_ops(p, QT_OP_CONV_BN);
  if (n_fq < 2 || (mode == QT_PREPARE_QAT) != (n_cbn > 0))
    qt_test_fail("%s: prepared graph has %d fake_quant and %d conv_bn nodes", what, n_fq, n_cbn);
  if (mode == QT_PREPARE_QAT) /* one frozen conv_bn, so bn_frozen travels */
    for (int i = 0; i < p->n_nodes; i++)
      if (p->nodes[i].op == QT_OP_CONV_BN) {
        p->nodes[i].bn_frozen = 1;
        break;
      }
  if (qt_qdq_save(path, p, err)) {
    qt_test_fail("%s: save: %s", what, err);
    goto done;
  }
  expect_kind(path, "prepared");
  expect_no_weight_int(path, p);
  qdq_expect_no_times(path);
  if (!(h = qt_qdq_load(path, err))) {
    qt_test_fail("%s: load: %s", what, err);
    goto done;
  }
  expect_loaded_flags(what, p, h);
  qt_set_observers(p, 0); /* the documented difference; in eval mode observers do not run anyway */
  qdq_same_graph(what, p, h);
  qdq_check_same_outputs(what, p, h, 6, 7);

  /* Deterministic: the loaded graph saves to the same bytes. */
  char again[200];
  snprintf(again, sizeof again, "%s.again.h5", path);
  if (qt_qdq_save(again, h, err)) qt_test_fail("%s: second save: %s", what, err);
  long la = 0, lb = 0;
  unsigned char *a = qdq_read_bytes(path, &la), *b = qdq_read_bytes(again, &lb);
  if (la != lb || memcmp(a, b, (size_t)la) != 0) qt_test_fail("%s: saving the loaded graph gives other bytes", what);
  free(a);
  free(b);
  unlink(again);

  /* The loaded graph converts to the same Q/DQ graph as the original ... */
  if (!(c1 = qt_convert(p, err)) || !(c2 = qt_convert(h, err))) {
    qt_test_fail("%s: convert: %s", what, err);
    goto done;
  }
  char wc[160];
  snprintf(wc, sizeof wc, "%s converted", what);
  qdq_same_graph(wc, c1, c2);
  qdq_check_same_outputs(wc, c1, c2, 4, 8);
  /* ... and checks against it read back from its file, as qat_check does. */
  char qpath[200];
  snprintf(qpath, sizeof qpath, "%.*s_qdq.h5", (int)(strlen(path) - 3), path);
  if (qt_qdq_save(qpath, c2, err) || !(hc = qt_qdq_load(qpath, err))) {
    qt_test_fail("%s: Q/DQ file: %s", what, err);
    goto done;
  }
  expect_kind(qpath, "qdq");
  unlink(qpath);
  const qt_value *in = &h->values[h->input];
  const int n = 8;
  const int64_t xn = n * in->shape[0] * in->shape[1] * in->shape[2];
  float *x = malloc((size_t)xn * sizeof(float));
  qt_test_fill_uniform(x, xn, -0.8f, 2.0f, 5);
  qt_check_report r;
  if (qt_check(h, hc, x, n, &r, err)) qt_test_fail("%s: check could not run: %s", what, err);
  else if (!r.ok || r.n_checked_points != n_fq || r.n_checked_weights < 2)
    qt_test_fail("%s: check of the loaded prepared graph against its Q/DQ graph: ok %d, %d points (want %d), %d "
                 "weights:\n%s",
                 what, r.ok, r.n_checked_points, n_fq, r.n_checked_weights, r.reason);
  if (getenv("QT_TEST_VERBOSE"))
    fprintf(stderr, "%s: %d nodes (%d fake_quant, %d conv_bn), check %s, max %.1f LSB\n", what, h->n_nodes, n_fq,
            n_cbn, r.ok ? "ok" : "FAIL", r.max_lsb);
  free(x);
  write_io(path, h);
done:
  qt_graph_free(hc);
  qt_graph_free(c2);
  qt_graph_free(c1);
  qt_graph_free(h);
  qt_graph_free(p);
}

static void models(void) {
  const char *names[] = {"fashion_cnn", "res_cnn"};
  for (int m = 0; m < 2; m++) {
    char err[QT_ERR_LEN], what[128], path[160];
    qt_graph *g = qt_model_build(names[m], err);
    QT_ASSERT(g, "%s", err);
    qdq_randomize(g, 11 + (uint64_t)m);
    qt_quantizer_config qc;
    qt_quantizer_config_default(&qc);
    /* PTQ: histogram activations (method and percentile travel); QAT: W4A4, moving averages. */
    qc.activation_observer = QT_OBSERVER_HISTOGRAM;
    qc.activation_method = QT_RANGE_PERCENTILE;
    qc.percentile = 99.9f;
    snprintf(what, sizeof what, "%s PTQ", names[m]);
    snprintf(path, sizeof path, "qdq_prepared_%s_ptq.h5", names[m]);
    one(what, g, &qc, QT_PREPARE_PTQ, path);
    qt_quantizer_config_default(&qc);
    qc.weight_bits = 4;
    qc.activation_bits = 4;
    qc.weight_observer = QT_OBSERVER_MOVING_AVERAGE;
    snprintf(what, sizeof what, "%s QAT W4A4", names[m]);
    snprintf(path, sizeof path, "qdq_prepared_%s_qat.h5", names[m]);
    one(what, g, &qc, QT_PREPARE_QAT, path);
    qt_graph_free(g);
  }
}

/* ---- prepared-only validation, on the small graph's file ------------------------------- */

#define BASE "qdq_prepared_err_base.h5"

/* The small graph's QAT layout: 0 input, 1 input.fq, 2 conv1 (conv_bn), 3 relu1, 4 relu1.fq,
 * 5 pool1, 6 conv2 (conv_bn with bias), 7 relu2, 8 relu2.fq, 9 flatten, 10 fc, 11 fc.fq. */
static void e_kind_qdq(hid_t f) { qdq_set_str(f, "/", "kind", "qdq"); }
static void e_kind_absent(hid_t f) { QT_ASSERT(H5Adelete(f, "kind") >= 0, "delete kind"); }
static void e_kind_unknown(hid_t f) { qdq_set_str(f, "/", "kind", "training"); }
static void e_quantize_op(hid_t f) { qdq_set_str(f, "/nodes/0003_relu1", "op", "quantize"); }
static void e_weight_int(hid_t f) {
  int zeros[10 * 96] = {0};
  hsize_t d[2] = {10, 96};
  QT_ASSERT(H5LTmake_dataset_int(f, "/quant/weight/fc/weight_int", 2, d, zeros) >= 0, "make weight_int");
}
static void e_missing_bn_weight(hid_t f) {
  QT_ASSERT(H5Adelete_by_name(f, "/nodes/0006_conv2", "bn_weight", H5P_DEFAULT) >= 0, "delete bn_weight");
}
static void e_missing_running_var(hid_t f) {
  QT_ASSERT(H5Adelete_by_name(f, "/nodes/0002_conv1", "running_var", H5P_DEFAULT) >= 0, "delete running_var");
}
static void e_bn_slot_buffer(hid_t f) { qdq_set_str(f, "/nodes/0006_conv2", "bn_bias", "conv2.bn.running_var"); }
static void e_bn_shape(hid_t f) { /* a running mean of 5 channels for a conv of 6 */
  const char *path = "/tensors/conv2.bn.running_mean";
  int index = -1, node = -1, is_buffer = 1;
  QT_ASSERT(H5LTget_attribute_int(f, path, "index", &index) >= 0 && H5LTget_attribute_int(f, path, "node", &node) >= 0,
            "read %s", path);
  QT_ASSERT(H5Ldelete(f, path, H5P_DEFAULT) >= 0, "delete %s", path);
  float zeros[5] = {0};
  hsize_t d[1] = {5};
  QT_ASSERT(H5LTmake_dataset_float(f, path, 1, d, zeros) >= 0 && H5LTset_attribute_int(f, path, "index", &index, 1) >= 0 &&
                H5LTset_attribute_int(f, path, "node", &node, 1) >= 0 &&
                H5LTset_attribute_int(f, path, "is_buffer", &is_buffer, 1) >= 0,
            "remake %s", path);
}
static void e_eps(hid_t f) {
  float eps = 0.0f;
  QT_ASSERT(H5LTset_attribute_float(f, "/nodes/0002_conv1", "eps", &eps, 1) >= 0, "set eps");
}
static void e_fq_without_record(hid_t f) {
  QT_ASSERT(H5Ldelete(f, "/quant/activation/relu1.fq", H5P_DEFAULT) >= 0, "delete record");
}
static void e_record_on_relu(hid_t f) {
  QT_ASSERT(H5Ocopy(f, "/quant/activation/relu1.fq", f, "/quant/activation/relu1", H5P_DEFAULT, H5P_DEFAULT) >= 0,
            "copy");
  int node = 3;
  QT_ASSERT(H5LTset_attribute_int(f, "/quant/activation/relu1", "node", &node, 1) >= 0, "set node");
}
static void e_fq_shape(hid_t f) { qdq_set_value_dim(f, 4, 2, 3); /* relu1.fq: 8x8x3 instead of 8x8x4 */ }

static const qdq_error_case prepared_errors[] = {
    {"kind_qdq", e_kind_qdq, "node 1 'input.fq': op 'fake_quant' belongs to prepared graphs"},
    {"kind_absent", e_kind_absent, "node 1 'input.fq': op 'fake_quant' belongs to prepared graphs"},
    {"kind_unknown", e_kind_unknown, "kind is 'training', want 'qdq' or 'prepared'"},
    {"quantize_op", e_quantize_op, "node 3 'relu1': op 'quantize' belongs to Q/DQ graphs, not to prepared"},
    {"weight_int", e_weight_int, "/quant/weight/fc: holds 'weight_int', but a prepared graph"},
    {"missing_bn_weight", e_missing_bn_weight, "node 6 'conv2': op 'conv_bn' needs a bn_weight tensor"},
    {"missing_running_var", e_missing_running_var, "node 2 'conv1': op 'conv_bn' needs a running_var"},
    {"bn_slot_buffer", e_bn_slot_buffer, "node 6 'conv2': bn_bias tensor 'conv2.bn.running_var' is a buffer, want a parameter"},
    {"bn_shape", e_bn_shape, "tensor 'conv2.bn.running_mean' has shape (5), want (6)"},
    {"eps", e_eps, "node 2 'conv1': eps 0 must be finite and > 0"},
    {"fq_without_record", e_fq_without_record, "node 4 'relu1.fq': fake_quant without an activation quantization record"},
    {"record_on_relu", e_record_on_relu, "node 3 'relu1': op 'relu' carries an activation quantization"},
    {"fq_shape", e_fq_shape, "output value 'relu1.fq' has shape (8, 8, 3), op 'fake_quant' computes (8, 8, 4)"},
};

static void validation(void) {
  char err[QT_ERR_LEN];
  qt_graph *g = qdq_small_fp32_graph();
  qt_quantizer_config qc;
  qt_quantizer_config_default(&qc);
  qt_graph *p = qdq_prepared_graph(g, &qc, QT_PREPARE_QAT, 2, 3);
  qt_graph_free(g);
  if (!p) return;
  const char *layout[] = {"input", "input.fq", "conv1", "relu1", "relu1.fq", "pool1", "conv2", "relu2", "relu2.fq",
                          "flatten", "fc", "fc.fq"};
  int same_layout = p->n_nodes == 12;
  for (int i = 0; same_layout && i < 12; i++) same_layout = strcmp(p->nodes[i].name, layout[i]) == 0;
  if (!same_layout || p->nodes[2].op != QT_OP_CONV_BN || p->nodes[6].op != QT_OP_CONV_BN ||
      p->nodes[6].param[QT_P_BIAS] < 0 || !p->nodes[10].wq) {
    qt_test_fail("the small prepared graph's layout changed; update the edits in this test");
    qt_graph_free(p);
    return;
  }
  QT_ASSERT(qt_qdq_save(BASE, p, err) == 0, "%s", err);
  qt_graph *h = qt_qdq_load(BASE, err);
  QT_CHECK(h != NULL);
  qt_graph_free(h);

  qdq_expect_load_errors(BASE, "qdq_prepared_err_", prepared_errors, (int)(sizeof prepared_errors / sizeof prepared_errors[0]));

  /* Saves the file cannot represent are refused, naming the node; the old file stays. */
  long len0 = 0, len1 = 0;
  unsigned char *before = qdq_read_bytes(BASE, &len0);
  qt_node *fq = &p->nodes[4], *conv = &p->nodes[6];
  fq->q->calibrated = 0;
  if (qt_qdq_save(BASE, p, err) == 0 || !strstr(err, "node 4 'relu1.fq'") || !strstr(err, "no qparams yet"))
    qt_test_fail("save of an uncalibrated fake quant: '%s'", err);
  fq->q->calibrated = 1;
  conv->wq->fake_quant = 0;
  if (qt_qdq_save(BASE, p, err) == 0 || !strstr(err, "node 6 'conv2'") || !strstr(err, "fake quant off"))
    qt_test_fail("save with weight fake quant off: '%s'", err);
  conv->wq->fake_quant = 1;
  qt_node *fc = &p->nodes[10];
  const int64_t nw = p->tensors[fc->param[QT_P_WEIGHT]].numel;
  fc->wq->qweight = calloc((size_t)nw, sizeof(int32_t));
  fc->wq->n_qweight = nw;
  if (qt_qdq_save(BASE, p, err) == 0 || !strstr(err, "node 1 'input.fq': op 'fake_quant' belongs to prepared graphs") ||
      !strstr(err, "node 10 'fc': a weight quantized to integers belongs to Q/DQ graphs"))
    qt_test_fail("save of a graph mixing prepared and Q/DQ parts: '%s'", err);
  free(fc->wq->qweight);
  fc->wq->qweight = NULL;
  fc->wq->n_qweight = 0;
  unsigned char *after = qdq_read_bytes(BASE, &len1);
  if (len0 != len1 || memcmp(before, after, (size_t)len0) != 0) qt_test_fail("a refused save changed %s", BASE);
  free(before);
  free(after);
  unlink(BASE);

  /* The small graph round trip too (read_qdq.py reads it). */
  one("small QAT", (g = qdq_small_fp32_graph()), &qc, QT_PREPARE_QAT, "qdq_prepared_small_qat.h5");
  qt_graph_free(g);
  qt_graph_free(p);
}

int main(void) {
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  models();
  validation();
  return qt_test_finish();
}
