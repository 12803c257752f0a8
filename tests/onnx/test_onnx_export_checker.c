/* The ONNX QDQ export (onnx/onnx_export.h) of real Q/DQ graphs, each checked by onnx.checker with
 * full checking (the current onnx of the test environment, $QT_PYTHON, which CTest sets to the
 * .venv that scripts/setup.sh makes: a missing interpreter or module fails the test, it does not
 * skip it):
 * - FashionCNN (flatten of 7x7x64 -> linear: permuted weight columns), ResCNN (residual add), the
 *   MobileNet-style ONNX model (depthwise convs, relu6, global average pool) and the activations'
 *   model (tests/onnx/make_act_models.py: hard swish, hard sigmoid, leaky ReLU, ELU, tanh and
 *   sigmoid, each an fp32 op between quantized convolutions) at W8A8 PTQ
 *   (full-range int8 weights, quant.isa = vnni) and W4A4 QAT (4-bit activations: an integer Clip
 *   after every QuantizeLinear, relu6 written as Relu where the 4-bit range bounds it), and
 *   FashionCNN at W4A8 QAT, built through the pipeline stages, calibrated on 4 batches of 64
 *   Fashion-MNIST training images, converted, saved and loaded back (as a deployment tool
 *   would), then exported;
 * - the counts the export reports match the graph (quantize / dequantize nodes, integer weights,
 *   clips only below 8 bits, relu6 as Relu only below 8 bits, one permuted linear for FashionCNN);
 * - FashionCNN W8A8 PTQ and the MobileNet-style model W4A4 QAT (conv_bn: folded biases) with
 *   int32 biases (quant.bias = int32): every bias written as the graph's int32 integers;
 * - a prepared graph is refused naming its first fake_quant node, and a path that cannot be
 *   written is an I/O error that leaves no file.
 * Also keeps export_prepared.h5 (a prepared graph, for test_qat_export_cli.sh).
 * Keeps export_<case>.onnx, export_<case>_qdq.h5 and export_<case>_io.h5 (/input: the first 200
 * test images, NHWC, the last 50 scaled by 3; /output: the C executor's output on them; /labels) for
 * check_onnx_export.py (test_onnx_export_exact) and for the ONNX Runtime test. */
#include <hdf5.h>
#include <hdf5_hl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "onnx/onnx_export.h"
#include "tests/common/testutil.h"
#include "train/pipeline.h"

#define IO_IMAGES 200

static int count_op(const qt_graph *g, qt_op op) {
  int n = 0;
  for (int i = 0; i < g->n_nodes; i++) n += g->nodes[i].op == op;
  return n;
}

static int count_int_weights(const qt_graph *g) {
  int n = 0;
  for (int i = 0; i < g->n_nodes; i++) n += g->nodes[i].wq && g->nodes[i].wq->qweight;
  return n;
}

static int count_int_biases(const qt_graph *g) {
  int n = 0;
  for (int i = 0; i < g->n_nodes; i++) n += g->nodes[i].wq && g->nodes[i].wq->qbias;
  return n;
}

/* /input, /output (the C executor on the loaded Q/DQ graph) and /labels for the python test. The
 * last quarter of the images is scaled by 3, beyond the calibrated ranges, so that quantize nodes
 * saturate: at 4 bits that is where the Clip before QuantizeLinear matters. */
static void write_io(const char *path, qt_graph *g, const float *images, const qt_dataset *test, int n) {
  const qt_value *in = &g->values[g->input];
  const int64_t per = in->shape[0] * in->shape[1] * in->shape[2];
  float *x = malloc((size_t)(n * per) * sizeof *x);
  QT_ASSERT(x, "out of memory");
  for (int64_t k = 0; k < n * per; k++) x[k] = images[k] * (k >= (int64_t)(3 * n / 4) * per ? 3.0f : 1.0f);
  qt_ctx *ctx = qt_ctx_create();
  qt_ctx_set_grad(ctx, 0);
  qt_graph_set_mode(g, QT_MODE_EVAL);
  const int64_t xs[4] = {n, in->shape[0], in->shape[1], in->shape[2]};
  qt_tensor *xt = qt_tensor_wrap(ctx, QT_F32, 4, xs, (float *)x);
  qt_tensor *yt = qt_graph_forward(g, ctx, xt);
  QT_ASSERT(yt, "%s: forward: %s", path, g->error);
  const int64_t numel = qt_tensor_numel(yt);
  int32_t *labels = malloc((size_t)n * sizeof *labels);
  QT_ASSERT(labels, "out of memory");
  for (int i = 0; i < n; i++) labels[i] = test->labels[i];
  hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  hsize_t xd[4] = {(hsize_t)n, (hsize_t)in->shape[0], (hsize_t)in->shape[1], (hsize_t)in->shape[2]};
  hsize_t yd[2] = {(hsize_t)n, (hsize_t)(numel / n)}, ld[1] = {(hsize_t)n};
  QT_CHECK(f >= 0 && H5LTmake_dataset_float(f, "input", 4, xd, x) >= 0 &&
           H5LTmake_dataset_float(f, "output", 2, yd, qt_f32(yt)) >= 0 &&
           H5LTmake_dataset_int(f, "labels", 1, ld, labels) >= 0);
  if (f >= 0) H5Fclose(f);
  free(labels);
  free(x);
  qt_ctx_free(ctx);
}

/* onnx.checker with full checking (shape inference in strict mode) on the loaded model: given a
 * path, onnx 1.12's check_model(full_check=True) writes the inferred shapes back into the file. */
static const char *python(void) {
  const char *py = getenv("QT_PYTHON");
  return py && *py ? py : "QT_PYTHON-unset";
}

static int checker(const char *path) {
  char cmd[8192];
  snprintf(cmd, sizeof cmd,
           "'%s' -c 'import sys, onnx; onnx.checker.check_model(onnx.load(sys.argv[1]), full_check=True)' '%s'",
           python(), path);
  return system(cmd);
}

/* One model at one setting: build, prepare, calibrate, convert, save, load, export, check. */
static void one(const char *stem, const char *model_key, const char *mode, int wbits, int abits, int bias_int32) {
  char err[QT_ERR_LEN], ov[9][256];
  snprintf(ov[0], sizeof ov[0], "%s", model_key);
  snprintf(ov[1], sizeof ov[1], "quant.mode=%s", mode);
  snprintf(ov[2], sizeof ov[2], "quant.weight_bits=%d", wbits);
  snprintf(ov[3], sizeof ov[3], "quant.activation_bits=%d", abits);
  /* vnni: full-range int8 weights; the int32-bias graphs are quantized for this CPU (7-bit weights
   * without VNNI), as test_ort_agreement runs them in ONNX Runtime's fused integer kernels, which sum
   * u8 x s8 pairs in a saturating int16 there too */
  snprintf(ov[4], sizeof ov[4], "quant.isa=%s", wbits == 8 && !bias_int32 ? "vnni" : "auto");
  snprintf(ov[5], sizeof ov[5], "data.train_limit=256");
  snprintf(ov[6], sizeof ov[6], "quant.calibration_batches=4");
  snprintf(ov[7], sizeof ov[7], "train.batch_size=64");
  snprintf(ov[8], sizeof ov[8], "quant.bias=%s", bias_int32 ? "int32" : "float");
  char *ovp[9];
  for (int i = 0; i < 9; i++) ovp[i] = ov[i];
  qt_options *o = malloc(sizeof *o);
  QT_ASSERT(o, "out of memory");
  qt_status st = {0};
  qt_dataset train = {0}, test = {0};
  qt_graph *g = NULL, *p = NULL, *c = NULL, *h = NULL;
  qt_ctx *ctx = qt_ctx_create();
  qt_loader *l = NULL;
  char qdq[256], onnx[256], io[256];
  snprintf(qdq, sizeof qdq, "export_%s_qdq.h5", stem);
  snprintf(onnx, sizeof onnx, "export_%s.onnx", stem);
  snprintf(io, sizeof io, "export_%s_io.h5", stem);
  remove(onnx);
  if (qt_options_load(NULL, ovp, 9, o, err)) {
    qt_test_fail("%s: options: %s", stem, err);
    goto done;
  }
  if (qt_stage_load_data(&o->data, QT_SPLIT_BOTH, &train, &test, &st) || !(g = qt_stage_build_model(o, &test, &st)) ||
      !(p = qt_stage_prepare(o, g, NULL, NULL, &st)) || qt_stage_calibrate(o, p, &train, ctx, NULL, 0, &st)) {
    qt_test_fail("%s: %s", stem, st.msg);
    goto done;
  }
  qt_graph_set_mode(p, QT_MODE_EVAL);
  if (!(c = qt_convert(p, err)) || qt_qdq_save(qdq, c, err) || !(h = qt_qdq_load(qdq, err))) {
    qt_test_fail("%s: convert / save / load: %s", stem, err);
    goto done;
  }
  qt_onnx_export_info info;
  if (qt_onnx_export_qdq(h, onnx, &info, err)) {
    qt_test_fail("%s: export: %s", stem, err);
    goto done;
  }
  if (getenv("QT_TEST_VERBOSE"))
    fprintf(stderr, "%s: %d nodes, %d initializers, %d Q, %d DQ, %d int weights, %d clips, %d permuted, %lld bytes\n",
            stem, info.nodes, info.initializers, info.quantize, info.dequantize, info.int_weights, info.clips,
            info.permuted, (long long)info.bytes);
  const int nq = count_op(h, QT_OP_QUANTIZE), ndq = count_op(h, QT_OP_DEQUANTIZE), nw = count_int_weights(h);
  if (info.quantize != nq || info.dequantize != ndq || info.int_weights != nw || nq < 3 || nw < 3)
    qt_test_fail(
        "%s: export wrote %d QuantizeLinear, %d DequantizeLinear, %d integer weights; the graph has %d "
        "quantize, %d dequantize, %d integer weights",
        stem, info.quantize, info.dequantize, info.int_weights, nq, ndq, nw);
  const int nb = count_int_biases(h);
  if (bias_int32 ? nb < 3 || info.int32_biases != nb || info.float_biases != 0 : nb != 0 || info.int32_biases != 0)
    qt_test_fail("%s: export wrote %d int32 and %d fp32 biases; the graph has %d int32 biases", stem, info.int32_biases,
                 info.float_biases, nb);
  if (info.ir_version != 8 || info.opset != 13)
    qt_test_fail("%s: IR %lld opset %lld", stem, (long long)info.ir_version, (long long)info.opset);
  if (abits < 8 ? info.clips != nq : info.clips != 0)
    qt_test_fail("%s: %d range Clips for %d %d-bit quantize nodes", stem, info.clips, nq, abits);
  const int nr6 = count_op(h, QT_OP_RELU6);
  if (abits < 8 ? nr6 && !info.relu6_as_relu : info.relu6_as_relu != 0)
    qt_test_fail("%s: %d of %d relu6 written as Relu at %d-bit activations", stem, info.relu6_as_relu, nr6, abits);
  const int want_perm = strstr(model_key, "fashion_cnn") ? 1 : 0;
  if (info.permuted != want_perm)
    qt_test_fail("%s: %d permuted linear weights, want %d", stem, info.permuted, want_perm);
  struct stat sb;
  if (stat(onnx, &sb) || sb.st_size != info.bytes)
    qt_test_fail("%s: %s is not the %lld bytes reported", stem, onnx, (long long)info.bytes);
  if (checker(onnx)) qt_test_fail("%s: onnx.checker (full_check) rejects %s", stem, onnx);

  const float *x;
  int n = 0;
  if (!(l = qt_stage_first_images(o, &test, IO_IMAGES, &x, &n, &st)) || n != IO_IMAGES) {
    qt_test_fail("%s: test images: %s", stem, st.msg);
    goto done;
  }
  write_io(io, h, x, &test, n);

  /* A prepared graph is refused, naming a fake_quant node. */
  if (!strcmp(stem, "fashion_cnn_w8a8")) {
    qt_onnx_export_info bad;
    if (qt_onnx_export_qdq(p, "export_prepared.onnx", &bad, err) == 0 || !strstr(err, "prepared (training) graph") ||
        !strstr(err, "(fake_quant)") || bad.io_error)
      qt_test_fail("prepared graph: want a refusal naming a fake_quant node, got '%s'", err);
    if (access("export_prepared.onnx", F_OK) == 0) qt_test_fail("a refused export left export_prepared.onnx");
    if (qt_qdq_save("export_prepared.h5", p, err))
      qt_test_fail("save the prepared graph: %s", err); /* for the CLI test */
    if (qt_onnx_export_qdq(h, "no_such_dir/x.onnx", &bad, err) == 0 || !bad.io_error ||
        !strstr(err, "no_such_dir/x.onnx"))
      qt_test_fail("unwritable path: want an I/O error naming it, got '%s' (io_error %d)", err, bad.io_error);
  }
done:
  qt_loader_free(l);
  qt_graph_free(h);
  qt_graph_free(c);
  qt_graph_free(p);
  qt_graph_free(g);
  qt_ctx_free(ctx);
  qt_dataset_free(&train);
  qt_dataset_free(&test);
  free(o);
}

/* tests/onnx/models/<model>.onnx exported at W8A8 PTQ and W4A4 QAT (<model>_w8a8, <model>_w4a4). */
static void onnx_model_both(const char *model) {
  char path[300], override[4200], stem[300];
  snprintf(path, sizeof path, "tests/onnx/models/%s.onnx", model);
  snprintf(override, sizeof override, "model.onnx=%s", qt_test_path(path));
  snprintf(stem, sizeof stem, "%s_w8a8", model);
  one(stem, override, "ptq", 8, 8, 0);
  snprintf(stem, sizeof stem, "%s_w4a4", model);
  one(stem, override, "qat", 4, 4, 0);
}

int main(void) {
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "'%s' -c 'import onnx.checker' 2>/dev/null", python());
  if (system(cmd)) {
    qt_test_fail("%s (QT_PYTHON) cannot import onnx: run scripts/setup.sh (the test environment .venv)", python());
    return qt_test_finish();
  }
  char mobilenet[4200];
  snprintf(mobilenet, sizeof mobilenet, "model.onnx=%s", qt_test_path("tests/onnx/models/mobilenet.onnx"));
  one("fashion_cnn_w8a8", "model.name=fashion_cnn", "ptq", 8, 8, 0);
  one("fashion_cnn_w4a8", "model.name=fashion_cnn", "qat", 4, 8, 0);
  one("fashion_cnn_w4a4", "model.name=fashion_cnn", "qat", 4, 4, 0);
  one("res_cnn_w8a8", "model.name=res_cnn", "ptq", 8, 8, 0);
  one("res_cnn_w4a4", "model.name=res_cnn", "qat", 4, 4, 0);
  one("mobilenet_w8a8", mobilenet, "ptq", 8, 8, 0);
  one("mobilenet_w4a4", mobilenet, "qat", 4, 4, 0);
  /* the element-wise activations, fp32 between quantized convolutions (Sigmoid, Tanh, HardSigmoid,
   * LeakyRelu, Elu as themselves, hard swish as x * HardSigmoid(x)) */
  onnx_model_both("act_cnn");
  /* squeeze-excite: the image times its channel gates (fp32 Mul of a Reshape'd [N, C, 1, 1]) */
  onnx_model_both("se_cnn");
  /* Concat of images along channels and of pooled vectors (fp32 Concat) */
  onnx_model_both("cat_cnn");
  /* channel shuffle and slices of channels (fp32 Reshape, Transpose, Reshape; Slice) */
  onnx_model_both("shuffle_cnn");
  /* a vision transformer: fp32 LayerNormalization (ReduceMean, Sub, ...), attention (Reshape, Transpose,
   * MatMul, Mul, Softmax), position embedding (Add) between quantized per-token 1x1 convolutions */
  onnx_model_both("vit");
  /* torchvision's ViT blocks (nn.MultiheadAttention): the packed in_proj as one 1x1 convolution and
   * three channel Slices */
  onnx_model_both("mha_vit");
  /* torchvision's VisionTransformer: its class token (Shape, Gather, Concat, Expand, Concat) and x[:, 0] (Gather) */
  onnx_model_both("mha_vit_cls");
  /* timm's ViT: its packed q, k, v as one 1x1 convolution and three channel Slices */
  onnx_model_both("mha_timm");
  /* arithmetic with constant scalars (affine as Mul / Add, div as Div), u8 tables on the device */
  onnx_model_both("arith_cnn");
  /* PReLU (fp32 between quantize and dequantize on the device) as PRelu */
  onnx_model_both("prelu_cnn");
  /* upsampling by 2, nearest (a u8 copy on the device) and bilinear (fp32 between Q and DQ) */
  onnx_model_both("resize_cnn");
  /* int32 biases (quant.bias = int32): written as the graph's integers */
  one("fashion_cnn_w8a8_b32", "model.name=fashion_cnn", "ptq", 8, 8, 1);
  one("mobilenet_w4a4_b32", mobilenet, "qat", 4, 4, 1);
  return qt_test_finish();
}
