/* The ops without weights that the oneDNN lowering runs on u8 (backend/lower.c): every element-wise
 * activation kind as a 256-entry table (8-bit and 4-bit outputs, a fused relu), PReLU as a table
 * (one slope) or a table per channel, a nearest resize as a copy, mul of an image by a
 * per-channel vector (squeeze-excite) and of two tensors of one shape, concat of inputs with their
 * own qparams (along channels and along features), the global average pool, relu outside a unit,
 * the channel shuffle and slice, and a ceil-mode max pool. Each hand-built Q/DQ graph lowers
 * without an fp32 fallback and its device output equals the Q/DQ reference interpreter's bit for
 * bit (tolerance 0: the kernels compute the graph's own float operations); the imported models
 * with these ops (tests/onnx/models: squeeze-excite, seven activations, the shuffle units) run
 * with no fallback, and within 1 output LSB of the Q/DQ graph end to end (the conv kernels
 * round their own way). */
#include "onnx/onnx_import.h"
#include "qat/qat.h"
#include "tests/backend_check/bcheck_util.h"
#include "tests/common/ptq_util.h"
#include "tests/common/quantizer_util.h"

enum { N = 32, H = 7, W = 5, C = 6 };

/* g lowered on oneDNN: no fallback partition, `detail` in some int8 partition's detail, and the
 * device's output on x within max_lsb output LSB of the Q/DQ graph's (0: bit for bit). */
static void compare(const char *what, qt_graph *g, const float *x, int n, const char *detail, double max_lsb) {
  char err[QT_ERR_LEN];
  qt_graph_set_mode(g, QT_MODE_EVAL);
  qt_device *m = qt_device_open(g, NULL, err);
  QT_ASSERT(m, "%s: %s", what, err);
  int found = detail == NULL;
  for (int i = 0; i < qt_device_partition_count(m); i++) {
    const char *nodes, *d;
    if (qt_device_partition(m, i, &nodes, &d) == QT_PART_INT8 && detail && strstr(d, detail)) found = 1;
  }
  if (!found || qt_device_count(m, QT_PART_FALLBACK) != 0) {
    qt_test_fail("%s: %d fallbacks (want 0), int8 partition '%s' %sfound", what, qt_device_count(m, QT_PART_FALLBACK),
                 detail ? detail : "", found ? "" : "not ");
    qt_device_report(m, stderr);
  }
  if (getenv("QT_TEST_VERBOSE")) qt_device_report(m, stderr);
  const int64_t on = qt_device_output_numel(m) * n;
  float *got = malloc((size_t)on * sizeof(float));
  if (qt_device_run(m, got, x, n, err)) qt_test_fail("%s: run: %s", what, err);
  float *want = reference(g, x, n);
  const float lsb = output_lsb(g);
  double worst = 0;
  for (int64_t i = 0; i < on; i++) {
    const double d = fabs((double)got[i] - (double)want[i]) / (lsb > 0 ? lsb : 1.0f);
    worst = d > worst ? d : worst;
  }
  if (worst > max_lsb) qt_test_fail("%s: device vs Q/DQ graph: max %.3g LSB, allowed %.0f", what, worst, max_lsb);
  free(got);
  free(want);
  qt_device_free(m);
}

static float *inputs(float lo, float hi, uint64_t seed) {
  float *x = malloc(sizeof(float) * N * H * W * C);
  qt_test_fill_uniform(x, N * H * W * C, lo, hi, seed);
  return x;
}

static void finish(qt_graph *g, int y) {
  char err[QT_ERR_LEN];
  QT_ASSERT(qt_graph_finalize(g, y, err) == 0, "%s", err);
}

/* x -> q/dq [0, 255] -> activation [-> relu] -> q/dq [0, qmax] */
static void activation(qt_act_kind kind, int qmax, int relu) {
  char what[96];
  snprintf(what, sizeof what, "%s -> [0, %d]%s", qt_act_name(kind), qmax, relu ? " + relu" : "");
  qt_graph *g = qt_graph_create("act_pattern");
  int y = qdq(g, "in.fq", qt_graph_input(g, "input", H, W, C), 0, 255, 8.0f / 255, 131);
  y = qt_graph_activation(g, "act", y, qt_act_default(kind));
  if (relu) y = qt_graph_relu(g, "relu", y);
  /* the output's range as the observer would set it: sigmoid-like outputs in [0, 1], the rest in [-1.5, 4] */
  const int unit = kind == QT_ACT_SIGMOID || kind == QT_ACT_HARDSIGMOID;
  const float lo = unit || relu ? 0.0f : kind == QT_ACT_TANH ? -1.0f : -1.5f, hi = unit || kind == QT_ACT_TANH ? 1 : 4;
  const int zp = (int)lrintf(-lo / ((hi - lo) / (float)qmax));
  y = qdq(g, "out.fq", y, 0, qmax, (hi - lo) / (float)qmax, zp);
  finish(g, y);
  float *x = inputs(-4.5f, 4.5f, 11 + (uint64_t)kind);
  compare(what, g, x, N, "a 256-entry table", 0);
  free(x);
  qt_graph_free(g);
}

/* x -> q/dq [0, 255] -> prelu (one shared slope, or one per channel, of both signs) -> q/dq */
static void prelu(int per_channel) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_graph_create("prelu_pattern");
  int y = qdq(g, "in.fq", qt_graph_input(g, "input", H, W, C), 0, 255, 8.0f / 255, 131);
  y = qt_graph_prelu(g, "prelu", y, per_channel ? C : 1);
  y = qdq(g, "out.fq", y, 0, 255, 6.0f / 255, 100);
  QT_ASSERT(qt_graph_finalize(g, y, err) == 0, "%s", err);
  float *w = qt_graph_tensor_data(g, g->nodes[qt_graph_find_node(g, "prelu")].param[QT_P_WEIGHT]);
  for (int c = 0; c < (per_channel ? C : 1); c++) w[c] = 0.6f - 0.35f * (float)c;
  float *x = inputs(-4.5f, 4.5f, 17);
  compare(per_channel ? "prelu, a slope per channel" : "prelu, one slope", g, x, N,
          per_channel ? "a 256-entry table per channel" : "prelu on u8: a 256-entry table", 0);
  free(x);
  qt_graph_free(g);
}

/* x -> q/dq -> resize (nearest, x2): a u8 copy into 2 x 2 blocks, the qparams kept */
static void resize_nearest(void) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_graph_create("resize_pattern");
  int y = qdq(g, "in.fq", qt_graph_input(g, "input", H, W, C), 0, 255, 8.0f / 255, 131);
  y = qt_graph_resize(g, "up", y, QT_RESIZE_NEAREST);
  QT_ASSERT(qt_graph_finalize(g, y, err) == 0, "%s", err);
  float *x = inputs(-4.5f, 4.5f, 19);
  compare("resize nearest", g, x, N, "resize (nearest, x2) on u8", 0);
  free(x);
  qt_graph_free(g);
}

/* a (image) * b: b the global average pool of x (a per-channel vector, the squeeze-excite gate)
 * or another q/dq of x (same shape) */
static void mul(int broadcast) {
  qt_graph *g = qt_graph_create("mul_pattern");
  const int x = qt_graph_input(g, "input", H, W, C);
  const int a = qdq(g, "a.fq", x, 0, 255, 0.0123f, 101);
  int b = qdq(g, "b.fq", x, 0, 255, 0.0071f, 37);
  if (broadcast) b = qdq(g, "gap.fq", qt_graph_global_avg_pool(g, "gap", b), 0, 255, 0.003f, 90);
  const int y = qdq(g, "out.fq", qt_graph_mul(g, "mul", a, b), 0, 255, 0.0009f, 77);
  finish(g, y);
  float *x_data = inputs(-1.2f, 1.7f, 21);
  compare(broadcast ? "mul image * per-channel vector" : "mul of one shape", g, x_data, N, "mul u8 * u8 -> u8", 0);
  free(x_data);
  qt_graph_free(g);
}

/* concat of three inputs with their own qparams, along channels (flat = 0) or along the
 * features of pooled vectors (flat = 1), then a relu on u8 */
static void concat(int flat) {
  qt_graph *g = qt_graph_create("concat_pattern");
  const int x = qt_graph_input(g, "input", H, W, C);
  int in[3];
  const float scale[3] = {0.0123f, 0.0071f, 0.02f};
  const int zp[3] = {101, 37, 0};
  const char *names[3] = {"a", "b", "c"};
  for (int k = 0; k < 3; k++) {
    char p[16], gp[16];
    snprintf(p, sizeof p, "%s.fq", names[k]);
    in[k] = qdq(g, p, x, 0, 255, scale[k], zp[k]);
    if (flat) {
      snprintf(gp, sizeof gp, "%s.gap", names[k]);
      snprintf(p, sizeof p, "%s.gfq", names[k]);
      in[k] = qdq(g, p, qt_graph_global_avg_pool(g, gp, in[k]), 0, 255, scale[k] / 2, zp[k]);
    }
  }
  int y = qdq(g, "out.fq", qt_graph_concat(g, "cat", in, 3), 0, 255, 0.011f, 60);
  y = qt_graph_relu(g, "relu", y);
  finish(g, y);
  float *x_data = inputs(-1.2f, 2.1f, 31);
  compare(flat ? "concat of vectors" : "concat along channels", g, x_data, N, "concat of 3 u8 tensors", 0);
  free(x_data);
  qt_graph_free(g);
}

/* q/dq -> channel_shuffle (2 groups) -> channel_slice [1, 5) -> max pool 3x3 / 2 in ceil mode */
static void channels_and_ceil_pool(void) {
  qt_graph *g = qt_graph_create("channels_pattern");
  int y = qdq(g, "in.fq", qt_graph_input(g, "input", H, W, C), 0, 255, 0.01f, 128);
  y = qt_graph_channel_shuffle(g, "shuffle", y, 2);
  y = qt_graph_channel_slice(g, "slice", y, 1, 5);
  y = qt_graph_pool2d(g, QT_OP_MAX_POOL2D, "pool", y, 3, 2, 0, 1);
  QT_CHECK(g->values[y].shape[0] == 3 && g->values[y].shape[1] == 2); /* ceil: 7 -> 3, 5 -> 2 */
  finish(g, y);
  float *x = inputs(-1.2f, 1.2f, 41);
  compare("shuffle, slice, ceil-mode max pool", g, x, N, "channel_shuffle on u8", 0);
  compare("shuffle, slice, ceil-mode max pool", g, x, N, "max pool on u8", 0);
  free(x);
  qt_graph_free(g);
}

/* The imported model at W8A8 (oneDNN's Quantizer for this CPU), calibrated as qt_test_ptq_convert
 * does, run on 64 random images. */
static void imported(const char *file, double max_lsb) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_onnx_import(qt_test_path(file), NULL, NULL, err);
  QT_ASSERT(g, "%s", err);
  qt_quantizer_config qc = qt_test_quantizer_config(8, 8);
  qt_annotations a;
  QT_ASSERT(qt_test_quantizer_onednn(g, &qc, QT_ISA_AUTO, &a, err) == 0, "%s", err);
  qt_graph *q = qt_test_ptq_convert(g, &a);
  float *x = malloc(sizeof(float) * 64 * 784);
  qt_test_fill_uniform(x, 64 * 784, -0.8f, 2.0f, 51);
  compare(file, q, x, 64, NULL, max_lsb);
  free(x);
  qt_graph_free(q);
}

int main(void) {
  for (int k = 0; k < QT_ACT_COUNT; k++) {
    activation((qt_act_kind)k, 255, 0);
    activation((qt_act_kind)k, 15, 0);
  }
  activation(QT_ACT_SILU, 255, 1);
  prelu(0);
  prelu(1);
  resize_nearest();
  mul(1);
  mul(0);
  concat(0);
  concat(1);
  channels_and_ceil_pool();
  imported("tests/onnx/models/se_cnn.onnx", 1);
  imported("tests/onnx/models/act_cnn.onnx", 1);
  imported("tests/onnx/models/shuffle_cnn.onnx", 1);
  imported("tests/onnx/models/arith_cnn.onnx", 1);
  imported("tests/onnx/models/prelu_cnn.onnx", 1);
  return qt_test_finish();
}
