/* The fictional accelerator end to end (experiments/accel_fictional.ini):
 * - the Quantizer derived from its description annotates FashionCNN per-tensor, symmetric,
 *   signed 8-bit with power-of-two scales and int32 biases, and leaves fc1 (128 features > 64
 *   channels) in fp32;
 * - after PTQ and convert, every record in the Q/DQ file has one power-of-two scale and zero
 *   point 0, and the check pass finds no violation (a note names fc1);
 * - the partitioning puts conv1..flatten and fc2 on the accelerator, fc1 -> relu3 on the CPU
 *   with its reason, and four transfers between them;
 * - the simulator's outputs match the Q/DQ graph: bit for bit on a small graph using every
 *   device kernel (conv, relu or relu6, max pool, add, flatten, linear) with biases that are whole
 *   accumulator units; within 1 output LSB with arbitrary float biases (the device rounds the
 *   bias to accumulator units, the report's stage 2); bit for bit on FashionCNN and ResCNN (whose
 *   global average pooling runs on the CPU), quantized by the accelerator's Quantizer with int32
 *   biases (before int32 biases: up to 2 LSB, top-1 identical on 95% / 90%); and bit for bit
 *   on a model the accelerator cannot run at all (everything on the CPU). */
#include "tests/backend_check/bcheck_util.h"

static int is_pow2(float s) {
  int e;
  return frexpf(s, &e) == 0.5f;
}

static void quantizer(void) {
  char err[QT_ERR_LEN];
  qt_backend_desc d;
  accel_desc(&d);
  qt_graph *g = qt_model_build("fashion_cnn", err);
  qt_quantizer_config qc;
  qt_quantizer_config_default(&qc);
  qt_annotations a;
  QT_ASSERT(qt_quantizer(g, &d, &qc, &a, err) == 0, "%s", err);
  const char *quantized[] = {"conv1", "conv2", "fc2"};
  for (int i = 0; i < 3; i++) {
    const int n = qt_graph_find_node(g, quantized[i]);
    const qt_qspec *s = &a.weight_spec[n];
    if (!a.weight[n] || s->per_channel || !s->symmetric || !s->is_signed || s->qmin != -128 || s->qmax != 127 ||
        !s->pow2_scale)
      qt_test_fail("quantizer: %s weights not per-tensor symmetric s8 with power-of-two scales", quantized[i]);
  }
  if (a.weight[qt_graph_find_node(g, "fc1")]) qt_test_fail("quantizer: fc1 (128 features > 64) must stay fp32");
  /* int32_bias = true: every quantized layer's bias is quantized (at s_x * s_w, a power of two) */
  QT_CHECK(d.bias_int32_only == 1);
  for (int i = 0; i < 3; i++) QT_CHECK(a.weight_spec[qt_graph_find_node(g, quantized[i])].bias_int32 == 1);
  int points = 0;
  for (int v = 0; v < a.n_values; v++) {
    if (!a.act[v]) continue;
    points++;
    const qt_qspec *s = &a.act_spec[v];
    if (!s->is_signed || !s->symmetric || s->per_channel || !s->pow2_scale || s->qmin != -128)
      qt_test_fail("quantizer: activation %s not s8 symmetric per-tensor power-of-two", g->values[v].name);
  }
  if (points != 5) qt_test_fail("quantizer: %d activation points, want 5 (input, relu1, relu2, relu3, fc2)", points);
  qt_annotations_free(&a);
  /* refusals */
  qc.weight_bits = 4;
  err[0] = 0;
  if (qt_quantizer(g, &d, &qc, &a, err) == 0 || !strstr(err, "allows weight bits {8}"))
    qt_test_fail("W4 on an 8-bit-only accelerator: '%s'", err);
  qc.weight_bits = 8;
  qc.learnable_scale = 1;
  if (qt_quantizer(g, &d, &qc, &a, err) == 0 || !strstr(err, "powers of two"))
    qt_test_fail("LSQ with power-of-two scales: '%s'", err);
  qt_graph_free(g);
}

/* Every record of a Q/DQ graph: one power-of-two scale, zero point 0. */
static void records_pow2(const qt_graph *g) {
  for (int i = 0; i < g->n_nodes; i++) {
    const qt_qstate *qs[2] = {g->nodes[i].q, g->nodes[i].wq};
    for (int k = 0; k < 2; k++)
      if (qs[k] && (qs[k]->channels != 1 || !is_pow2(qs[k]->scale[0]) || qs[k]->zero_point[0] != 0))
        qt_test_fail("%s: record with %d channels, scale %g, zero point %d", g->nodes[i].name, qs[k]->channels,
                     qs[k]->scale[0], qs[k]->zero_point[0]);
  }
}

static void run_vs_reference(const char *what, qt_graph *g, const qt_backend_desc *d, int n, double max_lsb,
                             double min_agree) {
  char err[QT_ERR_LEN];
  qt_device *a = qt_device_open(g, d, err);
  QT_ASSERT(a, "%s", err);
  const qt_value *in = &g->values[g->input];
  const int64_t per = in->shape[0] * in->shape[1] * in->shape[2];
  float *x = malloc((size_t)(n * per) * sizeof(float));
  qt_test_fill_uniform(x, n * per, -0.8f, 2.0f, 77);
  const int64_t classes = qt_device_output_numel(a);
  float *got = malloc((size_t)(n * classes) * sizeof(float));
  if (qt_device_run(a, got, x, n, err)) qt_test_fail("%s: run: %s", what, err);
  float *want = reference(g, x, n);
  double agree;
  const double d_lsb = max_lsb_diff(got, want, n * classes, output_lsb(g), (int)classes, &agree);
  if (d_lsb > max_lsb || agree < min_agree) {
    qt_test_fail("%s: simulator vs Q/DQ graph: max %.3g LSB (allowed %.0f), identical top-1 %.1f%% (want >= %.1f%%)",
                 what, d_lsb, max_lsb, 100 * agree, 100 * min_agree);
    qt_device_report(a, stderr);
  }
  if (getenv("QT_TEST_VERBOSE")) {
    qt_device_report(a, stderr);
    fprintf(stderr, "%s: max %.3g LSB, top-1 agreement %.2f%%\n", what, d_lsb, 100 * agree);
  }
  free(x);
  free(got);
  free(want);
  qt_device_free(a);
}

static void fashion_cnn(void) {
  char err[QT_ERR_LEN];
  qt_backend_desc d;
  accel_desc(&d);
  qt_graph *g = ptq_model("fashion_cnn", &d, 8, 8, 1, "accel_fashion_cnn.h5");
  records_pow2(g);
  qt_backend_check_result r;
  QT_ASSERT(qt_backend_check(g, &d, &r, err) == 0, "%s", err);
  if (r.n || r.n_notes != 1 || !strstr(r.notes[0], "fc1")) {
    qt_test_fail("FashionCNN quantized for the accelerator: %d violations, %d notes; want none and a note on fc1", r.n,
                 r.n_notes);
    qt_backend_check_print(&r, stderr);
  }
  qt_backend_check_result_free(&r);

  qt_device *a = qt_device_open(g, &d, err);
  QT_ASSERT(a, "%s", err);
  const char *on[] = {"input.fq.dequantize", "conv1", "relu1", "relu1.fq.quantize", "pool1", "conv2", "pool2",
                      "flatten", "fc2", "fc2.fq.quantize"};
  for (size_t i = 0; i < sizeof on / sizeof on[0]; i++)
    if (qt_device_node_on_backend(a, on[i], NULL) != 1) qt_test_fail("partition: %s should run on the accelerator", on[i]);
  const char *reason;
  if (qt_device_node_on_backend(a, "fc1", &reason) != 0 || !strstr(reason, "128 output features > max_channels 64"))
    qt_test_fail("partition: fc1 should run on the CPU because of its 128 features, got '%s'", reason);
  if (qt_device_node_on_backend(a, "relu3", &reason) != 0 || !strstr(reason, "computed on the CPU"))
    qt_test_fail("partition: relu3 should run on the CPU after fc1, got '%s'", reason);
  if (qt_device_count(a, QT_PART_INT8) != 2 || qt_device_count(a, QT_PART_FALLBACK) != 2 ||
      qt_device_count(a, QT_PART_BOUNDARY) != 4) {
    qt_test_fail("partition: %d accelerator / %d cpu / %d transfer partitions, want 2 / 2 / 4",
                 qt_device_count(a, QT_PART_INT8), qt_device_count(a, QT_PART_FALLBACK),
                 qt_device_count(a, QT_PART_BOUNDARY));
    qt_device_report(a, stderr);
  }
  int found = 0;
  for (int i = 0; i < qt_device_partition_count(a); i++) {
    const char *nodes, *detail;
    if (qt_device_partition(a, i, &nodes, &detail) == QT_PART_FALLBACK && strcmp(nodes, "fc1 -> relu3") == 0 &&
        strstr(detail, "fc1: fp32 layer"))
      found = 1;
  }
  if (!found) qt_test_fail("partition report: no CPU partition 'fc1 -> relu3' with fc1's reason");
  qt_device_free(a);
  run_vs_reference("fashion_cnn on fict_npu", g, &d, 64, 0, 1.0);
  qt_graph_free(g);
}

static void res_cnn(void) {
  qt_backend_desc d;
  accel_desc(&d);
  qt_graph *g = ptq_model("res_cnn", &d, 8, 8, 1, "accel_res_cnn.h5");
  records_pow2(g);
  char err[QT_ERR_LEN];
  qt_device *a = qt_device_open(g, &d, err);
  QT_ASSERT(a, "%s", err);
  const char *reason;
  if (qt_device_node_on_backend(a, "block1.add", NULL) != 1 || qt_device_node_on_backend(a, "block2.add", NULL) != 1)
    qt_test_fail("res_cnn: the residual adds should run on the accelerator");
  if (qt_device_node_on_backend(a, "gap", &reason) != 0 || !strstr(reason, "not in fict_npu's op list"))
    qt_test_fail("res_cnn: gap should run on the CPU (not in the op list), got '%s'", reason);
  if (qt_device_node_on_backend(a, "fc", NULL) != 1) qt_test_fail("res_cnn: fc should run on the accelerator");
  qt_device_free(a);
  run_vs_reference("res_cnn on fict_npu", g, &d, 32, 0, 1.0);
  qt_graph_free(g);
}

/* input 6x6x3 -> q/dq -> conv 3x3 pad 1 (8) -> relu -> q/dq -> max_pool 2 -> [a]
 *   a -> conv 1x1 (8) -> q/dq -> [b];  a + b -> relu -> q/dq -> flatten -> linear 5 -> q/dq
 * (relu6: both relus are relu6; the add's output scale 4 puts its bound 6 / 4 between two
 * integers, so the device rounds the bound as the Q/DQ graph rounds the clamped value). */
static qt_graph *small_graph(int exact_bias, int relu6) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_graph_create("small");
  int x = qt_graph_input(g, "input", 6, 6, 3);
  x = qdq(g, "input.fq", x, -128, 127, 1.0f / 32, 0);
  x = qt_graph_conv2d(g, "conv1", x, 8, 3, 1, 1, 1, 1);
  x = relu6 ? qt_graph_relu6(g, "relu1", x) : qt_graph_relu(g, "relu1", x);
  x = qdq(g, "relu1.fq", x, -128, 127, 1.0f / 8, 0);
  int a = qt_graph_max_pool2d(g, "pool", x, 2, 2, 0);
  int b = qt_graph_conv2d(g, "conv2", a, 8, 1, 1, 0, 1, 1);
  b = qdq(g, "conv2.fq", b, -128, 127, 1.0f / 4, 0);
  x = qt_graph_add(g, "add", a, b);
  x = relu6 ? qt_graph_relu6(g, "relu2", x) : qt_graph_relu(g, "relu2", x);
  x = qdq(g, "relu2.fq", x, -128, 127, relu6 ? 4.0f : 1.0f / 2, 0);
  x = qt_graph_flatten(g, "flatten", x);
  x = qt_graph_linear(g, "fc", x, 5, 1);
  x = qdq(g, "fc.fq", x, -128, 127, 1.0f, 0);
  QT_ASSERT(qt_graph_finalize(g, x, err) == 0, "%s", err);
  const char *layers[] = {"conv1", "conv2", "fc"};
  const float w_scale[] = {1.0f / 64, 1.0f / 128, 1.0f / 256}, in_scale[] = {1.0f / 32, 1.0f / 8, relu6 ? 4.0f : 1.0f / 2};
  for (int l = 0; l < 3; l++) {
    int_weights(g, layers[l], w_scale[l], 127, 10 + (uint64_t)l);
    const qt_node *n = &g->nodes[qt_graph_find_node(g, layers[l])];
    float *bias = qt_graph_tensor_data(g, n->param[QT_P_BIAS]);
    const int64_t oc = g->tensors[n->param[QT_P_BIAS]].numel;
    qt_test_fill_uniform(bias, oc, -4.0f, 4.0f, 20 + (uint64_t)l);
    if (exact_bias) /* whole accumulator units */
      for (int64_t c = 0; c < oc; c++) bias[c] = nearbyintf(bias[c] / (in_scale[l] * w_scale[l])) * in_scale[l] * w_scale[l];
  }
  return g;
}

static void small(int exact_bias, int relu6) {
  qt_backend_desc d;
  accel_desc(&d);
  d.ops[QT_OP_RELU6] = relu6;
  qt_graph *g = small_graph(exact_bias, relu6);
  char err[QT_ERR_LEN];
  qt_device *a = qt_device_open(g, &d, err);
  QT_ASSERT(a, "%s", err);
  /* everything but the graph input on the accelerator: one partition between two transfers */
  if (qt_device_count(a, QT_PART_INT8) != 1 || qt_device_count(a, QT_PART_FALLBACK) != 1 ||
      qt_device_count(a, QT_PART_BOUNDARY) != 2) {
    qt_test_fail("small graph: want input on the CPU and one accelerator partition");
    qt_device_report(a, stderr);
  }
  qt_device_free(a);
  if (relu6) { /* the clamps take part: relu1's output reaches 6 */
    const int n = 64;
    float *x = malloc(sizeof(float) * n * 6 * 6 * 3);
    qt_test_fill_uniform(x, n * 6 * 6 * 3, -0.8f, 2.0f, 77);
    qt_ctx *ctx = qt_ctx_create();
    const int64_t shape[4] = {n, 6, 6, 3};
    qt_tensor **vals;
    QT_ASSERT(qt_graph_forward_values(g, ctx, qt_tensor_wrap(ctx, QT_F32, 4, shape, x), &vals), "%s", g->error);
    const qt_tensor *r1 = vals[g->nodes[qt_graph_find_node(g, "relu1")].output];
    float hi = 0;
    for (int64_t i = 0; i < qt_tensor_numel(r1); i++) hi = fmaxf(hi, qt_f32(r1)[i]);
    if (hi != 6.0f) qt_test_fail("small graph with relu6: relu1 never clamps (max %g)", hi);
    qt_ctx_free(ctx);
    free(x);
  }
  run_vs_reference(relu6 ? (exact_bias ? "small graph, relu6, exact biases" : "small graph, relu6, arbitrary biases")
                         : (exact_bias ? "small graph, exact biases" : "small graph, arbitrary biases"),
                   g, &d, 64, exact_bias ? 0 : 1, exact_bias ? 1.0 : 0.9);
  qt_graph_free(g);
}

static void all_cpu(void) {
  qt_backend_desc d;
  accel_desc(&d);
  qt_graph *g = ptq_model("fashion_cnn", NULL, 8, 8, 1, "accel_all_cpu.h5");
  char err[QT_ERR_LEN];
  qt_device *a = qt_device_open(g, &d, err);
  QT_ASSERT(a, "%s", err);
  if (qt_device_count(a, QT_PART_INT8) != 0 || qt_device_count(a, QT_PART_FALLBACK) != 1)
    qt_test_fail("a oneDNN-quantized model should run wholly on the CPU of the accelerator backend");
  const char *reason;
  qt_device_node_on_backend(a, "conv1", &reason);
  if (!strstr(reason, "per-channel weights")) qt_test_fail("conv1's CPU reason: '%s'", reason);
  qt_device_free(a);
  run_vs_reference("onednn model on fict_npu (all CPU)", g, &d, 16, 0, 1.0);
  qt_graph_free(g);
}

int main(void) {
  quantizer();
  fashion_cnn();
  res_cnn();
  small(1, 0);
  small(0, 0);
  small(1, 1);
  small(0, 1);
  all_cpu();
  return qt_test_finish();
}
