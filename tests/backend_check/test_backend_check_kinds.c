/* Every violation kind of the check pass produces its message, naming the node: a FashionCNN
 * quantized for oneDNN (u8 affine activations, per-channel weights, arbitrary scales, fc1 with
 * 128 features) checked against the fictional accelerator (sign, symmetric, granularity,
 * power-of-two, channels), a W4A8 one (bits), ResCNN against onednn_cpu (none: its add and
 * global_avg_pool run on u8) and the accelerator (op: global_avg_pool is not in its list), a model quantized for the
 * accelerator against onednn_cpu (sign: s8 activations), and a weight-only layer (input). The accelerator description's
 * loader refuses bad files with the file, line and key. A prepared graph is refused. qt_backend_record_problem gives
 * the first problem of one record. */
#include "tests/backend_check/bcheck_util.h"
#include "tests/common/quantizer_util.h"

static void expect(const qt_backend_check_result *r, qt_violation_kind k, const char *node, const char *text) {
  if (!violations(r, k, node, text)) {
    qt_test_fail("no [%s] violation on %s holding '%s'", qt_violation_kind_name(k), node ? node : "any node", text);
    qt_backend_check_print(r, stderr);
  }
}

/* g checked against d holds the violation (k, node, text); frees g. */
static void expect_on(qt_graph *g, const qt_backend_desc *d, qt_violation_kind k, const char *node, const char *text) {
  qt_backend_check_result r = bcheck_run(g, d);
  expect(&r, k, node, text);
  qt_backend_check_result_free(&r);
  qt_graph_free(g);
}

static void onednn_model_on_accel(void) {
  qt_backend_desc d;
  accel_desc(&d);
  qt_graph *g = ptq_model("fashion_cnn", NULL, 8, 8, 1, "kinds_w8a8.h5");
  qt_backend_check_result r = bcheck_run(g, &d);
  expect(&r, QT_VIOLATION_SIGN, "input.fq.quantize",
         "unsigned activations [0, 255]; fict_npu takes signed activations only");
  expect(&r, QT_VIOLATION_SYMMETRIC, "input.fq.quantize", "requires symmetric activations (zero point 0)");
  expect(&r, QT_VIOLATION_GRANULARITY, "conv1",
         "per-channel weights (32 scales); fict_npu requires one scale per tensor");
  expect(&r, QT_VIOLATION_POW2, "conv2", "is not a power of two");
  expect(&r, QT_VIOLATION_POW2, "relu1.fq.quantize", "activations scale");
  expect(&r, QT_VIOLATION_CHANNELS, "fc1", "128 output features; fict_npu has at most 64");
  if (violations(&r, QT_VIOLATION_CHANNELS, NULL, NULL) != 1) qt_test_fail("only fc1 has more than 64 channels");
  if (r.count[QT_VIOLATION_OP] || r.count[QT_VIOLATION_BITS] || r.count[QT_VIOLATION_SATURATION])
    qt_test_fail("W8A8 FashionCNN on the accelerator: no op, bits or saturation violation expected");
  qt_backend_check_result_free(&r);
  qt_graph_free(g);

  g = ptq_model("fashion_cnn", NULL, 4, 8, 1, "kinds_w4a8.h5");
  r = bcheck_run(g, &d);
  expect(&r, QT_VIOLATION_BITS, "fc2", "4-bit weights [-8, 7]; fict_npu takes {8}-bit weights");
  if (violations(&r, QT_VIOLATION_BITS, NULL, NULL) != 4) qt_test_fail("W4A8: all 4 layers have 4-bit weights");
  qt_backend_check_result_free(&r);
  qt_graph_free(g);
}

static void res_cnn_on_onednn(void) {
  qt_backend_desc d, acc;
  qt_backend_desc_onednn_cpu(&d, QT_ISA_VNNI);
  accel_desc(&acc);
  qt_graph *g = ptq_model("res_cnn", NULL, 8, 8, 1, "kinds_res.h5");
  qt_backend_check_result r = bcheck_run(g, &d);
  if (r.n != 0) {
    qt_test_fail("ResCNN on onednn_cpu: no violation expected (add and global_avg_pool run on u8)");
    qt_backend_check_print(&r, stderr);
  }
  qt_backend_check_result_free(&r);
  r = bcheck_run(g, &acc);
  expect(&r, QT_VIOLATION_OP, "gap", "op global_avg_pool on quantized data is not run by fict_npu");
  if (violations(&r, QT_VIOLATION_OP, NULL, NULL) != 1) qt_test_fail("ResCNN on fict_npu: only gap's op violation");
  qt_backend_check_result_free(&r);
  qt_graph_free(g);
}

static void accel_model_on_onednn(void) {
  qt_backend_desc acc, d;
  accel_desc(&acc);
  qt_backend_desc_onednn_cpu(&d, QT_ISA_VNNI);
  qt_graph *g = ptq_model("fashion_cnn", &acc, 8, 8, 1, "kinds_accel.h5");
  expect_on(g, &d, QT_VIOLATION_SIGN, "relu1.fq.quantize", "signed activations [-128, 127]; onednn_cpu takes unsigned");
}

static void weight_only(void) {
  char err[QT_ERR_LEN];
  qt_backend_desc d;
  qt_backend_desc_onednn_cpu(&d, QT_ISA_VNNI);
  qt_graph *g = qt_graph_create("weight_only");
  int x = qt_graph_input(g, "input", 2, 2, 3);
  x = qt_graph_flatten(g, "flatten", x);
  x = qt_graph_linear(g, "fc", x, 4, 1);
  QT_ASSERT(qt_graph_finalize(g, x, err) == 0, "%s", err);
  int_weights(g, "fc", 0.02f, 60, 3);
  expect_on(g, &d, QT_VIOLATION_INPUT, "fc", "integer weights on an fp32 input 'flatten' (weight-only quantization)");
}

static void record_problem(void) {
  qt_backend_desc d;
  accel_desc(&d);
  char why[320];
  qt_qstate *q = record(-128, 127, 0.25f, 0, 1);
  if (qt_backend_record_problem(&d, q, 0, why, sizeof why)) qt_test_fail("s8 2^-2 zp 0 refused: %s", why);
  q->scale[0] = 0.3f;
  if (!qt_backend_record_problem(&d, q, 0, why, sizeof why) || !strstr(why, "not a power of two"))
    qt_test_fail("scale 0.3 accepted");
  qt_qstate_free(q);
}

static void prepared_refused(void) {
  char err[QT_ERR_LEN];
  qt_graph *g = qt_model_build("fashion_cnn", err);
  qt_graph *p = qt_test_prepare_ptq_onednn(g);
  qt_backend_desc d;
  qt_backend_desc_onednn_cpu(&d, QT_ISA_AUTO);
  qt_backend_check_result r;
  err[0] = 0;
  if (qt_backend_check(p, &d, &r, err) == 0 || !strstr(err, "prepared"))
    qt_test_fail("a prepared graph must be refused naming it, got '%s'", err);
  qt_backend_check_result_free(&r);
  qt_graph_free(p);
  qt_graph_free(g);
}

static void desc_error(const char *what, const char *text, const char *want) {
  char err[QT_ERR_LEN];
  qt_backend_desc d;
  err[0] = 0;
  if (qt_backend_desc_parse(&d, text, "npu.ini", err) == 0 || !strstr(err, want))
    qt_test_fail("description %s: want an error holding '%s', got '%s'", what, want, err);
}

static void desc_loader(void) {
  char err[QT_ERR_LEN];
  qt_backend_desc d;
  accel_desc(&d);
  if (strcmp(d.name, "fict_npu") != 0 || !d.ops[QT_OP_CONV2D] || !d.ops[QT_OP_ADD] || d.ops[QT_OP_GLOBAL_AVG_POOL] ||
      d.ops[QT_OP_BATCH_NORM] || d.weight_bits != 1u << 8 || d.activation_bits != 1u << 8 ||
      !d.weight_per_tensor_only || !d.weight_symmetric || !d.activation_symmetric ||
      d.activation_sign != QT_SIGN_SIGNED || !d.pow2_scales || d.max_channels != 64 || d.pair_sum_int16)
    qt_test_fail("experiments/accel_fictional.ini loaded into unexpected fields");
  const char *good =
      "[accelerator]\nname = npu\nops = conv2d, relu\nweight_bits = 4, 8\nactivation_bits = 8\nper_tensor_only = "
      "false\nsymmetric = true\npower_of_two_scales = false\nmax_channels = 0\n";
  if (qt_backend_desc_parse(&d, good, "npu.ini", err) || d.weight_bits != ((1u << 4) | (1u << 8)) ||
      d.weight_per_tensor_only || d.pow2_scales || d.ops[QT_OP_LINEAR])
    qt_test_fail("a valid description: %s", err);
  desc_error("missing key",
             "[accelerator]\nname = npu\nops = conv2d\nweight_bits = 8\nactivation_bits = 8\nper_tensor_only = "
             "true\nsymmetric = true\npower_of_two_scales = true\n",
             "npu.ini: [accelerator] max_channels: missing");
  desc_error("unknown op",
             "[accelerator]\nname = npu\nops = conv2d, conv3d\nweight_bits = 8\nactivation_bits = 8\nper_tensor_only "
             "= true\nsymmetric = true\npower_of_two_scales = true\nmax_channels = 4\n",
             "npu.ini:3: [accelerator] ops: 'conv3d' is not a compute op");
  desc_error("quantize as an op",
             "[accelerator]\nname = npu\nops = quantize\nweight_bits = 8\nactivation_bits = 8\nper_tensor_only "
             "= true\nsymmetric = true\npower_of_two_scales = true\nmax_channels = 4\n",
             "'quantize' is not a compute op");
  desc_error("bad bits",
             "[accelerator]\nname = npu\nops = conv2d\nweight_bits = 8, 12\nactivation_bits = 8\nper_tensor_only "
             "= true\nsymmetric = true\npower_of_two_scales = true\nmax_channels = 4\n",
             "npu.ini:4: [accelerator] weight_bits: expected bit widths in 2..8 separated by commas, found '12'");
  desc_error("unknown key", "[accelerator]\nname = npu\nmax_chanels = 4\n", "unknown key 'max_chanels'");
  desc_error("bad bool", "[accelerator]\nsymmetric = maybe\n", "symmetric");
  desc_error("name with a space",
             "[accelerator]\nname = my npu\nops = conv2d\nweight_bits = 8\nactivation_bits = 8\nper_tensor_only "
             "= true\nsymmetric = true\npower_of_two_scales = true\nmax_channels = 4\n",
             "[accelerator] name: expected");
  err[0] = 0;
  if (qt_backend_desc_load(&d, "no_such_accel.ini", err) == 0 || !strstr(err, "no_such_accel.ini"))
    qt_test_fail("a missing description file: '%s'", err);
}

int main(void) {
  onednn_model_on_accel();
  res_cnn_on_onednn();
  accel_model_on_onednn();
  weight_only();
  record_problem();
  prepared_refused();
  desc_loader();
  return qt_test_finish();
}
