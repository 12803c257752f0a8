/* The int8 residual add of the oneDNN lowering (backend/lower.c, lower_binary_u8): two u8 inputs
 * with their own scales and zero points, output requantized to u8 (with a fused relu or relu6, and a
 * 4-bit output range that clamps), bit-exact against the Q/DQ reference interpreter, on random
 * inputs and on every pair of input integers (every_pair); ResCNN
 * converted W8A8 lowers both residual adds to u8 (and everything else: no fallback) and
 * stays within 1 output LSB of the Q/DQ graph end to end. */
#include "tests/backend_check/bcheck_util.h"

static void compare(const char *what, qt_graph *g, const float *x, int n, int want_add_int8, int want_fallback,
                    double max_lsb) {
  char err[QT_ERR_LEN];
  qt_graph_set_mode(g, QT_MODE_EVAL);
  qt_device *m = qt_device_open(g, NULL, err);
  QT_ASSERT(m, "%s: %s", what, err);
  int adds = 0;
  for (int i = 0; i < qt_device_partition_count(m); i++) {
    const char *nodes, *detail;
    if (qt_device_partition(m, i, &nodes, &detail) == QT_PART_INT8 && strstr(detail, "add u8 + u8 -> u8")) adds++;
  }
  if (adds != want_add_int8 || qt_device_count(m, QT_PART_FALLBACK) != want_fallback) {
    qt_test_fail("%s: %d u8 adds and %d fallbacks, want %d and %d", what, adds, qt_device_count(m, QT_PART_FALLBACK),
                 want_add_int8, want_fallback);
    qt_device_report(m, stderr);
  }
  if (getenv("QT_TEST_VERBOSE")) qt_device_report(m, stderr);
  const int64_t on = qt_device_output_numel(m) * n;
  float *got = malloc((size_t)on * sizeof(float));
  if (qt_device_run(m, got, x, n, err)) qt_test_fail("%s: run: %s", what, err);
  float *want = reference(g, x, n);
  double agree;
  const double d = max_lsb_diff(got, want, on, output_lsb(g), (int)qt_device_output_numel(m), &agree);
  if (d > max_lsb) qt_test_fail("%s: lowered vs Q/DQ graph: max %.3g LSB, allowed %.0f", what, d, max_lsb);
  free(got);
  free(want);
  qt_device_free(m);
}

/* input 7x5x6 -> q/dq (s1, z1) = a; input -> q/dq (s2, z2) = b; a + b [-> relu | relu6] -> q/dq
 * [0, qmax]; relu: 0 none, 1 relu, 2 relu6. */
static void add_pattern(int relu, int qmax, float s1, int z1, float s2, int z2, float s3, int z3) {
  char err[QT_ERR_LEN], what[160];
  snprintf(what, sizeof what, "add%s: %g/%d + %g/%d -> %g/%d [0, %d]", relu == 2 ? "+relu6" : relu ? "+relu" : "", s1,
           z1, s2, z2, s3, z3, qmax);
  qt_graph *g = qt_graph_create("add_pattern");
  int x = qt_graph_input(g, "input", 7, 5, 6);
  int a = qdq(g, "a.fq", x, 0, 255, s1, z1);
  int b = qdq(g, "b.fq", x, 0, 255, s2, z2);
  int y = qt_graph_add(g, "add", a, b);
  if (relu == 1) y = qt_graph_relu(g, "relu", y);
  if (relu == 2) y = qt_graph_relu6(g, "relu6", y);
  y = qdq(g, "out.fq", y, 0, qmax, s3, z3);
  QT_ASSERT(qt_graph_finalize(g, y, err) == 0, "%s", err);
  const int n = 64;
  float *in = malloc(sizeof(float) * n * 7 * 5 * 6);
  qt_test_fill_uniform(in, n * 7 * 5 * 6, -1.5f, relu == 2 ? 5.0f : 2.5f, 7);
  if (relu == 2) { /* the sums pass 6, so the clamp takes part */
    float *ref = reference(g, in, n), hi = 0;
    for (int64_t i = 0; i < (int64_t)n * 7 * 5 * 6; i++) hi = fmaxf(hi, ref[i]);
    if (fabsf(hi - 6.0f) > s3) qt_test_fail("%s: the outputs never reach the relu6 bound (max %g)", what, hi);
    free(ref);
  }
  compare(what, g, in, n, 1, 0, 0);
  free(in);
  qt_graph_free(g);
}

/* Every pair of input integers: input 1x256x2 -> q/dq (s, z) -> channel 0 = a, channel 1 = b
 * (slices of the u8 tensor); sample i holds integer i in channel 0 at every pixel, pixel w holds
 * integer w in channel 1: 65,536 pairs. a + b [-> relu] -> q/dq (s3, z3). */
static void every_pair(int relu, float s, int z, float s3, int z3) {
  char err[QT_ERR_LEN], what[160];
  snprintf(what, sizeof what, "add%s of every pair: %g/%d -> %g/%d", relu ? "+relu" : "", s, z, s3, z3);
  qt_graph *g = qt_graph_create("every_pair");
  int x = qt_graph_input(g, "input", 1, 256, 2);
  x = qdq(g, "in.fq", x, 0, 255, s, z);
  int a = qt_graph_channel_slice(g, "a", x, 0, 1), b = qt_graph_channel_slice(g, "b", x, 1, 2);
  int y = qt_graph_add(g, "add", a, b);
  if (relu) y = qt_graph_relu(g, "relu", y);
  y = qdq(g, "out.fq", y, 0, 255, s3, z3);
  QT_ASSERT(qt_graph_finalize(g, y, err) == 0, "%s", err);
  float *in = malloc(sizeof(float) * 256 * 256 * 2);
  for (int i = 0; i < 256; i++)
    for (int w = 0; w < 256; w++) {
      in[(i * 256 + w) * 2] = (float)(i - z) * s;
      in[(i * 256 + w) * 2 + 1] = (float)(w - z) * s;
    }
  compare(what, g, in, 256, 1, 0, 0);
  free(in);
  qt_graph_free(g);
}

static void res_cnn(void) {
  /* quantized for this CPU: 7-bit weights without VNNI, so that its convolutions run in int8 too */
  qt_graph *g = ptq_model("res_cnn", NULL, 8, 8, qt_cpu_has_vnni(), "add_res_cnn.h5");
  float *x = malloc(sizeof(float) * 64 * 784);
  qt_test_fill_uniform(x, 64 * 784, -0.8f, 2.0f, 98);
  compare("res_cnn W8A8", g, x, 64, 2, 0, 1);
  free(x);
  qt_graph_free(g);
}

int main(void) {
  add_pattern(1, 255, 0.0123f, 100, 0.0071f, 37, 0.019f, 0);
  add_pattern(0, 255, 0.0123f, 101, 0.0071f, 37, 0.031f, 129);
  add_pattern(1, 15, 0.02f, 80, 0.011f, 3, 0.1f, 0);   /* 4-bit output: clamps */
  add_pattern(0, 255, 1.0f / 64, 64, 1.0f / 32, 20, 1.0f / 16, 90); /* ties: power-of-two scales */
  add_pattern(2, 255, 0.04f, 50, 0.03f, 40, 0.03f, 0);                /* relu6 clamps at 6 */
  add_pattern(2, 255, 1.0f / 16, 32, 1.0f / 32, 40, 1.0f / 32, 3);    /* relu6, power-of-two scales */
  every_pair(0, 0.0123f, 100, 0.031f, 129);
  every_pair(1, 1.0f / 64, 64, 1.0f / 32, 3); /* ties: power-of-two scales */
  res_cnn();
  return qt_test_finish();
}
