/* Helpers shared by the Q/DQ file tests: a small hand-built convert graph (input 8x8x3 ->
 * Q/DQ -> conv2d with per-channel int weights + bias -> relu -> Q/DQ -> max_pool -> flatten ->
 * linear with int weights -> Q/DQ), a graph using every fp32 op, prepared (training) graphs
 * observed on random batches, a field-by-field graph comparison and a forward pass into a
 * malloc'ed copy, and the file edits the validation tests share. Header-only: each test is
 * one program. */
#ifndef QT_QDQ_COMMON_H
#define QT_QDQ_COMMON_H

#include <hdf5.h>
#include <hdf5_hl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qat/qat.h"
#include "tests/common/graph_util.h"
#include "tests/common/testutil.h"
#include "tests/common/quantizer_util.h"

static inline qt_qspec qdq_spec(int bits, int is_signed, int qmin, int qmax, int symmetric, int per_channel) {
  qt_qspec s;
  memset(&s, 0, sizeof s);
  s.bits = bits;
  s.is_signed = is_signed;
  s.qmin = qmin;
  s.qmax = qmax;
  s.symmetric = symmetric;
  s.per_channel = per_channel;
  s.observer = per_channel ? QT_OBSERVER_MINMAX : QT_OBSERVER_MOVING_AVERAGE;
  s.method = QT_RANGE_MINMAX;
  return s;
}

static inline qt_qstate *qdq_act_state(float scale, int zp) {
  qt_qspec s = qdq_spec(8, 0, 0, 255, 0, 0);
  return qt_test_qstate(&s, 1, scale, zp);
}

/* Weight quantization of node n with spec s: per-channel symmetric scales from max |w|, then
 * the integer weights (convert's job, done by hand here). */
static inline void qdq_quantize_weight(qt_graph *g, int node, const qt_qspec *s) {
  char err[QT_ERR_LEN];
  qt_node *n = &g->nodes[node];
  const qt_param *w = &g->tensors[n->param[QT_P_WEIGHT]];
  const int ch = s->per_channel ? (int)w->shape[0] : 1;
  const int64_t inner = w->numel / ch;
  qt_qstate_free(n->wq);
  n->wq = qt_qstate_create(s, ch, err);
  QT_ASSERT(n->wq, "%s", err);
  const float *wd = qt_graph_tensor_data(g, n->param[QT_P_WEIGHT]);
  for (int c = 0; c < ch; c++) {
    float m = 0;
    for (int64_t k = 0; k < inner; k++) m = fmaxf(m, fabsf(wd[c * inner + k]));
    n->wq->scale[c] = fmaxf(m, 1e-6f) / (float)(s->symmetric ? s->qmax : (s->qmax - s->qmin));
    n->wq->zero_point[c] = s->symmetric ? 0 : (s->qmin + s->qmax + 1) / 2;
  }
  n->wq->n_qweight = w->numel;
  n->wq->qweight = malloc((size_t)w->numel * sizeof(int32_t));
  qt_quantize(n->wq->qweight, wd, 1, ch, inner, n->wq->scale, n->wq->zero_point, s->qmin, s->qmax);
  n->wq->calibrated = 1;
  n->wq->observe = 0;
}

/* Appends quantize -> dequantize after value x; returns the dequantized value. */
static inline int qdq_pair(qt_graph *g, const char *prefix, int x, float scale, int zp) {
  return qt_test_append_qdq(g, prefix, x, qdq_act_state(scale, zp), qdq_act_state(scale, zp));
}

static inline void qdq_fill_params(qt_graph *g, uint64_t seed) {
  for (int t = 0; t < g->n_tensors; t++) {
    qt_param *p = &g->tensors[t];
    float *d = qt_graph_tensor_data(g, t);
    if (strstr(p->name, "running_var")) qt_test_fill_uniform(d, p->numel, 0.5f, 1.5f, seed + (uint64_t)t);
    else qt_test_fill_uniform(d, p->numel, -0.5f, 0.5f, seed + (uint64_t)t);
  }
}

/* The brief's graph. Node 3 is conv1. linear_spec NULL: 4-bit signed symmetric. */
static inline qt_graph *qdq_small_graph(const qt_qspec *linear_spec) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_graph_create("qdq_small");
  int x = qt_graph_input(g, "input", 8, 8, 3);
  x = qdq_pair(g, "input", x, 2.0f / 255.0f, 128);
  x = qt_graph_conv2d(g, "conv1", x, 4, 3, 1, 1, 1, 1);
  x = qt_graph_relu(g, "relu1", x);
  x = qdq_pair(g, "relu1", x, 0.01f, 0);
  x = qt_graph_max_pool2d(g, "pool1", x, 2, 2, 0);
  x = qt_graph_flatten(g, "flatten", x);
  x = qt_graph_linear(g, "fc", x, 10, 1);
  x = qdq_pair(g, "fc", x, 0.02f, 128);
  QT_ASSERT(qt_graph_finalize(g, x, err) == 0, "%s", err);
  qdq_fill_params(g, 11);
  qt_qspec cs = qdq_spec(8, 1, -64, 63, 1, 1); /* 7-bit weights for a non-VNNI CPU */
  qt_qspec ls = linear_spec ? *linear_spec : qdq_spec(4, 1, -8, 7, 1, 1);
  qdq_quantize_weight(g, qt_graph_find_node(g, "conv1"), &cs);
  qdq_quantize_weight(g, qt_graph_find_node(g, "fc"), &ls);
  qt_graph_set_training(g, 0);
  return g;
}

/* Every fp32 op: conv -> batch_norm -> relu -> avg_pool -> (1x1 conv) + add -> global_avg_pool
 * -> Q/DQ -> linear, with a grouped conv and frozen BN. */
static inline qt_graph *qdq_all_ops_graph(void) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_graph_create("qdq_all_ops");
  int x = qt_graph_input(g, "image", 9, 9, 4);
  int c = qt_graph_conv2d(g, "conv_a", x, 8, 3, 2, 1, 2, 0);
  c = qt_graph_batch_norm(g, "bn_a", c);
  c = qt_graph_relu(g, "relu_a", c);
  int p = qt_graph_avg_pool2d(g, "avg", c, 3, 1, 1);
  int s = qt_graph_conv2d(g, "conv_b", p, 8, 1, 1, 0, 1, 1);
  int a = qt_graph_add(g, "residual", p, s);
  int gp = qt_graph_global_avg_pool(g, "gap", a);
  gp = qdq_pair(g, "gap", gp, 0.05f, 3);
  int y = qt_graph_linear(g, "head", gp, 5, 1);
  QT_ASSERT(qt_graph_finalize(g, y, err) == 0, "%s", err);
  qdq_fill_params(g, 5);
  qt_qspec hs = qdq_spec(8, 1, -128, 127, 1, 1);
  qdq_quantize_weight(g, qt_graph_find_node(g, "head"), &hs);
  qt_freeze_bn(g, 1);
  qt_graph_set_training(g, 0);
  return g;
}

/* Non-trivial parameters (PyTorch's initialization) and BN gamma, beta and running
 * statistics (running_var > 0), so folding and the conv_bn scale factor matter. */
static inline void qdq_randomize(qt_graph *g, uint64_t seed) {
  qt_graph_init_params(g, seed);
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_node *n = &g->nodes[i];
    if (n->op != QT_OP_BATCH_NORM) continue;
    const int C = (int)g->tensors[n->param[QT_P_GAMMA]].numel;
    qt_test_fill_uniform(qt_graph_tensor_data(g, n->param[QT_P_GAMMA]), C, 0.5f, 1.5f, seed + 4 * (uint64_t)i);
    qt_test_fill_uniform(qt_graph_tensor_data(g, n->param[QT_P_BETA]), C, -0.2f, 0.2f, seed + 4 * (uint64_t)i + 1);
    qt_test_fill_uniform(qt_graph_tensor_data(g, n->buffer[QT_B_RUNNING_MEAN]), C, -0.3f, 0.3f, seed + 4 * (uint64_t)i + 2);
    qt_test_fill_uniform(qt_graph_tensor_data(g, n->buffer[QT_B_RUNNING_VAR]), C, 0.25f, 2.0f, seed + 4 * (uint64_t)i + 3);
  }
}

/* An fp32 graph small enough to fuzz: conv (no bias) -> bn -> relu -> max_pool -> conv (bias)
 * -> bn -> relu -> flatten -> linear. QAT turns both conv->bn into conv_bn. */
static inline qt_graph *qdq_small_fp32_graph(void) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_graph_create("qdq_small_prepared");
  int x = qt_graph_input(g, "input", 8, 8, 3);
  x = qt_graph_conv2d(g, "conv1", x, 4, 3, 1, 1, 1, 0);
  x = qt_graph_batch_norm(g, "bn1", x);
  x = qt_graph_relu(g, "relu1", x);
  x = qt_graph_max_pool2d(g, "pool1", x, 2, 2, 0);
  x = qt_graph_conv2d(g, "conv2", x, 6, 3, 1, 1, 1, 1);
  x = qt_graph_batch_norm(g, "bn2", x);
  x = qt_graph_relu(g, "relu2", x);
  x = qt_graph_flatten(g, "flatten", x);
  x = qt_graph_linear(g, "fc", x, 10, 1);
  QT_ASSERT(qt_graph_finalize(g, x, err) == 0, "%s", err);
  qdq_randomize(g, 21);
  return g;
}

static inline int qdq_same_qstate(const char *what, const qt_qstate *a, const qt_qstate *b) {
  if (!a || !b) {
    if (a != b) qt_test_fail("%s: one graph has the record, the other not", what);
    return a == b;
  }
  const qt_qspec *x = &a->spec, *y = &b->spec;
  if (x->bits != y->bits || x->qmin != y->qmin || x->qmax != y->qmax || x->is_signed != y->is_signed ||
      x->symmetric != y->symmetric || x->per_channel != y->per_channel || x->observer != y->observer ||
      x->method != y->method || memcmp(&x->percentile, &y->percentile, sizeof(float)) != 0) {
    qt_test_fail("%s: specs differ (bits %d/%d, qmin %d/%d, qmax %d/%d)", what, x->bits, y->bits, x->qmin, y->qmin,
                 x->qmax, y->qmax);
    return 0;
  }
  if (a->channels != b->channels || memcmp(a->scale, b->scale, (size_t)a->channels * sizeof(float)) != 0 ||
      memcmp(a->zero_point, b->zero_point, (size_t)a->channels * sizeof(int32_t)) != 0) {
    qt_test_fail("%s: channels/scale/zero_point differ", what);
    return 0;
  }
  if (a->calibrated != b->calibrated || a->observe != b->observe || a->fake_quant != b->fake_quant) {
    qt_test_fail("%s: flags differ (calibrated %d/%d observe %d/%d fake_quant %d/%d)", what, a->calibrated,
                 b->calibrated, a->observe, b->observe, a->fake_quant, b->fake_quant);
    return 0;
  }
  if (a->n_qweight != b->n_qweight || (a->qweight == NULL) != (b->qweight == NULL) ||
      (a->qweight && memcmp(a->qweight, b->qweight, (size_t)a->n_qweight * sizeof(int32_t)) != 0)) {
    qt_test_fail("%s: integer weights differ", what);
    return 0;
  }
  return 1;
}

/* Field-by-field equality; reports the first difference under `what`. */
static inline int qdq_same_graph(const char *what, const qt_graph *a, const qt_graph *b) {
  if (strcmp(a->name, b->name) || a->n_nodes != b->n_nodes || a->n_values != b->n_values ||
      a->n_tensors != b->n_tensors || a->input != b->input || a->output != b->output) {
    qt_test_fail("%s: graph header differs ('%s'/'%s', %d/%d nodes, %d/%d values, %d/%d tensors)", what, a->name,
                 b->name, a->n_nodes, b->n_nodes, a->n_values, b->n_values, a->n_tensors, b->n_tensors);
    return 0;
  }
  if (memcmp(&a->input_pre, &b->input_pre, sizeof a->input_pre)) {
    qt_test_fail("%s: input preprocessing differs (set %d/%d, %d/%d channels)", what, a->input_pre.set,
                 b->input_pre.set, a->input_pre.channels, b->input_pre.channels);
    return 0;
  }
  char w[256];
  for (int i = 0; i < a->n_nodes; i++) {
    const qt_node *x = &a->nodes[i], *y = &b->nodes[i];
    snprintf(w, sizeof w, "%s: node %d '%s'", what, i, x->name);
    if (x->op != y->op || strcmp(x->name, y->name) || x->n_inputs != y->n_inputs || x->output != y->output ||
        memcmp(x->inputs, y->inputs, (size_t)x->n_inputs * sizeof(int)) ||
        memcmp(&x->attr, &y->attr, sizeof x->attr) || memcmp(x->param, y->param, sizeof x->param) ||
        memcmp(x->buffer, y->buffer, sizeof x->buffer) || x->bn_frozen != y->bn_frozen || x->training != y->training) {
      qt_test_fail("%s: op, name, ids, attributes, slots or mode differ", w);
      return 0;
    }
    char wq[300];
    snprintf(wq, sizeof wq, "%s activation", w);
    if (!qdq_same_qstate(wq, x->q, y->q)) return 0;
    snprintf(wq, sizeof wq, "%s weight", w);
    if (!qdq_same_qstate(wq, x->wq, y->wq)) return 0;
  }
  for (int v = 0; v < a->n_values; v++) {
    const qt_value *x = &a->values[v], *y = &b->values[v];
    if (strcmp(x->name, y->name) || x->ndim != y->ndim || memcmp(x->shape, y->shape, sizeof(int64_t) * (size_t)x->ndim) ||
        x->producer != y->producer || x->consumers != y->consumers) {
      qt_test_fail("%s: value %d '%s' differs", what, v, x->name);
      return 0;
    }
  }
  for (int t = 0; t < a->n_tensors; t++) {
    const qt_param *x = &a->tensors[t], *y = &b->tensors[t];
    if (strcmp(x->name, y->name) || x->ndim != y->ndim || memcmp(x->shape, y->shape, sizeof(int64_t) * (size_t)x->ndim) ||
        x->numel != y->numel || x->is_buffer != y->is_buffer || x->node != y->node || x->offset != y->offset) {
      qt_test_fail("%s: tensor %d '%s' header differs", what, t, x->name);
      return 0;
    }
    const float *dx = (x->is_buffer ? a->buffers : a->params) + x->offset;
    const float *dy = (y->is_buffer ? b->buffers : b->params) + y->offset;
    if (memcmp(dx, dy, (size_t)x->numel * sizeof(float))) {
      qt_test_fail("%s: tensor '%s' data differs", what, x->name);
      return 0;
    }
  }
  return 1;
}

/* Forward on n random samples; returns a malloc'ed copy of the output (*numel elements). */
static inline float *qdq_forward(qt_graph *g, int n, uint64_t seed, int64_t *numel) {
  const qt_value *in = &g->values[g->input];
  int64_t shape[4] = {n, in->shape[0], in->shape[1], in->shape[2]};
  int64_t count = shape[0] * shape[1] * shape[2] * shape[3];
  float *x = malloc((size_t)count * sizeof(float));
  qt_test_fill_uniform(x, count, -1.0f, 1.0f, seed);
  qt_ctx *ctx = qt_ctx_create();
  qt_ctx_set_grad(ctx, 0);
  qt_tensor *out = qt_graph_forward(g, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, x));
  float *copy = NULL;
  if (!out) {
    qt_test_fail("forward of graph %s: %s", g->name, g->error);
  } else {
    *numel = qt_tensor_numel(out);
    copy = malloc((size_t)*numel * sizeof(float));
    QT_ASSERT(out->dtype == QT_F32, "output dtype");
    memcpy(copy, out->data, (size_t)*numel * sizeof(float));
  }
  qt_ctx_free(ctx);
  free(x);
  return copy;
}

/* Output of a and b on the same random batch must be bit-identical. */
static inline void qdq_check_same_outputs(const char *what, qt_graph *a, qt_graph *b, int n, uint64_t seed) {
  int64_t na = 0, nb = 0;
  float *ya = qdq_forward(a, n, seed, &na), *yb = qdq_forward(b, n, seed, &nb);
  if (ya && yb) {
    if (na != nb) qt_test_fail("%s: %lld vs %lld outputs", what, (long long)na, (long long)nb);
    else if (memcmp(ya, yb, (size_t)na * sizeof(float)) != 0) qt_test_close(what, yb, ya, na, 0.0f, 0.0f);
  }
  free(ya);
  free(yb);
}

/* fp32 graph g -> the onednn quantizer (config qc) -> prepare -> `passes` forward passes in
 * training mode with observers on (BN batch statistics in QAT) on random batches -> eval
 * mode: what qat_train saves as model_trained.h5. NULL (after a test failure) on error. */
static inline qt_graph *qdq_prepared_graph(const qt_graph *g, const qt_quantizer_config *qc, qt_prepare_mode mode,
                                           int passes, uint64_t seed) {
  char err[QT_ERR_LEN];
  qt_annotations ann;
  if (qt_test_quantizer_onednn(g, qc, QT_ISA_AUTO, &ann, err)) {
    qt_test_fail("%s: quantizer: %s", g->name, err);
    return NULL;
  }
  qt_graph *p = qt_prepare(g, &ann, mode, err);
  qt_annotations_free(&ann);
  if (!p) {
    qt_test_fail("%s: prepare: %s", g->name, err);
    return NULL;
  }
  qt_graph_set_training(p, 1);
  qt_set_observers(p, 1);
  for (int k = 0; k < passes; k++) {
    int64_t n = 0;
    float *y = qdq_forward(p, 8, seed + (uint64_t)k, &n);
    if (!y) {
      qt_graph_free(p);
      return NULL;
    }
    free(y);
  }
  qt_graph_set_training(p, 0);
  return p;
}

static inline unsigned char *qdq_read_bytes(const char *path, long *len) {
  FILE *f = fopen(path, "rb");
  QT_ASSERT(f, "cannot read %s", path);
  fseek(f, 0, SEEK_END);
  *len = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc((size_t)*len + 1);
  QT_ASSERT(b && fread(b, 1, (size_t)*len, f) == (size_t)*len, "reading %s", path);
  fclose(f);
  return b;
}

/* No object in the file carries a modification or creation time (the root group included):
 * the bytes must not depend on the clock. Checks the root, a group and a dataset. */
static inline void qdq_expect_no_times(const char *path) {
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  const char *objs[] = {"/", "/nodes", "/values/name"};
  for (int k = 0; f >= 0 && k < 3; k++) {
    hid_t o = H5Oopen(f, objs[k], H5P_DEFAULT);
    H5O_info_t info;
    if (o < 0 || H5Oget_info2(o, &info, H5O_INFO_TIME) < 0 || info.mtime || info.ctime || info.btime)
      qt_test_fail("%s: object %s carries a time (saves would differ by the clock)", path, objs[k]);
    if (o >= 0) H5Oclose(o);
  }
  if (f < 0) qt_test_fail("%s: cannot open", path);
  else H5Fclose(f);
}

static inline void qdq_write_bytes(const char *path, const unsigned char *b, long len) {
  FILE *f = fopen(path, "wb");
  QT_ASSERT(f && fwrite(b, 1, (size_t)len, f) == (size_t)len, "writing %s", path);
  fclose(f);
}

/* Input and output of g on n = 4 random samples (uniform in [-1, 1), seed) into `path`, for
 * read_qdq.py's reference interpreter. */
static inline void qdq_write_io(const char *path, qt_graph *g, uint64_t seed) {
  const qt_value *in = &g->values[g->input];
  const int n = 4;
  int64_t numel = 0, xn = n * in->shape[0] * in->shape[1] * in->shape[2];
  float *y = qdq_forward(g, n, seed, &numel);
  float *x = malloc((size_t)xn * sizeof(float));
  qt_test_fill_uniform(x, xn, -1.0f, 1.0f, seed);
  hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  hsize_t xd[4] = {(hsize_t)n, (hsize_t)in->shape[0], (hsize_t)in->shape[1], (hsize_t)in->shape[2]};
  hsize_t yd[2] = {(hsize_t)n, (hsize_t)(numel / n)};
  QT_CHECK(f >= 0 && y && H5LTmake_dataset_float(f, "input", 4, xd, x) >= 0 &&
           H5LTmake_dataset_float(f, "output", 2, yd, y) >= 0);
  if (f >= 0) H5Fclose(f);
  free(x);
  free(y);
}

/* An edit of an open Q/DQ file, for the validation tests. */
typedef void (*qdq_edit_fn)(hid_t f);

/* Copies file `from` to `to`, then applies edit (when not NULL) to the copy. */
static inline void qdq_copy_edited(const char *from, const char *to, qdq_edit_fn edit, const char *what) {
  long len = 0;
  unsigned char *bytes = qdq_read_bytes(from, &len);
  qdq_write_bytes(to, bytes, len);
  free(bytes);
  if (!edit) return;
  hid_t f = H5Fopen(to, H5F_ACC_RDWR, H5P_DEFAULT);
  QT_ASSERT(f >= 0, "%s: cannot reopen %s", what, to);
  edit(f);
  QT_ASSERT(H5Fclose(f) >= 0, "%s: closing %s", what, to);
}

/* Copies `base` to <prefix><what>.h5, applies edit, loads and expects a failure whose message
 * holds the file name and `needle`, with no HDF5 object left open. */
static inline void qdq_expect_load_error(const char *base, const char *prefix, const char *what, qdq_edit_fn edit,
                                         const char *needle) {
  char path[256], err[QT_ERR_LEN] = "";
  snprintf(path, sizeof path, "%s%s.h5", prefix, what);
  qdq_copy_edited(base, path, edit, what);
  qt_graph *g = qt_qdq_load(path, err);
  if (getenv("QT_TEST_VERBOSE")) fprintf(stderr, "%-18s %s\n", what, err);
  if (H5Fget_obj_count((hid_t)H5F_OBJ_ALL, H5F_OBJ_ALL) != 0) qt_test_fail("%s: HDF5 objects left open", what);
  if (g) {
    qt_test_fail("%s: load succeeded, want an error mentioning '%s'", what, needle);
    qt_graph_free(g);
  } else if (!strstr(err, needle) || !strstr(err, path)) {
    qt_test_fail("%s: error '%s' lacks '%s' or the file name", what, err, needle);
  }
  unlink(path);
}

/* One case of a validation table: the edit, and what the load error must say. */
typedef struct {
  const char *what;
  qdq_edit_fn edit;
  const char *needle;
} qdq_error_case;

/* qdq_expect_load_error for each of the n cases. */
static inline void qdq_expect_load_errors(const char *base, const char *prefix, const qdq_error_case *cases, int n) {
  for (int i = 0; i < n; i++) qdq_expect_load_error(base, prefix, cases[i].what, cases[i].edit, cases[i].needle);
}

static inline void qdq_set_str(hid_t f, const char *obj, const char *name, const char *v) {
  QT_ASSERT(H5LTset_attribute_string(f, obj, name, v) >= 0, "set %s %s", obj, name);
}

/* Sets dimension `axis` of value `value` in /values/shape (3 dims a value) to `dim`. */
static inline void qdq_set_value_dim(hid_t f, int value, int axis, int64_t dim) {
  hid_t d = H5Dopen2(f, "/values/shape", H5P_DEFAULT);
  hid_t sp = d < 0 ? -1 : H5Dget_space(d);
  const int64_t n = sp < 0 ? 0 : H5Sget_simple_extent_npoints(sp);
  int64_t *s = malloc((size_t)(n > 0 ? n : 1) * sizeof *s);
  QT_ASSERT(s && n > 3 * value + axis && H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, s) >= 0,
            "read shape");
  s[3 * value + axis] = dim;
  QT_ASSERT(H5Dwrite(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, s) >= 0, "write shape");
  free(s);
  H5Sclose(sp);
  H5Dclose(d);
}

#endif
